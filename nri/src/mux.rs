//! NRI's multiplexer: two ttrpc connections over the one socket to the runtime, as
//! `github.com/containerd/nri/pkg/net/multiplex` (v0.12.0) frames them.
//!
//! Each chunk on the trunk is an 8-byte header — the connection id (u32 big-endian) and the
//! payload's length (u32 big-endian) — and that many bytes of the connection's byte stream,
//! at most `10 + 4 MiB` (a ttrpc header and ttrpc's largest message). Connection 1 carries the
//! plugin's service (the runtime calls the plugin), connection 2 the runtime's (the plugin
//! calls `RegisterPlugin`); 0 is reserved and chunks for other ids are dropped, as the Go side
//! drops them. Each connection's bytes are ttrpc frames ([`kata_topo_proto::wire::Frame`]),
//! which a chunk need not align with: they are reassembled here.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Mutex;

use kata_topo_proto::wire::{Frame, MAX_FRAME};

/// The plugin's service: requests from the runtime.
pub const PLUGIN_CONN: u32 = 1;
/// The runtime's service: the plugin's requests.
pub const RUNTIME_CONN: u32 = 2;

/// The mux header's length.
const HEADER: usize = 8;
/// The largest chunk: a ttrpc frame header and ttrpc's largest message.
pub const MAX_CHUNK: usize = 10 + MAX_FRAME;

/// The writing half: one chunk per frame, written whole under a lock so that two writers
/// never interleave.
#[derive(Debug)]
pub struct Writer(Mutex<UnixStream>);

impl Writer {
    /// Writes on `stream`.
    pub fn new(stream: UnixStream) -> Self {
        Self(Mutex::new(stream))
    }

    /// Sends one ttrpc frame on connection `conn`.
    pub fn send(&self, conn: u32, frame: &Frame) -> io::Result<()> {
        let bytes = frame.encode();
        let mut out = Vec::with_capacity(bytes.len() + HEADER);
        for chunk in bytes.chunks(MAX_CHUNK) {
            out.extend_from_slice(&conn.to_be_bytes());
            out.extend_from_slice(&(chunk.len() as u32).to_be_bytes());
            out.extend_from_slice(chunk);
        }
        let mut stream = self.0.lock().unwrap_or_else(|e| e.into_inner());
        stream.write_all(&out)?;
        stream.flush()
    }
}

/// The reading half: frames as they complete, with the connection they came on.
#[derive(Debug)]
pub struct Reader<R> {
    trunk: R,
    pending: HashMap<u32, Vec<u8>>,
}

impl<R: Read> Reader<R> {
    /// Reads `trunk`.
    pub fn new(trunk: R) -> Self {
        Self {
            trunk,
            pending: HashMap::new(),
        }
    }

    /// The next complete frame; `Ok(None)` at a clean end of the trunk (between chunks). A
    /// chunk or frame over the limits, or a trunk cut inside a chunk, is an error: the
    /// connection cannot be trusted past it.
    pub fn next_frame(&mut self) -> io::Result<Option<(u32, Frame)>> {
        loop {
            for conn in [PLUGIN_CONN, RUNTIME_CONN] {
                if let Some(frame) = self.take_frame(conn)? {
                    return Ok(Some((conn, frame)));
                }
            }
            let mut header = [0u8; HEADER];
            if !read_full_or_eof(&mut self.trunk, &mut header)? {
                return Ok(None);
            }
            let conn = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
            let len = u32::from_be_bytes([header[4], header[5], header[6], header[7]]) as usize;
            if len > MAX_CHUNK {
                return Err(invalid(format!(
                    "NRI mux chunk of {len} bytes exceeds {MAX_CHUNK}"
                )));
            }
            let mut chunk = vec![0u8; len];
            self.trunk.read_exact(&mut chunk)?;
            if conn == PLUGIN_CONN || conn == RUNTIME_CONN {
                self.pending
                    .entry(conn)
                    .or_default()
                    .extend_from_slice(&chunk);
            }
        }
    }

