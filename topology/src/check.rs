//! The rules: one request (create, recreate or update) against the pod's intent, its baseline
//! and the host as it is now, giving a [`Verdict`].
//!
//! Severity comes from one table ([`severity`]) keyed by rule and policy, so the policy
//! semantics (see the README, "Intent, rules and verdicts") live in one place:
//!
//! | rule | none | best-effort | restricted | single-numa-node |
//! | --- | --- | --- | --- | --- |
//! | `cpu-unknown`, `vfio-missing` | error | warning | error | error |
//! | `intent-invalid` | error | error | error | error |
//! | `check-failed` | warning (error with `fail_closed`) | ← | ← | ← |
//! | `cpu-spans-numa` | – | – | – | error |
//! | `cpu-outside-intent`, `mems-mismatch`, `memory-exceeds-nodes`, `vfio-remote` | – | warning | error | error |
//! | `vfio-locality-unknown`, `topology-drift` | – | warning | warning | warning |
//! | `vcpu-pinning-lost`, `vcpu-overlap` | – | warning | warning | error |
//! | `vcpu-affinity-drift`, `guest-numa-uncovered` | – | warning | error | error |
//!
//! The VM rules need Kata's configuration ([`Request::kata`]) and, for what the VM actually
//! got, its view ([`Request::vm`]).

use serde_json::{json, Value};

use crate::host::{Bdf, Host, Locality};
use crate::idset::IdSet;
use crate::intent::{Baseline, BaselineDevice, Intent, Mode, Policy, BASELINE_VERSION};
use crate::kata::KataConfig;
use crate::request::{ContainerKind, ContainerSpec, Resources};
use crate::sysfs::{Sysfs, SysfsError, VfioRef};
use crate::verdict::{Decision, Finding, Operation, Rule, Severity, Verdict};
use crate::vm::VmView;

/// Configured defaults (`[topology_guard]` or CLI defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Defaults {
    /// `default_policy`.
    pub policy: Policy,
    /// `mode`.
    pub mode: Mode,
    /// `fail_closed`: a `check-failed` finding is an error.
    pub fail_closed: bool,
}

/// Values that win over annotations (the CLI's `--policy` and `--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overrides {
    /// Policy to apply whatever the pod says.
    pub policy: Option<Policy>,
    /// Mode to apply whatever the pod says.
    pub mode: Option<Mode>,
}

/// One request to check.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The container's OCI spec (annotations, devices, resources at create).
    pub spec: &'a ContainerSpec,
    /// For an update: the new `LinuxResources`.
    pub update: Option<&'a Resources>,
    /// For an update: the resources in force before it (default: the spec's).
    pub current: Option<&'a Resources>,
    /// The container's baseline, if one was recorded (makes a create a recreate).
    pub baseline: Option<&'a Baseline>,
    /// The container (task) id, when known.
    pub container_id: Option<&'a str>,
    /// CLI overrides.
    pub overrides: Overrides,
    /// Kata's configuration (with the pod's annotations applied), for the VM rules.
    pub kata: Option<&'a KataConfig>,
    /// What the VM actually got, for the observed VM rules.
    pub vm: Option<&'a VmView>,
}

impl<'a> Request<'a> {
    /// A create (or recreate, with a baseline) of this spec.
    pub fn create(spec: &'a ContainerSpec) -> Self {
        Self {
            spec,
            update: None,
            current: None,
            baseline: None,
            container_id: None,
            overrides: Overrides::default(),
            kata: None,
            vm: None,
        }
    }
}

/// The severity of a rule under a policy; `None` means the policy does not report it.
pub fn severity(rule: Rule, policy: Policy, fail_closed: bool) -> Option<Severity> {
    use Severity::{Error, Warning};
    match rule {
        Rule::IntentInvalid => Some(Error),
        Rule::CheckFailed => Some(if fail_closed { Error } else { Warning }),
        Rule::CpuUnknown | Rule::VfioMissing => Some(match policy {
            Policy::BestEffort => Warning,
            _ => Error,
        }),
        Rule::CpuSpansNuma => (policy == Policy::SingleNumaNode).then_some(Error),
        Rule::VfioLocalityUnknown | Rule::TopologyDrift => match policy {
            Policy::None => None,
            _ => Some(Warning),
        },
        Rule::VcpuPinningLost | Rule::VcpuOverlap => match policy {
            Policy::None => None,
            Policy::BestEffort | Policy::Restricted => Some(Warning),
            Policy::SingleNumaNode => Some(Error),
        },
        _ => match policy {
            Policy::None => None,
            Policy::BestEffort => Some(Warning),
            Policy::Restricted | Policy::SingleNumaNode => Some(Error),
        },
    }
}

