//! `delete`: containerd's cleanup after a shim connection dropped. containerd gives it 5 s
//! (`io.containerd.timeout.shim.cleanup`) and then kills it, so everything here runs against
//! one deadline well inside that.
//!
//! Who is alive is read from the processes (the pids the daemon recorded with their start
//! times), never from `connect()`: an exiting shim still accepts into its listen backlog.
//!
//! - The wrapper daemon runs (it serves, or it is exiting because its delegate exited and
//!   cleans up after itself): hand `delete` to the delegate.
//! - The wrapper died while the delegate still runs: the delegate would leak. Clean up what
//!   the wrapper left (its socket), then stop the task through the delegate's own RPCs — Kill,
//!   Delete, and Shutdown even when Delete failed — and answer with its `DeleteResponse`. If
//!   Delete did not succeed, the delegate's own `delete` answers.
//! - Nothing runs any more: remove what is left and hand `delete` to the delegate.
//!
//! A wrapper that is gone also leaves its metrics file (it says the sandbox is watched):
//! `delete` removes it.

use std::io::Write;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use kata_topo_core::files::Dir;
use kata_topo_core::process::ProcessId;
use prost::Message;

use crate::args::Args;
use crate::bundle::BundleInfo;
use crate::daemon::{remove_dead_socket, remove_socket_of_exiting};
use crate::delegate::Delegate;
use crate::state::{DaemonRecord, GroupState};
use kata_topo_core::config::Config;
use kata_topo_proto::wire::{
    probe, socket_path, Client, ConnectRequest, ConnectResponse, DeleteRequest, KillRequest, Probe,
    ShutdownRequest,
};

/// The whole of `delete`'s own work; containerd allows 5 s, and the delegate's `delete` may
/// still have to run after it.
const BUDGET: Duration = Duration::from_millis(3000);
/// What is kept back for Shutdown while Delete is retried.
const SHUTDOWN_RESERVE: Duration = Duration::from_millis(600);
/// The longest a single call may take.
const CALL_TIMEOUT: Duration = Duration::from_millis(800);

/// Runs `delete`.
pub fn run(args: &Args) -> ExitCode {
    let deadline = Instant::now() + BUDGET;
    let mut config = Config::resolve(None).map(|r| r.config).unwrap_or_default();
    let bundle = if args.bundle.is_empty() {
        std::env::current_dir().unwrap_or_default()
    } else {
        PathBuf::from(&args.bundle)
    };
    if let Some(info) = BundleInfo::read(&bundle) {
        // What `start` used wins over what this environment resolves to.
        config.delegate_shim = info.delegate_shim.clone();
        let pod = Pod::find(&info, &config.procfs_root);
        if pod.state.is_none() {
            // The daemon exited cleanly (it removes the pod's state last), or never ran.
            let socket = Path::new(socket_path(&info.address));
            remove_dead_socket(socket);
            if !socket.exists() {
                remove_metrics(&info, deadline);
            }
        } else if !pod.wrapper_alive(deadline) {
            remove_dead_socket(Path::new(socket_path(&info.address)));
            // A daemon killed (SIGKILL, a crash) left its file with the sandbox watched.
            remove_metrics(&info, deadline);
            let process = pod.delegate(deadline);
            if process.is_some_and(|p| p.is_alive(&config.procfs_root)) {
                let delegate = Delegate::new(info.delegate_address.clone(), info.delegate_version);
                let response = cleanup_through_rpcs(&delegate, &args.id, &info.namespace, deadline);
                pod.forget_task(&args.id, process, deadline);
                if let Some(response) = response {
                    let _ = std::io::stdout().write_all(&response);
                    return ExitCode::SUCCESS;
                }
            } else {
                pod.forget_task(&args.id, process, deadline);
            }
        }
    }
    hand_to_delegate(&config, args)
}

/// The longest `delete` waits on the metrics directory: a hung file system costs the file,
/// not containerd's cleanup budget.
const METRICS_WAIT: Duration = Duration::from_millis(200);

