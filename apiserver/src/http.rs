//! One HTTPS exchange (a GET, or a write with a JSON body), HTTP/1.1 over rustls on a blocking TCP socket, every step under one
//! deadline: the name lookup (on a helper thread, when the server is named rather than an
//! address), the connect, the TLS handshake, the request and each read of the answer. Every
//! read and write on the socket, the handshake's included, may wait only for what is left of
//! the deadline ([`Timed`]): a peer that trickles its handshake, its TLS records or its
//! answer byte by byte still ends at the deadline.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;

use crate::ApiError;

/// The largest answer read (headers and body): a Node's metadata is a few KiB, a Pod tens.
pub const MAX_ANSWER_BYTES: usize = 4 << 20;

/// What a GET needs: where, as whom, and with which TLS settings.
#[derive(Debug)]
pub(crate) struct Target<'a> {
    pub(crate) host: &'a str,
    pub(crate) port: u16,
    /// The name the server's certificate is checked against and sent as SNI: the host, or
    /// the kubeconfig's `tls-server-name`.
    pub(crate) server_name: &'a str,
    pub(crate) tls: Arc<rustls::ClientConfig>,
    pub(crate) token: Option<&'a str>,
}

/// The TCP stream under TLS: each read and each write waits at most for what is left of the
/// deadline, and none starts once it has passed. rustls reads and writes through this during
/// the handshake as after it, however many times it loops.
#[derive(Debug)]
struct Timed {
    tcp: TcpStream,
    deadline: Instant,
}

impl Timed {
    fn left(&self) -> std::io::Result<Duration> {
        let d = self.deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err(std::io::ErrorKind::TimedOut.into())
        } else {
            Ok(d)
        }
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tcp.set_read_timeout(Some(self.left()?))?;
        self.tcp.read(buf)
    }
}

impl Write for Timed {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tcp.set_write_timeout(Some(self.left()?))?;
        self.tcp.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

fn left(deadline: Instant, ms: u64) -> Result<Duration, ApiError> {
    let d = deadline.saturating_duration_since(Instant::now());
    if d.is_zero() {
        Err(ApiError::Timeout(ms))
    } else {
        Ok(d)
    }
}

/// Maps an I/O error at a blocking step to a timeout when the deadline passed.
fn io_err(e: std::io::Error, what: &str, deadline: Instant, ms: u64) -> ApiError {
    use std::io::ErrorKind::{TimedOut, WouldBlock};
    if matches!(e.kind(), TimedOut | WouldBlock) || Instant::now() >= deadline {
        ApiError::Timeout(ms)
    } else if e.kind() == std::io::ErrorKind::InvalidData {
        // rustls reports TLS failures (a certificate not trusted, a bad record) as InvalidData.
        ApiError::Tls(e.to_string())
    } else {
        ApiError::Closed(format!("{what}: {e}"))
    }
}

/// Every address of `host`, in the resolver's order.
fn resolve(host: &str, port: u16, deadline: Instant, ms: u64) -> Result<Vec<SocketAddr>, ApiError> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    // The system resolver has no timeout of its own: it runs on a thread of its own, which
    // ends by itself if it outlives the deadline.
    let (tx, rx) = std::sync::mpsc::channel();
    let name = format!("{host}:{port}");
    std::thread::Builder::new()
        .name("apiserver-resolve".into())
        .spawn(move || {
            let _ = tx.send(
                name.to_socket_addrs()
                    .map(|a| a.take(16).collect::<Vec<_>>()),
            );
        })
        .map_err(|e| ApiError::Closed(format!("cannot look the server's name up: {e}")))?;
    match rx.recv_timeout(left(deadline, ms)?) {
        Ok(Ok(addrs)) if !addrs.is_empty() => Ok(addrs),
        Ok(Ok(_)) => Err(ApiError::Closed(format!("{host} has no address"))),
        Ok(Err(e)) => Err(ApiError::Closed(format!("cannot look {host} up: {e}"))),
        Err(_) => Err(ApiError::Timeout(ms)),
    }
}

