//! The VM's real placement, read from procfs: which thread runs each vCPU and the host CPUs it
//! may run on, the guest memory policy (`numa_maps`), and the guest NUMA layout on the VMM's
//! command line.
//!
//! # Finding the vCPU threads, whatever the VMM
//!
//! Thread names cannot be relied on: QEMU names its vCPU threads (`CPU <n>/KVM`) only with
//! `-name …,debug-threads=on`, which Kata's Go runtime passes only with `enable_debug = true`
//! and runtime-rs never. So the kernel is asked first, and names come second:
//!
//! 1. **`kvm-debugfs`**: `<debugfs>/kvm/<tid>-<vm fd>/vcpu<n>/pid` is the thread that last
//!    entered `KVM_RUN` on vCPU *n* (debugfs mounted, root; `0` for a vCPU that never ran).
//!    The directory is named after the *thread* that created the VM (cloud-hypervisor's `vmm`
//!    thread, QEMU's main thread).
//! 2. **`kvm-fd`**: every `/proc/<pid>/fd/<fd>` that is `anon_inode:kvm-vcpu:<n>` is a vCPU;
//!    a thread whose `/proc/<pid>/task/<tid>/syscall` shows `ioctl(<fd>, KVM_RUN)` runs it.
//!    Only a halted vCPU, or one that left the guest, shows that; one executing guest code
//!    shows `running`. So the threads are sampled a few times over a short window
//!    ([`VmReader::with_sampling`]), stopping early once every vCPU is tied to a thread.
//! 3. **`elimination`**: when exactly one vCPU is left and exactly one thread was runnable in
//!    every sample, that thread is the vCPU (a busy vCPU never blocks in `KVM_RUN`).
//! 4. **`name`**: `CPU <n>/KVM`, `CPU <n>/TCG` (QEMU), `vcpu<n>` (cloud-hypervisor),
//!    `fc_vcpu <n>` (firecracker), `db_vcpu<n>` (dragonball): a second source under KVM, the
//!    only one under TCG.
//!
//! Sources that agree are listed together on the vCPU ([`Vcpu::sources`]); sources that do not
//! are reported ([`VmView::disagreements`]) with the kernel's word kept, and a vCPU that no
//! source, or only contradicting weak sources, tie to a thread is listed in
//! [`VmView::unresolved`] with the reason — never guessed. Threads the kernel runs inside the
//! process (KVM's `kvm-nx-lpage-recovery` worker, which shows the `KVM_RUN` of the vCPU it was
//! cloned from; io_uring workers) are never vCPUs.
//!
//! # What is a VMM
//!
//! A process holding a KVM vCPU fd, whatever its threads are called; or, without KVM, a
//! process whose executable is QEMU (`qemu-system-*`, `qemu-kvm`: the `exe` link, which the
//! process cannot rename) with threads named `CPU <n>/TCG`. A thread name alone proves
//! nothing: any process can name its threads `CPU 0/KVM` or `vcpu0`.
//!
//! # Finding the VMM of a sandbox
//!
//! [`VmReader::read`] takes the pid a runtime reports: the process itself when it is the VMM
//! (Kata's Go runtime reports the VMM's pid; dragonball runs inside runtime-rs's shim), else its
//! one child that is a VMM (runtime-rs reports its own pid and starts QEMU or cloud-hypervisor
//! as its child).

mod cmdline;
mod procfs;
mod vcpus;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::idset::{IdSet, MAX_ID};
pub use cmdline::{cloud_hypervisor_guest_nodes, qemu_guest_nodes, GuestNode};
use procfs::{decimal, Process, Syscall};
use vcpus::{eliminate, resolve, vcpu_name, Claim, NameScheme, Resolution, Samples};
pub use vcpus::{Disagreement, Source};

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

/// Samples taken at most, by default.
pub const DEFAULT_SAMPLES: u32 = 5;
/// Time between samples, by default: five samples span at most 60 ms.
pub const DEFAULT_INTERVAL: Duration = Duration::from_millis(15);

/// Where and how the VM view is read.
#[derive(Debug, Clone)]
pub struct VmReader {
    procfs: PathBuf,
    kvm_debugfs: Option<PathBuf>,
    samples: u32,
    interval: Duration,
    identity: Identity,
}

