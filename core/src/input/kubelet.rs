//! What the kubelet says about a pod, as domain types: the node's kubelet settings
//! (`kubelet_config` and the drop-ins of `kubelet_config_dir`, merged as the kubelet merges
//! them) and what its Topology Manager admitted for each container (the PodResources API's
//! answer). No transport here: `kata-topo-kubelet` asks the kubelet and turns its messages
//! into these; the CLI reads a recorded answer as JSON.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::check::policy::{ChoiceError, Policy};
use crate::idset::{IdSet, MAX_ID};

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

/// The largest kubelet configuration file (or drop-in) read.
const MAX_KUBELET_CONFIG_BYTES: u64 = 1024 * 1024;
/// The most drop-ins read: a node has a handful; more is not a configuration kata-topo can
/// vouch for.
const MAX_DROP_INS: usize = 128;
/// The deepest directory of drop-ins walked below `kubelet_config_dir`.
const MAX_DROP_IN_DEPTH: usize = 8;

/// Why the kubelet's configuration gave no settings: each names the file, and says why the
/// settings cannot be known from it.
#[derive(Debug, thiserror::Error)]
pub enum KubeletConfigError {
    /// A file or directory could not be read (missing, a link, another user's, too large,
    /// not a file).
    #[error("cannot read the kubelet's configuration {path}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// Not a YAML (or JSON) mapping: the kubelet would refuse it too.
    #[error("the kubelet's configuration {file} is not a YAML mapping: {why}")]
    Malformed {
        /// The file.
        file: String,
        /// What the parser said.
        why: String,
    },
    /// A setting kata-topo reads has a value it does not know.
    #[error(
        "the kubelet's configuration {file} has {key}: {value:?}, which is not one of {expected}"
    )]
    Invalid {
        /// The file.
        file: String,
        /// The kubelet's key.
        key: &'static str,
        /// The value, shortened.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// A drop-in sets a setting to `null`: the kubelet's JSON merge patch removes the key, and
    /// what the kubelet then runs with (an earlier file's value, or its default) depends on
    /// its version.
    #[error("the kubelet's drop-in {file} sets {key} to null, which leaves its value to the kubelet's version")]
    Null {
        /// The file.
        file: String,
        /// The kubelet's key.
        key: &'static str,
    },
    /// More drop-ins, or deeper, than kata-topo reads.
    #[error("the kubelet's drop-in directory {dir} holds more than {MAX_DROP_INS} drop-ins or is deeper than {MAX_DROP_IN_DEPTH} levels")]
    TooMany {
        /// The directory.
        dir: PathBuf,
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
    /// The file that set `topologyManagerPolicy` last (the configuration or a drop-in);
    /// `None`: none did, the kubelet's default holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_from: Option<String>,
}

impl Default for KubeletSettings {
    fn default() -> Self {
        Self {
            topology_manager_policy: Policy::None,
            topology_manager_scope: TopologyScope::Container,
            cpu_manager_policy: "none".into(),
            memory_manager_policy: "None".into(),
            policy_from: None,
        }
    }
}

impl KubeletSettings {
    /// Reads the kubelet's configuration file alone (a link is not followed; at most 1 MiB).
    pub fn read(path: &Path) -> Result<Self, KubeletConfigError> {
        Self::read_merged(path, None)
    }

    /// Reads the kubelet's configuration as the kubelet merges it (`--config`, then
    /// `--config-dir`): the file, then each drop-in of `config_dir` over it. The kubelet walks
    /// that directory depth first in lexical order of the names at each level (Go's
    /// `filepath.WalkDir`), takes every file whose name ends in `.conf`, and applies each as a
    /// JSON merge patch: a later file's setting replaces an earlier one's. Anything that
    /// leaves the merged settings unknowable is an error naming the file: a drop-in that is a
    /// link (which the kubelet would follow), another user's or writable by others, not a
    /// YAML mapping, or that sets one of the settings read to `null`; a missing directory
    /// (the kubelet would not start). The kubelet's own command-line flags, which override
    /// both, are not read here.
    pub fn read_merged(path: &Path, config_dir: Option<&Path>) -> Result<Self, KubeletConfigError> {
        let text = crate::files::read_text_bounded_nofollow(path, MAX_KUBELET_CONFIG_BYTES)
            .map_err(|source| KubeletConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        let mut settings = Self::default();
        settings.apply(&text, &path.display().to_string(), false)?;
        if let Some(dir) = config_dir {
            let mut files = Vec::new();
            drop_ins(dir, dir, 0, &mut files)?;
            for (file, text) in files {
                settings.apply(&text, &file.display().to_string(), true)?;
            }
        }
        Ok(settings)
    }

    /// Parses a `KubeletConfiguration` (YAML, or its JSON form). Only the four top-level
    /// settings are read; everything else in the file is the kubelet's business.
    pub fn parse(text: &str) -> Result<Self, KubeletConfigError> {
        let mut settings = Self::default();
        settings.apply(text, "(text)", false)?;
        Ok(settings)
    }

    /// Applies one file's settings over these (`file` names it in errors; a drop-in may not
    /// set a setting to `null`).
    fn apply(&mut self, text: &str, file: &str, drop_in: bool) -> Result<(), KubeletConfigError> {
        let doc: serde_yaml::Value =
            serde_yaml::from_str(text).map_err(|e| KubeletConfigError::Malformed {
                file: file.to_string(),
                why: e.to_string().replace('\n', " "),
            })?;
        let map = match doc {
            // An empty file sets nothing.
            serde_yaml::Value::Null => return Ok(()),
            serde_yaml::Value::Mapping(m) => m,
            _ => {
                return Err(KubeletConfigError::Malformed {
                    file: file.to_string(),
                    why: "its top level is not a mapping".into(),
                })
            }
        };
        let short = |v: &str| v.chars().take(64).collect::<String>();
        let get = |key: &'static str| -> Result<Option<String>, KubeletConfigError> {
            match map.get(key) {
                None => Ok(None),
                Some(serde_yaml::Value::Null) if drop_in => Err(KubeletConfigError::Null {
                    file: file.to_string(),
                    key,
                }),
                // In the configuration itself, null is the kubelet's default.
                Some(serde_yaml::Value::Null) => Ok(None),
                Some(serde_yaml::Value::String(v)) => Ok(Some(v.clone())),
                Some(other) => Err(KubeletConfigError::Invalid {
                    file: file.to_string(),
                    key,
                    value: short(&format!("{other:?}")),
                    expected: "a string",
                }),
            }
        };
        if let Some(v) = get("topologyManagerPolicy")? {
            self.topology_manager_policy =
                v.parse()
                    .map_err(|e: ChoiceError| KubeletConfigError::Invalid {
                        file: file.to_string(),
                        key: "topologyManagerPolicy",
                        value: e.value,
                        expected: e.expected,
                    })?;
            self.policy_from = Some(file.to_string());
        }
        if let Some(v) = get("topologyManagerScope")? {
            self.topology_manager_scope = match v.as_str() {
                "container" => TopologyScope::Container,
                "pod" => TopologyScope::Pod,
                _ => {
                    return Err(KubeletConfigError::Invalid {
                        file: file.to_string(),
                        key: "topologyManagerScope",
                        value: short(&v),
                        expected: "container, pod",
                    })
                }
            };
        }
        if let Some(v) = get("cpuManagerPolicy")? {
            self.cpu_manager_policy = short(&v);
        }
        if let Some(v) = get("memoryManagerPolicy")? {
            self.memory_manager_policy = short(&v);
        }
        Ok(())
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

/// The drop-ins below `dir` (the walk's current directory under `root`), in the kubelet's
/// order, each with its text, appended to `out`.
fn drop_ins(
    root: &Path,
    dir: &Path,
    depth: usize,
    out: &mut Vec<(PathBuf, String)>,
) -> Result<(), KubeletConfigError> {
    let read = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KubeletConfigError::Read { path, source }
    };
    let too_many = || KubeletConfigError::TooMany {
        dir: root.to_path_buf(),
    };
    if depth > MAX_DROP_IN_DEPTH {
        return Err(too_many());
    }
    let opened = crate::files::Dir::open_private(dir, None).map_err(read(dir))?;
    let mut names = opened.names().map_err(read(dir))?;
    // Go's sort of the names: by their bytes, as Rust orders strings.
    names.sort_unstable();
    for name in names {
        let path = dir.join(&name);
        let meta = std::fs::symlink_metadata(&path).map_err(read(&path))?;
        if meta.is_dir() {
            drop_ins(root, &path, depth + 1, out)?;
        } else if name.ends_with(".conf") {
            if out.len() == MAX_DROP_INS {
                return Err(too_many());
            }
            let bytes = opened
                .read_private(&name, MAX_KUBELET_CONFIG_BYTES)
                .map_err(read(&path))?;
            let text = String::from_utf8(bytes).map_err(|_| KubeletConfigError::Malformed {
                file: path.display().to_string(),
                why: "not UTF-8".into(),
            })?;
            out.push((path, text));
        }
    }
    Ok(())
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

/// What the kubelet admitted for one pod: the PodResources API's `PodResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodAdmission {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its containers (restartable init containers too, as the kubelet lists them).
    pub containers: Vec<ContainerAdmission>,
}

/// What the kubelet admitted for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAdmission {
    /// The container's name.
    pub name: String,
    /// The exclusive CPUs the CPU manager assigned; empty for a container of the shared pool.
    pub cpu_ids: IdSet,
    /// The memory the memory manager assigned, per type, with its NUMA nodes.
    pub memory: Vec<MemoryAdmission>,
    /// The devices device plugins allocated, with the topology they were admitted with.
    pub devices: Vec<DeviceAdmission>,
}

/// Memory of one type the memory manager assigned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAdmission {
    /// `memory`, `hugepages-2Mi`, ...
    pub memory_type: String,
    /// Bytes.
    pub size: u64,
    pub numa_nodes: IdSet,
}

