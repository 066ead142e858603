//! `start`: run the delegate's `start` with everything containerd gave us, make sure this pod's
//! wrapper daemon runs, point the bundle's `address` at it, and answer in the delegate's format.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

use prost::Message;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::args::Args;
use crate::daemon::Delegate;
use crate::state::GroupState;
use crate::ttrpc::{socket_path, Client, RuntimeOptions, ShutdownRequest};
use kata_topo::config::{Config, ENV_CONFIG};
use kata_topo::process::ProcessId;
use std::time::{Duration, Instant};

/// Where shims put their sockets (containerd hard-codes it, whatever its `state` setting).
pub const SOCKET_DIR: &str = "/run/containerd/s";

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
}

impl BundleInfo {
    /// Reads `<bundle>/kata-topo.json`.
    pub fn read(bundle: &Path) -> Option<Self> {
        let bytes = std::fs::read(bundle.join(BUNDLE_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }
}

/// How the delegate answered `start`, so the wrapper answers the same way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// A plain `unix://` address (containerd 1.6).
    Plain,
    /// JSON `{"version":N,"address":…,"protocol":…}` (1.7, 2.x).
    Json {
        /// Task API version.
        version: u32,
        /// `ttrpc` or `grpc`.
        protocol: String,
    },
    /// A protobuf bootstrap result (2.3+): the original bytes, with the address field at
    /// `(field number)`.
    Protobuf {
        /// The delegate's bytes.
        bytes: Vec<u8>,
        /// The field holding the address.
        field: u64,
    },
}

/// Why the reply could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("kata-topo: cannot understand the delegate's start reply {0:?}")]
pub struct ReplyError(pub String);

impl Reply {
    /// Parses the delegate's stdout: returns the format, the delegate's address and its task
    /// API version.
    pub fn parse(out: &[u8]) -> Result<(Self, String, u32), ReplyError> {
        let shown = || ReplyError(String::from_utf8_lossy(out).chars().take(200).collect());
        if let Ok(text) = std::str::from_utf8(out) {
            let text = text.trim();
            if text.starts_with("unix://") || text.starts_with('/') {
                return Ok((Self::Plain, text.to_string(), 2));
            }
            if text.starts_with('{') {
                #[derive(Deserialize)]
                struct J {
                    version: u32,
                    address: String,
                    #[serde(default)]
                    protocol: String,
                }
                let j: J = serde_json::from_str(text).map_err(|_| shown())?;
                return Ok((
                    Self::Json {
                        version: j.version,
                        protocol: j.protocol,
                    },
                    j.address,
                    j.version,
                ));
            }
        }
        // Protobuf: find the string field that holds an address, and a small varint version.
        let fields = wire_fields(out).ok_or_else(shown)?;
        let (field, address) = fields
            .iter()
            .find_map(|(n, v)| match v {
                Wire::Bytes(b) => std::str::from_utf8(b)
                    .ok()
                    .filter(|s| s.starts_with("unix://") || s.starts_with('/'))
                    .map(|s| (*n, s.to_string())),
                Wire::Varint(_) => None,
            })
            .ok_or_else(shown)?;
        let version = fields
            .iter()
            .find_map(|(_, v)| match v {
                Wire::Varint(x @ 2..=3) => Some(*x as u32),
                _ => None,
            })
            .unwrap_or(3);
        Ok((
            Self::Protobuf {
                bytes: out.to_vec(),
                field,
            },
            address,
            version,
        ))
    }

