//! The checks the wrapper runs on `Create` and `Update`, with their state: the host topology
//! (loaded once, refreshed off the request path), baselines, per-task records, suppression of
//! repeated findings, and the sinks. Plain methods, testable without a ttrpc connection.
//!
//! Suppression: the kubelet's CPU-manager reconcile loop pushes the same cpuset every 10 s.
//! A verdict is announced (log, event) only when its findings differ from the last verdict
//! announced for the same task and update class (or create operation); a `noop` update (what
//! is in force pushed again) is a repeat when its findings equal any announced for the task;
//! a clean verdict re-arms the task. The state file always holds the latest verdict.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime};

use kata_topo::check::{check_failed, failed_verdict};
use kata_topo::kata::KataConfig;
use kata_topo::vm::VmView;
use kata_topo::Rule;
use kata_topo::{
    Baseline, Checker, ContainerSpec, Decision, Defaults, Host, Operation, Overrides, Request,
    Resources, Severity, Sysfs, TopologySource, UpdateClass, Verdict,
};
use slog::Logger;

use crate::config::Config;
use crate::error::ShimError;
use crate::sinks::{log_verdict, rfc3339, Events, Metrics};
use crate::state::{DaemonRecord, GroupState, TaskRecord};
use kata_topo::process::ProcessId;

/// How long after the delegate applied a request the VM is looked at again (Kata re-pins
/// vCPUs and rewrites the sandbox cgroup right after it answers).
const OBSERVE_DELAY: Duration = Duration::from_millis(500);

/// What to do with a request.
#[derive(Debug)]
pub enum Outcome {
    /// Forward it to the delegate; apply `after` if the delegate answers OK.
    Forward(Option<After>),
    /// Answer it with this error; the delegate never sees it.
    Refuse(ShimError),
}

/// What to remember once the delegate accepted a request.
#[derive(Debug, Clone)]
pub enum After {
    /// A task was created.
    Created {
        /// Task id.
        task_id: String,
        /// Its record.
        record: TaskRecord,
        /// A baseline to keep: the sandbox's (`None` name) or a container's first create.
        baseline: Option<Box<(Option<String>, Baseline)>>,
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

struct HostSlot {
    host: Option<Arc<Host>>,
    error: Option<String>,
    loaded_at: Option<SystemTime>,
    /// Whether a first load has finished (successfully or not).
    tried: bool,
}

/// The checks of one pod's wrapper daemon.
pub struct Guard {
    config: Config,
    kata: KataConfig,
    namespace: String,
    group: String,
    host: RwLock<HostSlot>,
    sysfs: Sysfs,
    state: GroupState,
    announced: Mutex<HashMap<(String, String), String>>,
    /// Parsed specs by bundle: an update must not re-parse `config.json` on the request path.
    specs: Mutex<HashMap<PathBuf, Arc<ContainerSpec>>>,
    first_load: (Mutex<bool>, Condvar),
    log: Logger,
    events: Events,
    metrics: Box<dyn Metrics>,
}

impl std::fmt::Debug for Guard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Guard").field("group", &self.group).finish()
    }
}

fn topology_source(config: &Config) -> TopologySource {
    match &config.topology_xml {
        Some(p) => TopologySource::Xml(p.clone()),
        None => TopologySource::Live,
    }
}

impl Guard {
    /// A guard for one pod. The topology is loaded by [`Guard::spawn_refresher`] (or
    /// [`Guard::refresh`]); a failure is kept and reported as `check-failed` on every request
    /// until a refresh succeeds.
    pub fn new(
        config: Config,
        kata: KataConfig,
        namespace: &str,
        group: &str,
        log: Logger,
        events: Events,
        metrics: Box<dyn Metrics>,
    ) -> std::io::Result<Self> {
        let state = GroupState::open(&config.state_dir, namespace, group)?;
        let guard = Self {
            sysfs: Sysfs::new(&config.sysfs_root),
            namespace: namespace.to_string(),
            group: group.to_string(),
            host: RwLock::new(HostSlot {
                host: None,
                error: None,
                loaded_at: None,
                tried: false,
            }),
            first_load: (Mutex::new(false), Condvar::new()),
            state,
            announced: Mutex::new(HashMap::new()),
            specs: Mutex::new(HashMap::new()),
            log,
            events,
            metrics,
            config,
            kata,
        };
        Ok(guard)
    }

