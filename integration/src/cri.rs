//! A CRI client playing the kubelet.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

use crate::{Containerd, BUSYBOX};

/// A CRI client playing the kubelet.
#[derive(Debug)]
pub struct Cri {
    /// The gRPC client.
    pub client: RuntimeServiceClient<Channel>,
    rt: tokio::runtime::Runtime,
    logs: PathBuf,
    vfio_node: PathBuf,
}

/// A container to create: its name, resources, annotations and restart count.
#[derive(Debug, Clone)]
pub struct Container<'a> {
    /// The CRI container name.
    pub name: &'a str,
    pub resources: &'a Resources,
    /// The container's own annotations (they reach the OCI spec when the runtime handler
    /// allow-lists them with `container_annotations`).
    pub annotations: &'a [(String, String)],
    /// The restart count (`attempt` in CRI's metadata).
    pub attempt: u32,
}

impl<'a> Container<'a> {
    /// A first start, without annotations.
    pub fn new(name: &'a str, resources: &'a Resources) -> Self {
        Self {
            name,
            resources,
            annotations: &[],
            attempt: 0,
        }
    }
}

/// A container's resources as the kubelet sends them in `CreateContainer` and `UpdateContainerResources`.
#[derive(Debug, Clone, Default)]
pub struct Resources {
    /// `cpuset_cpus`.
    pub cpus: &'static str,
    /// `cpuset_mems`.
    pub mems: &'static str,
    /// `cpu_quota`.
    pub quota: i64,
    /// `memory_limit_in_bytes`.
    pub memory: i64,
}

impl Resources {
    /// What the simulated kubelet admits a container with: CPU 1 (NUMA node 1 of the simulated
    /// host), a 1-CPU quota, 256 MiB.
    pub fn admitted() -> Self {
        Self {
            cpus: "1",
            quota: 100_000,
            memory: 256 << 20,
            ..Self::default()
        }
    }

    /// The same resources on other CPUs.
    pub fn on(&self, cpus: &'static str) -> Self {
        Self {
            cpus,
            ..self.clone()
        }
    }

    fn cri(&self) -> cri::LinuxContainerResources {
        cri::LinuxContainerResources {
            cpu_period: 100_000,
            cpu_quota: self.quota,
            cpu_shares: 1024,
            memory_limit_in_bytes: self.memory,
            cpuset_cpus: self.cpus.to_string(),
            cpuset_mems: self.mems.to_string(),
            ..Default::default()
        }
    }
}

impl Containerd {
    /// A CRI client over containerd's socket.
    pub fn cri(&self) -> Cri {
        Cri::connect(
            &self.socket,
            &self.dir.path().join("pod-logs"),
            &self.vfio_node,
        )
    }
}

impl Cri {
    /// Connects to a CRI socket; pod logs go under `logs`, `/dev/vfio/42` is backed by `vfio_node`.
    pub fn connect(socket: &Path, logs: &Path, vfio_node: &Path) -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("tokio");
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(async move {
                tonic::transport::Endpoint::try_from("http://[::]:50051")
                    .expect("endpoint")
                    .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(
                                tokio::net::UnixStream::connect(path).await?,
                            ))
                        }
                    }))
                    .await
            })
            .expect("connect CRI");
        Cri {
            client: RuntimeServiceClient::new(channel),
            rt,
            logs: logs.to_path_buf(),
            vfio_node: vfio_node.to_path_buf(),
        }
    }
}

