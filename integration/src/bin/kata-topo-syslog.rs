//! `kata-topo-syslog`: the node's syslog for `make kata-test`, on a machine that has none.
//! Kata's shim will not load its configuration without one (`handleSystemLog`,
//! `src/runtime/pkg/katautils/config.go`: "Unix syslog delivery error"), and what it logs there
//! (identifier `kata`) is its own log. Receives datagrams on a unix socket and appends each, as
//! one line, to a file.
//!
//! ```text
//! kata-topo-syslog --socket PATH --out FILE
//! ```
//! Go's `log/syslog` dials `/dev/log`, then `/var/run/syslog`, then `/var/run/log`; the test
//! gives it `/run/log` in a mount namespace of its own. SIGTERM or SIGINT removes the socket;
//! exit 0. Exit 2 on bad usage.

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use signal_hook::consts::{SIGINT, SIGTERM};

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (Some(socket), Some(out)) = (flag(&args, "--socket"), flag(&args, "--out")) else {
        eprintln!("kata-topo-syslog: --socket PATH --out FILE");
        return ExitCode::from(2);
    };
    let (socket, out) = (PathBuf::from(socket), PathBuf::from(out));
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [SIGTERM, SIGINT] {
        if let Err(e) = signal_hook::flag::register(signal, Arc::clone(&stop)) {
            eprintln!("kata-topo-syslog: signal handler: {e}");
            return ExitCode::FAILURE;
        }
    }
    let _ = std::fs::remove_file(&socket);
    let listener = match UnixDatagram::bind(&socket) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kata-topo-syslog: {}: {e}", socket.display());
            return ExitCode::FAILURE;
        }
    };
    let mut file = match std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&out)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("kata-topo-syslog: {}: {e}", out.display());
            return ExitCode::FAILURE;
        }
    };
    let _ = listener.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = vec![0u8; 64 << 10];
    while !stop.load(Ordering::Relaxed) {
        if let Ok(n) = listener.recv(&mut buf) {
            let line = buf[..n].strip_suffix(b"\n").unwrap_or(&buf[..n]);
            let _ = file.write_all(line).and_then(|()| file.write_all(b"\n"));
        }
    }
    let _ = std::fs::remove_file(&socket);
    ExitCode::SUCCESS
}
