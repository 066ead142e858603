//! `make bench`: what the wrapper costs a pod, side by side in one run through the same
//! containerd (the harness's: the one on PATH, or `KT_CONTAINERD_BIN`), the wrapper on the
//! live topology:
//!
//! 1. `ctr run --rm` of a busybox `true`, through kata-topo and through the plain runc
//!    handler, interleaved round by round (the order alternating);
//! 2. a CRI pod lifecycle (RunPodSandbox, CreateContainer, StartContainer, StopContainer,
//!    RemoveContainer, StopPodSandbox, RemovePodSandbox), interleaved the same way;
//! 3. a ttrpc `State` round trip to a running task through the wrapper and straight to the
//!    delegate, in interleaved blocks;
//! 4. the wrapper daemon's resident memory and threads while it serves that one task.
//!
//! Lifecycles are reported with median, p95 and max and the ratios of each, and how many
//! took more than twice the delegate's median. With `KT_BENCH_COLD=1` another variant runs
//! the wrapper with `topology_cache = false` (every pod discovers the machine); with
//! `KT_BENCH_BASELINE_BIN=DIR` another runs the wrapper built in DIR (an earlier revision),
//! interleaved with the rest (the earlier build must accept the configuration: no
//! `topology_cache` key is written for it).
//!
//! Targets (figures, not tests): lifecycle median ratio <= 1.05 and p95 ratio <= 1.10, no
//! lifecycle over twice the delegate's median, State added p50 <= 20 µs, wrapper RSS
//! <= 6 MiB. Knobs: `KT_BENCH_ROUNDS` (default 100), `KT_BENCH_CRI_ROUNDS` (60),
//! `KT_BENCH_STATE_CALLS` (6000), `KT_BENCH_SAMPLES=FILE` (every sample, as CSV). Uses the
//! release binaries (`make bench` builds them).

mod stats;

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use kata_topo_integration::{Containerd, Guard, Resources, BUSYBOX};
use kata_topo_proto::containerd::task::v2::StateRequest;
use kata_topo_proto::wire::{Client, TASK_V2, TASK_V3};
use prost::Message;
use stats::{ms, percentile};

const KT: &str = "io.containerd.kata-topo.v2";
const RUNC: &str = "io.containerd.runc.v2";

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Median, p95 and max of a sample.
#[derive(Clone, Copy)]
struct Summary {
    median: Duration,
    p95: Duration,
    max: Duration,
}

impl Summary {
    fn of(samples: &[Duration]) -> Self {
        let mut s = samples.to_vec();
        s.sort();
        Self {
            median: percentile(&s, 0.5),
            p95: percentile(&s, 0.95),
            max: s[s.len() - 1],
        }
    }
}

/// One variant's samples.
struct Series {
    name: &'static str,
    samples: Vec<Duration>,
}

/// Prints one measure for each variant against the first (the delegate), and what the
/// targets say. Returns the wrapper's ratios (median, p95) and how many of its samples
/// took over twice the delegate's median.
fn report(title: &str, series: &[Series]) -> (f64, f64, usize) {
    println!("{title}");
    if series.iter().any(|s| s.samples.is_empty()) {
        println!("    not run (0 rounds)");
        return (f64::NAN, f64::NAN, 0);
    }
    let base = Summary::of(&series[0].samples);
    println!(
        "    {:<34} {:>9} {:>9} {:>9}   {:>6} {:>6} {:>6}   {:>5}",
        "", "median", "p95", "max", "×med", "×p95", "×max", ">2×med"
    );
    let mut wrapper = (0.0, 0.0, 0);
    for (i, s) in series.iter().enumerate() {
        let sum = Summary::of(&s.samples);
        let slow = s.samples.iter().filter(|d| **d > base.median * 2).count();
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        println!(
            "    {:<34} {:>6.1} ms {:>6.1} ms {:>6.1} ms   {:>6.3} {:>6.3} {:>6.3}   {:>2}/{:<2}",
            format!("{} ({} rounds)", s.name, s.samples.len()),
            ms(sum.median),
            ms(sum.p95),
            ms(sum.max),
            ratio(sum.median, base.median),
            ratio(sum.p95, base.p95),
            ratio(sum.max, base.max),
            slow,
            s.samples.len()
        );
        if i == 1 {
            wrapper = (
                ratio(sum.median, base.median),
                ratio(sum.p95, base.p95),
                slow,
            );
        }
    }
    wrapper
}

