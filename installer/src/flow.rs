//! Install, uninstall and the preStop hook's decision, step by step.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Mutex;

use kata_topo_apiserver::installer::{DaemonSetState, NodeEvent};
use kata_topo_apiserver::{ApiClient, ApiError};
use kata_topo_core::files::Entry;

use crate::containerd::{self, Handler, HostExec, MainConfig};
use crate::node::{Change, Node, NodeError, Want};
use crate::settings::{self, Settings, BINARIES, PREFIX};
use crate::{LABEL_INSTALLED, LABEL_REFUSED, LABEL_VERSION};

/// A copy of every log line, for the preStop hook: a hook's output reaches no log, the
/// container's main process's does.
static ALSO: Mutex<Option<std::fs::File>> = Mutex::new(None);

fn emit(line: &str, to_stderr: bool) {
    let line = format!("kata-topo-installer: {line}\n");
    if to_stderr {
        let _ = std::io::stderr().write_all(line.as_bytes());
    } else {
        let _ = std::io::stdout().write_all(line.as_bytes());
    }
    if let Some(f) = ALSO.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
        let _ = f.write_all(line.as_bytes());
    }
}

fn say(line: &str) {
    emit(line, false);
}

fn warn(line: &str) {
    emit(line, true);
}

/// Why an install stops: the label value and the message.
#[derive(Debug)]
struct Refusal {
    reason: &'static str,
    message: String,
}

impl Refusal {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
        }
    }

    /// A failed file step: read-only file systems and untrusted paths have their own reason.
    fn node(e: &NodeError, node: &str) -> Self {
        let reason = if e.is_read_only() {
            "read-only-filesystem"
        } else if e.is_untrusted() {
            "untrusted-path"
        } else {
            "write-failed"
        };
        let hint = if e.is_read_only() {
            "; a read-only /usr (an OSTree node) needs KATA_TOPO_SHIM_LINK_DIR on a writable \
             directory of containerd's PATH, or containerd 2.x (which needs no link)"
        } else {
            ""
        };
        Self::new(
            reason,
            format!("node {node}: {}; nothing was changed{hint}", e.line()),
        )
    }
}

