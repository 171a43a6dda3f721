//! Reconcile decisions against a mock API server (see `fixtures`): each test states every
//! request a pass must send, in order; any other request fails it.
use super::*;
use crate::desired::test_support::{cluster_ip_service, endpoint, slice, web_ports};
use crate::desired::{MANAGED_BY, MANAGED_BY_LABEL};
use crate::fixtures::shop::{EVENTS, SERVICES, SLICES};
use crate::fixtures::{
    self, ApiServer, created, delete, event_created, get, loaded, ok, opts, post, put, run, status,
    terminating,
};
use crate::state::LocalState;
use crate::state::cache::Cache;
use serde_json::{Value, json};
use tokio::sync::watch;

const WEB: &str = "/api/v1/namespaces/shop/services/web";

struct Setup {
    ctx: Ctx,
    api: ApiServer,
    _lease: watch::Sender<Option<std::time::Instant>>,
}

/// Caches that completed their listings with these objects, and a leading writer.
fn setup(
    exported: Vec<Service>,
    remote_slices: Vec<EndpointSlice>,
    local_services: Vec<Service>,
    local_slices: Vec<EndpointSlice>,
) -> Setup {
    setup_in(
        LocalState::default(),
        exported,
        remote_slices,
        local_services,
        local_slices,
    )
}

/// [`setup`] with a local state of the test's own (its Service IP shares).
fn setup_in(
    local: LocalState,
    exported: Vec<Service>,
    remote_slices: Vec<EndpointSlice>,
    local_services: Vec<Service>,
    local_slices: Vec<EndpointSlice>,
) -> Setup {
    let remote = RemoteState::new(fixtures::REMOTE, opts(), vec![]);
    loaded(&remote.services, exported);
    loaded(&remote.slices, remote_slices);
    loaded(&remote.foreign_slices, []);
    let local = local.networks_listed();
    loaded(&local.services, local_services);
    loaded(&local.slices, local_slices);
    loaded(&local.endpoints, []);
    let (client, api) = fixtures::client("local");
    let (tx, leadership) = fixtures::leadership(true);
    let ctx = fixtures::ctx(client, leadership, vec![Arc::new(remote)], Arc::new(local));
    Setup {
        ctx,
        api,
        _lease: tx,
    }
}

fn key() -> Key {
    Key {
        mode: crate::reconcile::Mode::Follower,
        namespace: "shop".into(),
        name: "web".into(),
    }
}

/// The follower the exported Service `cluster_ip_service()` asks for, as JSON.
fn desired_follower() -> Value {
    let f = desired::follower(&cluster_ip_service(), &[], &opts()).unwrap();
    let mut v = serde_json::to_value(&f.service).unwrap();
    v["metadata"]["annotations"]["fair.com/cross-cluster-origin-clusters"] =
        json!(fixtures::REMOTE);
    v
}

/// The desired follower as the API server holds it.
fn live_follower(uid: &str, resource_version: &str) -> Value {
    let mut v = desired_follower();
    v["metadata"]["uid"] = json!(uid);
    v["metadata"]["resourceVersion"] = json!(resource_version);
    v
}

fn local_slice(name: &str, managed_by: &str, origin: &str) -> EndpointSlice {
    fixtures::obj(json!({
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                     "resourceVersion": "4",
                     "labels": {"fair.com/cross-cluster": "follower",
                                "kubernetes.io/service-name": "web",
                                MANAGED_BY_LABEL: managed_by},
                     "annotations": {"fair.com/cross-cluster-origin-cluster": origin}},
        "addressType": "IPv4", "endpoints": [],
    }))
}

#[tokio::test]
async fn a_409_on_create_of_a_service_that_is_not_a_follower_leads_to_no_further_write() {
    let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s
            .api
            .expect(post(SERVICES), status(409, "AlreadyExists"))
            .await;
        assert_eq!(
            sent.body["metadata"]["labels"]["fair.com/cross-cluster"],
            "follower"
        );
        // not in our cache: look before touching
        let theirs = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "web", "uid": "uid-theirs",
                         "resourceVersion": "3", "labels": {"app": "theirs"}},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}});
        s.api.expect(get(WEB), ok(theirs)).await;
        // reported on their object; no PUT, no DELETE
        let ev = s.api.expect(post(EVENTS), event_created()).await;
        assert_eq!(ev.body["reason"], "NotOurFollower");
        assert_eq!(ev.body["regarding"]["uid"], "uid-theirs");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
}

