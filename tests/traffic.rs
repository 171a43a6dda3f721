//! Packets, not just objects: the bed's pod network (testbed/net.sh), kube-proxy and CoreDNS
//! carry real requests between ordinary pods of two clusters with nodes, and the first request
//! through a follower: a client pod in west calling `http://web.<ns>.svc.cluster.local` is
//! answered by the pods running in east, through the follower and the EndpointSlices the real
//! daemon wrote.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, free_port, with_args, with_flag};
use support::fault::{Lost, Report, conclude, snapshot};
use support::node::{
    LOAD_IMAGE, WEB_IMAGE, api_port, chart_image, exec, lease_holder, node_cluster,
    node_cluster_with, pod_ready, wait_dns, workload_images,
};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::tools::{CHART, helm};
use support::traffic::{self, Load, Rec, Tally, now_ms, proxy_targets, secs, settled_web_pods};
use support::{bed_do, client, eventually, namespace_in, obj};
use tokio::sync::OnceCell;

/// Three clusters with nodes of their own; other tests never use them.
const EAST: &str = "traffic-east";
const WEST: &str = "traffic-west";
const NORTH: &str = "traffic-north";
/// Start-up of pods on a busy two-core machine: seconds, with room to spare.
const WAIT: Duration = Duration::from_secs(120);

static CLUSTERS: OnceCell<()> = OnceCell::const_new();

/// East's API server is up: the tests that need it hold this for reading; the phase that kills
/// it (east_api_down) holds it for writing, so it waits until they are done and none starts
/// meanwhile.
static EAST_UP: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// The three clusters with a node (west two, for the chart's two replicas), the workload images
/// on them, and CoreDNS answering in each.
async fn clusters() {
    CLUSTERS
        .get_or_init(|| async {
            node_cluster(EAST).await;
            node_cluster_with(WEST, 2).await;
            node_cluster(NORTH).await;
            workload_images(&[EAST, WEST, NORTH]).await;
            tokio::join!(wait_dns(EAST), wait_dns(WEST), wait_dns(NORTH));
        })
        .await;
}

/// The web Deployment (2 pods, named port `http` 8080) and its Service `web` (port 80 to the
/// named target port), labelled for export when `export`.
async fn web(c: &Client, ns: &str, cluster: &str, export: bool) {
    let env = json!([
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "CLUSTER", "value": cluster},
        {"name": "GRACE_SECONDS", "value": "1"}
    ]);
    let deployment = obj(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
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
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::namespaced(c.clone(), ns);
    api.create(&PostParams::default(), &deployment)
        .await
        .expect("create the web Deployment");
    let labels = if export {
        json!({"app": "web", "fair.com/cross-cluster": "true"})
    } else {
        json!({"app": "web"})
    };
    let service = obj(json!({
        "metadata": {"name": "web", "labels": labels},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}
    }));
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), ns);
    api.create(&PostParams::default(), &service)
        .await
        .expect("create the web Service");
}

/// A client pod (`load idle`) to `kubectl exec` into.
async fn client_pod(c: &Client, ns: &str) {
    let pod: Pod = obj(json!({
        "metadata": {"name": "client"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "load", "image": LOAD_IMAGE, "imagePullPolicy": "Never", "args": ["idle"]}]
        }
    }));
    Api::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .expect("create the client pod");
}

/// The ready pods of `ns` labelled app=web once there are `n`: (name, pod IP).
async fn ready_web_pods(c: &Client, ns: &str, n: usize) -> Vec<(String, String)> {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    eventually(&format!("{n} ready web pods in {ns}"), WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        let ready: Vec<(String, String)> = list
            .items
            .iter()
            .filter(|p| pod_ready(p))
            .filter_map(|p| Some((p.name_any(), p.status.as_ref()?.pod_ip.clone()?)))
            .collect();
        if ready.len() == n {
            Ok(ready)
        } else {
            Err(format!("{} ready of {}", ready.len(), list.items.len()))
        }
    })
    .await
}

async fn wait_client(c: &Client, ns: &str) {
    let pods: Api<Pod> = Api::namespaced(c.clone(), ns);
    eventually("the client pod to run", WAIT, || async {
        let p = pods.get("client").await.map_err(|e| e.to_string())?;
        if pod_ready(&p) {
            Ok(())
        } else {
            Err(format!("{:?}", p.status))
        }
    })
    .await
}

/// One GET from the client pod of `cluster`/`ns`: the body, or why it failed.
async fn get_from(cluster: &'static str, ns: &str, url: &str) -> Result<String, String> {
    let (ns, url) = (ns.to_string(), url.to_string());
    tokio::task::spawn_blocking(move || exec(cluster, &ns, "client", &["/load", "get", &url]))
        .await
        .expect("exec task")
}

