//! The rules: one request (create, recreate or update) against the pod's intent, its baseline
//! and the host as it is now, giving a [`Verdict`].
//!
//! - `phase.rs`: the entry points, one per phase ([`Checker::admit`], [`Checker::recreate`],
//!   [`Checker::update`], [`Checker::observe`]), and [`could_not_run`]; each lowers its
//!   [`Request`] for the rules and makes the verdict's decision, last.
//! - the severity policy is not here but in [`crate::check::rule`] (`rule/severity.rs`): one table from
//!   rule × policy to severity, read through [`severity()`]; the "Severity by policy" table of
//!   `docs/rules.md` is tested against it.
//! - `context.rs`: what a request is about (policy and mode in force, the resources it leaves,
//!   the allowed NUMA nodes and what says so, where the CPUs are, the devices), worked out once
//!   before any rule runs.
//! - `devices.rs`: the spec's VFIO devices resolved against sysfs and the host, and the
//!   baseline a first create records ([`Checker::record_baseline`]).
//! - one file per rule family, each a `check(&Context, &mut Findings)`: `placement.rs` (CPUs
//!   and memory), `vfio.rs` (VFIO devices), `drift.rs` (the host against the baseline) and
//!   `vm.rs` (Kata's configuration and, for what the VM actually got, its view:
//!   [`Request::kata`], [`Request::vm`]).

mod context;
mod devices;
mod families;
pub mod intent;
mod phase;
pub mod policy;
pub mod rule;
mod severity;
pub mod verdict;

use serde_json::{json, Value};

use crate::check::intent::Baseline;
use crate::check::policy::{Defaults, Mode, Policy};
use crate::check::rule::{severity, Finding, Rule};
use crate::check::verdict::{Decision, Verdict};
use crate::host::sysfs::Sysfs;
use crate::host::Host;
use crate::idset::IdSet;
use crate::input::kata::KataConfig;
use crate::input::kubelet::KubeletView;
use crate::input::spec::{ContainerSpec, Resources};
use crate::vm::VmView;

use context::Context;

pub use phase::{could_not_run, Phase, Request, Running, Unread};

/// Values that win over annotations (the CLI's `--policy` and `--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overrides {
    /// Policy to apply whatever the pod says.
    pub policy: Option<Policy>,
    /// Mode to apply whatever the pod says.
    pub mode: Option<Mode>,
}

/// One request to check, lowered: what a phase of [`Request`] gives the rules.
#[derive(Debug, Clone, Copy)]
struct Input<'a> {
    /// The container's OCI spec (annotations, devices, resources at create).
    spec: &'a ContainerSpec,
    /// For an update: the new `LinuxResources`.
    update: Option<&'a Resources>,
    /// For an update: the resources in force before it (default: the spec's).
    current: Option<&'a Resources>,
    /// The container's baseline, if one was recorded (makes a create a recreate).
    baseline: Option<&'a Baseline>,
    /// The container (task) id, when known.
    container_id: Option<&'a str>,
    /// CLI overrides.
    overrides: Overrides,
    /// Kata's configuration (with the pod's annotations applied), for the VM rules.
    kata: Option<&'a KataConfig>,
    /// What the VM actually got, for the observed VM rules.
    vm: Option<&'a VmView>,
    /// The VM the container runs in, read before an update: the vCPUs static sizing keeps
    /// (default: `vm`).
    running_vm: Option<&'a VmView>,
    /// What the kubelet said about the pod, when it was asked (`intent_source`): its
    /// admission then is the intent, within `pod_overrides` of the pod's annotations.
    kubelet: Option<&'a KubeletView>,
    /// What the API server said about the pod's node, when it was read.
    node: Option<&'a crate::input::affinity::NodeView>,
}

#[cfg(test)]
impl<'a> Input<'a> {
    /// A create (or recreate, with a baseline) of this spec.
    fn create(spec: &'a ContainerSpec) -> Self {
        Self {
            spec,
            update: None,
            current: None,
            baseline: None,
            container_id: None,
            overrides: Overrides::default(),
            kata: None,
            vm: None,
            running_vm: None,
            kubelet: None,
            node: None,
        }
    }
}

