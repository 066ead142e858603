//! A pod's checks for tests: the scenario's two-node host, a GPU on node 1 in VFIO group 42,
//! one container `app` admitted on CPU 1 with the GPU, a log file in a temporary directory.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::testutil::SysfsTree;
use kata_topo_sinks::{Drops, Events, Log, Metrics};

use super::{Outcome, Outputs, Pod};

/// A pod's checks over the scenario's two-node host and a GPU on node 1 in VFIO group 42,
/// logging to a file in a temporary directory.
pub struct TestPod {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) log: Log,
    pub(crate) pod: Arc<Pod>,
}

impl std::fmt::Debug for TestPod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestPod")
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

pub(crate) fn pod_with(mode: &str, state_dir: Option<&Path>, load: bool) -> TestPod {
    pod_configured(mode, state_dir, load, "", false)
}

/// [`pod_with`] with more `[topology_guard]` lines (`extra`) and, with `metrics`, a textfile
/// in the temporary directory (`TestPod::metrics`).
pub(crate) fn pod_configured(
    mode: &str,
    state_dir: Option<&Path>,
    load: bool,
    extra: &str,
    metrics: bool,
) -> TestPod {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(dir.path().join("sys")).expect("sysfs");
    tree.add_gpu().expect("gpu");
    let state = state_dir.map_or_else(|| dir.path().join("state"), Path::to_path_buf);
    // No kubelet unless a test brings one: a node's real socket is never asked.
    let kubelet = if extra.contains("kubelet_pod_resources_socket") {
        String::new()
    } else {
        format!(
            "kubelet_pod_resources_socket = \"{}\"\n",
            dir.path().join("no-kubelet.sock").display()
        )
    };
    // No API server unless a test brings one: a node's real kubeconfig is never read.
    let kubeconfig = if extra.contains("kubeconfig") {
        ""
    } else {
        "kubeconfig = \"\"\n"
    };
    let config = Config::parse(
        &format!(
            "[topology_guard]\nmode = \"{mode}\"\ntopology_xml = \"{}\"\nsysfs_root = \"{}\"\nstate_dir = \"{}\"\nlog_file = \"{}\"\n{kubelet}{kubeconfig}{extra}",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
            tree.root().display(),
            state.display(),
            dir.path().join("kt.log").display(),
        ),
        Path::new("test.toml"),
    )
    .expect("config");
    let drops = Drops::new();
    let log = Log::with_journal(&config.log_file, false, None, drops.clone());
    let sinks = Outputs {
        log: log.logger().clone(),
        events: Events::off(),
        metrics: if metrics {
            Metrics::textfile(dir.path(), "k8s.io", "sb1", drops.clone())
        } else {
            Metrics::off()
        },
        drops,
    };
    let resolved = Resolved {
        config,
        file: Some(dir.path().join("test.toml")),
        source: ConfigSource::ConfigPath,
    };
    let pod = Pod::new(resolved, KataConfig::default(), "k8s.io", "sb1", sinks);
    if load {
        pod.refresh();
    }
    write_bundle(
        &dir.path().join("bundle"),
        serde_json::json!({
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "sb1",
            "io.kubernetes.cri.container-name": "app",
            "io.kubernetes.cri.sandbox-name": "pod",
            "io.kubernetes.cri.sandbox-namespace": "ns",
            "kata-topo.io/numa-nodes": "1"
        }),
        serde_json::json!({
            "resources": {"cpu": {"cpus": "1", "quota": 100000, "period": 100000}},
            "devices": [{"path": "/dev/vfio/42", "type": "c", "major": 240, "minor": 0}]
        }),
    );
    TestPod { dir, log, pod }
}

/// A bundle at `bundle` whose `config.json` has these annotations and this `linux` section.
pub(crate) fn write_bundle(
    bundle: &Path,
    annotations: serde_json::Value,
    linux: serde_json::Value,
) {
    std::fs::create_dir_all(bundle).expect("bundle");
    std::fs::write(
        bundle.join("config.json"),
        serde_json::json!({"ociVersion": "1.0.2", "annotations": annotations, "linux": linux})
            .to_string(),
    )
    .expect("spec");
}

/// [`pod_with`] in `mode` (`audit`, `enforce`), its topology loaded.
pub fn pod(mode: &str) -> TestPod {
    pod_with(mode, None, true)
}

impl TestPod {
    /// The log's lines so far, each parsed.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        assert!(self.log.flush(Instant::now() + Duration::from_secs(10)));
        std::fs::read_to_string(self.dir.path().join("kt.log"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect()
    }

    /// The metrics textfile, as the writer thread last wrote it.
    pub(crate) fn metrics(&self) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(kata_topo_sinks::metrics::file_name("k8s.io", "sb1")),
        )
        .unwrap_or_default()
    }

    pub(crate) fn finding_lines(&self) -> usize {
        self.lines()
            .iter()
            .filter(|l| l["event"] == "finding")
            .count()
    }

    pub(crate) fn create(&self) {
        self.create_with_pid(7);
    }

    /// The delegate reported its pid (its `Connect` reply's `shim_pid`). For the integration
    /// tests only (feature `testing`): no unit test needs it.
    #[cfg(feature = "testing")]
    pub fn delegate_is(&self, pid: u32) {
        self.pod
            .record_daemon("unix:///run/test/delegate.sock", Some(pid));
    }

    /// The container `c1` created and accepted by the delegate, whose reply carried `pid` (the
    /// VMM's, with Kata's Go runtime).
    pub fn create_with_pid(&self, pid: u32) {
        match self.pod.on_create("c1", &self.dir.path().join("bundle")) {
            Outcome::Forward(Some(accept)) => self.pod.commit(accept, Some(pid)),
            other => panic!("create: {other:?}"),
        }
    }

    /// The pod's sandbox `sb1` created and accepted: the pod's first create.
    pub(crate) fn create_sandbox(&self) -> Outcome {
        let bundle = self.dir.path().join("sandbox-bundle");
        std::fs::create_dir_all(&bundle).expect("bundle");
        std::fs::write(
            bundle.join("config.json"),
            serde_json::json!({
                "ociVersion": "1.0.2",
                "annotations": {
                    "io.kubernetes.cri.container-type": "sandbox",
                    "io.kubernetes.cri.sandbox-id": "sb1",
                    "io.kubernetes.cri.sandbox-name": "pod",
                    "io.kubernetes.cri.sandbox-namespace": "ns",
                    "io.kubernetes.cri.sandbox-uid": "uid-1"
                },
                "linux": {"resources": {"cpu": {"cpus": "1"}}}
            })
            .to_string(),
        )
        .expect("spec");
        let outcome = self.pod.on_create("sb1", &bundle);
        if let Outcome::Forward(Some(accept)) = &outcome {
            self.pod.commit(accept.clone(), None);
        }
        outcome
    }

    pub(crate) fn update(&self, json: &str) -> Outcome {
        let outcome = self.pod.on_update("c1", json.as_bytes());
        if let Outcome::Forward(Some(accept)) = &outcome {
            self.pod.commit(accept.clone(), None);
        }
        outcome
    }
}
