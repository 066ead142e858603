//! What the kubelet says about a pod, as domain types: the node's kubelet settings
//! (`kubelet_config`) and what its Topology Manager admitted for each container (the
//! PodResources API's answer). No transport here: `kata-topo-kubelet` asks the kubelet and
//! turns its messages into these; the CLI reads a recorded answer as JSON.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::idset::{IdSet, MAX_ID};
use crate::intent::{ChoiceError, Policy};

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
            _ => Err(crate::intent::choice_error(s, "auto, kubelet, annotations")),
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

/// What the Topology Manager aligns: each container, or the pod as a whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyScope {
    /// Each container on its own (the kubelet's default).
    #[default]
    Container,
    /// All the pod's containers together.
    Pod,
}

impl fmt::Display for TopologyScope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Container => "container",
            Self::Pod => "pod",
        })
    }
}

/// The largest kubelet configuration read.
const MAX_KUBELET_CONFIG_BYTES: u64 = 1024 * 1024;

/// Why the kubelet's configuration gave no settings.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    /// The file could not be read (missing, a link, too large, not a file).
    #[error("cannot read the kubelet's configuration {path}")]
    Read {
        /// The file.
        path: std::path::PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A setting kata-topo reads has a value it does not know.
    #[error("the kubelet's configuration has {key}: {value:?}, which is not one of {expected}")]
    Invalid {
        /// The kubelet's key.
        key: &'static str,
        /// The value, shortened.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

/// The node's kubelet settings that decide what it aligns at admission, with the kubelet's
/// own defaults for those it does not set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeletSettings {
    /// `topologyManagerPolicy` (default `none`): the policy of pods whose intent is the
    /// kubelet's.
    pub topology_manager_policy: Policy,
    /// `topologyManagerScope` (default `container`).
    pub topology_manager_scope: TopologyScope,
    /// `cpuManagerPolicy` (`none` default, or `static`: exclusive CPUs for Guaranteed pods).
    pub cpu_manager_policy: String,
    /// `memoryManagerPolicy` (`None` default, or `Static`: memory NUMA nodes per container).
    pub memory_manager_policy: String,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        Self {
            topology_manager_policy: Policy::None,
            topology_manager_scope: TopologyScope::Container,
            cpu_manager_policy: "none".into(),
            memory_manager_policy: "None".into(),
        }
    }
}

