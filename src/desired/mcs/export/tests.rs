use super::*;
use crate::desired::mcs::test_support::*;
use crate::desired::mcs::types::{ClusterStatus, ServiceImportStatus};
use crate::desired::mcs::{HOLDER_ANNOTATION, OWNER_LABEL};
use crate::desired::options::MANAGED_BY;
use serde_json::json;

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// `(status, reason)` of each of our conditions, `None` where absent.
fn summary(conditions: &[Condition]) -> [Option<(String, String)>; 3] {
    [CONDITION_VALID, CONDITION_READY, CONDITION_CONFLICT]
        .map(|t| find(conditions, t).map(|c| (c.status.clone(), c.reason.clone())))
}

fn s(status: &str, reason: &str) -> Option<(String, String)> {
    Some((status.to_string(), reason.to_string()))
}

fn import_listing(clusters: &[&str]) -> ServiceImport {
    ServiceImport {
        status: Some(ServiceImportStatus {
            clusters: clusters
                .iter()
                .map(|c| ClusterStatus {
                    cluster: c.to_string(),
                })
                .collect(),
            ..ServiceImportStatus::default()
        }),
        ..ServiceImport::default()
    }
}

#[test]
fn one_cluster_table() {
    let now = time("2024-06-01T00:00:00Z");
    let ex = export("east", "2024-01-01T00:00:00Z");
    let svc = hello();
    let external = hello_with(
        json!({"type": "ExternalName", "externalName": "example.com",
                                         "clusterIP": null, "clusterIPs": null}),
    );
    let listed = import_listing(&["east"]);
    let other = import_listing(&["west"]);
    let cases = [
        (
            "valid and imported",
            Some(&svc),
            Some(&listed),
            [
                s("True", "Valid"),
                s("True", "Exported"),
                s("False", "NoConflicts"),
            ],
        ),
        (
            "valid, not imported yet",
            Some(&svc),
            None,
            [
                s("True", "Valid"),
                s("False", "Pending"),
                s("False", "NoConflicts"),
            ],
        ),
        (
            "valid, the import lists others only",
            Some(&svc),
            Some(&other),
            [
                s("True", "Valid"),
                s("False", "Pending"),
                s("False", "NoConflicts"),
            ],
        ),
        (
            "no Service",
            None,
            Some(&listed),
            [s("False", "NoService"), s("False", "Failed"), None],
        ),
        (
            "ExternalName (conformance: Valid False)",
            Some(&external),
            None,
            [s("False", "InvalidServiceType"), s("False", "Failed"), None],
        ),
    ];
    for (what, service, import, want) in cases {
        let exports = [member("east", &ex, service)];
        let got = export_conditions("east", &exports, import, &now).unwrap();
        assert_eq!(summary(&got), want, "{what}");
        assert!(
            got.iter()
                .all(|c| c.last_transition_time == now && c.observed_generation == Some(1)),
            "{what}"
        );
    }
}

#[test]
fn conflict_is_set_on_the_winner_and_the_loser() {
    let now = time("2024-06-01T00:00:00Z");
    let (older, newer) = (
        export("east", "2024-01-01T00:00:00Z"),
        export("west", "2024-01-01T00:00:02Z"),
    );
    let (a, b) = (hello(), hello_with(json!({"clusterIP": "None"})));
    let exports = [
        member("east", &older, Some(&a)),
        member("west", &newer, Some(&b)),
    ];
    for local in ["east", "west"] {
        let got = export_conditions(local, &exports, None, &now).unwrap();
        let c = find(&got, CONDITION_CONFLICT).unwrap();
        assert_eq!(
            (c.status.as_str(), c.reason.as_str()),
            ("True", "TypeConflict")
        );
        assert!(
            c.message.contains("\"east\"") && c.message.contains("\"west\""),
            "{}",
            c.message
        );
    }
}

#[test]
fn several_conflicts_combine_with_commas() {
    let now = time("2024-06-01T00:00:00Z");
    let (older, newer) = (
        export("east", "2024-01-01T00:00:00Z"),
        export("west", "2024-01-01T00:00:02Z"),
    );
    let (a, b) = (
        hello(),
        hello_with(
            json!({"sessionAffinity": "None", "sessionAffinityConfig": null,
                              "ports": [{"name": "tcp", "port": 43, "protocol": "TCP"}]}),
        ),
    );
    let exports = [
        member("east", &older, Some(&a)),
        member("west", &newer, Some(&b)),
    ];
    let got = export_conditions("west", &exports, None, &now).unwrap();
    let c = find(&got, CONDITION_CONFLICT).unwrap();
    assert_eq!(c.reason, "PortConflict,SessionAffinityConflict");
    // the CRD's pattern for a reason
    assert!(
        c.reason
            .chars()
            .all(|ch| ch.is_ascii_alphanumeric() || ch == ',')
    );
    assert!(
        c.message.starts_with("ports: ") && c.message.contains(". sessionAffinity: "),
        "{}",
        c.message
    );
}

#[test]
fn an_invalid_export_is_left_out_of_the_others_conflicts() {
    let now = time("2024-06-01T00:00:00Z");
    let (older, newer) = (
        export("east", "2024-01-01T00:00:00Z"),
        export("west", "2024-01-01T00:00:02Z"),
    );
    let external = hello_with(json!({"type": "ExternalName", "externalName": "x.example",
                                         "clusterIP": null}));
    let svc = hello();
    let exports = [
        member("east", &older, Some(&external)),
        member("west", &newer, Some(&svc)),
    ];
    let got = export_conditions("west", &exports, None, &now).unwrap();
    assert_eq!(
        summary(&got)[2],
        s("False", "NoConflicts"),
        "east's ExternalName is not a member, so west has nobody to disagree with"
    );
}

