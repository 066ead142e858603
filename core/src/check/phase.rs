//! The entry points: [`Checker::check`] runs one [`Phase`] of a container the wrapper, the hook
//! and the CLI see — admit, recreate, update, observe ([`Checker::admit`],
//! [`Checker::recreate`], [`Checker::update`], [`Checker::observe`] for short) — on a
//! [`Request`] and gives a finished [`Verdict`]; [`could_not_run`] (or
//! [`Request::could_not_run`]) gives one for a request no checker could look at. Nothing
//! outside the core edits a verdict: the phase's operation and update class are worked out
//! once, here; the pod's intent is resolved once (`context.rs`); every finding is weighed by
//! the one severity table (`Findings::add`, `mod.rs`); and the decision is made here, last.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::check::intent::{
    Baseline, Intent, IntentOrigin, KubeletIntent, ANNOTATION_MODE, ANNOTATION_POLICY,
};
use crate::check::policy::Defaults;
use crate::check::rule::Rule;
use crate::check::verdict::{Decision, Operation, UpdateClass, Verdict};
use crate::input::affinity::NodeView;
use crate::input::kata::KataConfig;
use crate::input::kubelet::KubeletView;
use crate::input::spec::{ContainerKind, ContainerSpec, Resources};
use crate::vm::VmView;

use super::context::Context;
use super::{add_check_failed, Checker, Findings, Overrides};

/// One request about one container: what the pod asks (its spec's annotations, devices and
/// resources) and everything else that says what the pod is meant to get.
///
/// The pod's intent comes from the sources named here — the spec's `kata-topo.io/*`
/// annotations, [`Request::kubelet`], [`Request::node`] — and from the phase's baseline
/// ([`Phase`]); all of them are resolved together, once, in `context.rs` (`Context::new`),
/// within the node's `pod_overrides`. A new source of intent is one more `Option<&…>` field
/// here, resolved there, and a rule family under `families/` that reads it (the recipe is in
/// `docs/code-map.md`); the phases and their callers do not change.
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
    /// What the API server said about the pod's node, when it was read: the pod's
    /// nodeSelector and node affinity are checked against the node's labels now and at the
    /// pod's first create (`node-affinity-violated`, `node-labels-changed`), or why it could
    /// not be read (`node-labels-unavailable`).
    pub node: Option<&'a NodeView>,
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
            node: None,
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
                class: phase.class(),
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

/// A resource update of a running container to `resources`, classified once
/// ([`Update::new`]): the wrapper decides from its class what to ask again (a resize asks the
/// kubelet and the API server, a cpuset push asks neither) and the verdict names it.
#[derive(Debug, Clone, Copy)]
pub struct Update<'a> {
    /// What the container has before the update.
    pub running: Running<'a>,
    /// The new `LinuxResources`.
    pub resources: &'a Resources,
    /// What the update changes against the resources in force.
    pub class: UpdateClass,
}

impl<'a> Update<'a> {
    /// The update of a container of `spec` from what it runs with (`running.current`, else the
    /// spec's resources) to `resources`.
    pub fn new(spec: &ContainerSpec, running: Running<'a>, resources: &'a Resources) -> Self {
        let class = running
            .current
            .unwrap_or(&spec.resources)
            .classify(resources);
        Self {
            running,
            resources,
            class,
        }
    }

    /// Whether it changes quota, shares or memory (`resize` or `mixed`), not only the cpuset.
    pub fn is_resize(&self) -> bool {
        matches!(self.class, UpdateClass::Resize | UpdateClass::Mixed)
    }
}

