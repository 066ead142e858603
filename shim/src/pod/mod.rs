//! One pod as its wrapper daemon keeps it: its configuration, its state ([`store`]), the
//! readers of what a check needs (the topology, [`host`]; the kubelet's PodResources,
//! [`pod_resources`]; the API server, [`affinity`]), and the requests it sees — `Create`,
//! `Update` and `Delete` — as plain methods testable without a ttrpc connection: a request
//! comes in, the core's phase checks it, an [`Outcome`] goes out; once the delegate accepted
//! it, [`Pod::commit`] applies what it changed. No rule runs here: the core decides.
//!
//! What a request may wait for, each bounded: a new daemon's first topology load, when it is
//! under way ([`FIRST_LOAD_WAIT`], 3 s, once); the kubelet at the pod's first create and a
//! resize (`kubelet_timeout_ms`); the API server at the sandbox's create, a recreate and a
//! resize (`api_timeout_ms`). Nothing else: the topology is reloaded off the request path
//! ([`Pod::spawn_refresher`]), log lines, events, metrics and state go through queues, and the
//! VM is looked at later by one timer thread.

mod affinity;
mod announce;
mod host;
mod observe;
mod pod_resources;
mod retries;
mod specs;
mod store;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kata_topo_core::check::{could_not_run, Phase, Request, Running, Unread, Update};
use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::input::spec::ContainerKind;
use kata_topo_core::process::ProcessId;
use kata_topo_core::state::{DaemonRecord, TaskRecord, VerdictOf};
use kata_topo_core::vm::{Identity, VmReader, VmView};
use kata_topo_core::{
    Baseline, Checker, ContainerSpec, Decision, Defaults, Operation, Resources, Sysfs, Verdict,
};
use kata_topo_sinks::{log_verdict, Drops, Events, Metrics, Persist, PodEvents};
use slog::Logger;

use crate::error::ShimError;
use affinity::NodeAffinity;
use announce::Announcer;
use kata_topo_apiserver::Setup;
use kata_topo_core::input::affinity::NodeView;
use pod_resources::KubeletIntents;
use retries::{Reads, Retries, RETRY_WINDOW};

/// The longest a check waits for its daemon's first topology load, when that load is under
/// way: a new pod's daemon loads the topology while the delegate starts, and on a fresh node
/// (nothing cached yet, a slow discovery) its first `Create` could otherwise arrive before
/// the load finished and go unchecked. Later checks never wait.
const FIRST_LOAD_WAIT: Duration = Duration::from_secs(3);
use host::CurrentHost;
use observe::Observer;
use specs::SpecCache;
pub(crate) use store::BaselineOf;
use store::{Files, PodStore};

/// What to do with a request.
#[derive(Debug)]
pub(crate) enum Outcome {
    /// Forward it to the delegate; apply this once the delegate answers OK.
    Forward(Option<OnAccept>),
    /// Answer it with this error; the delegate never sees it.
    Refuse(ShimError),
}

/// A baseline a first create records.
#[derive(Debug, Clone)]
pub(crate) struct NewBaseline {
    /// Whose.
    pub(crate) of: BaselineOf,
    /// The spec it is recorded from.
    pub(crate) spec: Arc<ContainerSpec>,
    /// The baseline; `None` when the topology had not loaded yet (recorded once it has).
    pub(crate) baseline: Option<Baseline>,
}

/// What to remember once the delegate accepted a request.
#[derive(Debug, Clone)]
pub(crate) enum OnAccept {
    /// A task was created.
    Created {
        /// Task id.
        task_id: String,
        /// Its record.
        record: TaskRecord,
        /// The sandbox's baseline, or a container's first.
        baseline: Option<Box<NewBaseline>>,
    },
    /// A task's resources changed.
    Updated {
        /// Task id.
        task_id: String,
        /// The resources now in force.
        resources: Resources,
    },
    /// A task was deleted.
    Deleted {
        /// Task id.
        task_id: String,
    },
}

/// Where a pod's verdicts go.
#[derive(Debug, Clone)]
pub(crate) struct Outputs {
    /// JSON lines.
    pub(crate) log: Logger,
    /// containerd events.
    pub(crate) events: Events,
    /// The sandbox's textfile.
    pub(crate) metrics: Metrics,
    /// What the sinks dropped.
    pub(crate) drops: Arc<Drops>,
}

/// What a pod's checks are made of that a front end serving many pods shares between them.
struct Parts {
    host: Arc<CurrentHost>,
    persist: Persist,
    api: Arc<Setup>,
    pod_events: (PodEvents, String),
}

/// The parts every pod of one node shares in a front end that serves them all (the NRI
/// plugin): one topology and its refresher thread, one state writer thread, one API server
/// client and one Kubernetes Events writer. The wrapper's daemon, one pod per process, has
/// them all to itself instead ([`Pod::new`]).
#[derive(Debug)]
pub(crate) struct Node {
    host: Arc<CurrentHost>,
    persist: Persist,
    api: Arc<Setup>,
    pod_events: (PodEvents, String),
    log: Logger,
    /// How often the topology is refreshed (`topology_refresh_seconds`; 0: loaded once).
    period: u64,
    /// The pods made on it, told of each refresh (their metrics count it; a baseline
    /// waiting for the first load is recorded).
    pods: Mutex<Vec<Weak<Pod>>>,
}

impl Node {
    /// The node's shared parts, as `config` sets them up; nothing loaded yet.
    pub(crate) fn new(config: &Config, log: Logger, drops: Arc<Drops>) -> Arc<Self> {
        let on_error = log.clone();
        let persist = Persist::start(drops.clone(), move |key, e| {
            slog::warn!(on_error, "cannot write state"; "event" => "state-failed", "file" => key,
                "error" => e.to_string());
        });
        let api = Arc::new(kata_topo_apiserver::setup(config));
        let pod_events = (
            PodEvents::start(&api, config, log.clone(), drops),
            PodEvents::describe(&api),
        );
        Arc::new(Self {
            host: Arc::new(CurrentHost::new(
                config.topology_source(),
                kata_topo_core::host::cache::TopologyCache::from_config(config),
            )),
            persist,
            api,
            pod_events,
            log,
            period: config.topology_refresh_seconds,
            pods: Mutex::new(Vec::new()),
        })
    }

    fn join(&self, pod: &Arc<Pod>) {
        let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
        pods.retain(|p| p.strong_count() > 0);
        pods.push(Arc::downgrade(pod));
    }

    /// Lets go of the pods dropped since: what is left of each (held for its weak reference)
    /// is freed now rather than when the next pod joins.
    pub(crate) fn prune(&self) {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|p| p.strong_count() > 0);
    }

    /// Loads the topology now (or finds the machine unchanged) and tells every pod.
    pub(crate) fn refresh(&self) {
        let ok = self.host.refresh(&self.log, &Metrics::off(), None);
        let pods: Vec<Arc<Pod>> = {
            let mut pods = self.pods.lock().unwrap_or_else(|e| e.into_inner());
            pods.retain(|p| p.strong_count() > 0);
            pods.iter().filter_map(Weak::upgrade).collect()
        };
        for pod in pods {
            pod.sinks.metrics.refreshed(ok);
            if ok {
                pod.record_pending_baselines();
            }
        }
    }

    /// Spawns the one thread that refreshes the topology every `topology_refresh_seconds`,
    /// for as long as the node lives (the first load is the caller's, [`Node::refresh`]).
    pub(crate) fn spawn_refresher(self: &Arc<Self>) {
        let period = self.period;
        if period == 0 {
            return;
        }
        let weak = Arc::downgrade(self);
        let _ = std::thread::Builder::new()
            .name("topology-refresh".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_secs(period));
                match weak.upgrade() {
                    Some(node) => node.refresh(),
                    None => return,
                }
            });
    }

    /// How many pods it serves now.
    pub(crate) fn pods(&self) -> usize {
        self.pods
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter(|p| p.strong_count() > 0)
            .count()
    }
}

/// The checks of one pod's wrapper daemon.
#[derive(Debug)]
pub(crate) struct Pod {
    /// The configuration: the daemon's own, or shared by every pod of the node (the NRI
    /// plugin's), as are Kata's.
    config: Arc<Config>,
    /// Where the configuration came from, for the daemon's record.
    origin: (Option<PathBuf>, ConfigSource),
    kata: Arc<KataConfig>,
    namespace: String,
    group: String,
    /// The topology: the pod's own (the wrapper's daemon), or its node's (the NRI plugin's).
    host: Arc<CurrentHost>,
    sysfs: Sysfs,
    store: PodStore,
    specs: SpecCache,
    /// Baselines of creates accepted before the topology loaded.
    pending_baselines: Mutex<Vec<(BaselineOf, Arc<ContainerSpec>)>>,
    announcer: Announcer,
    observer: Observer,
    sinks: Outputs,
    /// The delegate's pid, once it reported it: a VMM of this sandbox descends from it or
    /// sits in a cgroup naming the sandbox.
    delegate_pid: std::sync::OnceLock<u32>,
    /// The pod's intent from the kubelet.
    kubelet: KubeletIntents,
    /// The pod's node affinity against its node's labels.
    affinity: NodeAffinity,
    /// What each task's last resize read, answering the kubelet's retries of it.
    retries: Retries,
    /// Kubernetes Events on the pod, and whether they are written (for its record).
    pod_events: (PodEvents, String),
}