#[test]
fn last_transition_time_holds_while_the_status_does() {
    let t0 = time("2024-06-01T00:00:00Z");
    let t1 = time("2024-06-02T00:00:00Z");
    let svc = hello();
    let mut ex = export("east", "2024-01-01T00:00:00Z");
    let first = export_conditions("east", &[member("east", &ex, Some(&svc))], None, &t0).unwrap();
    ex.status = Some(ServiceExportStatus {
        conditions: first.clone(),
    });

    // the same inputs later: nothing changes, nothing to write
    let again = export_conditions("east", &[member("east", &ex, Some(&svc))], None, &t1).unwrap();
    assert_eq!(again, first);
    assert_eq!(export_status_change(&ex, again), None);

    // Ready turns True: only Ready takes the new time
    let listed = import_listing(&["east"]);
    let later = export_conditions(
        "east",
        &[member("east", &ex, Some(&svc))],
        Some(&listed),
        &t1,
    )
    .unwrap();
    assert_eq!(
        find(&later, CONDITION_READY).unwrap().last_transition_time,
        t1
    );
    assert_eq!(
        find(&later, CONDITION_VALID).unwrap().last_transition_time,
        t0
    );
    assert_eq!(
        find(&later, CONDITION_CONFLICT)
            .unwrap()
            .last_transition_time,
        t0
    );
    let written = export_status_change(&ex, later.clone()).expect("Ready changed");
    assert_eq!(written.status.unwrap().conditions, later);

    // a reason or message change under the same status keeps the time
    let mut gen2 = ex.clone();
    gen2.metadata.generation = Some(2);
    let bumped =
        export_conditions("east", &[member("east", &gen2, Some(&svc))], None, &t1).unwrap();
    let valid = find(&bumped, CONDITION_VALID).unwrap();
    assert_eq!(
        (
            valid.last_transition_time.clone(),
            valid.observed_generation
        ),
        (t0, Some(2))
    );
}

#[test]
fn other_conditions_are_kept_and_a_stale_conflict_goes() {
    let now = time("2024-06-01T00:00:00Z");
    let other = Condition {
        type_: "example.com/Audited".into(),
        status: "True".into(),
        reason: "Audited".into(),
        message: String::new(),
        last_transition_time: time("2023-01-01T00:00:00Z"),
        observed_generation: None,
    };
    let stale_conflict = Condition {
        type_: CONDITION_CONFLICT.into(),
        status: "True".into(),
        reason: "PortConflict".into(),
        ..other.clone()
    };
    let mut ex = export("east", "2024-01-01T00:00:00Z");
    ex.status = Some(ServiceExportStatus {
        conditions: vec![other.clone(), stale_conflict],
    });
    // the Service is gone: no Conflict condition any more
    let got = export_conditions("east", &[member("east", &ex, None)], None, &now).unwrap();
    let types: Vec<&str> = got.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, ["example.com/Audited", "Valid", "Ready"]);
    assert_eq!(got[0], other);
}

#[test]
fn the_local_export_must_be_given() {
    let now = time("2024-06-01T00:00:00Z");
    let ex = export("east", "2024-01-01T00:00:00Z");
    let err = export_conditions("west", &[member("east", &ex, None)], None, &now).unwrap_err();
    assert_eq!(err, McsError::NoLocalExport("west".into()));
}

#[test]
fn messages_are_bounded() {
    let long = "é".repeat(MESSAGE_MAX);
    let cut = bounded(long);
    assert!(cut.len() <= MESSAGE_MAX && cut.is_char_boundary(cut.len()));
    assert_eq!(bounded("short".into()), "short");
}

#[test]
fn the_conflict_names_the_holder_the_import_records() {
    let now = time("2024-06-01T00:00:00Z");
    // south came later, claiming an export older than east's
    let (east, south) = (
        export("east", "2024-01-01T00:00:00Z"),
        export("south", "2020-01-01T00:00:00Z"),
    );
    let (a, b) = (
        hello(),
        hello_with(json!({"internalTrafficPolicy": "Local"})),
    );
    let exports = [
        member("east", &east, Some(&a)),
        member("south", &south, Some(&b)),
    ];
    let mut held = import_listing(&["east", "south"]);
    held.metadata.labels = Some([(OWNER_LABEL.into(), MANAGED_BY.into())].into());
    held.metadata.annotations = Some([(HOLDER_ANNOTATION.into(), "east".into())].into());
    let got = export_conditions("east", &exports, Some(&held), &now).unwrap();
    let c = find(&got, CONDITION_CONFLICT).unwrap();
    assert_eq!(c.reason, "InternalTrafficPolicyConflict");
    assert!(
        c.message
            .contains("the import takes cluster \"east\"'s, which the import holds"),
        "{}",
        c.message
    );
    // a ServiceImport that is not ours records nothing: the oldest
    held.metadata.labels = None;
    let got = export_conditions("east", &exports, Some(&held), &now).unwrap();
    let c = find(&got, CONDITION_CONFLICT).unwrap();
    assert!(
        c.message
            .contains("the oldest export's (cluster \"south\")"),
        "{}",
        c.message
    );
}
