//! The VM view and the VM rules against a real QEMU: started paused (`-S`, no guest needed)
//! with named vCPU threads and guest memory bound to host node 0, its vCPU threads re-pinned
//! with `taskset`, then read back through `kata-topo vm` and `kata-topo check --vm-pid` on the
//! simulated two-node host whose nodes are this machine's CPUs 0 and 1.

use std::path::Path;
use std::process::Command;

use kata_topo_integration::{bin_dir, workspace, Qemu};
use serde_json::{json, Value};

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
