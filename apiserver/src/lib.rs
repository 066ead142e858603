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
mod tests;
