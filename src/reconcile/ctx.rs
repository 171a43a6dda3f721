//! What a reconcile pass works with: its key (one local follower), the caches of every remote
//! and of the local followers, and the context it writes through. The pass itself is in
//! [`pass`].
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event, EventType};
use tracing::{debug, warn};

use super::writer::{Writer, Written};
use crate::desired::Options;
use crate::desired::Outcome;
use crate::error::Result;
use crate::runtime::metrics::{ByRemoteKind, ByRemoteReason, Metrics};
use crate::state::{Cache, GroupKey, LocalState, McsCluster, McsLocal, Remotes};

/// What a reconcile works on: one local follower (namespace/name), whichever remotes export it,
/// so two remotes can never write one local object at once; or one MCS import of that
/// namespace/name, whichever clusters export it. The two never share an object (a follower is
/// `<name>`, an import's Service `derived-<hash>`), so their keys never contend.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
    pub mode: Mode,
}

/// Which path a key takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mode {
    /// the label mode: a follower Service and its slices
    Follower,
    /// the Multi-Cluster Services API: a ServiceImport, its derived Service and slices, and
    /// the local ServiceExport's status
    Mcs,
}

impl Mode {
    /// The `mode` label of the pass-duration histogram and of the pass's span.
    pub fn label(self) -> &'static str {
        match self {
            Mode::Follower => "follower",
            Mode::Mcs => "mcs",
        }
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.mode {
            Mode::Follower => write!(f, "{}/{}", self.namespace, self.name),
            Mode::Mcs => write!(f, "mcs:{}/{}", self.namespace, self.name),
        }
    }
}

impl Key {
    pub fn follower((namespace, name): GroupKey) -> Self {
        Self {
            namespace,
            name,
            mode: Mode::Follower,
        }
    }

    pub fn mcs((namespace, name): GroupKey) -> Self {
        Self {
            namespace,
            name,
            mode: Mode::Mcs,
        }
    }

