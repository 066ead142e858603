//! The subcommands, one module each: its arguments and the function that runs it; and the
//! arguments more than one of them takes.
//!
//! Every input file is read through [`kata_topo_core::fsutil`]: bounded, and a regular file (or
//! `-`, standard input, for `--spec`, `--update` or `--baseline`); anything else is exit 2
//! naming the file and what it is.

pub(crate) mod check;
pub(crate) mod events;
pub(crate) mod status;
pub(crate) mod topology;
pub(crate) mod vm;

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;
use kata_topo_core::{Host, Sysfs, TopologySource};

/// Where the host description comes from.
#[derive(Debug, Args)]
pub(crate) struct HostArgs {
    /// An hwloc XML export to use instead of the live machine.
    #[arg(long, value_name = "FILE.xml")]
    topology: Option<PathBuf>,
    /// The sysfs root for VFIO groups and device locality. Default: /sys for the live
    /// machine; none with --topology (an XML describes another machine).
    #[arg(long, value_name = "ROOT")]
    sysfs: Option<PathBuf>,
}

impl HostArgs {
    pub(crate) fn load(&self) -> Result<(Host, Option<Sysfs>)> {
        let source = match &self.topology {
            Some(path) => TopologySource::Xml(path.clone()),
            None => TopologySource::Live,
        };
        let host = Host::load(&source)?;
        let sysfs = match (&self.sysfs, &self.topology) {
            (Some(root), _) => {
                if !root.is_dir() {
                    anyhow::bail!("sysfs root {} is not a directory", root.display());
                }
                Some(Sysfs::new(root))
            }
            (None, None) => Some(Sysfs::new("/sys")),
            (None, Some(_)) => None,
        };
        Ok((host, sysfs))
    }
}
