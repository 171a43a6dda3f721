//! A remote whose pods cannot be reached while its API server answers (issue 28, part 3): the
//! case no watch shows. The daemon runs as the chart installs it by default, a pod on west's pod
//! network (no hostNetwork), reading east and north from remote Secrets; north's Secret opts in to
//! the data-path probe. Then the peering between west's and north's pod networks is cut
//! (`bed cut`: forwarded packets dropped both ways, the API servers and each cluster's own
//! kubelets untouched, so north's pods stay Ready in north): west's client calling the follower
//! loses the requests kube-proxy sends to north until the probe cuts north off, then none; the
//! follower and its slices stay, north's endpoints published not ready. The same for the MCS
//! import of web (both remotes also export it with a ServiceExport; the chart with
//! `mcs.enabled`): a second client on `web.<ns>.svc.clusterset.local`, and the import's
//! annotation telling north's endpoints 0 of 2 ready, cut off. Mended: restored.
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde_json::json;
use support::fault::{Lost, Report, conclude, snapshot};
use support::metrics::series_value;
use support::node::{
    chart_image, node_cluster, node_cluster_with, pod_admin_get, pod_network_server, pod_ready,
    release_pod, wait_dns, workload_images,
};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret};
use support::tools::{CHART, helm};
use support::traffic::{self, Load, Tally, now_ms, settled_web_pods};
use support::{BedUndo, bed, bed_do, client, eventually, namespace_in};

/// The clusters of tests/traffic.rs.
const EAST: &str = "traffic-east";
const WEST: &str = "traffic-west";
const NORTH: &str = "traffic-north";
const RELEASE: &str = "xcc";
/// Requests a second of the client.
const RATE: u32 = 20;
/// North's Secret's `fair.com/cross-cluster-probe-after`.
const PROBE_AFTER_S: i64 = 3;
/// The chart's admin port (its default).
const ADMIN_PORT: u16 = 8080;
/// How long the window after the cut-off lasts (ms).
const AFTER_MS: i64 = 5000;
const WAIT: Duration = Duration::from_secs(120);

/// `cluster`'s kubeconfig as a pod reaches it: the address its `kubernetes` Service sends to
/// (its API server on the bed's network), not the bed's loopback, which a pod cannot reach.
async fn pod_network_kubeconfig(cluster: &str) -> String {
    let server = pod_network_server(cluster).await;
    kubeconfig_of(cluster, |kc| {
        for c in kc.clusters.iter_mut().filter(|c| c.name == cluster) {
            if let Some(c) = c.cluster.as_mut() {
                c.server = Some(server.clone());
            }
        }
    })
    .await
}

/// The remote Secrets in west: east without the probe, north with it.
async fn remote_secrets(west: &Client, ns: &str) {
    let secrets: Api<Secret> = Api::namespaced(west.clone(), ns);
    for (name, cluster, probe) in [("east", EAST, false), ("north", NORTH, true)] {
        let kc = pod_network_kubeconfig(cluster).await;
        let mut s = remote_secret(name, None, Some(&kc));
        if probe {
            s.metadata.annotations = Some(
                [(
                    "fair.com/cross-cluster-probe-after".to_string(),
                    format!("{PROBE_AFTER_S}s"),
                )]
                .into(),
            );
        }
        apply_secret(&secrets, &s).await;
    }
}

/// The chart with its defaults where they matter here (one replica on the pod network, the
/// admin port on the pod's address), this test's namespace and image.
async fn install_chart(ns: &str) {
    let bed = bed().await;
    let mut c = helm(&bed.kubeconfig);
    c.args(["install", RELEASE, CHART, "--kube-context", WEST, "-n", ns]);
    for s in [
        "image.repository=localhost/cross-cluster-controller".to_string(),
        "image.tag=dev".into(),
        "image.pullPolicy=Never".into(),
        "replicaCount=1".into(),
        format!("watchNamespaces={{{ns}}}"),
        "leaseDurationSeconds=6".into(),
        format!("fullnameOverride={}", fullname(ns)),
        "remoteReader.enabled=false".into(),
        "mcs.enabled=true".into(),
        "mcs.clusterName=west".into(),
        "mcs.crds=false".into(),
    ] {
        c.args(["--set", &s]);
    }
    tokio::task::spawn_blocking(move || support::tools::run(&mut c))
        .await
        .expect("helm task");
}

/// The release's full name (and so its election Lease's name).
fn fullname(ns: &str) -> String {
    format!("xcc-{}", &ns[ns.len() - 8..])
}

