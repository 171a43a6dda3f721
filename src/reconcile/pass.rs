//! One reconcile pass for one local key (namespace/name): read every remote's cache for it,
//! merge the exports into one desired follower (pure), and bring the local cluster to it through
//! the writer, touching only objects we own.
//!
//! Each remote is, for this key, one of: exporting it (its caches have the exported Service), proven
//! without it (its caches completed a listing that lacks it, or it was deliberately removed), or
//! unknown (not listed yet, or a remote the follower records that this daemon does not read).
//! A remote's slices go only on proof from that remote; the Service only once every remote it
//! records has proven the exported Service absent.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use tracing::{Span, debug, field, info, instrument, warn};

use super::ctx::{Ctx, Key};
use super::proof::{Evidence, Proof};
use super::writer::Written;
use crate::desired::addresses::{Refused, admitted};
use crate::desired::{
    self, Export, Follower, Merged, Recorded, ServiceChange, endpoints_change, recorded,
    service_change, set_slice_owner, slice_change, slice_recorded,
};
use crate::desired::{NAMESPACE_MISSING, Outcome, SERVICE_IPS_LIMITED};
use crate::error::{Error, NamespaceGone, Result};
use crate::runtime::metrics::{ByOutcome, ByRemote};
use crate::state::RemoteState;
use crate::state::service_ips::takes_cluster_ip;

/// One remote's knowledge of a key.
enum View {
    Exports {
        exported: Arc<Service>,
        slices: Vec<Arc<EndpointSlice>>,
        /// the outage policy marks its endpoints not ready
        stale: bool,
    },
    Absent,
    Unknown,
}

/// A snapshot of everything one key needs, taken under short read locks.
struct Snapshot {
    remotes: Vec<(Arc<RemoteState>, View)>,
    /// what each remote's slices listed that its address policy refused (kept out of `remotes`)
    refused: Vec<(Arc<str>, Refused)>,
    service: Option<Arc<Service>>,
    slices: Vec<Arc<EndpointSlice>>,
    endpoints: Option<Arc<Endpoints>>,
}

impl Snapshot {
    /// A cached object that cannot be read back fails the pass (retried, nothing deleted): an
    /// unreadable exported Service must never look like a missing one.
    fn take(ctx: &Ctx, g: &crate::state::cache::GroupKey) -> Result<Self> {
        let mut remotes = Vec::new();
        let mut refused = Vec::new();
        let local = ctx.local.networks.current();
        for state in ctx.remotes.states() {
            let view = if !state.ready() {
                View::Unknown
            } else {
                match state.services.read().named(g)? {
                    Some(exported) => {
                        let (slices, r) = admitted(state.slices_of(g)?, &state.addresses, &local);
                        if !r.is_empty() {
                            refused.push((Arc::clone(&state.name), r));
                        }
                        View::Exports {
                            exported,
                            slices,
                            stale: state.is_marked(),
                        }
                    }
                    None => View::Absent,
                }
            };
            remotes.push((state, view));
        }
        Ok(Snapshot {
            remotes,
            refused,
            service: ctx.local.services.read().named(g)?,
            slices: ctx.local.slices.read().group(g)?,
            endpoints: ctx.local.endpoints.read().named(g)?,
        })
    }

    /// What each remote proves about the key: from its cache (complete or not), or from its
    /// removal on purpose.
    fn proof(&self, ctx: &Ctx) -> Proof {
        let read = self.remotes.iter().map(|(state, view)| {
            let evidence = match view {
                View::Exports { .. } => Evidence::Exports,
                View::Absent => Evidence::Gone,
                View::Unknown => Evidence::Unknown,
            };
            (state.name.to_string(), evidence)
        });
        Proof::new(read, &ctx.remotes.retired())
    }
}

fn uid_of<K: Resource<DynamicType = ()>>(o: &K) -> Result<String> {
    o.meta()
        .uid
        .clone()
        .ok_or_else(|| Error::Unexpected(format!("{} {} has no uid", K::kind(&()), o.name_any())))
}

fn service_ref(key: &Key) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        ..Default::default()
    }
}

