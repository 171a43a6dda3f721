//! The data-path benchmark (issue 20 §3), a measurement `cargo test` never runs (`test = false`
//! in Cargo.toml): `XCC_BENCH_DATAPATH=1 scripts/bench` runs it on a fresh bench bed
//! (`.testbed-bench/`) and it writes the "Data
//! path" section of bench/results.md (and the "datapath" key of results.json). Two clusters
//! with a node each: east runs `web` and exports it, west runs the real daemon (release build)
//! with east as its static remote. Every figure of west sits beside the same figure of east in
//! the same run, east's own kube-proxy serving east's own Service being the in-cluster floor.
//!
//! 1. **Endpoint change to data path.** One east pod's readiness is switched off and on
//!    (`GET /readiness/off|on` on the pod, testbed/workloads/web.c) many times. Each change is
//!    timed from the pod's Ready condition changing in east's API (a watch event) to the node's
//!    kube-proxy table gaining or losing the pod's `ip:port` (east's node: the floor; west's:
//!    through the follower), polled with `nft list table ip kube-proxy` in the node's network
//!    namespace. On the way: east's EndpointSlice and west's follower slice changing (watch
//!    events), the middle part being the propagation lag of the main benchmark (API object to API
//!    object).
//! 2. **Failed requests during a rollout** of 10 pods (maxSurge 1, maxUnavailable 0) under an
//!    open-loop load of 200 requests/s in each cluster: west's client calls the follower, east's
//!    calls east's own Service.
mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client};
use serde_json::json;
use support::bench::{LAST, env_number, load_avg, pct, write_results};
use support::daemon::{Daemon, args_for};
use support::node::{WEB_IMAGE, node_cluster, pod_ready, wait_dns, workload_images};
use support::traffic::{Load, Tally, now_ms, proxy_targets, settled_web_pods_within};
use support::{client, eventually, namespace_in, obj};

const EAST: &str = "east";
const WEST: &str = "west";
/// Start-up of pods and a 10-pod rollout on a busy two-core machine.
const WAIT: Duration = Duration::from_secs(600);
/// How often each node's kube-proxy table is read (the aim; the run reports what it got).
const POLL: Duration = Duration::from_millis(10);
/// After a change has reached both tables, the next one waits this long: kube-proxy syncs at
/// most once per `minSyncPeriod` (1 s by default) beyond a burst of two, and a change arriving
/// sooner would be held back by the previous one in either cluster.
const SETTLE: Duration = Duration::from_millis(1100);
/// Requests a second of each load client during the rollout (the figure).
const RATE: u32 = 200;
/// How far past the rollout's end the window reaches (late failures on the far side).
const TAIL: i64 = 3000;

/// Wall-clock ms with a fraction: every timestamp of this benchmark, on one clock.
fn now_f() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64() * 1000.0)
        .unwrap_or(0.0)
}

/// A yes/no state seen over time (a watch or a poller): its transitions, timestamped when seen.
#[derive(Clone, Default)]
struct Signal(Arc<Mutex<Vec<(f64, bool)>>>);

impl Signal {
    fn see(&self, state: bool) {
        let t = now_f();
        let mut v = self.0.lock().expect("signal lock");
        if v.last().map(|l| l.1) != Some(state) {
            v.push((t, state));
        }
    }

    fn state(&self) -> Option<bool> {
        self.0.lock().expect("signal lock").last().map(|l| l.1)
    }

    /// When it turned to `state` at or after `since`.
    fn turned(&self, state: bool, since: f64) -> Option<f64> {
        self.0
            .lock()
            .expect("signal lock")
            .iter()
            .find(|(t, s)| *t >= since && *s == state)
            .map(|x| x.0)
    }
}

/// Feeds `signal` with `state(object)` for every object a watch of `api` delivers.
fn watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    signal: Signal,
    state: impl Fn(&K) -> bool + Send + 'static,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    tokio::spawn(async move {
        let mut s = std::pin::pin!(watcher::watcher(api, cfg));
        while let Some(ev) = s.next().await {
            match ev {
                Ok(watcher::Event::Apply(o)) | Ok(watcher::Event::InitApply(o)) => {
                    signal.see(state(&o))
                }
                Ok(_) => {}
                Err(e) => eprintln!("datapath: watch error (retried): {e}"),
            }
        }
    });
}

