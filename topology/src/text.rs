//! Text for people: what a pod author controls (annotations, names, messages quoting them)
//! never reaches a terminal, node-problem-detector or the kubelet as raw control characters.

use std::borrow::Cow;
use std::fmt::Write as _;

/// Whether a character must not reach a terminal as it is: C0 and C1 controls, DEL, and the
/// Unicode bidirectional overrides and isolates that reorder what a reader sees.
fn hidden(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every such character escaped (`\n`, `\t`, `\u{1b}`); `s` itself when it has none.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(hidden) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if hidden(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_what_a_terminal_would_act_on() {
        assert!(matches!(printable("trainer-pod"), Cow::Borrowed(_)));
        assert_eq!(printable("a\nb\tc\r"), "a\\nb\\tc\\r");
        assert_eq!(printable("\u{1b}[2J"), "\\u{1b}[2J");
        assert_eq!(printable("\u{7f}\u{85}"), "\\u{7f}\\u{85}");
        assert_eq!(printable("x\u{202e}y\u{2066}"), "x\\u{202e}y\\u{2066}");
        assert_eq!(printable("ünïcødé ✓"), "ünïcødé ✓");
    }
}
