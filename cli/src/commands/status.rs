//! `kata-topo status`: the sandboxes the wrappers watch, read from their state directory, with
//! their baselines and latest findings, and whether each wrapper still serves; the exit code
//! tells clean, findings or unreadable state apart (a node-problem-detector custom plugin).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_core::state::PodState;

use crate::out::{self, outln};

#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The wrappers' state directory (`state_dir` in [topology_guard]).
    #[arg(long, value_name = "DIR", default_value = "/run/kata-topo")]
    state_dir: PathBuf,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn status(args: &StatusArgs) -> Result<ExitCode> {
    let pods = kata_topo_core::state::list(&args.state_dir)
        .with_context(|| format!("cannot read state directory {}", args.state_dir.display()))?;
    let findings: usize = pods
        .iter()
        .flat_map(|p| &p.verdicts)
        .map(|(_, v)| v.findings.len())
        .sum();
    let unreadable: usize = pods.iter().map(|p| p.unreadable.len()).sum();
    let wrappers: Vec<Wrapper> = pods.iter().map(Wrapper::of).collect();
    let dead = wrappers.iter().filter(|w| **w == Wrapper::Dead).count();
    if args.json {
        let sandboxes = pods
            .iter()
            .zip(&wrappers)
            .map(|(p, w)| {
                let mut v = serde_json::to_value(p)?;
                if let Some(o) = v.as_object_mut() {
                    o.insert("wrapper".into(), w.as_str().into());
                }
                Ok(v)
            })
            .collect::<Result<Vec<_>, serde_json::Error>>()?;
        out::json(&serde_json::to_string_pretty(&serde_json::json!({
            "sandboxes": sandboxes, "findings": findings, "unreadable": unreadable,
            "dead_wrappers": dead
        }))?)?;
    } else {
        if pods.is_empty() {
            outln!(
                "no sandbox watched (state directory {})",
                args.state_dir.display()
            );
        }
        for (p, wrapper) in pods.iter().zip(&wrappers) {
            let pod = p
                .verdicts
                .iter()
                .map(|(_, v)| &v.pod)
                .find(|pod| pod.name.is_some())
                .map(|pod| {
                    format!(
                        " pod {}/{}",
                        pod.namespace.as_deref().unwrap_or("-"),
                        pod.name.as_deref().unwrap_or("-")
                    )
                })
                .unwrap_or_default();
            outln!(
                "sandbox {} ({}){pod}: {} container baseline(s), {} task(s)",
                p.sandbox_id,
                p.namespace,
                p.containers.len(),
                p.tasks.len()
            );
            if let Some(d) = &p.daemon {
                outln!(
                    "  wrapper pid {} {}: configuration {} (from {}), delegate {}",
                    d.wrapper.pid,
                    match wrapper {
                        Wrapper::Dead => "dead (its state waits for containerd's delete)",
                        _ => wrapper.as_str(),
                    },
                    d.config
                        .as_ref()
                        .map_or("none (built-in defaults)".to_string(), |c| c
                            .display()
                            .to_string()),
                    d.config_source,
                    d.delegate_address.trim_start_matches("unix://"),
                );
                if let Some(a) = &d.node_affinity {
                    outln!("  node affinity: {a}");
                }
                if let Some(e) = &d.pod_events {
                    outln!("  pod events: {e}");
                }
            }
            for (name, b) in &p.containers {
                outln!(
                    "  baseline {name}: cpus {} on node {}, {} VFIO device(s)",
                    b.cpus.as_ref().map_or("-".to_string(), ToString::to_string),
                    if b.cpu_nodes.is_empty() {
                        "-".to_string()
                    } else {
                        b.cpu_nodes.to_string()
                    },
                    b.devices.len()
                );
            }
            for (task, v) in &p.verdicts {
                for f in &v.findings {
                    outln!(
                        "  {task} {} {} {}: {}",
                        v.operation,
                        f.severity,
                        f.rule,
                        f.message
                    );
                }
            }
            for u in &p.unreadable {
                outln!("  unreadable: {u}");
            }
        }
        if dead > 0 {
            outln!("{findings} finding(s), {dead} dead wrapper(s)");
        } else {
            outln!("{findings} finding(s)");
        }
    }
    Ok(ExitCode::from(if unreadable > 0 {
        2
    } else if findings > 0 {
        1
    } else {
        0
    }))
}

/// Whether a pod's wrapper daemon still runs, told the way `delete` tells it: by the pid and
/// start time it recorded (a socket may still accept for a moment after its daemon died).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wrapper {
    /// It runs.
    Serving,
    /// It is gone (killed, crashed); what it left waits for containerd's `delete`.
    Dead,
    /// It recorded nothing (yet).
    Unknown,
}

impl Wrapper {
    fn of(p: &PodState) -> Self {
        match &p.daemon {
            Some(d) if d.wrapper.is_alive(Path::new("/proc")) => Self::Serving,
            Some(_) => Self::Dead,
            None => Self::Unknown,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Self::Serving => "serving",
            Self::Dead => "dead",
            Self::Unknown => "unknown",
        }
    }
}
