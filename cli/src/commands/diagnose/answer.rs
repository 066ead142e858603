//! The answers of `kata-topo diagnose` from what was read, with no I/O: the three questions,
//! the pod's Kubernetes story, and the exit code. Its output, [`Diagnosis`], is the `--json`
//! document (`docs/cli.md` has its schema: fields are only ever added).

use std::collections::BTreeSet;

use kata_topo_core::input::affinity::{
    required_matches, LabelBaseline, Labels, NodeLabels, PodPlacement,
};
use kata_topo_core::state::LabelsSeen;
use kata_topo_core::vm::VmView;
use kata_topo_core::{Baseline, Finding, Policy, Rule, Severity, Verdict};
use serde::Serialize;
use serde_json::Value;

/// The schema's name, first in the JSON: a field is only ever added under it.
pub(crate) const SCHEMA: &str = "kata-topo.io/diagnose/v1";

/// What a question's answer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Status {
    /// It holds.
    Ok,
    /// kata-topo cannot tell, and `why` says why.
    Unknown,
    /// It does not hold.
    Finding,
}

impl Status {
    /// The exit code of a diagnosis whose worst answer is this: 0 all hold, 1 a finding, 2
    /// cannot tell.
    pub(crate) fn exit_code(self) -> u8 {
        match self {
            Self::Ok => 0,
            Self::Finding => 1,
            Self::Unknown => 2,
        }
    }
}

/// The worst of several answers: a finding over cannot-tell over holds.
fn worst(all: &[Status]) -> Status {
    all.iter().copied().max().unwrap_or(Status::Ok)
}

/// A node label that differs from the pod's label baseline.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LabelChange {
    pub(crate) key: String,
    /// Its value at the pod's first create (`null`: absent).
    pub(crate) from: Option<String>,
    /// Its value now (`null`: removed).
    pub(crate) to: Option<String>,
    /// Whether the pod's nodeSelector or node affinity names it.
    pub(crate) named_by_pod: bool,
    /// When the wrapper first saw this value (RFC 3339); `null` when no request read the node
    /// since the change (this diagnosis is the first to see it).
    pub(crate) first_seen: Option<String>,
}

/// Question 1: have the node's labels changed since the pod was admitted?
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NodeLabelsAnswer {
    pub(crate) status: Status,
    pub(crate) summary: String,
    /// The node's labels at the pod's first create.
    pub(crate) baseline: Option<Labels>,
    /// Every label that differs now, the pod's own first.
    pub(crate) changed: Vec<LabelChange>,
}

/// Question 2: does the pod's node affinity still hold?
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AffinityAnswer {
    pub(crate) status: Status,
    pub(crate) summary: String,
    /// The pod's `nodeSelector`.
    pub(crate) node_selector: Option<Labels>,
    /// Its required terms (`nodeSelectorTerms`), as the Pod has them.
    pub(crate) required: Option<Value>,
    /// What fails, as the wrapper's `node-affinity-violated` says it (the first failing
    /// requirement of each term and the label the node has).
    pub(crate) violations: Vec<String>,
    /// Preferred terms that matched at admission and no longer do: information only.
    pub(crate) preferred_lost: Vec<String>,
}

/// One container's binding, checked now.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ContainerBinding {
    pub(crate) name: String,
    pub(crate) task_id: String,
    /// Where it is now, against the live host: its cpuset, memory nodes, the home nodes of its
    /// CPUs, its VFIO devices and their nodes (the baseline's shape).
    pub(crate) placement: Option<Baseline>,
    /// Where it was at its first create.
    pub(crate) baseline: Option<Baseline>,
    /// Where its intent came from (`kubelet`, `annotations`, `baseline`) and the policy.
    pub(crate) intent_source: String,
    pub(crate) policy: Policy,
    /// What the kubelet admitted, when it is the source.
    pub(crate) kubelet: Option<Value>,
    /// The binding rules' findings now.
    pub(crate) findings: Vec<Finding>,
    /// What else the check said (the intent unavailable, an annotation ignored).
    pub(crate) notes: Vec<Finding>,
    /// The VM its VMM runs, as `kata-topo vm --json` shows it, when it has one.
    pub(crate) vm: Option<VmView>,
}

/// A request of the pod kata-topo refused and that left no running container (a recreate
/// the kubelet keeps retrying): its verdict as kept.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Refused {
    pub(crate) task_id: String,
    pub(crate) verdict: Verdict,
}

