//! What a request asks: an OCI spec (create) or an OCI `LinuxResources` (update), turned into
//! plain domain types at this one boundary.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDevice, LinuxResources};

use crate::check::verdict::{PodRef, UpdateClass};
use crate::host::sysfs::VfioRef;
use crate::idset::{IdSet, IdSetError};

/// The largest OCI spec accepted.
pub const MAX_SPEC_BYTES: u64 = 16 * 1024 * 1024;
/// The largest `LinuxResources` accepted.
pub const MAX_RESOURCES_BYTES: u64 = 1024 * 1024;

/// CRI annotation: `sandbox` or `container`.
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
/// CRI annotation: the sandbox id.
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
/// CRI annotation: the container name.
pub const CRI_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
/// CRI annotation: the pod name.
pub const CRI_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
/// CRI annotation: the pod namespace.
pub const CRI_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
/// CRI annotation: the pod UID.
pub const CRI_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

/// Whether the checks read annotation `key` once the spec is parsed: kata-topo's own
/// (`kata-topo.io/…`; one it does not know is reported as ignored) and the
/// `io.katacontainers.config.…` overrides Kata honours. CRI's names for the pod and the
/// container are read as the spec is parsed, into its fields. A front end that keeps a
/// container's spec for the container's lifetime (the NRI plugin, for every pod of the node)
/// keeps only these.
pub fn annotation_is_read(key: &str) -> bool {
    key.starts_with("kata-topo.io/") || key.starts_with("io.katacontainers.config.")
}

/// Why a request could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// The input is larger than a request can be.
    #[error("{what} is larger than the {limit} bytes accepted")]
    TooLarge {
        /// What it is.
        what: &'static str,
        limit: u64,
    },
    /// The JSON is malformed or not the expected document.
    #[error("{what} is not valid: {reason}")]
    Json {
        /// What it is.
        what: &'static str,
        /// serde's words (line and column).
        reason: String,
    },
    /// A cpuset field does not parse.
    #[error("{field} {value:?} is invalid")]
    CpuList {
        /// `linux.resources.cpu.cpus` or `…mems`.
        field: &'static str,
        /// The value (shortened).
        value: String,
        /// Why.
        #[source]
        source: IdSetError,
    },
}

/// The resource fields kata-topo looks at. `None` means "not set" (an update leaves it as it
/// was).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Resources {
    /// `cpu.cpus`.
    pub cpus: Option<IdSet>,
    /// `cpu.mems`.
    pub mems: Option<IdSet>,
    /// `cpu.shares`.
    pub cpu_shares: Option<u64>,
    /// `cpu.quota`.
    pub cpu_quota: Option<i64>,
    /// `cpu.period`.
    pub cpu_period: Option<u64>,
    /// `memory.limit` in bytes; unlimited (`-1`, `0`) is `None`.
    pub memory_limit: Option<u64>,
}

impl Resources {
    /// From the OCI type.
    pub fn from_oci(res: &LinuxResources) -> Result<Self, RequestError> {
        let mut out = Self::default();
        if let Some(cpu) = res.cpu() {
            out.cpus = cpu_list("linux.resources.cpu.cpus", cpu.cpus().as_deref())?;
            out.mems = cpu_list("linux.resources.cpu.mems", cpu.mems().as_deref())?;
            out.cpu_shares = cpu.shares();
            out.cpu_quota = cpu.quota();
            out.cpu_period = cpu.period();
        }
        if let Some(mem) = res.memory() {
            out.memory_limit = mem
                .limit()
                .and_then(|l| u64::try_from(l).ok())
                .filter(|&l| l > 0);
        }
        Ok(out)
    }

