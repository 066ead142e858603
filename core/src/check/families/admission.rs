//! What the kubelet admitted against what the container has: `kubelet-cpus-mismatch`,
//! `kubelet-device-mismatch`, and `kubelet-intent-unavailable` when the kubelet, asked, gave
//! no intent.

use serde_json::json;

use crate::check::rule::Rule;
use crate::host::pci::Bdf;

use crate::check::context::Context;
use crate::check::devices::Device;
use crate::check::Findings;

pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    if let Some(reason) = &cx.kubelet_unavailable {
        f.add(
            Rule::KubeletIntentUnavailable,
            format!(
                "the kubelet gave no intent for this pod: {reason}; the pod's annotations and \
                 baseline are checked instead"
            ),
            json!({"intent_source": "kubelet"}),
            json!({"intent_source": cx.origin.to_string(), "reason": reason}),
        );
    }
    let Some(kubelet) = &cx.kubelet else {
        return;
    };
    if let (Some(exclusive), Some(cpus)) = (&kubelet.cpus, &cx.cpus) {
        if &cpus.set != exclusive {
            f.add(
                Rule::KubeletCpusMismatch,
                format!(
                    "the container's cpuset {} is not the exclusive CPUs {exclusive} the \
                     kubelet's CPU manager assigned it: other containers may share them, or it \
                     runs where it was not admitted; restore the cpuset, or recreate the pod",
                    cpus.set
                ),
                json!({"cpus": exclusive, "from": "kubelet"}),
                json!({"cpus": cpus.set}),
            );
        }
    }
    for device in &kubelet.devices {
        for id in &device.device_ids {
            // kata-topo's device plugin names devices by PCI bus id; other plugins' ids are
            // not PCI devices kata-topo can look up.
            let Ok(bdf) = id.parse::<Bdf>() else {
                continue;
            };
            device_check(cx, f, &device.resource_name, &device.numa_nodes, bdf);
        }
    }
}

fn device_check(
    cx: &Context<'_>,
    f: &mut Findings,
    resource: &str,
    admitted: &crate::IdSet,
    bdf: Bdf,
) {
    let in_spec = cx.devices.iter().find_map(|d| match d {
        Device::Usable {
            bdf: b, locality, ..
        } if *b == bdf => Some(locality),
        _ => None,
    });
    let unresolved = cx
        .devices
        .iter()
        .any(|d| matches!(d, Device::Failed { .. } | Device::Missing { .. }));
    match in_spec {
        None if !unresolved => f.add(
            Rule::KubeletDeviceMismatch,
            format!(
                "device {bdf} ({resource}) the kubelet allocated this container is not among \
                 its VFIO devices: the VM does not have it; recreate the pod"
            ),
            json!({"device": bdf.to_string(), "resource": resource, "in_container": true}),
            json!({"device": bdf.to_string(), "in_container": false}),
        ),
        // A device of the spec that cannot be resolved is reported by the VFIO rules.
        None => {}
        Some(locality) => {
            let Some(now) = locality.nodes() else { return };
            if !admitted.is_empty() && !now.is_subset(admitted) {
                f.add(
                    Rule::KubeletDeviceMismatch,
                    format!(
                        "device {bdf} ({resource}) sits on NUMA node {now} but the kubelet \
                         admitted it with topology node {admitted}: the device moved, or its \
                         plugin reported it wrongly; check the slot and the device plugin"
                    ),
                    json!({"device": bdf.to_string(), "resource": resource, "numa_nodes": admitted}),
                    json!({"device": bdf.to_string(), "numa_nodes": now}),
                );
            }
        }
    }
}
