//! What kata-topo's installer asks of the API server, with its pod's ServiceAccount: its own
//! Node (the container runtime's version; labels set and removed with a JSON merge patch), a
//! `Warning` event about that Node when it refuses, and whether its DaemonSet is going away.
//! The same transport as every other request of this crate: one HTTPS exchange per request
//! under one deadline.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::{check_name, http, ApiClient, ApiError, Kubeconfig};

/// Where a pod's ServiceAccount credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A client with a pod's own credentials, as client-go's in-cluster configuration builds it:
/// the API server at `host`:`port` (the pod's `KUBERNETES_SERVICE_HOST` and `_PORT`), the CA
/// `ca.crt` and the token `token` in `dir` (the projected ServiceAccount volume). The files
/// are read as a kubeconfig's are (root's, writable by nobody else; the volume's links are
/// the kubelet's, which is root).
pub fn in_cluster(
    dir: &Path,
    host: &str,
    port: &str,
    timeout: Duration,
) -> Result<ApiClient, ApiError> {
    if host.is_empty() || port.is_empty() {
        return Err(ApiError::Kubeconfig(
            "KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT are not set: not in a pod, \
             and no kubeconfig given"
                .into(),
        ));
    }
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: in-cluster\n  cluster:\n    server: \
         https://{authority}\n    certificate-authority: ca.crt\nusers:\n- name: pod\n  user:\n    \
         tokenFile: token\ncontexts:\n- name: in-cluster\n  context: {{cluster: in-cluster, user: \
         pod}}\ncurrent-context: in-cluster\n"
    );
    let kubeconfig = Kubeconfig::parse(&text, dir)
        .map_err(|why| ApiError::Kubeconfig(format!("{}: {why}", dir.display())))?;
    ApiClient::new(kubeconfig, timeout)
}

/// What the API server says about a DaemonSet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonSetState {
    /// It exists and is not being deleted.
    Stays,
    /// It has a `deletionTimestamp` (this one).
    Deleting(String),
    /// The API server answered 404 for this very object: it is gone.
    Gone,
}

/// A change of one label or annotation: `Some(value)` sets it, `None` removes it.
pub type MetadataChange<'a> = (&'a str, Option<&'a str>);

/// A `Warning` event about a Node.
#[derive(Debug)]
pub struct NodeEvent<'a> {
    /// The Node's name (also its `involvedObject.uid`, as the kubelet reports its node).
    pub node: &'a str,
    /// `reason`, CamelCase.
    pub reason: &'a str,
    /// `message`.
    pub message: &'a str,
    /// `source.component` and `reportingComponent`.
    pub component: &'a str,
    /// `firstTimestamp` and `lastTimestamp` (RFC 3339, UTC).
    pub time: &'a str,
}

impl ApiClient {
    fn exchange(
        &self,
        method: &str,
        path: &str,
        body: Option<http::Body<'_>>,
    ) -> Result<Vec<u8>, ApiError> {
        let deadline = Instant::now() + self.timeout;
        self.send(method, path, "application/json", body, deadline)
    }

    /// Node `name` whole, as JSON.
    pub fn node_object(&self, name: &str) -> Result<serde_json::Value, ApiError> {
        check_name(name, "the node name")?;
        let body = self.exchange("GET", &format!("/api/v1/nodes/{name}"), None)?;
        same_object(&body, "node", name)
    }

