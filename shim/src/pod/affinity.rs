//! The pod's node affinity, re-checked where the scheduler never looks again: at the pod's
//! first create (its sandbox's) the wrapper reads the pod and its node from the API server and
//! keeps the node's labels as the **label baseline**, with the pod's nodeSelector and node
//! affinity (they cannot change once the pod is bound); at each resize (`resize` or `mixed`
//! update) and each recreate it reads the node again and checks the pod against it
//! ([`kata_topo_core::input::affinity`]).
//!
//! One read per such request, never per forwarded call, all of it within `api_timeout_ms`.
//! A cpuset push of the CPU manager's reconcile loop — sent to every shared-pool container
//! of the node at once — neither reads nor checks: it changes nothing the scheduler decided,
//! and a node of a hundred pods would otherwise send the API server a hundred GETs each time
//! its shared pool changes. A container's first create after its sandbox's uses nothing either:
//! the sandbox's read a moment before stands for the pod. A read that fails costs the request
//! that made it a `node-labels-unavailable` warning naming why and nothing more; a pod whose
//! first read failed takes the labels of its first successful read as its baseline.

use std::sync::{Arc, Mutex};

use kata_topo_apiserver::{ApiError, Setup};
use kata_topo_core::check::verdict::PodRef;
use kata_topo_core::config::Config;
use kata_topo_core::input::affinity::{LabelBaseline, NodeView};

/// What one read gave: the view the core checks, and the baseline to keep when it was the
/// first.
#[derive(Debug, Default)]
pub(crate) struct NodeRead {
    /// What the API server said, or why it said nothing; `None` when the check is off or the
    /// request names no pod.
    pub(crate) view: Option<NodeView>,
    /// A label baseline read for the first time: keep it.
    pub(crate) new_baseline: Option<LabelBaseline>,
}

/// One pod's node-affinity check.
#[derive(Debug)]
pub(crate) struct NodeAffinity {
    /// The node's configuration, shared with the pod's other checks.
    config: Arc<Config>,
    /// The check as set up; one that was broken (a kubeconfig or a file it names unusable,
    /// mid-rotation) is set up again at each read until it is not.
    setup: Mutex<Arc<Setup>>,
    kept: Mutex<Option<LabelBaseline>>,
}

impl NodeAffinity {
    /// The check against the API server of `setup` (as `config`, the node's
    /// `[topology_guard]`, sets it up), starting from the baseline a previous daemon of the pod
    /// kept.
    pub(crate) fn new(setup: Arc<Setup>, config: Arc<Config>, kept: Option<LabelBaseline>) -> Self {
        Self {
            config,
            setup: Mutex::new(setup),
            kept: Mutex::new(kept),
        }
    }

    /// Whether it runs, for the daemon's record (`kata-topo status`).
    pub(crate) fn describe(&self) -> String {
        self.setup
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .describe()
    }

    /// The setup to read with: the one kept, or, when that was broken, a new one.
    fn current(&self) -> Arc<Setup> {
        let mut setup = self.setup.lock().unwrap_or_else(|e| e.into_inner());
        if matches!(**setup, Setup::Broken(_)) {
            *setup = Arc::new(kata_topo_apiserver::setup(&self.config));
        }
        Arc::clone(&setup)
    }

    /// Reads the node (and the pod, when no baseline is kept yet) for a check of the pod's
    /// affinity on it.
    pub(crate) fn read(&self, pod: &PodRef) -> NodeRead {
        let unavailable = |e: &ApiError| NodeRead {
            view: Some(NodeView::Unavailable {
                reason: e.to_string(),
            }),
            new_baseline: None,
        };
        let setup = self.current();
        let (client, node) = match &*setup {
            Setup::Off(_) => return NodeRead::default(),
            Setup::Broken(e) => return unavailable(e),
            Setup::On { client, node } => (client, node),
        };
        let (Some(namespace), Some(name)) = (&pod.namespace, &pod.name) else {
            return NodeRead::default();
        };
        let kept = self.kept.lock().unwrap_or_else(|e| e.into_inner()).clone();
        // A kept baseline of another pod of the same name is not this pod's.
        let kept =
            kept.filter(|k| k.pod.uid.is_none() || pod.uid.is_none() || k.pod.uid == pod.uid);
        let reading = client.read(
            node,
            kept.is_none()
                .then_some((namespace.as_str(), name.as_str())),
        );
        let now = match reading.node {
            Ok(n) => n,
            Err(e) => return unavailable(&e),
        };
        let (placement, baseline, new_baseline) = match (kept, reading.pod) {
            (Some(k), _) => (k.pod, Some(k.node), None),
            (None, Some(Ok(p))) => {
                if let (Some(want), Some(got)) = (&pod.uid, &p.uid) {
                    if want != got {
                        return unavailable(&ApiError::Garbage(format!(
                            "pod {namespace}/{name} in the API server is another pod (uid \
                             {got}, not {want})"
                        )));
                    }
                }
                let new = LabelBaseline {
                    node: now.clone(),
                    pod: p.clone(),
                };
                *self.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(new.clone());
                (p, None, Some(new))
            }
            (None, Some(Err(e))) => return unavailable(&e),
            (None, None) => return NodeRead::default(),
        };
        NodeRead {
            view: Some(NodeView::Read {
                pod: placement,
                node: now,
                baseline,
            }),
            new_baseline,
        }
    }
}
