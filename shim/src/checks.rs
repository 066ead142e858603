//! A pod's checks for a front end other than the wrapper (`kata-topo-nri`): the same [`Pod`]
//! the wrapper's daemon runs — its state for `kata-topo status`, its metrics, log lines and
//! Kubernetes Events, its kubelet and API server readers, its baselines — driven by requests
//! that carry the container's spec instead of a bundle. Nothing here decides: the core's
//! phases do, through [`Pod`].
//!
//! Such a front end serves every pod of the node from one process: its pods share one
//! [`NodeChecks`] — one topology and its refresher thread, one state writer thread, one metrics
//! writer thread (each pod its own textfile), one API server client and one Kubernetes Events
//! writer — where each wrapper daemon has its own.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::state::GroupState;
use kata_topo_core::{ContainerSpec, Resources};
use kata_topo_sinks::{Drops, Events, MetricsWriter};
use slog::Logger;

use crate::pod::{Node, Outcome, Outputs, Pod};

/// What a front end hands every pod: where its verdicts go.
#[derive(Debug, Clone)]
pub struct Sinks {
    /// JSON log lines.
    pub log: Logger,
    /// containerd events (off when the front end has no containerd address).
    pub events: Events,
    /// What the sinks dropped.
    pub drops: Arc<Drops>,
}

/// Whether pod `sandbox_id`'s state records a wrapper daemon that still runs: such a pod is
/// the wrapper's to check, and another front end leaves it (and its state) alone. The
/// wrapper's daemon records itself once its delegate started, before any container of the
/// pod is created.
pub fn served_by_wrapper(config: &Config, namespace: &str, sandbox_id: &str) -> bool {
    GroupState::existing(&config.state_dir, namespace, sandbox_id)
        .and_then(|files| files.daemon().ok().flatten())
        .is_some_and(|d| d.wrapper.is_alive(&config.procfs_root))
}

/// One pod's checks.
#[derive(Debug, Clone)]
pub struct PodChecks {
    pod: Arc<Pod>,
}

/// Where a container's spec is kept when no bundle holds it: a relative path, never a real
/// bundle's (containerd's are absolute).
fn key(container_id: &str) -> PathBuf {
    Path::new("nri").join(container_id)
}

/// What every pod of the node shares, and the configuration each is made with.
#[derive(Debug, Clone)]
pub struct NodeChecks {
    node: Arc<Node>,
    /// The configuration and Kata's, one copy for every pod.
    config: Arc<Config>,
    origin: (Option<PathBuf>, ConfigSource),
    kata: Arc<KataConfig>,
    sinks: Sinks,
    /// The one thread that writes every pod's metrics textfile (with `metrics_dir`).
    metrics: MetricsWriter,
}

impl NodeChecks {
    /// The node's shared parts, with the topology loaded before this returns and then
    /// refreshed every `topology_refresh_seconds` by one thread, for as long as a clone of
    /// this lives.
    pub fn new(resolved: Resolved, kata: KataConfig, sinks: &Sinks) -> Self {
        let node = Node::new(&resolved.config, sinks.log.clone(), sinks.drops.clone());
        node.refresh();
        node.spawn_refresher();
        let metrics = match &resolved.config.metrics_dir {
            Some(dir) => MetricsWriter::textfiles(dir, sinks.drops.clone()),
            None => MetricsWriter::off(),
        };
        let Resolved {
            config,
            file,
            source,
        } = resolved;
        Self {
            node,
            config: Arc::new(config),
            origin: (file, source),
            kata: Arc::new(kata),
            sinks: sinks.clone(),
            metrics,
        }
    }

    /// The node's configuration.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// How many pods' checks live on it now.
    pub fn pods(&self) -> usize {
        self.node.pods()
    }

    /// Lets go at once of what is left of the pods whose checks were dropped (a front end
    /// calls it after a pod's removal).
    pub fn prune(&self) {
        self.node.prune();
    }
}

/// How long a pod's state directory must have been left unchanged before a front end's
/// synchronisation takes it for a removed pod's: a wrapper's daemon creates a new pod's
/// directory before the runtime lists its sandbox, and records itself there at once.
const GONE_AFTER: Duration = Duration::from_secs(60);