    /// A complete ttrpc frame at the start of `conn`'s bytes, taken off them.
    fn take_frame(&mut self, conn: u32) -> io::Result<Option<Frame>> {
        let Some(buf) = self.pending.get_mut(&conn) else {
            return Ok(None);
        };
        if buf.len() < 10 {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if len > MAX_FRAME {
            return Err(invalid(format!(
                "ttrpc frame of {len} bytes on NRI connection {conn} exceeds {MAX_FRAME}"
            )));
        }
        if buf.len() < 10 + len {
            return Ok(None);
        }
        let rest = buf.split_off(10 + len);
        let whole = std::mem::replace(buf, rest);
        Frame::read(&mut whole.as_slice())
    }
}

/// Fills `buf`; `false` when the stream ended before its first byte.
fn read_full_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kata_topo_proto::wire::TYPE_REQUEST;

    fn frame(stream_id: u32, payload: &[u8]) -> Frame {
        Frame {
            stream_id,
            kind: TYPE_REQUEST,
            flags: 0,
            payload: payload.to_vec(),
        }
    }

    fn chunk(conn: u32, bytes: &[u8]) -> Vec<u8> {
        let mut out = conn.to_be_bytes().to_vec();
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(bytes);
        out
    }

    #[test]
    fn frames_split_across_chunks_and_interleaved_connections_are_reassembled() {
        let a = frame(1, b"plugin request").encode();
        let b = frame(3, b"runtime response").encode();
        let mut trunk = Vec::new();
        trunk.extend(chunk(PLUGIN_CONN, &a[..4]));
        trunk.extend(chunk(RUNTIME_CONN, &b));
        trunk.extend(chunk(7, b"ignored"));
        trunk.extend(chunk(PLUGIN_CONN, &a[4..]));
        let mut r = Reader::new(trunk.as_slice());
        let (conn, f) = r.next_frame().expect("read").expect("frame");
        assert_eq!(
            (conn, f.stream_id, f.payload.as_slice()),
            (RUNTIME_CONN, 3, &b"runtime response"[..])
        );
        let (conn, f) = r.next_frame().expect("read").expect("frame");
        assert_eq!(
            (conn, f.stream_id, f.payload.as_slice()),
            (PLUGIN_CONN, 1, &b"plugin request"[..])
        );
        assert!(r.next_frame().expect("clean end").is_none());
    }

    #[test]
    fn two_frames_in_one_chunk_are_both_read() {
        let mut bytes = frame(1, b"one").encode();
        bytes.extend(frame(3, b"two").encode());
        let trunk = chunk(PLUGIN_CONN, &bytes);
        let mut r = Reader::new(trunk.as_slice());
        assert_eq!(
            r.next_frame().expect("read").expect("frame").1.payload,
            b"one"
        );
        assert_eq!(
            r.next_frame().expect("read").expect("frame").1.payload,
            b"two"
        );
        assert!(r.next_frame().expect("end").is_none());
    }

    #[test]
    fn oversized_or_cut_input_is_an_error_not_a_panic() {
        let mut huge = PLUGIN_CONN.to_be_bytes().to_vec();
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(Reader::new(huge.as_slice()).next_frame().is_err());
        let mut big_frame = ((MAX_FRAME + 1) as u32).to_be_bytes().to_vec();
        big_frame.extend_from_slice(&[0; 6]);
        let trunk = chunk(PLUGIN_CONN, &big_frame);
        assert!(Reader::new(trunk.as_slice()).next_frame().is_err());
        let cut = &chunk(PLUGIN_CONN, b"0123456789")[..12];
        assert!(Reader::new(cut).next_frame().is_err());
        assert!(Reader::new(&[0u8, 0, 0][..]).next_frame().is_err());
    }

    #[test]
    fn written_frames_read_back() {
        let (a, b) = UnixStream::pair().expect("pair");
        let w = Writer::new(a);
        w.send(RUNTIME_CONN, &frame(1, b"register")).expect("send");
        drop(w);
        let mut r = Reader::new(b);
        let (conn, f) = r.next_frame().expect("read").expect("frame");
        assert_eq!(
            (conn, f.payload.as_slice()),
            (RUNTIME_CONN, &b"register"[..])
        );
        assert!(r.next_frame().expect("end").is_none());
    }
}
