//! The entry points: one per phase of a container the wrapper, the hook and the CLI see —
//! [`Checker::admit`], [`Checker::recreate`], [`Checker::update`], [`Checker::observe`] — each
//! taking a [`Request`] and giving a finished [`Verdict`], and [`could_not_run`] (or
//! [`Request::could_not_run`]) for a request no checker could look at. Nothing outside the
//! core edits a verdict: the pod's intent is resolved once (`context.rs`), every finding is
//! weighed by the one severity table, and the decision is made here, last.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::intent::{Baseline, Intent, IntentOrigin, ANNOTATION_MODE, ANNOTATION_POLICY};
use crate::kata::KataConfig;
use crate::kubelet::KubeletView;
use crate::policy::Defaults;
use crate::request::{ContainerKind, ContainerSpec, Resources};
use crate::rule::{severity, Finding, Rule};
use crate::verdict::{Decision, Operation, UpdateClass, Verdict};
use crate::vm::VmView;

use super::{check_failed, Checker, Input, Overrides};

/// One request about one container: what the pod asks (its spec's annotations, devices and
/// resources) and everything else that says what the pod is meant to get.
///
/// The pod's intent comes from the sources named here — the spec's `kata-topo.io/*`
/// annotations, [`Request::kubelet`] — and from the phase's baseline ([`Phase`]); all of them
/// are resolved together, once, in `context.rs` (`Context::new`), within the node's
/// `pod_overrides`. A new source of intent (the node's labels against the pod's node
/// affinity, say) is one more `Option<&…>` field here and one more input there; the phases
/// and their callers do not change.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The container's OCI spec (annotations, devices, resources at create).
    pub spec: &'a ContainerSpec,
    /// The container (task) id, when known.
    pub container_id: Option<&'a str>,
    /// Values that win over the pod's annotations (tests; no command sets them today).
    pub overrides: Overrides,
    /// Kata's configuration as the node has it, for the Kata rules; the pod's
    /// `io.katacontainers.config.*` annotations are applied over it here, as Kata would.
    pub kata: Option<&'a KataConfig>,
    /// What the VM actually got, judged by the VM rules (`vcpu-affinity-drift`,
    /// `vcpu-overlap`): the hook's at poststart, the CLI's `--vm-pid`. [`Checker::observe`]
    /// takes its own; what an update predicts from goes in [`Running::vm`].
    pub vm: Option<&'a VmView>,
    /// What the kubelet said about the pod, when it was asked (`intent_source`): its
    /// admission then is the intent, within `pod_overrides` of the pod's annotations.
    pub kubelet: Option<&'a KubeletView>,
    /// The request has gone through already (an OCI hook at poststart, when the container
    /// runs): the verdict reports what it finds and never refuses.
    pub after_the_fact: bool,
}

impl<'a> Request<'a> {
    /// A request about this spec, with nothing else known yet.
    pub fn new(spec: &'a ContainerSpec) -> Self {
        Self {
            spec,
            container_id: None,
            overrides: Overrides::default(),
            kata: None,
            vm: None,
            kubelet: None,
            after_the_fact: false,
        }
    }

    /// Kata's configuration as it applies to this pod: the node's with the pod's
    /// `io.katacontainers.config.*` annotations Kata honours — the one place they are applied.
    pub fn pod_kata(&self) -> Option<KataConfig> {
        self.kata
            .map(|k| k.with_annotations(&self.spec.annotations))
    }

    /// The verdict when this request cannot be checked at all in `phase` (no host topology
    /// yet): one `check-failed` finding, as [`could_not_run`] gives it.
    pub fn could_not_run(&self, phase: Phase<'_>, defaults: Defaults, reason: &str) -> Verdict {
        could_not_run(
            &Unread {
                operation: phase.operation(self.spec),
                class: phase.class(self.spec),
                spec: Some(self.spec),
                container_id: self.container_id,
                sandbox_id: None,
                after_the_fact: self.after_the_fact || !phase.refuses(),
            },
            defaults,
            reason,
        )
    }
}

