//! One VM of the remote hypervisor service: its QEMU (waited for by a thread of its own, which
//! is also its parent for the parent-death signal), the relay from the agent's socket to the
//! forwarded agent port, the readiness check, and the power-off.

use std::ffi::OsString;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use kata_topo_proto::wire::Client;
use prost::Message;

use super::kata::grpc::{health_check_response::ServingStatus, CheckRequest, HealthCheckResponse};
use super::{log, Config, Error, GUEST_ADDR, GUEST_AGENT_PORT, GUEST_CONTROL_PORT};

/// What one boot needs.
pub(crate) struct Boot<'a> {
    pub(crate) config: &'a Config,
    pub(crate) id: &'a str,
    /// The sandbox's directory (QEMU's output goes there).
    pub(crate) dir: &'a Path,
    /// The sandbox's shared directory, exported as `kataShared`.
    pub(crate) share: &'a Path,
    /// The mount namespace QEMU joins (`/proc/<pid>/ns/mnt`), when it is not this one's.
    pub(crate) namespace: Option<&'a Path>,
    pub(crate) agent_socket: &'a Path,
}

/// A running (or ended) QEMU and what serves it.
#[derive(Debug)]
pub(crate) struct Vm {
    pid: AtomicU32,
    agent_port: u16,
    control_port: u16,
    /// QEMU's exit status, once it exited.
    exit: Mutex<Option<ExitStatus>>,
    exited: Condvar,
    relay: Relay,
    console: Option<PathBuf>,
    output: PathBuf,
}

/// How a VM ended at `StopVM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The guest powered off when asked (QEMU's status).
    PoweredOff(String),
    /// It did not within the time: QEMU was killed.
    Killed(String),
}

impl fmt::Display for Ended {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::PoweredOff(s) => write!(f, "powered off ({s})"),
            Self::Killed(s) => write!(f, "killed ({s})"),
        }
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("QEMU exited {c}"),
        (None, Some(s)) => format!("QEMU ended by signal {s}"),
        _ => format!("QEMU {status}"),
    }
}

/// A free TCP port on the loopback (bound, then released for QEMU to take).
fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
        .local_addr()?
        .port())
}

/// `/proc/<pid>/ns/mnt` when that process is in another mount namespace than this one.
pub(crate) fn other_mount_namespace(pid: u32) -> Option<PathBuf> {
    let theirs = PathBuf::from(format!("/proc/{pid}/ns/mnt"));
    let (Ok(a), Ok(b)) = (
        std::fs::read_link(&theirs),
        std::fs::read_link("/proc/self/ns/mnt"),
    ) else {
        return None;
    };
    (a != b).then_some(theirs)
}

/// The file QEMU writes the guest's console to (`-serial file:PATH` in the machine).
fn console_of(machine: &[OsString]) -> Option<PathBuf> {
    machine
        .windows(2)
        .find(|w| w[0] == "-serial")
        .and_then(|w| w[1].to_str())
        .and_then(|s| s.strip_prefix("file:"))
        .map(PathBuf::from)
}

/// The last `n` lines of a file, on one line.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().map(|l| l.trim_end_matches('\r')).collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}

/// QEMU's arguments for one sandbox: the machine, then its shared directory and the NIC that
/// forwards the agent's and the control port.
pub(crate) fn qemu_args(
    machine: &[OsString],
    share: &Path,
    agent_port: u16,
    control_port: u16,
) -> Vec<OsString> {
    let mut args = machine.to_vec();
    let mut fsdev = OsString::from("local,id=fs_kataShared,path=");
    fsdev.push(share);
    fsdev.push(",security_model=none,multidevs=remap,readonly=on");
    args.extend([
        "-fsdev".into(),
        fsdev,
        "-device".into(),
        "virtio-9p-pci,fsdev=fs_kataShared,mount_tag=kataShared,bus=pcie.0".into(),
        "-netdev".into(),
        format!(
            "user,id=kata,restrict=on,hostfwd=tcp:127.0.0.1:{agent_port}-{GUEST_ADDR}:{GUEST_AGENT_PORT},\
             hostfwd=tcp:127.0.0.1:{control_port}-{GUEST_ADDR}:{GUEST_CONTROL_PORT}"
        )
        .into(),
        "-device".into(),
        "virtio-net-pci,netdev=kata,bus=pcie.0".into(),
    ]);
    args
}

