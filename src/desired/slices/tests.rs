use super::*;
use crate::desired::follower::{Follower, follower};
use crate::desired::options::EndpointsMode;
use crate::desired::test_support::*;
use k8s_openapi::api::discovery::v1::EndpointConditions;
use serde_json::{Value, json};

fn conditions_of(e: &Endpoint) -> EndpointConditions {
    let (ready, serving, terminating) = conditions(e);
    EndpointConditions {
        ready,
        serving,
        terminating,
    }
}

fn run(slices: &[&EndpointSlice]) -> Follower {
    follower(&cluster_ip_service(), slices, &opts(EndpointsMode::Slices)).unwrap()
}

fn many(prefix: &str, count: usize) -> Vec<Value> {
    (0..count)
        .map(|i| endpoint(&format!("{prefix}.{}.{}", i / 250, i % 250)))
        .collect()
}

#[test]
fn basic_slice() {
    let mut ep = endpoint("10.0.0.1");
    ep["hostname"] = json!("web-0");
    ep["hints"] = json!({"forZones": [{"name": "zone-a"}]});
    ep["deprecatedTopology"] = json!({"kubernetes.io/hostname": "node-1"});
    let remote = slice("web-abc", "IPv4", web_ports(), vec![ep]);
    let f = run(&[&remote]);
    assert_eq!(f.slices.len(), 1);
    let s = &f.slices[0];
    let name = s.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("web-") && name.ends_with("-0"), "{name}");
    assert_eq!(name.len(), "web-".len() + 8 + "-0".len());
    assert!(meta::is_dns1123_subdomain(name));
    assert_eq!(s.metadata.namespace.as_deref(), Some("shop"));
    assert_eq!(s.address_type, "IPv4");

    let labels = s.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["kubernetes.io/service-name"], "web");
    assert_eq!(labels["endpointslice.kubernetes.io/managed-by"], MANAGED_BY);
    assert_eq!(labels["fair.com/cross-cluster"], "follower");
    // the leader's labels go on the follower Service alone
    assert!(!labels.contains_key("app"), "{labels:?}");
    let annotations = s.metadata.annotations.as_ref().unwrap();
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
    assert!(s.metadata.owner_references.is_none());

    let ports = s.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 2);
    // Canonical order: by name.
    assert_eq!(ports[0].name.as_deref(), Some("grpc"));
    assert_eq!(ports[0].app_protocol.as_deref(), Some("kubernetes.io/h2c"));
    assert_eq!(ports[1].name.as_deref(), Some("http"));
    assert_eq!(ports[1].port, Some(8080));
    assert_eq!(ports[1].protocol.as_deref(), Some("TCP"));

    let e = &s.endpoints[0];
    assert_eq!(e.addresses, vec!["10.0.0.1"]);
    assert_eq!(e.hostname.as_deref(), Some("web-0"));
    assert_eq!(e.zone.as_deref(), Some("zone-a"));
    assert_eq!(
        e.conditions,
        Some(EndpointConditions {
            ready: Some(true),
            serving: Some(true),
            terminating: Some(false)
        })
    );
    assert!(e.node_name.is_none());
    assert!(e.target_ref.is_none());
    assert!(e.hints.is_none());
    assert!(e.deprecated_topology.is_none());
}

#[test]
fn unnamed_port_gets_api_defaults() {
    let remote = slice(
        "web-abc",
        "IPv4",
        json!([{"port": 53}]),
        vec![endpoint("10.0.0.1")],
    );
    let f = run(&[&remote]);
    let ports = f.slices[0].ports.as_ref().unwrap();
    assert_eq!(ports[0].name.as_deref(), Some(""));
    assert_eq!(ports[0].protocol.as_deref(), Some("TCP"));
    assert_eq!(ports[0].port, Some(53));
}

