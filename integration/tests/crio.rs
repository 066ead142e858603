//! `kata-topo-nri` against a real CRI-O 1.34 with NRI on (`make crio-test`), pods on its
//! `runc` handler: the NRI story of `tests/nri.rs` on the other runtime. A cross-NUMA resize
//! reported; the same refused in enforce mode with kata-topo's message reaching the CRI
//! client; a recreate in the running pod held to its baseline; the plugin killed, stopped,
//! and CRI-O restarted under it. What CRI-O answers, says and does is printed (`--nocapture`
//! shows it) and asserted.
//!
//! Each test's name starts with `crio_`: `make integration`, which runs every other test of
//! this crate against containerd, leaves them out (`--skip crio_`) and says so; `make
//! crio-test` runs them. Run alone, they build CRI-O first (`crio/build.sh`, cached) and fail,
//! saying why, when something they need is missing.

use std::process::Command;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use kata_topo_integration::{
    bin_dir, crio_version, eventually, Container, Cri, Crio, Guard, NriPlugin, Resources,
};

const POD_ANNOTATIONS: &[(&str, &str)] = &[
    ("kata-topo.io/policy", "single-numa-node"),
    ("kata-topo.io/numa-nodes", "1"),
];

/// Generous: the machine may be busy with other builds.
const DEADLINE: Duration = Duration::from_secs(30);

/// A pod's configuration as the kubelet sends it for a pod that does not share its process
/// namespace (`shareProcessNamespace` unset): each container its own PID namespace. CRI-O then
/// runs no infra container (`drop_infra_ctr`, its default): one would be given an
/// `oom_score_adj` of -998, which a runtime without `CAP_SYS_RESOURCE` (as in an unprivileged
/// container) cannot set, and CRI-O has no setting to clamp it (containerd's
/// `restrict_oom_score_adj`). Its cgroups under the fixture's [`Crio::cgroup_parent`].
fn pod_config(c: &Crio, client: &Cri, name: &str) -> cri::PodSandboxConfig {
    let mut cfg = client.pod_config(name, POD_ANNOTATIONS);
    if let Some(linux) = cfg.linux.as_mut() {
        linux.cgroup_parent = c.cgroup_parent();
    }
    if let Some(ns) = cfg
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
    {
        ns.pid = cri::NamespaceMode::Container as i32;
    }
    cfg
}

/// The plugin on the CRI-O's NRI socket.
fn plugin(c: &Crio) -> NriPlugin {
    NriPlugin::start(&c.config, &c.nri_socket, &c.dir.path().join("nri.out"))
}

fn events(c: &Crio, event: &str) -> usize {
    c.log_lines().iter().filter(|l| l["event"] == event).count()
}

/// Waits until the plugin registered `n` times in all.
fn registered(c: &Crio, n: usize) {
    assert!(
        eventually(DEADLINE, || events(c, "nri-registered") >= n),
        "kata-topo-nri did not register with CRI-O ({n}): {:#?}\nplugin: {}\nCRI-O: {}",
        c.log_lines(),
        std::fs::read_to_string(c.dir.path().join("nri.out")).unwrap_or_default(),
        nri_lines(c)
    );
}

fn finding(c: &Crio, rule: &str, operation: &str) -> Option<serde_json::Value> {
    c.findings()
        .into_iter()
        .find(|l| l["rule"] == rule && l["operation"] == operation)
}

