//! `kata-topo events` follows the findings a real wrapper publishes under the real containerd,
//! on every version; stock `ctr events` prints them on 1.x and cannot on 2.x.

use std::process::{Command, Stdio};
use std::time::Duration;

use kata_topo_integration::{bin_dir, eventually, Containerd, ContainerdBin, Guard, Resources};

#[test]
fn events_prints_a_published_finding() {
    let c = Containerd::start(Guard::default());
    let spawn = |json: bool, ns: &str| {
        let path = c.dir.path().join(format!("events-{json}-{ns}.out"));
        let mut cmd = Command::new(bin_dir().join("kata-topo"));
        cmd.arg("events")
            .arg("--address")
            .arg(&c.socket)
            .args(["--namespace", ns]);
        if json {
            cmd.arg("--json");
        }
        let child = cmd
            .stdout(std::fs::File::create(&path).expect("out"))
            .stderr(Stdio::null())
            .spawn()
            .expect("kata-topo events");
        (child, path)
    };
    let (mut json_child, json_out) = spawn(true, "k8s.io");
    let (mut human_child, human_out) = spawn(false, "k8s.io");
    let (mut other_child, other_out) = spawn(true, "default");
    let ctr = c.events();
    std::thread::sleep(Duration::from_millis(500));
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit("watched", &[("kata-topo.io/numa-nodes", "1")], true);
    let res = Resources::admitted();
    cri.update(&id, &res.on("0")).expect("push");
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    assert!(
        eventually(Duration::from_secs(10), || read(&json_out)
            .contains("vfio-remote")),
        "no event in {:?}",
        read(&json_out)
    );
    let line = read(&json_out)
        .lines()
        .next()
        .map(str::to_string)
        .expect("a line");
    let v: kata_topo_core::Verdict = serde_json::from_str(&line).expect("one verdict per line");
    assert_eq!(v.container_id.as_deref(), Some(id.as_str()));
    assert_eq!(v.pod.name.as_deref(), Some("watched"));
    assert!(eventually(Duration::from_secs(5), || read(&human_out)
        .contains("vfio-remote")));
    assert!(
        read(&human_out).contains("k8s.io /kata-topo/mismatch update (cpuset)"),
        "{}",
        read(&human_out)
    );
    assert_eq!(read(&other_out), "", "the namespace filter holds");
    // Stock ctr: 1.x prints the StringValue; 2.3's links no wrappers.proto and skips it with
    // an error, while the event reached every subscriber (kata-topo events above).
    if ContainerdBin::get().is_v2() {
        assert!(
            eventually(Duration::from_secs(5), || ctr
                .errors()
                .contains("google.protobuf.StringValue")),
            "ctr {}: {:?}",
            ContainerdBin::get().version_text,
            ctr.errors()
        );
        assert!(
            ctr.lines()
                .iter()
                .all(|l| !l.contains("/kata-topo/mismatch")),
            "{:?}",
            ctr.lines()
        );
    } else {
        let line = ctr
            .wait_for("/kata-topo/mismatch", Duration::from_secs(5))
            .expect("ctr events prints the event");
        assert!(
            line.contains("{\"value\":") && line.contains("vfio-remote"),
            "{line}"
        );
    }
    drop(ctr);
    for child in [&mut json_child, &mut human_child, &mut other_child] {
        let _ = child.kill();
        let _ = child.wait();
    }
    cri.remove_pod(&pod);
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}

#[test]
fn events_without_containerd_is_a_clear_error() {
    let out = Command::new(bin_dir().join("kata-topo"))
        .args(["events", "--address", "/nonexistent/containerd.sock"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/containerd.sock"));
}
