//! What a pod wants: its policy, mode and allowed NUMA nodes (annotations), and the baseline it
//! got at its first create.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::check::policy::{ChoiceError, Defaults, Mode, PodOverrides, Policy};
use crate::check::rule::{Finding, Rule, Severity};
use crate::host::pci::Bdf;
use crate::host::Host;
use crate::idset::IdSet;
use crate::input::kubelet::{
    ContainerAdmission, DeviceAdmission, KubeletSettings, PodAdmission, TopologyScope,
};

/// Annotation: the Topology Manager policy applied to updates.
pub const ANNOTATION_POLICY: &str = "kata-topo.io/policy";
/// Annotation: the allowed NUMA nodes, list syntax.
pub const ANNOTATION_NUMA_NODES: &str = "kata-topo.io/numa-nodes";
/// Annotation: `audit` or `enforce` for this pod.
pub const ANNOTATION_MODE: &str = "kata-topo.io/mode";

/// The `override-ignored` finding for an annotation that does not apply: what it asked, what
/// applies instead, and the setting that decided.
fn ignored(key: &str, value: &str, applies: serde_json::Value, overrides: PodOverrides) -> Finding {
    let shown: String = value.chars().take(64).collect();
    Finding {
        rule: Rule::OverrideIgnored,
        severity: Severity::Warning,
        message: format!(
            "annotation {key}={shown:?} is ignored: {}; {applies} applies \
             (pod_overrides = \"{overrides}\" in the node's [topology_guard])",
            overrides.refusal()
        ),
        expected: json!({"annotation": key, "applies": applies, "pod_overrides": overrides.to_string()}),
        observed: json!({"annotation": key, "value": shown}),
    }
}

/// The pod's intent, resolved from annotations over configured defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intent {
    /// The policy applied.
    pub policy: Policy,
    /// The mode applied.
    pub mode: Mode,
    /// The allowed NUMA nodes, when the pod names them.
    pub numa_nodes: Option<IdSet>,
}

