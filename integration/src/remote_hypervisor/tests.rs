use super::kata::grpc::{health_check_response::ServingStatus, HealthCheckResponse};
use super::*;
use std::io::Write;
use std::net::TcpListener;

fn service(dir: &Path, qemu: &Path) -> Service {
    Service::new(Config {
        machine: vec![
            "-serial".into(),
            format!("file:{}", dir.join("console").display()).into(),
        ],
        qemu: qemu.to_path_buf(),
        state_dir: dir.join("state"),
        shared_root: dir.join("shared"),
        boot_timeout: Duration::from_secs(20),
        stop_timeout: Duration::from_secs(5),
    })
}

fn request(method: &str, payload: Vec<u8>) -> Vec<u8> {
    Request {
        service: SERVICE.into(),
        method: method.into(),
        payload,
        timeout_nano: 30_000_000_000,
        metadata: Vec::new(),
    }
    .encode_to_vec()
}

fn create(id: &str) -> Vec<u8> {
    request(
        "CreateVM",
        CreateVmRequest {
            id: id.into(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
}

fn code(r: &Response) -> i32 {
    r.status.as_ref().map_or(0, |s| s.code)
}

fn message(r: &Response) -> String {
    r.status
        .as_ref()
        .map(|s| s.message.clone())
        .unwrap_or_default()
}

#[test]
fn create_vm_records_the_sandbox_and_answers_where_its_agent_will_be() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = service(dir.path(), Path::new("/bin/false"));
    let r = s.answer(&create("sb1"), None);
    assert_eq!(code(&r), 0, "{}", message(&r));
    let answer = CreateVmResponse::decode(r.payload.as_slice()).expect("CreateVMResponse");
    let socket = dir.path().join("state/1/agent.sock");
    assert_eq!(answer.agent_socket_path, socket.to_string_lossy());
    let mode = std::fs::metadata(dir.path().join("state/1"))
        .expect("sandbox dir")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    let again = s.answer(&create("sb1"), None);
    assert_eq!(code(&again), Code::AlreadyExists as i32);
    // StopVM forgets it (no VM ran) and removes its directory.
    let stop = s.answer(
        &request("StopVM", StopVmRequest { id: "sb1".into() }.encode_to_vec()),
        None,
    );
    assert_eq!(code(&stop), 0, "{}", message(&stop));
    assert!(!dir.path().join("state/1").exists());
}

#[test]
fn every_bad_request_gets_its_code_and_says_what_was_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = service(dir.path(), Path::new("/bin/false"));
    let start = |id: &str| request("StartVM", StartVmRequest { id: id.into() }.encode_to_vec());
    let stop = |id: &str| request("StopVM", StopVmRequest { id: id.into() }.encode_to_vec());
    let cases: Vec<(&str, Vec<u8>, Code, &str)> = vec![
        (
            "no id",
            create(""),
            Code::InvalidArgument,
            "names no sandbox id",
        ),
        (
            "a path",
            create("../etc"),
            Code::InvalidArgument,
            "not a name",
        ),
        ("a dot", create(".x"), Code::InvalidArgument, "not a name"),
        (
            "unknown start",
            start("nope"),
            Code::NotFound,
            "CreateVM was never called",
        ),
        (
            "unknown stop",
            stop("nope"),
            Code::NotFound,
            "CreateVM was never called",
        ),
        (
            "empty stop",
            stop(""),
            Code::InvalidArgument,
            "names no sandbox id",
        ),
        (
            "method",
            request("PauseVM", Vec::new()),
            Code::Unimplemented,
            "hypervisor.Hypervisor/PauseVM",
        ),
        (
            "garbage",
            vec![0xff, 0xff, 0xff],
            Code::InvalidArgument,
            "ttrpc request does not decode",
        ),
        (
            "payload",
            request("CreateVM", vec![0x0a, 0x05, b'a']),
            Code::InvalidArgument,
            "CreateVM request",
        ),
    ];
    for (what, bytes, want, text) in cases {
        let r = s.answer(&bytes, None);
        assert_eq!(code(&r), want as i32, "{what}: {}", message(&r));
        assert!(message(&r).contains(text), "{what}: {}", message(&r));
    }
    let other = Request {
        service: "grpc.Health".into(),
        method: "Check".into(),
        ..Default::default()
    };
    let r = s.answer(&other.encode_to_vec(), None);
    assert_eq!(code(&r), Code::Unimplemented as i32);
    let v = s.answer(&request("Version", Vec::new()), None);
    assert_eq!(code(&v), 0);
    let version = VersionResponse::decode(v.payload.as_slice()).expect("VersionResponse");
    assert!(version.version.starts_with("kata-topo-remote-hypervisor "));
}

#[test]
fn start_vm_before_the_shared_directory_exists_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = service(dir.path(), Path::new("/bin/false"));
    assert_eq!(code(&s.answer(&create("sb1"), None)), 0);
    let r = s.answer(
        &request(
            "StartVM",
            StartVmRequest { id: "sb1".into() }.encode_to_vec(),
        ),
        None,
    );
    assert_eq!(code(&r), Code::FailedPrecondition as i32, "{}", message(&r));
    assert!(message(&r).contains(&*dir.path().join("shared/sb1/shared").to_string_lossy()));
}

