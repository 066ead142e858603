//! The `start` handshake with the real containerd under test: what it writes to a shim's
//! stdin and reads back, recorded by a shim in front of runc's, is what the wrapper decodes;
//! the runtime option `ConfigPath` decides the wrapper's configuration on every version;
//! the wrapper's socket goes where containerd puts shim sockets; `kata-topo status` names the
//! configuration in force.
//!
//! runc's shim cannot run a task with Kata's runtime options (its `Create` rejects
//! `runtimeoptions.v1.Options`), so a pod on a handler with `ConfigPath` does not start here:
//! these tests observe `start` and the wrapper's choice of file, not a running pod.
//!
//! `KT_WRITE_FIXTURES=DIR` copies the recordings into `DIR/containerd-<version>/` (the shim's
//! unit tests decode the committed ones: `make bootstrap-fixtures`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kata_topo_integration::{
    bin_dir, eventually, Containerd, ContainerdBin, Guard, BUSYBOX, RECORDED_CONFIG_PATH,
};
use kata_topo_proto::bootstrap::{Flags, Reply, StartParams, Stdin};

/// The recordings of one run: (stdin, stdout) of the only `start` recorded since `before`.
fn recorded(c: &Containerd, before: &[PathBuf]) -> (String, Vec<u8>, Vec<u8>) {
    let mut new: Vec<PathBuf> = std::fs::read_dir(&c.records)
        .expect("records")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "stdin") && !before.contains(p))
        .collect();
    new.sort();
    assert_eq!(new.len(), 1, "one start recorded: {new:?}");
    let stdin_path = new.remove(0);
    let id = stdin_path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .expect("id");
    let stdin = std::fs::read(&stdin_path).expect("stdin");
    let stdout = std::fs::read(stdin_path.with_extension("stdout")).expect("stdout");
    (id, stdin, stdout)
}

fn records(c: &Containerd) -> Vec<PathBuf> {
    std::fs::read_dir(&c.records)
        .expect("records")
        .flatten()
        .map(|e| e.path())
        .collect()
}

/// Keeps the recording as a fixture when `KT_WRITE_FIXTURES` says where.
fn keep(name: &str, stdin: &[u8], stdout: &[u8]) {
    let Some(dir) = std::env::var_os("KT_WRITE_FIXTURES").filter(|d| !d.is_empty()) else {
        return;
    };
    let dir = Path::new(&dir).join(format!("containerd-{}", ContainerdBin::get().version_text));
    std::fs::create_dir_all(&dir).expect("fixture dir");
    std::fs::write(dir.join(format!("{name}.stdin")), stdin).expect("write fixture");
    if !stdout.is_empty() {
        std::fs::write(dir.join(format!("{name}.stdout")), stdout).expect("write fixture");
    }
}

/// Runs a pod on `handler` through CRI; returns its id when it started.
fn run_pod(c: &Containerd, name: &str, handler: &str) -> Option<String> {
    let mut cri = c.cri();
    let cfg = cri.pod_config(name, &[]);
    cri.run_pod(&cfg, handler).ok()
}

