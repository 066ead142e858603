//! One connection to the runtime's NRI socket: registration on the runtime's service, then
//! the runtime's requests on the plugin's, each answered within the budget.
//!
//! The plugin's service is `nri.pkg.api.v1alpha1.Plugin` and the runtime's
//! `nri.pkg.api.v1alpha1.Runtime` (NRI v0.12.0's `api.proto`), over [`crate::mux`]. The
//! runtime waits for each answer at most its request timeout (containerd's
//! `plugin_request_timeout`, 2 s by default, which `Configure` tells) and then closes the
//! plugin's connection; a check is never allowed to cost that: each answer is given within
//! [`Settings::budget`] (and half the runtime's timeout), and a check still running then is
//! answered "no adjustment" — the operation goes on unchecked and the log says so. Only a
//! finished check's refusal (enforce mode) fails an operation.

use std::io;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::sync_channel;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_proto::nri::pkg::api::v1alpha1 as nri;
use kata_topo_proto::wire::{Code, Frame, Request, Response, Status, TYPE_REQUEST, TYPE_RESPONSE};
use prost::Message;
use slog::Logger;

use crate::front::Front;
use crate::mux::{Reader, Writer, PLUGIN_CONN, RUNTIME_CONN};

/// The plugin's service, as the runtime calls it.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The runtime's service, as the plugin calls it.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// The plugin's name: a contract (`kata-topo`).
pub const PLUGIN_NAME: &str = "kata-topo";
/// The NRI version the plugin was written against, as it tells the runtime.
pub const NRI_VERSION: &str = "v0.12.0";

/// The events the plugin subscribes to (NRI's mask: bit `event - 1`).
pub fn events() -> i32 {
    [
        nri::Event::CreateContainer,
        nri::Event::UpdateContainer,
        nri::Event::RemoveContainer,
        nri::Event::RemovePodSandbox,
    ]
    .iter()
    .fold(0, |mask, e| mask | 1 << (*e as i32 - 1))
}

/// How a plugin connects.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Its index, two digits.
    pub index: String,
    /// The longest an answer may take, whatever the runtime allows.
    pub budget: Duration,
}

/// Why a session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// The runtime closed the connection (it restarted, or dropped the plugin).
    Closed,
    /// The runtime asked the plugin to shut down.
    Shutdown,
}

/// Why a session failed.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The connection failed.
    #[error("NRI connection failed")]
    Io(#[from] io::Error),
    /// The runtime refused the registration.
    #[error("the runtime refused the plugin's registration: {0}")]
    Refused(String),
}