/// Question 3: does the Kata sandbox's topology binding still hold?
#[derive(Debug, Clone, Serialize)]
pub(crate) struct TopologyAnswer {
    pub(crate) status: Status,
    pub(crate) summary: String,
    pub(crate) containers: Vec<ContainerBinding>,
    /// Refused requests that left nothing running.
    pub(crate) refused: Vec<Refused>,
}

/// One container of the pod as the API server tells it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct ContainerStory {
    pub(crate) name: String,
    pub(crate) restarts: u64,
    /// `running`, `waiting` or `terminated`.
    pub(crate) state: String,
    /// The waiting or terminated reason (`CreateContainerError`).
    pub(crate) reason: Option<String>,
    pub(crate) message: Option<String>,
    /// The last termination: reason, exit code and when.
    pub(crate) last_termination: Option<String>,
    /// The waiting message is kata-topo's refusal.
    pub(crate) refused_by_kata_topo: bool,
}

/// A resize the kubelet has not finished: its condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct PendingResize {
    /// `PodResizePending` or `PodResizeInProgress`.
    pub(crate) condition: String,
    pub(crate) reason: Option<String>,
    pub(crate) message: Option<String>,
    pub(crate) refused_by_kata_topo: bool,
}

/// The pod's Kubernetes story that bears on the questions.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct KubernetesStory {
    /// Whether the Pod could be read; `why` says why not.
    pub(crate) read: bool,
    pub(crate) why: Option<String>,
    pub(crate) phase: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) runtime_class: Option<String>,
    pub(crate) containers: Vec<ContainerStory>,
    pub(crate) resize: Vec<PendingResize>,
}

/// The pod the diagnosis is about.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PodId {
    pub(crate) namespace: String,
    pub(crate) name: String,
    pub(crate) uid: Option<String>,
    pub(crate) node: Option<String>,
    pub(crate) sandbox_id: String,
}

/// The whole answer: the `--json` document.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Diagnosis {
    pub(crate) schema: &'static str,
    pub(crate) pod: PodId,
    /// The worst of the three answers, which is the exit code.
    pub(crate) status: Status,
    pub(crate) node_labels: NodeLabelsAnswer,
    pub(crate) affinity: AffinityAnswer,
    pub(crate) topology: TopologyAnswer,
    pub(crate) kubernetes: KubernetesStory,
}

/// What diagnose could not look at at all: one line, exit 2.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CannotTell {
    pub(crate) schema: &'static str,
    pub(crate) pod: Value,
    pub(crate) status: Status,
    pub(crate) why: String,
}

impl CannotTell {
    pub(crate) fn new(namespace: &str, name: &str, why: String) -> Self {
        Self {
            schema: SCHEMA,
            pod: serde_json::json!({"namespace": namespace, "name": name}),
            status: Status::Unknown,
            why,
        }
    }
}

/// The label keys the pod's placement names: its nodeSelector's, its required terms' and its
/// preferred terms'.
fn named_keys(pod: &PodPlacement) -> BTreeSet<String> {
    let mut keys: BTreeSet<String> = pod.node_selector.keys().cloned().collect();
    let terms = pod
        .required
        .iter()
        .flatten()
        .chain(pod.preferred.iter().map(|p| &p.preference));
    for t in terms {
        keys.extend(t.match_expressions.iter().map(|r| r.key.clone()));
    }
    keys
}

