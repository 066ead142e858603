//! `kata-topo vm` end to end on the /proc trees of `core/tests/fixtures/vmm/` (QEMU and
//! cloud-hypervisor recorded from real processes; firecracker and dragonball written from their
//! layout): per vCPU, the thread and how it was identified; a process that is not a VMM; JSON.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn tree(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/vmm")
        .join(name)
}

/// The one pid of a tree.
fn pid(name: &str) -> String {
    std::fs::read_dir(tree(name).join("proc"))
        .expect("fixture")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a pid")
}

fn vm(name: &str, extra: &[&str]) -> Output {
    let procfs = tree(name).join("proc");
    Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["vm", "--pid", &pid(name), "--procfs"])
        .arg(&procfs)
        .args(extra)
        .output()
        .expect("run kata-topo")
}

fn text(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `vCPU n   tid t   host CPUs c   sources` lines.
fn vcpu_lines(out: &str) -> Vec<(String, String)> {
    out.lines()
        .filter(|l| l.trim_start().starts_with("vCPU ") && l.contains(" tid "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (words[1].to_string(), words[7..].join(" "))
        })
        .collect()
}

#[test]
fn each_vcpu_says_how_it_was_identified() {
    let out = text(&vm("qemu-kvm", &[]));
    assert!(
        out.starts_with("VMM pid 17832 (qemu-system-x86): QEMU, KVM\n"),
        "{out}"
    );
    assert!(
        out.contains("vCPUs: 2, 2 tied to a thread (KVM vCPU fds 0-1;"),
        "{out}"
    );
    assert_eq!(
        vcpu_lines(&out),
        vec![
            ("0".to_string(), "elimination".to_string()),
            ("1".to_string(), "kvm-fd".to_string())
        ]
    );
    assert!(
        out.contains("guest node 0: vCPUs - memory mem0 host nodes 0 policy bind"),
        "{out}"
    );

    let debugfs = tree("cloud-hypervisor").join("debugfs/kvm");
    let out = text(&vm(
        "cloud-hypervisor",
        &["--kvm-debugfs", debugfs.to_str().expect("path")],
    ));
    assert!(out.contains(": cloud-hypervisor, KVM\n"), "{out}");
    assert_eq!(
        vcpu_lines(&out),
        vec![
            ("0".to_string(), "kvm-debugfs, name".to_string()),
            ("1".to_string(), "kvm-debugfs, kvm-fd, name".to_string())
        ]
    );
    assert!(
        out.contains("guest node 1: vCPUs 1 memory mem1 host nodes 0 policy bind"),
        "{out}"
    );

    let out = text(&vm("firecracker", &[]));
    assert!(out.contains(": firecracker, KVM\n"), "{out}");
    assert_eq!(
        vcpu_lines(&out),
        vec![
            ("0".to_string(), "kvm-fd, name".to_string()),
            ("1".to_string(), "elimination, name".to_string())
        ]
    );
    let out = text(&vm("dragonball", &[]));
    assert!(
        out.contains("(containerd-shim): dragonball, KVM\n"),
        "{out}"
    );
    assert_eq!(vcpu_lines(&out).len(), 2);
}

#[test]
fn json_lists_sources_per_vcpu() {
    let out = vm("firecracker", &["--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["vmm"], "firecracker");
    assert_eq!(v["accel"], "kvm");
    assert_eq!(v["kvm_vcpus"], "0-1");
    assert_eq!(v["vcpus"][0]["tid"], 7102);
    assert_eq!(
        v["vcpus"][0]["sources"],
        serde_json::json!(["kvm-fd", "name"])
    );
    assert_eq!(
        v["vcpus"][1]["sources"],
        serde_json::json!(["elimination", "name"])
    );
    assert_eq!(v["unresolved"], serde_json::json!([]));
    assert_eq!(v["sampling"]["samples"], 5);
}

#[test]
fn a_process_that_is_not_a_vmm_says_so() {
    // A process of its own: the test process has the other tests' children (the impostor
    // VMM among them), and `vm` looks at a process's children too.
    let mut plain = Command::new("sleep").arg("30").spawn().expect("sleep");
    let out = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["vm", "--pid", &plain.id().to_string()])
        .output()
        .expect("run");
    let _ = plain.kill();
    let _ = plain.wait();
    let out = text(&out);
    assert!(
        out.contains("is not a VMM: it holds no KVM vCPU fd and is not QEMU under TCG"),
        "{out}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["vm", "--pid", "999999999"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("999999999"));
}

/// A real impostor: a copy of a shell named `qemu-system-x86_64` that names its thread
/// `CPU 0/TCG` — QEMU under TCG by its executable's name and its thread's — run as `nobody`
/// with `setpriv`. It is not taken for a VMM, and the output names the owner check; run as
/// root it still fails the executable check when the hypervisor's path is given. Needs root.
#[test]
fn an_impostor_qemu_is_rejected_naming_the_check() {
    assert!(
        is_root(),
        "this test needs root (to run a process as nobody)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let copy = dir.path().join("qemu-system-x86_64");
    std::fs::copy("/bin/bash", &copy).expect("copy bash");
    let script = "printf 'CPU 0/TCG' > /proc/$$/comm; sleep 60 & wait";
    let spawn = |as_nobody: bool| {
        let mut cmd = if as_nobody {
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&copy);
            c
        } else {
            Command::new(&copy)
        };
        let child = cmd.args(["-c", script]).spawn().expect("run the impostor");
        Reaper(child)
    };
    let look = |pid: u32, extra: &[&str]| -> Value {
        // Its thread renames itself once it runs.
        for _ in 0..100 {
            if std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "CPU 0/TCG")
            {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let out = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
            .args(["vm", "--json", "--pid", &pid.to_string()])
            .args(extra)
            .output()
            .expect("run kata-topo");
        serde_json::from_str(&text(&out)).expect("JSON")
    };

    let nobody = spawn(true);
    let v = look(nobody.0.id(), &[]);
    assert_eq!(v["accel"], Value::Null, "{v:#}");
    assert_eq!(v["rejected"]["check"], "owner", "{v:#}");
    assert!(
        v["rejected"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("uid 65534")),
        "{v:#}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["vm", "--pid", &nobody.0.id().to_string()])
        .output()
        .expect("run kata-topo");
    assert!(
        text(&out).contains("is not the sandbox's: the owner check failed"),
        "{}",
        text(&out)
    );

    let root = spawn(false);
    let v = look(root.0.id(), &[]);
    assert_eq!(
        v["accel"], "tcg",
        "nothing configured to tell it apart: {v:#}"
    );
    let v = look(
        root.0.id(),
        &["--hypervisor", "/usr/bin/qemu-system-x86_64"],
    );
    assert_eq!(v["rejected"]["check"], "executable", "{v:#}");
    let v = look(root.0.id(), &["--sandbox", "4f1c0e5a9b7d"]);
    assert_eq!(v["rejected"]["check"], "sandbox", "{v:#}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|u| u.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

/// Kills its process when dropped.
struct Reaper(std::process::Child);

impl Drop for Reaper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
