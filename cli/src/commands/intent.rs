//! `kata-topo intent --pod NS/NAME`: what the kubelet admitted for a pod — each container's
//! exclusive CPUs, memory nodes and devices with their topology — under the node's kubelet
//! settings, and where that intent comes from. Asks the kubelet's PodResources socket as the
//! wrapper does (same deadline, same refusals), or reads a recorded answer
//! (`--pod-resources`). Exit 0 when the kubelet gave the intent, 1 when it gave none (the
//! reason is printed: the wrapper would fall back to annotations and baseline), 2 on bad
//! usage.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_core::config::Config;
use kata_topo_core::input::kubelet::{KubeletSettings, KubeletView, PodAdmission};
use kata_topo_kubelet::PodResourcesClient;
use serde_json::json;

use crate::out;

/// The largest recorded answer read.
const MAX_POD_RESOURCES_BYTES: u64 = 4 * 1024 * 1024;

#[derive(Debug, Args)]
pub(crate) struct IntentArgs {
    /// The pod, as NAMESPACE/NAME.
    #[arg(long, value_name = "NS/NAME")]
    pod: String,
    /// The kubelet's PodResources socket. Default: `kubelet_pod_resources_socket` of the
    /// node's [topology_guard] (KATA_TOPO_CONFIG, else Kata's default paths).
    #[arg(long, value_name = "SOCK")]
    socket: Option<PathBuf>,
    /// The kubelet's configuration, read alone. Default: `kubelet_config` of the node's
    /// [topology_guard], with the drop-ins of its `kubelet_config_dir`.
    #[arg(long, value_name = "FILE")]
    kubelet_config: Option<PathBuf>,
    /// The deadline of the question, in milliseconds. Default: `kubelet_timeout_ms`.
    #[arg(long, value_name = "MS")]
    timeout_ms: Option<u64>,
    /// A recorded PodResources answer (List or Get, JSON) instead of the live socket.
    #[arg(long, value_name = "FILE")]
    pod_resources: Option<PathBuf>,
    /// Print the intent as JSON.
    #[arg(long)]
    json: bool,
}

/// Splits `NS/NAME`.
pub(crate) fn pod_name(pod: &str) -> Result<(&str, &str)> {
    match pod.split_once('/') {
        Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
            Ok((ns, name))
        }
        _ => anyhow::bail!("--pod must be NAMESPACE/NAME, not {pod:?}"),
    }
}

