//! One pass for one MCS key (namespace/name): read every cluster's export of it (the local
//! cluster's included), judge them with the pure `desired::mcs`, and bring the local
//! ServiceImport, its derived Service and its EndpointSlices to what they ask, and the local
//! ServiceExport's conditions, touching only objects that are ours.
//!
//! Each cluster proves, for this key, one of: it exports it (a valid export: its Service exists
//! and is not ExternalName), it does not (its complete export listing lacks it, the export is
//! invalid or being deleted, or the cluster was removed on purpose), or nothing (its exports or
//! the namespace's Services and slices are not listed). A slice goes only on proof from the
//! cluster it carries; the import (and with it the derived Service) only once every cluster it
//! records proves the key gone and none exports it. An import recording a cluster that proves
//! nothing is held: its spec, its status and its derived Service stay as they are, and that
//! cluster's slices are not touched.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use parking_lot::RwLock;
use tracing::{Span, debug, field, instrument, warn};

use super::ctx::{Ctx, Key};
use super::proof::{Evidence, Proof};
use super::writer::{Local, Written};
use crate::desired::addresses::{AddressPolicy, Refused};
use crate::desired::mcs::{
    self, Change, ClusterExport, Grant, Here, Localized, Marks, Preference, ServiceExport,
    ServiceImport, derived_name, import_is_ours, slice_source_cluster,
};
use crate::desired::{NAMESPACE_MISSING, Outcome, Recorded, not_ready};
use crate::error::{Error, Result};
use crate::runtime::metrics::{ByOutcome, ByRemoteKind};
use crate::state::{Cache, GroupKey, McsCluster, McsLocal, McsView};

/// One cluster's part in a key.
struct Source {
    name: String,
    view: McsView,
}

/// A cluster read as an MCS source, with the address policy its slices pass and why its
/// endpoints are published as not ready now (the outage policy, the data-path probe) (None: the
/// local cluster, whose own endpoints are its own).
type Read = (Arc<McsCluster>, Option<(Arc<str>, AddressPolicy, Marks)>);

/// Everything one key needs, taken under short read locks.
struct Snapshot {
    sources: Vec<Source>,
    /// clusters whose name is not decided yet (their ClusterProperty not read, or their claim
    /// not granted yet)
    unnamed: usize,
    proof: Proof,
    import: Option<Arc<ServiceImport>>,
    derived: Option<Arc<Service>>,
    slices: Vec<Arc<EndpointSlice>>,
    /// what each remote's slices listed that its address policy refused
    refused: Vec<(Arc<str>, Refused)>,
    /// the clusters (by the name they go by) whose endpoints are published not ready, and why
    marks: BTreeMap<String, Marks>,
}

/// Every cluster read as an MCS source, the local one first.
fn clusters(ctx: &Ctx, mcs: &McsLocal) -> Vec<Read> {
    let mut all: Vec<Read> = vec![(Arc::clone(&mcs.source), None)];
    all.extend(ctx.remotes.states().iter().filter_map(|s| {
        let marks = Marks {
            cut_off: s.is_cut_off(),
            stale: s.is_stale(),
        };
        let policy = (Arc::clone(&s.name), s.addresses.clone(), marks);
        s.mcs.clone().map(|c| (c, Some(policy)))
    }));
    all
}

fn evidence(view: &McsView) -> Evidence {
    match view {
        McsView::Unknown => Evidence::Unknown,
        McsView::Absent => Evidence::Gone,
        McsView::Exports {
            export, service, ..
        } => {
            let judged = ClusterExport {
                cluster: "",
                export,
                service: service.as_deref(),
                slices: Vec::new(),
            };
            let valid = mcs::validity(&judged) == mcs::Validity::Valid;
            // an export being deleted takes no part (as in the judgement)
            if valid && export.metadata.deletion_timestamp.is_none() {
                Evidence::Exports
            } else {
                Evidence::Gone
            }
        }
    }
}

