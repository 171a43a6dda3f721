use super::*;
use crate::desired::mcs::change::{Change, derived_change, import_change, mcs_slice_change};
use crate::desired::mcs::test_support::*;
use crate::desired::mcs::types::{HEADLESS, ServiceExport};
use crate::desired::test_support::endpoint;
use serde_json::{Value, json};

/// A slice of `shop/hello` as kube-controller-manager writes it.
fn kcm_slice(name: &str, address_type: &str, endpoints: Vec<Value>) -> EndpointSlice {
    kcm_slice_with(
        name,
        address_type,
        json!([{"name": "tcp", "port": 42, "protocol": "TCP"},
                   {"name": "udp", "port": 42, "protocol": "UDP"}]),
        endpoints,
    )
}

/// A slice of `shop/hello` with these ports (kube-controller-manager writes the Service
/// ports' names and protocols with the pods' target port numbers).
fn kcm_slice_with(
    name: &str,
    address_type: &str,
    ports: Value,
    endpoints: Vec<Value>,
) -> EndpointSlice {
    serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "shop",
                         "labels": {"kubernetes.io/service-name": "hello",
                                    "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
}

/// Each desired slice's source cluster with its ports as `name/protocol/number`.
fn slice_ports(got: &Import) -> Vec<(String, Vec<String>)> {
    got.slices
        .iter()
        .map(|s| {
            let cluster = crate::desired::mcs::slice_source_cluster(s).unwrap_or_default();
            let ports = s
                .ports
                .iter()
                .flatten()
                .map(|p| {
                    format!(
                        "{}/{}/{}",
                        p.name.as_deref().unwrap_or(""),
                        p.protocol.as_deref().unwrap_or(""),
                        p.port.unwrap_or_default()
                    )
                })
                .collect();
            (cluster.to_string(), ports)
        })
        .collect()
}

/// The StrictPortConflict spec of the suite's connectivity.go: cluster 2's hello has only
/// `tcp` 4242 (targetPort 42) against cluster 1's `tcp` 42 and `udp` 42.
fn strict_port_conflict(
    b: &Bed,
    east: &Service,
    west: &Service,
    east_slice: &EndpointSlice,
    west_slice: &EndpointSlice,
    ips: &[&str],
) -> Import {
    let exports = [
        ClusterExport {
            cluster: "west",
            export: &b.newer,
            service: Some(west),
            slices: vec![west_slice],
        },
        ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(east),
            slices: vec![east_slice],
        },
    ];
    if ips.is_empty() {
        let first = import("shop", "hello", &exports, None, None)
            .unwrap()
            .unwrap();
        let live_si = created(&first.service_import);
        import("shop", "hello", &exports, Some(&live_si), None)
            .unwrap()
            .unwrap()
    } else {
        converge(&exports, ips, &["IPv4"])
    }
}

/// The live ServiceImport as the API server returns `desired` once created.
fn created(desired: &ServiceImport) -> ServiceImport {
    let mut si = desired.clone();
    si.metadata.uid = Some("si-uid".into());
    si.metadata.resource_version = Some("7".into());
    si
}

/// A live derived Service with these clusterIPs.
fn live_derived(desired: &Service, ips: &[&str], families: &[&str]) -> Service {
    let mut v = serde_json::to_value(desired).unwrap();
    v["metadata"]["uid"] = json!("derived-uid");
    v["spec"]["clusterIP"] = json!(ips[0]);
    v["spec"]["clusterIPs"] = json!(ips);
    v["spec"]["ipFamilies"] = json!(families);
    v["spec"]["internalTrafficPolicy"] = json!("Cluster");
    serde_json::from_value(v).unwrap()
}

struct Bed {
    older: ServiceExport,
    newer: ServiceExport,
}

fn bed() -> Bed {
    Bed {
        older: export("east", "2024-01-01T00:00:00Z"),
        newer: export("west", "2024-01-01T00:00:02Z"),
    }
}

