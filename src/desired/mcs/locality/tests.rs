use std::collections::BTreeSet;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

use super::*;
use crate::desired::mcs::ServiceExport;

/// A slice of `cluster` with endpoints (address, zone, ready, node).
fn slice(cluster: &str, endpoints: &[(&str, &str, bool, &str)]) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("derived-{cluster}"), "namespace": "demo",
            "labels": {"multicluster.kubernetes.io/source-cluster": cluster}},
        "addressType": "IPv4",
        "endpoints": endpoints.iter().map(|(a, z, ready, node)| json!({
            "addresses": [a], "zone": z, "conditions": {"ready": ready}, "nodeName": node,
        })).collect::<Vec<_>>(),
    }))
    .unwrap()
}

fn zones(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|z| z.to_string()).collect()
}

/// kube-proxy 1.34's choice for a client on `node` in `zone` (pkg/proxy/topology.go:
/// topologyModeFromHints, availableForTopology): the ready endpoints' addresses it sends to.
fn kube_proxy(slices: &[EndpointSlice], node: &str, zone: &str) -> Vec<String> {
    let ready: Vec<_> = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter(|e| is_ready(e))
        .collect();
    let names = |e: &&k8s_openapi::api::discovery::v1::Endpoint, nodes: bool| -> Vec<String> {
        let h = e.hints.as_ref();
        let list = if nodes {
            h.and_then(|h| h.for_nodes.as_ref())
                .map(|v| v.iter().map(|n| n.name.clone()).collect())
        } else {
            h.and_then(|h| h.for_zones.as_ref())
                .map(|v| v.iter().map(|z| z.name.clone()).collect())
        };
        list.unwrap_or_default()
    };
    let all_have = |nodes: bool| ready.iter().all(|e| !names(e, nodes).is_empty());
    let naming = |nodes: bool, what: &str| -> Vec<String> {
        ready
            .iter()
            .filter(|e| names(e, nodes).iter().any(|n| n == what))
            .map(|e| e.addresses[0].clone())
            .collect()
    };
    let mut to = if all_have(true) && !naming(true, node).is_empty() {
        naming(true, node)
    } else if all_have(false) && !naming(false, zone).is_empty() {
        naming(false, zone)
    } else {
        ready.iter().map(|e| e.addresses[0].clone()).collect()
    };
    to.sort();
    to
}

fn here<'a>(zones: &'a BTreeSet<String>) -> Here<'a> {
    Here {
        cluster: "west",
        zones,
    }
}

#[test]
fn prefer_close_keeps_a_healthy_clusters_clients_at_home() {
    let z = zones(&["west-a"]);
    let mut s = vec![
        slice(
            "east",
            &[
                ("10.2.0.1", "east-a", true, "e1"),
                ("10.2.0.2", "east-a", true, "e1"),
            ],
        ),
        slice(
            "west",
            &[
                ("10.1.0.1", "west-a", true, "w1"),
                ("10.1.0.2", "west-a", true, "w1"),
            ],
        ),
    ];
    let done = localize(&mut s, Preference::of(Some("PreferClose")), here(&z), &[]);
    assert_eq!(done, Localized::Hinted);
    assert_eq!(kube_proxy(&s, "w1", "west-a"), ["10.1.0.1", "10.1.0.2"]);
    let east = &s[0].endpoints[0].hints.as_ref().unwrap();
    assert_eq!(east.for_zones.as_ref().unwrap()[0].name, ELSEWHERE);
    assert!(
        east.for_nodes.is_none(),
        "node hints only for PreferSameNode"
    );
}

#[test]
fn a_cluster_with_no_ready_endpoint_of_its_own_falls_back_to_every_other() {
    let z = zones(&["west-a"]);
    // west's endpoints stopped being ready after the hints were set: kube-proxy falls back
    // with no write of ours
    let mut s = vec![
        slice("east", &[("10.2.0.1", "east-a", true, "e1")]),
        slice("west", &[("10.1.0.1", "west-a", true, "w1")]),
    ];
    localize(&mut s, Preference::Zone, here(&z), &[]);
    s[1].endpoints[0].conditions.as_mut().unwrap().ready = Some(false);
    assert_eq!(kube_proxy(&s, "w1", "west-a"), ["10.2.0.1"]);
    // and the next pass writes the same choice
    localize(&mut s, Preference::Zone, here(&z), &[]);
    assert_eq!(kube_proxy(&s, "w1", "west-a"), ["10.2.0.1"]);
    assert!(
        s[1].endpoints[0].hints.is_none(),
        "a not-ready endpoint carries no hints"
    );
}

