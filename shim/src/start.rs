//! `start`: run the delegate's `start` with everything containerd gave us, make sure this pod's
//! wrapper daemon runs, point the bundle's `address` at it, and answer in the delegate's format.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use std::time::{Duration, Instant};

use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::args::Args;
use crate::delegate::Delegate;
use crate::state::GroupState;
use kata_topo_core::config::{Config, ConfigError, Resolved};
use kata_topo_core::process::ProcessId;
use kata_topo_proto::bootstrap::{BootstrapError, Reply, StartParams, Stdin};
use kata_topo_proto::wire::{
    probe, socket_path, Client, Code, Probe, ShutdownRequest, TASK_V2, TASK_V3,
};

/// The bundle file that tells `delete` (and a later `start`) who the delegate is.
pub const BUNDLE_FILE: &str = "kata-topo.json";

/// What the bundle remembers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BundleInfo {
    /// The wrapper's address (also in `address`).
    pub address: String,
    /// The delegate's address.
    pub delegate_address: String,
    /// The delegate's task API version.
    pub delegate_version: u32,
    /// The pod group.
    pub group: String,
    /// The containerd namespace.
    pub namespace: String,
    /// The delegate binary (`delete` runs it; it has no runtime options to find the config).
    pub delegate_shim: String,
    /// The state directory.
    pub state_dir: PathBuf,
    /// The metrics directory, when the daemon writes a metrics file (`delete` removes the
    /// file of a daemon that died).
    #[serde(default)]
    pub metrics_dir: Option<PathBuf>,
}

