//! Remote health readable from the local cluster's API: the per-remote Leases the leader keeps,
//! and the `status` command that reads them (and the followers and Events) with the local
//! cluster's credentials only. Two remotes from Secrets: east, and lapse, whose API server is
//! killed and started again.
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use support::daemon::Daemon;
use support::fault::{Lost, Report, conclude, snapshot};
use support::metrics::WRITE_KINDS;
use support::remotes::{apply_secret, export, kubeconfig_of, remote_secret, secrets_only_args};
use support::{LOCAL, REMOTE, bed_cmd, client, eventually, exported, namespace_in, obj, present};

/// A cluster of the bed whose API server this test kills (other test binaries run before or
/// after this one, never beside it).
const LAPSE: &str = "lapse";
const WAIT: Duration = Duration::from_secs(60);
const HEALTH: &str = "fair.com/cross-cluster-remote-health=cross-cluster-controller";

/// Waits until `status` exits with `code` and `check` holds on its report.
async fn status_until(ns: &str, what: &str, code: i32, check: impl Fn(&Value) -> bool) -> Value {
    eventually(what, WAIT, || async {
        let (c, r) = support::status_json(ns).await;
        (c == code && check(&r))
            .then_some(r.clone())
            .ok_or(format!("exit {c}: {r}"))
    })
    .await
}

fn renewed(l: &Lease) -> String {
    serde_json::to_string(&l.spec.as_ref().and_then(|s| s.renew_time.clone())).unwrap()
}