/// Runs the import to its fixed point as the wiring would: create the ServiceImport, then
/// the derived Service (which the API server gives `ips`), then fill in the IPs.
fn converge(exports: &[ClusterExport<'_>], ips: &[&str], families: &[&str]) -> Import {
    let first = import("shop", "hello", exports, None, None)
        .unwrap()
        .unwrap();
    assert!(first.derived.is_none() && first.slices.is_empty());
    let live_si = created(&first.service_import);
    let second = import("shop", "hello", exports, Some(&live_si), None)
        .unwrap()
        .unwrap();
    let derived = second.derived.clone().unwrap();
    let live = live_derived(&derived, ips, families);
    import("shop", "hello", exports, Some(&live_si), Some(&live))
        .unwrap()
        .unwrap()
}

#[test]
fn derived_names_match_the_reference_controller() {
    // computed with mcs-api's derivedName (Go: base32.HexEncoding of sha256)
    assert_eq!(derived_name("shop", "web"), "derived-isrlchlhrq");
    assert_eq!(
        derived_name("mcs-conformance-1", "hello"),
        "derived-ekn3sqmcj3"
    );
    let long = derived_name(&"n".repeat(63), &"s".repeat(63));
    assert_eq!(long.len(), "derived-".len() + 10);
    assert!(meta::is_dns1123_subdomain(&long) && !long.contains('.'));
}

#[test]
fn cluster_ip_export_conformance() {
    let b = bed();
    let svc = hello();
    let ep = kcm_slice("hello-abc", "IPv4", vec![endpoint("10.1.0.5")]);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&ep],
    }];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let si = &got.service_import;
    assert_eq!(si.metadata.name.as_deref(), Some("hello"));
    assert_eq!(si.spec.type_, CLUSTER_SET_IP);
    // conformance: ports, affinity and its config, traffic policy as the Service's
    let ports: Vec<(&str, &str, i32)> = si
        .spec
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.protocol.as_str(), p.port))
        .collect();
    assert_eq!(ports, [("tcp", "TCP", 42), ("udp", "UDP", 42)]);
    assert_eq!(si.spec.session_affinity, "ClientIP");
    assert_eq!(
        si.spec.session_affinity_config,
        svc.spec.as_ref().unwrap().session_affinity_config
    );
    assert_eq!(si.spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert_eq!(si.spec.traffic_distribution, None);
    // conformance: one IP per family, in the same order
    assert_eq!(si.spec.ips, ["10.96.7.7"]);
    assert_eq!(si.spec.ip_families, ["IPv4"]);
    let clusters: Vec<&str> = si
        .status
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .map(|c| c.cluster.as_str())
        .collect();
    assert_eq!(clusters, ["east"]);
    // conformance (optional): the Service's labels and annotations are not exported
    let labels = si.metadata.labels.as_ref().unwrap();
    assert!(!labels.contains_key("dummy-svc"));
    assert_eq!(labels[OWNER_LABEL], MANAGED_BY);
    assert_eq!(
        si.metadata.annotations.as_ref().unwrap()[DERIVED_SERVICE_ANNOTATION],
        derived_name("shop", "hello")
    );

    let derived = got.derived.as_ref().unwrap();
    let spec = derived.spec.as_ref().unwrap();
    assert_eq!(derived.metadata.name, Some(derived_name("shop", "hello")));
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert!(spec.selector.is_none() && spec.cluster_ip.is_none());
    assert_eq!(spec.ports.as_ref().unwrap().len(), 2);
    assert_eq!(spec.session_affinity.as_deref(), Some("ClientIP"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    let owner = &derived.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
        ("ServiceImport", "hello", "si-uid")
    );
    assert_eq!(owner.api_version, "multicluster.x-k8s.io/v1beta1");
    assert!(derived_is_ours(derived));

    // conformance (optional): an MCS slice with the MCS labels, not made by the KCM
    assert_eq!(got.slices.len(), 1);
    let s = &got.slices[0];
    let l = s.metadata.labels.as_ref().unwrap();
    assert_eq!(l[MCS_SERVICE_NAME_LABEL], "hello");
    assert_eq!(l[MCS_SOURCE_CLUSTER_LABEL], "east");
    assert_eq!(l[SERVICE_NAME_LABEL], derived_name("shop", "hello"));
    assert_eq!(l[MANAGED_BY_LABEL], MANAGED_BY);
    assert_eq!(l.len(), 4);
    assert!(s.metadata.annotations.is_none());
    assert_eq!(s.metadata.owner_references.as_ref().unwrap()[0], *owner);
    let name = s.metadata.name.as_deref().unwrap();
    assert!(name.starts_with(&format!("{}-", derived_name("shop", "hello"))));
    assert!(meta::is_dns1123_subdomain(name));
    let e = &s.endpoints[0];
    assert_eq!(e.addresses, ["10.1.0.5"]);
    assert!(e.node_name.is_none() && e.target_ref.is_none());
    assert_eq!(e.zone.as_deref(), Some("zone-a"));
    assert!(got.conflicts.is_empty() && got.dropped.is_empty());
}

#[test]
fn the_fixed_point_writes_nothing() {
    let b = bed();
    let (a, c) = (hello(), hello());
    let (ea, ec) = (
        kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]),
        kcm_slice("hello-c", "IPv4", vec![endpoint("10.2.0.5")]),
    );
    let exports = [
        ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&a),
            slices: vec![&ea],
        },
        ClusterExport {
            cluster: "west",
            export: &b.newer,
            service: Some(&c),
            slices: vec![&ec],
        },
    ];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let mut live_si = created(&got.service_import);
    assert_eq!(
        import_change(Some(&live_si), &got.service_import),
        Change::Unchanged
    );
    let derived = got.derived.as_ref().unwrap();
    let live = live_derived(derived, &["10.96.7.7"], &["IPv4"]);
    assert_eq!(derived_change(Some(&live), derived), Change::Unchanged);
    for s in &got.slices {
        let mut live = s.clone();
        live.metadata.resource_version = Some("3".into());
        assert_eq!(mcs_slice_change(Some(&live), s), Change::Unchanged);
    }
    // two clusters: two sets of slices, never the same name
    assert_eq!(got.slices.len(), 2);
    assert_ne!(got.slices[0].metadata.name, got.slices[1].metadata.name);
    // and a second import with the same inputs is the same
    live_si.metadata.resource_version = Some("8".into());
    let again = import("shop", "hello", &exports, Some(&live_si), Some(&live))
        .unwrap()
        .unwrap();
    assert_eq!(again, got);
}

