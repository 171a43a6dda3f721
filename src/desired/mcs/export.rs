//! The status of the local cluster's ServiceExport: the `Valid`, `Ready` and `Conflict`
//! conditions mcs-api v0.5.0 defines, judged from every cluster's export of the key.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::error::McsError;
use super::import::holder;
use super::judge::{ClusterExport, Validity, cut_at, judge, validity};
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
/// ServiceImport of the key, if any: the export is `Ready` once it lists `local`, and the holder
/// it records wins as it does in the import (see `judge`).
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
    // the winner the import took, so the conditions name it
    let judgement = judge(namespace, name, exports, holder(local_import))?;
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
fn bounded(message: String) -> String {
    cut_at(message, MESSAGE_MAX)
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
mod tests;
