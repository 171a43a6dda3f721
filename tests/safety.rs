//! End to end: the safety invariants under an unreachable remote, two replicas, and bad input.
mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, run_to_exit, with_flag};
use support::fault::{Report, conclude_since, snapshot};
use support::metrics::WRITE_KINDS;
use support::{
    KEY, LOCAL, REMOTE, bed, bed_cmd, client, eventually, exported, namespace, obj, present,
};

const WAIT: Duration = Duration::from_secs(30);

/// The remote of this test is a cluster of its own (`north`), so stopping it disturbs no
/// other test.
#[tokio::test]
async fn an_unreachable_remote_deletes_nothing_and_recovery_converges() {
    const NORTH: &str = "north";
    tokio::task::spawn_blocking(|| bed_cmd(&["up", NORTH]))
        .await
        .unwrap();
    let ns = namespace("safety-remote-down").await;
    let north_ns: Api<Namespace> = Api::all(client(NORTH).await);
    let _ = north_ns
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": ns.name}})),
        )
        .await;
    let remote: Api<Service> = Api::namespaced(client(NORTH).await, &ns.name);
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    for n in ["a", "b", "c"] {
        remote
            .create(&PostParams::default(), &exported(n, 80))
            .await
            .unwrap();
    }

    let mut args = with_flag(args_for(&ns.name), "--remote-context", NORTH);
    args.extend(
        [
            "--sweep-schedule",
            "*/1 * * * * *",
            "--sweep-list-timeout-seconds",
            "2",
        ]
        .map(String::from),
    );
    let mut d = Daemon::start(&args).await;
    d.wait_synced(&[NORTH]).await;
    for n in ["a", "b", "c"] {
        eventually("followers", WAIT, || present(&local, n)).await;
    }
    let local_client = client(LOCAL).await;
    let before = snapshot(&local_client, &[&ns.name]).await;

    // the remote API server dies (etcd stays): watches fail, sweeps must abort, nothing deleted
    tokio::task::spawn_blocking(|| bed_cmd(&["kill", NORTH, "apiserver"]))
        .await
        .unwrap();
    eventually("three aborted sweeps", WAIT, || async {
        let n = d.metric(
            "xcc_sweeps_total",
            &[("remote", NORTH), ("outcome", "aborted")],
        );
        if n >= 3.0 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    })
    .await;
    // and a daemon started while the remote is down never gets a complete listing
    d.kill();
    let d2 = Daemon::start(&args).await;
    eventually("a sweep aborted by the fresh daemon", WAIT, || async {
        let n = d2.metric(
            "xcc_sweeps_total",
            &[("remote", NORTH), ("outcome", "aborted")],
        );
        if n >= 2.0 { Ok(()) } else { Err(d2.logs()) }
    })
    .await;
    let (code, body) = d2.readyz().unwrap();
    assert_eq!(
        code, 503,
        "not ready while the remote has never been listed: {body}"
    );
    assert!(body.contains("remote north: not ready"), "{body}");
    for n in ["a", "b", "c"] {
        present(&local, n)
            .await
            .expect("no follower is deleted while the remote is unreachable");
    }
    assert_eq!(d2.writes(&WRITE_KINDS, &["delete"]), 0.0);
    assert!(
        d2.logs()
            .contains("sweep: listing failed; this remote deletes nothing this time"),
        "{}",
        d2.logs()
    );

    // back: a real deletion made while it was down is now proven by a complete listing
    tokio::task::spawn_blocking(|| bed_cmd(&["start", NORTH]))
        .await
        .unwrap();
    let back = Instant::now();
    remote.delete("b", &DeleteParams::default()).await.unwrap();
    eventually("the follower of the deleted leader to go", WAIT, || async {
        match local.get_opt("b").await.map_err(|e| e.to_string())? {
            None => Ok(()),
            Some(_) => Err("still there".into()),
        }
    })
    .await;
    present(&local, "a").await.unwrap();
    present(&local, "c").await.unwrap();
    eventually("ready again", WAIT, || async {
        let (code, body) = d2.readyz()?;
        let up = d2.gauge("xcc_remote_up", &[("remote", NORTH)]);
        if code == 200 && up == Some(1.0) {
            Ok(())
        } else {
            Err(format!("{code} {body} up={up:?}"))
        }
    })
    .await;
    let took = back.elapsed();
    let after = snapshot(&local_client, &[&ns.name]).await;
    let alive = ["a", "c"].iter().map(|s| s.to_string()).collect();
    conclude_since(
Report {
        id: "13-remote-killed",
        scenario: "Remote API server process killed (SIGKILL), in steady state and while a fresh daemon starts, then restarted",
        done: "testbed/bed kill north apiserver; 3+ sweeps (every 1 s) aborted; the daemon restarted while it was down; a leader deleted once it was back",
        converge: Some(took),
        note: "0 deletes while down; /readyz 503 with the reason, then 200; the deletion applied after a complete listing".into(),
},
&before, &after, &alive);
    let _ = north_ns.delete(&ns.name, &DeleteParams::background()).await;
}

