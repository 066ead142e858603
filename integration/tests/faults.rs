//! Faults: a delegate or a wrapper killed with SIGKILL, containerd restarted under a running
//! pod, a malformed `[topology_guard]`, an unreadable topology.

use std::time::Duration;

use kata_topo_integration::{alive, eventually, Containerd, Guard, Resources, BUSYBOX, RUNNING};

const KT: &str = "io.containerd.kata-topo.v2";

/// Starts a background task through the wrapper; returns the container process's pid.
fn run_bg(c: &Containerd, id: &str) -> u32 {
    let out = c.ctr(&["run", "-d", "--runtime", KT, BUSYBOX, id, "sleep", "300"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ls = String::from_utf8_lossy(&c.ctr(&["task", "ls"]).stdout).into_owned();
    ls.lines()
        .find(|l| l.starts_with(id))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid for {id} in {ls}"))
}

/// [`run_bg`], then the task's delegate shim and wrapper daemon (exactly one of each).
fn run_bg_with_shims(c: &Containerd, id: &str) -> (u32, u32, u32) {
    let pid = run_bg(c, id);
    let delegate = c.pids_matching("containerd-shim-runc-v2");
    let wrapper = c.pids_matching("kata-topo-daemon");
    assert_eq!(
        (delegate.len(), wrapper.len()),
        (1, 1),
        "{:?}",
        c.leftover_processes()
    );
    (pid, delegate[0], wrapper[0])
}

fn kill9(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status();
}

#[test]
fn delegate_killed_the_wrapper_exits_and_nothing_leaks() {
    let c = Containerd::start(Guard::default());
    let (pid, delegate, wrapper) = run_bg_with_shims(&c, "victim");
    kill9(delegate);
    assert!(
        eventually(Duration::from_secs(10), || !alive(wrapper)),
        "the wrapper must exit when its delegate dies"
    );
    c.remove_task("victim");
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)),
        "the container process is gone"
    );
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn wrapper_killed_delete_cleans_the_delegate_up() {
    let c = Containerd::start(Guard::default());
    let (pid, delegate, wrapper) = run_bg_with_shims(&c, "orphan");
    let bundle = c
        .dir
        .path()
        .join("state/io.containerd.runtime.v2.task/default/orphan/kata-topo.json");
    let sockets = std::fs::read_to_string(bundle).unwrap_or_default();
    kill9(wrapper);
    // containerd notices the dropped connection and runs `delete`, which must stop the
    // delegate through its RPCs.
    assert!(
        eventually(Duration::from_secs(15), || !alive(delegate)),
        "the delegate must not leak: {:?}",
        c.leftover_processes()
    );
    assert!(
        eventually(Duration::from_secs(10), || !alive(pid)),
        "the container process is gone"
    );
    c.remove_task("orphan");
    assert_eq!(
        c.wait_clean(Duration::from_secs(15)),
        Vec::<String>::new(),
        "wrapper and delegate: {sockets}\n{}",
        c.containerd_log()
    );
}

