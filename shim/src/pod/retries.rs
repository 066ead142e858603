//! A refused resize is retried by the kubelet about once a second while it stays pending, the
//! same request each time. Each retry would ask the kubelet (PodResources `Get`) and the API
//! server (the Node) again; the kubelet's PodResources server allows 100 calls a second with
//! a burst of 10 across all its clients, so a tenant with many pending resizes could use it
//! up and leave other pods' checks with a `kubelet-intent-unavailable` warning. A retry of
//! the same request for the same task within [`RETRY_WINDOW`] of the first is answered from
//! what the first one read: the same admission and the same node, checked again. Past the
//! window it reads again, so what it is checked against is never older than that.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_core::input::affinity::NodeView;
use kata_topo_core::input::kubelet::KubeletView;

/// How long a resize's reads answer its retries: the kubelet retries about once a second, so
/// a pending resize asks the kubelet and the API server once in ten seconds instead of ten
/// times, and is checked against labels and an admission at most this old.
pub(crate) const RETRY_WINDOW: Duration = Duration::from_secs(10);

/// What one resize read.
#[derive(Debug, Clone)]
pub(crate) struct Reads {
    /// The kubelet's answer (`None`: the kubelet is not the intent source).
    pub(crate) kubelet: Option<Arc<KubeletView>>,
    /// The API server's (`None`: the affinity check is off).
    pub(crate) node: Option<NodeView>,
}

#[derive(Debug)]
struct Entry {
    request: Vec<u8>,
    at: Instant,
    reads: Reads,
}

/// The last resize of each task and what it read.
#[derive(Debug)]
pub(crate) struct Retries {
    window: Duration,
    last: Mutex<HashMap<String, Entry>>,
}

impl Retries {
    pub(crate) fn new(window: Duration) -> Self {
        Self {
            window,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// What the first of these identical requests (`request`, the update's resources as
    /// containerd sent them) for `task_id` read, when it came within the window.
    pub(crate) fn reads_of(&self, task_id: &str, request: &[u8]) -> Option<Reads> {
        let last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        last.get(task_id)
            .filter(|e| e.request == request && e.at.elapsed() < self.window)
            .map(|e| e.reads.clone())
    }

    /// Keeps what a resize of `task_id` read, for its retries (one per task: the latest).
    pub(crate) fn remember(&self, task_id: &str, request: &[u8], reads: Reads) {
        self.last.lock().unwrap_or_else(|e| e.into_inner()).insert(
            task_id.to_string(),
            Entry {
                request: request.to_vec(),
                at: Instant::now(),
                reads,
            },
        );
    }

    /// Forgets a task (deleted).
    pub(crate) fn forget(&self, task_id: &str) {
        self.last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(task_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(reason: &str) -> Reads {
        Reads {
            kubelet: Some(Arc::new(KubeletView::Unavailable {
                reason: reason.into(),
            })),
            node: None,
        }
    }

    fn reason(r: &Reads) -> String {
        match r.kubelet.as_deref() {
            Some(KubeletView::Unavailable { reason }) => reason.clone(),
            other => format!("{other:?}"),
        }
    }

    #[test]
    fn the_same_request_of_the_same_task_within_the_window_only() {
        let r = Retries::new(Duration::from_secs(3600));
        assert!(r.reads_of("c1", b"resize-1").is_none());
        r.remember("c1", b"resize-1", reads("first"));
        assert_eq!(
            reason(&r.reads_of("c1", b"resize-1").expect("retry")),
            "first"
        );
        // Another request, another task: read again.
        assert!(r.reads_of("c1", b"resize-2").is_none());
        assert!(r.reads_of("c2", b"resize-1").is_none());
        // The latest resize of a task replaces the one before.
        r.remember("c1", b"resize-2", reads("second"));
        assert!(r.reads_of("c1", b"resize-1").is_none());
        r.forget("c1");
        assert!(r.reads_of("c1", b"resize-2").is_none());
        // Past the window (none at all here): read again.
        let none = Retries::new(Duration::ZERO);
        none.remember("c1", b"resize-1", reads("first"));
        assert!(none.reads_of("c1", b"resize-1").is_none());
    }
}
