//! PCI devices by address: the [`Bdf`] a request, hwloc and sysfs all name a device by, and
//! the [`DeviceState`] sysfs reports for one. The host (`host.rs`) and the VFIO map
//! (`sysfs.rs`) both speak of devices in these terms.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A PCI address with its domain: `0000:34:00.0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bdf {
    /// PCI domain (segment).
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number (0-31).
    pub device: u8,
    /// Function number (0-7).
    pub function: u8,
}

/// Why a PCI address did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a PCI address like 0000:34:00.0")]
pub struct BdfError(pub String);

impl FromStr for Bdf {
    type Err = BdfError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BdfError(s.chars().take(64).collect());
        let b = s.as_bytes();
        // dddd:bb:dd.f — exactly, as sysfs names devices.
        if b.len() != 12 || b[4] != b':' || b[7] != b':' || b[10] != b'.' {
            return Err(bad());
        }
        let hex = |r: std::ops::Range<usize>| {
            let part = &s[r];
            if part.bytes().all(|c| c.is_ascii_hexdigit()) {
                u32::from_str_radix(part, 16).map_err(|_| bad())
            } else {
                Err(bad())
            }
        };
        let (domain, bus, device, function) = (hex(0..4)?, hex(5..7)?, hex(8..10)?, hex(11..12)?);
        if device > 31 || function > 7 {
            return Err(bad());
        }
        Ok(Self {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

impl fmt::Display for Bdf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl Serialize for Bdf {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Bdf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bdf_parses_and_formats() {
        let bdf: Bdf = "0000:34:00.0".parse().expect("valid");
        assert_eq!(bdf.bus, 0x34);
        assert_eq!(bdf.to_string(), "0000:34:00.0");
        let bdf: Bdf = "10000:00:1f.7".parse().unwrap_or(Bdf {
            domain: 0,
            bus: 0,
            device: 0,
            function: 0,
        });
        assert_eq!(bdf.domain, 0, "five-digit domain is rejected");
        for bad in [
            "",
            "0000:34:00",
            "0000:34:20.0",
            "0000:34:00.8",
            "../../etc",
            "0000:zz:00.0",
            "0000-34-00.0",
            "+000:34:00.0",
        ] {
            assert!(bad.parse::<Bdf>().is_err(), "{bad} must be rejected");
        }
        assert_eq!(
            "0001:b7:1f.7".parse::<Bdf>().map(|b| b.to_string()),
            Ok("0001:b7:1f.7".into())
        );
    }
}
