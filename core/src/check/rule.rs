//! The rules' vocabulary: the [`Rule`] ids, the [`Severity`] of a [`Finding`], and the one
//! table ([`severity()`]) that says how much each rule weighs under each policy.

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::severity::{at_least_as_strict, severity};

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

/// Declares [`Rule`] from one list: each rule's variant and its stable id, in order. The enum,
/// [`Rule::ALL`] and [`Rule::id`] all come from it, so a rule cannot be in one and not the
/// others (serde's kebab-case names are held to the ids by a test).
macro_rules! rules {
    ($($(#[doc = $doc:literal])* $variant:ident = $id:literal,)*) => {
        /// The rule ids (stable; monitoring matches on them).
        #[derive(
            Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(rename_all = "kebab-case")]
        pub enum Rule {
            $($(#[doc = $doc])* $variant,)*
        }

        impl Rule {
            /// Every rule, in declaration order (a new rule goes at the end of the list): what
            /// the severity table and the one in `docs/rules.md` are held complete against.
            pub const ALL: [Rule; [$($id),*].len()] = [$(Self::$variant),*];

            /// The kebab-case id.
            pub fn id(self) -> &'static str {
                match self {
                    $(Self::$variant => $id,)*
                }
            }
        }
    };
}

rules! {
    /// The cpuset names CPUs the host does not have, or that are offline.
    CpuUnknown = "cpu-unknown",
    /// `single-numa-node`: the CPUs cover more than one NUMA node.
    CpuSpansNuma = "cpu-spans-numa",
    /// CPUs on NUMA nodes outside the allowed ones.
    CpuOutsideIntent = "cpu-outside-intent",
    /// `cpuset.mems` outside the allowed nodes, or not the nodes of the CPUs.
    MemsMismatch = "mems-mismatch",
    /// The memory limit exceeds the memory of the allowed nodes.
    MemoryExceedsNodes = "memory-exceeds-nodes",
    /// A VFIO device is local to a node that holds none of the container's CPUs.
    VfioRemote = "vfio-remote",
    /// A VFIO device's locality cannot be determined on a multi-node host.
    VfioLocalityUnknown = "vfio-locality-unknown",
    /// A VFIO group or device is gone or no longer bound to vfio-pci.
    VfioMissing = "vfio-missing",
    /// The host topology changed since the baseline.
    TopologyDrift = "topology-drift",
    /// Kata pinning is configured but cannot hold.
    VcpuPinningLost = "vcpu-pinning-lost",
    /// A vCPU thread may run on CPUs outside the allowed nodes.
    VcpuAffinityDrift = "vcpu-affinity-drift",
    /// Several vCPU threads pinned to one host CPU.
    VcpuOverlap = "vcpu-overlap",
    /// Kata NUMA mode: a VFIO device's host node is not mapped into the guest.
    GuestNumaUncovered = "guest-numa-uncovered",
    /// The check itself could not run.
    CheckFailed = "check-failed",
    /// An annotation value is invalid.
    IntentInvalid = "intent-invalid",
    /// A pod annotation would weaken what the node's configuration sets, or override it where
    /// `pod_overrides` allows none: ignored, and said.
    OverrideIgnored = "override-ignored",
    /// The container's cpuset is not the set of exclusive CPUs the kubelet's CPU manager
    /// assigned it.
    KubeletCpusMismatch = "kubelet-cpus-mismatch",
    /// A device the kubelet allocated the container sits on another NUMA node than the
    /// topology hint it was admitted with, or is not in the container.
    KubeletDeviceMismatch = "kubelet-device-mismatch",
    /// The kubelet was to give the intent and could not (timeout, refusal, garbage, a socket
    /// not root's): the annotations and the baseline stand in, and this says why.
    KubeletIntentUnavailable = "kubelet-intent-unavailable",
    /// The pod's nodeSelector or required node affinity no longer matches its node's labels.
    NodeAffinityViolated = "node-affinity-violated",
    /// A node label the pod's affinity names changed since its first create and the
    /// affinity still holds, or a preferred term matches no more.
    NodeLabelsChanged = "node-labels-changed",
    /// The node's labels or the pod could not be read from the API server: the affinity went
    /// unchecked, and this says why.
    NodeLabelsUnavailable = "node-labels-unavailable",
}

impl Rule {
    /// The rule's reason in a Kubernetes Event: its id in CamelCase (`node-affinity-violated`
    /// → `NodeAffinityViolated`, `vfio-remote` → `VfioRemote`). The one mapping, listed in
    /// `docs/rules.md` ("Kubernetes Events").
    pub fn reason(self) -> String {
        self.id()
            .split('-')
            .map(|word| {
                let mut chars = word.chars();
                chars.next().map_or_else(String::new, |first| {
                    first.to_ascii_uppercase().to_string() + chars.as_str()
                })
            })
            .collect()
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.id())
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

#[cfg(test)]
mod tests {
    use super::*;

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
    fn a_reason_is_the_id_in_camel_case_and_names_one_rule() {
        assert_eq!(Rule::NodeAffinityViolated.reason(), "NodeAffinityViolated");
        assert_eq!(Rule::CpuOutsideIntent.reason(), "CpuOutsideIntent");
        assert_eq!(Rule::VfioRemote.reason(), "VfioRemote");
        assert_eq!(Rule::VcpuPinningLost.reason(), "VcpuPinningLost");
        let mut reasons: Vec<String> = Rule::ALL.iter().map(|r| r.reason()).collect();
        assert!(reasons
            .iter()
            .all(|r| r.chars().all(|c| c.is_ascii_alphanumeric())
                && r.starts_with(|c: char| c.is_ascii_uppercase())));
        reasons.sort();
        reasons.dedup();
        assert_eq!(reasons.len(), Rule::ALL.len());
    }

    #[test]
    fn rule_ids_match_serde_names() {
        for rule in Rule::ALL {
            assert_eq!(
                serde_json::to_value(rule).ok(),
                Some(Value::from(rule.id()))
            );
        }
    }
}
