//! The MCS pass against a mock API server (see `fixtures`): each test states every request a
//! pass must send, in order; any other request fails it. What the pass writes goes into its
//! caches (write-through), so the next pass sees it as the watches would.
use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::*;
use crate::desired::mcs::{ENDPOINTS_ANNOTATION, Identity};
use crate::desired::test_support::{cluster_ip_service, endpoint, slice, web_ports};
use crate::fixtures::shop::{EVENTS, SERVICES, SLICES};
use crate::fixtures::{self, ApiServer, Reply, Seen, created, loaded, ok, opts, post, put, run};
use crate::state::{LOCAL, LocalState, McsNamespace, Property, RemoteState};

const IMPORTS: &str = "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceimports";
const IMPORT: &str = "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceimports/web";
const IMPORT_STATUS: &str =
    "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceimports/web/status";
const EXPORT_STATUS: &str =
    "/apis/multicluster.x-k8s.io/v1beta1/namespaces/shop/serviceexports/web/status";

struct Setup {
    ctx: Ctx,
    api: ApiServer,
    east: Arc<RemoteState>,
    /// east's Services and slices in `shop`
    east_shop: Arc<McsNamespace>,
    _lease: watch::Sender<Option<std::time::Instant>>,
}

fn export(created: &str) -> ServiceExport {
    fixtures::obj(
        json!({"metadata": {"namespace": "shop", "name": "web", "uid": "se-uid",
        "resourceVersion": "1", "creationTimestamp": created}}),
    )
}

fn web_slice(name: &str, ready: &[bool]) -> EndpointSlice {
    let endpoints = ready
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut e = endpoint(&format!("10.2.0.{}", i + 1));
            e["conditions"]["ready"] = json!(r);
            e
        })
        .collect();
    slice(name, "IPv4", web_ports(), endpoints)
}

/// One cluster's export of shop/web, listed: its export, the Service, its slices.
fn exporting(c: &McsCluster, created: &str, slices: Vec<EndpointSlice>) -> Arc<McsNamespace> {
    c.set_property(Property::Absent);
    loaded(&c.exports, [export(created)]);
    let ns = Arc::new(McsNamespace::new(CancellationToken::new()));
    loaded(&ns.services, [cluster_ip_service()]);
    loaded(&ns.slices, slices);
    c.namespaces.write().insert("shop".into(), Arc::clone(&ns));
    ns
}

/// The local cluster `west` exports shop/web (one ready endpoint), and so does the remote
/// `east` (two); nothing is imported yet.
fn setup() -> Setup {
    let east = RemoteState::new("east", opts(), vec![]).with_mcs(true, Some("id-east"));
    let east_mcs = east.mcs.clone().expect("read as an MCS source");
    let east_shop = exporting(
        &east_mcs,
        "2024-01-01T00:00:00Z",
        vec![web_slice("web-e", &[true, true])],
    );
    let source = Arc::new(McsCluster::new(Identity::Local, LOCAL, "west"));
    exporting(
        &source,
        "2024-01-01T00:00:05Z",
        vec![web_slice("web-w", &[true])],
    );
    let mcs = McsLocal::new(source);
    loaded(&mcs.imports, []);
    loaded(&mcs.derived, []);
    loaded(&mcs.slices, []);
    mcs.settle(&[east_mcs], Some(&BTreeSet::new()));
    let east = Arc::new(east);
    let local = LocalState::default().networks_listed();
    let (client, api) = fixtures::client("local");
    let (tx, leadership) = fixtures::leadership(true);
    let mut ctx = fixtures::ctx(client, leadership, vec![Arc::clone(&east)], Arc::new(local));
    ctx.mcs = Some(Arc::new(mcs));
    Setup {
        ctx,
        api,
        east,
        east_shop,
        _lease: tx,
    }
}

fn key() -> Key {
    Key::mcs(("shop".into(), "web".into()))
}

