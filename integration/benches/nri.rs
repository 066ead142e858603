//! `kata-topo-nri` under 1,000 updates (`KT_BENCH_NRI_UPDATES`): containerd 2.x with NRI on, one
//! pod on the plain `runc` handler, in-place resizes through CRI. Prints the plugin's own
//! answer time to `UpdateContainer` (p50, p95, p99, max, from its `--debug` lines: from the
//! request read to the answer written) and the check's own time — a pod in audit mode, whose
//! requests are answered before their checks, then one in enforce mode (`kata-topo.io/mode`),
//! whose answers wait for their verdicts; the CRI round trip with
//! the plugin and without it (the plugin stopped: containerd then calls no plugin), and through
//! the wrapper (a pod on the `kata-topo` handler, no plugin). Then, beside the plugin's answer,
//! the wrapper's check of each `Update` (from its debug lines, in a containerd at debug: the
//! request waits for it). `KT_BENCH_NRI_UPDATES=0` leaves these out.
//!
//! Then the node with many pods (`KT_BENCH_PODS`, 100), on the plain `runc` handler, started
//! `KT_BENCH_PARALLEL` (10) at a time over CRI as the wrapper's node-scale bench starts them
//! (`node.rs`), in a containerd with NRI on and the live topology (through the node-wide
//! cache), metrics on, as the DaemonSet runs the plugin:
//!
//! 1. start: `KT_BENCH_PODS` pods with no plugin connected and as many with `kata-topo-nri`
//!    connected and checking every pod, in waves interleaved as `node.rs` interleaves its
//!    handlers (which leg goes first alternating every round): the plugin is started and
//!    registered before a wave of its leg and stopped (SIGTERM: it closes its connection)
//!    before a wave of the other, both legs on an equally full node under the same load.
//!    A plugin just started synchronises with every pod running (and writes their state):
//!    its leg's wave waits until it takes no more CPU time. Before every wave of either leg,
//!    a pause (`KT_BENCH_SETTLE_MS`, 1000 ms). Prints the start times (median, p95, max) of
//!    both and their ratios.
//! 2. memory: once every pod is removed, a new plugin (with `--debug`, for its answer times)
//!    connected with no pod, then with `KT_BENCH_PODS` pods it checks, then once they are
//!    all removed: its PSS (`smaps_rollup`), RSS and threads, and where the PSS is (`smaps`:
//!    the binary's text and data, the libraries, the heap, the thread stacks, other anonymous
//!    memory); its CPU time per pod; its answer time to each pod's CreateContainer.
//!
//! `KT_BENCH_NRI_START=0` leaves (1) out, for the memory alone.
//!
//! Targets (figures, not tests): the plugin's PSS with 100 pods <= 5 MiB; start ratio to the
//! plain handler <= 1.02 at the median and the p95.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kata_topo_integration::{
    bin_dir, eventually, workspace, Containerd, ContainerdBin, Cri, Guard, Resources,
};

mod pods;
mod stats;
use pods::{kb_field, knob, loadavg, mib, pss_kb, remove_all, rss_kb, start_pods, ticks, Leg};
use stats::{ms, percentile};

struct Plugin(Child);

/// How many of the log's lines are `event`.
fn events(c: &Containerd, event: &str) -> usize {
    c.log_lines().iter().filter(|l| l["event"] == event).count()
}

