//! `kata-topo-installer`: the DaemonSet's program (`deploy/installer/`). On its node it
//! installs kata-topo, keeps the node labelled while it runs, and, from the pod's preStop hook,
//! removes everything again when its DaemonSet is going away.
//!
//! ```text
//! kata-topo-installer install     install, label the node, then wait for TERM (the container)
//! kata-topo-installer prestop     uninstall when the DaemonSet is gone, else keep (preStop)
//! kata-topo-installer uninstall   uninstall now, whatever the DaemonSet
//! kata-topo-installer ready       exit 0 once installed (the readiness probe)
//! ```
//!
//! Every file it writes on the node goes through [`node`] (the core's no-follow tree under
//! `KATA_TOPO_HOST_ROOT`, all of an install or none of it); containerd's files are TOML edited
//! as TOML ([`containerd`]); the API server is reached with the project's own client
//! (`kata-topo-apiserver`, the pod's ServiceAccount). A failed step leaves the node as it was,
//! never restarts containerd, and is said three ways: a log line, a `Warning` event on the
//! Node, and the label `kata-topo.io/install-refused=<reason>`. docs/installer.md has the
//! whole behaviour.

#![forbid(unsafe_code)]

pub mod containerd;
mod flow;
pub mod node;
pub mod settings;

use std::process::ExitCode;

/// The hidden subcommand the installer's own `nsenter` runs as (a fresh single-threaded
/// process of this binary).
pub const HOST_EXEC_COMMAND: &str = "__enter";

/// The label every selector uses: its value is always `true` (never a version, so pods that
/// were admitted with it keep matching across upgrades).
pub const LABEL_INSTALLED: &str = "kata-topo.io/installed";
/// The installed version: a label nothing selects on.
pub const LABEL_VERSION: &str = "kata-topo.io/installed-version";
/// Why the last install on this node was refused.
pub const LABEL_REFUSED: &str = "kata-topo.io/install-refused";

/// The program: one subcommand.
pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("-v" | "--version") => {
            println!("kata-topo-installer {}", kata_topo_core::VERSION);
            ExitCode::SUCCESS
        }
        Some(HOST_EXEC_COMMAND) => enter(&args[1..]),
        Some("ready") => flow::ready(),
        Some(cmd @ ("install" | "prestop" | "uninstall")) => flow::run(cmd),
        _ => {
            eprintln!("usage: kata-topo-installer install|prestop|uninstall|ready");
            ExitCode::from(2)
        }
    }
}

fn enter(args: &[String]) -> ExitCode {
    let (Some(pid), Some(namespaces), Some("--")) = (
        args.first().and_then(|p| p.parse::<u32>().ok()),
        args.get(1),
        args.get(2).map(String::as_str),
    ) else {
        eprintln!("kata-topo-installer: {HOST_EXEC_COMMAND} PID NAMESPACES -- COMMAND...");
        return ExitCode::from(2);
    };
    match containerd::enter_and_run(pid, namespaces, &args[3..]) {
        Ok(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        Err(e) => {
            eprintln!("kata-topo-installer: {e}");
            ExitCode::from(126)
        }
    }
}
