//! ttrpc at the frame level, and the few protobuf messages the wrapper reads or writes: what
//! the wrapper's proxy, its event publisher and its `start`/`delete` run on.
//!
//! The wrapper forwards frames, not decoded calls: a request's bytes, stream id, timeout and
//! metadata reach the delegate exactly as containerd sent them, and the delegate's response —
//! status code and message included — reaches containerd unchanged. Only `Create` and `Update`
//! payloads are decoded, to run the checks. This is the transparent shape a proxy needs; the
//! typed servers of the ttrpc crates would decode and re-encode every call.
//!
//! Frame: a 10-byte header (payload length u32 BE, stream id u32 BE, type u8, flags u8) and the
//! payload. Type 1 is a request (`Request`), 2 a response (`Response`), 3 stream data.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use prost::Message;

/// ttrpc's own limit on a message.
pub const MAX_FRAME: usize = 4 << 20;

/// Frame types.
pub const TYPE_REQUEST: u8 = 1;
/// A response frame.
pub const TYPE_RESPONSE: u8 = 2;

/// The task service names containerd speaks: v2 (containerd 1.6/1.7) and v3 (2.x).
pub const TASK_V2: &str = "containerd.task.v2.Task";
/// Task API v3.
pub const TASK_V3: &str = "containerd.task.v3.Task";

/// gRPC status codes used by the wrapper (and the integration tests' remote hypervisor
/// service, which answers Kata's shim on this framing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum Code {
    /// The request is malformed.
    InvalidArgument = 3,
    /// The request's deadline passed before it was done.
    DeadlineExceeded = 4,
    /// What the request names does not exist.
    NotFound = 5,
    /// What the request creates exists already.
    AlreadyExists = 6,
    /// A message over [`MAX_FRAME`].
    ResourceExhausted = 8,
    /// The system is not in a state that allows the request.
    FailedPrecondition = 9,
    /// The server has no such service or method.
    Unimplemented = 12,
    /// A failure of the server itself.
    Internal = 13,
    /// The delegate cannot be reached.
    Unavailable = 14,
}

/// One frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Stream id (odd, chosen by the client).
    pub stream_id: u32,
    /// Frame type.
    pub kind: u8,
    pub flags: u8,
    pub payload: Vec<u8>,
}

impl Frame {
    /// Reads one frame; `Ok(None)` on a clean end of stream between frames. A frame over
    /// [`MAX_FRAME`] is an error (a proxy that must go on uses [`Frame::read_or_skip`]).
    pub fn read(r: &mut impl Read) -> io::Result<Option<Self>> {
        match Self::read_or_skip(r)? {
            None => Ok(None),
            Some(Incoming::Frame(f)) => Ok(Some(f)),
            Some(Incoming::Oversized { len, .. }) => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("ttrpc frame of {len} bytes exceeds {MAX_FRAME}"),
            )),
        }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(10 + self.payload.len());
        out.extend_from_slice(&(self.payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&self.stream_id.to_be_bytes());
        out.push(self.kind);
        out.push(self.flags);
        out.extend_from_slice(&self.payload);
        out
    }

    /// Reads one frame like [`Frame::read`], except that a frame over [`MAX_FRAME`] is read
    /// past (its payload discarded without being held) and reported as [`Incoming::Oversized`]:
    /// the connection stays usable, as Go ttrpc keeps it.
    pub fn read_or_skip(r: &mut impl Read) -> io::Result<Option<Incoming>> {
        let mut header = [0u8; 10];
        let mut got = 0;
        while got < header.len() {
            match r.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Ok(None),
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let len = u32::from_be_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let stream_id = u32::from_be_bytes([header[4], header[5], header[6], header[7]]);
        let (kind, flags) = (header[8], header[9]);
        if len > MAX_FRAME {
            let skipped = io::copy(&mut r.take(len as u64), &mut io::sink())?;
            if skipped < len as u64 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(Some(Incoming::Oversized {
                stream_id,
                kind,
                len,
            }));
        }
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload)?;
        Ok(Some(Incoming::Frame(Self {
            stream_id,
            kind,
            flags,
            payload,
        })))
    }

    /// Writes the frame in one call.
    pub fn write(&self, w: &mut impl Write) -> io::Result<()> {
        w.write_all(&self.encode())
    }
}

/// What [`Frame::read_or_skip`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Incoming {
    Frame(Frame),
    /// A frame over [`MAX_FRAME`], read past.
    Oversized {
        stream_id: u32,
        /// Its type.
        kind: u8,
        len: usize,
    },
}

