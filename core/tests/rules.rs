//! Every rule, positive and negative, on real machine topologies from hwloc's test suite.

use kata_topo_core::testutil::{self, *};
use kata_topo_core::{Decision, Defaults, Mode, Operation, Policy, Rule, Severity, UpdateClass};
use serde_json::json;

use Rule::*;
use Severity::{Error, Warning};

const DGX2: &str = "nvidiaDGX2.xml";
const VFS: &str = "16intel64-manyVFs.xml";
const INTERLEAVED: &str = "24em64t-2n6c2t-pci.xml";

/// DGX-2: GPU 0000:34:00.0 hangs under node 0, 0000:b7:00.0 under node 1.
fn dgx2_tree() -> TempSysfs {
    TempSysfs::new()
        .vfio("0000:34:00.0", 0, "10")
        .vfio("0000:b7:00.0", 1, "20")
}

#[test]
fn dgx2_local_gpu_is_clean_and_remote_gpu_is_an_error() {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let local = spec().cpus("0-1").mems("0").device("/dev/vfio/10").build();
    let v = create(&host, Some(&sysfs), &local);
    assert_eq!(rules(&v), vec![], "{:#?}", v.findings);
    assert_eq!(v.operation, Operation::Create);
    assert_eq!(v.decision(), Decision::Allow);

    let remote = spec().cpus("0-1").device("/dev/vfio/20").build();
    let v = create(&host, Some(&sysfs), &remote);
    assert_eq!(rules(&v), vec![(VfioRemote, Error)]);
    let f = finding(&v, VfioRemote);
    assert_eq!(f.expected, json!({"numa_nodes": [0]}));
    assert_eq!(f.observed["numa_nodes"], json!([1]));
    assert_eq!(f.observed["device"], json!("0000:b7:00.0"));
    assert!(
        f.message.contains("0000:b7:00.0") && f.message.contains("node 1"),
        "{}",
        f.message
    );
}

#[test]
fn dgx2_cpuset_push_to_the_other_socket_is_caught_and_refused_in_enforce() {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let spec_ = spec().cpus("0-1").mems("0").device("/dev/vfio/10").build();
    let push = resources(json!({"cpu": {"cpus": "24-25", "mems": "1"}}));
    let v = update(&host, Some(&sysfs), &spec_, &push);
    assert_eq!(v.operation, Operation::Update);
    assert_eq!(v.class, Some(UpdateClass::Cpuset));
    assert_eq!(
        rules(&v),
        vec![
            (CpuOutsideIntent, Error),
            (MemsMismatch, Error),
            (VfioRemote, Error)
        ]
    );
    assert_eq!(v.decision(), Decision::Allow, "audit mode never refuses");
    assert_eq!(
        finding(&v, CpuOutsideIntent).expected,
        json!({"numa_nodes": [0]})
    );

    let enforcing = spec()
        .cpus("0-1")
        .mems("0")
        .device("/dev/vfio/10")
        .annotation("kata-topo.io/mode", "enforce")
        .build();
    let v = update(&host, Some(&sysfs), &enforcing, &push);
    assert_eq!(v.mode, Mode::Enforce);
    assert_eq!(v.decision(), Decision::Reject);

    // A resize that keeps the cpuset is allowed even in enforce mode.
    let resize = resources(json!({"cpu": {"quota": 300000, "period": 100000}}));
    let v = update(&host, Some(&sysfs), &enforcing, &resize);
    assert_eq!(v.class, Some(UpdateClass::Resize));
    assert_eq!(rules(&v), vec![]);
    assert_eq!(v.decision(), Decision::Allow);
}

#[test]
fn sriov_vfs_on_node_1() {
    let host = host(VFS);
    let tree = TempSysfs::new().vfio("0000:88:00.1", 1, "40");
    tree.tree
        .add_device(bdf("0000:88:00.2"), 1, Some("vfio-pci"), Some("41"))
        .expect("device");
    tree.tree
        .add_iommufd("vfio3", bdf("0000:88:00.2"))
        .expect("iommufd");
    let sysfs = tree.sysfs();
    let ok = spec()
        .cpus("8-15")
        .device("/dev/vfio/40")
        .device("/dev/vfio/devices/vfio3")
        .build();
    assert_eq!(rules(&create(&host, Some(&sysfs), &ok)), vec![]);
    let bad = spec().cpus("0-7").device("/dev/vfio/devices/vfio3").build();
    let v = create(&host, Some(&sysfs), &bad);
    assert_eq!(rules(&v), vec![(VfioRemote, Error)]);
    assert_eq!(
        finding(&v, VfioRemote).observed["device"],
        json!("0000:88:00.2")
    );
}

