//! One reconcile pass for one key (remote cluster / namespace / name): read the caches, compute
//! the desired follower (pure), and bring the local cluster to it through the writer, touching
//! only objects we own.
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, RwLock};

use k8s_openapi::api::core::v1::{Endpoints, Namespace, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Resource, ResourceExt};
use tracing::{debug, info, warn};

use crate::cache::{Cache, GroupKey, by_name, by_service_label};
use crate::desired::{
    self, Follower, Options, Ownership, ServiceChange, endpoints_change, endpoints_ownership,
    service_change, service_ownership, set_slice_owner, slice_change, slice_ownership,
};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, labels};
use crate::writer::{Writer, Written};

/// What a reconcile works on: one leader of one remote cluster.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub remote: Arc<str>,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.remote, self.namespace, self.name)
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
        }
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
    pub remotes: Arc<crate::registry::Registry>,
    pub local: Arc<LocalState>,
    pub writer: Writer,
    pub recorder: Recorder,
    pub metrics: Arc<Metrics>,
    pub create_namespaces: bool,
    /// Where Events go when there is no local object to attach them to.
    pub fallback_ref: ObjectReference,
    /// a flapping object cannot flood the API with Events
    pub events_sent: std::sync::Mutex<EventLimiter>,
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
    /// Every label [`Outcome::label`] returns, and `error` (a pass that failed).
    pub const LABELS: [&'static str; 7] = [
        "applied",
        "deleted",
        "unchanged",
        "skipped",
        "conflict",
        "not_ready",
        "error",
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

/// A snapshot of everything one key needs, taken under short read locks.
struct Snapshot {
    leader: Option<Arc<Service>>,
    remote_slices: Vec<Arc<EndpointSlice>>,
    service: Option<Arc<Service>>,
    slices: Vec<Arc<EndpointSlice>>,
    endpoints: Option<Arc<Endpoints>>,
}

impl Ctx {
    /// A cached object that cannot be read back fails the pass (retried, nothing deleted): an
    /// unreadable leader must never look like a missing one.
    fn snapshot(&self, remote: &RemoteState, g: &GroupKey) -> Result<Snapshot> {
        Ok(Snapshot {
            leader: read(&remote.services).named(g)?,
            remote_slices: remote.slices_of(g)?,
            service: read(&self.local.services).named(g)?,
            slices: read(&self.local.slices).group(g)?,
            endpoints: read(&self.local.endpoints).named(g)?,
        })
    }

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
        if let Err(e) = self.recorder.publish(&ev, &reference).await {
            debug!(error = %e, "could not record an Event");
        }
    }

    async fn skip(
        &self,
        key: &Key,
        reason: &'static str,
        why: String,
        on: Option<ObjectReference>,
    ) -> Outcome {
        warn!(key = %key, reason, "skipped: {why}");
        self.metrics
            .skipped
            .get_or_create(&labels([("remote", &key.remote), ("reason", reason)]))
            .inc();
        self.event(
            EventType::Warning,
            reason,
            format!("{key}: {why}"),
            "Skip",
            on,
        )
        .await;
        Outcome::Skipped(reason)
    }

    async fn conflict(&self, key: &Key, kind: &'static str, obj: ObjectReference) -> Outcome {
        warn!(key = %key, kind, "conflict: a local {kind} of that name exists and is not our follower; left untouched");
        self.metrics
            .conflicts
            .get_or_create(&labels([("remote", &key.remote), ("kind", kind)]))
            .inc();
        let note = format!(
            "{kind} exists and is not a follower of {}: not mirrored, left untouched",
            key.remote
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

fn is_ours(o: Ownership) -> bool {
    matches!(o, Ownership::Ours | Ownership::Adoptable)
}

fn uid_of<K: Resource<DynamicType = ()>>(o: &K) -> Result<String> {
    o.meta()
        .uid
        .clone()
        .ok_or_else(|| Error::Config(format!("{} {} has no uid", K::kind(&()), o.name_any())))
}

pub async fn reconcile(ctx: &Ctx, key: &Key) -> Result<Outcome> {
    let Some(remote) = ctx.remotes.state(&key.remote) else {
        return Ok(Outcome::NotReady);
    };
    // a cache that has not completed a listing proves nothing: no decision on it
    if !remote.ready() || !ctx.local.ready() {
        return Ok(Outcome::NotReady);
    }
    if !remote.in_scope(&key.namespace) {
        return Ok(Outcome::Unchanged);
    }
    let g = key.group();
    let snap = ctx.snapshot(&remote, &g)?;
    let opts = &remote.opts;
    let outcome = match &snap.leader {
        None => remove_follower(ctx, key, opts, &snap).await?,
        Some(leader) => {
            let slices: Vec<&EndpointSlice> = snap.remote_slices.iter().map(Arc::as_ref).collect();
            match desired::follower(leader, &slices, opts) {
                Ok(f) => apply_follower(ctx, key, opts, &snap, f).await?,
                Err(skip) => {
                    let on = snap.service.as_ref().map(|s| s.object_ref(&()));
                    ctx.skip(key, skip.reason(), skip.to_string(), on).await
                }
            }
        }
    };
    ctx.metrics
        .reconciles
        .get_or_create(&labels([
            ("remote", &key.remote),
            ("outcome", outcome.label()),
        ]))
        .inc();
    Ok(outcome)
}

/// The leader is confirmed gone (absent from a complete listing, or deleted): remove what we own.
async fn remove_follower(ctx: &Ctx, key: &Key, opts: &Options, snap: &Snapshot) -> Result<Outcome> {
    let mut deleted = false;
    let ns = &key.namespace;
    for s in snap
        .slices
        .iter()
        .filter(|s| is_ours(slice_ownership(s, opts)))
    {
        ctx.writer
            .delete::<EndpointSlice>(ns, &s.name_any(), &uid_of(s.as_ref())?, "leader gone")
            .await?;
        deleted = true;
    }
    if let Some(ep) = snap
        .endpoints
        .as_ref()
        .filter(|e| is_ours(endpoints_ownership(e, opts)))
    {
        ctx.writer
            .delete::<Endpoints>(ns, &ep.name_any(), &uid_of(ep.as_ref())?, "leader gone")
            .await?;
        deleted = true;
    }
    if let Some(svc) = snap
        .service
        .as_ref()
        .filter(|s| is_ours(service_ownership(s, opts)))
    {
        ctx.writer
            .delete::<Service>(ns, &svc.name_any(), &uid_of(svc.as_ref())?, "leader gone")
            .await?;
        deleted = true;
    }
    Ok(if deleted {
        Outcome::Deleted
    } else {
        Outcome::Unchanged
    })
}

enum ServiceState {
    /// the follower exists (or was just written) with this uid
    Ready {
        uid: String,
        changed: bool,
    },
    Done(Outcome),
}

async fn ensure_service(
    ctx: &Ctx,
    key: &Key,
    opts: &Options,
    actual: Option<Service>,
    desired: &Service,
) -> Result<ServiceState> {
    let mut actual = actual;
    // at most: create -> AlreadyExists -> read it -> update it
    for _ in 0..3 {
        let Some(live) = actual.take() else {
            match ctx.create(desired).await {
                Ok(Written::Done(s)) => {
                    return Ok(ServiceState::Ready {
                        uid: uid_of(&s)?,
                        changed: true,
                    });
                }
                Ok(Written::Skipped) => return Ok(ServiceState::Done(Outcome::Applied)),
                Err(e) if e.api_code() == Some(409) => {
                    // exists but not in our cache: it may well not be ours, so look before touching
                    let api: Api<Service> =
                        Api::namespaced(ctx.writer.client().clone(), &key.namespace);
                    actual = api.get_opt(&key.name).await?;
                    continue;
                }
                Err(e) if e.api_code() == Some(404) => return namespace_missing(ctx, key).await,
                Err(e) => return Err(e),
            }
        };
        let ownership = service_ownership(&live, opts);
        if !is_ours(ownership) {
            return Ok(ServiceState::Done(
                ctx.conflict(key, "Service", live.object_ref(&())).await,
            ));
        }
        if ownership == Ownership::Adoptable {
            info!(key = %key, "adopting a follower left by the Go controller");
        }
        match service_change(&live, desired) {
            ServiceChange::Unchanged => {
                return Ok(ServiceState::Ready {
                    uid: uid_of(&live)?,
                    changed: false,
                });
            }
            ServiceChange::Update(s) => {
                return match ctx.replace(s.as_ref()).await? {
                    Written::Done(s) => Ok(ServiceState::Ready {
                        uid: uid_of(&s)?,
                        changed: true,
                    }),
                    Written::Skipped => Ok(ServiceState::Done(Outcome::Applied)),
                };
            }
            ServiceChange::Recreate => {
                ctx.writer
                    .delete::<Service>(
                        &key.namespace,
                        &key.name,
                        &uid_of(&live)?,
                        "cannot change in place",
                    )
                    .await?;
                actual = None;
            }
        }
    }
    Err(Error::Config(format!(
        "{key}: the follower Service kept changing under us"
    )))
}

async fn namespace_missing(ctx: &Ctx, key: &Key) -> Result<ServiceState> {
    if ctx.create_namespaces {
        let api: Api<Namespace> = Api::all(ctx.writer.client().clone());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(key.namespace.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => info!(namespace = %key.namespace, "created missing namespace"),
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        // retried by the caller's back-off, now that the namespace exists
        return Err(Error::Config(format!(
            "namespace {} was just created",
            key.namespace
        )));
    }
    let why = format!(
        "local namespace {:?} does not exist; mirrored as soon as it does",
        key.namespace
    );
    Ok(ServiceState::Done(
        ctx.skip(key, NAMESPACE_MISSING, why, None).await,
    ))
}

async fn apply_follower(
    ctx: &Ctx,
    key: &Key,
    opts: &Options,
    snap: &Snapshot,
    mut f: Follower,
) -> Result<Outcome> {
    let actual = snap.service.as_deref().cloned();
    let (uid, mut changed) = match ensure_service(ctx, key, opts, actual, &f.service).await? {
        ServiceState::Ready { uid, changed } => (uid, changed),
        ServiceState::Done(outcome) => return Ok(outcome),
    };
    let ns = &key.namespace;

    // EndpointSlices: ours by name; others (e.g. mirrored by kube-controller-manager) untouched
    set_slice_owner(&mut f.slices, &key.name, &uid);
    let mut ours: BTreeMap<String, Arc<EndpointSlice>> = snap
        .slices
        .iter()
        .filter(|s| is_ours(slice_ownership(s, opts)))
        .map(|s| (s.name_any(), Arc::clone(s)))
        .collect();
    for want in &f.slices {
        match ours.remove(&want.name_any()) {
            Some(have) => {
                if let Some(update) = slice_change(&have, want) {
                    ctx.replace(&update).await?;
                    changed = true;
                }
            }
            None => match ctx.create(want).await {
                Ok(_) => changed = true,
                Err(e) if e.api_code() == Some(409) => {
                    // our cache has not seen it yet (our own earlier write, usually): compare live
                    let api: Api<EndpointSlice> = Api::namespaced(ctx.writer.client().clone(), ns);
                    let Some(live) = api.get_opt(&want.name_any()).await? else {
                        return Err(e);
                    };
                    if !is_ours(slice_ownership(&live, opts)) {
                        return Ok(ctx
                            .conflict(key, "EndpointSlice", live.object_ref(&()))
                            .await);
                    }
                    if let Some(update) = slice_change(&live, want) {
                        ctx.replace(&update).await?;
                        changed = true;
                    }
                }
                Err(e) => return Err(e),
            },
        }
    }
    for (name, stale) in ours {
        ctx.writer
            .delete::<EndpointSlice>(ns, &name, &uid_of(stale.as_ref())?, "no longer desired")
            .await?;
        changed = true;
    }

    // legacy Endpoints
    let have_ep = snap
        .endpoints
        .as_deref()
        .filter(|e| is_ours(endpoints_ownership(e, opts)));
    match (&f.endpoints, have_ep) {
        (Some(want), Some(have)) => {
            if let Some(update) = endpoints_change(have, want) {
                ctx.replace(&update).await?;
                changed = true;
            }
        }
        (Some(want), None) => match ctx.create(want).await {
            Ok(_) => changed = true,
            Err(e) if e.api_code() == Some(409) => {
                let api: Api<Endpoints> = Api::namespaced(ctx.writer.client().clone(), ns);
                let Some(live) = api.get_opt(&key.name).await? else {
                    return Err(e);
                };
                if !is_ours(endpoints_ownership(&live, opts)) {
                    return Ok(ctx.conflict(key, "Endpoints", live.object_ref(&())).await);
                }
                if let Some(update) = endpoints_change(&live, want) {
                    ctx.replace(&update).await?;
                    changed = true;
                }
            }
            Err(e) => return Err(e),
        },
        (None, Some(have)) => {
            ctx.writer
                .delete::<Endpoints>(ns, &key.name, &uid_of(have)?, "not desired in this mode")
                .await?;
            changed = true;
        }
        (None, None) => {}
    }
    Ok(if changed {
        Outcome::Applied
    } else {
        Outcome::Unchanged
    })
}

/// Reconcile decisions against a mock API server (see `fixtures`): each test states every
/// request a pass must send, in order; any other request fails it.
#[cfg(test)]
mod decision_tests {
    use super::*;
    use crate::desired::test_support::{cluster_ip_service, endpoint, slice, web_ports};
    use crate::desired::{MANAGED_BY, MANAGED_BY_LABEL};
    use crate::fixtures::{
        self, ApiServer, created, delete, get, loaded, ok, opts, post, put, run, status,
    };
    use serde_json::{Value, json};
    use tokio::sync::watch;

    const SERVICES: &str = "/api/v1/namespaces/shop/services";
    const WEB: &str = "/api/v1/namespaces/shop/services/web";
    const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices";
    const EVENTS: &str = "/apis/events.k8s.io/v1/namespaces/shop/events";

    struct Setup {
        ctx: Ctx,
        api: ApiServer,
        _lease: watch::Sender<Option<std::time::Instant>>,
    }

    /// Caches that completed their listings with these objects, and a leading writer.
    fn setup(
        leaders: Vec<Service>,
        remote_slices: Vec<EndpointSlice>,
        local_services: Vec<Service>,
        local_slices: Vec<EndpointSlice>,
    ) -> Setup {
        let remote = RemoteState::new(fixtures::REMOTE, opts(), vec![]);
        loaded(&remote.services, leaders);
        loaded(&remote.slices, remote_slices);
        loaded(&remote.foreign_slices, []);
        let local = LocalState::default();
        loaded(&local.services, local_services);
        loaded(&local.slices, local_slices);
        loaded(&local.endpoints, []);
        let (client, api) = fixtures::client("local");
        let (tx, leadership) = fixtures::leadership(true);
        let ctx = fixtures::ctx(client, leadership, vec![Arc::new(remote)], Arc::new(local));
        Setup {
            ctx,
            api,
            _lease: tx,
        }
    }

    fn key() -> Key {
        Key {
            remote: fixtures::REMOTE.into(),
            namespace: "shop".into(),
            name: "web".into(),
        }
    }

    /// The follower the leader `cluster_ip_service()` asks for, as JSON.
    fn desired_follower() -> Value {
        let f = desired::follower(&cluster_ip_service(), &[], &opts()).unwrap();
        serde_json::to_value(&f.service).unwrap()
    }

    /// The desired follower as the API server holds it.
    fn live_follower(uid: &str, resource_version: &str) -> Value {
        let mut v = desired_follower();
        v["metadata"]["uid"] = json!(uid);
        v["metadata"]["resourceVersion"] = json!(resource_version);
        v
    }

    /// What the events API returns for a created Event.
    fn event() -> fixtures::Reply {
        created(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
                       "metadata": {"name": "web.1", "namespace": "shop"},
                       "eventTime": "2025-01-01T00:00:00.000000Z"}))
    }

    fn local_slice(name: &str, managed_by: &str, origin: &str) -> EndpointSlice {
        fixtures::obj(json!({
            "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                         "resourceVersion": "4",
                         "labels": {"fair.com/cross-cluster": "follower",
                                    "kubernetes.io/service-name": "web",
                                    MANAGED_BY_LABEL: managed_by},
                         "annotations": {"fair.com/cross-cluster-origin-cluster": origin}},
            "addressType": "IPv4", "endpoints": [],
        }))
    }

    #[tokio::test]
    async fn a_409_on_create_of_a_service_that_is_not_a_follower_leads_to_no_further_write() {
        let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            let sent = s
                .api
                .expect(post(SERVICES), status(409, "AlreadyExists"))
                .await;
            assert_eq!(
                sent.body["metadata"]["labels"]["fair.com/cross-cluster"],
                "follower"
            );
            // not in our cache: look before touching
            let theirs = json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"namespace": "shop", "name": "web", "uid": "uid-theirs",
                             "resourceVersion": "3", "labels": {"app": "theirs"}},
                "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}});
            s.api.expect(get(WEB), ok(theirs)).await;
            // reported on their object; no PUT, no DELETE
            let ev = s.api.expect(post(EVENTS), event()).await;
            assert_eq!(ev.body["reason"], "NotOurFollower");
            assert_eq!(ev.body["regarding"]["uid"], "uid-theirs");
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Conflict);
    }

    /// A live follower whose origin is another remote, remote-b.
    fn follower_of_remote_b() -> serde_json::Value {
        let mut theirs = live_follower("uid-b", "5");
        theirs["metadata"]["annotations"]["fair.com/cross-cluster-origin-cluster"] =
            json!("remote-b");
        theirs
    }

    #[tokio::test]
    async fn a_local_follower_of_another_remote_is_never_written() {
        let mut theirs = follower_of_remote_b();
        theirs["spec"]["ports"][0]["port"] = json!(81);
        let s = setup(
            vec![cluster_ip_service()],
            vec![],
            vec![fixtures::obj(theirs)],
            vec![],
        );
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            let ev = s.api.expect(post(EVENTS), event()).await;
            assert_eq!(ev.body["reason"], "NotOurFollower");
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Conflict);
    }

    #[tokio::test]
    async fn when_the_leader_is_gone_only_what_is_ours_is_deleted() {
        let s = setup(
            vec![],
            vec![],
            vec![fixtures::obj(live_follower("uid-web", "5"))],
            vec![
                local_slice("web-abc", MANAGED_BY, fixtures::REMOTE),
                // mirrored from an Endpoints object by kube-controller-manager: not ours
                local_slice(
                    "web-mirrored",
                    "endpointslicemirroring-controller.k8s.io",
                    fixtures::REMOTE,
                ),
            ],
        );
        let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                          "code": 200, "metadata": {}});
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            let sent = s
                .api
                .expect(delete(&format!("{SLICES}/web-abc")), ok(gone.clone()))
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-web-abc");
            let sent = s.api.expect(delete(WEB), ok(gone.clone())).await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-web");
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Deleted);
    }

    #[tokio::test]
    async fn a_follower_of_another_remote_is_not_deleted_when_our_leader_is_gone() {
        let theirs = follower_of_remote_b();
        let s = setup(
            vec![],
            vec![],
            vec![fixtures::obj(theirs)],
            vec![local_slice("web-b", MANAGED_BY, "remote-b")],
        );
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Unchanged);
    }

    #[tokio::test]
    async fn nothing_is_decided_before_every_cache_has_listed() {
        let s = setup(
            vec![],
            vec![],
            vec![fixtures::obj(live_follower("uid-web", "5"))],
            vec![],
        );
        // the local Endpoints watch restarted and has not completed a listing yet
        *write(&s.ctx.local.endpoints) = Cache::new(crate::cache::by_name::<Endpoints>);
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
            .await
            .unwrap();
        assert_eq!(
            outcome,
            Outcome::NotReady,
            "an absent leader is not a gone leader until every cache has listed"
        );
    }

    #[tokio::test]
    async fn a_409_on_create_of_our_own_follower_updates_the_version_read() {
        let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
        let mut stale = live_follower("uid-web", "7");
        stale["spec"]["ports"][0]["port"] = json!(81);
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            s.api
                .expect(post(SERVICES), status(409, "AlreadyExists"))
                .await;
            s.api.expect(get(WEB), ok(stale)).await;
            let sent = s
                .api
                .expect(put(WEB), ok(live_follower("uid-web", "8")))
                .await;
            assert_eq!(sent.body["metadata"]["resourceVersion"], "7");
            assert_eq!(sent.body["metadata"]["uid"], "uid-web");
            assert_eq!(sent.body["spec"]["ports"][0]["port"], 80);
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Applied);
        let cached = read(&s.ctx.local.services).named(&key().group()).unwrap();
        assert_eq!(
            cached
                .and_then(|c| c.metadata.resource_version.clone())
                .as_deref(),
            Some("8"),
            "what the server returned is cached at once (write-through)"
        );
    }

    #[tokio::test]
    async fn a_new_leader_gets_its_service_then_slices_owned_by_the_uid_created() {
        let remote_slice = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let s = setup(
            vec![cluster_ip_service()],
            vec![remote_slice],
            vec![],
            vec![],
        );
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            s.api
                .expect(post(SERVICES), created(live_follower("new-uid", "1")))
                .await;
            let sent = s
                .api
                .expect(
                    post(SLICES),
                    created(json!({"metadata": {"namespace": "shop", "name": "web-x",
                                    "uid": "uid-slice", "resourceVersion": "2"},
                                   "addressType": "IPv4", "endpoints": []})),
                )
                .await;
            assert_eq!(
                sent.body["metadata"]["ownerReferences"][0]["uid"],
                "new-uid"
            );
            assert_eq!(
                sent.body["metadata"]["labels"][MANAGED_BY_LABEL],
                MANAGED_BY
            );
            assert_eq!(sent.body["endpoints"][0]["addresses"][0], "10.0.0.1");
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Applied);
    }

    #[tokio::test]
    async fn a_converged_follower_costs_no_request() {
        let s = setup(
            vec![cluster_ip_service()],
            vec![],
            vec![fixtures::obj(live_follower("uid-web", "5"))],
            vec![],
        );
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
            .await
            .unwrap();
        assert_eq!(outcome, Outcome::Unchanged);
    }

    #[tokio::test]
    async fn a_missing_namespace_is_reported_not_created_unless_asked() {
        let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
            s.api.expect(post(SERVICES), status(404, "NotFound")).await;
            // no local object to attach it to: the Event goes to the fallback reference
            let ev = s
                .api
                .expect(
                    post("/apis/events.k8s.io/v1/namespaces/default/events"),
                    event(),
                )
                .await;
            assert_eq!(ev.body["reason"], "NamespaceMissing");
        })
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));
    }
}
