//! Ownership ("is this live object ours?") and the "does the live object need a write?"
//! comparisons of the objects an import writes. A live object that is not ours is answered
//! [`Change::NotOurs`] before anything is compared: it is never written.

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::types::{ServiceImport, ServiceImportSpec, ServiceImportStatus};
use super::{COPIED_ANNOTATIONS_ANNOTATION, MCS_SERVICE_NAME_LABEL, OWNER_LABEL};
use crate::desired::api::{AFFINITY_NONE, ITP_CLUSTER, PROTOCOL_TCP, SINGLE_STACK};
use crate::desired::meta;
use crate::desired::options::{MANAGED_BY, MANAGED_BY_LABEL, MCS_SOURCE_CLUSTER_LABEL};
use crate::desired::service::{ServiceChange, service_change};
use crate::desired::slices::slice_change;

/// What to do with a live object, given the desired one.
#[derive(Clone, Debug, PartialEq)]
pub enum Change<T> {
    /// There is no live object: create this one.
    Create(T),
    /// The live object with our fields set: write it (it carries the live resourceVersion).
    Update(T),
    /// The change cannot be made in place: delete the live object (with its uid as a
    /// precondition) and create this one.
    Recreate(T),
    /// Every field we manage has its desired value: write nothing.
    Unchanged,
    /// The live object is not ours: never write or delete it (log it, count it, an Event).
    NotOurs,
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Whether a live ServiceImport is ours: it carries `app.kubernetes.io/managed-by` with our
/// [`MANAGED_BY`]. Another implementation's, or one made by hand, is not.
pub fn import_is_ours(si: &ServiceImport) -> bool {
    label(&si.metadata, OWNER_LABEL) == Some(MANAGED_BY)
}

/// Whether a live Service is a derived Service of ours: our `app.kubernetes.io/managed-by` and
/// the `multicluster.kubernetes.io/service-name` it derives from. A label-mode follower
/// (`<key>=follower`) never carries both, so neither mode takes the other's Services.
pub fn derived_is_ours(svc: &Service) -> bool {
    label(&svc.metadata, OWNER_LABEL) == Some(MANAGED_BY)
        && label(&svc.metadata, MCS_SERVICE_NAME_LABEL).is_some()
}

/// Whether a live EndpointSlice is an MCS slice of ours: our
/// `endpointslice.kubernetes.io/managed-by` and both MCS labels. Label-mode follower slices
/// carry the first and the source cluster but no `multicluster.kubernetes.io/service-name`.
pub fn slice_is_ours(slice: &EndpointSlice) -> bool {
    let m = &slice.metadata;
    label(m, MANAGED_BY_LABEL) == Some(MANAGED_BY)
        && label(m, MCS_SERVICE_NAME_LABEL).is_some()
        && label(m, MCS_SOURCE_CLUSTER_LABEL).is_some()
}

/// The cluster whose endpoints a slice of ours carries: deleting a slice the desired import no
/// longer has needs proof that this cluster stopped exporting (the same proof of absence the
/// label mode asks of a remote), not merely its absence from the inputs.
pub fn slice_source_cluster(slice: &EndpointSlice) -> Option<&str> {
    if !slice_is_ours(slice) {
        return None;
    }
    label(&slice.metadata, MCS_SOURCE_CLUSTER_LABEL)
}

/// The live slices of ours for the import `name` that the desired import no longer has (by
/// name): candidates for deletion, each still subject to the proof [`slice_source_cluster`]
/// describes. Slices that are not ours are never among them.
pub fn surplus_slices<'a>(
    live: &[&'a EndpointSlice],
    name: &str,
    desired: &[EndpointSlice],
) -> Vec<&'a EndpointSlice> {
    live.iter()
        .copied()
        .filter(|s| slice_is_ours(s))
        .filter(|s| label(&s.metadata, MCS_SERVICE_NAME_LABEL) == Some(name))
        .filter(|s| {
            !desired
                .iter()
                .any(|d| d.metadata.name.is_some() && d.metadata.name == s.metadata.name)
        })
        .collect()
}

/// The spec with the defaults we may have left unset applied, ports sorted.
fn normalised(spec: &ServiceImportSpec) -> ServiceImportSpec {
    let mut n = spec.clone();
    for p in &mut n.ports {
        if p.protocol.is_empty() {
            p.protocol = PROTOCOL_TCP.to_string();
        }
    }
    n.ports.sort();
    if n.session_affinity.is_empty() {
        n.session_affinity = AFFINITY_NONE.to_string();
    }
    n
}

/// The keys of `record` (a comma-separated annotation value) that `actual` still has and
/// `desired` no longer has.
fn dropped_annotations(actual: &ObjectMeta, desired: &ObjectMeta) -> Vec<String> {
    let Some(record) = actual
        .annotations
        .as_ref()
        .and_then(|a| a.get(COPIED_ANNOTATIONS_ANNOTATION))
    else {
        return Vec::new();
    };
    let wanted = desired.annotations.as_ref();
    let present = actual.annotations.as_ref();
    record
        .split(',')
        .filter(|k| !k.is_empty())
        .filter(|k| !wanted.is_some_and(|w| w.contains_key(*k)))
        .filter(|k| present.is_some_and(|p| p.contains_key(*k)))
        .map(str::to_string)
        .collect()
}

