//! A remote hypervisor for Kata's shim: the service Kata's `remote` hypervisor (the peer-pods
//! interface, for hosts without nested virtualisation) asks to create, start and stop the pod's
//! VM, here booting the two-NUMA machine of `make vm-test` on this host, so that `make
//! kata-test` runs the real `containerd-shim-kata-v2` and the real `kata-agent` behind the
//! wrapper.
//!
//! The protocol is Kata's `hypervisor.proto` (`hypervisor.Hypervisor`: `CreateVM`, `StartVM`,
//! `StopVM`, `Version`) over ttrpc on a unix socket, served here on the project's own framing
//! ([`kata_topo_proto::wire`]). Kata's shim opens a connection per call
//! (`src/runtime/virtcontainers/remote.go`):
//!
//! - `CreateVM` records the sandbox and answers the agent's socket path,
//!   `<state_dir>/<n>/agent.sock` (`n` counts the sandboxes: a 64-digit sandbox id would make
//!   the path longer than a unix socket's); nothing runs yet (Kata prepares the sandbox's
//!   shared directory after this call).
//! - `StartVM` boots the machine with the sandbox's shared directory
//!   (`<shared_root>/<id>/shared`) as the 9p share `kataShared`, and a user-mode NIC that
//!   forwards two host loopback ports to the guest's agent (`tcp://10.0.2.15:1024`) and to
//!   its control port (1025). QEMU runs in the caller's mount namespace: Kata's shim unshares
//!   one at `start` (`setupMntNs`, `src/runtime/pkg/containerd-shim-v2/service.go`) and makes
//!   the rootfs bind mounts there, so a QEMU in any other namespace would export an empty
//!   directory. The agent's socket relays each connection to the forwarded agent port, and
//!   the call returns only once the agent answers `grpc.Health/Check` through that relay —
//!   the shim's own first call, which it makes once, without retry.
//! - `StopVM` asks the guest to power off (its control port), waits for QEMU to exit, kills
//!   it when it does not in time, and forgets the sandbox.
//!
//! One VM at a time: every VM is the same machine, with the same console file and results
//! share; a second `StartVM` while one runs is refused (`FAILED_PRECONDITION`). Every wait is
//! bounded (the request's deadline, `boot_timeout`, `stop_timeout`). QEMU dies with the
//! service (a parent-death signal on the thread that waits for it).

mod vm;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kata_topo_proto::wire::{self, Code, Frame, Incoming, Request, Response, Status};
use prost::Message;

pub use vm::{agent_answers, Relay};

/// The messages generated from Kata's `hypervisor.proto` and `health.proto`.
#[allow(
    missing_docs,
    missing_debug_implementations,
    unused_qualifications,
    clippy::all,
    clippy::pedantic
)]
pub mod kata {
    include!(concat!(env!("OUT_DIR"), "/kata.rs"));
}

use kata::hypervisor::{
    CreateVmRequest, CreateVmResponse, StartVmRequest, StartVmResponse, StopVmRequest,
    StopVmResponse, VersionRequest, VersionResponse,
};

/// The ttrpc service name Kata's shim calls.
pub const SERVICE: &str = "hypervisor.Hypervisor";

/// The guest's address on the user-mode network, and its agent and control ports.
pub const GUEST_ADDR: &str = "10.0.2.15";
/// The agent's port in the guest (`server_addr = "tcp://10.0.2.15:1024"`).
pub const GUEST_AGENT_PORT: u16 = 1024;
/// The guest's control port: a line `poweroff` powers it off.
pub const GUEST_CONTROL_PORT: u16 = 1025;

/// How the service runs its VMs.
#[derive(Debug, Clone)]
pub struct Config {
    /// QEMU's arguments for the machine (the vm-test machine), without the per-sandbox share
    /// and network this service adds.
    pub machine: Vec<OsString>,
    /// The QEMU binary.
    pub qemu: PathBuf,
    /// Per sandbox: `<state_dir>/<n>/` (the agent's socket, QEMU's output).
    pub state_dir: PathBuf,
    /// Where Kata's shim prepares each sandbox's shared directory (`<shared_root>/<id>/shared`).
    pub shared_root: PathBuf,
    /// At most this long from `StartVM` to an agent that answers (less when the request's
    /// deadline is nearer).
    pub boot_timeout: Duration,
    /// At most this long for a guest to power off after `StopVM` before QEMU is killed.
    pub stop_timeout: Duration,
}

impl Config {
    /// Kata's default shared root (`GetSharePath`, `src/runtime/virtcontainers/kata_agent.go`).
    pub const KATA_SHARED_ROOT: &'static str = "/run/kata-containers/shared/sandboxes";
}

