//! Faults: a delegate or a wrapper killed with SIGKILL, containerd restarted under a running
//! pod, a malformed `[topology_guard]`, an unreadable topology.

use std::time::Duration;

use kata_topo_integration::{alive, eventually, Containerd, Guard, Res, BUSYBOX, RUNNING};

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

fn cleanup_task(c: &Containerd, id: &str) {
    let _ = c.ctr(&["task", "delete", "-f", id]);
    let out = c.ctr(&["container", "delete", id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
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
    cleanup_task(&c, "victim");
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
    cleanup_task(&c, "orphan");
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn containerd_restart_reconnects_through_the_wrapper() {
    let mut c = Containerd::start(Guard::default());
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("survivor", &[("kata-topo.io/numa-nodes", "1")], true);
    let res = Res::admitted();
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
    assert!(
        c.findings()
            .iter()
            .any(|l| l["rule"] == "vfio-remote" && l["operation"] == "update"),
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
    let res = Res::admitted();
    cri.update(&id, &res.on("0")).expect("forwarded");
    assert_eq!(cri.status(&id).0, RUNNING);
    let failed: Vec<_> = c
        .findings()
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
