//! `delete`: containerd's cleanup after a shim connection dropped. If the wrapper daemon died
//! while the delegate lives, the delegate would leak: clean it up through its own RPCs (Kill,
//! Delete, Shutdown) and answer with its `DeleteResponse`. Otherwise hand `delete` to the
//! delegate.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use prost::Message;

use crate::args::Args;
use crate::config::{Config, ENV_CONFIG};
use crate::daemon::{remove_dead_socket, Delegate};
use crate::start::BundleInfo;
use crate::state::GroupState;
use crate::ttrpc::{socket_path, Client, DeleteRequest, KillRequest, ShutdownRequest};

fn alive(address: &str) -> bool {
    UnixStream::connect(socket_path(address)).is_ok()
}

/// Runs `delete`.
pub fn run(args: &Args) -> ExitCode {
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
        config.state_dir = info.state_dir.clone();
        if !alive(&info.address) && alive(&info.delegate_address) {
            let delegate = Delegate::new(info.delegate_address.clone(), info.delegate_version);
            if let Some(response) = cleanup_through_rpcs(&delegate, &args.id, &info.namespace) {
                let _ = std::io::stdout().write_all(&response);
                after_cleanup(&info, &config, &args.id);
                return ExitCode::SUCCESS;
            }
        }
        if !alive(&info.address) {
            after_cleanup(&info, &config, &args.id);
        }
    }
    hand_to_delegate(&config, args)
}

/// Kill, Delete, Shutdown through the delegate's task API; the Delete reply is the answer.
fn cleanup_through_rpcs(delegate: &Delegate, id: &str, namespace: &str) -> Option<Vec<u8>> {
    let timeout = Duration::from_secs(10);
    let mut client = Client::connect(&delegate.address, timeout).ok()?;
    let _ = client.call(
        delegate.service,
        "Kill",
        KillRequest {
            id: id.to_string(),
            exec_id: String::new(),
            signal: 9,
            all: true,
        }
        .encode_to_vec(),
        namespace,
        timeout,
    );
    // Give the delegate a moment to reap the task before deleting it.
    let mut response = None;
    for _ in 0..50 {
        match client.call(
            delegate.service,
            "Delete",
            DeleteRequest {
                id: id.to_string(),
                exec_id: String::new(),
            }
            .encode_to_vec(),
            namespace,
            timeout,
        ) {
            Ok(r) if r.code() == 0 => {
                response = Some(r.payload);
                break;
            }
            Ok(_) | Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    let _ = client.call(
        delegate.service,
        "Shutdown",
        ShutdownRequest {
            id: id.to_string(),
            now: false,
        }
        .encode_to_vec(),
        namespace,
        timeout,
    );
    response
}

/// Once the wrapper is gone: drop its stale socket, and when the delegate has gone too, the
/// delegate's leftover socket and the pod's state.
fn after_cleanup(info: &BundleInfo, config: &Config, id: &str) {
    remove_dead_socket(Path::new(socket_path(&info.address)));
    for _ in 0..20 {
        if !alive(&info.delegate_address) {
            remove_dead_socket(Path::new(socket_path(&info.delegate_address)));
            if let Ok(state) = GroupState::open(&config.state_dir, &info.namespace, &info.group) {
                let _ = state.remove_all();
            }
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    if let Ok(state) = GroupState::open(&config.state_dir, &info.namespace, &info.group) {
        let _ = state.remove_task(id);
    }
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
