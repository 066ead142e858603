//! Dispatch on containerd's action, and the daemon's setup (session, listener, logger).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::Arc;

use kata_topo::kata::KataConfig;

use crate::args::{Action, Args};
use crate::config::Config;
use crate::daemon::{cleanup, serve, Delegate, Exit};
use crate::guard::Guard;
use crate::sinks::{json_logger, Events, Metrics, NoMetrics, Textfile};
use crate::ttrpc::socket_path;

const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KATA_TOPO_GIT_REV"),
    ")"
);

/// The entry point: everything that must happen before threads exist happens here.
pub fn real_main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let args = match Args::parse(&argv) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("containerd-shim-kata-topo-v2: {e}");
            return ExitCode::FAILURE;
        }
    };
    match args.action() {
        Action::Start => crate::start::run(&args),
        Action::Delete => crate::delete::run(&args),
        Action::Daemon => daemon(&args),
        Action::Version => {
            println!("containerd-shim-kata-topo-v2 {VERSION}");
            ExitCode::SUCCESS
        }
        Action::Other => other(&args),
    }
}

/// Actions the wrapper does not know (`-info`, future ones) go to the delegate.
fn other(args: &Args) -> ExitCode {
    let env_path = std::env::var_os(crate::config::ENV_CONFIG).map(PathBuf::from);
    let config = Config::resolve(None, env_path.as_deref())
        .map(|(c, _)| c)
        .unwrap_or_default();
    match Command::new(&config.delegate_shim).args(&args.raw).status() {
        Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(0, 255) as u8),
        Err(e) => {
            eprintln!(
                "containerd-shim-kata-topo-v2: cannot run {:?}: {e}",
                config.delegate_shim
            );
            ExitCode::FAILURE
        }
    }
}

/// Takes ownership of the listening socket `start` bound and passed down.
#[allow(unsafe_code)]
fn listener_from_fd(fd: i32) -> Option<UnixListener> {
    let valid = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).is_ok();
    if !valid || fd < 3 {
        return None;
    }
    // SAFETY: `start` bound this listening socket, cleared its close-on-exec flag and passed
    // its number on our command line; nothing else in this fresh process owns or closes it,
    // and F_GETFD above proved it is open.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    Some(UnixListener::from(owned))
}

/// Reads `ADDRESS\nVERSION\n` from stdin (sent by `start`).
fn read_delegate() -> Option<Delegate> {
    use std::io::Read;
    let mut text = String::new();
    std::io::stdin().take(4096).read_to_string(&mut text).ok()?;
    let mut lines = text.lines();
    let address = lines.next().filter(|a| !a.is_empty())?.to_string();
    let version = lines.next().and_then(|v| v.parse().ok()).unwrap_or(2);
    Some(Delegate::new(address, version))
}

fn daemon(args: &Args) -> ExitCode {
    // Our own session: containerd's process group and terminal signals are not ours.
    let _ = nix::unistd::setsid();
    let Some(listener) = args.listen_fd.and_then(listener_from_fd) else {
        return ExitCode::FAILURE;
    };
    let config = if args.config.is_empty() {
        Config::default()
    } else {
        match Config::from_file(Path::new(&args.config)) {
            Ok(c) => c,
            Err(_) => return ExitCode::FAILURE,
        }
    };
    let log = json_logger(&config.log_file, args.debug);
    let own_socket = listener
        .local_addr()
        .ok()
        .and_then(|a| a.as_pathname().map(Path::to_path_buf))
        .unwrap_or_default();
    let events = Events::start(
        std::env::var("TTRPC_ADDRESS").ok(),
        args.namespace.clone(),
        log.clone(),
    );
    // The same file is Kata's configuration: its vCPU pinning, sizing and NUMA settings feed
    // the VM rules. Kata itself refuses a broken file, so a read error only disables them.
    let kata = if args.config.is_empty() {
        KataConfig::default()
    } else {
        KataConfig::load(Path::new(&args.config)).unwrap_or_else(|e| {
            slog::warn!(log, "cannot read the Kata configuration"; "event" => "kata-config-failed", "error" => e.to_string());
            KataConfig::default()
        })
    };
    let metrics: Box<dyn Metrics> = match &config.metrics_dir {
        Some(dir) => Box::new(Textfile::new(dir, &args.namespace, &args.group)),
        None => Box::new(NoMetrics),
    };
    let guard = match Guard::new(
        config,
        kata,
        &args.namespace,
        &args.group,
        log.clone(),
        events,
        metrics,
    ) {
        Ok(g) => Arc::new(g),
        Err(e) => {
            slog::error!(log, "cannot open state"; "event" => "daemon-failed", "error" => e.to_string());
            let _ = std::fs::remove_file(&own_socket);
            return ExitCode::FAILURE;
        }
    };
    guard.spawn_refresher();
    // `start` sends the delegate's address and task API version once the delegate started;
    // EOF means it failed to start, and this daemon has nothing to serve.
    let delegate = match read_delegate() {
        Some(d) => d,
        None => {
            slog::info!(log, "delegate did not start"; "event" => "daemon-exit", "sandbox_id" => &args.group);
            let _ = std::fs::remove_file(&own_socket);
            let _ = std::fs::remove_dir_all(guard.state_dir());
            guard.forget();
            return ExitCode::FAILURE;
        }
    };
    guard.record_daemon(&delegate.address, None);
    slog::info!(log, "wrapper daemon started"; "event" => "daemon-started",
        "sandbox_id" => &args.group, "namespace" => &args.namespace,
        "delegate" => socket_path(&delegate.address), "pid" => std::process::id());
    let exit = serve(listener, delegate.clone(), guard.clone(), log.clone());
    let reason = match &exit {
        Exit::DelegateGone => "delegate exited".to_string(),
        Exit::Signal(s) => format!("signal {s}"),
    };
    slog::info!(log, "wrapper daemon exiting"; "event" => "daemon-exit", "reason" => reason,
        "sandbox_id" => &args.group);
    if exit == Exit::DelegateGone {
        guard.forget();
    }
    cleanup(&exit, &own_socket, &delegate, Some(guard.state_dir()));
    ExitCode::SUCCESS
}
