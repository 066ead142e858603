//! What the kubelet's Topology Manager admitted for a pod, container by container: the
//! PodResources API's answer (`List` or `Get`) as domain types, from the gRPC client's
//! messages or a recorded answer's JSON.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::idset::{IdSet, MAX_ID};

/// Turns an id the kubelet reported (an `int64`) into a set member, refusing what no CPU or
/// NUMA node can be.
pub fn kubelet_id(id: i64) -> Result<u32, String> {
    u32::try_from(id)
        .ok()
        .filter(|&i| i <= MAX_ID)
        .ok_or_else(|| format!("{id} is not a CPU or NUMA node id"))
}

/// Several ids as a set.
pub fn kubelet_ids(ids: impl IntoIterator<Item = i64>) -> Result<IdSet, String> {
    ids.into_iter().map(kubelet_id).collect()
}

/// What the kubelet admitted for one pod: the PodResources API's `PodResources`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodAdmission {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub name: String,
    /// Its containers (restartable init containers too, as the kubelet lists them).
    pub containers: Vec<ContainerAdmission>,
}

/// What the kubelet admitted for one container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAdmission {
    /// The container's name.
    pub name: String,
    /// The exclusive CPUs the CPU manager assigned; empty for a container of the shared pool.
    pub cpu_ids: IdSet,
    /// The memory the memory manager assigned, per type, with its NUMA nodes.
    pub memory: Vec<MemoryAdmission>,
    /// The devices device plugins allocated, with the topology they were admitted with.
    pub devices: Vec<DeviceAdmission>,
}

/// Memory of one type the memory manager assigned.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryAdmission {
    /// `memory`, `hugepages-2Mi`, ...
    pub memory_type: String,
    /// Bytes.
    pub size: u64,
    pub numa_nodes: IdSet,
}

/// Devices of one resource a device plugin allocated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceAdmission {
    /// The extended resource (`kata-topo.io/vfio`).
    pub resource_name: String,
    /// The plugin's device ids (kata-topo's plugin: PCI bus ids).
    pub device_ids: Vec<String>,
    /// The NUMA nodes of its topology hint; empty when the plugin gave none.
    pub numa_nodes: IdSet,
}

impl ContainerAdmission {
    /// The NUMA nodes of the memory the memory manager assigned.
    pub fn memory_nodes(&self) -> IdSet {
        self.memory
            .iter()
            .fold(IdSet::new(), |acc, m| acc.union(&m.numa_nodes))
    }

    /// The NUMA nodes of its devices' topology hints.
    pub fn device_nodes(&self) -> IdSet {
        self.devices
            .iter()
            .fold(IdSet::new(), |acc, d| acc.union(&d.numa_nodes))
    }
}

/// The largest recorded answer read.
const MAX_RECORDED_BYTES: u64 = 4 * 1024 * 1024;

impl PodAdmission {
    /// The pods of a recorded PodResources answer in JSON: a `List` answer
    /// (`{"pod_resources": [...]}`), a `Get` answer (`{"pod_resources": {...}}`) or one
    /// `PodResources`. Field names as in the `.proto` or in protobuf's JSON mapping
    /// (`podResources`, `cpuIds`, `deviceIds`, `resourceName`, `memoryType`), 64-bit numbers
    /// as JSON numbers or strings, as `grpcurl` prints them.
    pub fn from_json(text: &str) -> Result<Vec<Self>, String> {
        if text.len() as u64 > MAX_RECORDED_BYTES {
            return Err("the answer is larger than 4 MiB".into());
        }
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        match field(&value, "pod_resources", "podResources") {
            Some(Value::Array(pods)) => pods.iter().map(Self::from_value).collect(),
            Some(pod @ Value::Object(_)) => Ok(vec![Self::from_value(pod)?]),
            Some(_) => Err("pod_resources is neither a list nor a pod".into()),
            None => Ok(vec![Self::from_value(&value)?]),
        }
    }

