//! VFIO devices of a spec resolved against sysfs and the host, and the baseline a first
//! create records.

use crate::check::intent::{Baseline, BaselineDevice, BASELINE_VERSION};
use crate::host::pci::Bdf;
use crate::host::sysfs::{SysfsError, VfioRef};
use crate::host::Locality;
use crate::input::spec::ContainerSpec;

use super::Checker;

/// A VFIO device of the spec, resolved against sysfs and the host.
#[derive(Debug, Clone)]
pub(super) enum Device {
    /// Present, bound to vfio-pci.
    Usable {
        path: String,
        bdf: Bdf,
        locality: Locality,
    },
    /// Gone or unbound.
    Missing { path: String, reason: String },
    /// Could not be looked at.
    Failed { path: String, reason: String },
}

impl Checker<'_> {
    /// The devices behind one VFIO path of the spec.
    fn resolve(&self, vfio: &VfioRef) -> Vec<Device> {
        let path = vfio.path();
        let Some(sysfs) = self.sysfs else {
            return vec![Device::Failed {
                path,
                reason: "no sysfs root is configured to resolve VFIO devices".to_string(),
            }];
        };
        let bdfs = match sysfs.devices_of(vfio) {
            Ok(b) => b,
            Err(e @ SysfsError::Missing { .. }) => {
                return vec![Device::Missing {
                    path,
                    reason: e.to_string(),
                }]
            }
            Err(e) => {
                return vec![Device::Failed {
                    path,
                    reason: crate::text::error_chain(&e),
                }]
            }
        };
        bdfs.into_iter()
            .map(|bdf| match sysfs.device(bdf) {
                Ok(Some(state)) if state.bound_to_vfio() => Device::Usable {
                    path: path.clone(),
                    bdf,
                    locality: self.host.device_locality(bdf, Some(&state)),
                },
                Ok(Some(state)) => Device::Missing {
                    path: path.clone(),
                    reason: format!(
                        "device {bdf} is bound to {} instead of vfio-pci",
                        state.driver.as_deref().unwrap_or("no driver")
                    ),
                },
                Ok(None) => Device::Missing {
                    path: path.clone(),
                    reason: format!("device {bdf} is no longer on the PCI bus"),
                },
                Err(e) => Device::Failed {
                    path: path.clone(),
                    reason: crate::text::error_chain(&e),
                },
            })
            .collect()
    }

    /// Every VFIO device of the spec, in the spec's order.
    pub(super) fn resolve_all(&self, spec: &ContainerSpec) -> Vec<Device> {
        spec.vfio.iter().flat_map(|v| self.resolve(v)).collect()
    }

    /// The baseline a first create of `spec` records.
    pub fn record_baseline(&self, spec: &ContainerSpec) -> Baseline {
        let cpus = spec.resources.cpus.clone();
        let cpu_nodes = cpus
            .as_ref()
            .map(|c| self.host.nodes_of_cpus(c))
            .unwrap_or_default();
        let devices = self
            .resolve_all(spec)
            .into_iter()
            .filter_map(|d| match d {
                Device::Usable {
                    path,
                    bdf,
                    locality,
                } => Some(BaselineDevice {
                    path,
                    bus_id: bdf,
                    numa_nodes: locality.nodes().cloned(),
                }),
                _ => None,
            })
            .collect();
        Baseline {
            version: BASELINE_VERSION,
            sandbox_id: spec.sandbox_id.clone(),
            container_name: spec.container_name.clone(),
            cpus,
            mems: spec.resources.mems.clone(),
            cpu_nodes,
            devices,
            topology_fingerprint: self.host.fingerprint().to_string(),
        }
    }
}
