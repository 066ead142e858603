//! Argument parsing and dispatch: the command line, and each subcommand handed to its module
//! under `commands/`. Exit codes: 0 no `error` finding, 1 at least one, 2 bad usage or
//! unreadable input (one line on stderr), or standard output that cannot be written (nothing
//! on stderr for a closed pipe, one line otherwise).

use std::io::Write;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use kata_topo_core::text::printable;
use kata_topo_core::VERSION;

use crate::commands::{check, diagnose, events, intent, status, topology, vm};
use crate::out::StdoutGone;

/// kata-topo: keep Kata pods on the NUMA and VFIO topology they were admitted with.
#[derive(Debug, Parser)]
#[command(name = "kata-topo", version = VERSION, disable_version_flag = true)]
struct Cli {
    /// Print the version.
    #[arg(short = 'v', short_alias = 'V', long, action = clap::ArgAction::Version)]
    version: Option<bool>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Show the host's NUMA nodes and PCI devices with their locality and VFIO group.
    Topology(topology::TopologyArgs),
    /// Check one request (a create, a recreate or an update) and print the verdict.
    Check(Box<check::CheckArgs>),
    /// The sandboxes the wrappers watch, their baselines and latest findings. Exit 0 clean,
    /// 1 findings, 2 unreadable state (a node-problem-detector custom plugin).
    Status(status::StatusArgs),
    /// Follow kata-topo's events (`/kata-topo/*`) from containerd until interrupted; exit 2
    /// when containerd does not answer within 5 s.
    Events(events::EventsArgs),
    /// Show a running VMM's vCPU threads and their host CPUs, its memory policy and its guest
    /// NUMA layout.
    Vm(vm::VmArgs),
    /// What the kubelet admitted for a pod (PodResources) and where its intent comes from;
    /// exit 1 when the kubelet gives none.
    Intent(intent::IntentArgs),
    /// For one pod on this node: have its node's labels changed since admission, does its
    /// node affinity hold, does its topology binding hold — each with its evidence. Exit 0
    /// all hold, 1 a finding, 2 cannot tell.
    Diagnose(diagnose::DiagnoseArgs),
}

/// Parses arguments and runs; maps errors to exit code 2 with one line on stderr.
pub(crate) fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version print to stdout: a failed write is exit 2 as elsewhere.
            let printed = e.print();
            return ExitCode::from(if e.use_stderr() || printed.is_err() {
                2
            } else {
                0
            });
        }
    };
    let result = match cli.command {
        Command::Topology(args) => topology::topology(&args),
        Command::Check(args) => check::check(&args),
        Command::Vm(args) => vm::vm(&args),
        Command::Status(args) => status::status(&args),
        Command::Events(args) => events::events(&args),
        Command::Intent(args) => intent::intent(&args),
        Command::Diagnose(args) => diagnose::diagnose(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            match e.downcast_ref::<StdoutGone>() {
                Some(gone) if gone.is_closed_pipe() => {}
                _ => {
                    // stderr may be gone too: nothing more to do then.
                    let _ = writeln!(std::io::stderr(), "kata-topo: {}", one_line(&e));
                }
            }
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, escaped (a cause may quote a file's content).
fn one_line(e: &anyhow::Error) -> String {
    printable(&format!("{e:#}")).into_owned()
}