    /// An update's `LinuxResources` JSON (what containerd puts in the `Update` Any).
    pub fn from_json(bytes: &[u8]) -> Result<Self, RequestError> {
        if bytes.len() as u64 > MAX_RESOURCES_BYTES {
            return Err(RequestError::TooLarge {
                what: "LinuxResources",
                limit: MAX_RESOURCES_BYTES,
            });
        }
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(RequestError::Json {
                what: "LinuxResources",
                reason: "expected a JSON object".to_string(),
            });
        }
        let res: LinuxResources =
            serde_json::from_slice(bytes).map_err(|e| RequestError::Json {
                what: "LinuxResources",
                reason: e.to_string(),
            })?;
        Self::from_oci(&res)
    }

    /// Reads [`Resources::from_json`] from a file.
    pub fn from_file(path: &Path) -> Result<Self, RequestError> {
        Self::from_json(&read_bounded(path, MAX_RESOURCES_BYTES, "LinuxResources")?)
    }

    /// These resources with an update's set fields laid over them.
    pub fn merged(&self, update: &Self) -> Self {
        Self {
            cpus: update.cpus.clone().or_else(|| self.cpus.clone()),
            mems: update.mems.clone().or_else(|| self.mems.clone()),
            cpu_shares: update.cpu_shares.or(self.cpu_shares),
            cpu_quota: update.cpu_quota.or(self.cpu_quota),
            cpu_period: update.cpu_period.or(self.cpu_period),
            memory_limit: update.memory_limit.or(self.memory_limit),
        }
    }

    /// What an update changes against the current resources: `resize` (quota, period, shares
    /// or memory), `cpuset` (cpus or mems only), `mixed`, or `noop`. Fields the update leaves
    /// unset do not count as changes.
    pub fn classify(&self, update: &Self) -> UpdateClass {
        fn changed<T: PartialEq>(new: &Option<T>, old: &Option<T>) -> bool {
            new.as_ref().is_some_and(|n| old.as_ref() != Some(n))
        }
        let resize = changed(&update.cpu_shares, &self.cpu_shares)
            || changed(&update.cpu_quota, &self.cpu_quota)
            || changed(&update.cpu_period, &self.cpu_period)
            || changed(&update.memory_limit, &self.memory_limit);
        let cpuset = changed(&update.cpus, &self.cpus) || changed(&update.mems, &self.mems);
        match (resize, cpuset) {
            (true, true) => UpdateClass::Mixed,
            (true, false) => UpdateClass::Resize,
            (false, true) => UpdateClass::Cpuset,
            (false, false) => UpdateClass::Noop,
        }
    }
}

fn cpu_list(field: &'static str, value: Option<&str>) -> Result<Option<IdSet>, RequestError> {
    match value {
        None => Ok(None),
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(v) => IdSet::parse(v)
            .map(Some)
            .map_err(|source| RequestError::CpuList {
                field,
                value: v.chars().take(64).collect(),
                source,
            }),
    }
}

/// Whether the spec is a pod's sandbox or one of its containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerKind {
    /// The sandbox (pause) container.
    Sandbox,
    /// An application container.
    Container,
}

/// A device path under `/dev/vfio/` that is not a valid VFIO name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadDevice {
    /// The path (shortened).
    pub path: String,
    /// Why.
    pub reason: String,
}

/// The parts of an OCI spec (`config.json`) the checks read, each as the OCI types read it.
/// The rest (the process, mounts, hooks) is not parsed: a field kata-topo does not read cannot
/// fail a check, and the binaries do not carry its parsers (the process's alone link a
/// regular expression engine).
#[derive(Debug, serde::Deserialize)]
struct SpecParts {
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
    #[serde(default)]
    linux: Option<LinuxParts>,
}

/// `linux` of [`SpecParts`].
#[derive(Debug, serde::Deserialize)]
struct LinuxParts {
    #[serde(default)]
    resources: Option<LinuxResources>,
    #[serde(default)]
    devices: Option<Vec<LinuxDevice>>,
}

/// An OCI spec reduced to what the checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSpec {
    /// All annotations.
    pub annotations: BTreeMap<String, String>,
    /// Sandbox or container.
    pub kind: ContainerKind,
    /// The sandbox id (CRI annotation).
    pub sandbox_id: Option<String>,
    /// The container name (CRI annotation).
    pub container_name: Option<String>,
    pub pod: PodRef,
    /// `linux.resources`.
    pub resources: Resources,
    /// VFIO devices from `linux.devices`, in spec order.
    pub vfio: Vec<VfioRef>,
    /// `/dev/vfio/…` paths that are not valid VFIO names.
    pub bad_devices: Vec<BadDevice>,
}