impl VmReader {
    /// Reads under `procfs`. KVM's debugfs is `/sys/kernel/debug/kvm` when `procfs` is the
    /// live `/proc`, and none for any other root (a recorded tree has its own, or none:
    /// [`VmReader::with_kvm_debugfs`]).
    pub fn new(procfs: &Path) -> Self {
        let live = procfs == Path::new("/proc");
        Self {
            procfs: procfs.to_path_buf(),
            kvm_debugfs: live.then(|| PathBuf::from("/sys/kernel/debug/kvm")),
            samples: DEFAULT_SAMPLES,
            interval: DEFAULT_INTERVAL,
            identity: Identity::default(),
        }
    }

    /// Holds a process that looks like a VMM to `identity` (by default: root's).
    pub fn with_identity(mut self, identity: Identity) -> Self {
        self.identity = identity;
        self
    }

    /// KVM's debugfs directory (`<debugfs>/kvm`), or none.
    pub fn with_kvm_debugfs(mut self, dir: Option<PathBuf>) -> Self {
        self.kvm_debugfs = dir;
        self
    }

    /// Samples at most `samples` times (1 to 50), `interval` apart (at most 1 s).
    pub fn with_sampling(mut self, samples: u32, interval: Duration) -> Self {
        self.samples = samples.clamp(1, 50);
        self.interval = interval.min(Duration::from_secs(1));
        self
    }

    /// Reads the view of the sandbox whose runtime reported `pid`: that process (the process of
    /// that thread, for a thread id) when it is a VMM, else its one child that is (runtime-rs),
    /// else the process, as not a VMM.
    pub fn read(&self, pid: u32) -> Result<VmView, VmError> {
        let process = Process::read(&self.procfs, pid)?;
        if identify(&process).is_some() {
            let via = (process.pid != pid).then_some(pid);
            return self.view(process, via);
        }
        let mut vmms: Vec<Process> = process
            .children()
            .into_iter()
            .filter_map(|c| Process::read(&self.procfs, c).ok())
            .filter(|c| identify(c).is_some())
            .collect();
        match vmms.len() {
            0 => self.view(process, None),
            1 => self.view(vmms.remove(0), Some(pid)),
            _ => Err(VmError::SeveralVmms {
                pid,
                children: vmms.iter().map(|p| p.pid).collect(),
            }),
        }
    }

    /// The first identity check `p` fails; a check with nothing configured to hold it to
    /// passes.
    fn verify(&self, p: &Process) -> Option<Rejection> {
        let id = &self.identity;
        let (owner, _) = p.owner_and_parent();
        if let Some(want) = id.owner {
            match owner {
                Some(uid) if uid == want => {}
                Some(uid) => {
                    return Some(Rejection {
                        check: Check::Owner,
                        reason: format!(
                            "process {} runs as uid {uid}, the runtime's VMMs as uid {want}",
                            p.pid
                        ),
                    })
                }
                None => {
                    return Some(Rejection {
                        check: Check::Owner,
                        reason: format!(
                            "the owner of process {} cannot be read (its status has no Uid \
                             line); the runtime's VMMs run as uid {want}",
                            p.pid
                        ),
                    })
                }
            }
        }
        if let Some(want) = &id.hypervisor {
            let resolved = std::fs::canonicalize(want).ok();
            let ok = p.exe.as_deref().is_some_and(|e| {
                Path::new(e) == want.as_path() || resolved.as_deref() == Some(Path::new(e))
            });
            if !ok {
                return Some(Rejection {
                    check: Check::Executable,
                    reason: format!(
                        "process {} runs {}, not the configured hypervisor {}",
                        p.pid,
                        p.exe
                            .as_deref()
                            .unwrap_or("an executable that cannot be read"),
                        want.display()
                    ),
                });
            }
        }
        if id.sandbox_id.is_none() && id.shim_pid.is_none() {
            return None;
        }
        let cgroups = p.cgroups().unwrap_or_default();
        if let Some(sid) = id.sandbox_id.as_deref().filter(|s| !s.is_empty()) {
            if cgroups
                .iter()
                .any(|c| c.split('/').any(|part| part.contains(sid)))
            {
                return None;
            }
        }
        if let Some(shim) = id.shim_pid {
            let mut pid = p.pid;
            for _ in 0..64 {
                if pid == shim {
                    return None;
                }
                match procfs::status_owner_and_parent(&self.procfs.join(pid.to_string())).1 {
                    Some(parent) if parent > 1 && parent != pid => pid = parent,
                    _ => break,
                }
            }
        }
        let mut wanted = Vec::new();
        if let Some(sid) = &id.sandbox_id {
            wanted.push(format!("a cgroup naming sandbox {sid}"));
        }
        if let Some(shim) = id.shim_pid {
            wanted.push(format!("a parent chain to the sandbox's shim (pid {shim})"));
        }
        Some(Rejection {
            check: Check::Sandbox,
            reason: format!(
                "process {} is in cgroup {} and not a descendant of the shim; the sandbox's VMM \
                 has {}",
                p.pid,
                if cgroups.is_empty() {
                    "unknown".to_string()
                } else {
                    cgroups.join(", ")
                },
                wanted.join(" or ")
            ),
        })
    }

