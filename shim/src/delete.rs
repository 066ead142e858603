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

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use kata_topo::process::ProcessId;
use prost::Message;

use crate::args::Args;
use crate::daemon::{remove_dead_socket, Delegate};
use crate::start::BundleInfo;
use crate::state::{DaemonRecord, GroupState};
use crate::ttrpc::{
    socket_path, Client, ConnectRequest, ConnectResponse, DeleteRequest, KillRequest,
    ShutdownRequest,
};
use kata_topo::config::{Config, ENV_CONFIG};

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
    let env_path = std::env::var_os(ENV_CONFIG).map(PathBuf::from);
    let mut config = Config::resolve(None, env_path.as_deref())
        .map(|(c, _)| c)
        .unwrap_or_default();
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
            remove_dead_socket(Path::new(socket_path(&info.address)));
        } else if !pod.wrapper_alive(deadline) {
            remove_dead_socket(Path::new(socket_path(&info.address)));
            if pod.delegate_serves(deadline) {
                let delegate = Delegate::new(info.delegate_address.clone(), info.delegate_version);
                let response = cleanup_through_rpcs(&delegate, &args.id, &info.namespace, deadline);
                pod.forget_task(&args.id, deadline);
                if let Some(response) = response {
                    let _ = std::io::stdout().write_all(&response);
                    return ExitCode::SUCCESS;
                }
            } else {
                pod.forget_task(&args.id, deadline);
            }
        }
    }
    hand_to_delegate(&config, args)
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
            None => crate::ttrpc::connect_until(
                socket_path(&self.info.address),
                deadline.min(Instant::now() + Duration::from_millis(100)),
            )
            .is_ok(),
        }
    }

    /// The delegate's process, when the daemon recorded it.
    fn delegate(&self) -> Option<ProcessId> {
        self.record
            .as_ref()
            .filter(|r| r.delegate_address == self.info.delegate_address)
            .and_then(|r| r.delegate)
    }

    /// Whether the delegate runs and serves. From its recorded process; when it was never
    /// recorded, from whether it answers `Connect` in time.
    fn delegate_serves(&self, deadline: Instant) -> bool {
        match self.delegate() {
            Some(p) => p.is_alive(self.procfs),
            None => {
                let d = Delegate::new(
                    self.info.delegate_address.clone(),
                    self.info.delegate_version,
                );
                let probe = deadline.min(Instant::now() + CALL_TIMEOUT);
                connect_rpc(&d, &self.info.namespace, probe).is_ok()
            }
        }
    }

    /// Drops this task's state; once the delegate has gone too, its leftover socket and the
    /// pod's whole state.
    fn forget_task(&self, id: &str, deadline: Instant) {
        let delegate_gone = match self.delegate() {
            Some(p) => wait_exit(p, self.procfs, deadline.min(Instant::now() + CALL_TIMEOUT)),
            None => false,
        };
        if delegate_gone {
            remove_dead_socket(Path::new(socket_path(&self.info.delegate_address)));
        }
        if let Some(state) = &self.state {
            let _ = if delegate_gone {
                state.remove_all()
            } else {
                state.remove_task(id)
            };
        }
    }
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
