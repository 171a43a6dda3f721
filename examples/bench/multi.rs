//! Scenarios with several remote clusters (`XCC_BENCH_MULTI=1 scripts/bench`), each on a fresh
//! bed of its own (local cluster west, the remotes from [`REMOTES`]). The daemon reads every
//! remote from a Secret (none static), as a fleet with several remotes is run:
//!
//! - **spread**: R remotes exporting N distinct Services each (R x N followers);
//! - **merged**: R remotes exporting the same N Services (N followers with R slices each);
//! - **join/leave**: a remote's Secret applied to a running daemon, then deleted;
//! - **lag**: endpoint changes spread round-robin over R remotes that export the same Services;
//! - **fair**: an honest remote's endpoint changes timed while it is the only one changing, then
//!   beside a churning remote that flips the readiness of every endpoint of its 10,000 Services
//!   as fast as its API server takes it (issue 37, item 7).
//!
//! The floor of a convergence scenario is what the daemon has to write, written directly: a
//! plain client creating the very objects the daemon writes (computed by the daemon's own pure
//! desired state from the leaders the remotes hold: the same labels, annotations and slice
//! ownerReferences), 32 in flight, each slice after its Service (it needs the Service's uid, as
//! the daemon's does), timed like the daemon until the same watch counters see every object.
//! It is measured twice, right before and right after the daemon, and the ratio is against
//! their mean, so load that drifts during a run on a busy machine does not pick a side. Reading
//! the remotes is the daemon's own cost and not in the floor.
//!
//! The floor of earlier runs (plain objects: no annotations, no ownerReferences, and no watch
//! counting them) is still measured, once, before the daemon, and reported beside it.
use std::collections::{BTreeSet, HashMap as Map};
use std::sync::atomic::{AtomicUsize, Ordering};

use cross_cluster_controller::desired::{
    self, EndpointsMode, Export, Follower, Options, set_slice_owner,
};
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;

use super::*;

/// The remotes' cluster (and context) names, in the order the scenarios take them.
const REMOTES: [&str; 5] = ["east", "north", "south", "central", "edge"];

/// Clients of a fresh bed of west and the first `r` remotes: (west, [(name, client)]).
pub(crate) async fn bed_with(kc: &Path, r: usize) -> Res<(Client, Vec<(String, Client)>)> {
    let mut clusters = vec!["west"];
    clusters.extend(&REMOTES[..r]);
    fresh_bed_of(&clusters).await?;
    let mut remotes = Vec::new();
    for name in &REMOTES[..r] {
        remotes.push((name.to_string(), client(kc, name).await?));
    }
    Ok((client(kc, "west").await?, remotes))
}

/// The Secret that makes `remote` a remote of the daemon running in `ns`: the bed's kubeconfig
/// with the remote's context current, labelled as the daemon selects remotes.
fn remote_secret(kc: &Path, remote: &str) -> Res<Secret> {
    let mut k = Kubeconfig::read_from(kc)?;
    k.current_context = Some(remote.to_string());
    let yaml = serde_yaml::to_string(&k)?;
    Ok(serde_json::from_value(json!({
        "metadata": {"name": format!("remote-{remote}"),
                     "labels": {"fair.com/cross-cluster-remote": "true",
                                "fair.com/cross-cluster-name": remote}},
        "stringData": {"kubeconfig": yaml}
    }))?)
}

pub(crate) async fn apply_secret(west: &Client, ns: &str, kc: &Path, remote: &str) -> Res<()> {
    Api::<Secret>::namespaced(west.clone(), ns)
        .create(&PostParams::default(), &remote_secret(kc, remote)?)
        .await?;
    Ok(())
}

/// The daemon with no static remote: every remote comes from a Secret in `ns`.
fn start_secrets_daemon(bin: &Path, kc: &Path, ns: &str, grace_s: u64) -> Res<Proc> {
    let extra: Vec<std::ffi::OsString> = vec![
        "--remote-removal-grace-seconds".into(),
        grace_s.to_string().into(),
    ];
    let log = std::env::temp_dir().join(format!("xcc-bench-{ns}.log"));
    spawn_daemon(bin, kc, ns, &extra, &log)
}

/// Creates `ns` in west and in every remote.
pub(crate) async fn namespaces(west: &Client, remotes: &[(String, Client)], ns: &str) -> Res<()> {
    create_ns(west, ns).await?;
    for (_, c) in remotes {
        create_ns(c, ns).await?;
    }
    Ok(())
}

/// Every remote writes its leaders at once (each remote is its own API server). Distinct:
/// remote `r` names its Services `<r>-svc-<i>`; shared: every remote names them `svc-<i>`.
/// Addresses differ between remotes either way.
async fn write_leaders(
    remotes: &[(String, Client)],
    ns: &str,
    n: usize,
    eps: usize,
    shared: bool,
) -> Res<()> {
    let writes = remotes
        .iter()
        .enumerate()
        .map(|(ri, (name, c))| async move {
            let prefix = if shared {
                "svc".to_string()
            } else {
                format!("{name}-svc")
            };
            let set = Set {
                prefix: &prefix,
                n,
                eps,
                leader: true,
                seed: ri * n,
                slices_each: 1,
            };
            write_set(c, ns, &set).await
        });
    futures::future::try_join_all(writes).await?;
    Ok(())
}

