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
use serde_json::{json, Map, Value};

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

fn bad(field: &str, why: impl Into<String>) -> AffinityError {
    AffinityError::Field {
        field: field.to_string(),
        why: why.into(),
    }
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The object at `key` of `parent`; `None` when absent or null.
fn object<'a>(
    parent: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Map<String, Value>>, AffinityError> {
    match parent.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m)),
        Some(v) => Err(bad(path, format!("is {}, not an object", kind_of(v)))),
    }
}

fn array<'a>(
    parent: &'a Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<&'a Vec<Value>>, AffinityError> {
    match parent.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => Err(bad(path, format!("is {}, not an array", kind_of(v)))),
    }
}

fn string(
    parent: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Option<String>, AffinityError> {
    match parent.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(bad(path, format!("is {}, not a string", kind_of(v)))),
    }
}

fn string_map(parent: &Map<String, Value>, key: &str, path: &str) -> Result<Labels, AffinityError> {
    let Some(m) = object(parent, key, path)? else {
        return Ok(Labels::new());
    };
    m.iter()
        .map(|(k, v)| match v {
            Value::String(s) => Ok((k.clone(), s.clone())),
            v => Err(bad(
                &format!("{path}.{k}"),
                format!("is {}, not a string", kind_of(v)),
            )),
        })
        .collect()
}

fn root<'a>(v: &'a Value, kind: &str) -> Result<&'a Map<String, Value>, AffinityError> {
    let Value::Object(m) = v else {
        return Err(bad(
            "(document)",
            format!("is {}, not a {kind} object", kind_of(v)),
        ));
    };
    match string(m, "kind", "kind")? {
        Some(k) if k != kind => Err(bad("kind", format!("is {k:?}, not {kind:?}"))),
        _ => Ok(m),
    }
}

fn parse_json(text: &[u8]) -> Result<Value, AffinityError> {
    serde_json::from_slice(text).map_err(|e| AffinityError::Json(e.to_string()))
}

fn requirements(
    parent: &Map<String, Value>,
    key: &str,
    path: &str,
) -> Result<Vec<Requirement>, AffinityError> {
    let Some(items) = array(parent, key, path)? else {
        return Ok(Vec::new());
    };
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let p = format!("{path}[{i}]");
            let Value::Object(m) = item else {
                return Err(bad(&p, format!("is {}, not an object", kind_of(item))));
            };
            let values = match array(m, "values", &format!("{p}.values"))? {
                None => Vec::new(),
                Some(vs) => vs
                    .iter()
                    .enumerate()
                    .map(|(j, v)| match v {
                        Value::String(s) => Ok(s.clone()),
                        v => Err(bad(
                            &format!("{p}.values[{j}]"),
                            format!("is {}, not a string", kind_of(v)),
                        )),
                    })
                    .collect::<Result<_, _>>()?,
            };
            Ok(Requirement {
                key: string(m, "key", &format!("{p}.key"))?.unwrap_or_default(),
                operator: string(m, "operator", &format!("{p}.operator"))?.unwrap_or_default(),
                values,
            })
        })
        .collect()
}

fn term(v: &Value, path: &str) -> Result<Term, AffinityError> {
    let m = match v {
        Value::Null => return Ok(Term::default()),
        Value::Object(m) => m,
        v => return Err(bad(path, format!("is {}, not an object", kind_of(v)))),
    };
    Ok(Term {
        match_expressions: requirements(
            m,
            "matchExpressions",
            &format!("{path}.matchExpressions"),
        )?,
        match_fields: requirements(m, "matchFields", &format!("{path}.matchFields"))?,
    })
}

impl PodPlacement {
    /// Reads a Pod as the API server serves it (`GET /api/v1/namespaces/{ns}/pods/{name}`);
    /// fields it does not use are ignored.
    pub fn from_json(text: &[u8]) -> Result<Self, AffinityError> {
        Self::from_value(&parse_json(text)?)
    }

