//! `kata-topo diagnose NAMESPACE/POD`: the three questions to ask first when a pod fails,
//! misbehaves or slows down after an in-place upgrade, answered for one pod on its node from
//! what kata-topo holds and reads — (1) have the node's labels changed since the pod was
//! admitted, (2) does its node affinity still hold, (3) does its topology binding still hold —
//! each with its evidence, and the pod's Kubernetes story that bears on them.
//!
//! What it reads, each read bounded as the wrapper's are: the pod's state (its wrapper's
//! baselines, label baseline, labels seen changed, task records and latest verdicts), the live
//! Node and Pod from the API server (one deadline, `api_timeout_ms`, the node's credentials),
//! the kubelet's admission (`kubelet_timeout_ms`), the live host topology (10 s) and each
//! container's VM. The settings are those of the configuration the pod's wrapper runs with
//! (its `daemon.json`). It writes nothing: no state, no topology cache, no Event.
//!
//! Exit 0: the three hold; 1: at least one does not; 2: kata-topo cannot tell (not a pod of
//! its wrapper on this node, no state, the API server not read), said in one line when it
//! cannot look at the pod at all.

mod answer;
mod human;

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_apiserver::Setup;
use kata_topo_core::check::verdict::PodRef;
use kata_topo_core::check::{could_not_run, Unread};
use kata_topo_core::config::Config;
use kata_topo_core::input::affinity::{NodeLabels, NodeView, PodPlacement};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::input::spec::MAX_SPEC_BYTES;
use kata_topo_core::state::{GroupState, PodState, TaskRecord};
use kata_topo_core::vm::{Identity, VmReader};
use kata_topo_core::{Checker, ContainerSpec, Decision, Operation, Request, Resources, Running};
use serde_json::Value;

use crate::commands::HostArgs;
use crate::out;
use answer::{CannotTell, ContainerBinding, Diagnosis, PodId, Refused};

#[derive(Debug, Args)]
pub(crate) struct DiagnoseArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(value_name = "NS/POD")]
    pod: String,
    /// The wrappers' state directory. Default: `state_dir` of the node's [topology_guard]
    /// (KATA_TOPO_CONFIG, else Kata's default paths), else /run/kata-topo.
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Enter PID 1's mount and UTS namespaces first: run in a privileged hostPID pod (the
    /// installer's, as `kubectl kata-topo` does), it then sees the node's files as the node
    /// does.
    #[arg(long)]
    enter_host: bool,
    /// Print the diagnosis as JSON (docs/cli.md has its schema).
    #[arg(long)]
    json: bool,
}

pub(crate) fn diagnose(args: &DiagnoseArgs) -> Result<ExitCode> {
    if args.enter_host {
        enter_host()?;
    }
    let Some((namespace, name)) = args
        .pod
        .split_once('/')
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains('/'))
    else {
        anyhow::bail!("the pod must be NAMESPACE/NAME, not {:?}", args.pod);
    };
    // The node's configuration says where the wrappers' state is; the pod's own says the rest.
    let node = Config::resolve(None).map(|r| r.config);
    let state_dir = args.state_dir.clone().unwrap_or_else(|| {
        node.as_ref()
            .map_or_else(|_| PathBuf::from("/run/kata-topo"), |c| c.state_dir.clone())
    });
    match gather(namespace, name, &state_dir, node.ok()) {
        Ok(d) => {
            if args.json {
                out::json(&serde_json::to_string_pretty(&d)?)?;
            } else {
                for line in human::lines(&d) {
                    out::line(&line)?;
                }
            }
            Ok(ExitCode::from(d.status.exit_code()))
        }
        Err(why) => {
            if args.json {
                out::json(&serde_json::to_string_pretty(&CannotTell::new(
                    namespace, name, why,
                ))?)?;
            } else {
                out::line(&format!("pod {namespace}/{name}: cannot tell: {why}"))?;
            }
            Ok(ExitCode::from(2))
        }
    }
}

/// Moves this process into PID 1's mount and UTS namespaces (it is single-threaded here, as
/// `setns` for a mount namespace requires), then to the root of its file system.
fn enter_host() -> Result<()> {
    use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
    for (ns, kind) in [
        ("mnt", LinkNameSpaceType::Mount),
        ("uts", LinkNameSpaceType::HostNameAndNISDomainName),
    ] {
        let path = format!("/proc/1/ns/{ns}");
        let needs = "--enter-host needs root with CAP_SYS_ADMIN in a pod with hostPID, such \
                     as the installer's";
        let file =
            std::fs::File::open(&path).with_context(|| format!("cannot open {path} ({needs})"))?;
        move_into_link_name_space(file.as_fd(), Some(kind))
            .with_context(|| format!("cannot enter PID 1's {ns} namespace ({needs})"))?;
    }
    std::env::set_current_dir("/").context("cannot change to the node's /")?;
    Ok(())
}