/// Connects to the first of `addrs` that answers, each in turn, as Go's dialer does: each
/// address gets an equal share of what is left of the deadline, so one that never answers
/// (a blackholed route) leaves time for the others; the last gets all that is left.
fn connect(addrs: &[SocketAddr], deadline: Instant, ms: u64) -> Result<TcpStream, ApiError> {
    let mut failed = Vec::new();
    for (i, addr) in addrs.iter().enumerate() {
        let share = left(deadline, ms)? / u32::try_from(addrs.len() - i).unwrap_or(u32::MAX);
        match TcpStream::connect_timeout(addr, share) {
            Ok(tcp) => return Ok(tcp),
            Err(e) if i + 1 == addrs.len() && failed.is_empty() => {
                return Err(io_err(
                    e,
                    &format!("cannot connect to {addr}"),
                    deadline,
                    ms,
                ))
            }
            Err(e) => failed.push(format!("{addr}: {e}")),
        }
    }
    if Instant::now() >= deadline {
        return Err(ApiError::Timeout(ms));
    }
    Err(ApiError::Closed(format!(
        "cannot connect to any address of the server ({})",
        failed.join("; ")
    )))
}

/// A request's body: its content type and bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Body<'a> {
    pub(crate) content_type: &'a str,
    pub(crate) bytes: &'a [u8],
}

/// Sends `method` on `path` (with its query) with `body`, if any (a POST or PATCH), and
/// returns the body of a 2xx answer; any other status is [`ApiError::Status`] with the API
/// server's message.
pub(crate) fn request(
    target: &Target<'_>,
    method: &str,
    path: &str,
    accept: &str,
    body: Option<Body<'_>>,
    deadline: Instant,
    ms: u64,
) -> Result<Vec<u8>, ApiError> {
    let addrs = resolve(target.host, target.port, deadline, ms)?;
    let tcp = connect(&addrs, deadline, ms)?;
    let _ = tcp.set_nodelay(true);
    let name = ServerName::try_from(target.server_name.to_string())
        .map_err(|e| ApiError::Kubeconfig(format!("server name {:?}: {e}", target.server_name)))?;
    let conn = rustls::ClientConnection::new(Arc::clone(&target.tls), name)
        .map_err(|e| ApiError::Tls(e.to_string()))?;
    let mut tls = rustls::StreamOwned::new(conn, Timed { tcp, deadline });
    while tls.conn.is_handshaking() {
        tls.conn
            .complete_io(&mut tls.sock)
            .map_err(|e| io_err(e, "the TLS handshake", deadline, ms))?;
    }
    let host_header = if target.host.contains(':') {
        format!("[{}]:{}", target.host, target.port)
    } else {
        format!("{}:{}", target.host, target.port)
    };
    let mut request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {host_header}\r\nAccept: {accept}\r\n\
         User-Agent: kata-topo/{}\r\nConnection: close\r\n",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(t) = target.token {
        request.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    if let Some(b) = &body {
        request.push_str(&format!(
            "Content-Type: {}\r\nContent-Length: {}\r\n",
            b.content_type,
            b.bytes.len()
        ));
    }
    request.push_str("\r\n");
    let mut request = request.into_bytes();
    if let Some(b) = &body {
        request.extend_from_slice(b.bytes);
    }
    tls.write_all(&request)
        .and_then(|()| tls.flush())
        .map_err(|e| io_err(e, "the request could not be sent", deadline, ms))?;
    let mut answer: Vec<u8> = Vec::with_capacity(16 << 10);
    let mut buf = [0u8; 16 << 10];
    loop {
        if let Some(body) = complete(&answer)? {
            return finish(&answer, body);
        }
        match tls.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if answer.len() + n > MAX_ANSWER_BYTES {
                    return Err(ApiError::TooLarge);
                }
                answer.extend_from_slice(&buf[..n]);
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            // A server that closes without TLS's close_notify: what came is judged below.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(io_err(e, "the answer could not be read", deadline, ms)),
        }
    }
    // The connection ended: an answer without a length ends here.
    match complete_at_eof(&answer)? {
        Some(body) => finish(&answer, body),
        None if answer.is_empty() => Err(ApiError::Closed(
            "the server closed the connection without answering".into(),
        )),
        None => Err(ApiError::Garbage(
            "the connection closed in the middle of the answer".into(),
        )),
    }
}

/// The parsed head of an answer.
struct Head {
    status: u16,
    /// Where the body starts.
    body_at: usize,
    length: Option<usize>,
    chunked: bool,
}

