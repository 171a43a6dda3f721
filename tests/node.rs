//! A node on the test bed (`testbed/bed node`): a real kubelet with containerd and runc runs
//! real pods. A hardened host-network pod from an image built here becomes Ready, with its
//! security settings in force inside the container and its service-account token mounted
//! (what in-cluster config reads); logs and exec go from the API server to the kubelet; a
//! Deployment rolls, and a PodDisruptionBudget guards evictions.
mod support;

use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, EvictParams, ListParams, LogParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::free_port;
use support::node::{import_image, kubectl, node_cluster, node_name, static_c_binary};
use support::{absent, client, config, eventually, namespace_in, obj};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The cluster with a node; other tests never use it.
const CLUSTER: &str = "nodal";
/// Start-up of a container on a busy two-core machine: seconds, with room to spare.
const WAIT: Duration = Duration::from_secs(90);
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
const PAUSE: &str = "testbed.invalid/pause:1";

fn ready(pod: &Pod) -> Result<(), String> {
    let status = pod.status.as_ref().ok_or("no status yet")?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if status.phase.as_deref() == Some("Running") && ready {
        Ok(())
    } else {
        Err(format!(
            "phase {:?}, conditions {:?}, containers {:?}",
            status.phase, status.conditions, status.container_statuses
        ))
    }
}

async fn http_get(port: u16, path: &str) -> Result<String, String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut out = String::new();
    s.read_to_string(&mut out)
        .await
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// `key=value` lines of the responder's report.
fn field<'a>(report: &'a str, key: &str) -> &'a str {
    report
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in the report:\n{report}"))
}

