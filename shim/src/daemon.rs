//! The wrapper daemon: one per pod. It accepts containerd's connections on the wrapper socket,
//! opens one connection to the delegate for each, and pumps frames both ways. `Create`,
//! `Update` and `Delete` requests are looked at on the way through; every other request, and
//! every response, passes as it came.
//!
//! It exits when the delegate exits (an idle watch connection reaches EOF), cleaning up its own
//! socket, the delegate's leftover socket and the pod's state; and on SIGTERM/SIGINT, removing
//! its socket. `Shutdown` is forwarded like any call: the delegate decides whether to exit.

use std::collections::HashMap;
use std::io::{BufReader, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use prost::Message;
use slog::Logger;

use crate::error::ShimError;
use crate::guard::{After, Guard, Outcome};
use crate::ttrpc::{
    connect_until, socket_path, Client, ConnectRequest, ConnectResponse, CreateTaskRequest,
    CreateTaskResponse, DeleteRequest, Frame, Request, Response, UpdateTaskRequest, TASK_V2,
    TASK_V3, TYPE_REQUEST, TYPE_RESPONSE,
};

/// Why the daemon stops.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exit {
    /// The delegate is gone.
    DelegateGone,
    /// SIGTERM or SIGINT.
    Signal(i32),
}

/// Where the delegate is and which task API it speaks.
#[derive(Debug, Clone)]
pub struct Delegate {
    /// Its `unix://` address.
    pub address: String,
    /// `containerd.task.v2.Task` or `containerd.task.v3.Task`.
    pub service: &'static str,
}

impl Delegate {
    /// From an address and a task API version.
    pub fn new(address: String, version: u32) -> Self {
        Self {
            address,
            service: if version >= 3 { TASK_V3 } else { TASK_V2 },
        }
    }

    fn connect(&self) -> std::io::Result<UnixStream> {
        UnixStream::connect(socket_path(&self.address))
    }
}

fn is_task_service(service: &str) -> bool {
    service == TASK_V2 || service == TASK_V3
}

