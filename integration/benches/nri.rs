//! `kata-topo-nri` under 1,000 updates (`KT_BENCH_NRI_UPDATES`): containerd 2.x with NRI on, one
//! pod on the plain `runc` handler, in-place resizes through CRI. Prints the plugin's own
//! answer time to `UpdateContainer` (p50, p99, max, from its `--debug` lines: from the request
//! read to the answer written) and, inside it, the check's own time; the CRI round trip with
//! the plugin and without it (the plugin stopped: containerd then calls no plugin), and through
//! the wrapper (a pod on the `kata-topo` handler, no plugin). Then, beside the plugin's answer,
//! the wrapper's check of each `Update` (from its debug lines, in a containerd at debug: the
//! request waits for it).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kata_topo_integration::{
    bin_dir, eventually, workspace, Containerd, ContainerdBin, Cri, Guard, Resources,
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

/// The `micros` of the log's debug lines of `event` that `keep` keeps.
fn micros(c: &Containerd, event: &str, keep: impl Fn(&serde_json::Value) -> bool) -> Vec<Duration> {
    c.log_lines()
        .iter()
        .filter(|l| l["event"] == event && keep(l))
        .filter_map(|l| l["micros"].as_u64())
        .map(Duration::from_micros)
        .collect()
}

fn resize(admitted: &Resources, i: usize) -> Resources {
    Resources {
        quota: if i.is_multiple_of(2) {
            150_000
        } else {
            100_000
        },
        ..admitted.clone()
    }
}

/// `n` resizes of container `id` through CRI, each round trip.
fn updates(cri: &mut Cri, id: &str, admitted: &Resources, n: usize) -> Vec<Duration> {
    (0..n)
        .map(|i| {
            let t = Instant::now();
            cri.update(id, &resize(admitted, i)).expect("update");
            t.elapsed()
        })
        .collect()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
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
    println!(
        "== kata-topo-nri, containerd {} (load average {} at the start)",
        ContainerdBin::get().version_text,
        loadavg()
    );
    let admitted = Resources::admitted();
    {
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
        let id = cri
            .start_container(&pod, &cfg, "app", &admitted, false)
            .expect("StartContainer");
        let with = updates(&mut cri, &id, &admitted, n);
        let answered = || micros(&c, "nri-answered", |l| l["method"] == "UpdateContainer");
        assert!(
            eventually(Duration::from_secs(30), || answered().len() >= n),
            "the plugin's answer lines"
        );
        let answers = answered();
        let checks = micros(&c, "request-checked", |l| l["operation"] == "update");
        let unchecked = c
            .log_lines()
            .iter()
            .filter(|l| l["event"] == "nri-unchecked")
            .count();
        drop(plugin);
        let without = updates(&mut cri, &id, &admitted, n);
        // The wrapper in the same containerd, no plugin: the same updates on its handler.
        let wcfg = cri.pod_config("wrapper-bench", &[("kata-topo.io/numa-nodes", "1")]);
        let wpod = cri.run_pod(&wcfg, "kata-topo").expect("RunPodSandbox");
        let wid = cri
            .start_container(&wpod, &wcfg, "app", &admitted, false)
            .expect("StartContainer");
        let through = updates(&mut cri, &wid, &admitted, n);
        summary("plugin's answer to UpdateContainer", answers);
        summary("  of which its check", checks);
        println!("  answered without a verdict (the budget ran out): {unchecked}");
        summary("CRI UpdateContainerResources with the plugin", with);
        summary("CRI UpdateContainerResources without a plugin", without);
        summary("CRI UpdateContainerResources through the wrapper", through);
        for (id, pod) in [(&id, &pod), (&wid, &wpod)] {
            cri.remove_container(id);
            cri.remove_pod(pod);
        }
    }
    // The wrapper's own check time: the same updates with its debug lines on (containerd at
    // debug, so that the wrapper gets `-debug`).
    let c = Containerd::start(Guard {
        under: Some(workspace().join("target/nri-bench")),
        debug: true,
        ..Guard::default()
    });
    let mut cri = c.cri();
    let cfg = cri.pod_config("wrapper-bench", &[("kata-topo.io/numa-nodes", "1")]);
    let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
    let id = cri
        .start_container(&pod, &cfg, "app", &admitted, false)
        .expect("StartContainer");
    let _ = updates(&mut cri, &id, &admitted, n);
    let checked = || micros(&c, "request-checked", |l| l["operation"] == "update");
    assert!(
        eventually(Duration::from_secs(30), || checked().len() >= n),
        "the wrapper's debug lines"
    );
    summary(
        "wrapper's check of Update (the request waits for it)",
        checked(),
    );
    println!("load average {} at the end", loadavg());
    cri.remove_container(&id);
    cri.remove_pod(&pod);
}