#[test]
fn start_input_and_reply_from_this_containerd_decode_as_the_wrapper_reads_them() {
    let c = Containerd::start(Guard {
        socket_dir: true,
        ..Guard::default()
    });
    let bins = ContainerdBin::get();
    let ttrpc = format!("{}.ttrpc", c.socket.display());

    // Without runtime options: runc's shim runs the pod.
    let before = records(&c);
    let pod = run_pod(&c, "recorded", "record").expect("a pod on the recording shim runs");
    let (id, stdin, stdout) = recorded(&c, &before);
    assert_eq!(id, pod, "start is called for the sandbox");
    keep("without-configpath", &stdin, &stdout);
    let input = Stdin::decode(&stdin).expect("stdin decodes");
    let args = Flags::default();
    let params = StartParams::resolve(&input, &args, None).expect("params");
    if bins.has_bootstrap() {
        let p = input
            .params()
            .expect("containerd >= 2.3 sends BootstrapParams");
        assert!(
            p.containerd_version
                .trim_start_matches('v')
                .starts_with(&bins.version_text),
            "{p:?}"
        );
        assert_eq!(params.instance_id, pod);
        assert_eq!(params.namespace, "k8s.io");
        assert_eq!(params.grpc_address, c.socket.display().to_string());
        assert_eq!(params.ttrpc_address, ttrpc);
        assert_eq!(params.socket_dir, c.shim_socket_dir);
        assert!(p.extensions.is_empty(), "no runtime options: {p:?}");
    } else {
        assert_eq!(
            input,
            Stdin::Empty,
            "containerd < 2.3 writes nothing without options"
        );
        assert_eq!(params.instance_id, "", "nothing but the flags tells the id");
    }
    assert_eq!(params.config_path, None);
    let (reply, address, version) = Reply::parse(&stdout).expect("runc's reply parses");
    assert!(
        address.starts_with(&format!("unix://{}/", c.shim_socket_dir.display())),
        "{address}"
    );
    if bins.has_bootstrap() {
        assert!(matches!(reply, Reply::Bootstrap(_)), "{reply:?}");
        assert_eq!(version, 3);
    } else if bins.is_v2() {
        assert!(matches!(reply, Reply::Json { .. }), "{reply:?}");
    } else {
        assert_eq!((reply.clone(), version), (Reply::Plain, 2));
    }
    // The wrapper's answer in the same format carries its own address and nothing else new.
    let ours = reply.encode("unix:///run/containerd/s/ours");
    let (again, address, v) = Reply::parse(&ours).expect("our reply parses");
    assert_eq!(
        (std::mem::discriminant(&again), address.as_str(), v),
        (
            std::mem::discriminant(&reply),
            "unix:///run/containerd/s/ours",
            version
        )
    );
    c.cri().remove_pod(&pod);

    // With Kata's runtime options (`ConfigPath`): only `start` matters here.
    let before = records(&c);
    let _ = run_pod(&c, "recorded-configpath", "record-configpath");
    let (id, stdin, stdout) = recorded(&c, &before);
    keep("with-configpath", &stdin, &stdout);
    let input = Stdin::decode(&stdin).expect("stdin decodes");
    let params = StartParams::resolve(&input, &args, None).expect("params");
    assert_eq!(
        params.config_path.as_deref(),
        Some(Path::new(RECORDED_CONFIG_PATH)),
        "ConfigPath found in {input:?}"
    );
    if bins.has_bootstrap() {
        assert_eq!(params.instance_id, id);
        assert_eq!(input.params().map(|p| p.extensions.len()), Some(1));
    } else {
        assert!(matches!(input, Stdin::Options(_)), "{input:?}");
    }
    // runc's shim may refuse Kata's options at once (containerd 1.6's does: it prints nothing
    // and fails); what it prints otherwise is a reply.
    if !stdout.is_empty() {
        assert!(
            Reply::parse(&stdout).is_ok(),
            "{:?}",
            String::from_utf8_lossy(&stdout)
        );
    }
    assert_eq!(c.wait_clean(Duration::from_secs(20)), Vec::<String>::new());
}

/// The daemon-started lines of a wrapper log.
fn started(log: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["event"] == "daemon-started")
        .collect()
}

#[test]
fn config_path_decides_the_wrappers_configuration_on_every_version() {
    let c = Containerd::start(Guard::default());
    // The handler passes ConfigPath; containerd's environment names another file
    // (KATA_TOPO_CONFIG): the option wins, as it does for Kata.
    let _ = run_pod(&c, "configured", "kata-topo-configpath");
    assert!(
        eventually(Duration::from_secs(10), || !started(&c.configpath_log).is_empty()),
        "no daemon-started line in the ConfigPath file's log {}: {:?}; KATA_TOPO_CONFIG's log: {:?}",
        c.configpath_log.display(),
        std::fs::read_to_string(&c.configpath_log),
        std::fs::read_to_string(&c.log_file),
    );
    let line = &started(&c.configpath_log)[0];
    assert_eq!(line["config_source"], "ConfigPath", "{line}");
    assert_eq!(
        line["config"].as_str(),
        Some(c.configpath.to_str().expect("utf-8")),
        "{line}"
    );
    assert_eq!(
        started(&c.log_file),
        Vec::<serde_json::Value>::new(),
        "the KATA_TOPO_CONFIG file was not used"
    );
    assert_eq!(c.wait_clean(Duration::from_secs(20)), Vec::<String>::new());

    // Without ConfigPath the environment's file decides, and says so.
    let out = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        "io.containerd.kata-topo.v2",
        BUSYBOX,
        "env-configured",
        "sleep",
        "300",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = started(&c.log_file).pop().expect("daemon-started");
    assert_eq!(line["config_source"], "KATA_TOPO_CONFIG", "{line}");
    assert_eq!(line["config"].as_str(), c.config.to_str());

    // kata-topo status names it too.
    let status = Command::new(bin_dir().join("kata-topo"))
        .arg("status")
        .arg("--state-dir")
        .arg(&c.state_dir)
        .output()
        .expect("kata-topo status");
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(
        text.contains(&format!(
            "configuration {} (from KATA_TOPO_CONFIG)",
            c.config.display()
        )),
        "{text}"
    );
    let json = Command::new(bin_dir().join("kata-topo"))
        .args(["status", "--json", "--state-dir"])
        .arg(&c.state_dir)
        .output()
        .expect("kata-topo status --json");
    let v: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON");
    assert_eq!(
        v["sandboxes"][0]["daemon"]["config_source"], "KATA_TOPO_CONFIG",
        "{v}"
    );
    c.remove_task("env-configured");
    assert_eq!(c.wait_clean(Duration::from_secs(20)), Vec::<String>::new());
}

