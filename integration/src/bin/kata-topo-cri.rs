//! `kata-topo-cri`: the few kubelet actions the end-to-end scenario needs (run a pod, start a
//! container, update its resources, look at it, remove it), as a CRI client — so the same
//! scenario script drives the CI containerd where there is no kubelet and no crictl.
//!
//! ```text
//! kata-topo-cri --endpoint SOCK run-pod NAME [--handler H] [--annotation K=V]...
//! kata-topo-cri --endpoint SOCK start POD NAME --cpus C [--quota Q] [--memory BYTES] [--vfio NODE]
//!                                  [--annotation K=V]... [--attempt N]
//! kata-topo-cri --endpoint SOCK update ID --cpus C [--quota Q] [--memory BYTES]
//! kata-topo-cri --endpoint SOCK status ID          # prints "STATE CPUS"
//! kata-topo-cri --endpoint SOCK info ID            # containerd's verbose container info (JSON)
//! kata-topo-cri --endpoint SOCK pod-ready POD      # prints READY or NOT_READY
//! kata-topo-cri --endpoint SOCK exec ID -- CMD...  # ExecSync: CMD's stdout, exit with its code
//! kata-topo-cri --endpoint SOCK remove-container ID | remove-pod POD
//! ```
//! Pod configurations are kept in `$KT_CRI_DIR` (default `/tmp/kata-topo-cri`), since creating
//! a container needs its pod's configuration again. Exit 0 on success; 1 with the gRPC code and
//! message on stderr when CRI refuses; 2 on bad usage.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use kata_topo_integration::{Container, Cri, Resources, RUNNING};

fn usage(why: &str) -> ExitCode {
    eprintln!("kata-topo-cri: {why} (see the comment at the top of kata-topo-cri.rs)");
    ExitCode::from(2)
}

fn flag(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn flags(args: &[String], name: &str) -> Vec<String> {
    args.windows(2)
        .filter(|w| w[0] == name)
        .map(|w| w[1].clone())
        .collect()
}

fn res(args: &[String]) -> Resources {
    let cpus: &'static str = Box::leak(flag(args, "--cpus").unwrap_or_default().into_boxed_str());
    Resources {
        cpus,
        quota: flag(args, "--quota")
            .and_then(|q| q.parse().ok())
            .unwrap_or(100_000),
        memory: flag(args, "--memory")
            .and_then(|m| m.parse().ok())
            .unwrap_or(256 << 20),
        ..Resources::default()
    }
}

fn pairs(args: &[String], name: &str) -> Vec<(String, String)> {
    flags(args, name)
        .iter()
        .filter_map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
        })
        .collect()
}