/// Whether a slice lists `ip` as ready.
fn slice_ready(s: &EndpointSlice, ip: &str) -> bool {
    s.endpoints.iter().any(|e| {
        e.addresses.iter().any(|a| a == ip)
            && e.conditions.as_ref().and_then(|c| c.ready) == Some(true)
    })
}

/// The network namespaces of `cluster`'s nodes (testbed/net.sh).
fn node_netns(bed_dir: &Path, cluster: &str) -> Vec<PathBuf> {
    support::traffic::node_netns(bed_dir, cluster).unwrap_or_else(|e| panic!("{e}"))
}

/// Reads one node's kube-proxy table every POLL until `stop`, feeding `signal` with whether it
/// DNATs to `target` (`ip:port`); the gaps between reads go to `gaps` (ms).
fn poll_table(
    netns: PathBuf,
    target: String,
    signal: Signal,
    stop: Arc<std::sync::atomic::AtomicBool>,
    gaps: Arc<Mutex<Vec<f64>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut last: Option<f64> = None;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let begun = Instant::now();
            let out = std::process::Command::new("nsenter")
                .arg(format!("--net={}", netns.display()))
                .args(["nft", "list", "table", "ip", "kube-proxy"])
                .output();
            let t = now_f();
            if let Ok(out) = out
                && out.status.success()
            {
                // the endpoint's rule: `dnat to 10.200.1.5:8080` (its chain's name has
                // `10.200.1.5/8080`, and nftables mode deletes the chain itself later)
                signal.see(String::from_utf8_lossy(&out.stdout).contains(&target));
                if let Some(l) = last {
                    gaps.lock().expect("gaps lock").push(t - l);
                }
                last = Some(t);
            }
            if let Some(rest) = POLL.checked_sub(begun.elapsed()) {
                std::thread::sleep(rest);
            }
        }
    })
}

/// One GET to a pod, from the test (in the bed's namespace, which routes to every pod).
fn get_pod(ip: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let addr = format!("{ip}:8080");
    let mut s = std::net::TcpStream::connect_timeout(
        &addr.parse().map_err(|e| format!("{addr}: {e}"))?,
        Duration::from_secs(2),
    )
    .map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut body = String::new();
    s.read_to_string(&mut body).map_err(|e| e.to_string())?;
    if body.starts_with("HTTP/1.0 200") {
        Ok(body)
    } else {
        Err(body)
    }
}

/// The web Deployment of the readiness changes: `replicas` pods whose readiness probe (every
/// second, one failure or success enough) follows `/readiness/off|on`, and its exported Service.
async fn flip_web(c: &Client, ns: &str, replicas: i32) {
    let deployment: Deployment = obj(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "web", "image": WEB_IMAGE, "imagePullPolicy": "Never",
                        "env": [
                            {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                            {"name": "CLUSTER", "value": EAST},
                            {"name": "GRACE_SECONDS", "value": "1"}
                        ],
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"},
                                           "periodSeconds": 1, "failureThreshold": 1, "successThreshold": 1}
                    }]
                }
            }
        }
    }));
    Api::<Deployment>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the web Deployment");
    let service: Service = obj(json!({
        "metadata": {"name": "web", "labels": {"app": "web", "fair.com/cross-cluster": "true"}},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }));
    Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &service)
        .await
        .expect("create the web Service");
}

/// One readiness change, in ms after the pod's Ready condition changed in east's API.
#[derive(Debug, serde::Serialize)]
struct Change {
    /// to ready (true) or to not ready
    ready: bool,
    /// east's EndpointSlice, west's follower slice, east's kube-proxy (the floor), west's
    east_slice: f64,
    west_slice: f64,
    east_rules: f64,
    west_rules: f64,
}

#[derive(Debug, serde::Serialize)]
struct Flips {
    changes: Vec<Change>,
    /// gaps between two reads of one node's table (ms): the polling resolution
    poll_p50_ms: f64,
    poll_p99_ms: f64,
    poll_max_ms: f64,
    secs: f64,
}

