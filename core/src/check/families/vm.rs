//! The Kata and VM rules: `vcpu-pinning-lost` and `guest-numa-uncovered` predicted from Kata's
//! configuration and the request, `vcpu-affinity-drift` and `vcpu-overlap` observed on the
//! VM's real vCPU threads.

use std::collections::BTreeMap;

use serde_json::json;

use crate::check::rule::Rule;
use crate::check::verdict::Operation;
use crate::host::Locality;
use crate::input::kata::KataConfig;
use crate::input::spec::Resources;
use crate::vm::VmView;

use crate::check::context::Context;
use crate::check::devices::Device;
use crate::check::{node_word, Findings};

/// The Kata rules when Kata's configuration is known, then the VM rules when the VM's view is.
pub(in crate::check) fn check(cx: &Context<'_>, f: &mut Findings) {
    if let Some(kata) = &cx.kata {
        vcpu_pinning_lost(cx, kata, f);
        guest_numa_uncovered(cx, kata, f);
    }
    if let Some(vm) = cx.vm.filter(|v| v.is_vmm()) {
        vcpu_affinity_drift(cx, vm, f);
        vcpu_overlap(vm, f);
    }
}

/// `vcpu-pinning-lost`, predicted: Kata pins vCPUs only while their number equals the cpuset
/// size, and the request makes them differ.
fn vcpu_pinning_lost(cx: &Context<'_>, kata: &KataConfig, f: &mut Findings) {
    let Some(cpus) = cx
        .effective
        .cpus
        .as_ref()
        .filter(|_| kata.enable_vcpus_pinning)
    else {
        return;
    };
    let limit = |r: &Resources| match (r.cpu_quota, r.cpu_period) {
        (Some(q), Some(p)) if q > 0 && p > 0 => q as f64 / p as f64,
        _ => 0.0,
    };
    // Static sizing: the VM keeps the vCPUs it was built with. Otherwise Kata resizes it to
    // default_vcpus + the containers' limits.
    let (vcpus, how) = if kata.static_sandbox_resource_mgmt && cx.operation == Operation::Update {
        match cx.running_vm.or(cx.vm).filter(|v| v.vcpu_count() > 0) {
            Some(v) => (
                u32::try_from(v.vcpu_count()).unwrap_or(u32::MAX),
                "the VM's vCPUs (static sizing)",
            ),
            None => (kata.vcpus_for(limit(cx.current)), "static sizing at create"),
        }
    } else {
        (
            kata.vcpus_for(limit(&cx.effective)),
            "default_vcpus + the CPU limit",
        )
    };
    if vcpus as usize != cpus.len() {
        f.add(
            Rule::VcpuPinningLost,
            format!(
                "Kata pins vCPUs only when their number equals the cpuset size: the VM \
                 will have {vcpus} vCPUs ({how}) for cpuset {cpus} ({} CPUs), so every \
                 vCPU floats over the whole cpuset; size the CPU limit and the cpuset \
                 alike",
                cpus.len()
            ),
            json!({"vcpus": cpus.len()}),
            json!({"vcpus": vcpus, "cpus": cpus.to_string()}),
        );
    }
}

/// `guest-numa-uncovered`: in Kata's NUMA mode, a VFIO device's host node is not mapped into
/// the guest.
fn guest_numa_uncovered(cx: &Context<'_>, kata: &KataConfig, f: &mut Findings) {
    let Some(mapped) = kata.mapped_host_nodes() else {
        return;
    };
    for d in &cx.devices {
        if let Device::Usable {
            path,
            bdf,
            locality: Locality::Nodes(nodes),
        } = d
        {
            if !nodes.intersects(&mapped) {
                f.add(
                    Rule::GuestNumaUncovered,
                    format!(
                        "VFIO device {bdf} ({path}) is local to host node {nodes}, which \
                         numa_mapping does not map into the guest (it maps {mapped}): the \
                         guest sees the device on no local node; add node {nodes} to \
                         numa_mapping or use a device on node {mapped}"
                    ),
                    json!({"numa_nodes": mapped.to_vec()}),
                    json!({"numa_nodes": nodes.to_vec(), "device": bdf}),
                );
            }
        }
    }
}

/// `vcpu-affinity-drift`: vCPU threads that may run on CPUs outside the allowed nodes (else
/// outside the nodes of the container's CPUs).
fn vcpu_affinity_drift(cx: &Context<'_>, vm: &VmView, f: &mut Findings) {
    let Some(allowed) = cx.allowed_nodes().or(cx.cpu_nodes()) else {
        return;
    };
    let drifting: Vec<_> = vm
        .vcpus
        .iter()
        .filter_map(|v| {
            let nodes = cx.host.nodes_of_cpus(&v.allowed_cpus);
            let outside = nodes.difference(allowed);
            (!outside.is_empty()).then(|| json!({"vcpu": v.index, "tid": v.tid, "allowed_cpus": v.allowed_cpus.to_string(), "numa_nodes": nodes.to_vec()}))
        })
        .collect();
    if !drifting.is_empty() {
        f.add(
            Rule::VcpuAffinityDrift,
            format!(
                "{} of the VM's {} vCPU threads (pid {}) may run on CPUs outside NUMA \
                 {} {allowed}: the guest runs cross-NUMA whatever its cpuset says; \
                 restore the sandbox cgroup's cpuset or Kata's vCPU pinning",
                drifting.len(),
                vm.vcpus.len(),
                vm.pid,
                node_word(allowed)
            ),
            json!({"numa_nodes": allowed.to_vec()}),
            json!({"vcpus": drifting}),
        );
    }
}

/// `vcpu-overlap`: several vCPU threads pinned to one host CPU.
fn vcpu_overlap(vm: &VmView, f: &mut Findings) {
    let mut pinned: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for v in &vm.vcpus {
        if v.allowed_cpus.len() == 1 {
            if let Some(cpu) = v.allowed_cpus.first() {
                pinned.entry(cpu).or_default().push(v.index);
            }
        }
    }
    let shared: Vec<_> = pinned
        .iter()
        .filter(|(_, vcpus)| vcpus.len() > 1)
        .map(|(cpu, vcpus)| json!({"cpu": cpu, "vcpus": vcpus}))
        .collect();
    if !shared.is_empty() {
        f.add(
            Rule::VcpuOverlap,
            format!(
                "several vCPUs of VM pid {} are pinned to the same host CPU ({}): they \
                 time-share one core (Kata issue #13539); recreate the sandbox or re-pin \
                 its vCPU threads",
                vm.pid,
                shared
                    .iter()
                    .map(|s| format!("CPU {} ← vCPUs {}", s["cpu"], s["vcpus"]))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            json!({"distinct_cpus": vm.vcpus.len()}),
            json!({"shared": shared}),
        );
    }
}