    /// The same reply with the wrapper's address.
    pub fn encode(&self, address: &str) -> Vec<u8> {
        match self {
            Self::Plain => address.as_bytes().to_vec(),
            Self::Json { version, protocol } => serde_json::json!({
                "version": version, "address": address, "protocol": protocol
            })
            .to_string()
            .into_bytes(),
            Self::Protobuf { bytes, field } => {
                let mut out = Vec::new();
                for (n, v) in wire_fields(bytes).unwrap_or_default() {
                    let value = match (&v, n == *field) {
                        (Wire::Bytes(_), true) => Wire::Bytes(address.as_bytes().to_vec()),
                        _ => v,
                    };
                    match value {
                        Wire::Varint(x) => {
                            prost::encoding::encode_key(
                                n as u32,
                                prost::encoding::WireType::Varint,
                                &mut out,
                            );
                            prost::encoding::encode_varint(x, &mut out);
                        }
                        Wire::Bytes(b) => {
                            prost::encoding::encode_key(
                                n as u32,
                                prost::encoding::WireType::LengthDelimited,
                                &mut out,
                            );
                            prost::encoding::encode_varint(b.len() as u64, &mut out);
                            out.extend_from_slice(&b);
                        }
                    }
                }
                out
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Wire {
    Varint(u64),
    Bytes(Vec<u8>),
}

/// Top-level fields of a protobuf message (varint and length-delimited only).
fn wire_fields(mut buf: &[u8]) -> Option<Vec<(u64, Wire)>> {
    let mut fields = Vec::new();
    while !buf.is_empty() {
        let key = prost::encoding::decode_varint(&mut buf).ok()?;
        let (number, kind) = (key >> 3, key & 7);
        match kind {
            0 => fields.push((
                number,
                Wire::Varint(prost::encoding::decode_varint(&mut buf).ok()?),
            )),
            2 => {
                let len = prost::encoding::decode_varint(&mut buf).ok()? as usize;
                if len > buf.len() {
                    return None;
                }
                fields.push((number, Wire::Bytes(buf[..len].to_vec())));
                buf = &buf[len..];
            }
            _ => return None,
        }
    }
    Some(fields)
}

/// The wrapper's socket for a pod. Shims name theirs after sha256(containerd address + "/" +
/// namespace + "/" + group); the delegate does exactly that, so the wrapper adds its own suffix
/// and can never collide with it.
pub fn socket_address(containerd_address: &str, namespace: &str, group: &str) -> String {
    let digest =
        Sha256::digest(format!("{containerd_address}/{namespace}/{group}/kata-topo").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("unix://{SOCKET_DIR}/{hex}")
}

/// The pod group of a task: the CRI sandbox id, runc's group annotation, else the task id.
pub fn group_of(bundle: &Path, task_id: &str) -> String {
    let spec = kata_topo::ContainerSpec::from_file(&bundle.join("config.json")).ok();
    spec.as_ref()
        .and_then(|s| {
            s.sandbox_id
                .clone()
                .or_else(|| s.annotations.get("io.containerd.runc.v2.group").cloned())
        })
        .filter(|g| !g.is_empty())
        .unwrap_or_else(|| task_id.to_string())
}

/// The `ConfigPath` containerd passed in the runtime options, if any.
pub fn config_path_from_options(stdin: &[u8]) -> Option<PathBuf> {
    if stdin.is_empty() {
        return None;
    }
    // An Any whose value is runtimeoptions.v1.Options.
    let any = crate::ttrpc::Any::decode(stdin).ok()?;
    if !any.type_url.ends_with("runtimeoptions.v1.Options") {
        return None;
    }
    let opts = RuntimeOptions::decode(any.value.as_slice()).ok()?;
    Some(PathBuf::from(opts.config_path)).filter(|p| !p.as_os_str().is_empty())
}

fn fail(message: impl std::fmt::Display) -> ExitCode {
    // containerd shows start's output to the user when start fails.
    eprintln!("{message}");
    ExitCode::FAILURE
}

/// Runs `start`.
pub fn run(args: &Args) -> ExitCode {
    let mut stdin = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut stdin) {
        return fail(format!("kata-topo: cannot read start options: {e}"));
    }
    let options_path = config_path_from_options(&stdin);
    let env_path = std::env::var_os(ENV_CONFIG).map(PathBuf::from);
    let (config, config_file) = match Config::resolve(options_path.as_deref(), env_path.as_deref())
    {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
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
        Err(e) => {
            return fail(format!(
                "kata-topo: cannot run the delegate shim {:?} (topology_guard.delegate_shim): {e}",
                config.delegate_shim
            ))
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
    let group = group_of(&bundle, &args.id);
    let address = socket_address(&args.address, &args.namespace, &group);
    let daemon = ensure_daemon(args, &config, config_file.as_deref(), &group, &address);

    let output = match child.wait_with_output() {
        Ok(o) => o,
        Err(e) => return fail(format!("kata-topo: delegate start failed: {e}")),
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
        fallback_delegate: delegate_socket_address(&args.address, &args.namespace, &group),
        namespace: args.namespace.clone(),
        id: args.id.clone(),
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
        namespace: args.namespace.clone(),
        delegate_shim: config.delegate_shim.clone(),
        state_dir: config.state_dir.clone(),
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
) -> Result<Vec<u8>, String> {
    if let Daemon::Starting { socket, child, .. } = &daemon {
        let state = GroupState::at(&info.state_dir, &info.namespace, &info.group);
        undo.started = Some((socket.clone(), child.id(), state));
    }
    let (reply, delegate_address, version) =
        Reply::parse(delegate_reply).map_err(|e| e.to_string())?;
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
        .map_err(|e| format!("kata-topo: cannot write the bundle's address: {e}"))?;
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
        let delegate = self
            .delegate
            .unwrap_or_else(|| Delegate::new(self.fallback_delegate, 2));
        if let Ok(mut client) = Client::connect(&delegate.address, deadline) {
            let shutdown = ShutdownRequest {
                id: self.id.clone(),
                now: false,
            };
            let _ = client.call(
                delegate.service,
                "Shutdown",
                shutdown.encode_to_vec(),
                &self.namespace,
                deadline,
            );
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

/// Where a shim of the containerd shim library listens: `/run/containerd/s/<sha256(containerd
/// address + "/" + namespace + "/" + group)>`.
pub fn delegate_socket_address(containerd_address: &str, namespace: &str, group: &str) -> String {
    let digest = Sha256::digest(format!("{containerd_address}/{namespace}/{group}").as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("unix://{SOCKET_DIR}/{hex}")
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
    fn hand_over(self, delegate_address: &str, version: u32) -> Result<(), String> {
        match self {
            Self::Running { state } => {
                let known = state
                    .daemon()
                    .ok()
                    .flatten()
                    .map(|r| r.delegate_address)
                    .unwrap_or_default();
                if !known.is_empty() && known != delegate_address {
                    return Err(format!(
                        "kata-topo: the delegate answered {delegate_address}, but this pod's wrapper forwards to {known}"
                    ));
                }
                Ok(())
            }
            Self::Starting { mut stdin, .. } => stdin
                .write_all(format!("{delegate_address}\n{version}\n").as_bytes())
                .map_err(|e| format!("kata-topo: the wrapper daemon did not start: {e}")),
        }
    }
}

/// Reuses the pod's running daemon, or starts one on a freshly bound socket.
fn ensure_daemon(
    args: &Args,
    config: &Config,
    config_file: Option<&Path>,
    group: &str,
    address: &str,
) -> Result<Daemon, String> {
    let path = Path::new(socket_path(address));
    // The daemon creates the pod's state; a running one has written its record there.
    let state = GroupState::at(&config.state_dir, &args.namespace, group);
    if UnixStream::connect(path).is_ok() {
        return Ok(Daemon::Running { state });
    }
    let _ = std::fs::remove_file(path);
    if let Some(dir) = path.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(dir)
            .map_err(|e| format!("kata-topo: cannot create {}: {e}", dir.display()))?;
    }
    let listener = UnixListener::bind(path)
        .map_err(|e| format!("kata-topo: cannot listen on {}: {e}", path.display()))?;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    // The daemon inherits the listener as a plain fd.
    nix::fcntl::fcntl(
        listener.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()),
    )
    .map_err(|e| format!("kata-topo: cannot pass the listener: {e}"))?;
    let exe = std::env::current_exe().map_err(|e| format!("kata-topo: cannot find itself: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.arg("-namespace")
        .arg(&args.namespace)
        .arg("-address")
        .arg(&args.address)
        .arg("-publish-binary")
        .arg(&args.publish_binary)
        .arg("-id")
        .arg(&args.id)
        .arg("-group")
        .arg(group)
        .arg("-listen-fd")
        .arg(listener.as_raw_fd().to_string())
        .arg("-config")
        .arg(
            config_file
                .map(|p| p.as_os_str().to_owned())
                .unwrap_or_default(),
        );
    if args.debug {
        cmd.arg("-debug");
    }
    // One malloc arena for all of the daemon's threads: it allocates little and rarely, and
    // an arena per thread only adds to what it keeps resident.
    cmd.arg("kata-topo-daemon")
        .env("MALLOC_ARENA_MAX", "1")
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("kata-topo: cannot start the wrapper daemon: {e}"))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| "kata-topo: the wrapper daemon has no stdin".to_string())?;
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
    fn parses_and_answers_every_reply_format() {
        let (r, a, v) = Reply::parse(b"unix:///run/containerd/s/abc\n").expect("plain");
        assert_eq!(
            (r.clone(), a.as_str(), v),
            (Reply::Plain, "unix:///run/containerd/s/abc", 2)
        );
        assert_eq!(
            r.encode("unix:///run/containerd/s/me"),
            b"unix:///run/containerd/s/me"
        );

        let (r, a, v) =
            Reply::parse(br#"{"version":3,"address":"unix:///run/x","protocol":"ttrpc"}"#)
                .expect("json");
        assert_eq!((a.as_str(), v), ("unix:///run/x", 3));
        let out: serde_json::Value = serde_json::from_slice(&r.encode("unix:///me")).expect("json");
        assert_eq!(
            out,
            serde_json::json!({"version": 3, "address": "unix:///me", "protocol": "ttrpc"})
        );

        // A protobuf bootstrap result: version 3 (field 1), address (field 2), protocol (3).
        let mut pb = Vec::new();
        prost::encoding::int32::encode(1, &3, &mut pb);
        prost::encoding::string::encode(2, &"unix:///run/d".to_string(), &mut pb);
        prost::encoding::string::encode(3, &"ttrpc".to_string(), &mut pb);
        let (r, a, v) = Reply::parse(&pb).expect("protobuf");
        assert_eq!((a.as_str(), v), ("unix:///run/d", 3));
        let mine = r.encode("unix:///run/me");
        let (_, a2, v2) = Reply::parse(&mine).expect("re-parse");
        assert_eq!((a2.as_str(), v2), ("unix:///run/me", 3));
        assert!(mine.windows(5).any(|w| w == b"ttrpc"), "other fields kept");

        assert!(Reply::parse(b"nonsense").is_err());
        assert!(Reply::parse(b"{\"version\":\"x\"}").is_err());
        assert!(Reply::parse(&[0xff, 0xff, 0xff]).is_err());
    }

    #[test]
    fn socket_names_never_collide_with_the_delegate() {
        let ours = socket_address("/run/containerd/containerd.sock", "k8s.io", "sb1");
        let digest = Sha256::digest(b"/run/containerd/containerd.sock/k8s.io/sb1");
        let theirs: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(ours.starts_with("unix:///run/containerd/s/"));
        assert!(!ours.ends_with(&theirs));
        assert_ne!(
            ours,
            socket_address("/run/containerd/containerd.sock", "k8s.io", "sb2")
        );
        assert_ne!(
            ours,
            socket_address("/run/containerd/containerd.sock", "default", "sb1")
        );
        assert!(socket_path(&ours).len() < 108, "fits sun_path");
    }

    #[test]
    fn reads_config_path_from_runtime_options() {
        let opts = RuntimeOptions {
            type_url: "io.containerd.kata.v2".into(),
            config_path: "/opt/kata/configuration.toml".into(),
        };
        let any = crate::ttrpc::Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: opts.encode_to_vec(),
        };
        assert_eq!(
            config_path_from_options(&any.encode_to_vec()),
            Some(PathBuf::from("/opt/kata/configuration.toml"))
        );
        assert_eq!(config_path_from_options(b""), None);
        let other = crate::ttrpc::Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: vec![],
        };
        assert_eq!(config_path_from_options(&other.encode_to_vec()), None);
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
