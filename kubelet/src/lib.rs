//! The kubelet's view of a pod: what its Topology Manager admitted, as the kubelet's
//! PodResources API (`podresources/v1`) reports it.
//!
//! The transport is a small gRPC client of its own ([`PodResourcesClient`]): HTTP/2 through
//! the `h2` crate on a current-thread Tokio runtime that lives for one call, not tonic. The
//! wrapper's per-pod daemon runs on plain threads with blocking I/O and links no async
//! runtime for its own work; tonic would bring hyper, tower and their layers for a single
//! unary call to a local socket. `h2` gives the HTTP/2 framing, HPACK and flow control that a
//! hand-written client would have to get right against the kubelet's Go server; one call is a
//! connect, a handshake, a request and its answer, all under one deadline.
//!
//! Measured (release profile, stripped, against a grpc-go server built from the kubelet's
//! own generated `podresources/v1` code): a binary with this client is 420 KiB larger than
//! one with only the messages (722 KiB against 300 KiB); a process's RSS grows by about
//! 330 KiB once it has made calls (the runtime's and h2's code paged in; nothing stays
//! allocated between calls). One `Get` takes 0.11 ms at the median, 0.8 ms at p95 and under
//! 2 ms at worst over 200 calls. tonic sits on this same `h2` and adds hyper and tower on top.
//! Linked into the wrapper (release profile, stripped), the client and its checks make
//! `containerd-shim-kata-topo-v2` 417 KiB larger (3.20 MiB to 3.61 MiB). The daemon's own RSS
//! with the client was not measured here: the 330 KiB above is the most a process that has
//! asked pays for it; one that never asks (no socket, `intent_source = "annotations"`) runs
//! none of its code.

#![forbid(unsafe_code)]

mod client;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
pub mod grpc;

use std::path::Path;

use kata_topo_core::input::kubelet::{
    kubelet_id, kubelet_ids, ContainerAdmission, DeviceAdmission, KubeletSettings, KubeletView,
    MemoryAdmission, PodAdmission,
};
use kata_topo_core::IdSet;

pub use client::{PodResourcesClient, DEFAULT_SOCKET, MAX_CONTAINERS, MAX_GET_BYTES};
pub use grpc::MAX_MESSAGE_BYTES;

/// What the kubelet says about `pod` under the node's `[topology_guard]`: `None` when the
/// kubelet is not the intent source (`intent_source = "annotations"`, or `auto` without its
/// socket) or the request names no pod (a container not created through the CRI); else its
/// answer, or why it gave none, within `kubelet_timeout_ms`. The wrapper and the hook both
/// come here.
pub fn intent_for(
    config: &kata_topo_core::config::Config,
    pod: &kata_topo_core::check::verdict::PodRef,
) -> Option<KubeletView> {
    use kata_topo_core::input::kubelet::IntentSource;
    let client = client_for(config);
    match config.intent_source {
        IntentSource::Annotations => return None,
        IntentSource::Auto if !client.socket_exists() => return None,
        IntentSource::Auto | IntentSource::Kubelet => {}
    }
    let (Some(namespace), Some(name)) = (&pod.namespace, &pod.name) else {
        return None;
    };
    Some(ask(
        &client,
        &config.kubelet_config,
        config.kubelet_config_dir.as_deref(),
        namespace,
        name,
    ))
}

/// The client `[topology_guard]` configures.
pub fn client_for(config: &kata_topo_core::config::Config) -> PodResourcesClient {
    PodResourcesClient::new(
        &config.kubelet_pod_resources_socket,
        std::time::Duration::from_millis(config.kubelet_timeout_ms),
    )
}

