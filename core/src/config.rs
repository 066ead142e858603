//! `[topology_guard]`: kata-topo's table in the Kata configuration file.
//!
//! Found, in order: the runtime option `ConfigPath` containerd passes on `start`'s stdin (the
//! same file Kata reads), the file named by `KATA_TOPO_CONFIG`, Kata's default paths. A file
//! without the table gives the defaults. An unknown key or a bad value is an error naming the
//! file, the key and the line — never a silent default.

use std::path::{Path, PathBuf};

use crate::host::TopologySource;
use crate::input::kubelet::IntentSource;
use crate::{Defaults, Mode, PodOverrides, Policy};
use serde::Deserialize;

/// The environment variable naming a configuration file.
pub const ENV_CONFIG: &str = "KATA_TOPO_CONFIG";

/// Kata's default configuration paths, searched when nothing names a file.
pub const KATA_DEFAULT_PATHS: &[&str] = &[
    "/etc/kata-containers/configuration.toml",
    "/usr/share/defaults/kata-containers/configuration.toml",
    "/opt/kata/share/defaults/kata-containers/configuration.toml",
];

/// The largest configuration file read.
const MAX_CONFIG_BYTES: u64 = 4 * 1024 * 1024;

/// Why the configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("kata-topo: cannot read configuration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The file is too large.
    #[error("kata-topo: configuration {0} is larger than 4 MiB")]
    TooLarge(PathBuf),
    /// TOML or `[topology_guard]` is invalid; the message names the key and line.
    #[error("kata-topo: invalid [topology_guard] in {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// toml's words, flattened to one line.
        message: String,
    },
}

fn default_delegate() -> String {
    "containerd-shim-kata-v2".to_string()
}
fn default_state_dir() -> PathBuf {
    PathBuf::from("/run/kata-topo")
}
fn default_sysfs() -> PathBuf {
    PathBuf::from("/sys")
}
fn default_procfs() -> PathBuf {
    PathBuf::from("/proc")
}
fn default_log_file() -> PathBuf {
    PathBuf::from("/var/log/kata-topo.log")
}
fn default_refresh() -> u64 {
    30
}
fn default_kubelet_socket() -> PathBuf {
    PathBuf::from("/var/lib/kubelet/pod-resources/kubelet.sock")
}
fn default_kubelet_config() -> PathBuf {
    PathBuf::from("/var/lib/kubelet/config.yaml")
}
/// A local `Get` answers in well under 2 ms (p99 measured against a gRPC server on a unix
/// socket); 100 ms leaves a busy kubelet fifty times that before the check falls back.
fn default_kubelet_timeout() -> u64 {
    100
}

fn default_kubeconfig() -> Option<PathBuf> {
    Some(PathBuf::from("/etc/kubernetes/kubelet.conf"))
}
/// Two GETs over a fresh TLS connection each to an API server on the node's network: a few
/// milliseconds when it is well, tens when it is busy (its own objective for a single-object
/// read is one second at the 99th percentile, across all clients). 500 ms bounds what an
/// update or recreate may wait for it at half a second — containerd and the kubelet wait
/// minutes for the same call — and leaves a loaded API server a hundred times its usual answer.
fn default_api_timeout() -> u64 {
    500
}

/// An optional path: `""` is none (`kubeconfig = ""` switches the affinity check off,
/// `kubelet_config_dir = ""` says the kubelet has no drop-in directory).
fn optional_path<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<PathBuf>, D::Error> {
    let p = PathBuf::deserialize(d)?;
    Ok((!p.as_os_str().is_empty()).then_some(p))
}

/// The longest `api_timeout_ms` accepted: the API server is read while containerd waits.
pub const MAX_API_TIMEOUT_MS: u64 = 5000;

/// The longest `kubelet_timeout_ms` accepted: the kubelet is asked while containerd waits.
pub const MAX_KUBELET_TIMEOUT_MS: u64 = 2000;

