//! `topology-drift`: the host changed since the baseline.

use serde_json::json;

use crate::check::rule::Rule;
use crate::host::Locality;
use crate::idset::IdSet;

use crate::check::context::Context;
use crate::check::devices::Device;
use crate::check::Findings;

/// `topology-drift`: the host changed since the baseline, in general (fingerprint) and for
/// this container (its baseline CPUs' nodes, its devices' nodes).
pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    let Some(baseline) = cx.baseline else {
        return;
    };
    let host = cx.host;
    let mut changes = Vec::new();
    if let Some(cpus) = &baseline.cpus {
        let now = host.nodes_of_cpus(&cpus.intersection(&host.online_cpus));
        if now != baseline.cpu_nodes {
            changes.push(format!(
                "baseline CPUs {cpus} were on node {} and are now on node {}",
                baseline.cpu_nodes,
                if now.is_empty() {
                    "-".to_string()
                } else {
                    now.to_string()
                }
            ));
        }
    }
    for old in &baseline.devices {
        let now = cx.devices.iter().find_map(|d| match d {
            Device::Usable { bdf, locality, .. } if *bdf == old.bus_id => Some(locality),
            _ => None,
        });
        let now_nodes = now.and_then(Locality::nodes);
        if now.is_some() && now_nodes != old.numa_nodes.as_ref() {
            let show = |n: Option<&IdSet>| n.map_or("unknown".to_string(), ToString::to_string);
            changes.push(format!(
                "device {} moved from node {} to node {}",
                old.bus_id,
                show(old.numa_nodes.as_ref()),
                show(now_nodes)
            ));
        }
    }
    let fingerprint_changed = baseline.topology_fingerprint != host.fingerprint();
    if fingerprint_changed && changes.is_empty() {
        changes.push("the host's NUMA nodes, online CPUs or device locality changed".into());
    }
    if !changes.is_empty() {
        f.add(
            Rule::TopologyDrift,
            format!(
                "the host topology changed since the container was admitted: {}; the \
                 Topology Manager's decision no longer holds: drain and re-admit the pod",
                changes.join("; ")
            ),
            json!({"topology_fingerprint": baseline.topology_fingerprint, "cpu_nodes": baseline.cpu_nodes.to_vec()}),
            json!({"topology_fingerprint": host.fingerprint(), "changes": changes}),
        );
    }
}
