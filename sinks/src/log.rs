//! JSON log lines: one object per line — `ts`, `level`, `msg`, then the record's fields, a
//! finding's `expected` and `observed` as nested objects — to the log file and to journald
//! where it runs.
//!
//! The line is rendered on the caller's thread (memory only) and handed to the file's writer
//! thread through a bounded queue; journald gets it with a non-blocking send. A FIFO nobody
//! reads, a full disk or a hung filesystem costs lines, counted and reported in a line once
//! writing works again — never a caller's time.
//!
//! The file is created 0640, never through a symlink, and reopened by its path — directory
//! included — when it was rotated (its path names another inode, or nothing, checked at most
//! once a second) or when [`Log::reopen`] is called (the daemon does on SIGHUP). logrotate therefore needs neither `copytruncate` nor a
//! signal; a signal makes the switch immediate.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kata_topo_core::files::{identity, Dir};
use kata_topo_core::{Decision, Verdict};
use serde_json::Value;
use slog::{Drain, Key, Level, Logger, OwnedKVList, Record, KV};

use crate::journal::Journal;
use crate::queue::{Drops, Lane, Sink};

/// How many lines wait for the writer at most.
const QUEUE: usize = 1024;
/// How often the writer checks whether the file was rotated.
const ROTATION_CHECK: Duration = Duration::from_secs(1);
/// The log file's mode.
const MODE: u32 = 0o640;

/// RFC 3339 UTC with microseconds (`2026-11-30T05:36:25.598066Z`): node-problem-detector's
/// filelog monitor parses it with `2006-01-02T15:04:05.999999Z07:00`.
pub fn rfc3339(t: SystemTime) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
    );
    time::OffsetDateTime::from(t)
        .format(FORMAT)
        .unwrap_or_default()
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

/// A record's fields, as slog hands them over.
#[derive(Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn push(&mut self, key: Key, value: Value) -> slog::Result {
        self.0.push((key.to_string(), value));
        Ok(())
    }
}

impl slog::Serializer for Fields {
    fn emit_arguments(&mut self, key: Key, val: &std::fmt::Arguments<'_>) -> slog::Result {
        self.push(key, Value::String(val.to_string()))
    }
    fn emit_str(&mut self, key: Key, val: &str) -> slog::Result {
        self.push(key, Value::String(val.to_string()))
    }
    fn emit_bool(&mut self, key: Key, val: bool) -> slog::Result {
        self.push(key, Value::Bool(val))
    }
    fn emit_u64(&mut self, key: Key, val: u64) -> slog::Result {
        self.push(key, val.into())
    }
    fn emit_i64(&mut self, key: Key, val: i64) -> slog::Result {
        self.push(key, val.into())
    }
    fn emit_u32(&mut self, key: Key, val: u32) -> slog::Result {
        self.push(key, val.into())
    }
    fn emit_i32(&mut self, key: Key, val: i32) -> slog::Result {
        self.push(key, val.into())
    }
    fn emit_f64(&mut self, key: Key, val: f64) -> slog::Result {
        self.push(key, val.into())
    }
    fn emit_none(&mut self, key: Key) -> slog::Result {
        self.push(key, Value::Null)
    }
    fn emit_unit(&mut self, key: Key) -> slog::Result {
        self.push(key, Value::Null)
    }
    fn emit_serde(&mut self, key: Key, value: &dyn slog::SerdeValue) -> slog::Result {
        let v = serde_json::to_value(value.as_serde()).unwrap_or(Value::Null);
        self.push(key, v)
    }
}