impl Plugin {
    /// `kata-topo-nri` on `c`'s configuration and NRI socket, registered and synchronised
    /// with the pods running.
    fn start(c: &Containerd, debug: bool) -> Self {
        let (registered, synchronized) =
            (events(c, "nri-registered"), events(c, "nri-synchronized"));
        let mut cmd = Command::new(bin_dir().join("kata-topo-nri"));
        cmd.arg("--config")
            .arg(&c.config)
            .arg("--socket")
            .arg(&c.nri_socket);
        if debug {
            cmd.arg("--debug");
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kata-topo-nri");
        let plugin = Self(child);
        let ready = || {
            events(c, "nri-registered") > registered && events(c, "nri-synchronized") > synchronized
        };
        assert!(
            eventually(Duration::from_secs(60), ready),
            "the plugin registered and synchronised"
        );
        plugin
    }

    /// Waits, up to a minute, until it has settled: no CPU time taken over 250 ms (a plugin
    /// just started writes the state of every pod it synchronised with). Returns how long
    /// that took.
    fn settle(&self) -> Duration {
        let stat = format!("/proc/{}/stat", self.0.id());
        let t = Instant::now();
        let mut before = ticks(Path::new(&stat));
        while t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(250));
            let now = ticks(Path::new(&stat));
            if now == before {
                break;
            }
            before = now;
        }
        t.elapsed()
    }

    /// Stops it as the kubelet stops the DaemonSet's pod (SIGTERM: it closes its connection,
    /// containerd goes on without it), killed when it has not exited within 10 s.
    fn stop(mut self) {
        let pid = nix::unistd::Pid::from_raw(self.0.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let exited = eventually(Duration::from_secs(10), || {
            matches!(self.0.try_wait(), Ok(Some(_)))
        });
        if !exited {
            eprintln!("kata-topo-nri did not exit on SIGTERM within 10 s; killed");
        }
    }

    /// The CPU time it took so far (utime + stime, every thread's), in ms.
    fn cpu_ms(&self) -> f64 {
        ticks(Path::new(&format!("/proc/{}/stat", self.0.id()))) as f64 * 1000.0
            / pods::clock_ticks()
    }

    /// PSS and RSS in kB, and threads.
    fn memory(&self) -> (u64, u64, u64) {
        let pid = [self.0.id()];
        let threads = kb_field(Path::new(&format!("/proc/{}/status", pid[0])), "Threads:");
        (pss_kb(&pid), rss_kb(&pid), threads)
    }

    /// Where its PSS is, in kB, by kind of mapping (`smaps`).
    fn breakdown(&self) -> Breakdown {
        Breakdown::of(self.0.id())
    }
}

/// A process's PSS by kind of mapping, in kB.
#[derive(Debug, Default, Clone, Copy)]
struct Breakdown {
    /// The binary's executable pages.
    text: u64,
    /// The binary's other pages (read-only data, relocations, its data).
    data: u64,
    /// Other files mapped: the C library, the loader, hwloc.
    libs: u64,
    /// The main malloc arena (`[heap]`).
    heap: u64,
    /// Anonymous mappings right after a guard page: the threads' stacks.
    stacks: u64,
    /// How many mappings those are.
    stack_maps: u64,
    /// The main thread's stack.
    main_stack: u64,
    /// Every other anonymous mapping (malloc's mmap'd chunks and other arenas).
    anon: u64,
}