/// The `[topology_guard]` table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The real shim: a path, or a name on PATH.
    #[serde(default = "default_delegate")]
    pub delegate_shim: String,
    /// `audit` (report, forward) or `enforce` (refuse requests with an `error` finding).
    #[serde(default)]
    pub mode: Mode,
    /// The policy for pods without `kata-topo.io/policy`.
    #[serde(default)]
    pub default_policy: Policy,
    /// An hwloc XML to use instead of the live machine (tests, demos).
    #[serde(default)]
    pub topology_xml: Option<PathBuf>,
    /// sysfs root for the VFIO map.
    #[serde(default = "default_sysfs")]
    pub sysfs_root: PathBuf,
    /// procfs root for the VM view.
    #[serde(default = "default_procfs")]
    pub procfs_root: PathBuf,
    /// Baselines and per-task state (0700).
    #[serde(default = "default_state_dir")]
    pub state_dir: PathBuf,
    /// JSON log lines, one per finding.
    #[serde(default = "default_log_file")]
    pub log_file: PathBuf,
    /// Prometheus textfile directory: one `kata-topo-<ns>-<sandbox>.prom` per sandbox.
    #[serde(default)]
    pub metrics_dir: Option<PathBuf>,
    /// In enforce mode, refuse requests whose check could not run.
    #[serde(default)]
    pub fail_closed: bool,
    /// How often the topology is reloaded off the request path, in seconds (0: never).
    #[serde(default = "default_refresh")]
    pub topology_refresh_seconds: u64,
    /// Keep the live topology as hwloc XML under `state_dir`, shared by every pod of the node
    /// and rediscovered when the machine changes (see [`crate::host::cache`]).
    #[serde(default = "default_true")]
    pub topology_cache: bool,
    /// How far a pod's `kata-topo.io/*` annotations may move `mode`, `default_policy` and the
    /// baseline's nodes: `stricter-only` (default), `any` or `none` ([`crate::PodOverrides`]).
    #[serde(default)]
    pub pod_overrides: PodOverrides,
    /// Where a pod's intent comes from: `auto` (default: the kubelet when its socket
    /// exists), `kubelet` or `annotations` ([`crate::input::kubelet::IntentSource`]).
    #[serde(default)]
    pub intent_source: IntentSource,
    /// The kubelet's PodResources socket.
    #[serde(default = "default_kubelet_socket")]
    pub kubelet_pod_resources_socket: PathBuf,
    /// The kubelet's configuration: its Topology Manager policy and scope, CPU and memory
    /// manager policies.
    #[serde(default = "default_kubelet_config")]
    pub kubelet_config: PathBuf,
    /// The kubelet's drop-in directory (its `--config-dir`), merged over `kubelet_config` as
    /// the kubelet merges it; `None` (the default, or `""`): the kubelet runs without one.
    #[serde(default, deserialize_with = "optional_path")]
    pub kubelet_config_dir: Option<PathBuf>,
    /// The longest one question to the kubelet may take, in milliseconds.
    #[serde(default = "default_kubelet_timeout")]
    pub kubelet_timeout_ms: u64,
    /// The node's credentials for the API server (the kubelet's kubeconfig): the pods' node
    /// affinity is re-checked against the node's labels when it exists; `""` (`None`) or no
    /// file switches the check off.
    #[serde(default = "default_kubeconfig", deserialize_with = "optional_path")]
    pub kubeconfig: Option<PathBuf>,
    /// The node's name in the API server; `None`: the node the kubeconfig's client
    /// certificate names (`system:node:<name>`), else the host name, in lower case, as the
    /// kubelet names its node.
    #[serde(default)]
    pub node_name: Option<String>,
    /// The longest the API server reads of one request may take, in milliseconds.
    #[serde(default = "default_api_timeout")]
    pub api_timeout_ms: u64,
    /// NRI's socket, where `kata-topo-nri` connects (the wrapper and the hook ignore it).
    #[serde(default = "default_nri_socket")]
    pub nri_socket: PathBuf,
    /// The runtime handlers whose pods `kata-topo-nri` checks; empty (the default): all.
    #[serde(default)]
    pub nri_runtime_handlers: Vec<String>,
    /// `kata-topo-nri`'s plugin index: two digits; NRI calls plugins in ascending order.
    #[serde(default = "default_nri_plugin_index")]
    pub nri_plugin_index: String,
    /// The longest `kata-topo-nri` takes to answer a request, in milliseconds (default 200;
    /// never more than half of the runtime's plugin request timeout): a check still running
    /// then is answered "no adjustment" and logged `nri-unchecked`.
    #[serde(default = "default_nri_answer_ms")]
    pub nri_answer_ms: u64,
    /// containerd's ttrpc socket (`/run/containerd/containerd.sock.ttrpc`), where
    /// `kata-topo-nri` publishes its verdicts on `/kata-topo/mismatch` as the wrapper does
    /// through the address containerd gives its shims; unset or `""` (the default): no
    /// containerd events (CRI-O has no event service). The wrapper and the hook ignore it.
    #[serde(default, deserialize_with = "optional_path")]
    pub nri_events_socket: Option<PathBuf>,
}

