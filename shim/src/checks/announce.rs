//! Which verdicts are announced (logged, published). The kubelet's CPU-manager reconcile
//! loop pushes the same cpuset every 10 s: a verdict is announced only when its findings
//! differ from the last verdict announced for the same task and update class (or create
//! operation); a `noop` update (what is in force pushed again) is a repeat when its findings
//! equal any announced for the task; a clean verdict re-arms the task.

use std::collections::HashMap;
use std::sync::Mutex;

use kata_topo_core::{UpdateClass, Verdict};

/// What was last announced, per task and class.
#[derive(Debug, Default)]
pub(crate) struct Announcer {
    announced: Mutex<HashMap<(String, String), String>>,
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
            announced.retain(|(t, _), _| t != task_id);
            return false;
        }
        let signature = serde_json::to_string(&(&v.findings, v.decision)).unwrap_or_default();
        if v.class == Some(UpdateClass::Noop)
            && announced
                .iter()
                .any(|((t, _), sig)| t == task_id && *sig == signature)
        {
            return false;
        }
        if announced.get(&key) == Some(&signature) {
            return false;
        }
        announced.insert(key, signature);
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