impl Vm {
    /// Starts QEMU and the relay; does not wait for the guest.
    pub(crate) fn boot(b: &Boot<'_>) -> Result<Arc<Self>, Error> {
        let io = |what: &str| {
            let what = what.to_string();
            move |e| Error::Io(what, e)
        };
        let agent_port = free_port().map_err(io("finding a free port"))?;
        let control_port = free_port().map_err(io("finding a free port"))?;
        let output = b.dir.join("qemu.log");
        let out = std::fs::File::create(&output)
            .map_err(io(&format!("creating {}", output.display())))?;
        let err = out
            .try_clone()
            .map_err(io("duplicating QEMU's output file"))?;
        // setpriv sets the parent-death signal and execs nsenter, which joins the caller's
        // mount namespace and execs QEMU: one process, whose parent is the waiting thread.
        let mut command = Command::new("setpriv");
        command.args(["--pdeathsig", "KILL"]);
        if let Some(ns) = b.namespace {
            let mut flag = OsString::from("--mount=");
            flag.push(ns);
            command.arg("nsenter").arg(flag).arg("--");
        }
        command
            .arg(&b.config.qemu)
            .args(qemu_args(
                &b.config.machine,
                b.share,
                agent_port,
                control_port,
            ))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err);
        let target = SocketAddr::from((Ipv4Addr::LOCALHOST, agent_port));
        let relay = Relay::start(b.agent_socket, target)
            .map_err(io(&format!("listening on {}", b.agent_socket.display())))?;
        let vm = Arc::new(Self {
            pid: AtomicU32::new(0),
            agent_port,
            control_port,
            exit: Mutex::new(None),
            exited: Condvar::new(),
            relay,
            console: console_of(&b.config.machine),
            output,
        });
        let (tx, rx) = mpsc::channel();
        let for_thread = Arc::clone(&vm);
        let id = b.id.to_string();
        let spawned = std::thread::Builder::new()
            .name(format!("qemu-{}", &id[..id.len().min(8)]))
            .spawn(move || {
                let vm = for_thread;
                let mut child = match command.spawn() {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        return;
                    }
                };
                vm.pid.store(child.id(), Ordering::SeqCst);
                let _ = tx.send(Ok(()));
                let status = child
                    .wait()
                    .unwrap_or_else(|_| ExitStatus::from_raw(0xff00));
                log(
                    "vm-exited",
                    &id,
                    serde_json::json!({"status": describe(status)}),
                );
                *vm.exit.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                vm.exited.notify_all();
                vm.relay.close();
            });
        let started = match spawned {
            Ok(_) => rx
                .recv()
                .unwrap_or_else(|_| Err(io::Error::other("its thread ended"))),
            Err(e) => Err(e),
        };
        if let Err(e) = started {
            vm.relay.close();
            return Err(Error::Io(
                format!("starting {}", b.config.qemu.display()),
                e,
            ));
        }
        Ok(vm)
    }

    pub(crate) fn pid(&self) -> u32 {
        self.pid.load(Ordering::SeqCst)
    }

    pub(crate) fn agent_port(&self) -> u16 {
        self.agent_port
    }

    fn exit_status(&self) -> Option<ExitStatus> {
        *self.exit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits at most `within` for QEMU to exit.
    fn wait_exit(&self, within: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + within;
        let mut exit = self.exit.lock().unwrap_or_else(|e| e.into_inner());
        while exit.is_none() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            exit = self
                .exited
                .wait_timeout(exit, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        *exit
    }

    /// The guest's console and QEMU's own output, in a few lines.
    fn console(&self) -> String {
        let console = self
            .console
            .as_deref()
            .map(|c| tail(c, 8))
            .unwrap_or_default();
        format!("{console} | qemu: {}", tail(&self.output, 3))
    }

    /// Waits until the agent answers through the relay, QEMU ends, or `deadline`.
    pub(crate) fn wait_for_agent(&self, id: &str, deadline: Instant) -> Result<(), Error> {
        let started = Instant::now();
        let mut last = "no answer yet".to_string();
        loop {
            if let Some(status) = self.exit_status() {
                return Err(Error::GuestEnded {
                    id: id.to_string(),
                    how: describe(status),
                    console: self.console(),
                });
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::NotReady {
                    id: id.to_string(),
                    seconds: started.elapsed().as_secs(),
                    last,
                    console: self.console(),
                });
            }
            let attempt = (now + Duration::from_secs(3)).min(deadline);
            match agent_answers(self.relay.socket(), attempt) {
                Ok(()) => return Ok(()),
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Asks the guest to power off; kills QEMU when it has not exited within `within`.
    pub(crate) fn stop(&self, within: Duration) -> Ended {
        let deadline = Instant::now() + within;
        let control = SocketAddr::from((Ipv4Addr::LOCALHOST, self.control_port));
        // The forwarded port accepts before the guest listens: ask until the guest answers.
        while self.exit_status().is_none() && Instant::now() < deadline {
            if ask_power_off(control) {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let ended = match self.wait_exit(left) {
            Some(status) => Ended::PoweredOff(describe(status)),
            None => {
                self.kill();
                let status = self
                    .wait_exit(Duration::from_secs(10))
                    .map_or_else(|| "QEMU did not exit".to_string(), describe);
                Ended::Killed(format!(
                    "no power-off within {} s; {status}",
                    within.as_secs()
                ))
            }
        };
        self.relay.close();
        ended
    }

    /// Kills QEMU (TERM, then KILL two seconds later).
    pub(crate) fn kill(&self) {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let Ok(pid) = i32::try_from(self.pid()) else {
            return;
        };
        if pid == 0 {
            return;
        }
        if self.exit_status().is_none() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
            if self.wait_exit(Duration::from_secs(2)).is_none() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
                let _ = self.wait_exit(Duration::from_secs(5));
            }
        }
        self.relay.close();
    }
}

/// Sends `poweroff` on the guest's control port; true when the guest said `ok`.
fn ask_power_off(control: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&control, Duration::from_secs(2)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"poweroff\n").is_err() {
        return false;
    }
    let _ = s.shutdown(Shutdown::Write);
    let mut answer = String::new();
    let _ = s.take(64).read_to_string(&mut answer);
    answer.trim() == "ok"
}

/// One readiness check: connects to the agent's socket and asks `grpc.Health/Check`, the
/// first thing Kata's shim asks; `Ok` when the agent says `SERVING`.
pub fn agent_answers(socket: &Path, deadline: Instant) -> Result<(), String> {
    let path = socket.to_string_lossy();
    let mut client = Client::connect(&path, deadline).map_err(|e| format!("connect: {e}"))?;
    let response = client
        .call(
            "grpc.Health",
            "Check",
            CheckRequest::default().encode_to_vec(),
            "",
            deadline,
        )
        .map_err(|e| format!("grpc.Health/Check: {e}"))?;
    if response.code() != 0 {
        let code = response.code();
        let message = response.status.map(|s| s.message).unwrap_or_default();
        return Err(format!("grpc.Health/Check answered {code}: {message}"));
    }
    let health = HealthCheckResponse::decode(response.payload.as_slice())
        .map_err(|e| format!("grpc.Health/Check answer: {e}"))?;
    match health.status() {
        ServingStatus::Serving => Ok(()),
        other => Err(format!("the agent is {}", other.as_str_name())),
    }
}

/// The agent's socket: each connection relayed, byte for byte, to a TCP address.
#[derive(Debug)]
pub struct Relay {
    socket: PathBuf,
    closed: Arc<AtomicBool>,
    conns: Arc<Mutex<Vec<(u64, UnixStream)>>>,
}

impl Relay {
    /// Listens on `socket` (root only) and relays each connection to `target`.
    pub fn start(socket: &Path, target: SocketAddr) -> io::Result<Self> {
        match std::fs::remove_file(socket) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let listener = UnixListener::bind(socket)?;
        std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))?;
        let relay = Self {
            socket: socket.to_path_buf(),
            closed: Arc::new(AtomicBool::new(false)),
            conns: Arc::new(Mutex::new(Vec::new())),
        };
        let (closed, conns) = (Arc::clone(&relay.closed), Arc::clone(&relay.conns));
        std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                let next = AtomicU64::new(0);
                for stream in listener.incoming() {
                    if closed.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(unix) = stream else { continue };
                    let n = next.fetch_add(1, Ordering::SeqCst);
                    if let Ok(clone) = unix.try_clone() {
                        conns
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push((n, clone));
                    }
                    let conns = Arc::clone(&conns);
                    let _ =
                        std::thread::Builder::new()
                            .name("relay-conn".into())
                            .spawn(move || {
                                relay_one(unix, target);
                                conns
                                    .lock()
                                    .unwrap_or_else(|e| e.into_inner())
                                    .retain(|(i, _)| *i != n);
                            });
                }
            })?;
        Ok(relay)
    }

    /// The socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Stops accepting, removes the socket and ends every relayed connection.
    pub fn close(&self) {
        if self.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Wake the accepting thread so that it sees `closed`.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
        for (_, s) in self
            .conns
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.close();
    }
}

/// Copies both ways between a unix connection and a new TCP connection to `target`, each way
/// ending the other's writing when it ends.
fn relay_one(unix: UnixStream, target: SocketAddr) {
    let Ok(tcp) = TcpStream::connect_timeout(&target, Duration::from_secs(5)) else {
        return;
    };
    let _ = tcp.set_nodelay(true);
    let (Ok(mut unix_r), Ok(mut tcp_w)) = (unix.try_clone(), tcp.try_clone()) else {
        return;
    };
    let up = std::thread::Builder::new()
        .name("relay-up".into())
        .spawn(move || {
            let _ = io::copy(&mut unix_r, &mut tcp_w);
            let _ = tcp_w.shutdown(Shutdown::Write);
        });
    let (mut tcp_r, mut unix_w) = (tcp, unix);
    let _ = io::copy(&mut tcp_r, &mut unix_w);
    let _ = unix_w.shutdown(Shutdown::Both);
    let _ = tcp_r.shutdown(Shutdown::Both);
    if let Ok(up) = up {
        let _ = up.join();
    }
}