/// `cross-cluster-controller status` (a table) against west for this test's release: (exit
/// code, what it printed).
async fn status(ns: &str) -> (i32, String) {
    let kc = bed().await.kubeconfig.clone();
    let ns = ns.to_string();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(env!("CARGO_BIN_EXE_cross-cluster-controller"))
            .arg("status")
            .arg("--kubeconfig")
            .arg(&kc)
            .args([
                "--context",
                WEST,
                "--namespace",
                &ns,
                "--watch-namespace",
                &ns,
            ])
            .args(["--lease-name", &fullname(&ns)])
            .output()
            .expect("run status")
    })
    .await
    .expect("status task");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// The daemon's metrics, read from its pod's address as Prometheus would.
async fn metrics(ip: &str) -> Result<String, String> {
    pod_admin_get(ip, ADMIN_PORT, "/metrics").await
}

/// Waits until the series reads `want` (`at_least`: or more): when it first did.
async fn wait_series(
    ip: &str,
    name: &str,
    labels: &[(&str, &str)],
    want: f64,
    at_least: bool,
) -> i64 {
    let op = if at_least { ">=" } else { "==" };
    let what = support::metrics::series_text(name, labels) + &format!(" {op} {want}");
    eventually(&what, WAIT, || async {
        let v = series_value(&metrics(ip).await?, name, labels)?;
        let done = if at_least { v >= want } else { v == want };
        done.then(now_ms).ok_or_else(|| format!("{v}"))
    })
    .await
}

/// The endpoints at `ips` with their (ready, serving) conditions in the slices labelled
/// `selector`: the follower's, or the import's.
async fn published(
    west: &Client,
    ns: &str,
    selector: &str,
    ips: &BTreeSet<String>,
) -> Vec<(String, bool, bool)> {
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), ns);
    let lp = ListParams::default().labels(selector);
    let list = slices.list(&lp).await.expect("the follower's slices");
    let mut out = Vec::new();
    for e in list.items.iter().flat_map(|s| s.endpoints.iter()) {
        for a in e.addresses.iter().filter(|a| ips.contains(*a)) {
            let c = e.conditions.as_ref();
            out.push((
                a.clone(),
                c.and_then(|c| c.ready).unwrap_or(true),
                c.and_then(|c| c.serving).unwrap_or(true),
            ));
        }
    }
    out.sort();
    out
}

const FOLLOWER: &str = "kubernetes.io/service-name=web";
const IMPORT: &str = "multicluster.kubernetes.io/service-name=web";

