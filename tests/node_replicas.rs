//! Two replicas of the chart as pods, one per node: cluster `pair` of the bed has two nodes
//! (`testbed/bed node pair 2`: pair-node at 127.0.0.1, pair-node-2 at 127.0.0.2). helm installs
//! the chart with its default replicaCount 2 and PodDisruptionBudget; with hostNetwork each pod
//! binds its admin port on its own node's address (`adminBindPodIP`). One install serves every
//! case, in order:
//!
//! - two replicas Ready through the chart's probes, exactly one writing: the Lease holder is one
//!   of the pods, whose `xcc_leader` is 1; the other's is 0 and it has written nothing;
//! - the leader pod deleted while the standby runs;
//! - `helm upgrade` with a changed value (both pods replaced, one at a time);
//! - `kubectl drain` of the leader's node against the chart's PodDisruptionBudget, and a second
//!   eviction refused while the evicted pod's replacement is not Ready.
//!
//! In each handover east changes the slice of a leader every 0.2 s; watches on the Lease, the
//! pods and the follower's slices timestamp what happens. The takeover is the time from the
//! leader pod's deletion (the request when the test deletes it, else the watch seeing it marked
//! for deletion) to another pod holding the Lease; the write gap is the longest time between two
//! successive updates of the follower's slice (the old leader's last write to the new leader's
//! first), as the watch saw them. No follower may be deleted or re-created: their uids are
//! compared before and after each case.
mod support;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{free_port, http_get_at};
use support::fault::{Lost, Report, Snapshot, conclude, snapshot};
use support::metrics::{family_total, series_value};
use support::node::{
    api_port, chart_image, kubectl, lease_holder, node_at, node_cluster_with, pod_ready,
    remote_kubeconfig_secret,
};
use support::tools::{CHART, helm, run};
use support::{
    REMOTE, bed, client, config, eventually, exported, namespace_in, present, remote_slice,
};
use tokio_util::sync::CancellationToken;

const CLUSTER: &str = "pair";
const RELEASE: &str = "xcc";
/// The release's full name (its Deployment, PodDisruptionBudget, Lease, and cluster-wide RBAC
/// objects, which outlive the test's namespace: unique per run, so that a second run on the same
/// bed installs cleanly).
static FULLNAME: std::sync::OnceLock<String> = std::sync::OnceLock::new();

fn fullname() -> &'static str {
    FULLNAME.get().expect("set at the start of the test")
}
const WAIT: Duration = Duration::from_secs(120);
/// How often east changes the watched slice while a handover runs.
const TICK: Duration = Duration::from_millis(200);
/// The leader whose slice east keeps changing.
const WATCHED: &str = "web";

/// What the watches saw.
#[derive(Clone, Debug, PartialEq)]
enum Seen {
    /// the Lease's holder (None: released or empty)
    Holder(Option<String>),
    /// a pod of the release marked for deletion
    Deleting(String),
    /// the address in the follower's slice
    Slice(String),
}

/// Everything the watches saw, with the instant each event arrived.
#[derive(Clone, Default)]
struct Timeline(Arc<Mutex<Vec<(Instant, Seen)>>>);

impl Timeline {
    fn push(&self, seen: Seen) {
        self.0.lock().unwrap().push((Instant::now(), seen));
    }

    fn since(&self, from: Instant) -> Vec<(Instant, Seen)> {
        self.0
            .lock()
            .unwrap()
            .iter()
            .filter(|(t, _)| *t >= from)
            .cloned()
            .collect()
    }

