//! What one request is about, worked out once before any rule runs: the policy and mode in
//! force, the resources the container will have, the NUMA nodes it may use and what says so,
//! where its CPUs are, and its VFIO devices as sysfs shows them now. The rules read it; none
//! of them works any of it out again.

use std::borrow::Cow;
use std::fmt;

use crate::check::intent::{Baseline, Intent, IntentOrigin, KubeletIntent};
use crate::check::policy::{Mode, Policy};
use crate::check::rule::Finding;
use crate::check::verdict::{Operation, UpdateClass};
use crate::host::Host;
use crate::idset::IdSet;
use crate::input::affinity::{NodeLabels, NodeView, PodPlacement};
use crate::input::kata::KataConfig;
use crate::input::kubelet::KubeletView;
use crate::input::spec::{ContainerKind, ContainerSpec, Resources};
use crate::vm::VmView;

use super::devices::Device;
use super::{Checker, Phase, Request};

/// The NUMA nodes a container may use, and what says so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Allowed {
    /// The nodes.
    pub(super) nodes: IdSet,
    /// Where they come from (messages name it).
    pub(super) source: AllowedBy,
}

/// What names a container's allowed nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AllowedBy {
    /// The pod's `kata-topo.io/numa-nodes` annotation.
    Annotation,
    /// The container's baseline: its CPUs' nodes and memory nodes at its first create.
    Baseline,
    /// What the kubelet's Topology Manager admitted.
    Kubelet,
}

impl fmt::Display for AllowedBy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Annotation => "the pod's kata-topo.io/numa-nodes",
            Self::Baseline => "the baseline",
            Self::Kubelet => "the kubelet's admission",
        })
    }
}

/// The container's cpuset (as the request leaves it) and where it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Cpus {
    /// The cpuset.
    pub(super) set: IdSet,
    /// Its CPUs the host has online.
    pub(super) online: IdSet,
    /// Their home NUMA nodes.
    pub(super) nodes: IdSet,
}

/// What the API server said of the pod and its node for this request: the pod's
/// nodeSelector and node affinity (they cannot change once it is bound), its node now, and its
/// node at the pod's first create.
#[derive(Debug, Clone, Copy)]
pub(super) struct NodeFit<'r> {
    /// The pod's placement.
    pub(super) pod: &'r PodPlacement,
    /// The node now.
    pub(super) node: &'r NodeLabels,
    /// The label baseline; `None` when this read is the first (it becomes it).
    pub(super) baseline: Option<&'r NodeLabels>,
}

/// One request and what it is about.
#[derive(Debug)]
pub(super) struct Context<'r> {
    /// The host it is checked against.
    pub(super) host: &'r Host,
    /// The container's OCI spec.
    pub(super) spec: &'r ContainerSpec,
    /// The baseline the container is held to, if one was recorded (its first create's).
    pub(super) baseline: Option<&'r Baseline>,
    /// Kata's configuration as it applies to the pod (the node's, with the pod's
    /// `io.katacontainers.config.*` annotations), for the Kata rules.
    pub(super) kata: Option<KataConfig>,
    /// What the VM actually got, judged by the VM rules: the request's, or what the phase
    /// observed.
    pub(super) vm: Option<&'r VmView>,
    /// The VM the container runs in, read before an update: the vCPUs static sizing keeps
    /// (default: `vm`).
    pub(super) running_vm: Option<&'r VmView>,
    /// The pod's node affinity and its node, when the API server was read.
    pub(super) node_fit: Option<NodeFit<'r>>,
    /// Why the API server, asked, gave no node.
    pub(super) node_unavailable: Option<&'r str>,
    /// The policy in force: the CLI's override, else the pod's annotation, else the default.
    pub(super) policy: Policy,
    /// The mode in force, likewise.
    pub(super) mode: Mode,
    /// What is checked (the phase's operation).
    pub(super) operation: Operation,
    /// For an update, what it changes (the phase's class).
    pub(super) class: Option<UpdateClass>,
    /// The resources in force before the request: a running container's, else the spec's.
    pub(super) current: &'r Resources,
    /// The resources the container has if the request goes through.
    pub(super) effective: Cow<'r, Resources>,
    /// The NUMA nodes the container may use: the pod's annotation, else its baseline's nodes.
    pub(super) allowed: Option<Allowed>,
    /// The effective cpuset and where it runs; `None` when the container has no cpuset.
    pub(super) cpus: Option<Cpus>,
    /// The spec's VFIO devices, resolved against sysfs and the host.
    pub(super) devices: Vec<Device>,
    /// Where the intent came from.
    pub(super) origin: IntentOrigin,
    /// What the kubelet admitted, when it is the source.
    pub(super) kubelet: Option<KubeletIntent>,
    /// Why the kubelet, asked, gave no intent.
    pub(super) kubelet_unavailable: Option<String>,
}

