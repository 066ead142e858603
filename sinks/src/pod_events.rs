//! Kubernetes Events on the pod: what `kubectl describe pod` and `kubectl get events` show of
//! kata-topo's findings, written to the API server with the node's own credentials (the
//! kubeconfig the node-affinity check reads), as `v1` Events the way the kubelet writes its
//! own ([`kata_topo_apiserver::events`]).
//!
//! **Which.** An announced verdict (the announcer's de-duplication applies: one Event per
//! announcement, never one per retry) gives one Event per finding whose severity is `error` —
//! type `Warning`, reason the rule in CamelCase ([`Rule::reason`]) — and one per warning of
//! the rules [`NORMAL_WARNINGS`] names, type `Normal`. A refusal is always one of the former:
//! enforce mode refuses only on an `error`. A verdict of no pod (a plain `ctr run`) gives none.
//!
//! **Never waiting.** A bounded queue ([`QUEUE`]) to one writer thread per pod daemon, started
//! with the pod's first Event; each write has [`WRITE_TIMEOUT`]. A full queue drops, and a
//! write the API server does not take (refused, failed, timed out) is lost: both count in
//! `kata_topo_sink_dropped_total{sink="kube-events"}`, with a log line.
//!
//! **Repeats fold**, as the kubelet's recorder folds its own: an Event of the same pod, type,
//! reason and message is the same Event, its `count` and `lastTimestamp` patched — the first
//! repeat at once (`kubectl` shows `x2`), later ones at most once every [`FOLD_INTERVAL`] (the
//! count so far, written by the thread when the interval passes). A repeat once a second for
//! an hour makes 7 writes: the create, the first repeat, and one patch per 10 minutes. The
//! kubelet's recorder writes a patch per repeat until its spam filter (25 per object, then one
//! per 5 minutes) drops the rest: 37 writes in that hour, its count stopping at 37. A pod may
//! start at most [`BURST`] new Events, then one per [`REFILL`] (the kubelet's spam filter's
//! numbers, here counted against new Events only: repeats are already folded).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use kata_topo_apiserver::{ApiClient, ApiError, EventType, PodEvent, Setup};
use kata_topo_core::check::rule::{Rule, Severity};
use kata_topo_core::config::Config;
use kata_topo_core::{Decision, Operation, UpdateClass, Verdict};
use slog::Logger;

use crate::queue::{Drops, Lane, Sink};

/// The warnings that are Events too, of type `Normal` (`docs/rules.md` says why): facts about
/// the pod's node that its owner cannot see from the cluster and that no policy makes an
/// error — its labels moved under the pod's affinity (`node-labels-changed`), its topology
/// changed under the pod (`topology-drift`) — and the pod author's own annotation set aside
/// (`override-ignored`).
pub const NORMAL_WARNINGS: [Rule; 3] = [
    Rule::NodeLabelsChanged,
    Rule::TopologyDrift,
    Rule::OverrideIgnored,
];

/// How many Events wait at most.
pub const QUEUE: usize = 32;
/// The longest one write may take (off the request path: the most `api_timeout_ms` allows).
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// After the first repeat, a folded count is written at most this often.
pub const FOLD_INTERVAL: Duration = Duration::from_secs(600);
/// New Events a pod may start at once…
pub const BURST: u32 = 25;
/// …and then one more per this.
pub const REFILL: Duration = Duration::from_secs(300);
/// Events remembered for folding; the least recent goes first.
const MAX_REMEMBERED: usize = 256;
/// An Event not seen for this long is forgotten (the API server's default event TTL: it is
/// gone there too).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The Event type of a finding, when it is one.
pub fn event_type(rule: Rule, severity: Severity) -> Option<EventType> {
    match severity {
        Severity::Error => Some(EventType::Warning),
        Severity::Warning if NORMAL_WARNINGS.contains(&rule) => Some(EventType::Normal),
        _ => None,
    }
}