#[test]
fn not_ready_and_terminating_are_kept_in_slices() {
    let mut not_ready = endpoint("10.0.0.2");
    not_ready["conditions"] = json!({"ready": false, "serving": false, "terminating": false});
    let mut terminating = endpoint("10.0.0.3");
    terminating["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
    let remote = slice(
        "web-abc",
        "IPv4",
        web_ports(),
        vec![terminating, endpoint("10.0.0.1"), not_ready],
    );
    let f = run(&[&remote]);
    let eps = &f.slices[0].endpoints;
    assert_eq!(eps.len(), 3);
    assert_eq!(eps[0].addresses, vec!["10.0.0.1"]);
    assert_eq!(conditions_of(&eps[1]).ready, Some(false));
    assert_eq!(conditions_of(&eps[1]).terminating, Some(false));
    assert_eq!(
        conditions_of(&eps[2]),
        EndpointConditions {
            ready: Some(false),
            serving: Some(true),
            terminating: Some(true)
        }
    );
}

#[test]
fn dual_stack_slices() {
    let v4 = slice("web-v4", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let v6 = slice("web-v6", "IPv6", web_ports(), vec![endpoint("fd00::1")]);
    let f = run(&[&v6, &v4]);
    assert_eq!(f.slices.len(), 2);
    let mut types: Vec<&str> = f.slices.iter().map(|s| s.address_type.as_str()).collect();
    types.sort();
    assert_eq!(types, vec!["IPv4", "IPv6"]);
    assert_ne!(f.slices[0].metadata.name, f.slices[1].metadata.name);
}

#[test]
fn ipv6_only_and_fqdn() {
    let v6 = slice(
        "web-v6",
        "IPv6",
        web_ports(),
        vec![endpoint("fd00::2"), endpoint("fd00::1")],
    );
    let f = run(&[&v6]);
    assert_eq!(f.slices.len(), 1);
    assert_eq!(f.slices[0].address_type, "IPv6");
    assert_eq!(f.slices[0].endpoints[0].addresses, vec!["fd00::1"]);

    let fqdn = slice(
        "web-fqdn",
        "FQDN",
        web_ports(),
        vec![endpoint("db.example.com")],
    );
    let f = run(&[&fqdn]);
    assert_eq!(f.slices[0].address_type, "FQDN");
    assert_eq!(f.slices[0].endpoints[0].addresses, vec!["db.example.com"]);
}

#[test]
fn different_port_sets_become_different_slices() {
    let a = slice(
        "web-a",
        "IPv4",
        json!([{"name": "http", "port": 8080}]),
        vec![endpoint("10.0.0.1")],
    );
    let b = slice(
        "web-b",
        "IPv4",
        json!([{"name": "http", "port": 8081}]),
        vec![endpoint("10.0.0.2")],
    );
    let f = run(&[&a, &b]);
    assert_eq!(f.slices.len(), 2);
    assert!(f.slices.iter().all(|s| s.endpoints.len() == 1));
}

#[test]
fn large_service_is_chunked() {
    let remote_a = slice("web-a", "IPv4", web_ports(), many("10.1", 1000));
    let remote_b = slice("web-b", "IPv4", web_ports(), many("10.2", 1000));
    let remote_c = slice("web-c", "IPv4", web_ports(), many("10.3", 500));
    let f = run(&[&remote_a, &remote_b, &remote_c]);
    assert_eq!(f.slices.len(), 3);
    assert!(
        f.slices
            .iter()
            .all(|s| s.endpoints.len() <= MAX_ENDPOINTS_PER_SLICE)
    );
    let total: usize = f.slices.iter().map(|s| s.endpoints.len()).sum();
    assert_eq!(total, 2500);
    let names: Vec<&str> = f
        .slices
        .iter()
        .map(|s| s.metadata.name.as_deref().unwrap())
        .collect();
    assert!(names[0].ends_with("-0") && names[1].ends_with("-1") && names[2].ends_with("-2"));
    assert_eq!(
        names[0].trim_end_matches("-0"),
        names[2].trim_end_matches("-2")
    );
}

#[test]
fn duplicates_are_deduped() {
    let mut stale = endpoint("10.0.0.1");
    stale["conditions"] = json!({"ready": false, "serving": false, "terminating": true});
    let a = slice(
        "web-a",
        "IPv4",
        web_ports(),
        vec![stale, endpoint("10.0.0.2")],
    );
    let b = slice(
        "web-b",
        "IPv4",
        web_ports(),
        vec![endpoint("10.0.0.1"), endpoint("10.0.0.2")],
    );
    let f = run(&[&a, &b]);
    assert_eq!(f.slices.len(), 1);
    let eps = &f.slices[0].endpoints;
    assert_eq!(eps.len(), 2);
    // The healthiest copy wins.
    assert_eq!(conditions_of(&eps[0]).ready, Some(true));
    let g = run(&[&b, &a]);
    assert_eq!(f, g);
}

#[test]
fn output_is_independent_of_input_order() {
    let mut a_eps = many("10.1", 30);
    let a = slice("web-a", "IPv4", web_ports(), a_eps.clone());
    let b = slice("web-b", "IPv4", web_ports(), many("10.2", 30));
    let v6 = slice("web-v6", "IPv6", web_ports(), vec![endpoint("fd00::1")]);
    let first = run(&[&a, &b, &v6]);

    a_eps.reverse();
    let mut reversed_ports = web_ports();
    reversed_ports.as_array_mut().unwrap().reverse();
    let a2 = slice("web-a", "IPv4", reversed_ports, a_eps);
    let second = run(&[&v6, &b, &a2]);
    assert_eq!(first, second);
}

#[test]
fn long_service_names_give_valid_slice_names() {
    let long = "s".repeat(63);
    let mut svc = cluster_ip_service();
    svc.metadata.name = Some(long.clone());
    let mut remote = slice("x", "IPv4", web_ports(), many("10.1", 1500));
    remote
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.into(), long.clone());
    let f = follower(&svc, &[&remote], &opts(EndpointsMode::Slices)).unwrap();
    assert_eq!(f.slices.len(), 2);
    for s in &f.slices {
        let name = s.metadata.name.as_deref().unwrap();
        assert!(name.len() <= 253);
        assert!(name.starts_with(&long));
        assert!(meta::is_dns1123_subdomain(name), "{name}");
        assert_eq!(
            s.metadata.labels.as_ref().unwrap()[SERVICE_NAME_LABEL],
            long
        );
    }

    // Even an impossible 300-character name is guarded.
    let name = slice_name(
        &format!("{}-{}", "a".repeat(240), "b".repeat(59)),
        "0a1b2c3d",
        12,
    );
    assert!(name.len() <= 253, "{}", name.len());
    assert!(meta::is_dns1123_subdomain(&name), "{name}");
    assert!(name.ends_with("-0a1b2c3d-12"));
}

#[test]
fn our_slice_labels_override_copied_ones() {
    let mut svc = cluster_ip_service();
    let labels = svc.metadata.labels.as_mut().unwrap();
    labels.insert(SERVICE_NAME_LABEL.into(), "spoofed".into());
    labels.insert(MANAGED_BY_LABEL.into(), "someone-else".into());
    let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let f = follower(&svc, &[&remote], &opts(EndpointsMode::Slices)).unwrap();
    let labels = f.slices[0].metadata.labels.as_ref().unwrap();
    assert_eq!(labels[SERVICE_NAME_LABEL], "web");
    assert_eq!(labels[MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(labels["fair.com/cross-cluster"], "follower");
    // Reserved labels are never copied, and the export label turns into follower.
    let service_labels = f.service.metadata.labels.as_ref().unwrap();
    assert!(!service_labels.contains_key(SERVICE_NAME_LABEL));
    assert!(!service_labels.contains_key(MANAGED_BY_LABEL));
    assert_eq!(service_labels["fair.com/cross-cluster"], "follower");
}

#[test]
fn no_or_empty_remote_slices_give_no_slices() {
    assert!(run(&[]).slices.is_empty());
    let empty = slice("web-a", "IPv4", web_ports(), vec![]);
    let f = run(&[&empty]);
    assert!(f.slices.is_empty());
}

fn live(desired: &EndpointSlice) -> EndpointSlice {
    let mut v = serde_json::to_value(desired).unwrap();
    v["metadata"]["resourceVersion"] = json!("77");
    v["metadata"]["uid"] = json!("slice-uid");
    v["metadata"]["labels"]["team"] = json!("someone-else");
    v["metadata"]["annotations"]["note"] = json!("someone-else");
    if let Some(ports) = v["ports"].as_array_mut() {
        ports.reverse();
    }
    serde_json::from_value(v).unwrap()
}

#[test]
fn slice_change_unchanged() {
    let remote = slice("web-a", "IPv4", web_ports(), many("10.1", 5));
    let mut f = run(&[&remote]);
    set_slice_owner(&mut f.slices, "web", "local-svc-uid");
    let desired = &f.slices[0];
    assert_eq!(slice_change(desired, desired), None);
    let mut actual = live(desired);
    actual.endpoints.reverse();
    assert_eq!(slice_change(&actual, desired), None);

    // Unset name/protocol on desired compare equal to the defaulted live values.
    let mut bare = desired.clone();
    for p in bare.ports.as_mut().unwrap() {
        p.protocol = None;
    }
    assert_eq!(slice_change(&actual, &bare), None);
}

#[test]
fn slice_change_changed() {
    let remote = slice("web-a", "IPv4", web_ports(), many("10.1", 5));
    let mut f = run(&[&remote]);
    set_slice_owner(&mut f.slices, "web", "local-svc-uid");
    let actual = live(&f.slices[0]);

    let remote = slice("web-a", "IPv4", web_ports(), many("10.1", 6));
    let mut g = run(&[&remote]);
    set_slice_owner(&mut g.slices, "web", "local-svc-uid");
    let updated = slice_change(&actual, &g.slices[0]).unwrap();
    assert_eq!(updated.endpoints.len(), 6);
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("77"));
    assert_eq!(
        updated.metadata.labels.as_ref().unwrap()["team"],
        "someone-else"
    );
    assert_eq!(slice_change(&updated, &g.slices[0]), None);

    // A condition flip is a change.
    let mut flipped = f.slices[0].clone();
    flipped.endpoints[0].conditions = Some(EndpointConditions {
        ready: Some(false),
        serving: Some(false),
        terminating: Some(true),
    });
    assert!(slice_change(&actual, &flipped).is_some());

    // A missing ownerReference is a change.
    let mut without_owner = actual.clone();
    without_owner.metadata.owner_references = None;
    let fixed = slice_change(&without_owner, &f.slices[0]).unwrap();
    assert_eq!(
        fixed.metadata.owner_references,
        f.slices[0].metadata.owner_references
    );

    // A missing label we set is a change.
    let mut without_label = actual.clone();
    without_label
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(MANAGED_BY_LABEL);
    assert!(slice_change(&without_label, &f.slices[0]).is_some());
}

#[test]
fn labels_an_earlier_release_copied_onto_a_slice_are_removed() {
    let remote = slice("web-a", "IPv4", web_ports(), many("10.1", 2));
    let desired = run(&[&remote]);
    // what a release before issue 37 wrote: the leader's labels, and their record
    let mut actual = live(&desired.slices[0]); // also carries a local label "team"
    let labels = actual.metadata.labels.get_or_insert_default();
    labels.insert("app".into(), "web".into());
    labels.insert("tier".into(), "gold".into());
    actual.metadata.annotations.get_or_insert_default().insert(
        "fair.com/cross-cluster-copied-labels".into(),
        "app,tier".into(),
    );
    let updated = slice_change(&actual, &desired.slices[0]).expect("the copies must go");
    let labels = updated.metadata.labels.as_ref().unwrap();
    assert!(
        !labels.contains_key("tier") && !labels.contains_key("app"),
        "{labels:?}"
    );
    assert_eq!(labels["team"], "someone-else");
    assert_eq!(slice_change(&updated, &desired.slices[0]), None);
}

#[test]
fn slice_change_address_type() {
    let remote = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let f = run(&[&remote]);
    let mut actual = live(&f.slices[0]);
    actual.address_type = "IPv6".into();
    actual.metadata.name = Some("web-old-0".into());
    let replacement = slice_change(&actual, &f.slices[0]).unwrap();
    assert_eq!(replacement.address_type, "IPv4");
    assert_eq!(replacement.metadata.name.as_deref(), Some("web-old-0"));
    assert_eq!(replacement.metadata.resource_version.as_deref(), Some("77"));
    assert_eq!(replacement.endpoints, f.slices[0].endpoints);
}

#[test]
fn set_slice_owner_sets_controller_reference() {
    let a = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let b = slice("web-b", "IPv6", web_ports(), vec![endpoint("fd00::1")]);
    let mut f = run(&[&a, &b]);
    set_slice_owner(&mut f.slices, "web", "uid-123");
    for s in &f.slices {
        let owners = s.metadata.owner_references.as_ref().unwrap();
        assert_eq!(
            owners,
            &vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Service".into(),
                name: "web".into(),
                uid: "uid-123".into(),
                controller: Some(true),
                block_owner_deletion: None,
            }]
        );
    }
    let v = serde_json::to_value(&f.slices[0]).unwrap();
    assert!(
        v["metadata"]["ownerReferences"][0]
            .get("blockOwnerDeletion")
            .is_none()
    );
}