/// Question 1 from the label baseline, the live node (or why it was not read) and the
/// changes the wrapper saw.
pub(crate) fn node_labels(
    baseline: Option<&LabelBaseline>,
    live: Result<&NodeLabels, &str>,
    seen: &LabelsSeen,
) -> NodeLabelsAnswer {
    let unknown = |summary: String| NodeLabelsAnswer {
        status: Status::Unknown,
        summary,
        baseline: baseline.map(|b| b.node.labels.clone()),
        changed: Vec::new(),
    };
    let Some(baseline) = baseline else {
        return unknown(
            "cannot tell: kata-topo kept no label baseline for the pod (its wrapper never \
             read the node: no kubeconfig, or every read failed)"
                .into(),
        );
    };
    let now = match live {
        Ok(n) => n,
        Err(why) => return unknown(format!("cannot tell: the node was not read: {why}")),
    };
    let named = named_keys(&baseline.pod);
    let then = &baseline.node.labels;
    let keys: BTreeSet<&String> = then.keys().chain(now.labels.keys()).collect();
    let mut changed: Vec<LabelChange> = keys
        .into_iter()
        .filter(|k| then.get(*k) != now.labels.get(*k))
        .map(|k| {
            let to = now.labels.get(k).cloned();
            let first_seen = seen
                .changes
                .get(k)
                .filter(|s| s.to == to)
                .map(|s| timestamp(s.first_seen));
            LabelChange {
                key: k.clone(),
                from: then.get(k).cloned(),
                to,
                named_by_pod: named.contains(k),
                first_seen,
            }
        })
        .collect();
    changed.sort_by_key(|c| (!c.named_by_pod, c.key.clone()));
    let own: Vec<&LabelChange> = changed.iter().filter(|c| c.named_by_pod).collect();
    let others = changed.len() - own.len();
    let others_text = match others {
        0 => String::new(),
        n => format!("; {n} other label(s) the pod does not name changed"),
    };
    let (status, summary) = if own.is_empty() {
        (
            Status::Ok,
            format!(
                "unchanged since admission for the labels the pod's placement names ({} \
                 label(s)){others_text}",
                named.len()
            ),
        )
    } else {
        let list: Vec<String> = own
            .iter()
            .map(|c| {
                format!(
                    "{} {} -> {} ({})",
                    c.key,
                    value_text(c.from.as_deref()),
                    value_text(c.to.as_deref()),
                    c.first_seen.as_deref().map_or_else(
                        || "first seen now: no request read the node since".to_string(),
                        |t| format!("first seen by kata-topo {t}")
                    )
                )
            })
            .collect();
        (
            Status::Finding,
            format!("changed since admission: {}{others_text}", list.join(", ")),
        )
    };
    NodeLabelsAnswer {
        status,
        summary,
        baseline: Some(then.clone()),
        changed,
    }
}

fn value_text(v: Option<&str>) -> String {
    v.map_or_else(|| "absent".into(), |v| format!("{v:?}"))
}

/// Seconds since the epoch as RFC 3339.
fn timestamp(secs: u64) -> String {
    kata_topo_apiserver::events::timestamp(
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
    )
}

/// Question 2 from the pod's placement (the live Pod's, else the one kept with the baseline),
/// the live node, and the findings of the wrapper's own evaluation of the two against the
/// label baseline (`None` when no check could run: no host topology; whether the required
/// placement holds is then all that is said).
pub(crate) fn affinity(
    placement: Option<&PodPlacement>,
    live: Result<&NodeLabels, &str>,
    findings: Option<&[Finding]>,
) -> AffinityAnswer {
    let selector = placement.map(|p| p.node_selector.clone());
    let required = placement
        .and_then(|p| p.required.as_ref())
        .map(|terms| serde_json::json!({ "nodeSelectorTerms": terms }));
    let answer = |status, summary| AffinityAnswer {
        status,
        summary,
        node_selector: selector.clone(),
        required: required.clone(),
        violations: Vec::new(),
        preferred_lost: Vec::new(),
    };
    let Some(pod) = placement else {
        return answer(
            Status::Unknown,
            "cannot tell: neither the live Pod nor the label baseline gives the pod's \
             placement"
                .into(),
        );
    };
    let node = match live {
        Ok(n) => n,
        Err(why) => {
            return answer(
                Status::Unknown,
                format!("cannot tell: the node was not read: {why}"),
            )
        }
    };
    if !pod.constrains() {
        return answer(
            Status::Ok,
            "holds: the pod has no nodeSelector and no node affinity".into(),
        );
    }
    let unevaluated = [];
    let findings = match findings {
        Some(f) => f,
        None if required_matches(pod, node) => &unevaluated[..],
        None => {
            return answer(
                Status::Finding,
                format!(
                    "violated: {} no longer fits node {} (its nodeSelector or required node                      affinity matches no more)",
                    pod.who(),
                    node.name
                ),
            )
        }
    };
    let violations: Vec<String> = findings
        .iter()
        .filter(|f| f.rule == Rule::NodeAffinityViolated)
        .map(|f| f.message.clone())
        .collect();
    let preferred_lost: Vec<String> = findings
        .iter()
        .filter(|f| {
            f.rule == Rule::NodeLabelsChanged
                && f.expected
                    .get("preferredDuringSchedulingIgnoredDuringExecution")
                    .is_some()
        })
        .map(|f| f.message.clone())
        .collect();
    let mut a = if violations.is_empty() {
        let mut parts = Vec::new();
        if !pod.node_selector.is_empty() {
            parts.push(format!(
                "its nodeSelector ({} label(s))",
                pod.node_selector.len()
            ));
        }
        if let Some(terms) = &pod.required {
            let matching: Vec<String> = terms
                .iter()
                .enumerate()
                .filter(|(_, t)| t.matches(node))
                .map(|(i, _)| i.to_string())
                .collect();
            parts.push(format!(
                "required term {} of {}",
                matching.join(", "),
                terms.len()
            ));
        }
        let on = if parts.is_empty() {
            "only preferred terms, which never decide".to_string()
        } else {
            parts.join(" and ") + " match"
        };
        answer(Status::Ok, format!("holds on node {}: {on}", node.name))
    } else {
        answer(
            Status::Finding,
            format!("violated: {}", violations.join("; ")),
        )
    };
    if !preferred_lost.is_empty() {
        a.summary.push_str(&format!(
            "; {} preferred term(s) no longer match",
            preferred_lost.len()
        ));
    }
    a.violations = violations;
    a.preferred_lost = preferred_lost;
    a
}

