//! The installer's environment, as the DaemonSet sets it (docs/installer.md has each knob);
//! the defaults are a systemd node's.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Where kata-topo goes on the node: fixed, as `runtime_path` and `ConfigPath` name it.
pub const PREFIX: &str = "/opt/kata-topo";

/// The binaries the image brings and the node gets, in `<payload>/bin` and `PREFIX/bin`.
pub const BINARIES: [&str; 4] = [
    "containerd-shim-kata-topo-v2",
    "kata-topo",
    "kata-topo-hook",
    "kata-topo-device-plugin",
];

/// The default host command (the same flags as nsenter's, done by the installer itself).
pub const DEFAULT_HOST_EXEC: &str = "nsenter -t 1 -m -u -i -n -p --";

/// Everything the environment says.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `NODE_NAME`: this node (the downward API's `spec.nodeName`).
    pub node: String,
    /// `KATA_TOPO_HOST_ROOT`: the node's `/` in this container.
    pub host_root: PathBuf,
    /// `KATA_TOPO_PAYLOAD`: what the image brings.
    pub payload: PathBuf,
    /// `KATA_TOPO_HANDLER`: the runtime handler's name.
    pub handler: String,
    /// `KATA_TOPO_CONTAINERD_CONFIG`: containerd's main configuration on the node.
    pub containerd_config: PathBuf,
    /// `KATA_TOPO_CONTAINERD_MAJOR`: containerd's major version, when given.
    pub containerd_major: Option<u32>,
    /// `KATA_TOPO_CONTAINERD_SOCKET`: containerd's socket as this container reaches it;
    /// default: the main configuration's `[grpc] address` under the host root.
    pub containerd_socket: Option<PathBuf>,
    /// `KATA_TOPO_SHIM_LINK_DIR`: a directory on containerd 1.x's PATH.
    pub link_dir: PathBuf,
    /// `KATA_TOPO_NPD_DIR`: node-problem-detector's configuration directory.
    pub npd_dir: PathBuf,
    /// `KATA_TOPO_RESTART_CONTAINERD`: the host's command restarting containerd.
    pub restart: String,
    /// `KATA_TOPO_CONTAINERD_DUMP`: the host's command printing containerd 1.x's configuration.
    pub dump: String,
    /// `KATA_TOPO_HOST_EXEC`: how a command runs on the host.
    pub host_exec: String,
    /// `KATA_TOPO_DAEMONSET` and `POD_NAMESPACE`: the DaemonSet the preStop hook looks at.
    pub daemonset: (String, String),
    /// `KATA_TOPO_CONFIG_OVERRIDE`: a configuration replacing the image's.
    pub config_override: PathBuf,
    /// `KATA_TOPO_CONFIG_PATH_OPTION`: whether the handler passes `ConfigPath`.
    pub config_path_option: bool,
    /// `KATA_TOPO_RUN_DIR`: the container's own run directory (ready marker, pid file).
    pub run_dir: PathBuf,
    /// `KATA_TOPO_KUBECONFIG`: a kubeconfig; default: the pod's ServiceAccount.
    pub kubeconfig: Option<PathBuf>,
    /// `KUBERNETES_SERVICE_HOST` and `KUBERNETES_SERVICE_PORT`.
    pub service: (String, String),
    /// `KATA_TOPO_API_TIMEOUT_MS`: each request to the API server.
    pub api_timeout: Duration,
    /// `KATA_TOPO_CONTAINERD_TIMEOUT_SECONDS`: the restart command, then containerd loading
    /// the handler, each.
    pub containerd_timeout: Duration,
    /// `KATA_TOPO_LOCK_TIMEOUT_SECONDS`: how long an install or uninstall waits for another.
    pub lock_timeout: Duration,
}

/// A setting that cannot be used, named.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadSetting(pub String);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

fn env_or(name: &str, default: &str) -> String {
    env(name).unwrap_or_else(|| default.to_string())
}

fn seconds(name: &str, default: u64) -> Result<Duration, BadSetting> {
    match env(name) {
        None => Ok(Duration::from_secs(default)),
        Some(v) => v
            .trim()
            .parse::<u64>()
            .ok()
            .filter(|s| (1..=3600).contains(s))
            .map(Duration::from_secs)
            .ok_or_else(|| BadSetting(format!("{name} is a number of seconds, 1 to 3600: {v:?}"))),
    }
}

