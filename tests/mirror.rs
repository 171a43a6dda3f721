//! End to end: the real daemon binary mirrors `east` (remote) into `west` (local) on the test bed.
mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::daemon::{Daemon, args_for};
use support::metrics::VERBS;
use support::{
    KEY, LOCAL, REMOTE, TestNs, absent, client, endpoint, eventually, exported_with, namespace,
    obj, ports_are, present, remote_slice_with,
};

const WAIT: Duration = Duration::from_secs(30);

struct Env {
    ns: TestNs,
    remote_svc: Api<Service>,
    remote_slices: Api<EndpointSlice>,
    local_svc: Api<Service>,
    local_slices: Api<EndpointSlice>,
    local_ep: Api<Endpoints>,
}

async fn env(test: &str) -> Env {
    let ns = namespace(test).await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    Env {
        remote_svc: Api::namespaced(r.clone(), &ns.name),
        remote_slices: Api::namespaced(r, &ns.name),
        local_svc: Api::namespaced(l.clone(), &ns.name),
        local_slices: Api::namespaced(l.clone(), &ns.name),
        local_ep: Api::namespaced(l, &ns.name),
        ns,
    }
}

fn http_spec() -> Value {
    json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}, {"name": "metrics", "port": 9090}]})
}

/// A remote slice with ports http and metrics whose endpoints name a remote node and pod
/// (nodeName, targetRef: what the follower must not copy), every fifth one not ready; on the
/// one remote slice shape.
fn mirror_slice(svc: &str, name: &str, ips: &[String]) -> EndpointSlice {
    let eps: Vec<Value> = ips
        .iter()
        .enumerate()
        .map(|(i, ip)| {
            let mut e = endpoint(ip);
            e["conditions"]["ready"] = json!(i % 5 != 4);
            e["nodeName"] = json!("remote-node");
            e["targetRef"] =
                json!({"kind": "Pod", "name": format!("{svc}-pod-{i}"), "namespace": "x"});
            e
        })
        .collect();
    remote_slice_with(
        svc,
        name,
        "IPv4",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "metrics", "port": 9090, "protocol": "TCP"}]),
        eps,
    )
}

fn ips(n: usize, base: u8) -> Vec<String> {
    (0..n)
        .map(|i| format!("10.{base}.{}.{}", i / 250, i % 250 + 1))
        .collect()
}

async fn local_ips(api: &Api<EndpointSlice>, svc: &str) -> Result<Vec<String>, String> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    let mut out: Vec<String> = list
        .items
        .iter()
        .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
        .collect();
    out.sort();
    Ok(out)
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

async fn start(e: &Env, extra: &[&str]) -> Daemon {
    let mut args = args_for(&e.ns.name);
    args.extend(extra.iter().map(|s| s.to_string()));
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    d
}

