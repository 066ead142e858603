//! Builds sysfs trees laid out the way the kernel lays them out (real directories under
//! `devices/`, symlinks from `bus/pci/devices`, `kernel/iommu_groups` and `class/vfio-dev`), so
//! tests and the demo can describe VFIO devices of a simulated host and read them through the
//! same [`Sysfs`](crate::sysfs::Sysfs) code that reads `/sys`.

use std::io;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use crate::pci::Bdf;

/// A sysfs tree under a directory the caller owns.
#[derive(Debug, Clone)]
pub struct SysfsTree {
    root: PathBuf,
}

impl SysfsTree {
    /// A tree rooted at `root` (created if missing).
    pub fn at(root: impl Into<PathBuf>) -> io::Result<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)?;
        Ok(Self { root })
    }

    /// Its root, to pass as the sysfs root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Adds a PCI device: its `numa_node`, the driver it is bound to (if any) and its IOMMU
    /// group (if any). Adding a device again replaces its attributes.
    pub fn add_device(
        &self,
        bdf: Bdf,
        numa_node: i32,
        driver: Option<&str>,
        group: Option<&str>,
    ) -> io::Result<()> {
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        let dev_rel = format!("devices/{bus_dir}/{bdf}");
        let dev = self.root.join(&dev_rel);
        std::fs::create_dir_all(&dev)?;
        std::fs::write(dev.join("numa_node"), format!("{numa_node}\n"))?;
        replace_link(&dev.join("driver"), None)?;
        if let Some(driver) = driver {
            let drv = self.root.join("bus/pci/drivers").join(driver);
            std::fs::create_dir_all(&drv)?;
            replace_link(
                &dev.join("driver"),
                Some(&format!("../../../bus/pci/drivers/{driver}")),
            )?;
        }
        replace_link(&dev.join("iommu_group"), None)?;
        if let Some(group) = group {
            let gdir = self
                .root
                .join("kernel/iommu_groups")
                .join(group)
                .join("devices");
            std::fs::create_dir_all(&gdir)?;
            replace_link(
                &gdir.join(bdf.to_string()),
                Some(&format!("../../../../{dev_rel}")),
            )?;
            replace_link(
                &dev.join("iommu_group"),
                Some(&format!("../../../kernel/iommu_groups/{group}")),
            )?;
        }
        let bus = self.root.join("bus/pci/devices");
        std::fs::create_dir_all(&bus)?;
        replace_link(
            &bus.join(bdf.to_string()),
            Some(&format!("../../../{dev_rel}")),
        )
    }

    /// Adds an iommufd character device `vfioN` for a device.
    pub fn add_iommufd(&self, name: &str, bdf: Bdf) -> io::Result<()> {
        let dir = self.root.join("class/vfio-dev").join(name);
        std::fs::create_dir_all(&dir)?;
        // Its character device's number: only a kernel with iommufd's VFIO cdev (6.6+) has one.
        std::fs::write(dir.join("dev"), "511:0\n")?;
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        replace_link(
            &dir.join("device"),
            Some(&format!("../../../devices/{bus_dir}/{bdf}")),
        )
    }

    /// Unbinds a device from its driver (as `echo > unbind` does).
    pub fn unbind(&self, bdf: Bdf) -> io::Result<()> {
        let bus_dir = format!("pci{:04x}:{:02x}", bdf.domain, bdf.bus);
        replace_link(
            &self.root.join(format!("devices/{bus_dir}/{bdf}/driver")),
            None,
        )
    }
}

fn replace_link(link: &Path, target: Option<&str>) -> io::Result<()> {
    match std::fs::remove_file(link) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    match target {
        Some(t) => symlink(t, link),
        None => Ok(()),
    }
}