    pub fn group(&self) -> GroupKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// Which local cache holds a kind we write.
pub trait Cached: crate::reconcile::writer::Local {
    fn cache(local: &LocalState) -> &RwLock<Cache<Self>>;
}

impl Cached for Service {
    fn cache(local: &LocalState) -> &RwLock<Cache<Self>> {
        &local.services
    }
}

impl Cached for EndpointSlice {
    fn cache(local: &LocalState) -> &RwLock<Cache<Self>> {
        &local.slices
    }
}

impl Cached for Endpoints {
    fn cache(local: &LocalState) -> &RwLock<Cache<Self>> {
        &local.endpoints
    }
}

pub struct Ctx {
    /// label key and endpoints mode (the per-remote names are in each remote's options)
    pub opts: Options,
    /// the namespaces mirrored (empty: all)
    pub namespaces: Vec<String>,
    pub remotes: Arc<Remotes>,
    pub local: Arc<LocalState>,
    /// every local write, Events included
    pub writer: Writer,
    pub metrics: Arc<Metrics>,
    pub create_namespaces: bool,
    /// Where Events go when there is no local object to attach them to.
    pub fallback_ref: ObjectReference,
    /// a flapping object cannot flood the API with Events
    pub events_sent: Mutex<EventLimiter>,
    /// keys whose exports conflict now: (losing remote, conflict kind) each
    pub export_conflicts: Mutex<HashMap<GroupKey, Vec<(String, &'static str)>>>,
    /// the Multi-Cluster Services API (`--mcs`)
    pub mcs: Option<Arc<McsLocal>>,
    /// followers a local user has taken over (each counted once)
    pub taken_over: Mutex<std::collections::HashSet<GroupKey>>,
}

/// How the Multi-Cluster Services API is served (`--mcs`).
#[derive(Clone, Debug, Default)]
pub struct McsSettings {
    /// this cluster's name when it has no ClusterProperty `cluster.clusterset.k8s.io`
    pub local_name: Option<String>,
}

/// How reconcile passes write.
#[derive(Clone, Debug)]
pub struct Settings {
    /// label key and endpoints mode
    pub opts: Options,
    /// namespaces mirrored (empty: all)
    pub namespaces: Vec<String>,
    /// create a missing namespace rather than wait for it
    pub create_namespaces: bool,
    /// log every write instead of sending it
    pub dry_run: bool,
    /// the deadline of one write
    pub api_timeout: std::time::Duration,
    /// the daemon's Lease (namespace, name): Events with no object of their own go there
    pub lease: (String, String),
    /// this replica's identity, on its Events
    pub identity: String,
    /// None: the MCS API is not served
    pub mcs: Option<McsSettings>,
    /// networks of the local cluster named by the operator (`--local-cidrs`), besides those
    /// its watches find
    pub local_cidrs: Vec<ipnet::IpNet>,
    /// the local pods' networks named by the operator (`--local-pod-cidrs`)
    pub local_pod_cidrs: Vec<ipnet::IpNet>,
    /// the shares of the local Service range remotes may hold
    pub service_ips: crate::state::service_ips::Shares,
}

/// Who records our Events.
const CONTROLLER: &str = "cross-cluster-controller";

/// The networks the operator named local, each with what it is.
fn configured_networks(
    any: Vec<ipnet::IpNet>,
    pods: Vec<ipnet::IpNet>,
) -> Vec<(ipnet::IpNet, crate::desired::addresses::Refusal)> {
    use crate::desired::addresses::Refusal;
    let any = any.into_iter().map(|n| (n, Refusal::LocalConfigured));
    pods.into_iter()
        .map(|n| (n, Refusal::LocalPodNetwork))
        .chain(any)
        .collect()
}

impl Ctx {
    /// What every reconcile shares: caches, the writer, Events, metrics.
    pub fn new(
        settings: Settings,
        local: &kube::Client,
        leader: &crate::runtime::lease::Leadership,
        metrics: &Arc<Metrics>,
    ) -> Self {
        let (namespace, name) = settings.lease;
        let fallback_ref = ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            name: Some(name),
            namespace: Some(namespace),
            ..Default::default()
        };
        let writer = Writer::new(
            local.clone(),
            leader.clone(),
            settings.dry_run,
            Arc::clone(metrics),
        )
        .with_deadline(settings.api_timeout)
        .with_reporter(kube::runtime::events::Reporter {
            controller: CONTROLLER.into(),
            instance: Some(settings.identity),
        });
        Ctx {
            opts: settings.opts,
            namespaces: settings.namespaces,
            remotes: Arc::new(Remotes::default()),
            local: Arc::new(
                LocalState::new(crate::state::Networks::new(configured_networks(
                    settings.local_cidrs,
                    settings.local_pod_cidrs,
                )))
                .with_shares(settings.service_ips),
            ),
            writer,
            metrics: Arc::clone(metrics),
            create_namespaces: settings.create_namespaces,
            fallback_ref,
            events_sent: Mutex::new(EventLimiter::new(std::time::Duration::from_secs(300))),
            export_conflicts: Mutex::default(),
            taken_over: Mutex::default(),
            mcs: settings.mcs.map(|m| {
                let fallback = m.local_name.unwrap_or_default();
                let who = crate::desired::mcs::Identity::Local;
                Arc::new(McsLocal::new(Arc::new(McsCluster::new(
                    who,
                    crate::state::LOCAL,
                    &fallback,
                ))))
            }),
        }
    }
}

impl Ctx {
    pub fn in_scope(&self, namespace: &str) -> bool {
        crate::desired::in_scope(&self.namespaces, namespace)
    }

    /// Followers on which each (remote, conflict kind) loses now.
    pub fn conflict_counts(&self) -> HashMap<(String, &'static str), i64> {
        let map = self.export_conflicts.lock();
        let mut out = HashMap::new();
        for (remote, kind) in map.values().flatten() {
            *out.entry((remote.clone(), *kind)).or_insert(0) += 1;
        }
        out
    }
}

/// The same Event (object, reason) is sent at most once per interval.
pub struct EventLimiter {
    interval: std::time::Duration,
    sent: HashMap<(String, String), std::time::Instant>,
}

impl EventLimiter {
    pub fn new(interval: std::time::Duration) -> Self {
        Self {
            interval,
            sent: HashMap::new(),
        }
    }