/// The API server's answer to a create or a replace: what was sent, with a uid, the next
/// resourceVersion and (a Service) its clusterIP.
fn echo(seen: &Seen) -> Reply {
    let mut body = seen.body.clone();
    let m = &mut body["metadata"];
    if m["uid"].is_null() {
        m["uid"] = json!(format!("uid-{}", m["name"].as_str().unwrap_or_default()));
    }
    let rv: u64 = m["resourceVersion"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    m["resourceVersion"] = json!((rv + 1).to_string());
    if body["kind"] == "Service" {
        body["spec"]["clusterIP"] = json!("10.96.5.5");
        body["spec"]["clusterIPs"] = json!(["10.96.5.5"]);
    }
    if seen.method == http::Method::POST {
        created(body)
    } else {
        ok(body)
    }
}

fn endpoints_of(sent: &Seen) -> Value {
    let a = sent.body["metadata"]["annotations"][ENDPOINTS_ANNOTATION].as_str();
    serde_json::from_str(a.expect("the annotation is written")).expect("JSON")
}

fn ready_of(sent: &Seen) -> Vec<bool> {
    let eps = sent.body["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    eps.iter()
        .map(|e| e["conditions"]["ready"].as_bool().unwrap_or(true))
        .collect()
}

/// The first pass: the import, with every cluster's endpoints from its first write; its
/// derived Service, the IPs on the import, the slices, its status, the local export's status.
/// Returns the path of east's slice.
async fn first_pass(s: &Setup) -> String {
    let mut east = String::new();
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s.api.answer(post(IMPORTS), echo).await;
        assert_eq!(
            sent.body["metadata"]["annotations"][ENDPOINTS_ANNOTATION],
            r#"{"east":{"ready":2,"total":2},"west":{"ready":1,"total":1}}"#
        );
        s.api.answer(post(SERVICES), echo).await;
        let sent = s.api.answer(put(IMPORT), echo).await;
        assert_eq!(sent.body["spec"]["ips"], json!(["10.96.5.5"]));
        for _ in 0..2 {
            let sent = s.api.answer(post(SLICES), echo).await;
            let m = &sent.body["metadata"];
            if m["labels"]["multicluster.kubernetes.io/source-cluster"] == "east" {
                east = format!("{SLICES}/{}", m["name"].as_str().unwrap_or_default());
            }
        }
        s.api.answer(put(IMPORT_STATUS), echo).await;
        s.api.answer(put(EXPORT_STATUS), echo).await;
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    assert!(!east.is_empty(), "east's slice is written");
    east
}

/// A pass that must send nothing at all.
async fn steady(s: &Setup, why: &str) {
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {})
        .await
        .unwrap();
    assert_eq!(outcome, Outcome::Unchanged, "{why}");
}

/// A pass that rewrites the import's annotation and east's slice (at `east`), and nothing
/// else; returns the annotation written and east's endpoints' readiness.
async fn east_changed(s: &Setup, east: &str) -> (Value, Vec<bool>) {
    let mut got = (Value::Null, Vec::new());
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let sent = s.api.answer(put(IMPORT), echo).await;
        got.0 = endpoints_of(&sent);
        let sent = s.api.answer(put(east), echo).await;
        got.1 = ready_of(&sent);
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Applied);
    got
}

#[tokio::test]
async fn the_endpoints_annotation_is_written_with_the_import_and_only_when_it_changes() {
    let s = setup();
    let east = first_pass(&s).await;
    steady(&s, "nothing changed: no write").await;

    // east cut off by the data-path probe: its endpoints published not ready, and said so
    s.east.cut_off.store(true, Ordering::SeqCst);
    let (shown, ready) = east_changed(&s, &east).await;
    assert_eq!(
        shown,
        json!({"east": {"ready": 0, "total": 2, "cutOff": true}, "west": {"ready": 1, "total": 1}})
    );
    assert_eq!(ready, [false, false]);
    steady(&s, "still cut off: no write").await;

    // reachable again, and one of its pods stops being ready: a readiness transition
    s.east.cut_off.store(false, Ordering::SeqCst);
    s.east_shop
        .slices
        .write()
        .apply(Event::Apply(web_slice("web-e", &[true, false])));
    let (shown, ready) = east_changed(&s, &east).await;
    assert_eq!(
        shown,
        json!({"east": {"ready": 1, "total": 2}, "west": {"ready": 1, "total": 1}})
    );
    assert_eq!(ready, [true, false]);
    steady(&s, "no change since").await;

    // the outage policy marks east: stale
    s.east.marked.store(true, Ordering::SeqCst);
    let (shown, _) = east_changed(&s, &east).await;
    assert_eq!(
        shown["east"],
        json!({"ready": 0, "total": 2, "stale": true})
    );
    steady(&s, "still stale: no write").await;
}

#[tokio::test]
async fn an_import_that_is_not_ours_is_never_written_for_its_annotation() {
    let s = setup();
    let theirs: ServiceImport = fixtures::obj(json!({
        "metadata": {"namespace": "shop", "name": "web", "uid": "uid-theirs",
                     "resourceVersion": "3",
                     "annotations": {ENDPOINTS_ANNOTATION: "{}"}},
        "spec": {"type": "ClusterSetIP", "ports": []},
    }));
    let mcs = s.ctx.mcs.clone().unwrap();
    mcs.imports.write().apply(Event::Apply(theirs));
    let outcome = run(&[&s.api], reconcile(&s.ctx, &key()), async {
        let ev = s.api.expect(post(EVENTS), fixtures::event_created()).await;
        assert_eq!(ev.body["reason"], "NotOurImport");
    })
    .await
    .unwrap();
    assert_eq!(outcome, Outcome::Conflict);
}