impl Breakdown {
    fn of(pid: u32) -> Self {
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
        let binary = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        let mut b = Self::default();
        // (perms, path) of the mapping whose fields follow, and whether a guard page (no
        // access, no file) was right before it.
        let mut current: Option<(String, String, bool)> = None;
        let mut guard_before = false;
        for line in text.lines() {
            let mut parts = line.split_whitespace();
            let first = parts.next().unwrap_or("");
            if first.contains('-') && !first.ends_with(':') {
                let perms = parts.next().unwrap_or("").to_string();
                let path = parts.nth(3).unwrap_or("").to_string();
                let guard = perms.starts_with("---") && path.is_empty();
                current = Some((perms, path, guard_before));
                guard_before = guard;
                continue;
            }
            let (Some((perms, path, after_guard)), Some(kb)) = (
                &current,
                line.strip_prefix("Pss:")
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok()),
            ) else {
                continue;
            };
            if Path::new(path) == binary {
                if perms.contains('x') {
                    b.text += kb;
                } else {
                    b.data += kb;
                }
            } else if path.starts_with('/') {
                b.libs += kb;
            } else if path == "[heap]" {
                b.heap += kb;
            } else if path == "[stack]" {
                b.main_stack += kb;
            } else if path.is_empty() && *after_guard && perms.starts_with("rw") {
                b.stacks += kb;
                b.stack_maps += 1;
            } else {
                b.anon += kb;
            }
        }
        b
    }

    fn print(&self, when: &str) {
        println!(
            "    {when:<20} binary text {:.2}, binary data {:.2}, libraries {:.2}, heap {:.2}, thread stacks {:.2} ({} mappings), main stack {:.2}, other anonymous {:.2} MiB",
            mib(self.text),
            mib(self.data),
            mib(self.libs),
            mib(self.heap),
            mib(self.stacks),
            self.stack_maps,
            mib(self.main_stack),
            mib(self.anon)
        );
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn summary(name: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{name}: n={} p50 {:.3} ms, p95 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.95)),
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

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if std::env::var_os("KT_CONTAINERD_BIN").is_none() {
        std::env::set_var(
            "KT_CONTAINERD_BIN",
            workspace().join("target/containerd-2.3.4/bin"),
        );
    }
    assert!(ContainerdBin::get().is_v2(), "NRI needs containerd 2.x");
    if std::env::var_os("KATA_TOPO_BIN_DIR").is_none() {
        eprintln!("note: KATA_TOPO_BIN_DIR unset; measuring the target/debug binaries");
    }
    let n: usize = std::env::var("KT_BENCH_NRI_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    println!(
        "== kata-topo-nri, containerd {} (load average {} at the start)",
        ContainerdBin::get().version_text,
        loadavg()
    );
    if n > 0 {
        updates_bench(n);
    }
    node_bench(knob("KT_BENCH_PODS", 100), knob("KT_BENCH_PARALLEL", 10));
}

