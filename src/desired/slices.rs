//! Follower EndpointSlices: grouping of the remote endpoints (shared with the legacy Endpoints
//! translation), naming, and comparison with live local slices.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use sha2::{Digest, Sha256};

use super::api::PROTOCOL_TCP;
use super::meta::{self, StringMap};
use super::options::{
    FOLLOWER_VALUE, MANAGED_BY, MANAGED_BY_LABEL, MAX_ENDPOINTS_PER_SLICE,
    MCS_SOURCE_CLUSTER_LABEL, Options, SERVICE_NAME_LABEL,
};

const MAX_NAME_LENGTH: usize = 253;

/// An EndpointSlice port with the API server's defaults applied (name "" and protocol TCP).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct PortKey {
    pub(crate) name: String,
    pub(crate) port: Option<i32>,
    pub(crate) protocol: String,
    pub(crate) app_protocol: Option<String>,
}

impl PortKey {
    fn from_port(port: &EndpointPort) -> Self {
        PortKey {
            name: port.name.clone().unwrap_or_default(),
            port: port.port,
            protocol: port
                .protocol
                .clone()
                .unwrap_or_else(|| PROTOCOL_TCP.to_string()),
            app_protocol: port.app_protocol.clone(),
        }
    }

    fn to_port(&self) -> EndpointPort {
        EndpointPort {
            name: Some(self.name.clone()),
            port: self.port,
            protocol: Some(self.protocol.clone()),
            app_protocol: self.app_protocol.clone(),
        }
    }
}

/// Sorted, deduplicated ports with defaults applied.
fn canonical_ports(ports: Option<&Vec<EndpointPort>>) -> Vec<PortKey> {
    let mut keys: Vec<PortKey> = ports
        .into_iter()
        .flatten()
        .map(PortKey::from_port)
        .collect();
    keys.sort();
    keys.dedup();
    keys
}

/// All remote endpoints sharing one address type and one port set, cleaned, deduplicated by
/// address list and sorted.
#[derive(Clone, Debug)]
pub(crate) struct Group {
    pub(crate) address_type: String,
    pub(crate) ports: Vec<PortKey>,
    pub(crate) endpoints: Vec<Endpoint>,
}

/// Whether a remote slice may belong to the Service `namespace/name`.
pub(crate) fn belongs_to(slice: &EndpointSlice, name: &str, namespace: &str) -> bool {
    let other_namespace = slice
        .metadata
        .namespace
        .as_deref()
        .is_some_and(|ns| !ns.is_empty() && ns != namespace);
    let other_service = slice
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(SERVICE_NAME_LABEL))
        .is_some_and(|service| service != name);
    !other_namespace && !other_service
}

/// Groups the endpoints of all remote slices by (addressType, canonical ports). Groups without
/// endpoints are dropped; the result is sorted by address type, then ports.
pub(crate) fn group_endpoints(slices: &[&EndpointSlice]) -> Vec<Group> {
    let mut groups: BTreeMap<(String, Vec<PortKey>), Vec<Endpoint>> = BTreeMap::new();
    for slice in slices {
        let key = (
            slice.address_type.clone(),
            canonical_ports(slice.ports.as_ref()),
        );
        let endpoints = groups.entry(key).or_default();
        endpoints.extend(
            slice
                .endpoints
                .iter()
                .filter(|e| !e.addresses.is_empty())
                .map(clean_endpoint),
        );
    }
    groups
        .into_iter()
        .filter_map(|((address_type, ports), mut endpoints)| {
            // Sorting puts the healthiest copy of a duplicated address list first; dedup_by
            // keeps the first of each run.
            endpoints.sort_by(endpoint_cmp);
            endpoints.dedup_by(|later, earlier| later.addresses == earlier.addresses);
            (!endpoints.is_empty()).then_some(Group {
                address_type,
                ports,
                endpoints,
            })
        })
        .collect()
}

/// The follower slices `groups` make: one per started thousand endpoints of each group.
pub(crate) fn slice_count(groups: &[Group]) -> u64 {
    groups
        .iter()
        .map(|g| g.endpoints.len().div_ceil(MAX_ENDPOINTS_PER_SLICE) as u64)
        .sum()
}

/// Keeps addresses, conditions, hostname and zone; drops nodeName, targetRef, hints and
/// deprecatedTopology.
fn clean_endpoint(endpoint: &Endpoint) -> Endpoint {
    Endpoint {
        addresses: endpoint.addresses.clone(),
        conditions: endpoint.conditions.clone(),
        hostname: endpoint.hostname.clone(),
        zone: endpoint.zone.clone(),
        ..Endpoint::default()
    }
}

fn conditions(endpoint: &Endpoint) -> (Option<bool>, Option<bool>, Option<bool>) {
    let c = endpoint.conditions.as_ref();
    (
        c.and_then(|c| c.ready),
        c.and_then(|c| c.serving),
        c.and_then(|c| c.terminating),
    )
}