#[tokio::test]
async fn create_update_delete_and_unlabel_are_mirrored() {
    let e = env("mirror-lifecycle").await;
    let d = start(&e, &[]).await;

    e.remote_svc
        .create(&PostParams::default(), &exported_with("web", http_spec()))
        .await
        .unwrap();
    e.remote_slices
        .create(
            &PostParams::default(),
            &mirror_slice("web", "web-a", &ips(3, 1)),
        )
        .await
        .unwrap();

    let f = eventually("the follower Service", WAIT, || {
        present(&e.local_svc, "web")
    })
    .await;
    let labels = f.labels();
    assert_eq!(labels.get(KEY).map(String::as_str), Some("follower"));
    assert_eq!(labels.get("app").map(String::as_str), Some("web"));
    let ann = f.annotations();
    assert_eq!(
        ann.get("fair.com/cross-cluster-origin-cluster")
            .map(String::as_str),
        Some(REMOTE)
    );
    assert_eq!(
        ann.get("fair.com/cross-cluster-origin-object"),
        Some(&format!("{}/web", e.ns.name))
    );
    let spec = f.spec.clone().unwrap();
    assert!(spec.selector.is_none(), "followers have no selector");
    let ports: Vec<_> = spec
        .ports
        .unwrap()
        .iter()
        .map(|p| (p.name.clone(), p.port))
        .collect();
    assert_eq!(
        ports,
        vec![(Some("http".into()), 80), (Some("metrics".into()), 9090)]
    );
    let (local_range, ip) = (
        support::service_prefix(LOCAL).await,
        spec.cluster_ip.unwrap(),
    );
    assert!(
        ip.starts_with(&local_range),
        "the local API server allocated a local ClusterIP (in {local_range}*), got {ip}"
    );

    eventually("the follower endpoints", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        if got == sorted(ips(3, 1)) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let slices = e
        .local_slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap();
    for s in &slices.items {
        assert_eq!(
            s.labels()
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some("cross-cluster-controller.fair.com")
        );
        assert_eq!(
            s.owner_references()[0].uid,
            f.uid().unwrap(),
            "owned by the follower"
        );
        for ep in &s.endpoints {
            assert!(
                ep.node_name.is_none() && ep.target_ref.is_none(),
                "remote node and pod names are dropped"
            );
        }
        let not_ready = s
            .endpoints
            .iter()
            .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready) == Some(false))
            .count();
        assert_eq!(not_ready, 0, "3 endpoints, none of them the 5th");
    }

    // update: a port changes, endpoints churn
    e.remote_svc
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"ports": [{"name": "http", "port": 81, "targetPort": 8080}]}}),
            ),
        )
        .await
        .unwrap();
    e.remote_slices
        .replace("web-a", &PostParams::default(), &{
            let mut s = e.remote_slices.get("web-a").await.unwrap();
            s.endpoints = mirror_slice("web", "web-a", &ips(5, 2)).endpoints;
            s
        })
        .await
        .unwrap();
    eventually("the port change", WAIT, || {
        ports_are(&e.local_svc, "web", &[81])
    })
    .await;
    eventually("the endpoint churn", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        if got == sorted(ips(5, 2)) {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    assert_eq!(
        e.local_svc.get("web").await.unwrap().uid(),
        f.uid(),
        "updated in place, not recreated"
    );

    // unlabel: the leader stops being a leader
    e.remote_svc
        .create(&PostParams::default(), &exported_with("api", http_spec()))
        .await
        .unwrap();
    eventually("the api follower", WAIT, || present(&e.local_svc, "api")).await;
    e.remote_svc
        .patch(
            "api",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {KEY: null}}})),
        )
        .await
        .unwrap();
    eventually("the unlabelled leader's follower to go", WAIT, || {
        absent(&e.local_svc, "api")
    })
    .await;

    // delete
    e.remote_svc
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the follower to go", WAIT, || absent(&e.local_svc, "web")).await;
    eventually("its slices to go", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        if got.is_empty() {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    d.wait_metric(
        "xcc_writes_total",
        &[("kind", "Service"), ("verb", "delete")],
        2.0,
    )
    .await;
}

#[tokio::test]
async fn a_same_named_local_service_that_is_not_a_follower_is_never_touched() {
    let e = env("mirror-not-ours").await;
    let mine: Service = obj(
        json!({"metadata": {"name": "db", "labels": {"owner": "local-team"}},
        "spec": {"selector": {"app": "db"}, "ports": [{"port": 5432}]}}),
    );
    let before = e
        .local_svc
        .create(&PostParams::default(), &mine)
        .await
        .unwrap();
    e.remote_svc
        .create(&PostParams::default(), &exported_with("db", http_spec()))
        .await
        .unwrap();
    e.remote_svc
        .create(&PostParams::default(), &exported_with("other", http_spec()))
        .await
        .unwrap();
    let d = start(&e, &[]).await;

    eventually("the conflict to be counted", WAIT, || async {
        let n = d.metric(
            "xcc_conflicts_total",
            &[("remote", REMOTE), ("kind", "Service")],
        );
        if n >= 1.0 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    })
    .await;
    // the rest keeps flowing
    eventually("the other follower", WAIT, || {
        present(&e.local_svc, "other")
    })
    .await;
    let after = e.local_svc.get("db").await.unwrap();
    assert_eq!(
        serde_json::to_value(&before).unwrap(),
        serde_json::to_value(&after).unwrap(),
        "byte-for-byte unchanged"
    );
    assert!(
        local_ips(&e.local_slices, "db").await.unwrap().is_empty(),
        "no slices written for it"
    );
    assert!(d.logs().contains("not our follower"), "a log line says why");
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client(LOCAL).await, &e.ns.name);
    eventually("an Event on the local Service", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|x| x.to_string())?;
        let hit = list.items.iter().any(|ev| {
            ev.reason.as_deref() == Some("NotOurFollower")
                && ev.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("db")
        });
        if hit {
            Ok(())
        } else {
            Err(format!("{} events", list.items.len()))
        }
    })
    .await;

    // deleting the remote leader must not delete the local non-follower either
    e.remote_svc
        .delete("db", &DeleteParams::default())
        .await
        .unwrap();
    e.remote_svc
        .delete("other", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the other follower to go", WAIT, || {
        absent(&e.local_svc, "other")
    })
    .await;
    let after = e.local_svc.get("db").await.unwrap();
    assert_eq!(after.uid(), before.uid());
    assert_eq!(after.resource_version(), before.resource_version());
}