/// The readiness probe: installed.
pub fn ready() -> ExitCode {
    let run = std::env::var("KATA_TOPO_RUN_DIR").unwrap_or_else(|_| "/run".into());
    if Path::new(&run).join("kata-topo-installer.ready").exists() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `install`, `prestop` or `uninstall`.
pub fn run(cmd: &str) -> ExitCode {
    // TERM and INT wait until a step is done: an install or an uninstall is never cut short
    // halfway (the kubelet's grace period is long enough for both).
    let signals = match signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]) {
        Ok(s) => s,
        Err(e) => {
            warn(&format!("error: cannot handle TERM: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            warn(&format!("error: {e}"));
            return ExitCode::FAILURE;
        }
    };
    if cmd == "prestop" {
        follow_main_log(&settings);
    }
    let api = match client(&settings) {
        Ok(c) => c,
        Err(e) => {
            warn(&format!("error: cannot reach the API server: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let cx = Cx { s: &settings, api };
    match cmd {
        "install" => {
            let pid = settings.run_dir.join("kata-topo-installer.pid");
            let _ = std::fs::write(&pid, format!("{}\n", std::process::id()));
            let code = cx.install();
            if code != ExitCode::SUCCESS {
                return code;
            }
            wait_for_term(signals);
            ExitCode::SUCCESS
        }
        "prestop" => cx.prestop(),
        _ => cx.uninstall(),
    }
}

fn wait_for_term(mut signals: signal_hook::iterator::Signals) {
    let _ = signals.forever().next();
}

fn follow_main_log(s: &Settings) {
    let pid = s.run_dir.join("kata-topo-installer.pid");
    let Ok(text) = std::fs::read_to_string(pid) else {
        return;
    };
    let Ok(main) = text.trim().parse::<u32>() else {
        return;
    };
    if let Ok(f) = std::fs::OpenOptions::new()
        .append(true)
        .open(format!("/proc/{main}/fd/1"))
    {
        *ALSO.lock().unwrap_or_else(|e| e.into_inner()) = Some(f);
    }
}

fn client(s: &Settings) -> Result<ApiClient, ApiError> {
    match &s.kubeconfig {
        Some(k) => ApiClient::from_kubeconfig(k, s.api_timeout),
        None => kata_topo_apiserver::installer::in_cluster(
            Path::new(kata_topo_apiserver::installer::SERVICE_ACCOUNT_DIR),
            &s.service.0,
            &s.service.1,
            s.api_timeout,
        ),
    }
}

fn now() -> String {
    let f = time::macros::format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z");
    time::OffsetDateTime::now_utc()
        .format(&f)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// What every step needs.
struct Cx<'a> {
    s: &'a Settings,
    api: ApiClient,
}

/// The node paths of one install.
struct Paths {
    share: PathBuf,
    record: PathBuf,
    dropin: PathBuf,
    link: PathBuf,
}

impl Cx<'_> {
    fn paths(&self, confd: &Path) -> Paths {
        let share = Path::new(PREFIX).join("share");
        Paths {
            record: share.join("created-dirs"),
            share,
            dropin: confd.join(format!("{}.toml", self.s.handler)),
            link: self
                .s
                .link_dir
                .join(format!("containerd-shim-{}-v2", self.s.handler)),
        }
    }

    fn event(&self, reason: &str, message: &str) {
        let e = NodeEvent {
            node: &self.s.node,
            reason,
            message,
            component: "kata-topo-installer",
            time: &now(),
        };
        if let Err(e) = self.api.create_node_event(&e) {
            warn(&format!("cannot create the event {reason}: {e}"));
        }
    }

    /// The refusal: the log, the label, the event; the container stays up, not ready.
    fn refuse(&self, r: &Refusal) {
        warn(&format!("refused: {}", r.message));
        if let Err(e) =
            self.api
                .patch_node_metadata(&self.s.node, &[(LABEL_REFUSED, Some(r.reason))], &[])
        {
            warn(&format!("cannot label node {}: {e}", self.s.node));
        }
        self.event("KataTopoInstallRefused", &r.message);
    }

    fn install(&self) -> ExitCode {
        let version = match payload_version(&self.s.payload) {
            Ok(v) => v,
            Err(r) => {
                self.refuse(&r);
                return ExitCode::SUCCESS;
            }
        };
        // The node's runtime first: an API server that does not answer is worth a retry (the
        // container restarts), not a refusal nobody could label.
        let major = match self.s.containerd_major {
            Some(m) => m,
            None => match self.api.node_object(&self.s.node) {
                Ok(n) => match containerd::major_of(
                    n["status"]["nodeInfo"]["containerRuntimeVersion"]
                        .as_str()
                        .unwrap_or_default(),
                ) {
                    Ok(m) => m,
                    Err(why) => {
                        self.refuse(&Refusal::new(
                            "not-containerd",
                            format!("node {}: {why}", self.s.node),
                        ));
                        return ExitCode::SUCCESS;
                    }
                },
                Err(e) => {
                    warn(&format!(
                        "error: cannot read node {}'s container runtime: {e}",
                        self.s.node
                    ));
                    return ExitCode::FAILURE;
                }
            },
        };
        let node = match Node::open(&self.s.host_root) {
            Ok(n) => n,
            Err(e) => {
                self.refuse(&Refusal::node(&e, &self.s.node));
                return ExitCode::SUCCESS;
            }
        };
        let _lock = match self.lock(&node) {
            Ok(l) => l,
            Err(r) => {
                self.refuse(&r);
                return ExitCode::SUCCESS;
            }
        };
        match self.install_files(&node, major, &version) {
            Ok(()) => {}
            Err(r) => {
                self.refuse(&r);
                return ExitCode::SUCCESS;
            }
        }
        if let Err(e) = self.api.patch_node_metadata(
            &self.s.node,
            &[
                (LABEL_INSTALLED, Some("true")),
                (LABEL_VERSION, Some(&version)),
                (LABEL_REFUSED, None),
            ],
            &[],
        ) {
            warn(&format!(
                "error: installed, but cannot label node {}: {e}",
                self.s.node
            ));
            return ExitCode::FAILURE;
        }
        say(&format!(
            "installed kata-topo {version} on node {}; labelled {LABEL_INSTALLED}=true, \
             {LABEL_VERSION}={version}",
            self.s.node
        ));
        let ready = self.s.run_dir.join("kata-topo-installer.ready");
        if let Err(e) = std::fs::write(&ready, "") {
            warn(&format!("error: cannot write {}: {e}", ready.display()));
            return ExitCode::FAILURE;
        }
        ExitCode::SUCCESS
    }

    /// One install or uninstall at a time on a node (a new pod's install and an old pod's
    /// preStop may overlap): a lock file in the node's /run.
    fn lock(&self, node: &Node) -> Result<std::fs::File, Refusal> {
        let (run, _) = node
            .make_dir(Path::new("/run"))
            .map_err(|e| Refusal::node(&e, &self.s.node))?;
        match run.lock("kata-topo-installer.lock", 0o600, self.s.lock_timeout) {
            Ok(Some(f)) => Ok(f),
            Ok(None) => Err(Refusal::new(
                "locked",
                format!(
                    "node {}: another install or uninstall held /run/kata-topo-installer.lock for \
                     {} s; nothing was changed",
                    self.s.node,
                    self.s.lock_timeout.as_secs()
                ),
            )),
            Err(e) => Err(Refusal::new(
                "write-failed",
                format!(
                    "node {}: cannot lock /run/kata-topo-installer.lock: {e}",
                    self.s.node
                ),
            )),
        }
    }

    fn main_config(&self, node: &Node) -> Result<MainConfig, Refusal> {
        let path = &self.s.containerd_config;
        let text = node
            .read(path)
            .map_err(|e| Refusal::node(&e, &self.s.node))?
            .ok_or_else(|| {
                Refusal::new(
                    "containerd-config-missing",
                    format!(
                        "containerd's configuration {} is not on node {}; set \
                         KATA_TOPO_CONTAINERD_CONFIG",
                        path.display(),
                        self.s.node
                    ),
                )
            })?;
        containerd::parse_main(&String::from_utf8_lossy(&text), path)
            .map_err(|why| Refusal::new("containerd-config-invalid", why))
    }

    fn install_files(&self, node: &Node, major: u32, version: &str) -> Result<(), Refusal> {
        let s = self.s;
        let main = self.main_config(node)?;
        let confd = main.imports_dir.clone().ok_or_else(|| {
            Refusal::new(
                "no-containerd-imports",
                format!(
                    "containerd's configuration {} on node {} imports no directory (imports = \
                     [\"/etc/containerd/conf.d/*.toml\"]); kata-topo-installer never rewrites it: \
                     add the import, restart containerd, then delete this pod",
                    s.containerd_config.display(),
                    s.node
                ),
            )
        })?;
        let p = self.paths(&confd);
        let ours = s.runtime_path();
        let v1 = major < 2;
        if v1 {
            match node
                .entry(&p.link)
                .map_err(|e| Refusal::node(&e, &s.node))?
            {
                Entry::Missing => {}
                Entry::Symlink(t) if t == ours => {}
                _ => {
                    return Err(Refusal::new(
                        "shim-exists",
                        format!(
                            "{} on node {} is not kata-topo-installer's (make install's?); remove \
                             it or choose another KATA_TOPO_HANDLER",
                            p.link.display(),
                            s.node
                        ),
                    ))
                }
            }
        }
        if let Some(text) = node
            .read(&p.dropin)
            .map_err(|e| Refusal::node(&e, &s.node))?
        {
            if !containerd::has_marker(&String::from_utf8_lossy(&text)) {
                return Err(Refusal::new(
                    "dropin-exists",
                    format!(
                        "{} on node {} was not written by kata-topo-installer; remove it or \
                         choose another KATA_TOPO_HANDLER",
                        p.dropin.display(),
                        s.node
                    ),
                ));
            }
        }
        say(&format!(
            "node {}: kata-topo {version}, handler {}, containerd {major}.x, drop-in {}",
            s.node,
            s.handler,
            p.dropin.display()
        ));

        // The binaries and the configuration first: the drop-in never names a missing file.
        let mut changes = Vec::new();
        for b in BINARIES {
            changes.push(Change {
                path: Path::new(PREFIX).join("bin").join(b),
                want: Want::File {
                    bytes: payload_file(&s.payload.join("bin").join(b))?,
                    mode: 0o755,
                },
            });
        }
        let config = if s.config_override.is_file() {
            s.config_override.clone()
        } else {
            s.payload.join("share/configuration-kata-topo.toml")
        };
        changes.push(Change {
            path: s.config_path(),
            want: Want::File {
                bytes: payload_file(&config)?,
                mode: 0o644,
            },
        });
        changes.push(Change {
            path: p.share.join("VERSION"),
            want: Want::File {
                bytes: format!("{version}\n").into_bytes(),
                mode: 0o644,
            },
        });
        for (name, path) in npd_files(&s.payload)? {
            changes.push(Change {
                path: s.npd_dir.join(name),
                want: Want::File {
                    bytes: payload_file(&path)?,
                    mode: 0o644,
                },
            });
        }
        if v1 {
            changes.push(Change {
                path: p.link.clone(),
                want: Want::Link(ours.clone()),
            });
        }
        let config_path = s.config_path();
        let handler = Handler {
            name: &s.handler,
            runtime_path: &ours,
            config_path: s.config_path_option.then_some(config_path.as_path()),
        };
        let dropin = if v1 {
            let exec = HostExec::parse(&s.host_exec).map_err(|e| Refusal::new("bad-setting", e))?;
            let ran =
                containerd::run_on_host(&exec, &s.dump, s.containerd_timeout).map_err(|e| {
                    Refusal::new("containerd-dump-failed", format!("node {}: {e}", s.node))
                })?;
            containerd::dropin_v2(&handler, &String::from_utf8_lossy(&ran.stdout), &s.dump)
                .map_err(|e| {
                    Refusal::new("containerd-dump-failed", format!("node {}: {e}", s.node))
                })?
        } else {
            containerd::dropin_v3(&handler)
        };
        changes.push(Change {
            path: p.dropin.clone(),
            want: Want::File {
                bytes: dropin.text.into_bytes(),
                mode: dropin.mode,
            },
        });

        let mut applied = node
            .apply(&changes, &p.record)
            .map_err(|e| Refusal::node(&e, &s.node))?;
        for c in applied.changed() {
            if c.starts_with(PREFIX) && c.parent() == Some(&Path::new(PREFIX).join("bin")) {
                say(&format!("installed {}", c.display()));
            }
        }
        let restart = applied
            .changed()
            .iter()
            .any(|c| *c == p.dropin || *c == p.link);
        if restart {
            if let Err(why) = self.restart_and_check(&main) {
                applied.undo();
                let again = self.restart();
                let after = match again {
                    Ok(()) => "restarted again with its configuration as it was".to_string(),
                    Err(e) => format!(
                        "restarting it again with its configuration as it was failed too: {e}"
                    ),
                };
                return Err(Refusal::new(
                    if why.0 {
                        "containerd-restart-failed"
                    } else {
                        "handler-not-loaded"
                    },
                    format!(
                        "node {}: {}; every file was put back as it was and containerd {after}",
                        s.node, why.1
                    ),
                ));
            }
        }
        applied.keep();
        Ok(())
    }

    fn restart(&self) -> Result<(), String> {
        let exec = HostExec::parse(&self.s.host_exec)?;
        say(&format!("restarting containerd: {}", self.s.restart));
        containerd::run_on_host(&exec, &self.s.restart, self.s.containerd_timeout).map(|_| ())
    }

    /// Restarts containerd and checks that it runs the handler; the error says whether the
    /// restart itself failed (`true`) or the handler is not loaded.
    fn restart_and_check(&self, main: &MainConfig) -> Result<(), (bool, String)> {
        self.restart()
            .map_err(|e| (true, format!("restarting containerd failed: {e}")))?;
        let socket = self.s.containerd_socket.clone().unwrap_or_else(|| {
            self.s
                .host_root
                .join(main.socket.strip_prefix("/").unwrap_or(&main.socket))
        });
        let runtime_type = format!("io.containerd.{}.v2", self.s.handler);
        containerd::check_loaded(
            &socket,
            &self.s.handler,
            &runtime_type,
            self.s.containerd_timeout,
        )
        .map_err(|e| (false, e))?;
        say(&format!(
            "containerd runs the handler {} ({runtime_type})",
            self.s.handler
        ));
        Ok(())
    }

    fn prestop(&self) -> ExitCode {
        let (ns, name) = &self.s.daemonset;
        match self.api.daemonset_state(ns, name) {
            Ok(DaemonSetState::Gone) => {
                say(&format!("daemonset {ns}/{name} is gone: uninstalling"));
                self.uninstall()
            }
            Ok(DaemonSetState::Deleting(at)) => {
                say(&format!(
                    "daemonset {ns}/{name} is being deleted (since {at}): uninstalling"
                ));
                self.uninstall()
            }
            Ok(DaemonSetState::Stays) => {
                say(&format!(
                    "daemonset {ns}/{name} stays (an upgrade or this pod replaced): the node keeps kata-topo"
                ));
                ExitCode::SUCCESS
            }
            Err(e) => {
                warn(&format!(
                    "cannot tell whether daemonset {ns}/{name} stays ({e}): the node keeps kata-topo"
                ));
                ExitCode::SUCCESS
            }
        }
    }

    fn uninstall(&self) -> ExitCode {
        let s = self.s;
        let _ = std::fs::remove_file(s.run_dir.join("kata-topo-installer.ready"));
        let node = match Node::open(&s.host_root) {
            Ok(n) => n,
            Err(e) => {
                warn(&format!("error: {}", e.line()));
                return ExitCode::FAILURE;
            }
        };
        let _lock = match self.lock(&node) {
            Ok(l) => l,
            Err(r) => {
                warn(&format!("error: {}", r.message));
                return ExitCode::FAILURE;
            }
        };
        // The label first: no new pod is sent here while the handler goes away.
        if let Err(e) = self.api.patch_node_metadata(
            &s.node,
            &[
                (LABEL_INSTALLED, None),
                (LABEL_VERSION, None),
                (LABEL_REFUSED, None),
            ],
            &[],
        ) {
            warn(&format!("cannot remove the node's labels: {e}"));
        }
        let mut problems: Vec<String> = Vec::new();
        let mut kept_in_use = None;
        let mut changed = false;
        let main = match self.main_config(&node) {
            Ok(m) => Some(m),
            Err(r) => {
                say(&format!("no handler to remove: {}", r.message));
                None
            }
        };
        let confd = main
            .as_ref()
            .and_then(|m| m.imports_dir.clone())
            .unwrap_or_else(|| PathBuf::from("/nonexistent"));
        let p = self.paths(&confd);
        match node.read(&p.dropin) {
            Ok(None) => {}
            Ok(Some(text)) => {
                let text = String::from_utf8_lossy(&text);
                if containerd::has_marker(&text) {
                    match remove_file(&node, &p.dropin) {
                        Ok(()) => changed = true,
                        Err(e) => problems.push(e),
                    }
                } else if containerd::names_prefix(&text, Path::new(PREFIX)) {
                    kept_in_use = Some(p.dropin.clone());
                } else {
                    say(&format!(
                        "{} is not kata-topo-installer's: left as it is",
                        p.dropin.display()
                    ));
                }
            }
            Err(e) => problems.push(e.line()),
        }
        // A hand-edited drop-in that still names kata-topo's binaries keeps them (and the
        // link containerd 1.x finds the wrapper through): removing them would leave
        // containerd a handler whose binary is gone.
        if kept_in_use.is_none() {
            if let Ok(Entry::Symlink(t)) = node.entry(&p.link) {
                if t == s.runtime_path() {
                    match remove_file(&node, &p.link) {
                        Ok(()) => changed = true,
                        Err(e) => problems.push(e),
                    }
                }
            }
        }
        if let Ok(files) = npd_files(&s.payload) {
            for (name, _) in files {
                if let Err(e) = remove_file(&node, &s.npd_dir.join(name)) {
                    problems.push(e);
                }
            }
        }
        let record = p.record.clone();
        let made: Vec<PathBuf> = match node.read(&record) {
            Ok(Some(b)) => String::from_utf8_lossy(&b)
                .lines()
                .map(PathBuf::from)
                .filter(|d| settings::node_path("created-dirs", d).is_ok())
                .collect(),
            _ => Vec::new(),
        };
        if kept_in_use.is_none() {
            match node.read(&p.share.join("VERSION")) {
                Ok(Some(_)) => {
                    if let Err(e) = remove_prefix(&node) {
                        problems.push(e);
                    }
                }
                Ok(None) => {}
                Err(e) => problems.push(e.line()),
            }
            let outside: Vec<PathBuf> = made
                .into_iter()
                .filter(|d| !d.starts_with(PREFIX))
                .collect();
            problems.extend(node.remove_dirs(&outside));
        }
        say(&format!("removed kata-topo's files from node {}", s.node));
        // containerd last: a preStop hook's exec does not outlive the restart of the
        // containerd running it, so nothing may be left to do after it. No pod can start on
        // the handler meanwhile: the label went first.
        let mut code = ExitCode::SUCCESS;
        if let Some(dropin) = &kept_in_use {
            let message = format!(
                "node {}: {} lost kata-topo-installer's marker (edited by hand?) and still names \
                 {PREFIX}: it was left in place, and with it {PREFIX} and the shim link it needs; \
                 remove the file, restart containerd, then remove {PREFIX}",
                s.node,
                dropin.display()
            );
            warn(&format!("error: uninstall incomplete: {message}"));
            self.event("KataTopoUninstallIncomplete", &message);
            code = ExitCode::FAILURE;
        }
        for problem in &problems {
            warn(&format!("error: {problem}"));
            code = ExitCode::FAILURE;
        }
        if changed {
            if let Err(e) = self.restart() {
                warn(&format!("error: restarting containerd failed: {e}"));
                return ExitCode::FAILURE;
            }
        }
        if code == ExitCode::SUCCESS {
            say(&format!("removed kata-topo from node {}", s.node));
        }
        code
    }
}

fn remove_file(node: &Node, path: &Path) -> Result<(), String> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(());
    };
    match node.dir(dir) {
        Ok(Some(d)) => d
            .remove(name)
            .and_then(|()| d.sync())
            .map_err(|e| format!("cannot remove {}: {e}", path.display())),
        Ok(None) => Ok(()),
        Err(e) => Err(e.line()),
    }
}

fn remove_prefix(node: &Node) -> Result<(), String> {
    let prefix = Path::new(PREFIX);
    let (Some(parent), Some(name)) = (prefix.parent(), prefix.file_name().and_then(|n| n.to_str()))
    else {
        return Ok(());
    };
    match node.dir(parent) {
        Ok(Some(d)) => d
            .remove_tree(name)
            .and_then(|()| d.sync())
            .map_err(|e| format!("cannot remove {PREFIX}: {e}")),
        Ok(None) => Ok(()),
        Err(e) => Err(e.line()),
    }
}

/// The image's version, a label value.
fn payload_version(payload: &Path) -> Result<String, Refusal> {
    let bytes = payload_file(&payload.join("VERSION"))?;
    let v = String::from_utf8_lossy(&bytes).trim().to_string();
    if settings::is_label_value(&v) {
        Ok(v)
    } else {
        Err(Refusal::new(
            "bad-image",
            format!("the image's VERSION is not a label value: {v:?}"),
        ))
    }
}

/// A file the image brings (a ConfigMap's file may be a link, as the kubelet mounts it).
fn payload_file(path: &Path) -> Result<Vec<u8>, Refusal> {
    kata_topo_core::files::read_bounded(path, crate::node::MAX_FILE_BYTES).map_err(|e| {
        Refusal::new(
            "bad-image",
            format!(
                "cannot read {} in the installer's image: {e}",
                path.display()
            ),
        )
    })
}

/// node-problem-detector's monitors the image brings, by name.
fn npd_files(payload: &Path) -> Result<Vec<(String, PathBuf)>, Refusal> {
    let dir = payload.join("share/node-problem-detector");
    let mut out: Vec<(String, PathBuf)> = std::fs::read_dir(&dir)
        .map_err(|e| {
            Refusal::new(
                "bad-image",
                format!(
                    "cannot list {} in the installer's image: {e}",
                    dir.display()
                ),
            )
        })?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.to_string();
            name.ends_with(".json").then(|| (name, e.path()))
        })
        .collect();
    out.sort();
    Ok(out)
}