/// One pass, in a span carrying the key and the remotes that export it (every log line of the
/// pass carries them).
#[instrument(name = "reconcile", skip_all, fields(mode = "follower", remote = field::Empty, namespace = %key.namespace, name = %key.name))]
pub async fn reconcile(ctx: &Ctx, key: &Key) -> Result<Outcome> {
    // a cache that has not completed a listing proves nothing: no decision on it
    if !ctx.local.ready() {
        return Ok(Outcome::NotReady);
    }
    if !ctx.in_scope(&key.namespace) {
        return Ok(Outcome::Unchanged);
    }
    let snap = Snapshot::take(ctx, &key.group())?;
    ctx.local.service_ips.settled(&key.group());
    Span::current().record("remote", snap.exporting().join(","));
    if ctx.opts.protected(&key.namespace) {
        return Ok(ctx.refuse_protected(key, &snap.exporting()).await);
    }
    if let Some(svc) = snap.service.as_deref()
        && let Some(why) = desired::taken_over(svc, &ctx.opts)
    {
        return leave_taken_over(ctx, key, &snap, svc, why).await;
    }
    // a follower named like a top-level domain would answer public names: none while exported
    // (once no remote exports it, what is left goes on proof as always)
    if let Some(why) = ctx.opts.public_name(&key.namespace, &key.name)
        && !snap.exporting().is_empty()
    {
        return refuse_public_name(ctx, key, &snap, &why.to_string()).await;
    }
    let recorded_service = snap
        .service
        .as_ref()
        .map_or(Recorded::GoEra, |s| recorded(&s.metadata, &ctx.opts));
    let mut proof = snap.proof(ctx);
    let exports: Vec<Export<'_>> = snap
        .remotes
        .iter()
        .filter_map(|(state, view)| match view {
            View::Exports {
                exported,
                slices,
                stale,
            } => Some(Export {
                opts: &state.opts,
                exported,
                slices: slices.iter().map(Arc::as_ref).collect(),
                stale: *stale,
            }),
            _ => None,
        })
        .collect();
    // recorded remotes without a complete listing: what they gave is kept as it is
    let held: BTreeSet<String> = match &recorded_service {
        Recorded::From(set) => set
            .iter()
            .filter(|c| !matches!(proof.of(c), Some(Evidence::Exports | Evidence::Gone)))
            .cloned()
            .collect(),
        _ => BTreeSet::new(),
    };
    let mut merged = desired::merge(&exports, &held, snap.service.as_deref(), &ctx.opts);
    ctx.count_refused_labels(&merged.refused_labels);
    note_write_limits(key, &snap, &merged);
    let on = snap.service.as_ref().map(|s| s.object_ref(&()));
    for (cluster, skip) in std::mem::take(&mut merged.skipped) {
        ctx.skip(key, &cluster, skip.reason(), skip.to_string(), on.clone())
            .await;
        proof.hold(&cluster);
        if recorded_service.names(&cluster) {
            // a recorded remote whose exported Service cannot be mirrored now stays recorded
            merged.contributors.insert(cluster);
        }
    }
    let mut created = None;
    let outcome = if snap.service.is_some() && !proof.owns(&recorded_service) {
        match &merged.follower {
            Some(f) => {
                let winner = origin_of(&f.service, ctx);
                let theirs = on.clone().unwrap_or_else(|| service_ref(key));
                ctx.conflict(key, &winner, "Service", theirs).await
            }
            None => Outcome::Unchanged,
        }
    } else {
        note_conflicts(ctx, key, &merged).await;
        match merged.follower.take() {
            Some(mut f) => {
                record_contributors(&mut f, &merged.contributors, ctx);
                let origin = origin_of(&f.service, ctx);
                let held = !held.is_empty();
                match mirror(ctx, key, &snap, &proof, held, f, &origin).await {
                    Ok((outcome, uid)) => {
                        created = uid.filter(|_| snap.service.is_none());
                        if matches!(outcome, Outcome::Deferred(_)) {
                            note_deferred(key, &snap, &origin);
                        }
                        outcome
                    }
                    // a namespace being deleted refuses the slices' creates too: nothing to retry
                    Err(e) if e.namespace_gone() == Some(NamespaceGone::Terminating) => {
                        let gone = NamespaceGone::Terminating;
                        namespace_missing(ctx, key, &origin, gone).await?
                    }
                    Err(e) => return Err(e),
                }
            }
            None => remove(ctx, key, &snap, &proof, &recorded_service).await?,
        }
    };
    // refusals are reported on the follower once it exists, the one this pass created included
    let on = on.or_else(|| {
        created.map(|uid| ObjectReference {
            uid: Some(uid),
            ..service_ref(key)
        })
    });
    for (remote, refused) in &snap.refused {
        ctx.refused(key, remote, refused, on.clone()).await;
    }
    if let Some((remote, held)) = &merged.labels_held {
        ctx.labels_held(key, remote, held, on).await;
    }
    ctx.metrics
        .reconciles
        .get_or_create(&ByOutcome::new(outcome.label()))
        .inc();
    Ok(outcome)
}