/// The pod `namespace/name` of a recorded answer, under `settings`.
pub(crate) fn recorded(
    path: &std::path::Path,
    settings: Result<KubeletSettings, String>,
    namespace: &str,
    name: &str,
) -> Result<KubeletView> {
    let text = kata_topo_core::files::read_text_bounded(path, MAX_POD_RESOURCES_BYTES)
        .with_context(|| format!("cannot read the PodResources answer {}", path.display()))?;
    let pods = PodAdmission::from_json(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a PodResources answer: {e}", path.display()))?;
    let settings = match settings {
        Ok(s) => s,
        Err(reason) => return Ok(KubeletView::Unavailable { reason }),
    };
    Ok(
        match pods
            .into_iter()
            .find(|p| p.namespace == namespace && p.name == name)
        {
            Some(pod) => KubeletView::Admitted { pod, settings },
            None => KubeletView::Unavailable {
                reason: format!("the recorded answer has no pod {namespace}/{name}"),
            },
        },
    )
}

pub(crate) fn intent(args: &IntentArgs) -> Result<ExitCode> {
    let (namespace, name) = pod_name(&args.pod)?;
    let node = Config::resolve(None)?.config;
    // An explicit configuration file is read alone; the node's with its drop-ins.
    let (kubelet_config, kubelet_config_dir) = match &args.kubelet_config {
        Some(file) => (file.clone(), None),
        None => (node.kubelet_config, node.kubelet_config_dir),
    };
    let view = match &args.pod_resources {
        Some(path) => {
            let settings =
                KubeletSettings::read_merged(&kubelet_config, kubelet_config_dir.as_deref())
                    .map_err(|e| kata_topo_core::text::error_chain(&e));
            recorded(path, settings, namespace, name)?
        }
        None => {
            let socket = args
                .socket
                .clone()
                .unwrap_or(node.kubelet_pod_resources_socket);
            let timeout = args.timeout_ms.unwrap_or(node.kubelet_timeout_ms);
            let client = PodResourcesClient::new(socket, Duration::from_millis(timeout));
            kata_topo_kubelet::ask(
                &client,
                &kubelet_config,
                kubelet_config_dir.as_deref(),
                namespace,
                name,
            )
        }
    };
    let (value, code) = match &view {
        KubeletView::Admitted { pod, settings } => (
            json!({
                "pod": {"namespace": pod.namespace, "name": pod.name},
                "intent_source": "kubelet",
                "kubelet": {"settings": settings, "containers": pod.containers},
            }),
            ExitCode::SUCCESS,
        ),
        KubeletView::Unavailable { reason } => (
            json!({
                "pod": {"namespace": namespace, "name": name},
                "intent_source": "annotations",
                "kubelet_unavailable": reason,
            }),
            ExitCode::from(1),
        ),
    };
    if args.json {
        out::json(&serde_json::to_string_pretty(&value)?)?;
    } else {
        out::lines(&human(namespace, name, &view))?;
    }
    Ok(code)
}

fn human(namespace: &str, name: &str, view: &KubeletView) -> String {
    let mut out = format!("pod {namespace}/{name}\n");
    match view {
        KubeletView::Unavailable { reason } => {
            out += &format!(
                "intent source: annotations and baseline (the kubelet gave none: {reason})\n"
            );
        }
        KubeletView::Admitted { pod, settings } => {
            out += &format!(
                "intent source: kubelet (Topology Manager {} scope {}, CPU manager {}, memory manager {})\n",
                settings.topology_manager_policy,
                settings.topology_manager_scope,
                settings.cpu_manager_policy,
                settings.memory_manager_policy
            );
            for c in &pod.containers {
                let cpus = if c.cpu_ids.is_empty() {
                    "shared pool".to_string()
                } else {
                    c.cpu_ids.to_string()
                };
                out += &format!("  container {}: exclusive CPUs {cpus}", c.name);
                let mems = c.memory_nodes();
                if !mems.is_empty() {
                    out += &format!(", memory on node(s) {mems}");
                }
                out += "\n";
                for d in &c.devices {
                    let nodes = if d.numa_nodes.is_empty() {
                        "no topology".to_string()
                    } else {
                        format!("node(s) {}", d.numa_nodes)
                    };
                    out += &format!(
                        "    {} {} ({nodes})\n",
                        d.resource_name,
                        d.device_ids.join(",")
                    );
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../core/tests/fixtures/pod-resources/list.json")
    }

    #[test]
    fn a_pod_is_namespace_slash_name() {
        assert_eq!(pod_name("default/p").expect("valid"), ("default", "p"));
        for bad in ["p", "/p", "default/", "a/b/c", ""] {
            assert!(pod_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_recorded_answer_gives_the_pods_intent_or_says_why_not() {
        let settings = || Ok(KubeletSettings::default());
        match recorded(&fixture(), settings(), "default", "guaranteed").expect("reads") {
            KubeletView::Admitted { pod, .. } => {
                let app = pod.container("app").expect("app");
                assert_eq!(app.cpu_ids.to_string(), "1");
                let text = human(
                    "default",
                    "guaranteed",
                    &KubeletView::Admitted {
                        pod: pod.clone(),
                        settings: KubeletSettings::default(),
                    },
                );
                assert!(
                    text.contains("exclusive CPUs 1, memory on node(s) 1"),
                    "{text}"
                );
                assert!(
                    text.contains("kata-topo.io/vfio 0000:81:00.0 (node(s) 1)"),
                    "{text}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            recorded(&fixture(), settings(), "default", "missing").expect("reads"),
            KubeletView::Unavailable { reason } if reason.contains("default/missing")
        ));
        assert!(matches!(
            recorded(&fixture(), Err("no config".into()), "default", "guaranteed").expect("reads"),
            KubeletView::Unavailable { reason } if reason == "no config"
        ));
        let dir = tempfile::tempdir().expect("tempdir");
        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{\"pod_resources\": 3}").expect("write");
        assert!(recorded(&bad, settings(), "default", "guaranteed").is_err());
    }
}
