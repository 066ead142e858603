//! The plugin's log: one JSON object per line on stderr — `ts`, `level`, `msg`, `event`, then
//! the line's fields — the same shape as the wrapper's log lines. Under systemd stderr goes to
//! the journal, in a DaemonSet to the container's log; the plugin keeps no file of its own, so
//! it needs neither rotation nor the wrapper's writer thread. A closed or full stderr costs the
//! line, never the plugin.

use std::io::Write;
use std::sync::{Arc, Mutex};

use serde_json::{Map, Value};
use time::macros::format_description;
use time::OffsetDateTime;

/// Where lines go.
#[derive(Debug, Clone)]
pub struct Log {
    target: Target,
}

#[derive(Debug, Clone)]
enum Target {
    Stderr,
    Memory(Arc<Mutex<Vec<Value>>>),
}

impl Log {
    /// Lines to stderr.
    pub fn stderr() -> Self {
        Self {
            target: Target::Stderr,
        }
    }

    /// Lines kept in memory, for tests: [`Log::lines`] returns them.
    pub fn memory() -> Self {
        Self {
            target: Target::Memory(Arc::default()),
        }
    }

    /// The lines kept so far (none for stderr).
    pub fn lines(&self) -> Vec<Value> {
        match &self.target {
            Target::Stderr => Vec::new(),
            Target::Memory(lines) => lines.lock().map(|l| l.clone()).unwrap_or_default(),
        }
    }

    /// An `info` line.
    pub fn info(&self, event: &str, msg: &str, fields: Value) {
        self.line("info", event, msg, fields);
    }

    /// A `warn` line.
    pub fn warn(&self, event: &str, msg: &str, fields: Value) {
        self.line("warn", event, msg, fields);
    }

    /// An `error` line.
    pub fn error(&self, event: &str, msg: &str, fields: Value) {
        self.line("error", event, msg, fields);
    }

    fn line(&self, level: &str, event: &str, msg: &str, fields: Value) {
        let ts = OffsetDateTime::now_utc()
            .format(format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
            ))
            .unwrap_or_default();
        let mut obj = Map::new();
        obj.insert("ts".into(), ts.into());
        obj.insert("level".into(), level.into());
        obj.insert("msg".into(), msg.into());
        obj.insert("event".into(), event.into());
        if let Value::Object(fields) = fields {
            for (k, v) in fields {
                obj.entry(k).or_insert(v);
            }
        }
        let value = Value::Object(obj);
        match &self.target {
            Target::Stderr => {
                let mut text = value.to_string();
                text.push('\n');
                let _ = std::io::stderr().lock().write_all(text.as_bytes());
            }
            Target::Memory(lines) => {
                if let Ok(mut lines) = lines.lock() {
                    lines.push(value);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn lines_carry_the_fixed_fields_first_and_never_let_a_field_replace_them() {
        let log = Log::memory();
        log.warn(
            "register-failed",
            "cannot register",
            json!({"socket": "/x/kubelet.sock", "msg": "spoofed"}),
        );
        let lines = log.lines();
        assert_eq!(lines.len(), 1);
        let l = &lines[0];
        assert_eq!(l["level"], "warn");
        assert_eq!(l["event"], "register-failed");
        assert_eq!(l["msg"], "cannot register");
        assert_eq!(l["socket"], "/x/kubelet.sock");
        let ts = l["ts"].as_str().unwrap_or_default();
        assert!(ts.ends_with('Z') && ts.len() == 27, "{ts}");
    }
}