/// Asks the kubelet what it admitted for pod `namespace/name` (PodResources `Get`; the API
/// carries no uid, so namespace and name identify the pod) and reads the node's kubelet
/// settings from `kubelet_config` and the drop-ins of `kubelet_config_dir`. Never waits
/// longer than the client's deadline for the kubelet; anything that goes wrong is a
/// [`KubeletView::Unavailable`] saying why — settings that cannot be known included: the
/// policy is then not guessed.
pub fn ask(
    client: &PodResourcesClient,
    kubelet_config: &Path,
    kubelet_config_dir: Option<&Path>,
    namespace: &str,
    name: &str,
) -> KubeletView {
    let unavailable = |reason: String| KubeletView::Unavailable { reason };
    match client.get(namespace, name).and_then(|p| admission(&p)) {
        Ok(pod) if pod.namespace == namespace && pod.name == name => {
            match KubeletSettings::read_merged(kubelet_config, kubelet_config_dir) {
                Ok(settings) => KubeletView::Admitted { pod, settings },
                Err(e) => unavailable(format!(
                    "the kubelet's Topology Manager policy cannot be known, and is not \
                     guessed: {}",
                    kata_topo_core::text::error_chain(&e)
                )),
            }
        }
        Ok(pod) => unavailable(format!(
            "the kubelet answered for pod {}/{} when asked for {namespace}/{name}",
            pod.namespace, pod.name
        )),
        Err(e) => unavailable(e.to_string()),
    }
}

/// The kubelet's `PodResources` as kata-topo's domain type; ids no CPU or node can have are
/// garbage.
pub fn admission(pod: &v1::PodResources) -> Result<PodAdmission, KubeletError> {
    let garbage = |what: &str, e: String| KubeletError::Garbage(format!("{what}: {e}"));
    let topology = |t: &Option<v1::TopologyInfo>| -> Result<IdSet, String> {
        t.iter()
            .flat_map(|t| &t.nodes)
            .map(|n| kubelet_id(n.id))
            .collect()
    };
    let containers = pod
        .containers
        .iter()
        .map(|c| {
            Ok(ContainerAdmission {
                name: c.name.clone(),
                cpu_ids: kubelet_ids(c.cpu_ids.iter().copied())
                    .map_err(|e| garbage("cpu_ids", e))?,
                memory: c
                    .memory
                    .iter()
                    .map(|m| {
                        Ok(MemoryAdmission {
                            memory_type: m.memory_type.clone(),
                            size: m.size,
                            numa_nodes: topology(&m.topology)
                                .map_err(|e| garbage("memory topology", e))?,
                        })
                    })
                    .collect::<Result<_, KubeletError>>()?,
                devices: c
                    .devices
                    .iter()
                    .map(|d| {
                        Ok(DeviceAdmission {
                            resource_name: d.resource_name.clone(),
                            device_ids: d.device_ids.clone(),
                            numa_nodes: topology(&d.topology)
                                .map_err(|e| garbage("device topology", e))?,
                        })
                    })
                    .collect::<Result<_, KubeletError>>()?,
            })
        })
        .collect::<Result<_, KubeletError>>()?;
    Ok(PodAdmission {
        namespace: pod.namespace.clone(),
        name: pod.name.clone(),
        containers,
    })
}

/// The PodResources API v1 messages (`v1.ListPodResourcesResponse`, `v1.PodResources`, ...),
/// generated at build time from the vendored `api.proto`.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}

/// Why the kubelet gave no answer to use. Each says why in words an operator acts on; the
/// check then falls back to the pod's annotations and baseline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubeletError {
    /// No socket at the path: no kubelet runs here, or it has not started yet.
    #[error("the kubelet's PodResources socket does not exist")]
    Missing,
    /// The socket or the process on it is not trusted.
    #[error("the kubelet's PodResources socket is not trusted: {0}")]
    Untrusted(String),
    /// No answer within the deadline.
    #[error("the kubelet did not answer within {0} ms")]
    Timeout(u64),
    /// The connection could not be made or was closed.
    #[error("the kubelet's PodResources socket refused or closed the connection: {0}")]
    Closed(String),
    /// The peer does not speak HTTP/2 as gRPC does.
    #[error("the kubelet's PodResources socket does not speak gRPC: {0}")]
    Protocol(String),
    /// The kubelet answered with an error (`NotFound` for a pod it does not know,
    /// `ResourceExhausted` when its rate limit is hit).
    #[error("the kubelet answered with gRPC status {code}: {message}")]
    Status {
        /// The gRPC status code.
        code: u32,
        /// Its message, shortened.
        message: String,
    },
    /// The answer is not a PodResources message.
    #[error("the kubelet's answer is not usable: {0}")]
    Garbage(String),
    /// The answer is larger than its method takes (bytes): [`MAX_GET_BYTES`] for one pod,
    /// [`MAX_MESSAGE_BYTES`] for the node's list.
    #[error("the kubelet's answer is larger than {0} bytes")]
    TooLarge(usize),
}

