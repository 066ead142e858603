//! `make soak`: many updates through the wrapper, in parallel, the way a busy node sends them —
//! and whether the wrapper daemons stay the same size while they do.
//!
//! SOAK_PODS pods (default 4) run through CRI on the kata-topo handler, each with one
//! container admitted on NUMA node 1 with the simulated GPU; one thread per pod then sends
//! SOAK_UPDATES cpuset pushes (default 2500 per pod, 10,000 in all), alternating between node 0
//! (a finding to log, publish and count) and node 1 (clean). It prints, per wrapper daemon,
//! resident memory, threads and open fds after a warm-up and at the end, its resident memory at
//! each quarter of the run with the growth of each half (a leak grows as much in the second
//! half as in the first), the update latency (median, p95, max), and the sinks' drop counters
//! from the metrics files.
//!
//! Target: RSS and threads flat after warm-up. A benchmark, not a test: it reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kata_topo_integration::{Containerd, Guard, Resources};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// (RSS KiB, threads, fds) of a process.
fn footprint(pid: u32) -> (u64, u64, usize) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0);
    (field("VmRSS:"), field("Threads:"), fds)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    let pods = env_usize("SOAK_PODS", 4).max(1);
    let updates = env_usize("SOAK_UPDATES", 2500).max(200);
    let warmup = 100;
    let c = Containerd::start(Guard {
        metrics: true,
        ..Guard::default()
    });
    let mut admitted = Vec::new();
    for i in 0..pods {
        let mut cri = c.cri();
        let (pod, _cfg, id) = cri.admit(
            &format!("soak-{i}"),
            &[("kata-topo.io/numa-nodes", "1")],
            true,
        );
        admitted.push((cri, pod, id));
    }
    let wrappers = c.pids_matching("kata-topo-daemon");
    println!(
        "soak: {pods} pods × {updates} cpuset pushes through {} wrapper daemons",
        wrappers.len()
    );
    // Warm-up: every pod's first pushes, then the footprint everything is compared with.
    let res = Resources::admitted();
    for (cri, _, id) in &mut admitted {
        for i in 0..warmup {
            let cpus = if i % 2 == 0 { "0" } else { "1" };
            cri.update(id, &res.on(cpus)).expect("warm-up update");
        }
    }
    let before: Vec<_> = wrappers.iter().map(|p| (*p, footprint(*p))).collect();
    // Every daemon's RSS twice a second over the run: a leak grows as much in the second half
    // as in the first, an allocator settling does not.
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (stop, pids) = (Arc::clone(&stop), wrappers.clone());
        std::thread::spawn(move || {
            let mut samples: Vec<Vec<u64>> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                samples.push(pids.iter().map(|p| footprint(*p).0).collect());
                std::thread::sleep(Duration::from_millis(500));
            }
            samples
        })
    };
    let started = Instant::now();
    let threads: Vec<_> = admitted
        .into_iter()
        .map(|(mut cri, pod, id)| {
            std::thread::spawn(move || {
                let res = Resources::admitted();
                let mut times = Vec::with_capacity(updates);
                for i in 0..updates {
                    let cpus = if i % 2 == 0 { "0" } else { "1" };
                    let t = Instant::now();
                    cri.update(&id, &res.on(cpus)).expect("update");
                    times.push(t.elapsed());
                }
                (cri, pod, times)
            })
        })
        .collect();
    let mut all = Vec::new();
    let mut done = Vec::new();
    for t in threads {
        let (cri, pod, times) = t.join().expect("pod thread");
        all.extend(times);
        done.push((cri, pod));
    }
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let samples = sampler.join().expect("sampler");
    let after: Vec<_> = wrappers.iter().map(|p| (*p, footprint(*p))).collect();
    all.sort();
    println!(
        "updates: {} in {:.1} s; latency median {:?}, p95 {:?}, max {:?}",
        all.len(),
        elapsed.as_secs_f64(),
        percentile(&all, 0.5),
        percentile(&all, 0.95),
        all.last().copied().unwrap_or_default()
    );
    println!(
        "wrapper daemon        RSS KiB (warm → end)   threads (warm → end)   fds (warm → end)"
    );
    for ((pid, (r0, t0, f0)), (_, (r1, t1, f1))) in before.iter().zip(&after) {
        println!(
            "  pid {pid:<8}          {r0:>6} → {r1:<6}         {t0:>3} → {t1:<3}              {f0:>3} → {f1:<3}"
        );
    }
    if samples.len() >= 5 {
        println!("wrapper daemon        RSS KiB at 0, ¼, ½, ¾ and all of the run   growth 1st half / 2nd half");
        for (i, (pid, _)) in before.iter().enumerate() {
            let at = |q: usize| samples[(samples.len() - 1) * q / 4][i];
            let (a, b, c, d, e) = (at(0), at(1), at(2), at(3), at(4));
            println!(
                "  pid {pid:<8}          {a} {b} {c} {d} {e}                  {:+} / {:+}",
                c as i64 - a as i64,
                e as i64 - c as i64
            );
        }
    }
    // Let the metrics writers catch up before reading their files.
    std::thread::sleep(Duration::from_secs(6));
    for sink in ["log", "journald", "events", "state"] {
        let label = format!("sink=\"{sink}\"");
        println!(
            "dropped by {sink:<9} {}",
            c.metric("kata_topo_sink_dropped_total", &label)
        );
    }
    println!("checks counted: {}", c.metric("kata_topo_checks_total", ""));
    for (mut cri, pod) in done {
        cri.remove_pod(&pod);
    }
    let left = c.wait_clean(Duration::from_secs(30));
    println!(
        "after removal: {}",
        if left.is_empty() {
            "nothing left".to_string()
        } else {
            format!("{left:?}")
        }
    );
}