/// Ready endpoints are those whose `ready` is not explicitly false (nil means unknown, which
/// consumers treat as ready).
pub(crate) fn is_ready(endpoint: &Endpoint) -> bool {
    conditions(endpoint).0 != Some(false)
}

/// Up to `n` addresses of ready endpoints of `slices` to probe, each with its slice's first TCP
/// port that has a number (IP slices only; FQDN slices name no address to connect to).
pub fn probe_targets(
    slices: &[std::sync::Arc<EndpointSlice>],
    n: usize,
) -> Vec<std::net::SocketAddr> {
    let mut out = Vec::new();
    for s in slices.iter().filter(|s| s.address_type != "FQDN") {
        let port = s.ports.iter().flatten().find_map(|p| {
            let tcp = p.protocol.as_deref().is_none_or(|p| p == PROTOCOL_TCP);
            p.port.filter(|_| tcp).and_then(|n| u16::try_from(n).ok())
        });
        let Some(port) = port else {
            continue;
        };
        let ready = s
            .endpoints
            .iter()
            .filter(|e| is_ready(e) && !is_terminating(e));
        for e in ready {
            if let Some(ip) = e
                .addresses
                .first()
                .and_then(|a| a.parse::<std::net::IpAddr>().ok())
            {
                out.push(std::net::SocketAddr::new(ip, port));
                if out.len() == n {
                    return out;
                }
            }
        }
    }
    out
}

pub(crate) fn is_terminating(endpoint: &Endpoint) -> bool {
    conditions(endpoint).2 == Some(true)
}

/// Total order: address list, then health (ready, serving, not terminating first), then the
/// remaining fields.
fn endpoint_cmp(a: &Endpoint, b: &Endpoint) -> Ordering {
    let rank = |e: &Endpoint| {
        let (ready, serving, terminating) = conditions(e);
        (
            ready == Some(false),
            serving == Some(false),
            terminating == Some(true),
        )
    };
    a.addresses
        .cmp(&b.addresses)
        .then_with(|| rank(a).cmp(&rank(b)))
        .then_with(|| conditions(a).cmp(&conditions(b)))
        .then_with(|| a.hostname.cmp(&b.hostname))
        .then_with(|| a.zone.cmp(&b.zone))
}

/// First 8 hex characters of sha256 over the remote's name, the address type and the canonical
/// ports: the slices of one Service from two remotes never share a name.
fn group_hash(cluster: &str, address_type: &str, ports: &[PortKey]) -> String {
    let mut hasher = Sha256::new();
    hasher.update(cluster.as_bytes());
    hasher.update(b"\n");
    hasher.update(address_type.as_bytes());
    for port in ports {
        let number = port.port.map_or_else(|| "-".to_string(), |n| n.to_string());
        let app_protocol = port.app_protocol.as_deref().unwrap_or("-");
        hasher.update(
            format!(
                "\n{}\t{number}\t{}\t{app_protocol}",
                port.name, port.protocol
            )
            .as_bytes(),
        );
    }
    let digest = hasher.finalize();
    hex::encode(&digest[..4])
}

/// `<service>-<hash>-<index>`, with the service part shortened if needed so that the whole name
/// is a DNS subdomain of at most 253 characters.
fn slice_name(service: &str, hash: &str, index: usize) -> String {
    let suffix = format!("-{hash}-{index}");
    let budget = MAX_NAME_LENGTH.saturating_sub(suffix.len());
    let mut end = service.len().min(budget);
    while !service.is_char_boundary(end) {
        end -= 1;
    }
    let mut prefix = service[..end].trim_end_matches(['-', '.']);
    if prefix.is_empty() {
        prefix = "follower";
    }
    format!("{prefix}{suffix}")
}

/// The follower slices of one remote's endpoints. They carry our labels only: the leader's
/// labels go on the follower Service alone (copied onto every slice, one remote's labels would
/// be stored once per slice: issue 37). Their copied-labels record is empty, so the labels an
/// earlier release copied onto a slice are removed at its next write.
pub(crate) fn desired_slices(
    groups: &[Group],
    name: &str,
    namespace: &str,
    opts: &Options,
) -> Vec<EndpointSlice> {
    let mut labels = StringMap::new();
    labels.insert(SERVICE_NAME_LABEL.to_string(), name.to_string());
    labels.insert(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string());
    labels.insert(opts.label_key.clone(), FOLLOWER_VALUE.to_string());
    // which remote these endpoints come from, selectable: ours, and the MCS API's (whose value
    // is the cluster id)
    if meta::is_label_value(&opts.cluster_name) {
        labels.insert(opts.origin_cluster_label(), opts.cluster_name.clone());
    }
    let source = opts.cluster_id.as_ref().unwrap_or(&opts.cluster_name);
    if meta::is_label_value(source) {
        labels.insert(MCS_SOURCE_CLUSTER_LABEL.to_string(), source.clone());
    }
    let mut annotations = meta::origin_annotations(namespace, name, opts);
    meta::record_copied_labels(&mut annotations, &StringMap::new(), opts);
    build_slices(
        groups,
        name,
        &opts.cluster_name,
        namespace,
        &labels,
        &annotations,
    )
}