/// The names a cluster was granted earlier: what carries them is surplus, proven by its
/// listing, and proves nothing while it has none. Joined with the evidence of whoever holds such
/// a name now ([`Proof::new`]), so a name another cluster takes never proves absence for the
/// cluster that held it while that one is unreachable.
fn former(c: &McsCluster) -> Vec<(String, Evidence)> {
    let e = if c.exports.read().ready() {
        Evidence::Gone
    } else {
        Evidence::Unknown
    };
    c.former().into_iter().map(|f| (f, e)).collect()
}

/// The remotes the Secrets name that are not members (not read here).
fn unread_remotes(ctx: &Ctx) -> usize {
    let named = ctx.remotes.named().unwrap_or_default();
    named
        .iter()
        .filter(|n| ctx.remotes.get(n).is_none())
        .count()
}

fn snapshot(ctx: &Ctx, mcs: &McsLocal, g: &GroupKey) -> Result<Snapshot> {
    let mut sources = Vec::new();
    let mut read = Vec::new();
    let mut unnamed = 0;
    let mut refused = Vec::new();
    let mut marked = BTreeMap::new();
    let local = ctx.local.networks.current();
    for (c, policy) in clusters(ctx, mcs) {
        read.extend(former(&c));
        // a cluster answers only under the name it was granted (never under one it claims)
        let Some(name) = c.name() else {
            // a refused claim names nothing; one not decided yet might name anything
            unnamed += usize::from(c.grant() == Grant::Pending);
            continue;
        };
        let mut view = c.view(g)?;
        if let (Some((remote, policy, marks)), McsView::Exports { slices, .. }) =
            (policy, &mut view)
        {
            let (kept, r) =
                crate::desired::addresses::admitted(std::mem::take(slices), &policy, &local);
            *slices = if marks.any() {
                marked.insert(name.clone(), marks);
                kept.iter().map(|s| Arc::new(not_ready(s))).collect()
            } else {
                kept
            };
            if !r.is_empty() {
                refused.push((remote, r));
            }
        }
        read.push((name.clone(), evidence(&view)));
        sources.push(Source { name, view });
    }
    // a remote a Secret names that is not read (its server did not answer when it came): it
    // may go by any name, as a cluster whose name is not decided yet
    unnamed += unread_remotes(ctx);
    // a remote removed on purpose proves every key gone, unless a cluster read now goes by
    // its name (it joined again)
    let mut retired = ctx.remotes.retired_mcs();
    for s in &sources {
        retired.remove(&s.name);
    }
    let derived = derived_name(&g.0, &g.1);
    let derived = mcs
        .derived
        .read()
        .group(g)?
        .into_iter()
        .find(|s| s.metadata.name.as_deref() == Some(derived.as_str()));
    Ok(Snapshot {
        sources,
        unnamed,
        proof: Proof::new(read, &retired),
        import: mcs.imports.read().named(g)?,
        derived,
        slices: mcs.slices.read().group(g)?,
        refused,
        marks: marked,
    })
}

impl Snapshot {
    fn exports(&self) -> Vec<ClusterExport<'_>> {
        self.sources
            .iter()
            .filter_map(|s| match &s.view {
                McsView::Exports {
                    export,
                    service,
                    slices,
                } => Some(ClusterExport {
                    cluster: &s.name,
                    export,
                    service: service.as_deref(),
                    slices: slices.iter().map(|s| &**s).collect(),
                }),
                _ => None,
            })
            .collect()
    }

    /// The clusters the live import and our slices record.
    fn records(&self, import: Option<&ServiceImport>) -> BTreeSet<String> {
        let mut r: BTreeSet<String> = import
            .and_then(|i| i.status.as_ref())
            .map(|s| s.clusters.iter().map(|c| c.cluster.clone()).collect())
            .unwrap_or_default();
        r.extend(
            self.slices
                .iter()
                .filter_map(|s| slice_source_cluster(s).map(str::to_string)),
        );
        r
    }

    /// A recorded cluster proves nothing now (or might: a cluster's name is not known yet):
    /// what it gave stays as it is.
    fn held(&self, records: &BTreeSet<String>) -> bool {
        records.iter().any(|r| match self.proof.of(r) {
            Some(Evidence::Unknown) => true,
            None => self.unnamed > 0,
            Some(_) => false,
        })
    }

    fn local_export(&self, local: &str) -> Option<Arc<ServiceExport>> {
        self.sources.iter().find_map(|s| match &s.view {
            McsView::Exports { export, .. } if s.name == local => Some(Arc::clone(export)),
            _ => None,
        })
    }
}

