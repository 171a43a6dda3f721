use super::test_support::*;
use super::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::json;

#[test]
fn options_selectors_and_annotations() {
    let o = opts(EndpointsMode::Slices);
    assert_eq!(o.export_selector(), "fair.com/cross-cluster=true");
    assert_eq!(o.follower_selector(), "fair.com/cross-cluster=follower");
    assert_eq!(
        o.foreign_slice_selector(),
        "endpointslice.kubernetes.io/managed-by!=endpointslice-controller.k8s.io,\
             kubernetes.io/service-name,fair.com/cross-cluster notin (true,follower),\
             !multicluster.kubernetes.io/service-name"
    );
    assert_eq!(
        o.origin_cluster_annotation(),
        "fair.com/cross-cluster-origin-cluster"
    );
    assert_eq!(
        o.origin_object_annotation(),
        "fair.com/cross-cluster-origin-object"
    );
    assert_eq!(
        o.origin_uid_annotation(),
        "fair.com/cross-cluster-origin-uid"
    );

    let bare = Options {
        label_key: "mirror".to_string(),
        ..o
    };
    assert_eq!(bare.origin_cluster_annotation(), "mirror-origin-cluster");
    assert_eq!(bare.origin_object_annotation(), "mirror-origin-object");
    assert_eq!(bare.origin_uid_annotation(), "mirror-origin-uid");
}

#[test]
fn modes_produce_the_right_objects() {
    let svc = cluster_ip_service();
    let s = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);

    let f = follower(&svc, &[&s], &opts(EndpointsMode::Slices)).unwrap();
    assert_eq!(f.slices.len(), 1);
    assert!(f.endpoints.is_none());

    let f = follower(&svc, &[&s], &opts(EndpointsMode::Endpoints)).unwrap();
    assert!(f.slices.is_empty());
    let ep = f.endpoints.unwrap();
    let labels = ep.metadata.labels.unwrap();
    assert!(!labels.contains_key(SKIP_MIRROR_LABEL));
    assert_eq!(labels["fair.com/cross-cluster"], "follower");

    let f = follower(&svc, &[&s], &opts(EndpointsMode::Both)).unwrap();
    assert_eq!(f.slices.len(), 1);
    let labels = f.endpoints.unwrap().metadata.labels.unwrap();
    assert_eq!(labels[SKIP_MIRROR_LABEL], "true");
    // The slices never carry skip-mirror.
    assert!(
        !f.slices[0]
            .metadata
            .labels
            .as_ref()
            .unwrap()
            .contains_key(SKIP_MIRROR_LABEL)
    );
}

#[test]
fn skips_non_exported_and_unnamed_services() {
    let o = opts(EndpointsMode::Slices);
    let mut svc = cluster_ip_service();
    svc.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("fair.com/cross-cluster".into(), "follower".into());
    let err = follower(&svc, &[], &o).unwrap_err();
    assert_eq!(err.reason(), "NotExported");

    let mut svc = cluster_ip_service();
    svc.metadata.name = None;
    assert_eq!(follower(&svc, &[], &o).unwrap_err(), Skip::MissingName);

    let mut svc = cluster_ip_service();
    svc.metadata.namespace = Some(String::new());
    let err = follower(&svc, &[], &o).unwrap_err();
    assert_eq!(err, Skip::MissingNamespace);
    assert_eq!(err.reason(), "MissingNamespace");
}

#[test]
fn annotations_too_large_are_skipped() {
    let mut o = opts(EndpointsMode::Both);
    o.cluster_name = "x".repeat(300 * 1024);
    let err = follower(&cluster_ip_service(), &[], &o).unwrap_err();
    assert!(matches!(err, Skip::AnnotationsTooLarge { .. }), "{err:?}");
    assert_eq!(err.reason(), "AnnotationsTooLarge");
    assert!(err.to_string().contains("262144"));
}

#[test]
fn invalid_labels_are_skipped() {
    let mut svc = cluster_ip_service();
    svc.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "y".repeat(64));
    let err = follower(&svc, &[], &opts(EndpointsMode::Slices)).unwrap_err();
    assert_eq!(err.reason(), "LabelsInvalid");
    assert!(matches!(err, Skip::LabelsInvalid { ref key, .. } if key == "team"));

    let mut svc = cluster_ip_service();
    svc.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("bad key!".into(), "v".into());
    let err = follower(&svc, &[], &opts(EndpointsMode::Slices)).unwrap_err();
    assert_eq!(err.reason(), "LabelsInvalid");
}

#[test]
fn invalid_annotation_keys_are_skipped() {
    let mut o = opts(EndpointsMode::Slices);
    // A bare label key is a valid label key, but the derived annotation names exceed 63.
    o.label_key = "k".repeat(60);
    let mut svc = cluster_ip_service();
    svc.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(o.label_key.clone(), "true".into());
    let err = follower(&svc, &[], &o).unwrap_err();
    assert_eq!(err.reason(), "AnnotationsInvalid");
}