fn head(answer: &[u8]) -> Result<Option<Head>, ApiError> {
    let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") else {
        if answer.len() > 64 << 10 {
            return Err(ApiError::Garbage(
                "no end of headers in the first 64 KiB".into(),
            ));
        }
        if !answer.is_empty() && !b"HTTP/1.".starts_with(&answer[..answer.len().min(7)]) {
            return Err(garbage_start(answer));
        }
        return Ok(None);
    };
    let text = std::str::from_utf8(&answer[..end])
        .map_err(|_| ApiError::Garbage("the answer's headers are not text".into()))?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let mut parts = status_line.splitn(3, ' ');
    let (version, code) = (parts.next().unwrap_or_default(), parts.next());
    if !version.starts_with("HTTP/1.") {
        return Err(garbage_start(answer));
    }
    let status = code
        .and_then(|c| c.parse::<u16>().ok())
        .filter(|c| (100..600).contains(c))
        .ok_or_else(|| ApiError::Garbage(format!("status line {:?}", short(status_line))))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            return Err(ApiError::Garbage(format!("header line {:?}", short(line))));
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length =
                Some(value.parse::<usize>().map_err(|_| {
                    ApiError::Garbage(format!("Content-Length {:?}", short(value)))
                })?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.eq_ignore_ascii_case("chunked");
            if !chunked {
                return Err(ApiError::Garbage(format!(
                    "Transfer-Encoding {:?}",
                    short(value)
                )));
            }
        } else if name.eq_ignore_ascii_case("content-encoding")
            && !value.eq_ignore_ascii_case("identity")
        {
            return Err(ApiError::Garbage(format!(
                "Content-Encoding {:?}, which was not asked for",
                short(value)
            )));
        }
    }
    if length.is_some_and(|l| l > MAX_ANSWER_BYTES) {
        return Err(ApiError::TooLarge);
    }
    Ok(Some(Head {
        status,
        body_at: end + 4,
        length,
        chunked,
    }))
}

fn garbage_start(answer: &[u8]) -> ApiError {
    let start = String::from_utf8_lossy(&answer[..answer.len().min(40)]).into_owned();
    ApiError::Garbage(format!(
        "the answer is not HTTP: it starts {:?}",
        short(&start)
    ))
}

fn short(s: &str) -> String {
    let s: String = s.chars().take(80).collect();
    kata_topo_core::text::printable(&s).into_owned()
}

/// The body, once the whole answer is there.
fn complete(answer: &[u8]) -> Result<Option<Vec<u8>>, ApiError> {
    let Some(h) = head(answer)? else {
        return Ok(None);
    };
    let rest = &answer[h.body_at..];
    if h.chunked {
        return dechunk(rest);
    }
    match h.length {
        Some(l) if rest.len() >= l => Ok(Some(rest[..l].to_vec())),
        Some(_) => Ok(None),
        // No length: until the connection closes; a status without a body has none.
        None if h.status == 204 || h.status == 304 => Ok(Some(Vec::new())),
        None => Ok(None),
    }
}

fn complete_at_eof(answer: &[u8]) -> Result<Option<Vec<u8>>, ApiError> {
    if let Some(body) = complete(answer)? {
        return Ok(Some(body));
    }
    match head(answer)? {
        Some(h) if !h.chunked && h.length.is_none() => Ok(Some(answer[h.body_at..].to_vec())),
        _ => Ok(None),
    }
}

/// A chunked body, once its last chunk is there.
fn dechunk(mut rest: &[u8]) -> Result<Option<Vec<u8>>, ApiError> {
    let mut body = Vec::new();
    loop {
        let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") else {
            if rest.len() > 1024 {
                return Err(ApiError::Garbage("a chunk size line is too long".into()));
            }
            return Ok(None);
        };
        let line = std::str::from_utf8(&rest[..eol])
            .map_err(|_| ApiError::Garbage("a chunk size is not text".into()))?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| ApiError::Garbage(format!("chunk size {:?}", short(size_text))))?;
        if size > MAX_ANSWER_BYTES {
            return Err(ApiError::TooLarge);
        }
        let data = &rest[eol + 2..];
        if size == 0 {
            // The last chunk; trailers, if any, are not read.
            return Ok(Some(body));
        }
        if data.len() < size + 2 {
            return Ok(None);
        }
        if &data[size..size + 2] != b"\r\n" {
            return Err(ApiError::Garbage(
                "a chunk does not end where its size says".into(),
            ));
        }
        body.extend_from_slice(&data[..size]);
        rest = &data[size + 2..];
    }
}

