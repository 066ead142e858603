//! `kata-topo-installer` on a node made of a directory (`host/`, the node's `/` as the
//! installer's container sees it), with the real containerd under test running on that
//! node's configuration and restarted by the node's restart command, and a fake API server
//! (the project's own, `kata_topo_apiserver::fake`) standing in for the cluster: the real one
//! with the real DaemonSet is `make k8s-test`'s (`integration/k8s-test/steps-installer.sh`).
//! The image's payload is made here: binaries whose content names a version (containerd
//! never runs them; it only loads the handler that names them).
//!
//! Each finding of the installer's review has its test: the label every selector uses never
//! changes on an upgrade; a failed write (a full disk) leaves the node as it was and restarts
//! nothing; no write goes through a link or into a directory another user may write; the
//! preStop hook uninstalls only on the API server's word that the DaemonSet is gone; only its
//! own node's kata-topo labels are changed; registry credentials of containerd 1.x's CRI
//! section make the drop-in 0600; an install waits for an uninstall; containerd not loading
//! the handler puts every file back; a hand-edited drop-in is reported, not removed; a
//! read-only `/usr` takes the refusal.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kata_topo_apiserver::fake::{FakeApiServer, Reply};
use kata_topo_integration::{bin_dir, require_root, workspace, ContainerdBin, MachineLock};

/// How the fake answers for the DaemonSet.
#[derive(Debug, Clone)]
enum Ds {
    Stays,
    Deleting,
    Gone,
    Answer(Reply),
}

/// The cluster as the fake keeps it.
#[derive(Debug)]
struct Cluster {
    labels: BTreeMap<String, String>,
    ds: Ds,
    runtime: String,
}

const NODE: &str = "node-1";

fn node_json(c: &Cluster) -> String {
    serde_json::json!({
        "metadata": {"name": NODE, "labels": c.labels},
        "status": {"nodeInfo": {"containerRuntimeVersion": c.runtime}}
    })
    .to_string()
}

fn answer(cluster: &Mutex<Cluster>, line: &str, body: &[u8]) -> Reply {
    let mut c = cluster.lock().unwrap_or_else(|e| e.into_inner());
    let path = line.split(' ').nth(1).unwrap_or_default();
    let method = line.split(' ').next().unwrap_or_default();
    match (method, path) {
        ("GET", p) if p == format!("/api/v1/nodes/{NODE}") => Reply::ok(node_json(&c)),
        ("PATCH", p) if p == format!("/api/v1/nodes/{NODE}") => {
            let patch: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            if let Some(labels) = patch["metadata"]["labels"].as_object() {
                for (k, v) in labels {
                    match v.as_str() {
                        Some(v) => c.labels.insert(k.clone(), v.to_string()),
                        None => c.labels.remove(k),
                    };
                }
            }
            Reply::ok(node_json(&c))
        }
        ("POST", "/api/v1/namespaces/default/events") => Reply::Answer {
            status: 201,
            body: r#"{"metadata":{"name":"kata-topo-installer.1"}}"#.into(),
            chunked: false,
        },
        ("GET", "/apis/apps/v1/namespaces/kube-system/daemonsets/kata-topo-installer") => {
            match &c.ds {
                Ds::Stays => Reply::ok(r#"{"metadata":{"name":"kata-topo-installer"}}"#),
                Ds::Deleting => Reply::ok(
                    r#"{"metadata":{"name":"kata-topo-installer","deletionTimestamp":"2026-01-01T00:00:00Z"}}"#,
                ),
                Ds::Gone => Reply::status(404, "daemonsets.apps \"kata-topo-installer\" not found"),
                Ds::Answer(r) => r.clone(),
            }
        }
        _ => Reply::status(
            403,
            &format!("{method} {path} is forbidden to the installer"),
        ),
    }
}

/// A node, its containerd, the cluster's API server.
struct Node {
    dir: tempfile::TempDir,
    api: FakeApiServer,
    cluster: Arc<Mutex<Cluster>>,
    v2: bool,
    mounts: Vec<PathBuf>,
    _lock: MachineLock,
}

/// The operator's CRI settings, in the configuration version of the containerd under test.
fn operators_cri(v2: bool) -> &'static str {
    if v2 {
        "[plugins.'io.containerd.cri.v1.images'.pinned_images]\n  sandbox = \"example.org/pause:9\"\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = \"fast\"\n\
         [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.fast]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"example.org/pause:9\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"fast\"\n\
         [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.fast]\n  runtime_type = \"io.containerd.runc.v2\"\n"
    }
}