#[test]
fn containerd_restart_reconnects_through_the_wrapper() {
    let mut c = Containerd::start(Guard::default());
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("survivor", &[("kata-topo.io/numa-nodes", "1")], true);
    let res = Resources::admitted();
    let wrapper = c.pids_matching("kata-topo-daemon");
    drop(cri);
    c.restart();
    let mut cri = c.cri();
    assert!(
        cri.wait_ready(Duration::from_secs(30)),
        "CRI did not come back after the restart"
    );
    assert_eq!(cri.status(&id).0, RUNNING);
    assert_eq!(
        c.pids_matching("kata-topo-daemon"),
        wrapper,
        "the same wrapper serves on"
    );
    cri.update(&id, &res.on("0")).expect("audit forwards");
    let updated = |l: &serde_json::Value| l["rule"] == "vfio-remote" && l["operation"] == "update";
    assert!(
        c.findings_when(Duration::from_secs(10), |f| f.iter().any(updated))
            .iter()
            .any(updated),
        "an update after the restart is still checked: {:#?}",
        c.log_lines()
    );
    assert_eq!(cri.allowed_cpus(&id), "0");
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn malformed_configuration_fails_pod_start_naming_the_key() {
    let c = Containerd::start(Guard {
        extra: "mood = \"audit\"".into(),
        ..Guard::default()
    });
    let mut cri = c.cri();
    let cfg = cri.pod_config("misconfigured", &[]);
    let err = cri.run_pod(&cfg, "kata-topo").expect_err("start must fail");
    assert!(err.message().contains("mood"), "{err:?}");
    assert!(err.message().contains("topology_guard"), "{err:?}");
    let out = c.ctr(&["run", "--rm", "--runtime", KT, BUSYBOX, "x", "true"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("mood"));
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn unreadable_topology_is_check_failed_and_the_pod_runs() {
    let c = Containerd::start(Guard {
        topology_xml: Some("/nonexistent/host.xml".into()),
        ..Guard::default()
    });
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("blind", &[], false);
    let res = Resources::admitted();
    cri.update(&id, &res.on("0")).expect("forwarded");
    assert_eq!(cri.status(&id).0, RUNNING);
    let failed: Vec<_> = c
        .findings_when(Duration::from_secs(10), |f| {
            f.iter().any(|l| l["rule"] == "check-failed")
        })
        .into_iter()
        .filter(|l| l["rule"] == "check-failed")
        .collect();
    assert!(!failed.is_empty(), "{:#?}", c.log_lines());
    assert!(failed[0]["msg"]
        .as_str()
        .unwrap_or_default()
        .contains("/nonexistent/host.xml"));
    assert_eq!(failed[0]["severity"], "warning");
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// containerd gives `<shim> delete` 5 s (`io.containerd.timeout.shim.cleanup`) and kills it
/// after that. An exiting delegate still accepts connections into its listen backlog, so a
/// `delete` that judged liveness by `connect()` waited on RPCs nobody would answer.
#[test]
fn delete_is_never_killed_by_containerd() {
    let c = Containerd::start(Guard::default());
    for i in 0..200 {
        let id = format!("rm-{i}");
        let out = c.ctr(&["run", "--rm", "--runtime", KT, BUSYBOX, &id, "true"]);
        assert!(
            out.status.success(),
            "run {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let log = c.containerd_log();
    let killed: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed to delete"))
        .collect();
    assert!(killed.is_empty(), "{killed:#?}");
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// Runs `f` on a thread and fails the test if it has not finished within `limit`: a guard
/// against a hang, not a timing.
fn within<T: Send + 'static>(
    limit: Duration,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"))
}

/// The wrapper's log is a FIFO that is open but never read (as journald's full queue or a hung
/// filesystem would be): lines are dropped and counted, and every update is still answered.
#[test]
fn a_log_nobody_reads_never_stalls_an_update() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let fifo = tmp.path().join("kata-topo.log");
    mkfifo(&fifo);
    // Held open for reading and never read.
    let _held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("hold the FIFO");
    let c = Containerd::start(Guard {
        log_file: Some(fifo.clone()),
        metrics: true,
        ..Guard::default()
    });
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("fifo", &[("kata-topo.io/numa-nodes", "1")], true);
    let (cri, id) = within(Duration::from_secs(300), "150 updates", move || {
        let res = Resources::admitted();
        for i in 0..150 {
            // Crossing, then back: every crossing is a new finding to log.
            let cpus = if i % 2 == 0 { "0" } else { "1" };
            cri.update(&id, &res.on(cpus))
                .unwrap_or_else(|e| panic!("update {i}: {e:?}"));
        }
        (cri, id)
    });
    let mut cri = cri;
    assert_eq!(cri.status(&id).0, RUNNING);
    let dropped = eventually(Duration::from_secs(15), || {
        c.metric("kata_topo_sink_dropped_total", "sink=\"log\"") > 0.0
    });
    assert!(dropped, "the dropped lines are counted");
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

fn mkfifo(path: &std::path::Path) {
    let ok = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(ok.success());
}

/// A tmpfs mounted for the test and unmounted when it ends.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(path: std::path::PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&path).expect("mount point");
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .status()
            .expect("mount");
        assert!(ok.success(), "mount tmpfs at {}", path.display());
        Self(path)
    }

    /// Fills it up: a file grows until the filesystem says it is full.
    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.0.join("filler")).expect("filler");
        let block = vec![0u8; 64 * 1024];
        loop {
            if f.write_all(&block).is_err() {
                break;
            }
        }
        assert!(
            std::fs::write(self.0.join("probe"), b"x").is_err(),
            "the filesystem is full"
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// Task records live in memory: a container created while `state_dir` is full is still
/// known, and enforce mode still refuses a cross-NUMA cpuset push for it.
#[test]
fn a_full_state_disk_does_not_switch_enforcement_off() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let state = Tmpfs::mount(tmp.path().join("state"), "256k");
    let c = Containerd::start(Guard {
        state_dir: Some(state.0.clone()),
        ..Guard::default()
    });
    let mut cri = c.cri();
    let cfg = cri.pod_config(
        "full",
        &[
            ("kata-topo.io/mode", "enforce"),
            ("kata-topo.io/numa-nodes", "1"),
        ],
    );
    let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
    state.fill();
    let id = cri
        .start_container(&pod, &cfg, "app", &Resources::admitted(), true)
        .expect("StartContainer on a full state disk");
    let err = cri
        .update(&id, &Resources::admitted().on("0"))
        .expect_err("enforce refuses the crossing push");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(cri.allowed_cpus(&id), "1");
    assert!(
        c.log_lines().iter().any(|l| l["event"] == "state-failed"),
        "the failed writes are reported: {:#?}",
        c.log_lines()
    );
    cri.remove_pod(&pod);
    let _ = std::fs::remove_file(state.0.join("filler"));
    let _ = std::fs::remove_file(state.0.join("probe"));
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// Symlinks planted where the wrapper writes — the metrics file, its old temporary name, the
/// log file — are never written through.
#[test]
fn planted_symlinks_are_never_followed() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, "precious").expect("victim");
    let log = tmp.path().join("kata-topo.log");
    std::os::unix::fs::symlink(&victim, &log).expect("plant the log");
    let c = Containerd::start(Guard {
        metrics: true,
        log_file: Some(log.clone()),
        ..Guard::default()
    });
    std::fs::create_dir_all(&c.metrics_dir).expect("metrics dir");
    for name in [
        "kata-topo-default-planted.prom",
        ".kata-topo-default-planted.prom.tmp",
    ] {
        std::os::unix::fs::symlink(&victim, c.metrics_dir.join(name)).expect("plant");
    }
    run_bg(&c, "planted");
    let written = eventually(Duration::from_secs(10), || {
        std::fs::symlink_metadata(c.metrics_dir.join("kata-topo-default-planted.prom"))
            .is_ok_and(|m| m.file_type().is_file())
    });
    assert!(written, "the metrics file replaced the planted symlink");
    c.remove_task("planted");
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
    assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
}

/// A raw ttrpc client sends the wrapper a request over 4 MiB, then a valid `State` on the same
/// connection: the first is answered RESOURCE_EXHAUSTED, the second normally.
#[test]
fn an_oversized_request_fails_only_its_stream() {
    use kata_topo_proto::wire::{Client, Frame, Response, TASK_V2, TYPE_REQUEST, TYPE_RESPONSE};
    use prost::Message;
    let c = Containerd::start(Guard::default());
    run_bg(&c, "big");
    let bundle = c
        .dir
        .path()
        .join("state/io.containerd.runtime.v2.task/default/big");
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(bundle.join("kata-topo.json")).expect("kata-topo.json"),
    )
    .expect("JSON");
    let address = info["address"].as_str().expect("address").to_string();
    let path = address.trim_start_matches("unix://").to_string();
    let mut raw = std::os::unix::net::UnixStream::connect(&path).expect("connect");
    raw.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    Frame {
        stream_id: 1,
        kind: TYPE_REQUEST,
        flags: 0,
        payload: vec![0u8; (4 << 20) + 1],
    }
    .write(&mut raw)
    .expect("send the oversized frame");
    let answer = Frame::read(&mut raw).expect("read").expect("an answer");
    assert_eq!((answer.stream_id, answer.kind), (1, TYPE_RESPONSE));
    let status = Response::decode(answer.payload.as_slice()).expect("response");
    assert_eq!(status.code(), 8, "RESOURCE_EXHAUSTED: {status:?}");
    // A State on the same connection, as containerd would send it.
    #[derive(Clone, PartialEq, prost::Message)]
    struct StateRequest {
        #[prost(string, tag = "1")]
        id: String,
    }
    let mut client = Client::from_stream(raw, 3);
    let r = client
        .call(
            TASK_V2,
            "State",
            StateRequest { id: "big".into() }.encode_to_vec(),
            "default",
            std::time::Instant::now() + Duration::from_secs(10),
        )
        .expect("State after the oversized frame");
    assert_eq!(r.code(), 0, "{r:?}");
    drop(client);
    c.remove_task("big");
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// A delegate shim that runs the real one, with a fault at `start`.
fn faulty_delegate(dir: &std::path::Path, fault: &str) -> std::path::PathBuf {
    let script = dir.join("delegate");
    std::fs::write(
        &script,
        format!(
            r#"#!/bin/sh
# The real delegate for everything; at start, after it started: {fault}.
case " $* " in
  *" start "*) ;;
  *) exec containerd-shim-runc-v2 "$@" ;;
esac
out=$(containerd-shim-runc-v2 "$@") || exit $?
case "{fault}" in
  garbled) printf 'not an address' ;;
  daemon-dies)
    # This containerd's wrapper daemon only: its command line names the same address.
    addr=$(printf ' %s ' "$*" | sed -n 's/.* -address \([^ ]*\) .*/\1/p')
    pkill -9 -f -- "-address $addr .*kata-topo-daemon"
    sleep 0.2
    printf '%s' "$out" ;;
  address-unwritable) rm -f address && mkdir address && printf '%s' "$out" ;;
esac
"#
        ),
    )
    .expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    script
}

