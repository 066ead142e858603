//! The other runtime: a private CRI-O (its own storage root and runroot, CRI and NRI sockets
//! and configuration under a temporary directory) with NRI on, one handler `runc` (runc
//! 1.5.1 under Debian's conmon, the cgroupfs manager), the test images copied into its
//! storage, and the same simulated host and `[topology_guard]` as [`Containerd`]'s, for
//! `kata-topo-nri` to check its pods.
//!
//! Which binaries: `KT_CRIO_BIN=DIR` holding `crio`, `copyimg` and `pinns` (what `make crio`
//! builds, `crio/build.sh`), else that script's set, built when missing; runc from
//! `KT_CRIO_RUNC`, else the 2.3.4 archive's under `target/` (`make containerd2`); conmon from
//! `KT_CRIO_CONMON`, else Debian's (`apt-get install conmon`). Without one of them the fixture
//! fails, naming it.
//!
//! [`Containerd`]: crate::Containerd

use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use kata_topo_core::testutil::SysfsTree;

use crate::containerd::simulated_host;
use crate::lock::MachineLock;
use crate::{images, require_root, templates, workspace, Cri, Guard, BUSYBOX, PAUSE};

/// The directory of `crio`, `copyimg` and `pinns`.
pub fn crio_bin() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = match std::env::var_os("KT_CRIO_BIN") {
            Some(d) => PathBuf::from(d),
            None => {
                let out = Command::new("bash")
                    .arg(workspace().join("crio/build.sh"))
                    .stderr(Stdio::inherit())
                    .output()
                    .expect("bash");
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success(),
                    "no CRI-O (make crio, crio/build.sh): {stdout}"
                );
                PathBuf::from(stdout.lines().last().unwrap_or_default())
            }
        };
        for bin in ["crio", "copyimg", "pinns"] {
            assert!(
                dir.join(bin).is_file(),
                "{} is missing (KT_CRIO_BIN, make crio)",
                dir.join(bin).display()
            );
        }
        dir
    })
}

/// A binary CRI-O runs: `var`, else `default`, which must be a file.
fn needed(var: &str, default: PathBuf, how: &str) -> PathBuf {
    let path = std::env::var_os(var).map_or(default, PathBuf::from);
    assert!(
        path.is_file(),
        "CRI-O needs {}: set {var} or {how}",
        path.display()
    );
    path
}

