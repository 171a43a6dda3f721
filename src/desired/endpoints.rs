//! The legacy core/v1 Endpoints follower and its comparison with the live local object.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::api::PROTOCOL_TCP;
use super::meta::{self, StringMap};
use super::options::{
    EndpointsMode, FOLLOWER_VALUE, MAX_ENDPOINTS_ADDRESSES, OVER_CAPACITY_ANNOTATION,
    OVER_CAPACITY_TRUNCATED, Options, SKIP_MIRROR_LABEL,
};
use super::slices::{self, Group, PortKey};

/// `(ip, hostname)`, ordered.
type Addr = (String, Option<String>);

#[derive(Default)]
struct SubsetAddrs {
    ready: Vec<Addr>,
    not_ready: Vec<Addr>,
}

/// Subsets keyed by their (numbered) ports, addresses sorted and deduplicated by IP.
fn collect_subsets(groups: &[Group]) -> BTreeMap<Vec<PortKey>, SubsetAddrs> {
    let mut sets: BTreeMap<Vec<PortKey>, (BTreeSet<Addr>, BTreeSet<Addr>)> = BTreeMap::new();
    for group in groups {
        // FQDN endpoints cannot be represented in core/v1 Endpoints.
        if group.address_type != "IPv4" && group.address_type != "IPv6" {
            continue;
        }
        // A slice port without a number means "all ports", which Endpoints cannot express.
        let ports: Vec<PortKey> = group
            .ports
            .iter()
            .filter(|p| p.port.is_some())
            .cloned()
            .collect();
        let (ready, not_ready) = sets.entry(ports).or_default();
        for endpoint in &group.endpoints {
            let Some(ip) = endpoint.addresses.first() else {
                continue;
            };
            let addr = (ip.clone(), endpoint.hostname.clone());
            if slices::is_ready(endpoint) {
                ready.insert(addr);
            } else if !slices::is_terminating(endpoint) {
                not_ready.insert(addr);
            }
        }
    }
    sets.into_iter()
        .map(|(ports, (ready, not_ready))| {
            let ready = dedup_by_ip(ready.into_iter());
            let ready_ips: BTreeSet<&str> = ready.iter().map(|(ip, _)| ip.as_str()).collect();
            let not_ready = dedup_by_ip(
                not_ready
                    .into_iter()
                    .filter(|(ip, _)| !ready_ips.contains(ip.as_str())),
            );
            (ports, SubsetAddrs { ready, not_ready })
        })
        .collect()
}

/// Keeps the first address of each IP from an IP-sorted sequence.
fn dedup_by_ip(sorted: impl Iterator<Item = Addr>) -> Vec<Addr> {
    let mut out: Vec<Addr> = sorted.collect();
    out.dedup_by(|later, earlier| later.0 == earlier.0);
    out
}

/// Splits `budget` over `counts` in proportion, never giving one more than it has.
fn allocate(counts: &[usize], budget: usize) -> Vec<usize> {
    let total: usize = counts.iter().sum();
    if total <= budget {
        return counts.to_vec();
    }
    let mut shares: Vec<usize> = counts.iter().map(|c| c * budget / total).collect();
    let mut remaining = budget.saturating_sub(shares.iter().sum());
    for (share, count) in shares.iter_mut().zip(counts) {
        if remaining == 0 {
            break;
        }
        if *share < *count {
            *share += 1;
            remaining -= 1;
        }
    }
    shares
}

/// Caps the total number of addresses at [`MAX_ENDPOINTS_ADDRESSES`], keeping ready addresses
/// first and spreading the cut over the subsets in proportion. Returns whether it cut.
fn truncate(subsets: &mut [SubsetAddrs]) -> bool {
    let ready: Vec<usize> = subsets.iter().map(|s| s.ready.len()).collect();
    let not_ready: Vec<usize> = subsets.iter().map(|s| s.not_ready.len()).collect();
    let ready_total: usize = ready.iter().sum();
    let not_ready_total: usize = not_ready.iter().sum();
    if ready_total + not_ready_total <= MAX_ENDPOINTS_ADDRESSES {
        return false;
    }
    let ready_keep = allocate(&ready, MAX_ENDPOINTS_ADDRESSES);
    let not_ready_budget = MAX_ENDPOINTS_ADDRESSES.saturating_sub(ready_keep.iter().sum());
    let not_ready_keep = allocate(&not_ready, not_ready_budget);
    for ((subset, r), n) in subsets.iter_mut().zip(ready_keep).zip(not_ready_keep) {
        subset.ready.truncate(r);
        subset.not_ready.truncate(n);
    }
    true
}

fn to_addresses(addrs: Vec<Addr>) -> Option<Vec<EndpointAddress>> {
    (!addrs.is_empty()).then(|| {
        addrs
            .into_iter()
            .map(|(ip, hostname)| EndpointAddress {
                ip,
                hostname,
                node_name: None,
                target_ref: None,
            })
            .collect()
    })
}

