//! The built `kata-topo-hook` end to end: OCI state on stdin, a bundle, exit codes in audit and
//! enforce, recreates, a malformed state, poststart and poststop.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use kata_topo_core::testutil::SysfsTree;
use serde_json::{json, Value};

struct Env {
    dir: tempfile::TempDir,
    config: PathBuf,
}

fn env(mode: &str, fail_closed: bool) -> Env {
    env_with(mode, fail_closed, "")
}

/// [`env`] with more `[topology_guard]` lines; without a kubelet socket among them, a socket
/// path where there is none (a node's real kubelet is never asked).
fn env_with(mode: &str, fail_closed: bool, extra: &str) -> Env {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(dir.path().join("sys")).expect("sysfs");
    tree.add_gpu().expect("gpu");
    let config = dir.path().join("kata-topo.toml");
    std::fs::write(
        &config,
        format!(
            "[topology_guard]\nmode = \"{mode}\"\nfail_closed = {fail_closed}\ntopology_xml = \"{}\"\nsysfs_root = \"{}\"\nstate_dir = \"{}\"\nlog_file = \"{}\"\n{}{extra}",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenario/two-node-host.xml").display(),
            tree.root().display(),
            dir.path().join("state").display(),
            dir.path().join("kt.log").display(),
            if extra.contains("kubelet_pod_resources_socket") {
                String::new()
            } else {
                format!(
                    "kubelet_pod_resources_socket = \"{}\"\n",
                    dir.path().join("no-kubelet.sock").display()
                )
            },
        ),
    )
    .expect("config");
    Env { dir, config }
}

impl Env {
    fn bundle(&self, name: &str, cpus: &str, sandbox: bool) -> PathBuf {
        let b = self.dir.path().join(format!("bundle-{name}-{cpus}"));
        std::fs::create_dir_all(&b).expect("bundle");
        let mut ann = json!({
            "io.kubernetes.cri.container-type": if sandbox { "sandbox" } else { "container" },
            "io.kubernetes.cri.sandbox-id": "sb1",
            "io.kubernetes.cri.sandbox-name": "gpu-pod",
            "io.kubernetes.cri.sandbox-namespace": "ml",
            "kata-topo.io/policy": "single-numa-node",
            "kata-topo.io/numa-nodes": "1"
        });
        if !sandbox {
            ann["io.kubernetes.cri.container-name"] = json!(name);
        }
        std::fs::write(
            b.join("config.json"),
            json!({
                "ociVersion": "1.0.2",
                "annotations": ann,
                "linux": {"resources": {"cpu": {"cpus": cpus}},
                          "devices": [{"path": "/dev/vfio/42", "type": "c", "major": 240, "minor": 0}]}
            })
            .to_string(),
        )
        .expect("spec");
        b
    }

    fn hook(&self, stdin: &str) -> Output {
        self.spawn(stdin, None).wait_with_output().expect("wait")
    }

    /// The hook running with `stdin` written, publishing to `ttrpc` when given.
    fn spawn(&self, stdin: &str, ttrpc: Option<&Path>) -> std::process::Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kata-topo-hook"));
        cmd.env("KATA_TOPO_CONFIG", &self.config);
        match ttrpc {
            Some(socket) => cmd.env("TTRPC_ADDRESS", format!("unix://{}", socket.display())),
            None => cmd.env_remove("TTRPC_ADDRESS"),
        };
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run hook");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write state");
        child
    }

    fn state(&self, bundle: &Path, status: &str) -> String {
        json!({"ociVersion": "1.0.2", "id": "c1", "status": status, "pid": 0, "bundle": bundle})
            .to_string()
    }

    fn rules(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("kt.log"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter_map(|l| l["rule"].as_str().map(str::to_string))
            .collect()
    }
}

fn code(o: &Output) -> i32 {
    o.status.code().expect("exit code")
}

#[test]
fn audit_reports_and_lets_the_container_start() {
    let e = env("audit", false);
    let b = e.bundle("trainer", "0", false);
    let out = e.hook(&e.state(&b, "creating"));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        e.rules().contains(&"vfio-remote".to_string()),
        "{:?}",
        e.rules()
    );
}

#[test]
fn enforce_refuses_and_recreates_are_held_to_the_baseline() {
    let e = env("enforce", false);
    let out = e.hook(&e.state(&e.bundle("trainer", "0", false), "creating"));
    assert_eq!(code(&out), 1);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("vfio-remote") && err.contains("ml/gpu-pod"),
        "{err}"
    );
    // A compliant first create passes and records the baseline ...
    let out = e.hook(&e.state(&e.bundle("worker", "1", false), "creating"));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(e
        .dir
        .path()
        .join("state/hook/sb1/containers/worker.json")
        .is_file());
    // ... and the same container recreated across nodes is refused as a recreate.
    let out = e.hook(&e.state(&e.bundle("worker", "0", false), "creating"));
    assert_eq!(code(&out), 1);
    let line = std::fs::read_to_string(e.dir.path().join("kt.log")).expect("log");
    assert!(line.contains("\"operation\":\"recreate\""), "{line}");
    // poststart cannot refuse: the container already runs.
    let out = e.hook(&e.state(&e.bundle("late", "0", false), "running"));
    assert_eq!(code(&out), 0);
    // poststop of the sandbox removes the pod's baselines.
    let out = e.hook(&e.state(&e.bundle("pause", "1", true), "stopped"));
    assert_eq!(code(&out), 0);
    assert!(!e.dir.path().join("state/hook/sb1").exists());
}

