//! A fake API server for tests: HTTPS on the loopback with a certificate of a CA made for
//! the test, a kubeconfig naming it, and answers a test chooses — right, slow, hung, closed,
//! garbage, or an error status.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// What the fake answers one request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// `status` with a JSON body (chunked when `chunked`).
    Answer {
        /// HTTP status.
        status: u16,
        /// The body.
        body: String,
        /// Sent with `Transfer-Encoding: chunked`, as the Go server sends large answers.
        chunked: bool,
    },
    /// Waits, then replies.
    Slow(Duration, Box<Reply>),
    /// Sends the reply one byte at a time, this long apart (each byte a TLS record of its
    /// own: the client sees whole records).
    Trickle(Duration, Box<Reply>),
    /// Sends the reply's TLS records one byte at a time on the wire, this long apart: no
    /// record is whole before its last byte.
    TrickleRecords(Duration, Box<Reply>),
    /// Reads the request and never answers.
    Hang,
    /// Reads the request and closes the connection without answering.
    Close,
    /// Answers these bytes inside TLS: not HTTP.
    Garbage(Vec<u8>),
}

impl Reply {
    /// 200 with `body`.
    pub fn ok(body: impl Into<String>) -> Self {
        Self::Answer {
            status: 200,
            body: body.into(),
            chunked: false,
        }
    }

    /// An error status with an API `Status` body.
    pub fn status(status: u16, message: &str) -> Self {
        Self::Answer {
            status,
            body: serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                "message": message, "code": status})
            .to_string(),
            chunked: false,
        }
    }
}

type Handler = dyn Fn(&str, &[u8]) -> Reply + Send + Sync;

/// One request the fake read: its request line, headers and body.
#[derive(Debug, Clone)]
pub struct Exchange {
    /// `POST /api/v1/... HTTP/1.1`.
    pub line: String,
    /// The headers, names in lower case.
    pub headers: Vec<(String, String)>,
    /// The body (as long as its `Content-Length`).
    pub body: Vec<u8>,
    /// When it was read.
    pub received: Instant,
    /// For a request answered with [`Reply::Hang`]: when the client gave up and closed the
    /// connection (seen within 20 ms).
    pub abandoned: Option<Instant>,
}

impl Exchange {
    /// The value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }
}

/// The TCP stream under the fake's TLS: writes go out one byte at a time, `every` apart, while
/// `trickling` is set.
struct Wire {
    tcp: TcpStream,
    every: Duration,
    trickling: bool,
    stop: Arc<AtomicBool>,
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.tcp.read(buf)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.trickling || buf.is_empty() {
            return self.tcp.write(buf);
        }
        if self.stop.load(Ordering::SeqCst) {
            return Err(std::io::Error::other("stopped"));
        }
        std::thread::sleep(self.every);
        self.tcp.write(&buf[..1])
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.tcp.flush()
    }
}

/// A running fake API server; stops when dropped.
pub struct FakeApiServer {
    dir: tempfile::TempDir,
    port: u16,
    stop: Arc<AtomicBool>,
    requests: Arc<Mutex<Vec<Exchange>>>,
    connections: Arc<AtomicUsize>,
    ca_pem: String,
}

impl std::fmt::Debug for FakeApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeApiServer")
            .field("port", &self.port)
            .finish()
    }
}

/// The token the fake's kubeconfig carries and the fake requires.
pub const TOKEN: &str = "kata-topo-test-token";

impl FakeApiServer {
    /// Starts a fake that answers each request (`GET /path` as its request line gives it)
    /// with what `handler` says; a request without the kubeconfig's token gets 401.
    pub fn start(handler: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_with(None, move |line, _| handler(line))
    }

    /// Starts a fake whose `handler` also sees each request's body (a write's JSON).
    pub fn start_with_bodies(
        handler: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::start_with(None, handler)
    }

    /// [`FakeApiServer::start`] whose TLS handshake (its ServerHello and certificate) goes out
    /// one byte at a time, `every` apart.
    pub fn start_trickling_handshake(
        every: Duration,
        handler: impl Fn(&str) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::start_with(Some(every), move |line, _| handler(line))
    }