/// A live follower whose origin is another remote, remote-b.
fn follower_of_remote_b() -> serde_json::Value {
    let mut theirs = live_follower("uid-b", "5");
    theirs["metadata"]["annotations"]["fair.com/cross-cluster-origin-cluster"] = json!("remote-b");
    theirs["metadata"]["annotations"]["fair.com/cross-cluster-origin-clusters"] = json!("remote-b");
    theirs
}

#[tokio::test]
async fn a_local_follower_of_another_remote_is_never_written() {
    let mut theirs = follower_of_remote_b();
    theirs["spec"]["ports"][0]["port"] = json!(81);
    let s = setup(
        vec![cluster_ip_service()],
        vec![],
        vec![fixtures::obj(theirs)],
        vec![],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let ev = s.api.expect(post(EVENTS), event_created()).await;
        assert_eq!(ev.body["reason"], "NotOurFollower");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
}

#[tokio::test]
async fn when_the_exported_service_is_gone_only_what_is_ours_is_deleted() {
    let s = setup(
        vec![],
        vec![],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![
            local_slice("web-abc", MANAGED_BY, fixtures::REMOTE),
            // mirrored from an Endpoints object by kube-controller-manager: not ours
            local_slice(
                "web-mirrored",
                "endpointslicemirroring-controller.k8s.io",
                fixtures::REMOTE,
            ),
        ],
    );
    let gone = json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                      "code": 200, "metadata": {}});
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s
            .api
            .expect(delete(&format!("{SLICES}/web-abc")), ok(gone.clone()))
            .await;
        assert_eq!(sent.body["preconditions"]["uid"], "uid-web-abc");
        let sent = s.api.expect(delete(WEB), ok(gone.clone())).await;
        assert_eq!(sent.body["preconditions"]["uid"], "uid-web");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Deleted);
}

#[tokio::test]
async fn a_follower_of_another_remote_is_not_deleted_when_our_exported_service_is_gone() {
    let theirs = follower_of_remote_b();
    let s = setup(
        vec![],
        vec![],
        vec![fixtures::obj(theirs)],
        vec![local_slice("web-b", MANAGED_BY, "remote-b")],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unchanged);
}

#[tokio::test]
async fn nothing_is_decided_before_every_cache_has_listed() {
    let s = setup(
        vec![],
        vec![],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![],
    );
    // the local Endpoints watch restarted and has not completed a listing yet
    *s.ctx.local.endpoints.write() = Cache::new(crate::state::cache::by_name::<Endpoints>);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(
        outcome,
        Outcome::NotReady,
        "an absent exported Service is not a gone one until every cache has listed"
    );
}

#[tokio::test]
async fn a_409_on_create_of_our_own_follower_updates_the_version_read() {
    let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
    let mut stale = live_follower("uid-web", "7");
    stale["spec"]["ports"][0]["port"] = json!(81);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api
            .expect(post(SERVICES), status(409, "AlreadyExists"))
            .await;
        s.api.expect(get(WEB), ok(stale)).await;
        let sent = s
            .api
            .expect(put(WEB), ok(live_follower("uid-web", "8")))
            .await;
        assert_eq!(sent.body["metadata"]["resourceVersion"], "7");
        assert_eq!(sent.body["metadata"]["uid"], "uid-web");
        assert_eq!(sent.body["spec"]["ports"][0]["port"], 80);
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    let cached = s.ctx.local.services.read().named(&key().group()).unwrap();
    assert_eq!(
        cached
            .and_then(|c| c.metadata.resource_version.clone())
            .as_deref(),
        Some("8"),
        "what the server returned is cached at once (write-through)"
    );
}

