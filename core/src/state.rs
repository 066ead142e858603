//! What the wrapper keeps on disk for one pod, under `state_dir/<namespace>/<group>/` (0700,
//! files 0600, written atomically): the sandbox's and each container's baseline (kept across a
//! wrapper restart, removed when the sandbox goes), each task's bundle and current resources,
//! and each task's latest verdict.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::check::intent::Baseline;
use crate::check::verdict::Verdict;
use crate::input::spec::Resources;
use crate::process::ProcessId;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// What the wrapper remembers of a task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRecord {
    /// Its bundle (where `config.json` is).
    pub bundle: PathBuf,
    /// The CRI container name, when it has one.
    pub container_name: Option<String>,
    /// Whether it is the pod's sandbox.
    pub sandbox: bool,
    /// The resources in force after the last update the delegate accepted.
    pub resources: Option<Resources>,
    /// The pid the delegate's `Create` reported (Kata: the VMM).
    pub pid: Option<u32>,
}

/// The file of a pod's label baseline ([`crate::input::affinity::LabelBaseline`]).
const LABEL_BASELINE_FILE: &str = "node-labels.json";

/// The file of the node labels seen changed since the pod's label baseline ([`LabelsSeen`]).
const LABELS_SEEN_FILE: &str = "node-labels-seen.json";

/// The most label changes a pod's [`LabelsSeen`] keeps.
const MAX_LABELS_SEEN: usize = 256;

/// The node's labels the wrapper saw differ from the pod's label baseline, each with its
/// value then and now and when the wrapper first saw that value: what `kata-topo diagnose`
/// answers "since when" with. Kept in `node-labels-seen.json` beside the label baseline.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelsSeen {
    /// By label key.
    pub changes: BTreeMap<String, LabelSeen>,
}

/// One label seen changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelSeen {
    /// Its value in the label baseline (`None`: absent then).
    pub from: Option<String>,
    /// Its value when seen (`None`: removed).
    pub to: Option<String>,
    /// When the wrapper first saw it so, in seconds since the epoch.
    pub first_seen: u64,
}

impl LabelsSeen {
    /// Takes one read of the node's labels (`now`) against the baseline's (`then`) at `at`
    /// (seconds since the epoch): a label that differs and was not seen with this value is
    /// recorded as first seen now, one back to its baseline value is forgotten. Answers
    /// whether anything changed (to be written).
    pub fn observe(
        &mut self,
        then: &BTreeMap<String, String>,
        now: &BTreeMap<String, String>,
        at: u64,
    ) -> bool {
        let before = self.changes.clone();
        self.changes.retain(|k, _| then.get(k) != now.get(k));
        for key in then.keys().chain(now.keys()) {
            let (from, to) = (then.get(key), now.get(key));
            if from == to {
                continue;
            }
            let seen = self.changes.get(key).is_some_and(|c| c.to.as_ref() == to);
            let room = self.changes.contains_key(key) || self.changes.len() < MAX_LABELS_SEEN;
            if !seen && room {
                self.changes.insert(
                    key.clone(),
                    LabelSeen {
                        from: from.cloned(),
                        to: to.cloned(),
                        first_seen: at,
                    },
                );
            }
        }
        self.changes != before
    }
}

/// The file of a pod's [`DaemonRecord`].
const DAEMON_FILE: &str = "daemon.json";

/// Who serves a pod: the wrapper daemon and the delegate shim it forwards to. The daemon
/// writes it; `start` reads it to reuse the daemon, `delete` to tell a crashed wrapper from
/// one that exited because its delegate did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DaemonRecord {
    /// The wrapper daemon.
    pub wrapper: ProcessId,
    pub delegate_address: String,
    /// The delegate shim's process, once the daemon asked it (`Connect`).
    pub delegate: Option<ProcessId>,
    /// The configuration file in force (`None`: the built-in defaults).
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// Where it came from: `ConfigPath`, `KATA_TOPO_CONFIG`, `kata-default-path` or
    /// `built-in-defaults` ([`crate::config::ConfigSource`]).
    #[serde(default)]
    pub config_source: String,
    /// Whether the node-affinity check runs for the pod and against which API server, or why
    /// it is off (`off: no kubeconfig at …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_affinity: Option<String>,
    /// Whether the pod's findings are written as Kubernetes Events on it, or why not
    /// (`off: no kubeconfig at …`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_events: Option<String>,
}