#[test]
fn headless_export_conformance() {
    let b = bed();
    let svc = hello_with(json!({"clusterIP": "None", "clusterIPs": ["None"],
                                    "ipFamilies": ["IPv4", "IPv6"]}));
    let mut ep = endpoint("10.1.0.5");
    ep["hostname"] = json!("hello-ss-0");
    let v4 = kcm_slice("hello-v4", "IPv4", vec![ep]);
    let mut ep6 = endpoint("fd00::5");
    ep6["hostname"] = json!("hello-ss-0");
    let v6 = kcm_slice("hello-v6", "IPv6", vec![ep6]);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&v4, &v6],
    }];
    let first = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let live_si = created(&first.service_import);
    let got = import("shop", "hello", &exports, Some(&live_si), None)
        .unwrap()
        .unwrap();
    let si = &got.service_import;
    assert_eq!(si.spec.type_, HEADLESS);
    // conformance: no clusterset IP for a headless import, but its families
    assert!(si.spec.ips.is_empty());
    assert_eq!(si.spec.ip_families, ["IPv4", "IPv6"]);
    let derived = got.derived.as_ref().unwrap();
    let spec = derived.spec.as_ref().unwrap();
    assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
    assert!(spec.ip_families.is_none() && spec.session_affinity.is_none());
    // a live headless derived Service gives no IPs either
    let live = live_derived(derived, &["None"], &["IPv4", "IPv6"]);
    let again = import("shop", "hello", &exports, Some(&live_si), Some(&live))
        .unwrap()
        .unwrap();
    assert!(again.service_import.spec.ips.is_empty());
    // one slice per address type, hostnames kept for <hostname>.<clusterid>.<svc>...
    let types: Vec<&str> = got.slices.iter().map(|s| s.address_type.as_str()).collect();
    assert_eq!(types.len(), 2);
    assert!(types.contains(&"IPv4") && types.contains(&"IPv6"));
    assert!(
        got.slices
            .iter()
            .all(|s| s.endpoints[0].hostname.as_deref() == Some("hello-ss-0"))
    );
}

#[test]
fn ipv6_cluster_ip_export() {
    let b = bed();
    let svc = hello_with(
        json!({"clusterIP": "fd00:96::42", "clusterIPs": ["fd00:96::42"],
                                    "ipFamilies": ["IPv6"], "ipFamilyPolicy": "SingleStack"}),
    );
    let ep = kcm_slice("hello-v6", "IPv6", vec![endpoint("fd00:1::5")]);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&ep],
    }];
    let got = converge(&exports, &["fd00:96::7"], &["IPv6"]);
    assert_eq!(got.service_import.spec.ips, ["fd00:96::7"]);
    assert_eq!(got.service_import.spec.ip_families, ["IPv6"]);
    let spec = got.derived.as_ref().unwrap().spec.as_ref().unwrap();
    assert_eq!(spec.ip_families, Some(vec!["IPv6".to_string()]));
    assert_eq!(spec.ip_family_policy.as_deref(), Some("SingleStack"));
    assert_eq!(got.slices[0].address_type, "IPv6");
}

