//! `containerd-shim-kata-topo-v2`: a containerd shim v2 that forwards every call to the real
//! shim (Kata's, or runc's) and checks `Create` and `Update` against the pod's NUMA and VFIO
//! topology. See the README for how to configure it as a runtime handler.

use std::process::ExitCode;

mod args;
mod config;
mod daemon;
mod delete;
mod error;
mod guard;
mod sinks;
mod start;
mod state;
mod ttrpc;

fn main() -> ExitCode {
    run::real_main()
}

mod run;
