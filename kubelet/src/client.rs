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
mod tests {
    //! The client against a fake kubelet on a unix socket in a temporary directory: one that
    //! answers (at once, or late), one that accepts and never answers, one that closes, one that
    //! speaks garbage, one that answers with a gRPC error.

    use std::os::unix::fs::MetadataExt;
    use std::time::{Duration, Instant};

    use prost::Message;

    use super::*;
    use crate::fake::{Behaviour, FakeKubelet};

    impl FakeKubelet {
        fn client(&self, timeout: Duration) -> PodResourcesClient {
            PodResourcesClient::new(self.socket(), timeout).with_owner(Some(own_uid()))
        }
    }

    fn own_uid() -> u32 {
        std::fs::metadata("/proc/self")
            .map(|m| m.uid())
            .expect("own uid")
    }

    /// The kubelet's answer to `Get` for a Guaranteed pod with one exclusive CPU, memory on node
    /// 1 and a VFIO device on node 1.
    fn guaranteed_pod() -> v1::PodResources {
        v1::PodResources {
            name: "guaranteed".into(),
            namespace: "default".into(),
            containers: vec![v1::ContainerResources {
                name: "app".into(),
                cpu_ids: vec![1],
                memory: vec![v1::ContainerMemory {
                    memory_type: "memory".into(),
                    size: 1 << 30,
                    topology: Some(v1::TopologyInfo {
                        nodes: vec![v1::NumaNode { id: 1 }],
                    }),
                }],
                devices: vec![v1::ContainerDevices {
                    resource_name: "kata-topo.io/vfio".into(),
                    device_ids: vec!["0000:81:00.0".into()],
                    topology: Some(v1::TopologyInfo {
                        nodes: vec![v1::NumaNode { id: 1 }],
                    }),
                }],
                dynamic_resources: Vec::new(),
            }],
        }
    }

    fn get_answer() -> Vec<u8> {
        v1::GetPodResourcesResponse {
            pod_resources: Some(guaranteed_pod()),
        }
        .encode_to_vec()
    }

    /// The deadline of the tests that expect it to run out.
    const TIMEOUT: Duration = Duration::from_millis(300);
    /// How late past its deadline a call may return: the runtime's wake-up and, on a loaded
    /// machine, the scheduler's. A call that waited for the slow kubelet instead would be later.
    const SLACK: Duration = Duration::from_secs(1);
    /// The deadline of the tests that expect an answer: generous, so a loaded machine's slow
    /// start of the fake kubelet is not taken for a timeout.
    const ANSWER_WITHIN: Duration = Duration::from_secs(10);

    #[test]
    fn gets_a_pod_from_a_kubelet_that_answers() {
        let kubelet = FakeKubelet::start(Behaviour::Answer(get_answer(), Duration::ZERO));
        let client = kubelet.client(ANSWER_WITHIN);
        let pod = client.get("default", "guaranteed").expect("answers");
        assert_eq!(pod, guaranteed_pod());
        // And again: nothing of the first call stays behind.
        assert_eq!(client.get("default", "guaranteed").expect("answers"), pod);
    }

