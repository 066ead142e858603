//! The pod's intent from the kubelet: what its Topology Manager admitted is the intent, the
//! kubelet's policy is the default, the pod's annotations apply over it within
//! `pod_overrides`; and the rules on what the kubelet assigned.

use kata_topo_core::check::intent::IntentOrigin;
use kata_topo_core::input::kubelet::{
    ContainerAdmission, DeviceAdmission, KubeletSettings, KubeletView, MemoryAdmission,
    PodAdmission, TopologyScope,
};
use kata_topo_core::testutil::*;
use kata_topo_core::{
    Checker, ContainerSpec, Decision, Defaults, Mode, Policy, Request, Resources, Rule, Running,
    Severity::*, Verdict,
};
use serde_json::json;

use Rule::*;

const DGX2: &str = "nvidiaDGX2.xml";

/// DGX-2: GPU 0000:34:00.0 under node 0 (group 10), 0000:b7:00.0 under node 1 (group 20).
fn dgx2_tree() -> TempSysfs {
    TempSysfs::new()
        .vfio("0000:34:00.0", 0, "10")
        .vfio("0000:b7:00.0", 1, "20")
}

fn set(s: &str) -> kata_topo_core::IdSet {
    s.parse().expect("set")
}

/// What a kubelet with the static CPU and memory managers admitted for pod ml/gpu-pod: the
/// container `trainer` on node 1 (CPUs 24-25, memory, GPU 0000:b7:00.0 hinted at `gpu_node`),
/// and a `sidecar` of the shared pool.
fn admitted(policy: Policy, scope: TopologyScope, gpu_node: &str) -> KubeletView {
    KubeletView::Admitted {
        pod: PodAdmission {
            namespace: "ml".into(),
            name: "gpu-pod".into(),
            containers: vec![
                ContainerAdmission {
                    name: "trainer".into(),
                    cpu_ids: set("24-25"),
                    memory: vec![MemoryAdmission {
                        memory_type: "memory".into(),
                        size: 1 << 30,
                        numa_nodes: set("1"),
                    }],
                    devices: vec![DeviceAdmission {
                        resource_name: "kata-topo.io/vfio".into(),
                        device_ids: vec!["0000:b7:00.0".into()],
                        numa_nodes: set(gpu_node),
                    }],
                },
                ContainerAdmission {
                    name: "sidecar".into(),
                    ..Default::default()
                },
            ],
        },
        settings: KubeletSettings {
            topology_manager_policy: policy,
            topology_manager_scope: scope,
            cpu_manager_policy: "static".into(),
            memory_manager_policy: "Static".into(),
            policy_from: None,
        },
    }
}

fn check(
    defaults: Defaults,
    spec: &ContainerSpec,
    update: Option<&Resources>,
    kubelet: &KubeletView,
) -> Verdict {
    let host = host(DGX2);
    let tree = dgx2_tree();
    let sysfs = tree.sysfs();
    let checker = Checker::new(&host, Some(&sysfs), defaults);
    let req = Request {
        kubelet: Some(kubelet),
        ..Request::new(spec)
    };
    match update {
        Some(update) => checker.update(&req, Running::default(), update),
        None => checker.admit(&req),
    }
}

fn stricter_only() -> Defaults {
    Defaults::default()
}

#[test]
fn the_admission_is_the_intent_and_the_kubelets_policy_the_default() {
    let kubelet = admitted(Policy::SingleNumaNode, TopologyScope::Container, "1");
    let trainer = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .build();
    let v = check(stricter_only(), &trainer, None, &kubelet);
    assert_eq!(rules(&v), vec![], "{:#?}", v.findings);
    assert_eq!(v.intent_source, IntentOrigin::Kubelet);
    assert_eq!(v.policy, Policy::SingleNumaNode);
    let reported = v.kubelet.as_ref().expect("what the kubelet reported");
    assert_eq!(reported["cpus"], json!("24-25"));
    assert_eq!(reported["numa_nodes"], json!("1"));
    assert_eq!(reported["topology_manager_scope"], json!("container"));
    assert_eq!(
        reported["devices"][0]["device_ids"],
        json!(["0000:b7:00.0"])
    );
    // The verdict says so in JSON, as the log line and the event do.
    let text = serde_json::to_value(&v).expect("json");
    assert_eq!(text["intent_source"], json!("kubelet"));
}

