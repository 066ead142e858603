//! The wrapper shim: containerd's command line, the `start` and `delete` actions, the per-pod
//! daemon with its frame-level ttrpc proxy, and the checks it runs. The binary
//! `containerd-shim-kata-topo-v2` is a thin `main` over [`real_main`]; nothing else depends on
//! this crate (the hook and the CLI share the core and the sinks library instead).

mod args;
mod checks;
mod daemon;
mod delete;
mod error;
mod proxy;
mod run;
mod start;

use kata_topo_core::state;
use kata_topo_sinks::ttrpc;

pub use run::real_main;
