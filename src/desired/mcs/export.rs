//! The status of the local cluster's ServiceExport: the `Valid`, `Ready` and `Conflict`
//! conditions mcs-api v0.5.0 defines, judged from every cluster's export of the key.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::error::McsError;
use super::judge::{ClusterExport, Validity, judge, validity};
use super::types::{ServiceExport, ServiceExportStatus, ServiceImport};

/// The export's Service exists and can be exported.
pub const CONDITION_VALID: &str = "Valid";
/// The export is part of this cluster's ServiceImport.
pub const CONDITION_READY: &str = "Ready";
/// Exports of the key disagree on a Service-level property.
pub const CONDITION_CONFLICT: &str = "Conflict";

const TRUE: &str = "True";
const FALSE: &str = "False";
/// The API server's limit on a condition message.
const MESSAGE_MAX: usize = 32768;

/// The desired `status.conditions` of the local cluster's ServiceExport.
///
/// `exports` holds every cluster's export of one namespace/name, the local one (`local`)
/// included, each with its Service if that cluster has one. `local_import` is the live local
/// ServiceImport of the key, if any: the export is `Ready` once it lists `local`.
///
/// * `Valid`: True (`Valid`), or False with `NoService` or `InvalidServiceType` (ExternalName).
/// * `Ready`: True (`Exported`) once the local ServiceImport lists this cluster; False with
///   `Pending` before, or with `Failed` for an export that is not valid.
/// * `Conflict`: set on every valid export of the key, as KEP-1645 asks (the conformance suite
///   checks both the winning and the losing cluster): True with the reasons of every property
///   the exports disagree on, comma-separated, and a message naming the winner and the clusters
///   that differ; False (`NoConflicts`) otherwise. An export that is not valid takes no part in
///   the merge and has no `Conflict` condition.
///
/// Conditions of other types are kept; ours keep their `lastTransitionTime` while their status
/// holds, and take `now` when it changes. `observedGeneration` is the export's generation.
pub fn export_conditions(
    local: &str,
    exports: &[ClusterExport<'_>],
    local_import: Option<&ServiceImport>,
    now: &Time,
) -> Result<Vec<Condition>, McsError> {
    let mine = exports
        .iter()
        .find(|e| e.cluster == local)
        .ok_or_else(|| McsError::NoLocalExport(local.to_string()))?;
    let meta = &mine.export.metadata;
    let (namespace, name) = (
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
    );
    let judgement = judge(namespace, name, exports)?;
    let key = format!("{namespace}/{name}");

    let validity = validity(mine);
    let valid = match validity {
        Validity::Valid => (TRUE, format!("Service {key} can be exported")),
        Validity::NoService => (FALSE, format!("there is no Service {key} in this cluster")),
        Validity::InvalidServiceType => (
            FALSE,
            format!("Service {key} is of type ExternalName, which cannot be exported"),
        ),
    };
    let listed = local_import
        .and_then(|si| si.status.as_ref())
        .is_some_and(|s| s.clusters.iter().any(|c| c.cluster == local));
    let ready = match (validity, listed) {
        (Validity::Valid, true) => (
            TRUE,
            "Exported",
            format!("the ServiceImport {key} lists cluster {local:?}"),
        ),
        (Validity::Valid, false) => (
            FALSE,
            "Pending",
            format!("waiting for the ServiceImport {key} to list cluster {local:?}"),
        ),
        (_, _) => (
            FALSE,
            "Failed",
            format!("the export is not valid: {}", valid.1),
        ),
    };
    let conflict = (validity == Validity::Valid).then(|| {
        if judgement.conflicts.is_empty() {
            (FALSE, "NoConflicts".to_string(), String::new())
        } else {
            let reasons: Vec<&str> = judgement
                .conflicts
                .iter()
                .map(|c| c.reason.reason())
                .collect();
            let messages: Vec<String> = judgement.conflicts.iter().map(|c| c.message()).collect();
            (TRUE, reasons.join(","), messages.join(" "))
        }
    });

    let live: &[Condition] = mine
        .export
        .status
        .as_ref()
        .map_or(&[], |s| s.conditions.as_slice());
    let generation = meta.generation;
    let make = |type_: &str, status: &str, reason: &str, message: String| -> Condition {
        let held = live
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone());
        Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: bounded(message),
            last_transition_time: held.unwrap_or_else(|| now.clone()),
            observed_generation: generation,
        }
    };
    let mut ours = vec![
        make(CONDITION_VALID, valid.0, validity.reason(), valid.1.clone()),
        make(CONDITION_READY, ready.0, ready.1, ready.2),
    ];
    if let Some((status, reason, message)) = conflict {
        ours.push(make(CONDITION_CONFLICT, status, &reason, message));
    }

    // ours replace theirs in place; the rest keep their order; a Conflict we no longer set goes
    let mut out: Vec<Condition> = Vec::new();
    for c in live {
        if let Some(i) = ours.iter().position(|o| o.type_ == c.type_) {
            out.push(ours.remove(i));
        } else if c.type_ != CONDITION_CONFLICT {
            out.push(c.clone());
        }
    }
    out.extend(ours);
    Ok(out)
}

/// At most [`MESSAGE_MAX`] bytes, cut at a character boundary.
fn bounded(mut message: String) -> String {
    if message.len() > MESSAGE_MAX {
        let mut end = MESSAGE_MAX;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    message
}

/// Compares the live ServiceExport's conditions with the desired ones (by type, every field):
/// `None` when nothing needs writing, else the live export with the desired conditions, for a
/// write to its `status` subresource.
pub fn export_status_change(
    live: &ServiceExport,
    conditions: Vec<Condition>,
) -> Option<ServiceExport> {
    let by_type = |list: &[Condition]| -> BTreeMap<String, Condition> {
        list.iter().map(|c| (c.type_.clone(), c.clone())).collect()
    };
    let current = live.status.as_ref().map_or(&[][..], |s| &s.conditions[..]);
    if by_type(current) == by_type(&conditions) && current.len() == conditions.len() {
        return None;
    }
    let mut updated = live.clone();
    updated
        .status
        .get_or_insert_with(ServiceExportStatus::default)
        .conditions = conditions;
    Some(updated)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::mcs::test_support::*;
    use crate::desired::mcs::types::{ClusterStatus, ServiceImportStatus};
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
        let first =
            export_conditions("east", &[member("east", &ex, Some(&svc))], None, &t0).unwrap();
        ex.status = Some(ServiceExportStatus {
            conditions: first.clone(),
        });

        // the same inputs later: nothing changes, nothing to write
        let again =
            export_conditions("east", &[member("east", &ex, Some(&svc))], None, &t1).unwrap();
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
}
