//! The NRI front end's pods: one [`PodChecks`] per pod it checks — the wrapper's own per-pod
//! checks, state and outputs — made as the pod is first seen, dropped when it is removed, all
//! on one [`NodeChecks`]: one topology (and one refresher thread), one state writer thread,
//! one metrics writer thread, one API server client and one Events writer for the node,
//! however many pods it checks.
//! Which pods: those of `nri_runtime_handlers` (all when empty), except a pod the wrapper
//! serves (its state names a running wrapper daemon): that pod is checked once, by the
//! wrapper, which also sees the VM.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kata_topo_core::check::intent::ANNOTATION_MODE;
use kata_topo_core::check::policy::Mode;
use kata_topo_core::config::Resolved;
use kata_topo_core::input::kata::KataConfig;
use kata_topo_proto::nri::pkg::api::v1alpha1 as nri;
use kata_topo_shim::checks::{served_by_wrapper, NodeChecks, PodChecks, Sinks};
use slog::Logger;

use crate::translate::{container_spec, resources_json, sandbox_spec};

/// The containerd namespace of CRI's pods, where the wrapper keeps their state too.
pub const NAMESPACE: &str = "k8s.io";

/// Whether a pod is checked here, decided once per pod.
#[derive(Debug, Clone)]
enum Watch {
    Checked(PodChecks),
    /// Not ours; why, for the log line said once.
    Skipped,
}

/// Every pod's checks.
#[derive(Debug)]
pub struct Front {
    node: NodeChecks,
    sinks: Sinks,
    pods: Mutex<HashMap<String, Watch>>,
}

impl Front {
    /// The front end with the node's configuration; the topology is loaded before this
    /// returns.
    pub fn new(resolved: Resolved, kata: KataConfig, sinks: Sinks) -> Arc<Self> {
        Arc::new(Self {
            node: NodeChecks::new(resolved, kata, &sinks),
            sinks,
            pods: Mutex::new(HashMap::new()),
        })
    }

    fn log(&self) -> &Logger {
        &self.sinks.log
    }

    /// The pod's checks, made (with its sandbox admitted, as the wrapper admits it at the
    /// sandbox's create) when it is first seen; `None` for a pod not checked here. `Err`: the
    /// sandbox's admission refused. `fresh`: seen first at a container's create, the pod is
    /// one the runtime made since the plugin synchronised (a pod that ran before was in the
    /// synchronisation): nothing of it is on disk to read.
    fn pod(&self, pod: &nri::PodSandbox, fresh: bool) -> Result<Option<PodChecks>, String> {
        if let Some(w) = self.lock().get(&pod.id) {
            return Ok(match w {
                Watch::Checked(c) => Some(c.clone()),
                Watch::Skipped => None,
            });
        }
        let config = self.node.config();
        let handlers = &config.nri_runtime_handlers;
        let skip = if !handlers.is_empty() && !handlers.contains(&pod.runtime_handler) {
            Some("its runtime handler is not in nri_runtime_handlers")
        } else if served_by_wrapper(config, NAMESPACE, &pod.id) {
            Some("the kata-topo wrapper serves it")
        } else {
            None
        };
        if let Some(why) = skip {
            slog::info!(self.log(), "pod not checked by the NRI plugin"; "event" => "nri-pod-skipped",
                "sandbox_id" => &pod.id, "pod_name" => &pod.name, "pod_namespace" => &pod.namespace,
                "runtime_handler" => &pod.runtime_handler, "reason" => why);
            self.lock().insert(pod.id.clone(), Watch::Skipped);
            return Ok(None);
        }
        let checks = PodChecks::new(&self.node, NAMESPACE, &pod.id, fresh);
        // Two requests of a new pod at once: the first one in keeps its checks.
        let checks = match self
            .lock()
            .entry(pod.id.clone())
            .or_insert(Watch::Checked(checks))
        {
            Watch::Checked(c) => c.clone(),
            Watch::Skipped => return Ok(None),
        };
        checks.create(&pod.id, sandbox_spec(pod))?;
        Ok(Some(checks))
    }

