//! containerd, as the installer sees it: its main configuration (read, never written), the
//! runtime handler's drop-in (typed TOML, `toml_edit`), the host commands that dump its
//! configuration and restart it, and the CRI's own word that it loaded the handler.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use toml_edit::{value, Array, DocumentMut, Item, Table};

/// The drop-in's first line: a file without it is someone else's (or was edited by hand).
pub const MARKER: &str =
    "# Written by kata-topo-installer; removed by it. Do not edit: the next install replaces it.";

/// The PATH host commands run with (this container's PATH is the image's).
pub const HOST_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the main configuration says that the installer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MainConfig {
    /// The directory its `imports` glob `*.toml` in (the first such entry), on the node.
    pub imports_dir: Option<PathBuf>,
    /// `[grpc] address`, on the node (default `/run/containerd/containerd.sock`).
    pub socket: PathBuf,
}

/// Reads the main configuration at node path `path` (its text `text`). Only an absolute import
/// counts: containerd 1.6 resolves a relative one against its own working directory, which
/// the installer cannot know.
pub fn parse_main(text: &str, path: &Path) -> Result<MainConfig, String> {
    let doc: DocumentMut = text
        .parse()
        .map_err(|e| format!("{} is not TOML: {e}", path.display()))?;
    let imports_dir = doc
        .get("imports")
        .and_then(Item::as_array)
        .into_iter()
        .flat_map(|a| a.iter())
        .filter_map(|v| v.as_str())
        .find_map(|p| {
            let d = PathBuf::from(p.strip_suffix("/*.toml")?);
            kata_topo_core::files::components(&d).ok().map(|_| d)
        });
    let socket = doc
        .get("grpc")
        .and_then(|g| g.get("address"))
        .and_then(Item::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("/run/containerd/containerd.sock");
    Ok(MainConfig {
        imports_dir,
        socket: PathBuf::from(socket),
    })
}

/// The runtime handler the drop-in declares.
#[derive(Debug, Clone)]
pub struct Handler<'a> {
    /// Its name (the RuntimeClass's `handler`).
    pub name: &'a str,
    /// `runtime_path`: the wrapper.
    pub runtime_path: &'a Path,
    /// `options.ConfigPath`, when the handler passes one.
    pub config_path: Option<&'a Path>,
}

impl Handler<'_> {
    fn table(&self) -> Table {
        let mut t = Table::new();
        t["runtime_type"] = value(format!("io.containerd.{}.v2", self.name));
        t["runtime_path"] = value(self.runtime_path.display().to_string());
        t["privileged_without_host_devices"] = value(true);
        let mut annotations = Array::new();
        annotations.push("io.katacontainers.*");
        annotations.push("kata-topo.io/*");
        t["pod_annotations"] = value(annotations);
        if let Some(c) = self.config_path {
            let mut o = Table::new();
            o["ConfigPath"] = value(c.display().to_string());
            t["options"] = Item::Table(o);
        }
        t
    }
}

/// A drop-in and what it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dropin {
    /// Its text.
    pub text: String,
    /// Its mode: 0600 when it carries secrets (containerd 1.x's registry credentials), else
    /// 0644.
    pub mode: u32,
}

/// Sets `path` (tables, made on the way) in `doc` to `leaf`.
fn put(doc: &mut Table, path: &[&str], leaf: Table) {
    let mut t = doc;
    for key in &path[..path.len() - 1] {
        let next = t.entry(key).or_insert_with(|| {
            let mut n = Table::new();
            n.set_implicit(true);
            Item::Table(n)
        });
        if !next.is_table() {
            *next = Item::Table(Table::new());
        }
        t = next.as_table_mut().expect("a table: set just above");
    }
    t.insert(path[path.len() - 1], Item::Table(leaf));
}

/// containerd 2.x's drop-in (configuration version 3): the handler alone; 2.x merges an
/// import's tables into the main configuration's.
pub fn dropin_v3(h: &Handler<'_>) -> Dropin {
    let mut doc = DocumentMut::new();
    doc["version"] = value(3);
    put(
        doc.as_table_mut(),
        &[
            "plugins",
            "io.containerd.cri.v1.runtime",
            "containerd",
            "runtimes",
            h.name,
        ],
        h.table(),
    );
    Dropin {
        text: format!(
            "{MARKER}\n# kata-topo's {} runtime handler (the same for every version: an upgrade \
             needs no restart).\n{doc}",
            h.name
        ),
        mode: 0o644,
    }
}

