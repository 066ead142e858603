//! Reading and writing the API server's JSON: a Pod's placement ([`PodPlacement`]), a Node's
//! name and labels ([`NodeLabels`]) and the label baseline kept in the pod's state
//! ([`LabelBaseline`]), with errors that name the field.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use super::{
    AffinityError, LabelBaseline, Labels, NodeLabels, Owner, PodPlacement, Preferred, Requirement,
    Term,
};

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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::required_matches;
    use super::super::tests::{NODE, POD};
    use super::*;

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

    proptest! {
        /// Whatever JSON comes, reading it never panics.
        #[test]
        fn reading_any_json_never_panics(text in "\\PC{0,200}") {
            let _ = PodPlacement::from_json(text.as_bytes());
            let _ = NodeLabels::from_json(text.as_bytes());
        }
    }
}
