//! What matches, with upstream's semantics (`labels.Requirement`, `nodeaffinity`): a
//! requirement on a node's labels or fields, a term, a nodeSelector, the pod's required
//! placement; and the words and values the findings quote.

use serde_json::{json, Map, Value};

use super::label;
use super::{Labels, NodeLabels, PodPlacement, Requirement, Term};

/// A requirement's operator, once it parsed as upstream parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    Gt(i64),
    Lt(i64),
}

impl Requirement {
    /// The operator, when the requirement is one upstream's `labels.NewRequirement` accepts
    /// (else why not, the first thing it would refuse): a key that is a qualified name;
    /// `In`/`NotIn` with at least one value, `Exists`/`DoesNotExist` with none, `Gt`/`Lt` with
    /// exactly one integer; every value a label value.
    fn op(&self) -> Result<Op, String> {
        label::qualified_name(&self.key)?;
        let n = self.values.len();
        let op = match self.operator.as_str() {
            "In" | "NotIn" if n == 0 => {
                return Err(format!("{} needs at least one value", self.operator))
            }
            "In" => Op::In,
            "NotIn" => Op::NotIn,
            "Exists" | "DoesNotExist" if n > 0 => {
                return Err(format!("{} takes no value", self.operator))
            }
            "Exists" => Op::Exists,
            "DoesNotExist" => Op::DoesNotExist,
            "Gt" | "Lt" => {
                let [v] = self.values.as_slice() else {
                    return Err(format!("{} needs exactly one value", self.operator));
                };
                let int = parse_int(v)
                    .ok_or_else(|| format!("{} needs an integer, not {v:?}", self.operator))?;
                if self.operator == "Gt" {
                    Op::Gt(int)
                } else {
                    Op::Lt(int)
                }
            }
            other => {
                return Err(format!(
                    "operator {other:?} is none of In, NotIn, Exists, DoesNotExist, Gt, Lt"
                ))
            }
        };
        for v in &self.values {
            label::label_value(v)?;
        }
        Ok(op)
    }

    /// Whether the labels satisfy this requirement (upstream's `labels.Requirement.Matches`);
    /// `None` when the requirement does not parse.
    fn matches(&self, labels: &Labels) -> Option<bool> {
        let value = labels.get(&self.key);
        let has = |v: &String| self.values.iter().any(|x| x == v);
        Some(match self.op().ok()? {
            Op::In => value.is_some_and(has),
            Op::NotIn => !value.is_some_and(has),
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::Gt(r) => value.and_then(|v| parse_int(v)).is_some_and(|v| v > r),
            Op::Lt(r) => value.and_then(|v| parse_int(v)).is_some_and(|v| v < r),
        })
    }

    /// Whether the node's fields satisfy this `matchFields` requirement: `In` or `NotIn` with
    /// exactly one value; `None` for anything else (upstream refuses it). Fields other than
    /// `metadata.name` read as empty, as upstream's `fields.Set` does.
    fn matches_field(&self, node_name: &str) -> Option<bool> {
        let [value] = self.values.as_slice() else {
            return None;
        };
        let field = if self.key == "metadata.name" {
            node_name
        } else {
            ""
        };
        match self.operator.as_str() {
            "In" => Some(field == value),
            "NotIn" => Some(field != value),
            _ => None,
        }
    }
}

/// Go's `strconv.ParseInt(s, 10, 64)`: an optional sign and decimal digits.
fn parse_int(s: &str) -> Option<i64> {
    s.parse::<i64>().ok()
}

impl Term {
    /// A term with neither expressions nor fields: matches nothing.
    pub fn is_empty(&self) -> bool {
        self.match_expressions.is_empty() && self.match_fields.is_empty()
    }