/// Serves one connection to the runtime until it ends.
pub fn serve(
    stream: UnixStream,
    front: Arc<Front>,
    settings: &Settings,
    log: &Logger,
) -> Result<End, SessionError> {
    let writer = Arc::new(Writer::new(stream.try_clone()?));
    let register = nri::RegisterPluginRequest {
        plugin_name: PLUGIN_NAME.to_string(),
        plugin_idx: settings.index.clone(),
        nri_version: NRI_VERSION.to_string(),
    };
    let request = Request {
        service: RUNTIME_SERVICE.to_string(),
        method: "RegisterPlugin".to_string(),
        payload: register.encode_to_vec(),
        timeout_nano: 0,
        metadata: Vec::new(),
    };
    writer.send(
        RUNTIME_CONN,
        &Frame {
            stream_id: 1,
            kind: TYPE_REQUEST,
            flags: 0,
            payload: request.encode_to_vec(),
        },
    )?;
    let mut budget = settings.budget;
    let mut sync = nri::SynchronizeRequest::default();
    let mut reader = Reader::new(stream);
    while let Some((conn, frame)) = reader.next_frame()? {
        if conn == RUNTIME_CONN {
            if frame.kind == TYPE_RESPONSE && frame.stream_id == 1 {
                let response = Response::decode(frame.payload.as_slice())
                    .map_err(|e| SessionError::Refused(format!("undecodable answer: {e}")))?;
                if response.code() != 0 {
                    let message = response.status.map(|s| s.message).unwrap_or_default();
                    return Err(SessionError::Refused(message));
                }
                slog::info!(log, "registered with the runtime"; "event" => "nri-registered",
                    "plugin" => format!("{}-{PLUGIN_NAME}", settings.index));
            }
            continue;
        }
        if frame.kind != TYPE_REQUEST {
            continue;
        }
        let stream_id = frame.stream_id;
        let answer = move |reply: Result<Vec<u8>, Status>| {
            let response = match reply {
                Ok(payload) => Response {
                    status: None,
                    payload,
                },
                Err(status) => Response {
                    status: Some(status),
                    payload: Vec::new(),
                },
            };
            Frame {
                stream_id,
                kind: TYPE_RESPONSE,
                flags: 0,
                payload: response.encode_to_vec(),
            }
        };
        let request = match Request::decode(frame.payload.as_slice()) {
            Ok(r) => r,
            Err(e) => {
                let reply = Err(status(
                    Code::InvalidArgument,
                    format!("malformed ttrpc request: {e}"),
                ));
                writer.send(PLUGIN_CONN, &answer(reply))?;
                continue;
            }
        };
        let payload = request.payload.as_slice();
        match request.method.as_str() {
            "Configure" => {
                let reply = decode::<nri::ConfigureRequest>(payload).map(|c| {
                    slog::info!(log, "configured by the runtime"; "event" => "nri-configured",
                        "runtime" => format!("{} {}", c.runtime_name, c.runtime_version),
                        "nri_version" => &c.nri_version, "request_timeout_ms" => c.request_timeout);
                    if c.request_timeout > 0 {
                        let half = Duration::from_millis(c.request_timeout as u64 / 2);
                        budget = settings.budget.min(half);
                    }
                    nri::ConfigureResponse { events: events() }.encode_to_vec()
                });
                writer.send(PLUGIN_CONN, &answer(reply))?;
            }
            "Synchronize" => {
                let reply = decode::<nri::SynchronizeRequest>(payload).map(|s| {
                    sync.pods.extend(s.pods);
                    sync.containers.extend(s.containers);
                    s.more
                });
                match reply {
                    Ok(true) => {
                        let more = nri::SynchronizeResponse {
                            update: Vec::new(),
                            more: true,
                        };
                        writer.send(PLUGIN_CONN, &answer(Ok(more.encode_to_vec())))?;
                    }
                    Ok(false) => {
                        let all = std::mem::take(&mut sync);
                        let front = Arc::clone(&front);
                        respond(&writer, budget, log, "Synchronize", answer, move || {
                            front.synchronize(&all.pods, &all.containers);
                            Ok(nri::SynchronizeResponse::default().encode_to_vec())
                        });
                    }
                    Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
                }
            }
            "CreateContainer" => match decode::<nri::CreateContainerRequest>(payload) {
                Ok(req) => {
                    let front = Arc::clone(&front);
                    respond(&writer, budget, log, "CreateContainer", answer, move || {
                        let (pod, container) = (
                            req.pod.unwrap_or_default(),
                            req.container.unwrap_or_default(),
                        );
                        front
                            .create(&pod, &container)
                            .map(|()| nri::CreateContainerResponse::default().encode_to_vec())
                            .map_err(refused)
                    });
                }
                Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
            },
            "UpdateContainer" => match decode::<nri::UpdateContainerRequest>(payload) {
                Ok(req) => {
                    let front = Arc::clone(&front);
                    respond(&writer, budget, log, "UpdateContainer", answer, move || {
                        let pod = req.pod.unwrap_or_default();
                        let container = req.container.unwrap_or_default();
                        let resources = req.linux_resources.unwrap_or_default();
                        front
                            .update(&pod, &container, &resources)
                            .map(|()| nri::UpdateContainerResponse::default().encode_to_vec())
                            .map_err(refused)
                    });
                }
                Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
            },
            "RemoveContainer" => {
                if let Ok(req) = decode::<nri::RemoveContainerRequest>(payload) {
                    front.remove_container(&req.container.unwrap_or_default());
                }
                let empty = nri::RemoveContainerResponse::default().encode_to_vec();
                writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
            }
            "RemovePodSandbox" => {
                if let Ok(req) = decode::<nri::RemovePodSandboxRequest>(payload) {
                    front.remove_pod(&req.pod.unwrap_or_default());
                }
                let empty = nri::RemovePodSandboxResponse::default().encode_to_vec();
                writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
            }
            // NRI's older way of telling the same events.
            "StateChange" => {
                if let Ok(ev) = decode::<nri::StateChangeEvent>(payload) {
                    match nri::Event::try_from(ev.event) {
                        Ok(nri::Event::RemoveContainer) => {
                            front.remove_container(&ev.container.unwrap_or_default())
                        }
                        Ok(nri::Event::RemovePodSandbox) => {
                            front.remove_pod(&ev.pod.unwrap_or_default())
                        }
                        _ => {}
                    }
                }
                writer.send(
                    PLUGIN_CONN,
                    &answer(Ok(nri::Empty::default().encode_to_vec())),
                )?;
            }
            "Shutdown" => {
                writer.send(
                    PLUGIN_CONN,
                    &answer(Ok(nri::Empty::default().encode_to_vec())),
                )?;
                return Ok(End::Shutdown);
            }
            other => {
                let s = status(
                    Code::Unimplemented,
                    format!("{PLUGIN_SERVICE}/{other} is not implemented by kata-topo"),
                );
                writer.send(PLUGIN_CONN, &answer(Err(s)))?;
            }
        }
    }
    Ok(End::Closed)
}

