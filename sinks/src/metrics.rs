//! Prometheus text files for node-exporter's textfile collector: one file per sandbox,
//! `kata-topo-<namespace>-<sandbox>.prom` ([`file_name`]), every series labelled with `namespace` and
//! `sandbox_id` so files never collide and counters never double count.
//!
//! A check only bumps counters in memory and marks them dirty; a writer thread renders the
//! file and replaces it whole, relative to the directory it opened once without following a
//! symlink (see [`kata_topo_core::files::Dir`]). A hung filesystem stalls only the writer: the
//! counters keep counting and the next write carries them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use kata_topo_core::files::Dir;
use kata_topo_core::Verdict;
use sha2::{Digest, Sha256};

use crate::queue::{wait_until, Drops, Sink};

/// Histogram buckets for `kata_topo_check_duration_seconds`.
const BUCKETS: [f64; 11] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05,
];
/// How often the writer looks at the drop counters when nothing else changed.
const IDLE: Duration = Duration::from_secs(5);
/// How often a running daemon rewrites its file when nothing changed, so that
/// `kata_topo_heartbeat_timestamp_seconds` (and the file's mtime) show it is alive.
const HEARTBEAT: Duration = if cfg!(test) {
    Duration::from_millis(500)
} else {
    Duration::from_secs(60)
};
/// The file's mode: node-exporter runs as another user and must read it.
const MODE: u32 = 0o644;
/// The longest file name: the temporary name adds 22 bytes, and a name has at most 255.
const MAX_NAME: usize = 200;

#[derive(Debug, Default)]
struct Counters {
    checks: BTreeMap<(String, String), u64>,
    findings: BTreeMap<(String, String), u64>,
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
    refreshes: BTreeMap<&'static str, u64>,
    dirty: bool,
    removed: bool,
    /// The writer removed the file (after `removed`).
    gone: bool,
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    name: String,
    labels: String,
    counters: Mutex<Counters>,
    wake: Condvar,
    drops: Arc<Drops>,
}

/// Where check counts and durations go: a textfile, or nowhere.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Option<Arc<Shared>>);

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Spells a name out for a file name: ASCII letters, digits, `.` and `_` as they are (and `-`
/// when `dash`), every other byte as `%XX`. Reversible, so distinct names stay distinct.
fn spell(v: &str, dash: bool) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_') || (dash && b == b'-') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// The file's name for a sandbox: `kata-topo-<namespace>-<sandbox>.prom`, one per pod. Each
/// part is spelled out with [`spell`]; the namespace's own dashes are escaped, so the first
/// dash after the prefix is the boundary and `a-b`/`c` never meets `a`/`b-c`. A name too
/// long for the file system becomes `kata-topo-%~<sha256 of both parts>.prom` (`%~` never
/// occurs in a spelled-out name); the series inside carry the names in their labels.
pub fn file_name(namespace: &str, sandbox: &str) -> String {
    let name = format!(
        "kata-topo-{}-{}.prom",
        spell(namespace, false),
        spell(sandbox, true)
    );
    if name.len() <= MAX_NAME {
        return name;
    }
    let mut h = Sha256::new();
    h.update((namespace.len() as u64).to_be_bytes());
    h.update(namespace.as_bytes());
    h.update(sandbox.as_bytes());
    let hex: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    format!("kata-topo-%~{hex}.prom")
}

impl Metrics {
    /// No metrics (no `metrics_dir`).
    pub fn off() -> Self {
        Self(None)
    }

    /// The file for one sandbox in `dir` (created if missing), written at once so the
    /// sandbox shows as watched.
    pub fn textfile(dir: &Path, namespace: &str, sandbox: &str, drops: Arc<Drops>) -> Self {
        let shared = Arc::new(Shared {
            dir: dir.to_path_buf(),
            name: file_name(namespace, sandbox),
            labels: format!(
                "namespace=\"{}\",sandbox_id=\"{}\"",
                escape(namespace),
                escape(sandbox)
            ),
            counters: Mutex::new(Counters {
                dirty: true,
                ..Counters::default()
            }),
            wake: Condvar::new(),
            drops,
        });
        let weak = Arc::downgrade(&shared);
        let spawned = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || writer(&weak));
        Self(spawned.ok().map(|_| shared))
    }

    /// The file's path, when there is one.
    pub fn path(&self) -> Option<PathBuf> {
        self.0.as_ref().map(|s| s.dir.join(&s.name))
    }

    fn update(&self, f: impl FnOnce(&mut Counters)) {
        if let Some(s) = &self.0 {
            let mut c = s.counters.lock().unwrap_or_else(|e| e.into_inner());
            f(&mut c);
            c.dirty = true;
            s.wake.notify_one();
        }
    }

    /// One check done.
    pub fn observe(&self, v: &Verdict, elapsed: Duration) {
        self.update(|c| {
            *c.checks
                .entry((v.operation.to_string(), v.decision().to_string()))
                .or_insert(0) += 1;
            for f in &v.findings {
                *c.findings
                    .entry((f.rule.id().to_string(), f.severity.to_string()))
                    .or_insert(0) += 1;
            }
            let secs = elapsed.as_secs_f64();
            if let Some(i) = BUCKETS.iter().position(|le| secs <= *le) {
                c.buckets[i] += 1;
            }
            c.sum += secs;
            c.count += 1;
        });
    }

    /// A topology (re)load finished.
    pub fn refreshed(&self, ok: bool) {
        self.update(|c| {
            *c.refreshes
                .entry(if ok { "ok" } else { "failed" })
                .or_insert(0) += 1;
        });
    }

    /// The sandbox is gone: its file goes, and is never written again. Waits for the writer
    /// until `deadline` (a writer stuck on a hung filesystem is not waited for).
    pub fn remove(&self, deadline: Instant) -> bool {
        let Some(s) = &self.0 else {
            return true;
        };
        s.counters.lock().unwrap_or_else(|e| e.into_inner()).removed = true;
        s.wake.notify_one();
        wait_until(&s.counters, &s.wake, deadline, |c| c.gone)
    }
}