    fn from_value(pod: &Value) -> Result<Self, String> {
        if !pod.is_object() {
            return Err("a pod is not a JSON object".into());
        }
        let containers = list(pod, "containers", "containers")?
            .iter()
            .map(|c| {
                let name = string(c, "name", "name")?;
                let cpu_ids = list(c, "cpu_ids", "cpuIds")?
                    .iter()
                    .map(|v| kubelet_id(number(v)?))
                    .collect::<Result<IdSet, String>>()
                    .map_err(|e| format!("container {name}: cpu_ids: {e}"))?;
                let memory = list(c, "memory", "memory")?
                    .iter()
                    .map(|m| {
                        Ok(MemoryAdmission {
                            memory_type: string(m, "memory_type", "memoryType")?,
                            size: match field(m, "size", "size") {
                                None => 0,
                                Some(v) => u64::try_from(number(v)?)
                                    .map_err(|_| "a memory size is negative".to_string())?,
                            },
                            numa_nodes: topology(m)?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                let devices = list(c, "devices", "devices")?
                    .iter()
                    .map(|d| {
                        Ok(DeviceAdmission {
                            resource_name: string(d, "resource_name", "resourceName")?,
                            device_ids: list(d, "device_ids", "deviceIds")?
                                .iter()
                                .map(|id| {
                                    id.as_str()
                                        .map(str::to_string)
                                        .ok_or_else(|| "a device id is not a string".to_string())
                                })
                                .collect::<Result<_, String>>()?,
                            numa_nodes: topology(d)?,
                        })
                    })
                    .collect::<Result<Vec<_>, String>>()?;
                Ok(ContainerAdmission {
                    name,
                    cpu_ids,
                    memory,
                    devices,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Self {
            namespace: string(pod, "namespace", "namespace")?,
            name: string(pod, "name", "name")?,
            containers,
        })
    }

    /// The container named `name`.
    pub fn container(&self, name: &str) -> Option<&ContainerAdmission> {
        self.containers.iter().find(|c| c.name == name)
    }
}

fn field<'v>(v: &'v Value, proto: &str, json: &str) -> Option<&'v Value> {
    v.get(proto)
        .or_else(|| v.get(json))
        .filter(|v| !v.is_null())
}

fn list<'v>(v: &'v Value, proto: &str, json: &str) -> Result<&'v [Value], String> {
    match field(v, proto, json) {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(format!("{proto} is not a list")),
    }
}

fn string(v: &Value, proto: &str, json: &str) -> Result<String, String> {
    match field(v, proto, json) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.chars().take(253).collect()),
        Some(_) => Err(format!("{proto} is not a string")),
    }
}

fn number(v: &Value) -> Result<i64, String> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("{v} is not an integer"))
}

fn topology(v: &Value) -> Result<IdSet, String> {
    let Some(t) = field(v, "topology", "topology") else {
        return Ok(IdSet::new());
    };
    list(t, "nodes", "nodes")?
        .iter()
        .map(|n| match field(n, "ID", "id") {
            Some(id) => kubelet_id(number(id)?),
            None => Ok(0),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::input::kubelet::KubeletSettings;

    #[test]
    fn ids_the_kubelet_reports_are_bounded() {
        assert_eq!(kubelet_ids([1, 3]).expect("ids").to_string(), "1,3");
        assert!(kubelet_id(-1).is_err());
        assert!(kubelet_id(i64::from(MAX_ID) + 1).is_err());
    }

    /// `List` as grpcurl prints it (protobuf's JSON mapping: 64-bit numbers as strings) for a
    /// Guaranteed container with CPU 1, memory and a VFIO device on node 1, and a container of
    /// the shared pool.
    const LIST_JSON: &str = r#"{"podResources": [{"name": "guaranteed", "namespace": "default",
      "containers": [
        {"name": "app", "cpuIds": ["1"],
         "memory": [{"memoryType": "memory", "size": "1073741824", "topology": {"nodes": [{"ID": "1"}]}}],
         "devices": [{"resourceName": "kata-topo.io/vfio", "deviceIds": ["0000:81:00.0"],
                      "topology": {"nodes": [{"ID": "1"}]}}]},
        {"name": "sidecar"}
      ]}]}"#;

    #[test]
    fn reads_a_recorded_answer_in_either_json_form() {
        let pods = PodAdmission::from_json(LIST_JSON).expect("valid");
        assert_eq!(pods.len(), 1);
        let app = pods[0].container("app").expect("app");
        assert_eq!(app.cpu_ids.to_string(), "1");
        assert_eq!(app.memory_nodes().to_string(), "1");
        assert_eq!(app.device_nodes().to_string(), "1");
        assert_eq!(app.devices[0].device_ids, ["0000:81:00.0"]);
        assert_eq!(app.memory[0].size, 1 << 30);
        let sidecar = pods[0].container("sidecar").expect("sidecar");
        assert!(sidecar.cpu_ids.is_empty() && sidecar.devices.is_empty());
        // The same as `Get` with the .proto's names and plain numbers.
        let get = r#"{"pod_resources": {"name": "guaranteed", "namespace": "default",
          "containers": [{"name": "app", "cpu_ids": [1], "memory": [{"memory_type": "memory",
          "size": 1073741824, "topology": {"nodes": [{"ID": 1}]}}], "devices": [{"resource_name":
          "kata-topo.io/vfio", "device_ids": ["0000:81:00.0"], "topology": {"nodes": [{"ID": 1}]}}]},
          {"name": "sidecar"}]}}"#;
        assert_eq!(PodAdmission::from_json(get).expect("valid"), pods);
    }

    #[test]
    fn a_malformed_answer_is_an_error() {
        for bad in [
            "",
            "[]",
            r#"{"pod_resources": 3}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": [-1]}]}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": ["x"]}]}"#,
            r#"{"containers": [{"name": "a", "cpu_ids": [99999999]}]}"#,
            r#"{"containers": [{"name": 3}]}"#,
            r#"{"containers": [{"memory": [{"size": -5}]}]}"#,
            r#"{"containers": [{"devices": [{"device_ids": [1]}]}]}"#,
        ] {
            assert!(PodAdmission::from_json(bad).is_err(), "{bad}");
        }
    }

    proptest::proptest! {
        #[test]
        fn reading_any_json_never_panics(text in "\\PC{0,200}") {
            let _ = PodAdmission::from_json(&text);
            let _ = KubeletSettings::parse(&text);
        }
    }
}
