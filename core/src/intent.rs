//! What a pod wants: its policy, mode and allowed NUMA nodes (annotations), and the baseline it
//! got at its first create.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::host::{Bdf, Host};
use crate::idset::IdSet;
use crate::verdict::{Finding, Rule, Severity};

/// Annotation: the Topology Manager policy applied to updates.
pub const ANNOTATION_POLICY: &str = "kata-topo.io/policy";
/// Annotation: the allowed NUMA nodes, list syntax.
pub const ANNOTATION_NUMA_NODES: &str = "kata-topo.io/numa-nodes";
/// Annotation: `audit` or `enforce` for this pod.
pub const ANNOTATION_MODE: &str = "kata-topo.io/mode";

/// The Kubernetes Topology Manager policies, with the same meaning applied to updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Only hard errors (CPUs that do not exist, devices that vanished).
    None,
    /// Every finding reported, never an error.
    BestEffort,
    /// CPUs, memory nodes and devices stay on the allowed nodes; devices local to the CPUs.
    #[default]
    Restricted,
    /// Everything on exactly one NUMA node.
    SingleNumaNode,
}

/// Why a value is not a policy or mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not one of {expected}")]
pub struct ChoiceError {
    /// The value (shortened).
    pub value: String,
    /// The accepted values.
    pub expected: &'static str,
}

fn choice_error(value: &str, expected: &'static str) -> ChoiceError {
    ChoiceError {
        value: value.chars().take(64).collect(),
        expected,
    }
}

impl FromStr for Policy {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "best-effort" => Ok(Self::BestEffort),
            "restricted" => Ok(Self::Restricted),
            "single-numa-node" => Ok(Self::SingleNumaNode),
            _ => Err(choice_error(
                s,
                "none, best-effort, restricted, single-numa-node",
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::BestEffort => "best-effort",
            Self::Restricted => "restricted",
            Self::SingleNumaNode => "single-numa-node",
        })
    }
}

/// Whether an `error` finding refuses the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Report and forward.
    #[default]
    Audit,
    /// Refuse requests with an `error` finding.
    Enforce,
}

impl FromStr for Mode {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "audit" => Ok(Self::Audit),
            "enforce" => Ok(Self::Enforce),
            _ => Err(choice_error(s, "audit, enforce")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Audit => "audit",
            Self::Enforce => "enforce",
        })
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
    /// Reads the three annotations over the defaults. An invalid value is never ignored: it
    /// becomes an `intent-invalid` error finding naming the annotation and the value, and the
    /// default stands in for it. Nodes the host does not have are invalid too.
    pub fn from_annotations(
        annotations: &BTreeMap<String, String>,
        default_policy: Policy,
        default_mode: Mode,
        host: &Host,
    ) -> (Self, Vec<Finding>) {
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
            None => default_policy,
            Some(v) => v.parse().unwrap_or_else(|e: ChoiceError| {
                invalid(
                    ANNOTATION_POLICY,
                    v,
                    format!("expected one of {}", e.expected),
                );
                default_policy
            }),
        };
        let mode = match annotations.get(ANNOTATION_MODE) {
            None => default_mode,
            Some(v) => v.parse().unwrap_or_else(|e: ChoiceError| {
                invalid(
                    ANNOTATION_MODE,
                    v,
                    format!("expected one of {}", e.expected),
                );
                default_mode
            }),
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
        (
            Self {
                policy,
                mode,
                numa_nodes,
            },
            findings,
        )
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
    /// The sandbox.
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
            let (intent, findings) = Intent::from_annotations(&a, default_policy, default_mode, host);
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