/// The slices of `groups`, every one with these labels and annotations (none when empty): at
/// most [`MAX_ENDPOINTS_PER_SLICE`] endpoints each, named
/// `<prefix>-<hash of seed, address type and ports>-<index>` (the seed keeps two sources'
/// slices apart), sorted by name.
pub(crate) fn build_slices(
    groups: &[Group],
    prefix: &str,
    seed: &str,
    namespace: &str,
    labels: &StringMap,
    annotations: &StringMap,
) -> Vec<EndpointSlice> {
    let mut slices = Vec::new();
    for group in groups {
        let hash = group_hash(seed, &group.address_type, &group.ports);
        let ports: Vec<EndpointPort> = group.ports.iter().map(PortKey::to_port).collect();
        for (index, chunk) in group.endpoints.chunks(MAX_ENDPOINTS_PER_SLICE).enumerate() {
            slices.push(EndpointSlice {
                metadata: ObjectMeta {
                    name: Some(slice_name(prefix, &hash, index)),
                    namespace: Some(namespace.to_string()),
                    labels: Some(labels.clone()),
                    annotations: (!annotations.is_empty()).then(|| annotations.clone()),
                    ..ObjectMeta::default()
                },
                address_type: group.address_type.clone(),
                endpoints: chunk.to_vec(),
                ports: (!ports.is_empty()).then(|| ports.clone()),
            });
        }
    }
    slices.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    slices
}

/// Sets the controller ownerReference to the local follower Service on every slice.
pub fn set_slice_owner(slices: &mut [EndpointSlice], service_name: &str, service_uid: &str) {
    for slice in slices {
        slice.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Service".to_string(),
            name: service_name.to_string(),
            uid: service_uid.to_string(),
            controller: Some(true),
            block_owner_deletion: None,
        }]);
    }
}

type EndpointNorm = (
    Vec<String>,
    (Option<bool>, Option<bool>, Option<bool>),
    Option<String>,
    Option<String>,
    (Vec<String>, Vec<String>),
);

/// The zones and nodes an endpoint's hints name, sorted (none and empty alike).
fn hint_names(endpoint: &Endpoint) -> (Vec<String>, Vec<String>) {
    fn sorted<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
        let mut v: Vec<String> = names.cloned().collect();
        v.sort();
        v
    }
    let hints = endpoint.hints.as_ref();
    let zones = hints
        .and_then(|h| h.for_zones.as_ref())
        .into_iter()
        .flatten();
    let nodes = hints
        .and_then(|h| h.for_nodes.as_ref())
        .into_iter()
        .flatten();
    (
        sorted(zones.map(|z| &z.name)),
        sorted(nodes.map(|n| &n.name)),
    )
}

fn normalised_endpoints(endpoints: &[Endpoint]) -> Vec<EndpointNorm> {
    let mut norm: Vec<EndpointNorm> = endpoints
        .iter()
        .map(|e| {
            (
                e.addresses.clone(),
                conditions(e),
                e.hostname.clone(),
                e.zone.clone(),
                hint_names(e),
            )
        })
        .collect();
    norm.sort();
    norm
}

fn normalised_ports(ports: Option<&Vec<EndpointPort>>) -> Vec<PortKey> {
    let mut keys: Vec<PortKey> = ports
        .into_iter()
        .flatten()
        .map(PortKey::from_port)
        .collect();
    keys.sort();
    keys
}

/// Compares a live local follower slice with the desired one: `None` when nothing needs
/// writing, else the live slice with our labels, annotations, ownerReferences, ports and
/// endpoints set (other managers' labels and annotations kept).
///
/// addressType is immutable: when it differs, the desired slice is returned with the live
/// slice's name and resourceVersion, and the caller must replace the slice.
pub fn slice_change(actual: &EndpointSlice, desired: &EndpointSlice) -> Option<EndpointSlice> {
    if actual.address_type != desired.address_type {
        let mut replacement = desired.clone();
        replacement.metadata.name = actual.metadata.name.clone();
        replacement.metadata.resource_version = actual.metadata.resource_version.clone();
        return Some(replacement);
    }
    let unchanged = meta::metadata_matches(&actual.metadata, &desired.metadata)
        && meta::owners_match(
            actual.metadata.owner_references.as_deref(),
            desired.metadata.owner_references.as_deref(),
        )
        && normalised_ports(actual.ports.as_ref()) == normalised_ports(desired.ports.as_ref())
        && normalised_endpoints(&actual.endpoints) == normalised_endpoints(&desired.endpoints);
    if unchanged {
        return None;
    }
    let mut updated = actual.clone();
    meta::merge_metadata(&mut updated.metadata, &desired.metadata);
    meta::merge_owners(
        &mut updated.metadata.owner_references,
        desired.metadata.owner_references.as_deref(),
    );
    updated.ports = desired.ports.clone();
    updated.endpoints = desired.endpoints.clone();
    Some(updated)
}

#[cfg(test)]
mod tests;
