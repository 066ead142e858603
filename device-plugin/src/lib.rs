//! kata-topo's device plugin: advertises the PCI devices bound to `vfio-pci` to the kubelet
//! (device plugin API v1beta1, gRPC on unix sockets) as one extended resource, each device with
//! its NUMA node as topology hint, so the kubelet's Topology Manager can align a passthrough
//! device with the CPUs and memory it gives the pod. `Allocate` answers with the device nodes a
//! VFIO user needs: `/dev/vfio/vfio`, `/dev/vfio/<group>` and, where the kernel has it, the
//! iommufd device `/dev/vfio/devices/vfioN`.
//!
//! The host is read through [`kata_topo_core::Sysfs`] only (one reader of sysfs in the
//! project); this crate decides which devices to advertise ([`scan`]), what the kubelet gets
//! ([`plugin`]) and when to (re-)register ([`registration`]).

#![forbid(unsafe_code)]

pub mod cli;
pub mod config;
pub mod log;
pub mod plugin;
pub mod prefer;
pub mod registration;
pub mod scan;

/// The kubelet's device plugin API v1beta1, generated at build time from the kubelet's own
/// `api.proto` (vendored under `proto/protos/kubelet/`): messages, the `Registration` and
/// `DevicePlugin` services' clients (`*_client`) and servers (`*_server`).
#[allow(
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    clippy::all,
    clippy::pedantic
)]
pub mod api {
    include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));

    /// The API version this plugin speaks, as the kubelet checks it in `Register`.
    pub const VERSION: &str = "v1beta1";
    /// A device's health while it is bound to `vfio-pci`.
    pub const HEALTHY: &str = "Healthy";
    /// A device's health once it is no longer bound to `vfio-pci` (or gone).
    pub const UNHEALTHY: &str = "Unhealthy";
    /// The kubelet's registration socket, in the device plugin directory.
    pub const KUBELET_SOCKET: &str = "kubelet.sock";
}
