//! The host: NUMA nodes, CPUs and PCI devices, read once through hwloc.
//!
//! [`Host::load`] is the one place that asks hwloc about the machine. It turns hwloc's tree
//! into plain data (so a [`Host`] is cheap to share read-only across threads and the rules
//! never touch FFI): the NUMA nodes with the CPUs each one is home to, the online and offline
//! CPUs, and every PCI device with its NUMA locality — or *unknown* locality when the device
//! hangs off the root of a multi-node machine.

use std::path::PathBuf;

use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::{BuildFlags, TypeFilter};
use hwlocality::topology::export::xml::XMLExportFlags;
use hwlocality::Topology;
use serde::Serialize;

pub mod cache;
pub mod pci;
pub mod sysfs;

use crate::digest::fnv1a;
use crate::host::pci::{Bdf, DeviceState};
use crate::idset::IdSet;

/// The largest topology XML accepted (the 384-PU, 24-node fixture is under 1 MiB).
pub const MAX_XML_BYTES: u64 = 64 * 1024 * 1024;

/// Where the host description comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopologySource {
    /// The live machine (hwloc's native discovery; `HWLOC_FSROOT` and friends apply).
    Live,
    /// An hwloc XML export (tests, demos, or a saved snapshot of another machine).
    Xml(PathBuf),
}

/// Why the host could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    /// The XML file could not be read.
    #[error("cannot read topology file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The XML file is too large to be a topology.
    #[error("topology file {path} is larger than the {MAX_XML_BYTES} bytes accepted")]
    TooLarge {
        /// The file.
        path: PathBuf,
    },
    /// hwloc refused the input or failed to build the topology.
    #[error("hwloc could not load the topology from {source_name}: {reason}")]
    Hwloc {
        /// `live machine` or the XML path.
        source_name: String,
        /// hwloc's own words.
        reason: String,
    },
    /// The topology loaded but holds no CPU.
    #[error("the topology from {0} has no CPU")]
    NoCpu(String),
}

/// One NUMA node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NumaNode {
    /// The OS index (`/sys/devices/system/node/nodeN`).
    pub os_index: u32,
    /// The CPUs whose home node this is. Empty for a CPU-less node (KNL MCDRAM, CXL memory,
    /// a memory-only node).
    pub cpus: IdSet,
    /// The CPUs this node is local to (hwloc's node cpuset: for a CPU-less node, the CPUs of
    /// the part of the machine it hangs off).
    pub local_cpus: IdSet,
    /// Local memory in bytes.
    pub memory_bytes: u64,
    /// hwloc's subtype (`MCDRAM`, `GPUMemory`, …), when it has one.
    pub subtype: Option<String>,
}

/// Where a device sits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Locality {
    /// Local to these NUMA nodes.
    Nodes(IdSet),
    /// Not determinable; the reason says why.
    Unknown(String),
}

impl Locality {
    /// The nodes, when known.
    pub fn nodes(&self) -> Option<&IdSet> {
        match self {
            Self::Nodes(n) => Some(n),
            Self::Unknown(_) => None,
        }
    }
}

/// One PCI device as hwloc sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciDevice {
    /// Its address.
    pub bus_id: Bdf,
    /// PCI class and subclass (`0x0302` is a 3D controller).
    pub class_id: u16,
    pub vendor_id: u16,
    pub device_id: u16,
    /// NUMA locality from hwloc's tree.
    pub locality: Locality,
}

/// The machine, as plain data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Host {
    /// NUMA nodes by ascending OS index.
    pub nodes: Vec<NumaNode>,
    /// CPUs that exist and are online (allowed to this process or not).
    pub online_cpus: IdSet,
    /// Every CPU hwloc knows of, offline ones included.
    pub all_cpus: IdSet,
    /// PCI devices by ascending address.
    pub pci: Vec<PciDevice>,
    /// The home node of each online CPU, indexed by CPU id.
    cpu_home: Vec<Option<u32>>,
    /// A stable digest of what placement depends on (see [`Host::fingerprint`]).
    fingerprint: String,
    /// Where it came from, for messages.
    pub source_name: String,
}