/// What a running container has: the resources in force and the baseline its first create
/// recorded (the sandbox's own, for the sandbox).
#[derive(Debug, Clone, Copy, Default)]
pub struct Running<'a> {
    /// The resources in force (default: the spec's).
    pub current: Option<&'a Resources>,
    /// Its baseline, if one was recorded.
    pub baseline: Option<&'a Baseline>,
    /// The VM it runs in, read before an update (one look, not judged): under static sizing
    /// the vCPUs the VM keeps, which `vcpu-pinning-lost` predicts from (default: the
    /// request's `vm`).
    pub vm: Option<&'a VmView>,
}

/// Which check a request gets.
#[derive(Debug, Clone, Copy)]
pub enum Phase<'a> {
    /// The sandbox's create, or a container's first create in its sandbox.
    Admit,
    /// A later create of a container name the sandbox already ran, held to the baseline its
    /// first create recorded.
    Recreate(&'a Baseline),
    /// A resource update of a running container: the new `LinuxResources`. The wrapper judges
    /// the VM's own behaviour once the delegate applied it ([`Phase::Observe`]).
    Update(Running<'a>, &'a Resources),
    /// What the VM's vCPU threads really do once the delegate applied a request
    /// (`vcpu-affinity-drift`, `vcpu-overlap`), as an `update` verdict of class `noop`: after
    /// the fact, so it never refuses.
    Observe(Running<'a>, &'a VmView),
}

impl Phase<'_> {
    /// The operation a verdict of this phase names.
    fn operation(&self, spec: &ContainerSpec) -> Operation {
        match self {
            Self::Admit | Self::Recreate(_) if spec.kind == ContainerKind::Sandbox => {
                Operation::Sandbox
            }
            Self::Admit => Operation::Create,
            Self::Recreate(_) => Operation::Recreate,
            Self::Update(..) | Self::Observe(..) => Operation::Update,
        }
    }

    /// The update class a verdict of this phase names.
    fn class(&self, spec: &ContainerSpec) -> Option<UpdateClass> {
        match self {
            Self::Admit | Self::Recreate(_) => None,
            Self::Update(running, update) => {
                Some(running.current.unwrap_or(&spec.resources).classify(update))
            }
            Self::Observe(..) => Some(UpdateClass::Noop),
        }
    }

    /// Whether the phase reports a rule: observing the VM, only the VM's own rules (the
    /// request was judged already); otherwise every rule its inputs allow.
    fn reports(&self) -> fn(Rule) -> bool {
        match self {
            Self::Observe(..) => is_observed,
            _ => |_| true,
        }
    }

    /// Whether a verdict of this phase can still refuse its request.
    fn refuses(&self) -> bool {
        !matches!(self, Self::Observe(..))
    }
}

/// Rules about what the VM actually does, reported after the delegate applied a request.
fn is_observed(rule: Rule) -> bool {
    matches!(rule, Rule::VcpuAffinityDrift | Rule::VcpuOverlap)
}