/// The version line `crio --version` prints (`crio version 1.34.0`).
pub fn crio_version() -> String {
    let out = Command::new(crio_bin().join("crio"))
        .arg("--version")
        .output()
        .expect("crio --version");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// A private CRI-O and the kata-topo configuration for its pods.
#[derive(Debug)]
pub struct Crio {
    /// Its directory (storage, sockets, configuration, logs).
    pub dir: tempfile::TempDir,
    /// Its CRI socket.
    pub socket: PathBuf,
    /// Its NRI socket (`nri_listen`).
    pub nri_socket: PathBuf,
    /// kata-topo's configuration file (the `[topology_guard]` of [`Guard`]).
    pub config: PathBuf,
    /// kata-topo's JSON log.
    pub log_file: PathBuf,
    /// kata-topo's state directory.
    pub state_dir: PathBuf,
    /// kata-topo's metrics directory (when asked for).
    pub metrics_dir: PathBuf,
    /// The simulated sysfs.
    pub sysfs: SysfsTree,
    /// A character device standing in for `/dev/vfio/42` on the host side.
    pub vfio_node: PathBuf,
    /// The runc of its handler.
    runc: PathBuf,
    child: Option<Child>,
    /// One private runtime on the machine at a time, as [`crate::Containerd`] takes it.
    _exclusive: MachineLock,
}

impl Crio {
    /// Starts CRI-O with NRI on, the images in its storage, and writes kata-topo's
    /// configuration as `guard` says. `Guard::nri_timeout` is CRI-O's
    /// `nri_plugin_request_timeout`, `Guard::debug` its debug logging; the folder it is made
    /// in is `Guard::under`, else `target/crio-test`.
    pub fn start(guard: Guard) -> Self {
        require_root();
        let bins = crio_bin();
        let runc = needed(
            "KT_CRIO_RUNC",
            workspace().join("target/containerd-2.3.4/bin/runc"),
            "run `make containerd2` (runc 1.5.1)",
        );
        let conmon = needed(
            "KT_CRIO_CONMON",
            PathBuf::from("/usr/bin/conmon"),
            "`apt-get install conmon`",
        );
        let exclusive = MachineLock::take();
        let under = guard
            .under
            .clone()
            .unwrap_or_else(|| workspace().join("target/crio-test"));
        std::fs::create_dir_all(&under).expect("the folder of CRI-O's directory");
        let dir = tempfile::Builder::new()
            .prefix("kt-crio-")
            .tempdir_in(&under)
            .expect("tempdir");
        let d = dir.path();
        let (sysfs, vfio_node) = simulated_host(d);
        for sub in [
            "hooks",
            "cdi",
            "cni/conf",
            "cni/bin",
            "nri/plugins",
            "nri/conf.d",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("CRI-O's folders");
        }
        let config = d.join("kata-topo.toml");
        let log_file = guard
            .log_file
            .clone()
            .unwrap_or_else(|| d.join("kata-topo.log"));
        let state_dir = guard
            .state_dir
            .clone()
            .unwrap_or_else(|| d.join("kt-state"));
        let metrics_dir = d.join("metrics");
        let metrics = if guard.metrics {
            metrics_dir.display().to_string()
        } else {
            String::new()
        };
        std::fs::write(
            &config,
            guard.table(sysfs.root(), &state_dir, &log_file, &metrics),
        )
        .expect("write kata-topo's configuration");
        let text = |p: &Path| p.display().to_string();
        let (dir_text, runc_text, conmon, pinns) = (
            text(d),
            text(&runc),
            text(&conmon),
            text(&bins.join("pinns")),
        );
        let values = [
            ("DIR", dir_text.as_str()),
            ("RUNC", runc_text.as_str()),
            ("CONMON", conmon.as_str()),
            ("PINNS", pinns.as_str()),
            ("PAUSE_IMAGE", PAUSE),
            ("NRI_TIMEOUT", guard.nri_timeout.unwrap_or_default()),
            ("DEBUG", if guard.debug { "1" } else { "" }),
        ];
        let conf = templates::render(templates::CRIO, &values).expect("the CRI-O template renders");
        std::fs::write(d.join("crio.conf"), conf).expect("write crio.conf");
        // containers/storage reads its own file too: this one, not the machine's.
        std::fs::write(
            d.join("storage.conf"),
            format!(
                "[storage]\ndriver = \"overlay\"\ngraphroot = \"{dir_text}/root\"\nrunroot = \"{dir_text}/runroot\"\n"
            ),
        )
        .expect("write storage.conf");
        // No registry is pulled from: every image is already in the storage.
        std::fs::write(
            d.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )
        .expect("write policy.json");
        // The images, as CRI-O's own tests put them in its storage: an OCI archive copied in.
        for (archive, name) in [("pause.tar", PAUSE), ("busybox.tar", BUSYBOX)] {
            let out = Command::new(bins.join("copyimg"))
                .arg("--root")
                .arg(d.join("root"))
                .arg("--runroot")
                .arg(d.join("runroot"))
                .args(["--storage-driver", "overlay", "--signature-policy"])
                .arg(d.join("policy.json"))
                .args(["--image-name", name, "--import-from"])
                .arg(format!("oci-archive:{}", images().join(archive).display()))
                .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
                .output()
                .expect("run copyimg");
            assert!(
                out.status.success(),
                "copyimg {archive}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let mut c = Self {
            socket: d.join("crio.sock"),
            nri_socket: d.join("nri.sock"),
            config,
            log_file,
            state_dir,
            metrics_dir,
            sysfs,
            vfio_node,
            runc,
            child: None,
            _exclusive: exclusive,
            dir,
        };
        c.spawn();
        c
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("crio.log"))
            .expect("log");
        let child = Command::new(crio_bin().join("crio"))
            .arg("--config")
            .arg(d.join("crio.conf"))
            .arg("--config-dir")
            .arg(d.join("crio.conf.d"))
            .env("CONTAINERS_STORAGE_CONF", d.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", d.join("registries.conf"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start crio");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if UnixStream::connect(&self.socket).is_ok() && self.cri().wait_ready(DEADLINE) {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(Child::try_wait) {
                panic!("crio exited ({status}): {}", self.crio_log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("CRI-O did not come up: {}", self.crio_log());
    }

    /// Stops CRI-O (SIGTERM; its containers and their conmon go on) and starts it again on
    /// the same storage and state.
    pub fn restart(&mut self) {
        self.stop_crio();
        self.spawn();
    }

    fn stop_crio(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(15);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The cgroup to give its pods as their `cgroup_parent` (the kubelet gives each pod one):
    /// every cgroup CRI-O makes for them, their conmon's too, is under it, and goes with the
    /// fixture.
    pub fn cgroup_parent(&self) -> String {
        let name = self.dir.path().file_name().unwrap_or_default();
        format!("/{}", name.to_string_lossy())
    }

    /// A CRI client over CRI-O's socket.
    pub fn cri(&self) -> Cri {
        Cri::connect(
            &self.socket,
            &self.dir.path().join("pod-logs"),
            &self.vfio_node,
        )
    }

    /// CRI-O's own log.
    pub fn crio_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("crio.log")).unwrap_or_default()
    }

    /// kata-topo's JSON log lines.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// kata-topo's finding lines.
    pub fn findings(&self) -> Vec<serde_json::Value> {
        self.log_lines()
            .into_iter()
            .filter(|l| l["event"] == "finding")
            .collect()
    }

    /// Live processes started for this CRI-O (its conmon processes name its directory).
    pub fn leftover_processes(&self) -> Vec<String> {
        let needle = self.dir.path().to_string_lossy().into_owned();
        let own = self.child.as_ref().map(Child::id);
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if Some(pid) == own || !crate::alive(pid) {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(&needle) && !text.contains("kata-topo-nri") {
                found.push(format!("{pid}: {text}"));
            }
        }
        found
    }

    /// Every pod CRI-O knows of, stopped and removed (their containers with them).
    fn remove_all_pods(&self) {
        if UnixStream::connect(&self.socket).is_err() {
            return;
        }
        let c = self.cri();
        let mut client = c.client.clone();
        c.block(async move {
            let Ok(pods) = client
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                .await
            else {
                return;
            };
            for pod in pods.into_inner().items {
                let id = pod.id;
                let _ = client
                    .stop_pod_sandbox(cri::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await;
                let _ = client
                    .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id })
                    .await;
            }
        });
    }
}

/// Generous: the machine may be busy with other builds.
const DEADLINE: Duration = Duration::from_secs(30);

impl Drop for Crio {
    fn drop(&mut self) {
        // CRI-O leaves its containers running when it stops: remove them through it first.
        if self.child.is_some() {
            self.remove_all_pods();
        }
        self.stop_crio();
        let d = self.dir.path();
        let runc_root = d.join("runroot/runc");
        if let Ok(out) = Command::new(&self.runc)
            .arg("--root")
            .arg(&runc_root)
            .args(["list", "-q"])
            .output()
        {
            for id in String::from_utf8_lossy(&out.stdout).lines() {
                let _ = Command::new(&self.runc)
                    .arg("--root")
                    .arg(&runc_root)
                    .args(["delete", "-f", id])
                    .status();
            }
        }
        for line in self.leftover_processes() {
            if let Some(pid) = line.split(':').next() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        // The pods' cgroups (a conmon's is left behind by a CRI-O restarted under it).
        let parent = self.cgroup_parent();
        for controller in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            let top = controller.path().join(parent.trim_start_matches('/'));
            if top.is_dir() {
                let _ = Command::new("find")
                    .arg(&top)
                    .args(["-depth", "-type", "d", "-exec", "rmdir", "{}", ";"])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        let _ = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "grep -o ' {}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l",
                d.display()
            ))
            .stderr(Stdio::null())
            .status();
    }
}
