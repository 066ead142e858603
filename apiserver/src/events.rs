//! The node's writes to the API server: Kubernetes Events on a pod, as the kubelet writes its
//! own, and the whole Pod object for `kata-topo diagnose`.
//!
//! **The API group is the kubelet's.** The kubelet 1.36 records its events through client-go's
//! `tools/record` broadcaster into the core group (`cmd/kubelet/app/server.go`:
//! `record.NewBroadcaster`, `v1core.EventSinkImpl{Interface: EventClient.Events("")}`), so its
//! Events are `v1` `Event`s posted to `/api/v1/namespaces/{ns}/events`, a repeat of the same
//! event being a strategic merge patch of its `count`, `lastTimestamp` and `message`
//! (`tools/record/events_cache.go`). kata-topo's are the same objects, written the same way: the
//! legacy fields the kubelet fills (`firstTimestamp`, `lastTimestamp`, `count`, `source`) plus
//! `reportingComponent` and `reportingInstance`, no `eventTime` (which would make the API server
//! validate it as an `events.k8s.io` event). The Node authorizer lets a node create, patch and
//! update events in every namespace (its `NodeRules`), nothing more: a node cannot read an
//! event back, so a patch of an event the API server dropped (its TTL, an hour by default)
//! answers 404 and the event is created again, as the kubelet does.

use std::time::{Duration, Instant, SystemTime};

use serde_json::{json, Value};

use crate::{check_name, http, ApiClient, ApiError};

/// `reportingComponent` and `source.component` of every Event kata-topo writes (a contract).
pub const REPORTING_CONTROLLER: &str = "kata-topo";

/// The longest `message` written: the `note` limit of `events.k8s.io/v1`, which reads the same
/// objects (the core group itself enforces none for events without `eventTime`).
pub const MAX_MESSAGE_BYTES: usize = 1024;

/// `Normal` or `Warning`, the two types an Event has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Information.
    Normal,
    /// Something is wrong.
    Warning,
}

impl EventType {
    /// The API's word.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Normal => "Normal",
            Self::Warning => "Warning",
        }
    }
}

/// One Event on a pod, as it is written: created with `count` 1, patched with each later count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodEvent {
    /// The Event's own name (`<pod>.<hex nanoseconds>`, as the kubelet names its own).
    pub name: String,
    /// The pod's namespace, which is the Event's too.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid, when known.
    pub uid: Option<String>,
    /// `Normal` or `Warning`.
    pub kind: EventType,
    /// The reason (`NodeAffinityViolated`).
    pub reason: String,
    /// What happened, at most [`MAX_MESSAGE_BYTES`].
    pub message: String,
    /// The node (`source.host`, `reportingInstance`).
    pub node: String,
    /// When it was first seen.
    pub first: SystemTime,
    /// When it was last seen.
    pub last: SystemTime,
    /// How many times it was seen.
    pub count: u32,
}

impl PodEvent {
    /// An Event's name for pod `pod` at `at`: `<pod>.<hex nanoseconds since the epoch>`, the
    /// pod's name shortened when the whole would pass 253 characters.
    pub fn name_for(pod: &str, at: SystemTime) -> String {
        let nanos = at
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos();
        let suffix = format!(".{nanos:x}");
        let room = 253usize.saturating_sub(suffix.len());
        let mut head: String = pod.chars().take(room).collect();
        while head.ends_with(['.', '-']) {
            head.pop();
        }
        if head.is_empty() {
            head = REPORTING_CONTROLLER.to_string();
        }
        format!("{head}{suffix}")
    }

    /// `message` cut to [`MAX_MESSAGE_BYTES`] on a character boundary, ending in `…` when cut.
    pub fn bounded_message(message: &str) -> String {
        if message.len() <= MAX_MESSAGE_BYTES {
            return message.to_string();
        }
        let ellipsis = '…';
        let mut end = MAX_MESSAGE_BYTES - ellipsis.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}{ellipsis}", &message[..end])
    }

    /// The `v1` `Event` object to create.
    pub fn to_json(&self) -> Value {
        let mut involved = json!({
            "apiVersion": "v1", "kind": "Pod", "namespace": self.namespace, "name": self.pod,
        });
        if let Some(uid) = &self.uid {
            involved["uid"] = json!(uid);
        }
        json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "involvedObject": involved,
            "reason": self.reason,
            "message": self.message,
            "type": self.kind.as_str(),
            "source": {"component": REPORTING_CONTROLLER, "host": self.node},
            "firstTimestamp": timestamp(self.first),
            "lastTimestamp": timestamp(self.last),
            "count": self.count,
            "reportingComponent": REPORTING_CONTROLLER,
            "reportingInstance": self.node,
        })
    }

    /// The strategic merge patch of a repeat: what the kubelet's recorder patches.
    pub fn patch_json(&self) -> Value {
        json!({
            "count": self.count,
            "lastTimestamp": timestamp(self.last),
            "message": self.message,
        })
    }
}