    pub fn allow(&mut self, object: String, reason: &str, now: std::time::Instant) -> bool {
        let interval = self.interval;
        if self.sent.len() > 10_000 {
            self.sent.retain(|_, at| now.duration_since(*at) < interval);
        }
        let key = (object, reason.to_string());
        match self.sent.get(&key) {
            Some(at) if now.duration_since(*at) < interval => false,
            _ => {
                self.sent.insert(key, now);
                true
            }
        }
    }
}

impl Ctx {
    /// Writes go through the writer; what the API server returned goes into the local cache at
    /// once (write-through), so the watch event our own write causes finds the key converged
    /// and costs no request.
    pub(super) async fn create<K: Cached>(&self, obj: &K) -> Result<Written<K>> {
        let written = self.writer.create(obj).await?;
        self.remember(&written);
        Ok(written)
    }

    pub(super) async fn replace<K: Cached>(&self, obj: &K) -> Result<Written<K>> {
        let written = self.writer.replace(obj).await?;
        self.remember(&written);
        Ok(written)
    }

    fn remember<K: Cached>(&self, written: &Written<K>) {
        if let Written::Done(obj) = written {
            K::cache(&self.local)
                .write()
                .apply(kube::runtime::watcher::Event::Apply(obj.clone()));
        }
    }

    pub(crate) async fn event(
        &self,
        type_: EventType,
        reason: &str,
        note: String,
        action: &str,
        on: Option<ObjectReference>,
    ) {
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(note),
            action: action.into(),
            secondary: None,
        };
        if !self.writer.leads() {
            // only the leader (the Lease holder) records Events; the rate limit is kept for when it sends one
            debug!(reason, "not the leader: Event not recorded");
            return;
        }
        let reference = on.unwrap_or_else(|| self.fallback_ref.clone());
        let id = format!(
            "{}/{}/{}",
            reference.kind.as_deref().unwrap_or_default(),
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        let allowed = self
            .events_sent
            .lock()
            .allow(id, reason, std::time::Instant::now());
        if !allowed {
            self.metrics.events_suppressed.inc();
            return;
        }
        if let Err(e) = self.writer.event(&ev, &reference).await {
            debug!(error = %e, "could not record an Event");
        }
    }

    /// An exported Service of `remote` (empty: the key as a whole) that cannot be mirrored now.
    pub(super) async fn skip(
        &self,
        key: &Key,
        remote: &str,
        reason: &'static str,
        why: String,
        on: Option<ObjectReference>,
    ) -> Outcome {
        warn!(key = %key, remote, reason, "skipped: {why}");
        self.metrics
            .skipped
            .get_or_create(&ByRemoteReason::new(remote, reason))
            .inc();
        let from = if remote.is_empty() {
            String::new()
        } else {
            format!(" (from {remote})")
        };
        self.event(
            EventType::Warning,
            reason,
            format!("{key}{from}: {why}"),
            "Skip",
            on,
        )
        .await;
        Outcome::Skipped(reason)
    }

    /// A local object of the key's name that is not our follower: left untouched, reported.
    /// Addresses a remote listed that its policy refused: counted by reason, and an Event on the
    /// object they were kept out of (rate-limited like every Event).
    pub(super) async fn refused(
        &self,
        key: &Key,
        remote: &str,
        refused: &crate::desired::addresses::Refused,
        on: Option<ObjectReference>,
    ) {
        for (why, n) in &refused.counts {
            self.metrics
                .addresses_refused
                .get_or_create(&ByRemoteReason::new(remote, why.reason()))
                .inc_by(*n as u64);
        }
        let what = refused.describe();
        warn!(key = %key, remote, "remote addresses refused: {what}");
        let note = format!("{key} (from {remote}): {what}");
        self.event(EventType::Warning, "AddressRefused", note, "Mirror", on)
            .await;
    }

