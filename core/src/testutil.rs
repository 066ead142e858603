//! What tests build hosts and requests from — the one place for them in this crate, not part
//! of the product: compiled for the core's own tests, and for other crates' tests, the
//! integration harness and the demo through the feature `testing`.
//!
//! - [`SysfsTree`] lays out sysfs the way the kernel does (real directories under `devices/`,
//!   symlinks from `bus/pci/devices`, `kernel/iommu_groups` and `class/vfio-dev`), so a test
//!   describes the VFIO devices of a simulated host and reads them through the same
//!   [`Sysfs`](crate::host::sysfs::Sysfs) code that reads `/sys`; [`TempSysfs`] is one in a
//!   temporary directory.
//! - [`GPU`]: the bundled scenario's GPU (`scenario/`), the one the demo passes through.
//! - Fixture topologies, a CRI container spec builder and the checks of a create, an update
//!   and a recreate, for the rule tests.
//! - For the unit tests only: FIFOs where a file is expected, a guard against a read that
//!   blocks, and hostile strings for property tests.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::json;

use crate::{
    Baseline, Bdf, Checker, ContainerSpec, Defaults, Finding, Host, PodOverrides, Request,
    Resources, Rule, Running, Severity, Sysfs, TopologySource, Verdict,
};

/// The bundled scenario's GPU: in `scenario/two-node-host.xml` and `scenario/sysfs` on NUMA
/// node 1 in IOMMU group 42, as the integration tests and the demo simulate it.
pub const GPU: &str = "0000:b7:00.0";

/// A sysfs tree under a directory the caller owns.
#[derive(Debug, Clone)]
pub struct SysfsTree {
    root: PathBuf,
}

impl SysfsTree {
    /// A tree rooted at `root` (created if missing).
    pub fn at(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    /// Its root, to pass as the sysfs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Adds a PCI device: its `numa_node`, the driver it is bound to (if any) and its IOMMU
    /// group (if any). Adding a device again replaces its attributes.
    pub fn add_device(
        &self,
        bdf: Bdf,
        numa_node: i32,
        driver: Option<&str>,
        group: Option<&str>,
    ) -> io::Result<()> {
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        let dev_rel = format!("devices/{bus_dir}/{bdf}");
        let dev = self.root.join(&dev_rel);
        std::fs::create_dir_all(&dev)?;
        std::fs::write(dev.join("numa_node"), format!("{numa_node}\n"))?;
        replace_link(&dev.join("driver"), None)?;
        if let Some(driver) = driver {
            let drv = self.root.join("bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&drv)?;
            replace_link(
                &dev.join("driver"),
                Some(&format!("../../../bus/pci/drivers/{driver}")),
            )?;
        }
        replace_link(&dev.join("iommu_group"), None)?;
        if let Some(group) = group {
            let gdir = self
                .root
                .join("kernel/iommu_groups")
                .join(group)
                .join("devices");
            std::fs::create_dir_all(&gdir)?;
            replace_link(
                &gdir.join(bdf.to_string()),
                Some(&format!("../../../../{dev_rel}")),
            )?;
            replace_link(
                &dev.join("iommu_group"),
                Some(&format!("../../../kernel/iommu_groups/{group}")),
            )?;
        }
        let bus = self.root.join("bus/pci/devices");
        std::fs::create_dir_all(&bus)?;
        replace_link(
            &bus.join(bdf.to_string()),
            Some(&format!("../../../{dev_rel}")),
        )
    }

    /// Adds the scenario's [`GPU`] as the demo has it: on NUMA node 1, bound to vfio-pci, in
    /// IOMMU group 42.
    pub fn add_gpu(&self) -> io::Result<()> {
        self.add_device(
            GPU.parse().map_err(io::Error::other)?,
            1,
            Some("vfio-pci"),
            Some("42"),
        )
    }

    /// Adds an iommufd character device `vfioN` for a device.
    pub fn add_iommufd(&self, name: &str, bdf: Bdf) -> io::Result<()> {
        let dir = self.root.join("class/vfio-dev").join(name);
        std::fs::create_dir_all(&dir)?;
        // Its character device's number: only a kernel with iommufd's VFIO cdev (6.6+) has one.
        std::fs::write(dir.join("dev"), "511:0\n")?;
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        replace_link(
            &dir.join("device"),
            Some(&format!("../../../devices/{bus_dir}/{bdf}")),
        )
    }

    /// Unbinds a device from its driver (as `echo > unbind` does).
    pub fn unbind(&self, bdf: Bdf) -> io::Result<()> {
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        replace_link(
            &self.root.join(format!("devices/{bus_dir}/{bdf}/driver")),
            None,
        )
    }
}

/// A [`SysfsTree`] in a temporary directory, removed with the value.
#[derive(Debug)]
pub struct TempSysfs {
    /// The temporary directory; the tree is its `sys`.
    pub dir: tempfile::TempDir,
    pub tree: SysfsTree,
}

impl TempSysfs {
    /// An empty tree; panics if no temporary directory can be made.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SysfsTree::at(dir.path().join("sys")).expect("sysfs tree");
        Self { dir, tree }
    }

    pub fn root(&self) -> &Path {
        self.tree.root()
    }

    /// Adds a device as [`SysfsTree::add_device`] does; panics on an I/O error.
    pub fn device(&self, bdf: Bdf, node: i32, driver: Option<&str>, group: Option<&str>) {
        self.tree
            .add_device(bdf, node, driver, group)
            .expect("add device");
    }

    /// Adds an iommufd device as [`SysfsTree::add_iommufd`] does; panics on an I/O error.
    pub fn iommufd(&self, name: &str, bdf: Bdf) {
        self.tree.add_iommufd(name, bdf).expect("add iommufd");
    }

    /// With a device bound to vfio-pci in its own group.
    pub fn vfio(self, bdf: &str, node: i32, group: &str) -> Self {
        self.device(
            bdf.parse().expect("bdf"),
            node,
            Some("vfio-pci"),
            Some(group),
        );
        self
    }

    /// The tree as the checks read it.
    pub fn sysfs(&self) -> Sysfs {
        Sysfs::new(self.tree.root())
    }
}

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

/// A bus id, which must parse.
pub fn bdf(s: &str) -> Bdf {
    s.parse().expect("bdf")
}

/// A CRI container spec.
#[derive(Debug, Clone)]
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
pub fn finding(v: &Verdict, rule: Rule) -> &Finding {
    let found: Vec<_> = v.findings.iter().filter(|f| f.rule == rule).collect();
    assert_eq!(found.len(), 1, "want one {rule} in {:#?}", v.findings);
    found[0]
}

/// A KVM VM view whose vCPU threads may run on these CPU lists, in vCPU order.
pub fn vm_view(pid: u32, allowed: &[&str]) -> crate::vm::VmView {
    use crate::vm::{Accel, Sampling, Vcpu, VmView};
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
        memory_nodes: crate::IdSet::new(),
        guest_nodes: Vec::new(),
        rejected: None,
    }
}

