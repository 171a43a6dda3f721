//! The Multi-Cluster Services path (`XCC_BENCH_MCS=1 scripts/bench [SIZES]`), each scenario on a
//! fresh bed of west (local) and the remotes east and north, both read from Secrets. Each remote
//! exports the same N Services from one namespace (a ClusterIP Service, one 3-endpoint
//! EndpointSlice and a ServiceExport each), so west gets N ServiceImports of two clusters each:
//! per import a derived Service and two MCS slices. The daemon runs with `--mcs
//! --local-cluster-name west` and its default workers.
//!
//! - **Convergence** at each size (default 1,000 and 2,000 exports per remote): the floor is the
//!   daemon's own objects (computed by the pure `desired::mcs` functions the daemon's pass calls)
//!   written by a plain client with as many keys in flight as the daemon has workers, each key
//!   along the daemon's chain: create the ServiceImport, create its derived Service (owned by
//!   the import's uid), update the import with `spec.ips` (the derived Service's ClusterIP),
//!   create the slices, write `status.clusters`. Both are timed until a watcher on west has
//!   seen every import with its `ips` and both clusters in `status.clusters`, and every MCS
//!   slice. The floor runs before and after the daemon in the same namespace, cleaned between
//!   runs, and the ratio is against the mean of the two. The daemon's objects are checked
//!   against the floor's (a comparison of the first and last key).
//! - **Memory**: peak and steady RSS at each size; MiB per 1,000 imports from the slope.
//!   Beside it, the label path at the same sizes (2 remotes exporting the same N labelled
//!   Services: N followers with 2 slices each), measured by the several-remotes scenario in the
//!   same run (`XCC_BENCH_MCS_ONLY` without `label` leaves it out).
//! - **Lag**: 50 endpoint changes per second for 20 s over east's exported slices (N = 1,000),
//!   from the remote write to a separate watcher on west seeing the new address in east's MCS
//!   slice.
//!
//! `XCC_BENCH_MCS_ONLY` (comma-separated: convergence, label, lag) runs only those named.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use cross_cluster_controller::desired::mcs::{
    self as m, Change, ClusterExport, ServiceExport, ServiceImport,
};
use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::{DeleteParams, ListParams};

use super::multi::{apply_secret, bed_with, load_1m, namespaces};
use super::*;

/// The heading of this mode's section of results.md.
pub const SECTION: &str = "## Multi-Cluster Services";

/// The remotes of every scenario (the first two of the several-remotes benchmark's).
const REMOTES: usize = 2;

/// The daemon's default number of workers (`--workers`), read from its own flags.
fn default_workers() -> Res<usize> {
    use clap::Parser;
    let args = cross_cluster_controller::cli::Args::try_parse_from(["cross-cluster-controller"])?;
    Ok(usize::from(args.workers))
}

/// The source objects every remote holds, per name `svc-<i>`: a ClusterIP Service, one slice
/// of 3 endpoints (addresses from the remote's seed base, distinct between remotes) and a
/// ServiceExport; 32 names in flight per remote, the remotes at once.
async fn write_exports(remotes: &[(String, Client)], ns: &str, n: usize) -> Res<()> {
    let writes = remotes.iter().enumerate().map(|(ri, (_, c))| async move {
        let svcs: Api<Service> = Api::namespaced(c.clone(), ns);
        let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
        let exports: Api<ServiceExport> = Api::namespaced(c.clone(), ns);
        stream::iter(0..n)
            .map(|i| {
                let (svcs, slices, exports) = (svcs.clone(), slices.clone(), exports.clone());
                async move {
                    let name = format!("svc-{i}");
                    let pp = PostParams::default();
                    svcs.create(&pp, &source_service(&name)).await?;
                    slices
                        .create(&pp, &slice(&name, 3, ri * n + i, false))
                        .await?;
                    let export: ServiceExport =
                        serde_json::from_value(json!({"metadata": {"name": name}}))?;
                    exports.create(&pp, &export).await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                }
            })
            .buffer_unordered(PARALLEL)
            .try_collect::<Vec<_>>()
            .await
    });
    futures::future::try_join_all(writes).await?;
    Ok(())
}

/// An exported Service: ClusterIP (so the import is ClusterSetIP and gets `spec.ips`).
fn source_service(name: &str) -> Service {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {"app": name}},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"}]}}))
    .expect("service fixture")
}

/// What one remote holds in the namespace, as the daemon's caches hold it.
struct Held {
    cluster: String,
    exports: BTreeMap<String, ServiceExport>,
    services: BTreeMap<String, Service>,
    slices: BTreeMap<String, Vec<EndpointSlice>>,
}