/// What the pass wrote.
#[derive(Default)]
struct Wrote {
    applied: bool,
    deleted: bool,
    /// the ServiceImport this pass created (where its refusals are reported)
    created_import: Option<ObjectReference>,
}

impl Wrote {
    fn outcome(&self) -> Outcome {
        match (self.applied, self.deleted) {
            (true, _) => Outcome::Applied,
            (false, true) => Outcome::Deleted,
            (false, false) => Outcome::Unchanged,
        }
    }
}

/// A pass ends early: a conflict or a namespace that is missing.
enum Stop {
    Outcome(Outcome),
    Err(Error),
}

impl From<Error> for Stop {
    fn from(e: Error) -> Self {
        Stop::Err(e)
    }
}

/// The pass of one MCS key, in a span carrying the key and the clusters that export it (`local`
/// among them when the local cluster does).
#[instrument(name = "reconcile", skip_all, fields(mode = "mcs", remote = field::Empty, namespace = %key.namespace, name = %key.name))]
pub async fn reconcile(ctx: &Ctx, key: &Key) -> Result<Outcome> {
    let Some(mcs) = ctx.mcs.clone() else {
        return Ok(Outcome::Unchanged);
    };
    if !ctx.in_scope(&key.namespace) {
        return Ok(Outcome::Unchanged);
    }
    // the local networks decide which remote addresses are admitted: nothing before they are known
    let ready = mcs.ready() && ctx.local.networks.ready();
    let Some(local) = mcs.source.name().filter(|_| ready) else {
        return Ok(Outcome::NotReady);
    };
    let snap = snapshot(ctx, &mcs, &key.group())?;
    let exporting: Vec<String> = snap
        .exports()
        .iter()
        .map(|e| e.cluster.to_string())
        .collect();
    Span::current().record("remote", exporting.join(","));
    if ctx.opts.protected(&key.namespace) {
        return Ok(ctx.refuse_protected(key, &exporting).await);
    }
    let mut wrote = Wrote::default();
    let outcome = match converge(ctx, &mcs, key, &snap, &local, &mut wrote).await {
        Ok(()) => wrote.outcome(),
        Err(Stop::Outcome(o)) => o,
        Err(Stop::Err(e)) if e.namespace_gone().is_some() => {
            debug!(key = %key, "the namespace does not exist here (or is being deleted): nothing imported");
            Outcome::Skipped(NAMESPACE_MISSING)
        }
        Err(Stop::Err(e)) => return Err(e),
    };
    // refusals are reported on the import once it exists, the one this pass created included
    let on = (snap.import.as_ref().map(|i| i.object_ref(&()))).or(wrote.created_import);
    for (remote, refused) in &snap.refused {
        ctx.refused(key, remote, refused, on.clone()).await;
    }
    if outcome != Outcome::NotReady {
        ctx.metrics
            .reconciles
            .get_or_create(&ByOutcome::new(outcome.label()))
            .inc();
    }
    Ok(outcome)
}

