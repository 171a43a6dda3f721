//! Locality across clusters, with plain kube-proxy (issue 28): west and east both export `web`
//! with `trafficDistribution: PreferClose`; the daemon in west imports it with hints on its
//! slices. A west client calling `web.<ns>.svc.clusterset.local` is answered only by west's
//! pods (those of its own zone first) while they are ready, by east's when west's are scaled to
//! 0, and by west's again when they return, every request answered. Then the same failovers
//! side by side with their floor: the same event inside one cluster, where a Service with
//! `PreferClose` loses the half of its pods in its client's zone and its other half stays:
//! scaled to 0, back, killed in place, and their node unplugged (west's third node, which shares
//! zone a with the clients' node).
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::Daemon;
use support::fault::{Lost, Report, Snapshot, conclude, snapshot};
use support::locality::{
    Beside, SliceClock, hinted, ips, mcs_daemon_args, names, ready_pods, settled_on,
};
use support::node::{exec, node_cluster, node_cluster_with, wait_dns, workload_images};
use support::traffic::{self, Load, Tally, now_ms, settled_web_pods};
use support::{BedUndo, bed_do, client, eventually, namespace_in};

/// The clusters of tests/traffic.rs (west with two nodes, in zones traffic-west-a and -b).
const EAST: &str = "traffic-east";
const WEST: &str = "traffic-west";
/// Requests a second of the client.
const RATE: u32 = 20;
/// How long the healthy window lasts (ms): enough requests to catch a share sent away.
const HEALTHY_MS: i64 = 10_000;
/// How far past an event's end its window reaches (ms).
const TAIL: i64 = 3000;
/// The zone a ready endpoint no local zone chose names (`desired::mcs::ELSEWHERE`).
const ELSEWHERE: &str = "cross-cluster-elsewhere";
const WAIT: Duration = Duration::from_secs(120);

/// The non-followers of `ns` the daemon changed between two snapshots: the endpoints of the
/// test's own Services (`services`), which its scaling and killing change, left out. Their
/// Services themselves must stay as they were: exported, imported, never written.
fn touched_by_the_daemon(
    before: &Snapshot,
    after: &Snapshot,
    ns: &str,
    services: &[&str],
) -> Vec<String> {
    before
        .non_followers_touched(after)
        .into_iter()
        .filter(|o| {
            !services.iter().any(|s| {
                *o == format!("Endpoints {ns}/{s}")
                    || o.starts_with(&format!("EndpointSlice {ns}/{s}-"))
            })
        })
        .collect()
}

/// `web` (2 pods) in `cluster`, its Service asking for PreferClose, exported.
async fn web(c: &Client, ns: &str, cluster: &str) {
    traffic::web(c, ns, cluster, 2, false).await;
    let patch = json!({"spec": {"trafficDistribution": "PreferClose"}});
    Api::<Service>::namespaced(c.clone(), ns)
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("{cluster}: PreferClose on web: {e}"));
    support::mcs::export(c, ns, "web").await;
}