/// Every remote's exports, Services and slices in `ns` (complete listings).
async fn held(remotes: &[(String, Client)], ns: &str) -> Res<Vec<Held>> {
    let mut out = Vec::new();
    for (cluster, c) in remotes {
        let lp = ListParams::default();
        let exports = Api::<ServiceExport>::namespaced(c.clone(), ns)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .map(|e| (e.name_any(), e))
            .collect();
        let sel = ListParams::default().labels(&m::source_selector());
        let services = Api::<Service>::namespaced(c.clone(), ns)
            .list(&sel)
            .await?
            .items
            .into_iter()
            .map(|s| (s.name_any(), s))
            .collect();
        let mut slices: BTreeMap<String, Vec<EndpointSlice>> = BTreeMap::new();
        for s in Api::<EndpointSlice>::namespaced(c.clone(), ns)
            .list(&sel)
            .await?
            .items
        {
            let svc = s
                .labels()
                .get("kubernetes.io/service-name")
                .cloned()
                .unwrap_or_default();
            slices.entry(svc).or_default().push(s);
        }
        out.push(Held {
            cluster: cluster.clone(),
            exports,
            services,
            slices,
        });
    }
    Ok(out)
}

/// Every cluster's export of `name`, as the daemon's pass reads them.
fn exports_of<'a>(held: &'a [Held], name: &str) -> Vec<ClusterExport<'a>> {
    held.iter()
        .filter_map(|h| {
            Some(ClusterExport {
                cluster: &h.cluster,
                export: h.exports.get(name)?,
                service: h.services.get(name),
                slices: h
                    .slices
                    .get(name)
                    .map(|v| v.iter().collect())
                    .unwrap_or_default(),
            })
        })
        .collect()
}

/// The exported names, in order.
fn names(held: &[Held]) -> Vec<String> {
    let mut all: Vec<String> = held
        .iter()
        .flat_map(|h| h.exports.keys().cloned())
        .collect();
    all.sort();
    all.dedup();
    all
}

/// Local API handles of the floor.
#[derive(Clone)]
struct Local {
    imports: Api<ServiceImport>,
    services: Api<Service>,
    slices: Api<EndpointSlice>,
}

impl Local {
    fn new(west: &Client, ns: &str) -> Self {
        Local {
            imports: Api::namespaced(west.clone(), ns),
            services: Api::namespaced(west.clone(), ns),
            slices: Api::namespaced(west.clone(), ns),
        }
    }
}

fn unexpected<K>(what: &str, c: &Change<K>) -> Box<dyn std::error::Error + Send + Sync> {
    let got = match c {
        Change::Create(_) => "a create",
        Change::Update(_) => "an update",
        Change::Recreate(_) => "a recreate",
        Change::Unchanged => "no change",
        Change::NotOurs => "not ours",
    };
    format!("the floor expected {what}, the pure functions asked for {got}").into()
}