/// The CRI plugin's name in configuration version 2.
const CRI_V2: &str = "io.containerd.grpc.v1.cri";

/// containerd 1.x's drop-in (configuration version 2). 1.x replaces a plugin's whole section
/// with an import's, so the file carries the CRI section as containerd runs it now (`dump`,
/// its `config dump`, without this handler's own tables), then the handler: the operator's
/// CRI settings stay in force. Registry credentials in that section make the file 0600.
pub fn dropin_v2(h: &Handler<'_>, dump: &str, dump_command: &str) -> Result<Dropin, String> {
    let dumped: DocumentMut = dump
        .parse()
        .map_err(|e| format!("the output of {dump_command} is not TOML: {e}"))?;
    let mut cri = dumped
        .get("plugins")
        .and_then(|p| p.get(CRI_V2))
        .and_then(Item::as_table)
        .cloned()
        .unwrap_or_default();
    if let Some(runtimes) = cri
        .get_mut("containerd")
        .and_then(|c| c.get_mut("runtimes"))
        .and_then(Item::as_table_mut)
    {
        runtimes.remove(h.name);
    }
    let secrets = carries_secrets(&cri);
    cri.set_implicit(false);
    let mut doc = DocumentMut::new();
    doc["version"] = value(2);
    let mut plugins = Table::new();
    plugins.set_implicit(true);
    plugins.insert(CRI_V2, Item::Table(cri));
    doc.insert("plugins", Item::Table(plugins));
    put(
        doc.as_table_mut(),
        &["plugins", CRI_V2, "containerd", "runtimes", h.name],
        h.table(),
    );
    Ok(Dropin {
        text: format!(
            "{MARKER}\n# kata-topo's {} runtime handler. containerd 1.x replaces a plugin's section \
             with an import's: below, the CRI section\n# containerd ran with when kata-topo was \
             installed ({dump_command}), then the handler.\n# Reinstall (delete the installer's \
             pod) after changing CRI settings.{}\n{doc}",
            h.name,
            if secrets {
                "\n# It carries the registry credentials of that section: mode 0600."
            } else {
                ""
            }
        ),
        mode: if secrets { 0o600 } else { 0o644 },
    })
}

/// Whether a table holds a registry credential (a non-empty `password`, `auth` or
/// `identitytoken`) anywhere inside.
fn carries_secrets(t: &Table) -> bool {
    t.iter().any(|(k, v)| match v {
        Item::Table(inner) => carries_secrets(inner),
        Item::Value(toml_edit::Value::InlineTable(inner)) => {
            carries_secrets(&inner.clone().into_table())
        }
        Item::Value(v) => {
            matches!(k, "password" | "auth" | "identitytoken")
                && v.as_str().is_some_and(|s| !s.is_empty())
        }
        _ => false,
    })
}

/// Whether a file is the installer's (its first line is the marker).
pub fn has_marker(text: &str) -> bool {
    text.lines().next() == Some(MARKER)
}

/// Whether a drop-in's handler tables name a file under `prefix` (the installer's binaries or
/// configuration): a file at the handler's name that lost its marker but still points there.
pub fn names_prefix(text: &str, prefix: &Path) -> bool {
    let prefix = format!("{}/", prefix.display());
    text.lines().any(|l| {
        let l = l.trim_start();
        (l.starts_with("runtime_path") || l.starts_with("ConfigPath")) && l.contains(&prefix)
    })
}

/// The major version in a Node's `containerRuntimeVersion` (`containerd://1.6.20~ds1`).
pub fn major_of(runtime_version: &str) -> Result<u32, String> {
    let v = runtime_version
        .strip_prefix("containerd://")
        .ok_or_else(|| {
            format!(
                "the node runs {}, not containerd",
                if runtime_version.is_empty() {
                    "an unknown runtime"
                } else {
                    runtime_version
                }
            )
        })?;
    let v = v.strip_prefix('v').unwrap_or(v);
    v.split('.')
        .next()
        .and_then(|m| m.parse::<u32>().ok())
        .ok_or_else(|| format!("containerd's version is not a version: {runtime_version:?}"))
}