impl Cri {
    /// Runs a future on the client's runtime.
    pub fn block<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The sandbox config of a host-network pod with these annotations.
    pub fn pod_config(&self, name: &str, annotations: &[(&str, &str)]) -> cri::PodSandboxConfig {
        std::fs::create_dir_all(self.logs.join(name)).expect("log dir");
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.to_string(),
                uid: format!("uid-{name}"),
                namespace: "ml".to_string(),
                attempt: 0,
            }),
            log_directory: self.logs.join(name).to_string_lossy().into_owned(),
            annotations: annotations
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>(),
            linux: Some(cri::LinuxPodSandboxConfig {
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Node as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// `RunPodSandbox` with a runtime handler.
    pub fn run_pod(
        &mut self,
        config: &cri::PodSandboxConfig,
        handler: &str,
    ) -> Result<String, tonic::Status> {
        let req = cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_string(),
        };
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.run_pod_sandbox(req).await })
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    /// `CreateContainer` + `StartContainer` of a sleeping busybox, optionally with the
    /// simulated VFIO device.
    pub fn start_container(
        &mut self,
        pod: &str,
        config: &cri::PodSandboxConfig,
        name: &str,
        res: &Resources,
        vfio: bool,
    ) -> Result<String, tonic::Status> {
        let id = self.create_container(pod, config, name, res, vfio)?;
        self.start(&id)?;
        Ok(id)
    }

    /// `CreateContainer` of a sleeping busybox (the shim sees nothing until it starts).
    pub fn create_container(
        &mut self,
        pod: &str,
        config: &cri::PodSandboxConfig,
        name: &str,
        res: &Resources,
        vfio: bool,
    ) -> Result<String, tonic::Status> {
        self.create_container_as(pod, config, &Container::new(name, res), vfio)
    }

    /// `CreateContainer` of a sleeping busybox with the container's own annotations and
    /// restart count.
    pub fn create_container_as(
        &mut self,
        pod: &str,
        config: &cri::PodSandboxConfig,
        container: &Container<'_>,
        vfio: bool,
    ) -> Result<String, tonic::Status> {
        let (name, res) = (container.name, container.resources);
        let devices = if vfio {
            vec![cri::Device {
                container_path: vfio_container_path(&self.vfio_node),
                host_path: self.vfio_node.to_string_lossy().into_owned(),
                permissions: "rw".into(),
            }]
        } else {
            Vec::new()
        };
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: pod.to_string(),
            config: Some(cri::ContainerConfig {
                metadata: Some(cri::ContainerMetadata {
                    name: name.to_string(),
                    attempt: container.attempt,
                }),
                annotations: container
                    .annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                labels: kubelet_labels(name, config),
                // As the kubelet sends it: CRI-O verifies the image the user named.
                image: Some(cri::ImageSpec {
                    image: BUSYBOX.to_string(),
                    user_specified_image: BUSYBOX.to_string(),
                    ..Default::default()
                }),
                command: vec![
                    "/bin/sh".into(),
                    "-c".into(),
                    "trap 'exit 0' TERM; while :; do sleep 1; done".into(),
                ],
                log_path: format!("{name}.log"),
                devices,
                linux: Some(cri::LinuxContainerConfig {
                    resources: Some(res.cri()),
                    // The pod's namespaces, as the kubelet gives each container (CRI-O refuses
                    // a container whose PID namespace is not the pod's).
                    security_context: Some(cri::LinuxContainerSecurityContext {
                        namespace_options: config
                            .linux
                            .as_ref()
                            .and_then(|l| l.security_context.as_ref())
                            .and_then(|s| s.namespace_options.clone()),
                        ..Default::default()
                    }),
                }),
                ..Default::default()
            }),
            sandbox_config: Some(config.clone()),
        };
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.create_container(req).await })
            .map(|r| r.into_inner().container_id)
    }

    /// `StartContainer`: the shim's `Create`.
    pub fn start(&mut self, id: &str) -> Result<(), tonic::Status> {
        let mut client = self.client.clone();
        let start = cri::StartContainerRequest {
            container_id: id.to_string(),
        };
        self.rt
            .block_on(async move { client.start_container(start).await })
            .map(|_| ())
    }

    /// `RunPodSandbox` on the `kata-topo` handler, then container `app` admitted with
    /// [`Resources::admitted`] (and `/dev/vfio/42` when `vfio`). Returns the pod id, its configuration
    /// and the container id.
    pub fn admit(
        &mut self,
        pod_name: &str,
        annotations: &[(&str, &str)],
        vfio: bool,
    ) -> (String, cri::PodSandboxConfig, String) {
        let cfg = self.pod_config(pod_name, annotations);
        let pod = self.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
        let id = self
            .start_container(&pod, &cfg, "app", &Resources::admitted(), vfio)
            .expect("StartContainer");
        (pod, cfg, id)
    }

    /// `UpdateContainerResources`.
    pub fn update(&mut self, id: &str, res: &Resources) -> Result<(), tonic::Status> {
        let req = cri::UpdateContainerResourcesRequest {
            container_id: id.to_string(),
            linux: Some(res.cri()),
            ..Default::default()
        };
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.update_container_resources(req).await })
            .map(|_| ())
    }

    /// Waits until the CRI service answers (after a containerd restart it first recovers its
    /// state and answers "server is not initialized yet").
    pub fn wait_ready(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let mut client = self.client.clone();
            let ready = self.rt.block_on(async move {
                client
                    .list_pod_sandbox(cri::ListPodSandboxRequest { filter: None })
                    .await
                    .is_ok()
            });
            if ready {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// `ContainerStatus` (verbose): state and the runtime spec containerd keeps.
    pub fn status(&mut self, id: &str) -> (i32, serde_json::Value) {
        let req = cri::ContainerStatusRequest {
            container_id: id.to_string(),
            verbose: true,
        };
        let mut client = self.client.clone();
        let resp = self
            .rt
            .block_on(async move { client.container_status(req).await })
            .expect("ContainerStatus")
            .into_inner();
        let state = resp.status.map_or(-1, |s| s.state);
        let info = resp
            .info
            .get("info")
            .and_then(|i| serde_json::from_str(i).ok())
            .unwrap_or(serde_json::Value::Null);
        (state, info)
    }

    /// The CPUs the container's process may run on, from the kernel.
    pub fn allowed_cpus(&mut self, id: &str) -> String {
        let (_, info) = self.status(id);
        let pid = info["pid"].as_u64().expect("pid in status info");
        std::fs::read_to_string(format!("/proc/{pid}/status"))
            .expect("proc status")
            .lines()
            .find_map(|l| {
                l.strip_prefix("Cpus_allowed_list:")
                    .map(|v| v.trim().to_string())
            })
            .expect("Cpus_allowed_list")
    }

    /// `ExecSync`: runs `cmd` in the container; its exit code, stdout and stderr.
    pub fn exec_sync(
        &mut self,
        id: &str,
        cmd: &[String],
        timeout: Duration,
    ) -> Result<(i32, Vec<u8>, Vec<u8>), tonic::Status> {
        let req = cri::ExecSyncRequest {
            container_id: id.to_string(),
            cmd: cmd.to_vec(),
            timeout: timeout.as_secs().try_into().unwrap_or(i64::MAX),
        };
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.exec_sync(req).await })
            .map(|r| {
                let r = r.into_inner();
                (r.exit_code, r.stdout, r.stderr)
            })
    }

    /// `PodSandboxStatus`: whether the sandbox is ready.
    pub fn pod_ready(&mut self, id: &str) -> Result<bool, tonic::Status> {
        let req = cri::PodSandboxStatusRequest {
            pod_sandbox_id: id.to_string(),
            verbose: false,
        };
        let mut client = self.client.clone();
        self.rt
            .block_on(async move { client.pod_sandbox_status(req).await })
            .map(|r| {
                r.into_inner()
                    .status
                    .is_some_and(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
            })
    }

    /// Stops and removes a container.
    pub fn remove_container(&mut self, id: &str) {
        let mut client = self.client.clone();
        let (stop, remove) = (
            cri::StopContainerRequest {
                container_id: id.to_string(),
                timeout: 5,
            },
            cri::RemoveContainerRequest {
                container_id: id.to_string(),
            },
        );
        self.rt.block_on(async move {
            client.stop_container(stop).await.expect("StopContainer");
            client
                .remove_container(remove)
                .await
                .expect("RemoveContainer");
        });
    }

    /// Stops and removes a pod.
    pub fn remove_pod(&mut self, id: &str) {
        let mut client = self.client.clone();
        let (stop, remove) = (
            cri::StopPodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            },
            cri::RemovePodSandboxRequest {
                pod_sandbox_id: id.to_string(),
            },
        );
        self.rt.block_on(async move {
            client.stop_pod_sandbox(stop).await.expect("StopPodSandbox");
            client
                .remove_pod_sandbox(remove)
                .await
                .expect("RemovePodSandbox");
        });
    }
}