/// The plugin's answers and the CRI round trips of `n` resizes.
fn updates_bench(n: usize) {
    let admitted = Resources::admitted();
    {
        let c = Containerd::start(Guard {
            under: Some(workspace().join("target/nri-bench")),
            ..Guard::default()
        });
        let plugin = Plugin::start(&c, true);
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
        // In audit mode each update is answered before its check (nothing can be refused):
        // the checks run after, in order.
        let checked = || micros(&c, "request-checked", |l| l["operation"] == "update");
        assert!(
            eventually(Duration::from_secs(30), || checked().len() >= n),
            "the plugin's checks"
        );
        let checks = checked();
        // A pod in enforce mode: each answer waits for its verdict (these resizes are clean).
        let ecfg = cri.pod_config(
            "nri-bench-enforce",
            &[
                ("kata-topo.io/numa-nodes", "1"),
                ("kata-topo.io/mode", "enforce"),
            ],
        );
        let epod = cri.run_pod(&ecfg, "runc").expect("RunPodSandbox");
        let eid = cri
            .start_container(&epod, &ecfg, "app", &admitted, false)
            .expect("StartContainer");
        let before = answered().len();
        let enforced = updates(&mut cri, &eid, &admitted, n);
        assert!(
            eventually(Duration::from_secs(30), || answered().len() >= before + n),
            "the plugin's answer lines (enforce)"
        );
        let enforce_answers = answered().split_off(before);
        cri.remove_container(&eid);
        cri.remove_pod(&epod);
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
        summary(
            "plugin's answer to UpdateContainer (audit: before the check)",
            answers,
        );
        summary("  its check, after the answer", checks);
        summary(
            "plugin's answer to UpdateContainer (enforce: after the check)",
            enforce_answers,
        );
        println!("  answered without a verdict (the budget ran out): {unchecked}");
        summary("CRI UpdateContainerResources with the plugin", with);
        summary(
            "CRI UpdateContainerResources with the plugin, enforce",
            enforced,
        );
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

/// `pods` pods on the plain `runc` handler, `parallel` at a time: without the plugin and with
/// it, wave by wave; then the plugin's memory with as many pods.
fn node_bench(pods: usize, parallel: usize) {
    let parallel = parallel.min(pods);
    let settle = Duration::from_millis(knob("KT_BENCH_SETTLE_MS", 1000) as u64);
    let c = Containerd::start(Guard {
        under: Some(workspace().join("target/nri-bench")),
        metrics: true,
        ..Guard::default()
    });
    c.use_live_topology();
    println!(
        "\n== {pods} pods on runc, {parallel} at a time over CRI, NRI on ({} CPUs, load average {})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        loadavg()
    );
    let mut clients: Vec<Cri> = (0..parallel).map(|_| c.cri()).collect();
    // Warm-up: one pod (images, page cache), removed.
    let (warm, _) = start_pods(&mut clients[..1], "runc", "warm", 1);
    remove_all(&mut clients[..1], &warm);

    // 1. The legs wave by wave, the plugin connected for its leg's waves only
    // (`KT_BENCH_NRI_START=0`: not measured, for the memory alone).
    let (med, p95) = if std::env::var("KT_BENCH_NRI_START").as_deref() == Ok("0") {
        println!("\n(1) start: not measured (KT_BENCH_NRI_START=0)");
        (f64::NAN, f64::NAN)
    } else {
        start_bench(&c, &mut clients, pods, settle)
    };

    // 2. The plugin's memory: connected with no pod, with every pod, every pod removed. With
    // its debug lines: its answer to each pod's CreateContainer timed.
    let answered_before = micros(&c, "nri-answered", |l| l["method"] == "CreateContainer").len();
    let created = |c: &Containerd| {
        micros(c, "request-checked", |l| {
            l["operation"] == "create" || l["operation"] == "sandbox"
        })
    };
    let checked_before = created(&c).len();
    let plugin = Plugin::start(&c, true);
    // What the plugin holds connected, before any pod (the topology loaded at its start).
    std::thread::sleep(Duration::from_secs(2));
    let idle = plugin.memory();
    let idle_where = plugin.breakdown();
    let cpu_before = plugin.cpu_ms();
    let (ids, _) = start_pods(&mut clients, "runc", "mem", pods);
    // Every pod checked: its state written (the sandbox's baseline, for `kata-topo status`).
    let checked = || {
        ids.iter()
            .filter(|id| {
                c.state_dir
                    .join("k8s.io")
                    .join(id)
                    .join("sandbox.json")
                    .exists()
            })
            .count()
    };
    let all_checked = eventually(Duration::from_secs(60), || checked() == ids.len());
    std::thread::sleep(Duration::from_secs(2));
    let full = plugin.memory();
    let full_where = plugin.breakdown();
    let cpu_started = plugin.cpu_ms();
    let checked_n = checked();
    // Each checked pod's own textfile, written by the plugin's one metrics thread.
    let metrics_files = ids
        .iter()
        .filter(|id| {
            c.metrics_dir
                .join(kata_topo_sinks::metrics::file_name("k8s.io", id))
                .exists()
        })
        .count();
    let skipped = events(&c, "nri-pod-skipped");
    remove_all(&mut clients, &ids);
    std::thread::sleep(Duration::from_secs(2));
    let after = plugin.memory();
    let after_where = plugin.breakdown();
    let cpu_removed = plugin.cpu_ms();
    drop(plugin);

    println!(
        "\n(2) the plugin's memory (a new plugin; {pods} pods started {parallel} at a time with it)"
    );
    println!(
        "    pods checked (their state written): {} of {}{}; metrics textfiles: {metrics_files}; skipped: {skipped}",
        checked_n,
        ids.len(),
        if all_checked { "" } else { " (NOT all)" }
    );
    for (when, (pss, rss, threads)) in [
        ("connected, no pod", idle),
        ("with every pod", full),
        ("every pod removed", after),
    ] {
        println!(
            "    {when:<20} PSS {:>6.2} MiB, RSS {:>6.2} MiB, {threads} threads",
            mib(pss),
            mib(rss)
        );
    }
    println!(
        "    per pod: PSS {:.1} KiB, RSS {:.1} KiB",
        full.0.saturating_sub(idle.0) as f64 / pods as f64,
        full.1.saturating_sub(idle.1) as f64 / pods as f64
    );
    println!(
        "    its CPU time (utime + stime): {:.1} ms per pod started and checked, {:.1} ms per pod removed",
        (cpu_started - cpu_before) / pods as f64,
        (cpu_removed - cpu_started) / pods as f64
    );
    let mut answers = micros(&c, "nri-answered", |l| l["method"] == "CreateContainer");
    summary(
        "    its answer to CreateContainer (from the request read to the answer written)",
        answers.split_off(answered_before.min(answers.len())),
    );
    // The checks themselves (a pod's first CreateContainer checks its sandbox and its
    // container), after the answer: these pods are in audit mode.
    let mut checks = created(&c);
    summary(
        "    each check of a create (the sandbox's, the container's; after the answer, audit)",
        checks.split_off(checked_before.min(checks.len())),
    );
    println!("  where the PSS is (smaps):");
    idle_where.print("connected, no pod");
    full_where.print("with every pod");
    after_where.print("every pod removed");
    let mark = |met: bool| if met { "met" } else { "NOT met" };
    println!(
        "\ntargets (figures, not tests) — load average {} at the end",
        loadavg()
    );
    println!(
        "    plugin PSS with {pods} pods {:.2} MiB (<= 5 MiB: {})",
        mib(full.0),
        mark(mib(full.0) <= 5.0)
    );
    if med.is_nan() {
        println!("    start ratio: not measured");
    } else {
        println!(
            "    start ratio median {med:.3}, p95 {p95:.3} (<= 1.02: {}, {})",
            mark(med <= 1.02),
            mark(p95 <= 1.02)
        );
    }
}

/// (1) of [`node_bench`]: `pods` pods on each leg, wave by wave; the start ratios' median and
/// p95.
fn start_bench(c: &Containerd, clients: &mut [Cri], pods: usize, settle: Duration) -> (f64, f64) {
    let mut legs = [
        Leg::new("runc, no plugin", "runc", "plain"),
        Leg::new("runc, kata-topo-nri", "runc", "nri"),
    ];
    let mut plugin: Option<Plugin> = None;
    let (mut starts, mut stops) = (0, 0);
    let mut settled = Duration::ZERO;
    let started_all = Instant::now();
    pods::interleaved(clients, &mut legs, pods, |leg| {
        match (leg, plugin.take()) {
            (1, None) => {
                let p = Plugin::start(c, false);
                settled = settled.max(p.settle());
                plugin = Some(p);
                starts += 1;
            }
            (1, running) => plugin = running,
            (_, Some(running)) => {
                running.stop();
                stops += 1;
            }
            (_, None) => {}
        }
        std::thread::sleep(settle);
    });
    let start_secs = started_all.elapsed().as_secs_f64();
    if let Some(p) = plugin.take() {
        p.stop();
    }
    let all: Vec<String> = legs.iter().flat_map(|l| l.pods.clone()).collect();
    remove_all(clients, &all);
    println!(
        "\n(1) start: RunPodSandbox + CreateContainer + StartContainer per pod, the legs wave by wave ({:.0} s for all {}; the plugin started {starts} times, stopped {stops}; {} ms before each wave, and a plugin just started settled first, in {:.1} s at most)",
        start_secs,
        all.len(),
        settle.as_millis(),
        settled.as_secs_f64()
    );
    pods::print_header();
    let without = legs[0].starts.clone();
    pods::print_row(legs[0].name, &without, &without);
    let (med, p95, _) = pods::print_row(legs[1].name, &legs[1].starts, &without);
    println!("    load average {} after the starts", loadavg());
    (med, p95)
}