/// Records, on each remote that exports the key or proves it gone, whether its export is held
/// at a write limit now (what /readyz and `xcc_remote_write_limited` show): its slices or ports
/// over theirs (skipped), or, for the winner, its labels over theirs.
fn note_write_limits(key: &Key, snap: &Snapshot, merged: &Merged) {
    let id = key.to_string();
    for (state, view) in &snap.remotes {
        let why = match view {
            View::Unknown => continue,
            View::Absent => None,
            View::Exports { .. } => {
                let name = &*state.name;
                let skipped = merged.skipped.iter().find(|(c, skip)| {
                    c == name
                        && matches!(
                            skip,
                            desired::Skip::TooManyPorts { .. }
                                | desired::Skip::TooManySlices { .. }
                        )
                });
                let labels = merged.labels_held.as_ref().filter(|(c, _)| c == name);
                skipped
                    .map(|(_, skip)| skip.to_string())
                    .or_else(|| labels.map(|(_, held)| held.to_string()))
            }
        };
        state.set_write_limited(&id, why);
    }
}

/// The follower Service was left as it is for want of an update of `origin`, the remote its
/// fields come from: shown on /readyz with the write limits until a pass writes it.
fn note_deferred(key: &Key, snap: &Snapshot, origin: &str) {
    let Some((state, _)) = snap.remotes.iter().find(|(s, _)| *s.name == *origin) else {
        return;
    };
    let why = format!(
        "its Service updates are over {} a second (--remote-max-service-updates-per-second): the follower Service's latest changes wait and are written together",
        state.service_update_rate()
    );
    state.set_write_limited(&key.to_string(), Some(why));
}

/// [`apply_follower`], but a new follower that would take a ClusterIP waits while its remote
/// (or all remotes) hold their share of the local Service range.
async fn mirror(
    ctx: &Ctx,
    key: &Key,
    snap: &Snapshot,
    proof: &Proof,
    held: bool,
    f: Follower,
    origin: &str,
) -> Result<(Outcome, Option<String>)> {
    let new_ip = snap.service.is_none() && takes_cluster_ip(&f.service);
    if new_ip && let Err(limited) = reserve_ip(ctx, key, origin) {
        let why = limited.to_string();
        let outcome = ctx.skip(key, origin, SERVICE_IPS_LIMITED, why, None).await;
        return Ok((outcome, None));
    }
    let applied = apply_follower(ctx, key, snap, proof, held, f).await;
    // not created after all: its address is not taken
    if new_ip && !matches!(&applied, Ok((_, Some(_)))) {
        ctx.local.service_ips.release(&key.group());
    }
    applied
}

/// A ClusterIP of the local Service range for a new follower of `remote`, if its share allows
/// (see `state::service_ips`).
fn reserve_ip(
    ctx: &Ctx,
    key: &Key,
    remote: &str,
) -> std::result::Result<(), crate::state::service_ips::Limited> {
    let range = ctx.local.networks.service_range();
    ctx.local.service_ips.reserve(&key.group(), remote, range)
}

impl Snapshot {
    /// The remotes whose cache has the exported Service.
    fn exporting(&self) -> Vec<String> {
        self.remotes
            .iter()
            .filter(|(_, view)| matches!(view, View::Exports { .. }))
            .map(|(state, _)| state.name.to_string())
            .collect()
    }
}