    fn view(&self, p: Process, found_via: Option<u32>) -> Result<VmView, VmError> {
        let mut accel = identify(&p);
        let rejected = accel.and_then(|_| self.verify(&p));
        if rejected.is_some() {
            accel = None;
        }
        let mut view = VmView {
            pid: p.pid,
            found_via,
            comm: p.comm.clone(),
            exe: p.exe.clone(),
            vmm: None,
            accel,
            kvm_vcpus: p.kvm_vcpu_ids(),
            vcpus: Vec::new(),
            unresolved: Vec::new(),
            disagreements: Vec::new(),
            notes: Vec::new(),
            sampling: Sampling::default(),
            memory_policies: BTreeMap::new(),
            memory_nodes: IdSet::new(),
            guest_nodes: Vec::new(),
            rejected,
        };
        if view.rejected.is_some() {
            view.kvm_vcpus = IdSet::new();
            return Ok(view);
        }
        let Some(accel) = accel else {
            let named: Vec<String> = p
                .tasks
                .iter()
                .filter(|t| vcpu_name(&t.name).is_some())
                .take(8)
                .map(|t| format!("{} {:?}", t.tid, t.name))
                .collect();
            if !named.is_empty() {
                view.notes.push(format!(
                    "threads named like vCPUs ({}), but the process holds no KVM vCPU fd and is \
                     not QEMU under TCG: not taken for a VMM",
                    named.join(", ")
                ));
            }
            return Ok(view);
        };
        view.vmm = vmm_of(&p);
        // Threads the kernel runs inside the process are never vCPUs.
        let candidates: BTreeSet<u32> = p
            .tasks
            .iter()
            .filter(|t| !t.kernel_worker)
            .map(|t| t.tid)
            .collect();
        let names: Vec<Claim> = p
            .tasks
            .iter()
            .filter(|t| candidates.contains(&t.tid))
            .filter_map(|t| {
                let (scheme, id) = vcpu_name(&t.name)?;
                (accel == Accel::Kvm || scheme == NameScheme::QemuTcg).then_some(Claim {
                    id,
                    tid: t.tid,
                    source: Source::Name,
                })
            })
            .collect();
        let resolution = match accel {
            Accel::Tcg => resolve(&names, None),
            Accel::Kvm => self.resolve_kvm(&p, &candidates, &names, &mut view),
        };
        view.disagreements = resolution.disagreements;
        for (id, res) in resolution.resolved {
            match p.allowed_cpus(res.tid) {
                Some(allowed_cpus) => view.vcpus.push(Vcpu {
                    index: id,
                    tid: res.tid,
                    allowed_cpus,
                    sources: res.sources,
                }),
                None => view.unresolved.push(Unresolved {
                    index: id,
                    reason: format!("thread {} exited while the view was read", res.tid),
                }),
            }
        }
        view.unresolved.sort_by_key(|u| u.index);
        if let Some(maps) = p.numa_maps() {
            for line in maps.lines() {
                let Some(policy) = line.split_whitespace().nth(1) else {
                    continue;
                };
                *view.memory_policies.entry(policy.to_string()).or_insert(0) += 1;
                if let Some(nodes) = policy_nodes(policy) {
                    view.memory_nodes = view.memory_nodes.union(&nodes);
                }
            }
        }
        if matches!(view.vmm, Some(Vmm::Qemu | Vmm::CloudHypervisor)) {
            match p.cmdline() {
                Ok(args) if view.vmm == Some(Vmm::Qemu) => {
                    view.guest_nodes = qemu_guest_nodes(&args)
                }
                Ok(args) => view.guest_nodes = cloud_hypervisor_guest_nodes(&args),
                Err(e) => view.notes.push(format!("guest NUMA layout unknown: {e}")),
            }
        }
        Ok(view)
    }