/// Removes the pod's metrics file, relative to its directory opened without following a
/// symlink (as the daemon writes it), waiting at most [`METRICS_WAIT`].
fn remove_metrics(info: &BundleInfo, deadline: Instant) {
    let Some(dir) = info.metrics_dir.clone() else {
        return;
    };
    let name = kata_topo_sinks::metrics::file_name(&info.namespace, &info.group);
    let (tx, rx) = std::sync::mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("metrics".into())
        .spawn(move || {
            let _ = Dir::open(&dir).and_then(|d| d.remove(&name));
            let _ = tx.send(());
        });
    if spawned.is_ok() {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .min(METRICS_WAIT);
        let _ = rx.recv_timeout(wait);
    }
}

/// A pod as `delete` finds it: its bundle's record, its state and who the daemon said serves.
struct Pod<'a> {
    info: &'a BundleInfo,
    procfs: &'a Path,
    state: Option<GroupState>,
    record: Option<DaemonRecord>,
}

impl<'a> Pod<'a> {
    fn find(info: &'a BundleInfo, procfs: &'a Path) -> Self {
        let state = GroupState::existing(&info.state_dir, &info.namespace, &info.group);
        let record = state.as_ref().and_then(|s| s.daemon().ok().flatten());
        Self {
            info,
            procfs,
            state,
            record,
        }
    }

    /// Whether the wrapper daemon runs. Without its record (it died before writing one),
    /// whether anything accepts on its socket.
    fn wrapper_alive(&self, deadline: Instant) -> bool {
        match &self.record {
            Some(r) => r.wrapper.is_alive(self.procfs),
            None => {
                let within = deadline
                    .saturating_duration_since(Instant::now())
                    .min(Duration::from_millis(100));
                probe(socket_path(&self.info.address), within) == Probe::Listening
            }
        }
    }

    /// The delegate's process: as the daemon recorded it, else as the delegate itself tells
    /// when asked (`Connect`) — which only a delegate that serves answers in time.
    fn delegate(&self, deadline: Instant) -> Option<ProcessId> {
        let recorded = self
            .record
            .as_ref()
            .filter(|r| r.delegate_address == self.info.delegate_address)
            .and_then(|r| r.delegate);
        recorded.or_else(|| {
            let d = Delegate::new(
                self.info.delegate_address.clone(),
                self.info.delegate_version,
            );
            let probe = deadline.min(Instant::now() + CALL_TIMEOUT);
            let pid = connect_rpc(&d, &self.info.namespace, probe).ok()?.shim_pid;
            ProcessId::of(self.procfs, pid)
        })
    }

    /// Drops this task's state; once the delegate has gone too, its leftover socket and the
    /// pod's whole state.
    fn forget_task(&self, id: &str, delegate: Option<ProcessId>, deadline: Instant) {
        // After Shutdown a delegate without tasks exits within moments; what is left of the
        // budget is spent waiting for that rather than leaving its socket behind.
        let delegate_gone = match delegate {
            Some(p) => wait_exit(p, self.procfs, deadline),
            None => false,
        };
        if delegate_gone {
            remove_socket_of_exiting(
                Path::new(socket_path(&self.info.delegate_address)),
                deadline,
            );
        }
        if let Some(state) = &self.state {
            let _ = if delegate_gone {
                state.remove_all()
            } else {
                state.remove_task(id)
            };
        }
        // Out of time, and the delegate still runs or still holds its socket (it may be
        // exiting slowly, or serving the pod's other tasks): a reaper waits for it, off
        // containerd's clock.
        let socket_left = Path::new(socket_path(&self.info.delegate_address)).exists();
        if let (true, Some(p), Some(state)) = (!delegate_gone || socket_left, delegate, &self.state)
        {
            spawn_reaper(&Leftovers {
                delegate: p,
                socket: PathBuf::from(socket_path(&self.info.delegate_address)),
                state_dir: state.dir().to_path_buf(),
            });
        }
    }
}

/// What an exited delegate leaves behind.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Leftovers {
    delegate: ProcessId,
    socket: PathBuf,
    state_dir: PathBuf,
}

/// How long a reaper waits for the delegate.
const REAP_WAIT: Duration = Duration::from_secs(60);

fn spawn_reaper(leftovers: &Leftovers) {
    let (Ok(exe), Ok(json)) = (std::env::current_exe(), serde_json::to_string(leftovers)) else {
        return;
    };
    // Nothing of containerd's: it reads delete's stdout until every copy of it is closed.
    let _ = Command::new(exe)
        .args(["-reap", &json, "kata-topo-reap"])
        .current_dir("/")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0)
        .spawn();
}