#[test]
fn vfio_missing_when_unbound_gone_or_malformed() {
    let host = host(VFS);
    let tree = TempSysfs::new().vfio("0000:88:00.1", 1, "40");
    let sysfs = tree.sysfs();
    let s = spec().cpus("8-15").device("/dev/vfio/40").build();
    assert_eq!(rules(&create(&host, Some(&sysfs), &s)), vec![]);

    tree.tree.unbind(bdf("0000:88:00.1")).expect("unbind");
    let v = create(&host, Some(&sysfs), &s);
    assert_eq!(rules(&v), vec![(VfioMissing, Error)]);
    assert!(finding(&v, VfioMissing)
        .message
        .contains("instead of vfio-pci"));

    let gone = spec().cpus("8-15").device("/dev/vfio/99").build();
    let v = create(&host, Some(&sysfs), &gone);
    assert_eq!(rules(&v), vec![(VfioMissing, Error)]);
    assert!(finding(&v, VfioMissing).message.contains("IOMMU group 99"));

    let odd = spec()
        .cpus("8-15")
        .device("/dev/vfio/../../etc/passwd")
        .build();
    let v = create(&host, Some(&sysfs), &odd);
    assert_eq!(rules(&v), vec![(VfioMissing, Error)]);

    // best-effort never errors, but still reports the hard failure.
    let be = spec()
        .cpus("8-15")
        .device("/dev/vfio/99")
        .policy("best-effort")
        .build();
    assert_eq!(
        rules(&create(&host, Some(&sysfs), &be)),
        vec![(VfioMissing, Warning)]
    );
}

#[test]
fn interleaved_numbering_is_not_mistaken_for_ranges() {
    let host = host(INTERLEAVED);
    // Even PUs are node 0: 0,2,4 is one node; 0-1 is two.
    let one = spec().cpus("0,2,4").policy("single-numa-node").build();
    assert_eq!(rules(&create(&host, None, &one)), vec![]);
    let two = spec().cpus("0-1").policy("single-numa-node").build();
    let v = create(&host, None, &two);
    assert_eq!(rules(&v), vec![(CpuSpansNuma, Error)]);
    assert_eq!(
        finding(&v, CpuSpansNuma).observed["numa_nodes"],
        json!([0, 1])
    );
    // restricted does not demand one node, but holds to the named ones.
    let restricted = spec().cpus("0-3").nodes("0").build();
    let v = create(&host, None, &restricted);
    assert_eq!(rules(&v), vec![(CpuOutsideIntent, Error)]);
    assert_eq!(
        finding(&v, CpuOutsideIntent).observed["outside_cpus"],
        json!("1,3")
    );
}

#[test]
fn sub_numa_clustering_device_local_to_one_domain() {
    // Cluster-on-Die: four nodes on two packages; 0000:01:00.0 is local to node 0 only.
    let host = host("28intel64-2p2g7c-CoDgroups.v1tov2.xml");
    let tree = TempSysfs::new().vfio("0000:01:00.0", 0, "7");
    let sysfs = tree.sysfs();
    let same = spec().cpus("0-6").device("/dev/vfio/7").build();
    assert_eq!(rules(&create(&host, Some(&sysfs), &same)), vec![]);
    // Same package, other SNC domain: remote all the same.
    let sibling = spec().cpus("7-13").device("/dev/vfio/7").build();
    assert_eq!(
        rules(&create(&host, Some(&sysfs), &sibling)),
        vec![(VfioRemote, Error)]
    );
}

#[test]
fn cpuless_knl_memory_nodes() {
    let host = host("64intel64-fakeKNL-SNC4-hybrid.xml");
    let mcdram_of_node0 = host
        .nodes
        .iter()
        .find(|n| n.cpus.is_empty() && n.local_cpus.contains(0))
        .expect("an MCDRAM node near CPU 0")
        .os_index;
    assert_eq!(host.nodes.iter().filter(|n| n.cpus.is_empty()).count(), 4);
    // CPUs 0-3 with their DDR node and their MCDRAM: one node as far as CPUs go.
    let near = spec()
        .cpus("0-3")
        .mems(&format!("0,{mcdram_of_node0}"))
        .policy("single-numa-node")
        .build();
    assert_eq!(rules(&create(&host, None, &near)), vec![]);
    // Another cluster's MCDRAM is remote memory.
    let far_mcdram = host
        .nodes
        .iter()
        .find(|n| n.cpus.is_empty() && !n.local_cpus.contains(0))
        .expect("a far MCDRAM node")
        .os_index;
    let far = spec().cpus("0-3").mems(&format!("0,{far_mcdram}")).build();
    let v = create(&host, None, &far);
    assert_eq!(rules(&v), vec![(MemsMismatch, Error)]);
    assert!(finding(&v, MemsMismatch)
        .message
        .contains("remote to CPUs 0-3"));
}

