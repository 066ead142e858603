//! Shared helpers for the core's tests: real hwloc topologies from hwloc's own test suite
//! (`tests/fixtures/hwloc`), sysfs trees built in temporary directories, and OCI specs.

// Each test binary includes this module and uses part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use kata_topo_core::simulate::SysfsTree;
use kata_topo_core::{
    Baseline, Bdf, Checker, ContainerSpec, Defaults, Host, PodOverrides, Request, Resources, Rule,
    Running, Severity, Sysfs, TopologySource, Verdict,
};
use serde_json::json;

/// The defaults the rule tests check under: the configuration's, but with
/// `pod_overrides = "any"`, since these tests pick each policy through the pod's annotation
/// (the ceiling has tests of its own).
pub fn defaults() -> Defaults {
    Defaults {
        pod_overrides: PodOverrides::Any,
        ..Defaults::default()
    }
}

/// A fixture XML by file name.
pub fn xml(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hwloc/xml")
        .join(name);
    assert!(path.is_file(), "fixture {} is missing", path.display());
    path
}

/// Loads a fixture topology.
pub fn host(name: &str) -> Host {
    Host::load(&TopologySource::Xml(xml(name))).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// A sysfs tree in a temporary directory.
pub struct Tree {
    pub dir: tempfile::TempDir,
    pub tree: SysfsTree,
}

impl Tree {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SysfsTree::at(dir.path().join("sys")).expect("tree");
        Self { dir, tree }
    }

    /// A device bound to vfio-pci in its own group.
    pub fn vfio(self, bdf: &str, node: i32, group: &str) -> Self {
        self.tree
            .add_device(
                bdf.parse().expect("bdf"),
                node,
                Some("vfio-pci"),
                Some(group),
            )
            .expect("device");
        self
    }

    pub fn sysfs(&self) -> Sysfs {
        Sysfs::new(self.tree.root())
    }
}

pub fn bdf(s: &str) -> Bdf {
    s.parse().expect("bdf")
}

/// A CRI container spec.
pub struct SpecBuilder {
    annotations: BTreeMap<String, String>,
    cpu: serde_json::Map<String, serde_json::Value>,
    memory_limit: Option<i64>,
    devices: Vec<String>,
    sandbox: bool,
}

pub fn spec() -> SpecBuilder {
    SpecBuilder {
        annotations: BTreeMap::new(),
        cpu: serde_json::Map::new(),
        memory_limit: None,
        devices: Vec::new(),
        sandbox: false,
    }
}

impl SpecBuilder {
    pub fn cpus(mut self, cpus: &str) -> Self {
        self.cpu.insert("cpus".into(), json!(cpus));
        self
    }
    pub fn mems(mut self, mems: &str) -> Self {
        self.cpu.insert("mems".into(), json!(mems));
        self
    }
    pub fn memory(mut self, bytes: i64) -> Self {
        self.memory_limit = Some(bytes);
        self
    }
    pub fn device(mut self, path: &str) -> Self {
        self.devices.push(path.to_string());
        self
    }
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.into(), value.into());
        self
    }
    pub fn policy(self, policy: &str) -> Self {
        self.annotation("kata-topo.io/policy", policy)
    }
    pub fn nodes(self, nodes: &str) -> Self {
        self.annotation("kata-topo.io/numa-nodes", nodes)
    }
    pub fn sandbox(mut self) -> Self {
        self.sandbox = true;
        self
    }
    pub fn json(&self) -> serde_json::Value {
        let mut annotations = self.annotations.clone();
        annotations.insert(
            "io.kubernetes.cri.container-type".into(),
            if self.sandbox { "sandbox" } else { "container" }.into(),
        );
        annotations.insert("io.kubernetes.cri.sandbox-id".into(), "sb-1".into());
        annotations.insert("io.kubernetes.cri.sandbox-name".into(), "gpu-pod".into());
        annotations.insert("io.kubernetes.cri.sandbox-namespace".into(), "ml".into());
        annotations.insert("io.kubernetes.cri.sandbox-uid".into(), "uid-1".into());
        if !self.sandbox {
            annotations.insert("io.kubernetes.cri.container-name".into(), "trainer".into());
        }
        let mut resources = json!({"cpu": self.cpu});
        if let Some(limit) = self.memory_limit {
            resources["memory"] = json!({"limit": limit});
        }
        let devices: Vec<_> = self
            .devices
            .iter()
            .map(|p| json!({"path": p, "type": "c", "major": 240, "minor": 0}))
            .collect();
        json!({
            "ociVersion": "1.0.2",
            "annotations": annotations,
            "linux": {"resources": resources, "devices": devices}
        })
    }
    pub fn build(&self) -> ContainerSpec {
        ContainerSpec::from_json(self.json().to_string().as_bytes()).expect("spec")
    }
}