impl Pod {
    /// The checks of pod `group`. Its state directory is created when it can be; when it
    /// cannot (a full or read-only disk), the daemon runs from memory and says so.
    pub(crate) fn new(
        resolved: Resolved,
        kata: KataConfig,
        namespace: &str,
        group: &str,
        sinks: Outputs,
    ) -> Arc<Self> {
        let Resolved {
            config,
            file,
            source,
        } = resolved;
        let files = Files::now(&config, namespace, group, &sinks.log);
        let log = sinks.log.clone();
        let persist = Persist::start(sinks.drops.clone(), move |key, e| {
            slog::warn!(log, "cannot write state"; "event" => "state-failed", "file" => key,
                "error" => e.to_string());
        });
        // One API server set-up for the affinity check and the pod's Events.
        let api = Arc::new(kata_topo_apiserver::setup(&config));
        let pod_events = (
            PodEvents::start(&api, &config, sinks.log.clone(), sinks.drops.clone()),
            PodEvents::describe(&api),
        );
        let host = Arc::new(CurrentHost::new(
            config.topology_source(),
            kata_topo_core::host::cache::TopologyCache::from_config(&config),
        ));
        let parts = Parts {
            host,
            persist,
            api,
            pod_events,
        };
        let checks = Self::with_parts(
            Arc::new(config),
            (file, source),
            Arc::new(kata),
            namespace,
            group,
            files,
            sinks,
            parts,
        );
        Observer::start(
            Arc::downgrade(&checks),
            |c: &Pod| &c.observer,
            |c: &Pod, task, pid| c.observe(task, pid),
        );
        checks
    }

