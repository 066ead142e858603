//! The shipped `configuration-kata.toml`: kata-topo's loader reads it, the Kata keys kata-topo
//! relies on are present with the intended values, and nothing of ours sits under `[agent.*]`.

use std::path::PathBuf;

use kata_topo_core::config::Config;
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::{Mode, Policy};

fn shipped() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../configuration-kata.toml")
}

#[test]
fn our_loader_reads_the_topology_guard_table() {
    let c = Config::from_file(&shipped()).expect("valid [topology_guard]");
    assert_eq!(c.delegate_shim, "containerd-shim-kata-v2");
    assert_eq!(c.mode, Mode::Audit);
    assert_eq!(c.default_policy, Policy::Restricted);
    assert_eq!(c.state_dir, PathBuf::from("/run/kata-topo"));
    assert_eq!(c.log_file, PathBuf::from("/var/log/kata-topo.log"));
    assert!(!c.fail_closed);
    assert_eq!(c.topology_xml, None);
}

#[test]
fn the_kata_keys_we_rely_on_have_the_intended_values() {
    let k = KataConfig::load(&shipped()).expect("valid Kata configuration");
    assert!(k.enable_vcpus_pinning, "vCPU pinning on");
    assert!(k.static_sandbox_resource_mgmt, "static sandbox sizing");
    assert!(k.sandbox_cgroup_only);
    assert_eq!(
        k.hypervisor_path.as_deref(),
        Some(std::path::Path::new("/opt/kata/bin/qemu-system-x86_64")),
        "the VMM a process must run to be taken for the sandbox's"
    );
    assert!(k.enable_numa, "guest NUMA");
    assert_eq!(
        k.mapped_host_nodes().map(|n| n.to_string()).as_deref(),
        Some("0-1")
    );
    assert_eq!(
        k.cold_plug_vfio, "root-port",
        "VFIO cold-plug on root ports"
    );
    assert_eq!(k.hot_plug_vfio, "no-port");
    assert_eq!(k.vfio_mode, "guest-kernel");
    assert_eq!(k.default_vcpus, 1.0);
    for a in ["default_vcpus", "default_memory"] {
        assert!(k.allows(a), "enable_annotations allows {a}");
    }
}

#[test]
fn nothing_of_ours_under_agent_tables() {
    let text = std::fs::read_to_string(shipped()).expect("read");
    let table: toml::Table = text.parse().expect("TOML");
    // Kata's agent keys (runtime-rs rejects anything else under [agent.*]).
    let known = [
        "enable_tracing",
        "kernel_modules",
        "debug_console_enabled",
        "dial_timeout",
        "container_pipe_size",
        "debug",
        "enable_debug",
        "log_level",
        "mem_agent",
    ];
    let agent = table["agent"].as_table().expect("[agent]");
    for (name, sub) in agent {
        for key in sub.as_table().expect("[agent.X] is a table").keys() {
            assert!(
                known.contains(&key.as_str()),
                "[agent.{name}] {key} is not a Kata agent key"
            );
            assert!(!key.contains("topo"), "[agent.{name}] {key}");
        }
    }
    // Our keys live in [topology_guard] only.
    for (name, value) in &table {
        if name != "topology_guard" {
            let flat = toml::to_string(value).unwrap_or_default();
            assert!(
                !flat.contains("delegate_shim"),
                "kata-topo key under [{name}]"
            );
        }
    }
}
