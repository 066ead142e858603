//! Which devices the plugin advertises: every IOMMU group whose PCI devices are all bound to
//! `vfio-pci` (and, with `--ids`, one of them of the given vendor:device ids), one unit per
//! group, read through [`kata_topo_core::Sysfs`] — the same hardened reader the checks use,
//! under the same configurable root. A device that cannot be read is skipped and reported,
//! never fatal: one odd device must not take the others off the node.
//!
//! **A group is one unit.** Kata attaches an IOMMU group whole (the container is given
//! `/dev/vfio/<group>`, and the VM gets every device in it), and VFIO hands a group to one
//! user at a time: two functions of one group advertised as two units would let the kubelet
//! give them to two pods, one of which then gets the other's device or fails to start. The
//! unit's id is the group's first function (by PCI address) that `--ids` takes; the other
//! functions ride with it (`functions`). A group holding a device not bound to `vfio-pci` (a
//! function on its host driver, a bridge, one without a driver) is advertised to no pod, and
//! the scan names those devices: bind them to `vfio-pci` too, or they would be attached to a
//! VM with their host driver still on them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use kata_topo_core::host::sysfs::{SysfsError, VfioRef};
use kata_topo_core::{Bdf, Sysfs};
use serde::Serialize;

use crate::config::PciId;

/// One device the plugin advertises.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VfioDevice {
    /// Its PCI address, the device id the kubelet sees (`0000:80:00.0`).
    #[serde(rename = "id", serialize_with = "as_string")]
    pub bdf: Bdf,
    /// Its NUMA node; `None` when sysfs gives none (`numa_node` -1 or absent).
    pub numa_node: Option<u32>,
    /// Its IOMMU group: the container gets `/dev/vfio/<group>`.
    pub iommu_group: String,
    /// Its iommufd character device (`vfioN`), where the kernel has one.
    pub iommufd: Option<String>,
    /// Its vendor:device id, when sysfs has a readable one.
    #[serde(serialize_with = "opt_as_string")]
    pub pci_id: Option<PciId>,
    /// The other functions of its IOMMU group, given with it (all bound to `vfio-pci`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub functions: Vec<Function>,
}

/// Another function of a unit's IOMMU group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Function {
    /// Its PCI address.
    #[serde(rename = "id", serialize_with = "as_string")]
    pub bdf: Bdf,
    /// Its iommufd character device (`vfioN`), where the kernel has one.
    pub iommufd: Option<String>,
}

fn as_string<S: serde::Serializer>(v: &impl ToString, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

fn opt_as_string<S: serde::Serializer>(v: &Option<PciId>, s: S) -> Result<S::Ok, S::Error> {
    match v {
        Some(v) => s.serialize_str(&v.to_string()),
        None => s.serialize_none(),
    }
}

impl VfioDevice {
    /// The device nodes a container needs for these devices, host path = container path:
    /// `/dev/vfio/vfio` (the VFIO container), each group once, each iommufd device.
    pub fn device_paths<'a>(devices: impl IntoIterator<Item = &'a VfioDevice>) -> Vec<String> {
        let mut paths = vec!["/dev/vfio/vfio".to_string()];
        let mut iommufd = Vec::new();
        for d in devices {
            let group = VfioRef::Group(d.iommu_group.clone()).path();
            if !paths.contains(&group) {
                paths.push(group);
            }
            for dev in d
                .iommufd
                .iter()
                .chain(d.functions.iter().flat_map(|f| &f.iommufd))
            {
                let path = VfioRef::Device(dev.clone()).path();
                if !iommufd.contains(&path) {
                    iommufd.push(path);
                }
            }
        }
        paths.extend(iommufd);
        paths
    }
}

/// A device that was not advertised although it may be meant to be, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// The sysfs entry (a PCI address, or a `class/vfio-dev` name).
    pub device: String,
    /// Why.
    pub why: String,
}

/// What one scan found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// The devices to advertise, by PCI address.
    pub devices: Vec<VfioDevice>,
    /// What could not be read.
    pub skipped: Vec<Skipped>,
}

/// Why there is no scan at all.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// The root has no PCI bus: not a sysfs.
    #[error("{0} has no bus/pci/devices: is it a sysfs root?")]
    NoPciBus(PathBuf),
    /// The PCI bus could not be listed.
    #[error("cannot list the PCI devices")]
    Sysfs(#[source] SysfsError),
    /// The scan's thread did not return.
    #[error("the scan did not finish: {0}")]
    Unfinished(String),
}