#[test]
fn recorded_origin_cases() {
    let o = opts(EndpointsMode::Both);
    let meta = |labels: serde_json::Value, annotations: serde_json::Value| -> ObjectMeta {
        serde_json::from_value(json!({"name": "web", "namespace": "shop",
                                          "labels": labels, "annotations": annotations}))
        .unwrap()
    };
    let from = |names: &[&str]| Recorded::From(names.iter().map(|n| n.to_string()).collect());
    let follower_label = json!({"fair.com/cross-cluster": "follower"});
    let one = json!({"fair.com/cross-cluster-origin-cluster": "remote-a"});
    let merged = json!({"fair.com/cross-cluster-origin-cluster": "remote-a",
                            "fair.com/cross-cluster-origin-clusters": "remote-a,remote-b"});

    assert_eq!(
        recorded(&meta(follower_label.clone(), one.clone()), &o),
        from(&["remote-a"])
    );
    assert_eq!(
        recorded(&meta(follower_label.clone(), merged), &o),
        from(&["remote-a", "remote-b"])
    );
    assert_eq!(
        recorded(&meta(follower_label.clone(), json!({})), &o),
        Recorded::GoEra
    );
    assert_eq!(
        recorded(
            &meta(json!({"fair.com/cross-cluster": "true"}), one.clone()),
            &o
        ),
        Recorded::NotOurs
    );
    assert_eq!(
        recorded(&meta(json!(null), json!(null)), &o),
        Recorded::NotOurs
    );

    let slice = |managed_by: &str, annotations: serde_json::Value| -> ObjectMeta {
        meta(
            json!({"fair.com/cross-cluster": "follower",
                       "endpointslice.kubernetes.io/managed-by": managed_by}),
            annotations,
        )
    };
    assert_eq!(
        slice_recorded(&slice(MANAGED_BY, one.clone()), &o),
        from(&["remote-a"])
    );
    assert_eq!(
        slice_recorded(&slice(MANAGED_BY, json!({})), &o),
        Recorded::GoEra
    );
    assert_eq!(
        slice_recorded(&slice("endpointslicemirroring-controller.k8s.io", one), &o),
        Recorded::NotOurs
    );
}

#[test]
fn a_follower_a_local_user_took_over_is_not_ours() {
    let o = opts(EndpointsMode::Slices);
    let follower_svc = |extra: serde_json::Value| -> k8s_openapi::api::core::v1::Service {
        let mut v = json!({"metadata": {"name": "web", "namespace": "shop",
                "labels": {"fair.com/cross-cluster": "follower"},
                "annotations": {"fair.com/cross-cluster-origin-cluster": "remote-a"}},
                "spec": {"ports": [{"port": 80}]}});
        json_merge(&mut v, extra);
        serde_json::from_value(v).unwrap()
    };
    let ours = follower_svc(json!({"metadata": {"managedFields": [
            {"manager": "cross-cluster-controller", "operation": "Update",
             "fieldsV1": {"f:spec": {"f:ports": {}}}},
            {"manager": "kubectl-label", "operation": "Update",
             "fieldsV1": {"f:metadata": {"f:labels": {}}}}]}}));
    assert_eq!(taken_over(&ours, &o), None);
    assert!(recorded(&ours.metadata, &o).names("remote-a"));

    let selector = follower_svc(json!({"spec": {"selector": {"app": "api"}}}));
    assert_eq!(taken_over(&selector, &o), Some("it has a selector"));
    let applied = follower_svc(json!({"metadata": {"annotations": {
            "kubectl.kubernetes.io/last-applied-configuration": "{}"}}}));
    assert!(taken_over(&applied, &o).is_some());
    assert_eq!(recorded(&applied.metadata, &o), Recorded::NotOurs);
    let ssa = follower_svc(json!({"metadata": {"managedFields": [
            {"manager": "kubectl", "operation": "Apply",
             "fieldsV1": {"f:spec": {"f:ports": {}}}}]}}));
    assert!(taken_over(&ssa, &o).is_some());
    assert_eq!(recorded(&ssa.metadata, &o), Recorded::NotOurs);
    let edited = follower_svc(json!({"metadata": {"managedFields": [
            {"manager": "kubectl-edit", "operation": "Update",
             "fieldsV1": {"f:spec": {"f:selector": {}}}}]}}));
    assert!(taken_over(&edited, &o).is_some());
    // a Service that is no follower is not "taken over": it was never ours
    let mut plain = selector.clone();
    plain.metadata.labels = None;
    assert_eq!(taken_over(&plain, &o), None);
}

fn json_merge(a: &mut serde_json::Value, b: serde_json::Value) {
    match (a, b) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in b {
                json_merge(a.entry(k).or_insert(serde_json::Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

#[test]
fn generated_objects_record_their_remote() {
    let o = opts(EndpointsMode::Both);
    let s = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let f = follower(&cluster_ip_service(), &[&s], &o).unwrap();
    assert!(recorded(&f.service.metadata, &o).names("remote-a"));
    assert!(slice_recorded(&f.slices[0].metadata, &o).names("remote-a"));
    assert!(recorded(&f.endpoints.as_ref().unwrap().metadata, &o).names("remote-a"));
    let labels = f.slices[0].metadata.labels.as_ref().unwrap();
    assert_eq!(labels["fair.com/cross-cluster-origin-cluster"], "remote-a");
}

#[test]
fn slices_of_other_services_are_ignored() {
    let o = opts(EndpointsMode::Slices);
    let mine = slice("web-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let mut foreign = slice("api-abc", "IPv4", web_ports(), vec![endpoint("10.0.0.2")]);
    foreign
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.into(), "api".into());
    let mut elsewhere = slice("web-xyz", "IPv4", web_ports(), vec![endpoint("10.0.0.3")]);
    elsewhere.metadata.namespace = Some("other".into());
    let f = follower(&cluster_ip_service(), &[&mine, &foreign, &elsewhere], &o).unwrap();
    assert_eq!(f.slices.len(), 1);
    assert_eq!(f.slices[0].endpoints.len(), 1);
    assert_eq!(f.slices[0].endpoints[0].addresses, vec!["10.0.0.1"]);
}