/// How a host command runs: directly, through the installer's own `nsenter`, or through
/// another program the operator names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostExec {
    /// In this container (`KATA_TOPO_HOST_EXEC` empty).
    Here,
    /// In the namespaces of process `pid` (nsenter's `-t PID` and `-m -u -i -n -p`).
    Enter {
        /// The target process.
        pid: u32,
        /// The namespaces, as /proc/PID/ns names them (`mnt`, `uts`, `ipc`, `net`, `pid`).
        namespaces: Vec<&'static str>,
    },
    /// Through this command line (its words, then `sh -c CMD`).
    Through(Vec<String>),
}

impl HostExec {
    /// Reads `KATA_TOPO_HOST_EXEC`: `nsenter` with `-t PID` (or `--target=PID`) and any of
    /// `-m -u -i -n -p` (or their long forms), ending in `--`, is done by the installer
    /// itself (its image has no nsenter); any other first word is run.
    pub fn parse(text: &str) -> Result<Self, String> {
        let words: Vec<&str> = text.split_whitespace().collect();
        let Some(first) = words.first() else {
            return Ok(Self::Here);
        };
        if *first != "nsenter" {
            return Ok(Self::Through(words.iter().map(|w| w.to_string()).collect()));
        }
        let bad = |w: &str| {
            format!(
                "KATA_TOPO_HOST_EXEC: {w:?} is not an nsenter option the installer knows (-t PID, \
                 -m, -u, -i, -n, -p, --)"
            )
        };
        let mut pid = None;
        let mut namespaces = Vec::new();
        let mut it = words[1..].iter();
        while let Some(w) = it.next() {
            let ns = match *w {
                "--" => break,
                "-t" | "--target" => {
                    let p = it.next().ok_or_else(|| bad(w))?;
                    pid = Some(p.parse::<u32>().map_err(|_| bad(p))?);
                    continue;
                }
                w if w.starts_with("--target=") => {
                    pid = Some(w["--target=".len()..].parse::<u32>().map_err(|_| bad(w))?);
                    continue;
                }
                "-m" | "--mount" => "mnt",
                "-u" | "--uts" => "uts",
                "-i" | "--ipc" => "ipc",
                "-n" | "--net" => "net",
                "-p" | "--pid" => "pid",
                other => return Err(bad(other)),
            };
            if !namespaces.contains(&ns) {
                namespaces.push(ns);
            }
        }
        let pid = pid.ok_or_else(|| "KATA_TOPO_HOST_EXEC: nsenter without -t PID".to_string())?;
        Ok(Self::Enter { pid, namespaces })
    }
}

/// What a host command did.
#[derive(Debug)]
pub struct Ran {
    /// Its standard output (at most 16 MiB).
    pub stdout: Vec<u8>,
    /// The last lines of its standard error.
    pub stderr_tail: String,
}

/// Runs `sh -c command` on the host, as `exec` says, within `timeout` (then its whole process
/// group is killed). An exit status other than 0 is an error saying so.
pub fn run_on_host(exec: &HostExec, command: &str, timeout: Duration) -> Result<Ran, String> {
    let mut cmd = match exec {
        HostExec::Here => Command::new("sh"),
        HostExec::Enter { pid, namespaces } => {
            let mut c = Command::new("/proc/self/exe");
            c.arg(crate::HOST_EXEC_COMMAND)
                .arg(pid.to_string())
                .arg(namespaces.join(","))
                .arg("--")
                .arg("sh");
            c
        }
        HostExec::Through(words) => {
            let mut c = Command::new(&words[0]);
            c.args(&words[1..]).arg("sh");
            c
        }
    };
    cmd.arg("-c")
        .arg(command)
        .env("PATH", HOST_PATH)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    let pipe = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut out = Vec::new();
            if let Some(r) = r {
                let _ = r.take(16 << 20).read_to_end(&mut out);
            }
            out
        })
    };
    let out = pipe(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err = pipe(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                break Err(format!(
                    "{command:?} did not end within {} s",
                    timeout.as_secs()
                ))
            }
            Err(e) => break Err(format!("cannot wait for {command:?}: {e}")),
        }
    };
    if status.is_err() {
        if let Some(pgid) = rustix::process::Pid::from_raw(child.id() as i32) {
            let _ = rustix::process::kill_process_group(pgid, rustix::process::Signal::KILL);
        }
        let _ = child.wait();
    }
    let stdout = out.join().unwrap_or_default();
    let stderr = err.join().unwrap_or_default();
    let stderr_tail = String::from_utf8_lossy(&stderr)
        .lines()
        .rev()
        .take(3)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join(" | ");
    let status = status?;
    if !status.success() {
        return Err(format!(
            "{command:?} failed ({status}){}",
            if stderr_tail.is_empty() {
                String::new()
            } else {
                format!(": {stderr_tail}")
            }
        ));
    }
    Ok(Ran {
        stdout,
        stderr_tail,
    })
}

