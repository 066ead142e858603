//! Text from pods (annotations, names) shown to people: escaped so it cannot drive a terminal
//! or forge lines.
//!
//! A pod author controls its annotations, and they reach operators' terminals (`kata-topo
//! status`, `events`, `check`), node-problem-detector and the refusal message the kubelet
//! shows. [`printable`] is the one escaping function for all of these; JSON output needs none
//! (serde_json escapes control characters itself).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` is escaped by [`printable`]: control characters (C0, DEL, C1), the Unicode
/// bidirectional formatting characters (which reorder what a terminal shows: U+061C, U+200E,
/// U+200F, U+202A–U+202E, U+2066–U+2069) and the line and paragraph separators U+2028, U+2029.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}'
                | '\u{200e}'
                | '\u{200f}'
                | '\u{202a}'..='\u{202e}'
                | '\u{2028}'
                | '\u{2029}'
                | '\u{2066}'..='\u{2069}'
        )
}

/// `s` with every character [`needs_escape`] names written as an escape: `\n`, `\r`, `\t`,
/// else `\u{XX}` as Rust writes it (`\u{1b}`, `\u{202e}`). Everything else, backslashes
/// included, is kept, so escaping twice changes nothing and plain text is borrowed unchanged.
pub fn printable(s: &str) -> Cow<'_, str> {
    let Some(first) = s.find(needs_escape) else {
        return Cow::Borrowed(s);
    };
    let mut out = String::with_capacity(s.len() + 8);
    out.push_str(&s[..first]);
    for c in s[first..].chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// An error and its causes on one line, `outer: inner: root`, as people need it (an error's own
/// message never repeats its source).
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(cause) = next {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        next = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::hostile_text;
    use proptest::prelude::*;

    #[test]
    fn escapes_controls_and_bidi_overrides() {
        assert_eq!(printable("plain text, ünïcode ✓"), "plain text, ünïcode ✓");
        assert!(matches!(printable("plain"), Cow::Borrowed(_)));
        assert_eq!(
            printable("evil\u{1b}]0;owned\u{7}\nerror forged"),
            "evil\\u{1b}]0;owned\\u{7}\\nerror forged"
        );
        assert_eq!(
            printable("a\rb\tc\u{7f}d\u{9b}e"),
            "a\\rb\\tc\\u{7f}d\\u{9b}e"
        );
        assert_eq!(
            printable("x\u{202e}txt.exe\u{2066}y\u{2069}\u{2028}"),
            "x\\u{202e}txt.exe\\u{2066}y\\u{2069}\\u{2028}"
        );
        // Escapes are not escaped again, and a backslash stays itself.
        assert_eq!(printable("a\\nb"), "a\\nb");
        assert_eq!(printable(&printable("\u{1b}")), "\\u{1b}");
    }

    #[test]
    fn error_chain_names_every_cause() {
        let e = crate::host::sysfs::SysfsError::Io {
            path: "/sys/x/numa_node".into(),
            source: std::io::Error::other("is a FIFO, not a regular file"),
        };
        assert_eq!(
            error_chain(&e),
            "cannot read /sys/x/numa_node: is a FIFO, not a regular file"
        );
    }

    proptest! {
        #[test]
        fn output_has_no_character_that_needs_escaping(s in hostile_text(64)) {
            let shown = printable(&s);
            prop_assert!(!shown.chars().any(needs_escape), "{:?}", shown);
            prop_assert!(!shown.contains('\n'));
            // Idempotent, and the identity on text that needs nothing.
            prop_assert_eq!(printable(&shown), shown.clone());
            if !s.chars().any(needs_escape) {
                prop_assert_eq!(shown, Cow::Borrowed(s.as_str()));
            }
        }

        #[test]
        fn escaping_can_be_undone(s in hostile_text(64)) {
            // What was escaped is exactly recoverable (no two inputs show the same unless the
            // input itself held what looks like an escape).
            let s: String = s.chars().filter(|&c| c != '\\').collect();
            let shown = printable(&s).into_owned();
            prop_assert_eq!(unescape(&shown), s);
        }
    }

    fn unescape(s: &str) -> String {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find('\\') {
            out.push_str(&rest[..i]);
            rest = &rest[i + 1..];
            match rest.as_bytes()[0] {
                b'n' => out.push('\n'),
                b'r' => out.push('\r'),
                b't' => out.push('\t'),
                _ => {
                    let end = rest.find('}').expect("closing brace");
                    let code = u32::from_str_radix(&rest[2..end], 16).expect("hex");
                    out.push(char::from_u32(code).expect("char"));
                    rest = &rest[end..];
                }
            }
            rest = &rest[1..];
        }
        out.push_str(rest);
        out
    }
}
