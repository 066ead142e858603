//! The pod's Kubernetes Events from a real wrapper under the real containerd, written to a
//! stand-in API server over HTTPS (`kata_topo_apiserver::fake`, a CA made for the test: no
//! API server runs here; `make k8s-test` has the real one): what is posted, the count of a
//! repeat, one Event for a refusal the kubelet retries, drops counted, and an API server that
//! never answers costing the requests nothing; and `kata-topo diagnose` on the real wrapper's
//! state.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_apiserver::fake::{Exchange, FakeApiServer, Reply};
use kata_topo_integration::{bin_dir, eventually, Containerd, Guard, Resources};
use serde_json::{json, Value};

const POD_ANNOTATIONS: &[(&str, &str)] = &[
    ("kata-topo.io/policy", "single-numa-node"),
    ("kata-topo.io/numa-nodes", "1"),
];

/// The API server of node `worker-1` (no labels) and of every pod in namespace `ml` (uid
/// `uid-<name>`, as the CRI client names them, no affinity). Events are answered as written,
/// but those of pod `refused` get 403, and every write hangs while `hang` is set.
fn api_server(hang: Arc<AtomicBool>) -> FakeApiServer {
    FakeApiServer::start_with_bodies(move |line, body| {
        let path = line.split(' ').nth(1).unwrap_or_default();
        if line.starts_with("GET /api/v1/nodes/worker-1 ") {
            return Reply::ok(
                json!({"kind": "PartialObjectMetadata", "metadata": {"name": "worker-1", "labels": {}}})
                    .to_string(),
            );
        }
        if let Some(name) = path.strip_prefix("/api/v1/namespaces/ml/pods/") {
            return Reply::ok(
                json!({"kind": "Pod", "metadata": {"namespace": "ml", "name": name,
                    "uid": format!("uid-{name}")}, "spec": {}})
                .to_string(),
            );
        }
        if path.starts_with("/api/v1/namespaces/ml/events") {
            if hang.load(Ordering::SeqCst) {
                return Reply::Hang;
            }
            let sent: Value = serde_json::from_slice(body).unwrap_or_default();
            if sent["involvedObject"]["name"] == "refused" {
                return Reply::status(403, "events is forbidden");
            }
            let name = path
                .rsplit_once("/events/")
                .map_or_else(|| sent["metadata"]["name"].clone(), |(_, n)| json!(n));
            return Reply::Answer {
                status: if line.starts_with("POST") { 201 } else { 200 },
                body: json!({"kind": "Event", "metadata": {"name": name}}).to_string(),
                chunked: false,
            };
        }
        Reply::status(404, "not found")
    })
}

fn guard(api: &FakeApiServer, mode: &'static str) -> Guard {
    Guard {
        mode,
        metrics: true,
        extra: format!(
            "kubeconfig = \"{}\"\nnode_name = \"worker-1\"\napi_timeout_ms = 2000\n",
            api.kubeconfig().display()
        ),
        ..Guard::default()
    }
}

/// The writes of Events so far: (method, body).
fn writes(api: &FakeApiServer) -> Vec<(String, Value, String)> {
    api.exchanges()
        .into_iter()
        .filter(|e: &Exchange| e.line.contains("/events"))
        .map(|e| {
            let method = e.line.split(' ').next().unwrap_or_default().to_string();
            let body = serde_json::from_slice(&e.body).unwrap_or_default();
            (method, body, e.line)
        })
        .collect()
}

fn posts_for(api: &FakeApiServer, pod: &str) -> Vec<Value> {
    writes(api)
        .into_iter()
        .filter(|(m, b, _)| m == "POST" && b["involvedObject"]["name"] == pod)
        .map(|(_, b, _)| b)
        .collect()
}

