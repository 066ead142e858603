//! Prometheus text files for node-exporter's textfile collector: one file per sandbox,
//! `kata-topo-<namespace>-<sandbox>.prom` ([`file_name`]), every series labelled with `namespace` and
//! `sandbox_id` so files never collide and counters never double count.
//!
//! A check only bumps counters in memory and marks them dirty; a writer thread renders the
//! file and replaces it whole, relative to the directory it opened once without following a
//! symlink (see [`kata_topo_core::files::Dir`]). A hung filesystem stalls only the writer: the
//! counters keep counting and the next write carries them.
//!
//! One writer thread can serve many sandboxes ([`MetricsWriter`]: the NRI plugin's, one thread
//! for the node): each sandbox keeps its own file, counters and removal, and the writer runs
//! while one of them is there (a later sandbox starts it again). The wrapper's daemon has a
//! writer of its own for its one sandbox ([`Metrics::textfile`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use kata_topo_core::files::Dir;
use kata_topo_core::Verdict;
use sha2::{Digest, Sha256};

use crate::queue::{wait_until, Drops, Sink, SINKS};

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
/// How long the writer waits before it tries again to open a directory it could not.
const RETRY: Duration = Duration::from_secs(1);
/// The file's mode: node-exporter runs as another user and must read it.
const MODE: u32 = 0o644;
/// The longest file name: the temporary name adds 22 bytes, and a name has at most 255.
const MAX_NAME: usize = 200;

/// Counts by a pair of label values, in their order. A sandbox has a few (an operation and a
/// decision or two, a rule or two): a vector of them is a third of a map's first node, and a
/// node-wide front end keeps one per pod.
#[derive(Debug, Default)]
struct Tally(Vec<((String, String), u64)>);

impl Tally {
    fn bump(&mut self, a: &str, b: &str) {
        match self
            .0
            .binary_search_by(|((x, y), _)| (x.as_str(), y.as_str()).cmp(&(a, b)))
        {
            Ok(i) => self.0[i].1 += 1,
            Err(i) => self.0.insert(i, ((a.to_string(), b.to_string()), 1)),
        }
    }

    fn iter(&self) -> impl Iterator<Item = (&str, &str, u64)> {
        self.0
            .iter()
            .map(|((a, b), n)| (a.as_str(), b.as_str(), *n))
    }
}

#[derive(Debug, Default)]
struct Counters {
    checks: Tally,
    findings: Tally,
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
    /// Topology loads: those that succeeded, those that failed.
    refreshes: [u64; 2],
    dirty: bool,
    removed: bool,
    /// The writer removed the file (after `removed`).
    gone: bool,
    /// The drop counters the last write carried (the writer's).
    drops_seen: Option<[u64; SINKS]>,
    /// When the file was last written (the writer's).
    written: Option<Instant>,
}

/// The sandboxes one writer thread writes for.
#[derive(Debug, Default)]
struct Files {
    /// Each sandbox by the id it joined with. A sandbox leaves once its file is removed, or
    /// once nothing holds its [`Metrics`] any more (its file then stays as last written).
    sandboxes: BTreeMap<u64, Weak<Shared>>,
    /// The next sandbox's id.
    next: u64,
    /// Something changed since the writer last looked: a count, a removal, a sandbox that
    /// joined or left.
    poked: bool,
    /// Whether the writer thread runs.
    running: bool,
}

/// One writer thread's directory, sandboxes and wake-up.
#[derive(Debug)]
struct Hub {
    dir: PathBuf,
    drops: Arc<Drops>,
    files: Mutex<Files>,
    wake: Condvar,
}

impl Hub {
    fn lock(&self) -> MutexGuard<'_, Files> {
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn poke(&self) {
        self.lock().poked = true;
        self.wake.notify_all();
    }
}