impl KubeletSettings {
    /// Reads the kubelet's configuration file (a link is not followed; at most 1 MiB).
    pub fn read(path: &Path) -> Result<Self, KubeletConfigError> {
        let text = crate::fsutil::read_text_bounded_nofollow(path, MAX_KUBELET_CONFIG_BYTES)
            .map_err(|source| KubeletConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        Self::parse(&text)
    }

    /// Parses a `KubeletConfiguration` (YAML, or its JSON form). Only the four top-level
    /// scalar settings are read; everything else in the file is the kubelet's business.
    pub fn parse(text: &str) -> Result<Self, KubeletConfigError> {
        let get = |key: &str| -> Option<String> {
            if text.trim_start().starts_with('{') {
                let json: Value = serde_json::from_str(text).ok()?;
                return json.get(key)?.as_str().map(str::to_string);
            }
            text.lines().find_map(|line| top_level_scalar(line, key))
        };
        let mut settings = Self::default();
        if let Some(v) = get("topologyManagerPolicy") {
            settings.topology_manager_policy =
                v.parse()
                    .map_err(|e: ChoiceError| KubeletConfigError::Invalid {
                        key: "topologyManagerPolicy",
                        value: e.value,
                        expected: e.expected,
                    })?;
        }
        if let Some(v) = get("topologyManagerScope") {
            settings.topology_manager_scope = match v.as_str() {
                "container" => TopologyScope::Container,
                "pod" => TopologyScope::Pod,
                _ => {
                    return Err(KubeletConfigError::Invalid {
                        key: "topologyManagerScope",
                        value: v.chars().take(64).collect(),
                        expected: "container, pod",
                    })
                }
            };
        }
        if let Some(v) = get("cpuManagerPolicy") {
            settings.cpu_manager_policy = v.chars().take(64).collect();
        }
        if let Some(v) = get("memoryManagerPolicy") {
            settings.memory_manager_policy = v.chars().take(64).collect();
        }
        Ok(settings)
    }

    /// Whether the CPU manager hands out exclusive CPUs.
    pub fn static_cpus(&self) -> bool {
        self.cpu_manager_policy.eq_ignore_ascii_case("static")
    }

    /// Whether the memory manager pins memory to NUMA nodes.
    pub fn static_memory(&self) -> bool {
        self.memory_manager_policy.eq_ignore_ascii_case("static")
    }
}

/// The value of `key: value` on a line of a YAML document's top-level mapping: no indent,
/// an optional `#` comment, optional quotes.
fn top_level_scalar(line: &str, key: &str) -> Option<String> {
    let rest = line.strip_prefix(key)?.strip_prefix(':')?;
    let value = rest.trim();
    let value = match value.chars().next() {
        Some(q @ ('"' | '\'')) => value[1..].split(q).next().unwrap_or(""),
        _ => value.split(" #").next().unwrap_or("").trim(),
    };
    Some(value.to_string())
}

/// Turns an id the kubelet reported (an `int64`) into a set member, refusing what no CPU or
/// NUMA node can be.
pub fn kubelet_id(id: i64) -> Result<u32, String> {
    u32::try_from(id)
        .ok()
        .filter(|&i| i <= MAX_ID)
        .ok_or_else(|| format!("{id} is not a CPU or NUMA node id"))
}

/// Several ids as a set.
pub fn kubelet_ids(ids: impl IntoIterator<Item = i64>) -> Result<IdSet, String> {
    ids.into_iter().map(kubelet_id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_four_settings_from_a_kubelet_configuration() {
        let yaml = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                    cpuManagerPolicy: static\nreservedSystemCPUs: \"0\"\n\
                    memoryManagerPolicy: Static\n\
                    topologyManagerPolicy: \"single-numa-node\" # aligned\n\
                    topologyManagerScope: 'pod'\nevictionHard:\n  topologyManagerPolicy: none\n";
        let s = KubeletSettings::parse(yaml).expect("valid");
        assert_eq!(s.topology_manager_policy, Policy::SingleNumaNode);
        assert_eq!(s.topology_manager_scope, TopologyScope::Pod);
        assert!(s.static_cpus() && s.static_memory());
        // The kubelet's defaults for what it does not set.
        let s = KubeletSettings::parse("kind: KubeletConfiguration\n").expect("valid");
        assert_eq!(s, KubeletSettings::default());
        assert!(!s.static_cpus() && !s.static_memory());
        // The JSON form.
        let s = KubeletSettings::parse(r#"{"topologyManagerPolicy": "restricted"}"#).expect("json");
        assert_eq!(s.topology_manager_policy, Policy::Restricted);
    }

    #[test]
    fn an_unknown_policy_or_scope_names_the_setting() {
        let e = KubeletSettings::parse("topologyManagerPolicy: strict\n").expect_err("bad");
        assert!(e.to_string().contains("topologyManagerPolicy"), "{e}");
        let e = KubeletSettings::parse("topologyManagerScope: node\n").expect_err("bad");
        assert!(e.to_string().contains("topologyManagerScope"), "{e}");
    }

    #[test]
    fn a_missing_file_or_a_link_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        assert!(KubeletSettings::read(&file).is_err());
        std::fs::write(&file, "topologyManagerPolicy: restricted\n").expect("write");
        let link = dir.path().join("link.yaml");
        std::os::unix::fs::symlink(&file, &link).expect("link");
        assert!(KubeletSettings::read(&link).is_err());
        assert_eq!(
            KubeletSettings::read(&file)
                .expect("reads")
                .topology_manager_policy,
            Policy::Restricted
        );
    }

    #[test]
    fn ids_the_kubelet_reports_are_bounded() {
        assert_eq!(kubelet_ids([1, 3]).expect("ids").to_string(), "1,3");
        assert!(kubelet_id(-1).is_err());
        assert!(kubelet_id(i64::from(MAX_ID) + 1).is_err());
        assert_eq!("kubelet".parse(), Ok(IntentSource::Kubelet));
        assert!("Auto".parse::<IntentSource>().is_err());
    }
}