#[test]
fn offline_and_nonexistent_cpus() {
    let host = host("16em64t-4s2c2t-offlines.xml");
    let v = create(&host, None, &spec().cpus("0-2").build());
    assert_eq!(rules(&v), vec![(CpuUnknown, Error)]);
    let f = finding(&v, CpuUnknown);
    assert_eq!(f.observed["offline"], json!("2"));
    assert_eq!(f.observed["nonexistent"], json!(""));
    let v = create(&host, None, &spec().cpus("0,99").build());
    assert_eq!(finding(&v, CpuUnknown).observed["nonexistent"], json!("99"));
    // A hard error even under policy none.
    let none = spec().cpus("5").policy("none").build();
    assert_eq!(
        rules(&create(&host, None, &none)),
        vec![(CpuUnknown, Error)]
    );
    assert_eq!(
        rules(&create(&host, None, &spec().cpus("0-1,3").build())),
        vec![]
    );
}

#[test]
fn no_locality_machine_is_unknown_never_remote() {
    let host = host("fsroot-40intel64-2g2n4c+pci-nolocalityenv.xml");
    let tree = TempSysfs::new().vfio("0000:02:00.0", 2, "15");
    let sysfs = tree.sysfs();
    for cpus in ["0,4,8", "1,5", "2,6", "3"] {
        let v = create(
            &host,
            Some(&sysfs),
            &spec().cpus(cpus).device("/dev/vfio/15").build(),
        );
        assert_eq!(
            rules(&v),
            vec![(VfioLocalityUnknown, Warning)],
            "cpus {cpus}"
        );
    }
    // sysfs numa_node -1 makes even a device hwloc places somewhere unknown.
    let dgx = testutil::host(DGX2);
    let tree = TempSysfs::new().vfio("0000:b7:00.0", -1, "20");
    let v = create(
        &dgx,
        Some(&tree.sysfs()),
        &spec().cpus("0-1").device("/dev/vfio/20").build(),
    );
    assert_eq!(rules(&v), vec![(VfioLocalityUnknown, Warning)]);
    assert!(finding(&v, VfioLocalityUnknown)
        .message
        .contains("numa_node is -1"));
}

#[test]
fn big_machine_with_devices_in_several_pci_domains() {
    let host = host("192em64t-24n8c2t.xml");
    assert_eq!(host.nodes.len(), 24);
    assert_eq!(host.online_cpus.len(), 384);
    let tree = TempSysfs::new()
        .vfio("0002:03:00.0", 4, "30")
        .vfio("0003:01:00.0", 6, "31");
    let sysfs = tree.sysfs();
    let node4 = host.node(4).expect("node 4").cpus.to_string();
    let ok = spec().cpus(&node4).device("/dev/vfio/30").build();
    assert_eq!(rules(&create(&host, Some(&sysfs), &ok)), vec![]);
    let v = create(
        &host,
        Some(&sysfs),
        &spec().cpus(&node4).device("/dev/vfio/31").build(),
    );
    assert_eq!(rules(&v), vec![(VfioRemote, Error)]);
    assert_eq!(
        finding(&v, VfioRemote).observed["device"],
        json!("0003:01:00.0")
    );
    assert_eq!(finding(&v, VfioRemote).observed["numa_nodes"], json!([6]));
}

#[test]
fn memory_limit_against_node_memory() {
    let host = host(VFS);
    let node1 = host.node(1).expect("node 1").memory_bytes as i64;
    let fits = spec().cpus("8-15").mems("1").memory(node1 / 2).build();
    assert_eq!(rules(&create(&host, None, &fits)), vec![]);
    let too_big = spec()
        .cpus("8-15")
        .mems("1")
        .memory(node1 + (1 << 30))
        .build();
    let v = create(&host, None, &too_big);
    assert_eq!(rules(&v), vec![(MemoryExceedsNodes, Error)]);
    assert_eq!(
        finding(&v, MemoryExceedsNodes).expected["max_bytes"],
        json!(node1)
    );
    // Without mems, the allowed nodes of the annotation bound it.
    let by_intent = spec()
        .cpus("8-15")
        .nodes("1")
        .memory(node1 + (1 << 30))
        .build();
    assert_eq!(
        rules(&create(&host, None, &by_intent)),
        vec![(MemoryExceedsNodes, Error)]
    );
    // Nothing bounds it: no finding.
    let free = spec().cpus("8-15").memory(node1 * 4).build();
    assert_eq!(rules(&create(&host, None, &free)), vec![]);
}

#[test]
fn mems_must_match_cpus_and_intent() {
    let host = host(VFS);
    let v = create(&host, None, &spec().cpus("0-7").mems("1").build());
    assert_eq!(rules(&v), vec![(MemsMismatch, Error)]);
    assert_eq!(
        finding(&v, MemsMismatch).expected,
        json!({"numa_nodes": [0]})
    );
    let v = create(
        &host,
        None,
        &spec().cpus("0-7").mems("0-1").nodes("0").build(),
    );
    assert_eq!(rules(&v), vec![(MemsMismatch, Error)]);
    assert!(finding(&v, MemsMismatch)
        .message
        .contains("outside the allowed 0"));
    let v = create(&host, None, &spec().cpus("0-7").mems("5").build());
    assert!(finding(&v, MemsMismatch).message.contains("no NUMA node 5"));
    assert_eq!(
        rules(&create(&host, None, &spec().cpus("0-7").mems("0").build())),
        vec![]
    );
}

