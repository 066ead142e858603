//! What a daemon remembers of its pod — task records, the sandbox's and each container's
//! baseline — held in memory for the daemon's whole life and decided from there. The state
//! directory only mirrors it (for `kata-topo status`, and for a daemon started again for the
//! same pod), written by the state sink's own thread: a full or slow disk never changes a
//! decision and never makes a request wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use kata_topo_core::config::Config;
use slog::Logger;

use kata_topo_core::input::affinity::LabelBaseline;
use kata_topo_core::state::{DaemonRecord, GroupState, TaskRecord, VerdictOf};
use kata_topo_core::{Baseline, Verdict};
use kata_topo_sinks::Persist;

/// The mirror's key for a verdict file: a later write of the same file replaces one still
/// waiting.
fn verdict_key(of: &VerdictOf) -> String {
    format!("verdict/{}", of.file_name())
}

/// Whose baseline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum BaselineOf {
    /// The pod sandbox's.
    Sandbox,
    /// A container's, by CRI container name.
    Container(String),
}

#[derive(Debug, Default)]
struct Memory {
    sandbox: Option<Baseline>,
    labels: Option<LabelBaseline>,
    labels_seen: kata_topo_core::state::LabelsSeen,
    // Boxed: a map's first table has room for three, and a pod's few records (a node-wide
    // front end keeps every pod's) are each larger than their key.
    containers: HashMap<String, Box<Baseline>>,
    tasks: HashMap<String, Box<TaskRecord>>,
}

/// The pod's state directory, created when it can be; when it cannot (a full or read-only
/// disk), the pod runs from memory and says so. `None`: the state directory is not trusted
/// (nothing is read from it or written to it then).
pub(crate) fn open_files(
    config: &Config,
    namespace: &str,
    group: &str,
    log: &Logger,
) -> Option<GroupState> {
    match GroupState::open(&config.state_dir, namespace, group) {
        Ok(files) => Some(files),
        // Someone else could have written it: nothing there is read, nothing written.
        Err(e) if kata_topo_core::files::is_untrusted(&e) => {
            slog::error!(log, "the state directory is not trusted and is not used; checks run from memory and `kata-topo status` does not see this pod";
                "event" => "state-untrusted", "error" => e.to_string(), "sandbox_id" => group);
            None
        }
        Err(e) => {
            slog::warn!(log, "cannot create the pod's state directory; checks run from memory";
                "event" => "state-failed", "error" => e.to_string(), "sandbox_id" => group);
            Some(GroupState::at(&config.state_dir, namespace, group))
        }
    }
}

/// Where a pod's mirror is.
#[derive(Debug, Clone)]
pub(crate) enum Files {
    /// Nowhere: the state directory is not trusted.
    None,
    /// Opened (and read) before the pod's first request.
    Open(GroupState),
    /// Opened by the state writer before its first write, off the request path: a pod the
    /// runtime has just created has nothing on disk to read, and its first request does not
    /// wait for its directory to be made (on a slow disk, milliseconds).
    Later(Arc<Later>),
}

impl Files {
    /// Opened now: what a previous daemon or plugin left is read.
    pub(crate) fn now(config: &Config, namespace: &str, group: &str, log: &Logger) -> Self {
        open_files(config, namespace, group, log).map_or(Self::None, Self::Open)
    }

    /// Opened by the first write.
    pub(crate) fn later(config: Arc<Config>, namespace: &str, group: &str, log: Logger) -> Self {
        let (namespace, group) = (namespace.to_string(), group.to_string());
        Self::Later(Arc::new(Later {
            open: Mutex::new(Some(Box::new(move || {
                open_files(&config, &namespace, &group, &log)
            }))),
            opened: OnceLock::new(),
        }))
    }
}

type Open = Box<dyn FnOnce() -> Option<GroupState> + Send>;

/// A state directory opened at its first use.
pub(crate) struct Later {
    open: Mutex<Option<Open>>,
    opened: OnceLock<Option<GroupState>>,
}

impl std::fmt::Debug for Later {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Later")
            .field("opened", &self.opened.get())
            .finish_non_exhaustive()
    }
}

impl Later {
    /// Opens it, the first time.
    fn get(&self) -> Option<&GroupState> {
        self.opened
            .get_or_init(|| {
                let open = self.open.lock().unwrap_or_else(|e| e.into_inner()).take();
                open.and_then(|f| f())
            })
            .as_ref()
    }
}

/// One pod's records.
#[derive(Debug)]
pub(crate) struct PodStore {
    /// The mirror's files.
    files: Files,
    memory: Mutex<Memory>,
    persist: Persist,
}

impl PodStore {
    /// The records of a pod, starting from what a previous daemon left in `files`; without
    /// files, from nothing, and kept in memory only.
    pub(crate) fn open(files: Files, persist: Persist) -> Self {
        let mut memory = Memory::default();
        if let Files::Open(files) = &files {
            memory.sandbox = files.sandbox_baseline().ok().flatten();
            memory.labels = files.label_baseline().ok().flatten();
            memory.labels_seen = files.labels_seen().ok().flatten().unwrap_or_default();
            if let Ok(Some(pod)) = kata_topo_core::state::read_pod(files.dir()) {
                memory.containers = pod
                    .containers
                    .into_iter()
                    .map(|(k, v)| (k, Box::new(v)))
                    .collect();
                memory.tasks = pod
                    .tasks
                    .into_iter()
                    .map(|(k, v)| (k, Box::new(v)))
                    .collect();
            }
        }
        Self {
            files,
            memory: Mutex::new(memory),
            persist,
        }
    }

