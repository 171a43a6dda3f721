//! Case 2 of tests/locality.rs, shared with the failover benchmark (tests/bench_failover.rs):
//! the import of `web` (west's 2 pods on west's node 3 in zone a, east's 2; both Services
//! `trafficDistribution: PreferClose`, exported) beside its floor, one west Service `floor`
//! (PreferClose) with 2 pods on node 3 (zone a) and 2 on node 2 (zone b); the daemon in west with
//! `--mcs`, reading east; both load clients on node 1 (zone a, testbed/node.sh's `node_zone`).
//! Node 3, where both zone-a halves run, is what a failover loses.
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::daemon::{Daemon, args_for, with_flag};
use super::fault::{Snapshot, snapshot};
use super::node::{WEB_IMAGE, node_at};
use super::traffic::{Load, Rec, now_ms, settled_pods_within};
use super::{TestNs, client, eventually, namespace_in, obj};

pub const HOSTNAME: &str = "kubernetes.io/hostname";
const WAIT: Duration = Duration::from_secs(120);

/// The daemon in `local` with `--mcs` (cluster name west), reading `remote`.
pub fn mcs_daemon_args(ns: &str, local: &str, remote: &str) -> Vec<String> {
    let mut args = with_flag(
        with_flag(args_for(ns), "--local-context", local),
        "--remote-context",
        remote,
    );
    args.extend(["--mcs", "--local-cluster-name", "west"].map(String::from));
    args
}

/// The hints of the import's slices, once every ready endpoint has them: (source cluster,
/// address) to the zones named.
pub async fn hinted(
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

/// Deployment `name` (2 pods labelled app=`app`, `half`=`name`) on `node` (any node when None),
/// with web's probe and grace (readiness every second, 5 s of serving after SIGTERM).
pub async fn pods(c: &Client, ns: &str, cluster: &str, name: &str, app: &str, node: Option<&str>) {
    let env = json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CLUSTER", "value": cluster},
        {"name": "GRACE_SECONDS", "value": "5"}
    ]);
    let deployment: Deployment = obj(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": app, "half": name}},
            "template": {
                "metadata": {"labels": {"app": app, "half": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 15,
                    "nodeSelector": node.map(|n| json!({ HOSTNAME: n })),
                    "containers": [{
                        "name": "web", "image": WEB_IMAGE, "imagePullPolicy": "Never",
                        "env": env,
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 1}
                    }]
                }
            }
        }
    }));
    Api::<Deployment>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &deployment)
        .await
        .unwrap_or_else(|e| panic!("{cluster}: create Deployment {name}: {e}"));
}

/// Service `name` selecting app=`name`, port 80 to `http`, PreferClose.
pub async fn prefer_close_service(c: &Client, ns: &str, name: &str) {
    let svc: Service = obj(json!({
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "trafficDistribution": "PreferClose",
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }));
    Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap_or_else(|e| panic!("create Service {name}: {e}"));
}

/// The ready pods labelled `selector` once exactly `n` are ready and none is terminating: name
/// to IP.
pub async fn ready_pods(
    c: &Client,
    ns: &str,
    selector: &str,
    n: usize,
) -> BTreeMap<String, String> {
    settled_pods_within(c, ns, selector, n, &BTreeSet::new(), WAIT).await
}

/// Fails unless `node` runs no CoreDNS pod: unplugging it must cut the web pods off, not every
/// client's name lookups (CoreDNS was placed when the cluster had its first nodes).
pub async fn dns_not_on(c: &Client, node: &str) {
    let api: Api<Pod> = Api::namespaced(c.clone(), "kube-system");
    let lp = ListParams::default().labels("k8s-app=kube-dns");
    let list = api.list(&lp).await.expect("CoreDNS pods");
    let on: Vec<String> = list
        .items
        .iter()
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .map(|p| p.name_any())
        .collect();
    assert!(
        on.is_empty(),
        "CoreDNS runs on {node}, which this test unplugs: {on:?}"
    );
}

/// Waits until the requests `load` began after `from` end with `n` in a row answered by `by`:
/// the time of the last one before them that failed or was answered by another pod (`from` when
/// there was none).
pub async fn settled_on(load: &Load, from: i64, by: BTreeSet<String>, n: usize) -> i64 {
    let by = &by;
    eventually(
        &format!("{}'s client answered by {by:?} alone", load.name),
        WAIT,
        || async {
            let recs = load.records().await?;
            let after: Vec<&Rec> = recs.iter().filter(|r| r.sent >= from).collect();
            let last_other = after
                .iter()
                .filter(|r| !r.ok || !by.contains(&r.pod))
                .map(|r| r.sent)
                .max();
            let since = last_other.unwrap_or(from);
            let home = after
                .iter()
                .filter(|r| r.sent > since && r.ok && by.contains(&r.pod))
                .count();
            if home >= n {
                Ok(since)
            } else {
                Err(format!("{home} answers by them since {since}"))
            }
        },
    )
    .await
}

