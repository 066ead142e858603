//! The deployment files: the containerd snippet of the version under test loads in that real
//! containerd (1.6: config version 2; 2.x: version 3), the YAML and
//! JSON parse and say what they should, node-problem-detector's patterns match exactly their
//! findings in log lines a real wrapper wrote, and `make install` / `make uninstall` leave
//! nothing behind.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kata_topo_integration::{workspace, Containerd, ContainerdBin, Guard, Resources};
use serde_json::Value;

fn deploy(rel: &str) -> PathBuf {
    workspace().join("deploy").join(rel)
}

/// The snippet for the containerd under test — `kata-topo-config-v2.toml` for 1.6/1.7,
/// `kata-topo-config-v3.toml` for 2.x — imported by a configuration of the same version and
/// dumped by that containerd: the handler arrives with its options.
#[test]
fn the_snippet_for_this_containerd_loads_in_the_real_containerd() {
    let bins = ContainerdBin::get();
    let (version, snippet, runtimes) = if bins.is_v2() {
        (
            3,
            "containerd/kata-topo-config-v3.toml",
            vec!["io.containerd.cri.v1.runtime", "containerd", "runtimes"],
        )
    } else {
        (
            2,
            "containerd/kata-topo-config-v2.toml",
            vec!["io.containerd.grpc.v1.cri", "containerd", "runtimes"],
        )
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let main = dir.path().join("config.toml");
    std::fs::write(
        &main,
        format!(
            "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\nimports = [\"{1}\"]\n",
            dir.path().display(),
            deploy(snippet).display()
        ),
    )
    .expect("config");
    let out = Command::new(bins.containerd())
        .arg("--config")
        .arg(&main)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dump: toml::Table = String::from_utf8_lossy(&out.stdout)
        .parse()
        .expect("dump is TOML");
    let mut rt = &dump["plugins"];
    for key in runtimes {
        rt = &rt[key];
    }
    let rt = &rt["kata-topo"];
    assert_eq!(
        rt["runtime_type"].as_str(),
        Some("io.containerd.kata-topo.v2"),
        "{} did not load {snippet}",
        bins.version_text
    );
    let annotations: Vec<&str> = rt["pod_annotations"]
        .as_array()
        .expect("pod_annotations")
        .iter()
        .filter_map(|v| v.as_str())
        .collect();
    assert!(annotations.contains(&"kata-topo.io/*"), "{annotations:?}");
    assert_eq!(
        rt["options"]["ConfigPath"].as_str(),
        Some("/opt/kata/share/defaults/kata-containers/configuration-kata-topo.toml")
    );
}

#[test]
fn the_containerd_2_snippet_is_version_3() {
    let text =
        std::fs::read_to_string(deploy("containerd/kata-topo-config-v3.toml")).expect("read");
    let t: toml::Table = text.parse().expect("TOML");
    assert_eq!(t["version"].as_integer(), Some(3));
    let rt = &t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["kata-topo"];
    assert_eq!(
        rt["runtime_type"].as_str(),
        Some("io.containerd.kata-topo.v2")
    );
    assert!(rt["pod_annotations"]
        .as_array()
        .is_some_and(|a| a.iter().any(|v| v.as_str() == Some("kata-topo.io/*"))));
}

#[test]
fn kubernetes_and_npd_files_parse_and_say_what_they_should() {
    let yaml = |rel: &str| -> Vec<serde_yaml::Value> {
        let text = std::fs::read_to_string(deploy(rel)).expect("read");
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| {
                <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("YAML document")
            })
            .collect()
    };
    let rc = &yaml("kubernetes/runtimeclass.yaml")[0];
    assert_eq!(rc["kind"].as_str(), Some("RuntimeClass"));
    assert_eq!(rc["handler"].as_str(), Some("kata-topo"));
    assert!(rc["overhead"]["podFixed"]["cpu"].is_string());
    assert!(rc["scheduling"]["nodeSelector"].is_mapping());
    let pod = &yaml("kubernetes/example-pod.yaml")[0];
    assert_eq!(pod["spec"]["runtimeClassName"].as_str(), Some("kata-topo"));
    assert_eq!(
        pod["metadata"]["annotations"]["kata-topo.io/policy"].as_str(),
        Some("single-numa-node")
    );
    assert!(pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"].is_string());
    let ds = &yaml("node-problem-detector/daemonset-patch.yaml")[0];
    assert_eq!(ds["kind"].as_str(), Some("DaemonSet"));
    let plugin: Value = serde_json::from_slice(
        &std::fs::read(deploy(
            "node-problem-detector/kata-topo-plugin-monitor.json",
        ))
        .expect("read"),
    )
    .expect("JSON");
    assert_eq!(plugin["plugin"], "custom");
    assert_eq!(plugin["conditions"][0]["type"], "KataTopologyMismatch");
    assert_eq!(plugin["rules"][0]["type"], "permanent");
    assert_eq!(plugin["rules"][0]["args"][0], "status");
}

/// The device plugin's DaemonSet and systemd unit: what they run is the installed binary, with
/// flags the real binary accepts (run here with `--once` on a generated sysfs tree), the kubelet's
/// directory writable, the host's /sys read-only, and no privilege.
#[test]
fn the_device_plugin_daemonset_and_unit_run_the_binary_with_flags_it_accepts() {
    let text = std::fs::read_to_string(deploy("device-plugin/daemonset.yaml")).expect("read");
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&text)
        .map(|d| <serde_yaml::Value as serde::Deserialize>::deserialize(d).expect("YAML document"))
        .collect();
    assert_eq!(docs.len(), 1);
    let ds = &docs[0];
    assert_eq!(ds["kind"].as_str(), Some("DaemonSet"));
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let c = &pod["containers"][0];
    assert!(c["image"]
        .as_str()
        .is_some_and(|i| i.starts_with("localhost/kata-topo/device-plugin:")));
    assert!(matches!(
        c["imagePullPolicy"].as_str(),
        Some("IfNotPresent" | "Never")
    ));
    assert_eq!(c["securityContext"]["privileged"].as_bool(), Some(false));
    assert_eq!(
        c["securityContext"]["allowPrivilegeEscalation"].as_bool(),
        Some(false)
    );
    let mounts: Vec<(&str, &str, bool)> = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            (
                m["name"].as_str().expect("name"),
                m["mountPath"].as_str().expect("mountPath"),
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let host_path = |name: &str| {
        pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|v| v["name"].as_str() == Some(name))
            .and_then(|v| v["hostPath"]["path"].as_str())
            .map(str::to_string)
    };
    for (name, path, read_only) in &mounts {
        match host_path(name).as_deref() {
            Some("/var/lib/kubelet/device-plugins") => {
                assert_eq!(*path, "/var/lib/kubelet/device-plugins");
                assert!(!read_only);
            }
            Some("/sys") => assert!(*read_only, "/sys is mounted read-only"),
            other => panic!("unexpected mount {name}: {other:?}"),
        }
    }
    assert_eq!(mounts.len(), 2);

    // The DaemonSet's command, with its sysfs root swapped for a generated tree, lists the
    // tree's VFIO device.
    let command: Vec<String> = c["command"]
        .as_sequence()
        .expect("command")
        .iter()
        .map(|a| a.as_str().expect("string").to_string())
        .collect();
    assert_eq!(command[0], "/usr/local/bin/kata-topo-device-plugin");
    let dir = tempfile::tempdir().expect("tempdir");
    let tree = kata_topo_core::testutil::SysfsTree::at(dir.path().join("sys")).expect("tree");
    tree.add_device(
        "0000:80:00.0".parse().expect("bdf"),
        1,
        Some("vfio-pci"),
        Some("42"),
    )
    .expect("device");
    let mut args: Vec<String> = command[1..]
        .iter()
        .map(|a| {
            if a.starts_with("--sysfs-root=") {
                format!("--sysfs-root={}", tree.root().display())
            } else {
                a.clone()
            }
        })
        .collect();
    args.push("--once".into());
    let plugin = kata_topo_integration::bin_dir().join("kata-topo-device-plugin");
    let out = Command::new(&plugin)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", plugin.display()));
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(listed["resource_name"], "kata-topo.io/vfio");
    assert_eq!(listed["devices"][0]["id"], "0000:80:00.0");
    assert_eq!(listed["devices"][0]["numa_node"], 1);

    let unit = std::fs::read_to_string(deploy("device-plugin/kata-topo-device-plugin.service"))
        .expect("read unit");
    let value = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("the unit sets {key}"))
    };
    assert_eq!(value("ExecStart"), "/usr/local/bin/kata-topo-device-plugin");
    assert_eq!(value("ReadWritePaths"), "-/var/lib/kubelet/device-plugins");
    assert_eq!(value("CapabilityBoundingSet"), "");
    assert_eq!(value("WantedBy"), "multi-user.target");
}

