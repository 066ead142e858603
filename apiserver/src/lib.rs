//! The node's own view from the Kubernetes API server: its Node's labels and its pods' node
//! affinity, what [`kata_topo_core::input::affinity`] checks after scheduling.
//!
//! Read with the kubelet's credentials (`kubeconfig`, default `/etc/kubernetes/kubelet.conf`):
//! the Node authorizer lets a node `get` its own Node object and the pods bound to it, and
//! nothing else, which is all this needs. Two GETs, `/api/v1/nodes/{node}` (asking for
//! `PartialObjectMetadata`: the labels without the Node's status and image list) and
//! `/api/v1/namespaces/{ns}/pods/{name}`. The writes — the pod's Events, as the kubelet
//! writes its own — are in [`events`], with the whole Pod object `kata-topo diagnose` reads.
//!
//! The transport is its own and small: HTTP/1.1 over rustls (ring's primitives) on a blocking
//! TCP socket, one connection per request, `Connection: close`, every step under one deadline
//! ([`http`]). Not kube-rs and k8s-openapi: they bring hyper, tower, an async runtime, the
//! generated types of every API group, and a watch machinery, for two GETs of a handful of
//! fields; not hyper over tonic's stack either: the wrapper's daemon runs on plain threads,
//! and a blocking exchange bounded by socket timeouts needs no runtime at all. No watch: a
//! request asks once, within `api_timeout_ms`, and the answer is checked at once; a cached
//! Node would need a long-lived connection per pod daemon (one per pod on the node) for a
//! value read a few times in a pod's life.
//!
//! Measured (release profile, stripped): with the client, its TLS stack and the wiring,
//! `containerd-shim-kata-topo-v2` is 5,144,184 bytes against 3,792,496 before (+1.29 MiB:
//! rustls, ring, webpki and serde_yaml for the kubeconfig). A process's proportional set size
//! grows by 524 KiB with its first read (the client's and the TLS stack's code paged in, the
//! allocator's arenas) and by 548 KiB after a hundred more: nothing stays allocated between
//! reads (`examples/pss.rs`). A node's read over TLS on the loopback takes 0.4 ms at the
//! median. `docs/kubernetes.md` ("Node affinity") has the details.

#![forbid(unsafe_code)]

pub mod events;
#[cfg(any(test, feature = "fake"))]
pub mod fake;
mod http;
pub mod installer;
pub mod kubeconfig;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_core::config::Config;
use kata_topo_core::input::affinity::{NodeLabels, PodPlacement};

pub use events::{EventType, PodEvent};
pub use http::MAX_ANSWER_BYTES;
pub use kubeconfig::Kubeconfig;

/// What the node's `[topology_guard]` says about the API server: whether the affinity check
/// reads it and the pod's Events are written to it.
#[derive(Debug, Clone)]
pub enum Setup {
    /// The check is off, and why (`kubeconfig = ""`, or no file at the path).
    Off(String),
    /// The check is on: the API server as the kubeconfig names it, for node `node`.
    On {
        /// The client.
        client: Box<ApiClient>,
        /// The node's name.
        node: String,
    },
    /// The check is on but its kubeconfig cannot be used: every request that would read says
    /// this.
    Broken(ApiError),
}

impl Setup {
    /// Whether the check runs at all (`Off` is the only way it does not).
    pub fn is_on(&self) -> bool {
        !matches!(self, Self::Off(_))
    }

    /// One line for `kata-topo status`.
    pub fn describe(&self) -> String {
        match self {
            Self::Off(why) => format!("off: {why}"),
            Self::On { client, node } => format!(
                "on: node {node}{}, API server {}, within {} ms",
                if client.node_name().as_deref() == Some(node.as_str()) {
                    " (its client certificate's)"
                } else {
                    ""
                },
                client.server(),
                client.timeout.as_millis()
            ),
            Self::Broken(e) => format!("on, but unusable: {e}"),
        }
    }
}

/// The affinity check as `config` sets it up: off without a kubeconfig, else a client of the
/// API server it names, for `node_name`; by default the node its client certificate names
/// (`system:node:<name>`, who the Node authorizer takes it for, right under the kubelet's
/// `--hostname-override` too), else this host's name, as the kubelet names its node.
pub fn setup(config: &Config) -> Setup {
    let Some(path) = config.kubeconfig.as_deref() else {
        return Setup::Off("kubeconfig is set to \"\" in [topology_guard]".into());
    };
    if std::fs::symlink_metadata(path).is_err() {
        return Setup::Off(format!("no kubeconfig at {}", path.display()));
    }
    let timeout = Duration::from_millis(config.api_timeout_ms);
    let client = match ApiClient::from_kubeconfig(path, timeout) {
        Ok(client) => client,
        Err(e) => return Setup::Broken(e),
    };
    let node = match (&config.node_name, client.node_name()) {
        (Some(n), _) => n.clone(),
        (None, Some(n)) => match check_name(&n, "the client certificate's node name") {
            Ok(()) => n,
            Err(e) => return Setup::Broken(e),
        },
        (None, None) => match host_name() {
            Ok(n) => n,
            Err(e) => return Setup::Broken(e),
        },
    };
    Setup::On {
        client: Box::new(client),
        node,
    }
}