    /// The checks of pod `group` on `node`'s shared parts (a front end serving many pods):
    /// its topology is the node's, refreshed by the node; its state written by the node's
    /// writer; its API server reads and Events the node's. No VM view: no timer thread.
    /// `fresh`: the runtime has just created the pod (a front end that saw it after it
    /// synchronised): nothing of it is on disk, and its state directory is made by the
    /// node's writer before its first write, not on the request's path.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn on_node(
        node: &Arc<Node>,
        config: Arc<Config>,
        origin: (Option<PathBuf>, ConfigSource),
        kata: Arc<KataConfig>,
        namespace: &str,
        group: &str,
        sinks: Outputs,
        fresh: bool,
    ) -> Arc<Self> {
        let files = if fresh {
            Files::later(Arc::clone(&config), namespace, group, sinks.log.clone())
        } else {
            Files::now(&config, namespace, group, &sinks.log)
        };
        let log = sinks.log.clone();
        let sandbox = group.to_string();
        let persist = node.persist.another(move |key, e| {
            slog::warn!(log, "cannot write state"; "event" => "state-failed", "file" => key,
                "sandbox_id" => &sandbox, "error" => e.to_string());
        });
        let parts = Parts {
            host: Arc::clone(&node.host),
            persist,
            api: Arc::clone(&node.api),
            pod_events: node.pod_events.clone(),
        };
        let pod = Self::with_parts(config, origin, kata, namespace, group, files, sinks, parts);
        node.join(&pod);
        pod
    }

    #[allow(clippy::too_many_arguments)]
    fn with_parts(
        config: Arc<Config>,
        origin: (Option<PathBuf>, ConfigSource),
        kata: Arc<KataConfig>,
        namespace: &str,
        group: &str,
        files: Files,
        sinks: Outputs,
        parts: Parts,
    ) -> Arc<Self> {
        let store = PodStore::open(files, parts.persist);
        Arc::new(Self {
            origin,
            host: parts.host,
            sysfs: Sysfs::new(&config.sysfs_root),
            affinity: NodeAffinity::new(parts.api, Arc::clone(&config), store.label_baseline()),
            pod_events: parts.pod_events,
            store,
            namespace: namespace.to_string(),
            group: group.to_string(),
            specs: SpecCache::default(),
            pending_baselines: Mutex::new(Vec::new()),
            announcer: Announcer::default(),
            observer: Observer::new(),
            sinks,
            kubelet: KubeletIntents::new(Arc::clone(&config)),
            retries: Retries::new(RETRY_WINDOW),
            config,
            kata,
            delegate_pid: std::sync::OnceLock::new(),
        })
    }

    /// Loads the topology now (tests; the daemon uses [`Pod::spawn_refresher`]).
    pub(crate) fn refresh(&self) {
        if self
            .host
            .refresh(&self.sinks.log, &self.sinks.metrics, Some(&self.group))
        {
            self.record_pending_baselines();
        }
    }

    /// Spawns the thread that loads the topology now, off the request path, then every
    /// `topology_refresh_seconds`.
    pub(crate) fn spawn_refresher(self: &Arc<Self>) {
        let period = self.config.topology_refresh_seconds;
        self.host.first_load_asked();
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("topology-refresh".into())
            .spawn(move || loop {
                match weak.upgrade() {
                    Some(checks) => checks.refresh(),
                    None => return,
                }
                if period == 0 {
                    return;
                }
                std::thread::sleep(Duration::from_secs(period));
            });
        if spawned.is_err() {
            self.refresh();
        }
    }

    fn defaults(&self) -> Defaults {
        self.config.defaults()
    }

    /// Runs one phase of a request against the topology as the daemon has it (waiting for a
    /// first load under way, at most [`FIRST_LOAD_WAIT`]), or gives the core's `check-failed`
    /// verdict when there is none yet. Never panics.
    fn run(&self, phase: Phase<'_>, req: &Request<'_>) -> Verdict {
        let (host, stale) = self.host.current_within(FIRST_LOAD_WAIT);
        let Some(host) = host else {
            let reason = stale.unwrap_or_else(|| "no host topology".into());
            return req.could_not_run(phase, self.defaults(), &reason);
        };
        let checker =
            Checker::new(&host, Some(&self.sysfs), self.defaults()).stale(stale.as_deref());
        checker.check(phase, req)
    }

    /// The verdict of a request of this pod that could not be read (its spec, its
    /// resources, its task): `check-failed`, for the task and the pod.
    fn unread(&self, operation: Operation, task_id: &str, reason: &str) -> Verdict {
        let unread = Unread {
            operation,
            class: None,
            spec: None,
            container_id: Some(task_id),
            sandbox_id: Some(&self.group),
            after_the_fact: false,
        };
        could_not_run(&unread, self.defaults(), reason)
    }

    /// The request about a task of this pod: its spec, the node's Kata configuration (the
    /// core applies the pod's annotations), what the kubelet said.
    fn request<'a>(
        &'a self,
        task_id: &'a str,
        spec: &'a ContainerSpec,
        kubelet: Option<&'a kata_topo_core::input::kubelet::KubeletView>,
    ) -> Request<'a> {
        Request {
            container_id: Some(task_id),
            kata: Some(&self.kata),
            kubelet,
            ..Request::new(spec)
        }
    }

    /// The baseline a running task is held to: the sandbox's for the sandbox, else its
    /// container name's.
    fn baseline_of_task(&self, record: &TaskRecord) -> Option<Baseline> {
        if record.sandbox {
            self.store.baseline(&BaselineOf::Sandbox)
        } else {
            record
                .container_name
                .clone()
                .and_then(|n| self.store.baseline(&BaselineOf::Container(n)))
        }
    }

    /// A spec's baseline against the current topology; `None` before the first load.
    fn baseline_of(&self, spec: &ContainerSpec) -> Option<Baseline> {
        let host = self.host.current().0?;
        let checker = Checker::new(&host, Some(&self.sysfs), self.defaults());
        catch_unwind(AssertUnwindSafe(|| checker.record_baseline(spec))).ok()
    }

    /// Records the baselines of creates accepted before the topology loaded.
    fn record_pending_baselines(&self) {
        let pending = std::mem::take(
            &mut *self
                .pending_baselines
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        for (of, spec) in pending {
            if self.store.baseline(&of).is_none() {
                if let Some(b) = self.baseline_of(&spec) {
                    self.store.save_baseline(of, b);
                }
            }
        }
    }

    /// A task `Create`: the sandbox's, a container's first (records its baseline), or a
    /// recreate of a container name the sandbox already ran (checked against its baseline).
    pub(crate) fn on_create(&self, task_id: &str, bundle: &Path) -> Outcome {
        let started = Instant::now();
        match self.specs.fresh(bundle) {
            Ok(spec) => self.on_create_spec(task_id, bundle, spec, started),
            Err(e) => {
                let v = self.unread(Operation::Create, task_id, &e.to_string());
                self.finish(task_id, v, started, None)
            }
        }
    }

    /// A create whose spec is already read (the NRI front end gets it in the request, the
    /// wrapper from the bundle); `bundle` is where [`SpecCache`] keeps it.
    pub(crate) fn on_create_spec(
        &self,
        task_id: &str,
        bundle: &Path,
        spec: Arc<ContainerSpec>,
        started: Instant,
    ) -> Outcome {
        self.specs.put(bundle, Arc::clone(&spec));
        let sandbox = spec.kind == ContainerKind::Sandbox;
        let name = spec.container_name.clone();
        slog::debug!(self.sinks.log, "create request"; "event" => "create-request",
            "task_id" => task_id, "container_name" => name.clone(),
            "resources" => slog::Serde(spec.resources.clone()),
            "annotations" => slog::Serde(spec.annotations.clone()));
        let of = match (&name, sandbox) {
            (_, true) => Some(BaselineOf::Sandbox),
            (Some(n), false) => Some(BaselineOf::Container(n.clone())),
            (None, false) => None,
        };
        let existing = match &of {
            Some(o @ BaselineOf::Container(_)) => self.store.baseline(o),
            _ => None,
        };
        let phase = match &existing {
            Some(baseline) => Phase::Recreate(baseline),
            None => Phase::Admit,
        };
        // The pod's first create asks the kubelet; its containers' creates use the answer.
        let kubelet = self.kubelet.view(&spec.pod, sandbox);
        // The pod's first create reads its node's labels (the label baseline), a recreate
        // reads them again.
        let node = (sandbox || existing.is_some())
            .then(|| self.node_view(&spec.pod))
            .flatten();
        let request = Request {
            node: node.as_ref(),
            ..self.request(task_id, &spec, kubelet.as_deref())
        };
        let verdict = self.run(phase, &request);
        let baseline = match (existing, of) {
            (None, Some(of)) => Some(Box::new(NewBaseline {
                of,
                baseline: self.baseline_of(&spec),
                spec: Arc::clone(&spec),
            })),
            _ => None,
        };
        let accept = OnAccept::Created {
            task_id: task_id.to_string(),
            record: TaskRecord {
                bundle: bundle.to_path_buf(),
                container_name: name,
                sandbox,
                resources: None,
                pid: None,
            },
            baseline,
        };
        self.finish(task_id, verdict, started, Some(accept))
    }

    /// A task that runs already, as a restarted front end learns of it (NRI's
    /// `Synchronize`): remembered with the resources it runs with and, when its container
    /// name has no baseline yet, that baseline recorded from its spec, as its first create
    /// would have. Not checked: it was accepted before.
    pub(crate) fn adopt(
        &self,
        task_id: &str,
        bundle: &Path,
        spec: Arc<ContainerSpec>,
        resources: Resources,
    ) {
        self.specs.put(bundle, Arc::clone(&spec));
        let sandbox = spec.kind == ContainerKind::Sandbox;
        let of = match (&spec.container_name, sandbox) {
            (_, true) => Some(BaselineOf::Sandbox),
            (Some(n), false) => Some(BaselineOf::Container(n.clone())),
            (None, false) => None,
        };
        let baseline = of.filter(|of| self.store.baseline(of).is_none()).map(|of| {
            Box::new(NewBaseline {
                of,
                baseline: self.baseline_of(&spec),
                spec: Arc::clone(&spec),
            })
        });
        let record = self.store.task(task_id).unwrap_or(TaskRecord {
            bundle: bundle.to_path_buf(),
            container_name: spec.container_name.clone(),
            sandbox,
            resources: None,
            pid: None,
        });
        let record = TaskRecord {
            resources: (resources != spec.resources).then_some(resources),
            ..record
        };
        let accept = OnAccept::Created {
            task_id: task_id.to_string(),
            record,
            baseline,
        };
        self.commit(accept, None);
    }

    /// A task `Update` with the `LinuxResources` JSON containerd sent.
    pub(crate) fn on_update(&self, task_id: &str, resources_json: &[u8]) -> Outcome {
        let started = Instant::now();
        // The whole request only at debug (containerd's `-debug`): what the kubelet and
        // containerd really send, for recording.
        slog::debug!(self.sinks.log, "update request"; "event" => "update-request",
            "task_id" => task_id,
            "resources" => slog::Serde(serde_json::from_slice::<serde_json::Value>(resources_json)
                .unwrap_or_else(|_| String::from_utf8_lossy(resources_json).into())));
        let record = self.store.task(task_id);
        let spec = record.as_ref().map(|r| self.specs.get(&r.bundle));
        let update = Resources::from_json(resources_json);
        let (spec, update, record) = match (spec, update, record) {
            (Some(Ok(spec)), Ok(update), Some(record)) => (spec, update, record),
            (spec, update, _) => {
                let reason = match (spec, update) {
                    (None, _) => format!("task {task_id} was not created through this wrapper"),
                    (Some(Err(e)), _) => e.to_string(),
                    (_, Err(e)) => e.to_string(),
                    _ => "unreadable request".into(),
                };
                let v = self.unread(Operation::Update, task_id, &reason);
                return self.finish(task_id, v, started, None);
            }
        };
        let current = record
            .resources
            .clone()
            .unwrap_or_else(|| spec.resources.clone());
        let baseline = self.baseline_of_task(&record);
        let running = Running {
            current: Some(&current),
            baseline: baseline.as_ref(),
            vm: None,
        };
        // Classified once, here: the core's verdict names the same class.
        let mut change = Update::new(&spec, running, &update);
        // A resize asks the kubelet again and reads the node's labels again; a cpuset push
        // (the CPU manager's reconcile, sent to every shared-pool container at once) is
        // checked against what was kept; the kubelet's retry of a resize (the same request
        // again, while it is pending) against what the first one read (`retries`).
        let resize = change.is_resize();
        let Reads { kubelet, node } = match resize
            .then(|| self.retries.reads_of(task_id, resources_json))
            .flatten()
        {
            Some(first) => first,
            None => {
                let reads = Reads {
                    kubelet: self.kubelet.view(&spec.pod, resize),
                    node: resize.then(|| self.node_view(&spec.pod)).flatten(),
                };
                if resize {
                    self.retries
                        .remember(task_id, resources_json, reads.clone());
                }
                reads
            }
        };
        let request = Request {
            node: node.as_ref(),
            ..self.request(task_id, &spec, kubelet.as_deref())
        };
        // Only static sizing needs the VM's real vCPU count to predict pinning. The count
        // comes from the VMM's vCPU fds: one look, no sampling of its threads (that waits,
        // and the request must not). What the VM really does is reported once the delegate
        // applied the update (`observe`).
        let vm = record
            .pid
            .filter(|_| {
                request
                    .pod_kata()
                    .is_some_and(|k| k.enable_vcpus_pinning && k.static_sandbox_resource_mgmt)
            })
            .and_then(|pid| {
                self.vm_reader()
                    .with_sampling(1, Duration::ZERO)
                    .read(pid)
                    .ok()
            })
            .filter(VmView::is_vmm);
        change.running.vm = vm.as_ref();
        let verdict = self.run(Phase::Update(change), &request);
        let accept = OnAccept::Updated {
            task_id: task_id.to_string(),
            resources: current.merged(&update),
        };
        self.finish(task_id, verdict, started, Some(accept))
    }

    /// What the API server says about the pod's node now (one read, within
    /// `api_timeout_ms`), for the core to check the pod's node affinity against; keeps the
    /// label baseline a first read gives. `None` when the check is off.
    fn node_view(&self, pod: &kata_topo_core::check::verdict::PodRef) -> Option<NodeView> {
        let read = catch_unwind(AssertUnwindSafe(|| self.affinity.read(pod))).ok()?;
        if let Some(b) = read.new_baseline {
            self.store.save_label_baseline(b);
        }
        if let Some(NodeView::Read {
            node,
            baseline: Some(then),
            ..
        }) = &read.view
        {
            self.store.observe_labels(&then.labels, &node.labels);
        }
        read.view
    }

    /// Whether the task is known.
    pub(crate) fn knows(&self, task_id: &str) -> bool {
        self.store.task(task_id).is_some()
    }

    /// A task `Delete` (of the task itself, not an exec).
    pub(crate) fn on_delete(&self, task_id: &str) -> Outcome {
        Outcome::Forward(Some(OnAccept::Deleted {
            task_id: task_id.to_string(),
        }))
    }

    /// The one place every verdict goes — a request's, what the VM view found after one, a
    /// check that could not run: counted (metrics), kept as the latest of its kind (the state
    /// mirror, which `kata-topo status` and node-problem-detector read), and, when it is news,
    /// logged and published.
    fn deliver(&self, of: VerdictOf, verdict: &Verdict, took: Duration) {
        self.sinks.metrics.observe(verdict, took);
        let news = match &of {
            VerdictOf::Request(task) => self.announcer.should_announce(task, verdict),
            VerdictOf::Vm(task) => self
                .announcer
                .should_announce(&format!("{task}/vm"), verdict),
            VerdictOf::Pod => self.announcer.should_announce("@pod", verdict),
        };
        self.store.save_verdict(of, verdict);
        if news {
            log_verdict(&self.sinks.log, verdict);
            self.sinks.events.mismatch(verdict);
            self.pod_events.0.verdict(verdict);
        }
    }

    /// Delivers a request's verdict and decides the request.
    fn finish(
        &self,
        task_id: &str,
        verdict: Verdict,
        started: Instant,
        accept: Option<OnAccept>,
    ) -> Outcome {
        self.deliver(
            VerdictOf::Request(task_id.to_string()),
            &verdict,
            started.elapsed(),
        );
        // At debug only (the wrapper's `-debug`, the NRI plugin's `--debug`): how long the
        // request waited for its check, verdict delivered (`make bench` reads it).
        slog::debug!(self.sinks.log, "request checked"; "event" => "request-checked",
            "operation" => verdict.operation.to_string(), "task_id" => task_id,
            "micros" => started.elapsed().as_micros() as u64);
        if verdict.decision() == Decision::Reject {
            return Outcome::Refuse(ShimError::Rejected(verdict.refusal()));
        }
        Outcome::Forward(accept)
    }

    /// Applies what the delegate accepted. `pid` is the pid a `Create` reply carried.
    pub(crate) fn commit(&self, accept: OnAccept, pid: Option<u32>) {
        match accept {
            OnAccept::Created {
                task_id,
                mut record,
                baseline,
            } => {
                record.pid = pid;
                if let Some(b) = baseline.map(|b| *b) {
                    match b.baseline {
                        Some(baseline) => self.store.save_baseline(b.of, baseline),
                        None => {
                            self.pending_baselines
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .push((b.of, b.spec));
                            // The topology may have loaded since the check.
                            if self.host.current().0.is_some() {
                                self.record_pending_baselines();
                            }
                        }
                    }
                }
                let vmm = (!record.sandbox).then_some(pid).flatten();
                self.store.save_task(&task_id, record);
                if let Some(p) = vmm {
                    self.observer.schedule(&task_id, p);
                }
            }
            OnAccept::Updated { task_id, resources } => {
                if let Some(mut record) = self.store.task(&task_id) {
                    record.resources = Some(resources);
                    let vmm = record.pid;
                    self.store.save_task(&task_id, record);
                    if let Some(p) = vmm {
                        self.observer.schedule(&task_id, p);
                    }
                }
            }
            OnAccept::Deleted { task_id } => {
                let record = self.store.remove_task(&task_id);
                if let Some(r) = &record {
                    self.specs.forget(&r.bundle);
                }
                self.announcer.forget(&task_id);
                self.retries.forget(&task_id);
                self.observer.cancel(&task_id);
                if task_id == self.group || record.is_some_and(|r| r.sandbox) {
                    self.sinks
                        .metrics
                        .remove(Instant::now() + Duration::from_millis(200));
                    self.store.remove_all();
                }
            }
        }
    }

    /// Reads the VM once the delegate has applied a request and reports what the vCPU
    /// threads really do (`vcpu-affinity-drift`, `vcpu-overlap`) as an `update` verdict. A pid
    /// that is not a VMM (runc) is left alone. Runs on the timer thread.
    fn observe(&self, task_id: &str, pid: u32) {
        let Some(record) = self.store.task(task_id) else {
            return;
        };
        let Ok(spec) = self.specs.get(&record.bundle) else {
            return;
        };
        let Ok(view) = self.vm_reader().read(pid) else {
            return;
        };
        if !view.is_vmm() {
            return;
        }
        let started = Instant::now();
        let baseline = self.baseline_of_task(&record);
        // Off the request path, and never a question to the kubelet: what was kept.
        let kubelet = self.kubelet.kept();
        let running = Running {
            current: record.resources.as_ref(),
            baseline: baseline.as_ref(),
            vm: None,
        };
        // After the fact: the core reports the VM's own rules only and refuses nothing.
        let verdict = self.run(
            Phase::Observe(running, &view),
            &self.request(task_id, &spec, kubelet.as_deref()),
        );
        self.deliver(
            VerdictOf::Vm(task_id.to_string()),
            &verdict,
            started.elapsed(),
        );
    }

    /// Reports a check that could not run at all (it panicked): a `check-failed` verdict for
    /// the pod, delivered like any other. The request it belonged to went on unchecked.
    pub(crate) fn report_failure(&self, method: &str, reason: &str) {
        let operation = match method {
            "Update" => Operation::Update,
            _ => Operation::Create,
        };
        // The request went on unchecked: nothing is left to refuse.
        let unread = Unread {
            operation,
            class: None,
            spec: None,
            container_id: None,
            sandbox_id: Some(&self.group),
            after_the_fact: true,
        };
        let v = could_not_run(&unread, self.defaults(), reason);
        self.deliver(VerdictOf::Pod, &v, Duration::ZERO);
    }

    /// What reads this sandbox's VMM: a process is taken for it only when it is root's, runs
    /// the configured hypervisor (Kata's `[hypervisor.*] path`, when there is one) and
    /// belongs to this sandbox — a cgroup naming it, or the delegate among its ancestors.
    fn vm_reader(&self) -> VmReader {
        VmReader::new(&self.config.procfs_root).with_identity(Identity {
            hypervisor: self.kata.hypervisor_path.clone(),
            sandbox_id: Some(self.group.clone()),
            shim_pid: self.delegate_pid.get().copied(),
            ..Identity::default()
        })
    }

    /// Records who serves the pod: this daemon, and the delegate (its pid as the delegate
    /// reported it, when it did).
    pub(crate) fn record_daemon(&self, delegate_address: &str, delegate_pid: Option<u32>) {
        if let Some(pid) = delegate_pid {
            let _ = self.delegate_pid.set(pid);
        }
        let procfs = &self.config.procfs_root;
        let Some(wrapper) = ProcessId::current(procfs) else {
            return;
        };
        self.store.save_daemon(DaemonRecord {
            wrapper,
            delegate_address: delegate_address.to_string(),
            delegate: delegate_pid.and_then(|p| ProcessId::of(procfs, p)),
            config: self.origin.0.clone(),
            config_source: self.origin.1.as_str().to_string(),
            node_affinity: Some(self.affinity.describe()),
            pod_events: Some(self.pod_events.1.clone()),
        });
    }

    /// The containerd namespace of the pod.
    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pod is gone (its delegate exited): its metrics and state go, within `deadline`.
    pub(crate) fn forget(&self, deadline: Instant) {
        self.sinks.metrics.remove(deadline);
        self.store.remove_all();
        self.store.persist().flush(deadline);
    }

    /// Waits (until `deadline`) for the state mirror to catch up.
    pub(crate) fn flush_state(&self, deadline: Instant) -> bool {
        self.store.persist().flush(deadline)
    }

    /// Where the pod's state lives.
    #[cfg(test)]
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.store
            .dir()
            .map(Path::to_path_buf)
            .expect("the pod's state is mirrored")
    }
}

