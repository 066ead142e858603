//! Real VMMs for the VM view: QEMU (KVM or TCG, with or without `debug-threads`, its guest
//! paused, halted or busy) and cloud-hypervisor. Each lives in its own temporary directory
//! and is killed when dropped, whatever the test's outcome; each knows its vCPU threads from the
//! VMM itself (QEMU's QMP `query-cpus-fast`, cloud-hypervisor's thread names), the ground
//! truth the view is compared against.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{eventually, workspace};

/// What the guest does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guest {
    /// Started paused (`-S`): the vCPU threads exist, but have never entered `KVM_RUN`.
    Paused,
    /// A firmware that halts at once: every vCPU waits in `KVM_RUN`.
    Halted,
    /// A firmware whose first instruction jumps to itself: vCPU 0 executes guest code without
    /// a break (it keeps one host CPU busy while it lives), the others wait for their start-up
    /// IPI in `KVM_RUN`.
    Busy,
}

/// How to start QEMU.
#[derive(Debug, Clone, Copy)]
pub struct QemuOpts {
    /// `-accel kvm` (else TCG).
    pub kvm: bool,
    /// `-name …,debug-threads=on`: vCPU threads named `CPU <n>/KVM` or `CPU <n>/TCG`.
    pub debug_threads: bool,
    /// What the guest does.
    pub guest: Guest,
    /// Start it as the child of a shell, as runtime-rs starts its VMM as a child of its shim.
    pub under_parent: bool,
}

/// A real QEMU with two vCPUs and guest memory bound to host node 0.
#[derive(Debug)]
pub struct Qemu {
    child: Child,
    pid: u32,
    dir: tempfile::TempDir,
}

/// Whether /dev/kvm can be opened (KVM usable by this process).
fn kvm_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .is_ok()
}

/// The `syscall` line of a thread.
fn syscall(pid: u32, tid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).unwrap_or_default()
}

fn in_kvm_run(pid: u32, tid: u32) -> bool {
    syscall(pid, tid).split(' ').nth(2) == Some("0xae80")
}

fn taskset(tid: u32, cpus: &str) {
    let ok = Command::new("taskset")
        .args(["-p", "-c", cpus, &tid.to_string()])
        .stdout(Stdio::null())
        .status()
        .expect("taskset");
    assert!(ok.success(), "taskset -p -c {cpus} {tid}");
}

/// A 64 KiB firmware image whose reset vector (the last 16 bytes) holds `code`.
fn firmware(path: &Path, code: &[u8]) {
    let mut image = vec![0xf4u8; 64 * 1024]; // hlt
    image[0xfff0..0xfff0 + code.len()].copy_from_slice(code);
    std::fs::write(path, image).expect("firmware");
}