pub fn resources(json: serde_json::Value) -> Resources {
    Resources::from_json(json.to_string().as_bytes()).expect("resources")
}

/// Checks a create.
pub fn create(host: &Host, sysfs: Option<&Sysfs>, spec: &ContainerSpec) -> Verdict {
    Checker::new(host, sysfs, defaults()).admit(&Request::new(spec))
}

/// Checks an update against a baseline recorded from the spec's create.
pub fn update(
    host: &Host,
    sysfs: Option<&Sysfs>,
    spec: &ContainerSpec,
    update: &Resources,
) -> Verdict {
    let checker = Checker::new(host, sysfs, defaults());
    let baseline = checker.record_baseline(spec);
    let req = Request {
        container_id: Some("c-1"),
        ..Request::new(spec)
    };
    let running = Running {
        baseline: Some(&baseline),
        ..Running::default()
    };
    checker.update(&req, running, update)
}

/// Checks a recreate against a baseline.
pub fn recreate(
    host: &Host,
    sysfs: Option<&Sysfs>,
    spec: &ContainerSpec,
    baseline: &Baseline,
) -> Verdict {
    let checker = Checker::new(host, sysfs, defaults());
    checker.recreate(&Request::new(spec), baseline)
}

/// The rules found, with severities, sorted.
pub fn rules(v: &Verdict) -> Vec<(Rule, Severity)> {
    let mut r: Vec<_> = v.findings.iter().map(|f| (f.rule, f.severity)).collect();
    r.sort();
    r
}

/// The one finding of a rule.
pub fn finding(v: &Verdict, rule: Rule) -> &kata_topo_core::Finding {
    let found: Vec<_> = v.findings.iter().filter(|f| f.rule == rule).collect();
    assert_eq!(found.len(), 1, "want one {rule} in {:#?}", v.findings);
    found[0]
}

/// A KVM VM view whose vCPU threads may run on these CPU lists, in vCPU order.
pub fn vm_view(pid: u32, allowed: &[&str]) -> kata_topo_core::vm::VmView {
    use kata_topo_core::vm::{Accel, Sampling, Vcpu, VmView};
    VmView {
        pid,
        found_via: None,
        comm: "qemu-system-x86".into(),
        exe: None,
        vmm: None,
        accel: Some(Accel::Kvm),
        kvm_vcpus: (0..allowed.len() as u32).collect(),
        vcpus: allowed
            .iter()
            .zip(0..)
            .map(|(cpus, index)| Vcpu {
                index,
                tid: pid + 1 + index,
                allowed_cpus: cpus.parse().expect("cpu list"),
                sources: Vec::new(),
            })
            .collect(),
        unresolved: Vec::new(),
        disagreements: Vec::new(),
        notes: Vec::new(),
        sampling: Sampling::default(),
        memory_policies: Default::default(),
        memory_nodes: kata_topo_core::IdSet::new(),
        guest_nodes: Vec::new(),
        rejected: None,
    }
}
