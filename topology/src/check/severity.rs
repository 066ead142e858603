//! The severity table: one rule under one policy.

use crate::intent::Policy;
use crate::verdict::{Rule, Severity};

/// The severity of a rule under a policy; `None` means the policy does not report it.
pub fn severity(rule: Rule, policy: Policy, fail_closed: bool) -> Option<Severity> {
    use Severity::{Error, Warning};
    match rule {
        Rule::IntentInvalid => Some(Error),
        Rule::CheckFailed => Some(if fail_closed { Error } else { Warning }),
        Rule::CpuUnknown | Rule::VfioMissing => Some(match policy {
            Policy::BestEffort => Warning,
            _ => Error,
        }),
        Rule::CpuSpansNuma => (policy == Policy::SingleNumaNode).then_some(Error),
        Rule::VfioLocalityUnknown | Rule::TopologyDrift => match policy {
            Policy::None => None,
            _ => Some(Warning),
        },
        Rule::VcpuPinningLost | Rule::VcpuOverlap => match policy {
            Policy::None => None,
            Policy::BestEffort | Policy::Restricted => Some(Warning),
            Policy::SingleNumaNode => Some(Error),
        },
        _ => match policy {
            Policy::None => None,
            Policy::BestEffort => Some(Warning),
            Policy::Restricted | Policy::SingleNumaNode => Some(Error),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn severity_table_follows_the_policies() {
        use Rule::*;
        for rule in [
            CpuOutsideIntent,
            MemsMismatch,
            MemoryExceedsNodes,
            VfioRemote,
        ] {
            assert_eq!(severity(rule, Policy::None, false), None);
            assert_eq!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Warning)
            );
            assert_eq!(
                severity(rule, Policy::Restricted, false),
                Some(Severity::Error)
            );
            assert_eq!(
                severity(rule, Policy::SingleNumaNode, false),
                Some(Severity::Error)
            );
        }
        for rule in [CpuUnknown, VfioMissing] {
            assert_eq!(severity(rule, Policy::None, false), Some(Severity::Error));
            assert_eq!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Warning)
            );
        }
        assert_eq!(severity(CpuSpansNuma, Policy::Restricted, false), None);
        assert_eq!(
            severity(CpuSpansNuma, Policy::SingleNumaNode, false),
            Some(Severity::Error)
        );
        assert_eq!(
            severity(VfioLocalityUnknown, Policy::SingleNumaNode, false),
            Some(Severity::Warning)
        );
        assert_eq!(severity(TopologyDrift, Policy::None, false), None);
        assert_eq!(
            severity(CheckFailed, Policy::None, false),
            Some(Severity::Warning)
        );
        assert_eq!(
            severity(CheckFailed, Policy::None, true),
            Some(Severity::Error)
        );
        assert_eq!(
            severity(IntentInvalid, Policy::BestEffort, false),
            Some(Severity::Error)
        );
        // best-effort never yields an error except for an invalid intent.
        for rule in [
            CpuUnknown,
            CpuSpansNuma,
            CpuOutsideIntent,
            MemsMismatch,
            MemoryExceedsNodes,
            VfioRemote,
            VfioLocalityUnknown,
            VfioMissing,
            TopologyDrift,
            CheckFailed,
        ] {
            assert_ne!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Error),
                "{rule}"
            );
        }
    }
}
