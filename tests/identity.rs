//! A remote is the cluster it was made for. `remote-access` pins the cluster's id (the uid of
//! its kube-system namespace) in the Secret it makes; the daemon refuses a Secret whose server
//! answers with another id, whatever order the Secrets join in, and keeps what the honest remote
//! made. On three real clusters: east and south are remotes, west is local; the daemon has no
//! static remote, every remote comes from a Secret.
mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use cross_cluster_controller::remotes::remote_secret::CLUSTER_ID_KEY;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service};
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;
use support::daemon::{Daemon, with_args};
use support::fault::{Lost, Report, conclude, snapshot};
use support::fleet::{Fleet, HUB, SECRETREADER, profiles};
use support::metrics::WRITE_KINDS;
use support::remotes::{
    apply_secret, export, kubeconfig_of, remote_access, remote_secret, secrets_only_args,
};
use support::{
    LOCAL, REMOTE, absent, bed, client, event_notes, eventually, namespace_in, obj, present,
    status_json,
};

/// A third cluster of the bed: another member, whose server a Secret for east points at.
const SOUTH: &str = "south";
const WAIT: Duration = Duration::from_secs(60);
const ORIGIN: &str = "fair.com/cross-cluster-origin-cluster";
const ORIGIN_ID: &str = "fair.com/cross-cluster-origin-cluster-id";

/// The uid of the kube-system namespace of the cluster of `context`: its id.
async fn kube_system_uid(context: &str) -> String {
    let api: Api<Namespace> = Api::all(client(context).await);
    api.get("kube-system")
        .await
        .expect("kube-system")
        .uid()
        .expect("a uid")
}

/// `remote-access --output secret` run for real against `context`: the Secret it printed (named
/// `name`, for the remote `name`, to apply in `ns` of west) and what it said.
async fn pinned_secret(context: &str, ns: &str, name: &str) -> (Secret, String) {
    let kc = bed().await.kubeconfig.to_string_lossy().to_string();
    let (yaml, stderr) = remote_access(&[
        "--kubeconfig",
        &kc,
        "--context",
        context,
        "--namespace",
        ns,
        "--duration",
        "1h",
        "--output",
        "secret",
        "--secret-namespace",
        ns,
        "--secret-name",
        name,
        "--cluster-name",
        name,
    ]);
    let secret: Secret = serde_yaml::from_str(&yaml).expect("a Secret");
    (secret, stderr)
}

/// A remote Secret named `name` whose kubeconfig reaches the cluster of `context` and which pins
/// the cluster id `pin`.
async fn secret_pinned(name: &str, context: &str, pin: &str) -> Secret {
    let mut s = remote_secret(name, None, Some(&kubeconfig_of(context, |_| {}).await));
    s.annotations_mut()
        .insert(CLUSTER_ID_KEY.to_string(), pin.to_string());
    s
}

/// The /readyz line refusing Secret `secret` of `ns` (remote `secret`) because its server
/// answers as `answered` while it pins `pinned`.
fn mismatch_line(ns: &str, secret: &str, answered: &str, pinned: &str) -> String {
    format!(
        "Secret {ns}/{secret}: not a remote: its server answers as cluster {answered}, but its Secret pins cluster {pinned}: remote \"{secret}\" refused"
    )
}

/// Waits until /readyz shows `line` (and, when given, `also`): what it showed.
async fn readyz_shows(d: &Daemon, line: &str, also: Option<&str>) -> String {
    eventually(&format!("/readyz to show {line:?}"), WAIT, || async {
        let (code, body) = d.readyz()?;
        let shown = body.contains(line) && also.is_none_or(|a| body.contains(a));
        (code == 503 && shown)
            .then_some(body.clone())
            .ok_or(format!("{code} {body}"))
    })
    .await
}

/// `(origin remote, origin cluster id)` of the follower `name` once it records `remote`.
async fn follower_of(west: &Api<Service>, name: &str, remote: &str) -> (String, String) {
    eventually(&format!("{name} followed from {remote}"), WAIT, || async {
        let s = present(west, name).await?;
        let a = s.annotations();
        let origin = a.get(ORIGIN).cloned().unwrap_or_default();
        let id = a.get(ORIGIN_ID).cloned().unwrap_or_default();
        (origin == remote)
            .then(|| (origin.clone(), id.clone()))
            .ok_or(format!("origin {origin:?} id {id:?}"))
    })
    .await
}

