//! The production path, as pods: the image built here (scripts/build-image), imported into the
//! node of cluster `nodal`, the chart installed there with helm. The daemon runs as a pod with its
//! in-cluster identity (projected service-account token and CA, KUBERNETES_SERVICE_HOST/PORT),
//! becomes Ready through the chart's probes, reads its static remote (east) from the mounted
//! Secret, and mirrors; the kubelet enforces the chart's security settings on the running
//! container; a rolling restart and a deleted pod hand the Lease over without losing a follower.
//! The bed's cluster `nodal` has one node and no pod network: one replica (two host-network
//! replicas cannot share a node's ports; tests/node_replicas.rs runs two on a cluster with two
//! nodes), `hostNetwork`, and the API server's loopback address.
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};
use kube::{Api, ResourceExt};
use support::daemon::free_port;
use support::fault::{Lost, Report, conclude, snapshot};
use support::node::{
    api_port, chart_image, kubectl, lease_holder, node_cluster, pod_ready, remote_kubeconfig_secret,
};
use support::tools::{CHART, helm, run};
use support::{REMOTE, bed, client, eventually, exported, namespace_in, present, remote_slice};

const CLUSTER: &str = "nodal";
const WAIT: Duration = Duration::from_secs(120);
const RELEASE: &str = "xcc";

/// The one Ready pod of the release (and not being deleted).
async fn ready_pod(pods: &Api<Pod>) -> Result<Pod, String> {
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/instance={RELEASE}"));
    let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
    let live: Vec<&Pod> = list
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_ready(p))
        .collect();
    match live.as_slice() {
        [one] => Ok((*one).clone()),
        _ => Err(format!(
            "{} ready of {}: {:?}",
            live.len(),
            list.items.len(),
            list.items
                .iter()
                .map(|p| (
                    p.name_any(),
                    p.status.as_ref().and_then(|s| s.phase.clone())
                ))
                .collect::<Vec<_>>()
        )),
    }
}

async fn holder(leases: &Api<Lease>) -> Result<String, String> {
    lease_holder(leases, "cross-cluster-controller").await
}

/// `key:\tvalue` of /proc/PID/status.
fn proc_status(pid: &str, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"))
}

/// The host PID of a running container, from the node's containerd.
fn container_pid(bed_dir: &Path, container_id: &str) -> String {
    let sock = bed_dir
        .join(CLUSTER)
        .join("node/containerd/containerd.sock");
    let out = run(Command::new("ctr")
        .arg("--address")
        .arg(&sock)
        .args(["-n", "k8s.io", "tasks", "ls"]));
    out.lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(container_id)).then(|| f.next().map(str::to_string))?
        })
        .unwrap_or_else(|| panic!("no task {container_id} in:\n{out}"))
}