/// Whose latest verdict a file under `verdicts/` keeps. A task has two: its last request's,
/// and what the VM view found once the delegate had applied it; neither replaces the other.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum VerdictOf {
    /// A task's last request (create, recreate, update): `verdicts/<task>.json`.
    Request(String),
    /// What the VM view observed of a task after the delegate applied its last request:
    /// `verdicts/<task>@vm.json`.
    Vm(String),
    /// A check of the pod that belongs to no task it could name (it failed before it could
    /// read one): `verdicts/@pod.json`.
    Pod,
}

impl VerdictOf {
    /// The file's name. `@` is never part of a [`safe_name`], so the kinds never collide.
    pub fn file_name(&self) -> String {
        match self {
            Self::Request(task) => format!("{}.json", safe_name(task)),
            Self::Vm(task) => format!("{}@vm.json", safe_name(task)),
            Self::Pod => "@pod.json".to_string(),
        }
    }
}

/// One pod's state directory.
#[derive(Debug, Clone)]
pub struct GroupState {
    dir: PathBuf,
}

/// A file-name-safe form of an id or name: kept when it is plain, hashed otherwise.
pub fn safe_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if plain {
        name.to_string()
    } else {
        format!("x-{:016x}", crate::digest::fnv1a(name.as_bytes()))
    }
}

fn mkdir_private(dir: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

/// The largest state file read back (a verdict with its findings is a few KiB).
const MAX_STATE_FILE_BYTES: u64 = 4 * 1024 * 1024;

/// Reads a file this module wrote: bounded, a regular file, never through a symbolic link.
fn read_json<T: DeserializeOwned>(path: &Path) -> io::Result<Option<T>> {
    match crate::files::read_bounded_nofollow(path, MAX_STATE_FILE_BYTES) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{}: {e}", path.display()),
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    }
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    // No fsync: the state lives under /run (tmpfs) and need not outlive the host; the rename
    // alone keeps a reader from ever seeing a half-written file.
    crate::files::write_atomic(path, &bytes, 0o600)
}

impl GroupState {
    /// The state of one pod, created if missing. `state_dir` must be trusted as the topology
    /// cache's directory is ([`crate::files::Dir::open_private`]: no symbolic link on its
    /// path, owned by this user, writable by nobody else); otherwise nothing is read or
    /// written there and the error says why ([`crate::files::is_untrusted`] tells it from
    /// a directory that could not be made).
    pub fn open(state_dir: &Path, namespace: &str, group: &str) -> io::Result<Self> {
        crate::files::Dir::open_private(state_dir, Some(0o700))?;
        let dir = state_dir.join(safe_name(namespace)).join(safe_name(group));
        for sub in ["containers", "tasks", "verdicts"] {
            mkdir_private(&dir.join(sub))?;
        }
        Ok(Self { dir })
    }

    /// The state of one pod at its place, whether it exists or not; nothing is created.
    pub fn at(state_dir: &Path, namespace: &str, group: &str) -> Self {
        Self {
            dir: state_dir.join(safe_name(namespace)).join(safe_name(group)),
        }
    }

    /// The state of one pod if it exists in a trusted `state_dir` (as [`GroupState::open`]
    /// checks it); nothing is created.
    pub fn existing(state_dir: &Path, namespace: &str, group: &str) -> Option<Self> {
        crate::files::Dir::open_private(state_dir, None).ok()?;
        let s = Self::at(state_dir, namespace, group);
        s.dir.is_dir().then_some(s)
    }

    /// Who serves the pod.
    pub fn daemon(&self) -> io::Result<Option<DaemonRecord>> {
        read_json(&self.dir.join(DAEMON_FILE))
    }

