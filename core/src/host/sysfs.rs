//! The VFIO map: which PCI devices a `/dev/vfio/…` path stands for, where sysfs says they sit,
//! and whether they are still bound to `vfio-pci`.
//!
//! Everything is read under one root (default `/sys`) so tests point it at generated trees and
//! real snapshots. Names taken from requests (group numbers, `vfioN`) are validated before they
//! become path components, and every path is resolved and checked to stay under the root, so a
//! spec cannot make kata-topo read outside it.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::host::pci::{Bdf, DeviceState};

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
        crate::files::read_text_bounded_nofollow(&path, MAX_ATTR_BYTES)
            .map(|t| Some(t.trim().to_string()))
            .map_err(|source| SysfsError::Io {
                path: path.clone(),
                source,
            })
    }

    /// An attribute, trimmed, by its path relative to the root (plain components only); `None`
    /// when it is not there.
    pub fn attribute(&self, rel: &str) -> Result<Option<String>, SysfsError> {
        self.read_attr(rel)
    }

    /// Several attributes of one directory (resolved once), trimmed, each `None` when it is
    /// not there; `None` when the directory is not there. `names` are plain file names.
    pub fn attributes(
        &self,
        dir_rel: &str,
        names: &[&str],
    ) -> Result<Option<Vec<Option<String>>>, SysfsError> {
        let Some(dir) = self.resolve(dir_rel)? else {
            return Ok(None);
        };
        let mut values = Vec::with_capacity(names.len());
        for name in names {
            if Path::new(name).components().count() != 1 || name.contains('/') {
                return Err(SysfsError::Escapes(dir.join(name)));
            }
            let path = dir.join(name);
            match crate::files::read_text_bounded_nofollow(&path, MAX_ATTR_BYTES) {
                Ok(text) => values.push(Some(text.trim().to_string())),
                Err(e) if e.kind() == io::ErrorKind::NotFound => values.push(None),
                Err(source) => return Err(SysfsError::Io { path, source }),
            }
        }
        Ok(Some(values))
    }

    /// The names in a directory, sorted, by its path relative to the root (plain components
    /// only); `None` when it is not there.
    pub fn list(&self, rel: &str) -> Result<Option<Vec<String>>, SysfsError> {
        let Some(dir) = self.resolve(rel)? else {
            return Ok(None);
        };
        let io = |source| SysfsError::Io {
            path: dir.clone(),
            source,
        };
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io)? {
            names.push(
                entry
                    .map_err(io)?
                    .file_name()
                    .to_string_lossy()
                    .into_owned(),
            );
        }
        names.sort();
        Ok(Some(names))
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
    use crate::testutil::TempSysfs;

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
        let tree = TempSysfs::new();
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
        let tree = TempSysfs::new();
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
        let tree = TempSysfs::new();
        let a: Bdf = "0000:01:00.0".parse().expect("bdf");
        let b: Bdf = "0000:01:00.1".parse().expect("bdf");
        tree.device(a, 0, Some("vfio-pci"), Some("3"));
        tree.device(b, 0, Some("vfio-pci"), Some("3"));
        let numa_a = tree.root().join(format!("bus/pci/devices/{a}/numa_node"));
        std::fs::remove_file(&numa_a).expect("remove");
        crate::testutil::mkfifo(&numa_a).expect("mkfifo");
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

    /// Generated sysfs trees: devices laid out as the kernel does, then broken — FIFOs,
    /// sockets and directories where attributes belong, dangling and looping links, links out
    /// of the root, junk content, weird names.
    mod generated {
        use super::*;
        use proptest::prelude::*;
        use std::collections::{BTreeMap, BTreeSet};
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::symlink;

        /// The numa_node of the decoy device outside the root: seeing it means a read left.
        const OUTSIDE_NODE: i32 = 1_234_567;
        /// The PCI address listed only in the decoy group outside the root.
        const OUTSIDE_BDF: &str = "000f:0f:0f.7";

        fn bdf(i: u8) -> Bdf {
            Bdf {
                domain: 0,
                bus: 1 + (i >> 3) % 2,
                device: (i >> 1) % 4,
                function: i % 2,
            }
        }

        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
        enum Slot {
            NumaNode(u8),
            Driver(u8),
            GroupLink(u8),
            BusLink(u8),
            DeviceDir(u8),
            GroupDir(u8),
            GroupDevices(u8),
            GroupEntry(u8, u8),
            Iommufd(u8),
        }

        #[derive(Debug, Clone)]
        enum Thing {
            Fifo,
            Socket,
            Dir,
            Dangling,
            SelfLoop,
            LinkOut,
            LinkUp,
            Junk(Vec<u8>),
        }

        #[derive(Debug, Clone)]
        enum Op {
            Device {
                dev: u8,
                node: i32,
                driver: Option<&'static str>,
                group: Option<u8>,
            },
            Iommufd(u8, u8),
            Unbind(u8),
            Break(Slot, Thing),
            WeirdName(u8, Vec<u8>),
        }

        fn op() -> impl Strategy<Value = Op> {
            let dev = 0u8..16;
            let group = 0u8..6;
            let slot = prop_oneof![
                dev.clone().prop_map(Slot::NumaNode),
                dev.clone().prop_map(Slot::Driver),
                dev.clone().prop_map(Slot::GroupLink),
                dev.clone().prop_map(Slot::BusLink),
                dev.clone().prop_map(Slot::DeviceDir),
                group.clone().prop_map(Slot::GroupDir),
                group.clone().prop_map(Slot::GroupDevices),
                (group.clone(), dev.clone()).prop_map(|(g, d)| Slot::GroupEntry(g, d)),
                (0u8..4).prop_map(Slot::Iommufd),
            ];
            let thing = prop_oneof![
                Just(Thing::Fifo),
                Just(Thing::Socket),
                Just(Thing::Dir),
                Just(Thing::Dangling),
                Just(Thing::SelfLoop),
                Just(Thing::LinkOut),
                Just(Thing::LinkUp),
                prop_oneof![
                    prop::collection::vec(any::<u8>(), 0..16),
                    prop::sample::select(vec![
                        &b"-1\n"[..],
                        b"1",
                        b" 0 ",
                        b"7777",
                        b"99999999999",
                        b"\xff\xfe"
                    ])
                    .prop_map(<[u8]>::to_vec),
                    (4000usize..5000).prop_map(|n| vec![b'1'; n]),
                ]
                .prop_map(Thing::Junk),
            ];
            prop_oneof![
                4 => (
                    dev.clone(),
                    -2i32..4,
                    prop::option::of(prop::sample::select(vec!["vfio-pci", "mlx5_core", "nvidia"])),
                    prop::option::of(group.clone()),
                )
                    .prop_map(|(dev, node, driver, group)| Op::Device { dev, node, driver, group }),
                1 => (0u8..4, dev.clone()).prop_map(|(n, d)| Op::Iommufd(n, d)),
                1 => dev.prop_map(Op::Unbind),
                4 => (slot, thing).prop_map(|(s, t)| Op::Break(s, t)),
                1 => (
                    group,
                    prop_oneof![
                        prop::collection::vec(any::<u8>().prop_filter("a file name byte", |b| *b != b'/' && *b != 0), 1..40),
                        Just(vec![b'x'; 255]),
                        Just(b"0000:01:00.0\n".to_vec()),
                        Just(b"\x1b[2J".to_vec()),
                    ],
                )
                    .prop_map(|(g, name)| Op::WeirdName(g, name)),
            ]
        }

        /// What the test expects of an untouched part of the tree.
        #[derive(Debug, Default)]
        struct Model {
            /// Device → (numa_node, driver, group) as last added.
            devices: BTreeMap<u8, (i32, Option<&'static str>, Option<u8>)>,
            /// Group → every device ever added to it.
            groups: BTreeMap<u8, BTreeSet<u8>>,
            broken_devices: BTreeSet<u8>,
            broken_groups: BTreeSet<u8>,
            broken_iommufd: BTreeSet<u8>,
        }

        fn rel(slot: Slot) -> String {
            let dir = |d: u8| {
                let b = bdf(d);
                format!("devices/pci{:04x}:{:02x}/{b}", b.domain, b.bus)
            };
            match slot {
                Slot::NumaNode(d) => format!("{}/numa_node", dir(d)),
                Slot::Driver(d) => format!("{}/driver", dir(d)),
                Slot::GroupLink(d) => format!("{}/iommu_group", dir(d)),
                Slot::BusLink(d) => format!("bus/pci/devices/{}", bdf(d)),
                Slot::DeviceDir(d) => dir(d),
                Slot::GroupDir(g) => format!("kernel/iommu_groups/{g}"),
                Slot::GroupDevices(g) => format!("kernel/iommu_groups/{g}/devices"),
                Slot::GroupEntry(g, d) => format!("kernel/iommu_groups/{g}/devices/{}", bdf(d)),
                Slot::Iommufd(n) => format!("class/vfio-dev/vfio{n}/device"),
            }
        }

        fn put(root: &Path, outside: &Path, slot: Slot, thing: &Thing) -> io::Result<()> {
            let r = rel(slot);
            let path = root.join(&r);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path)?,
                Ok(_) => std::fs::remove_file(&path)?,
                Err(_) => {}
            }
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            match thing {
                Thing::Fifo => crate::testutil::mkfifo(&path)?,
                Thing::Socket => drop(std::os::unix::net::UnixListener::bind(&path)?),
                Thing::Dir => std::fs::create_dir(&path)?,
                Thing::Dangling => symlink("../../nowhere/at/all", &path)?,
                Thing::SelfLoop => symlink(path.file_name().unwrap_or_default(), &path)?,
                Thing::LinkOut => {
                    let target = match slot {
                        Slot::NumaNode(_) => outside.join("escape/numa_node"),
                        _ => outside.join("escape"),
                    };
                    symlink(target, &path)?;
                }
                Thing::LinkUp => {
                    // Relative, up through the root and into the decoy.
                    let depth = r.split('/').count() - 1;
                    let up = "../".repeat(depth + 1);
                    symlink(format!("{up}outside/escape"), &path)?;
                }
                Thing::Junk(bytes) => std::fs::write(&path, bytes)?,
            }
            Ok(())
        }

        fn build(root: &Path, outside: &Path, ops: &[Op]) -> Model {
            let tree = crate::testutil::SysfsTree::at(root).expect("root");
            let mut m = Model::default();
            for op in ops {
                match op {
                    Op::Device {
                        dev,
                        node,
                        driver,
                        group,
                    } => {
                        // Never write through what a break put there (a FIFO would block).
                        if m.broken_devices.contains(dev)
                            || group.is_some_and(|g| m.broken_groups.contains(&g))
                        {
                            continue;
                        }
                        let g = group.map(|g| g.to_string());
                        if tree
                            .add_device(bdf(*dev), *node, *driver, g.as_deref())
                            .is_err()
                        {
                            m.broken_devices.insert(*dev);
                            m.broken_groups.extend(*group);
                            continue;
                        }
                        m.devices.insert(*dev, (*node, *driver, *group));
                        if let Some(g) = group {
                            m.groups.entry(*g).or_default().insert(*dev);
                        }
                    }
                    Op::Iommufd(n, d) => {
                        if m.broken_iommufd.contains(n)
                            || tree.add_iommufd(&format!("vfio{n}"), bdf(*d)).is_err()
                        {
                            m.broken_iommufd.insert(*n);
                        }
                    }
                    Op::Unbind(d) => {
                        if m.broken_devices.contains(d) || !m.devices.contains_key(d) {
                            continue;
                        }
                        if tree.unbind(bdf(*d)).is_err() {
                            m.broken_devices.insert(*d);
                        } else if let Some(e) = m.devices.get_mut(d) {
                            e.1 = None;
                        }
                    }
                    Op::Break(slot, thing) => {
                        match *slot {
                            Slot::NumaNode(d)
                            | Slot::Driver(d)
                            | Slot::GroupLink(d)
                            | Slot::BusLink(d)
                            | Slot::DeviceDir(d) => {
                                m.broken_devices.insert(d);
                            }
                            Slot::GroupDir(g) | Slot::GroupDevices(g) | Slot::GroupEntry(g, _) => {
                                m.broken_groups.insert(g);
                            }
                            Slot::Iommufd(n) => {
                                m.broken_iommufd.insert(n);
                            }
                        }
                        let _ = put(root, outside, *slot, thing);
                    }
                    Op::WeirdName(g, name) => {
                        m.broken_groups.insert(*g);
                        let dir = root.join(format!("kernel/iommu_groups/{g}/devices"));
                        if std::fs::create_dir_all(&dir).is_ok() {
                            let _ = std::fs::write(dir.join(OsStr::from_bytes(name)), b"");
                        }
                    }
                }
            }
            m
        }

        /// Builds the tree, reads every device, group and iommufd device through [`Sysfs`], and
        /// checks the answers against the model.
        fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
            let dir = tempfile::tempdir().expect("tempdir");
            let root = dir.path().join("sys");
            let outside = dir.path().join("outside");
            // The decoy: what a read that left the root would find.
            std::fs::create_dir_all(outside.join(format!("escape/devices/{OUTSIDE_BDF}")))
                .expect("decoy");
            std::fs::write(
                outside.join("escape/numa_node"),
                format!("{OUTSIDE_NODE}\n"),
            )
            .expect("decoy");
            let m = build(&root, &outside, &ops);
            let sysfs = Sysfs::new(&root);
            let outside_bdf: Bdf = OUTSIDE_BDF.parse().expect("bdf");

            for d in 0u8..16 {
                let got = sysfs.device(bdf(d));
                if let Ok(Some(state)) = &got {
                    prop_assert_ne!(state.numa_node, Some(OUTSIDE_NODE), "read outside the root");
                    prop_assert_eq!(state.bdf, bdf(d));
                }
                if m.broken_devices.contains(&d) {
                    continue;
                }
                match m.devices.get(&d) {
                    Some((node, driver, group)) => prop_assert_eq!(
                        got.map_err(|e| e.to_string()),
                        Ok(Some(DeviceState {
                            bdf: bdf(d),
                            numa_node: Some(*node),
                            driver: driver.map(str::to_string),
                            iommu_group: group.map(|g| g.to_string()),
                        })),
                        "device {}",
                        d
                    ),
                    None => prop_assert_eq!(got.map_err(|e| e.to_string()), Ok(None)),
                }
            }
            for g in 0u8..6 {
                let got = sysfs.devices_of(&VfioRef::Group(g.to_string()));
                if let Ok(bdfs) = &got {
                    prop_assert!(!bdfs.contains(&outside_bdf), "listed outside the root");
                    prop_assert!(!bdfs.is_empty());
                }
                if m.broken_groups.contains(&g) {
                    continue;
                }
                match m.groups.get(&g) {
                    Some(devs) => {
                        let want: Vec<Bdf> = devs
                            .iter()
                            .map(|&d| bdf(d))
                            .collect::<BTreeSet<_>>()
                            .into_iter()
                            .collect();
                        prop_assert_eq!(got.map_err(|e| e.to_string()), Ok(want), "group {}", g);
                    }
                    None => {
                        prop_assert!(matches!(got, Err(SysfsError::Missing { .. })), "{:?}", got)
                    }
                }
            }
            for n in 0u8..4 {
                if let Ok(bdfs) = sysfs.devices_of(&VfioRef::Device(format!("vfio{n}"))) {
                    prop_assert!(!bdfs.contains(&outside_bdf));
                }
            }
            Ok(())
        }

        proptest! {
            #[test]
            fn reading_generated_trees_never_panics_blocks_or_leaves_the_root(
                ops in prop::collection::vec(op(), 0..16),
            ) {
                let what = format!("reading the sysfs tree generated by {ops:?}");
                crate::testutil::within_a_minute_or_abort(&what, move || run(ops))?;
            }
        }
    }

    #[test]
    fn malformed_numa_node_is_an_error() {
        let tree = TempSysfs::new();
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
