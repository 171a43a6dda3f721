//! What an import tells of each exporting cluster: how many of its endpoints the import
//! publishes, how many of those are ready, and whether they are published not ready whatever the
//! cluster says (its data path cut off, or its API server stale). The MCS API's
//! `ServiceImport.status.clusters` names the clusters only, so this goes into the annotation
//! [`ENDPOINTS_ANNOTATION`] of the ServiceImport, compact JSON keyed by cluster name (sorted):
//!
//! ```text
//! {"east":{"ready":2,"total":2},"north":{"ready":0,"total":2,"cutOff":true},"west":{"ready":0,"total":2}}
//! ```
//!
//! * `total`: that cluster's endpoints in the import's slices as published (after the address
//!   policy, the ports the import shares, the endpoints a ClusterSetIP import drops for having
//!   no port). A dual-stack cluster's IPv4 and IPv6 slices carry the same pods: the family with
//!   the most endpoints is counted, not both.
//! * `ready`: those published ready (`conditions.ready` not false, as kube-proxy reads it), so a
//!   marked cluster's endpoints count as not ready.
//! * `cutOff: true`: the data-path probe finds the cluster's pods unreachable; `stale: true`:
//!   the outage policy marks it (its API server unreachable past its `stale-after`). A flag
//!   that is false is left out. The import knows the counts; the pass adds the marks
//!   (`Import::mark_endpoints`).
//!
//! The value changes only when a count or a mark does: a steady import is never written for it.
use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde::{Deserialize, Serialize};

use super::types::{ClusterStatus, ServiceImport};
use crate::desired::options::MCS_SOURCE_CLUSTER_LABEL;
use crate::desired::slices::is_ready;

/// Annotation on a ServiceImport: per exporting cluster, its endpoints as published and how many
/// are ready (see the module).
pub const ENDPOINTS_ANNOTATION: &str = "cross-cluster-controller.fair.com/endpoints";

/// Why a remote's endpoints are published not ready whatever it says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Marks {
    /// the data-path probe finds its pods unreachable
    pub cut_off: bool,
    /// the outage policy marks it (its API server unreachable past `stale-after`)
    pub stale: bool,
}

impl Marks {
    /// Whether its endpoints are published not ready.
    pub fn any(&self) -> bool {
        self.cut_off || self.stale
    }
}

/// One cluster's part in an import, as the annotation tells it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterEndpoints {
    pub ready: usize,
    pub total: usize,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cut_off: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stale: bool,
}

/// Every exporting cluster's part, by cluster name.
pub type EndpointCounts = BTreeMap<String, ClusterEndpoints>;

/// Each cluster of `clusters` (those that export the key) with its endpoints in `slices` (the
/// import's slices as published, built for every cluster whether or not they are written yet).
pub(super) fn count(clusters: &[ClusterStatus], slices: &[EndpointSlice]) -> EndpointCounts {
    let mut by_family: BTreeMap<(&str, &str), ClusterEndpoints> = BTreeMap::new();
    for s in slices {
        let labels = s.metadata.labels.as_ref();
        let Some(cluster) = labels.and_then(|l| l.get(MCS_SOURCE_CLUSTER_LABEL)) else {
            continue;
        };
        let n = by_family
            .entry((cluster.as_str(), s.address_type.as_str()))
            .or_default();
        n.total += s.endpoints.len();
        n.ready += s.endpoints.iter().filter(|e| is_ready(e)).count();
    }
    let mut out: EndpointCounts = clusters
        .iter()
        .map(|c| (c.cluster.clone(), ClusterEndpoints::default()))
        .collect();
    for ((cluster, _family), n) in by_family {
        if let Some(c) = out.get_mut(cluster)
            && (n.total, n.ready) > (c.total, c.ready)
        {
            *c = n;
        }
    }
    out
}

/// The annotation's value: compact JSON, clusters sorted by name.
pub fn endpoints_value(counts: &EndpointCounts) -> String {
    // a map of strings to plain structs always serialises
    serde_json::to_string(counts).unwrap_or_default()
}

/// Reads the annotation's value back (`status`); an edited, malformed one is an error.
pub fn read_endpoints(value: &str) -> Result<EndpointCounts, serde_json::Error> {
    serde_json::from_str(value)
}

/// Sets the annotation on `si` from `counts`.
pub(super) fn annotate(si: &mut ServiceImport, counts: &EndpointCounts) {
    si.metadata
        .annotations
        .get_or_insert_default()
        .insert(ENDPOINTS_ANNOTATION.to_string(), endpoints_value(counts));
}

/// Flags the clusters whose endpoints are published not ready (`marks`, by cluster name: the
/// remotes cut off or stale; their endpoints already count as not ready). A cluster `marks`
/// names that does not export the key gets no entry.
pub(super) fn mark(counts: &mut EndpointCounts, marks: &BTreeMap<String, Marks>) {
    for (cluster, c) in counts.iter_mut() {
        let m = marks.get(cluster).copied().unwrap_or_default();
        c.cut_off = m.cut_off;
        c.stale = m.stale;
    }
}

#[cfg(test)]
mod tests;
