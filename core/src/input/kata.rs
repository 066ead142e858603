//! What Kata's configuration says about placement: vCPU pinning, static sandbox sizing, guest
//! NUMA, VFIO plugging — read from the same file Kata reads, with its `config.d/` drop-ins in
//! order, and the per-pod `io.katacontainers.config.*` annotations Kata honours.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use crate::idset::IdSet;

/// The largest configuration file read.
const MAX_BYTES: u64 = 4 * 1024 * 1024;

/// Why the Kata configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum KataError {
    /// A file could not be read.
    #[error("cannot read Kata configuration {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A file is not TOML, or a key has the wrong type; names the file and key.
    #[error("invalid Kata configuration {path}: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key.
        message: String,
    },
}

/// The Kata settings kata-topo relies on. Defaults are Kata's own.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KataConfig {
    /// `[runtime] enable_vcpus_pinning`.
    pub enable_vcpus_pinning: bool,
    /// `[runtime] static_sandbox_resource_mgmt`.
    pub static_sandbox_resource_mgmt: bool,
    /// `[runtime] sandbox_cgroup_only`.
    pub sandbox_cgroup_only: bool,
    /// `[runtime] vfio_mode`.
    pub vfio_mode: String,
    /// `[hypervisor.qemu] default_vcpus`.
    pub default_vcpus: f64,
    /// `[hypervisor.qemu] default_maxvcpus` (0: the host's CPUs).
    pub default_maxvcpus: u32,
    /// `[hypervisor.qemu] enable_numa`.
    pub enable_numa: bool,
    /// `[hypervisor.qemu] numa_mapping`: host nodes per guest node.
    pub numa_mapping: Vec<IdSet>,
    /// `[hypervisor.qemu] hot_plug_vfio`.
    pub hot_plug_vfio: String,
    /// `[hypervisor.qemu] cold_plug_vfio`.
    pub cold_plug_vfio: String,
    /// `[hypervisor.qemu] enable_annotations`: which hypervisor annotations a pod may set.
    pub enable_annotations: Vec<String>,
    /// The hypervisor's executable: `path` of `[hypervisor.qemu]`, else of
    /// `[hypervisor.clh]` or `[hypervisor.firecracker]` — what a VMM of this runtime runs.
    pub hypervisor_path: Option<PathBuf>,
    /// The files read, in order.
    pub files: Vec<PathBuf>,
}

impl Default for KataConfig {
    fn default() -> Self {
        Self {
            enable_vcpus_pinning: false,
            static_sandbox_resource_mgmt: false,
            sandbox_cgroup_only: false,
            vfio_mode: "guest-kernel".into(),
            default_vcpus: 1.0,
            default_maxvcpus: 0,
            enable_numa: false,
            numa_mapping: Vec::new(),
            hot_plug_vfio: "no-port".into(),
            cold_plug_vfio: "no-port".into(),
            enable_annotations: Vec::new(),
            hypervisor_path: None,
            files: Vec::new(),
        }
    }
}

fn read(path: &Path) -> Result<toml::Table, KataError> {
    let text =
        crate::files::read_text_bounded(path, MAX_BYTES).map_err(|source| KataError::Read {
            path: path.to_path_buf(),
            source,
        })?;
    text.parse::<toml::Table>().map_err(|e| KataError::Invalid {
        path: path.to_path_buf(),
        message: e
            .to_string()
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect::<Vec<_>>()
            .join(" "),
    })
}

/// Merges `over` into `base` key by key, tables recursively (Kata's drop-in semantics).
fn merge(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Where each key we read lives: (table path, key).
const KEYS: &[(&str, &str)] = &[
    ("runtime", "enable_vcpus_pinning"),
    ("runtime", "static_sandbox_resource_mgmt"),
    ("runtime", "sandbox_cgroup_only"),
    ("runtime", "vfio_mode"),
    ("hypervisor.qemu", "default_vcpus"),
    ("hypervisor.qemu", "default_maxvcpus"),
    ("hypervisor.qemu", "enable_numa"),
    ("hypervisor.qemu", "numa_mapping"),
    ("hypervisor.qemu", "hot_plug_vfio"),
    ("hypervisor.qemu", "cold_plug_vfio"),
    ("hypervisor.qemu", "enable_annotations"),
    ("hypervisor.qemu", "path"),
    ("hypervisor.clh", "path"),
    ("hypervisor.firecracker", "path"),
];

/// The hypervisor tables whose `path` names the VMM's executable, in the order looked at.
const HYPERVISORS: &[&str] = &[
    "hypervisor.qemu",
    "hypervisor.clh",
    "hypervisor.firecracker",
];

fn lookup<'a>(table: &'a toml::Table, path: &str, key: &str) -> Option<&'a toml::Value> {
    let mut t = table;
    for part in path.split('.') {
        t = t.get(part)?.as_table()?;
    }
    t.get(key)
}