#[tokio::test]
async fn the_chart_runs_as_pods_with_its_in_cluster_identity_and_hands_the_lease_over() {
    node_cluster(CLUSTER).await;
    let bed = bed().await;
    let (built, image_ready) = chart_image(CLUSTER).await;
    let ns = namespace_in("node-chart", &[REMOTE, CLUSTER]).await;
    let nodal = client(CLUSTER).await;
    let pods: Api<Pod> = Api::namespaced(nodal.clone(), &ns.name);
    let leases: Api<Lease> = Api::namespaced(nodal.clone(), &ns.name);
    let followers: Api<Service> = Api::namespaced(nodal.clone(), &ns.name);
    let follower_slices: Api<EndpointSlice> = Api::namespaced(nodal.clone(), &ns.name);

    // the static remote's kubeconfig, minted by remote-access against east, in a Secret
    remote_kubeconfig_secret(&nodal, &bed.kubeconfig, REMOTE, &ns.name).await;
    let sets = [
        "image.repository=localhost/cross-cluster-controller".to_string(),
        "image.tag=dev".into(),
        "image.pullPolicy=Never".into(),
        "replicaCount=1".into(),
        "hostNetwork=true".into(),
        "apiServerOverride.host=127.0.0.1".into(),
        format!(
            "apiServerOverride.port={}",
            api_port(&bed.kubeconfig, CLUSTER)
        ),
        format!("adminPort={}", free_port()),
        "remoteKubeconfig.existingSecret=east-kubeconfig".into(),
        "remoteSecretSelector=".into(),
        format!("watchNamespaces={{{}}}", ns.name),
        "leaseDurationSeconds=6".into(),
        "fullnameOverride=cross-cluster-controller".into(),
        "remoteReader.enabled=false".into(),
    ];
    let mut install = helm(&bed.kubeconfig);
    install.args([
        "install",
        RELEASE,
        CHART,
        "--kube-context",
        CLUSTER,
        "-n",
        &ns.name,
    ]);
    for s in &sets {
        install.args(["--set", s]);
    }
    let t0 = Instant::now();
    run(&mut install);

    // Ready through the chart's own probes; in-cluster configuration in its log
    let pod = eventually("the pod Ready", WAIT, || ready_pod(&pods)).await;
    let ready_in = t0.elapsed();
    let logs = pods
        .logs(&pod.name_any(), &LogParams::default())
        .await
        .unwrap();
    assert!(logs.contains("in-cluster"), "{logs}");
    assert!(logs.contains("became leader"), "{logs}");

    // the kubelet enforces the security settings on the running container
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .expect("a container id");
    let id = id.trim_start_matches("containerd://");
    let pid = container_pid(&bed.dir, id);
    let uid = proc_status(&pid, "Uid");
    assert!(uid.split_whitespace().all(|u| u == "65532"), "Uid {uid}");
    assert_eq!(proc_status(&pid, "CapEff"), "0000000000000000");
    assert_eq!(proc_status(&pid, "NoNewPrivs"), "1");
    assert_eq!(
        proc_status(&pid, "Seccomp"),
        "2",
        "RuntimeDefault seccomp filter"
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let root = mountinfo
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/"))
        .expect("the container's root mount");
    assert!(
        root.split_whitespace()
            .nth(5)
            .is_some_and(|o| o.split(',').any(|f| f == "ro")),
        "read-only root filesystem: {root}"
    );

    // mirrors east's leader, with the remote kubeconfig from the mounted Secret
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let east_sl: Api<EndpointSlice> = Api::namespaced(client(REMOTE).await, &ns.name);
    east.create(&PostParams::default(), &exported("web", 80))
        .await
        .unwrap();
    east_sl
        .create(
            &PostParams::default(),
            &remote_slice("web", "web-e", &["10.1.0.1"]),
        )
        .await
        .unwrap();
    let t1 = Instant::now();
    eventually("the follower of east's leader", WAIT, || {
        present(&followers, "web")
    })
    .await;
    let mirrored_in = t1.elapsed();
    let before = snapshot(&nodal, &[&ns.name]).await;
    let web = followers.get("web").await.unwrap();

    // a rolling restart: the old pod releases the Lease on SIGTERM, the new one takes it
    let first = pod.name_any();
    let restart = Instant::now();
    run(kubectl(CLUSTER).args([
        "-n",
        &ns.name,
        "rollout",
        "restart",
        "deployment/cross-cluster-controller",
    ]));
    let second = eventually(
        "a new pod leading after the rolling restart",
        WAIT,
        || async {
            let p = ready_pod(&pods).await?;
            let h = holder(&leases).await?;
            (p.name_any() != first && h == p.name_any())
                .then_some(p.name_any())
                .ok_or(format!("pod {} holder {h}", p.name_any()))
        },
    )
    .await;
    let handed_over = restart.elapsed();
    // a change made now is written by the new leader
    east.create(&PostParams::default(), &exported("after-restart", 80))
        .await
        .unwrap();
    eventually("a change after the restart", WAIT, || {
        present(&followers, "after-restart")
    })
    .await;

    // the leader pod deleted: its replacement takes over
    let delete = Instant::now();
    pods.delete(&second, &DeleteParams::default())
        .await
        .unwrap();
    let third = eventually("a replacement pod leading", WAIT, || async {
        let p = ready_pod(&pods).await?;
        let h = holder(&leases).await?;
        (p.name_any() != second && h == p.name_any())
            .then_some(p.name_any())
            .ok_or(format!("pod {} holder {h}", p.name_any()))
    })
    .await;
    let replaced = delete.elapsed();
    let after = snapshot(&nodal, &[&ns.name]).await;
    assert_eq!(
        followers.get("web").await.unwrap().uid(),
        web.uid(),
        "never re-created"
    );
    assert_eq!(
        follower_slices
            .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
            .await
            .unwrap()
            .items
            .len(),
        1
    );
    // no token in any log of the three pods that ran (the last one's is still readable)
    let logs = pods.logs(&third, &LogParams::default()).await.unwrap();
    assert!(!logs.contains("eyJ"), "a token in the log: {logs}");
    eprintln!("{built}");
    conclude(
        Report {
            id: "45-chart-pods-on-a-real-node",
            scenario: "The chart on a real node: the image built here, in-cluster identity, probes, mounted remote kubeconfig, rolling restart and a deleted leader pod",
            done: "scripts/build-image, the archive imported into nodal's containerd, helm install (1 replica, hostNetwork, API server on loopback, static remote east from a mounted Secret); then kubectl rollout restart; then the leader pod deleted",
            converge: Some(handed_over),
            note: format!(
                "converged in: rollout restart to the new pod Ready and holding the Lease; image built and imported in {:.1} s; helm install to the pod Ready through the chart's probes {:.1} s (log: in-cluster configuration, became leader); east's leader mirrored {:.2} s after it was created; on the running container Uid 65532, CapEff 0, NoNewPrivs 1, Seccomp 2, root mount ro; leader pod deleted to its replacement leading {:.1} s; a change after the restart mirrored; the follower kept its uid; no token in the log",
                image_ready.as_secs_f64(),
                ready_in.as_secs_f64(),
                mirrored_in.as_secs_f64(),
                replaced.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &["web".to_string()].into()),
        &before.non_followers_touched(&after),
    );
}
