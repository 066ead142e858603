//! The node's policy vocabulary: the Topology Manager [`Policy`], the [`Mode`] that says whether
//! an error refuses, how far a pod's annotations may move them ([`PodOverrides`]), and the
//! configured [`Defaults`] they apply over.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The Kubernetes Topology Manager policies, with the same meaning applied to updates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Only hard errors (CPUs that do not exist, devices that vanished).
    None,
    /// Every finding reported, never an error.
    BestEffort,
    /// CPUs, memory nodes and devices stay on the allowed nodes; devices local to the CPUs.
    #[default]
    Restricted,
    /// Everything on exactly one NUMA node.
    SingleNumaNode,
}

/// Why a value is not a policy or mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{value}` is not one of {expected}")]
pub struct ChoiceError {
    /// The value (shortened).
    pub value: String,
    /// The accepted values.
    pub expected: &'static str,
}

pub(crate) fn choice_error(value: &str, expected: &'static str) -> ChoiceError {
    ChoiceError {
        value: value.chars().take(64).collect(),
        expected,
    }
}

impl FromStr for Policy {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "best-effort" => Ok(Self::BestEffort),
            "restricted" => Ok(Self::Restricted),
            "single-numa-node" => Ok(Self::SingleNumaNode),
            _ => Err(choice_error(
                s,
                "none, best-effort, restricted, single-numa-node",
            )),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::BestEffort => "best-effort",
            Self::Restricted => "restricted",
            Self::SingleNumaNode => "single-numa-node",
        })
    }
}

/// Whether an `error` finding refuses the request. Ordered by strictness: `audit` < `enforce`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Report and forward.
    #[default]
    Audit,
    /// Refuse requests with an `error` finding.
    Enforce,
}

impl FromStr for Mode {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "audit" => Ok(Self::Audit),
            "enforce" => Ok(Self::Enforce),
            _ => Err(choice_error(s, "audit, enforce")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Audit => "audit",
            Self::Enforce => "enforce",
        })
    }
}

/// How far a pod's `kata-topo.io/*` annotations may move what the node's configuration sets
/// (`pod_overrides` in `[topology_guard]`): the operator's configuration is the ceiling of
/// what a pod may weaken.
///
/// "Stricter" means: for `mode`, `enforce` over `audit`; for `policy`, a policy under which no
/// rule weighs less than under the configured one, read off the severity table
/// ([`crate::check::rule::at_least_as_strict`]: none < restricted < single-numa-node,
/// best-effort < restricted, and none and best-effort not comparable, since best-effort
/// turns `none`'s hard errors into warnings); for `numa-nodes`, a subset of the nodes the
/// container's baseline allows (any nodes of the host when there is no baseline yet, as at a
/// first create). An annotation that is not allowed is ignored — the configured value, or the
/// baseline's nodes, stand — and an `override-ignored` finding names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PodOverrides {
    /// Annotations apply when they are at least as strict as the configuration.
    #[default]
    StricterOnly,
    /// Annotations apply whatever they say, weaker ones too.
    Any,
    /// Annotations never apply: the configuration (and the baseline) alone decide.
    None,
}

impl FromStr for PodOverrides {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "stricter-only" => Ok(Self::StricterOnly),
            "any" => Ok(Self::Any),
            "none" => Ok(Self::None),
            _ => Err(choice_error(s, "stricter-only, any, none")),
        }
    }
}

impl fmt::Display for PodOverrides {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::StricterOnly => "stricter-only",
            Self::Any => "any",
            Self::None => "none",
        })
    }
}

impl PodOverrides {
    /// Whether an annotation asking for a value at least as strict as the configuration's
    /// (`stricter`) applies.
    pub(crate) fn allows(self, stricter: bool) -> bool {
        match self {
            Self::Any => true,
            Self::StricterOnly => stricter,
            Self::None => false,
        }
    }

    /// Why an annotation is ignored under this setting.
    pub(crate) fn refusal(self) -> &'static str {
        match self {
            Self::StricterOnly => "it would weaken what the node's configuration sets",
            Self::Any | Self::None => "pods may not override the node's configuration",
        }
    }
}

/// Configured defaults (`[topology_guard]` or CLI defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Defaults {
    /// `default_policy`.
    pub policy: Policy,
    /// `mode`.
    pub mode: Mode,
    /// `fail_closed`: a `check-failed` finding is an error.
    pub fail_closed: bool,
    /// `pod_overrides`: how far a pod's annotations may move `policy` and `mode` (and the
    /// allowed nodes from the baseline's).
    pub pod_overrides: PodOverrides,
}
