//! Argument parsing and the subcommands. Exit codes: 0 no `error` finding, 1 at least one,
//! 2 bad usage or unreadable input (one line on stderr), or standard output that cannot be
//! written (nothing on stderr for a closed pipe, one line otherwise).
//!
//! Every input file is read through [`kata_topo::fsutil`]: bounded, and a regular file (or
//! `-`, standard input, for `--spec`, `--update` or `--baseline`); anything else is exit 2
//! naming the file and what it is.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use kata_topo::fsutil;
use kata_topo::kata::KataConfig;
use kata_topo::request::{RequestError, MAX_RESOURCES_BYTES, MAX_SPEC_BYTES};
use kata_topo::text::printable;
use kata_topo::vm::VmView;
use kata_topo::{
    Baseline, Checker, ContainerSpec, Defaults, Mode, Overrides, Policy, Request, Resources,
};

use crate::commands::{events, status, topology, vm, HostArgs};
use crate::out::{self, StdoutGone};

/// The largest baseline accepted (one is a few hundred bytes).
const MAX_BASELINE_BYTES: u64 = 1024 * 1024;

use kata_topo::VERSION;

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
    Check(CheckArgs),
    /// The sandboxes the wrappers watch, their baselines and latest findings. Exit 0 clean,
    /// 1 findings, 2 unreadable state (a node-problem-detector custom plugin).
    Status(status::StatusArgs),
    /// Follow kata-topo's events (`/kata-topo/*`) from containerd until interrupted.
    Events(events::EventsArgs),
    /// Show a running VMM's vCPU threads and their host CPUs, its memory policy and its guest
    /// NUMA layout.
    Vm(vm::VmArgs),
}

#[derive(Debug, Args)]
struct CheckArgs {
    /// The container's OCI spec (a bundle's config.json).
    #[arg(long, value_name = "CONFIG.json")]
    spec: PathBuf,
    /// An OCI LinuxResources JSON: check an update of the container instead of its create.
    #[arg(long, value_name = "RESOURCES.json")]
    update: Option<PathBuf>,
    /// The container's baseline: a create becomes a recreate, and updates are held to it.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Write the baseline a first create of this spec records.
    #[arg(long, value_name = "OUT.json")]
    record_baseline: Option<PathBuf>,
    #[command(flatten)]
    host: HostArgs,
    /// The policy, over the pod's annotation and the default (restricted).
    #[arg(long, value_name = "P")]
    policy: Option<Policy>,
    /// The mode, over the pod's annotation and the default (audit).
    #[arg(long, value_name = "M")]
    mode: Option<Mode>,
    /// Kata's configuration file (its `config.d/` drop-ins are read too): enables
    /// `vcpu-pinning-lost` and `guest-numa-uncovered`.
    #[arg(long, value_name = "FILE")]
    kata_config: Option<PathBuf>,
    /// The running VMM's pid: enables `vcpu-affinity-drift` and `vcpu-overlap`.
    #[arg(long, value_name = "PID")]
    vm_pid: Option<u32>,
    /// The procfs root for --vm-pid.
    #[arg(long, value_name = "ROOT", default_value = "/proc")]
    procfs: PathBuf,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
}

/// Parses arguments and runs; maps errors to exit code 2 with one line on stderr.
pub fn run() -> ExitCode {
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
        Command::Check(args) => check(&args),
        Command::Vm(args) => vm::vm(&args),
        Command::Status(args) => status::status(&args),
        Command::Events(args) => events::events(&args),
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

/// `-`: standard input.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Reads one input whole: standard input for `-`, else a regular file; at most `limit` bytes.
fn read_input(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    if is_stdin(path) {
        fsutil::read_to_limit(std::io::stdin().lock(), limit)
            .with_context(|| format!("cannot read {what} from standard input"))
    } else {
        fsutil::read_bounded(path, limit)
            .with_context(|| format!("cannot read {what} {}", path.display()))
    }
}

fn input_name(path: &Path) -> String {
    if is_stdin(path) {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

fn spec_error(e: RequestError, path: &Path) -> anyhow::Error {
    anyhow::Error::new(e).context(format!("in {}", input_name(path)))
}

fn check(args: &CheckArgs) -> Result<ExitCode> {
    let from_stdin = [
        Some(&args.spec),
        args.update.as_ref(),
        args.baseline.as_ref(),
    ]
    .into_iter()
    .flatten()
    .filter(|p| is_stdin(p))
    .count();
    if from_stdin > 1 {
        anyhow::bail!("only one of --spec, --update and --baseline can be `-` (standard input)");
    }
    let spec = ContainerSpec::from_json(&read_input(&args.spec, MAX_SPEC_BYTES, "OCI spec")?)
        .map_err(|e| spec_error(e, &args.spec))?;
    let update = match &args.update {
        Some(path) => Some(
            Resources::from_json(&read_input(path, MAX_RESOURCES_BYTES, "LinuxResources")?)
                .map_err(|e| spec_error(e, path))?,
        ),
        None => None,
    };
    let baseline: Option<Baseline> = match &args.baseline {
        Some(path) => Some(
            serde_json::from_slice(&read_input(path, MAX_BASELINE_BYTES, "baseline")?)
                .with_context(|| format!("baseline {} is not valid", input_name(path)))?,
        ),
        None => None,
    };
    let kata = match &args.kata_config {
        Some(path) => Some(KataConfig::load(path)?.with_annotations(&spec.annotations)),
        None => None,
    };
    let view = match args.vm_pid {
        Some(pid) => Some(VmView::read(&args.procfs, pid)?),
        None => None,
    };
    let (host, sysfs) = args.host.load()?;
    let checker = Checker::new(&host, sysfs.as_ref(), Defaults::default());
    if let Some(out) = &args.record_baseline {
        let recorded = checker.record_baseline(&spec);
        let text = serde_json::to_string_pretty(&recorded)?;
        std::fs::write(out, text + "\n")
            .with_context(|| format!("cannot write baseline {}", out.display()))?;
    }
    let verdict = checker.check(&Request {
        spec: &spec,
        update: update.as_ref(),
        current: None,
        baseline: baseline.as_ref(),
        container_id: None,
        overrides: Overrides {
            policy: args.policy,
            mode: args.mode,
        },
        kata: kata.as_ref(),
        vm: view.as_ref(),
    });
    if args.json {
        out::json(&serde_json::to_string_pretty(&verdict)?)?;
    } else {
        out::lines(&verdict.human())?;
    }
    Ok(if verdict.has_error() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