fn render(s: &Shared, c: &Counters) -> String {
    let l = &s.labels;
    let mut out = String::new();
    let _ = write!(
        out,
        "# HELP kata_topo_sandbox_watched Sandboxes a kata-topo wrapper watches.\n# TYPE kata_topo_sandbox_watched gauge\nkata_topo_sandbox_watched{{{l}}} 1\n"
    );
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let _ = write!(
        out,
        "# HELP kata_topo_heartbeat_timestamp_seconds When the wrapper daemon last wrote this file (at least every {} s while it runs).\n# TYPE kata_topo_heartbeat_timestamp_seconds gauge\nkata_topo_heartbeat_timestamp_seconds{{{l}}} {}.{:03}\n",
        HEARTBEAT.as_secs(),
        now.as_secs(),
        now.subsec_millis()
    );
    out.push_str("# HELP kata_topo_checks_total Checks run by kata-topo, by operation and decision.\n# TYPE kata_topo_checks_total counter\n");
    for ((op, decision), n) in &c.checks {
        let _ = writeln!(
            out,
            "kata_topo_checks_total{{{l},operation=\"{op}\",decision=\"{decision}\"}} {n}"
        );
    }
    out.push_str("# HELP kata_topo_findings_total Findings reported by kata-topo, by rule and severity.\n# TYPE kata_topo_findings_total counter\n");
    for ((rule, severity), n) in &c.findings {
        let _ = writeln!(
            out,
            "kata_topo_findings_total{{{l},rule=\"{rule}\",severity=\"{severity}\"}} {n}"
        );
    }
    out.push_str("# HELP kata_topo_check_duration_seconds Time a check takes on the request path.\n# TYPE kata_topo_check_duration_seconds histogram\n");
    let mut cumulative = 0;
    for (i, le) in BUCKETS.iter().enumerate() {
        cumulative += c.buckets[i];
        let _ = writeln!(
            out,
            "kata_topo_check_duration_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}"
        );
    }
    let _ = writeln!(
        out,
        "kata_topo_check_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}",
        c.count
    );
    let _ = writeln!(out, "kata_topo_check_duration_seconds_sum{{{l}}} {}", c.sum);
    let _ = writeln!(
        out,
        "kata_topo_check_duration_seconds_count{{{l}}} {}",
        c.count
    );
    out.push_str("# HELP kata_topo_topology_refreshes_total Host topology loads, by result.\n# TYPE kata_topo_topology_refreshes_total counter\n");
    for result in ["ok", "failed"] {
        let _ = writeln!(
            out,
            "kata_topo_topology_refreshes_total{{{l},result=\"{result}\"}} {}",
            c.refreshes.get(result).copied().unwrap_or(0)
        );
    }
    out.push_str("# HELP kata_topo_sink_dropped_total Log lines, journald entries, events, state writes and Kubernetes Events kata-topo dropped rather than make a request wait.\n# TYPE kata_topo_sink_dropped_total counter\n");
    for sink in Sink::ALL {
        let _ = writeln!(
            out,
            "kata_topo_sink_dropped_total{{{l},sink=\"{}\"}} {}",
            sink.name(),
            s.drops.get(sink)
        );
    }
    out
}

