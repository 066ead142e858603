//! The alerts and the dashboard of `deploy/`: every rules file passes `promtool check rules`,
//! the alerts fire and stay quiet as `integration/prometheus/*.test.yaml` says
//! (`promtool test rules`), the PrometheusRule holds the plain file's groups, and every metric
//! (and label) an alert or a dashboard panel queries is one the wrapper's metrics code writes.
//!
//! promtool is `KT_PROMTOOL`, else the one `tools/promtool.sh` (make promtool) takes out of
//! Debian's `prometheus` package: without apt's package these tests fail, they never skip.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use kata_topo_core::{Decision, Rule, Severity, Verdict};
use kata_topo_integration::workspace;
use kata_topo_sinks::{Drops, Metrics, Sink};
use serde_json::Value;

fn promtool() -> &'static Path {
    static PROMTOOL: OnceLock<PathBuf> = OnceLock::new();
    PROMTOOL.get_or_init(|| {
        if let Some(p) = std::env::var_os("KT_PROMTOOL") {
            assert!(!p.is_empty(), "KT_PROMTOOL is empty");
            return PathBuf::from(p);
        }
        let out = Command::new("bash")
            .arg(workspace().join("tools/promtool.sh"))
            .stderr(Stdio::inherit())
            .output()
            .expect("bash");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "no promtool (make promtool): {stdout}"
        );
        PathBuf::from(stdout.lines().last().expect("the path of promtool").trim())
    })
}

fn promtool_run(args: &[&std::ffi::OsStr]) -> String {
    let out = Command::new(promtool())
        .args(args)
        .output()
        .expect("run promtool");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?}:\n{text}");
    text
}

fn yaml(path: &Path) -> serde_yaml::Value {
    serde_yaml::from_str(&std::fs::read_to_string(path).expect("read")).expect("YAML")
}

/// Every file of `deploy/prometheus/`, as a plain rules document (a PrometheusRule's `spec`).
fn rule_docs() -> Vec<(PathBuf, serde_yaml::Value)> {
    let mut docs: Vec<_> = std::fs::read_dir(workspace().join("deploy/prometheus"))
        .expect("deploy/prometheus")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .map(|p| {
            let doc = yaml(&p);
            let doc = if doc["kind"].as_str() == Some("PrometheusRule") {
                assert_eq!(
                    doc["apiVersion"].as_str(),
                    Some("monitoring.coreos.com/v1"),
                    "{}",
                    p.display()
                );
                doc["spec"].clone()
            } else {
                doc
            };
            (p, doc)
        })
        .collect();
    docs.sort_by(|a, b| a.0.cmp(&b.0));
    docs
}

fn rules(doc: &serde_yaml::Value) -> Vec<serde_yaml::Value> {
    doc["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").clone())
        .collect()
}

