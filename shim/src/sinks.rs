//! Where verdicts go: JSON log lines (slog), containerd events on `/kata-topo/mismatch`, and a
//! metrics seam. None of them can block or fail a request: the log ignores write errors (EPIPE,
//! ENOSPC), events go through a bounded queue to a publisher thread.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kata_topo::{Decision, Verdict};
use prost::Message;
use slog::{o, Drain, Level, Logger};

use crate::ttrpc::{Any, Client, Envelope, ForwardRequest, StringValue, Timestamp};

/// The event topic (a contract).
pub const TOPIC_MISMATCH: &str = "/kata-topo/mismatch";
/// How long the daemon's publisher waits for containerd to take one event.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);

/// containerd's event service over ttrpc.
pub const EVENTS_SERVICE: &str = "containerd.services.events.ttrpc.v1.Events";

/// RFC 3339 UTC with microseconds, without a date crate.
pub fn rfc3339(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// A writer that never fails the caller: errors are swallowed (a full disk must not take a
/// pod's updates down with it).
struct Lenient<W: Write>(W);

impl<W: Write> Write for Lenient<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = self.0.write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = self.0.flush();
        Ok(())
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Critical => "critical",
        Level::Error => "error",
        Level::Warning => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// journald's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Sends each complete JSON line to journald as one entry with `SYSLOG_IDENTIFIER=kata-topo`
/// (node-problem-detector's journald source matches on it).
struct Journal {
    socket: std::os::unix::net::UnixDatagram,
    line: Vec<u8>,
}

impl Journal {
    fn open() -> Option<Self> {
        if !Path::new(JOURNAL_SOCKET).exists() {
            return None;
        }
        let socket = std::os::unix::net::UnixDatagram::unbound().ok()?;
        socket.connect(JOURNAL_SOCKET).ok()?;
        Some(Self {
            socket,
            line: Vec::new(),
        })
    }
}

impl Write for Journal {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(buf);
        while let Some(end) = self.line.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.line.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).replace('\n', " ");
            let priority = if text.contains("\"level\":\"error\"") {
                3
            } else {
                4
            };
            let entry =
                format!("SYSLOG_IDENTIFIER=kata-topo\nPRIORITY={priority}\nMESSAGE={text}\n");
            let _ = self.socket.send(entry.as_bytes());
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Builds the JSON logger: `ts`, `level`, `msg` and the record's key-values, one object a line,
/// to `path`, to journald where it runs, and to stderr when debugging.
pub fn json_logger(path: &Path, also_stderr: bool) -> Logger {
    let file = OpenOptions::new().create(true).append(true).open(path);
    let mut sinks: Vec<Box<dyn Write + Send>> = Vec::new();
    if let Ok(f) = file {
        sinks.push(Box::new(Lenient(f)));
    }
    if also_stderr {
        sinks.push(Box::new(Lenient(std::io::stderr())));
    }
    if let Some(journal) = Journal::open() {
        sinks.push(Box::new(journal));
    }
    struct Tee(Vec<Box<dyn Write + Send>>);
    impl Write for Tee {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            for w in &mut self.0 {
                let _ = w.write_all(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            for w in &mut self.0 {
                let _ = w.flush();
            }
            Ok(())
        }
    }
    let json = slog_json::Json::new(Tee(sinks))
        .set_newlines(true)
        .set_flush(true)
        .add_key_value(o!(
            "ts" => slog::PushFnValue(|_, ser| ser.emit(rfc3339(SystemTime::now()))),
            "level" => slog::FnValue(|r| level_name(r.level())),
            "msg" => slog::PushFnValue(|r, ser| ser.emit(r.msg())),
        ))
        .build();
    Logger::root(Mutex::new(json).ignore_res(), o!())
}

/// Writes one line per finding of a verdict: at `warn` when the request went through, at
/// `error` when it was refused.
pub fn log_verdict(log: &Logger, v: &Verdict) {
    let level = match v.decision {
        Decision::Allow => Level::Warning,
        Decision::Reject => Level::Error,
    };
    let s = |o: &Option<String>| o.clone().unwrap_or_default();
    for f in &v.findings {
        let plain = |value: &serde_json::Value| serde_json::to_string(value).unwrap_or_default();
        let kv = o!(
            "event" => "finding",
            "rule" => f.rule.id(),
            "severity" => f.severity.to_string(),
            "operation" => v.operation.to_string(),
            "class" => v.class.map(|c| c.to_string()),
            "decision" => v.decision.to_string(),
            "policy" => v.policy.to_string(),
            "mode" => v.mode.to_string(),
            "sandbox_id" => s(&v.sandbox_id),
            "container_id" => s(&v.container_id),
            "container_name" => s(&v.container_name),
            "pod_name" => s(&v.pod.name),
            "pod_namespace" => s(&v.pod.namespace),
            "pod_uid" => s(&v.pod.uid),
            "expected" => plain(&f.expected),
            "observed" => plain(&f.observed),
        );
        let child = log.new(kv);
        match level {
            Level::Error => slog::error!(child, "{}", f.message),
            _ => slog::warn!(child, "{}", f.message),
        }
    }
}

/// Where check counts and durations go.
pub trait Metrics: Send + Sync {
    /// One check done.
    fn observe(&self, verdict: &Verdict, elapsed: Duration);
    /// A topology (re)load finished.
    fn refreshed(&self, _ok: bool) {}
    /// The sandbox is gone: its series must disappear.
    fn remove(&self) {}
}

/// No metrics (no `metrics_dir`).
#[derive(Debug, Default)]
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn observe(&self, _: &Verdict, _: Duration) {}
}

/// Histogram buckets for `kata_topo_check_duration_seconds`.
const BUCKETS: [f64; 11] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.05,
];

