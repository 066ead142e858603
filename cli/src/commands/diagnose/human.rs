//! `kata-topo diagnose` for people: a line for the pod, one per question, one for its
//! Kubernetes story, then the evidence. Every value a pod controls is escaped by the writer of
//! each line ([`crate::out::line`]), the line whole.

/// One line of the text, its values escaped later with the whole line.
macro_rules! push {
    ($out:expr, $($arg:tt)*) => {
        $out.push(format!($($arg)*))
    };
}

use super::answer::{Diagnosis, Status};

fn word(s: Status) -> &'static str {
    match s {
        Status::Ok => "holds",
        Status::Finding => "FINDING",
        Status::Unknown => "cannot tell",
    }
}

/// The pod's story in one line.
fn story_line(d: &Diagnosis) -> String {
    let k = &d.kubernetes;
    if !k.read {
        return format!(
            "kubernetes: the Pod was not read: {}",
            k.why.as_deref().unwrap_or("-")
        );
    }
    let mut parts = vec![format!("phase {}", k.phase.as_deref().unwrap_or("-"))];
    for c in &k.containers {
        if c.restarts > 0 {
            parts.push(format!(
                "container {} restarted {} time(s)",
                c.name, c.restarts
            ));
        }
        if c.state == "waiting" {
            parts.push(format!(
                "container {} waiting {}{}",
                c.name,
                c.reason.as_deref().unwrap_or("-"),
                if c.refused_by_kata_topo {
                    " (kata-topo refused it)"
                } else {
                    ""
                }
            ));
        }
    }
    for r in &k.resize {
        parts.push(format!(
            "resize pending ({} {}){}",
            r.condition,
            r.reason.as_deref().unwrap_or("-"),
            if r.refused_by_kata_topo {
                ", refused by kata-topo"
            } else {
                ""
            }
        ));
    }
    format!("kubernetes: {}", parts.join("; "))
}