    /// How many updates of the follower's slice the watch saw since `from`.
    fn slice_updates_since(&self, from: Instant) -> usize {
        self.since(from)
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Slice(_)))
            .count()
    }

    /// When the watch first saw `pod` marked for deletion.
    fn deleting(&self, pod: &str) -> Option<Instant> {
        self.0.lock().unwrap().iter().find_map(|(t, s)| match s {
            Seen::Deleting(p) if p == pod => Some(*t),
            _ => None,
        })
    }

    /// Each change of holder to a pod since `from`: (when, the new holder, the one before).
    fn takeovers(&self, from: Instant) -> Vec<(Instant, String, Option<String>)> {
        let all = self.0.lock().unwrap().clone();
        let mut last: Option<String> = None;
        let mut out = Vec::new();
        for (t, s) in all {
            if let Seen::Holder(Some(h)) = s {
                if last.as_ref() != Some(&h) && t >= from {
                    out.push((t, h.clone(), last.clone()));
                }
                last = Some(h);
            }
        }
        out
    }

    /// The longest time between two successive updates of the follower's slice within
    /// [from, to], counting from the last update before `from`.
    /// When the watch saw the follower's slice with `address`.
    fn slice_seen(&self, address: &str) -> Option<Instant> {
        self.0.lock().unwrap().iter().find_map(|(t, s)| match s {
            Seen::Slice(a) if a == address => Some(*t),
            _ => None,
        })
    }

    /// What happened from one second before `origin` on, one line per event, in seconds from
    /// `origin` (the slice's updates summarised), for the test's output.
    fn dump(&self, what: &str, origin: Instant) -> String {
        let mut out = format!("--- {what}, seconds from the fault:\n");
        let mut slices: Vec<f64> = Vec::new();
        let secs = |t: Instant| {
            if t >= origin {
                t.duration_since(origin).as_secs_f64()
            } else {
                -origin.duration_since(t).as_secs_f64()
            }
        };
        for (t, s) in self.since(origin - Duration::from_secs(1)) {
            let at = secs(t);
            match s {
                Seen::Slice(_) => slices.push(at),
                other => out.push_str(&format!("  {at:7.3} {other:?}\n")),
            }
        }
        let list: Vec<String> = slices.iter().map(|t| format!("{t:.2}")).collect();
        out.push_str(&format!("  follower slice updated at {}\n", list.join(" ")));
        out
    }

    fn write_gap(&self, from: Instant, to: Instant) -> Duration {
        let all = self.0.lock().unwrap().clone();
        let times: Vec<Instant> = all
            .iter()
            .filter(|(_, s)| matches!(s, Seen::Slice(_)))
            .map(|(t, _)| *t)
            .collect();
        let first = times.iter().rposition(|t| *t < from).unwrap_or(0);
        times[first..]
            .iter()
            .filter(|t| **t <= to)
            .collect::<Vec<_>>()
            .windows(2)
            .map(|w| w[1].duration_since(*w[0]))
            .max()
            .unwrap_or_default()
    }
}

