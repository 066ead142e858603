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
mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::idset::{IdSet, MAX_ID};
pub use cmdline::{cloud_hypervisor_guest_nodes, qemu_guest_nodes, GuestNode};
use procfs::{decimal, Process, Syscall};
use vcpus::{eliminate, resolve, vcpu_name, Claim, NameScheme, Resolution, Samples};
pub use vcpus::{Disagreement, Source};
pub use view::{
    Accel, Check, Identity, Rejection, Sampling, Unresolved, Vcpu, VmError, VmView, Vmm,
};

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
mod tests {
    //! The VM view over /proc trees: built here to pin one behaviour each, and recorded from real
    //! VMMs (`tests/fixtures/vmm/`, see its README) — QEMU and cloud-hypervisor on this project's
    //! CI machines, firecracker and dragonball written from their thread layout because those
    //! VMMs cannot run there.

    use std::path::{Path, PathBuf};
    use std::time::Duration;

    use super::*;

    /// A /proc tree (and a KVM debugfs) in a temporary directory.
    struct Tree {
        dir: tempfile::TempDir,
    }

    const USER: u64 = 0x0040_0040;
    /// `PF_USER_WORKER` as KVM's `kvm-nx-lpage-recovery` worker carries it.
    const WORKER: u64 = 0x0840_40c0;
    const HALTED: &str =
        "16 0x%fd 0xae80 0x0 0x0 0x5568582d5290 0x0 0x7f7c1b7fd5d8 0x7f7c1f4b2c5b\n";
    const FUTEX: &str = "202 0x5568589f77a8 0x0 0xffffffff 0x0 0x0 0x0 0x7ffc 0x7f7c\n";
    const PPOLL: &str = "271 0x55688ed8b500 0x4 0x7ffc093f67c0 0x0 0x8 0x0 0x7ffc 0x7f7c\n";

    fn kvm_run(fd: u32) -> String {
        HALTED.replace("%fd", &format!("{fd:x}"))
    }

    impl Tree {
        fn new() -> Self {
            Self {
                dir: tempfile::tempdir().expect("tempdir"),
            }
        }

        fn proc(&self) -> PathBuf {
            self.dir.path().join("proc")
        }

        fn debugfs(&self) -> PathBuf {
            self.dir.path().join("debugfs/kvm")
        }

        fn write(path: &Path, text: &str) {
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }

        fn process(&self, pid: u32, comm: &str, exe: Option<&str>, cmdline: &[&str]) -> &Self {
            let p = self.proc().join(pid.to_string());
            std::fs::create_dir_all(p.join("fd")).expect("fd");
            std::fs::create_dir_all(p.join("task")).expect("task");
            Self::write(&p.join("comm"), &format!("{comm}\n"));
            let mut args = cmdline.join("\0");
            args.push('\0');
            Self::write(&p.join("cmdline"), &args);
            if let Some(exe) = exe {
                std::os::unix::fs::symlink(exe, p.join("exe")).expect("exe");
            }
            self.owner(pid, 0, 1, "0::/\n")
                .thread(pid, pid, comm, USER, PPOLL, "0-1")
        }

        fn fd(&self, pid: u32, fd: u32, link: &str) -> &Self {
            let p = self.proc().join(format!("{pid}/fd/{fd}"));
            std::os::unix::fs::symlink(link, p).expect("fd link");
            self
        }

        fn thread(
            &self,
            pid: u32,
            tid: u32,
            name: &str,
            flags: u64,
            syscall: &str,
            cpus: &str,
        ) -> &Self {
            let t = self.proc().join(format!("{pid}/task/{tid}"));
            Self::write(&t.join("comm"), &format!("{name}\n"));
            Self::write(
                &t.join("stat"),
                &format!("{tid} ({name}) S 1 {pid} {pid} 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 6 0\n"),
            );
            Self::write(&t.join("syscall"), syscall);
            Self::write(
            &t.join("status"),
            &format!("Name:\t{name}\nTgid:\t{pid}\nPid:\t{tid}\nCpus_allowed:\t3\nCpus_allowed_list:\t{cpus}\n"),
        );
            Self::write(&t.join("children"), "");
            self
        }

        /// The process's owner and parent (`Uid:`, `PPid:` of its `status`) and its cgroups.
        fn owner(&self, pid: u32, uid: u32, ppid: u32, cgroup: &str) -> &Self {
            Self::write(
            &self.proc().join(format!("{pid}/status")),
            &format!(
                "Name:\tx\nTgid:\t{pid}\nPid:\t{pid}\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
            ),
        );
            Self::write(&self.proc().join(format!("{pid}/cgroup")), cgroup);
            self
        }