impl Intent {
    /// Reads the three annotations over the node's configuration (`defaults`). An invalid
    /// value is never ignored: it becomes an `intent-invalid` error finding naming the
    /// annotation and the value, and the default stands in for it. Nodes the host does not
    /// have are invalid too. A valid value applies only as far as `defaults.pod_overrides`
    /// allows (see [`PodOverrides`]; `baseline_nodes` are the nodes the container's baseline
    /// allows); one that does not is ignored with an `override-ignored` finding.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        defaults: &Defaults,
        baseline_nodes: Option<&IdSet>,
        host: &Host,
    ) -> (Self, Vec<Finding>) {
        Self::over(
            annotations,
            defaults,
            baseline_nodes.map(|n| (n, IntentOrigin::Baseline)),
            host,
        )
    }

    /// [`Intent::from_annotations`] over the nodes another source allows (the kubelet's
    /// admission or the baseline): a `kata-topo.io/numa-nodes` is stricter when it is a subset
    /// of them, and an ignored one names that source.
    pub fn over(
        annotations: &BTreeMap<String, String>,
        defaults: &Defaults,
        reference: Option<(&IdSet, IntentOrigin)>,
        host: &Host,
    ) -> (Self, Vec<Finding>) {
        let baseline_nodes = reference.map(|(n, _)| n);
        let mut findings = Vec::new();
        let mut invalid = |key: &str, value: &str, why: String| {
            let shown: String = value.chars().take(64).collect();
            findings.push(Finding {
                rule: Rule::IntentInvalid,
                severity: Severity::Error,
                message: format!(
                    "annotation {key}={shown:?} is invalid: {why}; fix the pod's annotation \
                     (until then the default applies)"
                ),
                expected: json!({"annotation": key, "valid": why}),
                observed: json!({"annotation": key, "value": shown}),
            });
        };
        let policy = match annotations.get(ANNOTATION_POLICY) {
            None => None,
            Some(v) => v
                .parse()
                .map_err(|e: ChoiceError| {
                    invalid(
                        ANNOTATION_POLICY,
                        v,
                        format!("expected one of {}", e.expected),
                    );
                })
                .ok(),
        };
        let mode = match annotations.get(ANNOTATION_MODE) {
            None => None,
            Some(v) => v
                .parse()
                .map_err(|e: ChoiceError| {
                    invalid(
                        ANNOTATION_MODE,
                        v,
                        format!("expected one of {}", e.expected),
                    );
                })
                .ok(),
        };
        let numa_nodes = match annotations.get(ANNOTATION_NUMA_NODES) {
            None => None,
            Some(v) => match IdSet::parse(v) {
                Err(e) => {
                    invalid(
                        ANNOTATION_NUMA_NODES,
                        v,
                        format!("expected a node list like 0 or 0-1 ({e})"),
                    );
                    None
                }
                Ok(set) if set.is_empty() => {
                    invalid(
                        ANNOTATION_NUMA_NODES,
                        v,
                        "expected at least one NUMA node".into(),
                    );
                    None
                }
                Ok(set) => {
                    let unknown = set.difference(&host.node_ids());
                    if unknown.is_empty() {
                        Some(set)
                    } else {
                        invalid(
                            ANNOTATION_NUMA_NODES,
                            v,
                            format!(
                                "the host has no NUMA node {unknown} (it has {})",
                                host.node_ids()
                            ),
                        );
                        None
                    }
                }
            },
        };
        let (policy, mode, mut ignored_findings) = Self::within(policy, mode, defaults);
        let overrides = defaults.pod_overrides;
        let numa_nodes = match numa_nodes {
            None => None,
            Some(set) => {
                let stricter = baseline_nodes.is_none_or(|b| set.is_subset(b));
                let same = baseline_nodes == Some(&set);
                if overrides.allows(stricter) {
                    Some(set)
                } else {
                    if !same {
                        let applies = match baseline_nodes {
                            Some(b) => json!({
                                "numa_nodes": b,
                                "from": match reference.map(|(_, o)| o) {
                                    Some(IntentOrigin::Kubelet) => "the kubelet's admission",
                                    _ => "the baseline",
                                }
                            }),
                            None => json!({"numa_nodes": "any"}),
                        };
                        ignored_findings.push(ignored(
                            ANNOTATION_NUMA_NODES,
                            &set.to_string(),
                            applies,
                            overrides,
                        ));
                    }
                    None
                }
            }
        };
        findings.append(&mut ignored_findings);
        (
            Self {
                policy,
                mode,
                numa_nodes,
            },
            findings,
        )
    }

    /// The policy and mode in force when a pod asks for these (valid) values: each applies
    /// as far as `defaults.pod_overrides` allows, else the configured one stands and an
    /// `override-ignored` finding says so.
    pub fn within(
        policy: Option<Policy>,
        mode: Option<Mode>,
        defaults: &Defaults,
    ) -> (Policy, Mode, Vec<Finding>) {
        let overrides = defaults.pod_overrides;
        let mut findings = Vec::new();
        let policy = match policy {
            Some(p)
                if overrides.allows(crate::check::rule::at_least_as_strict(p, defaults.policy)) =>
            {
                p
            }
            // Asking for what is configured anyway changes nothing: nothing to say.
            Some(p) if p == defaults.policy => p,
            Some(p) => {
                findings.push(ignored(
                    ANNOTATION_POLICY,
                    &p.to_string(),
                    json!({"policy": defaults.policy.to_string()}),
                    overrides,
                ));
                defaults.policy
            }
            None => defaults.policy,
        };
        let mode = match mode {
            Some(m) if overrides.allows(m >= defaults.mode) || m == defaults.mode => m,
            Some(m) => {
                findings.push(ignored(
                    ANNOTATION_MODE,
                    &m.to_string(),
                    json!({"mode": defaults.mode.to_string()}),
                    overrides,
                ));
                defaults.mode
            }
            None => defaults.mode,
        };
        (policy, mode, findings)
    }
}

/// Where a check's intent came from (`intent_source` in verdicts and log lines).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum IntentOrigin {
    /// What the kubelet's Topology Manager admitted (PodResources), under the kubelet's
    /// Topology Manager policy; the pod's annotations apply over it within `pod_overrides`.
    Kubelet,
    /// The pod's `kata-topo.io/*` annotations over the node's configuration.
    #[default]
    Annotations,
    /// The container's first placement, its baseline.
    Baseline,
}

impl fmt::Display for IntentOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Kubelet => "kubelet",
            Self::Annotations => "annotations",
            Self::Baseline => "baseline",
        })
    }
}

