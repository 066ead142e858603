//! The kubectl plugin (`deploy/installer/kubectl-kata_topo`) against a stand-in `kubectl`: no
//! cluster runs here (`make k8s-test` runs the plugin with the real kubectl on a real node). The
//! stand-in answers the plugin's three calls as a cluster would and records them: which pod's
//! node is asked, which installer pod is looked for, what runs in it, and that the node's exit
//! code and answer come back — or, when kubectl itself fails, 2 and one line.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn plugin() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/installer/kubectl-kata_topo")
}

/// A stand-in kubectl in a temporary directory, answering from its environment.
struct Kubectl {
    dir: tempfile::TempDir,
}

impl Kubectl {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let script = r#"#!/bin/sh
set -u
echo "$*" >> "$FAKE_LOG"
case "$*" in
  *"get pod -n "*" -o jsonpath={.spec.nodeName}") printf '%s' "$FAKE_NODE"; exit "${FAKE_GET_RC:-0}" ;;
  *"get pods -n "*) printf '%s' "$FAKE_INSTALLERS"; exit 0 ;;
  *"exec "*) printf '%s' "$FAKE_EXEC_OUT"; echo "$FAKE_EXEC_ERR" >&2; exit "$FAKE_EXEC_RC" ;;
esac
echo "stand-in kubectl: unexpected call: $*" >&2
exit 99
"#;
        let path = dir.path().join("kubectl");
        std::fs::write(&path, script).expect("kubectl");
        let status = Command::new("chmod")
            .arg("+x")
            .arg(&path)
            .status()
            .expect("chmod");
        assert!(status.success());
        Self { dir }
    }

    fn log(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    fn run(&self, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(plugin());
        cmd.args(args)
            .env("KUBECTL", self.dir.path().join("kubectl"))
            .env("FAKE_LOG", self.dir.path().join("calls"))
            .env("FAKE_NODE", "worker-1")
            .env(
                "FAKE_INSTALLERS",
                "kata-topo-installer-x7k2p kata-topo-installer-old",
            )
            .env(
                "FAKE_EXEC_OUT",
                "pod ml/gpu-pod on node worker-1 (sandbox sb-1): 1 finding\n",
            )
            .env("FAKE_EXEC_ERR", "")
            .env("FAKE_EXEC_RC", "1");
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd.output().expect("run the plugin")
    }
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn the_plugin_runs_the_nodes_diagnose_in_the_installers_pod_and_keeps_its_answer() {
    let k = Kubectl::new();
    let out = k.run(&["diagnose", "ml/gpu-pod"], &[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "pod ml/gpu-pod on node worker-1 (sandbox sb-1): 1 finding\n"
    );
    assert_eq!(
        k.log(),
        [
            "get pod -n ml gpu-pod -o jsonpath={.spec.nodeName}",
            "get pods -n kube-system -l app.kubernetes.io/name=kata-topo-installer \
             --field-selector spec.nodeName=worker-1,status.phase=Running \
             -o jsonpath={.items[*].metadata.name}",
            "exec -n kube-system kata-topo-installer-x7k2p -c installer -- \
             /opt/kata-topo-payload/bin/kata-topo diagnose --enter-host ml/gpu-pod",
        ]
    );
    // --json goes along; 0 and 2 come back as they are.
    let out = k.run(
        &["diagnose", "ml/gpu-pod", "--json"],
        &[
            ("FAKE_EXEC_OUT", "{\"status\":\"ok\"}"),
            ("FAKE_EXEC_RC", "0"),
        ],
    );
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "{\"status\":\"ok\"}\n"
    );
    assert!(k
        .log()
        .last()
        .is_some_and(|l| l.ends_with("diagnose --enter-host ml/gpu-pod --json")));
    let out = k.run(
        &["diagnose", "ml/runc-pod"],
        &[
            (
                "FAKE_EXEC_OUT",
                "pod ml/runc-pod: cannot tell: kata-topo holds no state for it",
            ),
            ("FAKE_EXEC_RC", "2"),
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stdout).contains("cannot tell"));
    // The settings move the installer's namespace, selector, container and CLI.
    let out = k.run(
        &["diagnose", "ml/gpu-pod"],
        &[
            ("KATA_TOPO_INSTALLER_NAMESPACE", "kata-topo"),
            ("KATA_TOPO_INSTALLER_SELECTOR", "app=kt"),
            ("KATA_TOPO_INSTALLER_CONTAINER", "main"),
            ("KATA_TOPO_CLI", "/usr/bin/kata-topo"),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let log = k.log();
    assert!(
        log[log.len() - 2].starts_with("get pods -n kata-topo -l app=kt "),
        "{log:?}"
    );
    assert!(
        log[log.len() - 1].starts_with(
            "exec -n kata-topo kata-topo-installer-x7k2p -c main -- /usr/bin/kata-topo diagnose"
        ),
        "{log:?}"
    );
}

#[test]
fn what_the_plugin_cannot_do_is_exit_2_and_one_line() {
    let k = Kubectl::new();
    let one_line = |out: &Output, has: &str| {
        assert_eq!(out.status.code(), Some(2), "{}", stderr(out));
        let e = stderr(out);
        let lines: Vec<&str> = e
            .lines()
            .filter(|l| l.starts_with("kubectl kata-topo:"))
            .collect();
        assert_eq!(lines.len(), 1, "{e}");
        assert!(lines[0].contains(has), "{e}");
    };
    // kubectl could not exec (no rights): its 1 is not a finding.
    let out = k.run(
        &["diagnose", "ml/gpu-pod"],
        &[
            ("FAKE_EXEC_OUT", ""),
            (
                "FAKE_EXEC_ERR",
                "Error from server (Forbidden): pods \"x\" is forbidden",
            ),
        ],
    );
    one_line(&out, "cannot run kata-topo diagnose in pod kube-system/kata-topo-installer-x7k2p on node worker-1 (kubectl exec exited 1)");
    assert!(String::from_utf8_lossy(&out.stdout).is_empty());
    one_line(
        &k.run(&["diagnose", "ml/pending"], &[("FAKE_NODE", "")]),
        "pod ml/pending is not bound to a node yet",
    );
    one_line(
        &k.run(
            &["diagnose", "ml/gone"],
            &[("FAKE_NODE", ""), ("FAKE_GET_RC", "1")],
        ),
        "cannot read pod ml/gone",
    );
    one_line(
        &k.run(&["diagnose", "ml/gpu-pod"], &[("FAKE_INSTALLERS", "")]),
        "no running kata-topo installer pod on node worker-1",
    );
    let before = k.log().len();
    for bad in [
        &["diagnose"][..],
        &["diagnose", "gpu-pod"],
        &["diagnose", "ml/a/b"],
        &["diagnose", "/p"],
        &["diagnose", "ml/"],
        &["diagnose", "a/b", "c/d"],
        &["diagnose", "a/b", "--yaml"],
        &["status"],
    ] {
        let out = k.run(bad, &[]);
        assert_eq!(out.status.code(), Some(2), "{bad:?}");
        assert!(
            stderr(&out).contains("usage: kubectl kata-topo diagnose NAMESPACE/POD [--json]"),
            "{bad:?}"
        );
    }
    assert_eq!(k.log().len(), before, "bad usage asks the cluster nothing");
    let help = k.run(&["--help"], &[]);
    assert_eq!(help.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&help.stdout).starts_with("usage: "));
}