/// The note of a `RemoteRefused` Event on Secret `secret` that names both ids.
async fn refusal_event(ns: &str, secret: &str, a: &str, b: &str) -> String {
    eventually("a RemoteRefused Event naming both ids", WAIT, || async {
        let notes = event_notes(LOCAL, ns, "RemoteRefused", Some(("Secret", secret))).await?;
        notes
            .iter()
            .find(|n| n.contains(a) && n.contains(b))
            .cloned()
            .ok_or(format!("{notes:?}"))
    })
    .await
}

#[tokio::test]
async fn remote_access_pins_the_cluster_id_and_a_server_answering_as_another_cluster_is_refused() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("identity-pin", &[REMOTE, LOCAL, SOUTH]).await;
    let (east_id, south_id) = (kube_system_uid(REMOTE).await, kube_system_uid(SOUTH).await);
    assert_ne!(east_id, south_id);
    export(REMOTE, &ns.name, "web", "web-1", "10.1.0.5").await;
    export(SOUTH, &ns.name, "from-south", "from-south-1", "10.2.0.5").await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    decoy(&west).await;

    // (a) remote-access run against east pins east's kube-system uid
    let (east_secret, said) = pinned_secret(REMOTE, &ns.name, "east").await;
    assert_eq!(
        east_secret.annotations().get(CLUSTER_ID_KEY),
        Some(&east_id),
        "the pin is east's kube-system uid"
    );
    assert!(said.contains(&east_id), "{said}");
    secrets
        .create(&PostParams::default(), &east_secret)
        .await
        .expect("the Secret applies as printed");
    let d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    let (_, recorded) = follower_of(&west, "web", "east").await;
    assert_eq!(recorded, east_id, "the follower records east's id");
    let web_uid = west.get("web").await.unwrap().uid();
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // (b) another Secret for east (it pins east's uid) whose server is south's: refused, both
    // ids named, nothing of south read
    apply_secret(&secrets, &secret_pinned("east-dr", SOUTH, &east_id).await).await;
    let t0 = Instant::now();
    let line = mismatch_line(&ns.name, "east-dr", &south_id, &east_id);
    let body = readyz_shows(&d, &line, Some("remote east: synced")).await;
    let shown = t0.elapsed();
    assert!(!body.contains("remote east-dr:"), "never a member: {body}");
    let note = refusal_event(&ns.name, "east-dr", &east_id, &south_id).await;
    let refusals = [("kind", "Secret"), ("reason", "PinMismatch")];
    let counted = d
        .wait_metric("xcc_remote_refusals_total", &refusals, 1.0)
        .await;
    // east still flows, and once a new leader of it is followed, south's never was
    export(REMOTE, &ns.name, "web-2", "web-2-1", "10.1.0.6").await;
    follower_of(&west, "web-2", "east").await;
    let sweeps = d.metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "done")],
    );
    d.wait_metric(
        "xcc_sweeps_total",
        &[("remote", "east"), ("outcome", "done")],
        sweeps + 2.0,
    )
    .await;
    absent(&west, "from-south")
        .await
        .expect("nothing of south followed");
    assert_eq!(
        d.metric("xcc_remote_changes_total", &[("change", "joined")]),
        1.0,
        "only east joined\n{}",
        d.logs()
    );
    assert_eq!(d.writes(&WRITE_KINDS, &["delete"]), 0.0);
    assert_eq!(
        west.get("web").await.unwrap().uid(),
        web_uid,
        "east's follower kept"
    );
    // status shows the refusal, both ids named
    let (_, report) = status_json(&ns.name).await;
    let object = format!("Secret {}/east-dr", ns.name);
    let refused = report["refused"]
        .as_array()
        .and_then(|r| r.iter().find(|f| f["object"] == object.as_str()))
        .unwrap_or_else(|| panic!("{object} not in status: {report}"));
    let message = refused["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&east_id) && message.contains(&south_id),
        "{message}"
    );
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "97-identity-pin-wrong-server",
            scenario: "A remote Secret pinned to east (remote-access) whose server is another member's",
            done: "remote-access --output secret run against east (pin = east's kube-system uid), applied, east followed; then a second Secret pinning east's uid whose kubeconfig reaches south, which exports a Service",
            converge: None,
            note: format!(
                "the pin equals east's kube-system uid; refused on /readyz {:.1} s after it was applied (\"its server answers as cluster <south>, but its Secret pins cluster <east>\"), the same in a RemoteRefused Event and in status; xcc_remote_refusals_total{{reason=PinMismatch}} {counted}; nothing of south followed 2 sweeps later; east's follower kept its uid, a new leader of east followed; 0 deletes",
                shown.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &names(&["web"])),
        &before.non_followers_touched(&after),
    );
    // the refusal's words, for the report
    eprintln!("refused: {note}");
}