    /// Reloads the topology; keeps the previous one when the reload fails.
    pub fn refresh(&self) {
        let source = topology_source(&self.config);
        let loaded = catch_unwind(|| Host::load(&source))
            .unwrap_or_else(|_| Err(kata_topo::host::HostError::NoCpu("hwloc panicked".into())));
        let mut slot = self.host.write().unwrap_or_else(|e| e.into_inner());
        match loaded {
            Ok(host) => {
                if slot.error.is_some() || slot.host.is_none() {
                    slog::info!(self.log, "topology loaded"; "event" => "topology-loaded",
                        "source" => &host.source_name, "fingerprint" => host.fingerprint(),
                        "sandbox_id" => &self.group);
                }
                slot.host = Some(Arc::new(host));
                slot.error = None;
                slot.loaded_at = Some(SystemTime::now());
                self.metrics.refreshed(true);
            }
            Err(e) => {
                let message = e.to_string();
                if slot.error.as_deref() != Some(message.as_str()) {
                    slog::warn!(self.log, "topology load failed"; "event" => "topology-failed",
                        "error" => &message, "sandbox_id" => &self.group);
                }
                slot.error = Some(message);
                self.metrics.refreshed(false);
            }
        }
        slot.tried = true;
        drop(slot);
        let (done, cv) = &self.first_load;
        *done.lock().unwrap_or_else(|e| e.into_inner()) = true;
        cv.notify_all();
    }

    /// Spawns the thread that loads the topology now, off the request path (the daemon serves
    /// while it loads; the first check waits for it), then every `topology_refresh_seconds`.
    pub fn spawn_refresher(self: &Arc<Self>) {
        let period = self.config.topology_refresh_seconds;
        let weak = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("topology-refresh".into())
            .spawn(move || {
                if let Some(guard) = weak.upgrade() {
                    guard.refresh();
                }
                if period == 0 {
                    return;
                }
                loop {
                    std::thread::sleep(Duration::from_secs(period));
                    match weak.upgrade() {
                        Some(guard) => guard.refresh(),
                        None => return,
                    }
                }
            });
        if spawned.is_err() {
            self.refresh();
        }
    }

    /// Waits (bounded) for the first topology load.
    fn wait_first_load(&self) {
        let (done, cv) = &self.first_load;
        let guard = done.lock().unwrap_or_else(|e| e.into_inner());
        let _ = cv
            .wait_timeout_while(guard, Duration::from_secs(30), |loaded| !*loaded)
            .map_err(|e| e.into_inner());
    }

    fn defaults(&self) -> Defaults {
        Defaults {
            policy: self.config.default_policy,
            mode: self.config.mode,
            fail_closed: self.config.fail_closed,
        }
    }

    /// The host, and the reason it is stale or missing.
    fn host(&self) -> (Option<Arc<Host>>, Option<String>) {
        self.wait_first_load();
        let slot = self.host.read().unwrap_or_else(|e| e.into_inner());
        let stale = slot
            .error
            .as_ref()
            .map(|e| match slot.loaded_at {
                Some(t) => format!(
                    "topology refresh failed ({e}); checked against the topology loaded at {}",
                    rfc3339(t)
                ),
                None => format!("no host topology ({e})"),
            })
            .or_else(|| (!slot.tried).then(|| "the host topology is still loading".to_string()));
        (slot.host.clone(), stale)
    }