/// Why a call failed; [`Error::code`] is the one place that maps it to a status code.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request names no sandbox.
    #[error("the request names no sandbox id")]
    NoId,
    /// A sandbox id that is not a plain name.
    #[error("sandbox id {0:?} is not a name of letters, digits, '.', '_' and '-'")]
    BadId(String),
    /// `CreateVM` twice.
    #[error("sandbox {0} exists already")]
    Exists(String),
    /// A sandbox `CreateVM` never recorded.
    #[error("no sandbox {0:?}: CreateVM was never called for it")]
    Unknown(String),
    /// `StartVM` of a sandbox whose VM was started already.
    #[error("sandbox {0}'s VM was started already")]
    Started(String),
    /// Another sandbox's VM runs.
    #[error("one VM at a time: sandbox {0}'s VM runs")]
    Busy(String),
    /// Kata's shim has not prepared the shared directory the guest needs.
    #[error("sandbox {id}: no shared directory {path} in the caller's mount namespace")]
    NoShare { id: String, path: PathBuf },
    /// The guest ended before its agent answered.
    #[error("sandbox {id}: the guest {how} before its agent answered; console: {console}")]
    GuestEnded {
        id: String,
        how: String,
        console: String,
    },
    /// The agent did not answer in time.
    #[error(
        "sandbox {id}: the agent did not answer within {seconds} s ({last}); console: {console}"
    )]
    NotReady {
        id: String,
        seconds: u64,
        last: String,
        console: String,
    },
    /// A message that does not decode.
    #[error("the {0} request does not decode")]
    Decode(&'static str, #[source] prost::DecodeError),
    /// A method this service does not have.
    #[error("no method {0}")]
    Unimplemented(String),
    /// Setting up what the VM needs failed.
    #[error("{0}")]
    Io(String, #[source] io::Error),
}

impl Error {
    /// The status code the caller gets.
    pub fn code(&self) -> Code {
        match self {
            Self::NoId | Self::BadId(_) | Self::Decode(..) => Code::InvalidArgument,
            Self::Exists(_) => Code::AlreadyExists,
            Self::Unknown(_) => Code::NotFound,
            Self::Started(_) | Self::Busy(_) | Self::NoShare { .. } => Code::FailedPrecondition,
            Self::GuestEnded { .. } | Self::Io(..) => Code::Internal,
            Self::NotReady { .. } => Code::DeadlineExceeded,
            Self::Unimplemented(_) => Code::Unimplemented,
        }
    }

    /// The status, with the message and its causes.
    pub fn status(&self) -> Status {
        let mut message = self.to_string();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            message.push_str(": ");
            message.push_str(&s.to_string());
            source = s.source();
        }
        Status {
            code: self.code() as i32,
            message,
            details: Vec::new(),
        }
    }
}

/// Where one sandbox is.
#[derive(Debug)]
enum Phase {
    Created,
    Starting,
    Running(Arc<vm::Vm>),
}

#[derive(Debug)]
struct Sandbox {
    dir: PathBuf,
    agent_socket: PathBuf,
    phase: Phase,
}

/// The service: its sandboxes and their VMs.
#[derive(Debug)]
pub struct Service {
    config: Config,
    sandboxes: Mutex<HashMap<String, Sandbox>>,
    created: std::sync::atomic::AtomicU64,
}

/// One JSON line on stderr: `ts`, `event`, `sandbox_id` and the fields given.
pub fn log(event: &str, id: &str, fields: serde_json::Value) {
    let mut line = serde_json::json!({
        "ts": kata_topo_sinks::log::rfc3339(SystemTime::now()),
        "event": event,
        "sandbox_id": id,
    });
    if let (Some(line), serde_json::Value::Object(fields)) = (line.as_object_mut(), fields) {
        line.extend(fields);
    }
    eprintln!("{line}");
}

fn valid_id(id: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::NoId);
    }
    let plain = id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if plain {
        Ok(())
    } else {
        Err(Error::BadId(id.to_string()))
    }
}

impl Service {
    /// A service with no sandbox yet.
    pub fn new(config: Config) -> Self {
        Self {
            config,
            sandboxes: Mutex::new(HashMap::new()),
            created: std::sync::atomic::AtomicU64::new(0),
        }
    }