/// This host's name as the kubelet names its node by default: the kernel's host name, in
/// lower case.
pub fn host_name() -> Result<String, ApiError> {
    let name = rustix::system::uname()
        .nodename()
        .to_string_lossy()
        .trim()
        .to_ascii_lowercase();
    check_name(&name, "the host name").map(|()| name)
}

/// What one request read: the node, and the pod when it was asked for.
#[derive(Debug)]
pub struct Reading {
    /// The node's labels.
    pub node: Result<NodeLabels, ApiError>,
    /// The pod's placement, when asked for.
    pub pod: Option<Result<PodPlacement, ApiError>>,
}

/// A client of the API server, each request bounded by its timeout.
///
/// Read from a kubeconfig file ([`ApiClient::from_kubeconfig`]), it follows the credentials'
/// rotation: before each request it `stat`s the kubeconfig and every file it names (no read,
/// no timer) and reads them all again when one is not the file read (the kubelet's new client
/// certificate behind `kubelet-client-current.pem`, a projected token renewed, a CA bundle
/// rewritten); after a 401 it reads them again whatever they look like, and asks once more,
/// within the same deadline, when they present other credentials. A kubeconfig that no longer
/// reads fails the request that found it so, naming why, and is read again at the next.
#[derive(Debug, Clone)]
pub struct ApiClient {
    /// The kubeconfig's path, when read from one: what is read again.
    path: Option<Arc<PathBuf>>,
    loaded: Arc<Mutex<Arc<Loaded>>>,
    timeout: Duration,
}

/// A kubeconfig read, and the TLS configuration of its credentials.
#[derive(Debug)]
struct Loaded {
    kubeconfig: Kubeconfig,
    tls: Arc<rustls::ClientConfig>,
}

impl ApiClient {
    /// A client of the API server the kubeconfig at `path` names, with its credentials,
    /// read again when they rotate.
    pub fn from_kubeconfig(path: &Path, timeout: Duration) -> Result<Self, ApiError> {
        let mut client = Self::new(Kubeconfig::read(path)?, timeout)?;
        client.path = Some(Arc::new(path.to_path_buf()));
        Ok(client)
    }

    /// A client from a kubeconfig read already (never read again).
    pub fn new(kubeconfig: Kubeconfig, timeout: Duration) -> Result<Self, ApiError> {
        Ok(Self {
            path: None,
            loaded: Arc::new(Mutex::new(Arc::new(Loaded::new(kubeconfig)?))),
            timeout,
        })
    }

    /// The API server, `host:port`.
    pub fn server(&self) -> String {
        let loaded = self.snapshot();
        let kc = &loaded.kubeconfig;
        if kc.host.contains(':') {
            format!("[{}]:{}", kc.host, kc.port)
        } else {
            format!("{}:{}", kc.host, kc.port)
        }
    }

    /// The node the client certificate names ([`Kubeconfig::node_name`]).
    pub fn node_name(&self) -> Option<String> {
        self.snapshot().kubeconfig.node_name()
    }

    fn snapshot(&self) -> Arc<Loaded> {
        Arc::clone(&self.loaded.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The credentials to use now: those read, unless a file they came from changed, when
    /// they are read again.
    fn current(&self) -> Result<Arc<Loaded>, ApiError> {
        let loaded = self.snapshot();
        match &self.path {
            Some(path) if loaded.kubeconfig.changed() => self.reload(path),
            _ => Ok(loaded),
        }
    }

    /// Reads the kubeconfig and its files again and keeps them.
    fn reload(&self, path: &Path) -> Result<Arc<Loaded>, ApiError> {
        let fresh = Arc::new(Loaded::new(Kubeconfig::read(path)?)?);
        *self.loaded.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&fresh);
        Ok(fresh)
    }
}

impl Loaded {
    fn new(kubeconfig: Kubeconfig) -> Result<Self, ApiError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in &kubeconfig.ca {
            roots
                .add(ca.clone())
                .map_err(|e| ApiError::Kubeconfig(format!("certificate authority: {e}")))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| ApiError::Tls(e.to_string()))?
            .with_root_certificates(roots);
        let tls = match &kubeconfig.client {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| ApiError::Kubeconfig(format!("client certificate: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        Ok(Self {
            kubeconfig,
            tls: Arc::new(tls),
        })
    }
}

impl ApiClient {
    /// The deadline of one request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Reads node `node`, and pod `namespace/name` when `pod` names it, both within one
    /// timeout from now.
    pub fn read(&self, node: &str, pod: Option<(&str, &str)>) -> Reading {
        let deadline = Instant::now() + self.timeout;
        let pod = pod.map(|(ns, name)| self.pod(ns, name, deadline));
        Reading {
            node: self.node(node, deadline),
            pod,
        }
    }

