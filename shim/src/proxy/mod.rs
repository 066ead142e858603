//! One containerd connection, one delegate connection, one thread: poll both and pass frames.
//! `Create`, `Update` and `Delete` requests are looked at on the way through; every other
//! request, and every response, passes as it came. One thread (rather than a pump per
//! direction) keeps a request and its response on the same CPU and needs no locks.
//!
//! The edges are handled as Go ttrpc handles them: a message over 4 MiB is read past and its
//! stream answered `RESOURCE_EXHAUSTED`, the connection kept; a request that does not decode
//! is answered `INVALID_ARGUMENT`. A panic while looking at a frame is caught: the frame goes
//! on unchanged and the check is reported as `check-failed`.

use std::collections::HashMap;
use std::io::{BufReader, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use prost::Message;
use slog::Logger;

use crate::delegate::Delegate;
use crate::error::ShimError;
use crate::pod::{OnAccept, Outcome, Pod};
use kata_topo_proto::wire::{
    rename_service, CreateTaskRequest, CreateTaskResponse, DeleteRequest, Frame, Incoming, Request,
    Response, Status, UpdateTaskRequest, TASK_V2, TASK_V3, TYPE_REQUEST, TYPE_RESPONSE,
};

fn is_task_service(service: &str) -> bool {
    service == TASK_V2 || service == TASK_V3
}

/// A response frame carrying only a status.
fn status_frame(stream_id: u32, status: Status) -> Frame {
    Frame {
        stream_id,
        kind: TYPE_RESPONSE,
        flags: 0,
        payload: Response {
            status: Some(status),
            payload: Vec::new(),
        }
        .encode_to_vec(),
    }
}

/// What to do with a request on its way to the delegate.
#[derive(Debug)]
enum Route {
    /// Forward this frame.
    Forward(Frame),
    /// The wrapper answers it.
    Answer(ShimError),
}

/// The checks a request asks for.
fn check(request: &Request, pod: &Pod) -> Option<Outcome> {
    match request.method.as_str() {
        "Create" => CreateTaskRequest::decode(request.payload.as_slice())
            .ok()
            .map(|r| pod.on_create(&r.id, Path::new(&r.bundle))),
        "Update" => UpdateTaskRequest::decode(request.payload.as_slice())
            .ok()
            .map(|r| {
                let json = r.resources.map(|a| a.value).unwrap_or_default();
                pod.on_update(&r.id, &json)
            }),
        "Delete" => DeleteRequest::decode(request.payload.as_slice())
            .ok()
            .filter(|r| r.exec_id.is_empty())
            .map(|r| pod.on_delete(&r.id)),
        _ => None,
    }
}

/// Looks at a request on its way to the delegate: checks `Create`/`Update`, notes `Delete`,
/// and renames the service to the one the delegate speaks.
fn inspect(
    mut frame: Frame,
    delegate: &Delegate,
    pod: &Pod,
    pending: &mut HashMap<u32, OnAccept>,
) -> Route {
    if frame.kind != TYPE_REQUEST {
        return Route::Forward(frame);
    }
    let request = match Request::decode(frame.payload.as_slice()) {
        Ok(r) => r,
        Err(e) => return Route::Answer(ShimError::BadRequest(e.to_string())),
    };
    if !is_task_service(&request.service) {
        return Route::Forward(frame);
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| check(&request, pod))).unwrap_or_else(|_| {
        pod.report_failure(&request.method, "the check failed unexpectedly");
        None
    });
    match outcome {
        Some(Outcome::Refuse(error)) => return Route::Answer(error),
        Some(Outcome::Forward(Some(accept))) => {
            pending.insert(frame.stream_id, accept);
        }
        Some(Outcome::Forward(None)) | None => {}
    }
    if request.service != delegate.service {
        match rename_service(&frame.payload, delegate.service) {
            Ok(payload) => frame.payload = payload,
            Err(e) => return Route::Answer(ShimError::BadRequest(e.to_string())),
        }
    }
    Route::Forward(frame)
}

