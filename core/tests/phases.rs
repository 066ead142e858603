//! The core's entry points, one per phase (admit, recreate, update, observe), and the verdict
//! of a request that could not run: each verdict is finished when it comes out — its ids from
//! the request, the rules its phase reports, a stale host said, the decision made last.

use kata_topo_core::check::{could_not_run, Unread, Update};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::testutil::*;
use kata_topo_core::{
    Checker, ContainerSpec, Decision, Defaults, Mode, Operation, Phase, PodOverrides, Request,
    Rule, Running, UpdateClass, Verdict,
};
use serde_json::json;

const DGX2: &str = "nvidiaDGX2.xml";

/// In enforce mode, held to node 0 (the DGX-2 fixture's CPUs 0-1 are on node 0, 24-25 on 1).
fn on_node_0(cpus: &str) -> ContainerSpec {
    spec()
        .cpus(cpus)
        .nodes("0")
        .annotation("kata-topo.io/mode", "enforce")
        .build()
}

fn found(v: &Verdict) -> Vec<Rule> {
    v.findings.iter().map(|f| f.rule).collect()
}

#[test]
fn each_phase_names_its_operation_and_the_request() {
    let host = host(DGX2);
    let checker = Checker::new(&host, None, defaults());
    let s = on_node_0("0-1");
    let req = Request {
        container_id: Some("c-1"),
        ..Request::new(&s)
    };
    let baseline = checker.record_baseline(&s);
    let running = Running {
        baseline: Some(&baseline),
        ..Running::default()
    };
    let push = resources(json!({"cpu": {"cpus": "1"}}));
    let sandbox = spec().sandbox().build();
    let cases = [
        (checker.admit(&req), Operation::Create, None),
        (
            checker.admit(&Request::new(&sandbox)),
            Operation::Sandbox,
            None,
        ),
        (checker.recreate(&req, &baseline), Operation::Recreate, None),
        (
            checker.update(&req, running, &push),
            Operation::Update,
            Some(UpdateClass::Cpuset),
        ),
        (
            checker.observe(&req, running, &vm_view(700, &["0", "1"])),
            Operation::Update,
            Some(UpdateClass::Noop),
        ),
    ];
    for (i, (v, operation, class)) in cases.into_iter().enumerate() {
        assert_eq!((v.operation, v.class), (operation, class), "case {i}");
        assert!(v.findings.is_empty(), "case {i}: {:?}", v.findings);
        assert_eq!(v.decision(), Decision::Allow, "case {i}");
        assert_eq!(v.sandbox_id.as_deref(), Some("sb-1"), "case {i}");
        if operation != Operation::Sandbox {
            assert_eq!(v.container_id.as_deref(), Some("c-1"), "case {i}");
            assert_eq!(v.container_name.as_deref(), Some("trainer"), "case {i}");
            assert_eq!(v.mode, Mode::Enforce, "case {i}");
        }
    }
}

#[test]
fn an_update_judges_the_request_and_observe_what_the_vm_does() {
    let host = host(DGX2);
    let checker = Checker::new(&host, None, defaults());
    let s = on_node_0("0-1");
    // The VM's vCPUs already float onto node 1; the update moves the cpuset there too.
    let floating = vm_view(700, &["0", "24", "24"]);
    let req = Request::new(&s);
    let away = resources(json!({"cpu": {"cpus": "24-25"}}));
    // The VM the container runs in informs the prediction and is not judged.
    let running = Running {
        vm: Some(&floating),
        ..Running::default()
    };
    let update = checker.update(&req, running, &away);
    assert_eq!(found(&update), [Rule::CpuOutsideIntent]);
    assert_eq!(update.decision(), Decision::Reject);
    // A VM given with the request (the CLI's --vm-pid, the hook's poststart) is judged.
    let judged = Request {
        vm: Some(&floating),
        ..Request::new(&s)
    };
    assert_eq!(
        found(&checker.update(&judged, Running::default(), &away)),
        [
            Rule::CpuOutsideIntent,
            Rule::VcpuAffinityDrift,
            Rule::VcpuOverlap
        ]
    );
    // Observed after the fact: the VM's rules only, and nothing left to refuse.
    let seen = checker.observe(&req, running, &floating);
    assert_eq!(seen.class, Some(UpdateClass::Noop));
    assert_eq!(found(&seen), [Rule::VcpuAffinityDrift, Rule::VcpuOverlap]);
    assert!(seen.has_error() && seen.mode == Mode::Enforce);
    assert_eq!(seen.decision(), Decision::Allow);
}

