//! `start`: run the delegate's `start` with everything containerd gave us, make sure this pod's
//! wrapper daemon runs, point the bundle's `address` at it, and answer in the delegate's format.

mod rollback;
mod spawn;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use crate::args::Args;
use crate::bundle::BundleInfo;
use crate::delegate::Delegate;
use crate::group::{delegate_socket_address, group_of, socket_address};
use crate::state::GroupState;
use kata_topo_core::config::{Config, ConfigError};
use kata_topo_core::text::error_chain;
use kata_topo_proto::bootstrap::{BootstrapError, Reply, StartParams, Stdin};
use rollback::Rollback;
use spawn::{ensure_daemon, Daemon};

/// Why `start` failed; containerd shows the message to the user.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("kata-topo: cannot read start options")]
    Stdin(#[source] std::io::Error),
    #[error(
        "kata-topo: start options on stdin exceed {} KiB; containerd sends a few hundred bytes",
        STDIN_LIMIT / 1024
    )]
    StdinTooLarge,
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("kata-topo: cannot run the delegate shim {shim:?} (topology_guard.delegate_shim)")]
    Delegate {
        shim: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: delegate start failed")]
    DelegateWait(#[source] std::io::Error),
    #[error("kata-topo: cannot create {}", .dir.display())]
    SocketDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: cannot listen on {}", .path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: cannot pass the listener")]
    PassListener(#[source] nix::Error),
    #[error("kata-topo: cannot start the wrapper daemon")]
    Spawn(#[source] std::io::Error),
    #[error("kata-topo: the wrapper daemon did not start{}", quoted_stderr(.stderr))]
    DaemonGone {
        #[source]
        source: std::io::Error,
        /// What the daemon wrote to its standard error before it exited.
        stderr: String,
    },
    #[error(
        "kata-topo: the delegate answered {answered}, but this pod's wrapper forwards to {known}"
    )]
    OtherDelegate { answered: String, known: String },
    #[error("kata-topo: cannot write the bundle's address")]
    Bundle(#[source] std::io::Error),
}

/// ` (it said: <what the daemon wrote>)`, made printable, when it wrote anything.
fn quoted_stderr(stderr: &str) -> String {
    let text = kata_topo_core::text::printable(stderr.trim());
    if text.is_empty() {
        String::new()
    } else {
        format!(" (it said: {text})")
    }
}

fn fail(e: &StartError) -> ExitCode {
    // containerd shows start's output to the user when start fails.
    eprintln!("{}", error_chain(e));
    ExitCode::FAILURE
}

/// The most `start` accepts on its stdin. containerd writes the runtime options there (Kata's
/// `runtimeoptions.v1.Options`: a type URL and `ConfigPath`; runc's: a few names and paths),
/// from 2.3 inside a `BootstrapParams` with ids, addresses, a version and the socket
/// directory — 100 to 300 bytes as recorded from 1.6.20 and 2.3.4. Every field is an id or a
/// path (at most `PATH_MAX`, 4 KiB), so even a dozen maximal paths fit in 64 KiB; more is not
/// something containerd sent, and is not read on, held or forwarded to the delegate.
const STDIN_LIMIT: usize = 64 * 1024;

/// Reads `start`'s stdin, at most [`STDIN_LIMIT`] bytes.
fn read_options(input: impl Read) -> Result<Vec<u8>, StartError> {
    let mut stdin = Vec::new();
    input
        .take(STDIN_LIMIT as u64 + 1)
        .read_to_end(&mut stdin)
        .map_err(StartError::Stdin)?;
    if stdin.len() > STDIN_LIMIT {
        return Err(StartError::StdinTooLarge);
    }
    Ok(stdin)
}