/// The names of a name-to-IP map of pods.
pub fn names(pods: &BTreeMap<String, String>) -> BTreeSet<String> {
    pods.keys().cloned().collect()
}

/// The addresses of a name-to-IP map of pods.
pub fn ips(pods: &BTreeMap<String, String>) -> BTreeSet<String> {
    pods.values().cloned().collect()
}

/// Case 2 set up, its clients not yet started ([`Beside::clients`]). Fields drop in order:
/// the daemon before the namespaces.
pub struct Beside {
    pub daemon: Daemon,
    /// west's namespace before the daemon started
    pub before: Snapshot,
    /// west's web pods (on node 3), east's, the floor's zone-a half (node 3) and zone-b half
    /// (node 2): name to IP
    pub west_web: BTreeMap<String, String>,
    pub east_web: BTreeMap<String, String>,
    pub floor_a: BTreeMap<String, String>,
    pub floor_b: BTreeMap<String, String>,
    pub west: Client,
    pub east: Client,
    /// `west`, the cluster the daemon and the clients run in
    pub west_name: &'static str,
    pub ns: TestNs,
}

impl Beside {
    /// Checks that CoreDNS is not on west's node 3, creates it all in a new namespace `test-...`
    /// of both clusters, starts the daemon and waits until the import's slices carry hints.
    pub async fn set_up(east_name: &'static str, west_name: &'static str, test: &str) -> Beside {
        let node_3 = node_at(west_name, 3).0;
        dns_not_on(&client(west_name).await, &node_3).await;
        let ns = namespace_in(test, &[east_name, west_name]).await;
        let (east, west) = (client(east_name).await, client(west_name).await);
        // the import: west's web on node 3 (zone a), east's web; both PreferClose and exported
        pods(&west, &ns.name, west_name, "web", "web", Some(&node_3)).await;
        pods(&east, &ns.name, east_name, "web", "web", None).await;
        for c in [&west, &east] {
            prefer_close_service(c, &ns.name, "web").await;
            super::mcs::export(c, &ns.name, "web").await;
        }
        // the floor: one Service in west, half its pods on node 3 (zone a), half on node 2
        // (zone b)
        let node_2 = node_at(west_name, 2).0;
        for (half, node) in [("floor-a", &node_3), ("floor-b", &node_2)] {
            pods(&west, &ns.name, west_name, half, "floor", Some(node)).await;
        }
        prefer_close_service(&west, &ns.name, "floor").await;
        let west_web = ready_pods(&west, &ns.name, "half=web", 2).await;
        let east_web = ready_pods(&east, &ns.name, "half=web", 2).await;
        let floor_a = ready_pods(&west, &ns.name, "half=floor-a", 2).await;
        let floor_b = ready_pods(&west, &ns.name, "half=floor-b", 2).await;

        let args = mcs_daemon_args(&ns.name, west_name, east_name);
        let before = snapshot(&west, &[&ns.name]).await;
        let daemon = Daemon::start(&args).await;
        hinted(&west, &ns.name, 2).await;
        Beside {
            daemon,
            before,
            west_web,
            east_web,
            floor_a,
            floor_b,
            west,
            east,
            west_name,
            ns,
        }
    }

    /// Starts the two clients on node 1 (zone a), `rate` requests a second each: pod `load`
    /// calls the import (`web.<ns>.svc.clusterset.local`), pod `floor` the floor
    /// (`floor.<ns>.svc.cluster.local`), their records followed as they come when `follow`
    /// ([`Load::follow`]). Returns them once each is answered by its node-3 pods alone
    /// (`2 x rate` answers in a row).
    pub async fn clients(&self, load: &str, floor: &str, rate: u32, follow: bool) -> (Load, Load) {
        let node_1 = node_at(self.west_name, 1).0;
        let start = |name: &str, url: String| {
            let node_1 = node_1.clone();
            let name = name.to_string();
            async move {
                let on = Some((HOSTNAME, node_1.as_str()));
                let l = Load::start_on(
                    &self.west,
                    self.west_name,
                    &self.ns.name,
                    &name,
                    &url,
                    rate,
                    on,
                )
                .await;
                if follow { l.follow() } else { l }
            }
        };
        let load = start(
            load,
            format!("http://web.{}.svc.clusterset.local/", self.ns.name),
        )
        .await;
        let floor = start(
            floor,
            format!("http://floor.{}.svc.cluster.local/", self.ns.name),
        )
        .await;
        let t0 = now_ms();
        let n = 2 * rate as usize;
        settled_on(&load, t0, names(&self.west_web), n).await;
        settled_on(&floor, t0, names(&self.floor_a), n).await;
        (load, floor)
    }
}