fn default_nri_answer_ms() -> u64 {
    200
}
/// The longest `nri_answer_ms` accepted (the runtime's own timeout halves it further).
pub const MAX_NRI_ANSWER_MS: u64 = 5000;

fn default_nri_socket() -> PathBuf {
    PathBuf::from("/var/run/nri/nri.sock")
}
/// Late among the plugins: the NRI plugins that place containers (topology-aware,
/// balloons) conventionally take low indices.
fn default_nri_plugin_index() -> String {
    "90".to_string()
}

fn default_true() -> bool {
    true
}

impl Default for Config {
    fn default() -> Self {
        Self {
            delegate_shim: default_delegate(),
            mode: Mode::default(),
            default_policy: Policy::default(),
            topology_xml: None,
            sysfs_root: default_sysfs(),
            procfs_root: default_procfs(),
            state_dir: default_state_dir(),
            log_file: default_log_file(),
            metrics_dir: None,
            fail_closed: false,
            topology_refresh_seconds: default_refresh(),
            topology_cache: true,
            pod_overrides: PodOverrides::default(),
            intent_source: IntentSource::default(),
            kubelet_pod_resources_socket: default_kubelet_socket(),
            kubelet_config: default_kubelet_config(),
            kubelet_config_dir: None,
            kubelet_timeout_ms: default_kubelet_timeout(),
            kubeconfig: default_kubeconfig(),
            node_name: None,
            api_timeout_ms: default_api_timeout(),
            nri_socket: default_nri_socket(),
            nri_runtime_handlers: Vec::new(),
            nri_plugin_index: default_nri_plugin_index(),
            nri_answer_ms: default_nri_answer_ms(),
            nri_events_socket: None,
        }
    }
}

#[derive(Deserialize)]
struct File {
    topology_guard: Option<Config>,
}