    /// A `Get` answer no pod could have is refused whole, before its containers are decoded: a
    /// 4 MB answer of two million empty containers (which cost a pod daemon 443 MB decoded, and
    /// 209 MB kept), and a small one of more containers than a pod is taken with.
    #[test]
    fn an_answer_no_pod_could_have_is_refused_before_it_is_decoded() {
        // The answer's bytes as prost would encode them: pod `default/guaranteed` with `n`
        // empty containers (two bytes each), written without building them.
        let answer = |n: usize| {
            let varint = |mut v: usize, out: &mut Vec<u8>| loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    out.push(b);
                    break;
                }
                out.push(b | 0x80);
            };
            let mut pod = vec![0x0a, 10];
            pod.extend(b"guaranteed");
            pod.extend([0x12, 7]);
            pod.extend(b"default");
            pod.extend([0x1a, 0x00].repeat(n));
            let mut out = vec![0x0a];
            varint(pod.len(), &mut out);
            out.extend(pod);
            out
        };
        assert_eq!(
            v1::GetPodResourcesResponse::decode(&answer(3)[..])
                .expect("decodes")
                .pod_resources
                .expect("pod")
                .containers
                .len(),
            3
        );
        let huge = FakeKubelet::start(Behaviour::Answer(answer(2_000_000), Duration::ZERO));
        let e = huge
            .client(ANSWER_WITHIN)
            .get("default", "guaranteed")
            .expect_err("too large");
        assert!(matches!(e, KubeletError::TooLarge(_)), "{e}");
        assert!(e.to_string().contains(&MAX_GET_BYTES.to_string()), "{e}");
        let many = FakeKubelet::start(Behaviour::Answer(
            answer(MAX_CONTAINERS + 1),
            Duration::ZERO,
        ));
        let e = many
            .client(ANSWER_WITHIN)
            .get("default", "guaranteed")
            .expect_err("too many containers");
        assert!(e.to_string().contains("containers"), "{e}");
        let most = FakeKubelet::start(Behaviour::Answer(answer(MAX_CONTAINERS), Duration::ZERO));
        let pod = most
            .client(ANSWER_WITHIN)
            .get("default", "guaranteed")
            .expect("a pod of the most containers taken");
        assert_eq!(pod.containers.len(), MAX_CONTAINERS);
    }

    #[test]
    fn lists_pods() {
        let list = v1::ListPodResourcesResponse {
            pod_resources: vec![guaranteed_pod(), v1::PodResources::default()],
        };
        let kubelet = FakeKubelet::start(Behaviour::Answer(list.encode_to_vec(), Duration::ZERO));
        assert_eq!(kubelet.client(ANSWER_WITHIN).list().expect("answers"), list);
    }

    #[test]
    fn a_hung_kubelet_costs_the_deadline_and_no_more() {
        let kubelet = FakeKubelet::start(Behaviour::Hung);
        let started = Instant::now();
        let e = kubelet
            .client(TIMEOUT)
            .get("default", "p")
            .expect_err("no answer");
        let took = started.elapsed();
        assert_eq!(e, KubeletError::Timeout(300));
        assert!(took >= TIMEOUT && took < TIMEOUT + SLACK, "{took:?}");
    }

    #[test]
    fn a_slow_kubelet_is_a_timeout_and_a_prompt_one_an_answer() {
        let slow = FakeKubelet::start(Behaviour::Answer(get_answer(), TIMEOUT + SLACK * 3));
        let started = Instant::now();
        let e = slow
            .client(TIMEOUT)
            .get("default", "p")
            .expect_err("too late");
        assert_eq!(e.kind(), "timeout");
        assert!(
            started.elapsed() < TIMEOUT + SLACK,
            "{:?}",
            started.elapsed()
        );
        // One that answers in 50 ms is an answer.
        let prompt = FakeKubelet::start(Behaviour::Answer(get_answer(), Duration::from_millis(50)));
        assert!(prompt.client(ANSWER_WITHIN).get("default", "p").is_ok());
    }

    #[test]
    fn a_closed_connection_is_said_at_once() {
        let kubelet = FakeKubelet::start(Behaviour::Close);
        let started = Instant::now();
        let e = kubelet
            .client(ANSWER_WITHIN)
            .get("default", "p")
            .expect_err("closed");
        assert!(matches!(e.kind(), "closed" | "protocol"), "{e}");
        // Long before the deadline: the close is noticed, not waited out.
        assert!(
            started.elapsed() < ANSWER_WITHIN / 2,
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn a_garbage_speaking_socket_is_not_grpc() {
        let kubelet = FakeKubelet::start(Behaviour::Garbage);
        let e = kubelet
            .client(ANSWER_WITHIN)
            .get("default", "p")
            .expect_err("garbage");
        assert!(matches!(e.kind(), "protocol" | "closed"), "{e}");
        // An answer that is gRPC but not a PodResources message.
        let kubelet = FakeKubelet::start(Behaviour::Answer(vec![0xff; 7], Duration::ZERO));
        let e = kubelet
            .client(ANSWER_WITHIN)
            .get("default", "p")
            .expect_err("garbage");
        assert_eq!(e.kind(), "garbage", "{e}");
    }

    #[test]
    fn a_grpc_error_names_its_status() {
        let kubelet =
            FakeKubelet::start(Behaviour::Status(5, "pod p in namespace default not found"));
        let e = kubelet
            .client(ANSWER_WITHIN)
            .get("default", "p")
            .expect_err("not found");
        assert_eq!(
            e,
            KubeletError::Status {
                code: 5,
                message: "pod p in namespace default not found".into()
            }
        );
    }

    #[test]
    fn refuses_what_is_not_the_owners_socket() {
        let kubelet = FakeKubelet::start(Behaviour::Answer(get_answer(), Duration::ZERO));
        let socket = kubelet.dir().join("kubelet.sock");
        let other = PodResourcesClient::new(&socket, TIMEOUT).with_owner(Some(own_uid() + 1));
        let e = other.get("default", "p").expect_err("not the owner's");
        assert_eq!(e.kind(), "untrusted");
        assert!(e.to_string().contains("owned by uid"), "{e}");
        // A link to the real socket is not followed.
        let link = kubelet.dir().join("link.sock");
        std::os::unix::fs::symlink(&socket, &link).expect("symlink");
        let e = PodResourcesClient::new(&link, TIMEOUT)
            .with_owner(None)
            .get("default", "p")
            .expect_err("a link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A regular file is not a socket.
        let file = kubelet.dir().join("file");
        std::fs::write(&file, b"").expect("file");
        let e = PodResourcesClient::new(&file, TIMEOUT)
            .with_owner(None)
            .get("default", "p")
            .expect_err("a file");
        assert!(e.to_string().contains("not a socket"), "{e}");
        let missing = PodResourcesClient::new(kubelet.dir().join("none"), TIMEOUT);
        assert!(!missing.socket_exists());
        assert_eq!(missing.get("default", "p"), Err(KubeletError::Missing));
    }

    #[test]
    fn asking_gives_the_admission_or_why_not() {
        use kata_topo_core::input::kubelet::{KubeletView, TopologyScope};
        let kubelet = FakeKubelet::start(Behaviour::Answer(get_answer(), Duration::ZERO));
        let config = kubelet.dir().join("config.yaml");
        std::fs::write(
        &config,
        "cpuManagerPolicy: static\ntopologyManagerPolicy: single-numa-node\ntopologyManagerScope: pod\n",
    )
    .expect("config");
        let client = kubelet.client(ANSWER_WITHIN);
        match crate::ask(&client, &config, None, "default", "guaranteed") {
            KubeletView::Admitted { pod, settings } => {
                assert_eq!(settings.topology_manager_scope, TopologyScope::Pod);
                let app = pod.container("app").expect("app");
                assert_eq!(app.cpu_ids.to_string(), "1");
                assert_eq!(app.memory_nodes().to_string(), "1");
                assert_eq!(app.devices[0].numa_nodes.to_string(), "1");
            }
            other => panic!("{other:?}"),
        }
        // The answer is for another pod than asked: not used.
        assert!(matches!(
            crate::ask(&client, &config, None, "default", "other"),
            KubeletView::Unavailable { reason } if reason.contains("default/guaranteed")
        ));
        // Without the kubelet's configuration, no policy to apply: unavailable, saying so.
        assert!(matches!(
            crate::ask(&client, &kubelet.dir().join("none.yaml"), None, "default", "guaranteed"),
            KubeletView::Unavailable { reason } if reason.contains("configuration")
        ));
        // A drop-in over it sets the policy; one that leaves it unknowable says so.
        let drop_ins = kubelet.dir().join("kubelet.conf.d");
        std::fs::create_dir(&drop_ins).expect("mkdir");
        std::fs::write(
            drop_ins.join("10.conf"),
            "topologyManagerPolicy: restricted\n",
        )
        .expect("drop-in");
        match crate::ask(&client, &config, Some(&drop_ins), "default", "guaranteed") {
            KubeletView::Admitted { settings, .. } => {
                assert_eq!(
                    settings.topology_manager_policy,
                    kata_topo_core::Policy::Restricted
                );
            }
            other => panic!("{other:?}"),
        }
        std::fs::write(drop_ins.join("20.conf"), "topologyManagerPolicy: ~\n").expect("drop-in");
        assert!(matches!(
            crate::ask(&client, &config, Some(&drop_ins), "default", "guaranteed"),
            KubeletView::Unavailable { reason }
                if reason.contains("policy cannot be known") && reason.contains("20.conf")
        ));
        let hung = FakeKubelet::start(Behaviour::Hung);
        assert!(matches!(
            crate::ask(&hung.client(TIMEOUT), &config, None, "default", "guaranteed"),
            KubeletView::Unavailable { reason } if reason.contains("did not answer within 300 ms")
        ));
    }

    #[test]
    fn containers_are_counted_on_the_wire() {
        assert_eq!(count_containers(&get_answer()).expect("counts"), 1);
        assert_eq!(count_containers(&[]).expect("empty"), 0);
        // A length past the end, a varint that never ends, an unknown wire type.
        for bad in [&[0x0a, 0x05, 0x1a][..], &[0x0a, 0xff, 0xff], &[0x0b]] {
            assert!(
                matches!(count_containers(bad), Err(KubeletError::Garbage(_))),
                "{bad:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn counting_any_bytes_never_panics(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = count_containers(&bytes);
        }
    }
}
