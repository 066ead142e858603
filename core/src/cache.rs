//! The node-wide topology cache: the live machine, discovered once by hwloc and kept as hwloc
//! XML in `state_dir`, so that every later pod's wrapper (and the hook) loads the XML instead
//! of discovering the machine again.
//!
//! The file is named after a key read from the machine, `state_dir/topology-<sha256>.xml`:
//! when anything the key covers changes, the name changes and the next load rediscovers. The
//! key is what the host model is made of, read from the files hwloc reads it from, and
//! nothing that changes by itself while a node runs:
//!
//! | part | read from | changes when |
//! | --- | --- | --- |
//! | `software` | kata-topo's version, the running hwloc's API version, every `HWLOC_*` variable | an upgrade, another hwloc setting |
//! | `boot` | `/proc/sys/kernel/random/boot_id` | a reboot (firmware settings such as SNC, a new BIOS, moved cards) |
//! | `cpus` | `devices/system/cpu/{online,present}` | a CPU taken offline or online, hot-added |
//! | `nodes` | `devices/system/node/online`, each node's `cpulist` and `MemTotal` | a node going offline, memory hot-plugged or ballooned |
//! | `pci` | each `bus/pci/devices/<bdf>`: `numa_node`, `local_cpus` (where hwloc places it) and `uevent` (driver, class, vendor and device ids) | a device added, removed, moved or re-bound (e.g. to `vfio-pci`) |
//!
//! Reading the key costs a few small sysfs reads per PCI device; a discovery on a two-socket
//! server costs tens to hundreds of milliseconds of CPU.
//!
//! Trust: the directory must belong to this process's effective user and be writable by
//! nobody else, and so must the file (a regular file, opened without following a symlink);
//! anything else is rediscovered and replaced. Files are written whole under a temporary name
//! and renamed ([`crate::files`]). The key is read before and after a discovery; when the
//! machine changed meanwhile the result is used but not stored.

use std::fmt;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::config::Config;
use crate::files::Dir;
use crate::host::{Bdf, Host, HostError, TopologySource, MAX_XML_BYTES};
use crate::sysfs::{Sysfs, SysfsError};

/// The prefix of the cache files in `state_dir`.
pub const FILE_PREFIX: &str = "topology-";
/// The suffix of the cache files.
pub const FILE_SUFFIX: &str = ".xml";

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
        let boot = crate::fsutil::read_text_bounded_nofollow(&boot_path, 4096)
            .map_err(|source| KeyError::Proc {
                what: "boot id",
                path: boot_path.clone(),
                source,
            })?
            .trim()
            .to_string();

        let cpus = format!(
            "online {}; present {}",
            required("online CPUs", "devices/system/cpu/online")?,
            required("present CPUs", "devices/system/cpu/present")?
        );

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
                for id in ids {
                    let dir = format!("devices/system/node/node{id}");
                    let cpus = attr("a node's CPUs", &format!("{dir}/cpulist"))?;
                    let memory = attr("a node's memory", &format!("{dir}/meminfo"))?;
                    text.push_str(&format!(
                        "; node{id} cpus {} memory {}",
                        cpus.as_deref().unwrap_or("-"),
                        memory.as_deref().map_or("-", mem_total)
                    ));
                }
                text
            }
            // A kernel without NUMA: hwloc makes one node of the machine's memory.
            None => {
                let path = root.join("proc/meminfo");
                let meminfo = crate::fsutil::read_text_bounded_nofollow(&path, 1 << 20).map_err(
                    |source| KeyError::Proc {
                        what: "memory",
                        path: path.clone(),
                        source,
                    },
                )?;
                format!("none; memory {}", mem_total(&meminfo))
            }
        };

        let mut pci = String::new();
        for name in list("PCI devices", "bus/pci/devices")?.unwrap_or_default() {
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

        Ok(Self::from_parts(vec![
            ("software", software),
            ("boot", boot),
            ("cpus", cpus),
            ("nodes", nodes),
            ("pci", pci),
        ]))
    }

    fn from_parts(parts: Vec<(&'static str, String)>) -> Self {
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
        Self { parts, digest }
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

/// The `MemTotal` figure of a meminfo text (`Node 0 MemTotal:  24684092 kB`), as written.
fn mem_total(meminfo: &str) -> &str {
    meminfo
        .lines()
        .find_map(|l| Some(l.split_once("MemTotal:")?.1.trim()))
        .unwrap_or("-")
}

/// Why the cached topology was not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Miss {
    /// No cache file for this key (the first load since the machine changed, or ever).
    Absent,
    /// The directory or the file could have been written by someone else.
    Untrusted(String),
    /// The file is there but hwloc did not load it.
    Unreadable(String),
    /// The key could not be read: nothing is cached.
    NoKey(String),
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Absent => write!(f, "no cached topology for this machine state"),
            Self::Untrusted(why) => write!(f, "cached topology not trusted: {why}"),
            Self::Unreadable(why) => write!(f, "cached topology unreadable: {why}"),
            Self::NoKey(why) => write!(f, "{why}"),
        }
    }
}

