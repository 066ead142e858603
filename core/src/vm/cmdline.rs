//! The guest NUMA layout a VMM was started with, from its command line: QEMU's
//! `-object memory-backend-*,id=…,host-nodes=…,policy=…` and `-numa node,nodeid=…,memdev=…`;
//! cloud-hypervisor's `--memory-zone id=…,host_numa_node=…` and
//! `--numa guest_numa_id=…,cpus=[…],memory_zones=[…]`.

use std::collections::BTreeMap;

use serde::Serialize;

use super::procfs::decimal;
use crate::idset::{IdSet, MAX_ID};

/// A guest NUMA node from the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestNode {
    /// Guest node id.
    pub node_id: u32,
    /// The memory backing it: QEMU's memory backend id, cloud-hypervisor's memory zones
    /// (comma-separated).
    pub memdev: Option<String>,
    /// Host nodes its memory is bound to.
    pub host_nodes: Option<IdSet>,
    /// The binding policy (`bind`, `preferred`, `interleave`; cloud-hypervisor binds).
    pub policy: Option<String>,
    /// The vCPUs in the node, when the command line says.
    pub cpus: Option<IdSet>,
}

/// QEMU's arguments.
pub fn qemu_guest_nodes(args: &[String]) -> Vec<GuestNode> {
    let mut backends: BTreeMap<String, (Option<IdSet>, Option<String>)> = BTreeMap::new();
    let mut nodes = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let flag = arg.trim_start_matches('-');
        if flag != "object" && flag != "numa" {
            continue;
        }
        let Some(value) = it.next() else { break };
        let mut parts = value.split(',');
        let kind = parts.next().unwrap_or_default();
        let props: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let get = |k: &str| props.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        let union_of = |k: &str| {
            props
                .iter()
                .filter(|(key, _)| *key == k)
                .filter_map(|(_, v)| IdSet::parse(v).ok())
                .reduce(|a, b| a.union(&b))
        };
        if flag == "object" && kind.starts_with("memory-backend") {
            if let Some(id) = get("id") {
                backends.insert(
                    id.to_string(),
                    (union_of("host-nodes"), get("policy").map(str::to_string)),
                );
            }
        } else if flag == "numa" && (kind == "node" || kind.starts_with("nodeid=")) {
            let node_id = get("nodeid")
                .or_else(|| kind.strip_prefix("nodeid="))
                .and_then(|v| decimal(v, MAX_ID))
                .unwrap_or(u32::try_from(nodes.len()).unwrap_or(u32::MAX));
            nodes.push(GuestNode {
                node_id,
                memdev: get("memdev").map(str::to_string),
                host_nodes: None,
                policy: None,
                cpus: union_of("cpus"),
            });
        }
    }
    for n in &mut nodes {
        if let Some((hn, pol)) = n.memdev.as_ref().and_then(|m| backends.get(m)) {
            n.host_nodes = hn.clone();
            n.policy = pol.clone();
        }
    }
    nodes
}

/// Splits cloud-hypervisor's `key=value,key=[a,b]` option string at the commas outside
/// brackets.
fn ch_options(value: &str) -> Vec<(&str, &str)> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in value.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(&value[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&value[start..]);
    items
        .into_iter()
        .filter_map(|item| item.split_once('='))
        .collect()
}

fn unbracket(v: &str) -> &str {
    v.strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(v)
}

/// The values following `--flag` (or `--flag=value`) up to the next option.
fn ch_values<'a>(args: &'a [String], flag: &str) -> Vec<&'a str> {
    let mut out = Vec::new();
    let mut taking = false;
    for arg in args {
        if let Some(rest) = arg.strip_prefix("--") {
            taking = rest == flag;
            if let Some(v) = rest.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
                out.push(v);
                taking = true;
            }
        } else if taking {
            out.push(arg.as_str());
        }
    }
    out
}