        fn children(&self, pid: u32, tid: u32, children: &str) -> &Self {
            Self::write(
                &self.proc().join(format!("{pid}/task/{tid}/children")),
                children,
            );
            self
        }

        fn debugfs_vcpu(&self, dir: &str, id: u32, tid: u32) -> &Self {
            Self::write(
                &self.debugfs().join(format!("{dir}/vcpu{id}/pid")),
                &format!("{tid}\n"),
            );
            self
        }

        /// A QEMU under KVM without thread names: two vCPUs (fds 11, 14), KVM's worker cloned
        /// from vCPU 0, `syscalls` the vCPU threads' lines.
        fn qemu(&self, pid: u32, vcpu0: &str, vcpu1: &str) -> &Self {
            self.process(
                pid,
                "qemu-system-x86",
                Some("/usr/bin/qemu-system-x86_64"),
                &[
                    "qemu-system-x86_64",
                    "-machine",
                    "q35,accel=kvm",
                    "-smp",
                    "2",
                ],
            )
            .fd(pid, 8, "/dev/kvm")
            .fd(pid, 9, "anon_inode:kvm-vm")
            .fd(pid, 11, "anon_inode:kvm-vcpu:0")
            .fd(pid, 14, "anon_inode:kvm-vcpu:1")
            .fd(pid, 3, "socket:[1234]")
            .thread(pid, pid + 2, "qemu-system-x86", USER, FUTEX, "0-1")
            .thread(pid, pid + 5, "qemu-system-x86", USER, vcpu0, "0")
            .thread(pid, pid + 6, "qemu-system-x86", USER, vcpu1, "1")
            .thread(pid, pid + 9, "kvm-nx-lpage-re", WORKER, &kvm_run(11), "0-1")
        }

        fn reader(&self) -> VmReader {
            VmReader::new(&self.proc())
                .with_kvm_debugfs(Some(self.debugfs()))
                .with_sampling(3, Duration::ZERO)
        }
    }