    /// Whether the node satisfies every requirement of the term. An empty term, or one with a
    /// requirement upstream would not parse, matches nothing.
    pub fn matches(&self, node: &NodeLabels) -> bool {
        if self.is_empty() {
            return false;
        }
        let mut all = true;
        for r in &self.match_expressions {
            match r.matches(&node.labels) {
                None => return false,
                Some(m) => all &= m,
            }
        }
        for r in &self.match_fields {
            match r.matches_field(&node.name) {
                None => return false,
                // Upstream checks fields only for a node with a name.
                Some(m) => all &= m || node.name.is_empty(),
            }
        }
        all
    }

    /// The label keys the term names.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.match_expressions.iter().map(|r| r.key.as_str())
    }

    /// The first requirement the node fails, in words.
    pub(crate) fn first_failure(&self, node: &NodeLabels) -> String {
        if self.is_empty() {
            return "the term is empty and matches no node".into();
        }
        // An invalid requirement first: whatever the labels, its term never matches.
        for r in &self.match_expressions {
            if let Err(why) = r.op() {
                return format!(
                    "{} is not a valid requirement ({why}), and a term holding one matches \
                     no node",
                    describe(r)
                );
            }
        }
        for r in &self.match_expressions {
            if r.matches(&node.labels) == Some(false) {
                return format!(
                    "{} fails: the node has {}",
                    describe(r),
                    node.labels
                        .get(&r.key)
                        .map_or_else(|| "no such label".into(), |v| format!("{v:?}"))
                );
            }
        }
        for r in &self.match_fields {
            match r.matches_field(&node.name) {
                None => return format!("field {} is not a valid requirement", describe(r)),
                Some(false) => {
                    return format!("field {} fails: the node is {:?}", describe(r), node.name)
                }
                Some(true) => {}
            }
        }
        "it matches".into()
    }
}

fn describe(r: &Requirement) -> String {
    if r.values.is_empty() {
        format!("{} {}", r.key, r.operator)
    } else {
        format!("{} {} {:?}", r.key, r.operator, r.values)
    }
}

/// Whether the nodeSelector's pairs all hold (an empty one always does).
pub(crate) fn selector_matches(selector: &Labels, node: &NodeLabels) -> bool {
    selector
        .iter()
        .all(|(k, v)| node.labels.get(k).is_some_and(|x| x == v))
}

/// Whether the pod's required placement holds on the node: its nodeSelector and, when it has
/// one, any of its required terms (upstream's `RequiredNodeAffinity.Match`).
pub fn required_matches(pod: &PodPlacement, node: &NodeLabels) -> bool {
    selector_matches(&pod.node_selector, node)
        && pod
            .required
            .as_ref()
            .is_none_or(|terms| terms.iter().any(|t| t.matches(node)))
}

/// The named labels' values on `node`: a string, or `null` when absent.
pub(crate) fn values_of<'a>(keys: impl IntoIterator<Item = &'a str>, node: &NodeLabels) -> Value {
    let map: Map<String, Value> = keys
        .into_iter()
        .map(|k| {
            (
                k.to_string(),
                node.labels.get(k).map_or(Value::Null, |v| json!(v)),
            )
        })
        .collect();
    Value::Object(map)
}

/// The keys among `keys` whose value (or presence) differs between `then` and `now`.
pub(crate) fn changed<'a>(
    keys: impl IntoIterator<Item = &'a str>,
    then: &NodeLabels,
    now: &NodeLabels,
) -> Vec<&'a str> {
    let mut out: Vec<&str> = keys
        .into_iter()
        .filter(|k| then.labels.get(*k) != now.labels.get(*k))
        .collect();
    out.sort_unstable();
    out.dedup();
    out
}

