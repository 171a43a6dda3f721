//! What a reconcile pass works with: its key (one local follower), the caches of every remote
//! and of the local followers, and the context it writes through. The pass itself is in
//! [`pass`].
use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{Event, EventType};
use tracing::{debug, warn};

use crate::cache::{Cache, GroupKey, by_name, by_service_label};
use crate::desired::Options;
use crate::error::Result;
use crate::metrics::{Metrics, labels};
use crate::writer::{Writer, Written};

mod pass;

pub use pass::reconcile;

/// What a reconcile works on: one local follower (namespace/name), whichever remotes export it,
/// so two remotes can never write one local object at once.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Key {
    pub fn group(&self) -> GroupKey {
        (self.namespace.clone(), self.name.clone())
    }
}

/// What one remote cluster looks like, as its watches have seen it.
pub struct RemoteState {
    pub name: Arc<str>,
    pub opts: Options,
    /// namespaces mirrored from this remote (empty: all)
    pub namespaces: Vec<String>,
    pub services: RwLock<Cache<Service>>,
    /// slices carrying the leader label (kube-controller-manager copies a Service's labels onto
    /// the slices it makes)
    pub slices: RwLock<Cache<EndpointSlice>>,
    /// slices written by anyone else (a selectorless Service's slices, other controllers'),
    /// which carry only `kubernetes.io/service-name`; see [`Options::foreign_slice_selector`]
    pub foreign_slices: RwLock<Cache<EndpointSlice>>,
    /// the outage policy: after this long unreachable, its endpoints are marked not ready
    pub stale_after: Option<std::time::Duration>,
    /// true while the outage policy marks its endpoints not ready
    pub marked: std::sync::atomic::AtomicBool,
    /// what its credential says (expiry), set once when it joins (see [`crate::credentials`])
    pub credential: std::sync::OnceLock<crate::credentials::Credential>,
}

