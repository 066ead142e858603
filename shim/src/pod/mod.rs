//! The checks one pod's wrapper daemon runs on `Create` and `Update`, as plain methods
//! testable without a ttrpc connection: a request comes in, an [`Outcome`] goes out; once
//! the delegate accepted it, [`Pod::commit`] applies what it changed.
//!
//! Nothing here waits: not for the topology (loaded off the request path by
//! [`Pod::spawn_refresher`]), not for a sink (log lines, events, metrics and state go
//! through queues), not for the VM (looked at later by one timer thread).

mod affinity;
mod announce;
mod host;
mod observe;
mod pod_resources;
mod specs;
mod store;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_core::check::{could_not_run, Phase, Request, Running, Unread};
use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::kata::KataConfig;
use kata_topo_core::process::ProcessId;
use kata_topo_core::request::ContainerKind;
use kata_topo_core::state::{DaemonRecord, GroupState, TaskRecord, VerdictOf};
use kata_topo_core::vm::{Identity, VmReader, VmView};
use kata_topo_core::{
    Baseline, Checker, ContainerSpec, Decision, Defaults, Operation, Resources, Sysfs, UpdateClass,
    Verdict,
};
use kata_topo_sinks::{log_verdict, Drops, Events, Metrics, Persist};
use slog::Logger;

use crate::error::ShimError;
use affinity::NodeAffinity;
use announce::Announcer;
use kata_topo_core::affinity::NodeView;
use pod_resources::KubeletIntents;

/// The longest a check waits for its daemon's first topology load, when that load is under
/// way: a new pod's daemon loads the topology while the delegate starts, and on a fresh node
/// (nothing cached yet, a slow discovery) its first `Create` could otherwise arrive before
/// the load finished and go unchecked. Later checks never wait.
const FIRST_LOAD_WAIT: Duration = Duration::from_secs(3);
use host::CurrentHost;
use observe::Observer;
use specs::SpecCache;
pub(crate) use store::BaselineOf;
use store::PodStore;

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

/// The checks of one pod's wrapper daemon.
#[derive(Debug)]
pub(crate) struct Pod {
    config: Config,
    /// Where the configuration came from, for the daemon's record.
    origin: (Option<PathBuf>, ConfigSource),
    kata: KataConfig,
    namespace: String,
    group: String,
    host: CurrentHost,
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
        let files = match GroupState::open(&config.state_dir, namespace, group) {
            Ok(files) => Some(files),
            // Someone else could have written it: nothing there is read, nothing written.
            Err(e) if kata_topo_core::files::is_untrusted(&e) => {
                slog::error!(sinks.log, "the state directory is not trusted and is not used; checks run from memory and `kata-topo status` does not see this pod";
                    "event" => "state-untrusted", "error" => e.to_string(), "sandbox_id" => group);
                None
            }
            Err(e) => {
                slog::warn!(sinks.log, "cannot create the pod's state directory; checks run from memory";
                    "event" => "state-failed", "error" => e.to_string(), "sandbox_id" => group);
                Some(GroupState::at(&config.state_dir, namespace, group))
            }
        };
        let log = sinks.log.clone();
        let persist = Persist::start(sinks.drops.clone(), move |key, e| {
            slog::warn!(log, "cannot write state"; "event" => "state-failed", "file" => key,
                "error" => e.to_string());
        });
        let store = PodStore::open(files, persist);
        let checks = Arc::new(Self {
            origin: (file, source),
            host: CurrentHost::new(
                config.topology_source(),
                kata_topo_core::cache::TopologyCache::from_config(&config),
            ),
            sysfs: Sysfs::new(&config.sysfs_root),
            affinity: NodeAffinity::new(&config, store.label_baseline()),
            store,
            namespace: namespace.to_string(),
            group: group.to_string(),
            specs: SpecCache::default(),
            pending_baselines: Mutex::new(Vec::new()),
            announcer: Announcer::default(),
            observer: Observer::new(),
            sinks,
            kubelet: KubeletIntents::new(&config),
            config,
            kata,
            delegate_pid: std::sync::OnceLock::new(),
        });
        Observer::start(
            Arc::downgrade(&checks),
            |c: &Pod| &c.observer,
            |c: &Pod, task, pid| c.observe(task, pid),
        );
        checks
    }

    /// Loads the topology now (tests; the daemon uses [`Pod::spawn_refresher`]).
    pub(crate) fn refresh(&self) {
        if self
            .host
            .refresh(&self.sinks.log, &self.sinks.metrics, &self.group)
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
        match phase {
            Phase::Admit => checker.admit(req),
            Phase::Recreate(baseline) => checker.recreate(req, baseline),
            Phase::Update(running, update) => checker.update(req, running, update),
            Phase::Observe(running, vm) => checker.observe(req, running, vm),
        }
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
        kubelet: Option<&'a kata_topo_core::kubelet::KubeletView>,
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
        let spec = match self.specs.fresh(bundle) {
            Ok(s) => s,
            Err(e) => {
                let v = self.unread(Operation::Create, task_id, &e.to_string());
                return self.finish(task_id, v, started, None);
            }
        };
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
        let class = current.classify(&update);
        let baseline = self.baseline_of_task(&record);
        // A resize asks the kubelet again; a cpuset push (the CPU manager's reconcile, sent to
        // every shared-pool container at once) is checked against what was kept.
        let resize = matches!(class, UpdateClass::Resize | UpdateClass::Mixed);
        let kubelet = self.kubelet.view(&spec.pod, resize);
        // A resize reads the node's labels again; a cpuset push does not.
        let node = resize.then(|| self.node_view(&spec.pod)).flatten();
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
        let running = Running {
            current: Some(&current),
            baseline: baseline.as_ref(),
            vm: vm.as_ref(),
        };
        let verdict = self.run(Phase::Update(running, &update), &request);
        let accept = OnAccept::Updated {
            task_id: task_id.to_string(),
            resources: current.merged(&update),
        };
        self.finish(task_id, verdict, started, Some(accept))
    }

    /// What the API server says about the pod's node now (one read, within
    /// `api_timeout_ms`), for the core to check the pod's node affinity against; keeps the
    /// label baseline a first read gives. `None` when the check is off.
    fn node_view(&self, pod: &kata_topo_core::verdict::PodRef) -> Option<NodeView> {
        let read = catch_unwind(AssertUnwindSafe(|| self.affinity.read(pod))).ok()?;
        if let Some(b) = read.new_baseline {
            self.store.save_label_baseline(b);
        }
        read.view
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
mod tests;