#[test]
fn a_malformed_state_never_blocks_unless_fail_closed() {
    let e = env("enforce", false);
    let out = e.hook("{not json");
    assert_eq!(code(&out), 0);
    assert_eq!(e.rules(), vec!["check-failed"]);
    let closed = env("enforce", true);
    let out = closed.hook("{\"id\": 1}");
    assert_eq!(code(&out), 1);
    assert!(String::from_utf8_lossy(&out.stderr).contains("fail_closed"));
}

#[test]
fn version_and_usage() {
    let out = Command::new(env!("CARGO_BIN_EXE_kata-topo-hook"))
        .arg("-v")
        .output()
        .expect("run");
    assert_eq!(code(&out), 0);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("kata-topo-hook "));
    let out = Command::new(env!("CARGO_BIN_EXE_kata-topo-hook"))
        .arg("--frobnicate")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(code(&out), 2);
}

/// containerd's ttrpc socket listens but never accepts, its backlog full: publishing the event
/// gives up within its budget, and in audit mode the container is never failed.
#[test]
fn a_containerd_that_never_accepts_never_fails_the_container() {
    let e = env("audit", false);
    let socket = e.dir.path().join("ttrpc.sock");
    let listener = small_listener(&socket);
    // Fill the listen backlog: a plain connect() would now block.
    let mut held = Vec::new();
    for _ in 0..64 {
        match nonblocking_connect(&socket) {
            Some(s) => held.push(s),
            None => break,
        }
    }
    assert!(
        nonblocking_connect(&socket).is_none(),
        "the backlog is full"
    );
    let b = e.bundle("trainer", "0", false);
    let mut child = e.spawn(&e.state(&b, "creating"), Some(&socket));
    // A guard against a hang (the runtime's own hook timeout would kill it), not a timing.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the hook hung on a containerd that never accepts");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    assert!(
        e.rules().contains(&"vfio-remote".to_string()),
        "{:?}",
        e.rules()
    );
    drop(listener);
}

/// A listener with a backlog of 2 that nobody accepts on.
fn small_listener(path: &Path) -> std::os::fd::OwnedFd {
    use nix::sys::socket::{
        bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr,
    };
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::empty(),
        None,
    )
    .expect("socket");
    bind(fd.as_raw_fd(), &UnixAddr::new(path).expect("addr")).expect("bind");
    listen(&fd, Backlog::new(2).expect("backlog")).expect("listen");
    fd
}

fn nonblocking_connect(path: &Path) -> Option<std::os::fd::OwnedFd> {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK,
        None,
    )
    .ok()?;
    let addr = UnixAddr::new(path).ok()?;
    connect(fd.as_raw_fd(), &addr).ok()?;
    Some(fd)
}

/// Under `mode = "enforce"` a container annotated `kata-topo.io/mode: audit` and
/// `kata-topo.io/policy: none` is refused all the same; the log names both ignored annotations.
#[test]
fn a_pod_annotation_cannot_switch_enforcement_off() {
    let e = env("enforce", false);
    let b = e.bundle("trainer", "0", false);
    let config = b.join("config.json");
    let mut spec: Value =
        serde_json::from_slice(&std::fs::read(&config).expect("spec")).expect("json");
    spec["annotations"]["kata-topo.io/mode"] = json!("audit");
    spec["annotations"]["kata-topo.io/policy"] = json!("none");
    std::fs::write(&config, spec.to_string()).expect("spec");
    let out = e.hook(&e.state(&b, "creating"));
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    let rules = e.rules();
    assert_eq!(
        rules.iter().filter(|r| *r == "override-ignored").count(),
        2,
        "{rules:?}"
    );
}