#[test]
fn topology_drift_against_the_baseline() {
    let host = host(VFS);
    // A device hwloc does not list: sysfs's numa_node alone gives its locality.
    let tree = TempSysfs::new().vfio("0000:c1:00.0", 1, "60");
    let sysfs = tree.sysfs();
    let s = spec().cpus("8-15").device("/dev/vfio/60").build();
    let checker = kata_topo_core::Checker::new(&host, Some(&sysfs), defaults());
    let baseline = checker.record_baseline(&s);
    assert_eq!(baseline.cpu_nodes.to_string(), "1");
    assert_eq!(
        baseline.devices[0]
            .numa_nodes
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("1")
    );
    assert_eq!(rules(&recreate(&host, Some(&sysfs), &s, &baseline)), vec![]);

    // The device moved to another slot (node 0): drift, and now remote.
    tree.tree
        .add_device(bdf("0000:c1:00.0"), 0, Some("vfio-pci"), Some("60"))
        .expect("move");
    let v = recreate(&host, Some(&sysfs), &s, &baseline);
    assert_eq!(v.operation, Operation::Recreate);
    assert_eq!(
        rules(&v),
        vec![(VfioRemote, Error), (TopologyDrift, Warning)]
    );
    assert!(finding(&v, TopologyDrift)
        .message
        .contains("moved from node 1 to node 0"));

    // The host itself changed since admission.
    let mut stale = baseline.clone();
    stale.topology_fingerprint = "0000000000000000".into();
    tree.tree
        .add_device(bdf("0000:c1:00.0"), 1, Some("vfio-pci"), Some("60"))
        .expect("move back");
    let v = recreate(&host, Some(&sysfs), &s, &stale);
    assert_eq!(rules(&v), vec![(TopologyDrift, Warning)]);
    // The baseline's CPUs were on another node (the node was relabelled).
    let mut relabelled = baseline.clone();
    relabelled.cpu_nodes = "0".parse().expect("set");
    let v = recreate(
        &host,
        Some(&sysfs),
        &spec().cpus("8-15").device("/dev/vfio/60").build(),
        &relabelled,
    );
    assert!(rules(&v).contains(&(TopologyDrift, Warning)));
    assert!(finding(&v, TopologyDrift)
        .message
        .contains("were on node 0 and are now on node 1"));
}

#[test]
fn recreate_is_held_to_the_baseline() {
    let host = host(DGX2);
    let checker = kata_topo_core::Checker::new(&host, None, defaults());
    let first = spec().cpus("0-1").build();
    let baseline = checker.record_baseline(&first);
    let same = recreate(&host, None, &first, &baseline);
    assert_eq!(
        (same.operation, rules(&same)),
        (Operation::Recreate, vec![])
    );
    let moved = recreate(&host, None, &spec().cpus("24-25").build(), &baseline);
    assert_eq!(rules(&moved), vec![(CpuOutsideIntent, Error)]);
    assert!(finding(&moved, CpuOutsideIntent)
        .message
        .contains("(the baseline)"));
}

#[test]
fn check_failed_when_devices_cannot_be_resolved() {
    let host = host(DGX2);
    let s = spec().cpus("0-1").device("/dev/vfio/10").build();
    let v = create(&host, None, &s);
    assert_eq!(rules(&v), vec![(CheckFailed, Warning)]);
    assert!(finding(&v, CheckFailed).message.contains("no sysfs root"));
    let closed = kata_topo_core::Checker::new(
        &host,
        None,
        Defaults {
            mode: Mode::Enforce,
            fail_closed: true,
            ..defaults()
        },
    )
    .admit(&kata_topo_core::Request::new(&s));
    assert_eq!(rules(&closed), vec![(CheckFailed, Error)]);
    assert_eq!(closed.decision(), Decision::Reject);
}

#[test]
fn invalid_annotations_are_errors_naming_key_and_value() {
    let host = host(DGX2);
    let s = spec()
        .cpus("0-1")
        .policy("strict")
        .annotation("kata-topo.io/mode", "../enforce")
        .nodes("0-")
        .build();
    let v = create(&host, None, &s);
    assert_eq!(rules(&v), vec![(IntentInvalid, Error); 3]);
    let messages: Vec<&str> = v.findings.iter().map(|f| f.message.as_str()).collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("kata-topo.io/policy=\"strict\"")),
        "{messages:?}"
    );
    assert!(messages
        .iter()
        .any(|m| m.contains("kata-topo.io/mode=\"../enforce\"")));
    assert!(messages
        .iter()
        .any(|m| m.contains("kata-topo.io/numa-nodes=\"0-\"")));
    // The defaults stand in: restricted, audit.
    assert_eq!((v.policy, v.mode), (Policy::Restricted, Mode::Audit));
    let v = create(&host, None, &spec().cpus("0-1").nodes("3").build());
    assert!(finding(&v, IntentInvalid)
        .message
        .contains("no NUMA node 3"));
}