fn is_leader(d: &Daemon) -> bool {
    d.gauge("xcc_leader", &[]) == Some(1.0)
}

#[tokio::test]
async fn two_replicas_one_leader_and_a_takeover_when_it_dies() {
    let ns = namespace("safety-replicas").await;
    let remote: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let mut args = args_for(&ns.name);
    args.extend(["--identity".to_string(), "replica-1".to_string()]);
    let mut one = Daemon::start(&args).await;
    one.wait_synced(&[REMOTE]).await;
    let n = args.len();
    args[n - 1] = "replica-2".to_string();
    let mut two = Daemon::start(&args).await;
    eventually("replica 2 to serve metrics", WAIT, || async {
        if two.gauge("xcc_leader", &[]).is_some() {
            Ok(())
        } else {
            Err("no metrics yet".to_string())
        }
    })
    .await;
    assert!(is_leader(&one) && !is_leader(&two), "exactly one leader");

    remote
        .create(&PostParams::default(), &exported("x", 80))
        .await
        .unwrap();
    eventually("the leader mirrors", WAIT, || present(&local, "x")).await;
    assert_eq!(two.writes_total(), 0.0, "the standby never writes");
    let local_client = client(LOCAL).await;
    let before = snapshot(&local_client, &[&ns.name]).await;

    // crash the leader: the standby takes over after the lease expires
    one.kill();
    let killed = Instant::now();
    let leases: Api<Lease> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually(
        "replica 2 to take over",
        Duration::from_secs(20),
        || async {
            if is_leader(&two) {
                Ok(())
            } else {
                Err(two.logs())
            }
        },
    )
    .await;
    let takeover = killed.elapsed();
    let lease = leases.get("cross-cluster-controller").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity.as_deref(),
        Some("replica-2")
    );
    remote
        .create(&PostParams::default(), &exported("y", 80))
        .await
        .unwrap();
    eventually("the new leader mirrors", WAIT, || present(&local, "y")).await;
    let took = killed.elapsed();
    let after = snapshot(&local_client, &[&ns.name]).await;
    let alive = ["x", "y"].iter().map(|s| s.to_string()).collect();
    conclude_since(
        Report {
            id: "41-leader-takeover",
            scenario: "Leader killed (SIGKILL) with a second replica waiting",
            done: "two replicas, 6 s Lease; the leader SIGKILLed; a new leader created remotely after the takeover",
            converge: Some(took),
            note: format!(
                "takeover after {:.1} s (Lease 6 s); the standby wrote nothing while the other held the Lease",
                takeover.as_secs_f64()
            ),
        },
        &before,
        &after,
        &alive,
    );

    // a clean stop releases the lease at once, and exits 0
    assert_eq!(two.terminate().await, Some(0));
    let lease = leases.get("cross-cluster-controller").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity,
        None,
        "released on SIGTERM"
    );
}

