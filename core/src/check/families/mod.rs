//! The rule families, one file each, each a `check(&Context, &mut Findings)` that adds the
//! findings of its rules; [`super::FAMILIES`] runs them in the order their findings appear in
//! a verdict.

pub(in crate::check) mod admission;
pub(in crate::check) mod drift;
pub(in crate::check) mod node_affinity;
pub(in crate::check) mod placement;
pub(in crate::check) mod vfio;
pub(in crate::check) mod vm;