#[test]
fn policies_none_and_best_effort() {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let base = || spec().cpus("0-1").device("/dev/vfio/20").nodes("1");
    let none = create(&host, Some(&sysfs), &base().policy("none").build());
    assert_eq!(rules(&none), vec![]);
    let be = create(&host, Some(&sysfs), &base().policy("best-effort").build());
    assert_eq!(
        rules(&be),
        vec![(CpuOutsideIntent, Warning), (VfioRemote, Warning)]
    );
    let enforce = create(
        &host,
        Some(&sysfs),
        &base()
            .policy("best-effort")
            .annotation("kata-topo.io/mode", "enforce")
            .build(),
    );
    assert_eq!(rules(&enforce), rules(&be));
    assert_eq!(enforce.mode, Mode::Enforce);
    assert_eq!(enforce.decision(), Decision::Allow, "warnings never refuse");
}

#[test]
fn sandbox_create_and_verdict_identity() {
    let host = host(DGX2);
    let v = create(&host, None, &spec().sandbox().cpus("0-1").build());
    assert_eq!(v.operation, Operation::Sandbox);
    assert_eq!(v.sandbox_id.as_deref(), Some("sb-1"));
    assert_eq!(v.pod.name.as_deref(), Some("gpu-pod"));
    assert_eq!(v.pod.namespace.as_deref(), Some("ml"));
    assert_eq!(v.container_name, None);
}

#[test]
fn power8_numbering() {
    let host = host("power8gpudistances.xml");
    let tree = TempSysfs::new().vfio("000a:01:00.0", 1, "3");
    let sysfs = tree.sysfs();
    let v = create(
        &host,
        Some(&sysfs),
        &spec().cpus("80-81").device("/dev/vfio/3").build(),
    );
    assert_eq!(rules(&v), vec![]);
    let v = create(
        &host,
        Some(&sysfs),
        &spec().cpus("0-1").device("/dev/vfio/3").build(),
    );
    assert_eq!(rules(&v), vec![(VfioRemote, Error)]);
}

#[test]
fn restricted_topology_is_seen_whole() {
    // Some packages are disallowed to the process that exported this topology; a checker in a
    // cgroup must still see them.
    let host = host("64intel64-3g2n+2n-irregulargroups+pci.xml");
    assert_eq!(host.nodes.len(), 8);
    assert_eq!(host.online_cpus.len(), 64);
    assert!(host.pci.len() >= 8);
}

fn kata(pinning: bool, static_sizing: bool) -> kata_topo_core::input::kata::KataConfig {
    kata_topo_core::input::kata::KataConfig {
        enable_vcpus_pinning: pinning,
        static_sandbox_resource_mgmt: static_sizing,
        default_vcpus: 1.0,
        ..Default::default()
    }
}

fn check_with_kata(
    host: &kata_topo_core::Host,
    sysfs: Option<&kata_topo_core::Sysfs>,
    spec: &kata_topo_core::ContainerSpec,
    update: Option<&kata_topo_core::Resources>,
    kata: &kata_topo_core::input::kata::KataConfig,
) -> kata_topo_core::Verdict {
    let checker = kata_topo_core::Checker::new(host, sysfs, defaults());
    let req = kata_topo_core::Request {
        kata: Some(kata),
        ..kata_topo_core::Request::new(spec)
    };
    match update {
        Some(update) => checker.update(&req, kata_topo_core::Running::default(), update),
        None => checker.admit(&req),
    }
}

