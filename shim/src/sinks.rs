//! Where verdicts go: JSON log lines (slog), containerd events on `/kata-topo/mismatch`, and a
//! metrics seam. None of them can block or fail a request: the log ignores write errors (EPIPE,
//! ENOSPC), events go through a bounded queue to a publisher thread.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kata_topo::{Decision, Verdict};
use prost::Message;
use slog::{o, Drain, Level, Logger};

use crate::ttrpc::{Any, Client, Envelope, ForwardRequest, StringValue, Timestamp};

/// The event topic (a contract).
pub const TOPIC_MISMATCH: &str = "/kata-topo/mismatch";
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

/// Builds the JSON logger: `ts`, `level`, `msg` and the record's key-values, one object a line.
pub fn json_logger(path: &Path, also_stderr: bool) -> Logger {
    let file = OpenOptions::new().create(true).append(true).open(path);
    let mut sinks: Vec<Box<dyn Write + Send>> = Vec::new();
    if let Ok(f) = file {
        sinks.push(Box::new(Lenient(f)));
    }
    if also_stderr {
        sinks.push(Box::new(Lenient(std::io::stderr())));
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

/// The counters and histograms a later release writes for node-exporter; the wrapper calls it
/// for every verdict.
pub trait Metrics: Send + Sync {
    /// One check done.
    fn observe(&self, verdict: &Verdict, elapsed: Duration);
}

/// No metrics.
#[derive(Debug, Default)]
pub struct NoMetrics;

impl Metrics for NoMetrics {
    fn observe(&self, _: &Verdict, _: Duration) {}
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
                    if let Err(e) = publish(&address, &namespace, payload) {
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

/// Sends one event through `Events/Forward`.
pub fn publish(address: &str, namespace: &str, string_value: Vec<u8>) -> std::io::Result<()> {
    let timeout = Duration::from_secs(5);
    let mut client = Client::connect(address, timeout)?;
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
        timeout,
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
