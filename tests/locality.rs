//! Locality across clusters, with plain kube-proxy (issue 28): west and east both export `web`
//! with `trafficDistribution: PreferClose`; the daemon in west imports it with hints on its
//! slices. A west client calling `web.<ns>.svc.clusterset.local` is answered only by west's
//! pods (those of its own zone first) while they are ready, by east's when west's are scaled to
//! 0, and by west's again when they return, every request answered.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_flag};
use support::node::{node_cluster, node_cluster_with, wait_dns, workload_images};
use support::traffic::{self, Load, Rec, Tally, now_ms, settled_web_pods};
use support::{client, eventually, namespace_in};

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

async fn scale(c: &Client, ns: &str, replicas: i32) {
    let patch = json!({"spec": {"replicas": replicas}});
    Api::<Deployment>::namespaced(c.clone(), ns)
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("scale west's web to {replicas}: {e}"));
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

/// The hints of the import's slices, once every ready endpoint has them: (source cluster,
/// address) to the zones named.
async fn hinted(
    west: &Client,
    ns: &str,
    clusters: usize,
) -> BTreeMap<(String, String), Vec<String>> {
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), ns);
    let lp = ListParams::default().labels("multicluster.kubernetes.io/service-name=web,endpointslice.kubernetes.io/managed-by=cross-cluster-controller.fair.com");
    eventually(
        "the import's slices with hints on every ready endpoint",
        WAIT,
        || async {
            let list = slices.list(&lp).await.map_err(|e| e.to_string())?;
            let mut out = BTreeMap::new();
            let mut sources = BTreeSet::new();
            for s in &list.items {
                let source = s
                    .labels()
                    .get("multicluster.kubernetes.io/source-cluster")
                    .cloned()
                    .unwrap_or_default();
                sources.insert(source.clone());
                for e in s
                    .endpoints
                    .iter()
                    .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(true))
                {
                    let zones: Vec<String> = e
                        .hints
                        .as_ref()
                        .and_then(|h| h.for_zones.as_ref())
                        .map(|z| z.iter().map(|z| z.name.clone()).collect())
                        .unwrap_or_default();
                    if zones.is_empty() {
                        return Err(format!("{source}'s {:?} has no zone hints", e.addresses));
                    }
                    out.insert((source.clone(), e.addresses[0].clone()), zones);
                }
            }
            if sources.len() == clusters && out.len() == 4 {
                Ok(out)
            } else {
                Err(format!("sources {sources:?}, ready endpoints {out:?}"))
            }
        },
    )
    .await
}

/// Waits until a request begun after `from` has been answered by east and the requests after
/// the last one east answered are `n` answers of west's: the last east answer's time.
async fn home_again(load: &Load, from: i64, west: &BTreeSet<String>, n: usize) -> i64 {
    eventually("west's client answered by west again", WAIT, || async {
        let recs = load.records().await?;
        let after: Vec<&Rec> = recs.iter().filter(|r| r.sent >= from).collect();
        let last_east = after
            .iter()
            .filter(|r| r.ok && r.cluster == EAST)
            .map(|r| r.sent)
            .max();
        let since = last_east.unwrap_or(from);
        let home = after
            .iter()
            .filter(|r| r.sent > since && r.ok && west.contains(&r.pod))
            .count();
        if home >= n {
            Ok(since)
        } else {
            Err(format!("{home} west answers since {since}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_west_client_stays_home_fails_over_to_east_and_comes_back() {
    node_cluster(EAST).await;
    node_cluster_with(WEST, 2).await;
    workload_images(&[EAST, WEST]).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST));
    let ns = namespace_in("locality", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    web(&east, &ns.name, EAST).await;
    web(&west, &ns.name, WEST).await;
    let none = BTreeSet::new();
    let east_pods = settled_web_pods(&east, &ns.name, 2, &none).await;
    let west_pods = settled_web_pods(&west, &ns.name, 2, &none).await;

    let mut args = with_flag(
        with_flag(args_for(&ns.name), "--local-context", WEST),
        "--remote-context",
        EAST,
    );
    args.extend(["--mcs", "--local-cluster-name", "west"].map(String::from));
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

    let url = format!("http://web.{}.svc.clusterset.local/", ns.name);
    let load = Load::start(&west, WEST, &ns.name, "load", &url, RATE).await;
    // healthy: no request leaves west, and those of its zone's pods stay in the zone
    let t0 = load
        .answered_by(now_ms(), &BTreeSet::new())
        .await
        .max(now_ms());
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
    scale(&west, &ns.name, 0).await;
    let east_names: BTreeSet<String> = east_pods.keys().cloned().collect();
    let first_east = load.answered_by(t1, &east_names).await;
    settled_web_pods(&west, &ns.name, 0, &none).await;
    let t2 = now_ms();
    let recs = load.records_past(t2 + TAIL).await;
    let failover = Tally::of(&recs, t1, t2 + TAIL);
    assert_eq!(failover.failed, 0, "failover: {}", failover.figures());

    // failback: west's pods return, and west's client goes home
    let t3 = now_ms();
    scale(&west, &ns.name, 2).await;
    let old: BTreeSet<String> = west_pods.keys().cloned().collect();
    let back = settled_web_pods(&west, &ns.name, 2, &old).await;
    let ready_at = now_ms();
    let back_names: BTreeSet<String> = back.keys().cloned().collect();
    let last_east = home_again(&load, t3, &back_names, 2 * RATE as usize).await;
    let t4 = now_ms();
    let recs = load.records_past(t4).await;
    let failback = Tally::of(&recs, t3, t4);
    assert_eq!(failback.failed, 0, "failback: {}", failback.figures());
    let home_ms = last_east - ready_at;
    assert!(
        home_ms < 10_000,
        "west's client went home {home_ms} ms after west's pods were ready"
    );
    println!(
        "locality: healthy {} (all west); failover {} (first east answer {} ms after the scale to 0); failback {} (last east answer {home_ms} ms after west's pods were ready)",
        healthy.figures(),
        failover.figures(),
        first_east - t1,
        failback.figures()
    );
}
