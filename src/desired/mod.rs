//! Pure translation of remote exported Service objects into the desired local follower objects
//! (and, in [`mcs`], of every cluster's ServiceExports into the local ServiceImport, derived
//! Service and MCS slices), and the "does the live local object need a write?" comparisons.
//!
//! Nothing in this module performs I/O: it only maps Kubernetes objects to Kubernetes objects.
//!
//! * [`follower`] turns a remote exported Service and all of its remote EndpointSlices into a
//!   [`Follower`]: the selectorless follower Service, the follower EndpointSlices and/or the
//!   legacy core/v1 Endpoints, depending on [`EndpointsMode`].
//! * [`merge`] makes one follower of the exports of several remotes (same namespace/name).
//! * [`recorded`] and [`slice_recorded`] tell which remotes an existing local object records.
//! * [`service_change`], [`slice_change`] and [`endpoints_change`] compare a live local object
//!   with the desired one, ignoring everything the API server defaults and everything other
//!   managers added, and return the object to write (if any).
//! * [`mcs`]: the Multi-Cluster Services API (ServiceExport status, ServiceImport, derived
//!   Service and slices), beside the label mode.

pub mod addresses;
mod api;
pub mod containment;
mod endpoints;
pub(crate) mod follower;
pub mod limits;
pub mod mcs;
mod merge;
mod meta;
pub mod names;
pub(crate) mod options;
mod outcome;
mod service;
mod slices;
#[cfg(test)]
pub(crate) mod test_support;

pub use endpoints::endpoints_change;
pub use follower::{Follower, follower};
pub use merge::{Conflict, ConflictKind, Export, Merged, merge, not_ready};
pub use options::*;
pub use outcome::{
    NAMESPACE_MISSING, NAMESPACE_PROTECTED, Outcome, PUBLIC_NAME_REFUSED, SERVICE_IPS_LIMITED,
};
pub use service::{ServiceChange, service_change};
pub use slices::{probe_targets, set_slice_owner, slice_change};

/// The remotes a local Service or Endpoints object records (its metadata is enough).
pub fn recorded(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    opts: &Options,
) -> Recorded {
    meta::recorded(metadata, opts)
}

/// Why a local user has taken over a follower Service, if they have: it has a selector (a
/// follower never has one), `kubectl apply` left its record on it, or another field manager
/// owns its selector or applied its spec. Such a Service is not ours any more: the daemon
/// leaves it alone and removes only its own slices.
pub fn taken_over(
    svc: &k8s_openapi::api::core::v1::Service,
    opts: &Options,
) -> Option<&'static str> {
    if !meta::is_follower(&svc.metadata, opts) {
        return None;
    }
    let selector = svc.spec.as_ref().and_then(|s| s.selector.as_ref());
    if selector.is_some_and(|s| !s.is_empty()) {
        return Some("it has a selector");
    }
    meta::taken_over(&svc.metadata)
}

/// The remote a local EndpointSlice records: as for a Service, but a slice whose
/// `endpointslice.kubernetes.io/managed-by` label is not [`MANAGED_BY`] is never ours (slices
/// mirrored by kube-controller-manager from our Endpoints carry the follower label too).
pub fn slice_recorded(
    metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    opts: &Options,
) -> Recorded {
    let managed_by = metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(MANAGED_BY_LABEL));
    if managed_by.map(String::as_str) != Some(MANAGED_BY) {
        return Recorded::NotOurs;
    }
    meta::recorded(metadata, opts)
}

/// Checks one `--label-deny` or `--label-allow` entry: a label key, or a DNS subdomain
/// followed by `/` (that prefix and its subdomains).
pub fn check_label_entry(entry: &str) -> Result<(), String> {
    meta::check_label_entry(entry)
}

/// Whether `s` is a lowercase RFC 1123 subdomain (an object name the API server accepts).
pub fn meta_is_dns1123_subdomain(s: &str) -> bool {
    meta::is_dns1123_subdomain(s)
}

#[cfg(test)]
mod tests;