#[tokio::test]
async fn a_hardened_host_network_pod_becomes_ready_and_reads_its_service_account() {
    node_cluster(CLUSTER).await;
    let build = tempfile::tempdir().expect("temp dir");
    let hello = static_c_binary("testbed/node/hello.c", build.path());
    import_image(CLUSTER, "testbed.invalid/hello:1", &hello).await;

    let nodes: Api<Node> = Api::all(client(CLUSTER).await);
    let node = nodes.get(&node_name(CLUSTER)).await.expect("the node");
    let addresses = node.status.and_then(|s| s.addresses).unwrap_or_default();
    assert!(
        addresses
            .iter()
            .any(|a| a.type_ == "InternalIP" && a.address == "127.0.0.1"),
        "the node's address is loopback: {addresses:?}"
    );

    let ns = namespace_in("node-pod", &[CLUSTER]).await;
    let pods: Api<Pod> = Api::namespaced(client(CLUSTER).await, &ns.name);
    let port = free_port();
    let pod: Pod = obj(json!({
        "metadata": {"name": "hello"},
        "spec": {
            "hostNetwork": true,
            "terminationGracePeriodSeconds": 5,
            "securityContext": {
                "runAsNonRoot": true, "runAsUser": 65532, "runAsGroup": 65532,
                "seccompProfile": {"type": "RuntimeDefault"}
            },
            "containers": [{
                "name": "hello",
                "image": "testbed.invalid/hello:1",
                "imagePullPolicy": "Never",
                "args": [port.to_string()],
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "readOnlyRootFilesystem": true,
                    "capabilities": {"drop": ["ALL"]}
                },
                "readinessProbe": {"httpGet": {"path": "/ready", "port": port}, "periodSeconds": 1}
            }]
        }
    }));
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create the pod");
    let running = eventually("the pod Running and Ready", WAIT, || async {
        let p = pods.get("hello").await.map_err(|e| e.to_string())?;
        ready(&p).map(|_| p)
    })
    .await;
    let status = running.status.expect("status");
    assert_eq!(status.pod_ip.as_deref(), Some("127.0.0.1"), "host network");
    assert_eq!(
        running.spec.as_ref().and_then(|s| s.node_name.clone()),
        Some(node_name(CLUSTER)),
        "scheduled by the scheduler onto the node"
    );

    // the service-account token volume the ServiceAccount admission plugin adds
    let spec = running.spec.expect("spec");
    let mount = spec.containers[0]
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == SA_DIR)
        .expect("the token volume is mounted at the in-cluster path");
    let volume = spec
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == mount.name)
        .expect("the mounted volume");
    let sources = volume
        .projected
        .as_ref()
        .and_then(|p| p.sources.clone())
        .expect("a projected volume");
    assert!(
        sources.iter().any(|s| s.service_account_token.is_some())
            && sources.iter().any(|s| s
                .config_map
                .as_ref()
                .is_some_and(|c| c.name == "kube-root-ca.crt")),
        "token and kube-root-ca.crt: {sources:?}"
    );

    // what the container itself sees (it answers on the host's loopback)
    let report = http_get(port, "/")
        .await
        .expect("the pod answers on loopback");
    assert!(report.starts_with("HTTP/1.0 200"), "{report}");
    assert_eq!(field(&report, "uid"), "65532", "{report}");
    assert_eq!(field(&report, "gid"), "65532", "{report}");
    assert_eq!(field(&report, "rootfs"), "read-only", "{report}");
    assert_eq!(
        field(&report, "capeff"),
        "0000000000000000",
        "no capability"
    );
    assert_eq!(
        field(&report, "seccomp"),
        "2",
        "a seccomp filter (RuntimeDefault)"
    );
    for f in ["token", "ca.crt"] {
        let size: i64 = field(&report, &format!("{SA_DIR}/{f}")).parse().unwrap();
        assert!(size > 0, "{f} is mounted and not empty:\n{report}");
    }
    let ns_size: usize = field(&report, &format!("{SA_DIR}/namespace"))
        .parse()
        .unwrap();
    assert_eq!(ns_size, ns.name.len(), "the namespace file names the pod's");

    // the API server reaches the kubelet (its client certificate, the kubelet's serving one)
    let logs = pods
        .logs("hello", &LogParams::default())
        .await
        .expect("logs through the kubelet");
    assert!(
        logs.contains(&format!("listening on 127.0.0.1:{port}")),
        "{logs}"
    );
    let exec = kubectl(CLUSTER)
        .args(["-n", &ns.name, "exec", "hello", "--", "/hello", "check"])
        .output()
        .expect("run kubectl exec");
    let exec_out = String::from_utf8_lossy(&exec.stdout);
    assert!(
        exec.status.success(),
        "exec in the container: {exec_out}{}",
        String::from_utf8_lossy(&exec.stderr)
    );
    assert!(exec_out.contains("uid=65532"), "{exec_out}");

    // the kubelet stops the container and confirms the deletion
    pods.delete("hello", &DeleteParams::default())
        .await
        .expect("delete the pod");
    eventually("the pod gone", WAIT, || absent(&pods, "hello")).await;
    assert!(
        http_get(port, "/").await.is_err(),
        "the container no longer listens"
    );
}

