use super::*;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

fn svc(ns: &str, name: &str, rv: &str) -> Service {
    serde_json::from_value(
        json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}}),
    )
    .unwrap()
}

fn slice(ns: &str, name: &str, service: &str, rv: &str) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"namespace": ns, "name": name, "resourceVersion": rv,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "endpoints": []
    }))
    .unwrap()
}

fn key(ns: &str, name: &str) -> GroupKey {
    (ns.into(), name.into())
}

#[test]
fn managed_fields_are_not_kept_and_deletes_find_their_group() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    let mut s = slice("a", "x-1", "x", "1");
    s.metadata.managed_fields = Some(vec![Default::default()]);
    c.apply(Event::Apply(s));
    let held = c.group(&key("a", "x")).unwrap();
    assert_eq!(held.len(), 1);
    assert!(held[0].metadata.managed_fields.is_none());
    // a delete event whose object lost its label still removes it from its group
    let mut gone = slice("a", "x-1", "x", "2");
    gone.metadata.labels = None;
    assert_eq!(c.apply(Event::Delete(gone)), vec![key("a", "x")]);
    assert!(c.is_empty());
    assert_eq!(c.len(), 0);
}

#[test]
fn not_ready_until_the_first_complete_listing() {
    let mut c = Cache::new(by_name::<Service>);
    c.apply(Event::Init);
    c.apply(Event::InitApply(svc("a", "x", "1")));
    assert!(!c.ready());
    assert!(
        c.named(&key("a", "x")).unwrap().is_none(),
        "a partial listing is not visible"
    );
    let touched = c.apply(Event::InitDone);
    assert!(c.ready());
    assert_eq!(touched, vec![key("a", "x")]);
    assert!(c.named(&key("a", "x")).unwrap().is_some());
}

#[test]
fn a_relist_keeps_the_old_view_until_complete_then_reports_only_changes() {
    let mut c = Cache::new(by_name::<Service>);
    for e in [
        Event::Init,
        Event::InitApply(svc("a", "x", "1")),
        Event::InitApply(svc("a", "y", "1")),
        Event::InitDone,
    ] {
        c.apply(e);
    }
    c.apply(Event::Init);
    c.apply(Event::InitApply(svc("a", "x", "1")));
    // the remote is cut here: the relist never completes
    assert!(
        c.named(&key("a", "y")).unwrap().is_some(),
        "an incomplete relist hides nothing"
    );
    c.apply(Event::Init);
    c.apply(Event::InitApply(svc("a", "x", "2")));
    let mut touched = c.apply(Event::InitDone);
    touched.sort();
    assert_eq!(
        touched,
        vec![key("a", "x"), key("a", "y")],
        "x changed, y is gone"
    );
    assert!(c.named(&key("a", "y")).unwrap().is_none());
}

#[test]
fn slices_group_under_their_service() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    c.apply(Event::Init);
    c.apply(Event::InitDone);
    assert_eq!(
        c.apply(Event::Apply(slice("a", "web-1", "web", "1"))),
        vec![key("a", "web")]
    );
    c.apply(Event::Apply(slice("a", "web-2", "web", "1")));
    c.apply(Event::Apply(slice("b", "web-1", "web", "1")));
    assert_eq!(c.group(&key("a", "web")).unwrap().len(), 2);
    assert_eq!(c.len(), 3);
    assert_eq!(
        c.apply(Event::Delete(slice("a", "web-1", "web", "2"))),
        vec![key("a", "web")]
    );
    assert_eq!(c.group(&key("a", "web")).unwrap().len(), 1);
    c.apply(Event::Delete(slice("a", "web-2", "web", "2")));
    assert!(c.group(&key("a", "web")).unwrap().is_empty());
    assert_eq!(c.keys().count(), 1, "empty groups are dropped");
}

#[test]
fn a_slice_moved_to_another_service_leaves_its_old_group() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    c.apply(Event::Apply(slice("a", "s", "one", "1")));
    let mut touched = c.apply(Event::Apply(slice("a", "s", "two", "2")));
    touched.sort();
    assert_eq!(touched, vec![key("a", "one"), key("a", "two")]);
    assert!(c.group(&key("a", "one")).unwrap().is_empty());
}