#[test]
fn dual_stack_ips_follow_the_derived_service_order() {
    let b = bed();
    let svc = hello_with(json!({"clusterIPs": ["10.96.0.42", "fd00:96::42"],
                                    "ipFamilies": ["IPv4", "IPv6"]}));
    let exports = [member("east", &b.older, Some(&svc))];
    let got = converge(&exports, &["10.96.7.7", "fd00:96::7"], &["IPv4", "IPv6"]);
    assert_eq!(got.service_import.spec.ips, ["10.96.7.7", "fd00:96::7"]);
    assert_eq!(got.service_import.spec.ip_families, ["IPv4", "IPv6"]);
    let spec = got.derived.as_ref().unwrap().spec.as_ref().unwrap();
    assert_eq!(spec.ip_family_policy.as_deref(), Some("PreferDualStack"));
    assert_eq!(spec.ip_families, Some(vec!["IPv4".to_string()]));
}

#[test]
fn two_clusters_ports_union_conformance() {
    let b = bed();
    let a = hello();
    let c = hello_with(json!({"ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP"},
            {"name": "stcp", "port": 142, "protocol": "SCTP"}]}));
    let exports = [
        member("west", &b.newer, Some(&c)),
        member("east", &b.older, Some(&a)),
    ];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let names: Vec<&str> = got
        .service_import
        .spec
        .ports
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["stcp", "tcp", "udp"]);
    let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
    assert_eq!(reasons, ["PortConflict"]);
    let derived_ports = got.derived.unwrap().spec.unwrap().ports.unwrap();
    assert_eq!(derived_ports.len(), 3);
    let clusters = &got.service_import.status.as_ref().unwrap().clusters;
    assert_eq!(clusters.len(), 2);
    assert_eq!(clusters[0].cluster, "east");
}

#[test]
fn a_losing_port_of_the_same_name_reaches_only_the_winner() {
    // conformance (StrictPortConflict): west exports `tcp` 4242 against east's `tcp` 42.
    // Its slice names the port `tcp` with the pods' port 42; carried over, kube-proxy would
    // send the import's tcp/42 to west's pods.
    let b = bed();
    let east = hello();
    let west = hello_with(json!({"ports": [
            {"name": "tcp", "port": 4242, "protocol": "TCP", "targetPort": 42}]}));
    let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
    let wa = kcm_slice_with(
        "hello-w",
        "IPv4",
        json!([{"name": "tcp", "port": 42, "protocol": "TCP"}]),
        vec![endpoint("10.2.0.5")],
    );
    let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
    let ports: Vec<(&str, &str, i32)> = got
        .service_import
        .spec
        .ports
        .iter()
        .map(|p| (p.name.as_str(), p.protocol.as_str(), p.port))
        .collect();
    assert_eq!(ports, [("tcp", "TCP", 42), ("udp", "UDP", 42)]);
    let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
    assert_eq!(reasons, ["PortConflict"]);
    // west's endpoints serve no port of the import: no slice of west at all
    assert_eq!(
        slice_ports(&got),
        [(
            "east".to_string(),
            vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
        )]
    );
    // west still exports hello: it stays in the import's clusters
    let clusters: Vec<&str> = got
        .service_import
        .status
        .as_ref()
        .unwrap()
        .clusters
        .iter()
        .map(|c| c.cluster.as_str())
        .collect();
    assert_eq!(clusters, ["east", "west"]);
}

#[test]
fn a_losing_port_of_another_protocol_is_dropped_and_its_others_kept() {
    // west's `udp` is SCTP: it loses to east's `udp` UDP/42; its `tcp` is east's and stays
    let b = bed();
    let east = hello();
    let west = hello_with(json!({"ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP", "targetPort": 8042},
            {"name": "udp", "port": 42, "protocol": "SCTP", "targetPort": 42}]}));
    let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
    let wa = kcm_slice_with(
        "hello-w",
        "IPv4",
        json!([{"name": "tcp", "port": 8042, "protocol": "TCP"},
                   {"name": "udp", "port": 42, "protocol": "SCTP"}]),
        vec![endpoint("10.2.0.5")],
    );
    let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
    let mut got_ports = slice_ports(&got);
    got_ports.sort();
    assert_eq!(
        got_ports,
        [
            (
                "east".to_string(),
                vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
            ),
            // the same Service port (tcp TCP/42), west's own target port
            ("west".to_string(), vec!["tcp/TCP/8042".to_string()]),
        ]
    );
}