/// A `check-failed` finding under a policy, or `None` when the policy does not report it.
fn check_failed(policy: Policy, fail_closed: bool, reason: &str) -> Option<Finding> {
    severity(Rule::CheckFailed, policy, fail_closed).map(|severity| Finding {
        rule: Rule::CheckFailed,
        severity,
        message: format!("the topology check could not run: {reason}; the request was not checked"),
        expected: json!({"check": "completed"}),
        observed: json!({"error": reason}),
    })
}

/// Runs the rules against one host.
#[derive(Debug, Clone, Copy)]
pub struct Checker<'h> {
    host: &'h Host,
    sysfs: Option<&'h Sysfs>,
    defaults: Defaults,
    /// Why the host may be out of date, when it may.
    stale: Option<&'h str>,
}

impl<'h> Checker<'h> {
    /// A checker over a loaded host and, when VFIO devices are to be resolved, a sysfs tree.
    pub fn new(host: &'h Host, sysfs: Option<&'h Sysfs>, defaults: Defaults) -> Self {
        Self {
            host,
            sysfs,
            defaults,
            stale: None,
        }
    }

    /// The same checker over a host that may be out of date (its refresh failed): each
    /// verdict says so with a `check-failed` finding naming `reason`, weighed like any other.
    pub fn stale(self, reason: Option<&'h str>) -> Self {
        Self {
            stale: reason,
            ..self
        }
    }

    /// The host it checks against.
    pub fn host(&self) -> &'h Host {
        self.host
    }

    /// The verdict on one lowered request, not yet decided: its context worked out, the rule
    /// families run over it, findings of rules `reports` keeps weighed by the severity table,
    /// then why the host may be out of date as a `check-failed` finding.
    fn verdict(&self, req: &Input<'_>, reports: fn(Rule) -> bool) -> Verdict {
        let (cx, invalid_intent) = Context::new(self, *req);
        let mut f = Findings {
            policy: cx.policy,
            fail_closed: self.defaults.fail_closed,
            reports,
            list: Vec::new(),
        };
        // Weighed by the table like every other finding (`intent-invalid` is always an error).
        for invalid in invalid_intent {
            f.add(
                invalid.rule,
                invalid.message,
                invalid.expected,
                invalid.observed,
            );
        }
        for family in FAMILIES {
            family(&cx, &mut f);
        }
        if let Some(reason) = self.stale {
            f.push(check_failed(cx.policy, self.defaults.fail_closed, reason));
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
            findings: f.list,
            intent_source: cx.origin,
            kubelet: cx.kubelet.as_ref().map(intent::KubeletIntent::reported),
        }
    }
}

/// The rule families, in the order their findings appear in a verdict.
const FAMILIES: [fn(&Context<'_>, &mut Findings); 6] = [
    families::admission::check,
    families::placement::check,
    families::vfio::check,
    families::drift::check,
    families::vm::check,
    families::node_affinity::check,
];

/// The findings of one check so far: each rule's finding is weighed by the severity table under
/// the request's policy, and dropped when the policy does not report the rule.
struct Findings {
    policy: Policy,
    fail_closed: bool,
    /// Whether the phase reports a rule at all.
    reports: fn(Rule) -> bool,
    list: Vec<Finding>,
}

impl Findings {
    fn add(&mut self, rule: Rule, message: String, expected: Value, observed: Value) {
        if !(self.reports)(rule) {
            return;
        }
        if let Some(severity) = severity(rule, self.policy, self.fail_closed) {
            self.list.push(Finding {
                rule,
                severity,
                message,
                expected,
                observed,
            });
        }
    }

    /// A finding already weighed (`check-failed`), when the phase reports its rule.
    fn push(&mut self, finding: Option<Finding>) {
        self.list.extend(finding.filter(|f| (self.reports)(f.rule)));
    }
}

/// "node" or "nodes", for messages.
fn node_word(nodes: &IdSet) -> &'static str {
    if nodes.len() == 1 {
        "node"
    } else {
        "nodes"
    }
}
