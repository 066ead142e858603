//! The pod's intent from the kubelet, asked once per pod and kept: at the pod's first `Create`
//! (the sandbox's), again when a resize arrives, never on any other forwarded call, and never
//! for longer than `kubelet_timeout_ms`.
//!
//! The CPU manager's reconcile loop sends cpuset-only updates to every shared-pool container
//! of the node at once; those never ask (the admission they are checked against does not
//! change with them), so a node's pods ask the kubelet at their creation and their resizes
//! only. The kubelet's PodResources server allows 100 calls a second with a burst of 10
//! across all its clients; a hundred pods each asking once at creation and once per resize
//! stay far below it; the kubelet's retries of a refused resize are answered from the first
//! one's answer (`retries`). When the kubelet does not answer, the request that asked falls back to
//! the annotations and the baseline with a `kubelet-intent-unavailable` warning naming why,
//! and the answer it gave before, if any, stays kept for the requests that do not ask: what
//! was admitted does not change because the kubelet restarts. A pod the kubelet gave no
//! answer for keeps that until its next resize.

use std::sync::{Arc, Mutex};

use kata_topo_core::check::verdict::PodRef;
use kata_topo_core::config::Config;
use kata_topo_core::input::kubelet::{IntentSource, KubeletView};

/// The kubelet's answer for one pod, kept between requests.
#[derive(Debug)]
pub(crate) struct KubeletIntents {
    /// The node's configuration, shared with the pod's other checks.
    config: Arc<Config>,
    kept: Mutex<Option<Arc<KubeletView>>>,
}

impl KubeletIntents {
    pub(crate) fn new(config: Arc<Config>) -> Self {
        Self {
            config,
            kept: Mutex::new(None),
        }
    }

    /// What was kept from the last answer, without asking.
    pub(crate) fn kept(&self) -> Option<Arc<KubeletView>> {
        if self.config.intent_source == IntentSource::Annotations {
            return None;
        }
        self.kept.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// What the kubelet says about `pod`: asked now when `ask` (the pod's first create, a
    /// resize) or when nothing is kept yet (a wrapper restarted), else what was kept — the
    /// reason it gave none too, so that a hung kubelet costs the requests that ask and no
    /// other. `None` when the kubelet is not the intent source (`intent_source =
    /// "annotations"`, or `auto` without its socket) or the request names no pod.
    pub(crate) fn view(&self, pod: &PodRef, ask: bool) -> Option<Arc<KubeletView>> {
        let mut kept = self.kept.lock().unwrap_or_else(|e| e.into_inner());
        if let (false, Some(v)) = (ask, kept.as_ref()) {
            return Some(Arc::clone(v));
        }
        let answer = Arc::new(kata_topo_kubelet::intent_for(&self.config, pod)?);
        let admitted_before = kept
            .as_ref()
            .is_some_and(|v| matches!(**v, KubeletView::Admitted { .. }));
        if matches!(*answer, KubeletView::Admitted { .. }) || !admitted_before {
            *kept = Some(Arc::clone(&answer));
        }
        Some(answer)
    }
}