#[test]
fn a_change_of_hints_is_a_change_and_their_order_is_not() {
    use k8s_openapi::api::discovery::v1::{EndpointHints, ForNode, ForZone};
    let remote = slice("web-a", "IPv4", web_ports(), many("10.1", 2));
    let mut f = run(&[&remote]);
    set_slice_owner(&mut f.slices, "web", "local-svc-uid");
    let plain = live(&f.slices[0]);
    let zones = |names: &[&str]| EndpointHints {
        for_zones: Some(
            names
                .iter()
                .map(|n| ForZone {
                    name: n.to_string(),
                })
                .collect(),
        ),
        for_nodes: None,
    };
    let mut hinted = f.slices[0].clone();
    hinted.endpoints[0].hints = Some(zones(&["west-a", "west-b"]));
    let written = slice_change(&plain, &hinted).expect("hints added: a write");
    assert_eq!(written.endpoints, hinted.endpoints);
    let mut reordered = hinted.clone();
    reordered.endpoints[0].hints = Some(zones(&["west-b", "west-a"]));
    assert_eq!(slice_change(&live(&hinted), &reordered), None);
    let mut other = hinted.clone();
    other.endpoints[0].hints = Some(zones(&["west-a"]));
    assert!(slice_change(&live(&hinted), &other).is_some());
    let mut nodes = hinted.clone();
    nodes.endpoints[0].hints.as_mut().unwrap().for_nodes =
        Some(vec![ForNode { name: "w1".into() }]);
    assert!(slice_change(&live(&hinted), &nodes).is_some());
    // and hints removed (the field unset) are a write too
    assert!(slice_change(&live(&hinted), &f.slices[0]).is_some());
}
