//! The VM's real placement, read from procfs: the VMM's vCPU threads and the host CPUs each
//! may run on, its guest memory policy (`numa_maps`), and the guest NUMA layout on its command
//! line (`-numa`, `host-nodes=`).
//!
//! vCPU threads are found by name: QEMU started with `-name …,debug-threads=on` calls them
//! `CPU n/KVM` (`CPU n/TCG` under emulation). Without it they cannot be told from QEMU's other
//! threads; the view then says so (`vcpu_threads_named = false`) and the vCPU rules do not run
//! rather than guess.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::idset::IdSet;

/// Why the VM view could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The process is not there.
    #[error("process {pid} does not exist under {root}")]
    NoProcess {
        /// The pid.
        pid: u32,
        /// The procfs root.
        root: PathBuf,
    },
    /// A procfs file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// One vCPU thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpu {
    /// vCPU index (from the thread name).
    pub index: u32,
    /// Thread id.
    pub tid: u32,
    /// Host CPUs it may run on.
    pub allowed_cpus: IdSet,
}

/// A guest NUMA node from the command line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GuestNode {
    /// Guest node id.
    pub node_id: u32,
    /// The memory backend's id.
    pub memdev: Option<String>,
    /// Host nodes its memory is bound to.
    pub host_nodes: Option<IdSet>,
    /// The backend's policy (`bind`, `preferred`, `interleave`).
    pub policy: Option<String>,
}

/// What the VMM process is and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmView {
    /// The VMM's pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Whether vCPU threads could be identified by name.
    pub vcpu_threads_named: bool,
    /// The vCPU threads, by index.
    pub vcpus: Vec<Vcpu>,
    /// How many mappings of `numa_maps` carry each memory policy (`bind:1`, `default`, …).
    pub memory_policies: BTreeMap<String, u64>,
    /// The host nodes named by bind/interleave/prefer policies.
    pub memory_nodes: IdSet,
    /// Guest NUMA nodes from the command line.
    pub guest_nodes: Vec<GuestNode>,
}

const MAX_FILE: u64 = 16 * 1024 * 1024;

fn read_text(path: &Path) -> Result<String, VmError> {
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_string(&mut text))
        .map_err(|source| VmError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(text)
}

fn read_bytes(path: &Path) -> Result<Vec<u8>, VmError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_FILE).read_to_end(&mut bytes))
        .map_err(|source| VmError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    Ok(bytes)
}

/// `CPU 3/KVM` → 3.
fn vcpu_index(comm: &str) -> Option<u32> {
    let rest = comm.trim().strip_prefix("CPU ")?;
    let (n, accel) = rest.split_once('/')?;
    (!accel.is_empty()).then_some(())?;
    n.parse().ok()
}

fn allowed_cpus(status: &str) -> Option<IdSet> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|v| IdSet::parse(v.trim()).ok())
}

/// `bind:0-1`, `interleave:0,2`, `prefer:1`, `prefer (many):0-1`, `default`, `local`.
fn policy_nodes(policy: &str) -> Option<IdSet> {
    let (_, nodes) = policy.rsplit_once(':')?;
    IdSet::parse(nodes).ok()
}

/// Parses QEMU's `-object memory-backend-*,id=…,host-nodes=…,policy=…` and
/// `-numa node,nodeid=…,memdev=…` arguments.
pub fn guest_nodes_from_cmdline(args: &[String]) -> Vec<GuestNode> {
    let mut backends: BTreeMap<String, (Option<IdSet>, Option<String>)> = BTreeMap::new();
    let mut nodes = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let flag = arg.trim_start_matches('-');
        if flag != "object" && flag != "numa" {
            continue;
        }
        let Some(value) = it.next() else { break };
        let mut parts = value.split(',');
        let kind = parts.next().unwrap_or_default();
        let props: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
        let get = |k: &str| props.iter().find(|(key, _)| *key == k).map(|(_, v)| *v);
        if flag == "object" && kind.starts_with("memory-backend") {
            let host_nodes = props
                .iter()
                .filter(|(k, _)| *k == "host-nodes")
                .filter_map(|(_, v)| IdSet::parse(v).ok())
                .reduce(|a, b| a.union(&b));
            if let Some(id) = get("id") {
                backends.insert(
                    id.to_string(),
                    (host_nodes, get("policy").map(str::to_string)),
                );
            }
        } else if flag == "numa" && (kind == "node" || kind.starts_with("nodeid=")) {
            let node_id = get("nodeid")
                .or_else(|| kind.strip_prefix("nodeid="))
                .and_then(|v| v.parse().ok())
                .unwrap_or(nodes.len() as u32);
            nodes.push(GuestNode {
                node_id,
                memdev: get("memdev").map(str::to_string),
                host_nodes: None,
                policy: None,
            });
        }
    }
    for n in &mut nodes {
        if let Some((hn, pol)) = n.memdev.as_ref().and_then(|m| backends.get(m)) {
            n.host_nodes = hn.clone();
            n.policy = pol.clone();
        }
    }
    nodes
}

