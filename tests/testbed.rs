//! Smoke tests proving the test bed is made of real, separate kube-apiservers with real RBAC.
mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServiceAccount};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::{LOCAL, REMOTE, client, config, eventually, namespace, obj};

fn service(name: &str) -> Service {
    obj(json!({
        "metadata": {"name": name},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
}

#[tokio::test]
async fn a_service_lives_in_one_cluster_only_and_gets_a_cluster_ip() {
    let ns = namespace("bed-separate").await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);

    let created = east
        .create(&PostParams::default(), &service("only-east"))
        .await
        .unwrap();
    let ip = created
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the API server allocates a ClusterIP");
    let (east_range, west_range) = (
        support::service_prefix(REMOTE).await,
        support::service_prefix(LOCAL).await,
    );
    assert_ne!(
        east_range, west_range,
        "each cluster has a range of its own"
    );
    assert!(
        ip.starts_with(&east_range),
        "east allocates from its own range ({east_range}*), got {ip}"
    );

    assert!(east.get_opt("only-east").await.unwrap().is_some());
    assert!(
        west.get_opt("only-east").await.unwrap().is_none(),
        "west is a separate cluster"
    );
}

async fn token_for(sa: &str, ns: &str) -> String {
    let sas: Api<ServiceAccount> = Api::namespaced(client(REMOTE).await, ns);
    sas.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": sa}})),
    )
    .await
    .unwrap();
    support::mint_token(REMOTE, ns, sa).await
}

#[tokio::test]
async fn rbac_is_enforced_for_a_token_from_token_request() {
    let ns = namespace("bed-rbac").await;
    let token = token_for("reader", &ns.name).await;

    let mut cfg = config(REMOTE).await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let as_reader: Api<Service> = Api::namespaced(Client::try_from(cfg).unwrap(), &ns.name);

    let err = as_reader
        .list(&ListParams::default())
        .await
        .expect_err("no RBAC yet");
    match err {
        kube::Error::Api(s) => assert_eq!(s.code, 403, "forbidden without a binding: {s:?}"),
        other => panic!("expected 403, got {other:?}"),
    }

    let admin = client(REMOTE).await;
    let roles: Api<Role> = Api::namespaced(admin.clone(), &ns.name);
    roles
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "list-services"},
                "rules": [{"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]})),
        )
        .await
        .unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(admin, &ns.name);
    bindings
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "reader"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "list-services"},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}]})),
        )
        .await
        .unwrap();

    eventually(
        "the RoleBinding to take effect",
        Duration::from_secs(20),
        || async {
            as_reader
                .list(&ListParams::default())
                .await
                .map(|_| ())
                .map_err(|e| e.to_string())
        },
    )
    .await;
}

#[tokio::test]
async fn tokens_of_one_cluster_are_not_valid_in_the_other() {
    let ns = namespace("bed-tokens").await;
    let token = token_for("stranger", &ns.name).await;
    let mut cfg = config(LOCAL).await;
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let api: Api<Service> = Api::namespaced(Client::try_from(cfg).unwrap(), &ns.name);
    match api.list(&ListParams::default()).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 401, "east's token is unknown to west: {s:?}")
        }
        other => panic!("expected 401 Unauthorized, got {other:?}"),
    }
}

fn slice(name: &str, endpoints: usize) -> EndpointSlice {
    let eps: Vec<_> = (0..endpoints)
        .map(|i| json!({"addresses": [format!("10.1.{}.{}", i / 250, i % 250 + 1)]}))
        .collect();
    obj(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": "big"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    }))
}

#[tokio::test]
async fn an_endpoint_slice_holds_at_most_1000_endpoints() {
    let ns = namespace("bed-slice-limit").await;
    let api: Api<EndpointSlice> = Api::namespaced(client(REMOTE).await, &ns.name);
    let ok = api
        .create(&PostParams::default(), &slice("full", 1000))
        .await
        .expect("1000 fit");
    assert_eq!(ok.endpoints.len(), 1000);
    match api
        .create(&PostParams::default(), &slice("over", 1001))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 422, "1001 endpoints are invalid: {s:?}"),
        other => panic!("expected 422 Invalid for 1001 endpoints, got {other:?}"),
    }
}

