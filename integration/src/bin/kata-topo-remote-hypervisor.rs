//! `kata-topo-remote-hypervisor`: the remote hypervisor service of `make kata-test`, which Kata's
//! shim (`[hypervisor.remote] remote_hypervisor_socket`) asks to create, start and stop the
//! pod's VM (see `kata_topo_integration::remote_hypervisor`).
//!
//! ```text
//! kata-topo-remote-hypervisor --socket PATH --machine FILE --state-dir DIR
//!     [--qemu PATH] [--shared-root DIR] [--boot-timeout SECONDS] [--stop-timeout SECONDS]
//! ```
//! `--machine FILE`: QEMU's arguments for the machine, NUL-separated (what
//! `integration/vm-test/run.sh` builds). One JSON line per event on stderr. SIGTERM or SIGINT
//! powers every VM off (or kills it) and removes the socket; exit 0. Exit 2 on bad usage.
//!
//! ```text
//! kata-topo-remote-hypervisor stop-vm --socket PATH --id SANDBOX
//! ```
//! asks a running service for `StopVM`, as Kata's shim would: what an operator does for a VM
//! whose shim is gone (Kata's `delete` cannot restore a remote sandbox, so it never asks).
//! Exit 0 when the service answered OK, 1 with its status otherwise.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use kata_topo_integration::remote_hypervisor::kata::hypervisor::StopVmRequest;
use kata_topo_integration::remote_hypervisor::{listen, log, Config, Service, SERVICE};
use kata_topo_proto::prost::Message;
use kata_topo_proto::wire::Client;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

fn usage(why: &str) -> ExitCode {
    eprintln!("kata-topo-remote-hypervisor: {why} (see the comment at the top of kata-topo-remote-hypervisor.rs)");
    ExitCode::from(2)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn seconds(args: &[String], name: &str, default: u64) -> Result<Duration, String> {
    match flag(args, name) {
        None => Ok(Duration::from_secs(default)),
        Some(v) => v
            .parse::<u64>()
            .ok()
            .filter(|s| *s > 0)
            .map(Duration::from_secs)
            .ok_or_else(|| format!("{name} {v:?} is not a number of seconds")),
    }
}

/// `stop-vm`: one StopVM call, answered within 90 s.
fn stop_vm(args: &[String]) -> ExitCode {
    let (Some(socket), Some(id)) = (flag(args, "--socket"), flag(args, "--id")) else {
        return usage("stop-vm --socket PATH --id SANDBOX");
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    let answer = Client::connect(&socket, deadline).and_then(|mut c| {
        c.call(
            SERVICE,
            "StopVM",
            StopVmRequest { id }.encode_to_vec(),
            "",
            deadline,
        )
    });
    match answer {
        Ok(r) if r.code() == 0 => {
            println!("stopped");
            ExitCode::SUCCESS
        }
        Ok(r) => {
            let message = r.status.map(|s| s.message).unwrap_or_default();
            eprintln!("kata-topo-remote-hypervisor: StopVM: {message}");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("kata-topo-remote-hypervisor: StopVM on {socket}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().is_some_and(|a| a == "stop-vm") {
        return stop_vm(&args[1..]);
    }
    if args.iter().any(|a| a == "-v" || a == "--version") {
        println!("kata-topo-remote-hypervisor {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    let (Some(socket), Some(machine), Some(state_dir)) = (
        flag(&args, "--socket"),
        flag(&args, "--machine"),
        flag(&args, "--state-dir"),
    ) else {
        return usage("--socket, --machine and --state-dir are required");
    };
    let machine: Vec<OsString> = match std::fs::read(&machine) {
        Ok(bytes) => bytes
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| std::ffi::OsStr::from_bytes(a).to_os_string())
            .collect(),
        Err(e) => return usage(&format!("--machine {machine}: {e}")),
    };
    if machine.is_empty() {
        return usage("--machine names an empty file");
    }
    let (boot_timeout, stop_timeout) = match (
        seconds(&args, "--boot-timeout", 300),
        seconds(&args, "--stop-timeout", 60),
    ) {
        (Ok(b), Ok(s)) => (b, s),
        (Err(e), _) | (_, Err(e)) => return usage(&e),
    };
    let config = Config {
        machine,
        qemu: PathBuf::from(flag(&args, "--qemu").unwrap_or_else(|| "qemu-system-x86_64".into())),
        state_dir: PathBuf::from(state_dir),
        shared_root: PathBuf::from(
            flag(&args, "--shared-root").unwrap_or_else(|| Config::KATA_SHARED_ROOT.into()),
        ),
        boot_timeout,
        stop_timeout,
    };
    let mut signals = match Signals::new([SIGTERM, SIGINT]) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("kata-topo-remote-hypervisor: signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let socket = PathBuf::from(socket);
    let listener = match listen(&socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!(
                "kata-topo-remote-hypervisor: listening on {}: {e}",
                socket.display()
            );
            return ExitCode::FAILURE;
        }
    };
    let service = Arc::new(Service::new(config));
    log(
        "service-started",
        "",
        serde_json::json!({"socket": socket, "pid": std::process::id()}),
    );
    let serving = Arc::clone(&service);
    let _ = std::thread::Builder::new()
        .name("accept".into())
        .spawn(move || serving.serve(listener));
    let signal = signals.forever().next();
    let _ = std::fs::remove_file(&socket);
    service.stop_all();
    log("service-stopped", "", serde_json::json!({"signal": signal}));
    ExitCode::SUCCESS
}