/// What the kubelet admitted, as one request's check applies it: the container's exclusive
/// CPUs, memory nodes and devices, and the NUMA nodes the Topology Manager aligned — the
/// container's own (scope `container`) or the whole pod's (scope `pod`, and for the sandbox).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletIntent {
    /// The node's kubelet settings (the policy is the Topology Manager's).
    pub settings: KubeletSettings,
    /// The exclusive CPUs the CPU manager assigned the container; `None` for the shared pool
    /// and for the sandbox.
    pub cpus: Option<IdSet>,
    /// The NUMA nodes of the memory the memory manager assigned; `None` when it assigned none.
    pub memory_nodes: Option<IdSet>,
    /// The devices the kubelet allocated the container.
    pub devices: Vec<DeviceAdmission>,
    /// The NUMA nodes the admission aligned to (CPUs' nodes, memory nodes, device hints, over
    /// the scope); `None` when the kubelet pinned nothing there.
    pub numa_nodes: Option<IdSet>,
}

impl KubeletIntent {
    /// What the kubelet admitted for `container` (`None`: the sandbox, the whole pod). `None`
    /// when the kubelet does not list the container (an init container): the annotations and
    /// the baseline then decide, as without the kubelet.
    pub fn resolve(
        pod: &PodAdmission,
        settings: &KubeletSettings,
        container: Option<&str>,
        host: &Host,
    ) -> Option<Self> {
        let nodes_of = |c: &ContainerAdmission| {
            host.nodes_of_cpus(&c.cpu_ids)
                .union(&c.memory_nodes())
                .union(&c.device_nodes())
        };
        let whole_pod = || {
            pod.containers
                .iter()
                .fold(IdSet::new(), |acc, c| acc.union(&nodes_of(c)))
        };
        let non_empty = |s: IdSet| (!s.is_empty()).then_some(s);
        match container {
            None => Some(Self {
                settings: settings.clone(),
                cpus: None,
                memory_nodes: None,
                devices: Vec::new(),
                numa_nodes: non_empty(whole_pod()),
            }),
            Some(name) => {
                let c = pod.container(name)?;
                let numa_nodes = match settings.topology_manager_scope {
                    TopologyScope::Container => nodes_of(c),
                    TopologyScope::Pod => whole_pod(),
                };
                Some(Self {
                    settings: settings.clone(),
                    cpus: non_empty(c.cpu_ids.clone()),
                    memory_nodes: non_empty(c.memory_nodes()),
                    devices: c.devices.clone(),
                    numa_nodes: non_empty(numa_nodes),
                })
            }
        }
    }

    /// What the kubelet reported, as the verdict's and the log line's nested JSON.
    pub fn reported(&self) -> serde_json::Value {
        json!({
            "topology_manager_policy": self.settings.topology_manager_policy.to_string(),
            "topology_manager_policy_from": self.settings.policy_from,
            "topology_manager_scope": self.settings.topology_manager_scope.to_string(),
            "cpu_manager_policy": self.settings.cpu_manager_policy,
            "memory_manager_policy": self.settings.memory_manager_policy,
            "cpus": self.cpus,
            "memory_nodes": self.memory_nodes,
            "devices": self.devices,
            "numa_nodes": self.numa_nodes,
        })
    }
}

/// A VFIO device as the baseline recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BaselineDevice {
    /// The spec's device path (`/dev/vfio/12`).
    pub path: String,
    /// The PCI device behind it.
    pub bus_id: Bdf,
    /// Its NUMA nodes then; `null` when unknown.
    pub numa_nodes: Option<IdSet>,
}

/// What a container got at its first create (KEP-5554's "original CPUs").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Baseline {
    /// Format version.
    pub version: u32,
    pub sandbox_id: Option<String>,
    /// The container name (CRI); the key recreates are matched on.
    pub container_name: Option<String>,
    /// Its cpuset, if it had one.
    pub cpus: Option<IdSet>,
    /// Its `cpuset.mems`, if it had one.
    pub mems: Option<IdSet>,
    /// The home nodes of its CPUs then.
    pub cpu_nodes: IdSet,
    /// Its VFIO devices then.
    pub devices: Vec<BaselineDevice>,
    /// [`Host::fingerprint`] then.
    pub topology_fingerprint: String,
}

/// The current baseline format.
pub const BASELINE_VERSION: u32 = 1;

