//! The severity policy: one table from rule × policy to severity, the only place that says how
//! much a finding weighs. The "Severity by policy" table of `docs/rules.md` is tested against it, so
//! the two cannot drift apart.

use super::rule::{Rule, Severity};
use crate::check::policy::Policy;

/// What the table says for one rule under one policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Weight {
    /// The policy does not report the rule.
    Off,
    /// Reported as a `warning`.
    Warning,
    /// Reported as an `error`.
    Error,
    /// A `warning`, or an `error` when the configuration sets `fail_closed`: a check that could
    /// not run refuses the request only when the operator asked for that.
    FailClosed,
}

impl Weight {
    fn severity(self, fail_closed: bool) -> Option<Severity> {
        match self {
            Self::Off => None,
            Self::Warning => Some(Severity::Warning),
            Self::Error => Some(Severity::Error),
            Self::FailClosed if fail_closed => Some(Severity::Error),
            Self::FailClosed => Some(Severity::Warning),
        }
    }
}

/// The table: rules that weigh alike, and their weight under each policy (the columns of
/// [`column()`]). What the pod asks for does not exist (`cpu-unknown`, `vfio-missing`): an error
/// unless the policy is best-effort. The pod's intent cannot be read: always an error, since
/// the defaults stand in for it. The host changed, or nobody can tell (`vfio-locality-unknown`,
/// `topology-drift`): never a refusal. A pod annotation ignored because it would weaken the
/// node's configuration (`override-ignored`), or a kubelet that gave no intent
/// (`kubelet-intent-unavailable`: the annotations and baseline stand in): worth a warning,
/// never a refusal by itself. What the kubelet admitted and the container no longer has
/// (`kubelet-cpus-mismatch`, `kubelet-device-mismatch`): an error where the Topology Manager
/// enforces alignment (restricted, single-numa-node), else a warning — under `none` too,
/// since the CPU manager's and the device plugins' assignment holds whatever the alignment
/// policy. The pod's own required node affinity no longer holding on its node
/// (`node-affinity-violated`): an error under every policy, since the NUMA policy does not
/// weaken what the pod itself requires of its node; its labels changed while it holds, or
/// could not be read (`node-labels-changed`, `node-labels-unavailable`): a warning.
/// Every rule is in exactly one row, checked when the crate compiles (below).
#[rustfmt::skip]
const TABLE: [(&[Rule], [Weight; 4]); 13] = {
    use Rule::*;
    use Weight::{Error, FailClosed, Off, Warning};
    [
        //                                          none        best-effort restricted  single-numa-node
        (&[CpuUnknown, VfioMissing],               [Error,      Warning,    Error,      Error]),
        (&[IntentInvalid],                         [Error,      Error,      Error,      Error]),
        (&[CheckFailed],                           [FailClosed, FailClosed, FailClosed, FailClosed]),
        (&[CpuSpansNuma],                          [Off,        Off,        Off,        Error]),
        (&[CpuOutsideIntent, MemsMismatch,
           MemoryExceedsNodes, VfioRemote],        [Off,        Warning,    Error,      Error]),
        (&[VfioLocalityUnknown, TopologyDrift],    [Off,        Warning,    Warning,    Warning]),
        (&[VcpuPinningLost, VcpuOverlap],          [Off,        Warning,    Warning,    Error]),
        (&[VcpuAffinityDrift, GuestNumaUncovered], [Off,        Warning,    Error,      Error]),
        (&[OverrideIgnored,
           KubeletIntentUnavailable],              [Warning,    Warning,    Warning,    Warning]),
        (&[KubeletCpusMismatch],                   [Warning,    Warning,    Error,      Error]),
        (&[KubeletDeviceMismatch],                 [Warning,    Warning,    Error,      Error]),
        (&[NodeAffinityViolated],                  [Error,      Error,      Error,      Error]),
        (&[NodeLabelsChanged,
           NodeLabelsUnavailable],                 [Warning,    Warning,    Warning,    Warning]),
    ]
};

/// The table's column for a policy.
const fn column(policy: Policy) -> usize {
    match policy {
        Policy::None => 0,
        Policy::BestEffort => 1,
        Policy::Restricted => 2,
        Policy::SingleNumaNode => 3,
    }
}

/// Fails the build unless every rule is in exactly one row of [`TABLE`].
const _: () = {
    let mut i = 0;
    while i < Rule::ALL.len() {
        let mut rows = 0;
        let mut row = 0;
        while row < TABLE.len() {
            let rules = TABLE[row].0;
            let mut k = 0;
            while k < rules.len() {
                if rules[k] as usize == Rule::ALL[i] as usize {
                    rows += 1;
                }
                k += 1;
            }
            row += 1;
        }
        assert!(
            rows == 1,
            "every rule must be in exactly one row of the severity table"
        );
        i += 1;
    }
};

/// What the table says for a rule under a policy.
fn weight(rule: Rule, policy: Policy) -> Weight {
    TABLE
        .iter()
        .find(|(rules, _)| rules.contains(&rule))
        .map_or(Weight::Off, |(_, weights)| weights[column(policy)])
}

/// The severity of a rule under a policy; `None` means the policy does not report it.
pub fn severity(rule: Rule, policy: Policy, fail_closed: bool) -> Option<Severity> {
    weight(rule, policy).severity(fail_closed)
}

