//! The cache's key: what the host model is made of, read from the files hwloc reads it from
//! (see [the module](super) for its parts), and the facts a discovery is held to before it is
//! stored under it ([`CacheKey::check`]).

use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{FILE_PREFIX, FILE_SUFFIX};
use crate::host::pci::Bdf;
use crate::host::sysfs::{Sysfs, SysfsError};
use crate::host::{Host, Locality};
use crate::idset::IdSet;

/// Why the key could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// A sysfs file or directory could not be read.
    #[error("cannot read the topology key ({what})")]
    Sysfs {
        /// Which part.
        what: &'static str,
        /// The reader's error.
        #[source]
        source: SysfsError,
    },
    /// A procfs file could not be read.
    #[error("cannot read the topology key ({what}: {path})")]
    Proc {
        /// Which part.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file the key needs is not there.
    #[error("cannot read the topology key: {0} is missing")]
    Missing(PathBuf),
}

/// What the cache is keyed on, part by part (see the module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    parts: Vec<(&'static str, String)>,
    digest: String,
    /// What of the key a host model shows, to hold a discovery to ([`CacheKey::check`]).
    facts: Facts,
}

/// The key's topology facts as sets, where they parse: what a discovered host must show for
/// it to be stored under the key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Facts {
    /// The online CPUs.
    online: Option<IdSet>,
    /// Each node the kernel lists, with its CPUs.
    nodes: Option<Vec<(u32, Option<IdSet>)>>,
    /// Each PCI function (`None`: no PCI bus in this sysfs).
    pci: Option<Vec<PciFact>>,
}

/// One PCI function as the key read it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PciFact {
    bdf: Bdf,
    /// `PCI_CLASS` (24 bits: class, subclass, programming interface).
    class: Option<u32>,
    /// `PCI_ID`: vendor and device.
    ids: Option<(u16, u16)>,
    /// `local_cpus`: where hwloc places the device.
    local_cpus: Option<IdSet>,
}