    fn map(view: &VmView) -> Vec<(u32, u32, Vec<&'static str>)> {
        view.vcpus
            .iter()
            .map(|v| {
                (
                    v.index,
                    v.tid,
                    v.sources.iter().map(|s| s.as_str()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn halted_vcpus_are_tied_by_their_kvm_fd_and_the_kernel_worker_is_not_a_vcpu() {
        let t = Tree::new();
        t.qemu(100, &kvm_run(11), &kvm_run(14));
        let v = t.reader().read(100).expect("view");
        assert!(v.is_vmm());
        assert_eq!(v.accel, Some(Accel::Kvm));
        assert_eq!(v.vmm, Some(Vmm::Qemu));
        assert_eq!(v.kvm_vcpus.to_string(), "0-1");
        assert_eq!(
            map(&v),
            vec![(0, 105, vec!["kvm-fd"]), (1, 106, vec!["kvm-fd"])]
        );
        assert_eq!(v.vcpus[1].allowed_cpus.to_string(), "1");
        assert!(
            v.unresolved.is_empty() && v.disagreements.is_empty(),
            "{v:?}"
        );
        // Every vCPU tied at the first sample: no more are taken.
        assert_eq!(v.sampling.samples, 1);
        assert_eq!(v.vcpu_count(), 2);
    }

    #[test]
    fn the_one_busy_vcpu_is_found_by_elimination() {
        let t = Tree::new();
        t.qemu(100, "running\n", &kvm_run(14));
        let v = t.reader().read(100).expect("view");
        assert_eq!(
            map(&v),
            vec![(0, 105, vec!["elimination"]), (1, 106, vec!["kvm-fd"])]
        );
        assert_eq!(v.sampling.samples, 3);
        // A second thread running all the time: the busy vCPU cannot be told.
        t.thread(100, 107, "qemu-system-x86", USER, "running\n", "0-1");
        let v = t.reader().read(100).expect("view");
        assert_eq!(map(&v), vec![(1, 106, vec!["kvm-fd"])]);
        assert_eq!(v.unresolved.len(), 1);
        assert_eq!(v.unresolved[0].index, 0);
        assert!(
            v.unresolved[0]
                .reason
                .contains("here 1 vCPUs and 2 threads"),
            "{}",
            v.unresolved[0].reason
        );
    }

    #[test]
    fn a_paused_vm_has_vcpus_but_no_thread_for_them() {
        let t = Tree::new();
        t.qemu(100, FUTEX, FUTEX);
        let v = t.reader().read(100).expect("view");
        assert!(v.is_vmm());
        assert!(v.vcpus.is_empty());
        assert_eq!(
            v.unresolved.iter().map(|u| u.index).collect::<Vec<_>>(),
            vec![0, 1]
        );
        assert!(v.unresolved[0].reason.contains("3 samples"));
        assert_eq!(v.vcpu_count(), 2);
    }

    #[test]
    fn names_corroborate_the_kernel_or_stand_in_for_it() {
        let t = Tree::new();
        t.qemu(100, "running\n", &kvm_run(14))
            .thread(100, 105, "CPU 0/KVM", USER, "running\n", "0")
            .thread(100, 106, "CPU 1/KVM", USER, &kvm_run(14), "1");
        let v = t.reader().read(100).expect("view");
        assert_eq!(
            map(&v),
            vec![
                (0, 105, vec!["elimination", "name"]),
                (1, 106, vec!["kvm-fd", "name"])
            ]
        );
        // With a second busy thread, the name alone ties vCPU 0.
        t.thread(100, 107, "qemu-system-x86", USER, "running\n", "0-1");
        let v = t.reader().read(100).expect("view");
        assert_eq!(map(&v)[0], (0, 105, vec!["name"]));
        assert!(v.disagreements.is_empty());
    }

    #[test]
    fn a_name_that_contradicts_the_kernel_is_reported_and_the_kernel_kept() {
        let t = Tree::new();
        t.qemu(100, &kvm_run(11), &kvm_run(14))
            .thread(100, 105, "CPU 1/KVM", USER, &kvm_run(11), "0")
            .thread(100, 106, "CPU 0/KVM", USER, &kvm_run(14), "1")
            // A thread that names itself as a vCPU the VM does not have.
            .thread(100, 107, "CPU 7/KVM", USER, FUTEX, "0-1");
        let v = t.reader().read(100).expect("view");
        assert_eq!(
            map(&v),
            vec![(0, 105, vec!["kvm-fd"]), (1, 106, vec!["kvm-fd"])]
        );
        assert_eq!(v.disagreements.len(), 3, "{:?}", v.disagreements);
        assert!(v
            .disagreements
            .iter()
            .any(|d| d.message.contains("no KVM vCPU 7")));
    }

    #[test]
    fn kvm_debugfs_ties_busy_vcpus_and_is_checked_against_the_process() {
        let t = Tree::new();
        t.qemu(100, "running\n", "running\n");
        // Both vCPUs busy: neither sampling nor elimination can tell them.
        let v = t.reader().with_kvm_debugfs(None).read(100).expect("view");
        assert!(v.vcpus.is_empty());
        // The VM was created by another thread than the main one (cloud-hypervisor's `vmm`).
        t.debugfs_vcpu("102-9", 0, 105)
            .debugfs_vcpu("102-9", 1, 106);
        // Another process's VM with the same fd number, and one whose vCPUs never ran.
        t.debugfs_vcpu("555-9", 0, 556).debugfs_vcpu("556-9", 0, 0);
        let v = t.reader().read(100).expect("view");
        assert_eq!(
            map(&v),
            vec![(0, 105, vec!["kvm-debugfs"]), (1, 106, vec!["kvm-debugfs"])]
        );
        assert!(v.notes.is_empty(), "{:?}", v.notes);
    }

    #[test]
    fn kvm_debugfs_disagreeing_with_sampling_leaves_the_vcpu_unresolved() {
        let t = Tree::new();
        t.qemu(100, &kvm_run(11), &kvm_run(14))
            .debugfs_vcpu("100-9", 0, 106)
            .debugfs_vcpu("100-9", 1, 106);
        let v = t.reader().read(100).expect("view");
        assert!(v.vcpus.is_empty(), "{v:?}");
        assert_eq!(v.unresolved.len(), 2);
        assert!(!v.disagreements.is_empty());
    }

    #[test]
    fn threads_named_like_vcpus_do_not_make_a_vmm() {
        let t = Tree::new();
        // Named as QEMU's, cloud-hypervisor's and firecracker's vCPUs, with QEMU's executable
        // name, but no KVM vCPU fd.
        t.process(
            200,
            "qemu-system-x86",
            Some("/usr/bin/qemu-system-x86_64"),
            &["qemu-system-x86_64"],
        )
        .thread(200, 201, "CPU 0/KVM", USER, &kvm_run(3), "0")
        .thread(200, 202, "vcpu1", USER, FUTEX, "0")
        .thread(200, 203, "fc_vcpu 2", USER, FUTEX, "0")
        .fd(200, 3, "/dev/kvm");
        let v = t.reader().read(200).expect("view");
        assert!(!v.is_vmm());
        assert!(v.vcpus.is_empty() && v.vmm.is_none());
        assert_eq!(v.vcpu_count(), 0);
        assert!(v.notes[0].contains("201 \"CPU 0/KVM\""), "{:?}", v.notes);
        // TCG names need QEMU's executable: a process called anything else is not a VMM.
        t.process(
            300,
            "qemu-system-x86",
            Some("/usr/bin/python3"),
            &["qemu-system-x86_64"],
        )
        .thread(300, 301, "CPU 0/TCG", USER, FUTEX, "0");
        assert!(!t.reader().read(300).expect("view").is_vmm());
    }

    /// Anyone can run a copy of a binary named `qemu-system-x86_64` and name its threads
    /// `CPU <n>/TCG`. A VMM is a process the runtime started for this sandbox: owned by the
    /// runtime's user, running the configured hypervisor, and the sandbox's (its cgroup names
    /// the sandbox, or its parents lead to the sandbox's shim). The first check that fails is named.
    #[test]
    fn an_impostor_is_not_taken_for_the_vmm_and_the_check_that_failed_is_named() {
        let t = Tree::new();
        let impostor = |pid: u32, exe: &str| {
            t.process(
                pid,
                "qemu-system-x86",
                Some(exe),
                &["qemu-system-x86_64", "-accel", "tcg"],
            )
            .thread(pid, pid + 1, "CPU 0/TCG", USER, FUTEX, "0")
            .thread(pid, pid + 2, "CPU 1/TCG", USER, FUTEX, "1");
        };
        let identity = Identity {
            owner: Some(0),
            hypervisor: Some(PathBuf::from("/opt/kata/bin/qemu-system-x86_64")),
            sandbox_id: Some("4f1c0e5a9b7d".into()),
            shim_pid: Some(50),
        };
        let read = |pid: u32| {
            t.reader()
                .with_identity(identity.clone())
                .read(pid)
                .expect("view")
        };
        let rejected = |v: &VmView| {
            assert!(!v.is_vmm(), "{v:#?}");
            assert!(v.vcpus.is_empty() && v.guest_nodes.is_empty(), "{v:#?}");
            v.rejected.clone().expect("rejected")
        };

        // Another user's copy.
        impostor(400, "/home/mallory/qemu-system-x86_64");
        t.owner(
            400,
            65534,
            1,
            "0::/user.slice/user-1000.slice/session-4.scope\n",
        );
        let r = rejected(&read(400));
        assert_eq!(r.check, Check::Owner);
        assert!(
            r.reason.contains("uid 65534") && r.reason.contains("uid 0"),
            "{}",
            r.reason
        );

        // Root's, but not the configured hypervisor.
        impostor(410, "/tmp/qemu-system-x86_64");
        t.owner(410, 0, 1, "0::/system.slice/cron.service\n");
        let r = rejected(&read(410));
        assert_eq!(r.check, Check::Executable);
        assert!(r.reason.contains("/tmp/qemu-system-x86_64"), "{}", r.reason);
        assert!(
            r.reason.contains("/opt/kata/bin/qemu-system-x86_64"),
            "{}",
            r.reason
        );

        // The configured hypervisor, root's, but another sandbox's (or none).
        impostor(420, "/opt/kata/bin/qemu-system-x86_64");
        t.owner(420, 0, 1, "0::/system.slice/cron.service\n");
        let r = rejected(&read(420));
        assert_eq!(r.check, Check::Sandbox);
        assert!(
            r.reason.contains("4f1c0e5a9b7d") && r.reason.contains("cron.service"),
            "{}",
            r.reason
        );

        // The sandbox's: by its cgroup, or by its parent chain up to the shim.
        impostor(430, "/opt/kata/bin/qemu-system-x86_64");
        t.owner(
            430,
            0,
            1,
            "0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-4f1c0e5a9b7d.scope\n",
        );
        let v = read(430);
        assert!(v.is_vmm() && v.rejected.is_none(), "{v:#?}");
        assert_eq!(v.vcpus.len(), 2);
        impostor(440, "/opt/kata/bin/qemu-system-x86_64");
        t.owner(440, 0, 60, "0::/system.slice/containerd.service\n");
        t.process(
            60,
            "containerd-shim",
            Some("/usr/bin/containerd-shim-kata-v2"),
            &[],
        )
        .owner(60, 0, 50, "0::/system.slice/containerd.service\n");
        let v = read(440);
        assert!(v.is_vmm() && v.rejected.is_none(), "{v:#?}");

        // Unknown owner: not taken either.
        impostor(450, "/opt/kata/bin/qemu-system-x86_64");
        std::fs::remove_file(t.proc().join("450/status")).expect("rm");
        let r = rejected(&read(450));
        assert_eq!(r.check, Check::Owner);
    }

    #[test]
    fn qemu_under_tcg_is_known_by_its_executable_and_thread_names() {
        let t = Tree::new();
        t.process(
            300,
            "qemu-system-x86",
            Some("/usr/bin/qemu-system-x86_64 (deleted)"),
            &["qemu-system-x86_64", "-accel", "tcg"],
        )
        .thread(300, 301, "CPU 0/TCG", USER, FUTEX, "0")
        .thread(300, 302, "CPU 1/TCG", USER, "running\n", "0")
        .thread(300, 303, "CPU 1/KVM", USER, FUTEX, "1");
        let v = t.reader().read(300).expect("view");
        assert_eq!(v.accel, Some(Accel::Tcg));
        assert_eq!(v.vmm, Some(Vmm::Qemu));
        assert_eq!(v.exe.as_deref(), Some("/usr/bin/qemu-system-x86_64"));
        // KVM-style names do not count under TCG.
        assert_eq!(
            map(&v),
            vec![(0, 301, vec!["name"]), (1, 302, vec!["name"])]
        );
        assert_eq!(v.vcpu_count(), 2);
        assert_eq!(v.sampling.samples, 0);
        // Two threads named as the same vCPU: neither is taken.
        t.thread(300, 304, "CPU 1/TCG", USER, FUTEX, "1");
        let v = t.reader().read(300).expect("view");
        assert_eq!(map(&v), vec![(0, 301, vec!["name"])]);
        assert_eq!(v.disagreements.len(), 1);
    }

    #[test]
    fn the_vmm_child_of_a_shim_is_found() {
        let t = Tree::new();
        // runtime-rs: the shim reports its own pid; QEMU is the child of one of its threads.
        t.process(
            50,
            "containerd-shim",
            Some("/opt/kata/runtime-rs/bin/containerd-shim-kata-v2"),
            &[],
        )
        .thread(50, 52, "tokio-runtime-w", USER, FUTEX, "0-1")
        .children(50, 52, "61 100 ");
        t.process(61, "virtiofsd", Some("/opt/kata/libexec/virtiofsd"), &[]);
        t.qemu(100, &kvm_run(11), &kvm_run(14));
        let v = t.reader().read(50).expect("view");
        assert_eq!(v.pid, 100);
        assert_eq!(v.found_via, Some(50));
        assert_eq!(v.vcpus.len(), 2);
        // Two VMM children: which one is the sandbox's cannot be told.
        t.children(50, 50, "130\n");
        t.qemu(130, &kvm_run(11), &kvm_run(14));
        assert!(matches!(
            t.reader().read(50),
            Err(VmError::SeveralVmms { pid: 50, ref children }) if children == &[100, 130]
        ));
        // A thread id (newer runtime-rs reports the VMM's master thread) reads its process.
        Tree::write(
            &t.proc().join("107/status"),
            "Name:\tqemu-system-x86\nTgid:\t100\nPid:\t107\n",
        );
        let v = t.reader().read(107).expect("view");
        assert_eq!((v.pid, v.found_via, v.vcpus.len()), (100, Some(107), 2));
        // A process that is not a VMM and has no VMM child is read as itself.
        let v = t.reader().read(61).expect("view");
        assert_eq!((v.pid, v.found_via, v.is_vmm()), (61, None, false));
    }

    #[test]
    fn cloud_hypervisor_memory_zones_give_the_guest_nodes() {
        let t = Tree::new();
        t.process(
            400,
            "cloud-hyperviso",
            Some("/usr/local/bin/cloud-hypervisor"),
            &[
                "cloud-hypervisor",
                "--memory-zone",
                "id=mem0,size=1G,host_numa_node=1",
                "--numa",
                "guest_numa_id=0,cpus=[0],memory_zones=mem0",
            ],
        )
        .fd(400, 30, "anon_inode:kvm-vcpu:0")
        .thread(400, 410, "vcpu0", USER, &kvm_run(30), "0");
        Tree::write(
            &t.proc().join("400/numa_maps"),
            "7f0000000000 bind:1 anon=262144 dirty=262144 N1=262144 kernelpagesize_kB=4\n\
         7f1000000000 default anon=3 dirty=3 N0=3 kernelpagesize_kB=4\n",
        );
        let v = t.reader().read(400).expect("view");
        assert_eq!(v.vmm, Some(Vmm::CloudHypervisor));
        assert_eq!(map(&v), vec![(0, 410, vec!["kvm-fd", "name"])]);
        assert_eq!(v.guest_nodes.len(), 1);
        assert_eq!(
            v.guest_nodes[0]
                .host_nodes
                .as_ref()
                .map(ToString::to_string),
            Some("1".into())
        );
        assert_eq!(v.memory_nodes.to_string(), "1");
        assert_eq!(v.memory_policies.get("bind:1"), Some(&1));
    }

    #[test]
    fn a_missing_process_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(
            VmView::read(dir.path(), 42),
            Err(VmError::NoProcess { .. })
        ));
    }

    #[test]
    fn unreadable_fds_are_an_error_not_a_verdict() {
        let t = Tree::new();
        t.qemu(100, &kvm_run(11), &kvm_run(14));
        std::fs::remove_dir_all(t.proc().join("100/fd")).expect("rm");
        assert!(matches!(
            t.reader().read(100),
            Err(VmError::Read { ref path, .. }) if path.ends_with("100/fd")
        ));
    }

    mod hostile {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(64))]
            /// Whatever the files say, reading never panics and never ties a thread that is not
            /// in the process.
            #[test]
            fn any_contents_read_without_panic(
                name in proptest::collection::vec(any::<u8>(), 0..40),
                syscall in proptest::collection::vec(any::<u8>(), 0..120),
                stat in proptest::collection::vec(any::<u8>(), 0..120),
                status in proptest::collection::vec(any::<u8>(), 0..120),
                children in proptest::collection::vec(any::<u8>(), 0..40),
                cmdline in proptest::collection::vec(any::<u8>(), 0..200),
                maps in proptest::collection::vec(any::<u8>(), 0..200),
                link in "[ -~]{0,40}",
            ) {
                let t = Tree::new();
                t.qemu(100, "running\n", &kvm_run(14));
                let task = t.proc().join("100/task/105");
                std::fs::write(task.join("comm"), &name).expect("write");
                std::fs::write(task.join("syscall"), &syscall).expect("write");
                std::fs::write(task.join("stat"), &stat).expect("write");
                std::fs::write(task.join("status"), &status).expect("write");
                std::fs::write(task.join("children"), &children).expect("write");
                std::fs::write(t.proc().join("100/cmdline"), &cmdline).expect("write");
                std::fs::write(t.proc().join("100/numa_maps"), &maps).expect("write");
                let _ = std::os::unix::fs::symlink(&link, t.proc().join("100/fd/20"));
                if let Ok(v) = t.reader().read(100) {
                    for vcpu in &v.vcpus {
                        prop_assert!([100, 102, 105, 106].contains(&vcpu.tid), "{:?}", vcpu);
                    }
                }
            }
        }
    }