    /// Runs the checker, or gives a `check-failed` verdict when it cannot run; never panics.
    fn run_check(
        &self,
        req: &Request<'_>,
        operation: Operation,
        class: Option<UpdateClass>,
    ) -> Verdict {
        let spec = req.spec;
        let (host, stale) = self.host();
        let Some(host) = host else {
            let reason = stale.unwrap_or_else(|| "no host topology".into());
            return failed_verdict(Some(spec), operation, class, self.defaults(), &reason);
        };
        let checker = Checker::new(&host, Some(&self.sysfs), self.defaults());
        let checked = catch_unwind(AssertUnwindSafe(|| checker.check(req)));
        let mut verdict = match checked {
            Ok(v) => v,
            Err(_) => failed_verdict(
                Some(spec),
                operation,
                class,
                self.defaults(),
                "the checker failed unexpectedly",
            ),
        };
        if let Some(reason) = stale {
            if let Some(f) = check_failed(verdict.policy, self.config.fail_closed, &reason) {
                verdict.findings.push(f);
                verdict.decide();
            }
        }
        verdict
    }

    fn baseline_of(
        &self,
        checker_host: Option<Arc<Host>>,
        spec: &ContainerSpec,
    ) -> Option<Baseline> {
        let host = checker_host?;
        let checker = Checker::new(&host, Some(&self.sysfs), self.defaults());
        catch_unwind(AssertUnwindSafe(|| checker.record_baseline(spec))).ok()
    }

    /// The spec in a bundle, parsed once per bundle.
    fn spec_of(
        &self,
        bundle: &Path,
    ) -> Result<Arc<ContainerSpec>, kata_topo::request::RequestError> {
        let mut specs = self.specs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(spec) = specs.get(bundle) {
            return Ok(Arc::clone(spec));
        }
        let spec = Arc::new(ContainerSpec::from_file(&bundle.join("config.json"))?);
        specs.insert(bundle.to_path_buf(), Arc::clone(&spec));
        Ok(spec)
    }

