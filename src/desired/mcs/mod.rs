//! The Multi-Cluster Services API (KEP-1645, mcs-api v0.5.0), pure: what every cluster's
//! ServiceExports ask of the local cluster, and "does the live object need a write?".
//!
//! Nothing here performs I/O; it imports only from `desired` and external crates. The wiring
//! reads, for one namespace/name, every cluster's ServiceExport, Service and EndpointSlices
//! (the local cluster's included: it is a source as well as a destination) into
//! [`ClusterExport`]s and calls:
//!
//! * [`cluster_name`]: the name a cluster claims (its ClusterProperty
//!   `cluster.clusterset.k8s.io` when valid, else the configured name); [`Holders::settle`]:
//!   which claims are granted (a name is bound to the cluster that holds it).
//! * [`export_conditions`] then [`export_status_change`]: the local ServiceExport's `Valid`,
//!   `Ready` and `Conflict` conditions, written to its status subresource.
//! * [`import`]: the desired ServiceImport, derived Service and EndpointSlices; `None` when no
//!   export is valid.
//! * [`import_change`] (object) and [`import_status_change`] (status subresource),
//!   [`derived_change`], [`mcs_slice_change`]: one [`Change`] each, `NotOurs` for a live
//!   object that is not ours; [`surplus_slices`] lists slices of ours the import dropped.
//!
//! Design decisions:
//!
//! * **Who wins**: among the valid exports (a Service exists and is not ExternalName; an export
//!   being deleted takes no part), the holder the live ServiceImport records
//!   ([`HOLDER_ANNOTATION`]) while it is one of them; otherwise the oldest by the ServiceExport's
//!   creationTimestamp, then cluster name, which becomes the holder. The winner decides type,
//!   affinity, traffic fields and exported labels/annotations. A creationTimestamp is the
//!   exporting API server's word: it decides only between exports present when the import had
//!   no holder, so an export that comes later and claims to be older takes nothing. Ports are
//!   the union by name, then by protocol and number, the winner's first, then oldest first
//!   (KEP-1645 "Service Port"). Any difference raises `Conflict` on every valid export, the
//!   winner's included, as the KEP and the conformance suite ask.
//! * **Names**: the ServiceImport is named as the Service. The derived Service is
//!   `derived-<10 base32hex characters of sha256("<ns>/<name>")>`, mcs-api's reference
//!   controller's name: a DNS label for any Service name, stable, recorded on the ServiceImport
//!   in `multicluster.kubernetes.io/derived-service`. Slices are
//!   `<derived>-<8 hex of sha256(cluster, address type, ports)>-<index>`.
//! * **Ownership**: the ServiceImport and the derived Service carry
//!   `app.kubernetes.io/managed-by=<MANAGED_BY>` (the derived Service also
//!   `multicluster.kubernetes.io/service-name`); slices carry
//!   `endpointslice.kubernetes.io/managed-by=<MANAGED_BY>` and both MCS labels. Never the
//!   label mode's `<key>=follower`, so its sweeper and adoption never see them, and the label
//!   mode's objects are never ours here. The derived Service and the slices are owned by the
//!   ServiceImport (controller ownerReference, same cluster), so deleting the import collects
//!   them; they are derived only once the live ServiceImport is ours and has a uid.
//! * **The derived Service**: selectorless, `ClusterIP` (headless for a Headless import), the
//!   import's ports (targetPort left to default: kube-proxy matches slice ports by name),
//!   affinity and traffic fields; its primary IP family pinned to the winner's (a VIP of the
//!   endpoints' family), `PreferDualStack` when the exports carry two families.
//!   `ServiceImport.spec.ips` are its clusterIPs and `spec.ipFamilies` their families, so both
//!   agree in length and order; a Headless import has no IPs and the exports' families.
//! * **Slices**: one set per exporting cluster, labelled
//!   `multicluster.kubernetes.io/service-name=<svc>`,
//!   `multicluster.kubernetes.io/source-cluster=<cluster>`,
//!   `kubernetes.io/service-name=<derived>` (so the cluster's own `kubernetes.io/service-name`
//!   listings of the Service never count them) and `endpointslice.kubernetes.io/managed-by`.
//!   Endpoints are copied as the label mode copies them (addresses, ready/serving/terminating,
//!   hostname for `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local`, zone; nodeName,
//!   targetRef and hints dropped), at most 1000 per slice, with those of their own slices'
//!   ports whose Service port is the import's port of that name (same protocol and number), so
//!   a port's traffic reaches only the clusters whose Service has that very port. A port that
//!   lost a conflict (StrictPortConflict: `tcp` 4242 against the winner's `tcp` 42) is dropped
//!   from that cluster's slices: kube-proxy matches slice ports by name, and would otherwise
//!   send the winner's port to the loser's pods. A ClusterSetIP import drops endpoints left with
//!   no port; a Headless one keeps them without ports, so their A and `<hostname>.<clusterid>`
//!   records still answer (CoreDNS lists no SRV record for them).
//! * **Labels and annotations of the ServiceImport**: the winner's `exportedLabels` and
//!   `exportedAnnotations` (never the Service's), minus what the API server would refuse; the
//!   keys copied are recorded so that a key the winner stops exporting is removed while keys
//!   others added stay.
//! * **Ready endpoints per cluster**: the API has no field for them, so the ServiceImport carries
//!   [`ENDPOINTS_ANNOTATION`], each exporting cluster's endpoints as published, how many are
//!   ready, and whether it is cut off or stale ([`Import::mark_endpoints`]; see `readiness`). It is one
//!   of our annotations: an export cannot set it, and it changes only with what it counts.

