//! End to end: `--dry-run` writes nothing at all, not even the election Lease, and never keeps a
//! live replica from leading (issue 19).
//!
//! The first test compares the whole local cluster (every Lease, Service, EndpointSlice,
//! Namespace and Event, by uid and resourceVersion) before and after a dry run that had
//! something to do, so the two tests of this file take turns: a daemon of one would show up in
//! the other's comparison.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_args};
use support::{
    LOCAL, REMOTE, client, eventually, exported, namespace, namespace_in, obj, present,
    remote_slice,
};
use tokio::sync::Mutex;

/// The Lease name the chart gives a release called cross-cluster-controller.
const CHART_LEASE: &str = "cross-cluster-controller";
const WAIT: Duration = Duration::from_secs(60);

/// One test of this file at a time (see the module comment).
static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

/// A leader with one endpoint, in `ns` of the remote cluster.
async fn export(remote: &Client, ns: &str, name: &str, port: i32, ip: &str) {
    let pp = PostParams::default();
    let svc: Api<Service> = Api::namespaced(remote.clone(), ns);
    svc.create(&pp, &exported(name, port)).await.unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(remote.clone(), ns);
    slices
        .create(&pp, &remote_slice(name, &format!("{name}-a"), &[ip]))
        .await
        .unwrap();
}

/// Every object of these kinds in the local cluster: kind/namespace/name -> (uid, resourceVersion).
type Snapshot = BTreeMap<String, (String, String)>;

async fn list_into<K>(c: &Client, out: &mut Snapshot) -> Result<(), String>
where
    K: Resource<DynamicType = ()> + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let items = Api::<K>::all(c.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| format!("list {}: {e}", K::kind(&())))?;
    for o in items {
        let id = format!(
            "{}/{}/{}",
            K::kind(&()),
            o.namespace().unwrap_or_default(),
            o.name_any()
        );
        let v = (
            o.uid().unwrap_or_default(),
            o.resource_version().unwrap_or_default(),
        );
        out.insert(id, v);
    }
    Ok(())
}

async fn snapshot(local: &Client) -> Snapshot {
    let mut s = Snapshot::new();
    list_into::<Lease>(local, &mut s).await.unwrap();
    list_into::<Service>(local, &mut s).await.unwrap();
    list_into::<EndpointSlice>(local, &mut s).await.unwrap();
    list_into::<Namespace>(local, &mut s).await.unwrap();
    list_into::<Event>(local, &mut s).await.unwrap();
    s
}

/// The control plane's own heartbeats (kube-apiserver identity and kube-controller-manager
/// leader Leases) change on their own timers: the one kind of change no daemon of ours makes.
fn control_plane_heartbeat(id: &str) -> bool {
    id.starts_with("Lease/kube-system/") || id.starts_with("Lease/kube-node-lease/")
}

/// What differs between two snapshots, control-plane heartbeats aside.
fn changes(before: &Snapshot, after: &Snapshot) -> Vec<String> {
    let mut out = Vec::new();
    for (id, v) in before {
        match after.get(id) {
            None => out.push(format!("deleted {id}")),
            Some(w) if w != v => out.push(format!("changed {id}: {v:?} -> {w:?}")),
            Some(_) => {}
        }
    }
    for id in after.keys().filter(|id| !before.contains_key(*id)) {
        out.push(format!("created {id}"));
    }
    out.retain(|c| !control_plane_heartbeat(c.split_whitespace().nth(1).unwrap_or_default()));
    out
}

/// Waits until no namespace is being deleted (an earlier test's namespaces, emptied by the
/// namespace controller, would change under the comparison).
async fn no_namespace_terminating(local: &Client) {
    let api: Api<Namespace> = Api::all(local.clone());
    eventually("no local namespace terminating", WAIT, || async {
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let terminating: Vec<String> = list
            .iter()
            .filter(|n| n.metadata.deletion_timestamp.is_some())
            .map(|n| n.name_any())
            .collect();
        if terminating.is_empty() {
            Ok(())
        } else {
            Err(format!("terminating: {terminating:?}"))
        }
    })
    .await;
}

/// Ok once a line of `logs` holds every fragment.
fn logged(logs: &str, fragments: &[&str]) -> bool {
    logs.lines()
        .any(|l| fragments.iter().all(|f| l.contains(f)))
}

/// Waits until the daemon logged, for each entry, a line holding all its fragments.
async fn wait_logged(d: &Daemon, what: &str, lines: &[Vec<String>]) {
    eventually(what, WAIT, || async {
        if let Some(status) = d.exited() {
            return Err(format!("daemon exited ({status}):\n{}", d.logs()));
        }
        let logs = d.logs();
        let missing: Vec<&Vec<String>> = lines
            .iter()
            .filter(|l| !logged(&logs, &l.iter().map(String::as_str).collect::<Vec<_>>()))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("not yet logged: {missing:?}\n{logs}"))
        }
    })
    .await;
}

/// A `dry run: would <verb>` line of one object.
fn would(verb: &str, kind: &str, name: &str) -> Vec<String> {
    vec![
        format!("dry run: would {verb}"),
        format!("kind=\"{kind}\""),
        format!("name=\"{name}"),
    ]
}