/// A `check-failed` finding under a policy, or `None` when the policy does not report it.
pub fn check_failed(policy: Policy, fail_closed: bool, reason: &str) -> Option<Finding> {
    severity(Rule::CheckFailed, policy, fail_closed).map(|severity| Finding {
        rule: Rule::CheckFailed,
        severity,
        message: format!("the topology check could not run: {reason}; the request was not checked"),
        expected: json!({"check": "completed"}),
        observed: json!({"error": reason}),
    })
}

/// The verdict for a request whose check could not run at all (no host topology, unreadable
/// spec): one `check-failed` finding. Policy and mode come from the annotations when they are
/// valid, else from the defaults.
pub fn failed_verdict(
    spec: Option<&ContainerSpec>,
    operation: Operation,
    class: Option<crate::verdict::UpdateClass>,
    defaults: Defaults,
    reason: &str,
) -> Verdict {
    let annotation = |key: &str| spec.and_then(|s| s.annotations.get(key));
    let policy = annotation(crate::intent::ANNOTATION_POLICY)
        .and_then(|v| v.parse().ok())
        .unwrap_or(defaults.policy);
    let mode = annotation(crate::intent::ANNOTATION_MODE)
        .and_then(|v| v.parse().ok())
        .unwrap_or(defaults.mode);
    let mut verdict = Verdict {
        operation,
        class,
        sandbox_id: spec.and_then(|s| s.sandbox_id.clone()),
        container_id: None,
        container_name: spec.and_then(|s| s.container_name.clone()),
        pod: spec.map(|s| s.pod.clone()).unwrap_or_default(),
        policy,
        mode,
        decision: Decision::Allow,
        findings: check_failed(policy, defaults.fail_closed, reason)
            .into_iter()
            .collect(),
    };
    verdict.decide();
    verdict
}

/// A VFIO device of the spec, resolved against sysfs and the host.
#[derive(Debug, Clone)]
enum Device {
    /// Present, bound to vfio-pci.
    Usable {
        path: String,
        bdf: Bdf,
        locality: Locality,
    },
    /// Gone or unbound.
    Missing { path: String, reason: String },
    /// Could not be looked at.
    Failed { path: String, reason: String },
}

/// Runs the rules against one host.
#[derive(Debug, Clone, Copy)]
pub struct Checker<'h> {
    host: &'h Host,
    sysfs: Option<&'h Sysfs>,
    defaults: Defaults,
}

struct Findings {
    policy: Policy,
    fail_closed: bool,
    list: Vec<Finding>,
}

impl Findings {
    fn add(&mut self, rule: Rule, message: String, expected: Value, observed: Value) {
        if let Some(severity) = severity(rule, self.policy, self.fail_closed) {
            self.list.push(Finding {
                rule,
                severity,
                message,
                expected,
                observed,
            });
        }
    }
}

fn node_word(nodes: &IdSet) -> &'static str {
    if nodes.len() == 1 {
        "node"
    } else {
        "nodes"
    }
}

impl<'h> Checker<'h> {
    /// A checker over a loaded host and, when VFIO devices are to be resolved, a sysfs tree.
    pub fn new(host: &'h Host, sysfs: Option<&'h Sysfs>, defaults: Defaults) -> Self {
        Self {
            host,
            sysfs,
            defaults,
        }
    }

