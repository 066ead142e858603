//! Dispatch on containerd's action, and the daemon's setup (session, listener, logger).

use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_sinks::{Drops, Events, Log, Metrics};

use crate::args::{Action, Args};
use crate::daemon::{cleanup, serve, Exit, OwnSocket};
use crate::delegate::Delegate;
use crate::pod::{Outputs, Pod};
use kata_topo_proto::wire::socket_path;

use kata_topo_core::VERSION;

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
        Action::Reap => crate::delete::reap(&args),
        Action::Version => {
            println!("containerd-shim-kata-topo-v2 {VERSION}");
            ExitCode::SUCCESS
        }
        Action::Other => other(&args),
    }
}

/// Actions the wrapper does not know (`-info`, future ones) go to the delegate.
fn other(args: &Args) -> ExitCode {
    let config = Config::resolve(None).map(|r| r.config).unwrap_or_default();
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
#[expect(unsafe_code, reason = "adopting the listener fd start passed down")]
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

/// Says on standard error (which `start` reads when the daemon does not take its delegate)
/// why the daemon's set-up failed. A write that fails is dropped: nothing may make it panic.
fn report_setup_failure(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "wrapper daemon: {what}");
}

/// Once the daemon has its delegate, `start` is gone: standard error goes to /dev/null, so a
/// late write never meets a pipe nobody reads.
fn quiet_stderr() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 2);
    }
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
        report_setup_failure("no listening socket (-listen-fd)");
        return ExitCode::FAILURE;
    };
    // From here on, every way out removes the socket.
    let own = OwnSocket(
        listener
            .local_addr()
            .ok()
            .and_then(|a| a.as_pathname().map(Path::to_path_buf))
            .unwrap_or_default(),
    );
    let config_file = (!args.config.is_empty()).then(|| PathBuf::from(&args.config));
    let config = match config_file.as_deref().map(Config::from_file) {
        None => Config::default(),
        Some(Ok(c)) => c,
        // `start` read the same file a moment ago: it changed since.
        Some(Err(e)) => {
            report_setup_failure(&kata_topo_core::text::error_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let drops = Drops::new();
    let log_handle = Log::open(&config.log_file, args.debug, drops.clone());
    let log = log_handle.logger().clone();
    // containerd's ttrpc address as `start` resolved it (the bootstrap's, else TTRPC_ADDRESS).
    let ttrpc_address = Some(args.ttrpc_address.clone())
        .filter(|a| !a.is_empty())
        .or_else(|| std::env::var("TTRPC_ADDRESS").ok());
    let events = Events::start(
        ttrpc_address,
        args.namespace.clone(),
        log.clone(),
        drops.clone(),
    );
    // The same file is Kata's configuration: its vCPU pinning, sizing and NUMA settings feed
    // the VM rules. Kata itself refuses a broken file, so a read error only disables them.
    let kata = match &config_file {
        None => KataConfig::default(),
        Some(path) => KataConfig::load(path).unwrap_or_else(|e| {
            slog::warn!(log, "cannot read the Kata configuration"; "event" => "kata-config-failed", "error" => e.to_string());
            KataConfig::default()
        }),
    };
    let metrics = match &config.metrics_dir {
        Some(dir) => Metrics::textfile(dir, &args.namespace, &args.group, drops.clone()),
        None => Metrics::off(),
    };
    let sinks = Outputs {
        log: log.clone(),
        events,
        metrics: metrics.clone(),
        drops,
    };
    // Which configuration decided, said before the delegate is asked (a delegate that refuses
    // to start must not hide it); `kata-topo status` shows it too.
    let source = ConfigSource::from_name(&args.config_source).unwrap_or(if config_file.is_some() {
        ConfigSource::ConfigPath
    } else {
        ConfigSource::Defaults
    });
    slog::info!(log, "wrapper daemon started"; "event" => "daemon-started",
        "sandbox_id" => &args.group, "namespace" => &args.namespace, "pid" => std::process::id(),
        "config" => config_file.as_ref().map(|p| p.display().to_string()),
        "config_source" => source.as_str(), "delegate_shim" => &config.delegate_shim);
    let resolved = Resolved {
        config,
        file: config_file.clone(),
        source,
    };
    let pod = Pod::new(resolved, kata, &args.namespace, &args.group, sinks);
    pod.spawn_refresher();
    let done = |log_handle: &Log| {
        log_handle.flush(Instant::now() + Duration::from_secs(1));
    };
    // `start` sends the delegate's address and task API version once the delegate started;
    // EOF means it failed to start, and this daemon has nothing to serve.
    let Some(delegate) = read_delegate() else {
        slog::info!(log, "delegate did not start"; "event" => "daemon-exit", "sandbox_id" => &args.group);
        pod.forget(Instant::now() + Duration::from_secs(1));
        done(&log_handle);
        return ExitCode::FAILURE;
    };
    quiet_stderr();
    pod.record_daemon(&delegate.address, None);
    slog::info!(log, "delegate started"; "event" => "delegate-started",
        "sandbox_id" => &args.group, "delegate" => socket_path(&delegate.address));
    let reopen = log_handle.clone();
    let exit = serve(
        listener,
        delegate.clone(),
        pod.clone(),
        log.clone(),
        move || reopen.reopen(),
    );
    let reason = match &exit {
        Exit::DelegateGone => "delegate exited".to_string(),
        Exit::Signal(s) => format!("signal {s}"),
    };
    slog::info!(log, "wrapper daemon exiting"; "event" => "daemon-exit", "reason" => reason,
        "sandbox_id" => &args.group);
    cleanup(&exit, own, &delegate, &pod);
    if let Exit::Signal(_) = exit {
        // The pod's state stays for containerd's `delete`, which stops the delegate; the
        // metrics file goes now: a daemon that no longer runs watches nothing.
        metrics.remove(Instant::now() + Duration::from_secs(1));
    }
    done(&log_handle);
    ExitCode::SUCCESS
}