/// Renders one line: `ts`, `level`, `msg`, then `event` and `rule` (so patterns can anchor
/// on them), then the other fields once each, the record's before the logger's.
fn render(record: &Record<'_>, values: &OwnedKVList) -> String {
    // slog hands each list over last field first: put them back in the order written.
    let mut own = Fields::default();
    let _ = record.kv().serialize(record, &mut own);
    let mut context = Fields::default();
    let _ = values.serialize(record, &mut context);
    let mut fields = Fields::default();
    fields.0.extend(own.0.into_iter().rev());
    fields.0.extend(context.0.into_iter().rev());
    let mut out = serde_json::Map::new();
    out.insert("ts".into(), rfc3339(SystemTime::now()).into());
    out.insert("level".into(), level_name(record.level()).into());
    out.insert("msg".into(), record.msg().to_string().into());
    let mut rest = Vec::with_capacity(fields.0.len());
    for key in ["event", "rule"] {
        if let Some(i) = fields.0.iter().position(|(k, _)| k == key) {
            rest.push(fields.0.remove(i));
        }
    }
    rest.extend(fields.0);
    let mut line = String::with_capacity(256);
    line.push('{');
    let reserved = ["ts", "level", "msg"];
    let mut seen: Vec<String> = Vec::new();
    let head = reserved
        .iter()
        .filter_map(|k| out.get(*k).map(|v| (k.to_string(), v.clone())));
    for (k, v) in head.chain(
        rest.into_iter()
            .filter(|(k, _)| !reserved.contains(&k.as_str())),
    ) {
        if seen.contains(&k) {
            continue;
        }
        if !seen.is_empty() {
            line.push(',');
        }
        line.push_str(&Value::String(k.clone()).to_string());
        line.push(':');
        line.push_str(&v.to_string());
        seen.push(k);
    }
    line.push_str("}\n");
    line
}

/// The drain: renders on the caller's thread, queues for the file, sends to journald.
struct LineDrain {
    lane: Arc<Lane<Vec<u8>>>,
    journal: Option<Journal>,
    min_level: Level,
}

impl Drain for LineDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &Record<'_>, values: &OwnedKVList) -> Result<(), slog::Never> {
        if !record.level().is_at_least(self.min_level) {
            return Ok(());
        }
        let line = render(record, values);
        if let Some(j) = &self.journal {
            j.send(record.level(), &line);
        }
        self.lane.push(line.into_bytes());
        Ok(())
    }
}

/// The writer thread's end: the file, reopened when rotated or asked to.
struct FileWriter {
    dir_path: PathBuf,
    name: String,
    file: Option<(File, (u64, u64))>,
    checked: Instant,
    reopen: Arc<AtomicBool>,
    drops: Arc<Drops>,
    reported: [u64; crate::queue::SINKS],
    /// The last write stopped in the middle of a line.
    broken_line: bool,
}

impl FileWriter {
    fn new(path: &Path, reopen: Arc<AtomicBool>, drops: Arc<Drops>) -> Self {
        let dir_path = path.parent().map(Path::to_path_buf).unwrap_or_default();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        // Opened by the writer thread at its first line: a hung filesystem must not hold up
        // whoever creates the logger.
        reopen.store(true, Ordering::Relaxed);
        Self {
            dir_path,
            name,
            file: None,
            checked: Instant::now(),
            reopen,
            drops,
            reported: [0; crate::queue::SINKS],
            broken_line: false,
        }
    }

    /// Opens the file by its path: the directory too, so a directory rotated away (moved, a
    /// new one made in its place) is left for the new one.
    fn open(&mut self, dir: Option<Dir>) {
        self.checked = Instant::now();
        let dir = dir.or_else(|| Dir::open(&self.dir_path).ok());
        self.file = dir.as_ref().and_then(|d| {
            let f = d.open_append(&self.name, MODE).ok()?;
            let id = identity(&f).ok()?;
            Some((f, id))
        });
    }

    /// Reopens when asked to, when the file (or its directory) was rotated away, or (once a
    /// second) when it could not be opened before.
    fn check(&mut self) {
        if self.reopen.swap(false, Ordering::Relaxed) {
            return self.open(None);
        }
        if self.checked.elapsed() < ROTATION_CHECK {
            return;
        }
        self.checked = Instant::now();
        // What the path names now, looked up from the top.
        let dir = Dir::open(&self.dir_path).ok();
        let current = dir
            .as_ref()
            .and_then(|d| d.identity(&self.name).ok().flatten());
        match (&self.file, current) {
            (Some((_, id)), Some(now)) if *id == now => {}
            _ => self.open(dir),
        }
    }