/// A machine whose discovery blocks: one of hwloc's sysfs/procfs snapshots (discovered through
/// `HWLOC_FSROOT`, as a live machine) with a FIFO nobody writes where hwloc reads
/// `/proc/cpuinfo` — the open blocks, as a read of a hung device's attribute does. The
/// topology key (which the hardened reader reads) is intact, so the cache misses and hwloc
/// discovers.
fn blocking_machine(dir: &Path) -> PathBuf {
    let archive = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../core/tests/fixtures/hwloc/fsroot/40intel64-2g2n4c+pcilocality.tar.bz2");
    let status = Command::new("tar")
        .arg("-xjf")
        .arg(&archive)
        .arg("-C")
        .arg(dir)
        .status()
        .expect("run tar (needs bzip2)");
    assert!(status.success(), "unpacking {}", archive.display());
    let root = dir.join("40intel64-2g2n4c+pci");
    let boot = root.join("proc/sys/kernel/random");
    std::fs::create_dir_all(&boot).expect("mkdir");
    std::fs::write(
        boot.join("boot_id"),
        "5c1f0a3e-0000-4000-8000-000000000001\n",
    )
    .expect("boot");
    let cpuinfo = root.join("proc/cpuinfo");
    let _ = std::fs::remove_file(&cpuinfo);
    nix::unistd::mkfifo(&cpuinfo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("fifo");
    root
}

/// The hook's configuration on the live machine (through the node-wide cache).
fn live_config(e: &Env, mode: &str, fail_closed: bool) -> PathBuf {
    let config = e.dir.path().join("live.toml");
    std::fs::write(
        &config,
        format!(
            "[topology_guard]\nmode = \"{mode}\"\nfail_closed = {fail_closed}\nstate_dir = \"{}\"\nlog_file = \"{}\"\n",
            e.dir.path().join("state").display(),
            e.dir.path().join("kt.log").display()
        ),
    )
    .expect("config");
    config
}

/// The hook with `stdin` written (and closed unless `hold`), killed if it has not exited
/// within a minute; its output and how long it ran.
fn timed_hook(
    config: &Path,
    fsroot: &Path,
    stdin: &str,
    hold: bool,
) -> (Option<i32>, String, std::time::Duration) {
    let start = std::time::Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kata-topo-hook"))
        .env("KATA_TOPO_CONFIG", config)
        .env("HWLOC_FSROOT", fsroot)
        .env("HWLOC_COMPONENTS", "linux,stop")
        .env_remove("TTRPC_ADDRESS")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run hook");
    let mut input = child.stdin.take().expect("stdin");
    input.write_all(stdin.as_bytes()).expect("write state");
    let held = hold.then_some(input);
    let code = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status.code();
        }
        if start.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    drop(held);
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut err);
    }
    (code, err, start.elapsed())
}

/// Every step of the hook has a deadline: a topology discovery that blocks, or a state on
/// stdin that never ends, costs the container a bounded wait and a `check-failed` finding that
/// says what the hook was waiting for — never the container's creation — and refuses only
/// with `fail_closed` in enforce mode.
#[test]
fn a_hook_step_that_blocks_is_given_up_in_time() {
    let e = env("audit", false);
    let machine = tempfile::tempdir().expect("tempdir");
    let fsroot = blocking_machine(machine.path());
    let b = e.bundle("trainer", "0", false);

    let (code, err, took) = timed_hook(
        &live_config(&e, "audit", false),
        &fsroot,
        &e.state(&b, "creating"),
        false,
    );
    assert_eq!(code, Some(0), "the hook hung or failed ({took:?}): {err}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let log = std::fs::read_to_string(e.dir.path().join("kt.log")).unwrap_or_default();
    let failed: Vec<Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["rule"] == "check-failed")
        .collect();
    assert_eq!(failed.len(), 1, "{log}");
    let msg = failed[0]["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("did not finish within") && msg.contains("discovering the live machine"),
        "{msg}"
    );

    let (code, err, took) = timed_hook(
        &live_config(&e, "enforce", true),
        &fsroot,
        &e.state(&b, "creating"),
        false,
    );
    assert_eq!(code, Some(1), "fail_closed refuses ({took:?}): {err}");
    assert!(err.contains("discovering the live machine"), "{err}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");

    // A runtime that never closes the hook's stdin.
    let (code, err, took) = timed_hook(
        &live_config(&e, "audit", false),
        &fsroot,
        &e.state(&b, "creating"),
        true,
    );
    assert_eq!(code, Some(0), "({took:?}): {err}");
    assert!(took < std::time::Duration::from_secs(10), "{took:?}");
    let log = std::fs::read_to_string(e.dir.path().join("kt.log")).unwrap_or_default();
    assert!(log.contains("reading the OCI state on stdin"), "{log}");
}

/// `intent_source = "kubelet"` with no kubelet: the hook checks against the annotations, with a
/// `kubelet-intent-unavailable` warning saying why, and lets the container start.
#[test]
fn without_the_kubelet_the_hook_falls_back_with_a_warning() {
    let e = env_with("enforce", false, "intent_source = \"kubelet\"\n");
    let b = e.bundle("trainer", "1", false);
    let out = e.hook(&e.state(&b, "creating"));
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(e.rules(), ["kubelet-intent-unavailable"]);
    let log = std::fs::read_to_string(e.dir.path().join("kt.log")).expect("log");
    assert!(log.contains("does not exist"), "{log}");
    assert!(log.contains("\"intent_source\":\"annotations\""), "{log}");
}