#[test]
fn a_cpuset_push_off_the_exclusive_cpus_is_a_kubelet_mismatch() {
    let kubelet = admitted(Policy::Restricted, TopologyScope::Container, "1");
    let trainer = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .build();
    let push = resources(json!({"cpu": {"cpus": "0-1"}}));
    let v = check(stricter_only(), &trainer, Some(&push), &kubelet);
    assert!(
        rules(&v).contains(&(KubeletCpusMismatch, Error)),
        "{:#?}",
        v.findings
    );
    // The allowed nodes are the kubelet's: node 0 is outside them.
    assert!(
        rules(&v).contains(&(CpuOutsideIntent, Error)),
        "{:#?}",
        v.findings
    );
    let f = finding(&v, KubeletCpusMismatch);
    assert_eq!(f.expected["cpus"], json!("24-25"));
    assert_eq!(f.observed["cpus"], json!("0-1"));
    assert!(finding(&v, CpuOutsideIntent).message.contains("kubelet"));
    // Under the kubelet's `none`, a warning: the assignment stands, alignment is not asked.
    let kubelet = admitted(Policy::None, TopologyScope::Container, "1");
    let v = check(stricter_only(), &trainer, Some(&push), &kubelet);
    assert_eq!(rules(&v), vec![(KubeletCpusMismatch, Warning)]);
    // In enforce, the restricted mismatch is refused.
    let enforce = Defaults {
        mode: Mode::Enforce,
        ..stricter_only()
    };
    let kubelet = admitted(Policy::Restricted, TopologyScope::Container, "1");
    let v = check(enforce, &trainer, Some(&push), &kubelet);
    assert_eq!(v.decision(), Decision::Reject);
}

#[test]
fn a_device_off_its_hint_or_not_in_the_container_is_a_kubelet_mismatch() {
    // Admitted with hint node 0; sysfs puts it on node 1.
    let kubelet = admitted(Policy::BestEffort, TopologyScope::Container, "0");
    let trainer = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .build();
    let v = check(stricter_only(), &trainer, None, &kubelet);
    let f = finding(&v, KubeletDeviceMismatch);
    assert_eq!(f.severity, Warning);
    assert_eq!(f.expected["numa_nodes"], json!("0"));
    assert_eq!(f.observed["numa_nodes"], json!("1"));
    // Allocated by the kubelet, but the container got the other GPU's group.
    let kubelet = admitted(Policy::Restricted, TopologyScope::Container, "1");
    let wrong = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/10")
        .build();
    let v = check(stricter_only(), &wrong, None, &kubelet);
    let f = finding(&v, KubeletDeviceMismatch);
    assert_eq!(f.severity, Error);
    assert_eq!(f.observed["in_container"], json!(false));
}

#[test]
fn a_kubelet_without_an_answer_is_a_warning_and_the_annotations_stand_in() {
    let kubelet = KubeletView::Unavailable {
        reason: "the kubelet did not answer within 100 ms".into(),
    };
    let trainer = spec()
        .cpus("24-25")
        .mems("1")
        .policy("single-numa-node")
        .build();
    let v = check(stricter_only(), &trainer, None, &kubelet);
    assert_eq!(rules(&v), vec![(KubeletIntentUnavailable, Warning)]);
    assert_eq!(v.intent_source, IntentOrigin::Annotations);
    assert_eq!(v.policy, Policy::SingleNumaNode);
    assert!(v.kubelet.is_none());
    let f = finding(&v, KubeletIntentUnavailable);
    assert!(f.message.contains("within 100 ms"), "{}", f.message);
    // Under every policy, never more than a warning.
    for policy in ["none", "best-effort", "restricted", "single-numa-node"] {
        let s = spec().cpus("24-25").policy(policy).build();
        let v = check(stricter_only(), &s, None, &kubelet);
        assert_eq!(finding(&v, KubeletIntentUnavailable).severity, Warning);
    }
}

#[test]
fn annotations_apply_over_the_kubelet_within_pod_overrides() {
    let kubelet = admitted(Policy::Restricted, TopologyScope::Container, "1");
    // Stricter: a policy above the kubelet's applies.
    let strict = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .policy("single-numa-node");
    let v = check(stricter_only(), &strict.build(), None, &kubelet);
    assert_eq!(v.policy, Policy::SingleNumaNode);
    assert_eq!(v.intent_source, IntentOrigin::Kubelet);
    // Weaker: ignored, said, the kubelet's stands.
    let weak = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .policy("none")
        .build();
    let v = check(stricter_only(), &weak, None, &kubelet);
    assert_eq!(v.policy, Policy::Restricted);
    assert_eq!(rules(&v), vec![(OverrideIgnored, Warning)]);
    // Nodes outside the kubelet's are not stricter: ignored, naming the kubelet.
    let elsewhere = spec()
        .cpus("24-25")
        .mems("1")
        .device("/dev/vfio/20")
        .nodes("0")
        .build();
    let v = check(stricter_only(), &elsewhere, None, &kubelet);
    let f = finding(&v, OverrideIgnored);
    assert_eq!(
        f.expected["applies"]["from"],
        json!("the kubelet's admission")
    );
    // With pod_overrides = "any", they apply: node 0 is then the allowed one.
    let any = Defaults {
        pod_overrides: kata_topo_core::PodOverrides::Any,
        ..stricter_only()
    };
    let v = check(any, &elsewhere, None, &kubelet);
    assert!(
        rules(&v).contains(&(CpuOutsideIntent, Error)),
        "{:#?}",
        v.findings
    );
    // A weaker policy too; the kubelet's assignment is still checked.
    let push = resources(json!({"cpu": {"cpus": "0-1"}}));
    let v = check(any, &weak, Some(&push), &kubelet);
    assert_eq!(v.policy, Policy::None);
    assert_eq!(rules(&v), vec![(KubeletCpusMismatch, Warning)]);
}