impl<'r> Context<'r> {
    /// Works out what `req` is about in `phase`, and returns with it the findings about the
    /// pod's intent (invalid annotations, whose defaults then stand in).
    pub(super) fn new(
        checker: &Checker<'r>,
        req: &Request<'r>,
        phase: &Phase<'r>,
    ) -> (Self, Vec<Finding>) {
        let host = checker.host;
        let spec = req.spec;
        let baseline = phase.baseline();
        let baseline_nodes = baseline.map(Baseline::nodes).filter(|n| !n.is_empty());
        // The kubelet's admission, when it was asked and lists the container, is the intent:
        // its Topology Manager policy is the default, its nodes what the annotations narrow.
        let (kubelet, kubelet_unavailable) = match req.kubelet {
            Some(KubeletView::Admitted { pod, settings }) => {
                let container = match spec.kind {
                    ContainerKind::Sandbox => None,
                    _ => spec.container_name.as_deref(),
                };
                // A container the kubelet gave nothing of its own to align (the shared pool:
                // no exclusive CPUs, memory or devices, scope `container`) was not placed by
                // the Topology Manager, whose policy then does not apply to it (the real
                // kubelet admits such a container on every CPU of the pool, across nodes).
                let admitted = KubeletIntent::resolve(pod, settings, container, host).filter(|k| {
                    k.numa_nodes.is_some() || k.cpus.is_some() || !k.devices.is_empty()
                });
                (admitted, None)
            }
            Some(KubeletView::Unavailable { reason }) => (None, Some(reason.clone())),
            None => (None, None),
        };
        // The API server's answer, when it was asked: the pod's node affinity on its node.
        let (node_fit, node_unavailable) = match req.node {
            Some(NodeView::Read {
                pod,
                node,
                baseline,
            }) => (
                Some(NodeFit {
                    pod,
                    node,
                    baseline: baseline.as_ref(),
                }),
                None,
            ),
            Some(NodeView::Unavailable { reason }) => (None, Some(reason.as_str())),
            None => (None, None),
        };
        let defaults = match &kubelet {
            Some(k) => super::Defaults {
                policy: k.settings.topology_manager_policy,
                ..checker.defaults
            },
            None => checker.defaults,
        };
        let reference = match (&kubelet, &baseline_nodes) {
            (
                Some(KubeletIntent {
                    numa_nodes: Some(n),
                    ..
                }),
                _,
            ) => Some((n, IntentOrigin::Kubelet)),
            (_, Some(b)) => Some((b, IntentOrigin::Baseline)),
            _ => None,
        };
        let (intent, invalid) = Intent::over(&spec.annotations, &defaults, reference, host);
        let running = phase.running();
        let current = running.and_then(|r| r.current).unwrap_or(&spec.resources);
        let effective = match phase {
            Phase::Update(update) => Cow::Owned(current.merged(update.resources)),
            Phase::Observe(..) => Cow::Borrowed(current),
            Phase::Admit | Phase::Recreate(_) => Cow::Borrowed(&spec.resources),
        };
        let (vm, running_vm) = match phase {
            Phase::Observe(_, seen) => (Some(*seen), None),
            _ => (req.vm, running.and_then(|r| r.vm)),
        };
        let kubelet_nodes = kubelet.as_ref().and_then(|k| k.numa_nodes.clone());
        let allowed = match (intent.numa_nodes, kubelet_nodes, baseline_nodes) {
            (Some(nodes), _, _) => Some(Allowed {
                nodes,
                source: AllowedBy::Annotation,
            }),
            (None, Some(nodes), _) => Some(Allowed {
                nodes,
                source: AllowedBy::Kubelet,
            }),
            (None, None, Some(nodes)) => Some(Allowed {
                nodes,
                source: AllowedBy::Baseline,
            }),
            _ => None,
        };
        let origin = match (&kubelet, &allowed) {
            (Some(_), _) => IntentOrigin::Kubelet,
            (
                None,
                Some(Allowed {
                    source: AllowedBy::Baseline,
                    ..
                }),
            ) => IntentOrigin::Baseline,
            _ => IntentOrigin::Annotations,
        };
        let cpus = effective.cpus.as_ref().map(|set| {
            let online = set.intersection(&host.online_cpus);
            Cpus {
                set: set.clone(),
                nodes: host.nodes_of_cpus(&online),
                online,
            }
        });
        let cx = Self {
            host,
            spec,
            baseline,
            kata: req.pod_kata(),
            vm,
            running_vm,
            node_fit,
            node_unavailable,
            policy: req.overrides.policy.unwrap_or(intent.policy),
            mode: req.overrides.mode.unwrap_or(intent.mode),
            operation: phase.operation(spec),
            class: phase.class(),
            current,
            effective,
            allowed,
            cpus,
            devices: checker.resolve_all(spec),
            origin,
            kubelet,
            kubelet_unavailable,
        };
        (cx, invalid)
    }