/// `start` fails after the delegate started: the delegate it started is stopped, and the
/// wrapper's socket, daemon and state do not outlive the failure.
#[test]
fn a_start_that_fails_after_the_delegate_started_leaves_nothing() {
    for fault in ["garbled", "daemon-dies", "address-unwritable"] {
        let tmp = tempfile::tempdir().expect("tempdir");
        let c = Containerd::start(Guard {
            delegate: Some(faulty_delegate(tmp.path(), fault)),
            ..Guard::default()
        });
        let out = c.ctr(&[
            "run",
            "-d",
            "--runtime",
            KT,
            BUSYBOX,
            "doomed",
            "sleep",
            "60",
        ]);
        assert!(!out.status.success(), "{fault}: start must fail");
        if fault == "daemon-dies" {
            let said = String::from_utf8_lossy(&out.stderr);
            assert!(
                said.contains("the wrapper daemon did not start"),
                "containerd passes on why: {said}"
            );
        }
        let _ = c.ctr(&["container", "delete", "doomed"]);
        assert_eq!(
            c.wait_clean(Duration::from_secs(15)),
            Vec::<String>::new(),
            "{fault}"
        );
    }
}

/// A wrapper daemon whose set-up fails says why on its standard error, which `start` reads
/// and passes on to containerd (the daemon points it at /dev/null once it serves).
#[test]
fn a_daemon_that_cannot_set_up_says_why() {
    let out = std::process::Command::new(
        kata_topo_integration::bin_dir().join("containerd-shim-kata-topo-v2"),
    )
    .args(["-namespace", "default", "-id", "t1", "kata-topo-daemon"])
    .stdin(std::process::Stdio::null())
    .output()
    .expect("run the daemon");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "wrapper daemon: no listening socket (-listen-fd)\n"
    );
}

