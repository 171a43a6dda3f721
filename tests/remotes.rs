//! Remotes joined and left at run time through Secrets, on three real clusters: east and south
//! are remotes, west is local. The daemon here has no static remote (no --kubeconfig, no
//! --remote-context): every remote it reads comes from a Secret in its namespace.
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::Daemon;
use support::fault::{Lost, Report, conclude, snapshot};
use support::metrics::{VERBS, WRITE_KINDS};
use support::remotes::{apply_secret, export, kubeconfig_of, remote_secret, secrets_only_args};
use support::{
    LOCAL, REMOTE, absent, bed, bed_cmd, client, eventually, exported, exported_with, namespace_in,
    obj, ports_are, present, remote_slice,
};

/// A third cluster of the bed, a remote of its own for these tests.
const SOUTH: &str = "south";
/// A fourth, whose API server one test stops (a cluster of its own, so no other test sees it).
const LAPSE: &str = "lapse";
const WAIT: Duration = Duration::from_secs(60);

/// A daemon writing into `ns` of west whose remotes are the Secrets of `ns`; sweeps every 2 s,
/// a remote leaves 2 s after its Secret is deleted.
async fn daemon(ns: &str) -> Daemon {
    let d = daemon_started(ns).await;
    d.wait_leading().await;
    d
}

/// [`daemon`], not waiting for it to be ready.
async fn daemon_started(ns: &str) -> Daemon {
    Daemon::start_secrets_only(&secrets_only_args(ns)).await
}

async fn ready_lines(d: &Daemon) -> (u16, String) {
    d.readyz().expect("readyz")
}

/// A plain local Service beside the followers: what must never be touched.
async fn decoy(west: &Api<Service>) {
    west.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "decoy"}, "spec": {"ports": [{"port": 5432}]}})),
    )
    .await
    .unwrap();
}

/// Families in which a member remote has series (gauges read from the set of remotes, counters
/// put at 0 when it joins, its watches' requests): checked before it leaves, so "none left" after
/// cannot pass on a page that never had them.
const REMOTE_FAMILIES: [&str; 6] = [
    "xcc_remote_up",
    "xcc_followers",
    "xcc_export_conflicts",
    "xcc_skipped_total",
    "xcc_sweeps_total",
    "xcc_watch_requests_total",
];

/// `remote` has series in every family of [`REMOTE_FAMILIES`].
fn has_series(d: &Daemon, remote: &str) {
    let series = d.series_of(remote);
    for f in REMOTE_FAMILIES {
        assert!(
            series.iter().any(|l| l.starts_with(&format!("{f}{{"))),
            "no {f} series of {remote} on /metrics: {series:#?}"
        );
    }
}

