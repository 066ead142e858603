//! Rolling back a `start` that failed after the delegate started: neither the delegate nor a
//! daemon started for it is left behind.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use prost::Message;

use crate::delegate::Delegate;
use crate::state::GroupState;
use kata_topo_core::process::ProcessId;
use kata_topo_proto::wire::{Client, Code, ShutdownRequest, TASK_V2, TASK_V3};

/// What a failed `start` rolls back once the delegate started.
pub(super) struct Rollback {
    /// The delegate, once its reply was understood.
    pub(super) delegate: Option<Delegate>,
    /// Where a shim listens by convention, when its reply was not understood.
    pub(super) fallback_delegate: String,
    pub(super) namespace: String,
    pub(super) id: String,
    /// The daemon this start spawned: its socket, its pid, the pod's state.
    pub(super) started: Option<(PathBuf, u32, GroupState)>,
}

impl Rollback {
    /// Asks the delegate to shut down (it refuses while it still runs other containers of
    /// the pod), then makes sure the daemon this start spawned is gone with its socket and
    /// the pod's state.
    pub(super) fn run(self) {
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
