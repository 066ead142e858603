//! The wrapper daemon: one per pod. It accepts containerd's connections on the wrapper socket,
//! opens one connection to the delegate for each, and pumps frames both ways. `Create`,
//! `Update` and `Delete` requests are looked at on the way through; every other request, and
//! every response, passes as it came.
//!
//! It exits when the delegate exits (an idle watch connection reaches EOF), cleaning up its own
//! socket, the delegate's leftover socket and the pod's state; and on SIGTERM/SIGINT, removing
//! its socket. `Shutdown` is forwarded like any call: the delegate decides whether to exit.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};

use prost::Message;
use slog::Logger;

use crate::error::ShimError;
use crate::guard::{After, Guard, Outcome};
use crate::ttrpc::{
    socket_path, CreateTaskRequest, CreateTaskResponse, DeleteRequest, Frame, Request, Response,
    UpdateTaskRequest, TASK_V2, TASK_V3, TYPE_REQUEST, TYPE_RESPONSE,
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
    watch_delegate(&delegate, tx.clone(), log.clone());
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

/// Holds an idle connection to the delegate; its EOF means the delegate exited.
fn watch_delegate(delegate: &Delegate, tx: Sender<Exit>, log: Logger) {
    let delegate = delegate.clone();
    let _ = std::thread::Builder::new()
        .name("watch".into())
        .spawn(move || {
            match delegate.connect() {
                Ok(mut conn) => {
                    let mut buf = [0u8; 64];
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
fn refuse(client: &Mutex<UnixStream>, stream_id: u32, error: &ShimError) {
    let response = Response {
        status: Some(error.status()),
        payload: Vec::new(),
    };
    let frame = Frame {
        stream_id,
        kind: TYPE_RESPONSE,
        flags: 0,
        payload: response.encode_to_vec(),
    };
    let mut w = client.lock().unwrap_or_else(|e| e.into_inner());
    let _ = frame.write(&mut *w);
}

/// Looks at a request on its way to the delegate: checks `Create`/`Update`, notes `Delete`,
/// and renames the service to the one the delegate speaks. Returns the frame to forward, or
/// `None` when the wrapper answered it.
fn inspect(
    mut frame: Frame,
    delegate: &Delegate,
    guard: &Guard,
    pending: &Mutex<HashMap<u32, After>>,
    client: &Mutex<UnixStream>,
) -> Option<Frame> {
    if frame.kind != TYPE_REQUEST {
        return Some(frame);
    }
    let mut request = match Request::decode(frame.payload.as_slice()) {
        Ok(r) => r,
        Err(e) => {
            refuse(
                client,
                frame.stream_id,
                &ShimError::BadRequest(e.to_string()),
            );
            return None;
        }
    };
    if !is_task_service(&request.service) {
        return Some(frame);
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
        Some(Outcome::Refuse(error)) => {
            refuse(client, frame.stream_id, &error);
            return None;
        }
        Some(Outcome::Forward(Some(after))) => {
            pending
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(frame.stream_id, after);
        }
        Some(Outcome::Forward(None)) | None => {}
    }
    if request.service != delegate.service {
        request.service = delegate.service.to_string();
        frame.payload = request.encode_to_vec();
    }
    Some(frame)
}

/// One containerd connection: two pumps until either side closes.
fn proxy(client: UnixStream, delegate: &Delegate, guard: &Arc<Guard>, log: &Logger) {
    let client_writer = match client.try_clone() {
        Ok(c) => Arc::new(Mutex::new(c)),
        Err(_) => return,
    };
    let mut client_reader = client;
    let upstream = match delegate.connect() {
        Ok(u) => u,
        Err(source) => {
            // Answer every request with UNAVAILABLE until containerd hangs up.
            let error = ShimError::DelegateUnavailable {
                address: delegate.address.clone(),
                source,
            };
            while let Ok(Some(frame)) = Frame::read(&mut client_reader) {
                if frame.kind == TYPE_REQUEST {
                    refuse(&client_writer, frame.stream_id, &error);
                }
            }
            return;
        }
    };
    let pending: Arc<Mutex<HashMap<u32, After>>> = Arc::new(Mutex::new(HashMap::new()));
    let mut upstream_reader = match upstream.try_clone() {
        Ok(u) => u,
        Err(_) => return,
    };
    let mut upstream_writer = upstream;

    // delegate -> containerd
    let back = {
        let (client_writer, pending, guard) =
            (client_writer.clone(), pending.clone(), guard.clone());
        std::thread::Builder::new()
            .name("pump-back".into())
            .spawn(move || {
                while let Ok(Some(frame)) = Frame::read(&mut upstream_reader) {
                    if frame.kind == TYPE_RESPONSE {
                        let after = pending
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .remove(&frame.stream_id);
                        if let Some(after) = after {
                            if let Ok(response) = Response::decode(frame.payload.as_slice()) {
                                if response.code() == 0 {
                                    let pid =
                                        CreateTaskResponse::decode(response.payload.as_slice())
                                            .ok()
                                            .map(|r| r.pid)
                                            .filter(|&p| p > 0);
                                    guard.commit(after, pid);
                                }
                            }
                        }
                    }
                    let mut w = client_writer.lock().unwrap_or_else(|e| e.into_inner());
                    if frame.write(&mut *w).is_err() {
                        break;
                    }
                }
                let w = client_writer.lock().unwrap_or_else(|e| e.into_inner());
                let _ = w.shutdown(Shutdown::Both);
            })
    };

    // containerd -> delegate
    loop {
        match Frame::read(&mut client_reader) {
            Ok(Some(frame)) => {
                if let Some(frame) = inspect(frame, delegate, guard, &pending, &client_writer) {
                    if upstream_writer.write_all(&frame.encode()).is_err() {
                        break;
                    }
                }
            }
            Ok(None) => break,
            Err(e) => {
                slog::debug!(log, "connection closed"; "error" => e.to_string());
                break;
            }
        }
    }
    let _ = upstream_writer.shutdown(Shutdown::Both);
    if let Ok(handle) = back {
        let _ = handle.join();
    }
}

/// Removes a socket file if nothing listens on it any more.
pub fn remove_dead_socket(path: &Path) {
    if path.exists() && UnixStream::connect(path).is_err() {
        let _ = std::fs::remove_file(path);
    }
}

/// The daemon's cleanup once serving stopped.
pub fn cleanup(exit: &Exit, own_socket: &Path, delegate: &Delegate, state_dir: Option<PathBuf>) {
    let _ = std::fs::remove_file(own_socket);
    if *exit == Exit::DelegateGone {
        remove_dead_socket(Path::new(socket_path(&delegate.address)));
        if let Some(dir) = state_dir {
            let _ = std::fs::remove_dir_all(&dir);
            if let Some(parent) = dir.parent() {
                let _ = std::fs::remove_dir(parent);
            }
        }
    }
}