#[tokio::test]
async fn manual_edits_and_deletes_of_a_follower_are_restored() {
    let e = env("mirror-drift").await;
    e.remote_svc
        .create(&PostParams::default(), &exported_with("web", http_spec()))
        .await
        .unwrap();
    e.remote_slices
        .create(
            &PostParams::default(),
            &mirror_slice("web", "web-a", &ips(4, 3)),
        )
        .await
        .unwrap();
    let d = start(&e, &[]).await;
    eventually("the follower endpoints", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        if got.len() == 4 {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;

    // someone changes a port by hand (a selector would take the Service over: tests/containment.rs)
    e.local_svc
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 1234}]}})),
        )
        .await
        .unwrap();
    eventually("the hand edit to be undone", WAIT, || async {
        let s = e
            .local_svc
            .get("web")
            .await
            .map_err(|x| x.to_string())?
            .spec
            .unwrap();
        let ports: Vec<i32> = s.ports.unwrap_or_default().iter().map(|p| p.port).collect();
        if s.selector.is_none() && ports == vec![80, 9090] {
            Ok(())
        } else {
            Err(format!("{ports:?} {:?}", s.selector))
        }
    })
    .await;

    // someone deletes the follower's slice, then the follower itself
    let slice = e
        .local_slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=web"))
        .await
        .unwrap()
        .items;
    e.local_slices
        .delete(&slice[0].name_any(), &DeleteParams::default())
        .await
        .unwrap();
    eventually("the slice to come back", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        if got.len() == 4 {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    let old_uid = e.local_svc.get("web").await.unwrap().uid();
    e.local_svc
        .delete("web", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the follower to come back", WAIT, || async {
        match e
            .local_svc
            .get_opt("web")
            .await
            .map_err(|x| x.to_string())?
        {
            Some(s) if s.uid() != old_uid => Ok(()),
            other => Err(format!("{:?}", other.map(|s| s.uid()))),
        }
    })
    .await;

    drop(d);
}

#[tokio::test]
async fn a_restarted_daemon_writes_nothing_when_nothing_changed() {
    let e = env("mirror-idle").await;
    e.remote_svc
        .create(&PostParams::default(), &exported_with("web", http_spec()))
        .await
        .unwrap();
    e.remote_svc
        .create(
            &PostParams::default(),
            &exported_with(
                "headless",
                json!({"clusterIP": "None", "ports": [{"port": 53, "protocol": "UDP"}]}),
            ),
        )
        .await
        .unwrap();
    let all = ips(1200, 6);
    e.remote_slices
        .create(
            &PostParams::default(),
            &mirror_slice("web", "web-a", &all[..700]),
        )
        .await
        .unwrap();
    e.remote_slices
        .create(
            &PostParams::default(),
            &mirror_slice("web", "web-b", &all[700..]),
        )
        .await
        .unwrap();
    let d = start(&e, &[]).await;
    eventually("convergence", WAIT, || async {
        let got = local_ips(&e.local_slices, "web").await?;
        let h = e
            .local_svc
            .get_opt("headless")
            .await
            .map_err(|x| x.to_string())?;
        if got.len() == 1200 && h.is_some() {
            Ok(())
        } else {
            Err(format!("{} endpoints", got.len()))
        }
    })
    .await;
    // converged: a restarted daemon (fresh caches, full resync, a sweep) writes nothing at all
    drop(d);
    let d2 = start(&e, &[]).await;
    eventually("a full resync of both keys", WAIT, || async {
        let n = d2.metric("xcc_reconciles_total", &[("outcome", "unchanged")]);
        if n >= 2.0 { Ok(()) } else { Err(d2.metrics()) }
    })
    .await;
    assert_eq!(
        d2.follower_writes(&VERBS),
        0.0,
        "no write when nothing changed:\n{}",
        d2.metrics()
    );
}

