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
//! | `nodes` | `devices/system/node/online`, each node's `cpulist` and memory blocks (`memory<N>`) | a node going offline, a memory block hot-plugged or removed |
//! | `pci` | each `bus/pci/devices/<bdf>`: `numa_node`, `local_cpus` (where hwloc places it) and `uevent` (driver, class, vendor and device ids) | a device added, removed, moved or re-bound (e.g. to `vfio-pci`) |
//!
//! Reading the key costs a few small sysfs reads per PCI device; a discovery on a two-socket
//! server costs tens to hundreds of milliseconds of CPU.
//!
//! Trust: the directory must belong to this process's effective user and be writable by
//! nobody else, and so must the file (a regular file, opened without following a symlink);
//! anything else is rediscovered and replaced. Files are written whole under a temporary name
//! and renamed ([`crate::files`]). The key is read before and after a discovery, and the
//! discovery is held to the key's facts ([`CacheKey::check`]); when the machine changed
//! meanwhile — even back again — the result is used but not stored.
//!
//! A node's `MemTotal` is not part of the key: virtio-mem and balloon drivers move it inside
//! blocks already online, without any change of topology. It is read afresh at every load
//! ([`TopologyCache::with_live_memory`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::Config;
use crate::files::Dir;
use crate::host::sysfs::Sysfs;
use crate::host::{Host, HostError, TopologySource, MAX_XML_BYTES};
use crate::text::error_chain;
use crate::wait::Progress;

mod key;

use key::mem_total_bytes;
pub use key::{CacheKey, KeyError};

/// The prefix of the cache files in `state_dir`.
pub const FILE_PREFIX: &str = "topology-";
/// The suffix of the cache files.
pub const FILE_SUFFIX: &str = ".xml";

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
    pub host: Host,
    /// The key it was loaded under (the cache only).
    pub key: Option<CacheKey>,
    /// Where it came from.
    pub origin: Origin,
}

/// How the machine is discovered: hwloc's live discovery ([`Host::discover`]), or what a
/// test puts in its place ([`TopologyCache::with_discovery`]).
type Discovery =
    Arc<dyn Fn() -> Result<(Host, String), HostError> + Send + Sync + std::panic::RefUnwindSafe>;

/// The cache of one state directory.
#[derive(Clone)]
pub struct TopologyCache {
    dir: PathBuf,
    root: PathBuf,
    discovery: Discovery,
}