/// One convergence scenario with several remotes.
#[derive(serde::Serialize, Clone)]
pub struct Spread {
    remotes: usize,
    services_each: usize,
    /// every remote exports the same Services (merged followers) rather than its own
    shared: bool,
    endpoints: usize,
    /// local follower Services at convergence
    followers: usize,
    /// local follower EndpointSlices at convergence (one per remote per follower)
    follower_slices: usize,
    /// the mean of the two floors below: the ratio's denominator
    floor_s: f64,
    /// the daemon's objects written directly, right before the daemon ran
    floor_before_s: f64,
    /// ... and right after it stopped
    floor_after_s: f64,
    /// plain objects of the same number (no annotations, no ownerReferences), not watched:
    /// the floor of runs before 2026-11-24
    plain_floor_s: f64,
    converge_s: f64,
    ratio: f64,
    /// converge_s / plain_floor_s
    plain_ratio: f64,
    /// the machine's 1-minute load average when the daemon started
    load_1m: f64,
    peak_mib: f64,
    steady_mib: f64,
    /// peak RSS divided by the thousands of followers
    peak_mib_per_1000: f64,
    cpu_s: f64,
    api_writes: f64,
    /// one write per local object: the minimum
    min_writes: usize,
    /// writes in an idle window that holds a whole sweep, its length and the sweeps it saw
    idle_writes: f64,
    idle_s: f64,
    idle_sweeps: f64,
    /// followers whose origin-clusters annotation names every remote that exports them
    complete_followers: usize,
}

/// The follower Services in `ns` whose `origin-clusters` annotation names `want` remotes.
pub(crate) async fn followers_recording(west: &Client, ns: &str, want: usize) -> Res<usize> {
    let api: Api<Service> = Api::namespaced(west.clone(), ns);
    let lp = kube::api::ListParams::default().labels(&format!("{KEY}=follower"));
    let list = api.list_metadata(&lp).await?;
    Ok(list
        .items
        .iter()
        .filter(|s| {
            s.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("fair.com/cross-cluster-origin-clusters"))
                .is_some_and(|v| v.split(',').filter(|r| !r.is_empty()).count() == want)
        })
        .count())
}

/// The machine's 1-minute load average (the benchmark shares 2 cores with whatever else runs:
/// reported beside the timings it shapes).
pub(crate) fn load_1m() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Watch counters of the follower Services and slices in `ns` (what convergence is timed by).
fn counters(west: &Client, ns: &str) -> (Count, Count) {
    let sel = format!("{KEY}=follower");
    (
        counter::<Service>(west, ns, &sel),
        counter::<EndpointSlice>(west, ns, &sel),
    )
}

/// The cluster id the daemon records for a remote: the uid of its kube-system namespace.
async fn cluster_id(c: &Client) -> Res<String> {
    let ns = Api::<Namespace>::all(c.clone()).get("kube-system").await?;
    ns.uid().ok_or_else(|| "kube-system has no uid".into())
}

/// The followers the daemon is to write for the leaders the remotes hold in `ns`, computed by
/// the daemon's own pure desired state, as a pass computes them for a key with no follower yet
/// (merge, then the origin-clusters annotation the pass adds).
pub(crate) async fn desired_followers(
    remotes: &[(String, Client)],
    ns: &str,
) -> Res<Vec<Follower>> {
    let opts = |cluster_name: String, cluster_id| Options {
        label_key: KEY.into(),
        cluster_name,
        endpoints_mode: EndpointsMode::Slices,
        cluster_id,
        containment: Default::default(),
        allow_external_name: false,
    };
    let lp = kube::api::ListParams::default().labels(&format!("{KEY}=true"));
    let mut held = Vec::new();
    for (name, c) in remotes {
        let o = opts(name.clone(), Some(cluster_id(c).await?));
        let svcs = Api::<Service>::namespaced(c.clone(), ns).list(&lp).await?;
        let mut slices: Map<String, Vec<EndpointSlice>> = Map::new();
        for s in Api::<EndpointSlice>::namespaced(c.clone(), ns)
            .list(&lp)
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
        let svcs: Map<String, Service> =
            svcs.items.into_iter().map(|s| (s.name_any(), s)).collect();
        held.push((o, svcs, slices));
    }
    let local = opts(String::new(), None);
    let names: BTreeSet<&String> = held.iter().flat_map(|(_, svcs, _)| svcs.keys()).collect();
    let mut out = Vec::new();
    for name in names {
        let exports: Vec<Export<'_>> = held
            .iter()
            .filter_map(|(opts, svcs, slices)| {
                Some(Export {
                    opts,
                    exported: svcs.get(name)?,
                    slices: slices
                        .get(name)
                        .map(|v| v.iter().collect())
                        .unwrap_or_default(),
                    stale: false,
                })
            })
            .collect();
        let merged = desired::merge(&exports, &BTreeSet::new(), None, &local);
        let mut f = merged
            .follower
            .ok_or_else(|| format!("no follower for {name}"))?;
        let list = merged
            .contributors
            .iter()
            .cloned()
            .collect::<Vec<_>>()
            .join(",");
        f.service
            .annotations_mut()
            .insert(local.origin_clusters_annotation(), list);
        out.push(f);
    }
    Ok(out)
}

/// Fails unless the first and the last desired follower match what the daemon wrote (labels,
/// annotations, ports; each slice's labels, annotations, endpoints and owner): the floor
/// writes the daemon's objects, not lighter ones. With `XCC_BENCH_BINARY` (another build,
/// e.g. an older commit's, whose objects may differ by design) a difference is printed, not
/// an error: the floor writes this tree's objects.
pub(crate) async fn same_as_written(west: &Client, ns: &str, want: &[Follower]) -> Res<()> {
    match compare_written(west, ns, want).await {
        Err(e) if std::env::var_os("XCC_BENCH_BINARY").is_some() => {
            eprintln!("  (XCC_BENCH_BINARY: {e}; the floor writes this tree's objects)");
            Ok(())
        }
        other => other,
    }
}