/// Scans sysfs for the units to advertise: IOMMU groups whose devices are all bound to
/// `vfio-pci`, one of them one of `ids` when that is not empty.
pub fn scan(sysfs: &Sysfs, ids: &[PciId]) -> Result<Scan, ScanError> {
    let names = sysfs
        .list("bus/pci/devices")
        .map_err(ScanError::Sysfs)?
        .ok_or_else(|| ScanError::NoPciBus(sysfs.root().to_path_buf()))?;
    let mut out = Scan::default();
    let iommufd = iommufd_devices(sysfs, &mut out.skipped);
    // Each device bound to vfio-pci, by its group, and whether `ids` takes it.
    let mut groups: BTreeMap<String, Vec<(VfioDevice, bool)>> = BTreeMap::new();
    for name in names {
        let skip = |why: String| Skipped {
            device: name.chars().take(64).collect(),
            why,
        };
        let Ok(bdf) = name.parse::<Bdf>() else {
            out.skipped.push(skip("not a PCI address".into()));
            continue;
        };
        let state = match sysfs.device(bdf) {
            Ok(Some(state)) => state,
            // Removed since the listing.
            Ok(None) => continue,
            Err(e) => {
                out.skipped.push(skip(error_chain(&e)));
                continue;
            }
        };
        if !state.bound_to_vfio() {
            continue;
        }
        let Some(iommu_group) = state.iommu_group else {
            out.skipped.push(skip(
                "bound to vfio-pci but in no IOMMU group: no /dev/vfio/<group> to give".into(),
            ));
            continue;
        };
        if VfioRef::from_path(&format!("/dev/vfio/{iommu_group}")).is_none_or(|r| r.is_err()) {
            out.skipped.push(skip(format!(
                "its IOMMU group `{}` is not a group number",
                iommu_group.chars().take(64).collect::<String>()
            )));
            continue;
        }
        let pci_id = match pci_id(sysfs, bdf) {
            Ok(id) => id,
            Err(why) => {
                if !ids.is_empty() {
                    out.skipped.push(skip(why));
                    continue;
                }
                None
            }
        };
        let wanted = ids.is_empty() || pci_id.is_some_and(|id| ids.contains(&id));
        groups.entry(iommu_group.clone()).or_default().push((
            VfioDevice {
                bdf,
                numa_node: state.numa_node.and_then(|n| u32::try_from(n).ok()),
                iommu_group,
                iommufd: iommufd.get(&bdf).cloned(),
                pci_id,
                functions: Vec::new(),
            },
            wanted,
        ));
    }
    for (group, mut members) in groups {
        if let Some(unit) = unit_of(sysfs, &group, &mut members, &mut out.skipped) {
            out.devices.push(unit);
        }
    }
    out.devices.sort_by_key(|d| d.bdf);
    Ok(out)
}

/// The unit advertised for IOMMU group `group`, whose devices bound to `vfio-pci` are
/// `members` (each with whether `--ids` takes it): none when the group holds another device
/// (each member is then skipped, naming it) or `--ids` takes none of them.
fn unit_of(
    sysfs: &Sysfs,
    group: &str,
    members: &mut Vec<(VfioDevice, bool)>,
    skipped: &mut Vec<Skipped>,
) -> Option<VfioDevice> {
    let mut refuse = |members: &[(VfioDevice, bool)], why: String| {
        for (d, _) in members {
            skipped.push(Skipped {
                device: d.bdf.to_string(),
                why: why.clone(),
            });
        }
    };
    let all = match sysfs.devices_of(&VfioRef::Group(group.to_string())) {
        Ok(all) => all,
        Err(e) => {
            refuse(
                members,
                format!(
                    "its IOMMU group {group} cannot be listed: {}",
                    error_chain(&e)
                ),
            );
            return None;
        }
    };
    let others: Vec<String> = all
        .iter()
        .filter(|b| !members.iter().any(|(d, _)| d.bdf == **b))
        .map(|b| match sysfs.device(*b) {
            Ok(Some(s)) if s.bound_to_vfio() => format!("{b} (vfio-pci, but unreadable)"),
            Ok(Some(s)) => format!("{b} ({})", s.driver.as_deref().unwrap_or("no driver")),
            Ok(None) => format!("{b} (gone)"),
            Err(_) => format!("{b} (unreadable)"),
        })
        .collect();
    if !others.is_empty() {
        refuse(
            members,
            format!(
                "its IOMMU group {group} also holds {}: Kata attaches a group whole, and not \
                 all of this one is bound to vfio-pci and readable, so it is given to no pod; \
                 bind those to vfio-pci too",
                others.join(", ")
            ),
        );
        return None;
    }
    members.sort_by_key(|(d, _)| d.bdf);
    let first = members.iter().position(|(_, wanted)| *wanted)?;
    let (mut unit, _) = members.remove(first);
    unit.functions = members
        .iter()
        .map(|(d, _)| Function {
            bdf: d.bdf,
            iommufd: d.iommufd.clone(),
        })
        .collect();
    Some(unit)
}