/// Devices of one resource a device plugin allocated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAdmission {
    /// The extended resource (`kata-topo.io/vfio`).
    pub resource_name: String,
    /// The plugin's device ids (kata-topo's plugin: PCI bus ids).
    pub device_ids: Vec<String>,
    /// The NUMA nodes of its topology hint; empty when the plugin gave none.
    pub numa_nodes: IdSet,
}

impl ContainerAdmission {
    /// The NUMA nodes of the memory the memory manager assigned.
    pub fn memory_nodes(&self) -> IdSet {
        self.memory
            .iter()
            .fold(IdSet::new(), |acc, m| acc.union(&m.numa_nodes))
    }

    /// The NUMA nodes of its devices' topology hints.
    pub fn device_nodes(&self) -> IdSet {
        self.devices
            .iter()
            .fold(IdSet::new(), |acc, d| acc.union(&d.numa_nodes))
    }
}

/// The largest recorded answer read.
const MAX_RECORDED_BYTES: u64 = 4 * 1024 * 1024;

impl PodAdmission {
    /// The pods of a recorded PodResources answer in JSON: a `List` answer
    /// (`{"pod_resources": [...]}`), a `Get` answer (`{"pod_resources": {...}}`) or one
    /// `PodResources`. Field names as in the `.proto` or in protobuf's JSON mapping
    /// (`podResources`, `cpuIds`, `deviceIds`, `resourceName`, `memoryType`), 64-bit numbers
    /// as JSON numbers or strings, as `grpcurl` prints them.
    pub fn from_json(text: &str) -> Result<Vec<Self>, String> {
        if text.len() as u64 > MAX_RECORDED_BYTES {
            return Err("the answer is larger than 4 MiB".into());
        }
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match field(&value, "pod_resources", "podResources") {
            Some(Value::Array(pods)) => pods.iter().map(Self::from_value).collect(),
            Some(pod @ Value::Object(_)) => Ok(vec![Self::from_value(pod)?]),
            Some(_) => Err("pod_resources is neither a list nor a pod".into()),
            None => Ok(vec![Self::from_value(&value)?]),
        }
    }

