//! The installer's program (`deploy/installer/kata-topo-installer`) on a node made of a
//! directory, run by busybox's sh as in its image, with a kubectl that records what it is asked:
//! the handler it writes loads in the real containerd under test (config version 2 for 1.x, 3
//! for 2.x), a second install changes nothing, an upgrade renames new binaries over the old
//! while a process keeps the old file, the preStop hook keeps the node while the DaemonSet
//! stays and restores it exactly when it is gone, and a configuration without `imports`, a
//! symlink on the way and someone else's handler are refused with nothing written. The same
//! program on a real node, with the real API server: `make k8s-test`
//! (`integration/k8s-test/steps-installer.sh`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kata_topo_integration::{workspace, ContainerdBin};

/// A node (`host/`), the image's payload, and a kubectl stub.
struct Node {
    dir: tempfile::TempDir,
}

const STUB: &str = r#"#!/bin/sh
echo "$*" >> "$NODE_DIR/kubectl.log"
case "$*" in
  *containerRuntimeVersion*) echo "containerd://$FAKE_CONTAINERD" ;;
  "get daemonset"*) if [ -e "$NODE_DIR/ds-gone" ]; then echo 'Error from server (NotFound): daemonsets.apps "kata-topo-installer" not found' >&2; exit 1; fi ;;
  "create -f -") cat >> "$NODE_DIR/events.log" ;;
esac
"#;