impl ContainerSpec {
    /// A request about a pod alone, with no container of it: no annotations, resources or
    /// devices (`kata-topo check --node-labels` without `--spec` checks the pod's node
    /// affinity so, through the same phases as a container).
    pub fn pod_only(pod: PodRef) -> Self {
        Self {
            annotations: BTreeMap::new(),
            kind: ContainerKind::Container,
            sandbox_id: None,
            container_name: None,
            pod,
            resources: Resources::default(),
            vfio: Vec::new(),
            bad_devices: Vec::new(),
        }
    }

    /// From the parts of an OCI spec the checks read.
    fn from_parts(spec: SpecParts) -> Result<Self, RequestError> {
        let annotations: BTreeMap<String, String> =
            spec.annotations.unwrap_or_default().into_iter().collect();
        let linux = spec.linux.as_ref();
        let resources = match linux.and_then(|l| l.resources.as_ref()) {
            Some(r) => Resources::from_oci(r)?,
            None => Resources::default(),
        };
        let mut vfio = Vec::new();
        let mut bad_devices = Vec::new();
        for dev in linux.and_then(|l| l.devices.as_ref()).into_iter().flatten() {
            let path = dev.path().to_string_lossy();
            match VfioRef::from_path(&path) {
                None => {}
                Some(Ok(r)) if vfio.contains(&r) => {}
                Some(Ok(r)) => vfio.push(r),
                Some(Err(e)) => bad_devices.push(BadDevice {
                    path: path.chars().take(128).collect(),
                    reason: e.to_string(),
                }),
            }
        }
        let get = |k: &str| annotations.get(k).cloned();
        let kind = match annotations.get(CRI_CONTAINER_TYPE).map(String::as_str) {
            Some("sandbox") => ContainerKind::Sandbox,
            _ => ContainerKind::Container,
        };
        Ok(Self {
            kind,
            sandbox_id: get(CRI_SANDBOX_ID),
            container_name: get(CRI_CONTAINER_NAME),
            pod: PodRef {
                name: get(CRI_SANDBOX_NAME),
                namespace: get(CRI_SANDBOX_NAMESPACE),
                uid: get(CRI_SANDBOX_UID),
            },
            annotations,
            resources,
            vfio,
            bad_devices,
        })
    }

    /// An OCI spec JSON (`config.json`).
    pub fn from_json(bytes: &[u8]) -> Result<Self, RequestError> {
        if bytes.len() as u64 > MAX_SPEC_BYTES {
            return Err(RequestError::TooLarge {
                what: "OCI spec",
                limit: MAX_SPEC_BYTES,
            });
        }
        // serde also accepts a struct as a JSON array; a spec is an object.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(RequestError::Json {
                what: "OCI spec",
                reason: "expected a JSON object".to_string(),
            });
        }
        let spec: SpecParts = serde_json::from_slice(bytes).map_err(|e| RequestError::Json {
            what: "OCI spec",
            reason: e.to_string(),
        })?;
        Self::from_parts(spec)
    }

    /// Reads [`ContainerSpec::from_json`] from a file (a bundle's `config.json`).
    pub fn from_file(path: &Path) -> Result<Self, RequestError> {
        Self::from_json(&read_bounded(path, MAX_SPEC_BYTES, "OCI spec")?)
    }
}