/// A `metav1.Time`: RFC 3339 in UTC, to the second.
pub fn timestamp(t: SystemTime) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] =
        time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::from(t)
        .format(FORMAT)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

impl ApiClient {
    /// The same client with another deadline per request (writes off the request path may
    /// take longer than a request's reads).
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            timeout,
            ..self.clone()
        }
    }

    /// Creates `event` (`POST /api/v1/namespaces/{ns}/events`) before `deadline`.
    pub fn create_event(&self, event: &PodEvent, deadline: Instant) -> Result<(), ApiError> {
        check_name(&event.namespace, "the event's namespace")?;
        check_name(&event.name, "the event's name")?;
        let body = event.to_json().to_string();
        let answer = self.send(
            "POST",
            &format!("/api/v1/namespaces/{}/events", event.namespace),
            "application/json",
            Some(http::Body {
                content_type: "application/json",
                bytes: body.as_bytes(),
            }),
            deadline,
        )?;
        written(&answer, &event.name)
    }

    /// Patches the count of `event`, created before under its name, before `deadline`. An
    /// event the API server no longer has answers [`ApiError::Status`] 404.
    pub fn patch_event(&self, event: &PodEvent, deadline: Instant) -> Result<(), ApiError> {
        check_name(&event.namespace, "the event's namespace")?;
        check_name(&event.name, "the event's name")?;
        let body = event.patch_json().to_string();
        let answer = self.send(
            "PATCH",
            &format!(
                "/api/v1/namespaces/{}/events/{}",
                event.namespace, event.name
            ),
            "application/json",
            Some(http::Body {
                content_type: "application/strategic-merge-patch+json",
                bytes: body.as_bytes(),
            }),
            deadline,
        )?;
        written(&answer, &event.name)
    }

    /// The whole Pod object `namespace/name` (its spec and status), before `deadline`.
    pub fn pod_object(
        &self,
        namespace: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<Value, ApiError> {
        check_name(namespace, "the pod's namespace")?;
        check_name(name, "the pod's name")?;
        let body = self.get(
            &format!("/api/v1/namespaces/{namespace}/pods/{name}"),
            "application/json",
            deadline,
        )?;
        let pod: Value = serde_json::from_slice(&body)
            .map_err(|e| ApiError::Garbage(format!("the pod's answer: {e}")))?;
        let meta = &pod["metadata"];
        if meta["namespace"] != namespace || meta["name"] != name {
            return Err(ApiError::Garbage(format!(
                "asked for pod {namespace}/{name}, the answer is pod {}/{}",
                meta["namespace"].as_str().unwrap_or("-"),
                meta["name"].as_str().unwrap_or("-")
            )));
        }
        Ok(pod)
    }
}