impl Config {
    /// Parses a configuration file's text; other tables (Kata's own) are ignored.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file: File = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: one_line(&e.to_string()),
        })?;
        let config = file.topology_guard.unwrap_or_default();
        config.validate(path)?;
        Ok(config)
    }

    fn validate(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, why: &str| ConfigError::Invalid {
            path: path.to_path_buf(),
            message: format!("key `{key}` {why}"),
        };
        if self.delegate_shim.trim().is_empty() {
            return Err(invalid("delegate_shim", "is empty"));
        }
        if self.delegate_shim.contains("kata-topo") {
            return Err(invalid(
                "delegate_shim",
                "names kata-topo itself: it must be the real shim (containerd-shim-kata-v2)",
            ));
        }
        for (key, p) in [
            ("state_dir", Some(&self.state_dir)),
            ("sysfs_root", Some(&self.sysfs_root)),
            ("procfs_root", Some(&self.procfs_root)),
            ("log_file", Some(&self.log_file)),
            ("metrics_dir", self.metrics_dir.as_ref()),
            ("topology_xml", self.topology_xml.as_ref()),
            (
                "kubelet_pod_resources_socket",
                Some(&self.kubelet_pod_resources_socket),
            ),
            ("kubelet_config", Some(&self.kubelet_config)),
            ("kubelet_config_dir", self.kubelet_config_dir.as_ref()),
            ("kubeconfig", self.kubeconfig.as_ref()),
            ("nri_socket", Some(&self.nri_socket)),
            ("nri_events_socket", self.nri_events_socket.as_ref()),
        ] {
            if let Some(p) = p {
                if !p.is_absolute() {
                    return Err(invalid(
                        key,
                        &format!("must be an absolute path, not {p:?}"),
                    ));
                }
            }
        }
        if self.state_dir == Path::new("/") {
            return Err(invalid("state_dir", "must not be /"));
        }
        if self.kubelet_timeout_ms == 0 || self.kubelet_timeout_ms > MAX_KUBELET_TIMEOUT_MS {
            return Err(invalid(
                "kubelet_timeout_ms",
                &format!(
                    "must be between 1 and {MAX_KUBELET_TIMEOUT_MS}, not {}",
                    self.kubelet_timeout_ms
                ),
            ));
        }
        if self.api_timeout_ms == 0 || self.api_timeout_ms > MAX_API_TIMEOUT_MS {
            return Err(invalid(
                "api_timeout_ms",
                &format!(
                    "must be between 1 and {MAX_API_TIMEOUT_MS}, not {}",
                    self.api_timeout_ms
                ),
            ));
        }
        if self.nri_answer_ms == 0 || self.nri_answer_ms > MAX_NRI_ANSWER_MS {
            return Err(invalid(
                "nri_answer_ms",
                &format!(
                    "must be between 1 and {MAX_NRI_ANSWER_MS}, not {}",
                    self.nri_answer_ms
                ),
            ));
        }
        let index = &self.nri_plugin_index;
        if index.len() != 2 || !index.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid(
                "nri_plugin_index",
                &format!("must be two digits (00 to 99), not {index:?}"),
            ));
        }
        if let Some(h) = self.nri_runtime_handlers.iter().find(|h| {
            h.is_empty() || h.len() > 253 || h.chars().any(|c| c.is_whitespace() || c.is_control())
        }) {
            return Err(invalid(
                "nri_runtime_handlers",
                &format!("must list runtime handler names, not {h:?}"),
            ));
        }
        if let Some(n) = &self.node_name {
            let ok = !n.is_empty()
                && n.len() <= 253
                && n.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !ok {
                return Err(invalid(
                    "node_name",
                    &format!("must be a Kubernetes node name (lower-case letters, digits, '-' and '.'), not {n:?}"),
                ));
            }
        }
        Ok(())
    }

    /// The defaults a check applies to pods that say nothing.
    pub fn defaults(&self) -> Defaults {
        Defaults {
            policy: self.default_policy,
            mode: self.mode,
            fail_closed: self.fail_closed,
            pod_overrides: self.pod_overrides,
        }
    }

    /// Where the host topology comes from: `topology_xml`, else the live machine.
    pub fn topology_source(&self) -> TopologySource {
        match &self.topology_xml {
            Some(p) => TopologySource::Xml(p.clone()),
            None => TopologySource::Live,
        }
    }

    /// Reads one file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = crate::files::read_text_bounded(path, MAX_CONFIG_BYTES).map_err(|source| {
            if source.kind() == std::io::ErrorKind::FileTooLarge {
                ConfigError::TooLarge(path.to_path_buf())
            } else {
                ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                }
            }
        })?;
        Self::parse(&text, path)
    }

    /// Resolves and reads the configuration: `ConfigPath` (the runtime option containerd
    /// passes, when given), then the file named by `KATA_TOPO_CONFIG`, then Kata's default
    /// paths, else the built-in defaults.
    pub fn resolve(config_path: Option<&Path>) -> Result<Resolved, ConfigError> {
        let env = std::env::var_os(ENV_CONFIG).map(PathBuf::from);
        Self::resolve_from(config_path, env.as_deref())
    }

    /// [`Config::resolve`] with the environment variable's value given.
    pub fn resolve_from(
        config_path: Option<&Path>,
        env: Option<&Path>,
    ) -> Result<Resolved, ConfigError> {
        let named = match (config_path, env) {
            (Some(p), _) => Some((p, ConfigSource::ConfigPath)),
            (None, Some(p)) => Some((p, ConfigSource::Env)),
            (None, None) => None,
        };
        let kata_default = || {
            KATA_DEFAULT_PATHS
                .iter()
                .map(Path::new)
                .find(|p| p.is_file())
                .map(|p| (p, ConfigSource::KataDefault))
        };
        match named.or_else(kata_default) {
            Some((path, source)) => Ok(Resolved {
                config: Self::from_file(path)?,
                file: Some(path.to_path_buf()),
                source,
            }),
            None => Ok(Resolved {
                config: Self::default(),
                file: None,
                source: ConfigSource::Defaults,
            }),
        }
    }
}