#[derive(Debug, Default)]
struct Counters {
    checks: BTreeMap<(String, String), u64>,
    findings: BTreeMap<(String, String), u64>,
    buckets: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
    refreshes: BTreeMap<&'static str, u64>,
    removed: bool,
}

/// Prometheus text files for node-exporter's textfile collector: one file per sandbox,
/// `kata-topo-<namespace>-<sandbox>.prom`, rewritten atomically (write, rename) after every
/// check and removed when the sandbox goes. Every series carries `namespace` and `sandbox_id`,
/// so files never collide and counters never double count.
#[derive(Debug)]
pub struct Textfile {
    path: PathBuf,
    labels: String,
    counters: Mutex<Counters>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Textfile {
    /// The file for one sandbox in `dir` (created if missing), written once now so the sandbox
    /// shows as watched.
    pub fn new(dir: &Path, namespace: &str, sandbox: &str) -> Self {
        let _ = std::fs::create_dir_all(dir);
        let name = format!(
            "kata-topo-{}-{}.prom",
            kata_topo::state::safe_name(namespace),
            kata_topo::state::safe_name(sandbox)
        );
        let t = Self {
            path: dir.join(name),
            labels: format!(
                "namespace=\"{}\",sandbox_id=\"{}\"",
                escape(namespace),
                escape(sandbox)
            ),
            counters: Mutex::new(Counters::default()),
        };
        t.write(&t.counters.lock().unwrap_or_else(|e| e.into_inner()));
        t
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn render(&self, c: &Counters) -> String {
        let l = &self.labels;
        let mut out = String::new();
        out.push_str("# HELP kata_topo_sandbox_watched Sandboxes a kata-topo wrapper watches.\n# TYPE kata_topo_sandbox_watched gauge\n");
        out.push_str(&format!("kata_topo_sandbox_watched{{{l}}} 1\n"));
        out.push_str("# HELP kata_topo_checks_total Checks run by kata-topo, by operation and decision.\n# TYPE kata_topo_checks_total counter\n");
        for ((op, decision), n) in &c.checks {
            out.push_str(&format!(
                "kata_topo_checks_total{{{l},operation=\"{op}\",decision=\"{decision}\"}} {n}\n"
            ));
        }
        out.push_str("# HELP kata_topo_findings_total Findings reported by kata-topo, by rule and severity.\n# TYPE kata_topo_findings_total counter\n");
        for ((rule, severity), n) in &c.findings {
            out.push_str(&format!(
                "kata_topo_findings_total{{{l},rule=\"{rule}\",severity=\"{severity}\"}} {n}\n"
            ));
        }
        out.push_str("# HELP kata_topo_check_duration_seconds Time a check takes on the request path.\n# TYPE kata_topo_check_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (i, le) in BUCKETS.iter().enumerate() {
            cumulative += c.buckets[i];
            out.push_str(&format!(
                "kata_topo_check_duration_seconds_bucket{{{l},le=\"{le}\"}} {cumulative}\n"
            ));
        }
        out.push_str(&format!(
            "kata_topo_check_duration_seconds_bucket{{{l},le=\"+Inf\"}} {}\n",
            c.count
        ));
        out.push_str(&format!(
            "kata_topo_check_duration_seconds_sum{{{l}}} {}\n",
            c.sum
        ));
        out.push_str(&format!(
            "kata_topo_check_duration_seconds_count{{{l}}} {}\n",
            c.count
        ));
        out.push_str("# HELP kata_topo_topology_refreshes_total Host topology loads, by result.\n# TYPE kata_topo_topology_refreshes_total counter\n");
        for result in ["ok", "failed"] {
            out.push_str(&format!(
                "kata_topo_topology_refreshes_total{{{l},result=\"{result}\"}} {}\n",
                c.refreshes.get(result).copied().unwrap_or(0)
            ));
        }
        out
    }

    fn write(&self, c: &Counters) {
        if c.removed {
            return;
        }
        let text = self.render(c);
        let name = self
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // The collector reads *.prom only: the temporary name never matches.
        let tmp = self.path.with_file_name(format!(".{name}.tmp"));
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, &self.path);
        }
    }
}