impl Host {
    /// Loads the host from hwloc: the live machine or an XML export. I/O objects are all kept
    /// and disallowed resources included, so a process inside a restricted cgroup (a shim is
    /// one) still sees the whole machine.
    pub fn load(source: &TopologySource) -> Result<Self, HostError> {
        match source {
            TopologySource::Live => Self::discover().map(|(host, _)| host),
            TopologySource::Xml(path) => {
                let xml =
                    crate::files::read_text_bounded(path, MAX_XML_BYTES).map_err(|source| {
                        if source.kind() == std::io::ErrorKind::FileTooLarge {
                            HostError::TooLarge { path: path.clone() }
                        } else {
                            HostError::Read {
                                path: path.clone(),
                                source,
                            }
                        }
                    })?;
                Self::from_xml(&xml, path.display().to_string())
            }
        }
    }

    /// Discovers the live machine, and exports what hwloc found as XML (the text
    /// [`Host::from_xml`] loads back into the same host).
    pub fn discover() -> Result<(Self, String), HostError> {
        let source_name = "the live machine".to_string();
        let (topology, xml) = guarded(&source_name, || {
            let topology = build_topology(None)?;
            let xml = topology
                .export_xml(XMLExportFlags::empty())
                .map_err(|e| format!("XML export failed: {e}"))?
                .to_string();
            Ok((topology, xml))
        })?;
        Ok((Self::from_topology(&topology, source_name)?, xml))
    }

    /// Loads the host from the text of an hwloc XML export; `source_name` says where it came
    /// from in messages.
    pub fn from_xml(xml: &str, source_name: String) -> Result<Self, HostError> {
        let topology = guarded(&source_name, || build_topology(Some(xml)))?;
        Self::from_topology(&topology, source_name)
    }

    fn from_topology(topology: &Topology, source_name: String) -> Result<Self, HostError> {
        let online_cpus = to_idset(topology.cpuset().iter_set().map(usize::from));
        let all_cpus =
            to_idset(topology.complete_cpuset().iter_set().map(usize::from)).union(&online_cpus);
        if online_cpus.is_empty() {
            return Err(HostError::NoCpu(source_name));
        }
        let mut nodes: Vec<NumaNode> = topology
            .objects_with_type(ObjectType::NUMANode)
            .filter_map(|obj| {
                let os_index = u32::try_from(obj.os_index()?).ok()?;
                let local_cpus = obj
                    .cpuset()
                    .map(|c| to_idset(c.iter_set().map(usize::from)))
                    .unwrap_or_default()
                    .intersection(&online_cpus);
                let memory_bytes = match obj.attributes() {
                    Some(ObjectAttributes::NUMANode(attr)) => {
                        attr.local_memory().map_or(0, |m| m.get())
                    }
                    _ => 0,
                };
                let subtype = obj
                    .subtype()
                    .map(|s| s.to_string_lossy().into_owned())
                    .filter(|s| !s.is_empty());
                Some(NumaNode {
                    os_index,
                    cpus: IdSet::new(),
                    local_cpus,
                    memory_bytes,
                    subtype,
                })
            })
            .collect();
        nodes.sort_by_key(|n| n.os_index);
        nodes.dedup_by_key(|n| n.os_index);
        let cpu_home = assign_home_nodes(&mut nodes, &online_cpus);
        let multi_node = nodes.len() > 1;
        let single_node = nodes.first().map(|n| n.os_index);
        let mut pci: Vec<PciDevice> = topology
            .objects_with_type(ObjectType::PCIDevice)
            .filter_map(|obj| pci_device(obj, multi_node, single_node))
            .collect();
        pci.sort_by_key(|d| d.bus_id);
        pci.dedup_by_key(|d| d.bus_id);
        let mut host = Self {
            nodes,
            online_cpus,
            all_cpus,
            pci,
            cpu_home,
            fingerprint: String::new(),
            source_name,
        };
        host.fingerprint = host.compute_fingerprint();
        Ok(host)
    }