/// One sandbox's file and counters.
#[derive(Debug)]
struct Shared {
    hub: Arc<Hub>,
    name: String,
    labels: String,
    counters: Mutex<Counters>,
    /// Tells [`Metrics::remove`] the file is gone.
    done: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Counters> {
        self.counters.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for Shared {
    /// The writer learns at once that a sandbox left (and ends when it was the last).
    fn drop(&mut self) {
        self.hub.poke();
    }
}

/// Where check counts and durations go: a textfile, or nowhere.
#[derive(Debug, Clone, Default)]
pub struct Metrics(Option<Arc<Shared>>);

/// One writer thread for the textfiles of many sandboxes in one directory (a front end that
/// serves every pod of the node): [`MetricsWriter::textfile`] adds a sandbox. The thread
/// starts with the first sandbox and ends once none is left, removed or dropped.
#[derive(Debug, Clone, Default)]
pub struct MetricsWriter(Option<Arc<Hub>>);
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

impl MetricsWriter {
    /// No metrics (no `metrics_dir`): every sandbox's [`Metrics`] is off.
    pub fn off() -> Self {
        Self(None)
    }

    /// The textfiles in `dir` (created if missing); `drops` is what every one of them reports
    /// as dropped. No thread until the first sandbox.
    pub fn textfiles(dir: &Path, drops: Arc<Drops>) -> Self {
        Self(Some(Arc::new(Hub {
            dir: dir.to_path_buf(),
            drops,
            files: Mutex::new(Files::default()),
            wake: Condvar::new(),
        })))
    }

    /// The file of one sandbox, written at once so the sandbox shows as watched; its writer
    /// started when it is not running (off when it cannot be started).
    pub fn textfile(&self, namespace: &str, sandbox: &str) -> Metrics {
        let Some(hub) = &self.0 else {
            return Metrics::off();
        };
        let mut f = hub.lock();
        if !f.running {
            let worker = Arc::clone(hub);
            let spawned = std::thread::Builder::new()
                .name("metrics".into())
                .spawn(move || writer(&worker));
            if spawned.is_err() {
                return Metrics::off();
            }
            f.running = true;
        }
        let shared = Arc::new(Shared {
            hub: Arc::clone(hub),
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
            done: Condvar::new(),
        });
        let id = f.next;
        f.next += 1;
        f.sandboxes.insert(id, Arc::downgrade(&shared));
        f.poked = true;
        hub.wake.notify_all();
        Metrics(Some(shared))
    }
}

impl Metrics {
    /// No metrics (no `metrics_dir`).
    pub fn off() -> Self {
        Self(None)
    }

    /// The file for one sandbox in `dir` (created if missing), written at once so the
    /// sandbox shows as watched, by a writer thread of its own (the wrapper's daemon, one
    /// sandbox per process).
    pub fn textfile(dir: &Path, namespace: &str, sandbox: &str, drops: Arc<Drops>) -> Self {
        MetricsWriter::textfiles(dir, drops).textfile(namespace, sandbox)
    }

    /// The file's path, when there is one.
    pub fn path(&self) -> Option<PathBuf> {
        self.0.as_ref().map(|s| s.hub.dir.join(&s.name))
    }

    fn update(&self, f: impl FnOnce(&mut Counters)) {
        if let Some(s) = &self.0 {
            {
                let mut c = s.lock();
                if c.removed {
                    return;
                }
                f(&mut c);
                c.dirty = true;
            }
            s.hub.poke();
        }
    }

    /// One check done.
    pub fn observe(&self, v: &Verdict, elapsed: Duration) {
        self.update(|c| {
            c.checks
                .bump(&v.operation.to_string(), &v.decision().to_string());
            for f in &v.findings {
                c.findings.bump(f.rule.id(), &f.severity.to_string());
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
            c.refreshes[usize::from(!ok)] += 1;
        });
    }

    /// The sandbox is gone: its file goes, and is never written again. Waits for the writer
    /// until `deadline` (a writer stuck on a hung filesystem is not waited for).
    pub fn remove(&self, deadline: Instant) -> bool {
        let Some(s) = &self.0 else {
            return true;
        };
        s.lock().removed = true;
        s.hub.poke();
        wait_until(&s.counters, &s.done, deadline, |c| c.gone)
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
    for (op, decision, n) in c.checks.iter() {
        let _ = writeln!(
            out,
            "kata_topo_checks_total{{{l},operation=\"{op}\",decision=\"{decision}\"}} {n}"
        );
    }
    out.push_str("# HELP kata_topo_findings_total Findings reported by kata-topo, by rule and severity.\n# TYPE kata_topo_findings_total counter\n");
    for (rule, severity, n) in c.findings.iter() {
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
    for (result, n) in ["ok", "failed"].iter().zip(c.refreshes) {
        let _ = writeln!(
            out,
            "kata_topo_topology_refreshes_total{{{l},result=\"{result}\"}} {n}"
        );
    }
    out.push_str("# HELP kata_topo_sink_dropped_total Log lines, journald entries, events, state writes and Kubernetes Events kata-topo dropped rather than make a request wait.\n# TYPE kata_topo_sink_dropped_total counter\n");
    for sink in Sink::ALL {
        let _ = writeln!(
            out,
            "kata_topo_sink_dropped_total{{{l},sink=\"{}\"}} {}",
            sink.name(),
            s.hub.drops.get(sink)
        );
    }
    out
}

/// The writer thread: goes through its sandboxes whenever one of them changed (and every
/// [`IDLE`], for the drop counters and the heartbeat; every [`RETRY`] while its directory
/// cannot be opened), renders and replaces each file that is due, removes each removed
/// sandbox's; ends once no sandbox is left.
fn writer(hub: &Hub) {
    let mut dir: Option<Dir> = None;
    let mut gone: Vec<u64> = Vec::new();
    loop {
        let live: Vec<(u64, Arc<Shared>)> = {
            let mut f = hub.lock();
            for id in gone.drain(..) {
                f.sandboxes.remove(&id);
            }
            f.sandboxes.retain(|_, s| s.strong_count() > 0);
            if f.sandboxes.is_empty() {
                f.running = false;
                hub.wake.notify_all();
                return;
            }
            if !f.poked {
                // A directory that could not be opened is tried again sooner.
                let wait = if dir.is_some() {
                    IDLE.min(HEARTBEAT)
                } else {
                    RETRY
                };
                f = hub
                    .wake
                    .wait_timeout(f, wait)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            f.poked = false;
            f.sandboxes
                .iter()
                .filter_map(|(id, s)| Some((*id, s.upgrade()?)))
                .collect()
        };
        if dir.is_none() {
            dir = Dir::create(&hub.dir, 0o755).ok();
        }
        for (id, s) in &live {
            if visit(s, dir.as_ref()) {
                gone.push(*id);
            }
        }
        // A sandbox whose last user went while it was being written drops here, outside
        // the lock it pokes.
        drop(live);
    }
}

/// Writes one sandbox's file when it is due, or removes it once the sandbox is removed;
/// returns whether the file is gone. Without a directory nothing is written, and a removed
/// sandbox has nothing to remove.
fn visit(s: &Shared, dir: Option<&Dir>) -> bool {
    let text = {
        let mut c = s.lock();
        if c.gone {
            return true;
        }
        let drops_now = Some(s.hub.drops.snapshot());
        let fresh = c.written.is_some_and(|at| at.elapsed() < HEARTBEAT);
        if !c.dirty && !c.removed && drops_now == c.drops_seen && fresh {
            return false;
        }
        if dir.is_none() && !c.removed {
            return false;
        }
        c.drops_seen = drops_now;
        c.dirty = false;
        (!c.removed).then(|| render(s, &c))
    };
    match (text, dir) {
        (Some(text), Some(d)) => {
            let _ = d.write_atomic(&s.name, text.as_bytes(), MODE);
            s.lock().written = Some(Instant::now());
            false
        }
        (None, d) => {
            if let Some(d) = d {
                let _ = d.remove(&s.name);
            }
            s.lock().gone = true;
            s.done.notify_all();
            true
        }
        (Some(_), None) => false,
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

    fn running(w: &MetricsWriter) -> bool {
        w.0.as_ref().expect("a writer").lock().running
    }

    /// Waits, until `deadline`, for the writer to be (or not be) running.
    fn wait_running(w: &MetricsWriter, want: bool) -> bool {
        let hub = w.0.as_ref().expect("a writer");
        wait_until(
            &hub.files,
            &hub.wake,
            Instant::now() + Duration::from_secs(10),
            |f| f.running == want,
        )
    }

    /// Two sandboxes on one writer (the NRI plugin's pods): each its own file and counters;
    /// removing one leaves the other, which is still written, and the removed one's file
    /// never comes back.
    #[test]
    fn sandboxes_of_one_writer_are_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = MetricsWriter::textfiles(dir.path(), Drops::new());
        assert!(!running(&w), "no thread before the first sandbox");
        let a = w.textfile("k8s.io", "sb1");
        let b = w.textfile("k8s.io", "sb2");
        let (pa, pb) = (a.path().expect("a"), b.path().expect("b"));
        assert_ne!(pa, pb);
        a.observe(&verdict(), Duration::from_micros(30));
        a.observe(&verdict(), Duration::from_micros(30));
        b.observe(&verdict(), Duration::from_micros(30));
        let la = "namespace=\"k8s.io\",sandbox_id=\"sb1\"";
        let lb = "namespace=\"k8s.io\",sandbox_id=\"sb2\"";
        let ca =
            format!("kata_topo_checks_total{{{la},operation=\"update\",decision=\"allow\"}} 2");
        let cb =
            format!("kata_topo_checks_total{{{lb},operation=\"update\",decision=\"allow\"}} 1");
        let ta = wait_for(&pa, |t| t.lines().any(|l| l == ca));
        let tb = wait_for(&pb, |t| t.lines().any(|l| l == cb));
        assert!(ta.lines().any(|l| l == ca), "{ta}");
        assert!(tb.lines().any(|l| l == cb), "{tb}");
        assert!(!ta.contains("sb2") && !tb.contains("sb1"), "{ta}\n{tb}");

        assert!(a.remove(Instant::now() + Duration::from_secs(10)));
        assert!(!pa.exists());
        assert!(pb.exists(), "the other sandbox's file stays");
        // The removed one counts on and is never written again; the other is, by its
        // changes and by its heartbeat.
        a.observe(&verdict(), Duration::from_micros(30));
        b.observe(&verdict(), Duration::from_micros(30));
        let cb =
            format!("kata_topo_checks_total{{{lb},operation=\"update\",decision=\"allow\"}} 2");
        let tb = wait_for(&pb, |t| t.lines().any(|l| l == cb));
        assert!(tb.lines().any(|l| l == cb), "{tb}");
        let first = heartbeat(&tb).expect("heartbeat");
        let later = wait_for(&pb, |t| heartbeat(t).is_some_and(|h| h > first));
        assert!(heartbeat(&later).is_some_and(|h| h > first), "{later}");
        assert!(!pa.exists(), "a removed sandbox is never written again");
        assert!(
            a.remove(Instant::now() + Duration::from_secs(1)),
            "removed twice"
        );
        assert!(b.remove(Instant::now() + Duration::from_secs(10)));
        assert!(!pb.exists());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(names.is_empty(), "{names:?}");
    }

    /// The writer ends once its last sandbox is removed or dropped, and starts again for a
    /// new one.
    #[test]
    fn the_writer_ends_with_its_last_sandbox() {
        let dir = tempfile::tempdir().expect("tempdir");
        let w = MetricsWriter::textfiles(dir.path(), Drops::new());
        let a = w.textfile("k8s.io", "sb1");
        let b = w.textfile("k8s.io", "sb2");
        let kept = b.clone();
        assert!(running(&w));
        assert!(a.remove(Instant::now() + Duration::from_secs(10)));
        drop(b);
        std::thread::sleep(Duration::from_millis(50));
        assert!(running(&w), "a sandbox is still held");
        drop(kept);
        assert!(
            wait_running(&w, false),
            "its last user gone, the writer ends"
        );
        let p2 = dir.path().join(file_name("k8s.io", "sb2"));
        assert!(
            p2.exists(),
            "a sandbox dropped without removal keeps its file"
        );

        let c = w.textfile("k8s.io", "sb3");
        assert!(running(&w), "a new sandbox starts it again");
        let pc = c.path().expect("c");
        let text = wait_for(&pc, |t| t.contains("kata_topo_sandbox_watched"));
        assert!(text.contains("sb3"), "{text}");
        assert!(c.remove(Instant::now() + Duration::from_secs(10)));
        assert!(
            wait_running(&w, false),
            "its last sandbox removed, the writer ends"
        );
        assert!(!pc.exists());
        // Held but removed: nothing more to write.
        c.observe(&verdict(), Duration::from_micros(30));
        std::thread::sleep(Duration::from_millis(50));
        assert!(!running(&w) && !pc.exists());
    }

    #[test]
    fn an_off_writer_makes_off_metrics() {
        let m = MetricsWriter::off().textfile("k8s.io", "sb1");
        assert_eq!(m.path(), None);
        assert!(m.remove(Instant::now()));
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