/// One finding to become (or repeat) an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Occurrence {
    /// The pod's namespace.
    pub namespace: String,
    /// The pod's name.
    pub pod: String,
    /// The pod's uid.
    pub uid: Option<String>,
    /// `Normal` or `Warning`.
    pub kind: EventType,
    /// The rule in CamelCase.
    pub reason: String,
    /// What happened.
    pub message: String,
}

type Key = (String, String, Option<String>, EventType, String, String);

impl Occurrence {
    fn key(&self) -> Key {
        (
            self.namespace.clone(),
            self.pod.clone(),
            self.uid.clone(),
            self.kind,
            self.reason.clone(),
            self.message.clone(),
        )
    }
}

/// What the request was, for a message: `the resize of container app`.
fn what(v: &Verdict) -> String {
    let container = v
        .container_name
        .as_deref()
        .map(|n| format!(" of container {n}"))
        .unwrap_or_default();
    match (v.operation, v.class) {
        (Operation::Sandbox, _) => "the create of the pod's sandbox".into(),
        (Operation::Create, _) => format!("the create{container}"),
        (Operation::Recreate, _) => format!("the recreate{container}"),
        (Operation::Update, Some(UpdateClass::Resize)) => format!("the resize{container}"),
        (Operation::Update, Some(UpdateClass::Cpuset)) => format!("the cpuset update{container}"),
        (Operation::Update, Some(UpdateClass::Mixed)) => {
            format!("the resize and cpuset update{container}")
        }
        (Operation::Update, _) => format!("the update{container}"),
    }
}

/// The Events of an announced verdict, one per finding that is one.
pub fn occurrences(v: &Verdict) -> Vec<Occurrence> {
    let (Some(namespace), Some(pod)) = (&v.pod.namespace, &v.pod.name) else {
        return Vec::new();
    };
    let what = what(v);
    v.findings
        .iter()
        .filter_map(|f| {
            let kind = event_type(f.rule, f.severity)?;
            let message = match (kind, v.decision()) {
                (EventType::Warning, Decision::Reject) => {
                    format!("Refused {what}: {}", f.message)
                }
                (EventType::Warning, Decision::Allow) => {
                    format!(
                        "{} went through ({} mode): {}",
                        capital(&what),
                        v.mode,
                        f.message
                    )
                }
                (EventType::Normal, _) => format!("{}: {}", capital(&what), f.message),
            };
            // Control characters from a pod's names or annotations stay escapes in a terminal.
            let message = kata_topo_core::text::printable(&message);
            Some(Occurrence {
                namespace: namespace.clone(),
                pod: pod.clone(),
                uid: v.pod.uid.clone(),
                kind,
                reason: f.rule.reason(),
                message: PodEvent::bounded_message(&message),
            })
        })
        .collect()
}

fn capital(s: &str) -> String {
    let mut c = s.chars();
    c.next()
        .map(|f| f.to_uppercase().collect::<String>() + c.as_str())
        .unwrap_or_default()
}

/// A write the fold asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    key: Key,
    /// Create it (first, or the API server lost it), or patch its count.
    create: bool,
    event: PodEvent,
}

#[derive(Debug)]
struct Remembered {
    event: PodEvent,
    /// The API server has it.
    created: bool,
    /// The count the API server has.
    written: u32,
    /// No write before this (the first repeat is written at once, later ones wait).
    not_before: Instant,
    /// When it was last seen.
    seen: Instant,
}

impl Remembered {
    fn wants_write(&self) -> bool {
        !self.created || self.event.count > self.written
    }
}

/// A pod's allowance of new Events: [`BURST`], one more per [`REFILL`].
#[derive(Debug)]
struct Allowance {
    tokens: u32,
    refilled: Instant,
}

