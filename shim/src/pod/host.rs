//! The host topology one daemon checks against: loaded off the request path, reloaded every
//! `topology_refresh_seconds`. Only the first load of a new daemon is waited for, and only for
//! a bounded time ([`CurrentHost::current_within`]): on a fresh node the first pod's daemon
//! discovers the machine while the delegate starts, and its first check would otherwise always
//! find it still loading. After that bound a check cannot run (it reports `check-failed`); a
//! failed reload keeps the previous topology and says so in every verdict until a reload
//! succeeds.
//!
//! The live machine goes through the node-wide cache ([`kata_topo_core::host::cache`]): the first load
//! takes the cached XML when it matches the machine's key, and a refresh only reads the key
//! again — the topology is loaded anew (from the cache, or discovered) when the key changed,
//! so `topology-drift` follows the machine without a discovery every period.

use std::panic::catch_unwind;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use kata_topo_core::host::cache::{CacheKey, Loaded, Origin, TopologyCache};
use kata_topo_core::host::HostError;
use kata_topo_core::wait::Gate;
use kata_topo_core::{Host, TopologySource};
use kata_topo_sinks::log::rfc3339;
use kata_topo_sinks::Metrics;
use slog::Logger;

#[derive(Debug, Default)]
struct Slot {
    host: Option<Arc<Host>>,
    /// The machine's key the host was loaded under (the cache only).
    key: Option<CacheKey>,
    error: Option<String>,
    loaded_at: Option<SystemTime>,
    tried: bool,
}

/// The host topology a daemon checks against now, and how fresh it is (the node-wide
/// [`TopologyCache`] on disk is what it loads from).
#[derive(Debug)]
pub(crate) struct CurrentHost {
    source: TopologySource,
    /// The node-wide cache, for the live machine unless `topology_cache = false`.
    cache: Option<TopologyCache>,
    slot: RwLock<Slot>,
    /// The first load: waited for once, for a bounded time.
    first: Gate,
}

impl CurrentHost {
    pub(crate) fn new(source: TopologySource, cache: Option<TopologyCache>) -> Self {
        Self {
            source,
            cache,
            slot: RwLock::new(Slot::default()),
            first: Gate::new(),
        }
    }

    /// Says that the first load is under way (the refresher thread is about to run it), so
    /// that [`CurrentHost::current_within`] waits for it.
    pub(crate) fn first_load_asked(&self) {
        self.first.asked();
    }

    fn first_load_finished(&self) {
        self.first.finished();
    }

    /// [`CurrentHost::current`], after waiting at most `wait` for the first load when it is
    /// under way. Once it finished, when none was asked for, or once one wait ran out, this
    /// never waits (a load that hangs must not cost every request the wait).
    pub(crate) fn current_within(&self, wait: Duration) -> (Option<Arc<Host>>, Option<String>) {
        self.first.wait_within(wait);
        self.current()
    }