impl KubeletError {
    /// A short stable word for the reason (log fields, metrics, tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Untrusted(_) => "untrusted",
            Self::Timeout(_) => "timeout",
            Self::Closed(_) => "closed",
            Self::Protocol(_) => "protocol",
            Self::Status { .. } => "status",
            Self::Garbage(_) | Self::TooLarge(_) => "garbage",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use prost::Message;

    proptest! {
        /// Whatever bytes the socket gives, decoding and converting them never panics.
        #[test]
        fn decoding_any_answer_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            if let Ok(r) = v1::GetPodResourcesResponse::decode(&bytes[..]) {
                if let Some(p) = r.pod_resources {
                    let _ = admission(&p);
                }
            }
            if let Ok(l) = v1::ListPodResourcesResponse::decode(&bytes[..]) {
                for p in &l.pod_resources {
                    let _ = admission(p);
                }
            }
        }

        /// Any answer with ids a host can have converts, and keeps every id.
        #[test]
        fn valid_ids_convert(cpus in proptest::collection::vec(0i64..4096, 0..16), node in 0i64..64) {
            let pod = v1::PodResources {
                name: "p".into(),
                namespace: "ns".into(),
                containers: vec![v1::ContainerResources {
                    name: "c".into(),
                    cpu_ids: cpus.clone(),
                    devices: vec![v1::ContainerDevices {
                        resource_name: "r".into(),
                        device_ids: vec!["0000:81:00.0".into()],
                        topology: Some(v1::TopologyInfo { nodes: vec![v1::NumaNode { id: node }] }),
                    }],
                    ..Default::default()
                }],
            };
            let encoded = pod.encode_to_vec();
            let decoded = v1::PodResources::decode(&encoded[..]).expect("decodes");
            let a = admission(&decoded).expect("converts");
            let want: Vec<u32> = {
                let mut v: Vec<u32> = cpus.iter().map(|&c| c as u32).collect();
                v.sort_unstable();
                v.dedup();
                v
            };
            prop_assert_eq!(a.containers[0].cpu_ids.to_vec(), want);
            prop_assert_eq!(a.containers[0].device_nodes().to_vec(), vec![node as u32]);
        }
    }

    #[test]
    fn ids_no_host_has_are_garbage() {
        let pod = v1::PodResources {
            containers: vec![v1::ContainerResources {
                cpu_ids: vec![-1],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(admission(&pod).map_err(|e| e.kind()), Err("garbage"));
    }

    #[test]
    fn the_messages_round_trip_with_the_kubelet_field_numbers() {
        // `v1.GetPodResourcesRequest{pod_name: "p", pod_namespace: "ns"}` as the kubelet's Go
        // code encodes it: field 1 "p", field 2 "ns".
        let wire = [0x0a, 0x01, b'p', 0x12, 0x02, b'n', b's'];
        let req = v1::GetPodResourcesRequest::decode(&wire[..]).expect("decodes");
        assert_eq!(
            (req.pod_name.as_str(), req.pod_namespace.as_str()),
            ("p", "ns")
        );
        assert_eq!(req.encode_to_vec(), wire);
        // A container with `cpu_ids: [1]` (field 3, packed) and a device with NUMA node 1.
        let c = v1::ContainerResources {
            name: "app".into(),
            cpu_ids: vec![1],
            devices: vec![v1::ContainerDevices {
                resource_name: "kata-topo.io/vfio".into(),
                device_ids: vec!["0000:81:00.0".into()],
                topology: Some(v1::TopologyInfo {
                    nodes: vec![v1::NumaNode { id: 1 }],
                }),
            }],
            ..Default::default()
        };
        let bytes = c.encode_to_vec();
        assert!(
            bytes.windows(3).any(|w| w == [0x1a, 0x01, 0x01]),
            "{bytes:x?}"
        );
        assert_eq!(
            v1::ContainerResources::decode(&bytes[..]).expect("decodes"),
            c
        );
    }
}