/// Whether the API server's answer is the Event that was written.
fn written(answer: &[u8], name: &str) -> Result<(), ApiError> {
    let v: Value = serde_json::from_slice(answer)
        .map_err(|e| ApiError::Garbage(format!("the event's answer: {e}")))?;
    match v["metadata"]["name"].as_str() {
        Some(n) if n == name => Ok(()),
        other => Err(ApiError::Garbage(format!(
            "wrote event {name}, the answer is event {}",
            other.unwrap_or("-")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeApiServer, Reply};

    fn event(count: u32) -> PodEvent {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        PodEvent {
            name: PodEvent::name_for("kt-affinity", at),
            namespace: "default".into(),
            pod: "kt-affinity".into(),
            uid: Some("u-1".into()),
            kind: EventType::Warning,
            reason: "NodeAffinityViolated".into(),
            message: "refused the recreate of container app: …".into(),
            node: "worker-1".into(),
            first: at,
            last: at + Duration::from_secs(count.into()),
            count,
        }
    }

    /// What the fake answers a write: the Event back, named as the request's path or body
    /// says.
    fn echo(line: &str, body: &[u8]) -> Reply {
        let name = match line
            .split(' ')
            .nth(1)
            .and_then(|p| p.rsplit_once("/events/"))
        {
            Some((_, name)) => name.to_string(),
            None => serde_json::from_slice::<Value>(body)
                .ok()
                .and_then(|v| v["metadata"]["name"].as_str().map(str::to_string))
                .unwrap_or_default(),
        };
        Reply::Answer {
            status: if line.starts_with("POST") { 201 } else { 200 },
            body: json!({"kind": "Event", "metadata": {"name": name}}).to_string(),
            chunked: false,
        }
    }

    fn client(fake: &FakeApiServer) -> ApiClient {
        ApiClient::from_kubeconfig(&fake.kubeconfig(), Duration::from_secs(5)).expect("client")
    }

    #[test]
    fn an_event_is_posted_as_the_kubelet_posts_its_own_and_a_repeat_patches_its_count() {
        let fake = FakeApiServer::start_with_bodies(echo);
        let c = client(&fake);
        let first = event(1);
        c.create_event(&first, Instant::now() + Duration::from_secs(10))
            .expect("created");
        c.patch_event(&event(2), Instant::now() + Duration::from_secs(10))
            .expect("patched");
        let seen = fake.exchanges();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert_eq!(
            seen[0].line,
            "POST /api/v1/namespaces/default/events HTTP/1.1"
        );
        assert_eq!(
            seen[0].header("content-type").as_deref(),
            Some("application/json")
        );
        let posted: Value = serde_json::from_slice(&seen[0].body).expect("JSON");
        assert_eq!(
            posted,
            json!({
                "apiVersion": "v1", "kind": "Event",
                "metadata": {"name": "kt-affinity.18d75b8423f30000", "namespace": "default"},
                "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": "default",
                                   "name": "kt-affinity", "uid": "u-1"},
                "reason": "NodeAffinityViolated",
                "message": "refused the recreate of container app: …",
                "type": "Warning",
                "source": {"component": "kata-topo", "host": "worker-1"},
                "firstTimestamp": "2026-09-21T14:13:20Z", "lastTimestamp": "2026-09-21T14:13:21Z",
                "count": 1,
                "reportingComponent": "kata-topo", "reportingInstance": "worker-1",
            })
        );
        assert_eq!(
            seen[1].line,
            "PATCH /api/v1/namespaces/default/events/kt-affinity.18d75b8423f30000 HTTP/1.1"
        );
        assert_eq!(
            seen[1].header("content-type").as_deref(),
            Some("application/strategic-merge-patch+json")
        );
        let patch: Value = serde_json::from_slice(&seen[1].body).expect("JSON");
        assert_eq!(
            patch,
            json!({"count": 2, "lastTimestamp": "2026-09-21T14:13:22Z",
                   "message": "refused the recreate of container app: …"})
        );
    }

    #[test]
    fn refusals_and_a_hung_server_are_errors_within_the_deadline() {
        let fake = FakeApiServer::start_with_bodies(|line, _| {
            if line.starts_with("PATCH") {
                Reply::status(404, "events \"x\" not found")
            } else if line.contains("/namespaces/hung/") {
                Reply::Hang
            } else {
                Reply::status(403, "events is forbidden")
            }
        });
        let c = client(&fake).with_timeout(Duration::from_millis(300));
        let e = c
            .create_event(&event(1), Instant::now() + Duration::from_secs(10))
            .expect_err("refused");
        assert_eq!(
            e.to_string(),
            "the API server answered 403: events is forbidden"
        );
        assert!(matches!(
            c.patch_event(&event(2), Instant::now() + Duration::from_secs(10)),
            Err(ApiError::Status { code: 404, .. })
        ));
        let hung = PodEvent {
            namespace: "hung".into(),
            ..event(1)
        };
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(c.create_event(&hung, Instant::now() + Duration::from_millis(300)));
        });
        // A hang guard, not a timing: the write gives up at its deadline.
        let r = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("the write gave up");
        assert!(matches!(r, Err(ApiError::Timeout(_))), "{r:?}");
    }

    #[test]
    fn names_and_messages_stay_within_the_apis_limits() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(0x1234);
        assert_eq!(PodEvent::name_for("web-0", at), "web-0.1234");
        let long = format!("{}-x", "a".repeat(250));
        let name = PodEvent::name_for(&long, at);
        assert_eq!(name.len(), 253, "{name}");
        assert!(name.ends_with("a.1234"));
        assert!(check_name(&name, "n").is_ok());
        // A cut that would end in a dash loses it.
        let dashed = format!("{}-{}", "a".repeat(247), "b".repeat(10));
        let n = PodEvent::name_for(&dashed, at);
        assert!(
            n.len() <= 253 && !n.contains("-.") && check_name(&n, "n").is_ok(),
            "{n}"
        );
        assert_eq!(PodEvent::bounded_message("short"), "short");
        let cut = PodEvent::bounded_message(&"é".repeat(2000));
        assert!(
            cut.len() <= MAX_MESSAGE_BYTES && cut.ends_with('…'),
            "{}",
            cut.len()
        );
        assert_eq!(timestamp(SystemTime::UNIX_EPOCH), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn a_pod_object_is_the_pod_asked_for() {
        let fake = FakeApiServer::start(|line| {
            if line.contains("/pods/web-0 ") {
                Reply::ok(
                    r#"{"kind":"Pod","metadata":{"namespace":"default","name":"web-0"},"status":{"phase":"Running"}}"#,
                )
            } else {
                Reply::ok(r#"{"kind":"Pod","metadata":{"namespace":"default","name":"other"}}"#)
            }
        });
        let c = client(&fake);
        let deadline = || Instant::now() + Duration::from_secs(10);
        let pod = c.pod_object("default", "web-0", deadline()).expect("pod");
        assert_eq!(pod["status"]["phase"], "Running");
        let e = c
            .pod_object("default", "web-1", deadline())
            .expect_err("another pod");
        assert!(
            e.to_string().contains("the answer is pod default/other"),
            "{e}"
        );
        assert!(c.pod_object("default", "Web_1", deadline()).is_err());
    }
}
