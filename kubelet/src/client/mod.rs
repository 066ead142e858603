//! The PodResources client: one question to the kubelet on its unix socket, answered within a
//! hard deadline or not at all.
//!
//! Before connecting, the socket path is looked at without following a link: a symbolic link,
//! anything but a socket, or a socket another user owns (not root, on a node, where kata-topo
//! runs as root as the kubelet does) is refused with the reason. Once
//! connected, the peer's credentials are checked against the same owner, so a socket swapped
//! between the look and the connect is refused too.
//!
//! Each call builds a current-thread Tokio runtime on the calling thread, runs the whole
//! exchange (connect, HTTP/2 handshake, request, answer) under one timeout, and drops the
//! runtime and the connection when it returns: nothing stays behind, no thread is spawned,
//! and a kubelet that accepts and never answers costs the deadline and no more.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;

use crate::{grpc, v1, KubeletError};

/// The kubelet's PodResources socket, under its root directory.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The service's methods (`package v1; service PodResourcesLister`).
const METHOD_LIST: &str = "/v1.PodResourcesLister/List";
const METHOD_GET: &str = "/v1.PodResourcesLister/Get";

/// Where the kubelet answers, and how long it may take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodResourcesClient {
    socket: PathBuf,
    timeout: Duration,
    owner: Option<u32>,
}

impl PodResourcesClient {
    /// A client of the socket at `socket`, each call bounded by `timeout`; the socket, and
    /// the process answering on it, must be of the user this process runs as: root, for the
    /// wrapper, the hook and the CLI on a node, as the kubelet is.
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
            owner: Some(rustix::process::geteuid().as_raw()),
        }
    }

    /// Trusts a socket (and a peer) of user `uid` instead of this process's user's, or of
    /// anyone with `None`.
    pub fn with_owner(mut self, uid: Option<u32>) -> Self {
        self.owner = uid;
        self
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// The deadline of one call.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// `Get`: one pod's resources, by namespace and name.
    pub fn get(&self, namespace: &str, name: &str) -> Result<v1::PodResources, KubeletError> {
        let request = v1::GetPodResourcesRequest {
            pod_name: name.to_string(),
            pod_namespace: namespace.to_string(),
        };
        let answer = self.call(METHOD_GET, &request.encode_to_vec())?;
        let response = v1::GetPodResourcesResponse::decode(&answer[..])
            .map_err(|e| KubeletError::Garbage(format!("the answer does not decode: {e}")))?;
        response
            .pod_resources
            .ok_or_else(|| KubeletError::Garbage("the answer names no pod".into()))
    }

    /// `List`: every pod's resources.
    pub fn list(&self) -> Result<v1::ListPodResourcesResponse, KubeletError> {
        let answer = self.call(METHOD_LIST, &v1::ListPodResourcesRequest {}.encode_to_vec())?;
        v1::ListPodResourcesResponse::decode(&answer[..])
            .map_err(|e| KubeletError::Garbage(format!("the answer does not decode: {e}")))
    }

    /// Whether the socket is there at all (`intent_source = "auto"` asks the kubelet only
    /// then). A link counts as there: asking then says why it is refused.
    pub fn socket_exists(&self) -> bool {
        std::fs::symlink_metadata(&self.socket).is_ok()
    }

    /// One unary call, within the deadline.
    fn call(&self, method: &str, request: &[u8]) -> Result<Vec<u8>, KubeletError> {
        let started = Instant::now();
        self.check_socket()?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .map_err(|e| KubeletError::Closed(format!("cannot start the client: {e}")))?;
        let remaining = self.timeout.saturating_sub(started.elapsed());
        let owner = self.owner;
        let socket = self.socket.clone();
        let exchange = async move {
            let stream = tokio::net::UnixStream::connect(&socket)
                .await
                .map_err(|e| KubeletError::Closed(format!("cannot connect: {e}")))?;
            if let Some(uid) = owner {
                let peer = stream.peer_cred().map_err(|e| {
                    KubeletError::Closed(format!("cannot read its credentials: {e}"))
                })?;
                if peer.uid() != uid {
                    return Err(KubeletError::Untrusted(format!(
                        "the process answering on it runs as uid {}, not {uid}",
                        peer.uid()
                    )));
                }
            }
            grpc::unary(stream, method, request).await
        };
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        runtime.block_on(async move {
            tokio::time::timeout(remaining, exchange)
                .await
                .unwrap_or(Err(KubeletError::Timeout(ms)))
        })
    }

    /// Refuses a path that is a symbolic link, not a socket, or not the owner's.
    fn check_socket(&self) -> Result<(), KubeletError> {
        let meta = std::fs::symlink_metadata(&self.socket).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                KubeletError::Missing
            } else {
                KubeletError::Closed(format!("cannot look at the socket: {e}"))
            }
        })?;
        let kind = meta.file_type();
        if kind.is_symlink() {
            return Err(KubeletError::Untrusted(
                "the socket path is a symbolic link, which is not followed".into(),
            ));
        }
        if !kind.is_socket() {
            return Err(KubeletError::Untrusted("the path is not a socket".into()));
        }
        match self.owner {
            Some(uid) if meta.uid() != uid => Err(KubeletError::Untrusted(format!(
                "the socket is owned by uid {}, not {uid}",
                meta.uid()
            ))),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests;