#[tokio::test]
async fn a_new_exported_service_gets_its_service_then_slices_owned_by_the_uid_created() {
    let remote_slice = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let s = setup(
        vec![cluster_ip_service()],
        vec![remote_slice],
        vec![],
        vec![],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api
            .expect(post(SERVICES), created(live_follower("new-uid", "1")))
            .await;
        let sent = s
            .api
            .expect(
                post(SLICES),
                created(json!({"metadata": {"namespace": "shop", "name": "web-x",
                                "uid": "uid-slice", "resourceVersion": "2"},
                               "addressType": "IPv4", "endpoints": []})),
            )
            .await;
        assert_eq!(
            sent.body["metadata"]["ownerReferences"][0]["uid"],
            "new-uid"
        );
        assert_eq!(
            sent.body["metadata"]["labels"][MANAGED_BY_LABEL],
            MANAGED_BY
        );
        assert_eq!(sent.body["endpoints"][0]["addresses"][0], "10.0.0.1");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
}

#[tokio::test]
async fn a_converged_follower_costs_no_request() {
    let s = setup(
        vec![cluster_ip_service()],
        vec![],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unchanged);
}

#[tokio::test]
async fn a_missing_namespace_is_reported_not_created_unless_asked() {
    let s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(post(SERVICES), status(404, "NotFound")).await;
        // no local object to attach it to: the Event goes to the fallback reference
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "NamespaceMissing");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));
}

#[tokio::test]
async fn a_namespace_being_deleted_is_skipped_not_retried_and_not_created_again() {
    let mut s = setup(vec![cluster_ip_service()], vec![], vec![], vec![]);
    // even when asked to create missing namespaces: this one exists, and is going
    s.ctx.create_namespaces = true;
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(post(SERVICES), terminating("shop")).await;
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "NamespaceMissing");
        let note = ev.body["note"].as_str().unwrap_or_default();
        assert!(note.contains("is being deleted"), "{note}");
    })
    .await
    .expect("a namespace being deleted is no error to retry");
    assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));
}

#[tokio::test]
async fn slices_refused_by_a_namespace_being_deleted_end_the_pass_without_an_error() {
    let remote_slice = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let s = setup(
        vec![cluster_ip_service()],
        vec![remote_slice],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(post(SLICES), terminating("shop")).await;
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "NamespaceMissing");
    })
    .await
    .expect("a namespace being deleted is no error to retry");
    assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));
}

/// Remotes remote-a and remote-b, each `Some(exported Services)` (caches listed) or `None` (not listed
/// yet), and the local followers.
fn setup_two(
    a: Option<Vec<Service>>,
    b: Option<Vec<Service>>,
    remote_slices: Vec<EndpointSlice>,
    local_services: Vec<Service>,
    local_slices: Vec<EndpointSlice>,
) -> Setup {
    let remote = |name: &str, exported: Option<Vec<Service>>, slices: Vec<EndpointSlice>| {
        let mut o = opts();
        o.cluster_name = name.to_string();
        let r = RemoteState::new(name, o, vec![]);
        if let Some(exported) = exported {
            loaded(&r.services, exported);
            loaded(&r.slices, slices);
            loaded(&r.foreign_slices, []);
        }
        Arc::new(r)
    };
    let local = LocalState::default().networks_listed();
    loaded(&local.services, local_services);
    loaded(&local.slices, local_slices);
    loaded(&local.endpoints, []);
    let (client, api) = fixtures::client("local");
    let (tx, leadership) = fixtures::leadership(true);
    let remotes = vec![
        remote("remote-a", a, remote_slices),
        remote("remote-b", b, vec![]),
    ];
    let ctx = fixtures::ctx(client, leadership, remotes, Arc::new(local));
    Setup {
        ctx,
        api,
        _lease: tx,
    }
}

/// The live follower of remote-a and remote-b.
fn merged_follower() -> Service {
    let mut v = live_follower("uid-web", "5");
    v["metadata"]["annotations"]["fair.com/cross-cluster-origin-clusters"] =
        json!("remote-a,remote-b");
    fixtures::obj(v)
}

fn gone() -> fixtures::Reply {
    ok(
        json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
              "code": 200, "metadata": {}}),
    )
}

