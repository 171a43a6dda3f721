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
    // the leader's labels go on the follower Service alone
    assert!(!labels.contains_key("app"), "{labels:?}");
    let annotations = ep.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.len(), 3);
    assert_eq!(annotations["fair.com/cross-cluster-copied-labels"], "");
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
fn labels_an_earlier_release_copied_onto_the_endpoints_are_removed() {
    let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let desired = run(&[&remote]);
    // what a release before issue 37 wrote: the leader's labels, and their record
    let mut actual = live(&desired); // also carries a local label "team"
    let labels = actual.metadata.labels.get_or_insert_default();
    labels.insert("app".into(), "web".into());
    labels.insert("tier".into(), "gold".into());
    actual.metadata.annotations.get_or_insert_default().insert(
        "fair.com/cross-cluster-copied-labels".into(),
        "app,tier".into(),
    );
    let updated = endpoints_change(&actual, &desired).expect("the copies must go");
    let labels = updated.metadata.labels.as_ref().unwrap();
    assert!(
        !labels.contains_key("tier") && !labels.contains_key("app"),
        "{labels:?}"
    );
    assert_eq!(labels["team"], "someone-else");
    assert_eq!(endpoints_change(&updated, &desired), None);
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
