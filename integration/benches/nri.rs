//! `kata-topo-nri` under 1,000 updates (`KT_BENCH_NRI_UPDATES`): containerd 2.x with NRI on, one
//! pod on the plain `runc` handler, in-place resizes through CRI. Prints the plugin's own
//! answer time to `UpdateContainer` (p50, p99, max, from its `--debug` lines) and the CRI
//! round trip with the plugin and without it (the plugin stopped: containerd then calls no
//! plugin).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kata_topo_integration::{
    bin_dir, eventually, workspace, Containerd, ContainerdBin, Guard, Resources,
};

mod stats;
use stats::{ms, percentile};

struct Plugin(Child);

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name}: n={} p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap_or(&Duration::ZERO)),
    );
}

fn main() {
    if std::env::var_os("KT_CONTAINERD_BIN").is_none() {
        std::env::set_var(
            "KT_CONTAINERD_BIN",
            workspace().join("target/containerd-2.3.4/bin"),
        );
    }
    assert!(ContainerdBin::get().is_v2(), "NRI needs containerd 2.x");
    let n: usize = std::env::var("KT_BENCH_NRI_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let c = Containerd::start(Guard {
        under: Some(workspace().join("target/nri-bench")),
        ..Guard::default()
    });
    let plugin = Command::new(bin_dir().join("kata-topo-nri"))
        .arg("--config")
        .arg(&c.config)
        .arg("--socket")
        .arg(&c.nri_socket)
        .arg("--debug")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start kata-topo-nri");
    let plugin = Plugin(plugin);
    let registered = || c.log_lines().iter().any(|l| l["event"] == "nri-registered");
    assert!(
        eventually(Duration::from_secs(30), registered),
        "the plugin registered"
    );
    let mut cri = c.cri();
    let cfg = cri.pod_config("nri-bench", &[("kata-topo.io/numa-nodes", "1")]);
    let pod = cri.run_pod(&cfg, "runc").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    let resize = |i: usize| Resources {
        quota: if i.is_multiple_of(2) {
            150_000
        } else {
            100_000
        },
        ..admitted.clone()
    };
    let mut with = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        cri.update(&id, &resize(i)).expect("update");
        with.push(t.elapsed());
    }
    let answered = || {
        c.log_lines()
            .iter()
            .filter(|l| l["event"] == "nri-answered" && l["method"] == "UpdateContainer")
            .filter_map(|l| l["micros"].as_u64())
            .map(Duration::from_micros)
            .collect::<Vec<_>>()
    };
    assert!(
        eventually(Duration::from_secs(30), || answered().len() >= n),
        "the plugin's answer lines"
    );
    let answers = answered();
    drop(plugin);
    let mut without = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        cri.update(&id, &resize(i)).expect("update");
        without.push(t.elapsed());
    }
    println!(
        "== kata-topo-nri, containerd {}",
        ContainerdBin::get().version_text
    );
    summary("plugin's answer to UpdateContainer", answers);
    summary("CRI UpdateContainerResources with the plugin", with);
    summary("CRI UpdateContainerResources without a plugin", without);
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}