    /// Under KVM: the kernel's sources, then elimination over what they left, then names;
    /// every vCPU left open goes to `view.unresolved` with the reason.
    fn resolve_kvm(
        &self,
        p: &Process,
        candidates: &BTreeSet<u32>,
        names: &[Claim],
        view: &mut VmView,
    ) -> Resolution {
        let known = p.kvm_vcpu_ids();
        let mut kernel = self.debugfs_claims(p, candidates, &mut view.notes);
        let (samples, window) = self.sample(p, candidates, &known, &kernel);
        view.sampling = Sampling {
            samples: samples.rounds,
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
        };
        kernel.extend(samples.kvm_run.iter().map(|&(id, tid)| Claim {
            id,
            tid,
            source: Source::KvmFd,
        }));
        let elimination = eliminate(
            &resolve(&kernel, Some(&known)),
            &known,
            &samples,
            candidates,
        );
        let mut all = kernel;
        all.extend(elimination);
        all.extend(names.iter().copied());
        let r = resolve(&all, Some(&known));
        let open: Vec<u32> = known
            .iter()
            .filter(|id| !r.resolved.contains_key(id))
            .collect();
        let busy = samples
            .always_running()
            .into_iter()
            .filter(|t| candidates.contains(t) && !r.resolved.values().any(|v| v.tid == *t))
            .count();
        for &id in &open {
            let reason = if r.contested.contains(&id) {
                "its sources disagree (see the disagreements)".to_string()
            } else {
                format!(
                    "no thread was seen in KVM_RUN on its fd in {} samples over {} ms (a vCPU \
                     executing guest code shows as running; a paused VM's vCPUs never enter \
                     KVM_RUN), {}no thread is named as it, and elimination needs exactly one such \
                     vCPU and one thread running in every sample (here {} vCPUs and {} threads)",
                    view.sampling.samples,
                    view.sampling.window_ms,
                    if self.kvm_debugfs.is_some() {
                        "KVM's debugfs names no thread for it, "
                    } else {
                        ""
                    },
                    open.len(),
                    busy
                )
            };
            view.unresolved.push(Unresolved { index: id, reason });
        }
        r
    }

