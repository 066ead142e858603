//! The configurations the tests write, from the templates in `integration/templates/`: the
//! containerd configuration (`containerd.toml`), CRI-O's (`crio.conf`) and the wrapper's `[topology_guard]`
//! (`topology-guard.toml`). Scripts render the same files with `render.sh`, by the same rule
//! ([`render`]).

/// The containerd configuration template.
pub const CONTAINERD: &str = include_str!("../templates/containerd.toml");
/// The CRI-O configuration template.
pub const CRIO: &str = include_str!("../templates/crio.conf");
/// The `[topology_guard]` template.
pub const TOPOLOGY_GUARD: &str = include_str!("../templates/topology-guard.toml");

/// Whether `name` is a template name: `[A-Z][A-Z0-9_]*`.
fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// `template` with `values`, by `render.sh`'s rule: a line starting with `##` is dropped; a
/// line starting with `{{?NAME}}` (one or more) is kept, without them, only when each NAME is
/// given and not empty; `{{NAME}}` is NAME's value. A NAME not given where a value is needed,
/// and a value holding a double quote, a backslash or a newline, are errors naming it.
pub fn render(template: &str, values: &[(&str, &str)]) -> Result<String, String> {
    for (name, value) in values {
        if !is_name(name) {
            return Err(format!("{name}: not a name in [A-Z][A-Z0-9_]*"));
        }
        if value.contains(['"', '\\', '\n']) {
            return Err(format!(
                "{name}: a double quote, a backslash or a newline would break the TOML"
            ));
        }
    }
    let value = |name: &str| {
        values
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| *v)
    };
    let mut out = String::new();
    for line in template.lines() {
        if line.starts_with("##") {
            continue;
        }
        let mut line = line;
        let mut keep = true;
        while let Some((name, rest)) = line
            .strip_prefix("{{?")
            .and_then(|l| l.split_once("}}"))
            .filter(|(name, _)| is_name(name))
        {
            keep &= value(name).is_some_and(|v| !v.is_empty());
            line = rest;
        }
        if !keep {
            continue;
        }
        while let Some((before, rest)) = line.split_once("{{") {
            let Some((name, after)) = rest.split_once("}}").filter(|(n, _)| is_name(n)) else {
                return Err(format!("a malformed {{{{...}}}} in: {line}"));
            };
            let v = value(name).ok_or_else(|| format!("{name} is needed and was not given"))?;
            out.push_str(before);
            out.push_str(v);
            line = after;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A template's file name, its text, and the values to render it with.
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

    /// The Rust renderer and `render.sh` give the same text from each template.
    #[test]
    fn both_renderers_agree() {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/templates/render.sh");
        let cases: [Case<'_>; 4] = [
            (
                "containerd.toml",
                CONTAINERD,
                &[
                    ("V2", "1"),
                    ("ROOT", "/r"),
                    ("STATE", "/s"),
                    ("ADDRESS", "/a.sock"),
                    ("SANDBOX_IMAGE", "pause:1"),
                    ("CNI", "/cni"),
                    ("RUNC_BASE_SPEC", "/spec.json"),
                    ("DEBUG", ""),
                ],
            ),
            (
                "containerd.toml",
                CONTAINERD,
                &[
                    ("V3", "1"),
                    ("ROOT", "/r"),
                    ("STATE", "/s"),
                    ("ADDRESS", "/a.sock"),
                    ("SANDBOX_IMAGE", "pause:1"),
                    ("CNI", "/cni"),
                    ("SOCKET_DIR", "/sd"),
                    ("CONFIG_PATH", "/k.toml"),
                ],
            ),
            (
                "topology-guard.toml",
                TOPOLOGY_GUARD,
                &[
                    ("DELEGATE", "containerd-shim-runc-v2"),
                    ("MODE", "audit"),
                    ("POLICY", "restricted"),
                    ("SYSFS", "/sys"),
                    ("STATE_DIR", "/st"),
                    ("LOG_FILE", "/kt.log"),
                    ("FAIL_CLOSED", "false"),
                ],
            ),
            (
                "crio.conf",
                CRIO,
                &[
                    ("DIR", "/d"),
                    ("RUNC", "/runc"),
                    ("CONMON", "/conmon"),
                    ("PINNS", "/pinns"),
                    ("PAUSE_IMAGE", "pause:1"),
                    ("NRI_TIMEOUT", "1s"),
                ],
            ),
        ];
        for (file, template, values) in cases {
            let ours = render(template, values).expect("renders");
            let out = std::process::Command::new(script)
                .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/templates/").to_string() + file)
                .args(values.iter().map(|(n, v)| format!("{n}={v}")))
                .output()
                .expect("render.sh runs");
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert_eq!(String::from_utf8_lossy(&out.stdout), ours, "{file}");
            assert!(!ours.contains("{{"), "{ours}");
        }
        // Given empty, a conditional line goes; a value needed and not given is an error.
        let text = render(TOPOLOGY_GUARD, &cases[2].2[..6]).expect("renders");
        assert!(!text.contains("fail_closed"), "{text}");
        let e = render(TOPOLOGY_GUARD, &cases[2].2[1..]).expect_err("no DELEGATE");
        assert!(e.contains("DELEGATE"), "{e}");
        let e = render(TOPOLOGY_GUARD, &[("MODE", "a\"b")]).expect_err("a quote");
        assert!(e.contains("MODE"), "{e}");
    }
}