pub(crate) fn label_text(node: &NodeLabels, key: &str) -> String {
    node.labels
        .get(key)
        .map_or_else(|| "absent".into(), |v| format!("{v:?}"))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::tests::{labels_strategy, node, req, required, term, term_strategy};
    use super::super::*;

    #[test]
    fn every_operator_as_upstream_evaluates_it() {
        let n = node("n1", &[("zone", "a"), ("cores", "16"), ("gen", "v2")]);
        let cases = [
            (req("zone", "In", &["a", "b"]), true),
            (req("zone", "In", &["b"]), false),
            (req("missing", "In", &["a"]), false),
            (req("zone", "NotIn", &["b"]), true),
            (req("zone", "NotIn", &["a"]), false),
            // NotIn and DoesNotExist hold for an absent label.
            (req("missing", "NotIn", &["a"]), true),
            (req("zone", "Exists", &[]), true),
            (req("missing", "Exists", &[]), false),
            (req("missing", "DoesNotExist", &[]), true),
            (req("zone", "DoesNotExist", &[]), false),
            (req("cores", "Gt", &["8"]), true),
            (req("cores", "Gt", &["16"]), false),
            (req("cores", "Lt", &["17"]), true),
            (req("cores", "Lt", &["3"]), false),
            (req("cores", "Gt", &["015"]), true),
            // Gt/Lt on a label that is not an integer, or absent: no match.
            (req("gen", "Gt", &["1"]), false),
            (req("gen", "Lt", &["1"]), false),
            (req("missing", "Gt", &["1"]), false),
            (req("missing", "Lt", &["1"]), false),
        ];
        for (r, want) in cases {
            assert_eq!(term(vec![r.clone()]).matches(&n), want, "{r:?}");
        }
    }

    #[test]
    fn requirements_upstream_refuses_match_nothing() {
        let n = node("n1", &[("zone", "a"), ("cores", "16")]);
        for r in [
            // Gt/Lt with a non-integer value, none, or two.
            req("cores", "Gt", &["1.5"]),
            req("cores", "Lt", &["many"]),
            req("cores", "Gt", &[]),
            req("cores", "Gt", &["1", "2"]),
            req("cores", "Lt", &["0x20"]),
            // In/NotIn without values; Exists/DoesNotExist with some.
            req("zone", "In", &[]),
            req("missing", "NotIn", &[]),
            req("zone", "Exists", &["a"]),
            req("missing", "DoesNotExist", &["a"]),
            // An unknown operator (operators are case-sensitive).
            req("zone", "in", &["a"]),
            req("zone", "Equals", &["a"]),
        ] {
            // Even beside a requirement that holds.
            let t = term(vec![req("zone", "Exists", &[]), r.clone()]);
            assert!(!t.matches(&n), "{r:?}");
        }
    }

    #[test]
    fn label_syntax_upstream_refuses_matches_nothing() {
        // Keys must be qualified names and values label values, as `labels.NewRequirement`
        // checks them; a term holding such a requirement matches nothing.
        let n = node(
            "n1",
            &[("cores", "16"), ("disk", "nvme ssd"), ("zone", "a")],
        );
        for r in [
            // "-1" parses as an integer but is no label value.
            req("cores", "Gt", &["-1"]),
            req("cores", "Lt", &["-3"]),
            req("cores", "Gt", &["+15"]),
            // A space is in no label value, even one the node's label has.
            req("disk", "In", &["ssd", "nvme ssd"]),
            req("disk", "NotIn", &["hdd", "a b"]),
            // A space is in no qualified name.
            req("example.com/gpu model", "DoesNotExist", &[]),
            req("zone", "In", &["a", "-a"]),
            req("zone", "In", &["a", &"v".repeat(64)]),
            req(&format!("{}/k", "p".repeat(254)), "Exists", &[]),
            req(&"k".repeat(64), "DoesNotExist", &[]),
            req("", "DoesNotExist", &[]),
            req("/k", "DoesNotExist", &[]),
            req("example.com/", "DoesNotExist", &[]),
            req("a/b/c", "DoesNotExist", &[]),
            req("Example.com/k", "DoesNotExist", &[]),
            req("example..com/k", "DoesNotExist", &[]),
            req("-k", "DoesNotExist", &[]),
            req("k.", "DoesNotExist", &[]),
            req("gpu\u{e9}", "DoesNotExist", &[]),
        ] {
            let t = term(vec![req("zone", "Exists", &[]), r.clone()]);
            assert!(!t.matches(&n), "{r:?}");
            let why = t.first_failure(&n);
            assert!(why.contains("not a valid requirement"), "{r:?}: {why}");
        }
        // What upstream accepts still matches: the longest key and value, an empty value, every
        // character a name or value may hold.
        for r in [
            req("cores", "Gt", &["15"]),
            req("cores", "Gt", &["0"]),
            req("zone", "In", &["a", ""]),
            req("zone", "In", &["a", &"v".repeat(63)]),
            req("zone", "In", &["a", "A-b_c.9"]),
            req(&format!("{}/k", "p".repeat(253)), "DoesNotExist", &[]),
            req(&"k".repeat(63), "DoesNotExist", &[]),
            req("example.com/Gpu_Model-2.x", "DoesNotExist", &[]),
            req("a-1.b/K", "DoesNotExist", &[]),
        ] {
            let t = term(vec![req("zone", "Exists", &[]), r.clone()]);
            assert!(t.matches(&n), "{r:?}");
        }
        // The nodeSelector and matchFields are not validated, as upstream does not: they match
        // by equality.
        let pod = PodPlacement {
            node_selector: [("disk".to_string(), "nvme ssd".to_string())].into(),
            ..PodPlacement::default()
        };
        assert!(required_matches(&pod, &n));
        let by_odd_name = Term {
            match_expressions: Vec::new(),
            match_fields: vec![req("metadata.name", "In", &["node 1"])],
        };
        assert!(by_odd_name.matches(&node("node 1", &[])));
    }

    #[test]
    fn terms_are_ored_and_expressions_anded() {
        let n = node("n1", &[("zone", "a"), ("disk", "ssd")]);
        let zone_a = req("zone", "In", &["a"]);
        let zone_b = req("zone", "In", &["b"]);
        let ssd = req("disk", "In", &["ssd"]);
        // ANDed within a term.
        assert!(term(vec![zone_a.clone(), ssd.clone()]).matches(&n));
        assert!(!term(vec![zone_b.clone(), ssd.clone()]).matches(&n));
        // ORed across terms.
        let pod = required(vec![term(vec![zone_b.clone()]), term(vec![ssd])]);
        assert!(required_matches(&pod, &n));
        let pod = required(vec![term(vec![zone_b.clone()])]);
        assert!(!required_matches(&pod, &n));
    }

    #[test]
    fn empty_terms_and_empty_lists_match_nothing() {
        let n = node("n1", &[("zone", "a")]);
        // No term at all: nothing matches.
        assert!(!required_matches(&required(vec![]), &n));
        // A term with neither expressions nor fields matches nothing, even beside nothing else.
        assert!(!required_matches(&required(vec![Term::default()]), &n));
        // ... but another term still can.
        let pod = required(vec![
            Term::default(),
            term(vec![req("zone", "Exists", &[])]),
        ]);
        assert!(required_matches(&pod, &n));
        // No required affinity at all: anything goes.
        assert!(required_matches(&PodPlacement::default(), &n));
    }

    #[test]
    fn match_fields_name_the_node() {
        let n = node("worker-1", &[]);
        let by_name = |op: &str, values: &[&str]| Term {
            match_expressions: Vec::new(),
            match_fields: vec![req("metadata.name", op, values)],
        };
        assert!(by_name("In", &["worker-1"]).matches(&n));
        assert!(!by_name("In", &["worker-2"]).matches(&n));
        assert!(by_name("NotIn", &["worker-2"]).matches(&n));
        assert!(!by_name("NotIn", &["worker-1"]).matches(&n));
        // Exactly one value, In or NotIn only.
        assert!(!by_name("In", &["worker-1", "worker-2"]).matches(&n));
        assert!(!by_name("Exists", &[]).matches(&n));
        // Fields and labels together are ANDed.
        let both = Term {
            match_expressions: vec![req("zone", "Exists", &[])],
            match_fields: vec![req("metadata.name", "In", &["worker-1"])],
        };
        assert!(!both.matches(&n));
        assert!(both.matches(&node("worker-1", &[("zone", "a")])));
    }

    #[test]
    fn node_selector_needs_every_pair() {
        let pod = PodPlacement {
            node_selector: [("zone".to_string(), "a".to_string())].into(),
            ..PodPlacement::default()
        };
        assert!(required_matches(
            &pod,
            &node("n", &[("zone", "a"), ("x", "y")])
        ));
        assert!(!required_matches(&pod, &node("n", &[("zone", "b")])));
        assert!(!required_matches(&pod, &node("n", &[])));
        // With required terms too, both must hold.
        let pod = PodPlacement {
            required: Some(vec![term(vec![req("x", "Exists", &[])])]),
            ..pod
        };
        assert!(!required_matches(&pod, &node("n", &[("zone", "a")])));
        assert!(required_matches(
            &pod,
            &node("n", &[("zone", "a"), ("x", "")])
        ));
    }

    proptest! {
        /// In and NotIn are each other's negation when the label is there; both hold nothing of
        /// an absent label but NotIn's truth.
        #[test]
        fn in_and_notin_are_complements(labels in labels_strategy(), key in "[a-d]",
                                        values in prop::collection::vec("[xy1]", 1..3)) {
            let vs: Vec<&str> = values.iter().map(String::as_str).collect();
            let n = NodeLabels { name: "n".into(), labels };
            let is_in = term(vec![req(&key, "In", &vs)]).matches(&n);
            let not_in = term(vec![req(&key, "NotIn", &vs)]).matches(&n);
            if n.labels.contains_key(&key) {
                prop_assert_ne!(is_in, not_in);
            } else {
                prop_assert!(!is_in && not_in);
            }
            let exists = term(vec![req(&key, "Exists", &[])]).matches(&n);
            let absent = term(vec![req(&key, "DoesNotExist", &[])]).matches(&n);
            prop_assert_ne!(exists, absent);
            prop_assert_eq!(exists, n.labels.contains_key(&key));
        }

        /// Gt and Lt compare integers; a label that is not one matches neither.
        #[test]
        fn gt_and_lt_compare_integers(value in prop_oneof![any::<i64>().prop_map(|i| i.to_string()),
                                                             "[a-z0-9.]{0,6}"],
                                      bound in any::<i64>()) {
            let n = NodeLabels { name: "n".into(), labels: [("k".to_string(), value.clone())].into() };
            let b = bound.to_string();
            let gt = term(vec![req("k", "Gt", &[&b])]).matches(&n);
            let lt = term(vec![req("k", "Lt", &[&b])]).matches(&n);
            match value.parse::<i64>() {
                // A negative bound is no label value: upstream refuses it.
                Ok(v) if bound >= 0 => { prop_assert_eq!(gt, v > bound); prop_assert_eq!(lt, v < bound); }
                _ => prop_assert!(!gt && !lt),
            }
        }

        /// Terms are ORed: the required affinity holds exactly when one term does, and adding a
        /// term never breaks a match; expressions are ANDed: a term holds exactly when each of its
        /// expressions alone does (and it has any).
        #[test]
        fn terms_or_and_expressions_and(labels in labels_strategy(),
                                        terms in prop::collection::vec(term_strategy(), 0..4),
                                        extra in term_strategy()) {
            let n = NodeLabels { name: "n".into(), labels };
            let pod = PodPlacement { required: Some(terms.clone()), ..PodPlacement::default() };
            let any = terms.iter().any(|t| t.matches(&n));
            prop_assert_eq!(required_matches(&pod, &n), any);
            let mut more = terms.clone();
            more.push(extra);
            let pod_more = PodPlacement { required: Some(more), ..PodPlacement::default() };
            prop_assert!(!any || required_matches(&pod_more, &n));
            for t in &terms {
                let each = !t.match_expressions.is_empty()
                    && t.match_expressions.iter().all(|r| term(vec![r.clone()]).matches(&n));
                prop_assert_eq!(t.matches(&n), each);
            }
        }
    }
}