impl Metrics for Textfile {
    fn observe(&self, v: &Verdict, elapsed: Duration) {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        *c.checks
            .entry((v.operation.to_string(), v.decision.to_string()))
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
        self.write(&c);
    }

    fn refreshed(&self, ok: bool) {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        *c.refreshes
            .entry(if ok { "ok" } else { "failed" })
            .or_insert(0) += 1;
        self.write(&c);
    }

    fn remove(&self) {
        let mut c = self.counters.lock().unwrap_or_else(|e| e.into_inner());
        c.removed = true;
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Publishes events to containerd off the request path.
#[derive(Debug, Clone)]
pub struct Events {
    tx: Option<SyncSender<Vec<u8>>>,
}

impl Events {
    /// A publisher to containerd's ttrpc address for a namespace; `None` address: no events.
    pub fn start(ttrpc_address: Option<String>, namespace: String, log: Logger) -> Self {
        let Some(address) = ttrpc_address.filter(|a| !a.is_empty()) else {
            return Self { tx: None };
        };
        let (tx, rx) = sync_channel::<Vec<u8>>(64);
        let spawned = std::thread::Builder::new()
            .name("events".into())
            .spawn(move || {
                for payload in rx {
                    let deadline = Instant::now() + PUBLISH_TIMEOUT;
                    if let Err(e) = publish(&address, &namespace, payload, deadline) {
                        slog::warn!(log, "cannot publish event to containerd";
                            "event" => "publish-failed", "address" => &address, "error" => e.to_string());
                    }
                }
            });
        Self {
            tx: spawned.ok().map(|_| tx),
        }
    }

    /// Queues a verdict for `/kata-topo/mismatch`; drops it if the queue is full.
    pub fn mismatch(&self, v: &Verdict) {
        if let (Some(tx), Ok(json)) = (&self.tx, serde_json::to_string(v)) {
            match tx.try_send(StringValue { value: json }.encode_to_vec()) {
                Ok(()) | Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {}
            }
        }
    }
}

/// Sends one event through `Events/Forward`, giving up at `deadline`.
pub fn publish(
    address: &str,
    namespace: &str,
    string_value: Vec<u8>,
    deadline: Instant,
) -> std::io::Result<()> {
    let mut client = Client::connect(address, deadline)?;
    let request = ForwardRequest {
        envelope: Some(Envelope {
            timestamp: Some(Timestamp::now()),
            namespace: namespace.to_string(),
            topic: TOPIC_MISMATCH.to_string(),
            event: Some(Any {
                type_url: "google.protobuf.StringValue".to_string(),
                value: string_value,
            }),
        }),
    };
    let response = client.call(
        EVENTS_SERVICE,
        "Forward",
        request.encode_to_vec(),
        namespace,
        deadline,
    )?;
    match response.status {
        Some(s) if s.code != 0 => Err(std::io::Error::other(format!(
            "containerd refused the event: {}",
            s.message
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn textfile_metrics_are_written_atomically_and_removed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let t = Textfile::new(dir.path(), "k8s.io", "sb1");
        assert!(t.path().ends_with("kata-topo-k8s.io-sb1.prom"));
        let first = std::fs::read_to_string(t.path()).expect("written at start");
        assert!(
            first.contains("kata_topo_sandbox_watched{namespace=\"k8s.io\",sandbox_id=\"sb1\"} 1")
        );
        let v: Verdict = serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb1", "container_id": "c1",
            "container_name": "app", "pod": {}, "policy": "restricted", "mode": "audit",
            "decision": "allow",
            "findings": [{"rule": "vfio-remote", "severity": "error", "message": "m",
                          "expected": {}, "observed": {}}]
        }))
        .expect("verdict");
        t.observe(&v, Duration::from_micros(30));
        t.observe(&v, Duration::from_millis(2));
        t.refreshed(true);
        let text = std::fs::read_to_string(t.path()).expect("read");
        let l = "namespace=\"k8s.io\",sandbox_id=\"sb1\"";
        for line in [
            format!("kata_topo_checks_total{{{l},operation=\"update\",decision=\"allow\"}} 2"),
            format!("kata_topo_findings_total{{{l},rule=\"vfio-remote\",severity=\"error\"}} 2"),
            format!("kata_topo_check_duration_seconds_bucket{{{l},le=\"0.00005\"}} 1"),
            format!("kata_topo_check_duration_seconds_bucket{{{l},le=\"+Inf\"}} 2"),
            format!("kata_topo_check_duration_seconds_count{{{l}}} 2"),
            format!("kata_topo_topology_refreshes_total{{{l},result=\"ok\"}} 1"),
        ] {
            assert!(text.lines().any(|x| x == line), "missing {line} in\n{text}");
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "no temporary file left: {names:?}");
        t.remove();
        assert!(!t.path().exists());
        t.observe(&v, Duration::from_micros(30));
        assert!(
            !t.path().exists(),
            "a removed sandbox is never written again"
        );
    }

    #[test]
    fn formats_timestamps() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000) + Duration::from_micros(123_456);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(rfc3339(leap).starts_with("2000-02-29T00:00:00"));
    }

