//! `kata-topo status`: the sandboxes the wrappers watch, read from their state directory, with
//! their baselines and latest findings; the exit code tells clean, findings or unreadable state
//! apart (a node-problem-detector custom plugin).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;

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
    if args.json {
        out::json(&serde_json::to_string_pretty(&serde_json::json!({
            "sandboxes": pods, "findings": findings, "unreadable": unreadable
        }))?)?;
    } else {
        if pods.is_empty() {
            outln!(
                "no sandbox watched (state directory {})",
                args.state_dir.display()
            );
        }
        for p in &pods {
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
                    "  wrapper pid {}: configuration {} (from {}), delegate {}",
                    d.wrapper.pid,
                    d.config
                        .as_ref()
                        .map_or("none (built-in defaults)".to_string(), |c| c
                            .display()
                            .to_string()),
                    d.config_source,
                    d.delegate_address.trim_start_matches("unix://"),
                );
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
        outln!("{findings} finding(s)");
    }
    Ok(ExitCode::from(if unreadable > 0 {
        2
    } else if findings > 0 {
        1
    } else {
        0
    }))
}