    /// Records who serves the pod.
    pub fn save_daemon(&self, d: &DaemonRecord) -> io::Result<()> {
        write_json(&self.dir.join(DAEMON_FILE), d)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sandbox's baseline.
    pub fn sandbox_baseline(&self) -> io::Result<Option<Baseline>> {
        read_json(&self.dir.join("sandbox.json"))
    }

    /// Records the sandbox's baseline.
    pub fn save_sandbox_baseline(&self, b: &Baseline) -> io::Result<()> {
        write_json(&self.dir.join("sandbox.json"), b)
    }

    /// The pod's label baseline: its node's labels at its first create, and its placement.
    pub fn label_baseline(&self) -> io::Result<Option<crate::input::affinity::LabelBaseline>> {
        read_json(&self.dir.join(LABEL_BASELINE_FILE))
    }

    /// Records the pod's label baseline.
    pub fn save_label_baseline(&self, b: &crate::input::affinity::LabelBaseline) -> io::Result<()> {
        write_json(&self.dir.join(LABEL_BASELINE_FILE), b)
    }

    /// The node labels seen changed since the label baseline.
    pub fn labels_seen(&self) -> io::Result<Option<LabelsSeen>> {
        read_json(&self.dir.join(LABELS_SEEN_FILE))
    }

    /// Records the node labels seen changed.
    pub fn save_labels_seen(&self, seen: &LabelsSeen) -> io::Result<()> {
        write_json(&self.dir.join(LABELS_SEEN_FILE), seen)
    }

    fn container_path(&self, name: &str) -> PathBuf {
        self.dir
            .join("containers")
            .join(format!("{}.json", safe_name(name)))
    }

    /// A container's baseline, by CRI container name.
    pub fn container_baseline(&self, name: &str) -> io::Result<Option<Baseline>> {
        read_json(&self.container_path(name))
    }

    /// Records a container's baseline.
    pub fn save_container_baseline(&self, name: &str, b: &Baseline) -> io::Result<()> {
        write_json(&self.container_path(name), b)
    }

    fn task_path(&self, id: &str) -> PathBuf {
        self.dir
            .join("tasks")
            .join(format!("{}.json", safe_name(id)))
    }

    /// A task's record.
    pub fn task(&self, id: &str) -> io::Result<Option<TaskRecord>> {
        read_json(&self.task_path(id))
    }

    /// Records a task.
    pub fn save_task(&self, id: &str, t: &TaskRecord) -> io::Result<()> {
        write_json(&self.task_path(id), t)
    }

    fn verdict_path(&self, of: &VerdictOf) -> PathBuf {
        self.dir.join("verdicts").join(of.file_name())
    }

    /// Forgets a task (its container's baseline stays for a recreate).
    pub fn remove_task(&self, id: &str) -> io::Result<()> {
        for path in [
            self.task_path(id),
            self.verdict_path(&VerdictOf::Request(id.to_string())),
            self.verdict_path(&VerdictOf::Vm(id.to_string())),
        ] {
            match fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Keeps a task's latest verdict (for `kata-topo status`).
    pub fn save_verdict(&self, task_id: &str, v: &Verdict) -> io::Result<()> {
        self.save_verdict_of(&VerdictOf::Request(task_id.to_string()), v)
    }

    /// Keeps the latest verdict of one kind (for `kata-topo status`).
    pub fn save_verdict_of(&self, of: &VerdictOf, v: &Verdict) -> io::Result<()> {
        write_json(&self.verdict_path(of), v)
    }

    /// Removes the pod's whole state (the sandbox is gone).
    pub fn remove_all(&self) -> io::Result<()> {
        match fs::remove_dir_all(&self.dir) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Drop the namespace directory too once it is empty.
        if let Some(parent) = self.dir.parent() {
            let _ = fs::remove_dir(parent);
        }
        Ok(())
    }
}

/// Everything kept for one pod, as `kata-topo status` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct PodState {
    /// containerd namespace (`hook` for the OCI hook's fallback store).
    pub namespace: String,
    /// The pod group (sandbox id).
    pub sandbox_id: String,
    /// The sandbox's baseline.
    pub sandbox: Option<Baseline>,
    /// The wrapper daemon serving the pod and its configuration (none for the hook's store).
    pub daemon: Option<DaemonRecord>,
    /// Container baselines by name.
    pub containers: Vec<(String, Baseline)>,
    /// Tasks by id.
    pub tasks: Vec<(String, TaskRecord)>,
    /// Latest verdict per task.
    pub verdicts: Vec<(String, Verdict)>,
    /// Files that could not be read.
    pub unreadable: Vec<String>,
}

fn read_dir_json<T: DeserializeOwned>(
    dir: &Path,
    unreadable: &mut Vec<String>,
) -> Vec<(String, T)> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    let mut paths: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let Some(stem) = name.strip_suffix(".json").filter(|s| !s.starts_with('.')) else {
            continue;
        };
        match read_json::<T>(&path) {
            Ok(Some(v)) => out.push((stem.to_string(), v)),
            Ok(None) => {}
            Err(e) => unreadable.push(e.to_string()),
        }
    }
    out
}

