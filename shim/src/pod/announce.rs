//! Which verdicts are announced (logged, published). The kubelet's CPU-manager reconcile
//! loop pushes the same cpuset every 10 s: a verdict is announced only when its findings
//! differ from the last verdict announced for the same task and update class (or create
//! operation); a `noop` update (what is in force pushed again) is a repeat when its findings
//! equal any announced for the task; a clean verdict re-arms the task, unless it is a clean
//! `noop`: that only says what is in force is clean, which a refused request never changed.
//! The real kubelet retries a refused resize about once a second and pushes the container's
//! cpuset again (a clean `noop`) between the retries; each retry is the same request, not news.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::Hasher;
use std::sync::Mutex;

use kata_topo_core::{UpdateClass, Verdict};

/// What was last announced, per task and class: the findings and decision by a 64-bit hash of
/// their JSON (a node-wide front end keeps one per container of every pod; two different
/// verdicts of a task hash the same with a chance of one in 2^64).
#[derive(Debug, Default)]
pub(crate) struct Announcer {
    announced: Mutex<HashMap<(String, String), u64>>,
}

/// A verdict's findings and decision, hashed as their JSON is written (nothing allocated).
fn signature(v: &Verdict) -> u64 {
    struct Hashing(DefaultHasher);
    impl std::io::Write for Hashing {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.write(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut h = Hashing(DefaultHasher::new());
    let _ = serde_json::to_writer(&mut h, &(&v.findings, v.decision()));
    h.0.finish()
}

impl Announcer {
    /// Whether `v` is news for `task_id`; remembers it when it is.
    pub(crate) fn should_announce(&self, task_id: &str, v: &Verdict) -> bool {
        let key = (
            task_id.to_string(),
            v.class
                .map_or_else(|| v.operation.to_string(), |c| c.to_string()),
        );
        let mut announced = self.announced.lock().unwrap_or_else(|e| e.into_inner());
        if v.findings.is_empty() {
            if v.class != Some(UpdateClass::Noop) {
                announced.retain(|(t, _), _| t != task_id);
            }
            return false;
        }
        let sig = signature(v);
        if v.class == Some(UpdateClass::Noop)
            && announced
                .iter()
                .any(|((t, _), s)| t == task_id && *s == sig)
        {
            return false;
        }
        if announced.get(&key) == Some(&sig) {
            return false;
        }
        announced.insert(key, sig);
        true
    }

    /// Forgets a task (deleted).
    pub(crate) fn forget(&self, task_id: &str) {
        self.announced
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|(t, _), _| t != task_id && !t.starts_with(&format!("{task_id}/")));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A verdict of the shape the wrapper makes: `class` null for creates.
    fn verdict(class: Option<&str>, rules: &[&str], decision: &str) -> Verdict {
        let findings: Vec<serde_json::Value> = rules
            .iter()
            .map(|r| {
                serde_json::json!({"rule": r, "severity": "error", "message": "m",
                    "expected": {"numa_nodes": [0]}, "observed": {"limit_bytes": 1805647872u64}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "operation": if class.is_some() { "update" } else { "create" },
            "class": class, "sandbox_id": "sb", "container_id": "c1", "container_name": "app",
            "pod": {"name": "kt-enforce", "namespace": "default", "uid": "u"},
            "policy": "restricted", "mode": "enforce", "decision": decision,
            "findings": findings,
        }))
        .expect("verdict")
    }

    /// What the real kubelet (v1.36.3) sent for a pod whose resize kata-topo refused: the
    /// resize, then the CPU manager's push of the cpuset in force (a clean noop), then the
    /// resize again, about once a second, for as long as the resize is pending.
    #[test]
    fn the_kubelets_retries_of_a_refused_resize_are_announced_once() {
        let a = Announcer::default();
        let refused = verdict(Some("resize"), &["memory-exceeds-nodes"], "reject");
        let push = verdict(Some("noop"), &[], "allow");
        assert!(a.should_announce("c1", &refused));
        for _ in 0..5 {
            assert!(!a.should_announce("c1", &push));
            assert!(!a.should_announce("c1", &refused));
        }
    }

    /// The enforce pod of `make k8s-test`, as the real kubelet drove it
    /// (`core/tests/fixtures/kubelet/`): its resize refused and retried dozens of times with
    /// the cpuset in force pushed between tries, later its push onto node 1 refused and
    /// retried. Two refusals, each announced once.
    #[test]
    fn the_real_kubelets_enforce_pod_is_announced_once_per_refusal() {
        let recorded = include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../core/tests/fixtures/kubelet/v1.36.3-containerd-1.6.20.jsonl"
        ));
        let a = Announcer::default();
        let (mut requests, mut announced) = (0, Vec::new());
        for line in recorded.lines() {
            let line: serde_json::Value = serde_json::from_str(line).expect("json");
            if line["task"] != "kt-enforce/app#1" || line["request"] != "update" {
                continue;
            }
            let class = line["class"].as_str().expect("class");
            let refused = line["decision"] == "reject";
            let rules: &[&str] = match (refused, class) {
                (false, _) => &[],
                (true, "resize") => &["memory-exceeds-nodes"],
                (true, _) => &["cpu-outside-intent"],
            };
            let v = verdict(Some(class), rules, if refused { "reject" } else { "allow" });
            let times = line["repeated"].as_u64().unwrap_or(1);
            for _ in 0..times {
                requests += 1;
                if a.should_announce("c1", &v) {
                    announced.push(class.to_string());
                }
            }
        }
        assert!(requests > 50, "{requests}");
        assert_eq!(announced, ["resize", "cpuset"]);
    }

    #[test]
    fn a_clean_change_re_arms_the_task() {
        let a = Announcer::default();
        let crossing = verdict(Some("cpuset"), &["cpu-outside-intent"], "allow");
        assert!(a.should_announce("c1", &crossing));
        assert!(!a.should_announce("c1", &crossing));
        // Back home: a clean cpuset push; crossing again is news.
        assert!(!a.should_announce("c1", &verdict(Some("cpuset"), &[], "allow")));
        assert!(a.should_announce("c1", &crossing));
        // Other tasks are their own.
        assert!(a.should_announce("c2", &crossing));
    }
}