impl Node {
    fn new(main_config: &str) -> Self {
        let node = Self {
            dir: tempfile::tempdir().expect("tempdir"),
        };
        let d = node.dir.path();
        for sub in ["host/etc/containerd/conf.d", "host/usr/local/bin", "stub"] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        std::fs::write(d.join("host/etc/containerd/config.toml"), main_config).expect("config");
        std::fs::write(d.join("stub/kubectl"), STUB).expect("stub");
        chmod(&d.join("stub/kubectl"), 0o755);
        node.payload("1.0.0");
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// The image's payload at VERSION: each binary's content names the version.
    fn payload(&self, version: &str) {
        let p = self.path("payload");
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(p.join("bin")).expect("bin");
        std::fs::create_dir_all(p.join("share/node-problem-detector")).expect("share");
        std::fs::write(p.join("VERSION"), format!("{version}\n")).expect("VERSION");
        for b in [
            "containerd-shim-kata-topo-v2",
            "kata-topo",
            "kata-topo-hook",
            "kata-topo-device-plugin",
        ] {
            std::fs::write(p.join("bin").join(b), format!("{b} {version}\n")).expect("bin");
        }
        std::fs::copy(
            workspace().join("configuration-kata.toml"),
            p.join("share/configuration-kata-topo.toml"),
        )
        .expect("config");
        for e in std::fs::read_dir(workspace().join("deploy/node-problem-detector"))
            .expect("npd")
            .flatten()
        {
            if e.path().extension().is_some_and(|x| x == "json") {
                std::fs::copy(
                    e.path(),
                    p.join("share/node-problem-detector").join(e.file_name()),
                )
                .expect("json");
            }
        }
    }

    /// Runs the installer with ARG; `install` runs until it waits for TERM, so it is stopped
    /// after `wait`.
    fn run(&self, arg: &str, containerd: &str) -> Output {
        let mut cmd = Command::new("timeout");
        if arg == "install" {
            cmd.args(["-s", "TERM", "4"]);
        } else {
            cmd.arg("60");
        }
        cmd.arg("busybox")
            .arg("sh")
            .arg(workspace().join("deploy/installer/kata-topo-installer"))
            .arg(arg)
            .env("NODE_DIR", self.dir.path())
            .env("NODE_NAME", "node-1")
            .env("FAKE_CONTAINERD", containerd)
            .env("KATA_TOPO_HOST_ROOT", self.path("host"))
            .env("KATA_TOPO_RUN_DIR", self.dir.path())
            .env("KATA_TOPO_PAYLOAD", self.path("payload"))
            .env("KATA_TOPO_KUBECTL", self.path("stub/kubectl"))
            .env("KATA_TOPO_HOST_EXEC", " ")
            .env(
                "KATA_TOPO_CONTAINERD_DUMP",
                format!(
                    "{} --config {} config dump",
                    ContainerdBin::get().containerd().display(),
                    self.path("host/etc/containerd/config.toml").display()
                ),
            )
            .env(
                "KATA_TOPO_RESTART_CONTAINERD",
                format!("echo restart >> {}", self.path("restarts").display()),
            )
            .env(
                "KATA_TOPO_CONFIG_OVERRIDE",
                self.path("no-override").to_string_lossy().into_owned(),
            );
        cmd.output().expect("run the installer")
    }

    fn restarts(&self) -> usize {
        std::fs::read_to_string(self.path("restarts"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn kubectl(&self) -> String {
        std::fs::read_to_string(self.path("kubectl.log")).unwrap_or_default()
    }

    /// Every path under host/ with its type and content.
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.path("host"), &self.path("host"), &mut out);
        out.sort();
        out
    }
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).expect("read_dir").flatten() {
        let p = e.path();
        let rel = p
            .strip_prefix(root)
            .expect("under root")
            .display()
            .to_string();
        let meta = std::fs::symlink_metadata(&p).expect("meta");
        if meta.is_symlink() {
            out.push(format!(
                "{rel} -> {}",
                std::fs::read_link(&p).expect("link").display()
            ));
        } else if meta.is_dir() {
            out.push(format!("{rel}/"));
            walk(root, &p, out);
        } else {
            out.push(format!(
                "{rel} {:?}",
                std::fs::read(&p).expect("read").len()
            ));
        }
    }
}

fn chmod(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

const WITH_IMPORTS: &str = "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n";

/// The operator's CRI settings in a main configuration of VERSION.
fn operators_cri(version: u32) -> &'static str {
    if version == 3 {
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"example.org/pause:9\"\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = \"fast\"\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.fast]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"example.org/pause:9\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"fast\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.fast]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    }
}

/// The handler the installer writes for the containerd under test, loaded by that containerd
/// beside the operator's CRI settings, which stay in force (containerd 1.x replaces a plugin's
/// whole section with an import's: the handler's file carries the section as it was).
#[test]
fn the_handler_loads_in_the_real_containerd_and_a_second_install_changes_nothing() {
    let bins = ContainerdBin::get();
    let (version, containerd) = if bins.is_v2() {
        (3, "2.3.4")
    } else {
        (2, "1.6.20~ds1")
    };
    let node = Node::new(&format!(
        "version = {version}\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n{}",
        operators_cri(version)
    ));
    let out = node.run("install", containerd);
    assert!(
        text(&out).contains("installed kata-topo 1.0.0"),
        "{}",
        text(&out)
    );
    assert_eq!(node.restarts(), 1);
    assert!(node
        .kubectl()
        .contains("label node node-1 kata-topo.io/installed=1.0.0"));
    let dropin = node.path("host/etc/containerd/conf.d/kata-topo.toml");
    let written = std::fs::read_to_string(&dropin).expect("the handler");
    assert!(
        written.contains(&format!("\nversion = {version}\n")),
        "{written}"
    );
    // containerd 1.x finds the shim on its PATH: the link; 2.x takes runtime_path.
    let link = node.path("host/usr/local/bin/containerd-shim-kata-topo-v2");
    assert_eq!(
        std::fs::read_link(&link).ok(),
        (version == 2).then(|| PathBuf::from("/opt/kata-topo/bin/containerd-shim-kata-topo-v2"))
    );

    let main = node.path("dump.toml");
    std::fs::write(
        &main,
        format!(
            "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\nimports = [\"{1}\"]\n{2}",
            node.dir.path().display(),
            dropin.display(),
            operators_cri(version)
        ),
    )
    .expect("config");
    let dump = Command::new(bins.containerd())
        .arg("--config")
        .arg(&main)
        .args(["config", "dump"])
        .output()
        .expect("containerd config dump");
    assert!(dump.status.success(), "{}", text(&dump));
    let dump: toml::Table = String::from_utf8_lossy(&dump.stdout).parse().expect("TOML");
    let plugin = if version == 3 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    };
    let rt = &dump["plugins"][plugin]["containerd"]["runtimes"]["kata-topo"];
    assert_eq!(
        rt["runtime_type"].as_str(),
        Some("io.containerd.kata-topo.v2")
    );
    assert_eq!(
        rt["runtime_path"].as_str(),
        Some("/opt/kata-topo/bin/containerd-shim-kata-topo-v2")
    );
    assert_eq!(
        rt["options"]["ConfigPath"].as_str(),
        Some("/opt/kata-topo/share/configuration-kata-topo.toml")
    );
    let containerd_table = &dump["plugins"][plugin]["containerd"];
    assert_eq!(
        containerd_table["default_runtime_name"].as_str(),
        Some("fast")
    );
    assert!(containerd_table["runtimes"]["fast"].is_table());
    let sandbox = if version == 3 {
        &dump["plugins"]["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"]
    } else {
        &dump["plugins"][plugin]["sandbox_image"]
    };
    assert_eq!(sandbox.as_str(), Some("example.org/pause:9"));

    let before = node.files();
    let again = node.run("install", containerd);
    assert_eq!(node.restarts(), 1, "nothing changed: {}", text(&again));
    assert_eq!(node.files(), before);
}

#[test]
fn an_upgrade_renames_the_binaries_over_and_the_removal_restores_the_node() {
    let node = Node::new(WITH_IMPORTS);
    let pristine = node.files();
    node.run("install", "1.7.2");
    let shim = node.path("host/opt/kata-topo/bin/containerd-shim-kata-topo-v2");
    let old = std::fs::File::open(&shim).expect("a running daemon's binary");
    let old_inode = old.metadata().expect("meta").ino();

    // The new version's pod: the DaemonSet stays, so the old pod's hook keeps the node.
    let hook = node.run("prestop", "1.7.2");
    assert!(text(&hook).contains("stays"), "{}", text(&hook));
    assert!(shim.exists());
    node.payload("1.1.0");
    node.run("install", "1.7.2");
    assert_eq!(
        std::fs::read_to_string(&shim).expect("new"),
        "containerd-shim-kata-topo-v2 1.1.0\n"
    );
    assert_ne!(std::fs::metadata(&shim).expect("meta").ino(), old_inode);
    assert_eq!(old.metadata().expect("the old file").ino(), old_inode);
    assert_eq!(node.restarts(), 1, "an upgrade restarts nothing");
    assert!(node
        .kubectl()
        .contains("label node node-1 kata-topo.io/installed=1.1.0"));

    // The DaemonSet deleted: the hook restores the node, containerd restarted last.
    std::fs::write(node.path("ds-gone"), "").expect("gone");
    let hook = node.run("prestop", "1.7.2");
    assert!(
        text(&hook).contains("removed kata-topo from node node-1"),
        "{}",
        text(&hook)
    );
    assert_eq!(node.restarts(), 2);
    assert_eq!(node.files(), pristine);
    assert!(node
        .kubectl()
        .contains("label node node-1 kata-topo.io/installed- kata-topo.io/install-refused-"));
}

#[test]
fn without_imports_a_symlink_or_a_foreign_handler_it_refuses_and_writes_nothing() {
    // No imports: refused, said in the log, an event and a label.
    let node = Node::new("version = 2\n[plugins]\n");
    let pristine = node.files();
    let out = node.run("install", "1.6.20");
    assert!(
        text(&out).contains("imports no directory"),
        "{}",
        text(&out)
    );
    assert!(node
        .kubectl()
        .contains("kata-topo.io/install-refused=no-containerd-imports"));
    let events = std::fs::read_to_string(node.path("events.log")).expect("an event");
    assert!(
        events.contains("reason: KataTopoInstallRefused"),
        "{events}"
    );
    assert!(events.contains("kind: Node, name: \"node-1\""), "{events}");
    assert_eq!(node.files(), pristine);
    assert_eq!(node.restarts(), 0);

    // The imports directory through a symlink on the node.
    let node = Node::new("version = 2\nimports = [\"/etc/containerd/linked/*.toml\"]\n");
    std::os::unix::fs::symlink("/tmp", node.path("host/etc/containerd/linked")).expect("symlink");
    let pristine = node.files();
    let out = node.run("install", "1.6.20");
    assert!(text(&out).contains("is a symlink"), "{}", text(&out));
    assert_eq!(node.files(), pristine);

    // A handler file someone else wrote.
    let node = Node::new(WITH_IMPORTS);
    std::fs::write(
        node.path("host/etc/containerd/conf.d/kata-topo.toml"),
        "# the operator's\n",
    )
    .expect("theirs");
    let out = node.run("install", "2.3.4");
    assert!(
        text(&out).contains("was not written by kata-topo-installer"),
        "{}",
        text(&out)
    );
    assert!(node.kubectl().contains("install-refused=dropin-exists"));
    assert_eq!(
        std::fs::read_to_string(node.path("host/etc/containerd/conf.d/kata-topo.toml"))
            .expect("kept"),
        "# the operator's\n"
    );
    assert_eq!(node.restarts(), 0);
    assert!(!node.path("host/opt/kata-topo").exists());
}
