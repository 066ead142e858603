//! The delegate: the shim the wrapper forwards to (Kata's, or runc's in tests), where it
//! listens and which task API it speaks. The daemon watches it; each proxy dials it.

use std::os::unix::net::UnixStream;

use kata_topo_proto::wire::{socket_path, TASK_V2, TASK_V3};

/// Where the delegate is and which task API it speaks.
#[derive(Debug, Clone)]
pub(crate) struct Delegate {
    /// Its `unix://` address.
    pub(crate) address: String,
    /// `containerd.task.v2.Task` or `containerd.task.v3.Task`.
    pub(crate) service: &'static str,
}

impl Delegate {
    /// From an address and a task API version.
    pub(crate) fn new(address: String, version: u32) -> Self {
        Self {
            address,
            service: if version >= 3 { TASK_V3 } else { TASK_V2 },
        }
    }

    pub(crate) fn connect(&self) -> std::io::Result<UnixStream> {
        UnixStream::connect(socket_path(&self.address))
    }
}