/// The metrics file of a task run through `ctr` (its pod group is the task id).
fn metrics_file(c: &Containerd, id: &str) -> std::path::PathBuf {
    c.metrics_dir
        .join(kata_topo_sinks::metrics::file_name("default", id))
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// containerd stopped (SIGSTOP) until dropped.
struct Paused(u32);

impl Paused {
    fn containerd(c: &Containerd) -> Self {
        let config = c.dir.path().join("containerd.toml");
        let needle = config.to_string_lossy().into_owned();
        let pid = std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
            })
            .expect("this test's containerd");
        signal(pid, "-STOP");
        Self(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

/// Starts a task whose wrapper writes metrics; waits for its file.
fn run_metered(c: &Containerd, id: &str) -> (u32, u32, u32) {
    std::fs::create_dir_all(&c.metrics_dir).expect("metrics dir");
    let shims = run_bg_with_shims(c, id);
    assert!(
        eventually(Duration::from_secs(10), || std::fs::read_to_string(
            metrics_file(c, id)
        )
        .is_ok_and(|t| t.contains("kata_topo_sandbox_watched"))),
        "the wrapper writes its metrics file"
    );
    (shims.0, shims.1, shims.2)
}

/// SIGTERM (every node shutdown) ends the wrapper daemon: it takes its metrics file with it —
/// a daemon that no longer runs watches nothing — and keeps the pod's state for `delete`,
/// which then stops the delegate.
#[test]
fn a_wrapper_ended_by_sigterm_takes_its_metrics_file_along() {
    let c = Containerd::start(Guard {
        metrics: true,
        ..Guard::default()
    });
    let (pid, delegate, wrapper) = run_metered(&c, "termed");
    {
        // containerd held still: the daemon alone must take the file along (`delete` would
        // otherwise remove it too, right after).
        let _paused = Paused::containerd(&c);
        signal(wrapper, "-TERM");
        assert!(
            eventually(Duration::from_secs(10), || !alive(wrapper)),
            "the wrapper exits on SIGTERM"
        );
        assert!(
            !metrics_file(&c, "termed").exists(),
            "no stale kata_topo_sandbox_watched: {:?}",
            std::fs::read_dir(&c.metrics_dir)
                .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
        );
    }
    assert!(
        eventually(Duration::from_secs(15), || !alive(delegate) && !alive(pid)),
        "delete stopped the delegate: {:?}",
        c.leftover_processes()
    );
    c.remove_task("termed");
    assert_eq!(std::fs::read_dir(&c.metrics_dir).expect("dir").count(), 0);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// SIGKILL leaves the wrapper no chance: the `delete` containerd runs once it notices the
/// dead shim removes the sandbox's metrics file.
#[test]
fn a_wrapper_killed_its_metrics_file_goes_at_delete() {
    let c = Containerd::start(Guard {
        metrics: true,
        ..Guard::default()
    });
    let (pid, delegate, wrapper) = run_metered(&c, "killed");
    kill9(wrapper);
    assert!(
        eventually(Duration::from_secs(15), || !alive(delegate) && !alive(pid)),
        "delete ran and stopped the delegate: {:?}",
        c.leftover_processes()
    );
    assert!(
        eventually(Duration::from_secs(15), || !metrics_file(&c, "killed")
            .exists()),
        "no stale kata_topo_sandbox_watched: {:?}",
        std::fs::read_dir(&c.metrics_dir)
            .map(|d| d.flatten().map(|e| e.file_name()).collect::<Vec<_>>())
    );
    c.remove_task("killed");
    assert_eq!(std::fs::read_dir(&c.metrics_dir).expect("dir").count(), 0);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}
