//! What the kubelet sees: the inventory of advertised devices (kept across scans, so a device
//! that leaves `vfio-pci` turns `Unhealthy` rather than vanishing), and the `DevicePlugin`
//! service over it. The logic is in plain methods ([`Plugin::allocate`],
//! [`Plugin::preferred_allocation`]); the tonic trait is a thin adapter, and the one
//! `From<AllocateError> for Status` decides the gRPC codes.

use std::collections::BTreeMap;
use std::sync::Arc;

use kata_topo_core::host::sysfs::SysfsError;
use kata_topo_core::{Bdf, Sysfs};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::api;
use crate::config::ResourceName;
use crate::prefer;
use crate::scan::{error_chain, VfioDevice};

/// An advertised device and whether it is usable now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// What the last scan that saw it found.
    pub device: VfioDevice,
    /// Bound to `vfio-pci` at the last scan.
    pub healthy: bool,
}

/// A change [`Inventory::update`] made, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// First seen.
    Added(Bdf),
    /// No longer bound to `vfio-pci` (or gone).
    Unhealthy(Bdf),
    /// Bound to `vfio-pci` again.
    Healthy(Bdf),
    /// Still there with another NUMA node, group or iommufd device.
    Changed(Bdf),
}

/// Every device advertised since the plugin started, by PCI address. Devices are never
/// dropped: one that left `vfio-pci` stays, `Unhealthy`, so the kubelet takes it out of the
/// allocatable count and knows why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    entries: BTreeMap<Bdf, Entry>,
}

impl Inventory {
    /// Takes a scan's devices: they are healthy, every other known device is not.
    pub fn update(&mut self, scanned: &[VfioDevice]) -> Vec<Change> {
        let mut changes = Vec::new();
        for device in scanned {
            let entry = Entry {
                device: device.clone(),
                healthy: true,
            };
            match self.entries.insert(device.bdf, entry) {
                None => changes.push(Change::Added(device.bdf)),
                Some(old) if !old.healthy => changes.push(Change::Healthy(device.bdf)),
                Some(old) if old.device != *device => changes.push(Change::Changed(device.bdf)),
                Some(_) => {}
            }
        }
        for (bdf, entry) in &mut self.entries {
            if entry.healthy && !scanned.iter().any(|d| d.bdf == *bdf) {
                entry.healthy = false;
                changes.push(Change::Unhealthy(*bdf));
            }
        }
        changes
    }

    /// The entry of a device id, if the plugin advertises it.
    pub fn get(&self, id: &str) -> Option<&Entry> {
        self.entries.get(&id.parse::<Bdf>().ok()?)
    }

    /// Every entry, by PCI address.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// What `ListAndWatch` sends.
    pub fn to_response(&self) -> api::ListAndWatchResponse {
        api::ListAndWatchResponse {
            devices: self
                .entries
                .values()
                .map(|e| api::Device {
                    id: e.device.bdf.to_string(),
                    health: if e.healthy {
                        api::HEALTHY
                    } else {
                        api::UNHEALTHY
                    }
                    .to_string(),
                    topology: e.device.numa_node.map(|n| api::TopologyInfo {
                        nodes: vec![api::NumaNode { id: i64::from(n) }],
                    }),
                })
                .collect(),
        }
    }
}

/// Why `Allocate` cannot give a device.
#[derive(Debug, thiserror::Error)]
pub enum AllocateError {
    /// Not a device this plugin advertises.
    #[error("unknown device `{id}`: {resource} advertises no such device on this node")]
    Unknown {
        /// The id as asked (shortened).
        id: String,
        /// The resource name.
        resource: String,
    },
    /// Advertised, but no longer bound to `vfio-pci`.
    #[error("device {id} is no longer bound to vfio-pci (driver: {driver})")]
    NotBound {
        /// The PCI address.
        id: String,
        /// The driver it has now, or `none`.
        driver: String,
    },
    /// Advertised, but gone from sysfs.
    #[error("device {0} is no longer on the PCI bus")]
    Gone(String),
    /// Sysfs could not say.
    #[error("cannot read device {id}")]
    Sysfs {
        /// The PCI address.
        id: String,
        /// Why.
        #[source]
        source: SysfsError,
    },
}

