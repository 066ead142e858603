//! The hook: read the OCI state on stdin and the spec from the bundle, run the core's checks as
//! the wrapper (with the VM view when the state's pid is a VMM), log and publish like the
//! wrapper, and fail only in enforce mode with an `error` finding — so the runtime refuses the
//! container. A check that cannot run never blocks a container unless `fail_closed` is set in
//! enforce mode.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_core::check::{could_not_run, Request, Unread};
use kata_topo_core::config::Config;
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::state::GroupState;
use kata_topo_core::vm::{Identity, VmReader, VmView};
use kata_topo_core::wait::{run_within, Progress};
use kata_topo_core::{Checker, ContainerSpec, Decision, Defaults, Operation, Sysfs, Verdict};
use kata_topo_sinks::events::{payload, publish};
use kata_topo_sinks::{log_verdict, Drops, Log};
use serde::Deserialize;

use kata_topo_core::VERSION;

/// The most the hook spends publishing its event and writing its log: containerd being slow
/// or a log nobody reads must never make the runtime's hook timeout fail a container.
const PUBLISH_BUDGET: Duration = Duration::from_secs(1);

/// The most the hook waits for its configuration, and then for its check (reading the state,
/// the spec, the topology, the VM view, the baselines): a read that blocks — a hung device's
/// sysfs attribute, a FIFO, a runtime that never closes stdin — costs the container this wait
/// and a `check-failed` finding naming the step, never its creation. Within the runtime's
/// hook timeout (10 s in `docs/hook.md`'s example) with the publishing budget on top.
const CHECK_BUDGET: Duration = Duration::from_secs(3);

/// The largest OCI state accepted on stdin.
const MAX_STATE: u64 = 1024 * 1024;

/// Why the hook fails the container (or was misused).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// Enforce mode, an `error` finding.
    #[error("{0}")]
    Refused(String),
    /// Enforce mode with `fail_closed`, and the check could not run.
    #[error("kata-topo-hook: the check could not run and fail_closed is set: {0}")]
    FailedClosed(String),
    /// Bad command line.
    #[error("kata-topo-hook: {0}")]
    Usage(String),
}

impl From<&HookError> for ExitCode {
    fn from(e: &HookError) -> Self {
        match e {
            HookError::Refused(_) | HookError::FailedClosed(_) => ExitCode::from(1),
            HookError::Usage(_) => ExitCode::from(2),
        }
    }
}

/// The OCI runtime state a hook receives on stdin.
#[derive(Debug, Deserialize)]
struct State {
    id: String,
    #[serde(default)]
    status: String,
    #[serde(default)]
    pid: Option<u32>,
    bundle: PathBuf,
}

struct Args {
    config: Option<PathBuf>,
}

fn args() -> Result<Option<Args>, HookError> {
    let mut config = None;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-v" | "--version" | "-V" => {
                println!("kata-topo-hook {VERSION}");
                return Ok(None);
            }
            "--config" => {
                config =
                    Some(PathBuf::from(it.next().ok_or_else(|| {
                        HookError::Usage("--config needs a file".into())
                    })?))
            }
            other => {
                return Err(HookError::Usage(format!(
                    "unknown argument {other:?} (usage: kata-topo-hook [--config FILE])"
                )))
            }
        }
    }
    Ok(Some(Args { config }))
}

