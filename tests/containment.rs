//! End to end, containment (issue 27): a remote speaks only for its own Services. Its reserved
//! labels never reach local objects; its ExternalName Services are refused unless its Secret
//! allows them; its exports into protected namespaces (kube-system) write nothing there; and a
//! follower a local team has taken over (`kubectl apply` with a selector) stays theirs. The real
//! daemon, real API servers; every case records one row of the reliability report.
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Secret, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, args_for, with_args};
use support::fault::{Lost, Report, conclude, conclude_since, snapshot};
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::{
    KEY, LOCAL, REMOTE, absent, block_on_thread, client, endpoint, eventually, exported,
    exported_with, namespace, obj, present, remote_slice, remote_slice_with,
};

const WAIT: Duration = Duration::from_secs(30);
const MANAGED_BY: &str = "cross-cluster-controller.fair.com";
const SWEEP_DONE: [(&str, &str); 2] = [("remote", REMOTE), ("outcome", "done")];

/// One test of this file at a time: the kube-system case reads every namespace, so a daemon of
/// another case running meanwhile would mirror the same exports.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The daemon on `ns` (static remote east), sweeping every 2 s, with `extra` flags.
async fn start(ns: &str, extra: &[&str]) -> Daemon {
    let args = with_args(
        args_for(ns),
        &[&["--sweep-schedule", "*/2 * * * * *"], extra].concat(),
    );
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;
    d
}

/// A counter inside an `eventually`: a series not published yet is a reason to wait (and, on a
/// daemon without it, the last reason given), not a panic.
fn count(d: &Daemon, name: &str, labels: &[(&str, &str)]) -> Result<f64, String> {
    d.gauge(name, labels)
        .ok_or_else(|| format!("no series {name}{labels:?}"))
}

async fn slices_of(api: &Api<EndpointSlice>, svc: &str) -> Result<Vec<EndpointSlice>, String> {
    let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={svc}"));
    Ok(api.list(&lp).await.map_err(|e| e.to_string())?.items)
}

fn ours(s: &EndpointSlice) -> bool {
    s.labels()
        .get("endpointslice.kubernetes.io/managed-by")
        .map(String::as_str)
        == Some(MANAGED_BY)
}