impl Incoming {
    /// The status Go ttrpc answers an oversized message with.
    pub fn oversized_status(len: usize) -> Status {
        Status {
            code: Code::ResourceExhausted as i32,
            message: format!("message length {len} exceed maximum message size of {MAX_FRAME}"),
            details: Vec::new(),
        }
    }
}

// The messages the frames carry, generated in this crate. A google.protobuf.StringValue is
// prost's `String` message.
pub use crate::containerd::services::events::ttrpc::v1::ForwardRequest;
pub use crate::containerd::task::v2::{
    ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse, DeleteRequest,
    KillRequest, ShutdownRequest, UpdateTaskRequest,
};
pub use crate::containerd::types::Envelope;
pub use crate::google::rpc::Status;
pub use crate::runtimeoptions::v1::Options as RuntimeOptions;
pub use crate::ttrpc::{KeyValue, Request, Response};
pub use prost_types::{Any, Timestamp};

/// A request frame's payload with its service renamed (v2 ↔ v3), every other byte kept.
pub fn rename_service(payload: &[u8], service: &str) -> Result<Vec<u8>, crate::WireError> {
    Request::with_service(payload, service)
}

/// Strips `unix://` from an address.
pub fn socket_path(address: &str) -> &str {
    address.strip_prefix("unix://").unwrap_or(address)
}

/// Connects to a unix socket, giving up at `deadline`. A listener whose backlog is full (or
/// that never accepts) makes a plain `connect()` block; a non-blocking connect answers
/// `EAGAIN` instead, and is tried again until the deadline.
pub fn connect_until(path: &str, deadline: Instant) -> io::Result<UnixStream> {
    use nix::errno::Errno;
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let addr = UnixAddr::new(path).map_err(io::Error::from)?;
    let fd = socket(
        AddressFamily::Unix,
        SockType::Stream,
        SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC,
        None,
    )
    .map_err(io::Error::from)?;
    loop {
        match connect(fd.as_raw_fd(), &addr) {
            Ok(()) => break,
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(Errno::EAGAIN) => {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{path} does not accept connections"),
                ))
            }
            Err(e) => return Err(e.into()),
        }
    }
    let stream = UnixStream::from(fd);
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// What is behind a unix socket path, as a connect within a time limit tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Probe {
    /// A listener accepted.
    Listening,
    /// Nothing listens: the connect was refused, or there is no such file.
    Nothing,
    /// Undecided: a listener too busy to accept in time (its backlog full), or another error
    /// (not a socket, no permission). Never treated as "nothing listens".
    Unknown,
}

/// Whether something listens on the unix socket at `path`, asking for at most `within`. The
/// one liveness probe of a socket: `start` (is the pod's daemon there?), `delete` (did the
/// wrapper crash?) and the clean-up of dead sockets use it.
pub fn probe(path: &str, within: Duration) -> Probe {
    match connect_until(path, Instant::now() + within) {
        Ok(_) => Probe::Listening,
        Err(e) => match e.kind() {
            io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound => Probe::Nothing,
            _ => Probe::Unknown,
        },
    }
}

/// The time left until `deadline`, or `TimedOut`.
fn remaining(deadline: Instant) -> io::Result<Duration> {
    deadline
        .checked_duration_since(Instant::now())
        .filter(|d| !d.is_zero())
        .ok_or_else(|| io::Error::from(io::ErrorKind::TimedOut))
}

/// A minimal blocking ttrpc client: one call at a time on one connection, every step bounded
/// by a deadline.
#[derive(Debug)]
pub struct Client {
    stream: UnixStream,
    next_id: u32,
}

impl Client {
    /// Connects to a `unix://` address or a socket path, giving up at `deadline`.
    pub fn connect(address: &str, deadline: Instant) -> io::Result<Self> {
        let stream = connect_until(socket_path(address), deadline)?;
        Ok(Self { stream, next_id: 1 })
    }