#[tokio::test]
async fn bad_input_stops_the_daemon_at_start_with_one_readable_line() {
    let bed = bed().await;
    let kc = bed.kubeconfig.to_string_lossy().to_string();
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, "clusters: [this is: not yaml").unwrap();
    let broken = broken.to_string_lossy().to_string();
    let kenv = [("KUBECONFIG", kc.as_str())];
    let long_key = "k".repeat(49);
    let local_client = client(LOCAL).await;
    let before = snapshot(&local_client, &["default"]).await;
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--workers", "0"], "--workers"),
        (vec!["--endpoints-mode", "sideways"], "--endpoints-mode"),
        (vec!["--sweep-schedule", "sometimes"], "--sweep-schedule"),
        (vec!["--label-key", "not a key"], "--label-key"),
        (vec!["--label-key", &long_key], "at most 48"),
        (
            vec!["--devmode", "--remote-secret-selector", ""],
            "no remote",
        ),
        (
            vec![
                "--devmode",
                "--local-context",
                LOCAL,
                "--kubeconfig",
                &broken,
            ],
            "remote kubeconfig",
        ),
        (
            vec![
                "--devmode",
                "--local-context",
                LOCAL,
                "--kubeconfig",
                "/nonexistent/kubeconfig",
            ],
            "/nonexistent/kubeconfig",
        ),
        (
            vec![
                "--devmode",
                "--local-context",
                LOCAL,
                "--kubeconfig",
                &kc,
                "--remote-context",
                "nowhere",
            ],
            "\"nowhere\"",
        ),
        (
            vec![
                "--devmode",
                "--local-context",
                REMOTE,
                "--kubeconfig",
                &kc,
                "--remote-context",
                REMOTE,
            ],
            "same API server",
        ),
        (
            // a remote may not take the local cluster's name
            vec![
                "--devmode",
                "--local-context",
                LOCAL,
                "--kubeconfig",
                &kc,
                "--remote-context",
                REMOTE,
                "--cluster-name",
                "local",
            ],
            "is the local cluster's",
        ),
        (
            vec!["--kubeconfig", &kc, "--remote-context", REMOTE],
            "in-cluster",
        ),
    ];
    for (args, needle) in cases {
        let (code, out) = run_to_exit(&args, &kenv);
        assert_ne!(code, 0, "{args:?} must fail:\n{out}");
        let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
        let first = lines.first().copied().unwrap_or_default();
        assert!(
            out.contains(needle),
            "{args:?}: expected {needle:?} in:\n{out}"
        );
        assert!(
            first.starts_with("error"),
            "{args:?}: starts with the error:\n{out}"
        );
        if !needle.starts_with("--") {
            assert_eq!(lines.len(), 1, "{args:?}: one line, got:\n{out}");
        }
    }
    let after = snapshot(&local_client, &["default"]).await;
    conclude_since(
Report {
        id: "63-bad-flags-and-kubeconfigs",
        scenario: "Bad flags, malformed or missing kubeconfig, missing context, local = remote",
        done: "12 bad invocations: --workers 0, unknown --endpoints-mode, bad cron, invalid and too long --label-key, no remote at all (no static remote, Secret remotes off), unparsable and missing kubeconfig, unknown context, same API server twice, a remote named local, no in-cluster config",
        converge: None,
        note: "each stops at start with a non-zero exit and one line starting with `error`, naming the flag, file or context".into(),
},
&before, &after, &before.followers());
}

