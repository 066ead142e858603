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
    let server =
        FakeApiServer::start(|_| Reply::Slow(Duration::from_millis(50), Box::new(Reply::ok(NODE))));
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
            FakeApiServer::start(move |_| Reply::TrickleRecords(every, Box::new(Reply::ok(NODE)))),
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
    let server =
        FakeApiServer::start(|_| Reply::Slow(Duration::from_millis(600), Box::new(Reply::ok(POD))));
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
