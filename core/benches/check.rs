//! `make bench`: the cost of one check with the topology already loaded (the request path),
//! of loading each topology (off the request path), and of the node-wide topology cache: a
//! live discovery against reading the machine's key and loading the cached XML, on this
//! machine and on a 40-PU, 4-node snapshot of a real one discovered through `HWLOC_FSROOT`;
//! and how often the cache's key changes on this node when nothing happens (reloads per hour).
//! Target: a check under 50 µs, with the pod's intent from the kubelet too.

use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, Criterion};
use kata_topo_core::check::{Request, Running};
use kata_topo_core::host::cache::{Origin, TopologyCache};
use kata_topo_core::input::kubelet::{
    ContainerAdmission, DeviceAdmission, KubeletSettings, KubeletView, PodAdmission,
};
use kata_topo_core::testutil::SysfsTree;
use kata_topo_core::{Checker, ContainerSpec, Defaults, Host, Resources, Sysfs, TopologySource};

fn xml(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hwloc/xml")
        .join(name)
}

fn load(name: &str) -> Host {
    Host::load(&TopologySource::Xml(xml(name))).expect("fixture loads")
}

fn spec(cpus: &str, groups: &[&str]) -> ContainerSpec {
    let devices: Vec<_> = groups
        .iter()
        .map(|g| serde_json::json!({"path": format!("/dev/vfio/{g}"), "type": "c", "major": 240, "minor": 0}))
        .collect();
    let json = serde_json::json!({
        "ociVersion": "1.0.2",
        "annotations": {
            "io.kubernetes.cri.container-type": "container",
            "io.kubernetes.cri.sandbox-id": "sb", "io.kubernetes.cri.container-name": "app",
            "kata-topo.io/policy": "single-numa-node"
        },
        "linux": {"resources": {"cpu": {"cpus": cpus, "mems": "4", "quota": 100000, "period": 100000}}, "devices": devices}
    });
    ContainerSpec::from_json(json.to_string().as_bytes()).expect("spec")
}