    fn write(&mut self, line: &[u8]) -> bool {
        self.check();
        let Some((file, _)) = &mut self.file else {
            return false;
        };
        let mut bytes = Vec::with_capacity(line.len() + 1);
        if self.broken_line {
            bytes.push(b'\n');
        }
        bytes.extend_from_slice(line);
        let mut done = 0;
        while done < bytes.len() {
            match file.write(&bytes[done..]) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        self.broken_line = done > 0 && done < bytes.len();
        done == bytes.len()
    }

    /// Writes a line, and first one per sink that dropped something since the last report.
    fn handle(&mut self, line: Vec<u8>) {
        let now = self.drops.snapshot();
        for (i, sink) in Sink::ALL.iter().enumerate() {
            if now[i] > self.reported[i] {
                let note = serde_json::json!({
                    "ts": rfc3339(SystemTime::now()),
                    "level": "warn",
                    "msg": format!("kata-topo dropped {} {} item(s) it could not write in time", now[i] - self.reported[i], sink.name()),
                    "event": "sink-dropped",
                    "sink": sink.name(),
                    "dropped": now[i] - self.reported[i],
                    "dropped_total": now[i],
                });
                if self.write(format!("{note}\n").as_bytes()) {
                    self.reported[i] = now[i];
                }
            }
        }
        if !self.write(&line) {
            self.drops.add(Sink::Log, 1);
        }
    }
}

/// The logger of a wrapper daemon or a hook, with its writer.
#[derive(Clone)]
pub struct Log {
    logger: Logger,
    lane: Arc<Lane<Vec<u8>>>,
    reopen: Arc<AtomicBool>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log").finish_non_exhaustive()
    }
}

impl Log {
    /// Logs to `path` (and journald at [`crate::journal::SOCKET`] when it runs), at `info` and
    /// above, or `debug` and above when `debug`.
    pub fn open(path: &Path, debug: bool, drops: Arc<Drops>) -> Self {
        Self::with_journal(
            path,
            debug,
            Journal::open(Path::new(crate::journal::SOCKET), drops.clone()),
            drops,
        )
    }

    /// [`Log::open`] with a given journald connection (or none).
    pub fn with_journal(
        path: &Path,
        debug: bool,
        journal: Option<Journal>,
        drops: Arc<Drops>,
    ) -> Self {
        let reopen = Arc::new(AtomicBool::new(false));
        let mut writer = FileWriter::new(path, reopen.clone(), drops.clone());
        let lane = Arc::new(Lane::start("log", QUEUE, Sink::Log, drops, move |line| {
            writer.handle(line)
        }));
        let drain = LineDrain {
            lane: lane.clone(),
            journal,
            min_level: if debug { Level::Debug } else { Level::Info },
        };
        Self {
            logger: Logger::root(drain.fuse(), slog::o!()),
            lane,
            reopen,
        }
    }

    pub fn logger(&self) -> &Logger {
        &self.logger
    }

    /// Reopens the file before the next line (after a rotation; the daemon calls it on SIGHUP).
    pub fn reopen(&self) {
        self.reopen.store(true, Ordering::Relaxed);
    }

    /// Waits until every line logged so far was written, or `deadline` passed.
    pub fn flush(&self, deadline: Instant) -> bool {
        self.lane.flush(deadline)
    }
}

