//! The NRI plugin's process, as the tests run it beside a runtime.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::bin_dir;

/// A `kata-topo-nri` process, killed when dropped.
#[derive(Debug)]
pub struct NriPlugin(Option<Child>);

impl NriPlugin {
    /// `kata-topo-nri --config CONFIG --socket SOCKET`, its stdout and stderr in `out`.
    pub fn start(config: &Path, socket: &Path, out: &Path) -> Self {
        let out = std::fs::File::create(out).expect("the plugin's output file");
        let child = Command::new(bin_dir().join("kata-topo-nri"))
            .arg("--config")
            .arg(config)
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the plugin's output file"))
            .stderr(out)
            .spawn()
            .expect("start kata-topo-nri");
        Self(Some(child))
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    /// Kills it (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl From<Child> for NriPlugin {
    /// A plugin started another way (under `setpriv`, say).
    fn from(child: Child) -> Self {
        Self(Some(child))
    }
}

impl Drop for NriPlugin {
    fn drop(&mut self) {
        self.kill();
    }
}