fn to_port(port: &PortKey) -> Option<EndpointPort> {
    port.port.map(|number| EndpointPort {
        name: (!port.name.is_empty()).then(|| port.name.clone()),
        port: number,
        protocol: Some(port.protocol.clone()),
        app_protocol: port.app_protocol.clone(),
    })
}

/// The follower Endpoints. Like the slices, they carry our labels only (the leader's go on the
/// follower Service alone) and an empty copied-labels record, which removes the labels an
/// earlier release copied here.
pub(crate) fn desired_endpoints(
    groups: &[Group],
    name: &str,
    namespace: &str,
    opts: &Options,
) -> Endpoints {
    let (ports, mut addrs): (Vec<Vec<PortKey>>, Vec<SubsetAddrs>) =
        collect_subsets(groups).into_iter().unzip();
    let truncated = truncate(&mut addrs);

    let subsets: Vec<EndpointSubset> = ports
        .iter()
        .zip(addrs)
        .filter(|(_, a)| !a.ready.is_empty() || !a.not_ready.is_empty())
        .map(|(ports, a)| {
            let ports: Vec<EndpointPort> = ports.iter().filter_map(to_port).collect();
            EndpointSubset {
                addresses: to_addresses(a.ready),
                not_ready_addresses: to_addresses(a.not_ready),
                ports: (!ports.is_empty()).then_some(ports),
            }
        })
        .collect();

    let mut labels = StringMap::new();
    labels.insert(opts.label_key.clone(), FOLLOWER_VALUE.to_string());
    if opts.endpoints_mode == EndpointsMode::Both {
        labels.insert(SKIP_MIRROR_LABEL.to_string(), "true".to_string());
    }
    let mut annotations = meta::origin_annotations(namespace, name, opts);
    meta::record_copied_labels(&mut annotations, &StringMap::new(), opts);
    if truncated {
        annotations.insert(
            OVER_CAPACITY_ANNOTATION.to_string(),
            OVER_CAPACITY_TRUNCATED.to_string(),
        );
    }

    Endpoints {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            namespace: Some(namespace.to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        subsets: Some(subsets),
    }
}

type PortNorm = (String, i32, String, Option<String>);
type SubsetNorm = (Vec<PortNorm>, Vec<Addr>, Vec<Addr>);

fn normalised_addresses(addresses: Option<&Vec<EndpointAddress>>) -> Vec<Addr> {
    let mut out: Vec<Addr> = addresses
        .into_iter()
        .flatten()
        .map(|a| (a.ip.clone(), a.hostname.clone()))
        .collect();
    out.sort();
    out
}

fn normalised_subsets(subsets: Option<&Vec<EndpointSubset>>) -> Vec<SubsetNorm> {
    let mut out: Vec<SubsetNorm> = subsets
        .into_iter()
        .flatten()
        .map(|s| {
            let mut ports: Vec<PortNorm> = s
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    (
                        p.name.clone().unwrap_or_default(),
                        p.port,
                        p.protocol
                            .clone()
                            .unwrap_or_else(|| PROTOCOL_TCP.to_string()),
                        p.app_protocol.clone(),
                    )
                })
                .collect();
            ports.sort();
            (
                ports,
                normalised_addresses(s.addresses.as_ref()),
                normalised_addresses(s.not_ready_addresses.as_ref()),
            )
        })
        .collect();
    out.sort();
    out
}

/// Compares a live local follower Endpoints object with the desired one: `None` when nothing
/// needs writing, else the live object with our labels, annotations and subsets set (other
/// managers' labels and annotations kept). The skip-mirror label and the over-capacity
/// annotation, which we set only sometimes, are also removed when the desired object lacks them.
pub fn endpoints_change(actual: &Endpoints, desired: &Endpoints) -> Option<Endpoints> {
    let (a, d) = (&actual.metadata, &desired.metadata);
    let unchanged = meta::metadata_matches(a, d)
        && meta::conditional_key_matches(a.labels.as_ref(), d.labels.as_ref(), SKIP_MIRROR_LABEL)
        && meta::conditional_key_matches(
            a.annotations.as_ref(),
            d.annotations.as_ref(),
            OVER_CAPACITY_ANNOTATION,
        )
        && meta::owners_match(a.owner_references.as_deref(), d.owner_references.as_deref())
        && normalised_subsets(actual.subsets.as_ref())
            == normalised_subsets(desired.subsets.as_ref());
    if unchanged {
        return None;
    }
    let mut updated = actual.clone();
    let m = &mut updated.metadata;
    meta::merge_metadata(m, d);
    meta::sync_conditional_key(&mut m.labels, d.labels.as_ref(), SKIP_MIRROR_LABEL);
    meta::sync_conditional_key(
        &mut m.annotations,
        d.annotations.as_ref(),
        OVER_CAPACITY_ANNOTATION,
    );
    meta::merge_owners(&mut m.owner_references, d.owner_references.as_deref());
    updated.subsets = desired.subsets.clone();
    Some(updated)
}

#[cfg(test)]
mod tests;