impl Checker<'_> {
    /// The sandbox's create, or a container's first create in its sandbox.
    pub fn admit(&self, req: &Request<'_>) -> Verdict {
        self.run(Phase::Admit, req)
    }

    /// A later create of a container name the sandbox already ran, held to its baseline.
    pub fn recreate(&self, req: &Request<'_>, baseline: &Baseline) -> Verdict {
        self.run(Phase::Recreate(baseline), req)
    }

    /// A resource update of a running container to `update`.
    pub fn update(&self, req: &Request<'_>, running: Running<'_>, update: &Resources) -> Verdict {
        self.run(Phase::Update(running, update), req)
    }

    /// What the VM does once the delegate applied a request.
    pub fn observe(&self, req: &Request<'_>, running: Running<'_>, vm: &VmView) -> Verdict {
        self.run(Phase::Observe(running, vm), req)
    }

    /// Runs one phase: lowers the request for the rules, checks it, decides. A checker that
    /// panics gives the `check-failed` verdict, never a panic.
    fn run(&self, phase: Phase<'_>, req: &Request<'_>) -> Verdict {
        let spec = req.spec;
        let kata = req.pod_kata();
        let input = Input {
            spec,
            update: None,
            current: None,
            baseline: None,
            container_id: req.container_id,
            overrides: req.overrides,
            kata: kata.as_ref(),
            vm: req.vm,
            running_vm: None,
            kubelet: req.kubelet,
        };
        let input = match phase {
            Phase::Admit => input,
            Phase::Recreate(baseline) => Input {
                baseline: Some(baseline),
                ..input
            },
            Phase::Update(running, update) => Input {
                update: Some(update),
                current: running.current,
                baseline: running.baseline,
                running_vm: running.vm,
                ..input
            },
            Phase::Observe(running, vm) => {
                let current = running.current.unwrap_or(&spec.resources);
                Input {
                    update: Some(current),
                    current: Some(current),
                    baseline: running.baseline,
                    vm: Some(vm),
                    ..input
                }
            }
        };
        let refuses = phase.refuses() && !req.after_the_fact;
        match catch_unwind(AssertUnwindSafe(|| self.verdict(&input, phase.reports()))) {
            Ok(mut verdict) => {
                verdict.settle(refuses);
                verdict
            }
            Err(_) => req.could_not_run(phase, self.defaults, "the checker failed unexpectedly"),
        }
    }
}

/// What is known of a request that could not be checked: what it was, its spec when it was
/// read, and who it was for.
#[derive(Debug, Clone, Copy)]
pub struct Unread<'a> {
    /// What was asked.
    pub operation: Operation,
    /// For an update, what it changes, when that is known.
    pub class: Option<UpdateClass>,
    /// The container's spec, when it could be read.
    pub spec: Option<&'a ContainerSpec>,
    /// The container (task) id, when known.
    pub container_id: Option<&'a str>,
    /// The sandbox id when the spec does not give one (or there is no spec).
    pub sandbox_id: Option<&'a str>,
    /// The request has gone through already (unchecked): the verdict never refuses.
    pub after_the_fact: bool,
}

