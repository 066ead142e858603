//! The VFIO map: which PCI devices a `/dev/vfio/…` path stands for, where sysfs says they sit,
//! and whether they are still bound to `vfio-pci`.
//!
//! Everything is read under one root (default `/sys`) so tests point it at generated trees and
//! real snapshots. Names taken from requests (group numbers, `vfioN`) are validated before they
//! become path components, and every path is resolved and checked to stay under the root, so a
//! spec cannot make kata-topo read outside it.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::host::Bdf;

/// The largest sysfs attribute read (a `numa_node` is a few bytes).
const MAX_ATTR_BYTES: u64 = 4096;

/// A device path from an OCI spec that names VFIO devices.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case", tag = "kind", content = "name")]
pub enum VfioRef {
    /// Legacy group: `/dev/vfio/<group>`.
    Group(String),
    /// iommufd character device: `/dev/vfio/devices/vfioN`.
    Device(String),
}

impl VfioRef {
    /// Recognises a VFIO device path. `/dev/vfio/vfio` (the container node) is not a device.
    /// Anything else under `/dev/vfio/` that is not a valid name is an error, not ignored.
    pub fn from_path(path: &str) -> Option<Result<Self, SysfsError>> {
        if let Some(name) = path.strip_prefix("/dev/vfio/devices/") {
            return Some(valid_device_name(name).map(|()| Self::Device(name.to_string())));
        }
        let name = path.strip_prefix("/dev/vfio/")?;
        if name == "vfio" {
            return None;
        }
        Some(valid_group_name(name).map(|()| Self::Group(name.to_string())))
    }

    /// The device path it came from.
    pub fn path(&self) -> String {
        match self {
            Self::Group(g) => format!("/dev/vfio/{g}"),
            Self::Device(d) => format!("/dev/vfio/devices/{d}"),
        }
    }
}

/// Why sysfs could not answer.
#[derive(Debug, thiserror::Error)]
pub enum SysfsError {
    /// A group name that is not a plain number (`../x`, `1/2`, empty, …).
    #[error("`{0}` is not a VFIO group number")]
    BadGroupName(String),
    /// An iommufd device name that is not `vfioN`.
    #[error("`{0}` is not an iommufd VFIO device name (vfioN)")]
    BadDeviceName(String),
    /// The group or device is not there.
    #[error("{what} does not exist under {root}")]
    Missing {
        /// What was looked for.
        what: String,
        /// The sysfs root.
        root: PathBuf,
    },
    /// A path would leave the root.
    #[error("{0} resolves outside the sysfs root")]
    Escapes(PathBuf),
    /// A sysfs entry holds something unexpected.
    #[error("{path} holds `{value}`, not {expected}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What it held (shortened).
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// Reading failed.
    #[error("cannot read {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: io::Error,
    },
}

fn valid_group_name(name: &str) -> Result<(), SysfsError> {
    if !name.is_empty() && name.len() <= 10 && name.bytes().all(|b| b.is_ascii_digit()) {
        Ok(())
    } else {
        Err(SysfsError::BadGroupName(shorten(name)))
    }
}

fn valid_device_name(name: &str) -> Result<(), SysfsError> {
    match name.strip_prefix("vfio") {
        Some(n) if !n.is_empty() && n.len() <= 10 && n.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(())
        }
        _ => Err(SysfsError::BadDeviceName(shorten(name))),
    }
}

fn shorten(s: &str) -> String {
    s.chars().take(64).collect()
}

/// What sysfs says about one PCI device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceState {
    /// Its address.
    pub bdf: Bdf,
    /// `numa_node`: `None` when the file is absent, `Some(-1)` when firmware gives none.
    pub numa_node: Option<i32>,
    /// The driver bound to it (`vfio-pci`), if any.
    pub driver: Option<String>,
    /// Its IOMMU group, if any.
    pub iommu_group: Option<String>,
}

impl DeviceState {
    /// Whether the device is usable for passthrough.
    pub fn bound_to_vfio(&self) -> bool {
        self.driver.as_deref() == Some("vfio-pci")
    }
}

/// A sysfs tree under a root.
#[derive(Debug, Clone)]
pub struct Sysfs {
    root: PathBuf,
    /// The root resolved once, for containment checks.
    canonical_root: Option<PathBuf>,
}