/// Runs `start`.
pub fn run(args: &Args) -> ExitCode {
    let stdin = match read_options(std::io::stdin()) {
        Ok(s) => s,
        Err(e) => return fail(&e),
    };
    // The bootstrap (containerd 2.3+), else the legacy options, flags and environment.
    let params = match Stdin::decode(&stdin).and_then(|input| {
        StartParams::resolve(&input, &args.flags(), std::env::var("TTRPC_ADDRESS").ok())
    }) {
        Ok(p) => p,
        Err(e) => return fail(&StartError::from(e)),
    };
    let resolved = match Config::resolve(params.config_path.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(&StartError::from(e)),
    };
    let config = &resolved.config;
    // The delegate's start first, with our argv, environment, cwd and stdin: containerd waits
    // for it whatever the wrapper does, so nothing of the wrapper's goes before it.
    let child = Command::new(&config.delegate_shim)
        .args(&args.raw)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(source) => {
            return fail(&StartError::Delegate {
                shim: config.delegate_shim.clone(),
                source,
            })
        }
    };
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(&stdin);
    }

    // While it starts: the pod's daemon, found running or started now (its set-up, the
    // topology load included, overlaps the delegate's start; it learns the delegate's address
    // through its stdin). Bound after the delegate was spawned, the daemon's listener is
    // never inherited by the delegate.
    let bundle = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let group = group_of(&bundle, &params.instance_id);
    let address = socket_address(
        params.socket_dir(),
        &params.grpc_address,
        &params.namespace,
        &group,
    );
    let daemon = ensure_daemon(&params, &resolved, &group, &address);

    let output = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return fail(&StartError::DelegateWait(e)),
    };
    if !output.status.success() {
        // Dropping `daemon` closes its stdin: a new daemon exits and removes its socket.
        let _ = std::io::stdout().write_all(&output.stdout);
        let _ = std::io::stderr().write_all(&output.stderr);
        return ExitCode::from(output.status.code().unwrap_or(1).clamp(1, 255) as u8);
    }
    // The delegate runs now: whatever fails from here on must not leave it, or the daemon
    // started for it, behind.
    let mut rollback = Rollback {
        delegate: None,
        fallback_delegate: delegate_socket_address(
            params.socket_dir(),
            &params.grpc_address,
            &params.namespace,
            &group,
        ),
        namespace: params.namespace.clone(),
        id: params.instance_id.clone(),
        started: None,
    };
    let daemon = match daemon {
        Ok(d) => d,
        Err(e) => {
            rollback.delegate = Reply::parse(&output.stdout)
                .ok()
                .map(|(_, address, version)| Delegate::new(address, version));
            rollback.run();
            return fail(&e);
        }
    };
    let info = BundleInfo {
        address,
        delegate_address: String::new(),
        delegate_version: 2,
        group,
        namespace: params.namespace.clone(),
        delegate_shim: config.delegate_shim.clone(),
        state_dir: config.state_dir.clone(),
        metrics_dir: config.metrics_dir.clone(),
    };
    match finish(&bundle, &output.stdout, daemon, &mut rollback, info) {
        Ok(reply) => {
            let _ = std::io::stdout().write_all(&reply);
            ExitCode::SUCCESS
        }
        Err(e) => {
            rollback.run();
            fail(&e)
        }
    }
}

/// Hands the delegate over to the daemon, points the bundle at the wrapper (`info` says
/// where; the delegate's part is filled in here) and gives the reply containerd expects.
fn finish(
    bundle: &Path,
    delegate_reply: &[u8],
    daemon: Daemon,
    rollback: &mut Rollback,
    mut info: BundleInfo,
) -> Result<Vec<u8>, StartError> {
    if let Daemon::Starting { socket, child, .. } = &daemon {
        let state = GroupState::at(&info.state_dir, &info.namespace, &info.group);
        rollback.started = Some((socket.clone(), child.id(), state));
    }
    let (reply, delegate_address, version) = Reply::parse(delegate_reply)?;
    rollback.delegate = Some(Delegate::new(delegate_address.clone(), version));
    daemon.hand_over(&delegate_address, version)?;
    info.delegate_address = delegate_address;
    info.delegate_version = version;
    info.write(bundle).map_err(StartError::Bundle)?;
    Ok(reply.encode(&info.address))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_options_beyond_the_bound_are_refused() {
        let at_bound = vec![7u8; STDIN_LIMIT];
        assert_eq!(
            read_options(at_bound.as_slice())
                .expect("at the bound")
                .len(),
            STDIN_LIMIT
        );
        // Anything larger, up to hundreds of MiB, used to be read whole and forwarded.
        let e = read_options(std::io::repeat(7).take(64 * STDIN_LIMIT as u64))
            .expect_err("4 MiB of options");
        let text = e.to_string();
        assert!(
            text.starts_with("kata-topo: ") && text.contains("64 KiB"),
            "{text}"
        );
        assert!(read_options(&[][..]).expect("nothing").is_empty());
    }
}