#[test]
fn the_wrappers_socket_is_where_containerd_puts_shim_sockets() {
    // containerd >= 2.3 names the directory (socket_dir); older ones hard-code
    // /run/containerd/s.
    let c = Containerd::start(Guard {
        socket_dir: true,
        ..Guard::default()
    });
    let out = c.ctr(&[
        "run",
        "-d",
        "--runtime",
        "io.containerd.kata-topo.v2",
        BUSYBOX,
        "placed",
        "sleep",
        "300",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bundle = c
        .dir
        .path()
        .join("state/io.containerd.runtime.v2.task/default/placed");
    // What the wrapper left in the bundle for `delete`: its address and the delegate's.
    let info: serde_json::Value = serde_json::from_slice(
        &std::fs::read(bundle.join("kata-topo.json")).expect("kata-topo.json in the bundle"),
    )
    .expect("JSON");
    let (address, delegate) = (
        info["address"].as_str().expect("address"),
        info["delegate_address"].as_str().expect("delegate_address"),
    );
    let dir = format!("unix://{}/", c.shim_socket_dir.display());
    assert!(address.starts_with(&dir), "{address} not in {dir}");
    assert!(
        delegate.starts_with(&dir),
        "the delegate got the same directory: {delegate}"
    );
    if ContainerdBin::get().has_bootstrap() {
        assert_ne!(c.shim_socket_dir, Path::new("/run/containerd/s"));
    }
    assert_ne!(address, delegate);
    c.remove_task("placed");
    assert_eq!(c.wait_clean(Duration::from_secs(20)), Vec::<String>::new());
}

/// `start` run by hand as containerd would, with input containerd never sends: the wrapper
/// refuses it with a clear error before anything runs — no delegate, no daemon, no socket.
#[test]
fn start_refuses_oversized_options_and_a_relative_socket_dir() {
    use kata_topo_proto::containerd::runtime::bootstrap::v1::BootstrapParams;
    use prost::Message;
    use std::io::Write;
    use std::process::Stdio;

    let tmp = tempfile::tempdir().expect("tempdir");
    let ran = tmp.path().join("delegate-ran");
    let delegate = tmp.path().join("delegate.sh");
    std::fs::write(
        &delegate,
        format!("#!/bin/sh\ntouch {}\nexit 1\n", ran.display()),
    )
    .expect("delegate");
    std::fs::set_permissions(
        &delegate,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let config = tmp.path().join("kt.toml");
    std::fs::write(
        &config,
        format!(
            "[topology_guard]\ndelegate_shim = \"{}\"\nstate_dir = \"{}\"\n",
            delegate.display(),
            tmp.path().join("state").display()
        ),
    )
    .expect("config");
    let bundle = tmp.path().join("bundle");
    std::fs::create_dir(&bundle).expect("bundle");
    let start = |stdin: &[u8]| {
        let mut child = Command::new(bin_dir().join("containerd-shim-kata-topo-v2"))
            .args(["-namespace", "default", "-address", "/run/ktc.sock"])
            .args(["-publish-binary", "/bin/false", "-id", "t1", "start"])
            .env("KATA_TOPO_CONFIG", &config)
            .current_dir(&bundle)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the wrapper");
        let mut pipe = child.stdin.take().expect("stdin");
        // The wrapper may stop reading early: a broken pipe is expected.
        let _ = pipe.write_all(stdin);
        drop(pipe);
        let out = child.wait_with_output().expect("wait");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };

    // Runtime options of 8 MiB that decode: containerd sends a few hundred bytes.
    let options = kata_topo_proto::prost_types::Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: vec![0; 8 << 20],
    };
    let (ok, text) = start(&options.encode_to_vec());
    assert!(!ok, "{text}");
    assert!(
        text.contains("start options on stdin exceed 64 KiB"),
        "{text}"
    );
    assert!(!ran.exists(), "nothing was forwarded to the delegate");

    // A relative socket directory.
    let params = BootstrapParams {
        instance_id: "t1".into(),
        namespace: "default".into(),
        containerd_version: "2.3.4".into(),
        socket_dir: Some("s".into()),
        ..Default::default()
    };
    let (ok, text) = start(&params.encode_to_vec());
    assert!(!ok, "{text}");
    assert!(
        text.contains("socket_dir") && text.contains("\"s\"") && text.contains("absolute"),
        "{text}"
    );
    assert!(!ran.exists(), "the delegate was not started");
    assert!(!bundle.join("s").exists(), "no socket left behind");
    assert_eq!(
        std::fs::read_dir(&bundle).expect("bundle").count(),
        0,
        "nothing left in the bundle"
    );
}
