//! Bounded waits for work that can block in the kernel: a sysfs attribute of a hung device, a
//! FIFO where a file should be, a `/proc/<pid>` file of a process stuck in a page fault. Such a
//! read cannot be interrupted from user space, so the work runs on a thread of its own and the
//! caller waits for it for a bounded time ([`Gate`]), then goes on without it, saying what the
//! work was doing ([`Progress`]).
//!
//! The wrapper daemon waits at most once for its first topology load ([`Gate::wait_within`]);
//! the OCI hook and the CLI run their steps through [`run_within`].

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Where the work a [`Gate`] guards is.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nobody asked for it yet.
    #[default]
    NotAsked,
    /// Asked for and not finished.
    Running,
    /// Finished, well or not.
    Finished,
    /// A waiter waited its time and the work had not finished: nobody waits again (work that
    /// hangs must not cost every later caller the wait).
    GaveUp,
}

/// A bounded, one-time wait for work under way on another thread.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<State>,
    done: Condvar,
}

impl Gate {
    /// A gate with nothing asked for.
    pub fn new() -> Self {
        Self::default()
    }

    /// Says that the work is under way, so that [`Gate::wait_within`] waits for it.
    pub fn asked(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *state == State::NotAsked {
            *state = State::Running;
        }
    }

    /// Says that the work finished; wakes the waiters.
    pub fn finished(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if *state != State::Finished {
            *state = State::Finished;
            self.done.notify_all();
        }
    }

    /// Waits at most `wait` while the work is under way; returns whether it finished. Once it
    /// finished, when none was asked for, or once one wait ran out, this never waits.
    pub fn wait_within(&self, wait: Duration) -> bool {
        self.wait(wait, true)
    }

    /// Waits at most `wait` while the work is under way, giving up for good when `last`.
    fn wait(&self, wait: Duration, last: bool) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let mut state = if *state == State::Running {
            self.done
                .wait_timeout_while(state, wait, |s| *s == State::Running)
                .unwrap_or_else(|e| e.into_inner())
                .0
        } else {
            state
        };
        if *state == State::Running && last {
            *state = State::GaveUp;
        }
        *state == State::Finished
    }
}

/// What a piece of work is doing now, set by the work and read by whoever gives up on it.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Mutex<String>>);

impl Progress {
    /// A progress that says `step`.
    pub fn new(step: impl Into<String>) -> Self {
        Self(Arc::new(Mutex::new(step.into())))
    }

    /// The work is now doing `step` (`reading the OCI state on stdin`).
    pub fn set(&self, step: impl Into<String>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = step.into();
    }

    /// What the work is doing.
    pub fn current(&self) -> String {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Why [`run_within`] returned without the work's result.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    /// The work had not finished at the deadline.
    #[error("did not finish within {} s: still {waiting_for}", waited.as_secs_f64())]
    TimedOut {
        /// How long it was waited for.
        waited: Duration,
        /// What it was doing then.
        waiting_for: String,
    },
    /// No thread could be started for it.
    #[error("cannot start a thread for {what}")]
    Spawn {
        /// What the work was to do.
        what: String,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
}

/// Runs `work` on a thread of its own and waits for it at most `budget`. On time out the
/// thread is left to finish (or block) on its own and the error says what `progress` said
/// then; a process that exits takes it along.
pub fn run_within<T: Send + 'static>(
    budget: Duration,
    progress: &Progress,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WaitError> {
    run_noting(budget, None, progress, work)
}

/// After how long, and to whom, [`run_noting`] says what the work is doing.
pub type Slow<'a> = (Duration, &'a mut dyn FnMut(&str));

/// [`run_within`], telling `note` what the work is doing when it has not finished after the
/// first wait of `slow` (a CLI says what it is waiting for, then goes on waiting).
pub fn run_noting<T: Send + 'static>(
    budget: Duration,
    slow: Option<Slow<'_>>,
    progress: &Progress,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, WaitError> {
    let shared = Arc::new((Gate::new(), Mutex::new(None)));
    shared.0.asked();
    let theirs = Arc::clone(&shared);
    std::thread::Builder::new()
        .name("kata-topo-step".into())
        .spawn(move || {
            let value = work();
            *theirs.1.lock().unwrap_or_else(|e| e.into_inner()) = Some(value);
            theirs.0.finished();
        })
        .map_err(|source| WaitError::Spawn {
            what: progress.current(),
            source,
        })?;
    let mut left = budget;
    if let Some((after, note)) = slow {
        let first = after.min(budget);
        if !shared.0.wait(first, false) {
            note(&progress.current());
        }
        left = budget.saturating_sub(first);
    }
    shared.0.wait_within(left);
    let value = shared.1.lock().unwrap_or_else(|e| e.into_inner()).take();
    value.ok_or_else(|| WaitError::TimedOut {
        waited: budget,
        waiting_for: progress.current(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn a_gate_waits_only_while_work_is_under_way_and_only_once() {
        let idle = Gate::new();
        let start = Instant::now();
        assert!(!idle.wait_within(Duration::from_secs(3600)));
        assert!(start.elapsed() < Duration::from_secs(60));

        let stuck = Gate::new();
        stuck.asked();
        assert!(!stuck.wait_within(Duration::from_millis(30)));
        let start = Instant::now();
        assert!(
            !stuck.wait_within(Duration::from_secs(3600)),
            "no second wait"
        );
        assert!(start.elapsed() < Duration::from_secs(60));

        let done = Arc::new(Gate::new());
        done.asked();
        let worker = Arc::clone(&done);
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            worker.finished();
        });
        assert!(done.wait_within(Duration::from_secs(3600)));
        t.join().expect("worker");
    }

    #[test]
    fn run_within_returns_the_result_or_names_the_step_it_gave_up_on() {
        let progress = Progress::new("starting");
        assert_eq!(
            run_within(Duration::from_secs(60), &progress, || 7).expect("done"),
            7
        );
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        progress.set("reading a FIFO nobody writes");
        let start = Instant::now();
        let e = run_within(Duration::from_millis(100), &progress, move || {
            let _ = rx.recv();
        })
        .expect_err("blocked");
        assert!(start.elapsed() < Duration::from_secs(60));
        assert_eq!(
            e.to_string(),
            "did not finish within 0.1 s: still reading a FIFO nobody writes"
        );
        drop(tx);

        let mut noted = Vec::new();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let mut note = |step: &str| noted.push(step.to_string());
        let e = run_noting(
            Duration::from_millis(150),
            Some((Duration::from_millis(50), &mut note)),
            &progress,
            move || {
                let _ = rx.recv();
            },
        )
        .expect_err("blocked");
        assert!(matches!(e, WaitError::TimedOut { waited, .. } if waited.as_millis() == 150));
        assert_eq!(noted, vec!["reading a FIFO nobody writes".to_string()]);
        drop(tx);
        let mut never = |_: &str| panic!("noted a step that finished");
        let v = run_noting(
            Duration::from_secs(60),
            Some((Duration::from_secs(30), &mut never)),
            &progress,
            || 1,
        );
        assert_eq!(v.expect("done"), 1);
    }
}
