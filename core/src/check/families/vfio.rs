//! VFIO locality: `vfio-missing`, `vfio-locality-unknown`, `vfio-remote`, and `check-failed`
//! for devices that could not be looked at.

use serde_json::{json, Value};

use crate::check::rule::Rule;
use crate::host::pci::Bdf;
use crate::host::Locality;
use crate::idset::IdSet;

use crate::check::context::Context;
use crate::check::devices::Device;
use crate::check::{node_word, Findings};

/// The VFIO rules: device paths that name no VFIO device, then the devices device by device in
/// the spec's order.
pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    for bad in &cx.spec.bad_devices {
        f.add(
            Rule::VfioMissing,
            format!(
                "device {:?} is not a VFIO group or iommufd device ({}); fix the device \
                 request",
                bad.path, bad.reason
            ),
            json!({"device": "/dev/vfio/<group> or /dev/vfio/devices/vfioN"}),
            json!({"device": bad.path}),
        );
    }
    for device in &cx.devices {
        match device {
            Device::Missing { path, reason } => f.add(
                Rule::VfioMissing,
                format!(
                    "VFIO device {path} is not usable: {reason}; rebind it to vfio-pci or \
                     recreate the pod with a device that exists"
                ),
                json!({"device": path, "driver": "vfio-pci"}),
                json!({"device": path, "reason": reason}),
            ),
            Device::Failed { path, reason } => f.add(
                Rule::CheckFailed,
                format!("cannot check VFIO device {path}: {reason}"),
                json!({"device": path}),
                json!({"error": reason}),
            ),
            Device::Usable {
                path,
                bdf,
                locality: Locality::Unknown(why),
            } => f.add(
                Rule::VfioLocalityUnknown,
                format!(
                    "VFIO device {bdf} ({path}) has no known NUMA locality on this \
                     {}-node host ({why}); kata-topo cannot tell whether its DMA is local; \
                     fix the firmware's locality (ACPI _PXM) or pin the pod by hand",
                    cx.host.nodes.len()
                ),
                json!({"numa_nodes": cx.cpu_nodes().map(IdSet::to_vec)}),
                json!({"device": bdf, "numa_nodes": Value::Null, "reason": why}),
            ),
            Device::Usable {
                path,
                bdf,
                locality: Locality::Nodes(nodes),
            } => vfio_remote(cx, path, *bdf, nodes, f),
        }
    }
}

/// `vfio-remote`: the device is local to none of the CPUs' nodes or, without CPUs, to none of
/// the allowed nodes.
fn vfio_remote(cx: &Context<'_>, path: &str, bdf: Bdf, dev_nodes: &IdSet, f: &mut Findings) {
    let want = match (cx.cpu_nodes(), &cx.allowed) {
        (Some(c), _) if !dev_nodes.intersects(c) => Some((c, "the container's CPUs".to_string())),
        (_, Some(a)) if !dev_nodes.intersects(&a.nodes) => {
            Some((&a.nodes, format!("the allowed nodes ({})", a.source)))
        }
        _ => None,
    };
    if let Some((want, what)) = want {
        f.add(
            Rule::VfioRemote,
            format!(
                "VFIO device {bdf} ({path}) is local to NUMA {} {dev_nodes} but \
                 {what} are on {} {want}: its DMA and interrupts cross the \
                 socket interconnect; move the cpuset to node {dev_nodes} or \
                 assign a device local to node {want}",
                node_word(dev_nodes),
                node_word(want),
            ),
            json!({"numa_nodes": want.to_vec()}),
            json!({"numa_nodes": dev_nodes.to_vec(), "device": bdf}),
        );
    }
}
