//! `kata-topo topology`: the host's NUMA nodes and PCI devices with their locality and VFIO
//! group, from the live machine or an hwloc XML export, as lines for people or JSON.

use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_core::host::Locality;
use kata_topo_core::text::printable;
use serde::Serialize;

use crate::commands::HostArgs;
use crate::out;

#[derive(Debug, Args)]
pub(crate) struct TopologyArgs {
    #[command(flatten)]
    host: HostArgs,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct TopologyView {
    source: String,
    fingerprint: String,
    online_cpus: String,
    offline_cpus: String,
    numa_nodes: Vec<NodeView>,
    pci_devices: Vec<PciView>,
}

#[derive(Serialize)]
struct NodeView {
    os_index: u32,
    cpus: String,
    local_cpus: String,
    memory_bytes: u64,
    cpuless: bool,
    subtype: Option<String>,
}

#[derive(Serialize)]
struct PciView {
    bus_id: String,
    class_id: String,
    vendor_id: String,
    device_id: String,
    numa_nodes: Option<Vec<u32>>,
    locality_unknown_reason: Option<String>,
    driver: Option<String>,
    vfio_group: Option<String>,
}

pub(crate) fn topology(args: &TopologyArgs) -> Result<ExitCode> {
    let (host, sysfs) = args.host.load()?;
    let mut pci_devices = Vec::new();
    for dev in &host.pci {
        let state = match &sysfs {
            Some(s) => s
                .device(dev.bus_id)
                .with_context(|| format!("reading sysfs for {}", dev.bus_id))?,
            None => None,
        };
        let locality = host.device_locality(dev.bus_id, state.as_ref());
        let (numa_nodes, reason) = match locality {
            Locality::Nodes(n) => (Some(n.to_vec()), None),
            Locality::Unknown(why) => (None, Some(why)),
        };
        let vfio_group = state
            .as_ref()
            .filter(|s| s.bound_to_vfio())
            .and_then(|s| s.iommu_group.clone());
        pci_devices.push(PciView {
            bus_id: dev.bus_id.to_string(),
            class_id: format!("{:04x}", dev.class_id),
            vendor_id: format!("{:04x}", dev.vendor_id),
            device_id: format!("{:04x}", dev.device_id),
            numa_nodes,
            locality_unknown_reason: reason,
            driver: state.and_then(|s| s.driver),
            vfio_group,
        });
    }
    let view = TopologyView {
        source: host.source_name.clone(),
        fingerprint: host.fingerprint().to_string(),
        online_cpus: host.online_cpus.to_string(),
        offline_cpus: host.all_cpus.difference(&host.online_cpus).to_string(),
        numa_nodes: host
            .nodes
            .iter()
            .map(|n| NodeView {
                os_index: n.os_index,
                cpus: n.cpus.to_string(),
                local_cpus: n.local_cpus.to_string(),
                memory_bytes: n.memory_bytes,
                cpuless: n.cpus.is_empty(),
                subtype: n.subtype.clone(),
            })
            .collect(),
        pci_devices,
    };
    if args.json {
        out::json(&serde_json::to_string_pretty(&view)?)?;
    } else {
        out::lines(&human_topology(&view))?;
    }
    Ok(ExitCode::SUCCESS)
}

fn human_topology(view: &TopologyView) -> String {
    let mut out = format!(
        "host: {} (fingerprint {})\nonline CPUs: {}",
        printable(&view.source),
        view.fingerprint,
        view.online_cpus
    );
    if !view.offline_cpus.is_empty() {
        out.push_str(&format!("  offline: {}", view.offline_cpus));
    }
    out.push_str("\nNUMA nodes:\n");
    for n in &view.numa_nodes {
        let cpus = if n.cpuless {
            format!("no CPUs (local to {})", n.local_cpus)
        } else {
            format!("CPUs {}", n.cpus)
        };
        out.push_str(&format!(
            "  node {:<3} {:<40} {:>10} MiB{}\n",
            n.os_index,
            cpus,
            n.memory_bytes >> 20,
            n.subtype
                .as_deref()
                .map(|s| format!("  [{}]", printable(s)))
                .unwrap_or_default()
        ));
    }
    out.push_str(&format!("PCI devices: {}\n", view.pci_devices.len()));
    for d in &view.pci_devices {
        let nodes = match &d.numa_nodes {
            Some(n) => format!(
                "node {}",
                n.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            None => "node unknown".to_string(),
        };
        out.push_str(&format!(
            "  {}  class {} {}:{}  {:<14}{}\n",
            d.bus_id,
            d.class_id,
            d.vendor_id,
            d.device_id,
            nodes,
            d.vfio_group
                .as_deref()
                .map(|g| format!("  vfio group {}", printable(g)))
                .unwrap_or_default()
        ));
    }
    out
}