async fn health_leases(api: &Api<Lease>) -> Result<Vec<Lease>, String> {
    api.list(&ListParams::default().labels(HEALTH))
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

async fn lease_of(api: &Api<Lease>, remote: &str) -> Result<Lease, String> {
    api.get(&format!("cross-cluster-controller-remote-{remote}"))
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn health_leases_and_status_follow_each_remote_up_down_back_and_removed() {
    support::extra_cluster(LAPSE, "").await;
    let ns = namespace_in("health", &[REMOTE, LOCAL, LAPSE]).await;
    let pp = PostParams::default();
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let lapse: Api<Service> = Api::namespaced(client(LAPSE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let leases: Api<Lease> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&pp, &exported("web", 80)).await.unwrap();
    lapse.create(&pp, &exported("api", 80)).await.unwrap();

    // no daemon yet: no leader, status says so
    let (code, r) = support::status_json(&ns.name).await;
    assert_eq!(code, 1, "{r}");
    assert!(r["leader"].is_null(), "{r}");

    let mut args = secrets_only_args(&ns.name);
    args.extend(["--remote-health-interval-seconds", "1"].map(String::from));
    let d = Daemon::start_secrets_only(&args).await;
    d.wait_leading().await;
    for (name, context) in [("east", REMOTE), ("lapse", LAPSE)] {
        let kc = kubeconfig_of(context, |_| {}).await;
        apply_secret(&secrets, &remote_secret(name, None, Some(&kc))).await;
    }
    // one Lease per remote, listed by its label, renewed
    eventually("a health Lease per remote", WAIT, || async {
        let names: Vec<String> = health_leases(&leases)
            .await?
            .iter()
            .map(|l| l.name_any())
            .collect();
        (names.len() == 2).then_some(()).ok_or(format!("{names:?}"))
    })
    .await;
    let first = lease_of(&leases, "east").await.unwrap();
    assert!(
        !first.annotations()["fair.com/cross-cluster-cluster-id"].is_empty(),
        "{:?}",
        first.annotations()
    );
    eventually("east's Lease renewed", WAIT, || async {
        let l = lease_of(&leases, "east").await?;
        (renewed(&l) != renewed(&first))
            .then_some(())
            .ok_or(renewed(&l))
    })
    .await;
    let healthy = status_until(&ns.name, "status: all connected", 0, |r| {
        ["east", "lapse"].iter().all(|n| {
            support::status_remote(r, n)
                .is_some_and(|s| s["connected"] == true && s["followers"] == 1)
        })
    })
    .await;
    assert_eq!(
        healthy["leader"]["fresh"], true,
        "the election Lease's holder is named: {healthy}"
    );
    // west is API-only: no node, no CNI, so no local pod network is known, and the leader says
    // so on its Lease for status (a warning: the exit code above is 0)
    let said = status_until(&ns.name, "status: no local pod network known", 0, |r| {
        r["leader"]["local_pod_networks"] == 0
    })
    .await;
    assert_eq!(said["healthy"], true, "{said}");
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // lapse goes down: its Lease stops renewing (east's goes on), status exits 1 naming it
    tokio::task::spawn_blocking(|| bed_cmd(&["kill", LAPSE, "apiserver"]))
        .await
        .unwrap();
    let down = Instant::now();
    let stuck = eventually("lapse's Lease says why", WAIT, || async {
        let l = lease_of(&leases, "lapse").await?;
        let problem = l.annotations()["fair.com/cross-cluster-problem"].clone();
        (!problem.is_empty()).then_some(l).ok_or(problem)
    })
    .await;
    let seen_down = down.elapsed();
    let east_then = lease_of(&leases, "east").await.unwrap();
    for _ in 0..2 {
        let mark = lease_of(&leases, "east").await.unwrap();
        eventually("east's Lease renewed meanwhile", WAIT, || async {
            let l = lease_of(&leases, "east").await?;
            (renewed(&l) != renewed(&mark))
                .then_some(())
                .ok_or(renewed(&l))
        })
        .await;
    }
    assert_ne!(
        renewed(&lease_of(&leases, "east").await.unwrap()),
        renewed(&east_then)
    );
    assert_eq!(
        renewed(&lease_of(&leases, "lapse").await.unwrap()),
        renewed(&stuck),
        "a remote that is down is not renewed"
    );
    let r = status_until(&ns.name, "status: lapse down", 1, |r| {
        support::status_remote(r, "lapse").is_some_and(|s| s["connected"] == false)
            && support::status_remote(r, "east").is_some_and(|s| s["connected"] == true)
    })
    .await;
    assert!(
        support::status_remote(&r, "lapse").unwrap()["problem"]
            .as_str()
            .unwrap()
            .contains("failing"),
        "{r}"
    );

    // back: renewed again, status 0
    tokio::task::spawn_blocking(|| bed_cmd(&["start", LAPSE]))
        .await
        .unwrap();
    let back = Instant::now();
    status_until(&ns.name, "status: lapse back", 0, |r| {
        support::status_remote(r, "lapse").is_some_and(|s| s["connected"] == true)
    })
    .await;
    let seen_back = back.elapsed();
    let after_outage = snapshot(&lc, &[&ns.name]).await;

    // a follower recording a remote no daemon here reads: flagged, exit 1
    west.create(
        &pp,
        &obj(
            json!({"metadata": {"name": "orphan", "labels": {"fair.com/cross-cluster": "follower"},
                    "annotations": {"fair.com/cross-cluster-origin-cluster": "ghost"}},
                    "spec": {"ports": [{"port": 80}]}}),
        ),
    )
    .await
    .unwrap();
    let r = status_until(&ns.name, "status flags the ghost's follower", 1, |r| {
        r["unknown_remote_followers"].as_array().is_some_and(|a| {
            a.iter()
                .any(|f| f.as_str().unwrap_or("").contains("orphan"))
        })
    })
    .await;
    assert!(
        support::status_remote(&r, "ghost").is_some_and(|s| s["known"] == false),
        "{r}"
    );
    west.delete("orphan", &DeleteParams::default())
        .await
        .unwrap();

    // lapse removed: its Lease goes
    secrets
        .delete("lapse", &DeleteParams::default())
        .await
        .unwrap();
    eventually("lapse's Lease deleted", WAIT, || async {
        let names: Vec<String> = health_leases(&leases)
            .await?
            .iter()
            .map(|l| l.name_any())
            .collect();
        (names == ["cross-cluster-controller-remote-east"])
            .then_some(())
            .ok_or(format!("{names:?}"))
    })
    .await;
    status_until(&ns.name, "status: east only", 0, |r| {
        r["remotes"].as_array().is_some_and(|a| a.len() == 1)
            && support::status_remote(r, "east").is_some()
    })
    .await;
    present(&west, "web").await.unwrap();
    conclude(
        Report {
            id: "43-remote-health-leases-and-status",
            scenario: "Per-remote health Leases and `status`: a remote up, down, back and removed",
            done: "two remotes from Secrets (east, lapse), health renewed every 1 s (valid 3 s); lapse's kube-apiserver SIGKILLed, then started; a follower recording an unknown remote added; lapse's Secret deleted",
            converge: Some(seen_back),
            note: format!(
                "converged in: lapse started again to `status` exit 0 with lapse connected; lapse down shown on its Lease (problem annotation, renewTime frozen while east's renewed twice) {:.1} s after its API server was killed; `status` exit 1 naming it; the unknown remote's follower flagged (exit 1); lapse's Lease deleted with its Secret; nothing deleted while it was down",
                seen_down.as_secs_f64()
            ),
        },
        &Lost::since(
            &before,
            &after_outage,
            &["web", "api"].iter().map(|s| s.to_string()).collect(),
        ),
        &before.non_followers_touched(&after_outage),
    );
}

/// A cluster of the bed whose API server the outage-policy test kills.
const FADE: &str = "fade";

/// The first endpoint's (ready, serving) of each local slice of `svc`, by the remote it mirrors.
async fn conditions(
    api: &Api<EndpointSlice>,
    svc: &str,
) -> Result<BTreeMap<String, (Option<bool>, Option<bool>)>, String> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    Ok(list
        .items
        .iter()
        .map(|s| {
            let origin = s
                .labels()
                .get("fair.com/cross-cluster-origin-cluster")
                .cloned()
                .unwrap_or_default();
            let c = s.endpoints.first().and_then(|e| e.conditions.clone());
            let c = c.unwrap_or_default();
            (origin, (c.ready, c.serving))
        })
        .collect())
}

#[tokio::test]
async fn the_outage_policy_marks_a_long_unreachable_remote_not_ready_and_restores_it() {
    support::extra_cluster(FADE, "").await;
    let ns = namespace_in("outage-policy", &[REMOTE, LOCAL, FADE]).await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let west_sl: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    export(REMOTE, &ns.name, "both", "both-e", "10.1.0.1").await;
    export(FADE, &ns.name, "both", "both-f", "10.4.0.1").await;
    let d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    d.wait_leading().await;
    let kc = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&kc))).await;
    let kc = kubeconfig_of(FADE, |_| {}).await;
    let mut s = remote_secret("fade", None, Some(&kc));
    s.metadata.annotations = Some(BTreeMap::from([(
        "fair.com/cross-cluster-stale-after".to_string(),
        "2s".to_string(),
    )]));
    apply_secret(&secrets, &s).await;
    let ready = (Some(true), None);
    let all_ready = BTreeMap::from([("east".to_string(), ready), ("fade".to_string(), ready)]);
    eventually("both remotes' endpoints mirrored, ready", WAIT, || async {
        let c = conditions(&west_sl, "both").await?;
        (c == all_ready).then_some(()).ok_or(format!("{c:?}"))
    })
    .await;
    let uid = west.get("both").await.unwrap().uid();
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    tokio::task::spawn_blocking(|| bed_cmd(&["kill", FADE, "apiserver"]))
        .await
        .unwrap();
    let down = Instant::now();
    let fade_marked = BTreeMap::from([
        ("east".to_string(), ready),
        ("fade".to_string(), (Some(false), Some(false))),
    ]);
    eventually(
        "fade's endpoints marked not ready, east's ready",
        WAIT,
        || async {
            let c = conditions(&west_sl, "both").await?;
            (c == fade_marked).then_some(()).ok_or(format!("{c:?}"))
        },
    )
    .await;
    let marked_after = down.elapsed();
    assert!(
        marked_after >= Duration::from_secs(2),
        "not before stale-after: {marked_after:?}"
    );
    d.wait_metric("xcc_remote_stale", &[("remote", FADE)], 1.0)
        .await;
    assert_eq!(
        west.get("both").await.unwrap().uid(),
        uid,
        "nothing re-created"
    );
    let marked = snapshot(&lc, &[&ns.name]).await;

    tokio::task::spawn_blocking(|| bed_cmd(&["start", FADE]))
        .await
        .unwrap();
    let back = Instant::now();
    eventually("fade's endpoints ready again", WAIT, || async {
        let c = conditions(&west_sl, "both").await?;
        (c == all_ready).then_some(()).ok_or(format!("{c:?}"))
    })
    .await;
    let restored_after = back.elapsed();
    d.wait_metric(
        "xcc_remote_stale_transitions_total",
        &[("remote", FADE), ("to", "restored")],
        1.0,
    )
    .await;
    assert_eq!(d.metric("xcc_remote_stale", &[("remote", FADE)]), 0.0);
    assert_eq!(d.writes(&WRITE_KINDS, &["delete"]), 0.0);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(lc.clone(), &ns.name);
    eventually("RemoteStale and RemoteRestored Events", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let reasons: Vec<String> = list.items.iter().filter_map(|e| e.reason.clone()).collect();
        (reasons.iter().any(|r| r == "RemoteStale")
            && reasons.iter().any(|r| r == "RemoteRestored"))
        .then_some(())
        .ok_or(format!("{reasons:?}"))
    })
    .await;
    conclude(
        Report {
            id: "44-outage-policy-marks-and-restores",
            scenario: "Outage policy (opt-in): a remote unreachable past stale-after has its endpoints marked not ready, restored when it returns",
            done: "east and fade both export `both` (one follower, a slice each); fade's Secret carries fair.com/cross-cluster-stale-after: 2s; fade's kube-apiserver SIGKILLed, then started",
            converge: Some(restored_after),
            note: format!(
                "converged in: fade started again to its endpoints ready again; marked ready=false/serving=false {:.1} s after its API server was killed (stale-after 2 s) while east's stayed ready; xcc_remote_stale 1 then 0, RemoteStale and RemoteRestored Events; no delete sent, the follower kept its uid",
                marked_after.as_secs_f64()
            ),
        },
        &Lost::since(&before, &marked, &["both".to_string()].into()),
        &before.non_followers_touched(&marked),
    );
}