#[test]
fn a_request_after_the_fact_reports_and_never_refuses() {
    let host = host(DGX2);
    let checker = Checker::new(&host, None, defaults());
    let s = on_node_0("24-25");
    let before = checker.admit(&Request::new(&s));
    assert_eq!(found(&before), [Rule::CpuOutsideIntent]);
    assert_eq!(before.decision(), Decision::Reject);
    let after = checker.admit(&Request {
        after_the_fact: true,
        ..Request::new(&s)
    });
    assert_eq!(after.findings, before.findings);
    assert_eq!(after.decision(), Decision::Allow);
}

#[test]
fn a_stale_host_is_said_in_every_phase_but_observe() {
    let host = host(DGX2);
    let fail_closed = Defaults {
        fail_closed: true,
        ..defaults()
    };
    let checker = Checker::new(&host, None, fail_closed).stale(Some("the refresh failed"));
    let s = on_node_0("0-1");
    let req = Request::new(&s);
    let admit = checker.admit(&req);
    assert_eq!(found(&admit), [Rule::CheckFailed]);
    assert!(admit.findings[0].message.contains("the refresh failed"));
    assert_eq!(admit.decision(), Decision::Reject, "fail_closed in enforce");
    let push = resources(json!({"cpu": {"cpus": "1"}}));
    let update = checker.update(&req, Running::default(), &push);
    assert_eq!(found(&update), [Rule::CheckFailed]);
    let seen = checker.observe(&req, Running::default(), &vm_view(700, &["0", "1"]));
    assert!(seen.findings.is_empty(), "{:?}", seen.findings);
}

#[test]
fn the_pods_kata_annotations_apply_in_the_core() {
    let host = host(DGX2);
    let checker = Checker::new(&host, None, defaults());
    // The node's configuration: no pinning; the pod's annotation turns it on.
    let node = KataConfig::default();
    let pinned = spec()
        .cpus("0-1")
        .annotation(
            "io.katacontainers.config.runtime.enable_vcpus_pinning",
            "true",
        )
        .build();
    let plain = spec().cpus("0-1").build();
    let check = |s: &ContainerSpec| {
        checker.admit(&Request {
            kata: Some(&node),
            ..Request::new(s)
        })
    };
    // One vCPU (default_vcpus, no limit) for two CPUs: pinning cannot hold.
    assert_eq!(found(&check(&pinned)), [Rule::VcpuPinningLost]);
    assert!(check(&plain).findings.is_empty());
    let req = Request {
        kata: Some(&node),
        ..Request::new(&pinned)
    };
    assert_eq!(req.pod_kata().map(|k| k.enable_vcpus_pinning), Some(true));
}

#[test]
fn a_request_that_could_not_run_names_what_is_known_of_it() {
    let closed = Defaults {
        fail_closed: true,
        mode: Mode::Enforce,
        ..Defaults::default()
    };
    let unread = Unread {
        operation: Operation::Update,
        class: None,
        spec: None,
        container_id: Some("c-9"),
        sandbox_id: Some("pod-9"),
        after_the_fact: false,
    };
    let v = could_not_run(&unread, closed, "task c-9 was not created here");
    assert_eq!(found(&v), [Rule::CheckFailed]);
    assert_eq!(v.container_id.as_deref(), Some("c-9"));
    assert_eq!(v.sandbox_id.as_deref(), Some("pod-9"));
    assert_eq!(
        (v.operation, v.decision()),
        (Operation::Update, Decision::Reject)
    );
    let late = could_not_run(
        &Unread {
            after_the_fact: true,
            ..unread
        },
        closed,
        "the proxy failed",
    );
    assert_eq!(late.decision(), Decision::Allow);
    // With the spec read: its sandbox, its annotations' mode, the phase's class.
    let s = spec()
        .cpus("0-1")
        .annotation("kata-topo.io/mode", "audit")
        .build();
    let req = Request {
        container_id: Some("c-1"),
        ..Request::new(&s)
    };
    let push = resources(json!({"cpu": {"cpus": "1"}}));
    let any = Defaults {
        pod_overrides: PodOverrides::Any,
        ..closed
    };
    let v = req.could_not_run(
        Phase::Update(Update::new(&s, Running::default(), &push)),
        any,
        "no host topology",
    );
    assert_eq!((v.class, v.mode), (Some(UpdateClass::Cpuset), Mode::Audit));
    assert_eq!(v.sandbox_id.as_deref(), Some("sb-1"));
    assert_eq!(v.container_id.as_deref(), Some("c-1"));
    assert_eq!(v.decision(), Decision::Allow);
    let seen = req.could_not_run(
        Phase::Observe(Running::default(), &vm_view(700, &["0"])),
        closed,
        "no host topology",
    );
    assert_eq!(seen.decision(), Decision::Allow, "observing never refuses");
}