/// CRI-O's log lines about NRI and the plugin.
fn nri_lines(c: &Crio) -> String {
    c.crio_log()
        .lines()
        .filter(|l| {
            l.contains("kata-topo")
                || l.contains("NRI")
                || l.contains("nri")
                || l.contains("plugin")
        })
        .filter(|l| !l.contains("Current CRI-O configuration") && !l.contains("FLAG:"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn crio_audit_reports_a_cross_numa_resize_and_keeps_the_pods_state() {
    let c = Crio::start(Guard::default());
    eprintln!("{}", crio_version());
    let _plugin = plugin(&c);
    registered(&c, 1);
    // What CRI-O tells the plugin in Configure.
    let configured = c
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "nri-configured")
        .expect("nri-configured");
    eprintln!(
        "CRI-O configures the plugin: runtime {:?}, nri_version {:?}, request_timeout_ms {}",
        configured["runtime"], configured["nri_version"], configured["request_timeout_ms"]
    );
    assert!(
        configured["runtime"]
            .as_str()
            .is_some_and(|r| r.starts_with("cri-o 1.34")),
        "{configured}"
    );
    let mut cri = c.cri();
    let cfg = pod_config(&c, &cri, "crio-audit");
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    assert_eq!(cri.allowed_cpus(&id), "1", "runc started it on CPU 1");
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
    eprintln!("the finding: {line}");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["container_id"], id.as_str());
    assert_eq!(line["pod_name"], "crio-audit");
    assert_eq!(line["pod_namespace"], "ml");
    // The state `kata-topo status` reads.
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
fn crio_enforce_refuses_the_update_and_the_recreate_with_kata_topos_message() {
    let c = Crio::start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = pod_config(&c, &cri, "crio-enforce");
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    let on0 = admitted.on("0");
    let e = cri.update(&id, &on0).expect_err("enforce refuses");
    eprintln!(
        "CRI-O answers the refused update: code {:?}, message {:?}",
        e.code(),
        e.message()
    );
    assert_eq!(
        e.code(),
        tonic::Code::FailedPrecondition,
        "the plugin's code: {e:?}"
    );
    // The plugin's message as it is: containerd puts its own words before it.
    assert!(
        e.message().starts_with("kata-topo refused the update"),
        "{e:?}"
    );
    assert!(
        e.message()
            .contains("kata-topo refused the update of container app in pod ml/crio-enforce"),
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
    eprintln!(
        "CRI-O answers the refused recreate: code {:?}, message {:?}",
        e.code(),
        e.message()
    );
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(
        e.message()
            .starts_with("kata-topo refused the recreate of container app"),
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
    assert_eq!(cri.allowed_cpus(&id), "1");
    assert_eq!(
        events(&c, "nri-registered"),
        1,
        "the plugin stayed connected"
    );
    eprintln!("CRI-O on the refusals:\n{}", nri_lines(&c));
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}

#[test]
fn crio_the_plugin_killed_mid_run_costs_no_pod_operation() {
    let c = Crio::start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let mut plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = pod_config(&c, &cri, "crio-killed");
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
    eprintln!(
        "with the plugin killed, an update and a create took {:?}",
        started.elapsed()
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(cri.allowed_cpus(&id), "0");
    eprintln!("CRI-O on the killed plugin:\n{}", nri_lines(&c));
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
fn crio_a_stopped_plugin_costs_the_request_timeout_once_then_nothing() {
    let c = Crio::start(Guard {
        mode: "enforce",
        nri_timeout: Some("1s"),
        ..Guard::default()
    });
    let plugin = plugin(&c);
    registered(&c, 1);
    let pid = plugin.pid().expect("pid").to_string();
    let mut cri = c.cri();
    let cfg = pod_config(&c, &cri, "crio-stopped");
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    // Wedged: the process is there, its socket open, and it answers nothing.
    let stopped = Command::new("kill").args(["-STOP", &pid]).status();
    assert!(stopped.is_ok_and(|s| s.success()), "SIGSTOP");
    let started = Instant::now();
    let first = cri.update(&id, &admitted.on("0"));
    let first_took = started.elapsed();
    let started = Instant::now();
    let second = cri.update(&id, &admitted.on("0-1"));
    let second_took = started.elapsed();
    eprintln!(
        "the plugin stopped: the first update {first:?} in {first_took:?}, the second {second:?} in {second_took:?}"
    );
    eprintln!("CRI-O on the stopped plugin:\n{}", nri_lines(&c));
    first.expect("CRI-O's timeout lets the update go on");
    second.expect("the plugin closed: nothing waits for it");
    assert!(
        first_took >= Duration::from_millis(900),
        "the first waits the timeout: {first_took:?}"
    );
    assert!(
        second_took < Duration::from_millis(900),
        "the second does not: {second_took:?}"
    );
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

#[test]
fn crio_restarted_the_plugin_reconnects_and_keeps_the_baselines() {
    let mut c = Crio::start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let _plugin = plugin(&c);
    registered(&c, 1);
    let mut cri = c.cri();
    let cfg = pod_config(&c, &cri, "crio-restart");
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
    assert_eq!(cri.allowed_cpus(&id), "1", "the container ran on");
    let e = cri
        .update(&id, &admitted.on("0"))
        .expect_err("checked against the baseline from before the restart");
    assert!(e.message().contains("kata-topo refused"), "{e:?}");
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}