/// A remote that left has no series at all on /metrics (no gauge frozen at its last value, which
/// would keep an alert firing, and no counter); `stays`, still a member, keeps its own.
fn no_series_left(d: &Daemon, left: &str, stays: &str) {
    let series = d.series_of(left);
    assert!(
        series.is_empty(),
        "{} series of {left} left on /metrics after it left: {series:#?}",
        series.len()
    );
    has_series(d, stays);
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn a_remote_secret_joins_rotates_and_leaves_without_disturbing_the_others() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("remotes-join", &[REMOTE, LOCAL, SOUTH]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let south: Api<Service> = Api::namespaced(client(SOUTH).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let pp = PostParams::default();
    east.create(&pp, &exported("from-east", 80)).await.unwrap();
    south
        .create(&pp, &exported("from-south", 80))
        .await
        .unwrap();
    decoy(&west).await;
    let d = daemon(&ns.name).await;

    // join: a Secret per remote, no restart
    let east_kc = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&east_kc))).await;
    eventually("east's leader mirrored", WAIT, || {
        present(&west, "from-east")
    })
    .await;
    let south_kc = kubeconfig_of(SOUTH, |_| {}).await;
    apply_secret(
        &secrets,
        &remote_secret("the-south-one", Some(SOUTH), Some(&south_kc)),
    )
    .await;
    eventually("south's leader mirrored", WAIT, || {
        present(&west, "from-south")
    })
    .await;
    let f = west.get("from-south").await.unwrap();
    assert_eq!(
        f.annotations().get("fair.com/cross-cluster-origin-cluster"),
        Some(&SOUTH.to_string()),
        "named by its label, not the Secret's name"
    );
    d.wait_metric("xcc_remote_changes_total", &[("change", "joined")], 2.0)
        .await;
    let east_before = west.get("from-east").await.unwrap();
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // rotate: another kubeconfig text for the same cluster (here, renamed entries)
    let rotated = kubeconfig_of(REMOTE, |kc| {
        for u in &mut kc.auth_infos {
            u.name = format!("{}-rotated", u.name);
        }
        for c in &mut kc.contexts {
            if let Some(ctx) = c.context.as_mut() {
                ctx.user = ctx.user.as_ref().map(|u| format!("{u}-rotated"));
            }
        }
    })
    .await;
    // follower writes: health Lease renewals and Events are writes too, at their own time
    let writes = d.follower_writes(&VERBS);
    let unchanged = [("outcome", "unchanged")];
    let first_passes = || {
        d.logs()
            .lines()
            .filter(|l| {
                l.contains("caches synced; reconciling every exported Service and follower")
                    && l.contains("remote=east")
            })
            .count()
    };
    let passes_before = first_passes();
    // counted before the rotation: its first pass queues both followers (from-east, from-south),
    // each then passed at least once, finding nothing to write
    let passes = d.metric("xcc_reconciles_total", &unchanged);
    apply_secret(&secrets, &remote_secret("east", None, Some(&rotated))).await;
    d.wait_metric("xcc_remote_changes_total", &[("change", "rotated")], 1.0)
        .await;
    // the new watches listed east and queued every key (a count taken only then, so a pass of
    // the old watches cannot stand in for it)
    eventually("the rotated remote's first pass", WAIT, || async {
        let n = first_passes();
        (n > passes_before).then_some(()).ok_or(format!("{n}"))
    })
    .await;
    d.wait_metric("xcc_reconciles_total", &unchanged, passes + 2.0)
        .await;
    let east_rotated = west.get("from-east").await.unwrap();
    assert_eq!(
        east_rotated.resource_version(),
        east_before.resource_version(),
        "the rotation rewrote nothing"
    );
    assert_eq!(d.follower_writes(&VERBS), writes, "{}", d.logs());
    // the rotated remote reads on: a change made after the rotation arrives
    east.patch(
        "from-east",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 81}]}})),
    )
    .await
    .unwrap();
    eventually("the change after the rotation", WAIT, || {
        ports_are(&west, "from-east", &[81])
    })
    .await;
    let east_after = west.get("from-east").await.unwrap();
    assert_eq!(east_after.uid(), east_before.uid(), "not re-created");

    // leave: south's Secret deleted; after the grace its follower goes, east's stays, and so
    // do east's series alone
    has_series(&d, SOUTH);
    secrets
        .delete("the-south-one", &DeleteParams::default())
        .await
        .unwrap();
    let t0 = Instant::now();
    eventually("south's follower deleted", WAIT, || {
        absent(&west, "from-south")
    })
    .await;
    let left = t0.elapsed();
    d.wait_metric("xcc_remote_changes_total", &[("change", "left")], 1.0)
        .await;
    no_series_left(&d, SOUTH, "east");
    assert_eq!(
        west.get("from-east").await.unwrap().uid(),
        east_before.uid()
    );
    assert!(d.logs().contains("remote left"), "{}", d.logs());
    let events: Api<Event> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the RemoteLeft Event", WAIT, || async {
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        list.items
            .iter()
            .any(|e| e.reason.as_deref() == Some("RemoteLeft"))
            .then_some(())
            .ok_or_else(|| format!("{} events", list.items.len()))
    })
    .await;
    let (code, body) = ready_lines(&d).await;
    assert_eq!(code, 200, "{body}");
    assert!(!body.contains(SOUTH), "south is gone from /readyz: {body}");
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "40-remote-secrets-join-rotate-leave",
            scenario: "Remotes joined, rotated and left at run time through Secrets (three clusters)",
            done: "a daemon with no static remote; Secrets for east and south applied while it ran; east's kubeconfig replaced; south's Secret deleted (grace 2 s)",
            converge: Some(left),
            note: "converged in: from south's Secret deleted to its follower gone, the 2 s grace included; both remotes joined without a restart; the rotation rewrote nothing (resourceVersion and write count unchanged) and a later change arrived; east's follower kept its uid; RemoteLeft Event; no series of south left on /metrics, east's kept".into(),
        },
        &Lost::since(&before, &after, &names(&["from-east"])),
        &before.non_followers_touched(&after),
    );
}

