//! `make bench`, node scale: many pods on one node, through the wrapper and through runc's shim
//! directly, side by side in one run of the harness's containerd (the one on PATH, or
//! `KT_CONTAINERD_BIN`), the wrapper on the live topology:
//!
//! 1. start: `KT_BENCH_PODS` pods per handler (default 100), `KT_BENCH_PARALLEL` at a time
//!    (default 10, like the kubelet's parallel pod workers) over CRI — RunPodSandbox,
//!    CreateContainer, StartContainer — in waves alternating between the handlers, so both
//!    start on an equally full node; median, p95 and max of each and their ratios;
//! 2. memory: the proportional set size (`Pss` of `/proc/PID/smaps_rollup`: a page shared by
//!    n processes counts 1/n to each, so the sum is what the node pays) of every wrapper
//!    daemon and of every runc shim, per pod;
//! 3. file descriptors per wrapper daemon and per runc shim;
//! 4. idle: with every pod running, the CPU time (utime + stime) all wrapper daemons and all
//!    runc shims take over `KT_BENCH_IDLE_SECONDS` (default 60), as a share of one core; and
//!    the scheduler's exact count (`schedstat`) of the wrappers' threads and, of it, their
//!    `topology-refresh` threads (the periodic topology refresh, summed over all daemons).
//!
//! Targets (figures, not tests): PSS <= 1 MiB per pod, idle CPU of all wrapper daemons <= 0.5 %
//! of a core, start p95 ratio <= 1.10. `KT_BENCH_PODS=20` is a quick check. Uses the release
//! binaries (`make bench` builds them).

mod pods;
mod stats;

use std::path::Path;
use std::time::{Duration, Instant};

use kata_topo_integration::{Containerd, Cri, Guard};
use pods::{knob, loadavg, remove_all, ticks, wave, Leg};

