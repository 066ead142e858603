//! The wrapper shim's parts: containerd's command line, `[topology_guard]`, the frame-level
//! ttrpc proxy, the checks and their sinks. The binary `containerd-shim-kata-topo-v2` is a thin
//! `main` over [`run::real_main`].

pub mod args;
pub mod config;
pub mod daemon;
pub mod delete;
pub mod error;
pub mod guard;
pub mod run;
pub mod sinks;
pub mod start;

/// The baseline store lives in the core (`kata_topo::state`).
pub use kata_topo::state;
pub mod ttrpc;