/// With `KT_BENCH_SAMPLES=FILE`, every sample is appended to FILE as
/// `section,variant,round,milliseconds` (rounds are interleaved: round r of every variant ran
/// back to back).
fn write_samples(section: &str, series: &[Series]) {
    let Some(path) = std::env::var_os("KT_BENCH_SAMPLES") else {
        return;
    };
    let mut text = String::new();
    for s in series {
        for (round, d) in s.samples.iter().enumerate() {
            text.push_str(&format!("{section},{},{round},{:.3}\n", s.name, ms(*d)));
        }
    }
    use std::io::Write;
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| f.write_all(text.as_bytes()));
    if let Err(e) = written {
        eprintln!("KT_BENCH_SAMPLES: {e}");
    }
}

fn rss_and_threads(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("Threads:"))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn ok(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sets or clears a `[topology_guard]` key in the wrapper's configuration (read by every
/// later `start`).
fn set_guard_key(c: &Containerd, key: &str, value: Option<&str>) {
    let text = std::fs::read_to_string(&c.config).expect("config");
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| !l.trim_start().starts_with(key))
        .map(str::to_string)
        .collect();
    if let Some(v) = value {
        let at = lines
            .iter()
            .position(|l| l.trim() == "[topology_guard]")
            .expect("table")
            + 1;
        lines.insert(at, format!("{key} = {v}"));
    }
    std::fs::write(&c.config, lines.join("\n") + "\n").expect("write config");
}

/// A variant: a runtime, and whether the wrapper's topology cache is off.
#[derive(Clone, Copy)]
struct Variant {
    name: &'static str,
    /// For container and pod names.
    tag: &'static str,
    runtime: &'static str,
    handler: &'static str,
    cold: bool,
    /// Another build of the wrapper (`KT_BENCH_BASELINE_BIN`) instead of the one under test.
    baseline: bool,
}

/// Points the handler's `containerd-shim-kata-topo-v2` (the harness's link on containerd's
/// PATH) at a build of the wrapper; `start` and `delete` run whatever it names at the time.
fn point_wrapper_at(c: &Containerd, dir: &Path) {
    let link = c.dir.path().join("bin/containerd-shim-kata-topo-v2");
    let tmp = c.dir.path().join("bin/.containerd-shim-kata-topo-v2.new");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(dir.join("containerd-shim-kata-topo-v2"), &tmp).expect("link");
    std::fs::rename(&tmp, &link).expect("swap the wrapper");
}

fn prepare(c: &Containerd, v: Variant, builds: &Builds) {
    if v.runtime == KT {
        set_guard_key(c, "topology_cache", v.cold.then_some("false"));
        if let Some(baseline) = &builds.baseline {
            point_wrapper_at(c, if v.baseline { baseline } else { &builds.tested });
        }
    }
}

/// The wrapper under test, and another build to compare with.
struct Builds {
    tested: std::path::PathBuf,
    baseline: Option<std::path::PathBuf>,
}

/// Runs `one` for every variant, `rounds` times, the order rotating each round.
fn interleaved(
    c: &Containerd,
    builds: &Builds,
    variants: &[Variant],
    rounds: usize,
    mut one: impl FnMut(Variant, usize) -> Duration,
) -> Vec<Series> {
    let mut series: Vec<Series> = variants
        .iter()
        .map(|v| Series {
            name: v.name,
            samples: Vec::with_capacity(rounds),
        })
        .collect();
    for round in 0..rounds {
        for k in 0..variants.len() {
            let i = (round + k) % variants.len();
            prepare(c, variants[i], builds);
            let d = one(variants[i], round);
            series[i].samples.push(d);
        }
    }
    series
}