#[tokio::test]
async fn two_remotes_exporting_one_service_make_one_follower_with_a_slice_each() {
    let mut older = cluster_ip_service();
    older.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2020-01-01T00:00:00Z".parse().unwrap(),
    ));
    let s = setup_two(
        Some(vec![cluster_ip_service()]),
        Some(vec![older]),
        vec![slice(
            "web-abc",
            "IPv4",
            web_ports(),
            vec![endpoint("10.0.0.1")],
        )],
        vec![],
        vec![],
    );
    // remote-b has no endpoints: one slice, remote-a's
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s
            .api
            .expect(post(SERVICES), created(live_follower("new-uid", "1")))
            .await;
        let ann = &sent.body["metadata"]["annotations"];
        assert_eq!(
            ann["fair.com/cross-cluster-origin-clusters"],
            "remote-a,remote-b"
        );
        assert_eq!(
            ann["fair.com/cross-cluster-origin-cluster"], "remote-b",
            "the oldest exported Service's"
        );
        let sent = s
            .api
            .expect(
                post(SLICES),
                created(json!({"metadata": {"namespace": "shop", "name": "web-x",
                                "uid": "uid-slice", "resourceVersion": "2"},
                               "addressType": "IPv4", "endpoints": []})),
            )
            .await;
        let labels = &sent.body["metadata"]["labels"];
        assert_eq!(labels["fair.com/cross-cluster-origin-cluster"], "remote-a");
        assert_eq!(
            labels["multicluster.kubernetes.io/source-cluster"],
            "remote-a"
        );
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
}

#[tokio::test]
async fn a_remote_that_proves_its_exported_service_gone_takes_only_its_own_slices() {
    let s = setup_two(
        Some(vec![cluster_ip_service()]),
        Some(vec![]),
        vec![],
        vec![merged_follower()],
        vec![local_slice("web-b", MANAGED_BY, "remote-b")],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s
            .api
            .expect(put(WEB), ok(live_follower("uid-web", "6")))
            .await;
        assert_eq!(
            sent.body["metadata"]["annotations"]["fair.com/cross-cluster-origin-clusters"],
            "remote-a",
            "remote-b is no longer recorded"
        );
        let sent = s
            .api
            .expect(delete(&format!("{SLICES}/web-b")), gone())
            .await;
        assert_eq!(sent.body["preconditions"]["uid"], "uid-web-b");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
}

#[tokio::test]
async fn a_remote_not_listed_yet_keeps_its_slices_and_the_service() {
    let s = setup_two(
        Some(vec![]),
        None,
        vec![],
        vec![merged_follower()],
        vec![
            local_slice("web-a", MANAGED_BY, "remote-a"),
            local_slice("web-b", MANAGED_BY, "remote-b"),
        ],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        // remote-a proved its exported Service gone: its slice goes; nothing of remote-b's, no Service
        s.api
            .expect(delete(&format!("{SLICES}/web-a")), gone())
            .await;
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Deleted);
}

#[tokio::test]
async fn a_follower_recording_a_remote_this_daemon_does_not_read_is_held() {
    let mut theirs = live_follower("uid-web", "5");
    theirs["metadata"]["annotations"]["fair.com/cross-cluster-origin-clusters"] =
        json!("remote-a,remote-z");
    let s = setup(
        vec![],
        vec![],
        vec![fixtures::obj(theirs)],
        vec![local_slice("web-z", MANAGED_BY, "remote-z")],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unchanged, "remote-z proved nothing");
}

#[tokio::test]
async fn a_retired_remote_counts_as_proof() {
    let s = setup(
        vec![],
        vec![],
        vec![merged_follower()],
        vec![local_slice("web-b", MANAGED_BY, "remote-b")],
    );
    s.ctx.remotes.retire("remote-b");
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api
            .expect(delete(&format!("{SLICES}/web-b")), gone())
            .await;
        let sent = s.api.expect(delete(WEB), gone()).await;
        assert_eq!(sent.body["preconditions"]["uid"], "uid-web");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Deleted);
}

