//! The VM view and the VM rules against a real QEMU: started paused (`-S`, no guest needed)
//! with named vCPU threads and guest memory bound to host node 0, its vCPU threads re-pinned
//! with `taskset`, then read back through `kata-topo vm` and `kata-topo check --vm-pid` on the
//! simulated two-node host whose nodes are this machine's CPUs 0 and 1.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kata_topo_integration::{bin_dir, eventually, workspace};
use serde_json::{json, Value};

struct Qemu {
    child: Child,
}

impl Qemu {
    fn start() -> Self {
        assert!(
            Command::new("sh")
                .args(["-c", "command -v qemu-system-x86_64"])
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "qemu-system-x86_64 is not installed (apt-get install qemu-system-x86; make test does)"
        );
        let kvm = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
            .is_ok();
        let child = Command::new("qemu-system-x86_64")
            .args(["-S", "-name", "kata-topo-test,debug-threads=on"])
            .args([
                "-machine",
                if kvm {
                    "q35,accel=kvm"
                } else {
                    "q35,accel=tcg"
                },
            ])
            .args(["-smp", "2", "-m", "64"])
            .args([
                "-object",
                "memory-backend-ram,id=mem0,size=64M,host-nodes=0,policy=bind",
            ])
            .args(["-numa", "node,nodeid=0,memdev=mem0"])
            .args([
                "-display",
                "none",
                "-nodefaults",
                "-no-user-config",
                "-serial",
                "none",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start qemu");
        let q = Self { child };
        let pid = q.pid();
        assert!(
            eventually(Duration::from_secs(20), || q.vcpu_tids().len() == 2),
            "qemu {pid} did not start two named vCPU threads"
        );
        q
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn vcpu_tids(&self) -> Vec<(u32, u32)> {
        let mut found = Vec::new();
        for t in std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .into_iter()
            .flatten()
            .flatten()
        {
            let tid: u32 = t.file_name().to_string_lossy().parse().unwrap_or(0);
            let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            if let Some(rest) = comm.trim().strip_prefix("CPU ") {
                if let Some((n, _)) = rest.split_once('/') {
                    found.push((n.parse().unwrap_or(0), tid));
                }
            }
        }
        found.sort();
        found
    }

    /// Pins vCPU `index` to host CPUs `cpus` (sched_setaffinity through taskset).
    fn pin(&self, index: u32, cpus: &str) {
        let tid = self
            .vcpu_tids()
            .into_iter()
            .find(|(i, _)| *i == index)
            .map(|(_, t)| t)
            .expect("vCPU thread");
        let ok = Command::new("taskset")
            .args(["-p", "-c", cpus, &tid.to_string()])
            .stdout(Stdio::null())
            .status()
            .expect("taskset");
        assert!(ok.success());
    }
}

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn kata_topo(args: &[&str]) -> (i32, Value, String) {
    let out = Command::new(bin_dir().join("kata-topo"))
        .args(args)
        .output()
        .expect("kata-topo");
    let json = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (
        out.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn spec(dir: &Path, nodes: &str) -> String {
    let path = dir.join("config.json");
    std::fs::write(
        &path,
        json!({
            "ociVersion": "1.0.2",
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-id": "sb", "io.kubernetes.cri.container-name": "app",
                "kata-topo.io/numa-nodes": nodes
            },
            "linux": {"resources": {"cpu": {"cpus": "0-1"}}}
        })
        .to_string(),
    )
    .expect("spec");
    path.to_string_lossy().into_owned()
}

fn vm_rules(spec: &str, pid: u32) -> Vec<String> {
    let xml = workspace().join("scenario/two-node-host.xml");
    let (code, v, text) = kata_topo(&[
        "check",
        "--spec",
        spec,
        "--topology",
        xml.to_str().expect("path"),
        "--vm-pid",
        &pid.to_string(),
        "--json",
    ]);
    assert!(code == 0 || code == 1, "{text}");
    let mut rules: Vec<String> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["rule"].as_str().expect("rule").to_string())
        .collect();
    rules.sort();
    rules
}

#[test]
fn vm_view_of_a_real_qemu() {
    let q = Qemu::start();
    let (code, v, text) = kata_topo(&["vm", "--pid", &q.pid().to_string(), "--json"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(v["vcpu_threads_named"], true);
    assert_eq!(v["vcpus"].as_array().expect("vcpus").len(), 2);
    assert_eq!(v["vcpus"][1]["index"], 1);
    assert_eq!(v["guest_nodes"][0]["host_nodes"], "0");
    assert_eq!(v["guest_nodes"][0]["policy"], "bind");
    assert!(
        v["memory_policies"]
            .as_object()
            .expect("policies")
            .contains_key("bind:0"),
        "guest RAM is bound to node 0: {v}"
    );
    let (_, _, human) = kata_topo(&["vm", "--pid", &q.pid().to_string()]);
    assert!(
        human.contains("vCPU 0") && human.contains("bind:0"),
        "{human}"
    );
}

#[test]
fn vcpu_rules_against_a_real_qemu() {
    let q = Qemu::start();
    let dir = tempfile::tempdir().expect("tempdir");
    // Clean: each vCPU on its own CPU, both nodes allowed.
    q.pin(0, "0");
    q.pin(1, "1");
    assert_eq!(
        vm_rules(&spec(dir.path(), "0-1"), q.pid()),
        Vec::<String>::new()
    );
    // Drift: only node 0 (CPU 0) allowed, vCPU 1 runs on CPU 1 (node 1).
    assert_eq!(
        vm_rules(&spec(dir.path(), "0"), q.pid()),
        vec!["cpu-outside-intent", "vcpu-affinity-drift"]
    );
    // Overlap: both vCPUs pinned to CPU 0 (Kata issue #13539).
    q.pin(1, "0");
    assert_eq!(
        vm_rules(&spec(dir.path(), "0-1"), q.pid()),
        vec!["vcpu-overlap"]
    );
}

#[test]
fn a_process_without_named_vcpus_is_not_a_vmm() {
    let (code, v, text) = kata_topo(&["vm", "--pid", &std::process::id().to_string(), "--json"]);
    assert_eq!(code, 0, "{text}");
    assert_eq!(v["vcpu_threads_named"], false);
    let (code, _, text) = kata_topo(&["vm", "--pid", "999999999"]);
    assert_eq!(code, 2);
    assert!(text.contains("999999999"), "{text}");
}
