//! What the plugin is told: the resource name it advertises, the socket it serves, which
//! devices it takes, where it reads the host and where the kubelet is. Every value is checked
//! once, here, with an error naming the flag.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

/// The resource name advertised by default.
pub const DEFAULT_RESOURCE_NAME: &str = "kata-topo.io/vfio";
/// The socket the plugin serves, in the device plugin directory, by default.
pub const DEFAULT_SOCKET_NAME: &str = "kata-topo-vfio.sock";
/// The kubelet's device plugin directory.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";

/// Everything the plugin runs with.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where sysfs is (`/sys`).
    pub sysfs_root: PathBuf,
    /// The kubelet's device plugin directory: `kubelet.sock` is there, and the plugin's socket.
    pub plugin_dir: PathBuf,
    /// The extended resource the devices are advertised as.
    pub resource_name: ResourceName,
    /// The plugin's socket's file name in `plugin_dir`.
    pub socket_name: SocketName,
    /// Only devices with one of these vendor:device ids; every `vfio-pci` device when empty.
    pub ids: Vec<PciId>,
    /// How often sysfs is scanned again.
    pub rescan: Duration,
    /// How often the sockets are checked (the plugin's own gone: the kubelet restarted).
    pub poll: Duration,
    /// How long a registration may take.
    pub register_timeout: Duration,
    /// How long to wait before registering again after a failure.
    pub register_retry: Duration,
}

impl Config {
    /// The defaults of the command line.
    pub fn new(sysfs_root: impl Into<PathBuf>, plugin_dir: impl Into<PathBuf>) -> Self {
        Self {
            sysfs_root: sysfs_root.into(),
            plugin_dir: plugin_dir.into(),
            resource_name: ResourceName(DEFAULT_RESOURCE_NAME.to_string()),
            socket_name: SocketName(DEFAULT_SOCKET_NAME.to_string()),
            ids: Vec::new(),
            rescan: Duration::from_secs(5),
            poll: Duration::from_secs(1),
            register_timeout: Duration::from_secs(10),
            register_retry: Duration::from_secs(5),
        }
    }
}

/// A value that is not what its flag takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// Not a `VENDOR:DEVICE` pair of 4-digit hex numbers.
    #[error("`{0}` is not a PCI vendor:device id like 10de:2330")]
    PciId(String),
    /// Not an extended resource name the kubelet accepts.
    #[error("`{value}` is not an extended resource name like kata-topo.io/vfio: {why}")]
    ResourceName {
        /// The value (shortened).
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Not a plain socket file name.
    #[error(
        "`{0}` is not a socket file name like kata-topo-vfio.sock (a plain name ending in .sock)"
    )]
    SocketName(String),
}

fn shorten(s: &str) -> String {
    s.chars().take(80).collect()
}

/// A PCI vendor:device id pair, as `lspci -n` prints it (`10de:2330`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PciId {
    /// The vendor id (`vendor` in sysfs).
    pub vendor: u16,
    /// The device id (`device` in sysfs).
    pub device: u16,
}

impl FromStr for PciId {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ConfigError::PciId(shorten(s));
        let (vendor, device) = s.trim().split_once(':').ok_or_else(bad)?;
        let hex = |part: &str| {
            let part = part.strip_prefix("0x").unwrap_or(part);
            if part.len() == 4 && part.bytes().all(|b| b.is_ascii_hexdigit()) {
                u16::from_str_radix(part, 16).map_err(|_| bad())
            } else {
                Err(bad())
            }
        };
        Ok(Self {
            vendor: hex(vendor)?,
            device: hex(device)?,
        })
    }
}

impl fmt::Display for PciId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04x}:{:04x}", self.vendor, self.device)
    }
}

/// An extended resource name the kubelet accepts from a device plugin: `DOMAIN/NAME`, DOMAIN a
/// lowercase DNS subdomain outside `kubernetes.io`, NAME up to 63 characters of letters,
/// digits, `-`, `_`, `.` that start and end with a letter or digit (the kubelet's
/// `IsExtendedResourceName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceName(String);