#[tokio::test]
async fn an_impostor_joining_first_cannot_lock_the_honest_remote_out() {
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("identity-impostor", &[REMOTE, LOCAL, SOUTH]).await;
    let (east_id, south_id) = (kube_system_uid(REMOTE).await, kube_system_uid(SOUTH).await);
    export(REMOTE, &ns.name, "web", "web-1", "10.1.0.5").await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    decoy(&west).await;

    // the impostor: a Secret made for south (it pins south's uid) whose server answers as east,
    // as a hostile API server answering with east's uid would; it is there first
    apply_secret(
        &secrets,
        &secret_pinned("a-impostor", REMOTE, &south_id).await,
    )
    .await;
    let mut d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    let line = mismatch_line(&ns.name, "a-impostor", &east_id, &south_id);
    readyz_shows(&d, &line, None).await;
    absent(&west, "web")
        .await
        .expect("nothing followed through the impostor");

    // the honest east joins after it, pinned by remote-access, and is followed
    let (east_secret, _) = pinned_secret(REMOTE, &ns.name, "east").await;
    apply_secret(&secrets, &east_secret).await;
    let t0 = Instant::now();
    let (_, recorded) = follower_of(&west, "web", "east").await;
    let followed = t0.elapsed();
    assert_eq!(recorded, east_id);
    readyz_shows(&d, &line, Some("remote east: synced")).await;
    let web_uid = west.get("web").await.unwrap().uid();
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;

    // a restart: both Secrets are listed at once, the impostor first (a-impostor < east)
    d.kill();
    let d2 = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    let t1 = Instant::now();
    readyz_shows(&d2, &line, Some("remote east: synced")).await;
    let restarted = t1.elapsed();
    let note = refusal_event(&ns.name, "a-impostor", &east_id, &south_id).await;
    let refusals = [("kind", "Secret"), ("reason", "PinMismatch")];
    let counted = d2
        .wait_metric("xcc_remote_refusals_total", &refusals, 1.0)
        .await;
    // the restarted daemon met the impostor first
    let logs = d2.logs();
    let (refused_at, joined_at) = (logs.find("not a usable remote"), logs.find("remote joined"));
    assert!(
        matches!((refused_at, joined_at), (Some(r), Some(j)) if r < j),
        "the impostor refused before east joined:\n{logs}"
    );
    assert_eq!(
        d2.metric("xcc_remote_changes_total", &[("change", "joined")]),
        1.0,
        "only east joined\n{}",
        d2.logs()
    );
    // east still flows through the restarted daemon, into the same follower
    west.get("web").await.unwrap();
    export(REMOTE, &ns.name, "web-2", "web-2-1", "10.1.0.6").await;
    follower_of(&west, "web-2", "east").await;
    let web = west.get("web").await.unwrap();
    assert_eq!(web.uid(), web_uid, "east's follower kept");
    assert_eq!(
        web.annotations().get(ORIGIN).map(String::as_str),
        Some("east")
    );
    assert_eq!(d2.writes(&WRITE_KINDS, &["delete"]), 0.0);
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "98-identity-impostor-first",
            scenario: "An impostor Secret whose server answers with east's uid joins before the honest east, and again first after a restart",
            done: "a Secret pinned to south whose kubeconfig reaches east applied before the daemon started; then east's Secret made by remote-access; then the daemon SIGKILLed and started with both listed (the impostor first)",
            converge: Some(followed),
            note: format!(
                "the impostor refused on /readyz and in a RemoteRefused Event naming both uids; nothing followed through it; the honest east followed {:.1} s after its Secret; after the restart the impostor was refused first (log order) and east synced within {:.1} s, xcc_remote_refusals_total{{reason=PinMismatch}} {counted}, its follower kept its uid, a new leader followed, 0 deletes",
                followed.as_secs_f64(),
                restarted.as_secs_f64()
            ),
        },
        &Lost::since(&before, &after, &names(&["web"])),
        &before.non_followers_touched(&after),
    );
    eprintln!("refused: {note}");
}