fn replace_link(link: &Path, target: Option<&str>) -> io::Result<()> {
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match target {
        Some(t) => symlink(t, link),
        None => Ok(()),
    }
}

#[cfg(test)]
pub(crate) use unit::*;

/// The unit tests' own helpers.
#[cfg(test)]
mod unit {
    /// Makes a FIFO at `path`.
    pub(crate) fn mkfifo(path: &std::path::Path) -> std::io::Result<()> {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .map_err(std::io::Error::from)
    }

    /// Strings of up to `max` characters that a hostile pod author might write: any Unicode
    /// character (proptest's `any::<char>` favours NUL, tab, CR, LF, ESC, DEL, quotes and
    /// slashes), C1 controls, and the bidirectional overrides and isolates.
    pub(crate) fn hostile_text(max: usize) -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let c = prop_oneof![
            4 => any::<char>(),
            1 => (0x80u32..0xa0).prop_map(|c| char::from_u32(c).unwrap_or('?')),
            1 => prop::sample::select(vec![
                '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}',
                '\u{2067}', '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}',
                '\u{2028}', '\u{2029}',
            ]),
        ];
        prop::collection::vec(c, 0..=max).prop_map(|v| v.into_iter().collect())
    }

    /// Runs `f` on its own thread and fails the test if it has not returned within a minute:
    /// a guard against a read that blocks forever (a FIFO), not a measure of speed.
    pub(crate) fn within_a_minute<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        match run_for_a_minute(f) {
            Some(value) => value,
            None => panic!("{what} did not return: it blocks"),
        }
    }

    /// [`within_a_minute`] for property tests: a case that blocks aborts the test binary at
    /// once, naming its input, rather than have proptest shrink it a minute per attempt.
    pub(crate) fn within_a_minute_or_abort<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        match run_for_a_minute(f) {
            Some(value) => value,
            None => {
                // Straight to stderr: the test harness's capture would die with the process.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{what} did not return: it blocks");
                std::process::abort()
            }
        }
    }

    fn run_for_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(Ok(value)) => Some(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => None,
        }
    }
}