impl KataConfig {
    /// Reads a Kata configuration file and the `config.d/*.toml` drop-ins beside it, in name
    /// order, each overriding what came before. A drop-in that is not TOML, or a key of the
    /// wrong type, is an error naming the file and the key.
    pub fn load(path: &Path) -> Result<Self, KataError> {
        let mut files = vec![path.to_path_buf()];
        let mut merged = read(path)?;
        let mut origin: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (t, k) in KEYS {
            if lookup(&merged, t, k).is_some() {
                origin.insert(format!("{t}.{k}"), path.to_path_buf());
            }
        }
        let dropins = path.parent().map(|p| p.join("config.d"));
        if let Some(dir) = dropins.filter(|d| d.is_dir()) {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|source| KataError::Read {
                    path: dir.clone(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
                .collect();
            entries.sort();
            for file in entries {
                let table = read(&file)?;
                for (t, k) in KEYS {
                    if lookup(&table, t, k).is_some() {
                        origin.insert(format!("{t}.{k}"), file.clone());
                    }
                }
                merge(&mut merged, table);
                files.push(file);
            }
        }
        let mut c = Self::from_table(&merged, &origin)?;
        c.files = files;
        Ok(c)
    }

    fn from_table(t: &toml::Table, origin: &BTreeMap<String, PathBuf>) -> Result<Self, KataError> {
        let mut c = Self::default();
        let bad = |t: &str, k: &str, want: &str| KataError::Invalid {
            path: origin.get(&format!("{t}.{k}")).cloned().unwrap_or_default(),
            message: format!("[{t}] {k} must be {want}"),
        };
        let get_bool = |tbl: &str, k: &str, into: &mut bool| -> Result<(), KataError> {
            if let Some(v) = lookup(t, tbl, k) {
                *into = v.as_bool().ok_or_else(|| bad(tbl, k, "true or false"))?;
            }
            Ok(())
        };
        get_bool(
            "runtime",
            "enable_vcpus_pinning",
            &mut c.enable_vcpus_pinning,
        )?;
        get_bool(
            "runtime",
            "static_sandbox_resource_mgmt",
            &mut c.static_sandbox_resource_mgmt,
        )?;
        get_bool("runtime", "sandbox_cgroup_only", &mut c.sandbox_cgroup_only)?;
        get_bool("hypervisor.qemu", "enable_numa", &mut c.enable_numa)?;
        let get_str = |tbl: &str, k: &str, into: &mut String| -> Result<(), KataError> {
            if let Some(v) = lookup(t, tbl, k) {
                *into = v
                    .as_str()
                    .ok_or_else(|| bad(tbl, k, "a string"))?
                    .to_string();
            }
            Ok(())
        };
        get_str("runtime", "vfio_mode", &mut c.vfio_mode)?;
        get_str("hypervisor.qemu", "hot_plug_vfio", &mut c.hot_plug_vfio)?;
        get_str("hypervisor.qemu", "cold_plug_vfio", &mut c.cold_plug_vfio)?;
        if let Some(v) = lookup(t, "hypervisor.qemu", "default_vcpus") {
            c.default_vcpus = v
                .as_float()
                .or_else(|| v.as_integer().map(|i| i as f64))
                .filter(|f| *f >= 0.0)
                .ok_or_else(|| bad("hypervisor.qemu", "default_vcpus", "a non-negative number"))?;
        }
        if let Some(v) = lookup(t, "hypervisor.qemu", "default_maxvcpus") {
            c.default_maxvcpus = v
                .as_integer()
                .and_then(|i| u32::try_from(i).ok())
                .ok_or_else(|| {
                    bad(
                        "hypervisor.qemu",
                        "default_maxvcpus",
                        "a non-negative integer",
                    )
                })?;
        }
        if let Some(v) = lookup(t, "hypervisor.qemu", "numa_mapping") {
            let arr = v.as_array().ok_or_else(|| {
                bad(
                    "hypervisor.qemu",
                    "numa_mapping",
                    "an array of node lists like [\"0\", \"1\"]",
                )
            })?;
            c.numa_mapping = arr
                .iter()
                .map(|e| e.as_str().and_then(|s| IdSet::parse(s).ok()))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| {
                    bad(
                        "hypervisor.qemu",
                        "numa_mapping",
                        "an array of node lists like [\"0\", \"1\"]",
                    )
                })?;
        }
        for tbl in HYPERVISORS {
            if let Some(v) = lookup(t, tbl, "path") {
                let path = v
                    .as_str()
                    .filter(|p| p.starts_with('/'))
                    .ok_or_else(|| bad(tbl, "path", "an absolute path"))?;
                c.hypervisor_path = Some(PathBuf::from(path));
                break;
            }
        }
        if let Some(v) = lookup(t, "hypervisor.qemu", "enable_annotations") {
            c.enable_annotations = v
                .as_array()
                .and_then(|a| a.iter().map(|e| e.as_str().map(str::to_string)).collect())
                .ok_or_else(|| {
                    bad(
                        "hypervisor.qemu",
                        "enable_annotations",
                        "an array of strings",
                    )
                })?;
        }
        Ok(c)
    }

    /// Applies the `io.katacontainers.config.*` annotations Kata would honour for this pod:
    /// hypervisor ones only when `enable_annotations` allows them (Kata rejects the sandbox
    /// otherwise), runtime ones always. Values that do not parse are left out, as Kata refuses
    /// such a sandbox before kata-topo would matter.
    pub(crate) fn with_annotations(&self, annotations: &BTreeMap<String, String>) -> Self {
        let mut c = self.clone();
        const HV: &str = "io.katacontainers.config.hypervisor.";
        const RT: &str = "io.katacontainers.config.runtime.";
        for (key, value) in annotations {
            if let Some(name) = key.strip_prefix(HV) {
                if !self.allows(name) {
                    continue;
                }
                match name {
                    "default_vcpus" => {
                        if let Ok(v) = value.parse::<f64>() {
                            c.default_vcpus = v.max(0.0);
                        }
                    }
                    "default_maxvcpus" => {
                        if let Ok(v) = value.parse() {
                            c.default_maxvcpus = v;
                        }
                    }
                    "enable_numa" => {
                        if let Ok(v) = value.parse() {
                            c.enable_numa = v;
                        }
                    }
                    "hot_plug_vfio" => c.hot_plug_vfio = value.clone(),
                    "cold_plug_vfio" => c.cold_plug_vfio = value.clone(),
                    _ => {}
                }
            } else if let Some(name) = key.strip_prefix(RT) {
                match name {
                    "enable_vcpus_pinning" => {
                        if let Ok(v) = value.parse() {
                            c.enable_vcpus_pinning = v;
                        }
                    }
                    "sandbox_cgroup_only" => {
                        if let Ok(v) = value.parse() {
                            c.sandbox_cgroup_only = v;
                        }
                    }
                    "vfio_mode" => c.vfio_mode = value.clone(),
                    _ => {}
                }
            }
        }
        c
    }

    /// Whether `enable_annotations` lets a pod set a hypervisor annotation (Kata matches each
    /// entry as a regular expression anchored to the whole name; kata-topo supports the forms
    /// the shipped configurations use: a literal name, `.*`, or a `prefix.*`).
    pub fn allows(&self, name: &str) -> bool {
        self.enable_annotations.iter().any(|pattern| {
            let p = pattern.trim_start_matches('^').trim_end_matches('$');
            match p.strip_suffix(".*") {
                Some(prefix) => name.starts_with(prefix),
                None => p == name,
            }
        })
    }

    /// The host nodes mapped into the guest (Kata NUMA mode), if any mapping is configured.
    pub fn mapped_host_nodes(&self) -> Option<IdSet> {
        (self.enable_numa && !self.numa_mapping.is_empty()).then(|| {
            self.numa_mapping
                .iter()
                .fold(IdSet::new(), |acc, n| acc.union(n))
        })
    }

    /// The vCPU count Kata gives a sandbox whose containers' CPU limits add up to `cpus`
    /// (quota/period): `default_vcpus` plus the limits, rounded up, capped by
    /// `default_maxvcpus` when set.
    pub fn vcpus_for(&self, cpus: f64) -> u32 {
        let n = (self.default_vcpus + cpus.max(0.0)).ceil().max(1.0) as u32;
        if self.default_maxvcpus > 0 {
            n.min(self.default_maxvcpus)
        } else {
            n
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_ins_override_in_name_order_and_errors_name_file_and_key() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("configuration.toml");
        std::fs::write(
            &base,
            "[hypervisor.qemu]\ndefault_vcpus = 1\nenable_numa = false\n[runtime]\nenable_vcpus_pinning = false\n",
        )
        .expect("write");
        let d = dir.path().join("config.d");
        std::fs::create_dir(&d).expect("mkdir");
        std::fs::write(
            d.join("20-numa.toml"),
            "[hypervisor.qemu]\nenable_numa = true\nnuma_mapping = [\"0\", \"1\"]\n",
        )
        .expect("write");
        std::fs::write(
            d.join("10-pin.toml"),
            "[runtime]\nenable_vcpus_pinning = true\n[hypervisor.qemu]\nenable_numa = false\n",
        )
        .expect("write");
        std::fs::write(d.join("README"), "not toml, not read").expect("write");
        let c = KataConfig::load(&base).expect("load");
        assert!(c.enable_vcpus_pinning);
        assert!(c.enable_numa, "20-numa.toml comes after 10-pin.toml");
        assert_eq!(
            c.mapped_host_nodes().map(|n| n.to_string()).as_deref(),
            Some("0-1")
        );
        assert_eq!(c.files.len(), 3);
        assert!(c.files[1].ends_with("10-pin.toml"));

        std::fs::write(
            d.join("30-bad.toml"),
            "[runtime]\nenable_vcpus_pinning = \"yes\"\n",
        )
        .expect("write");
        let e = KataConfig::load(&base).expect_err("bad type");
        let m = e.to_string();
        assert!(
            m.contains("30-bad.toml") && m.contains("enable_vcpus_pinning"),
            "{m}"
        );
        std::fs::write(d.join("30-bad.toml"), "[runtime\n").expect("write");
        let m = KataConfig::load(&base).expect_err("bad toml").to_string();
        assert!(m.contains("30-bad.toml"), "{m}");
    }

    #[test]
    fn the_hypervisor_path_is_read_and_must_be_absolute() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("configuration.toml");
        for (text, want) in [
            (
                "[hypervisor.qemu]\npath = \"/opt/kata/bin/qemu-system-x86_64\"\n",
                Some("/opt/kata/bin/qemu-system-x86_64"),
            ),
            (
                "[hypervisor.clh]\npath = \"/opt/kata/bin/cloud-hypervisor\"\n",
                Some("/opt/kata/bin/cloud-hypervisor"),
            ),
            ("[hypervisor.dragonball]\ndefault_vcpus = 1\n", None),
        ] {
            std::fs::write(&base, text).expect("write");
            let c = KataConfig::load(&base).expect("load");
            assert_eq!(c.hypervisor_path.as_deref(), want.map(Path::new), "{text}");
        }
        std::fs::write(&base, "[hypervisor.qemu]\npath = \"qemu\"\n").expect("write");
        let m = KataConfig::load(&base).expect_err("relative").to_string();
        assert!(m.contains("path") && m.contains("absolute"), "{m}");
    }

    #[test]
    fn annotations_apply_only_when_allowed() {
        let mut c = KataConfig {
            enable_annotations: vec!["default_vcpus".into(), "enable_numa".into()],
            ..KataConfig::default()
        };
        let ann: BTreeMap<String, String> = [
            ("io.katacontainers.config.hypervisor.default_vcpus", "4"),
            ("io.katacontainers.config.hypervisor.default_maxvcpus", "2"),
            (
                "io.katacontainers.config.runtime.enable_vcpus_pinning",
                "true",
            ),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let applied = c.with_annotations(&ann);
        assert_eq!(applied.default_vcpus, 4.0);
        assert_eq!(applied.default_maxvcpus, 0, "not in enable_annotations");
        assert!(applied.enable_vcpus_pinning);
        c.enable_annotations = vec![".*".into()];
        assert_eq!(c.with_annotations(&ann).default_maxvcpus, 2);
    }

    #[test]
    fn vcpu_sizing() {
        let c = KataConfig {
            default_vcpus: 1.0,
            ..KataConfig::default()
        };
        assert_eq!(c.vcpus_for(2.0), 3);
        assert_eq!(c.vcpus_for(1.5), 3);
        assert_eq!(c.vcpus_for(0.0), 1);
        let capped = KataConfig {
            default_maxvcpus: 2,
            ..c
        };
        assert_eq!(capped.vcpus_for(8.0), 2);
    }
}
