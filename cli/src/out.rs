//! Standard output for the subcommands: every write is checked, and what people read is
//! escaped.
//!
//! `println!` panics when standard output is a closed pipe or a full disk; here a failed write
//! is a [`StdoutGone`] error that ends the command quietly with exit code 2 (a closed pipe
//! prints nothing; any other failure one line on stderr). Human-readable text goes through
//! [`printable`] line by line, so nothing a pod controls (annotations, names, messages) can add
//! a line or drive the terminal; JSON is written as serde_json made it.

use std::fmt;
use std::io::{self, Write};

use kata_topo_core::text::printable;

/// Standard output could not be written (a closed pipe, a full disk).
#[derive(Debug)]
pub(crate) struct StdoutGone(pub(crate) io::Error);

impl fmt::Display for StdoutGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cannot write to standard output: {}", self.0)
    }
}

impl std::error::Error for StdoutGone {}

impl StdoutGone {
    /// Whether the reader went away (`kata-topo status | head -1`): nothing worth saying.
    pub(crate) fn is_closed_pipe(&self) -> bool {
        self.0.kind() == io::ErrorKind::BrokenPipe
    }
}

/// Writes `text` as it is and flushes, so a failure shows now and not at exit.
fn write_raw(text: &str) -> Result<(), StdoutGone> {
    let mut out = io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(StdoutGone)
}

/// One JSON document and a newline.
pub(crate) fn json(text: &str) -> Result<(), StdoutGone> {
    write_raw(&format!("{text}\n"))
}

/// One line for people: the whole of `line` is escaped, newlines in it included, so it stays
/// one line whatever its values hold.
pub(crate) fn line(line: &str) -> Result<(), StdoutGone> {
    write_raw(&format!("{}\n", printable(line)))
}

/// Several lines for people, whose newlines the caller placed (values inside must be escaped
/// already, as [`kata_topo_core::Verdict::human`] does); each line is escaped again on its own.
pub(crate) fn lines(text: &str) -> Result<(), StdoutGone> {
    if text.is_empty() {
        return Ok(());
    }
    let mut shown = String::with_capacity(text.len());
    // Not `str::lines`: it would drop a carriage return before a newline instead of showing it.
    for l in text.strip_suffix('\n').unwrap_or(text).split('\n') {
        shown.push_str(&printable(l));
        shown.push('\n');
    }
    write_raw(&shown)
}

/// `println!` for human output: formats one line, escapes it, writes it, and returns from
/// the enclosing function with the error when standard output is gone.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::out::line(&format!($($arg)*))?
    };
}
pub(crate) use outln;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_pipe_is_told_apart() {
        assert!(StdoutGone(io::Error::from(io::ErrorKind::BrokenPipe)).is_closed_pipe());
        let full = StdoutGone(io::Error::from_raw_os_error(28));
        assert!(!full.is_closed_pipe());
        assert!(full
            .to_string()
            .starts_with("cannot write to standard output: "));
    }
}