#[tokio::test]
async fn a_remote_object_cannot_make_us_write_outside_its_namespace() {
    let ns = namespace("safety-scope").await;
    let other = namespace("safety-scope-other").await;
    // a leader in a namespace the daemon does not watch, with a same-named local non-follower
    let remote_other: Api<Service> = Api::namespaced(client(REMOTE).await, &other.name);
    remote_other
        .create(&PostParams::default(), &exported("x", 80))
        .await
        .unwrap();
    let remote: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    remote
        .create(&PostParams::default(), &exported("x", 80))
        .await
        .unwrap();
    let local_other: Api<Service> = Api::namespaced(client(LOCAL).await, &other.name);
    local_other
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "x"}, "spec": {"ports": [{"port": 7}]}})),
        )
        .await
        .unwrap();
    let local_client = client(LOCAL).await;
    let before = snapshot(&local_client, &[&ns.name, &other.name]).await;
    let d = Daemon::start(&args_for(&ns.name)).await;
    d.wait_synced(&[REMOTE]).await;
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("the follower in the watched namespace", WAIT, || {
        present(&local, "x")
    })
    .await;
    let f = local.get("x").await.unwrap();
    assert_eq!(f.namespace().as_deref(), Some(ns.name.as_str()));
    // a sweep and a full pass later, the other namespace is exactly as it was
    let after = snapshot(&local_client, &[&ns.name, &other.name]).await;
    let alive = ["x".to_string()].into_iter().collect();
    conclude_since(
Report {
        id: "73-security-scope",
        scenario: "A remote leader cannot make us write outside its namespace or touch a non-follower",
        done: "leaders named x in a watched and an unwatched namespace; a plain local Service x in the unwatched one",
        converge: None,
        note: "the follower is written only in the leader's own, watched namespace; the plain Service is unchanged".into(),
},
&before, &after, &alive);
    assert_eq!(
        local_other.get("x").await.unwrap().labels().get(KEY),
        None,
        "the local non-follower stays a non-follower"
    );
}

