//! `kata-topo vm`: a running VMM's vCPU threads and their host CPUs, its memory policy and its
//! guest NUMA layout, as lines for people or JSON.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use kata_topo_core::text::printable;
use kata_topo_core::vm::{Accel, Identity, VmReader};

use crate::out::{self, outln};

#[derive(Debug, Args)]
pub(crate) struct VmArgs {
    /// The VMM's pid, or the pid of a process whose child it is (the pid in Kata's Create
    /// reply: the VMM's with the Go runtime, the shim's with runtime-rs).
    #[arg(long)]
    pid: u32,
    /// The procfs root.
    #[arg(long, value_name = "ROOT", default_value = "/proc")]
    procfs: PathBuf,
    /// KVM's debugfs directory. Default: /sys/kernel/debug/kvm with the live /proc, none with
    /// another --procfs.
    #[arg(long, value_name = "DIR")]
    kvm_debugfs: Option<PathBuf>,
    /// The user the runtime runs VMMs as: a process of another user is not taken for one.
    #[arg(long, value_name = "UID", default_value_t = 0)]
    owner: u32,
    /// The configured hypervisor (Kata's `[hypervisor.*] path`): a process running anything
    /// else is not taken for the VMM.
    #[arg(long, value_name = "PATH")]
    hypervisor: Option<PathBuf>,
    /// The sandbox id: the VMM's cgroup must name it (or its parents lead to --shim-pid).
    #[arg(long, value_name = "ID")]
    sandbox: Option<String>,
    /// The sandbox's shim: the VMM must descend from it (or its cgroup name --sandbox).
    #[arg(long, value_name = "PID")]
    shim_pid: Option<u32>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub(crate) fn vm(args: &VmArgs) -> Result<ExitCode> {
    let mut reader = VmReader::new(&args.procfs).with_identity(Identity {
        owner: Some(args.owner),
        hypervisor: args.hypervisor.clone(),
        sandbox_id: args.sandbox.clone(),
        shim_pid: args.shim_pid,
    });
    if let Some(dir) = &args.kvm_debugfs {
        reader = reader.with_kvm_debugfs(Some(dir.clone()));
    }
    let view = reader.read(args.pid)?;
    if args.json {
        out::json(&serde_json::to_string_pretty(&view)?)?;
        return Ok(ExitCode::SUCCESS);
    }
    let via = view
        .found_via
        .map_or(String::new(), |p| format!(", child of pid {p}"));
    if let Some(r) = &view.rejected {
        outln!(
            "pid {} ({}){via} looks like a VMM but is not the sandbox's: the {} check failed: {}",
            view.pid,
            printable(&view.comm),
            r.check.name(),
            printable(&r.reason)
        );
        return Ok(ExitCode::SUCCESS);
    }
    let Some(accel) = view.accel else {
        outln!(
            "pid {} ({}){via} is not a VMM: it holds no KVM vCPU fd and is not QEMU under TCG",
            view.pid,
            view.comm
        );
        for n in &view.notes {
            outln!("  note: {n}");
        }
        return Ok(ExitCode::SUCCESS);
    };
    outln!(
        "VMM pid {} ({}){via}: {}, {}",
        view.pid,
        view.comm,
        view.vmm.map_or("unrecognised VMM", |v| v.name()),
        match accel {
            Accel::Kvm => "KVM",
            Accel::Tcg => "TCG",
        }
    );
    let how = match accel {
        Accel::Kvm => format!(
            "KVM vCPU fds {}; threads sampled {} over {} ms",
            if view.kvm_vcpus.is_empty() {
                "-".to_string()
            } else {
                view.kvm_vcpus.to_string()
            },
            match view.sampling.samples {
                1 => "once".to_string(),
                n => format!("{n} times"),
            },
            view.sampling.window_ms
        ),
        Accel::Tcg => "no KVM: by thread name".to_string(),
    };
    outln!(
        "vCPUs: {}, {} tied to a thread ({how})",
        view.vcpu_count(),
        view.vcpus.len()
    );
    for v in &view.vcpus {
        outln!(
            "  vCPU {:<3} tid {:<8} host CPUs {:<12} {}",
            v.index,
            v.tid,
            v.allowed_cpus.to_string(),
            v.sources
                .iter()
                .map(|s| s.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for u in &view.unresolved {
        outln!("  vCPU {:<3} unresolved: {}", u.index, u.reason);
    }
    for d in &view.disagreements {
        outln!("  disagreement: {}", d.message);
    }
    for n in &view.notes {
        outln!("  note: {n}");
    }
    let policies: Vec<String> = view
        .memory_policies
        .iter()
        .map(|(p, n)| format!("{p} ×{n}"))
        .collect();
    outln!("memory policy (numa_maps): {}", policies.join(", "));
    if !view.memory_nodes.is_empty() {
        outln!("memory bound to host nodes: {}", view.memory_nodes);
    }
    for g in &view.guest_nodes {
        outln!(
            "guest node {}: vCPUs {} memory {} host nodes {} policy {}",
            g.node_id,
            g.cpus.as_ref().map_or("-".to_string(), ToString::to_string),
            g.memdev.as_deref().unwrap_or("-"),
            g.host_nodes
                .as_ref()
                .map_or("-".to_string(), ToString::to_string),
            g.policy.as_deref().unwrap_or("-")
        );
    }
    Ok(ExitCode::SUCCESS)
}