fn ctr_lifecycle(c: &Containerd, v: Variant, round: usize) -> Duration {
    let id = format!("life-{}-{round}", v.tag);
    let t = Instant::now();
    let out = c.ctr(&["run", "--rm", "--runtime", v.runtime, BUSYBOX, &id, "true"]);
    let d = t.elapsed();
    ok(&out, "ctr run --rm");
    d
}

/// One CRI pod lifecycle; returns its total and its RunPodSandbox and StartContainer.
fn cri_lifecycle(
    cri: &mut kata_topo_integration::Cri,
    v: Variant,
    round: usize,
) -> (Duration, Duration, Duration) {
    let name = format!("bench-{}-{round}", v.tag);
    let cfg = cri.pod_config(&name, &[]);
    let t = Instant::now();
    let pod = cri.run_pod(&cfg, v.handler).expect("RunPodSandbox");
    let run_pod = t.elapsed();
    let id = cri
        .create_container(&pod, &cfg, "app", &Resources::default(), false)
        .expect("CreateContainer");
    let s = Instant::now();
    cri.start(&id).expect("StartContainer");
    let start = s.elapsed();
    let mut client = cri.client.clone();
    let pod_id = pod.clone();
    cri.block(async move {
        client
            .stop_container(cri::StopContainerRequest {
                container_id: id.clone(),
                timeout: 0,
            })
            .await
            .expect("StopContainer");
        client
            .remove_container(cri::RemoveContainerRequest { container_id: id })
            .await
            .expect("RemoveContainer");
        client
            .stop_pod_sandbox(cri::StopPodSandboxRequest {
                pod_sandbox_id: pod_id.clone(),
            })
            .await
            .expect("StopPodSandbox");
        client
            .remove_pod_sandbox(cri::RemovePodSandboxRequest {
                pod_sandbox_id: pod_id,
            })
            .await
            .expect("RemovePodSandbox");
    });
    (t.elapsed(), run_pod, start)
}