    fn from_value(pod: &Value) -> Result<Self, String> {
        if !pod.is_object() {
            return Err("a pod is not a JSON object".into());
        }
        let containers = list(pod, "containers", "containers")?
            .iter()
            .map(|c| {
                let name = string(c, "name", "name")?;
                let cpu_ids = list(c, "cpu_ids", "cpuIds")?
                    .iter()
                    .map(|v| kubelet_id(number(v)?))
                    .collect::<Result<IdSet, String>>()
                    .map_err(|e| format!("container {name}: cpu_ids: {e}"))?;
                let memory = list(c, "memory", "memory")?
                    .iter()
                    .map(|m| {
                        Ok(MemoryAdmission {
                            memory_type: string(m, "memory_type", "memoryType")?,
                            size: match field(m, "size", "size") {
                                None => 0,
                                Some(v) => u64::try_from(number(v)?)
                                    .map_err(|_| "a memory size is negative".to_string())?,
                            },
                            numa_nodes: topology(m)?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let devices = list(c, "devices", "devices")?
                    .iter()
                    .map(|d| {
                        Ok(DeviceAdmission {
                            resource_name: string(d, "resource_name", "resourceName")?,
                            device_ids: list(d, "device_ids", "deviceIds")?
                                .iter()
                                .map(|id| {
                                    id.as_str()
                                        .map(str::to_string)
                                        .ok_or_else(|| "a device id is not a string".to_string())
                                })
                                .collect::<Result<_, String>>()?,
                            numa_nodes: topology(d)?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(ContainerAdmission {
                    name,
                    cpu_ids,
                    memory,
                    devices,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            namespace: string(pod, "namespace", "namespace")?,
            name: string(pod, "name", "name")?,
            containers,
        })
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerAdmission> {
        self.containers.iter().find(|c| c.name == name)
    }
}

fn field<'v>(v: &'v Value, proto: &str, json: &str) -> Option<&'v Value> {
    v.get(proto)
        .or_else(|| v.get(json))
        .filter(|v| !v.is_null())
}

fn list<'v>(v: &'v Value, proto: &str, json: &str) -> Result<&'v [Value], String> {
    match field(v, proto, json) {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(format!("{proto} is not a list")),
    }
}

fn string(v: &Value, proto: &str, json: &str) -> Result<String, String> {
    match field(v, proto, json) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.chars().take(253).collect()),
        Some(_) => Err(format!("{proto} is not a string")),
    }
}

fn number(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("{v} is not an integer"))
}

fn topology(v: &Value) -> Result<IdSet, String> {
    let Some(t) = field(v, "topology", "topology") else {
        return Ok(IdSet::new());
    };
    list(t, "nodes", "nodes")?
        .iter()
        .map(|n| match field(n, "ID", "id") {
            Some(id) => kubelet_id(number(id)?),
            None => Ok(0),
        })
        .collect()
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

    /// A configuration and a drop-in directory: `files` are (relative path, text).
    fn kubelet_dir(config: &str, files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, config).expect("write");
        let drop_ins = dir.path().join("kubelet.conf.d");
        std::fs::create_dir(&drop_ins).expect("mkdir");
        for (name, text) in files {
            let path = drop_ins.join(name);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
        }
        (dir, file, drop_ins)
    }

    #[test]
    fn drop_ins_are_merged_as_the_kubelet_merges_them() {
        let (_dir, file, drop_ins) = kubelet_dir(
            "topologyManagerPolicy: restricted\ncpuManagerPolicy: static\n",
            &[
                // Depth first in lexical order: `a/` before `a.conf`, `05/` before both.
                ("05/x.conf", "topologyManagerPolicy: none\n"),
                (
                    "a/x.conf",
                    "topologyManagerPolicy: best-effort\ntopologyManagerScope: pod\n",
                ),
                (
                    "a.conf",
                    "{\"topologyManagerPolicy\": \"single-numa-node\"}\n",
                ),
                // Only `.conf` files count.
                ("b.yaml", "topologyManagerPolicy: none\n"),
                ("b.conf.orig", "topologyManagerPolicy: none\n"),
                ("zz/deeper/last.conf", "memoryManagerPolicy: Static\n"),
                // An empty drop-in sets nothing.
                ("empty.conf", ""),
            ],
        );
        let s = KubeletSettings::read_merged(&file, Some(&drop_ins)).expect("merged");
        assert_eq!(s.topology_manager_policy, Policy::SingleNumaNode);
        assert_eq!(s.topology_manager_scope, TopologyScope::Pod);
        assert!(s.static_cpus() && s.static_memory());
        assert_eq!(
            s.policy_from,
            Some(drop_ins.join("a.conf").display().to_string())
        );
        // The file alone, as without a drop-in directory.
        let alone = KubeletSettings::read(&file).expect("file");
        assert_eq!(alone.topology_manager_policy, Policy::Restricted);
        assert_eq!(alone.policy_from, Some(file.display().to_string()));
        assert_eq!(
            KubeletSettings::read_merged(&file, None).expect("file"),
            alone
        );
    }

    #[test]
    fn a_drop_in_that_leaves_the_policy_unknowable_is_an_error_naming_it() {
        use std::os::unix::fs::PermissionsExt;
        let config = "topologyManagerPolicy: restricted\n";
        let unknowable = |files: &[(&str, &str)], setup: &dyn Fn(&Path), named: &str| {
            let (_dir, file, drop_ins) = kubelet_dir(config, files);
            setup(&drop_ins);
            let e = KubeletSettings::read_merged(&file, Some(&drop_ins)).expect_err("unknowable");
            let text = crate::text::error_chain(&e);
            assert!(text.contains(named), "{named}: {text}");
        };
        let nothing = |_: &Path| {};
        unknowable(
            &[("10.conf", "topologyManagerPolicy: null\n")],
            &nothing,
            "10.conf sets topologyManagerPolicy to null",
        );
        unknowable(
            &[("10.conf", "topologyManagerPolicy: [a]\n")],
            &nothing,
            "10.conf has topologyManagerPolicy",
        );
        unknowable(
            &[("10.conf", "topologyManagerPolicy: strict\n")],
            &nothing,
            "10.conf has topologyManagerPolicy",
        );
        unknowable(
            &[("10.conf", "- a\n")],
            &nothing,
            "10.conf is not a YAML mapping",
        );
        unknowable(
            &[("10.conf", "a: [\n")],
            &nothing,
            "10.conf is not a YAML mapping",
        );
        // A link the kubelet would follow.
        unknowable(
            &[("real", "topologyManagerPolicy: none\n")],
            &|d: &Path| {
                std::os::unix::fs::symlink(d.join("real"), d.join("20.conf")).expect("link")
            },
            "20.conf: is a symbolic link",
        );
        // A file or a directory others may write.
        unknowable(
            &[("sub/30.conf", "topologyManagerPolicy: none\n")],
            &|d: &Path| {
                std::fs::set_permissions(
                    d.join("sub/30.conf"),
                    std::fs::Permissions::from_mode(0o666),
                )
                .expect("chmod")
            },
            "30.conf",
        );
        unknowable(
            &[],
            &|d: &Path| {
                std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o777)).expect("chmod")
            },
            "may be written by others",
        );
        // A missing directory: the kubelet would not start.
        unknowable(
            &[],
            &|d: &Path| std::fs::remove_dir(d).expect("rmdir"),
            "kubelet.conf.d",
        );
        // Too many.
        let many: Vec<(String, &str)> = (0..=MAX_DROP_INS)
            .map(|i| (format!("{i:03}.conf"), "cpuManagerPolicy: static\n"))
            .collect();
        let many: Vec<(&str, &str)> = many.iter().map(|(n, t)| (n.as_str(), *t)).collect();
        unknowable(&many, &nothing, "more than 128 drop-ins");
        // In the configuration itself, null is the default.
        let s = KubeletSettings::parse("topologyManagerPolicy: null\n").expect("null");
        assert_eq!(s.topology_manager_policy, Policy::None);
    }

    #[test]
    fn ids_the_kubelet_reports_are_bounded() {
        assert_eq!(kubelet_ids([1, 3]).expect("ids").to_string(), "1,3");
        assert!(kubelet_id(-1).is_err());
        assert!(kubelet_id(i64::from(MAX_ID) + 1).is_err());
        assert_eq!("kubelet".parse(), Ok(IntentSource::Kubelet));
        assert!("Auto".parse::<IntentSource>().is_err());
    }

    /// `List` as grpcurl prints it (protobuf's JSON mapping: 64-bit numbers as strings) for a
    /// Guaranteed container with CPU 1, memory and a VFIO device on node 1, and a container of
    /// the shared pool.
    const LIST_JSON: &str = r#"{"podResources": [{"name": "guaranteed", "namespace": "default",
      "containers": [
        {"name": "app", "cpuIds": ["1"],
         "memory": [{"memoryType": "memory", "size": "1073741824", "topology": {"nodes": [{"ID": "1"}]}}],
         "devices": [{"resourceName": "kata-topo.io/vfio", "deviceIds": ["0000:81:00.0"],
                      "topology": {"nodes": [{"ID": "1"}]}}]},
        {"name": "sidecar"}
      ]}]}"#;

    #[test]
    fn reads_a_recorded_answer_in_either_json_form() {
        let pods = PodAdmission::from_json(LIST_JSON).expect("valid");
        assert_eq!(pods.len(), 1);
        let app = pods[0].container("app").expect("app");
        assert_eq!(app.cpu_ids.to_string(), "1");
        assert_eq!(app.memory_nodes().to_string(), "1");
        assert_eq!(app.device_nodes().to_string(), "1");
        assert_eq!(app.devices[0].device_ids, ["0000:81:00.0"]);
        assert_eq!(app.memory[0].size, 1 << 30);
        let sidecar = pods[0].container("sidecar").expect("sidecar");
        assert!(sidecar.cpu_ids.is_empty() && sidecar.devices.is_empty());
        // The same as `Get` with the .proto's names and plain numbers.
        let get = r#"{"pod_resources": {"name": "guaranteed", "namespace": "default",
          "containers": [{"name": "app", "cpu_ids": [1], "memory": [{"memory_type": "memory",
          "size": 1073741824, "topology": {"nodes": [{"ID": 1}]}}], "devices": [{"resource_name":
          "kata-topo.io/vfio", "device_ids": ["0000:81:00.0"], "topology": {"nodes": [{"ID": 1}]}}]},
          {"name": "sidecar"}]}}"#;
        assert_eq!(PodAdmission::from_json(get).expect("valid"), pods);
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        for bad in [
            "",
            "[]",
            r#"{"pod_resources": 3}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": [-1]}]}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": ["x"]}]}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": [99999999]}]}"#,
            r#"{"containers": [{"name": 3}]}"#,
            r#"{"containers": [{"memory": [{"size": -5}]}]}"#,
            r#"{"containers": [{"devices": [{"device_ids": [1]}]}]}"#,
        ] {
            assert!(PodAdmission::from_json(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn reading_any_json_never_panics(text in "\\PC{0,200}") {
            let _ = PodAdmission::from_json(&text);
            let _ = KubeletSettings::parse(&text);
        }
    }
}