impl From<AllocateError> for Status {
    fn from(e: AllocateError) -> Self {
        let message = error_chain(&e);
        match e {
            AllocateError::Unknown { .. } => Status::invalid_argument(message),
            AllocateError::NotBound { .. } | AllocateError::Gone(_) => {
                Status::failed_precondition(message)
            }
            AllocateError::Sysfs { .. } => Status::unavailable(message),
        }
    }
}

/// The `DevicePlugin` service of one serving socket.
#[derive(Debug, Clone)]
pub struct Plugin {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    sysfs: Sysfs,
    resource: ResourceName,
    inventory: watch::Receiver<Inventory>,
    /// Turns true when this socket stops serving: open `ListAndWatch` streams end.
    stop: watch::Receiver<bool>,
}

impl Plugin {
    /// A service over the inventory the scanner keeps.
    pub fn new(
        sysfs: Sysfs,
        resource: ResourceName,
        inventory: watch::Receiver<Inventory>,
        stop: watch::Receiver<bool>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                sysfs,
                resource,
                inventory,
                stop,
            }),
        }
    }

    /// What the plugin tells the kubelet at registration and when asked: no `PreStartContainer`
    /// needed, a NUMA-aware `GetPreferredAllocation`.
    pub fn options() -> api::DevicePluginOptions {
        api::DevicePluginOptions {
            pre_start_required: false,
            get_preferred_allocation_available: true,
        }
    }

    /// `Allocate`: for each container, the device nodes of its devices. Every device is read
    /// from sysfs again, so one unbound since the last scan is refused, not half given.
    pub fn allocate(
        &self,
        request: &api::AllocateRequest,
    ) -> Result<api::AllocateResponse, AllocateError> {
        let inventory = self.inner.inventory.borrow().clone();
        let mut responses = Vec::with_capacity(request.container_requests.len());
        for container in &request.container_requests {
            let mut devices = Vec::with_capacity(container.devices_ids.len());
            for id in &container.devices_ids {
                let entry = inventory.get(id).ok_or_else(|| AllocateError::Unknown {
                    id: id.chars().take(64).collect(),
                    resource: self.inner.resource.to_string(),
                })?;
                // The unit and every other function of its group, each still bound to
                // vfio-pci and still in one group.
                let mut group = None;
                let functions = entry.device.functions.iter().map(|f| f.bdf);
                for bdf in std::iter::once(entry.device.bdf).chain(functions) {
                    let now = self
                        .inner
                        .sysfs
                        .device(bdf)
                        .map_err(|source| AllocateError::Sysfs {
                            id: bdf.to_string(),
                            source,
                        })?
                        .ok_or_else(|| AllocateError::Gone(bdf.to_string()))?;
                    match (&now.driver, now.iommu_group) {
                        (Some(d), Some(g))
                            if d == "vfio-pci"
                                && group.as_ref().is_none_or(|first| *first == g) =>
                        {
                            group = Some(g)
                        }
                        (Some(d), Some(g)) if d == "vfio-pci" => {
                            return Err(AllocateError::NotBound {
                                id: bdf.to_string(),
                                driver: format!("vfio-pci in another IOMMU group ({g})"),
                            })
                        }
                        (driver, _) => {
                            return Err(AllocateError::NotBound {
                                id: bdf.to_string(),
                                driver: driver.clone().unwrap_or_else(|| "none".into()),
                            })
                        }
                    }
                }
                devices.push(VfioDevice {
                    iommu_group: group.unwrap_or_default(),
                    ..entry.device.clone()
                });
            }
            let specs = if devices.is_empty() {
                Vec::new()
            } else {
                VfioDevice::device_paths(&devices)
                    .into_iter()
                    .map(|path| api::DeviceSpec {
                        container_path: path.clone(),
                        host_path: path,
                        permissions: "rw".into(),
                    })
                    .collect()
            };
            responses.push(api::ContainerAllocateResponse {
                devices: specs,
                ..Default::default()
            });
        }
        Ok(api::AllocateResponse {
            container_responses: responses,
        })
    }

    /// `GetPreferredAllocation`: see [`prefer`].
    pub fn preferred_allocation(
        &self,
        request: &api::PreferredAllocationRequest,
    ) -> api::PreferredAllocationResponse {
        let inventory = self.inner.inventory.borrow().clone();
        let node_of = |id: &str| inventory.get(id).and_then(|e| e.device.numa_node);
        api::PreferredAllocationResponse {
            container_responses: request
                .container_requests
                .iter()
                .map(|c| api::ContainerPreferredAllocationResponse {
                    device_i_ds: prefer::preferred(
                        &c.available_device_i_ds,
                        &c.must_include_device_i_ds,
                        usize::try_from(c.allocation_size).unwrap_or(0),
                        node_of,
                    ),
                })
                .collect(),
        }
    }
}