    /// The host it checks against.
    pub fn host(&self) -> &'h Host {
        self.host
    }

    fn resolve(&self, vfio: &VfioRef) -> Vec<Device> {
        let path = vfio.path();
        let Some(sysfs) = self.sysfs else {
            return vec![Device::Failed {
                path,
                reason: "no sysfs root is configured to resolve VFIO devices".to_string(),
            }];
        };
        let bdfs = match sysfs.devices_of(vfio) {
            Ok(b) => b,
            Err(e @ SysfsError::Missing { .. }) => {
                return vec![Device::Missing {
                    path,
                    reason: e.to_string(),
                }]
            }
            Err(e) => {
                return vec![Device::Failed {
                    path,
                    reason: crate::text::error_chain(&e),
                }]
            }
        };
        bdfs.into_iter()
            .map(|bdf| match sysfs.device(bdf) {
                Ok(Some(state)) if state.bound_to_vfio() => Device::Usable {
                    path: path.clone(),
                    bdf,
                    locality: self.host.device_locality(bdf, Some(&state)),
                },
                Ok(Some(state)) => Device::Missing {
                    path: path.clone(),
                    reason: format!(
                        "device {bdf} is bound to {} instead of vfio-pci",
                        state.driver.as_deref().unwrap_or("no driver")
                    ),
                },
                Ok(None) => Device::Missing {
                    path: path.clone(),
                    reason: format!("device {bdf} is no longer on the PCI bus"),
                },
                Err(e) => Device::Failed {
                    path: path.clone(),
                    reason: crate::text::error_chain(&e),
                },
            })
            .collect()
    }

    fn resolve_all(&self, spec: &ContainerSpec) -> Vec<Device> {
        spec.vfio.iter().flat_map(|v| self.resolve(v)).collect()
    }

    /// The baseline a first create of `spec` records.
    pub fn record_baseline(&self, spec: &ContainerSpec) -> Baseline {
        let cpus = spec.resources.cpus.clone();
        let cpu_nodes = cpus
            .as_ref()
            .map(|c| self.host.nodes_of_cpus(c))
            .unwrap_or_default();
        let devices = self
            .resolve_all(spec)
            .into_iter()
            .filter_map(|d| match d {
                Device::Usable {
                    path,
                    bdf,
                    locality,
                } => Some(BaselineDevice {
                    path,
                    bus_id: bdf,
                    numa_nodes: locality.nodes().cloned(),
                }),
                _ => None,
            })
            .collect();
        Baseline {
            version: BASELINE_VERSION,
            sandbox_id: spec.sandbox_id.clone(),
            container_name: spec.container_name.clone(),
            cpus,
            mems: spec.resources.mems.clone(),
            cpu_nodes,
            devices,
            topology_fingerprint: self.host.fingerprint().to_string(),
        }
    }

    /// Checks one request.
    pub fn check(&self, req: &Request<'_>) -> Verdict {
        let spec = req.spec;
        let (intent, intent_findings) = Intent::from_annotations(
            &spec.annotations,
            self.defaults.policy,
            self.defaults.mode,
            self.host,
        );
        let policy = req.overrides.policy.unwrap_or(intent.policy);
        let mode = req.overrides.mode.unwrap_or(intent.mode);
        let operation = match (req.update, spec.kind, req.baseline) {
            (Some(_), _, _) => Operation::Update,
            (None, ContainerKind::Sandbox, _) => Operation::Sandbox,
            (None, _, Some(_)) => Operation::Recreate,
            (None, _, None) => Operation::Create,
        };
        let current = req.current.unwrap_or(&spec.resources);
        let class = req.update.map(|u| current.classify(u));
        let effective = match req.update {
            Some(u) => current.merged(u),
            None => spec.resources.clone(),
        };
        let mut f = Findings {
            policy,
            fail_closed: self.defaults.fail_closed,
            list: intent_findings,
        };
        let allowed = match (&intent.numa_nodes, req.baseline) {
            (Some(n), _) => Some((n.clone(), "the pod's kata-topo.io/numa-nodes")),
            (None, Some(b)) if !b.nodes().is_empty() => Some((b.nodes(), "the baseline")),
            _ => None,
        };
        let allowed_ref = allowed.as_ref().map(|(n, _)| n);

        let cpu_nodes = effective
            .cpus
            .as_ref()
            .map(|cpus| self.check_cpus(&mut f, cpus, policy, allowed.as_ref()));
        if let Some(mems) = &effective.mems {
            self.check_mems(
                &mut f,
                mems,
                effective.cpus.as_ref(),
                cpu_nodes.as_ref(),
                allowed.as_ref(),
            );
        }
        if let Some(limit) = effective.memory_limit {
            let nodes = effective
                .mems
                .as_ref()
                .map(|m| m.intersection(&self.host.node_ids()))
                .or_else(|| allowed_ref.cloned());
            if let Some(nodes) = nodes.filter(|n| !n.is_empty()) {
                let capacity = self.host.memory_of(&nodes);
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
        }
        for bad in &spec.bad_devices {
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
        let devices = self.resolve_all(spec);
        self.check_devices(&mut f, &devices, cpu_nodes.as_ref(), allowed.as_ref());
        if let Some(baseline) = req.baseline {
            self.check_drift(&mut f, baseline, &devices);
        }
        if let Some(kata) = req.kata {
            self.check_kata(
                &mut f,
                kata,
                current,
                &effective,
                req.update.is_some(),
                req.vm,
                &devices,
            );
        }
        if let Some(vm) = req.vm {
            let allowed_nodes = allowed_ref
                .cloned()
                .or_else(|| cpu_nodes.clone().filter(|n| !n.is_empty()));
            self.check_vm(&mut f, vm, allowed_nodes.as_ref());
        }

        let mut verdict = Verdict {
            operation,
            class,
            sandbox_id: spec.sandbox_id.clone(),
            container_id: req.container_id.map(str::to_string),
            container_name: spec.container_name.clone(),
            pod: spec.pod.clone(),
            policy,
            mode,
            decision: Decision::Allow,
            findings: f.list,
        };
        verdict.decide();
        verdict
    }

    /// `cpu-unknown`, `cpu-spans-numa`, `cpu-outside-intent`; returns the CPUs' home nodes.
    fn check_cpus(
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
    fn check_mems(
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

    /// `vfio-missing`, `vfio-locality-unknown`, `vfio-remote`, and `check-failed` for devices
    /// that could not be looked at.
    fn check_devices(
        &self,
        f: &mut Findings,
        devices: &[Device],
        cpu_nodes: Option<&IdSet>,
        allowed: Option<&(IdSet, &str)>,
    ) {
        let cpu_nodes = cpu_nodes.filter(|n| !n.is_empty());
        for device in devices {
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
                        self.host.nodes.len()
                    ),
                    json!({"numa_nodes": cpu_nodes.map(IdSet::to_vec)}),
                    json!({"device": bdf, "numa_nodes": Value::Null, "reason": why}),
                ),
                Device::Usable {
                    path,
                    bdf,
                    locality: Locality::Nodes(dev_nodes),
                } => {
                    let want = match (cpu_nodes, allowed) {
                        (Some(c), _) if !dev_nodes.intersects(c) => {
                            Some((c, "the container's CPUs".to_string()))
                        }
                        (_, Some((a, source))) if !dev_nodes.intersects(a) => {
                            Some((a, format!("the allowed nodes ({source})")))
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
            }
        }
    }

    /// `vcpu-pinning-lost` (predicted from the configuration and the request) and
    /// `guest-numa-uncovered`.
    #[allow(clippy::too_many_arguments)]
    fn check_kata(
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
    fn check_vm(&self, f: &mut Findings, vm: &VmView, allowed: Option<&IdSet>) {
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

    /// `topology-drift`: the host changed since the baseline, in general (fingerprint) and for
    /// this container (its baseline CPUs' nodes, its devices' nodes).
    fn check_drift(&self, f: &mut Findings, baseline: &Baseline, devices: &[Device]) {
        let host = self.host;
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
            let now = devices.iter().find_map(|d| match d {
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
}

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
    fn severity_table_follows_the_policies() {
        use Rule::*;
        for rule in [
            CpuOutsideIntent,
            MemsMismatch,
            MemoryExceedsNodes,
            VfioRemote,
        ] {
            assert_eq!(severity(rule, Policy::None, false), None);
            assert_eq!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Warning)
            );
            assert_eq!(
                severity(rule, Policy::Restricted, false),
                Some(Severity::Error)
            );
            assert_eq!(
                severity(rule, Policy::SingleNumaNode, false),
                Some(Severity::Error)
            );
        }
        for rule in [CpuUnknown, VfioMissing] {
            assert_eq!(severity(rule, Policy::None, false), Some(Severity::Error));
            assert_eq!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Warning)
            );
        }
        assert_eq!(severity(CpuSpansNuma, Policy::Restricted, false), None);
        assert_eq!(
            severity(CpuSpansNuma, Policy::SingleNumaNode, false),
            Some(Severity::Error)
        );
        assert_eq!(
            severity(VfioLocalityUnknown, Policy::SingleNumaNode, false),
            Some(Severity::Warning)
        );
        assert_eq!(severity(TopologyDrift, Policy::None, false), None);
        assert_eq!(
            severity(CheckFailed, Policy::None, false),
            Some(Severity::Warning)
        );
        assert_eq!(
            severity(CheckFailed, Policy::None, true),
            Some(Severity::Error)
        );
        assert_eq!(
            severity(IntentInvalid, Policy::BestEffort, false),
            Some(Severity::Error)
        );
        // best-effort never yields an error except for an invalid intent.
        for rule in [
            CpuUnknown,
            CpuSpansNuma,
            CpuOutsideIntent,
            MemsMismatch,
            MemoryExceedsNodes,
            VfioRemote,
            VfioLocalityUnknown,
            VfioMissing,
            TopologyDrift,
            CheckFailed,
        ] {
            assert_ne!(
                severity(rule, Policy::BestEffort, false),
                Some(Severity::Error),
                "{rule}"
            );
        }
    }

    #[test]
    fn human_bytes_reads_well() {
        assert_eq!(human_bytes(1 << 30), "1.0 GiB");
        assert_eq!(human_bytes(512 << 20), "512.0 MiB");
    }
}