#[tokio::test]
async fn a_deployment_rolls_and_a_disruption_budget_guards_evictions() {
    node_cluster(CLUSTER).await;
    let ns = namespace_in("node-rollout", &[CLUSTER]).await;
    let c = client(CLUSTER).await;
    let deployments: Api<Deployment> = Api::namespaced(c.clone(), &ns.name);
    let pods: Api<Pod> = Api::namespaced(c.clone(), &ns.name);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(c, &ns.name);
    // kube's client retries a 429 (up to 15 times, minutes): a refused eviction must come back
    let mut once = config(CLUSTER).await;
    once.default_retry = false;
    let evictions: Api<Pod> = Api::namespaced(kube::Client::try_from(once).unwrap(), &ns.name);

    // two replicas of the pause program on the one node (it listens on nothing, so two fit
    // the host network)
    let deployment: Deployment = obj(json!({
        "metadata": {"name": "idle"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "idle"}},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": {"app": "idle"}},
                "spec": {
                    "hostNetwork": true,
                    "terminationGracePeriodSeconds": 2,
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532},
                    "containers": [{"name": "idle", "image": PAUSE, "imagePullPolicy": "Never"}]
                }
            }
        }
    }));
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create the deployment");
    let rolled = |generation_at_least: i64| {
        let deployments = deployments.clone();
        async move {
            let d = deployments.get("idle").await.map_err(|e| e.to_string())?;
            let s = d.status.clone().unwrap_or_default();
            let generation = d.metadata.generation.unwrap_or(0);
            if generation >= generation_at_least
                && s.observed_generation == Some(generation)
                && s.updated_replicas == Some(2)
                && s.available_replicas == Some(2)
                && s.replicas == Some(2)
            {
                Ok(())
            } else {
                Err(format!("generation {generation}, status {s:?}"))
            }
        }
    };
    eventually("2 of 2 replicas available", WAIT, || rolled(1)).await;

    // a rolling update: a new ReplicaSet replaces both pods, one at a time
    let before: Vec<String> = pods
        .list(&ListParams::default().labels("app=idle"))
        .await
        .unwrap()
        .items
        .iter()
        .map(|p| p.name_any())
        .collect();
    deployments
        .patch(
            "idle",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"template": {"metadata": {"annotations": {"rev": "2"}}}}}),
            ),
        )
        .await
        .expect("change the template");
    eventually("the rollout complete", WAIT, || rolled(2)).await;
    eventually("only new pods left", WAIT, || async {
        let now: Vec<String> = pods
            .list(&ListParams::default().labels("app=idle"))
            .await
            .map_err(|e| e.to_string())?
            .items
            .iter()
            .map(|p| p.name_any())
            .collect();
        if now.len() == 2 && now.iter().all(|n| !before.contains(n)) {
            Ok(())
        } else {
            Err(format!("before {before:?}, now {now:?}"))
        }
    })
    .await;

    // a budget that allows no disruption refuses an eviction; one that allows one admits it,
    // and the Deployment replaces the evicted pod
    let budget: PodDisruptionBudget = obj(json!({
        "metadata": {"name": "idle"},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "idle"}}}
    }));
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create the budget");
    let allowed = |n: i32| {
        let budgets = budgets.clone();
        async move {
            let b = budgets.get("idle").await.map_err(|e| e.to_string())?;
            let s = b.status.clone().unwrap_or_default();
            if s.observed_generation == b.metadata.generation
                && s.current_healthy == 2
                && s.disruptions_allowed == n
            {
                Ok(())
            } else {
                Err(format!("{s:?}"))
            }
        }
    };
    eventually("the budget observed: 0 disruptions allowed", WAIT, || {
        allowed(0)
    })
    .await;
    let victim = pods
        .list(&ListParams::default().labels("app=idle"))
        .await
        .unwrap()
        .items[0]
        .name_any();
    match evictions.evict(&victim, &EvictParams::default()).await {
        Err(kube::Error::Api(s)) if s.code == 429 => {}
        other => panic!("the budget must refuse the eviction with 429, got {other:?}"),
    }
    budgets
        .patch(
            "idle",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"minAvailable": 1}})),
        )
        .await
        .expect("relax the budget");
    eventually("the budget observed: 1 disruption allowed", WAIT, || {
        allowed(1)
    })
    .await;
    evictions
        .evict(&victim, &EvictParams::default())
        .await
        .expect("the eviction is admitted");
    eventually("the evicted pod gone", WAIT, || absent(&pods, &victim)).await;
    eventually("2 of 2 replicas available again", WAIT, || rolled(2)).await;
}

/// A node registers in a zone and a region of its own cluster (the kubelet's `--node-labels`),
/// what kube-proxy's topology routing and the daemon's locality hints read.
#[tokio::test]
async fn a_node_registers_in_a_zone_of_its_own_cluster() {
    node_cluster(CLUSTER).await;
    let nodes: Api<Node> = Api::all(client(CLUSTER).await);
    let node = nodes.get(&node_name(CLUSTER)).await.expect("the node");
    let labels = node.labels();
    assert_eq!(
        labels
            .get("topology.kubernetes.io/zone")
            .map(String::as_str),
        Some(format!("{CLUSTER}-a").as_str()),
        "{labels:?}"
    );
    assert_eq!(
        labels
            .get("topology.kubernetes.io/region")
            .map(String::as_str),
        Some(CLUSTER),
        "{labels:?}"
    );
}