    /// A task `Create`: the sandbox's, a container's first (records its baseline), or a
    /// recreate of a container name the sandbox already ran (checked against its baseline).
    pub fn on_create(&self, task_id: &str, bundle: &Path) -> Outcome {
        let started = Instant::now();
        // A recreate reuses the bundle path: always read what this Create brings.
        self.specs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(bundle);
        let spec = match self.spec_of(bundle) {
            Ok(s) => s,
            Err(e) => {
                let mut v = failed_verdict(
                    None,
                    Operation::Create,
                    None,
                    self.defaults(),
                    &e.to_string(),
                );
                v.container_id = Some(task_id.to_string());
                v.sandbox_id = Some(self.group.clone());
                return self.finish(task_id, v, started, None);
            }
        };
        let sandbox = spec.kind == kata_topo::request::ContainerKind::Sandbox;
        let name = spec.container_name.clone();
        let existing = match (&name, sandbox) {
            (Some(n), false) => self.state.container_baseline(n).unwrap_or(None),
            _ => None,
        };
        let operation = match (sandbox, &existing) {
            (true, _) => Operation::Sandbox,
            (false, Some(_)) => Operation::Recreate,
            (false, None) => Operation::Create,
        };
        let kata = self.kata.with_annotations(&spec.annotations);
        let request = Request {
            baseline: existing.as_ref(),
            container_id: Some(task_id),
            kata: Some(&kata),
            ..Request::create(&spec)
        };
        let mut verdict = self.run_check(&request, operation, None);
        verdict.container_id = Some(task_id.to_string());
        let baseline = match (&existing, sandbox) {
            (Some(_), _) => None,
            (None, true) => self
                .baseline_of(self.host().0, &spec)
                .map(|b| Box::new((None, b))),
            (None, false) => name.clone().and_then(|n| {
                self.baseline_of(self.host().0, &spec)
                    .map(|b| Box::new((Some(n), b)))
            }),
        };
        let after = After::Created {
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
        self.finish(task_id, verdict, started, Some(after))
    }

    /// A task `Update` with the `LinuxResources` JSON containerd sent.
    pub fn on_update(&self, task_id: &str, resources_json: &[u8]) -> Outcome {
        let started = Instant::now();
        let record = self.state.task(task_id).unwrap_or(None);
        let spec = record.as_ref().map(|r| self.spec_of(&r.bundle));
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
                let mut v = failed_verdict(None, Operation::Update, None, self.defaults(), &reason);
                v.container_id = Some(task_id.to_string());
                v.sandbox_id = Some(self.group.clone());
                return self.finish(task_id, v, started, None);
            }
        };
        let current = record
            .resources
            .clone()
            .unwrap_or_else(|| spec.resources.clone());
        let class = current.classify(&update);
        let baseline = if record.sandbox {
            self.state.sandbox_baseline().unwrap_or(None)
        } else {
            record
                .container_name
                .as_deref()
                .and_then(|n| self.state.container_baseline(n).unwrap_or(None))
        };
        let kata = self.kata.with_annotations(&spec.annotations);
        // Only static sizing needs the VM's real vCPU count to predict pinning.
        let vm = record
            .pid
            .filter(|_| kata.enable_vcpus_pinning && kata.static_sandbox_resource_mgmt)
            .and_then(|pid| VmView::read(&self.config.procfs_root, pid).ok())
            .filter(VmView::is_vmm);
        let request = Request {
            spec: &spec,
            update: Some(&update),
            current: Some(&current),
            baseline: baseline.as_ref(),
            container_id: Some(task_id),
            overrides: Overrides::default(),
            kata: Some(&kata),
            vm: vm.as_ref(),
        };
        let mut verdict = self.run_check(&request, Operation::Update, Some(class));
        // The VM view informs the prediction (static sizing keeps the VM's vCPUs); what the
        // VM really does is reported once the delegate applied the update (`observe`).
        verdict.findings.retain(|f| !is_observed(f.rule));
        verdict.decide();
        verdict.container_id = Some(task_id.to_string());
        let after = After::Updated {
            task_id: task_id.to_string(),
            resources: current.merged(&update),
        };
        self.finish(task_id, verdict, started, Some(after))
    }

    /// A task `Delete` (of the task itself, not an exec).
    pub fn on_delete(&self, task_id: &str) -> Outcome {
        Outcome::Forward(Some(After::Deleted {
            task_id: task_id.to_string(),
        }))
    }

    /// Announces, keeps and decides a verdict.
    fn finish(
        &self,
        task_id: &str,
        verdict: Verdict,
        started: Instant,
        after: Option<After>,
    ) -> Outcome {
        self.metrics.observe(&verdict, started.elapsed());
        let _ = self.state.save_verdict(task_id, &verdict);
        if self.should_announce(task_id, &verdict) {
            log_verdict(&self.log, &verdict);
            self.events.mismatch(&verdict);
        }
        if verdict.decision == Decision::Reject {
            return Outcome::Refuse(ShimError::Rejected(refusal(&verdict)));
        }
        Outcome::Forward(after)
    }

    fn should_announce(&self, task_id: &str, v: &Verdict) -> bool {
        let key = (
            task_id.to_string(),
            v.class
                .map_or_else(|| v.operation.to_string(), |c| c.to_string()),
        );
        let mut announced = self.announced.lock().unwrap_or_else(|e| e.into_inner());
        if v.findings.is_empty() {
            announced.retain(|(t, _), _| t != task_id);
            return false;
        }
        let signature = serde_json::to_string(&(&v.findings, v.decision)).unwrap_or_default();
        // A no-op update (the reconcile loop pushing what is already in force) repeats
        // whatever was last announced for the task.
        if v.class == Some(UpdateClass::Noop)
            && announced
                .iter()
                .any(|((t, _), sig)| t == task_id && *sig == signature)
        {
            return false;
        }
        if announced.get(&key) == Some(&signature) {
            return false;
        }
        announced.insert(key, signature);
        true
    }

    /// Applies what the delegate accepted. `pid` is the pid a `Create` reply carried.
    pub fn commit(self: &Arc<Self>, after: After, pid: Option<u32>) {
        let observe = match &after {
            After::Created {
                task_id, record, ..
            } if !record.sandbox => pid.map(|p| (task_id.clone(), p, None)),
            After::Updated { task_id, .. } => self
                .state
                .task(task_id)
                .ok()
                .flatten()
                .and_then(|r| r.pid)
                .map(|p| (task_id.clone(), p, Some(()))),
            _ => None,
        };
        self.apply(after, pid);
        if let Some((task_id, vmm, _)) = observe {
            let guard = Arc::clone(self);
            let _ = std::thread::Builder::new()
                .name("observe".into())
                .spawn(move || guard.observe(&task_id, vmm));
        }
    }

    /// Re-reads the VM once the delegate has applied a request and reports what the vCPU
    /// threads really do (`vcpu-affinity-drift`, `vcpu-overlap`) as an `update` verdict. Waits
    /// a bounded time for Kata to re-pin; a pid that is not a VMM (runc) is left alone.
    fn observe(&self, task_id: &str, pid: u32) {
        std::thread::sleep(OBSERVE_DELAY);
        let Ok(view) = VmView::read(&self.config.procfs_root, pid) else {
            return;
        };
        if !view.is_vmm() {
            return;
        }
        let Some(record) = self.state.task(task_id).ok().flatten() else {
            return;
        };
        let Ok(spec) = self.spec_of(&record.bundle) else {
            return;
        };
        let started = Instant::now();
        let kata = self.kata.with_annotations(&spec.annotations);
        let current = record
            .resources
            .clone()
            .unwrap_or_else(|| spec.resources.clone());
        let baseline = record
            .container_name
            .as_deref()
            .and_then(|n| self.state.container_baseline(n).unwrap_or(None));
        let request = Request {
            spec: &spec,
            update: Some(&current),
            current: Some(&current),
            baseline: baseline.as_ref(),
            container_id: Some(task_id),
            overrides: Overrides::default(),
            kata: Some(&kata),
            vm: Some(&view),
        };
        let mut verdict = self.run_check(&request, Operation::Update, Some(UpdateClass::Noop));
        verdict.container_id = Some(task_id.to_string());
        verdict.findings.retain(|f| is_observed(f.rule));
        verdict.decide();
        // Observed after the fact: nothing to refuse any more, whatever the mode.
        if verdict.decision == Decision::Reject {
            verdict.decision = Decision::Allow;
        }
        self.metrics.observe(&verdict, started.elapsed());
        if self.should_announce(&format!("{task_id}/vm"), &verdict) {
            log_verdict(&self.log, &verdict);
            self.events.mismatch(&verdict);
        }
    }

    fn apply(&self, after: After, pid: Option<u32>) {
        let result = match after {
            After::Created {
                task_id,
                mut record,
                baseline,
            } => {
                record.pid = pid;
                if let Some((name, b)) = baseline.map(|b| *b) {
                    let saved = match name {
                        None => self.state.save_sandbox_baseline(&b),
                        Some(n) => self.state.save_container_baseline(&n, &b),
                    };
                    if let Err(e) = saved {
                        slog::warn!(self.log, "cannot save baseline"; "event" => "state-failed", "error" => e.to_string());
                    }
                }
                self.state.save_task(&task_id, &record)
            }
            After::Updated { task_id, resources } => match self.state.task(&task_id) {
                Ok(Some(mut record)) => {
                    record.resources = Some(resources);
                    self.state.save_task(&task_id, &record)
                }
                other => other.map(|_| ()),
            },
            After::Deleted { task_id } => {
                let record = self.state.task(&task_id).ok().flatten();
                if let Some(r) = &record {
                    self.specs
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&r.bundle);
                }
                let sandbox = task_id == self.group || record.is_some_and(|r| r.sandbox);
                self.announced
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(t, _), _| t != &task_id);
                if sandbox {
                    self.metrics.remove();
                    self.state.remove_all()
                } else {
                    self.state.remove_task(&task_id)
                }
            }
        };
        if let Err(e) = result {
            slog::warn!(self.log, "cannot update state"; "event" => "state-failed", "error" => e.to_string());
        }
    }

    /// Records who serves the pod: this daemon, and the delegate (its pid as the delegate
    /// reported it, when it did).
    pub fn record_daemon(&self, delegate_address: &str, delegate_pid: Option<u32>) {
        let procfs = &self.config.procfs_root;
        let Some(wrapper) = ProcessId::current(procfs) else {
            return;
        };
        let record = DaemonRecord {
            wrapper,
            delegate_address: delegate_address.to_string(),
            delegate: delegate_pid.and_then(|p| ProcessId::of(procfs, p)),
        };
        if let Err(e) = self.state.save_daemon(&record) {
            slog::warn!(self.log, "cannot save the daemon record"; "event" => "state-failed", "error" => e.to_string());
        }
    }

    /// The containerd namespace of the pod.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The pod is gone (its delegate exited): its metrics disappear with it.
    pub fn forget(&self) {
        self.metrics.remove();
    }

    /// Where the pod's state lives.
    pub fn state_dir(&self) -> PathBuf {
        self.state.dir().to_path_buf()
    }
}

