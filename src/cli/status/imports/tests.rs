use serde_json::json;

use super::*;
use crate::cli::status::{Inputs, exit_code, report, table};

/// The metadata of a ServiceImport with this endpoints annotation (None: without it).
fn import(ns: &str, name: &str, endpoints: Option<&str>) -> ObjectMeta {
    let mut m = json!({"namespace": ns, "name": name,
        "labels": {"app.kubernetes.io/managed-by": crate::desired::MANAGED_BY}});
    if let Some(e) = endpoints {
        m["annotations"] = json!({ENDPOINTS_ANNOTATION: e});
    }
    serde_json::from_value(m).unwrap()
}

const WEB: &str = r#"{"east":{"ready":2,"total":2},"north":{"ready":0,"total":2,"cutOff":true},"west":{"ready":0,"total":2}}"#;

fn inputs(imports: Vec<ObjectMeta>) -> Inputs {
    Inputs {
        health: vec![],
        election: None,
        services: vec![],
        slices: vec![],
        events: vec![],
        imports,
    }
}

fn now() -> k8s_openapi::jiff::Timestamp {
    "2026-01-01T00:10:00Z".parse().unwrap()
}

#[test]
fn each_import_lists_its_clusters_in_the_table() {
    let r = report(
        &inputs(vec![
            import("shop", "web", Some(WEB)),
            import(
                "bank",
                "db",
                Some(r#"{"south":{"ready":1,"total":3,"stale":true}}"#),
            ),
            import("shop", "old", None),
            import("shop", "gone", Some("{}")),
        ]),
        &crate::fixtures::opts(),
        now(),
    );
    let t = table(&r, now());
    let section: Vec<&str> = t.lines().skip_while(|l| !l.starts_with("IMPORT")).collect();
    assert_eq!(
        section,
        [
            "IMPORT     ENDPOINTS (ready/total per cluster)",
            "bank/db    south 1/3 stale",
            "shop/gone  no cluster exports it",
            "shop/web   east 2/2, north 0/2 cut off, west 0/2",
        ],
        "{t}"
    );
}

#[test]
fn the_json_carries_the_parsed_annotation() {
    let r = report(
        &inputs(vec![import("shop", "web", Some(WEB))]),
        &crate::fixtures::opts(),
        now(),
    );
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(
        j["imports"],
        json!([{"namespace": "shop", "name": "web", "endpoints": {
            "east": {"ready": 2, "total": 2},
            "north": {"ready": 0, "total": 2, "cutOff": true},
            "west": {"ready": 0, "total": 2},
        }}])
    );
}

#[test]
fn an_edited_annotation_is_shown_unreadable_not_a_panic() {
    let edited = [
        import("shop", "web", Some("ready: 2")),
        import("shop", "db", Some(r#"{"east":{"ready":-1,"total":2}}"#)),
    ];
    let r = report(&inputs(edited.to_vec()), &crate::fixtures::opts(), now());
    assert!(
        r.imports
            .iter()
            .all(|i| i.endpoints.is_none() && i.unreadable.is_some()),
        "{r:?}"
    );
    let t = table(&r, now());
    assert!(
        t.lines().any(|l| l.starts_with("shop/web")
            && l.contains("unreadable (cross-cluster-controller.fair.com/endpoints: ")),
        "{t}"
    );
    let j = serde_json::to_value(&r).unwrap();
    assert_eq!(j["imports"][1]["endpoints"], json!(null));
    assert!(j["imports"][1]["unreadable"].is_string());
    assert!(
        !table(
            &report(&inputs(vec![]), &crate::fixtures::opts(), now()),
            now()
        )
        .contains("IMPORT"),
        "no section without imports"
    );
}

#[test]
fn the_imports_change_no_exit_code() {
    // a leader renewing, no remote: all is well, whatever the imports say
    let mut healthy = inputs(vec![
        import("shop", "web", Some(WEB)),
        import("shop", "db", Some("edited")),
    ]);
    healthy.election = Some(
        serde_json::from_value(json!({"metadata": {"name": "ccc"},
            "spec": {"holderIdentity": "pod-1", "leaseDurationSeconds": 15,
                     "renewTime": "2026-01-01T00:09:58.000000Z"}}))
        .unwrap(),
    );
    let r = report(&healthy, &crate::fixtures::opts(), now());
    assert_eq!(r.imports.len(), 2);
    assert!(r.healthy, "{r:?}");
    assert_eq!(exit_code(&r), 0);
}