/// Runs a bash script with testbed/proc.sh sourced; panics with its output unless it exits 0.
fn with_proc_sh(script: &str) {
    let proc_sh = support::repo_root().join("testbed/proc.sh");
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "set -euo pipefail\nsource '{}'\ndir=$(mktemp -d)\n\
             trap 'kill -KILL $(jobs -p) 2>/dev/null || true; rm -rf \"$dir\"' EXIT\n\
             # the interpreter itself, not a shim that execs it (its command line is what is matched)\n\
             py=$(python3 -c 'import sys; print(sys.executable)')\n{script}",
            proc_sh.display()
        ))
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The bed judged start-up liveness by /proc/PID/cmdline, which right after `setsid ... &` can
/// still show the shell or setsid: a process that had not exec'd yet read as "exited during
/// start-up" (a CI failure on a loaded machine). Here the exec is held back on purpose.
#[test]
fn a_bed_process_is_alive_before_during_and_after_its_exec() {
    with_proc_sh(
        r#"
mkfifo "$dir/go"
setsid bash -c 'read -r _ <"$1"; exec "$0" -c "import time; time.sleep(300)" --cluster-mark' "$py" "$dir/go" </dev/null >/dev/null 2>&1 &
proc_record $! "$dir/p.pid"
read -r pid _ <"$dir/p.pid"
proc_alive "$dir/p.pid" || { echo "not alive before its exec"; exit 1; }
if proc_is "$dir/p.pid" "$py" "--cluster-mark"; then echo "is the binary before its exec"; exit 1; fi
echo go >"$dir/go"
for _ in $(seq 1 300); do proc_is "$dir/p.pid" "$py" "--cluster-mark" && break; sleep 0.1; done
proc_is "$dir/p.pid" "$py" "--cluster-mark" || { echo "not recognised after its exec: $(tr '\0' ' ' </proc/$pid/cmdline)"; exit 1; }
proc_signal "$dir/p.pid" "$py" "--cluster-mark" TERM
[ ! -e "$dir/p.pid" ] || { echo "pidfile kept"; exit 1; }
[ "$(proc_state "$pid")" = "" ] || [ "$(proc_state "$pid")" = Z ] || { echo "still running"; exit 1; }
"#,
    );
}

/// A stale pidfile must never reach another process: not one that got the same PID later (other
/// start time), and not one of another cluster (its command line lacks this cluster's mark).
#[test]
fn a_bed_pidfile_never_names_a_reused_pid_or_another_clusters_process() {
    with_proc_sh(
        r#"
setsid "$py" -c "import time; time.sleep(300)" --data-dir /bed/other/etcd </dev/null >/dev/null 2>&1 &
other=$!
proc_record "$other" "$dir/other.pid"
for _ in $(seq 1 300); do proc_is "$dir/other.pid" "$py" "--data-dir /bed/other/etcd" && break; sleep 0.1; done
proc_is "$dir/other.pid" "$py" "--data-dir /bed/other/etcd" || { echo "the other process never started"; exit 1; }
start=$(proc_start "$other")
# the same PID with another start time: what a pidfile left by an ended process looks like
# once the kernel hands its PID to a new one
echo "$other $((start - 1))" >"$dir/reused.pid"
if proc_alive "$dir/reused.pid"; then echo "a reused PID reads as alive"; exit 1; fi
proc_signal "$dir/reused.pid" "$py" "--data-dir /bed/mine/etcd" KILL
# the right PID and start time, but the command line is another cluster's
cp "$dir/other.pid" "$dir/mine.pid"
if proc_is "$dir/mine.pid" "$py" "--data-dir /bed/mine/etcd"; then echo "matched another cluster"; exit 1; fi
proc_signal "$dir/mine.pid" "$py" "--data-dir /bed/mine/etcd" KILL
# the prefix of another cluster's directory is not this cluster's
if proc_is "$dir/other.pid" "$py" "--data-dir /bed/oth"; then echo "matched a prefix"; exit 1; fi
proc_alive "$dir/other.pid" || { echo "another cluster's process was signalled"; exit 1; }
proc_signal "$dir/other.pid" "$py" "--data-dir /bed/other/etcd" KILL
"#,
    );
}

