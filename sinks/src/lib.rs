//! Where kata-topo's verdicts go: JSON log lines (a file, and journald where it runs),
//! containerd events on `/kata-topo/mismatch`, node-exporter textfiles, and the pod's state
//! files — shared by the wrapper and the OCI hook.
//!
//! None of them can hold up the caller. A caller hands its item to a bounded queue and goes
//! on; a writer thread per sink does the I/O. When a queue is full (a FIFO nobody reads, a
//! hung filesystem, a slow containerd) the item is dropped and counted — in
//! `kata_topo_sink_dropped_total{sink}` and in a log line once writing works again — never
//! waited for.

pub mod events;
pub mod journal;
pub mod log;
pub mod metrics;
pub mod persist;
pub mod queue;

pub use events::Events;
pub use log::{log_verdict, Log};
pub use metrics::Metrics;
pub use persist::Persist;
pub use queue::{Drops, Sink};