#[test]
fn the_same_zone_comes_before_the_same_cluster_and_the_cluster_before_the_rest() {
    let z = zones(&["west-a", "west-b", "west-c"]);
    let mut s = vec![
        slice(
            "east",
            &[
                ("10.2.0.1", "west-b", true, "e1"),
                ("10.2.0.2", "east-a", true, "e2"),
            ],
        ),
        slice("west", &[("10.1.0.1", "west-a", true, "w1")]),
    ];
    localize(&mut s, Preference::Zone, here(&z), &[]);
    assert_eq!(kube_proxy(&s, "w1", "west-a"), ["10.1.0.1"], "own zone");
    assert_eq!(
        kube_proxy(&s, "w2", "west-b"),
        ["10.2.0.1"],
        "the same zone in east"
    );
    assert_eq!(
        kube_proxy(&s, "w3", "west-c"),
        ["10.1.0.1"],
        "no endpoint in the zone: own cluster"
    );
    // a zone that has no node yet (hints not rewritten): every ready endpoint
    assert_eq!(
        kube_proxy(&s, "w4", "west-d"),
        ["10.1.0.1", "10.2.0.1", "10.2.0.2"]
    );
}

#[test]
fn prefer_same_node_names_the_local_endpoints_nodes_then_zones() {
    let z = zones(&["west-a"]);
    let local = slice(
        "west",
        &[
            ("10.1.0.1", "west-a", true, "w1"),
            ("10.1.0.2", "west-a", true, "w2"),
        ],
    );
    let export = ServiceExport::default();
    let exports = [ClusterExport {
        cluster: "west",
        export: &export,
        service: None,
        slices: vec![&local],
    }];
    // the import's slices are built without nodeName
    let mut s = vec![
        slice("east", &[("10.2.0.1", "east-a", true, "")]),
        slice(
            "west",
            &[
                ("10.1.0.1", "west-a", true, ""),
                ("10.1.0.2", "west-a", true, ""),
            ],
        ),
    ];
    localize(
        &mut s,
        Preference::of(Some("PreferSameNode")),
        here(&z),
        &exports,
    );
    assert_eq!(kube_proxy(&s, "w1", "west-a"), ["10.1.0.1"]);
    assert_eq!(kube_proxy(&s, "w2", "west-a"), ["10.1.0.2"]);
    assert_eq!(
        kube_proxy(&s, "w3", "west-a"),
        ["10.1.0.1", "10.1.0.2"],
        "no endpoint on w3: its zone"
    );
}

#[test]
fn without_the_field_no_hints_and_old_ones_go() {
    let z = zones(&["west-a"]);
    let mut s = vec![slice("west", &[("10.1.0.1", "west-a", true, "w1")])];
    localize(&mut s, Preference::Zone, here(&z), &[]);
    assert!(s[0].endpoints[0].hints.is_some());
    for value in [None, Some("Cluster"), Some("SomethingNew")] {
        assert_eq!(
            localize(&mut s, Preference::of(value), here(&z), &[]),
            Localized::Even
        );
        assert!(s[0].endpoints[0].hints.is_none());
    }
}

#[test]
fn more_zones_than_an_endpoint_may_name_gives_no_hints() {
    let names: Vec<String> = (0..9).map(|i| format!("west-{i}")).collect();
    let z: BTreeSet<String> = names.into_iter().collect();
    let mut s = vec![slice("west", &[("10.1.0.1", "elsewhere", true, "w1")])];
    assert_eq!(
        localize(&mut s, Preference::Zone, here(&z), &[]),
        Localized::TooManyZones(9)
    );
    assert!(s[0].endpoints[0].hints.is_none());
}
