//! The fixture: a private containerd with the wrapper configured, and what it started.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use kata_topo_core::testutil::SysfsTree;

use crate::layout::{write_hooked_base_spec, ConfigLayout};
use crate::lock::MachineLock;
use crate::templates;
use crate::{bin_dir, images, require_root, workspace, ContainerdBin};

/// Options for the wrapper's `[topology_guard]`.
#[derive(Debug, Clone)]
pub struct Guard {
    /// `mode`.
    pub mode: &'static str,
    /// `default_policy`.
    pub policy: &'static str,
    /// `topology_xml`; default: the scenario's two-node host.
    pub topology_xml: Option<PathBuf>,
    /// `fail_closed`.
    pub fail_closed: bool,
    /// Extra raw TOML lines inside the table.
    pub extra: String,
    /// Set `metrics_dir` (to `<dir>/metrics`).
    pub metrics: bool,
    /// Install `kata-topo-hook` as a createRuntime hook in the `runc` handler's base runtime
    /// spec (and let `kata-topo.io/*` pod annotations reach runc containers).
    pub runc_hook: bool,
    /// `delegate_shim`; default `containerd-shim-runc-v2`.
    pub delegate: Option<PathBuf>,
    /// `log_file`; default `<dir>/kata-topo.log`.
    pub log_file: Option<PathBuf>,
    /// `state_dir`; default `<dir>/kt-state`.
    pub state_dir: Option<PathBuf>,
    /// containerd >= 2.3: give shims the socket directory `<dir>/s` (containerd's
    /// `socket_dir`) instead of `/run/containerd/s`. Older versions have no such setting.
    pub socket_dir: bool,
    /// containerd 2.x: NRI's `plugin_request_timeout` (e.g. `"2s"`); default containerd's.
    pub nri_timeout: Option<&'static str>,
    /// containerd's debug logging, so that shims get `-debug` (the wrapper's debug lines).
    pub debug: bool,
    /// The folder the containerd's own directory is made in; default `/tmp`.
    pub under: Option<PathBuf>,
}

impl Default for Guard {
    fn default() -> Self {
        Self {
            mode: "audit",
            policy: "restricted",
            topology_xml: None,
            fail_closed: false,
            extra: String::new(),
            runc_hook: false,
            metrics: false,
            delegate: None,
            log_file: None,
            state_dir: None,
            socket_dir: false,
            nri_timeout: None,
            debug: false,
            under: None,
        }
    }
}

/// A private containerd and everything it started.
#[derive(Debug)]
pub struct Containerd {
    /// Its directory (root, state, sockets, config, logs).
    pub dir: tempfile::TempDir,
    /// Its gRPC socket.
    pub socket: PathBuf,
    child: Option<Child>,
    /// The wrapper's configuration file (`KATA_TOPO_CONFIG`).
    pub config: PathBuf,
    /// The wrapper's JSON log.
    pub log_file: PathBuf,
    /// The wrapper's state directory.
    pub state_dir: PathBuf,
    /// The wrapper's metrics directory (when asked for).
    pub metrics_dir: PathBuf,
    /// The simulated sysfs.
    pub sysfs: SysfsTree,
    /// A character device standing in for `/dev/vfio/42` on the host side.
    pub vfio_node: PathBuf,
    /// Where shims put their sockets: `/run/containerd/s`, or `<dir>/s` with
    /// [`Guard::socket_dir`].
    pub shim_socket_dir: PathBuf,
    /// A second wrapper configuration, the runtime option `ConfigPath` of the handler
    /// `kata-topo-configpath` (the same settings, its own `log_file`).
    pub configpath: PathBuf,
    /// The `log_file` of [`Containerd::configpath`].
    pub configpath_log: PathBuf,
    /// What the recording shim (handlers `record`, `record-configpath`) saw: per task id,
    /// `<id>.stdin` (what containerd wrote to `start`) and `<id>.stdout` (what it read back).
    pub records: PathBuf,
    /// containerd 2.x: its NRI socket (`<dir>/nri.sock`).
    pub nri_socket: PathBuf,
    /// Shim sockets present before this containerd started.
    sockets_before: Vec<PathBuf>,
    /// Held for this containerd's whole life (released after `Drop` cleaned up).
    _exclusive: MachineLock,
}