#[test]
fn vcpu_pinning_lost_is_predicted_from_config_and_update() {
    let host = host(VFS);
    // 1 default vCPU + a 1-CPU limit = 2 vCPUs for a 2-CPU cpuset: pinning holds.
    let mut j = spec().cpus("8-9").json();
    j["linux"]["resources"]["cpu"]["quota"] = json!(100_000);
    j["linux"]["resources"]["cpu"]["period"] = json!(100_000);
    let s = kata_topo_core::ContainerSpec::from_json(j.to_string().as_bytes()).expect("spec");
    assert_eq!(
        rules(&check_with_kata(&host, None, &s, None, &kata(true, false))),
        vec![]
    );
    // A resize to 2 CPUs makes 3 vCPUs for 2 CPUs: Kata silently stops pinning.
    let resize = resources(json!({"cpu": {"quota": 200_000, "period": 100_000}}));
    let v = check_with_kata(&host, None, &s, Some(&resize), &kata(true, false));
    assert_eq!(rules(&v), vec![(VcpuPinningLost, Warning)]);
    assert_eq!(finding(&v, VcpuPinningLost).observed["vcpus"], json!(3));
    // Growing the cpuset along with the limit keeps it.
    let both = resources(json!({"cpu": {"quota": 200_000, "period": 100_000, "cpus": "8-10"}}));
    assert_eq!(
        rules(&check_with_kata(
            &host,
            None,
            &s,
            Some(&both),
            &kata(true, false)
        )),
        vec![]
    );
    // Static sizing: the VM keeps its 2 vCPUs, so widening the cpuset alone loses pinning.
    let wider = resources(json!({"cpu": {"cpus": "8-10"}}));
    let v = check_with_kata(&host, None, &s, Some(&wider), &kata(true, true));
    assert_eq!(rules(&v), vec![(VcpuPinningLost, Warning)]);
    // Without pinning configured there is nothing to lose.
    assert_eq!(
        rules(&check_with_kata(
            &host,
            None,
            &s,
            Some(&resize),
            &kata(false, false)
        )),
        vec![]
    );
    // single-numa-node makes it an error.
    let mut j2 = j.clone();
    j2["annotations"]["kata-topo.io/policy"] = json!("single-numa-node");
    let s2 = kata_topo_core::ContainerSpec::from_json(j2.to_string().as_bytes()).expect("spec");
    let v = check_with_kata(&host, None, &s2, Some(&resize), &kata(true, false));
    assert_eq!(rules(&v), vec![(VcpuPinningLost, Error)]);
}

#[test]
fn guest_numa_uncovered_when_the_device_node_is_not_mapped() {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let numa = |mapping: &[&str]| kata_topo_core::input::kata::KataConfig {
        enable_numa: true,
        numa_mapping: mapping.iter().map(|m| m.parse().expect("set")).collect(),
        ..Default::default()
    };
    let s = spec().device("/dev/vfio/20").build();
    let v = check_with_kata(&host, Some(&sysfs), &s, None, &numa(&["0"]));
    assert_eq!(rules(&v), vec![(GuestNumaUncovered, Error)]);
    assert_eq!(
        finding(&v, GuestNumaUncovered).observed["numa_nodes"],
        json!([1])
    );
    assert_eq!(
        rules(&check_with_kata(
            &host,
            Some(&sysfs),
            &s,
            None,
            &numa(&["0", "1"])
        )),
        vec![]
    );
    // NUMA mode off: the mapping means nothing.
    let off = kata_topo_core::input::kata::KataConfig {
        enable_numa: false,
        ..numa(&["0"])
    };
    assert_eq!(
        rules(&check_with_kata(&host, Some(&sysfs), &s, None, &off)),
        vec![]
    );
}

#[test]
fn vm_rules_on_the_vcpu_threads() {
    let host = host(DGX2);
    let s = spec().cpus("0-1").build();
    let check = |vm: &kata_topo_core::vm::VmView| {
        kata_topo_core::Checker::new(&host, None, defaults()).admit(&kata_topo_core::Request {
            vm: Some(vm),
            ..kata_topo_core::Request::new(&s)
        })
    };
    // Each vCPU on its own CPU of node 0, where the cpuset is: nothing to report.
    assert_eq!(rules(&check(&vm_view(700, &["0", "1"]))), vec![]);
    // Two vCPUs on one CPU of node 1.
    let v = check(&vm_view(700, &["0", "24", "24"]));
    assert_eq!(
        rules(&v),
        vec![(VcpuAffinityDrift, Error), (VcpuOverlap, Warning)]
    );
    let drift = finding(&v, VcpuAffinityDrift);
    assert_eq!(drift.expected, json!({"numa_nodes": [0]}));
    assert_eq!(drift.observed["vcpus"][0]["vcpu"], json!(1));
    assert!(
        drift
            .message
            .starts_with("2 of the VM's 3 vCPU threads (pid 700)"),
        "{}",
        drift.message
    );
    assert_eq!(
        finding(&v, VcpuOverlap).observed,
        json!({"shared": [{"cpu": 24, "vcpus": [1, 2]}]})
    );
}

