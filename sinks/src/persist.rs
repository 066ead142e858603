//! The pod's state files, written by a thread of their own. The wrapper keeps its records in
//! memory and decides from memory; these files only let `kata-topo status` show them and a
//! restarted daemon find them again.
//!
//! Writes are coalesced by key: only the latest version of each file waits, so the backlog
//! never holds more than one entry per file however slow the disk. A write that fails (a full
//! disk) is counted against the `state` sink and reported to the caller's log, and changes
//! nothing else. After [`Persist::close`] (the pod is gone) nothing more is written.
//!
//! One writer thread can serve many pods ([`Persist::another`]: the NRI plugin's, one thread
//! for the node): each pod's writes are coalesced by its own keys and taken in turn with the
//! other pods', so a pod that writes often never holds another's back.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use crate::queue::{wait_until, Drops, Sink};

type Job = Box<dyn FnOnce() -> std::io::Result<()> + Send>;
/// Hears of a failed write: the key and the error.
type OnError = dyn Fn(&str, &std::io::Error) + Send + Sync;

/// A write waiting, with who hears of its failure.
type Entry = (Job, Arc<OnError>);

#[derive(Default)]
struct Pending {
    /// (handle, key) → the latest version of that file.
    jobs: BTreeMap<(u64, String), Entry>,
    /// Each closed handle's final job (its pod's removal), run after its pending ones were
    /// dropped.
    last: BTreeMap<u64, Entry>,
    /// Handles closed and not yet dropped: nothing more is written for them.
    closed: HashSet<u64>,
    /// Handles neither closed nor dropped: the writer runs while there is one, or work.
    open: usize,
    /// The next handle's id.
    next: u64,
    /// The handle whose job runs now.
    busy: Option<u64>,
    /// The handle whose job ran last: the next one is another's, when another waits.
    previous: u64,
    /// Whether the writer thread runs.
    running: bool,
}

impl Pending {
    /// The next job: the next handle's after the one that ran last (so that no pod's writes
    /// hold back another's), and a closed handle's final job once its other jobs are gone.
    fn take(&mut self) -> Option<(u64, String, Entry)> {
        let after = (self.previous.saturating_add(1), String::new());
        let key = self
            .jobs
            .range(after..)
            .next()
            .or_else(|| self.jobs.iter().next())
            .map(|(k, _)| k.clone());
        if let Some(k) = key {
            let entry = self.jobs.remove(&k)?;
            return Some((k.0, k.1, entry));
        }
        self.last
            .pop_first()
            .map(|(id, entry)| (id, "all".to_string(), entry))
    }

    fn has_work_of(&self, id: u64) -> bool {
        self.jobs
            .range((id, String::new())..)
            .next()
            .is_some_and(|((i, _), _)| *i == id)
            || self.last.contains_key(&id)
            || self.busy == Some(id)
    }
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    drops: Arc<Drops>,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One writer's user: its own files, closed on its own.
struct Handle {
    shared: Arc<Shared>,
    id: u64,
}

impl Drop for Handle {
    fn drop(&mut self) {
        let mut p = self.shared.lock();
        if !p.closed.remove(&self.id) {
            p.open = p.open.saturating_sub(1);
        }
        self.shared.wake.notify_all();
    }
}

/// A coalescing writer for state files. One thread writes for every [`Persist`] made from
/// the first with [`Persist::another`] (a front end's pods), each with its own keys, its
/// own [`Persist::close`] and [`Persist::flush`].
#[derive(Clone)]
pub struct Persist {
    handle: Option<Arc<Handle>>,
    drops: Arc<Drops>,
    on_error: Arc<OnError>,
}

impl std::fmt::Debug for Persist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Persist").finish_non_exhaustive()
    }
}