#[test]
fn every_rules_file_passes_promtool_check_rules() {
    let docs = rule_docs();
    assert!(
        docs.len() >= 2,
        "the plain file and the PrometheusRule: {docs:?}"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    for (path, doc) in &docs {
        // A PrometheusRule is checked as the rules file the operator makes of its spec.
        let plain = if yaml(path)["kind"].as_str() == Some("PrometheusRule") {
            let plain = dir
                .path()
                .join(path.file_name().expect("file name"))
                .with_extension("rules.yaml");
            std::fs::write(&plain, serde_yaml::to_string(doc).expect("YAML")).expect("write");
            plain
        } else {
            path.clone()
        };
        let out = promtool_run(&[
            "check".as_ref(),
            "rules".as_ref(),
            "--lint=all".as_ref(),
            "--lint-fatal".as_ref(),
            plain.as_os_str(),
        ]);
        let n = rules(doc).len();
        assert!(
            out.contains(&format!("SUCCESS: {n} rules found")),
            "{}: {out}",
            path.display()
        );
    }
}

#[test]
fn the_alerts_fire_and_stay_quiet_as_their_unit_tests_say() {
    let dir = workspace().join("integration/prometheus");
    let tests: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("integration/prometheus")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".test.yaml"))
        .collect();
    assert!(!tests.is_empty(), "no promtool tests in {}", dir.display());
    let mut args: Vec<&std::ffi::OsStr> = vec!["test".as_ref(), "rules".as_ref()];
    args.extend(tests.iter().map(|p| p.as_os_str()));
    let out = promtool_run(&args);
    println!("{out}");
    // Every alert has a test where it fires and one where it must not.
    let (_, plain) = plain_rules();
    for rule in rules(&plain) {
        let name = rule["alert"].as_str().expect("alert");
        let mut fires = false;
        let mut quiet = false;
        for t in &tests {
            for test in yaml(t)["tests"].as_sequence().expect("tests") {
                for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                    if case["alertname"].as_str() == Some(name) {
                        let n = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
                        fires |= n > 0;
                        quiet |= n == 0;
                    }
                }
            }
        }
        assert!(
            fires && quiet,
            "{name}: fires tested {fires}, quiet tested {quiet}"
        );
    }
}

fn plain_rules() -> (PathBuf, serde_yaml::Value) {
    let p = workspace().join("deploy/prometheus/kata-topo-rules.yaml");
    let doc = yaml(&p);
    (p, doc)
}

#[test]
fn the_prometheus_rule_holds_the_groups_of_the_plain_file() {
    let (_, plain) = plain_rules();
    let pr = yaml(&workspace().join("deploy/prometheus/kata-topo-prometheusrule.yaml"));
    assert_eq!(pr["kind"].as_str(), Some("PrometheusRule"));
    assert_eq!(
        pr["spec"]["groups"], plain["groups"],
        "kata-topo-prometheusrule.yaml and kata-topo-rules.yaml hold different groups"
    );
}

#[test]
fn every_alert_waits_has_a_severity_and_a_runbook_naming_a_command() {
    let commands = ["status", "events", "topology", "check", "vm", "intent"];
    let (_, plain) = plain_rules();
    let all = rules(&plain);
    assert!(all.len() >= 6, "{all:?}");
    for rule in all {
        let name = rule["alert"].as_str().expect("every rule is an alert");
        assert!(rule["for"].as_str().is_some(), "{name} has no for:");
        assert!(
            matches!(
                rule["labels"]["severity"].as_str(),
                Some("critical" | "warning" | "info")
            ),
            "{name}: severity {:?}",
            rule["labels"]["severity"]
        );
        let runbook = rule["annotations"]["runbook"].as_str().unwrap_or_default();
        assert!(
            commands
                .iter()
                .any(|c| runbook.contains(&format!("`kata-topo {c}"))),
            "{name}: the runbook names no kata-topo command: {runbook:?}"
        );
        for key in ["summary", "description"] {
            assert!(
                rule["annotations"][key].as_str().is_some(),
                "{name} has no {key}"
            );
        }
    }
}

