//! The pod's node affinity against its node's labels, as the API server gave them for this
//! request and the context resolved them ([`NodeFit`]): `node-affinity-violated` (the
//! nodeSelector or every required term no longer matches), `node-labels-changed` (a label one
//! of the pod's terms names changed since the pod's first create, the label baseline, and the
//! term still holds; or a preferred term that matched the baseline matches no more), and
//! `node-labels-unavailable` (the node or the pod could not be read, and why). What matches is
//! [`crate::input::affinity`]'s, with upstream's semantics.

use serde_json::{json, Map, Value};

use crate::check::context::{Context, NodeFit};
use crate::check::rule::Rule;
use crate::check::Findings;
use crate::input::affinity::{changed, label_text, selector_matches, values_of, Term};

pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    if let Some(reason) = cx.node_unavailable {
        unavailable(reason, f);
    }
    if let Some(fit) = &cx.node_fit {
        evaluate(fit, f);
    }
}

/// `node-labels-unavailable`: the node's labels or the pod could not be read (`reason` says
/// why), so its affinity went unchecked for this request.
fn unavailable(reason: &str, f: &mut Findings) {
    f.add(
        Rule::NodeLabelsUnavailable,
        format!(
            "the pod's node affinity was not checked: {reason}; the request went on unchecked \
             for it"
        ),
        json!({"node_labels": "read from the API server"}),
        json!({"error": reason}),
    );
}