/// Part 1: readiness changes of one east pod, each timed to both clusters' kube-proxy tables.
async fn flips(bed_dir: &Path, n: usize) -> Flips {
    let started = Instant::now();
    let ns = namespace_in("dp-flip", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    flip_web(&east, &ns.name, 2).await;
    let pods = settled_web_pods_within(&east, &ns.name, 2, &BTreeSet::new(), WAIT).await;
    let daemon = Daemon::start(&args_for(&ns.name)).await;
    let all_ips: BTreeSet<String> = pods.values().cloned().collect();
    proxy_targets(bed_dir, WEST, &all_ips, false).await;
    proxy_targets(bed_dir, EAST, &all_ips, false).await;
    // the pod that changes; the other one keeps the Service answering
    let (name, ip) = pods
        .iter()
        .next()
        .map(|(n, i)| (n.clone(), i.clone()))
        .expect("a pod");

    let pod = Signal::default();
    let east_slice = Signal::default();
    let west_slice = Signal::default();
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    watch(
        Api::<Pod>::namespaced(east.clone(), &ns.name),
        by_name,
        pod.clone(),
        pod_ready,
    );
    let of_web = || watcher::Config::default().labels("kubernetes.io/service-name=web");
    let ip1 = ip.clone();
    watch(
        Api::<EndpointSlice>::namespaced(east.clone(), &ns.name),
        of_web(),
        east_slice.clone(),
        move |s| slice_ready(s, &ip1),
    );
    let ip2 = ip.clone();
    watch(
        Api::<EndpointSlice>::namespaced(west.clone(), &ns.name),
        of_web(),
        west_slice.clone(),
        move |s| slice_ready(s, &ip2),
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gaps = Arc::new(Mutex::new(Vec::new()));
    let target = format!("{ip}:8080");
    let mut tables: Vec<(&str, Signal)> = Vec::new();
    let mut pollers = Vec::new();
    for cluster in [EAST, WEST] {
        for netns in node_netns(bed_dir, cluster) {
            let s = Signal::default();
            pollers.push(poll_table(
                netns,
                target.clone(),
                s.clone(),
                stop.clone(),
                gaps.clone(),
            ));
            tables.push((cluster, s));
        }
    }
    let signals: Vec<&Signal> = [&pod, &east_slice, &west_slice]
        .into_iter()
        .chain(tables.iter().map(|(_, s)| s))
        .collect();
    eventually(
        "every watch and poller to see the pod ready",
        Duration::from_secs(60),
        || async {
            signals
                .iter()
                .all(|s| s.state() == Some(true))
                .then_some(())
                .ok_or_else(|| "not yet".to_string())
        },
    )
    .await;

    let mut changes = Vec::new();
    let mut next_at = Instant::now();
    for k in 0..n {
        let ready = k % 2 == 1;
        if let Some(rest) = next_at.checked_duration_since(Instant::now()) {
            tokio::time::sleep(rest).await;
        }
        let t = now_f();
        let path = if ready {
            "/readiness/on"
        } else {
            "/readiness/off"
        };
        let ip3 = ip.clone();
        tokio::task::spawn_blocking(move || get_pod(&ip3, path))
            .await
            .expect("flip task")
            .unwrap_or_else(|e| panic!("GET {path} on {name}: {e}"));
        eventually(
            &format!("change {k} (ready {ready}) everywhere"),
            Duration::from_secs(60),
            || async {
                signals
                    .iter()
                    .all(|s| s.turned(ready, t).is_some())
                    .then_some(())
                    .ok_or_else(|| {
                        format!(
                            "states {:?}",
                            signals
                                .iter()
                                .map(|s| s.turned(ready, t).is_some())
                                .collect::<Vec<_>>()
                        )
                    })
            },
        )
        .await;
        let at = |s: &Signal| s.turned(ready, t).expect("seen");
        let t_pod = at(&pod);
        // a cluster's data path has switched once every node's table has
        let rules = |c: &str| {
            tables
                .iter()
                .filter(|(cluster, _)| *cluster == c)
                .map(|(_, s)| at(s))
                .fold(f64::MIN, f64::max)
                - t_pod
        };
        let change = Change {
            ready,
            east_slice: at(&east_slice) - t_pod,
            west_slice: at(&west_slice) - t_pod,
            east_rules: rules(EAST),
            west_rules: rules(WEST),
        };
        eprintln!("datapath: change {k}: {change:?}");
        changes.push(change);
        next_at = Instant::now() + SETTLE;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for p in pollers {
        let _ = p.join();
    }
    drop(daemon);
    let gaps = gaps.lock().expect("gaps lock").clone();
    Flips {
        changes,
        poll_p50_ms: pct(&gaps, 0.5),
        poll_p99_ms: pct(&gaps, 0.99),
        poll_max_ms: pct(&gaps, 1.0),
        secs: started.elapsed().as_secs_f64(),
    }
}

#[derive(Debug, serde::Serialize)]
struct Rollout {
    pods: usize,
    rate: u32,
    rollout_s: f64,
    west_sent: usize,
    west_failed: usize,
    west_first_failure: String,
    east_sent: usize,
    east_failed: usize,
    east_first_failure: String,
    secs: f64,
}

/// Part 2: a rollout of 10 east pods under 200 requests/s in each cluster.
async fn rollout(bed_dir: &Path) -> Rollout {
    let started = Instant::now();
    let ns = namespace_in("dp-rollout", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    support::traffic::web(&east, &ns.name, EAST, 10, true).await;
    let old = settled_web_pods_within(&east, &ns.name, 10, &BTreeSet::new(), WAIT).await;
    let _daemon = Daemon::start(&args_for(&ns.name)).await;
    let old_ips: BTreeSet<String> = old.values().cloned().collect();
    proxy_targets(bed_dir, WEST, &old_ips, false).await;
    // absolute names (a trailing dot): one DNS query per request instead of the search list's
    // four, the same for both clients
    let url = format!("http://web.{}.svc.cluster.local./", ns.name);
    let west_load = Load::start(&west, WEST, &ns.name, "load", &url, RATE).await;
    let east_load = Load::start(&east, EAST, &ns.name, "load", &url, RATE).await;
    let names: BTreeSet<String> = old.keys().cloned().collect();
    let t = now_ms();
    tokio::join!(
        west_load.answered_by(t, &names),
        east_load.answered_by(t, &names)
    );

    let t0 = now_ms();
    Api::<Deployment>::namespaced(east.clone(), &ns.name)
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}}),
            ),
        )
        .await
        .expect("start the rollout");
    let new = settled_web_pods_within(&east, &ns.name, 10, &names, WAIT).await;
    let done = now_ms();
    let new_ips: BTreeSet<String> = new.values().cloned().collect();
    proxy_targets(bed_dir, WEST, &old_ips, true).await;
    proxy_targets(bed_dir, WEST, &new_ips, false).await;
    let t1 = done + TAIL;
    let (w, e) = tokio::join!(west_load.records_past(t1), east_load.records_past(t1));
    let (wt, et) = (Tally::of(&w, t0, t1), Tally::of(&e, t0, t1));
    let first = |t: &Tally| {
        t.fails
            .first()
            .map(|f| {
                format!(
                    "{} (begun {:.1} s after the change, ended after {} ms)",
                    f.why,
                    (f.sent - t0) as f64 / 1000.0,
                    f.took
                )
            })
            .unwrap_or_default()
    };
    Rollout {
        pods: 10,
        rate: RATE,
        rollout_s: (done - t0) as f64 / 1000.0,
        west_sent: wt.sent,
        west_failed: wt.failed,
        west_first_failure: first(&wt),
        east_sent: et.sent,
        east_failed: et.failed,
        east_first_failure: first(&et),
        secs: started.elapsed().as_secs_f64(),
    }
}