impl Settings {
    /// Reads and checks the environment.
    pub fn from_env() -> Result<Self, BadSetting> {
        let containerd_config = PathBuf::from(env_or(
            "KATA_TOPO_CONTAINERD_CONFIG",
            "/etc/containerd/config.toml",
        ));
        let dump = env("KATA_TOPO_CONTAINERD_DUMP").unwrap_or_else(|| {
            format!(
                "containerd --config {} config dump",
                containerd_config.display()
            )
        });
        let containerd_major = match env("KATA_TOPO_CONTAINERD_MAJOR").filter(|v| !v.is_empty()) {
            None => None,
            Some(v) => Some(v.trim().parse::<u32>().map_err(|_| {
                BadSetting(format!("KATA_TOPO_CONTAINERD_MAJOR is a number: {v:?}"))
            })?),
        };
        let config_path_option = match env_or("KATA_TOPO_CONFIG_PATH_OPTION", "true").as_str() {
            "true" => true,
            "false" => false,
            other => {
                return Err(BadSetting(format!(
                    "KATA_TOPO_CONFIG_PATH_OPTION is true or false: {other:?}"
                )))
            }
        };
        let api_timeout = match env("KATA_TOPO_API_TIMEOUT_MS") {
            None => Duration::from_secs(10),
            Some(v) => v
                .trim()
                .parse::<u64>()
                .ok()
                .filter(|ms| (1..=60_000).contains(ms))
                .map(Duration::from_millis)
                .ok_or_else(|| {
                    BadSetting(format!("KATA_TOPO_API_TIMEOUT_MS is 1 to 60000: {v:?}"))
                })?,
        };
        let s = Self {
            node: env_or("NODE_NAME", ""),
            host_root: PathBuf::from(env_or("KATA_TOPO_HOST_ROOT", "/host")),
            payload: PathBuf::from(env_or("KATA_TOPO_PAYLOAD", "/opt/kata-topo-payload")),
            handler: env_or("KATA_TOPO_HANDLER", "kata-topo"),
            containerd_config,
            containerd_major,
            containerd_socket: env("KATA_TOPO_CONTAINERD_SOCKET")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            link_dir: PathBuf::from(env_or("KATA_TOPO_SHIM_LINK_DIR", "/usr/local/bin")),
            npd_dir: PathBuf::from(env_or(
                "KATA_TOPO_NPD_DIR",
                "/etc/node-problem-detector.d/kata-topo",
            )),
            restart: env_or(
                "KATA_TOPO_RESTART_CONTAINERD",
                "systemctl restart containerd",
            ),
            dump,
            host_exec: env_or("KATA_TOPO_HOST_EXEC", DEFAULT_HOST_EXEC),
            daemonset: (
                env_or("POD_NAMESPACE", "kube-system"),
                env_or("KATA_TOPO_DAEMONSET", "kata-topo-installer"),
            ),
            config_override: PathBuf::from(env_or(
                "KATA_TOPO_CONFIG_OVERRIDE",
                "/etc/kata-topo-installer/configuration-kata-topo.toml",
            )),
            config_path_option,
            run_dir: PathBuf::from(env_or("KATA_TOPO_RUN_DIR", "/run")),
            kubeconfig: env("KATA_TOPO_KUBECONFIG")
                .filter(|s| !s.is_empty())
                .map(PathBuf::from),
            service: (
                env_or("KUBERNETES_SERVICE_HOST", ""),
                env_or("KUBERNETES_SERVICE_PORT", ""),
            ),
            api_timeout,
            containerd_timeout: seconds("KATA_TOPO_CONTAINERD_TIMEOUT_SECONDS", 120)?,
            lock_timeout: seconds("KATA_TOPO_LOCK_TIMEOUT_SECONDS", 300)?,
        };
        s.check()?;
        Ok(s)
    }

    fn check(&self) -> Result<(), BadSetting> {
        if self.node.is_empty() {
            return Err(BadSetting(
                "NODE_NAME is not set (the DaemonSet sets it from spec.nodeName)".into(),
            ));
        }
        if !is_dns_label(&self.handler) {
            return Err(BadSetting(format!(
                "KATA_TOPO_HANDLER must be a DNS label (a RuntimeClass's handler): {:?}",
                self.handler
            )));
        }
        for (name, path) in [
            ("KATA_TOPO_CONTAINERD_CONFIG", &self.containerd_config),
            ("KATA_TOPO_SHIM_LINK_DIR", &self.link_dir),
            ("KATA_TOPO_NPD_DIR", &self.npd_dir),
        ] {
            node_path(name, path)?;
        }
        if self
            .containerd_config
            .parent()
            .is_none_or(|p| p == Path::new("/"))
        {
            return Err(BadSetting(format!(
                "KATA_TOPO_CONTAINERD_CONFIG names no file in a directory: {}",
                self.containerd_config.display()
            )));
        }
        Ok(())
    }

    /// The node path of the wrapper (`runtime_path`).
    pub fn runtime_path(&self) -> PathBuf {
        Path::new(PREFIX).join("bin/containerd-shim-kata-topo-v2")
    }

    /// The node path of the wrapper's configuration (`ConfigPath`).
    pub fn config_path(&self) -> PathBuf {
        Path::new(PREFIX).join("share/configuration-kata-topo.toml")
    }
}

/// An absolute node path without `.` or `..` (checked again, component by component, when
/// it is walked).
pub fn node_path(name: &str, path: &Path) -> Result<(), BadSetting> {
    kata_topo_core::files::components(path)
        .map(|_| ())
        .map_err(|e| BadSetting(format!("{name}: {e}")))
}

/// A DNS label (RFC 1123): what a RuntimeClass's handler is.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[0] != b'-'
        && b[b.len() - 1] != b'-'
}

/// A label value: at most 63 characters, alphanumerics with `-`, `_` and `.` inside.
pub fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_values() {
        for good in ["kata-topo", "kata-topo-installed", "a", "k8s"] {
            assert!(is_dns_label(good), "{good}");
        }
        for bad in ["", "-a", "a-", "Kata", "a_b", "a.b", &"a".repeat(64)] {
            assert!(!is_dns_label(bad), "{bad}");
        }
        for good in ["0.1.0", "0.1.0-next", "v1_2", "1"] {
            assert!(is_label_value(good), "{good}");
        }
        for bad in ["", "-1", "1.", "a b", "a/b", &"1".repeat(64)] {
            assert!(!is_label_value(bad), "{bad}");
        }
        assert!(node_path("X", Path::new("/etc/containerd")).is_ok());
        for bad in ["etc", "/etc/../x", "/etc/./x"] {
            assert!(node_path("X", Path::new(bad)).is_err(), "{bad}");
        }
    }
}
