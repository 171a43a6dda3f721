//! Locality for an import: the `hints` of its slices, so that plain kube-proxy keeps a client's
//! traffic in its zone (or node), then in its cluster, then anywhere, with no agent per node.
//!
//! kube-proxy (`pkg/proxy/topology.go`, 1.34) looks at every ready endpoint of a Service,
//! across all its slices. When each carries node hints and one names the client's node, it
//! sends only to the endpoints naming that node; else, when each carries zone hints and one
//! names the client node's zone, only to those; else to every ready endpoint. An endpoint that
//! is not ready takes no part in that test.
//!
//! So, for an import whose winning export asks for `trafficDistribution`:
//! * `PreferSameZone` and `PreferClose`: each zone of the local cluster's nodes is named by the
//!   ready endpoints in that zone, of any cluster; where there are none, by the local cluster's
//!   ready endpoints; where there are none of those either, by no endpoint, and kube-proxy sends
//!   that zone's clients to every ready endpoint (any cluster).
//! * `PreferSameNode`: each ready endpoint of the local cluster also names its own node
//!   (`forNodes`); a node with none falls to the zone order above.
//! * A ready endpoint that no local zone (or node) chose names [`ELSEWHERE`], which no zone or
//!   node is called: every ready endpoint then carries hints, as kube-proxy requires.
//! * Any other value, or none: no hints, every cluster's endpoints mixed evenly (as before).
//!
//! Failover needs no write of ours: an endpoint that stops being ready leaves the test, so a
//! zone whose chosen endpoints are all gone falls back to every ready endpoint at once, in
//! kube-proxy. Failback is a write: the returning endpoints are chosen again on the next pass.
//!
//! A zone is what each endpoint's slice says (`endpoints[].zone`): a remote's claim about its
//! own endpoints, which can draw to them only the traffic of Services that remote exports.
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::discovery::v1::{EndpointHints, EndpointSlice, ForNode, ForZone};

use super::judge::ClusterExport;
use crate::desired::options::MCS_SOURCE_CLUSTER_LABEL;
use crate::desired::slices::is_ready;

/// The zone (and node) named by an endpoint that no local zone (node) chose: no zone or node
/// is called so (a label value and a DNS subdomain, as both fields require).
pub const ELSEWHERE: &str = "cross-cluster-elsewhere";

/// The API server's limit on the zones (and nodes) one endpoint's hints may name.
const MAX_HINTS: usize = 8;

/// The locality a `trafficDistribution` value asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Preference {
    /// no hints: every cluster's endpoints evenly
    Even,
    /// same zone, then same cluster, then any cluster
    Zone,
    /// same node, then as [`Preference::Zone`]
    Node,
}

impl Preference {
    pub fn of(traffic_distribution: Option<&str>) -> Self {
        match traffic_distribution {
            Some("PreferClose" | "PreferSameZone") => Preference::Zone,
            Some("PreferSameNode") => Preference::Node,
            _ => Preference::Even,
        }
    }
}

/// Where the local cluster's clients are.
#[derive(Clone, Copy, Debug)]
pub struct Here<'a> {
    /// the local cluster's MCS name (its slices carry it as their source cluster)
    pub cluster: &'a str,
    /// the zones of the local cluster's nodes (`topology.kubernetes.io/zone`)
    pub zones: &'a BTreeSet<String>,
}

/// What [`localize`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Localized {
    /// no locality asked for: no hints
    Even,
    /// hints set on every ready endpoint
    Hinted,
    /// asked for, but one endpoint would name more zones than the API server allows: no hints
    /// (every endpoint evenly, as without the field)
    TooManyZones(usize),
}

/// Sets the hints of an import's slices (every cluster's, the local one's included) for
/// `preference`; `exports` give the local cluster's endpoints' nodes (its slices are built
/// without them). Hints already on the slices are replaced.
pub fn localize(
    slices: &mut [EndpointSlice],
    preference: Preference,
    here: Here<'_>,
    exports: &[ClusterExport<'_>],
) -> Localized {
    for e in slices.iter_mut().flat_map(|s| s.endpoints.iter_mut()) {
        e.hints = None;
    }
    if preference == Preference::Even {
        return Localized::Even;
    }
    let zones = chosen_zones(slices, here);
    if let Some(most) = zones.values().map(BTreeSet::len).max()
        && most > MAX_HINTS
    {
        return Localized::TooManyZones(most);
    }
    let nodes = (preference == Preference::Node).then(|| local_nodes(exports, here.cluster));
    for (i, slice) in slices.iter_mut().enumerate() {
        let local = source_cluster(slice) == Some(here.cluster);
        for (j, e) in slice.endpoints.iter_mut().enumerate() {
            if !is_ready(e) {
                continue;
            }
            let for_zones = zones.get(&(i, j)).map_or_else(
                || vec![zone(ELSEWHERE)],
                |z| z.iter().map(|z| zone(z)).collect(),
            );
            let for_nodes = nodes.as_ref().map(|nodes| {
                let own = local
                    .then(|| e.addresses.first().and_then(|a| nodes.get(a)))
                    .flatten();
                vec![ForNode {
                    name: own.map_or(ELSEWHERE, String::as_str).to_string(),
                }]
            });
            e.hints = Some(EndpointHints {
                for_zones: Some(for_zones),
                for_nodes,
            });
        }
    }
    Localized::Hinted
}

/// For each ready endpoint (slice, endpoint index), the local zones that choose it: the ready
/// endpoints in the zone, else the local cluster's ready endpoints, else none.
fn chosen_zones(
    slices: &[EndpointSlice],
    here: Here<'_>,
) -> BTreeMap<(usize, usize), BTreeSet<String>> {
    let ready: Vec<((usize, usize), Option<&str>, bool)> = slices
        .iter()
        .enumerate()
        .flat_map(|(i, s)| {
            let local = source_cluster(s) == Some(here.cluster);
            s.endpoints
                .iter()
                .enumerate()
                .filter(|(_, e)| is_ready(e))
                .map(move |(j, e)| ((i, j), e.zone.as_deref(), local))
        })
        .collect();
    let mut chosen: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for z in here.zones {
        let mut pick: Vec<(usize, usize)> = ready
            .iter()
            .filter(|(_, zone, _)| *zone == Some(z.as_str()))
            .map(|(at, _, _)| *at)
            .collect();
        if pick.is_empty() {
            pick = ready.iter().filter(|r| r.2).map(|r| r.0).collect();
        }
        for at in pick {
            chosen.entry(at).or_default().insert(z.clone());
        }
    }
    chosen
}

/// The node of each of the local cluster's endpoints, by its first address.
fn local_nodes(exports: &[ClusterExport<'_>], local: &str) -> BTreeMap<String, String> {
    exports
        .iter()
        .filter(|e| e.cluster == local)
        .flat_map(|e| e.slices.iter().flat_map(|s| s.endpoints.iter()))
        .filter_map(|e| {
            let node = e.node_name.as_ref().filter(|n| !n.is_empty())?;
            Some((e.addresses.first()?.clone(), node.clone()))
        })
        .collect()
}

fn source_cluster(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MCS_SOURCE_CLUSTER_LABEL))
        .map(String::as_str)
}

fn zone(name: &str) -> ForZone {
    ForZone {
        name: name.to_string(),
    }
}

#[cfg(test)]
mod tests;