/// A follower a local user has taken over is theirs: the Service is left as it is (its
/// selector too), and only our own slices go, each by its uid (left, they would add the
/// remote's endpoints to the local team's Service).
async fn leave_taken_over(
    ctx: &Ctx,
    key: &Key,
    snap: &Snapshot,
    svc: &Service,
    why: &str,
) -> Result<Outcome> {
    let proof = snap.proof(ctx);
    for s in &snap.slices {
        if proof.owns(&slice_recorded(&s.metadata, &ctx.opts)) {
            let uid = uid_of(s.as_ref())?;
            let name = s.name_any();
            ctx.writer
                .delete::<EndpointSlice>(&key.namespace, &name, &uid, "the follower was taken over")
                .await?;
        }
    }
    let remote = origin_of(svc, ctx);
    ctx.report_taken_over(key, &remote, why, svc.object_ref(&()))
        .await;
    ctx.metrics
        .reconciles
        .get_or_create(&ByOutcome::new(Outcome::Conflict.label()))
        .inc();
    Ok(Outcome::Conflict)
}

/// An export whose namespace or name is a top-level domain (`desired::names`): nothing is
/// created. A follower of it that an earlier version wrote loses our EndpointSlices and
/// Endpoints, each by its uid, so that no name resolves to the remote's endpoints; its Service
/// is kept (a refusal is no proof that the exported Service is gone) and named in the Event.
/// Each exporting remote is counted and logged; the Event goes on the follower, or on the
/// daemon's Lease when there is none (its namespace may not exist).
async fn refuse_public_name(ctx: &Ctx, key: &Key, snap: &Snapshot, why: &str) -> Result<Outcome> {
    let proof = snap.proof(ctx);
    let why_gone = "its name is a top-level domain";
    for s in &snap.slices {
        if proof.owns(&slice_recorded(&s.metadata, &ctx.opts)) {
            let uid = uid_of(s.as_ref())?;
            ctx.writer
                .delete::<EndpointSlice>(&key.namespace, &s.name_any(), &uid, why_gone)
                .await?;
        }
    }
    if let Some(ep) = snap
        .endpoints
        .as_ref()
        .filter(|e| proof.owns(&recorded(&e.metadata, &ctx.opts)))
    {
        let uid = uid_of(ep.as_ref())?;
        ctx.writer
            .delete::<Endpoints>(&key.namespace, &ep.name_any(), &uid, why_gone)
            .await?;
    }
    let on = snap.service.as_ref().map(|s| s.object_ref(&()));
    let why = match on {
        Some(_) => format!(
            "{why}; the follower left by an earlier version keeps its Service without endpoints (delete it by hand if it should go)"
        ),
        None => why.to_string(),
    };
    for remote in snap.exporting() {
        let reason = desired::PUBLIC_NAME_REFUSED;
        ctx.skip(key, &remote, reason, why.clone(), on.clone())
            .await;
    }
    let outcome = Outcome::Skipped(desired::PUBLIC_NAME_REFUSED);
    ctx.metrics
        .reconciles
        .get_or_create(&ByOutcome::new(outcome.label()))
        .inc();
    Ok(outcome)
}

/// The remote a follower's Service-level fields come from (the merge's winner, recorded).
fn origin_of<K: ResourceExt>(obj: &K, ctx: &Ctx) -> String {
    obj.annotations()
        .get(&ctx.opts.origin_cluster_annotation())
        .cloned()
        .unwrap_or_default()
}

/// Writes the contributors list (after skips were added) onto the follower Service and
/// Endpoints.
fn record_contributors(f: &mut Follower, contributors: &BTreeSet<String>, ctx: &Ctx) {
    let list = contributors.iter().cloned().collect::<Vec<_>>().join(",");
    let key = ctx.opts.origin_clusters_annotation();
    f.service
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(key.clone(), list.clone());
    if let Some(ep) = f.endpoints.as_mut() {
        ep.metadata
            .annotations
            .get_or_insert_default()
            .insert(key, list);
    }
}