#[cfg(any(test, feature = "testing"))]
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) mod testing;
#[cfg(test)]
mod tests {
    use super::testing::{pod, pod_configured, pod_with, write_bundle, TestPod};
    use super::*;
    use kata_topo_core::testutil::GPU;
    use kata_topo_core::Rule;
    use kata_topo_proto::wire::Code;

    const CROSS: &str = r#"{"cpu":{"cpus":"0","quota":100000,"period":100000}}"#;

    /// The pods of one node (the NRI plugin's) share its topology and its state writer; each
    /// keeps its own state, removed on its own; the node forgets a pod once it is dropped.
    #[test]
    fn pods_on_one_node_share_its_topology_and_keep_their_own_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let config = Config::parse(
            &format!(
                "[topology_guard]\ntopology_xml = \"{}\"\nstate_dir = \"{}\"\nlog_file = \"{}\"\nkubeconfig = \"\"\nintent_source = \"annotations\"\n",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
                dir.path().join("state").display(),
                dir.path().join("kt.log").display(),
            ),
            Path::new("test.toml"),
        )
        .expect("config");
        let drops = Drops::new();
        let log = kata_topo_sinks::Log::with_journal(&config.log_file, false, None, drops.clone());
        let node = Node::new(&config, log.logger().clone(), drops.clone());
        node.refresh();
        let on_node = |group: &str| {
            let outputs = Outputs {
                log: log.logger().clone(),
                events: Events::off(),
                metrics: Metrics::off(),
                drops: drops.clone(),
            };
            Pod::on_node(
                &node,
                Arc::new(config.clone()),
                (None, ConfigSource::Defaults),
                Arc::new(KataConfig::default()),
                "k8s.io",
                group,
                outputs,
                false,
            )
        };
        let (a, b) = (on_node("sb-a"), on_node("sb-b"));
        assert!(Arc::ptr_eq(&a.host, &node.host) && Arc::ptr_eq(&b.host, &node.host));
        assert!(a.host.current().0.is_some(), "the node loaded it for both");
        assert_eq!(node.pods(), 2);
        let record = TaskRecord {
            bundle: PathBuf::from("nri/c1"),
            container_name: Some("app".into()),
            sandbox: false,
            resources: None,
            pid: None,
        };
        for p in [&a, &b] {
            p.store.save_task("c1", record.clone());
        }
        let deadline = || Instant::now() + Duration::from_secs(10);
        assert!(a.flush_state(deadline()) && b.flush_state(deadline()));
        let (a_dir, b_dir) = (a.state_dir(), b.state_dir());
        assert_ne!(a_dir, b_dir);
        assert!(kata_topo_core::state::read_pod(&a_dir)
            .expect("a's state")
            .is_some_and(|p| p.tasks.iter().any(|(id, _)| id == "c1")));
        a.forget(deadline());
        assert!(!a_dir.exists(), "a's state removed");
        b.store.save_task("c2", record);
        assert!(b.flush_state(deadline()));
        let kept = kata_topo_core::state::read_pod(&b_dir)
            .expect("b's state")
            .expect("b's pod");
        assert_eq!(kept.tasks.len(), 2, "b's state still written");
        drop(a);
        assert_eq!(node.pods(), 1);
        node.prune();
        assert_eq!(
            node.pods.lock().expect("pods").len(),
            1,
            "a dropped pod is let go of at once"
        );
        // A refresh reaches the pods still there, and only those.
        node.refresh();
        assert!(b.host.current().0.is_some());
    }

    #[test]
    fn repeated_identical_findings_are_announced_once() {
        let p = pod("audit");
        p.create();
        assert_eq!(p.finding_lines(), 0);
        p.update(CROSS);
        let first = p.finding_lines();
        assert_eq!(first, 2, "cpu-outside-intent and vfio-remote");
        // The reconcile loop pushes the same cpuset: a noop with the same findings.
        p.update(CROSS);
        p.update(CROSS);
        assert_eq!(p.finding_lines(), first);
        // Back on node 1: clean, re-arms; crossing again is announced again.
        p.update(r#"{"cpu":{"cpus":"1"}}"#);
        assert_eq!(p.finding_lines(), first);
        p.update(CROSS);
        assert_eq!(p.finding_lines(), first * 2);
        // The latest verdict is kept for `kata-topo status`.
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        let kept = p.pod.state_dir().join("verdicts/c1.json");
        let v: Verdict =
            serde_json::from_slice(&std::fs::read(kept).expect("verdict")).expect("json");
        assert_eq!(v.findings.len(), 2);
    }

    #[test]
    fn enforce_refuses_with_failed_precondition_naming_rule_and_pod() {
        let p = pod("enforce");
        p.create();
        match p.update(r#"{"cpu":{"cpus":"0"}}"#) {
            Outcome::Refuse(e) => {
                assert_eq!(e.code(), Code::FailedPrecondition);
                let m = e.to_string();
                assert!(
                    m.contains("vfio-remote") && m.contains("ns/pod") && m.contains("expected"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        }
        // The refused update was not committed: the task still has its create-time resources.
        let record = p.pod.store.task("c1").expect("task");
        assert_eq!(record.resources, None);
        assert_eq!(record.pid, Some(7));
        assert!(matches!(
            p.update(r#"{"cpu":{"quota":200000}}"#),
            Outcome::Forward(_)
        ));
    }

    #[test]
    fn unknown_tasks_and_malformed_updates_are_check_failed_not_refused() {
        let p = pod("enforce");
        assert!(matches!(
            p.pod.on_update("nobody", b"{}"),
            Outcome::Forward(None)
        ));
        p.create();
        assert!(matches!(
            p.pod.on_update("c1", b"{not json"),
            Outcome::Forward(None)
        ));
        let lines = p.lines();
        assert!(
            lines.iter().any(|l| l["rule"] == "check-failed"
                && l["msg"]
                    .as_str()
                    .is_some_and(|m| m.contains("was not created through this wrapper"))),
            "{lines:#?}"
        );
    }

    #[test]
    fn sandbox_delete_removes_the_pod_state() {
        let p = pod("audit");
        p.create();
        assert!(p
            .pod
            .store
            .baseline(&BaselineOf::Container("app".into()))
            .is_some());
        if let Outcome::Forward(Some(accept)) = p.pod.on_delete("c1") {
            p.pod.commit(accept, None);
        }
        assert!(p.pod.store.task("c1").is_none());
        assert!(
            p.pod
                .store
                .baseline(&BaselineOf::Container("app".into()))
                .is_some(),
            "kept for a recreate"
        );
        if let Outcome::Forward(Some(accept)) = p.pod.on_delete("sb1") {
            p.pod.commit(accept, None);
        }
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        assert!(!p.pod.state_dir().exists());
    }

    /// Task records and baselines live in memory: a state directory that cannot be written (a
    /// full disk) costs the mirror, never a decision.
    #[test]
    fn a_state_dir_that_cannot_be_written_changes_no_decision() {
        let outside = tempfile::tempdir().expect("tempdir");
        // A file where the state directory should be: nothing can be created under it.
        let blocked = outside.path().join("state");
        std::fs::write(&blocked, "not a directory").expect("block");
        let p = pod_with("enforce", Some(&blocked.join("sub")), true);
        p.create();
        match p.update(CROSS) {
            Outcome::Refuse(e) => assert_eq!(e.code(), Code::FailedPrecondition),
            other => panic!("enforce must still refuse: {other:?}"),
        }
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        let lines = p.lines();
        assert!(
            lines.iter().any(|l| l["event"] == "state-failed"),
            "the failed writes are reported: {lines:#?}"
        );
        assert!(p.pod.sinks.drops.get(kata_topo_sinks::Sink::State) > 0);
    }

    /// A create that arrives before the topology loaded (and with no load under way, which a
    /// check would wait for, a bounded time) is forwarded at once, reported as not checked, and
    /// its baseline is recorded once the topology is there.
    #[test]
    fn a_create_before_the_topology_is_forwarded_and_recorded_later() {
        let p = pod_with("enforce", None, false);
        match p.pod.on_create("c1", &p.dir.path().join("bundle")) {
            Outcome::Forward(Some(accept)) => p.pod.commit(accept, Some(7)),
            other => panic!("forwarded: {other:?}"),
        }
        let lines = p.lines();
        assert!(
            lines.iter().any(|l| l["rule"] == "check-failed"
                && l["msg"]
                    .as_str()
                    .is_some_and(|m| m.contains("still loading"))),
            "{lines:#?}"
        );
        let app = BaselineOf::Container("app".into());
        assert!(p.pod.store.baseline(&app).is_none());
        p.pod.refresh();
        let b = p.pod.store.baseline(&app).expect("recorded after the load");
        assert_eq!(b.cpus.map(|c| c.to_string()).as_deref(), Some("1"));
        // From now on the pod is checked against it.
        assert!(matches!(p.update(CROSS), Outcome::Refuse(_)));
    }

    /// A stream of updates keeps at most one look at the VM pending per task.
    #[test]
    fn vm_looks_are_coalesced_per_task() {
        let p = pod("audit");
        p.create();
        for _ in 0..1000 {
            p.update(r#"{"cpu":{"quota":100000}}"#);
        }
        assert!(p.pod.observer.pending() <= 1);
    }

    /// An audit pod (with a metrics textfile, with `metrics`) whose procfs root holds a copy of the
    /// recorded QEMU (pid 17832), daemonized as Kata starts it (its parent is init): it is the
    /// sandbox `sb1`'s by its cgroup, which Kata names after the sandbox (the recording has none:
    /// it is added here). The copy lives as long as the directory returned.
    fn with_recorded_qemu(metrics: bool) -> (tempfile::TempDir, TestPod) {
        let recorded = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../core/tests/fixtures/vmm/qemu-kvm/proc"
        );
        let tree = tempfile::tempdir().expect("tempdir");
        let copied = std::process::Command::new("cp")
            .args(["-a", recorded])
            .arg(tree.path())
            .status()
            .expect("cp");
        assert!(copied.success());
        let procfs = tree.path().join("proc");
        std::fs::write(procfs.join("17832/cgroup"), "0::/kata_overhead/sb1\n").expect("cgroup");
        let pod = pod_configured(
            "audit",
            None,
            true,
            &format!("procfs_root = \"{}\"\n", procfs.display()),
            metrics,
        );
        (tree, pod)
    }

    /// What the VM view finds after the delegate applied a request goes where every other verdict
    /// goes: counted, logged, and kept for `kata-topo status` (and so for node-problem-detector's
    /// custom plugin) beside the verdict of the request itself, which it does not replace.
    #[test]
    fn the_vm_observation_is_kept_counted_and_logged_like_every_verdict() {
        // A recorded QEMU whose vCPU threads may run on CPUs 0-1; the pod is on node 1 (CPU 1).
        let (_tree, p) = with_recorded_qemu(true);
        match p.pod.on_create("c1", &p.dir.path().join("bundle")) {
            Outcome::Forward(Some(accept)) => p.pod.commit(accept, Some(17832)),
            other => panic!("create: {other:?}"),
        }
        let logged = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            p.lines().iter().any(|l| l["rule"] == "vcpu-affinity-drift")
        });
        assert!(logged, "{:#?}", p.lines());
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        let pods = kata_topo_core::state::list(
            p.pod
                .state_dir()
                .parent()
                .and_then(Path::parent)
                .expect("state_dir"),
        )
        .expect("state");
        assert_eq!(pods.len(), 1);
        let rules: Vec<(String, Rule)> = pods[0]
            .verdicts
            .iter()
            .flat_map(|(task, v)| v.findings.iter().map(move |f| (task.clone(), f.rule)))
            .collect();
        assert!(
            rules
                .iter()
                .any(|(task, rule)| task.starts_with("c1") && *rule == Rule::VcpuAffinityDrift),
            "kept for kata-topo status: {rules:?}"
        );
        // The create's own verdict is still there: the observation is kept beside it.
        assert!(
            pods[0]
                .verdicts
                .iter()
                .any(|(task, v)| task == "c1" && v.operation == Operation::Create),
            "{:?}",
            pods[0].verdicts
        );
        let counted = (0..50).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            p.metrics()
                .contains("rule=\"vcpu-affinity-drift\",severity=\"error\"} 1")
        });
        assert!(counted, "{}", p.metrics());
    }

    /// The VM view after an update of the sandbox holds the sandbox to its own baseline, as the
    /// update's check does: the observation once read only container baselines, so a sandbox's
    /// vCPUs floating off the nodes it was admitted on went unreported.
    #[test]
    fn the_sandboxs_vm_observation_holds_it_to_the_sandboxs_baseline() {
        // The recorded QEMU may run its vCPU threads on CPUs 0-1 (nodes 0 and 1).
        let (_tree, p) = with_recorded_qemu(false);
        // The sandbox, on CPU 1 (node 1), with no annotation naming nodes: its baseline does.
        let bundle = p.dir.path().join("sandbox");
        write_bundle(
            &bundle,
            serde_json::json!({
                "io.kubernetes.cri.container-type": "sandbox",
                "io.kubernetes.cri.sandbox-id": "sb1",
                "io.kubernetes.cri.sandbox-name": "pod",
                "io.kubernetes.cri.sandbox-namespace": "ns"
            }),
            serde_json::json!({"resources": {"cpu": {"cpus": "1"}}}),
        );
        match p.pod.on_create("sb1", &bundle) {
            Outcome::Forward(Some(accept)) => p.pod.commit(accept, Some(17832)),
            other => panic!("create: {other:?}"),
        }
        match p
            .pod
            .on_update("sb1", br#"{"cpu": {"quota": 200000, "period": 100000}}"#)
        {
            Outcome::Forward(Some(accept)) => p.pod.commit(accept, None),
            other => panic!("update: {other:?}"),
        }
        let drift = |l: &serde_json::Value| {
            l["rule"] == "vcpu-affinity-drift" && l["container_id"] == "sb1"
        };
        let logged = (0..100).any(|_| {
            std::thread::sleep(Duration::from_millis(100));
            p.lines().iter().any(drift)
        });
        assert!(logged, "{:#?}", p.lines());
        let line = p.lines().into_iter().find(drift).expect("logged");
        assert_eq!(line["intent_source"], "baseline", "{line:#}");
    }

    /// A state directory someone else could have written (another owner, group or others may
    /// write it, or a symbolic link on its path) is never used: nothing planted there is read,
    /// nothing is written there, the checks run from memory and the log says why.
    #[test]
    fn an_untrusted_state_dir_is_never_used_and_the_log_says_why() {
        use std::os::unix::fs::PermissionsExt;
        for case in [
            "writable by others",
            "another owner",
            "a symlink on its path",
        ] {
            let outside = tempfile::tempdir().expect("tempdir");
            let real = outside.path().join("real");
            std::fs::create_dir(&real).expect("dir");
            let state = real.join("state");
            std::fs::create_dir(&state).expect("state");
            std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o700))
                .expect("chmod");
            // A planted baseline on node 0: were it believed, the push to CPU 0 would be clean.
            let planted = state.join("k8s.io/sb1/containers");
            std::fs::create_dir_all(&planted).expect("plant");
            std::fs::write(
                planted.join("app.json"),
                serde_json::json!({
                    "version": 1, "sandbox_id": "sb1", "container_name": "app", "cpus": "0",
                    "mems": null, "cpu_nodes": "0", "devices": [], "topology_fingerprint": ""
                })
                .to_string(),
            )
            .expect("plant");
            let (configured, why) = match case {
                "writable by others" => {
                    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777))
                        .expect("chmod");
                    (state.clone(), "0777")
                }
                "another owner" => {
                    std::os::unix::fs::chown(&state, Some(65534), None).expect("chown");
                    (state.clone(), "uid 65534")
                }
                _ => {
                    std::os::unix::fs::symlink(&real, outside.path().join("link")).expect("link");
                    (outside.path().join("link/state"), "symbolic link")
                }
            };
            let before = files_under(&state);
            let p = pod_with("enforce", Some(&configured), true);
            p.create();
            let app = p
                .pod
                .store
                .baseline(&BaselineOf::Container("app".into()))
                .expect("a baseline");
            assert_eq!(
                app.cpus.map(|c| c.to_string()).as_deref(),
                Some("1"),
                "{case}: the planted baseline was read"
            );
            assert!(
                matches!(p.update(CROSS), Outcome::Refuse(_)),
                "{case}: the planted baseline was believed"
            );
            assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
            assert_eq!(files_under(&state), before, "{case}: written into");
            let lines = p.lines();
            let said = lines.iter().find(|l| l["event"] == "state-untrusted");
            let said =
                said.unwrap_or_else(|| panic!("{case}: no state-untrusted line: {lines:#?}"));
            let error = said["error"].as_str().unwrap_or_default();
            assert!(error.contains(why), "{case}: {error}");
        }
    }

    /// Every file and directory under `dir`, with its size.
    fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
        let mut out = Vec::new();
        let mut todo = vec![dir.to_path_buf()];
        while let Some(d) = todo.pop() {
            for e in std::fs::read_dir(&d).expect("list").flatten() {
                let meta = std::fs::symlink_metadata(e.path()).expect("meta");
                if meta.is_dir() {
                    todo.push(e.path());
                }
                out.push((e.path(), meta.len()));
            }
        }
        out.sort();
        out
    }

    /// The node's `mode = "enforce"` is not the pod's to switch off: a pod annotated
    /// `kata-topo.io/mode: audit` and `kata-topo.io/policy: none` still has its cross-node push
    /// refused, and the log names each ignored annotation.
    #[test]
    fn a_pod_annotation_cannot_switch_the_nodes_enforcement_off() {
        let p = pod("enforce");
        let config = p.dir.path().join("bundle/config.json");
        let mut spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&config).expect("spec")).expect("json");
        spec["annotations"]["kata-topo.io/mode"] = "audit".into();
        spec["annotations"]["kata-topo.io/policy"] = "none".into();
        std::fs::write(&config, spec.to_string()).expect("spec");
        p.create();
        match p.update(CROSS) {
            Outcome::Refuse(e) => assert_eq!(e.code(), Code::FailedPrecondition),
            other => panic!("the pod switched enforcement off: {other:?}"),
        }
        let lines = p.lines();
        for annotation in ["kata-topo.io/mode", "kata-topo.io/policy"] {
            assert!(
                lines.iter().any(|l| l["rule"] == "override-ignored"
                    && l["observed"]["annotation"] == annotation
                    && l["decision"] == "reject"),
                "{annotation}: {lines:#?}"
            );
        }
    }

    /// A kubelet that accepts and never answers costs a create and a resize the deadline and no
    /// more; each is checked against the annotations, with a `kubelet-intent-unavailable` warning
    /// saying why, and a cpuset push does not ask again.
    #[test]
    fn a_hung_kubelet_costs_the_deadline_and_a_warning() {
        let sockets = tempfile::tempdir().expect("tempdir");
        let socket = sockets.path().join("kubelet.sock");
        // Listening, never accepting: connections wait in the backlog, no answer comes.
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let kubelet_config = sockets.path().join("config.yaml");
        std::fs::write(&kubelet_config, "topologyManagerPolicy: restricted\n").expect("config");
        let p = pod_configured(
            "audit",
            None,
            true,
            &format!(
                "intent_source = \"kubelet\"\nkubelet_pod_resources_socket = \"{}\"\n\
             kubelet_config = \"{}\"\nkubelet_timeout_ms = 100\n",
                socket.display(),
                kubelet_config.display()
            ),
            false,
        );
        let why = "did not answer within 100 ms";
        let started = Instant::now();
        p.create();
        let create = started.elapsed();
        let resize = r#"{"cpu":{"cpus":"1","quota":200000,"period":100000}}"#;
        let started = Instant::now();
        assert!(matches!(p.update(resize), Outcome::Forward(_)));
        let update = started.elapsed();
        for took in [create, update] {
            assert!(took < Duration::from_millis(600), "{took:?}");
        }
        assert!(create >= Duration::from_millis(100), "{create:?}");
        // The CPU manager's push: only the cpuset changes (to node 0, across the pod's intent).
        let started = Instant::now();
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"0"}}"#),
            Outcome::Forward(_)
        ));
        let push = started.elapsed();
        let lines = p.lines();
        let unavailable: Vec<_> = lines
            .iter()
            .filter(|l| l["rule"] == "kubelet-intent-unavailable")
            .collect();
        assert!(!unavailable.is_empty(), "{lines:#?}");
        for l in &unavailable {
            assert_eq!(l["severity"], "warning");
            assert_eq!(l["intent_source"], "annotations");
            assert!(l["msg"].as_str().is_some_and(|m| m.contains(why)), "{l}");
        }
        // The cross-node push is still caught, against the pod's annotation.
        assert!(
            lines
                .iter()
                .any(|l| l["rule"] == "cpu-outside-intent" && l["intent_source"] == "annotations"),
            "{lines:#?}"
        );
        // The push asked nothing: no deadline spent on it.
        assert!(push < Duration::from_millis(100), "{push:?}");
    }

    /// With a kubelet that answers, the pod's intent is what it admitted: every line says
    /// `intent_source: kubelet` with the kubelet's report nested; a cpuset push off the exclusive
    /// CPUs is `kubelet-cpus-mismatch`. The kubelet is asked once at the create, not at the push,
    /// and again at a resize.
    #[test]
    fn the_kubelet_is_the_intent_and_is_asked_at_creates_and_resizes_only() {
        use kata_topo_kubelet::fake::FakeKubelet;
        use kata_topo_kubelet::v1;
        let gpu_node_1 = v1::TopologyInfo {
            nodes: vec![v1::NumaNode { id: 1 }],
        };
        let kubelet = FakeKubelet::answering(v1::PodResources {
            name: "pod".into(),
            namespace: "ns".into(),
            containers: vec![v1::ContainerResources {
                name: "app".into(),
                cpu_ids: vec![1],
                devices: vec![v1::ContainerDevices {
                    resource_name: "kata-topo.io/vfio".into(),
                    device_ids: vec![GPU.into()],
                    topology: Some(gpu_node_1),
                }],
                ..Default::default()
            }],
        });
        let kubelet_config = kubelet.dir().join("config.yaml");
        std::fs::write(
            &kubelet_config,
            "cpuManagerPolicy: static\ntopologyManagerPolicy: restricted\n",
        )
        .expect("config");
        let p = pod_configured(
            "audit",
            None,
            true,
            &format!(
                "kubelet_pod_resources_socket = \"{}\"\nkubelet_config = \"{}\"\n",
                kubelet.socket().display(),
                kubelet_config.display()
            ),
            false,
        );
        p.create();
        assert_eq!(kubelet.calls(), 1);
        // The CPU manager's push to node 0: checked against the answer kept.
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"0"}}"#),
            Outcome::Forward(_)
        ));
        assert_eq!(kubelet.calls(), 1, "a cpuset push asks nothing");
        let lines = p.lines();
        let mismatch = lines
            .iter()
            .find(|l| l["rule"] == "kubelet-cpus-mismatch")
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert_eq!(mismatch["severity"], "error");
        assert_eq!(mismatch["intent_source"], "kubelet");
        assert_eq!(mismatch["kubelet"]["cpus"], "1");
        assert_eq!(mismatch["kubelet"]["topology_manager_policy"], "restricted");
        assert_eq!(mismatch["expected"]["cpus"], "1");
        assert!(lines
            .iter()
            .filter(|l| l["event"] == "finding")
            .all(|l| l["intent_source"] == "kubelet"));
        // A resize asks again.
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"1","quota":200000,"period":100000}}"#),
            Outcome::Forward(_)
        ));
        assert_eq!(kubelet.calls(), 2);
    }

    /// A fake API server with node `worker-1` (its labels as `labels` holds them, changeable) and
    /// pod `ns/pod` requiring `nic In [mlx5]` and `cores Gt 1`, owned by ReplicaSet `pod-rs`;
    /// `hang` makes it accept and never answer.
    struct ApiServer {
        server: kata_topo_apiserver::fake::FakeApiServer,
        labels: Arc<Mutex<serde_json::Value>>,
        hang: Arc<std::sync::atomic::AtomicBool>,
    }

    impl ApiServer {
        fn start() -> Self {
            use kata_topo_apiserver::fake::{FakeApiServer, Reply};
            let labels = Arc::new(Mutex::new(serde_json::json!({"nic": "mlx5", "cores": "2"})));
            let hang = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let (l, h) = (Arc::clone(&labels), Arc::clone(&hang));
            let server = FakeApiServer::start_with_bodies(move |line, body| {
                if h.load(std::sync::atomic::Ordering::SeqCst) {
                    return Reply::Hang;
                }
                // The pod's Events: written, answered as the API server does.
                if line.starts_with("POST /api/v1/namespaces/ns/events ") {
                    let name = serde_json::from_slice::<serde_json::Value>(body)
                        .map(|v| v["metadata"]["name"].clone())
                        .unwrap_or_default();
                    return Reply::Answer {
                        status: 201,
                        body: serde_json::json!({"kind": "Event", "metadata": {"name": name}})
                            .to_string(),
                        chunked: false,
                    };
                }
                if line.starts_with("GET /api/v1/nodes/worker-1 ") {
                    let labels = l.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    Reply::ok(
                        serde_json::json!({"kind": "PartialObjectMetadata",
                        "metadata": {"name": "worker-1", "labels": labels}})
                        .to_string(),
                    )
                } else if line.starts_with("GET /api/v1/namespaces/ns/pods/pod ") {
                    Reply::ok(
                    serde_json::json!({"kind": "Pod", "metadata": {"name": "pod", "namespace": "ns",
                        "uid": "uid-1", "ownerReferences": [{"kind": "ReplicaSet", "name": "pod-rs", "controller": true}]},
                      "spec": {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                        {"nodeSelectorTerms": [{"matchExpressions": [
                          {"key": "nic", "operator": "In", "values": ["mlx5"]},
                          {"key": "cores", "operator": "Gt", "values": ["1"]}]}]}}}}})
                    .to_string(),
                )
                } else {
                    Reply::status(404, "not found")
                }
            });
            Self {
                server,
                labels,
                hang,
            }
        }

        fn config(&self) -> String {
            format!(
                "kubeconfig = \"{}\"\nnode_name = \"worker-1\"\napi_timeout_ms = 1000\n",
                self.server.kubeconfig().display()
            )
        }

        fn label(&self, key: &str, value: &str) {
            self.labels.lock().unwrap_or_else(|e| e.into_inner())[key] = value.into();
        }

        /// The reads so far (the pod's Events are written besides).
        fn gets(&self) -> usize {
            self.server
                .requests()
                .iter()
                .filter(|l| l.starts_with("GET "))
                .count()
        }

        /// The Events written so far, as posted.
        fn events(&self) -> Vec<serde_json::Value> {
            self.server
                .exchanges()
                .iter()
                .filter(|e| e.line.starts_with("POST "))
                .filter_map(|e| serde_json::from_slice(&e.body).ok())
                .collect()
        }
    }

    const RESIZE: &str = r#"{"cpu":{"cpus":"1","quota":200000,"period":100000}}"#;

    /// The pod's first create reads the pod and its node (the label baseline); a container's first
    /// create and a cpuset push read nothing; each resize reads the node once. A label the pod's
    /// affinity names changed but still holding is `node-labels-changed`; the node relabelled so
    /// the required term fails is `node-affinity-violated`, naming the pod's owner, with the term
    /// and the labels as nested JSON, let through in audit mode.
    #[test]
    fn node_affinity_is_read_at_the_first_create_and_each_resize() {
        let api = ApiServer::start();
        let p = pod_configured("audit", None, true, &api.config(), false);
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        assert_eq!(
            api.gets(),
            2,
            "the pod and its node: {:?}",
            api.server.requests()
        );
        p.create();
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"1"}}"#),
            Outcome::Forward(_)
        ));
        assert_eq!(
            api.gets(),
            2,
            "a container's create and a cpuset push read nothing"
        );
        // Still holding: a warning only.
        api.label("cores", "4");
        assert!(matches!(p.update(RESIZE), Outcome::Forward(_)));
        assert_eq!(api.gets(), 3, "a resize reads the node, not the pod again");
        let lines = p.lines();
        let changed: Vec<_> = lines
            .iter()
            .filter(|l| l["rule"] == "node-labels-changed")
            .collect();
        assert_eq!(changed.len(), 1, "{lines:#?}");
        assert_eq!(changed[0]["severity"], "warning");
        assert_eq!(changed[0]["expected"]["labels"]["cores"], "2");
        assert_eq!(changed[0]["observed"]["labels"]["cores"], "4");
        assert!(!lines.iter().any(|l| l["rule"] == "node-affinity-violated"));
        // Relabelled: violated, reported, let through in audit mode.
        api.label("nic", "e810");
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"1","quota":300000,"period":100000}}"#),
            Outcome::Forward(_)
        ));
        assert_eq!(api.gets(), 4);
        let lines = p.lines();
        let violated = lines
            .iter()
            .find(|l| l["rule"] == "node-affinity-violated")
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert_eq!(violated["severity"], "error");
        assert_eq!(violated["decision"], "allow");
        assert_eq!(violated["observed"]["labels"]["nic"], "e810");
        assert_eq!(
            violated["expected"]["requiredDuringSchedulingIgnoredDuringExecution"]
                ["nodeSelectorTerms"][0]["matchExpressions"][0]["key"],
            "nic"
        );
        assert!(
            violated["msg"]
                .as_str()
                .is_some_and(|m| m.contains("ReplicaSet pod-rs")),
            "{violated}"
        );
        // The label baseline is in the pod's state, for a daemon started again.
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        let kept: kata_topo_core::input::affinity::LabelBaseline = serde_json::from_slice(
            &std::fs::read(p.pod.state_dir().join("node-labels.json")).expect("kept"),
        )
        .expect("baseline");
        assert_eq!(kept.node.labels["cores"], "2");
        assert_eq!(kept.pod.owner.expect("owner").name, "pod-rs");
        // And the labels seen changed since, each with when it was first seen (for diagnose).
        let seen: kata_topo_core::state::LabelsSeen = serde_json::from_slice(
            &std::fs::read(p.pod.state_dir().join("node-labels-seen.json")).expect("kept"),
        )
        .expect("labels seen");
        assert_eq!(
            seen.changes.keys().collect::<Vec<_>>(),
            ["cores", "nic"],
            "{seen:?}"
        );
        assert_eq!(seen.changes["nic"].from.as_deref(), Some("mlx5"));
        assert_eq!(seen.changes["nic"].to.as_deref(), Some("e810"));
        assert!(seen.changes["cores"].first_seen <= seen.changes["nic"].first_seen);
    }

    /// The kubelet retries a refused resize about once a second: each retry of the same
    /// request is answered from what the first read (one question to the kubelet, one read of
    /// the node, for any number of retries), and refused the same; another resize reads again.
    #[test]
    fn a_retried_resize_is_answered_from_the_first_ones_reads() {
        use kata_topo_kubelet::fake::FakeKubelet;
        use kata_topo_kubelet::v1;
        let api = ApiServer::start();
        let kubelet = FakeKubelet::answering(v1::PodResources {
            name: "pod".into(),
            namespace: "ns".into(),
            containers: vec![v1::ContainerResources {
                name: "app".into(),
                cpu_ids: vec![1],
                ..Default::default()
            }],
        });
        let kubelet_config = kubelet.dir().join("config.yaml");
        std::fs::write(&kubelet_config, "cpuManagerPolicy: static\n").expect("config");
        let p = pod_configured(
            "enforce",
            None,
            true,
            &format!(
                "{}kubelet_pod_resources_socket = \"{}\"\nkubelet_config = \"{}\"\n",
                api.config(),
                kubelet.socket().display(),
                kubelet_config.display()
            ),
            false,
        );
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.create();
        let (asked, read) = (kubelet.calls(), api.gets());
        api.label("nic", "e810");
        for _ in 0..5 {
            assert!(matches!(p.update(RESIZE), Outcome::Refuse(_)));
        }
        assert_eq!(
            kubelet.calls(),
            asked + 1,
            "one question for the resize and its retries"
        );
        assert_eq!(api.gets(), read + 1, "one read of the node");
        // Another resize is another request: it asks and reads again.
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"1","quota":300000,"period":100000}}"#),
            Outcome::Refuse(_)
        ));
        assert_eq!(kubelet.calls(), asked + 2);
        assert_eq!(api.gets(), read + 2);
    }

    /// Each announced `error` is a `Warning` Event on the pod, and the listed warning
    /// (`node-labels-changed`) a `Normal` one: the kubelet retrying the refused resize is one
    /// announcement, one Event.
    #[test]
    fn the_pods_findings_are_events_on_it_once_per_announcement() {
        let api = ApiServer::start();
        let p = pod_configured("enforce", None, true, &api.config(), false);
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.create();
        api.label("cores", "4");
        assert!(matches!(p.update(RESIZE), Outcome::Forward(_)));
        api.label("nic", "e810");
        for _ in 0..20 {
            assert!(matches!(
                p.update(r#"{"cpu":{"cpus":"1","quota":300000,"period":100000}}"#),
                Outcome::Refuse(_)
            ));
        }
        assert!(p
            .pod
            .pod_events
            .0
            .flush(Instant::now() + Duration::from_secs(30)));
        let events = api.events();
        let summary: Vec<(String, String)> = events
            .iter()
            .map(|e| {
                (
                    e["type"].as_str().unwrap_or_default().to_string(),
                    e["reason"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            vec![
                ("Normal".to_string(), "NodeLabelsChanged".to_string()),
                ("Warning".to_string(), "NodeAffinityViolated".to_string()),
            ],
            "{events:#?}"
        );
        let refused = &events[1];
        assert_eq!(
            refused["involvedObject"],
            serde_json::json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ns", "name": "pod"})
        );
        assert_eq!(refused["reportingComponent"], "kata-topo");
        assert_eq!(refused["reportingInstance"], "worker-1");
        assert_eq!(refused["source"]["host"], "worker-1");
        assert_eq!(refused["count"], 1);
        let message = refused["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("Refused the resize of container app: ")
                && message.contains("ReplicaSet pod-rs"),
            "{message}"
        );
        // The daemon's record says the Events are on, for `kata-topo status`.
        assert!(
            p.pod.pod_events.1.starts_with("on: as node worker-1"),
            "{}",
            p.pod.pod_events.1
        );
    }

    /// Without a kubeconfig no Event is written, and the record says why.
    #[test]
    fn without_a_kubeconfig_the_pods_events_are_off() {
        let p = pod_with("enforce", None, true);
        assert_eq!(
            p.pod.pod_events.1,
            "off: kubeconfig is set to \"\" in [topology_guard]"
        );
    }

    /// In enforce mode a recreate and a resize on a node that no longer fits the pod are refused,
    /// naming the rule and the pod; a wrapper daemon started again for the pod keeps the label
    /// baseline and reads only the node.
    #[test]
    fn enforce_refuses_a_resize_on_a_node_that_no_longer_fits() {
        let api = ApiServer::start();
        let state = tempfile::tempdir().expect("tempdir");
        let p = pod_configured("enforce", Some(state.path()), true, &api.config(), false);
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.create();
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        api.label("nic", "e810");
        // Another daemon for the same pod (the wrapper restarted).
        let again = pod_configured("enforce", Some(state.path()), true, &api.config(), false);
        let refused = |outcome: Outcome, what: &str| match outcome {
            Outcome::Refuse(e) => {
                assert_eq!(e.code(), Code::FailedPrecondition);
                let m = e.to_string();
                assert!(
                    m.contains(what)
                        && m.contains("node-affinity-violated")
                        && m.contains("ns/pod"),
                    "{m}"
                );
            }
            other => panic!("{other:?}"),
        };
        let before = api.gets();
        refused(
            again.pod.on_create("c1", &again.dir.path().join("bundle")),
            "the recreate of container app",
        );
        refused(again.update(RESIZE), "the update of container app");
        assert_eq!(
            api.gets(),
            before + 2,
            "the node only, each time: the pod was kept"
        );
        // Relabelled back: the kubelet's retry of that resize, within 10 s of it, is checked
        // against what it read, and refused the same; another resize reads the node again and
        // goes through.
        api.label("nic", "mlx5");
        refused(again.update(RESIZE), "the update of container app");
        assert!(matches!(
            again.update(r#"{"cpu":{"cpus":"1","quota":300000,"period":100000}}"#),
            Outcome::Forward(_)
        ));
    }

    /// A kubeconfig that cannot be used when the daemon starts (here writable by others, as a
    /// file caught mid-rotation might be unreadable) costs each read a warning saying why, and
    /// is set up again at each read: once fixed, the check runs, without a new daemon.
    #[test]
    fn a_kubeconfig_broken_at_the_start_is_read_again_once_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let api = ApiServer::start();
        let kubeconfig = api.server.kubeconfig();
        let mode = |m| {
            std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(m))
                .expect("chmod")
        };
        mode(0o666);
        let p = pod_configured("audit", None, true, &api.config(), false);
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        assert_eq!(api.gets(), 0);
        let lines = p.lines();
        let warning = lines
            .iter()
            .find(|l| l["rule"] == "node-labels-unavailable")
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert!(
            warning["msg"]
                .as_str()
                .is_some_and(|m| m.contains("written by others")),
            "{warning}"
        );
        mode(0o600);
        p.create();
        assert!(matches!(p.update(RESIZE), Outcome::Forward(_)));
        assert_eq!(
            api.gets(),
            2,
            "the pod and its node, once the kubeconfig is fixed"
        );
    }

    /// The pod's Events with a kubeconfig that cannot be used when the daemon starts: those
    /// announced meanwhile are dropped, counted and logged; once it is fixed the writer sets it
    /// up again (off the request path) and writes them.
    #[test]
    fn a_kubeconfig_broken_at_the_start_writes_events_once_fixed() {
        use std::os::unix::fs::PermissionsExt;
        let api = ApiServer::start();
        let kubeconfig = api.server.kubeconfig();
        let mode = |m| {
            std::fs::set_permissions(&kubeconfig, std::fs::Permissions::from_mode(m))
                .expect("chmod")
        };
        mode(0o666);
        let p = pod_configured("audit", None, true, &api.config(), false);
        assert!(p
            .pod
            .pod_events
            .1
            .starts_with("on once the kubeconfig can be used: "));
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.create();
        let flush = || {
            assert!(p
                .pod
                .pod_events
                .0
                .flush(Instant::now() + Duration::from_secs(30)))
        };
        // Across to node 0: two errors, two Events, not written.
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"0"}}"#),
            Outcome::Forward(_)
        ));
        flush();
        assert!(api.events().is_empty());
        assert_eq!(p.pod.sinks.drops.get(kata_topo_sinks::Sink::KubeEvents), 2);
        assert!(p.lines().iter().any(|l| l["event"] == "pod-event-failed"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("written by others"))));
        mode(0o600);
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"1"}}"#),
            Outcome::Forward(_)
        ));
        assert!(matches!(
            p.update(r#"{"cpu":{"cpus":"0"}}"#),
            Outcome::Forward(_)
        ));
        flush();
        let reasons: Vec<_> = api.events().iter().map(|e| e["reason"].clone()).collect();
        assert_eq!(reasons.len(), 2, "{reasons:?}");
    }

    /// An API server that accepts and never answers costs a resize the timeout and a
    /// `node-labels-unavailable` warning saying why; the resize goes on, in enforce mode too.
    #[test]
    fn a_hung_api_server_costs_the_timeout_and_a_warning() {
        let api = ApiServer::start();
        let p = pod_configured("enforce", None, true, &api.config(), false);
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.create();
        api.hang.store(true, std::sync::atomic::Ordering::SeqCst);
        let started = Instant::now();
        assert!(matches!(p.update(RESIZE), Outcome::Forward(_)));
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(1000), "{took:?}");
        assert!(took < Duration::from_millis(2500), "{took:?}");
        let lines = p.lines();
        let warning = lines
            .iter()
            .find(|l| l["rule"] == "node-labels-unavailable")
            .unwrap_or_else(|| panic!("{lines:#?}"));
        assert_eq!(warning["severity"], "warning");
        assert!(
            warning["msg"]
                .as_str()
                .is_some_and(|m| m.contains("did not answer within 1000 ms")),
            "{warning}"
        );
    }

    /// Without a kubeconfig the check is off, reads nothing and says so in the daemon's record.
    #[test]
    fn no_kubeconfig_no_affinity_check() {
        let p = pod("audit");
        assert!(matches!(p.create_sandbox(), Outcome::Forward(_)));
        p.pod
            .record_daemon("unix:///run/test/delegate.sock", Some(4242));
        assert!(p.pod.flush_state(Instant::now() + Duration::from_secs(10)));
        let record: DaemonRecord = serde_json::from_slice(
            &std::fs::read(p.pod.state_dir().join("daemon.json")).expect("daemon"),
        )
        .expect("record");
        assert!(
            record
                .node_affinity
                .as_deref()
                .is_some_and(|a| a.starts_with("off:")),
            "{record:?}"
        );
    }
}