#[test]
fn differently_named_ports_reach_each_only_its_cluster() {
    // conformance (StrictPortConflict): west's `tcp2` 4242 joins the import, its traffic
    // goes only to west, and tcp/42 only to east
    let b = bed();
    let east = hello();
    let west = hello_with(json!({"ports": [
            {"name": "tcp2", "port": 4242, "protocol": "TCP", "targetPort": 42}]}));
    let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
    let wa = kcm_slice_with(
        "hello-w",
        "IPv4",
        json!([{"name": "tcp2", "port": 42, "protocol": "TCP"}]),
        vec![endpoint("10.2.0.5")],
    );
    let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &["10.96.7.7"]);
    let names: Vec<&str> = got
        .service_import
        .spec
        .ports
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    assert_eq!(names, ["tcp", "tcp2", "udp"]);
    let mut got_ports = slice_ports(&got);
    got_ports.sort();
    assert_eq!(
        got_ports,
        [
            (
                "east".to_string(),
                vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
            ),
            ("west".to_string(), vec!["tcp2/TCP/42".to_string()]),
        ]
    );
}

#[test]
fn a_headless_import_keeps_a_losers_endpoints_without_the_conflicting_port() {
    // no kube-proxy for a headless import, but SRV records come from slice ports: west's
    // pods must not answer for east's `tcp`; their addresses and hostnames still answer
    let b = bed();
    let east = hello_with(json!({"clusterIP": "None", "clusterIPs": ["None"]}));
    let west = hello_with(
        json!({"clusterIP": "None", "clusterIPs": ["None"], "ports": [
            {"name": "tcp", "port": 4242, "protocol": "TCP", "targetPort": 42}]}),
    );
    let ea = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
    let mut wep = endpoint("10.2.0.5");
    wep["hostname"] = json!("hello-ss-0");
    let wa = kcm_slice_with(
        "hello-w",
        "IPv4",
        json!([{"name": "tcp", "port": 42, "protocol": "TCP"}]),
        vec![wep],
    );
    let got = strict_port_conflict(&b, &east, &west, &ea, &wa, &[]);
    assert_eq!(got.service_import.spec.type_, HEADLESS);
    let mut got_ports = slice_ports(&got);
    got_ports.sort();
    assert_eq!(
        got_ports,
        [
            (
                "east".to_string(),
                vec!["tcp/TCP/42".to_string(), "udp/UDP/42".to_string()]
            ),
            ("west".to_string(), vec![]),
        ]
    );
    let west_slice = got
        .slices
        .iter()
        .find(|s| crate::desired::mcs::slice_source_cluster(s) == Some("west"))
        .unwrap();
    assert!(west_slice.ports.is_none());
    assert_eq!(west_slice.endpoints[0].addresses, ["10.2.0.5"]);
    assert_eq!(
        west_slice.endpoints[0].hostname.as_deref(),
        Some("hello-ss-0")
    );
}

#[test]
fn conflicting_type_takes_the_oldest() {
    // conformance: east exported first (ClusterIP), west headless: ClusterSetIP everywhere
    let b = bed();
    let (a, c) = (hello(), hello_with(json!({"clusterIP": "None"})));
    let exports = [
        member("west", &b.newer, Some(&c)),
        member("east", &b.older, Some(&a)),
    ];
    let got = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(got.service_import.spec.type_, CLUSTER_SET_IP);
    assert_eq!(got.conflicts[0].reason.reason(), "TypeConflict");
}

