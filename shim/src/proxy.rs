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
mod tests {
    //! The proxy over socket pairs: the test plays containerd on one end and the delegate on the
    //! other, with raw frames.

    use std::io::Read;
    use std::os::unix::net::UnixStream;
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;
    use crate::pod::testing::{pod, TestPod};
    use kata_topo_proto::wire::{Any, Code, KeyValue, MAX_FRAME};

    const ENFORCE_SPEC_TASK: &str = "c1";

    struct Wire {
        /// containerd's end.
        client: UnixStream,
        /// The delegate's end.
        delegate: UnixStream,
        pump: std::thread::JoinHandle<()>,
    }

    fn wire(p: &TestPod, service: &'static str) -> Wire {
        let (client, client_proxy) = UnixStream::pair().expect("pair");
        let (upstream_proxy, delegate) = UnixStream::pair().expect("pair");
        let pod = p.pod.clone();
        let log = p.log.logger().clone();
        let d = Delegate {
            address: "unix:///nonexistent".into(),
            service,
        };
        let pump = std::thread::spawn(move || pump(client_proxy, upstream_proxy, &d, &pod, &log));
        for s in [&client, &delegate] {
            s.set_read_timeout(Some(Duration::from_secs(10)))
                .expect("timeout");
        }
        Wire {
            client,
            delegate,
            pump,
        }
    }

    fn request(service: &str, method: &str, payload: Vec<u8>) -> Vec<u8> {
        Request {
            service: service.into(),
            method: method.into(),
            payload,
            timeout_nano: 5_000_000_000,
            metadata: vec![KeyValue {
                key: "containerd-namespace-ttrpc".into(),
                value: "k8s.io".into(),
            }],
        }
        .encode_to_vec()
    }

    fn frame(stream_id: u32, kind: u8, payload: Vec<u8>) -> Frame {
        Frame {
            stream_id,
            kind,
            flags: 0,
            payload,
        }
    }

    fn read(s: &mut UnixStream) -> Frame {
        Frame::read(s).expect("read").expect("a frame")
    }

    fn status_of(f: &Frame) -> i32 {
        Response::decode(f.payload.as_slice())
            .expect("response")
            .code()
    }