impl CacheKey {
    /// Reads the key of the machine whose file systems are under `root` (`/` for this one;
    /// hwloc's `HWLOC_FSROOT` when that is set): `root/sys` and `root/proc`.
    pub fn read(root: &Path) -> Result<Self, KeyError> {
        let sys = Sysfs::new(root.join("sys"));
        let attr = |what: &'static str, rel: &str| {
            sys.attribute(rel)
                .map_err(|source| KeyError::Sysfs { what, source })
        };
        let required = |what: &'static str, rel: &str| {
            attr(what, rel)?.ok_or_else(|| KeyError::Missing(root.join("sys").join(rel)))
        };
        let list = |what: &'static str, rel: &str| {
            sys.list(rel)
                .map_err(|source| KeyError::Sysfs { what, source })
        };

        let mut software = format!(
            "kata-topo {}; hwloc api {:#x}",
            crate::VERSION,
            hwlocality::hwloc_api_version()
        );
        let mut hwloc_env: Vec<(String, String)> = std::env::vars_os()
            .filter_map(|(k, v)| {
                let k = k.to_string_lossy().into_owned();
                k.starts_with("HWLOC_")
                    .then(|| (k, v.to_string_lossy().into_owned()))
            })
            .collect();
        hwloc_env.sort();
        for (k, v) in hwloc_env {
            software.push_str(&format!("; {k}={v}"));
        }

        let boot_path = root.join("proc/sys/kernel/random/boot_id");
        let boot = crate::files::read_text_bounded_nofollow(&boot_path, 4096)
            .map_err(|source| KeyError::Proc {
                what: "boot id",
                path: boot_path.clone(),
                source,
            })?
            .trim()
            .to_string();

        let online = required("online CPUs", "devices/system/cpu/online")?;
        let cpus = format!(
            "online {online}; present {}",
            required("present CPUs", "devices/system/cpu/present")?
        );

        let mut nodes_facts = None;
        let nodes = match list("NUMA nodes", "devices/system/node")? {
            Some(names) => {
                let mut ids: Vec<u32> = names
                    .iter()
                    .filter_map(|n| n.strip_prefix("node")?.parse().ok())
                    .collect();
                ids.sort_unstable();
                let mut text = format!(
                    "online {}",
                    attr("online NUMA nodes", "devices/system/node/online")?
                        .unwrap_or_else(|| "-".into())
                );
                let mut facts = Vec::new();
                for id in ids {
                    let dir = format!("devices/system/node/node{id}");
                    let cpus = attr("a node's CPUs", &format!("{dir}/cpulist"))?;
                    let blocks = list("a node's memory blocks", &dir)?.unwrap_or_default();
                    text.push_str(&format!(
                        "; node{id} cpus {} memory blocks {}",
                        cpus.as_deref().unwrap_or("-"),
                        memory_blocks(&blocks)
                    ));
                    facts.push((id, cpus.and_then(|c| IdSet::parse(c.trim()).ok())));
                }
                nodes_facts = Some(facts);
                text
            }
            // A kernel without NUMA: hwloc makes one node of the machine's memory.
            None => {
                let blocks = list("memory blocks", "devices/system/memory")?.unwrap_or_default();
                format!("none; memory blocks {}", memory_blocks(&blocks))
            }
        };

        let mut pci = String::new();
        let mut pci_facts = Vec::new();
        let listed = list("PCI devices", "bus/pci/devices")?;
        let has_pci = listed.is_some();
        for name in listed.unwrap_or_default() {
            if name.parse::<Bdf>().is_err() {
                pci.push_str(&format!("{name:?} not a PCI address; "));
                continue;
            }
            let dir = format!("bus/pci/devices/{name}");
            let mut values = sys
                .attributes(&dir, &["numa_node", "local_cpus", "uevent"])
                .map_err(|source| KeyError::Sysfs {
                    what: "a PCI device",
                    source,
                })?
                .unwrap_or_default()
                .into_iter();
            let (numa, local_cpus, uevent) = (
                values.next().flatten(),
                values.next().flatten(),
                values.next().flatten(),
            );
            if let Ok(bdf) = name.parse::<Bdf>() {
                pci_facts.push(PciFact {
                    bdf,
                    class: uevent
                        .as_deref()
                        .and_then(|u| uevent_value(u, "PCI_CLASS"))
                        .and_then(|c| u32::from_str_radix(c, 16).ok()),
                    ids: uevent
                        .as_deref()
                        .and_then(|u| uevent_value(u, "PCI_ID"))
                        .and_then(|i| {
                            let (v, d) = i.split_once(':')?;
                            Some((
                                u16::from_str_radix(v, 16).ok()?,
                                u16::from_str_radix(d, 16).ok()?,
                            ))
                        }),
                    local_cpus: local_cpus.as_deref().and_then(parse_cpumask),
                });
            }
            let uevent = uevent
                .as_deref()
                .map(|u| u.lines().map(str::trim).collect::<Vec<_>>().join(","));
            pci.push_str(&format!(
                "{name} node {} cpus {} {}; ",
                numa.as_deref().unwrap_or("-"),
                local_cpus.as_deref().unwrap_or("-"),
                uevent.as_deref().unwrap_or("-")
            ));
        }

        let facts = Facts {
            online: IdSet::parse(online.trim()).ok(),
            nodes: nodes_facts,
            pci: has_pci.then_some(pci_facts),
        };
        Ok(Self::from_parts(
            vec![
                ("software", software),
                ("boot", boot),
                ("cpus", cpus),
                ("nodes", nodes),
                ("pci", pci),
            ],
            facts,
        ))
    }

    /// Whether `host` — a discovery made while this key was read — is the machine the key
    /// describes: its online CPUs, its nodes and their CPUs, its PCI devices with their ids
    /// and where hwloc placed them. Says what differs. The key is read before and after a
    /// discovery, but a machine that changed and changed back meanwhile (a CPU offlined and
    /// onlined, a VF created and removed) reads the same both times; only the discovery itself
    /// shows what it saw.
    pub fn check(&self, host: &Host) -> Result<(), String> {
        let f = &self.facts;
        if let Some(online) = &f.online {
            if *online != host.online_cpus {
                return Err(format!(
                    "online CPUs: the key read {online}, the discovery found {}",
                    host.online_cpus
                ));
            }
        }
        if let Some(nodes) = &f.nodes {
            let listed: IdSet = nodes.iter().map(|(id, _)| *id).collect();
            if listed != host.node_ids() {
                return Err(format!(
                    "NUMA nodes: the key read {listed}, the discovery found {}",
                    host.node_ids()
                ));
            }
            for (id, cpus) in nodes {
                let (Some(cpus), Some(node)) = (cpus, host.node(*id)) else {
                    continue;
                };
                let cpus = cpus.intersection(&host.online_cpus);
                if cpus != node.cpus {
                    return Err(format!(
                        "the CPUs of node {id}: the key read {cpus}, the discovery found {}",
                        node.cpus
                    ));
                }
            }
        }
        let Some(pci) = &f.pci else {
            return Ok(());
        };
        let listed: std::collections::BTreeMap<Bdf, &PciFact> =
            pci.iter().map(|d| (d.bdf, d)).collect();
        for d in &host.pci {
            let Some(fact) = listed.get(&d.bus_id) else {
                return Err(format!(
                    "PCI device {}: found by the discovery, not in the key",
                    d.bus_id
                ));
            };
            if let Some(class) = fact.class.and_then(|c| u16::try_from(c >> 8).ok()) {
                if class != d.class_id {
                    return Err(format!(
                        "PCI device {}: class {class:04x} in the key, {:04x} discovered",
                        d.bus_id, d.class_id
                    ));
                }
            }
            if let Some((vendor, device)) = fact.ids {
                if (vendor, device) != (d.vendor_id, d.device_id) {
                    return Err(format!(
                        "PCI device {}: {vendor:04x}:{device:04x} in the key, {:04x}:{:04x} \
                         discovered",
                        d.bus_id, d.vendor_id, d.device_id
                    ));
                }
            }
            if let Some(why) = fact
                .local_cpus
                .as_ref()
                .and_then(|cpus| misplaced(host, cpus, &d.locality))
            {
                return Err(format!("PCI device {}: {why}", d.bus_id));
            }
        }
        let found: std::collections::BTreeSet<Bdf> = host.pci.iter().map(|d| d.bus_id).collect();
        // hwloc keeps PCI-to-PCI bridges as bridges, not as PCI devices.
        if let Some(missing) = pci
            .iter()
            .filter(|d| d.class.is_some_and(|c| !matches!(c >> 8, 0x0604 | 0x0609)))
            .find(|d| !found.contains(&d.bdf))
        {
            return Err(format!(
                "PCI device {}: in the key, not found by the discovery",
                missing.bdf
            ));
        }
        Ok(())
    }

    fn from_parts(parts: Vec<(&'static str, String)>, facts: Facts) -> Self {
        let mut hasher = Sha256::new();
        for (name, value) in &parts {
            hasher.update(name.as_bytes());
            hasher.update(b"=");
            hasher.update(value.len().to_le_bytes());
            hasher.update(value.as_bytes());
        }
        let digest = hasher
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Self {
            parts,
            digest,
            facts,
        }
    }

    /// The key's digest (hex SHA-256), which names the cache file.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The parts that differ from `earlier` (`boot`, `cpus`, `nodes`, `pci`, `software`).
    pub fn changed_since(&self, earlier: &Self) -> Vec<&'static str> {
        self.parts
            .iter()
            .filter(|(name, value)| {
                earlier
                    .parts
                    .iter()
                    .find(|(n, _)| n == name)
                    .is_none_or(|(_, v)| v != value)
            })
            .map(|(name, _)| *name)
            .collect()
    }

    /// The cache file's name.
    pub fn file_name(&self) -> String {
        format!("{FILE_PREFIX}{}{FILE_SUFFIX}", self.digest)
    }
}