/// The setup with the writer a `--dry-run` daemon has: no election, acting as the leader.
fn dry_run(mut s: Setup, create_namespaces: bool) -> Setup {
    let metrics = Arc::clone(&s.ctx.metrics);
    let client = s.ctx.writer.client().clone();
    s.ctx.writer = crate::reconcile::writer::Writer::new(
        client,
        crate::runtime::lease::Leadership::assumed(),
        true,
        metrics,
    );
    s.ctx.create_namespaces = create_namespaces;
    s
}

#[tokio::test]
async fn a_dry_run_only_looks_at_the_namespace_of_a_follower_it_would_create() {
    let s = dry_run(
        setup(vec![cluster_ip_service()], vec![], vec![], vec![]),
        true,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        // reads; no POST of the Service
        s.api.expect(get(WEB), status(404, "NotFound")).await;
        s.api
            .expect(
                get("/api/v1/namespaces/shop"),
                ok(json!({"metadata": {"name": "shop"}})),
            )
            .await;
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied, "it would have created it");
}

#[tokio::test]
async fn a_dry_run_would_create_a_missing_namespace_and_sends_no_post() {
    let s = dry_run(
        setup(vec![cluster_ip_service()], vec![], vec![], vec![]),
        true,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(get(WEB), status(404, "NotFound")).await;
        s.api
            .expect(get("/api/v1/namespaces/shop"), status(404, "NotFound"))
            .await;
        // no POST of the Namespace, nor of the Service
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
}

#[tokio::test]
async fn a_dry_run_logs_the_events_it_would_record_instead_of_sending_them() {
    // a missing namespace, not created: a skip, whose Event is only logged
    let s = dry_run(
        setup(vec![cluster_ip_service()], vec![], vec![], vec![]),
        false,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(get(WEB), status(404, "NotFound")).await;
        s.api
            .expect(get("/api/v1/namespaces/shop"), status(404, "NotFound"))
            .await;
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));

    // a local Service that is not ours: a conflict, whose Event is only logged
    let mut theirs = follower_of_remote_b();
    theirs["spec"]["ports"][0]["port"] = json!(81);
    let s = dry_run(
        setup(
            vec![cluster_ip_service()],
            vec![],
            vec![fixtures::obj(theirs)],
            vec![],
        ),
        false,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
}

#[tokio::test]
async fn a_dry_run_would_update_and_delete_but_sends_neither() {
    let mut stale = live_follower("uid-web", "5");
    stale["spec"]["ports"][0]["port"] = json!(81);
    let s = dry_run(
        setup(
            vec![cluster_ip_service()],
            vec![],
            vec![fixtures::obj(stale)],
            vec![],
        ),
        false,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Applied);

    // the exported Service gone: the follower would be deleted
    let s = dry_run(
        setup(
            vec![],
            vec![],
            vec![fixtures::obj(live_follower("uid-web", "5"))],
            vec![],
        ),
        false,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Deleted);
}

#[tokio::test]
async fn a_dry_run_finds_a_service_that_is_not_ours_as_a_real_create_would() {
    // not in the follower cache: a real create meets 409 and reads it; a dry run reads it
    let s = dry_run(
        setup(vec![cluster_ip_service()], vec![], vec![], vec![]),
        false,
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let theirs = json!({"apiVersion": "v1", "kind": "Service",
            "metadata": {"namespace": "shop", "name": "web", "uid": "uid-theirs",
                         "resourceVersion": "3", "labels": {"app": "theirs"}},
            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}});
        s.api.expect(get(WEB), ok(theirs)).await;
        // the NotOurFollower Event is logged, not sent
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
}

#[tokio::test]
async fn an_event_refused_to_a_standby_is_still_sent_once_it_leads() {
    let (client, api) = fixtures::client("local");
    let (tx, leadership) = fixtures::leadership(false);
    let ctx = fixtures::ctx(
        client,
        leadership,
        vec![],
        Arc::new(LocalState::default().networks_listed()),
    );
    let on = ObjectReference {
        kind: Some("Service".into()),
        namespace: Some("shop".into()),
        name: Some("web".into()),
        ..Default::default()
    };
    let note = || "a note".to_string();
    let ev = || ctx.event(EventType::Warning, "Skip", note(), "Skip", Some(on.clone()));
    // a standby: nothing sent
    run(&[&api], ev(), async {}).await;
    tx.send_replace(Some(
        std::time::Instant::now() + std::time::Duration::from_secs(60),
    ));
    // leading now: the same Event (within the rate limit's interval) is sent
    run(&[&api], ev(), async {
        api.expect(post(EVENTS), event_created()).await;
    })
    .await;
}

#[tokio::test]
async fn a_follower_a_local_team_took_over_is_left_alone_and_only_our_slices_go() {
    // the team's kubectl apply set a selector on the follower
    let mut theirs = live_follower("uid-web", "7");
    theirs["spec"]["selector"] = json!({"app": "api"});
    let ours = local_slice("web-a", MANAGED_BY, fixtures::REMOTE);
    let kcm = local_slice("web-kcm", "endpointslice-controller.k8s.io", "");
    let remote = slice("web-r", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let s = setup(
        vec![cluster_ip_service()],
        vec![remote],
        vec![fixtures::obj(theirs)],
        vec![ours, kcm],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        // our slice goes, by its uid; no PUT of the Service, nothing of the kcm slice
        let sent = s
            .api
            .expect(delete(&format!("{SLICES}/web-a")), gone())
            .await;
        assert_eq!(sent.body["preconditions"]["uid"], "uid-web-a");
        let ev = s.api.expect(post(EVENTS), event_created()).await;
        assert_eq!(ev.body["reason"], "FollowerTakenOver");
        assert_eq!(ev.body["regarding"]["uid"], "uid-web");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
    let counted = s
        .ctx
        .metrics
        .taken_over
        .get_or_create(&crate::runtime::metrics::ByRemote::new(fixtures::REMOTE))
        .get();
    assert_eq!(counted, 1);
}

#[tokio::test]
async fn an_export_into_a_protected_namespace_writes_nothing() {
    let mut exported = cluster_ip_service();
    exported.metadata.namespace = Some("kube-system".into());
    let s = setup(vec![exported], vec![], vec![], vec![]);
    let k = Key {
        namespace: "kube-system".into(),
        ..key()
    };
    // the only request: the Event, on the daemon's Lease (the fixtures' is empty), not in
    // kube-system
    let outcome = run(&[&s.api], reconcile(&s.ctx, &k), async {
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "NamespaceProtected");
        assert_eq!(ev.body["regarding"], json!({}));
    })
    .await
    .unwrap();
    assert_eq!(
        outcome,
        Outcome::Skipped(crate::desired::NAMESPACE_PROTECTED)
    );
}

// ---- names that are top-level domains (issue 37, item 3) ------------------------------------

/// The exported Service `cluster_ip_service()` renamed `namespace/name`.
fn exported_as(namespace: &str, name: &str) -> Service {
    let mut svc = cluster_ip_service();
    svc.metadata.namespace = Some(namespace.into());
    svc.metadata.name = Some(name.into());
    svc
}

fn key_of(namespace: &str, name: &str) -> Key {
    Key {
        mode: crate::reconcile::Mode::Follower,
        namespace: namespace.into(),
        name: name.into(),
    }
}

#[tokio::test]
async fn an_export_named_like_a_top_level_domain_gets_no_follower() {
    for (ns, name) in [("shop", "com"), ("com", "github")] {
        let mut s = setup(vec![exported_as(ns, name)], vec![], vec![], vec![]);
        // not even its namespace, when asked to create missing ones
        s.ctx.create_namespaces = true;
        let outcome = run(&[&s.api], reconcile(&s.ctx, &key_of(ns, name)), async {
            // no object of the key: the Event goes to the fallback reference
            let ev = s
                .api
                .expect(
                    post("/apis/events.k8s.io/v1/namespaces/default/events"),
                    event_created(),
                )
                .await;
            assert_eq!(ev.body["reason"], "PublicNameRefused");
            let note = ev.body["note"].as_str().unwrap_or_default();
            assert!(note.contains("top-level domain"), "{note}");
            assert!(note.contains(fixtures::REMOTE), "{note}");
        })
        .await
        .unwrap();
        assert_eq!(
            outcome,
            Outcome::Skipped("PublicNameRefused"),
            "{ns}/{name}"
        );
    }
}

#[tokio::test]
async fn a_follower_named_like_a_top_level_domain_loses_our_slices_and_keeps_its_service() {
    let svc = exported_as("shop", "com");
    let mut live =
        serde_json::to_value(desired::follower(&svc, &[], &opts()).unwrap().service).unwrap();
    live["metadata"]["uid"] = json!("uid-com");
    live["metadata"]["resourceVersion"] = json!("5");
    let slice_of_com = |name: &str, managed_by: &str| {
        let mut s = local_slice(name, managed_by, fixtures::REMOTE);
        s.metadata
            .labels
            .get_or_insert_default()
            .insert("kubernetes.io/service-name".into(), "com".into());
        s
    };
    let s = setup(
        vec![svc],
        vec![],
        vec![fixtures::obj(live)],
        vec![
            slice_of_com("com-ours", MANAGED_BY),
            slice_of_com("com-mirrored", "endpointslicemirroring-controller.k8s.io"),
        ],
    );
    let outcome = run(
        &[&s.api],
        reconcile(&s.ctx, &key_of("shop", "com")),
        async {
            let sent = s
                .api
                .expect(delete(&format!("{SLICES}/com-ours")), gone())
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-com-ours");
            let ev = s.api.expect(post(EVENTS), event_created()).await;
            assert_eq!(ev.body["reason"], "PublicNameRefused");
            assert_eq!(ev.body["regarding"]["uid"], "uid-com");
            let note = ev.body["note"].as_str().unwrap_or_default();
            assert!(note.contains("delete it by hand"), "{note}");
        },
    )
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Skipped("PublicNameRefused"));
}

#[tokio::test]
async fn a_top_level_domain_the_operator_allows_is_mirrored() {
    let mut s = setup(vec![exported_as("shop", "com")], vec![], vec![], vec![]);
    let allowed = crate::desired::containment::Containment {
        allowed_tld_names: vec!["shop".into(), "com".into()],
        ..Default::default()
    };
    s.ctx.opts = s.ctx.opts.clone().with_containment(allowed);
    let outcome = run(
        &[&s.api],
        reconcile(&s.ctx, &key_of("shop", "com")),
        async {
            let sent = s
                .api
                .expect(post(SERVICES), created(live_follower("new-uid", "1")))
                .await;
            assert_eq!(sent.body["metadata"]["name"], "com");
        },
    )
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
}

/// The exported Service with a label the live follower lacks (a flip).
fn relabelled() -> Service {
    let mut exported = cluster_ip_service();
    let labels = exported.metadata.labels.get_or_insert_default();
    labels.insert("tier".into(), "gold".into());
    exported
}

#[tokio::test]
async fn a_remote_out_of_service_updates_gets_its_slices_written_and_its_service_deferred() {
    let remote_slice = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let s = setup(
        vec![relabelled()],
        vec![remote_slice],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![],
    );
    // its burst used up (ten seconds' worth at the default 10 a second)
    let remote = s.ctx.remotes.states()[0].clone();
    let now = std::time::Instant::now();
    let used = (0..1000)
        .take_while(|_| remote.take_service_update(now).is_ok())
        .count();
    assert_eq!(used, 100);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        // no PUT of the Service: only the slice, which carries readiness
        let sent = s
            .api
            .expect(
                post(SLICES),
                created(json!({"metadata": {"namespace": "shop", "name": "web-x",
                                "uid": "uid-slice", "resourceVersion": "2"},
                               "addressType": "IPv4", "endpoints": []})),
            )
            .await;
        assert_eq!(sent.body["endpoints"][0]["addresses"][0], "10.0.0.1");
    })
    .await
    .unwrap();
    let Outcome::Deferred(wait) = outcome else {
        panic!("{outcome:?}");
    };
    assert!(wait <= std::time::Duration::from_millis(100), "{wait:?}");
    let deferred = s
        .ctx
        .metrics
        .service_updates_deferred
        .get_or_create(&crate::runtime::metrics::ByRemote::new(fixtures::REMOTE))
        .get();
    assert_eq!(deferred, 1);
    let (n, first) = remote.write_limited();
    assert_eq!(n, 1);
    let (held, why) = first.unwrap();
    assert_eq!(held, "shop/web");
    assert!(why.contains("over 10 a second"), "{why}");
}