/// Writes one line per finding of a verdict: at `warn` when the request went through, at
/// `error` when it was refused.
pub fn log_verdict(log: &Logger, v: &Verdict) {
    let s = |o: &Option<String>| o.clone().unwrap_or_default();
    for f in &v.findings {
        let kv = slog::o!(
            "event" => "finding",
            "rule" => f.rule.id(),
            "severity" => f.severity.to_string(),
            "operation" => v.operation.to_string(),
            "class" => v.class.map(|c| c.to_string()),
            "decision" => v.decision().to_string(),
            "policy" => v.policy.to_string(),
            "mode" => v.mode.to_string(),
            "sandbox_id" => s(&v.sandbox_id),
            "container_id" => s(&v.container_id),
            "container_name" => s(&v.container_name),
            "pod_name" => s(&v.pod.name),
            "pod_namespace" => s(&v.pod.namespace),
            "pod_uid" => s(&v.pod.uid),
            "intent_source" => v.intent_source.to_string(),
            "kubelet" => v.kubelet.clone().map(slog::Serde),
            "expected" => slog::Serde(f.expected.clone()),
            "observed" => slog::Serde(f.observed.clone()),
        );
        let child = log.new(kv);
        match v.decision() {
            Decision::Reject => slog::error!(child, "{}", f.message),
            Decision::Allow => slog::warn!(child, "{}", f.message),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(decision: &str) -> Verdict {
        serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb", "container_id": "c1",
            "container_name": "app", "pod": {"name": "p", "namespace": "ns", "uid": "u"},
            "policy": "restricted", "mode": "enforce", "decision": decision,
            "intent_source": "kubelet", "kubelet": {"cpus": "1", "numa_nodes": "1"},
            "findings": [
                {"rule": "vfio-remote", "severity": "error", "message": "remote GPU\n\u{1b}[2J",
                 "expected": {"numa_nodes": [0]}, "observed": {"numa_nodes": [1]}},
                {"rule": "mems-mismatch", "severity": "error", "message": "remote memory",
                 "expected": {}, "observed": {}}
            ]
        }))
        .expect("verdict")
    }

    fn lines(path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("each line is JSON"))
            .collect()
    }

    #[test]
    fn one_json_line_per_finding_with_nested_expected_and_observed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kt.log");
        let log = Log::with_journal(&path, false, None, Drops::new());
        log_verdict(log.logger(), &verdict("reject"));
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        let text = std::fs::read_to_string(&path).expect("log");
        let first = text.lines().next().expect("a line");
        assert!(
            first.starts_with("{\"ts\":\"") && first.contains("\"level\":\"error\",\"msg\":\"remote GPU\\n\\u001b[2J\",\"event\":\"finding\",\"rule\":\"vfio-remote\","),
            "{first}"
        );
        let l = lines(&path);
        assert_eq!(l.len(), 2);
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
            "intent_source",
        ] {
            assert!(l[0].get(key).is_some(), "missing {key} in {}", l[0]);
        }
        assert_eq!(l[0]["expected"], serde_json::json!({"numa_nodes": [0]}));
        assert_eq!(l[0]["observed"], serde_json::json!({"numa_nodes": [1]}));
        assert_eq!(l[0]["class"], "cpuset");
        assert_eq!(l[0]["intent_source"], "kubelet");
        assert_eq!(
            l[0]["kubelet"],
            serde_json::json!({"cpus": "1", "numa_nodes": "1"})
        );
        assert_eq!(l[1]["rule"], "mems-mismatch");
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&path).expect("meta").permissions(),
        );
        assert_eq!(mode & 0o777, 0o640);
    }

    #[test]
    fn timestamps_are_utc_with_microseconds() {
        use std::time::UNIX_EPOCH;
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000) + Duration::from_nanos(123_456_789);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400);
        assert!(rfc3339(leap).starts_with("2000-02-29T00:00:00"));
    }

    #[test]
    fn info_lines_need_no_fields_and_debug_lines_need_debug() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kt.log");
        let log = Log::with_journal(&path, false, None, Drops::new());
        slog::info!(log.logger(), "started"; "event" => "daemon-started", "pid" => 7u32);
        slog::debug!(log.logger(), "noise");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        let l = lines(&path);
        assert_eq!(l.len(), 1, "{l:?}");
        assert_eq!(l[0]["event"], "daemon-started");
        assert_eq!(l[0]["pid"], 7);
        assert_eq!(l[0]["level"], "info");
    }

    #[test]
    fn a_rotated_file_is_reopened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kt.log");
        let log = Log::with_journal(&path, false, None, Drops::new());
        slog::info!(log.logger(), "one");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        std::fs::rename(&path, dir.path().join("kt.log.1")).expect("rotate");
        log.reopen();
        slog::info!(log.logger(), "two");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(lines(&dir.path().join("kt.log.1"))[0]["msg"], "one");
        assert_eq!(lines(&path)[0]["msg"], "two");
        // Without a signal, within a second or so.
        std::fs::rename(&path, dir.path().join("kt.log.2")).expect("rotate");
        std::thread::sleep(ROTATION_CHECK + Duration::from_millis(100));
        slog::info!(log.logger(), "three");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(lines(&path)[0]["msg"], "three");
    }

    #[test]
    fn a_rotated_directory_is_followed_to_the_new_one() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("kata-topo");
        std::fs::create_dir(&dir).expect("dir");
        let path = dir.join("kt.log");
        let log = Log::with_journal(&path, false, None, Drops::new());
        slog::info!(log.logger(), "one");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        // The whole directory rotated away and a new one made in its place.
        let old = root.path().join("kata-topo.1");
        std::fs::rename(&dir, &old).expect("rotate the directory");
        std::fs::create_dir(&dir).expect("new dir");
        log.reopen();
        slog::info!(log.logger(), "two");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        let msgs = |p: &Path| -> Vec<Value> { lines(p).iter().map(|l| l["msg"].clone()).collect() };
        assert_eq!(msgs(&old.join("kt.log")), ["one"]);
        assert_eq!(msgs(&path), ["two"], "SIGHUP writes into the new directory");
        // Without a signal, within a second or so.
        let older = root.path().join("kata-topo.2");
        std::fs::rename(&dir, &older).expect("rotate again");
        std::fs::create_dir(&dir).expect("newer dir");
        std::thread::sleep(ROTATION_CHECK + Duration::from_millis(100));
        slog::info!(log.logger(), "three");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(msgs(&older.join("kt.log")), ["two"]);
        assert_eq!(msgs(&path), ["three"]);
    }

    #[test]
    fn a_symlink_at_the_log_path_is_never_written_through() {
        let dir = tempfile::tempdir().expect("tempdir");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let path = dir.path().join("kt.log");
        std::os::unix::fs::symlink(&victim, &path).expect("plant");
        let drops = Drops::new();
        let log = Log::with_journal(&path, false, None, drops.clone());
        slog::info!(log.logger(), "hello");
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(drops.get(Sink::Log), 1, "the line was dropped and counted");
    }

    #[test]
    fn a_fifo_nobody_reads_costs_lines_not_time() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kt.fifo");
        nix::unistd::mkfifo(&path, nix::sys::stat::Mode::from_bits_truncate(0o600))
            .expect("mkfifo");
        // A reader that holds the FIFO open and never reads.
        let _held = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .expect("hold");
        let drops = Drops::new();
        let log = Log::with_journal(&path, false, None, drops.clone());
        let logger = log.logger().clone();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for i in 0..5_000 {
                slog::warn!(logger, "finding {}", i; "event" => "finding", "rule" => "vfio-remote");
            }
            let _ = done_tx.send(());
        });
        // A hang guard, not a timing: every call returns.
        assert!(
            done_rx.recv_timeout(Duration::from_secs(60)).is_ok(),
            "logging blocked on a FIFO nobody reads"
        );
        // The pipe holds what fits; the rest was dropped and counted.
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        assert!(drops.get(Sink::Log) > 1_000, "{}", drops.get(Sink::Log));
    }
}