/// Where a loaded host came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The configured XML file (`topology_xml`).
    Xml,
    /// A discovery of the live machine with the cache off.
    Live,
    /// The cache file.
    Cached(PathBuf),
    /// A discovery of the live machine: why the cache was not used, and where the result was
    /// stored (or why it was not).
    Discovered {
        /// Why the cache was not used.
        miss: Miss,
        /// The file written, or why none was.
        stored: Result<PathBuf, String>,
    },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Xml => write!(f, "topology_xml"),
            Self::Live => write!(f, "discovered (cache off)"),
            Self::Cached(path) => write!(f, "cached in {}", path.display()),
            Self::Discovered { miss, stored } => {
                write!(f, "discovered ({miss}); ")?;
                match stored {
                    Ok(path) => write!(f, "stored in {}", path.display()),
                    Err(why) => write!(f, "not stored: {why}"),
                }
            }
        }
    }
}

/// A host and how it was loaded.
#[derive(Debug)]
pub struct Loaded {
    /// The host.
    pub host: Host,
    /// The key it was loaded under (the cache only).
    pub key: Option<CacheKey>,
    /// Where it came from.
    pub origin: Origin,
}

/// The cache of one state directory.
#[derive(Debug, Clone)]
pub struct TopologyCache {
    dir: PathBuf,
    root: PathBuf,
}

impl TopologyCache {
    /// The cache in `dir` for the machine whose `sys` and `proc` are under `root`.
    pub fn new(dir: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            root: root.into(),
        }
    }

    /// The cache in `state_dir` for the machine hwloc discovers: `/`, or `HWLOC_FSROOT`.
    pub fn for_this_machine(state_dir: &Path) -> Self {
        let root = std::env::var_os("HWLOC_FSROOT")
            .filter(|r| !r.is_empty())
            .map_or_else(|| PathBuf::from("/"), PathBuf::from);
        Self::new(state_dir, root)
    }

    /// The cache the configuration asks for: `None` with `topology_xml` (nothing to
    /// discover) or `topology_cache = false`.
    pub fn from_config(config: &Config) -> Option<Self> {
        (config.topology_xml.is_none() && config.topology_cache)
            .then(|| Self::for_this_machine(&config.state_dir))
    }

    /// Its directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The machine's key now.
    pub fn key(&self) -> Result<CacheKey, KeyError> {
        CacheKey::read(&self.root)
    }

    /// The host: from the cache file when one matches the machine's key and is trusted,
    /// else discovered (and stored for the next load).
    pub fn load(&self) -> Result<Loaded, HostError> {
        let key = match self.key() {
            Ok(k) => k,
            Err(e) => {
                let (host, _) = Host::discover()?;
                return Ok(Loaded {
                    host,
                    key: None,
                    origin: Origin::Discovered {
                        miss: Miss::NoKey(error_chain(&e)),
                        stored: Err("no key".into()),
                    },
                });
            }
        };
        match self.read(&key) {
            Ok((host, path)) => Ok(Loaded {
                host,
                key: Some(key),
                origin: Origin::Cached(path),
            }),
            Err(miss) => self.discover(key, miss),
        }
    }

    /// Loads the file for `key`, or says why not.
    fn read(&self, key: &CacheKey) -> Result<(Host, PathBuf), Miss> {
        let dir = match Dir::open_private(&self.dir, None) {
            Ok(d) => d,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Miss::Absent),
            // The error names the directory, or the component of its path, and why.
            Err(e) => return Err(Miss::Untrusted(e.to_string())),
        };
        let name = key.file_name();
        let bytes = match dir.read_private(&name, MAX_XML_BYTES) {
            Ok(b) => b,
            Err(e) => {
                return Err(match e.kind() {
                    std::io::ErrorKind::NotFound => Miss::Absent,
                    std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::InvalidInput => {
                        Miss::Untrusted(e.to_string())
                    }
                    _ => Miss::Unreadable(format!("{name}: {e}")),
                })
            }
        };
        let path = self.dir.join(&name);
        let text =
            String::from_utf8(bytes).map_err(|_| Miss::Unreadable(format!("{name}: not UTF-8")))?;
        let host = Host::from_xml(
            &text,
            format!("the live machine, cached in {}", path.display()),
        )
        .map_err(|e| Miss::Unreadable(e.to_string()))?;
        Ok((host, path))
    }

    /// Discovers the machine and stores what was found under `key`, unless the machine
    /// changed while it was discovered.
    fn discover(&self, key: CacheKey, miss: Miss) -> Result<Loaded, HostError> {
        let (host, xml) = Host::discover()?;
        let stored = match self.key() {
            Ok(after) if after == key => self.store(&key, &xml),
            Ok(after) => Err(format!(
                "the machine changed while it was discovered ({})",
                after.changed_since(&key).join(", ")
            )),
            Err(e) => Err(error_chain(&e)),
        };
        Ok(Loaded {
            host,
            key: Some(key),
            origin: Origin::Discovered { miss, stored },
        })
    }

    /// Writes the XML for `key` and removes the files of earlier keys.
    fn store(&self, key: &CacheKey, xml: &str) -> Result<PathBuf, String> {
        let shown = |e: std::io::Error| format!("{}: {e}", self.dir.display());
        let dir = Dir::open_private(&self.dir, Some(0o700)).map_err(|e| e.to_string())?;
        let name = key.file_name();
        dir.write_atomic(&name, xml.as_bytes(), 0o600)
            .map_err(shown)?;
        for old in dir.names().unwrap_or_default() {
            if old != name && is_cache_file(&old) {
                let _ = dir.remove(&old);
            }
        }
        Ok(self.dir.join(name))
    }
}

