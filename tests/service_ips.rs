//! End to end: a remote cannot exhaust the local Service range (issue 37, item 2). A local
//! cluster whose Service range is a /24 (254 addresses, `narrow`), a remote exporting 300
//! ClusterIP Services: the remote gets its share of followers (25%: 63), the rest wait with an
//! Event, a skip counted with reason `ServiceIpsLimited` and a /readyz line naming it, the
//! daemon stays ready, and a local user's Service is still given an address. A follower freed
//! lets one that waited in.
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_flag};
use support::fault::{Lost, Report, conclude, snapshot};
use support::{REMOTE, client, eventually, exported, namespace_in, obj};

const NARROW: &str = "narrow";
const WAIT: Duration = Duration::from_secs(120);
const LEADERS: usize = 300;
/// 25% of the 254 usable addresses of a /24
const SHARE: usize = 63;
/// the usable addresses of a /24 less the `kubernetes` Service's
const FREE: usize = 253;

fn leader(i: usize) -> String {
    format!("svc-{i:03}")
}

/// The followers in `ns` of the narrow cluster, by name.
async fn followers(api: &Api<Service>) -> Result<Vec<String>, String> {
    let lp = ListParams::default().labels("fair.com/cross-cluster=follower");
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    Ok(list.items.iter().map(|s| s.name_any()).collect())
}

/// How many keys /readyz says wait for a ClusterIP of the remote's.
fn waiting(d: &Daemon) -> Result<usize, String> {
    let (code, body) = d.readyz()?;
    if code != 200 {
        return Err(format!("/readyz {code}:\n{body}"));
    }
    let line = body
        .lines()
        .find(|l| l.starts_with(&format!("remote {REMOTE}: Service IPs limited: ")));
    Ok(line
        .and_then(|l| l.split(": ").nth(2)?.split(' ').next()?.parse().ok())
        .unwrap_or(0))
}

#[tokio::test]
async fn a_remote_gets_its_share_of_a_small_service_range_and_a_local_user_still_gets_an_address() {
    support::narrow_cluster(NARROW, "24").await;
    let ns = namespace_in("service-ips", &[REMOTE, NARROW]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let pp = PostParams::default();
    for i in 0..LEADERS {
        east.create(&pp, &exported(&leader(i), 80)).await.unwrap();
    }
    let local = client(NARROW).await;
    let narrow: Api<Service> = Api::namespaced(local.clone(), &ns.name);
    let before = snapshot(&local, &[&ns.name]).await;

    let t0 = Instant::now();
    let d = Daemon::start(&with_flag(args_for(&ns.name), "--local-context", NARROW)).await;
    d.wait_synced(&[REMOTE]).await;
    // settled: every leader mirrored or waiting (or, without the defence, the range full)
    let (mirrored, waits) = eventually("every leader mirrored or waiting", WAIT, || async {
        let f = followers(&narrow).await?.len();
        let w = waiting(&d)?;
        if f + w == LEADERS || f >= FREE {
            Ok((f, w))
        } else {
            Err(format!("{f} followers, {w} waiting"))
        }
    })
    .await;
    let took = t0.elapsed();
    let after = snapshot(&local, &[&ns.name]).await;

    // a local user's Service is still given an address
    let mine = obj(json!({"metadata": {"name": "mine"},
        "spec": {"ports": [{"name": "http", "port": 80}]}}));
    let created = narrow.create(&pp, &mine).await;
    let ip = match created {
        Ok(s) => s.spec.and_then(|s| s.cluster_ip).unwrap_or_default(),
        Err(e) => panic!("the local user's Service was refused ({mirrored} followers): {e}"),
    };
    assert!(ip.starts_with("10."), "{ip}");
    assert_eq!((mirrored, waits), (SHARE, LEADERS - SHARE));

    let (code, ready) = d.readyz().expect("readyz");
    assert_eq!(code, 200, "the limit keeps the daemon ready:\n{ready}");
    assert!(
        ready.contains(&format!(
            "local Service range: 254 addresses; remotes hold {SHARE}"
        )),
        "{ready}"
    );
    d.wait_metric(
        "xcc_skipped_total",
        &[("remote", REMOTE), ("reason", "ServiceIpsLimited")],
        (LEADERS - SHARE) as f64,
    )
    .await;
    let notes = eventually("a ServiceIpsLimited Event", WAIT, || {
        support::event_notes(NARROW, &ns.name, "ServiceIpsLimited", None)
    })
    .await;
    assert!(
        notes
            .iter()
            .any(|n| n.contains("(from east)") && n.contains("25% of 254")),
        "{notes:?}"
    );

    // one leader goes: its follower goes, and one that waited takes the address freed
    let first = followers(&narrow).await.unwrap();
    let gone = first.iter().min().unwrap().clone();
    east.delete(&gone, &DeleteParams::default()).await.unwrap();
    let t1 = Instant::now();
    eventually(
        "the follower freed replaced by one that waited",
        WAIT,
        || async {
            let now = followers(&narrow).await?;
            let w = waiting(&d)?;
            let fresh = now.iter().filter(|n| !first.contains(n)).count();
            if !now.contains(&gone) && now.len() == SHARE && fresh == 1 && w == LEADERS - SHARE - 1
            {
                Ok(())
            } else {
                Err(format!(
                    "{} followers ({fresh} new, {gone} there: {}), {w} waiting",
                    now.len(),
                    now.contains(&gone)
                ))
            }
        },
    )
    .await;
    let freed = t1.elapsed();
    let kept: Vec<&String> = first.iter().filter(|n| **n != gone).collect();
    let now = followers(&narrow).await.unwrap();
    let lost: Vec<String> = kept
        .iter()
        .filter(|n| !now.contains(n))
        .map(|n| n.to_string())
        .collect();
    conclude(
        Report {
            id: "96-contain-service-ips",
            scenario: "A remote exports 300 ClusterIP Services into a local cluster whose Service range is a /24 (254 addresses)",
            done: "a daemon with the default shares (25% per remote, 50% all remotes); a local user creates a Service; then one leader is deleted",
            converge: Some(took),
            note: format!(
                "{SHARE} followers (25% of 254), {} waiting (ServiceIpsLimited Event, skip counter, /readyz line; daemon ready); the user's Service got {ip}; a follower freed was replaced by one that waited in {:.1} s",
                LEADERS - SHARE,
                freed.as_secs_f64()
            ),
        },
        &Lost {
            checked: kept.len(),
            lost,
        },
        &before.non_followers_touched(&after),
    );
}
