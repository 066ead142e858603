//! Readers of containerd's events: `ctr events` and `kata-topo events`, in the background.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{bin_dir, Containerd, ContainerdBin};

impl Containerd {
    /// Starts `ctr events` in the background, writing to a file.
    pub fn events(&self) -> EventsWatcher {
        let mut ctr = Command::new(ContainerdBin::get().ctr());
        ctr.arg("-a").arg(&self.socket).arg("events");
        EventsWatcher::start(
            ctr,
            self.dir
                .path()
                .join(format!("events-{}.txt", std::process::id())),
        )
    }

    /// Starts `kata-topo events` (the CLI) in the background, writing to a file.
    pub fn kata_topo_events(&self, namespace: &str) -> EventsWatcher {
        let mut cli = Command::new(bin_dir().join("kata-topo"));
        cli.arg("events")
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace]);
        let name = format!("kata-topo-events-{namespace}-{}.txt", std::process::id());
        EventsWatcher::start(cli, self.dir.path().join(name))
    }

    /// The reader of kata-topo's events an operator uses on this containerd: `ctr events` on
    /// 1.x, `kata-topo events` on 2.x (whose `ctr events` cannot print a
    /// `google.protobuf.StringValue` payload).
    pub fn operator_events(&self) -> EventsWatcher {
        if ContainerdBin::get().is_v2() {
            self.kata_topo_events("k8s.io")
        } else {
            self.events()
        }
    }
}

/// A running `ctr events`.
#[derive(Debug)]
pub struct EventsWatcher {
    child: Child,
    path: PathBuf,
}

impl EventsWatcher {
    /// Runs `reader` with its standard output in `path` and its standard error beside it
    /// (`.err`), and gives it a moment to subscribe.
    fn start(mut reader: Command, path: PathBuf) -> Self {
        let file = std::fs::File::create(&path).expect("events file");
        let errors = std::fs::File::create(path.with_extension("err")).expect("events file");
        let child = reader
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(errors)
            .spawn()
            .unwrap_or_else(|e| panic!("{:?}: {e}", reader.get_program()));
        std::thread::sleep(Duration::from_millis(300));
        Self { child, path }
    }

    /// The lines printed so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// What the reader printed on stderr so far.
    pub fn errors(&self) -> String {
        std::fs::read_to_string(self.path.with_extension("err")).unwrap_or_default()
    }

    /// Waits for a line containing `needle`.
    pub fn wait_for(&self, needle: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(l) = self.lines().into_iter().find(|l| l.contains(needle)) {
                return Some(l);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        None
    }
}

impl Drop for EventsWatcher {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
