//! CPU and memory placement: `cpu-unknown`, `cpu-spans-numa`, `cpu-outside-intent`,
//! `mems-mismatch`, `memory-exceeds-nodes`.

use serde_json::json;

use crate::check::policy::Policy;
use crate::check::rule::Rule;
use crate::idset::IdSet;

use crate::check::context::{Context, Cpus};
use crate::check::{node_word, Findings};

/// The placement rules, in the order their findings appear.
pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    if let Some(cpus) = &cx.cpus {
        cpu_unknown(cx, cpus, f);
        cpu_spans_numa(cx, cpus, f);
        cpu_outside_intent(cx, cpus, f);
    }
    if let Some(mems) = &cx.effective.mems {
        mems_mismatch(cx, mems, f);
    }
    if let Some(limit) = cx.effective.memory_limit {
        memory_exceeds_nodes(cx, limit, f);
    }
}

/// `cpu-unknown`: the cpuset names CPUs the host does not have, or that are offline.
fn cpu_unknown(cx: &Context<'_>, cpus: &Cpus, f: &mut Findings) {
    let host = cx.host;
    let set = &cpus.set;
    let unknown = set.difference(&host.online_cpus);
    if unknown.is_empty() {
        return;
    }
    let offline = unknown.intersection(&host.all_cpus);
    let absent = unknown.difference(&host.all_cpus);
    let mut what = Vec::new();
    if !absent.is_empty() {
        what.push(format!("CPUs {absent} do not exist"));
    }
    if !offline.is_empty() {
        what.push(format!("CPUs {offline} are offline"));
    }
    f.add(
        Rule::CpuUnknown,
        format!(
            "cpuset {set} names CPUs the host cannot run it on: {}; the host's online \
             CPUs are {}; fix the cpuset or bring the CPUs online",
            what.join(", "),
            host.online_cpus
        ),
        json!({"cpus": host.online_cpus.to_string()}),
        json!({"cpus": set.to_string(), "offline": offline.to_string(), "nonexistent": absent.to_string()}),
    );
}

/// `cpu-spans-numa`: under `single-numa-node`, the CPUs cover more than one node.
fn cpu_spans_numa(cx: &Context<'_>, cpus: &Cpus, f: &mut Findings) {
    let Cpus { set, nodes, .. } = cpus;
    if cx.policy == Policy::SingleNumaNode && nodes.len() > 1 {
        f.add(
            Rule::CpuSpansNuma,
            format!(
                "cpuset {set} spans NUMA nodes {nodes} but the policy is single-numa-node; \
                 keep the cpuset within one node"
            ),
            json!({"numa_nodes_count": 1}),
            json!({"cpus": set.to_string(), "numa_nodes": nodes.to_vec()}),
        );
    }
}

/// `cpu-outside-intent`: CPUs on NUMA nodes outside the allowed ones.
fn cpu_outside_intent(cx: &Context<'_>, cpus: &Cpus, f: &mut Findings) {
    let Some(allowed) = &cx.allowed else {
        return;
    };
    let (source, allowed) = (allowed.source, &allowed.nodes);
    let Cpus { set, online, nodes } = cpus;
    let outside = nodes.difference(allowed);
    if outside.is_empty() {
        return;
    }
    let host = cx.host;
    let stray: IdSet = online
        .iter()
        .filter(|&c| host.home_node(c).is_some_and(|n| outside.contains(n)))
        .collect();
    f.add(
        Rule::CpuOutsideIntent,
        format!(
            "CPUs {stray} are on NUMA {} {outside}, outside the allowed {} {allowed} \
             ({source}); the container now runs cross-NUMA: move the cpuset back \
             to node {allowed} or recreate the pod so the Topology Manager \
             re-admits it",
            node_word(&outside),
            node_word(allowed),
        ),
        json!({"numa_nodes": allowed.to_vec()}),
        json!({"numa_nodes": nodes.to_vec(), "cpus": set.to_string(), "outside_cpus": stray.to_string()}),
    );
}

/// `mems-mismatch`: memory nodes outside the allowed ones, missing from the host, remote to
/// the CPUs, or leaving a CPU node without local memory.
fn mems_mismatch(cx: &Context<'_>, mems: &IdSet, f: &mut Findings) {
    let host = cx.host;
    let mut problems = Vec::new();
    let absent = mems.difference(&host.node_ids());
    if !absent.is_empty() {
        problems.push(format!("the host has no NUMA node {absent}"));
    }
    let mut expected = json!({});
    if let Some(allowed) = &cx.allowed {
        let (source, allowed) = (allowed.source, &allowed.nodes);
        let outside = mems.difference(allowed).difference(&absent);
        if !outside.is_empty() {
            problems.push(format!(
                "memory {} {outside} outside the allowed {allowed} ({source})",
                node_word(&outside)
            ));
        }
        expected = json!({"numa_nodes": allowed.to_vec()});
    }
    if let Some(Cpus { set, online, nodes }) = &cx.cpus {
        let remote: IdSet = mems
            .iter()
            .filter(|&m| {
                host.node(m)
                    .is_some_and(|n| !n.local_cpus.intersects(online))
            })
            .collect();
        if !remote.is_empty() {
            problems.push(format!(
                "memory {} {remote} remote to CPUs {set}",
                node_word(&remote)
            ));
        }
        let bare = nodes.difference(mems);
        if !bare.is_empty() {
            problems.push(format!(
                "CPUs on {} {bare} have no local memory in cpuset.mems",
                node_word(&bare)
            ));
        }
        if cx.allowed.is_none() {
            expected = json!({"numa_nodes": nodes.to_vec()});
        }
    }
    if !problems.is_empty() {
        f.add(
            Rule::MemsMismatch,
            format!(
                "cpuset.mems {mems} does not match the placement: {}; set cpuset.mems to \
                 the NUMA nodes of the container's CPUs",
                problems.join("; ")
            ),
            expected,
            json!({"mems": mems.to_string(), "cpus": cx.cpus.as_ref().map(|c| c.set.to_string())}),
        );
    }
}

/// `memory-exceeds-nodes`: the memory limit exceeds the memory of the nodes the container may
/// take memory from (its `cpuset.mems`, else the allowed nodes).
fn memory_exceeds_nodes(cx: &Context<'_>, limit: u64, f: &mut Findings) {
    let host = cx.host;
    let nodes = cx
        .effective
        .mems
        .as_ref()
        .map(|m| m.intersection(&host.node_ids()))
        .or_else(|| cx.allowed_nodes().cloned());
    let Some(nodes) = nodes.filter(|n| !n.is_empty()) else {
        return;
    };
    let capacity = host.memory_of(&nodes);
    if capacity > 0 && limit > capacity {
        f.add(
            Rule::MemoryExceedsNodes,
            format!(
                "memory limit {} exceeds the {} of NUMA {} {nodes}: the container \
                 will spill onto remote nodes or be OOM-killed; lower the limit or \
                 widen kata-topo.io/numa-nodes and cpuset.mems",
                human_bytes(limit),
                human_bytes(capacity),
                node_word(&nodes)
            ),
            json!({"max_bytes": capacity, "numa_nodes": nodes.to_vec()}),
            json!({"limit_bytes": limit}),
        );
    }
}

/// A size for people: GiB from one GiB up, else MiB, one decimal.
fn human_bytes(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes >= GIB {
        format!("{:.1} GiB", bytes as f64 / GIB as f64)
    } else {
        format!("{:.1} MiB", bytes as f64 / MIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(512 << 20), "512.0 MiB");
    }
}