#[tokio::test]
async fn headless_external_name_and_2500_endpoints() {
    let e = env("mirror-shapes").await;
    // ExternalName is refused by default (tests/containment.rs): this remote is allowed it
    let d = start(&e, &["--remote-allow-external-name"]).await;
    e.remote_svc
        .create(
            &PostParams::default(),
            &exported_with(
                "stateful",
                json!({"clusterIP": "None", "ports": [{"port": 5432}]}),
            ),
        )
        .await
        .unwrap();
    e.remote_svc
        .create(
            &PostParams::default(),
            &exported_with(
                "ext",
                json!({"type": "ExternalName", "externalName": "db.example.com"}),
            ),
        )
        .await
        .unwrap();
    e.remote_svc
        .create(&PostParams::default(), &exported_with("big", http_spec()))
        .await
        .unwrap();
    let all = ips(2500, 4);
    for (i, chunk) in all.chunks(1000).enumerate() {
        e.remote_slices
            .create(
                &PostParams::default(),
                &mirror_slice("big", &format!("big-{i}"), chunk),
            )
            .await
            .unwrap();
    }

    let headless = eventually("the headless follower", WAIT, || {
        present(&e.local_svc, "stateful")
    })
    .await;
    assert_eq!(
        headless.spec.unwrap().cluster_ip.as_deref(),
        Some("None"),
        "headless stays headless"
    );
    let ext = eventually("the ExternalName follower", WAIT, || {
        present(&e.local_svc, "ext")
    })
    .await;
    let spec = ext.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
    assert_eq!(spec.external_name.as_deref(), Some("db.example.com"));

    eventually(
        "2,500 endpoints in slices of at most 1,000",
        Duration::from_secs(60),
        || async {
            let got = local_ips(&e.local_slices, "big").await?;
            if got == sorted(all.clone()) {
                Ok(())
            } else {
                Err(format!("{} endpoints", got.len()))
            }
        },
    )
    .await;
    let slices = e
        .local_slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=big"))
        .await
        .unwrap();
    assert_eq!(slices.items.len(), 3);
    assert!(slices.items.iter().all(|s| s.endpoints.len() <= 1000));
    let not_ready = slices
        .items
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter(|ep| ep.conditions.as_ref().and_then(|c| c.ready) == Some(false))
        .count();
    assert_eq!(
        not_ready, 500,
        "every fifth remote endpoint is not ready, and stays so"
    );
    assert_eq!(d.family_total("xcc_skipped_total"), 0.0);
}

#[tokio::test]
async fn a_missing_local_namespace_is_skipped_then_mirrored_when_it_appears() {
    // the namespace exists only in the remote cluster
    let e = env("mirror-missing-ns").await;
    let remote_only = support::namespace_in("mirror-remote-only", &[REMOTE]).await;
    let rsvc: Api<Service> = Api::namespaced(client(REMOTE).await, &remote_only.name);
    rsvc.create(
        &PostParams::default(),
        &exported_with("lonely", http_spec()),
    )
    .await
    .unwrap();

    let mut args = args_for(&e.ns.name);
    args.extend(["--watch-namespace".to_string(), remote_only.name.clone()]);
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    eventually("the skip to be counted", WAIT, || async {
        let n = d.metric(
            "xcc_skipped_total",
            &[("remote", REMOTE), ("reason", "NamespaceMissing")],
        );
        if n >= 1.0 { Ok(()) } else { Err(d.metrics()) }
    })
    .await;
    assert!(d.logs().contains("does not exist"), "a log line says why");

    let local_ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client(LOCAL).await);
    local_ns
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": remote_only.name}})),
        )
        .await
        .unwrap();
    let lsvc: Api<Service> = Api::namespaced(client(LOCAL).await, &remote_only.name);
    eventually("the follower once the namespace exists", WAIT, || {
        present(&lsvc, "lonely")
    })
    .await;
    let _ = local_ns
        .delete(&remote_only.name, &DeleteParams::background())
        .await;
}