/// The `pod=` field of a web answer.
fn pod_of(body: &str) -> Option<String> {
    body.split_whitespace()
        .find_map(|f| f.strip_prefix("pod="))
        .map(str::to_string)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_reach_pods_of_another_cluster_by_ip_and_services_by_name() {
    clusters().await;
    let _east_up = EAST_UP.read().await;
    let ns = namespace_in("traffic-pods", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    web(&east, &ns.name, EAST, false).await;
    client_pod(&east, &ns.name).await;
    client_pod(&west, &ns.name).await;
    let pods = ready_web_pods(&east, &ns.name, 2).await;
    wait_client(&east, &ns.name).await;
    wait_client(&west, &ns.name).await;

    // across clusters, by pod IP: the flat network of peered VPCs
    for (name, ip) in &pods {
        let body = get_from(WEST, &ns.name, &format!("http://{ip}:8080/")).await;
        assert_eq!(
            body.as_deref().ok().and_then(pod_of).as_deref(),
            Some(name.as_str()),
            "west's client to east's pod {name} at {ip}: {body:?}"
        );
    }

    // in east, by name: CoreDNS answers, kube-proxy takes the ClusterIP to a pod
    let url = format!("http://web.{}.svc.cluster.local/", ns.name);
    let body = eventually("east's client to reach web by name", WAIT, || {
        get_from(EAST, &ns.name, &url)
    })
    .await;
    assert!(
        body.contains(&format!("cluster={EAST}"))
            && pods.iter().any(|(n, _)| Some(n.clone()) == pod_of(&body)),
        "answered by one of east's web pods: {body}"
    );

    // nothing leaves: an address the bed did not make is unreachable, from a pod of either
    // cluster, whether it is inside 10/8 (routed to the bed, which has no route for it) or not
    for addr in ["10.123.4.5", "192.168.77.7"] {
        let err = get_from(WEST, &ns.name, &format!("http://{addr}/"))
            .await
            .expect_err("an unknown address answers nothing");
        assert!(
            err.contains("Network is unreachable"),
            "a packet to {addr} fails with 'network unreachable': {err}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_request_through_a_follower_is_answered_by_the_remote_pods() {
    clusters().await;
    let _east_up = EAST_UP.read().await;
    let ns = namespace_in("traffic-follower", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    web(&east, &ns.name, EAST, true).await;
    client_pod(&west, &ns.name).await;
    let pods: BTreeSet<String> = ready_web_pods(&east, &ns.name, 2)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    wait_client(&west, &ns.name).await;
    let url = format!("http://web.{}.svc.cluster.local/", ns.name);

    // without a follower, west has no such name
    let before = get_from(WEST, &ns.name, &url).await;
    assert!(
        before.is_err(),
        "no follower yet, yet {url} answered: {before:?}"
    );

    let args = with_flag(
        with_flag(args_for(&ns.name), "--local-context", WEST),
        "--remote-context",
        EAST,
    );
    let mut daemon = Daemon::start(&args).await;
    let seen = eventually(
        "west's client to be answered by both of east's web pods through the follower",
        WAIT,
        || {
            let url = url.clone();
            let ns = ns.name.clone();
            let pods = pods.clone();
            async move {
                let mut seen = BTreeSet::new();
                for _ in 0..20 {
                    let body = get_from(WEST, &ns, &url).await?;
                    let pod = pod_of(&body).ok_or(format!("not a web answer: {body}"))?;
                    if !body.contains(&format!("cluster={EAST}")) {
                        return Err(format!("answered from elsewhere: {body}"));
                    }
                    seen.insert(pod);
                    if seen == pods {
                        return Ok(seen);
                    }
                }
                Err(format!("saw {seen:?} of {pods:?}"))
            }
        },
    )
    .await;
    assert_eq!(seen, pods);

    // the follower's slices carry the traffic: without them (the daemon stopped, so nothing
    // writes them back) the same request fails
    daemon.kill();
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), &ns.name);
    slices
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("kubernetes.io/service-name=web"),
        )
        .await
        .expect("delete the follower's slices");
    eventually(
        "the request to fail without the follower's slices",
        WAIT,
        || async {
            match get_from(WEST, &ns.name, &url).await {
                Err(e) => Ok(e),
                Ok(body) => Err(format!("still answered: {body}")),
            }
        },
    )
    .await;
}

/// Issue 27: a hostile remote lists west's own pods as the endpoints of a Service it exports
/// (the bed's nodes register loopback addresses, refused as such; node addresses are judged in
/// `desired::addresses`' and `watch::networks`' unit tests). The follower holds none of them, so a west client calling the follower's
/// name is never answered by a west pod: it gets no answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_cannot_point_local_clients_at_local_pods() {
    clusters().await;
    let _east_up = EAST_UP.read().await;
    let ns = namespace_in("traffic-hijack", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    // west's own web pods: what the hostile remote points at
    web(&west, &ns.name, WEST, false).await;
    client_pod(&west, &ns.name).await;
    let victims = ready_web_pods(&west, &ns.name, 2).await;
    wait_client(&west, &ns.name).await;
    let hostile: Vec<String> = victims.iter().map(|(_, ip)| ip.clone()).collect();
    let pp = PostParams::default();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(east.clone(), &ns.name)
        .create(&pp, &support::exported("hijack", 80))
        .await
        .expect("the hostile export");
    Api::<EndpointSlice>::namespaced(east, &ns.name)
        .create(&pp, &support::remote_slice("hijack", "hijack-1", &hostile))
        .await
        .expect("the hostile slice");

    let args = with_flag(
        with_flag(args_for(&ns.name), "--local-context", WEST),
        "--remote-context",
        EAST,
    );
    let daemon = Daemon::start(&args).await;
    daemon
        .wait_metric(
            "xcc_addresses_refused_total",
            &[("remote", EAST), ("reason", "LocalPodNetwork")],
            2.0,
        )
        .await;
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), &ns.name);
    let lp = ListParams::default().labels("kubernetes.io/service-name=hijack");
    let held: Vec<String> = slices
        .list(&lp)
        .await
        .expect("the follower's slices")
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    assert!(
        held.is_empty(),
        "the follower holds local addresses: {held:?}"
    );

    // the name resolves (the follower exists), but no request reaches a west pod
    let url = format!("http://hijack.{}.svc.cluster.local/", ns.name);
    for _ in 0..10 {
        if let Ok(body) = get_from(WEST, &ns.name, &url).await {
            panic!("a west client through the follower was answered: {body}");
        }
    }
    assert!(
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(west, &ns.name)
            .get("hijack")
            .await
            .is_ok(),
        "the follower exists: the requests failed for want of endpoints, not of a name"
    );
}

/// What west's pods resolve `host` to (`load resolve` in the client pod: the pod's resolver,
/// through CoreDNS, as `dig` from a pod would show it).
async fn resolve_from(cluster: &'static str, ns: &str, host: &str) -> Result<Vec<String>, String> {
    let (ns, host) = (ns.to_string(), host.to_string());
    let out = tokio::task::spawn_blocking(move || {
        exec(cluster, &ns, "client", &["/load", "resolve", &host])
    })
    .await
    .expect("exec task")?;
    Ok(out.lines().map(str::to_string).collect())
}