impl Qemu {
    /// Starts it and waits until its vCPUs are where `opts.guest` says.
    pub fn start(opts: QemuOpts) -> Self {
        assert!(
            Command::new("sh")
                .args(["-c", "command -v qemu-system-x86_64"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86; make test does)"
        );
        assert!(
            !opts.kvm || kvm_usable(),
            "/dev/kvm cannot be opened: this test runs QEMU under KVM (a paused or halted guest \
             is enough, no nested guest boots); run it as root on a host with KVM"
        );
        let dir = tempfile::Builder::new()
            .prefix("kata-topo-qemu.")
            .tempdir()
            .expect("tempdir");
        let mut args: Vec<String> = Vec::new();
        let mut arg = |a: &str| args.push(a.to_string());
        if opts.debug_threads {
            arg("-name");
            arg("kata-topo-test,debug-threads=on");
        }
        arg("-machine");
        arg(if opts.kvm {
            "q35,accel=kvm"
        } else {
            "q35,accel=tcg"
        });
        for a in [
            "-smp",
            "2",
            "-m",
            "64",
            "-object",
            "memory-backend-ram,id=mem0,size=64M,host-nodes=0,policy=bind",
            "-numa",
            "node,nodeid=0,memdev=mem0",
            "-display",
            "none",
            "-nodefaults",
            "-no-user-config",
            "-serial",
            "none",
        ] {
            arg(a);
        }
        let qmp = dir.path().join("qmp.sock");
        arg("-qmp");
        arg(&format!("unix:{},server=on,wait=off", qmp.display()));
        match opts.guest {
            Guest::Paused => arg("-S"),
            Guest::Halted | Guest::Busy => {
                let bios = dir.path().join("firmware.bin");
                let code: &[u8] = if opts.guest == Guest::Halted {
                    &[0xfa, 0xf4, 0xeb, 0xfd] // cli; hlt; jmp back to hlt
                } else {
                    &[0xeb, 0xfe] // jmp to itself
                };
                firmware(&bios, code);
                arg("-bios");
                arg(&bios.display().to_string());
            }
        }
        let log = std::fs::File::create(dir.path().join("qemu.log")).expect("log");
        let mut cmd = if opts.under_parent {
            // `; true` keeps the shell as QEMU's parent instead of exec'ing it.
            let mut c = Command::new("sh");
            c.arg("-c")
                .arg("qemu-system-x86_64 \"$@\"; true")
                .arg("sh")
                .args(&args);
            c
        } else {
            let mut c = Command::new("qemu-system-x86_64");
            c.args(&args);
            c
        };
        // Its own process group: Drop kills QEMU and its parent shell together.
        let child = cmd
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start qemu");
        let mut q = Self {
            pid: child.id(),
            child,
            dir,
        };
        if opts.under_parent {
            let parent = q.child.id();
            assert!(
                eventually(Duration::from_secs(20), || {
                    std::fs::read_to_string(format!("/proc/{parent}/task/{parent}/children"))
                        .ok()
                        .and_then(|c| c.split_whitespace().next()?.parse().ok())
                        .map(|pid| q.pid = pid)
                        .is_some()
                }),
                "the shell {parent} did not start QEMU"
            );
        }
        let pid = q.pid;
        assert!(
            eventually(Duration::from_secs(20), || q.vcpu_tids().len() == 2),
            "qemu {pid} did not start two vCPUs: {}",
            q.log()
        );
        let tids: Vec<u32> = q.vcpu_tids().into_iter().map(|(_, t)| t).collect();
        let ready = || match opts.guest {
            Guest::Paused => true,
            Guest::Halted => tids.iter().all(|t| in_kvm_run(pid, *t)) || !opts.kvm,
            Guest::Busy => {
                syscall(pid, tids[0]).starts_with("running")
                    && (tids[1..].iter().all(|t| in_kvm_run(pid, *t)) || !opts.kvm)
            }
        };
        assert!(
            eventually(Duration::from_secs(20), ready),
            "qemu {pid}: the vCPUs did not reach {:?}: {}",
            opts.guest,
            q.log()
        );
        q
    }

    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pid of its parent shell, when started under one.
    pub fn parent(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("qemu.log")).unwrap_or_default()
    }

    /// (vCPU index, thread id) of each vCPU, from QEMU's own `query-cpus-fast`.
    pub fn vcpu_tids(&self) -> Vec<(u32, u32)> {
        let Ok(reply) = qmp(&self.dir.path().join("qmp.sock"), "query-cpus-fast") else {
            return Vec::new();
        };
        let mut found: Vec<(u32, u32)> = reply
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                Some((
                    u32::try_from(c["cpu-index"].as_u64()?).ok()?,
                    u32::try_from(c["thread-id"].as_u64()?).ok()?,
                ))
            })
            .collect();
        found.sort_unstable();
        found
    }

    /// Pins vCPU `index` to host CPUs `cpus` (sched_setaffinity through taskset).
    pub fn pin(&self, index: u32, cpus: &str) {
        let tid = self
            .vcpu_tids()
            .into_iter()
            .find(|(i, _)| *i == index)
            .map(|(_, t)| t)
            .expect("vCPU thread");
        taskset(tid, cpus);
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .stderr(Stdio::null())
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One QMP command on a fresh connection: its `return` value.
fn qmp(socket: &Path, command: &str) -> std::io::Result<Value> {
    let stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let reply = |reader: &mut BufReader<UnixStream>| -> std::io::Result<Value> {
        let mut line = String::new();
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let v: Value = serde_json::from_str(&line).map_err(std::io::Error::other)?;
            if let Some(r) = v.get("return") {
                return Ok(r.clone());
            }
            if let Some(e) = v.get("error") {
                return Err(std::io::Error::other(e.to_string()));
            }
            // The greeting and events.
        }
    };
    writer.write_all(b"{\"execute\":\"qmp_capabilities\"}\n")?;
    reply(&mut reader)?;
    writer.write_all(format!("{{\"execute\":\"{command}\"}}\n").as_bytes())?;
    reply(&mut reader)
}

