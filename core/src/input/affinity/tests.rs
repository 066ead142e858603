use super::*;
use proptest::prelude::*;

pub(crate) fn node(name: &str, labels: &[(&str, &str)]) -> NodeLabels {
    NodeLabels {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

pub(crate) fn req(key: &str, op: &str, values: &[&str]) -> Requirement {
    Requirement {
        key: key.into(),
        operator: op.into(),
        values: values.iter().map(|v| v.to_string()).collect(),
    }
}

pub(crate) fn term(exprs: Vec<Requirement>) -> Term {
    Term {
        match_expressions: exprs,
        match_fields: Vec::new(),
    }
}

pub(crate) fn required(terms: Vec<Term>) -> PodPlacement {
    PodPlacement {
        namespace: Some("ns".into()),
        name: Some("p".into()),
        owner: Some(Owner {
            kind: "ReplicaSet".into(),
            name: "web-5d8f".into(),
        }),
        required: Some(terms),
        ..PodPlacement::default()
    }
}

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

pub(crate) const POD: &str = r#"{
  "apiVersion": "v1", "kind": "Pod",
  "metadata": {"name": "web-5d8f-x2", "namespace": "shop", "uid": "u-1",
    "labels": {"app": "web"},
    "ownerReferences": [
      {"apiVersion": "v1", "kind": "Other", "name": "o", "uid": "1"},
      {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "2",
       "controller": true, "blockOwnerDeletion": true}]},
  "spec": {
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "affinity": {"nodeAffinity": {
      "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kata-topo.io/nic", "operator": "In", "values": ["mlx5"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["spare"]}]}]},
      "preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]},
      "podAntiAffinity": {}},
    "containers": [{"name": "app", "image": "x"}]},
  "status": {"phase": "Running"}
}"#;

pub(crate) const NODE: &str = r#"{
  "kind": "Node", "apiVersion": "v1",
  "metadata": {"name": "worker-1", "labels": {"kubernetes.io/os": "linux",
    "kata-topo.io/nic": "mlx5", "zone": "a"}, "annotations": {"x": "y"}},
  "status": {"capacity": {"cpu": "2"}}
}"#;

#[test]
fn reads_a_pod_and_a_node_as_the_api_server_serves_them() {
    let pod = PodPlacement::from_json(POD.as_bytes()).expect("pod");
    assert_eq!(pod.namespace.as_deref(), Some("shop"));
    assert_eq!(pod.name.as_deref(), Some("web-5d8f-x2"));
    // The controller, not the first reference.
    assert_eq!(
        pod.owner,
        Some(Owner {
            kind: "ReplicaSet".into(),
            name: "web-5d8f".into()
        })
    );
    assert_eq!(
        pod.node_selector
            .get("kubernetes.io/os")
            .map(String::as_str),
        Some("linux")
    );
    let terms = pod.required.as_ref().expect("required");
    assert_eq!(terms.len(), 2);
    assert_eq!(terms[1].match_fields[0].key, "metadata.name");
    assert_eq!(pod.preferred[0].weight, 10);
    let n = NodeLabels::from_json(NODE.as_bytes()).expect("node");
    assert_eq!(n.name, "worker-1");
    assert_eq!(n.labels.len(), 3);
    assert!(required_matches(&pod, &n));
    // What the wrapper keeps reads back the same.
    assert_eq!(PodPlacement::from_value(&pod.to_value()), Ok(pod.clone()));
    assert_eq!(NodeLabels::from_value(&n.to_value()), Ok(n.clone()));
    let kept = LabelBaseline { node: n, pod };
    let text = serde_json::to_string(&kept).expect("json");
    assert_eq!(
        serde_json::from_str::<LabelBaseline>(&text).expect("back"),
        kept
    );
    assert!(serde_json::from_str::<LabelBaseline>(r#"{"node":{}}"#).is_err());
}

#[test]
fn wrong_types_are_errors_naming_the_field() {
    let cases = [
        (r#"{"kind":"Pod","spec":{"nodeSelector":{"a":1}}}"#, "spec.nodeSelector.a"),
        (r#"{"kind":"Pod","spec":{"nodeSelector":[]}}"#, "spec.nodeSelector"),
        (
            r#"{"kind":"Pod","spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"a","operator":"In","values":[1]}]}]}}}}}"#,
            "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].values[0]",
        ),
        (
            r#"{"kind":"Pod","spec":{"affinity":{"nodeAffinity":{"preferredDuringSchedulingIgnoredDuringExecution":[{"weight":"high"}]}}}}"#,
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
        (r#"{"kind":"Pod","metadata":{"ownerReferences":{}}}"#, "metadata.ownerReferences"),
        (r#"{"kind":"Node","metadata":{"name":"n"}}"#, "kind"),
        (r#"[]"#, "(document)"),
    ];
    for (text, field) in cases {
        match PodPlacement::from_json(text.as_bytes()) {
            Err(AffinityError::Field { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    for (text, field) in [
        (
            r#"{"kind":"Node","metadata":{"name":"n","labels":{"a":true}}}"#,
            "metadata.labels.a",
        ),
        (
            r#"{"kind":"Node","metadata":{"labels":{}}}"#,
            "metadata.name",
        ),
        (r#"{"kind":"Node"}"#, "metadata"),
        (r#"{"kind":"Pod","metadata":{"name":"n"}}"#, "kind"),
    ] {
        match NodeLabels::from_json(text.as_bytes()) {
            Err(AffinityError::Field { field: f, .. }) => assert_eq!(f, field, "{text}"),
            other => panic!("{text}: {other:?}"),
        }
    }
    assert!(matches!(
        NodeLabels::from_json(b"{not json"),
        Err(AffinityError::Json(_))
    ));
}

pub(crate) fn labels_strategy() -> impl Strategy<Value = Labels> {
    prop::collection::btree_map(
        prop::sample::select(vec!["a", "b", "c", "d"]).prop_map(String::from),
        prop_oneof![
            prop::sample::select(vec!["x", "y", "1", "-3", "42", "+7", "1.5", ""])
                .prop_map(String::from),
            any::<i64>().prop_map(|i| i.to_string()),
        ],
        0..4,
    )
}

fn requirement_strategy() -> impl Strategy<Value = Requirement> {
    (
        prop::sample::select(vec!["a", "b", "c", "d"]),
        prop::sample::select(vec![
            "In",
            "NotIn",
            "Exists",
            "DoesNotExist",
            "Gt",
            "Lt",
            "Bad",
        ]),
        prop::collection::vec(
            prop::sample::select(vec!["x", "y", "1", "-3", "42", "1.5", "0"]),
            0..3,
        ),
    )
        .prop_map(|(k, op, vs)| req(k, op, &vs))
}

pub(crate) fn term_strategy() -> impl Strategy<Value = Term> {
    prop::collection::vec(requirement_strategy(), 0..3).prop_map(term)
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

    /// Whatever JSON comes, reading it never panics.
    #[test]
    fn reading_any_json_never_panics(text in "\\PC{0,200}") {
        let _ = PodPlacement::from_json(text.as_bytes());
        let _ = NodeLabels::from_json(text.as_bytes());
    }
}