/// The fold of a pod daemon's Events: which occurrence is new, which repeats, and what to
/// write when. It takes the clock from its caller, so its hour can be a test's instant.
#[derive(Debug)]
pub(crate) struct Fold {
    node: String,
    remembered: HashMap<Key, Remembered>,
    allowance: HashMap<(String, String), Allowance>,
    /// The last Event name's instant, so two names never collide.
    last_name: SystemTime,
}

/// The pod started more Events than it may.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Limited;

impl Fold {
    pub(crate) fn new(node: &str) -> Self {
        Self {
            node: node.to_string(),
            remembered: HashMap::new(),
            allowance: HashMap::new(),
            last_name: SystemTime::UNIX_EPOCH,
        }
    }

    /// Takes one occurrence seen at `at` (`now` on the monotonic clock); what it needs
    /// written is among [`Fold::due`] from then on.
    pub(crate) fn occur(
        &mut self,
        o: Occurrence,
        now: Instant,
        at: SystemTime,
    ) -> Result<(), Limited> {
        let key = o.key();
        if let Some(r) = self.remembered.get_mut(&key) {
            r.event.count = r.event.count.saturating_add(1);
            r.event.last = at.max(r.event.first);
            r.seen = now;
            return Ok(());
        }
        self.allow(&o.namespace, &o.pod, now)?;
        if self.remembered.len() >= MAX_REMEMBERED {
            if let Some(oldest) = self
                .remembered
                .iter()
                .min_by_key(|(_, r)| r.seen)
                .map(|(k, _)| k.clone())
            {
                self.remembered.remove(&oldest);
            }
        }
        let name_at = if at > self.last_name {
            at
        } else {
            self.last_name + Duration::from_nanos(1)
        };
        self.last_name = name_at;
        let event = PodEvent {
            name: PodEvent::name_for(&o.pod, name_at),
            namespace: o.namespace,
            pod: o.pod,
            uid: o.uid,
            kind: o.kind,
            reason: o.reason,
            message: o.message,
            node: self.node.clone(),
            first: at,
            last: at,
            count: 1,
        };
        self.remembered.insert(
            key,
            Remembered {
                event,
                created: false,
                written: 0,
                not_before: now,
                seen: now,
            },
        );
        Ok(())
    }

    fn allow(&mut self, namespace: &str, pod: &str, now: Instant) -> Result<(), Limited> {
        let a = self
            .allowance
            .entry((namespace.to_string(), pod.to_string()))
            .or_insert(Allowance {
                tokens: BURST,
                refilled: now,
            });
        let periods = now.saturating_duration_since(a.refilled).as_secs() / REFILL.as_secs();
        if periods > 0 {
            a.tokens = BURST.min(
                a.tokens
                    .saturating_add(u32::try_from(periods).unwrap_or(u32::MAX)),
            );
            a.refilled += REFILL * u32::try_from(periods).unwrap_or(u32::MAX);
        }
        if a.tokens == 0 {
            return Err(Limited);
        }
        a.tokens -= 1;
        Ok(())
    }

    fn due_one(&self, key: &Key, now: Instant) -> Option<Write> {
        let r = self.remembered.get(key)?;
        (r.wants_write() && now >= r.not_before).then(|| Write {
            key: key.clone(),
            create: !r.created,
            event: r.event.clone(),
        })
    }

    /// The writes whose time came; forgets Events not seen for an hour.
    pub(crate) fn due(&mut self, now: Instant) -> Vec<Write> {
        self.remembered
            .retain(|_, r| r.wants_write() || now.saturating_duration_since(r.seen) < FORGET_AFTER);
        let keys: Vec<Key> = self.remembered.keys().cloned().collect();
        keys.iter().filter_map(|k| self.due_one(k, now)).collect()
    }

    /// How long until the next write is due, if one waits.
    pub(crate) fn next_due(&self, now: Instant) -> Option<Duration> {
        self.remembered
            .values()
            .filter(|r| r.wants_write())
            .map(|r| r.not_before.saturating_duration_since(now))
            .min()
    }

