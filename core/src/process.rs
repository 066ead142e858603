//! Which process is which: a pid together with the process's start time, so that a process
//! that exited is never mistaken for a later one that got the same pid.
//!
//! Liveness is read from the process itself (`/proc/<pid>/stat`), never from its socket: an
//! exiting shim's listening socket still accepts connections into its backlog and answers
//! none of them.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::files::read_text_bounded;

/// A process: its pid and its start time (clock ticks after boot, `/proc/<pid>/stat` field 22).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: u32,
    /// When it started, in clock ticks after boot.
    pub start_time: u64,
}

/// `/proc/<pid>/stat` is one line; 4 KiB holds any of them (comm is at most 16 bytes).
const STAT_LIMIT: u64 = 4096;

impl ProcessId {
    /// The running process `pid` under a procfs root; `None` when there is none, or only its
    /// zombie (it exited and waits to be reaped).
    pub fn of(procfs: &Path, pid: u32) -> Option<Self> {
        if pid == 0 {
            return None;
        }
        let stat =
            read_text_bounded(&procfs.join(pid.to_string()).join("stat"), STAT_LIMIT).ok()?;
        let (state, start_time) = parse_stat(&stat)?;
        (!matches!(state, 'Z' | 'X')).then_some(Self { pid, start_time })
    }

    /// This process.
    pub fn current(procfs: &Path) -> Option<Self> {
        Self::of(procfs, std::process::id())
    }

    /// Whether this very process still runs.
    pub fn is_alive(&self, procfs: &Path) -> bool {
        Self::of(procfs, self.pid) == Some(*self)
    }
}

/// The state letter and the start time of a `stat` line. The command name (field 2) is in
/// parentheses and may itself hold spaces and parentheses: the fields after it start after
/// the last `)`.
fn parse_stat(line: &str) -> Option<(char, u64)> {
    let rest = &line[line.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4..=21 (ppid … itrealvalue) come before the start time (field 22).
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_this_process_and_tells_it_from_another() {
        let proc = Path::new("/proc");
        let me = ProcessId::current(proc).expect("this process");
        assert_eq!(me.pid, std::process::id());
        assert!(me.is_alive(proc));
        let reused = ProcessId {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.is_alive(proc), "same pid, another start time");
        assert_eq!(ProcessId::of(proc, 0), None);
    }

    #[test]
    fn a_reaped_child_is_gone_and_a_zombie_is_not_alive() {
        let proc = Path::new("/proc");
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        let id = ProcessId::of(proc, child.id()).expect("running child");
        assert!(id.is_alive(proc));
        child.kill().expect("kill");
        // Not reaped yet: a zombie, which is not alive.
        let gone = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            !id.is_alive(proc)
        });
        assert!(gone, "a killed child stops being alive before it is reaped");
        child.wait().expect("reap");
        assert_eq!(ProcessId::of(proc, id.pid), None);
    }

    #[test]
    fn parses_stat_lines_with_awkward_command_names() {
        let fields = (4..=21)
            .map(|n| n.to_string())
            .collect::<Vec<_>>()
            .join(" ");
        let line = format!("42 (a) b) (c) S {fields} 98765 23 24\n");
        assert_eq!(parse_stat(&line), Some(('S', 98765)));
        let zombie = format!("7 (x) Z {fields} 5 0\n");
        assert_eq!(parse_stat(&zombie), Some(('Z', 5)));
        for bad in ["", "42 (x", "42 (x) S 1 2", "42 (x) S a b c"] {
            assert_eq!(parse_stat(bad), None, "{bad:?}");
        }
    }
}