fn refused(status: &tonic::Status) -> ExitCode {
    eprintln!("{:?}: {}", status.code(), status.message());
    ExitCode::from(1)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let Some(endpoint) = flag(&argv, "--endpoint") else {
        return usage("--endpoint SOCK is required");
    };
    let store =
        PathBuf::from(std::env::var("KT_CRI_DIR").unwrap_or_else(|_| "/tmp/kata-topo-cri".into()));
    if std::fs::create_dir_all(&store).is_err() {
        return usage("cannot create $KT_CRI_DIR");
    }
    // Everything after `--` is the command of `exec`, never a flag of ours.
    let (argv, command_line) = match argv.iter().position(|a| a == "--") {
        Some(i) => (argv[..i].to_vec(), argv[i + 1..].to_vec()),
        None => (argv.clone(), Vec::new()),
    };
    let rest: Vec<String> = argv
        .iter()
        .enumerate()
        .filter(|(i, a)| *a != "--endpoint" && (*i == 0 || argv[i - 1] != "--endpoint"))
        .map(|(_, a)| a.clone())
        .collect();
    let Some(command) = rest.first().cloned() else {
        return usage("no command");
    };
    let vfio = flag(&rest, "--vfio").map(PathBuf::from);
    let mut cri = Cri::connect(
        Path::new(&endpoint),
        &store.join("logs"),
        vfio.as_deref().unwrap_or(Path::new("/dev/null")),
    );
    let pod_file = |pod: &str| store.join(format!("pod-{pod}.json"));
    match command.as_str() {
        "run-pod" => {
            let Some(name) = rest.get(1) else {
                return usage("run-pod NAME");
            };
            let annotations = pairs(&rest, "--annotation");
            let pairs: Vec<(&str, &str)> = annotations
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let config = cri.pod_config(name, &pairs);
            let handler = flag(&rest, "--handler").unwrap_or_else(|| "kata-topo".into());
            match cri.run_pod(&config, &handler) {
                Ok(id) => {
                    let _ = std::fs::write(
                        pod_file(&id),
                        serde_json::to_vec(&config).unwrap_or_default(),
                    );
                    println!("{id}");
                    ExitCode::SUCCESS
                }
                Err(s) => refused(&s),
            }
        }
        "start" => {
            let (Some(pod), Some(name)) = (rest.get(1), rest.get(2)) else {
                return usage("start POD NAME --cpus C");
            };
            let Some(config) = std::fs::read(pod_file(pod))
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
            else {
                return usage("unknown pod (run it with this tool first)");
            };
            let Ok(attempt) = flag(&rest, "--attempt").map_or(Ok(0), |a| a.parse::<u32>()) else {
                return usage("--attempt N");
            };
            let (resources, annotations) = (res(&rest), pairs(&rest, "--annotation"));
            let container = Container {
                name,
                resources: &resources,
                annotations: &annotations,
                attempt,
            };
            let created = cri.create_container_as(pod, &config, &container, vfio.is_some());
            match created.and_then(|id| cri.start(&id).map(|()| id)) {
                Ok(id) => {
                    println!("{id}");
                    ExitCode::SUCCESS
                }
                Err(s) => refused(&s),
            }
        }
        "update" => {
            let Some(id) = rest.get(1) else {
                return usage("update ID --cpus C");
            };
            match cri.update(id, &res(&rest)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(s) => refused(&s),
            }
        }
        "status" => {
            let Some(id) = rest.get(1) else {
                return usage("status ID");
            };
            let (state, _) = cri.status(id);
            let running = state == RUNNING;
            let cpus = if running {
                cri.allowed_cpus(id)
            } else {
                "-".into()
            };
            println!("{} {cpus}", if running { "RUNNING" } else { "NOT_RUNNING" });
            ExitCode::SUCCESS
        }
        "info" => {
            let Some(id) = rest.get(1) else {
                return usage("info ID");
            };
            let (state, info) = cri.status(id);
            println!("{}", serde_json::json!({"state": state, "info": info}));
            ExitCode::SUCCESS
        }
        "pod-ready" => {
            let Some(pod) = rest.get(1) else {
                return usage("pod-ready POD");
            };
            match cri.pod_ready(pod) {
                Ok(ready) => {
                    println!("{}", if ready { "READY" } else { "NOT_READY" });
                    ExitCode::SUCCESS
                }
                Err(s) => refused(&s),
            }
        }
        "exec" => {
            let Some(id) = rest.get(1) else {
                return usage("exec ID -- CMD...");
            };
            if command_line.is_empty() {
                return usage("exec ID -- CMD...");
            }
            match cri.exec_sync(id, &command_line, std::time::Duration::from_secs(60)) {
                Ok((code, stdout, stderr)) => {
                    use std::io::Write;
                    let _ = std::io::stdout().write_all(&stdout);
                    let _ = std::io::stderr().write_all(&stderr);
                    ExitCode::from(code.clamp(0, 255) as u8)
                }
                Err(s) => refused(&s),
            }
        }
        "remove-container" => match rest.get(1) {
            Some(id) => {
                cri.remove_container(id);
                ExitCode::SUCCESS
            }
            None => usage("remove-container ID"),
        },
        "remove-pod" => match rest.get(1) {
            Some(pod) => {
                cri.remove_pod(pod);
                let _ = std::fs::remove_file(pod_file(pod));
                ExitCode::SUCCESS
            }
            None => usage("remove-pod POD"),
        },
        other => usage(&format!("unknown command {other:?}")),
    }
}
