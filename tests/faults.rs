//! The fault suite: the real daemon against real API servers while the network, the API servers
//! or the daemon itself fail. Faults between daemon and API server come from a TCP proxy
//! (support::proxy) that refuses, hangs or delays; API servers with special settings run as
//! clusters of their own (`nocache`, `throttled`) so no other test is disturbed.
//!
//! Every case ends with convergence AND the proof that nothing else changed: a snapshot of the
//! local namespace before and after (no non-follower touched, no follower lost or re-made whose
//! leader exists), recorded as one row of docs/reliability.md.
mod support;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_args, with_flag};
use support::fault::{Report, Snapshot, conclude_since, routed_kubeconfig, snapshot, upstream};
use support::metrics::{VERBS, WRITE_KINDS, series_value, sum_of};
use support::proxy::{Fault, Proxy};
use support::{
    KEY, LOCAL, REMOTE, TestNs, bed, client, eventually, exported, obj, present, remote_slice,
};

const WAIT: Duration = Duration::from_secs(60);

/// One case's world: a namespace on both sides, the remote leaders, local decoys that are not
/// ours (a plain Service, a ConfigMap, and a Service named like a remote leader).
struct Case {
    ns: TestNs,
    /// The remote's context, and so its name as the daemon records it.
    remote_name: String,
    remote: Api<Service>,
    local: Api<Service>,
    local_client: Client,
    dir: tempfile::TempDir,
}

const CLASH: &str = "clash";

impl Case {
    async fn new(test: &str, remote_ctx: &str, local_ctx: &str, leaders: &[&str]) -> Case {
        let ns = support::namespace_in(test, &[remote_ctx, local_ctx]).await;
        let (r, l) = (client(remote_ctx).await, client(local_ctx).await);
        let case = Case {
            remote_name: remote_ctx.to_string(),
            remote: Api::namespaced(r, &ns.name),
            local: Api::namespaced(l.clone(), &ns.name),
            local_client: l,
            ns,
            dir: tempfile::tempdir().expect("tempdir"),
        };
        for n in leaders.iter().chain([&CLASH]) {
            case.add_leader(n).await;
        }
        let pp = PostParams::default();
        case.local
            .create(
                &pp,
                &obj(json!({"metadata": {"name": "decoy"}, "spec": {"ports": [{"port": 1}]}})),
            )
            .await
            .expect("decoy");
        case.local
            .create(
                &pp,
                &obj(json!({"metadata": {"name": CLASH}, "spec": {"ports": [{"port": 2}]}})),
            )
            .await
            .expect("clash");
        Api::<ConfigMap>::namespaced(case.local_client.clone(), &case.ns.name)
            .create(
                &pp,
                &obj(json!({"metadata": {"name": "keep"}, "data": {"a": "b"}})),
            )
            .await
            .expect("configmap");
        case
    }

    /// Waits for the daemon's first sync and convergence; the snapshot every case compares with.
    async fn settled(&self, d: &Daemon) -> Snapshot {
        d.wait_synced(&[&self.remote_name]).await;
        eventually("first convergence", WAIT, || self.converged()).await;
        self.snapshot().await
    }

    async fn add_leader(&self, name: &str) {
        self.remote
            .create(&PostParams::default(), &exported(name, 80))
            .await
            .expect("create leader");
    }

    async fn delete_leader(&self, name: &str) {
        self.remote
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete leader");
    }

    async fn set_port(&self, name: &str, port: i32) {
        let p = json!({"spec": {"ports": [{"name": "http", "port": port}]}});
        self.remote
            .patch(name, &PatchParams::default(), &Patch::Merge(p))
            .await
            .expect("change leader port");
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn snapshot(&self) -> Snapshot {
        snapshot(&self.local_client, &[&self.ns.name]).await
    }

    /// Names of the remote leaders now (the clash excluded: it is never mirrored).
    async fn leaders(&self) -> BTreeSet<String> {
        self.remote
            .list_metadata(&ListParams::default().labels(&format!("{KEY}=true")))
            .await
            .expect("list leaders")
            .items
            .into_iter()
            .filter_map(|m| m.metadata.name)
            .filter(|n| n != CLASH)
            .collect()
    }

    /// Ok when the local followers are exactly the remote leaders, ports included.
    async fn converged(&self) -> Result<(), String> {
        let sel = ListParams::default().labels(&format!("{KEY}=true"));
        let remote = self.remote.list(&sel).await.map_err(|e| e.to_string())?;
        let local = self
            .local
            .list(&ListParams::default().labels(&format!("{KEY}=follower")))
            .await
            .map_err(|e| e.to_string())?;
        let ports = |s: &Service| -> Vec<i32> {
            s.spec
                .as_ref()
                .and_then(|s| s.ports.as_ref())
                .map(|p| p.iter().map(|p| p.port).collect())
                .unwrap_or_default()
        };
        let want: BTreeSet<(String, Vec<i32>)> = remote
            .items
            .iter()
            .filter(|s| s.name_any() != CLASH)
            .map(|s| (s.name_any(), ports(s)))
            .collect();
        let have: BTreeSet<(String, Vec<i32>)> = local
            .items
            .iter()
            .map(|s| (s.name_any(), ports(s)))
            .collect();
        if want == have {
            Ok(())
        } else {
            Err(format!("want {want:?}\nhave {have:?}"))
        }
    }

    /// The series `xcc_sweeps_total` of this case's remote with `outcome`.
    fn sweeps<'a>(&'a self, outcome: &'a str) -> [(&'a str, &'a str); 2] {
        [("remote", &self.remote_name), ("outcome", outcome)]
    }

