//! containerd events on `/kata-topo/mismatch`: a bounded queue to a publisher thread, which
//! forwards each through containerd's event service over ttrpc (`TTRPC_ADDRESS`). A slow or
//! absent containerd costs events, never a request's time; every event lost — turned away by
//! the full queue or not taken by containerd — counts in `kata_topo_sink_dropped_total`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_core::Verdict;
use prost::Message;
use slog::Logger;

use crate::queue::{Drops, Lane, Sink};
use kata_topo_proto::wire::{Any, Client, Envelope, ForwardRequest, Timestamp};

/// The event topic (a contract).
pub const TOPIC_MISMATCH: &str = "/kata-topo/mismatch";
/// containerd's event service over ttrpc.
pub const EVENTS_SERVICE: &str = "containerd.services.events.ttrpc.v1.Events";
/// How long the daemon's publisher waits for containerd to take one event.
const PUBLISH_TIMEOUT: Duration = Duration::from_secs(2);
/// How many events wait at most.
const QUEUE: usize = 64;

/// Publishes verdicts to containerd off the request path.
#[derive(Debug, Clone, Default)]
pub struct Events(Option<Arc<Lane<Vec<u8>>>>);

impl Events {
    /// No events (no containerd to publish to).
    pub fn off() -> Self {
        Self(None)
    }

    /// A publisher to containerd's ttrpc address for a namespace; no address: no events.
    pub fn start(
        ttrpc_address: Option<String>,
        namespace: String,
        log: Logger,
        drops: Arc<Drops>,
    ) -> Self {
        let Some(address) = ttrpc_address.filter(|a| !a.is_empty()) else {
            return Self(None);
        };
        let failed = drops.clone();
        let lane = Lane::start("events", QUEUE, Sink::Events, drops, move |payload| {
            let deadline = Instant::now() + PUBLISH_TIMEOUT;
            if let Err(e) = publish(&address, &namespace, payload, deadline) {
                // Lost like one the full queue turned away: counted the same.
                failed.add(Sink::Events, 1);
                slog::warn!(log, "cannot publish event to containerd";
                    "event" => "publish-failed", "address" => &address, "error" => e.to_string());
            }
        });
        Self(Some(Arc::new(lane)))
    }

    /// Waits until every event queued so far was published or given up, or `deadline`
    /// passed.
    pub fn flush(&self, deadline: Instant) -> bool {
        self.0.as_ref().is_none_or(|lane| lane.flush(deadline))
    }

    /// Queues a verdict for `/kata-topo/mismatch`; drops and counts it if the queue is full.
    pub fn mismatch(&self, v: &Verdict) {
        if let (Some(lane), Some(payload)) = (&self.0, payload(v)) {
            lane.push(payload);
        }
    }
}

/// A verdict as the event's `google.protobuf.StringValue`.
pub fn payload(v: &Verdict) -> Option<Vec<u8>> {
    let json = serde_json::to_string(v).ok()?;
    // A google.protobuf.StringValue is prost's `String` message.
    Some(json.encode_to_vec())
}

/// Sends one event (an encoded `StringValue`) through `Events/Forward`, giving up at
/// `deadline`.
pub fn publish(
    address: &str,
    namespace: &str,
    string_value: Vec<u8>,
    deadline: Instant,
) -> std::io::Result<()> {
    let mut client = Client::connect(address, deadline)?;
    let request = ForwardRequest {
        envelope: Some(Envelope {
            timestamp: Some(Timestamp::from(std::time::SystemTime::now())),
            namespace: namespace.to_string(),
            topic: TOPIC_MISMATCH.to_string(),
            event: Some(Any {
                type_url: "google.protobuf.StringValue".to_string(),
                value: string_value,
            }),
        }),
    };
    let response = client.call(
        EVENTS_SERVICE,
        "Forward",
        request.encode_to_vec(),
        namespace,
        deadline,
    )?;
    match response.status {
        Some(s) if s.code != 0 => Err(std::io::Error::other(format!(
            "containerd refused the event: {}",
            s.message
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn an_event_that_could_not_be_published_is_counted_as_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let verdict: Verdict = serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb", "container_id": "c",
            "container_name": "app", "pod": {}, "policy": "restricted", "mode": "audit",
            "decision": "allow", "findings": []
        }))
        .expect("verdict");
        let drops = Drops::new();
        // No containerd behind the address: every publish fails.
        let events = Events::start(
            Some(format!("unix://{}", dir.path().join("gone.sock").display())),
            "k8s.io".into(),
            Logger::root(slog::Discard, slog::o!()),
            drops.clone(),
        );
        events.mismatch(&verdict);
        events.mismatch(&verdict);
        assert!(events.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(drops.get(Sink::Events), 2);
        // One containerd refuses: counted too.
        let sock = dir.path().join("refusing.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                drop(conn);
            }
        });
        let events = Events::start(
            Some(format!("unix://{}", sock.display())),
            "k8s.io".into(),
            Logger::root(slog::Discard, slog::o!()),
            drops.clone(),
        );
        events.mismatch(&verdict);
        assert!(events.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(drops.get(Sink::Events), 3);
    }

    #[test]
    fn a_containerd_that_never_accepts_costs_at_most_the_deadline() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ttrpc.sock");
        // Listening, never accepting, never answering.
        let _listener = UnixListener::bind(&path).expect("bind");
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let address = format!("unix://{}", path.display());
        std::thread::spawn(move || {
            // More calls than the backlog holds: later connects find it full.
            let results: Vec<_> = (0..200)
                .map(|_| {
                    publish(
                        &address,
                        "k8s.io",
                        Vec::new(),
                        Instant::now() + Duration::from_millis(20),
                    )
                })
                .collect();
            let _ = done_tx.send(results);
        });
        // A hang guard, not a timing.
        let results = done_rx
            .recv_timeout(Duration::from_secs(60))
            .expect("publish gave up at its deadline");
        assert!(results.iter().all(Result::is_err));
        assert!(results.iter().all(|r| r
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::TimedOut
                || e.kind() == std::io::ErrorKind::WouldBlock)));
    }
}