/// Runs a command (in a private mount namespace: `unshare -m`) with the node's
/// `/etc/containerd` at `/etc/containerd`, so the node's containerd reads the paths its
/// configuration names as the installer writes them under the host root. `@DIR@` is the
/// node's directory.
const IN_NODE: &str = r#"#!/bin/sh
mount --bind "@DIR@/host/etc/containerd" /etc/containerd || exit 1
exec "$@"
"#;

/// The restart command: stops the node's containerd, starts it again (detached), returns
/// once it serves. `start` only starts it (the node's boot).
const RESTART: &str = r#"#!/bin/sh
[ "$1" = start ] || echo restart >> "$D/restarts"
pid=$(cat "$D/containerd.pid" 2> /dev/null)
if [ -n "$pid" ] && kill "$pid" 2> /dev/null; then
  i=0
  while [ -e "/proc/$pid" ] && ! grep -q ') Z' "/proc/$pid/stat" 2> /dev/null && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
fi
rm -f "$D/c.sock"
setsid unshare -m --propagation private "$D/in-node.sh" "$CONTAINERD" --config /etc/containerd/config.toml < /dev/null >> "$D/containerd.log" 2>&1 &
echo $! > "$D/containerd.pid"
i=0
while [ $i -lt 200 ]; do
  [ -S "$D/c.sock" ] && exit 0
  sleep 0.1; i=$((i+1))
done
echo "containerd did not come up" >&2
exit 1
"#;

impl Node {
    fn new() -> Self {
        Self::with_config(None)
    }

