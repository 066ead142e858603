//! Delayed looks at the VM: after the delegate applied a create or an update, Kata re-pins
//! the vCPUs and rewrites the sandbox cgroup; the VM view is read once that settled. One
//! timer thread serves every task of the pod, with at most one look pending per task, so the
//! daemon's threads stay the same however fast updates come.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

/// How long after the delegate applied a request the VM is looked at again.
pub(crate) const DELAY: Duration = Duration::from_millis(500);

#[derive(Debug, Default)]
struct Due {
    /// task id → (when, the VMM's pid)
    tasks: HashMap<String, (Instant, u32)>,
}

/// The timer.
#[derive(Debug)]
pub(crate) struct Observer {
    due: Mutex<Due>,
    wake: Condvar,
}

impl Observer {
    /// Starts the timer thread; `look(task_id, pid)` runs on it when a look is due, for as
    /// long as `owner` lives.
    pub(crate) fn start<T: Send + Sync + 'static>(
        owner: Weak<T>,
        timer: impl Fn(&T) -> &Observer + Send + 'static,
        look: impl Fn(&T, &str, u32) + Send + 'static,
    ) {
        let _ = std::thread::Builder::new()
            .name("observe".into())
            .spawn(move || loop {
                let Some(strong) = owner.upgrade() else {
                    return;
                };
                let o = timer(&strong);
                let next = {
                    let mut due = o.due.lock().unwrap_or_else(|e| e.into_inner());
                    let now = Instant::now();
                    let ready = due
                        .tasks
                        .iter()
                        .filter(|(_, (at, _))| *at <= now)
                        .map(|(t, (_, pid))| (t.clone(), *pid))
                        .next();
                    match ready {
                        Some((task, pid)) => {
                            due.tasks.remove(&task);
                            Some((task, pid))
                        }
                        None => {
                            let wait = due
                                .tasks
                                .values()
                                .map(|(at, _)| at.saturating_duration_since(now))
                                .min()
                                .unwrap_or(Duration::from_secs(1));
                            let _ = o.wake.wait_timeout(due, wait);
                            None
                        }
                    }
                };
                if let Some((task, pid)) = next {
                    look(&strong, &task, pid);
                }
            });
    }

    pub(crate) fn new() -> Self {
        Self {
            due: Mutex::new(Due::default()),
            wake: Condvar::new(),
        }
    }

    /// Looks at task `task_id`'s VMM `pid` after [`DELAY`]. A look already pending for the
    /// task keeps its time (it sees the latest state anyway), so a stream of updates cannot
    /// put it off forever.
    pub(crate) fn schedule(&self, task_id: &str, pid: u32) {
        let mut due = self.due.lock().unwrap_or_else(|e| e.into_inner());
        due.tasks
            .entry(task_id.to_string())
            .and_modify(|(_, p)| *p = pid)
            .or_insert((Instant::now() + DELAY, pid));
        self.wake.notify_one();
    }

    /// Forgets a task's pending look.
    pub(crate) fn cancel(&self, task_id: &str) {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .remove(task_id);
    }

    /// How many looks are pending.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.due
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .tasks
            .len()
    }
}