#[test]
fn a_guest_that_ends_before_its_agent_answers_fails_start_vm_with_its_console() {
    let dir = tempfile::tempdir().expect("tempdir");
    let qemu = dir.path().join("qemu");
    std::fs::write(
        &qemu,
        format!(
            "#!/bin/sh\necho 'guest: no agent' >> {}\necho 'qemu: bad' >&2\nexit 3\n",
            dir.path().join("console").display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&qemu, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::create_dir_all(dir.path().join("shared/sb1/shared")).expect("share");
    let s = service(dir.path(), &qemu);
    assert_eq!(code(&s.answer(&create("sb1"), None)), 0);
    let r = s.answer(
        &request(
            "StartVM",
            StartVmRequest { id: "sb1".into() }.encode_to_vec(),
        ),
        None,
    );
    assert_eq!(code(&r), Code::Internal as i32, "{}", message(&r));
    let text = message(&r);
    assert!(text.contains("QEMU exited 3"), "{text}");
    assert!(
        text.contains("guest: no agent") && text.contains("qemu: bad"),
        "{text}"
    );
    // The relay went with it, and the sandbox may be started again.
    assert!(!dir.path().join("state/1/agent.sock").exists());
    let again = s.answer(
        &request(
            "StartVM",
            StartVmRequest { id: "sb1".into() }.encode_to_vec(),
        ),
        None,
    );
    assert_eq!(code(&again), Code::Internal as i32, "{}", message(&again));
}

#[test]
fn the_machine_gets_the_sandbox_share_and_the_forwarded_ports() {
    let machine: Vec<OsString> = vec!["-m".into(), "2048M".into()];
    let args = vm::qemu_args(&machine, Path::new("/run/s/sb1/shared"), 4001, 4002);
    let text: Vec<String> = args
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    assert_eq!(&text[..2], ["-m", "2048M"]);
    assert!(text.contains(
        &"local,id=fs_kataShared,path=/run/s/sb1/shared,security_model=none,multidevs=remap,readonly=on"
            .to_string()
    ));
    assert!(text.contains(
        &"virtio-9p-pci,fsdev=fs_kataShared,mount_tag=kataShared,bus=pcie.0".to_string()
    ));
    assert!(text
        .iter()
        .any(|a| a.contains("hostfwd=tcp:127.0.0.1:4001-10.0.2.15:1024")
            && a.contains("hostfwd=tcp:127.0.0.1:4002-10.0.2.15:1025")
            && a.contains("restrict=on")));
}

/// A fake agent on a TCP port: the first connection closed at once (QEMU's forwarded port
/// before the guest listens), the second answered NOT_SERVING, every later one SERVING.
fn fake_agent() -> (SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    let handle = std::thread::spawn(move || {
        for (n, stream) in listener.incoming().take(3).enumerate() {
            let mut stream = stream.expect("accept");
            if n == 0 {
                continue;
            }
            let frame = Frame::read(&mut stream).expect("read").expect("frame");
            let req = Request::decode(frame.payload.as_slice()).expect("request");
            assert_eq!(
                (req.service.as_str(), req.method.as_str()),
                ("grpc.Health", "Check")
            );
            let status = if n == 1 {
                ServingStatus::NotServing
            } else {
                ServingStatus::Serving
            };
            let answer = Response {
                status: None,
                payload: HealthCheckResponse {
                    status: status as i32,
                }
                .encode_to_vec(),
            };
            Frame {
                stream_id: frame.stream_id,
                kind: wire::TYPE_RESPONSE,
                flags: 0,
                payload: answer.encode_to_vec(),
            }
            .write(&mut stream)
            .expect("write");
            stream.flush().expect("flush");
        }
    });
    (addr, handle)
}

use std::net::SocketAddr;

#[test]
fn the_agent_counts_as_up_only_once_it_answers_serving_through_the_relay() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (addr, agent) = fake_agent();
    let socket = dir.path().join("agent.sock");
    let relay = Relay::start(&socket, addr).expect("relay");
    let deadline = || Instant::now() + Duration::from_secs(5);
    let first = agent_answers(&socket, deadline()).expect_err("closed at once");
    assert!(first.contains("grpc.Health/Check"), "{first}");
    let second = agent_answers(&socket, deadline()).expect_err("not serving");
    assert!(second.contains("NOT_SERVING"), "{second}");
    agent_answers(&socket, deadline()).expect("serving");
    agent.join().expect("fake agent");
    relay.close();
    assert!(!socket.exists());
}

#[test]
fn the_service_answers_on_its_connection_and_survives_an_oversized_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let s = Arc::new(service(dir.path(), Path::new("/bin/false")));
    let (mut client, server) = UnixStream::pair().expect("pair");
    let serving = Arc::clone(&s);
    let t = std::thread::spawn(move || serving.connection(server));
    // A frame over the limit: its stream gets RESOURCE_EXHAUSTED, the connection stays.
    let mut header = Vec::new();
    header.extend_from_slice(&((wire::MAX_FRAME + 1) as u32).to_be_bytes());
    header.extend_from_slice(&1u32.to_be_bytes());
    header.extend_from_slice(&[wire::TYPE_REQUEST, 0]);
    client.write_all(&header).expect("header");
    client
        .write_all(&vec![0u8; wire::MAX_FRAME + 1])
        .expect("payload");
    let r = Frame::read(&mut client).expect("read").expect("frame");
    assert_eq!(r.stream_id, 1);
    let resp = Response::decode(r.payload.as_slice()).expect("response");
    assert_eq!(code(&resp), Code::ResourceExhausted as i32);
    Frame {
        stream_id: 3,
        kind: wire::TYPE_REQUEST,
        flags: 0,
        payload: create("sb9"),
    }
    .write(&mut client)
    .expect("write");
    let r = Frame::read(&mut client).expect("read").expect("frame");
    assert_eq!((r.stream_id, r.kind), (3, wire::TYPE_RESPONSE));
    let resp = Response::decode(r.payload.as_slice()).expect("response");
    assert_eq!(code(&resp), 0, "{}", message(&resp));
    drop(client);
    t.join().expect("connection thread");
}
