//! The process: its arguments, its configuration and outputs, and the connection to the
//! runtime, made again whenever it ends (containerd restarted, or closed the plugin) until
//! SIGTERM or SIGINT.

use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_core::config::{Config, ConfigSource};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::VERSION;
use kata_topo_shim::checks::Sinks;
use kata_topo_sinks::{Drops, Events, Log};

use crate::front::Front;
use crate::session::{serve, End, Settings};

/// How long to wait before connecting again.
const RECONNECT: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Args {
    config: Option<PathBuf>,
    socket: Option<PathBuf>,
    debug: bool,
}

const USAGE: &str =
    "usage: kata-topo-nri [--config FILE] [--socket NRI_SOCKET] [--debug] [--version]";

fn args() -> Result<Option<Args>, String> {
    let mut out = Args::default();
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-v" | "-V" | "--version" => {
                println!("kata-topo-nri {VERSION}");
                return Ok(None);
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return Ok(None);
            }
            "--debug" => out.debug = true,
            "--config" => {
                out.config = Some(PathBuf::from(it.next().ok_or("--config needs a file")?))
            }
            "--socket" => {
                out.socket = Some(PathBuf::from(it.next().ok_or("--socket needs a path")?))
            }
            other => return Err(format!("unknown argument {other:?} ({USAGE})")),
        }
    }
    Ok(Some(out))
}

/// Runs the plugin until SIGTERM or SIGINT (exit 0), or a configuration it cannot use
/// (exit 2, with the reason on stderr).
pub fn real_main() -> ExitCode {
    crate::malloc::one_arena();
    let args = match args() {
        Ok(Some(a)) => a,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kata-topo-nri: {e}");
            return ExitCode::from(2);
        }
    };
    let mut resolved = match Config::resolve(args.config.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("{}", kata_topo_core::text::error_chain(&e));
            return ExitCode::from(2);
        }
    };
    if args.config.is_some() {
        // Named on the command line, as containerd names the wrapper's.
        resolved.source = ConfigSource::ConfigPath;
    }
    if let Some(socket) = &args.socket {
        resolved.config.nri_socket = socket.clone();
    }
    let config = resolved.config.clone();
    let drops = Drops::new();
    let log_handle = Log::open(&config.log_file, args.debug, drops.clone());
    let log = log_handle.logger().clone();
    let kata = match &resolved.file {
        Some(path) => KataConfig::load(path).unwrap_or_default(),
        None => KataConfig::default(),
    };
    slog::info!(log, "NRI plugin started"; "event" => "nri-started", "pid" => std::process::id(),
        "config" => resolved.file.as_ref().map(|p| p.display().to_string()),
        "config_source" => resolved.source.as_str(), "nri_socket" => config.nri_socket.display().to_string(),
        "plugin_index" => &config.nri_plugin_index, "answer_ms" => config.nri_answer_ms, "runtime_handlers" => format!("{:?}", config.nri_runtime_handlers),
        "events_socket" => config.nri_events_socket.as_ref().map(|p| p.display().to_string()),
        "version" => VERSION);
    // containerd events as the wrapper publishes them, in the namespace of CRI's pods.
    let events = Events::start(
        config
            .nri_events_socket
            .as_ref()
            .map(|p| p.display().to_string()),
        crate::front::NAMESPACE.to_string(),
        log.clone(),
        drops.clone(),
    );
    let sinks = Sinks {
        log: log.clone(),
        events,
        drops,
    };
    let front = Front::new(resolved, kata, sinks);
    let current: Arc<Mutex<Option<UnixStream>>> = Arc::default();
    let stop = watch_signals(Arc::clone(&current), log_handle.clone());
    let settings = Settings {
        index: config.nri_plugin_index.clone(),
        budget: Duration::from_millis(config.nri_answer_ms),
    };
    let socket = config.nri_socket.display().to_string();
    let mut unavailable_said = false;
    loop {
        let connected =
            kata_topo_proto::wire::connect_until(&socket, Instant::now() + Duration::from_secs(1));
        match connected {
            Ok(stream) => {
                unavailable_said = false;
                *current.lock().unwrap_or_else(|e| e.into_inner()) = stream.try_clone().ok();
                slog::info!(log, "connected to the runtime"; "event" => "nri-connected", "nri_socket" => &socket);
                let end = serve(stream, Arc::clone(&front), &settings, &log);
                current.lock().unwrap_or_else(|e| e.into_inner()).take();
                let reason = match &end {
                    Ok(End::Closed) => "the runtime closed the connection".to_string(),
                    Ok(End::Shutdown) => "the runtime asked the plugin to shut down".to_string(),
                    Err(e) => kata_topo_core::text::error_chain(e),
                };
                slog::info!(log, "disconnected from the runtime"; "event" => "nri-disconnected",
                    "reason" => reason, "checked_pods" => front.checked_pods());
            }
            Err(e) if !unavailable_said => {
                unavailable_said = true;
                slog::warn!(log, "the runtime's NRI socket is unavailable; trying again"; "event" => "nri-unavailable",
                    "nri_socket" => &socket, "error" => e.to_string());
            }
            Err(_) => {}
        }
        if stopped(&stop, RECONNECT) {
            break;
        }
    }
    slog::info!(log, "NRI plugin exiting"; "event" => "nri-exit");
    front.flush(Instant::now() + Duration::from_secs(1));
    log_handle.flush(Instant::now() + Duration::from_secs(1));
    ExitCode::SUCCESS
}

/// Whether a stop arrived, waiting for one at most `wait`.
fn stopped(stop: &Receiver<()>, wait: Duration) -> bool {
    !matches!(stop.recv_timeout(wait), Err(RecvTimeoutError::Timeout))
}

/// SIGTERM and SIGINT stop the plugin (the connection in use is shut, so its session ends);
/// SIGHUP reopens the log file.
fn watch_signals(current: Arc<Mutex<Option<UnixStream>>>, log: Log) -> Receiver<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let (tx, rx) = channel();
    match signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
        Ok(mut signals) => {
            let spawned = std::thread::Builder::new()
                .name("signals".into())
                .spawn(move || {
                    for sig in signals.forever() {
                        if sig == SIGHUP {
                            log.reopen();
                            continue;
                        }
                        let _ = tx.send(());
                        if let Some(s) = current.lock().unwrap_or_else(|e| e.into_inner()).as_ref()
                        {
                            let _ = s.shutdown(std::net::Shutdown::Both);
                        }
                        return;
                    }
                });
            if spawned.is_err() {
                eprintln!("kata-topo-nri: cannot watch signals");
            }
        }
        Err(e) => eprintln!("kata-topo-nri: cannot watch signals: {e}"),
    }
    rx
}