    /// Sets and removes labels and annotations of node `name` in one merge patch.
    pub fn patch_node_metadata(
        &self,
        name: &str,
        labels: &[MetadataChange<'_>],
        annotations: &[MetadataChange<'_>],
    ) -> Result<(), ApiError> {
        check_name(name, "the node name")?;
        let map = |changes: &[MetadataChange<'_>]| {
            changes
                .iter()
                .map(|(k, v)| {
                    (
                        (*k).to_string(),
                        v.map_or(serde_json::Value::Null, Into::into),
                    )
                })
                .collect::<serde_json::Map<_, _>>()
        };
        let mut metadata = serde_json::Map::new();
        if !labels.is_empty() {
            metadata.insert("labels".into(), map(labels).into());
        }
        if !annotations.is_empty() {
            metadata.insert("annotations".into(), map(annotations).into());
        }
        let patch = serde_json::json!({ "metadata": metadata }).to_string();
        let body = self.exchange(
            "PATCH",
            &format!("/api/v1/nodes/{name}"),
            Some(http::Body {
                content_type: "application/merge-patch+json",
                bytes: patch.as_bytes(),
            }),
        )?;
        same_object(&body, "node", name).map(|_| ())
    }

    /// Creates a `Warning` event about a Node in the `default` namespace, where the kubelet's
    /// own Node events go.
    pub fn create_node_event(&self, event: &NodeEvent<'_>) -> Result<(), ApiError> {
        check_name(event.node, "the node name")?;
        let body = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": format!("{}.", event.component), "namespace": "default"},
            "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": event.node, "uid": event.node},
            "type": "Warning",
            "reason": event.reason,
            "message": event.message,
            "source": {"component": event.component, "host": event.node},
            "reportingComponent": event.component,
            "reportingInstance": event.node,
            "firstTimestamp": event.time,
            "lastTimestamp": event.time,
            "count": 1,
        })
        .to_string();
        self.exchange(
            "POST",
            "/api/v1/namespaces/default/events",
            Some(http::Body {
                content_type: "application/json",
                bytes: body.as_bytes(),
            }),
        )
        .map(|_| ())
    }

    /// Whether DaemonSet `namespace/name` stays, is being deleted, or is gone. Gone only on
    /// the API server's 404 for this very object (its `NotFound` message names it); any other
    /// answer, 401 and 403 included, is an error: the caller cannot tell.
    pub fn daemonset_state(&self, namespace: &str, name: &str) -> Result<DaemonSetState, ApiError> {
        check_name(namespace, "the DaemonSet's namespace")?;
        check_name(name, "the DaemonSet's name")?;
        let path = format!("/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}");
        match self.exchange("GET", &path, None) {
            Ok(body) => {
                let ds = same_object(&body, "DaemonSet", name)?;
                match ds["metadata"]["deletionTimestamp"].as_str() {
                    Some(t) if !t.is_empty() => Ok(DaemonSetState::Deleting(t.to_string())),
                    _ => Ok(DaemonSetState::Stays),
                }
            }
            Err(ApiError::Status { code: 404, message })
                if message == format!("daemonsets.apps \"{name}\" not found") =>
            {
                Ok(DaemonSetState::Gone)
            }
            Err(e) => Err(e),
        }
    }
}