#[tokio::test]
async fn bad_remote_secrets_are_refused_one_by_one_and_the_good_remote_keeps_flowing() {
    let ns = namespace_in("remotes-bad", &[REMOTE, LOCAL]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&PostParams::default(), &exported("web", 80))
        .await
        .unwrap();
    decoy(&west).await;
    let d = daemon(&ns.name).await;
    let good = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&good))).await;
    eventually("the good remote mirrored", WAIT, || present(&west, "web")).await;
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    let west_ca = {
        let kc = Kubeconfig::read_from(&bed().await.kubeconfig).unwrap();
        kc.clusters
            .iter()
            .find(|c| c.name == LOCAL)
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.certificate_authority_data.clone())
            .expect("west's CA")
    };
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let cases: Vec<(&str, Option<String>, &str)> = vec![
        ("no-key", None, "no data key \"kubeconfig\""),
        (
            "malformed",
            Some("clusters: [unclosed".into()),
            "is not a kubeconfig",
        ),
        (
            "unknown-context",
            Some(kubeconfig_of("nowhere", |_| {}).await),
            "nowhere",
        ),
        (
            "local",
            Some(kubeconfig_of(LOCAL, |_| {}).await),
            "local cluster",
        ),
        (
            "other-ca",
            Some(
                kubeconfig_of(REMOTE, |kc| {
                    for c in &mut kc.clusters {
                        if c.name == REMOTE
                            && let Some(cluster) = c.cluster.as_mut()
                        {
                            cluster.certificate_authority_data = Some(west_ca.clone());
                        }
                    }
                })
                .await,
            ),
            "UnknownIssuer",
        ),
        (
            "unreachable",
            Some(
                kubeconfig_of(REMOTE, |kc| {
                    for c in &mut kc.clusters {
                        if c.name == REMOTE
                            && let Some(cluster) = c.cluster.as_mut()
                        {
                            cluster.server = Some(format!("https://127.0.0.1:{closed}"));
                        }
                    }
                })
                .await,
            ),
            "Connect",
        ),
        (
            "east-again",
            Some(good.clone()),
            "already read as remote \"east\"",
        ),
        // (its remote name, from its label, is east's)
        (
            "dup-name",
            Some(good.clone()),
            "is already named by Secret t-remotes-bad-",
        ),
    ];
    for (name, kc, _) in &cases {
        let remote = (*name == "dup-name").then_some("east");
        apply_secret(&secrets, &remote_secret(name, remote, kc.as_deref())).await;
    }
    let t0 = Instant::now();
    // each one named on /readyz with its reason
    let body = eventually("every bad Secret on /readyz", WAIT, || async {
        let (code, body) = d.readyz()?;
        let missing: Vec<&str> = cases
            .iter()
            .filter(|(name, _, why)| {
                !body
                    .lines()
                    .any(|l| l.contains(&format!("Secret {}/{name}:", ns.name)) && l.contains(why))
            })
            .map(|(name, _, _)| *name)
            .collect();
        if code == 503 && missing.is_empty() {
            Ok(body)
        } else {
            Err(format!("{code}, missing {missing:?}:\n{body}"))
        }
    })
    .await;
    let shown = t0.elapsed();
    assert!(body.contains("remote east: synced"), "{body}");
    assert_eq!(
        d.gauge("xcc_remote_secrets_refused", &[]),
        Some(cases.len() as f64)
    );
    // an Event on each bad Secret
    let events: Api<Event> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually(
        "a RemoteRefused Event on every bad Secret",
        WAIT,
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let missing: Vec<&str> = cases
                .iter()
                .map(|(name, _, _)| *name)
                .filter(|name| {
                    !list.items.iter().any(|e| {
                        e.reason.as_deref() == Some("RemoteRefused")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(*name)
                    })
                })
                .collect();
            missing
                .is_empty()
                .then_some(())
                .ok_or(format!("{missing:?}"))
        },
    )
    .await;
    // and the good remote keeps flowing
    east.create(&PostParams::default(), &exported("later", 80))
        .await
        .unwrap();
    eventually("a new leader of the good remote", WAIT, || {
        present(&west, "later")
    })
    .await;
    // a bad Secret fixed joins; one deleted leaves /readyz
    apply_secret(
        &secrets,
        &remote_secret("no-key", Some("east-too"), Some(&good)),
    )
    .await;
    secrets
        .delete("malformed", &DeleteParams::default())
        .await
        .unwrap();
    eventually(
        "the fixed and the deleted Secret off /readyz",
        WAIT,
        || async {
            let (_, body) = d.readyz()?;
            let stale = body.contains("/malformed:");
            // the fixed one reaches east again under another name: refused for that reason now
            let fixed = body
                .lines()
                .any(|l| l.contains("/no-key:") && l.contains("already read as remote"));
            (fixed && !stale).then_some(()).ok_or(body)
        },
    )
    .await;
    assert!(d.logs().contains("not a usable remote"), "{}", d.logs());
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "64-bad-remote-secrets",
            scenario: "Bad remote Secrets beside a good one",
            done: &format!(
                "{} Secrets applied under a running daemon that reads east from a good one: no kubeconfig key, not a kubeconfig, unknown context, the local cluster, another cluster's CA, an unreachable server, east again under another name, east's name again; then one fixed and one deleted",
                cases.len()
            ),
            converge: None,
            note: format!(
                "all {} on /readyz (503), each with its reason, {:.1} s after they were applied; a RemoteRefused Event on each Secret; xcc_remote_secrets_refused {}; east kept flowing (a new leader mirrored meanwhile); the deleted one left /readyz",
                cases.len(),
                shown.as_secs_f64(),
                cases.len()
            ),
        },
        &Lost::since(&before, &after, &names(&["web"])),
        &before.non_followers_touched(&after),
    );
}