    /// Loads the topology — or, through the cache, finds that the machine's key has not
    /// changed and keeps it; keeps the previous one when a load fails. Returns whether a
    /// topology is in place and current.
    /// `group` names the pod whose daemon loads it, in the log (none: the node's, shared).
    pub(crate) fn refresh(&self, log: &Logger, metrics: &Metrics, group: Option<&str>) -> bool {
        let known = self
            .slot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .key
            .clone();
        let mut changed = Vec::new();
        if let (Some(cache), Some(known)) = (&self.cache, &known) {
            match cache.key() {
                Ok(now) if now == *known => {
                    let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
                    // The nodes' memory moves without a change of topology: read it afresh.
                    if let Some(host) = slot.host.as_deref().and_then(|h| cache.with_live_memory(h))
                    {
                        slot.host = Some(Arc::new(host));
                    }
                    slot.error = None;
                    slot.loaded_at = Some(SystemTime::now());
                    drop(slot);
                    metrics.refreshed(true);
                    return true;
                }
                Ok(now) => changed = now.changed_since(known),
                // Read again by the load, which discovers the machine without the cache.
                Err(_) => {}
            }
        }
        let loaded = catch_unwind(|| match &self.cache {
            Some(cache) => cache.load(),
            None => Host::load(&self.source).map(|host| Loaded {
                host,
                key: None,
                origin: match &self.source {
                    TopologySource::Xml(_) => Origin::Xml,
                    TopologySource::Live => Origin::Live,
                },
            }),
        })
        .unwrap_or_else(|_| Err(HostError::NoCpu("hwloc panicked".into())));
        let ok = loaded.is_ok();
        let mut slot = self.slot.write().unwrap_or_else(|e| e.into_inner());
        match loaded {
            Ok(loaded) => {
                let host = loaded.host;
                if slot.error.is_some() || slot.host.is_none() || !changed.is_empty() {
                    slog::info!(log, "topology loaded"; "event" => "topology-loaded",
                        "source" => &host.source_name, "fingerprint" => host.fingerprint(),
                        "origin" => loaded.origin.to_string(),
                        "changed" => changed.join(","), "sandbox_id" => group);
                }
                slot.host = Some(Arc::new(host));
                slot.key = loaded.key;
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
        self.first_load_finished();
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

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_sinks::{Drops, Log};
    use std::path::Path;
    use std::time::{Duration, Instant};

    /// The key inputs of a machine under `root`, as the kernel lays them out: this machine's
    /// CPUs (its discovery must match them to be stored), no NUMA and no PCI bus.
    fn key_inputs(root: &Path, boot: &str) {
        let cpus = |f: &str| {
            std::fs::read_to_string(format!("/sys/devices/system/cpu/{f}")).expect("this machine")
        };
        for (rel, text) in [
            ("proc/sys/kernel/random/boot_id", boot),
            ("sys/devices/system/cpu/online", &cpus("online")),
            ("sys/devices/system/cpu/present", &cpus("present")),
            ("proc/meminfo", "MemTotal: 1048576 kB\n"),
        ] {
            let path = root.join(rel);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
            std::fs::write(path, text).expect("write");
        }
    }

    fn lines(log: &Log, path: &Path) -> Vec<serde_json::Value> {
        assert!(log.flush(Instant::now() + Duration::from_secs(10)));
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).expect("JSON line"))
            .filter(|l: &serde_json::Value| l["event"] == "topology-loaded")
            .collect()
    }

    /// A check waits for the first load only while one is under way, and only as long as it
    /// is told to; once a load finished nothing waits.
    #[test]
    fn only_a_first_load_under_way_is_waited_for_and_only_so_long() {
        let xml = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../core/tests/fixtures/hwloc/xml/nvidiaDGX2.xml");
        let log = Log::with_journal(
            &std::env::temp_dir().join("unused"),
            false,
            None,
            Drops::new(),
        );
        let still = Some("the host topology is still loading".to_string());

        // No load asked for: the answer is the state now.
        let idle = CurrentHost::new(TopologySource::Xml(xml.clone()), None);
        assert_eq!(idle.current_within(Duration::from_secs(3600)).1, still);

        // A load asked for that never finishes: the bound holds, and once it ran out no
        // later check waits (were it to, this would not answer within the minute).
        let stuck = Arc::new(CurrentHost::new(TopologySource::Xml(xml.clone()), None));
        stuck.first_load_asked();
        assert_eq!(stuck.current_within(Duration::from_millis(50)).1, still);
        let (tx, rx) = std::sync::mpsc::channel();
        let again = Arc::clone(&stuck);
        std::thread::spawn(move || {
            let _ = tx.send(again.current_within(Duration::from_secs(3600)).1);
        });
        assert_eq!(
            rx.recv_timeout(Duration::from_secs(60))
                .expect("no second wait"),
            still
        );

        // A load under way that finishes: the check gets its host.
        let cache = Arc::new(CurrentHost::new(TopologySource::Xml(xml), None));
        cache.first_load_asked();
        let loader = {
            let cache = Arc::clone(&cache);
            let logger = log.logger().clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                cache.refresh(&logger, &Metrics::off(), Some("sb1"))
            })
        };
        let (host, stale) = cache.current_within(Duration::from_secs(3600));
        assert!(host.is_some(), "waited for the load: {stale:?}");
        assert_eq!(stale, None);
        assert!(loader.join().expect("loader"));
        // Asking again after it finished changes nothing: no later check waits.
        cache.first_load_asked();
        assert!(cache.current_within(Duration::from_secs(3600)).0.is_some());
    }

    /// A refresh reads the machine's key: the same key keeps the host it has, a changed one
    /// loads it again (here: discovers, since the cache has no file for the new key) and says
    /// what changed.
    #[test]
    fn a_refresh_reloads_only_when_the_key_changed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("machine");
        key_inputs(&root, "1e4f0b8a-0000-4000-8000-000000000000");
        let state = dir.path().join("state");
        let log_path = dir.path().join("kt.log");
        let log = Log::with_journal(&log_path, false, None, Drops::new());
        let cache = CurrentHost::new(
            TopologySource::Live,
            Some(TopologyCache::new(&state, &root)),
        );
        let (host, stale) = cache.current();
        assert!(host.is_none());
        assert_eq!(stale.as_deref(), Some("the host topology is still loading"));

        assert!(cache.refresh(log.logger(), &Metrics::off(), Some("sb1")));
        let (first, stale) = cache.current();
        let first = first.expect("loaded");
        assert_eq!(stale, None);
        let loaded = lines(&log, &log_path);
        assert_eq!(loaded.len(), 1, "{loaded:?}");
        let origin = loaded[0]["origin"].as_str().expect("origin");
        assert!(
            origin.starts_with("discovered") && origin.contains("stored in"),
            "{origin}"
        );

        assert!(cache.refresh(log.logger(), &Metrics::off(), Some("sb1")));
        let same = cache.current().0.expect("loaded");
        assert!(
            Arc::ptr_eq(&first, &same),
            "an unchanged key keeps the host"
        );
        assert_eq!(lines(&log, &log_path).len(), 1);

        key_inputs(&root, "2f5a1c9b-0000-4000-8000-000000000000");
        assert!(cache.refresh(log.logger(), &Metrics::off(), Some("sb1")));
        let after = cache.current().0.expect("loaded");
        assert!(!Arc::ptr_eq(&first, &after), "a changed key loads again");
        let loaded = lines(&log, &log_path);
        assert_eq!(loaded.len(), 2, "{loaded:?}");
        assert_eq!(loaded[1]["changed"], "boot");

        // Another daemon of the node finds the new key's file: no discovery.
        let other = CurrentHost::new(
            TopologySource::Live,
            Some(TopologyCache::new(&state, &root)),
        );
        assert!(other.refresh(log.logger(), &Metrics::off(), Some("sb2")));
        let loaded = lines(&log, &log_path);
        let origin = loaded[2]["origin"].as_str().expect("origin");
        assert!(origin.starts_with("cached in"), "{origin}");
        assert_eq!(
            other.current().0.expect("loaded").fingerprint(),
            after.fingerprint()
        );
    }
}
