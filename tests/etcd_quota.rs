//! Writes over time (issue 37, item 1): a remote exporting 300 Services of 1,000 labels and 10
//! slices each, flipping a label 5 times a second for ten minutes, beside a local cluster whose
//! etcd has a quota of 256 MiB (`XCC_TESTBED_ETCD_QUOTA_MIB`, an eighth of Kubernetes' usual
//! 2 GiB): the local etcd never raises its `NOSPACE` alarm, and a local user creates a Service
//! every minute and at the end. The labels (13 bytes each, 13 KB a Service) are under
//! `--remote-max-label-bytes` (16 KiB), so every flip is a follower update the daemon writes:
//! what keeps the local etcd alive is that the labels go onto the follower Service only (the
//! update limit, `--remote-max-service-updates-per-second` 10, is above this rate;
//! tests/writes.rs holds a remote to it). Before issue 37 each flip rewrote the follower
//! Service, its 10 slices and its Endpoints with every label.
mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use support::daemon::{Daemon, args_for, with_flag};
use support::fault::{Lost, Report, conclude, snapshot};
use support::{KEY, client, eventually, namespace_in, obj};

const LOCAL_Q: &str = "quota-west";
const REMOTE_Q: &str = "quota-east";
/// The local etcd's quota, MiB.
const QUOTA_MIB: &str = "256";
const SERVICES: usize = 300;
const LABELS: usize = 1000;
const SLICES: usize = 10;
/// One flip every 200 ms (the issue asks for one a second; five make the writes of the code
/// before issue 37 fill the quota in about two minutes): each Service's label changes once a
/// minute. Twenty a second, above the daemon's default update rate, filled it in 9.4 minutes in
/// one full run (the daemon updating at its limit, 10 a second, about 35 KB each): the update
/// limit counts updates, not bytes.
const FLIP_EVERY: Duration = Duration::from_millis(200);
const SOAK: Duration = Duration::from_secs(600);
const SAMPLE_EVERY: Duration = Duration::from_secs(5);

/// A selectorless leader with [`LABELS`] labels `k0000`..: `v` plus 7 digits (13 bytes each)
/// and [`SLICES`] ports.
fn leader(i: usize) -> Service {
    let mut l = serde_json::Map::new();
    l.insert(KEY.into(), json!("true"));
    for k in 0..LABELS {
        l.insert(format!("k{k:04}"), json!(format!("v{:07}", 0)));
    }
    let ports: Vec<Value> = (0..SLICES)
        .map(|p| json!({"name": format!("p{p}"), "port": 10000 + p, "protocol": "TCP"}))
        .collect();
    obj(
        json!({"metadata": {"name": format!("svc-{i:03}"), "labels": l},
                "spec": {"ports": ports}}),
    )
}

/// Slice `p` of leader `i`: one endpoint on a port of its own.
fn slice(i: usize, p: usize) -> EndpointSlice {
    let svc = format!("svc-{i:03}");
    obj(json!({
        "metadata": {"name": format!("{svc}-{p}"), "labels": {"kubernetes.io/service-name": svc}},
        "addressType": "IPv4",
        "ports": [{"name": format!("p{p}"), "port": 10000 + p, "protocol": "TCP"}],
        "endpoints": [{"addresses": [format!("10.{}.{}.{}", 78 + i / 250, i % 250, p + 1)],
                       "conditions": {"ready": true}}]
    }))
}

/// The remote's leaders and slices, 16 requests at a time.
async fn write_leaders(east: &Client, ns: &str) {
    let (svcs, slices): (Api<Service>, Api<EndpointSlice>) = (
        Api::namespaced(east.clone(), ns),
        Api::namespaced(east.clone(), ns),
    );
    let pp = PostParams::default();
    stream::iter(0..SERVICES)
        .map(|i| {
            let (svcs, slices, pp) = (&svcs, &slices, &pp);
            async move {
                svcs.create(pp, &leader(i)).await?;
                for p in 0..SLICES {
                    slices.create(pp, &slice(i, p)).await?;
                }
                Ok::<_, kube::Error>(())
            }
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await
        .expect("the remote's leaders and slices");
}

/// What the local etcd says of itself: its database's size (bytes, as allocated and in use)
/// and its alarms.
#[derive(Debug, Default, Clone)]
struct Etcd {
    size: f64,
    in_use: f64,
    alarms: Vec<String>,
}

async fn etcd(cluster: &str) -> Result<Etcd, String> {
    let port = support::etcd_port(cluster).await;
    let (code, text) = tokio::task::spawn_blocking(move || {
        support::daemon::http_get(port, "/metrics", Duration::from_secs(5))
    })
    .await
    .map_err(|e| e.to_string())??;
    if code != 200 {
        return Err(format!("etcd /metrics: {code}"));
    }
    let series = |name| support::metrics::series_value(&text, name, &[]);
    let alarms = support::etcd_call(port, "/v3/maintenance/alarm", json!({"action": "GET"}))
        .await?["alarms"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| x["alarm"].as_str().unwrap_or("?").to_string())
                .collect()
        })
        .unwrap_or_default();
    Ok(Etcd {
        size: series("etcd_mvcc_db_total_size_in_bytes")?,
        in_use: series("etcd_mvcc_db_total_size_in_use_in_bytes")?,
        alarms,
    })
}

