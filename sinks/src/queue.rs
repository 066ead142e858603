//! Bounded hand-off from a caller to a writer thread, and the count of what was dropped.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The sinks that can drop what they are given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    /// JSON lines to the log file.
    Log,
    /// The same lines to journald.
    Journald,
    /// containerd events.
    Events,
    /// State files (a write that failed).
    State,
    /// Kubernetes Events on the pod, written to the API server.
    KubeEvents,
}

/// How many sinks there are.
pub const SINKS: usize = 5;

impl Sink {
    /// Every sink, in the order metrics list them.
    pub const ALL: [Sink; SINKS] = [
        Sink::Log,
        Sink::Journald,
        Sink::Events,
        Sink::State,
        Sink::KubeEvents,
    ];

    /// The `sink` label.
    pub fn name(self) -> &'static str {
        match self {
            Sink::Log => "log",
            Sink::Journald => "journald",
            Sink::Events => "events",
            Sink::State => "state",
            Sink::KubeEvents => "kube-events",
        }
    }
}

/// What each sink dropped, shared by the sinks and the metrics that report it.
#[derive(Debug, Default)]
pub struct Drops([AtomicU64; SINKS]);

impl Drops {
    /// A new set of counters.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    fn slot(&self, sink: Sink) -> &AtomicU64 {
        &self.0[Sink::ALL.iter().position(|s| *s == sink).unwrap_or(0)]
    }

    /// Counts `n` items dropped by `sink`.
    pub fn add(&self, sink: Sink, n: u64) {
        self.slot(sink).fetch_add(n, Ordering::Relaxed);
    }

    /// How many `sink` dropped so far.
    pub fn get(&self, sink: Sink) -> u64 {
        self.slot(sink).load(Ordering::Relaxed)
    }

    /// Every counter.
    pub fn snapshot(&self) -> [u64; SINKS] {
        Sink::ALL.map(|s| self.get(s))
    }
}

/// Waits on `wake` until `done` holds for what `lock` guards, or `deadline` passed; returns
/// whether it held. The one wait of the writers whose callers wait for them (a flush, a
/// removal): a writer stuck on a hung filesystem is never waited for past the deadline.
pub(crate) fn wait_until<T>(
    lock: &Mutex<T>,
    wake: &Condvar,
    deadline: Instant,
    mut done: impl FnMut(&T) -> bool,
) -> bool {
    let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    while !done(&guard) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        guard = wake
            .wait_timeout(guard, left)
            .map(|(g, _)| g)
            .unwrap_or_else(|e| e.into_inner().0);
    }
    true
}

enum Item<T> {
    Work(T),
    Flush(SyncSender<()>),
}

/// A bounded queue drained by one writer thread. [`Lane::push`] never blocks: when the queue
/// is full, the item is dropped and counted against the lane's sink.
#[derive(Debug)]
pub struct Lane<T: Send + 'static> {
    tx: Option<SyncSender<Item<T>>>,
    sink: Sink,
    drops: Arc<Drops>,
}

impl<T: Send + 'static> Lane<T> {
    /// Starts the writer thread `name`, which calls `work` for each item in order.
    pub fn start(
        name: &str,
        capacity: usize,
        sink: Sink,
        drops: Arc<Drops>,
        mut work: impl FnMut(T) + Send + 'static,
    ) -> Self {
        Self::start_timed(name, capacity, sink, drops, move |item| {
            if let Some(t) = item {
                work(t);
            }
            None
        })
    }

    /// Starts the writer thread `name` of a sink with work of its own to do later (a repeat
    /// written once its interval passed): `work` gets each item in order, and `None` when the
    /// time it asked for passed, after a flush, or both; it answers how long until it wants
    /// to be called again (`None`: only for the next item).
    pub fn start_timed(
        name: &str,
        capacity: usize,
        sink: Sink,
        drops: Arc<Drops>,
        mut work: impl FnMut(Option<T>) -> Option<Duration> + Send + 'static,
    ) -> Self {
        let (tx, rx): (SyncSender<Item<T>>, Receiver<Item<T>>) = sync_channel(capacity);
        let spawned = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                let mut wait: Option<Duration> = None;
                loop {
                    let item = match wait {
                        None => match rx.recv() {
                            Ok(item) => Some(item),
                            Err(_) => return,
                        },
                        Some(d) => match rx.recv_timeout(d) {
                            Ok(item) => Some(item),
                            Err(RecvTimeoutError::Timeout) => None,
                            Err(RecvTimeoutError::Disconnected) => return,
                        },
                    };
                    wait = match item {
                        Some(Item::Work(t)) => work(Some(t)),
                        Some(Item::Flush(done)) => {
                            let _ = done.try_send(());
                            work(None)
                        }
                        None => work(None),
                    };
                }
            });
        Self {
            tx: spawned.ok().map(|_| tx),
            sink,
            drops,
        }
    }

    /// Hands an item to the writer; drops and counts it when the queue is full. Returns
    /// whether it was queued.
    pub fn push(&self, item: T) -> bool {
        let queued = match &self.tx {
            Some(tx) => match tx.try_send(Item::Work(item)) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => false,
            },
            None => false,
        };
        if !queued {
            self.drops.add(self.sink, 1);
        }
        queued
    }

    /// Waits until everything queued before this call was written, or `deadline` passed
    /// (a writer that is stuck is not waited for). Returns whether it was.
    pub fn flush(&self, deadline: Instant) -> bool {
        let Some(tx) = &self.tx else {
            return false;
        };
        let (done_tx, done_rx) = sync_channel(1);
        // The marker queues like any item; a full queue is waited on only until the deadline.
        let mut marker = Item::Flush(done_tx);
        loop {
            match tx.try_send(marker) {
                Ok(()) => break,
                Err(TrySendError::Full(m)) if Instant::now() < deadline => {
                    marker = m;
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => return false,
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        !matches!(
            done_rx.recv_timeout(left),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    #[test]
    fn a_stuck_writer_makes_pushes_drop_not_wait() {
        let drops = Drops::new();
        let (release_tx, release_rx) = channel::<()>();
        let (seen_tx, seen_rx) = channel::<u32>();
        let lane = Lane::start("test", 4, Sink::Log, drops.clone(), move |n: u32| {
            // The first item blocks the writer until released.
            if n == 0 {
                let _ = release_rx.recv();
            }
            let _ = seen_tx.send(n);
        });
        let queued = (0..100).filter(|n| lane.push(*n)).count();
        // One item in the writer's hands, four in the queue; the rest dropped at once.
        assert!((4..=5).contains(&queued), "{queued}");
        assert_eq!(drops.get(Sink::Log), 100 - queued as u64);
        assert!(
            !lane.flush(Instant::now() + Duration::from_millis(50)),
            "a stuck writer is not waited for"
        );
        release_tx.send(()).expect("release");
        assert!(lane.flush(Instant::now() + Duration::from_secs(10)));
        let seen: Vec<u32> = seen_rx.try_iter().collect();
        assert_eq!(
            seen.len(),
            queued,
            "everything queued was written, in order"
        );
        assert!(seen.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(drops.get(Sink::Events), 0);
    }
}