/// A pod's identity as its state tells it: the label baseline's, a verdict's, its sandbox's
/// spec.
fn pods_of(state_dir: &Path, p: &PodState) -> Vec<PodRef> {
    let mut out: Vec<PodRef> = p.verdicts.iter().map(|(_, v)| v.pod.clone()).collect();
    if let Ok(Some(b)) = GroupState::at(state_dir, &p.namespace, &p.sandbox_id).label_baseline() {
        out.push(PodRef {
            name: b.pod.name,
            namespace: b.pod.namespace,
            uid: b.pod.uid,
        });
    }
    for (_, t) in p.tasks.iter().filter(|(_, t)| t.sandbox) {
        if let Ok(spec) = read_spec(t) {
            out.push(spec.pod);
        }
    }
    out
}

/// The spec of a task's bundle, read bounded.
fn read_spec(t: &TaskRecord) -> Result<ContainerSpec, String> {
    let path = t.bundle.join("config.json");
    let bytes = kata_topo_core::files::read_bounded(&path, MAX_SPEC_BYTES)
        .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    ContainerSpec::from_json(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

/// The state of pod `namespace/name` under `state_dir`: the one whose wrapper serves when
/// there are several (an earlier sandbox not yet cleaned up).
fn find(
    state_dir: &Path,
    namespace: &str,
    name: &str,
) -> Result<(PodState, Option<String>), String> {
    let pods = kata_topo_core::state::list(state_dir).map_err(|e| {
        format!(
            "cannot read the state directory {}: {e}",
            state_dir.display()
        )
    })?;
    let mut found: Vec<(PodState, Option<String>)> = pods
        .into_iter()
        .filter_map(|p| {
            let refs = pods_of(state_dir, &p);
            let me = refs.iter().find(|r| {
                r.namespace.as_deref() == Some(namespace) && r.name.as_deref() == Some(name)
            })?;
            let uid = refs.iter().find_map(|r| r.uid.clone()).or(me.uid.clone());
            Some((p, uid))
        })
        .collect();
    found.sort_by_key(|(p, _)| {
        p.daemon
            .as_ref()
            .is_some_and(|d| d.wrapper.is_alive(Path::new("/proc")))
    });
    found.pop().ok_or_else(|| {
        format!(
            "kata-topo holds no state for it on this node (state directory {}): its pods \
             run with another runtime handler, or on another node",
            state_dir.display()
        )
    })
}

/// What diagnose reads, and its answers.
fn gather(
    namespace: &str,
    name: &str,
    state_dir: &Path,
    node_config: Option<Config>,
) -> Result<Diagnosis, String> {
    let (pod, uid) = match find(state_dir, namespace, name) {
        Ok(found) => found,
        Err(why) => {
            // Say what the API server knows of the pod, when it can be asked.
            let extra = node_config
                .as_ref()
                .and_then(|c| match kata_topo_apiserver::setup(c) {
                    Setup::On { client, .. } => client
                        .pod_object(namespace, name, Instant::now() + client.timeout())
                        .ok(),
                    _ => None,
                })
                .map(|p| {
                    format!(
                        "; the API server has it on node {} with runtimeClassName {}",
                        p["spec"]["nodeName"].as_str().unwrap_or("-"),
                        p["spec"]["runtimeClassName"].as_str().unwrap_or("-")
                    )
                })
                .unwrap_or_default();
            return Err(format!("{why}{extra}"));
        }
    };
    // The settings the pod's wrapper runs with.
    let config_file = pod.daemon.as_ref().and_then(|d| d.config.clone());
    let config = match &config_file {
        Some(path) => Config::from_file(path).map_err(|e| {
            format!(
                "cannot read the configuration of the pod's wrapper, {}: {}",
                path.display(),
                kata_topo_core::text::error_chain(&e)
            )
        })?,
        None => node_config.unwrap_or_default(),
    };
    let group = GroupState::at(state_dir, &pod.namespace, &pod.sandbox_id);
    let label_baseline = group.label_baseline().ok().flatten();
    let labels_seen = group.labels_seen().ok().flatten().unwrap_or_default();
    // The live Node and Pod, both within one deadline, as the wrapper reads them.
    let (live_node, live_pod, node_name): (Result<NodeLabels, String>, Result<Value, String>, _) =
        match kata_topo_apiserver::setup(&config) {
            Setup::On { client, node } => {
                let deadline = Instant::now() + client.timeout();
                let live_pod = client
                    .pod_object(namespace, name, deadline)
                    .map_err(|e| e.to_string());
                let live_node = client.node(&node, deadline).map_err(|e| e.to_string());
                (live_node, live_pod, Some(node))
            }
            Setup::Off(why) => {
                let why = format!("the API server is not read: {why}");
                (Err(why.clone()), Err(why), config.node_name.clone())
            }
            Setup::Broken(e) => (Err(e.to_string()), Err(e.to_string()), None),
        };
    if let (Ok(p), Some(want)) = (&live_pod, &uid) {
        if let Some(got) = p["metadata"]["uid"].as_str().filter(|got| got != want) {
            return Err(format!(
                "kata-topo's state is of an earlier pod of that name (uid {want}); the API \
                 server's is uid {got}"
            ));
        }
    }
    let placement = match &live_pod {
        Ok(p) => PodPlacement::from_value(p).ok(),
        Err(_) => None,
    }
    .or_else(|| label_baseline.as_ref().map(|b| b.pod.clone()));
    let node_labels = answer::node_labels(
        label_baseline.as_ref(),
        live_node.as_ref().map_err(String::as_str),
        &labels_seen,
    );
    let host = HostArgs {
        topology: config.topology_xml.clone(),
        sysfs: Some(config.sysfs_root.clone()),
        timeout: 10,
    }
    .load()
    .map_err(|e| format!("the host topology could not be read: {e:#}"));
    let checker = host
        .as_ref()
        .ok()
        .map(|(host, sysfs)| Checker::new(host, sysfs.as_ref(), config.defaults()));
    // The wrapper's own evaluation of the pod's placement on its node: the pod alone, through
    // the same phases as a resize that changes nothing.
    let affinity_findings = match (&checker, &placement, &live_node) {
        (Some(checker), Some(pod), Ok(node)) => {
            let view = NodeView::Read {
                pod: pod.clone(),
                node: node.clone(),
                baseline: label_baseline.as_ref().map(|b| b.node.clone()),
            };
            let spec = ContainerSpec::pod_only(pod.pod_ref());
            let request = Request {
                node: Some(&view),
                after_the_fact: true,
                ..Request::new(&spec)
            };
            Some(
                checker
                    .update(&request, Running::default(), &Resources::default())
                    .findings,
            )
        }
        _ => None,
    };
    let affinity = answer::affinity(
        placement.as_ref(),
        live_node.as_ref().map_err(String::as_str),
        affinity_findings.as_deref(),
    );
    let containers = match &checker {
        Some(checker) => Ok(check_containers(checker, &config, &pod)),
        None => Err(host.err().unwrap_or_default()),
    };
    let topology = answer::topology(containers, refused(&pod));
    let story = answer::story(live_pod.as_ref().map_err(String::as_str));
    let id = PodId {
        namespace: namespace.to_string(),
        name: name.to_string(),
        uid: uid.or_else(|| {
            live_pod
                .as_ref()
                .ok()
                .and_then(|p| p["metadata"]["uid"].as_str().map(str::to_string))
        }),
        node: story.node.clone().or(node_name),
        sandbox_id: pod.sandbox_id.clone(),
    };
    Ok(Diagnosis::new(id, node_labels, affinity, topology, story))
}

/// The requests kata-topo refused whose task never ran (a recreate the kubelet retries):
/// verdicts kept with no task record beside them.
fn refused(pod: &PodState) -> Vec<Refused> {
    pod.verdicts
        .iter()
        .filter(|(id, v)| {
            !id.contains('@')
                && v.decision() == Decision::Reject
                && !pod.tasks.iter().any(|(t, _)| t == id)
        })
        .map(|(id, v)| Refused {
            task_id: id.clone(),
            verdict: v.clone(),
        })
        .collect()
}

/// Each running container of the pod checked now against the live host, its baseline and its
/// intent, as the wrapper would check an update that changes nothing; never refusing.
fn check_containers(
    checker: &Checker<'_>,
    config: &Config,
    pod: &PodState,
) -> Vec<ContainerBinding> {
    let defaults = config.defaults();
    let config_file = pod.daemon.as_ref().and_then(|d| d.config.clone());
    let kata = config_file
        .as_deref()
        .and_then(|p| KataConfig::load(p).ok())
        .unwrap_or_default();
    let reader = VmReader::new(&config.procfs_root).with_identity(Identity {
        hypervisor: kata.hypervisor_path.clone(),
        sandbox_id: Some(pod.sandbox_id.clone()),
        shim_pid: pod
            .daemon
            .as_ref()
            .and_then(|d| d.delegate.as_ref())
            .map(|p| p.pid),
        ..Identity::default()
    });
    let mut kubelet = None;
    let mut out = Vec::new();
    for (task_id, record) in pod.tasks.iter().filter(|(_, t)| !t.sandbox) {
        let spec = match read_spec(record) {
            Ok(s) => s,
            Err(why) => {
                let unread = Unread {
                    operation: Operation::Update,
                    class: None,
                    spec: None,
                    container_id: Some(task_id),
                    sandbox_id: Some(&pod.sandbox_id),
                    after_the_fact: true,
                };
                let v = could_not_run(&unread, defaults, &why);
                let mut b = answer::binding(task_id, &v, None, None, None);
                b.name = record.container_name.clone().unwrap_or_else(|| "-".into());
                out.push(b);
                continue;
            }
        };
        // One question to the kubelet for the pod, as the wrapper asks once per pod.
        if kubelet.is_none() {
            kubelet = Some(kata_topo_kubelet::intent_for(config, &spec.pod));
        }
        let current = record
            .resources
            .clone()
            .unwrap_or_else(|| spec.resources.clone());
        let baseline = record.container_name.as_ref().and_then(|n| {
            pod.containers
                .iter()
                .find(|(name, _)| name == n)
                .map(|(_, b)| b.clone())
        });
        let vm = record
            .pid
            .and_then(|pid| reader.read(pid).ok())
            .filter(|v| v.is_vmm());
        let request = Request {
            container_id: Some(task_id),
            kata: Some(&kata),
            kubelet: kubelet.as_ref().and_then(Option::as_ref),
            vm: vm.as_ref(),
            after_the_fact: true,
            ..Request::new(&spec)
        };
        let running = Running {
            current: Some(&current),
            baseline: baseline.as_ref(),
            vm: vm.as_ref(),
        };
        let verdict = checker.update(&request, running, &current);
        let now = ContainerSpec {
            resources: current.clone(),
            ..spec.clone()
        };
        let placement = checker.record_baseline(&now);
        out.push(answer::binding(
            task_id,
            &verdict,
            Some(placement),
            baseline,
            vm,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    //! Each answer of each question, on a pod's state as the wrapper records it (written with
    //! the core's own state functions), the scenario's two-node host with its GPU on node 1,
    //! and the recorded Node and Pod of `core/tests/fixtures/affinity/`, served by a stand-in
    //! API server over HTTPS when a test needs one.

    use std::sync::{Arc, Mutex};

    use kata_topo_apiserver::fake::{FakeApiServer, Reply};
    use kata_topo_core::input::affinity::LabelBaseline;
    use kata_topo_core::process::ProcessId;
    use kata_topo_core::state::{DaemonRecord, LabelSeen, LabelsSeen};
    use kata_topo_core::testutil::{self, SysfsTree};
    use serde_json::json;

    use super::answer::Status;
    use super::*;

    fn scenario_host() -> kata_topo_core::Host {
        kata_topo_core::Host::load(&kata_topo_core::TopologySource::Xml(PathBuf::from(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
        )))
        .expect("scenario host")
    }

    fn fixture(name: &str) -> Value {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../core/tests/fixtures/affinity")
            .join(name);
        serde_json::from_slice(&std::fs::read(&path).expect("fixture")).expect("JSON")
    }

    /// The recorded Pod renamed as the scenario's spec names its pod (`ml/gpu-pod`, uid-1).
    fn pod_object() -> Value {
        let mut p = fixture("pod.json");
        p["metadata"]["name"] = json!("gpu-pod");
        p["metadata"]["namespace"] = json!("ml");
        p["metadata"]["uid"] = json!("uid-1");
        p["spec"]["containers"][0]["name"] = json!("trainer");
        p["status"] = json!({"phase": "Running", "containerStatuses": [
            {"name": "trainer", "restartCount": 0, "state": {"running": {"startedAt": "2026-12-01T10:00:00Z"}}}]});
        p
    }

    /// The Node and the Pod the stand-in API server answers with.
    type Served = Arc<Mutex<(Value, Value)>>;

    /// A pod `ml/gpu-pod` of the wrapper: its sandbox and container `trainer` (admitted on
    /// CPU 1 with the GPU of VFIO group 42, node 1), running on `cpus` now, its label baseline
    /// the recorded Node; the API server, when `api`, answering `node` and `pod`.
    struct Pod {
        dir: tempfile::TempDir,
        state: PathBuf,
        group: GroupState,
        config: Config,
        api: Option<(FakeApiServer, Served)>,
    }

    impl Pod {
        fn new(cpus: &'static str, api: bool) -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let d = dir.path();
            let tree = SysfsTree::at(d.join("sys")).expect("sysfs");
            tree.add_gpu().expect("gpu");
            let api = api.then(|| {
                let objects = Arc::new(Mutex::new((fixture("node.json"), pod_object())));
                let o = Arc::clone(&objects);
                let server = FakeApiServer::start(move |line| {
                    let (node, pod) = o.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    if line.starts_with("GET /api/v1/nodes/kata-topo-vm ") {
                        Reply::ok(node.to_string())
                    } else if line.starts_with("GET /api/v1/namespaces/ml/pods/gpu-pod ") {
                        Reply::ok(pod.to_string())
                    } else {
                        Reply::status(404, "not found")
                    }
                });
                (server, objects)
            });
            let kubeconfig = api
                .as_ref()
                .map_or(String::new(), |(s, _)| s.kubeconfig().display().to_string());
            let state = d.join("state");
            let config_file = d.join("kt.toml");
            std::fs::write(
                &config_file,
                format!(
                    "[topology_guard]\ntopology_xml = \"{}\"\nsysfs_root = \"{}\"\n\
                     state_dir = \"{}\"\nintent_source = \"annotations\"\n\
                     kubeconfig = \"{kubeconfig}\"\nnode_name = \"kata-topo-vm\"\n\
                     api_timeout_ms = 5000\n",
                    concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
                    tree.root().display(),
                    state.display(),
                ),
            )
            .expect("config");
            let config = Config::from_file(&config_file).expect("config");
            let group = GroupState::open(&state, "k8s.io", "sb-1").expect("state");
            let me = ProcessId::current(Path::new("/proc")).expect("this process");
            group
                .save_daemon(&DaemonRecord {
                    wrapper: me,
                    delegate_address: "unix:///run/d.sock".into(),
                    delegate: None,
                    config: Some(config_file),
                    config_source: "ConfigPath".into(),
                    node_affinity: None,
                    pod_events: None,
                })
                .expect("daemon");
            let write_bundle = |name: &str, spec: &testutil::SpecBuilder| {
                let b = d.join(name);
                std::fs::create_dir_all(&b).expect("bundle");
                std::fs::write(b.join("config.json"), spec.json().to_string()).expect("spec");
                b
            };
            let sandbox = write_bundle("sandbox", &testutil::spec().sandbox());
            let admitted = testutil::spec().cpus("1").device("/dev/vfio/42").nodes("1");
            let bundle = write_bundle("trainer", &admitted);
            group
                .save_task(
                    "sb-1",
                    &TaskRecord {
                        bundle: sandbox,
                        container_name: None,
                        sandbox: true,
                        resources: None,
                        pid: None,
                    },
                )
                .expect("sandbox task");
            let host = scenario_host();
            let sysfs = kata_topo_core::Sysfs::new(tree.root());
            let checker = Checker::new(&host, Some(&sysfs), config.defaults());
            let spec = admitted.build();
            group
                .save_container_baseline("trainer", &checker.record_baseline(&spec))
                .expect("baseline");
            group
                .save_task(
                    "c-1",
                    &TaskRecord {
                        bundle,
                        container_name: Some("trainer".into()),
                        sandbox: false,
                        resources: Some(testutil::resources(json!({"cpu": {"cpus": cpus}}))),
                        pid: None,
                    },
                )
                .expect("task");
            group
                .save_label_baseline(&LabelBaseline {
                    node: NodeLabels::from_value(&fixture("node.json")).expect("node"),
                    pod: PodPlacement::from_value(&pod_object()).expect("pod"),
                })
                .expect("label baseline");
            Self {
                dir,
                state,
                group,
                config,
                api,
            }
        }

        /// What the API server answers from now on.
        fn serve(&self, node: Value, pod: Value) {
            let (_, objects) = self.api.as_ref().expect("an API server");
            *objects.lock().unwrap_or_else(|e| e.into_inner()) = (node, pod);
        }

        fn diagnose(&self) -> Result<Diagnosis, String> {
            gather("ml", "gpu-pod", &self.state, Some(self.config.clone()))
        }
    }

    fn statuses(d: &Diagnosis) -> [Status; 3] {
        [d.node_labels.status, d.affinity.status, d.topology.status]
    }

    #[test]
    fn a_healthy_pod_holds_all_three_exit_0() {
        let p = Pod::new("1", true);
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(statuses(&d), [Status::Ok; 3], "{d:#?}");
        assert_eq!(d.status.exit_code(), 0);
        assert!(d.node_labels.changed.is_empty());
        assert!(
            d.node_labels
                .summary
                .starts_with("unchanged since admission"),
            "{}",
            d.node_labels.summary
        );
        assert!(d.affinity.summary.starts_with("holds on node kata-topo-vm: its nodeSelector (1 label(s)) and required term 0 of 1 match"), "{}", d.affinity.summary);
        let c = &d.topology.containers[0];
        assert_eq!((c.name.as_str(), c.task_id.as_str()), ("trainer", "c-1"));
        let placement = c.placement.as_ref().expect("placement");
        assert_eq!(placement.cpu_nodes.to_string(), "1");
        assert_eq!(placement.devices[0].bus_id.to_string(), "0000:b7:00.0");
        assert_eq!(d.pod.uid.as_deref(), Some("uid-1"));
        assert_eq!(d.pod.node.as_deref(), Some("kata-topo-vm"));
        assert!(d.kubernetes.read);
        assert_eq!(d.kubernetes.runtime_class.as_deref(), Some("kata-topo"));
        // The JSON starts with its schema, and each question has its status.
        let v = serde_json::to_value(&d).expect("JSON");
        assert_eq!(v["schema"], "kata-topo.io/diagnose/v1");
        assert_eq!(v["status"], "ok");
        for q in ["node_labels", "affinity", "topology"] {
            assert_eq!(v[q]["status"], "ok", "{q}");
        }
        // People read one line per question first.
        let lines = human::lines(&d);
        assert!(
            lines[0]
                .starts_with("pod ml/gpu-pod on node kata-topo-vm (sandbox sb-1): all three hold"),
            "{lines:#?}"
        );
        assert!(lines[1].starts_with("node labels: unchanged"));
        assert!(lines[2].starts_with("affinity: holds"));
        assert!(
            lines[3].starts_with("topology: holds: container trainer on CPUs 1 (node 1)"),
            "{}",
            lines[3]
        );
        assert!(lines[4].starts_with("kubernetes: phase Running"));
    }

    #[test]
    fn a_moved_label_is_named_with_when_it_was_first_seen_and_the_failing_term() {
        let p = Pod::new("1", true);
        p.serve(fixture("node-relabelled.json"), pod_object());
        let mut seen = LabelsSeen::default();
        seen.changes.insert(
            "kata-topo.io/nic".into(),
            LabelSeen {
                from: Some("mlx5".into()),
                to: Some("e810".into()),
                first_seen: 1_790_000_000,
            },
        );
        p.group.save_labels_seen(&seen).expect("seen");
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(
            statuses(&d),
            [Status::Finding, Status::Finding, Status::Ok],
            "{d:#?}"
        );
        assert_eq!(d.status.exit_code(), 1);
        let nic = &d.node_labels.changed[0];
        assert_eq!(nic.key, "kata-topo.io/nic");
        assert_eq!(
            (nic.from.as_deref(), nic.to.as_deref()),
            (Some("mlx5"), Some("e810"))
        );
        assert!(nic.named_by_pod);
        assert_eq!(nic.first_seen.as_deref(), Some("2026-09-21T14:13:20Z"));
        assert!(
            d.node_labels.summary.contains(
                "kata-topo.io/nic \"mlx5\" -> \"e810\" (first seen by kata-topo 2026-09-21T14:13:20Z)"
            ),
            "{}",
            d.node_labels.summary
        );
        assert!(
            d.affinity
                .summary
                .contains("term 0: kata-topo.io/nic In [\"mlx5\"] fails: the node has \"e810\""),
            "{}",
            d.affinity.summary
        );
        assert!(
            d.affinity.summary.contains("ReplicaSet nic-bound-7c9d4"),
            "{}",
            d.affinity.summary
        );
    }

    #[test]
    fn a_change_no_request_saw_yet_is_first_seen_now_and_other_labels_are_information() {
        let p = Pod::new("1", true);
        let mut node = fixture("node.json");
        node["metadata"]["labels"]["feature.node.kubernetes.io/cpu-cores"] = json!("8");
        node["metadata"]["labels"]["example.com/unrelated"] = json!("x");
        p.serve(node, pod_object());
        let d = p.diagnose().expect("diagnosed");
        // cpu-cores is named by the pod (still holds); the other is not the pod's.
        assert_eq!(
            statuses(&d),
            [Status::Finding, Status::Ok, Status::Ok],
            "{d:#?}"
        );
        let cores = d
            .node_labels
            .changed
            .iter()
            .find(|c| c.key.ends_with("cpu-cores"))
            .expect("cores");
        assert_eq!(cores.first_seen, None);
        assert!(
            d.node_labels
                .summary
                .contains("first seen now: no request read the node since"),
            "{}",
            d.node_labels.summary
        );
        assert!(
            d.node_labels
                .summary
                .ends_with("; 1 other label(s) the pod does not name changed"),
            "{}",
            d.node_labels.summary
        );
        let other = d
            .node_labels
            .changed
            .iter()
            .find(|c| c.key == "example.com/unrelated")
            .expect("other");
        assert!(!other.named_by_pod && other.from.is_none());
        // Only a label the pod does not name: unchanged for the pod.
        let mut node = fixture("node.json");
        node["metadata"]["labels"]["example.com/unrelated"] = json!("x");
        p.serve(node, pod_object());
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(statuses(&d), [Status::Ok; 3], "{d:#?}");
    }

    #[test]
    fn a_preferred_term_lost_is_information_and_the_affinity_still_holds() {
        let p = Pod::new("1", true);
        let mut node = fixture("node.json");
        node["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("rack-b");
        p.serve(node, pod_object());
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(d.affinity.status, Status::Ok, "{d:#?}");
        assert_eq!(d.affinity.preferred_lost.len(), 1);
        assert!(
            d.affinity.preferred_lost[0].contains("preferred term 0 (weight 50)"),
            "{:?}",
            d.affinity.preferred_lost
        );
        assert!(
            d.affinity
                .summary
                .ends_with("; 1 preferred term(s) no longer match"),
            "{}",
            d.affinity.summary
        );
    }

    #[test]
    fn a_pod_without_placement_constraints_holds() {
        let p = Pod::new("1", true);
        let mut pod = pod_object();
        pod["spec"]["nodeSelector"] = json!({});
        pod["spec"]["affinity"] = json!({});
        p.serve(fixture("node.json"), pod);
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(d.affinity.status, Status::Ok);
        assert_eq!(
            d.affinity.summary,
            "holds: the pod has no nodeSelector and no node affinity"
        );
    }

    #[test]
    fn a_container_moved_across_nodes_is_a_topology_finding() {
        let p = Pod::new("0", true);
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(
            statuses(&d),
            [Status::Ok, Status::Ok, Status::Finding],
            "{d:#?}"
        );
        let rules: Vec<String> = d.topology.containers[0]
            .findings
            .iter()
            .map(|f| f.rule.to_string())
            .collect();
        assert!(
            rules.contains(&"cpu-outside-intent".to_string())
                && rules.contains(&"vfio-remote".to_string()),
            "{rules:?}"
        );
        assert!(
            d.topology
                .summary
                .starts_with("does not hold: container trainer: error cpu-outside-intent"),
            "{}",
            d.topology.summary
        );
        // Where it is and where it was, both.
        let c = &d.topology.containers[0];
        assert_eq!(
            c.placement
                .as_ref()
                .map(|b| b.cpu_nodes.to_string())
                .as_deref(),
            Some("0")
        );
        assert_eq!(
            c.baseline
                .as_ref()
                .map(|b| b.cpu_nodes.to_string())
                .as_deref(),
            Some("1")
        );
        assert_eq!(c.intent_source, "annotations");
    }

    #[test]
    fn a_refused_recreate_and_its_kubernetes_story_are_told() {
        let p = Pod::new("1", true);
        // The wrapper refused container trainer's recreate: its verdict kept, no task.
        let spec = testutil::spec()
            .cpus("0")
            .device("/dev/vfio/42")
            .nodes("1")
            .annotation("kata-topo.io/mode", "enforce");
        let host = scenario_host();
        let baseline = p
            .group
            .container_baseline("trainer")
            .expect("read")
            .expect("baseline");
        let refused = Checker::new(&host, None, p.config.defaults())
            .recreate(&Request::new(&spec.build()), &baseline);
        assert_eq!(refused.decision(), Decision::Reject, "{refused:#?}");
        p.group.save_verdict("c-2", &refused).expect("verdict");
        let mut pod = pod_object();
        pod["status"]["containerStatuses"] = json!([{"name": "trainer", "restartCount": 3,
            "state": {"waiting": {"reason": "CreateContainerError", "message": refused.refusal()}},
            "lastState": {"terminated": {"reason": "Error", "exitCode": 137, "finishedAt": "2026-12-01T10:05:00Z"}}}]);
        pod["status"]["conditions"] = json!([{"type": "PodResizeInProgress", "status": "True", "reason": "Error",
            "message": "kata-topo refused the update of container trainer in pod ml/gpu-pod"},
            {"type": "Ready", "status": "False"}]);
        p.serve(fixture("node.json"), pod);
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(d.topology.status, Status::Finding, "{d:#?}");
        assert_eq!(d.topology.refused.len(), 1);
        assert!(
            d.topology
                .summary
                .contains("refused recreate of container trainer: cpu-outside-intent"),
            "{}",
            d.topology.summary
        );
        let c = &d.kubernetes.containers[0];
        assert_eq!(c.restarts, 3);
        assert_eq!(
            (c.state.as_str(), c.reason.as_deref()),
            ("waiting", Some("CreateContainerError"))
        );
        assert!(c.refused_by_kata_topo);
        assert_eq!(
            c.last_termination.as_deref(),
            Some("Error, exit code 137, at 2026-12-01T10:05:00Z")
        );
        assert_eq!(d.kubernetes.resize.len(), 1);
        assert!(d.kubernetes.resize[0].refused_by_kata_topo);
        let lines = human::lines(&d);
        assert!(
            lines[4].contains("container trainer restarted 3 time(s)")
                && lines[4].contains(
                    "container trainer waiting CreateContainerError (kata-topo refused it)"
                )
                && lines[4]
                    .contains("resize pending (PodResizeInProgress Error), refused by kata-topo"),
            "{}",
            lines[4]
        );
    }

    #[test]
    fn without_the_api_server_the_labels_and_the_affinity_cannot_be_told_exit_2() {
        let p = Pod::new("1", false);
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(
            statuses(&d),
            [Status::Unknown, Status::Unknown, Status::Ok],
            "{d:#?}"
        );
        assert_eq!(d.status.exit_code(), 2);
        assert!(
            d.node_labels
                .summary
                .contains("the API server is not read: kubeconfig is set to \"\""),
            "{}",
            d.node_labels.summary
        );
        assert!(!d.kubernetes.read);
        // A finding still wins over what cannot be told.
        let p = Pod::new("0", false);
        assert_eq!(p.diagnose().expect("diagnosed").status.exit_code(), 1);
    }

    #[test]
    fn an_api_server_that_refuses_is_said_in_the_answers() {
        let p = Pod::new("1", true);
        p.serve(json!({"kind": "Status"}), json!({"kind": "Status"}));
        let d = p.diagnose().expect("diagnosed");
        assert_eq!(d.node_labels.status, Status::Unknown);
        assert!(
            d.node_labels
                .summary
                .contains("the node was not read: the API server's answer is not usable"),
            "{}",
            d.node_labels.summary
        );
    }

    #[test]
    fn no_label_baseline_and_no_host_topology_cannot_be_told() {
        let p = Pod::new("1", true);
        std::fs::remove_file(p.group.dir().join("node-labels.json")).expect("remove");
        let mut config = p.config.clone();
        config.topology_xml = Some(p.dir.path().join("missing.xml"));
        // The wrapper's configuration file names the topology; this one is read.
        let file = p.dir.path().join("kt.toml");
        let text = std::fs::read_to_string(&file).expect("config").replace(
            concat!(env!("CARGO_MANIFEST_DIR"), "/../scenario/two-node-host.xml"),
            &p.dir.path().join("missing.xml").display().to_string(),
        );
        std::fs::write(&file, text).expect("config");
        let d = gather("ml", "gpu-pod", &p.state, Some(config)).expect("diagnosed");
        assert_eq!(d.node_labels.status, Status::Unknown);
        assert!(
            d.node_labels.summary.contains("kept no label baseline"),
            "{}",
            d.node_labels.summary
        );
        // The live Pod still gives the placement.
        assert_eq!(d.affinity.status, Status::Ok);
        assert_eq!(d.topology.status, Status::Unknown);
        assert!(
            d.topology
                .summary
                .starts_with("cannot tell: the host topology could not be read"),
            "{}",
            d.topology.summary
        );
    }

    #[test]
    fn a_pod_kata_topo_does_not_watch_cannot_be_told_in_one_line() {
        let p = Pod::new("1", false);
        let e =
            gather("ml", "other-pod", &p.state, Some(p.config.clone())).expect_err("not its pod");
        assert!(
            e.starts_with("kata-topo holds no state for it on this node (state directory "),
            "{e}"
        );
        assert!(!e.contains('\n'));
        let e = gather("ml", "gpu-pod", &p.dir.path().join("none"), None).expect_err("no state");
        assert!(e.contains("holds no state"), "{e}");
    }

    #[test]
    fn an_earlier_pod_of_the_same_name_is_not_this_one() {
        let p = Pod::new("1", true);
        let mut pod = pod_object();
        pod["metadata"]["uid"] = json!("uid-2");
        p.serve(fixture("node.json"), pod);
        let e = p.diagnose().expect_err("another pod");
        assert!(
            e.contains("earlier pod of that name (uid uid-1)") && e.contains("uid uid-2"),
            "{e}"
        );
    }
}
