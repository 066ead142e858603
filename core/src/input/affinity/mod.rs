//! Node affinity after scheduling: a pod's `spec.nodeSelector` and
//! `spec.affinity.nodeAffinity` against its node's labels as they are now.
//!
//! The scheduler evaluates these once, at placement; an in-place resize or a container
//! recreate never passes it again, so a node relabelled since (a feature label gone, a
//! topology key removed, Node Feature Discovery's labels rewritten) leaves the pod running in
//! violation of its own requirement. Kubernetes never implemented
//! `requiredDuringSchedulingRequiredDuringExecution`; kata-topo checks at the points it sees,
//! each resize and recreate. This module reads the Pod and the Node ([`PodPlacement`],
//! [`NodeLabels`], the **label baseline** of the pod's first create, [`LabelBaseline`]) and
//! says what matches, with upstream's semantics; the check resolves the API server's answer
//! ([`NodeView`]) in its context and the rule family `check/families/node_affinity.rs` gives
//! the findings (`node-affinity-violated`, `node-labels-changed`, `node-labels-unavailable`).
//!
//! The semantics are upstream's (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`
//! over `k8s.io/apimachinery/pkg/labels`): the nodeSelector's pairs must all be equal; terms
//! are ORed, a term's expressions ANDed; an empty list of terms matches nothing, and so does a
//! term with neither expressions nor fields; `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt`,
//! `Lt`, where `NotIn` and `DoesNotExist` hold for an absent label, and `Gt`/`Lt` need an
//! integer on both sides (anything else does not match); `matchFields` takes `In`/`NotIn` with
//! exactly one value against `metadata.name`. A requirement upstream would refuse to parse
//! makes its term match nothing, as upstream's lazy parse does: a wrong number of values, an
//! unknown operator, a non-integer `Gt` value, a key that is not a qualified name or a value
//! that is not a label value (`labels.NewRequirement` checks both; the API server checks keys
//! at admission but not values, so a pod may carry `In ["nvme ssd"]` or `Gt ["-1"]`, which can
//! never match). The nodeSelector and `matchFields` are not checked for syntax, as upstream
//! does not: they compare by equality.
//!
//! Pure: the Node and the Pod come in as the API server's JSON; nothing here does I/O.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A node's labels, by key.
pub type Labels = BTreeMap<String, String>;

/// One requirement of a term: `key`, `operator`, `values`, as the API writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirement {
    /// The label key (or `metadata.name` in `matchFields`).
    pub key: String,
    /// `In`, `NotIn`, `Exists`, `DoesNotExist`, `Gt` or `Lt` (kept as written: an unknown
    /// operator makes its term match nothing, as upstream).
    pub operator: String,
    /// The values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// A node selector term: expressions on labels and fields, ANDed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Term {
    /// Requirements on the node's labels.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<Requirement>,
    /// Requirements on the node's fields (`metadata.name`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<Requirement>,
}

/// A preferred term and its weight.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preferred {
    /// 1..100 in the API.
    pub weight: i64,
    /// The term.
    pub preference: Term,
}

/// Who owns the pod (its first `ownerReferences` entry, the controller's when one is marked):
/// what an operator reschedules.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Owner {
    /// `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`, ...
    pub kind: String,
    /// Its name.
    pub name: String,
}

/// What a pod asks of its node: the parts of a Pod this module reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodPlacement {
    /// `metadata.namespace`.
    pub namespace: Option<String>,
    /// `metadata.name`.
    pub name: Option<String>,
    /// `metadata.uid`: which pod of that name it is.
    pub uid: Option<String>,
    /// `metadata.ownerReferences`: the controller, else the first.
    pub owner: Option<Owner>,
    /// `spec.nodeSelector`.
    pub node_selector: Labels,
    /// `spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution
    /// .nodeSelectorTerms`; `None` when the pod has no required node affinity.
    pub required: Option<Vec<Term>>,
    /// `spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution`.
    pub preferred: Vec<Preferred>,
}

/// A node's name and labels: the parts of a Node this module reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeLabels {
    /// `metadata.name`.
    pub name: String,
    /// `metadata.labels`.
    pub labels: Labels,
}

/// Why a Pod or Node JSON could not be read; names the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AffinityError {
    /// Not JSON at all.
    #[error("not JSON: {0}")]
    Json(String),
    /// A field of the wrong type or value.
    #[error("`{field}` {why}")]
    Field {
        /// The field's path (`spec.affinity.nodeAffinity...`).
        field: String,
        /// What is wrong with it.
        why: String,
    },
}

impl PodPlacement {
    /// Which pod it is, as a verdict names it.
    pub fn pod_ref(&self) -> crate::check::verdict::PodRef {
        crate::check::verdict::PodRef {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            uid: self.uid.clone(),
        }
    }

    /// Whether the pod asks anything of its node's labels or name.
    pub fn constrains(&self) -> bool {
        !self.node_selector.is_empty() || self.required.is_some() || !self.preferred.is_empty()
    }

    /// `namespace/name (owned by Kind name)`, for messages.
    pub fn who(&self) -> String {
        let pod = format!(
            "pod {}/{}",
            self.namespace.as_deref().unwrap_or("-"),
            self.name.as_deref().unwrap_or("-")
        );
        match &self.owner {
            Some(o) => format!("{pod} (owned by {} {})", o.kind, o.name),
            None => format!("{pod} (no owner: a bare pod)"),
        }
    }

    /// What an operator does about a pod that no longer fits its node.
    pub(crate) fn remedy(&self) -> String {
        match &self.owner {
            Some(o) if o.kind == "DaemonSet" => format!(
                "relabel the node, or change DaemonSet {}'s affinity: its pods stay on their nodes",
                o.name
            ),
            Some(o) => format!(
                "relabel the node, or delete the pod so that {} {} recreates it where the \
                 scheduler finds a matching node",
                o.kind, o.name
            ),
            None => "relabel the node, or delete and recreate the pod so the scheduler places \
                     it again"
                .to_string(),
        }
    }
}

/// What is kept of a pod at its first create: its node's labels then (the **label
/// baseline**) and its placement (a bound pod's nodeSelector and node affinity cannot change,
/// so it is read once). Kept in the pod's state directory as
/// `{"node": <Node>, "pod": <Pod>}`, each in the API's shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelBaseline {
    /// The node as it was.
    pub node: NodeLabels,
    /// The pod's placement.
    pub pod: PodPlacement,
}

/// What the API server said about a pod's node for one request, as a check takes it
/// ([`crate::check::Request::node`]).
// One per request that reads the API server, passed by reference: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeView {
    /// Read: the pod's placement, its node now, and the label baseline (`None` when this read
    /// is the first, which becomes it).
    Read {
        /// The pod's nodeSelector and node affinity.
        pod: PodPlacement,
        /// The node now.
        node: NodeLabels,
        /// The node at the pod's first create.
        baseline: Option<NodeLabels>,
    },
    /// Not read, and why (`node-labels-unavailable`).
    Unavailable {
        /// Why.
        reason: String,
    },
}

mod json;
mod label;
mod matching;

pub use matching::required_matches;
pub(crate) use matching::{changed, label_text, selector_matches, values_of};
#[cfg(test)]
pub(crate) mod tests {
    //! What the tests of node affinity share: nodes, requirements, terms and pods to build,
    //! a recorded Pod and Node, and proptest strategies.

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

    pub(crate) fn requirement_strategy() -> impl Strategy<Value = Requirement> {
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
}