impl NodeChecks {
    /// At a front end's synchronisation with the runtime (`live`: the ids of every sandbox of
    /// `namespace` it runs): removes the state and the metrics textfile of each pod of
    /// `namespace` in `state_dir` the runtime no longer has — one removed while no plugin was
    /// connected, the plugin's own pod among them (it exits before its sandbox goes) — unless
    /// a running wrapper daemon serves it or its directory changed in the last minute. Returns
    /// their directories' names.
    pub fn remove_gone(&self, namespace: &str, live: &[&str]) -> Vec<String> {
        let config = self.config();
        let live: std::collections::HashSet<String> = live
            .iter()
            .map(|id| kata_topo_core::state::safe_name(id))
            .collect();
        let mut removed = Vec::new();
        for (name, age) in kata_topo_core::state::groups(&config.state_dir, namespace) {
            if live.contains(&name)
                || age < GONE_AFTER
                || served_by_wrapper(config, namespace, &name)
            {
                continue;
            }
            let state = GroupState::at(&config.state_dir, namespace, &name);
            if let Err(e) = state.remove_all() {
                slog::warn!(self.sinks.log, "cannot remove a removed pod's state"; "event" => "state-failed",
                    "sandbox_id" => &name, "error" => e.to_string());
                continue;
            }
            if let Some(dir) = &config.metrics_dir {
                let _ = std::fs::remove_file(
                    dir.join(kata_topo_sinks::metrics::file_name(namespace, &name)),
                );
            }
            removed.push(name);
        }
        removed
    }
}

impl PodChecks {
    /// The checks of pod `sandbox_id` in containerd namespace `namespace` on `node`'s shared
    /// parts, with its state under `state_dir` as the wrapper keeps it, its own metrics
    /// textfile written by the node's metrics writer (a front end that serves many pods adds
    /// one per pod as it learns of it). `fresh`: the runtime has just created the pod (the
    /// front end learnt of it after it synchronised), so nothing of it is on disk to read:
    /// its state directory is made off the request's path, by the node's state writer
    /// before its first write.
    pub fn new(node: &NodeChecks, namespace: &str, sandbox_id: &str, fresh: bool) -> Self {
        let sinks = &node.sinks;
        let outputs = Outputs {
            log: sinks.log.clone(),
            events: sinks.events.clone(),
            metrics: node.metrics.textfile(namespace, sandbox_id),
            drops: sinks.drops.clone(),
        };
        let pod = Pod::on_node(
            &node.node,
            Arc::clone(&node.config),
            node.origin.clone(),
            Arc::clone(&node.kata),
            namespace,
            sandbox_id,
            outputs,
            fresh,
        );
        Self { pod }
    }

    /// A container's create: checked as its first create (admission, recording its
    /// baseline) or a recreate of its name; `Err` is the refusal's message (enforce mode).
    /// Accepted, it is remembered at once.
    pub fn create(&self, container_id: &str, spec: ContainerSpec) -> Result<(), String> {
        let outcome = self.pod.on_create_spec(
            container_id,
            &key(container_id),
            Arc::new(spec),
            Instant::now(),
        );
        self.settle(outcome)
    }

    /// A container's update to `resources_json` (an OCI `LinuxResources` JSON); `Err` is the
    /// refusal's message.
    pub fn update(&self, container_id: &str, resources_json: &[u8]) -> Result<(), String> {
        let outcome = self.pod.on_update(container_id, resources_json);
        self.settle(outcome)
    }

    /// A container that runs already (a restarted front end's synchronisation).
    pub fn adopt(&self, container_id: &str, spec: ContainerSpec, resources: Resources) {
        self.pod
            .adopt(container_id, &key(container_id), Arc::new(spec), resources);
    }

    /// Whether the container is known (created or adopted here, or in the pod's state).
    pub fn knows(&self, container_id: &str) -> bool {
        self.pod.knows(container_id)
    }