#[tonic::async_trait]
impl api::device_plugin_server::DevicePlugin for Plugin {
    async fn get_device_plugin_options(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(Self::options()))
    }

    type ListAndWatchStream = ReceiverStream<Result<api::ListAndWatchResponse, Status>>;

    async fn list_and_watch(
        &self,
        _: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut inventory = self.inner.inventory.clone();
        let mut stop = self.inner.stop.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let list = inventory.borrow_and_update().to_response();
                tokio::select! {
                    sent = tx.send(Ok(list)) => if sent.is_err() { break },
                    _ = stop.wait_for(|s| *s) => break,
                }
                tokio::select! {
                    changed = inventory.changed() => if changed.is_err() { break },
                    _ = stop.wait_for(|s| *s) => break,
                    () = tx.closed() => break,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        Ok(Response::new(self.preferred_allocation(request.get_ref())))
    }

    async fn allocate(
        &self,
        request: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let plugin = self.clone();
        tokio::task::spawn_blocking(move || plugin.allocate(request.get_ref()))
            .await
            .map_err(|e| Status::internal(format!("allocate did not finish: {e}")))?
            .map(Response::new)
            .map_err(Status::from)
    }

    async fn pre_start_container(
        &self,
        _: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_core::testutil::SysfsTree;
    use tonic::Code;

    fn bdf(s: &str) -> Bdf {
        s.parse().expect("bdf")
    }

    fn device(b: &str, node: Option<u32>, group: &str) -> VfioDevice {
        VfioDevice {
            bdf: bdf(b),
            numa_node: node,
            iommu_group: group.into(),
            iommufd: None,
            pci_id: None,
            functions: Vec::new(),
        }
    }

    struct Fixture {
        _dir: tempfile::TempDir,
        tree: SysfsTree,
        plugin: Plugin,
        _inventory: watch::Sender<Inventory>,
        _stop: watch::Sender<bool>,
    }

    fn fixture() -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let tree = SysfsTree::at(dir.path().join("sys")).expect("tree");
        tree.add_device(bdf("0000:80:00.0"), 1, Some("vfio-pci"), Some("42"))
            .expect("add");
        tree.add_device(bdf("0000:80:00.1"), 1, Some("vfio-pci"), Some("44"))
            .expect("add");
        // Two functions of one IOMMU group: one unit, 0000:81:00.0.
        tree.add_device(bdf("0000:81:00.0"), 1, Some("vfio-pci"), Some("43"))
            .expect("add");
        tree.add_device(bdf("0000:81:00.1"), 1, Some("vfio-pci"), Some("43"))
            .expect("add");
        tree.add_iommufd("vfio5", bdf("0000:81:00.1"))
            .expect("iommufd");
        tree.add_device(bdf("0000:00:05.0"), 0, Some("vfio-pci"), Some("7"))
            .expect("add");
        tree.add_iommufd("vfio3", bdf("0000:00:05.0"))
            .expect("iommufd");
        let sysfs = Sysfs::new(tree.root());
        let found = crate::scan::scan(&sysfs, &[]).expect("scan");
        let mut inventory = Inventory::default();
        inventory.update(&found.devices);
        let (inv_tx, inv_rx) = watch::channel(inventory);
        let (stop_tx, stop_rx) = watch::channel(false);
        let plugin = Plugin::new(
            sysfs,
            "kata-topo.io/vfio".parse().expect("name"),
            inv_rx,
            stop_rx,
        );
        Fixture {
            _dir: dir,
            tree,
            plugin,
            _inventory: inv_tx,
            _stop: stop_tx,
        }
    }

    fn request(containers: &[&[&str]]) -> api::AllocateRequest {
        api::AllocateRequest {
            container_requests: containers
                .iter()
                .map(|ids| api::ContainerAllocateRequest {
                    devices_ids: ids.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
        }
    }

    fn paths(r: &api::ContainerAllocateResponse) -> Vec<(&str, &str, &str)> {
        r.devices
            .iter()
            .map(|d| {
                (
                    d.host_path.as_str(),
                    d.container_path.as_str(),
                    d.permissions.as_str(),
                )
            })
            .collect()
    }

    #[test]
    fn inventory_keeps_devices_that_leave_as_unhealthy_and_reports_each_change() {
        let mut inv = Inventory::default();
        let a = device("0000:80:00.0", Some(1), "42");
        let b = device("0000:00:05.0", None, "7");
        assert_eq!(
            inv.update(&[a.clone(), b.clone()]),
            vec![Change::Added(a.bdf), Change::Added(b.bdf)]
        );
        assert_eq!(inv.update(&[a.clone(), b.clone()]), vec![]);
        assert_eq!(
            inv.update(std::slice::from_ref(&b)),
            vec![Change::Unhealthy(a.bdf)]
        );
        let list = inv.to_response();
        let got: Vec<(&str, &str, Option<Vec<i64>>)> = list
            .devices
            .iter()
            .map(|d| {
                (
                    d.id.as_str(),
                    d.health.as_str(),
                    d.topology
                        .as_ref()
                        .map(|t| t.nodes.iter().map(|n| n.id).collect()),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("0000:00:05.0", "Healthy", None),
                ("0000:80:00.0", "Unhealthy", Some(vec![1])),
            ]
        );
        let moved = device("0000:00:05.0", Some(0), "7");
        assert_eq!(
            inv.update(&[a.clone(), moved]),
            vec![Change::Healthy(a.bdf), Change::Changed(b.bdf)]
        );
    }

    #[test]
    fn allocate_gives_the_container_the_vfio_container_each_group_and_iommufd_devices() {
        let f = fixture();
        let r = f
            .plugin
            .allocate(&request(&[
                &["0000:80:00.0", "0000:80:00.1"],
                &["0000:00:05.0"],
                &["0000:81:00.0"],
            ]))
            .expect("allocate");
        assert_eq!(r.container_responses.len(), 3);
        assert_eq!(
            paths(&r.container_responses[0]),
            vec![
                ("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
                ("/dev/vfio/42", "/dev/vfio/42", "rw"),
                ("/dev/vfio/44", "/dev/vfio/44", "rw"),
            ]
        );
        // A group of two functions: its group once, and its other function's iommufd device.
        assert_eq!(
            paths(&r.container_responses[2]),
            vec![
                ("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
                ("/dev/vfio/43", "/dev/vfio/43", "rw"),
                ("/dev/vfio/devices/vfio5", "/dev/vfio/devices/vfio5", "rw"),
            ]
        );
        assert_eq!(
            paths(&r.container_responses[1]),
            vec![
                ("/dev/vfio/vfio", "/dev/vfio/vfio", "rw"),
                ("/dev/vfio/7", "/dev/vfio/7", "rw"),
                ("/dev/vfio/devices/vfio3", "/dev/vfio/devices/vfio3", "rw"),
            ]
        );
        let none = f.plugin.allocate(&request(&[&[]])).expect("allocate");
        assert!(none.container_responses[0].devices.is_empty());
    }

    #[test]
    fn each_allocate_error_has_its_own_code_and_names_the_device() {
        let f = fixture();
        // The second function of a group is not a unit of its own.
        for id in ["0000:99:00.0", "gpu0", "../../etc", "0000:81:00.1"] {
            let err = f
                .plugin
                .allocate(&request(&[&["0000:80:00.0", id]]))
                .expect_err(id);
            let status = Status::from(err);
            assert_eq!(status.code(), Code::InvalidArgument, "{id}");
            assert!(status.message().contains(id), "{}", status.message());
            assert!(status.message().contains("kata-topo.io/vfio"));
        }

        // The group's other function left vfio-pci since the scan: the unit is refused.
        f.tree.unbind(bdf("0000:81:00.1")).expect("unbind");
        let status = Status::from(
            f.plugin
                .allocate(&request(&[&["0000:81:00.0"]]))
                .expect_err("a function unbound"),
        );
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().contains("0000:81:00.1"),
            "{}",
            status.message()
        );

        f.tree.unbind(bdf("0000:80:00.0")).expect("unbind");
        let status = Status::from(
            f.plugin
                .allocate(&request(&[&["0000:80:00.0"]]))
                .expect_err("unbound"),
        );
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(
            status.message().contains("0000:80:00.0") && status.message().contains("none"),
            "{}",
            status.message()
        );

        std::fs::write(
            f.tree.root().join("bus/pci/devices/0000:80:00.1/numa_node"),
            "x\n",
        )
        .expect("write");
        let status = Status::from(
            f.plugin
                .allocate(&request(&[&["0000:80:00.1"]]))
                .expect_err("malformed"),
        );
        assert_eq!(status.code(), Code::Unavailable);
        assert!(
            status.message().contains("0000:80:00.1") && status.message().contains("numa_node"),
            "{}",
            status.message()
        );

        std::fs::remove_file(f.tree.root().join("bus/pci/devices/0000:00:05.0")).expect("rm");
        std::fs::remove_dir_all(f.tree.root().join("devices/pci0000:00/0000:00:05.0")).expect("rm");
        let status = Status::from(
            f.plugin
                .allocate(&request(&[&["0000:00:05.0"]]))
                .expect_err("gone"),
        );
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert!(status.message().contains("no longer on the PCI bus"));
    }

    #[test]
    fn preferred_allocation_packs_by_the_devices_numa_nodes() {
        let f = fixture();
        let r = f
            .plugin
            .preferred_allocation(&api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: vec![
                        "0000:00:05.0".into(),
                        "0000:80:00.0".into(),
                        "0000:80:00.1".into(),
                    ],
                    must_include_device_i_ds: vec!["0000:80:00.1".into()],
                    allocation_size: 2,
                }],
            });
        assert_eq!(
            r.container_responses[0].device_i_ds,
            vec!["0000:80:00.1", "0000:80:00.0"]
        );
        let negative = f
            .plugin
            .preferred_allocation(&api::PreferredAllocationRequest {
                container_requests: vec![api::ContainerPreferredAllocationRequest {
                    available_device_i_ds: vec!["0000:00:05.0".into()],
                    must_include_device_i_ds: vec![],
                    allocation_size: -3,
                }],
            });
        assert!(negative.container_responses[0].device_i_ds.is_empty());
    }
}
