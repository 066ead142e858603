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
//! exchange (connect, HTTP/2 handshake, request, answer, and the answer's decoding) under one
//! timeout, and drops the runtime and the connection when it returns: nothing stays behind,
//! no thread is spawned, and a kubelet that accepts and never answers costs the deadline and
//! no more.
//!
//! What a `Get` answer may cost is bounded before it is decoded: at most [`MAX_GET_BYTES`]
//! (one pod's resources; the length prefix is refused as soon as it arrives), and at most
//! [`MAX_CONTAINERS`] containers, counted on the wire without decoding them. A hostile or
//! broken answer of two million empty containers in 4 MB cost a pod daemon 443 MB at its peak
//! and 8.8 s of decoding outside the deadline; it is refused now after reading its prefix.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;

use crate::{grpc, v1, KubeletError};

/// The kubelet's PodResources socket, under its root directory.
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";

/// The largest `Get` answer taken: one pod's resources. A pod of a hundred containers with
/// 256 exclusive CPUs each is about 50 KiB; a `List` of a node's pods may be gRPC's 4 MiB.
pub const MAX_GET_BYTES: usize = 256 * 1024;

/// The most containers a pod's answer is taken with (init, sidecar and app containers
/// together); a pod of more is said unusable rather than decoded.
pub const MAX_CONTAINERS: usize = 1024;

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
        let response = self.call(
            METHOD_GET,
            &request.encode_to_vec(),
            MAX_GET_BYTES,
            |answer| {
                let containers = count_containers(answer)?;
                if containers > MAX_CONTAINERS {
                    return Err(KubeletError::Garbage(format!(
                        "the answer lists {containers} containers, more than the \
                         {MAX_CONTAINERS} a pod is taken with"
                    )));
                }
                v1::GetPodResourcesResponse::decode(answer)
                    .map_err(|e| KubeletError::Garbage(format!("the answer does not decode: {e}")))
            },
        )?;
        response
            .pod_resources
            .ok_or_else(|| KubeletError::Garbage("the answer names no pod".into()))
    }

    /// `List`: every pod's resources.
    pub fn list(&self) -> Result<v1::ListPodResourcesResponse, KubeletError> {
        self.call(
            METHOD_LIST,
            &v1::ListPodResourcesRequest {}.encode_to_vec(),
            grpc::MAX_MESSAGE_BYTES,
            |answer| {
                v1::ListPodResourcesResponse::decode(answer)
                    .map_err(|e| KubeletError::Garbage(format!("the answer does not decode: {e}")))
            },
        )
    }

    /// Whether the socket is there at all (`intent_source = "auto"` asks the kubelet only
    /// then). A link counts as there: asking then says why it is refused.
    pub fn socket_exists(&self) -> bool {
        std::fs::symlink_metadata(&self.socket).is_ok()
    }

    /// One unary call whose answer (at most `limit` bytes) `decode` turns into `T`, all
    /// within the deadline: an answer decoded after it is as late as one that came after it.
    fn call<T>(
        &self,
        method: &str,
        request: &[u8],
        limit: usize,
        decode: impl FnOnce(&[u8]) -> Result<T, KubeletError>,
    ) -> Result<T, KubeletError> {
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
            let answer = grpc::unary(stream, method, request, limit).await?;
            let decoded = decode(&answer);
            drop(answer);
            decoded
        };
        let ms = u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX);
        let result = runtime.block_on(async move {
            tokio::time::timeout(remaining, exchange)
                .await
                .unwrap_or(Err(KubeletError::Timeout(ms)))
        });
        // Decoding is not cancelled by the timer: one that ends past the deadline is late.
        if result.is_ok() && started.elapsed() > self.timeout {
            return Err(KubeletError::Timeout(ms));
        }
        result
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

/// The containers a `GetPodResourcesResponse` lists, counted on the wire (field 1, the pod;
/// its field 3, each container) without decoding them; the message's framing is checked as
/// far as it is walked.
fn count_containers(answer: &[u8]) -> Result<usize, KubeletError> {
    let mut containers = 0;
    for field in Fields(answer) {
        let (number, payload) = field?;
        if number == 1 {
            for inner in Fields(payload.unwrap_or_default()) {
                if inner?.0 == 3 {
                    containers += 1;
                }
            }
        }
    }
    Ok(containers)
}

/// The fields of a protobuf message: each number with its payload when length-delimited.
struct Fields<'a>(&'a [u8]);

fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One field at the start of `b` (advanced past it): its number, and its payload when
/// length-delimited; `None` when the bytes are not a field.
fn field<'a>(b: &mut &'a [u8]) -> Option<(u64, Option<&'a [u8]>)> {
    let key = varint(b)?;
    let payload = match key & 7 {
        0 => {
            varint(b)?;
            None
        }
        1 => {
            *b = b.get(8..)?;
            None
        }
        5 => {
            *b = b.get(4..)?;
            None
        }
        2 => {
            let len = usize::try_from(varint(b)?).ok()?;
            let (payload, rest) = b.split_at_checked(len)?;
            *b = rest;
            Some(payload)
        }
        _ => return None,
    };
    Some((key >> 3, payload))
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u64, Option<&'a [u8]>), KubeletError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let mut b = self.0;
        match field(&mut b) {
            Some(f) => {
                self.0 = b;
                Some(Ok(f))
            }
            None => {
                self.0 = &[];
                Some(Err(KubeletError::Garbage(
                    "the answer is not a protobuf message".into(),
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests;