async fn converge(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    snap: &Snapshot,
    local: &str,
    wrote: &mut Wrote,
) -> std::result::Result<(), Stop> {
    let exports = snap.exports();
    let (ns, name) = (&key.namespace, &key.name);
    let mut live_import = snap.import.as_deref().cloned();
    let mut live_derived = snap.derived.as_deref().cloned();
    let records = snap.records(live_import.as_ref());
    let held = snap.held(&records);
    for _round in 0..4 {
        let judged = mcs::import(
            ns,
            name,
            &exports,
            live_import.as_ref(),
            live_derived.as_ref(),
        );
        let imp = match judged {
            Ok(imp) => imp,
            Err(e) => {
                let why = e.to_string();
                return Err(Stop::Outcome(
                    ctx.skip(key, "", e.reason(), why, None).await,
                ));
            }
        };
        let Some(mut imp) = imp else {
            remove(ctx, mcs, key, snap, live_import.as_ref(), wrote).await?;
            return export_status(ctx, mcs, snap, local, &exports, None, wrote).await;
        };
        localize(ctx, mcs, key, &mut imp, &exports, local);
        imp.mark_endpoints(&snap.marks);
        // a. the ServiceImport, b. its derived Service: a create (or recreate) answers with what
        // the next round derives from (the import's uid, the Service's ClusterIPs)
        if write_import(
            ctx,
            mcs,
            key,
            &mut live_import,
            &imp.service_import,
            held,
            wrote,
        )
        .await?
        {
            continue;
        }
        if let (Some(desired), false) = (&imp.derived, held)
            && write_derived(ctx, mcs, key, &mut live_derived, desired, wrote).await?
        {
            continue;
        }
        // c. the slices
        slices(ctx, mcs, key, snap, &imp.slices, wrote).await?;
        // d. status.clusters
        if let Some(live) = &live_import
            && !held
            && let Change::Update(obj) = mcs::import_status_change(live, &imp.service_import)
        {
            live_import = Some(replace_status(ctx, &mcs.imports, &obj, wrote).await?);
        }
        let import = live_import.as_ref();
        note_conflicts(ctx, &imp, import).await;
        return export_status(ctx, mcs, snap, local, &exports, import, wrote).await;
    }
    Err(Stop::Err(Error::Retry(format!(
        "{key}: the import kept changing in one pass"
    ))))
}