    /// A stable digest (FNV-1a, hex) of the placement-relevant facts: each node's home CPUs,
    /// the online CPUs, and each PCI device's locality. Memory sizes are left out: they move
    /// with hot-add and firmware reservations without changing where anything is.
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }

    fn compute_fingerprint(&self) -> String {
        let mut text = format!("online={};", self.online_cpus);
        for n in &self.nodes {
            text.push_str(&format!("node{}={};", n.os_index, n.cpus));
        }
        for d in &self.pci {
            match &d.locality {
                Locality::Nodes(nodes) => text.push_str(&format!("{}@{};", d.bus_id, nodes)),
                Locality::Unknown(_) => text.push_str(&format!("{}@?;", d.bus_id)),
            }
        }
        format!("{:016x}", fnv1a(text.as_bytes()))
    }

    /// The home NUMA node of an online CPU.
    pub fn home_node(&self, cpu: u32) -> Option<u32> {
        self.cpu_home.get(cpu as usize).copied().flatten()
    }

    /// The home nodes of a set of CPUs (offline and unknown CPUs contribute nothing).
    pub fn nodes_of_cpus(&self, cpus: &IdSet) -> IdSet {
        cpus.iter().filter_map(|c| self.home_node(c)).collect()
    }

    /// A node by OS index.
    pub fn node(&self, os_index: u32) -> Option<&NumaNode> {
        self.nodes
            .binary_search_by_key(&os_index, |n| n.os_index)
            .ok()
            .map(|i| &self.nodes[i])
    }

    /// Every node's OS index.
    pub fn node_ids(&self) -> IdSet {
        self.nodes.iter().map(|n| n.os_index).collect()
    }

    /// A PCI device by address.
    pub fn pci_device(&self, bdf: Bdf) -> Option<&PciDevice> {
        self.pci
            .binary_search_by_key(&bdf, |d| d.bus_id)
            .ok()
            .map(|i| &self.pci[i])
    }

    /// Total memory of a set of nodes, in bytes.
    pub fn memory_of(&self, nodes: &IdSet) -> u64 {
        nodes
            .iter()
            .filter_map(|n| self.node(n))
            .map(|n| n.memory_bytes)
            .sum()
    }

    /// A device's locality from hwloc cross-checked with what sysfs says now (its
    /// `numa_node`). Unknown when either source cannot tell on a multi-node host, or when they
    /// disagree; a device hwloc does not list takes sysfs's word alone.
    pub fn device_locality(&self, bdf: Bdf, sysfs: Option<&DeviceState>) -> Locality {
        if !self.is_multi_node() {
            return match self.nodes.first() {
                Some(n) => Locality::Nodes([n.os_index].into_iter().collect()),
                None => Locality::Unknown("the host has no NUMA node".to_string()),
            };
        }
        let numa_node = sysfs.and_then(|s| s.numa_node);
        let hwloc = self.pci_device(bdf).map(|d| &d.locality);
        match (hwloc, numa_node) {
            (_, Some(n)) if n < 0 => {
                Locality::Unknown("sysfs numa_node is -1: firmware gives no locality".to_string())
            }
            (Some(Locality::Unknown(why)), _) => Locality::Unknown(why.clone()),
            (Some(Locality::Nodes(nodes)), Some(n)) if !nodes.contains(n as u32) => {
                Locality::Unknown(format!(
                    "hwloc places it on node {nodes} but sysfs numa_node says {n}"
                ))
            }
            (Some(Locality::Nodes(nodes)), _) => Locality::Nodes(nodes.clone()),
            (None, Some(n)) => Locality::Nodes([n as u32].into_iter().collect()),
            (None, None) => {
                Locality::Unknown("neither hwloc nor sysfs knows this device".to_string())
            }
        }
    }

    /// Whether the machine has more than one NUMA node.
    pub fn is_multi_node(&self) -> bool {
        self.nodes.len() > 1
    }
}

/// Runs an hwloc operation. hwlocality treats some hwloc answers as impossible and panics on
/// them; a checker must turn even that into an error.
fn guarded<T>(
    source_name: &str,
    f: impl FnOnce() -> Result<T, String> + std::panic::UnwindSafe,
) -> Result<T, HostError> {
    let outcome = std::panic::catch_unwind(f).map_err(|panic| {
        panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
            .unwrap_or_else(|| "hwloc binding failed".to_string())
    });
    match outcome {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(reason)) | Err(reason) => Err(HostError::Hwloc {
            source_name: source_name.to_string(),
            reason,
        }),
    }
}