/// Watches the Lease, the release's pods and the follower's slices into `timeline` until the
/// test ends.
fn watch_all(c: &Client, ns: &str, timeline: &Timeline) {
    let leases: Api<Lease> = Api::namespaced(c.clone(), ns);
    let t = timeline.clone();
    tokio::spawn(async move {
        let cfg = watcher::Config::default().fields(&format!("metadata.name={}", fullname()));
        let mut s = watcher(leases, cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut last = None;
        while let Some(ev) = s.next().await {
            let Ok(l) = ev else { continue };
            let h = l
                .spec
                .and_then(|s| s.holder_identity)
                .filter(|h| !h.is_empty());
            if last.as_ref() != Some(&h) {
                last = Some(h.clone());
                t.push(Seen::Holder(h));
            }
        }
    });
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let t = timeline.clone();
    tokio::spawn(async move {
        let cfg =
            watcher::Config::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
        let mut s = watcher(pods, cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut seen = BTreeSet::new();
        while let Some(ev) = s.next().await {
            let Ok(p) = ev else { continue };
            if p.metadata.deletion_timestamp.is_some() && seen.insert(p.name_any()) {
                t.push(Seen::Deleting(p.name_any()));
            }
        }
    });
    let slices: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
    let t = timeline.clone();
    tokio::spawn(async move {
        let cfg =
            watcher::Config::default().labels(&format!("kubernetes.io/service-name={WATCHED}"));
        let mut s = watcher(slices, cfg)
            .default_backoff()
            .applied_objects()
            .boxed();
        let mut last = String::new();
        while let Some(ev) = s.next().await {
            let Ok(sl) = ev else { continue };
            let a = first_address(&sl);
            if a != last {
                last = a.clone();
                t.push(Seen::Slice(a));
            }
        }
    });
}

fn first_address(s: &EndpointSlice) -> String {
    s.endpoints
        .first()
        .and_then(|e| e.addresses.first())
        .cloned()
        .unwrap_or_default()
}

/// East's changes of the watched slice so far.
static CHANGES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// East changes the watched leader's slice every TICK until `stop`; returns the last address
/// it wrote and when the write was done. A load generator: the test waits on conditions, never
/// on this cadence.
fn tick(
    east: Api<EndpointSlice>,
    stop: CancellationToken,
) -> tokio::task::JoinHandle<(Instant, String)> {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(TICK);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = (Instant::now(), String::new());
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = every.tick() => {}
            }
            // addresses never repeat within the test: each names one change
            let n = CHANGES.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            let ip = format!("10.2.{}.{}", n / 250, n % 250 + 1);
            // the change is made between the request and the answer: from the request on
            let sent = Instant::now();
            let patch = json!({"endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]});
            if east
                .patch("web-e", &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .is_ok()
            {
                last = (sent, ip);
            }
        }
        last
    })
}

/// A pod's /metrics on its node's address (off the runtime's thread: the watches timing the
/// handovers run on it).
async fn scrape(ip: String, port: u16) -> Result<String, String> {
    let get = move || http_get_at(&ip, port, "/metrics", Duration::from_secs(5));
    let (_, body) = tokio::task::spawn_blocking(get)
        .await
        .map_err(|e| e.to_string())??;
    Ok(body)
}

/// The release's pods that are not being deleted.
async fn live_pods(pods: &Api<Pod>) -> Result<Vec<Pod>, String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    Ok(pods
        .list(&lp)
        .await
        .map_err(|e| e.to_string())?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn node_of(p: &Pod) -> String {
    p.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

fn ip_of(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.pod_ip.clone())
        .unwrap_or_default()
}

/// Two replicas, both Ready, nothing else (none being deleted, none Pending), one per node, each
/// with its node's address; the Lease held by one of them whose `xcc_leader` is 1, while the
/// other's is 0 and it has written nothing. (leader, standby).
async fn one_writer(pods: &Api<Pod>, leases: &Api<Lease>, port: u16) -> Result<(Pod, Pod), String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let all = pods.list(&lp).await.map_err(|e| e.to_string())?.items;
    let ready: Vec<&Pod> = all
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .collect();
    if all.len() != 2 || ready.len() != 2 {
        return Err(format!(
            "{} pods, {} ready: {:?}",
            all.len(),
            ready.len(),
            all.iter()
                .map(|p| (p.name_any(), node_of(p)))
                .collect::<Vec<_>>()
        ));
    }
    let placed: BTreeSet<(String, String)> = ready.iter().map(|p| (node_of(p), ip_of(p))).collect();
    let nodes: BTreeSet<(String, String)> = [node_at(CLUSTER, 1), node_at(CLUSTER, 2)].into();
    if placed != nodes {
        // one pod per node, each with its node's address (host network)
        return Err(format!("(node, pod IP) {placed:?}, nodes {nodes:?}"));
    }
    let h = lease_holder(leases, fullname()).await?;
    let (l, s) = match (ready[0].name_any() == h, ready[1].name_any() == h) {
        (true, false) => (ready[0], ready[1]),
        (false, true) => (ready[1], ready[0]),
        _ => return Err(format!("holder {h} is not one of the pods")),
    };
    let lm = scrape(ip_of(l), port).await?;
    let sm = scrape(ip_of(s), port).await?;
    let (lg, sg) = (
        series_value(&lm, "xcc_leader", &[])?,
        series_value(&sm, "xcc_leader", &[])?,
    );
    // every write series of the standby, whatever its labels: it must have written nothing
    let standby_writes = family_total(&sm, "xcc_writes_total")?;
    if lg == 1.0 && sg == 0.0 && standby_writes == 0.0 {
        Ok((l.clone(), s.clone()))
    } else {
        Err(format!(
            "xcc_leader {lg} on the holder, {sg} on the standby, which wrote {standby_writes}"
        ))
    }
}

/// Follows the logs of `pods` (until each container ends) into strings.
fn follow_logs(api: &Api<Pod>, pods: &[Pod]) -> Vec<(String, Arc<Mutex<String>>)> {
    pods.iter()
        .map(|p| {
            let name = p.name_any();
            let text = Arc::new(Mutex::new(String::new()));
            let (api, n, t) = (api.clone(), name.clone(), text.clone());
            tokio::spawn(async move {
                let lp = LogParams {
                    follow: true,
                    ..Default::default()
                };
                if let Ok(r) = api.log_stream(&n, &lp).await {
                    let mut lines = r.lines();
                    while let Ok(Some(l)) = lines.try_next().await {
                        let mut t = t.lock().unwrap();
                        t.push_str(&l);
                        t.push('\n');
                    }
                }
            });
            (name, text)
        })
        .collect()
}

fn log_of(logs: &[(String, Arc<Mutex<String>>)], pod: &str) -> String {
    logs.iter()
        .find(|(n, _)| n == pod)
        .map(|(_, t)| t.lock().unwrap().clone())
        .unwrap_or_default()
}

/// The PodDisruptionBudget's status once it has observed its generation: (healthy, allowed).
async fn budget(budgets: &Api<PodDisruptionBudget>) -> Result<(i32, i32), String> {
    let b = budgets.get(fullname()).await.map_err(|e| e.to_string())?;
    let s = b.status.clone().unwrap_or_default();
    if s.observed_generation != b.metadata.generation {
        return Err(format!("not observed yet: {s:?}"));
    }
    Ok((s.current_healthy, s.disruptions_allowed))
}

/// What one handover measured.
struct Handover {
    /// each takeover: from the previous holder's pod marked for deletion to the next holder
    takeovers: Vec<Duration>,
    gap: Duration,
    /// from east's last change until the follower had it (every other follower was there)
    converged: Duration,
}

impl Handover {
    fn takeovers_text(&self) -> String {
        self.takeovers
            .iter()
            .map(|d| format!("{:.2} s", d.as_secs_f64()))
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

/// The shared state of the cases.
struct Release {
    ns: String,
    /// the test's namespace in east and pair, removed when the release is dropped
    _ns: support::TestNs,
    /// the bed's kubeconfig (helm and kubectl)
    kubeconfig: std::path::PathBuf,
    /// the pods' admin port, free on both nodes' addresses
    port: u16,
    pods: Api<Pod>,
    leases: Api<Lease>,
    followers: Api<Service>,
    follower_slices: Api<EndpointSlice>,
    east: Api<Service>,
    east_slices: Api<EndpointSlice>,
    pair: Client,
    timeline: Timeline,
    /// the leaders east exports (each must have its follower)
    leaders: BTreeSet<String>,
    budgets: Api<PodDisruptionBudget>,
    /// pods of the release, through a client that does not retry a 429 (kube's client retries
    /// one for minutes: a refused eviction must come back as one)
    evictions: Api<Pod>,
}

/// What setting the release up took, for the test's output.
struct SetUp {
    built: String,
    nodes_ready: Duration,
    image_ready: Duration,
    both_ready: Duration,
}

impl Release {
    /// `helm <verb>` of the release with the chart's defaults (replicaCount 2, the
    /// PodDisruptionBudget with minAvailable 1, preferred anti-affinity and a topology spread
    /// across nodes) and what the bed needs, with `workers` workers.
    fn helm(&self, verb: &str, workers: u32) -> std::process::Command {
        let sets = [
            "image.repository=localhost/cross-cluster-controller".to_string(),
            "image.tag=dev".into(),
            "image.pullPolicy=Never".into(),
            "hostNetwork=true".into(),
            "adminBindPodIP=true".into(),
            format!("adminPort={}", self.port),
            "apiServerOverride.host=127.0.0.1".into(),
            format!(
                "apiServerOverride.port={}",
                api_port(&self.kubeconfig, CLUSTER)
            ),
            "remoteKubeconfig.existingSecret=east-kubeconfig".into(),
            "remoteSecretSelector=".into(),
            format!("watchNamespaces={{{}}}", self.ns),
            "leaseDurationSeconds=6".into(),
            format!("workers={workers}"),
            format!("fullnameOverride={}", fullname()),
            "remoteReader.enabled=false".into(),
        ];
        let mut c = helm(&self.kubeconfig);
        c.args([
            verb,
            RELEASE,
            CHART,
            "--kube-context",
            CLUSTER,
            "-n",
            &self.ns,
        ]);
        for s in sets {
            c.args(["--set", &s]);
        }
        c
    }

    /// Two replicas Ready, one per node, exactly one writing: (leader, standby).
    async fn one_writer(&self) -> Result<(Pod, Pod), String> {
        one_writer(&self.pods, &self.leases, self.port).await
    }

    async fn snapshot(&self) -> Snapshot {
        snapshot(&self.pair, &[&self.ns]).await
    }

    /// Every leader of east has its follower, and the watched follower's slice holds `address`.
    async fn matched(&self, address: &str) -> Result<(), String> {
        for l in &self.leaders {
            present(&self.followers, l).await?;
        }
        let slices = self
            .follower_slices
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={WATCHED}")))
            .await
            .map_err(|e| e.to_string())?;
        let now: Vec<String> = slices.items.iter().map(first_address).collect();
        if now == [address] {
            Ok(())
        } else {
            Err(format!(
                "follower slice addresses {now:?}, east's {address}"
            ))
        }
    }

    /// A new leader in east, mirrored later.
    async fn add_leader(&mut self, name: &str) {
        self.east
            .create(&PostParams::default(), &exported(name, 80))
            .await
            .unwrap();
        self.leaders.insert(name.to_string());
    }

    /// Runs `fault` while east changes the watched slice every TICK (and creates a leader in
    /// east as the fault begins), waits until `done` holds (the handover and what the case waits
    /// for are over) and the last new holder has mirrored three more changes, then stops the
    /// changes and waits until every follower matches east.
    async fn handover<F, Fut, D, DFut>(&mut self, what: &str, fault: F, done: D) -> Handover
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = ()>,
        D: FnMut() -> DFut,
        DFut: std::future::Future<Output = Result<(), String>>,
    {
        let stop = CancellationToken::new();
        let ticker = tick(self.east_slices.clone(), stop.clone());
        // steady state first: the leader mirrors the changes
        let warm = Instant::now();
        eventually("east's changes mirrored before the fault", WAIT, || async {
            let n = self.timeline.slice_updates_since(warm);
            if n >= 3 {
                Ok(())
            } else {
                Err(format!("{n} changes mirrored"))
            }
        })
        .await;
        let start = Instant::now();
        // a new leader in east as the fault begins
        let during = format!("during-{what}");
        tokio::join!(fault(), self.add_leader(&during));
        eventually(&format!("{what}: done"), WAIT, done).await;
        // the new leader keeps up with east's changes
        eventually(
            &format!("{what}: changes mirrored after the handover"),
            WAIT,
            || async {
                let (since, _, _) = self
                    .timeline
                    .takeovers(start)
                    .last()
                    .cloned()
                    .ok_or("no takeover seen yet")?;
                let n = self.timeline.slice_updates_since(since);
                if n >= 3 {
                    Ok(())
                } else {
                    Err(format!("{n} changes mirrored since the last takeover"))
                }
            },
        )
        .await;
        stop.cancel();
        let (changed, last) = ticker.await.unwrap();
        let stopped = Instant::now();
        eventually(&format!("{what}: every follower matched"), WAIT, || {
            self.matched(&last)
        })
        .await;
        let seen = self
            .timeline
            .slice_seen(&last)
            .expect("the watch saw the last change");
        let converged = seen.duration_since(changed);
        eprintln!("{}", self.timeline.dump(what, start));
        let takeovers: Vec<Duration> = self
            .timeline
            .takeovers(start)
            .iter()
            .map(|(t, new, old)| {
                let old = old.as_deref().expect("a holder before");
                let deleting = self.timeline.deleting(old).unwrap_or_else(|| {
                    panic!("{old} led until {new} took over without being deleted")
                });
                t.duration_since(deleting)
            })
            .collect();
        assert!(!takeovers.is_empty(), "{what}: the Lease changed hands");
        Handover {
            takeovers,
            gap: self.timeline.write_gap(start, stopped),
            converged,
        }
    }
}

#[tokio::test]
async fn two_replicas_on_two_nodes_hand_over_on_delete_upgrade_and_drain() {
    let (mut bed, (l, s), set_up) = two_replicas_ready_one_writing().await;
    let (l, s) = leader_pod_deleted_while_the_standby_runs(&mut bed, l, s).await;
    let (l, s) = helm_upgrade_replaces_both_pods_one_at_a_time(&mut bed, l, s).await;
    drain_of_the_leaders_node_against_the_budget(&mut bed, l, s).await;
    // the cluster-wide objects go with the release (the namespace goes when the test ends)
    let mut uninstall = helm(&bed.kubeconfig);
    uninstall.args([
        "uninstall",
        RELEASE,
        "--kube-context",
        CLUSTER,
        "-n",
        &bed.ns,
    ]);
    run(&mut uninstall);
    eprintln!(
        "{}\nnodes Ready {:.1} s, image built and imported {:.1} s, helm install to two replicas Ready {:.1} s",
        set_up.built,
        set_up.nodes_ready.as_secs_f64(),
        set_up.image_ready.as_secs_f64(),
        set_up.both_ready.as_secs_f64()
    );
}

/// (a) The cluster with two nodes, the image, the release installed; two replicas Ready through
/// the chart's probes, one per node, exactly one writing; east's leaders mirrored.
async fn two_replicas_ready_one_writing() -> (Release, (Pod, Pod), SetUp) {
    let up = Instant::now();
    node_cluster_with(CLUSTER, 2).await;
    let nodes_ready = up.elapsed();
    let bed_paths = bed().await;
    let (built, image_ready) = chart_image(CLUSTER).await;
    let ns = namespace_in("node-replicas", &[REMOTE, CLUSTER]).await;
    FULLNAME
        .set(format!("xcc-{}", &ns.name[ns.name.len() - 8..]))
        .unwrap();
    let pair = client(CLUSTER).await;
    let pods: Api<Pod> = Api::namespaced(pair.clone(), &ns.name);
    let mut once = config(CLUSTER).await;
    once.default_retry = false;
    // the static remote east, as in tests/node_chart.rs
    remote_kubeconfig_secret(&pair, &bed_paths.kubeconfig, REMOTE, &ns.name).await;
    // the admin port, free on both nodes' addresses
    let port = loop {
        let p = free_port();
        if std::net::TcpListener::bind(("127.0.0.2", p)).is_ok() {
            break p;
        }
    };
    let east_c = client(REMOTE).await;
    let mut bed = Release {
        ns: ns.name.clone(),
        kubeconfig: bed_paths.kubeconfig.clone(),
        port,
        pods: pods.clone(),
        leases: Api::namespaced(pair.clone(), &ns.name),
        followers: Api::namespaced(pair.clone(), &ns.name),
        follower_slices: Api::namespaced(pair.clone(), &ns.name),
        east: Api::namespaced(east_c.clone(), &ns.name),
        east_slices: Api::namespaced(east_c, &ns.name),
        pair: pair.clone(),
        timeline: Timeline::default(),
        leaders: BTreeSet::new(),
        budgets: Api::namespaced(pair.clone(), &ns.name),
        evictions: Api::namespaced(Client::try_from(once).unwrap(), &ns.name),
        _ns: ns,
    };
    watch_all(&pair, &bed.ns, &bed.timeline);
    let installed = Instant::now();
    run(&mut bed.helm("install", 16));
    let (first_leader, _) =
        eventually("two replicas Ready, one leading", WAIT, || bed.one_writer()).await;
    let both_ready = installed.elapsed();
    for name in [WATCHED, "api", "db"] {
        bed.add_leader(name).await;
    }
    bed.east_slices
        .create(
            &PostParams::default(),
            &remote_slice(WATCHED, "web-e", &["10.1.0.1"]),
        )
        .await
        .unwrap();
    eventually("followers of east's leaders", WAIT, || {
        bed.matched("10.1.0.1")
    })
    .await;
    let (l, s) = eventually("exactly one writing", WAIT, || bed.one_writer()).await;
    assert_eq!(l.name_any(), first_leader.name_any());
    let standby_log = pods
        .logs(&s.name_any(), &LogParams::default())
        .await
        .unwrap();
    assert!(
        !standby_log.contains("became leader"),
        "the standby never led: {standby_log}"
    );
    let leader_log = pods
        .logs(&l.name_any(), &LogParams::default())
        .await
        .unwrap();
    assert!(leader_log.contains("in-cluster"), "{leader_log}");
    assert!(leader_log.contains("became leader"), "{leader_log}");
    let set_up = SetUp {
        built,
        nodes_ready,
        image_ready,
        both_ready,
    };
    (bed, (l, s), set_up)
}

/// (b) The leader pod deleted while the standby runs: another pod holds the Lease within the
/// Lease duration, nothing lost. Returns (leader, standby) afterwards.
async fn leader_pod_deleted_while_the_standby_runs(
    bed: &mut Release,
    l: Pod,
    s: Pod,
) -> (Pod, Pod) {
    let (pods, leases, timeline) = (bed.pods.clone(), bed.leases.clone(), bed.timeline.clone());
    // The deleted pod releases the Lease on SIGTERM; the standby takes it at its next Lease
    // round (every 1.2 s with a 6 s Lease), unless the Deployment's replacement, started on the
    // freed node meanwhile, asks first: either way another pod must hold it within the Lease
    // duration.
    let before = bed.snapshot().await;
    let logs = follow_logs(&pods, std::slice::from_ref(&l));
    let deleted_at = Arc::new(Mutex::new(None));
    let (victim, standby) = (l.name_any(), s.name_any());
    let b = {
        let (pods, victim, deleted_at) = (pods.clone(), victim.clone(), deleted_at.clone());
        let leases = leases.clone();
        let old = victim.clone();
        bed.handover(
            "delete",
            move || async move {
                *deleted_at.lock().unwrap() = Some(Instant::now());
                pods.delete(&victim, &DeleteParams::default())
                    .await
                    .unwrap();
            },
            move || {
                let (leases, old) = (leases.clone(), old.clone());
                async move {
                    let h = lease_holder(&leases, fullname()).await?;
                    if h != old {
                        Ok(())
                    } else {
                        Err(format!("holder {h}"))
                    }
                }
            },
        )
        .await
    };
    // pod deletion request to another pod holding the Lease
    let requested = deleted_at.lock().unwrap().expect("deleted");
    let (took_at, new, _) = timeline.takeovers(requested)[0].clone();
    let delete_takeover = took_at.duration_since(requested);
    assert!(
        delete_takeover < Duration::from_secs(6),
        "within the Lease duration (6 s): {delete_takeover:?}"
    );
    let (l, s) = eventually("two replicas again after the deletion", WAIT, || {
        bed.one_writer()
    })
    .await;
    assert_eq!(l.name_any(), new, "the pod that took over still leads");
    let by = if new == standby {
        "the standby".to_string()
    } else {
        assert_eq!(s.name_any(), standby, "the standby still stands by");
        "the replacement pod (started on the freed node before the standby's next Lease round; the standby stood by, 0 writes)".to_string()
    };
    let released = log_of(&logs, &victim);
    assert!(released.contains("lease released"), "{released}");
    let after = bed.snapshot().await;
    conclude(
        Report {
            id: "46-chart-leader-pod-deleted-with-a-standby",
            scenario: "The chart's two replicas as pods on two nodes: the leader pod deleted while the standby runs",
            done: "helm install (replicaCount 2, hostNetwork with the admin port on each pod's node address, static remote east); east changed a slice every 0.2 s; kubectl delete of the leader pod (SIGTERM, 30 s grace)",
            converge: Some(b.converged),
            note: format!(
                "converged in: from east's last change (made once the other pod led) until the follower had it, every other follower in place; taken over by {by}, {:.2} s from the deletion request to it holding the Lease (6 s Lease; the deleted pod logged `lease released`); write gap {:.2} s (longest time between two successive updates of the follower's slice, seen by a watch, while east changed it every 0.2 s); a leader created in east as the pod was deleted mirrored; afterwards two pods again, one per node, the other one standing by (xcc_leader 0, 0 writes)",
                delete_takeover.as_secs_f64(),
                b.gap.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &bed.leaders),
        &before.non_followers_touched(&after),
    );
    (l, s)
}

/// (c) `helm upgrade` with a changed value: both pods replaced, one at a time; each old leader
/// released the Lease. Returns (leader, standby) afterwards.
async fn helm_upgrade_replaces_both_pods_one_at_a_time(
    bed: &mut Release,
    l: Pod,
    s: Pod,
) -> (Pod, Pod) {
    let (pods, leases, timeline, port) = (
        bed.pods.clone(),
        bed.leases.clone(),
        bed.timeline.clone(),
        bed.port,
    );
    let before = bed.snapshot().await;
    let old = [l.clone(), s.clone()];
    let logs = follow_logs(&pods, &old);
    let upgrade = Instant::now();
    let c = {
        let pods = pods.clone();
        let leases = leases.clone();
        let old: Vec<String> = old.iter().map(|p| p.name_any()).collect();
        let mut upgrade_cmd = bed.helm("upgrade", 8);
        bed.handover(
            "upgrade",
            move || async move {
                tokio::task::spawn_blocking(move || run(&mut upgrade_cmd))
                    .await
                    .unwrap();
            },
            move || {
                let (pods, leases, old) = (pods.clone(), leases.clone(), old.clone());
                async move {
                    let (l, s) = one_writer(&pods, &leases, port).await?;
                    if old.contains(&l.name_any()) || old.contains(&s.name_any()) {
                        return Err("old pods left".into());
                    }
                    Ok(())
                }
            },
        )
        .await
    };
    let rolled = upgrade.elapsed();
    let (l, s) = one_writer(&pods, &leases, port).await.unwrap();
    for p in &old {
        // every old pod that led when it was told to stop released the Lease
        let led = timeline
            .takeovers(upgrade)
            .iter()
            .any(|(_, _, before)| before.as_deref() == Some(p.name_any().as_str()));
        if led {
            let text = log_of(&logs, &p.name_any());
            assert!(text.contains("lease released"), "{}: {text}", p.name_any());
        }
    }
    let args = l.spec.as_ref().unwrap().containers[0]
        .args
        .clone()
        .unwrap_or_default();
    assert!(args.contains(&"--workers=8".to_string()), "{args:?}");
    let after = bed.snapshot().await;
    conclude(
        Report {
            id: "47-chart-helm-upgrade-two-replicas",
            scenario: "The chart's two replicas as pods: helm upgrade with a changed value (both pods replaced, one at a time)",
            done: "helm upgrade --set workers=8 (the rest unchanged) on the release of the row above; east changed a slice every 0.2 s",
            converge: Some(c.converged),
            note: format!(
                "converged in: from east's last change (made once the rollout was over) until the follower had it, every other follower in place; {} handover(s), takeover {} (each from the leading pod marked for deletion to the next pod holding the Lease; each old leader logged `lease released`); write gap {:.2} s (longest time between two successive updates of the follower's slice, seen by a watch, while east changed it every 0.2 s); helm upgrade to both new pods Ready with one leading {:.1} s; a leader created in east as the upgrade began mirrored",
                c.takeovers.len(),
                c.takeovers_text(),
                c.gap.as_secs_f64(),
                rolled.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &bed.leaders),
        &before.non_followers_touched(&after),
    );
    (l, s)
}

/// (d) `kubectl drain` of the leader's node against the chart's PodDisruptionBudget: the pod on
/// the other node takes over, the replacement waits unschedulable, a second eviction is refused
/// with 429 until, after uncordon, the replacement is Ready.
async fn drain_of_the_leaders_node_against_the_budget(bed: &mut Release, l: Pod, s: Pod) {
    let (pods, leases, budgets, evictions) = (
        bed.pods.clone(),
        bed.leases.clone(),
        bed.budgets.clone(),
        bed.evictions.clone(),
    );
    eventually("the budget allows one disruption", WAIT, || async {
        match budget(&budgets).await? {
            (2, 1) => Ok(()),
            other => Err(format!("(healthy, allowed) {other:?}")),
        }
    })
    .await;
    let before = bed.snapshot().await;
    let (drained, other) = (node_of(&l), node_of(&s));
    let logs = follow_logs(&pods, std::slice::from_ref(&l));
    let drain_took = Arc::new(Mutex::new(Duration::ZERO));
    let drain_out = Arc::new(Mutex::new(String::new()));
    let d = {
        let (leases, standby) = (leases.clone(), s.name_any());
        let (drained, took, out) = (drained.clone(), drain_took.clone(), drain_out.clone());
        bed.handover(
            "drain",
            move || async move {
                let t = Instant::now();
                let text = tokio::task::spawn_blocking(move || {
                    run(kubectl(CLUSTER).args([
                        "drain",
                        &drained,
                        "--ignore-daemonsets",
                        "--delete-emptydir-data",
                        "--timeout",
                        "120s",
                    ]))
                })
                .await
                .unwrap();
                *took.lock().unwrap() = t.elapsed();
                *out.lock().unwrap() = text;
            },
            move || {
                let (leases, standby) = (leases.clone(), standby.clone());
                async move {
                    let h = lease_holder(&leases, fullname()).await?;
                    if h == standby {
                        Ok(())
                    } else {
                        Err(format!("holder {h}"))
                    }
                }
            },
        )
        .await
    };
    let released = log_of(&logs, &l.name_any());
    assert!(released.contains("lease released"), "{released}");
    // the replacement cannot run on the cordoned node, nor beside the other pod: the host port
    // is taken there (the scheduler's NodePorts filter), so it waits, unscheduled
    let pending = eventually("the replacement pod unschedulable", WAIT, || async {
        let live = live_pods(&pods).await?;
        let waiting: Vec<&Pod> = live.iter().filter(|p| node_of(p).is_empty()).collect();
        let [p] = waiting.as_slice() else {
            return Err(format!("{} unscheduled of {}", waiting.len(), live.len()));
        };
        let why = p
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "PodScheduled"))
            .filter(|c| c.status == "False" && c.reason.as_deref() == Some("Unschedulable"))
            .and_then(|c| c.message.clone())
            .ok_or("not judged unschedulable yet")?;
        Ok((p.name_any(), why))
    })
    .await;
    eventually("the budget allows no more disruption", WAIT, || async {
        match budget(&budgets).await? {
            (1, 0) => Ok(()),
            other => Err(format!("(healthy, allowed) {other:?}")),
        }
    })
    .await;
    // a second eviction (what draining the other node would send) is refused
    let last = s.name_any();
    let refused = match evictions.evict(&last, &EvictParams::default()).await {
        Err(kube::Error::Api(st)) if st.code == 429 => st.message,
        other => panic!("the budget must refuse the second eviction with 429, got {other:?}"),
    };
    assert_eq!(
        lease_holder(&leases, fullname()).await.unwrap(),
        last,
        "the refused eviction left the leader alone"
    );
    // uncordon: the replacement runs on the drained node, and the budget allows one again
    run(kubectl(CLUSTER).args(["uncordon", &drained]));
    let uncordoned = Instant::now();
    let (l2, s2) = eventually("two replicas again after uncordon", WAIT, || {
        bed.one_writer()
    })
    .await;
    let replaced_in = uncordoned.elapsed();
    assert_eq!(l2.name_any(), last);
    assert_eq!(s2.name_any(), pending.0);
    assert_eq!(
        node_of(&s2),
        drained,
        "the replacement on the uncordoned node"
    );
    assert_eq!(node_of(&l2), other);
    eventually("the budget allows one disruption again", WAIT, || async {
        match budget(&budgets).await? {
            (2, 1) => Ok(()),
            other => Err(format!("(healthy, allowed) {other:?}")),
        }
    })
    .await;
    let dry = EvictParams {
        delete_options: Some(DeleteParams {
            dry_run: true,
            ..Default::default()
        }),
        post_options: PostParams {
            dry_run: true,
            ..Default::default()
        },
    };
    evictions
        .evict(&last, &dry)
        .await
        .expect("once the replacement is Ready the same eviction is admitted (dry run)");
    let after = bed.snapshot().await;
    let drain_text = drain_out.lock().unwrap().clone();
    assert!(drain_text.contains("drained"), "{drain_text}");
    conclude(
        Report {
            id: "48-chart-drain-against-the-budget",
            scenario: "The chart's two replicas as pods: kubectl drain of the leader's node against the chart's PodDisruptionBudget",
            done: "kubectl drain --ignore-daemonsets --delete-emptydir-data of the leader's node (release of the rows above, minAvailable 1); east changed a slice every 0.2 s; then an eviction of the other pod; then kubectl uncordon",
            converge: Some(d.converged),
            note: format!(
                "converged in: from east's last change (made once the other pod led) until the follower had it, every other follower in place; takeover {} (from the evicted leader marked for deletion to the pod on the other node holding the Lease; the evicted pod logged `lease released`); write gap {:.2} s (longest time between two successive updates of the follower's slice, seen by a watch, while east changed it every 0.2 s); a leader created in east as the drain began mirrored; drain done in {:.1} s; the replacement stayed unschedulable ({}); the second eviction refused with 429 ({}), the leader left alone; after uncordon the replacement Ready on the drained node in {:.1} s and the same eviction admitted (dry run)",
                d.takeovers_text(),
                d.gap.as_secs_f64(),
                drain_took.lock().unwrap().as_secs_f64(),
                pending.1.trim_end_matches('.'),
                refused.trim_end_matches('.'),
                replaced_in.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &bed.leaders),
        &before.non_followers_touched(&after),
    );
}