/// The device's `vendor` and `device` ids (`0x10de`), `None` when sysfs has none.
fn pci_id(sysfs: &Sysfs, bdf: Bdf) -> Result<Option<PciId>, String> {
    let values = sysfs
        .attributes(&format!("bus/pci/devices/{bdf}"), &["vendor", "device"])
        .map_err(|e| error_chain(&e))?;
    match values.as_deref() {
        Some([Some(vendor), Some(device)]) => format!("{vendor}:{device}")
            .parse::<PciId>()
            .map(Some)
            .map_err(|_| {
                format!(
                    "its vendor and device ids `{}` `{}` are not 0x-prefixed hex numbers",
                    vendor.chars().take(16).collect::<String>(),
                    device.chars().take(16).collect::<String>()
                )
            }),
        _ => Ok(None),
    }
}

/// The iommufd character devices, by the PCI device each stands for.
fn iommufd_devices(sysfs: &Sysfs, skipped: &mut Vec<Skipped>) -> BTreeMap<Bdf, String> {
    let mut map = BTreeMap::new();
    let names = match sysfs.list("class/vfio-dev") {
        Ok(names) => names.unwrap_or_default(),
        Err(e) => {
            skipped.push(Skipped {
                device: "class/vfio-dev".into(),
                why: error_chain(&e),
            });
            return map;
        }
    };
    for name in names {
        // A `vfio-dev` class entry without a character device (`dev`): kernels before
        // iommufd's VFIO cdev (6.1, Debian bookworm's) list the class but make no
        // /dev/vfio/devices/vfioN, and a container cannot be given what does not exist.
        match sysfs.attribute(&format!("class/vfio-dev/{name}/dev")) {
            Ok(Some(_)) => {}
            Ok(None) => continue,
            Err(e) => {
                skipped.push(Skipped {
                    device: format!(
                        "class/vfio-dev/{}",
                        name.chars().take(64).collect::<String>()
                    ),
                    why: error_chain(&e),
                });
                continue;
            }
        }
        match sysfs.devices_of(&VfioRef::Device(name.clone())) {
            Ok(bdfs) => {
                for bdf in bdfs {
                    map.insert(bdf, name.clone());
                }
            }
            Err(e) => skipped.push(Skipped {
                device: format!(
                    "class/vfio-dev/{}",
                    name.chars().take(64).collect::<String>()
                ),
                why: error_chain(&e),
            }),
        }
    }
    map
}

