use super::*;
use crate::desired::mcs::import::{Import, import};
use crate::desired::mcs::judge::ClusterExport;
use crate::desired::mcs::test_support::*;
use crate::desired::mcs::types::{ClusterStatus, ServiceExport};
use crate::desired::mcs::{COPIED_LABELS_ANNOTATION, DERIVED_SERVICE_ANNOTATION};
use crate::desired::test_support::endpoint;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};

fn kcm_slice(endpoints: Vec<Value>) -> EndpointSlice {
    serde_json::from_value(json!({
            "metadata": {"name": "hello-abc", "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "hello",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "tcp", "port": 42, "protocol": "TCP"}],
            "endpoints": endpoints,
        }))
        .unwrap()
}

/// The desired objects of hello exported by east (with one endpoint), the ServiceImport
/// live with a uid.
fn desired_with(ex: &ServiceExport, svc: &k8s_openapi::api::core::v1::Service) -> Import {
    let slice = kcm_slice(vec![endpoint("10.1.0.5")]);
    let exports = [ClusterExport {
        cluster: "east",
        export: ex,
        service: Some(svc),
        slices: vec![&slice],
    }];
    let first = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let mut live = first.service_import.clone();
    live.metadata.uid = Some("si-uid".into());
    import("shop", "hello", &exports, Some(&live), None)
        .unwrap()
        .unwrap()
}

fn desired() -> Import {
    desired_with(&export("east", "2024-01-01T00:00:00Z"), &hello())
}

/// `desired` as the API server returns it, with a label and an annotation someone added.
fn live_import(desired: &ServiceImport) -> ServiceImport {
    let mut si = desired.clone();
    si.metadata.uid = Some("si-uid".into());
    si.metadata.resource_version = Some("7".into());
    si.metadata
        .labels
        .get_or_insert_default()
        .insert("team".into(), "payments".into());
    si.metadata
        .annotations
        .get_or_insert_default()
        .insert("note".into(), "local".into());
    si
}

/// The derived Service as the API server returns it.
fn live_service(desired: &Service) -> Service {
    let mut v = serde_json::to_value(desired).unwrap();
    v["metadata"]["uid"] = json!("derived-uid");
    v["metadata"]["resourceVersion"] = json!("9");
    let s = &mut v["spec"];
    if s.get("clusterIP").is_none() {
        s["clusterIP"] = json!("10.96.7.7");
        s["clusterIPs"] = json!(["10.96.7.7"]);
    }
    s["ipFamilies"] = json!(["IPv4"]);
    if s.get("ipFamilyPolicy").is_none() {
        s["ipFamilyPolicy"] = json!("RequireDualStack");
    }
    s["internalTrafficPolicy"] = json!("Cluster");
    if s.get("sessionAffinity").is_none() {
        s["sessionAffinity"] = json!("None");
    }
    for p in s["ports"].as_array_mut().unwrap() {
        p["targetPort"] = p["port"].clone();
    }
    serde_json::from_value(v).unwrap()
}

/// `object` with the label `key` set to `value`, or removed.
fn with_label<T: kube::Resource + Clone>(object: &T, key: &str, value: Option<&str>) -> T {
    let mut o = object.clone();
    let labels = o.meta_mut().labels.get_or_insert_default();
    match value {
        Some(v) => labels.insert(key.into(), v.into()),
        None => labels.remove(key),
    };
    o
}

#[test]
fn ownership_table() {
    let d = desired();
    let si = d.service_import.clone();
    let svc = d.derived.clone().unwrap();
    let slice = d.slices[0].clone();

    assert!(import_is_ours(&si));
    assert!(!import_is_ours(&with_label(&si, OWNER_LABEL, None)));
    assert!(!import_is_ours(&with_label(&si, OWNER_LABEL, Some("Helm"))));
    assert!(!import_is_ours(&ServiceImport::default()));

    assert!(derived_is_ours(&svc));
    assert!(!derived_is_ours(&with_label(&svc, OWNER_LABEL, None)));
    assert!(!derived_is_ours(&with_label(
        &svc,
        MCS_SERVICE_NAME_LABEL,
        None
    )));
    // a label-mode follower of the same name is not a derived Service
    let follower = crate::desired::follower(
        &crate::desired::test_support::cluster_ip_service(),
        &[],
        &crate::desired::test_support::opts(crate::desired::EndpointsMode::Slices),
    )
    .unwrap();
    assert!(!derived_is_ours(&follower.service));

    assert!(slice_is_ours(&slice));
    assert_eq!(slice_source_cluster(&slice), Some("east"));
    assert!(!slice_is_ours(&with_label(
        &slice,
        MANAGED_BY_LABEL,
        Some("endpointslice-controller.k8s.io")
    )));
    assert!(!slice_is_ours(&with_label(
        &slice,
        MCS_SERVICE_NAME_LABEL,
        None
    )));
    assert!(!slice_is_ours(&with_label(
        &slice,
        MCS_SOURCE_CLUSTER_LABEL,
        None
    )));
    // a label-mode follower slice (our managed-by, a source cluster, no MCS service name)
    let s = crate::desired::test_support::slice(
        "web-abc",
        "IPv4",
        crate::desired::test_support::web_ports(),
        vec![endpoint("10.0.0.1")],
    );
    let follower = crate::desired::follower(
        &crate::desired::test_support::cluster_ip_service(),
        &[&s],
        &crate::desired::test_support::opts(crate::desired::EndpointsMode::Slices),
    )
    .unwrap();
    assert!(!slice_is_ours(&follower.slices[0]));
    assert_eq!(slice_source_cluster(&follower.slices[0]), None);
}

#[test]
fn not_ours_is_never_written() {
    let d = desired();
    let foreign_si = with_label(&live_import(&d.service_import), OWNER_LABEL, None);
    assert_eq!(
        import_change(Some(&foreign_si), &d.service_import),
        Change::NotOurs
    );
    assert_eq!(
        import_status_change(&foreign_si, &d.service_import),
        Change::NotOurs
    );
    let derived = d.derived.as_ref().unwrap();
    let mut foreign_svc = live_service(derived);
    foreign_svc.metadata.labels = Some([("app".to_string(), "web".to_string())].into());
    assert_eq!(derived_change(Some(&foreign_svc), derived), Change::NotOurs);
    let kcm = kcm_slice(vec![endpoint("10.1.0.5")]);
    assert_eq!(mcs_slice_change(Some(&kcm), &d.slices[0]), Change::NotOurs);
    assert!(surplus_slices(&[&kcm], "hello", &[]).is_empty());
}

#[test]
fn import_change_cases() {
    let d = desired();
    let desired = &d.service_import;

    // nothing live: create, without status (a subresource)
    match import_change(None, desired) {
        Change::Create(si) => {
            assert!(si.status.is_none());
            assert_eq!(si.spec, desired.spec);
        }
        other => panic!("{other:?}"),
    }

    // what others added is no difference
    let live = live_import(desired);
    assert_eq!(import_change(Some(&live), desired), Change::Unchanged);

    // port order and an unset default are no difference either
    let mut reordered = live.clone();
    reordered.spec.ports.reverse();
    // the tcp port, now second, with the protocol left to its default
    reordered.spec.ports[1].protocol = String::new();
    let mut tcp_first = desired.clone();
    tcp_first
        .spec
        .ports
        .sort_by(|a, b| a.protocol.cmp(&b.protocol));
    assert_eq!(
        import_change(Some(&reordered), &tcp_first),
        Change::Unchanged
    );

    // a spec change is written over the live object
    let mut wider = desired.clone();
    wider.spec.ports[0].port = 43;
    match import_change(Some(&live), &wider) {
        Change::Update(si) => {
            assert_eq!(si.spec, wider.spec);
            assert_eq!(si.metadata.resource_version.as_deref(), Some("7"));
            assert_eq!(si.metadata.labels.as_ref().unwrap()["team"], "payments");
            assert_eq!(import_change(Some(&si), &wider), Change::Unchanged);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn labels_and_annotations_the_winner_stops_exporting_go() {
    let svc = hello();
    let mut ex = export("east", "2024-01-01T00:00:00Z");
    ex.spec.exported_labels.insert("tier".into(), "gold".into());
    ex.spec
        .exported_annotations
        .insert("example.com/owner".into(), "ops".into());
    let before = desired_with(&ex, &svc).service_import;
    let live = live_import(&before);
    assert_eq!(import_change(Some(&live), &before), Change::Unchanged);

    let after = desired().service_import;
    let Change::Update(updated) = import_change(Some(&live), &after) else {
        panic!("the dropped label and annotation must go");
    };
    let labels = updated.metadata.labels.as_ref().unwrap();
    let annotations = updated.metadata.annotations.as_ref().unwrap();
    assert!(!labels.contains_key("tier"), "{labels:?}");
    assert!(
        !annotations.contains_key("example.com/owner"),
        "{annotations:?}"
    );
    assert_eq!(labels["team"], "payments", "others' label stays");
    assert_eq!(annotations["note"], "local", "others' annotation stays");
    assert_eq!(annotations[COPIED_LABELS_ANNOTATION], "");
    assert!(annotations.contains_key(DERIVED_SERVICE_ANNOTATION));
    assert_eq!(import_change(Some(&updated), &after), Change::Unchanged);
}

#[test]
fn import_status_change_cases() {
    let d = desired();
    let desired = &d.service_import;
    let mut live = live_import(desired);
    live.status = None;
    let condition = Condition {
        type_: "Ready".into(),
        status: "True".into(),
        reason: "Ready".into(),
        message: String::new(),
        last_transition_time: time("2024-01-01T00:00:00Z"),
        observed_generation: None,
    };
    let Change::Update(updated) = import_status_change(&live, desired) else {
        panic!("the clusters must be written");
    };
    assert_eq!(updated.status.as_ref().unwrap().clusters.len(), 1);
    assert_eq!(import_status_change(&updated, desired), Change::Unchanged);

    // order does not matter; conditions others set are kept
    let two = |a: &str, b: &str| ServiceImportStatus {
        clusters: vec![
            ClusterStatus { cluster: a.into() },
            ClusterStatus { cluster: b.into() },
        ],
        conditions: vec![condition.clone()],
    };
    let mut want = desired.clone();
    want.status = Some(two("east", "west"));
    live.status = Some(two("west", "east"));
    assert_eq!(import_status_change(&live, &want), Change::Unchanged);
    live.status = Some(ServiceImportStatus {
        clusters: vec![ClusterStatus {
            cluster: "west".into(),
        }],
        conditions: vec![condition.clone()],
    });
    let Change::Update(updated) = import_status_change(&live, &want) else {
        panic!("east must be added");
    };
    let status = updated.status.unwrap();
    assert_eq!(status.clusters.len(), 2);
    assert_eq!(status.conditions, vec![condition]);
}

#[test]
fn derived_change_cases() {
    let d = desired();
    let desired = d.derived.as_ref().unwrap();
    assert_eq!(
        derived_change(None, desired),
        Change::Create(desired.clone())
    );
    let live = live_service(desired);
    assert_eq!(derived_change(Some(&live), desired), Change::Unchanged);

    // the API server may add the secondary family under PreferDualStack
    let mut dual_desired = desired.clone();
    dual_desired.spec.as_mut().unwrap().ip_family_policy = Some("PreferDualStack".into());
    let mut dual_live = live_service(&dual_desired);
    let spec = dual_live.spec.as_mut().unwrap();
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    spec.cluster_ips = Some(vec!["10.96.7.7".into(), "fd00::7".into()]);
    assert_eq!(
        derived_change(Some(&dual_live), &dual_desired),
        Change::Unchanged
    );
    // ... and back to single stack drops it
    let Change::Update(single) = derived_change(Some(&dual_live), desired) else {
        panic!("dual to single stack is an update");
    };
    let spec = single.spec.as_ref().unwrap();
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    assert_eq!(spec.cluster_ips, Some(vec!["10.96.7.7".to_string()]));
    assert_eq!(derived_change(Some(&single), desired), Change::Unchanged);

    // another primary family cannot be set in place
    let mut v6 = desired.clone();
    v6.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
    assert_eq!(
        derived_change(Some(&live), &v6),
        Change::Recreate(v6.clone())
    );

    // ClusterIP to headless neither
    let mut headless = desired.clone();
    let spec = headless.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.ip_families = None;
    spec.ip_family_policy = None;
    assert!(matches!(
        derived_change(Some(&live), &headless),
        Change::Recreate(_)
    ));

    // traffic fields and the owner are ours
    let mut local = desired.clone();
    let spec = local.spec.as_mut().unwrap();
    spec.internal_traffic_policy = Some("Local".into());
    spec.traffic_distribution = Some("PreferClose".into());
    let Change::Update(updated) = derived_change(Some(&live), &local) else {
        panic!("traffic fields changed");
    };
    let spec = updated.spec.as_ref().unwrap();
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
    assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(spec.cluster_ip.as_deref(), Some("10.96.7.7"), "kept");
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("9"));
    assert_eq!(derived_change(Some(&updated), &local), Change::Unchanged);

    let mut orphan = live.clone();
    orphan.metadata.owner_references = None;
    let Change::Update(adopted) = derived_change(Some(&orphan), desired) else {
        panic!("a missing owner is a difference");
    };
    assert_eq!(
        adopted.metadata.owner_references,
        desired.metadata.owner_references
    );

    // a port change is an update (the follower comparison's)
    let mut wider = desired.clone();
    wider.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 43;
    assert!(matches!(
        derived_change(Some(&live), &wider),
        Change::Update(_)
    ));
}

#[test]
fn slice_change_cases() {
    let d = desired();
    let desired = &d.slices[0];
    assert_eq!(
        mcs_slice_change(None, desired),
        Change::Create(desired.clone())
    );
    let mut live = desired.clone();
    live.metadata.resource_version = Some("3".into());
    assert_eq!(mcs_slice_change(Some(&live), desired), Change::Unchanged);

    let mut flipped = desired.clone();
    flipped.endpoints[0].conditions.as_mut().unwrap().ready = Some(false);
    let Change::Update(updated) = mcs_slice_change(Some(&live), &flipped) else {
        panic!("a condition flip is written");
    };
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("3"));

    let mut v6 = desired.clone();
    v6.address_type = "IPv6".into();
    assert_eq!(
        mcs_slice_change(Some(&live), &v6),
        Change::Recreate(v6.clone())
    );
}

#[test]
fn surplus_slices_are_ours_of_this_import_and_undesired() {
    let d = desired();
    let ours = d.slices[0].clone();
    let mut other_import = ours.clone();
    other_import
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MCS_SERVICE_NAME_LABEL.into(), "web".into());
    let mut stale = ours.clone();
    stale.metadata.name = Some("derived-x-0a1b2c3d-0".into());
    let live = [&ours, &other_import, &stale];
    let surplus = surplus_slices(&live, "hello", &d.slices);
    assert_eq!(surplus, [&stale]);
}
