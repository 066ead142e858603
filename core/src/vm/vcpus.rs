//! Which thread runs which vCPU, from several sources that are compared, never merged blindly.
//!
//! The kernel's word (`kvm-debugfs`, `kvm-fd`) is authoritative: a thread blocked in `KVM_RUN`
//! on the fd of vCPU *n* runs vCPU *n*. Inference (`elimination`) and the VMM's own claim
//! (`name`) either corroborate it, or stand alone where the kernel said nothing, or disagree —
//! and a disagreement is reported, the kernel's word kept, and two weak sources that contradict
//! each other leave the vCPU unresolved.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

use super::procfs::decimal;
use crate::idset::{IdSet, MAX_ID};

/// How a vCPU thread was identified, strongest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Source {
    /// KVM's debugfs: `<debugfs>/kvm/<tid>-<vm fd>/vcpu<n>/pid` names the thread that last
    /// entered `KVM_RUN` on vCPU *n*.
    KvmDebugfs,
    /// The thread was seen blocked in `ioctl(<fd>, KVM_RUN)` and `<fd>` is
    /// `anon_inode:kvm-vcpu:<n>`.
    KvmFd,
    /// The one vCPU no sample tied to a thread, and the one thread running in every sample.
    Elimination,
    /// The VMM's name for the thread (`CPU <n>/KVM`, `CPU <n>/TCG`, `vcpu<n>`, `fc_vcpu <n>`,
    /// `db_vcpu<n>`).
    Name,
}

impl Source {
    /// Its name in JSON and in `kata-topo vm`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::KvmDebugfs => "kvm-debugfs",
            Self::KvmFd => "kvm-fd",
            Self::Elimination => "elimination",
            Self::Name => "name",
        }
    }

    fn is_kernel(self) -> bool {
        matches!(self, Self::KvmDebugfs | Self::KvmFd)
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a VMM names its vCPU threads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NameScheme {
    /// QEMU with `-name …,debug-threads=on` under KVM: `CPU <n>/KVM`.
    QemuKvm,
    /// The same under TCG: `CPU <n>/TCG`.
    QemuTcg,
    /// cloud-hypervisor: `vcpu<n>`.
    CloudHypervisor,
    /// firecracker: `fc_vcpu <n>`.
    Firecracker,
    /// dragonball, inside runtime-rs's shim: `db_vcpu<n>`.
    Dragonball,
}

/// The vCPU a thread name claims. Exact forms only: a name with anything around it, a sign,
/// a leading zero or an id above [`MAX_ID`] claims nothing.
pub(crate) fn vcpu_name(name: &str) -> Option<(NameScheme, u32)> {
    let id = |s: &str| decimal(s, MAX_ID);
    if let Some(rest) = name.strip_prefix("CPU ") {
        let (n, accel) = rest.split_once('/')?;
        let scheme = match accel {
            "KVM" => NameScheme::QemuKvm,
            "TCG" => NameScheme::QemuTcg,
            _ => return None,
        };
        return id(n).map(|n| (scheme, n));
    }
    if let Some(n) = name.strip_prefix("fc_vcpu ") {
        return id(n).map(|n| (NameScheme::Firecracker, n));
    }
    if let Some(n) = name.strip_prefix("db_vcpu") {
        return id(n).map(|n| (NameScheme::Dragonball, n));
    }
    if let Some(n) = name.strip_prefix("vcpu") {
        return id(n).map(|n| (NameScheme::CloudHypervisor, n));
    }
    None
}

/// One source's statement: thread `tid` runs vCPU `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Claim {
    pub(crate) id: u32,
    pub(crate) tid: u32,
    pub(crate) source: Source,
}

/// A vCPU tied to its thread, with every source that said so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub(crate) tid: u32,
    pub(crate) sources: Vec<Source>,
}

/// Sources that contradict each other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Disagreement {
    /// The vCPU concerned, when one is.
    pub index: Option<u32>,
    /// The threads concerned.
    pub tids: Vec<u32>,
    /// What each source said, and what the view kept.
    pub message: String,
}

/// What the sources resolve to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Resolution {
    pub(crate) resolved: BTreeMap<u32, Resolved>,
    /// vCPUs whose sources disagree (reported in `disagreements`).
    pub(crate) contested: BTreeSet<u32>,
    pub(crate) disagreements: Vec<Disagreement>,
}

