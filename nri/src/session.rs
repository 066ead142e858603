//! One connection to the runtime's NRI socket: registration on the runtime's service, then
//! the runtime's requests on the plugin's, each answered within the budget.
//!
//! The plugin's service is `nri.pkg.api.v1alpha1.Plugin` and the runtime's
//! `nri.pkg.api.v1alpha1.Runtime` (NRI v0.12.0's `api.proto`), over [`crate::mux`]. The
//! runtime waits for each answer at most its request timeout (containerd's
//! `plugin_request_timeout`, 2 s by default, which `Configure` tells) and then closes the
//! plugin's connection; a check is never allowed to cost that: each answer is given within
//! [`Settings::budget`] (and half the runtime's timeout) of the request's arrival, and a check
//! still running then is answered "no adjustment" by the session's budget thread — the
//! operation goes on unchecked and the log says so. Only a finished check's refusal (enforce
//! mode) fails an operation. A check runs on a thread of its own, which writes its answer
//! itself: one thread between the request and its answer.
//!
//! A request nothing can refuse — a container of a pod in audit mode (the node's, no
//! `kata-topo.io/mode` on the pod or the container) — is answered at once, before its check:
//! containerd holds one lock over every plugin call, so every create and update of the node
//! waits for each answer. Its check then runs on the session's [`After`] thread, in the order
//! the requests came, with the removals that follow it; its verdict goes to the same outputs.