/// One key along the daemon's chain, each object as the pure `desired::mcs` computes it from the
/// exports and what the previous writes returned; returns the writes it made.
async fn chain(l: &Local, ns: &str, name: &str, exports: &[ClusterExport<'_>]) -> Res<usize> {
    let pp = PostParams {
        field_manager: Some(cross_cluster_controller::reconcile::writer::FIELD_MANAGER.into()),
        ..Default::default()
    };
    let judge = |live: Option<&ServiceImport>, derived: Option<&Service>| -> Res<m::Import> {
        m::import(ns, name, exports, live, derived)?
            .ok_or_else(|| format!("no import of {ns}/{name}").into())
    };
    // the ServiceImport, for its uid
    let imp = judge(None, None)?;
    let live = match m::import_change(None, &imp.service_import) {
        Change::Create(obj) => l.imports.create(&pp, &obj).await?,
        c => return Err(unexpected("the ServiceImport's create", &c)),
    };
    // the derived Service, owned by it
    let imp = judge(Some(&live), None)?;
    let desired = imp.derived.as_ref().ok_or("no derived Service")?;
    let derived = match m::derived_change(None, desired) {
        Change::Create(obj) => l.services.create(&pp, &obj).await?,
        c => return Err(unexpected("the derived Service's create", &c)),
    };
    // spec.ips from its ClusterIP
    let imp = judge(Some(&live), Some(&derived))?;
    let live = match m::import_change(Some(&live), &imp.service_import) {
        Change::Update(obj) => l.imports.replace(name, &pp, &obj).await?,
        c => return Err(unexpected("the ServiceImport's update (ips)", &c)),
    };
    let imp = judge(Some(&live), Some(&derived))?;
    if let Some(d) = &imp.derived
        && !matches!(m::derived_change(Some(&derived), d), Change::Unchanged)
    {
        return Err("the derived Service would be written twice".into());
    }
    // the slices of every cluster
    for s in &imp.slices {
        match m::mcs_slice_change(None, s) {
            Change::Create(obj) => l.slices.create(&pp, &obj).await?,
            c => return Err(unexpected("a slice's create", &c)),
        };
    }
    // status.clusters
    match m::import_status_change(&live, &imp.service_import) {
        Change::Update(obj) => l.imports.replace_status(name, &pp, &obj).await?,
        c => return Err(unexpected("the ServiceImport's status update", &c)),
    };
    Ok(4 + imp.slices.len())
}

/// How many objects pass `keep`, kept current by a watch of whole objects (a relisting watch
/// publishes nothing until its listing is complete).
fn counter_of<K>(c: &Client, ns: &str, selector: &str, keep: fn(&K) -> bool) -> Count
where
    K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
{
    let api: Api<K> = Api::namespaced(c.clone(), ns);
    let cfg = watcher::Config::default().labels(selector);
    let (tx, rx) = tokio::sync::watch::channel(None);
    tokio::spawn(async move {
        let mut names = std::collections::HashSet::new();
        let mut relist: Option<std::collections::HashSet<String>> = None;
        let mut s = std::pin::pin!(watcher::watcher(api, cfg));
        while let Some(ev) = s.next().await {
            match ev {
                Ok(Event::Apply(o)) => {
                    if keep(&o) {
                        names.insert(o.name_any());
                    } else {
                        names.remove(&o.name_any());
                    }
                }
                Ok(Event::Delete(o)) => {
                    names.remove(&o.name_any());
                }
                Ok(Event::Init) => relist = Some(Default::default()),
                Ok(Event::InitApply(o)) => {
                    if let Some(r) = relist.as_mut()
                        && keep(&o)
                    {
                        r.insert(o.name_any());
                    }
                    continue;
                }
                Ok(Event::InitDone) => names = relist.take().unwrap_or_default(),
                Err(_) => continue,
            }
            if relist.is_none() && tx.send(Some(names.len())).is_err() {
                return;
            }
        }
    });
    rx
}

/// A complete import: `spec.ips` set and both remotes in `status.clusters`.
fn complete(si: &ServiceImport) -> bool {
    !si.spec.ips.is_empty()
        && si
            .status
            .as_ref()
            .is_some_and(|s| s.clusters.len() == REMOTES)
}

/// Watch counters on west of the complete imports and of the MCS slices, once listed.
async fn counters(west: &Client, ns: &str) -> Res<(Count, Count)> {
    let mut imports = counter_of::<ServiceImport>(west, ns, &m::import_selector(), complete);
    let mut slices = counter::<EndpointSlice>(west, ns, &m::slice_selector());
    imports.wait_for(Option::is_some).await?;
    slices.wait_for(Option::is_some).await?;
    Ok((imports, slices))
}

/// The floor: every key along the daemon's chain, `workers` keys in flight, timed until the
/// watch counters see every complete import and every slice; returns (seconds, writes made).
async fn floor(west: &Client, ns: &str, held: &[Held], workers: usize) -> Res<(f64, usize)> {
    let l = Local::new(west, ns);
    let all = names(held);
    let (mut imports, mut slices) = counters(west, ns).await?;
    let writes = AtomicUsize::new(0);
    let start = Instant::now();
    stream::iter(&all)
        .map(|name| {
            let (l, writes) = (l.clone(), &writes);
            async move {
                let w = chain(&l, ns, name, &exports_of(held, name)).await?;
                writes.fetch_add(w, Ordering::Relaxed);
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
            }
        })
        .buffer_unordered(workers)
        .try_collect::<Vec<_>>()
        .await?;
    let n = all.len();
    let limit = Duration::from_secs(900);
    reach(&mut imports, n, &mut slices, n * REMOTES, limit).await?;
    Ok((start.elapsed().as_secs_f64(), writes.into_inner()))
}

/// Deletes every import, derived Service and MCS slice of `ns` (each one, not through the
/// garbage collector) and waits until none is listed.
async fn clean(west: &Client, ns: &str) -> Res<()> {
    let l = Local::new(west, ns);
    let dp = DeleteParams::default();
    let lp = |s: String| ListParams::default().labels(&s);
    let (slice_sel, import_sel) = (lp(m::slice_selector()), lp(m::import_selector()));
    let slices = l.slices.delete_collection(&dp, &slice_sel);
    let imports = l.imports.delete_collection(&dp, &import_sel);
    let (a, b) = tokio::join!(slices, imports);
    a?;
    b?;
    let derived: Vec<String> = l
        .services
        .list_metadata(&lp(m::derived_selector()))
        .await?
        .items
        .iter()
        .map(|s| s.name_any())
        .collect();
    stream::iter(derived)
        .map(|n| {
            let svcs = l.services.clone();
            async move {
                match svcs.delete(&n, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let left = l
            .imports
            .list_metadata(&lp(m::import_selector()))
            .await?
            .items
            .len()
            + l.services
                .list_metadata(&lp(m::derived_selector()))
                .await?
                .items
                .len()
            + l.slices
                .list_metadata(&lp(m::slice_selector()))
                .await?
                .items
                .len();
        if left == 0 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{left} MCS objects still in {ns} after 300 s").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The daemon with `--mcs --local-cluster-name west`, its default workers, every remote from a
/// Secret in `ns`, its admin server on `port`.
fn start_mcs_daemon(bin: &Path, kc: &Path, ns: &str, port: u16) -> Res<Proc> {
    let log = std::env::temp_dir().join(format!("xcc-bench-{ns}.log"));
    let out = std::fs::File::create(log)?;
    let child = Command::new(bin)
        .args(["--devmode", "--local-context", "west", "--namespace", ns])
        .args([
            "--watch-namespace",
            ns,
            "--mcs",
            "--local-cluster-name",
            "west",
        ])
        .args(["--admin-bind", &format!("127.0.0.1:{port}")])
        .args(["--sweep-schedule", SWEEP_SCHEDULE])
        .env("KUBECONFIG", kc)
        .env(
            "RUST_LOG",
            std::env::var("XCC_BENCH_RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .env_remove("KUBECONFIG_PATH")
        .env_remove("REMOTE_CONTEXT")
        .stdout(Stdio::from(out.try_clone()?))
        .stderr(Stdio::from(out))
        .spawn()?;
    Ok(Proc { child, port })
}

/// The kinds of MCS writes (the daemon's Lease renewals are left out).
const MCS_KINDS: [&str; 4] = ["ServiceImport", "Service", "EndpointSlice", "ServiceExport"];

/// The daemon's `xcc_writes_total` of the MCS kinds, by `kind verb`, from its /metrics.
async fn daemon_writes(port: u16) -> Res<BTreeMap<String, f64>> {
    let text = daemon_metrics(port).await?;
    if !text.contains("\nxcc_writes_total{") {
        return Err("the daemon's /metrics has no xcc_writes_total".into());
    }
    let label = |l: &str, k: &str| -> Option<String> {
        let at = l.find(&format!("{k}=\""))? + k.len() + 2;
        Some(l[at..].split('"').next()?.to_string())
    };
    let mut out = BTreeMap::new();
    for l in text.lines().filter(|l| l.starts_with("xcc_writes_total{")) {
        let (Some(kind), Some(verb)) = (label(l, "kind"), label(l, "verb")) else {
            continue;
        };
        let v: f64 = l
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0);
        if MCS_KINDS.contains(&kind.as_str()) && v > 0.0 {
            out.insert(format!("{kind} {verb}"), v);
        }
    }
    Ok(out)
}

fn total(w: &BTreeMap<String, f64>) -> f64 {
    w.values().sum()
}

/// What the API server counts as MCS writes on west (POST, PUT, PATCH, DELETE, status
/// subresource included): every kind the daemon writes in MCS mode.
async fn mcs_api_writes(west: &Client) -> Res<f64> {
    let kinds = [
        "services",
        "endpointslices",
        "serviceimports",
        "serviceexports",
    ];
    api_writes_of(west, &kinds).await
}

/// Fails unless the daemon's objects of the first and last key are what the floor wrote: the
/// ServiceImport's labels, annotations, spec (but `ips`) and status, the derived Service's
/// labels, annotations, ports and owner, and each slice's labels, endpoints, ports and owner.
async fn same_as_floor(west: &Client, ns: &str, held: &[Held]) -> Res<()> {
    let l = Local::new(west, ns);
    let all = names(held);
    for name in [all.first(), all.last()].into_iter().flatten() {
        let exports = exports_of(held, name);
        let live = l.imports.get(name).await?;
        let derived_name = m::derived_name(ns, name);
        let derived = l.services.get(&derived_name).await?;
        let imp = m::import(ns, name, &exports, Some(&live), Some(&derived))?
            .ok_or("no desired import")?;
        let differs = |what: &str| -> Res<()> {
            Err(format!("the daemon's {what} of {ns}/{name} differs from the floor's").into())
        };
        if !matches!(
            m::import_change(Some(&live), &imp.service_import),
            Change::Unchanged
        ) || live.labels() != imp.service_import.labels()
            || live.annotations() != imp.service_import.annotations()
        {
            return differs("ServiceImport");
        }
        if !matches!(
            m::import_status_change(&live, &imp.service_import),
            Change::Unchanged
        ) {
            return differs("ServiceImport status");
        }
        // (its ports as the API server defaults them: derived_change compares them)
        let want = imp.derived.as_ref().ok_or("no desired derived Service")?;
        if !matches!(m::derived_change(Some(&derived), want), Change::Unchanged) {
            return differs("derived Service");
        }
        if derived.labels() != want.labels() || derived.annotations() != want.annotations() {
            return differs("derived Service's metadata");
        }
        if derived.owner_references() != want.owner_references() {
            return differs("derived Service's owner");
        }
        let live_slices = l
            .slices
            .list(&ListParams::default().labels(&format!(
                "{},{}={name}",
                m::slice_selector(),
                m::MCS_SERVICE_NAME_LABEL
            )))
            .await?
            .items;
        if live_slices.len() != imp.slices.len() {
            return differs("number of slices");
        }
        for want in &imp.slices {
            let Some(s) = live_slices.iter().find(|s| s.name_any() == want.name_any()) else {
                return differs("slice names");
            };
            if !matches!(m::mcs_slice_change(Some(s), want), Change::Unchanged) {
                return differs("slice");
            }
            if s.labels() != want.labels() || s.annotations() != want.annotations() {
                return differs("slice's metadata");
            }
            if s.endpoints != want.endpoints || s.ports != want.ports {
                return differs("slice's endpoints or ports");
            }
            if s.owner_references() != want.owner_references() {
                return differs("slice's owner");
            }
        }
    }
    Ok(())
}

/// One convergence scenario.
#[derive(serde::Serialize, Clone)]
pub struct Converge {
    remotes: usize,
    exports_each: usize,
    imports: usize,
    mcs_slices: usize,
    /// the daemon's default workers, and the floor's keys in flight
    workers: usize,
    floor_before_s: f64,
    floor_after_s: f64,
    /// the mean of the two: the ratio's denominator
    floor_s: f64,
    converge_s: f64,
    ratio: f64,
    /// writes the floor made (each answered), per run
    floor_writes: usize,
    /// MCS writes the local API server counted during the floor run before the daemon
    floor_api_writes: f64,
    /// the daemon's xcc_writes_total (MCS kinds), 5 s after convergence
    daemon_writes: f64,
    daemon_writes_by: BTreeMap<String, f64>,
    /// MCS writes the local API server counted from the daemon's start to 5 s after convergence
    daemon_api_writes: f64,
    /// per import: create, derived create, ips update, one slice per remote, status
    min_writes: usize,
    /// in the idle window after those 5 s (it holds a whole sweep): the API server's count and
    /// the daemon's
    idle_api_writes: f64,
    idle_daemon_writes: f64,
    idle_s: f64,
    idle_sweeps: f64,
    peak_mib: f64,
    steady_mib: f64,
    cpu_s: f64,
    /// the machine's 1-minute load average when the daemon started
    load_1m: f64,
}

/// Creates the CRDs of the MCS API (the folder `testbed/mcs-crds.sh` printed, in
/// `XCC_BENCH_MCS_CRDS`) in every cluster, with the bed's kubectl, and waits until established.
fn apply_crds(kc: &Path, clusters: &[&str]) -> Res<()> {
    let dir = std::env::var("XCC_BENCH_MCS_CRDS")
        .map_err(|_| "XCC_BENCH_MCS_CRDS is not set: run with XCC_BENCH_MCS=1 scripts/bench")?;
    let kubectl = Path::new(&std::env::var("XCC_TESTBED_BIN")?).join("kubectl");
    for c in clusters {
        let run = |args: &[&str]| -> Res<()> {
            let out = Command::new(&kubectl)
                .arg("--kubeconfig")
                .arg(kc)
                .args(["--context", c])
                .args(args)
                .stderr(Stdio::inherit())
                .output()?;
            if !out.status.success() {
                return Err(format!("kubectl {} on {c} failed", args.join(" ")).into());
            }
            Ok(())
        };
        run(&["apply", "-f", &dir])?;
        run(&[
            "wait",
            "--for",
            "condition=Established",
            "--timeout",
            "120s",
            "crd/serviceexports.multicluster.x-k8s.io",
            "crd/serviceimports.multicluster.x-k8s.io",
        ])?;
    }
    Ok(())
}

/// A fresh bed of west, east and north with the MCS CRDs, N exports on each remote, the
/// namespace in west, and the remotes' Secrets: (west, remotes, namespace).
async fn mcs_bed(
    kc: &Path,
    what: &str,
    n: usize,
    tag: &str,
) -> Res<(Client, Vec<(String, Client)>, String)> {
    let (west, remotes) = bed_with(kc, REMOTES).await?;
    let mut clusters = vec!["west"];
    clusters.extend(remotes.iter().map(|(n, _)| n.as_str()));
    apply_crds(kc, &clusters)?;
    let ns = format!("bench-mcs-{what}-{tag}-{n}");
    namespaces(&west, &remotes, &ns).await?;
    write_exports(&remotes, &ns, n).await?;
    for (name, _) in &remotes {
        apply_secret(&west, &ns, kc, name).await?;
    }
    Ok((west, remotes, ns))
}

pub async fn convergence(bin: &Path, kc: &Path, n: usize, tag: &str) -> Res<Converge> {
    let label = format!("[mcs {REMOTES} x {n}]");
    let workers = default_workers()?;
    eprintln!("{label} bed and remote setup");
    let (west, remotes, ns) = mcs_bed(kc, "conv", n, tag).await?;
    let held = held(&remotes, &ns).await?;
    let (imports, mcs_slices) = (names(&held).len(), n * REMOTES);
    if imports != n {
        return Err(format!("{label} {imports} exported names, not {n}").into());
    }
    let api_before = mcs_api_writes(&west).await?;
    let (floor_before, floor_writes) = floor(&west, &ns, &held, workers).await?;
    let floor_api = mcs_api_writes(&west).await? - api_before;
    eprintln!(
        "{label} floor before the daemon: {floor_before:.2}s, {floor_writes} writes ({floor_api} counted by the API server); cleaning"
    );
    clean(&west, &ns).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (mut si, mut sl) = counters(&west, &ns).await?;
    let port = free_port()?;
    let api_before = mcs_api_writes(&west).await?;
    let load = load_1m();
    let mut proc = start_mcs_daemon(bin, kc, &ns, port)?;
    let start = Instant::now();
    reach(&mut si, n, &mut sl, mcs_slices, Duration::from_secs(900)).await?;
    let converge = start.elapsed().as_secs_f64();
    eprintln!("{label} daemon converged in {converge:.2}s; 5 s, then an idle period");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let by = daemon_writes(port).await?;
    let api = mcs_api_writes(&west).await? - api_before;
    let idle = idle_window(port, || mcs_api_writes(&west)).await?;
    let idle_by = daemon_writes(port).await?;
    let idle_api = idle.writes;
    let (peak, steady, cpu) = proc.stat()?;
    drop(proc);
    same_as_floor(&west, &ns, &held).await?;
    eprintln!(
        "{label} {} daemon writes ({api} counted by the API server), {} idle; the same objects as the floor's; cleaning",
        total(&by),
        idle_api
    );
    clean(&west, &ns).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (floor_after, _) = floor(&west, &ns, &held, workers).await?;
    let floor_s = (floor_before + floor_after) / 2.0;
    eprintln!(
        "{label} floor after the daemon: {floor_after:.2}s; ratio {:.2}",
        converge / floor_s
    );
    Ok(Converge {
        remotes: REMOTES,
        exports_each: n,
        imports,
        mcs_slices,
        workers,
        floor_before_s: floor_before,
        floor_after_s: floor_after,
        floor_s,
        converge_s: converge,
        ratio: converge / floor_s,
        floor_writes,
        floor_api_writes: floor_api,
        daemon_writes: total(&by),
        daemon_writes_by: by.clone(),
        daemon_api_writes: api,
        min_writes: imports * (4 + REMOTES),
        idle_api_writes: idle_api,
        idle_daemon_writes: total(&idle_by) - total(&by),
        idle_s: idle.seconds,
        idle_sweeps: idle.sweeps,
        peak_mib: peak,
        steady_mib: steady,
        cpu_s: cpu,
        load_1m: load,
    })
}

#[derive(serde::Serialize)]
pub struct McsLag {
    #[serde(flatten)]
    lag: Lag,
    /// MCS writes on the local API server from the first change to 3 s after the last (one
    /// slice update per change is the minimum)
    api_writes: f64,
    over_100ms: usize,
    load_1m_before: f64,
    load_1m_after: f64,
}

/// Endpoint changes at `rate` per second for `secs` on east's exported slices (east and north
/// exporting the same N), timed to a separate watcher on west seeing the new address in east's
/// MCS slice.
pub async fn lag(bin: &Path, kc: &Path, n: usize, rate: u32, secs: u64, tag: &str) -> Res<McsLag> {
    let (west, remotes, ns) = mcs_bed(kc, "lag", n, tag).await?;
    let proc = start_mcs_daemon(bin, kc, &ns, free_port()?)?;
    let (mut si, mut sl) = counters(&west, &ns).await?;
    reach(&mut si, n, &mut sl, n * REMOTES, Duration::from_secs(900)).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (east, east_client) = &remotes[0];
    let sel = format!(
        "{},{}={east}",
        m::slice_selector(),
        cross_cluster_controller::desired::MCS_SOURCE_CLUSTER_LABEL
    );
    // east's slices have the seed base 0 (write_exports)
    let targets = [(Api::namespaced(east_client.clone(), &ns), 0)];
    let before = mcs_api_writes(&west).await?;
    let load_before = load_1m();
    let lag = churn(&west, &ns, &sel, &targets, n, rate, secs).await?;
    let load_after = load_1m();
    let writes = mcs_api_writes(&west).await? - before;
    drop(proc);
    Ok(McsLag {
        over_100ms: lag.samples_ms.iter().filter(|v| **v > 100.0).count(),
        lag,
        api_writes: writes,
        load_1m_before: load_before,
        load_1m_after: load_after,
    })
}

/// The label path at the same size, for its memory beside the MCS path's: the several-remotes
/// scenario with 2 remotes exporting the same N labelled Services.
#[derive(serde::Serialize)]
pub struct LabelPath {
    services_each: usize,
    followers: usize,
    floor_s: f64,
    converge_s: f64,
    ratio: f64,
    peak_mib: f64,
    steady_mib: f64,
    /// the whole row of the several-remotes benchmark
    row: Value,
}

#[derive(serde::Serialize)]
pub struct Results {
    convergence: Vec<Converge>,
    label_path: Vec<LabelPath>,
    lag: Option<McsLag>,
    /// peak RSS growth per 1,000 more imports, from the smallest to the largest size
    peak_mib_per_1000_imports: Option<f64>,
    steady_mib_per_1000_imports: Option<f64>,
    label_peak_mib_per_1000_followers: Option<f64>,
    whole_run_s: f64,
}

/// Slope of `f` per 1,000 of `x` between the first and last row.
fn slope<T>(rows: &[T], x: fn(&T) -> usize, f: fn(&T) -> f64) -> Option<f64> {
    let (a, b) = (rows.first()?, rows.last()?);
    (x(b) > x(a)).then(|| (f(b) - f(a)) / ((x(b) - x(a)) as f64 / 1000.0))
}

pub async fn run(bin: &Path, kc: &Path, sizes: &[usize], tag: &str) -> Res<Results> {
    let only = std::env::var("XCC_BENCH_MCS_ONLY").ok();
    let runs = |s: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|x| x.trim() == s))
    };
    let started = Instant::now();
    let mut res = Results {
        convergence: Vec::new(),
        label_path: Vec::new(),
        lag: None,
        peak_mib_per_1000_imports: None,
        steady_mib_per_1000_imports: None,
        label_peak_mib_per_1000_followers: None,
        whole_run_s: 0.0,
    };
    if runs("convergence") {
        for &n in sizes {
            let row = convergence(bin, kc, n, tag).await?;
            eprintln!("  -> {}", serde_json::to_string(&row)?);
            res.convergence.push(row);
        }
    }
    if runs("label") {
        for &n in sizes {
            let row = super::multi::spread(bin, kc, REMOTES, n, true, tag).await?;
            let v = serde_json::to_value(&row)?;
            let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            res.label_path.push(LabelPath {
                services_each: n,
                followers: v["followers"].as_u64().unwrap_or(0) as usize,
                floor_s: f("floor_s"),
                converge_s: f("converge_s"),
                ratio: f("ratio"),
                peak_mib: f("peak_mib"),
                steady_mib: f("steady_mib"),
                row: v,
            });
        }
    }
    if runs("lag") {
        let l = lag(bin, kc, 1000, 50, 20, tag).await?;
        eprintln!(
            "  -> lag p50 {:.1} ms p99 {:.1} ms max {:.1} ms, {} of {} observed, {} writes",
            l.lag.p50_ms, l.lag.p99_ms, l.lag.max_ms, l.lag.observed, l.lag.changes, l.api_writes
        );
        res.lag = Some(l);
    }
    res.peak_mib_per_1000_imports = slope(&res.convergence, |r| r.imports, |r| r.peak_mib);
    res.steady_mib_per_1000_imports = slope(&res.convergence, |r| r.imports, |r| r.steady_mib);
    res.label_peak_mib_per_1000_followers = slope(&res.label_path, |r| r.followers, |r| r.peak_mib);
    res.whole_run_s = started.elapsed().as_secs_f64();
    Ok(res)
}

/// The `## Multi-Cluster Services` section of results.md.
pub fn markdown(res: &Results, sizes: &[usize]) -> String {
    let sizes = sizes
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>()
        .join(",");
    let workers = res
        .convergence
        .first()
        .map(|r| r.workers)
        .or_else(|| default_workers().ok())
        .unwrap_or(0);
    // what the convergence part did, said only when it ran
    let compared = if res.convergence.is_empty() {
        ""
    } else {
        " The daemon's objects were compared with the floor's (first and last key) and are the same."
    };
    let mut md = format!(
        "{SECTION}\n\n`XCC_BENCH_MCS=1{} scripts/bench {sizes}`; each scenario on a fresh bed: west (local; the daemon with `--mcs --local-cluster-name west` and its default {workers} workers) and the remotes east and north, both read from Secrets, each exporting the same N Services from one namespace (a ClusterIP Service, one EndpointSlice of 3 endpoints, a ServiceExport each): N ServiceImports in west, each with a derived Service and one slice per remote. Floor: the daemon's own objects (computed by the pure `desired::mcs` functions its pass calls), written by a plain client with {workers} keys in flight, each key along the daemon's chain (create the ServiceImport, create the derived Service owned by it, update the import with `spec.ips`, create the slices, write `status.clusters`); run before and after the daemon in the same namespace, cleaned between runs; the ratio is against the mean of the two. Both are timed until a watcher on west has seen every ServiceImport with its `ips` and both clusters in `status.clusters`, and every MCS slice.{compared} Writes: the daemon's `xcc_writes_total` (MCS kinds) and the local API server's `apiserver_request_total` (mutating, ServiceImports, Services, EndpointSlices, ServiceExports), read 5 s after convergence; idle: from then until two sweeps have ended (a whole sweep inside; the benchmark's daemons sweep every 20 s, `--sweep-schedule \"*/20 * * * * *\"`). Whole run: {:.0} s.\n",
        std::env::var("XCC_BENCH_MCS_ONLY")
            .map(|o| format!(" XCC_BENCH_MCS_ONLY={o}"))
            .unwrap_or_default(),
        res.whole_run_s
    );
    if !res.convergence.is_empty() {
        md += "\n### Convergence and memory\n\n| exports per remote | imports | MCS slices | floor before (s) | floor after (s) | floor, mean (s) | daemon (s) | ratio | floor writes (API server) | daemon writes, xcc_writes_total (API server) | minimum | idle writes, API server (daemon) | peak RSS (MiB) | steady RSS (MiB) | CPU (s) | load (1 min) at the daemon's start |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in &res.convergence {
            md += &format!(
                "| {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {} ({}) | {} ({}) | {} | {} ({}) in {:.0} s, {} sweeps | {:.1} | {:.1} | {:.2} | {:.1} |\n",
                r.exports_each,
                r.imports,
                r.mcs_slices,
                r.floor_before_s,
                r.floor_after_s,
                r.floor_s,
                r.converge_s,
                r.ratio,
                r.floor_writes,
                r.floor_api_writes,
                r.daemon_writes,
                r.daemon_api_writes,
                r.min_writes,
                r.idle_api_writes,
                r.idle_daemon_writes,
                r.idle_s,
                r.idle_sweeps,
                r.peak_mib,
                r.steady_mib,
                r.cpu_s,
                r.load_1m
            );
        }
        for r in &res.convergence {
            let by: Vec<String> = r
                .daemon_writes_by
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            md += &format!(
                "\nThe daemon's writes at {} exports per remote, by kind and verb: {}.\n",
                r.exports_each,
                by.join(", ")
            );
        }
        if let (Some(p), Some(s), Some(a), Some(b)) = (
            res.peak_mib_per_1000_imports,
            res.steady_mib_per_1000_imports,
            res.convergence.first(),
            res.convergence.last(),
        ) {
            md += &format!(
                "\nMemory: from {} to {} imports, peak RSS {:.1} to {:.1} MiB, steady {:.1} to {:.1} MiB: **{p:.2} MiB per 1,000 more imports at the peak, {s:.2} steady** (each import with a derived Service, two MCS slices and the two remotes' exports, Services and slices behind it).\n",
                a.imports, b.imports, a.peak_mib, b.peak_mib, a.steady_mib, b.steady_mib
            );
        }
    }
    if !res.label_path.is_empty() {
        md += "\n### The label path at the same sizes, same run\n\nThe several-remotes scenario with east and north exporting the same N labelled Services (N followers with 2 slices each; that benchmark's 32 workers and its floor).\n\n| services per remote | followers | floor, mean (s) | daemon (s) | ratio | peak RSS (MiB) | steady RSS (MiB) |\n|---:|---:|---:|---:|---:|---:|---:|\n";
        for r in &res.label_path {
            md += &format!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} |\n",
                r.services_each,
                r.followers,
                r.floor_s,
                r.converge_s,
                r.ratio,
                r.peak_mib,
                r.steady_mib
            );
        }
        if let Some(p) = res.label_peak_mib_per_1000_followers {
            md += &format!("\nLabel path: {p:.2} MiB peak RSS per 1,000 more followers.\n");
        }
    }
    if let Some(l) = &res.lag {
        md += &format!(
            "\n### Propagation lag\n\n{} endpoint changes per second for {} s on east's exported slices (east and north exporting the same {} Services), from just before the remote write to a separate watcher on west seeing the new address in east's MCS slice: {} changes, {} observed ({} not sent, {} not seen within 30 s, not in the percentiles): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {} later than 100 ms. Local MCS writes meanwhile: {} (one slice update per change is the minimum). The machine's 1-minute load average: {:.1} before the changes, {:.1} after.\n",
            l.lag.rate_per_s,
            l.lag.changes / l.lag.rate_per_s.max(1) as usize,
            l.lag.services,
            l.lag.changes,
            l.lag.observed,
            l.lag.failed,
            l.lag.late,
            l.lag.p50_ms,
            l.lag.p99_ms,
            l.lag.max_ms,
            l.over_100ms,
            l.api_writes,
            l.load_1m_before,
            l.load_1m_after
        );
    }
    md
}
