//! kata-topo as a containerd NRI plugin: the binary `kata-topo-nri` connects to the runtime's
//! NRI socket (`nri_socket`), registers as plugin `kata-topo` (index `nri_plugin_index`) and
//! runs the wrapper's per-pod checks ([`kata_topo_shim::checks`], over the same core phases)
//! on each container create and update, before the runtime applies it.
//!
//! - [`mux`]: NRI's two ttrpc connections over the one socket, on the project's ttrpc framing;
//! - [`session`]: one connection — registration, then the runtime's requests, each answered
//!   within the budget;
//! - [`front`]: the pods checked here, and what each request does to them;
//! - [`translate`]: NRI's pod, container and resources as the core reads them;
//! - `malloc`: one malloc arena, and the heap's free pages given back once a pod is removed.

pub mod front;
mod malloc;
pub mod mux;
mod run;
pub mod session;
pub mod translate;

pub use run::real_main;