    /// The winner's labels are over `--remote-max-label-bytes`: logged and an Event on the
    /// follower (rate-limited like every Event); counted with the labels refused (reason
    /// `over_limit`) and in `xcc_remote_write_limited`.
    pub(super) async fn labels_held(
        &self,
        key: &Key,
        remote: &str,
        held: &crate::desired::limits::LabelsHeld,
        on: Option<ObjectReference>,
    ) {
        warn!(key = %key, remote, "labels over the limit: {held}");
        let note = format!("{key} (from {remote}): {held}");
        self.event(EventType::Warning, "LabelsOverLimit", note, "Mirror", on)
            .await;
    }

    pub(super) async fn conflict(
        &self,
        key: &Key,
        remote: &str,
        kind: &'static str,
        obj: ObjectReference,
    ) -> Outcome {
        warn!(key = %key, kind, "conflict: a local {kind} of that name exists and is not our follower; left untouched");
        self.metrics
            .conflicts
            .get_or_create(&ByRemoteKind::new(remote, kind))
            .inc();
        let note = format!(
            "{kind} exists and is not a follower of {remote}: not mirrored, left untouched"
        );
        self.event(
            EventType::Warning,
            "NotOurFollower",
            note,
            "Mirror",
            Some(obj),
        )
        .await;
        Outcome::Conflict
    }
}

impl Ctx {
    /// An export into a namespace the daemon never writes in (`--protected-namespaces`): nothing
    /// is written there; each exporting remote is counted and logged, and the Event goes on the
    /// daemon's Lease (an Event in that namespace would be a write there).
    pub(super) async fn refuse_protected(&self, key: &Key, remotes: &[String]) -> Outcome {
        let why = format!(
            "namespace {:?} is protected (--protected-namespaces): nothing is written there",
            key.namespace
        );
        for remote in remotes {
            self.skip(
                key,
                remote,
                crate::desired::NAMESPACE_PROTECTED,
                why.clone(),
                None,
            )
            .await;
        }
        Outcome::Skipped(crate::desired::NAMESPACE_PROTECTED)
    }

    /// Counts the labels a pass did not copy, by remote and why.
    pub(super) fn count_refused_labels(
        &self,
        refused: &[(String, crate::desired::containment::Refused)],
    ) {
        for (remote, by_why) in refused {
            for (why, n) in by_why {
                self.metrics
                    .labels_refused
                    .get_or_create(&ByRemoteReason::new(remote, why.label()))
                    .inc_by(u64::from(*n));
            }
        }
    }

    /// A follower a local user has taken over: counted once, logged, an Event on it
    /// (rate-limited).
    pub(super) async fn report_taken_over(
        &self,
        key: &Key,
        remote: &str,
        why: &str,
        obj: ObjectReference,
    ) {
        if self.taken_over.lock().insert(key.group()) {
            warn!(key = %key, remote, "a local user took the follower over ({why}): left alone, only our own slices removed");
            self.metrics
                .taken_over
                .get_or_create(&crate::runtime::metrics::ByRemote::new(remote))
                .inc();
        }
        let note = format!(
            "taken over by a local user ({why}): no longer a follower of {remote}; left alone, only the daemon's own EndpointSlices removed"
        );
        self.event(
            EventType::Warning,
            "FollowerTakenOver",
            note,
            "Mirror",
            Some(obj),
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn the_same_event_is_sent_once_per_interval() {
        let mut l = EventLimiter::new(Duration::from_secs(300));
        let t0 = Instant::now();
        assert!(l.allow("Service/a/x".into(), "Skip", t0));
        assert!(
            !l.allow("Service/a/x".into(), "Skip", t0 + Duration::from_secs(10)),
            "a flapping object is muted"
        );
        assert!(
            l.allow("Service/a/x".into(), "NotOurFollower", t0),
            "another reason is another Event"
        );
        assert!(
            l.allow("Service/a/y".into(), "Skip", t0),
            "another object is another Event"
        );
        assert!(
            l.allow("Service/a/x".into(), "Skip", t0 + Duration::from_secs(301)),
            "allowed again later"
        );
    }
}