/// Serves connections until the delegate exits or a signal arrives.
pub fn serve(listener: UnixListener, delegate: Delegate, guard: Arc<Guard>, log: Logger) -> Exit {
    let (tx, rx) = channel::<Exit>();
    watch_delegate(&delegate, guard.clone(), tx.clone(), log.clone());
    watch_signals(tx.clone());
    let accept_log = log.clone();
    let _ = std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || {
            for conn in listener.incoming() {
                match conn {
                    Ok(client) => {
                        let (delegate, guard, log) = (delegate.clone(), guard.clone(), accept_log.clone());
                        let _ = std::thread::Builder::new()
                            .name("conn".into())
                            .spawn(move || proxy(client, &delegate, &guard, &log));
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
fn watch_delegate(delegate: &Delegate, guard: Arc<Guard>, tx: Sender<Exit>, log: Logger) {
    let delegate = delegate.clone();
    let _ = std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(5);
            match Client::connect(&delegate.address, deadline) {
                Ok(mut client) => {
                    let request = ConnectRequest { id: String::new() }.encode_to_vec();
                    let pid = client
                        .call(delegate.service, "Connect", request, guard.namespace(), deadline)
                        .ok()
                        .filter(|r| r.code() == 0)
                        .and_then(|r| ConnectResponse::decode(r.payload.as_slice()).ok())
                        .map(|r| r.shim_pid);
                    guard.record_daemon(&delegate.address, pid);
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

fn watch_signals(tx: Sender<Exit>) {
    use signal_hook::consts::{SIGINT, SIGTERM};
    if let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]) {
        let _ = std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    let _ = tx.send(Exit::Signal(sig));
                }
            });
    }
}

/// Answers a request frame with a status instead of forwarding it.
fn refuse(client: &mut UnixStream, stream_id: u32, error: &ShimError) -> std::io::Result<()> {
    let response = Response {
        status: Some(error.status()),
        payload: Vec::new(),
    };
    Frame {
        stream_id,
        kind: TYPE_RESPONSE,
        flags: 0,
        payload: response.encode_to_vec(),
    }
    .write(client)
}

/// What to do with a request on its way to the delegate.
enum Route {
    /// Forward this frame.
    Forward(Frame),
    /// The wrapper answers it.
    Answer(ShimError),
}

/// Looks at a request on its way to the delegate: checks `Create`/`Update`, notes `Delete`,
/// and renames the service to the one the delegate speaks.
fn inspect(
    mut frame: Frame,
    delegate: &Delegate,
    guard: &Guard,
    pending: &mut HashMap<u32, After>,
) -> Route {
    if frame.kind != TYPE_REQUEST {
        return Route::Forward(frame);
    }
    let mut request = match Request::decode(frame.payload.as_slice()) {
        Ok(r) => r,
        Err(e) => return Route::Answer(ShimError::BadRequest(e.to_string())),
    };
    if !is_task_service(&request.service) {
        return Route::Forward(frame);
    }
    let outcome = match request.method.as_str() {
        "Create" => CreateTaskRequest::decode(request.payload.as_slice())
            .ok()
            .map(|r| guard.on_create(&r.id, Path::new(&r.bundle))),
        "Update" => UpdateTaskRequest::decode(request.payload.as_slice())
            .ok()
            .map(|r| {
                let json = r.resources.map(|a| a.value).unwrap_or_default();
                guard.on_update(&r.id, &json)
            }),
        "Delete" => DeleteRequest::decode(request.payload.as_slice())
            .ok()
            .filter(|r| r.exec_id.is_empty())
            .map(|r| guard.on_delete(&r.id)),
        _ => None,
    };
    match outcome {
        Some(Outcome::Refuse(error)) => return Route::Answer(error),
        Some(Outcome::Forward(Some(after))) => {
            pending.insert(frame.stream_id, after);
        }
        Some(Outcome::Forward(None)) | None => {}
    }
    if request.service != delegate.service {
        request.service = delegate.service.to_string();
        frame.payload = request.encode_to_vec();
    }
    Route::Forward(frame)
}

/// Applies what the delegate accepted, when a response answers a pending request.
fn settle(frame: &Frame, guard: &Arc<Guard>, pending: &mut HashMap<u32, After>) {
    if frame.kind != TYPE_RESPONSE {
        return;
    }
    let Some(after) = pending.remove(&frame.stream_id) else {
        return;
    };
    if let Ok(response) = Response::decode(frame.payload.as_slice()) {
        if response.code() == 0 {
            let pid = CreateTaskResponse::decode(response.payload.as_slice())
                .ok()
                .map(|r| r.pid)
                .filter(|&p| p > 0);
            guard.commit(after, pid);
        }
    }
}

/// Answers every request with UNAVAILABLE until containerd hangs up.
fn unavailable(client: UnixStream, error: &ShimError) {
    let Ok(mut writer) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(client);
    while let Ok(Some(frame)) = Frame::read(&mut reader) {
        if frame.kind == TYPE_REQUEST && refuse(&mut writer, frame.stream_id, error).is_err() {
            return;
        }
    }
}

/// One containerd connection, one delegate connection, one thread: poll both, pass frames.
/// One thread (rather than a pump per direction) keeps a request and its response on the
/// same CPU and needs no locks.
fn proxy(client: UnixStream, delegate: &Delegate, guard: &Arc<Guard>, log: &Logger) {
    let upstream = match delegate.connect() {
        Ok(u) => u,
        Err(source) => {
            let error = ShimError::DelegateUnavailable {
                address: delegate.address.clone(),
                source,
            };
            return unavailable(client, &error);
        }
    };
    let (Ok(mut client_w), Ok(mut upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    // Buffered reads: a frame's header and payload usually arrive in one read.
    let mut client_r = BufReader::with_capacity(64 * 1024, client);
    let mut upstream_r = BufReader::with_capacity(64 * 1024, upstream);
    let mut pending: HashMap<u32, After> = HashMap::new();
    loop {
        let (mut from_client, mut from_upstream) = (
            !client_r.buffer().is_empty(),
            !upstream_r.buffer().is_empty(),
        );
        if !from_client && !from_upstream {
            let mut fds = [
                PollFd::new(client_r.get_ref().as_fd(), PollFlags::POLLIN),
                PollFd::new(upstream_r.get_ref().as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, PollTimeout::NONE) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
            let ready = |fd: &PollFd<'_>| fd.revents().is_some_and(|r| !r.is_empty());
            from_client = ready(&fds[0]);
            from_upstream = ready(&fds[1]);
        }
        if from_upstream {
            match Frame::read(&mut upstream_r) {
                Ok(Some(frame)) => {
                    settle(&frame, guard, &mut pending);
                    if frame.write(&mut client_w).is_err() {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        if from_client {
            match Frame::read(&mut client_r) {
                Ok(Some(frame)) => {
                    let stream_id = frame.stream_id;
                    let sent = match inspect(frame, delegate, guard, &mut pending) {
                        Route::Forward(frame) => upstream_w.write_all(&frame.encode()),
                        Route::Answer(error) => refuse(&mut client_w, stream_id, &error),
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    slog::debug!(log, "connection closed"; "error" => e.to_string());
                    break;
                }
            }
        }
    }
    let _ = upstream_w.shutdown(Shutdown::Both);
    let _ = client_w.shutdown(Shutdown::Both);
}

/// Removes a socket file if nothing listens on it any more (a listener that is too busy to
/// accept at once still counts as listening).
pub fn remove_dead_socket(path: &Path) {
    let deadline = Instant::now() + Duration::from_millis(50);
    match connect_until(&path.to_string_lossy(), deadline) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) | Err(_) => {}
    }
}

/// Removes the socket of a process that is exiting: it may still accept for a moment after
/// its connections closed, so wait (bounded) until nothing listens.
fn remove_socket_of_exiting(path: &Path) {
    for _ in 0..60 {
        remove_dead_socket(path);
        if !path.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon's cleanup once serving stopped.
pub fn cleanup(exit: &Exit, own_socket: &Path, delegate: &Delegate, state_dir: Option<PathBuf>) {
    let _ = std::fs::remove_file(own_socket);
    if *exit == Exit::DelegateGone {
        remove_socket_of_exiting(Path::new(socket_path(&delegate.address)));
        if let Some(dir) = state_dir {
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}