/// A real cloud-hypervisor (the binary named by `KT_CLOUD_HYPERVISOR`) booting the guest
/// kernel `KT_VMLINUX` (default `target/kata-topo-vmm/vmlinux`, written by `make vmlinux`)
/// with two vCPUs, two memory zones bound to host node 0 and two guest NUMA nodes.
#[derive(Debug)]
pub struct CloudHypervisor {
    child: Child,
    dir: tempfile::TempDir,
}

impl CloudHypervisor {
    /// The binary, or a failure saying how to provide it.
    pub fn binary() -> PathBuf {
        let path = std::env::var_os("KT_CLOUD_HYPERVISOR").map(PathBuf::from);
        let Some(path) = path.filter(|p| p.is_file()) else {
            panic!(
                "no cloud-hypervisor binary: set KT_CLOUD_HYPERVISOR to one (v51.0, the version \
                 Kata 4.1 pins; got {:?}). `make integration` sets it to \
                 ../shared/vmm/cloud-hypervisor-v51.0 next to the repository when that exists",
                std::env::var_os("KT_CLOUD_HYPERVISOR")
            )
        };
        path
    }

    /// The guest kernel, or a failure saying how to make it.
    pub fn kernel() -> PathBuf {
        let path = std::env::var_os("KT_VMLINUX")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace().join("target/kata-topo-vmm/vmlinux"));
        assert!(
            path.is_file(),
            "no guest kernel at {}: run `make vmlinux` (extracts the ELF vmlinux from Debian's \
             linux-image-6.1 package) or set KT_VMLINUX",
            path.display()
        );
        path
    }

    /// Starts it and waits until both vCPU threads exist and vCPU 1 waits in `KVM_RUN`.
    pub fn start() -> Self {
        let binary = Self::binary();
        let kernel = Self::kernel();
        assert!(
            kvm_usable(),
            "/dev/kvm cannot be opened: cloud-hypervisor needs KVM"
        );
        let dir = tempfile::Builder::new()
            .prefix("kata-topo-ch.")
            .tempdir()
            .expect("tempdir");
        let log = std::fs::File::create(dir.path().join("ch.log")).expect("log");
        let child = Command::new(&binary)
            .arg("--kernel")
            .arg(&kernel)
            .args(["--cpus", "boot=2", "--memory", "size=0", "--memory-zone"])
            .args([
                "id=mem0,size=128M,host_numa_node=0",
                "id=mem1,size=128M,host_numa_node=0",
            ])
            .args([
                "--numa",
                "guest_numa_id=0,cpus=[0],memory_zones=mem0",
                "guest_numa_id=1,cpus=[1],memory_zones=mem1",
            ])
            .args(["--console", "off", "--serial", "null"])
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", binary.display()));
        let ch = Self { child, dir };
        let pid = ch.pid();
        assert!(
            eventually(Duration::from_secs(30), || {
                let t = ch.vcpu_tids();
                t.len() == 2 && t.iter().any(|(_, tid)| in_kvm_run(pid, *tid))
            }),
            "cloud-hypervisor {pid} did not start two vCPUs: {}",
            std::fs::read_to_string(ch.dir.path().join("ch.log")).unwrap_or_default()
        );
        ch
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// (vCPU index, thread id), from cloud-hypervisor's own thread names (`vcpu<n>`).
    pub fn vcpu_tids(&self) -> Vec<(u32, u32)> {
        let mut found = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .into_iter()
            .flatten()
            .flatten()
        {
            let tid: u32 = t.file_name().to_string_lossy().parse().unwrap_or(0);
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if let Some(n) = comm.trim_end().strip_prefix("vcpu") {
                if let Ok(n) = n.parse() {
                    found.push((n, tid));
                }
            }
        }
        found.sort_unstable();
        found
    }

    /// Pins vCPU `index` to host CPUs `cpus`.
    pub fn pin(&self, index: u32, cpus: &str) {
        let tid = self
            .vcpu_tids()
            .into_iter()
            .find(|(i, _)| *i == index)
            .map(|(_, t)| t)
            .expect("vCPU thread");
        taskset(tid, cpus);
    }
}

impl Drop for CloudHypervisor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
