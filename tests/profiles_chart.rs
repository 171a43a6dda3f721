//! The chart's ClusterProfile remotes for real (issue 30): the image built here, the chart
//! installed with `helm install` on traffic-west (a cluster with a node and a pod network, as
//! tests/data_path.rs uses it) with `clusterProfiles.enabled`, `secretReader` and one provider,
//! the reference `secretreader` plugin of cluster-inventory-api, and no other remote source
//! (`remoteSecretSelector` empty, no static remote): whatever reaches west can only come through
//! a profile. The daemon runs as the chart's pod with its in-cluster identity; it lists and
//! watches the ClusterProfiles of its own namespace (the hub is west itself), runs the plugin in
//! its container, and the plugin, with the pod's identity, reads east's token from the Secret
//! `<release namespace>/east-spoke` of west. East (an API-only cluster of the bed) is reached
//! at the address pods reach its API server at (10.250.C.1), with its CA.
//!
//! A file of its own, not a test of tests/chart.rs: it needs a cluster with a node and the image
//! (minutes of set-up), and a CRD on that cluster, while chart.rs's tests run on the API-only
//! east and west in seconds.
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, LogParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::fault::{Lost, Report, conclude, snapshot};
use support::fleet::{SECRETREADER, access_entry, create_profile_in, remote_access_token};
use support::node::{
    chart_image, node_cluster, pod_admin_get, pod_network_server, pod_ready, release_pod,
};
use support::rbac::{granted, profiles_hub_needs, secretreader_needs, show, union};
use support::remotes::export;
use support::tools::{CHART, helm};
use support::{REMOTE, bed, client, eventually, namespace_in, present};

/// The cluster with a node (tests/data_path.rs's, so a full run starts no other one).
const WEST: &str = "traffic-west";
const RELEASE: &str = "xcc";
/// The Secret of west whose `token` the plugin gives for east (the profile's `clusterName`).
const SPOKE: &str = "east-spoke";
const ADMIN_PORT: u16 = 8080;
const WAIT: Duration = Duration::from_secs(120);

/// The release's full name (and so its ServiceAccount's and election Lease's name).
/// What the daemon sends the hub here: list and watch the profiles, patch their status.
fn profile_rights() -> support::rbac::Rights {
    union(
        &profiles_hub_needs(),
        &support::rbac::profiles_report_needs(),
    )
}

fn fullname(ns: &str) -> String {
    format!("xcc-{}", &ns[ns.len() - 8..])
}

/// The chart's values: one replica on the pod network writing into `ns` only, ClusterProfiles
/// of the release namespace with the `secretreader` provider (`install_hint` changes nothing the
/// plugin sees: an upgrade with another one changes only the provider file), and the plugin in
/// the pod by a hostPath. The bed's kubelets run on this machine, so a hostPath to the folder
/// testbed/inventory.sh built works here; real users deliver plugins with an image volume or an
/// emptyDir filled by an initContainer (`extraVolumes`, `initContainers`).
fn values(ns: &str, install_hint: &str) -> Value {
    let folder = support::inventory::folder();
    json!({
        "image": {"repository": "localhost/cross-cluster-controller", "tag": "dev",
                  "pullPolicy": "Never"},
        "replicaCount": 1,
        "fullnameOverride": fullname(ns),
        "watchNamespaces": [ns],
        "leaseDurationSeconds": 6,
        "remoteReader": {"enabled": false},
        "remoteSecretSelector": "",
        "clusterProfiles": {
            "enabled": true,
            "secretReader": true,
            "reportAs": "west",
            "providers": [{"name": SECRETREADER, "execConfig": {
                "apiVersion": "client.authentication.k8s.io/v1",
                "command": "/plugins/secretreader-plugin",
                "provideClusterInfo": true,
                "installHint": install_hint}}]
        },
        "extraVolumes": [{"name": "plugins",
                          "hostPath": {"path": folder, "type": "Directory"}}],
        "extraVolumeMounts": [{"name": "plugins", "mountPath": "/plugins", "readOnly": true}],
    })
}

/// `helm install` (or `upgrade`) of the chart into `ns` of west with [`values`].
async fn helm_with(verb: &str, ns: &str, install_hint: &str) {
    let bed = bed().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("values.json");
    std::fs::write(&file, values(ns, install_hint).to_string()).unwrap();
    let mut c = helm(&bed.kubeconfig);
    c.args([verb, RELEASE, CHART, "--kube-context", WEST, "-n", ns, "-f"])
        .arg(&file);
    tokio::task::spawn_blocking(move || support::tools::run(&mut c))
        .await
        .expect("helm task");
}

/// East's cluster as a profile's access provider carries it for pods: its API server's address
/// on the bed's network and its CA.
async fn east_cluster() -> Value {
    let mut cluster = support::fleet::Fleet::cluster_of(REMOTE).await;
    cluster["server"] = json!(pod_network_server(REMOTE).await);
    cluster
}