impl BundleInfo {
    /// Reads `<bundle>/kata-topo.json`.
    pub fn read(bundle: &Path) -> Option<Self> {
        let bytes = std::fs::read(bundle.join(BUNDLE_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// The wrapper's socket for a pod, in the shims' socket directory. Shims name theirs after
/// sha256(containerd address + "/" + namespace + "/" + group); the delegate does exactly that,
/// so the wrapper adds its own suffix and can never collide with it.
pub fn socket_address(
    socket_dir: &Path,
    containerd_address: &str,
    namespace: &str,
    group: &str,
) -> String {
    shim_socket(
        socket_dir,
        &format!("{containerd_address}/{namespace}/{group}/kata-topo"),
    )
}

/// Where a shim of the containerd shim library listens: `<socket dir>/<sha256(containerd
/// address + "/" + namespace + "/" + group)>`.
pub fn delegate_socket_address(
    socket_dir: &Path,
    containerd_address: &str,
    namespace: &str,
    group: &str,
) -> String {
    shim_socket(
        socket_dir,
        &format!("{containerd_address}/{namespace}/{group}"),
    )
}

fn shim_socket(socket_dir: &Path, name: &str) -> String {
    let digest = Sha256::digest(name.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("unix://{}/{hex}", socket_dir.display())
}

/// The pod group of a task: the CRI sandbox id, runc's group annotation, else the task id.
pub fn group_of(bundle: &Path, task_id: &str) -> String {
    let spec = kata_topo_core::ContainerSpec::from_file(&bundle.join("config.json")).ok();
    spec.as_ref()
        .and_then(|s| {
            s.sandbox_id
                .clone()
                .or_else(|| s.annotations.get("io.containerd.runc.v2.group").cloned())
        })
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| task_id.to_string())
}

/// Why `start` failed; containerd shows the message to the user.
#[derive(Debug, thiserror::Error)]
enum StartError {
    #[error("kata-topo: cannot read start options: {0}")]
    Stdin(#[source] std::io::Error),
    #[error(
        "kata-topo: start options on stdin exceed {} KiB; containerd sends a few hundred bytes",
        STDIN_LIMIT / 1024
    )]
    StdinTooLarge,
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(
        "kata-topo: cannot run the delegate shim {shim:?} (topology_guard.delegate_shim): {source}"
    )]
    Delegate {
        shim: String,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: delegate start failed: {0}")]
    DelegateWait(#[source] std::io::Error),
    #[error("kata-topo: cannot create {}: {source}", .dir.display())]
    SocketDir {
        dir: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: cannot listen on {}: {source}", .path.display())]
    Listen {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kata-topo: cannot pass the listener: {0}")]
    PassListener(#[source] nix::Error),
    #[error("kata-topo: cannot start the wrapper daemon: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("kata-topo: the wrapper daemon did not start: {source}{}", said(.stderr))]
    DaemonGone {
        #[source]
        source: std::io::Error,
        /// What the daemon wrote to its standard error before it exited.
        stderr: String,
    },
    #[error(
        "kata-topo: the delegate answered {answered}, but this pod's wrapper forwards to {known}"
    )]
    OtherDelegate { answered: String, known: String },
    #[error("kata-topo: cannot write the bundle's address: {0}")]
    Bundle(#[source] std::io::Error),
}

/// `: <what the daemon said>`, when it said anything.
fn said(stderr: &str) -> String {
    let text = kata_topo_core::text::printable(stderr.trim());
    if text.is_empty() {
        String::new()
    } else {
        format!(" (it said: {text})")
    }
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    // containerd shows start's output to the user when start fails.
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// The most `start` accepts on its stdin. containerd writes the runtime options there (Kata's
/// `runtimeoptions.v1.Options`: a type URL and `ConfigPath`; runc's: a few names and paths),
/// from 2.3 inside a `BootstrapParams` with ids, addresses, a version and the socket
/// directory — 100 to 300 bytes as recorded from 1.6.20 and 2.3.4. Every field is an id or a
/// path (at most `PATH_MAX`, 4 KiB), so even a dozen maximal paths fit in 64 KiB; more is not
/// something containerd sent, and is not read on, held or forwarded to the delegate.
const STDIN_LIMIT: usize = 64 * 1024;

/// Reads `start`'s stdin, at most [`STDIN_LIMIT`] bytes.
fn read_options(input: impl Read) -> Result<Vec<u8>, StartError> {
    let mut stdin = Vec::new();
    input
        .take(STDIN_LIMIT as u64 + 1)
        .read_to_end(&mut stdin)
        .map_err(StartError::Stdin)?;
    if stdin.len() > STDIN_LIMIT {
        return Err(StartError::StdinTooLarge);
    }
    Ok(stdin)
}

/// Runs `start`.
pub fn run(args: &Args) -> ExitCode {
    let stdin = match read_options(std::io::stdin()) {
        Ok(s) => s,
        Err(e) => return fail(e),
    };
    // The bootstrap (containerd 2.3+), else the legacy options, flags and environment.
    let params = match Stdin::decode(&stdin).and_then(|input| {
        StartParams::resolve(&input, &args.flags(), std::env::var("TTRPC_ADDRESS").ok())
    }) {
        Ok(p) => p,
        Err(e) => return fail(StartError::from(e)),
    };
    let resolved = match Config::resolve(params.config_path.as_deref()) {
        Ok(r) => r,
        Err(e) => return fail(StartError::from(e)),
    };
    let config = &resolved.config;
    // The delegate's start first, with our argv, environment, cwd and stdin: containerd waits
    // for it whatever the wrapper does, so nothing of the wrapper's goes before it.
    let child = Command::new(&config.delegate_shim)
        .args(&args.raw)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(source) => {
            return fail(StartError::Delegate {
                shim: config.delegate_shim.clone(),
                source,
            })
        }
    };
    if let Some(mut pipe) = child.stdin.take() {
        let _ = pipe.write_all(&stdin);
    }

    // While it starts: the pod's daemon, found running or started now (its set-up, the
    // topology load included, overlaps the delegate's start; it learns the delegate's address
    // through its stdin). Bound after the delegate was spawned, the daemon's listener is
    // never inherited by the delegate.
    let bundle = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."));
    let group = group_of(&bundle, &params.instance_id);
    let address = socket_address(
        params.socket_dir(),
        &params.grpc_address,
        &params.namespace,
        &group,
    );
    let daemon = ensure_daemon(&params, &resolved, &group, &address);

    let output = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return fail(StartError::DelegateWait(e)),
    };
    if !output.status.success() {
        // Dropping `daemon` closes its stdin: a new daemon exits and removes its socket.
        let _ = std::io::stdout().write_all(&output.stdout);
        let _ = std::io::stderr().write_all(&output.stderr);
        return ExitCode::from(output.status.code().unwrap_or(1).clamp(1, 255) as u8);
    }
    // The delegate runs now: whatever fails from here on must not leave it, or the daemon
    // started for it, behind.
    let mut undo = Undo {
        delegate: None,
        fallback_delegate: delegate_socket_address(
            params.socket_dir(),
            &params.grpc_address,
            &params.namespace,
            &group,
        ),
        namespace: params.namespace.clone(),
        id: params.instance_id.clone(),
        started: None,
    };
    let daemon = match daemon {
        Ok(d) => d,
        Err(e) => {
            undo.delegate = Reply::parse(&output.stdout)
                .ok()
                .map(|(_, address, version)| Delegate::new(address, version));
            undo.run();
            return fail(e);
        }
    };
    let info = BundleInfo {
        address,
        delegate_address: String::new(),
        delegate_version: 2,
        group,
        namespace: params.namespace.clone(),
        delegate_shim: config.delegate_shim.clone(),
        state_dir: config.state_dir.clone(),
        metrics_dir: config.metrics_dir.clone(),
    };
    match finish(&bundle, &output.stdout, daemon, &mut undo, info) {
        Ok(reply) => {
            let _ = std::io::stdout().write_all(&reply);
            ExitCode::SUCCESS
        }
        Err(e) => {
            undo.run();
            fail(e)
        }
    }
}

/// Hands the delegate over to the daemon, points the bundle at the wrapper (`info` says
/// where; the delegate's part is filled in here) and gives the reply containerd expects.
fn finish(
    bundle: &Path,
    delegate_reply: &[u8],
    daemon: Daemon,
    undo: &mut Undo,
    mut info: BundleInfo,
) -> Result<Vec<u8>, StartError> {
    if let Daemon::Starting { socket, child, .. } = &daemon {
        let state = GroupState::at(&info.state_dir, &info.namespace, &info.group);
        undo.started = Some((socket.clone(), child.id(), state));
    }
    let (reply, delegate_address, version) = Reply::parse(delegate_reply)?;
    undo.delegate = Some(Delegate::new(delegate_address.clone(), version));
    daemon.hand_over(&delegate_address, version)?;
    info.delegate_address = delegate_address;
    info.delegate_version = version;
    std::fs::write(bundle.join("address"), &info.address)
        .and_then(|()| {
            std::fs::write(
                bundle.join(BUNDLE_FILE),
                serde_json::to_vec(&info).unwrap_or_default(),
            )
        })
        .map_err(StartError::Bundle)?;
    Ok(reply.encode(&info.address))
}

/// What a failed `start` undoes once the delegate started.
struct Undo {
    /// The delegate, once its reply was understood.
    delegate: Option<Delegate>,
    /// Where a shim listens by convention, when its reply was not understood.
    fallback_delegate: String,
    namespace: String,
    id: String,
    /// The daemon this start spawned: its socket, its pid, the pod's state.
    started: Option<(PathBuf, u32, GroupState)>,
}

impl Undo {
    /// Asks the delegate to shut down (it refuses while it still runs other containers of
    /// the pod), then makes sure the daemon this start spawned is gone with its socket and
    /// the pod's state.
    fn run(self) {
        let deadline = Instant::now() + Duration::from_secs(2);
        // A delegate whose reply was not understood did not say which task API it serves
        // (containerd 2.x's shims serve only v3, 1.x's only v2): ask in both.
        let (address, services) = match &self.delegate {
            Some(d) => (d.address.as_str(), vec![d.service]),
            None => (self.fallback_delegate.as_str(), vec![TASK_V3, TASK_V2]),
        };
        if let Ok(mut client) = Client::connect(address, deadline) {
            let shutdown = ShutdownRequest {
                id: self.id.clone(),
                now: false,
            };
            for service in services {
                let answered = client.call(
                    service,
                    "Shutdown",
                    shutdown.encode_to_vec(),
                    &self.namespace,
                    deadline,
                );
                // Served (or the connection went with the delegate): no other service to try.
                if !matches!(&answered, Ok(r) if r.code() == Code::Unimplemented as i32) {
                    break;
                }
            }
        }
        let Some((socket, pid, state)) = self.started else {
            return;
        };
        // Its stdin is closed (or it got the delegate, which is going): it exits by itself.
        let procfs = Path::new("/proc");
        if let Some(daemon) = ProcessId::of(procfs, pid) {
            while daemon.is_alive(procfs) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        if !ProcessId::of(procfs, pid).is_some_and(|p| p.is_alive(procfs)) {
            crate::daemon::remove_dead_socket(&socket);
            let _ = state.remove_all();
        }
    }
}

/// The pod's wrapper daemon as `start` sees it.
enum Daemon {
    /// Already serving the pod; its record names the delegate it forwards to.
    Running { state: GroupState },
    /// Just started; waiting on its stdin for the delegate's address and version.
    Starting {
        stdin: std::process::ChildStdin,
        /// Its socket.
        socket: PathBuf,
        /// The process (reaped when `start` exits).
        child: std::process::Child,
    },
}

impl Daemon {
    /// Tells a new daemon where the delegate is; checks a running one forwards there.
    fn hand_over(self, delegate_address: &str, version: u32) -> Result<(), StartError> {
        match self {
            Self::Running { state } => {
                let known = state
                    .daemon()
                    .ok()
                    .flatten()
                    .map(|r| r.delegate_address)
                    .unwrap_or_default();
                if !known.is_empty() && known != delegate_address {
                    return Err(StartError::OtherDelegate {
                        answered: delegate_address.to_string(),
                        known,
                    });
                }
                Ok(())
            }
            Self::Starting {
                mut stdin,
                mut child,
                ..
            } => stdin
                .write_all(format!("{delegate_address}\n{version}\n").as_bytes())
                .map_err(|source| StartError::DaemonGone {
                    source,
                    stderr: last_words(&mut child),
                }),
        }
    }
}

/// What a daemon that exited during its set-up wrote to its standard error: waits for its exit
/// (at most a second), then reads at most 4 KiB without blocking.
fn last_words(child: &mut std::process::Child) -> String {
    let deadline = Instant::now() + Duration::from_secs(1);
    while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let Some(stderr) = child.stderr.take() else {
        return String::new();
    };
    let nonblocking = nix::fcntl::fcntl(
        stderr.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    );
    if nonblocking.is_err() {
        return String::new();
    }
    let mut text = Vec::new();
    let _ = stderr.take(4096).read_to_end(&mut text);
    String::from_utf8_lossy(&text).into_owned()
}

/// Reuses the pod's running daemon, or starts one on a freshly bound socket.
fn ensure_daemon(
    params: &StartParams,
    resolved: &Resolved,
    group: &str,
    address: &str,
) -> Result<Daemon, StartError> {
    let config = &resolved.config;
    let path = Path::new(socket_path(address));
    // The daemon creates the pod's state; a running one has written its record there.
    let state = GroupState::at(&config.state_dir, &params.namespace, group);
    // A daemon too busy to accept at once is still the pod's daemon: only a socket nothing
    // listens on is replaced.
    match probe(&path.to_string_lossy(), Duration::from_millis(200)) {
        Probe::Listening | Probe::Unknown => return Ok(Daemon::Running { state }),
        Probe::Nothing => {}
    }
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(|source| StartError::SocketDir {
                dir: dir.to_path_buf(),
                source,
            })?;
    }
    let listener = UnixListener::bind(path).map_err(|source| StartError::Listen {
        path: path.to_path_buf(),
        source,
    })?;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    // The daemon inherits the listener as a plain fd.
    nix::fcntl::fcntl(
        listener.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(StartError::PassListener)?;
    let exe = std::env::current_exe().map_err(StartError::Spawn)?;
    let mut cmd = Command::new(exe);
    cmd.arg("-namespace")
        .arg(&params.namespace)
        .arg("-address")
        .arg(&params.grpc_address)
        .arg("-publish-binary")
        .arg(&params.containerd_binary)
        .arg("-ttrpc-address")
        .arg(&params.ttrpc_address)
        .arg("-id")
        .arg(&params.instance_id)
        .arg("-group")
        .arg(group)
        .arg("-listen-fd")
        .arg(listener.as_raw_fd().to_string())
        .arg("-config")
        .arg(
            resolved
                .file
                .as_ref()
                .map(|p| p.as_os_str().to_owned())
                .unwrap_or_default(),
        )
        .arg("-config-source")
        .arg(resolved.source.as_str());
    if params.debug {
        cmd.arg("-debug");
    }
    // One malloc arena for all of the daemon's threads: it allocates little and rarely, and
    // an arena per thread only adds to what it keeps resident.
    cmd.arg("kata-topo-daemon")
        .env("MALLOC_ARENA_MAX", "1")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        // Until it has its delegate: a daemon that fails to set up says why here, and `start`
        // passes it on to containerd. Then it points its standard error at /dev/null.
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(StartError::Spawn)?;
    let stdin = child.stdin.take().ok_or_else(|| {
        StartError::Spawn(std::io::Error::other("the wrapper daemon has no stdin"))
    })?;
    Ok(Daemon::Starting {
        stdin,
        socket: path.to_path_buf(),
        child,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names_never_collide_with_the_delegate() {
        let dir = Path::new(kata_topo_proto::bootstrap::DEFAULT_SOCKET_DIR);
        let containerd = "/run/containerd/containerd.sock";
        let ours = socket_address(dir, containerd, "k8s.io", "sb1");
        let digest = Sha256::digest(b"/run/containerd/containerd.sock/k8s.io/sb1");
        let theirs: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(ours.starts_with("unix:///run/containerd/s/"));
        assert!(!ours.ends_with(&theirs));
        assert_eq!(
            delegate_socket_address(dir, containerd, "k8s.io", "sb1"),
            format!("unix:///run/containerd/s/{theirs}")
        );
        assert_ne!(ours, socket_address(dir, containerd, "k8s.io", "sb2"));
        assert_ne!(ours, socket_address(dir, containerd, "default", "sb1"));
        // containerd 2.3's socket_dir.
        let elsewhere = socket_address(Path::new("/run/k/s"), containerd, "k8s.io", "sb1");
        assert!(elsewhere.starts_with("unix:///run/k/s/"), "{elsewhere}");
        assert!(socket_path(&ours).len() < 108, "fits sun_path");
    }

    #[test]
    fn a_daemon_that_dies_during_set_up_is_heard() {
        // A daemon that writes why it failed and exits: the hand-over fails, and the error
        // carries its words, made printable.
        let mut child = Command::new("sh")
            .args(["-c", "printf 'no listening socket\\033[2J\\n' >&2; exit 1"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("sh");
        let stdin = child.stdin.take().expect("stdin");
        let _ = child.wait();
        let daemon = Daemon::Starting {
            stdin,
            socket: PathBuf::from("/nonexistent"),
            child,
        };
        let e = daemon
            .hand_over("unix:///run/d", 3)
            .expect_err("nobody reads");
        let text = e.to_string();
        assert!(
            text.starts_with("kata-topo: the wrapper daemon did not start: "),
            "{text}"
        );
        assert!(text.contains("(it said: no listening socket"), "{text}");
        assert!(
            !text.contains('\u{1b}'),
            "escape sequences are not passed on: {text:?}"
        );

        // One that lives and keeps its stderr open is not waited on for ever.
        let mut quiet = Command::new("sleep")
            .arg("30")
            .stderr(Stdio::piped())
            .spawn()
            .expect("sleep");
        assert_eq!(last_words(&mut quiet), "");
        let _ = quiet.kill();
        let _ = quiet.wait();
    }

    #[test]
    fn start_options_beyond_the_bound_are_refused() {
        let at_bound = vec![7u8; STDIN_LIMIT];
        assert_eq!(
            read_options(at_bound.as_slice())
                .expect("at the bound")
                .len(),
            STDIN_LIMIT
        );
        // Anything larger, up to hundreds of MiB, used to be read whole and forwarded.
        let e = read_options(std::io::repeat(7).take(64 * STDIN_LIMIT as u64))
            .expect_err("4 MiB of options");
        let text = e.to_string();
        assert!(
            text.starts_with("kata-topo: ") && text.contains("64 KiB"),
            "{text}"
        );
        assert!(read_options(&[][..]).expect("nothing").is_empty());
    }

    #[test]
    fn groups_by_sandbox_id() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(group_of(dir.path(), "task1"), "task1");
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion":"1.0.2","annotations":{"io.kubernetes.cri.sandbox-id":"sb9"}}"#,
        )
        .expect("write");
        assert_eq!(group_of(dir.path(), "task1"), "sb9");
    }
}