fn sources_text(sources: &BTreeSet<Source>) -> String {
    sources
        .iter()
        .map(|s| s.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Every thread tied to more than one vCPU: a disagreement (`said` with `{tid}` replaced),
/// and none of those vCPUs is tied to it.
fn contest_shared_threads(r: &mut Resolution, by_tid: &BTreeMap<u32, BTreeSet<u32>>, said: &str) {
    for (tid, ids) in by_tid.iter().filter(|(_, ids)| ids.len() > 1) {
        r.disagreements.push(Disagreement {
            index: None,
            tids: vec![*tid],
            message: format!(
                "{} {}: none of them is tied to it",
                said.replace("{tid}", &tid.to_string()),
                tids_text(ids)
            ),
        });
        r.contested.extend(ids.iter().copied());
    }
}

fn tids_text(tids: &BTreeSet<u32>) -> String {
    tids.iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Resolves claims. `known` are the vCPU ids that exist (the process's KVM vCPU fds); with
/// `None` (TCG: no KVM) every named id is taken to exist.
pub(crate) fn resolve(claims: &[Claim], known: Option<&IdSet>) -> Resolution {
    let mut r = Resolution::default();
    // The kernel's word.
    let mut by_id: BTreeMap<u32, BTreeMap<u32, BTreeSet<Source>>> = BTreeMap::new();
    let mut by_tid: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for c in claims.iter().filter(|c| c.source.is_kernel()) {
        by_id
            .entry(c.id)
            .or_default()
            .entry(c.tid)
            .or_default()
            .insert(c.source);
        by_tid.entry(c.tid).or_default().insert(c.id);
    }
    contest_shared_threads(
        &mut r,
        &by_tid,
        "the kernel showed thread {tid} running vCPUs",
    );
    for (id, tids) in &by_id {
        if tids.len() > 1 {
            let said: Vec<String> = tids
                .iter()
                .map(|(t, s)| format!("thread {t} ({})", sources_text(s)))
                .collect();
            r.disagreements.push(Disagreement {
                index: Some(*id),
                tids: tids.keys().copied().collect(),
                message: format!(
                    "the kernel showed vCPU {id} on several threads: {}; it is left unresolved",
                    said.join(", ")
                ),
            });
            r.contested.insert(*id);
        } else if let Some((tid, sources)) = tids.iter().next() {
            if !r.contested.contains(id) {
                r.resolved.insert(
                    *id,
                    Resolved {
                        tid: *tid,
                        sources: sources.iter().copied().collect(),
                    },
                );
            }
        }
    }
    let kernel_tid: BTreeMap<u32, u32> = r.resolved.iter().map(|(id, v)| (v.tid, *id)).collect();
    let kernel_contested_tids: BTreeSet<u32> = by_tid
        .iter()
        .filter(|(t, _)| !kernel_tid.contains_key(t))
        .map(|(t, _)| *t)
        .collect();

    // Weak sources: corroborate, disagree, or stand alone.
    let mut pending: BTreeMap<u32, BTreeMap<u32, BTreeSet<Source>>> = BTreeMap::new();
    for c in claims.iter().filter(|c| !c.source.is_kernel()) {
        let (id, tid, source) = (c.id, c.tid, c.source);
        if let Some(v) = r.resolved.get_mut(&id) {
            if v.tid == tid {
                if !v.sources.contains(&source) {
                    v.sources.push(source);
                }
            } else {
                r.disagreements.push(Disagreement {
                    index: Some(id),
                    tids: vec![v.tid, tid],
                    message: format!(
                        "{source} says vCPU {id} is thread {tid}; the kernel showed it on thread \
                         {} ({}), which is kept",
                        v.tid,
                        v.sources
                            .iter()
                            .map(|s| s.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                });
            }
        } else if let Some(other) = kernel_tid.get(&tid) {
            r.disagreements.push(Disagreement {
                index: Some(id),
                tids: vec![tid],
                message: format!(
                    "{source} says thread {tid} is vCPU {id}; the kernel showed it running vCPU \
                     {other}, which is kept"
                ),
            });
        } else if r.contested.contains(&id) || kernel_contested_tids.contains(&tid) {
            // Already reported; a weak source does not settle what the kernel left open.
        } else if known.is_some_and(|k| !k.contains(id)) {
            r.disagreements.push(Disagreement {
                index: Some(id),
                tids: vec![tid],
                message: format!(
                    "{source} says thread {tid} is vCPU {id}, but the process holds no KVM vCPU \
                     {id}; ignored"
                ),
            });
        } else {
            pending
                .entry(id)
                .or_default()
                .entry(tid)
                .or_default()
                .insert(source);
        }
    }
    // A thread claimed for several vCPUs by weak sources is tied to none of them.
    let mut weak_by_tid: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
    for (id, tids) in &pending {
        for tid in tids.keys() {
            weak_by_tid.entry(*tid).or_default().insert(*id);
        }
    }
    contest_shared_threads(&mut r, &weak_by_tid, "thread {tid} is claimed as vCPUs");
    for (id, tids) in pending {
        if r.contested.contains(&id) {
            continue;
        }
        if tids.len() > 1 {
            let said: Vec<String> = tids
                .iter()
                .map(|(t, s)| format!("thread {t} ({})", sources_text(s)))
                .collect();
            r.disagreements.push(Disagreement {
                index: Some(id),
                tids: tids.keys().copied().collect(),
                message: format!(
                    "vCPU {id} is claimed by several threads: {}; it is left unresolved",
                    said.join(", ")
                ),
            });
            r.contested.insert(id);
        } else if let Some((tid, sources)) = tids.into_iter().next() {
            r.resolved.insert(
                id,
                Resolved {
                    tid,
                    sources: sources.into_iter().collect(),
                },
            );
        }
    }
    for v in r.resolved.values_mut() {
        v.sources.sort();
    }
    r
}

/// What sampling the threads' `syscall` files saw.
#[derive(Debug, Default, Clone)]
pub(crate) struct Samples {
    /// How many rounds were taken.
    pub(crate) rounds: u32,
    /// (vCPU id, tid) seen in `KVM_RUN`.
    pub(crate) kvm_run: BTreeSet<(u32, u32)>,
    /// Rounds in which each thread was runnable.
    pub(crate) running: BTreeMap<u32, u32>,
}

impl Samples {
    /// The threads runnable in every round.
    pub(crate) fn always_running(&self) -> BTreeSet<u32> {
        self.running
            .iter()
            .filter(|(_, n)| **n == self.rounds)
            .map(|(t, _)| *t)
            .collect()
    }
}

/// Elimination over what the kernel left: exactly one vCPU no kernel source tied to a thread,
/// and exactly one thread (not a kernel worker, not already tied) runnable in every one of at
/// least two samples — a vCPU executing guest code the whole time. Anything else claims
/// nothing.
pub(crate) fn eliminate(
    kernel: &Resolution,
    known: &IdSet,
    samples: &Samples,
    candidates: &BTreeSet<u32>,
) -> Option<Claim> {
    if samples.rounds < 2 {
        return None;
    }
    let tied: BTreeSet<u32> = kernel.resolved.values().map(|v| v.tid).collect();
    let open: Vec<u32> = known
        .iter()
        .filter(|id| !kernel.resolved.contains_key(id) && !kernel.contested.contains(id))
        .collect();
    let busy: Vec<u32> = samples
        .always_running()
        .into_iter()
        .filter(|t| candidates.contains(t) && !tied.contains(t))
        .collect();
    match (open.as_slice(), busy.as_slice()) {
        ([id], [tid]) => Some(Claim {
            id: *id,
            tid: *tid,
            source: Source::Elimination,
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(id: u32, tid: u32, source: Source) -> Claim {
        Claim { id, tid, source }
    }

    fn ids(s: &str) -> IdSet {
        IdSet::parse(s).expect("ids")
    }

    #[test]
    fn names_of_each_vmm() {
        assert_eq!(vcpu_name("CPU 3/KVM"), Some((NameScheme::QemuKvm, 3)));
        assert_eq!(vcpu_name("CPU 0/TCG"), Some((NameScheme::QemuTcg, 0)));
        assert_eq!(vcpu_name("vcpu12"), Some((NameScheme::CloudHypervisor, 12)));
        assert_eq!(vcpu_name("fc_vcpu 1"), Some((NameScheme::Firecracker, 1)));
        assert_eq!(vcpu_name("db_vcpu0"), Some((NameScheme::Dragonball, 0)));
        for bad in [
            "CPU x/KVM",
            "CPU 1/HVF",
            "CPU 01/KVM",
            "CPU -1/KVM",
            "CPU +1/KVM",
            " CPU 1/KVM",
            "CPU 1/KVM ",
            "ALL CPUs/TCG",
            "vcpu",
            "vcpu 1",
            "vcpu1x",
            "fc_vcpu1",
            "db_vcpu 1",
            "vcpu99999",
            "qemu-system-x86",
            "kvm-nx-lpage-re",
            "",
        ] {
            assert_eq!(vcpu_name(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn agreeing_sources_are_listed_together() {
        let r = resolve(
            &[
                claim(0, 10, Source::Name),
                claim(0, 10, Source::KvmFd),
                claim(0, 10, Source::KvmDebugfs),
                claim(1, 11, Source::KvmFd),
            ],
            Some(&ids("0-1")),
        );
        assert!(r.disagreements.is_empty(), "{:?}", r.disagreements);
        assert_eq!(
            r.resolved[&0].sources,
            vec![Source::KvmDebugfs, Source::KvmFd, Source::Name]
        );
        assert_eq!(r.resolved[&1].tid, 11);
        assert_eq!(r.resolved[&1].sources, vec![Source::KvmFd]);
    }

    #[test]
    fn the_kernel_wins_over_a_name_and_the_disagreement_is_reported() {
        // Thread 10 is named vCPU 1 but runs vCPU 0.
        let r = resolve(
            &[
                claim(0, 10, Source::KvmFd),
                claim(1, 10, Source::Name),
                claim(1, 11, Source::KvmFd),
                claim(0, 11, Source::Name),
            ],
            Some(&ids("0-1")),
        );
        assert_eq!(r.resolved[&0].tid, 10);
        assert_eq!(r.resolved[&1].tid, 11);
        assert_eq!(r.resolved[&0].sources, vec![Source::KvmFd]);
        assert_eq!(r.disagreements.len(), 2, "{:?}", r.disagreements);
        assert!(r.disagreements[0]
            .message
            .contains("name says vCPU 1 is thread 10"));
    }

    #[test]
    fn a_name_alone_stands_where_the_kernel_said_nothing() {
        let r = resolve(
            &[claim(0, 10, Source::KvmFd), claim(1, 11, Source::Name)],
            Some(&ids("0-1")),
        );
        assert_eq!(r.resolved[&1].sources, vec![Source::Name]);
        assert!(r.disagreements.is_empty());
    }

    #[test]
    fn a_name_for_a_vcpu_that_does_not_exist_is_ignored() {
        let r = resolve(
            &[claim(0, 10, Source::KvmFd), claim(5, 12, Source::Name)],
            Some(&ids("0")),
        );
        assert!(!r.resolved.contains_key(&5));
        assert_eq!(r.disagreements.len(), 1);
        assert!(r.disagreements[0].message.contains("no KVM vCPU 5"));
    }

    #[test]
    fn two_threads_on_one_vcpu_leave_it_unresolved() {
        let r = resolve(
            &[
                claim(0, 10, Source::KvmFd),
                claim(0, 12, Source::KvmDebugfs),
                claim(0, 10, Source::Name),
            ],
            Some(&ids("0")),
        );
        assert!(r.resolved.is_empty());
        assert!(r.contested.contains(&0));
        assert_eq!(r.disagreements.len(), 1, "{:?}", r.disagreements);
        assert_eq!(r.disagreements[0].tids, vec![10, 12]);
    }

    #[test]
    fn one_thread_on_two_vcpus_is_tied_to_neither() {
        let r = resolve(
            &[claim(0, 10, Source::KvmFd), claim(1, 10, Source::KvmFd)],
            Some(&ids("0-1")),
        );
        assert!(r.resolved.is_empty());
        assert_eq!(r.contested, [0, 1].into_iter().collect());
    }

    #[test]
    fn weak_sources_that_contradict_each_other_settle_nothing() {
        // Elimination picks thread 11 for vCPU 0, the name says thread 12.
        let r = resolve(
            &[
                claim(0, 11, Source::Elimination),
                claim(0, 12, Source::Name),
            ],
            Some(&ids("0")),
        );
        assert!(r.resolved.is_empty());
        assert_eq!(r.disagreements.len(), 1);
        // Two threads both named vCPU 0 under TCG.
        let r = resolve(
            &[claim(0, 11, Source::Name), claim(0, 12, Source::Name)],
            None,
        );
        assert!(r.resolved.is_empty());
        // One thread named twice cannot happen (one name per thread), but a weak source and a
        // name could tie one thread to two vCPUs.
        let r = resolve(
            &[
                claim(0, 11, Source::Elimination),
                claim(1, 11, Source::Name),
            ],
            Some(&ids("0-1")),
        );
        assert!(r.resolved.is_empty());
        assert_eq!(r.contested, [0, 1].into_iter().collect());
    }

    #[test]
    fn elimination_needs_one_open_vcpu_and_one_busy_thread() {
        let known = ids("0-1");
        let kernel = resolve(&[claim(1, 11, Source::KvmFd)], Some(&known));
        let mut s = Samples {
            rounds: 5,
            ..Samples::default()
        };
        s.running.insert(10, 5);
        s.running.insert(12, 4);
        let candidates: BTreeSet<u32> = [10, 11, 12, 13].into_iter().collect();
        assert_eq!(
            eliminate(&kernel, &known, &s, &candidates),
            Some(claim(0, 10, Source::Elimination))
        );
        // A kernel worker (not a candidate) that runs all the time does not count.
        let only_worker: BTreeSet<u32> = [11, 12].into_iter().collect();
        assert_eq!(eliminate(&kernel, &known, &s, &only_worker), None);
        // Two busy threads: which one is the vCPU cannot be told.
        s.running.insert(12, 5);
        assert_eq!(eliminate(&kernel, &known, &s, &candidates), None);
        // Two open vCPUs: neither can be told.
        s.running.insert(12, 4);
        let none = resolve(&[], Some(&known));
        assert_eq!(eliminate(&none, &known, &s, &candidates), None);
        // One sample proves nothing about "always".
        s.rounds = 1;
        s.running.insert(10, 1);
        assert_eq!(eliminate(&kernel, &known, &s, &candidates), None);
    }
}
