//! The VM view and the VM rules against real VMMs: QEMU under KVM without `debug-threads` (its
//! threads all called `qemu-system-x86`), with it, QEMU under TCG, cloud-hypervisor — each
//! checked against the VMM's own account of its vCPU threads (QEMU's `query-cpus-fast`,
//! cloud-hypervisor's thread names), re-pinned with `taskset` and read back through
//! `kata-topo vm` and `kata-topo check --vm-pid` on the simulated two-node host whose nodes are
//! this machine's CPUs 0 and 1. A plain process with vCPU-like thread names is not a VMM; a VMM
//! started as a child (runtime-rs) is found from its parent; the wrapper's own observation runs
//! against QEMU without thread names.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use kata_topo_integration::{bin_dir, workspace, CloudHypervisor, Guest, Qemu, QemuOpts};
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

fn view(pid: u32) -> Value {
    let (code, v, text) = kata_topo(&["vm", "--pid", &pid.to_string(), "--json"]);
    assert_eq!(code, 0, "{text}");
    v
}

/// (vCPU index, thread id) as the view found them.
fn found(v: &Value) -> Vec<(u32, u32)> {
    v["vcpus"]
        .as_array()
        .expect("vcpus")
        .iter()
        .map(|c| {
            (
                c["index"].as_u64().expect("index") as u32,
                c["tid"].as_u64().expect("tid") as u32,
            )
        })
        .collect()
}

fn sources(v: &Value, index: usize) -> Vec<String> {
    v["vcpus"][index]["sources"]
        .as_array()
        .expect("sources")
        .iter()
        .map(|s| s.as_str().expect("source").to_string())
        .collect()
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

/// The findings of `kata-topo check --vm-pid`, sorted by rule.
fn vm_findings(spec: &str, pid: u32) -> Vec<Value> {
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
    let mut findings = v["findings"].as_array().expect("findings").clone();
    findings.sort_by_key(|f| f["rule"].as_str().unwrap_or_default().to_string());
    findings
}

fn rules(findings: &[Value]) -> Vec<&str> {
    findings
        .iter()
        .map(|f| f["rule"].as_str().expect("rule"))
        .collect()
}

/// Clean, drift and overlap on any VMM: `truth` is the VMM's own (index, tid) list, `pin`
/// re-pins one vCPU.
fn repinned(pid: u32, truth: &[(u32, u32)], pin: impl Fn(u32, &str)) {
    let dir = tempfile::tempdir().expect("tempdir");
    // Clean: each vCPU on its own CPU, both nodes allowed.
    pin(0, "0");
    pin(1, "1");
    assert_eq!(
        rules(&vm_findings(&spec(dir.path(), "0-1"), pid)),
        Vec::<&str>::new()
    );
    // Drift: only node 0 (CPU 0) allowed, vCPU 1 runs on CPU 1 (node 1) — and the finding
    // names vCPU 1's real thread.
    let f = vm_findings(&spec(dir.path(), "0"), pid);
    assert_eq!(rules(&f), vec!["cpu-outside-intent", "vcpu-affinity-drift"]);
    let tid1 = truth.iter().find(|(i, _)| *i == 1).expect("vCPU 1").1;
    assert_eq!(
        f[1]["observed"]["vcpus"],
        json!([{"vcpu": 1, "tid": tid1, "allowed_cpus": "1", "numa_nodes": [1]}]),
        "{f:?}"
    );
    // Overlap: both vCPUs pinned to CPU 0 (Kata issue #13539).
    pin(1, "0");
    let f = vm_findings(&spec(dir.path(), "0-1"), pid);
    assert_eq!(rules(&f), vec!["vcpu-overlap"]);
    assert_eq!(
        f[0]["observed"]["shared"],
        json!([{"cpu": 0, "vcpus": [0, 1]}])
    );
}

#[test]
fn qemu_under_kvm_without_debug_names() {
    // The shipped Kata configuration leaves debug off: QEMU runs as here.
    let shipped: toml::Table = std::fs::read_to_string(workspace().join("configuration-kata.toml"))
        .expect("read")
        .parse()
        .expect("TOML");
    assert_eq!(
        shipped["hypervisor"]["qemu"]["enable_debug"].as_bool(),
        Some(false)
    );
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Busy,
        under_parent: false,
    });
    let truth = q.vcpu_tids();
    for (_, tid) in &truth {
        let comm =
            std::fs::read_to_string(format!("/proc/{}/task/{tid}/comm", q.pid())).expect("comm");
        assert_eq!(comm.trim_end(), "qemu-system-x86", "no vCPU names");
    }
    let v = view(q.pid());
    assert_eq!(
        (v["vmm"].as_str(), v["accel"].as_str()),
        (Some("qemu"), Some("kvm"))
    );
    assert_eq!(v["kvm_vcpus"], "0-1");
    assert_eq!(found(&v), truth, "{v:#}");
    // vCPU 0 executes guest code without a break: never in KVM_RUN, found by elimination.
    assert_eq!(sources(&v, 0), vec!["elimination"]);
    assert_eq!(sources(&v, 1), vec!["kvm-fd"]);
    assert_eq!(v["unresolved"], json!([]));
    assert_eq!(v["disagreements"], json!([]));
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
        human.contains(": QEMU, KVM") && human.contains("elimination") && human.contains("kvm-fd"),
        "{human}"
    );
    repinned(q.pid(), &truth, |i, c| q.pin(i, c));
}