/// The verdict for a request whose check could not run at all (no host topology, an
/// unreadable spec or request, a task this wrapper did not create, a checker that panicked):
/// one `check-failed` finding, weighed by the severity table (an error only under
/// `fail_closed`), and the pod's annotations found invalid or ignored. Policy and mode come
/// from the annotations, within `pod_overrides`, when the spec was read; else from the
/// defaults.
pub fn could_not_run(unread: &Unread<'_>, defaults: Defaults, reason: &str) -> Verdict {
    let spec = unread.spec;
    let annotation = |key: &str| spec.and_then(|s| s.annotations.get(key));
    let (policy, mode, ignored) = Intent::within(
        annotation(ANNOTATION_POLICY).and_then(|v| v.parse().ok()),
        annotation(ANNOTATION_MODE).and_then(|v| v.parse().ok()),
        &defaults,
    );
    let findings = check_failed(policy, defaults.fail_closed, reason)
        .into_iter()
        .chain(ignored.into_iter().filter_map(|f| {
            Some(Finding {
                severity: severity(f.rule, policy, defaults.fail_closed)?,
                ..f
            })
        }))
        .collect();
    let mut verdict = Verdict {
        operation: unread.operation,
        class: unread.class,
        sandbox_id: spec
            .and_then(|s| s.sandbox_id.as_deref())
            .or(unread.sandbox_id)
            .map(str::to_string),
        container_id: unread.container_id.map(str::to_string),
        container_name: spec.and_then(|s| s.container_name.clone()),
        pod: spec.map(|s| s.pod.clone()).unwrap_or_default(),
        policy,
        mode,
        decision: Decision::Allow,
        findings,
        intent_source: IntentOrigin::default(),
        kubelet: None,
    };
    verdict.settle(!unread.after_the_fact);
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{Host, TopologySource};
    use crate::policy::{Mode, PodOverrides};
    use crate::verdict::Decision;
    use crate::vm::{Accel, Sampling, Vcpu};

    fn host() -> Host {
        let xml = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/hwloc/xml/nvidiaDGX2.xml");
        Host::load(&TopologySource::Xml(xml)).expect("fixture loads")
    }

    /// Pods pick their policy and mode by annotation here.
    fn defaults() -> Defaults {
        Defaults {
            pod_overrides: PodOverrides::Any,
            ..Defaults::default()
        }
    }

    fn spec(cpus: &str, annotations: serde_json::Value) -> ContainerSpec {
        let json = serde_json::json!({
            "ociVersion": "1.0.2",
            "annotations": annotations,
            "linux": {"resources": {"cpu": {"cpus": cpus}}}
        });
        ContainerSpec::from_json(json.to_string().as_bytes()).expect("spec")
    }

    /// In enforce mode, held to node 0 (CPUs 0-23 on the DGX-2).
    fn on_node_0(cpus: &str) -> ContainerSpec {
        spec(
            cpus,
            serde_json::json!({
                "kata-topo.io/mode": "enforce",
                "kata-topo.io/numa-nodes": "0",
                "io.kubernetes.cri.sandbox-id": "sb-1",
                "io.kubernetes.cri.container-name": "app",
            }),
        )
    }

    fn resources(json: &str) -> Resources {
        Resources::from_json(json.as_bytes()).expect("resources")
    }

    /// A KVM VM whose vCPU threads may run on these CPU lists, in vCPU order.
    fn vm(allowed: &[&str]) -> VmView {
        VmView {
            pid: 700,
            found_via: None,
            comm: "qemu-system-x86".into(),
            exe: None,
            vmm: None,
            accel: Some(Accel::Kvm),
            kvm_vcpus: (0..allowed.len() as u32).collect(),
            vcpus: allowed
                .iter()
                .zip(0..)
                .map(|(cpus, index)| Vcpu {
                    index,
                    tid: 701 + index,
                    allowed_cpus: cpus.parse().expect("cpu list"),
                    sources: Vec::new(),
                })
                .collect(),
            unresolved: Vec::new(),
            disagreements: Vec::new(),
            notes: Vec::new(),
            sampling: Sampling::default(),
            memory_policies: Default::default(),
            memory_nodes: crate::IdSet::new(),
            guest_nodes: Vec::new(),
            rejected: None,
        }
    }

    fn rules(v: &Verdict) -> Vec<Rule> {
        v.findings.iter().map(|f| f.rule).collect()
    }

    #[test]
    fn each_phase_names_its_operation_and_the_request() {
        let host = host();
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
        let push = resources(r#"{"cpu": {"cpus": "1"}}"#);
        let sandbox = spec(
            "",
            serde_json::json!({"io.kubernetes.cri.container-type": "sandbox"}),
        );
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
                checker.observe(&req, running, &vm(&["0", "1"])),
                Operation::Update,
                Some(UpdateClass::Noop),
            ),
        ];
        for (i, (v, operation, class)) in cases.into_iter().enumerate() {
            assert_eq!((v.operation, v.class), (operation, class), "case {i}");
            assert!(v.findings.is_empty(), "case {i}: {:?}", v.findings);
            assert_eq!(v.decision(), Decision::Allow, "case {i}");
            if operation != Operation::Sandbox {
                assert_eq!(v.container_id.as_deref(), Some("c-1"), "case {i}");
                assert_eq!(v.sandbox_id.as_deref(), Some("sb-1"), "case {i}");
                assert_eq!(v.container_name.as_deref(), Some("app"), "case {i}");
                assert_eq!(v.mode, Mode::Enforce, "case {i}");
            }
        }
    }

    #[test]
    fn an_update_judges_the_request_and_observe_what_the_vm_does() {
        let host = host();
        let checker = Checker::new(&host, None, defaults());
        let s = on_node_0("0-1");
        // The VM's vCPUs already float onto node 1; the update moves the cpuset there too.
        let floating = vm(&["0", "24", "24"]);
        let req = Request::new(&s);
        let away = resources(r#"{"cpu": {"cpus": "24-25"}}"#);
        // The VM the container runs in informs the prediction and is not judged.
        let running = Running {
            vm: Some(&floating),
            ..Running::default()
        };
        let update = checker.update(&req, running, &away);
        assert_eq!(rules(&update), [Rule::CpuOutsideIntent]);
        assert_eq!(update.decision(), Decision::Reject);
        // A VM given with the request (the CLI's --vm-pid) is judged.
        let judged = Request {
            vm: Some(&floating),
            ..Request::new(&s)
        };
        assert_eq!(
            rules(&checker.update(&judged, Running::default(), &away)),
            [
                Rule::CpuOutsideIntent,
                Rule::VcpuAffinityDrift,
                Rule::VcpuOverlap
            ]
        );
        // Observed after the fact: the VM's rules only, and nothing left to refuse.
        let seen = checker.observe(&req, running, &floating);
        assert_eq!(seen.class, Some(UpdateClass::Noop));
        assert_eq!(rules(&seen), [Rule::VcpuAffinityDrift, Rule::VcpuOverlap]);
        assert!(seen.has_error() && seen.mode == Mode::Enforce);
        assert_eq!(seen.decision(), Decision::Allow);
    }

    #[test]
    fn a_request_after_the_fact_reports_and_never_refuses() {
        let host = host();
        let checker = Checker::new(&host, None, defaults());
        let s = on_node_0("24-25");
        let before = checker.admit(&Request::new(&s));
        assert_eq!(rules(&before), [Rule::CpuOutsideIntent]);
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
        let host = host();
        let fail_closed = Defaults {
            fail_closed: true,
            ..defaults()
        };
        let checker = Checker::new(&host, None, fail_closed).stale(Some("the refresh failed"));
        let s = on_node_0("0-1");
        let req = Request::new(&s);
        let admit = checker.admit(&req);
        assert_eq!(rules(&admit), [Rule::CheckFailed]);
        assert!(admit.findings[0].message.contains("the refresh failed"));
        assert_eq!(admit.decision(), Decision::Reject, "fail_closed in enforce");
        let push = resources(r#"{"cpu": {"cpus": "1"}}"#);
        let update = checker.update(&req, Running::default(), &push);
        assert_eq!(rules(&update), [Rule::CheckFailed]);
        let seen = checker.observe(&req, Running::default(), &vm(&["0", "1"]));
        assert!(seen.findings.is_empty(), "{:?}", seen.findings);
    }

    #[test]
    fn the_pods_kata_annotations_apply_in_the_core() {
        let host = host();
        let checker = Checker::new(&host, None, defaults());
        let node = KataConfig::default();
        let pinned = spec(
            "0-1",
            serde_json::json!({"io.katacontainers.config.runtime.enable_vcpus_pinning": "true"}),
        );
        let plain = spec("0-1", serde_json::json!({}));
        let check = |s: &ContainerSpec| {
            checker.admit(&Request {
                kata: Some(&node),
                ..Request::new(s)
            })
        };
        // One vCPU (default_vcpus, no limit) for two CPUs: pinning cannot hold.
        assert_eq!(rules(&check(&pinned)), [Rule::VcpuPinningLost]);
        assert!(check(&plain).findings.is_empty());
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
        assert_eq!(rules(&v), [Rule::CheckFailed]);
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
        let s = spec(
            "0-1",
            serde_json::json!({"kata-topo.io/mode": "audit", "io.kubernetes.cri.sandbox-id": "sb-1"}),
        );
        let req = Request {
            container_id: Some("c-1"),
            ..Request::new(&s)
        };
        let push = resources(r#"{"cpu": {"cpus": "1"}}"#);
        let any = Defaults {
            pod_overrides: PodOverrides::Any,
            ..closed
        };
        let v = req.could_not_run(
            Phase::Update(Running::default(), &push),
            any,
            "no host topology",
        );
        assert_eq!((v.class, v.mode), (Some(UpdateClass::Cpuset), Mode::Audit));
        assert_eq!(v.sandbox_id.as_deref(), Some("sb-1"));
        assert_eq!(v.decision(), Decision::Allow);
        let seen = req.could_not_run(
            Phase::Observe(Running::default(), &vm(&["0"])),
            closed,
            "no host topology",
        );
        assert_eq!(seen.decision(), Decision::Allow, "observing never refuses");
    }
}
