//! NRI's pod and container into what the core reads: the container's OCI spec (its
//! annotations, devices and resources, as JSON the core's own parser reads, with the same
//! bounds and errors as a bundle's `config.json`) and its `LinuxResources` JSON, the form the
//! wrapper gets in a task `Update`. The one boundary where NRI's types become the core's.

use std::collections::BTreeMap;

use kata_topo_core::input::spec::{
    annotation_is_read, RequestError, CRI_CONTAINER_NAME, CRI_CONTAINER_TYPE, CRI_SANDBOX_ID,
    CRI_SANDBOX_NAME, CRI_SANDBOX_NAMESPACE, CRI_SANDBOX_UID,
};
use kata_topo_core::ContainerSpec;
use kata_topo_proto::nri::pkg::api::v1alpha1 as nri;
use serde_json::{json, Map, Value};

/// The pod annotations that reach the checks: kata-topo's own. NRI gives the pod's
/// annotations directly; the wrapper gets them through the runtime handler's
/// `pod_annotations = ["kata-topo.io/*"]`.
const POD_ANNOTATION_PREFIX: &str = "kata-topo.io/";

/// The CRI annotations a pod's sandbox carries, from NRI's pod.
fn pod_annotations(pod: &nri::PodSandbox) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with(POD_ANNOTATION_PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (key, value) in [
        (CRI_SANDBOX_ID, &pod.id),
        (CRI_SANDBOX_NAME, &pod.name),
        (CRI_SANDBOX_NAMESPACE, &pod.namespace),
        (CRI_SANDBOX_UID, &pod.uid),
    ] {
        if !value.is_empty() {
            out.insert(key.to_string(), value.clone());
        }
    }
    out
}

/// The pod's sandbox as the wrapper sees its `Create`: the pod's identity and kata-topo's
/// annotations, no resources or devices of its own (NRI does not describe the pause
/// container).
pub fn sandbox_spec(pod: &nri::PodSandbox) -> ContainerSpec {
    let mut annotations = pod_annotations(pod);
    annotations.insert(CRI_CONTAINER_TYPE.to_string(), "sandbox".to_string());
    let spec = json!({ "ociVersion": "1.0.2", "annotations": annotations });
    // Built from strings only: the parser cannot fail on it, but a failure is still no panic.
    kept(
        ContainerSpec::from_json(spec.to_string().as_bytes())
            .unwrap_or_else(|_| ContainerSpec::pod_only(Default::default())),
    )
}

/// The spec as it is kept: CRI's names, read into its fields, leave its annotations (made
/// anew: an emptied map would keep its first node).
fn kept(mut spec: ContainerSpec) -> ContainerSpec {
    spec.annotations = std::mem::take(&mut spec.annotations)
        .into_iter()
        .filter(|(k, _)| annotation_is_read(k))
        .collect();
    spec
}

/// A container of `pod` as its OCI spec says: its annotations (with the pod's kata-topo
/// annotations and CRI identity where the container's own do not say), its devices and
/// resources.
pub fn container_spec(
    pod: &nri::PodSandbox,
    container: &nri::Container,
) -> Result<ContainerSpec, RequestError> {
    let mut annotations = pod_annotations(pod);
    annotations.insert(CRI_CONTAINER_TYPE.to_string(), "container".to_string());
    if !container.name.is_empty() {
        annotations.insert(CRI_CONTAINER_NAME.to_string(), container.name.clone());
    }
    // Only those the checks read: the spec is kept as long as the container runs, and the
    // runtime's and the kubelet's own (the image, the restart count, the termination
    // message's path) are most of a container's. CRI's names are the pod's, above.
    for (k, v) in container
        .annotations
        .iter()
        .filter(|(k, _)| annotation_is_read(k))
    {
        annotations.insert(k.clone(), v.clone());
    }
    let linux = container.linux.as_ref();
    let devices: Vec<Value> = linux
        .map(|l| l.devices.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            json!({
                "path": d.path,
                "type": if d.r#type.is_empty() { "c" } else { d.r#type.as_str() },
                "major": d.major,
                "minor": d.minor,
            })
        })
        .collect();
    let resources = linux
        .and_then(|l| l.resources.as_ref())
        .map(resources_value)
        .unwrap_or_else(|| Value::Object(Map::new()));
    let spec = json!({
        "ociVersion": "1.0.2",
        "annotations": annotations,
        "linux": { "devices": devices, "resources": resources },
    });
    ContainerSpec::from_json(spec.to_string().as_bytes()).map(kept)
}

/// NRI's `LinuxResources` as an OCI `LinuxResources` JSON object (what containerd puts in a
/// task `Update`): the fields the checks read.
pub fn resources_json(res: &nri::LinuxResources) -> Vec<u8> {
    resources_value(res).to_string().into_bytes()
}

