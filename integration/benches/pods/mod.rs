//! Many pods on one node over CRI, as the node-scale benchmarks (`node`, `nri`) start them:
//! waves of pods started at once (RunPodSandbox, CreateContainer, StartContainer — as the
//! kubelet's parallel pod workers would), their start times summarised the same way, and
//! the memory of the processes that serve them (`smaps_rollup`'s `Pss`, `status`'s `VmRSS`).
//! Each bench uses the part it needs.
#![allow(dead_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use kata_topo_integration::{Cri, Resources};

use crate::stats::{ms, percentile};

/// A positive number from the environment, else `default`.
pub fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|v| *v > 0)
        .unwrap_or(default)
}

/// The machine's load average (1, 5, 15 minutes).
pub fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// A `kB` field of a `/proc` file (`Pss:` of `smaps_rollup`); 0 when unreadable.
pub fn kb_field(path: &Path, name: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// utime + stime of a process or a thread (`/proc/PID/stat` or `/proc/PID/task/TID/stat`), in
/// clock ticks.
pub fn ticks(stat: &Path) -> u64 {
    let text = std::fs::read_to_string(stat).unwrap_or_default();
    // After the command name (which may hold spaces) in parentheses: state is field 3, utime 14.
    let fields: Vec<&str> = text
        .rsplit_once(") ")
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let at = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    at(11) + at(12)
}

/// USER_HZ, the unit of `/proc`'s utime and stime (100 on every Linux ABI kata-topo runs on).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(100.0)
}

/// The proportional set size of processes, in kB (a page shared by n processes counts 1/n
/// to each, so the sum is what the node pays).
pub fn pss_kb(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|p| kb_field(Path::new(&format!("/proc/{p}/smaps_rollup")), "Pss:"))
        .sum()
}

/// The resident set size of processes, in kB.
pub fn rss_kb(pids: &[u32]) -> u64 {
    pids.iter()
        .map(|p| kb_field(Path::new(&format!("/proc/{p}/status")), "VmRSS:"))
        .sum()
}

/// kB in MiB.
pub fn mib(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// One wave: `names.len()` pods started at once on `handler`, one client each; the pod ids
/// and the time from RunPodSandbox to the end of StartContainer of each.
pub fn wave(clients: &mut [Cri], handler: &str, names: &[String]) -> Vec<(String, Duration)> {
    std::thread::scope(|s| {
        let handles: Vec<_> = clients
            .iter_mut()
            .zip(names)
            .map(|(cri, name)| {
                s.spawn(move || {
                    let cfg = cri.pod_config(name, &[]);
                    let t = Instant::now();
                    let pod = cri
                        .run_pod(&cfg, handler)
                        .unwrap_or_else(|e| panic!("RunPodSandbox {name} on {handler}: {e}"));
                    cri.start_container(&pod, &cfg, "app", &Resources::default(), false)
                        .unwrap_or_else(|e| panic!("StartContainer {name} on {handler}: {e}"));
                    (pod, t.elapsed())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("a start thread panicked"))
            .collect()
    })
}

/// `count` pods named `<prefix>-<i>` started on `handler`, `clients.len()` at a time; their
/// ids and start times.
pub fn start_pods(
    clients: &mut [Cri],
    handler: &str,
    prefix: &str,
    count: usize,
) -> (Vec<String>, Vec<Duration>) {
    let (mut pods, mut starts) = (Vec::new(), Vec::new());
    let mut first = 0;
    while first < count {
        let n = clients.len().min(count - first);
        let names: Vec<String> = (first..first + n)
            .map(|i| format!("{prefix}-{i}"))
            .collect();
        for (pod, d) in wave(&mut clients[..n], handler, &names) {
            pods.push(pod);
            starts.push(d);
        }
        first += n;
    }
    (pods, starts)
}

/// One side of an interleaved start measurement: pods named `<prefix>-<i>` on `handler`,
/// and what they became.
#[derive(Debug)]
pub struct Leg {
    /// The row's name.
    pub name: &'static str,
    /// The runtime handler.
    pub handler: &'static str,
    /// The pods' name prefix.
    pub prefix: &'static str,
    /// The pods started, in order.
    pub pods: Vec<String>,
    /// Their start times.
    pub starts: Vec<Duration>,
}

impl Leg {
    /// A leg with no pod yet.
    pub fn new(name: &'static str, handler: &'static str, prefix: &'static str) -> Self {
        Self {
            name,
            handler,
            prefix,
            pods: Vec::new(),
            starts: Vec::new(),
        }
    }
}

/// `count` pods per leg in waves of `clients.len()`, the legs taking turns wave by wave
/// (which one goes first alternating every round), so that every leg starts its pods on an
/// equally full node and under the same machine load; `before(i)` runs before each wave of
/// leg `i` (to connect or disconnect a plugin, say).
pub fn interleaved(
    clients: &mut [Cri],
    legs: &mut [Leg],
    count: usize,
    mut before: impl FnMut(usize),
) {
    let mut first = 0;
    let mut round = 0;
    while first < count {
        let n = clients.len().min(count - first);
        for k in 0..legs.len() {
            let i = (round + k) % legs.len();
            before(i);
            let leg = &mut legs[i];
            let names: Vec<String> = (first..first + n)
                .map(|j| format!("{}-{j}", leg.prefix))
                .collect();
            for (pod, d) in wave(&mut clients[..n], leg.handler, &names) {
                leg.pods.push(pod);
                leg.starts.push(d);
            }
        }
        first += n;
        round += 1;
    }
}

/// Stops and removes pods, `clients.len()` at a time.
pub fn remove_all(clients: &mut [Cri], pods: &[String]) {
    for chunk in pods.chunks(clients.len().max(1)) {
        std::thread::scope(|s| {
            for (cri, pod) in clients.iter_mut().zip(chunk) {
                s.spawn(move || cri.remove_pod(pod));
            }
        });
    }
}

/// Median, p95 and max of start times (zero when there are none).
pub fn summary(starts: &[Duration]) -> (Duration, Duration, Duration) {
    let mut s = starts.to_vec();
    s.sort();
    match s.last() {
        Some(max) => (percentile(&s, 0.5), percentile(&s, 0.95), *max),
        None => (Duration::ZERO, Duration::ZERO, Duration::ZERO),
    }
}

/// `a / b`.
pub fn ratio(a: Duration, b: Duration) -> f64 {
    a.as_secs_f64() / b.as_secs_f64()
}

/// The start table's header.
pub fn print_header() {
    println!(
        "    {:<30} {:>9} {:>9} {:>9}   {:>6} {:>6} {:>6}",
        "", "median", "p95", "max", "×med", "×p95", "×max"
    );
}

/// One row of the start table: `starts`' median, p95 and max, and their ratios to `base`'s;
/// returns the ratios.
pub fn print_row(name: &str, starts: &[Duration], base: &[Duration]) -> (f64, f64, f64) {
    let (m, p, x) = summary(starts);
    let (bm, bp, bx) = summary(base);
    let r = (ratio(m, bm), ratio(p, bp), ratio(x, bx));
    println!(
        "    {:<30} {:>6.0} ms {:>6.0} ms {:>6.0} ms   {:>6.3} {:>6.3} {:>6.3}",
        format!("{name} ({})", starts.len()),
        ms(m),
        ms(p),
        ms(x),
        r.0,
        r.1,
        r.2
    );
    r
}