/// Applies what the delegate accepted, when a response answers a pending request.
fn settle(frame: &Frame, pod: &Pod, pending: &mut HashMap<u32, OnAccept>) {
    if frame.kind != TYPE_RESPONSE {
        return;
    }
    let Some(accept) = pending.remove(&frame.stream_id) else {
        return;
    };
    let Ok(response) = Response::decode(frame.payload.as_slice()) else {
        return;
    };
    if response.code() != 0 {
        return;
    }
    // Only a Create reply carries a pid (with Kata, the VMM's).
    let pid = match accept {
        OnAccept::Created { .. } => CreateTaskResponse::decode(response.payload.as_slice())
            .ok()
            .map(|r| r.pid)
            .filter(|&p| p > 0),
        _ => None,
    };
    if catch_unwind(AssertUnwindSafe(|| pod.commit(accept, pid))).is_err() {
        pod.report_failure("commit", "recording what the delegate accepted failed");
    }
}

/// Answers every request with UNAVAILABLE until containerd hangs up.
fn unavailable(client: UnixStream, error: &ShimError) {
    let Ok(mut writer) = client.try_clone() else {
        return;
    };
    let mut reader = BufReader::new(client);
    while let Ok(Some(incoming)) = Frame::read_or_skip(&mut reader) {
        let (stream_id, kind) = match &incoming {
            Incoming::Frame(f) => (f.stream_id, f.kind),
            Incoming::Oversized {
                stream_id, kind, ..
            } => (*stream_id, *kind),
        };
        if kind == TYPE_REQUEST
            && status_frame(stream_id, error.status())
                .write(&mut writer)
                .is_err()
        {
            return;
        }
    }
}

/// Whether a request arrives on a new connection before it closes. A connection closed unused
/// (`start` making sure this pod's daemon runs) then costs the delegate nothing.
fn first_request_arrives(client: &UnixStream) -> bool {
    loop {
        let mut fds = [PollFd::new(client.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
    let mut byte = [0u8; 1];
    loop {
        match nix::sys::socket::recv(
            client.as_raw_fd(),
            &mut byte,
            nix::sys::socket::MsgFlags::MSG_PEEK,
        ) {
            Ok(n) => return n > 0,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return false,
        }
    }
}

/// Serves one containerd connection until either side closes it. The delegate is dialled
/// once the first request arrives.
pub(crate) fn proxy(client: UnixStream, delegate: &Delegate, pod: &Pod, log: &Logger) {
    if !first_request_arrives(&client) {
        return;
    }
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
    pump(client, upstream, delegate, pod, log);
}

/// The loop of [`proxy`], over any pair of connected streams.
pub(crate) fn pump(
    client: UnixStream,
    upstream: UnixStream,
    delegate: &Delegate,
    pod: &Pod,
    log: &Logger,
) {
    let (Ok(mut client_w), Ok(mut upstream_w)) = (client.try_clone(), upstream.try_clone()) else {
        return;
    };
    // Buffered reads: a frame's header and payload usually arrive in one read.
    let mut client_r = BufReader::with_capacity(64 * 1024, client);
    let mut upstream_r = BufReader::with_capacity(64 * 1024, upstream);
    let mut pending: HashMap<u32, OnAccept> = HashMap::new();
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
            match Frame::read_or_skip(&mut upstream_r) {
                Ok(Some(Incoming::Frame(frame))) => {
                    // The answer first; what it settles is recorded after.
                    if frame.write(&mut client_w).is_err() {
                        break;
                    }
                    settle(&frame, pod, &mut pending);
                }
                Ok(Some(Incoming::Oversized {
                    stream_id,
                    kind,
                    len,
                })) => {
                    // The caller gets what Go ttrpc's client would have told it.
                    pending.remove(&stream_id);
                    if kind == TYPE_RESPONSE
                        && status_frame(stream_id, Incoming::oversized_status(len))
                            .write(&mut client_w)
                            .is_err()
                    {
                        break;
                    }
                }
                Ok(None) | Err(_) => break,
            }
        }
        if from_client {
            match Frame::read_or_skip(&mut client_r) {
                Ok(Some(Incoming::Frame(frame))) => {
                    let stream_id = frame.stream_id;
                    let sent = match inspect(frame, delegate, pod, &mut pending) {
                        Route::Forward(frame) => upstream_w.write_all(&frame.encode()),
                        Route::Answer(error) => {
                            status_frame(stream_id, error.status()).write(&mut client_w)
                        }
                    };
                    if sent.is_err() {
                        break;
                    }
                }
                Ok(Some(Incoming::Oversized {
                    stream_id,
                    kind,
                    len,
                })) => {
                    if kind == TYPE_REQUEST
                        && status_frame(stream_id, Incoming::oversized_status(len))
                            .write(&mut client_w)
                            .is_err()
                    {
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

#[cfg(test)]
mod tests;