/// The pod's log, or why there is none.
async fn log_of(pods: &Api<Pod>, pod: &str) -> String {
    pods.logs(pod, &LogParams::default())
        .await
        .unwrap_or_else(|e| format!("(no log of {pod}: {e})"))
}

/// The follower's endpoint addresses in `ns` of west.
async fn follower_addresses(west: &Client, ns: &str) -> Result<BTreeSet<String>, String> {
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), ns);
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let list = slices.list(&lp).await.map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .flat_map(|e| e.addresses.iter().cloned())
        .collect())
}

/// The release's one pod once it is Ready, is not `old` and `old` is gone: its name and address.
async fn replaced(pods: &Api<Pod>, old: &str) -> Result<(String, String), String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
    match list.items.as_slice() {
        [p] if p.name_any() != old && pod_ready(p) => {
            let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone());
            Ok((p.name_any(), ip.ok_or("no pod IP")?))
        }
        items => Err(format!(
            "pods {:?}",
            items
                .iter()
                .map(|p| (p.name_any(), pod_ready(p)))
                .collect::<Vec<_>>()
        )),
    }
}

/// `/readyz` of the pod at `ip` once it names east synced (the remote is named after the
/// profile).
async fn east_synced(ip: &str) -> String {
    eventually("remote east synced on /readyz", WAIT, || async {
        let body = pod_admin_get(ip, ADMIN_PORT, "/readyz").await?;
        body.lines()
            .any(|l| l.trim() == "remote east: synced")
            .then(|| body.clone())
            .ok_or(body)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_reads_a_remote_from_a_cluster_profile_with_the_secretreader_plugin() {
    node_cluster(WEST).await;
    let kc = bed().await.kubeconfig.clone();
    chart_image(WEST).await;
    support::inventory::install_crd(WEST).await;
    let ns = namespace_in("profiles-chart", &[REMOTE, WEST]).await;
    let west = client(WEST).await;
    let pods: Api<Pod> = Api::namespaced(west.clone(), &ns.name);
    let followers: Api<Service> = Api::namespaced(west.clone(), &ns.name);

    // east exports web; its token, minted by remote-access, in west's Secret east-spoke
    export(REMOTE, &ns.name, "web", "web-1", "10.30.0.1").await;
    let token = remote_access_token(REMOTE, &ns.name, "1h").await;
    let spoke: Secret = support::obj(json!({"metadata": {"name": SPOKE},
                                           "stringData": {"token": token}}));
    Api::<Secret>::namespaced(west.clone(), &ns.name)
        .create(&PostParams::default(), &spoke)
        .await
        .expect("the spoke's token Secret");

    // the chart, Ready with no profile yet (the listing of none is complete)
    helm_with("install", &ns.name, "first").await;
    let (pod, ip) = release_pod(&pods, RELEASE, WAIT).await;
    let metrics = pod_admin_get(&ip, ADMIN_PORT, "/metrics")
        .await
        .expect("metrics");
    assert_eq!(
        support::metrics::series_value(&metrics, "xcc_remote_profiles_refused", &[]),
        Ok(0.0)
    );

    // the profile, as a cluster manager would publish it: its remote joins, east's web follows
    let access = access_entry(SECRETREADER, east_cluster().await, SPOKE, json!([]));
    let created = Instant::now();
    create_profile_in(
        &west,
        &ns.name,
        "east",
        json!({"accessProviders": [access]}),
    )
    .await;
    eventually("the follower of east's web in west", WAIT, || {
        present(&followers, "web")
    })
    .await;
    let joined = created.elapsed();
    let addresses = eventually("the follower's endpoint from east", WAIT, || async {
        let a = follower_addresses(&west, &ns.name).await?;
        a.contains("10.30.0.1")
            .then_some(a.clone())
            .ok_or(format!("{a:?}"))
    })
    .await;
    // what west sees of east, written back on the profile (the chart's patch on their status)
    let ours = support::fleet::condition_true(
        &west,
        &ns.name,
        "east",
        "cross-cluster-controller.fair.com/ConnectedFrom.west",
    )
    .await;
    assert_eq!(ours["reason"], "Connected", "{ours}");
    let readyz = east_synced(&ip).await;
    let metrics = pod_admin_get(&ip, ADMIN_PORT, "/metrics")
        .await
        .expect("metrics");
    let value = |name: &str, labels: &[(&str, &str)]| {
        support::metrics::series_value(&metrics, name, labels)
    };
    assert_eq!(value("xcc_remote_up", &[("remote", "east")]), Ok(1.0));
    assert_eq!(value("xcc_remote_profiles_refused", &[]), Ok(0.0));
    let web = followers.get("web").await.expect("the follower");
    let before = snapshot(&west, &[&ns.name]).await;

    // the daemon's identity: exactly what it sends (and what the plugin it runs sends) on top of
    // its own rights, in the profiles' namespace, which is the release's; nothing was refused
    let writer = format!("system:serviceaccount:{}:{}", ns.name, fullname(&ns.name));
    let (kc2, ns2, who) = (kc.clone(), ns.name.clone(), writer.clone());
    let (has, elsewhere) = tokio::task::spawn_blocking(move || {
        (
            granted(&kc2, WEST, &ns2, &who),
            granted(&kc2, WEST, "default", &who),
        )
    })
    .await
    .expect("can-i task");
    let own = support::rbac::writer_needs_without_secrets();
    let beyond: support::rbac::Rights = has
        .iter()
        .filter(|(k, v)| own.get(*k) != Some(*v))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let first_log = log_of(&pods, &pod).await;

    // a changed provider file alone rolls the pod (the checksum on the pod template); the new
    // pod reads east from the profile again, and the follower stays
    let deployments: Api<Deployment> = Api::namespaced(west.clone(), &ns.name);
    let checksum = |d: &Deployment| {
        d.spec
            .as_ref()
            .and_then(|s| s.template.metadata.as_ref())
            .and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get("checksum/cluster-profiles").cloned())
    };
    let old_sum = checksum(&deployments.get(&fullname(&ns.name)).await.unwrap());
    let upgrade = Instant::now();
    helm_with("upgrade", &ns.name, "second").await;
    let new_sum = checksum(&deployments.get(&fullname(&ns.name)).await.unwrap());
    let (second, second_ip) = eventually("a new pod Ready, the old one gone", WAIT, || {
        replaced(&pods, &pod)
    })
    .await;
    east_synced(&second_ip).await;
    let rolled = upgrade.elapsed();
    let second_log = log_of(&pods, &second).await;
    let after = snapshot(&west, &[&ns.name]).await;
    let kept = followers
        .get("web")
        .await
        .expect("the follower after the roll");
    // the release's own objects change with the upgrade (its ConfigMap) and the roll (the
    // metrics Service's Endpoints and slices, written by west's controllers): not the daemon's
    let own_objects = format!("/{}-", fullname(&ns.name));
    let touched: Vec<String> = before
        .non_followers_touched(&after)
        .into_iter()
        .filter(|o| !o.contains(&own_objects))
        .collect();

    let note = format!(
        "profile created to east's web followed in west {:.1} s (endpoints {addresses:?}); \
         the writer beyond its own rights in the release namespace: {}; in default: {}; \
         helm upgrade changing only the provider file to a new pod with east synced {:.1} s, \
         the follower kept its uid",
        joined.as_secs_f64(),
        show(&beyond),
        show(&elsewhere),
        rolled.as_secs_f64()
    );
    println!("profiles chart: {note}");
    conclude(
        Report {
            id: "94-chart-cluster-profiles",
            scenario: "The chart with clusterProfiles on a real node: a remote from a ClusterProfile, its credential from the reference secretreader plugin run in the chart's pod",
            done: "the image built and imported, helm install (remoteSecretSelector empty, clusterProfiles.enabled and secretReader, the plugin by extraVolumes), east's token by remote-access in west's Secret east-spoke, a ClusterProfile east pointing at east's API server on the pod network; can-i --list of the writer; helm upgrade changing only the provider file",
            converge: Some(joined),
            note: note.clone(),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &touched,
    );
    assert!(
        readyz.lines().any(|l| l.trim() == "remote east: synced"),
        "{readyz}"
    );
    assert_eq!(
        has,
        union(&own, &union(&profile_rights(), &secretreader_needs())),
        "the writer in the release and profiles' namespace: {}",
        show(&has)
    );
    assert_eq!(
        beyond,
        union(&profile_rights(), &secretreader_needs()),
        "beyond its own rights: list/watch ClusterProfiles, patch their status, get Secrets, no more"
    );
    // elsewhere only the ClusterRole's reads (watchNamespaces): no ClusterProfile, no Secret
    let outside = support::rbac::rules(&[
        ("endpoints", support::rbac::RO),
        ("endpointslices.discovery.k8s.io", support::rbac::RO),
        ("namespaces", support::rbac::RO),
        ("nodes", &["list", "watch"]),
        ("servicecidrs.networking.k8s.io", &["list", "watch"]),
        ("ippools.crd.projectcalico.org", &["list", "watch"]),
        ("ciliumnodes.cilium.io", &["list", "watch"]),
        ("services", support::rbac::RO),
    ]);
    assert_eq!(elsewhere, outside, "in default: {}", show(&elsewhere));
    for (which, log) in [("first", &first_log), ("second", &second_log)] {
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "the {which} pod was refused a request:\n{log}"
        );
        assert!(
            !log.contains("eyJ"),
            "a token in the {which} pod's log:\n{log}"
        );
    }
    assert!(
        old_sum.is_some() && old_sum != new_sum,
        "the provider file's checksum: {old_sum:?} then {new_sum:?}"
    );
    assert_eq!(kept.uid(), web.uid(), "the follower was never re-created");
}
