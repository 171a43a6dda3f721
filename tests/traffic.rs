//! Packets, not just objects: the bed's pod network (testbed/net.sh), kube-proxy and CoreDNS
//! carry real requests between ordinary pods of two clusters with nodes, and the first request
//! through a follower: a client pod in west calling `http://web.<ns>.svc.cluster.local` is
//! answered by the pods running in east, through the follower and the EndpointSlices the real
//! daemon wrote.
mod support;

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_flag};
use support::node::{
    LOAD_IMAGE, WEB_IMAGE, exec, node_cluster, pod_ready, wait_dns, workload_images,
};
use support::{client, eventually, namespace_in, obj};
use tokio::sync::OnceCell;

/// Two clusters with nodes of their own; other tests never use them.
const EAST: &str = "traffic-east";
const WEST: &str = "traffic-west";
/// Start-up of pods on a busy two-core machine: seconds, with room to spare.
const WAIT: Duration = Duration::from_secs(120);

static CLUSTERS: OnceCell<()> = OnceCell::const_new();

/// Both clusters with a node, the workload images on them, and CoreDNS answering in each.
async fn clusters() {
    CLUSTERS
        .get_or_init(|| async {
            node_cluster(EAST).await;
            node_cluster(WEST).await;
            workload_images(&[EAST, WEST]).await;
            tokio::join!(wait_dns(EAST), wait_dns(WEST));
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