impl Baseline {
    /// The NUMA nodes the container was placed on: its CPUs' nodes and its memory nodes.
    pub fn nodes(&self) -> IdSet {
        match &self.mems {
            Some(mems) => self.cpu_nodes.union(mems),
            None => self.cpu_nodes.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hostile_text;
    use proptest::prelude::*;
    use std::sync::OnceLock;

    /// A two-node host (nodes 0 and 1) from hwloc's test suite.
    fn host() -> &'static Host {
        static HOST: OnceLock<Host> = OnceLock::new();
        HOST.get_or_init(|| {
            let xml = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/hwloc/xml/24em64t-2n6c2t-pci.xml");
            Host::load(&crate::TopologySource::Xml(xml)).expect("fixture loads")
        })
    }

    const POLICIES: [&str; 4] = ["none", "best-effort", "restricted", "single-numa-node"];
    const MODES: [&str; 2] = ["audit", "enforce"];

    /// A value for a choice annotation: valid, nearly valid, or anything.
    fn choice(valid: &'static [&'static str]) -> impl Strategy<Value = String> {
        prop_oneof![
            3 => prop::sample::select(valid).prop_map(str::to_string),
            1 => prop::sample::select(valid).prop_map(|v| format!("{v} ")),
            1 => prop::sample::select(valid).prop_map(str::to_uppercase),
            2 => hostile_text(100),
        ]
    }

