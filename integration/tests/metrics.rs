//! The wrapper's Prometheus text files read by a real node-exporter (Debian's
//! prometheus-node-exporter on a loopback port, textfile collector on `metrics_dir`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kata_topo_integration::{eventually, Containerd, Guard, Resources};

struct NodeExporter {
    child: Child,
    port: u16,
}

impl NodeExporter {
    fn start(dir: &std::path::Path) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("free port")
            .port();
        let child = Command::new("prometheus-node-exporter")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .args(["--collector.disable-defaults", "--collector.textfile"])
            .arg(format!("--collector.textfile.directory={}", dir.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus-node-exporter (apt-get install prometheus-node-exporter; make test does)");
        let n = Self { child, port };
        assert!(
            eventually(Duration::from_secs(15), || n.scrape().is_some()),
            "node-exporter did not answer on 127.0.0.1:{port}"
        );
        n
    }

    fn scrape(&self) -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut body = String::new();
        s.read_to_string(&mut body).ok()?;
        body.starts_with("HTTP/1.0 200").then_some(body)
    }

    /// The value of a kata-topo series with exactly these labels.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let body = self.scrape()?;
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        body.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix('{')?;
            let (labels, value) = rest.split_once("} ")?;
            let got: BTreeMap<String, String> = labels
                .split("\",")
                .filter_map(|kv| kv.split_once("=\""))
                .map(|(k, v)| (k.to_string(), v.trim_end_matches('"').to_string()))
                .collect();
            (got == want).then(|| value.trim().parse().ok()).flatten()
        })
    }
}

impl Drop for NodeExporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn node_exporter_reads_the_wrapper_metrics_and_they_go_with_the_sandbox() {
    let c = Containerd::start(Guard {
        metrics: true,
        ..Guard::default()
    });
    std::fs::create_dir_all(&c.metrics_dir).expect("metrics dir");
    let ne = NodeExporter::start(&c.metrics_dir);
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("metered", &[("kata-topo.io/numa-nodes", "1")], true);
    let res = Resources::admitted();
    cri.update(
        &id,
        &Resources {
            quota: 200_000,
            ..res.clone()
        },
    )
    .expect("resize");
    cri.update(&id, &res.on("0")).expect("push");
    let base = [("namespace", "k8s.io"), ("sandbox_id", pod.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut l: Vec<(&str, &str)> = base.to_vec();
        l.extend_from_slice(extra);
        l
    };
    assert_eq!(ne.value("kata_topo_sandbox_watched", &base), Some(1.0));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let heartbeat = ne.value("kata_topo_heartbeat_timestamp_seconds", &base);
    assert!(
        heartbeat.is_some_and(|t| (now - t).abs() < 120.0),
        "heartbeat {heartbeat:?}, now {now}"
    );
    assert_eq!(
        ne.value(
            "kata_topo_checks_total",
            &with(&[("operation", "update"), ("decision", "allow")])
        ),
        Some(2.0)
    );
    assert_eq!(
        ne.value(
            "kata_topo_checks_total",
            &with(&[("operation", "create"), ("decision", "allow")])
        ),
        Some(1.0)
    );
    assert_eq!(
        ne.value(
            "kata_topo_findings_total",
            &with(&[("rule", "vfio-remote"), ("severity", "error")])
        ),
        Some(1.0)
    );
    assert_eq!(
        ne.value(
            "kata_topo_findings_total",
            &with(&[("rule", "cpu-outside-intent"), ("severity", "error")])
        ),
        Some(1.0)
    );
    assert_eq!(
        ne.value("kata_topo_check_duration_seconds_count", &base),
        Some(4.0)
    );
    assert_eq!(
        ne.value(
            "kata_topo_topology_refreshes_total",
            &with(&[("result", "ok")])
        ),
        Some(1.0)
    );
    cri.remove_pod(&pod);
    assert!(
        eventually(Duration::from_secs(15), || ne
            .scrape()
            .is_some_and(|b| !b.contains(pod.as_str()))),
        "the sandbox's series disappear with it"
    );
    assert_eq!(std::fs::read_dir(&c.metrics_dir).expect("dir").count(), 0);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}