    /// The labels of node `name`.
    pub fn node(&self, name: &str, deadline: Instant) -> Result<NodeLabels, ApiError> {
        check_name(name, "the node name")?;
        let body = self.get(
            &format!("/api/v1/nodes/{name}"),
            "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1,application/json",
            deadline,
        )?;
        let node = NodeLabels::from_json(&body)
            .map_err(|e| ApiError::Garbage(format!("the node's answer: {e}")))?;
        if node.name != name {
            return Err(ApiError::Garbage(format!(
                "asked for node {name}, the answer is node {}",
                node.name
            )));
        }
        Ok(node)
    }

    /// The node affinity of pod `namespace/name`.
    pub fn pod(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<PodPlacement, ApiError> {
        check_name(namespace, "the pod's namespace")?;
        check_name(name, "the pod's name")?;
        let body = self.get(
            &format!("/api/v1/namespaces/{namespace}/pods/{name}"),
            "application/json",
            deadline,
        )?;
        let pod = PodPlacement::from_json(&body)
            .map_err(|e| ApiError::Garbage(format!("the pod's answer: {e}")))?;
        if pod.namespace.as_deref() != Some(namespace) || pod.name.as_deref() != Some(name) {
            return Err(ApiError::Garbage(format!(
                "asked for pod {namespace}/{name}, the answer is pod {}/{}",
                pod.namespace.as_deref().unwrap_or("-"),
                pod.name.as_deref().unwrap_or("-")
            )));
        }
        Ok(pod)
    }

    fn get(&self, path: &str, accept: &str, deadline: Instant) -> Result<Vec<u8>, ApiError> {
        self.send("GET", path, accept, None, deadline)
    }

    /// One request (a GET, or a write with a body) within `deadline`, with the credentials
    /// read again and the request sent once more after a 401.
    fn send(
        &self,
        method: &str,
        path: &str,
        accept: &str,
        body: Option<http::Body<'_>>,
        deadline: Instant,
    ) -> Result<Vec<u8>, ApiError> {
        let loaded = self.current()?;
        match self.send_as(&loaded, method, path, accept, body, deadline) {
            // Rotated or revoked credentials: read them again, and ask again with new ones.
            Err(e @ ApiError::Status { code: 401, .. }) => {
                let Some(file) = &self.path else {
                    return Err(e);
                };
                let fresh = self.reload(file)?;
                if fresh.kubeconfig.credentials_differ(&loaded.kubeconfig) {
                    self.send_as(&fresh, method, path, accept, body, deadline)
                } else {
                    Err(e)
                }
            }
            other => other,
        }
    }

    fn send_as(
        &self,
        loaded: &Loaded,
        method: &str,
        path: &str,
        accept: &str,
        body: Option<http::Body<'_>>,
        deadline: Instant,
    ) -> Result<Vec<u8>, ApiError> {
        let kc = &loaded.kubeconfig;
        let target = http::Target {
            host: &kc.host,
            port: kc.port,
            server_name: kc.server_name.as_deref().unwrap_or(&kc.host),
            tls: Arc::clone(&loaded.tls),
            token: kc.token.as_deref(),
        };
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        http::request(
            &target,
            method,
            &format!("{}{path}", kc.prefix),
            accept,
            body,
            deadline,
            ms,
        )
    }
}

/// A Kubernetes object name (a DNS subdomain: lower-case letters, digits, `-` and `.`, at
/// most 253 characters) — anything else never reaches a URL.
fn check_name(name: &str, what: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(ApiError::Name(format!(
            "{what} {:?} is not a Kubernetes object name",
            kata_topo_core::text::printable(name)
        )))
    }
}

/// Why the API server gave no answer to use. Each says why in words an operator acts on; the
/// request then goes on with a `node-labels-unavailable` warning.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApiError {
    /// The kubeconfig, or a file it names, cannot be used.
    #[error("the kubeconfig cannot be used: {0}")]
    Kubeconfig(String),
    /// A name that cannot be asked for.
    #[error("{0}")]
    Name(String),
    /// No answer within the deadline.
    #[error("the API server did not answer within {0} ms")]
    Timeout(u64),
    /// The connection could not be made or was closed.
    #[error("the API server refused or closed the connection: {0}")]
    Closed(String),
    /// The TLS handshake failed (a certificate not trusted, not TLS at all).
    #[error("TLS with the API server failed: {0}")]
    Tls(String),
    /// The API server answered with an error status (401, 403, 404, 500, ...).
    #[error("the API server answered {code}: {message}")]
    Status {
        /// The HTTP status.
        code: u16,
        /// The API server's message, shortened.
        message: String,
    },
    /// The answer is not what was asked for.
    #[error("the API server's answer is not usable: {0}")]
    Garbage(String),
    /// The answer is larger than [`MAX_ANSWER_BYTES`].
    #[error("the API server's answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge,
}

