//! The heap the NRI plugin's front end holds per pod, counted by a global allocator that
//! wraps the system's: `KT_BENCH_HEAP_PODS` pods (100) made as `Synchronize` and a
//! `CreateContainer` of each make them (the pod's checks, its sandbox and one container with
//! the annotations the runtime and the kubelet give it, its state written, its metrics
//! counted), then every pod removed. Prints the bytes and blocks live per pod, by step, and
//! what is left once every pod is gone (a leak shows there). Not a test: the figures are what
//! `make bench` reports beside the plugin's PSS on a real containerd (`integration/benches/nri.rs`).
#![expect(unsafe_code, reason = "a global allocator is an unsafe trait")]
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use kata_topo_core::config::{Config, ConfigSource, Resolved};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_proto::nri::pkg::api::v1alpha1 as nri;
use kata_topo_shim::checks::Sinks;
use kata_topo_sinks::{Drops, Events};

/// The system allocator, counting what is live.
struct Counting;
static BYTES: AtomicIsize = AtomicIsize::new(0);
static BLOCKS: AtomicIsize = AtomicIsize::new(0);
// SAFETY: every call is the system allocator's with the caller's own arguments; the counters
// are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        BYTES.fetch_add(l.size() as isize, Relaxed);
        BLOCKS.fetch_add(1, Relaxed);
        // SAFETY: the caller's layout, as `GlobalAlloc::alloc` requires it.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        BYTES.fetch_sub(l.size() as isize, Relaxed);
        BLOCKS.fetch_sub(1, Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l` (every allocation goes there).
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        BYTES.fetch_add(n as isize - l.size() as isize, Relaxed);
        // SAFETY: `p` was allocated by `System` with layout `l`; `n` is the caller's.
        unsafe { System.realloc(p, l, n) }
    }
}
#[global_allocator]
static A: Counting = Counting;

fn live() -> (isize, isize) {
    (BYTES.load(Relaxed), BLOCKS.load(Relaxed))
}

fn kv(pairs: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn main() {
    let dir = tempfile::tempdir().expect("tmp");
    // A two-node host from its hwloc XML; state and metrics written as the DaemonSet's are.
    let config = Config {
        state_dir: dir.path().join("state"),
        metrics_dir: Some(dir.path().join("metrics")),
        log_file: dir.path().join("log"),
        topology_xml: Some(kata_topo_core::testutil::xml("24em64t-2n6c2t-pci.xml")),
        sysfs_root: dir.path().join("sys"),
        ..Config::default()
    };
    std::fs::create_dir_all(dir.path().join("sys")).ok();
    std::fs::create_dir_all(dir.path().join("metrics")).ok();
    let resolved = Resolved {
        config,
        file: None,
        source: ConfigSource::Defaults,
    };
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let drops = Drops::new();
    let sinks = Sinks {
        log: log.clone(),
        events: Events::start(None, "k8s.io".into(), log.clone(), drops.clone()),
        drops,
    };
    let front = kata_topo_nri::front::Front::new(resolved, KataConfig::default(), sinks);
    let n: usize = std::env::var("KT_BENCH_HEAP_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(100);
    // The runtime's messages, made first: they are not the plugin's.
    let mut pods = Vec::new();
    for i in 0..n {
        let id = format!("{i:064x}");
        let pod = nri::PodSandbox {
            id: id.clone(),
            name: format!("pod-{i}"),
            uid: format!("0e6c3c9b-0c3a-4d1e-9d7e-{i:012}"),
            namespace: "default".into(),
            runtime_handler: "runc".into(),
            labels: kv(&[("app", "web"), ("pod-template-hash", "5d8f7c9b4")]),
            annotations: kv(&[
                (
                    "kubernetes.io/config.seen",
                    "2026-12-03T14:00:00.000000000Z",
                ),
                ("kubernetes.io/config.source", "api"),
            ]),
            ..Default::default()
        };
        let cid = format!("{:064x}", i + 1_000_000);
        let container = nri::Container {
            id: cid,
            pod_sandbox_id: id.clone(),
            name: "app".into(),
            annotations: kv(&[
                ("io.kubernetes.cri.container-name", "app"),
                ("io.kubernetes.cri.container-type", "container"),
                (
                    "io.kubernetes.cri.image-name",
                    "localhost/kata-topo/busybox:1",
                ),
                ("io.kubernetes.cri.sandbox-id", &id),
                ("io.kubernetes.cri.sandbox-name", "pod"),
                ("io.kubernetes.cri.sandbox-namespace", "default"),
                (
                    "io.kubernetes.cri.sandbox-uid",
                    "0e6c3c9b-0c3a-4d1e-9d7e-000000000000",
                ),
                ("io.kubernetes.container.hash", "3b6c1f2a"),
                ("io.kubernetes.container.restartCount", "0"),
                (
                    "io.kubernetes.container.terminationMessagePath",
                    "/dev/termination-log",
                ),
                ("io.kubernetes.container.terminationMessagePolicy", "File"),
                ("io.kubernetes.pod.terminationGracePeriod", "30"),
            ]),
            linux: Some(nri::LinuxContainer {
                resources: Some(nri::LinuxResources {
                    cpu: Some(nri::LinuxCpu {
                        cpus: "0-1".into(),
                        mems: "0".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        pods.push((pod, container));
    }
    let mut stages = [(0isize, 0isize); 3];
    let start = live();
    for (pod, container) in &pods {
        let a = live();
        front.synchronize(std::slice::from_ref(pod), &[]);
        let b = live();
        front.create(pod, container).ok();
        let c = live();
        front.flush(Instant::now() + Duration::from_secs(5));
        let d = live();
        for (s, (x, y)) in stages.iter_mut().zip([(a, b), (b, c), (c, d)]) {
            s.0 += y.0 - x.0;
            s.1 += y.1 - x.1;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    let end = live();
    let per = |v: isize| v as f64 / n as f64;
    println!(
        "== the NRI front end's heap: {n} pods, each with its sandbox and one container\n    live per pod {:.0} B in {:.1} blocks (malloc adds about 16 B a block)",
        per(end.0 - start.0),
        per(end.1 - start.1)
    );
    for (name, s) in [
        "the pod (its checks, its sandbox)",
        "the container's create",
        "its state written",
    ]
    .iter()
    .zip(stages)
    {
        println!(
            "    {name:<34} {:>7.0} B {:>6.1} blocks",
            per(s.0),
            per(s.1)
        );
    }
    for (pod, container) in &pods {
        front.remove_container(container);
        front.remove_pod(pod);
    }
    front.flush(Instant::now() + Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(1));
    let left = live();
    println!(
        "    every pod removed: {} B in {} blocks left of them in all",
        left.0 - start.0,
        left.1 - start.1
    );
}
