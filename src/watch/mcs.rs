//! The Multi-Cluster Services API's watches. Per cluster read (the local one included): its
//! ServiceExports, its ClusterProperty `cluster.clusterset.k8s.io`, and the Services and
//! EndpointSlices of each namespace where it exports something (two watches per namespace,
//! started by its first export there, stopped with its last). In the local cluster: our
//! ServiceImports, derived Services and MCS slices (drift or a manual deletion queues the key).
use std::collections::BTreeSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::{spawn, spawn_guarded, spec};
use crate::desired::mcs::{self, CLUSTER_ID_PROPERTY, ClusterProperty, ServiceExport};
use crate::error::{Error, Result};
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::{GroupKey, LOCAL, McsCluster, McsLocal, McsNamespace, Property};

/// Where one cluster's MCS watches read, and until when.
pub struct Source {
    pub cluster: Arc<McsCluster>,
    pub client: Client,
    /// the namespaces read (empty: all)
    pub namespaces: Vec<String>,
    pub timeout: u32,
    pub stop: CancellationToken,
    /// a remote's budget, which its MCS watches keep to as its other watches do (None: the
    /// local cluster)
    pub guard: Option<Arc<dyn super::Guard>>,
}

/// The preflight of `--mcs`, before any MCS watch starts: the local cluster serves the MCS API
/// (its CRDs are installed) and has a name (a ClusterProperty `cluster.clusterset.k8s.io` or
/// `--local-cluster-name`).
pub async fn preflight(local: &Client, mcs: &McsLocal) -> Result<()> {
    use crate::desired::mcs::ServiceImport;
    let lp = kube::api::ListParams::default().limit(1);
    let served = |kind: &str, e: kube::Error| {
        Error::Config(format!(
            "--mcs: the local cluster does not serve {kind} (multicluster.x-k8s.io/v1beta1): {e}; install the MCS API's CRDs (the chart's mcs.enabled=true does)"
        ))
    };
    kube::Api::<ServiceExport>::all(local.clone())
        .list_metadata(&lp)
        .await
        .map_err(|e| served("ServiceExports", e))?;
    kube::Api::<ServiceImport>::all(local.clone())
        .list_metadata(&lp)
        .await
        .map_err(|e| served("ServiceImports", e))?;
    if !mcs.source.fallback.is_empty() {
        return Ok(());
    }
    // read as the watch reads it (list with a field selector: the RBAC grants list and watch)
    let lp =
        kube::api::ListParams::default().fields(&format!("metadata.name={CLUSTER_ID_PROPERTY}"));
    let property = kube::Api::<ClusterProperty>::all(local.clone())
        .list(&lp)
        .await
        .map(|l| l.items.into_iter().next());
    match property {
        Ok(Some(p)) if crate::desired::mcs::is_cluster_name(&p.spec.value) => Ok(()),
        _ => Err(Error::Config(
            "--mcs needs this cluster's name: a ClusterProperty cluster.clusterset.k8s.io (about.k8s.io/v1alpha1) with a valid value, or --local-cluster-name".into(),
        )),
    }
}

/// Starts one cluster's watches as an MCS source: its exports (which start and stop the
/// watches of the namespaces it exports in) and its ClusterProperty.
pub fn source(sup: &Supervisor, ctl: &Arc<Controller>, src: Source) {
    let src = Arc::new(src);
    let label = Arc::clone(&src.cluster.label);
    let what = format!("{label} ServiceExports");
    let exports = spec::<ServiceExport>(
        &src.client,
        &src.namespaces,
        src.timeout,
        String::new(),
        &label,
        what,
    );
    let on_change = {
        let (sup, ctl, src) = (sup.clone(), Arc::clone(ctl), Arc::clone(&src));
        move |keys: Vec<GroupKey>| {
            keep_namespaces(&sup, &ctl, &src, &keys);
            ctl.mcs_changed(&src.cluster.label, keys);
        }
    };
    let m = ctl.metrics();
    let into: super::Target<McsCluster, ServiceExport> = (Arc::clone(&src.cluster), |c| &c.exports);
    let on_listed: super::Listed = {
        let ctl = Arc::clone(ctl);
        Box::new(move || ctl.enqueue_imports())
    };
    let guard = src.guard.clone();
    spawn_guarded(
        sup,
        m,
        &src.stop,
        exports,
        into,
        on_change,
        Some(on_listed),
        guard,
    );
    property(sup, ctl, &src);
}

