//! One process under a procfs root, read the way the VM view needs it: its threads (name,
//! kernel-worker flag), its KVM file descriptors, and the per-thread files sampled later.
//!
//! Everything here is untrusted text: a process names its own threads (a container can write
//! anything, up to 15 bytes, into them) and a recorded tree can hold anything at all. Every
//! read is bounded, no symbolic link is followed (`fd/*` and `exe` are read as links, never
//! opened), and every parser returns `None` rather than guessing.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use crate::files::read_bounded_nofollow;
use crate::idset::{IdSet, MAX_ID};

use super::VmError;

/// Small per-process and per-thread files: `comm`, `stat`, `status`, `syscall`, `children`.
pub(crate) const MAX_SMALL: u64 = 64 * 1024;
/// `cmdline` (the kernel caps arguments at a few MiB).
pub(crate) const MAX_CMDLINE: u64 = 4 * 1024 * 1024;
/// `numa_maps` of a large VMM (one line per mapping).
pub(crate) const MAX_NUMA_MAPS: u64 = 16 * 1024 * 1024;
/// Threads of one process read at most (KVM allows 4096 vCPUs; I/O threads come on top).
pub(crate) const MAX_TASKS: usize = 16 * 1024;
/// Open files of one process read at most.
pub(crate) const MAX_FDS: usize = 64 * 1024;
/// Children of one process considered at most.
pub(crate) const MAX_CHILDREN: usize = 1024;

/// `ioctl`'s system call number as `/proc/<pid>/task/<tid>/syscall` prints it.
#[cfg(target_arch = "x86_64")]
const SYS_IOCTL: &str = "16";
#[cfg(any(target_arch = "aarch64", target_arch = "riscv64"))]
const SYS_IOCTL: &str = "29";
#[cfg(any(target_arch = "s390x", target_arch = "powerpc64"))]
const SYS_IOCTL: &str = "54";
#[cfg(not(any(
    target_arch = "x86_64",
    target_arch = "aarch64",
    target_arch = "riscv64",
    target_arch = "s390x",
    target_arch = "powerpc64"
)))]
const SYS_IOCTL: &str = "";

/// `KVM_RUN` = `_IO(0xAE, 0x80)`, the same on every architecture.
const KVM_RUN: &str = "0xae80";

/// Task flags (`/proc/<pid>/task/<tid>/stat`, field 9) of threads the kernel runs inside a
/// process: io_uring workers (`PF_IO_WORKER`), vhost-style user workers such as KVM's
/// `kvm-nx-lpage-recovery` (`PF_USER_WORKER`), kernel threads (`PF_KTHREAD`). A user worker
/// inherits the registers of the thread it was cloned from, so KVM's shows the `KVM_RUN` of
/// the vCPU that started it: it must never count as a vCPU.
const KERNEL_WORKER_FLAGS: u64 = 0x0000_0010 | 0x0000_4000 | 0x0020_0000;

/// A decimal id as the kernel prints it: ASCII digits, no sign, no leading zero, at most `max`.
pub(crate) fn decimal(s: &str, max: u32) -> Option<u32> {
    let canonical = !s.is_empty()
        && s.len() <= 10
        && s.bytes().all(|b| b.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'));
    canonical
        .then(|| s.parse::<u64>().ok())
        .flatten()
        .filter(|n| *n <= u64::from(max))
        .and_then(|n| u32::try_from(n).ok())
}

/// What a thread was doing when its `syscall` file was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Syscall {
    /// Runnable: on a CPU or waiting for one (a vCPU executing guest code looks like this).
    Running,
    /// Blocked in `ioctl(fd, KVM_RUN)`.
    KvmRun {
        /// The file descriptor.
        fd: u32,
    },
    /// Blocked in anything else.
    Other,
}

/// Parses `/proc/<pid>/task/<tid>/syscall`: `running`, `-1 <sp> <pc>` (blocked outside a
/// system call), or `<nr> <arg1> … <arg6> <sp> <pc>` with the arguments in hex.
pub(crate) fn parse_syscall(text: &str) -> Option<Syscall> {
    let text = text.strip_suffix('\n').unwrap_or(text);
    if text == "running" {
        return Some(Syscall::Running);
    }
    let mut fields = text.split(' ');
    let nr = fields.next()?;
    if nr.is_empty() {
        return None;
    }
    if nr != SYS_IOCTL {
        return Some(Syscall::Other);
    }
    let (Some(fd), Some(cmd)) = (fields.next(), fields.next()) else {
        return Some(Syscall::Other);
    };
    if cmd != KVM_RUN {
        return Some(Syscall::Other);
    }
    let hex = fd.strip_prefix("0x")?;
    let ok = !hex.is_empty() && hex.len() <= 8 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ok.then(|| u32::from_str_radix(hex, 16).ok())
        .flatten()
        .map(|fd| Syscall::KvmRun { fd })
}

