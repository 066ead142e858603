//! The binary as operators run it: `--once` prints what would be advertised, bad flags are
//! refused naming the flag, the daemon serves its socket at once and goes away cleanly on
//! SIGTERM.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kata_topo_core::testutil::SysfsTree;
use kata_topo_core::Bdf;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_kata-topo-device-plugin");

fn bdf(s: &str) -> Bdf {
    s.parse().expect("bdf")
}

fn host(dir: &Path) -> SysfsTree {
    let tree = SysfsTree::at(dir.join("sys")).expect("tree");
    tree.add_device(bdf("0000:80:00.0"), 1, Some("vfio-pci"), Some("42"))
        .expect("nic");
    let dev = tree.root().join("bus/pci/devices/0000:80:00.0");
    std::fs::write(dev.join("vendor"), "0x8086\n").expect("vendor");
    std::fs::write(dev.join("device"), "0x1520\n").expect("device");
    tree.add_iommufd("vfio0", bdf("0000:80:00.0"))
        .expect("iommufd");
    tree.add_device(bdf("0000:00:05.0"), -1, Some("vfio-pci"), Some("7"))
        .expect("gpu");
    tree.add_device(bdf("0000:01:00.0"), 0, Some("ixgbe"), Some("3"))
        .expect("host nic");
    tree
}

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run the plugin")
}

#[test]
fn once_prints_the_devices_it_would_advertise_as_json() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = host(dir.path());
    let root = tree.root().to_str().expect("utf-8 path");
    let out = run(&["--sysfs-root", root, "--once"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["resource_name"], "kata-topo.io/vfio");
    assert_eq!(
        v["socket"],
        "/var/lib/kubelet/device-plugins/kata-topo-vfio.sock"
    );
    assert_eq!(
        v["devices"],
        json!([
            {"id": "0000:00:05.0", "numa_node": null, "iommu_group": "7", "iommufd": null,
             "pci_id": null, "health": "Healthy",
             "device_specs": ["/dev/vfio/vfio", "/dev/vfio/7"]},
            {"id": "0000:80:00.0", "numa_node": 1, "iommu_group": "42", "iommufd": "vfio0",
             "pci_id": "8086:1520", "health": "Healthy",
             "device_specs": ["/dev/vfio/vfio", "/dev/vfio/42", "/dev/vfio/devices/vfio0"]},
        ])
    );
    assert_eq!(v["skipped"], json!([]));

    let out = run(&[
        "--sysfs-root",
        root,
        "--once",
        "--ids",
        "10de:2330,8086:1520",
        "--resource-name",
        "example.com/nic",
    ]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["resource_name"], "example.com/nic");
    let ids: Vec<&str> = v["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .filter_map(|d| d["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["0000:80:00.0"]);
}

#[test]
fn bad_flags_exit_2_naming_the_flag_and_the_value() {
    for (args, flag, value) in [
        (&["--ids", "8086"][..], "--ids", "8086"),
        (&["--ids", "8086:1520,xyz"][..], "--ids", "xyz"),
        (&["--resource-name", "vfio"][..], "--resource-name", "vfio"),
        (
            &["--resource-name", "kubernetes.io/vfio"][..],
            "--resource-name",
            "kubernetes.io/vfio",
        ),
        (
            &["--socket-name", "../x.sock"][..],
            "--socket-name",
            "../x.sock",
        ),
        (
            &["--socket-name", "kubelet.sock"][..],
            "--socket-name",
            "kubelet.sock",
        ),
        (&["--rescan-seconds", "0"][..], "--rescan-seconds", "0"),
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag) && err.contains(value), "{args:?}: {err}");
    }
}

#[test]
fn version_names_the_binary_and_its_version() {
    for flag in ["--version", "-v"] {
        let out = run(&[flag]);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with(&format!(
                "kata-topo-device-plugin {}",
                env!("CARGO_PKG_VERSION")
            )),
            "{text}"
        );
    }
}

#[test]
fn a_sysfs_root_without_pci_devices_fails_at_once_saying_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().to_str().expect("utf-8");
    for args in [
        vec!["--sysfs-root", root, "--once"],
        vec!["--sysfs-root", root, "--device-plugin-dir", root],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let line: Value = serde_json::from_slice(&out.stderr).expect("one JSON line");
        assert_eq!(line["level"], "error");
        assert!(line.to_string().contains("bus/pci/devices"), "{line}");
    }
}

#[test]
fn the_daemon_serves_its_socket_quickly_and_removes_it_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = host(dir.path());
    let plugins = dir.path().join("device-plugins");
    std::fs::create_dir(&plugins).expect("dir");
    let socket = plugins.join("kata-topo-vfio.sock");
    let started = Instant::now();
    let child = Command::new(BIN)
        .arg("--sysfs-root")
        .arg(tree.root())
        .arg("--device-plugin-dir")
        .arg(&plugins)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    while !socket.exists() {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "no socket after 5 s"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let took = started.elapsed();
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let out = child.wait_with_output().expect("wait");
    assert!(out.status.success(), "{out:?}");
    assert!(!socket.exists(), "the socket is removed");
    let events: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).expect("JSON line"))
        .filter_map(|l| l["event"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        events,
        vec![
            "device-added",
            "device-added",
            "started",
            "serving",
            "stopped"
        ],
        "started in {took:?}"
    );
    assert!(took < Duration::from_secs(2), "serving took {took:?}");
}
