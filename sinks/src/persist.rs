//! The pod's state files, written by a thread of their own. The wrapper keeps its records in
//! memory and decides from memory; these files only let `kata-topo status` show them and a
//! restarted daemon find them again.
//!
//! Writes are coalesced by key: only the latest version of each file waits, so the backlog
//! never holds more than one entry per file however slow the disk. A write that fails (a full
//! disk) is counted against the `state` sink and reported to the caller's log, and changes
//! nothing else. After [`Persist::close`] (the pod is gone) nothing more is written.

use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::queue::{wait_until, Drops, Sink};

type Job = Box<dyn FnOnce() -> std::io::Result<()> + Send>;
/// Hears of a failed write: the key and the error.
type OnError = dyn Fn(&str, &std::io::Error) + Send + Sync;

#[derive(Default)]
struct Pending {
    jobs: BTreeMap<String, Job>,
    /// A final job (the pod's removal) that runs after every pending one was dropped.
    last: Option<Job>,
    closed: bool,
    busy: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
}

/// A coalescing writer for state files.
#[derive(Clone)]
pub struct Persist {
    shared: Option<Arc<Shared>>,
    drops: Arc<Drops>,
    on_error: Arc<OnError>,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist").finish_non_exhaustive()
    }
}

impl Persist {
    /// Starts the writer; `on_error(key, error)` hears of every failed write (on the writer's
    /// thread).
    pub fn start(
        drops: Arc<Drops>,
        on_error: impl Fn(&str, &std::io::Error) + Send + Sync + 'static,
    ) -> Self {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        let on_error: Arc<OnError> = Arc::new(on_error);
        let worker = (shared.clone(), drops.clone(), on_error.clone());
        let spawned = std::thread::Builder::new()
            .name("state".into())
            .spawn(move || run(&worker.0, &worker.1, &*worker.2));
        Self {
            shared: spawned.ok().map(|_| shared),
            drops,
            on_error,
        }
    }

    /// Queues `job` as the latest version of `key`, replacing one still waiting.
    pub fn put(
        &self,
        key: impl Into<String>,
        job: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) {
        let Some(shared) = &self.shared else {
            self.drops.add(Sink::State, 1);
            return;
        };
        let mut p = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.closed {
            return;
        }
        p.jobs.insert(key.into(), Box::new(job));
        shared.wake.notify_one();
    }

    /// Drops every waiting write, runs `last` (the removal of the pod's state), and writes
    /// nothing after it. Closing again does nothing: the first `last` is the last.
    pub fn close(&self, last: impl FnOnce() -> std::io::Result<()> + Send + 'static) {
        let Some(shared) = &self.shared else {
            if let Err(e) = last() {
                (self.on_error)("all", &e);
            }
            return;
        };
        let mut p = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
        if p.closed {
            return;
        }
        p.jobs.clear();
        p.closed = true;
        p.last = Some(Box::new(last));
        shared.wake.notify_one();
    }

    /// Waits until nothing is waiting to be written, or `deadline` passed.
    pub fn flush(&self, deadline: Instant) -> bool {
        let Some(shared) = &self.shared else {
            return true;
        };
        wait_until(&shared.pending, &shared.wake, deadline, |p| {
            p.jobs.is_empty() && p.last.is_none() && !p.busy
        })
    }
}

fn run(shared: &Shared, drops: &Drops, on_error: &OnError) {
    loop {
        let (key, job, last) = {
            let mut p = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.busy = false;
            shared.wake.notify_all();
            while p.jobs.is_empty() && p.last.is_none() {
                p = shared.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            p.busy = true;
            match p.jobs.pop_first() {
                Some((k, j)) => (k, j, false),
                None => (
                    "all".to_string(),
                    p.last.take().unwrap_or_else(|| Box::new(|| Ok(()))),
                    true,
                ),
            }
        };
        if let Err(e) = job() {
            drops.add(Sink::State, 1);
            on_error(&key, &e);
        }
        if last {
            let mut p = shared.pending.lock().unwrap_or_else(|e| e.into_inner());
            p.busy = false;
            shared.wake.notify_all();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_slow_disk_coalesces_and_a_failure_is_counted() {
        let drops = Drops::new();
        let errors = Arc::new(Mutex::new(Vec::new()));
        let seen = errors.clone();
        let p = Persist::start(drops.clone(), move |k, e| {
            seen.lock().expect("lock").push(format!("{k}: {e}"));
        });
        let (release_tx, release_rx) = channel::<()>();
        // The first write blocks the writer until released.
        p.put("block", move || {
            let _ = release_rx.recv();
            Ok(())
        });
        std::thread::sleep(Duration::from_millis(50));
        let written = Arc::new(AtomicUsize::new(0));
        let last = Arc::new(Mutex::new(0));
        for i in 0..1000 {
            let (w, l) = (written.clone(), last.clone());
            p.put("task/c1", move || {
                w.fetch_add(1, Ordering::SeqCst);
                *l.lock().expect("lock") = i;
                Ok(())
            });
        }
        p.put("task/c2", || {
            Err(std::io::Error::other("no space left on device"))
        });
        release_tx.send(()).expect("release");
        assert!(p.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(
            written.load(Ordering::SeqCst),
            1,
            "one write for 1000 versions"
        );
        assert_eq!(*last.lock().expect("lock"), 999, "the latest version");
        assert_eq!(drops.get(Sink::State), 1);
        assert_eq!(
            errors.lock().expect("lock").as_slice(),
            ["task/c2: no space left on device"]
        );
    }

    #[test]
    fn nothing_is_written_after_close() {
        let p = Persist::start(Drops::new(), |_, _| {});
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        p.close(move || {
            c.fetch_add(100, Ordering::SeqCst);
            Ok(())
        });
        let c = count.clone();
        p.put("late", move || {
            c.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
        assert!(p.flush(Instant::now() + Duration::from_secs(10)));
        assert_eq!(count.load(Ordering::SeqCst), 100);
        // A pod removed twice (its sandbox deleted, then its delegate gone): the second close
        // runs nothing and leaves nothing to wait for.
        let c = count.clone();
        p.close(move || {
            c.fetch_add(1000, Ordering::SeqCst);
            Ok(())
        });
        let waited = Instant::now();
        assert!(p.flush(Instant::now() + Duration::from_secs(5)));
        assert!(waited.elapsed() < Duration::from_secs(5));
        assert_eq!(count.load(Ordering::SeqCst), 100);
    }
}
