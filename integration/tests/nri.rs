//! `kata-topo-nri` against the real containerd 2.3.4 with NRI on, pods on the plain `runc`
//! handler (no wrapper): a cross-NUMA resize reported, refused in enforce mode with the message
//! reaching the CRI client, a recreate checked against its baseline, the plugin killed mid-run,
//! containerd restarted, a wedged check answered within the budget. Then the plugin beside the
//! wrapper: a pod on the wrapper's handler is checked once, by the wrapper, while the plugin
//! checks a pod on runc's; and the NRI DaemonSet (`deploy/nri/`) as its process runs on a node.
//!
//! NRI needs containerd 2.x: without `KT_CONTAINERD_BIN`, these tests run on the 2.3.4 that
//! `make containerd2` unpacks under `target/` (and fail, saying so, when it is not there).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kata_topo_integration::{
    bin_dir, eventually, workspace, Container, Containerd, ContainerdBin, Guard, NriPlugin,
    Resources,
};

const POD_ANNOTATIONS: &[(&str, &str)] = &[
    ("kata-topo.io/policy", "single-numa-node"),
    ("kata-topo.io/numa-nodes", "1"),
];

/// Generous: the machine may be busy with other builds.
const DEADLINE: Duration = Duration::from_secs(30);

/// containerd 2.x for this test binary.
fn containerd2() {
    if std::env::var_os("KT_CONTAINERD_BIN").is_none() {
        let dir = workspace().join("target/containerd-2.3.4/bin");
        assert!(
            dir.join("containerd").is_file(),
            "NRI needs containerd 2.x: set KT_CONTAINERD_BIN, or run `make containerd2` for {}",
            dir.display()
        );
        std::env::set_var("KT_CONTAINERD_BIN", dir);
    }
    assert!(
        ContainerdBin::get().is_v2(),
        "NRI needs containerd 2.x, KT_CONTAINERD_BIN has {}",
        ContainerdBin::get().version_text
    );
}

/// A private containerd under this worktree's `target/`.
fn start(guard: Guard) -> Containerd {
    containerd2();
    Containerd::start(Guard {
        under: Some(workspace().join("target/nri-test")),
        ..guard
    })
}

/// The plugin on containerd's NRI socket.
fn plugin(c: &Containerd) -> NriPlugin {
    plugin_with_config(c, &c.config)
}

/// The plugin on its own configuration file.
fn plugin_with_config(c: &Containerd, config: &Path) -> NriPlugin {
    NriPlugin::start(config, &c.nri_socket, &c.dir.path().join("nri.out"))
}

fn events(c: &Containerd, event: &str) -> usize {
    c.log_lines().iter().filter(|l| l["event"] == event).count()
}

/// Waits until the plugin registered `n` times in all.
fn registered(c: &Containerd, n: usize) {
    assert!(
        eventually(DEADLINE, || events(c, "nri-registered") >= n),
        "kata-topo-nri did not register ({n}): {:#?}\ncontainerd: {}",
        c.log_lines(),
        c.containerd_log()
    );
}

fn finding(c: &Containerd, rule: &str, operation: &str) -> Option<serde_json::Value> {
    c.findings()
        .into_iter()
        .find(|l| l["rule"] == rule && l["operation"] == operation)
}