/// A metric assertion must not pass on a page that lacks the series: a renamed metric or label,
/// or a page that is not the daemon's, would otherwise read as 0 and make `== 0` assertions
/// vacuous. A read names the whole label set; a part of it, or a label renamed, is an error.
#[test]
fn a_metric_read_names_one_whole_series_and_fails_when_it_is_absent() {
    use support::metrics::{family_total, series_value, sum_of, writes_of};
    let page = "# HELP xcc_writes Writes.\n# TYPE xcc_writes counter\n\
                xcc_writes_total{kind=\"Service\",verb=\"create\"} 2\n\
                xcc_writes_total{kind=\"Service\",verb=\"update\"} 3\n\
                xcc_writes_total{kind=\"EndpointSlice\",verb=\"update\"} 4\n\
                # HELP xcc_leader Leader.\n# TYPE xcc_leader gauge\nxcc_leader 1\n\
                # HELP xcc_skipped Skipped.\n# TYPE xcc_skipped counter\n\
                xcc_skipped_total{remote=\"a \\\"b\\\", c\",reason=\"X\"} 6\n\
                # HELP xcc_conflicts Conflicts.\n# TYPE xcc_conflicts counter\n# EOF\n";
    let update = [("verb", "update"), ("kind", "Service")];
    assert_eq!(series_value(page, "xcc_writes_total", &update), Ok(3.0));
    assert_eq!(series_value(page, "xcc_leader", &[]), Ok(1.0));
    // an escaped label value is read as written
    assert_eq!(
        series_value(
            page,
            "xcc_skipped_total",
            &[("remote", "a \"b\", c"), ("reason", "X")]
        ),
        Ok(6.0)
    );
    // a part of the label set is not a series (the old read summed 3 + 4 here)
    assert!(series_value(page, "xcc_writes_total", &[("verb", "update")]).is_err());
    // a renamed label, a renamed value, a renamed metric: errors, never 0
    let renamed = series_value(
        page,
        "xcc_writes_total",
        &[("kind", "Service"), ("verbs", "update")],
    );
    assert!(
        renamed
            .as_ref()
            .is_err_and(|e| e.contains("verb=\"update\"")),
        "{renamed:?}"
    );
    assert!(
        series_value(
            page,
            "xcc_writes_total",
            &[("kind", "Service"), ("verb", "delete")]
        )
        .is_err()
    );
    assert!(series_value(page, "xcc_writes_renamed_total", &update).is_err());
    // published, never incremented, no series: absent, not 0
    assert!(series_value(page, "xcc_conflicts_total", &[]).is_err());
    assert!(series_value("", "xcc_leader", &[]).is_err());
    // a sum over an explicit list fails when one of it is absent
    assert_eq!(
        sum_of(
            page,
            "xcc_writes_total",
            &writes_of(&["Service"], &["create", "update"])
        ),
        Ok(5.0)
    );
    assert!(
        sum_of(
            page,
            "xcc_writes_total",
            &writes_of(&["Service", "Endpoints"], &["update"])
        )
        .is_err()
    );
    // "nothing at all": every series of a published family; an absent family is an error
    assert_eq!(family_total(page, "xcc_writes_total"), Ok(9.0));
    assert_eq!(family_total(page, "xcc_conflicts_total"), Ok(0.0));
    assert!(family_total(page, "xcc_writes_renamed_total").is_err());
    assert!(family_total("", "xcc_writes_total").is_err());
    let apiserver =
        "# TYPE apiserver_request_total counter\napiserver_request_total{verb=\"LIST\"} 7\n";
    assert_eq!(family_total(apiserver, "apiserver_request_total"), Ok(7.0));
    assert_eq!(
        series_value(apiserver, "apiserver_request_total", &[("verb", "LIST")]),
        Ok(7.0)
    );
}