async fn compare_written(west: &Client, ns: &str, want: &[Follower]) -> Res<()> {
    for f in [want.first(), want.last()].into_iter().flatten() {
        let name = f.service.name_any();
        let live = Api::<Service>::namespaced(west.clone(), ns)
            .get(&name)
            .await?;
        let spec = |s: &Service| s.spec.as_ref().map(|s| s.ports.clone());
        if live.labels() != f.service.labels()
            || live.annotations() != f.service.annotations()
            || spec(&live) != spec(&f.service)
        {
            return Err(format!("the floor's Service {name} differs from the daemon's").into());
        }
        for want_slice in &f.slices {
            let s = want_slice.name_any();
            let live = Api::<EndpointSlice>::namespaced(west.clone(), ns)
                .get(&s)
                .await?;
            let owners = |o: &EndpointSlice| o.owner_references().len();
            let differs = [
                ("labels", live.labels() != want_slice.labels()),
                (
                    "annotations",
                    live.annotations() != want_slice.annotations(),
                ),
                ("endpoints", live.endpoints != want_slice.endpoints),
                ("owners", owners(&live) != 1),
            ];
            let what: Vec<&str> = differs.iter().filter(|d| d.1).map(|d| d.0).collect();
            if !what.is_empty() {
                return Err(format!(
                    "the floor's slice {s} differs from the daemon's ({})",
                    what.join(", ")
                )
                .into());
            }
        }
    }
    Ok(())
}

/// The floor: these followers written into `ns` directly (32 in flight, each slice after its
/// Service, owned by it), timed until the watch counters see them all.
pub(crate) async fn floor(west: &Client, ns: &str, want: &[Follower]) -> Res<f64> {
    floor_of(west, ns, want, Anatomy::default()).await
}

/// What a floor measurement leaves out, to see what each part of the floor costs
/// (`XCC_BENCH_FLOOR_ANATOMY=1`).
#[derive(Clone, Copy, Default)]
struct Anatomy {
    /// slices without their ownerReference (no garbage-collector work)
    no_owners: bool,
    /// no watch counting the objects: timed until the last write is answered
    unwatched: bool,
}