mod change;
mod cluster;
mod error;
mod export;
mod import;
mod judge;
mod locality;
mod names;
mod readiness;
#[cfg(test)]
mod test_support;
mod types;

pub use change::{
    Change, derived_change, derived_is_ours, import_change, import_is_ours, import_status_change,
    mcs_slice_change, slice_is_ours, slice_source_cluster, surplus_slices,
};
pub use cluster::{CLUSTER_ID_PROPERTY, cluster_name, is_cluster_name};
pub use error::McsError;
pub use export::{
    CONDITION_CONFLICT, CONDITION_READY, CONDITION_VALID, export_conditions, export_status_change,
};
pub use import::{Import, derived_name, import, import_owner};
pub use judge::{ClusterExport, Conflict, ConflictReason, Validity, Won, conflicts_note, validity};
pub use locality::{ELSEWHERE, Here, Localized, Preference, localize};
pub use names::{Claim, Grant, Holders, Identity};
pub use readiness::{
    ClusterEndpoints, ENDPOINTS_ANNOTATION, EndpointCounts, Marks, endpoints_value, read_endpoints,
};
pub use types::*;

pub use crate::desired::options::MCS_SERVICE_NAME_LABEL;
/// Annotation on a ServiceImport naming its derived Service (as mcs-api's reference controller).
pub const DERIVED_SERVICE_ANNOTATION: &str = "multicluster.kubernetes.io/derived-service";
/// Label marking the ServiceImports and derived Services we own; its value is `MANAGED_BY`.
pub const OWNER_LABEL: &str = "app.kubernetes.io/managed-by";
/// Annotation on a ServiceImport listing the exported label keys it copied (comma-separated).
pub const COPIED_LABELS_ANNOTATION: &str = "cross-cluster-controller.fair.com/copied-labels";
/// Annotation on a ServiceImport listing the exported annotation keys it copied.
pub const COPIED_ANNOTATIONS_ANNOTATION: &str =
    "cross-cluster-controller.fair.com/copied-annotations";
/// Annotation on a ServiceImport naming the cluster whose export's properties it took (its
/// holder): that export keeps them while it is a valid member, whatever a later export claims
/// its age to be.
pub const HOLDER_ANNOTATION: &str = "cross-cluster-controller.fair.com/properties-holder";

/// The source Services and EndpointSlices of an exporting namespace: everything but our own
/// (derived Services and MCS slices carry `multicluster.kubernetes.io/service-name`; the label
/// mode's follower slices our managed-by), so exporting a derived Service or a follower never
/// re-exports what we wrote.
pub fn source_selector() -> String {
    format!(
        "!{MCS_SERVICE_NAME_LABEL},{}!={}",
        crate::desired::MANAGED_BY_LABEL,
        crate::desired::MANAGED_BY
    )
}

/// Our ServiceImports in the local cluster.
pub fn import_selector() -> String {
    format!("{OWNER_LABEL}={}", crate::desired::MANAGED_BY)
}

/// Our derived Services in the local cluster.
pub fn derived_selector() -> String {
    format!(
        "{OWNER_LABEL}={},{MCS_SERVICE_NAME_LABEL}",
        crate::desired::MANAGED_BY
    )
}

/// Our MCS EndpointSlices in the local cluster.
pub fn slice_selector() -> String {
    format!(
        "{}={},{MCS_SERVICE_NAME_LABEL},{}",
        crate::desired::MANAGED_BY_LABEL,
        crate::desired::MANAGED_BY,
        crate::desired::MCS_SOURCE_CLUSTER_LABEL
    )
}

#[cfg(test)]
mod selector_tests {
    use super::*;

    #[test]
    fn the_selectors_keep_the_two_modes_and_sources_apart() {
        assert_eq!(
            source_selector(),
            "!multicluster.kubernetes.io/service-name,\
             endpointslice.kubernetes.io/managed-by!=cross-cluster-controller.fair.com"
        );
        assert_eq!(
            import_selector(),
            "app.kubernetes.io/managed-by=cross-cluster-controller.fair.com"
        );
        assert_eq!(
            derived_selector(),
            "app.kubernetes.io/managed-by=cross-cluster-controller.fair.com,\
             multicluster.kubernetes.io/service-name"
        );
        assert_eq!(
            slice_selector(),
            "endpointslice.kubernetes.io/managed-by=cross-cluster-controller.fair.com,\
             multicluster.kubernetes.io/service-name,multicluster.kubernetes.io/source-cluster"
        );
    }
}