/// Brings the ServiceImport to `desired` (not its status); true when it was created.
async fn write_import(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    live: &mut Option<ServiceImport>,
    desired: &ServiceImport,
    held: bool,
    wrote: &mut Wrote,
) -> std::result::Result<bool, Stop> {
    match mcs::import_change(live.as_ref(), desired) {
        Change::NotOurs => {
            let on = live.as_ref().map(|i| i.object_ref(&()));
            Err(Stop::Outcome(conflict(ctx, key, "ServiceImport", on).await))
        }
        Change::Create(obj) => {
            let made = create(ctx, key, &mcs.imports, &obj, wrote).await?;
            wrote.created_import = Some(made.object_ref(&()));
            *live = Some(made);
            Ok(true)
        }
        Change::Update(obj) if !held => {
            *live = Some(replace(ctx, &mcs.imports, &obj, wrote).await?);
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// Brings the derived Service to `desired`; true when it was created or recreated.
async fn write_derived(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    live: &mut Option<Service>,
    desired: &Service,
    wrote: &mut Wrote,
) -> std::result::Result<bool, Stop> {
    match mcs::derived_change(live.as_ref(), desired) {
        Change::NotOurs => {
            let on = live.as_ref().map(|s| s.object_ref(&()));
            Err(Stop::Outcome(conflict(ctx, key, "Service", on).await))
        }
        Change::Create(obj) => {
            *live = Some(create(ctx, key, &mcs.derived, &obj, wrote).await?);
            Ok(true)
        }
        Change::Recreate(obj) => {
            if let Some(old) = live.as_ref() {
                delete(ctx, &mcs.derived, old, "recreated", wrote).await?;
            }
            *live = Some(create(ctx, key, &mcs.derived, &obj, wrote).await?);
            Ok(true)
        }
        Change::Update(obj) => {
            // an update keeps the ClusterIPs the import's spec.ips carry
            replace(ctx, &mcs.derived, &obj, wrote).await?;
            Ok(false)
        }
        Change::Unchanged => Ok(false),
    }
}

/// The locality the import asks for, as hints on its slices (see `desired::mcs::localize`).
fn localize(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    imp: &mut mcs::Import,
    exports: &[ClusterExport<'_>],
    local: &str,
) {
    let asked = imp.service_import.spec.traffic_distribution.as_deref();
    let mut preference = Preference::of(asked);
    if preference == Preference::Node && !mcs.node_hints_kept() {
        preference = Preference::Zone;
    }
    let zones = ctx.local.networks.zones();
    let here = Here {
        cluster: local,
        zones: &zones,
    };
    if let Localized::TooManyZones(n) = mcs::localize(&mut imp.slices, preference, here, exports) {
        debug!(key = %key, zones = n, "an endpoint would name more zones than the API server allows (8): no locality hints");
    }
}

/// Notes an API server that dropped the node hints of a slice we sent (Kubernetes before 1.34,
/// or its PreferSameTrafficDistribution gate off): PreferSameNode falls to zones from then on,
/// so that no pass writes them again and again.
fn node_hints_kept(mcs: &McsLocal, sent: &EndpointSlice, written: &EndpointSlice) {
    let has_nodes = |s: &EndpointSlice| {
        s.endpoints.iter().any(|e| {
            e.hints
                .as_ref()
                .and_then(|h| h.for_nodes.as_ref())
                .is_some_and(|n| !n.is_empty())
        })
    };
    if has_nodes(sent) && !has_nodes(written) && mcs.node_hints_dropped() {
        warn!(
            "the local API server dropped the node hints of an EndpointSlice (Kubernetes before 1.34, or its PreferSameTrafficDistribution feature gate off): PreferSameNode imports prefer the same zone instead"
        );
    }
}

/// Our slices of the key: the desired ones written, those it no longer has deleted on proof
/// from the cluster they carry.
async fn slices(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    snap: &Snapshot,
    desired: &[EndpointSlice],
    wrote: &mut Wrote,
) -> std::result::Result<(), Stop> {
    for d in desired {
        let live = snap
            .slices
            .iter()
            .find(|s| s.metadata.name == d.metadata.name);
        let cluster = slice_source_cluster(d).unwrap_or_default().to_string();
        if live.is_some() && !snap.proof.may_change_slice(&from(&cluster)) {
            continue;
        }
        match mcs::mcs_slice_change(live.map(|s| &**s), d) {
            Change::NotOurs => {
                let on = live.map(|s| s.object_ref(&()));
                return Err(Stop::Outcome(conflict(ctx, key, "EndpointSlice", on).await));
            }
            Change::Create(obj) => {
                let made = create(ctx, key, &mcs.slices, &obj, wrote).await?;
                node_hints_kept(mcs, &obj, &made);
            }
            Change::Update(obj) => {
                let made = replace(ctx, &mcs.slices, &obj, wrote).await?;
                node_hints_kept(mcs, &obj, &made);
            }
            Change::Recreate(obj) => {
                if let Some(old) = live {
                    delete(ctx, &mcs.slices, old, "address type changed", wrote).await?;
                }
                let made = create(ctx, key, &mcs.slices, &obj, wrote).await?;
                node_hints_kept(mcs, &obj, &made);
            }
            Change::Unchanged => {}
        }
    }
    let live: Vec<&EndpointSlice> = snap.slices.iter().map(|s| &**s).collect();
    for s in mcs::surplus_slices(&live, &key.name, desired) {
        let cluster = slice_source_cluster(s).unwrap_or_default();
        if snap.proof.may_change_slice(&from(cluster)) {
            let why = format!("cluster {cluster} no longer exports these endpoints");
            delete(ctx, &mcs.slices, s, &why, wrote).await?;
        }
    }
    Ok(())
}

/// No valid export anywhere we can see: our import, derived Service and slices go once every
/// cluster they record proves it (deleting the import would collect the others too; they are
/// deleted themselves so that they go at once, each with its uid).
async fn remove(
    ctx: &Ctx,
    mcs: &McsLocal,
    key: &Key,
    snap: &Snapshot,
    live_import: Option<&ServiceImport>,
    wrote: &mut Wrote,
) -> std::result::Result<(), Stop> {
    let records = snap.records(live_import);
    let all_listed = snap.unnamed == 0
        && snap
            .sources
            .iter()
            .all(|s| !matches!(s.view, McsView::Unknown));
    let proven = !snap.held(&records)
        && !snap.proof.exported()
        && if records.is_empty() {
            all_listed
        } else {
            snap.proof.all_gone(&records)
        };
    for s in &snap.slices {
        let cluster = slice_source_cluster(s).unwrap_or_default();
        if snap.proof.slice_may_go(&from(cluster)) {
            let why = format!("cluster {cluster} no longer exports {key}");
            delete(ctx, &mcs.slices, s, &why, wrote).await?;
        }
    }
    if !proven {
        return Ok(());
    }
    let why = "no cluster exports it";
    if let Some(d) = &snap.derived {
        delete(ctx, &mcs.derived, d, why, wrote).await?;
    }
    if let Some(i) = live_import.filter(|i| import_is_ours(i)) {
        delete(ctx, &mcs.imports, i, why, wrote).await?;
    }
    Ok(())
}

/// The local ServiceExport's conditions, when this cluster exports the key, its name is known,
/// and the import is ours (or there is none).
async fn export_status(
    ctx: &Ctx,
    mcs: &McsLocal,
    snap: &Snapshot,
    local: &str,
    exports: &[ClusterExport<'_>],
    import: Option<&ServiceImport>,
    wrote: &mut Wrote,
) -> std::result::Result<(), Stop> {
    let Some(live) = snap.local_export(local) else {
        return Ok(());
    };
    if import.is_some_and(|i| !import_is_ours(i)) {
        return Ok(());
    }
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let conditions = match mcs::export_conditions(local, exports, import, &now) {
        Ok(c) => c,
        Err(e) => return Err(Stop::Err(Error::Unexpected(e.to_string()))),
    };
    if let Some(obj) = mcs::export_status_change(&live, conditions) {
        replace_status(ctx, &mcs.source.exports, &obj, wrote).await?;
    }
    Ok(())
}

/// What the exports disagree on, as a `ServiceConflict` Event on the ServiceImport
/// (rate-limited): whose properties it takes and why, and who differs. The local export's
/// `Conflict` condition says the same, but only a cluster that exports sees one.
async fn note_conflicts(ctx: &Ctx, imp: &mcs::Import, import: Option<&ServiceImport>) {
    let Some(note) = mcs::conflicts_note(&imp.conflicts) else {
        return;
    };
    let on = import.map(|i| i.object_ref(&()));
    ctx.event(EventType::Warning, "ServiceConflict", note, "Import", on)
        .await;
}

fn from(cluster: &str) -> Recorded {
    Recorded::From(BTreeSet::from([cluster.to_string()]))
}

/// A local object an MCS import would write (a ServiceImport, a derived Service, an MCS slice)
/// that is not ours: left untouched, counted (`remote=""`), an Event.
async fn conflict(
    ctx: &Ctx,
    key: &Key,
    kind: &'static str,
    on: Option<ObjectReference>,
) -> Outcome {
    let obj = on.unwrap_or_default();
    let name = obj.name.clone().unwrap_or_default();
    warn!(key = %key, kind, name, "conflict: a local {kind} of that name exists and is not ours; left untouched");
    ctx.metrics
        .conflicts
        .get_or_create(&ByRemoteKind::new("", kind))
        .inc();
    let note = format!(
        "{kind} {name} exists and is not ours (no app.kubernetes.io/managed-by or endpointslice.kubernetes.io/managed-by of cross-cluster-controller.fair.com): not imported, left untouched"
    );
    ctx.event(
        EventType::Warning,
        "NotOurImport",
        note,
        "Import",
        Some(obj),
    )
    .await;
    Outcome::Conflict
}

/// What a create, replace or delete returned goes into the cache at once (write-through), so
/// the watch event it causes finds the key converged.
fn remember<K: Local>(cache: &RwLock<Cache<K>>, obj: &K) {
    cache
        .write()
        .apply(kube::runtime::watcher::Event::Apply(obj.clone()));
}

/// The object as written (in a dry run, as it would have been).
fn done<K: Local>(cache: &RwLock<Cache<K>>, written: Written<K>, sent: &K) -> K {
    match written {
        Written::Done(obj) => {
            remember(cache, &obj);
            obj
        }
        Written::Skipped => sent.clone(),
    }
}

async fn create<K: Owned>(
    ctx: &Ctx,
    key: &Key,
    cache: &RwLock<Cache<K>>,
    obj: &K,
    wrote: &mut Wrote,
) -> std::result::Result<K, Stop> {
    match ctx.writer.create(obj).await {
        // a dry run: what follows a create depends on what it returns (a uid, ClusterIPs)
        Ok(Written::Skipped) => Err(Stop::Outcome(Outcome::Applied)),
        Ok(w) => {
            wrote.applied = true;
            Ok(done(cache, w, obj))
        }
        Err(e) if e.api_code() == Some(409) => {
            // already there: what is it? ours (our cache is behind): the next pass; not ours: a
            // conflict, answered by the next pass from the live object
            let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
            match ctx.writer.get::<K>(&ns, &name).await? {
                Some(live) => conflict_or_retry(ctx, key, cache, live).await,
                None => Err(Stop::Err(Error::Retry(format!(
                    "{} {ns}/{name} existed, then did not",
                    K::KIND
                )))),
            }
        }
        Err(e) => Err(Stop::Err(e)),
    }
}

/// An object a create met: if it is ours (the cache was behind), it goes into the cache and the
/// key is retried; if not, a conflict.
async fn conflict_or_retry<K: Owned>(
    ctx: &Ctx,
    key: &Key,
    cache: &RwLock<Cache<K>>,
    live: K,
) -> std::result::Result<K, Stop> {
    if live.is_ours() {
        remember(cache, &live);
        return Err(Stop::Err(Error::Retry(format!(
            "{} {}/{} existed before our cache had it",
            K::KIND,
            key.namespace,
            live.name_any()
        ))));
    }
    let on = live.object_ref(&());
    Err(Stop::Outcome(conflict(ctx, key, K::KIND, Some(on)).await))
}

/// A kind an import writes, and whether a live object of it is ours.
trait Owned: Local {
    fn is_ours(&self) -> bool;
}

impl Owned for ServiceImport {
    fn is_ours(&self) -> bool {
        import_is_ours(self)
    }
}

impl Owned for Service {
    fn is_ours(&self) -> bool {
        mcs::derived_is_ours(self)
    }
}

impl Owned for EndpointSlice {
    fn is_ours(&self) -> bool {
        mcs::slice_is_ours(self)
    }
}

async fn replace<K: Local>(
    ctx: &Ctx,
    cache: &RwLock<Cache<K>>,
    obj: &K,
    wrote: &mut Wrote,
) -> std::result::Result<K, Stop> {
    let w = ctx.writer.replace(obj).await?;
    wrote.applied = true;
    Ok(done(cache, w, obj))
}

async fn replace_status<K: Local>(
    ctx: &Ctx,
    cache: &RwLock<Cache<K>>,
    obj: &K,
    wrote: &mut Wrote,
) -> std::result::Result<K, Stop> {
    let w = ctx.writer.replace_status(obj).await?;
    wrote.applied = true;
    Ok(done(cache, w, obj))
}

async fn delete<K: Local>(
    ctx: &Ctx,
    cache: &RwLock<Cache<K>>,
    obj: &K,
    why: &str,
    wrote: &mut Wrote,
) -> std::result::Result<(), Stop> {
    let (ns, name) = (obj.namespace().unwrap_or_default(), obj.name_any());
    let Some(uid) = obj.uid() else {
        return Err(Stop::Err(Error::Unexpected(format!(
            "{} {ns}/{name} has no uid",
            K::KIND
        ))));
    };
    ctx.writer.delete::<K>(&ns, &name, &uid, why).await?;
    wrote.deleted = true;
    if !ctx.writer.dry_run() {
        cache
            .write()
            .apply(kube::runtime::watcher::Event::Delete(obj.clone()));
    }
    Ok(())
}

#[cfg(test)]
#[path = "mcs_decision_tests.rs"]
mod decision_tests;