    /// Calls `service/method` with a message and returns the response; gives up at
    /// `deadline` (which is also the deadline the server is told).
    pub fn call(
        &mut self,
        service: &str,
        method: &str,
        payload: Vec<u8>,
        namespace: &str,
        deadline: Instant,
    ) -> io::Result<Response> {
        let id = self.next_id;
        self.next_id = self.next_id.wrapping_add(2);
        let request = Request {
            service: service.to_string(),
            method: method.to_string(),
            payload,
            timeout_nano: remaining(deadline)?.as_nanos().min(i64::MAX as u128) as i64,
            metadata: vec![KeyValue {
                key: "containerd-namespace-ttrpc".to_string(),
                value: namespace.to_string(),
            }],
        };
        self.stream.set_write_timeout(Some(remaining(deadline)?))?;
        Frame {
            stream_id: id,
            kind: TYPE_REQUEST,
            flags: 0,
            payload: request.encode_to_vec(),
        }
        .write(&mut self.stream)?;
        loop {
            // A reply to an earlier call that timed out may come first: skip it.
            self.stream.set_read_timeout(Some(remaining(deadline)?))?;
            let frame = Frame::read(&mut self.stream)?
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
            if frame.stream_id == id && frame.kind == TYPE_RESPONSE {
                return Response::decode(frame.payload.as_slice())
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e));
            }
        }
    }

    /// A client over an open connection whose next stream id is `next_id` (odd).
    pub fn from_stream(stream: UnixStream, next_id: u32) -> Self {
        Self { stream, next_id }
    }

    /// The connection, e.g. to wait on it for the peer's end.
    pub fn into_stream(self) -> UnixStream {
        self.stream
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_are_bounded() {
        let f = Frame {
            stream_id: 7,
            kind: TYPE_REQUEST,
            flags: 0,
            payload: b"hello".to_vec(),
        };
        let bytes = f.encode();
        assert_eq!(&bytes[..10], &[0, 0, 0, 5, 0, 0, 0, 7, 1, 0]);
        let back = Frame::read(&mut bytes.as_slice())
            .expect("read")
            .expect("frame");
        assert_eq!(back, f);
        assert_eq!(Frame::read(&mut [].as_slice()).expect("eof"), None);
        assert!(Frame::read(&mut bytes[..4].to_vec().as_slice()).is_err());
        let mut huge = bytes.clone();
        huge[..4].copy_from_slice(&((MAX_FRAME as u32) + 1).to_be_bytes());
        assert!(Frame::read(&mut huge.as_slice()).is_err());
    }

    #[test]
    fn a_probe_tells_listening_from_nothing_and_never_waits_on_a_full_backlog() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s");
        let p = path.to_str().expect("utf-8");
        assert_eq!(
            probe(p, Duration::from_millis(50)),
            Probe::Nothing,
            "no file"
        );
        // A listener with a backlog of one that never accepts: the backlog fills, then
        // connects would block.
        use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType};
        let listener = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::SOCK_CLOEXEC,
            None,
        )
        .expect("socket");
        bind(
            std::os::fd::AsRawFd::as_raw_fd(&listener),
            &nix::sys::socket::UnixAddr::new(&path).expect("address"),
        )
        .expect("bind");
        listen(&listener, Backlog::new(1).expect("backlog")).expect("listen");
        assert_eq!(probe(p, Duration::from_millis(50)), Probe::Listening);
        let mut held = Vec::new();
        let filled = (0..64).any(|_| match connect_until(p, Instant::now()) {
            Ok(s) => {
                held.push(s);
                false
            }
            Err(_) => true,
        });
        assert!(filled, "the backlog filled");
        assert_eq!(probe(p, Duration::from_millis(100)), Probe::Unknown, "busy");
        drop((held, listener));
        assert_eq!(
            probe(p, Duration::from_millis(50)),
            Probe::Nothing,
            "refused"
        );
        std::fs::write(dir.path().join("f"), b"").expect("file");
        let f = dir.path().join("f");
        assert_eq!(
            probe(f.to_str().expect("utf-8"), Duration::from_millis(50)),
            Probe::Nothing,
            "a plain file refuses connections"
        );
    }

    #[test]
    fn messages_decode_what_containerd_encodes() {
        let req = UpdateTaskRequest {
            id: "c1".into(),
            resources: Some(Any {
                type_url: "types.containerd.io/opencontainers/runtime-spec/1/LinuxResources".into(),
                value: br#"{"cpu":{"cpus":"0-1"}}"#.to_vec(),
            }),
            ..Default::default()
        };
        let back = UpdateTaskRequest::decode(req.encode_to_vec().as_slice()).expect("decode");
        assert_eq!(back, req);
        assert_eq!(socket_path("unix:///run/x.sock"), "/run/x.sock");
        assert_eq!(Response::default().code(), 0);
    }
}
