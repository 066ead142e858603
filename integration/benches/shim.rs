//! `make bench`: the wrapper's cost, side by side in one run through the same containerd.
//!
//! (a) a ttrpc `State` round trip to a task through the wrapper vs straight to the delegate
//!     (p50, p99, ratio, added p50);
//! (b) `ctr run --rm` of a busybox `true` with the kata-topo handler vs the runc handler
//!     (median ratio);
//! (c) resident memory of the wrapper daemon vs the delegate shim.
//!
//! Targets: added p50 under 50 µs, lifecycle ratio at most 1.10, wrapper RSS under 8 MiB.
//! Uses the release binaries (`make bench` builds them).

use std::path::Path;
use std::time::{Duration, Instant};

use kata_topo_integration::{Containerd, Guard, BUSYBOX};
use kata_topo_sinks::ttrpc::{Client, TASK_V2};
use prost::Message;

#[derive(Clone, PartialEq, Message)]
struct StateRequest {
    #[prost(string, tag = "1")]
    id: String,
    #[prost(string, tag = "2")]
    exec_id: String,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn round_trips(address: &str, id: &str, n: usize) -> Vec<Duration> {
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut client = Client::connect(address, deadline).expect("connect");
    let payload = StateRequest {
        id: id.to_string(),
        exec_id: String::new(),
    }
    .encode_to_vec();
    for _ in 0..200 {
        client
            .call(TASK_V2, "State", payload.clone(), "default", deadline)
            .expect("warm-up");
    }
    let mut times = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let r = client
            .call(TASK_V2, "State", payload.clone(), "default", deadline)
            .expect("State");
        times.push(t.elapsed());
        assert_eq!(r.code(), 0);
    }
    times
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("KATA_TOPO_BIN_DIR").is_none() {
        eprintln!("note: KATA_TOPO_BIN_DIR unset; measuring the target/debug binaries");
    }
    let c = Containerd::start(Guard::default());
    let out = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        "io.containerd.kata-topo.v2",
        BUSYBOX,
        "bench",
        "sleep",
        "600",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = c
        .dir
        .path()
        .join("state/io.containerd.runtime.v2.task/default/bench");
    // The bundle's record of the wrapper and its delegate (`kata-topo.json`).
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(Path::new(&bundle).join("kata-topo.json")).expect("kata-topo.json"),
    )
    .expect("JSON");
    let address = info["address"].as_str().expect("address").to_string();
    let delegate_address = info["delegate_address"]
        .as_str()
        .expect("delegate_address")
        .to_string();

    // (a) interleaved halves, so drift on a shared machine hits both sides alike.
    let n = 6000;
    let mut via_wrapper = Vec::new();
    let mut direct = Vec::new();
    for _ in 0..3 {
        direct.extend(round_trips(&delegate_address, "bench", n / 3));
        via_wrapper.extend(round_trips(&address, "bench", n / 3));
    }
    via_wrapper.sort();
    direct.sort();
    let (w50, w99) = (
        percentile(&via_wrapper, 0.5),
        percentile(&via_wrapper, 0.99),
    );
    let (d50, d99) = (percentile(&direct, 0.5), percentile(&direct, 0.99));
    println!("(a) ttrpc State round trip, {n} calls each");
    println!(
        "    direct to the delegate : p50 {:>8.1} µs  p99 {:>8.1} µs",
        us(d50),
        us(d99)
    );
    println!(
        "    through the wrapper    : p50 {:>8.1} µs  p99 {:>8.1} µs",
        us(w50),
        us(w99)
    );
    println!(
        "    ratio p50 {:.2}  p99 {:.2}  added p50 {:.1} µs (target < 50 µs)",
        w50.as_secs_f64() / d50.as_secs_f64(),
        w99.as_secs_f64() / d99.as_secs_f64(),
        us(w50) - us(d50)
    );

    // (c) measured now, with one task served.
    let wrapper = c.pids_matching("kata-topo-daemon");
    let delegate = c.pids_matching("containerd-shim-runc-v2");
    let (wr, dr) = (
        wrapper.first().map_or(0, |&p| rss_kib(p)),
        delegate.first().map_or(0, |&p| rss_kib(p)),
    );

    // (b)
    let rounds = 15;
    let mut kt = Vec::new();
    let mut runc = Vec::new();
    for i in 0..rounds {
        for (runtime, times) in [
            ("io.containerd.kata-topo.v2", &mut kt),
            ("io.containerd.runc.v2", &mut runc),
        ] {
            let id = format!("life-{i}-{}", times.len());
            let t = Instant::now();
            let out = c.ctr(&["run", "--rm", "--runtime", runtime, BUSYBOX, &id, "true"]);
            times.push(t.elapsed());
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    let (mk, mr) = (median(kt), median(runc));
    println!("(b) ctr run --rm busybox true, median of {rounds}");
    println!(
        "    kata-topo {:.1} ms  runc {:.1} ms  ratio {:.3} (target <= 1.10)",
        mk.as_secs_f64() * 1e3,
        mr.as_secs_f64() * 1e3,
        mk.as_secs_f64() / mr.as_secs_f64()
    );
    println!("(c) resident memory");
    println!(
        "    wrapper daemon {:.1} MiB  delegate shim {:.1} MiB  ratio {:.2} (target wrapper < 8 MiB)",
        wr as f64 / 1024.0,
        dr as f64 / 1024.0,
        wr as f64 / dr.max(1) as f64
    );
    let _ = c.ctr(&["task", "kill", "-s", "KILL", "bench"]);
    std::thread::sleep(Duration::from_millis(300));
    let _ = c.ctr(&["task", "delete", "-f", "bench"]);
    let _ = c.ctr(&["container", "delete", "bench"]);
}