/// Every rule's message, produced on real topologies: one line for the kubelet's event and the
/// refusal it carries, without runs of spaces (string literals that lost their `\`
/// continuations) or control characters.
#[test]
fn every_rule_message_is_one_clean_line() {
    let dgx2 = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let pinning = kata(true, false);
    let numa = kata_topo_core::input::kata::KataConfig {
        enable_numa: true,
        numa_mapping: vec!["0".parse().expect("set")],
        ..Default::default()
    };
    let vm = vm_view(700, &["0", "24", "24"]);
    let single = spec()
        .cpus("0-1,24")
        .device("/dev/vfio/20")
        .device("/dev/vfio/99")
        .device("/dev/vfio/../x")
        .policy("single-numa-node")
        .nodes("0")
        .build();
    let resize = resources(json!({"cpu": {"quota": 400_000, "period": 100_000}}));
    let mut verdicts = vec![
        // cpu-spans-numa, cpu-outside-intent, vfio-remote, vfio-missing (both kinds),
        // vcpu-pinning-lost, vcpu-affinity-drift, vcpu-overlap.
        kata_topo_core::Checker::new(&dgx2, Some(&sysfs), defaults()).update(
            &kata_topo_core::Request {
                kata: Some(&pinning),
                vm: Some(&vm),
                ..kata_topo_core::Request::new(&single)
            },
            kata_topo_core::Running::default(),
            &resize,
        ),
        // guest-numa-uncovered.
        check_with_kata(&dgx2, Some(&sysfs), &single, None, &numa),
        // check-failed: no sysfs to resolve the device with.
        create(
            &dgx2,
            None,
            &spec().cpus("0-1").device("/dev/vfio/10").build(),
        ),
        // intent-invalid.
        create(
            &dgx2,
            None,
            &spec()
                .cpus("0-1")
                .policy("strict")
                .annotation("kata-topo.io/mode", "../enforce")
                .nodes("0-")
                .build(),
        ),
    ];
    // override-ignored: a pod asking for a weaker policy than the node's.
    verdicts.push(
        kata_topo_core::Checker::new(&dgx2, None, Defaults::default()).admit(
            &kata_topo_core::Request::new(&spec().cpus("0-1").policy("none").build()),
        ),
    );
    // cpu-unknown.
    let offline = host("16em64t-4s2c2t-offlines.xml");
    verdicts.push(create(&offline, None, &spec().cpus("0-2,99").build()));
    // cpu-outside-intent.
    let interleaved = host(INTERLEAVED);
    verdicts.push(create(
        &interleaved,
        None,
        &spec().cpus("0-3").nodes("0").build(),
    ));
    // mems-mismatch, memory-exceeds-nodes.
    let vfs = host(VFS);
    let node1 = vfs.node(1).expect("node 1").memory_bytes as i64;
    verdicts.push(create(
        &vfs,
        None,
        &spec().cpus("0-7").mems("1,5").memory(node1 * 2).build(),
    ));
    // vfio-locality-unknown.
    let nolocality = host("fsroot-40intel64-2g2n4c+pci-nolocalityenv.xml");
    let unknown = TempSysfs::new().vfio("0000:02:00.0", 2, "15");
    verdicts.push(create(
        &nolocality,
        Some(&unknown.sysfs()),
        &spec().cpus("0").device("/dev/vfio/15").build(),
    ));
    // topology-drift: the device moved since admission.
    let moving = TempSysfs::new().vfio("0000:c1:00.0", 1, "60");
    let s = spec().cpus("8-15").device("/dev/vfio/60").build();
    let baseline =
        kata_topo_core::Checker::new(&vfs, Some(&moving.sysfs()), defaults()).record_baseline(&s);
    moving
        .tree
        .add_device(bdf("0000:c1:00.0"), 0, Some("vfio-pci"), Some("60"))
        .expect("move");
    verdicts.push(recreate(&vfs, Some(&moving.sysfs()), &s, &baseline));
    // kubelet-cpus-mismatch, kubelet-device-mismatch (both kinds), kubelet-intent-unavailable.
    use kata_topo_core::input::kubelet::{
        ContainerAdmission, DeviceAdmission, KubeletSettings, KubeletView, PodAdmission,
    };
    let device = |id: &str, node: &str| DeviceAdmission {
        resource_name: "kata-topo.io/vfio".into(),
        device_ids: vec![id.into()],
        numa_nodes: node.parse().expect("set"),
    };
    let admitted = KubeletView::Admitted {
        pod: PodAdmission {
            namespace: "ml".into(),
            name: "gpu-pod".into(),
            containers: vec![ContainerAdmission {
                name: "trainer".into(),
                cpu_ids: "24-25".parse().expect("set"),
                memory: Vec::new(),
                devices: vec![device("0000:b7:00.0", "0"), device("0000:34:00.0", "0")],
            }],
        },
        settings: KubeletSettings::default(),
    };
    let unavailable = KubeletView::Unavailable {
        reason: "the kubelet did not answer within 100 ms".into(),
    };
    let on_node_1 = spec().cpus("24").device("/dev/vfio/20").build();
    for view in [&admitted, &unavailable] {
        verdicts.push(
            kata_topo_core::Checker::new(&dgx2, Some(&sysfs), defaults()).admit(
                &kata_topo_core::Request {
                    kubelet: Some(view),
                    ..kata_topo_core::Request::new(&on_node_1)
                },
            ),
        );
    }
    // node-affinity-violated, node-labels-changed (a preferred term lost and a required label
    // changed), node-labels-unavailable.
    {
        use kata_topo_core::input::affinity::{NodeLabels, NodeView, PodPlacement};
        let pod = PodPlacement::from_json(
            br#"{"kind":"Pod","metadata":{"namespace":"ml","name":"gpu-pod",
                "ownerReferences":[{"kind":"StatefulSet","name":"gpu","controller":true}]},
              "spec":{"nodeSelector":{"nic":"mlx5"},"affinity":{"nodeAffinity":{
                "requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[
                  {"matchExpressions":[{"key":"cores","operator":"Gt","values":["8"]}]}]},
                "preferredDuringSchedulingIgnoredDuringExecution":[{"weight":5,"preference":{
                  "matchExpressions":[{"key":"zone","operator":"In","values":["a"]}]}}]}}}}"#,
        )
        .expect("pod");
        let node = |cores: &str, zone: &str| NodeLabels {
            name: "worker".into(),
            labels: [("nic", "mlx5"), ("cores", cores), ("zone", zone)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let then = node("16", "a");
        let read = |now: NodeLabels| NodeView::Read {
            pod: pod.clone(),
            node: now,
            baseline: Some(then.clone()),
        };
        for view in [
            read(node("4", "a")),
            read(node("32", "b")),
            NodeView::Unavailable {
                reason: "the API server did not answer within 500 ms".into(),
            },
        ] {
            verdicts.push(
                kata_topo_core::Checker::new(&dgx2, Some(&sysfs), defaults()).admit(
                    &kata_topo_core::Request {
                        node: Some(&view),
                        ..kata_topo_core::Request::new(&on_node_1)
                    },
                ),
            );
        }
    }

    let mut seen: Vec<Rule> = Vec::new();
    for v in &verdicts {
        for f in &v.findings {
            assert!(
                !f.message.contains("  "),
                "{}: a run of spaces in {:?}",
                f.rule,
                f.message
            );
            assert!(
                !f.message.chars().any(char::is_control),
                "{}: a control character in {:?}",
                f.rule,
                f.message
            );
            assert_eq!(f.message.trim(), f.message, "{}", f.rule);
            seen.push(f.rule);
        }
        let refusal = v.refusal();
        assert!(!refusal.contains("  "), "{refusal}");
        assert!(!refusal.chars().any(char::is_control), "{refusal:?}");
    }
    seen.sort();
    seen.dedup();
    assert_eq!(seen, Rule::ALL, "every rule, produced at least once");
}

