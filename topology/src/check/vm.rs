//! The VM rules: `vcpu-pinning-lost` and `guest-numa-uncovered` from Kata's configuration,
//! `vcpu-affinity-drift` and `vcpu-overlap` from the VM's real vCPU threads.

use serde_json::json;

use crate::host::Locality;
use crate::idset::IdSet;
use crate::kata::KataConfig;
use crate::request::Resources;
use crate::verdict::Rule;
use crate::vm::VmView;

use super::devices::Device;
use super::{node_word, Checker, Findings};

impl Checker<'_> {
    /// `vcpu-pinning-lost` (predicted from the configuration and the request) and
    /// `guest-numa-uncovered`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn check_kata(
        &self,
        f: &mut Findings,
        kata: &KataConfig,
        current: &Resources,
        effective: &Resources,
        is_update: bool,
        vm: Option<&VmView>,
        devices: &[Device],
    ) {
        if let Some(cpus) = effective
            .cpus
            .as_ref()
            .filter(|_| kata.enable_vcpus_pinning)
        {
            let limit = |r: &Resources| match (r.cpu_quota, r.cpu_period) {
                (Some(q), Some(p)) if q > 0 && p > 0 => q as f64 / p as f64,
                _ => 0.0,
            };
            // Static sizing: the VM keeps the vCPUs it was built with. Otherwise Kata resizes
            // it to default_vcpus + the containers' limits.
            let (vcpus, how) = if kata.static_sandbox_resource_mgmt && is_update {
                match vm.filter(|v| v.vcpu_count() > 0) {
                    Some(v) => (
                        u32::try_from(v.vcpu_count()).unwrap_or(u32::MAX),
                        "the VM's vCPUs (static sizing)",
                    ),
                    None => (kata.vcpus_for(limit(current)), "static sizing at create"),
                }
            } else {
                (
                    kata.vcpus_for(limit(effective)),
                    "default_vcpus + the CPU limit",
                )
            };
            if vcpus as usize != cpus.len() {
                f.add(
                    Rule::VcpuPinningLost,
                    format!(
                        "Kata pins vCPUs only when their number equals the cpuset size: the VM                          will have {vcpus} vCPUs ({how}) for cpuset {cpus} ({} CPUs), so every                          vCPU floats over the whole cpuset; size the CPU limit and the cpuset                          alike",
                        cpus.len()
                    ),
                    json!({"vcpus": cpus.len()}),
                    json!({"vcpus": vcpus, "cpus": cpus.to_string()}),
                );
            }
        }
        if let Some(mapped) = kata.mapped_host_nodes() {
            for d in devices {
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
                                "VFIO device {bdf} ({path}) is local to host node {nodes}, which                                  numa_mapping does not map into the guest (it maps {mapped}): the                                  guest sees the device on no local node; add node {nodes} to                                  numa_mapping or use a device on node {mapped}"
                            ),
                            json!({"numa_nodes": mapped.to_vec()}),
                            json!({"numa_nodes": nodes.to_vec(), "device": bdf}),
                        );
                    }
                }
            }
        }
    }

    /// `vcpu-affinity-drift` and `vcpu-overlap`, from the VM's real vCPU threads.
    pub(super) fn check_vm(&self, f: &mut Findings, vm: &VmView, allowed: Option<&IdSet>) {
        if let Some(allowed) = allowed {
            let drifting: Vec<_> = vm
                .vcpus
                .iter()
                .filter_map(|v| {
                    let nodes = self.host.nodes_of_cpus(&v.allowed_cpus);
                    let outside = nodes.difference(allowed);
                    (!outside.is_empty()).then(|| json!({"vcpu": v.index, "tid": v.tid, "allowed_cpus": v.allowed_cpus.to_string(), "numa_nodes": nodes.to_vec()}))
                })
                .collect();
            if !drifting.is_empty() {
                f.add(
                    Rule::VcpuAffinityDrift,
                    format!(
                        "{} of the VM's {} vCPU threads (pid {}) may run on CPUs outside NUMA                          {} {allowed}: the guest runs cross-NUMA whatever its cpuset says;                          restore the sandbox cgroup's cpuset or Kata's vCPU pinning",
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
        let mut pinned: std::collections::BTreeMap<u32, Vec<u32>> = Default::default();
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
                    "several vCPUs of VM pid {} are pinned to the same host CPU ({}): they                      time-share one core (Kata issue #13539); recreate the sandbox or re-pin                      its vCPU threads",
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
}