#[test]
fn the_scope_decides_the_nodes_of_a_container_without_its_own() {
    let sidecar = {
        let mut j = spec().cpus("0-1").build();
        j.container_name = Some("sidecar".into());
        j
    };
    // Scope pod: the pod was aligned to node 1 as a whole; the sidecar on node 0 is outside.
    let pod = admitted(Policy::Restricted, TopologyScope::Pod, "1");
    let v = check(stricter_only(), &sidecar, None, &pod);
    assert_eq!(v.intent_source, IntentOrigin::Kubelet);
    assert!(
        rules(&v).contains(&(CpuOutsideIntent, Error)),
        "{:#?}",
        v.findings
    );
    // Scope container: the sidecar was given nothing to align; no nodes to hold it to.
    let container = admitted(Policy::Restricted, TopologyScope::Container, "1");
    let v = check(stricter_only(), &sidecar, None, &container);
    assert_eq!(rules(&v), vec![], "{:#?}", v.findings);
    // Nor does the Topology Manager's policy apply to it: under single-numa-node the real
    // kubelet runs a shared-pool container on the whole pool, across nodes (make k8s-test).
    let single = admitted(Policy::SingleNumaNode, TopologyScope::Container, "1");
    let v = check(stricter_only(), &sidecar, None, &single);
    assert_eq!(rules(&v), vec![], "{:#?}", v.findings);
    assert_eq!(v.policy, Policy::Restricted);
    assert_ne!(v.intent_source, IntentOrigin::Kubelet);
    // A container the kubelet does not list (an init container): annotations and baseline.
    let mut init = spec().cpus("0-1").build();
    init.container_name = Some("init".into());
    let v = check(stricter_only(), &init, None, &container);
    assert_eq!(v.intent_source, IntentOrigin::Annotations);
    assert!(v.kubelet.is_none());
}

#[test]
fn the_recorded_answer_reads_as_the_kubelet_gives_it() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pod-resources/list.json");
    let text = std::fs::read_to_string(path).expect("fixture");
    let pods = PodAdmission::from_json(&text).expect("valid");
    let app = pods[0].container("app").expect("app");
    assert_eq!(app.cpu_ids, set("1"));
    assert_eq!(app.memory_nodes(), set("1"));
    assert_eq!(app.devices[0].device_ids, ["0000:81:00.0"]);
    assert_eq!(app.device_nodes(), set("1"));
    let shared = pods[1].container("app").expect("shared-pool app");
    assert!(shared.cpu_ids.is_empty());
}

/// What the real kubelet answered in `make k8s-test` (`List`, recorded by the kubelet's own
/// client): the Guaranteed pod's exclusive CPU, its memory node and its device with the
/// device plugin's topology hint; the shared-pool pod with nothing of its own.
#[test]
fn the_real_kubelets_answer_reads_as_it_admitted() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pod-resources/kubelet-v1.36.3-list.json");
    let pods = PodAdmission::from_json(&std::fs::read_to_string(path).expect("fixture"))
        .expect("the real kubelet's answer decodes");
    let pod = |name: &str| {
        pods.iter()
            .find(|p| p.name == name && p.namespace == "default")
            .unwrap_or_else(|| panic!("{name} in {pods:#?}"))
    };
    let gpu = pod("kt-gpu").container("app").expect("kt-gpu's app");
    assert_eq!(gpu.cpu_ids, set("1"));
    assert_eq!(gpu.memory_nodes(), set("1"));
    assert_eq!(gpu.devices.len(), 1);
    assert_eq!(gpu.devices[0].resource_name, "kata-topo.io/vfio");
    assert_eq!(gpu.devices[0].device_ids, ["0000:81:00.0"]);
    assert_eq!(gpu.device_nodes(), set("1"));
    let shared = pod("kt-shared").container("app").expect("kt-shared's app");
    assert!(shared.cpu_ids.is_empty() && shared.devices.is_empty());
    assert!(shared.memory_nodes().is_empty());
}
