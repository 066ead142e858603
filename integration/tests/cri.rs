//! A CRI client playing the kubelet against containerd with the `kata-topo` runtime handler.

use std::time::Duration;

use kata_topo_integration::{Containerd, Guard, Resources, EXITED, RUNNING};

const POD_ANNOTATIONS: &[(&str, &str)] = &[
    ("kata-topo.io/policy", "single-numa-node"),
    ("kata-topo.io/numa-nodes", "1"),
];

fn rules_in(findings: &[serde_json::Value], operation: &str) -> Vec<String> {
    let mut r: Vec<String> = findings
        .iter()
        .filter(|l| l["operation"] == operation)
        .map(|l| l["rule"].as_str().unwrap_or_default().to_string())
        .collect();
    r.sort();
    r.dedup();
    r
}

/// The rules logged for `operation` once they are `want` (the log is written off the request
/// path), or as they are after 10 s.
fn rules_of(c: &Containerd, operation: &str, want: &[&str]) -> Vec<String> {
    let found = c.findings_when(Duration::from_secs(10), |f| rules_in(f, operation) == want);
    rules_in(&found, operation)
}

#[test]
fn audit_resize_stays_clean_cpuset_push_is_reported_recreate_is_checked() {
    let c = Containerd::start(Guard::default());
    let events = c.operator_events();
    let mut cri = c.cri();
    let cfg = cri.pod_config("trainer-pod", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
    let on_node1 = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "trainer", &on_node1, true)
        .expect("StartContainer");
    assert_eq!(cri.allowed_cpus(&id), "1");
    assert!(
        c.findings().is_empty(),
        "admission is clean: {:#?}",
        c.findings()
    );

    // In-place resize on the same node: allowed, nothing reported.
    let resized = Resources {
        quota: 150_000,
        memory: 512 << 20,
        ..on_node1.clone()
    };
    cri.update(&id, &resized).expect("resize");
    assert!(c.findings().is_empty(), "{:#?}", c.findings());

    // CPU-manager push onto node 0: allowed in audit, reported.
    let on_node0 = resized.on("0");
    cri.update(&id, &on_node0).expect("audit forwards the push");
    assert_eq!(cri.allowed_cpus(&id), "0", "the delegate applied it");
    assert_eq!(
        rules_of(&c, "update", &["cpu-outside-intent", "vfio-remote"]),
        vec!["cpu-outside-intent", "vfio-remote"]
    );
    let line = c
        .findings()
        .into_iter()
        .find(|l| l["rule"] == "vfio-remote")
        .expect("vfio-remote line");
    assert_eq!(line["level"], "warn");
    assert_eq!(line["decision"], "allow");
    assert_eq!(line["class"], "cpuset");
    assert_eq!(line["pod_name"], "trainer-pod");
    assert_eq!(line["pod_namespace"], "ml");
    assert_eq!(line["container_id"], id.as_str());
    // containerd 1.x: `ctr events` prints the StringValue on one line; 2.x: `kata-topo events`
    // prints the topic, then a line per finding.
    events
        .wait_for("/kata-topo/mismatch", Duration::from_secs(10))
        .expect("the operator's event reader prints the mismatch");
    assert!(
        events
            .wait_for("vfio-remote", Duration::from_secs(5))
            .is_some(),
        "{:?}",
        events.lines()
    );

    // The reconcile loop pushes the same cpuset again: not re-announced.
    let before = c.findings().len();
    cri.update(&id, &on_node0).expect("repeat");
    assert_eq!(
        c.findings().len(),
        before,
        "identical findings are suppressed"
    );

    // Recreate in the running pod with a cpuset that spans both nodes: checked against the
    // baseline, allowed in audit.
    cri.remove_container(&id);
    let spanning = on_node1.on("0-1");
    let again = cri
        .start_container(&pod, &cfg, "trainer", &spanning, true)
        .expect("recreate");
    assert_eq!(
        rules_of(&c, "recreate", &["cpu-outside-intent", "cpu-spans-numa"]),
        vec!["cpu-outside-intent", "cpu-spans-numa"]
    );
    cri.remove_container(&again);
    cri.remove_pod(&pod);
    drop(events);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn enforce_refuses_the_crossing_update_and_the_container_keeps_running() {
    let c = Containerd::start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let mut cri = c.cri();
    let cfg = cri.pod_config("strict-pod", POD_ANNOTATIONS);
    let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
    let on_node1 = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "trainer", &on_node1, true)
        .expect("StartContainer");
    // Staying on node 1 passes in enforce mode too.
    cri.update(
        &id,
        &Resources {
            quota: 200_000,
            ..on_node1.clone()
        },
    )
    .expect("resize on the same node");

    let err = cri
        .update(&id, &on_node1.on("0"))
        .expect_err("enforce refuses the push");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    let message = err.message();
    for needle in [
        "vfio-remote",
        "cpu-outside-intent",
        "ml/strict-pod",
        "expected",
        "found",
    ] {
        assert!(message.contains(needle), "{needle} missing from {message}");
    }
    let (state, info) = cri.status(&id);
    assert_eq!(state, RUNNING);
    assert_eq!(
        cri.allowed_cpus(&id),
        "1",
        "the kernel still runs it on CPU 1"
    );
    assert_eq!(
        info["runtimeSpec"]["linux"]["resources"]["cpu"]["cpus"],
        "1"
    );
    let refused = c
        .findings_when(Duration::from_secs(10), |f| {
            f.iter().any(|l| l["decision"] == "reject")
        })
        .into_iter()
        .find(|l| l["decision"] == "reject")
        .expect("a reject line");
    assert_eq!(refused["level"], "error");

    // A recreate that crosses nodes is refused at start; the pod stays.
    cri.remove_container(&id);
    let refused = cri
        .create_container(&pod, &cfg, "trainer", &on_node1.on("0"), true)
        .expect("CreateContainer");
    let err = cri.start(&refused).expect_err("recreate refused at start");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert_eq!(
        cri.status(&refused).0,
        EXITED,
        "left EXITED, as CRI does with a start error"
    );
    cri.remove_container(&refused);
    let ok = cri
        .start_container(&pod, &cfg, "trainer", &on_node1, true)
        .expect("a recreate on its node is fine");
    assert_eq!(cri.allowed_cpus(&ok), "1");
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// The node's `mode = "enforce"` is the operator's, not the tenant's: a pod annotated
/// `kata-topo.io/mode: audit` and `kata-topo.io/policy: none` (under the default
/// `pod_overrides = "stricter-only"`) still has its cross-node cpuset push refused, the
/// container keeps its CPU, and the log names each ignored annotation.
#[test]
fn a_pod_annotated_audit_on_an_enforce_node_is_still_refused() {
    let c = Containerd::start(Guard {
        mode: "enforce",
        ..Guard::default()
    });
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit(
        "tenant-pod",
        &[
            ("kata-topo.io/mode", "audit"),
            ("kata-topo.io/policy", "none"),
        ],
        true,
    );
    let err = cri
        .update(&id, &Resources::admitted().on("0"))
        .expect_err("the node's enforce mode refuses the push");
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("mode enforce"), "{}", err.message());
    assert_eq!(
        cri.allowed_cpus(&id),
        "1",
        "the kernel still runs it on CPU 1"
    );
    let override_line = |l: &serde_json::Value, annotation: &str| {
        l["rule"] == "override-ignored"
            && l["observed"]["annotation"] == annotation
            && l["operation"] == "update"
    };
    let findings = c.findings_when(Duration::from_secs(10), |f| {
        ["kata-topo.io/mode", "kata-topo.io/policy"]
            .iter()
            .all(|a| f.iter().any(|l| override_line(l, a)))
    });
    for annotation in ["kata-topo.io/mode", "kata-topo.io/policy"] {
        let line = findings
            .iter()
            .find(|l| {
                l["rule"] == "override-ignored"
                    && l["observed"]["annotation"] == annotation
                    && l["operation"] == "update"
            })
            .unwrap_or_else(|| panic!("no override-ignored line for {annotation}: {findings:#?}"));
        assert_eq!(line["severity"], "warning");
        assert_eq!(line["decision"], "reject");
        assert_eq!(line["mode"], "enforce");
    }
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn two_pods_and_fifty_concurrent_updates() {
    let c = Containerd::start(Guard::default());
    let mut cri = c.cri();
    let res = Resources::admitted();
    let mut pods = Vec::new();
    for name in ["pod-a", "pod-b"] {
        let cfg = cri.pod_config(name, POD_ANNOTATIONS);
        let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
        let id = cri
            .start_container(&pod, &cfg, "app", &res, false)
            .expect("StartContainer");
        pods.push((pod, id));
    }
    let target = pods[0].1.clone();
    let client = cri.client.clone();
    let results: Vec<Result<(), tonic::Status>> = cri.block(async move {
        let mut handles = Vec::new();
        for i in 0..50i64 {
            let mut client = client.clone();
            let id = target.clone();
            handles.push(tokio::spawn(async move {
                let req = k8s_cri::v1::UpdateContainerResourcesRequest {
                    container_id: id,
                    linux: Some(k8s_cri::v1::LinuxContainerResources {
                        cpu_period: 100_000,
                        cpu_quota: 100_000 + i * 1000,
                        cpu_shares: 1024,
                        memory_limit_in_bytes: 256 << 20,
                        cpuset_cpus: if i % 2 == 0 { "1" } else { "0" }.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                };
                client.update_container_resources(req).await.map(|_| ())
            }));
        }
        let mut out = Vec::new();
        for h in handles {
            out.push(h.await.expect("join"));
        }
        out
    });
    assert_eq!(results.len(), 50);
    for r in &results {
        assert!(r.is_ok(), "{r:?}");
    }
    // Every crossing update was checked (audit), the other pod untouched.
    let findings = c.findings_when(Duration::from_secs(10), |f| !f.is_empty());
    assert!(findings
        .iter()
        .all(|l| l["container_id"] == pods[0].1.as_str()));
    assert!(!findings.is_empty());
    let (state, _) = cri.status(&pods[1].1);
    assert_eq!(state, RUNNING);
    for (pod, _) in &pods {
        cri.remove_pod(pod);
    }
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}