impl ResourceName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ResourceName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why| ConfigError::ResourceName {
            value: shorten(s),
            why,
        };
        let (domain, name) = s.split_once('/').ok_or_else(|| bad("no DOMAIN/ prefix"))?;
        if name.contains('/') {
            return Err(bad("more than one `/`"));
        }
        if s.contains("kubernetes.io/") {
            return Err(bad("kubernetes.io names are Kubernetes' own resources"));
        }
        if s.starts_with("requests.") {
            return Err(bad("a `requests.` prefix is reserved"));
        }
        // The kubelet checks the name with `requests.` in front of it.
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if domain.len() + "requests.".len() > 253 || !domain.split('.').all(label_ok) {
            return Err(bad("the domain is not a lowercase DNS name"));
        }
        let edge = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
        if name.is_empty()
            || name.len() > 63
            || !edge(name.bytes().next())
            || !edge(name.bytes().last())
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        {
            return Err(bad(
                "the name after `/` must be 1-63 letters, digits, `-`, `_` or `.`, starting and ending with a letter or digit",
            ));
        }
        Ok(Self(s.to_string()))
    }
}

/// The plugin's socket's file name: a plain name ending in `.sock`, never `kubelet.sock`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SocketName(String);

impl SocketName {
    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SocketName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for SocketName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let ok = s.len() > ".sock".len()
            && s.len() <= 100
            && s.ends_with(".sock")
            && s != crate::api::KUBELET_SOCKET
            && !s.starts_with('.')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if ok {
            Ok(Self(s.to_string()))
        } else {
            Err(ConfigError::SocketName(shorten(s)))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_ids_parse_as_lspci_prints_them() {
        assert_eq!(
            "10de:2330".parse(),
            Ok(PciId {
                vendor: 0x10de,
                device: 0x2330
            })
        );
        assert_eq!(
            "0x8086:0x1520".parse::<PciId>().map(|p| p.to_string()),
            Ok("8086:1520".to_string())
        );
        assert_eq!("8086:1520".parse::<PciId>().map(|p| p.vendor), Ok(0x8086));
        for bad in [
            "",
            "8086",
            "8086:",
            ":1520",
            "808:1520",
            "80861:1520",
            "8086:15g0",
            "8086:1520:1",
            "+086:1520",
        ] {
            assert_eq!(
                bad.parse::<PciId>(),
                Err(ConfigError::PciId(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[test]
    fn resource_names_follow_the_kubelet() {
        for good in [
            "kata-topo.io/vfio",
            "example.com/nic_vf",
            "a/b",
            "intel.com/sriov-net.1",
        ] {
            assert_eq!(
                good.parse::<ResourceName>().map(|r| r.to_string()),
                Ok(good.to_string())
            );
        }
        for bad in [
            "vfio",
            "kata-topo.io/",
            "/vfio",
            "kata-topo.io/a/b",
            "Kata.io/vfio",
            "kubernetes.io/vfio",
            "x.kubernetes.io/vfio",
            "requests.example.com/vfio",
            "example.com/-vfio",
            "example.com/vfio-",
            "example.com/vf io",
            "-example.com/vfio",
            "example..com/vfio",
        ] {
            let err = bad.parse::<ResourceName>().expect_err(bad);
            assert!(err.to_string().contains(bad), "{err}");
        }
        let long = format!("example.com/{}", "a".repeat(64));
        assert!(long.parse::<ResourceName>().is_err());
    }

    #[test]
    fn socket_names_are_plain_and_not_the_kubelets() {
        assert!("kata-topo-vfio.sock".parse::<SocketName>().is_ok());
        for bad in [
            "kubelet.sock",
            ".sock",
            "a/b.sock",
            "../x.sock",
            "x.socket",
            ".hidden.sock",
            "a b.sock",
        ] {
            assert_eq!(
                bad.parse::<SocketName>(),
                Err(ConfigError::SocketName(bad.to_string())),
                "{bad}"
            );
        }
    }
}