/// Which check a request gets.
#[derive(Debug, Clone, Copy)]
pub enum Phase<'a> {
    /// The sandbox's create, or a container's first create in its sandbox.
    Admit,
    /// A later create of a container name the sandbox already ran, held to the baseline its
    /// first create recorded.
    Recreate(&'a Baseline),
    /// A resource update of a running container. The wrapper judges the VM's own behaviour
    /// once the delegate applied it ([`Phase::Observe`]).
    Update(Update<'a>),
    /// What the VM's vCPU threads really do once the delegate applied a request
    /// (`vcpu-affinity-drift`, `vcpu-overlap`), as an `update` verdict of class `noop`: after
    /// the fact, so it never refuses.
    Observe(Running<'a>, &'a VmView),
}

impl<'a> Phase<'a> {
    /// The operation a verdict of this phase names: the one place it is worked out.
    pub fn operation(&self, spec: &ContainerSpec) -> Operation {
        match self {
            Self::Admit | Self::Recreate(_) if spec.kind == ContainerKind::Sandbox => {
                Operation::Sandbox
            }
            Self::Admit => Operation::Create,
            Self::Recreate(_) => Operation::Recreate,
            Self::Update(..) | Self::Observe(..) => Operation::Update,
        }
    }

    /// The update class a verdict of this phase names (none for a create).
    pub fn class(&self) -> Option<UpdateClass> {
        match self {
            Self::Admit | Self::Recreate(_) => None,
            Self::Update(update) => Some(update.class),
            Self::Observe(..) => Some(UpdateClass::Noop),
        }
    }

    /// The baseline the container is held to, if one was recorded.
    pub(super) fn baseline(&self) -> Option<&'a Baseline> {
        match self {
            Self::Admit => None,
            Self::Recreate(baseline) => Some(baseline),
            Self::Update(update) => update.running.baseline,
            Self::Observe(running, _) => running.baseline,
        }
    }

    /// What the container runs with, for an update or an observation.
    pub(super) fn running(&self) -> Option<&Running<'a>> {
        match self {
            Self::Admit | Self::Recreate(_) => None,
            Self::Update(update) => Some(&update.running),
            Self::Observe(running, _) => Some(running),
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
        self.check(Phase::Admit, req)
    }

    /// A later create of a container name the sandbox already ran, held to its baseline.
    pub fn recreate(&self, req: &Request<'_>, baseline: &Baseline) -> Verdict {
        self.check(Phase::Recreate(baseline), req)
    }

    /// A resource update of a running container to `update`.
    pub fn update(&self, req: &Request<'_>, running: Running<'_>, update: &Resources) -> Verdict {
        self.check(Phase::Update(Update::new(req.spec, running, update)), req)
    }

    /// What the VM does once the delegate applied a request.
    pub fn observe(&self, req: &Request<'_>, running: Running<'_>, vm: &VmView) -> Verdict {
        self.check(Phase::Observe(running, vm), req)
    }

    /// Runs one phase of a request: works out what it is about (its context), runs the rule
    /// families over it, decides. A checker that panics gives the `check-failed` verdict,
    /// never a panic.
    pub fn check(&self, phase: Phase<'_>, req: &Request<'_>) -> Verdict {
        let refuses = phase.refuses() && !req.after_the_fact;
        match catch_unwind(AssertUnwindSafe(|| self.verdict(&phase, req))) {
            Ok(mut verdict) => {
                verdict.settle(refuses);
                verdict
            }
            Err(_) => req.could_not_run(phase, self.defaults, "the checker failed unexpectedly"),
        }
    }

    /// The verdict on one phase of a request, not yet decided: its context worked out, the
    /// pod's intent found invalid, the rule families' findings and why the host may be out of
    /// date, each weighed by the severity table when the phase reports its rule.
    fn verdict(&self, phase: &Phase<'_>, req: &Request<'_>) -> Verdict {
        let (cx, invalid_intent) = Context::new(self, req, phase);
        let mut f = Findings::new(cx.policy, self.defaults.fail_closed, phase.reports());
        for invalid in invalid_intent {
            f.add(
                invalid.rule,
                invalid.message,
                invalid.expected,
                invalid.observed,
            );
        }
        for family in super::FAMILIES {
            family(&cx, &mut f);
        }
        if let Some(reason) = self.stale {
            add_check_failed(&mut f, reason);
        }
        let spec = req.spec;
        Verdict {
            operation: cx.operation,
            class: cx.class,
            sandbox_id: spec.sandbox_id.clone(),
            container_id: req.container_id.map(str::to_string),
            container_name: spec.container_name.clone(),
            pod: spec.pod.clone(),
            policy: cx.policy,
            mode: cx.mode,
            decision: Decision::Allow,
            findings: f.into_list(),
            intent_source: cx.origin,
            kubelet: cx.kubelet.as_ref().map(KubeletIntent::reported),
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
    let mut f = Findings::new(policy, defaults.fail_closed, |_| true);
    add_check_failed(&mut f, reason);
    for ignored in ignored {
        f.add(
            ignored.rule,
            ignored.message,
            ignored.expected,
            ignored.observed,
        );
    }
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
        findings: f.into_list(),
        intent_source: IntentOrigin::default(),
        kubelet: None,
    };
    verdict.settle(!unread.after_the_fact);
    verdict
}
