//! journald's native protocol, sent without ever blocking: a full datagram queue drops the
//! entry and counts it.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::sync::Arc;

use slog::Level;

use crate::queue::{Drops, Sink};

/// journald's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// The syslog priority of a level (as slog-journald maps them: info is a notice).
pub fn priority(level: Level) -> u8 {
    match level {
        Level::Critical => 2,
        Level::Error => 3,
        Level::Warning => 4,
        Level::Info => 5,
        Level::Debug | Level::Trace => 7,
    }
}

/// A connection to journald.
#[derive(Debug)]
pub struct Journal {
    socket: UnixDatagram,
    drops: Arc<Drops>,
}

impl Journal {
    /// Connects to `socket` when it exists (journald runs).
    pub fn open(socket: &Path, drops: Arc<Drops>) -> Option<Self> {
        if !socket.exists() {
            return None;
        }
        let s = UnixDatagram::unbound().ok()?;
        s.connect(socket).ok()?;
        s.set_nonblocking(true).ok()?;
        Some(Self { socket: s, drops })
    }

    /// Sends one entry with `SYSLOG_IDENTIFIER=kata-topo` (node-problem-detector's journald
    /// source matches on it); the message is one line.
    pub fn send(&self, level: Level, message: &str) {
        let entry = format!(
            "SYSLOG_IDENTIFIER=kata-topo\nPRIORITY={}\nMESSAGE={}\n",
            priority(level),
            message.trim_end_matches('\n').replace('\n', " ")
        );
        if self.socket.send(entry.as_bytes()).is_err() {
            self.drops.add(Sink::Journald, 1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_carry_identifier_and_priority_and_a_full_queue_drops() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.sock");
        let server = UnixDatagram::bind(&path).expect("bind");
        let drops = Drops::new();
        let j = Journal::open(&path, drops.clone()).expect("open");
        j.send(Level::Info, "{\"msg\":\"a\"}\n");
        let mut buf = [0u8; 4096];
        let n = server.recv(&mut buf).expect("recv");
        let entry = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert_eq!(
            entry,
            "SYSLOG_IDENTIFIER=kata-topo\nPRIORITY=5\nMESSAGE={\"msg\":\"a\"}\n"
        );
        // Nobody reads: the socket's queue fills, and sending never blocks.
        for _ in 0..10_000 {
            j.send(Level::Error, "x");
        }
        assert!(drops.get(Sink::Journald) > 0);
        assert_eq!(priority(Level::Error), 3);
        assert_eq!(priority(Level::Warning), 4);
        assert!(Journal::open(&dir.path().join("none"), drops).is_none());
    }
}