/// Runs the hook.
pub fn run() -> Result<(), HookError> {
    let Some(args) = args()? else {
        return Ok(());
    };
    let progress = Progress::new("reading the configuration");
    let wanted = args.config.clone();
    let resolved = match run_within(CHECK_BUDGET, &progress, move || {
        Config::resolve(wanted.as_deref())
    }) {
        Ok(resolved) => resolved.map_err(|e| HookError::Usage(e.to_string()))?,
        Err(e) => {
            // Without a configuration there is no log and no mode: the container goes on.
            eprintln!("kata-topo-hook: the configuration {e}; the container is not checked");
            return Ok(());
        }
    };
    let (config, config_file) = (resolved.config, resolved.file);
    let log = Log::open(&config.log_file, false, Drops::new());
    let defaults = config.defaults();
    let seen: Seen = Arc::default();
    let outcome = {
        let (config, progress, seen) = (config.clone(), progress.clone(), Arc::clone(&seen));
        run_within(CHECK_BUDGET, &progress.clone(), move || {
            check(&config, config_file.as_deref(), &progress, &seen)
        })
    };
    let verdict = match outcome {
        Ok(Ok(Some(v))) => v,
        // poststop: nothing was checked.
        Ok(Ok(None)) => return Ok(()),
        Ok(Err((spec, reason))) => failed(spec.map(|s| *s), &reason, defaults),
        Err(e) => failed(
            seen.lock().unwrap_or_else(|e| e.into_inner()).take(),
            &format!("the check {e}"),
            defaults,
        ),
    };
    if !verdict.findings.is_empty() {
        let deadline = Instant::now() + PUBLISH_BUDGET;
        log_verdict(log.logger(), &verdict);
        announce(&verdict, deadline);
        // A log that cannot be written (a FIFO nobody reads) is not waited for past the budget.
        log.flush(deadline);
    }
    if verdict.decision() == Decision::Reject {
        let failed = verdict
            .findings
            .iter()
            .all(|f| f.rule == kata_topo_core::Rule::CheckFailed);
        return Err(if failed {
            HookError::FailedClosed(
                verdict
                    .findings
                    .first()
                    .map(|f| f.message.clone())
                    .unwrap_or_default(),
            )
        } else {
            HookError::Refused(verdict.refusal())
        });
    }
    Ok(())
}

/// The `check-failed` verdict of a check that could not run, with what is known of the spec.
fn failed(spec: Option<ContainerSpec>, reason: &str, defaults: Defaults) -> Verdict {
    let unread = Unread {
        operation: Operation::Create,
        class: None,
        spec: spec.as_ref(),
        container_id: None,
        sandbox_id: None,
        after_the_fact: false,
    };
    could_not_run(&unread, defaults, reason)
}

/// The spec, once the check has read it: what a check given up on still knows of the pod.
type Seen = Arc<Mutex<Option<ContainerSpec>>>;

/// Publishes the verdict to containerd when the hook runs under it (`TTRPC_ADDRESS` in the
/// environment: Kata's host hooks inherit the shim's; an OCI hook gets it from its `env`).
fn announce(v: &Verdict, deadline: Instant) {
    let (Ok(address), Some(payload)) = (std::env::var("TTRPC_ADDRESS"), payload(v)) else {
        return;
    };
    let namespace = std::env::var("NAMESPACE").unwrap_or_else(|_| "k8s.io".to_string());
    let _ = publish(&address, &namespace, payload, deadline);
}

type Failure = (Option<Box<ContainerSpec>>, String);

/// Where the hook keeps a pod's baselines (the first create of a container name records one;
/// a later create of the same name is a recreate). Under containerd, bundles of one namespace
/// are siblings, so the sandbox's bundle is `<bundle>/../<sandbox id>`: the baselines live
/// there and go when containerd removes the sandbox — under CRI a hook never sees the sandbox
/// itself (containerd 1.6 applies the base runtime spec to containers only). Elsewhere they
/// live under `state_dir/hook/<sandbox id>`, removed by the sandbox's poststop hook.
fn store(config: &Config, bundle: &Path, group: &str) -> Option<GroupState> {
    let sandbox_bundle = bundle
        .parent()
        .map(|p| p.join(kata_topo_core::state::safe_name(group)))
        .filter(|p| p.is_dir());
    match sandbox_bundle {
        Some(b) => GroupState::open(&b, "kata-topo-hook", "state").ok(),
        None => GroupState::open(&config.state_dir, "hook", group).ok(),
    }
}