/// A remote leader labelled `multicluster.kubernetes.io/service-name: db` (CoreDNS's
/// `multicluster` plugin picks the slices of a headless import by that label) would, if its
/// labels reached its follower's slices, add its addresses to the answers for another import,
/// west's own headless `db`. The label is refused (issue 27, reserved labels): a west pod resolving
/// `db.<ns>.svc.clusterset.local` gets west's address only, while the follower holds the remote's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_with_reserved_labels_adds_no_address_to_another_imports_name() {
    clusters().await;
    let _east_up = EAST_UP.read().await;
    let ns = namespace_in("traffic-labels", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    let pp = PostParams::default();
    // west exports a headless `db` (one address of its own, written by hand)
    const DB: &str = "10.76.0.7";
    const DB2: &str = "10.76.0.8";
    const HOSTILE: &str = "10.77.0.5";
    let db: k8s_openapi::api::core::v1::Service = obj(json!({
        "metadata": {"name": "db"},
        "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}
    }));
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(west.clone(), &ns.name)
        .create(&pp, &db)
        .await
        .expect("west's db");
    let db_slice: EndpointSlice = obj(json!({
        "metadata": {"name": "db-1", "labels": {"kubernetes.io/service-name": "db",
                     "endpointslice.kubernetes.io/managed-by": "someone-else"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        "endpoints": [{"addresses": [DB], "conditions": {"ready": true}}]
    }));
    Api::<EndpointSlice>::namespaced(west.clone(), &ns.name)
        .create(&pp, &db_slice)
        .await
        .expect("west's db slice");
    support::mcs::export(&west, &ns.name, "db").await;
    client_pod(&west, &ns.name).await;
    // east's leader claims to be a slice of `db` for CoreDNS
    let mut leader = support::exported("web", 80);
    let labels = leader.metadata.labels.get_or_insert_default();
    labels.insert(
        "multicluster.kubernetes.io/service-name".into(),
        "db".into(),
    );
    labels.insert(
        "multicluster.kubernetes.io/source-cluster".into(),
        "west".into(),
    );
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(east.clone(), &ns.name)
        .create(&pp, &leader)
        .await
        .expect("the hostile leader");
    Api::<EndpointSlice>::namespaced(east, &ns.name)
        .create(&pp, &support::remote_slice("web", "web-1", &[HOSTILE]))
        .await
        .expect("its slice");

    let mut args = with_flag(
        with_flag(args_for(&ns.name), "--local-context", WEST),
        "--remote-context",
        EAST,
    );
    args.extend(["--mcs", "--local-cluster-name", "west"].map(String::from));
    let before = snapshot(&west, &[&ns.name]).await;
    let t0 = std::time::Instant::now();
    let daemon = Daemon::start(&args).await;
    // the follower holds the remote's address (so the hostile slice did reach west)
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), &ns.name);
    eventually("the follower's slice with east's address", WAIT, || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let list = slices.list(&lp).await.map_err(|e| e.to_string())?;
        let held: Vec<String> = list
            .items
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        if held == [HOSTILE] {
            Ok(())
        } else {
            Err(format!("{held:?}"))
        }
    })
    .await;
    // an address west adds to db now is written (by the daemon, into the import's slice) after
    // the follower's slice: once CoreDNS answers with it, its watch has passed the follower's
    // slice too, so that slice, had it kept the label, would be in the answer
    let mut db_slice: EndpointSlice = Api::<EndpointSlice>::namespaced(west.clone(), &ns.name)
        .get("db-1")
        .await
        .expect("west's db slice");
    db_slice.endpoints.push(obj(
        json!({"addresses": [DB2], "conditions": {"ready": true}}),
    ));
    Api::<EndpointSlice>::namespaced(west.clone(), &ns.name)
        .replace("db-1", &pp, &db_slice)
        .await
        .expect("a second address for db");
    wait_client(&west, &ns.name).await;
    let name = format!("db.{}.svc.clusterset.local", ns.name);
    let got = eventually(
        "a west pod to resolve db with west's second address",
        WAIT,
        || async {
            let got = resolve_from(WEST, &ns.name, &name).await?;
            if got.iter().any(|a| a == DB2) {
                Ok(got)
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    assert_eq!(
        got,
        [DB, DB2],
        "{name} shows an address of the hostile remote"
    );
    // both labels counted as refused
    daemon
        .wait_metric(
            "xcc_labels_refused_total",
            &[("remote", EAST), ("reason", "reserved")],
            2.0,
        )
        .await;
    let after = snapshot(&client(WEST).await, &[&ns.name]).await;
    conclude(
        Report {
            id: "87-contain-reserved-labels-dns",
            scenario: "A remote leader labelled multicluster.kubernetes.io/service-name (and source-cluster) naming another import, west's own headless db: CoreDNS's multicluster plugin picks a headless import's slices by that label",
            done: "a daemon with --mcs reading east; a west pod resolves db.<ns>.svc.clusterset.local",
            converge: Some(t0.elapsed()),
            note: format!(
                "the follower held east's {HOSTILE}; the pod resolved db to {got:?} only (west's two addresses, none of east's); both labels counted as refused"
            ),
        },
        &Lost::nothing_to_lose(),
        // west's db slice is the test's own (it added DB2): every other non-follower untouched
        &before
            .non_followers_touched(&after)
            .into_iter()
            .filter(|o| *o != format!("EndpointSlice {}/db-1", ns.name))
            .collect::<Vec<_>>(),
    );
}

/// Issue 37, item 3: a remote's names never make a local pod's look-up of a public name answer.
/// Pods resolve `github.com` (one dot, `ndots:5`) first under their search list; CoreDNS reads
/// `github.com.<ns>.svc.cluster.local` as the endpoint `github` of the Service `com` in `<ns>`,
/// and `gitlab.com.svc.cluster.local` as the Service `gitlab` of the namespace `com`. East
/// exports both shapes: a headless `com` in the test's namespace whose endpoint's hostname is
/// `github`, and a headless `gitlab` in a namespace `com` (east only), which west's daemon may
/// create (`--create-namespaces`). Neither is mirrored: a west pod's resolver (a real
/// `getaddrinfo`, `load resolve`) gets none of east's addresses for `github.com` or
/// `gitlab.com` (each name answers through one shape only), and west has no namespace `com`.
/// A control export named `checkout`, written after the daemon's decision on both, is mirrored
/// and answers: once a west pod resolves it, CoreDNS has seen every follower written before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_cannot_make_a_public_name_answer_in_local_pods() {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    const TLD: &str = "com";
    // east's addresses under the two public-name shapes, and under the control
    const BY_NAME: &str = "10.77.0.31";
    const BY_NAMESPACE: &str = "10.77.0.32";
    const CONTROL: &str = "10.77.0.33";
    clusters().await;
    let _east_up = EAST_UP.read().await;
    let _tld_ns = TLD_NAMESPACE.lock().await;
    let ns = namespace_in("traffic-names", &[EAST, WEST]).await;
    let (east, west) = (client(EAST).await, client(WEST).await);
    // a namespace named like a TLD, in east only (gone from both first: a run without the
    // defence leaves it in west)
    for c in [&east, &west] {
        gone_namespace(c, TLD).await;
    }
    let com = obj(json!({"metadata": {"name": TLD, "labels": {"xcc-test": "true"}}}));
    Api::<Namespace>::all(east.clone())
        .create(&PostParams::default(), &com)
        .await
        .expect("namespace com in east");
    client_pod(&west, &ns.name).await;
    headless_export(&east, &ns.name, TLD, BY_NAME, Some("github")).await;
    headless_export(&east, TLD, "gitlab", BY_NAMESPACE, None).await;

    let args = with_args(
        with_flag(
            with_flag(
                with_flag(args_for(&ns.name), "--local-context", WEST),
                "--remote-context",
                EAST,
            ),
            "--watch-namespace",
            &format!("{},{TLD}", ns.name),
        ),
        &["--create-namespaces"],
    );
    let before = snapshot(&west, &[&ns.name]).await;
    let t0 = std::time::Instant::now();
    let daemon = Daemon::start(&args).await;
    // the daemon's decision on both keys: refused (its log says so for each: the Events on
    // its Lease are one per interval), or, without the defence, mirrored (both followers in west)
    let keys = [format!("{}/{TLD}", ns.name), format!("{TLD}/gitlab")];
    let services = |n: &str| Api::<Service>::namespaced(west.clone(), n);
    let mirrored = eventually("the daemon to decide on both names", WAIT, || async {
        let logs = daemon.logs();
        let refused = |k: &String| {
            logs.lines()
                .any(|l| l.contains("PublicNameRefused") && l.contains(k.as_str()))
        };
        if keys.iter().all(refused) {
            return Ok(false);
        }
        let by_name = services(&ns.name).get_opt(TLD).await.ok().flatten();
        let by_ns = services(TLD).get_opt("gitlab").await.ok().flatten();
        match (by_name, by_ns) {
            (Some(_), Some(_)) => Ok(true),
            (a, b) => Err(format!(
                "refused: {:?}; followers: {}, {}",
                keys.iter().map(refused).collect::<Vec<_>>(),
                a.is_some(),
                b.is_some()
            )),
        }
    })
    .await;
    let decided = t0.elapsed();
    // the control, exported after that decision
    headless_export(&east, &ns.name, "checkout", CONTROL, Some("github")).await;
    wait_client(&west, &ns.name).await;
    eventually(
        "a west pod to resolve github.checkout (the control)",
        WAIT,
        || async {
            let got = resolve_from(WEST, &ns.name, "github.checkout").await?;
            if got == [CONTROL] {
                Ok(())
            } else {
                Err(format!("{got:?}"))
            }
        },
    )
    .await;
    // the public names: no answer from east (on the bed, no answer at all: no upstream)
    let mut answers = Vec::new();
    let mut hijacked = Vec::new();
    for (name, east_address) in [("github.com", BY_NAME), ("gitlab.com", BY_NAMESPACE)] {
        let got = resolve_from(WEST, &ns.name, name).await;
        if got
            .as_ref()
            .is_ok_and(|a| a.iter().any(|a| a == east_address))
        {
            hijacked.push(format!("{name} -> {got:?}"));
        }
        answers.push(match &got {
            Ok(addresses) => format!("{name}: {addresses:?}"),
            Err(e) => format!(
                "{name}: no answer ({})",
                e.lines().next().unwrap_or_default()
            ),
        });
    }
    let west_com = Api::<Namespace>::all(west.clone()).get_opt(TLD).await;
    assert!(
        hijacked.is_empty() && !mirrored && matches!(west_com, Ok(None)),
        "a west pod resolved public names to east's addresses: {hijacked:?}; followers mirrored: \
         {mirrored}; west's namespace {TLD}: {:?}",
        west_com.map(|n| n.map(|n| n.metadata.name))
    );
    let readyz = daemon.readyz().map(|(_, body)| body).unwrap_or_default();
    let line = readyz
        .lines()
        .find(|l| l.contains("top-level domain"))
        .unwrap_or_else(|| panic!("no refusal on /readyz:\n{readyz}"));
    assert!(
        keys.iter().all(|k| line.contains(k.as_str())),
        "/readyz does not name both: {line}"
    );
    let notes = support::event_notes(WEST, &ns.name, "PublicNameRefused", None)
        .await
        .expect("a refusal Event on the daemon's Lease");
    assert!(
        notes.iter().any(|n| n.contains("top-level domain")),
        "{notes:?}"
    );
    let counted = daemon.metric(
        "xcc_skipped_total",
        &[("remote", EAST), ("reason", "PublicNameRefused")],
    );
    assert!(
        counted >= 2.0,
        "xcc_skipped_total PublicNameRefused: {counted}"
    );
    let after = snapshot(&west, &[&ns.name]).await;
    for c in [&east, &west] {
        let _ = Api::<Namespace>::all(c.clone())
            .delete(TLD, &DeleteParams::background())
            .await;
    }
    conclude(
        Report {
            id: "95-contain-public-names-dns",
            scenario: "A remote exports a headless Service `com` whose endpoint's hostname is github (github.com.<ns>.svc.cluster.local), and a Service gitlab in a namespace `com` (gitlab.com.svc.cluster.local): a west pod's github.com and gitlab.com would answer with east's addresses",
            done: "a daemon reading east with --create-namespaces; a west pod resolves github.com and gitlab.com with getaddrinfo (load resolve) once a control export written after the decision resolves",
            converge: Some(decided),
            note: format!(
                "both refused (PublicNameRefused Events, xcc_skipped_total {counted}, one /readyz line); {}, none of east's; no namespace com in west; the control github.checkout answered {CONTROL}",
                answers.join("; ")
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// The namespace `com` is one per cluster: one test at a time may make it.
static TLD_NAMESPACE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Namespace `name` of `c` is gone (deleted if there, and waited for).
async fn gone_namespace(c: &Client, name: &str) {
    use k8s_openapi::api::core::v1::Namespace;
    let api: Api<Namespace> = Api::all(c.clone());
    let _ = api.delete(name, &DeleteParams::background()).await;
    eventually(&format!("namespace {name} to be gone"), WAIT, || async {
        match api.get_opt(name).await {
            Ok(None) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Exports from `c` a headless Service `ns/name` (port http 80) with one ready endpoint at
/// `address`, whose hostname is `hostname` when given, in a slice written by the test.
async fn headless_export(c: &Client, ns: &str, name: &str, address: &str, hostname: Option<&str>) {
    let svc = support::exported_with(
        name,
        json!({"clusterIP": "None", "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}),
    );
    let pp = PostParams::default();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.clone(), ns)
        .create(&pp, &svc)
        .await
        .unwrap_or_else(|e| panic!("export {ns}/{name}: {e}"));
    let mut endpoint = support::endpoint(address);
    if let Some(h) = hostname {
        endpoint["hostname"] = json!(h);
    }
    let slice = support::remote_slice_with(
        name,
        &format!("{name}-1"),
        "IPv4",
        json!([{"name": "http", "port": 80, "protocol": "TCP"}]),
        vec![endpoint],
    );
    Api::<EndpointSlice>::namespaced(c.clone(), ns)
        .create(&pp, &slice)
        .await
        .unwrap_or_else(|e| panic!("the slice of {ns}/{name}: {e}"));
}

// ---- traffic under events (issue 20, §2 b, e, f, g) ----------------------------------------
//
// One set-up, phases in a row: east and north run `web` (2 pods each, exported), west's daemon
// reads them from Secrets, and three load clients send RATE requests a second the whole time:
// west's to the follower's DNS name, east's and north's to their own cluster's Service (the
// in-cluster floor, measured in the same run during the same event). Each phase records one row
// of docs/reliability.md (scripts/reliability-report) before it asserts what the issue promises.

/// Requests a second of each load client.
const RATE: u32 = 20;
/// How far past an event's end its window reaches: a failure the event caused may show up
/// late on the far side (the window only widens; the test waits for records beyond it).
const TAIL: i64 = 3000;

struct Run {
    ns: String,
    east: Client,
    west: Client,
    north: Client,
    bed_dir: std::path::PathBuf,
    daemon: Daemon,
    secrets: Api<Secret>,
    west_load: Load,
    east_load: Load,
    north_load: Load,
}

fn names(pods: &BTreeMap<String, String>) -> BTreeSet<String> {
    pods.keys().cloned().collect()
}

fn ips(pods: &BTreeMap<String, String>) -> BTreeSet<String> {
    pods.values().cloned().collect()
}

/// The remote Secret of `cluster` (named `name`), with annotations.
async fn remote(run: &Run, name: &str, cluster: &str, annotations: &[(&str, &str)]) {
    let kc = kubeconfig_of(cluster, |_| {}).await;
    let mut s = remote_secret(name, None, Some(&kc));
    s.metadata.annotations = Some(
        annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    apply_secret(&run.secrets, &s).await;
}

/// The first request begun at or after `from` that `pods` answered: ms after `from`.
fn first_answer(recs: &[Rec], from: i64, pods: &BTreeSet<String>) -> String {
    recs.iter()
        .find(|r| r.sent >= from && r.ok && pods.contains(&r.pod))
        .map(|r| secs(from, r.sent))
        .unwrap_or_else(|| "none".into())
}

async fn follower_slice_uids(run: &Run) -> BTreeSet<String> {
    let slices: Api<EndpointSlice> = Api::namespaced(run.west.clone(), &run.ns);
    slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .expect("list the follower's slices")
        .items
        .iter()
        .map(|s| s.uid().unwrap_or_default())
        .collect()
}

async fn set_up(ns: &str) -> Run {
    let (east, west, north) = (client(EAST).await, client(WEST).await, client(NORTH).await);
    tokio::join!(
        traffic::web(&east, ns, EAST, 2, true),
        traffic::web(&north, ns, NORTH, 2, true)
    );
    let url = format!("http://web.{ns}.svc.cluster.local/");
    let west_load = Load::start(&west, WEST, ns, "load", &url, RATE).await;
    let east_load = Load::start(&east, EAST, ns, "load", &url, RATE).await;
    let north_load = Load::start(&north, NORTH, ns, "load", &url, RATE).await;
    let args = with_flag(secrets_only_args(ns), "--local-context", WEST);
    let daemon = Daemon::start_secrets_only(&args).await;
    daemon.wait_leading().await;
    let run = Run {
        ns: ns.to_string(),
        secrets: Api::namespaced(west.clone(), ns),
        bed_dir: support::bed().await.dir.clone(),
        east,
        west,
        north,
        daemon,
        west_load,
        east_load,
        north_load,
    };
    remote(&run, "east", EAST, &[]).await;
    let pods = names(&settled_web_pods(&run.east, ns, 2, &BTreeSet::new()).await);
    let t = now_ms();
    tokio::join!(
        run.west_load.answered_by(t, &pods),
        run.east_load.answered_by(t, &pods)
    );
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn west_is_answered_through_a_rollout_an_api_outage_a_merge_and_the_stale_policy() {
    clusters().await;
    let ns = namespace_in("traffic-events", &[EAST, WEST, NORTH]).await;
    let mut run = set_up(&ns.name).await;
    rollout(&run).await;
    {
        let _no_one_else_needs_east = EAST_UP.write().await;
        east_api_down(&run).await;
    }
    merged(&run).await;
    stale_policy(&run).await;
    scale_from_zero(&run).await;
    our_side_replaced(&mut run).await;
}

/// b. East rolls its Deployment (maxSurge 1, maxUnavailable 0, readiness probe): west fails no
/// more often than east's own client.
async fn rollout(run: &Run) {
    let west_sl = snapshot(&run.west, &[&run.ns]).await;
    let old = settled_web_pods(&run.east, &run.ns, 2, &BTreeSet::new()).await;
    let deployments: Api<Deployment> = Api::namespaced(run.east.clone(), &run.ns);
    let t0 = now_ms();
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"rollout": "2"}}}}}),
            ),
        )
        .await
        .expect("start the rollout");
    let new = settled_web_pods(&run.east, &run.ns, 2, &names(&old)).await;
    let done = now_ms();
    // west's data path matches: only the new pods behind the follower
    proxy_targets(&run.bed_dir, WEST, &ips(&old), true).await;
    let converged = proxy_targets(&run.bed_dir, WEST, &ips(&new), false).await;
    let t1 = done + TAIL;
    let (w, e) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1)
    );
    let (wt, et) = (Tally::of(&w, t0, t1), Tally::of(&e, t0, t1));
    let after = snapshot(&run.west, &[&run.ns]).await;
    let new_names = names(&new);
    conclude(
        Report {
            id: "80-traffic-b-rollout",
            scenario: "Traffic b: east rolls its Deployment under steady load; west calls the follower by DNS name",
            done: &format!(
                "2 web pods (maxSurge 1, maxUnavailable 0, readiness probe every 1 s, 5 s of serving after SIGTERM) replaced by a template change; a load client in west (follower) and one in east (east's own Service), {RATE} requests/s each, new connection and DNS lookup per request"
            ),
            converge: Some(Duration::from_millis((converged - done).max(0) as u64)),
            note: format!(
                "converged in: rollout done in east's API to west's kube-proxy sending only to the new pods; rollout {} s; west (follower): {}; east (floor): {}; first answer by a new pod {} s (west) and {} s (east) after the change",
                secs(t0, done),
                wt.figures(),
                et.figures(),
                first_answer(&w, t0, &new_names),
                first_answer(&e, t0, &new_names),
            ),
        },
        &Lost::since(&west_sl, &after, &["web".to_string()].into()),
        &west_sl.non_followers_touched(&after),
    );
    assert!(
        wt.sent > 0 && et.sent > 0,
        "both clients sent: {wt:?} {et:?}"
    );
    assert!(
        wt.failed <= et.failed,
        "west failed more often than east's own client during the rollout: west {:?}, east {:?}",
        wt.fails,
        et.fails
    );
}

/// e. East's API server down for more than a sweep interval while its pods keep running: west
/// fails no request (keep policy) and nothing is deleted.
async fn east_api_down(run: &Run) {
    let d = &run.daemon;
    let before = snapshot(&run.west, &[&run.ns]).await;
    let slices = follower_slice_uids(run).await;
    let deletes = d.writes(
        &["Service", "EndpointSlice", "Endpoints", "Lease"],
        &["delete"],
    );
    let aborted = d.metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "aborted")],
    );
    let t0 = now_ms();
    bed_do(&["kill", EAST, "apiserver"]).await;
    // longer than a sweep interval (2 s): three sweeps aborted for want of east's listing
    d.wait_metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "aborted")],
        aborted + 3.0,
    )
    .await;
    let swept = d.metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "aborted")],
    ) - aborted;
    let t_up = now_ms();
    bed_do(&["start", EAST]).await;
    eventually("the daemon ready again (east back)", WAIT, || async {
        match d.readyz()? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
    let back = now_ms();
    let t1 = back + TAIL;
    let (w, e) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1)
    );
    let (wt, et) = (Tally::of(&w, t0, t1), Tally::of(&e, t0, t1));
    let after = snapshot(&run.west, &[&run.ns]).await;
    let deleted = d.writes(
        &["Service", "EndpointSlice", "Endpoints", "Lease"],
        &["delete"],
    ) - deletes;
    let slices_after = follower_slice_uids(run).await;
    conclude(
        Report {
            id: "83-traffic-e-api-down",
            scenario: "Traffic e: east's API server down longer than a sweep interval while east's pods keep serving",
            done: &format!(
                "testbed/bed kill {EAST} apiserver (SIGKILL) until {swept} sweeps (every 2 s) had aborted, then started again; keep policy (no stale-after); load clients in west (follower) and east (own Service), {RATE} requests/s each"
            ),
            converge: Some(Duration::from_millis((back - t_up).max(0) as u64)),
            note: format!(
                "converged in: east's API server started to the daemon's /readyz 200; down {} s; west (follower): {}; east (floor): {}; {deleted} deletes sent, the follower's slices kept their uids",
                secs(t0, t_up),
                wt.figures(),
                et.figures(),
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
    assert_eq!(wt.failed, 0, "west failed requests: {:?}", wt.fails);
    assert!(wt.sent > 0, "west sent nothing");
    assert_eq!(deleted, 0.0, "deletes sent while east was down");
    assert_eq!(slices, slices_after, "the follower's slices were replaced");
}

/// f. North exports the same Service: both answer west; north's pods deleted (failures only
/// during the switch, counted); north's Secret removed (only east answers, no failure after).
async fn merged(run: &Run) {
    let east = settled_web_pods(&run.east, &run.ns, 2, &BTreeSet::new()).await;
    let north_old = settled_web_pods(&run.north, &run.ns, 2, &BTreeSet::new()).await;
    let t = now_ms();
    remote(run, "north", NORTH, &[]).await;
    let both: BTreeSet<String> = names(&east).union(&names(&north_old)).cloned().collect();
    run.west_load.answered_by(t, &both).await;

    // north's pods deleted: its Deployment replaces them
    let before = snapshot(&run.west, &[&run.ns]).await;
    let pods: Api<Pod> = Api::namespaced(run.north.clone(), &run.ns);
    let t0 = now_ms();
    pods.delete_collection(
        &DeleteParams::default(),
        &ListParams::default().labels("app=web"),
    )
    .await
    .expect("delete north's web pods");
    let north_new = settled_web_pods(&run.north, &run.ns, 2, &names(&north_old)).await;
    let back = run.west_load.answered_by(t0, &names(&north_new)).await;
    let t1 = now_ms().max(back) + TAIL;
    let (w, e, n) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1),
        run.north_load.records_past(t1)
    );
    let (wt, et, nt) = (
        Tally::of(&w, t0, t1),
        Tally::of(&e, t0, t1),
        Tally::of(&n, t0, t1),
    );
    let late = Tally::of(&w, back, t1);
    let after = snapshot(&run.west, &[&run.ns]).await;
    conclude(
        Report {
            id: "84-traffic-f1-merged-pods-deleted",
            scenario: "Traffic f: a merged follower (east and north export web); north's pods deleted",
            done: &format!(
                "west's follower carries east's and north's endpoints (both answered west's client); every web pod of north deleted (its Deployment made new ones); load clients in west (follower), east and north (their own Service), {RATE} requests/s each"
            ),
            converge: Some(Duration::from_millis((back - t0).max(0) as u64)),
            note: format!(
                "converged in (the switch): deletion to west's first answers from both new north pods; west (follower): {}, of which {} failed after the switch; north (floor, the pods deleted): {}; east: {}",
                wt.figures(),
                late.failed,
                nt.figures(),
                et.figures(),
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
    assert!(
        wt.by_cluster.contains_key(EAST) && wt.by_cluster.contains_key(NORTH),
        "both clusters answered west: {:?}",
        wt.by_cluster
    );
    assert_eq!(
        late.failed, 0,
        "west failed after the switch: {:?}",
        late.fails
    );

    // north's Secret removed: only east answers once the removal is complete (west's kube-proxy
    // sends nothing to north's pods any more)
    let before = snapshot(&run.west, &[&run.ns]).await;
    let t0 = now_ms();
    run.secrets
        .delete("north", &DeleteParams::default())
        .await
        .expect("delete north's Secret");
    let removed = proxy_targets(&run.bed_dir, WEST, &ips(&north_new), true).await;
    let t1 = removed + 5000;
    let w = run.west_load.records_past(t1).await;
    let e = run.east_load.records_past(t1).await;
    let (wt, et) = (Tally::of(&w, t0, t1), Tally::of(&e, t0, t1));
    let late = Tally::of(&w, removed, t1);
    let after = snapshot(&run.west, &[&run.ns]).await;
    conclude(
        Report {
            id: "85-traffic-f2-merged-secret-removed",
            scenario: "Traffic f: a merged follower; north's remote Secret deleted while north's pods serve",
            done: "north's Secret deleted (removal grace 2 s); load clients in west (follower) and east (own Service)",
            converge: Some(Duration::from_millis((removed - t0).max(0) as u64)),
            note: format!(
                "converged in: Secret deleted to west's kube-proxy sending nothing to north's pods; west (follower): {}; after the removal: {} sent, {} failed, answered by {:?}; east (floor): {}",
                wt.figures(),
                late.sent,
                late.failed,
                late.by_cluster.keys().collect::<Vec<_>>(),
                et.figures(),
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
    assert!(late.sent > 0, "west sent nothing after the removal");
    assert_eq!(
        late.failed, 0,
        "west failed after the removal: {:?}",
        late.fails
    );
    assert_eq!(
        late.by_cluster.keys().collect::<Vec<_>>(),
        vec![EAST],
        "only east answers after the removal"
    );
}

/// g. The opt-in outage policy: north (stale-after 3 s) loses its API server and its node;
/// after stale-after every request of west goes to east. Failures counted before and after.
async fn stale_policy(run: &Run) {
    let east = names(&settled_web_pods(&run.east, &run.ns, 2, &BTreeSet::new()).await);
    let north = settled_web_pods(&run.north, &run.ns, 2, &BTreeSet::new()).await;
    remote(
        run,
        "north",
        NORTH,
        &[("fair.com/cross-cluster-stale-after", "3s")],
    )
    .await;
    proxy_targets(&run.bed_dir, WEST, &ips(&north), false).await;
    let t = now_ms();
    let both: BTreeSet<String> = east.union(&names(&north)).cloned().collect();
    run.west_load.answered_by(t, &both).await;

    let before = snapshot(&run.west, &[&run.ns]).await;
    let t0 = now_ms();
    bed_do(&["unplug", NORTH]).await;
    bed_do(&["kill", NORTH, "apiserver"]).await;
    let marked = proxy_targets(&run.bed_dir, WEST, &ips(&north), true).await;
    let t1 = marked + 5000;
    let (w, e) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1)
    );
    let (early, late, et) = (
        Tally::of(&w, t0, marked),
        Tally::of(&w, marked, t1),
        Tally::of(&e, t0, t1),
    );
    let during = snapshot(&run.west, &[&run.ns]).await;
    // north back: plugged in, API server started, its endpoints behind the follower again
    bed_do(&["plug", NORTH]).await;
    let t_up = now_ms();
    bed_do(&["start", NORTH]).await;
    let restored = proxy_targets(&run.bed_dir, WEST, &ips(&north), false).await;
    conclude(
        Report {
            id: "86-traffic-g-stale-policy",
            scenario: "Traffic g: the opt-in outage policy; north's API server down and its node cut off, stale-after 3 s",
            done: &format!(
                "east and north both behind west's follower; north's Secret annotated fair.com/cross-cluster-stale-after: 3s; testbed/bed unplug {NORTH} (its node's link down: its pods run on, unreachable) and kill {NORTH} apiserver; then both restored"
            ),
            converge: Some(Duration::from_millis((restored - t_up).max(0) as u64)),
            note: format!(
                "converged in: north's API server started to west's kube-proxy sending to north's pods again; west's kube-proxy stopped sending to north {} s after the outage began; west (follower) before that: {}; after it (5 s): {}, answered by {:?}; east (floor): {}",
                secs(t0, marked),
                early.figures(),
                late.figures(),
                late.by_cluster.keys().collect::<Vec<_>>(),
                et.figures(),
            ),
        },
        &Lost::since(&before, &during, &["web".to_string()].into()),
        &before.non_followers_touched(&during),
    );
    assert!(
        marked - t0 >= 3000,
        "north's endpoints dropped before stale-after: {} ms",
        marked - t0
    );
    assert!(late.sent > 0, "west sent nothing after stale-after");
    assert_eq!(
        late.failed, 0,
        "west failed after stale-after: {:?}",
        late.fails
    );
    assert_eq!(
        late.by_cluster.keys().collect::<Vec<_>>(),
        vec![EAST],
        "only east answers after stale-after"
    );
}

/// c. East scaled from 0 to 3: from the first east pod Ready to west's first answer, beside the
/// same for east's own client (measured; the promise is that west is answered by all three).
async fn scale_from_zero(run: &Run) {
    let deployments: Api<Deployment> = Api::namespaced(run.east.clone(), &run.ns);
    let pods: Api<Pod> = Api::namespaced(run.east.clone(), &run.ns);
    let scale = |n: i32| {
        let deployments = deployments.clone();
        async move {
            deployments
                .patch(
                    "web",
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": {"replicas": n}})),
                )
                .await
                .unwrap_or_else(|e| panic!("scale east's web to {n}: {e}"))
        }
    };
    // east alone behind west's follower (north, back from phase g, would answer meanwhile)
    let north = settled_web_pods(&run.north, &run.ns, 2, &BTreeSet::new()).await;
    run.secrets
        .delete("north", &DeleteParams::default())
        .await
        .expect("delete north's Secret");
    proxy_targets(&run.bed_dir, WEST, &ips(&north), true).await;
    let old = settled_web_pods(&run.east, &run.ns, 2, &BTreeSet::new()).await;
    scale(0).await;
    eventually("east's web pods gone", WAIT, || async {
        let n = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .len();
        (n == 0).then_some(()).ok_or(format!("{n} left"))
    })
    .await;
    proxy_targets(&run.bed_dir, WEST, &ips(&old), true).await;
    let before = snapshot(&run.west, &[&run.ns]).await;
    let t0 = now_ms();
    scale(3).await;
    let first_ready = eventually("an east web pod Ready", WAIT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(pod_ready)
            .then(now_ms)
            .ok_or_else(|| format!("{} pods, none Ready", list.items.len()))
    })
    .await;
    let new = names(&settled_web_pods(&run.east, &run.ns, 3, &names(&old)).await);
    let all = run.west_load.answered_by(t0, &new).await;
    let t1 = all.max(now_ms()) + TAIL;
    let (w, e) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1)
    );
    // the first answer: when the first successful request begun after the scale-up ended
    let first_ok = |recs: &[Rec]| {
        recs.iter()
            .filter(|r| r.sent >= t0 && r.ok && r.cluster == EAST)
            .map(|r| r.sent + r.took)
            .min()
    };
    let (wf, ef) = (first_ok(&w), first_ok(&e));
    let after_ready = |t: Option<i64>| t.map_or("none".to_string(), |t| secs(first_ready, t));
    let west_after_ready = after_ready(wf);
    let after = snapshot(&run.west, &[&run.ns]).await;
    conclude(
        Report {
            id: "81-traffic-c-scale-from-zero",
            scenario: "Traffic c: east scaled from 0 to 3 pods; west calls the follower by DNS name",
            done: &format!(
                "east's web scaled to 0 (west's kube-proxies sending to none of its pods), then to 3; load clients in west (follower) and east (own Service), {RATE} requests/s each"
            ),
            converge: wf.map(|t| Duration::from_millis((t - first_ready).max(0) as u64)),
            // (the row's column cannot be negative: the note gives the signed figures)
            note: format!(
                "converged in: the first east pod Ready (seen by the test, polling every 0.1 s) to west's first answer; west answered {west_after_ready} s and east's own client (the floor) {} s after it (negative: before the test saw it Ready); first pod Ready {} s after the scale-up; west's requests begun {} s after the scale-up reached all 3 pods; from the scale-up until {} s after that (no endpoint at first: failures expected on both sides): west (follower) {}, east (floor) {}",
                after_ready(ef),
                secs(t0, first_ready),
                secs(t0, all),
                secs(all, t1),
                Tally::of(&w, t0, t1).figures(),
                Tally::of(&e, t0, t1).figures(),
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
    assert!(wf.is_some() && ef.is_some(), "both clients answered");
}

/// The chart's release in west (phase d).
const RELEASE: &str = "xcc";

/// Two replicas Ready, none being deleted, the Lease held by one of them: (holder, the other).
async fn two_replicas(
    pods: &Api<Pod>,
    leases: &Api<Lease>,
    lease: &str,
) -> Result<(String, String), String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let all = pods.list(&lp).await.map_err(|e| e.to_string())?.items;
    let ready: Vec<String> = all
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .map(|p| p.name_any())
        .collect();
    if all.len() != 2 || ready.len() != 2 {
        return Err(format!("{} pods, ready: {ready:?}", all.len()));
    }
    let holder = lease_holder(leases, lease).await?;
    match ready.iter().position(|p| *p == holder) {
        Some(i) => Ok((holder, ready[1 - i].clone())),
        None => Err(format!("holder {holder} is not one of {ready:?}")),
    }
}

/// A window of phase d: west's and east's tallies from `t0` until `done` + TAIL.
async fn window(run: &Run, t0: i64, done: i64) -> (Tally, Tally) {
    let t1 = done + TAIL;
    let (w, e) = tokio::join!(
        run.west_load.records_past(t1),
        run.east_load.records_past(t1)
    );
    (Tally::of(&w, t0, t1), Tally::of(&e, t0, t1))
}

/// d. Our side replaced under load: the daemon becomes the chart's two replicas (pods on west's
/// two nodes, reading the same remote Secrets), then its leader pod is deleted, then a `helm
/// upgrade` replaces both pods: west fails no request (the data path does not depend on us).
async fn our_side_replaced(run: &mut Run) {
    let bed = support::bed().await;
    chart_image(WEST).await;
    // the process hands over to the chart: same namespace, same Secrets, same follower
    run.daemon.kill();
    let port = loop {
        let p = free_port();
        if std::net::TcpListener::bind(("127.0.0.2", p)).is_ok() {
            break p;
        }
    };
    let fullname = format!("xcc-{}", &run.ns[run.ns.len() - 8..]);
    let helm_cmd = |verb: &str, workers: u32| {
        let mut c = helm(&bed.kubeconfig);
        c.args([verb, RELEASE, CHART, "--kube-context", WEST, "-n", &run.ns]);
        for s in [
            "image.repository=localhost/cross-cluster-controller".to_string(),
            "image.tag=dev".into(),
            "image.pullPolicy=Never".into(),
            "hostNetwork=true".into(),
            "adminBindPodIP=true".into(),
            format!("adminPort={port}"),
            "apiServerOverride.host=127.0.0.1".into(),
            format!("apiServerOverride.port={}", api_port(&bed.kubeconfig, WEST)),
            format!("watchNamespaces={{{}}}", run.ns),
            "leaseDurationSeconds=6".into(),
            format!("workers={workers}"),
            format!("fullnameOverride={fullname}"),
            "remoteReader.enabled=false".into(),
        ] {
            c.args(["--set", &s]);
        }
        c
    };
    let helm_run = |mut c: std::process::Command| async move {
        tokio::task::spawn_blocking(move || support::tools::run(&mut c))
            .await
            .expect("helm task")
    };
    let pods: Api<Pod> = Api::namespaced(run.west.clone(), &run.ns);
    let leases: Api<Lease> = Api::namespaced(run.west.clone(), &run.ns);
    let before = snapshot(&run.west, &[&run.ns]).await;
    let t0 = now_ms();
    helm_run(helm_cmd("install", 4)).await;
    let (leader, standby) = eventually("the chart's two replicas Ready, one leading", WAIT, || {
        two_replicas(&pods, &leases, &fullname)
    })
    .await;
    let installed = now_ms();
    let (wi, ei) = window(run, t0, installed).await;

    // the leader pod deleted (SIGTERM, the chart's grace): the standby takes over
    let t1 = now_ms();
    pods.delete(&leader, &DeleteParams::default())
        .await
        .expect("delete the leader pod");
    let taken = eventually("another pod leading, two replicas again", WAIT, || async {
        let (l, s) = two_replicas(&pods, &leases, &fullname).await?;
        (l != leader && s != leader)
            .then_some(l)
            .ok_or_else(|| format!("{leader} still there"))
    })
    .await;
    let replaced = now_ms();
    let (wd, ed) = window(run, t1, replaced).await;

    // helm upgrade with a changed value: both pods replaced, one at a time
    let old: BTreeSet<String> = [taken.clone(), standby.clone()].into();
    let t2 = now_ms();
    helm_run(helm_cmd("upgrade", 8)).await;
    eventually("both pods replaced, one leading", WAIT, || async {
        let (l, s) = two_replicas(&pods, &leases, &fullname).await?;
        (!old.contains(&l) && !old.contains(&s))
            .then_some(())
            .ok_or_else(|| format!("old pods left: {l} {s}"))
    })
    .await;
    let upgraded = now_ms();
    let (wu, eu) = window(run, t2, upgraded).await;
    let after = snapshot(&run.west, &[&run.ns]).await;
    conclude(
        Report {
            id: "82-traffic-d-our-side-replaced",
            scenario: "Traffic d: our side replaced under load (the chart's two replicas: install over the running process, the leader pod deleted, helm upgrade)",
            done: &format!(
                "the daemon process SIGKILLed and helm install of the chart (2 replicas on west's 2 nodes, hostNetwork, the same remote Secrets); then kubectl delete of the leader pod; then helm upgrade --set workers=8; load clients in west (follower) and east (own Service), {RATE} requests/s each"
            ),
            converge: Some(Duration::from_millis((upgraded - t2).max(0) as u64)),
            note: format!(
                "converged in: helm upgrade to both new pods Ready with one leading; install over the killed process ({} s to two Ready, one leading): west (follower) {}, east (floor) {}; leader pod deleted ({} s to another leading): west {}, east {}; helm upgrade: west {}, east {}",
                secs(t0, installed),
                wi.figures(),
                ei.figures(),
                secs(t1, replaced),
                wd.figures(),
                ed.figures(),
                wu.figures(),
                eu.figures(),
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
    // the cluster-wide objects go with the release (the namespace goes when the test ends)
    let mut uninstall = helm(&bed.kubeconfig);
    uninstall.args(["uninstall", RELEASE, "--kube-context", WEST, "-n", &run.ns]);
    helm_run(uninstall).await;
    for (what, t) in [
        ("install", &wi),
        ("leader pod deleted", &wd),
        ("helm upgrade", &wu),
    ] {
        assert!(t.sent > 0, "{what}: west sent nothing");
        assert_eq!(t.failed, 0, "{what}: west failed requests: {:?}", t.fails);
    }
}

#[test]
fn the_load_clients_lines_parse() {
    let recs = traffic::parse(
        "0 1000 3 ok 200 pod=web-a cluster=east path=/\n\
         2 1100 4 ok 503 terminating\n\
         1 1050 2000 fail connect: Connection timed out (port 40312)\nweb: noise\n",
    );
    assert_eq!(recs.len(), 3);
    let recs = [recs[0].clone(), recs[2].clone(), recs[1].clone()];
    assert!(recs[0].ok && recs[0].pod == "web-a" && recs[0].cluster == "east");
    assert!(!recs[1].ok && recs[1].took == 2000 && recs[1].why.contains("timed out"));
    assert_eq!(traffic::failed_port(&recs[1].why), Some(40312));
    assert_eq!(
        traffic::failed_port("resolve web: Name or service not known"),
        None
    );
    assert!(!recs[2].ok, "a non-2xx answer is a failure");
    let t = Tally::of(&recs, 1000, 1100);
    assert_eq!((t.sent, t.failed), (2, 1));
    // a window is complete once every request begun before its end has ended
    assert!(traffic::complete_before(&recs, 1100).is_ok());
    assert!(
        traffic::complete_before(&recs[..2], 1100).is_err(),
        "request 2 not yet ended"
    );
    let out_of_order = [recs[0].clone(), recs[2].clone()];
    assert!(
        traffic::complete_before(&out_of_order, 1100).is_err(),
        "request 1 (begun before 1100) still running"
    );
}