#[tokio::test]
async fn a_remote_secret_swapped_to_another_cluster_is_held_and_deletes_nothing() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("remotes-swap", &[REMOTE, LOCAL, SOUTH]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    for n in ["a", "b"] {
        east.create(&PostParams::default(), &exported(n, 80))
            .await
            .unwrap();
    }
    decoy(&west).await;
    let mut d = daemon(&ns.name).await;
    let east_kc = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&east_kc))).await;
    for n in ["a", "b"] {
        eventually("east's leaders mirrored", WAIT, || present(&west, n)).await;
    }
    let uids: Vec<_> = [
        west.get("a").await.unwrap().uid(),
        west.get("b").await.unwrap().uid(),
    ]
    .to_vec();

    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // the same Secret now reaches south, where the namespace holds no leader at all: a complete
    // listing of it would "prove" a and b gone
    let south_kc = kubeconfig_of(SOUTH, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&south_kc))).await;
    let t0 = Instant::now();
    let body = eventually("the swap held and shown on /readyz", WAIT, || async {
        let (code, body) = d.readyz()?;
        (code == 503 && body.contains("held: it now reaches cluster"))
            .then_some(body.clone())
            .ok_or(format!("{code} {body}"))
    })
    .await;
    let shown = t0.elapsed();
    assert!(
        body.contains("remote east: synced"),
        "east is still read: {body}"
    );
    // several sweeps later, nothing was deleted
    let east_done = [("remote", REMOTE), ("outcome", "done")];
    let sweeps = d.metric("xcc_sweeps_total", &east_done);
    d.wait_metric("xcc_sweeps_total", &east_done, sweeps + 2.0)
        .await;
    let now: Vec<_> = [
        west.get("a").await.unwrap().uid(),
        west.get("b").await.unwrap().uid(),
    ]
    .to_vec();
    assert_eq!(now, uids, "no follower deleted or re-made");
    assert_eq!(d.writes(&WRITE_KINDS, &["delete"]), 0.0);
    // east still flows through the member that was running
    east.create(&PostParams::default(), &exported("c", 80))
        .await
        .unwrap();
    eventually("east still mirrored", WAIT, || present(&west, "c")).await;

    // a new process finds the Secret already pointing at south: the followers record which
    // cluster east was (annotation origin-cluster-id), so it holds too
    let uids: Vec<_> = [
        west.get("a").await.unwrap().uid(),
        west.get("b").await.unwrap().uid(),
        west.get("c").await.unwrap().uid(),
    ]
    .to_vec();
    d.kill();
    let d2 = daemon_started(&ns.name).await;
    eventually("the restarted daemon to hold the swap", WAIT, || async {
        let (code, body) = d2.readyz()?;
        (code == 503 && body.contains("held: it now reaches cluster"))
            .then_some(())
            .ok_or(format!("{code} {body}"))
    })
    .await;
    // held before any watch of south could start: it never became a remote, so nothing of
    // south's was listed and nothing can be judged gone
    eventually("the restarted daemon to lead", WAIT, || async {
        let g = d2.gauge("xcc_leader", &[]);
        (g == Some(1.0)).then_some(()).ok_or(format!("{g:?}"))
    })
    .await;
    let now: Vec<_> = [
        west.get("a").await.unwrap().uid(),
        west.get("b").await.unwrap().uid(),
        west.get("c").await.unwrap().uid(),
    ]
    .to_vec();
    assert_eq!(
        now, uids,
        "no follower deleted or re-made after the restart"
    );
    // follower writes: the new leader's health Lease and Events are writes too, at their own time
    assert_eq!(d2.follower_writes(&VERBS), 0.0, "{}", d2.logs());
    assert_eq!(
        d2.metric("xcc_remote_changes_total", &[("change", "joined")]),
        0.0,
        "south never joined\n{}",
        d2.logs()
    );
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "65-remote-secret-swapped",
            scenario: "A remote's Secret swapped to another cluster (same name, an empty namespace there)",
            done: "east's Secret replaced by a kubeconfig of south, whose namespace holds no leader; then the daemon SIGKILLed and started again",
            converge: None,
            note: format!(
                "held, not switched: shown on /readyz {:.1} s after the swap (\"held: it now reaches cluster ...\"); 2 sweeps later 0 deletes, both followers kept their uids; east still read through the member that was running (a new leader mirrored)",
                shown.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &names(&["a", "b"])),
        &before.non_followers_touched(&after),
    );
}

