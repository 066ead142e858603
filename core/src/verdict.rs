//! Findings and verdicts: the JSON the CLI prints, the event carries and the state file keeps
//! (the JSON shape is a contract: monitoring and `kata-topo events` read it).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::intent::{IntentOrigin, Mode, Policy};

/// What was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operation {
    /// The sandbox (pause) container's create.
    Sandbox,
    /// A container's first create in its sandbox.
    Create,
    /// A later create of the same container name in the same sandbox.
    Recreate,
    /// A resource update of a running container.
    Update,
}

/// What an update changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UpdateClass {
    /// Quota, period, shares or memory limit changed (an in-place resize).
    Resize,
    /// Only `cpus`/`mems` changed (CPU-manager reconcile, NRI).
    Cpuset,
    /// Both.
    Mixed,
    /// Nothing changed.
    Noop,
}

/// How bad a finding is; the policy decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Severity {
    /// Worth knowing.
    Info,
    /// Placement is off but the policy tolerates it.
    Warning,
    /// The policy forbids it; enforce mode refuses the request.
    Error,
}

/// Whether the request goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Forwarded.
    Allow,
    /// Refused (enforce mode, at least one `error` finding).
    Reject,
}

/// The rule ids (stable; monitoring matches on them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// The cpuset names CPUs the host does not have, or that are offline.
    CpuUnknown,
    /// `single-numa-node`: the CPUs cover more than one NUMA node.
    CpuSpansNuma,
    /// CPUs on NUMA nodes outside the allowed ones.
    CpuOutsideIntent,
    /// `cpuset.mems` outside the allowed nodes, or not the nodes of the CPUs.
    MemsMismatch,
    /// The memory limit exceeds the memory of the allowed nodes.
    MemoryExceedsNodes,
    /// A VFIO device is local to a node that holds none of the container's CPUs.
    VfioRemote,
    /// A VFIO device's locality cannot be determined on a multi-node host.
    VfioLocalityUnknown,
    /// A VFIO group or device is gone or no longer bound to vfio-pci.
    VfioMissing,
    /// The host topology changed since the baseline.
    TopologyDrift,
    /// Kata pinning is configured but cannot hold.
    VcpuPinningLost,
    /// A vCPU thread may run on CPUs outside the allowed nodes.
    VcpuAffinityDrift,
    /// Several vCPU threads pinned to one host CPU.
    VcpuOverlap,
    /// Kata NUMA mode: a VFIO device's host node is not mapped into the guest.
    GuestNumaUncovered,
    /// The check itself could not run.
    CheckFailed,
    /// An annotation value is invalid.
    IntentInvalid,
    /// A pod annotation would weaken what the node's configuration sets, or override it where
    /// `pod_overrides` allows none: ignored, and said.
    OverrideIgnored,
    /// The container's cpuset is not the set of exclusive CPUs the kubelet's CPU manager
    /// assigned it.
    KubeletCpusMismatch,
    /// A device the kubelet allocated the container sits on another NUMA node than the
    /// topology hint it was admitted with, or is not in the container.
    KubeletDeviceMismatch,
    /// The kubelet was to give the intent and could not (timeout, refusal, garbage, a socket
    /// not root's): the annotations and the baseline stand in, and this says why.
    KubeletIntentUnavailable,
}

impl Rule {
    /// Every rule, in declaration order (a new rule goes at the end of the enum and here): what
    /// the severity table and the one in `docs/rules.md` are held complete against.
    pub const ALL: [Rule; 19] = [
        Self::CpuUnknown,
        Self::CpuSpansNuma,
        Self::CpuOutsideIntent,
        Self::MemsMismatch,
        Self::MemoryExceedsNodes,
        Self::VfioRemote,
        Self::VfioLocalityUnknown,
        Self::VfioMissing,
        Self::TopologyDrift,
        Self::VcpuPinningLost,
        Self::VcpuAffinityDrift,
        Self::VcpuOverlap,
        Self::GuestNumaUncovered,
        Self::CheckFailed,
        Self::IntentInvalid,
        Self::OverrideIgnored,
        Self::KubeletCpusMismatch,
        Self::KubeletDeviceMismatch,
        Self::KubeletIntentUnavailable,
    ];

    /// The kebab-case id.
    pub fn id(self) -> &'static str {
        match self {
            Self::CpuUnknown => "cpu-unknown",
            Self::CpuSpansNuma => "cpu-spans-numa",
            Self::CpuOutsideIntent => "cpu-outside-intent",
            Self::MemsMismatch => "mems-mismatch",
            Self::MemoryExceedsNodes => "memory-exceeds-nodes",
            Self::VfioRemote => "vfio-remote",
            Self::VfioLocalityUnknown => "vfio-locality-unknown",
            Self::VfioMissing => "vfio-missing",
            Self::TopologyDrift => "topology-drift",
            Self::VcpuPinningLost => "vcpu-pinning-lost",
            Self::VcpuAffinityDrift => "vcpu-affinity-drift",
            Self::VcpuOverlap => "vcpu-overlap",
            Self::GuestNumaUncovered => "guest-numa-uncovered",
            Self::CheckFailed => "check-failed",
            Self::IntentInvalid => "intent-invalid",
            Self::OverrideIgnored => "override-ignored",
            Self::KubeletCpusMismatch => "kubelet-cpus-mismatch",
            Self::KubeletDeviceMismatch => "kubelet-device-mismatch",
            Self::KubeletIntentUnavailable => "kubelet-intent-unavailable",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
    }
}