/// Starts the watches of each namespace where the cluster now exports something, and stops
/// those of namespaces where it exports nothing any more.
fn keep_namespaces(sup: &Supervisor, ctl: &Arc<Controller>, src: &Arc<Source>, keys: &[GroupKey]) {
    let touched: BTreeSet<&str> = keys.iter().map(|k| k.0.as_str()).collect();
    for ns in touched {
        let exports_here = !src.cluster.exported_in(ns).is_empty();
        let watched = src.cluster.namespace(ns).is_some();
        if exports_here && !watched {
            watch_namespace(sup, ctl, src, ns);
        } else if !exports_here
            && watched
            && let Some(n) = src.cluster.namespaces.write().remove(ns)
        {
            n.cancel.cancel();
            info!(cluster = %src.cluster.label, namespace = ns, "no export left in the namespace; its watches stop");
        }
    }
}

fn watch_namespace(sup: &Supervisor, ctl: &Arc<Controller>, src: &Arc<Source>, ns: &str) {
    let n = Arc::new(McsNamespace::new(src.stop.child_token()));
    src.cluster
        .namespaces
        .write()
        .insert(ns.to_string(), Arc::clone(&n));
    let label = Arc::clone(&src.cluster.label);
    let scope = [ns.to_string()];
    let what = |kind: &str| format!("{label} {kind} of namespace {ns} (MCS)");
    // a change of a Service or slice the cluster exports
    let on_change = || {
        let (ctl, cluster) = (Arc::clone(ctl), Arc::clone(&src.cluster));
        move |keys: Vec<GroupKey>| {
            let exported: Vec<GroupKey> = keys
                .into_iter()
                .filter(|k| cluster.exports_key(k))
                .collect();
            if !exported.is_empty() {
                ctl.mcs_changed(&cluster.label, exported);
            }
        }
    };
    // a complete listing (perhaps empty) answers every export of the namespace
    let on_listed = || -> Option<super::Listed> {
        let (ctl, cluster, ns) = (Arc::clone(ctl), Arc::clone(&src.cluster), ns.to_string());
        Some(Box::new(move || {
            ctl.mcs_changed(&cluster.label, cluster.exported_in(&ns));
        }))
    };
    let (c, t, m) = (&src.client, src.timeout, ctl.metrics());
    let sel = mcs::source_selector();
    let services = spec::<Service>(c, &scope, t, sel.clone(), &label, what("Services"));
    let into: super::Target<McsNamespace, Service> = (Arc::clone(&n), |n| &n.services);
    let guard = || src.guard.clone();
    spawn_guarded(
        sup,
        m,
        &n.cancel,
        services,
        into,
        on_change(),
        on_listed(),
        guard(),
    );
    let slices = spec::<EndpointSlice>(c, &scope, t, sel, &label, what("EndpointSlices"));
    let into: super::Target<McsNamespace, EndpointSlice> = (Arc::clone(&n), |n| &n.slices);
    spawn_guarded(
        sup,
        m,
        &n.cancel,
        slices,
        into,
        on_change(),
        on_listed(),
        guard(),
    );
}