/// The findings of the pod's placement on its node, against the label baseline when there
/// is one (without it only `node-affinity-violated` can be said).
fn evaluate(fit: &NodeFit<'_>, f: &mut Findings) {
    let NodeFit {
        pod,
        node,
        baseline,
    } = *fit;
    let who = pod.who();
    // The nodeSelector and the required terms: violated, or changed but holding.
    let selector_ok = selector_matches(&pod.node_selector, node);
    if !selector_ok {
        let failing: Vec<String> = pod
            .node_selector
            .iter()
            .filter(|(k, v)| node.labels.get(*k) != Some(v))
            .map(|(k, v)| {
                format!(
                    "{k}={v:?} (the node has {})",
                    node.labels
                        .get(k)
                        .map_or_else(|| "no such label".into(), |x| format!("{x:?}"))
                )
            })
            .collect();
        f.add(
            Rule::NodeAffinityViolated,
            format!(
                "{who} no longer fits node {}: its nodeSelector needs {}; {}",
                node.name,
                failing.join(", "),
                pod.remedy()
            ),
            json!({ "nodeSelector": pod.node_selector }),
            json!({"node": node.name, "labels": values_of(pod.node_selector.keys().map(String::as_str), node)}),
        );
    }
    let mut still_holding: Vec<&str> = if selector_ok {
        pod.node_selector.keys().map(String::as_str).collect()
    } else {
        Vec::new()
    };
    if let Some(terms) = &pod.required {
        let keys: Vec<&str> = terms.iter().flat_map(Term::keys).collect();
        let expected = json!({ "requiredDuringSchedulingIgnoredDuringExecution": { "nodeSelectorTerms": terms } });
        if terms.iter().any(|t| t.matches(node)) {
            still_holding.extend(keys);
        } else {
            let why: Vec<String> = if terms.is_empty() {
                vec!["the pod has no term, which matches no node".into()]
            } else {
                terms
                    .iter()
                    .enumerate()
                    .map(|(i, t)| format!("term {i}: {}", t.first_failure(node)))
                    .collect()
            };
            f.add(
                Rule::NodeAffinityViolated,
                format!(
                    "{who} no longer fits node {}: no term of its required node affinity \
                     matches ({}); {}",
                    node.name,
                    why.join("; "),
                    pod.remedy()
                ),
                expected,
                json!({"node": node.name, "labels": values_of(keys, node)}),
            );
        }
    }
    let Some(then) = baseline else {
        return;
    };
    let moved = changed(still_holding, then, node);
    if !moved.is_empty() {
        let mut expected = Map::new();
        if !pod.node_selector.is_empty() {
            expected.insert("nodeSelector".into(), json!(pod.node_selector));
        }
        if let Some(terms) = &pod.required {
            expected.insert(
                "requiredDuringSchedulingIgnoredDuringExecution".into(),
                json!({ "nodeSelectorTerms": terms }),
            );
        }
        expected.insert("labels".into(), values_of(moved.iter().copied(), then));
        f.add(
            Rule::NodeLabelsChanged,
            format!(
                "labels of node {} that {who} requires changed since its first create ({}), \
                 and its requirement still holds; the next change may not keep it",
                node.name,
                moved
                    .iter()
                    .map(|k| format!("{k}: {} -> {}", label_text(then, k), label_text(node, k)))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Value::Object(expected),
            json!({"node": node.name, "labels": values_of(moved.iter().copied(), node)}),
        );
    }
    for (i, p) in pod.preferred.iter().enumerate() {
        let keys: Vec<&str> = p.preference.keys().collect();
        let (was, is) = (p.preference.matches(then), p.preference.matches(node));
        let moved = changed(keys.iter().copied(), then, node);
        let message = match (was, is) {
            (true, false) => format!(
                "preferred term {i} (weight {}) of {who} matched node {} at the pod's first \
                 create and no longer does ({}); the scheduler would now rank the node lower",
                p.weight,
                node.name,
                p.preference.first_failure(node)
            ),
            (_, true) if !moved.is_empty() => format!(
                "labels of node {} that preferred term {i} (weight {}) of {who} names changed \
                 since its first create ({}), and the term still matches",
                node.name,
                p.weight,
                moved.join(", ")
            ),
            _ => continue,
        };
        f.add(
            Rule::NodeLabelsChanged,
            message,
            json!({
                "preferredDuringSchedulingIgnoredDuringExecution": [p],
                "labels": values_of(keys.iter().copied(), then),
            }),
            json!({"node": node.name, "labels": values_of(keys.iter().copied(), node)}),
        );
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::check::policy::Policy;
    use crate::check::rule::Finding;
    use crate::input::affinity::tests::{
        labels_strategy, node, req, required, term, term_strategy, NODE, POD,
    };
    use crate::input::affinity::{required_matches, NodeLabels, PodPlacement};

    /// The findings of `pod` on `node` against `baseline`, weighed under `policy`.
    fn check(
        pod: &PodPlacement,
        node: &NodeLabels,
        baseline: Option<&NodeLabels>,
        policy: Policy,
        fail_closed: bool,
    ) -> Vec<Finding> {
        let mut f = Findings::new(policy, fail_closed, |_| true);
        evaluate(
            &NodeFit {
                pod,
                node,
                baseline,
            },
            &mut f,
        );
        f.into_list()
    }

    fn rules(findings: &[Finding]) -> Vec<&'static str> {
        findings.iter().map(|f| f.rule.id()).collect()
    }

    #[test]
    fn a_relabelled_node_violates_the_required_affinity() {
        let pod = PodPlacement::from_json(POD.as_bytes()).expect("pod");
        let then = NodeLabels::from_json(NODE.as_bytes()).expect("node");
        let mut now = then.clone();
        now.labels.insert("kata-topo.io/nic".into(), "e810".into());
        let f = check(&pod, &now, Some(&then), Policy::Restricted, false);
        // The required terms fail; the nodeSelector and the preferred term still hold.
        assert_eq!(rules(&f), ["node-affinity-violated"]);
        assert_eq!(f[0].severity, crate::Severity::Error);
        assert!(
            f[0].message.contains("ReplicaSet web-5d8f"),
            "{}",
            f[0].message
        );
        assert!(
            f[0].message.contains("shop/web-5d8f-x2"),
            "{}",
            f[0].message
        );
        assert!(
            f[0].message.contains("kata-topo.io/nic In"),
            "{}",
            f[0].message
        );
        assert_eq!(
            f[0].expected["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
                ["matchExpressions"][0]["values"],
            json!(["mlx5"])
        );
        assert_eq!(
            f[0].observed,
            json!({"node": "worker-1", "labels": {"kata-topo.io/nic": "e810"}})
        );
        // Without a baseline the violation is found all the same.
        assert_eq!(
            rules(&check(&pod, &now, None, Policy::None, false)),
            ["node-affinity-violated"]
        );
        // The label removed altogether, and the nodeSelector broken too: two violations.
        now.labels.remove("kata-topo.io/nic");
        now.labels
            .insert("kubernetes.io/os".into(), "windows".into());
        let f = check(&pod, &now, Some(&then), Policy::BestEffort, false);
        assert_eq!(
            rules(&f),
            ["node-affinity-violated", "node-affinity-violated"]
        );
        assert_eq!(
            f[0].observed["labels"],
            json!({"kubernetes.io/os": "windows"})
        );
        assert_eq!(f[1].observed["labels"], json!({"kata-topo.io/nic": null}));
    }

    #[test]
    fn a_change_that_keeps_the_affinity_is_a_warning() {
        let n = node("n", &[("cores", "16")]);
        let pod = required(vec![term(vec![req("cores", "Gt", &["8"])])]);
        let mut now = n.clone();
        now.labels.insert("cores".into(), "32".into());
        let f = check(&pod, &now, Some(&n), Policy::SingleNumaNode, false);
        assert_eq!(rules(&f), ["node-labels-changed"]);
        assert_eq!(f[0].severity, crate::Severity::Warning);
        assert_eq!(f[0].expected["labels"], json!({"cores": "16"}));
        assert_eq!(f[0].observed["labels"], json!({"cores": "32"}));
        assert!(
            f[0].message.contains("ReplicaSet web-5d8f"),
            "{}",
            f[0].message
        );
        // A label no term names changes nothing.
        let mut other = n.clone();
        other.labels.insert("unrelated".into(), "x".into());
        assert!(check(&pod, &other, Some(&n), Policy::Restricted, false).is_empty());
        // Nothing changed: nothing said.
        assert!(check(&pod, &n, Some(&n), Policy::Restricted, false).is_empty());
    }

    #[test]
    fn a_preferred_term_lost_is_a_warning() {
        let pod = PodPlacement::from_json(POD.as_bytes()).expect("pod");
        let then = NodeLabels::from_json(NODE.as_bytes()).expect("node");
        let mut now = then.clone();
        now.labels.insert("zone".into(), "b".into());
        let f = check(&pod, &now, Some(&then), Policy::Restricted, false);
        assert_eq!(rules(&f), ["node-labels-changed"]);
        assert!(
            f[0].message.contains("preferred term 0 (weight 10)"),
            "{}",
            f[0].message
        );
        assert_eq!(f[0].observed["labels"], json!({"zone": "b"}));
        // A preferred term that never matched is no news.
        let mut never = then.clone();
        never.labels.insert("zone".into(), "c".into());
        assert!(check(&pod, &now, Some(&never), Policy::Restricted, false).is_empty());
    }

    #[test]
    fn a_bare_pod_says_so() {
        let mut pod = required(vec![term(vec![req("zone", "In", &["a"])])]);
        pod.owner = None;
        let f = check(&pod, &node("n", &[]), None, Policy::Restricted, false);
        assert!(f[0].message.contains("a bare pod"), "{}", f[0].message);
    }

    #[test]
    fn unavailable_is_a_warning_naming_why() {
        // Even under fail_closed: the pod's node affinity is not what the check could not run.
        let mut found = Findings::new(Policy::Restricted, true, |_| true);
        unavailable("the API server did not answer within 500 ms", &mut found);
        let [f] = found.into_list().try_into().expect("one finding");
        assert_eq!(f.rule, Rule::NodeLabelsUnavailable);
        assert_eq!(f.severity, crate::Severity::Warning);
        assert!(f.message.contains("within 500 ms"));
    }

    proptest! {
        /// The findings agree with the evaluation: violated exactly when no required term
        /// holds; nothing changed, nothing said of a change.
        #[test]
        fn the_findings_agree_with_the_evaluation(labels in labels_strategy(),
                                                  terms in prop::collection::vec(term_strategy(), 0..4)) {
            let n = NodeLabels { name: "n".into(), labels };
            let pod = PodPlacement { required: Some(terms), ..PodPlacement::default() };
            let f = check(&pod, &n, Some(&n), Policy::Restricted, false);
            prop_assert_eq!(
                f.iter().any(|f| f.rule == Rule::NodeAffinityViolated),
                !required_matches(&pod, &n)
            );
            prop_assert!(f.iter().all(|f| f.rule != Rule::NodeLabelsChanged));
        }
    }
}