/// Every web pod of `c`'s `ns` Ready, as its own kubelet sees it.
async fn all_ready(c: &Client, ns: &str) -> bool {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    let lp = ListParams::default().labels("app=web");
    let list = pods.list(&lp).await.expect("web pods");
    !list.items.is_empty() && list.items.iter().all(pod_ready)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_whose_pods_cannot_be_reached_is_cut_off_and_restored_deleting_nothing() {
    node_cluster(EAST).await;
    node_cluster_with(WEST, 2).await;
    node_cluster(NORTH).await;
    workload_images(&[EAST, WEST, NORTH]).await;
    chart_image(WEST).await;
    tokio::join!(wait_dns(EAST), wait_dns(WEST), wait_dns(NORTH));
    let ns = namespace_in("data-path", &[EAST, WEST, NORTH]).await;
    let (east, west, north) = (client(EAST).await, client(WEST).await, client(NORTH).await);
    tokio::join!(
        traffic::web(&east, &ns.name, EAST, 2, true),
        traffic::web(&north, &ns.name, NORTH, 2, true)
    );
    let none = BTreeSet::new();
    let east_pods = settled_web_pods(&east, &ns.name, 2, &none).await;
    let north_pods = settled_web_pods(&north, &ns.name, 2, &none).await;
    let north_ips: BTreeSet<String> = north_pods.values().cloned().collect();
    tokio::join!(
        support::mcs::export(&east, &ns.name, "web"),
        support::mcs::export(&north, &ns.name, "web")
    );
    remote_secrets(&west, &ns.name).await;
    install_chart(&ns.name).await;
    let pods: Api<Pod> = Api::namespaced(west.clone(), &ns.name);
    let (pod, ip) = release_pod(&pods, RELEASE, WAIT).await;
    let logs = || async {
        pods.logs(&pod, &LogParams::default())
            .await
            .unwrap_or_else(|e| format!("(no log: {e})"))
    };

    // both remotes behind west's follower, north probed and reachable
    let bed_dir = bed().await.dir.clone();
    traffic::proxy_targets(&bed_dir, WEST, &north_ips, false).await;
    let url = format!("http://web.{}.svc.cluster.local/", ns.name);
    let load = Load::start(&west, WEST, &ns.name, "load", &url, RATE).await;
    let mcs_url = format!("http://web.{}.svc.clusterset.local/", ns.name);
    let mcs_load = Load::start(&west, WEST, &ns.name, "mcs-load", &mcs_url, RATE).await;
    let both: BTreeSet<String> = east_pods.keys().chain(north_pods.keys()).cloned().collect();
    let t = now_ms();
    tokio::join!(load.answered_by(t, &both), mcs_load.answered_by(t, &both));
    let healthy = json!({"east": {"ready": 2, "total": 2}, "north": {"ready": 2, "total": 2}});
    support::mcs::import_endpoints(&west, &ns.name, "web", healthy.clone()).await;
    let reachable = [("remote", "north"), ("outcome", "reachable")];
    wait_series(&ip, "xcc_remote_probes_total", &reachable, 1.0, true).await;
    let text = metrics(&ip).await.expect("metrics");
    assert_eq!(
        series_value(&text, "xcc_remote_cut_off", &[("remote", "north")]),
        Ok(0.0)
    );
    assert!(
        series_value(&text, "xcc_remote_cut_off", &[("remote", "east")]).is_err(),
        "east has no probe"
    );

    // the peering cut: north's pods run on, Ready in north, unreachable from west
    let before = snapshot(&west, &[&ns.name]).await;
    let _mend = BedUndo(&["mend", WEST, NORTH]);
    let capture = traffic::SynCapture::start(&bed_dir, WEST);
    let t0 = now_ms();
    bed_do(&["cut", WEST, NORTH]).await;
    let cut_off = wait_series(
        &ip,
        "xcc_remote_cut_off",
        &[("remote", "north")],
        1.0,
        false,
    )
    .await;
    let cut = traffic::proxy_targets(&bed_dir, WEST, &north_ips, true).await;
    let cut_off_json = json!({"east": {"ready": 2, "total": 2},
                              "north": {"ready": 0, "total": 2, "cutOff": true}});
    support::mcs::import_endpoints(&west, &ns.name, "web", cut_off_json).await;
    let (code, table) = status(&ns.name).await;
    let recs = load.records_past(cut + AFTER_MS).await;
    let (early, late) = (
        Tally::of(&recs, t0, cut),
        Tally::of(&recs, cut, cut + AFTER_MS),
    );
    let recs = mcs_load.records_past(cut + AFTER_MS).await;
    let (mcs_early, mcs_late) = (
        Tally::of(&recs, t0, cut),
        Tally::of(&recs, cut, cut + AFTER_MS),
    );
    // where a request that failed after the cut-off went: its time, and the flows west's nodes
    // still track towards north or leave unanswered by east (a SYN of a post-cut request sent to
    // north would show as a flow whose remaining timeout is under 120 s by less than the time
    // since the cut-off)
    // each with the flows west's nodes track from its local port (any state, any target)
    let west_flows = traffic::flows(&bed_dir, WEST);
    let failed_after = |recs: &[traffic::Rec], who: &str| -> Vec<String> {
        (recs.iter())
            .filter(|r| r.sent >= cut && r.sent < cut + AFTER_MS && !r.ok)
            .map(|r| {
                let after = r.sent - cut;
                let port = traffic::failed_port(&r.why);
                let flows: Vec<&String> = (west_flows.iter())
                    .filter(|l| port.is_some_and(|p| l.contains(&format!(" sport={p} "))))
                    .collect();
                let packets = match (&capture, port) {
                    (Ok(c), Some(p)) => c.packets(p),
                    (Err(e), _) => vec![format!("no capture: {e}")],
                    (_, None) => Vec::new(),
                };
                format!(
                    "{who} #{} sent {after} ms after the cut-off, {} ms: {}; its flows: {flows:#?}; its packets: {packets:#?}",
                    r.seq, r.took, r.why
                )
            })
            .collect()
    };
    let mut failed = failed_after(&load.records_past(cut + AFTER_MS).await, "follower");
    failed.extend(failed_after(&recs, "import"));
    // the clients' flows (to a ClusterIP), not the probe's (to north's pods themselves)
    let north_flows: Vec<String> = (traffic::flows_to(&bed_dir, WEST, &north_ips).into_iter())
        .filter(|l| {
            !north_ips
                .iter()
                .any(|ip| l.contains(&format!(" dst={ip} ")))
        })
        .collect();
    let freshest = (north_flows.iter())
        .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u32>().ok())
        .max();
    let east_ips: BTreeSet<String> = east_pods.values().cloned().collect();
    let east_unanswered: Vec<String> = (traffic::flows_to(&bed_dir, WEST, &east_ips).into_iter())
        .filter(|l| l.contains("UNREPLIED"))
        .collect();
    let flows_at = now_ms() - cut;
    let during = snapshot(&west, &[&ns.name]).await;
    let marked = published(&west, &ns.name, FOLLOWER, &north_ips).await;
    let mcs_marked = published(&west, &ns.name, IMPORT, &north_ips).await;
    let text = metrics(&ip).await.expect("metrics");
    let up = series_value(&text, "xcc_remote_up", &[("remote", "north")]);
    let north_ready = all_ready(&north, &ns.name).await;

    // mended: north's endpoints ready again, sent to again
    bed_do(&["mend", WEST, NORTH]).await;
    let t_back = now_ms();
    wait_series(
        &ip,
        "xcc_remote_cut_off",
        &[("remote", "north")],
        0.0,
        false,
    )
    .await;
    let restored = eventually("north's endpoints ready again", WAIT, || async {
        let p = published(&west, &ns.name, FOLLOWER, &north_ips).await;
        let m = published(&west, &ns.name, IMPORT, &north_ips).await;
        let all = |p: &[(String, bool, bool)]| {
            p.len() == north_ips.len() && p.iter().all(|(_, r, s)| *r && *s)
        };
        (all(&p) && all(&m))
            .then(now_ms)
            .ok_or_else(|| format!("follower {p:?}, import {m:?}"))
    })
    .await;
    support::mcs::import_endpoints(&west, &ns.name, "web", healthy).await;
    let (back, _) = tokio::join!(
        load.answered_by(restored, &both),
        mcs_load.answered_by(restored, &both)
    );

    let note = format!(
        "north cut off {} s after the cut (probe-after {PROBE_AFTER_S} s, a round every 2 s), west's kube-proxy without north {} s after it; west's client of the follower before that: {}, of the import {}; in the {} s after it: follower {}, answered by {:?}, import {}, answered by {:?}; mended: north's endpoints ready again {} s later, answered by north again after {} s",
        traffic::secs(t0, cut_off),
        traffic::secs(t0, cut),
        early.figures(),
        mcs_early.figures(),
        AFTER_MS / 1000,
        late.figures(),
        late.by_cluster.keys().collect::<Vec<_>>(),
        mcs_late.figures(),
        mcs_late.by_cluster.keys().collect::<Vec<_>>(),
        traffic::secs(t_back, restored),
        traffic::secs(t_back, back),
    );
    println!("data path: {note}");
    conclude(
        Report {
            id: "91-data-path-cut",
            scenario: "a remote's pods unreachable while its API server answers (peering lost): the chart's pod on west's pod network, east and north behind its follower, north's Secret annotated fair.com/cross-cluster-probe-after: 3s",
            done: "testbed/bed cut traffic-west traffic-north (forwarded packets between the two pod networks dropped both ways; API servers and kubelets untouched), then bed mend",
            converge: Some(Duration::from_millis((restored - t_back).max(0) as u64)),
            note: note.clone(),
        },
        &Lost::since(&before, &during, &["web".to_string()].into()),
        &before.non_followers_touched(&during),
    );
    assert_eq!(
        code, 1,
        "status exits 1 while a remote is cut off:\n{table}"
    );
    let import_line = format!("{}/web", ns.name);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with(&import_line) && l.contains("north 0/2 cut off")),
        "status shows the import's endpoints per cluster:\n{table}"
    );
    assert!(
        !table.contains("local pod networks: none known"),
        "west's nodes name their pod networks (spec.podCIDRs): {table}"
    );
    assert!(
        north_ready,
        "north's own kubelets must see its pods Ready throughout: the cut is west's path only"
    );
    assert_eq!(
        up,
        Ok(1.0),
        "north's API server answers: the outage policy cannot see this"
    );
    assert!(
        marked.len() == north_ips.len() && marked.iter().all(|(_, r, s)| !r && !s),
        "north's endpoints stay in the follower, published not ready and not serving: {marked:?}\n{note}"
    );
    assert!(
        mcs_marked.len() == north_ips.len() && mcs_marked.iter().all(|(_, r, s)| !r && !s),
        "north's endpoints stay in the import, published not ready and not serving: {mcs_marked:?}\n{note}"
    );
    assert!(
        cut_off - t0 >= PROBE_AFTER_S * 1000 && cut_off - t0 < 15_000,
        "north cut off {} ms after the cut\n{}",
        cut_off - t0,
        logs().await
    );
    assert!(
        early.failed > 0,
        "the cut cost west's client nothing before the cut-off, so it cut nothing: {note}"
    );
    for (what, t) in [("follower", &late), ("import", &mcs_late)] {
        assert!(
            t.sent > 0 && t.failed == 0,
            "{what}, after the cut-off: {note}\nthe failures after it: {failed:#?}\n{} flows of west's clients towards north tracked {} ms after the cut-off, the freshest with {freshest:?} s of its 120 left; unanswered by east: {east_unanswered:#?}",
            north_flows.len(),
            flows_at
        );
        assert_eq!(
            t.by_cluster.keys().collect::<Vec<_>>(),
            [EAST],
            "{what}: only east answers after the cut-off"
        );
    }
}