/// A controller manager that exits on its own (a crash: its pidfile stays) is noticed: `bed
/// status` calls the cluster degraded and names it, and the next `bed up` says so with its log
/// and starts it again (a cluster without one silently creates no pods).
#[tokio::test]
async fn a_controller_manager_that_died_is_noticed_and_started_again() {
    const CLUSTER: &str = "bed-kcm";
    support::extra_cluster(CLUSTER, "").await;
    let dir = support::bed().await.dir.join(CLUSTER);
    let pidfile = dir.join("kcm.pid");
    let pid = std::fs::read_to_string(&pidfile).expect("kcm.pid");
    let pid = pid.split_whitespace().next().expect("a pid").to_string();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .expect("kill");
    assert!(killed.success(), "kill -KILL {pid}");
    let status = eventually(
        "bed status to call the cluster degraded",
        Duration::from_secs(30),
        || async {
            let out = tokio::task::spawn_blocking(|| support::bed_cmd(&["status"]))
                .await
                .expect("bed task");
            let line = out
                .lines()
                .find(|l| l.starts_with(&format!("{CLUSTER} ")))
                .unwrap_or_default()
                .to_string();
            if line.contains(" degraded ") {
                Ok(line)
            } else {
                Err(line)
            }
        },
    )
    .await;
    assert!(status.contains("kube-controller-manager"), "{status}");
    let said = tokio::task::spawn_blocking(|| support::bed_cmd_stderr(&["up", CLUSTER]))
        .await
        .expect("bed task");
    assert!(
        said.contains(&format!(
            "kube-controller-manager of '{CLUSTER}' had exited"
        )),
        "bed up said: {said}"
    );
    let out = tokio::task::spawn_blocking(|| support::bed_cmd(&["status"]))
        .await
        .expect("bed task");
    assert!(
        out.lines()
            .any(|l| l.starts_with(&format!("{CLUSTER} up "))),
        "{out}"
    );
}

/// A cluster made with an etcd quota (XCC_TESTBED_ETCD_QUOTA_MIB) runs its etcd with it, as etcd
/// itself reports it; asking another quota of it is refused, the same one is a no-op.
#[tokio::test]
async fn a_cluster_made_with_an_etcd_quota_runs_its_etcd_with_it() {
    const CLUSTER: &str = "bed-quota";
    support::quota_cluster(CLUSTER, "96").await;
    let port = support::etcd_port(CLUSTER).await;
    let (code, text) = tokio::task::spawn_blocking(move || {
        support::daemon::http_get(port, "/metrics", Duration::from_secs(5))
    })
    .await
    .expect("metrics task")
    .expect("etcd's metrics");
    assert_eq!(code, 200, "{text}");
    assert_eq!(
        support::metrics::series_value(&text, "etcd_server_quota_backend_bytes", &[]),
        Ok((96u64 << 20) as f64)
    );
    let (ok, said) = tokio::task::spawn_blocking(|| {
        support::bed_try(&["up", CLUSTER], &[("XCC_TESTBED_ETCD_QUOTA_MIB", "128")])
    })
    .await
    .expect("bed task");
    assert!(
        !ok && said.contains("exists with an etcd quota of 96 MiB"),
        "bed up said: {said}"
    );
    support::quota_cluster(CLUSTER, "96").await;
}