impl RemoteState {
    pub fn new(name: &str, opts: Options, namespaces: Vec<String>) -> Self {
        Self {
            name: name.into(),
            opts,
            namespaces,
            services: RwLock::new(Cache::new(by_name::<Service>)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            foreign_slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            stale_after: None,
            marked: std::sync::atomic::AtomicBool::new(false),
            credential: std::sync::OnceLock::new(),
        }
    }

    /// With the outage policy (see [`crate::outage`]).
    pub fn with_stale_after(mut self, stale_after: Option<std::time::Duration>) -> Self {
        self.stale_after = stale_after;
        self
    }

    /// Whether the outage policy marks this remote's endpoints not ready now.
    pub fn is_marked(&self) -> bool {
        self.marked.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn ready(&self) -> bool {
        read(&self.services).ready()
            && read(&self.slices).ready()
            && read(&self.foreign_slices).ready()
    }

    /// Every remote slice of one Service, from both slice watches (a slice is in at most one of
    /// them, except briefly while its labels change: then it is counted once).
    pub fn slices_of(&self, g: &GroupKey) -> Result<Vec<Arc<EndpointSlice>>> {
        let mut all = read(&self.slices).group(g)?;
        let foreign = read(&self.foreign_slices).group(g)?;
        for s in foreign {
            if !all.iter().any(|a| a.metadata.name == s.metadata.name) {
                all.push(s);
            }
        }
        Ok(all)
    }

    /// None when healthy; otherwise why not, for /readyz.
    pub fn problem(&self) -> Option<String> {
        // one guard at a time: a second read of a lock this thread already holds can deadlock
        // behind a waiting writer
        let status = |what: &str, ready: bool, error: Option<&str>| match (ready, error) {
            (_, Some(e)) => Some(format!("watch of {what} failing: {e}")),
            (false, None) => Some(format!("first listing of {what} not complete")),
            (true, None) => None,
        };
        let services = {
            let c = read(&self.services);
            status("Services", c.ready(), c.error())
        };
        services
            .or_else(|| {
                let c = read(&self.slices);
                status("EndpointSlices", c.ready(), c.error())
            })
            .or_else(|| {
                let c = read(&self.foreign_slices);
                status("EndpointSlices of other managers", c.ready(), c.error())
            })
    }

    /// Seconds since the oldest of this remote's last complete listings.
    pub fn seconds_since_list(&self) -> Option<f64> {
        let a = read(&self.services).last_list()?;
        let b = read(&self.slices).last_list()?;
        let c = read(&self.foreign_slices).last_list()?;
        Some(a.min(b).min(c).elapsed().as_secs_f64())
    }

    pub fn in_scope(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }
}

/// Our followers in the local cluster (everything labelled `<key>=follower`).
pub struct LocalState {
    pub services: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
    pub endpoints: RwLock<Cache<Endpoints>>,
}

impl Default for LocalState {
    fn default() -> Self {
        Self {
            services: RwLock::new(Cache::new(by_name::<Service>)),
            slices: RwLock::new(Cache::new(by_service_label::<EndpointSlice>)),
            endpoints: RwLock::new(Cache::new(by_name::<Endpoints>)),
        }
    }
}

impl LocalState {
    pub fn ready(&self) -> bool {
        read(&self.services).ready() && read(&self.slices).ready() && read(&self.endpoints).ready()
    }
}

/// Which local cache holds a kind we write.
pub trait Cached: crate::writer::Local {
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

/// Caches are only ever updated in short, non-panicking sections; a poisoned lock still holds
/// a consistent map.
pub fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

pub fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

pub struct Ctx {
    /// label key and endpoints mode (the per-remote names are in each remote's options)
    pub opts: Options,
    /// the namespaces mirrored (empty: all)
    pub namespaces: Vec<String>,
    pub remotes: Arc<crate::registry::Registry>,
    pub local: Arc<LocalState>,
    /// every local write, Events included
    pub writer: Writer,
    pub metrics: Arc<Metrics>,
    pub create_namespaces: bool,
    /// Where Events go when there is no local object to attach them to.
    pub fallback_ref: ObjectReference,
    /// a flapping object cannot flood the API with Events
    pub events_sent: std::sync::Mutex<EventLimiter>,
    /// keys whose exports conflict now: (losing remote, conflict kind) each
    pub export_conflicts: std::sync::Mutex<HashMap<GroupKey, Vec<(String, &'static str)>>>,
}

impl Ctx {
    pub fn in_scope(&self, namespace: &str) -> bool {
        self.namespaces.is_empty() || self.namespaces.iter().any(|n| n == namespace)
    }

    /// Followers on which each (remote, conflict kind) loses now.
    pub fn conflict_counts(&self) -> HashMap<(String, &'static str), i64> {
        let map = self
            .export_conflicts
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Deleted,
    Unchanged,
    Skipped(&'static str),
    Conflict,
    NotReady,
}

/// The skip reason of a leader whose local namespace does not exist (yet).
pub const NAMESPACE_MISSING: &str = "NamespaceMissing";

impl Outcome {
    /// Every label [`Outcome::label`] returns, `error` (a pass that failed) and `not_leader`
    /// (a key set aside because this replica no longer leads).
    pub const LABELS: [&'static str; 8] = [
        "applied",
        "deleted",
        "unchanged",
        "skipped",
        "conflict",
        "not_ready",
        "error",
        "not_leader",
    ];

    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Deleted => "deleted",
            Outcome::Unchanged => "unchanged",
            Outcome::Skipped(_) => "skipped",
            Outcome::Conflict => "conflict",
            Outcome::NotReady => "not_ready",
        }
    }
}

impl Ctx {
    /// Writes go through the writer; what the API server returned goes into the local cache at
    /// once (write-through), so the watch event our own write causes finds the key converged
    /// and costs no request.
    async fn create<K: Cached>(&self, obj: &K) -> Result<Written<K>> {
        let written = self.writer.create(obj).await?;
        self.remember(&written);
        Ok(written)
    }

    async fn replace<K: Cached>(&self, obj: &K) -> Result<Written<K>> {
        let written = self.writer.replace(obj).await?;
        self.remember(&written);
        Ok(written)
    }

    fn remember<K: Cached>(&self, written: &Written<K>) {
        if let Written::Done(obj) = written {
            write(K::cache(&self.local)).apply(kube::runtime::watcher::Event::Apply(obj.clone()));
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
            // only the leader records Events; the rate limit is kept for when it sends one
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
            .unwrap_or_else(|p| p.into_inner())
            .allow(id, reason, std::time::Instant::now());
        if !allowed {
            self.metrics.events_suppressed.inc();
            return;
        }
        if let Err(e) = self.writer.event(&ev, &reference).await {
            debug!(error = %e, "could not record an Event");
        }
    }

    /// A leader of `remote` (empty: the key as a whole) that cannot be mirrored now.
    async fn skip(
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
            .get_or_create(&labels([("remote", remote), ("reason", reason)]))
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
    async fn conflict(
        &self,
        key: &Key,
        remote: &str,
        kind: &'static str,
        obj: ObjectReference,
    ) -> Outcome {
        warn!(key = %key, kind, "conflict: a local {kind} of that name exists and is not our follower; left untouched");
        self.metrics
            .conflicts
            .get_or_create(&labels([("remote", remote), ("kind", kind)]))
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