/// When each Service's EndpointSlices of one namespace changed, as a watch in the test saw them
/// (the kube-proxies see the same changes at about the same time): a timeline of the ready
/// addresses of each Service, keyed by its `kubernetes.io/service-name` label, or, for an MCS
/// import's slices, `import:` and their `multicluster.kubernetes.io/service-name` label. The
/// watch stops when this is dropped.
pub struct SliceClock {
    seen: std::sync::Arc<std::sync::Mutex<Vec<Tick>>>,
    task: tokio::task::JoinHandle<()>,
}

/// One entry of a [`SliceClock`]: when, which Service, its ready addresses then.
type Tick = (i64, String, BTreeSet<String>);

impl Drop for SliceClock {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The key of a slice's Service in a [`SliceClock`] and the addresses of its ready endpoints
/// (an endpoint whose readiness is unknown counts as ready, as the API says consumers should).
fn slice_readiness(s: &EndpointSlice) -> Option<(String, BTreeSet<String>)> {
    let labels = s.metadata.labels.as_ref()?;
    let key = match labels.get("multicluster.kubernetes.io/service-name") {
        Some(import) => format!("import:{import}"),
        None => labels.get("kubernetes.io/service-name")?.clone(),
    };
    let ready = s
        .endpoints
        .iter()
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready) != Some(false))
        .flat_map(|e| e.addresses.iter().cloned())
        .collect();
    Some((key, ready))
}

impl SliceClock {
    /// Starts the watch of `ns`'s EndpointSlices and waits until its first list is in (whose
    /// entries may bear the time a call made right after this returns reads: a Service's
    /// entries are made only of a complete listing).
    pub async fn start(c: &Client, ns: &str) -> SliceClock {
        use futures::StreamExt;
        use kube::runtime::watcher::{self, Event};
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let api: Api<EndpointSlice> = Api::namespaced(c.clone(), ns);
        let record = seen.clone();
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            // slice name -> (its Service's key, its ready addresses); a (re)listing fills
            // `listing`, which replaces `slices` when complete: a timeline entry is never made
            // of a listing's first part
            let mut slices: BTreeMap<String, (String, BTreeSet<String>)> = BTreeMap::new();
            let mut listing = BTreeMap::new();
            let mut stream = watcher::watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = stream.next().await {
                let t = now_ms();
                let changed: BTreeSet<String> = match event {
                    Ok(Event::Apply(s)) => match slice_readiness(&s) {
                        Some(r) => {
                            let key = r.0.clone();
                            let old = slices.insert(s.name_any(), r).map(|o| o.0);
                            old.into_iter().chain([key]).collect()
                        }
                        None => BTreeSet::new(),
                    },
                    Ok(Event::Delete(s)) => slices
                        .remove(&s.name_any())
                        .map(|o| o.0)
                        .into_iter()
                        .collect(),
                    Ok(Event::Init) => {
                        listing.clear();
                        BTreeSet::new()
                    }
                    Ok(Event::InitApply(s)) => {
                        if let Some(r) = slice_readiness(&s) {
                            listing.insert(s.name_any(), r);
                        }
                        BTreeSet::new()
                    }
                    Ok(Event::InitDone) => {
                        let keys = slices.values().chain(listing.values());
                        let keys = keys.map(|(k, _)| k.clone()).collect();
                        slices = std::mem::take(&mut listing);
                        if let Some(tx) = listed_tx.take() {
                            let _ = tx.send(());
                        }
                        keys
                    }
                    Err(_) => BTreeSet::new(),
                };
                let mut seen = record.lock().expect("the slice clock's lock");
                for key in changed {
                    let ready = slices
                        .values()
                        .filter(|(k, _)| *k == key)
                        .flat_map(|(_, r)| r.iter().cloned())
                        .collect();
                    seen.push((t, key, ready));
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(60), listed)
            .await
            .expect("the slice clock's first list within 60 s")
            .expect("the slice clock's watch ended before its first list");
        SliceClock { seen, task }
    }

    /// The first time at or after `from` that Service `key`'s slices held none of `addresses`
    /// ready, waiting for it until `WAIT`.
    pub async fn none_ready(&self, key: &str, addresses: &BTreeSet<String>, from: i64) -> i64 {
        eventually(
            &format!("{key}'s slices without a ready {addresses:?}"),
            WAIT,
            || async {
                let seen = self.seen.lock().expect("the slice clock's lock");
                seen.iter()
                    .find(|(t, k, ready)| *t >= from && k == key && ready.is_disjoint(addresses))
                    .map(|(t, ..)| *t)
                    .ok_or_else(|| format!("{key}'s slices still hold one ready"))
            },
        )
        .await
    }
}
