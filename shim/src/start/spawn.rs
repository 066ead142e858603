//! The pod's wrapper daemon as `start` finds it running, or spawns it on a freshly bound
//! socket, and hands it the delegate.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::StartError;
use crate::state::GroupState;
use kata_topo_core::config::Resolved;
use kata_topo_proto::bootstrap::StartParams;
use kata_topo_proto::wire::{probe, socket_path, Probe};

/// The pod's wrapper daemon as `start` sees it.
pub(super) enum Daemon {
    /// Already serving the pod; its record names the delegate it forwards to.
    Running { state: GroupState },
    /// Just started; waiting on its stdin for the delegate's address and version.
    Starting {
        stdin: std::process::ChildStdin,
        socket: PathBuf,
        /// The process (reaped when `start` exits).
        child: std::process::Child,
    },
}

impl Daemon {
    /// Tells a new daemon where the delegate is; checks a running one forwards there.
    pub(super) fn hand_over(self, delegate_address: &str, version: u32) -> Result<(), StartError> {
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
                    stderr: stderr_at_exit(&mut child),
                }),
        }
    }
}

/// What a daemon that exited during its set-up wrote to its standard error: waits for its exit
/// (at most a second), then reads at most 4 KiB without blocking.
fn stderr_at_exit(child: &mut std::process::Child) -> String {
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
pub(super) fn ensure_daemon(
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
        let text = kata_topo_core::text::error_chain(&e);
        assert!(
            text.starts_with(
                "kata-topo: the wrapper daemon did not start (it said: no listening socket"
            ),
            "{text}"
        );
        assert!(
            text.ends_with(": Broken pipe (os error 32)"),
            "the cause, once: {text}"
        );
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
        assert_eq!(stderr_at_exit(&mut quiet), "");
        let _ = quiet.kill();
        let _ = quiet.wait();
    }
}