    /// Records the case's row and asserts nothing else changed since `before`.
    async fn finish(&self, before: &Snapshot, report: Report<'_>) {
        let after = self.snapshot().await;
        conclude_since(report, before, &after, &self.leaders().await);
    }
}

async fn wait_ready(d: &Daemon) {
    eventually("/readyz 200", WAIT, || async {
        match d.readyz()? {
            (200, _) => Ok(()),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await;
}

async fn wait_not_ready(d: &Daemon, what: &str) -> String {
    eventually(what, WAIT, || async {
        match d.readyz()? {
            (503, body) => Ok(body),
            (code, body) => Err(format!("{code} {body}")),
        }
    })
    .await
}

/// While the remote is out: `n` more sweeps abort, the `kept` followers stay, and no delete is
/// sent.
async fn deletes_nothing(d: &Daemon, case: &Case, n: f64, kept: &[&str]) {
    let aborted = d.metric("xcc_sweeps_total", &case.sweeps("aborted"));
    d.wait_metric("xcc_sweeps_total", &case.sweeps("aborted"), aborted + n)
        .await;
    for name in kept {
        present(&case.local, name)
            .await
            .expect("nothing deleted while the remote is unreachable");
    }
    assert_eq!(d.writes(&WRITE_KINDS, &["delete"]), 0.0);
}

/// Time until convergence and a ready /readyz again.
async fn recovered(case: &Case, d: &Daemon) -> Duration {
    let took = converge(case).await;
    wait_ready(d).await;
    took
}

async fn converge(case: &Case) -> Duration {
    let t0 = Instant::now();
    eventually("convergence", WAIT, || case.converged()).await;
    t0.elapsed()
}

/// Sweeps every second (so an outage outlasts several sweep intervals), listings time out fast.
const FAST: [&str; 6] = [
    "--sweep-schedule",
    "*/1 * * * * *",
    "--sweep-list-timeout-seconds",
    "2",
    "--api-timeout-seconds",
    "3",
];

/// Starts a daemon whose remote is reached through `proxy`.
async fn through_remote_proxy(case: &Case, proxy: &Proxy, extra: &[&str]) -> Daemon {
    let kc = case.path("remote-proxied");
    routed_kubeconfig(&[(REMOTE, proxy.url())], &kc).await;
    let args = with_args(
        args_for(&case.ns.name),
        &[&["--kubeconfig", kc.to_str().expect("path")], extra].concat(),
    );
    Daemon::start(&args).await
}

#[tokio::test]
async fn remote_refused_in_steady_state_for_several_sweeps_and_at_start_deletes_nothing() {
    let case = Case::new("fault-refused", REMOTE, LOCAL, &["a", "b", "c", "d"]).await;
    let proxy = Proxy::start(&upstream(REMOTE).await).await;
    let mut d = through_remote_proxy(&case, &proxy, &FAST).await;
    let before = case.settled(&d).await;

    // steady state: the remote stops answering (connection refused) for several sweep intervals
    proxy.set(Fault::Refuse);
    let aborted = d.metric("xcc_sweeps_total", &case.sweeps("aborted"));
    case.delete_leader("b").await;
    case.add_leader("e").await;
    case.set_port("c", 81).await;
    deletes_nothing(&d, &case, 3.0, &["a", "b", "c", "d"]).await;
    let body = wait_not_ready(&d, "/readyz 503 while the remote refuses").await;
    assert!(body.contains("not ready"), "{body}");
    proxy.set(Fault::Pass);
    let took = recovered(&case, &d).await;
    case.finish(&before, Report {
        id: "10-remote-refused-steady",
        scenario: "Remote API server unreachable (connection refused) in steady state, longer than a sweep interval",
        done: "proxy refused and cut every connection for 3+ sweep intervals (sweep every 1 s); meanwhile a leader was deleted, one created, one changed",
        converge: Some(took),
        note: format!("{} sweeps aborted, 0 deletes during the outage; /readyz 503 then 200", d.metric("xcc_sweeps_total", &case.sweeps("aborted")) - aborted),
    })
    .await;

    // a fresh daemon starting while the remote refuses: never a complete listing, never a delete
    d.kill();
    proxy.set(Fault::Refuse);
    case.delete_leader("d").await;
    case.add_leader("f").await;
    let before = case.snapshot().await;
    let d2 = through_remote_proxy(&case, &proxy, &FAST).await;
    d2.wait_metric("xcc_sweeps_total", &case.sweeps("aborted"), 2.0)
        .await;
    wait_not_ready(&d2, "/readyz 503 before the first listing").await;
    present(&case.local, "d")
        .await
        .expect("an unconfirmed deletion deletes nothing");
    assert_eq!(
        d2.follower_writes(&VERBS),
        0.0,
        "no write before the remote is listed"
    );
    proxy.set(Fault::Pass);
    let took = recovered(&case, &d2).await;
    case.finish(&before, Report {
        id: "11-remote-refused-initial-sync",
        scenario: "Remote API server unreachable while the daemon starts (initial sync)",
        done: "daemon started with the remote refusing; a leader deleted and one created meanwhile; then the remote came back",
        converge: Some(took),
        note: "0 writes until the first complete listing; the deletion applied only after it".into(),
    })
    .await;
}

#[tokio::test]
async fn a_hanging_remote_is_detected_shown_on_readyz_and_deletes_nothing() {
    let case = Case::new("fault-hang", REMOTE, LOCAL, &["a", "b", "c"]).await;
    let proxy = Proxy::start(&upstream(REMOTE).await).await;
    let d = through_remote_proxy(&case, &proxy, &FAST).await;
    d.wait_synced(&[REMOTE]).await;
    eventually("first convergence", WAIT, || case.converged()).await;
    wait_ready(&d).await;
    let before = case.snapshot().await;

    // the link goes silent: connections stay open, no byte moves, nothing is refused
    proxy.set(Fault::Hang);
    let t0 = Instant::now();
    let body = wait_not_ready(&d, "/readyz to report the stalled remote").await;
    let detected = t0.elapsed();
    assert!(body.contains("remote east"), "{body}");
    case.delete_leader("b").await;
    deletes_nothing(&d, &case, 2.0, &["b"]).await;

    proxy.set(Fault::Pass);
    let took = recovered(&case, &d).await;
    case.finish(&before, Report {
        id: "12-remote-hanging",
        scenario: "Remote connection hanging (not refused): watches stall silently",
        done: "proxy held every byte both ways and accepted new connections without answering; --api-timeout-seconds 3",
        converge: Some(took),
        note: format!("stall shown on /readyz after {:.1} s (bound: about 2 x the API timeout + 5 s); sweeps aborted, 0 deletes", detected.as_secs_f64()),
    })
    .await;
}

/// The etcd of one bed cluster, compacted at its current revision (physical), as an API server
/// does every few minutes; returns the revision.
fn compact(cluster: &str, bed_dir: &std::path::Path) -> i64 {
    let ports = std::fs::read_to_string(bed_dir.join(cluster).join("ports")).expect("bed ports");
    let port = ports
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("etcd_client="))
        .expect("etcd port");
    let curl = |path: &str, body: &str| -> serde_json::Value {
        let out = std::process::Command::new("curl")
            .args([
                "-sf",
                "-X",
                "POST",
                &format!("http://127.0.0.1:{port}{path}"),
                "-d",
                body,
            ])
            .output()
            .expect("curl");
        assert!(out.status.success(), "etcd {path}: {out:?}");
        serde_json::from_slice(&out.stdout).expect("etcd answer")
    };
    let rev: i64 = curl("/v3/kv/range", r#"{"key":"Lw=="}"#)["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .expect("revision");
    curl(
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    );
    rev
}

#[tokio::test]
async fn watch_expiry_410_after_compaction_relists_without_duplicate_or_missed_writes() {
    // a remote without the watch cache, so a resumed watch reads etcd and meets the compaction
    const NOCACHE: &str = "nocache";
    support::extra_cluster(NOCACHE, "--watch-cache=false").await;
    let case = Case::new("fault-410", NOCACHE, LOCAL, &["a", "b"]).await;
    let args = with_args(
        with_flag(args_for(&case.ns.name), "--remote-context", NOCACHE),
        &FAST,
    );
    let d = Daemon::start(&args).await;
    let before = case.settled(&d).await;
    let service_writes = || d.writes(&["Service"], &VERBS);
    let writes0 = service_writes();

    // labelled changes the watch sees; then unlabelled churn moves etcd on and etcd is compacted,
    // so the quiet leader watch's next resume (every 3 s) asks for a compacted revision: 410 Gone
    case.add_leader("c").await;
    case.set_port("a", 81).await;
    eventually("the labelled changes to land", WAIT, || case.converged()).await;
    let churn: Api<ConfigMap> = Api::namespaced(client(NOCACHE).await, &case.ns.name);
    for i in 0..20 {
        churn
            .create(
                &PostParams::default(),
                &obj(json!({"metadata": {"name": format!("churn-{i}")}})),
            )
            .await
            .unwrap();
    }
    let bed_dir = bed().await.dir.clone();
    let rev = compact(NOCACHE, &bed_dir);
    eventually("a watch to meet 410 Gone and relist", WAIT, || async {
        if d.logs().contains("watch expired (410 Gone); relisting") {
            Ok(())
        } else {
            Err(d.logs())
        }
    })
    .await;
    // after the relist: one more change, seen once; converged is timed from that change
    case.delete_leader("b").await;
    let took = converge(&case).await;
    wait_ready(&d).await;
    // exactly the writes the changes need: Service c created, a updated, b deleted (the relist
    // itself wrote nothing, nothing was written twice and nothing was missed)
    // (the counter moves just after the API answers, so wait for it)
    // (the counter moves just after the API answers: wait for the three)
    eventually("three Service writes counted", WAIT, || async {
        match service_writes() - writes0 {
            w if w >= 3.0 => Ok(()),
            w => Err(format!("{w}")),
        }
    })
    .await;
    let writes = service_writes() - writes0;
    assert_eq!(writes, 3.0, "one write per leader change:\n{}", d.logs());
    case.finish(&before, Report {
        id: "20-watch-expiry-410",
        scenario: "Watch expiry: 410 Gone after etcd compaction",
        done: &format!("etcd compacted at revision {rev} while the leader watch was quiet; its resume met 410 Gone"),
        converge: Some(took),
        note: format!("relisted without a failure; {writes} Service writes for 3 leader changes (create, update, delete): none repeated, none missed"),
    })
    .await;
}

#[tokio::test]
async fn local_api_down_then_back_queued_changes_land_and_the_leader_steps_down() {
    let case = Case::new("fault-local-down", REMOTE, LOCAL, &["a", "b", "c"]).await;
    let proxy = Proxy::start(&upstream(LOCAL).await).await;
    let kc = case.path("local-proxied");
    routed_kubeconfig(&[(LOCAL, proxy.url())], &kc).await;
    let kc_arg = kc.to_str().expect("path").to_string();
    let args = with_args(
        args_for(&case.ns.name),
        &[&["--kubeconfig", &kc_arg][..], &FAST].concat(),
    );
    let d = Daemon::start_with_env(&args, &[("KUBECONFIG", &kc_arg)]).await;
    let before = case.settled(&d).await;

    proxy.set(Fault::Refuse);
    for n in ["e", "f", "g"] {
        case.add_leader(n).await;
    }
    case.delete_leader("b").await;
    case.set_port("c", 81).await;
    // the Lease cannot be renewed: the leader stops writing before another replica could start
    eventually("the leader to step down", WAIT, || async {
        match d.gauge("xcc_leader", &[]) {
            Some(0.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    proxy.set(Fault::Pass);
    let took = recovered(&case, &d).await;
    eventually("the leader to take the Lease back", WAIT, || async {
        match d.gauge("xcc_leader", &[]) {
            Some(1.0) => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    case.finish(&before, Report {
        id: "30-local-down",
        scenario: "Local API server unreachable, then back, with remote changes queued",
        done: "proxy refused the local API server while 3 leaders were created, 1 deleted, 1 changed remotely",
        converge: Some(took),
        note: "the leader stepped down (Lease not renewable) and took it back; every queued change landed".into(),
    })
    .await;
}

/// Writes of Services and EndpointSlices the API server refused with 429, from its own
/// apiserver_request_total (read label by label, not by substring). Its 429 series appear only
/// at the first refusal, so none yet reads 0 here; the case asserts more than 0.
async fn refused_429(c: &Client) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = c.request_text(req).await.expect("API server metrics");
    assert!(
        text.contains("# TYPE apiserver_request_total counter"),
        "not an API server's metrics page:\n{text}"
    );
    let label = |s: &support::metrics::Sample, k: &str| {
        s.labels
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    support::metrics::samples(&text)
        .unwrap_or_else(|e| panic!("{e}"))
        .iter()
        .filter(|s| s.name == "apiserver_request_total")
        .filter(|s| label(s, "code").as_deref() == Some("429"))
        .filter(|s| {
            matches!(
                label(s, "resource").as_deref(),
                Some("services" | "endpointslices")
            )
        })
        .map(|s| s.value)
        .sum()
}

/// Eight writers updating ConfigMaps of `ns` in a tight loop until `stop`, through a client
/// that does not retry (a 429 it meets must not pause it).
async fn background_writes(
    kubeconfig: &str,
    context: &str,
    ns: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("read kubeconfig");
    let opts = kube::config::KubeConfigOptions {
        context: Some(context.into()),
        ..Default::default()
    };
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &opts)
        .await
        .expect("kubeconfig");
    cfg.default_retry = false;
    let api: Api<ConfigMap> = Api::namespaced(Client::try_from(cfg).expect("client"), ns);
    (0..8)
        .map(|w| {
            let (api, stop) = (api.clone(), stop.clone());
            tokio::spawn(async move {
                let name = format!("load-{w}");
                let pp = PatchParams::apply("load");
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                                    "metadata": {"name": name}, "data": {"i": i.to_string()}});
                    let _ = api.patch(&name, &pp, &Patch::Apply(cm)).await;
                }
            })
        })
        .collect()
}

#[tokio::test]
async fn local_throttling_429_backs_off_and_converges() {
    // a local API server that takes one write at a time and answers 429 beyond
    const THROTTLED: &str = "throttled";
    support::extra_cluster(
        THROTTLED,
        "--enable-priority-and-fairness=false --max-mutating-requests-inflight=1",
    )
    .await;
    let names: Vec<String> = (0..300).map(|i| format!("s{i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let case = Case::new("fault-429", REMOTE, THROTTLED, &refs).await;
    // system:masters is exempt from the in-flight limit: the daemon writes as a ServiceAccount
    let tc = client(THROTTLED).await;
    let pp = PostParams::default();
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(tc.clone(), &case.ns.name)
        .create(&pp, &obj(json!({"metadata": {"name": "writer"}})))
        .await
        .unwrap();
    let binding = format!("{}-writer", case.ns.name);
    Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(tc.clone())
        .create(&pp, &obj(json!({"metadata": {"name": binding},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "ServiceAccount", "name": "writer", "namespace": case.ns.name}]})))
        .await
        .unwrap();
    let token = support::mint_token(THROTTLED, &case.ns.name, "writer").await;
    let local_kc = case.path("local-token");
    support::token_kubeconfig(THROTTLED, "throttled-writer", &token, &local_kc).await;
    let local_kc = local_kc.to_str().expect("path").to_string();
    let before = case.snapshot().await;
    let args = with_args(
        with_flag(
            args_for(&case.ns.name),
            "--local-context",
            "throttled-writer",
        ),
        &["--workers", "32"],
    );
    let refused0 = refused_429(&tc).await;
    // Other clients' writes (ConfigMaps, as the same non-exempt identity, without client-side
    // retries) keep the one mutating slot busy until the daemon has been refused: whether the
    // daemon's own 32 workers overlap on the server depends on the machine's speed, and a case
    // that may not throttle proves nothing.
    let stop = stop_flag();
    let load = background_writes(&local_kc, "throttled-writer", &case.ns.name, &stop).await;
    let t0 = Instant::now();
    let _daemon = Daemon::start_with_env(&args, &[("KUBECONFIG", &local_kc)]).await;
    let throttled = eventually("the daemon's first 429", WAIT, || async {
        let n = refused_429(&tc).await - refused0;
        if n > 0.0 {
            Ok(n)
        } else {
            Err("no Service or EndpointSlice write refused yet".into())
        }
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    // a throttled write is retried after the server's Retry-After and then with back-off, so
    // convergence under throttling gets a longer deadline than the other cases
    eventually("convergence under throttling", 3 * WAIT, || {
        case.converged()
    })
    .await;
    let took = t0.elapsed();
    let throttled = throttled.max(refused_429(&tc).await - refused0);
    case.finish(&before, Report {
        id: "31-local-throttled",
        scenario: "Local throttling: 429 Too Many Requests",
        done: "local API server with --max-mutating-requests-inflight=1 (no priority and fairness), kept busy by other clients' writes until the daemon was refused; 300 leaders mirrored by 32 workers",
        converge: Some(took),
        note: format!("{throttled} writes refused with 429 (the API server's own count), each retried by the client (at most 6 times, honouring Retry-After), then by the daemon's per-key back-off"),
    })
    .await;
    let _ = Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(tc)
        .delete(&binding, &DeleteParams::default())
        .await;
}

#[tokio::test]
async fn write_conflicts_409_from_a_concurrent_editor_are_retried() {
    let case = Case::new("fault-409", REMOTE, LOCAL, &["a"]).await;
    let d = Daemon::start(&with_args(args_for(&case.ns.name), &["--workers", "4"])).await;
    let before = case.settled(&d).await;

    // someone else keeps editing our follower while the remote keeps changing
    let stop = stop_flag();
    let editor = {
        let (local, stop) = (case.local.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let p =
                    json!({"metadata": {"annotations": {"editor.example/tick": i.to_string()}}});
                let _ = local
                    .patch("a", &PatchParams::default(), &Patch::Merge(p))
                    .await;
            }
        })
    };
    let conflicts = || {
        d.logs()
            .lines()
            .filter(|l| l.contains("reconcile failed") && l.contains("conflict"))
            .count()
    };
    // a fixed number of remote changes while the editor runs (more if none met a 409 yet); each
    // one timed from the change until the follower matched again
    const ROUNDS: i32 = 10;
    let mut port = 80;
    let mut slowest = Duration::ZERO;
    let t_end = Instant::now() + WAIT;
    while (port - 80 < ROUNDS || conflicts() == 0) && Instant::now() < t_end {
        port += 1;
        case.set_port("a", port).await;
        slowest = slowest.max(converge(&case).await);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    editor.await.unwrap();
    let rounds = port - 80;
    let seen = conflicts();
    assert!(seen > 0, "no 409 in {rounds} rounds:\n{}", d.logs());
    case.finish(&before, Report {
        id: "32-local-conflicts",
        scenario: "Write conflicts: 409 from a concurrent editor",
        done: &format!("another client patched our follower in a tight loop while the remote port changed {rounds} times"),
        converge: Some(slowest),
        note: format!("converged in: the slowest of the {rounds} changes; {seen} updates refused with 409 (stale resourceVersion) over the {rounds} changes, each retried; every change landed"),
    })
    .await;
}

fn stop_flag() -> std::sync::Arc<std::sync::atomic::AtomicBool> {
    std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false))
}

/// How many followers the namespace holds; a failed list is an error, never 0.
async fn count_followers(api: &Api<Service>) -> Result<usize, String> {
    api.list_metadata(&ListParams::default().labels(&format!("{KEY}=follower")))
        .await
        .map(|l| l.items.len())
        .map_err(|e| format!("list followers: {e}"))
}

async fn create_many<K>(api: &Api<K>, objs: Vec<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    use futures::{StreamExt, TryStreamExt, stream};
    stream::iter(objs)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .expect("create objects");
}

#[tokio::test]
async fn sigkill_mid_initial_sync_then_restart_converges_without_rewrites() {
    const N: usize = 2000;
    let case = Case::new("fault-sigkill-sync", REMOTE, LOCAL, &[]).await;
    create_many(
        &case.remote,
        (0..N).map(|i| exported(&format!("s{i}"), 80)).collect(),
    )
    .await;
    let before = case.snapshot().await;
    let args = with_args(args_for(&case.ns.name), &["--workers", "32"]);
    let mut d = Daemon::start(&args).await;
    eventually("the initial sync to be under way", WAIT, || async {
        let n = count_followers(&case.local).await?;
        if n >= 100 {
            Ok(())
        } else {
            Err(format!("{n}"))
        }
    })
    .await;
    d.kill();
    let at_kill = count_followers(&case.local)
        .await
        .expect("the followers at the kill");
    assert!(
        at_kill < N,
        "the sync had already finished ({at_kill}): not mid-sync"
    );

    let t0 = Instant::now();
    let d2 = Daemon::start(&args).await;
    eventually("all followers", WAIT, || async {
        let n = count_followers(&case.local).await?;
        if n == N { Ok(()) } else { Err(format!("{n}")) }
    })
    .await;
    eventually("convergence", WAIT, || case.converged()).await;
    let took = t0.elapsed();
    let creates = d2.metric(
        "xcc_writes_total",
        &[("kind", "Service"), ("verb", "create")],
    );
    let updates = d2.follower_writes(&["update"]);
    assert_eq!(
        updates, 0.0,
        "followers made before the crash are not rewritten"
    );
    assert!(
        creates <= (N - at_kill) as f64,
        "{creates} creates for {} missing",
        N - at_kill
    );
    case.finish(
        &before,
        Report {
            id: "40-sigkill-mid-sync",
            scenario: "Daemon killed (SIGKILL) mid initial sync, then restarted",
            done: &format!(
                "{N} leaders; SIGKILL once {at_kill} followers existed; a new process started"
            ),
            converge: Some(took),
            note: format!("the new process created {creates} and rewrote 0"),
        },
    )
    .await;
}

#[tokio::test]
async fn a_burst_of_5000_remote_changes_loses_none_with_bounded_memory() {
    const N: usize = 1000;
    let case = Case::new("fault-burst", REMOTE, LOCAL, &[]).await;
    let d = Daemon::start(&with_args(args_for(&case.ns.name), &["--workers", "32"])).await;
    d.wait_synced(&[REMOTE]).await;
    let before = case.snapshot().await;
    let slices: Api<EndpointSlice> = Api::namespaced(client(REMOTE).await, &case.ns.name);
    let ips = |i: usize, round: usize| -> Vec<String> {
        (0..3)
            .map(|k| format!("10.{}.{}.{}", 100 + round, i / 80, 3 * (i % 80) + k + 1))
            .collect()
    };
    let t_burst = Instant::now();
    create_many(
        &case.remote,
        (0..N).map(|i| exported(&format!("s{i}"), 80)).collect(),
    )
    .await;
    create_many(
        &slices,
        (0..N)
            .map(|i| remote_slice(&format!("s{i}"), &format!("s{i}-x1"), &ips(i, 0)))
            .collect(),
    )
    .await;
    for round in 1..=3 {
        use futures::{StreamExt, TryStreamExt, stream};
        stream::iter(0..N)
            .map(|i| {
                let slices = slices.clone();
                let eps: Vec<_> = ips(i, round)
                    .into_iter()
                    .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
                    .collect();
                async move {
                    slices
                        .patch(
                            &format!("s{i}-x1"),
                            &PatchParams::default(),
                            &Patch::Merge(json!({"endpoints": eps})),
                        )
                        .await
                }
            })
            .buffer_unordered(32)
            .try_collect::<Vec<_>>()
            .await
            .expect("update slices");
    }
    let burst = t_burst.elapsed();
    let t0 = Instant::now();
    let local_slices: Api<EndpointSlice> = Api::namespaced(client(LOCAL).await, &case.ns.name);
    eventually(
        "every follower slice to hold the last addresses",
        WAIT,
        || async {
            let list = local_slices
                .list(&ListParams::default().labels(&format!("{KEY}=follower")))
                .await
                .map_err(|e| e.to_string())?;
            let mut wrong = 0;
            let mut seen = BTreeSet::new();
            for s in &list.items {
                let svc = s
                    .labels()
                    .get("kubernetes.io/service-name")
                    .cloned()
                    .unwrap_or_default();
                let i: usize = svc
                    .trim_start_matches('s')
                    .parse()
                    .map_err(|_| svc.clone())?;
                let mut have: Vec<String> = s
                    .endpoints
                    .iter()
                    .flat_map(|e| e.addresses.clone())
                    .collect();
                have.sort();
                let mut want = ips(i, 3);
                want.sort();
                if have != want {
                    wrong += 1;
                }
                seen.insert(svc);
            }
            if seen.len() == N && wrong == 0 {
                Ok(())
            } else {
                Err(format!(
                    "{} services with slices, {wrong} stale",
                    seen.len()
                ))
            }
        },
    )
    .await;
    eventually("convergence", WAIT, || case.converged()).await;
    let took = t0.elapsed();
    let peak = d.peak_mib();
    assert!(
        peak > 0.0 && peak < 256.0,
        "peak resident memory {peak:.1} MiB"
    );
    case.finish(&before, Report {
        id: "50-burst",
        scenario: "A burst of 5,000 remote changes",
        done: &format!("{N} leaders and their slices created, then every slice changed 3 times: 5,000 changes in {:.1} s", burst.as_secs_f64()),
        converge: Some(took),
        note: format!("every follower slice ends with the last addresses; daemon peak resident memory {peak:.0} MiB (limit asserted: 256)"),
    })
    .await;
}

#[tokio::test]
async fn a_revoked_remote_token_is_a_clear_error_and_a_replaced_one_recovers() {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    let mut case = Case::new("fault-token", REMOTE, LOCAL, &["a", "b"]).await;
    // the daemon reads east through the context east-reader, and names the remote after it
    case.remote_name = "east-reader".to_string();
    let east = client(REMOTE).await;
    let pp = PostParams::default();
    let role = format!("{}-reader", case.ns.name);
    Api::<ClusterRole>::all(east.clone())
        .create(&pp, &obj(json!({"metadata": {"name": role}, "rules": [
            {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]})))
        .await
        .unwrap();
    let sas: Api<ServiceAccount> = Api::namespaced(east.clone(), &case.ns.name);
    let bindings: Api<ClusterRoleBinding> = Api::all(east.clone());
    let reader = |sa: &str| -> ClusterRoleBinding {
        obj(json!({"metadata": {"name": format!("{role}-{sa}")},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": case.ns.name}]}))
    };
    for sa in ["reader-a", "reader-b"] {
        sas.create(&pp, &obj(json!({"metadata": {"name": sa}})))
            .await
            .unwrap();
        bindings.create(&pp, &reader(sa)).await.unwrap();
    }
    // the kubeconfig names a token file, as a mounted Secret key would be: the client re-reads it
    let token_file = case.path("token");
    std::fs::write(
        &token_file,
        support::mint_token(REMOTE, &case.ns.name, "reader-a").await,
    )
    .unwrap();
    let kc = case.path("remote-token-file");
    support::token_kubeconfig(REMOTE, "east-reader", "PLACEHOLDER", &kc).await;
    let text = std::fs::read_to_string(&kc).unwrap().replace(
        "token: PLACEHOLDER",
        &format!("tokenFile: {}", token_file.display()),
    );
    std::fs::write(&kc, text).unwrap();
    let args = with_args(
        with_flag(args_for(&case.ns.name), "--remote-context", "east-reader"),
        &[&["--kubeconfig", kc.to_str().expect("path")][..], &FAST].concat(),
    );
    let d = Daemon::start(&args).await;
    let before = case.settled(&d).await;

    // revoked: the ServiceAccount behind the token is deleted, so the token no longer authenticates
    // (a watch already open keeps streaming: the refusal shows when it is renewed, within the
    // API timeout; a delete seen before that is a confirmed delete and rightly applied)
    sas.delete("reader-a", &DeleteParams::default())
        .await
        .unwrap();
    let body = wait_not_ready(&d, "/readyz to name the refused credential").await;
    assert!(
        body.contains("Unauthorized") || body.contains("401"),
        "{body}"
    );
    // /readyz turns at the first refused watch; the leader watch may still be open then, and a
    // delete it streams is a confirmed delete: wait until it too is refused
    eventually("the leader watch to be refused too", WAIT, || async {
        let logs = d.logs();
        logs.lines()
            .any(|l| l.contains("watch=remote east-reader Services ") && l.contains("Unauthorized"))
            .then_some(())
            .ok_or_else(|| "the Services watch still runs".to_string())
    })
    .await;
    case.delete_leader("b").await;
    deletes_nothing(&d, &case, 2.0, &["b"]).await;

    // replaced: a new token lands in the file; the client picks it up within its 60 s re-read
    std::fs::write(
        &token_file,
        support::mint_token(REMOTE, &case.ns.name, "reader-b").await,
    )
    .unwrap();
    let t0 = Instant::now();
    eventually(
        "recovery with the new token",
        Duration::from_secs(120),
        || async {
            match d.readyz()? {
                (200, _) => case.converged().await,
                (code, body) => Err(format!("{code} {body}")),
            }
        },
    )
    .await;
    let took = t0.elapsed();
    case.finish(&before, Report {
        id: "60-remote-token-revoked",
        scenario: "Remote token revoked, then replaced",
        done: "the remote ServiceAccount behind the daemon's token deleted (401), then a leader deleted; then a new token written to the kubeconfig's tokenFile",
        converge: Some(took),
        note: format!("/readyz 503 naming the refusal ({}), sweeps aborted, 0 deletes; recovered without a restart (the client re-reads a token file every 60 s)", if body.contains("Unauthorized") { "Unauthorized" } else { "401" }),
    })
    .await;
    let _ = Api::<ClusterRole>::all(east)
        .delete(&role, &DeleteParams::default())
        .await;
    for sa in ["reader-a", "reader-b"] {
        let _ = bindings
            .delete(&format!("{role}-{sa}"), &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
async fn a_slow_remote_link_delays_but_loses_and_deletes_nothing() {
    let case = Case::new("fault-slow", REMOTE, LOCAL, &["a", "b", "c"]).await;
    let proxy = Proxy::start(&upstream(REMOTE).await).await;
    let d = through_remote_proxy(&case, &proxy, &FAST).await;
    let before = case.settled(&d).await;

    // every chunk either way waits 300 ms: slower than a healthy link, faster than the timeouts
    proxy.set(Fault::Delay(Duration::from_millis(300)));
    let t0 = Instant::now();
    case.delete_leader("b").await;
    case.add_leader("d").await;
    case.set_port("c", 81).await;
    // /readyz is read at every poll while the changes travel: a slow link is not an outage
    let samples = std::cell::RefCell::new(Vec::new());
    eventually("convergence over the slow link", WAIT, || async {
        let (code, body) = d.readyz()?;
        samples.borrow_mut().push((code, body));
        case.converged().await
    })
    .await;
    let took = t0.elapsed();
    proxy.set(Fault::Pass);
    let samples = samples.into_inner();
    let not_ready: Vec<_> = samples.iter().filter(|(code, _)| *code != 200).collect();
    assert!(
        not_ready.is_empty(),
        "a slow link is not an outage: {not_ready:?}"
    );
    case.finish(&before, Report {
        id: "14-remote-slow",
        scenario: "Slow remote link",
        done: "proxy delayed every chunk both ways by 300 ms; a leader deleted, one created, one changed",
        converge: Some(took),
        note: format!("converged through the slow link; /readyz 200 at each of the {} reads taken while the changes travelled", samples.len()),
    })
    .await;
}

/// The remote API server's own count of successful namespace-scoped LISTs of Services or
/// EndpointSlices (the daemon watches one namespace; the API server's own repair loops and
/// kube-controller-manager list cluster-wide): one exact series.
async fn served_lists(c: &Client, resource: &str) -> f64 {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("request");
    let text = c.request_text(req).await.expect("API server metrics");
    let group = match resource {
        "services" => "",
        "endpointslices" => "discovery.k8s.io",
        other => panic!("no group known for {other}"),
    };
    series_value(
        &text,
        "apiserver_request_total",
        &[
            ("code", "200"),
            ("component", "apiserver"),
            ("dry_run", ""),
            ("group", group),
            ("resource", resource),
            ("scope", "namespace"),
            ("subresource", ""),
            ("verb", "LIST"),
            ("version", "v1"),
        ],
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

#[tokio::test]
async fn a_network_blip_resumes_the_watches_without_relisting() {
    // a remote of its own, so the API server's request counts are this daemon's alone
    const BLIP: &str = "blip";
    const N: usize = 600; // more than one listing page (500)
    support::extra_cluster(BLIP, "").await;
    let case = Case::new("fault-blip", BLIP, LOCAL, &[]).await;
    create_many(
        &case.remote,
        (0..N).map(|i| exported(&format!("s{i}"), 80)).collect(),
    )
    .await;
    let proxy = Proxy::start(&upstream(BLIP).await).await;
    let kc = case.path("blip-proxied");
    routed_kubeconfig(&[(BLIP, proxy.url())], &kc).await;
    let args = with_args(
        with_flag(args_for(&case.ns.name), "--remote-context", BLIP),
        // no cron sweep during the case: a sweep lists the remote too
        &[
            "--kubeconfig",
            kc.to_str().expect("path"),
            "--sweep-schedule",
            "0 0 0 1 1 *",
        ],
    );
    let d = Daemon::start(&args).await;
    let before = case.settled(&d).await;
    let remote = client(BLIP).await;
    // the remote's two watched kinds (both slice watches count as EndpointSlice)
    let requests = |r: &'static str| {
        let sets: Vec<Vec<(&str, &str)>> = ["Service", "EndpointSlice"]
            .iter()
            .map(|k| vec![("cluster", BLIP), ("kind", *k), ("request", r)])
            .collect();
        sum_of(&d.metrics(), "xcc_watch_requests_total", &sets).unwrap_or_else(|e| panic!("{e}"))
    };
    let (lists0, watches0) = (requests("list"), requests("watch"));
    let served0 = (
        served_lists(&remote, "services").await,
        served_lists(&remote, "endpointslices").await,
    );

    // the blip: the remote refuses (every open connection cut, new ones refused) until the
    // daemon has seen its watches fail, then answers again
    proxy.set(Fault::Refuse);
    let t0 = Instant::now();
    wait_not_ready(&d, "the watches to fail").await;
    proxy.set(Fault::Pass);
    let down = t0.elapsed();
    wait_ready(&d).await;
    let back = t0.elapsed();
    case.set_port("s7", 81).await;
    // taken before the convergence check, which lists the remote leaders itself
    let served = (
        served_lists(&remote, "services").await - served0.0,
        served_lists(&remote, "endpointslices").await - served0.1,
    );
    let took = converge(&case).await;
    let lists = requests("list") - lists0;
    let watches = requests("watch") - watches0;
    assert_eq!(lists, 0.0, "a blip relists nothing:\n{}", d.logs());
    assert!(watches >= 3.0, "each watch resumed: {watches}");
    assert_eq!(served, (0.0, 0.0), "the API server served no listing");
    case.finish(&before, Report {
        id: "25-network-blip",
        scenario: "Network blip: the remote refuses connections for a moment",
        done: &format!("{N} leaders mirrored through the proxy; it cut every connection and refused new ones until /readyz showed the failure ({:.1} s), then passed them again; then a leader changed", down.as_secs_f64()),
        converge: Some(took),
        note: format!(
            "/readyz 200 again {:.1} s after the blip began; from the blip on, the daemon sent {watches} watch requests (resumed from the last resourceVersion) and {lists} list requests; the remote API server served {} listings of Services and {} of EndpointSlices",
            back.as_secs_f64(), served.0, served.1
        ),
    })
    .await;
}