impl ApiError {
    /// A short stable word for the reason (log fields, tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Kubeconfig(_) => "kubeconfig",
            Self::Name(_) => "name",
            Self::Timeout(_) => "timeout",
            Self::Closed(_) => "closed",
            Self::Tls(_) => "tls",
            Self::Status { .. } => "status",
            Self::Garbage(_) | Self::TooLarge => "garbage",
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use super::*;
    use crate::fake::{FakeApiServer, Reply};

    const NODE: &str = r#"{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1",
  "metadata":{"name":"worker-1","uid":"n-1","labels":{"kata-topo.io/nic":"mlx5","zone":"a"}}}"#;

    const POD: &str = r#"{"kind":"Pod","apiVersion":"v1",
  "metadata":{"name":"web","namespace":"shop","uid":"p-1",
    "ownerReferences":[{"kind":"ReplicaSet","name":"web-5d8f","controller":true}]},
  "spec":{"nodeName":"worker-1","affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":
    {"nodeSelectorTerms":[{"matchExpressions":[{"key":"kata-topo.io/nic","operator":"In","values":["mlx5"]}]}]}}}}}"#;

    /// The timeout of these tests, and how much longer than it a failing read may take
    /// (a loaded test machine; the point is that it ends near the timeout, not at a hung
    /// server's leisure).
    const TIMEOUT: Duration = Duration::from_millis(1000);
    const SLACK: Duration = Duration::from_millis(1000);

    fn answering() -> FakeApiServer {
        FakeApiServer::start(|line| {
            if line.starts_with("GET /api/v1/nodes/worker-1 ") {
                Reply::Answer {
                    status: 200,
                    body: NODE.into(),
                    chunked: true,
                }
            } else if line.starts_with("GET /api/v1/namespaces/shop/pods/web ") {
                Reply::ok(POD)
            } else {
                Reply::status(404, "not found")
            }
        })
    }

    fn client(server: &FakeApiServer) -> ApiClient {
        ApiClient::from_kubeconfig(&server.kubeconfig(), TIMEOUT).expect("client")
    }

    /// Reads node worker-1 and pod shop/web from `server`; the result and how long it took.
    fn read(server: &FakeApiServer) -> (Reading, Duration) {
        let started = Instant::now();
        let r = client(server).read("worker-1", Some(("shop", "web")));
        (r, started.elapsed())
    }

    #[test]
    fn reads_the_node_and_the_pod() {
        let server = answering();
        let (r, _) = read(&server);
        let node = r.node.expect("node");
        assert_eq!(node.name, "worker-1");
        assert_eq!(node.labels.get("zone").map(String::as_str), Some("a"));
        let pod = r.pod.expect("asked").expect("pod");
        assert_eq!(pod.owner.as_ref().expect("owner").kind, "ReplicaSet");
        assert!(kata_topo_core::input::affinity::required_matches(
            &pod, &node
        ));
        // One connection per GET, each with the node's token.
        assert_eq!(
            server.requests(),
            [
                "GET /api/v1/namespaces/shop/pods/web HTTP/1.1",
                "GET /api/v1/nodes/worker-1 HTTP/1.1"
            ]
        );
        // Without the pod, one GET.
        let r = client(&server).read("worker-1", None);
        assert!(r.node.is_ok() && r.pod.is_none());
        assert_eq!(server.requests().len(), 3);
    }

    #[test]
    fn a_slow_server_within_the_timeout_answers() {
        let server = FakeApiServer::start(|_| {
            Reply::Slow(Duration::from_millis(50), Box::new(Reply::ok(NODE)))
        });
        let r = client(&server).read("worker-1", None);
        assert_eq!(r.node.expect("node").name, "worker-1");
    }

    /// Every way the API server can fail costs at most the timeout and says why.
    #[test]
    fn every_failure_costs_at_most_the_timeout_and_says_why() {
        let cases: Vec<(&str, Reply, &str)> = vec![
            (
                "slow",
                Reply::Slow(Duration::from_secs(5), Box::new(Reply::ok(NODE))),
                "timeout",
            ),
            ("hangs", Reply::Hang, "timeout"),
            (
                "trickles",
                Reply::Trickle(Duration::from_millis(40), Box::new(Reply::ok(NODE))),
                "timeout",
            ),
            ("closes", Reply::Close, "closed"),
            (
                "speaks garbage",
                Reply::Garbage(b"SSH-2.0-OpenSSH_9.2\r\n".to_vec()),
                "garbage",
            ),
            ("answers non-JSON", Reply::ok("<html>"), "garbage"),
            (
                "answers another node",
                Reply::ok(NODE.replace("worker-1", "worker-2")),
                "garbage",
            ),
            (
                "refuses 403",
                Reply::status(403, "nodes \"worker-1\" is forbidden"),
                "status",
            ),
            (
                "refuses 404",
                Reply::status(404, "nodes \"worker-1\" not found"),
                "status",
            ),
            (
                "refuses 500",
                Reply::status(500, "etcdserver: request timed out"),
                "status",
            ),
        ];
        for (what, reply, kind) in cases {
            let server = FakeApiServer::start(move |_| reply.clone());
            let started = Instant::now();
            let r = client(&server).read("worker-1", None);
            let took = started.elapsed();
            let e = r.node.expect_err(what);
            assert_eq!(e.kind(), kind, "{what}: {e}");
            assert!(took < TIMEOUT + SLACK, "{what} took {took:?}");
            assert!(!e.to_string().is_empty());
            if kind == "timeout" {
                assert!(took >= TIMEOUT, "{what} ended early: {took:?}");
                assert_eq!(
                    e.to_string(),
                    "the API server did not answer within 1000 ms"
                );
            }
        }
    }

    /// A peer that trickles any phase byte by byte — its TLS handshake, the TLS records of its
    /// answer, or the answer inside whole records — ends at the deadline, not at the peer's
    /// leisure (a minute of trickling at 40 ms a byte).
    #[test]
    fn a_peer_that_trickles_any_phase_ends_at_the_deadline() {
        let every = Duration::from_millis(40);
        let servers = [
            (
                "the handshake",
                FakeApiServer::start_trickling_handshake(every, |_| Reply::ok(NODE)),
            ),
            (
                "the answer's TLS records",
                FakeApiServer::start(move |_| {
                    Reply::TrickleRecords(every, Box::new(Reply::ok(NODE)))
                }),
            ),
            (
                "the answer",
                FakeApiServer::start(move |_| Reply::Trickle(every, Box::new(Reply::ok(NODE)))),
            ),
        ];
        for (what, server) in servers {
            let started = Instant::now();
            let e = client(&server).read("worker-1", None).node.expect_err(what);
            let took = started.elapsed();
            assert_eq!(e.kind(), "timeout", "{what}: {e}");
            assert!(took >= TIMEOUT, "{what} ended early: {took:?}");
            assert!(took < TIMEOUT + SLACK, "{what} took {took:?}");
        }
    }

    #[test]
    fn status_errors_carry_the_api_servers_message() {
        let server = FakeApiServer::start(|_| {
            Reply::status(403, "nodes \"worker-1\" is forbidden: User cannot get")
        });
        let e = client(&server)
            .read("worker-1", None)
            .node
            .expect_err("403");
        assert_eq!(
            e,
            ApiError::Status {
                code: 403,
                message: "nodes \"worker-1\" is forbidden: User cannot get".into()
            }
        );
        // A wrong token: 401.
        let other = server.dir().join("wrong.conf");
        server.write_kubeconfig(&other, "not-the-token");
        let e = ApiClient::from_kubeconfig(&other, TIMEOUT)
            .expect("client")
            .read("worker-1", None)
            .node
            .expect_err("401");
        assert!(matches!(e, ApiError::Status { code: 401, .. }), "{e}");
    }

    #[test]
    fn a_timeout_covers_both_reads_of_a_request() {
        let server = FakeApiServer::start(|_| {
            Reply::Slow(Duration::from_millis(600), Box::new(Reply::ok(POD)))
        });
        let started = Instant::now();
        let r = client(&server).read("worker-1", Some(("shop", "web")));
        let took = started.elapsed();
        // The pod came within the second; the node's read had only what was left.
        assert!(r.pod.expect("asked").is_ok());
        assert_eq!(r.node.expect_err("node").kind(), "timeout");
        assert!(took < TIMEOUT + SLACK, "{took:?}");
    }

    #[test]
    fn a_server_that_is_not_tls_or_not_there() {
        let server = answering();
        for (port, kind) in [
            (fake::not_tls(b"SSH-2.0-OpenSSH_9.2\r\n".to_vec()), "tls"),
            (fake::not_tls(Vec::new()), "closed"),
        ] {
            let path = server.dir().join(format!("port-{port}.conf"));
            let text = std::fs::read_to_string(server.kubeconfig())
                .expect("read")
                .replace(&format!(":{}", server.port()), &format!(":{port}"));
            fake::write_private(&path, &text);
            let started = Instant::now();
            let e = ApiClient::from_kubeconfig(&path, TIMEOUT)
                .expect("client")
                .read("worker-1", None)
                .node
                .expect_err("not TLS");
            assert_eq!(e.kind(), kind, "{e}");
            assert!(started.elapsed() < TIMEOUT + SLACK);
        }
        // Nothing listens: refused at once.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
            l.local_addr().expect("addr").port()
        };
        let path = server.dir().join("nothing.conf");
        let text = std::fs::read_to_string(server.kubeconfig())
            .expect("read")
            .replace(&format!(":{}", server.port()), &format!(":{port}"));
        fake::write_private(&path, &text);
        let e = ApiClient::from_kubeconfig(&path, TIMEOUT)
            .expect("client")
            .read("worker-1", None)
            .node
            .expect_err("refused");
        assert_eq!(e.kind(), "closed", "{e}");
    }

    #[test]
    fn a_server_certificate_of_another_ca_is_refused() {
        let server = answering();
        let other = answering();
        // The kubeconfig trusts `other`'s CA but points at `server`.
        let path = server.dir().join("other-ca.conf");
        let text = std::fs::read_to_string(other.kubeconfig())
            .expect("read")
            .replace(
                &format!(":{}", other.port()),
                &format!(":{}", server.port()),
            );
        fake::write_private(&path, &text);
        let e = ApiClient::from_kubeconfig(&path, TIMEOUT)
            .expect("client")
            .read("worker-1", None)
            .node
            .expect_err("untrusted");
        assert_eq!(e.kind(), "tls", "{e}");
        assert!(server.requests().is_empty());
    }

    #[test]
    fn names_that_are_not_kubernetes_names_never_reach_a_url() {
        let server = answering();
        for bad in ["../nodes", "Worker", "a b", "", "x?y=1", &"a".repeat(254)] {
            let e = client(&server).read(bad, None).node.expect_err(bad);
            assert_eq!(e.kind(), "name", "{bad}");
        }
        assert_eq!(server.connections(), 0);
    }

    #[test]
    fn kubeconfigs_that_cannot_be_trusted_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let server = answering();
        let dir = server.dir();
        // A link is not followed.
        let link = dir.join("link.conf");
        std::os::unix::fs::symlink(server.kubeconfig(), &link).expect("symlink");
        let e = ApiClient::from_kubeconfig(&link, TIMEOUT).expect_err("link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // Writable by the group.
        let open = dir.join("open.conf");
        std::fs::copy(server.kubeconfig(), &open).expect("copy");
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o660)).expect("chmod");
        let e = ApiClient::from_kubeconfig(&open, TIMEOUT).expect_err("group-writable");
        assert!(e.to_string().contains("written by others"), "{e}");
        // A client key file writable by others, named by a kubeconfig.
        let key = dir.join("client.key");
        std::fs::write(&key, "x").expect("write");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let with_key = dir.join("with-key.conf");
        let text = std::fs::read_to_string(server.kubeconfig())
            .expect("read")
            .replace(
                "    token:",
                "    client-certificate: client.key\n    client-key: client.key\n    token:",
            );
        fake::write_private(&with_key, &text);
        let e = ApiClient::from_kubeconfig(&with_key, TIMEOUT).expect_err("key");
        assert!(e.to_string().contains("client-certificate"), "{e}");
        assert!(e.to_string().contains("written by others"), "{e}");
    }

    #[test]
    fn kubeconfig_forms() {
        let dir = tempfile::tempdir().expect("tempdir");
        let server = answering();
        std::fs::write(dir.path().join("ca.crt"), server.ca_pem()).expect("ca");
        let token = dir.path().join("token");
        std::fs::write(&token, "abc\n").expect("token");
        let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: a\n  cluster:\n    server: https://127.0.0.1:{}\n    certificate-authority: ca.crt\n- name: b\n  cluster:\n    server: https://10.0.0.1\n    certificate-authority: ca.crt\nusers:\n- name: u\n  user:\n    tokenFile: {}\ncontexts:\n- name: one\n  context:\n    cluster: b\n    user: u\n- name: two\n  context:\n    cluster: a\n    user: u\ncurrent-context: two\npreferences: {{}}\n",
        server.port(),
        token.display()
    );
        let kc = Kubeconfig::parse(&text, dir.path()).expect("valid");
        assert_eq!((kc.host.as_str(), kc.port), ("127.0.0.1", server.port()));
        assert_eq!(kc.token.as_deref(), Some("abc"));
        assert_eq!(kc.ca.len(), 1);
        for (change, why) in [
            ("current-context: two", "current-context: three"),
            (
                "certificate-authority: ca.crt\n- name: b",
                "insecure-skip-tls-verify: true\n- name: b",
            ),
            ("https://127.0.0.1", "http://127.0.0.1"),
            ("tokenFile:", "exec: {command: x}\n    tokenFile:"),
        ] {
            let bad = text.replace(change, why);
            assert!(Kubeconfig::parse(&bad, dir.path()).is_err(), "{why}");
        }
    }

    #[test]
    fn setup_follows_the_configuration() {
        use kata_topo_core::config::Config;
        let server = answering();
        let off = setup(&Config {
            kubeconfig: None,
            ..Config::default()
        });
        assert!(!off.is_on());
        assert!(off.describe().starts_with("off:"), "{}", off.describe());
        let missing = setup(&Config {
            kubeconfig: Some(server.dir().join("none.conf")),
            ..Config::default()
        });
        assert!(
            missing.describe().contains("no kubeconfig at"),
            "{}",
            missing.describe()
        );
        let on = setup(&Config {
            kubeconfig: Some(server.kubeconfig()),
            node_name: Some("worker-1".into()),
            api_timeout_ms: 1000,
            ..Config::default()
        });
        let Setup::On { client, node } = &on else {
            panic!("{}", on.describe());
        };
        assert_eq!(node, "worker-1");
        assert_eq!(client.timeout(), TIMEOUT);
        let broken = setup(&Config {
            kubeconfig: Some(server.dir().to_path_buf()),
            ..Config::default()
        });
        assert!(
            matches!(broken, Setup::Broken(ApiError::Kubeconfig(_))),
            "{}",
            broken.describe()
        );
        // The default node name is the host's.
        assert_eq!(host_name().map(|n| n == n.to_ascii_lowercase()), Ok(true));
    }

    /// The fake's kubeconfig with `replace` applied to its text, written at `name` in its
    /// directory.
    fn kubeconfig_with(server: &FakeApiServer, name: &str, replace: &[(&str, &str)]) -> PathBuf {
        let mut text = std::fs::read_to_string(server.kubeconfig()).expect("read");
        for (from, to) in replace {
            assert!(text.contains(from), "{from}");
            text = text.replace(from, to);
        }
        let path = server.dir().join(name);
        fake::write_private(&path, &text);
        path
    }

    /// Replaces `path` by a new file (another inode) holding `text`, as a rotation renames a new
    /// file over the old one.
    fn rotate(path: &Path, text: &str) {
        let new = path.with_extension("new");
        fake::write_private(&new, text);
        std::fs::rename(&new, path).expect("rename");
    }

    #[test]
    fn a_rotated_token_file_is_read_again_by_its_identity() {
        let server = answering();
        let token = server.dir().join("token");
        fake::write_private(&token, fake::TOKEN);
        let path = kubeconfig_with(
            &server,
            "token-file.conf",
            &[(&format!("token: {}", fake::TOKEN), "tokenFile: token")],
        );
        let client = ApiClient::from_kubeconfig(&path, TIMEOUT).expect("client");
        assert!(client.read("worker-1", None).node.is_ok());
        // Revoked: the next request presents the new (wrong) token, and is refused.
        rotate(&token, "revoked-token");
        let e = client.read("worker-1", None).node.expect_err("revoked");
        assert!(matches!(e, ApiError::Status { code: 401, .. }), "{e}");
        // Renewed: read again, accepted; a clone shares what was read.
        rotate(&token, fake::TOKEN);
        assert!(client.clone().read("worker-1", None).node.is_ok());
        // Gone: the request says why, and the next one reads again.
        std::fs::remove_file(&token).expect("rm");
        let e = client.read("worker-1", None).node.expect_err("gone");
        assert_eq!(e.kind(), "kubeconfig", "{e}");
        assert!(e.to_string().contains("tokenFile"), "{e}");
        rotate(&token, fake::TOKEN);
        assert!(client.read("worker-1", None).node.is_ok());
    }

    #[test]
    fn a_401_reads_the_credentials_again_and_asks_once_more() {
        use std::os::unix::fs::OpenOptionsExt;
        let server = answering();
        let token = server.dir().join("token");
        // A token of the right length, but not the fake's.
        let stale: String = fake::TOKEN.chars().rev().collect();
        fake::write_private(&token, &stale);
        let then = std::fs::metadata(&token)
            .and_then(|m| m.modified())
            .expect("mtime");
        let path = kubeconfig_with(
            &server,
            "token-file.conf",
            &[(&format!("token: {}", fake::TOKEN), "tokenFile: token")],
        );
        let client = ApiClient::from_kubeconfig(&path, TIMEOUT).expect("client");
        let e = client.read("worker-1", None).node.expect_err("stale");
        assert!(matches!(e, ApiError::Status { code: 401, .. }), "{e}");
        // Rewritten in place with the same size and modification time: no stat can tell.
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .custom_flags(0)
            .open(&token)
            .expect("open");
        std::io::Write::write_all(&mut f, fake::TOKEN.as_bytes()).expect("write");
        f.set_modified(then).expect("mtime");
        drop(f);
        let before = server.requests().len();
        let r = client.read("worker-1", None);
        assert!(r.node.is_ok(), "{:?}", r.node);
        // The 401, then the same GET with the token read again.
        assert_eq!(server.requests().len(), before + 2);
        // Credentials that stay refused are asked with once: a 401 is not retried in a loop.
        let wrong = kubeconfig_with(&server, "wrong.conf", &[(fake::TOKEN, "wrong-token")]);
        let client = ApiClient::from_kubeconfig(&wrong, TIMEOUT).expect("client");
        let before = server.requests().len();
        assert!(client.read("worker-1", None).node.is_err());
        assert_eq!(server.requests().len(), before + 1);
    }

    /// A client certificate and its key, PEM, whose subject is `O=system:nodes, CN=cn`.
    fn client_certificate(cn: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "system:nodes");
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params.self_signed(&key).expect("certificate");
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn the_node_name_is_the_client_certificates() {
        use base64::Engine;
        use kata_topo_core::config::Config;
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let server = answering();
        let with_cert = |name: &str, cn: &str| {
            let (cert, key) = client_certificate(cn);
            let user = format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n    token:",
                b64(&cert),
                b64(&key)
            );
            kubeconfig_with(&server, name, &[("    token:", &user)])
        };
        let path = with_cert("node.conf", "system:node:worker-1");
        let kc = Kubeconfig::read(&path).expect("kubeconfig");
        assert_eq!(kc.node_name().as_deref(), Some("worker-1"));
        let on = setup(&Config {
            kubeconfig: Some(path.clone()),
            api_timeout_ms: 1000,
            ..Config::default()
        });
        let Setup::On { node, client } = &on else {
            panic!("{}", on.describe());
        };
        assert_eq!(node, "worker-1");
        assert!(
            on.describe().contains("client certificate"),
            "{}",
            on.describe()
        );
        assert!(client.read(node, None).node.is_ok());
        // node_name in [topology_guard] still wins.
        let Setup::On { node, .. } = setup(&Config {
            kubeconfig: Some(path),
            node_name: Some("worker-2".into()),
            ..Config::default()
        }) else {
            panic!("not on");
        };
        assert_eq!(node, "worker-2");
        // A certificate of another subject names no node: the host name stands.
        let other = with_cert("user.conf", "kubernetes-admin");
        assert_eq!(
            Kubeconfig::read(&other).expect("kubeconfig").node_name(),
            None
        );
        let Setup::On { node, .. } = setup(&Config {
            kubeconfig: Some(other),
            ..Config::default()
        }) else {
            panic!("not on");
        };
        assert_eq!(Ok(node), host_name());
    }

    #[test]
    fn tls_server_name_is_the_name_checked() {
        let server = answering();
        // `localhost` is not in the fake's certificate; 127.0.0.1 is.
        let by_name = kubeconfig_with(
            &server,
            "by-name.conf",
            &[("https://127.0.0.1:", "https://localhost:")],
        );
        let e = ApiClient::from_kubeconfig(&by_name, TIMEOUT)
            .expect("client")
            .read("worker-1", None)
            .node
            .expect_err("name mismatch");
        assert_eq!(e.kind(), "tls", "{e}");
        let named = kubeconfig_with(
            &server,
            "server-name.conf",
            &[(
                "server: https://127.0.0.1:",
                "tls-server-name: 127.0.0.1\n    server: https://localhost:",
            )],
        );
        let r = ApiClient::from_kubeconfig(&named, TIMEOUT)
            .expect("client")
            .read("worker-1", None);
        assert_eq!(r.node.expect("node").name, "worker-1");
    }

    #[test]
    fn basic_auth_and_impersonation_are_refused_by_name() {
        let server = answering();
        for (key, line) in [
            ("username", "username: admin"),
            ("password", "password: secret"),
            ("as", "as: system:admin"),
            ("as-uid", "as-uid: \"0\""),
            ("as-groups", "as-groups: [system:masters]"),
            ("as-user-extra", "as-user-extra: {reason: [x]}"),
        ] {
            let path = kubeconfig_with(
                &server,
                "refused.conf",
                &[("    token:", &format!("    {line}\n    token:"))],
            );
            let e = ApiClient::from_kubeconfig(&path, TIMEOUT).expect_err(key);
            assert!(
                e.to_string().contains(&format!("sets {key} (")),
                "{key}: {e}"
            );
        }
    }
}
