//! The wrapper daemon: one per pod. It accepts containerd's connections on the wrapper socket
//! and runs a [`crate::proxy`] for each.
//!
//! It exits when the delegate exits (an idle watch connection reaches EOF), cleaning up its
//! own socket, the delegate's leftover socket and the pod's state; and on SIGTERM/SIGINT,
//! removing its socket and its metrics file (the state stays for `delete`). SIGHUP reopens the log file. `Shutdown` is forwarded like any call:
//! the delegate decides whether to exit.

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use slog::Logger;

use crate::delegate::Delegate;
use crate::pod::Pod;
use crate::proxy::proxy;
use kata_topo_proto::wire::{probe, socket_path, Client, ConnectRequest, ConnectResponse, Probe};

/// Why the daemon stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The delegate is gone.
    DelegateGone,
    /// SIGTERM or SIGINT.
    Signal(i32),
}

/// Serves connections until the delegate exits or a signal arrives; `on_hup` runs on SIGHUP.
pub(crate) fn serve(
    listener: UnixListener,
    delegate: Delegate,
    pod: Arc<Pod>,
    log: Logger,
    on_hup: impl Fn() + Send + 'static,
) -> Exit {
    let (tx, rx) = channel::<Exit>();
    watch_delegate(&delegate, pod.clone(), tx.clone(), log.clone());
    watch_signals(tx.clone(), on_hup);
    let accept_log = log.clone();
    let _ = std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(client) => {
                        let (delegate, pod, log) =
                            (delegate.clone(), pod.clone(), accept_log.clone());
                        let _ = std::thread::Builder::new()
                            .name("conn".into())
                            .spawn(move || proxy(client, &delegate, &pod, &log));
                    }
                    Err(e) => {
                        slog::warn!(accept_log, "accept failed"; "event" => "accept-failed", "error" => e.to_string());
                    }
                }
            }
        });
    rx.recv().unwrap_or(Exit::DelegateGone)
}

/// Asks the delegate who it is (`Connect`: its pid, which `delete` needs to tell a live
/// delegate from an exiting one), records it, then holds the connection idle: its EOF means
/// the delegate exited.
fn watch_delegate(delegate: &Delegate, pod: Arc<Pod>, tx: Sender<Exit>, log: Logger) {
    let delegate = delegate.clone();
    let _ = std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(5);
            match Client::connect(&delegate.address, deadline) {
                Ok(mut client) => {
                    let request = ConnectRequest { id: String::new() }.encode_to_vec();
                    let pid = client
                        .call(
                            delegate.service,
                            "Connect",
                            request,
                            pod.namespace(),
                            deadline,
                        )
                        .ok()
                        .filter(|r| r.code() == 0)
                        .and_then(|r| ConnectResponse::decode(r.payload.as_slice()).ok())
                        .map(|r| r.shim_pid);
                    pod.record_daemon(&delegate.address, pid);
                    let mut conn = client.into_stream();
                    let _ = conn.set_read_timeout(None);
                    let mut buf = [0u8; 4096];
                    loop {
                        match conn.read(&mut buf) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(_) => break,
                        }
                    }
                }
                Err(e) => {
                    slog::warn!(log, "delegate unreachable"; "event" => "delegate-gone", "error" => e.to_string());
                }
            }
            let _ = tx.send(Exit::DelegateGone);
        });
}

fn watch_signals(tx: Sender<Exit>, on_hup: impl Fn() + Send + 'static) {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGTERM, SIGINT, SIGHUP]) {
        let _ = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if sig == SIGHUP {
                        on_hup();
                        continue;
                    }
                    let _ = tx.send(Exit::Signal(sig));
                    return;
                }
            });
    }
}

/// Removes a socket file if nothing listens on it any more (a listener that is too busy to
/// accept at once still counts as listening).
pub(crate) fn remove_dead_socket(path: &Path) {
    if probe(&path.to_string_lossy(), Duration::from_millis(50)) == Probe::Nothing {
        let _ = std::fs::remove_file(path);
    }
}

/// Removes the socket of a process that is exiting: it may still accept for a moment after
/// its connections closed (a Go process's leader shows as a zombie while its other threads,
/// and its open files, are still being torn down), so wait until nothing listens, up to
/// `deadline`.
pub(crate) fn remove_socket_of_exiting(path: &Path, deadline: Instant) {
    loop {
        remove_dead_socket(path);
        if !path.exists() || Instant::now() >= deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The daemon's own socket, removed on every way out of the daemon.
#[derive(Debug)]
pub(crate) struct OwnSocket(pub(crate) PathBuf);

impl Drop for OwnSocket {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

/// The daemon's cleanup once serving stopped: when the delegate is gone, its leftover socket
/// and the pod's state and metrics go too.
pub(crate) fn cleanup(exit: &Exit, own: OwnSocket, delegate: &Delegate, pod: &Pod) {
    drop(own);
    if *exit == Exit::DelegateGone {
        remove_socket_of_exiting(
            Path::new(socket_path(&delegate.address)),
            Instant::now() + Duration::from_secs(3),
        );
        pod.forget(Instant::now() + Duration::from_secs(1));
    } else {
        pod.flush_state(Instant::now() + Duration::from_secs(1));
    }
}
