//! The node's kubelet settings that say what the Topology Manager admits: read from
//! `kubelet_config` and the drop-ins of `kubelet_config_dir`, merged as the kubelet merges
//! them.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::check::policy::{ChoiceError, Policy};

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
}