/// No remote exports the key now. Each remote's slices go on its own proof; the Service, its
/// Endpoints and what is left go once no remote the Service records is unknown.
async fn remove(
    ctx: &Ctx,
    key: &Key,
    snap: &Snapshot,
    proof: &Proof,
    recorded_service: &Recorded,
) -> Result<Outcome> {
    let ns = &key.namespace;
    let mut deleted = false;
    let slice_records: Vec<Recorded> = snap
        .slices
        .iter()
        .map(|s| slice_recorded(&s.metadata, &ctx.opts))
        .collect();
    for (s, r) in snap.slices.iter().zip(&slice_records) {
        if proof.slice_may_go(r) {
            ctx.writer
                .delete::<EndpointSlice>(
                    ns,
                    &s.name_any(),
                    &uid_of(s.as_ref())?,
                    "exported Service gone",
                )
                .await?;
            deleted = true;
        }
    }
    if proof.service_may_go(recorded_service, &slice_records) {
        if let Some(ep) = snap
            .endpoints
            .as_ref()
            .filter(|e| proof.owns(&recorded(&e.metadata, &ctx.opts)))
        {
            ctx.writer
                .delete::<Endpoints>(
                    ns,
                    &ep.name_any(),
                    &uid_of(ep.as_ref())?,
                    "exported Service gone",
                )
                .await?;
            deleted = true;
        }
        if let Some(svc) = &snap.service {
            ctx.writer
                .delete::<Service>(
                    ns,
                    &svc.name_any(),
                    &uid_of(svc.as_ref())?,
                    "exported Service gone",
                )
                .await?;
            deleted = true;
            forget_conflicts(ctx, key);
        }
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
        /// left as it is: the remote its fields come from has no update left for this long
        deferred: Option<Duration>,
    },
    Done(Outcome),
}

/// Whether the follower Service may be changed now: the remote its fields come from (the
/// merge's winner, `winner`) takes one of its updates (`--remote-max-service-updates-per-second`);
/// Err with how long until one is due.
fn update_allowed(ctx: &Ctx, key: &Key, winner: Option<&RemoteState>) -> Result<(), Duration> {
    let Some(w) = winner else { return Ok(()) };
    let wait = w.take_service_update(std::time::Instant::now());
    if wait.is_err() {
        debug!(key = %key, remote = %w.name, "follower Service update deferred: the remote's updates are used up for now");
        ctx.metrics
            .service_updates_deferred
            .get_or_create(&ByRemote::new(&w.name))
            .inc();
    }
    wait
}

