//! kata-topo core: what the host is ([`host`]: hwloc, sysfs, PCI, the topology cache), what
//! the VM got ([`vm`]), what a request brings in from Kubernetes and containerd ([`input`]:
//! the OCI spec, Kata's configuration and annotations, the kubelet, node affinity), and the
//! check itself ([`check`]: phases, context, rule families, severity, verdict).
//!
//! No async runtime and no transport here: the shim, the hook and the CLI are thin layers over
//! [`check::Checker`] and its one entry point per phase (`admit`, `recreate`, `update`,
//! `observe`), which give finished verdicts.

#![forbid(unsafe_code)]

pub mod check;
pub mod config;
pub mod digest;
pub mod files;
pub mod host;
pub mod idset;
pub mod input;
pub mod process;
pub mod state;
#[cfg(any(test, feature = "testing"))]
pub mod testutil;
pub mod text;
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

pub use check::intent::Baseline;
pub use check::policy::{Defaults, Mode, PodOverrides, Policy};
pub use check::rule::{Finding, Rule, Severity};
pub use check::verdict::{Decision, Operation, UpdateClass, Verdict};
pub use check::{Checker, Overrides, Phase, Request, Running};
pub use host::pci::Bdf;
pub use host::sysfs::Sysfs;
pub use host::{Host, Locality, TopologySource};
pub use idset::IdSet;
pub use input::spec::{ContainerSpec, Resources};