    fn start_with(
        handshake_trickle: Option<Duration>,
        handler: impl Fn(&str, &[u8]) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let ca_key = rcgen::KeyPair::generate().expect("CA key");
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA");
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "kata-topo-test-ca");
        let ca = ca_params.self_signed(&ca_key).expect("CA certificate");
        let key = rcgen::KeyPair::generate().expect("server key");
        let params =
            rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("server params");
        let cert = params
            .signed_by(&key, &ca, &ca_key)
            .expect("server certificate");
        let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone()];
        let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = Arc::new(
            rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("versions")
                .with_no_client_auth()
                .with_single_cert(chain, key_der)
                .expect("server config"),
        );
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(AtomicUsize::new(0));
        let handler: Arc<Handler> = Arc::new(handler);
        {
            let (stop, requests, connections) = (
                Arc::clone(&stop),
                Arc::clone(&requests),
                Arc::clone(&connections),
            );
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    connections.fetch_add(1, Ordering::SeqCst);
                    let (config, handler, requests, stop) = (
                        Arc::clone(&config),
                        Arc::clone(&handler),
                        Arc::clone(&requests),
                        Arc::clone(&stop),
                    );
                    std::thread::spawn(move || {
                        serve(
                            stream,
                            config,
                            handshake_trickle,
                            &*handler,
                            &requests,
                            &stop,
                        )
                    });
                }
            });
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let server = Self {
            dir,
            port,
            stop,
            requests,
            connections,
            ca_pem: ca.pem(),
        };
        server.write_kubeconfig(&server.kubeconfig(), TOKEN);
        server
    }

    /// The kubeconfig naming this fake (0600, this user's).
    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubelet.conf")
    }

    /// The fake's directory (for other kubeconfigs a test writes).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Writes a kubeconfig naming this fake with `token` at `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) {
        use base64::Engine;
        let ca = base64::engine::general_purpose::STANDARD.encode(&self.ca_pem);
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: \
             https://127.0.0.1:{}\n    certificate-authority-data: {ca}\nusers:\n- name: node\n  \
             user:\n    token: {token}\ncontexts:\n- name: test\n  context: {{cluster: test, user: \
             node}}\ncurrent-context: test\n",
            self.port
        );
        write_private(path, &text);
    }

    /// The request lines served so far.
    pub fn requests(&self) -> Vec<String> {
        self.exchanges().into_iter().map(|e| e.line).collect()
    }

    /// The requests served so far, whole.
    pub fn exchanges(&self) -> Vec<Exchange> {
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

/// Writes `text` at `path`, mode 0600.
pub fn write_private(path: &Path, text: &str) {
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(path);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .expect("create");
    f.write_all(text.as_bytes()).expect("write");
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn serve(
    tcp: TcpStream,
    config: Arc<rustls::ServerConfig>,
    handshake_trickle: Option<Duration>,
    handler: &Handler,
    requests: &Mutex<Vec<Exchange>>,
    stop: &Arc<AtomicBool>,
) {
    if stop.load(Ordering::SeqCst) {
        return;
    }
    let _ = tcp.set_read_timeout(Some(Duration::from_secs(20)));
    let Ok(conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let wire = Wire {
        tcp,
        every: handshake_trickle.unwrap_or_default(),
        trickling: handshake_trickle.is_some(),
        stop: Arc::clone(stop),
    };
    let mut tls = rustls::StreamOwned::new(conn, wire);
    if handshake_trickle.is_some() {
        while tls.conn.is_handshaking() {
            if tls.conn.complete_io(&mut tls.sock).is_err() {
                return;
            }
        }
        tls.sock.trickling = false;
    }
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
    }
    let end = head
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(head.len(), |i| i + 4);
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let line = text.lines().next().unwrap_or_default().to_string();
    let headers: Vec<(String, String)> = text
        .lines()
        .skip(1)
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0)
        .min(16 << 20);
    let mut body = head[end..].to_vec();
    while body.len() < length {
        match tls.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
    }
    body.truncate(length);
    let index = {
        let mut all = requests.lock().unwrap_or_else(|e| e.into_inner());
        all.push(Exchange {
            line: line.clone(),
            headers,
            body: body.clone(),
            received: Instant::now(),
            abandoned: None,
        });
        all.len() - 1
    };
    let authorised = text
        .lines()
        .any(|l| l.eq_ignore_ascii_case(&format!("authorization: bearer {TOKEN}")));
    let reply = if authorised {
        handler(&line, &body)
    } else {
        Reply::status(401, "Unauthorized")
    };
    if matches!(reply, Reply::Hang) {
        // Held until the client gives up (or the fake stops): when it did is recorded.
        let _ = tls
            .sock
            .tcp
            .set_read_timeout(Some(Duration::from_millis(20)));
        while !stop.load(Ordering::SeqCst) {
            match tls.sock.tcp.peek(&mut buf) {
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                // Closed, or bytes (a TLS alert before closing), or an error: the client left.
                _ => break,
            }
        }
        if let Some(e) = requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(index)
        {
            e.abandoned = Some(Instant::now());
        }
        return;
    }
    reply_with(&mut tls, reply, stop);
}

fn reply_with(
    tls: &mut rustls::StreamOwned<rustls::ServerConnection, Wire>,
    reply: Reply,
    stop: &AtomicBool,
) {
    match reply {
        Reply::Answer { .. } | Reply::Garbage(_) => {
            let _ = tls.write_all(&bytes_of(&reply));
            let _ = tls.flush();
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
        Reply::Slow(d, then) => {
            std::thread::sleep(d);
            reply_with(tls, *then, stop);
        }
        Reply::Trickle(d, then) => {
            for b in bytes_of(&then) {
                if stop.load(Ordering::SeqCst)
                    || tls.write_all(&[b]).and_then(|()| tls.flush()).is_err()
                {
                    return;
                }
                std::thread::sleep(d);
            }
        }
        Reply::TrickleRecords(d, then) => {
            tls.sock.every = d;
            tls.sock.trickling = true;
            reply_with(tls, *then, stop);
        }
        Reply::Hang => {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Reply::Close => {}
    }
}

fn bytes_of(reply: &Reply) -> Vec<u8> {
    match reply {
        Reply::Answer {
            status,
            body,
            chunked,
        } => {
            let mut out = format!("HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n");
            if *chunked {
                out.push_str("Transfer-Encoding: chunked\r\n\r\n");
                for part in body.as_bytes().chunks(7) {
                    out.push_str(&format!("{:x}\r\n", part.len()));
                    out.push_str(&String::from_utf8_lossy(part));
                    out.push_str("\r\n");
                }
                out.push_str("0\r\n\r\n");
            } else {
                out.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
            }
            out.into_bytes()
        }
        Reply::Garbage(b) => b.clone(),
        _ => Vec::new(),
    }
}

/// A fake that answers on the bare TCP connection with `bytes` (not TLS at all), or closes at
/// once with empty bytes; returns its port. Runs until the process ends.
pub fn not_tls(bytes: Vec<u8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let _ = s.write_all(&bytes);
        }
    });
    port
}