#[test]
fn findings_are_events_on_the_pod_and_repeats_patch_their_count() {
    let api = api_server(Arc::new(AtomicBool::new(false)));
    let c = Containerd::start(guard(&api, "audit"));
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("trainer", POD_ANNOTATIONS, true);
    let res = Resources::admitted();
    // Across to node 0: two errors, let through in audit mode: two Warning Events.
    cri.update(&id, &res.on("0")).expect("push");
    assert!(
        eventually(Duration::from_secs(20), || posts_for(&api, "trainer").len()
            == 2),
        "{:#?}",
        writes(&api)
    );
    let posted = posts_for(&api, "trainer");
    let mut reasons: Vec<&str> = posted.iter().filter_map(|e| e["reason"].as_str()).collect();
    reasons.sort_unstable();
    assert_eq!(reasons, ["CpuOutsideIntent", "VfioRemote"]);
    for e in &posted {
        assert_eq!(e["type"], "Warning");
        assert_eq!(
            e["involvedObject"],
            json!({"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "trainer",
                   "uid": "uid-trainer"})
        );
        assert_eq!(e["metadata"]["namespace"], "ml");
        assert_eq!(
            e["source"],
            json!({"component": "kata-topo", "host": "worker-1"})
        );
        assert_eq!(e["reportingComponent"], "kata-topo");
        assert_eq!(e["reportingInstance"], "worker-1");
        assert_eq!(e["count"], 1);
        let m = e["message"].as_str().unwrap_or_default();
        assert!(
            m.starts_with("The cpuset update of container app went through (audit mode): "),
            "{m}"
        );
    }
    // Back (clean: the finding re-armed), across again: announced again, the same two Events
    // patched to count 2.
    cri.update(&id, &res.on("1")).expect("back");
    cri.update(&id, &res.on("0")).expect("across again");
    let patches = || {
        writes(&api)
            .into_iter()
            .filter(|(m, _, _)| m == "PATCH")
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(20), || patches().len() == 2),
        "{:#?}",
        writes(&api)
    );
    for (_, body, line) in patches() {
        assert_eq!(body["count"], 2, "{body}");
        assert!(
            posted.iter().any(|e| line.contains(&format!(
                "/api/v1/namespaces/ml/events/{} ",
                e["metadata"]["name"].as_str().unwrap_or("?")
            ))),
            "{line} patches a posted Event"
        );
    }
    // A third time: counted, not written (the next patch waits its interval); then a new
    // finding, posted — written after the third in order, so the third wrote nothing.
    cri.update(&id, &res.on("1")).expect("back");
    cri.update(&id, &res.on("0")).expect("across a third time");
    cri.update(&id, &res.on("0-1"))
        .expect("spanning both nodes");
    assert!(
        eventually(Duration::from_secs(20), || posts_for(&api, "trainer")
            .iter()
            .any(|e| e["reason"] == "CpuSpansNuma")),
        "{:#?}",
        writes(&api)
    );
    assert_eq!(patches().len(), 2, "{:#?}", writes(&api));

    // Enforce: the kubelet retrying a refused push is one announcement, one Event per rule;
    // this API server refuses them: counted as dropped.
    let enforce = [
        POD_ANNOTATIONS[0],
        POD_ANNOTATIONS[1],
        ("kata-topo.io/mode", "enforce"),
    ];
    let (strict, _cfg, strict_id) = cri.admit("refused", &enforce, true);
    for _ in 0..10 {
        assert!(cri.update(&strict_id, &res.on("0")).is_err(), "refused");
    }
    assert!(
        eventually(Duration::from_secs(20), || c
            .metric("kata_topo_sink_dropped_total", "sink=\"kube-events\"")
            >= 2.0),
        "{:#?}",
        writes(&api)
    );
    let refused = posts_for(&api, "refused");
    assert_eq!(refused.len(), 2, "{refused:#?}");
    assert!(refused.iter().all(|e| e["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("Refused the cpuset update of container app: "))));
    assert_eq!(
        c.metric("kata_topo_sink_dropped_total", "sink=\"kube-events\""),
        2.0
    );
    // kata-topo status says the Events are on.
    let status = Command::new(bin_dir().join("kata-topo"))
        .args(["status", "--state-dir"])
        .arg(&c.state_dir)
        .output()
        .expect("status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains("  pod events: on: as node worker-1"),
        "{text}"
    );
    // kata-topo diagnose on the real wrapper's state: the crossing pod's binding does not
    // hold (exit 1); the refused pod's does, on a node whose labels never moved (exit 0); a
    // pod no wrapper of this node runs cannot be told, in one line (exit 2).
    let diagnose = |pod: &str| {
        let out = Command::new(bin_dir().join("kata-topo"))
            .args(["diagnose", pod, "--json", "--state-dir"])
            .arg(&c.state_dir)
            .output()
            .expect("diagnose");
        let json: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out.status.code(), json)
    };
    let (code, d) = diagnose("ml/trainer");
    assert_eq!(code, Some(1), "{d:#}");
    assert_eq!(
        (
            &d["node_labels"]["status"],
            &d["affinity"]["status"],
            &d["topology"]["status"]
        ),
        (&json!("ok"), &json!("ok"), &json!("finding")),
        "{d:#}"
    );
    assert_eq!(
        d["topology"]["containers"][0]["placement"]["cpus"], "0-1",
        "{d:#}"
    );
    assert_eq!(d["pod"]["uid"], "uid-trainer");
    let (code, d) = diagnose("ml/refused");
    assert_eq!(code, Some(0), "{d:#}");
    assert_eq!(
        d["topology"]["containers"][0]["placement"]["cpus"], "1",
        "{d:#}"
    );
    let (code, d) = diagnose("ml/not-here");
    assert_eq!(code, Some(2), "{d:#}");
    assert!(
        d["why"]
            .as_str()
            .is_some_and(|w| w.starts_with("kata-topo holds no state for it")),
        "{d:#}"
    );
    cri.remove_pod(&strict);
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// An API server that takes the connection and never answers: the update that announced
/// the Events was answered before the wrapper gave up writing them (5 s later, by its own
/// deadline: the stand-in sees the connection closed), the updates after it too, and the two
/// writes lost are counted.
#[test]
fn an_api_server_that_never_answers_costs_the_requests_nothing() {
    let api = api_server(Arc::new(AtomicBool::new(true)));
    let c = Containerd::start(guard(&api, "audit"));
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("trainer", POD_ANNOTATIONS, true);
    let res = Resources::admitted();
    cri.update(&id, &res.on("0")).expect("across: two Events");
    let answered = Instant::now();
    // 19 more announcements of the same two Events (repeats, folded by the writer), and
    // every one of them answered whatever the writer does.
    for _ in 0..19 {
        cri.update(&id, &res.on("1")).expect("back");
        cri.update(&id, &res.on("0")).expect("across");
    }
    let first_write = || {
        api.exchanges()
            .into_iter()
            .find(|e| e.line.starts_with("POST /api/v1/namespaces/ml/events "))
    };
    assert!(
        eventually(Duration::from_secs(30), || first_write()
            .is_some_and(|e| e.abandoned.is_some())),
        "the wrapper gives its first write up: {:?}",
        first_write()
    );
    let gave_up = first_write().and_then(|e| e.abandoned).expect("abandoned");
    assert!(
        answered < gave_up,
        "the announcing update was answered before its Event's write ended"
    );
    assert!(
        eventually(Duration::from_secs(20), || c
            .metric("kata_topo_sink_dropped_total", "sink=\"kube-events\"")
            >= 2.0),
        "{}",
        c.metric("kata_topo_sink_dropped_total", "sink=\"kube-events\"")
    );
    assert!(
        eventually(Duration::from_secs(20), || c.log_lines().iter().any(|l| l
            ["event"]
            == "pod-event-failed"
            && l["error"]
                .as_str()
                .is_some_and(|e| e.contains("did not answer")))),
        "the log says why the write was lost"
    );
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}