/// The `MemTotal` of a meminfo text (`Node 0 MemTotal:  24684092 kB`), in bytes.
pub(super) fn mem_total_bytes(meminfo: &str) -> Option<u64> {
    let value = meminfo
        .lines()
        .find_map(|l| Some(l.split_once("MemTotal:")?.1.trim()))?;
    let kib: u64 = value.strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory blocks (`memory<N>` entries: the unit memory is hot-plugged in) among the
/// names of a directory, as ranges of block numbers (`32-63,96`).
fn memory_blocks(names: &[String]) -> String {
    let mut ids: Vec<u64> = names
        .iter()
        .filter_map(|n| n.strip_prefix("memory")?.parse().ok())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut text = String::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        if !text.is_empty() {
            text.push(',');
        }
        if i == j {
            text.push_str(&ids[i].to_string());
        } else {
            text.push_str(&format!("{}-{}", ids[i], ids[j]));
        }
        i = j + 1;
    }
    if text.is_empty() {
        text.push('-');
    }
    text
}

/// A `KEY=value` line of a uevent text.
fn uevent_value<'a>(uevent: &'a str, key: &str) -> Option<&'a str> {
    uevent
        .lines()
        .find_map(|l| l.trim().strip_prefix(key)?.strip_prefix('='))
}