/// The local follower slices of `svc`: (their source-cluster label, their addresses), sorted.
async fn sources(api: &Api<EndpointSlice>, svc: &str) -> Result<Vec<(String, String)>, String> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    let list = api.list(&lp).await.map_err(|e| e.to_string())?;
    let mut out: Vec<(String, String)> = list
        .items
        .iter()
        .map(|s| {
            let source = s
                .labels()
                .get("fair.com/cross-cluster-origin-cluster")
                .cloned()
                .unwrap_or_default();
            let ips: Vec<String> = s
                .endpoints
                .iter()
                .flat_map(|e| e.addresses.clone())
                .collect();
            (source, ips.join(","))
        })
        .collect();
    out.sort();
    Ok(out)
}

fn port_names(s: &Service) -> Vec<(String, i32)> {
    let mut out: Vec<(String, i32)> = s
        .spec
        .iter()
        .flat_map(|s| s.ports.iter().flatten())
        .map(|p| (p.name.clone().unwrap_or_default(), p.port))
        .collect();
    out.sort();
    out
}

async fn events_with_reason(ns: &str, reason: &str) -> Result<Vec<String>, String> {
    support::event_notes(LOCAL, ns, reason, None).await
}

#[tokio::test]
async fn a_service_exported_by_two_remotes_is_one_follower_and_each_remote_takes_only_its_own() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("remotes-merge", &[REMOTE, LOCAL, SOUTH]).await;
    let pp = PostParams::default();
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let south: Api<Service> = Api::namespaced(client(SOUTH).await, &ns.name);
    let east_sl: Api<EndpointSlice> = Api::namespaced(client(REMOTE).await, &ns.name);
    let south_sl: Api<EndpointSlice> = Api::namespaced(client(SOUTH).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let west_sl: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    // east's leaders are the older ones: east wins every conflict
    east.create(&pp, &exported("both", 80)).await.unwrap();
    east_sl
        .create(&pp, &remote_slice("both", "both-e", &["10.1.0.1"]))
        .await
        .unwrap();
    east.create(&pp, &exported("clash", 80)).await.unwrap();
    // one leader per other conflict kind: type (ClusterIP vs headless; ExternalName vs
    // ClusterIP), session affinity
    let http = json!([{"name": "http", "port": 80}]);
    east.create(&pp, &exported("kind-type", 80)).await.unwrap();
    let external = json!({"type": "ExternalName", "externalName": "db.example.com"});
    east.create(&pp, &exported_with("kind-ext", external))
        .await
        .unwrap();
    east.create(&pp, &exported("kind-aff", 80)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await; // creationTimestamps have 1 s steps
    let both_south = json!([{"name": "http", "port": 80}, {"name": "metrics", "port": 9100}]);
    south
        .create(&pp, &exported_with("both", json!({"ports": both_south})))
        .await
        .unwrap();
    south_sl
        .create(&pp, &remote_slice("both", "both-s", &["10.2.0.1"]))
        .await
        .unwrap();
    south.create(&pp, &exported("clash", 81)).await.unwrap();
    south
        .create(&pp, &exported("only-south", 80))
        .await
        .unwrap();
    let headless = json!({"clusterIP": "None", "ports": http});
    south
        .create(&pp, &exported_with("kind-type", headless))
        .await
        .unwrap();
    south.create(&pp, &exported("kind-ext", 80)).await.unwrap();
    south_sl
        .create(&pp, &remote_slice("kind-ext", "kind-ext-s", &["10.2.0.9"]))
        .await
        .unwrap();
    let affinity = json!({"sessionAffinity": "ClientIP", "ports": http});
    south
        .create(&pp, &exported_with("kind-aff", affinity))
        .await
        .unwrap();
    decoy(&west).await;
    let d = daemon(&ns.name).await;

    let t0 = Instant::now();
    for (name, context) in [("east", REMOTE), ("south", SOUTH)] {
        if name == "south" {
            // the remote a follower first records as its origin keeps its Service-level fields
            // (desired::merge): east, the older, must have been mirrored before south joins, or
            // a south listed first (east is the bed's busiest cluster) would be the origin
            eventually("clash mirrored from east alone", WAIT, || async {
                let c = present(&west, "clash").await?;
                (port_names(&c) == [("http".to_string(), 80)])
                    .then_some(())
                    .ok_or(format!("{:?}", port_names(&c)))
            })
            .await;
        }
        let kc = kubeconfig_of(context, |_| {}).await;
        let mut secret = remote_secret(name, None, Some(&kc));
        // `kind-ext` below is an ExternalName export, refused unless its remote is allowed them
        secret.metadata.annotations = Some(
            [(
                "fair.com/cross-cluster-allow-external-name".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
        apply_secret(&secrets, &secret).await;
    }
    let want = vec![
        ("east".to_string(), "10.1.0.1".to_string()),
        ("south".to_string(), "10.2.0.1".to_string()),
    ];
    eventually("one follower with both remotes' slices", WAIT, || async {
        let got = sources(&west_sl, "both").await?;
        (got == want).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    let merged_in = t0.elapsed();
    let both = west.get("both").await.unwrap();
    assert_eq!(
        port_names(&both),
        [("http".to_string(), 80), ("metrics".to_string(), 9100)],
        "ports are the union by name"
    );
    assert_eq!(
        both.annotations()
            .get("fair.com/cross-cluster-origin-clusters"),
        Some(&"east,south".to_string())
    );
    for s in west_sl
        .list(&ListParams::default().labels("kubernetes.io/service-name=both"))
        .await
        .unwrap()
        .items
    {
        assert!(
            s.labels()
                .contains_key("multicluster.kubernetes.io/source-cluster"),
            "MCS source-cluster label on {}",
            s.name_any()
        );
        assert_eq!(s.owner_references()[0].uid, both.uid().unwrap());
    }
    // the conflict: south's http is 81, east's (older) 80 wins; reported, south counted
    eventually("clash mirrored with east's port", WAIT, || async {
        let c = present(&west, "clash").await?;
        (port_names(&c) == [("http".to_string(), 80)])
            .then_some(())
            .ok_or(format!("{:?}", port_names(&c)))
    })
    .await;
    let notes = eventually("the ServiceConflict Event", WAIT, || {
        events_with_reason(&ns.name, "ServiceConflict")
    })
    .await;
    assert!(
        notes[0].contains("south") && notes[0].contains("port"),
        "{notes:?}"
    );
    d.wait_metric(
        "xcc_export_conflicts",
        &[("remote", SOUTH), ("kind", "port")],
        1.0,
    )
    .await;
    eventually("only-south mirrored", WAIT, || present(&west, "only-south")).await;
    // every other conflict kind: east's (older) fields win, south's counted
    d.wait_metric(
        "xcc_export_conflicts",
        &[("remote", SOUTH), ("kind", "type")],
        2.0,
    )
    .await;
    d.wait_metric(
        "xcc_export_conflicts",
        &[("remote", SOUTH), ("kind", "session_affinity")],
        1.0,
    )
    .await;
    let spec = |s: Service| s.spec.unwrap_or_default();
    let t = spec(west.get("kind-type").await.unwrap());
    assert_ne!(
        t.cluster_ip.as_deref(),
        Some("None"),
        "east's ClusterIP, not headless"
    );
    let e = spec(west.get("kind-ext").await.unwrap());
    assert_eq!(e.external_name.as_deref(), Some("db.example.com"));
    assert!(
        sources(&west_sl, "kind-ext").await.unwrap().is_empty(),
        "an ExternalName follower takes no endpoints"
    );
    let a = spec(west.get("kind-aff").await.unwrap());
    assert_eq!(a.session_affinity.as_deref(), Some("None"));
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // south's leader of "both" goes: south's slice goes, east's and the Service stay
    south
        .delete("both", &DeleteParams::default())
        .await
        .unwrap();
    let want_east = vec![("east".to_string(), "10.1.0.1".to_string())];
    eventually("only east's slice left", WAIT, || async {
        let got = sources(&west_sl, "both").await?;
        (got == want_east).then_some(()).ok_or(format!("{got:?}"))
    })
    .await;
    eventually("south no longer recorded on both", WAIT, || async {
        let b = present(&west, "both").await?;
        let list = b
            .annotations()
            .get("fair.com/cross-cluster-origin-clusters")
            .cloned();
        (list.as_deref() == Some("east"))
            .then_some(())
            .ok_or(format!("{list:?}"))
    })
    .await;
    assert_eq!(
        west.get("both").await.unwrap().uid(),
        both.uid(),
        "not re-created"
    );

    // south leaves: what only it exported goes; east's followers stay as they were; its
    // export conflicts (1 above) leave /metrics with it, so no alert on them fires on
    has_series(&d, SOUTH);
    let clash = west.get("clash").await.unwrap();
    secrets
        .delete("south", &DeleteParams::default())
        .await
        .unwrap();
    let t1 = Instant::now();
    eventually("only-south deleted", WAIT, || absent(&west, "only-south")).await;
    let left = t1.elapsed();
    d.wait_metric("xcc_remote_changes_total", &[("change", "left")], 1.0)
        .await;
    no_series_left(&d, SOUTH, "east");
    eventually("clash records east only", WAIT, || async {
        let c = present(&west, "clash").await?;
        let list = c
            .annotations()
            .get("fair.com/cross-cluster-origin-clusters")
            .cloned();
        (list.as_deref() == Some("east"))
            .then_some(())
            .ok_or(format!("{list:?}"))
    })
    .await;
    assert_eq!(west.get("clash").await.unwrap().uid(), clash.uid());
    assert_eq!(sources(&west_sl, "both").await.unwrap(), want_east);
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "41-merged-follower-two-remotes",
            scenario: "One Service exported by two remotes: one follower, per-remote slices, conflicts, each remote leaving alone",
            done: "east and south both export `both` (south adds a port), `clash` (same port name, another number), `kind-type` (south headless), `kind-ext` (east ExternalName, south ClusterIP with endpoints) and `kind-aff` (south ClientIP affinity), east's leaders older and east's Secret applied first (south's once east's `clash` is mirrored: the first origin keeps its fields); south also exports `only-south`; then south's `both` deleted, then south's Secret deleted",
            converge: Some(merged_in),
            note: format!(
                "converged in: east's Secret applied to one follower with both remotes' slices (ports the union by name; MCS source-cluster labels); `clash` kept east's port, ServiceConflict Event and xcc_export_conflicts{{remote=south,kind=port}} 1; east's type, ExternalName (no endpoints) and affinity kept, kind=type 2 and kind=session_affinity 1; south's leader deleted: only its slice went, the Service kept its uid; south left: `only-south` deleted {:.1} s after its Secret (2 s grace), merged followers kept their uid, no series of south left on /metrics (its export conflicts included)",
                left.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &names(&["both", "clash"])),
        &before.non_followers_touched(&after),
    );
}

#[tokio::test]
async fn a_remote_that_goes_down_deletes_nothing_while_the_others_keep_converging() {
    support::extra_cluster(LAPSE, "").await;
    let ns = namespace_in("remotes-down", &[REMOTE, LOCAL, LAPSE]).await;
    let pp = PostParams::default();
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let lapse: Api<Service> = Api::namespaced(client(LAPSE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let west_sl: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    export(REMOTE, &ns.name, "both", "both-e", "10.1.0.1").await;
    export(LAPSE, &ns.name, "both", "both-l", "10.3.0.1").await;
    lapse
        .create(&pp, &exported("only-lapse", 80))
        .await
        .unwrap();
    decoy(&west).await;
    let d = daemon(&ns.name).await;
    for (name, context) in [("east", REMOTE), ("lapse", LAPSE)] {
        let kc = kubeconfig_of(context, |_| {}).await;
        apply_secret(&secrets, &remote_secret(name, None, Some(&kc))).await;
    }
    let both_sources = vec![
        ("east".to_string(), "10.1.0.1".to_string()),
        ("lapse".to_string(), "10.3.0.1".to_string()),
    ];
    eventually("both remotes mirrored", WAIT, || async {
        present(&west, "only-lapse").await?;
        let got = sources(&west_sl, "both").await?;
        (got == both_sources)
            .then_some(())
            .ok_or(format!("{got:?}"))
    })
    .await;
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;
    let aborted = [("remote", LAPSE), ("outcome", "aborted")];
    let aborted_before = d.metric("xcc_sweeps_total", &aborted);
    let east_done = [("remote", REMOTE), ("outcome", "done")];

    // lapse's API server dies; east keeps flowing
    tokio::task::spawn_blocking(|| bed_cmd(&["kill", LAPSE, "apiserver"]))
        .await
        .unwrap();
    let down = Instant::now();
    eventually("/readyz names lapse, and only lapse", WAIT, || async {
        let (code, body) = d.readyz()?;
        (code == 503
            && body.contains("remote lapse: not ready")
            && body.contains("remote east: synced"))
        .then_some(())
        .ok_or(format!("{code} {body}"))
    })
    .await;
    east.create(&pp, &exported("fresh", 80)).await.unwrap();
    east.patch(
        "both",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"ports": [{"name": "http", "port": 80}, {"name": "admin", "port": 9000}]}})),
    )
    .await
    .unwrap();
    eventually(
        "east's new leader mirrored while lapse is down",
        WAIT,
        || present(&west, "fresh"),
    )
    .await;
    let converged = down.elapsed();
    eventually(
        "east's port change on the merged follower",
        WAIT,
        || async {
            let b = present(&west, "both").await?;
            let ports = port_names(&b);
            ports
                .iter()
                .any(|(n, p)| n == "admin" && *p == 9000)
                .then_some(())
                .ok_or(format!("{ports:?}"))
        },
    )
    .await;
    // sweeps go on for east; lapse's abort and delete nothing
    let done_now = d.metric("xcc_sweeps_total", &east_done);
    d.wait_metric("xcc_sweeps_total", &aborted, aborted_before + 2.0)
        .await;
    d.wait_metric("xcc_sweeps_total", &east_done, done_now + 2.0)
        .await;
    present(&west, "only-lapse")
        .await
        .expect("lapse's own follower kept");
    assert_eq!(
        sources(&west_sl, "both").await.unwrap(),
        both_sources,
        "lapse's slice of the merged follower kept"
    );
    assert!(
        d.logs()
            .contains("sweep: listing failed; this remote deletes nothing this time"),
        "{}",
        d.logs()
    );
    let after = snapshot(&lc, &[&ns.name]).await;

    tokio::task::spawn_blocking(|| bed_cmd(&["start", LAPSE]))
        .await
        .unwrap();
    eventually("/readyz 200 once lapse is back", WAIT, || async {
        let (code, body) = d.readyz()?;
        (code == 200).then_some(()).ok_or(format!("{code} {body}"))
    })
    .await;
    conclude(
        Report {
            id: "42-remote-down-others-converge",
            scenario: "One of two remotes down (API server killed) while the other keeps converging",
            done: "east and lapse both export `both` (merged follower), lapse also `only-lapse`; lapse's kube-apiserver SIGKILLed; east then adds a leader and changes a port; lapse started again",
            converge: Some(converged),
            note: "converged in: from lapse's API server killed to east's new leader mirrored (the merged follower took east's port change too); /readyz 503 naming lapse only; lapse's sweeps aborted (2 or more) while east's went on (2 or more done); lapse's follower and its slice of the merged follower kept; /readyz 200 once lapse was back".into(),
        },
        &Lost::since(&before, &after, &names(&["both", "only-lapse"])),
        &before.non_followers_touched(&after),
    );
}