fn yaml_docs(path: &Path) -> Vec<serde_yaml::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| {
            <serde_yaml::Value as serde::Deserialize>::deserialize(d)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        })
        .collect()
}

fn strings(v: &serde_yaml::Value) -> Vec<String> {
    v.as_sequence()
        .map(|s| {
            s.iter()
                .map(|a| a.as_str().expect("a string").to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// The images of the containers of every object a kustomization builds (its resources,
/// through the bases it names).
fn kustomized_images(dir: &Path) -> Vec<String> {
    let k = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    let mut images = Vec::new();
    for r in strings(&k["resources"]) {
        let path = dir.join(&r);
        assert!(path.exists(), "{}: resource {r} is missing", dir.display());
        if path.is_dir() {
            images.extend(kustomized_images(&path));
            continue;
        }
        for doc in yaml_docs(&path) {
            for c in doc["spec"]["template"]["spec"]["containers"]
                .as_sequence()
                .into_iter()
                .flatten()
            {
                images.push(c["image"].as_str().expect("image").to_string());
            }
        }
    }
    for g in k["configMapGenerator"].as_sequence().into_iter().flatten() {
        for f in strings(&g["files"]) {
            assert!(dir.join(&f).is_file(), "{}: {f} is missing", dir.display());
        }
    }
    images
}

/// Every kustomize base of `deploy/`: what it lists exists, and each image it sets a tag on is
/// an image its containers run (kustomize changes nothing, silently, for a name no container
/// has).
#[test]
fn every_kustomization_lists_what_exists_and_tags_images_its_containers_run() {
    let mut bases = 0;
    for e in std::fs::read_dir(workspace().join("deploy")).expect("deploy/") {
        let dir = e.expect("entry").path();
        if !dir.join("kustomization.yaml").is_file() {
            continue;
        }
        bases += 1;
        let images = kustomized_images(&dir);
        let k = &yaml_docs(&dir.join("kustomization.yaml"))[0];
        for i in k["images"].as_sequence().into_iter().flatten() {
            let name = i["name"].as_str().expect("name");
            assert!(
                images
                    .iter()
                    .any(|c| c == name || c.starts_with(&format!("{name}:"))),
                "{}: no container runs {name}: {images:?}",
                dir.display()
            );
        }
    }
    assert!(bases >= 4, "deploy/ has its kustomize bases: {bases}");
}

/// The NRI plugin's DaemonSet (`deploy/nri/`): the flags it runs the binary with are the
/// binary's own (`--help`), its configuration is one the core reads (every key known, every
/// value valid), every path of it is on a volume the DaemonSet mounts, the image is the one its
/// kustomization tags, and it holds no privilege. (`tests/nri.rs` runs it against containerd.)
#[test]
fn the_nri_daemonset_runs_flags_the_binary_has_on_a_configuration_the_core_reads() {
    let dir = deploy("nri");
    let k = &yaml_docs(&dir.join("kustomization.yaml"))[0];
    assert_eq!(k["namespace"].as_str(), Some("kube-system"));
    let docs = yaml_docs(&dir.join("daemonset.yaml"));
    assert_eq!(docs.len(), 1);
    let ds = &docs[0];
    assert_eq!(ds["kind"].as_str(), Some("DaemonSet"));
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert!(
        pod["tolerations"]
            .as_sequence()
            .is_some_and(|t| t.iter().any(|t| t["operator"].as_str() == Some("Exists"))),
        "on every node, tainted or not"
    );
    assert_eq!(pod["automountServiceAccountToken"].as_bool(), Some(false));
    assert_ne!(pod["hostPID"].as_bool(), Some(true));
    let c = &pod["containers"][0];
    let image = c["image"].as_str().expect("image");
    assert_eq!(
        k["images"][0]["name"].as_str(),
        Some(image),
        "the kustomization tags the DaemonSet's image"
    );
    let sc = &c["securityContext"];
    assert_eq!(sc["privileged"].as_bool(), Some(false));
    assert_eq!(sc["allowPrivilegeEscalation"].as_bool(), Some(false));
    assert_eq!(sc["readOnlyRootFilesystem"].as_bool(), Some(true));
    assert_eq!(strings(&sc["capabilities"]["drop"]), ["ALL"]);
    assert!(sc["capabilities"]["add"].is_null());

    let env = c["env"].as_sequence().expect("env");
    assert!(
        env.iter()
            .any(|v| v["name"].as_str() == Some("MALLOC_ARENA_MAX")
                && v["value"].as_str() == Some("1")),
        "one malloc arena, as the wrapper's daemon runs: {env:?}"
    );
    let command = strings(&c["command"]);
    assert_eq!(command[0], "/usr/local/bin/kata-topo-nri");
    let binary = kata_topo_integration::bin_dir().join("kata-topo-nri");
    let help = Command::new(&binary)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", binary.display()));
    assert!(help.status.success());
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in command.iter().filter(|a| a.starts_with('-')) {
        assert!(
            help.split(|c: char| c == '[' || c == ']' || c.is_whitespace())
                .any(|w| w == flag),
            "kata-topo-nri has no {flag}: {help}"
        );
    }
    let config_at = command
        .iter()
        .position(|a| a == "--config")
        .and_then(|i| command.get(i + 1))
        .expect("--config FILE");

    // The configuration: the generator's one file, parsed as the binary parses it.
    let generator = &k["configMapGenerator"][0];
    let files = strings(&generator["files"]);
    assert_eq!(files.len(), 1);
    let file = dir.join(&files[0]);
    let text = std::fs::read_to_string(&file).expect("read");
    let config = kata_topo_core::config::Config::parse(&text, &file)
        .unwrap_or_else(|e| panic!("{}", kata_topo_core::text::error_chain(&e)));
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    let mounts: Vec<(&str, &serde_yaml::Value, bool)> = c["volumeMounts"]
        .as_sequence()
        .expect("volumeMounts")
        .iter()
        .map(|m| {
            let name = m["name"].as_str().expect("name");
            let v = volumes
                .iter()
                .find(|v| v["name"].as_str() == Some(name))
                .unwrap_or_else(|| panic!("no volume {name}"));
            (
                m["mountPath"].as_str().expect("mountPath"),
                v,
                m["readOnly"].as_bool().unwrap_or(false),
            )
        })
        .collect();
    let mount = |p: &Path| {
        mounts
            .iter()
            .filter(|(at, _, _)| p.starts_with(at))
            .max_by_key(|(at, _, _)| at.len())
            .unwrap_or_else(|| panic!("{} is on no volume", p.display()))
    };
    let (_, cm, _) = mount(Path::new(config_at));
    assert_eq!(
        cm["configMap"]["name"], generator["name"],
        "--config is the generated ConfigMap's file"
    );
    assert!(config_at.ends_with(&files[0]));
    // Each path the plugin reads or writes, on the node's same path (procfs_root: the node's
    // /proc), written only where it must write.
    let host_path = |v: &serde_yaml::Value| v["hostPath"]["path"].as_str().map(str::to_string);
    for (key, p, writes) in [
        ("nri_socket", config.nri_socket.clone(), false),
        ("state_dir", config.state_dir.clone(), true),
        ("log_file", config.log_file.clone(), true),
        (
            "metrics_dir",
            config.metrics_dir.clone().expect("metrics_dir"),
            true,
        ),
        (
            "kubelet_pod_resources_socket",
            config.kubelet_pod_resources_socket.clone(),
            false,
        ),
        ("kubelet_config", config.kubelet_config.clone(), false),
        ("sysfs_root", config.sysfs_root.clone(), false),
    ] {
        let (at, v, read_only) = mount(&p);
        assert_eq!(
            host_path(v).as_deref(),
            Some(*at),
            "{key}: {} is the node's own path",
            p.display()
        );
        assert_eq!(*read_only, !writes, "{key}: {} read-only", p.display());
    }
    let (at, v, read_only) = mount(&config.procfs_root);
    assert_eq!(
        host_path(v).as_deref(),
        Some("/proc"),
        "procfs_root at {at}"
    );
    assert!(*read_only);
    assert!(config.topology_xml.is_none(), "the live machine");
    assert_eq!(
        config.state_dir,
        kata_topo_core::config::Config::default().state_dir,
        "the wrapper's state_dir, where a pod's wrapper daemon is seen"
    );
}

fn npd(rel: &str) -> Value {
    serde_json::from_slice(&std::fs::read(deploy(rel)).expect("read")).expect("JSON")
}

/// Every rule id kata-topo has.
const RULES: &[&str] = &[
    "cpu-unknown",
    "cpu-spans-numa",
    "cpu-outside-intent",
    "mems-mismatch",
    "memory-exceeds-nodes",
    "vfio-remote",
    "vfio-locality-unknown",
    "vfio-missing",
    "topology-drift",
    "vcpu-pinning-lost",
    "vcpu-affinity-drift",
    "vcpu-overlap",
    "guest-numa-uncovered",
    "check-failed",
    "intent-invalid",
    "override-ignored",
];

/// Lines for every rule: those a real wrapper under a real containerd wrote, plus one per
/// remaining rule written by the same logger.
fn log_lines() -> Vec<String> {
    let c = Containerd::start(Guard::default());
    let mut cri = c.cri();
    let (pod, _cfg, id) = cri.admit(
        "npd",
        &[
            ("kata-topo.io/policy", "single-numa-node"),
            ("kata-topo.io/numa-nodes", "1"),
        ],
        true,
    );
    let res = Resources::admitted();
    cri.update(&id, &res.on("0")).expect("push");
    cri.update(&id, &res.on("0-1")).expect("widen");
    cri.remove_pod(&pod);
    let _ = c.wait_clean(Duration::from_secs(15));
    let mut lines: Vec<String> = std::fs::read_to_string(&c.log_file)
        .expect("log")
        .lines()
        .map(str::to_string)
        .collect();
    let seen: Vec<String> = lines
        .iter()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|l| l["rule"].as_str().map(str::to_string))
        .collect();
    for expected in ["cpu-outside-intent", "cpu-spans-numa", "vfio-remote"] {
        assert!(
            seen.iter().any(|r| r == expected),
            "the wrapper logged {expected}: {seen:?}"
        );
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("more.log");
    let log = kata_topo_sinks::Log::open(&path, false, kata_topo_sinks::Drops::new());
    for rule in RULES.iter().filter(|r| !seen.iter().any(|s| s == *r)) {
        let v: kata_topo_core::Verdict = serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "cpuset", "sandbox_id": "sb", "container_id": "c",
            "container_name": "app", "pod": {"name": "p", "namespace": "ns", "uid": "u"},
            "policy": "restricted", "mode": "audit", "decision": "allow",
            "findings": [{"rule": rule, "severity": "warning", "message": format!("a {rule} finding mentioning \"rule\":\"vfio-remote\""),
                          "expected": {"rule": "vfio-remote"}, "observed": {}}]
        }))
        .expect("verdict");
        kata_topo_sinks::log_verdict(log.logger(), &v);
    }
    assert!(log.flush(std::time::Instant::now() + Duration::from_secs(10)));
    lines.extend(
        std::fs::read_to_string(&path)
            .expect("log")
            .lines()
            .map(str::to_string),
    );
    lines
}

#[test]
fn npd_patterns_match_exactly_their_findings() {
    let lines = log_lines();
    for file in [
        "kata-topo-filelog-monitor.json",
        "kata-topo-journald-monitor.json",
    ] {
        let monitor = npd(&format!("node-problem-detector/{file}"));
        let rules = monitor["rules"].as_array().expect("rules");
        assert_eq!(
            rules.len(),
            RULES.len(),
            "{file}: one NPD rule per kata-topo rule"
        );
        for rule in rules {
            let pattern = rule["pattern"].as_str().expect("pattern");
            assert!(
                pattern.ends_with('$'),
                "{file}: {pattern} is anchored to the end of the line"
            );
            let re = regex::Regex::new(pattern).expect("RE2-compatible pattern");
            let reason = rule["reason"].as_str().expect("reason");
            let id = RULES
                .iter()
                .find(|r| pattern.contains(&format!("\"rule\":\"{r}\"")))
                .unwrap_or_else(|| panic!("{pattern} names no rule"));
            let mut matched = 0;
            for line in &lines {
                let finding: Value = serde_json::from_str(line).expect("JSON line");
                let is_it = finding["rule"] == *id;
                assert_eq!(re.is_match(line), is_it, "{reason} vs {line}");
                matched += usize::from(is_it);
            }
            assert!(matched > 0, "{reason} matched no line");
        }
    }
    let filelog = npd("node-problem-detector/kata-topo-filelog-monitor.json");
    let ts = regex::Regex::new(filelog["pluginConfig"]["timestamp"].as_str().expect("ts"))
        .expect("ts re");
    let msg = regex::Regex::new(filelog["pluginConfig"]["message"].as_str().expect("msg"))
        .expect("msg re");
    for line in &lines {
        let stamp = ts
            .captures(line)
            .and_then(|c| c.get(1))
            .expect("a timestamp")
            .as_str();
        assert!(stamp.ends_with('Z') && stamp.len() == 27, "{stamp}");
        let finding = line.contains("\"event\":\"finding\"");
        assert_eq!(msg.is_match(line), finding, "{line}");
    }
}

#[test]
fn make_install_and_uninstall_leave_nothing_behind() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("root");
    let make = |target: &str| {
        let out = Command::new("make")
            .arg("-C")
            .arg(workspace())
            .arg(target)
            .arg(format!("DESTDIR={}", dest.display()))
            .arg("PROFILE=debug")
            .output()
            .expect("make");
        assert!(
            out.status.success(),
            "make {target}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    make("install");
    for f in [
        "usr/local/bin/containerd-shim-kata-topo-v2",
        "usr/local/bin/kata-topo",
        "usr/local/bin/kata-topo-hook",
        "usr/local/bin/kata-topo-device-plugin",
        "usr/local/bin/kata-topo-nri",
        "usr/local/share/kata-topo/device-plugin/daemonset.yaml",
        "usr/local/share/kata-topo/device-plugin/kata-topo-device-plugin.service",
        "usr/local/share/kata-topo/nri/daemonset.yaml",
        "usr/local/share/kata-topo/nri/kustomization.yaml",
        "usr/local/share/kata-topo/nri/configuration-kata-topo.toml",
        "opt/kata/share/defaults/kata-containers/configuration-kata-topo.toml",
        "usr/local/share/kata-topo/containerd/kata-topo-config-v2.toml",
        "usr/local/share/kata-topo/node-problem-detector/kata-topo-plugin-monitor.json",
        "usr/local/share/kata-topo/kubernetes/runtimeclass.yaml",
    ] {
        assert!(dest.join(f).is_file(), "{f} installed");
    }
    make("uninstall");
    let left: Vec<PathBuf> = walk(&dest);
    assert_eq!(left, Vec::<PathBuf>::new(), "uninstall leaves nothing");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        out.push(e.path());
        if e.path().is_dir() {
            out.extend(walk(&e.path()));
        }
    }
    out
}
