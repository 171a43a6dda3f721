//! The legacy core/v1 Endpoints follower and its comparison with the live local object.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{EndpointAddress, EndpointPort, EndpointSubset, Endpoints};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::api::PROTOCOL_TCP;
use super::meta::{self, StringMap};
use super::options::{
    EndpointsMode, MAX_ENDPOINTS_ADDRESSES, OVER_CAPACITY_ANNOTATION, OVER_CAPACITY_TRUNCATED,
    Options, SKIP_MIRROR_LABEL,
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

pub(crate) fn desired_endpoints(
    groups: &[Group],
    name: &str,
    namespace: &str,
    service_labels: &StringMap,
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

    let mut labels = service_labels.clone();
    if opts.endpoints_mode == EndpointsMode::Both {
        labels.insert(SKIP_MIRROR_LABEL.to_string(), "true".to_string());
    }
    let mut annotations = meta::origin_annotations(namespace, name, opts);
    meta::record_copied_labels(&mut annotations, service_labels, opts);
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
mod tests {
    use super::*;
    use crate::desired::follower::{Follower, follower};
    use crate::desired::test_support::*;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::{Value, json};

    fn run_mode(slices: &[&EndpointSlice], mode: EndpointsMode) -> Follower {
        follower(&cluster_ip_service(), slices, &opts(mode)).unwrap()
    }

    fn run(slices: &[&EndpointSlice]) -> Endpoints {
        run_mode(slices, EndpointsMode::Endpoints)
            .endpoints
            .unwrap()
    }

    fn with_conditions(ip: &str, ready: bool, serving: bool, terminating: bool) -> Value {
        let mut e = endpoint(ip);
        e["conditions"] = json!({"ready": ready, "serving": serving, "terminating": terminating});
        e
    }

    fn ips(addresses: &Option<Vec<EndpointAddress>>) -> Vec<&str> {
        addresses.iter().flatten().map(|a| a.ip.as_str()).collect()
    }

    fn count(ep: &Endpoints) -> usize {
        ep.subsets
            .iter()
            .flatten()
            .map(|s| {
                s.addresses.as_ref().map_or(0, Vec::len)
                    + s.not_ready_addresses.as_ref().map_or(0, Vec::len)
            })
            .sum()
    }

    #[test]
    fn basic_endpoints() {
        let mut e = endpoint("10.0.0.2");
        e["hostname"] = json!("web-1");
        let remote = slice("web-a", "IPv4", web_ports(), vec![e, endpoint("10.0.0.1")]);
        let ep = run(&[&remote]);
        assert_eq!(ep.metadata.name.as_deref(), Some("web"));
        assert_eq!(ep.metadata.namespace.as_deref(), Some("shop"));
        let labels = ep.metadata.labels.as_ref().unwrap();
        assert_eq!(labels["fair.com/cross-cluster"], "follower");
        assert_eq!(labels["app"], "web");
        let annotations = ep.metadata.annotations.as_ref().unwrap();
        assert_eq!(annotations.len(), 3);
        assert_eq!(annotations["fair.com/cross-cluster-copied-labels"], "app");
        assert_eq!(
            annotations["fair.com/cross-cluster-origin-cluster"],
            "remote-a"
        );
        assert_eq!(
            annotations["fair.com/cross-cluster-origin-object"],
            "shop/web"
        );

        let subsets = ep.subsets.as_ref().unwrap();
        assert_eq!(subsets.len(), 1);
        let s = &subsets[0];
        assert_eq!(ips(&s.addresses), vec!["10.0.0.1", "10.0.0.2"]);
        let addresses = s.addresses.as_ref().unwrap();
        assert_eq!(addresses[1].hostname.as_deref(), Some("web-1"));
        assert!(
            addresses
                .iter()
                .all(|a| a.node_name.is_none() && a.target_ref.is_none())
        );
        assert!(s.not_ready_addresses.is_none());
        let ports = s.ports.as_ref().unwrap();
        assert_eq!(ports.len(), 2);
        assert_eq!(ports[0].name.as_deref(), Some("grpc"));
        assert_eq!(ports[0].port, 9090);
        assert_eq!(ports[0].app_protocol.as_deref(), Some("kubernetes.io/h2c"));
        assert_eq!(ports[1].name.as_deref(), Some("http"));
        assert_eq!(ports[1].protocol.as_deref(), Some("TCP"));
    }

    #[test]
    fn not_ready_and_terminating() {
        let remote = slice(
            "web-a",
            "IPv4",
            web_ports(),
            vec![
                endpoint("10.0.0.1"),
                with_conditions("10.0.0.2", false, false, false),
                with_conditions("10.0.0.3", false, true, true),
                with_conditions("10.0.0.4", true, true, true),
            ],
        );
        let ep = run(&[&remote]);
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(ips(&s.addresses), vec!["10.0.0.1", "10.0.0.4"]);
        assert_eq!(ips(&s.not_ready_addresses), vec!["10.0.0.2"]);
    }

    #[test]
    fn dual_stack_and_fqdn() {
        let v4 = slice("web-v4", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let v6 = slice("web-v6", "IPv6", web_ports(), vec![endpoint("fd00::1")]);
        let fqdn = slice(
            "web-f",
            "FQDN",
            web_ports(),
            vec![endpoint("db.example.com")],
        );
        let ep = run(&[&fqdn, &v6, &v4]);
        let subsets = ep.subsets.as_ref().unwrap();
        assert_eq!(subsets.len(), 1);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.0.0.1", "fd00::1"]);

        let only_fqdn = run(&[&fqdn]);
        assert_eq!(only_fqdn.subsets, Some(vec![]));
    }

    #[test]
    fn ipv6_only() {
        let v6 = slice(
            "web-v6",
            "IPv6",
            web_ports(),
            vec![endpoint("fd00::2"), endpoint("fd00::1")],
        );
        let ep = run(&[&v6]);
        assert_eq!(
            ips(&ep.subsets.as_ref().unwrap()[0].addresses),
            vec!["fd00::1", "fd00::2"]
        );
    }

    #[test]
    fn one_subset_per_port_set() {
        let a = slice(
            "web-a",
            "IPv4",
            json!([{"name": "http", "port": 8081}]),
            vec![endpoint("10.0.0.2")],
        );
        let b = slice(
            "web-b",
            "IPv4",
            json!([{"name": "http", "port": 8080}]),
            vec![endpoint("10.0.0.1")],
        );
        let ep = run(&[&a, &b]);
        let subsets = ep.subsets.as_ref().unwrap();
        assert_eq!(subsets.len(), 2);
        assert_eq!(subsets[0].ports.as_ref().unwrap()[0].port, 8080);
        assert_eq!(ips(&subsets[0].addresses), vec!["10.0.0.1"]);
        assert_eq!(subsets[1].ports.as_ref().unwrap()[0].port, 8081);
        assert_eq!(run(&[&b, &a]), ep);
    }

    #[test]
    fn unnamed_port_has_no_name() {
        let remote = slice(
            "web-a",
            "IPv4",
            json!([{"name": "", "port": 53, "protocol": "UDP"}]),
            vec![endpoint("10.0.0.1")],
        );
        let ep = run(&[&remote]);
        let port = &ep.subsets.as_ref().unwrap()[0].ports.as_ref().unwrap()[0];
        assert_eq!(port.name, None);
        assert_eq!(port.port, 53);
        assert_eq!(port.protocol.as_deref(), Some("UDP"));
    }

    #[test]
    fn no_addresses_gives_empty_subsets() {
        assert_eq!(run(&[]).subsets, Some(vec![]));
        let terminating = slice(
            "web-a",
            "IPv4",
            web_ports(),
            vec![with_conditions("10.0.0.3", false, false, true)],
        );
        assert_eq!(run(&[&terminating]).subsets, Some(vec![]));
    }

    fn many(prefix: &str, n: usize, ready: bool) -> Vec<Value> {
        (0..n)
            .map(|i| {
                with_conditions(
                    &format!("{prefix}.{}.{}", i / 250, i % 250),
                    ready,
                    ready,
                    false,
                )
            })
            .collect()
    }

    #[test]
    fn truncated_to_capacity() {
        let a = slice("web-a", "IPv4", web_ports(), many("10.1", 1000, true));
        let b = slice("web-b", "IPv4", web_ports(), many("10.2", 1000, true));
        let c = slice("web-c", "IPv4", web_ports(), many("10.3", 500, true));
        let f = run_mode(&[&a, &b, &c], EndpointsMode::Both);
        assert_eq!(f.slices.len(), 3);
        let ep = f.endpoints.unwrap();
        assert_eq!(count(&ep), MAX_ENDPOINTS_ADDRESSES);
        assert_eq!(
            ep.metadata.annotations.as_ref().unwrap()[OVER_CAPACITY_ANNOTATION],
            "truncated"
        );

        let small = run(&[&c]);
        assert_eq!(count(&small), 500);
        assert!(
            !small
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(OVER_CAPACITY_ANNOTATION)
        );
    }

    #[test]
    fn truncation_prefers_ready_and_spreads_over_subsets() {
        let ready = slice("web-a", "IPv4", web_ports(), many("10.1", 900, true));
        let not_ready = slice("web-b", "IPv4", web_ports(), many("10.2", 300, false));
        let ep = run(&[&not_ready, &ready]);
        let s = &ep.subsets.as_ref().unwrap()[0];
        assert_eq!(s.addresses.as_ref().unwrap().len(), 900);
        assert_eq!(s.not_ready_addresses.as_ref().unwrap().len(), 100);

        let p1 = slice(
            "web-c",
            "IPv4",
            json!([{"name": "a", "port": 1}]),
            many("10.3", 1500, true),
        );
        let p2 = slice(
            "web-d",
            "IPv4",
            json!([{"name": "a", "port": 2}]),
            many("10.4", 500, true),
        );
        let ep = run(&[&p1, &p2]);
        let subsets = ep.subsets.as_ref().unwrap();
        assert_eq!(subsets[0].addresses.as_ref().unwrap().len(), 750);
        assert_eq!(subsets[1].addresses.as_ref().unwrap().len(), 250);
        assert_eq!(allocate(&[1, 1, 1], 2), vec![1, 1, 0]);
        assert_eq!(allocate(&[5, 0, 7], 20), vec![5, 0, 7]);
    }

    #[test]
    fn skip_mirror_only_in_both_mode() {
        let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let both = run_mode(&[&remote], EndpointsMode::Both).endpoints.unwrap();
        assert_eq!(
            both.metadata.labels.as_ref().unwrap()[SKIP_MIRROR_LABEL],
            "true"
        );
        let only = run(&[&remote]);
        assert!(
            !only
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(SKIP_MIRROR_LABEL)
        );

        // Switching from Both to Endpoints removes the label from the live object.
        let updated = endpoints_change(&both, &only).unwrap();
        assert!(
            !updated
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(SKIP_MIRROR_LABEL)
        );
        assert_eq!(endpoints_change(&updated, &only), None);
    }

    fn live(desired: &Endpoints) -> Endpoints {
        let mut v = serde_json::to_value(desired).unwrap();
        v["metadata"]["resourceVersion"] = json!("9");
        v["metadata"]["labels"]["team"] = json!("someone-else");
        v["metadata"]["annotations"]["endpoints.kubernetes.io/last-change-trigger-time"] =
            json!("2024-01-01T00:00:00Z");
        if let Some(subsets) = v["subsets"].as_array_mut() {
            for s in subsets {
                if let Some(a) = s["addresses"].as_array_mut() {
                    a.reverse();
                }
                if let Some(p) = s["ports"].as_array_mut() {
                    p.reverse();
                }
            }
        }
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn endpoints_change_unchanged() {
        let remote = slice(
            "web-a",
            "IPv4",
            web_ports(),
            vec![endpoint("10.0.0.1"), endpoint("10.0.0.2")],
        );
        let desired = run(&[&remote]);
        assert_eq!(endpoints_change(&desired, &desired), None);
        assert_eq!(endpoints_change(&live(&desired), &desired), None);

        // Empty subsets come back from the API server as null.
        let empty = run(&[]);
        let mut live_empty = live(&empty);
        live_empty.subsets = None;
        assert_eq!(endpoints_change(&live_empty, &empty), None);
    }

    #[test]
    fn a_label_dropped_by_the_exported_service_leaves_the_endpoints_too() {
        let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let mut tiered = cluster_ip_service();
        let labels = tiered.metadata.labels.get_or_insert_with(Default::default);
        labels.insert("tier".into(), "gold".into());
        let o = opts(EndpointsMode::Endpoints);
        let before = follower(&tiered, &[&remote], &o).unwrap();
        let actual = live(&before.endpoints.unwrap()); // also carries a local label "team"
        let after = run(&[&remote]);
        let updated = endpoints_change(&actual, &after).expect("the label must go");
        let labels = updated.metadata.labels.as_ref().unwrap();
        assert!(!labels.contains_key("tier"), "{labels:?}");
        assert_eq!(labels["team"], "someone-else");
        assert_eq!(endpoints_change(&updated, &after), None);
    }

    #[test]
    fn endpoints_change_changed() {
        let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
        let actual = live(&run(&[&remote]));
        let grown = slice(
            "web-a",
            "IPv4",
            web_ports(),
            vec![endpoint("10.0.0.1"), endpoint("10.0.0.2")],
        );
        let desired = run(&[&grown]);
        let updated = endpoints_change(&actual, &desired).unwrap();
        assert_eq!(updated.metadata.resource_version.as_deref(), Some("9"));
        assert_eq!(
            updated.metadata.labels.as_ref().unwrap()["team"],
            "someone-else"
        );
        assert_eq!(updated.subsets, desired.subsets);
        assert_eq!(endpoints_change(&updated, &desired), None);

        // A stale over-capacity annotation is removed.
        let mut stale = live(&desired);
        stale
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(OVER_CAPACITY_ANNOTATION.into(), "truncated".into());
        let fixed = endpoints_change(&stale, &desired).unwrap();
        assert!(
            !fixed
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key(OVER_CAPACITY_ANNOTATION)
        );
        assert!(
            fixed
                .metadata
                .annotations
                .as_ref()
                .unwrap()
                .contains_key("endpoints.kubernetes.io/last-change-trigger-time")
        );

        // A ready address turning not ready is a change.
        let flipped = slice(
            "web-a",
            "IPv4",
            web_ports(),
            vec![with_conditions("10.0.0.1", false, false, false)],
        );
        assert!(endpoints_change(&actual, &run(&[&flipped])).is_some());
    }
}