impl fmt::Display for Operation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_plain(self))
    }
}

impl fmt::Display for UpdateClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_plain(self))
    }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&serde_plain(self))
    }
}

impl fmt::Display for Severity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Info => "info",
            Self::Warning => "warning",
            Self::Error => "error",
        })
    }
}

/// One thing that does not match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The rule.
    pub rule: Rule,
    /// Its severity under the pod's policy.
    pub severity: Severity,
    /// What was expected, what was found, what to do.
    pub message: String,
    /// The expected state, as data.
    pub expected: Value,
    /// The observed state, as data.
    pub observed: Value,
}

/// The pod a request belongs to.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRef {
    /// Pod name.
    pub name: Option<String>,
    /// Pod namespace.
    pub namespace: Option<String>,
    /// Pod UID.
    pub uid: Option<String>,
}

/// The outcome of one check.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verdict {
    /// What was checked.
    pub operation: Operation,
    /// The update class; `null` for creates.
    pub class: Option<UpdateClass>,
    /// The sandbox id.
    pub sandbox_id: Option<String>,
    /// The container (task) id.
    pub container_id: Option<String>,
    /// The container name (CRI).
    pub container_name: Option<String>,
    /// The pod.
    pub pod: PodRef,
    /// The policy applied.
    pub policy: Policy,
    /// The mode applied.
    pub mode: Mode,
    /// Whether the request goes through.
    pub decision: Decision,
    /// What does not match.
    pub findings: Vec<Finding>,
    /// Where the intent came from: `kubelet`, `annotations` or `baseline`.
    #[serde(default)]
    pub intent_source: IntentOrigin,
    /// What the kubelet reported for the container, when it is the source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubelet: Option<Value>,
}

impl Verdict {
    /// Whether any finding is an `error`.
    pub fn has_error(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// Sets [`Verdict::decision`] from the mode and the findings: `reject` only in enforce
    /// mode with an `error` finding.
    pub fn decide(&mut self) {
        self.decision = if self.mode == Mode::Enforce && self.has_error() {
            Decision::Reject
        } else {
            Decision::Allow
        };
    }

    /// The message a refused request carries back to containerd, CRI and the kubelet: what
    /// was refused, in which pod, and each `error` finding with what was expected and found.
    /// Control characters a pod author put in names or annotations are escaped.
    pub fn refusal(&self) -> String {
        let what = match (self.operation, &self.container_name) {
            (Operation::Update, Some(n)) => format!("the update of container {n}"),
            (Operation::Update, None) => "the update".to_string(),
            (Operation::Sandbox, _) => "the pod sandbox".to_string(),
            (op, Some(n)) => format!("the {} of container {n}", serde_plain(&op)),
            (op, None) => format!("the {}", serde_plain(&op)),
        };
        let pod = format!(
            "{}/{}",
            self.pod.namespace.as_deref().unwrap_or("-"),
            self.pod.name.as_deref().unwrap_or("-")
        );
        let reasons: Vec<String> = self
            .findings
            .iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| {
                format!(
                    "{}: expected {}, found {}: {}",
                    f.rule, f.expected, f.observed, f.message
                )
            })
            .collect();
        let text = format!(
            "kata-topo refused {what} in pod {pod} (policy {}, mode enforce): {}",
            serde_plain(&self.policy),
            reasons.join("; ")
        );
        crate::text::printable(&text).into_owned()
    }

    /// One line per finding for people: `error vfio-remote: …`. Names and messages are
    /// escaped ([`printable`](crate::text::printable)): a pod's annotations cannot add lines
    /// or terminal escapes.
    pub fn human(&self) -> String {
        use crate::text::printable;
        let class = self
            .class
            .map(|c| format!(" ({})", serde_plain(&c)))
            .unwrap_or_default();
        let mut out = format!(
            "{}{class}: pod={}/{} container={} policy={} mode={} decision={} intent={}\n",
            serde_plain(&self.operation),
            printable(self.pod.namespace.as_deref().unwrap_or("-")),
            printable(self.pod.name.as_deref().unwrap_or("-")),
            printable(self.container_name.as_deref().unwrap_or("-")),
            serde_plain(&self.policy),
            serde_plain(&self.mode),
            serde_plain(&self.decision),
            self.intent_source,
        );
        if self.findings.is_empty() {
            out.push_str("  no findings: placement matches the pod's intent\n");
        }
        for f in &self.findings {
            out.push_str(&format!(
                "  {:<7} {}: {}\n",
                f.severity,
                f.rule,
                printable(&f.message)
            ));
        }
        out
    }
}