/// Ok with the note of the first Event with this reason about (kind, name).
async fn event_about(
    api: &Api<Event>,
    reason: &str,
    kind: &str,
    name: &str,
) -> Result<String, String> {
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .iter()
        .find(|ev| {
            let r = ev.regarding.as_ref();
            ev.reason.as_deref() == Some(reason)
                && r.and_then(|r| r.kind.as_deref()) == Some(kind)
                && r.and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|ev| ev.note.clone().unwrap_or_default())
        .ok_or_else(|| {
            format!(
                "no {reason} Event on {kind} {name} among {}",
                list.items.len()
            )
        })
}

/// The reserved label keys a hostile leader sets, each of which once reached the follower or
/// its slices (issue 27), and the daemon's own domain.
const RESERVED: [&str; 6] = [
    "multicluster.kubernetes.io/service-name",
    "service.kubernetes.io/service-proxy-name",
    "app.kubernetes.io/managed-by",
    "kubernetes.io/service-name",
    "fair.com/cross-cluster-origin-cluster",
    "mcs.x-k8s.io/anything",
];

/// The labels a local object of ours may carry under a reserved prefix: only the ones we set.
fn foreign_reserved(labels: &std::collections::BTreeMap<String, String>, svc: &str) -> Vec<String> {
    labels
        .iter()
        .filter(|(k, v)| match k.as_str() {
            KEY => v.as_str() != "follower",
            "kubernetes.io/service-name" => v.as_str() != svc,
            "endpointslice.kubernetes.io/managed-by" => v.as_str() != MANAGED_BY,
            // on our Endpoints when slices are written too
            "endpointslice.kubernetes.io/skip-mirror" => v.as_str() != "true",
            // our slices name their remote (the remote's name, never its labels)
            "fair.com/cross-cluster-origin-cluster" => v.as_str() != REMOTE,
            "multicluster.kubernetes.io/source-cluster" => false,
            k => {
                RESERVED.contains(&k)
                    || k.contains("kubernetes.io/")
                    || k.contains("k8s.io/")
                    || k.starts_with("fair.com/")
                    || k == "secret"
            }
        })
        .map(|(k, v)| format!("{k}={v}"))
        .collect()
}

#[tokio::test]
async fn a_leader_with_reserved_labels_gets_none_of_them_onto_local_objects() {
    let _one = SERIAL.lock().await;
    let ns = namespace("contain-labels").await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let remote_svc: Api<Service> = Api::namespaced(r.clone(), &ns.name);
    let remote_sl: Api<EndpointSlice> = Api::namespaced(r, &ns.name);
    let local_svc: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let local_sl: Api<EndpointSlice> = Api::namespaced(l.clone(), &ns.name);
    let before = snapshot(&l, &[&ns.name]).await;
    // the operator denies one more key
    let d = start(
        &ns.name,
        &["--label-deny", "secret", "--endpoints-mode", "both"],
    )
    .await;

    let mut leader = exported("web", 80);
    let labels = leader.metadata.labels.get_or_insert_default();
    for key in RESERVED {
        labels.insert(key.to_string(), "hostile".to_string());
    }
    labels.insert("secret".into(), "x".into());
    labels.insert("team".into(), "shop".into());
    let pp = PostParams::default();
    let t0 = Instant::now();
    remote_svc.create(&pp, &leader).await.unwrap();
    remote_sl
        .create(&pp, &remote_slice("web", "web-a", &["10.51.0.1"]))
        .await
        .unwrap();
    let local_ep: Api<k8s_openapi::api::core::v1::Endpoints> = Api::namespaced(l, &ns.name);
    let found = eventually(
        "the follower, its slice and its Endpoints, none with a reserved label",
        WAIT,
        || async {
            let svc = present(&local_svc, "web").await?;
            let slices: Vec<EndpointSlice> = slices_of(&local_sl, "web")
                .await?
                .into_iter()
                .filter(ours)
                .collect();
            let ep = present(&local_ep, "web").await?;
            if slices.is_empty() {
                return Err("no slice of ours yet".into());
            }
            let mut bad = foreign_reserved(svc.labels(), "web");
            for s in &slices {
                bad.extend(foreign_reserved(s.labels(), "web"));
            }
            bad.extend(foreign_reserved(ep.labels(), "web"));
            if svc.labels().get("team").map(String::as_str) != Some("shop") {
                return Err(format!("team=shop not copied: {:?}", svc.labels()));
            }
            if !bad.is_empty() {
                return Err(format!(
                    "reserved or denied labels on local objects: {bad:?}"
                ));
            }
            let reserved = count(
                &d,
                "xcc_labels_refused_total",
                &[("remote", REMOTE), ("reason", "reserved")],
            )?;
            let denied = count(
                &d,
                "xcc_labels_refused_total",
                &[("remote", REMOTE), ("reason", "denied")],
            )?;
            if reserved < RESERVED.len() as f64 || denied < 1.0 {
                return Err(format!("refused: reserved {reserved}, denied {denied}"));
            }
            Ok((reserved, denied))
        },
    )
    .await;
    let took = t0.elapsed();
    let after = snapshot(&client(LOCAL).await, &[&ns.name]).await;
    conclude(
        Report {
            id: "74-contain-reserved-labels",
            scenario: "A remote leader carrying reserved labels (multicluster.kubernetes.io, service.kubernetes.io/service-proxy-name, app.kubernetes.io/managed-by, kubernetes.io/service-name, the daemon's own fair.com domain, x-k8s.io) and one the operator denies",
            done: "a daemon with --label-deny secret --endpoints-mode both; the leader and one slice created in east",
            converge: Some(took),
            note: format!(
                "none reached the follower Service, its EndpointSlice or its Endpoints; team=shop copied; xcc_labels_refused_total reserved {} denied {}",
                found.0, found.1
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// The remote Secret for east, with the ExternalName annotation when `allow`.
async fn east_secret(allow: bool) -> Secret {
    let kc = kubeconfig_of(REMOTE, |_| {}).await;
    let mut s = remote_secret("east", Some(REMOTE), Some(&kc));
    if allow {
        s.metadata.annotations = Some(
            [(
                "fair.com/cross-cluster-allow-external-name".to_string(),
                "true".to_string(),
            )]
            .into(),
        );
    }
    s
}

#[tokio::test]
async fn external_name_is_refused_by_default_and_allowed_by_the_secret_annotation() {
    let _one = SERIAL.lock().await;
    let ns = namespace("contain-extname").await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let remote_svc: Api<Service> = Api::namespaced(r, &ns.name);
    let local_svc: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let secrets: Api<Secret> = Api::namespaced(l.clone(), &ns.name);
    let before = snapshot(&l, &[&ns.name]).await;
    let pp = PostParams::default();
    let cname = json!({"type": "ExternalName", "externalName": "evil.example.com"});
    remote_svc
        .create(&pp, &exported_with("db", cname))
        .await
        .unwrap();
    remote_svc.create(&pp, &exported("web", 80)).await.unwrap();

    let d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    apply_secret(&secrets, &east_secret(false).await).await;
    let skipped = [("remote", REMOTE), ("reason", "ExternalNameRefused")];
    let t0 = Instant::now();
    eventually(
        "web mirrored, the ExternalName refused and counted",
        WAIT,
        || async {
            present(&local_svc, "web").await?;
            if let Ok(f) = present(&local_svc, "db").await {
                return Err(format!(
                    "an ExternalName follower was written: {:?}",
                    f.spec
                ));
            }
            let n = count(&d, "xcc_skipped_total", &skipped)?;
            if n < 1.0 {
                return Err(format!("xcc_skipped_total ExternalNameRefused = {n}"));
            }
            Ok(())
        },
    )
    .await;
    let refused_in = t0.elapsed();
    // a pass of db came and went (counted): nothing was written for it
    absent(&local_svc, "db")
        .await
        .expect("no ExternalName follower");

    // the Secret allows it: a rotation, after which db is mirrored as it is
    apply_secret(&secrets, &east_secret(true).await).await;
    let t1 = Instant::now();
    let f = eventually("the ExternalName follower once allowed", WAIT, || async {
        let f = present(&local_svc, "db").await?;
        let spec = f.spec.clone().unwrap_or_default();
        if spec.external_name.as_deref() == Some("evil.example.com") {
            Ok(f)
        } else {
            Err(format!("{spec:?}"))
        }
    })
    .await;
    let allowed_in = t1.elapsed();

    // allowed no more: refused again, and the follower already there is kept as it is (a
    // refusal is no proof that the remote's Service is gone)
    let n = d.metric("xcc_skipped_total", &skipped);
    apply_secret(&secrets, &east_secret(false).await).await;
    d.wait_metric("xcc_skipped_total", &skipped, n + 1.0).await;
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;
    let kept = present(&local_svc, "db")
        .await
        .expect("the ExternalName follower is kept");
    assert_eq!(kept.uid(), f.uid());
    assert_eq!(kept.resource_version(), f.resource_version());

    let after = snapshot(&l, &[&ns.name]).await;
    conclude(
        Report {
            id: "75-contain-external-name",
            scenario: "A remote exports an ExternalName Service (a CNAME to a host of its choice under a local name)",
            done: "a Secret remote without, then with, then again without the annotation fair.com/cross-cluster-allow-external-name: \"true\"",
            converge: Some(allowed_in),
            note: format!(
                "refused by default (xcc_skipped_total ExternalNameRefused counted {:.1} s after the Secret; no local Service written); mirrored {:.1} s after the annotation (a rotation); with the annotation removed, refused again and the existing follower kept unchanged over 2 sweeps",
                refused_in.as_secs_f64(),
                allowed_in.as_secs_f64()
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// What this file makes in the shared kube-system namespaces, deleted when dropped.
struct KubeSystem(String);

impl Drop for KubeSystem {
    fn drop(&mut self) {
        let name = self.0.clone();
        block_on_thread(async move {
            let dp = DeleteParams::default();
            for ctx in [REMOTE, LOCAL] {
                let c: Client = client(ctx).await;
                let _ = Api::<Service>::namespaced(c.clone(), "kube-system")
                    .delete(&name, &dp)
                    .await;
                let _ = Api::<EndpointSlice>::namespaced(c, "kube-system")
                    .delete(&format!("{name}-abcde"), &dp)
                    .await;
            }
        });
    }
}

#[tokio::test]
async fn an_export_into_kube_system_is_refused_and_nothing_is_written_there() {
    let _one = SERIAL.lock().await;
    let ns = namespace("contain-kube-system").await;
    // the daemon's own namespace (its Lease), in both clusters: protected by default too
    let own = namespace("contain-own").await;
    let name = format!("xcc-ks-{}", &ns.name[ns.name.len() - 8..]);
    let _cleanup = KubeSystem(name.clone());
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let pp = PostParams::default();
    let watched = ["kube-system", ns.name.as_str(), own.name.as_str()];
    let before = snapshot(&l, &watched).await;
    // every namespace watched (no --watch-namespace): kube-system is protected by default
    let mut args = with_args(args_for(&own.name), &["--sweep-schedule", "*/2 * * * * *"]);
    let i = args
        .iter()
        .position(|a| a == "--watch-namespace")
        .expect("flag");
    args.drain(i..i + 2);
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;

    let t0 = Instant::now();
    let remote_ks: Api<Service> = Api::namespaced(r.clone(), "kube-system");
    remote_ks.create(&pp, &exported(&name, 80)).await.unwrap();
    Api::<EndpointSlice>::namespaced(r.clone(), "kube-system")
        .create(
            &pp,
            &remote_slice_with(
                &name,
                &format!("{name}-abcde"),
                "IPv4",
                json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
                vec![endpoint("10.52.0.1")],
            ),
        )
        .await
        .unwrap();
    // and one into the daemon's own namespace
    Api::<Service>::namespaced(r.clone(), &own.name)
        .create(&pp, &exported("own", 80))
        .await
        .unwrap();
    // an export beside them, in the test's namespace: mirrored (the daemon is working)
    Api::<Service>::namespaced(r, &ns.name)
        .create(&pp, &exported("web", 80))
        .await
        .unwrap();
    let local_web: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let local_ks: Api<Service> = Api::namespaced(l.clone(), "kube-system");
    let protected = [("remote", REMOTE), ("reason", "NamespaceProtected")];
    eventually(
        "the kube-system export refused, the other mirrored",
        WAIT,
        || async {
            present(&local_web, "web").await?;
            if let Ok(f) = present(&local_ks, &name).await {
                return Err(format!(
                    "a follower was written in kube-system: {}",
                    f.name_any()
                ));
            }
            let n = count(&d, "xcc_skipped_total", &protected)?;
            if n < 2.0 {
                return Err(format!("xcc_skipped_total NamespaceProtected = {n}"));
            }
            let logs = d.logs();
            let logged = |what: &str| {
                logs.lines()
                    .any(|l| l.contains("NamespaceProtected") && l.contains(what))
            };
            if !logged(&name) || !logged(&format!("{}/own", own.name)) {
                return Err("no log line yet".into());
            }
            Ok(())
        },
    )
    .await;
    let took = t0.elapsed();
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;

    let local_ks: Api<Service> = Api::namespaced(l.clone(), "kube-system");
    absent(&local_ks, &name)
        .await
        .expect("no follower in kube-system");
    let ks_slices: Api<EndpointSlice> = Api::namespaced(l.clone(), "kube-system");
    assert!(
        slices_of(&ks_slices, &name).await.unwrap().is_empty(),
        "no slice in kube-system"
    );
    let after = snapshot(&l, &watched).await;
    conclude(
        Report {
            id: "76-contain-kube-system",
            scenario: "A remote exports a Service in kube-system, and one in the daemon's own namespace (both protected by default)",
            done: "a daemon watching every namespace, defaults otherwise; a leader and its slice created in east's kube-system, one in the daemon's namespace, another leader in the test's namespace",
            converge: Some(took),
            note: format!(
                "both refused: xcc_skipped_total NamespaceProtected counted and logged; no Service or slice written in west's kube-system or the daemon's namespace over 2 further sweeps; the other leader mirrored ({:.1} s)",
                took.as_secs_f64()
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
}

/// The local team's Service, as they `kubectl apply` it (client side): a selector, their port.
fn team_manifest(ns: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: api\n  namespace: {ns}\nspec:\n  selector:\n    app: api\n  ports:\n  - name: http\n    port: 80\n    targetPort: 8080\n"
    )
}

fn kubectl_apply(kubeconfig: &std::path::Path, manifest: &str) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new(support::tools::tool("kubectl"))
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["--context", LOCAL, "apply", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kubectl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(manifest.as_bytes())
        .expect("write manifest");
    let out = child.wait_with_output().expect("kubectl apply");
    assert!(
        out.status.success(),
        "kubectl apply: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_follower_the_local_team_took_over_keeps_its_selector_and_loses_our_slices() {
    let _one = SERIAL.lock().await;
    let ns = namespace("contain-squat").await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let remote_svc: Api<Service> = Api::namespaced(r.clone(), &ns.name);
    let remote_sl: Api<EndpointSlice> = Api::namespaced(r, &ns.name);
    let local_svc: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let local_sl: Api<EndpointSlice> = Api::namespaced(l.clone(), &ns.name);
    let pp = PostParams::default();
    let d = start(&ns.name, &[]).await;

    // east exports app/api before the local team creates it: a follower with east's slice
    remote_svc.create(&pp, &exported("api", 80)).await.unwrap();
    remote_sl
        .create(&pp, &remote_slice("api", "api-a", &["10.53.0.1"]))
        .await
        .unwrap();
    eventually("the follower and its slice", WAIT, || async {
        present(&local_svc, "api").await?;
        let n = slices_of(&local_sl, "api")
            .await?
            .iter()
            .filter(|s| ours(s))
            .count();
        if n == 1 {
            Ok(())
        } else {
            Err(format!("{n} slices of ours"))
        }
    })
    .await;
    let before = snapshot(&l, &[&ns.name]).await;

    // the team's kubectl apply patches the follower
    let t0 = Instant::now();
    let kc = support::bed().await.kubeconfig.clone();
    let manifest = team_manifest(&ns.name);
    tokio::task::spawn_blocking(move || kubectl_apply(&kc, &manifest))
        .await
        .expect("kubectl task");
    let events: Api<Event> = Api::namespaced(l.clone(), &ns.name);
    eventually("our slice removed, the takeover reported", WAIT, || async {
        let svc = present(&local_svc, "api").await?;
        let selector = svc.spec.and_then(|s| s.selector).unwrap_or_default();
        if selector.get("app").map(String::as_str) != Some("api") {
            return Err(format!("the team's selector was stripped: {selector:?}"));
        }
        let n = slices_of(&local_sl, "api")
            .await?
            .iter()
            .filter(|s| ours(s))
            .count();
        if n > 0 {
            return Err(format!("{n} slices of ours left"));
        }
        let m = count(&d, "xcc_followers_taken_over_total", &[("remote", REMOTE)])?;
        if m < 1.0 {
            return Err(format!("xcc_followers_taken_over_total = {m}"));
        }
        event_about(&events, "FollowerTakenOver", "Service", "api").await?;
        Ok(())
    })
    .await;
    let took = t0.elapsed();
    let theirs = present(&local_svc, "api").await.unwrap();

    // east changes its slice, then stops exporting: the team's Service is left as it is
    remote_sl
        .replace("api-a", &pp, &{
            let mut s = remote_sl.get("api-a").await.unwrap();
            s.endpoints.push(obj(endpoint("10.53.0.2")));
            s
        })
        .await
        .unwrap();
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;
    remote_svc
        .delete("api", &DeleteParams::default())
        .await
        .unwrap();
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;

    let now = present(&local_svc, "api")
        .await
        .expect("the team's Service stays");
    assert_eq!(now.uid(), theirs.uid());
    assert_eq!(
        now.resource_version(),
        theirs.resource_version(),
        "not written since"
    );
    let selector = now
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .unwrap_or_default();
    assert_eq!(
        selector.get("app").map(String::as_str),
        Some("api"),
        "the selector is kept"
    );
    assert!(
        slices_of(&local_sl, "api")
            .await
            .unwrap()
            .iter()
            .all(|s| !ours(s)),
        "no slice of ours came back"
    );
    assert_eq!(
        d.metric("xcc_followers_taken_over_total", &[("remote", REMOTE)]),
        1.0
    );
    let after = snapshot(&l, &[&ns.name]).await;
    conclude_since(
        Report {
            id: "77-contain-squatting",
            scenario: "Squatting: a remote exported app/api before the local team created it; the team's kubectl apply (a selector) patches the follower",
            done: "kubectl apply -f (client side) of the team's Service with a selector over the follower; then east changes its slice and stops exporting",
            converge: Some(took),
            note: format!(
                "taken over: our slice deleted by uid, FollowerTakenOver Event, xcc_followers_taken_over_total 1 ({:.1} s); the team's Service unwritten since (resourceVersion kept, selector app=api) through east's change, its unexport and 4 sweeps",
                took.as_secs_f64()
            ),
        },
        &before,
        &after,
        &BTreeSet::new(),
    );
}