fn resources_value(res: &nri::LinuxResources) -> Value {
    let mut out = Map::new();
    if let Some(cpu) = &res.cpu {
        let mut c = Map::new();
        if let Some(v) = &cpu.shares {
            c.insert("shares".into(), json!(v.value));
        }
        if let Some(v) = &cpu.quota {
            c.insert("quota".into(), json!(v.value));
        }
        if let Some(v) = &cpu.period {
            c.insert("period".into(), json!(v.value));
        }
        if !cpu.cpus.is_empty() {
            c.insert("cpus".into(), json!(cpu.cpus));
        }
        if !cpu.mems.is_empty() {
            c.insert("mems".into(), json!(cpu.mems));
        }
        out.insert("cpu".into(), Value::Object(c));
    }
    if let Some(limit) = res.memory.as_ref().and_then(|m| m.limit.as_ref()) {
        out.insert("memory".into(), json!({ "limit": limit.value }));
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_core::input::spec::ContainerKind;
    use kata_topo_core::Resources;

    fn pod() -> nri::PodSandbox {
        nri::PodSandbox {
            id: "sb1".into(),
            name: "web".into(),
            uid: "u-1".into(),
            namespace: "prod".into(),
            annotations: [
                (
                    "kata-topo.io/policy".to_string(),
                    "single-numa-node".to_string(),
                ),
                ("other.io/x".to_string(), "y".to_string()),
            ]
            .into(),
            runtime_handler: "kata".into(),
            ..Default::default()
        }
    }

    fn cpu(cpus: &str, quota: i64) -> nri::LinuxResources {
        nri::LinuxResources {
            cpu: Some(nri::LinuxCpu {
                cpus: cpus.into(),
                mems: "0".into(),
                quota: Some(nri::OptionalInt64 { value: quota }),
                period: Some(nri::OptionalUInt64 { value: 100_000 }),
                shares: Some(nri::OptionalUInt64 { value: 1024 }),
                ..Default::default()
            }),
            memory: Some(nri::LinuxMemory {
                limit: Some(nri::OptionalInt64 { value: 1 << 30 }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn a_container_reads_as_its_oci_spec_would() {
        let c = nri::Container {
            id: "c1".into(),
            pod_sandbox_id: "sb1".into(),
            name: "app".into(),
            annotations: [
                ("io.kubernetes.container.restartCount", "0"),
                ("io.katacontainers.config.hypervisor.default_vcpus", "4"),
                ("kata-topo.io/numa-nodes", "1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            linux: Some(nri::LinuxContainer {
                resources: Some(cpu("0-1", 200_000)),
                devices: vec![nri::LinuxDevice {
                    path: "/dev/vfio/12".into(),
                    r#type: "c".into(),
                    major: 240,
                    minor: 0,
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let spec = container_spec(&pod(), &c).expect("spec");
        assert_eq!(spec.kind, ContainerKind::Container);
        assert_eq!(spec.sandbox_id.as_deref(), Some("sb1"));
        assert_eq!(spec.container_name.as_deref(), Some("app"));
        assert_eq!(spec.pod.namespace.as_deref(), Some("prod"));
        assert_eq!(
            spec.annotations
                .get("kata-topo.io/policy")
                .map(String::as_str),
            Some("single-numa-node")
        );
        assert!(!spec.annotations.contains_key("other.io/x"));
        // The container's own: those the checks read, and no other.
        assert_eq!(
            spec.annotations
                .get("kata-topo.io/numa-nodes")
                .map(String::as_str),
            Some("1")
        );
        assert!(spec
            .annotations
            .contains_key("io.katacontainers.config.hypervisor.default_vcpus"));
        assert!(!spec
            .annotations
            .contains_key("io.kubernetes.container.restartCount"));
        assert_eq!(spec.vfio.len(), 1);
        assert_eq!(spec.resources.cpu_quota, Some(200_000));
        assert_eq!(spec.resources.memory_limit, Some(1 << 30));
        assert_eq!(
            spec.resources.cpus.map(|c| c.to_string()).as_deref(),
            Some("0-1")
        );
    }

    #[test]
    fn resources_read_as_an_update_would() {
        let r = Resources::from_json(&resources_json(&cpu("2-3", 50_000))).expect("json");
        assert_eq!(r.cpu_quota, Some(50_000));
        assert_eq!(r.cpus.map(|c| c.to_string()).as_deref(), Some("2-3"));
        assert_eq!(
            Resources::from_json(&resources_json(&nri::LinuxResources::default())).expect("empty"),
            Resources::default()
        );
    }

    #[test]
    fn a_bad_cpuset_is_an_error_naming_the_field() {
        let c = nri::Container {
            name: "app".into(),
            linux: Some(nri::LinuxContainer {
                resources: Some(cpu("0-99999999999", 1)),
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = container_spec(&pod(), &c).expect_err("bad cpuset");
        assert!(e.to_string().contains("cpus"), "{e}");
    }

    #[test]
    fn the_sandbox_names_the_pod() {
        let s = sandbox_spec(&pod());
        assert_eq!(s.kind, ContainerKind::Sandbox);
        assert_eq!(s.pod.name.as_deref(), Some("web"));
        assert_eq!(s.sandbox_id.as_deref(), Some("sb1"));
        // Read into the fields, CRI's names are not kept twice.
        assert_eq!(
            s.annotations.keys().collect::<Vec<_>>(),
            ["kata-topo.io/policy"]
        );
    }
}
