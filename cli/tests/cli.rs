//! The built `kata-topo` binary end to end: exit codes 0/1/2, JSON shapes, error messages, the
//! bundled scenario, and hwloc's Linux backend on real sysfs/procfs snapshots.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kata_topo_core::testutil::GPU;
use serde_json::Value;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn fixture(name: &str) -> PathBuf {
    repo().join("core/tests/fixtures/hwloc").join(name)
}

fn scenario(name: &str) -> PathBuf {
    repo().join("scenario").join(name)
}

fn kata_topo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(args)
        .output()
        .expect("run kata-topo")
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exit code")
}

fn stdout_json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn topology_json_shape_on_dgx2() {
    let xml = fixture("xml/nvidiaDGX2.xml");
    let out = kata_topo(&["topology", "--topology", s(&xml), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    let nodes = json["numa_nodes"].as_array().expect("numa_nodes");
    assert_eq!(nodes.len(), 2);
    assert_eq!(nodes[0]["os_index"], 0);
    assert_eq!(nodes[0]["cpus"], "0-1");
    assert!(nodes[0]["memory_bytes"].as_u64().expect("memory") > 0);
    let gpu = json["pci_devices"]
        .as_array()
        .expect("pci_devices")
        .iter()
        .find(|d| d["bus_id"] == GPU)
        .expect("the scenario's GPU");
    assert_eq!(gpu["class_id"], "0302");
    assert_eq!(gpu["vendor_id"], "10de");
    assert_eq!(gpu["device_id"], "1db8");
    assert_eq!(gpu["numa_nodes"], serde_json::json!([1]));
    assert_eq!(gpu["vfio_group"], Value::Null);
}

#[test]
fn topology_unknown_locality_is_null() {
    let xml = fixture("xml/fsroot-40intel64-2g2n4c+pci-nolocalityenv.xml");
    let out = kata_topo(&["topology", "--topology", s(&xml), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    let devices = json["pci_devices"].as_array().expect("devices");
    assert!(!devices.is_empty());
    assert!(devices.iter().all(|d| d["numa_nodes"].is_null()));
}

#[test]
fn topology_shows_vfio_groups_from_sysfs() {
    let out = kata_topo(&[
        "topology",
        "--topology",
        s(&scenario("two-node-host.xml")),
        "--sysfs",
        s(&scenario("sysfs")),
        "--json",
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    let by_id = |id: &str| {
        json["pci_devices"]
            .as_array()
            .expect("devices")
            .iter()
            .find(|d| d["bus_id"] == id)
            .cloned()
            .expect("device")
    };
    assert_eq!(by_id(GPU)["vfio_group"], "42");
    assert_eq!(by_id(GPU)["numa_nodes"], serde_json::json!([1]));
    // Bound to its own driver, not vfio-pci: no group shown.
    assert_eq!(by_id("0000:b8:00.0")["vfio_group"], Value::Null);
    assert_eq!(by_id("0000:b8:00.0")["driver"], "mlx5_core");
    // Human output names the same.
    let out = kata_topo(&[
        "topology",
        "--topology",
        s(&scenario("two-node-host.xml")),
        "--sysfs",
        s(&scenario("sysfs")),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(GPU) && text.contains("vfio group 42"),
        "{text}"
    );
}

/// Unpacks one of hwloc's sysfs/procfs snapshots.
fn snapshot(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = fixture(&format!("fsroot/{name}.tar.bz2"));
    let status = Command::new("tar")
        .arg("-xjf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("run tar (needs bzip2)");
    assert!(status.success(), "unpacking {}", archive.display());
    let root = std::fs::read_dir(dir.path())
        .expect("read")
        .next()
        .expect("one directory")
        .expect("entry")
        .path();
    (dir, root)
}

fn live_topology_of(root: &Path, extra_env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_kata-topo"));
    cmd.args(["topology", "--json", "--sysfs", s(&root.join("sys"))])
        .env("HWLOC_FSROOT", root)
        .env("HWLOC_COMPONENTS", "linux,stop");
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().expect("run kata-topo")
}

#[test]
fn linux_backend_on_a_snapshot_with_offline_cpus_and_node() {
    let (_dir, root) = snapshot("offline-cpu0-node0");
    let out = live_topology_of(&root, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    let offline = kata_topo_core::IdSet::parse(json["offline_cpus"].as_str().expect("offline"))
        .expect("list");
    assert!(offline.contains(0), "CPU 0 is offline: {json}");
    let nodes: Vec<u64> = json["numa_nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["os_index"].as_u64().expect("index"))
        .collect();
    assert!(!nodes.contains(&0), "node 0 is offline: {nodes:?}");
}

#[test]
fn linux_backend_sees_the_whole_machine_inside_a_cgroup() {
    let (_dir, root) = snapshot("32amd64-4s2n4c-cgroup2");
    let out = live_topology_of(&root, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    assert_eq!(json["online_cpus"], "0-31");
    assert_eq!(json["numa_nodes"].as_array().expect("nodes").len(), 8);
}

#[test]
fn linux_backend_numa_node_minus_one_is_unknown() {
    let (_dir, root) = snapshot("40intel64-2g2n4c+pcilocality");
    // The snapshot's own test forces locality near the packages; sysfs still says -1.
    let forced = "# near 1st package;0000:00-09 0x00000055,0x55555555;# near 2nd package;0000:40-46 0x000000aa,0xaaaaaaaa";
    let out = live_topology_of(&root, &[("HWLOC_PCI_LOCALITY", forced)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let json = stdout_json(&out);
    let dev = json["pci_devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["bus_id"] == "0000:02:00.0")
        .cloned()
        .expect("0000:02:00.0");
    assert_eq!(dev["numa_nodes"], Value::Null);
    assert!(dev["locality_unknown_reason"]
        .as_str()
        .expect("reason")
        .contains("-1"));
}

fn check(args: &[&str]) -> Output {
    let host = s(&scenario("two-node-host.xml")).to_string();
    let sysfs = s(&scenario("sysfs")).to_string();
    let mut all = vec!["check", "--topology", &host, "--sysfs", &sysfs];
    all.extend_from_slice(args);
    kata_topo(&all)
}

#[test]
fn check_exit_codes_and_verdict_json() {
    let spec = scenario("trainer.json");
    let out = check(&["--spec", s(&spec), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["operation"], "create");
    assert_eq!(v["class"], Value::Null);
    assert_eq!(v["decision"], "allow");
    assert_eq!(v["policy"], "single-numa-node");
    assert_eq!(v["pod"]["namespace"], "ml");
    assert_eq!(v["findings"], serde_json::json!([]));

    let out = check(&[
        "--spec",
        s(&spec),
        "--update",
        s(&scenario("cpuset-push.json")),
        "--json",
    ]);
    assert_eq!(code(&out), 1);
    let v = stdout_json(&out);
    assert_eq!(v["operation"], "update");
    assert_eq!(v["class"], "cpuset");
    assert_eq!(v["decision"], "allow");
    let rules: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["rule"].as_str().expect("rule"))
        .collect();
    assert_eq!(
        rules,
        vec!["cpu-outside-intent", "mems-mismatch", "vfio-remote"]
    );
    for f in v["findings"].as_array().expect("findings") {
        for key in ["rule", "severity", "message", "expected", "observed"] {
            assert!(f.get(key).is_some(), "finding lacks {key}: {f}");
        }
    }

    let out = check(&[
        "--spec",
        s(&spec),
        "--update",
        s(&scenario("cpuset-push.json")),
        "--mode",
        "enforce",
        "--json",
    ]);
    assert_eq!(code(&out), 1);
    assert_eq!(stdout_json(&out)["decision"], "reject");

    // --policy is the node's: the pod's stricter annotation (single-numa-node) still applies
    // over none, unless the node lets pods override nothing.
    let update = scenario("cpuset-push.json");
    let push = |extra: &[&str]| {
        let mut args = vec![
            "--spec",
            s(&spec),
            "--update",
            s(&update),
            "--policy",
            "none",
            "--json",
        ];
        args.extend_from_slice(extra);
        check(&args)
    };
    let out = push(&[]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(stdout_json(&out)["policy"], "single-numa-node");
    let out = push(&["--pod-overrides", "none"]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    let v = stdout_json(&out);
    assert_eq!(v["policy"], "none");
    let ignored: Vec<&str> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| f["rule"] == "override-ignored")
        .map(|f| f["observed"]["annotation"].as_str().expect("annotation"))
        .collect();
    assert_eq!(ignored, ["kata-topo.io/policy", "kata-topo.io/numa-nodes"]);
}

/// `check` shows what the wrapper decides on a node in enforce mode: the pod's
/// `kata-topo.io/mode: audit` is ignored (`override-ignored`) and the push refused, unless the
/// node lets pods weaken it (`--pod-overrides any`).
#[test]
fn check_holds_a_weakening_annotation_to_the_nodes_mode() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(scenario("trainer.json")).expect("spec"))
            .expect("json");
    spec["annotations"]["kata-topo.io/mode"] = "audit".into();
    let path = dir.path().join("config.json");
    std::fs::write(&path, spec.to_string()).expect("write");
    let run = |overrides: &str| {
        check(&[
            "--spec",
            s(&path),
            "--update",
            s(&scenario("cpuset-push.json")),
            "--mode",
            "enforce",
            "--pod-overrides",
            overrides,
            "--json",
        ])
    };
    let out = run("stricter-only");
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(
        (&v["mode"], &v["decision"]),
        (&"enforce".into(), &"reject".into())
    );
    let f = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["rule"] == "override-ignored")
        .expect("override-ignored");
    assert_eq!(f["observed"]["annotation"], "kata-topo.io/mode");
    assert_eq!(f["severity"], "warning");
    let out = run("any");
    assert_eq!(stdout_json(&out)["decision"], "allow");
    let out = run("sometimes");
    assert_eq!(code(&out), 2);
}

#[test]
fn check_records_a_baseline_and_holds_a_recreate_to_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let baseline = dir.path().join("baseline.json");
    let out = check(&[
        "--spec",
        s(&scenario("trainer.json")),
        "--record-baseline",
        s(&baseline),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let b: Value =
        serde_json::from_slice(&std::fs::read(&baseline).expect("baseline")).expect("json");
    assert_eq!(b["cpus"], "1");
    assert_eq!(b["cpu_nodes"], "1");
    assert_eq!(b["devices"][0]["bus_id"], GPU);
    assert_eq!(b["container_name"], "trainer");

    let out = check(&[
        "--spec",
        s(&scenario("trainer-recreated.json")),
        "--baseline",
        s(&baseline),
        "--json",
    ]);
    assert_eq!(code(&out), 1);
    let v = stdout_json(&out);
    assert_eq!(v["operation"], "recreate");
    assert!(v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .any(|f| f["rule"] == "cpu-spans-numa"));
}

#[test]
fn bad_input_exits_2_with_one_line_naming_it() {
    let out = check(&["--spec", "/nonexistent/config.json"]);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(err.contains("/nonexistent/config.json"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("config.json");
    std::fs::write(&bad, "{\"ociVersion\": 1.0.2").expect("write");
    let out = check(&["--spec", s(&bad)]);
    assert_eq!(code(&out), 2);
    let err = stderr(&out);
    assert!(
        err.contains("OCI spec is not valid") && err.contains("config.json"),
        "{err}"
    );

    std::fs::write(&bad, br#"{"cpu":{"cpus":"9-2"}}"#).expect("write");
    let out = check(&["--spec", s(&scenario("trainer.json")), "--update", s(&bad)]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("linux.resources.cpu.cpus"),
        "{}",
        stderr(&out)
    );

    let out = kata_topo(&["topology", "--topology", s(&bad)]);
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("hwloc could not load"),
        "{}",
        stderr(&out)
    );

    // Usage errors: clap's message, exit 2.
    assert_eq!(code(&kata_topo(&["check"])), 2);
    assert_eq!(
        code(&check(&[
            "--spec",
            s(&scenario("trainer.json")),
            "--policy",
            "strict"
        ])),
        2
    );
    assert_eq!(code(&kata_topo(&["frobnicate"])), 2);
}

#[test]
fn invalid_annotation_is_an_error_finding() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(scenario("trainer.json")).expect("read"))
            .expect("json");
    spec["annotations"]["kata-topo.io/numa-nodes"] = Value::from("../../1");
    let path = dir.path().join("config.json");
    std::fs::write(&path, spec.to_string()).expect("write");
    let out = check(&["--spec", s(&path), "--json"]);
    assert_eq!(code(&out), 1);
    let v = stdout_json(&out);
    let f = &v["findings"][0];
    assert_eq!(f["rule"], "intent-invalid");
    assert_eq!(f["severity"], "error");
    assert!(f["message"]
        .as_str()
        .expect("message")
        .contains("kata-topo.io/numa-nodes=\"../../1\""));
}

#[test]
fn version_flag() {
    for flag in ["-v", "--version", "-V"] {
        let out = kata_topo(&[flag]);
        assert_eq!(code(&out), 0);
        assert!(
            String::from_utf8_lossy(&out.stdout).starts_with("kata-topo 0."),
            "{flag}"
        );
    }
}

#[test]
fn status_exit_codes_for_node_problem_detector() {
    use kata_topo_core::state::{GroupState, TaskRecord};
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    // Nothing watched: clean.
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let g = GroupState::open(&state, "k8s.io", "sb1").expect("state");
    g.save_task(
        "c1",
        &TaskRecord {
            bundle: "/b".into(),
            container_name: Some("trainer".into()),
            sandbox: false,
            resources: None,
            pid: None,
        },
    )
    .expect("task");
    let mut verdict: Value = serde_json::json!({
        "operation": "update", "class": "cpuset", "sandbox_id": "sb1", "container_id": "c1",
        "container_name": "trainer", "pod": {"name": "p", "namespace": "ml", "uid": null},
        "policy": "restricted", "mode": "audit", "decision": "allow", "findings": []
    });
    g.save_verdict(
        "c1",
        &serde_json::from_value(verdict.clone()).expect("verdict"),
    )
    .expect("save");
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 0);
    verdict["findings"] = serde_json::json!([{"rule": "vfio-remote", "severity": "error",
        "message": "GPU is remote", "expected": {}, "observed": {}}]);
    g.save_verdict("c1", &serde_json::from_value(verdict).expect("verdict"))
        .expect("save");
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 1);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("vfio-remote") && text.contains("ml/p"),
        "{text}"
    );
    let json = stdout_json(&kata_topo(&["status", "--state-dir", s(&state), "--json"]));
    assert_eq!(json["findings"], 1);
    assert_eq!(json["sandboxes"][0]["sandbox_id"], "sb1");
    std::fs::write(g.dir().join("verdicts/c2.json"), "{").expect("corrupt");
    assert_eq!(code(&kata_topo(&["status", "--state-dir", s(&state)])), 2);
}

/// Runs kata-topo with `stdin` and `stdout` as given (stderr to a file) and fails the test if it
/// has not exited within a minute: a guard against an input that blocks forever, not a
/// measure of speed.
fn kata_topo_guarded(args: &[&str], stdin: Stdio, stdout: Stdio) -> (i32, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let err_path = dir.path().join("stderr");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(args)
        .stdin(stdin)
        .stdout(stdout)
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("run kata-topo");
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kata-topo {args:?} did not exit: it blocks");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = std::fs::read_to_string(&err_path).expect("stderr");
    (status.code().expect("exit code, not a signal"), err)
}

fn guarded(args: &[&str]) -> (i32, String) {
    kata_topo_guarded(args, Stdio::null(), Stdio::null())
}

fn mkfifo(path: &Path) {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
}

/// Exit 2 with exactly one line on stderr that holds every one of `words`.
fn assert_refused(code: i32, err: &str, words: &[&str]) {
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    for w in words {
        assert!(err.contains(w), "{w:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_fifo_as_any_input_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("input.json");
    mkfifo(&fifo);
    let fifo = s(&fifo);
    let host = scenario("two-node-host.xml");
    let spec = scenario("trainer.json");
    for args in [
        vec!["check", "--spec", fifo],
        vec!["check", "--spec", s(&spec), "--update", fifo],
        vec!["check", "--spec", s(&spec), "--baseline", fifo],
        vec!["check", "--spec", s(&spec), "--kata-config", fifo],
        vec!["check", "--spec", s(&spec), "--topology", fifo],
        vec!["topology", "--topology", fifo],
    ] {
        let mut args = args;
        if args[0] == "check" && !args.contains(&"--topology") {
            args.extend(["--topology", s(&host)]);
        }
        let (code, err) = guarded(&args);
        assert_refused(code, &err, &[fifo, "is a FIFO, not a regular file"]);
    }
}

#[test]
fn a_fifo_inside_the_sysfs_root_is_refused_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = kata_topo_core::testutil::SysfsTree::at(dir.path().join("sys")).expect("tree");
    tree.add_gpu().expect("device");
    let numa_node = tree
        .root()
        .join(format!("devices/pci0000:b7/{GPU}/numa_node"));
    std::fs::remove_file(&numa_node).expect("remove");
    mkfifo(&numa_node);
    let host = scenario("two-node-host.xml");
    let (code, err) = guarded(&[
        "topology",
        "--topology",
        s(&host),
        "--sysfs",
        s(tree.root()),
    ]);
    assert_refused(code, &err, &[GPU, "numa_node", "FIFO"]);
    // check reports what it could not read as a finding, and ends.
    let out_path = dir.path().join("out.json");
    let (code, err) = kata_topo_guarded(
        &[
            "check",
            "--spec",
            s(&scenario("trainer.json")),
            "--topology",
            s(&host),
            "--sysfs",
            s(tree.root()),
            "--json",
        ],
        Stdio::null(),
        Stdio::from(std::fs::File::create(&out_path).expect("out")),
    );
    assert_ne!(code, 2, "{err}");
    let v: Value = serde_json::from_slice(&std::fs::read(&out_path).expect("out")).expect("json");
    assert!(
        v["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .any(|f| f["message"].as_str().is_some_and(|m| m.contains("FIFO"))),
        "{v}"
    );
}

#[test]
fn endless_and_oversized_inputs_are_refused() {
    let spec = scenario("trainer.json");
    let host = scenario("two-node-host.xml");
    let (code, err) = guarded(&[
        "check",
        "--spec",
        s(&spec),
        "--topology",
        s(&host),
        "--baseline",
        "/dev/zero",
    ]);
    assert_refused(
        code,
        &err,
        &[
            "baseline /dev/zero",
            "is a character device, not a regular file",
        ],
    );
    // A regular file over the limit is refused before it is parsed.
    let dir = tempfile::tempdir().expect("tempdir");
    let big = dir.path().join("baseline.json");
    std::fs::write(&big, vec![b' '; 2 * 1024 * 1024]).expect("write");
    let (code, err) = guarded(&[
        "check",
        "--spec",
        s(&spec),
        "--topology",
        s(&host),
        "--baseline",
        s(&big),
    ]);
    assert_refused(code, &err, &[s(&big), "larger than 1048576 bytes"]);
    // A directory.
    let (code, err) = guarded(&["check", "--spec", s(dir.path()), "--topology", s(&host)]);
    assert_refused(code, &err, &["is a directory"]);
    // Standard input is read, and bounded too.
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    let (code, err) = kata_topo_guarded(
        &["check", "--spec", "-", "--topology", s(&host)],
        Stdio::from(zero),
        Stdio::null(),
    );
    assert_refused(
        code,
        &err,
        &["OCI spec from standard input", "larger than 16777216 bytes"],
    );
    let (code, err) = kata_topo_guarded(
        &["check", "--spec", "-", "--topology", s(&host)],
        Stdio::from(std::fs::File::open(&spec).expect("spec")),
        Stdio::null(),
    );
    assert_eq!(code, 0, "{err}");
    let (code, err) = guarded(&[
        "check",
        "--spec",
        "-",
        "--update",
        "-",
        "--topology",
        s(&host),
    ]);
    assert_refused(code, &err, &["only one of --spec, --update, --baseline, --pod-spec, --node-labels and --label-baseline"]);
}

/// A state directory with one finding, for `status`.
fn state_with_a_finding(pod_name: &str, message: &str) -> (tempfile::TempDir, PathBuf) {
    use kata_topo_core::state::GroupState;
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let g = GroupState::open(&state, "k8s.io", "sb1").expect("state");
    let verdict = serde_json::json!({
        "operation": "update", "class": "cpuset", "sandbox_id": "sb1", "container_id": "c1",
        "container_name": "trainer", "pod": {"name": pod_name, "namespace": "ml", "uid": null},
        "policy": "restricted", "mode": "audit", "decision": "allow",
        "findings": [{"rule": "vfio-remote", "severity": "error", "message": message,
                      "expected": {}, "observed": {}}]
    });
    g.save_verdict("c1", &serde_json::from_value(verdict).expect("verdict"))
        .expect("save");
    (dir, state)
}

#[test]
fn a_closed_or_full_stdout_ends_quietly_with_exit_2() {
    let (_dir, state) = state_with_a_finding("p", "GPU is remote");
    let xml = fixture("xml/nvidiaDGX2.xml");
    let spec = scenario("trainer.json");
    let host = scenario("two-node-host.xml");
    let commands: Vec<Vec<&str>> = vec![
        vec!["status", "--state-dir", s(&state)],
        vec!["status", "--state-dir", s(&state), "--json"],
        vec!["topology", "--topology", s(&xml)],
        vec!["topology", "--topology", s(&xml), "--json"],
        vec!["check", "--spec", s(&spec), "--topology", s(&host)],
        vec![
            "check",
            "--spec",
            s(&spec),
            "--topology",
            s(&host),
            "--json",
        ],
    ];
    for args in &commands {
        // A pipe whose reader is gone before kata-topo writes: every write fails (EPIPE).
        let (reader, writer) = std::io::pipe().expect("pipe");
        drop(reader);
        let (code, err) = kata_topo_guarded(args, Stdio::null(), Stdio::from(writer));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert_eq!(err, "", "{args:?}: a closed pipe is not worth a word");

        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let (code, err) = kata_topo_guarded(args, Stdio::null(), Stdio::from(full));
        assert_refused(
            code,
            &err,
            &["cannot write to standard output", "No space left on device"],
        );
    }
    // The same status with a working stdout exits 1 (a finding): 2 above is the output's.
    assert_eq!(code(&kata_topo(&["status", "--state-dir", s(&state)])), 1);
    // --help and --version (clap prints them) too.
    for flag in ["--version", "--help"] {
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let (code, err) = kata_topo_guarded(&[flag], Stdio::null(), Stdio::from(full));
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

fn assert_no_control(text: &str) {
    assert!(
        !text
            .chars()
            .any(|c| c != '\n' && kata_topo_core::text::needs_escape(c)),
        "{text:?}"
    );
}

/// What a pod author could put in an annotation to forge a line in an operator's terminal.
const FORGED: &str = "gpu\u{1b}[2K\r\nerror forged-rule: all fine \u{202e}\u{9b}31m";
const FORGED_SHOWN: &str = "gpu\\u{1b}[2K\\r\\nerror forged-rule: all fine \\u{202e}\\u{9b}31m";

#[test]
fn annotations_show_escaped_in_human_output_and_intact_in_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(scenario("trainer.json")).expect("read"))
            .expect("json");
    spec["annotations"]["io.kubernetes.cri.sandbox-name"] = Value::from(FORGED);
    spec["annotations"]["kata-topo.io/mode"] = Value::from(FORGED);
    let path = dir.path().join("config.json");
    std::fs::write(&path, spec.to_string()).expect("write");

    let out = check(&["--spec", s(&path)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_no_control(&text);
    // The header and the one intent-invalid finding: nothing forged.
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains(&format!("pod=ml/{FORGED_SHOWN} ")), "{text}");
    assert!(text.contains("intent-invalid"), "{text}");

    let v = stdout_json(&check(&["--spec", s(&path), "--json"]));
    assert_eq!(v["pod"]["name"], FORGED);

    let (_state_dir, state) = state_with_a_finding(FORGED, &format!("remote\n{FORGED}"));
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    assert_no_control(&text);
    // The sandbox, its one finding, the count.
    assert_eq!(text.lines().count(), 3, "{text}");
    assert!(text.contains(&format!(" pod ml/{FORGED_SHOWN}:")), "{text}");
    assert!(
        text.contains(&format!("vfio-remote: remote\\n{FORGED_SHOWN}\n")),
        "{text}"
    );
    let json = stdout_json(&kata_topo(&["status", "--state-dir", s(&state), "--json"]));
    let verdict = &json["sandboxes"][0]["verdicts"][0][1];
    assert_eq!(verdict["pod"]["name"], FORGED);
    assert_eq!(
        verdict["findings"][0]["message"],
        format!("remote\n{FORGED}")
    );
}

#[test]
fn a_fifo_in_the_state_directory_is_unreadable_state() {
    let (_dir, state) = state_with_a_finding("p", "m");
    mkfifo(&state.join("k8s.io/sb1/verdicts/c2.json"));
    let out_dir = tempfile::tempdir().expect("tempdir");
    let out_path = out_dir.path().join("out");
    let (code, err) = kata_topo_guarded(
        &["status", "--state-dir", s(&state)],
        Stdio::null(),
        Stdio::from(std::fs::File::create(&out_path).expect("out")),
    );
    assert_eq!(code, 2, "{err}");
    let text = std::fs::read_to_string(&out_path).expect("out");
    assert!(
        text.contains("unreadable: ") && text.contains("c2.json: is a FIFO"),
        "{text}"
    );
}

/// A socket that accepts and never answers (a hung containerd, or not containerd at all):
/// `events` says so and exits 2 within its answer timeout, instead of waiting for ever.
#[test]
fn events_on_a_socket_that_never_answers_says_so_and_exits() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("silent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
    // Accepts every connection and holds it open, reading nothing, answering nothing.
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
        }
    });
    let started = Instant::now();
    let (code, err) = guarded(&["events", "--address", s(&sock)]);
    assert_refused(code, &err, &["did not answer", s(&sock)]);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "gave up after {:?}",
        started.elapsed()
    );
}

/// A wrapper that died (SIGKILL, a crash) leaves its state until containerd's `delete`: status
/// tells it from one that serves, by its pid and start time. The exit code still speaks of
/// findings only (the node-problem-detector condition is a topology mismatch).
#[test]
fn status_tells_dead_wrappers_from_serving_ones() {
    use kata_topo_core::process::ProcessId;
    use kata_topo_core::state::{DaemonRecord, GroupState};
    let dir = tempfile::tempdir().expect("tempdir");
    let state = dir.path().join("state");
    let me = ProcessId::current(Path::new("/proc")).expect("this process");
    let record = |wrapper: ProcessId| DaemonRecord {
        wrapper,
        delegate_address: "unix:///run/d.sock".into(),
        delegate: None,
        config: None,
        config_source: "built-in-defaults".into(),
        node_affinity: Some("off: no kubeconfig at /etc/kubernetes/kubelet.conf".into()),
        pod_events: Some("off: no kubeconfig at /etc/kubernetes/kubelet.conf".into()),
    };
    GroupState::open(&state, "k8s.io", "alive")
        .expect("state")
        .save_daemon(&record(me))
        .expect("record");
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains(&format!("wrapper pid {} serving", me.pid)),
        "{text}"
    );
    // Whether the node-affinity check runs, as the wrapper decided it.
    assert!(
        text.contains("  node affinity: off: no kubeconfig at /etc/kubernetes/kubelet.conf\n"),
        "{text}"
    );
    // And whether the pod's findings become Kubernetes Events.
    assert!(
        text.contains("  pod events: off: no kubeconfig at /etc/kubernetes/kubelet.conf\n"),
        "{text}"
    );
    // The same pid with another start time: a process that is gone, its pid maybe reused.
    let gone = ProcessId {
        start_time: me.start_time + 1,
        ..me
    };
    GroupState::open(&state, "k8s.io", "dead")
        .expect("state")
        .save_daemon(&record(gone))
        .expect("record");
    let out = kata_topo(&["status", "--state-dir", s(&state)]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let dead_line = text
        .lines()
        .skip_while(|l| !l.starts_with("sandbox dead "))
        .nth(1)
        .unwrap_or_default();
    assert!(
        dead_line.contains(&format!("wrapper pid {} dead", me.pid))
            && !dead_line.contains("serving"),
        "{text}"
    );
    assert!(text.contains("1 dead wrapper(s)"), "{text}");
    let json = stdout_json(&kata_topo(&["status", "--state-dir", s(&state), "--json"]));
    let by_id = |id: &str| {
        json["sandboxes"]
            .as_array()
            .and_then(|a| a.iter().find(|p| p["sandbox_id"] == id))
            .map(|p| p["wrapper"].clone())
    };
    assert_eq!(by_id("alive"), Some(Value::from("serving")), "{json}");
    assert_eq!(by_id("dead"), Some(Value::from("dead")), "{json}");
    assert_eq!(json["dead_wrappers"], 1, "{json}");
}

/// `kata-topo topology` on a live machine whose discovery blocks (a snapshot discovered through
/// `HWLOC_FSROOT`, with a FIFO nobody writes where hwloc reads `/proc/cpuinfo`): it says what
/// it is waiting for while it waits, and gives up at its deadline, exit 2.
#[test]
fn a_live_discovery_that_blocks_is_named_and_given_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/hwloc/fsroot/40intel64-2g2n4c+pcilocality.tar.bz2");
    let status = Command::new("tar")
        .arg("-xjf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("run tar (needs bzip2)");
    assert!(status.success());
    let root = dir.path().join("40intel64-2g2n4c+pci");
    let _ = std::fs::remove_file(root.join("proc/cpuinfo"));
    mkfifo(&root.join("proc/cpuinfo"));
    let start = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["topology", "--timeout", "2"])
        .env("HWLOC_FSROOT", &root)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kata-topo");
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if start.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("kata-topo topology did not exit: it blocks");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = start.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().expect("stderr"), &mut err)
        .expect("stderr");
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].contains("waiting for") && lines[0].contains("discovering the live machine"),
        "{err}"
    );
    assert!(
        lines[1].contains("gave up after 2 s") && lines[1].contains("discovering the live machine"),
        "{err}"
    );
}

/// `check --pod-resources`: the kubelet's recorded answer is the intent of the spec's pod; a
/// cpuset off the exclusive CPUs it assigned is `kubelet-cpus-mismatch`. `intent` reads the
/// same answer, and says when the pod is not in it (exit 1).
#[test]
fn a_recorded_pod_resources_answer_is_the_intent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let spec = dir.path().join("config.json");
    std::fs::write(
        &spec,
        serde_json::json!({
            "ociVersion": "1.0.2",
            "annotations": {
                "io.kubernetes.cri.container-type": "container",
                "io.kubernetes.cri.sandbox-id": "sb",
                "io.kubernetes.cri.container-name": "app",
                "io.kubernetes.cri.sandbox-name": "guaranteed",
                "io.kubernetes.cri.sandbox-namespace": "default"
            },
            "linux": {"resources": {"cpu": {"cpus": "0-1"}}}
        })
        .to_string(),
    )
    .expect("spec");
    let answer = repo().join("core/tests/fixtures/pod-resources/list.json");
    let out = kata_topo(&[
        "check",
        "--spec",
        s(&spec),
        "--topology",
        s(&scenario("two-node-host.xml")),
        "--pod-resources",
        s(&answer),
        "--json",
    ]);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["intent_source"], "kubelet");
    assert_eq!(v["kubelet"]["cpus"], "1");
    let rules: Vec<_> = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .map(|f| f["rule"].as_str().unwrap_or_default().to_string())
        .collect();
    assert!(
        rules.contains(&"kubelet-cpus-mismatch".to_string()),
        "{rules:?}"
    );

    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "topologyManagerPolicy: single-numa-node\n").expect("config");
    let intent = |pod: &str| {
        kata_topo(&[
            "intent",
            "--pod",
            pod,
            "--pod-resources",
            s(&answer),
            "--kubelet-config",
            s(&config),
            "--json",
        ])
    };
    let out = intent("default/guaranteed");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["intent_source"], "kubelet");
    assert_eq!(
        v["kubelet"]["settings"]["topology_manager_policy"],
        "single-numa-node"
    );
    assert_eq!(v["kubelet"]["containers"][0]["cpu_ids"], "1");
    let out = intent("default/absent");
    assert_eq!(code(&out), 1);
    assert_eq!(stdout_json(&out)["intent_source"], "annotations");
    assert_eq!(code(&kata_topo(&["intent", "--pod", "no-slash"])), 2);
}

/// `check --node-labels --pod-spec`: a recorded Node and Pod, the pod's node affinity against
/// the node's labels offline — violated after a relabel (exit 1, the owner in the message),
/// changed but holding against the label baseline (exit 0, a warning), clean on the node it
/// was scheduled to; with --spec the findings join the spec's verdict; a Node where a Pod
/// should be is exit 2 naming the field.
#[test]
fn node_affinity_offline_from_a_recorded_node_and_pod() {
    let dir = repo().join("core/tests/fixtures/affinity");
    let f = |n: &str| dir.join(n);
    let run = |node: &str, baseline: Option<&str>, extra: &[&str]| {
        let (pod, node) = (f("pod.json"), f(node));
        let mut args = vec!["check", "--pod-spec", s(&pod), "--node-labels", s(&node)];
        let b;
        if let Some(name) = baseline {
            b = f(name);
            args.extend(["--label-baseline", s(&b)]);
        }
        args.extend(extra);
        args.push("--json");
        kata_topo(&args)
    };
    let rules = |v: &Value| -> Vec<String> {
        v["findings"]
            .as_array()
            .expect("findings")
            .iter()
            .map(|f| f["rule"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let out = run("node.json", None, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["operation"], "create");
    assert_eq!(v["class"], Value::Null);
    assert_eq!(v["pod"]["name"], "nic-bound-7c9d4-x2lqp");
    assert!(rules(&v).is_empty(), "{v}");

    let out = run(
        "node-relabelled.json",
        Some("node.json"),
        &["--mode", "enforce"],
    );
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["operation"], "update");
    assert_eq!(v["class"], "noop", "the pod alone changes no resources");
    assert_eq!(v["decision"], "reject");
    assert_eq!(rules(&v), ["node-affinity-violated"]);
    let finding = &v["findings"][0];
    assert_eq!(finding["severity"], "error");
    assert_eq!(
        finding["observed"]["labels"]["kata-topo.io/nic"], "e810",
        "{finding}"
    );
    assert_eq!(
        finding["expected"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
            [0]["matchExpressions"][0]["key"],
        "kata-topo.io/nic"
    );
    let message = finding["message"].as_str().expect("message");
    assert!(message.contains("ReplicaSet nic-bound-7c9d4"), "{message}");

    let out = run("node-more-cores.json", Some("node.json"), &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(rules(&v), ["node-labels-changed"]);
    assert_eq!(
        v["findings"][0]["expected"]["labels"]["feature.node.kubernetes.io/cpu-cores"],
        "2"
    );

    // With a spec (clean on its own), the affinity findings join its verdict.
    let (spec, topo, sysfs) = (
        scenario("trainer.json"),
        scenario("two-node-host.xml"),
        scenario("sysfs"),
    );
    let with_spec = [
        "--spec",
        s(&spec),
        "--topology",
        s(&topo),
        "--sysfs",
        s(&sysfs),
    ];
    let out = run("node-relabelled.json", Some("node.json"), &with_spec);
    assert_eq!(code(&out), 1, "{}", stderr(&out));
    let v = stdout_json(&out);
    assert_eq!(v["container_name"], "trainer");
    assert_eq!(rules(&v), ["node-affinity-violated"]);

    // A Node where the Pod should be: exit 2, naming the field.
    let node = f("node.json");
    let out = kata_topo(&["check", "--pod-spec", s(&node), "--node-labels", s(&node)]);
    assert_eq!(code(&out), 2);
    assert!(stderr(&out).contains("kind"), "{}", stderr(&out));
    // --node-labels without --pod-spec is bad usage.
    assert_eq!(code(&kata_topo(&["check", "--node-labels", s(&node)])), 2);
}

/// `kata-topo diagnose` of a pod it holds no state for: one line, exit 2, and the same as JSON;
/// `--enter-host` run as `nobody` cannot enter PID 1's namespaces and says why (entering them
/// runs in `make k8s-test`, from the installer's pod: the test machine's own PID 1 may be out of
/// reach even of root); a pod that is not NAMESPACE/NAME is bad usage. Needs root.
#[test]
fn diagnose_of_a_pod_without_state_is_one_line_and_enter_host_needs_root() {
    assert!(
        std::fs::read_to_string("/proc/self/status")
            .is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t"))),
        "this test needs root (to enter PID 1's namespaces)"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let args = ["diagnose", "ml/web", "--state-dir", s(dir.path())];
        let out = kata_topo(&args);
        assert_eq!(code(&out), 2, "{}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(
            text.starts_with(
                "pod ml/web: cannot tell: kata-topo holds no state for it on this node"
            ),
            "{text}"
        );
        let json = stdout_json(&kata_topo(&[&args[..], &["--json"]].concat()));
        assert_eq!(json["schema"], "kata-topo.io/diagnose/v1");
        assert_eq!(json["status"], "unknown");
        assert_eq!(
            json["pod"],
            serde_json::json!({"namespace": "ml", "name": "web"})
        );
    }
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(env!("CARGO_BIN_EXE_kata-topo"))
        .args(["diagnose", "--enter-host", "ml/web"])
        .output()
        .expect("setpriv");
    assert_eq!(code(&out), 2);
    assert!(
        stderr(&out).contains("/proc/1/ns/mnt (--enter-host needs root with CAP_SYS_ADMIN"),
        "{}",
        stderr(&out)
    );
    for bad in ["web", "ml/", "/web", "ml/web/x"] {
        let out = kata_topo(&["diagnose", bad]);
        assert_eq!(code(&out), 2, "{bad}");
        assert!(
            stderr(&out).contains("the pod must be NAMESPACE/NAME"),
            "{bad}: {}",
            stderr(&out)
        );
    }
}