/// The installer's own `nsenter`: enters the namespaces of `pid`, then runs `argv` there
/// (a child, so it is in the PID namespace too) and returns its exit code. Called in a fresh
/// process of this binary, while it has one thread (entering a mount namespace needs that).
pub fn enter_and_run(pid: u32, namespaces: &str, argv: &[String]) -> Result<i32, String> {
    use rustix::thread::LinkNameSpaceType as T;
    let mut fds = Vec::new();
    for ns in namespaces.split(',').filter(|n| !n.is_empty()) {
        let kind = match ns {
            "mnt" => T::Mount,
            "uts" => T::HostNameAndNISDomainName,
            "ipc" => T::InterProcessCommunication,
            "net" => T::Network,
            "pid" => T::ProcessID,
            other => return Err(format!("unknown namespace {other:?}")),
        };
        let path = format!("/proc/{pid}/ns/{ns}");
        let f = std::fs::File::open(&path).map_err(|e| format!("cannot open {path}: {e}"))?;
        fds.push((ns, kind, f));
    }
    // The mount namespace last: the others' files are opened through this /proc.
    fds.sort_by_key(|(ns, _, _)| *ns == "mnt");
    for (ns, kind, f) in &fds {
        use std::os::fd::AsFd;
        rustix::thread::move_into_link_name_space(f.as_fd(), Some(*kind))
            .map_err(|e| format!("cannot enter process {pid}'s {ns} namespace: {e}"))?;
    }
    let (prog, args) = argv
        .split_first()
        .ok_or_else(|| "no command to run".to_string())?;
    let status = Command::new(prog)
        .args(args)
        .status()
        .map_err(|e| format!("cannot run {prog}: {e}"))?;
    Ok(status.code().unwrap_or(1))
}

/// The CRI `StatusResponse`: only its `info` map is read.
#[derive(Clone, PartialEq, prost::Message)]
struct StatusResponse {
    #[prost(map = "string, string", tag = "2")]
    info: HashMap<String, String>,
}