async fn floor_of(west: &Client, ns: &str, want: &[Follower], a: Anatomy) -> Res<f64> {
    let pp = PostParams {
        field_manager: Some(cross_cluster_controller::reconcile::writer::FIELD_MANAGER.into()),
        ..Default::default()
    };
    let (svcs, slices) = (
        Api::<Service>::namespaced(west.clone(), ns),
        Api::<EndpointSlice>::namespaced(west.clone(), ns),
    );
    let mut seen = if a.unwatched {
        None
    } else {
        let (mut svcs, mut slices) = counters(west, ns);
        // the counters list first (an empty namespace), as the daemon's run starts them
        svcs.wait_for(Option::is_some).await?;
        slices.wait_for(Option::is_some).await?;
        Some((svcs, slices))
    };
    let start = Instant::now();
    stream::iter(want)
        .map(|f| {
            let (svcs, slices, pp) = (svcs.clone(), slices.clone(), pp.clone());
            async move {
                let mut svc = f.service.clone();
                svc.metadata.namespace = Some(ns.to_string());
                let created = svcs.create(&pp, &svc).await?;
                let mut own = f.slices.clone();
                if !a.no_owners {
                    let uid = created.uid().unwrap_or_default();
                    set_slice_owner(&mut own, &created.name_any(), &uid);
                }
                for mut s in own {
                    s.metadata.namespace = Some(ns.to_string());
                    slices.create(&pp, &s).await?;
                }
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(PARALLEL)
        .try_collect::<Vec<_>>()
        .await?;
    if let Some((svcs, slices)) = seen.as_mut() {
        let n_slices = want.iter().map(|f| f.slices.len()).sum();
        reach(svcs, want.len(), slices, n_slices, Duration::from_secs(900)).await?;
    }
    Ok(start.elapsed().as_secs_f64())
}

/// R remotes x N Services each, distinct or shared; the daemon starts with every remote's
/// Secret in place and is timed from its start to the last follower object.
pub async fn spread(
    bin: &Path,
    kc: &Path,
    r: usize,
    n: usize,
    shared: bool,
    tag: &str,
) -> Res<Spread> {
    let eps = 3;
    let what = if shared { "merged" } else { "spread" };
    let label = format!("[{what} {r} x {n}]");
    let (west, remotes) = bed_with(kc, r).await?;
    let ns = format!("bench-{what}-{tag}-{r}-{n}");
    namespaces(&west, &remotes, &ns).await?;
    for suffix in ["plain", "floor-a", "floor-b"] {
        create_ns(&west, &format!("{ns}-{suffix}")).await?;
    }
    eprintln!("{label} remote setup");
    write_leaders(&remotes, &ns, n, eps, shared).await?;
    let (followers, slices_each) = if shared { (n, r) } else { (r * n, 1) };
    let follower_slices = followers * slices_each;
    eprintln!("{label} plain floor: {followers} Services, {slices_each} slice(s) each");
    let plain_set = Set {
        prefix: "other",
        n: followers,
        eps,
        leader: false,
        seed: 0,
        slices_each,
    };
    let plain_floor = write_set(&west, &format!("{ns}-plain"), &plain_set).await?;
    let want = desired_followers(&remotes, &ns).await?;
    if want.len() != followers
        || want.iter().map(|f| f.slices.len()).sum::<usize>() != follower_slices
    {
        return Err(format!(
            "{label} the desired state has {} followers, not {followers}",
            want.len()
        )
        .into());
    }
    let floor_before = floor(&west, &format!("{ns}-floor-a"), &want).await?;
    eprintln!(
        "{label} floor before the daemon: {floor_before:.2}s (plain objects: {plain_floor:.2}s)"
    );
    for (name, _) in &remotes {
        apply_secret(&west, &ns, kc, name).await?;
    }
    let writes_before = api_writes(&west).await?;
    let load = load_1m();
    let mut proc = start_secrets_daemon(bin, kc, &ns, 30)?;
    let start = Instant::now();
    let (mut svcs, mut slices) = counters(&west, &ns);
    let limit = Duration::from_secs(900);
    reach(&mut svcs, followers, &mut slices, follower_slices, limit).await?;
    let converge = start.elapsed().as_secs_f64();
    let writes = api_writes(&west).await? - writes_before;
    eprintln!("{label} converged in {converge:.2}s; idle period");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle = idle_window(proc.port, || api_writes(&west)).await?;
    let (peak, steady, cpu) = proc.stat()?;
    let complete = followers_recording(&west, &ns, if shared { r } else { 1 }).await?;
    drop(proc);
    same_as_written(&west, &ns, &want).await?;
    let floor_after = floor(&west, &format!("{ns}-floor-b"), &want).await?;
    let floor_s = (floor_before + floor_after) / 2.0;
    if std::env::var("XCC_BENCH_FLOOR_ANATOMY").as_deref() == Ok("1") {
        for (part, a) in [
            (
                "unwatched",
                Anatomy {
                    no_owners: false,
                    unwatched: true,
                },
            ),
            (
                "no ownerReferences",
                Anatomy {
                    no_owners: true,
                    unwatched: false,
                },
            ),
            (
                "neither",
                Anatomy {
                    no_owners: true,
                    unwatched: true,
                },
            ),
        ] {
            let part_ns = format!("{ns}-{}", part.replace(' ', "-").to_lowercase());
            create_ns(&west, &part_ns).await?;
            let t = floor_of(&west, &part_ns, &want, a).await?;
            eprintln!("{label} floor anatomy: the daemon's objects, {part}: {t:.2}s");
        }
    }
    eprintln!(
        "{label} floor after the daemon: {floor_after:.2}s; ratio {:.2}",
        converge / floor_s
    );
    Ok(Spread {
        remotes: r,
        services_each: n,
        shared,
        endpoints: eps,
        followers,
        follower_slices,
        floor_s,
        floor_before_s: floor_before,
        floor_after_s: floor_after,
        plain_floor_s: plain_floor,
        converge_s: converge,
        ratio: converge / floor_s,
        plain_ratio: converge / plain_floor,
        load_1m: load,
        peak_mib: peak,
        steady_mib: steady,
        peak_mib_per_1000: peak / (followers as f64 / 1000.0),
        cpu_s: cpu,
        api_writes: writes,
        min_writes: followers + follower_slices,
        idle_writes: idle.writes,
        idle_s: idle.seconds,
        idle_sweeps: idle.sweeps,
        complete_followers: complete,
    })
}

#[derive(serde::Serialize)]
pub struct JoinLeave {
    /// Services the remote the daemon converged on exports
    base_services: usize,
    /// Services the joining remote exports
    joining_services: usize,
    /// `--remote-removal-grace-seconds`
    grace_s: u64,
    /// from the Secret's create request sent to the first follower of the joining remote
    first_follower_s: f64,
    /// ... to every follower Service and slice of the joining remote
    all_followers_s: f64,
    /// from the Secret's delete request sent to no follower Service or slice of it left
    clean_s: f64,
    /// the fewest followers of the base remote (Services, slices) seen from its convergence to
    /// the end: the base remote's are never to be touched
    base_min_services: usize,
    base_min_slices: usize,
    peak_mib: f64,
}

/// Watches a counter and keeps the lowest value it shows from now on.
fn lowest(mut c: Count) -> Arc<AtomicUsize> {
    let low = Arc::new(AtomicUsize::new(now(&c)));
    let out = Arc::clone(&low);
    tokio::spawn(async move {
        while c.changed().await.is_ok() {
            let v = now(&c);
            low.fetch_min(v, Ordering::SeqCst);
        }
    });
    out
}

/// Waits until the counter drops to zero.
async fn reach_zero(c: &mut Count, limit: Duration) -> Res<()> {
    let waited = tokio::time::timeout(limit, c.wait_for(|v| *v == Some(0)))
        .await
        .map(|r| r.map(|_| ()));
    match waited {
        Ok(r) => Ok(r?),
        Err(_) => Err(format!("{} objects still there after {limit:?}", now(c)).into()),
    }
}

/// The daemon runs and has converged on east (N Services); north (N other Services) joins by
/// its Secret, then leaves by its deletion.
pub async fn join_leave(
    bin: &Path,
    kc: &Path,
    n: usize,
    grace_s: u64,
    tag: &str,
) -> Res<JoinLeave> {
    let (west, remotes) = bed_with(kc, 2).await?;
    let ns = format!("bench-join-{tag}-{n}");
    namespaces(&west, &remotes, &ns).await?;
    eprintln!("[join/leave {n}] remote setup");
    write_leaders(&remotes, &ns, n, 3, false).await?;
    let (base, joining) = (&remotes[0].0, &remotes[1].0);
    apply_secret(&west, &ns, kc, base).await?;
    let mut proc = start_secrets_daemon(bin, kc, &ns, grace_s)?;
    let sel = format!("{KEY}=follower");
    let of = |remote: &str| format!("{sel},fair.com/cross-cluster-origin-cluster={remote}");
    fn east(name: &str) -> bool {
        name.starts_with("east-svc-")
    }
    fn north(name: &str) -> bool {
        name.starts_with("north-svc-")
    }
    let (mut base_svcs, mut base_slices) = (
        counter_where::<Service>(&west, &ns, &sel, east),
        counter::<EndpointSlice>(&west, &ns, &of(base)),
    );
    let limit = Duration::from_secs(600);
    both_reach(&mut base_svcs, &mut base_slices, n, limit).await?;
    // the queue drains (passes caused by our own writes) before the join
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (low_svcs, low_slices) = (lowest(base_svcs.clone()), lowest(base_slices.clone()));
    let (mut svcs, mut slices) = (
        counter_where::<Service>(&west, &ns, &sel, north),
        counter::<EndpointSlice>(&west, &ns, &of(joining)),
    );
    // both counters have listed (nothing of north yet) before the clock starts
    reach(&mut svcs, 0, &mut slices, 0, limit).await?;
    eprintln!("[join/leave {n}] {joining} joins");
    let start = Instant::now();
    apply_secret(&west, &ns, kc, joining).await?;
    tokio::time::timeout(limit, svcs.wait_for(|v| v.is_some_and(|v| v >= 1))).await??;
    let first = start.elapsed().as_secs_f64();
    both_reach(&mut svcs, &mut slices, n, limit).await?;
    let all = start.elapsed().as_secs_f64();
    eprintln!(
        "[join/leave {n}] joined: first follower {first:.2}s, all {all:.2}s; quiet, then {joining} leaves"
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    let start = Instant::now();
    Api::<Secret>::namespaced(west.clone(), &ns)
        .delete(&format!("remote-{joining}"), &Default::default())
        .await?;
    reach_zero(&mut svcs, limit).await?;
    reach_zero(&mut slices, limit).await?;
    let clean = start.elapsed().as_secs_f64();
    eprintln!("[join/leave {n}] clean {clean:.2}s after the Secret's deletion (grace {grace_s}s)");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (peak, _, _) = proc.stat()?;
    drop(proc);
    Ok(JoinLeave {
        base_services: n,
        joining_services: n,
        grace_s,
        first_follower_s: first,
        all_followers_s: all,
        clean_s: clean,
        base_min_services: low_svcs.load(Ordering::SeqCst),
        base_min_slices: low_slices.load(Ordering::SeqCst),
        peak_mib: peak,
    })
}

#[derive(serde::Serialize)]
pub struct MultiLag {
    remotes: usize,
    #[serde(flatten)]
    lag: Lag,
    /// Service and EndpointSlice writes on the local API server from the first change to 3 s
    /// after the last (one slice update per change is the minimum)
    api_writes: f64,
    /// changes seen later than 100 ms
    over_100ms: usize,
    /// the machine's 1-minute load average right before and right after the changes
    load_1m_before: f64,
    load_1m_after: f64,
}

/// R remotes export the same N Services (merged followers); endpoint changes at a fixed total
/// rate go round-robin to the remotes, each to one remote slice; a separate watcher on the
/// local cluster times each new address's arrival in a follower slice.
pub async fn lag_multi(
    bin: &Path,
    kc: &Path,
    r: usize,
    n: usize,
    rate: u32,
    secs: u64,
    tag: &str,
) -> Res<MultiLag> {
    let (west, remotes) = bed_with(kc, r).await?;
    let ns = format!("bench-mlag-{tag}-{n}");
    namespaces(&west, &remotes, &ns).await?;
    write_leaders(&remotes, &ns, n, 3, true).await?;
    for (name, _) in &remotes {
        apply_secret(&west, &ns, kc, name).await?;
    }
    let proc = start_secrets_daemon(bin, kc, &ns, 30)?;
    let sel = format!("{KEY}=follower");
    let (mut svcs, mut slices) = (
        counter::<Service>(&west, &ns, &sel),
        counter::<EndpointSlice>(&west, &ns, &sel),
    );
    reach(&mut svcs, n, &mut slices, n * r, Duration::from_secs(600)).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let targets: Vec<(Api<EndpointSlice>, usize)> = remotes
        .iter()
        .enumerate()
        .map(|(ri, (_, c))| (Api::namespaced(c.clone(), &ns), ri * n))
        .collect();
    let before = api_writes(&west).await?;
    let load_before = load_1m();
    let lag = churn(&west, &ns, &sel, &targets, n, rate, secs).await?;
    let load_after = load_1m();
    let writes = api_writes(&west).await? - before;
    drop(proc);
    Ok(MultiLag {
        load_1m_before: load_before,
        load_1m_after: load_after,
        remotes: r,
        over_100ms: lag.samples_ms.iter().filter(|v| **v > 100.0).count(),
        lag,
        api_writes: writes,
    })
}

#[derive(serde::Serialize)]
pub struct Fair {
    /// the churning remote's Services (3 endpoints each)
    churn_services: usize,
    /// the honest remote's Services
    honest_services: usize,
    /// the honest remote's changes timed while no other remote changes anything
    quiet: Lag,
    /// the same, while the churning remote flips its endpoints
    churned: Lag,
    /// changes seen later than 100 ms, quiet and churned
    quiet_over_100ms: usize,
    churned_over_100ms: usize,
    /// the churning remote's slice writes per second meanwhile (what its API server took)
    churn_writes_per_s: f64,
    /// in the daemon (its propagation-lag histogram: north's change seen to its write done),
    /// quiet and churned: p50 and p99 as bucket bounds, and the mean (ms)
    daemon_quiet: [f64; 3],
    daemon_churned: [f64; 3],
    /// the daemon's EndpointSlice writes, mean duration (ms), quiet and churned
    slice_write_quiet_ms: f64,
    slice_write_churned_ms: f64,
    /// local Service and EndpointSlice writes per second while churned
    local_writes_per_s: f64,
    load_1m_before: f64,
    load_1m_after: f64,
}

/// Flips the readiness of every endpoint of the churning remote's slices (`churn-<i>-abcde`),
/// one slice after another, 32 writes in flight, until `stop`; returns the writes that landed.
async fn flip_endpoints(
    slices: Api<EndpointSlice>,
    n: usize,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> usize {
    let landed = Arc::new(AtomicUsize::new(0));
    let mut round = 0usize;
    while !stop.load(Ordering::SeqCst) {
        let flips = stream::iter(0..n)
            .take_while(|_| std::future::ready(!stop.load(Ordering::SeqCst)))
            .map(|i| {
                let (slices, landed) = (slices.clone(), Arc::clone(&landed));
                async move {
                    let name = format!("churn-{i}-abcde");
                    let Ok(mut cur) = slices.get(&name).await else {
                        return;
                    };
                    for e in &mut cur.endpoints {
                        let c = e.conditions.get_or_insert_with(Default::default);
                        c.ready = Some(round % 2 == 1);
                    }
                    if slices
                        .replace(&name, &PostParams::default(), &cur)
                        .await
                        .is_ok()
                    {
                        landed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            })
            .buffer_unordered(PARALLEL);
        flips.collect::<Vec<()>>().await;
        round += 1;
    }
    landed.load(Ordering::SeqCst)
}

/// The honest remote (north, `n` Services) timed quiet, then beside the churning one (east,
/// `churn` Services, every endpoint flipped continuously): endpoint changes at `rate` a second
/// for `secs` each time, a separate watcher on the local cluster timing each.
pub async fn fair(
    bin: &Path,
    kc: &Path,
    churn: usize,
    n: usize,
    rate: u32,
    secs: u64,
    tag: &str,
) -> Res<Fair> {
    let (west, remotes) = bed_with(kc, 2).await?;
    let ns = format!("bench-fair-{tag}-{churn}");
    namespaces(&west, &remotes, &ns).await?;
    let (east, north) = (&remotes[0].1, &remotes[1].1);
    let churner = Set {
        prefix: "churn",
        n: churn,
        eps: 3,
        leader: true,
        seed: 0,
        slices_each: 1,
    };
    let honest = Set {
        prefix: "svc",
        n,
        eps: 3,
        leader: true,
        seed: churn,
        slices_each: 1,
    };
    futures::future::try_join(
        write_set(east, &ns, &churner),
        write_set(north, &ns, &honest),
    )
    .await?;
    for (name, _) in &remotes {
        apply_secret(&west, &ns, kc, name).await?;
    }
    let proc = start_secrets_daemon(bin, kc, &ns, 30)?;
    let sel = format!("{KEY}=follower");
    let (mut svcs, mut slices) = (
        counter::<Service>(&west, &ns, &sel),
        counter::<EndpointSlice>(&west, &ns, &sel),
    );
    let all = churn + n;
    reach(&mut svcs, all, &mut slices, all, Duration::from_secs(900)).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let targets = [(Api::namespaced(north.clone(), &ns), churn)];
    let load_before = load_1m();
    let inside = |port| async move {
        let lag = Histo::read(port, "xcc_propagation_lag_seconds", "remote=\"north\"");
        let write = Histo::read(port, "xcc_write_duration_seconds", "kind=\"EndpointSlice\"");
        Res::Ok((lag.await.unwrap_or_default(), write.await?))
    };
    let summary = |h: &Histo| [h.bound_ms(0.5), h.bound_ms(0.99), h.mean_ms()];
    let at_start = inside(proc.port).await?;
    let quiet = super::churn(&west, &ns, &sel, &targets, n, rate, secs).await?;
    let after_quiet = inside(proc.port).await?;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flipping = tokio::spawn(flip_endpoints(
        Api::namespaced(east.clone(), &ns),
        churn,
        Arc::clone(&stop),
    ));
    // the churn has filled the daemon's queue before the first honest change is timed
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (writes_before, started) = (api_writes(&west).await?, Instant::now());
    let churned = super::churn(&west, &ns, &sel, &targets, n, rate, secs).await?;
    let local = (api_writes(&west).await? - writes_before) / started.elapsed().as_secs_f64();
    let after_churn = inside(proc.port).await?;
    stop.store(true, Ordering::SeqCst);
    let flipped = flipping.await?;
    let load_after = load_1m();
    drop(proc);
    let over = |l: &Lag| l.samples_ms.iter().filter(|v| **v > 100.0).count();
    Ok(Fair {
        churn_services: churn,
        honest_services: n,
        quiet_over_100ms: over(&quiet),
        churned_over_100ms: over(&churned),
        quiet,
        churned,
        churn_writes_per_s: flipped as f64 / (started.elapsed().as_secs_f64() + 10.0),
        daemon_quiet: summary(&after_quiet.0.since(&at_start.0)),
        daemon_churned: summary(&after_churn.0.since(&after_quiet.0)),
        slice_write_quiet_ms: after_quiet.1.since(&at_start.1).mean_ms(),
        slice_write_churned_ms: after_churn.1.since(&after_quiet.1).mean_ms(),
        local_writes_per_s: local,
        load_1m_before: load_before,
        load_1m_after: load_after,
    })
}

/// Results of one multi-remote run.
#[derive(serde::Serialize)]
pub struct Results {
    spread: Vec<Spread>,
    merged: Vec<Spread>,
    join_leave: Option<JoinLeave>,
    lag: Option<MultiLag>,
    fair: Option<Fair>,
    whole_run_s: f64,
}

/// The `## Several remotes` section of results.md.
pub fn markdown(res: &Results, sizes: &[usize], n: usize) -> String {
    let mut md = String::from(SECTION);
    md += &format!(
        "\n\n`XCC_BENCH_MULTI=1{} scripts/bench {}` with `XCC_BENCH_MULTI_N={n}`; each scenario on a fresh bed (local cluster west; its remotes the first of {}), the daemon reading every remote from a Secret (none static), 32 workers, 3 endpoints per slice. Floor: a plain client writing the very objects the daemon writes (the daemon's own desired state: same labels, annotations and slice ownerReferences; 32 in flight, each slice after its Service), timed like the daemon until the same watch counters see them all; measured right before and right after the daemon, the ratio against the mean of the two. The plain-object floor is the floor of earlier runs: as many plain Services and slices (no annotations, no ownerReferences, no watch counting them), once before the daemon. Whole run: {:.0} s.\n",
        std::env::var("XCC_BENCH_MULTI_ONLY")
            .map(|o| format!(" XCC_BENCH_MULTI_ONLY={o}"))
            .unwrap_or_default(),
        sizes
            .iter()
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
            .join(","),
        REMOTES.join(", "),
        res.whole_run_s
    );
    let table = |rows: &[Spread]| {
        let mut t = String::from(
            "\n| remotes | services each | followers | follower slices | floor before (s) | floor after (s) | floor, mean (s) | daemon (s) | ratio | plain-object floor (s) | daemon / plain-object floor | peak RSS (MiB) | steady RSS (MiB) | peak RSS per 1,000 followers (MiB) | CPU (s) | API writes (minimum) | idle writes (window, sweeps in it) | followers recording every exporting remote | load (1 min) at the daemon's start |\n|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in rows {
            t += &format!(
                "| {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} | {:.1} | {:.1} | {:.2} | {:.2} | {} ({}) | {} ({:.0} s, {}) | {} of {} | {:.1} |\n",
                r.remotes,
                r.services_each,
                r.followers,
                r.follower_slices,
                r.floor_before_s,
                r.floor_after_s,
                r.floor_s,
                r.converge_s,
                r.ratio,
                r.plain_floor_s,
                r.plain_ratio,
                r.peak_mib,
                r.steady_mib,
                r.peak_mib_per_1000,
                r.cpu_s,
                r.api_writes,
                r.min_writes,
                r.idle_writes,
                r.idle_s,
                r.idle_sweeps,
                r.complete_followers,
                r.followers,
                r.load_1m
            );
        }
        t
    };
    if !res.spread.is_empty() {
        md += "\n### Distinct Services on each remote\n";
        md += &table(&res.spread);
        if let (Some(a), Some(b)) = (res.spread.first(), res.spread.last())
            && b.followers > a.followers
        {
            let slope = (b.peak_mib - a.peak_mib) / ((b.followers - a.followers) as f64 / 1000.0);
            md += &format!(
                "\nFrom {} to {} followers peak RSS grew {:.1} MiB: {slope:.2} MiB per 1,000 more followers (each with one slice).\n",
                a.followers,
                b.followers,
                b.peak_mib - a.peak_mib
            );
        }
    }
    if !res.merged.is_empty() {
        md += "\n### The same Services on every remote (merged followers)\n";
        md += &table(&res.merged);
    }
    if let Some(j) = &res.join_leave {
        md += &format!(
            "\n### Join and leave\n\nThe daemon converged on east ({} Services); north ({} other Services) joins by its Secret, then leaves by its deletion, `--remote-removal-grace-seconds {}`.\n\n| Secret applied -> first follower (s) | -> all followers (s) | Secret deleted -> none left (s) | east's followers, fewest seen (Services, slices) | peak RSS (MiB) |\n|---:|---:|---:|---:|---:|\n| {:.2} | {:.2} | {:.2} | {}, {} of {} | {:.1} |\n",
            j.base_services,
            j.joining_services,
            j.grace_s,
            j.first_follower_s,
            j.all_followers_s,
            j.clean_s,
            j.base_min_services,
            j.base_min_slices,
            j.base_services,
            j.peak_mib
        );
    }
    if let Some(l) = &res.lag {
        md += &format!(
            "\n### Propagation lag, changes spread over {} remotes\n\n{} endpoint changes per second in total, round-robin over {} remotes exporting the same {} Services (merged followers), {} changes, {} observed ({} not sent, {} not seen within 30 s, not in the percentiles) by a separate watcher on the local cluster: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms, {} later than 100 ms. Local Service and EndpointSlice writes meanwhile: {} (one per change is the minimum). The machine's 1-minute load average: {:.1} before the changes, {:.1} after.\n",
            l.remotes,
            l.lag.rate_per_s,
            l.remotes,
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
    if let Some(f) = &res.fair {
        md += &format!(
            "\n### Fairness: an honest remote beside a churning one\n\nOne daemon reading two remotes: east exports {} Services (3 endpoints each) and flips the readiness of every endpoint, slice after slice, 32 writes in flight, as fast as its API server takes it ({:.0} slice writes a second); north exports {} Services and changes an endpoint {} times a second for {} s, each change timed by a separate watcher on the local cluster until it is in a follower slice. The floor is the same north changes in the same run with east quiet. The daemon runs 32 workers with its default `--workers-per-remote` (4 since issue 37). In the daemon: its propagation-lag histogram for north (from the change seen by its watch to its write done; p50 and p99 are the bounds of the histogram's buckets, which double from 1 ms) and the mean duration of its EndpointSlice writes to the local API server, over the same window.\n\n| north's changes | observed | p50 (ms) | p99 (ms) | max (ms) | later than 100 ms | local writes a second | in the daemon: p50 at most (ms) | p99 at most (ms) | mean (ms) | the daemon's slice writes, mean (ms) |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n| east quiet (floor) | {} of {} | {:.1} | {:.1} | {:.1} | {} | | {:.0} | {:.0} | {:.1} | {:.1} |\n| east churning | {} of {} | {:.1} | {:.1} | {:.1} | {} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |\n\nThe machine's 1-minute load average: {:.1} before, {:.1} after.\n",
            f.churn_services,
            f.churn_writes_per_s,
            f.honest_services,
            f.quiet.rate_per_s,
            f.quiet.changes / f.quiet.rate_per_s.max(1) as usize,
            f.quiet.observed,
            f.quiet.changes,
            f.quiet.p50_ms,
            f.quiet.p99_ms,
            f.quiet.max_ms,
            f.quiet_over_100ms,
            f.daemon_quiet[0],
            f.daemon_quiet[1],
            f.daemon_quiet[2],
            f.slice_write_quiet_ms,
            f.churned.observed,
            f.churned.changes,
            f.churned.p50_ms,
            f.churned.p99_ms,
            f.churned.max_ms,
            f.churned_over_100ms,
            f.local_writes_per_s,
            f.daemon_churned[0],
            f.daemon_churned[1],
            f.daemon_churned[2],
            f.slice_write_churned_ms,
            f.load_1m_before,
            f.load_1m_after
        );
        md += &format!(
            "\nGoal (issue 37, item 7): north's p99 beside the churn under 100 ms: {} ({:.1} ms).\n",
            if f.churned.p99_ms < 100.0 {
                "met"
            } else {
                "not met"
            },
            f.churned.p99_ms
        );
    }
    md
}

/// The heading that starts the multi-remote section of results.md.
pub const SECTION: &str = "## Several remotes";

/// Runs the multi-remote scenarios: spread at each per-remote size (5 remotes), then merged,
/// join/leave and lag at `n` Services per remote; `XCC_BENCH_MULTI_ONLY` (comma-separated:
/// spread, merged, join, lag) runs only those named.
pub async fn run(bin: &Path, kc: &Path, sizes: &[usize], n: usize, tag: &str) -> Res<Results> {
    let only = std::env::var("XCC_BENCH_MULTI_ONLY").ok();
    let runs = |s: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|x| x.trim() == s))
    };
    let started = Instant::now();
    let mut res = Results {
        spread: Vec::new(),
        merged: Vec::new(),
        join_leave: None,
        lag: None,
        fair: None,
        whole_run_s: 0.0,
    };
    if runs("spread") {
        for &size in sizes {
            let row = spread(bin, kc, 5, size, false, tag).await?;
            eprintln!("  -> {}", serde_json::to_string(&row)?);
            res.spread.push(row);
        }
    }
    if runs("merged") {
        let row = spread(bin, kc, 3, n, true, tag).await?;
        eprintln!("  -> {}", serde_json::to_string(&row)?);
        res.merged.push(row);
    }
    if runs("join") {
        let j = join_leave(bin, kc, n, 0, tag).await?;
        eprintln!("  -> {}", serde_json::to_string(&j)?);
        res.join_leave = Some(j);
    }
    if runs("lag") {
        let l = lag_multi(bin, kc, 3, n, 50, 20, tag).await?;
        eprintln!(
            "  -> lag p50 {:.1} ms p99 {:.1} ms max {:.1} ms, {} of {} observed, {} over 100 ms, {} writes, load {:.1} -> {:.1}",
            l.lag.p50_ms,
            l.lag.p99_ms,
            l.lag.max_ms,
            l.lag.observed,
            l.lag.changes,
            l.over_100ms,
            l.api_writes,
            l.load_1m_before,
            l.load_1m_after
        );
        res.lag = Some(l);
    }
    if runs("fair") {
        let f = fair(bin, kc, 10_000, 100, 10, 30, tag).await?;
        eprintln!(
            "  -> fair: quiet p50 {:.1} p99 {:.1} max {:.1} ms; beside the churn p50 {:.1} p99 {:.1} max {:.1} ms ({} of {} observed, {} over 100 ms); churn {:.0} writes/s, local {:.0} writes/s, load {:.1} -> {:.1}",
            f.quiet.p50_ms,
            f.quiet.p99_ms,
            f.quiet.max_ms,
            f.churned.p50_ms,
            f.churned.p99_ms,
            f.churned.max_ms,
            f.churned.observed,
            f.churned.changes,
            f.churned_over_100ms,
            f.churn_writes_per_s,
            f.local_writes_per_s,
            f.load_1m_before,
            f.load_1m_after
        );
        eprintln!(
            "  -> fair, in the daemon (p50 <=, p99 <=, mean ms): quiet {:?}, churned {:?}; slice writes mean {:.1} ms quiet, {:.1} ms churned",
            f.daemon_quiet, f.daemon_churned, f.slice_write_quiet_ms, f.slice_write_churned_ms
        );
        res.fair = Some(f);
    }
    res.whole_run_s = started.elapsed().as_secs_f64();
    Ok(res)
}

/// One histogram series of the daemon's /metrics (`name` with labels containing `labels`):
/// the cumulative count at each bucket bound (seconds), the sum and the count.
#[derive(Clone, Default)]
pub struct Histo {
    buckets: Vec<(f64, f64)>,
    sum: f64,
    count: f64,
}

impl Histo {
    /// The series of `name` whose labels contain `labels` (summed over the series that do).
    pub async fn read(port: u16, name: &str, labels: &str) -> Res<Histo> {
        let text = daemon_metrics(port).await?;
        let mut h = Histo::default();
        let mut bounds: Map<String, f64> = Map::new();
        for line in text.lines().filter(|l| l.contains(labels)) {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(v) = value.parse::<f64>() else {
                continue;
            };
            if series.starts_with(&format!("{name}_bucket{{")) {
                let le = series
                    .split("le=\"")
                    .nth(1)
                    .and_then(|s| s.split('"').next())
                    .ok_or("a bucket without le")?;
                *bounds.entry(le.to_string()).or_default() += v;
            } else if series.starts_with(&format!("{name}_sum{{")) {
                h.sum += v;
            } else if series.starts_with(&format!("{name}_count{{")) {
                h.count += v;
            }
        }
        if h.count == 0.0 && bounds.is_empty() {
            return Err(
                format!("no series {name}{{..{labels}..}} in the daemon's /metrics").into(),
            );
        }
        h.buckets = bounds
            .into_iter()
            .map(|(le, c)| (le.parse().unwrap_or(f64::INFINITY), c))
            .collect();
        h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(h)
    }

    /// What was observed between `before` and `self`.
    pub fn since(&self, before: &Histo) -> Histo {
        let at = |le: f64| {
            before
                .buckets
                .iter()
                .find(|b| b.0 == le)
                .map_or(0.0, |b| b.1)
        };
        Histo {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, c - at(*le)))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    pub fn mean_ms(&self) -> f64 {
        if self.count > 0.0 {
            self.sum / self.count * 1000.0
        } else {
            f64::NAN
        }
    }

    /// The bound (ms) of the first bucket holding the share `q` of the observations: the
    /// quantile is at most this.
    pub fn bound_ms(&self, q: f64) -> f64 {
        let want = q * self.count;
        self.buckets
            .iter()
            .find(|(_, c)| *c >= want)
            .map_or(f64::NAN, |(le, _)| le * 1000.0)
    }
}