#[test]
fn session_affinity_and_traffic_fields_come_from_the_winner() {
    let b = bed();
    let a = hello_with(
        json!({"sessionAffinity": "None", "sessionAffinityConfig": null,
                                  "trafficDistribution": "PreferClose",
                                  "internalTrafficPolicy": "Local"}),
    );
    let c = hello();
    let exports = [
        member("east", &b.older, Some(&a)),
        member("west", &b.newer, Some(&c)),
    ];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let spec = &got.service_import.spec;
    assert_eq!(spec.session_affinity, "None");
    assert!(spec.session_affinity_config.is_none());
    assert_eq!(spec.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Local"));
    let derived = got.derived.unwrap().spec.unwrap();
    assert_eq!(derived.traffic_distribution.as_deref(), Some("PreferClose"));
    assert_eq!(derived.internal_traffic_policy.as_deref(), Some("Local"));
    let reasons: Vec<&str> = got.conflicts.iter().map(|c| c.reason.reason()).collect();
    assert_eq!(
        reasons,
        [
            "SessionAffinityConflict",
            "InternalTrafficPolicyConflict",
            "TrafficDistributionConflict"
        ]
    );
}

#[test]
fn no_valid_export_no_import() {
    // conformance: unexported everywhere, or only an ExternalName export
    let b = bed();
    let external = hello_with(
        json!({"type": "ExternalName", "externalName": "example.com",
                                         "clusterIP": null}),
    );
    assert_eq!(import("shop", "hello", &[], None, None), Ok(None));
    let only_external = [member("east", &b.older, Some(&external))];
    assert_eq!(
        import("shop", "hello", &only_external, None, None),
        Ok(None)
    );
    let no_service = [member("east", &b.older, None)];
    assert_eq!(import("shop", "hello", &no_service, None, None), Ok(None));
}

#[test]
fn unexport_of_one_of_two_keeps_the_import_from_the_other() {
    let b = bed();
    let (a, c) = (hello(), hello());
    let (ea, ec) = (
        kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]),
        kcm_slice("hello-c", "IPv4", vec![endpoint("10.2.0.5")]),
    );
    let both = [
        ClusterExport {
            cluster: "east",
            export: &b.older,
            service: Some(&a),
            slices: vec![&ea],
        },
        ClusterExport {
            cluster: "west",
            export: &b.newer,
            service: Some(&c),
            slices: vec![&ec],
        },
    ];
    let before = converge(&both, &["10.96.7.7"], &["IPv4"]);
    let after = converge(&both[1..], &["10.96.7.7"], &["IPv4"]);
    let clusters = &after.service_import.status.as_ref().unwrap().clusters;
    assert_eq!(clusters.len(), 1);
    assert_eq!(clusters[0].cluster, "west");
    assert_eq!(after.slices.len(), 1);
    // east's slice is surplus now (its deletion still needs proof east stopped exporting)
    let live: Vec<&EndpointSlice> = before.slices.iter().collect();
    let surplus = crate::desired::mcs::surplus_slices(&live, "hello", &after.slices);
    assert_eq!(surplus.len(), 1);
    assert_eq!(
        crate::desired::mcs::slice_source_cluster(surplus[0]),
        Some("east")
    );
}

#[test]
fn exported_labels_and_annotations_of_the_winner_only() {
    let mut b = bed();
    b.older
        .spec
        .exported_labels
        .insert("dummy-label".into(), "true".into());
    b.older
        .spec
        .exported_annotations
        .insert("dummy-annotation".into(), "true".into());
    b.newer
        .spec
        .exported_labels
        .insert("dummy-label2".into(), "true".into());
    let svc = hello();
    let exports = [
        member("east", &b.older, Some(&svc)),
        member("west", &b.newer, Some(&svc)),
    ];
    let got = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let m = &got.service_import.metadata;
    let labels = m.labels.as_ref().unwrap();
    assert_eq!(labels["dummy-label"], "true");
    assert!(!labels.contains_key("dummy-label2"));
    let annotations = m.annotations.as_ref().unwrap();
    assert_eq!(annotations["dummy-annotation"], "true");
    assert_eq!(annotations[COPIED_LABELS_ANNOTATION], "dummy-label");
    assert_eq!(
        annotations[COPIED_ANNOTATIONS_ANNOTATION],
        "dummy-annotation"
    );
    assert_eq!(got.conflicts[0].reason.reason(), "LabelsConflict");
}