fn markdown(f: &Flips, r: Option<&Rollout>, secs: f64, loads: &[String]) -> String {
    let col = |pick: &dyn Fn(&Change) -> f64, ready: Option<bool>| -> Vec<f64> {
        f.changes
            .iter()
            .filter(|c| ready.is_none_or(|r| c.ready == r))
            .map(pick)
            .collect()
    };
    let mut md = String::from(LAST);
    md += &format!(
        "\n\n`XCC_BENCH_DATAPATH=1 scripts/bench`: a fresh bed of two clusters with a node each (east runs `web` and exports it; west runs the daemon, release build, east as its static remote), kube-proxy in nftables mode on each node. Whole run {secs:.0} s; the machine's 1-minute load average {}.\n",
        loads.join(", then ")
    );
    md += &format!(
        "\n### Endpoint change to data path\n\n{} readiness changes of one east pod ({} to not ready, {} back to ready; the pod's readiness probe every 1 s follows `/readiness/off|on` on the pod), each timed from its Ready condition changing in east's API (a watch event) to each node's kube-proxy table gaining or losing the pod's `ip:port` (`nft list table ip kube-proxy` in the node's network namespace, read every {:.0} ms aimed, gaps between reads p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms: the resolution of the rules columns). The next change waited {} ms after both tables had switched (kube-proxy's minSyncPeriod of 1 s). East's own kube-proxy for east's own Service is the floor. ms:\n\n",
        f.changes.len(),
        f.changes.iter().filter(|c| !c.ready).count(),
        f.changes.iter().filter(|c| c.ready).count(),
        POLL.as_millis(),
        f.poll_p50_ms,
        f.poll_p99_ms,
        f.poll_max_ms,
        SETTLE.as_millis(),
    );
    md += "| changes | east's kube-proxy (floor) p50 | p99 | west's kube-proxy (through the follower) p50 | p99 | west minus floor, p99 | east's EndpointSlice p50 | p99 | west's follower slice p50 | p99 | middle part (east's slice to west's, the propagation lag) p50 | p99 |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (label, sel) in [
        ("all", None),
        ("to not ready", Some(false)),
        ("to ready", Some(true)),
    ] {
        let er = col(&|c| c.east_rules, sel);
        let wr = col(&|c| c.west_rules, sel);
        let es = col(&|c| c.east_slice, sel);
        let ws = col(&|c| c.west_slice, sel);
        let mid = col(&|c| c.west_slice - c.east_slice, sel);
        md += &format!(
            "| {label} ({}) | {:.0} | {:.0} | {:.0} | {:.0} | {:+.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.1} | {:.1} |\n",
            er.len(),
            pct(&er, 0.5),
            pct(&er, 0.99),
            pct(&wr, 0.5),
            pct(&wr, 0.99),
            pct(&wr, 0.99) - pct(&er, 0.99),
            pct(&es, 0.5),
            pct(&es, 0.99),
            pct(&ws, 0.5),
            pct(&ws, 0.99),
            pct(&mid, 0.5),
            pct(&mid, 0.99),
        );
    }
    let wr = col(&|c| c.west_rules, None);
    let er = col(&|c| c.east_rules, None);
    let added = pct(&wr, 0.99) - pct(&er, 0.99);
    md += &format!(
        "\nGoal: the cross-cluster path adds less than 100 ms at p99 over the floor: {} ({added:+.0} ms). Part took {:.0} s.\n",
        if added < 100.0 { "met" } else { "missed" },
        f.secs
    );
    let Some(r) = r else {
        md += "\n### Failed requests during a rollout\n\nNot run (XCC_BENCH_DATAPATH_ROLLOUT=0).\n";
        return md;
    };
    md += &format!(
        "\n### Failed requests during a rollout\n\nEast's `web`, {} pods (maxSurge 1, maxUnavailable 0, readiness probe every 1 s, 5 s of serving after SIGTERM), rolled by a template change under open-loop load of {} requests/s per client (`load run`, a new connection and DNS lookup per request, the absolute name `web.<ns>.svc.cluster.local.`): west's client calls the follower, east's calls east's own Service (the floor). Window: from the change to 3 s after the rollout was done ({:.1} s).\n\n| client | requests | failed |\n|---|---:|---:|\n| west (follower) | {} | {} |\n| east (floor) | {} | {} |\n",
        r.pods, r.rate, r.rollout_s, r.west_sent, r.west_failed, r.east_sent, r.east_failed
    );
    for (who, why) in [
        ("west", &r.west_first_failure),
        ("east", &r.east_first_failure),
    ] {
        if !why.is_empty() {
            md += &format!("\n{who}'s first failure: {why}.\n");
        }
    }
    md += &format!(
        "\nGoal: west fails no more than the floor: {}. Part took {:.0} s.\n",
        if r.west_failed <= r.east_failed {
            "met"
        } else {
            "missed"
        },
        r.secs
    );
    md
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn data_path() {
    let started = Instant::now();
    let changes = env_number("XCC_BENCH_DATAPATH_CHANGES", 100);
    let bed_dir = support::bed().await.dir.clone();
    node_cluster(EAST).await;
    node_cluster(WEST).await;
    workload_images(&[EAST, WEST]).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST));
    let mut loads = vec![load_avg()];
    let f = flips(&bed_dir, changes).await;
    loads.push(load_avg());
    let r = if std::env::var("XCC_BENCH_DATAPATH_ROLLOUT").as_deref() == Ok("0") {
        None
    } else {
        let r = rollout(&bed_dir).await;
        loads.push(load_avg());
        Some(r)
    };
    let secs = started.elapsed().as_secs_f64();
    let section = markdown(&f, r.as_ref(), secs, &loads);
    write_results(
        &section,
        "datapath",
        json!({"changes": f, "rollout": r, "secs": secs, "load_avg": loads}),
    );
    println!("{section}");
}