/// What the wrapper's metrics code writes: each metric name with the labels its samples
/// carry, read from a file it wrote after a check with a finding, a topology load and drops.
fn exported() -> BTreeMap<String, BTreeSet<String>> {
    let dir = tempfile::tempdir().expect("tempdir");
    let drops = Drops::new();
    let m = Metrics::textfile(dir.path(), "k8s.io", "sb1", drops.clone());
    let verdict: Verdict = serde_json::from_value(serde_json::json!({
        "operation": "update", "class": "cpuset", "sandbox_id": "sb1", "container_id": "c1",
        "container_name": "app", "pod": {}, "policy": "restricted", "mode": "enforce",
        "decision": "reject",
        "findings": [{"rule": "vfio-remote", "severity": "error", "message": "m",
                      "expected": {}, "observed": {}}]
    }))
    .expect("verdict");
    m.observe(&verdict, Duration::from_micros(40));
    m.refreshed(true);
    drops.add(Sink::Events, 1);
    let path = m.path().expect("a metrics file");
    let mut text = String::new();
    assert!(
        kata_topo_integration::eventually(Duration::from_secs(15), || {
            text = std::fs::read_to_string(&path).unwrap_or_default();
            text.contains("kata_topo_findings_total{") && text.contains("sink=\"events\"} 1")
        }),
        "the metrics file: {text}"
    );
    assert!(m.remove(std::time::Instant::now() + Duration::from_secs(10)));
    let mut names: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE name kind");
            let series: &[&str] = match kind {
                "histogram" => &["_bucket", "_sum", "_count"],
                "summary" => &["", "_sum", "_count"],
                _ => &[""],
            };
            for s in series {
                names.entry(format!("{name}{s}")).or_default();
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let (name, rest) = line.split_once('{').expect("labelled sample");
            let labels = names
                .get_mut(name)
                .unwrap_or_else(|| panic!("{name} has no # TYPE"));
            for (label, _) in labels_of(rest.split_once('}').expect("}").0) {
                labels.insert(label);
            }
        }
    }
    assert!(names.contains_key("kata_topo_findings_total"), "{names:?}");
    names
}

/// The label names and values of `a="x",b="y"`.
fn labels_of(text: &str) -> Vec<(String, String)> {
    let re = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)""#)
        .expect("regex");
    re.captures_iter(text)
        .map(|c| (c[1].to_string(), c[3].to_string()))
        .collect()
}

/// A metric selector in a query: the name and its label matchers (name, operator, value).
#[derive(Debug, PartialEq)]
struct Selector {
    name: String,
    matchers: Vec<(String, String, String)>,
}

const KEYWORDS: [&str; 12] = [
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "atan2",
];