#[tokio::test]
async fn a_read_only_remote_token_works_and_never_appears_in_logs_at_any_level() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::RoleBinding;

    let ns = namespace("safety-token").await;
    let admin = client(REMOTE).await;
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), &ns.name);
    sas.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "reader"}})),
    )
    .await
    .unwrap();
    // exactly what the remote identity needs: read Services and EndpointSlices
    let roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(admin.clone(), &ns.name);
    roles
        .create(
            &PostParams::default(),
            &obj(json!({"metadata": {"name": "mirror-reader"}, "rules": [
                {"apiGroups": [""], "resources": ["services"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]})),
        )
        .await
        .unwrap();
    let rbs: Api<RoleBinding> = Api::namespaced(admin.clone(), &ns.name);
    rbs.create(
        &PostParams::default(),
        &obj(json!({"metadata": {"name": "reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "mirror-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns.name}]})),
    )
    .await
    .unwrap();
    let token = support::mint_token(REMOTE, &ns.name, "reader").await;

    // a kubeconfig holding only that token for the remote
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("remote.kubeconfig");
    support::token_kubeconfig(REMOTE, "east-reader", &token, &path).await;

    let remote: Api<Service> = Api::namespaced(admin, &ns.name);
    remote
        .create(&PostParams::default(), &exported("secretive", 80))
        .await
        .unwrap();
    let args: Vec<String> = [
        "--devmode",
        "--local-context",
        LOCAL,
        "--namespace",
        &ns.name,
        "--watch-namespace",
        &ns.name,
        "--cluster-name",
        "east",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut args = args;
    args.extend([
        "--kubeconfig".to_string(),
        path.to_string_lossy().to_string(),
    ]);
    let d = Daemon::start_with_env(&args, &[("RUST_LOG", "trace")]).await;
    let local: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    eventually("mirroring with the read-only token", WAIT, || {
        present(&local, "secretive")
    })
    .await;
    d.wait_synced(&[REMOTE]).await;
    let logs = d.logs();
    assert!(logs.lines().count() > 50, "trace logging is on");
    assert!(!logs.contains(&token), "the token appears in the logs");
    let (_, tail) = token.split_at(token.len() - 24);
    assert!(
        !logs.contains(tail),
        "part of the token appears in the logs"
    );
}

/// The writer's own guarantees, against the real API server: a delete carries the uid it was
/// decided on, an update the resourceVersion it was computed from, and nothing is written
/// without the Lease.
#[tokio::test]
async fn the_writer_never_deletes_or_overwrites_a_replaced_object_and_needs_the_lease() {
    use cross_cluster_controller::reconcile::writer::Writer;
    use cross_cluster_controller::runtime::metrics::Metrics;
    use kube::ResourceExt;
    use std::sync::Arc;

    let ns = namespace("safety-writer").await;
    let local = client(LOCAL).await;
    let api: Api<Service> = Api::namespaced(local.clone(), &ns.name);
    let until = std::time::Instant::now() + std::time::Duration::from_secs(3600);
    let (leader_tx, leader_rx) = tokio::sync::watch::channel(Some(until));
    let leader = cross_cluster_controller::runtime::lease::Leadership::from_receiver(leader_rx);
    let writer = Writer::new(local, leader, false, Arc::new(Metrics::default()));

    let svc = |port: i32| -> Service {
        obj(
            json!({"metadata": {"name": "x", "labels": {"fair.com/cross-cluster": "follower"}}, "spec": {"ports": [{"port": port}]}}),
        )
    };
    let first = api.create(&PostParams::default(), &svc(80)).await.unwrap();
    // someone replaces it meanwhile (same name, new object)
    api.delete("x", &DeleteParams::default()).await.unwrap();
    let second = api.create(&PostParams::default(), &svc(81)).await.unwrap();

    let err = writer
        .delete::<Service>(&ns.name, "x", &first.uid().unwrap(), "test")
        .await
        .expect_err("the uid precondition refuses");
    assert_eq!(err.api_code(), Some(409), "{err}");
    assert_eq!(
        api.get("x").await.unwrap().uid(),
        second.uid(),
        "the replacement survives"
    );

    let mut stale = first.clone();
    stale.metadata.uid = second.metadata.uid.clone();
    let err = writer
        .replace(&stale)
        .await
        .err()
        .expect("a stale resourceVersion is refused");
    assert_eq!(err.api_code(), Some(409), "{err}");
    let ports = api.get("x").await.unwrap().spec.unwrap().ports.unwrap();
    assert_eq!(ports[0].port, 81, "not overwritten");

    leader_tx.send_replace(None);
    let err = writer
        .create(&svc(82))
        .await
        .err()
        .expect("no lease, no write");
    assert!(
        matches!(err, cross_cluster_controller::Error::NotLeader),
        "{err}"
    );
    let err = writer
        .delete::<Service>(&ns.name, "x", &second.uid().unwrap(), "test")
        .await
        .expect_err("no lease");
    assert!(matches!(err, cross_cluster_controller::Error::NotLeader));
    assert!(api.get_opt("x").await.unwrap().is_some());
}

#[tokio::test]
async fn a_missing_lease_namespace_is_named_once_and_nothing_is_written() {
    let ns = namespace("safety-no-lease-ns").await;
    let missing = format!("{}-missing", ns.name);
    let d = Daemon::start(&with_flag(args_for(&ns.name), "--namespace", &missing)).await;
    let hint = format!("the Lease namespace \"{missing}\" does not exist");
    eventually("the one-line hint", WAIT, || async {
        let logs = d.logs();
        if logs.contains(&hint) {
            Ok(logs)
        } else {
            Err(logs)
        }
    })
    .await;
    // a few more lease rounds: the hint is not repeated, and nobody leads or writes
    eventually("more lease rounds", WAIT, || async {
        let rounds = d.logs().matches("lease round failed").count();
        if rounds >= 2 {
            Ok(())
        } else {
            Err(format!("{rounds}"))
        }
    })
    .await;
    assert_eq!(d.logs().matches(&hint).count(), 1, "{}", d.logs());
    assert_eq!(d.gauge("xcc_leader", &[]), Some(0.0));
    assert_eq!(d.writes_total(), 0.0);
}
