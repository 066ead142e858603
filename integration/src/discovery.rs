//! Which containerd the tests run against, and its version.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// Fails loudly unless running as root with containerd installed.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the integration tests start containerd and need root (CI runs them as root)"
    );
    let bins = ContainerdBin::get();
    for tool in ["containerd", "ctr", "containerd-shim-runc-v2", "runc"] {
        assert!(
            bins.find(tool).is_some(),
            "{tool} is not installed (apt-get install containerd runc; make test does), \
             nor in KT_CONTAINERD_BIN={}",
            bins.dir
                .as_ref()
                .map_or(String::new(), |d| d.display().to_string())
        );
    }
}

/// The containerd the tests run against: `KT_CONTAINERD_BIN=DIR`, else the one on PATH.
#[derive(Debug, Clone)]
pub struct ContainerdBin {
    /// `KT_CONTAINERD_BIN`, when set.
    pub dir: Option<PathBuf>,
    /// `containerd --version`'s version, e.g. (2, 3, 4).
    pub version: (u32, u32, u32),
    /// The version as containerd prints it.
    pub version_text: String,
}

impl ContainerdBin {
    /// Read once per test process.
    pub fn get() -> &'static Self {
        static BIN: OnceLock<ContainerdBin> = OnceLock::new();
        BIN.get_or_init(|| {
            let dir = std::env::var_os("KT_CONTAINERD_BIN")
                .filter(|d| !d.is_empty())
                .map(PathBuf::from);
            if let Some(d) = &dir {
                assert!(
                    d.join("containerd").is_file() && d.join("ctr").is_file(),
                    "KT_CONTAINERD_BIN={} has no containerd and ctr",
                    d.display()
                );
            }
            let containerd = dir
                .as_ref()
                .map_or(PathBuf::from("containerd"), |d| d.join("containerd"));
            let out = Command::new(&containerd)
                .arg("--version")
                .output()
                .unwrap_or_else(|e| panic!("{} --version: {e}", containerd.display()));
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let version = parse_containerd_version(&text)
                .unwrap_or_else(|| panic!("cannot read containerd's version from {text:?}"));
            Self {
                dir,
                version,
                version_text: format!("{}.{}.{}", version.0, version.1, version.2),
            }
        })
    }

    /// A tool from `KT_CONTAINERD_BIN`, else from PATH.
    pub fn find(&self, tool: &str) -> Option<PathBuf> {
        if let Some(p) = self
            .dir
            .as_ref()
            .map(|d| d.join(tool))
            .filter(|p| p.is_file())
        {
            return Some(p);
        }
        std::env::var_os("PATH")
            .into_iter()
            .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
            .map(|d| d.join(tool))
            .find(|p| p.is_file())
    }

    /// The `containerd` binary.
    pub fn containerd(&self) -> PathBuf {
        self.find("containerd")
            .unwrap_or_else(|| "containerd".into())
    }

    /// The `ctr` binary.
    pub fn ctr(&self) -> PathBuf {
        self.find("ctr").unwrap_or_else(|| "ctr".into())
    }

    /// containerd 2.x (task API v3, configuration version 3).
    pub fn is_v2(&self) -> bool {
        self.version.0 >= 2
    }

    /// containerd >= 2.3: `start` gets a `BootstrapParams`, shims may be given a socket
    /// directory.
    pub fn has_bootstrap(&self) -> bool {
        self.version >= (2, 3, 0)
    }
}

/// `containerd github.com/containerd/containerd/v2 2.3.4+unknown …` or `… 1.6.20~ds1 …`.
fn parse_containerd_version(text: &str) -> Option<(u32, u32, u32)> {
    text.split_whitespace().find_map(|word| {
        let word = word.trim_start_matches('v');
        let mut parts = word.split(|c: char| !c.is_ascii_digit());
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let patch = parts.next()?.parse().ok()?;
        word.contains('.').then_some((major, minor, patch))
    })
}