fn bench_check(
    c: &mut Criterion,
    name: &str,
    host: &Host,
    devices: &[(&str, i32, &str)],
    cpus: &str,
    push: &str,
    kubelet: Option<&KubeletView>,
) {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = SysfsTree::at(dir.path().join("sys")).expect("tree");
    for (bdf, node, group) in devices {
        tree.add_device(
            bdf.parse().expect("bdf"),
            *node,
            Some("vfio-pci"),
            Some(group),
        )
        .expect("device");
    }
    let sysfs = Sysfs::new(tree.root());
    let groups: Vec<&str> = devices.iter().map(|d| d.2).collect();
    let spec = spec(cpus, &groups);
    let update = Resources::from_json(format!(r#"{{"cpu":{{"cpus":"{push}"}}}}"#).as_bytes())
        .expect("update");
    let checker = Checker::new(host, Some(&sysfs), Defaults::default());
    let baseline = checker.record_baseline(&spec);
    let request = Request {
        container_id: Some("c"),
        kubelet,
        ..Request::new(&spec)
    };
    let running = Running {
        baseline: Some(&baseline),
        ..Running::default()
    };
    assert!(
        !checker
            .update(&request, running, &update)
            .findings
            .is_empty(),
        "the push must be a finding"
    );
    c.bench_function(&format!("check update {name}"), |b| {
        b.iter(|| {
            std::hint::black_box(checker.update(std::hint::black_box(&request), running, &update))
        })
    });
}

fn checks(c: &mut Criterion) {
    let big = load("192em64t-24n8c2t.xml");
    let node4 = big.node(4).expect("node 4").cpus.to_string();
    let node6 = big.node(6).expect("node 6").cpus.to_string();
    bench_check(
        c,
        "192em64t-24n8c2t (2 VFIO devices)",
        &big,
        &[("0002:03:00.0", 4, "30"), ("0002:04:00.0", 4, "31")],
        &node4,
        &node6,
        None,
    );
    let dgx = load("nvidiaDGX2.xml");
    bench_check(
        c,
        "nvidiaDGX2 (2 GPUs)",
        &dgx,
        &[("0000:34:00.0", 0, "10"), ("0000:36:00.0", 0, "11")],
        "0-1",
        "24-25",
        None,
    );
    // The same with the pod's intent from the kubelet: CPUs 0-1 and both GPUs on node 0, as
    // its Topology Manager admitted them (the question to the kubelet is not counted: it is
    // asked at creates and resizes, about 0.1 ms at the median).
    let gpu = |bdf: &str| DeviceAdmission {
        resource_name: "kata-topo.io/vfio".into(),
        device_ids: vec![bdf.into()],
        numa_nodes: "0".parse().expect("set"),
    };
    let admitted = KubeletView::Admitted {
        pod: PodAdmission {
            namespace: "ml".into(),
            name: "trainer".into(),
            containers: vec![ContainerAdmission {
                name: "app".into(),
                cpu_ids: "0-1".parse().expect("set"),
                memory: Vec::new(),
                devices: vec![gpu("0000:34:00.0"), gpu("0000:36:00.0")],
            }],
        },
        settings: KubeletSettings {
            topology_manager_policy: kata_topo_core::Policy::SingleNumaNode,
            ..KubeletSettings::default()
        },
    };
    bench_check(
        c,
        "nvidiaDGX2 (2 GPUs), intent from the kubelet",
        &dgx,
        &[("0000:34:00.0", 0, "10"), ("0000:36:00.0", 0, "11")],
        "0-1",
        "24-25",
        Some(&admitted),
    );
}

fn loads(c: &mut Criterion) {
    let mut group = c.benchmark_group("load");
    group.sample_size(20);
    for name in [
        "192em64t-24n8c2t.xml",
        "nvidiaDGX2.xml",
        "16intel64-manyVFs.xml",
        "64intel64-fakeKNL-SNC4-hybrid.xml",
        "fsroot-40intel64-2g2n4c+pci-nolocalityenv.xml",
    ] {
        let path = TopologySource::Xml(xml(name));
        group.bench_function(name, |b| b.iter(|| Host::load(&path).expect("load")));
    }
    group.finish();
}

/// Discovery, key and cached load of the machine under `root` (`None`: this one).
fn bench_cache(c: &mut Criterion, name: &str, root: Option<&std::path::Path>) {
    let state = tempfile::tempdir().expect("tempdir");
    let cache = TopologyCache::new(state.path(), root.unwrap_or(std::path::Path::new("/")));
    let first = cache.load().expect("discovery");
    assert!(
        matches!(first.origin, Origin::Discovered { stored: Ok(_), .. }),
        "{}",
        first.origin
    );
    let mut group = c.benchmark_group(format!("topology cache, {name}"));
    group.sample_size(20);
    group.bench_function("live discovery", |b| {
        b.iter(|| Host::discover().expect("discover"))
    });
    group.bench_function("read the key", |b| b.iter(|| cache.key().expect("key")));
    group.bench_function("key + cached load", |b| {
        b.iter(|| {
            let loaded = cache.load().expect("load");
            assert!(matches!(loaded.origin, Origin::Cached(_)));
            loaded
        })
    });
    group.finish();
}

fn cache(c: &mut Criterion) {
    bench_cache(c, "this machine", None);
    // A snapshot of a real machine, discovered by hwloc's Linux backend as if it were live.
    let dir = tempfile::tempdir().expect("tempdir");
    let archive = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hwloc/fsroot/40intel64-2g2n4c+pcilocality.tar.bz2");
    let unpacked = std::process::Command::new("tar")
        .arg("-xjf")
        .arg(&archive)
        .arg("-C")
        .arg(dir.path())
        .status()
        .expect("tar");
    assert!(unpacked.success(), "unpacking {}", archive.display());
    let root = dir.path().join("40intel64-2g2n4c+pci");
    let boot = root.join("proc/sys/kernel/random");
    std::fs::create_dir_all(&boot).expect("boot id dir");
    std::fs::write(
        boot.join("boot_id"),
        "5c1f0a3e-0000-4000-8000-000000000001\n",
    )
    .expect("boot id");
    // Only this group runs with these set; nothing else runs meanwhile.
    std::env::set_var("HWLOC_FSROOT", &root);
    std::env::set_var("HWLOC_COMPONENTS", "linux,stop");
    bench_cache(c, "40intel64-2g2n4c snapshot", Some(&root));
    std::env::remove_var("HWLOC_FSROOT");
    std::env::remove_var("HWLOC_COMPONENTS");
}

/// How often the cache's key changes on this node when nothing happens to its topology: the
/// key is read every `KT_BENCH_KEY_INTERVAL_MS` (2000) for `KT_BENCH_KEY_SECONDS` (60), and the
/// changes are extrapolated to an hour — each change is a reload (a cached load, or a
/// discovery) in every pod's daemon at its next refresh. For comparison, the same for each
/// node's `MemTotal`, which the key held before: it moves with virtio-mem and balloon drivers.
fn reloads(_c: &mut Criterion) {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let seconds = number("KT_BENCH_KEY_SECONDS", 60).max(1);
    let interval =
        std::time::Duration::from_millis(number("KT_BENCH_KEY_INTERVAL_MS", 2000).max(10));
    let state = tempfile::tempdir().expect("tempdir");
    let cache = TopologyCache::new(state.path(), "/");
    let mem_totals = || -> Vec<String> {
        let mut totals: Vec<String> = std::fs::read_dir("/sys/devices/system/node")
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("node"))
            .filter_map(|e| std::fs::read_to_string(e.path().join("meminfo")).ok())
            .filter_map(|m| {
                m.lines()
                    .find(|l| l.contains("MemTotal:"))
                    .map(str::to_string)
            })
            .collect();
        totals.sort();
        totals
    };
    let (mut key, mut totals) = (cache.key().expect("key"), mem_totals());
    let (mut key_changes, mut total_changes, mut samples) = (0u64, 0u64, 1u64);
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(seconds) {
        std::thread::sleep(interval);
        let (k, t) = (cache.key().expect("key"), mem_totals());
        if k != key {
            key_changes += 1;
            println!("  key changed: {}", k.changed_since(&key).join(", "));
        }
        total_changes += u64::from(t != totals);
        (key, totals) = (k, t);
        samples += 1;
    }
    let per_hour = |n: u64| n as f64 * 3600.0 / start.elapsed().as_secs_f64();
    println!(
        "topology cache key on this node, idle: {samples} reads over {:.0} s; {key_changes} \
         changes: {:.0} reloads per hour (each node's MemTotal, keyed before: {total_changes} \
         changes, {:.0} per hour)",
        start.elapsed().as_secs_f64(),
        per_hour(key_changes),
        per_hour(total_changes)
    );
}

criterion_group!(benches, reloads, checks, loads, cache);
criterion_main!(benches);