/// Task flags from `/proc/<pid>/task/<tid>/stat`. The command name in parentheses may hold
/// spaces and parentheses itself, so the fields are counted after the last `)`.
pub(crate) fn parse_stat_flags(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    // state ppid pgrp session tty_nr tpgid flags
    rest.split_ascii_whitespace().nth(6)?.parse().ok()
}

/// `Cpus_allowed_list` from a `status` file.
pub(crate) fn parse_allowed_cpus(status: &str) -> Option<IdSet> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .and_then(|v| IdSet::parse(v.trim()).ok())
}

/// The vCPU id of a `/proc/<pid>/fd/<fd>` link text `anon_inode:kvm-vcpu:<id>`.
pub(crate) fn kvm_vcpu_link(link: &OsStr) -> Option<u32> {
    let id = link.as_bytes().strip_prefix(b"anon_inode:kvm-vcpu:")?;
    decimal(std::str::from_utf8(id).ok()?, MAX_ID)
}

/// A thread's name from its `comm` file: the text without the kernel's trailing newline.
fn parse_comm(bytes: &[u8]) -> String {
    let bytes = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

/// One thread of the process.
#[derive(Debug, Clone)]
pub(crate) struct Task {
    /// Thread id.
    pub(crate) tid: u32,
    /// Its name (`comm`).
    pub(crate) name: String,
    /// A thread the kernel runs inside the process (an io_uring or vhost-style worker).
    pub(crate) kernel_worker: bool,
}

/// What the VM view needs of one process, read once.
#[derive(Debug, Clone)]
pub(crate) struct Process {
    /// The process's directory under the procfs root.
    pub(crate) dir: PathBuf,
    pub(crate) pid: u32,
    /// Its command name.
    pub(crate) comm: String,
    /// The text of its `exe` link, without the kernel's ` (deleted)` mark.
    pub(crate) exe: Option<String>,
    /// KVM vCPU file descriptors: fd → vCPU id.
    pub(crate) vcpu_fds: BTreeMap<u32, u32>,
    /// KVM VM file descriptors (`anon_inode:kvm-vm`).
    pub(crate) vm_fds: Vec<u32>,
    /// Its threads, by tid.
    pub(crate) tasks: Vec<Task>,
}

fn read_error(path: &Path, source: io::Error) -> VmError {
    VmError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a small text file (lossy UTF-8), never following a link.
pub(crate) fn read_small(path: &Path) -> io::Result<String> {
    read_bounded_nofollow(path, MAX_SMALL).map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Lists the numeric entries of a directory, at most `limit` of them.
fn numeric_entries(dir: &Path, limit: usize, what: &'static str) -> Result<Vec<u32>, VmError> {
    let entries = std::fs::read_dir(dir).map_err(|e| read_error(dir, e))?;
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| read_error(dir, e))?;
        let Some(n) = entry
            .file_name()
            .to_str()
            .and_then(|s| decimal(s, u32::MAX))
        else {
            continue;
        };
        if out.len() == limit {
            return Err(VmError::TooMany {
                what,
                path: dir.to_path_buf(),
                limit,
            });
        }
        out.push(n);
    }
    out.sort_unstable();
    Ok(out)
}

/// `Tgid` from a `status` file: the process a thread belongs to.
pub(crate) fn parse_tgid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| decimal(v.trim(), u32::MAX))
}