/// The serde name of a unit enum value (`single-numa-node`).
pub(crate) fn serde_plain<T: Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(mode: Mode, severity: Severity) -> Verdict {
        Verdict {
            operation: Operation::Update,
            class: Some(UpdateClass::Cpuset),
            sandbox_id: Some("sb".into()),
            container_id: None,
            container_name: Some("app".into()),
            pod: PodRef::default(),
            policy: Policy::Restricted,
            mode,
            decision: Decision::Allow,
            findings: vec![Finding {
                rule: Rule::VfioRemote,
                severity,
                message: "m".into(),
                expected: serde_json::json!({"numa_nodes": [1]}),
                observed: serde_json::json!({"numa_nodes": [0]}),
            }],
            intent_source: IntentOrigin::Annotations,
            kubelet: None,
        }
    }

    #[test]
    fn reject_only_in_enforce_with_an_error() {
        for (mode, sev, want) in [
            (Mode::Enforce, Severity::Error, Decision::Reject),
            (Mode::Enforce, Severity::Warning, Decision::Allow),
            (Mode::Audit, Severity::Error, Decision::Allow),
        ] {
            let mut v = verdict(mode, sev);
            v.decide();
            assert_eq!(v.decision, want, "{mode:?} {sev:?}");
        }
    }

    #[test]
    fn human_text_escapes_what_pods_control() {
        let mut v = verdict(Mode::Audit, Severity::Error);
        v.pod.name = Some("p\u{1b}[2J\nerror forged-rule: all is well".into());
        v.pod.namespace = Some("ns\u{202e}".into());
        v.container_name = Some("c\r".into());
        v.findings[0].message = "remote\n  info fake: line\u{9b}".into();
        let text = v.human();
        // The header and the one finding: two lines, nothing a terminal would act on.
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(
            !text.contains(['\u{1b}', '\r', '\u{202e}', '\u{9b}']),
            "{text}"
        );
        assert!(
            text.contains("pod=ns\\u{202e}/p\\u{1b}[2J\\nerror forged-rule"),
            "{text}"
        );
        assert!(text.contains("container=c\\r "), "{text}");
        assert!(
            text.contains("remote\\n  info fake: line\\u{9b}\n"),
            "{text}"
        );
        // JSON keeps the values intact.
        let back: Verdict =
            serde_json::from_str(&serde_json::to_string(&v).expect("json")).expect("parse");
        assert_eq!(back.pod.name, v.pod.name);
    }

    #[test]
    fn json_shape_matches_the_contract() {
        let v = verdict(Mode::Audit, Severity::Error);
        let json = serde_json::to_value(&v).expect("serialise");
        let keys: Vec<&str> = json
            .as_object()
            .expect("object")
            .keys()
            .map(|k| k.as_str())
            .collect();
        for key in [
            "operation",
            "class",
            "sandbox_id",
            "container_id",
            "container_name",
            "pod",
            "policy",
            "mode",
            "decision",
            "findings",
        ] {
            assert!(keys.contains(&key), "missing {key}");
        }
        assert_eq!(json["class"], "cpuset");
        assert_eq!(json["policy"], "restricted");
        assert_eq!(json["findings"][0]["rule"], "vfio-remote");
        assert_eq!(json["findings"][0]["severity"], "error");
        assert_eq!(json["container_id"], Value::Null);
        let back: Verdict = serde_json::from_value(json).expect("round trip");
        assert_eq!(back, v);
    }

    #[test]
    fn all_lists_every_rule_once_in_declaration_order() {
        // serde names every variant, in declaration order, when it refuses an unknown one: the
        // enum's own list, so a rule missing from ALL fails here.
        let refusal = serde_json::from_str::<Rule>("\"no-such-rule\"")
            .expect_err("not a rule")
            .to_string();
        let variants: Vec<&str> = refusal.split('`').skip(3).step_by(2).collect();
        let ids: Vec<&str> = Rule::ALL.iter().map(|r| r.id()).collect();
        assert_eq!(variants, ids, "{refusal}");
        for (i, rule) in Rule::ALL.into_iter().enumerate() {
            assert_eq!(rule as usize, i, "{rule}");
        }
    }

    #[test]
    fn rule_ids_match_serde_names() {
        for rule in [
            Rule::CpuUnknown,
            Rule::CpuSpansNuma,
            Rule::CpuOutsideIntent,
            Rule::MemsMismatch,
            Rule::MemoryExceedsNodes,
            Rule::VfioRemote,
            Rule::VfioLocalityUnknown,
            Rule::VfioMissing,
            Rule::TopologyDrift,
            Rule::VcpuPinningLost,
            Rule::VcpuAffinityDrift,
            Rule::VcpuOverlap,
            Rule::GuestNumaUncovered,
            Rule::CheckFailed,
            Rule::IntentInvalid,
            Rule::OverrideIgnored,
        ] {
            assert_eq!(serde_plain(&rule), rule.id());
        }
    }
}