/// Follows the cluster's ClusterProperty `cluster.clusterset.k8s.io`: a change of the name it
/// goes by queues every MCS key. No such object, no ClusterProperty API (404) or no right to
/// read it (403) all mean "none": the cluster goes by its fallback name. A 403 is also a missing
/// right, named on /readyz (and in `status`) until it is granted, logged once, and retried
/// after a bounded back-off (1 s doubling to a minute), not at kube's pace.
fn property(sup: &Supervisor, ctl: &Arc<Controller>, src: &Arc<Source>) {
    let api: Api<ClusterProperty> = Api::all(src.client.clone());
    let cfg = watcher::Config::default()
        .fields(&format!("metadata.name={CLUSTER_ID_PROPERTY}"))
        .timeout(src.timeout);
    let (ctl, cluster) = (Arc::clone(ctl), Arc::clone(&src.cluster));
    let name = format!("{} ClusterProperty watch", cluster.label);
    sup.spawn_until(name, src.stop.clone(), async move {
        let mut delay = FORBIDDEN_RETRY_MIN;
        loop {
            let stream = watcher(api.clone(), cfg.clone()).default_backoff();
            let (answered, refused) = follow_property(&ctl, &cluster, stream).await;
            if answered {
                delay = FORBIDDEN_RETRY_MIN;
            }
            let right = format!("list, watch clusterproperties.{}", mcs::ABOUT_GROUP);
            if let Some(e) = refused
                && cluster.set_missing_right(Some(right))
            {
                warn!(cluster = %cluster.label, error = %e, "no right to read ClusterProperties (403): named on /readyz until granted; retrying with back-off");
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(FORBIDDEN_RETRY_MAX);
        }
    });
}

/// The back-off of the ClusterProperty watch after a 403.
const FORBIDDEN_RETRY_MIN: std::time::Duration = std::time::Duration::from_secs(1);
const FORBIDDEN_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Follows one ClusterProperty watch until it is refused with 403: whether the server answered
/// anything before, and the refusal (None: the watch ended).
async fn follow_property<S>(
    ctl: &Controller,
    cluster: &McsCluster,
    stream: S,
) -> (bool, Option<String>)
where
    S: futures::Stream<Item = Result<Event<ClusterProperty>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    let mut listed: Option<String> = None;
    let mut failing = false;
    let mut answered = false;
    while let Some(event) = stream.next().await {
        // `Init` comes before the listing is asked for: only what follows is an answer (kube's
        // back-off, reset by any Ok event, is reset by it too: why a 403 used to come back
        // several times a second)
        if matches!(&event, Ok(e) if !matches!(e, Event::Init)) {
            failing = false;
            answered = true;
            if cluster.set_missing_right(None) {
                info!(cluster = %cluster.label, "ClusterProperties readable again");
            }
        }
        let p = match event {
            Ok(Event::Init) => {
                listed = None;
                continue;
            }
            Ok(Event::InitApply(cp)) => {
                listed = Some(cp.spec.value);
                continue;
            }
            Ok(Event::InitDone) => property_of(cluster, listed.take()),
            Ok(Event::Apply(cp)) => property_of(cluster, Some(cp.spec.value)),
            Ok(Event::Delete(_)) => Property::Absent,
            Err(e) if status(&e) == Some(403) => {
                if cluster.set_property(Property::Absent) {
                    ctl.settle_mcs_names().await;
                }
                return (answered, Some(e.to_string()));
            }
            Err(e) if status(&e) == Some(404) => Property::Absent,
            Err(e) => {
                if !failing {
                    warn!(cluster = %cluster.label, error = %e, "ClusterProperty watch failed; retrying with back-off");
                }
                failing = true;
                continue;
            }
        };
        if cluster.set_property(p) {
            // a claim, granted or refused by who holds the name (`McsLocal::settle`)
            ctl.settle_mcs_names().await;
        }
    }
    // the watcher never ends on its own; were it to, it is started again after the back-off
    (answered, None)
}

fn property_of(cluster: &McsCluster, value: Option<String>) -> Property {
    match value {
        Some(v) if mcs::is_cluster_name(&v) => Property::Value(v),
        Some(v) => {
            warn!(cluster = %cluster.label, value = v, "ClusterProperty cluster.clusterset.k8s.io is not a valid cluster name; using the fallback name");
            Property::Absent
        }
        None => Property::Absent,
    }
}

/// The API's status code of a failed watch or listing, if it answered one.
fn status(e: &watcher::Error) -> Option<u16> {
    let api = match e {
        watcher::Error::InitialListFailed(e)
        | watcher::Error::WatchStartFailed(e)
        | watcher::Error::WatchFailed(e) => e,
        _ => return None,
    };
    match api {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Starts the watches of our imports in the local cluster: ServiceImports, derived Services and
/// MCS slices; a change queues the key (drift, a manual deletion).
pub fn destination(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    local: &Client,
    mcs: &Arc<McsLocal>,
    timeout: u32,
) {
    let on_change = || {
        let ctl = Arc::clone(ctl);
        move |keys| ctl.enqueue_mcs(keys)
    };
    let what = |kind: &str| format!("local MCS {kind}");
    let (m, ns) = (ctl.metrics(), ctl.namespaces());
    let stop = &sup.child_token();
    let s = || Arc::clone(mcs);
    let imports = spec::<mcs::ServiceImport>(
        local,
        ns,
        timeout,
        mcs::import_selector(),
        LOCAL,
        what("ServiceImports"),
    );
    spawn(sup, m, stop, imports, (s(), |s| &s.imports), on_change());
    let derived = spec::<Service>(
        local,
        ns,
        timeout,
        mcs::derived_selector(),
        LOCAL,
        what("derived Services"),
    );
    spawn(sup, m, stop, derived, (s(), |s| &s.derived), on_change());
    let slices = spec::<EndpointSlice>(
        local,
        ns,
        timeout,
        mcs::slice_selector(),
        LOCAL,
        what("EndpointSlices"),
    );
    spawn(sup, m, stop, slices, (s(), |s| &s.slices), on_change());
}