#[tokio::test]
async fn once_an_update_is_due_the_deferred_service_is_written_with_what_changed_meanwhile() {
    let s = setup(
        vec![relabelled()],
        vec![],
        vec![fixtures::obj(live_follower("uid-web", "5"))],
        vec![],
    );
    let remote = s.ctx.remotes.states()[0].clone();
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s
            .api
            .expect(put(WEB), ok(live_follower("uid-web", "6")))
            .await;
        assert_eq!(sent.body["metadata"]["labels"]["tier"], "gold");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    assert_eq!(remote.write_limited().0, 0, "nothing held");
}

/// A local state whose Service range has `range` addresses (by `--local-service-ips`), with
/// `held` of them held by the remote's followers already.
fn limited_local(range: u64, held: usize) -> LocalState {
    use crate::state::service_ips::{Holder, Shares};
    let local = LocalState::default().with_shares(Shares {
        range: Some(range),
        ..Shares::default()
    });
    for i in 0..held {
        let holder = Some(Holder::Remote(fixtures::REMOTE.into()));
        local.service_ips.apply(format!("shop/other-{i}"), holder);
    }
    local
}

#[tokio::test]
async fn a_new_follower_over_its_remotes_share_of_service_ips_waits_and_sends_only_an_event() {
    // 25% of 8 addresses: 2, both held
    let local = limited_local(8, 2);
    let s = setup_in(local, vec![cluster_ip_service()], vec![], vec![], vec![]);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        // no POST of the Service: only the Event, on the fallback reference
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "ServiceIpsLimited");
        let note = ev.body["note"].as_str().unwrap_or_default();
        assert!(
            note.contains("holds 2 ClusterIPs") && note.contains("25% of 8"),
            "{note}"
        );
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Skipped("ServiceIpsLimited"));
    let ips = &s.ctx.local.service_ips;
    assert_eq!(ips.waiting(), vec![key().group()]);
    assert_eq!(ips.held_by(fixtures::REMOTE), 2);
}