/// The CPU time, in ns, of a process's threads whose name starts with `prefix` (the
/// scheduler's own count, `schedstat`'s first field: exact where utime and stime are sampled at
/// each tick and miss a thread that runs for a fraction of a millisecond now and then).
fn thread_ns(pid: u32, prefix: &str) -> u64 {
    let dir = format!("/proc/{pid}/task");
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|t| {
            std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with(prefix))
        })
        .filter_map(|t| {
            std::fs::read_to_string(t.path().join("schedstat"))
                .ok()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("KATA_TOPO_BIN_DIR").is_none() {
        eprintln!("note: KATA_TOPO_BIN_DIR unset; measuring the target/debug binaries");
    }
    let pods = knob("KT_BENCH_PODS", 100);
    let parallel = knob("KT_BENCH_PARALLEL", 10).min(pods);
    let idle = Duration::from_secs(knob("KT_BENCH_IDLE_SECONDS", 60) as u64);
    let tick = pods::clock_ticks();

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
    let refresh = std::fs::read_to_string(&c.config)
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("topology_refresh_seconds")
                .map(|v| v.trim_start_matches([' ', '=']).trim().to_string())
        })
        .unwrap_or_else(|| "the default".into());
    println!(
        "kata-topo node-scale benchmark: containerd {version}, {pods} pods per handler started {parallel} at a time over CRI"
    );
    println!(
        "  machine: {} CPUs, load average {} at the start; containerd up after {:.1} s; topology_refresh_seconds {refresh}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg(),
        waited.as_secs_f64()
    );

    let mut clients: Vec<Cri> = (0..parallel).map(|_| c.cri()).collect();
    let mut handlers = [
        Leg::new("runc (the delegate)", "runc", "node-runc"),
        Leg::new("kata-topo", "kata-topo", "node-kt"),
    ];
    // Warm-up: one pod each (images, page cache, the node-wide topology cache), removed.
    for h in &handlers {
        let names = vec![format!("warm-{}", h.prefix)];
        let started = wave(&mut clients[..1], h.handler, &names);
        remove_all(&mut clients[..1], &[started[0].0.clone()]);
    }

    // 1. Waves of `parallel`, alternating which handler goes first.
    let started_all = Instant::now();
    pods::interleaved(&mut clients, &mut handlers, pods, |_| {});
    let start_secs = started_all.elapsed().as_secs_f64();
    println!(
        "\n(1) start: RunPodSandbox + CreateContainer + StartContainer per pod, {parallel} in parallel ({:.0} s for all {})",
        start_secs,
        2 * pods
    );
    pods::print_header();
    let mut p95_ratio = 0.0;
    for h in &handlers {
        p95_ratio = pods::print_row(h.name, &h.starts, &handlers[0].starts).1;
    }

    // 2. and 3. Memory and descriptors with every pod running.
    let wrappers = c.pids_matching("kata-topo-daemon");
    let shims: Vec<u32> = c
        .pids_matching("containerd-shim-runc-v2")
        .into_iter()
        .filter(|p| !wrappers.contains(p))
        .collect();
    let (wpss, spss) = (pods::pss_kb(&wrappers), pods::pss_kb(&shims));
    let (wrss, srss) = (pods::rss_kb(&wrappers), pods::rss_kb(&shims));
    let mib = |kb: u64, n: usize| kb as f64 / 1024.0 / n.max(1) as f64;
    println!("\n(2) memory with all {} pods running", 2 * pods);
    println!(
        "    wrapper daemons : {:>3} processes, PSS {:>6.1} MiB in all, {:.2} MiB per kata-topo pod (RSS {:.1} MiB each)",
        wrappers.len(),
        mib(wpss, 1),
        mib(wpss, pods),
        mib(wrss, wrappers.len())
    );
    println!(
        "    runc shims      : {:>3} processes, PSS {:>6.1} MiB in all, {:.2} MiB per shim (RSS {:.1} MiB each)",
        shims.len(),
        mib(spss, 1),
        mib(spss, shims.len()),
        mib(srss, shims.len())
    );
    let fd_line = |pids: &[u32]| {
        let mut n: Vec<usize> = pids.iter().map(|p| fds(*p)).collect();
        n.sort_unstable();
        if n.is_empty() {
            return "none".to_string();
        }
        format!(
            "min {} median {} max {}",
            n[0],
            n[n.len() / 2],
            n[n.len() - 1]
        )
    };
    println!("\n(3) file descriptors");
    println!("    per wrapper daemon : {}", fd_line(&wrappers));
    println!("    per runc shim      : {}", fd_line(&shims));

    // 4. Idle CPU over a minute.
    let sum_ticks = |pids: &[u32]| -> u64 {
        pids.iter()
            .map(|p| ticks(Path::new(&format!("/proc/{p}/stat"))))
            .sum()
    };
    let refresh_ns =
        |pids: &[u32]| -> u64 { pids.iter().map(|p| thread_ns(*p, "topology-ref")).sum() };
    let all_ns = |pids: &[u32]| -> u64 { pids.iter().map(|p| thread_ns(*p, "")).sum() };
    let (w0, s0, r0, a0) = (
        sum_ticks(&wrappers),
        sum_ticks(&shims),
        refresh_ns(&wrappers),
        all_ns(&wrappers),
    );
    let t0 = Instant::now();
    std::thread::sleep(idle);
    let secs = t0.elapsed().as_secs_f64();
    let (w1, s1, r1, a1) = (
        sum_ticks(&wrappers),
        sum_ticks(&shims),
        refresh_ns(&wrappers),
        all_ns(&wrappers),
    );
    let share = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / tick / secs * 100.0;
    let share_ns = |a: u64, b: u64| (b.saturating_sub(a)) as f64 / 1e9 / secs * 100.0;
    let (wcpu, scpu) = (share(w0, w1), share(s0, s1));
    let (rcpu, acpu) = (share_ns(r0, r1), share_ns(a0, a1));
    println!(
        "\n(4) idle over {secs:.0} s, every pod running (CPU time as a share of one core, {tick} ticks/s)"
    );
    println!(
        "    all {} wrapper daemons : {wcpu:.3} % (utime + stime); the scheduler's count {acpu:.3} %, of which the topology refresh threads {rcpu:.3} % ({:.2} ms of CPU per daemon per minute)",
        wrappers.len(),
        (r1.saturating_sub(r0)) as f64 / 1e6 / wrappers.len().max(1) as f64 * 60.0 / secs
    );
    println!("    all {} runc shims      : {scpu:.3} %", shims.len());

    println!(
        "\ntargets (figures, not tests) — load average {} at the end",
        loadavg()
    );
    let mark = |met: bool| if met { "met" } else { "NOT met" };
    let per_pod = mib(wpss, pods);
    println!(
        "    wrapper PSS per pod {per_pod:.2} MiB (<= 1 MiB: {})",
        mark(per_pod <= 1.0)
    );
    println!(
        "    idle CPU of {} wrapper daemons {wcpu:.3} % of a core (<= 0.5 %: {})",
        wrappers.len(),
        mark(wcpu <= 0.5)
    );
    println!(
        "    start p95 ratio {p95_ratio:.3} at {parallel} in parallel (<= 1.10: {})",
        mark(p95_ratio <= 1.10)
    );

    let all: Vec<String> = handlers.iter().flat_map(|h| h.pods.clone()).collect();
    let t = Instant::now();
    remove_all(&mut clients, &all);
    println!(
        "\nremoved all {} pods in {:.0} s",
        all.len(),
        t.elapsed().as_secs_f64()
    );
}
