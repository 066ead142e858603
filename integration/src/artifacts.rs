//! What the tests run: the workspace's built binaries and the locally built images.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The workspace root.
pub fn workspace() -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::canonicalize(&path).unwrap_or(path)
}

/// The directory holding the built binaries (`make test` builds them first).
pub fn bin_dir() -> PathBuf {
    let dir = std::env::var_os("KATA_TOPO_BIN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("target/debug"));
    for bin in [
        "containerd-shim-kata-topo-v2",
        "kata-topo",
        "kata-topo-hook",
    ] {
        assert!(
            dir.join(bin).is_file(),
            "{} is missing: run `cargo build --workspace` (make test does) before these tests",
            dir.join(bin).display()
        );
    }
    dir
}

/// The pause and busybox image archives, built once per test process.
pub fn images() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = workspace().join("target/kata-topo-images");
        if !dir.join("busybox.tar").is_file() || !dir.join("pause.tar").is_file() {
            let out = Command::new("bash")
                .arg(workspace().join("integration/images/build.sh"))
                .arg(&dir)
                .output()
                .expect("run build.sh");
            assert!(
                out.status.success(),
                "building images: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        dir
    })
}

/// The busybox image.
pub const BUSYBOX: &str = "localhost/kata-topo/busybox:1";
/// The pause image.
pub const PAUSE: &str = "localhost/kata-topo/pause:1";
