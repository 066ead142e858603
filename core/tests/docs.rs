//! The README and `docs/`: every relative link leads to a file that exists and, with a
//! `#fragment`, to a heading of it; the README stays short enough to read first.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository's root.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace")
        .to_path_buf()
}

/// README.md and every `docs/*.md`.
fn documents() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root().join("README.md"));
    docs
}

/// The text outside fenced code blocks and inline code spans, where links are links.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push('\n');
            continue;
        }
        if !fenced {
            // Drop `code`: a backtick opens a span the next one closes.
            let mut in_code = false;
            for c in line.chars() {
                if c == '`' {
                    in_code = !in_code;
                } else if !in_code {
                    out.push(c);
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The targets of `[text](target)` links.
fn links(text: &str) -> Vec<String> {
    let prose = prose(text);
    let mut found = Vec::new();
    let mut rest = prose.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        if let Some(end) = after.find(')') {
            found.push(after[..end].trim().to_string());
            rest = &after[end..];
        } else {
            break;
        }
    }
    found
}

/// The anchors GitHub gives a document's headings: lower case, letters, digits, `-` and `_`
/// kept, spaces made `-`, the rest dropped; a repeated one gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#') else {
            continue;
        };
        if fenced {
            continue;
        }
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        let slug: String = heading
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while seen.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        seen.insert(unique);
    }
    seen
}

/// What is wrong with one link of `doc`, if anything.
fn broken(doc: &Path, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, fragment) = match target.split_once('#') {
        Some((p, f)) => (p, Some(f)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        doc.to_path_buf()
    } else {
        doc.parent().expect("a folder").join(path)
    };
    if !file.exists() {
        return Some(format!("{target}: no {}", file.display()));
    }
    let fragment = fragment?;
    if file.extension().is_none_or(|e| e != "md") {
        return Some(format!(
            "{target}: a fragment into a file that is not markdown"
        ));
    }
    let text = std::fs::read_to_string(&file).expect("read the linked document");
    let anchors = anchors(&text);
    (!anchors.contains(fragment)).then(|| {
        format!(
            "{target}: {} has no heading #{fragment} (its anchors: {anchors:?})",
            file.display()
        )
    })
}

#[test]
fn every_relative_link_resolves() {
    let mut bad = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(&doc).expect("read");
        for target in links(&text) {
            checked += 1;
            if let Some(why) = broken(&doc, &target) {
                bad.push(format!("{}: {why}", doc.display()));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: is the parser right?"
    );
    assert!(bad.is_empty(), "broken links:\n{}", bad.join("\n"));
}

#[test]
fn the_readme_is_at_most_200_lines_and_names_the_two_commands() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: move detail to docs/"
    );
    for command in ["make demo", "make test"] {
        assert!(readme.contains(command), "README.md names `{command}`");
    }
}

/// The parser itself: links in code are not links; anchors as GitHub makes them.
#[test]
fn links_and_anchors_are_read_as_github_reads_them() {
    let text = "# A `b`: c.d\n\n## A b c.d\n\n[x](y.md#z) `[no](link)`\n```\n[no](link)\n```\n[w\nv](#a-b-cd)\n";
    assert_eq!(links(text), ["y.md#z", "#a-b-cd"]);
    let anchors = anchors(text);
    assert!(
        anchors.contains("a-b-cd") && anchors.contains("a-b-cd-1"),
        "{anchors:?}"
    );
}