/// On a node in enforce mode, a pod's annotations cannot switch enforcement off: `mode: audit`
/// and `policy: none` (or `best-effort`) are ignored with an `override-ignored` finding each,
/// and the cross-node push is refused all the same. The same push is allowed where the
/// operator lets pods weaken (`pod_overrides = "any"`).
#[test]
fn a_pod_cannot_weaken_the_nodes_enforcement() {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let enforce = Defaults {
        mode: Mode::Enforce,
        ..Defaults::default()
    };
    let admitted = || spec().cpus("0-1").device("/dev/vfio/10");
    let push = resources(json!({"cpu": {"cpus": "24-25"}}));
    for weaker in ["none", "best-effort"] {
        let s = admitted()
            .annotation("kata-topo.io/mode", "audit")
            .policy(weaker)
            .build();
        let checker = kata_topo_core::Checker::new(&host, Some(&sysfs), enforce);
        let baseline = checker.record_baseline(&s);
        let check = |checker: kata_topo_core::Checker<'_>| {
            let running = kata_topo_core::Running {
                baseline: Some(&baseline),
                ..kata_topo_core::Running::default()
            };
            checker.update(&kata_topo_core::Request::new(&s), running, &push)
        };
        let v = check(checker);
        assert_eq!((v.policy, v.mode), (Policy::Restricted, Mode::Enforce));
        assert_eq!(v.decision(), Decision::Reject, "{weaker}: {v:#?}");
        let ignored: Vec<&str> = v
            .findings
            .iter()
            .filter(|f| f.rule == OverrideIgnored)
            .map(|f| f.observed["annotation"].as_str().expect("named"))
            .collect();
        assert_eq!(ignored, ["kata-topo.io/policy", "kata-topo.io/mode"]);
        assert!(v
            .findings
            .iter()
            .filter(|f| f.rule == OverrideIgnored)
            .all(|f| f.severity == Warning));
        let any = Defaults {
            pod_overrides: kata_topo_core::PodOverrides::Any,
            ..enforce
        };
        let v = check(kata_topo_core::Checker::new(&host, Some(&sysfs), any));
        assert_eq!(v.mode, Mode::Audit);
        assert_eq!(v.decision(), Decision::Allow, "{weaker}");
    }
}