#[test]
fn refused_exported_metadata_is_dropped_and_ours_cannot_be_overridden() {
    let mut b = bed();
    let l = &mut b.older.spec.exported_labels;
    l.insert("ok".into(), "yes".into());
    l.insert("bad key!".into(), "x".into());
    l.insert("long".into(), "v".repeat(64));
    l.insert(OWNER_LABEL.into(), "someone-else".into());
    let a = &mut b.older.spec.exported_annotations;
    a.insert("note".into(), "x".into());
    a.insert(DERIVED_SERVICE_ANNOTATION.into(), "elsewhere".into());
    a.insert("example.com/copied-labels".into(), "x".into());
    let svc = hello();
    let exports = [member("east", &b.older, Some(&svc))];
    let got = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let m = &got.service_import.metadata;
    assert_eq!(m.labels.as_ref().unwrap()[OWNER_LABEL], MANAGED_BY);
    assert_eq!(m.labels.as_ref().unwrap()["ok"], "yes");
    assert_eq!(
        m.annotations.as_ref().unwrap()[DERIVED_SERVICE_ANNOTATION],
        derived_name("shop", "hello")
    );
    let mut dropped = got.dropped.clone();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "annotation example.com/copied-labels",
            "annotation multicluster.kubernetes.io/derived-service",
            "label app.kubernetes.io/managed-by",
            "label bad key!",
            "label long",
        ]
    );
    assert!(meta::validate(m).is_ok());

    let mut huge = bed();
    huge.older
        .spec
        .exported_annotations
        .insert("big".into(), "x".repeat(200 * 1024));
    let exports = [member("east", &huge.older, Some(&svc))];
    let got = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    assert_eq!(got.dropped, ["annotations (too large)"]);
    let annotations = got.service_import.metadata.annotations.unwrap();
    assert!(!annotations.contains_key("big"));
    assert_eq!(annotations[COPIED_ANNOTATIONS_ANNOTATION], "");
}

#[test]
fn a_foreign_service_import_gets_nothing_derived() {
    let b = bed();
    let svc = hello();
    let exports = [member("east", &b.older, Some(&svc))];
    let first = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let mut foreign = created(&first.service_import);
    foreign
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(OWNER_LABEL.into(), "another-mcs".into());
    let got = import("shop", "hello", &exports, Some(&foreign), None)
        .unwrap()
        .unwrap();
    assert!(got.derived.is_none() && got.slices.is_empty());
    assert_eq!(
        import_change(Some(&foreign), &got.service_import),
        Change::NotOurs
    );
}

#[test]
fn slices_we_wrote_are_not_exported_again_and_other_services_are_ignored() {
    let b = bed();
    let svc = hello();
    let own = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5")]);
    let mut mirrored = kcm_slice("hello-m", "IPv4", vec![endpoint("10.9.0.5")]);
    mirrored
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    let mut other = kcm_slice("web-a", "IPv4", vec![endpoint("10.8.0.5")]);
    other
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(SERVICE_NAME_LABEL.into(), "web".into());
    let mut unlabelled = kcm_slice("hello-u", "IPv4", vec![endpoint("10.7.0.5")]);
    unlabelled
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(SERVICE_NAME_LABEL);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&own, &mirrored, &other, &unlabelled],
    }];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let addresses: Vec<&str> = got
        .slices
        .iter()
        .flat_map(|s| s.endpoints.iter().map(|e| e.addresses[0].as_str()))
        .collect();
    assert_eq!(addresses, ["10.1.0.5"]);
}

#[test]
fn large_exports_are_chunked_at_1000() {
    let b = bed();
    let svc = hello();
    let many: Vec<Value> = (0..2500)
        .map(|i| endpoint(&format!("10.{}.{}.{}", i / 62500, (i / 250) % 250, i % 250)))
        .collect();
    let big = kcm_slice("hello-big", "IPv4", many);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&big],
    }];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let sizes: Vec<usize> = got.slices.iter().map(|s| s.endpoints.len()).collect();
    assert_eq!(sizes, [1000, 1000, 500]);
}

#[test]
fn not_ready_and_terminating_endpoints_are_mirrored() {
    let b = bed();
    let svc = hello();
    let mut terminating = endpoint("10.1.0.6");
    terminating["conditions"] = json!({"ready": false, "serving": true, "terminating": true});
    let ep = kcm_slice("hello-a", "IPv4", vec![endpoint("10.1.0.5"), terminating]);
    let exports = [ClusterExport {
        cluster: "east",
        export: &b.older,
        service: Some(&svc),
        slices: vec![&ep],
    }];
    let got = converge(&exports, &["10.96.7.7"], &["IPv4"]);
    let c = got.slices[0].endpoints[1].conditions.as_ref().unwrap();
    assert_eq!(
        (c.ready, c.serving, c.terminating),
        (Some(false), Some(true), Some(true))
    );
}

fn holder_of(si: &ServiceImport) -> &str {
    &si.metadata.annotations.as_ref().unwrap()[HOLDER_ANNOTATION]
}