const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metric selectors of a PromQL expression (Grafana's `$variables` allowed): identifiers
/// that are not functions, keywords or grouping labels, with the matchers in their braces.
fn selectors(expr: &str) -> Vec<Selector> {
    let b = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b':';
    let skip_ws = |mut j: usize| {
        while j < b.len() && b[j].is_ascii_whitespace() {
            j += 1;
        }
        j
    };
    // The index after the bracket that closes the one at `j`.
    let close = |j: usize, open: u8, shut: u8| {
        let (mut depth, mut k, mut quoted) = (0, j, None::<u8>);
        while k < b.len() {
            match (quoted, b[k]) {
                (Some(_), b'\\') => k += 1,
                (Some(q), c) if c == q => quoted = None,
                (Some(_), _) => {}
                (None, b'"' | b'\'' | b'`') => quoted = Some(b[k]),
                (None, c) if c == open => depth += 1,
                (None, c) if c == shut => {
                    depth -= 1;
                    if depth == 0 {
                        return k + 1;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        panic!("unbalanced {} in {expr}", open as char);
    };
    while i < b.len() {
        let c = b[i];
        if c == b'"' || c == b'\'' || c == b'`' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c == b'[' {
            i = close(i, b'[', b']');
        } else if c == b'{' {
            // A selector without a name: {__name__="..."}.
            let end = close(i, b'{', b'}');
            let matchers = matchers(&expr[i + 1..end - 1]);
            let name = matchers
                .iter()
                .find(|m| m.0 == "__name__")
                .map(|m| m.2.clone())
                .unwrap_or_else(|| panic!("a selector without a metric name in {expr}"));
            out.push(Selector { name, matchers });
            i = end;
        } else if c == b'$' {
            i += 1;
            while i < b.len() && (ident(b[i]) || b[i] == b'{' || b[i] == b'}') {
                i += 1;
            }
        } else if c.is_ascii_digit() || c == b'.' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                i += 1;
            }
        } else if ident(c) {
            let start = i;
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            let word = &expr[start..i];
            let next = skip_ws(i);
            let lower = word.to_ascii_lowercase();
            if matches!(
                lower.as_str(),
                "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
            ) {
                if b.get(next) == Some(&b'(') {
                    i = close(next, b'(', b')');
                }
            } else if KEYWORDS.contains(&lower.as_str())
                || AGGREGATIONS.contains(&lower.as_str())
                || lower == "inf"
                || lower == "nan"
            {
                // An aggregation may put its grouping before its parenthesis.
            } else if b.get(next) == Some(&b'(') {
                // A function or an aggregation.
            } else if b.get(next) == Some(&b'{') {
                let end = close(next, b'{', b'}');
                out.push(Selector {
                    name: word.to_string(),
                    matchers: matchers(&expr[next + 1..end - 1]),
                });
                i = end;
            } else {
                out.push(Selector {
                    name: word.to_string(),
                    matchers: Vec::new(),
                });
            }
        } else {
            i += 1;
        }
    }
    out
}

fn matchers(text: &str) -> Vec<(String, String, String)> {
    let re = regex::Regex::new(r#"([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)""#)
        .expect("regex");
    re.captures_iter(text)
        .map(|c| (c[1].to_string(), c[2].to_string(), c[3].to_string()))
        .collect()
}

#[test]
fn selectors_are_read_from_promql_as_prometheus_would() {
    let names = |e: &str| -> Vec<String> { selectors(e).into_iter().map(|s| s.name).collect() };
    assert_eq!(
        names(
            "sum without (severity) ((increase(a_total{rule!~\"x|y\"}[10m]) > 0) or \
             (a_total unless b_total offset 10m))"
        ),
        ["a_total", "a_total", "b_total"]
    );
    assert_eq!(
        names("histogram_quantile(0.99, sum by (le) (rate(h_bucket{i=~\"$instance\"}[$__rate_interval])))"),
        ["h_bucket"]
    );
    assert_eq!(names("time() - hb_seconds > 300"), ["hb_seconds"]);
    assert_eq!(
        names("sum(x) by (rule) / on (instance) group_left (job) y"),
        ["x", "y"]
    );
    assert_eq!(names("{__name__=\"n\", a=\"}\"}"), ["n"]);
    assert_eq!(names("count(up == bool 1) * 1e-3"), ["up"]);
    assert_eq!(
        selectors("m{a=\"x\",b!~\"y|z\"}")[0].matchers,
        [
            ("a".into(), "=".into(), "x".into()),
            ("b".into(), "!~".into(), "y|z".into())
        ]
    );
}

/// Every query of the dashboard: the panels' targets (rows' panels too) and the variables'.
fn dashboard_queries(dash: &Value) -> Vec<(String, String)> {
    fn panels(list: &Value, out: &mut Vec<(String, String)>) {
        for p in list.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().expect("every target has an expr");
                out.push((title.clone(), expr.to_string()));
            }
            panels(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dash["panels"], &mut out);
    for v in dash["templating"]["list"].as_array().into_iter().flatten() {
        if v["type"].as_str() != Some("query") {
            continue;
        }
        let q = v["query"]["query"]
            .as_str()
            .or(v["query"].as_str())
            .expect("a query variable's query");
        // label_values(SELECTOR, LABEL): the selector is the query.
        let q = q
            .strip_prefix("label_values(")
            .and_then(|r| r.rsplit_once(','))
            .map_or(q, |(sel, _)| sel);
        out.push((format!("variable {}", v["name"]), q.to_string()));
    }
    out
}

#[test]
fn the_dashboard_is_grafana_json_with_the_panels_it_promises() {
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(workspace().join("deploy/grafana/kata-topo.json")).expect("read"),
    )
    .expect("JSON");
    assert_eq!(dash["uid"].as_str(), Some("kata-topo"));
    let mut ids = BTreeSet::new();
    for p in dash["panels"].as_array().expect("panels") {
        assert!(
            ids.insert(p["id"].as_u64().expect("id")),
            "duplicate id {p}"
        );
        for k in ["x", "y", "w", "h"] {
            assert!(p["gridPos"][k].is_u64(), "gridPos.{k} of {}", p["title"]);
        }
        assert_eq!(p["datasource"]["uid"].as_str(), Some("${datasource}"));
        let refs: BTreeSet<_> = p["targets"]
            .as_array()
            .expect("targets")
            .iter()
            .map(|t| t["refId"].as_str().expect("refId"))
            .collect();
        assert_eq!(refs.len(), p["targets"].as_array().map_or(0, Vec::len));
    }
    let queries = dashboard_queries(&dash)
        .into_iter()
        .map(|q| q.1)
        .collect::<Vec<_>>();
    for metric in [
        "kata_topo_findings_total",
        "kata_topo_checks_total",
        "kata_topo_sink_dropped_total",
        "kata_topo_check_duration_seconds_bucket",
        "kata_topo_sandbox_watched",
    ] {
        assert!(
            queries.iter().any(|q| q.contains(metric)),
            "no panel shows {metric}"
        );
    }
}

#[test]
fn alerts_and_panels_query_only_metrics_and_labels_the_wrapper_writes() {
    let exported = exported();
    // Labels Prometheus adds to what it scrapes, and the histogram's own.
    let target = ["instance", "job", "le", "__name__"];
    let mut values: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    values.insert(
        "rule",
        Rule::ALL.iter().map(|r| r.id().to_string()).collect(),
    );
    values.insert(
        "severity",
        [Severity::Info, Severity::Warning, Severity::Error]
            .iter()
            .map(ToString::to_string)
            .collect(),
    );
    values.insert(
        "sink",
        Sink::ALL.iter().map(|s| s.name().to_string()).collect(),
    );
    values.insert(
        "decision",
        [Decision::Allow, Decision::Reject]
            .iter()
            .map(ToString::to_string)
            .collect(),
    );
    let mut queries = Vec::new();
    for (path, doc) in rule_docs() {
        for rule in rules(&doc) {
            let name = rule["alert"]
                .as_str()
                .or(rule["record"].as_str())
                .unwrap_or("?");
            let expr = rule["expr"].as_str().expect("expr").to_string();
            queries.push((format!("{} {name}", path.display()), expr));
        }
    }
    let dash_path = workspace().join("deploy/grafana/kata-topo.json");
    let dash: Value =
        serde_json::from_str(&std::fs::read_to_string(&dash_path).expect("read")).expect("JSON");
    for (title, expr) in dashboard_queries(&dash) {
        queries.push((format!("{} panel {title}", dash_path.display()), expr));
    }
    let mut wrong = Vec::new();
    for (whence, expr) in &queries {
        let found = selectors(expr);
        if found.is_empty() {
            wrong.push(format!("{whence}: no metric in {expr}"));
        }
        for s in found {
            let Some(labels) = exported.get(&s.name) else {
                wrong.push(format!(
                    "{whence}: {} is not a metric kata-topo writes",
                    s.name
                ));
                continue;
            };
            for (label, op, value) in &s.matchers {
                if !labels.contains(label) && !target.contains(&label.as_str()) {
                    wrong.push(format!("{whence}: {} has no label {label}", s.name));
                }
                let Some(known) = values.get(label.as_str()) else {
                    continue;
                };
                let alternatives: Vec<&str> = if op.ends_with('~') {
                    value.split('|').collect()
                } else {
                    vec![value.as_str()]
                };
                for v in alternatives {
                    if !known.contains(v) {
                        wrong.push(format!(
                            "{whence}: {label}=\"{v}\" is never written ({known:?})"
                        ));
                    }
                }
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "queries of metrics the code does not write (it writes {:?}):\n{}",
        exported.keys().collect::<Vec<_>>(),
        wrong.join("\n")
    );
}
