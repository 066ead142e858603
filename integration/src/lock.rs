//! One private containerd on the machine at a time.

use std::path::Path;

/// Shim sockets live in one machine-wide directory (`/run/containerd/s`) and the leak checks
/// look at every process and socket there: two private containerds at once (two test
/// processes, a benchmark beside a test run) would see each other's. Each takes this lock
/// for its whole life, so they run one after another whoever started them.
#[derive(Debug)]
pub struct MachineLock(std::fs::File);

impl MachineLock {
    const PATH: &'static str = "/run/lock/kata-topo-integration.lock";

    /// Takes the lock, waiting for another holder to let it go.
    pub fn take() -> Self {
        let dir = Path::new(Self::PATH).parent().expect("lock dir");
        std::fs::create_dir_all(dir).expect("lock dir");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(Self::PATH)
            .expect("open the integration lock");
        file.lock().expect("take the integration lock");
        Self(file)
    }
}

impl Drop for MachineLock {
    fn drop(&mut self) {
        let _ = self.0.unlock();
    }
}