    /// What became of a write: `Ok`, or the API server's error. A patch of an Event the API
    /// server no longer has (404) is written again as a create, at once.
    pub(crate) fn done(
        &mut self,
        w: &Write,
        result: &Result<(), ApiError>,
        now: Instant,
    ) -> Option<Write> {
        let r = self.remembered.get_mut(&w.key)?;
        match result {
            Ok(()) => {
                let first = !r.created;
                r.created = true;
                r.written = w.event.count;
                // The first repeat goes at once; every later one waits its interval.
                r.not_before = if first && w.event.count == 1 {
                    now
                } else {
                    now + FOLD_INTERVAL
                };
                None
            }
            Err(ApiError::Status { code: 404, .. }) if !w.create => {
                r.created = false;
                self.due_one(&w.key, now)
            }
            Err(_) => {
                r.not_before = now + FOLD_INTERVAL;
                None
            }
        }
    }
}

/// Where the writer writes: the API server, or, while the kubeconfig cannot be used (caught
/// mid-rotation, a file another user may write), the configuration to set it up from again.
#[derive(Clone)]
enum Target {
    Client { client: ApiClient, node: String },
    Retry(Box<Config>),
}

struct Writer {
    target: Target,
    log: Logger,
    drops: Arc<Drops>,
}

/// The pod daemon's Events to the API server; off without a kubeconfig.
#[derive(Clone, Default)]
pub struct PodEvents(Option<Arc<(Writer, OnceLock<Lane<Occurrence>>)>>);

impl std::fmt::Debug for PodEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodEvents")
            .field("on", &self.0.is_some())
            .finish()
    }
}

impl PodEvents {
    /// No Events.
    pub fn off() -> Self {
        Self(None)
    }

    /// Events to the API server `setup` names (the node-affinity check's, as `config` sets it
    /// up); off without a kubeconfig. A kubeconfig that cannot be used yet is set up again by
    /// the writer at each Event until it can (never on the request path); the Events meanwhile
    /// are dropped and counted.
    pub fn start(setup: &Setup, config: &Config, log: Logger, drops: Arc<Drops>) -> Self {
        let target = match setup {
            Setup::Off(_) => return Self::off(),
            Setup::On { client, node } => Target::Client {
                client: client.with_timeout(WRITE_TIMEOUT),
                node: node.clone(),
            },
            Setup::Broken(_) => Target::Retry(Box::new(config.clone())),
        };
        Self(Some(Arc::new((
            Writer { target, log, drops },
            OnceLock::new(),
        ))))
    }

    /// Whether Events are written, for `kata-topo status`: `on: as node …`, or why not.
    pub fn describe(setup: &Setup) -> String {
        match setup {
            Setup::Off(why) => format!("off: {why}"),
            Setup::Broken(e) => format!("on once the kubeconfig can be used: {e}"),
            Setup::On { node, .. } => {
                format!("on: as node {node} to the API server of the kubeconfig, repeats folded")
            }
        }
    }

    /// Queues the Events of an announced verdict; each one the full queue turns away is
    /// dropped and counted.
    pub fn verdict(&self, v: &Verdict) {
        let Some(inner) = &self.0 else {
            return;
        };
        let occurrences = occurrences(v);
        if occurrences.is_empty() {
            return;
        }
        let lane = inner.1.get_or_init(|| start_writer(&inner.0));
        for o in occurrences {
            lane.push(o);
        }
    }

    /// Waits until every Event queued so far was written or given up, or `deadline` passed.
    pub fn flush(&self, deadline: Instant) -> bool {
        self.0
            .as_ref()
            .and_then(|inner| inner.1.get())
            .is_none_or(|lane| lane.flush(deadline))
    }
}

