//! The requests the real kubelet (v1.36.3) and containerd sent the wrapper in `make k8s-test`
//! (`tests/fixtures/kubelet/`), replayed: each decodes, and each update gets the class that
//! says what the kubelet did — a resize, the CPU manager's push of a new cpuset, or its push of
//! the cpuset in force — against the container's resources as the wrapper keeps them (a
//! refused update changes nothing).

use std::collections::BTreeMap;

use kata_topo_core::{Resources, UpdateClass};
use serde_json::Value;

fn recorded(name: &str) -> Vec<Value> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/kubelet")
        .join(name);
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect()
}

fn replay(name: &str) -> BTreeMap<String, Vec<UpdateClass>> {
    let mut current: BTreeMap<String, Resources> = BTreeMap::new();
    let mut classes: BTreeMap<String, Vec<UpdateClass>> = BTreeMap::new();
    for line in recorded(name) {
        let task = line["task"].as_str().expect("task").to_string();
        match line["request"].as_str() {
            Some("create") => {
                let r: Resources =
                    serde_json::from_value(line["resources"].clone()).expect("create resources");
                assert!(current.insert(task, r).is_none(), "{line}");
            }
            Some("update") => {
                let update = Resources::from_json(line["resources"].to_string().as_bytes())
                    .unwrap_or_else(|e| panic!("{line}: {e}"));
                let now = current.get_mut(&task).expect("an update after its create");
                let class = now.classify(&update);
                assert_eq!(
                    class.to_string(),
                    line["class"].as_str().expect("class"),
                    "{}: {line}",
                    line["kubelet"]
                );
                if line["decision"] == "allow" {
                    *now = now.merged(&update);
                }
                classes.entry(task).or_default().push(class);
            }
            _ => panic!("unknown request: {line}"),
        }
    }
    classes
}

const RECORDINGS: [&str; 2] = [
    "v1.36.3-containerd-1.6.20.jsonl",
    "v1.36.3-containerd-2.3.4.jsonl",
];

#[test]
fn the_real_kubelets_requests_decode_and_classify_as_what_the_kubelet_did() {
    use UpdateClass::{Cpuset, Noop, Resize};
    for name in RECORDINGS {
        let classes = replay(name);
        // The shared-pool pod: pushed after its start, shrunk to CPU 0 when the Guaranteed
        // pod took CPU 1, pushed again after that, grown back to 0-1 when that pod went.
        assert_eq!(
            classes["kt-shared/app#1"],
            [Noop, Cpuset, Noop, Cpuset],
            "{name}"
        );
        // The Guaranteed container: never updated; its successor after the kill: pushed once.
        assert!(!classes.contains_key("kt-gpu/app#1"), "{name}");
        assert_eq!(classes["kt-gpu/app#2"], [Noop], "{name}");
        // Resized twice (pushes of the cpuset in force around), then grown onto node 1.
        let late = &classes["kt-late/app#1"];
        assert_eq!(late.iter().filter(|c| **c == Resize).count(), 2, "{name}");
        assert_eq!(late.last(), Some(&Cpuset), "{name}");
        // The enforce pod: its refused resize retried, the cpuset in force pushed between
        // tries, its push onto node 1 refused and retried too; nothing refused ever became its
        // resources, so every retry is the same resize again.
        let enforce = &classes["kt-enforce/app#1"];
        assert!(
            enforce.iter().all(|c| [Resize, Noop, Cpuset].contains(c)),
            "{name}"
        );
        assert!(
            enforce.iter().filter(|c| **c == Cpuset).count() >= 2,
            "{name}"
        );
        assert!(
            enforce.iter().filter(|c| **c == Resize).count() >= 10,
            "{name}"
        );
    }
}