/// The writer thread: renders and replaces the file whenever counters changed (and when
/// drop counters moved), removes it when the sandbox is gone.
fn writer(weak: &Weak<Shared>) {
    let mut dir: Option<Dir> = None;
    let mut drops_seen = None;
    let mut written = Instant::now();
    loop {
        let Some(s) = weak.upgrade() else {
            return;
        };
        let (text, removed) = {
            let mut c = s.counters.lock().unwrap_or_else(|e| e.into_inner());
            let drops_now = Some(s.drops.snapshot());
            let fresh = |at: Instant| at.elapsed() < HEARTBEAT;
            if !c.dirty && !c.removed && drops_now == drops_seen && fresh(written) {
                c = s
                    .wake
                    .wait_timeout(c, IDLE.min(HEARTBEAT))
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            let drops_now = Some(s.drops.snapshot());
            if !c.dirty && !c.removed && drops_now == drops_seen && fresh(written) {
                continue;
            }
            drops_seen = drops_now;
            c.dirty = false;
            let text = (!c.removed).then(|| render(&s, &c));
            (text, c.removed)
        };
        if dir.is_none() {
            dir = Dir::create(&s.dir, 0o755).ok();
        }
        let Some(d) = &dir else {
            if removed {
                let mut c = s.counters.lock().unwrap_or_else(|e| e.into_inner());
                c.gone = true;
                s.wake.notify_all();
                return;
            }
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        match text {
            Some(text) => {
                let _ = d.write_atomic(&s.name, text.as_bytes(), MODE);
                written = Instant::now();
            }
            None => {
                let _ = d.remove(&s.name);
                let mut c = s.counters.lock().unwrap_or_else(|e| e.into_inner());
                c.gone = true;
                s.wake.notify_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict() -> Verdict {
        serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb1", "container_id": "c1",
            "container_name": "app", "pod": {}, "policy": "restricted", "mode": "audit",
            "decision": "allow",
            "findings": [{"rule": "vfio-remote", "severity": "error", "message": "m",
                          "expected": {}, "observed": {}}]
        }))
        .expect("verdict")
    }

    fn wait_for(path: &Path, f: impl Fn(&str) -> bool) -> String {
        for _ in 0..500 {
            if let Ok(t) = std::fs::read_to_string(path) {
                if f(&t) {
                    return t;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::read_to_string(path).unwrap_or_default()
    }

    #[test]
    fn textfiles_are_written_whole_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let drops = Drops::new();
        let m = Metrics::textfile(dir.path(), "k8s.io", "sb1", drops.clone());
        let path = m.path().expect("path");
        assert!(path.ends_with("kata-topo-k8s.io-sb1.prom"));
        let first = wait_for(&path, |t| t.contains("kata_topo_sandbox_watched"));
        assert!(
            first.contains("kata_topo_sandbox_watched{namespace=\"k8s.io\",sandbox_id=\"sb1\"} 1"),
            "{first}"
        );
        m.observe(&verdict(), Duration::from_micros(30));
        m.observe(&verdict(), Duration::from_millis(2));
        m.refreshed(true);
        drops.add(Sink::Events, 3);
        let l = "namespace=\"k8s.io\",sandbox_id=\"sb1\"";
        let expected = [
            format!("kata_topo_checks_total{{{l},operation=\"update\",decision=\"allow\"}} 2"),
            format!("kata_topo_findings_total{{{l},rule=\"vfio-remote\",severity=\"error\"}} 2"),
            format!("kata_topo_check_duration_seconds_bucket{{{l},le=\"0.00005\"}} 1"),
            format!("kata_topo_check_duration_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("kata_topo_check_duration_seconds_count{{{l}}} 2"),
            format!("kata_topo_topology_refreshes_total{{{l},result=\"ok\"}} 1"),
            format!("kata_topo_sink_dropped_total{{{l},sink=\"events\"}} 3"),
            format!("kata_topo_sink_dropped_total{{{l},sink=\"log\"}} 0"),
        ];
        let text = wait_for(&path, |t| {
            expected.iter().all(|e| t.lines().any(|x| x == e))
        });
        for e in &expected {
            assert!(text.lines().any(|x| x == e), "missing {e} in\n{text}");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        assert!(m.remove(Instant::now() + Duration::from_secs(10)));
        assert!(!path.exists());
        m.observe(&verdict(), Duration::from_micros(30));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!path.exists(), "a removed sandbox is never written again");
    }

    fn heartbeat(text: &str) -> Option<f64> {
        text.lines()
            .find_map(|l| l.strip_prefix("kata_topo_heartbeat_timestamp_seconds{"))
            .and_then(|l| l.split_once("} "))
            .and_then(|(_, v)| v.parse().ok())
    }

    #[test]
    fn an_idle_daemon_rewrites_its_file_with_a_newer_heartbeat() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = Metrics::textfile(dir.path(), "k8s.io", "sb1", Drops::new());
        let path = m.path().expect("path");
        let first = heartbeat(&wait_for(&path, |t| heartbeat(t).is_some())).expect("heartbeat");
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs_f64();
        assert!((now - first).abs() < 5.0, "{first} is now ({now})");
        let later = wait_for(&path, |t| heartbeat(t).is_some_and(|h| h > first));
        assert!(
            heartbeat(&later).is_some_and(|h| h > first),
            "nothing changed, yet the file is rewritten with a newer heartbeat:\n{later}"
        );
        assert!(m.remove(Instant::now() + Duration::from_secs(10)));
    }

    #[test]
    fn planted_symlinks_are_never_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let textfile = dir.path().join("textfile");
        std::fs::create_dir(&textfile).expect("dir");
        let name = file_name("k8s.io", "sb1");
        std::os::unix::fs::symlink(&victim, textfile.join(&name)).expect("plant");
        std::os::unix::fs::symlink(&victim, textfile.join(format!(".{name}.tmp")))
            .expect("plant the old temporary name");
        let m = Metrics::textfile(&textfile, "k8s.io", "sb1", Drops::new());
        m.observe(&verdict(), Duration::from_micros(30));
        let text = wait_for(&textfile.join(&name), |t| t.contains("checks_total"));
        assert!(text.contains("kata_topo_checks_total"), "{text}");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
    }

    /// Reads a file name back into its namespace and sandbox (what an operator, or a
    /// tool, can do): only possible when no two pods share a name.
    fn parse(name: &str) -> Option<(String, String)> {
        fn unescape(s: &str) -> Option<String> {
            let mut out = Vec::new();
            let b = s.as_bytes();
            let mut i = 0;
            while i < b.len() {
                if b[i] == b'%' {
                    let hex = s.get(i + 1..i + 3)?;
                    out.push(u8::from_str_radix(hex, 16).ok()?);
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            String::from_utf8(out).ok()
        }
        let rest = name.strip_prefix("kata-topo-")?.strip_suffix(".prom")?;
        let (ns, sb) = rest.split_once('-')?;
        Some((unescape(ns)?, unescape(sb)?))
    }

    #[test]
    fn file_names_are_one_per_pod_and_readable() {
        // Plain names read as they are.
        assert_eq!(file_name("k8s.io", "sb1"), "kata-topo-k8s.io-sb1.prom");
        assert_eq!(
            file_name("default", "planted"),
            "kata-topo-default-planted.prom"
        );
        // A dash in either part no longer moves the boundary between them.
        assert_ne!(file_name("a-b", "c"), file_name("a", "b-c"));
        assert_eq!(
            parse(&file_name("a-b", "c")),
            Some(("a-b".into(), "c".into()))
        );
        assert_eq!(
            parse(&file_name("a", "b-c")),
            Some(("a".into(), "b-c".into()))
        );
        for (ns, sb) in [
            ("k8s.io", "../../etc/passwd"),
            ("", ""),
            ("x", ".hidden"),
            ("%41", "A"),
            ("A", "%41"),
            ("ns", "caf\u{e9}\n\0"),
        ] {
            let name = file_name(ns, sb);
            assert!(!name.contains('/') && !name.contains('\0'), "{name:?}");
            assert_eq!(parse(&name), Some((ns.into(), sb.into())), "{name}");
        }
        // Too long to spell out: a digest of both parts, still one per pod.
        let long = "s".repeat(300);
        let name = file_name("k8s.io", &long);
        assert!(name.len() <= MAX_NAME, "{}", name.len());
        assert_ne!(name, file_name("k8s.io", &"s".repeat(301)));
        assert_ne!(name, file_name("k8s.i", &format!("o{long}")));
        assert!(name.starts_with("kata-topo-") && name.ends_with(".prom"));
        assert_eq!(parse(&name), None, "never mistaken for a spelled-out name");
    }

    proptest::proptest! {
        #[test]
        fn file_names_never_collide(
            a in ("[a-cé.%/ -]{0,6}", "[a-cé.%/ -]{0,6}"),
            b in ("[a-cé.%/ -]{0,6}", "[a-cé.%/ -]{0,6}"),
        ) {
            let (na, nb) = (file_name(&a.0, &a.1), file_name(&b.0, &b.1));
            proptest::prop_assert_eq!(na == nb, a == b, "{} {}", na, nb);
            proptest::prop_assert_eq!(parse(&na), Some(a.clone()));
            proptest::prop_assert!(!na.contains('/'));
        }
    }

    #[test]
    fn off_is_silent() {
        let m = Metrics::off();
        m.observe(&verdict(), Duration::from_micros(1));
        assert!(m.remove(Instant::now()));
        assert_eq!(m.path(), None);
    }
}