/// The pod whose state is in `dir` (`state_dir/<namespace>/<sandbox>/`); `None` when there is
/// no such directory.
pub fn read_pod(dir: &Path) -> io::Result<Option<PodState>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    let name = |p: Option<&Path>| {
        p.and_then(Path::file_name)
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let mut unreadable = Vec::new();
    let sandbox = match read_json(&dir.join("sandbox.json")) {
        Ok(b) => b,
        Err(e) => {
            unreadable.push(e.to_string());
            None
        }
    };
    let daemon = match read_json(&dir.join(DAEMON_FILE)) {
        Ok(d) => d,
        Err(e) => {
            unreadable.push(e.to_string());
            None
        }
    };
    Ok(Some(PodState {
        namespace: name(dir.parent()),
        sandbox_id: name(Some(dir)),
        sandbox,
        daemon,
        containers: read_dir_json(&dir.join("containers"), &mut unreadable),
        tasks: read_dir_json(&dir.join("tasks"), &mut unreadable),
        verdicts: read_dir_json(&dir.join("verdicts"), &mut unreadable),
        unreadable,
    }))
}

/// The pods of `namespace` under a trusted `state_dir` (as [`GroupState::open`] checks it),
/// by their directories' names ([`safe_name`] of each sandbox id), each with how long ago its
/// directory last changed. None when the directory is not there or not trusted.
pub fn groups(state_dir: &Path, namespace: &str) -> Vec<(String, std::time::Duration)> {
    if crate::files::Dir::open_private(state_dir, None).is_err() {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(state_dir.join(safe_name(namespace))) else {
        return Vec::new();
    };
    let now = std::time::SystemTime::now();
    entries
        .flatten()
        .filter_map(|e| {
            // Not followed: a link is no pod's directory.
            let meta = e.path().symlink_metadata().ok()?;
            let name = e.file_name().into_string().ok()?;
            let age = meta
                .modified()
                .ok()
                .and_then(|m| now.duration_since(m).ok())
                .unwrap_or_default();
            meta.is_dir().then_some((name, age))
        })
        .collect()
}

/// Every pod under a state directory (`state_dir/<namespace>/<sandbox>/`).
pub fn list(state_dir: &Path) -> io::Result<Vec<PodState>> {
    let mut pods = Vec::new();
    let namespaces = match fs::read_dir(state_dir) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(pods),
        Err(e) => return Err(e),
    };
    let mut ns_dirs: Vec<PathBuf> = namespaces
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    ns_dirs.sort();
    for ns in ns_dirs {
        let mut groups: Vec<PathBuf> = fs::read_dir(&ns)?
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.is_dir())
            .collect();
        groups.sort();
        for g in groups {
            pods.extend(read_pod(&g)?);
        }
    }
    Ok(pods)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn a_label_change_keeps_when_it_was_first_seen() {
        let labels = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let then = labels(&[("nic", "mlx5"), ("zone", "a")]);
        let mut seen = LabelsSeen::default();
        assert!(
            !seen.observe(&then, &then, 100),
            "unchanged: nothing to keep"
        );
        let moved = labels(&[("nic", "e810"), ("zone", "a"), ("new", "x")]);
        assert!(seen.observe(&then, &moved, 200));
        assert!(
            !seen.observe(&then, &moved, 300),
            "seen before: kept as first seen"
        );
        assert_eq!(seen.changes["nic"].first_seen, 200);
        assert_eq!(seen.changes["nic"].from.as_deref(), Some("mlx5"));
        assert_eq!(seen.changes["new"].from, None);
        // Moved again: a new first sighting; one back to its baseline value is forgotten.
        let again = labels(&[("nic", "cx7"), ("zone", "a"), ("new", "x")]);
        assert!(seen.observe(&then, &again, 400));
        assert_eq!(seen.changes["nic"].first_seen, 400);
        assert_eq!(seen.changes["new"].first_seen, 200);
        let removed = labels(&[("nic", "mlx5")]);
        assert!(seen.observe(&then, &removed, 500));
        assert_eq!(seen.changes.keys().collect::<Vec<_>>(), ["zone"]);
        assert_eq!(seen.changes["zone"].to, None);
        // Kept in the pod's state.
        let dir = tempfile::tempdir().expect("tempdir");
        let g = GroupState::open(&dir.path().join("s"), "k8s.io", "sb").expect("open");
        assert_eq!(g.labels_seen().expect("read"), None);
        g.save_labels_seen(&seen).expect("save");
        assert_eq!(g.labels_seen().expect("read"), Some(seen));
    }

    #[test]
    fn names_are_made_safe() {
        assert_eq!(safe_name("trainer"), "trainer");
        assert_eq!(safe_name("a.b_c-1"), "a.b_c-1");
        for bad in ["", "..", "../x", "a/b", ".hidden", "x y"] {
            let s = safe_name(bad);
            assert!(s.starts_with("x-") && s.len() == 18, "{bad} -> {s}");
        }
        assert_ne!(safe_name("a/b"), safe_name("a/c"));
    }

    #[test]
    fn keeps_baselines_and_tasks_privately_and_removes_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("state");
        let g = GroupState::open(&state_dir, "k8s.io", "sb1").expect("open");
        let mode = fs::metadata(&state_dir).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        let t = TaskRecord {
            bundle: "/b".into(),
            container_name: Some("app".into()),
            sandbox: false,
            resources: None,
            pid: Some(42),
        };
        g.save_task("c1", &t).expect("save");
        assert_eq!(g.task("c1").expect("read"), Some(t));
        let file = g.dir().join("tasks/c1.json");
        assert_eq!(
            fs::metadata(&file).expect("meta").permissions().mode() & 0o777,
            0o600
        );
        // Who serves the pod, with the configuration in force, for `kata-topo status`.
        let me = ProcessId {
            pid: 7,
            start_time: 70,
        };
        let d = DaemonRecord {
            wrapper: me,
            delegate_address: "unix:///run/containerd/s/d".into(),
            delegate: None,
            config: Some("/etc/kata-containers/kt.toml".into()),
            config_source: "ConfigPath".into(),
            node_affinity: Some("off: no kubeconfig at /etc/kubernetes/kubelet.conf".into()),
            pod_events: Some("off: no kubeconfig at /etc/kubernetes/kubelet.conf".into()),
        };
        g.save_daemon(&d).expect("save daemon");
        assert_eq!(g.daemon().expect("read"), Some(d.clone()));
        let pod = read_pod(g.dir()).expect("read pod").expect("pod");
        assert_eq!(pod.daemon, Some(d));
        // A record from before the configuration was recorded still reads.
        fs::write(
            g.dir().join(DAEMON_FILE),
            r#"{"wrapper":{"pid":7,"start_time":70},"delegate_address":"x","delegate":null}"#,
        )
        .expect("write");
        let old = g.daemon().expect("read").expect("record");
        assert_eq!((old.config, old.config_source.as_str()), (None, ""));
        // A second open (a restarted wrapper) sees the same state.
        let again = GroupState::open(&state_dir, "k8s.io", "sb1").expect("reopen");
        assert!(again.task("c1").expect("read").is_some());
        g.remove_task("c1").expect("remove");
        assert_eq!(g.task("c1").expect("read"), None);
        fs::write(g.dir().join("tasks/bad.json"), "{").expect("write");
        assert!(g.task("bad").is_err());
        g.remove_all().expect("remove all");
        assert!(!g.dir().exists());
        assert!(!state_dir.join("k8s.io").exists());
    }

    #[test]
    fn a_task_keeps_its_request_and_vm_verdicts_apart_and_loses_both_with_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let g = GroupState::open(&dir.path().join("state"), "k8s.io", "sb1").expect("open");
        let verdict = |rule: &str| -> Verdict {
            serde_json::from_value(serde_json::json!({
                "operation": "update", "class": "noop", "sandbox_id": "sb1",
                "container_id": "c1", "container_name": "app", "pod": {},
                "policy": "restricted", "mode": "audit", "decision": "allow",
                "findings": [{"rule": rule, "severity": "warning", "message": "m",
                              "expected": {}, "observed": {}}]
            }))
            .expect("verdict")
        };
        g.save_verdict("c1", &verdict("cpu-outside-intent"))
            .expect("save");
        g.save_verdict_of(&VerdictOf::Vm("c1".into()), &verdict("vcpu-overlap"))
            .expect("save vm");
        g.save_verdict_of(&VerdictOf::Pod, &verdict("check-failed"))
            .expect("save pod");
        // A task whose id ends like a VM verdict's file is another file.
        g.save_verdict("c1.vm", &verdict("vfio-remote"))
            .expect("save");
        let pod = read_pod(g.dir()).expect("read").expect("pod");
        let kept: Vec<(&str, &str)> = pod
            .verdicts
            .iter()
            .map(|(name, v)| (name.as_str(), v.findings[0].rule.id()))
            .collect();
        assert_eq!(
            kept,
            [
                ("@pod", "check-failed"),
                ("c1", "cpu-outside-intent"),
                ("c1.vm", "vfio-remote"),
                ("c1@vm", "vcpu-overlap"),
            ]
        );
        g.remove_task("c1").expect("remove");
        let pod = read_pod(g.dir()).expect("read").expect("pod");
        let names: Vec<&str> = pod.verdicts.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["@pod", "c1.vm"]);
    }

    #[test]
    fn listing_reports_fifos_and_links_as_unreadable_and_never_blocks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state_dir = dir.path().join("state");
        let g = GroupState::open(&state_dir, "k8s.io", "sb1").expect("open");
        let fifo = g.dir().join("verdicts/c1.json");
        crate::testutil::mkfifo(&fifo).expect("mkfifo");
        let outside = dir.path().join("outside.json");
        fs::write(&outside, "{}").expect("write");
        std::os::unix::fs::symlink(&outside, g.dir().join("tasks/c2.json")).expect("symlink");
        let pods = crate::testutil::within_a_minute("listing the state", move || {
            list(&state_dir).expect("list")
        });
        assert_eq!(pods.len(), 1);
        assert!(pods[0].verdicts.is_empty() && pods[0].tasks.is_empty());
        let unreadable = &pods[0].unreadable;
        assert_eq!(unreadable.len(), 2, "{unreadable:?}");
        assert!(
            unreadable
                .iter()
                .any(|u| u.contains("tasks/c2.json") && u.contains("symbolic link")),
            "{unreadable:?}"
        );
        assert!(
            unreadable
                .iter()
                .any(|u| u.contains("verdicts/c1.json") && u.contains("FIFO")),
            "{unreadable:?}"
        );
    }
}