async fn ensure_service(
    ctx: &Ctx,
    key: &Key,
    proof: &Proof,
    actual: Option<Service>,
    desired: &Service,
    winner: Option<&RemoteState>,
) -> Result<ServiceState> {
    let (mut actual, mut looked) = (actual, false);
    // at most: create -> AlreadyExists -> read it -> update it
    for _ in 0..3 {
        let Some(live) = actual.take() else {
            match ctx.create(desired).await {
                Ok(Written::Done(s)) => {
                    return Ok(ServiceState::Ready {
                        uid: uid_of(&s)?,
                        changed: true,
                        deferred: None,
                    });
                }
                Ok(Written::Skipped) => match dry_run_look(ctx, key, desired, looked).await? {
                    Look::Exists(live) => {
                        (looked, actual) = (true, Some(*live));
                        continue;
                    }
                    Look::Done(state) => return Ok(state),
                },
                Err(e) if e.api_code() == Some(409) => {
                    // exists but not in our cache: it may well not be ours, so look before touching
                    actual = ctx.writer.get::<Service>(&key.namespace, &key.name).await?;
                    continue;
                }
                Err(e) => {
                    let Some(gone) = e.namespace_gone() else {
                        return Err(e);
                    };
                    let origin = origin_of(desired, ctx);
                    let outcome = namespace_missing(ctx, key, &origin, gone).await;
                    return outcome.map(ServiceState::Done);
                }
            }
        };
        let r = recorded(&live.metadata, &ctx.opts);
        if !proof.owns(&r) {
            let winner = origin_of(desired, ctx);
            return Ok(ServiceState::Done(
                ctx.conflict(key, &winner, "Service", live.object_ref(&()))
                    .await,
            ));
        }
        if r == Recorded::GoEra {
            info!(key = %key, "adopting a follower left by the Go controller");
        }
        let change = service_change(&live, desired);
        if change != ServiceChange::Unchanged
            && let Err(wait) = update_allowed(ctx, key, winner)
        {
            // left as it is for now; its slices are still written (they carry readiness)
            return Ok(ServiceState::Ready {
                uid: uid_of(&live)?,
                changed: false,
                deferred: Some(wait),
            });
        }
        match change {
            ServiceChange::Unchanged => {
                return Ok(ServiceState::Ready {
                    uid: uid_of(&live)?,
                    changed: false,
                    deferred: None,
                });
            }
            ServiceChange::Update(s) => {
                return match ctx.replace(s.as_ref()).await? {
                    Written::Done(s) => Ok(ServiceState::Ready {
                        uid: uid_of(&s)?,
                        changed: true,
                        deferred: None,
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
    Err(Error::Retry(format!(
        "{key}: the follower Service kept changing under us"
    )))
}

enum Look {
    Exists(Box<Service>),
    Done(ServiceState),
}

/// A dry run sent no create: it reads what the create would have met instead (a Service of
/// that name, which the API server refuses with 409 and which may not be ours; a missing
/// namespace, refused with 404), so it reports what a real run would. The Service once a pass.
async fn dry_run_look(ctx: &Ctx, key: &Key, desired: &Service, looked: bool) -> Result<Look> {
    if !looked && let Some(live) = ctx.writer.get::<Service>(&key.namespace, &key.name).await? {
        return Ok(Look::Exists(Box::new(live)));
    }
    if !ctx.writer.namespace_exists(&key.namespace).await? {
        let remote = origin_of(desired, ctx);
        let outcome = namespace_missing(ctx, key, &remote, NamespaceGone::Missing).await?;
        return Ok(Look::Done(ServiceState::Done(outcome)));
    }
    Ok(Look::Done(ServiceState::Done(Outcome::Applied)))
}

async fn namespace_missing(
    ctx: &Ctx,
    key: &Key,
    remote: &str,
    gone: NamespaceGone,
) -> Result<Outcome> {
    // a namespace being deleted is not created again: it refuses every create until it is gone
    // never a namespace named like a top-level domain (the pass refused its exports before
    // this, unless the operator allowed the name)
    let public = ctx.opts.public_name(&key.namespace, "").is_some();
    if ctx.create_namespaces && gone == NamespaceGone::Missing && !public {
        match ctx.writer.create_namespace(&key.namespace).await {
            Ok(Written::Done(_)) => {}
            // dry run: it would create the namespace, then the follower in it
            Ok(Written::Skipped) => return Ok(Outcome::Applied),
            Err(e) if e.api_code() == Some(409) => {}
            Err(e) => return Err(e),
        }
        // retried by the caller's back-off, now that the namespace exists
        return Err(Error::Retry(format!(
            "namespace {} was just created",
            key.namespace
        )));
    }
    let ns = &key.namespace;
    let why = match gone {
        NamespaceGone::Missing => {
            format!("local namespace {ns:?} does not exist; mirrored as soon as it does")
        }
        NamespaceGone::Terminating => {
            format!("local namespace {ns:?} is being deleted; mirrored once it exists again")
        }
    };
    Ok(ctx.skip(key, remote, NAMESPACE_MISSING, why, None).await)
}

async fn apply_follower(
    ctx: &Ctx,
    key: &Key,
    snap: &Snapshot,
    proof: &Proof,
    held: bool,
    mut f: Follower,
) -> Result<(Outcome, Option<String>)> {
    let actual = snap.service.as_deref().cloned();
    let origin = origin_of(&f.service, ctx);
    let winner = snap
        .remotes
        .iter()
        .map(|(state, _)| state.as_ref())
        .find(|state| *state.name == *origin);
    let service = ensure_service(ctx, key, proof, actual, &f.service, winner).await?;
    let (uid, mut changed, deferred) = match service {
        ServiceState::Ready {
            uid,
            changed,
            deferred,
        } => (uid, changed, deferred),
        ServiceState::Done(outcome) => return Ok((outcome, None)),
    };
    set_slice_owner(&mut f.slices, &key.name, &uid);
    match apply_slices(ctx, key, snap, proof, &f.slices).await? {
        Some(c) => changed |= c,
        None => return Ok((Outcome::Conflict, Some(uid))),
    }
    // legacy Endpoints: one object for every remote; while a recorded remote is unknown it may
    // hold that remote's addresses, so it is left as it is
    let have_ep = snap
        .endpoints
        .as_deref()
        .filter(|e| proof.owns(&recorded(&e.metadata, &ctx.opts)));
    if !(held && have_ep.is_some()) {
        match apply_endpoints(ctx, key, proof, f.endpoints.as_ref(), have_ep).await? {
            Some(c) => changed |= c,
            None => return Ok((Outcome::Conflict, Some(uid))),
        }
    }
    let outcome = match deferred {
        Some(wait) => Outcome::Deferred(wait),
        None if changed => Outcome::Applied,
        None => Outcome::Unchanged,
    };
    Ok((outcome, Some(uid)))
}

/// EndpointSlices: ours by name; others (e.g. mirrored by kube-controller-manager, or of a
/// remote whose objects are kept) untouched. None: a conflict stopped the pass.
async fn apply_slices(
    ctx: &Ctx,
    key: &Key,
    snap: &Snapshot,
    proof: &Proof,
    want: &[EndpointSlice],
) -> Result<Option<bool>> {
    let ns = &key.namespace;
    let mut changed = false;
    let mut ours: BTreeMap<String, Arc<EndpointSlice>> = snap
        .slices
        .iter()
        .filter(|s| proof.may_change_slice(&slice_recorded(&s.metadata, &ctx.opts)))
        .map(|s| (s.name_any(), Arc::clone(s)))
        .collect();
    for want in want {
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
                    let name = want.name_any();
                    let Some(live) = ctx.writer.get::<EndpointSlice>(ns, &name).await? else {
                        return Err(e);
                    };
                    if slice_recorded(&live.metadata, &ctx.opts) == Recorded::NotOurs {
                        let winner = origin_of(want, ctx);
                        ctx.conflict(key, &winner, "EndpointSlice", live.object_ref(&()))
                            .await;
                        return Ok(None);
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
    Ok(Some(changed))
}

/// The legacy core/v1 Endpoints. None: a conflict stopped the pass.
async fn apply_endpoints(
    ctx: &Ctx,
    key: &Key,
    proof: &Proof,
    want: Option<&Endpoints>,
    have: Option<&Endpoints>,
) -> Result<Option<bool>> {
    let ns = &key.namespace;
    match (want, have) {
        (Some(want), Some(have)) => {
            if let Some(update) = endpoints_change(have, want) {
                ctx.replace(&update).await?;
                return Ok(Some(true));
            }
            Ok(Some(false))
        }
        (Some(want), None) => match ctx.create(want).await {
            Ok(_) => Ok(Some(true)),
            Err(e) if e.api_code() == Some(409) => {
                let Some(live) = ctx.writer.get::<Endpoints>(ns, &key.name).await? else {
                    return Err(e);
                };
                if !proof.owns(&recorded(&live.metadata, &ctx.opts)) {
                    let winner = origin_of(want, ctx);
                    ctx.conflict(key, &winner, "Endpoints", live.object_ref(&()))
                        .await;
                    return Ok(None);
                }
                if let Some(update) = endpoints_change(&live, want) {
                    ctx.replace(&update).await?;
                    return Ok(Some(true));
                }
                Ok(Some(false))
            }
            Err(e) => Err(e),
        },
        (None, Some(have)) => {
            ctx.writer
                .delete::<Endpoints>(ns, &key.name, &uid_of(have)?, "not desired in this mode")
                .await?;
            Ok(Some(true))
        }
        (None, None) => Ok(Some(false)),
    }
}

/// Records the export conflicts of a key (for the gauge) and reports them: a log line when
/// they change, and a `ServiceConflict` Event on the follower (rate-limited).
async fn note_conflicts(ctx: &Ctx, key: &Key, merged: &Merged) {
    let now: Vec<(String, &'static str)> = merged
        .conflicts
        .iter()
        .map(|c| (c.cluster.clone(), c.kind.label()))
        .collect();
    let before = {
        let mut map = ctx.export_conflicts.lock();
        if now.is_empty() {
            map.remove(&key.group())
        } else {
            map.insert(key.group(), now.clone())
        }
    };
    if merged.conflicts.is_empty() {
        return;
    }
    let note = merged
        .conflicts
        .iter()
        .map(|c| {
            format!(
                "{}'s export conflicts with {}'s on {} ({}); the oldest exported Service wins",
                c.cluster,
                c.winner,
                c.kind.label(),
                c.detail
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    if before.as_ref() != Some(&now) {
        warn!(key = %key, "export conflict: {note}");
    }
    ctx.event(
        EventType::Warning,
        "ServiceConflict",
        note,
        "Merge",
        Some(service_ref(key)),
    )
    .await;
}

fn forget_conflicts(ctx: &Ctx, key: &Key) {
    ctx.export_conflicts.lock().remove(&key.group());
}

#[cfg(test)]
#[path = "decision_tests.rs"]
mod decision_tests;