/// Asks containerd's CRI (`RuntimeService/Status`, verbose: the configuration it runs with,
/// as `crictl info` shows it) whether it loaded `handler` with `runtime_type`, until it says
/// so or `timeout` passes. containerd may take a moment to serve after its restart command
/// returned; each try is bounded by what is left.
pub fn check_loaded(
    socket: &Path,
    handler: &str,
    runtime_type: &str,
    timeout: Duration,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    // What containerd said, once it answered, is worth more than a later try's timeout.
    let mut answered: Option<String> = None;
    let mut last;
    loop {
        last = match status_config(socket, deadline) {
            Ok(config) => match loaded(&config, handler, runtime_type) {
                Ok(()) => return Ok(()),
                Err(e) => {
                    answered = Some(e.clone());
                    e
                }
            },
            Err(e) => e,
        };
        if Instant::now() + Duration::from_millis(200) >= deadline {
            return Err(format!(
                "containerd did not load the handler {handler} within {} s: {}",
                timeout.as_secs(),
                answered.unwrap_or(last)
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Whether the CRI configuration (JSON) has `handler` with `runtime_type`.
fn loaded(config: &str, handler: &str, runtime_type: &str) -> Result<(), String> {
    let v: serde_json::Value =
        serde_json::from_str(config).map_err(|e| format!("its configuration is not JSON: {e}"))?;
    let rt = &v["containerd"]["runtimes"][handler];
    if rt.is_null() {
        let names: Vec<&str> = v["containerd"]["runtimes"]
            .as_object()
            .map(|m| m.keys().map(String::as_str).collect())
            .unwrap_or_default();
        return Err(format!(
            "its runtime handlers are {}",
            if names.is_empty() {
                "none".to_string()
            } else {
                names.join(", ")
            }
        ));
    }
    match rt["runtimeType"].as_str() {
        Some(t) if t == runtime_type => Ok(()),
        other => Err(format!(
            "its handler {handler} has runtime_type {}, not {runtime_type}",
            other.unwrap_or("-")
        )),
    }
}

fn status_config(socket: &Path, deadline: Instant) -> Result<String, String> {
    let left = deadline.saturating_duration_since(Instant::now());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start the CRI client: {e}"))?;
    let socket = socket.to_path_buf();
    let answer = runtime.block_on(async move {
        let call = async {
            let stream = tokio::net::UnixStream::connect(&socket)
                .await
                .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
            // StatusRequest { verbose: true }; the answer carries containerd's whole CRI
            // configuration as JSON, tens of KiB.
            kata_topo_kubelet::grpc::unary(
                stream,
                "/runtime.v1.RuntimeService/Status",
                &[0x08, 0x01],
                1 << 20,
            )
            .await
            .map_err(|e| format!("the CRI's Status failed: {e}"))
        };
        tokio::time::timeout(left, call)
            .await
            .unwrap_or_else(|_| Err("the CRI's Status did not answer in time".to_string()))
    })?;
    let status = <StatusResponse as prost::Message>::decode(bytes::Bytes::from(answer))
        .map_err(|e| format!("the CRI's Status answer is not one: {e}"))?;
    status
        .info
        .get("config")
        .cloned()
        .ok_or_else(|| "the CRI's Status answer carries no configuration".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler<'a>(config: Option<&'a Path>) -> Handler<'a> {
        Handler {
            name: "kata-topo",
            runtime_path: Path::new("/opt/kata-topo/bin/containerd-shim-kata-topo-v2"),
            config_path: config,
        }
    }

    #[test]
    fn the_main_configuration_names_its_imports_and_socket() {
        let m = parse_main(
            "version = 2\nimports = [\"/etc/other.toml\", \"/etc/containerd/conf.d/*.toml\"]\n[grpc]\naddress = \"/run/c.sock\"\n",
            Path::new("/etc/containerd/config.toml"),
        )
        .expect("parse");
        assert_eq!(m.imports_dir, Some(PathBuf::from("/etc/containerd/conf.d")));
        assert_eq!(m.socket, PathBuf::from("/run/c.sock"));
        let m = parse_main(
            "imports = ['conf.d/*.toml']\n",
            Path::new("/etc/containerd/config.toml"),
        )
        .expect("parse");
        assert_eq!(
            m.imports_dir, None,
            "relative: containerd 1.6's working directory's"
        );
        assert_eq!(m.socket, PathBuf::from("/run/containerd/containerd.sock"));
        for none in [
            "version = 2\n",
            "imports = [\"/etc/a.toml\"]\n",
            "imports = [\"/x/../y/*.toml\"]\n",
            "[plugins]\nimports = [\"/etc/d/*.toml\"]\n",
        ] {
            assert_eq!(
                parse_main(none, Path::new("/etc/c.toml"))
                    .expect("parse")
                    .imports_dir,
                None,
                "{none}"
            );
        }
        assert!(parse_main("imports = [", Path::new("/etc/c.toml")).is_err());
    }

    #[test]
    fn the_v3_dropin_is_the_handler_alone() {
        let d = dropin_v3(&handler(Some(Path::new("/opt/kata-topo/share/c.toml"))));
        assert!(has_marker(&d.text));
        assert_eq!(d.mode, 0o644);
        let t: DocumentMut = d.text.parse().expect("TOML");
        let rt =
            &t["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["kata-topo"];
        assert_eq!(
            rt["runtime_type"].as_str(),
            Some("io.containerd.kata-topo.v2")
        );
        assert_eq!(
            rt["options"]["ConfigPath"].as_str(),
            Some("/opt/kata-topo/share/c.toml")
        );
        assert!(names_prefix(&d.text, Path::new("/opt/kata-topo")));
        let d = dropin_v3(&handler(None));
        assert!(!d.text.contains("ConfigPath"));
    }

    #[test]
    fn the_v2_dropin_keeps_the_cri_section_and_guards_its_secrets() {
        let dump = r#"version = 2
root = "/var/lib/containerd"
[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "example.org/pause:9"
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "fast"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.fast]
          runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata-topo]
          runtime_type = "stale"
    [plugins."io.containerd.grpc.v1.cri".registry]
      [plugins."io.containerd.grpc.v1.cri".registry.configs]
        [plugins."io.containerd.grpc.v1.cri".registry.configs."r.example".auth]
          username = "ops"
          password = ""
  [plugins."io.containerd.internal.v1.opt"]
    path = "/opt/containerd"
"#;
        let d = dropin_v2(&handler(None), dump, "containerd config dump").expect("dropin");
        assert_eq!(d.mode, 0o644, "an empty password is no secret");
        let t: DocumentMut = d.text.parse().expect("TOML");
        let cri = &t["plugins"][CRI_V2];
        assert_eq!(cri["sandbox_image"].as_str(), Some("example.org/pause:9"));
        assert_eq!(
            cri["containerd"]["default_runtime_name"].as_str(),
            Some("fast")
        );
        assert_eq!(
            cri["containerd"]["runtimes"]["kata-topo"]["runtime_type"].as_str(),
            Some("io.containerd.kata-topo.v2")
        );
        assert!(t["plugins"].get("io.containerd.internal.v1.opt").is_none());
        assert!(t.get("root").is_none());
        let with_secret = dump.replace("password = \"\"", "password = \"s3cret\"");
        let d = dropin_v2(&handler(None), &with_secret, "containerd config dump").expect("dropin");
        assert_eq!(d.mode, 0o600);
        let inline = dump.replace(
            "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"r.example\".auth]\n          username = \"ops\"\n          password = \"\"",
            "[plugins.\"io.containerd.grpc.v1.cri\".registry.configs.\"r.example\"]\n          auth = { auth = \"b3BzOnMzY3JldA==\" }",
        );
        let d = dropin_v2(&handler(None), &inline, "containerd config dump").expect("dropin");
        assert_eq!(d.mode, 0o600, "{}", d.text);
        assert!(dropin_v2(&handler(None), "[", "x").is_err());
    }

    #[test]
    fn versions_host_commands_and_loaded_handlers() {
        assert_eq!(major_of("containerd://1.6.20~ds1"), Ok(1));
        assert_eq!(major_of("containerd://v2.3.4"), Ok(2));
        assert!(major_of("cri-o://1.30.0").is_err());
        assert!(major_of("containerd://x").is_err());
        assert_eq!(
            HostExec::parse("nsenter -t 1 -m -u -i -n -p --"),
            Ok(HostExec::Enter {
                pid: 1,
                namespaces: vec!["mnt", "uts", "ipc", "net", "pid"]
            })
        );
        assert_eq!(HostExec::parse("  "), Ok(HostExec::Here));
        assert_eq!(
            HostExec::parse("chroot /host"),
            Ok(HostExec::Through(vec!["chroot".into(), "/host".into()]))
        );
        assert!(HostExec::parse("nsenter -m --").is_err());
        assert!(HostExec::parse("nsenter -t 1 -U --").is_err());
        let ran = run_on_host(
            &HostExec::Here,
            "echo out; echo err >&2",
            Duration::from_secs(20),
        )
        .expect("ran");
        assert_eq!(ran.stdout, b"out\n");
        assert_eq!(ran.stderr_tail, "err");
        let e = run_on_host(
            &HostExec::Here,
            "echo no >&2; exit 3",
            Duration::from_secs(20),
        )
        .expect_err("failed");
        assert!(e.contains("exit status: 3") && e.contains("no"), "{e}");
        let e = run_on_host(&HostExec::Here, "sleep 30 & wait", Duration::from_secs(1))
            .expect_err("too long");
        assert!(e.contains("did not end within 1 s"), "{e}");

        let cfg = r#"{"containerd":{"runtimes":{"runc":{"runtimeType":"io.containerd.runc.v2"},"kata-topo":{"runtimeType":"io.containerd.kata-topo.v2"}}}}"#;
        assert_eq!(
            loaded(cfg, "kata-topo", "io.containerd.kata-topo.v2"),
            Ok(())
        );
        let e = loaded(cfg, "other", "io.containerd.other.v2").expect_err("missing");
        assert!(
            e.contains("runc, kata-topo") || e.contains("kata-topo, runc"),
            "{e}"
        );
        assert!(loaded(cfg, "runc", "io.containerd.kata-topo.v2").is_err());
        let e = check_loaded(
            Path::new("/nonexistent.sock"),
            "x",
            "y",
            Duration::from_millis(300),
        )
        .expect_err("no containerd");
        assert!(e.contains("cannot connect"), "{e}");
    }
}