/// The labels the kubelet puts on a container (`newContainerLabels`): CRI-O names a container
/// to NRI plugins by `io.kubernetes.container.name` (containerd by the CRI metadata's name).
fn kubelet_labels(name: &str, pod: &cri::PodSandboxConfig) -> HashMap<String, String> {
    let meta = pod.metadata.clone().unwrap_or_default();
    [
        ("io.kubernetes.container.name", name.to_string()),
        ("io.kubernetes.pod.name", meta.name),
        ("io.kubernetes.pod.namespace", meta.namespace),
        ("io.kubernetes.pod.uid", meta.uid),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

/// Where a container sees its VFIO device: a real group node (`/dev/vfio/<group>`, as in the
/// vm-test guest) at its own path, a stand-in node at `/dev/vfio/42`, the simulated GPU's group.
pub fn vfio_container_path(host: &Path) -> String {
    match host.strip_prefix("/dev/vfio") {
        Ok(rest) if rest.components().count() == 1 => host.to_string_lossy().into_owned(),
        _ => "/dev/vfio/42".into(),
    }
}

/// Container state EXITED in CRI.
pub const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

/// Container state RUNNING in CRI.
pub const RUNNING: i32 = cri::ContainerState::ContainerRunning as i32;
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_vfio_group_keeps_its_path_a_stand_in_is_group_42() {
        assert_eq!(vfio_container_path(Path::new("/dev/vfio/7")), "/dev/vfio/7");
        assert_eq!(
            vfio_container_path(Path::new("/tmp/kt-x/vfio-42")),
            "/dev/vfio/42"
        );
        assert_eq!(vfio_container_path(Path::new("/dev/vfio")), "/dev/vfio/42");
        assert_eq!(
            vfio_container_path(Path::new("/dev/vfio/devices/vfio0")),
            "/dev/vfio/42"
        );
    }
}