/// The zone of each pod's node: pod name to zone.
async fn zones_of(
    c: &Client,
    ns: &str,
    pods: impl Iterator<Item = &String>,
) -> BTreeMap<String, String> {
    let (pod_api, nodes) = (
        Api::<Pod>::namespaced(c.clone(), ns),
        Api::<Node>::all(c.clone()),
    );
    let mut out = BTreeMap::new();
    for name in pods {
        let pod = pod_api.get(name).await.expect("a pod");
        let node = pod.spec.and_then(|s| s.node_name).expect("a scheduled pod");
        let zone = nodes
            .get(&node)
            .await
            .expect("its node")
            .labels()
            .get("topology.kubernetes.io/zone")
            .cloned()
            .unwrap_or_default();
        out.insert(name.clone(), zone);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_west_client_stays_home_fails_over_to_east_and_comes_back() {
    node_cluster(EAST).await;
    node_cluster_with(WEST, 3).await;
    workload_images(&[EAST, WEST]).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST));
    let ns = namespace_in("locality", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    web(&east, &ns.name, EAST).await;
    web(&west, &ns.name, WEST).await;
    let none = BTreeSet::new();
    let east_pods = settled_web_pods(&east, &ns.name, 2, &none).await;
    let west_pods = settled_web_pods(&west, &ns.name, 2, &none).await;

    let args = mcs_daemon_args(&ns.name, WEST, EAST);
    let before = snapshot(&west, &[&ns.name]).await;
    let _daemon = Daemon::start(&args).await;
    // the hints: west's endpoints name west's zones, east's none of them
    let hints = hinted(&west, &ns.name, 2).await;
    let west_ips: BTreeSet<&String> = west_pods.values().collect();
    for ((source, ip), zones) in &hints {
        if source == "west" {
            assert!(west_ips.contains(ip), "{ip} is not west's: {hints:?}");
            assert!(
                zones.iter().all(|z| z.starts_with("traffic-west-")),
                "{hints:?}"
            );
        } else {
            assert_eq!(zones, &[ELSEWHERE], "{hints:?}");
        }
    }

    // the import tells how many endpoints of each cluster are ready
    let two = json!({"ready": 2, "total": 2});
    support::mcs::import_endpoints(&west, &ns.name, "web", json!({ EAST: two, "west": two })).await;

    let url = format!("http://web.{}.svc.clusterset.local/", ns.name);
    let load = Load::start(&west, WEST, &ns.name, "load", &url, RATE).await;
    // healthy: no request leaves west, and those of its zone's pods stay in the zone. Measured
    // once the client's node has programmed the import (its first answers may come before its
    // kube-proxy applied the hints, under load): the window opens after a second of answers by
    // west alone, and a request to east after that fails the test
    let started = load.answered_by(now_ms(), &BTreeSet::new()).await;
    let west_names: BTreeSet<String> = west_pods.keys().cloned().collect();
    settled_on(&load, started, west_names, RATE as usize).await;
    let t0 = now_ms();
    let recs = load.records_past(t0 + HEALTHY_MS).await;
    let healthy = Tally::of(&recs, t0, t0 + HEALTHY_MS);
    assert!(healthy.sent >= (RATE as usize) * 5, "{}", healthy.figures());
    assert_eq!(healthy.failed, 0, "{}", healthy.figures());
    assert_eq!(
        healthy.by_cluster.keys().collect::<Vec<_>>(),
        [WEST],
        "a west request reached east while west was healthy: {:?}",
        healthy.by_pod
    );
    let zones = zones_of(&west, &ns.name, west_pods.keys()).await;
    let client_zone = zones_of(&west, &ns.name, ["load".to_string()].iter()).await["load"].clone();
    let same_zone: BTreeSet<&String> = zones
        .iter()
        .filter(|(_, z)| **z == client_zone)
        .map(|(p, _)| p)
        .collect();
    if !same_zone.is_empty() {
        assert!(
            healthy.by_pod.keys().all(|p| same_zone.contains(p)),
            "the client in {client_zone} was answered outside its zone ({zones:?}): {:?}",
            healthy.by_pod
        );
    }

    // failover: west's pods scaled to 0 gracefully
    let t1 = now_ms();
    scale_deployment(&west, &ns.name, "web", 0).await;
    let east_names: BTreeSet<String> = east_pods.keys().cloned().collect();
    let first_east = load.answered_by(t1, &east_names).await;
    settled_web_pods(&west, &ns.name, 0, &none).await;
    let t2 = now_ms();
    let recs = load.records_past(t2 + TAIL).await;
    let failover = Tally::of(&recs, t1, t2 + TAIL);
    assert_eq!(failover.failed, 0, "failover: {}", failover.figures());
    let none_left = json!({"ready": 0, "total": 0});
    support::mcs::import_endpoints(
        &west,
        &ns.name,
        "web",
        json!({ EAST: two, "west": none_left }),
    )
    .await;

    // failback: west's pods return, and west's client goes home
    let t3 = now_ms();
    scale_deployment(&west, &ns.name, "web", 2).await;
    let old: BTreeSet<String> = west_pods.keys().cloned().collect();
    let back = settled_web_pods(&west, &ns.name, 2, &old).await;
    let ready_at = now_ms();
    let back_names: BTreeSet<String> = back.keys().cloned().collect();
    let last_away = settled_on(&load, t3, back_names, 2 * RATE as usize).await;
    let t4 = now_ms();
    let recs = load.records_past(t4).await;
    let failback = Tally::of(&recs, t3, t4);
    assert_eq!(failback.failed, 0, "failback: {}", failback.figures());
    support::mcs::import_endpoints(&west, &ns.name, "web", json!({ EAST: two, "west": two })).await;
    let home_ms = last_away - ready_at;
    assert!(
        home_ms < 10_000,
        "west's client went home {home_ms} ms after west's pods were ready"
    );
    let note = format!(
        "healthy {} (all west); failover {} (first east answer {} ms after the scale to 0); failback {} (its last answer from elsewhere {home_ms} ms after west's new pods were ready)",
        healthy.figures(),
        failover.figures(),
        first_east - t1,
        failback.figures()
    );
    println!("locality: {note}");
    let after = snapshot(&west, &[&ns.name]).await;
    conclude(
        Report {
            id: "89-locality-prefer-close",
            scenario: "west and east both export web (2 pods each) with trafficDistribution PreferClose; a west client calls web.<ns>.svc.clusterset.local at 20 requests/s",
            done: "a daemon with --mcs in west reading east; west's web scaled to 0, then back to 2",
            converge: None,
            note,
        },
        &Lost::nothing_to_lose(),
        &touched_by_the_daemon(&before, &after, &ns.name, &["web"]),
    );
}

// ---- failover against its floor (issue 28, part 2) -------------------------------------------

// West's nodes (testbed/node.sh's `node_zone`): nodes 1 and 3 in zone traffic-west-a, node 2 in
// traffic-west-b. The clients run on node 1; the zone-a halves on node 3, which is unplugged
// (the set-up: tests/support/locality.rs).

/// Waits until every pod labelled `selector` has restarted its container and is ready again.
async fn restarted(c: &Client, ns: &str, selector: &str) {
    let api: Api<Pod> = Api::namespaced(c.clone(), ns);
    let lp = ListParams::default().labels(selector);
    eventually(
        &format!("pods {selector} restarted and ready"),
        WAIT,
        || async {
            let list = api.list(&lp).await.map_err(|e| e.to_string())?;
            let restarts: Vec<i32> = list
                .items
                .iter()
                .map(|p| {
                    let statuses = p
                        .status
                        .as_ref()
                        .and_then(|s| s.container_statuses.as_ref());
                    let n = statuses
                        .into_iter()
                        .flatten()
                        .map(|c| c.restart_count)
                        .sum::<i32>();
                    if support::node::pod_ready(p) { n } else { 0 }
                })
                .collect();
            if !restarts.is_empty() && restarts.iter().all(|n| *n >= 1) {
                Ok(())
            } else {
                Err(format!("restarts of the ready ones: {restarts:?}"))
            }
        },
    )
    .await;
}

async fn scale_deployment(c: &Client, ns: &str, name: &str, replicas: i32) {
    let patch = json!({"spec": {"replicas": replicas}});
    Api::<Deployment>::namespaced(c.clone(), ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("scale {name} to {replicas}: {e}"));
}

/// GET /exit on each of `pods`' addresses, one after another from one exec into `client` (a load
/// pod of `cluster`): each web process exits at once, as if killed, and its kubelet restarts it
/// in place. One exec, so both sides' pods die within milliseconds of each other: on one node,
/// one kubelet notices them in the same relist.
async fn kill(cluster: &'static str, ns: &str, client: &str, pods: &[&BTreeMap<String, String>]) {
    let urls: Vec<String> = pods
        .iter()
        .flat_map(|m| m.values())
        .map(|ip| format!("http://{ip}:8080/exit"))
        .collect();
    let (ns, client) = (ns.to_string(), client.to_string());
    let out = tokio::task::spawn_blocking(move || {
        let mut args = vec!["/load", "get"];
        args.extend(urls.iter().map(String::as_str));
        exec(cluster, &ns, &client, &args)
    })
    .await
    .expect("exec task");
    // no answer comes: every get fails once its process is gone
    assert!(out.is_err(), "a web process answered /exit: {out:?}");
}

/// How many answers of `t` came from `pods`.
fn answers_by(t: &Tally, pods: &BTreeSet<String>) -> usize {
    t.by_pod
        .iter()
        .filter(|(p, _)| pods.contains(*p))
        .map(|(_, n)| n)
        .sum()
}

/// One event's counts: (the cross-cluster client's tally, the floor client's tally).
fn side_by_side(what: &str, west: &Tally, floor: &Tally) -> String {
    format!(
        "{what}: west via the import {}; floor {}",
        west.figures(),
        floor.figures()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_loses_no_more_than_the_same_failover_inside_one_cluster() {
    node_cluster(EAST).await;
    node_cluster_with(WEST, 3).await;
    workload_images(&[EAST, WEST]).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST));
    let b = Beside::set_up(EAST, WEST, "locality-floor").await;
    let (ns, west) = (&b.ns, b.west.clone());
    let (east_web, floor_b) = (b.east_web.clone(), b.floor_b.clone());
    // both clients on node 1 (zone a), home
    let (load, floor) = b.clients("load", "floor-load", RATE, false).await;

    // 1. graceful: both zone-a halves scaled to 0 at once
    let t1 = now_ms();
    tokio::join!(
        scale_deployment(&west, &ns.name, "web", 0),
        scale_deployment(&west, &ns.name, "floor-a", 0)
    );
    let away = tokio::join!(
        settled_on(&load, t1, names(&east_web), 2 * RATE as usize),
        settled_on(&floor, t1, names(&floor_b), 2 * RATE as usize)
    );
    ready_pods(&west, &ns.name, "half=web", 0).await;
    ready_pods(&west, &ns.name, "half=floor-a", 0).await;
    let t2 = now_ms() + TAIL;
    let graceful = (
        Tally::of(&load.records_past(t2).await, t1, t2),
        Tally::of(&floor.records_past(t2).await, t1, t2),
    );

    // 2. failback: both halves back; each client goes home
    let t3 = now_ms();
    tokio::join!(
        scale_deployment(&west, &ns.name, "web", 2),
        scale_deployment(&west, &ns.name, "floor-a", 2)
    );
    let west_web = ready_pods(&west, &ns.name, "half=web", 2).await;
    let floor_a = ready_pods(&west, &ns.name, "half=floor-a", 2).await;
    let ready_at = now_ms();
    let (home, floor_home) = tokio::join!(
        settled_on(&load, t3, names(&west_web), 2 * RATE as usize),
        settled_on(&floor, t3, names(&floor_a), 2 * RATE as usize)
    );
    let t4 = now_ms();
    let failback = (
        Tally::of(&load.records_past(t4).await, t3, t4),
        Tally::of(&floor.records_past(t4).await, t3, t4),
    );

    // 3. killed: every zone-a web process of both exits at once; the kubelets restart them
    let t5 = now_ms();
    kill(WEST, &ns.name, "load", &[&west_web, &floor_a]).await;
    // both restarted in place and ready again, then home again
    tokio::join!(
        restarted(&west, &ns.name, "half=web"),
        restarted(&west, &ns.name, "half=floor-a")
    );
    let (back, floor_back) = tokio::join!(
        settled_on(&load, t5, names(&west_web), 2 * RATE as usize),
        settled_on(&floor, t5, names(&floor_a), 2 * RATE as usize)
    );
    let t6 = now_ms() + TAIL;
    let killed = (
        Tally::of(&load.records_past(t6).await, t5, t6),
        Tally::of(&floor.records_past(t6).await, t5, t6),
    );

    // 4. unplugged: node 3, where both zone-a halves run, off the network without a word (its
    // pods run on, unreachable; their kubelet's probes fail, so they turn not ready), then
    // plugged in again
    let _plug = BedUndo(&["plug", WEST, "3"]);
    let clock = SliceClock::start(&west, &ns.name).await;
    let t7 = now_ms();
    bed_do(&["unplug", WEST, "3"]).await;
    let (gone, floor_gone) = tokio::join!(
        settled_on(&load, t7, names(&east_web), 2 * RATE as usize),
        settled_on(&floor, t7, names(&floor_b), 2 * RATE as usize)
    );
    // when the slices turned the zone-a halves not ready: the floor's, west's own `web`'s (both
    // the endpoint slice controller's) and the import's (ours, following west's `web`)
    let (floor_cut, web_cut, import_cut) = (
        clock.none_ready("floor", &ips(&floor_a), t7).await,
        clock.none_ready("web", &ips(&west_web), t7).await,
        clock.none_ready("import:web", &ips(&west_web), t7).await,
    );
    drop(clock);
    let t8 = now_ms();
    bed_do(&["plug", WEST, "3"]).await;
    let (home3, floor_home3) = tokio::join!(
        settled_on(&load, t8, names(&west_web), 2 * RATE as usize),
        settled_on(&floor, t8, names(&floor_a), 2 * RATE as usize)
    );
    let t9 = now_ms() + TAIL;
    let unplugged = (
        Tally::of(&load.records_past(t9).await, t7, t9),
        Tally::of(&floor.records_past(t9).await, t7, t9),
    );

    let report = [
        side_by_side("graceful scale to 0", &graceful.0, &graceful.1),
        format!("  away: west's client on east's pods alone after {} ms, the floor's on zone b alone after {} ms", away.0 - t1, away.1 - t1),
        side_by_side("failback", &failback.0, &failback.1),
        format!("  home {} ms (floor {} ms) after the pods were ready", home - ready_at, floor_home - ready_at),
        side_by_side("killed (restarted in place)", &killed.0, &killed.1),
        format!(
            "  home again {} ms (floor {} ms) after the kill; meanwhile answered by east {} times (the floor by zone b {} times): a kill the kubelet restarts before it reports the pod not ready fails over nowhere, in-cluster too",
            back - t5,
            floor_back - t5,
            answers_by(&killed.0, &names(&east_web)),
            answers_by(&killed.1, &names(&floor_b))
        ),
        side_by_side("node unplugged, then plugged in", &unplugged.0, &unplugged.1),
        format!(
            "  away: west's client on east's pods alone after {} ms, the floor's on zone b alone after {} ms; home {} ms (floor {} ms) after the plug",
            gone - t7,
            floor_gone - t7,
            home3 - t8,
            floor_home3 - t8
        ),
        format!(
            "  the slices without the zone-a halves: the floor's {} ms after the unplug, west's own web's {} ms, the import's (ours) {} ms",
            floor_cut - t7,
            web_cut - t7,
            import_cut - t7
        ),
    ]
    .join("\n");
    println!("{report}");
    let after = snapshot(&west, &[&ns.name]).await;
    let touched = touched_by_the_daemon(&b.before, &after, &ns.name, &["web", "floor"]);
    conclude(
        Report {
            id: "90-locality-failover-floor",
            scenario: "the import of web (west's 2 pods on node 3 in zone a, east's 2; PreferClose) beside its floor, one west Service floor (PreferClose) with 2 pods on node 3 (zone a) and 2 on node 2 (zone b); both clients on node 1 (zone a), 20 requests/s each",
            done: "each zone-a half, at once: scaled to 0, scaled back, killed in place (GET /exit, restarted by its kubelet), then node 3 unplugged (bed unplug) and plugged in again",
            converge: None,
            note: report.replace('\n', " "),
        },
        &Lost::nothing_to_lose(),
        &touched,
    );
    // the import's slice follows west's own by the mirror's lag (tens of ms), and west's own may
    // follow the floor's (the endpoint slice controller's order): a kube-proxy that synced on
    // any change just before ours waits its minSyncPeriod (1 s) before it syncs ours. So the
    // import's rules change at most 1 s after its slice did, and the floor's no earlier than its
    // slice did: RATE requests a second over that, and a quarter second for kube-proxy's rule
    // write itself, which takes longer under load. A kill: the kubelet restarts the process at
    // once, and its probes may turn it not ready meanwhile; one sync period
    let per_ms = |ms: i64| (RATE as u64 * ms.max(0) as u64).div_ceil(1000) as usize;
    let slack = per_ms(1000);
    let unplugged_slack = per_ms(1000 + 250 + (import_cut - floor_cut).max(0));
    for (what, (ours, floor), allowed) in [
        ("graceful", &graceful, 0),
        ("failback", &failback, 0),
        ("killed", &killed, slack),
        ("unplugged", &unplugged, unplugged_slack),
    ] {
        assert!(
            ours.failed <= floor.failed + allowed,
            "{what}: more failures than the floor (+{allowed}):\n{report}"
        );
    }
}