#[test]
fn a_backdated_newcomer_leaves_the_import_to_its_holder() {
    let east = export("east", "2024-01-01T00:00:00Z");
    // south joins later, its export claiming to be older, asking for Local and its own tcp port
    let south = export("south", "2020-01-01T00:00:00Z");
    let (svc, hostile) = (
        hello(),
        hello_with(json!({"internalTrafficPolicy": "Local",
            "ports": [{"name": "tcp", "port": 4242, "protocol": "TCP"},
                      {"name": "udp", "port": 42, "protocol": "UDP"}]})),
    );
    let alone = [member("east", &east, Some(&svc))];
    let first = converge(&alone, &["10.96.7.7"], &["IPv4"]);
    assert_eq!(holder_of(&first.service_import), "east");
    let live_si = created(&first.service_import);
    let live = live_derived(first.derived.as_ref().unwrap(), &["10.96.7.7"], &["IPv4"]);

    let both = [
        member("east", &east, Some(&svc)),
        member("south", &south, Some(&hostile)),
    ];
    let got = import("shop", "hello", &both, Some(&live_si), Some(&live))
        .unwrap()
        .unwrap();
    let spec = &got.service_import.spec;
    assert_eq!(spec.internal_traffic_policy.as_deref(), Some("Cluster"));
    assert!(spec.ports.iter().any(|p| p.name == "tcp" && p.port == 42));
    assert_eq!(holder_of(&got.service_import), "east");
    let derived = got.derived.as_ref().unwrap().spec.as_ref().unwrap();
    assert_eq!(derived.internal_traffic_policy.as_deref(), Some("Cluster"));
    // south is a member: listed, its conflicts named
    let listed = &got.service_import.status.as_ref().unwrap().clusters;
    assert_eq!(listed.len(), 2);
    assert!(got.conflicts.iter().all(|c| c.winner == "east"));
    // the spec and the holder are what the live import has: only the listing changes
    match import_change(Some(&live_si), &got.service_import) {
        Change::Update(u) => {
            assert_eq!(u.spec, live_si.spec);
            assert_eq!(holder_of(&u), "east");
        }
        other => panic!("{other:?}"),
    }

    // without a holder (a first write with both there), the oldest takes it
    let fresh = import("shop", "hello", &both, None, None).unwrap().unwrap();
    assert_eq!(holder_of(&fresh.service_import), "south");
    assert_eq!(
        fresh.service_import.spec.internal_traffic_policy.as_deref(),
        Some("Local")
    );

    // east stops exporting: the oldest left takes over and becomes the holder
    let left = [member("south", &south, Some(&hostile))];
    let got = import("shop", "hello", &left, Some(&live_si), Some(&live))
        .unwrap()
        .unwrap();
    assert_eq!(holder_of(&got.service_import), "south");
    assert_eq!(
        got.service_import.spec.internal_traffic_policy.as_deref(),
        Some("Local")
    );
}

#[test]
fn exported_annotations_of_reserved_prefixes_are_dropped() {
    let mut b = bed();
    let a = &mut b.older.spec.exported_annotations;
    for k in [
        "note",
        "example.com/kept",
        "kubernetes.io/change-cause",
        "service.kubernetes.io/topology-mode",
        "x-k8s.io/thing",
        "fair.com/cross-cluster-origin-cluster",
        "cross-cluster-controller.fair.com/made-up",
        HOLDER_ANNOTATION,
    ] {
        a.insert(k.into(), "west".into());
    }
    let svc = hello();
    let exports = [member("east", &b.older, Some(&svc))];
    let got = import("shop", "hello", &exports, None, None)
        .unwrap()
        .unwrap();
    let annotations = got.service_import.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations["note"], "west");
    assert_eq!(annotations["example.com/kept"], "west");
    assert_eq!(annotations[HOLDER_ANNOTATION], "east");
    assert_eq!(
        annotations[COPIED_ANNOTATIONS_ANNOTATION],
        "example.com/kept,note"
    );
    let mut dropped = got.dropped.clone();
    dropped.sort();
    assert_eq!(
        dropped,
        [
            "annotation cross-cluster-controller.fair.com/made-up",
            "annotation cross-cluster-controller.fair.com/properties-holder",
            "annotation fair.com/cross-cluster-origin-cluster",
            "annotation kubernetes.io/change-cause",
            "annotation service.kubernetes.io/topology-mode",
            "annotation x-k8s.io/thing",
        ]
    );
}