/// A local user's Service, created and deleted: the error of either.
async fn user_service(west: &Client, ns: &str, name: &str) -> Result<(), String> {
    let api: Api<Service> = Api::namespaced(west.clone(), ns);
    let svc: Service = obj(json!({"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}}));
    (api.create(&PostParams::default(), &svc).await)
        .map_err(|e| format!("create Service {name}: {e}"))?;
    (api.delete(name, &DeleteParams::default()).await)
        .map_err(|e| format!("delete Service {name}: {e}"))?;
    Ok(())
}

/// Flips label `k0000` of the leaders in turn, one every [`FLIP_EVERY`], until `stop`; counts
/// the flips made in `done`.
async fn flip(east: Client, ns: String, stop: Arc<AtomicBool>, done: Arc<AtomicU64>) {
    let api: Api<Service> = Api::namespaced(east, &ns);
    let mut tick = tokio::time::interval(FLIP_EVERY);
    let mut i = 0usize;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        i += 1;
        let patch = json!({"metadata": {"labels": {"k0000": format!("v{i:07}")}}});
        let name = format!("svc-{:03}", i % SERVICES);
        if api
            .patch(&name, &PatchParams::default(), &Patch::Merge(patch))
            .await
            .is_ok()
        {
            done.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[tokio::test]
async fn a_remote_churning_300_big_services_leaves_a_small_local_etcd_room_for_ten_minutes() {
    tokio::join!(
        support::quota_cluster(LOCAL_Q, QUOTA_MIB),
        support::extra_cluster(REMOTE_Q, "")
    );
    let ns = namespace_in("etcd-quota", &[REMOTE_Q, LOCAL_Q]).await;
    let (east, west) = (client(REMOTE_Q).await, client(LOCAL_Q).await);
    write_leaders(&east, &ns.name).await;
    let args = with_flag(args_for(&ns.name), "--local-context", LOCAL_Q);
    let d = Daemon::start(&with_flag(args, "--remote-context", REMOTE_Q)).await;
    let (svcs, slices): (Api<Service>, Api<EndpointSlice>) = (
        Api::namespaced(west.clone(), &ns.name),
        Api::namespaced(west.clone(), &ns.name),
    );
    let followers = ListParams::default().labels(&format!("{KEY}=follower"));
    eventually(
        "every follower and its slices",
        Duration::from_secs(300),
        || async {
            let n = svcs
                .list_metadata(&followers)
                .await
                .map_err(|e| e.to_string())?;
            let s = slices
                .list_metadata(&followers)
                .await
                .map_err(|e| e.to_string())?;
            (n.items.len() == SERVICES && s.items.len() == SERVICES * SLICES)
                .then_some(())
                .ok_or(format!(
                    "{} followers, {} slices",
                    n.items.len(),
                    s.items.len()
                ))
        },
    )
    .await;
    let before = snapshot(&west, &[&ns.name]).await;
    let start = etcd(LOCAL_Q).await.expect("the local etcd");
    let updates_before = d.writes(&["Service"], &["update"]);

    // ten minutes of flips; the local etcd sampled every 5 s, a local user's Service each minute
    let (stop, flips) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let flipper = tokio::spawn(flip(
        east.clone(),
        ns.name.clone(),
        Arc::clone(&stop),
        Arc::clone(&flips),
    ));
    let t0 = Instant::now();
    let mut peak = start.clone();
    let mut next_user = Duration::ZERO;
    let mut users = 0;
    while t0.elapsed() < SOAK {
        let now = etcd(LOCAL_Q).await.expect("the local etcd");
        assert!(
            now.alarms.is_empty(),
            "the local etcd raised {:?} after {:?} ({} flips, size {:.0} MiB)",
            now.alarms,
            t0.elapsed(),
            flips.load(Ordering::SeqCst),
            now.size / 1048576.0
        );
        if now.size > peak.size {
            peak = now;
        }
        if t0.elapsed() >= next_user {
            let name = format!("user-{users}");
            if let Err(e) = user_service(&west, &ns.name, &name).await {
                panic!("a local user's Service after {:?}: {e}", t0.elapsed());
            }
            users += 1;
            next_user += Duration::from_secs(60);
        }
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    stop.store(true, Ordering::SeqCst);
    flipper.await.expect("the flips");
    let soaked = t0.elapsed();
    user_service(&west, &ns.name, "user-last")
        .await
        .expect("a local user's Service after the soak");
    let end = etcd(LOCAL_Q).await.expect("the local etcd");
    assert!(end.alarms.is_empty(), "{end:?}");
    let flipped = flips.load(Ordering::SeqCst);
    let updates = d.writes(&["Service"], &["update"]) - updates_before;
    let rate = updates / soaked.as_secs_f64();
    assert!(
        rate <= 10.5,
        "the follower Services were updated {rate:.1} times a second (the default limit: 10)"
    );
    let mib = |b: f64| b / 1048576.0;
    let note = format!(
        "{flipped} flips in {:.0} s ({:.1}/s); the daemon updated follower Services {updates:.0} times ({rate:.1}/s, limit 10); local etcd (quota {QUOTA_MIB} MiB): {:.0} MiB before, peak {:.0} MiB ({:.0} MiB in use), {:.0} MiB at the end, no alarm; {} local Services created, one each minute and one after",
        soaked.as_secs_f64(),
        flipped as f64 / soaked.as_secs_f64(),
        mib(start.size),
        mib(peak.size),
        mib(peak.in_use),
        mib(end.size),
        users + 1
    );
    println!("etcd quota: {note}");
    let after = snapshot(&west, &[&ns.name]).await;
    conclude(
        Report {
            id: "58-writes-etcd-quota",
            scenario: "A remote exports 300 Services of 1,000 labels (13 KB, under the label limit) and 10 single-endpoint slices each, beside a local etcd with a 256 MiB quota (issue 37)",
            done: "label k0000 of the leaders flipped in turn 5 times a second for 10 minutes; a local user's Service created every minute and at the end",
            converge: None,
            note,
        },
        &Lost::since(&before, &after, &BTreeSet::new()),
        &before.non_followers_touched(&after),
    );
    drop(d);
}