/// Whether `policy` is at least as strict as `than`: read off the table, no rule weighs less
/// under it (not reported < `warning` < `error`), with `fail_closed` or without. This gives
/// none < restricted < single-numa-node and best-effort < restricted; `none` and
/// `best-effort` are not comparable (`best-effort` makes `cpu-unknown` and `vfio-missing`
/// warnings that `none` makes errors), so neither may replace the other in a pod's
/// annotation under `pod_overrides = "stricter-only"`.
pub fn at_least_as_strict(policy: Policy, than: Policy) -> bool {
    Rule::ALL.iter().all(|&rule| {
        [false, true]
            .iter()
            .all(|&fc| severity(rule, policy, fc) >= severity(rule, than, fc))
    })
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

    #[test]
    fn strictness_follows_the_table() {
        use Policy::*;
        let all = [None, BestEffort, Restricted, SingleNumaNode];
        let stricter = |a, b| at_least_as_strict(a, b);
        for p in all {
            assert!(stricter(p, p), "{p}");
            assert!(stricter(SingleNumaNode, p), "{p}");
        }
        assert!(stricter(Restricted, None) && stricter(Restricted, BestEffort));
        assert!(!stricter(None, Restricted) && !stricter(BestEffort, Restricted));
        assert!(!stricter(Restricted, SingleNumaNode));
        // best-effort reports more than none but turns its hard errors into warnings.
        assert!(!stricter(BestEffort, None) && !stricter(None, BestEffort));
    }

    #[test]
    fn fail_closed_turns_only_its_cells_into_errors() {
        for policy in [
            Policy::None,
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ] {
            for rule in Rule::ALL {
                let open = severity(rule, policy, false);
                let closed = severity(rule, policy, true);
                if rule == Rule::CheckFailed {
                    assert_eq!(
                        (open, closed),
                        (Some(Severity::Warning), Some(Severity::Error))
                    );
                } else {
                    assert_eq!(open, closed, "{rule} under {policy}");
                }
            }
        }
    }

    /// A cell as docs/rules.md writes it.
    fn cell(weight: Weight) -> &'static str {
        match weight {
            Weight::Off => "–",
            Weight::Warning => "warning",
            Weight::Error => "error",
            Weight::FailClosed => "warning (error with `fail_closed`)",
        }
    }

    /// The table as docs/rules.md shows it: what to paste when the test below fails.
    fn markdown() -> String {
        let mut out = String::from(
            "| rule | none | best-effort | restricted | single-numa-node |\n\
             | --- | --- | --- | --- | --- |\n",
        );
        for (rules, weights) in TABLE {
            let rules: Vec<String> = rules.iter().map(|r| format!("`{r}`")).collect();
            let cells: Vec<&str> = weights.iter().map(|w| cell(*w)).collect();
            out.push_str(&format!(
                "| {} | {} |\n",
                rules.join(", "),
                cells.join(" | ")
            ));
        }
        out
    }

    /// The cells of the first table after "Severity by policy" in `docs/rules.md`, row by row.
    fn doc_table(doc: &str) -> Vec<Vec<&str>> {
        let (_, after) = doc
            .split_once("\nSeverity by policy")
            .expect("docs/rules.md has a \"Severity by policy\" table");
        after
            .lines()
            .skip_while(|line| !line.starts_with('|'))
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                line.trim()
                    .trim_matches('|')
                    .split('|')
                    .map(str::trim)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn docs_rules_shows_this_table() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/rules.md"));
        let paste = format!("docs/rules.md's table should read:\n{}", markdown());
        let rows = doc_table(doc);
        assert!(rows.len() > 2, "no table\n{paste}");
        let header = &rows[0];
        assert_eq!(header[0], "rule", "{paste}");
        let policies: Vec<Policy> = header[1..]
            .iter()
            .map(|p| {
                p.parse()
                    .unwrap_or_else(|e| panic!("column {p:?}: {e}\n{paste}"))
            })
            .collect();
        for policy in [
            Policy::None,
            Policy::BestEffort,
            Policy::Restricted,
            Policy::SingleNumaNode,
        ] {
            let columns = policies.iter().filter(|p| **p == policy).count();
            assert_eq!(columns, 1, "column {policy}\n{paste}");
        }
        assert!(
            rows[1].iter().all(|c| c.starts_with("---")),
            "{:?}\n{paste}",
            rows[1]
        );
        let mut shown = Vec::new();
        for row in &rows[2..] {
            assert_eq!(row.len(), header.len(), "{row:?}\n{paste}");
            for id in row[0].split(',') {
                let id = id.trim().trim_matches('`');
                let rule: Rule = serde_json::from_value(id.into())
                    .unwrap_or_else(|_| panic!("there is no rule {id:?}\n{paste}"));
                for (policy, text) in policies.iter().zip(&row[1..]) {
                    assert_eq!(
                        *text,
                        cell(weight(rule, *policy)),
                        "{rule} under {policy}\n{paste}"
                    );
                }
                shown.push(rule);
            }
        }
        shown.sort();
        assert_eq!(shown, Rule::ALL, "every rule, once\n{paste}");
    }

    #[test]
    fn the_generated_table_reads_back_as_the_table() {
        let doc = format!(
            "# Intent, rules and verdicts\n\nSeverity by policy:\n\n{}\nmore\n\n## Tests\n",
            markdown()
        );
        let rows = doc_table(&doc);
        assert_eq!(rows.len(), 2 + TABLE.len());
        for ((rules, weights), row) in TABLE.iter().zip(&rows[2..]) {
            let ids: Vec<String> = rules.iter().map(|r| format!("`{r}`")).collect();
            assert_eq!(row[0], ids.join(", "));
            let cells: Vec<&str> = weights.iter().map(|w| cell(*w)).collect();
            assert_eq!(row[1..], cells[..]);
        }
    }
}
