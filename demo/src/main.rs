//! `make demo`: a private containerd (Debian's 1.6, or `KT_CONTAINERD_BIN`'s) with the `kata-topo` runtime handler (delegating to runc),
//! a simulated two-node host whose nodes are this machine's CPUs 0 and 1 with a GPU passed
//! through with VFIO on node 1, a pod run through CRI — and what an operator sees when in-place
//! updates move it across NUMA nodes.

use std::io::IsTerminal;
use std::process::Command;
use std::time::Duration;

use kata_topo_integration::{bin_dir, workspace, Containerd, ContainerdBin, Guard, Resources};

/// Bold headings only on a terminal, and not when `NO_COLOR` is set to anything but the
/// empty string (no-color.org): a log or a pipe gets plain text.
fn bold(is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn heading(title: &str, bold: bool) -> String {
    if bold {
        format!("\n\x1b[1m== {title}\x1b[0m")
    } else {
        format!("\n== {title}")
    }
}

fn step(title: &str) {
    let bold = bold(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    println!("{}", heading(title, bold));
}

fn show_findings(c: &Containerd, seen: &mut usize) {
    let lines = c.findings();
    if lines.len() == *seen {
        println!("(no new finding in {})", c.log_file.display());
    }
    for l in &lines[*seen..] {
        println!("log: {l}");
    }
    *seen = lines.len();
}

fn main() {
    let c = Containerd::start(Guard::default());
    let bins = ContainerdBin::get();
    // containerd 2.3's `ctr events` cannot print kata-topo's StringValue payload: on 2.x the
    // operator reads the events with `kata-topo events`.
    let reader = if bins.is_v2() {
        "kata-topo events"
    } else {
        "ctr events"
    };
    let events = c.operator_events();
    let mut seen = 0;

    step(&format!(
        "The node: containerd {} with runtime handler kata-topo -> containerd-shim-kata-topo-v2 -> containerd-shim-runc-v2",
        bins.version_text
    ));
    println!("{}", std::fs::read_to_string(&c.config).unwrap_or_default());
    let topo = Command::new(bin_dir().join("kata-topo"))
        .arg("topology")
        .arg("--topology")
        .arg(workspace().join("scenario/two-node-host.xml"))
        .arg("--sysfs")
        .arg(c.sysfs.root())
        .output()
        .expect("kata-topo topology");
    print!("{}", String::from_utf8_lossy(&topo.stdout));

    step(
        "Pod ml/trainer-pod (single-numa-node, numa-nodes 1) starts on CPU 1 with GPU /dev/vfio/42",
    );
    println!(
        "(kata-topo-cri plays the kubelet here, through CRI; make k8s-test runs the real one)"
    );
    let mut cri = c.cri();
    let annotations = [
        ("kata-topo.io/policy", "single-numa-node"),
        ("kata-topo.io/numa-nodes", "1"),
    ];
    let cfg = cri.pod_config("trainer-pod", &annotations);
    let pod = cri.run_pod(&cfg, "kata-topo").expect("RunPodSandbox");
    let admitted = Resources::admitted();
    let id = cri
        .start_container(&pod, &cfg, "trainer", &admitted, true)
        .expect("StartContainer");
    println!("container {id} runs on CPUs {}", cri.allowed_cpus(&id));
    if let Some(started) = c
        .log_lines()
        .into_iter()
        .find(|l| l["event"] == "daemon-started")
    {
        println!(
            "the pod's wrapper runs with configuration {} (from {})",
            started["config"].as_str().unwrap_or("none"),
            started["config_source"].as_str().unwrap_or("-")
        );
    }
    show_findings(&c, &mut seen);

    step("In-place resize (KEP-1287): quota 1.5 CPUs, 512 MiB, same cpuset");
    let resized = Resources {
        quota: 150_000,
        memory: 512 << 20,
        ..admitted.clone()
    };
    cri.update(&id, &resized).expect("resize");
    show_findings(&c, &mut seen);

    step("A CPU-manager push of cpuset 0 (node 0): the GPU's DMA now crosses sockets");
    let pushed = resized.on("0");
    cri.update(&id, &pushed).expect("audit mode forwards");
    println!("container {id} now runs on CPUs {}", cri.allowed_cpus(&id));
    show_findings(&c, &mut seen);
    if let Some(line) = events.wait_for("/kata-topo/mismatch", Duration::from_secs(5)) {
        println!("{reader}: {line}");
    }

    step("The same cpuset pushed again, as the reconcile loop does: not announced again");
    cri.update(&id, &pushed).expect("repeat");
    show_findings(&c, &mut seen);

    step("The container is recreated in its running pod (image update) with cpuset 0-1");
    cri.remove_container(&id);
    let recreated = cri
        .start_container(&pod, &cfg, "trainer", &admitted.on("0-1"), true)
        .expect("recreate");
    show_findings(&c, &mut seen);
    cri.remove_container(&recreated);
    cri.remove_pod(&pod);

    step("Enforce mode (kata-topo.io/mode: enforce): the same push is refused");
    let strict = cri.pod_config(
        "strict-pod",
        &[
            ("kata-topo.io/policy", "single-numa-node"),
            ("kata-topo.io/numa-nodes", "1"),
            ("kata-topo.io/mode", "enforce"),
        ],
    );
    let pod = cri.run_pod(&strict, "kata-topo").expect("RunPodSandbox");
    let id = cri
        .start_container(&pod, &strict, "trainer", &admitted, true)
        .expect("StartContainer");
    match cri.update(&id, &admitted.on("0")) {
        Ok(()) => println!("unexpected: the update went through"),
        Err(status) => println!(
            "UpdateContainerResources -> {:?}: {}",
            status.code(),
            status.message()
        ),
    }
    let (state, _) = cri.status(&id);
    println!(
        "container {id} state {} on CPUs {} (unchanged)",
        if state == kata_topo_integration::RUNNING {
            "RUNNING"
        } else {
            "NOT RUNNING"
        },
        cri.allowed_cpus(&id)
    );
    show_findings(&c, &mut seen);
    cri.remove_pod(&pod);

    step("Clean-up: containerd, shims, wrapper sockets and state");
    drop(events);
    let left = c.wait_clean(Duration::from_secs(15));
    if left.is_empty() {
        println!("nothing left behind");
    } else {
        println!("left behind: {left:#?}");
    }
}

#[cfg(test)]
mod tests {
    use super::{bold, heading};

    #[test]
    fn escape_codes_only_on_a_terminal_without_no_color() {
        assert!(bold(true, None));
        assert!(bold(true, Some("".into())));
        assert!(!bold(true, Some("1".into())));
        assert!(!bold(false, None));
        assert_eq!(heading("pod", false), "\n== pod");
        assert!(!heading("pod", false).contains('\x1b'));
        assert_eq!(heading("pod", true), "\n\x1b[1m== pod\x1b[0m");
    }
}
