//! The host topology one daemon checks against: loaded off the request path, reloaded every
//! `topology_refresh_seconds`, and never waited for. Until the first load finished a check
//! cannot run (it reports `check-failed`); a failed reload keeps the previous topology and
//! says so in every verdict until a reload succeeds.

use std::panic::catch_unwind;
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use kata_topo::{Host, TopologySource};
use kata_topo_sinks::log::rfc3339;
use kata_topo_sinks::Metrics;
use slog::Logger;

#[derive(Debug, Default)]
struct Slot {
    host: Option<Arc<Host>>,
    error: Option<String>,
    loaded_at: Option<SystemTime>,
    tried: bool,
}

/// The topology and how fresh it is.
#[derive(Debug)]
pub(crate) struct HostCache {
    source: TopologySource,
    slot: RwLock<Slot>,
}

impl HostCache {
    pub(crate) fn new(source: TopologySource) -> Self {
        Self {
            source,
            slot: RwLock::new(Slot::default()),
        }
    }

    /// Loads the topology; keeps the previous one when the load fails. Returns whether it
    /// loaded.
    pub(crate) fn refresh(&self, log: &Logger, metrics: &Metrics, group: &str) -> bool {
        let loaded = catch_unwind(|| Host::load(&self.source))
            .unwrap_or_else(|_| Err(kata_topo::host::HostError::NoCpu("hwloc panicked".into())));
        let ok = loaded.is_ok();
        let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
        match loaded {
            Ok(host) => {
                if slot.error.is_some() || slot.host.is_none() {
                    slog::info!(log, "topology loaded"; "event" => "topology-loaded",
                        "source" => &host.source_name, "fingerprint" => host.fingerprint(),
                        "sandbox_id" => group);
                }
                slot.host = Some(Arc::new(host));
                slot.error = None;
                slot.loaded_at = Some(SystemTime::now());
            }
            Err(e) => {
                let message = e.to_string();
                if slot.error.as_deref() != Some(message.as_str()) {
                    slog::warn!(log, "topology load failed"; "event" => "topology-failed",
                        "error" => &message, "sandbox_id" => group);
                }
                slot.error = Some(message);
            }
        }
        slot.tried = true;
        drop(slot);
        metrics.refreshed(ok);
        ok
    }

    /// The topology now, and why it is stale or missing. Never waits for a load.
    pub(crate) fn current(&self) -> (Option<Arc<Host>>, Option<String>) {
        let slot = self.slot.read().unwrap_or_else(|e| e.into_inner());
        let stale = match (&slot.error, slot.loaded_at) {
            (Some(e), Some(t)) => Some(format!(
                "topology refresh failed ({e}); checked against the topology loaded at {}",
                rfc3339(t)
            )),
            (Some(e), None) => Some(format!("no host topology ({e})")),
            (None, _) if !slot.tried => Some("the host topology is still loading".to_string()),
            (None, _) => None,
        };
        (slot.host.clone(), stale)
    }
}
