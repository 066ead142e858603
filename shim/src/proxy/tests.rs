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