#[tokio::test]
async fn create_namespaces_creates_a_missing_local_namespace() {
    let e = env("mirror-create-ns").await;
    let remote_only = support::namespace_in("mirror-create-ns-remote", &[REMOTE]).await;
    let rsvc: Api<Service> = Api::namespaced(client(REMOTE).await, &remote_only.name);
    rsvc.create(
        &PostParams::default(),
        &exported_with("lonely", http_spec()),
    )
    .await
    .unwrap();
    let mut args = args_for(&e.ns.name);
    args.extend([
        "--watch-namespace".to_string(),
        remote_only.name.clone(),
        "--create-namespaces".to_string(),
    ]);
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    let lsvc: Api<Service> = Api::namespaced(client(LOCAL).await, &remote_only.name);
    eventually("the namespace and the follower", WAIT, || {
        present(&lsvc, "lonely")
    })
    .await;
    assert!(d.logs().contains("created missing namespace"));
    let local_ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client(LOCAL).await);
    let _ = local_ns
        .delete(&remote_only.name, &DeleteParams::background())
        .await;
}

#[tokio::test]
async fn a_follower_left_by_the_go_controller_is_adopted_and_an_orphan_is_deleted() {
    let e = env("mirror-adopt-sweep").await;
    e.remote_svc
        .create(
            &PostParams::default(),
            &exported_with("legacy", http_spec()),
        )
        .await
        .unwrap();
    // what the Go controller left: follower label, no origin annotation, Endpoints with remote pod refs
    let old: Service = obj(
        json!({"metadata": {"name": "legacy", "labels": {KEY: "follower", "app": "legacy"}},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
    );
    let old = e
        .local_svc
        .create(&PostParams::default(), &old)
        .await
        .unwrap();
    let old_ep: Endpoints = obj(
        json!({"metadata": {"name": "legacy", "labels": {KEY: "follower"}},
        "subsets": [{"addresses": [{"ip": "10.9.9.9", "nodeName": "remote-node"}], "ports": [{"port": 8080}]}]}),
    );
    e.local_ep
        .create(&PostParams::default(), &old_ep)
        .await
        .unwrap();
    // an orphan made while no daemon ran: its leader does not exist
    let orphan: Service = obj(
        json!({"metadata": {"name": "orphan", "labels": {KEY: "follower"},
        "annotations": {"fair.com/cross-cluster-origin-cluster": REMOTE}}, "spec": {"ports": [{"port": 80}]}}),
    );
    e.local_svc
        .create(&PostParams::default(), &orphan)
        .await
        .unwrap();

    let d = start(&e, &["--sweep-schedule", "*/2 * * * * *"]).await;
    eventually("the old follower to be adopted", WAIT, || async {
        let s = e.local_svc.get("legacy").await.map_err(|x| x.to_string())?;
        if s.annotations()
            .contains_key("fair.com/cross-cluster-origin-cluster")
        {
            Ok(s)
        } else {
            Err("not yet".into())
        }
    })
    .await;
    assert_eq!(
        e.local_svc.get("legacy").await.unwrap().uid(),
        old.uid(),
        "adopted in place, not replaced"
    );
    eventually(
        "the Go-era Endpoints to be replaced by slices",
        WAIT,
        || absent(&e.local_ep, "legacy"),
    )
    .await;
    // deleted by its own reconcile (the local follower watch queues it) or by the sweeper,
    // whichever comes first: both hold the proof of a complete listing of the remote
    eventually("the orphan to be deleted", WAIT, || {
        absent(&e.local_svc, "orphan")
    })
    .await;
    d.wait_metric(
        "xcc_writes_total",
        &[("kind", "Service"), ("verb", "delete")],
        1.0,
    )
    .await;
    let logs = d.logs();
    assert!(logs.contains("sweep done"));
    // written to a file (as `kubectl logs` reads them), plain lines carry no colour codes
    assert!(
        !logs.contains('\x1b'),
        "ANSI escape codes in a log file:\n{logs}"
    );
}

#[tokio::test]
async fn legacy_endpoints_modes_do_not_get_mirrored_twice() {
    let e = env("mirror-endpoints-mode").await;
    e.remote_svc
        .create(&PostParams::default(), &exported_with("both", http_spec()))
        .await
        .unwrap();
    e.remote_slices
        .create(
            &PostParams::default(),
            &mirror_slice("both", "both-a", &ips(3, 5)),
        )
        .await
        .unwrap();
    let d = start(&e, &["--endpoints-mode", "both"]).await;

    let ep = eventually("legacy Endpoints", WAIT, || present(&e.local_ep, "both")).await;
    assert_eq!(
        ep.labels()
            .get("endpointslice.kubernetes.io/skip-mirror")
            .map(String::as_str),
        Some("true")
    );
    let addrs: usize = ep
        .subsets
        .unwrap_or_default()
        .iter()
        .map(|s| s.addresses.as_ref().map_or(0, Vec::len))
        .sum();
    assert_eq!(addrs, 3);
    eventually("our slices", WAIT, || async {
        let got = local_ips(&e.local_slices, "both").await?;
        if got.len() == 3 {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
    // kube-controller-manager's mirroring controller runs on the bed: had it mirrored the
    // Endpoints, a second set of slices (managed by it) would appear next to ours
    let all = e
        .local_slices
        .list(&ListParams::default().labels("kubernetes.io/service-name=both"))
        .await
        .unwrap();
    let managers: BTreeMap<String, usize> = all.items.iter().fold(BTreeMap::new(), |mut m, s| {
        *m.entry(
            s.labels()
                .get("endpointslice.kubernetes.io/managed-by")
                .cloned()
                .unwrap_or_default(),
        )
        .or_default() += 1;
        m
    });
    assert_eq!(
        managers.keys().collect::<Vec<_>>(),
        vec!["cross-cluster-controller.fair.com"],
        "{managers:?}"
    );
    drop(d);
}

#[tokio::test]
async fn production_logs_are_json_lines() {
    let e = env("mirror-json-logs").await;
    e.remote_svc
        .create(&PostParams::default(), &exported_with("web", http_spec()))
        .await
        .unwrap();
    let d = Daemon::start_with_env(&args_for(&e.ns.name), &[("ENV", "production")]).await;
    d.wait_synced(&[REMOTE]).await;
    eventually("the follower", WAIT, || present(&e.local_svc, "web")).await;
    let logs = d.logs();
    let mut created = false;
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: Value =
            serde_json::from_str(line).unwrap_or_else(|err| panic!("not JSON ({err}): {line}"));
        created |= v["message"] == "created" && v["kind"] == "Service" && v["name"] == "web";
    }
    assert!(
        created,
        "a JSON line records the creation with its fields:\n{logs}"
    );
}

#[tokio::test]
async fn dry_run_writes_nothing() {
    let e = env("mirror-dry-run").await;
    e.remote_svc
        .create(&PostParams::default(), &exported_with("web", http_spec()))
        .await
        .unwrap();
    let d = start(&e, &["--dry-run"]).await;
    eventually("the would-be write to be logged", WAIT, || async {
        if d.logs().contains("dry run: would create") {
            Ok(())
        } else {
            Err(d.logs())
        }
    })
    .await;
    assert!(e.local_svc.get_opt("web").await.unwrap().is_none());
    assert_eq!(d.writes_total(), 0.0);
}

/// A slice as the Kubernetes documentation tells users to write one for a selectorless Service
/// (or as another controller writes them): only `kubernetes.io/service-name` and its own
/// manager, none of the Service's labels.
fn foreign_slice(svc: &str, name: &str, ips: &[String]) -> EndpointSlice {
    let eps: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    obj(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc,
                     "endpointslice.kubernetes.io/managed-by": "cluster-admins"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": eps
    }))
}

async fn wait_ips(e: &Env, svc: &str, want: &[String]) {
    let want = sorted(want.to_vec());
    eventually(&format!("the follower slices of {svc}"), WAIT, || async {
        let got = local_ips(&e.local_slices, svc).await?;
        if got == want {
            Ok(())
        } else {
            Err(format!("{got:?}"))
        }
    })
    .await;
}

#[tokio::test]
async fn endpoints_of_a_leader_are_mirrored_whoever_wrote_its_slices() {
    let e = env("mirror-foreign-slices").await;
    let pp = PostParams::default();
    let selectorless = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    e.remote_svc
        .create(&pp, &exported_with("manual", selectorless.clone()))
        .await
        .unwrap();
    e.remote_slices
        .create(&pp, &foreign_slice("manual", "manual-1", &ips(2, 41)))
        .await
        .unwrap();
    // an unlabelled Service's slices, of the same kind: never mirrored
    let plain: Service = obj(json!({"metadata": {"name": "plain"}, "spec": selectorless}));
    e.remote_svc.create(&pp, &plain).await.unwrap();
    e.remote_slices
        .create(&pp, &foreign_slice("plain", "plain-1", &ips(2, 42)))
        .await
        .unwrap();
    let d = start(&e, &[]).await;
    wait_ips(&e, "manual", &ips(2, 41)).await;

    // a second slice, added while running, and a legacy Endpoints object that the remote's
    // EndpointSlice mirroring controller turns into slices of its own
    e.remote_slices
        .create(&pp, &foreign_slice("manual", "manual-2", &ips(1, 43)))
        .await
        .unwrap();
    wait_ips(&e, "manual", &[ips(2, 41), ips(1, 43)].concat()).await;
    e.remote_svc
        .create(&pp, &exported_with("legacy", selectorless.clone()))
        .await
        .unwrap();
    let ep: Endpoints = obj(json!({"metadata": {"name": "legacy"}, "subsets": [
        {"addresses": [{"ip": "10.44.0.1"}, {"ip": "10.44.0.2"}], "ports": [{"name": "http", "port": 8080}]}]}));
    Api::<Endpoints>::namespaced(client(REMOTE).await, &e.ns.name)
        .create(&pp, &ep)
        .await
        .unwrap();
    wait_ips(&e, "legacy", &["10.44.0.1".into(), "10.44.0.2".into()]).await;

    // proof before delete holds for them too: a deleted slice takes only its endpoints along
    e.remote_slices
        .delete("manual-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_ips(&e, "manual", &ips(1, 43)).await;
    absent(&e.local_svc, "plain")
        .await
        .expect("an unlabelled Service is not mirrored");
    assert!(
        local_ips(&e.local_slices, "plain")
            .await
            .unwrap()
            .is_empty()
    );
    drop(d);
}

#[tokio::test]
async fn labels_follow_their_leader_and_local_labels_stay() {
    let e = env("mirror-labels-follow").await;
    let pp = PostParams::default();
    let mut web = exported_with("web", http_spec());
    web.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("tier".into(), "gold".into());
    e.remote_svc.create(&pp, &web).await.unwrap();
    e.remote_slices
        .create(&pp, &mirror_slice("web", "web-a", &ips(2, 45)))
        .await
        .unwrap();
    let d = start(&e, &[]).await;
    wait_ips(&e, "web", &ips(2, 45)).await;
    let has_tier = |l: &BTreeMap<String, String>| l.get("tier").map(String::as_str) == Some("gold");
    let f = eventually("the follower", WAIT, || present(&e.local_svc, "web")).await;
    assert!(has_tier(f.labels()), "{:?}", f.labels());

    // someone adds a label of their own to the follower
    let mine = json!({"metadata": {"labels": {"team": "payments"}}});
    e.local_svc
        .patch("web", &PatchParams::default(), &Patch::Merge(mine))
        .await
        .unwrap();
    // the leader drops "tier"
    let drop_tier = json!({"metadata": {"labels": {"tier": null}}});
    e.remote_svc
        .patch("web", &PatchParams::default(), &Patch::Merge(drop_tier))
        .await
        .unwrap();
    let f = eventually("tier gone from the follower Service", WAIT, || async {
        let f = present(&e.local_svc, "web").await?;
        if has_tier(f.labels()) {
            Err(format!("{:?}", f.labels()))
        } else {
            Ok(f)
        }
    })
    .await;
    assert_eq!(
        f.labels().get("team").map(String::as_str),
        Some("payments"),
        "a label added locally is kept"
    );
    assert_eq!(f.labels().get("app").map(String::as_str), Some("web"));
    eventually("tier gone from the follower slices", WAIT, || async {
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let list = e.local_slices.list(&lp).await.map_err(|e| e.to_string())?;
        match list.items.iter().find(|s| has_tier(s.labels())) {
            Some(s) => Err(format!("{:?}", s.labels())),
            None if list.items.is_empty() => Err("no slices".into()),
            None => Ok(()),
        }
    })
    .await;
    drop(d);
}
