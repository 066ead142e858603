//! `kata-topo-hook` installed in a real containerd's base runtime spec (the `runc` handler, no
//! runtime-handler switch): a container created through CRI that crosses NUMA nodes is refused
//! in enforce mode; a compliant one starts.

use std::time::Duration;

use kata_topo_integration::{Containerd, Guard, Resources, EXITED, RUNNING};

#[test]
fn hook_in_the_base_runtime_spec_refuses_a_crossing_container() {
    let c = Containerd::start(Guard {
        runc_hook: true,
        ..Guard::default()
    });
    let mut cri = c.cri();
    let cfg = cri.pod_config(
        "hooked",
        &[
            ("kata-topo.io/policy", "single-numa-node"),
            ("kata-topo.io/numa-nodes", "1"),
            ("kata-topo.io/mode", "enforce"),
        ],
    );
    let pod = cri
        .run_pod(&cfg, "runc")
        .expect("the sandbox passes the hook");
    let res = Resources {
        cpus: "0",
        quota: 100_000,
        memory: 256 << 20,
        ..Resources::default()
    };
    let bad = cri
        .create_container(&pod, &cfg, "trainer", &res, true)
        .expect("CreateContainer");
    let err = cri.start(&bad).expect_err("the hook refuses it");
    assert!(
        err.message().contains("vfio-remote") || err.message().contains("hook"),
        "{err:?}"
    );
    assert_eq!(cri.status(&bad).0, EXITED);
    let refused = |l: &serde_json::Value| l["rule"] == "vfio-remote" && l["decision"] == "reject";
    assert!(c
        .findings_when(Duration::from_secs(10), |f| f.iter().any(refused))
        .iter()
        .any(refused));
    cri.remove_container(&bad);
    let good = cri
        .start_container(&pod, &cfg, "worker", &res.on("1"), true)
        .expect("a compliant container starts");
    assert_eq!(cri.status(&good).0, RUNNING);
    cri.remove_pod(&pod);
    let left = c.wait_clean(Duration::from_secs(15));
    if !left.is_empty() {
        let tree = std::process::Command::new("find")
            .arg(&c.state_dir)
            .output()
            .expect("find");
        eprintln!(
            "{}\n{:#?}",
            String::from_utf8_lossy(&tree.stdout),
            c.log_lines()
        );
    }
    assert_eq!(left, Vec::<String>::new());
}