fn status(code: Code, message: String) -> Status {
    Status {
        code: code as i32,
        message,
        details: Vec::new(),
    }
}

/// kata-topo's refusal as the runtime passes it on: containerd fails the CRI call with the
/// message.
fn refused(message: String) -> Status {
    status(Code::FailedPrecondition, message)
}

fn decode<M: Message + Default>(payload: &[u8]) -> Result<M, Status> {
    M::decode(payload)
        .map_err(|e| status(Code::InvalidArgument, format!("malformed NRI request: {e}")))
}

/// Answers a request from its own thread, so that the connection goes on reading: `work`'s
/// answer when it is done within `budget`, else (or when it panicked) an empty answer — "no
/// adjustment", the operation goes on — and a log line saying the check did not decide.
fn respond(
    writer: &Arc<Writer>,
    budget: Duration,
    log: &Logger,
    method: &'static str,
    answer: impl FnOnce(Result<Vec<u8>, Status>) -> Frame + Send + 'static,
    work: impl FnOnce() -> Result<Vec<u8>, Status> + Send + 'static,
) {
    let (writer, thread_log) = (Arc::clone(writer), log.clone());
    let serve = move || {
        let log = thread_log;
        let started = Instant::now();
        let (tx, rx) = sync_channel(1);
        let spawned = std::thread::Builder::new()
            .name("nri-check".into())
            .spawn(move || {
                let _ = tx.send(catch_unwind(AssertUnwindSafe(work)));
            });
        let reply = match spawned.map(|_| rx.recv_timeout(budget)) {
            Ok(Ok(Ok(reply))) => reply,
            outcome => {
                let why = match outcome {
                    Ok(Ok(Err(_))) => "the check failed unexpectedly".to_string(),
                    Ok(Err(_)) => format!("no verdict within {} ms", budget.as_millis()),
                    _ => "cannot start the check".to_string(),
                };
                slog::warn!(log, "answered without a verdict: the operation goes on unchecked";
                    "event" => "nri-unchecked", "method" => method, "reason" => why);
                Ok(Vec::new())
            }
        };
        slog::debug!(log, "answered"; "event" => "nri-answered", "method" => method,
            "micros" => started.elapsed().as_micros() as u64);
        let _ = writer.send(PLUGIN_CONN, &answer(reply));
    };
    if let Err(e) = std::thread::Builder::new()
        .name("nri-request".into())
        .spawn(serve)
    {
        // No thread for it: the runtime's own timeout answers for us; say why.
        slog::error!(log, "cannot answer an NRI request"; "event" => "nri-unchecked",
            "method" => method, "reason" => e.to_string());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribes_to_creates_updates_and_removals_only() {
        // NRI's Event values 4, 8, 11 and 3 as mask bits 3, 7, 10 and 2.
        assert_eq!(events(), (1 << 3) | (1 << 7) | (1 << 10) | (1 << 2));
    }
}