/// An error and its sources, `: `-separated, on one line (the core's, one for the project).
pub use kata_topo_core::text::error_chain;

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_core::testutil::SysfsTree;

    fn bdf(s: &str) -> Bdf {
        s.parse().expect("bdf")
    }

    fn ids(tree: &SysfsTree, dev: Bdf, vendor: &str, device: &str) {
        let dir = tree.root().join(format!("bus/pci/devices/{dev}"));
        std::fs::write(dir.join("vendor"), format!("{vendor}\n")).expect("vendor");
        std::fs::write(dir.join("device"), format!("{device}\n")).expect("device");
    }

    /// A host with two NUMA nodes' worth of devices: a NIC VF on node 1 with an iommufd
    /// device, a GPU with no NUMA node, two functions in one group, a NIC on its own driver,
    /// and a device bound to vfio-pci without an IOMMU group.
    fn host() -> (tempfile::TempDir, SysfsTree) {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SysfsTree::at(dir.path().join("sys")).expect("tree");
        let add = |b: &str, node, driver, group| {
            tree.add_device(bdf(b), node, driver, group).expect("add");
        };
        add("0000:80:00.0", 1, Some("vfio-pci"), Some("42"));
        ids(&tree, bdf("0000:80:00.0"), "0x8086", "0x1520");
        tree.add_iommufd("vfio0", bdf("0000:80:00.0"))
            .expect("iommufd");
        add("0000:00:05.0", -1, Some("vfio-pci"), Some("7"));
        ids(&tree, bdf("0000:00:05.0"), "0x10de", "0x2330");
        add("0000:81:00.0", 1, Some("vfio-pci"), Some("43"));
        add("0000:81:00.1", 1, Some("vfio-pci"), Some("43"));
        tree.add_iommufd("vfio1", bdf("0000:81:00.1"))
            .expect("iommufd");
        // A group whose other function stays on its host driver.
        add("0000:82:00.0", 0, Some("vfio-pci"), Some("44"));
        add("0000:82:00.1", 0, Some("ixgbe"), Some("44"));
        add("0000:01:00.0", 0, Some("ixgbe"), Some("3"));
        add("0000:02:00.0", 0, Some("vfio-pci"), None);
        add("0000:03:00.0", 0, None, Some("5"));
        (dir, tree)
    }

    /// Found by the real kubelet on Debian's 6.1 kernel: `class/vfio-dev/vfio0` without a
    /// character device, and a container given `/dev/vfio/devices/vfio0` failed to be created.
    #[test]
    fn a_vfio_dev_class_entry_without_a_character_device_is_no_iommufd_device() {
        let (_dir, tree) = host();
        std::fs::remove_file(tree.root().join("class/vfio-dev/vfio0/dev")).expect("rm dev");
        let scan = scan(&Sysfs::new(tree.root()), &[]).expect("scan");
        let nic = scan
            .devices
            .iter()
            .find(|d| d.bdf == bdf("0000:80:00.0"))
            .expect("the NIC is still advertised");
        assert_eq!(nic.iommufd, None);
        assert_eq!(
            VfioDevice::device_paths([nic]),
            ["/dev/vfio/vfio", "/dev/vfio/42"]
        );
    }

    #[test]
    fn advertises_vfio_pci_devices_with_their_node_group_and_iommufd_device() {
        let (_dir, tree) = host();
        let scan = scan(&Sysfs::new(tree.root()), &[]).expect("scan");
        let got: Vec<(String, Option<u32>, &str, Option<&str>)> = scan
            .devices
            .iter()
            .map(|d| {
                (
                    d.bdf.to_string(),
                    d.numa_node,
                    d.iommu_group.as_str(),
                    d.iommufd.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("0000:00:05.0".into(), None, "7", None),
                ("0000:80:00.0".into(), Some(1), "42", Some("vfio0")),
                ("0000:81:00.0".into(), Some(1), "43", None),
            ]
        );
        // The group of two functions is one unit, the second riding with the first.
        assert_eq!(
            scan.devices[2].functions,
            [Function {
                bdf: bdf("0000:81:00.1"),
                iommufd: Some("vfio1".into())
            }]
        );
        assert!(scan.devices[..2].iter().all(|d| d.functions.is_empty()));
        assert_eq!(
            scan.devices[1].pci_id,
            Some(PciId {
                vendor: 0x8086,
                device: 0x1520
            })
        );
        assert_eq!(scan.devices[2].pci_id, None);
        assert_eq!(scan.skipped.len(), 2, "{:?}", scan.skipped);
        assert_eq!(scan.skipped[0].device, "0000:02:00.0");
        assert!(scan.skipped[0].why.contains("no IOMMU group"));
        // The group with a function on its host driver: given to no pod, naming it.
        assert_eq!(scan.skipped[1].device, "0000:82:00.0");
        assert!(
            scan.skipped[1].why.contains("0000:82:00.1 (ixgbe)"),
            "{}",
            scan.skipped[1].why
        );
    }

    #[test]
    fn ids_filter_the_devices_and_devices_without_ids_are_not_taken() {
        let (_dir, tree) = host();
        let sysfs = Sysfs::new(tree.root());
        let only: Vec<PciId> = vec!["10de:2330".parse().expect("id")];
        let scan = scan(&sysfs, &only).expect("scan");
        let got: Vec<String> = scan.devices.iter().map(|d| d.bdf.to_string()).collect();
        assert_eq!(got, vec!["0000:00:05.0"]);
        let none = super::scan(&sysfs, &["1234:5678".parse().expect("id")]).expect("scan");
        assert!(none.devices.is_empty());
        // The id of a group's second function: the group is advertised under that function,
        // the first riding with it.
        ids(&tree, bdf("0000:81:00.1"), "0x10de", "0x22ba");
        let audio = super::scan(&sysfs, &["10de:22ba".parse().expect("id")]).expect("scan");
        let got: Vec<(String, Vec<String>)> = audio
            .devices
            .iter()
            .map(|d| {
                (
                    d.bdf.to_string(),
                    d.functions.iter().map(|f| f.bdf.to_string()).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![("0000:81:00.1".into(), vec!["0000:81:00.0".into()])]
        );
    }

    #[test]
    fn unbound_devices_leave_and_rebound_ones_return() {
        let (_dir, tree) = host();
        let sysfs = Sysfs::new(tree.root());
        tree.unbind(bdf("0000:80:00.0")).expect("unbind");
        let after = scan(&sysfs, &[]).expect("scan");
        assert!(!after.devices.iter().any(|d| d.bdf == bdf("0000:80:00.0")));
        tree.add_device(bdf("0000:80:00.0"), 1, Some("vfio-pci"), Some("42"))
            .expect("rebind");
        let again = scan(&sysfs, &[]).expect("scan");
        assert!(again.devices.iter().any(|d| d.bdf == bdf("0000:80:00.0")));
    }

    #[test]
    fn a_malformed_device_is_skipped_with_its_reason_and_the_others_stay() {
        let (_dir, tree) = host();
        let dev = tree.root().join("bus/pci/devices/0000:81:00.0");
        std::fs::write(dev.join("numa_node"), "one\n").expect("write");
        std::fs::write(
            tree.root().join("bus/pci/devices/0000:80:00.0/vendor"),
            "intel\n",
        )
        .expect("write");
        std::fs::create_dir_all(tree.root().join("bus/pci/devices/not-a-bdf")).expect("mkdir");
        let sysfs = Sysfs::new(tree.root());
        let all = scan(&sysfs, &[]).expect("scan");
        let got: Vec<String> = all.devices.iter().map(|d| d.bdf.to_string()).collect();
        // A vendor id that does not parse only matters when ids filter; the group of the
        // unreadable device is given to no pod.
        assert_eq!(got, vec!["0000:00:05.0", "0000:80:00.0"]);
        let why: Vec<(&str, &str)> = all
            .skipped
            .iter()
            .map(|s| (s.device.as_str(), s.why.as_str()))
            .collect();
        assert!(
            why.iter()
                .any(|(d, w)| *d == "0000:81:00.0" && w.contains("numa_node")),
            "{why:?}"
        );
        assert!(why.iter().any(|(d, _)| *d == "not-a-bdf"), "{why:?}");
        assert!(
            why.iter()
                .any(|(d, w)| *d == "0000:81:00.1" && w.contains("0000:81:00.0 (unreadable)")),
            "{why:?}"
        );
        let filtered = scan(&sysfs, &["8086:1520".parse().expect("id")]).expect("scan");
        assert!(filtered.devices.is_empty());
        assert!(
            filtered
                .skipped
                .iter()
                .any(|s| s.device == "0000:80:00.0" && s.why.contains("`intel`")),
            "{:?}",
            filtered.skipped
        );
    }

    #[test]
    fn a_root_without_a_pci_bus_is_an_error_naming_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = scan(&Sysfs::new(dir.path()), &[]).expect_err("no bus");
        assert!(
            err.to_string().contains(&dir.path().display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn device_paths_name_the_container_each_group_once_and_iommufd_devices() {
        let (_dir, tree) = host();
        let scan = scan(&Sysfs::new(tree.root()), &[]).expect("scan");
        assert_eq!(
            VfioDevice::device_paths(&scan.devices[1..]),
            vec![
                "/dev/vfio/vfio",
                "/dev/vfio/42",
                "/dev/vfio/43",
                "/dev/vfio/devices/vfio0",
                "/dev/vfio/devices/vfio1"
            ]
        );
    }
}