    /// The allowed nodes, if any.
    pub(super) fn allowed_nodes(&self) -> Option<&IdSet> {
        self.allowed.as_ref().map(|a| &a.nodes)
    }

    /// The home nodes of the container's CPUs, when it has a cpuset with online CPUs.
    pub(super) fn cpu_nodes(&self) -> Option<&IdSet> {
        self.cpus
            .as_ref()
            .map(|c| &c.nodes)
            .filter(|n| !n.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::intent::{Baseline, BASELINE_VERSION};
    use crate::check::policy::Defaults;
    use crate::check::{Overrides, Running, Update};
    use crate::host::TopologySource;
    use crate::input::spec::ContainerSpec;

    fn host(name: &str) -> Host {
        let xml = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hwloc/xml")
            .join(name);
        Host::load(&TopologySource::Xml(xml)).expect("fixture loads")
    }

    fn spec(cpus: &str, annotations: serde_json::Value) -> ContainerSpec {
        let json = serde_json::json!({
            "ociVersion": "1.0.2",
            "annotations": annotations,
            "linux": {"resources": {"cpu": {"cpus": cpus}}}
        });
        ContainerSpec::from_json(json.to_string().as_bytes()).expect("spec")
    }

    fn baseline(cpu_nodes: &str, mems: Option<&str>) -> Baseline {
        Baseline {
            version: BASELINE_VERSION,
            sandbox_id: None,
            container_name: None,
            cpus: None,
            mems: mems.map(|m| m.parse().expect("set")),
            cpu_nodes: cpu_nodes.parse().expect("set"),
            devices: Vec::new(),
            topology_fingerprint: String::new(),
        }
    }

    #[test]
    fn the_annotation_names_the_allowed_nodes_before_the_baseline() {
        let host = host("nvidiaDGX2.xml");
        let checker = Checker::new(&host, None, Defaults::default());
        let annotated = spec("0-1", serde_json::json!({"kata-topo.io/numa-nodes": "1"}));
        let plain = spec("0-1", serde_json::json!({}));
        let placed = baseline("0", Some("0-1"));
        let empty = baseline("", None);
        let allowed = |spec: &ContainerSpec, baseline: Option<&Baseline>| {
            let phase = match baseline {
                Some(b) => Phase::Recreate(b),
                None => Phase::Admit,
            };
            Context::new(&checker, &Request::new(spec), &phase)
                .0
                .allowed
        };
        let by = |nodes: &str, source| {
            Some(Allowed {
                nodes: nodes.parse().expect("set"),
                source,
            })
        };
        assert_eq!(
            allowed(&annotated, Some(&placed)),
            by("1", AllowedBy::Annotation)
        );
        // The baseline's CPU nodes and memory nodes together.
        assert_eq!(
            allowed(&plain, Some(&placed)),
            by("0-1", AllowedBy::Baseline)
        );
        assert_eq!(allowed(&plain, Some(&empty)), None);
        assert_eq!(allowed(&plain, None), None);
        assert_eq!(
            AllowedBy::Annotation.to_string(),
            "the pod's kata-topo.io/numa-nodes"
        );
        assert_eq!(AllowedBy::Baseline.to_string(), "the baseline");
    }

    #[test]
    fn an_update_is_checked_as_the_container_will_be() {
        let host = host("nvidiaDGX2.xml");
        // A node that lets pods weaken its policy: the pod's `none` applies.
        let any = Defaults {
            pod_overrides: crate::check::policy::PodOverrides::Any,
            ..Defaults::default()
        };
        let checker = Checker::new(&host, None, any);
        let s = spec("0-1", serde_json::json!({"kata-topo.io/policy": "none"}));
        let push = Resources::from_json(br#"{"cpu": {"cpus": "24-25"}}"#).expect("update");
        let req = Request {
            overrides: Overrides {
                policy: None,
                mode: Some(Mode::Enforce),
            },
            ..Request::new(&s)
        };
        let update = Update::new(&s, Running::default(), &push);
        let (cx, invalid) = Context::new(&checker, &req, &Phase::Update(update));
        assert!(invalid.is_empty());
        assert_eq!(cx.operation, Operation::Update);
        assert_eq!(cx.class, Some(UpdateClass::Cpuset));
        assert_eq!((cx.policy, cx.mode), (Policy::None, Mode::Enforce));
        assert_eq!(cx.current, &s.resources);
        let cpus = cx.cpus.as_ref().expect("a cpuset");
        assert_eq!(cpus.set.to_string(), "24-25");
        assert_eq!(
            cx.cpu_nodes().map(ToString::to_string).as_deref(),
            Some("1")
        );
    }

    #[test]
    fn offline_cpus_have_no_home_node() {
        let host = host("16em64t-4s2c2t-offlines.xml");
        let checker = Checker::new(&host, None, Defaults::default());
        let s = spec("2", serde_json::json!({"kata-topo.io/policy": "bogus"}));
        let (cx, invalid) = Context::new(&checker, &Request::new(&s), &Phase::Admit);
        assert_eq!(invalid.len(), 1, "{invalid:?}");
        assert_eq!(cx.operation, Operation::Create);
        assert_eq!(cx.policy, Policy::Restricted);
        let cpus = cx.cpus.as_ref().expect("a cpuset");
        assert!(cpus.online.is_empty() && cpus.nodes.is_empty(), "{cpus:?}");
        // The cpuset is there (the memory rule compares against it); its nodes are not.
        assert_eq!(cx.cpu_nodes(), None);
        let mut unpinned = s.clone();
        unpinned.resources.cpus = None;
        let (cx, _) = Context::new(&checker, &Request::new(&unpinned), &Phase::Admit);
        assert_eq!((&cx.cpus, cx.cpu_nodes()), (&None, None));
    }
}