    /// Whether a request of this pod's container can be refused: the node enforces, or the
    /// pod or the container names a mode (`kata-topo.io/mode`, which can turn enforcement
    /// on for a pod). In audit mode nothing is refused, so the request's answer need not wait
    /// for its verdict.
    pub fn may_refuse(&self, pod: &nri::PodSandbox, container: &nri::Container) -> bool {
        self.node.config().mode == Mode::Enforce
            || pod.annotations.contains_key(ANNOTATION_MODE)
            || container.annotations.contains_key(ANNOTATION_MODE)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watch>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `CreateContainer`: a first create or a recreate of the container's name. `Err` is
    /// kata-topo's refusal.
    pub fn create(&self, pod: &nri::PodSandbox, container: &nri::Container) -> Result<(), String> {
        let Some(checks) = self.pod(pod, true)? else {
            return Ok(());
        };
        match container_spec(pod, container) {
            Ok(spec) => checks.create(&container.id, spec),
            // Unread, as the wrapper's unreadable bundle: reported by the update path's
            // `check-failed` when the container is updated; never a refusal by itself.
            Err(e) => {
                slog::warn!(self.log(), "cannot read the container"; "event" => "nri-container-unreadable",
                    "container_id" => &container.id, "sandbox_id" => &pod.id, "error" => e.to_string());
                Ok(())
            }
        }
    }

    /// `UpdateContainer` to `resources`. `Err` is kata-topo's refusal.
    pub fn update(
        &self,
        pod: &nri::PodSandbox,
        container: &nri::Container,
        resources: &nri::LinuxResources,
    ) -> Result<(), String> {
        let Some(checks) = self.pod(pod, false)? else {
            return Ok(());
        };
        if !checks.knows(&container.id) {
            // Created while no plugin was connected and not synchronised since: what it runs
            // with is its baseline, as a first create would have recorded it.
            self.adopt(&checks, pod, container);
        }
        checks.update(&container.id, &resources_json(resources))
    }

    fn adopt(&self, checks: &PodChecks, pod: &nri::PodSandbox, container: &nri::Container) {
        if let Ok(spec) = container_spec(pod, container) {
            let current = spec.resources.clone();
            checks.adopt(&container.id, spec, current);
        }
    }

    /// `Synchronize`: the pods and containers that run already, remembered with their
    /// baselines (kept from before when the state has them), none checked.
    pub fn synchronize(&self, pods: &[nri::PodSandbox], containers: &[nri::Container]) {
        let by_id: HashMap<&str, &nri::PodSandbox> =
            pods.iter().map(|p| (p.id.as_str(), p)).collect();
        for pod in pods {
            // A refusal of a running pod's sandbox is only reported: nothing is asked.
            let _ = self.pod(pod, false);
        }
        for c in containers {
            let Some(pod) = by_id.get(c.pod_sandbox_id.as_str()) else {
                continue;
            };
            if let Ok(Some(checks)) = self.pod(pod, false) {
                self.adopt(&checks, pod, c);
            }
        }
        // What a pod removed while no plugin was connected left (the plugin's own pod's
        // among it: it exits before its sandbox goes).
        let live: Vec<&str> = pods.iter().map(|p| p.id.as_str()).collect();
        for gone in self.node.remove_gone(NAMESPACE, &live) {
            slog::info!(self.log(), "removed the state of a pod the runtime no longer has"; "event" => "nri-gone-removed",
                "sandbox_id" => gone);
        }
        slog::info!(self.log(), "synchronized with the runtime"; "event" => "nri-synchronized",
            "pods" => pods.len(), "containers" => containers.len(),
            "checked_pods" => self.lock().values().filter(|w| matches!(w, Watch::Checked(_))).count());
    }

    /// `RemoveContainer`.
    pub fn remove_container(&self, container: &nri::Container) {
        let checks = match self.lock().get(&container.pod_sandbox_id) {
            Some(Watch::Checked(c)) => c.clone(),
            _ => return,
        };
        checks.remove(&container.id);
    }

    /// `RemovePodSandbox`: the pod's state and metrics go, and the memory its checks held
    /// goes back to the system.
    pub fn remove_pod(&self, pod: &nri::PodSandbox) {
        if let Some(Watch::Checked(checks)) = self.lock().remove(&pod.id) {
            checks.remove(&pod.id);
            checks.forget();
        } else {
            return;
        }
        self.node.prune();
        crate::malloc::trim();
    }

    /// Waits, until `deadline`, for every pod's state mirror to catch up.
    pub fn flush(&self, deadline: std::time::Instant) {
        let pods: Vec<PodChecks> = self
            .lock()
            .values()
            .filter_map(|w| match w {
                Watch::Checked(c) => Some(c.clone()),
                Watch::Skipped => None,
            })
            .collect();
        for p in pods {
            p.flush(deadline);
        }
    }

    /// How many pods are checked here.
    pub fn checked_pods(&self) -> usize {
        self.lock()
            .values()
            .filter(|w| matches!(w, Watch::Checked(_)))
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_core::config::{Config, ConfigSource};
    use kata_topo_sinks::{Drops, Events};

    fn front(mode: Mode) -> (tempfile::TempDir, Arc<Front>) {
        let dir = tempfile::tempdir().expect("tmp");
        let config = Config {
            mode,
            state_dir: dir.path().join("state"),
            log_file: dir.path().join("log"),
            topology_xml: Some(kata_topo_core::testutil::xml("24em64t-2n6c2t-pci.xml")),
            kubeconfig: None,
            ..Config::default()
        };
        let resolved = Resolved {
            config,
            file: None,
            source: ConfigSource::Defaults,
        };
        let log = Logger::root(slog::Discard, slog::o!());
        let sinks = Sinks {
            log,
            events: Events::off(),
            drops: Drops::new(),
        };
        (dir, Front::new(resolved, KataConfig::default(), sinks))
    }

    fn with_mode(mode: &str) -> HashMap<String, String> {
        HashMap::from([(ANNOTATION_MODE.to_string(), mode.to_string())])
    }

    #[test]
    fn only_a_request_that_can_be_refused_waits_for_its_verdict() {
        let plain = (nri::PodSandbox::default(), nri::Container::default());
        let (_d, audit) = front(Mode::Audit);
        assert!(
            !audit.may_refuse(&plain.0, &plain.1),
            "audit: nothing refused"
        );
        // A pod or a container that names a mode may turn enforcement on.
        let pod = nri::PodSandbox {
            annotations: with_mode("enforce"),
            ..Default::default()
        };
        assert!(audit.may_refuse(&pod, &plain.1));
        let container = nri::Container {
            annotations: with_mode("enforce"),
            ..Default::default()
        };
        assert!(audit.may_refuse(&plain.0, &container));
        let (_d, enforce) = front(Mode::Enforce);
        assert!(enforce.may_refuse(&plain.0, &plain.1));
    }
}