/// The reaper: waits (bounded) for the delegate to exit, then removes its socket and the
/// pod's state. A delegate that still serves other tasks after the wait is left alone.
pub fn reap(args: &Args) -> ExitCode {
    let Ok(l) = serde_json::from_str::<Leftovers>(&args.reap) else {
        return ExitCode::FAILURE;
    };
    let deadline = Instant::now() + REAP_WAIT;
    if wait_exit(l.delegate, Path::new("/proc"), deadline) {
        remove_socket_of_exiting(&l.socket, deadline);
        let _ = std::fs::remove_dir_all(&l.state_dir);
        if let Some(ns) = l.state_dir.parent() {
            let _ = std::fs::remove_dir(ns);
        }
    }
    ExitCode::SUCCESS
}

/// Waits until a process exits, up to `deadline`.
fn wait_exit(p: ProcessId, procfs: &Path, deadline: Instant) -> bool {
    loop {
        if !p.is_alive(procfs) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The delegate's answer to `Connect`: proof that it serves, and its pid.
pub fn connect_rpc(
    delegate: &Delegate,
    namespace: &str,
    deadline: Instant,
) -> std::io::Result<ConnectResponse> {
    let mut client = Client::connect(&delegate.address, deadline)?;
    let response = client.call(
        delegate.service,
        "Connect",
        ConnectRequest { id: String::new() }.encode_to_vec(),
        namespace,
        deadline,
    )?;
    if response.code() != 0 {
        return Err(std::io::Error::other("Connect refused"));
    }
    ConnectResponse::decode(response.payload.as_slice())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The deadline of one call: at most [`CALL_TIMEOUT`], and never into `reserve` before
/// `deadline`.
fn call_deadline(deadline: Instant, reserve: Duration) -> Instant {
    let end = deadline.checked_sub(reserve).unwrap_or(deadline);
    end.min(Instant::now() + CALL_TIMEOUT)
}

/// Kill, Delete (retried while the delegate reaps the task), and Shutdown — sent even when
/// Delete failed — through the delegate's task API. The Delete reply is the answer.
fn cleanup_through_rpcs(
    delegate: &Delegate,
    id: &str,
    namespace: &str,
    deadline: Instant,
) -> Option<Vec<u8>> {
    let mut client =
        Client::connect(&delegate.address, call_deadline(deadline, SHUTDOWN_RESERVE)).ok()?;
    let kill = KillRequest {
        id: id.to_string(),
        exec_id: String::new(),
        signal: 9,
        all: true,
    };
    let _ = client.call(
        delegate.service,
        "Kill",
        kill.encode_to_vec(),
        namespace,
        call_deadline(deadline, SHUTDOWN_RESERVE),
    );
    let delete = DeleteRequest {
        id: id.to_string(),
        exec_id: String::new(),
    }
    .encode_to_vec();
    let mut answer = None;
    while Instant::now() + SHUTDOWN_RESERVE < deadline {
        match client.call(
            delegate.service,
            "Delete",
            delete.clone(),
            namespace,
            call_deadline(deadline, SHUTDOWN_RESERVE),
        ) {
            Ok(r) if r.code() == 0 => {
                answer = Some(r.payload);
                break;
            }
            Ok(_) => std::thread::sleep(Duration::from_millis(50)),
            // A broken or silent connection: Shutdown goes on a fresh one.
            Err(_) => break,
        }
    }
    let shutdown = ShutdownRequest {
        id: id.to_string(),
        now: false,
    }
    .encode_to_vec();
    let sent = client.call(
        delegate.service,
        "Shutdown",
        shutdown.clone(),
        namespace,
        deadline,
    );
    if sent.is_err() {
        if let Ok(mut fresh) = Client::connect(&delegate.address, deadline) {
            let _ = fresh.call(delegate.service, "Shutdown", shutdown, namespace, deadline);
        }
    }
    answer
}

/// Becomes the delegate's own `delete` (exec: same argv, stdin, stdout, cwd).
fn hand_to_delegate(config: &Config, args: &Args) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let error = Command::new(&config.delegate_shim).args(&args.raw).exec();
    eprintln!(
        "kata-topo: cannot run the delegate shim {:?} for delete: {error}",
        config.delegate_shim
    );
    ExitCode::FAILURE
}