/// A sysfs CPU mask (`0000,000000ff,ffffffff`: 32-bit words in hex, the lowest last).
fn parse_cpumask(text: &str) -> Option<IdSet> {
    let mut cpus = IdSet::new();
    for (word, chunk) in text.trim().rsplit(',').enumerate() {
        if chunk.is_empty() || chunk.len() > 8 {
            return None;
        }
        let bits = u32::from_str_radix(chunk, 16).ok()?;
        for bit in 0..32u32 {
            if bits & (1 << bit) != 0 {
                let cpu = u32::try_from(word)
                    .ok()?
                    .checked_mul(32)?
                    .checked_add(bit)?;
                if cpu > crate::idset::MAX_ID {
                    return None;
                }
                cpus.insert(cpu);
            }
        }
    }
    Some(cpus)
}

/// Whether hwloc's placement of a device contradicts its `local_cpus`: hwloc hangs a device
/// under the smallest part of the machine that holds those CPUs, so the nodes it is local to
/// hold every node those CPUs are on, and a device hwloc left at the machine's root has CPUs
/// on more than one node.
fn misplaced(host: &Host, local_cpus: &IdSet, locality: &Locality) -> Option<String> {
    let cpus = local_cpus.intersection(&host.online_cpus);
    if cpus.is_empty() || !host.is_multi_node() {
        return None;
    }
    let on = host.nodes_of_cpus(&cpus);
    match locality {
        Locality::Nodes(nodes) if !on.is_subset(nodes) => Some(format!(
            "its local CPUs {cpus} are on nodes {on}, the discovery placed it on {nodes}"
        )),
        Locality::Unknown(why) if why.starts_with("attached to the machine root") && on.len() == 1 => {
            Some(format!(
                "its local CPUs {cpus} are on node {on}, the discovery placed it at the machine's root"
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::is_cache_file;
    use super::*;
    use crate::text::error_chain;

    /// A machine's key inputs, written the way the kernel lays them out.
    pub(in crate::host::cache) fn machine(root: &Path) {
        let w = |rel: &str, text: &str| {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        };
        w(
            "proc/sys/kernel/random/boot_id",
            "b0071d00-0000-4000-8000-000000000000\n",
        );
        w("sys/devices/system/cpu/online", "0-3\n");
        w("sys/devices/system/cpu/present", "0-3\n");
        w("sys/devices/system/node/online", "0-1\n");
        for (n, cpus) in [(0, "0-1"), (1, "2-3")] {
            w(
                &format!("sys/devices/system/node/node{n}/cpulist"),
                &format!("{cpus}\n"),
            );
            w(
                &format!("sys/devices/system/node/node{n}/meminfo"),
                &format!("Node {n} MemTotal:       8388608 kB\nNode {n} MemFree:  1024 kB\n"),
            );
        }
        for block in [
            "node0/memory0",
            "node0/memory7",
            "node0/memory9",
            "node1/memory16",
        ] {
            std::fs::create_dir_all(root.join("sys/devices/system/node").join(block))
                .expect("mkdir");
        }
        for block in 1..7 {
            std::fs::create_dir_all(
                root.join(format!("sys/devices/system/node/node0/memory{block}")),
            )
            .expect("mkdir");
        }
        let tree = crate::testutil::SysfsTree::at(root.join("sys")).expect("tree");
        tree.add_gpu().expect("device");
    }

    #[test]
    fn the_key_reads_each_part_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        machine(dir.path());
        let key = CacheKey::read(dir.path()).expect("key");
        let part = |name: &str| {
            key.parts
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
                .expect("part")
        };
        assert_eq!(part("boot"), "b0071d00-0000-4000-8000-000000000000");
        assert_eq!(part("cpus"), "online 0-3; present 0-3");
        assert_eq!(
            part("nodes"),
            "online 0-1; node0 cpus 0-1 memory blocks 0-7,9; node1 cpus 2-3 memory blocks 16"
        );
        assert_eq!(part("pci"), "0000:b7:00.0 node 1 cpus - -; ");
        assert!(part("software").starts_with("kata-topo "));
        assert_eq!(key.digest().len(), 64);
        assert!(is_cache_file(&key.file_name()));
        for name in [
            "topology-.xml",
            "topology-xyz.xml",
            "host.xml",
            "topology-0.xml.tmp",
        ] {
            assert!(!is_cache_file(name), "{name}");
        }
    }

    #[test]
    fn a_kernel_without_numa_is_keyed_on_its_memory_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        machine(dir.path());
        std::fs::remove_dir_all(dir.path().join("sys/devices/system/node")).expect("rm");
        let nodes = |key: &CacheKey| {
            key.parts
                .iter()
                .find(|(n, _)| *n == "nodes")
                .map(|(_, v)| v.clone())
                .expect("part")
        };
        assert_eq!(
            nodes(&CacheKey::read(dir.path()).expect("key")),
            "none; memory blocks -"
        );
        for block in ["memory0", "memory1", "memory3", "block_size_bytes"] {
            std::fs::create_dir_all(dir.path().join("sys/devices/system/memory").join(block))
                .expect("mkdir");
        }
        assert_eq!(
            nodes(&CacheKey::read(dir.path()).expect("key")),
            "none; memory blocks 0-1,3"
        );
    }

    #[test]
    fn cpu_masks_and_uevents_parse_strictly() {
        let set = |t: &str| parse_cpumask(t).map(|s| s.to_string());
        assert_eq!(set("0000,000000ff,ffffffff").as_deref(), Some("0-39"));
        assert_eq!(set("00000003\n").as_deref(), Some("0-1"));
        assert_eq!(set("1,00000000").as_deref(), Some("32"));
        assert_eq!(set("0").as_deref(), Some(""));
        for bad in ["", "xyz", "1,,1", "123456789", "-1"] {
            assert_eq!(set(bad), None, "{bad:?}");
        }
        assert_eq!(set("ffffffff,".repeat(600).trim_end_matches(',')), None);
        assert_eq!(
            uevent_value("DRIVER=bnx2\nPCI_CLASS=20000\nPCI_ID=14E4:1639\n", "PCI_ID"),
            Some("14E4:1639")
        );
        assert_eq!(uevent_value("PCI_CLASSX=1\n", "PCI_CLASS"), None);
        assert_eq!(memory_blocks(&[]), "-");
        assert_eq!(
            memory_blocks(&[
                "memory3".into(),
                "memory1".into(),
                "memory2".into(),
                "x".into()
            ]),
            "1-3"
        );
    }

    #[test]
    fn missing_inputs_are_errors_naming_the_file() {
        for rel in [
            "proc/sys/kernel/random/boot_id",
            "sys/devices/system/cpu/online",
            "sys/devices/system/cpu/present",
        ] {
            let dir = tempfile::tempdir().expect("tempdir");
            machine(dir.path());
            std::fs::remove_file(dir.path().join(rel)).expect("rm");
            let e = CacheKey::read(dir.path()).expect_err(rel);
            assert!(error_chain(&e).contains(rel), "{rel}: {}", error_chain(&e));
        }
        // A FIFO in place of an input is refused, not waited on.
        let dir = tempfile::tempdir().expect("tempdir");
        machine(dir.path());
        let online = dir.path().join("sys/devices/system/cpu/online");
        std::fs::remove_file(&online).expect("rm");
        crate::testutil::mkfifo(&online).expect("fifo");
        let root = dir.path().to_path_buf();
        let e = crate::testutil::within_a_minute("reading the key", move || {
            CacheKey::read(&root).map(|_| ())
        })
        .expect_err("a FIFO");
        assert!(error_chain(&e).contains("FIFO"), "{}", error_chain(&e));
    }
}
