//! CPU and memory placement: `cpu-unknown`, `cpu-spans-numa`, `cpu-outside-intent`,
//! `mems-mismatch`.

use serde_json::json;

use crate::idset::IdSet;
use crate::intent::Policy;
use crate::verdict::Rule;

use super::{node_word, Checker, Findings};

impl Checker<'_> {
    /// `cpu-unknown`, `cpu-spans-numa`, `cpu-outside-intent`; returns the CPUs' home nodes.
    pub(super) fn check_cpus(
        &self,
        f: &mut Findings,
        cpus: &IdSet,
        policy: Policy,
        allowed: Option<&(IdSet, &str)>,
    ) -> IdSet {
        let host = self.host;
        let unknown = cpus.difference(&host.online_cpus);
        if !unknown.is_empty() {
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
                    "cpuset {cpus} names CPUs the host cannot run it on: {}; the host's online \
                     CPUs are {}; fix the cpuset or bring the CPUs online",
                    what.join(", "),
                    host.online_cpus
                ),
                json!({"cpus": host.online_cpus.to_string()}),
                json!({"cpus": cpus.to_string(), "offline": offline.to_string(), "nonexistent": absent.to_string()}),
            );
        }
        let usable = cpus.intersection(&host.online_cpus);
        let nodes = host.nodes_of_cpus(&usable);
        if policy == Policy::SingleNumaNode && nodes.len() > 1 {
            f.add(
                Rule::CpuSpansNuma,
                format!(
                    "cpuset {cpus} spans NUMA nodes {nodes} but the policy is single-numa-node; \
                     keep the cpuset within one node"
                ),
                json!({"numa_nodes_count": 1}),
                json!({"cpus": cpus.to_string(), "numa_nodes": nodes.to_vec()}),
            );
        }
        if let Some((allowed, source)) = allowed {
            let outside = nodes.difference(allowed);
            if !outside.is_empty() {
                let stray: IdSet = usable
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
                    json!({"numa_nodes": nodes.to_vec(), "cpus": cpus.to_string(), "outside_cpus": stray.to_string()}),
                );
            }
        }
        nodes
    }

    /// `mems-mismatch`: memory nodes outside the allowed ones, missing from the host, remote to
    /// the CPUs, or leaving a CPU node without local memory.
    pub(super) fn check_mems(
        &self,
        f: &mut Findings,
        mems: &IdSet,
        cpus: Option<&IdSet>,
        cpu_nodes: Option<&IdSet>,
        allowed: Option<&(IdSet, &str)>,
    ) {
        let host = self.host;
        let mut problems = Vec::new();
        let absent = mems.difference(&host.node_ids());
        if !absent.is_empty() {
            problems.push(format!("the host has no NUMA node {absent}"));
        }
        let mut expected = json!({});
        if let Some((allowed, source)) = allowed {
            let outside = mems.difference(allowed).difference(&absent);
            if !outside.is_empty() {
                problems.push(format!(
                    "memory {} {outside} outside the allowed {allowed} ({source})",
                    node_word(&outside)
                ));
            }
            expected = json!({"numa_nodes": allowed.to_vec()});
        }
        if let (Some(cpus), Some(cpu_nodes)) = (cpus, cpu_nodes) {
            let usable = cpus.intersection(&host.online_cpus);
            let remote: IdSet = mems
                .iter()
                .filter(|&m| {
                    host.node(m)
                        .is_some_and(|n| !n.local_cpus.intersects(&usable))
                })
                .collect();
            if !remote.is_empty() {
                problems.push(format!(
                    "memory {} {remote} remote to CPUs {cpus}",
                    node_word(&remote)
                ));
            }
            let bare = cpu_nodes.difference(mems);
            if !bare.is_empty() {
                problems.push(format!(
                    "CPUs on {} {bare} have no local memory in cpuset.mems",
                    node_word(&bare)
                ));
            }
            if allowed.is_none() {
                expected = json!({"numa_nodes": cpu_nodes.to_vec()});
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
                json!({"mems": mems.to_string(), "cpus": cpus.map(ToString::to_string)}),
            );
        }
    }
}