fn start_writer(w: &Writer) -> Lane<Occurrence> {
    let (mut target, log, drops) = (w.target.clone(), w.log.clone(), w.drops.clone());
    let mut fold: Option<Fold> = None;
    Lane::start_timed(
        "kube-events",
        QUEUE,
        Sink::KubeEvents,
        w.drops.clone(),
        move |item: Option<Occurrence>| {
            if let Target::Retry(config) = &target {
                match kata_topo_apiserver::setup(config) {
                    Setup::On { client, node } => {
                        target = Target::Client {
                            client: client.with_timeout(WRITE_TIMEOUT),
                            node,
                        };
                    }
                    Setup::Off(why) => {
                        if let Some(o) = &item {
                            drops.add(Sink::KubeEvents, 1);
                            slog::warn!(log, "cannot write the pod's Event: the kubeconfig is gone";
                                "event" => "pod-event-failed", "reason" => &o.reason, "error" => why);
                        }
                        return None;
                    }
                    Setup::Broken(e) => {
                        if let Some(o) = &item {
                            drops.add(Sink::KubeEvents, 1);
                            slog::warn!(log, "cannot write the pod's Event: the kubeconfig cannot be used";
                                "event" => "pod-event-failed", "reason" => &o.reason,
                                "error" => e.to_string());
                        }
                        return None;
                    }
                }
            }
            let Target::Client { client, node } = &target else {
                return None;
            };
            let fold = fold.get_or_insert_with(|| Fold::new(node));
            if let Some(o) = item {
                if fold.occur(o.clone(), Instant::now(), SystemTime::now()) == Err(Limited) {
                    drops.add(Sink::KubeEvents, 1);
                    slog::warn!(log, "the pod started more Events than it may; dropped";
                    "event" => "pod-event-dropped", "reason" => &o.reason,
                    "pod_namespace" => &o.namespace, "pod_name" => &o.pod);
                }
            }
            let mut writes = fold.due(Instant::now());
            while let Some(w) = writes.pop() {
                let deadline = Instant::now() + WRITE_TIMEOUT;
                let result = if w.create {
                    client.create_event(&w.event, deadline)
                } else {
                    client.patch_event(&w.event, deadline)
                };
                if let Err(e) = &result {
                    let lost_patch = !w.create && matches!(e, ApiError::Status { code: 404, .. });
                    if !lost_patch {
                        drops.add(Sink::KubeEvents, 1);
                        slog::warn!(log, "cannot write the pod's Event to the API server";
                        "event" => "pod-event-failed", "reason" => &w.event.reason,
                        "pod_namespace" => &w.event.namespace, "pod_name" => &w.event.pod,
                        "error" => e.to_string());
                    }
                }
                writes.extend(fold.done(&w, &result, Instant::now()));
            }
            fold.next_due(Instant::now())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(decision: &str, mode: &str, findings: &[(&str, &str)]) -> Verdict {
        let findings: Vec<serde_json::Value> = findings
            .iter()
            .map(|(rule, severity)| {
                serde_json::json!({"rule": rule, "severity": severity,
                    "message": format!("{rule} found"), "expected": {}, "observed": {}})
            })
            .collect();
        serde_json::from_value(serde_json::json!({
            "operation": "update", "class": "resize", "sandbox_id": "sb", "container_id": "c1",
            "container_name": "app",
            "pod": {"name": "kt-enforce", "namespace": "default", "uid": "u-1"},
            "policy": "restricted", "mode": mode, "decision": decision, "findings": findings,
        }))
        .expect("verdict")
    }

    #[test]
    fn errors_are_warnings_and_only_the_listed_warnings_are_normal_events() {
        let v = verdict(
            "reject",
            "enforce",
            &[
                ("memory-exceeds-nodes", "error"),
                ("node-labels-changed", "warning"),
                ("kubelet-intent-unavailable", "warning"),
                ("vfio-locality-unknown", "warning"),
            ],
        );
        let o = occurrences(&v);
        assert_eq!(o.len(), 2, "{o:#?}");
        assert_eq!(o[0].kind, EventType::Warning);
        assert_eq!(o[0].reason, "MemoryExceedsNodes");
        assert_eq!(
            o[0].message,
            "Refused the resize of container app: memory-exceeds-nodes found"
        );
        assert_eq!(
            (o[0].namespace.as_str(), o[0].pod.as_str()),
            ("default", "kt-enforce")
        );
        assert_eq!(o[0].uid.as_deref(), Some("u-1"));
        assert_eq!(o[1].kind, EventType::Normal);
        assert_eq!(o[1].reason, "NodeLabelsChanged");
        assert_eq!(
            o[1].message,
            "The resize of container app: node-labels-changed found"
        );
        let audit = occurrences(&verdict(
            "allow",
            "audit",
            &[("cpu-outside-intent", "error")],
        ));
        assert_eq!(
            audit[0].message,
            "The resize of container app went through (audit mode): cpu-outside-intent found"
        );
        // A warning of a rule that is an error elsewhere (best-effort) is no Event.
        assert!(occurrences(&verdict(
            "allow",
            "audit",
            &[("cpu-outside-intent", "warning")]
        ))
        .is_empty());
        // No pod, no Event.
        let mut nameless = verdict("reject", "enforce", &[("vfio-remote", "error")]);
        nameless.pod = Default::default();
        assert!(occurrences(&nameless).is_empty());
    }

    #[test]
    fn a_pods_control_characters_stay_escapes_and_messages_stay_bounded() {
        let mut v = verdict("reject", "enforce", &[("vfio-remote", "error")]);
        v.container_name = Some("app\n\u{1b}[31m".into());
        v.findings[0].message = "x".repeat(5000);
        let o = occurrences(&v);
        assert!(
            o[0].message.contains("app\\n\\u{1b}[31m"),
            "{}",
            o[0].message
        );
        assert!(o[0].message.len() <= kata_topo_apiserver::events::MAX_MESSAGE_BYTES);
    }

    fn occurrence(message: &str) -> Occurrence {
        Occurrence {
            namespace: "default".into(),
            pod: "kt-enforce".into(),
            uid: Some("u-1".into()),
            kind: EventType::Warning,
            reason: "MemoryExceedsNodes".into(),
            message: message.into(),
        }
    }

    /// Runs `fold` as the writer thread does, the API server answering `answer`, over virtual
    /// time: an occurrence every `every` for `total`; returns the writes made.
    fn run(
        fold: &mut Fold,
        every: Duration,
        total: Duration,
        mut answer: impl FnMut(&Write) -> Result<(), ApiError>,
    ) -> Vec<Write> {
        let start = Instant::now();
        let wall = SystemTime::UNIX_EPOCH + Duration::from_secs(1_790_000_000);
        let mut made = Vec::new();
        let mut t = Duration::ZERO;
        let mut write_due = |fold: &mut Fold, now: Instant| {
            let mut writes = fold.due(now);
            while let Some(w) = writes.pop() {
                let r = answer(&w);
                made.push(w.clone());
                writes.extend(fold.done(&w, &r, now));
            }
        };
        while t <= total {
            let now = start + t;
            fold.occur(occurrence("refused"), now, wall + t)
                .expect("allowed");
            write_due(fold, now);
            t += every;
        }
        // The thread wakes whenever a count is due, until none waits.
        let mut now = start + total;
        for _ in 0..10 {
            let Some(wait) = fold.next_due(now) else {
                break;
            };
            now += wait;
            write_due(fold, now);
        }
        assert_eq!(fold.next_due(now), None, "nothing left to write");
        made
    }

    #[test]
    fn a_refusal_repeated_every_second_for_an_hour_is_a_handful_of_writes() {
        let mut fold = Fold::new("worker-1");
        let hour = Duration::from_secs(3600);
        let made = run(&mut fold, Duration::from_secs(1), hour, |_| Ok(()));
        let counts: Vec<(bool, u32)> = made.iter().map(|w| (w.create, w.event.count)).collect();
        assert_eq!(
            counts,
            vec![
                (true, 1),
                (false, 2),
                (false, 602),
                (false, 1202),
                (false, 1802),
                (false, 2402),
                (false, 3002),
                (false, 3601),
            ],
            "the create, the first repeat at once, one patch per interval, and the last count"
        );
        assert!(made.iter().all(|w| w.event.name == made[0].event.name));
        assert_eq!(
            made.last().map(|w| w.event.last),
            Some(made[0].event.first + hour)
        );
    }

    #[test]
    fn an_event_the_api_server_lost_is_created_again_and_a_failed_write_waits_its_interval() {
        let mut fold = Fold::new("worker-1");
        let mut answers = vec![
            Ok(()),
            Err(ApiError::Status {
                code: 404,
                message: "not found".into(),
            }),
            Ok(()),
            Err(ApiError::Timeout(5000)),
        ]
        .into_iter();
        let made = run(
            &mut fold,
            Duration::from_secs(1),
            Duration::from_secs(3),
            |_| answers.next().unwrap_or(Ok(())),
        );
        let counts: Vec<(bool, u32)> = made.iter().map(|w| (w.create, w.event.count)).collect();
        // Created; the first repeat's patch finds it gone and creates it again with count 2;
        // the next patch (after its interval) times out; the count is written at the next.
        assert_eq!(
            counts,
            vec![(true, 1), (false, 2), (true, 2), (false, 4), (false, 4)]
        );
        assert!(made.iter().all(|w| w.event.name == made[0].event.name));
    }

    #[test]
    fn a_pod_starts_at_most_its_burst_of_new_events_then_one_per_refill() {
        let mut fold = Fold::new("worker-1");
        let now = Instant::now();
        let wall = SystemTime::now();
        for i in 0..BURST {
            assert!(fold.occur(occurrence(&format!("m{i}")), now, wall).is_ok());
        }
        assert_eq!(fold.occur(occurrence("one more"), now, wall), Err(Limited));
        // A repeat is no new Event: never limited.
        assert!(fold.occur(occurrence("m0"), now, wall).is_ok());
        let later = now + REFILL;
        assert!(fold.occur(occurrence("one more"), later, wall).is_ok());
        assert_eq!(
            fold.occur(occurrence("and another"), later, wall),
            Err(Limited)
        );
        // Every name is its own.
        let mut names: Vec<&str> = fold
            .remembered
            .values()
            .map(|r| r.event.name.as_str())
            .collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), fold.remembered.len());
    }

    /// docs/rules.md's "Kubernetes Events" table is this mapping: every rule, its reason, and
    /// whether its warnings are Events.
    #[test]
    fn the_docs_table_is_the_mapping() {
        let doc = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/rules.md"));
        let table: Vec<Vec<String>> = doc
            .split("\n## Kubernetes Events")
            .nth(1)
            .expect("docs/rules.md has a \"Kubernetes Events\" section")
            .lines()
            .skip_while(|l| !l.starts_with('|'))
            .take_while(|l| l.starts_with('|'))
            .skip(2)
            .map(|l| {
                l.trim_matches('|')
                    .split('|')
                    .map(|c| c.trim().trim_matches('`').to_string())
                    .collect()
            })
            .collect();
        let want: Vec<Vec<String>> = Rule::ALL
            .iter()
            .map(|r| {
                vec![
                    r.id().to_string(),
                    r.reason(),
                    match event_type(*r, Severity::Warning) {
                        Some(EventType::Normal) => "Normal".to_string(),
                        _ => "–".to_string(),
                    },
                ]
            })
            .collect();
        let paste: String = want
            .iter()
            .map(|row| format!("| `{}` | `{}` | {} |\n", row[0], row[1], row[2]))
            .collect();
        assert_eq!(table, want, "docs/rules.md's table should read:\n{paste}");
    }
}