/// The effective uid and the parent of the process whose procfs directory is `dir`.
pub(crate) fn status_owner_and_parent(dir: &Path) -> (Option<u32>, Option<u32>) {
    let Ok(status) = read_small(&dir.join("status")) else {
        return (None, None);
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let uid = field("Uid")
        .and_then(|v| v.split_whitespace().nth(1))
        .and_then(|u| decimal(u, u32::MAX));
    let ppid = field("PPid").and_then(|p| decimal(p, u32::MAX));
    (uid, ppid)
}

impl Process {
    /// Reads process `pid` under `procfs`; a thread id reads the process it belongs to
    /// (runtime-rs reports dragonball's VMM thread). A missing process is
    /// [`VmError::NoProcess`]; a process whose threads or file descriptors cannot be listed
    /// (another user's process read without privileges) is [`VmError::Read`].
    pub(crate) fn read(procfs: &Path, pid: u32) -> Result<Self, VmError> {
        let dir = procfs.join(pid.to_string());
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(VmError::NoProcess {
                pid,
                root: procfs.to_path_buf(),
            });
        }
        let tgid = read_small(&dir.join("status"))
            .ok()
            .and_then(|s| parse_tgid(&s))
            .filter(|t| *t != 0 && *t != pid);
        match tgid {
            Some(tgid) => Self::read_group(procfs, tgid),
            None => Self::read_group(procfs, pid),
        }
    }

    fn read_group(procfs: &Path, pid: u32) -> Result<Self, VmError> {
        let dir = procfs.join(pid.to_string());
        if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
            return Err(VmError::NoProcess {
                pid,
                root: procfs.to_path_buf(),
            });
        }
        let comm_path = dir.join("comm");
        let comm = read_bounded_nofollow(&comm_path, MAX_SMALL)
            .map(|b| parse_comm(&b))
            .map_err(|e| read_error(&comm_path, e))?;
        let exe = std::fs::read_link(dir.join("exe")).ok().map(|p| {
            let text = p.to_string_lossy().into_owned();
            match text.strip_suffix(" (deleted)") {
                Some(t) => t.to_string(),
                None => text,
            }
        });
        let fd_dir = dir.join("fd");
        let mut vcpu_fds = BTreeMap::new();
        let mut vm_fds = Vec::new();
        for fd in numeric_entries(&fd_dir, MAX_FDS, "open files")? {
            // An fd closed meanwhile has no link any more.
            let Ok(link) = std::fs::read_link(fd_dir.join(fd.to_string())) else {
                continue;
            };
            if let Some(id) = kvm_vcpu_link(link.as_os_str()) {
                vcpu_fds.insert(fd, id);
            } else if link.as_os_str() == "anon_inode:kvm-vm" {
                vm_fds.push(fd);
            }
        }
        let task_dir = dir.join("task");
        let mut tasks = Vec::new();
        for tid in numeric_entries(&task_dir, MAX_TASKS, "threads")? {
            let t = task_dir.join(tid.to_string());
            // A thread may exit while we look: skip it.
            let Ok(name) = read_bounded_nofollow(&t.join("comm"), MAX_SMALL) else {
                continue;
            };
            let Ok(stat) = read_small(&t.join("stat")) else {
                continue;
            };
            let kernel_worker =
                parse_stat_flags(&stat).is_some_and(|f| f & KERNEL_WORKER_FLAGS != 0);
            tasks.push(Task {
                tid,
                name: parse_comm(&name),
                kernel_worker,
            });
        }
        Ok(Self {
            dir,
            pid,
            comm,
            exe,
            vcpu_fds,
            vm_fds,
            tasks,
        })
    }

    /// The KVM vCPU ids the process holds an fd for.
    pub(crate) fn kvm_vcpu_ids(&self) -> IdSet {
        self.vcpu_fds.values().copied().collect()
    }

    /// The directory of thread `tid`.
    pub(crate) fn task_dir(&self, tid: u32) -> PathBuf {
        self.dir.join("task").join(tid.to_string())
    }

    /// What thread `tid` is doing now; `None` when it is gone or its file is unreadable.
    pub(crate) fn syscall(&self, tid: u32) -> Option<Syscall> {
        read_small(&self.task_dir(tid).join("syscall"))
            .ok()
            .and_then(|t| parse_syscall(&t))
    }

    /// The host CPUs thread `tid` may run on.
    pub(crate) fn allowed_cpus(&self, tid: u32) -> Option<IdSet> {
        read_small(&self.task_dir(tid).join("status"))
            .ok()
            .and_then(|s| parse_allowed_cpus(&s))
    }

    /// The process's children: every thread's `children` file (a child belongs to the thread
    /// that forked it; runtime-rs forks its VMM from a Tokio worker thread).
    pub(crate) fn children(&self) -> Vec<u32> {
        let mut out = Vec::new();
        for t in &self.tasks {
            let Ok(text) = read_small(&self.task_dir(t.tid).join("children")) else {
                continue;
            };
            out.extend(
                text.split_ascii_whitespace()
                    .filter_map(|s| decimal(s, u32::MAX)),
            );
            if out.len() >= MAX_CHILDREN {
                out.truncate(MAX_CHILDREN);
                break;
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The command line, one string per argument.
    pub(crate) fn cmdline(&self) -> Result<Vec<String>, VmError> {
        let path = self.dir.join("cmdline");
        let bytes = read_bounded_nofollow(&path, MAX_CMDLINE).map_err(|e| read_error(&path, e))?;
        Ok(bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect())
    }

    /// `numa_maps`, when readable.
    pub(crate) fn numa_maps(&self) -> Option<String> {
        read_bounded_nofollow(&self.dir.join("numa_maps"), MAX_NUMA_MAPS)
            .ok()
            .map(|b| String::from_utf8_lossy(&b).into_owned())
    }

    /// The process's effective user and its parent, from its `status` (`Uid:` real,
    /// effective, saved, file system; `PPid:`); `None` where unreadable.
    pub(crate) fn owner_and_parent(&self) -> (Option<u32>, Option<u32>) {
        status_owner_and_parent(&self.dir)
    }

    /// The process's cgroup paths (`/proc/<pid>/cgroup`: `0::/kubepods.slice/…`), when
    /// readable.
    pub(crate) fn cgroups(&self) -> Option<Vec<String>> {
        read_small(&self.dir.join("cgroup")).ok().map(|t| {
            t.lines()
                .filter_map(|l| l.splitn(3, ':').nth(2))
                .map(str::to_string)
                .collect()
        })
    }

    /// The basename of the executable, else the command name.
    pub(crate) fn program(&self) -> &str {
        self.exe
            .as_deref()
            .and_then(|e| e.rsplit('/').next())
            .filter(|b| !b.is_empty())
            .unwrap_or(&self.comm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_canonical() {
        assert_eq!(decimal("0", 9), Some(0));
        assert_eq!(decimal("17", 99), Some(17));
        for bad in ["", "01", "+1", "-1", " 1", "1 ", "1a", "٣", "99999999999"] {
            assert_eq!(decimal(bad, u32::MAX), None, "{bad:?}");
        }
        assert_eq!(decimal("100", 99), None);
        assert_eq!(decimal("4294967295", u32::MAX), Some(u32::MAX));
        assert_eq!(decimal("4294967296", u32::MAX), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn syscall_lines() {
        assert_eq!(parse_syscall("running\n"), Some(Syscall::Running));
        assert_eq!(
            parse_syscall(
                "16 0xe 0xae80 0x0 0x0 0x5568582d5290 0x0 0x7f7c1b7fd5d8 0x7f7c1f4b2c5b\n"
            ),
            Some(Syscall::KvmRun { fd: 14 })
        );
        // Another ioctl, another call, a thread blocked outside a system call.
        assert_eq!(
            parse_syscall("16 0xe 0xae9f 0x0 0x0 0x0 0x0 0x1 0x2"),
            Some(Syscall::Other)
        );
        assert_eq!(
            parse_syscall("202 0x5568589f77a8 0x0 0xffffffff 0x0 0x0 0x0 0x1 0x2"),
            Some(Syscall::Other)
        );
        assert_eq!(parse_syscall("-1 0x7ffc 0x7f7c"), Some(Syscall::Other));
        for bad in [
            "",
            "\n",
            "16 0x 0xae80",
            "16 14 0xae80",
            "16 0x1ffffffff 0xae80",
            "16 0xzz 0xae80",
        ] {
            assert_eq!(parse_syscall(bad), None, "{bad:?}");
        }
        assert_eq!(parse_syscall("16"), Some(Syscall::Other));
    }

    #[test]
    fn stat_flags_after_the_last_parenthesis() {
        // A thread that named itself with a parenthesis and spaces.
        let stat = "26457 (a) b (c) S 1 26020 21638 0 -1 138428608 0 0 0 0";
        assert_eq!(parse_stat_flags(stat), Some(138_428_608));
        assert_eq!(
            parse_stat_flags(stat).map(|f| f & KERNEL_WORKER_FLAGS != 0),
            Some(true)
        );
        assert_eq!(
            parse_stat_flags("27104 (vmm) S 1 2 3 0 -1 4194624 0").map(|f| f & KERNEL_WORKER_FLAGS),
            Some(0)
        );
        assert_eq!(parse_stat_flags("27104 vmm S 1 2 3 0 -1 4194624"), None);
        assert_eq!(parse_stat_flags("1 (x) S 1"), None);
        assert_eq!(parse_stat_flags("1 (x) S 1 2 3 4 5 -6"), None);
    }

    #[test]
    fn vcpu_links() {
        assert_eq!(kvm_vcpu_link(OsStr::new("anon_inode:kvm-vcpu:3")), Some(3));
        for bad in [
            "anon_inode:kvm-vm",
            "anon_inode:kvm-vcpu:",
            "anon_inode:kvm-vcpu:03",
            "anon_inode:kvm-vcpu-plane1:3",
            "/tmp/anon_inode:kvm-vcpu:3",
            "anon_inode:kvm-vcpu:99999",
        ] {
            assert_eq!(kvm_vcpu_link(OsStr::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn comm_keeps_what_the_thread_wrote() {
        assert_eq!(parse_comm(b"CPU 0/KVM\n"), "CPU 0/KVM");
        assert_eq!(parse_comm(b" CPU 0/KVM \n"), " CPU 0/KVM ");
        assert_eq!(parse_comm(b"\xff\xfe\n"), "\u{fffd}\u{fffd}");
        assert_eq!(parse_comm(b""), "");
    }
}