    #[test]
    fn logs_one_json_line_per_finding_and_survives_a_bad_path() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kt.log");
        let log = json_logger(&path, false);
        let v: Verdict = serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb", "container_id": "c1",
            "container_name": "app", "pod": {"name": "p", "namespace": "ns", "uid": "u"},
            "policy": "restricted", "mode": "enforce", "decision": "reject",
            "findings": [
                {"rule": "vfio-remote", "severity": "error", "message": "remote GPU",
                 "expected": {"numa_nodes": [0]}, "observed": {"numa_nodes": [1]}},
                {"rule": "mems-mismatch", "severity": "error", "message": "remote memory",
                 "expected": {}, "observed": {}}
            ]
        }))
        .expect("verdict");
        log_verdict(&log, &v);
        let text = std::fs::read_to_string(&path).expect("log");
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .collect();
        assert_eq!(lines.len(), 2);
        let l = &lines[0];
        for key in [
            "ts",
            "level",
            "msg",
            "event",
            "rule",
            "severity",
            "operation",
            "decision",
            "sandbox_id",
            "container_id",
            "pod_name",
            "pod_namespace",
        ] {
            assert!(l.get(key).is_some(), "missing {key} in {l}");
        }
        assert_eq!(l["level"], "error");
        assert_eq!(l["rule"], "vfio-remote");
        assert_eq!(l["msg"], "remote GPU");
        assert_eq!(l["operation"], "update");
        assert_eq!(l["decision"], "reject");
        assert_eq!(l["pod_namespace"], "ns");
        // A log that cannot be opened is silently a no-op, never a panic.
        let nowhere = json_logger(Path::new("/nonexistent/dir/kt.log"), false);
        log_verdict(&nowhere, &v);
    }
}