/// Compares the live ServiceImport with the desired one (metadata and spec; its status is a
/// subresource: see [`import_status_change`]). Labels and annotations the winning export no
/// longer exports are removed (the import records which ones it copied); those others added
/// are kept. The spec is ours as a whole.
pub fn import_change(
    live: Option<&ServiceImport>,
    desired: &ServiceImport,
) -> Change<ServiceImport> {
    let Some(live) = live else {
        let mut created = desired.clone();
        created.status = None;
        return Change::Create(created);
    };
    if !import_is_ours(live) {
        return Change::NotOurs;
    }
    let dropped = dropped_annotations(&live.metadata, &desired.metadata);
    let unchanged = dropped.is_empty()
        && meta::metadata_matches(&live.metadata, &desired.metadata)
        && normalised(&live.spec) == normalised(&desired.spec);
    if unchanged {
        return Change::Unchanged;
    }
    let mut updated = live.clone();
    meta::merge_metadata(&mut updated.metadata, &desired.metadata);
    if let Some(annotations) = updated.metadata.annotations.as_mut() {
        for key in &dropped {
            annotations.remove(key);
        }
    }
    updated.spec = desired.spec.clone();
    Change::Update(updated)
}

/// Compares the live ServiceImport's `status.clusters` with the desired one (as sets); its
/// conditions, which we do not set, are kept. For a write to the status subresource.
pub fn import_status_change(
    live: &ServiceImport,
    desired: &ServiceImport,
) -> Change<ServiceImport> {
    if !import_is_ours(live) {
        return Change::NotOurs;
    }
    let sorted = |s: Option<&ServiceImportStatus>| {
        let mut c = s.map(|s| s.clusters.clone()).unwrap_or_default();
        c.sort();
        c.dedup();
        c
    };
    let wanted = sorted(desired.status.as_ref());
    if sorted(live.status.as_ref()) == wanted {
        return Change::Unchanged;
    }
    let mut updated = live.clone();
    updated
        .status
        .get_or_insert_with(ServiceImportStatus::default)
        .clusters = wanted;
    Change::Update(updated)
}

fn traffic_policy(spec: Option<&k8s_openapi::api::core::v1::ServiceSpec>) -> &str {
    spec.and_then(|s| s.internal_traffic_policy.as_deref())
        .filter(|p| !p.is_empty())
        .unwrap_or(ITP_CLUSTER)
}

/// Compares the live derived Service with the desired one: what the follower comparison
/// ([`service_change`]) checks (type and headlessness, ports, affinity, selector, metadata, the
/// family policy), plus the primary IP family (immutable: another one recreates the Service),
/// internalTrafficPolicy, trafficDistribution and the ownerReference. The allocated
/// clusterIPs and what the API server defaults are kept.
pub fn derived_change(live: Option<&Service>, desired: &Service) -> Change<Service> {
    let Some(live) = live else {
        return Change::Create(desired.clone());
    };
    if !derived_is_ours(live) {
        return Change::NotOurs;
    }
    let (live_spec, desired_spec) = (live.spec.as_ref(), desired.spec.as_ref());
    let primary = |s: Option<&k8s_openapi::api::core::v1::ServiceSpec>| {
        s.and_then(|s| s.ip_families.as_ref())
            .and_then(|f| f.first().cloned())
    };
    if let (Some(want), Some(have)) = (primary(desired_spec), primary(live_spec))
        && want != have
    {
        return Change::Recreate(desired.clone());
    }
    let base = match service_change(live, desired) {
        ServiceChange::Recreate => return Change::Recreate(desired.clone()),
        ServiceChange::Unchanged => None,
        ServiceChange::Update(updated) => Some(*updated),
    };
    let single_stack =
        desired_spec.and_then(|s| s.ip_family_policy.as_deref()) == Some(SINGLE_STACK);
    let too_many_families = single_stack
        && live_spec
            .and_then(|s| s.ip_families.as_ref())
            .is_some_and(|f| f.len() > 1);
    let desired_policy = desired_spec.and_then(|s| s.internal_traffic_policy.as_ref());
    let extras_match = (desired_policy.is_none()
        || traffic_policy(live_spec) == traffic_policy(desired_spec))
        && live_spec.and_then(|s| s.traffic_distribution.as_ref())
            == desired_spec.and_then(|s| s.traffic_distribution.as_ref())
        && meta::owners_match(
            live.metadata.owner_references.as_deref(),
            desired.metadata.owner_references.as_deref(),
        )
        && !too_many_families;
    if base.is_none() && extras_match {
        return Change::Unchanged;
    }
    let mut updated = base.unwrap_or_else(|| live.clone());
    meta::merge_owners(
        &mut updated.metadata.owner_references,
        desired.metadata.owner_references.as_deref(),
    );
    let spec = updated.spec.get_or_insert_with(Default::default);
    if desired_policy.is_some() {
        spec.internal_traffic_policy = desired_policy.cloned();
    }
    spec.traffic_distribution = desired_spec.and_then(|s| s.traffic_distribution.clone());
    if too_many_families {
        // dual to single stack: the secondary family and its IP go
        spec.ip_family_policy = Some(SINGLE_STACK.to_string());
        if let Some(f) = spec.ip_families.as_mut() {
            f.truncate(1);
        }
        if let Some(ips) = spec.cluster_ips.as_mut() {
            ips.truncate(1);
        }
    }
    Change::Update(updated)
}

/// Compares a live MCS slice with the desired one, as the follower slices are compared
/// ([`slice_change`]): our labels and ownerReference, ports and endpoints; an addressType
/// (immutable) that differs recreates the slice.
pub fn mcs_slice_change(
    live: Option<&EndpointSlice>,
    desired: &EndpointSlice,
) -> Change<EndpointSlice> {
    let Some(live) = live else {
        return Change::Create(desired.clone());
    };
    if !slice_is_ours(live) {
        return Change::NotOurs;
    }
    if live.address_type != desired.address_type {
        return Change::Recreate(desired.clone());
    }
    match slice_change(live, desired) {
        None => Change::Unchanged,
        Some(updated) => Change::Update(updated),
    }
}

#[cfg(test)]
mod tests;