/// The sockets in a shim socket directory.
fn shim_sockets(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

impl Guard {
    /// The wrapper's configuration: the `[topology_guard]` template's table with these
    /// settings and paths, then [`Guard::extra`]. (`kata-topo-nri` reads the same table.)
    pub(crate) fn table(
        &self,
        sysfs: &Path,
        state_dir: &Path,
        log: &Path,
        metrics: &str,
    ) -> String {
        let text = |p: &Path| p.display().to_string();
        let delegate = self
            .delegate
            .clone()
            .unwrap_or_else(|| PathBuf::from("containerd-shim-runc-v2"));
        let topology = self
            .topology_xml
            .clone()
            .unwrap_or_else(|| workspace().join("scenario/two-node-host.xml"));
        let (delegate, topology, sysfs, state, log) = (
            text(&delegate),
            text(&topology),
            text(sysfs),
            text(state_dir),
            text(log),
        );
        let fail_closed = self.fail_closed.to_string();
        let values = [
            ("DELEGATE", delegate.as_str()),
            ("MODE", self.mode),
            ("POLICY", self.policy),
            ("TOPOLOGY_XML", topology.as_str()),
            ("SYSFS", sysfs.as_str()),
            ("STATE_DIR", state.as_str()),
            ("LOG_FILE", log.as_str()),
            ("FAIL_CLOSED", fail_closed.as_str()),
            ("METRICS_DIR", metrics),
        ];
        let table = templates::render(templates::TOPOLOGY_GUARD, &values)
            .expect("the [topology_guard] template renders");
        format!("{table}{}\n", self.extra)
    }
}

/// The simulated host in a test's directory `d`: its sysfs tree (the scenario's GPU in IOMMU
/// group 42 on node 1, a NIC bound to vfio-pci on node 0) and the character device standing in
/// for `/dev/vfio/42`.
pub(crate) fn simulated_host(d: &Path) -> (SysfsTree, PathBuf) {
    let sysfs = SysfsTree::at(d.join("sys")).expect("sysfs");
    sysfs.add_gpu().expect("gpu");
    sysfs
        .add_device(
            "0000:17:00.0".parse().expect("bdf"),
            0,
            Some("vfio-pci"),
            Some("17"),
        )
        .expect("nic");
    let vfio_node = d.join("vfio-42");
    let made = Command::new("mknod")
        .arg(&vfio_node)
        .args(["c", "1", "3"])
        .status()
        .expect("mknod");
    assert!(made.success(), "mknod {}", vfio_node.display());
    (sysfs, vfio_node)
}

impl Containerd {
    /// Starts containerd with the wrapper configured as `guard` says, images imported.
    pub fn start(guard: Guard) -> Self {
        require_root();
        let exclusive = MachineLock::take();
        let bins = bin_dir();
        let under = guard.under.clone().unwrap_or_else(|| PathBuf::from("/tmp"));
        std::fs::create_dir_all(&under).expect("the folder of containerd's directory");
        let dir = tempfile::Builder::new()
            .prefix("kt-")
            .tempdir_in(&under)
            .expect("tempdir");
        let d = dir.path();
        let (sysfs, vfio_node) = simulated_host(d);
        let path_dir = d.join("bin");
        std::fs::create_dir_all(&path_dir).expect("bin dir");
        std::os::unix::fs::symlink(
            bins.join("containerd-shim-kata-topo-v2"),
            path_dir.join("containerd-shim-kata-topo-v2"),
        )
        .expect("symlink shim");
        let socket = d.join("c.sock");
        let config = d.join("kata-topo.toml");
        let log_file = guard
            .log_file
            .clone()
            .unwrap_or_else(|| d.join("kata-topo.log"));
        let state_dir = guard
            .state_dir
            .clone()
            .unwrap_or_else(|| d.join("kt-state"));
        let configpath = d.join("kata-topo-configpath.toml");
        let configpath_log = d.join("kata-topo-configpath.log");
        let metrics_dir = d.join("metrics");
        let records = d.join("records");
        std::fs::create_dir_all(&records).expect("records dir");
        let metrics = if guard.metrics {
            metrics_dir.display().to_string()
        } else {
            String::new()
        };
        let wrapper_config = |log: &Path| guard.table(sysfs.root(), &state_dir, log, &metrics);
        std::fs::write(&config, wrapper_config(&log_file)).expect("write config");
        std::fs::write(&configpath, wrapper_config(&configpath_log)).expect("write config");
        // The recording shim: containerd's `start` input and output, then runc's shim.
        std::os::unix::fs::symlink(
            workspace().join("integration/record-shim.sh"),
            path_dir.join("containerd-shim-record-v2"),
        )
        .expect("symlink the recording shim");
        let shim_socket_dir = if guard.socket_dir && ContainerdBin::get().has_bootstrap() {
            d.join("s")
        } else {
            PathBuf::from("/run/containerd/s")
        };
        let runc_hook = guard.runc_hook.then(|| {
            let base = d.join("base-spec.json");
            write_hooked_base_spec(&base, &bins.join("kata-topo-hook"), &config);
            base
        });
        let layout = ConfigLayout {
            dir: d,
            runc_hook: runc_hook.as_deref(),
            configpath: &configpath,
            socket_dir: (shim_socket_dir != Path::new("/run/containerd/s"))
                .then_some(shim_socket_dir.as_path()),
            nri_timeout: guard.nri_timeout,
            debug: guard.debug,
        };
        let text = layout.render(ContainerdBin::get().is_v2());
        std::fs::write(d.join("containerd.toml"), text).expect("write containerd config");
        let mut c = Self {
            nri_socket: d.join("nri.sock"),
            socket,
            child: None,
            config,
            log_file,
            state_dir,
            metrics_dir,
            sysfs,
            vfio_node,
            configpath,
            configpath_log,
            records,
            sockets_before: shim_sockets(&shim_socket_dir),
            shim_socket_dir,
            _exclusive: exclusive,
            dir,
        };
        c.spawn();
        for ns in ["k8s.io", "default"] {
            for image in ["pause.tar", "busybox.tar"] {
                let out = c.ctr_ns(
                    ns,
                    &[
                        "images",
                        "import",
                        images().join(image).to_str().expect("path"),
                    ],
                );
                assert!(
                    out.status.success(),
                    "import {image}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        c
    }

    fn spawn(&mut self) {
        let d = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(d.join("containerd.log"))
            .expect("log");
        // The wrapper and the recording shim first, then KT_CONTAINERD_BIN (its shim and
        // runc), then the system's.
        let bins = ContainerdBin::get();
        let mut path = vec![d.join("bin")];
        path.extend(bins.dir.clone());
        path.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_else(|| "/usr/sbin:/usr/bin:/sbin:/bin".into()),
        ));
        // containerd tells shims its own path (`-publish-binary`, the bootstrap's
        // containerd_binary): run it from this directory, so what it says is no path of the
        // machine it was unpacked on.
        let containerd = match &bins.dir {
            Some(dir) => {
                let local = d.join("bin/containerd");
                if !local.exists() {
                    std::fs::hard_link(dir.join("containerd"), &local)
                        .or_else(|_| std::fs::copy(dir.join("containerd"), &local).map(|_| ()))
                        .expect("containerd into the test directory");
                }
                local
            }
            None => bins.containerd(),
        };
        let child = Command::new(containerd)
            .arg("--config")
            .arg(d.join("containerd.toml"))
            .env("PATH", std::env::join_paths(path).expect("PATH"))
            .env("KATA_TOPO_CONFIG", &self.config)
            .env("KT_RECORD_DIR", &self.records)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start containerd");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.ctr(&["version"]).status.success() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("containerd did not come up: {}", self.containerd_log());
    }

    /// Stops containerd (SIGTERM) and starts it again on the same root and state.
    pub fn restart(&mut self) {
        self.stop_containerd();
        self.spawn();
    }

    fn stop_containerd(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let deadline = Instant::now() + Duration::from_secs(10);
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

    /// Points the wrapper at the live machine instead of the simulated host: the
    /// `topology_xml` line goes from its configuration, which every later `start` reads. The
    /// topology then goes through the node-wide cache in the wrapper's `state_dir`.
    pub fn use_live_topology(&self) {
        let text = std::fs::read_to_string(&self.config).expect("read the wrapper's config");
        let kept: Vec<&str> = text
            .lines()
            .filter(|l| !l.trim_start().starts_with("topology_xml"))
            .collect();
        std::fs::write(&self.config, kept.join("\n") + "\n").expect("write the wrapper's config");
    }

    /// containerd's own log.
    pub fn containerd_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("containerd.log")).unwrap_or_default()
    }

    /// `ctr -n default …`.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_ns("default", args)
    }

    /// Removes task and container `id` (namespace `default`): the task killed and deleted,
    /// then the container deleted, which must succeed.
    pub fn remove_task(&self, id: &str) {
        let _ = self.ctr(&["task", "delete", "-f", id]);
        let out = self.ctr(&["container", "delete", id]);
        assert!(
            out.status.success(),
            "container delete {id}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `ctr -n NS …`.
    pub fn ctr_ns(&self, ns: &str, args: &[&str]) -> Output {
        Command::new(ContainerdBin::get().ctr())
            .arg("-a")
            .arg(&self.socket)
            .args(["-n", ns])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run ctr")
    }

    /// The wrapper's JSON log lines.
    pub fn log_lines(&self) -> Vec<serde_json::Value> {
        std::fs::read_to_string(&self.log_file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The wrapper's finding lines.
    pub fn findings(&self) -> Vec<serde_json::Value> {
        self.log_lines()
            .into_iter()
            .filter(|l| l["event"] == "finding")
            .collect()
    }

    /// The wrapper's finding lines once `want` holds for them, or as they are after
    /// `timeout`. The wrapper writes its log off the request path (a slow disk never holds
    /// a pod's call), so a verdict's lines may land a moment after the answer that carried
    /// it: a test that expects lines waits for them here.
    pub fn findings_when(
        &self,
        timeout: Duration,
        want: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let deadline = Instant::now() + timeout;
        loop {
            let found = self.findings();
            if want(&found) || Instant::now() >= deadline {
                return found;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Live processes of this containerd whose command line contains `needle`.
    pub fn pids_matching(&self, needle: &str) -> Vec<u32> {
        self.leftover_processes()
            .iter()
            .filter(|l| l.contains(needle))
            .filter_map(|l| l.split(':').next()?.parse().ok())
            .collect()
    }

    /// Processes started for this containerd (shims, wrappers) that are still alive.
    pub fn leftover_processes(&self) -> Vec<String> {
        let needle = self.socket.to_string_lossy().into_owned();
        let mut found = Vec::new();
        let own = self.child.as_ref().map(Child::id);
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            if Some(pid) == own {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let zombie = stat.split(") ").nth(1).is_some_and(|s| s.starts_with('Z'));
            if text.contains(&needle) && !zombie && !text.starts_with("ctr ") {
                found.push(format!("{pid}: {text}"));
            }
        }
        found
    }

    /// Shim sockets that appeared since this containerd started.
    pub fn new_sockets(&self) -> Vec<PathBuf> {
        shim_sockets(&self.shim_socket_dir)
            .into_iter()
            .filter(|s| !self.sockets_before.contains(s))
            .collect()
    }

    /// Waits until nothing this containerd started is left: no shim process, no new shim
    /// socket, no wrapper state (the topology cache is the node's and stays). Returns what is left after the timeout.
    pub fn wait_clean(&self, timeout: Duration) -> Vec<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut left = self.leftover_processes();
            left.extend(
                self.new_sockets()
                    .into_iter()
                    .map(|s| format!("socket {}", s.display())),
            );
            if let Ok(entries) = std::fs::read_dir(&self.state_dir) {
                // The node-wide topology cache is the node's, not a pod's.
                for e in entries.flatten().filter(|e| {
                    !kata_topo_core::host::cache::is_cache_file(&e.file_name().to_string_lossy())
                }) {
                    left.push(format!("state {}", e.path().display()));
                }
            }
            if left.is_empty() || Instant::now() > deadline {
                return left;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The sum of a metric's series whose labels contain `label`, over every sandbox's
    /// textfile in the wrapper's metrics directory.
    pub fn metric(&self, metric: &str, label: &str) -> f64 {
        std::fs::read_dir(&self.metrics_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".prom"))
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .flat_map(|t| {
                t.lines()
                    .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
                    .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.stop_containerd();
        // Anything still alive was leaked by a failing test: end it so the next test starts
        // clean, and remove the sockets it held.
        for line in self.leftover_processes() {
            if let Some(pid) = line.split(':').next() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        std::thread::sleep(Duration::from_millis(100));
        for s in self.new_sockets() {
            let _ = std::fs::remove_file(s);
        }
        let _ = Command::new("umount")
            .arg("-R")
            .arg(self.dir.path().join("state"))
            .stderr(Stdio::null())
            .status();
        for sub in ["root", "state"] {
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "grep -o ' {}[^ ]*' /proc/mounts | sort -r | xargs -r -n1 umount -l",
                    self.dir.path().join(sub).display()
                ))
                .stderr(Stdio::null())
                .status();
        }
    }
}