#[test]
fn objects_read_back_as_stored_and_services_need_no_index() {
    let mut c = Cache::new(by_name::<Service>);
    let s: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "a", "name": "web", "resourceVersion": "7",
                         "labels": {"app": "web"}, "annotations": {"note": "x"}},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}}}
        }))
        .unwrap();
    c.apply(Event::Apply(s.clone()));
    assert_eq!(*c.named(&key("a", "web")).unwrap().unwrap(), s);
    assert!(
        c.store.located.is_empty(),
        "a Service is found by its own name"
    );
    assert_eq!(c.apply(Event::Delete(s)), vec![key("a", "web")]);
    assert!(c.named(&key("a", "web")).unwrap().is_none());
    assert!(c.is_empty());
}

#[test]
fn a_group_lists_its_members_in_name_order_and_counts_each_once() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    for n in ["web-c", "web-a", "web-b", "web-a"] {
        c.apply(Event::Apply(slice("a", n, "web", "1")));
    }
    let names: Vec<String> = c
        .group(&key("a", "web"))
        .unwrap()
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["web-a", "web-b", "web-c"]);
    assert_eq!(c.len(), 3);
    // a slice named like its service is still found once it moves away
    c.apply(Event::Apply(slice("a", "web", "web", "1")));
    c.apply(Event::Apply(slice("a", "web", "other", "2")));
    assert_eq!(c.group(&key("a", "web")).unwrap().len(), 3);
    assert_eq!(c.group(&key("a", "other")).unwrap().len(), 1);
    assert_eq!(c.len(), 4);
}

#[test]
fn the_same_version_again_changes_nothing() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    assert_eq!(
        c.apply(Event::Apply(slice("a", "web-1", "web", "5"))),
        vec![key("a", "web")]
    );
    // the watch event of a write already stored from the write's response
    assert!(
        c.apply(Event::Apply(slice("a", "web-1", "web", "5")))
            .is_empty()
    );
    assert_eq!(
        c.apply(Event::Apply(slice("a", "web-1", "web", "6"))),
        vec![key("a", "web")]
    );
    // the same version under another service is a move, not a repeat
    let moved = c.apply(Event::Apply(slice("a", "web-1", "api", "6")));
    assert_eq!(moved.len(), 2);
}

#[test]
fn similar_objects_are_held_in_a_fraction_of_their_json_and_read_back_whole() {
    let follower = |i: usize, rv: &str| -> EndpointSlice {
        serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": format!("web-{i}-east-abcde"), "resourceVersion": rv,
                             "uid": format!("1d5c4f0e-8f3a-4c1b-9d7e-{i:012}"),
                             "creationTimestamp": "2026-01-01T00:00:00Z",
                             "labels": {"kubernetes.io/service-name": format!("web-{i}"),
                                        "fair.com/cross-cluster": "follower",
                                        "endpointslice.kubernetes.io/managed-by": "cross-cluster-controller.fair.com"},
                             "annotations": {"fair.com/cross-cluster-origin-cluster": "east",
                                             "fair.com/cross-cluster-origin-object": format!("shop/web-{i}")}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [format!("10.1.{}.{}", i / 250, i % 250)], "conditions": {"ready": true}}]
            }))
            .unwrap()
    };
    let mut c = Cache::new(by_service_label::<EndpointSlice>);
    c.apply(Event::Init);
    for i in 0..100 {
        c.apply(Event::InitApply(follower(i, "1")));
    }
    c.apply(Event::InitDone);
    let json: usize = (0..100)
        .map(|i| serde_json::to_vec(&follower(i, "1")).unwrap().len())
        .sum();
    let held: usize = c
        .store
        .groups
        .values()
        .flatten()
        .map(|e| e.packed().len())
        .sum();
    assert!(
        held * 3 < json,
        "{held} bytes held for {json} bytes of JSON"
    );
    // the object the dictionary came from goes; the others still read back whole
    c.apply(Event::Delete(follower(0, "2")));
    for i in 1..100 {
        let g = key("shop", &format!("web-{i}"));
        assert_eq!(*c.group(&g).unwrap()[0], follower(i, "1"));
    }
    // a relist builds a store (and dictionary) of its own
    c.apply(Event::Init);
    c.apply(Event::InitApply(follower(7, "3")));
    c.apply(Event::InitDone);
    assert_eq!(c.len(), 1);
    assert_eq!(
        *c.group(&key("shop", "web-7")).unwrap()[0],
        follower(7, "3")
    );
}