/// Rules about what the VM actually does, reported after the delegate applied a request.
fn is_observed(rule: Rule) -> bool {
    matches!(rule, Rule::VcpuAffinityDrift | Rule::VcpuOverlap)
}

/// The message a refused request carries back to containerd, CRI and the kubelet.
pub fn refusal(v: &Verdict) -> String {
    let what = match (v.operation, &v.container_name) {
        (Operation::Update, Some(n)) => format!("the update of container {n}"),
        (Operation::Update, None) => "the update".to_string(),
        (Operation::Sandbox, _) => "the pod sandbox".to_string(),
        (op, Some(n)) => format!("the {op} of container {n}"),
        (op, None) => format!("the {op}"),
    };
    let pod = format!(
        "{}/{}",
        v.pod.namespace.as_deref().unwrap_or("-"),
        v.pod.name.as_deref().unwrap_or("-")
    );
    let reasons: Vec<String> = v
        .findings
        .iter()
        .filter(|f| f.severity == Severity::Error)
        .map(|f| {
            format!(
                "{}: expected {}, found {}: {}",
                f.rule,
                serde_json::to_string(&f.expected).unwrap_or_default(),
                serde_json::to_string(&f.observed).unwrap_or_default(),
                f.message
            )
        })
        .collect();
    format!(
        "kata-topo refused {what} in pod {pod} (policy {}, mode enforce): {}",
        v.policy,
        reasons.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::{json_logger, NoMetrics};
    use crate::ttrpc::Code;
    use kata_topo::simulate::SysfsTree;

    struct Fixture {
        dir: tempfile::TempDir,
        guard: Arc<Guard>,
    }

    fn fixture(mode: &str) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SysfsTree::at(dir.path().join("sys")).expect("sysfs");
        tree.add_device(
            "0000:b7:00.0".parse().expect("bdf"),
            1,
            Some("vfio-pci"),
            Some("42"),
        )
        .expect("gpu");
        let config = Config::parse(
            &format!(
                "[topology_guard]\nmode = \"{mode}\"\ntopology_xml = \"{}\"\nsysfs_root = \"{}\"\nstate_dir = \"{}\"\nlog_file = \"{}\"\n",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
                tree.root().display(),
                dir.path().join("state").display(),
                dir.path().join("kt.log").display(),
            ),
            Path::new("test.toml"),
        )
        .expect("config");
        let log = json_logger(&config.log_file, false);
        let guard = Guard::new(
            config,
            KataConfig::default(),
            "k8s.io",
            "sb1",
            log.clone(),
            Events::start(None, String::new(), log),
            Box::new(NoMetrics),
        )
        .expect("guard");
        guard.refresh();
        let bundle = dir.path().join("bundle");
        std::fs::create_dir_all(&bundle).expect("bundle");
        std::fs::write(
            bundle.join("config.json"),
            serde_json::json!({
                "ociVersion": "1.0.2",
                "annotations": {
                    "io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.sandbox-id": "sb1",
                    "io.kubernetes.cri.container-name": "app",
                    "io.kubernetes.cri.sandbox-name": "pod",
                    "io.kubernetes.cri.sandbox-namespace": "ns",
                    "kata-topo.io/numa-nodes": "1"
                },
                "linux": {"resources": {"cpu": {"cpus": "1", "quota": 100000, "period": 100000}},
                          "devices": [{"path": "/dev/vfio/42", "type": "c", "major": 240, "minor": 0}]}
            })
            .to_string(),
        )
        .expect("spec");
        Fixture {
            dir,
            guard: Arc::new(guard),
        }
    }

    impl Fixture {
        fn finding_lines(&self) -> usize {
            std::fs::read_to_string(self.dir.path().join("kt.log"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.contains("\"event\":\"finding\""))
                .count()
        }

        fn create(&self) {
            match self.guard.on_create("c1", &self.dir.path().join("bundle")) {
                Outcome::Forward(Some(after)) => self.guard.commit(after, Some(7)),
                other => panic!("create: {other:?}"),
            }
        }

        fn update(&self, json: &str) -> Outcome {
            let outcome = self.guard.on_update("c1", json.as_bytes());
            if let Outcome::Forward(Some(after)) = &outcome {
                self.guard.commit(after.clone(), None);
            }
            outcome
        }
    }

    #[test]
    fn repeated_identical_findings_are_announced_once() {
        let f = fixture("audit");
        f.create();
        assert_eq!(f.finding_lines(), 0);
        let cross = r#"{"cpu":{"cpus":"0","quota":100000,"period":100000}}"#;
        f.update(cross);
        let first = f.finding_lines();
        assert_eq!(first, 2, "cpu-outside-intent and vfio-remote");
        // The reconcile loop pushes the same cpuset: a noop with the same findings.
        f.update(cross);
        f.update(cross);
        assert_eq!(f.finding_lines(), first);
        // Back on node 1: clean, re-arms; crossing again is announced again.
        f.update(r#"{"cpu":{"cpus":"1"}}"#);
        assert_eq!(f.finding_lines(), first);
        f.update(cross);
        assert_eq!(f.finding_lines(), first * 2);
        // The latest verdict is always kept for `kata-topo status`.
        let kept = f.guard.state_dir().join("verdicts/c1.json");
        let v: Verdict =
            serde_json::from_slice(&std::fs::read(kept).expect("verdict")).expect("json");
        assert_eq!(v.findings.len(), 2);
    }

    #[test]
    fn enforce_refuses_with_failed_precondition_naming_rule_and_pod() {
        let f = fixture("enforce");
        f.create();
        match f.update(r#"{"cpu":{"cpus":"0"}}"#) {
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
        let record = f.guard.state.task("c1").expect("read").expect("task");
        assert_eq!(record.resources, None);
        assert_eq!(record.pid, Some(7));
        assert!(matches!(
            f.update(r#"{"cpu":{"quota":200000}}"#),
            Outcome::Forward(_)
        ));
    }

    #[test]
    fn unknown_tasks_and_malformed_updates_are_check_failed_not_refused() {
        let f = fixture("enforce");
        assert!(matches!(
            f.guard.on_update("nobody", b"{}"),
            Outcome::Forward(None)
        ));
        f.create();
        assert!(matches!(
            f.guard.on_update("c1", b"{not json"),
            Outcome::Forward(None)
        ));
        let log = std::fs::read_to_string(f.dir.path().join("kt.log")).expect("log");
        assert!(
            log.contains("check-failed") && log.contains("was not created through this wrapper"),
            "{log}"
        );
    }

    #[test]
    fn sandbox_delete_removes_the_pod_state() {
        let f = fixture("audit");
        f.create();
        assert!(f
            .guard
            .state
            .container_baseline("app")
            .expect("read")
            .is_some());
        if let Outcome::Forward(Some(after)) = f.guard.on_delete("c1") {
            f.guard.commit(after, None);
        }
        assert!(f.guard.state.task("c1").expect("read").is_none());
        assert!(
            f.guard
                .state
                .container_baseline("app")
                .expect("read")
                .is_some(),
            "kept for a recreate"
        );
        if let Outcome::Forward(Some(after)) = f.guard.on_delete("sb1") {
            f.guard.commit(after, None);
        }
        assert!(!f.guard.state_dir().exists());
    }
}