    fn update(cpus: &str) -> Vec<u8> {
        UpdateTaskRequest {
            id: ENFORCE_SPEC_TASK.into(),
            resources: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
                value: format!(r#"{{"cpu":{{"cpus":"{cpus}"}}}}"#).into_bytes(),
            }),
            ..Default::default()
        }
        .encode_to_vec()
    }

    #[test]
    fn frames_pass_byte_for_byte_and_streams_interleave() {
        let p = pod("audit");
        let mut w = wire(&p, TASK_V2);
        let state = |id: u32| {
            frame(
                id,
                TYPE_REQUEST,
                request(TASK_V2, "State", vec![10, 2, b'c', b'1']),
            )
        };
        // Two requests in flight at once; the delegate answers them in the other order.
        for id in [1, 3] {
            state(id).write(&mut w.client).expect("send");
        }
        assert_eq!(read(&mut w.delegate), state(1));
        assert_eq!(read(&mut w.delegate), state(3));
        let answer = |id: u32| frame(id, TYPE_RESPONSE, vec![18, 3, 1, 2, 3]);
        answer(3).write(&mut w.delegate).expect("answer");
        answer(1).write(&mut w.delegate).expect("answer");
        assert_eq!(read(&mut w.client), answer(3));
        assert_eq!(read(&mut w.client), answer(1));
        // Stream data (type 3) and other services pass too.
        let data = frame(5, 3, vec![0xde, 0xad]);
        data.write(&mut w.client).expect("data");
        assert_eq!(read(&mut w.delegate), data);
        let other = frame(
            7,
            TYPE_REQUEST,
            request("grpc.health.v1.Health", "Check", vec![]),
        );
        other.write(&mut w.client).expect("other");
        assert_eq!(read(&mut w.delegate), other);
        drop(w.client);
        w.pump.join().expect("no panic");
    }

    #[test]
    fn the_service_is_renamed_to_the_one_the_delegate_speaks() {
        let p = pod("audit");
        let mut w = wire(&p, TASK_V3);
        frame(1, TYPE_REQUEST, request(TASK_V2, "State", vec![]))
            .write(&mut w.client)
            .expect("send");
        let got = Request::decode(read(&mut w.delegate).payload.as_slice()).expect("request");
        assert_eq!(got.service, TASK_V3);
        assert_eq!(got.method, "State");
        assert_eq!(got.metadata.len(), 1, "metadata kept");
        assert_eq!(got.timeout_nano, 5_000_000_000, "deadline kept");
    }

    #[test]
    fn a_refused_update_is_answered_on_its_stream_and_never_reaches_the_delegate() {
        let p = pod("enforce");
        p.create();
        let mut w = wire(&p, TASK_V2);
        frame(9, TYPE_REQUEST, request(TASK_V2, "Update", update("0")))
            .write(&mut w.client)
            .expect("send");
        let answer = read(&mut w.client);
        assert_eq!((answer.stream_id, answer.kind), (9, TYPE_RESPONSE));
        assert_eq!(status_of(&answer), Code::FailedPrecondition as i32);
        // The next request is the first the delegate sees.
        let next = frame(11, TYPE_REQUEST, request(TASK_V2, "Update", update("1")));
        next.write(&mut w.client).expect("send");
        assert_eq!(read(&mut w.delegate), next);
    }

    #[test]
    fn an_oversized_message_fails_its_stream_only() {
        let p = pod("audit");
        let mut w = wire(&p, TASK_V2);
        // containerd sends a request over the limit, then a valid one on the same connection.
        let len = MAX_FRAME + 1;
        let mut header = Vec::new();
        header.extend_from_slice(&(len as u32).to_be_bytes());
        header.extend_from_slice(&1u32.to_be_bytes());
        header.extend_from_slice(&[TYPE_REQUEST, 0]);
        let writer = {
            let mut c = w.client.try_clone().expect("clone");
            std::thread::spawn(move || {
                use std::io::Write as _;
                c.write_all(&header).expect("header");
                c.write_all(&vec![0u8; len]).expect("payload");
            })
        };
        let answer = read(&mut w.client);
        writer.join().expect("writer");
        assert_eq!(answer.stream_id, 1);
        let status = Response::decode(answer.payload.as_slice())
            .expect("response")
            .status
            .expect("status");
        assert_eq!(status.code, Code::ResourceExhausted as i32);
        assert!(
            status.message.contains("exceed maximum message size"),
            "{status:?}"
        );
        let state = frame(3, TYPE_REQUEST, request(TASK_V2, "State", vec![]));
        state.write(&mut w.client).expect("send");
        assert_eq!(read(&mut w.delegate), state);
        // The delegate answers over the limit: containerd's call fails, the connection stays.
        let mut big = Vec::new();
        big.extend_from_slice(&(len as u32).to_be_bytes());
        big.extend_from_slice(&3u32.to_be_bytes());
        big.extend_from_slice(&[TYPE_RESPONSE, 0]);
        let writer = {
            let mut d = w.delegate.try_clone().expect("clone");
            std::thread::spawn(move || {
                use std::io::Write as _;
                d.write_all(&big).expect("header");
                d.write_all(&vec![0u8; len]).expect("payload");
            })
        };
        let answer = read(&mut w.client);
        writer.join().expect("writer");
        assert_eq!(answer.stream_id, 3);
        assert_eq!(status_of(&answer), Code::ResourceExhausted as i32);
        let state = frame(5, TYPE_REQUEST, request(TASK_V2, "State", vec![]));
        state.write(&mut w.client).expect("send");
        assert_eq!(read(&mut w.delegate), state);
    }

    #[test]
    fn an_undecodable_request_is_invalid_argument() {
        let p = pod("audit");
        let mut w = wire(&p, TASK_V2);
        frame(1, TYPE_REQUEST, vec![0xff, 0xff, 0xff])
            .write(&mut w.client)
            .expect("send");
        let answer = read(&mut w.client);
        assert_eq!(status_of(&answer), Code::InvalidArgument as i32);
    }

    #[test]
    fn an_unavailable_delegate_answers_unavailable() {
        let p = pod("audit");
        let (mut client, proxy_end) = UnixStream::pair().expect("pair");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let pod = p.pod.clone();
        let log = p.log.logger().clone();
        let t = std::thread::spawn(move || {
            let d = Delegate::new("unix:///nonexistent/delegate.sock".into(), 2);
            proxy(proxy_end, &d, &pod, &log);
        });
        frame(1, TYPE_REQUEST, request(TASK_V2, "State", vec![]))
            .write(&mut client)
            .expect("send");
        let answer = read(&mut client);
        let status = Response::decode(answer.payload.as_slice())
            .expect("response")
            .status
            .expect("status");
        assert_eq!(status.code, Code::Unavailable as i32);
        assert!(
            status.message.contains("/nonexistent/delegate.sock"),
            "{status:?}"
        );
        drop(client);
        t.join().expect("no panic");
    }

    /// A connection that closes before sending anything (`start` probing the daemon) never dials
    /// the delegate; the next one, which sends a request, does.
    #[test]
    fn the_delegate_is_dialled_only_when_a_request_arrives() {
        let p = pod("audit");
        let dir = tempfile::tempdir().expect("tempdir");
        let sock = dir.path().join("delegate.sock");
        let listener = std::os::unix::net::UnixListener::bind(&sock).expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let address = format!("unix://{}", sock.display());
        let serve = |client: UnixStream| {
            let (pod, log, address) = (p.pod.clone(), p.log.logger().clone(), address.clone());
            std::thread::spawn(move || proxy(client, &Delegate::new(address, 2), &pod, &log))
        };

        let (probe, proxy_end) = UnixStream::pair().expect("pair");
        let t = serve(proxy_end);
        drop(probe);
        t.join().expect("no panic");
        assert!(
            matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "a probe must not reach the delegate"
        );

        let (mut client, proxy_end) = UnixStream::pair().expect("pair");
        let t = serve(proxy_end);
        frame(1, TYPE_REQUEST, request(TASK_V2, "State", vec![]))
            .write(&mut client)
            .expect("send");
        listener.set_nonblocking(false).expect("blocking");
        let (mut delegate, _) = listener.accept().expect("the request dials the delegate");
        delegate
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let forwarded = read(&mut delegate);
        assert_eq!(
            Request::decode(forwarded.payload.as_slice())
                .expect("request")
                .method,
            "State"
        );
        drop(client);
        drop(delegate);
        t.join().expect("no panic");
    }

    /// A frame as it reaches a delegate that speaks task API v2.
    fn as_delegate_sees_it(f: &Frame) -> Frame {
        let mut f = f.clone();
        if f.kind == TYPE_REQUEST {
            if let Ok(mut r) = Request::decode(f.payload.as_slice()) {
                if is_task_service(&r.service) {
                    r.service = TASK_V2.into();
                    f.payload = r.encode_to_vec();
                }
            }
        }
        f
    }

    /// Everything that arrives at one end until it closes.
    fn drain(mut s: UnixStream) -> Vec<u8> {
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out);
        out
    }

    /// What a generated input holds: whole frames (requests that decode and ones that do not,
    /// responses, data) with an occasional oversized header, then possibly raw garbage.
    fn frames() -> impl Strategy<Value = (Vec<Frame>, Vec<u8>)> {
        let payload = prop_oneof![
            Just(request(TASK_V2, "State", vec![])),
            Just(request(TASK_V3, "Update", update("1"))),
            Just(request(
                TASK_V2,
                "Update",
                b"\x0a\x02c1\x12\x03\xff\xff\xff".to_vec()
            )),
            Just(request(
                TASK_V2,
                "Create",
                vec![0x0a, 0x02, b'c', b'9', 0x12, 0x01, b'/']
            )),
            proptest::collection::vec(any::<u8>(), 0..64),
        ];
        let f = (
            1u32..64,
            prop_oneof![Just(1u8), Just(2u8), Just(3u8), any::<u8>()],
            payload,
        )
            .prop_map(|(id, kind, payload)| frame(id * 2 + 1, kind, payload));
        (
            proptest::collection::vec(f, 0..24),
            proptest::collection::vec(any::<u8>(), 0..32),
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig {
            cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(64),
            ..ProptestConfig::default()
        })]

        /// Over any byte stream the proxy never panics, forwards only whole frames that were in
        /// the input, and answers or forwards every request exactly once.
        #[test]
        fn any_stream_is_forwarded_or_answered_exactly_once((input, garbage) in frames()) {
            // One pod for every case, as one daemon serves every connection: a pod per case
            // would keep its writer threads for the whole run (100,000 cases in `make fuzz`).
            static POD: std::sync::OnceLock<TestPod> = std::sync::OnceLock::new();
            let p = POD.get_or_init(|| pod("audit"));
            let w = wire(p, TASK_V2);
            let mut bytes: Vec<u8> = input.iter().flat_map(Frame::encode).collect();
            bytes.extend_from_slice(&garbage);
            {
                use std::io::Write as _;
                let mut c = w.client.try_clone().expect("clone");
                // The proxy answers while we write: read both ends concurrently.
                let client_side = w.client.try_clone().expect("clone");
                let delegate_side = w.delegate.try_clone().expect("clone");
                let answered = std::thread::spawn(move || drain(client_side));
                let forwarded = std::thread::spawn(move || drain(delegate_side));
                c.write_all(&bytes).expect("write");
                c.shutdown(Shutdown::Write).expect("shutdown");
                w.pump.join().expect("the proxy never panics");
                drop(w.client);
                drop(w.delegate);
                let answered = answered.join().expect("client end");
                let forwarded = forwarded.join().expect("delegate end");
                let parse = |b: &[u8]| {
                    let mut r = b;
                    let mut out = Vec::new();
                    while let Ok(Some(f)) = Frame::read(&mut r) {
                        out.push(f);
                    }
                    prop_assert!(r.is_empty(), "only whole frames");
                    Ok(out)
                };
                let forwarded = parse(&forwarded)?;
                let answered = parse(&answered)?;
                // Forwarded frames are input frames, in order (with the task service renamed to
                // the one the delegate speaks).
                let input: Vec<Frame> = input.iter().map(as_delegate_sees_it).collect();
                let mut rest = input.iter();
                for f in &forwarded {
                    prop_assert!(rest.any(|i| i == f), "forwarded a frame not in the input: {:?}", f);
                }
                // Answers are responses to requests of the input, one per stream at most.
                let mut seen = std::collections::HashSet::new();
                for a in &answered {
                    prop_assert_eq!(a.kind, TYPE_RESPONSE);
                    prop_assert!(input.iter().any(|i| i.stream_id == a.stream_id && i.kind == TYPE_REQUEST));
                    prop_assert!(seen.insert(a.stream_id) || input.iter().filter(|i| i.stream_id == a.stream_id && i.kind == TYPE_REQUEST).count() > 1);
                }
                // Every request of the input was either forwarded or answered: the proxy reads
                // whole frames until the garbage, so every input frame was handled.
                for i in input.iter().filter(|i| i.kind == TYPE_REQUEST) {
                    let fwd = forwarded.iter().filter(|f| *f == i).count();
                    let ans = answered.iter().filter(|a| a.stream_id == i.stream_id).count();
                    prop_assert!(fwd + ans >= 1, "request on stream {} lost", i.stream_id);
                }
            }
        }
    }
}