    /// The recorded trees under `tests/fixtures/vmm/`.
    mod recorded {
        use super::*;

        fn fixture(name: &str) -> PathBuf {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/vmm")
                .join(name)
        }

        fn read(name: &str, pid: u32, debugfs: bool) -> VmView {
            let dir = fixture(name);
            VmReader::new(&dir.join("proc"))
                .with_kvm_debugfs(debugfs.then(|| dir.join("debugfs/kvm")))
                .with_sampling(2, Duration::ZERO)
                .read(pid)
                .expect("view")
        }

        /// The only pid directory of a recorded tree.
        fn pid_of(name: &str) -> u32 {
            let mut pids: Vec<u32> = std::fs::read_dir(fixture(name).join("proc"))
                .expect("fixture")
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect();
            pids.sort_unstable();
            pids[0]
        }

        #[test]
        fn qemu_under_kvm_without_debug_threads_recorded() {
            let pid = pid_of("qemu-kvm");
            let v = read("qemu-kvm", pid, false);
            assert_eq!((v.vmm, v.accel), (Some(Vmm::Qemu), Some(Accel::Kvm)));
            // vCPU 0 spins in its firmware (elimination), vCPU 1 waits for its start-up IPI
            // (KVM_RUN); KVM's nx-lpage worker shows vCPU 1's fd too and is not a vCPU.
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(sources, vec![(0, vec!["elimination"]), (1, vec!["kvm-fd"])]);
            assert!(v.disagreements.is_empty());
            let worker = std::fs::read_dir(fixture("qemu-kvm").join(format!("proc/{pid}/task")))
                .expect("tasks")
                .flatten()
                .find(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.starts_with("kvm-nx-lpage"))
                })
                .expect("the recording has KVM's worker thread");
            let worker_tid: u32 = worker
                .file_name()
                .to_str()
                .and_then(|s| s.parse().ok())
                .expect("tid");
            assert!(v.vcpus.iter().all(|c| c.tid != worker_tid));
            // With KVM's debugfs as recorded, the kernel ties vCPU 0 too, to the same thread, and
            // nothing is left to eliminate.
            let by_elimination = v.vcpus[0].tid;
            let v = read("qemu-kvm", pid, true);
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(
                sources,
                vec![(0, vec!["kvm-debugfs"]), (1, vec!["kvm-debugfs", "kvm-fd"])]
            );
            assert_eq!(v.vcpus[0].tid, by_elimination);
            assert_eq!(
                v.guest_nodes[0]
                    .host_nodes
                    .as_ref()
                    .map(ToString::to_string),
                Some("0".into())
            );
        }

        #[test]
        fn cloud_hypervisor_recorded() {
            let pid = pid_of("cloud-hypervisor");
            let v = read("cloud-hypervisor", pid, false);
            assert_eq!(
                (v.vmm, v.accel),
                (Some(Vmm::CloudHypervisor), Some(Accel::Kvm))
            );
            // vCPU 0 runs the guest; KVM's worker, cloned from it, shows `KVM_RUN` on vCPU 0's fd
            // and would be taken for it if kernel workers were not set aside.
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(
                sources,
                vec![
                    (0, vec!["elimination", "name"]),
                    (1, vec!["kvm-fd", "name"])
                ]
            );
            assert!(v.disagreements.is_empty(), "{:?}", v.disagreements);
            // Its debugfs directory is named after the `vmm` thread, which created the VM.
            let v = read("cloud-hypervisor", pid, true);
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(
                sources,
                vec![
                    (0, vec!["kvm-debugfs", "name"]),
                    (1, vec!["kvm-debugfs", "kvm-fd", "name"])
                ]
            );
            assert_eq!(v.guest_nodes.len(), 2);
            assert_eq!(v.guest_nodes[1].memdev.as_deref(), Some("mem1"));
            assert_eq!(
                v.guest_nodes[1]
                    .host_nodes
                    .as_ref()
                    .map(ToString::to_string),
                Some("0".into())
            );
            assert_eq!(v.memory_nodes.to_string(), "0");
        }

        #[test]
        fn firecracker_written_from_its_layout_as_it_cannot_run_here() {
            let v = read("firecracker", pid_of("firecracker"), false);
            assert_eq!((v.vmm, v.accel), (Some(Vmm::Firecracker), Some(Accel::Kvm)));
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(
                sources,
                vec![
                    (0, vec!["kvm-fd", "name"]),
                    (1, vec!["elimination", "name"])
                ]
            );
            assert!(v.guest_nodes.is_empty());
        }

        #[test]
        fn dragonball_in_the_runtime_rs_shim_written_from_its_layout_as_it_cannot_run_here() {
            let v = read("dragonball", pid_of("dragonball"), false);
            assert_eq!(
                (v.vmm, v.accel, v.found_via),
                (Some(Vmm::Dragonball), Some(Accel::Kvm), None)
            );
            assert_eq!(v.comm, "containerd-shim");
            let sources: Vec<_> = map(&v).into_iter().map(|(i, _, s)| (i, s)).collect();
            assert_eq!(
                sources,
                vec![(0, vec!["kvm-fd", "name"]), (1, vec!["kvm-fd", "name"])]
            );
        }
    }
}
