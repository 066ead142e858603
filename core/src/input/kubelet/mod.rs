//! What the kubelet says about a pod, as domain types: the node's kubelet settings
//! ([`config`]: `kubelet_config` and the drop-ins of `kubelet_config_dir`, merged as the
//! kubelet merges them) and what its Topology Manager admitted for each container
//! ([`pod_resources`]: the PodResources API's answer), taken together as a request's
//! [`KubeletView`]. No transport here: `kata-topo-kubelet` asks the kubelet and turns its
//! messages into these; the CLI reads a recorded answer as JSON.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::check::policy::ChoiceError;

pub mod config;
pub mod pod_resources;

pub use config::{KubeletConfigError, KubeletSettings, TopologyScope};
pub use pod_resources::{
    kubelet_id, kubelet_ids, ContainerAdmission, DeviceAdmission, MemoryAdmission, PodAdmission,
};

/// Where a pod's intent is taken from (`intent_source` in `[topology_guard]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum IntentSource {
    /// The kubelet when its PodResources socket exists, else the annotations.
    #[default]
    Auto,
    /// Always the kubelet (a failure to ask is a warning and a fallback).
    Kubelet,
    /// Never the kubelet: annotations and baseline only.
    Annotations,
}

impl FromStr for IntentSource {
    type Err = ChoiceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "kubelet" => Ok(Self::Kubelet),
            "annotations" => Ok(Self::Annotations),
            _ => Err(crate::check::policy::choice_error(
                s,
                "auto, kubelet, annotations",
            )),
        }
    }
}

impl fmt::Display for IntentSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Kubelet => "kubelet",
            Self::Annotations => "annotations",
        })
    }
}

/// What the kubelet said about a pod, or why it said nothing usable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletView {
    /// The pod as the kubelet admitted it, under the node's kubelet settings.
    Admitted {
        pod: PodAdmission,
        /// The node's kubelet settings.
        settings: KubeletSettings,
    },
    /// The kubelet was asked and gave nothing usable: why (timeout, refusal, garbage, a
    /// socket not root's, a pod it does not know).
    Unavailable {
        /// Why, in words.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intent_sources_are_named_as_configured() {
        assert_eq!("kubelet".parse(), Ok(IntentSource::Kubelet));
        assert!("Auto".parse::<IntentSource>().is_err());
    }
}