fn nri_lines(c: &Containerd) -> String {
    c.containerd_log()
        .lines()
        .filter(|l| l.contains("kata-topo\\\"") || l.contains("90-kata-topo"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn audit_reports_a_cross_numa_resize_and_keeps_the_pods_state() {
    let c = start(Guard::default());
    // containerd events, as the wrapper publishes them: on containerd's own ttrpc socket.
    let config = c.dir.path().join("nri-events.toml");
    let ttrpc = PathBuf::from(format!("{}.ttrpc", c.socket.display()));
    with_key(&c.config, "nri_events_socket", &ttrpc, &config);
    let _plugin = plugin_with_config(&c, &config);
    registered(&c, 1);
    let events = c.operator_events();
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-audit", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    assert!(c.findings().is_empty(), "clean: {:#?}", c.findings());
    cri.update(&id, &admitted.on("0"))
        .expect("audit lets the update through");
    assert_eq!(cri.allowed_cpus(&id), "0", "runc applied it");
    assert!(
        eventually(DEADLINE, || finding(&c, "cpu-outside-intent", "update")
            .is_some()),
        "the plugin reports the update: {:#?}",
        c.log_lines()
    );
    let line = finding(&c, "cpu-outside-intent", "update").expect("line");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["container_id"], id.as_str());
    assert_eq!(line["pod_name"], "nri-audit");
    assert_eq!(line["pod_namespace"], "ml");
    events
        .wait_for("/kata-topo/mismatch", DEADLINE)
        .expect("the plugin publishes the mismatch on containerd's event service");
    assert!(
        events
            .wait_for("pod=ml/nri-audit", Duration::from_secs(5))
            .is_some()
            && events
                .wait_for("cpu-outside-intent", Duration::from_secs(5))
                .is_some(),
        "the event names the pod and the rule: {:?}",
        events.lines()
    );
    // The state `kata-topo status` reads: the pod's directory, as the wrapper keeps it.
    let pod_dir = c.state_dir.join("k8s.io").join(&pod);
    assert!(
        eventually(DEADLINE, || pod_dir.is_dir()),
        "no state at {}",
        pod_dir.display()
    );
    let status = Command::new(bin_dir().join("kata-topo"))
        .args(["status", "--json", "--state-dir"])
        .arg(&c.state_dir)
        .output()
        .expect("kata-topo status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&pod) && text.contains("cpu-outside-intent"),
        "kata-topo status shows the pod's finding: {text}"
    );
    cri.remove_container(&id);
    cri.remove_pod(&pod);
    assert!(
        eventually(DEADLINE, || !pod_dir.exists()),
        "the pod's state goes with it"
    );
}

#[test]
fn enforce_refuses_the_update_and_the_recreate_with_kata_topos_message() {
    let c = start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-enforce", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    let on0 = admitted.on("0");
    let e = cri.update(&id, &on0).expect_err("enforce refuses");
    assert!(
        e.message()
            .contains("kata-topo refused the update of container app in pod ml/nri-enforce"),
        "the CRI client gets kata-topo's message: {e:?}"
    );
    assert!(e.message().contains("cpu-outside-intent"), "{e:?}");
    assert_eq!(cri.allowed_cpus(&id), "1", "the container kept its CPUs");
    // A resize on the admitted node is allowed.
    let bigger = Resources {
        quota: 150_000,
        ..admitted.clone()
    };
    cri.update(&id, &bigger).expect("a resize on node 1");
    // The container recreated in the running pod, onto node 0: held to its baseline.
    cri.remove_container(&id);
    let again = Container {
        attempt: 1,
        ..Container::new("app", &on0)
    };
    let e = cri
        .create_container_as(&pod, &cfg, &again, false)
        .expect_err("the recreate is refused");
    assert!(
        e.message()
            .contains("kata-topo refused the recreate of container app"),
        "{e:?}"
    );
    let back = Container {
        attempt: 1,
        ..Container::new("app", &admitted)
    };
    let id = cri
        .create_container_as(&pod, &cfg, &back, false)
        .expect("the recreate on its own node");
    cri.start(&id).expect("StartContainer");
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}

#[test]
fn the_plugin_killed_mid_run_costs_no_pod_operation() {
    let c = start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let mut plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-killed", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    plugin.kill();
    // Unchecked now: the update enforce would refuse goes through, and quickly.
    let started = Instant::now();
    cri.update(&id, &admitted.on("0"))
        .expect("no plugin: the update goes on");
    let second = cri
        .start_container(&pod, &cfg, "second", &admitted.on("0"), false)
        .expect("no plugin: a create goes on");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(cri.allowed_cpus(&id), "0");
    eprintln!("containerd on the killed plugin:\n{}", nri_lines(&c));
    // Started again, it registers, is synchronised, and checks again.
    let _plugin = self::plugin(&c);
    registered(&c, 2);
    let e = cri
        .update(&second, &admitted.on("0-1"))
        .expect_err("checked again");
    assert!(e.message().contains("kata-topo refused"), "{e:?}");
    cri.remove_container(&second);
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}

#[test]
fn containerd_restarted_the_plugin_reconnects_and_keeps_the_baselines() {
    let mut c = start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-restart", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    c.restart();
    let mut cri = c.cri();
    assert!(cri.wait_ready(DEADLINE), "CRI after the restart");
    registered(&c, 2);
    assert!(
        events(&c, "nri-disconnected") >= 1,
        "the plugin saw the restart"
    );
    let e = cri
        .update(&id, &admitted.on("0"))
        .expect_err("checked against the baseline from before the restart");
    assert!(e.message().contains("kata-topo refused"), "{e:?}");
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}

#[test]
fn a_wedged_check_is_answered_within_the_budget_and_keeps_the_connection() {
    // A kubelet that accepts and never answers: each check that asks it waits
    // kubelet_timeout_ms, longer than containerd's plugin timeout here (1 s).
    let dir = workspace().join("target/nri-test");
    std::fs::create_dir_all(&dir).expect("dir");
    let hung: PathBuf = dir.join("hung-kubelet.sock");
    let _ = std::fs::remove_file(&hung);
    let _listener = std::os::unix::net::UnixListener::bind(&hung).expect("bind");
    let c = start(Guard {
        mode: "enforce",
        nri_timeout: Some("1s"),
        extra: format!(
            "intent_source = \"kubelet\"\nkubelet_pod_resources_socket = \"{}\"\nkubelet_timeout_ms = 1500",
            hung.display()
        ),
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-wedged", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("a wedged check never fails the create");
    // A resize asks the kubelet again: unchecked, allowed.
    let resize = Resources {
        quota: 150_000,
        ..admitted.on("0")
    };
    cri.update(&id, &resize)
        .expect("a wedged check never fails the update");
    assert!(
        eventually(DEADLINE, || events(&c, "nri-unchecked") >= 2),
        "the log says what went unchecked: {:#?}",
        c.log_lines()
    );
    assert_eq!(
        events(&c, "nri-disconnected"),
        0,
        "containerd kept the plugin: {}",
        nri_lines(&c)
    );
    assert_eq!(events(&c, "nri-registered"), 1);
    cri.remove_container(&id);
    cri.remove_pod(&pod);
    let _ = std::fs::remove_file(&hung);
}

#[test]
fn in_audit_a_wedged_check_is_answered_at_once_and_reported_after() {
    // The hung kubelet above, in audit mode: nothing can be refused, so the plugin answers
    // each request before its check, which then waits kubelet_timeout_ms (longer than
    // containerd's plugin timeout, 1 s) and reports the kubelet it could not read.
    let dir = workspace().join("target/nri-test");
    std::fs::create_dir_all(&dir).expect("dir");
    let hung: PathBuf = dir.join("hung-kubelet-audit.sock");
    let _ = std::fs::remove_file(&hung);
    let _listener = std::os::unix::net::UnixListener::bind(&hung).expect("bind");
    let c = start(Guard {
        nri_timeout: Some("1s"),
        extra: format!(
            "intent_source = \"kubelet\"\nkubelet_pod_resources_socket = \"{}\"\nkubelet_timeout_ms = 1500",
            hung.display()
        ),
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-audit-wedged", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("created");
    let resize = Resources {
        quota: 150_000,
        ..admitted.on("0")
    };
    cri.update(&id, &resize).expect("updated");
    // Each check ran after its answer, to the end: what it could not read is reported.
    assert!(
        eventually(DEADLINE, || c.findings().iter().any(|l| l["rule"]
            == "kubelet-intent-unavailable"
            && l["container_id"] == id.as_str())),
        "the checks' verdicts: {:#?}",
        c.log_lines()
    );
    assert_eq!(
        events(&c, "nri-unchecked"),
        0,
        "no answer waited for its check: {:#?}",
        c.log_lines()
    );
    assert_eq!(
        events(&c, "nri-disconnected"),
        0,
        "containerd kept the plugin: {}",
        nri_lines(&c)
    );
    cri.remove_container(&id);
    cri.remove_pod(&pod);
    let _ = std::fs::remove_file(&hung);
}

#[test]
fn a_stopped_plugin_costs_containerds_timeout_once_then_nothing() {
    let c = start(Guard {
        mode: "enforce",
        nri_timeout: Some("1s"),
        ..Guard::default()
    });
    let plugin = plugin(&c);
    registered(&c, 1);
    let pid = plugin.pid().expect("pid").to_string();
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-stopped", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    // Wedged: the process is there, its socket open, and it answers nothing.
    let stopped = Command::new("kill").args(["-STOP", &pid]).status();
    assert!(stopped.is_ok_and(|s| s.success()), "SIGSTOP");
    cri.update(&id, &admitted.on("0"))
        .expect("containerd's timeout lets the update go on");
    cri.update(&id, &admitted.on("0-1"))
        .expect("the plugin closed: nothing waits for it");
    let log = c.containerd_log();
    assert!(
        log.contains("closing plugin 90-kata-topo"),
        "containerd closes the plugin that timed out: {}",
        nri_lines(&c)
    );
    eprintln!("containerd on the stopped plugin:\n{}", nri_lines(&c));
    let resumed = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(resumed.is_ok_and(|s| s.success()), "SIGCONT");
    // Resumed, it finds its connection closed and registers again.
    registered(&c, 2);
    let e = cri
        .update(&id, &admitted.on("0"))
        .expect_err("checked again");
    assert!(e.message().contains("kata-topo refused"), "{e:?}");
    drop(plugin);
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}

/// The lines of a JSON log file.
fn lines_of(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The finding lines of `rule` about container `id` in a log.
fn findings_about(lines: &[serde_json::Value], rule: &str, id: &str) -> usize {
    lines
        .iter()
        .filter(|l| l["event"] == "finding" && l["rule"] == rule && l["container_id"] == id)
        .count()
}

/// The wrapper's configuration with another `log_file`: the same `state_dir`, where the
/// wrapper's daemons record themselves.
fn with_log_file(config: &Path, log: &Path, out: &Path) {
    with_key(config, "log_file", log, out);
}

/// The configuration at `config` with the path `key` set to `value`, written to `out`.
fn with_key(config: &Path, key: &str, value: &Path, out: &Path) {
    let text = std::fs::read_to_string(config).expect("the wrapper's configuration");
    let mut t: toml::Table = text.parse().expect("TOML");
    let guard = t
        .get_mut("topology_guard")
        .and_then(toml::Value::as_table_mut)
        .expect("[topology_guard]");
    guard.insert(key.into(), value.display().to_string().into());
    std::fs::write(out, t.to_string()).expect("write the plugin's configuration");
}

#[test]
fn a_pod_the_wrapper_serves_is_checked_once_by_the_wrapper_and_a_runc_pod_by_the_plugin() {
    // Audit: every check that runs says so in a log line, none stops the next.
    let c = start(Guard::default());
    // The plugin writes its own log, so that each line says which front end checked; it
    // shares the wrapper's state_dir, where a wrapper daemon records itself.
    let plugin_log = c.dir.path().join("kata-topo-nri.log");
    let plugin_config = c.dir.path().join("kata-topo-nri.toml");
    with_log_file(&c.config, &plugin_log, &plugin_config);
    let _plugin = plugin_with_config(&c, &plugin_config);
    let count = |event: &str| {
        lines_of(&plugin_log)
            .iter()
            .filter(|l| l["event"] == event)
            .count()
    };
    assert!(
        eventually(DEADLINE, || count("nri-registered") >= 1),
        "kata-topo-nri did not register: {:#?}\ncontainerd: {}",
        lines_of(&plugin_log),
        nri_lines(&c)
    );
    let mut cri = c.cri();
    let admitted = Resources::admitted();
    let wcfg = cri.pod_config("nri-once-wrapper", POD_ANNOTATIONS);
    let wpod = cri
        .run_pod(&wcfg, "kata-topo")
        .expect("RunPodSandbox (kata-topo)");
    let wid = cri
        .start_container(&wpod, &wcfg, "app", &admitted, false)
        .expect("StartContainer (kata-topo)");
    let rcfg = cri.pod_config("nri-once-runc", POD_ANNOTATIONS);
    let rpod = cri.run_pod(&rcfg, "runc").expect("RunPodSandbox (runc)");
    let rid = cri
        .start_container(&rpod, &rcfg, "app", &admitted, false)
        .expect("StartContainer (runc)");
    // The same crossing update on both, the wrapper's pod first.
    cri.update(&wid, &admitted.on("0"))
        .expect("audit lets the wrapper's pod's update through");
    cri.update(&rid, &admitted.on("0"))
        .expect("audit lets the runc pod's update through");
    assert_eq!(cri.allowed_cpus(&wid), "0");
    assert_eq!(cri.allowed_cpus(&rid), "0");
    // The runc pod's finding is the plugin's, and it was checked after the wrapper's pod: once
    // it is in the plugin's log, so would be any line of the plugin about the wrapper's pod
    // (one log queue, in order).
    assert!(
        eventually(DEADLINE, || findings_about(
            &lines_of(&plugin_log),
            "cpu-outside-intent",
            &rid
        ) == 1),
        "the plugin checks the runc pod's update: {:#?}",
        lines_of(&plugin_log)
    );
    assert!(
        eventually(DEADLINE, || findings_about(
            &c.log_lines(),
            "cpu-outside-intent",
            &wid
        ) >= 1),
        "the wrapper checks its pod's update: {:#?}",
        c.log_lines()
    );
    let (plugin_lines, wrapper_lines) = (lines_of(&plugin_log), c.log_lines());
    // Once: one finding about the wrapper's pod in both logs together, the wrapper's.
    assert_eq!(
        findings_about(&wrapper_lines, "cpu-outside-intent", &wid)
            + findings_about(&plugin_lines, "cpu-outside-intent", &wid),
        1,
        "the update is reported once: the wrapper's {wrapper_lines:#?}\nthe plugin's {plugin_lines:#?}"
    );
    assert_eq!(
        findings_about(&wrapper_lines, "cpu-outside-intent", &wid),
        1,
        "by the wrapper: {wrapper_lines:#?}"
    );
    let about_wpod: Vec<&serde_json::Value> = plugin_lines
        .iter()
        .filter(|l| l["sandbox_id"] == wpod.as_str() || l["container_id"] == wid.as_str())
        .collect();
    let skipped: Vec<&&serde_json::Value> = about_wpod
        .iter()
        .filter(|l| l["event"] == "nri-pod-skipped")
        .collect();
    assert_eq!(
        skipped.len(),
        1,
        "the plugin says once that it leaves the wrapper's pod: {about_wpod:#?}"
    );
    assert_eq!(skipped[0]["reason"], "the kata-topo wrapper serves it");
    assert_eq!(skipped[0]["runtime_handler"], "kata-topo");
    assert_eq!(skipped[0]["pod_name"], "nri-once-wrapper");
    assert!(
        about_wpod.iter().all(|l| l["event"] == "nri-pod-skipped"),
        "the plugin checked nothing of the wrapper's pod: {about_wpod:#?}"
    );
    // And the contrast: the runc pod is the plugin's alone, never skipped.
    assert_eq!(
        findings_about(&wrapper_lines, "cpu-outside-intent", &rid),
        0,
        "the wrapper does not serve the runc pod: {wrapper_lines:#?}"
    );
    assert!(
        !plugin_lines
            .iter()
            .any(|l| l["event"] == "nri-pod-skipped" && l["sandbox_id"] == rpod.as_str()),
        "the plugin checks the runc pod: {plugin_lines:#?}"
    );
    let line = plugin_lines
        .iter()
        .find(|l| l["event"] == "finding" && l["container_id"] == rid.as_str())
        .expect("the plugin's finding");
    assert_eq!(line["operation"], "update");
    assert_eq!(line["pod_name"], "nri-once-runc");
    for (id, pod) in [(&rid, &rpod), (&wid, &wpod)] {
        cri.remove_container(id);
        cri.remove_pod(pod);
    }
}

/// A YAML file of `deploy/` as its documents.
fn deploy_yaml(rel: &str) -> Vec<serde_yaml::Value> {
    let path = workspace().join("deploy").join(rel);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("YAML document"))
        .collect()
}

fn strings(v: &serde_yaml::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| a.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The NRI DaemonSet (`deploy/nri/`) as a node runs it: its command, its ConfigMap's
/// configuration mounted as the kubelet mounts a ConfigMap (a link into `..data`), each path
/// of that configuration reached through the volume the DaemonSet mounts there, and the
/// process with the privileges its securityContext leaves it (root's uid, no capability, no
/// privilege escalation). Against the real containerd: it registers, checks a runc pod's
/// crossing update (its state, log line and metrics written without a capability), and sees,
/// through the node's /proc at its procfs_root, that a pod's wrapper daemon runs.
#[test]
fn the_nri_daemonset_runs_the_plugin_without_capabilities_on_the_paths_it_mounts() {
    let kustomization = &deploy_yaml("nri/kustomization.yaml")[0];
    let ds = deploy_yaml("nri/daemonset.yaml")
        .into_iter()
        .find(|d| d["kind"].as_str() == Some("DaemonSet"))
        .expect("a DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let sc = &container["securityContext"];
    // What the process below is run with; a manifest asking for more fails here first.
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["runAsUser"].as_u64(), Some(0));
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null(), "no capability added");
    assert_ne!(pod["hostPID"].as_bool(), Some(true), "not the node's PIDs");
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    let volume = |name: &str| {
        volumes
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    // mountPath -> (host path, or None for the ConfigMap; read-only)
    let mounts: Vec<(String, Option<String>, bool)> = container["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let v = volume(m["name"].as_str().expect("name"));
            (
                m["mountPath"].as_str().expect("mountPath").to_string(),
                v["hostPath"]["path"].as_str().map(str::to_string),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    // The container's path `p`: the mount it is under and the rest of it.
    let mount_of = |p: &str| {
        mounts
            .iter()
            .filter(|(at, _, _)| Path::new(p).starts_with(at))
            .max_by_key(|(at, _, _)| at.len())
            .map(|(at, host, ro)| {
                let rest = Path::new(p).strip_prefix(at).expect("under").to_path_buf();
                (host.clone(), rest, *ro)
            })
    };

    // The ConfigMap: the generator's one file, at the path --config names.
    let command = strings(&container["command"]);
    assert!(command.len() >= 3, "{command:?}");
    let config_at = command
        .iter()
        .position(|a| a == "--config")
        .map(|i| command[i + 1].clone())
        .expect("--config FILE");
    let generator = &kustomization["configMapGenerator"][0];
    let file = strings(&generator["files"]).pop().expect("a file");
    let cm = volumes
        .iter()
        .find(|v| v["configMap"]["name"] == generator["name"])
        .expect("the generated ConfigMap is a volume");
    let cm_mount = container["volumeMounts"]
        .as_sequence()
        .expect("mounts")
        .iter()
        .find(|m| m["name"] == cm["name"])
        .expect("mounted");
    assert_eq!(
        Path::new(cm_mount["mountPath"].as_str().expect("path")).join(&file),
        Path::new(&config_at),
        "--config names the ConfigMap's file"
    );

    let c = start(Guard::default());
    let d = c.dir.path();
    // Where each host directory the DaemonSet mounts is on this test's node.
    let metrics = d.join("metrics");
    std::fs::create_dir_all(&metrics).expect("metrics dir");
    let node: Vec<(&str, PathBuf)> = vec![
        (
            "/var/run/nri",
            c.nri_socket.parent().expect("dir").to_path_buf(),
        ),
        ("/run/kata-topo", c.state_dir.clone()),
        ("/var/log", c.log_file.parent().expect("dir").to_path_buf()),
        ("/var/lib/prometheus/node-exporter", metrics.clone()),
        ("/var/lib/kubelet/pod-resources", d.join("pod-resources")),
        (
            "/var/lib/kubelet/config.yaml",
            d.join("kubelet-config.yaml"),
        ),
        ("/sys", c.sysfs.root().to_path_buf()),
        ("/proc", PathBuf::from("/proc")),
    ];
    let text = std::fs::read_to_string(workspace().join("deploy/nri").join(&file)).expect("read");
    let mut table: toml::Table = text.parse().expect("TOML");
    let guard = table
        .get_mut("topology_guard")
        .and_then(toml::Value::as_table_mut)
        .expect("[topology_guard]");
    let mut mapped = Vec::new();
    for (key, value) in guard.iter_mut() {
        let Some(p) = value
            .as_str()
            .filter(|p| p.starts_with('/'))
            .map(str::to_string)
        else {
            continue;
        };
        let (host, rest, read_only) = mount_of(&p)
            .unwrap_or_else(|| panic!("{key} = {p:?} is on no volume the DaemonSet mounts"));
        let host = host.unwrap_or_else(|| panic!("{key} = {p:?} is in the ConfigMap"));
        let written = matches!(key.as_str(), "state_dir" | "log_file" | "metrics_dir");
        assert_eq!(
            read_only, !written,
            "{key}: {p} is mounted read-only: {read_only}"
        );
        let (_, here) = node
            .iter()
            .find(|(h, _)| *h == host)
            .unwrap_or_else(|| panic!("{key}: the test does not know the host path {host}"));
        let here = if rest.as_os_str().is_empty() {
            here.clone()
        } else {
            here.join(rest)
        };
        *value = here.display().to_string().into();
        mapped.push(key.clone());
    }
    for key in [
        "nri_socket",
        "state_dir",
        "log_file",
        "metrics_dir",
        "sysfs_root",
        "procfs_root",
        "kubelet_pod_resources_socket",
        "kubelet_config",
    ] {
        assert!(
            mapped.iter().any(|k| k == key),
            "the configuration sets {key}: {mapped:?}"
        );
    }
    // The scenario's host, as every test here checks against.
    guard.insert(
        "topology_xml".into(),
        workspace()
            .join("scenario/two-node-host.xml")
            .display()
            .to_string()
            .into(),
    );
    // The kubelet's way with a ConfigMap: the file a link into `..data`.
    let cm_dir = d.join("configmap");
    std::fs::create_dir_all(cm_dir.join("..data")).expect("configmap dir");
    std::fs::write(cm_dir.join("..data").join(&file), table.to_string()).expect("write");
    std::os::unix::fs::symlink(Path::new("..data").join(&file), cm_dir.join(&file)).expect("link");
    let binary = bin_dir().join(
        Path::new(&command[0])
            .file_name()
            .expect("the command's binary"),
    );
    let out = std::fs::File::create(d.join("nri.out")).expect("nri.out");
    let args: Vec<String> = command[1..]
        .iter()
        .map(|a| {
            if *a == config_at {
                cm_dir.join(&file).display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    // The container's environment, as the runtime sets it.
    let env: Vec<(String, String)> = container["env"]
        .as_sequence()
        .map(|e| {
            e.iter()
                .map(|v| {
                    let s = |k: &str| v[k].as_str().expect("a name and a value").to_string();
                    (s("name"), s("value"))
                })
                .collect()
        })
        .unwrap_or_default();
    // drop: [ALL] and allowPrivilegeEscalation: false, as the runtime applies them.
    let child = Command::new("setpriv")
        .args([
            "--no-new-privs",
            "--inh-caps=-all",
            "--ambient-caps=-all",
            "--bounding-set=-all",
            "--",
        ])
        .arg(&binary)
        .args(&args)
        .envs(env)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("nri.out"))
        .stderr(out)
        .spawn()
        .expect("setpriv kata-topo-nri");
    let plugin = NriPlugin::from(child);
    registered(&c, 1);
    let pid = plugin.pid().expect("pid");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    for field in ["CapEff:", "CapPrm:", "CapBnd:"] {
        let line = status
            .lines()
            .find(|l| l.starts_with(field))
            .unwrap_or_else(|| panic!("{field}"));
        assert!(
            line.ends_with("0000000000000000"),
            "the plugin holds no capability: {line}"
        );
    }
    let started = c
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "nri-started")
        .expect("nri-started");
    assert_eq!(started["config_source"], "ConfigPath");

    let mut cri = c.cri();
    let admitted = Resources::admitted();
    let rcfg = cri.pod_config("nri-ds-runc", POD_ANNOTATIONS);
    let rpod = cri.run_pod(&rcfg, "runc").expect("RunPodSandbox (runc)");
    let rid = cri
        .start_container(&rpod, &rcfg, "app", &admitted, false)
        .expect("StartContainer (runc)");
    cri.update(&rid, &admitted.on("0")).expect("audit");
    assert!(
        eventually(DEADLINE, || findings_about(
            &c.log_lines(),
            "cpu-outside-intent",
            &rid
        ) == 1),
        "the plugin reports the runc pod's update: {:#?}",
        c.log_lines()
    );
    let pod_state = c.state_dir.join("k8s.io").join(&rpod);
    assert!(
        eventually(DEADLINE, || pod_state.is_dir()),
        "the pod's state at {}",
        pod_state.display()
    );
    let textfiles = || {
        std::fs::read_dir(&metrics)
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.contains(&rpod) && n.ends_with(".prom"))
                    .count()
            })
            .unwrap_or(0)
    };
    assert!(
        eventually(DEADLINE, || textfiles() == 1),
        "the pod's metrics in {}",
        metrics.display()
    );
    // A pod the wrapper serves: its daemon seen through procfs_root, the pod left to it.
    let wcfg = cri.pod_config("nri-ds-wrapper", POD_ANNOTATIONS);
    let wpod = cri
        .run_pod(&wcfg, "kata-topo")
        .expect("RunPodSandbox (kata-topo)");
    let wid = cri
        .start_container(&wpod, &wcfg, "app", &admitted, false)
        .expect("StartContainer (kata-topo)");
    assert!(
        eventually(DEADLINE, || c
            .log_lines()
            .iter()
            .any(|l| l["event"] == "nri-pod-skipped"
                && l["sandbox_id"] == wpod.as_str()
                && l["reason"] == "the kata-topo wrapper serves it")),
        "the plugin leaves the wrapper's pod to it: {:#?}",
        c.log_lines()
    );
    drop(plugin);
    for (id, pod) in [(&rid, &rpod), (&wid, &wpod)] {
        cri.remove_container(id);
        cri.remove_pod(pod);
    }
}