impl fmt::Debug for TopologyCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopologyCache")
            .field("dir", &self.dir)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl TopologyCache {
    /// The cache in `dir` for the machine whose `sys` and `proc` are under `root`.
    pub fn new(dir: impl Into<PathBuf>, root: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            root: root.into(),
            discovery: Arc::new(Host::discover),
        }
    }

    /// The same cache, discovering the machine with `discover` instead of hwloc's live
    /// discovery: the host-reading seam, for tests that change the machine while it is
    /// discovered.
    pub fn with_discovery(
        mut self,
        discover: impl Fn() -> Result<(Host, String), HostError>
            + Send
            + Sync
            + std::panic::RefUnwindSafe
            + 'static,
    ) -> Self {
        self.discovery = Arc::new(discover);
        self
    }

    /// The cache in `state_dir` for the machine hwloc discovers: `/`, or `HWLOC_FSROOT`.
    pub fn for_this_machine(state_dir: &Path) -> Self {
        Self::new(state_dir, this_machine_root())
    }

    /// The cache the configuration asks for: `None` with `topology_xml` (nothing to
    /// discover) or `topology_cache = false`.
    pub fn from_config(config: &Config) -> Option<Self> {
        (config.topology_xml.is_none() && config.topology_cache)
            .then(|| Self::for_this_machine(&config.state_dir))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The machine's key now.
    pub fn key(&self) -> Result<CacheKey, KeyError> {
        CacheKey::read(&self.root)
    }

    /// `host` with each node's memory as the kernel reports it now (`MemTotal`), when that
    /// differs from what it holds. A node's memory moves without any change of topology — a
    /// virtio-mem device or a balloon plugs memory into blocks already online — so it is not
    /// part of the key and is read afresh instead: a cached host never carries the memory of
    /// the moment it was discovered.
    pub fn with_live_memory(&self, host: &Host) -> Option<Host> {
        let mut now = host.clone();
        self.read_live_memory(&mut now).then_some(now)
    }

    /// Sets each node's memory from the kernel's figure; whether any changed.
    fn read_live_memory(&self, host: &mut Host) -> bool {
        let sys = Sysfs::new(self.root.join("sys"));
        let single = host.nodes.len() == 1;
        let mut changed = false;
        for node in &mut host.nodes {
            let rel = format!("devices/system/node/node{}/meminfo", node.os_index);
            let text = match sys.attribute(&rel) {
                Ok(Some(t)) => Some(t),
                // A kernel without NUMA: the machine's memory is the one node's.
                Ok(None) if single => crate::files::read_text_bounded_nofollow(
                    &self.root.join("proc/meminfo"),
                    1 << 20,
                )
                .ok(),
                _ => None,
            };
            if let Some(bytes) = text.as_deref().and_then(mem_total_bytes) {
                if bytes != node.memory_bytes {
                    node.memory_bytes = bytes;
                    changed = true;
                }
            }
        }
        changed
    }

    /// The host: from the cache file when one matches the machine's key and is trusted,
    /// else discovered (and stored for the next load); its nodes' memory as it is now.
    pub fn load(&self) -> Result<Loaded, HostError> {
        self.load_reporting(&Progress::default())
    }

    /// [`TopologyCache::load`], saying in `progress` which step it is at (for a caller that
    /// gives up on a load that blocks, [`crate::wait`]).
    pub fn load_reporting(&self, progress: &Progress) -> Result<Loaded, HostError> {
        let mut loaded = self.load_topology(progress)?;
        progress.set(format!(
            "reading the nodes' memory under {}",
            self.root.join("sys").display()
        ));
        self.read_live_memory(&mut loaded.host);
        Ok(loaded)
    }

    fn load_topology(&self, progress: &Progress) -> Result<Loaded, HostError> {
        progress.set(format!(
            "reading the topology cache's key under {}",
            self.root.display()
        ));
        let key = match self.key() {
            Ok(k) => k,
            Err(e) => {
                progress.set(self.discovering());
                let (host, _) = (self.discovery)()?;
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
        progress.set(format!(
            "loading the cached topology {}",
            self.dir.join(key.file_name()).display()
        ));
        match self.read(&key) {
            Ok((host, path)) => Ok(Loaded {
                host,
                key: Some(key),
                origin: Origin::Cached(path),
            }),
            Err(miss) => {
                progress.set(self.discovering());
                self.discover(key, miss)
            }
        }
    }

    /// What a discovery is doing, in words.
    fn discovering(&self) -> String {
        discovering(&self.root)
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
        let (host, xml) = (self.discovery)()?;
        let stored = match self.key() {
            Ok(after) if after == key => match key.check(&host) {
                Ok(()) => self.store(&key, &xml),
                Err(why) => Err(format!(
                    "the machine changed while it was discovered: the discovery does not match \
                     the key ({why})"
                )),
            },
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
    load_reporting(config, &Progress::default())
}

/// [`load`], saying in `progress` which step it is at.
pub fn load_reporting(config: &Config, progress: &Progress) -> Result<Loaded, HostError> {
    match TopologyCache::from_config(config) {
        Some(cache) => cache.load_reporting(progress),
        None => {
            let source = config.topology_source();
            progress.set(match &source {
                TopologySource::Xml(path) => format!("loading {}", path.display()),
                TopologySource::Live => discovering(&this_machine_root()),
            });
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

/// Where hwloc reads the machine it discovers: `/`, or `HWLOC_FSROOT`.
pub fn this_machine_root() -> PathBuf {
    std::env::var_os("HWLOC_FSROOT")
        .filter(|r| !r.is_empty())
        .map_or_else(|| PathBuf::from("/"), PathBuf::from)
}

/// What a discovery of the machine whose file systems are under `root` is doing, in words.
pub fn discovering(root: &Path) -> String {
    format!(
        "discovering the live machine (hwloc reading {} and {})",
        root.join("sys").display(),
        root.join("proc").display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use key::tests::machine;

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
        // The discovery is this machine's; the key is the tree's, which changed.
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