/// Starts the writer thread of `shared` (its `running` set under the lock by the caller).
fn spawn(shared: &Arc<Shared>) -> bool {
    let worker = Arc::clone(shared);
    std::thread::Builder::new()
        .name("state".into())
        .spawn(move || run(&worker))
        .is_ok()
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
            drops: drops.clone(),
        });
        let on_error: Arc<OnError> = Arc::new(on_error);
        let handle = Self::handle_on(&shared);
        Self {
            handle,
            drops,
            on_error,
        }
    }

    /// Another user of the same writer thread, with its own keys; `on_error` hears of its
    /// failed writes. Without a writer (it could not be started), one that counts every
    /// write as dropped, as this one does.
    pub fn another(
        &self,
        on_error: impl Fn(&str, &std::io::Error) + Send + Sync + 'static,
    ) -> Self {
        Self {
            handle: self
                .handle
                .as_ref()
                .and_then(|h| Self::handle_on(&h.shared)),
            drops: self.drops.clone(),
            on_error: Arc::new(on_error),
        }
    }

    /// A new handle on `shared`, its writer started when it is not running.
    fn handle_on(shared: &Arc<Shared>) -> Option<Arc<Handle>> {
        let mut p = shared.lock();
        if !p.running {
            if !spawn(shared) {
                return None;
            }
            p.running = true;
        }
        let id = p.next;
        p.next += 1;
        p.open += 1;
        Some(Arc::new(Handle {
            shared: Arc::clone(shared),
            id,
        }))
    }

    /// Queues `job` as the latest version of `key`, replacing one still waiting.
    pub fn put(
        &self,
        key: impl Into<String>,
        job: impl FnOnce() -> std::io::Result<()> + Send + 'static,
    ) {
        let Some(h) = &self.handle else {
            self.drops.add(Sink::State, 1);
            return;
        };
        let mut p = h.shared.lock();
        if p.closed.contains(&h.id) {
            return;
        }
        p.jobs
            .insert((h.id, key.into()), (Box::new(job), self.on_error.clone()));
        h.shared.wake.notify_all();
    }

    /// Drops every waiting write, runs `last` (the removal of the pod's state), and writes
    /// nothing after it. Closing again does nothing: the first `last` is the last.
    pub fn close(&self, last: impl FnOnce() -> std::io::Result<()> + Send + 'static) {
        let Some(h) = &self.handle else {
            if let Err(e) = last() {
                (self.on_error)("all", &e);
            }
            return;
        };
        let mut p = h.shared.lock();
        if !p.closed.insert(h.id) {
            return;
        }
        p.open = p.open.saturating_sub(1);
        p.jobs.retain(|(id, _), _| *id != h.id);
        p.last.insert(h.id, (Box::new(last), self.on_error.clone()));
        h.shared.wake.notify_all();
    }

    /// Waits until nothing of this user's is waiting to be written, or `deadline` passed.
    pub fn flush(&self, deadline: Instant) -> bool {
        let Some(h) = &self.handle else {
            return true;
        };
        wait_until(&h.shared.pending, &h.shared.wake, deadline, |p| {
            !p.has_work_of(h.id)
        })
    }
}

/// The writer: runs the jobs as they come; ends once every handle is closed or dropped and
/// nothing waits (a later [`Persist::another`] starts it again).
fn run(shared: &Shared) {
    loop {
        let (_, key, (job, on_error)) = {
            let mut p = shared.lock();
            p.busy = None;
            shared.wake.notify_all();
            loop {
                if let Some(next) = p.take() {
                    p.busy = Some(next.0);
                    p.previous = next.0;
                    break next;
                }
                if p.open == 0 {
                    p.running = false;
                    shared.wake.notify_all();
                    return;
                }
                p = shared.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
        };
        if let Err(e) = job() {
            shared.drops.add(Sink::State, 1);
            on_error(&key, &e);
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

    /// Many users of one writer (the NRI plugin's pods): each one's keys, failures, close and
    /// flush are its own; the writer ends once none is open and starts again for a new one.
    #[test]
    fn users_of_one_writer_are_apart_and_the_writer_ends_with_the_last() {
        let written = Arc::new(Mutex::new(Vec::new()));
        let wrote = |w: &Arc<Mutex<Vec<String>>>, what: &str| {
            let (w, what) = (w.clone(), what.to_string());
            move || {
                w.lock().expect("lock").push(what);
                Ok(())
            }
        };
        let errors = Arc::new(Mutex::new(Vec::new()));
        let drops = Drops::new();
        let a = Persist::start(drops.clone(), |_, _| {});
        let seen = errors.clone();
        let b = a.another(move |k, e| seen.lock().expect("lock").push(format!("b {k}: {e}")));
        a.put("task/c1", wrote(&written, "a"));
        b.put("task/c1", wrote(&written, "b"));
        b.put("task/c2", || {
            Err(std::io::Error::other("no space left on device"))
        });
        assert!(a.flush(Instant::now() + Duration::from_secs(10)));
        assert!(b.flush(Instant::now() + Duration::from_secs(10)));
        let mut got = written.lock().expect("lock").clone();
        got.sort();
        assert_eq!(got, ["a", "b"], "the same key of two users is two files");
        assert_eq!(
            errors.lock().expect("lock").as_slice(),
            ["b task/c2: no space left on device"]
        );
        assert_eq!(drops.get(Sink::State), 1);

        // One closes: its later writes are dropped, the other's still go.
        a.close(wrote(&written, "a removed"));
        a.put("late", wrote(&written, "a late"));
        b.put("task/c1", wrote(&written, "b again"));
        assert!(b.flush(Instant::now() + Duration::from_secs(10)));
        assert!(a.flush(Instant::now() + Duration::from_secs(10)));
        let got = written.lock().expect("lock").clone();
        assert!(got.contains(&"a removed".to_string()), "{got:?}");
        assert!(got.contains(&"b again".to_string()), "{got:?}");
        assert!(!got.contains(&"a late".to_string()), "{got:?}");

        // The last open one closes: the writer ends.
        let shared = Arc::clone(&a.handle.as_ref().expect("a writer").shared);
        b.close(|| Ok(()));
        assert!(wait_until(
            &shared.pending,
            &shared.wake,
            Instant::now() + Duration::from_secs(10),
            |p| !p.running
        ));
        // A new user starts it again.
        let c = a.another(|_, _| {});
        c.put("task/c9", wrote(&written, "c"));
        assert!(c.flush(Instant::now() + Duration::from_secs(10)));
        assert!(written.lock().expect("lock").contains(&"c".to_string()));
        drop(c);
        assert!(wait_until(
            &shared.pending,
            &shared.wake,
            Instant::now() + Duration::from_secs(10),
            |p| !p.running && p.open == 0
        ));
    }
}