    /// [`PodPlacement::from_json`] on parsed JSON.
    pub fn from_value(v: &Value) -> Result<Self, AffinityError> {
        let pod = root(v, "Pod")?;
        let mut placement = PodPlacement::default();
        if let Some(meta) = object(pod, "metadata", "metadata")? {
            placement.namespace = string(meta, "namespace", "metadata.namespace")?;
            placement.name = string(meta, "name", "metadata.name")?;
            placement.uid = string(meta, "uid", "metadata.uid")?;
            let owners = array(meta, "ownerReferences", "metadata.ownerReferences")?;
            let mut found: Vec<(bool, Owner)> = Vec::new();
            for (i, o) in owners.into_iter().flatten().enumerate() {
                let p = format!("metadata.ownerReferences[{i}]");
                let Value::Object(o) = o else {
                    return Err(bad(&p, format!("is {}, not an object", kind_of(o))));
                };
                let controller = match o.get("controller") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(v) => {
                        return Err(bad(
                            &format!("{p}.controller"),
                            format!("is {}, not a boolean", kind_of(v)),
                        ))
                    }
                };
                found.push((
                    controller,
                    Owner {
                        kind: string(o, "kind", &format!("{p}.kind"))?.unwrap_or_default(),
                        name: string(o, "name", &format!("{p}.name"))?.unwrap_or_default(),
                    },
                ));
            }
            let controller = found.iter().position(|(c, _)| *c).unwrap_or(0);
            placement.owner = (controller < found.len()).then(|| found.swap_remove(controller).1);
        }
        let Some(spec) = object(pod, "spec", "spec")? else {
            return Ok(placement);
        };
        placement.node_selector = string_map(spec, "nodeSelector", "spec.nodeSelector")?;
        let na_path = "spec.affinity.nodeAffinity";
        let Some(na) = object(spec, "affinity", "spec.affinity")?
            .map(|a| object(a, "nodeAffinity", na_path))
            .transpose()?
            .flatten()
        else {
            return Ok(placement);
        };
        let req_path = format!("{na_path}.requiredDuringSchedulingIgnoredDuringExecution");
        if let Some(req) = object(
            na,
            "requiredDuringSchedulingIgnoredDuringExecution",
            &req_path,
        )? {
            let terms_path = format!("{req_path}.nodeSelectorTerms");
            let terms = array(req, "nodeSelectorTerms", &terms_path)?;
            placement.required = Some(
                terms
                    .into_iter()
                    .flatten()
                    .enumerate()
                    .map(|(i, t)| term(t, &format!("{terms_path}[{i}]")))
                    .collect::<Result<_, _>>()?,
            );
        }
        let pref_path = format!("{na_path}.preferredDuringSchedulingIgnoredDuringExecution");
        for (i, p) in array(
            na,
            "preferredDuringSchedulingIgnoredDuringExecution",
            &pref_path,
        )?
        .into_iter()
        .flatten()
        .enumerate()
        {
            let path = format!("{pref_path}[{i}]");
            let Value::Object(m) = p else {
                return Err(bad(&path, format!("is {}, not an object", kind_of(p))));
            };
            let weight = match m.get("weight") {
                None | Some(Value::Null) => 0,
                Some(Value::Number(n)) => n.as_i64().ok_or_else(|| {
                    bad(&format!("{path}.weight"), format!("is {n}, not an integer"))
                })?,
                Some(v) => {
                    return Err(bad(
                        &format!("{path}.weight"),
                        format!("is {}, not a number", kind_of(v)),
                    ))
                }
            };
            placement.preferred.push(Preferred {
                weight,
                preference: term(
                    m.get("preference").unwrap_or(&Value::Null),
                    &format!("{path}.preference"),
                )?,
            });
        }
        Ok(placement)
    }

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

    /// The Pod-shaped JSON of what this module reads (what the wrapper keeps in the pod's
    /// state directory, read back with [`PodPlacement::from_value`]).
    pub fn to_value(&self) -> Value {
        let mut meta = Map::new();
        if let Some(n) = &self.namespace {
            meta.insert("namespace".into(), json!(n));
        }
        if let Some(n) = &self.name {
            meta.insert("name".into(), json!(n));
        }
        if let Some(u) = &self.uid {
            meta.insert("uid".into(), json!(u));
        }
        if let Some(o) = &self.owner {
            meta.insert(
                "ownerReferences".into(),
                json!([{"kind": o.kind, "name": o.name, "controller": true}]),
            );
        }
        let mut na = Map::new();
        if let Some(terms) = &self.required {
            na.insert(
                "requiredDuringSchedulingIgnoredDuringExecution".into(),
                json!({ "nodeSelectorTerms": terms }),
            );
        }
        if !self.preferred.is_empty() {
            na.insert(
                "preferredDuringSchedulingIgnoredDuringExecution".into(),
                json!(self.preferred),
            );
        }
        let mut spec = Map::new();
        if !self.node_selector.is_empty() {
            spec.insert("nodeSelector".into(), json!(self.node_selector));
        }
        if !na.is_empty() {
            spec.insert("affinity".into(), json!({ "nodeAffinity": na }));
        }
        json!({"kind": "Pod", "metadata": meta, "spec": spec})
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

impl NodeLabels {
    /// Reads a Node as the API server serves it (`GET /api/v1/nodes/{name}`); fields it does
    /// not use are ignored.
    pub fn from_json(text: &[u8]) -> Result<Self, AffinityError> {
        Self::from_value(&parse_json(text)?)
    }

    /// [`NodeLabels::from_json`] on parsed JSON.
    /// `PartialObjectMetadata` (the metadata alone, as the API server serves it when asked
    /// for `as=PartialObjectMetadata`) reads as well.
    pub fn from_value(v: &Value) -> Result<Self, AffinityError> {
        let node = match v.get("kind").and_then(Value::as_str) {
            Some("PartialObjectMetadata") => root(v, "PartialObjectMetadata")?,
            _ => root(v, "Node")?,
        };
        let Some(meta) = object(node, "metadata", "metadata")? else {
            return Err(bad("metadata", "is missing"));
        };
        let name = string(meta, "name", "metadata.name")?
            .filter(|n| !n.is_empty())
            .ok_or_else(|| bad("metadata.name", "is missing"))?;
        Ok(Self {
            name,
            labels: string_map(meta, "labels", "metadata.labels")?,
        })
    }

    /// The Node-shaped JSON of what this module reads (the label baseline as the wrapper keeps
    /// it).
    pub fn to_value(&self) -> Value {
        json!({"kind": "Node", "metadata": {"name": self.name, "labels": self.labels}})
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

impl LabelBaseline {
    /// The JSON kept.
    pub fn to_value(&self) -> Value {
        json!({"node": self.node.to_value(), "pod": self.pod.to_value()})
    }

    /// Reads what [`LabelBaseline::to_value`] wrote.
    pub fn from_value(v: &Value) -> Result<Self, AffinityError> {
        let part = |key: &str| v.get(key).ok_or_else(|| bad(key, "is missing"));
        Ok(Self {
            node: NodeLabels::from_value(part("node")?)?,
            pod: PodPlacement::from_value(part("pod")?)?,
        })
    }
}

impl Serialize for LabelBaseline {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(s)
    }
}

impl<'de> Deserialize<'de> for LabelBaseline {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        Self::from_value(&v).map_err(serde::de::Error::custom)
    }
}

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

pub(crate) fn label_text(node: &NodeLabels, key: &str) -> String {
    node.labels
        .get(key)
        .map_or_else(|| "absent".into(), |v| format!("{v:?}"))
}

mod label;
#[cfg(test)]
pub(crate) mod tests;