/// cloud-hypervisor's arguments: each `--numa` guest node with the host nodes of its memory
/// zones (`host_numa_node`, which cloud-hypervisor binds the zone's memory to).
pub fn cloud_hypervisor_guest_nodes(args: &[String]) -> Vec<GuestNode> {
    let zones: BTreeMap<&str, Option<u32>> = ch_values(args, "memory-zone")
        .into_iter()
        .filter_map(|v| {
            let opts = ch_options(v);
            let get = |k: &str| opts.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
            let id = get("id")?;
            Some((id, get("host_numa_node").and_then(|n| decimal(n, MAX_ID))))
        })
        .collect();
    ch_values(args, "numa")
        .into_iter()
        .filter_map(|v| {
            let opts = ch_options(v);
            let get = |k: &str| opts.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
            let node_id = decimal(get("guest_numa_id")?, MAX_ID)?;
            let names: Vec<&str> = get("memory_zones")
                .map(|z| unbracket(z).split(',').filter(|s| !s.is_empty()).collect())
                .unwrap_or_default();
            let host_nodes = names
                .iter()
                .filter_map(|z| zones.get(z).copied().flatten())
                .fold(None::<IdSet>, |acc, n| {
                    let mut set = acc.unwrap_or_default();
                    set.insert(n);
                    Some(set)
                });
            Some(GuestNode {
                node_id,
                memdev: (!names.is_empty()).then(|| names.join(",")),
                policy: host_nodes.as_ref().map(|_| "bind".to_string()),
                host_nodes,
                cpus: get("cpus").and_then(|c| IdSet::parse(unbracket(c)).ok()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    fn text(s: &Option<IdSet>) -> Option<String> {
        s.as_ref().map(ToString::to_string)
    }

    #[test]
    fn qemu_numa_arguments() {
        let nodes = qemu_guest_nodes(&args(&[
            "qemu-system-x86_64", "-object", "memory-backend-ram,id=mem0,size=1G,host-nodes=1,policy=bind",
            "-numa", "node,nodeid=0,cpus=0-1,cpus=4,memdev=mem0", "-object",
            "memory-backend-file,id=mem1,size=1G,mem-path=/dev/shm,host-nodes=0,host-nodes=2,policy=interleave",
            "-numa", "node,nodeid=1,memdev=mem1", "-smp", "2",
        ]));
        assert_eq!(nodes.len(), 2);
        assert_eq!(text(&nodes[0].host_nodes).as_deref(), Some("1"));
        assert_eq!(nodes[0].policy.as_deref(), Some("bind"));
        assert_eq!(text(&nodes[0].cpus).as_deref(), Some("0-1,4"));
        assert_eq!(text(&nodes[1].host_nodes).as_deref(), Some("0,2"));
        assert_eq!(nodes[1].cpus, None);
        // Truncated or hostile arguments give what they give, never a panic.
        assert!(qemu_guest_nodes(&args(&["-numa"])).is_empty());
        let odd = qemu_guest_nodes(&args(&["-numa", "node,nodeid=99999999999,memdev="]));
        assert_eq!(odd.len(), 1);
        assert_eq!(odd[0].node_id, 0);
    }

    #[test]
    fn cloud_hypervisor_zones_and_nodes() {
        let a = args(&[
            "cloud-hypervisor",
            "--cpus",
            "boot=4",
            "--memory",
            "size=0",
            "--memory-zone",
            "id=mem0,size=1G,host_numa_node=1",
            "id=mem1,size=1G,host_numa_node=0",
            "id=mem2,size=1G",
            "--numa",
            "guest_numa_id=0,cpus=[0-1,3],distances=[1@20],memory_zones=[mem0,mem2]",
            "guest_numa_id=1,cpus=[2],memory_zones=mem1",
            "--numa=guest_numa_id=2,memory_zones=[mem2]",
            "--console",
            "off",
        ]);
        let nodes = cloud_hypervisor_guest_nodes(&a);
        assert_eq!(nodes.len(), 3, "{nodes:?}");
        assert_eq!(nodes[0].node_id, 0);
        assert_eq!(nodes[0].memdev.as_deref(), Some("mem0,mem2"));
        assert_eq!(text(&nodes[0].host_nodes).as_deref(), Some("1"));
        assert_eq!(nodes[0].policy.as_deref(), Some("bind"));
        assert_eq!(text(&nodes[0].cpus).as_deref(), Some("0-1,3"));
        assert_eq!(text(&nodes[1].host_nodes).as_deref(), Some("0"));
        assert_eq!(text(&nodes[1].cpus).as_deref(), Some("2"));
        // A zone without host_numa_node is not bound.
        assert_eq!(nodes[2].host_nodes, None);
        assert_eq!(nodes[2].policy, None);
        // QEMU's parser does not read cloud-hypervisor's options, nor the reverse.
        assert!(qemu_guest_nodes(&a).is_empty());
        assert!(cloud_hypervisor_guest_nodes(&args(&["-numa", "guest_numa_id=0"])).is_empty());
        // Unbalanced brackets and junk do not panic.
        assert!(
            cloud_hypervisor_guest_nodes(&args(&["--numa", "]],[[,=,guest_numa_id=x"])).is_empty()
        );
    }
}
