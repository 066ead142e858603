//! The full task lifecycle with `ctr` through the wrapper, side by side with the plain runc
//! handler: the same exit codes and output, and nothing left behind.

use std::process::Output;
use std::time::Duration;

use kata_topo_integration::{Containerd, Guard, BUSYBOX};

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Runs the same sequence under a runtime and returns what a user would compare.
fn sequence(c: &Containerd, runtime: &str, tag: &str) -> Vec<(String, Option<i32>, String)> {
    let mut seen = Vec::new();
    let mut record = |what: &str, o: Output| {
        seen.push((what.to_string(), o.status.code(), text(&o)));
    };
    let run_id = format!("run-{tag}");
    record(
        "run",
        c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            runtime,
            BUSYBOX,
            &run_id,
            "sh",
            "-c",
            "echo out; echo err >&2; exit 7",
        ]),
    );
    let bg = format!("bg-{tag}");
    let started = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        runtime,
        BUSYBOX,
        &bg,
        "sleep",
        "300",
    ]);
    assert!(
        started.status.success(),
        "{}",
        String::from_utf8_lossy(&started.stderr)
    );
    record(
        "exec",
        c.ctr(&[
            "task",
            "exec",
            "--exec-id",
            "e1",
            &bg,
            "sh",
            "-c",
            "echo in-exec; exit 4",
        ]),
    );
    let status = c.ctr(&["task", "ls"]);
    assert!(text(&status).contains(&bg) && text(&status).contains("RUNNING"));
    record("kill", c.ctr(&["task", "kill", "-s", "KILL", &bg]));
    // Deleting a task needs it stopped: wait until the kill has landed.
    for _ in 0..100 {
        if String::from_utf8_lossy(&c.ctr(&["task", "ls"]).stdout)
            .lines()
            .any(|l| l.starts_with(&bg) && l.contains("STOPPED"))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    record("delete", c.ctr(&["task", "delete", &bg]));
    record("container-delete", c.ctr(&["container", "delete", &bg]));
    seen
}

#[test]
fn lifecycle_through_the_wrapper_matches_runc() {
    let c = Containerd::start(Guard::default());
    let wrapped = sequence(&c, "io.containerd.kata-topo.v2", "kt");
    let plain = sequence(&c, "io.containerd.runc.v2", "runc");
    assert_eq!(wrapped, plain, "the wrapper must be invisible");
    assert_eq!(
        wrapped[0],
        ("run".to_string(), Some(7), "out\n".to_string())
    );
    assert_eq!(wrapped[1].1, Some(4));
    assert!(wrapped[1].2.contains("in-exec"));
    assert_eq!(wrapped[2].1, Some(0), "kill {:?}", wrapped[2]);
    assert_eq!(wrapped[3].1, Some(0), "task delete {:?}", wrapped[3]);
    let log = c.log_lines();
    assert!(
        log.iter().any(|l| l["event"] == "daemon-started"),
        "{log:#?}"
    );
    assert!(log.iter().any(|l| l["event"] == "daemon-exit"));
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

/// On the live machine the first pod's wrapper discovers the topology and stores it for the
/// node; the next pod's wrapper loads that file; the same machine gives the same fingerprint.
#[test]
fn live_topology_goes_through_the_node_cache() {
    let c = Containerd::start(Guard::default());
    c.use_live_topology();
    let run = |id: &str| {
        let out = c.ctr(&[
            "run",
            "--rm",
            "--runtime",
            "io.containerd.kata-topo.v2",
            BUSYBOX,
            id,
            "true",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let loads = || -> Vec<serde_json::Value> {
        c.log_lines()
            .into_iter()
            .filter(|l| l["event"] == "topology-loaded")
            .collect()
    };
    let wait_loads = |n: usize| {
        kata_topo_integration::eventually(Duration::from_secs(10), || loads().len() >= n);
        let l = loads();
        assert_eq!(l.len(), n, "{l:#?}");
        l
    };
    run("cache-1");
    let first = wait_loads(1);
    let origin = first[0]["origin"].as_str().expect("origin");
    let file = origin
        .rsplit_once("stored in ")
        .map(|(_, p)| std::path::PathBuf::from(p))
        .unwrap_or_else(|| panic!("the first pod discovers and stores: {origin}"));
    assert!(
        origin.starts_with("discovered (no cached topology"),
        "{origin}"
    );
    assert_eq!(file.parent(), Some(c.state_dir.as_path()));
    let meta = std::fs::symlink_metadata(&file).expect("the cache file");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((meta.uid(), meta.mode() & 0o7777), (0, 0o600));

    run("cache-2");
    let second = wait_loads(2);
    assert_eq!(
        second[1]["origin"],
        format!("cached in {}", file.display()),
        "{second:#?}"
    );
    assert_eq!(second[0]["fingerprint"], second[1]["fingerprint"]);

    // Cleared by hand: the next pod discovers the machine again.
    std::fs::remove_file(&file).expect("clear the cache");
    run("cache-3");
    let third = wait_loads(3);
    assert!(
        third[2]["origin"].as_str().is_some_and(
            |o| o.starts_with("discovered") && o.ends_with(&file.display().to_string())
        ),
        "{third:#?}"
    );
    assert_eq!(third[0]["fingerprint"], third[2]["fingerprint"]);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
    assert!(file.is_file(), "the cache stays when the pods go");
}
