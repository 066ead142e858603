//! Findings and verdicts: the JSON the CLI prints, the event carries and the state file keeps
//! (the JSON shape is a contract: monitoring and `kata-topo events` read it).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::check::intent::IntentOrigin;
use crate::check::policy::{Mode, Policy};
use crate::check::rule::{Finding, Severity};

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

/// Whether the request goes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Forwarded.
    Allow,
    /// Refused (enforce mode, at least one `error` finding).
    Reject,
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
    pub sandbox_id: Option<String>,
    /// The container (task) id.
    pub container_id: Option<String>,
    /// The container name (CRI).
    pub container_name: Option<String>,
    pub pod: PodRef,
    /// The policy applied.
    pub policy: Policy,
    /// The mode applied.
    pub mode: Mode,
    /// Whether the request goes through: made by the check, last, from the mode and the
    /// findings ([`Verdict::decision`]); nothing else sets it.
    pub(crate) decision: Decision,
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

    /// Whether the request goes through.
    pub fn decision(&self) -> Decision {
        self.decision
    }

    /// Decides: `reject` only when the request can still be refused (`refusable`), in enforce
    /// mode, with an `error` finding.
    pub(crate) fn settle(&mut self, refusable: bool) {
        self.decision = if refusable && self.mode == Mode::Enforce && self.has_error() {
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
    use crate::check::rule::Rule;

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
            v.settle(true);
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
}
