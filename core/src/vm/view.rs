//! What the VM view is: the VMM process, its vCPUs and the threads that run them, its memory
//! policy and guest NUMA layout, and why a process was not taken for the sandbox's VMM. How
//! it is read is the [module](super)'s [`VmReader`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::{Disagreement, GuestNode, Source, VmReader};
use crate::idset::IdSet;

/// Why the VM view could not be read.
#[derive(Debug, thiserror::Error)]
pub enum VmError {
    /// The process is not there.
    #[error("process {pid} does not exist under {root}")]
    NoProcess {
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
    /// A directory holds more entries than the view reads.
    #[error("{path} lists more {what} than the {limit} read")]
    TooMany {
        /// What is listed.
        what: &'static str,
        /// The directory.
        path: PathBuf,
        limit: usize,
    },
    /// The process is not a VMM and several of its children are.
    #[error("process {pid} is not a VMM and several of its children are ({children:?}): name one")]
    SeveralVmms {
        /// The pid asked for.
        pid: u32,
        /// Its children that are VMMs.
        children: Vec<u32>,
    },
}

/// Which VMM the process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Vmm {
    /// QEMU.
    Qemu,
    /// cloud-hypervisor.
    CloudHypervisor,
    /// firecracker.
    Firecracker,
    /// dragonball, inside runtime-rs's shim.
    Dragonball,
}

impl Vmm {
    /// Its usual name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Qemu => "QEMU",
            Self::CloudHypervisor => "cloud-hypervisor",
            Self::Firecracker => "firecracker",
            Self::Dragonball => "dragonball",
        }
    }
}

/// How the guest's CPUs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// KVM: the process holds KVM vCPU fds.
    Kvm,
    /// QEMU's TCG emulation.
    Tcg,
}

/// One vCPU and the thread that runs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Vcpu {
    /// The vCPU's id: KVM's vCPU id (`kvm-vcpu:<id>`; on x86 the APIC id, which is the VMM's
    /// CPU index for Kata's topologies), or QEMU's CPU index under TCG.
    pub index: u32,
    /// Thread id.
    pub tid: u32,
    /// Host CPUs it may run on.
    pub allowed_cpus: IdSet,
    /// The sources that tied this thread to this vCPU, strongest first.
    pub sources: Vec<Source>,
}

/// A vCPU that exists (the process holds its KVM fd) but could not be tied to a thread.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Unresolved {
    /// The vCPU id.
    pub index: u32,
    /// Why.
    pub reason: String,
}

/// How the threads were sampled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Sampling {
    /// Samples taken.
    pub samples: u32,
    /// Time from the first to the last, in milliseconds.
    pub window_ms: u64,
}

/// What makes a process the sandbox's VMM beyond looking like one: who runs it, what it
/// runs and whose it is. A process anyone can start — a copy of a binary named
/// `qemu-system-x86_64`, threads named `CPU 0/TCG` — fails one of these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user the runtime runs VMMs as (root; `None`: not checked).
    pub owner: Option<u32>,
    /// The configured hypervisor (Kata's `[hypervisor.*] path`): the VMM's executable
    /// must be it (`None`: not checked).
    pub hypervisor: Option<PathBuf>,
    /// The sandbox: the VMM's cgroup names it, or ...
    pub sandbox_id: Option<String>,
    /// ... its parent chain leads to the sandbox's shim (runtime-rs starts its VMM as a
    /// child; dragonball runs in the shim itself).
    pub shim_pid: Option<u32>,
}

impl Default for Identity {
    /// Root's, anything else unchecked.
    fn default() -> Self {
        Self {
            owner: Some(0),
            hypervisor: None,
            sandbox_id: None,
            shim_pid: None,
        }
    }
}

/// Which identity check a process failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    /// It runs as another user than the runtime.
    Owner,
    /// Its executable is not the configured hypervisor.
    Executable,
    /// It belongs to no part of this sandbox.
    Sandbox,
}

impl Check {
    pub fn name(self) -> &'static str {
        match self {
            Self::Owner => "owner",
            Self::Executable => "executable",
            Self::Sandbox => "sandbox",
        }
    }
}

/// Why a process that looks like a VMM is not taken for the sandbox's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rejection {
    /// The check it failed.
    pub check: Check,
    /// What was expected and found.
    pub reason: String,
}

/// What the VMM process is and where it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VmView {
    /// The VMM's pid.
    pub pid: u32,
    /// The pid asked for, when it is not the VMM's: its parent (runtime-rs's shim), or one of
    /// its threads.
    pub found_via: Option<u32>,
    /// Its command name.
    pub comm: String,
    /// Its executable (the `exe` link's text).
    pub exe: Option<String>,
    /// Which VMM it is, when recognised.
    pub vmm: Option<Vmm>,
    /// KVM or TCG; `None`: not a VMM.
    pub accel: Option<Accel>,
    /// The KVM vCPU ids the process holds an fd for.
    pub kvm_vcpus: IdSet,
    /// The vCPUs tied to a thread, by id.
    pub vcpus: Vec<Vcpu>,
    /// The vCPUs that could not be.
    pub unresolved: Vec<Unresolved>,
    /// Where the sources contradict each other.
    pub disagreements: Vec<Disagreement>,
    /// What else the reader noticed.
    pub notes: Vec<String>,
    /// How the threads were sampled.
    pub sampling: Sampling,
    /// How many mappings of `numa_maps` carry each memory policy (`bind:1`, `default`, …).
    pub memory_policies: BTreeMap<String, u64>,
    /// The host nodes named by bind/interleave/prefer policies.
    pub memory_nodes: IdSet,
    /// Guest NUMA nodes from the command line.
    pub guest_nodes: Vec<GuestNode>,
    /// The process looks like a VMM but failed this identity check ([`Identity`]): it is
    /// not taken for the sandbox's VMM and nothing else of it is read.
    pub rejected: Option<Rejection>,
}

impl VmView {
    /// Reads the view of the sandbox whose runtime reported `pid`, under a procfs root (`/proc`
    /// on a real host), with the default sampling; see [`VmReader`].
    pub fn read(procfs: &Path, pid: u32) -> Result<Self, VmError> {
        VmReader::new(procfs).read(pid)
    }

    /// Whether the process is the sandbox's VMM (see the module documentation).
    pub fn is_vmm(&self) -> bool {
        self.accel.is_some() && self.rejected.is_none()
    }

    /// How many vCPUs the VM has: its KVM vCPU fds, or under TCG its vCPU threads.
    pub fn vcpu_count(&self) -> usize {
        match self.accel {
            Some(Accel::Kvm) => self.kvm_vcpus.len(),
            Some(Accel::Tcg) => self.vcpus.len() + self.unresolved.len(),
            None => 0,
        }
    }
}