/// With `--require-cluster-id-pin` a Secret that pins nothing is refused, and the pinned one
/// beside it joins.
#[tokio::test]
async fn with_require_cluster_id_pin_an_unpinned_secret_is_refused() {
    let ns = namespace_in("identity-require", &[REMOTE, LOCAL]).await;
    export(REMOTE, &ns.name, "web", "web-1", "10.1.0.5").await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let unpinned = remote_secret("bare", None, Some(&kubeconfig_of(REMOTE, |_| {}).await));
    apply_secret(&secrets, &unpinned).await;
    let args = with_args(secrets_only_args(&ns.name), &["--require-cluster-id-pin"]);
    let d = Daemon::start_secrets_only(&args).await;
    let line = format!(
        "Secret {}/bare: not a remote: its Secret pins no cluster id and --require-cluster-id-pin is on: remote \"bare\" refused",
        ns.name
    );
    readyz_shows(&d, &line, None).await;
    let (east_secret, _) = pinned_secret(REMOTE, &ns.name, "east").await;
    apply_secret(&secrets, &east_secret).await;
    follower_of(&west, "web", "east").await;
    readyz_shows(&d, &line, Some("remote east: synced")).await;
    let refusals = [("kind", "Secret"), ("reason", "Unpinned")];
    d.wait_metric("xcc_remote_refusals_total", &refusals, 1.0)
        .await;
    assert_eq!(
        d.metric("xcc_remote_changes_total", &[("change", "joined")]),
        1.0,
        "only the pinned east joined\n{}",
        d.logs()
    );
}

/// A ClusterProfile pins its cluster with the same annotation: one whose server answers as
/// another cluster is refused (naming both ids, the profile and its remote), and it joins once
/// the pin is the cluster's own.
#[tokio::test]
async fn a_profile_pinned_to_another_cluster_is_refused_until_its_pin_is_right() {
    support::fleet::hub_up().await;
    support::extra_cluster(SOUTH, "").await;
    let ns = namespace_in("identity-profile", &[REMOTE, LOCAL, HUB, SOUTH]).await;
    let (east_id, south_id) = (kube_system_uid(REMOTE).await, kube_system_uid(SOUTH).await);
    let fleet = Fleet::new(&ns.name).await;
    export(REMOTE, &ns.name, "web", "web-1", "10.1.0.5").await;
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    decoy(&west).await;
    let lc = client(LOCAL).await;
    let before = snapshot(&lc, &[&ns.name]).await;
    let providers = fleet.provider_file(&[]);
    let token = fleet.token_for(REMOTE, "1h").await;
    fleet.put_token("east-spoke", &token).await;
    let mut args = secrets_only_args(&ns.name);
    args.extend(fleet.flags(&providers));
    let d = Daemon::start_secrets_only(&args).await;
    d.wait_leading().await;

    // the profile "east" gives east's server, but pins south's id
    let profile: DynamicObject = obj(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": "east", "annotations": {CLUSTER_ID_KEY: south_id},
                     "labels": {"x-k8s.io/cluster-manager": "test"}},
        "spec": {"displayName": "east", "clusterManager": {"name": "test"}}}));
    let api = profiles(&fleet.hub, &ns.name);
    api.create(&PostParams::default(), &profile).await.unwrap();
    let access = Fleet::access(SECRETREADER, REMOTE, "east-spoke", json!([])).await;
    fleet
        .set_status("east", json!({"accessProviders": [access]}))
        .await;
    let line = format!(
        "ClusterProfile {}/east: not a remote: its server answers as cluster {east_id}, but its ClusterProfile pins cluster {south_id}: remote \"east\" refused",
        ns.name
    );
    readyz_shows(&d, &line, None).await;
    let refusals = [("kind", "ClusterProfile"), ("reason", "PinMismatch")];
    let counted = d
        .wait_metric("xcc_remote_refusals_total", &refusals, 1.0)
        .await;
    absent(&west, "web")
        .await
        .expect("nothing followed through the refused profile");
    let (_, report) = status_json(&ns.name).await;
    let object = format!("ClusterProfile {}/east", ns.name);
    let shown = report["refused"]
        .as_array()
        .is_some_and(|r| r.iter().any(|f| f["object"] == object.as_str()));
    assert!(shown, "{object} not in status: {report}");

    // the pin made right: the profile joins
    let t0 = Instant::now();
    api.patch(
        "east",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {CLUSTER_ID_KEY: east_id}}})),
    )
    .await
    .unwrap();
    let (_, recorded) = follower_of(&west, "web", "east").await;
    let joined = t0.elapsed();
    assert_eq!(recorded, east_id);
    let after = snapshot(&lc, &[&ns.name]).await;
    conclude(
        Report {
            id: "99-identity-profile-pin",
            scenario: "A ClusterProfile pinned to another cluster than its server's",
            done: "a profile giving east's server whose annotation pins south's kube-system uid; then the annotation changed to east's uid",
            converge: Some(joined),
            note: format!(
                "refused on /readyz (\"its server answers as cluster <east>, but its ClusterProfile pins cluster <south>\"), in status and xcc_remote_refusals_total{{kind=ClusterProfile,reason=PinMismatch}} {counted}; nothing followed; with the pin made right it joined and its follower appeared {:.1} s after",
                joined.as_secs_f64()
            ),
        },
        &Lost::nothing_to_lose(),
        &before.non_followers_touched(&after),
    );
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

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}