impl VmView {
    /// Reads the view of process `pid` under a procfs root (`/proc` on a real host).
    pub fn read(procfs: &Path, pid: u32) -> Result<Self, VmError> {
        let base = procfs.join(pid.to_string());
        if !base.is_dir() {
            return Err(VmError::NoProcess {
                pid,
                root: procfs.to_path_buf(),
            });
        }
        let comm = read_text(&base.join("comm"))?.trim().to_string();
        let mut vcpus = Vec::new();
        let tasks = std::fs::read_dir(base.join("task")).map_err(|source| VmError::Read {
            path: base.join("task"),
            source,
        })?;
        for task in tasks.flatten() {
            let Ok(tid) = task.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            // A thread may exit while we look: skip it.
            let Ok(name) = read_text(&task.path().join("comm")) else {
                continue;
            };
            let Some(index) = vcpu_index(&name) else {
                continue;
            };
            let Ok(status) = read_text(&task.path().join("status")) else {
                continue;
            };
            if let Some(allowed) = allowed_cpus(&status) {
                vcpus.push(Vcpu {
                    index,
                    tid,
                    allowed_cpus: allowed,
                });
            }
        }
        vcpus.sort_by_key(|v| v.index);
        let mut memory_policies = BTreeMap::new();
        let mut memory_nodes = IdSet::new();
        if let Ok(maps) = read_text(&base.join("numa_maps")) {
            for line in maps.lines() {
                let Some(policy) = line.split_whitespace().nth(1) else {
                    continue;
                };
                *memory_policies.entry(policy.to_string()).or_insert(0) += 1;
                if let Some(nodes) = policy_nodes(policy) {
                    memory_nodes = memory_nodes.union(&nodes);
                }
            }
        }
        let cmdline = read_bytes(&base.join("cmdline"))?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        Ok(Self {
            pid,
            comm,
            vcpu_threads_named: !vcpus.is_empty(),
            vcpus,
            memory_policies,
            memory_nodes,
            guest_nodes: guest_nodes_from_cmdline(&args),
        })
    }

    /// Whether this looks like a VMM (it has named vCPU threads).
    pub fn is_vmm(&self) -> bool {
        self.vcpu_threads_named
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_policies() {
        assert_eq!(vcpu_index("CPU 3/KVM\n"), Some(3));
        assert_eq!(vcpu_index("CPU 0/TCG"), Some(0));
        assert_eq!(vcpu_index("CPU x/KVM"), None);
        assert_eq!(vcpu_index("qemu-system-x86"), None);
        assert_eq!(
            policy_nodes("bind:1").map(|n| n.to_string()).as_deref(),
            Some("1")
        );
        assert_eq!(
            policy_nodes("interleave:0-1")
                .map(|n| n.to_string())
                .as_deref(),
            Some("0-1")
        );
        assert_eq!(policy_nodes("default"), None);
    }

    #[test]
    fn parses_qemu_numa_arguments() {
        let args: Vec<String> = [
            "qemu-system-x86_64", "-object", "memory-backend-ram,id=mem0,size=1G,host-nodes=1,policy=bind",
            "-numa", "node,nodeid=0,memdev=mem0", "-object",
            "memory-backend-file,id=mem1,size=1G,mem-path=/dev/shm,host-nodes=0,host-nodes=2,policy=interleave",
            "-numa", "node,nodeid=1,memdev=mem1", "-smp", "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let nodes = guest_nodes_from_cmdline(&args);
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            nodes[0]
                .host_nodes
                .as_ref()
                .map(|n| n.to_string())
                .as_deref(),
            Some("1")
        );
        assert_eq!(nodes[0].policy.as_deref(), Some("bind"));
        assert_eq!(
            nodes[1]
                .host_nodes
                .as_ref()
                .map(|n| n.to_string())
                .as_deref(),
            Some("0,2")
        );
    }

    #[test]
    fn a_missing_process_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            VmView::read(dir.path(), 42),
            Err(VmError::NoProcess { .. })
        ));
    }
}