fn check(
    config: &Config,
    config_file: Option<&Path>,
    progress: &Progress,
    seen: &Seen,
) -> Result<Option<Verdict>, Failure> {
    progress.set("reading the OCI state on stdin");
    let mut input = String::new();
    std::io::stdin()
        .take(MAX_STATE)
        .read_to_string(&mut input)
        .map_err(|e| (None, format!("cannot read the OCI state on stdin: {e}")))?;
    let state: State = serde_json::from_str(&input)
        .map_err(|e| (None, format!("the OCI state on stdin is not valid: {e}")))?;
    let spec_path = state.bundle.join("config.json");
    progress.set(format!("reading the spec {}", spec_path.display()));
    let spec = ContainerSpec::from_file(&spec_path).map_err(|e| (None, e.to_string()))?;
    *seen.lock().unwrap_or_else(|e| e.into_inner()) = Some(spec.clone());
    let defaults = config.defaults();
    let group = spec.sandbox_id.clone().unwrap_or_else(|| state.id.clone());
    progress.set("reading the pod's baselines");
    if state.status == "stopped" {
        // poststop: when the sandbox goes, so do its baselines.
        if spec.kind == kata_topo_core::input::spec::ContainerKind::Sandbox {
            if let Some(s) = store(config, &state.bundle, &group) {
                let _ = s.remove_all();
            }
        }
        return Ok(None);
    }
    // The live machine through the node-wide cache: a discovery only when the machine changed.
    let host = kata_topo_core::host::cache::load_reporting(config, progress)
        .map(|loaded| loaded.host)
        .map_err(|e| (Some(Box::new(spec.clone())), e.to_string()))?;
    let sysfs = Sysfs::new(&config.sysfs_root);
    if let Some(p) = config_file {
        progress.set(format!("reading the Kata configuration {}", p.display()));
    }
    // The node's; the core applies the pod's annotations over it.
    let kata = config_file.and_then(|p| KataConfig::load(p).ok());
    if let Some(pid) = state.pid {
        progress.set(format!(
            "reading the VM view of process {pid} under {}",
            config.procfs_root.display()
        ));
    }
    // A VMM is the sandbox's: root's, running the configured hypervisor, in a cgroup that
    // names the sandbox. A process that only looks like one is not read.
    let identity = Identity {
        hypervisor: kata.as_ref().and_then(|k| k.hypervisor_path.clone()),
        sandbox_id: Some(group.clone()),
        ..Identity::default()
    };
    let vm = state
        .pid
        .and_then(|pid| {
            VmReader::new(&config.procfs_root)
                .with_identity(identity)
                .read(pid)
                .ok()
        })
        .filter(VmView::is_vmm);
    progress.set("reading the pod's baselines");
    let checker = Checker::new(&host, Some(&sysfs), defaults);
    let store = store(config, &state.bundle, &group);
    let name = spec.container_name.clone();
    let baseline = match (&store, &name) {
        (Some(s), Some(n)) => s.container_baseline(n).ok().flatten(),
        _ => None,
    };
    let running = state.status == "running";
    // What the kubelet admitted, as the wrapper asks it: once per hook run, a container's
    // create, within kubelet_timeout_ms.
    let kubelet = kata_topo_kubelet::intent_for(config, &spec.pod);
    let request = Request {
        container_id: Some(&state.id),
        kata: kata.as_ref(),
        vm: vm.as_ref(),
        kubelet: kubelet.as_ref(),
        // poststart: the container runs already; a failing poststart hook is only a warning
        // to the runtime, so report without refusing.
        after_the_fact: running,
        ..Request::new(&spec)
    };
    let verdict = match &baseline {
        Some(b) => checker.recreate(&request, b),
        None => checker.admit(&request),
    };
    if let (Some(s), Some(n), None) = (&store, &name, &baseline) {
        if verdict.decision() == Decision::Allow {
            progress.set("recording the container's baseline");
            let _ = s.save_container_baseline(n, &checker.record_baseline(&spec));
        }
    }
    Ok(Some(verdict))
}
