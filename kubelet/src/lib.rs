//! The kubelet's view of a pod: what its Topology Manager admitted, as the kubelet's
//! PodResources API (`podresources/v1`) reports it.

#![forbid(unsafe_code)]

/// The PodResources API v1 messages (`v1.ListPodResourcesResponse`, `v1.PodResources`, ...),
/// generated at build time from the vendored `api.proto`.
#[allow(missing_docs, missing_debug_implementations, clippy::all)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/v1.rs"));
}

#[cfg(test)]
mod tests {
    use super::v1;
    use prost::Message;

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
