//! The README and `docs/`: every relative link leads to a file that exists and, with a
//! `#fragment`, to a heading of it; the README stays short enough to read first; every file
//! and folder the code map (`docs/code-map.md`) names exists, and it names every crate.

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

/// The `code` spans of a document outside fenced blocks.
fn code_spans(text: &str) -> Vec<String> {
    let mut spans = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(span), Some(_)) = (parts.next(), parts.next()) {
            spans.push(span.to_string());
        }
    }
    spans
}

/// The spans that name a path of the repository: they start with one of its top-level
/// entries (`core/`, `Makefile`, `configuration-kata.toml`, ...) and hold no space.
fn repository_paths(spans: &[String]) -> Vec<String> {
    let top: BTreeSet<String> = std::fs::read_dir(root())
        .expect("the workspace")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect();
    spans
        .iter()
        .filter(|s| !s.contains(' ') && !s.contains("::"))
        .filter(|s| {
            let first = s.split('/').next().unwrap_or_default();
            top.contains(first) && (s.contains('/') || s.contains('.') || first == "Makefile")
        })
        .cloned()
        .collect()
}

#[test]
fn the_code_map_names_files_that_exist_and_every_crate() {
    let map = std::fs::read_to_string(root().join("docs/code-map.md")).expect("docs/code-map.md");
    let named = repository_paths(&code_spans(&map));
    assert!(
        named.len() > 80,
        "only {} paths found in docs/code-map.md: is the parser right?",
        named.len()
    );
    let missing: Vec<&String> = named
        .iter()
        .filter(|p| !root().join(p.trim_end_matches('/')).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/code-map.md names what does not exist (moved? renamed?): {missing:?}"
    );
    let manifest =
        std::fs::read_to_string(root().join("Cargo.toml")).expect("the workspace's Cargo.toml");
    let members = manifest
        .split("members = [")
        .nth(1)
        .and_then(|m| m.split(']').next())
        .expect("workspace members");
    for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
        if member.is_empty() {
            continue;
        }
        assert!(
            named.iter().any(|p| p.trim_end_matches('/') == member),
            "docs/code-map.md does not name the crate `{member}/`"
        );
    }
}

/// The code map's parser: spans in fenced blocks are not read; only repository paths count.
#[test]
fn code_spans_and_paths_are_read_as_written() {
    let text = "`core/src/lib.rs` and `kata-topo.io/policy`, `core/` `Makefile`\n```\n`shim/x`\n```\n`a b/c` `core::check`\n";
    let spans = code_spans(text);
    assert_eq!(
        spans,
        [
            "core/src/lib.rs",
            "kata-topo.io/policy",
            "core/",
            "Makefile",
            "a b/c",
            "core::check"
        ]
    );
    assert_eq!(
        repository_paths(&spans),
        ["core/src/lib.rs", "core/", "Makefile"]
    );
}