/// The live machine, or the XML text of an export (read through the bounded reader, so hwloc
/// never opens a file itself).
fn build_topology(xml: Option<&str>) -> Result<Topology, String> {
    let mut builder = Topology::builder();
    if let Some(xml) = xml {
        builder = builder.from_xml(xml).map_err(|e| e.to_string())?;
    }
    builder
        .with_flags(BuildFlags::INCLUDE_DISALLOWED)
        .map_err(|e| e.to_string())?
        .with_common_type_filter(TypeFilter::KeepAll)
        .map_err(|e| e.to_string())?
        .build()
        .map_err(|e| e.to_string())
}

fn to_idset(ids: impl Iterator<Item = usize>) -> IdSet {
    ids.filter_map(|i| u32::try_from(i).ok()).collect()
}

/// Gives every online CPU exactly one home node: the node with the smallest cpuset that holds
/// it, preferring nodes without a memory subtype (MCDRAM, HBM, NVM, GPUMemory) and then the
/// lower OS index. hwloc gives a CPU-less node the cpuset of what it hangs off, so a CPU sits
/// in several node cpusets on KNL or CXL machines; Linux itself lists it under one node only.
fn assign_home_nodes(nodes: &mut [NumaNode], online: &IdSet) -> Vec<Option<u32>> {
    let max = online.iter().last().map_or(0, |c| c as usize + 1);
    let mut home: Vec<Option<u32>> = vec![None; max];
    let mut best: Vec<Option<(usize, bool, u32, usize)>> = vec![None; max];
    for (idx, node) in nodes.iter().enumerate() {
        let special = node.subtype.as_deref().is_some_and(|s| s != "DRAM");
        let key = (node.local_cpus.len(), special, node.os_index, idx);
        for cpu in node.local_cpus.iter() {
            let slot = &mut best[cpu as usize];
            if slot.is_none_or(|b| (key.0, key.1, key.2) < (b.0, b.1, b.2)) {
                *slot = Some(key);
            }
        }
    }
    for (cpu, choice) in best.iter().enumerate() {
        if let Some((_, _, os_index, idx)) = choice {
            home[cpu] = Some(*os_index);
            nodes[*idx].cpus.insert(cpu as u32);
        }
    }
    home
}

fn pci_device(
    obj: &TopologyObject,
    multi_node: bool,
    single_node: Option<u32>,
) -> Option<PciDevice> {
    let Some(ObjectAttributes::PCIDevice(attr)) = obj.attributes() else {
        return None;
    };
    let bus_id = Bdf {
        domain: attr.domain().into(),
        bus: attr.bus_id(),
        device: attr.bus_device(),
        function: attr.function(),
    };
    let locality = match obj.first_non_io_ancestor() {
        Some(anc) if anc.parent().is_none() && multi_node => Locality::Unknown(
            "attached to the machine root: firmware gives no locality".to_string(),
        ),
        Some(anc) => {
            let nodes = to_idset(
                anc.nodeset()
                    .map(|n| n.iter_set().map(usize::from).collect::<Vec<_>>())
                    .unwrap_or_default()
                    .into_iter(),
            );
            if nodes.is_empty() {
                match single_node {
                    Some(n) if !multi_node => Locality::Nodes([n].into_iter().collect()),
                    _ => Locality::Unknown("hwloc gives its parent no NUMA node".to_string()),
                }
            } else {
                Locality::Nodes(nodes)
            }
        }
        None => Locality::Unknown("not attached to the CPU tree".to_string()),
    };
    Some(PciDevice {
        bus_id,
        class_id: attr.class_id(),
        vendor_id: attr.vendor_id(),
        device_id: attr.device_id(),
        locality,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_xml_must_be_a_regular_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("host.xml");
        crate::testutil::mkfifo(&fifo).expect("mkfifo");
        for (path, what) in [
            (fifo, "FIFO"),
            (PathBuf::from("/dev/zero"), "character device"),
        ] {
            let shown = path.clone();
            let err = crate::testutil::within_a_minute("loading a topology", move || {
                Host::load(&TopologySource::Xml(path))
            })
            .expect_err("refused");
            assert!(matches!(err, HostError::Read { .. }), "{err}");
            let text = format!(
                "{err}: {}",
                std::error::Error::source(&err).expect("source")
            );
            assert!(
                text.contains(&shown.display().to_string()) && text.contains(what),
                "{text}"
            );
        }
    }
}