impl Sysfs {
    /// A sysfs tree at `root` (`/sys` on a real host).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        let canonical_root = std::fs::canonicalize(&root).ok();
        Self {
            root,
            canonical_root,
        }
    }

    /// The root it reads under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Joins relative components (never `..`) and checks the result stays under the root once
    /// symlinks are resolved. Returns `Ok(None)` when the path does not exist.
    fn resolve(&self, rel: &str) -> Result<Option<PathBuf>, SysfsError> {
        let rel_path = Path::new(rel);
        if rel_path
            .components()
            .any(|c| !matches!(c, Component::Normal(_)))
        {
            return Err(SysfsError::Escapes(rel_path.to_path_buf()));
        }
        let joined = self.root.join(rel_path);
        let canonical = match std::fs::canonicalize(&joined) {
            Ok(p) => p,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(SysfsError::Io {
                    path: joined,
                    source,
                })
            }
        };
        match &self.canonical_root {
            Some(root) if canonical.starts_with(root) => Ok(Some(canonical)),
            _ => Err(SysfsError::Escapes(joined)),
        }
    }

    /// The last component of a symlink's target, without following it.
    fn link_name(&self, rel: &str) -> Result<Option<String>, SysfsError> {
        let path = self.root.join(rel);
        match std::fs::read_link(&path) {
            Ok(target) => Ok(target.file_name().map(|n| n.to_string_lossy().into_owned())),
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::NotFound | io::ErrorKind::InvalidInput
                ) =>
            {
                Ok(None)
            }
            Err(source) => Err(SysfsError::Io { path, source }),
        }
    }

    fn read_attr(&self, rel: &str) -> Result<Option<String>, SysfsError> {
        let Some(path) = self.resolve(rel)? else {
            return Ok(None);
        };
        // The path is resolved already: a link in its place now was planted since.
        crate::fsutil::read_text_bounded_nofollow(&path, MAX_ATTR_BYTES)
            .map(|t| Some(t.trim().to_string()))
            .map_err(|source| SysfsError::Io {
                path: path.clone(),
                source,
            })
    }

    /// The PCI devices a VFIO reference stands for. A group stands for every device in it (as
    /// Kata expands it).
    pub fn devices_of(&self, vfio: &VfioRef) -> Result<Vec<Bdf>, SysfsError> {
        match vfio {
            VfioRef::Group(group) => {
                valid_group_name(group)?;
                let rel = format!("kernel/iommu_groups/{group}/devices");
                let dir = self.resolve(&rel)?.ok_or_else(|| SysfsError::Missing {
                    what: format!("IOMMU group {group}"),
                    root: self.root.clone(),
                })?;
                let entries = std::fs::read_dir(&dir).map_err(|source| SysfsError::Io {
                    path: dir.clone(),
                    source,
                })?;
                let mut bdfs = Vec::new();
                for entry in entries {
                    let entry = entry.map_err(|source| SysfsError::Io {
                        path: dir.clone(),
                        source,
                    })?;
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let bdf = name.parse::<Bdf>().map_err(|_| SysfsError::Malformed {
                        path: dir.join(&name),
                        value: shorten(&name),
                        expected: "a PCI address",
                    })?;
                    bdfs.push(bdf);
                }
                if bdfs.is_empty() {
                    return Err(SysfsError::Missing {
                        what: format!("any device in IOMMU group {group}"),
                        root: self.root.clone(),
                    });
                }
                bdfs.sort();
                Ok(bdfs)
            }
            VfioRef::Device(dev) => {
                valid_device_name(dev)?;
                let rel = format!("class/vfio-dev/{dev}/device");
                let name = self.link_name(&rel)?.ok_or_else(|| SysfsError::Missing {
                    what: format!("iommufd device {dev}"),
                    root: self.root.clone(),
                })?;
                let bdf = name.parse::<Bdf>().map_err(|_| SysfsError::Malformed {
                    path: self.root.join(&rel),
                    value: shorten(&name),
                    expected: "a link to a PCI device",
                })?;
                Ok(vec![bdf])
            }
        }
    }

    /// What sysfs says about one PCI device, or `Ok(None)` when it is not there.
    pub fn device(&self, bdf: Bdf) -> Result<Option<DeviceState>, SysfsError> {
        let base = format!("bus/pci/devices/{bdf}");
        let numa_text = self.read_attr(&format!("{base}/numa_node"))?;
        // Only when `numa_node` is absent is it worth asking whether the device is there.
        if numa_text.is_none() && self.resolve(&base)?.is_none() {
            return Ok(None);
        }
        let numa_node = match numa_text {
            None => None,
            Some(text) => Some(text.parse::<i32>().map_err(|_| SysfsError::Malformed {
                path: self.root.join(&base).join("numa_node"),
                value: shorten(&text),
                expected: "a NUMA node number or -1",
            })?),
        };
        let driver = self.link_name(&format!("{base}/driver"))?;
        let iommu_group = self.link_name(&format!("{base}/iommu_group"))?;
        Ok(Some(DeviceState {
            bdf,
            numa_node,
            driver,
            iommu_group,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::SysfsTree;

    #[test]
    fn recognises_vfio_paths() {
        assert_eq!(
            VfioRef::from_path("/dev/vfio/12").map(|r| r.ok()),
            Some(Some(VfioRef::Group("12".into())))
        );
        assert_eq!(
            VfioRef::from_path("/dev/vfio/devices/vfio3").map(|r| r.ok()),
            Some(Some(VfioRef::Device("vfio3".into())))
        );
        assert!(VfioRef::from_path("/dev/vfio/vfio").is_none());
        assert!(VfioRef::from_path("/dev/nvidia0").is_none());
        assert!(matches!(
            VfioRef::from_path("/dev/vfio/../x"),
            Some(Err(SysfsError::BadGroupName(_)))
        ));
        assert!(matches!(
            VfioRef::from_path("/dev/vfio/devices/../../x"),
            Some(Err(SysfsError::BadDeviceName(_)))
        ));
        assert_eq!(VfioRef::Group("7".into()).path(), "/dev/vfio/7");
    }

    #[test]
    fn resolves_groups_and_iommufd_devices() {
        let tree = SysfsTree::new();
        let a: Bdf = "0000:88:00.1".parse().expect("bdf");
        let b: Bdf = "0000:88:00.2".parse().expect("bdf");
        tree.device(a, 1, Some("vfio-pci"), Some("40"));
        tree.device(b, 1, Some("ixgbevf"), Some("40"));
        tree.iommufd("vfio0", a);
        let sysfs = Sysfs::new(tree.root());
        assert_eq!(
            sysfs
                .devices_of(&VfioRef::Group("40".into()))
                .expect("group"),
            vec![a, b]
        );
        assert_eq!(
            sysfs
                .devices_of(&VfioRef::Device("vfio0".into()))
                .expect("dev"),
            vec![a]
        );
        let state = sysfs.device(a).expect("read").expect("present");
        assert_eq!(state.numa_node, Some(1));
        assert!(state.bound_to_vfio());
        assert_eq!(state.iommu_group.as_deref(), Some("40"));
        let other = sysfs.device(b).expect("read").expect("present");
        assert!(!other.bound_to_vfio());
        assert!(matches!(
            sysfs.devices_of(&VfioRef::Group("41".into())),
            Err(SysfsError::Missing { .. })
        ));
        assert!(matches!(
            sysfs.devices_of(&VfioRef::Device("vfio9".into())),
            Err(SysfsError::Missing { .. })
        ));
        assert_eq!(
            sysfs
                .device("0000:00:01.0".parse().expect("bdf"))
                .expect("read"),
            None
        );
    }

    #[test]
    fn never_reads_outside_the_root() {
        let tree = SysfsTree::new();
        let sysfs = Sysfs::new(tree.root());
        assert!(matches!(
            sysfs.devices_of(&VfioRef::Group("../../etc".into())),
            Err(SysfsError::BadGroupName(_))
        ));
        assert!(matches!(
            sysfs.devices_of(&VfioRef::Device("vfio0/../../x".into())),
            Err(SysfsError::BadDeviceName(_))
        ));
        // A group directory that links out of the root is refused, not followed.
        let outside = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(outside.path().join("devices")).expect("mkdir");
        std::fs::create_dir_all(tree.root().join("kernel/iommu_groups")).expect("mkdir");
        std::os::unix::fs::symlink(outside.path(), tree.root().join("kernel/iommu_groups/5"))
            .expect("symlink");
        assert!(matches!(
            sysfs.devices_of(&VfioRef::Group("5".into())),
            Err(SysfsError::Escapes(_))
        ));
    }

    #[test]
    fn a_fifo_or_a_directory_in_place_of_an_attribute_is_an_error() {
        let tree = SysfsTree::new();
        let a: Bdf = "0000:01:00.0".parse().expect("bdf");
        let b: Bdf = "0000:01:00.1".parse().expect("bdf");
        tree.device(a, 0, Some("vfio-pci"), Some("3"));
        tree.device(b, 0, Some("vfio-pci"), Some("3"));
        let numa_a = tree.root().join(format!("bus/pci/devices/{a}/numa_node"));
        std::fs::remove_file(&numa_a).expect("remove");
        nix::unistd::mkfifo(&numa_a, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        let numa_b = tree.root().join(format!("bus/pci/devices/{b}/numa_node"));
        std::fs::remove_file(&numa_b).expect("remove");
        std::fs::create_dir(&numa_b).expect("mkdir");
        let sysfs = Sysfs::new(tree.root());
        let (ea, eb) = crate::testutil::within_a_minute("reading sysfs", move || {
            (sysfs.device(a), sysfs.device(b))
        });
        let ea = ea.expect_err("fifo");
        assert!(matches!(ea, SysfsError::Io { .. }), "{ea}");
        assert!(ea.to_string().contains("numa_node"), "{ea}");
        assert!(eb.is_err(), "{eb:?}");
    }

    #[test]
    fn malformed_numa_node_is_an_error() {
        let tree = SysfsTree::new();
        let a: Bdf = "0000:01:00.0".parse().expect("bdf");
        tree.device(a, 0, Some("vfio-pci"), Some("3"));
        std::fs::write(
            tree.root().join(format!("bus/pci/devices/{a}/numa_node")),
            "zero\n",
        )
        .expect("write");
        let err = Sysfs::new(tree.root()).device(a).expect_err("malformed");
        assert!(err.to_string().contains("numa_node"), "{err}");
    }
}