    fn with<T>(&self, f: impl FnOnce(&mut Memory) -> T) -> T {
        f(&mut self.memory.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn mirror(
        &self,
        key: String,
        job: impl FnOnce(&GroupState) -> std::io::Result<()> + Send + 'static,
    ) {
        match self.files.clone() {
            Files::None => {}
            Files::Open(files) => self.persist.put(key, move || job(&files)),
            Files::Later(later) => self.persist.put(key, move || match later.get() {
                Some(files) => job(files),
                // Said once, when it was opened.
                None => Ok(()),
            }),
        }
    }

    /// Where the files are, when there are any.
    #[cfg(test)]
    pub(crate) fn dir(&self) -> Option<&std::path::Path> {
        match &self.files {
            Files::None => None,
            Files::Open(files) => Some(files.dir()),
            Files::Later(later) => later.get().map(GroupState::dir),
        }
    }

    /// A task's record.
    pub(crate) fn task(&self, id: &str) -> Option<TaskRecord> {
        self.with(|m| m.tasks.get(id).map(|r| (**r).clone()))
    }

    /// Records a task.
    pub(crate) fn save_task(&self, id: &str, record: TaskRecord) {
        self.with(|m| m.tasks.insert(id.to_string(), Box::new(record.clone())));
        let id = id.to_string();
        self.mirror(format!("task/{id}"), move |f| f.save_task(&id, &record));
    }

    /// Forgets a task (its container's baseline stays for a recreate).
    pub(crate) fn remove_task(&self, id: &str) -> Option<TaskRecord> {
        let record = self.with(|m| m.tasks.remove(id)).map(|r| *r);
        // A removal replaces the task's writes still waiting (its record and its verdicts).
        for key in [
            format!("task/{id}"),
            verdict_key(&VerdictOf::Request(id.to_string())),
            verdict_key(&VerdictOf::Vm(id.to_string())),
        ] {
            let id = id.to_string();
            self.mirror(key, move |f| f.remove_task(&id));
        }
        record
    }

    /// A baseline.
    pub(crate) fn baseline(&self, of: &BaselineOf) -> Option<Baseline> {
        self.with(|m| match of {
            BaselineOf::Sandbox => m.sandbox.clone(),
            BaselineOf::Container(n) => m.containers.get(n).map(|b| (**b).clone()),
        })
    }

    /// Records a baseline.
    pub(crate) fn save_baseline(&self, of: BaselineOf, b: Baseline) {
        match of {
            BaselineOf::Sandbox => {
                self.with(|m| m.sandbox = Some(b.clone()));
                self.mirror("sandbox".into(), move |f| f.save_sandbox_baseline(&b));
            }
            BaselineOf::Container(name) => {
                self.with(|m| m.containers.insert(name.clone(), Box::new(b.clone())));
                self.mirror(format!("container/{name}"), move |f| {
                    f.save_container_baseline(&name, &b)
                });
            }
        }
    }

    /// The pod's label baseline, as a previous daemon of the pod kept it.
    pub(crate) fn label_baseline(&self) -> Option<LabelBaseline> {
        self.with(|m| m.labels.clone())
    }

    /// Records the pod's label baseline.
    pub(crate) fn save_label_baseline(&self, b: LabelBaseline) {
        self.with(|m| m.labels = Some(b.clone()));
        self.mirror("node-labels".into(), move |f| f.save_label_baseline(&b));
    }

    /// Takes a read of the node's labels against the label baseline: a label seen changed for
    /// the first time is recorded with when (for `kata-topo diagnose`).
    pub(crate) fn observe_labels(
        &self,
        then: &kata_topo_core::input::affinity::Labels,
        now: &kata_topo_core::input::affinity::Labels,
    ) {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let changed = self.with(|m| {
            m.labels_seen
                .observe(then, now, at)
                .then(|| m.labels_seen.clone())
        });
        if let Some(seen) = changed {
            self.mirror("node-labels-seen".into(), move |f| {
                f.save_labels_seen(&seen)
            });
        }
    }

    /// Keeps the latest verdict of a task's request, of its VM, or of the pod (for
    /// `kata-topo status`).
    pub(crate) fn save_verdict(&self, of: VerdictOf, v: &Verdict) {
        let v = v.clone();
        self.mirror(verdict_key(&of), move |f| f.save_verdict_of(&of, &v));
    }

    /// Records who serves the pod.
    pub(crate) fn save_daemon(&self, d: DaemonRecord) {
        self.mirror("daemon".into(), move |f| f.save_daemon(&d));
    }

    /// The pod is gone: forget everything and remove its files; nothing is written after.
    pub(crate) fn remove_all(&self) {
        self.with(|m| *m = Memory::default());
        let files = self.files.clone();
        self.persist.close(move || match &files {
            Files::None => Ok(()),
            Files::Open(f) => f.remove_all(),
            // Never written: nothing to remove.
            Files::Later(later) => match later.opened.get() {
                Some(Some(f)) => f.remove_all(),
                _ => Ok(()),
            },
        });
    }

    /// The mirror, to wait on it.
    pub(crate) fn persist(&self) -> &Persist {
        &self.persist
    }
}
