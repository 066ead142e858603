//! `kata-topo check`: checks one request (a create, a recreate or an update) on the host and
//! prints the verdict, for people or as JSON; exit 1 when it has an `error` finding. Its
//! inputs are read bounded, at most one of them from standard input.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use kata_topo_core::check::{Request, Running};
use kata_topo_core::files;
use kata_topo_core::input::affinity::{NodeLabels, NodeView, PodPlacement};
use kata_topo_core::input::kata::KataConfig;
use kata_topo_core::input::kubelet::KubeletSettings;
use kata_topo_core::input::spec::{RequestError, MAX_RESOURCES_BYTES, MAX_SPEC_BYTES};
use kata_topo_core::vm::VmView;
use kata_topo_core::{
    Baseline, Checker, ContainerSpec, Defaults, Mode, PodOverrides, Policy, Resources, Verdict,
};

use crate::commands::HostArgs;
use crate::out;

/// The largest baseline accepted (one is a few hundred bytes).
const MAX_BASELINE_BYTES: u64 = 1024 * 1024;

#[derive(Debug, Args)]
pub(crate) struct CheckArgs {
    /// The container's OCI spec (a bundle's config.json). Optional with --node-labels: the
    /// pod's node affinity is then checked alone.
    #[arg(
        long,
        value_name = "CONFIG.json",
        required_unless_present = "node_labels"
    )]
    spec: Option<PathBuf>,
    /// An OCI LinuxResources JSON: check an update of the container instead of its create.
    #[arg(long, value_name = "RESOURCES.json")]
    update: Option<PathBuf>,
    /// The container's baseline: a create becomes a recreate, and updates are held to it.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Write the baseline a first create of this spec records.
    #[arg(long, value_name = "OUT.json")]
    record_baseline: Option<PathBuf>,
    #[command(flatten)]
    host: HostArgs,
    /// The node's policy (`default_policy`; default restricted): the pod's annotation
    /// applies over it only as far as --pod-overrides allows.
    #[arg(long, value_name = "P")]
    policy: Option<Policy>,
    /// The node's mode (`mode`; default audit): the pod's annotation applies over it only
    /// as far as --pod-overrides allows.
    #[arg(long, value_name = "M")]
    mode: Option<Mode>,
    /// How far the pod's annotations may move --policy, --mode and the baseline's nodes:
    /// stricter-only (default), any or none, as `pod_overrides` on the node.
    #[arg(long, value_name = "O")]
    pod_overrides: Option<PodOverrides>,
    /// Kata's configuration file (its `config.d/` drop-ins are read too): enables
    /// `vcpu-pinning-lost` and `guest-numa-uncovered`.
    #[arg(long, value_name = "FILE")]
    kata_config: Option<PathBuf>,
    /// The running VMM's pid: enables `vcpu-affinity-drift` and `vcpu-overlap`.
    #[arg(long, value_name = "PID")]
    vm_pid: Option<u32>,
    /// The procfs root for --vm-pid.
    #[arg(long, value_name = "ROOT", default_value = "/proc")]
    procfs: PathBuf,
    /// A recorded PodResources answer of the kubelet (List or Get, JSON): the pod of the
    /// spec's CRI annotations is found in it, and what the kubelet admitted is the intent.
    #[arg(long, value_name = "FILE")]
    pod_resources: Option<PathBuf>,
    /// The kubelet's configuration for --pod-resources (its Topology Manager policy and
    /// scope). Without it, the Topology Manager's policy is --policy and its scope
    /// `container`.
    #[arg(long, value_name = "FILE", requires = "pod_resources")]
    kubelet_config: Option<PathBuf>,
    /// A recorded Node (JSON, as `kubectl get node NAME -o json` prints it): the pod of
    /// --pod-spec has its nodeSelector and node affinity checked against its labels.
    #[arg(long, value_name = "FILE", requires = "pod_spec")]
    node_labels: Option<PathBuf>,
    /// A recorded Pod (JSON, as `kubectl get pod -n NS NAME -o json` prints it), for
    /// --node-labels.
    #[arg(long, value_name = "FILE", requires = "node_labels")]
    pod_spec: Option<PathBuf>,
    /// The Node as it was at the pod's first create (the label baseline): labels the pod's
    /// terms name that changed since are `node-labels-changed`.
    #[arg(long, value_name = "FILE", requires = "node_labels")]
    label_baseline: Option<PathBuf>,
    /// Print the verdict as JSON.
    #[arg(long)]
    json: bool,
}

/// The largest recorded Node or Pod accepted.
const MAX_OBJECT_BYTES: u64 = 4 * 1024 * 1024;

/// The node-affinity inputs (--pod-spec, --node-labels, --label-baseline) as the wrapper's
/// read of the API server gives them to the core.
fn node_view(args: &CheckArgs) -> Result<Option<NodeView>> {
    let (Some(node), Some(pod)) = (&args.node_labels, &args.pod_spec) else {
        return Ok(None);
    };
    let read_node = |path: &PathBuf, what: &str| -> Result<NodeLabels> {
        NodeLabels::from_json(&read_input(path, MAX_OBJECT_BYTES, what)?)
            .with_context(|| format!("{what} {} is not a Node", input_name(path)))
    };
    Ok(Some(NodeView::Read {
        pod: PodPlacement::from_json(&read_input(pod, MAX_OBJECT_BYTES, "pod")?)
            .with_context(|| format!("pod {} is not a Pod", input_name(pod)))?,
        node: read_node(node, "node")?,
        baseline: args
            .label_baseline
            .as_ref()
            .map(|p| read_node(p, "label baseline"))
            .transpose()?,
    }))
}