/// Whether a rule is about the topology binding (question 3), as opposed to the check's own
/// notes (the intent's source, an annotation ignored) and the node's labels.
fn is_binding(rule: Rule) -> bool {
    !matches!(
        rule,
        Rule::CheckFailed
            | Rule::IntentInvalid
            | Rule::OverrideIgnored
            | Rule::KubeletIntentUnavailable
            | Rule::NodeAffinityViolated
            | Rule::NodeLabelsChanged
            | Rule::NodeLabelsUnavailable
    )
}

/// A container's binding from the verdict of its check now (`verdict`), where it is and was,
/// and its VM.
pub(crate) fn binding(
    task_id: &str,
    verdict: &Verdict,
    placement: Option<Baseline>,
    baseline: Option<Baseline>,
    vm: Option<VmView>,
) -> ContainerBinding {
    let (findings, notes): (Vec<Finding>, Vec<Finding>) = verdict
        .findings
        .iter()
        .cloned()
        .partition(|f| is_binding(f.rule));
    ContainerBinding {
        name: verdict.container_name.clone().unwrap_or_else(|| "-".into()),
        task_id: task_id.to_string(),
        placement,
        baseline,
        intent_source: verdict.intent_source.to_string(),
        policy: verdict.policy,
        kubelet: verdict.kubelet.clone(),
        findings,
        notes,
        vm,
    }
}

fn placement_text(b: &ContainerBinding) -> String {
    let Some(p) = &b.placement else {
        return format!("container {}: placement unknown", b.name);
    };
    let set = |s: Option<String>| s.unwrap_or_else(|| "-".into());
    let mut text = format!(
        "container {} on CPUs {} (node {}), memory nodes {}",
        b.name,
        set(p.cpus.as_ref().map(ToString::to_string)),
        if p.cpu_nodes.is_empty() {
            "-".to_string()
        } else {
            p.cpu_nodes.to_string()
        },
        set(p.mems.as_ref().map(ToString::to_string)),
    );
    if !p.devices.is_empty() {
        let devices: Vec<String> = p
            .devices
            .iter()
            .map(|d| {
                format!(
                    "{} on node {}",
                    d.bus_id,
                    d.numa_nodes
                        .as_ref()
                        .map_or("unknown".to_string(), ToString::to_string)
                )
            })
            .collect();
        text.push_str(&format!(", VFIO {}", devices.join(", ")));
    }
    text
}