fn round_trips(address: &str, service: &str, id: &str, n: usize) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut client = Client::connect(address, deadline).expect("connect");
    let payload = StateRequest {
        id: id.to_string(),
        exec_id: String::new(),
    }
    .encode_to_vec();
    for _ in 0..200 {
        client
            .call(service, "State", payload.clone(), "default", deadline)
            .expect("warm-up");
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client
            .call(service, "State", payload.clone(), "default", deadline)
            .expect("State");
        times.push(t.elapsed());
        assert_eq!(r.code(), 0);
    }
    times
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("KATA_TOPO_BIN_DIR").is_none() {
        eprintln!("note: KATA_TOPO_BIN_DIR unset; measuring the target/debug binaries");
    }
    let rounds = knob("KT_BENCH_ROUNDS", 100);
    let cri_rounds = knob("KT_BENCH_CRI_ROUNDS", 60);
    let calls = knob("KT_BENCH_STATE_CALLS", 6000);
    let cold = std::env::var("KT_BENCH_COLD").is_ok_and(|v| v == "1");
    let builds = Builds {
        tested: kata_topo_integration::bin_dir(),
        baseline: std::env::var_os("KT_BENCH_BASELINE_BIN").map(std::path::PathBuf::from),
    };

    let waited = Instant::now();
    let c = Containerd::start(Guard::default());
    let waited = waited.elapsed();
    c.use_live_topology();
    let version = String::from_utf8_lossy(&c.ctr(&["version"]).stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Version:").map(str::trim))
        .next_back()
        .unwrap_or("?")
        .to_string();
    // Asked for another containerd (KT_CONTAINERD_BIN, the harness's switch): make sure the
    // harness really runs it, and name the runc beside it.
    let other = std::env::var_os("KT_CONTAINERD_BIN").map(std::path::PathBuf::from);
    if let Some(dir) = &other {
        let asked = std::process::Command::new(dir.join("containerd"))
            .arg("--version")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        assert!(
            asked
                .split_whitespace()
                .any(|w| w.trim_start_matches('v') == version.trim_start_matches('v')),
            "KT_CONTAINERD_BIN={} is containerd {asked:?}, but the harness started {version}: \
             this harness does not honour KT_CONTAINERD_BIN",
            dir.display()
        );
    }
    let runc_bin = other
        .map(|d| d.join("runc"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "runc".into());
    let runc = std::process::Command::new(runc_bin)
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .unwrap_or("?")
                .to_string()
        })
        .unwrap_or_default();
    println!(
        "kata-topo wrapper benchmark: containerd {version} (server), {runc}, delegate containerd-shim-runc-v2"
    );
    println!(
        "  machine: {} CPUs, load average {} at the start; containerd up after {:.1} s (the harness's machine lock waits for others' tests)",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        waited.as_secs_f64()
    );
    println!("  the wrapper on the live topology (node-wide cache in its state_dir)");

    let mut variants = vec![
        Variant {
            name: "runc (the delegate)",
            tag: "runc",
            runtime: RUNC,
            handler: "runc",
            cold: false,
            baseline: false,
        },
        Variant {
            name: "kata-topo",
            tag: "kt",
            runtime: KT,
            handler: "kata-topo",
            cold: false,
            baseline: false,
        },
    ];
    if cold {
        variants.push(Variant {
            name: "kata-topo, topology_cache = false",
            tag: "kt-cold",
            runtime: KT,
            handler: "kata-topo",
            cold: true,
            baseline: false,
        });
    }
    if builds.baseline.is_some() {
        variants.push(Variant {
            name: "kata-topo, baseline build",
            tag: "kt-base",
            runtime: KT,
            handler: "kata-topo",
            cold: false,
            baseline: true,
        });
    }

    // Warm-up: images, page cache, the topology cache.
    interleaved(&c, &builds, &variants, 3, |v, r| {
        ctr_lifecycle(&c, v, 1000 + r)
    });

    // 1. ctr lifecycles.
    let life = interleaved(&c, &builds, &variants, rounds, |v, r| {
        ctr_lifecycle(&c, v, r)
    });
    let (life_med, life_p95, life_slow) = report("\n(1) ctr run --rm busybox true", &life);
    write_samples("ctr", &life);

    // 2. CRI pod lifecycles.
    let mut cri = c.cri();
    let mut run_pods: Vec<Series> = Vec::new();
    let mut starts: Vec<Series> = Vec::new();
    for v in &variants {
        run_pods.push(Series {
            name: v.name,
            samples: Vec::new(),
        });
        starts.push(Series {
            name: v.name,
            samples: Vec::new(),
        });
    }
    if cri_rounds > 0 {
        interleaved(&c, &builds, &variants, 2, |v, r| {
            cri_lifecycle(&mut cri, v, 1000 + r).0
        });
    }
    let pods = interleaved(&c, &builds, &variants, cri_rounds, |v, r| {
        let (total, run_pod, start) = cri_lifecycle(&mut cri, v, r);
        let i = variants
            .iter()
            .position(|x| x.name == v.name)
            .expect("variant");
        run_pods[i].samples.push(run_pod);
        starts[i].samples.push(start);
        total
    });
    let (cri_med, cri_p95, cri_slow) = report(
        "\n(2) CRI pod lifecycle (RunPodSandbox … RemovePodSandbox)",
        &pods,
    );
    write_samples("cri", &pods);
    report("    of which RunPodSandbox", &run_pods);
    report(
        "    of which StartContainer (the shim's Create and Start)",
        &starts,
    );

    // 3. State round trips to a running task, through the wrapper under test.
    set_guard_key(&c, "topology_cache", None);
    point_wrapper_at(&c, &builds.tested);
    ok(
        &c.ctr(&[
            "run",
            "-d",
            "--runtime",
            KT,
            BUSYBOX,
            "bench",
            "sleep",
            "600",
        ]),
        "ctr run -d",
    );
    let bundle = c
        .dir
        .path()
        .join("state/io.containerd.runtime.v2.task/default/bench");
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&bundle).join("kata-topo.json")).expect("kata-topo.json"),
    )
    .expect("JSON");
    let address = info["address"].as_str().expect("address").to_string();
    let delegate = info["delegate_address"]
        .as_str()
        .expect("delegate_address")
        .to_string();
    let service = if info["delegate_version"].as_u64() == Some(3) {
        TASK_V3
    } else {
        TASK_V2
    };
    let mut via_wrapper = Vec::new();
    let mut direct = Vec::new();
    for _ in 0..6 {
        direct.extend(round_trips(&delegate, service, "bench", calls.div_ceil(6)));
        via_wrapper.extend(round_trips(&address, service, "bench", calls.div_ceil(6)));
    }
    via_wrapper.sort();
    direct.sort();
    let (w50, w99) = (
        percentile(&via_wrapper, 0.5),
        percentile(&via_wrapper, 0.99),
    );
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    println!("\n(3) ttrpc State round trip, {calls} calls each, interleaved in blocks");
    println!(
        "    straight to the delegate : p50 {:>7.1} µs  p99 {:>7.1} µs",
        us(d50),
        us(d99)
    );
    println!(
        "    through the wrapper      : p50 {:>7.1} µs  p99 {:>7.1} µs",
        us(w50),
        us(w99)
    );
    let added50 = us(w50) - us(d50);
    println!("    added p50 {added50:.1} µs");

    // 4. The daemon serving that one task.
    let wrapper = c.pids_matching("kata-topo-daemon");
    let shim = c.pids_matching("containerd-shim-runc-v2");
    let (wr, wt) = wrapper.first().map_or((0, 0), |&p| rss_and_threads(p));
    let (dr, dt) = shim.first().map_or((0, 0), |&p| rss_and_threads(p));
    println!("\n(4) serving one task");
    println!(
        "    wrapper daemon : RSS {:>5.1} MiB, {wt} threads",
        wr as f64 / 1024.0
    );
    println!(
        "    delegate shim  : RSS {:>5.1} MiB, {dt} threads",
        dr as f64 / 1024.0
    );

    println!(
        "\ntargets (figures, not tests) — load average {} at the end",
        loadavg()
    );
    let mark = |met: bool| if met { "met" } else { "NOT met" };
    println!(
        "    ctr lifecycle: median ratio {life_med:.3} (<= 1.05: {}), p95 ratio {life_p95:.3} (<= 1.10: {}), {life_slow} over 2x the delegate's median ({})",
        mark(life_med <= 1.05),
        mark(life_p95 <= 1.10),
        mark(life_slow == 0)
    );
    println!(
        "    CRI lifecycle: median ratio {cri_med:.3} (<= 1.05: {}), p95 ratio {cri_p95:.3} (<= 1.10: {}), {cri_slow} over 2x the delegate's median ({})",
        mark(cri_med <= 1.05),
        mark(cri_p95 <= 1.10),
        mark(cri_slow == 0)
    );
    println!(
        "    State added p50 {added50:.1} µs (<= 20 µs: {})",
        mark(added50 <= 20.0)
    );
    println!(
        "    wrapper RSS {:.1} MiB (<= 6 MiB: {})",
        wr as f64 / 1024.0,
        mark(wr > 0 && wr <= 6 * 1024)
    );

    let _ = c.ctr(&["task", "kill", "-s", "KILL", "bench"]);
    std::thread::sleep(Duration::from_millis(300));
    let _ = c.ctr(&["task", "delete", "-f", "bench"]);
    let _ = c.ctr(&["container", "delete", "bench"]);
}