#[test]
fn qemu_under_kvm_with_debug_names() {
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: true,
        guest: Guest::Halted,
        under_parent: false,
    });
    let truth = q.vcpu_tids();
    let v = view(q.pid());
    assert_eq!(found(&v), truth, "{v:#}");
    for i in 0..2 {
        assert_eq!(sources(&v, i), vec!["kvm-fd", "name"], "{v:#}");
    }
    assert_eq!(v["disagreements"], json!([]));
    // A thread id reads its process (newer runtime-rs reports the VMM's master thread).
    let by_thread = view(truth[1].1);
    assert_eq!(by_thread["pid"], q.pid());
    assert_eq!(by_thread["found_via"], truth[1].1);
    assert_eq!(found(&by_thread), truth);
    repinned(q.pid(), &truth, |i, c| q.pin(i, c));
}

#[test]
fn qemu_under_tcg_with_debug_names() {
    let q = Qemu::start(QemuOpts {
        kvm: false,
        debug_threads: true,
        guest: Guest::Paused,
        under_parent: false,
    });
    let truth = q.vcpu_tids();
    let v = view(q.pid());
    assert_eq!(
        (v["vmm"].as_str(), v["accel"].as_str()),
        (Some("qemu"), Some("tcg"))
    );
    assert_eq!(v["kvm_vcpus"], "");
    assert_eq!(found(&v), truth, "{v:#}");
    for i in 0..2 {
        assert_eq!(sources(&v, i), vec!["name"]);
    }
    repinned(q.pid(), &truth, |i, c| q.pin(i, c));
}

/// Without KVM and without names nothing tells a vCPU thread from QEMU's others: it is not
/// taken for a VMM, and no vCPU rule runs on a guess.
#[test]
fn qemu_under_tcg_without_names_is_not_taken_for_a_vmm() {
    let q = Qemu::start(QemuOpts {
        kvm: false,
        debug_threads: false,
        guest: Guest::Paused,
        under_parent: false,
    });
    q.pin(0, "0");
    q.pin(1, "0");
    let v = view(q.pid());
    assert_eq!(v["accel"], Value::Null);
    assert_eq!(v["vcpus"], json!([]));
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        rules(&vm_findings(&spec(dir.path(), "0-1"), q.pid())),
        Vec::<&str>::new()
    );
}

/// Paused (`-S`) under KVM: the vCPU fds exist but no thread has entered KVM_RUN; the view
/// says which vCPUs it could not tie and checks nothing it does not know.
#[test]
fn paused_qemu_under_kvm_is_a_vmm_whose_vcpus_are_unresolved() {
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Paused,
        under_parent: false,
    });
    q.pin(0, "0");
    q.pin(1, "0");
    let v = view(q.pid());
    assert_eq!(v["accel"], "kvm");
    assert_eq!(v["vcpus"], json!([]));
    let unresolved = v["unresolved"].as_array().expect("unresolved");
    assert_eq!(unresolved.len(), 2, "{v:#}");
    assert!(
        unresolved[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("never enter KVM_RUN")),
        "{v:#}"
    );
    let (_, _, human) = kata_topo(&["vm", "--pid", &q.pid().to_string()]);
    assert!(human.contains("vCPU 0   unresolved: "), "{human}");
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(
        rules(&vm_findings(&spec(dir.path(), "0-1"), q.pid())),
        Vec::<&str>::new()
    );
}