#[tokio::test]
async fn a_headless_follower_takes_no_address_and_is_created_over_the_share() {
    let local = limited_local(8, 2);
    let mut headless = cluster_ip_service();
    headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
    let s = setup_in(local, vec![headless], vec![], vec![], vec![]);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let mut live = live_follower("new-uid", "1");
        live["spec"]["clusterIP"] = json!("None");
        let sent = s.api.expect(post(SERVICES), created(live)).await;
        assert_eq!(sent.body["spec"]["clusterIP"], "None");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    assert!(s.ctx.local.service_ips.waiting().is_empty());
}

#[tokio::test]
async fn a_follower_within_the_share_is_created_and_a_failed_create_frees_its_address() {
    let local = limited_local(8, 1);
    let s = setup_in(local, vec![cluster_ip_service()], vec![], vec![], vec![]);
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api
            .expect(post(SERVICES), created(live_follower("new-uid", "1")))
            .await;
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    let ips = &s.ctx.local.service_ips;
    assert_eq!(
        ips.held_by(fixtures::REMOTE),
        2,
        "reserved before the watch saw it"
    );

    // the same with a create refused (its namespace is missing): nothing held for it
    let s = setup_in(
        limited_local(8, 1),
        vec![cluster_ip_service()],
        vec![],
        vec![],
        vec![],
    );
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        s.api.expect(post(SERVICES), status(404, "NotFound")).await;
        let ev = s
            .api
            .expect(
                post("/apis/events.k8s.io/v1/namespaces/default/events"),
                event_created(),
            )
            .await;
        assert_eq!(ev.body["reason"], "NamespaceMissing");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Skipped("NamespaceMissing"));
    assert_eq!(s.ctx.local.service_ips.held_by(fixtures::REMOTE), 1);
}
