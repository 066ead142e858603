//! Where kata-topo's verdicts go: JSON log lines (a file, and journald where it runs),
//! containerd events on `/kata-topo/mismatch`, Kubernetes Events on the pod, node-exporter
//! textfiles, and the pod's state files — shared by the wrapper and the OCI hook.
//!
//! None of them can hold up the caller. A caller hands its item to a bounded queue and goes
//! on; a writer thread per sink does the I/O. When a queue is full (a FIFO nobody reads, a
//! hung filesystem, a slow containerd) the item is dropped and counted — in
//! `kata_topo_sink_dropped_total{sink}` and in a log line once writing works again — never
//! waited for.
//!
//! The writer threads keep what each sink must keep when it falls behind, so there are three
//! kinds, not one: the log lines and events (containerd's and Kubernetes') go through a bounded FIFO [`queue::Lane`] (every
//! line in order, the overflow dropped and counted); the state files through [`Persist`],
//! coalesced by file (only the latest version of each waits, nothing is dropped); the metrics
//! files through [`Metrics`]' own writer, whose counters live in memory and are rendered whole
//! at each change and heartbeat (a counter is never dropped). A front end serving every pod of
//! the node runs one state writer ([`Persist::another`]) and one metrics writer
//! ([`MetricsWriter`]) for all of them. One wait serves the callers of
//! all of them ([`queue`]'s `wait_until`): a writer stuck on a hung filesystem is waited for
//! only until the caller's deadline.

pub mod events;
pub mod journal;
pub mod log;
pub mod metrics;
pub mod persist;
pub mod pod_events;
pub mod queue;

pub use events::Events;
pub use log::{log_verdict, Log};
pub use metrics::{Metrics, MetricsWriter};
pub use persist::Persist;
pub use pod_events::PodEvents;
pub use queue::{Drops, Sink};