    /// A container was removed.
    pub fn remove(&self, container_id: &str) {
        if let Outcome::Forward(Some(accept)) = self.pod.on_delete(container_id) {
            self.pod.commit(accept, None);
        }
    }

    /// The pod is gone: its state and metrics go.
    pub fn forget(&self) {
        self.pod.forget(Instant::now() + Duration::from_secs(1));
    }

    /// Waits, until `deadline`, for the state mirror to catch up.
    pub fn flush(&self, deadline: Instant) -> bool {
        self.pod.flush_state(deadline)
    }

    fn settle(&self, outcome: Outcome) -> Result<(), String> {
        match outcome {
            Outcome::Forward(Some(accept)) => {
                self.pod.commit(accept, None);
                Ok(())
            }
            Outcome::Forward(None) => Ok(()),
            Outcome::Refuse(e) => Err(kata_topo_core::text::error_chain(&e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_core::config::ConfigSource;
    use kata_topo_core::process::ProcessId;
    use kata_topo_core::state::DaemonRecord;

    /// A pod's state directory, with its last change `age` ago.
    fn pod_dir(state_dir: &Path, group: &str, age: Duration) -> GroupState {
        let g = GroupState::open(state_dir, "k8s.io", group).expect("state");
        let then = std::time::SystemTime::now() - age;
        std::fs::File::open(g.dir())
            .and_then(|d| d.set_modified(then))
            .expect("mtime");
        g
    }

    #[test]
    fn a_synchronisation_removes_what_pods_the_runtime_no_longer_has_left_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tmp");
        let state_dir = dir.path().join("state");
        let metrics_dir = dir.path().join("metrics");
        std::fs::create_dir_all(&metrics_dir).expect("metrics dir");
        let config = Config {
            state_dir: state_dir.clone(),
            metrics_dir: Some(metrics_dir.clone()),
            log_file: dir.path().join("log"),
            topology_xml: Some(kata_topo_core::testutil::xml("24em64t-2n6c2t-pci.xml")),
            kubeconfig: None,
            ..Config::default()
        };
        let old = Duration::from_secs(600);
        pod_dir(&state_dir, "gone", old);
        pod_dir(&state_dir, "live", old);
        pod_dir(&state_dir, "fresh", Duration::ZERO);
        // Served by a wrapper daemon that runs (this process stands for it).
        let wrapped = GroupState::open(&state_dir, "k8s.io", "wrapped").expect("state");
        wrapped
            .save_daemon(&DaemonRecord {
                wrapper: ProcessId::current(Path::new("/proc")).expect("this process"),
                delegate_address: String::new(),
                delegate: None,
                config: None,
                config_source: String::new(),
                node_affinity: None,
                pod_events: None,
            })
            .expect("daemon");
        pod_dir(&state_dir, "wrapped", old);
        for g in ["gone", "live"] {
            std::fs::write(
                metrics_dir.join(kata_topo_sinks::metrics::file_name("k8s.io", g)),
                "x",
            )
            .expect("textfile");
        }
        let log = Logger::root(slog::Discard, slog::o!());
        let drops = Drops::new();
        let sinks = Sinks {
            log: log.clone(),
            events: Events::off(),
            drops,
        };
        let resolved = Resolved {
            config,
            file: None,
            source: ConfigSource::Defaults,
        };
        let node = NodeChecks::new(resolved, KataConfig::default(), &sinks);

        assert_eq!(node.remove_gone("k8s.io", &["live"]), ["gone"]);
        let left: Vec<String> = {
            let mut l: Vec<String> = kata_topo_core::state::groups(&state_dir, "k8s.io")
                .into_iter()
                .map(|(name, _)| name)
                .collect();
            l.sort();
            l
        };
        assert_eq!(left, ["fresh", "live", "wrapped"]);
        let textfile = |g: &str| metrics_dir.join(kata_topo_sinks::metrics::file_name("k8s.io", g));
        assert!(!textfile("gone").exists());
        assert!(textfile("live").exists());
        // Another namespace's pods are not this one's.
        assert!(node.remove_gone("other", &[]).is_empty());
    }

    /// The checks of a node whose state is under `state_dir`, logging to `log_file`.
    fn node_at(state_dir: &Path, log_file: &Path) -> (NodeChecks, kata_topo_sinks::Log) {
        let drops = Drops::new();
        let log = kata_topo_sinks::Log::with_journal(log_file, false, None, drops.clone());
        let sinks = Sinks {
            log: log.logger().clone(),
            events: Events::off(),
            drops,
        };
        let config = Config {
            state_dir: state_dir.to_path_buf(),
            log_file: log_file.to_path_buf(),
            topology_xml: Some(kata_topo_core::testutil::xml("24em64t-2n6c2t-pci.xml")),
            kubeconfig: None,
            ..Config::default()
        };
        let resolved = Resolved {
            config,
            file: None,
            source: ConfigSource::Defaults,
        };
        (
            NodeChecks::new(resolved, KataConfig::default(), &sinks),
            log,
        )
    }

    #[test]
    fn a_fresh_pods_state_directory_is_made_by_the_writer_never_by_its_request() {
        use kata_topo_core::testutil::spec;
        let dir = tempfile::tempdir().expect("tmp");
        let state_dir = dir.path().join("state");
        let (node, log) = node_at(&state_dir, &dir.path().join("log"));
        let pod_dir = state_dir.join("k8s.io/sb-1");
        let checks = PodChecks::new(&node, "k8s.io", "sb-1", true);
        assert!(!pod_dir.exists(), "made when the pod's checks were");
        checks
            .create("sb-1", spec().sandbox().build())
            .expect("the sandbox admitted");
        checks
            .create("c1", spec().cpus("0").build())
            .expect("the container admitted");
        assert!(checks.flush(Instant::now() + Duration::from_secs(10)));
        // What `kata-topo status` reads: both tasks and the container's baseline.
        let state = kata_topo_core::state::read_pod(&pod_dir)
            .expect("readable")
            .expect("the pod's state");
        let mut tasks: Vec<&str> = state.tasks.iter().map(|(id, _)| id.as_str()).collect();
        tasks.sort();
        assert_eq!(tasks, ["c1", "sb-1"]);
        assert!(
            state.containers.iter().any(|(name, _)| name == "trainer"),
            "{:?}",
            state.containers
        );
        // Removed, it leaves nothing.
        checks.remove("c1");
        checks.remove("sb-1");
        checks.forget();
        assert!(!pod_dir.exists(), "left behind");
        assert!(log.flush(Instant::now() + Duration::from_secs(5)));
    }

    #[test]
    fn a_fresh_pod_in_an_untrusted_state_directory_is_checked_from_memory_and_never_written() {
        use kata_topo_core::testutil::spec;
        let dir = tempfile::tempdir().expect("tmp");
        let state_dir = dir.path().join("state");
        std::fs::create_dir(&state_dir).expect("state dir");
        std::os::unix::fs::chown(&state_dir, Some(65534), None).expect("chown (run as root)");
        let log_file = dir.path().join("log");
        let (node, log) = node_at(&state_dir, &log_file);
        let checks = PodChecks::new(&node, "k8s.io", "sb-1", true);
        checks
            .create("sb-1", spec().sandbox().build())
            .expect("the sandbox admitted");
        checks
            .create("c1", spec().cpus("0").build())
            .expect("the container admitted");
        assert!(checks.knows("c1"));
        assert!(checks.flush(Instant::now() + Duration::from_secs(10)));
        assert!(log.flush(Instant::now() + Duration::from_secs(5)));
        assert_eq!(
            std::fs::read_dir(&state_dir).expect("list").count(),
            0,
            "written into"
        );
        let lines: Vec<serde_json::Value> = std::fs::read_to_string(&log_file)
            .expect("log")
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON"))
            .collect();
        let said: Vec<_> = lines
            .iter()
            .filter(|l| l["event"] == "state-untrusted")
            .collect();
        assert_eq!(said.len(), 1, "said once: {lines:#?}");
        assert!(
            said[0]["error"]
                .as_str()
                .unwrap_or_default()
                .contains("uid 65534"),
            "{said:?}"
        );
    }
}