/// `-`: standard input.
fn is_stdin(path: &Path) -> bool {
    path.as_os_str() == "-"
}

/// Reads one input whole: standard input for `-`, else a regular file; at most `limit` bytes.
fn read_input(path: &Path, limit: u64, what: &str) -> Result<Vec<u8>> {
    if is_stdin(path) {
        files::read_to_limit(std::io::stdin().lock(), limit)
            .with_context(|| format!("cannot read {what} from standard input"))
    } else {
        files::read_bounded(path, limit)
            .with_context(|| format!("cannot read {what} {}", path.display()))
    }
}

fn input_name(path: &Path) -> String {
    if is_stdin(path) {
        "standard input".to_string()
    } else {
        path.display().to_string()
    }
}

fn spec_error(e: RequestError, path: &Path) -> anyhow::Error {
    anyhow::Error::new(e).context(format!("in {}", input_name(path)))
}

pub(crate) fn check(args: &CheckArgs) -> Result<ExitCode> {
    let from_stdin = [
        args.spec.as_ref(),
        args.update.as_ref(),
        args.baseline.as_ref(),
        args.node_labels.as_ref(),
        args.pod_spec.as_ref(),
        args.label_baseline.as_ref(),
    ]
    .into_iter()
    .flatten()
    .filter(|p| is_stdin(p))
    .count();
    if from_stdin > 1 {
        anyhow::bail!(
            "only one of --spec, --update, --baseline, --pod-spec, --node-labels and \
             --label-baseline can be `-` (standard input)"
        );
    }
    let node_view = node_view(args)?;
    let node = Defaults::default();
    let defaults = Defaults {
        policy: args.policy.unwrap_or(node.policy),
        mode: args.mode.unwrap_or(node.mode),
        pod_overrides: args.pod_overrides.unwrap_or(node.pod_overrides),
        ..node
    };
    let spec = match (&args.spec, &node_view) {
        (Some(path), _) => ContainerSpec::from_json(&read_input(path, MAX_SPEC_BYTES, "OCI spec")?)
            .map_err(|e| spec_error(e, path))?,
        // The pod alone (clap requires --spec otherwise): its node affinity, through the same
        // phases as a container's request.
        (None, Some(NodeView::Read { pod, .. })) => ContainerSpec::pod_only(pod.pod_ref()),
        (None, _) => anyhow::bail!("--spec or --node-labels is required"),
    };
    let update = match (&args.update, &args.spec, &args.label_baseline) {
        (Some(path), _, _) => Some(
            Resources::from_json(&read_input(path, MAX_RESOURCES_BYTES, "LinuxResources")?)
                .map_err(|e| spec_error(e, path))?,
        ),
        // The pod alone, held to its label baseline: an update that changes nothing (`noop`),
        // as the wrapper reads the node again at a resize.
        (None, None, Some(_)) => Some(Resources::default()),
        _ => None,
    };
    let baseline: Option<Baseline> = match &args.baseline {
        Some(path) => Some(
            serde_json::from_slice(&read_input(path, MAX_BASELINE_BYTES, "baseline")?)
                .with_context(|| format!("baseline {} is not valid", input_name(path)))?,
        ),
        None => None,
    };
    let kata = match &args.kata_config {
        // The node's; the core applies the pod's annotations over it.
        Some(path) => Some(KataConfig::load(path)?),
        None => None,
    };
    let view = match args.vm_pid {
        Some(pid) => Some(VmView::read(&args.procfs, pid)?),
        None => None,
    };
    let (host, sysfs) = args.host.load()?;
    // What the wrapper does on a node configured so: the pod's annotations over the node's
    // values, within pod_overrides (`defaults` above).
    let kubelet = match &args.pod_resources {
        Some(path) => {
            let settings = match &args.kubelet_config {
                Some(file) => {
                    KubeletSettings::read(file).map_err(|e| kata_topo_core::text::error_chain(&e))
                }
                None => Ok(KubeletSettings {
                    topology_manager_policy: defaults.policy,
                    ..KubeletSettings::default()
                }),
            };
            let namespace = spec.pod.namespace.as_deref().unwrap_or_default();
            let name = spec.pod.name.as_deref().unwrap_or_default();
            Some(crate::commands::intent::recorded(
                path, settings, namespace, name,
            )?)
        }
        None => None,
    };
    let checker = Checker::new(&host, sysfs.as_ref(), defaults);
    if let Some(out) = &args.record_baseline {
        let recorded = checker.record_baseline(&spec);
        let text = serde_json::to_string_pretty(&recorded)?;
        std::fs::write(out, text + "\n")
            .with_context(|| format!("cannot write baseline {}", out.display()))?;
    }
    let request = Request {
        kata: kata.as_ref(),
        vm: view.as_ref(),
        kubelet: kubelet.as_ref(),
        node: node_view.as_ref(),
        ..Request::new(&spec)
    };
    let verdict = match (&update, &baseline) {
        (Some(update), baseline) => {
            let running = Running {
                baseline: baseline.as_ref(),
                ..Running::default()
            };
            checker.update(&request, running, update)
        }
        (None, Some(baseline)) => checker.recreate(&request, baseline),
        (None, None) => checker.admit(&request),
    };
    print(&verdict, args.json)
}

/// Prints the verdict; exit 1 when it has an `error` finding.
fn print(verdict: &Verdict, json: bool) -> Result<ExitCode> {
    if json {
        out::json(&serde_json::to_string_pretty(verdict)?)?;
    } else {
        out::lines(&verdict.human())?;
    }
    Ok(if verdict.has_error() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
