//! The real kubelet's PodResources answers under every Topology Manager policy and scope, with
//! and without a device (`make k8s-record`, `tests/fixtures/pod-resources/kubelet-*/`): read
//! back as the wrapper reads them, with the kubelet's configuration of each run and the
//! node's own hwloc topology (two NUMA nodes: CPU 0 on node 0, CPU 1 and the NIC on node 1;
//! CPU 0 reserved, so the one exclusive CPU is 1).

use std::path::{Path, PathBuf};

use kata_topo_core::check::intent::KubeletIntent;
use kata_topo_core::input::kubelet::{KubeletSettings, PodAdmission, TopologyScope};
use kata_topo_core::{Host, IdSet, Policy};

const POLICIES: [(&str, Policy); 4] = [
    ("none", Policy::None),
    ("best-effort", Policy::BestEffort),
    ("restricted", Policy::Restricted),
    ("single-numa-node", Policy::SingleNumaNode),
];
const SCOPES: [(&str, TopologyScope); 2] = [
    ("container", TopologyScope::Container),
    ("pod", TopologyScope::Pod),
];

fn set(s: &str) -> IdSet {
    s.parse().expect("set")
}

/// Every recorded Kubernetes release's folder.
fn releases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/pod-resources");
    let mut found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the recordings' folder")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_dir())
        .collect();
    found.sort();
    assert!(
        !found.is_empty(),
        "no kubelet-* folder in {}",
        dir.display()
    );
    found
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// One recording: the kubelet's settings of its run and the pod it admitted.
struct Recorded {
    what: String,
    settings: KubeletSettings,
    pods: Vec<PodAdmission>,
}

impl Recorded {
    fn pod(&self, name: &str) -> &PodAdmission {
        self.pods
            .iter()
            .find(|p| p.name == name && p.namespace == "default")
            .unwrap_or_else(|| panic!("{}: no pod {name}", self.what))
    }
}

fn recordings(release: &Path, kind: &str) -> Vec<(Policy, TopologyScope, Recorded)> {
    let mut all = Vec::new();
    for (p, policy) in POLICIES {
        for (s, scope) in SCOPES {
            let base = release.join(format!("{p}-{s}"));
            let config = base.with_extension("kubelet-config.yaml");
            let answer = release.join(format!("{p}-{s}-{kind}.json"));
            let what = answer.display().to_string();
            let settings = KubeletSettings::parse(&read(&config))
                .unwrap_or_else(|e| panic!("{}: {e}", config.display()));
            let pods =
                PodAdmission::from_json(&read(&answer)).unwrap_or_else(|e| panic!("{what}: {e}"));
            all.push((
                policy,
                scope,
                Recorded {
                    what,
                    settings,
                    pods,
                },
            ));
        }
    }
    all
}

fn node_host(release: &Path) -> Host {
    let path = release.join("topology.xml");
    Host::from_xml(&read(&path), path.display().to_string()).expect("the node's topology")
}

/// Each run's kubelet configuration is the policy and scope its name says, with the static
/// CPU manager and the Static memory manager: what the wrapper takes as the default policy.
#[test]
fn each_recordings_kubelet_ran_the_policy_and_scope_it_is_named_after() {
    for release in releases() {
        for kind in ["dev", "plain"] {
            for (policy, scope, r) in recordings(&release, kind) {
                assert_eq!(r.settings.topology_manager_policy, policy, "{}", r.what);
                assert_eq!(r.settings.topology_manager_scope, scope, "{}", r.what);
                assert!(
                    r.settings.static_cpus() && r.settings.static_memory(),
                    "{}",
                    r.what
                );
            }
        }
    }
}

/// Under every policy the CPU manager gave the Guaranteed container the one exclusive CPU (1,
/// on node 1) and the device plugin's NIC its hint (node 1); the shared-pool pod has nothing
/// of its own. Only where the Topology Manager aligns (restricted, single-numa-node — and
/// best-effort, which prefers the aligned hint when there is one) is the memory on node 1
/// too: under `none` the memory manager put the container's memory on node 0, across the
/// node from its CPU and its device — the admission kata-topo's intent takes as it is.
#[test]
fn the_kubelet_admitted_the_same_cpu_and_device_under_every_policy_and_aligned_memory_only_when_asked(
) {
    for release in releases() {
        let host = node_host(&release);
        for kind in ["dev", "plain"] {
            let name = format!("kt-{kind}");
            for (policy, _, r) in recordings(&release, kind) {
                let app = r.pod(&name).container("app").expect("app");
                assert_eq!(app.cpu_ids, set("1"), "{}", r.what);
                assert_eq!(host.nodes_of_cpus(&app.cpu_ids), set("1"), "{}", r.what);
                let memory = if policy == Policy::None { "0" } else { "1" };
                assert_eq!(app.memory_nodes(), set(memory), "{}", r.what);
                match kind {
                    "dev" => {
                        assert_eq!(app.devices.len(), 1, "{}", r.what);
                        assert_eq!(app.devices[0].resource_name, "kata-topo.io/vfio");
                        assert_eq!(app.device_nodes(), set("1"), "{}", r.what);
                    }
                    _ => assert!(app.devices.is_empty(), "{}", r.what),
                }
                let shared = r.pod("kt-shared").container("app").expect("shared app");
                assert!(
                    shared.cpu_ids.is_empty()
                        && shared.devices.is_empty()
                        && shared.memory_nodes().is_empty(),
                    "{}",
                    r.what
                );
            }
        }
    }
}

/// The intent the wrapper takes from each answer: the exclusive CPU, the memory nodes and
/// the device as admitted, and the nodes they sit on — one node where the Topology Manager
/// aligned, both under `none`; the pod's and the container's nodes alike here, the pod
/// having one container. The sandbox's intent is the whole pod's.
#[test]
fn the_intent_taken_from_each_answer_is_what_the_kubelet_admitted() {
    for release in releases() {
        let host = node_host(&release);
        for kind in ["dev", "plain"] {
            let name = format!("kt-{kind}");
            for (policy, _, r) in recordings(&release, kind) {
                let pod = r.pod(&name);
                let intent = KubeletIntent::resolve(pod, &r.settings, Some("app"), &host)
                    .unwrap_or_else(|| panic!("{}: no intent for app", r.what));
                let nodes = if policy == Policy::None { "0-1" } else { "1" };
                assert_eq!(intent.cpus, Some(set("1")), "{}", r.what);
                assert_eq!(intent.numa_nodes, Some(set(nodes)), "{}", r.what);
                assert_eq!(
                    intent.devices.len(),
                    usize::from(kind == "dev"),
                    "{}",
                    r.what
                );
                let sandbox = KubeletIntent::resolve(pod, &r.settings, None, &host)
                    .expect("the sandbox's intent");
                assert_eq!(sandbox.cpus, None, "{}", r.what);
                assert_eq!(sandbox.numa_nodes, Some(set(nodes)), "{}", r.what);
                // The shared pool: nothing pinned, so no nodes to hold it to.
                let shared = r.pod("kt-shared");
                let pool = KubeletIntent::resolve(shared, &r.settings, Some("app"), &host)
                    .expect("the shared pod's container is listed");
                assert_eq!((pool.cpus, pool.numa_nodes), (None, None), "{}", r.what);
            }
        }
    }
}