/// The answer as JSON, when it is the object asked for.
fn same_object(body: &[u8], what: &str, name: &str) -> Result<serde_json::Value, ApiError> {
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::Garbage(format!("the {what}'s answer is not JSON: {e}")))?;
    match v["metadata"]["name"].as_str() {
        Some(n) if n == name => Ok(v),
        other => Err(ApiError::Garbage(format!(
            "asked for {what} {name}, the answer is {what} {}",
            other.unwrap_or("-")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeApiServer, Reply};

    fn client(fake: &FakeApiServer) -> ApiClient {
        ApiClient::from_kubeconfig(&fake.kubeconfig(), Duration::from_secs(5)).expect("client")
    }

    #[test]
    fn patches_posts_and_reads_with_their_bodies() {
        let fake = FakeApiServer::start_with_bodies(|line, _| {
            if line.starts_with("POST ") {
                Reply::Answer {
                    status: 201,
                    body: r#"{"metadata":{"name":"kata-topo-installer.x"}}"#.into(),
                    chunked: false,
                }
            } else {
                Reply::ok(
                    r#"{"metadata":{"name":"node-1"},"status":{"nodeInfo":{"containerRuntimeVersion":"containerd://2.3.4"}}}"#,
                )
            }
        });
        let c = client(&fake);
        let node = c.node_object("node-1").expect("node");
        assert_eq!(
            node["status"]["nodeInfo"]["containerRuntimeVersion"],
            "containerd://2.3.4"
        );
        c.patch_node_metadata(
            "node-1",
            &[
                ("kata-topo.io/installed", Some("true")),
                ("kata-topo.io/install-refused", None),
            ],
            &[],
        )
        .expect("patch");
        c.create_node_event(&NodeEvent {
            node: "node-1",
            reason: "KataTopoInstallRefused",
            message: "a \"quoted\" reason",
            component: "kata-topo-installer",
            time: "2026-01-01T00:00:00Z",
        })
        .expect("event");
        let bodies = fake.exchanges();
        assert_eq!(bodies[1].line, "PATCH /api/v1/nodes/node-1 HTTP/1.1");
        assert_eq!(
            bodies[1].header("content-type").as_deref(),
            Some("application/merge-patch+json")
        );
        let patch: serde_json::Value = serde_json::from_slice(&bodies[1].body).expect("json");
        assert_eq!(
            patch,
            serde_json::json!({"metadata": {"labels": {"kata-topo.io/installed": "true", "kata-topo.io/install-refused": null}}})
        );
        assert_eq!(
            bodies[2].line,
            "POST /api/v1/namespaces/default/events HTTP/1.1"
        );
        let event: serde_json::Value = serde_json::from_slice(&bodies[2].body).expect("json");
        assert_eq!(event["message"], "a \"quoted\" reason");
        assert_eq!(event["involvedObject"]["kind"], "Node");
        assert!(c.node_object("node-2").is_err(), "another node's answer");
        assert!(c.node_object("Node_1").is_err(), "not a name");
    }

    #[test]
    fn a_daemonset_is_gone_only_on_its_own_404() {
        let answer = std::sync::Arc::new(std::sync::Mutex::new(Reply::ok("{}")));
        let a = std::sync::Arc::clone(&answer);
        let fake = FakeApiServer::start(move |_| a.lock().expect("lock").clone());
        let c = client(&fake);
        let state = |reply: Reply| {
            *answer.lock().expect("lock") = reply;
            c.daemonset_state("kube-system", "kata-topo-installer")
        };
        assert_eq!(
            state(Reply::ok(r#"{"metadata":{"name":"kata-topo-installer"}}"#)),
            Ok(DaemonSetState::Stays)
        );
        assert_eq!(
            state(Reply::ok(
                r#"{"metadata":{"name":"kata-topo-installer","deletionTimestamp":"2026-01-01T00:00:00Z"}}"#
            )),
            Ok(DaemonSetState::Deleting("2026-01-01T00:00:00Z".into()))
        );
        assert_eq!(
            state(Reply::status(
                404,
                "daemonsets.apps \"kata-topo-installer\" not found"
            )),
            Ok(DaemonSetState::Gone)
        );
        for unsure in [
            Reply::status(404, "the server could not find the requested resource"),
            Reply::status(403, "daemonsets.apps \"kata-topo-installer\" is forbidden"),
            Reply::status(401, "Unauthorized"),
            Reply::status(500, "etcdserver: request timed out"),
            Reply::ok(r#"{"metadata":{"name":"other"}}"#),
        ] {
            assert!(state(unsure.clone()).is_err(), "{unsure:?}");
        }
    }

    #[test]
    fn in_cluster_reads_the_service_account_volume() {
        let fake = FakeApiServer::start(|_| Reply::ok(r#"{"metadata":{"name":"node-1"}}"#));
        let dir = tempfile::tempdir().expect("tempdir");
        crate::fake::write_private(&dir.path().join("ca.crt"), fake.ca_pem());
        crate::fake::write_private(&dir.path().join("token"), crate::fake::TOKEN);
        let c = in_cluster(
            dir.path(),
            "127.0.0.1",
            &fake.port().to_string(),
            Duration::from_secs(5),
        )
        .expect("in cluster");
        c.node_object("node-1").expect("read with the pod's token");
        assert!(in_cluster(dir.path(), "", "", Duration::from_secs(1)).is_err());
        std::fs::remove_file(dir.path().join("token")).expect("rm");
        let e =
            in_cluster(dir.path(), "127.0.0.1", "1", Duration::from_secs(1)).expect_err("no token");
        assert!(e.to_string().contains("tokenFile"), "{e}");
    }
}