/// A bed whose filesystem is nearly full says so in `bed status` (the kubelets evict pods below
/// 1% free, which shows only as pods never ready): a 1 MiB tmpfs as the bed's directory, filled.
#[test]
fn a_nearly_full_disk_is_named_by_the_bed_status() {
    let dir = std::env::temp_dir().join(format!("xcc-tinybed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.to_str().unwrap().to_string();
    let sh = |args: &[&str]| {
        std::process::Command::new(args[0])
            .args(&args[1..])
            .status()
    };
    assert!(
        sh(&["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", &path])
            .unwrap()
            .success()
    );
    std::fs::write(dir.join("fill"), vec![0u8; 1000 * 1024]).unwrap();
    let out = std::process::Command::new("bash")
        .arg(support::repo_root().join("testbed/bed"))
        .arg("status")
        .env("XCC_TESTBED_DIR", &path)
        .output()
        .unwrap();
    // the namespaces `bed` made in there, then the tmpfs itself
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    let mut inside: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .filter(|m| m.starts_with(&format!("{path}/")))
        .collect();
    inside.sort_unstable_by(|a, b| b.cmp(a));
    for m in inside.iter().chain([&path.as_str()]) {
        let _ = sh(&["umount", "-l", m]);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines()
            .next()
            .is_some_and(|l| l.starts_with("disk low:")),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Cluster Inventory API end to end on a hub cluster of the bed: the upstream ClusterProfile
/// CRD (testbed/inventory.sh's pinned snapshot) serves ClusterProfiles with a status subresource,
/// and the reference `secretreader` exec credential plugin built from the same snapshot, run as
/// client-go runs an exec plugin (the profile's cluster and its exec extension in
/// KUBERNETES_EXEC_INFO), answers with the token of the Secret the profile names, and fails with
/// one line naming that Secret when it is missing.
#[tokio::test]
async fn a_cluster_profile_and_the_secretreader_plugin_work_on_a_hub() {
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{
        ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams,
    };
    use support::inventory;

    const HUB: &str = "fleet-hub";
    const TOKEN: &str = "spoke-1-token-5f1c";
    const EXEC_EXTENSION: &str = "client.authentication.k8s.io/exec";
    support::extra_cluster(HUB, "").await;
    inventory::install_crd(HUB).await;
    // idempotent: applying it again succeeds, and it is still established
    inventory::install_crd(HUB).await;
    let ns = support::namespace_in("inventory-hub", &[HUB]).await;
    let hub = client(HUB).await;

    let secrets: Api<Secret> = Api::namespaced(hub.clone(), &ns.name);
    secrets
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "spoke-1"}, "stringData": {"token": TOKEN}})),
        )
        .await
        .expect("create the spoke's Secret");

    // the profile; the status sent with the create is dropped (a status subresource), then set
    // through that subresource and read back as sent
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile"),
        "clusterprofiles",
    );
    let profiles: Api<DynamicObject> = Api::namespaced_with(hub.clone(), &ns.name, &resource);
    let ca_data = "LS0tLS1CRUdJTiBDRVJUSUZJQ0FURS0tLS0tCm5vdCBhIGNlcnRpZmljYXRlCg==";
    let status = json!({"accessProviders": [{
        "name": "secretreader",
        "cluster": {
            "server": "https://127.0.0.1:1",
            "certificate-authority-data": ca_data,
            "extensions": [{"name": EXEC_EXTENSION, "extension": {"clusterName": "spoke-1"}}]
        }
    }]});
    let created = profiles
        .create(
            &PostParams::default(),
            &obj(json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
                "metadata": {"name": "spoke-1"},
                "spec": {"displayName": "spoke 1", "clusterManager": {"name": "xcc-test"}},
                "status": status
            })),
        )
        .await
        .expect("create a ClusterProfile");
    assert_eq!(
        created.data.get("status"),
        None,
        "a create does not set the status: {created:?}"
    );
    profiles
        .patch_status(
            "spoke-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .expect("set the ClusterProfile's status through its subresource");
    let read = profiles
        .get("spoke-1")
        .await
        .expect("read the ClusterProfile");
    assert_eq!(read.data["status"], status, "the status read back");

    // what client-go hands an exec plugin: the profile's cluster, with its exec extension as
    // spec.cluster.config
    let cluster = &read.data["status"]["accessProviders"][0]["cluster"];
    let config = cluster["extensions"]
        .as_array()
        .and_then(|es| es.iter().find(|e| e["name"] == EXEC_EXTENSION))
        .map(|e| e["extension"].clone())
        .expect("the exec extension");
    let exec_info = json!({
        "apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
        "spec": {"interactive": false, "cluster": {
            "server": cluster["server"],
            "certificate-authority-data": cluster["certificate-authority-data"],
            "config": config
        }}
    })
    .to_string();

    // the plugin's own kubeconfig: the hub (its admin), the test namespace as the current
    // context's namespace (the plugin reads the Secret <that namespace>/<clusterName>)
    let bed_kc: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(&support::bed().await.kubeconfig).expect("read kubeconfig"),
    )
    .expect("kubeconfig is YAML");
    let named = |list: &str, name: &str| {
        bed_kc[list]
            .as_sequence()
            .and_then(|s| s.iter().find(|e| e["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("the bed's kubeconfig has no {list} entry {name}"))
    };
    let (hub_cluster, hub_user) = (
        named("clusters", HUB),
        named("users", &format!("{HUB}-admin")),
    );
    // The bed's network rule holds: the plugin runs in this process's network namespace, the
    // bed's (support::bed() asserts it), where only the bed's addresses exist and nothing leaves
    // the machine; it talks only to the hub's API server on loopback (below). The profile's
    // server (127.0.0.1:1) is only passed to it, never dialled by secretreader.
    let server = hub_cluster["cluster"]["server"]
        .as_str()
        .unwrap_or_default();
    assert!(server.starts_with("https://127.0.0.1:"), "{server}");
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("hub.kubeconfig");
    let text = serde_yaml::to_string(&json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [hub_cluster], "users": [hub_user],
        "contexts": [{"name": "hub", "context": {
            "cluster": HUB, "user": format!("{HUB}-admin"), "namespace": ns.name}}],
        "current-context": "hub"
    }))
    .expect("kubeconfig YAML");
    std::fs::write(&kubeconfig, text).expect("write the plugin's kubeconfig");

    let run = || {
        let (plugin, kubeconfig, exec_info) =
            (inventory::plugin(), kubeconfig.clone(), exec_info.clone());
        async move {
            tokio::task::spawn_blocking(move || {
                std::process::Command::new(&plugin)
                    .env("KUBERNETES_EXEC_INFO", exec_info)
                    .env("KUBECONFIG", kubeconfig)
                    // in-cluster configuration would win over KUBECONFIG
                    .env_remove("KUBERNETES_SERVICE_HOST")
                    .env_remove("KUBERNETES_SERVICE_PORT")
                    .output()
                    .unwrap_or_else(|e| panic!("run {}: {e}", plugin.display()))
            })
            .await
            .expect("plugin task")
        }
    };

    let out = run().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "the plugin failed ({}): {stderr}",
        out.status
    );
    let credential: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(
        credential["apiVersion"], "client.authentication.k8s.io/v1",
        "{credential}"
    );
    assert_eq!(credential["kind"], "ExecCredential", "{credential}");
    assert_eq!(credential["status"]["token"], TOKEN, "{credential}");

    secrets
        .delete("spoke-1", &DeleteParams::default())
        .await
        .expect("delete the spoke's Secret");
    let out = run().await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the plugin succeeded without its Secret: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(
        lines.len() == 1 && lines[0].contains(&format!("{}/spoke-1", ns.name)),
        "one line naming the Secret {}/spoke-1, got: {stderr}",
        ns.name
    );
}