    /// A node whose main configuration has `extra` (more TOML), or the standard one.
    fn with_config(extra: Option<&str>) -> Self {
        require_root();
        let lock = MachineLock::take();
        let bins = ContainerdBin::get();
        let v2 = bins.is_v2();
        let dir = tempfile::Builder::new()
            .prefix("kt-inst-")
            .tempdir_in("/tmp")
            .expect("tempdir");
        let d = dir.path();
        chmod(d, 0o755);
        for sub in [
            "host/etc/containerd/conf.d",
            "host/usr/local/bin",
            "host/run",
            "host/opt",
        ] {
            std::fs::create_dir_all(d.join(sub)).expect("mkdir");
        }
        for sub in ["host", "host/etc", "host/usr", "host/usr/local"] {
            chmod(&d.join(sub), 0o755);
        }
        let version = if v2 { 3 } else { 2 };
        let main = format!(
            "version = {version}\nroot = \"{0}/root\"\nstate = \"{0}/state\"\n\
             imports = [\"/etc/containerd/conf.d/*.toml\"]\n[grpc]\n  address = \"{0}/c.sock\"\n{1}{2}",
            d.display(),
            operators_cri(v2),
            extra.unwrap_or("")
        );
        std::fs::write(d.join("host/etc/containerd/config.toml"), main).expect("config");
        assert!(
            Path::new("/etc/containerd").is_dir(),
            "the node's containerd runs with the node's /etc/containerd mounted over this \
             machine's, which must be there (Debian's containerd package makes it)"
        );
        std::fs::write(
            d.join("in-node.sh"),
            IN_NODE.replace("@DIR@", &d.display().to_string()),
        )
        .expect("in-node");
        chmod(&d.join("in-node.sh"), 0o755);
        std::fs::write(d.join("restart.sh"), RESTART).expect("restart");
        chmod(&d.join("restart.sh"), 0o755);
        let cluster = Arc::new(Mutex::new(Cluster {
            labels: BTreeMap::from([("kubernetes.io/hostname".into(), NODE.into())]),
            ds: Ds::Stays,
            runtime: format!("containerd://{}", bins.version_text),
        }));
        let c = Arc::clone(&cluster);
        let api = FakeApiServer::start_with_bodies(move |line, body| answer(&c, line, body));
        let node = Self {
            dir,
            api,
            cluster,
            v2,
            mounts: Vec::new(),
            _lock: lock,
        };
        node.payload("1.0.0");
        let out = node.sh(&format!("{} start", node.path("restart.sh").display()));
        assert!(out.0, "containerd: {}\n{}", out.1, node.containerd_log());
        node
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn host(&self, rel: &str) -> PathBuf {
        self.dir.path().join("host").join(rel)
    }

    fn sh(&self, script: &str) -> (bool, String) {
        let bins = ContainerdBin::get();
        let out = Command::new("sh")
            .arg("-c")
            .arg(script)
            .env("D", self.dir.path())
            .env("CONTAINERD", bins.containerd())
            .env("CTR", bins.ctr())
            .output()
            .expect("sh");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn containerd_log(&self) -> String {
        std::fs::read_to_string(self.path("containerd.log")).unwrap_or_default()
    }

    /// The image's payload at VERSION.
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

    fn command(&self, arg: &str, env: &[(&str, &str)]) -> Command {
        let mut cmd = Command::new(bin_dir().join("kata-topo-installer"));
        cmd.arg(arg)
            .env("NODE_NAME", NODE)
            .env("POD_NAMESPACE", "kube-system")
            .env("KATA_TOPO_HOST_ROOT", self.path("host"))
            .env("KATA_TOPO_RUN_DIR", self.dir.path())
            .env("KATA_TOPO_PAYLOAD", self.path("payload"))
            .env("KATA_TOPO_KUBECONFIG", self.api.kubeconfig())
            .env("KATA_TOPO_CONTAINERD_SOCKET", self.path("c.sock"))
            .env("KATA_TOPO_CONTAINERD_TIMEOUT_SECONDS", "20")
            // The installer's own nsenter, into this test's namespaces (a real node's: PID 1's).
            .env(
                "KATA_TOPO_HOST_EXEC",
                format!("nsenter -t {} -m -u -i -n -p --", std::process::id()),
            )
            .env("KATA_TOPO_CONTAINERD_DUMP", self.dump_command())
            .env(
                "KATA_TOPO_RESTART_CONTAINERD",
                format!(
                    "D={} CONTAINERD={} CTR={} {}",
                    self.dir.path().display(),
                    ContainerdBin::get().containerd().display(),
                    ContainerdBin::get().ctr().display(),
                    self.path("restart.sh").display()
                ),
            )
            .env(
                "KATA_TOPO_CONFIG_OVERRIDE",
                self.path("no-override").to_string_lossy().into_owned(),
            )
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        cmd
    }

    /// containerd's `config dump` of the node's configuration.
    fn dump_command(&self) -> String {
        format!(
            "unshare -m --propagation private {} {} --config /etc/containerd/config.toml config dump",
            self.path("in-node.sh").display(),
            ContainerdBin::get().containerd().display()
        )
    }

    /// `install`: runs until it says it installed or refused, then gets TERM and must exit 0.
    fn install(&self, env: &[(&str, &str)]) -> String {
        let log = self.path("install.log");
        let f = std::fs::File::create(&log).expect("log");
        let mut child: Child = self
            .command("install", env)
            .stdout(f.try_clone().expect("log"))
            .stderr(f)
            .spawn()
            .expect("start the installer");
        let deadline = Instant::now() + Duration::from_secs(90);
        let text = loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let said = text.contains("installed kata-topo") || text.contains("refused:");
            if said || Instant::now() > deadline {
                break text;
            }
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the installer ended by itself ({status}):\n{text}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let status = child.wait().expect("wait");
        assert!(status.success(), "TERM ends it cleanly: {status}\n{text}");
        text
    }

    /// `prestop` or `uninstall`: its exit and output.
    fn run(&self, arg: &str, env: &[(&str, &str)]) -> (bool, String) {
        let out = self.command(arg, env).output().expect("run the installer");
        (
            out.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        )
    }

    fn restarts(&self) -> usize {
        std::fs::read_to_string(self.path("restarts"))
            .unwrap_or_default()
            .lines()
            .count()
    }

    fn labels(&self) -> BTreeMap<String, String> {
        self.cluster
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .labels
            .clone()
    }

    fn set_ds(&self, ds: Ds) {
        self.cluster.lock().unwrap_or_else(|e| e.into_inner()).ds = ds;
    }

    /// The Warning events' reasons and messages.
    fn events(&self) -> Vec<(String, String)> {
        self.api
            .exchanges()
            .iter()
            .filter(|e| e.line.starts_with("POST /api/v1/namespaces/default/events"))
            .map(|e| {
                let v: serde_json::Value = serde_json::from_slice(&e.body).expect("json");
                assert_eq!(v["type"], "Warning");
                assert_eq!(v["involvedObject"]["kind"], "Node");
                assert_eq!(v["involvedObject"]["name"], NODE);
                (
                    v["reason"].as_str().unwrap_or_default().to_string(),
                    v["message"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }

    /// Every path under host/ with its type, mode and content's length; the installer's lock
    /// file in the node's /run (which stays, as a lock file must) left out.
    fn files(&self) -> Vec<String> {
        let mut out = Vec::new();
        walk(&self.path("host"), &self.path("host"), &mut out);
        out.sort();
        out
    }

    fn dropin(&self) -> PathBuf {
        self.host("etc/containerd/conf.d/kata-topo.toml")
    }

    /// Mounts `fstype`/`options` at host/REL (undone when the node goes).
    fn mount(&mut self, rel: &str, args: &[&str]) {
        let at = self.host(rel);
        let out = Command::new("mount")
            .args(args)
            .arg(&at)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount {args:?} {}: {}",
            at.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        self.mounts.push(at);
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for m in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).status();
        }
        if let Ok(pid) = std::fs::read_to_string(self.path("containerd.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                let _ = Command::new("kill").arg(pid.to_string()).status();
                let deadline = Instant::now() + Duration::from_secs(10);
                while Path::new(&format!("/proc/{pid}")).exists()
                    && kata_topo_integration::alive(pid as u32)
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
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
        if rel == "run/kata-topo-installer.lock" {
            continue;
        }
        let meta = std::fs::symlink_metadata(&p).expect("meta");
        if meta.is_symlink() {
            out.push(format!(
                "{rel} -> {}",
                std::fs::read_link(&p).expect("link").display()
            ));
        } else if meta.is_dir() {
            out.push(format!("{rel}/ {:o}", meta.mode() & 0o7777));
            walk(root, &p, out);
        } else {
            out.push(format!("{rel} {:o} {}", meta.mode() & 0o7777, meta.len()));
        }
    }
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn installed_labels(version: &str) -> Vec<(String, String)> {
    vec![
        ("kata-topo.io/installed".into(), "true".into()),
        ("kata-topo.io/installed-version".into(), version.into()),
    ]
}

fn kata_labels(node: &Node) -> Vec<(String, String)> {
    node.labels()
        .into_iter()
        .filter(|(k, _)| k.starts_with("kata-topo.io/"))
        .collect()
}

/// The handler loads in the containerd under test beside the operator's CRI settings, a
/// second install changes nothing, an upgrade renames new binaries over the old (a process
/// keeps the old file) with the label every selector uses unchanged, the preStop hook keeps
/// the node while the DaemonSet stays and restores it exactly once it is gone; every write to
/// the API server is a kata-topo label of its own node.
#[test]
fn an_upgrade_keeps_the_selected_label_and_the_removal_restores_the_node() {
    let node = Node::new();
    let pristine = node.files();
    let out = node.install(&[]);
    assert!(
        out.contains("installed kata-topo 1.0.0 on node node-1"),
        "{out}"
    );
    assert!(
        out.contains("containerd runs the handler kata-topo"),
        "{out}"
    );
    assert_eq!(node.restarts(), 1, "{out}");
    assert_eq!(kata_labels(&node), installed_labels("1.0.0"));
    let dropin = std::fs::read_to_string(node.dropin()).expect("the handler");
    let version = if node.v2 { 3 } else { 2 };
    assert!(
        dropin.contains(&format!("\nversion = {version}\n")),
        "{dropin}"
    );
    let mode = std::fs::metadata(node.dropin()).expect("meta").mode() & 0o777;
    assert_eq!(mode, 0o644, "no secret in it");
    let link = node.host("usr/local/bin/containerd-shim-kata-topo-v2");
    assert_eq!(
        std::fs::read_link(&link).ok(),
        (!node.v2).then(|| PathBuf::from("/opt/kata-topo/bin/containerd-shim-kata-topo-v2"))
    );
    // The operator's CRI settings are what the restarted containerd runs with.
    let dump = Command::new("sh")
        .arg("-c")
        .arg(node.dump_command())
        .output()
        .expect("dump");
    assert!(
        dump.status.success(),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    let dump: toml::Table = String::from_utf8_lossy(&dump.stdout).parse().expect("TOML");
    let plugin = if node.v2 {
        "io.containerd.cri.v1.runtime"
    } else {
        "io.containerd.grpc.v1.cri"
    };
    let cri = &dump["plugins"][plugin]["containerd"];
    assert_eq!(cri["default_runtime_name"].as_str(), Some("fast"));
    assert_eq!(
        cri["runtimes"]["kata-topo"]["options"]["ConfigPath"].as_str(),
        Some("/opt/kata-topo/share/configuration-kata-topo.toml")
    );

    let before = node.files();
    let again = node.install(&[]);
    assert_eq!(node.restarts(), 1, "nothing changed: {again}");
    assert_eq!(node.files(), before);

    // The upgrade: the old pod's hook sees the DaemonSet stay, the new pod installs.
    let shim = node.host("opt/kata-topo/bin/containerd-shim-kata-topo-v2");
    let old = std::fs::File::open(&shim).expect("a running daemon's binary");
    let old_inode = old.metadata().expect("meta").ino();
    let (ok, hook) = node.run("prestop", &[]);
    assert!(ok && hook.contains("stays"), "{hook}");
    assert!(shim.exists());
    node.payload("1.1.0");
    let up = node.install(&[]);
    assert_eq!(
        std::fs::read_to_string(&shim).expect("new"),
        "containerd-shim-kata-topo-v2 1.1.0\n"
    );
    assert_ne!(std::fs::metadata(&shim).expect("meta").ino(), old_inode);
    assert_eq!(old.metadata().expect("the old file").ino(), old_inode);
    assert_eq!(node.restarts(), 1, "an upgrade restarts nothing: {up}");
    // What every selector and every admitted pod's nodeSelector require is still there.
    assert_eq!(kata_labels(&node), installed_labels("1.1.0"));

    // The DaemonSet deleted: the hook restores the node, containerd restarted last.
    node.set_ds(Ds::Gone);
    let (ok, hook) = node.run("prestop", &[]);
    assert!(
        ok && hook.contains("removed kata-topo from node node-1"),
        "{hook}"
    );
    assert_eq!(node.restarts(), 2);
    assert_eq!(node.files(), pristine);
    assert!(kata_labels(&node).is_empty());
    assert!(node.events().is_empty());
    // Only its own node's kata-topo labels were ever written.
    for e in node.api.exchanges() {
        if e.line.starts_with("PATCH") {
            assert_eq!(e.line, "PATCH /api/v1/nodes/node-1 HTTP/1.1");
            let patch: serde_json::Value = serde_json::from_slice(&e.body).expect("json");
            assert_eq!(
                patch["metadata"].as_object().map(|m| m.len()),
                Some(1),
                "{patch}"
            );
            for k in patch["metadata"]["labels"]
                .as_object()
                .expect("labels")
                .keys()
            {
                assert!(k.starts_with("kata-topo.io/"), "{k}");
            }
        } else {
            assert!(
                !e.line.starts_with("PUT") && !e.line.starts_with("DELETE"),
                "{}",
                e.line
            );
        }
    }
}

/// The refusal: a log line, a Warning event, the label; nothing on the node changed and
/// containerd not restarted.
fn assert_refused(node: &Node, out: &str, reason: &str, pristine: &[String]) {
    assert!(out.contains("refused:"), "{out}");
    assert_eq!(
        node.labels()
            .get("kata-topo.io/install-refused")
            .map(String::as_str),
        Some(reason),
        "{out}"
    );
    assert!(
        !node.labels().contains_key("kata-topo.io/installed"),
        "{out}"
    );
    let events = node.events();
    assert!(
        events.iter().any(|(r, _)| r == "KataTopoInstallRefused"),
        "{events:?}"
    );
    assert_eq!(node.files(), pristine, "{out}");
    assert_eq!(node.restarts(), 0, "{out}");
}

/// A full disk under /opt (a tmpfs smaller than a binary): nothing is renamed into place,
/// nothing labelled installed, containerd not restarted.
#[test]
fn a_failed_write_leaves_the_node_as_it_was() {
    let mut node = Node::new();
    node.mount("opt", &["-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs"]);
    std::fs::write(node.path("payload/bin/kata-topo"), vec![0u8; 3 << 20]).expect("a large binary");
    let pristine = node.files();
    let out = node.install(&[]);
    assert!(out.contains("No space left on device"), "{out}");
    assert_refused(&node, &out, "write-failed", &pristine);
}

/// A read-only /usr (an OSTree node): containerd 1.x needs the shim link in
/// KATA_TOPO_SHIM_LINK_DIR and the install takes the refusal; 2.x needs no link and installs.
#[test]
fn a_read_only_usr_takes_the_refusal_where_a_link_is_needed() {
    let mut node = Node::new();
    let usr = node.host("usr").display().to_string();
    node.mount("usr", &["--bind", &usr]);
    let out = Command::new("mount")
        .args(["-o", "remount,bind,ro"])
        .arg(node.host("usr"))
        .output()
        .expect("remount");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pristine = node.files();
    let out = node.install(&[]);
    if node.v2 {
        assert!(out.contains("installed kata-topo 1.0.0"), "{out}");
    } else {
        assert!(out.contains("Read-only file system"), "{out}");
        assert!(out.contains("KATA_TOPO_SHIM_LINK_DIR"), "{out}");
        assert_refused(&node, &out, "read-only-filesystem", &pristine);
    }
}

/// Links the host's files hold, and directories another user may write, are never written
/// through or in.
#[test]
fn no_write_goes_through_a_link_or_into_a_directory_others_may_write() {
    // /opt/kata-topo/bin a link to the node's /etc/sudoers.d (relative: followed, it would land
    // there through the host root as well).
    let node = Node::new();
    std::fs::create_dir_all(node.host("etc/sudoers.d")).expect("sudoers.d");
    std::fs::create_dir_all(node.host("opt/kata-topo")).expect("prefix");
    std::os::unix::fs::symlink("../../etc/sudoers.d", node.host("opt/kata-topo/bin"))
        .expect("link");
    let pristine = node.files();
    let out = node.install(&[]);
    assert!(
        out.contains("/opt/kata-topo/bin") && out.contains("symbolic link"),
        "{out}"
    );
    assert_refused(&node, &out, "untrusted-path", &pristine);
    assert_eq!(
        std::fs::read_dir(node.host("etc/sudoers.d"))
            .expect("list")
            .count(),
        0
    );
    drop(node);

    // The record of created directories a link to /etc/shadow.
    let node = Node::new();
    std::fs::create_dir_all(node.host("opt/kata-topo/share")).expect("share");
    std::fs::write(node.host("etc/shadow"), "root:*:1::::::\n").expect("shadow");
    std::os::unix::fs::symlink(
        "../../../etc/shadow",
        node.host("opt/kata-topo/share/created-dirs"),
    )
    .expect("link");
    let pristine = node.files();
    let out = node.install(&[]);
    assert_refused(&node, &out, "untrusted-path", &pristine);
    assert_eq!(
        std::fs::read_to_string(node.host("etc/shadow")).expect("shadow"),
        "root:*:1::::::\n"
    );
    drop(node);

    // The imports directory writable by anyone, or owned by another user.
    let node = Node::new();
    chmod(&node.host("etc/containerd/conf.d"), 0o777);
    let pristine = node.files();
    let out = node.install(&[]);
    assert!(out.contains("0777"), "{out}");
    assert_refused(&node, &out, "untrusted-path", &pristine);
    chmod(&node.host("etc/containerd/conf.d"), 0o755);
    std::os::unix::fs::chown(node.host("etc/containerd/conf.d"), Some(65534), None).expect("chown");
    let out = node.install(&[]);
    assert!(out.contains("uid 65534"), "{out}");
    drop(node);

    // Someone else's drop-in: refused as before.
    let node = Node::new();
    std::fs::write(node.dropin(), "# the operator's\n").expect("theirs");
    let pristine = node.files();
    let out = node.install(&[]);
    assert!(
        out.contains("was not written by kata-topo-installer"),
        "{out}"
    );
    assert_refused(&node, &out, "dropin-exists", &pristine);
}

/// The preStop hook uninstalls on the API server's 404 for the DaemonSet itself or its
/// deletionTimestamp, on nothing else: Forbidden, Unauthorized, a 404 of another path, a
/// server error keep the node installed.
#[test]
fn prestop_uninstalls_only_when_the_daemonset_is_gone() {
    let node = Node::new();
    node.install(&[]);
    let installed = node.files();
    for unsure in [
        Reply::status(403, "daemonsets.apps \"kata-topo-installer\" is forbidden: User \"system:serviceaccount:kube-system:kata-topo-installer\" cannot get resource"),
        Reply::status(401, "Unauthorized"),
        Reply::status(404, "the server could not find the requested resource"),
        Reply::status(500, "etcdserver: request timed out"),
    ] {
        node.set_ds(Ds::Answer(unsure.clone()));
        let (ok, out) = node.run("prestop", &[]);
        assert!(ok && out.contains("the node keeps kata-topo"), "{unsure:?}: {out}");
        assert_eq!(node.files(), installed, "{unsure:?}");
        assert_eq!(kata_labels(&node), installed_labels("1.0.0"));
    }
    assert_eq!(node.restarts(), 1);
    node.set_ds(Ds::Deleting);
    let (ok, out) = node.run("prestop", &[]);
    assert!(ok && out.contains("is being deleted"), "{out}");
    assert!(!node.host("opt/kata-topo").exists(), "{out}");
    assert_eq!(node.restarts(), 2);
}

/// containerd 1.x's drop-in carries the CRI section as containerd runs it: with a registry
/// password there, the file is 0600; containerd 2.x's carries the handler alone.
#[test]
fn registry_credentials_never_reach_a_file_others_may_read() {
    let auth = if ContainerdBin::get().is_v2() {
        // 2.x: credentials belong in hosts.toml; a main configuration still carrying them in
        // the CRI images plugin keeps them there.
        "[plugins.'io.containerd.cri.v1.images'.registry.configs.'r.example'.auth]\n  username = \"ops\"\n  password = \"s3cret\"\n"
    } else {
        "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"r.example\".auth]\n  username = \"ops\"\n  password = \"s3cret\"\n"
    };
    let node = Node::with_config(Some(auth));
    let out = node.install(&[]);
    assert!(out.contains("installed kata-topo"), "{out}");
    let text = std::fs::read_to_string(node.dropin()).expect("dropin");
    let mode = std::fs::metadata(node.dropin()).expect("meta").mode() & 0o777;
    if node.v2 {
        assert!(!text.contains("s3cret"), "{text}");
        assert_eq!(mode, 0o644);
    } else {
        assert!(text.contains("s3cret"), "1.x must carry it: {text}");
        assert_eq!(mode, 0o600);
    }
    assert!(!out.contains("s3cret"), "{out}");
}

/// An install waits for an uninstall holding the node's lock (and gives up, refusing, after
/// KATA_TOPO_LOCK_TIMEOUT_SECONDS); once it is free the install goes on.
#[test]
fn an_install_and_an_uninstall_take_turns() {
    let node = Node::new();
    let pristine = node.files();
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(node.host("run/kata-topo-installer.lock"))
        .expect("lock file");
    chmod(&node.host("run/kata-topo-installer.lock"), 0o600);
    lock.lock().expect("held as an uninstall would");
    let out = node.install(&[("KATA_TOPO_LOCK_TIMEOUT_SECONDS", "1")]);
    assert_refused(&node, &out, "locked", &pristine);
    let (ok, out) = node.run("uninstall", &[("KATA_TOPO_LOCK_TIMEOUT_SECONDS", "1")]);
    assert!(!ok && out.contains("kata-topo-installer.lock"), "{out}");
    lock.unlock().expect("let go");
    let out = node.install(&[]);
    assert!(out.contains("installed kata-topo"), "{out}");
    let (ok, out) = node.run("uninstall", &[]);
    assert!(ok, "{out}");
    assert_eq!(node.files(), pristine);
}

/// A restart command that fails, or a containerd that does not run the handler after it:
/// every file goes back as it was, containerd is restarted on that, and the install refuses.
#[test]
fn containerd_not_loading_the_handler_puts_every_file_back() {
    let node = Node::new();
    let pristine = node.files();
    let out = node.install(&[
        (
            "KATA_TOPO_RESTART_CONTAINERD",
            "echo restart >> $D/restarts; exit 7",
        ),
        ("D", &node.dir.path().display().to_string()),
    ]);
    assert!(out.contains("restarting containerd failed"), "{out}");
    assert_eq!(
        node.labels()
            .get("kata-topo.io/install-refused")
            .map(String::as_str),
        Some("containerd-restart-failed")
    );
    assert_eq!(node.files(), pristine, "{out}");
    assert_eq!(
        node.restarts(),
        2,
        "the failed restart and the one on the old files: {out}"
    );

    // A "restart" that leaves the old containerd running: the handler is not there.
    let out = node.install(&[
        ("KATA_TOPO_RESTART_CONTAINERD", "true"),
        // Long enough for containerd's CRI to answer at least once on a loaded machine.
        ("KATA_TOPO_CONTAINERD_TIMEOUT_SECONDS", "5"),
    ]);
    assert!(out.contains("did not load the handler kata-topo"), "{out}");
    assert!(out.contains("fast"), "the handlers it has are named: {out}");
    assert_eq!(
        node.labels()
            .get("kata-topo.io/install-refused")
            .map(String::as_str),
        Some("handler-not-loaded")
    );
    assert_eq!(node.files(), pristine, "{out}");
}

/// A drop-in that lost its marker by a hand edit and still names kata-topo's binaries: the
/// uninstall leaves it and the binaries it names, and says so (log, event, exit status)
/// instead of success.
#[test]
fn a_hand_edited_dropin_is_reported_not_success() {
    let node = Node::new();
    node.install(&[]);
    let text = std::fs::read_to_string(node.dropin()).expect("dropin");
    let edited: String = text.lines().skip(1).map(|l| format!("{l}\n")).collect();
    std::fs::write(node.dropin(), format!("# tuned by hand\n{edited}")).expect("edit");
    node.set_ds(Ds::Gone);
    let (ok, out) = node.run("prestop", &[]);
    assert!(!ok, "{out}");
    assert!(
        out.contains("uninstall incomplete") && out.contains("lost kata-topo-installer's marker"),
        "{out}"
    );
    assert!(!out.contains("removed kata-topo from node"), "{out}");
    assert!(node.dropin().exists());
    assert!(node
        .host("opt/kata-topo/bin/containerd-shim-kata-topo-v2")
        .exists());
    assert!(node
        .events()
        .iter()
        .any(|(r, _)| r == "KataTopoUninstallIncomplete"));
    assert_eq!(node.restarts(), 1, "containerd keeps its handler: {out}");
}