#[test]
fn an_entry_holds_name_version_and_data_apart() {
    let e = Entry::new("web-1", Some("42"), b"packed", 0);
    assert_eq!(
        (e.name(), e.version(), e.packed()),
        ("web-1", Some("42"), &b"packed"[..])
    );
    let e = Entry::new("web-1", None, b"", 0);
    assert_eq!(
        (e.name(), e.version(), e.packed()),
        ("web-1", None, &b""[..])
    );
    let e = Entry::new("web-1", Some(""), b"p", 0);
    assert_eq!(
        (e.name(), e.version(), e.packed()),
        ("web-1", Some(""), &b"p"[..])
    );
}

#[test]
fn an_unreadable_entry_is_an_error_not_an_absence() {
    let mut c = Cache::new(by_name::<Service>);
    c.apply(Event::Apply(svc("a", "x", "1")));
    let dict = c.store.dict().to_vec();
    if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
        m[0] = Entry::new("x", Some("1"), &pack(b"{not json", &dict), 0);
    }
    assert!(c.named(&key("a", "x")).is_err());
    // damaged compressed data, and a length far beyond any object
    for damaged in [&b"\x09\0\0\0\xff\xff"[..], b"\xff\xff\xff\xff{not", b"{n"] {
        if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
            m[0] = Entry::new("x", Some("1"), damaged, 0);
        }
        assert!(c.named(&key("a", "x")).is_err());
    }
    // what an object that failed to serialize is held as
    if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
        m[0] = Entry::new("x", Some("1"), &[], 0);
    }
    assert!(c.named(&key("a", "x")).is_err());
}

fn endpoints(s: &EndpointSlice) -> usize {
    s.endpoints.len()
}

fn slice_with(name: &str, rv: &str, ips: usize) -> EndpointSlice {
    let mut s = slice("a", name, "x", rv);
    s.endpoints = (0..ips)
        .map(|i| serde_json::from_value(json!({"addresses": [format!("10.0.0.{i}")]})).unwrap())
        .collect();
    s
}

#[test]
fn a_lean_cache_keeps_no_annotations_and_counts_what_it_holds() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>).lean(endpoints);
    let mut big = slice_with("x-1", "1", 3);
    big.metadata.annotations = Some([("flood".to_string(), "x".repeat(100_000))].into());
    c.apply(Event::Apply(big));
    let held = c.group(&key("a", "x")).unwrap();
    assert!(held[0].metadata.annotations.is_none());
    let h = c.held();
    assert_eq!((h.objects, h.weight), (1, 3));
    assert!(
        h.bytes < 2_000,
        "{h:?}: the annotation is not counted, it is not held"
    );
    // replaced, then a second object, then a delete: the figures follow
    c.apply(Event::Apply(slice_with("x-1", "2", 5)));
    c.apply(Event::Apply(slice_with("x-2", "1", 2)));
    assert_eq!((c.held().objects, c.held().weight), (2, 7));
    c.apply(Event::Delete(slice_with("x-1", "3", 0)));
    assert_eq!((c.held().objects, c.held().weight), (1, 2));
    // a listing in progress counts as much as the view, or more, and costs besides it
    let before = c.held().bytes;
    c.apply(Event::Init);
    for (i, n) in [4, 4, 4].iter().enumerate() {
        c.apply(Event::InitApply(slice_with(&format!("y-{i}"), "1", *n)));
    }
    let h = c.held();
    assert_eq!((h.objects, h.weight), (3, 12));
    assert!(h.bytes > before, "{h:?}");
    c.apply(Event::InitDone);
    assert_eq!((c.held().objects, c.held().weight), (3, 12));
    // a local cache keeps annotations (its followers' origin annotations are read)
    let mut local = Cache::new(by_name::<Service>);
    let mut s = svc("a", "x", "1");
    s.metadata.annotations = Some([("note".to_string(), "kept".to_string())].into());
    local.apply(Event::Apply(s));
    let kept = local.named(&key("a", "x")).unwrap().unwrap();
    assert!(kept.metadata.annotations.is_some());
}

#[test]
fn an_evicted_cache_holds_nothing_and_proves_nothing() {
    let mut c = Cache::new(by_service_label::<EndpointSlice>).lean(endpoints);
    c.apply(Event::Init);
    c.apply(Event::InitApply(slice_with("x-1", "1", 3)));
    c.apply(Event::InitDone);
    assert!(c.ready());
    c.evict("over budget".into());
    assert!(!c.ready());
    assert_eq!(c.held(), Held::default());
    assert_eq!(
        c.problem("slices").as_deref(),
        Some("watch of slices failing: over budget")
    );
}
