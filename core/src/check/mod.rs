//! The check: one request (create, recreate, update, or a look at the VM after one) against
//! the pod's intent, its baseline and the host as it is now, giving a finished [`verdict::Verdict`].
//!
//! - `phase.rs`: the entry point [`Checker::check`] (and its shorthands [`Checker::admit`],
//!   [`Checker::recreate`], [`Checker::update`], [`Checker::observe`]) and [`could_not_run`];
//!   a [`Phase`] says which check a [`Request`] gets and gives its operation and update class
//!   once; the decision is made there, last.
//! - `context.rs`: what a request is about, worked out once before any rule runs: policy and
//!   mode in force, the resources it leaves, the allowed NUMA nodes and what says so, where
//!   the CPUs are, the devices, what the kubelet admitted and the pod's node affinity on its
//!   node — every input of the [`Request`] is resolved there.
//! - `families/`: one file per rule family, each a `check(&Context, &mut Findings)`, run in
//!   the order of [`FAMILIES`]: `admission.rs` (the kubelet's admission), `placement.rs` (CPUs
//!   and memory), `vfio.rs` (VFIO devices), `drift.rs` (the host against the baseline),
//!   `vm.rs` (Kata's configuration and what the VM actually got) and `node_affinity.rs` (the
//!   pod's node affinity against its node's labels).
//! - `Findings` (here): every finding is weighed in [`Findings::add`] through the one
//!   severity table, `severity.rs` ([`rule::severity`]), which the "Severity by policy" table
//!   of `docs/rules.md` is tested against; `rule.rs` names the rules.
//! - `intent.rs` (what the pod wants: annotations, the kubelet's admission, the baseline),
//!   `policy.rs` (the node's policy vocabulary), `verdict.rs` (the verdict's JSON) and
//!   `devices.rs` (the spec's VFIO devices resolved against sysfs, and the baseline a first
//!   create records, [`Checker::record_baseline`]).

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

use crate::check::policy::{Defaults, Mode, Policy};
use crate::check::rule::{severity, Finding, Rule};
use crate::host::sysfs::Sysfs;
use crate::host::Host;
use crate::idset::IdSet;

use context::Context;

pub use phase::{could_not_run, Phase, Request, Running, Unread, Update};

/// Values that win over annotations (the CLI's `--policy` and `--mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overrides {
    /// Policy to apply whatever the pod says.
    pub policy: Option<Policy>,
    /// Mode to apply whatever the pod says.
    pub mode: Option<Mode>,
}

/// Adds a `check-failed` finding: the check could not run, or not all of it, for `reason`.
fn add_check_failed(f: &mut Findings, reason: &str) {
    f.add(
        Rule::CheckFailed,
        format!("the topology check could not run: {reason}; the request was not checked"),
        json!({"check": "completed"}),
        json!({"error": reason}),
    );
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
/// the request's policy, and dropped when the policy does not report the rule — the one place
/// a finding gets its severity.
struct Findings {
    policy: Policy,
    fail_closed: bool,
    /// Whether the phase reports a rule at all.
    reports: fn(Rule) -> bool,
    list: Vec<Finding>,
}

impl Findings {
    fn new(policy: Policy, fail_closed: bool, reports: fn(Rule) -> bool) -> Self {
        Self {
            policy,
            fail_closed,
            reports,
            list: Vec::new(),
        }
    }

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

    /// The findings, in the order they were added.
    fn into_list(self) -> Vec<Finding> {
        self.list
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