/// Whether a name is one of the cache's files (`topology-<64 hex>.xml`).
pub fn is_cache_file(name: &str) -> bool {
    name.strip_prefix(FILE_PREFIX)
        .and_then(|n| n.strip_suffix(FILE_SUFFIX))
        .is_some_and(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The host the configuration describes: `topology_xml`, else the live machine through the
/// cache (unless `topology_cache = false`).
pub fn load(config: &Config) -> Result<Loaded, HostError> {
    match TopologyCache::from_config(config) {
        Some(cache) => cache.load(),
        None => {
            let source = config.topology_source();
            let origin = match source {
                TopologySource::Xml(_) => Origin::Xml,
                TopologySource::Live => Origin::Live,
            };
            Ok(Loaded {
                host: Host::load(&source)?,
                key: None,
                origin,
            })
        }
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A machine's key inputs, written the way the kernel lays them out.
    fn machine(root: &Path) {
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
        let tree = crate::simulate::SysfsTree::at(root.join("sys")).expect("tree");
        tree.add_device(
            "0000:b7:00.0".parse().expect("bdf"),
            1,
            Some("vfio-pci"),
            Some("42"),
        )
        .expect("device");
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
            "online 0-1; node0 cpus 0-1 memory 8388608 kB; node1 cpus 2-3 memory 8388608 kB"
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
    fn a_kernel_without_numa_is_keyed_on_its_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        machine(dir.path());
        std::fs::remove_dir_all(dir.path().join("sys/devices/system/node")).expect("rm");
        let missing = CacheKey::read(dir.path()).expect_err("no /proc/meminfo");
        assert!(missing.to_string().contains("memory"), "{missing}");
        std::fs::write(
            dir.path().join("proc/meminfo"),
            "MemTotal:  16777216 kB\nMemFree: 1 kB\n",
        )
        .expect("write");
        let key = CacheKey::read(dir.path()).expect("key");
        assert!(key
            .parts
            .iter()
            .any(|(n, v)| *n == "nodes" && v == "none; memory 16777216 kB"));
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

    #[test]
    fn the_configuration_decides_whether_there_is_a_cache() {
        let parse = |table: &str| {
            Config::parse(&format!("[topology_guard]\n{table}"), Path::new("t.toml"))
                .expect("config")
        };
        let cache = TopologyCache::from_config(&parse("state_dir = \"/run/kt\"\n"))
            .expect("live machine: cached");
        assert_eq!(cache.dir(), Path::new("/run/kt"));
        assert!(TopologyCache::from_config(&parse("topology_xml = \"/etc/h.xml\"\n")).is_none());
        assert!(TopologyCache::from_config(&parse("topology_cache = false\n")).is_none());
    }

    /// The key is read before and after a discovery; a machine that changed meanwhile is not
    /// stored under the key read before.
    #[test]
    fn a_machine_that_changed_during_the_discovery_is_not_stored() {
        let dir = tempfile::tempdir().expect("tempdir");
        machine(dir.path());
        let state = tempfile::tempdir().expect("tempdir");
        let cache = TopologyCache::new(state.path(), dir.path());
        let before = cache.key().expect("key");
        std::fs::write(dir.path().join("sys/devices/system/cpu/online"), "0-2\n").expect("write");
        // The discovery is this machine's; the key is the tree's.
        let loaded = cache
            .discover(before.clone(), Miss::Absent)
            .expect("discover");
        match &loaded.origin {
            Origin::Discovered {
                stored: Err(why), ..
            } => assert!(why.contains("changed") && why.contains("cpus"), "{why}"),
            other => panic!("stored: {other}"),
        }
        assert_eq!(loaded.key, Some(before));
        let names = std::fs::read_dir(state.path()).expect("list").count();
        assert_eq!(names, 0);
    }
}
