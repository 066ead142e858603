//! Upstream's label syntax (`k8s.io/apimachinery/pkg/util/validation`), as
//! `labels.NewRequirement` applies it to a `matchExpressions` requirement: its key must be a
//! qualified name and each of its values a label value. Each check says why a string is not
//! one, in upstream's terms.

/// A qualified name's name part, and a label value: at most this many characters.
const NAME_MAX: usize = 63;
/// A qualified name's prefix (a DNS-1123 subdomain): at most this many characters.
const SUBDOMAIN_MAX: usize = 253;

/// `[A-Za-z0-9]`.
fn alnum(c: u8) -> bool {
    c.is_ascii_alphanumeric()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]` over the whole of a non-empty `s`.
fn name_chars(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            alnum(first)
                && alnum(last)
                && b.iter()
                    .all(|&c| alnum(c) || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`: lowercase labels of
/// letters, digits and inner dashes, joined by single dots.
fn subdomain_chars(s: &str) -> bool {
    let lower = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    s.split('.').all(|label| {
        let b = label.as_bytes();
        match (b.first(), b.last()) {
            (Some(&first), Some(&last)) => {
                lower(first) && lower(last) && b.iter().all(|&c| lower(c) || c == b'-')
            }
            _ => false,
        }
    })
}

/// Upstream's `IsQualifiedName`: `[prefix/]name`, the prefix a DNS-1123 subdomain of at most
/// 253 characters, the name 1 to 63 characters of letters, digits, `-`, `_` and `.` that
/// begins and ends with a letter or digit.
pub(super) fn qualified_name(key: &str) -> Result<(), String> {
    let mut parts = key.split('/');
    let (prefix, name) = match (parts.next(), parts.next(), parts.next()) {
        (Some(name), None, _) => (None, name),
        (Some(prefix), Some(name), None) => (Some(prefix), name),
        _ => return Err(format!("key {key:?} has more than one '/'")),
    };
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            return Err(format!("key {key:?} has an empty prefix before its '/'"));
        }
        if prefix.len() > SUBDOMAIN_MAX {
            return Err(format!(
                "key {key:?} has a prefix of {} characters, more than {SUBDOMAIN_MAX}",
                prefix.len()
            ));
        }
        if !subdomain_chars(prefix) {
            return Err(format!(
                "key {key:?} has a prefix that is not a DNS subdomain (lowercase letters, digits, \
                 '-' and '.', beginning and ending with a letter or digit)"
            ));
        }
    }
    if name.is_empty() {
        return Err(format!("key {key:?} has an empty name"));
    }
    if name.len() > NAME_MAX {
        return Err(format!(
            "key {key:?} has a name of {} characters, more than {NAME_MAX}",
            name.len()
        ));
    }
    if !name_chars(name) {
        return Err(format!(
            "key {key:?} is not a qualified name (letters, digits, '-', '_' and '.', \
             beginning and ending with a letter or digit, after an optional DNS subdomain and '/')"
        ));
    }
    Ok(())
}

/// Upstream's `IsValidLabelValue`: empty, or at most 63 characters of letters, digits, `-`,
/// `_` and `.` that begin and end with a letter or digit.
pub(super) fn label_value(value: &str) -> Result<(), String> {
    if value.len() > NAME_MAX {
        return Err(format!(
            "value {value:?} has {} characters, more than {NAME_MAX}",
            value.len()
        ));
    }
    if !value.is_empty() && !name_chars(value) {
        return Err(format!(
            "value {value:?} is not a label value (letters, digits, '-', '_' and '.', beginning \
             and ending with a letter or digit)"
        ));
    }
    Ok(())
}
