//! The subcommands, one module each: its arguments and the function that runs it; and the
//! arguments more than one of them takes.
//!
//! Every input file is read through [`kata_topo_core::files`]: bounded, and a regular file (or
//! `-`, standard input, for `--spec`, `--update` or `--baseline`); anything else is exit 2
//! naming the file and what it is.

pub(crate) mod check;
pub(crate) mod diagnose;
pub(crate) mod events;
pub(crate) mod intent;
pub(crate) mod status;
pub(crate) mod topology;
pub(crate) mod vm;

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use kata_topo_core::text::printable;
use kata_topo_core::wait::{run_noting, Progress, WaitError};
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
    /// The most to wait for the topology, in seconds (a read under /sys or /proc that blocks
    /// — a hung device — would otherwise hang the command). What it waits for is said after
    /// a second.
    #[arg(long, value_name = "SECONDS", default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    timeout: u64,
}

impl HostArgs {
    pub(crate) fn load(&self) -> Result<(Host, Option<Sysfs>)> {
        let source = match &self.topology {
            Some(path) => TopologySource::Xml(path.clone()),
            None => TopologySource::Live,
        };
        let budget = Duration::from_secs(self.timeout);
        let progress = Progress::new(match &source {
            TopologySource::Xml(path) => format!("loading {}", path.display()),
            TopologySource::Live => kata_topo_core::host::cache::discovering(
                &kata_topo_core::host::cache::this_machine_root(),
            ),
        });
        let mut say = |step: &str| {
            let _ = writeln!(
                std::io::stderr(),
                "kata-topo: waiting for the topology: {}",
                printable(step)
            );
        };
        let host = match run_noting(
            budget,
            Some((Duration::from_secs(1), &mut say)),
            &progress,
            move || Host::load(&source),
        ) {
            Ok(host) => host?,
            Err(WaitError::TimedOut { waiting_for, .. }) => anyhow::bail!(
                "gave up after {} s: still {waiting_for} (a read that blocks: a hung device?)",
                self.timeout
            ),
            Err(e) => return Err(e.into()),
        };
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