#[tokio::test]
async fn a_dry_run_that_has_work_to_do_leaves_the_local_cluster_unchanged() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ns = namespace("dry-run-unchanged").await;
    // a namespace the remote exports from and the local cluster lacks
    let missing = namespace_in("dry-run-missing", &[REMOTE]).await;
    let (remote, local) = (client(REMOTE).await, client(LOCAL).await);
    export(&remote, &ns.name, "web", 80, "10.1.0.1").await;
    export(&remote, &ns.name, "gone", 80, "10.1.0.2").await;
    export(&remote, &ns.name, "taken", 80, "10.1.0.3").await;
    export(&remote, &missing.name, "api", 80, "10.1.0.4").await;
    // a local Service of a leader's name that is not ours: a conflict, reported with an Event
    let local_svc: Api<Service> = Api::namespaced(local.clone(), &ns.name);
    let theirs: Service =
        obj(json!({"metadata": {"name": "taken"}, "spec": {"ports": [{"port": 80}]}}));
    local_svc
        .create(&PostParams::default(), &theirs)
        .await
        .unwrap();

    // a live daemon mirrors what it can (not the missing namespace), then stops: its Lease and
    // the remote's health Lease stay behind, as in a cluster where the daemon ran before
    let scope = [
        "--watch-namespace",
        &missing.name,
        "--lease-name",
        CHART_LEASE,
    ];
    let mut live = Daemon::start(&with_args(args_for(&ns.name), &scope)).await;
    live.wait_synced(&[REMOTE]).await;
    for name in ["web", "gone"] {
        eventually(&format!("the follower {name}"), WAIT, || {
            present(&local_svc, name)
        })
        .await;
    }
    // its health Lease is written on its first renewal tick as leader, which may come after
    // the followers: wait for it, so the dry run has one to renew
    let leases: Api<Lease> = Api::namespaced(local.clone(), &ns.name);
    let health = format!("{CHART_LEASE}-remote-{REMOTE}");
    eventually("the remote's health Lease", WAIT, || {
        present(&leases, &health)
    })
    .await;
    assert_eq!(live.terminate().await, Some(0), "{}", live.logs());

    // meanwhile the remote changes: a follower to update, an orphan to delete
    let remote_svc: Api<Service> = Api::namespaced(remote.clone(), &ns.name);
    let port = json!({"spec": {"ports": [{"name": "http", "port": 81, "targetPort": 8080}]}});
    remote_svc
        .patch("web", &PatchParams::default(), &Patch::Merge(&port))
        .await
        .unwrap();
    remote_svc
        .delete("gone", &DeleteParams::default())
        .await
        .unwrap();

    no_namespace_terminating(&local).await;
    let before = snapshot(&local).await;
    let dry_args = with_args(
        args_for(&ns.name),
        &[&scope[..], &["--create-namespaces", "--dry-run"]].concat(),
    );
    let mut dry = Daemon::start(&dry_args).await;
    // it ran long enough to have done all of it, as if it led
    let work = [
        would("update", "Service", "web"),
        would("delete", "Service", "gone"),
        would("create", "Service", "api"),
    ];
    wait_logged(&dry, "the dry run's would-be writes", &work).await;
    // while it runs: nothing written so far, the election Lease included
    let running = changes(&before, &snapshot(&local).await);
    assert!(
        running.is_empty(),
        "a running dry run changed the local cluster: {running:#?}\n{}",
        dry.logs()
    );
    let more = [
        would("create", "Namespace", &missing.name),
        would("update", "Lease", &health),
        vec![
            "dry run: would create".into(),
            "kind=\"Event\"".into(),
            "reason=\"NotOurFollower\"".into(),
        ],
    ];
    wait_logged(
        &dry,
        "the dry run's would-be Namespace, Lease and Event",
        &more,
    )
    .await;
    assert!(
        dry.logs().contains("not taking part in the election"),
        "{}",
        dry.logs()
    );
    assert_eq!(dry.writes_total(), 0.0);
    assert_eq!(dry.terminate().await, Some(0), "{}", dry.logs());

    let after = snapshot(&local).await;
    let changed = changes(&before, &after);
    assert!(
        changed.is_empty(),
        "a dry run changed the local cluster: {changed:#?}\n{}",
        dry.logs()
    );
    let checked = [
        "Lease/",
        "Service/",
        "EndpointSlice/",
        "Namespace/",
        "Event/",
    ];
    for kind in checked {
        assert!(
            before.keys().any(|k| k.starts_with(kind)),
            "the comparison saw no {kind} at all"
        );
    }
}

#[tokio::test]
async fn a_live_daemon_leads_and_converges_beside_a_running_dry_run() {
    let _turn = ONE_AT_A_TIME.lock().await;
    let ns = namespace("dry-run-beside-live").await;
    let (remote, local) = (client(REMOTE).await, client(LOCAL).await);
    export(&remote, &ns.name, "web", 80, "10.2.0.1").await;
    let chart = ["--lease-name", CHART_LEASE];

    let dry_args = with_args(
        args_for(&ns.name),
        &[&chart[..], &["--dry-run", "--identity", "dry-1"]].concat(),
    );
    let dry = Daemon::start(&dry_args).await;
    wait_logged(
        &dry,
        "the dry run at work",
        &[would("create", "Service", "web")],
    )
    .await;

    let live_args = with_args(
        args_for(&ns.name),
        &[&chart[..], &["--identity", "live-1"]].concat(),
    );
    let live = Daemon::start(&live_args).await;
    live.wait_synced(&[REMOTE]).await;
    let leases: Api<Lease> = Api::namespaced(local.clone(), &ns.name);
    let holder = leases
        .get(CHART_LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity);
    assert_eq!(holder.as_deref(), Some("live-1"));
    let slices: Api<EndpointSlice> = Api::namespaced(local, &ns.name);
    eventually("the follower's endpoints", WAIT, || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let list = slices.list(&lp).await.map_err(|e| e.to_string())?;
        let ips: Vec<String> = list
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        if ips == ["10.2.0.1"] {
            Ok(())
        } else {
            Err(format!("{ips:?}"))
        }
    })
    .await;
    assert!(dry.exited().is_none(), "the dry run still runs beside it");
    assert_eq!(dry.gauge("xcc_leader", &[]), Some(0.0), "{}", dry.metrics());
}