/// KVM's debugfs names each vCPU's thread, busy or not (mounted in a private mount namespace
/// here, as it is on most hosts).
#[test]
fn kvm_debugfs_ties_a_busy_vcpu() {
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Busy,
        under_parent: false,
    });
    let truth = q.vcpu_tids();
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg("mount -t debugfs none /sys/kernel/debug && exec \"$0\" vm --pid \"$1\" --json")
        .arg(bin_dir().join("kata-topo"))
        .arg(q.pid().to_string())
        .output()
        .expect("unshare");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(found(&v), truth, "{v:#}");
    assert_eq!(sources(&v, 0), vec!["kvm-debugfs"]);
    assert_eq!(sources(&v, 1), vec!["kvm-debugfs", "kvm-fd"]);
}

#[test]
fn cloud_hypervisor() {
    let ch = CloudHypervisor::start();
    let truth = ch.vcpu_tids();
    let v = view(ch.pid());
    assert_eq!(
        (v["vmm"].as_str(), v["accel"].as_str()),
        (Some("cloud-hypervisor"), Some("kvm"))
    );
    assert_eq!(found(&v), truth, "{v:#}");
    let all: Vec<Vec<String>> = (0..2).map(|i| sources(&v, i)).collect();
    assert!(
        all.iter().all(|s| s.contains(&"name".to_string())),
        "{all:?}"
    );
    // A vCPU waiting for its start-up IPI or halted is tied by the kernel too.
    assert!(
        all.iter().any(|s| s.contains(&"kvm-fd".to_string())),
        "{all:?}"
    );
    assert_eq!(v["disagreements"], json!([]));
    // Guest NUMA from --numa and --memory-zone.
    assert_eq!(v["guest_nodes"].as_array().map(Vec::len), Some(2), "{v:#}");
    assert_eq!(v["guest_nodes"][1]["memdev"], "mem1");
    assert_eq!(v["guest_nodes"][1]["cpus"], "1");
    assert_eq!(v["guest_nodes"][1]["host_nodes"], "0");
    assert_eq!(v["guest_nodes"][1]["policy"], "bind");
    repinned(ch.pid(), &truth, |i, c| ch.pin(i, c));
}

/// A plain process running `kata-topo-named-threads` under `name`, its threads named `names`.
struct Named {
    child: Child,
    _dir: tempfile::TempDir,
}