    fn node_list() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::sample::select(vec!["0", "1", "0-1", "0,1", " 1\n"]).prop_map(str::to_string),
            "[0-9,\\- ]{0,12}",
            hostile_text(100),
            Just("0-16383".to_string()),
            Just("7".repeat(200)),
        ]
    }

    fn annotations() -> impl Strategy<Value = BTreeMap<String, String>> {
        (
            proptest::option::of(choice(&POLICIES)),
            proptest::option::of(choice(&MODES)),
            proptest::option::of(node_list()),
            proptest::collection::btree_map(
                prop_oneof![
                    hostile_text(30),
                    Just("kata-topo.io/Policy".to_string()),
                    Just("kata-topo.io/".to_string()),
                    Just("io.kubernetes.cri.sandbox-name".to_string()),
                ],
                hostile_text(30),
                0..4,
            ),
        )
            .prop_map(|(policy, mode, nodes, mut other)| {
                for (key, value) in [
                    (ANNOTATION_POLICY, policy),
                    (ANNOTATION_MODE, mode),
                    (ANNOTATION_NUMA_NODES, nodes),
                ] {
                    match value {
                        Some(v) => {
                            other.insert(key.to_string(), v);
                        }
                        None => {
                            other.remove(key);
                        }
                    }
                }
                other
            })
    }

    proptest! {
        #[test]
        fn annotations_resolve_as_the_model_says(
            a in annotations(),
            default_policy in prop::sample::select(vec![Policy::None, Policy::BestEffort, Policy::Restricted, Policy::SingleNumaNode]),
            default_mode in prop::sample::select(vec![Mode::Audit, Mode::Enforce]),
        ) {
            let host = host();
            // No ceiling: the annotations apply as they are (pod_overrides = "any").
            let defaults = Defaults {
                policy: default_policy,
                mode: default_mode,
                fail_closed: false,
                pod_overrides: PodOverrides::Any,
            };
            let (intent, findings) = Intent::from_annotations(&a, &defaults, None, host);
            let mut invalid = Vec::new();
            let want_policy = match a.get(ANNOTATION_POLICY) {
                None => default_policy,
                Some(v) => match POLICIES.iter().position(|p| p == v) {
                    Some(i) => [Policy::None, Policy::BestEffort, Policy::Restricted, Policy::SingleNumaNode][i],
                    None => { invalid.push(ANNOTATION_POLICY); default_policy }
                },
            };
            let want_mode = match a.get(ANNOTATION_MODE) {
                None => default_mode,
                Some(v) if v == "audit" => Mode::Audit,
                Some(v) if v == "enforce" => Mode::Enforce,
                Some(_) => { invalid.push(ANNOTATION_MODE); default_mode }
            };
            let want_nodes = match a.get(ANNOTATION_NUMA_NODES) {
                None => None,
                Some(v) => match IdSet::parse(v) {
                    Ok(set) if !set.is_empty() && set.is_subset(&host.node_ids()) => Some(set),
                    _ => { invalid.push(ANNOTATION_NUMA_NODES); None }
                },
            };
            prop_assert_eq!(intent.policy, want_policy);
            prop_assert_eq!(intent.mode, want_mode);
            prop_assert_eq!(intent.numa_nodes, want_nodes);
            // One intent-invalid error per invalid annotation, naming it and its value.
            prop_assert_eq!(findings.len(), invalid.len(), "{:?}", findings);
            for (f, key) in findings.iter().zip(&invalid) {
                prop_assert_eq!(f.rule, Rule::IntentInvalid);
                prop_assert_eq!(f.severity, Severity::Error);
                let message_names_key = f.message.starts_with(&format!("annotation {key}="));
                prop_assert!(message_names_key, "{}", f.message);
                let shown: String = a[*key].chars().take(64).collect();
                prop_assert_eq!(&f.observed["value"], &serde_json::Value::from(shown));
                prop_assert_eq!(&f.observed["annotation"], &serde_json::Value::from(*key));
                // However long the value, the message stays short.
                prop_assert!(f.message.len() < 1200, "{}", f.message.len());
            }
        }
    }

    const ALL_POLICIES: [Policy; 4] = [
        Policy::None,
        Policy::BestEffort,
        Policy::Restricted,
        Policy::SingleNumaNode,
    ];

    proptest! {
        /// Under `stricter-only` a pod's annotations never make the checks weaker than the
        /// node's configuration: each applies exactly when it is at least as strict, and
        /// each one that does not is an `override-ignored` finding naming it. Under `none`
        /// nothing a pod says applies.
        #[test]
        fn annotations_never_weaken_the_configuration(
            a in annotations(),
            policy in prop::sample::select(ALL_POLICIES.to_vec()),
            mode in prop::sample::select(vec![Mode::Audit, Mode::Enforce]),
            baseline in prop::sample::select(vec![None, Some("0"), Some("1"), Some("0-1")]),
            overrides in prop::sample::select(vec![PodOverrides::StricterOnly, PodOverrides::None]),
        ) {
            let host = host();
            let baseline = baseline.map(|b| IdSet::parse(b).expect("set"));
            let defaults = Defaults { policy, mode, fail_closed: false, pod_overrides: overrides };
            let (intent, findings) = Intent::from_annotations(&a, &defaults, baseline.as_ref(), host);
            let asked_policy = a.get(ANNOTATION_POLICY).and_then(|v| v.parse::<Policy>().ok());
            let asked_mode = a.get(ANNOTATION_MODE).and_then(|v| v.parse::<Mode>().ok());
            let asked_nodes = a
                .get(ANNOTATION_NUMA_NODES)
                .and_then(|v| IdSet::parse(v).ok())
                .filter(|s| !s.is_empty() && s.is_subset(&host.node_ids()));
            let mut ignored = Vec::new();
            let stricter_only = overrides == PodOverrides::StricterOnly;
            let want_policy = match asked_policy {
                Some(p) if p == policy || (stricter_only && crate::check::rule::at_least_as_strict(p, policy)) => p,
                Some(_) => { ignored.push(ANNOTATION_POLICY); policy }
                None => policy,
            };
            let want_mode = match asked_mode {
                Some(m) if m == mode || (stricter_only && m == Mode::Enforce) => m,
                Some(_) => { ignored.push(ANNOTATION_MODE); mode }
                None => mode,
            };
            let want_nodes = match asked_nodes {
                Some(n) if stricter_only && baseline.as_ref().is_none_or(|b| n.is_subset(b)) => Some(n),
                Some(n) => {
                    if baseline.as_ref() != Some(&n) { ignored.push(ANNOTATION_NUMA_NODES); }
                    None
                }
                None => None,
            };
            prop_assert_eq!(intent.policy, want_policy);
            prop_assert_eq!(intent.mode, want_mode);
            prop_assert_eq!(&intent.numa_nodes, &want_nodes);
            prop_assert!(crate::check::rule::at_least_as_strict(intent.policy, policy) || intent.policy == policy);
            prop_assert!(intent.mode >= mode);
            let named: Vec<&str> = findings
                .iter()
                .filter(|f| f.rule == Rule::OverrideIgnored)
                .map(|f| f.observed["annotation"].as_str().unwrap_or_default())
                .collect();
            prop_assert_eq!(named, ignored);
            for f in findings.iter().filter(|f| f.rule == Rule::OverrideIgnored) {
                let key = f.observed["annotation"].as_str().unwrap_or_default();
                let names_it = f.message.starts_with(&format!("annotation {key}="));
                prop_assert!(names_it, "{}", f.message);
                prop_assert!(f.message.contains(&format!("pod_overrides = \"{overrides}\"")), "{}", f.message);
            }
        }
    }

    #[test]
    fn a_pod_cannot_switch_the_nodes_enforcement_off() {
        let defaults = Defaults {
            policy: Policy::Restricted,
            mode: Mode::Enforce,
            fail_closed: false,
            pod_overrides: PodOverrides::default(),
        };
        let a: BTreeMap<String, String> = [
            (ANNOTATION_MODE, "audit"),
            (ANNOTATION_POLICY, "none"),
            (ANNOTATION_NUMA_NODES, "0-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let placed = IdSet::parse("1").expect("set");
        let (intent, findings) = Intent::from_annotations(&a, &defaults, Some(&placed), host());
        assert_eq!(
            (intent.policy, intent.mode),
            (Policy::Restricted, Mode::Enforce)
        );
        assert_eq!(intent.numa_nodes, None, "the baseline's nodes stand");
        let messages: Vec<&str> = findings.iter().map(|f| f.message.as_str()).collect();
        assert_eq!(findings.len(), 3, "{messages:#?}");
        assert!(findings.iter().all(|f| f.rule == Rule::OverrideIgnored));
        assert_eq!(
            messages[0],
            "annotation kata-topo.io/policy=\"none\" is ignored: it would weaken what the node's \
             configuration sets; {\"policy\":\"restricted\"} applies (pod_overrides = \
             \"stricter-only\" in the node's [topology_guard])"
        );
        assert!(messages[1].starts_with("annotation kata-topo.io/mode=\"audit\" is ignored"));
        assert!(messages[2].starts_with("annotation kata-topo.io/numa-nodes=\"0-1\" is ignored"));
        // Stricter asks apply.
        let strict: BTreeMap<String, String> = [
            (ANNOTATION_POLICY, "single-numa-node"),
            (ANNOTATION_NUMA_NODES, "1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let (intent, findings) =
            Intent::from_annotations(&strict, &defaults, Some(&placed), host());
        assert!(findings.is_empty(), "{findings:?}");
        assert_eq!(intent.policy, Policy::SingleNumaNode);
        assert_eq!(intent.numa_nodes, Some(placed));
        // The operator may allow any.
        let any = Defaults {
            pod_overrides: PodOverrides::Any,
            ..defaults
        };
        let (intent, findings) = Intent::from_annotations(&a, &any, None, host());
        assert!(findings.is_empty(), "{findings:?}");
        assert_eq!((intent.policy, intent.mode), (Policy::None, Mode::Audit));
        assert_eq!("stricter-only".parse(), Ok(PodOverrides::StricterOnly));
        assert_eq!(PodOverrides::None.to_string(), "none");
        assert!("Any".parse::<PodOverrides>().is_err());
    }

    #[test]
    fn parses_policies_and_modes() {
        assert_eq!("single-numa-node".parse(), Ok(Policy::SingleNumaNode));
        assert_eq!("best-effort".parse(), Ok(Policy::BestEffort));
        assert!("Restricted".parse::<Policy>().is_err());
        assert_eq!("enforce".parse(), Ok(Mode::Enforce));
        assert!("../audit".parse::<Mode>().is_err());
        assert_eq!(Policy::SingleNumaNode.to_string(), "single-numa-node");
        assert_eq!(Policy::default(), Policy::Restricted);
        assert_eq!(Mode::default(), Mode::Audit);
    }

    #[test]
    fn baseline_round_trips_and_rejects_unknown_fields() {
        let b = Baseline {
            version: BASELINE_VERSION,
            sandbox_id: Some("sb".into()),
            container_name: Some("app".into()),
            cpus: Some(IdSet::parse("0-3").expect("set")),
            mems: Some(IdSet::parse("0").expect("set")),
            cpu_nodes: IdSet::parse("0").expect("set"),
            devices: vec![BaselineDevice {
                path: "/dev/vfio/12".into(),
                bus_id: "0000:34:00.0".parse().expect("bdf"),
                numa_nodes: None,
            }],
            topology_fingerprint: "00".into(),
        };
        let text = serde_json::to_string(&b).expect("serialise");
        assert!(text.contains("\"cpus\":\"0-3\""), "{text}");
        let back: Baseline = serde_json::from_str(&text).expect("parse");
        assert_eq!(back, b);
        assert_eq!(back.nodes().to_string(), "0");
        let extra = text.replacen('{', "{\"surprise\":1,", 1);
        assert!(serde_json::from_str::<Baseline>(&extra).is_err());
    }
}