    fn sandboxes(&self) -> std::sync::MutexGuard<'_, HashMap<String, Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves `listener` until the process ends: a thread per connection.
    pub fn serve(self: &Arc<Self>, listener: UnixListener) {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let service = Arc::clone(self);
            let _ = std::thread::Builder::new()
                .name("connection".into())
                .spawn(move || service.connection(stream));
        }
    }

    /// Answers the requests of one connection until it closes.
    pub fn connection(&self, mut stream: UnixStream) {
        let caller = peer_pid(&stream);
        loop {
            let incoming = match Frame::read_or_skip(&mut stream) {
                Ok(Some(i)) => i,
                Ok(None) | Err(_) => return,
            };
            let (stream_id, response) = match incoming {
                Incoming::Frame(f) if f.kind == wire::TYPE_REQUEST => {
                    (f.stream_id, self.answer(&f.payload, caller))
                }
                Incoming::Frame(_) => continue,
                Incoming::Oversized { stream_id, len, .. } => (
                    stream_id,
                    Response {
                        status: Some(Incoming::oversized_status(len)),
                        payload: Vec::new(),
                    },
                ),
            };
            let frame = Frame {
                stream_id,
                kind: wire::TYPE_RESPONSE,
                flags: 0,
                payload: response.encode_to_vec(),
            };
            if frame.write(&mut stream).is_err() {
                return;
            }
        }
    }

    /// The response to one request's bytes; `caller` is the calling process (its mount
    /// namespace is where QEMU runs).
    pub fn answer(&self, request: &[u8], caller: Option<u32>) -> Response {
        let result = Request::decode(request)
            .map_err(|e| Error::Decode("ttrpc", e))
            .and_then(|r| self.call(&r, caller));
        match result {
            Ok(payload) => Response {
                status: None,
                payload,
            },
            Err(e) => Response {
                status: Some(e.status()),
                payload: Vec::new(),
            },
        }
    }

    fn call(&self, r: &Request, caller: Option<u32>) -> Result<Vec<u8>, Error> {
        if r.service != SERVICE {
            return Err(Error::Unimplemented(format!("{}/{}", r.service, r.method)));
        }
        let deadline = (r.timeout_nano > 0)
            .then(|| Instant::now() + Duration::from_nanos(r.timeout_nano.unsigned_abs()));
        let p = r.payload.as_slice();
        Ok(match r.method.as_str() {
            "CreateVM" => self
                .create_vm(CreateVmRequest::decode(p).map_err(|e| Error::Decode("CreateVM", e))?)?
                .encode_to_vec(),
            "StartVM" => self
                .start_vm(
                    StartVmRequest::decode(p).map_err(|e| Error::Decode("StartVM", e))?,
                    deadline,
                    caller,
                )?
                .encode_to_vec(),
            "StopVM" => self
                .stop_vm(StopVmRequest::decode(p).map_err(|e| Error::Decode("StopVM", e))?)?
                .encode_to_vec(),
            "Version" => {
                VersionRequest::decode(p).map_err(|e| Error::Decode("Version", e))?;
                VersionResponse {
                    version: format!("kata-topo-remote-hypervisor {}", env!("CARGO_PKG_VERSION")),
                }
                .encode_to_vec()
            }
            other => return Err(Error::Unimplemented(format!("{SERVICE}/{other}"))),
        })
    }

    /// Records the sandbox; answers where its agent will be.
    pub fn create_vm(&self, req: CreateVmRequest) -> Result<CreateVmResponse, Error> {
        valid_id(&req.id)?;
        let mut sandboxes = self.sandboxes();
        if sandboxes.contains_key(&req.id) {
            return Err(Error::Exists(req.id));
        }
        let n = 1 + self
            .created
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = self.config.state_dir.join(n.to_string());
        std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)))
            .map_err(|e| Error::Io(format!("creating {}", dir.display()), e))?;
        let agent_socket = dir.join("agent.sock");
        let mut annotations: Vec<_> = req.annotations.iter().collect();
        annotations.sort();
        log(
            "create-vm",
            &req.id,
            serde_json::json!({
                "agent_socket": agent_socket,
                "annotations": annotations.into_iter().collect::<std::collections::BTreeMap<_, _>>(),
                "network_namespace": req.network_namespace_path,
            }),
        );
        sandboxes.insert(
            req.id,
            Sandbox {
                dir,
                agent_socket: agent_socket.clone(),
                phase: Phase::Created,
            },
        );
        Ok(CreateVmResponse {
            agent_socket_path: agent_socket.to_string_lossy().into_owned(),
        })
    }

    /// Boots the sandbox's VM; returns once its agent answers through the relay.
    pub fn start_vm(
        &self,
        req: StartVmRequest,
        deadline: Option<Instant>,
        caller: Option<u32>,
    ) -> Result<StartVmResponse, Error> {
        valid_id(&req.id)?;
        let started = Instant::now();
        let (dir, agent_socket) = {
            let mut sandboxes = self.sandboxes();
            if let Some((other, _)) = sandboxes
                .iter()
                .find(|(id, s)| **id != req.id && !matches!(s.phase, Phase::Created))
            {
                return Err(Error::Busy(other.clone()));
            }
            let sandbox = sandboxes
                .get_mut(&req.id)
                .ok_or_else(|| Error::Unknown(req.id.clone()))?;
            if !matches!(sandbox.phase, Phase::Created) {
                return Err(Error::Started(req.id));
            }
            sandbox.phase = Phase::Starting;
            (sandbox.dir.clone(), sandbox.agent_socket.clone())
        };
        // Answer a little before the caller's deadline, so that it hears why.
        let bound = started + self.config.boot_timeout;
        let deadline = deadline
            .map(|d| d.checked_sub(Duration::from_secs(1)).unwrap_or(d))
            .map_or(bound, |d| d.min(bound));
        let result = self.boot(&req.id, &dir, &agent_socket, caller, deadline);
        let mut sandboxes = self.sandboxes();
        match result {
            Ok(vm) => {
                log(
                    "vm-ready",
                    &req.id,
                    serde_json::json!({
                        "seconds": started.elapsed().as_secs_f64(),
                        "qemu_pid": vm.pid(),
                        "agent_port": vm.agent_port(),
                    }),
                );
                if let Some(s) = sandboxes.get_mut(&req.id) {
                    s.phase = Phase::Running(vm);
                } else {
                    // Stopped meanwhile: the VM goes too.
                    drop(sandboxes);
                    vm.stop(self.config.stop_timeout);
                }
                Ok(StartVmResponse {})
            }
            Err(e) => {
                log(
                    "vm-failed",
                    &req.id,
                    serde_json::json!({"error": e.status().message}),
                );
                if let Some(s) = sandboxes.get_mut(&req.id) {
                    s.phase = Phase::Created;
                }
                Err(e)
            }
        }
    }

    fn boot(
        &self,
        id: &str,
        dir: &Path,
        agent_socket: &Path,
        caller: Option<u32>,
        deadline: Instant,
    ) -> Result<Arc<vm::Vm>, Error> {
        let share = self.config.shared_root.join(id).join("shared");
        // Seen from the caller's mount namespace, where QEMU will run.
        let seen = caller.map_or_else(
            || share.clone(),
            |pid| {
                Path::new(&format!("/proc/{pid}/root"))
                    .join(share.strip_prefix("/").unwrap_or(&share))
            },
        );
        if !seen.is_dir() {
            return Err(Error::NoShare {
                id: id.to_string(),
                path: share,
            });
        }
        let namespace = caller.and_then(vm::other_mount_namespace);
        log(
            "start-vm",
            id,
            serde_json::json!({
                "caller_pid": caller,
                "mount_namespace": namespace.as_ref().map(|n| n.display().to_string()),
                "share": share,
            }),
        );
        let vm = vm::Vm::boot(&vm::Boot {
            config: &self.config,
            id,
            dir,
            share: &share,
            namespace: namespace.as_deref(),
            agent_socket,
        })?;
        match vm.wait_for_agent(id, deadline) {
            Ok(()) => Ok(vm),
            Err(e) => {
                vm.kill();
                Err(e)
            }
        }
    }

    /// Powers the sandbox's VM off and forgets the sandbox.
    pub fn stop_vm(&self, req: StopVmRequest) -> Result<StopVmResponse, Error> {
        if req.id.is_empty() {
            // Kata's `delete` after its shim died sends this (its remote hypervisor restores
            // no sandbox id): say so, so that the log shows it.
            log(
                "stop-vm",
                "",
                serde_json::json!({"error": Error::NoId.to_string()}),
            );
            return Err(Error::NoId);
        }
        valid_id(&req.id)?;
        let sandbox = self
            .sandboxes()
            .remove(&req.id)
            .ok_or_else(|| Error::Unknown(req.id.clone()))?;
        self.forget(&req.id, sandbox, "StopVM");
        Ok(StopVmResponse {})
    }

    fn forget(&self, id: &str, sandbox: Sandbox, why: &str) {
        let ended = match &sandbox.phase {
            Phase::Running(vm) => Some(vm.stop(self.config.stop_timeout)),
            Phase::Created | Phase::Starting => None,
        };
        let _ = std::fs::remove_dir_all(&sandbox.dir);
        log(
            "stop-vm",
            id,
            serde_json::json!({"why": why, "guest": ended.map(|e| e.to_string())}),
        );
    }

    /// Stops every VM (the service is ending).
    pub fn stop_all(&self) {
        let all: Vec<(String, Sandbox)> = self.sandboxes().drain().collect();
        for (id, sandbox) in all {
            self.forget(&id, sandbox, "service stopping");
        }
    }
}

/// The pid of the process at the other end of a unix connection.
fn peer_pid(stream: &UnixStream) -> Option<u32> {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(stream, PeerCredentials)
        .ok()
        .and_then(|c| u32::try_from(c.pid()).ok())
        .filter(|p| *p > 0)
}

/// Binds the service's socket (root only), replacing a stale one.
pub fn listen(path: &Path) -> io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
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
}