/// A configuration and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// The configuration in force.
    pub config: Config,
    /// The file it was read from (`None`: the built-in defaults).
    pub file: Option<PathBuf>,
    /// Which source decided.
    pub source: ConfigSource,
}

/// Which source decided the configuration in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigSource {
    /// The runtime option `ConfigPath` containerd passed (`start`'s stdin).
    ConfigPath,
    /// The environment variable `KATA_TOPO_CONFIG`.
    Env,
    /// One of Kata's default configuration paths.
    KataDefault,
    /// No file: the built-in defaults.
    Defaults,
}

impl ConfigSource {
    /// The name the `daemon-started` log line and `kata-topo status` show.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ConfigPath => "ConfigPath",
            Self::Env => ENV_CONFIG,
            Self::KataDefault => "kata-default-path",
            Self::Defaults => "built-in-defaults",
        }
    }

    /// The source named `name` ([`ConfigSource::as_str`]).
    pub fn from_name(name: &str) -> Option<Self> {
        [
            Self::ConfigPath,
            Self::Env,
            Self::KataDefault,
            Self::Defaults,
        ]
        .into_iter()
        .find(|s| s.as_str() == name)
    }
}

impl std::fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

fn one_line(s: &str) -> String {
    s.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && *l != "|")
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new("/etc/kata/configuration.toml"))
    }

    #[test]
    fn reads_every_key_and_ignores_kata_tables() {
        let c = parse(
            r#"
[hypervisor.qemu]
path = "/usr/bin/qemu-system-x86_64"
[runtime]
enable_vcpus_pinning = true
[topology_guard]
delegate_shim = "containerd-shim-runc-v2"
mode = "enforce"
default_policy = "single-numa-node"
topology_xml = "/etc/kata-topo/host.xml"
sysfs_root = "/host/sys"
procfs_root = "/host/proc"
state_dir = "/run/kt"
log_file = "/var/log/kt.log"
metrics_dir = "/var/lib/node-exporter"
fail_closed = true
topology_refresh_seconds = 5
topology_cache = false
pod_overrides = "none"
intent_source = "annotations"
kubelet_pod_resources_socket = "/run/kubelet/pod-resources.sock"
kubelet_config = "/etc/kubernetes/kubelet.yaml"
kubelet_config_dir = "/etc/kubernetes/kubelet.conf.d"
kubelet_timeout_ms = 40
kubeconfig = "/etc/kata-topo/node.kubeconfig"
node_name = "worker-7.example"
api_timeout_ms = 250
nri_socket = "/run/nri/nri.sock"
nri_runtime_handlers = ["kata", "kata-qemu"]
nri_plugin_index = "05"
nri_answer_ms = 600
nri_events_socket = "/run/containerd/containerd.sock.ttrpc"
"#,
        )
        .expect("valid");
        assert_eq!(c.delegate_shim, "containerd-shim-runc-v2");
        assert_eq!(c.mode, Mode::Enforce);
        assert_eq!(c.default_policy, Policy::SingleNumaNode);
        assert_eq!(
            c.topology_xml.as_deref(),
            Some(Path::new("/etc/kata-topo/host.xml"))
        );
        assert_eq!(c.sysfs_root, Path::new("/host/sys"));
        assert_eq!(c.procfs_root, Path::new("/host/proc"));
        assert_eq!(c.state_dir, Path::new("/run/kt"));
        assert_eq!(c.log_file, Path::new("/var/log/kt.log"));
        assert_eq!(
            c.metrics_dir.as_deref(),
            Some(Path::new("/var/lib/node-exporter"))
        );
        assert!(c.fail_closed);
        assert_eq!(c.topology_refresh_seconds, 5);
        assert!(!c.topology_cache);
        assert_eq!(c.pod_overrides, PodOverrides::None);
        assert_eq!(c.defaults().pod_overrides, PodOverrides::None);
        assert_eq!(c.intent_source, IntentSource::Annotations);
        assert_eq!(
            c.kubelet_pod_resources_socket,
            Path::new("/run/kubelet/pod-resources.sock")
        );
        assert_eq!(c.kubelet_config, Path::new("/etc/kubernetes/kubelet.yaml"));
        assert_eq!(
            c.kubelet_config_dir.as_deref(),
            Some(Path::new("/etc/kubernetes/kubelet.conf.d"))
        );
        assert_eq!(c.kubelet_timeout_ms, 40);
        assert_eq!(
            c.kubeconfig.as_deref(),
            Some(Path::new("/etc/kata-topo/node.kubeconfig"))
        );
        assert_eq!(c.node_name.as_deref(), Some("worker-7.example"));
        assert_eq!(c.api_timeout_ms, 250);
        assert_eq!(c.nri_socket, Path::new("/run/nri/nri.sock"));
        assert_eq!(c.nri_runtime_handlers, ["kata", "kata-qemu"]);
        assert_eq!(c.nri_plugin_index, "05");
        assert_eq!(c.nri_answer_ms, 600);
        assert_eq!(
            c.nri_events_socket.as_deref(),
            Some(Path::new("/run/containerd/containerd.sock.ttrpc"))
        );
        // An empty kubeconfig switches the affinity check off.
        let off = parse("[topology_guard]\nkubeconfig = \"\"\nkubelet_config_dir = \"\"\n")
            .expect("valid");
        assert_eq!(off.kubeconfig, None);
        assert_eq!(off.kubelet_config_dir, None);
    }

    #[test]
    fn defaults_without_the_table() {
        let c = parse("[runtime]\nenable_debug = true\n").expect("valid");
        assert_eq!(c, Config::default());
        assert_eq!(c.delegate_shim, "containerd-shim-kata-v2");
        assert_eq!(c.mode, Mode::Audit);
        assert_eq!(c.default_policy, Policy::Restricted);
        assert_eq!(c.state_dir, Path::new("/run/kata-topo"));
        assert!(c.topology_cache);
        assert_eq!(c.pod_overrides, PodOverrides::StricterOnly);
        assert_eq!(c.intent_source, IntentSource::Auto);
        assert_eq!(
            c.kubelet_pod_resources_socket,
            Path::new("/var/lib/kubelet/pod-resources/kubelet.sock")
        );
        assert_eq!(c.kubelet_config, Path::new("/var/lib/kubelet/config.yaml"));
        assert_eq!(c.kubelet_config_dir, None);
        assert!(c.kubelet_timeout_ms > 0 && c.kubelet_timeout_ms <= 100);
        assert_eq!(
            c.kubeconfig.as_deref(),
            Some(Path::new("/etc/kubernetes/kubelet.conf"))
        );
        assert_eq!(c.node_name, None);
        assert_eq!(c.api_timeout_ms, 500);
        assert_eq!(c.nri_socket, Path::new("/var/run/nri/nri.sock"));
        assert!(c.nri_runtime_handlers.is_empty());
        assert_eq!(c.nri_plugin_index, "90");
        assert_eq!(c.nri_answer_ms, 200);
        assert_eq!(c.nri_events_socket, None);
    }

    #[test]
    fn errors_name_the_key() {
        for bad in [
            "nri_plugin_index = \"7\"",
            "nri_plugin_index = \"a1\"",
            "nri_runtime_handlers = [\"\"]",
            "nri_socket = \"nri.sock\"",
            "nri_events_socket = \"containerd.sock.ttrpc\"",
        ] {
            let e = parse(&format!("[topology_guard]\n{bad}\n")).expect_err(bad);
            let key = bad.split(' ').next().unwrap_or_default();
            assert!(e.to_string().contains(key), "{bad}: {e}");
        }
        let e = parse("[topology_guard]\nmood = \"audit\"\n").expect_err("unknown key");
        assert!(e.to_string().contains("mood"), "{e}");
        let e = parse("[topology_guard]\nmode = \"loud\"\n").expect_err("bad value");
        assert!(
            e.to_string().contains("mode") && e.to_string().contains("loud"),
            "{e}"
        );
        let e = parse("[topology_guard]\npod_overrides = \"weaker\"\n").expect_err("bad value");
        assert!(
            e.to_string().contains("pod_overrides") && e.to_string().contains("weaker"),
            "{e}"
        );
        for (text, key) in [
            ("intent_source = \"pods\"", "intent_source"),
            ("kubelet_timeout_ms = 0", "kubelet_timeout_ms"),
            ("kubelet_timeout_ms = 60000", "kubelet_timeout_ms"),
            ("kubelet_timeout_ms = -1", "kubelet_timeout_ms"),
            ("kubelet_config = \"config.yaml\"", "kubelet_config"),
            ("kubelet_config_dir = \"conf.d\"", "kubelet_config_dir"),
            ("kubeconfig = \"kubelet.conf\"", "kubeconfig"),
            ("kubeconfig = 1", "kubeconfig"),
            ("api_timeout_ms = 0", "api_timeout_ms"),
            ("nri_answer_ms = 0", "nri_answer_ms"),
            ("nri_answer_ms = 5001", "nri_answer_ms"),
            ("api_timeout_ms = 60000", "api_timeout_ms"),
            ("node_name = \"Worker_1\"", "node_name"),
            ("node_name = \"\"", "node_name"),
            (
                "kubelet_pod_resources_socket = \"kubelet.sock\"",
                "kubelet_pod_resources_socket",
            ),
        ] {
            let e = parse(&format!("[topology_guard]\n{text}\n")).expect_err(text);
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
        let e = parse("[topology_guard]\nfail_closed = \"yes\"\n").expect_err("bad type");
        assert!(e.to_string().contains("fail_closed"), "{e}");
        let e = parse("[topology_guard]\nstate_dir = \"run\"\n").expect_err("relative");
        assert!(e.to_string().contains("state_dir"), "{e}");
        let e = parse("[topology_guard]\ndelegate_shim = \"containerd-shim-kata-topo-v2\"\n")
            .expect_err("self");
        assert!(e.to_string().contains("delegate_shim"), "{e}");
        assert!(!e.to_string().contains('\n'));
        let e = parse("[topology_guard\n").expect_err("toml");
        assert!(
            e.to_string().contains("/etc/kata/configuration.toml"),
            "{e}"
        );
    }

    #[test]
    fn resolution_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = dir.path().join("a.toml");
        let b = dir.path().join("b.toml");
        std::fs::write(&a, "[topology_guard]\nmode = \"enforce\"\n").expect("write");
        std::fs::write(&b, "[topology_guard]\nmode = \"audit\"\n").expect("write");
        let r = Config::resolve_from(Some(&a), Some(&b)).expect("resolve");
        assert_eq!(
            (r.config.mode, r.file.as_deref(), r.source),
            (Mode::Enforce, Some(a.as_path()), ConfigSource::ConfigPath)
        );
        let r = Config::resolve_from(None, Some(&b)).expect("resolve");
        assert_eq!(
            (r.config.mode, r.file.as_deref(), r.source),
            (Mode::Audit, Some(b.as_path()), ConfigSource::Env)
        );
        assert_eq!(r.source.as_str(), "KATA_TOPO_CONFIG");
        for s in [
            ConfigSource::ConfigPath,
            ConfigSource::Env,
            ConfigSource::KataDefault,
            ConfigSource::Defaults,
        ] {
            assert_eq!(ConfigSource::from_name(s.as_str()), Some(s));
        }
        let e = Config::resolve_from(Some(&dir.path().join("missing.toml")), None)
            .expect_err("missing");
        assert!(e.to_string().contains("missing.toml"));
    }
}
