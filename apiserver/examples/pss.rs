//! What reading the API server costs a process in memory: its proportional set size
//! (`/proc/self/smaps_rollup`) before any read, after the first read of a node and a pod
//! from a fake API server on the loopback (TLS with a test CA, in a child process so that
//! its own memory is not counted), and after a hundred more.
//! `cargo run --release -p kata-topo-apiserver --features fake --example pss`

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use kata_topo_apiserver::fake::{FakeApiServer, Reply};
use kata_topo_apiserver::ApiClient;

fn pss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/smaps_rollup")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Pss:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The child: serves until its standard input closes, after printing its kubeconfig's path.
fn serve() {
    let server = FakeApiServer::start(|line| {
        if line.contains("/nodes/") {
            Reply::ok(
                r#"{"kind":"PartialObjectMetadata","metadata":{"name":"worker-1","labels":{"kata-topo.io/nic":"mlx5"}}}"#,
            )
        } else {
            Reply::ok(
                r#"{"kind":"Pod","metadata":{"name":"web","namespace":"shop"},"spec":{"nodeSelector":{"kata-topo.io/nic":"mlx5"}}}"#,
            )
        }
    });
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{}", server.kubeconfig().display());
    let _ = out.flush();
    let mut line = String::new();
    let _ = std::io::stdin().read_line(&mut line);
}

fn main() {
    if std::env::args().nth(1).as_deref() == Some("serve") {
        return serve();
    }
    let mut child = Command::new(std::env::current_exe().expect("exe"))
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("fake API server");
    let mut path = String::new();
    std::io::BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut path)
        .expect("kubeconfig path");
    let kubeconfig = PathBuf::from(path.trim());
    let before = pss_kib();
    let client = ApiClient::from_kubeconfig(&kubeconfig, Duration::from_secs(2)).expect("client");
    let started = Instant::now();
    let r = client.read("worker-1", Some(("shop", "web")));
    let first = started.elapsed();
    assert!(r.node.is_ok() && r.pod.is_some_and(|p| p.is_ok()));
    let after_one = pss_kib();
    let mut took = Vec::new();
    for _ in 0..100 {
        let t = Instant::now();
        let r = client.read("worker-1", None);
        took.push(t.elapsed());
        assert!(r.node.is_ok());
    }
    took.sort();
    let after_hundred = pss_kib();
    println!(
        "PSS before {before} KiB, after the first read {after_one} KiB (+{}), after 100 more {after_hundred} KiB (+{}); first read (pod and node) {first:?}, a node's read median {:?}, p95 {:?}, max {:?}",
        after_one.saturating_sub(before),
        after_hundred.saturating_sub(before),
        took[50],
        took[95],
        took[99]
    );
    drop(child.stdin.take());
    let _ = child.wait();
}
