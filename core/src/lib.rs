//! kata-topo core: what the host is (hwloc, sysfs), what a pod wants (annotations, baseline),
//! what a request asks (OCI spec, `LinuxResources`), and which rules that breaks.
//!
//! No async runtime and no transport here: the shim, the hook and the CLI are thin layers over
//! [`check::Checker`] and its one entry point per phase (`admit`, `recreate`, `update`,
//! `observe`), which give finished verdicts.

#![forbid(unsafe_code)]

pub mod affinity;
pub mod cache;
pub mod check;
pub mod config;
pub mod digest;
pub mod files;
pub mod host;
pub mod idset;
pub mod intent;
pub mod kata;
pub mod kubelet;
pub mod pci;
pub mod policy;
pub mod process;
pub mod request;
pub mod rule;
pub mod state;
pub mod sysfs;
#[cfg(any(test, feature = "testing"))]
pub mod testutil;
pub mod text;
pub mod verdict;
pub mod vm;
pub mod wait;

/// kata-topo's version and the git revision it was built from, as every binary prints it
/// (`--version`) and as the topology cache's key includes it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KATA_TOPO_GIT_REV"),
    ")"
);

pub use check::{Checker, Overrides, Phase, Request, Running};
pub use host::{Host, Locality, TopologySource};
pub use idset::IdSet;
pub use intent::Baseline;
pub use pci::Bdf;
pub use policy::{Defaults, Mode, PodOverrides, Policy};
pub use request::{ContainerSpec, Resources};
pub use rule::{Finding, Rule, Severity};
pub use sysfs::Sysfs;
pub use verdict::{Decision, Operation, UpdateClass, Verdict};
