//! The subcommands, one module each: its arguments and the function that runs it.

pub(crate) mod events;
pub(crate) mod status;
pub(crate) mod vm;