/// Question 3 from the running containers' bindings (or why none could be checked) and the
/// refused requests that left nothing running.
pub(crate) fn topology(
    containers: Result<Vec<ContainerBinding>, String>,
    refused: Vec<Refused>,
) -> TopologyAnswer {
    let containers = match containers {
        Ok(c) => c,
        Err(why) => {
            return TopologyAnswer {
                status: Status::Unknown,
                summary: format!("cannot tell: {why}"),
                containers: Vec::new(),
                refused,
            }
        }
    };
    let refused_binding: Vec<&Finding> = refused
        .iter()
        .flat_map(|r| &r.verdict.findings)
        .filter(|f| is_binding(f.rule) && f.severity == Severity::Error)
        .collect();
    let found: Vec<String> = containers
        .iter()
        .flat_map(|c| {
            c.findings
                .iter()
                .map(move |f| format!("container {}: {} {}", c.name, f.severity, f.rule))
        })
        .chain(refused.iter().flat_map(|r| {
            r.verdict
                .findings
                .iter()
                .filter(|f| is_binding(f.rule) && f.severity == Severity::Error)
                .map(move |f| {
                    format!(
                        "refused {} of container {}: {}",
                        r.verdict.operation,
                        r.verdict.container_name.as_deref().unwrap_or("-"),
                        f.rule
                    )
                })
        }))
        .collect();
    let failed: Vec<String> = containers
        .iter()
        .flat_map(|c| {
            c.notes
                .iter()
                .filter(|f| f.rule == Rule::CheckFailed)
                .map(move |f| format!("container {}: {}", c.name, f.message))
        })
        .collect();
    let (status, summary) = if !found.is_empty() {
        (
            Status::Finding,
            format!("does not hold: {}", found.join("; ")),
        )
    } else if !failed.is_empty() {
        (
            Status::Unknown,
            format!("cannot tell: {}", failed.join("; ")),
        )
    } else if containers.is_empty() && refused_binding.is_empty() {
        (
            Status::Unknown,
            "cannot tell: no container of the pod runs through kata-topo's wrapper".into(),
        )
    } else {
        let placed: Vec<String> = containers.iter().map(placement_text).collect();
        (
            Status::Ok,
            format!("holds: {}, as admitted", placed.join("; ")),
        )
    };
    TopologyAnswer {
        status,
        summary,
        containers,
        refused,
    }
}

/// Whether a message is one of kata-topo's refusals.
fn is_refusal(message: &str) -> bool {
    message.contains("kata-topo refused")
}

/// The pod's story from its live object.
pub(crate) fn story(pod: Result<&Value, &str>) -> KubernetesStory {
    let pod = match pod {
        Ok(p) => p,
        Err(why) => {
            return KubernetesStory {
                why: Some(why.to_string()),
                ..KubernetesStory::default()
            }
        }
    };
    let text = |v: &Value| v.as_str().map(str::to_string);
    let status = &pod["status"];
    let containers = ["initContainerStatuses", "containerStatuses"]
        .iter()
        .flat_map(|k| status[*k].as_array().into_iter().flatten())
        .map(|c| {
            let (state, detail) = match c["state"].as_object().and_then(|o| o.iter().next()) {
                Some((k, v)) => (k.clone(), v.clone()),
                None => ("unknown".into(), Value::Null),
            };
            let message = text(&detail["message"]);
            let last = &c["lastState"]["terminated"];
            let last_termination = last.is_object().then(|| {
                format!(
                    "{}, exit code {}{}",
                    last["reason"].as_str().unwrap_or("terminated"),
                    last["exitCode"],
                    last["finishedAt"]
                        .as_str()
                        .map(|t| format!(", at {t}"))
                        .unwrap_or_default()
                )
            });
            ContainerStory {
                name: c["name"].as_str().unwrap_or("-").to_string(),
                restarts: c["restartCount"].as_u64().unwrap_or(0),
                refused_by_kata_topo: state == "waiting"
                    && message.as_deref().is_some_and(is_refusal),
                state,
                reason: text(&detail["reason"]),
                message,
                last_termination,
            }
        })
        .collect();
    let resize = status["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| {
            matches!(
                c["type"].as_str(),
                Some("PodResizePending" | "PodResizeInProgress")
            ) && c["status"] == "True"
        })
        .map(|c| {
            let message = text(&c["message"]);
            PendingResize {
                condition: c["type"].as_str().unwrap_or_default().to_string(),
                reason: text(&c["reason"]),
                refused_by_kata_topo: message.as_deref().is_some_and(is_refusal),
                message,
            }
        })
        .collect();
    KubernetesStory {
        read: true,
        why: None,
        phase: text(&status["phase"]),
        node: text(&pod["spec"]["nodeName"]),
        runtime_class: text(&pod["spec"]["runtimeClassName"]),
        containers,
        resize,
    }
}

impl Diagnosis {
    /// The diagnosis of the three answers and the story; its status is the worst answer.
    pub(crate) fn new(
        pod: PodId,
        node_labels: NodeLabelsAnswer,
        affinity: AffinityAnswer,
        topology: TopologyAnswer,
        kubernetes: KubernetesStory,
    ) -> Self {
        Self {
            schema: SCHEMA,
            pod,
            status: worst(&[node_labels.status, affinity.status, topology.status]),
            node_labels,
            affinity,
            topology,
            kubernetes,
        }
    }
}