use std::collections::VecDeque;
use std::io;
use std::os::unix::net::UnixStream;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
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
    let overdue = Overdue::start(Arc::clone(&writer), log.clone());
    let after = After::start(log);
    while let Some((conn, frame)) = reader.next_frame()? {
        let received = Instant::now();
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
                        respond(
                            &writer,
                            &overdue,
                            received,
                            budget,
                            log,
                            "Synchronize",
                            answer,
                            move || {
                                front.synchronize(&all.pods, &all.containers);
                                Ok(nri::SynchronizeResponse::default().encode_to_vec())
                            },
                        );
                    }
                    Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
                }
            }
            "CreateContainer" => match decode::<nri::CreateContainerRequest>(payload) {
                Ok(req) => {
                    let (pod, container) = (
                        req.pod.unwrap_or_default(),
                        req.container.unwrap_or_default(),
                    );
                    let front = Arc::clone(&front);
                    match after
                        .as_ref()
                        .filter(|_| !front.may_refuse(&pod, &container))
                    {
                        Some(after) => {
                            let queued = after.check(move || {
                                let _ = front.create(&pod, &container);
                            });
                            let empty = nri::CreateContainerResponse::default().encode_to_vec();
                            writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
                            answered_first(log, "CreateContainer", received, queued);
                        }
                        None => respond(
                            &writer,
                            &overdue,
                            received,
                            budget,
                            log,
                            "CreateContainer",
                            answer,
                            move || {
                                front
                                    .create(&pod, &container)
                                    .map(|()| {
                                        nri::CreateContainerResponse::default().encode_to_vec()
                                    })
                                    .map_err(refused)
                            },
                        ),
                    }
                }
                Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
            },
            "UpdateContainer" => match decode::<nri::UpdateContainerRequest>(payload) {
                Ok(req) => {
                    let pod = req.pod.unwrap_or_default();
                    let container = req.container.unwrap_or_default();
                    let resources = req.linux_resources.unwrap_or_default();
                    let front = Arc::clone(&front);
                    match after
                        .as_ref()
                        .filter(|_| !front.may_refuse(&pod, &container))
                    {
                        Some(after) => {
                            let queued = after.check(move || {
                                let _ = front.update(&pod, &container, &resources);
                            });
                            let empty = nri::UpdateContainerResponse::default().encode_to_vec();
                            writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
                            answered_first(log, "UpdateContainer", received, queued);
                        }
                        None => respond(
                            &writer,
                            &overdue,
                            received,
                            budget,
                            log,
                            "UpdateContainer",
                            answer,
                            move || {
                                front
                                    .update(&pod, &container, &resources)
                                    .map(|()| {
                                        nri::UpdateContainerResponse::default().encode_to_vec()
                                    })
                                    .map_err(refused)
                            },
                        ),
                    }
                }
                Err(s) => writer.send(PLUGIN_CONN, &answer(Err(s)))?,
            },
            "RemoveContainer" => {
                if let Ok(req) = decode::<nri::RemoveContainerRequest>(payload) {
                    let (front, container) =
                        (Arc::clone(&front), req.container.unwrap_or_default());
                    in_order(after.as_ref(), move || front.remove_container(&container));
                }
                let empty = nri::RemoveContainerResponse::default().encode_to_vec();
                writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
            }
            "RemovePodSandbox" => {
                if let Ok(req) = decode::<nri::RemovePodSandboxRequest>(payload) {
                    let (front, pod) = (Arc::clone(&front), req.pod.unwrap_or_default());
                    in_order(after.as_ref(), move || front.remove_pod(&pod));
                }
                let empty = nri::RemovePodSandboxResponse::default().encode_to_vec();
                writer.send(PLUGIN_CONN, &answer(Ok(empty)))?;
            }
            // NRI's older way of telling the same events.
            "StateChange" => {
                if let Ok(ev) = decode::<nri::StateChangeEvent>(payload) {
                    let front = Arc::clone(&front);
                    match nri::Event::try_from(ev.event) {
                        Ok(nri::Event::RemoveContainer) => {
                            let container = ev.container.unwrap_or_default();
                            in_order(after.as_ref(), move || front.remove_container(&container));
                        }
                        Ok(nri::Event::RemovePodSandbox) => {
                            let pod = ev.pod.unwrap_or_default();
                            in_order(after.as_ref(), move || front.remove_pod(&pod));
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

/// How many checks may wait for the [`After`] thread; one more is not run, and the log says so.
const AFTER_QUEUE: usize = 1024;
/// How long a session's end waits for the checks still queued.
const AFTER_DRAIN: Duration = Duration::from_secs(2);
/// How much nicer than the plugin the [`After`] thread runs. Its checks follow requests
/// already answered, so nothing waits for them; when pods start together their CPU goes to the
/// runtime first (containerd, the shims, runc), and the checks take the idle moments after.
/// Under CFS a nice of +10 still gets about a tenth of a contended CPU, so they are late, not
/// starved; [`AFTER_QUEUE`] bounds how far behind they fall.
const AFTER_NICER: i32 = 10;

type Later = Box<dyn FnOnce() + Send>;

/// The session's thread for the checks of requests answered before their verdict, and for the
/// removals that follow them: one at a time, in the order the requests came, so that a
/// container's update is checked after its create and a late check never brings back a
/// container or a pod removed after it. When the session ends, what is queued still runs
/// (waited for [`AFTER_DRAIN`] at most).
struct After {
    tx: Option<Sender<Later>>,
    waiting: Arc<AtomicUsize>,
}

impl After {
    /// `None` when no thread can be started: every request then waits for its verdict.
    fn start(log: &Logger) -> Option<Self> {
        let (tx, rx) = channel::<Later>();
        let waiting = Arc::new(AtomicUsize::new(0));
        let (count, thread_log) = (Arc::clone(&waiting), log.clone());
        let spawned = std::thread::Builder::new()
            .name("nri-after".into())
            .spawn(move || {
                nicer(&thread_log);
                for job in rx {
                    if catch_unwind(AssertUnwindSafe(job)).is_err() {
                        slog::warn!(thread_log, "a check after its answer failed unexpectedly";
                            "event" => "nri-unchecked", "method" => "", "reason" => "the check failed unexpectedly");
                    }
                    count.fetch_sub(1, Ordering::AcqRel);
                }
            });
        match spawned {
            Ok(_) => Some(Self {
                tx: Some(tx),
                waiting,
            }),
            Err(e) => {
                slog::warn!(log, "cannot start the thread for checks after their answer; every request waits for its verdict";
                    "event" => "nri-unchecked", "method" => "", "reason" => e.to_string());
                None
            }
        }
    }

    /// Queues a check; `false` when it is not run (the queue is full, or the thread gone).
    fn check(&self, job: impl FnOnce() + Send + 'static) -> bool {
        self.waiting.load(Ordering::Acquire) < AFTER_QUEUE && self.queue(Box::new(job)).is_ok()
    }

    /// Queues `job`, or gives it back.
    fn queue(&self, job: Later) -> Result<(), Later> {
        let Some(tx) = &self.tx else {
            return Err(job);
        };
        self.waiting.fetch_add(1, Ordering::AcqRel);
        tx.send(job).map_err(|e| {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            e.0
        })
    }
}

/// Lowers the calling thread's priority by [`AFTER_NICER`] (Linux keeps a nice value per
/// thread), from the plugin's own; a failure leaves it as it was and is logged.
fn nicer(log: &Logger) {
    let tid = Some(rustix::thread::gettid());
    let lowered = rustix::process::getpriority_process(tid)
        .and_then(|nice| rustix::process::setpriority_process(tid, (nice + AFTER_NICER).min(19)));
    if let Err(e) = lowered {
        slog::debug!(log, "the thread for checks after their answer keeps the plugin's priority";
            "event" => "nri-priority", "reason" => e.to_string());
    }
}

impl Drop for After {
    fn drop(&mut self) {
        self.tx.take();
        let deadline = Instant::now() + AFTER_DRAIN;
        while self.waiting.load(Ordering::Acquire) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// Runs a removal after the checks queued before it (never turned away), or here when there
/// is no [`After`] thread.
fn in_order(after: Option<&After>, job: impl FnOnce() + Send + 'static) {
    let job: Later = Box::new(job);
    match after {
        Some(a) => {
            if let Err(job) = a.queue(job) {
                job();
            }
        }
        None => job(),
    }
}

/// The log of a request answered before its check (`queued`: whether the check runs).
fn answered_first(log: &Logger, method: &'static str, received: Instant, queued: bool) {
    slog::debug!(log, "answered"; "event" => "nri-answered", "method" => method,
        "micros" => received.elapsed().as_micros() as u64, "before_verdict" => true);
    if !queued {
        slog::warn!(log, "answered without a verdict: the operation goes on unchecked";
            "event" => "nri-unchecked", "method" => method,
            "reason" => format!("{AFTER_QUEUE} checks wait already"));
    }
}

/// How a request is answered, once: by its check, or by the budget thread.
type Answer = Box<dyn FnOnce(Result<Vec<u8>, Status>) -> Frame + Send>;

/// A request waiting for its answer.
struct Pending {
    method: &'static str,
    received: Instant,
    deadline: Instant,
    answer: Mutex<Option<Answer>>,
}

impl Pending {
    /// Answers the request unless it was answered already; whether this call answered it.
    fn answer(&self, writer: &Writer, reply: Result<Vec<u8>, Status>, log: &Logger) -> bool {
        let Some(answer) = self.answer.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return false;
        };
        let _ = writer.send(PLUGIN_CONN, &answer(reply));
        slog::debug!(log, "answered"; "event" => "nri-answered", "method" => self.method,
            "micros" => self.received.elapsed().as_micros() as u64);
        true
    }

    /// "No adjustment": the operation goes on unchecked, and the log says why.
    fn unchecked(&self, writer: &Writer, why: &str, log: &Logger) {
        if self.answer(writer, Ok(Vec::new()), log) {
            slog::warn!(log, "answered without a verdict: the operation goes on unchecked";
                "event" => "nri-unchecked", "method" => self.method, "reason" => why);
        }
    }
}

/// The session's budget thread: answers each request whose check has not answered by its
/// deadline. Requests arrive with deadlines in order (one budget per session), so the first
/// waiting is the first due.
struct Overdue(Sender<Arc<Pending>>);

impl Overdue {
    fn start(writer: Arc<Writer>, log: Logger) -> Self {
        let (tx, rx) = channel();
        let thread_log = log.clone();
        let spawned = std::thread::Builder::new()
            .name("nri-budget".into())
            .spawn(move || overdue(&rx, &writer, &thread_log));
        if let Err(e) = spawned {
            // Each check still answers itself; only a hung one is left to the runtime's
            // own timeout.
            slog::error!(log, "cannot watch the answers' budget"; "event" => "nri-unchecked",
                "method" => "", "reason" => e.to_string());
        }
        Self(tx)
    }
}

fn overdue(rx: &Receiver<Arc<Pending>>, writer: &Writer, log: &Logger) {
    let mut waiting: VecDeque<Arc<Pending>> = VecDeque::new();
    loop {
        let now = Instant::now();
        while let Some(first) = waiting.front() {
            if first.deadline > now {
                break;
            }
            if let Some(p) = waiting.pop_front() {
                let budget = p.deadline.saturating_duration_since(p.received);
                p.unchecked(
                    writer,
                    &format!("no verdict within {} ms", budget.as_millis()),
                    log,
                );
            }
        }
        // Answered already: nothing to wait for.
        waiting.retain(|p| p.answer.lock().unwrap_or_else(|e| e.into_inner()).is_some());
        let next = match waiting.front() {
            Some(p) => rx.recv_timeout(p.deadline.saturating_duration_since(now)),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(p) => waiting.push_back(p),
            Err(RecvTimeoutError::Timeout) => {}
            // The session ended: its connection is gone, nothing can be answered.
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Answers a request from a thread of its own, so that the connection goes on reading:
/// `work`'s answer when it is done within `budget` of the request's arrival (`received`), else
/// (or when it panicked) an empty answer — "no adjustment", the operation goes on — and a log
/// line saying the check did not decide.
#[allow(clippy::too_many_arguments)]
fn respond(
    writer: &Arc<Writer>,
    overdue: &Overdue,
    received: Instant,
    budget: Duration,
    log: &Logger,
    method: &'static str,
    answer: impl FnOnce(Result<Vec<u8>, Status>) -> Frame + Send + 'static,
    work: impl FnOnce() -> Result<Vec<u8>, Status> + Send + 'static,
) {
    let pending = Arc::new(Pending {
        method,
        received,
        deadline: received + budget,
        answer: Mutex::new(Some(Box::new(answer))),
    });
    let (check_writer, check_log, mine) = (Arc::clone(writer), log.clone(), Arc::clone(&pending));
    let spawned = std::thread::Builder::new()
        .name("nri-check".into())
        .spawn(move || match catch_unwind(AssertUnwindSafe(work)) {
            Ok(reply) => {
                mine.answer(&check_writer, reply, &check_log);
            }
            Err(_) => mine.unchecked(&check_writer, "the check failed unexpectedly", &check_log),
        });
    match spawned {
        // Without a budget thread, a hung check is left to the runtime's own timeout.
        Ok(_) => {
            let _ = overdue.0.send(pending);
        }
        // Unchecked now rather than after the runtime's timeout.
        Err(e) => pending.unchecked(writer, &format!("cannot start the check: {e}"), log),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::sync_channel;

    fn reply(stream_id: u32) -> impl FnOnce(Result<Vec<u8>, Status>) -> Frame + Send + 'static {
        move |r| Frame {
            stream_id,
            kind: TYPE_RESPONSE,
            flags: 0,
            payload: Response {
                status: r.as_ref().err().cloned(),
                payload: r.unwrap_or_default(),
            }
            .encode_to_vec(),
        }
    }

    /// The next frame's stream and ttrpc response.
    fn next(reader: &mut Reader<UnixStream>) -> (u32, Response) {
        let (conn, frame) = reader.next_frame().expect("read").expect("a frame");
        assert_eq!(conn, PLUGIN_CONN);
        let response = Response::decode(frame.payload.as_slice()).expect("a response");
        (frame.stream_id, response)
    }

    #[test]
    fn each_check_answers_itself_and_one_still_running_is_answered_at_its_deadline() {
        let (a, b) = UnixStream::pair().expect("socket pair");
        b.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let (writer, mut reader) = (Arc::new(Writer::new(a)), Reader::new(b));
        let log = Logger::root(slog::Discard, slog::o!());
        let overdue = Overdue::start(Arc::clone(&writer), log.clone());
        let budget = Duration::from_millis(100);
        let (release, hung) = sync_channel::<()>(0);
        let received = Instant::now();
        respond(
            &writer,
            &overdue,
            received,
            budget,
            &log,
            "UpdateContainer",
            reply(3),
            move || {
                let _ = hung.recv();
                Ok(b"late".to_vec())
            },
        );
        respond(
            &writer,
            &overdue,
            Instant::now(),
            budget,
            &log,
            "CreateContainer",
            reply(5),
            || Ok(b"verdict".to_vec()),
        );
        respond(
            &writer,
            &overdue,
            Instant::now(),
            budget,
            &log,
            "UpdateContainer",
            reply(7),
            || Err(status(Code::FailedPrecondition, "refused".into())),
        );
        let mut answers = [next(&mut reader), next(&mut reader)];
        answers.sort_by_key(|(id, _)| *id);
        assert_eq!(answers[0].0, 5);
        assert_eq!(answers[0].1.payload, b"verdict");
        assert_eq!(answers[1].0, 7);
        assert_eq!(answers[1].1.code(), Code::FailedPrecondition as i32);
        // The hung check: "no adjustment" once its budget from its arrival ran out.
        let (id, late) = next(&mut reader);
        let waited = received.elapsed();
        assert_eq!(id, 3);
        assert!(late.status.is_none() && late.payload.is_empty(), "{late:?}");
        assert!(waited >= budget, "{waited:?}");
        assert!(waited < budget + Duration::from_secs(5), "{waited:?}");
        // Done at last, it writes nothing more: each request is answered once.
        release.send(()).expect("release");
        respond(
            &writer,
            &overdue,
            Instant::now(),
            budget,
            &log,
            "UpdateContainer",
            reply(9),
            || panic!("a check that panics"),
        );
        let (id, answer) = next(&mut reader);
        assert_eq!(
            id, 9,
            "the panicking check, answered; nothing from the hung one"
        );
        assert!(answer.status.is_none() && answer.payload.is_empty());
    }

    #[test]
    fn checks_after_their_answer_run_in_order_and_a_removal_never_overtakes_them() {
        let log = Logger::root(slog::Discard, slog::o!());
        let after = After::start(&log).expect("the thread");
        let ran = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3 {
            let ran = Arc::clone(&ran);
            assert!(after.check(move || {
                std::thread::sleep(Duration::from_millis(20 - 5 * i));
                ran.lock().expect("lock").push(format!("check {i}"));
            }));
        }
        let removed = Arc::clone(&ran);
        in_order(Some(&after), move || {
            removed.lock().expect("lock").push("removal".into())
        });
        // The session's end runs what is queued.
        drop(after);
        assert_eq!(
            *ran.lock().expect("lock"),
            ["check 0", "check 1", "check 2", "removal"]
        );
    }

    #[test]
    fn checks_after_their_answer_run_nicer_than_the_requests_thread() {
        let log = Logger::root(slog::Discard, slog::o!());
        let own = rustix::process::getpriority_process(None).expect("this thread's nice");
        let after = After::start(&log).expect("the thread");
        let (tx, rx) = sync_channel(1);
        assert!(after.check(move || {
            let _ = tx.send(rustix::process::getpriority_process(None).map_err(|e| e.to_string()));
        }));
        let theirs = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the check ran");
        assert_eq!(theirs, Ok((own + AFTER_NICER).min(19)));
        assert_eq!(
            rustix::process::getpriority_process(None).expect("this thread's nice"),
            own,
            "only the check's thread is lowered"
        );
    }

    #[test]
    fn a_full_queue_turns_checks_away_but_never_a_removal() {
        let log = Logger::root(slog::Discard, slog::o!());
        let after = After::start(&log).expect("the thread");
        let (release, wedged) = sync_channel::<()>(0);
        assert!(after.check(move || {
            let _ = wedged.recv();
        }));
        let count = Arc::new(AtomicUsize::new(0));
        for _ in 1..AFTER_QUEUE {
            let count = Arc::clone(&count);
            assert!(after.check(move || {
                count.fetch_add(1, Ordering::Relaxed);
            }));
        }
        assert!(!after.check(|| {}), "one more than the queue holds");
        let removed = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&removed);
        in_order(Some(&after), move || {
            r.fetch_add(1, Ordering::Relaxed);
        });
        release.send(()).expect("release");
        drop(after);
        assert_eq!(count.load(Ordering::Relaxed), AFTER_QUEUE - 1);
        assert_eq!(removed.load(Ordering::Relaxed), 1, "the removal ran");
    }

    #[test]
    fn subscribes_to_creates_updates_and_removals_only() {
        // NRI's Event values 4, 8, 11 and 3 as mask bits 3, 7, 10 and 2.
        assert_eq!(events(), (1 << 3) | (1 << 7) | (1 << 10) | (1 << 2));
    }
}
