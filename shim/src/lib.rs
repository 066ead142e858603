//! The wrapper shim: containerd's command line, the `start` and `delete` actions, the per-pod
//! daemon with its frame-level ttrpc proxy, and the checks it runs. The binary
//! `containerd-shim-kata-topo-v2` is a thin `main` over [`real_main`]. The NRI front end
//! (`kata-topo-nri`) runs the same pods' checks through [`checks`]; the integration tests use
//! the feature `testing` (the hook and the CLI share the core and the sinks library instead).

mod args;
mod bundle;
pub mod checks;
mod daemon;
mod delegate;
mod delete;
mod error;
mod group;
mod pod;
mod proxy;
mod run;
mod start;

use kata_topo_core::state;

pub use run::real_main;

/// A pod's checks over the scenario's simulated host, for the integration tests that observe a
/// real VMM (feature `testing`; not part of the product).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod testing {
    pub use crate::pod::testing::{pod, TestPod};
}