fn finish(answer: &[u8], body: Vec<u8>) -> Result<Vec<u8>, ApiError> {
    let Some(h) = head(answer)? else {
        return Err(ApiError::Garbage("no answer".into()));
    };
    if (200..300).contains(&h.status) {
        return Ok(body);
    }
    // The API server's `Status` object says why.
    let message = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(short))
        .unwrap_or_else(|| short(&String::from_utf8_lossy(&body)));
    Err(ApiError::Status {
        code: h.status,
        message,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn lengths_chunks_and_eof() {
        let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
        assert_eq!(complete(ok).expect("valid"), Some(b"{}".to_vec()));
        assert_eq!(complete(&ok[..ok.len() - 1]).expect("valid"), None);
        let chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\n{\"a\r\n3;x=y\r\n\":1\r\n1\r\n}\r\n0\r\n\r\n";
        assert_eq!(
            complete(chunked).expect("valid"),
            Some(br#"{"a":1}"#.to_vec())
        );
        assert_eq!(complete(&chunked[..60]).expect("valid"), None);
        let until_eof = b"HTTP/1.0 200 OK\r\nContent-Type: x\r\n\r\n{\"k\":";
        assert_eq!(complete(until_eof).expect("valid"), None);
        assert_eq!(
            complete_at_eof(until_eof).expect("valid"),
            Some(b"{\"k\":".to_vec())
        );
        let json = br#"{"message":"nodes is forbidden"}"#;
        let mut status = format!(
            "HTTP/1.1 403 Forbidden\r\nContent-Length: {}\r\n\r\n",
            json.len()
        )
        .into_bytes();
        status.extend_from_slice(json);
        let body = complete(&status).expect("valid").expect("whole");
        assert_eq!(
            finish(&status, body).map_err(|e| e.to_string()),
            Err("the API server answered 403: nodes is forbidden".into())
        );
    }

    #[test]
    fn garbage_is_said() {
        for bad in [
            &b"SSH-2.0-OpenSSH\r\n"[..],
            b"HTTP/1.1 abc\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
        ] {
            assert!(
                matches!(complete(bad), Err(ApiError::Garbage(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let huge = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            MAX_ANSWER_BYTES + 1
        );
        assert!(matches!(complete(huge.as_bytes()), Err(ApiError::TooLarge)));
    }

    /// An address nothing listens on (bound, then closed).
    fn refused() -> SocketAddr {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.local_addr().expect("addr")
    }

    #[test]
    fn every_address_is_tried_within_the_deadline() {
        let listening = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let ok = listening.local_addr().expect("addr");
        let deadline = Instant::now() + Duration::from_secs(10);
        // The first refuses: the second is tried.
        let tcp = connect(&[refused(), refused(), ok], deadline, 10_000).expect("second");
        assert_eq!(tcp.peer_addr().expect("peer"), ok);
        // All refuse: each is named.
        let (a, b) = (refused(), refused());
        match connect(&[a, b], deadline, 10_000) {
            Err(ApiError::Closed(why)) => {
                assert!(
                    why.contains(&a.to_string()) && why.contains(&b.to_string()),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
        // One address: its own error, as before.
        assert!(matches!(
            connect(&[a], deadline, 10_000),
            Err(ApiError::Closed(_))
        ));
        // A deadline gone: nothing is tried.
        assert_eq!(
            connect(&[ok], Instant::now(), 7).map(|_| ()),
            Err(ApiError::Timeout(7))
        );
        // A name resolves to all its addresses.
        let all = resolve("localhost", 80, deadline, 10_000).expect("localhost");
        assert!(
            all.iter().all(|a| a.ip().is_loopback() && a.port() == 80),
            "{all:?}"
        );
    }

    proptest! {
        /// Whatever bytes come, judging them never panics.
        #[test]
        fn any_answer_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512),
                                   prefix in prop::sample::select(vec!["", "HTTP/1.1 200 OK\r\n", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"])) {
            let mut a = prefix.as_bytes().to_vec();
            a.extend(bytes);
            let _ = complete(&a);
            if let Ok(Some(body)) = complete_at_eof(&a) {
                let _ = finish(&a, body);
            }
        }
    }
}