    /// `kvm-debugfs` claims: the directory `<tid>-<fd>` whose `<fd>` is one of the process's
    /// KVM VM fds and whose vCPUs' threads are the process's; `pid` 0 means the vCPU never ran.
    fn debugfs_claims(
        &self,
        p: &Process,
        candidates: &BTreeSet<u32>,
        notes: &mut Vec<String>,
    ) -> Vec<Claim> {
        let Some(root) = &self.kvm_debugfs else {
            return Vec::new();
        };
        let Ok(entries) = std::fs::read_dir(root) else {
            return Vec::new();
        };
        let tids: BTreeSet<u32> = p.tasks.iter().map(|t| t.tid).collect();
        let mut found = Vec::new();
        for entry in entries.flatten().take(procfs::MAX_FDS) {
            let name = entry.file_name();
            let Some((creator, fd)) = name.to_str().and_then(|n| {
                let (a, b) = n.split_once('-')?;
                Some((decimal(a, u32::MAX)?, decimal(b, u32::MAX)?))
            }) else {
                continue;
            };
            let dir = entry.path();
            if !p.vm_fds.contains(&fd) || !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir())
            {
                continue;
            }
            let mut threads = Vec::new();
            for v in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                if !v.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let Some(id) = v
                    .file_name()
                    .to_str()
                    .and_then(|n| n.strip_prefix("vcpu"))
                    .and_then(|n| decimal(n, MAX_ID))
                else {
                    continue;
                };
                let tid = procfs::read_small(&v.path().join("pid"))
                    .ok()
                    .and_then(|t| decimal(t.trim_end_matches('\n'), u32::MAX));
                if let Some(tid) = tid.filter(|t| *t != 0) {
                    threads.push((id, tid));
                }
            }
            let ours = threads.iter().all(|(_, t)| tids.contains(t))
                && (tids.contains(&creator) || !threads.is_empty());
            if ours {
                found.push(threads);
            }
        }
        match found.len() {
            0 => Vec::new(),
            1 => found
                .remove(0)
                .into_iter()
                .filter(|(_, tid)| candidates.contains(tid))
                .map(|(id, tid)| Claim {
                    id,
                    tid,
                    source: Source::KvmDebugfs,
                })
                .collect(),
            n => {
                notes.push(format!(
                    "{n} KVM debugfs directories under {} match this process: not used",
                    root.display()
                ));
                Vec::new()
            }
        }
    }

    /// Samples the candidates' `syscall` files until every vCPU has a kernel source or the
    /// samples are spent.
    fn sample(
        &self,
        p: &Process,
        candidates: &BTreeSet<u32>,
        known: &IdSet,
        kernel: &[Claim],
    ) -> (Samples, Duration) {
        let mut s = Samples::default();
        let mut covered: BTreeSet<u32> = kernel.iter().map(|c| c.id).collect();
        let start = Instant::now();
        for round in 0..self.samples {
            if round > 0 {
                std::thread::sleep(self.interval);
            }
            for &tid in candidates {
                match p.syscall(tid) {
                    Some(Syscall::Running) => *s.running.entry(tid).or_insert(0) += 1,
                    Some(Syscall::KvmRun { fd }) => {
                        if let Some(&id) = p.vcpu_fds.get(&fd) {
                            s.kvm_run.insert((id, tid));
                            covered.insert(id);
                        }
                    }
                    Some(Syscall::Other) | None => {}
                }
            }
            s.rounds += 1;
            if known.iter().all(|id| covered.contains(&id)) {
                break;
            }
        }
        (s, start.elapsed())
    }
}

/// KVM when the process holds a KVM vCPU fd; TCG when its executable is QEMU and it has
/// `CPU <n>/TCG` threads; otherwise not a VMM.
fn identify(p: &Process) -> Option<Accel> {
    if !p.vcpu_fds.is_empty() {
        return Some(Accel::Kvm);
    }
    let exe_is_qemu = p
        .exe
        .as_deref()
        .and_then(|e| e.rsplit('/').next())
        .is_some_and(is_qemu);
    let tcg_threads = p
        .tasks
        .iter()
        .any(|t| !t.kernel_worker && matches!(vcpu_name(&t.name), Some((NameScheme::QemuTcg, _))));
    (exe_is_qemu && tcg_threads).then_some(Accel::Tcg)
}

fn is_qemu(program: &str) -> bool {
    program.starts_with("qemu-system-") || program == "qemu-kvm"
}

/// Which VMM: by its executable (else its command name), else by how its threads are named.
fn vmm_of(p: &Process) -> Option<Vmm> {
    let program = p.program();
    if is_qemu(program) {
        return Some(Vmm::Qemu);
    }
    // The command name is cut at 15 bytes: `cloud-hyperviso`.
    if program.starts_with("cloud-hyperviso") {
        return Some(Vmm::CloudHypervisor);
    }
    if program.starts_with("firecracker") {
        return Some(Vmm::Firecracker);
    }
    p.tasks
        .iter()
        .filter(|t| !t.kernel_worker)
        .find_map(|t| match vcpu_name(&t.name)?.0 {
            NameScheme::QemuKvm | NameScheme::QemuTcg => Some(Vmm::Qemu),
            NameScheme::CloudHypervisor => Some(Vmm::CloudHypervisor),
            NameScheme::Firecracker => Some(Vmm::Firecracker),
            NameScheme::Dragonball => Some(Vmm::Dragonball),
        })
}

/// `bind:0-1`, `interleave:0,2`, `prefer:1`, `prefer (many):0-1`, `default`, `local`.
fn policy_nodes(policy: &str) -> Option<IdSet> {
    let (_, nodes) = policy.rsplit_once(':')?;
    IdSet::parse(nodes).ok()
}

#[cfg(test)]
mod tests;
