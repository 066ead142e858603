//! The Vagrant environment cannot boot here (no box downloads, no nested libvirt): it is
//! validated statically, and its scenario script runs against the CI containerd with the runc
//! delegate.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use kata_topo_integration::{bin_dir, workspace, Containerd, Guard};

/// Every file of the project (outside build output) that `keep` selects.
fn files(keep: &dyn Fn(&std::path::Path, &str) -> bool) -> Vec<PathBuf> {
    fn walk(
        dir: &std::path::Path,
        keep: &dyn Fn(&std::path::Path, &str) -> bool,
        out: &mut Vec<PathBuf>,
    ) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | ".vagrant") {
                    walk(&p, keep, out);
                }
            } else if keep(&p, &name) {
                out.push(p);
            }
        }
    }
    let mut v = Vec::new();
    walk(&workspace(), keep, &mut v);
    v.sort();
    v
}

/// Every bash script of the project.
fn scripts() -> Vec<PathBuf> {
    files(&|_, name| name.ends_with(".sh"))
}

/// Every POSIX sh script (`#!/bin/sh`, such as the vm-test guest's initramfs `/init`, which
/// busybox runs).
fn sh_scripts() -> Vec<PathBuf> {
    files(&|p, name| {
        !name.ends_with(".sh") && std::fs::read(p).is_ok_and(|b| b.starts_with(b"#!/bin/sh\n"))
    })
}

fn shellcheck(script: &std::path::Path) {
    // -x from the workspace root: a script's `# shellcheck source=` names a file from there.
    let out = Command::new("shellcheck")
        .arg("-x")
        .arg(script)
        .current_dir(workspace())
        .output()
        .expect("shellcheck (apt-get install shellcheck)");
    assert!(
        out.status.success(),
        "shellcheck {}: {}",
        script.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn vagrantfile_and_scripts_are_valid() {
    let vf = workspace().join("vagrant/Vagrantfile");
    let out = Command::new("ruby")
        .arg("-c")
        .arg(&vf)
        .output()
        .expect("ruby (apt-get install ruby)");
    assert!(
        out.status.success(),
        "ruby -c: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let all = scripts();
    assert!(
        all.iter().any(|p| p.ends_with("vagrant/test.sh")),
        "{all:?}"
    );
    for script in &all {
        let text = std::fs::read_to_string(script).expect("read");
        assert!(
            text.starts_with("#!/usr/bin/env bash\n"),
            "{}",
            script.display()
        );
        assert!(
            text.contains("set -euo pipefail"),
            "{} starts with set -euo pipefail",
            script.display()
        );
        shellcheck(script);
    }
    let sh = sh_scripts();
    assert!(
        sh.iter().any(|p| p.ends_with("integration/vm-test/init")),
        "{sh:?}"
    );
    for script in &sh {
        let text = std::fs::read_to_string(script).expect("read");
        assert!(text.contains("\nset -u\n"), "{} sets -u", script.display());
        shellcheck(script);
    }
    let home = tempfile::tempdir().expect("tempdir");
    let out = Command::new("vagrant")
        .args(["validate", "--ignore-provider"])
        .current_dir(workspace().join("vagrant"))
        .env("VAGRANT_HOME", home.path().join("home"))
        .env("VAGRANT_DOTFILE_PATH", home.path().join("dot"))
        .env("VAGRANT_CHECKPOINT_DISABLE", "1")
        .output()
        .expect("vagrant (apt-get install vagrant)");
    assert!(
        out.status.success(),
        "vagrant validate: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("validated successfully"));
}

#[test]
fn the_scenario_runs_against_the_ci_containerd() {
    let c = Containerd::start(Guard {
        metrics: true,
        ..Guard::default()
    });
    let cri_dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("bash")
        .arg(workspace().join("vagrant/test.sh"))
        .env("KT_TARGET", "local")
        .env("KT_SOCK", &c.socket)
        .env("KT_LOG", &c.log_file)
        .env("KT_STATE", &c.state_dir)
        .env("KT_METRICS", &c.metrics_dir)
        .env("KT_BIN", bin_dir())
        .env("KT_NODE", "1")
        .env("KT_HOME_CPUS", "1")
        .env("KT_AWAY_CPUS", "0")
        .env("KT_VFIO", &c.vfio_node)
        .env("KT_CRI_DIR", cri_dir.path())
        .output()
        .expect("run the scenario");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    for needle in [
        "ok: log: no finding",
        "ok: log: cpu-outside-intent allow",
        "ok: log: vfio-remote allow",
        "ok: kata-topo events: /kata-topo/mismatch with cpu-outside-intent",
        "ok: kata-topo events: /kata-topo/mismatch with vfio-remote",
        "ok: kata-topo status exit 1",
        "ok: textfile: kata_topo_findings_total{rule=\"cpu-outside-intent\"}",
        "ok: log: a recreate was checked",
        "ok: refused: FailedPrecondition",
        "ok: log: vfio-remote reject",
        "ok: container still running on 1",
        "scenario passed",
    ] {
        assert!(text.contains(needle), "missing {needle:?} in\n{text}");
    }
    assert_eq!(c.wait_clean(Duration::from_secs(15)), Vec::<String>::new());
}