/// The whole text, line by line: each is escaped whole when written
/// ([`crate::out::line`]), so no value can add a line.
pub(crate) fn lines(d: &Diagnosis) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let findings = [d.node_labels.status, d.affinity.status, d.topology.status]
        .iter()
        .filter(|s| **s == Status::Finding)
        .count();
    push!(
        out,
        "pod {}/{} on node {} (sandbox {}): {}",
        d.pod.namespace,
        d.pod.name,
        d.pod.node.as_deref().unwrap_or("-"),
        d.pod.sandbox_id,
        match d.status {
            Status::Ok => "all three hold".to_string(),
            Status::Finding => format!("{findings} finding(s)"),
            Status::Unknown => "kata-topo cannot tell everything".to_string(),
        }
    );
    push!(out, "node labels: {}", d.node_labels.summary);
    push!(out, "affinity: {}", d.affinity.summary);
    push!(out, "topology: {}", d.topology.summary);
    push!(out, "{}", story_line(d));
    out.push(String::new());
    push!(out, "node labels ({}):", word(d.node_labels.status));
    match &d.node_labels.baseline {
        Some(b) => {
            push!(
                out,
                "  label baseline: {} label(s) at the pod's first create",
                b.len()
            );
        }
        None => {
            push!(out, "  no label baseline");
        }
    }
    for c in &d.node_labels.changed {
        push!(
            out,
            "  {}: {} -> {}{}, {}",
            c.key,
            c.from
                .as_deref()
                .map_or("absent".into(), |v| format!("{v:?}")),
            c.to.as_deref()
                .map_or("absent".into(), |v| format!("{v:?}")),
            if c.named_by_pod {
                ", named by the pod's placement"
            } else {
                ""
            },
            c.first_seen.as_deref().map_or_else(
                || "not seen by a request yet".to_string(),
                |t| format!("first seen {t}")
            )
        );
    }
    push!(out, "affinity ({}):", word(d.affinity.status));
    if let Some(s) = d.affinity.node_selector.as_ref().filter(|s| !s.is_empty()) {
        push!(
            out,
            "  nodeSelector: {}",
            serde_json::to_string(s).unwrap_or_default()
        );
    }
    if let Some(r) = &d.affinity.required {
        push!(out, "  required: {r}");
    }
    for v in &d.affinity.violations {
        push!(out, "  violated: {v}");
    }
    for p in &d.affinity.preferred_lost {
        push!(out, "  information: {p}");
    }
    push!(out, "topology ({}):", word(d.topology.status));
    for c in &d.topology.containers {
        push!(
            out,
            "  container {} (task {}): intent from {} under {}",
            c.name,
            c.task_id,
            c.intent_source,
            serde_json::to_value(c.policy)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default()
        );
        let place = |label: &str, b: &Option<kata_topo_core::Baseline>, out: &mut Vec<String>| {
            if let Some(b) = b {
                let devices: Vec<String> = b
                    .devices
                    .iter()
                    .map(|d| {
                        format!(
                            "{} ({}) on node {}",
                            d.bus_id,
                            d.path,
                            d.numa_nodes
                                .as_ref()
                                .map_or("unknown".to_string(), ToString::to_string)
                        )
                    })
                    .collect();
                push!(
                    out,
                    "    {label}: CPUs {} (nodes {}), mems {}, devices [{}], host {}",
                    b.cpus.as_ref().map_or("-".into(), ToString::to_string),
                    b.cpu_nodes,
                    b.mems.as_ref().map_or("-".into(), ToString::to_string),
                    devices.join(", "),
                    b.topology_fingerprint
                );
            }
        };
        place("now", &c.placement, &mut out);
        place("baseline", &c.baseline, &mut out);
        for f in &c.findings {
            push!(out, "    {} {}: {}", f.severity, f.rule, f.message);
        }
        for f in &c.notes {
            push!(out, "    note {}: {}", f.rule, f.message);
        }
        if let Some(vm) = &c.vm {
            let vcpus: Vec<String> = vm
                .vcpus
                .iter()
                .map(|v| {
                    format!(
                        "vCPU {} (tid {}) on CPUs {}",
                        v.index, v.tid, v.allowed_cpus
                    )
                })
                .collect();
            push!(
                out,
                "    VM pid {}: {}; memory bound to nodes {}",
                vm.pid,
                if vcpus.is_empty() {
                    "no vCPU tied to a thread".to_string()
                } else {
                    vcpus.join(", ")
                },
                if vm.memory_nodes.is_empty() {
                    "-".to_string()
                } else {
                    vm.memory_nodes.to_string()
                }
            );
        }
    }
    for r in &d.topology.refused {
        push!(
            out,
            "  refused (task {}): {}",
            r.task_id,
            r.verdict.refusal()
        );
    }
    let k = &d.kubernetes;
    push!(out, "kubernetes:");
    if k.read {
        push!(
            out,
            "  phase {}, node {}, runtimeClassName {}",
            k.phase.as_deref().unwrap_or("-"),
            k.node.as_deref().unwrap_or("-"),
            k.runtime_class.as_deref().unwrap_or("-")
        );
        for c in &k.containers {
            push!(
                out,
                "  container {}: {}{}, {} restart(s){}{}",
                c.name,
                c.state,
                c.reason
                    .as_deref()
                    .map(|r| format!(" {r}"))
                    .unwrap_or_default(),
                c.restarts,
                c.last_termination
                    .as_deref()
                    .map(|t| format!(", last terminated {t}"))
                    .unwrap_or_default(),
                c.message
                    .as_deref()
                    .map(|m| format!(": {m}"))
                    .unwrap_or_default()
            );
        }
        for r in &k.resize {
            push!(
                out,
                "  {} {}: {}",
                r.condition,
                r.reason.as_deref().unwrap_or("-"),
                r.message.as_deref().unwrap_or("-")
            );
        }
    } else {
        push!(out, "  not read: {}", k.why.as_deref().unwrap_or("-"));
    }
    out
}