/// Reads a whole file, refusing more than `limit` bytes.
pub(crate) fn read_bounded(
    path: &Path,
    limit: u64,
    what: &'static str,
) -> Result<Vec<u8>, RequestError> {
    crate::files::read_bounded(path, limit).map_err(|source| {
        if source.kind() == std::io::ErrorKind::FileTooLarge {
            RequestError::TooLarge { what, limit }
        } else {
            RequestError::Read {
                path: path.to_path_buf(),
                source,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn res(json: &str) -> Resources {
        Resources::from_json(json.as_bytes()).expect("valid resources")
    }

    #[test]
    fn reads_resources() {
        let r = res(
            r#"{"cpu":{"shares":1024,"quota":200000,"period":100000,"cpus":"0-3","mems":"0"},"memory":{"limit":1073741824}}"#,
        );
        assert_eq!(
            r.cpus.as_ref().map(ToString::to_string).as_deref(),
            Some("0-3")
        );
        assert_eq!(
            r.mems.as_ref().map(ToString::to_string).as_deref(),
            Some("0")
        );
        assert_eq!(r.cpu_quota, Some(200_000));
        assert_eq!(r.memory_limit, Some(1 << 30));
        let unlimited = res(r#"{"memory":{"limit":-1},"cpu":{"cpus":""}}"#);
        assert_eq!(unlimited.memory_limit, None);
        assert_eq!(unlimited.cpus, None);
    }

    #[test]
    fn rejects_bad_resources_with_a_reason() {
        let err = Resources::from_json(br#"{"cpu":{"cpus":"3-1"}}"#).expect_err("reversed");
        assert!(
            err.to_string().contains("linux.resources.cpu.cpus"),
            "{err}"
        );
        let err = Resources::from_json(b"{not json").expect_err("malformed");
        assert!(
            err.to_string().contains("LinuxResources is not valid"),
            "{err}"
        );
        let err = Resources::from_json(br#"{"cpu":{"shares":"many"}}"#).expect_err("type");
        assert!(matches!(err, RequestError::Json { .. }));
        let huge = vec![b' '; (MAX_RESOURCES_BYTES + 1) as usize];
        assert!(matches!(
            Resources::from_json(&huge),
            Err(RequestError::TooLarge { .. })
        ));
    }

    #[test]
    fn classifies_updates() {
        let old = res(
            r#"{"cpu":{"shares":1024,"quota":100000,"period":100000,"cpus":"0-3","mems":"0"},"memory":{"limit":1073741824}}"#,
        );
        let cases = [
            (r#"{"cpu":{"quota":200000}}"#, UpdateClass::Resize),
            (r#"{"memory":{"limit":2147483648}}"#, UpdateClass::Resize),
            (r#"{"cpu":{"cpus":"4-7"}}"#, UpdateClass::Cpuset),
            (r#"{"cpu":{"mems":"1"}}"#, UpdateClass::Cpuset),
            (
                r#"{"cpu":{"cpus":"4-7","shares":2048}}"#,
                UpdateClass::Mixed,
            ),
            (
                r#"{"cpu":{"cpus":"0-3","quota":100000}}"#,
                UpdateClass::Noop,
            ),
            (r#"{}"#, UpdateClass::Noop),
        ];
        for (update, want) in cases {
            assert_eq!(old.classify(&res(update)), want, "{update}");
        }
        // A complete LinuxResources that repeats everything but the cpus is a cpuset push.
        let full = res(
            r#"{"cpu":{"shares":1024,"quota":100000,"period":100000,"cpus":"4-7","mems":"0"},"memory":{"limit":1073741824}}"#,
        );
        assert_eq!(old.classify(&full), UpdateClass::Cpuset);
        let merged = old.merged(&res(r#"{"cpu":{"cpus":"4-7"}}"#));
        assert_eq!(merged.cpus.map(|c| c.to_string()).as_deref(), Some("4-7"));
        assert_eq!(merged.cpu_quota, Some(100_000));
    }

    #[test]
    fn reads_a_cri_spec() {
        let spec = ContainerSpec::from_json(
            br#"{"ociVersion":"1.0.2","annotations":{
                "io.kubernetes.cri.container-type":"container",
                "io.kubernetes.cri.sandbox-id":"sb1","io.kubernetes.cri.container-name":"app",
                "io.kubernetes.cri.sandbox-name":"pod","io.kubernetes.cri.sandbox-namespace":"ns",
                "io.kubernetes.cri.sandbox-uid":"uid"},
              "linux":{"resources":{"cpu":{"cpus":"0-1"}},
                "devices":[{"path":"/dev/vfio/vfio","type":"c","major":10,"minor":196},
                           {"path":"/dev/vfio/12","type":"c","major":240,"minor":0},
                           {"path":"/dev/vfio/devices/vfio3","type":"c","major":239,"minor":3},
                           {"path":"/dev/vfio/../../etc/passwd","type":"c","major":1,"minor":1}]}}"#,
        )
        .expect("valid spec");
        assert_eq!(spec.kind, ContainerKind::Container);
        assert_eq!(spec.sandbox_id.as_deref(), Some("sb1"));
        assert_eq!(spec.container_name.as_deref(), Some("app"));
        assert_eq!(spec.pod.namespace.as_deref(), Some("ns"));
        assert_eq!(
            spec.vfio,
            vec![VfioRef::Group("12".into()), VfioRef::Device("vfio3".into())]
        );
        assert_eq!(spec.bad_devices.len(), 1);
        assert!(spec.bad_devices[0].reason.contains("not a VFIO group"));
    }

    #[test]
    fn rejects_malformed_specs() {
        let err = ContainerSpec::from_json(b"[]").expect_err("not an object");
        assert!(
            err.to_string().starts_with("OCI spec is not valid"),
            "{err}"
        );
        let err = ContainerSpec::from_json(
            br#"{"ociVersion":"1","linux":{"resources":{"cpu":{"mems":"x"}}}}"#,
        )
        .expect_err("bad mems");
        assert!(
            err.to_string().contains("linux.resources.cpu.mems"),
            "{err}"
        );
    }

    #[test]
    fn what_the_checks_do_not_read_cannot_fail_them() {
        // A process the OCI types would refuse (an execCPUAffinity that is no CPU list, a
        // user that is no object), mounts of the wrong type: none of it is read.
        let spec = ContainerSpec::from_json(
            br#"{"ociVersion":"1.0.2","process":{"user":7,"execCPUAffinity":{"initial":"x"}},
                "mounts":"none","annotations":{"kata-topo.io/policy":"strict"},
                "linux":{"resources":{"cpu":{"cpus":"0-1"}},
                         "devices":[{"path":"/dev/vfio/12","type":"c","major":240,"minor":0}]}}"#,
        )
        .expect("the parts read are valid");
        assert_eq!(
            spec.resources.cpus.map(|c| c.to_string()).as_deref(),
            Some("0-1")
        );
        assert_eq!(spec.vfio.len(), 1);
        assert_eq!(
            spec.annotations
                .get("kata-topo.io/policy")
                .map(String::as_str),
            Some("strict")
        );
        // The parts it reads are read as the OCI types read them.
        let err = ContainerSpec::from_json(br#"{"linux":{"devices":[{"path":"/dev/vfio/12"}]}}"#)
            .expect_err("a device without its type");
        assert!(err.to_string().contains("type"), "{err}");
        let err = ContainerSpec::from_json(br#"{"annotations":{"a":1}}"#)
            .expect_err("an annotation that is no string");
        assert!(err.to_string().contains("OCI spec is not valid"), "{err}");
    }

    /// Keys an OCI spec or a `LinuxResources` has, so generated JSON reaches deep.
    const KEYS: &[&str] = &[
        "ociVersion",
        "annotations",
        "linux",
        "resources",
        "devices",
        "cpu",
        "cpus",
        "mems",
        "memory",
        "limit",
        "shares",
        "quota",
        "period",
        "path",
        "type",
        "major",
        "minor",
        "process",
        "root",
    ];

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        use serde_json::Value;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            crate::testutil::hostile_text(20).prop_map(Value::from),
            prop::sample::select(vec![
                "0-3",
                "1",
                "",
                "3-1",
                "/dev/vfio/12",
                "c",
                "/dev/vfio/devices/vfio0"
            ])
            .prop_map(Value::from),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec(
                    (
                        prop_oneof![
                            3 => prop::sample::select(KEYS).prop_map(str::to_string),
                            1 => crate::testutil::hostile_text(10),
                        ],
                        inner,
                    ),
                    0..6,
                )
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A generated value placed where a decoder looks.
    fn placed(v: serde_json::Value, at: usize) -> serde_json::Value {
        use serde_json::json;
        match at {
            0 => v,
            1 => json!({"cpu": v}),
            2 => json!({"cpu": {"cpus": v}}),
            3 => json!({"memory": v}),
            4 => json!({"ociVersion": "1.0.2", "linux": {"resources": v}}),
            5 => json!({"ociVersion": "1.0.2", "linux": {"devices": v}}),
            6 => json!({"ociVersion": "1.0.2", "annotations": v}),
            _ => json!({"ociVersion": "1.0.2", "linux": v}),
        }
    }

    /// What a decoder's error must say: what it was reading.
    fn names_what(e: &RequestError, what: &str) -> bool {
        let text = e.to_string();
        text.starts_with(&format!("{what} is not valid: "))
            || text.starts_with("linux.resources.cpu.cpus ")
            || text.starts_with("linux.resources.cpu.mems ")
    }

    /// A cpu list text: a valid list or junk.
    fn list_text() -> impl Strategy<Value = String> {
        prop_oneof![
            prop::collection::btree_set(0u32..64, 0..6)
                .prop_map(|ids| { ids.into_iter().collect::<IdSet>().to_string() }),
            "[0-9,\\- ]{0,10}",
            crate::testutil::hostile_text(10),
        ]
    }

    /// A device path for `linux.devices`: a VFIO group or iommufd device, the container node,
    /// a path under /dev/vfio that is not a valid name, or another device.
    fn device_path() -> impl Strategy<Value = String> {
        prop_oneof![
            (0u32..20).prop_map(|g| format!("/dev/vfio/{g}")),
            (0u32..5).prop_map(|n| format!("/dev/vfio/devices/vfio{n}")),
            Just("/dev/vfio/vfio".to_string()),
            crate::testutil::hostile_text(12).prop_map(|t| format!("/dev/vfio/{t}")),
            crate::testutil::hostile_text(12).prop_map(|t| format!("/dev/vfio/devices/{t}")),
            Just("/dev/vfio/../../etc/passwd".to_string()),
            Just("/dev/nvidia0".to_string()),
        ]
    }

    proptest! {
        #[test]
        fn decoders_never_panic_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
            if let Err(e) = Resources::from_json(&bytes) {
                prop_assert!(names_what(&e, "LinuxResources"), "{}", e);
            }
            if let Err(e) = ContainerSpec::from_json(&bytes) {
                prop_assert!(names_what(&e, "OCI spec"), "{}", e);
            }
        }

        #[test]
        fn decoders_never_panic_on_json(v in json_value(), at in 0usize..8) {
            let bytes = placed(v, at).to_string().into_bytes();
            if let Err(e) = Resources::from_json(&bytes) {
                prop_assert!(names_what(&e, "LinuxResources"), "{}", e);
            }
            if let Err(e) = ContainerSpec::from_json(&bytes) {
                prop_assert!(names_what(&e, "OCI spec"), "{}", e);
            }
        }

        #[test]
        fn deep_nesting_is_an_error_not_a_stack_overflow(depth in 0usize..20_000, array in any::<bool>()) {
            let (open, close) = if array { ("[", "]") } else { ("{\"cpu\":", "}") };
            let text = format!("{}1{}", open.repeat(depth), close.repeat(depth));
            // Unknown keys are skipped however deep they go; what matters is an answer.
            let r = Resources::from_json(text.as_bytes());
            let s = ContainerSpec::from_json(text.as_bytes());
            if array && depth > 0 {
                prop_assert!(r.is_err() && s.is_err(), "an array is not an object");
            }
        }

        #[test]
        fn resources_decode_as_the_model_says(
            cpus in proptest::option::of(list_text()),
            mems in proptest::option::of(list_text()),
            shares in proptest::option::of(any::<u64>()),
            quota in proptest::option::of(any::<i64>()),
            period in proptest::option::of(any::<u64>()),
            limit in proptest::option::of(any::<i64>()),
        ) {
            let json = serde_json::json!({
                "cpu": {"cpus": cpus, "mems": mems, "shares": shares, "quota": quota, "period": period},
                "memory": {"limit": limit},
            });
            // A list that is absent or blank is not set; otherwise it must parse.
            let list = |v: &Option<String>| match v.as_deref().map(str::trim) {
                None | Some("") => Ok(None),
                Some(t) => IdSet::parse(t).map(Some),
            };
            let got = Resources::from_json(json.to_string().as_bytes());
            match (list(&cpus), list(&mems)) {
                (Ok(c), Ok(m)) => {
                    let r = got.expect("valid resources decode");
                    prop_assert_eq!(r.cpus, c);
                    prop_assert_eq!(r.mems, m);
                    prop_assert_eq!(r.cpu_shares, shares);
                    prop_assert_eq!(r.cpu_quota, quota);
                    prop_assert_eq!(r.cpu_period, period);
                    prop_assert_eq!(r.memory_limit, limit.filter(|&l| l > 0).map(|l| l as u64));
                }
                (Err(_), _) => {
                    let e = got.expect_err("bad cpus");
                    prop_assert!(e.to_string().starts_with("linux.resources.cpu.cpus "), "{}", e);
                }
                (Ok(_), Err(_)) => {
                    let e = got.expect_err("bad mems");
                    prop_assert!(e.to_string().starts_with("linux.resources.cpu.mems "), "{}", e);
                }
            }
        }

        #[test]
        fn specs_decode_as_the_model_says(
            paths in prop::collection::vec(device_path(), 0..8),
            annotations in prop::collection::btree_map(
                prop_oneof![
                    prop::sample::select(vec![CRI_SANDBOX_NAME, CRI_CONTAINER_NAME, CRI_CONTAINER_TYPE, CRI_SANDBOX_ID]).prop_map(str::to_string),
                    crate::testutil::hostile_text(20),
                ],
                crate::testutil::hostile_text(40),
                0..5,
            ),
        ) {
            let devices: Vec<_> = paths
                .iter()
                .map(|p| serde_json::json!({"path": p, "type": "c", "major": 1, "minor": 1}))
                .collect();
            let json = serde_json::json!({
                "ociVersion": "1.0.2", "annotations": annotations, "linux": {"devices": devices}
            });
            let spec = ContainerSpec::from_json(json.to_string().as_bytes()).expect("valid spec");
            let mut vfio: Vec<VfioRef> = Vec::new();
            let mut bad = 0;
            for p in &paths {
                match VfioRef::from_path(p) {
                    None => {}
                    Some(Ok(r)) if vfio.contains(&r) => {}
                    Some(Ok(r)) => vfio.push(r),
                    Some(Err(_)) => bad += 1,
                }
            }
            prop_assert_eq!(&spec.vfio, &vfio);
            prop_assert_eq!(spec.bad_devices.len(), bad);
            // Every accepted VFIO reference is a plain name: nothing that could leave sysfs.
            for r in &spec.vfio {
                let name = match r { VfioRef::Group(g) => g, VfioRef::Device(d) => d };
                prop_assert!(name.bytes().all(|b| b.is_ascii_alphanumeric()), "{:?}", r);
            }
            prop_assert_eq!(spec.pod.name.as_ref(), annotations.get(CRI_SANDBOX_NAME));
            prop_assert_eq!(spec.container_name.as_ref(), annotations.get(CRI_CONTAINER_NAME));
            prop_assert_eq!(spec.sandbox_id.as_ref(), annotations.get(CRI_SANDBOX_ID));
            let sandbox = annotations.get(CRI_CONTAINER_TYPE).map(String::as_str) == Some("sandbox");
            prop_assert_eq!(spec.kind == ContainerKind::Sandbox, sandbox);
            prop_assert_eq!(spec.annotations, annotations);
        }

        #[test]
        fn never_panics_on_arbitrary_json(s in "\\PC{0,200}") {
            let _ = Resources::from_json(s.as_bytes());
            let _ = ContainerSpec::from_json(s.as_bytes());
        }

        #[test]
        fn never_panics_on_arbitrary_cpu_fields(cpus in "\\PC{0,30}", mems in "[0-9,\\-]{0,12}", quota in any::<i64>(), limit in any::<i64>()) {
            let json = serde_json::json!({"cpu":{"cpus":cpus,"mems":mems,"quota":quota},"memory":{"limit":limit}});
            if let Ok(r) = Resources::from_json(json.to_string().as_bytes()) {
                prop_assert!(r.memory_limit.is_none_or(|l| l > 0));
            }
        }
    }
}