impl Named {
    fn start(name: &str, names: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let exe = dir.path().join(name);
        std::fs::copy(env!("CARGO_BIN_EXE_kata-topo-named-threads"), &exe).expect("copy");
        let mut child = Command::new(&exe)
            .args(names)
            .stdout(Stdio::piped())
            .spawn()
            .expect("start");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("ready");
        assert_eq!(line, "ready\n");
        Self { child, _dir: dir }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Pins every thread to CPU 0: an overlap, were they vCPUs.
    fn pin_all(&self) {
        for t in std::fs::read_dir(format!("/proc/{}/task", self.pid()))
            .expect("tasks")
            .flatten()
        {
            let ok = Command::new("taskset")
                .args(["-p", "-c", "0", &t.file_name().to_string_lossy()])
                .stdout(Stdio::null())
                .status()
                .expect("taskset");
            assert!(ok.success());
        }
    }
}

impl Drop for Named {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn threads_named_like_vcpus_are_not_a_vmm() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Named as every VMM names its vCPUs, and called qemu-system-x86_64: no KVM vCPU fd.
    let p = Named::start(
        "qemu-system-x86_64",
        &["CPU 0/KVM", "CPU 1/KVM", "vcpu0", "fc_vcpu 1", "db_vcpu0"],
    );
    p.pin_all();
    let v = view(p.pid());
    assert_eq!(v["accel"], Value::Null);
    assert_eq!(v["vcpus"], json!([]));
    assert!(
        v["notes"][0]
            .as_str()
            .is_some_and(|n| n.contains("\"CPU 0/KVM\"") && n.contains("not taken for a VMM")),
        "{v:#}"
    );
    assert_eq!(
        rules(&vm_findings(&spec(dir.path(), "0"), p.pid())),
        vec!["cpu-outside-intent"]
    );
    let (_, _, human) = kata_topo(&["vm", "--pid", &p.pid().to_string()]);
    assert!(human.contains("is not a VMM"), "{human}");
    // TCG-style names in a process whose executable is not QEMU.
    let p = Named::start("not-qemu", &["CPU 0/TCG", "CPU 1/TCG"]);
    assert_eq!(view(p.pid())["accel"], Value::Null);
    // The boundary, as documented: an executable called qemu-system-* with CPU n/TCG threads
    // is taken for QEMU under TCG (a container that runs QEMU is one).
    let p = Named::start("qemu-system-x86_64", &["CPU 0/TCG", "CPU 1/TCG"]);
    assert_eq!(view(p.pid())["accel"], "tcg");
}

/// runtime-rs reports its shim's pid and starts the VMM as the shim's child.
#[test]
fn the_vmm_child_of_a_shim_is_found() {
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Halted,
        under_parent: true,
    });
    assert_ne!(q.parent(), q.pid());
    let v = view(q.parent());
    assert_eq!(v["pid"], q.pid());
    assert_eq!(v["found_via"], q.parent());
    assert_eq!(found(&v), q.vcpu_tids(), "{v:#}");
    let (_, _, human) = kata_topo(&["vm", "--pid", &q.parent().to_string()]);
    assert!(
        human.contains(&format!(
            "VMM pid {} (qemu-system-x86), child of pid {}",
            q.pid(),
            q.parent()
        )),
        "{human}"
    );
}

/// The wrapper's own observation, against a real QEMU without thread names: after the delegate
/// accepted a container's create, the VMM whose pid the reply carried is read again and what
/// its vCPU threads really do is reported.
#[test]
fn the_wrapper_observes_the_vm_after_a_create() {
    // Under KVM without thread names, as Kata starts it with the shipped configuration.
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Halted,
        under_parent: false,
    });
    q.pin(0, "0");
    q.pin(1, "0");
    let p = kata_topo_shim::testing::pod("audit");
    // This process started the VMM: it stands for the delegate.
    p.delegate_is(std::process::id());
    p.create_with_pid(q.pid());
    let found = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(100));
        p.lines().iter().any(|l| l["rule"] == "vcpu-overlap")
    });
    let lines = p.lines();
    assert!(found, "{lines:#?}");
    let drift = lines
        .iter()
        .find(|l| l["rule"] == "vcpu-affinity-drift")
        .expect("vCPUs on node 0, the pod on node 1");
    assert_eq!(drift["operation"], "update");
    assert_eq!(drift["decision"], "allow");
}

/// A VMM the delegate did not start and whose cgroup names no part of the sandbox (another
/// sandbox's, or an impostor's) is not this sandbox's: the wrapper raises nothing against it.
#[test]
fn the_wrapper_never_observes_a_vmm_its_delegate_did_not_start() {
    let q = Qemu::start(QemuOpts {
        kvm: true,
        debug_threads: false,
        guest: Guest::Halted,
        under_parent: false,
    });
    q.pin(0, "0");
    q.pin(1, "0");
    // The delegate is another process: the VMM is not among its descendants.
    let mut other = Command::new("sleep").arg("30").spawn().expect("sleep");
    let p = kata_topo_shim::testing::pod("audit");
    p.delegate_is(other.id());
    p.create_with_pid(q.pid());
    std::thread::sleep(std::time::Duration::from_secs(3));
    let lines = p.lines();
    let _ = other.kill();
    let _ = other.wait();
    assert!(
        !lines
            .iter()
            .any(|l| l["rule"].as_str().is_some_and(|r| r.starts_with("vcpu-"))),
        "{lines:#?}"
    );
}
