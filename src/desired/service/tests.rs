use super::*;
use crate::desired::follower::follower;
use crate::desired::options::EndpointsMode;
use crate::desired::test_support::*;
use serde_json::json;

fn desired_of(remote: &Service) -> Service {
    follower(remote, &[], &opts(EndpointsMode::Slices))
        .unwrap()
        .service
}

fn spec(svc: &Service) -> &ServiceSpec {
    svc.spec.as_ref().unwrap()
}

/// What the API server returns after creating `desired`.
fn as_created(desired: &Service) -> Service {
    let mut live = serde_json::to_value(desired).unwrap();
    live["metadata"]["uid"] = json!("local-uid-7");
    live["metadata"]["resourceVersion"] = json!("1001");
    live["metadata"]["creationTimestamp"] = json!("2024-01-01T00:00:00Z");
    live["metadata"]["labels"]["team"] = json!("added-by-someone-else");
    live["metadata"]["annotations"]["note"] = json!("added-by-someone-else");
    let s = &mut live["spec"];
    if s.get("clusterIP").is_none() {
        s["clusterIP"] = json!("10.100.0.5");
        s["clusterIPs"] = json!(["10.100.0.5"]);
    }
    s["ipFamilies"] = json!(["IPv4"]);
    if s.get("ipFamilyPolicy").is_none() {
        s["ipFamilyPolicy"] = json!("SingleStack");
    }
    s["internalTrafficPolicy"] = json!("Cluster");
    if s.get("sessionAffinity").is_none() {
        s["sessionAffinity"] = json!("None");
    }
    if let Some(ports) = s.get_mut("ports").and_then(|p| p.as_array_mut()) {
        for p in ports {
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none() {
                p["targetPort"] = p["port"].clone();
            }
        }
    }
    serde_json::from_value(live).unwrap()
}

#[test]
fn cluster_ip_named_ports_and_target_port_by_name() {
    let desired = desired_of(&cluster_ip_service());
    assert_eq!(desired.metadata.name.as_deref(), Some("web"));
    assert_eq!(desired.metadata.namespace.as_deref(), Some("shop"));
    assert!(desired.metadata.uid.is_none());
    assert!(desired.metadata.resource_version.is_none());
    let s = spec(&desired);
    assert_eq!(s.type_.as_deref(), Some("ClusterIP"));
    assert!(s.selector.is_none());
    assert!(s.cluster_ip.is_none());
    assert!(s.cluster_ips.is_none());
    assert!(s.ip_families.is_none());
    assert!(s.ip_family_policy.is_none());
    assert!(s.internal_traffic_policy.is_none());
    assert_eq!(s.session_affinity.as_deref(), Some("None"));
    let ports = s.ports.as_ref().unwrap();
    assert_eq!(ports.len(), 2);
    assert_eq!(ports[0].name.as_deref(), Some("http"));
    assert_eq!(ports[0].target_port, Some(IntOrString::Int(8080)));
    assert_eq!(
        ports[1].target_port,
        Some(IntOrString::String("grpc".into()))
    );
    assert_eq!(ports[1].app_protocol.as_deref(), Some("kubernetes.io/h2c"));
}

#[test]
fn unnamed_port() {
    let remote = service(json!({
        "clusterIP": "10.96.0.11",
        "ports": [{"port": 53, "protocol": "UDP"}],
    }));
    let desired = desired_of(&remote);
    let ports = spec(&desired).ports.clone().unwrap();
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name, None);
    assert_eq!(ports[0].port, 53);
    assert_eq!(ports[0].protocol.as_deref(), Some("UDP"));
    assert_eq!(ports[0].target_port, None);
    // The API server defaults targetPort to the port: no write.
    assert_eq!(
        service_change(&as_created(&desired), &desired),
        ServiceChange::Unchanged
    );
}

#[test]
fn labels_and_annotations() {
    let desired = desired_of(&cluster_ip_service());
    let labels = desired.metadata.labels.as_ref().unwrap();
    assert_eq!(labels["fair.com/cross-cluster"], "follower");
    assert_eq!(labels["app"], "web");
    let annotations = desired.metadata.annotations.as_ref().unwrap();
    assert_eq!(annotations.len(), 4, "{annotations:?}");
    assert_eq!(annotations["fair.com/cross-cluster-copied-labels"], "app");
    assert_eq!(
        annotations["fair.com/cross-cluster-origin-cluster"],
        "remote-a"
    );
    assert_eq!(
        annotations["fair.com/cross-cluster-origin-object"],
        "shop/web"
    );
    assert_eq!(
        annotations["fair.com/cross-cluster-origin-uid"],
        "remote-uid-1"
    );
}

#[test]
fn headless() {
    let remote = service(json!({
        "clusterIP": "None",
        "clusterIPs": ["None"],
        "selector": {"app": "web"},
        "ports": [{"name": "http", "port": 80}],
    }));
    let desired = desired_of(&remote);
    assert_eq!(spec(&desired).cluster_ip.as_deref(), Some("None"));
    assert!(spec(&desired).cluster_ips.is_none());
    assert_eq!(spec(&desired).type_.as_deref(), Some("ClusterIP"));

    // Headless selectorless Services get RequireDualStack from the API server.
    let mut live = as_created(&desired);
    live.spec.as_mut().unwrap().ip_family_policy = Some("RequireDualStack".into());
    assert_eq!(service_change(&live, &desired), ServiceChange::Unchanged);
}

#[test]
fn external_name() {
    let remote = service(json!({
        "type": "ExternalName",
        "externalName": "db.example.com",
    }));
    let s = slice("web-1", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let mut o = opts(EndpointsMode::Both);
    o.allow_external_name = true;
    let f = follower(&remote, &[&s], &o).unwrap();
    let sp = spec(&f.service);
    assert_eq!(sp.type_.as_deref(), Some("ExternalName"));
    assert_eq!(sp.external_name.as_deref(), Some("db.example.com"));
    assert!(sp.ports.is_none());
    assert!(sp.cluster_ip.is_none());
    assert!(f.slices.is_empty());
    assert!(f.endpoints.is_none());

    let mut live = serde_json::to_value(&f.service).unwrap();
    live["spec"]["sessionAffinity"] = json!("None");
    live["metadata"]["resourceVersion"] = json!("5");
    let live: Service = serde_json::from_value(live).unwrap();
    assert_eq!(service_change(&live, &f.service), ServiceChange::Unchanged);

    let mut moved = f.service.clone();
    moved.spec.as_mut().unwrap().external_name = Some("db2.example.com".into());
    match service_change(&live, &moved) {
        ServiceChange::Update(svc) => {
            assert_eq!(spec(&svc).external_name.as_deref(), Some("db2.example.com"));
            assert_eq!(svc.metadata.resource_version.as_deref(), Some("5"));
        }
        other => panic!("expected update, got {other:?}"),
    }

    // ExternalName <-> ClusterIP is recreated.
    let cluster = desired_of(&cluster_ip_service());
    assert_eq!(service_change(&live, &cluster), ServiceChange::Recreate);
    assert_eq!(
        service_change(&as_created(&cluster), &f.service),
        ServiceChange::Recreate
    );
}

#[test]
fn load_balancer_becomes_cluster_ip() {
    let remote = service(json!({
        "type": "LoadBalancer",
        "clusterIP": "10.96.0.12",
        "clusterIPs": ["10.96.0.12"],
        "externalTrafficPolicy": "Local",
        "healthCheckNodePort": 31000,
        "allocateLoadBalancerNodePorts": true,
        "loadBalancerSourceRanges": ["1.2.3.0/24"],
        "selector": {"app": "web"},
        "ports": [{"name": "https", "port": 443, "protocol": "TCP",
                   "targetPort": 8443, "nodePort": 30443}],
    }));
    let desired = desired_of(&remote);
    let s = spec(&desired);
    assert_eq!(s.type_.as_deref(), Some("ClusterIP"));
    assert!(s.cluster_ip.is_none());
    assert!(s.external_traffic_policy.is_none());
    assert!(s.health_check_node_port.is_none());
    assert!(s.allocate_load_balancer_node_ports.is_none());
    assert!(s.load_balancer_source_ranges.is_none());
    let ports = s.ports.as_ref().unwrap();
    assert_eq!(ports[0].node_port, None);
    assert_eq!(ports[0].port, 443);
    assert_eq!(ports[0].target_port, Some(IntOrString::Int(8443)));
    assert!(desired.status.is_none());
}

#[test]
fn session_affinity_config() {
    let remote = service(json!({
        "clusterIP": "10.96.0.13",
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 600}},
        "publishNotReadyAddresses": true,
        "ports": [{"name": "http", "port": 80}],
    }));
    let desired = desired_of(&remote);
    let s = spec(&desired);
    assert_eq!(s.session_affinity.as_deref(), Some("ClientIP"));
    assert_eq!(
        s.session_affinity_config
            .as_ref()
            .unwrap()
            .client_ip
            .as_ref()
            .unwrap()
            .timeout_seconds,
        Some(600)
    );
    assert_eq!(s.publish_not_ready_addresses, Some(true));
    assert_eq!(
        service_change(&as_created(&desired), &desired),
        ServiceChange::Unchanged
    );

    let mut shorter = desired.clone();
    shorter
        .spec
        .as_mut()
        .unwrap()
        .session_affinity_config
        .as_mut()
        .unwrap()
        .client_ip
        .as_mut()
        .unwrap()
        .timeout_seconds = Some(60);
    assert!(matches!(
        service_change(&as_created(&desired), &shorter),
        ServiceChange::Update(_)
    ));
}

#[test]
fn default_client_ip_timeout_is_not_a_difference() {
    let remote = service(json!({
        "sessionAffinity": "ClientIP",
        "ports": [{"name": "http", "port": 80}],
    }));
    let desired = desired_of(&remote);
    let mut live = serde_json::to_value(as_created(&desired)).unwrap();
    live["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 10800}});
    let live: Service = serde_json::from_value(live).unwrap();
    assert_eq!(service_change(&live, &desired), ServiceChange::Unchanged);
}

#[test]
fn dual_stack_sets_prefer_dual_stack() {
    let remote = service(json!({
        "clusterIP": "10.96.0.14",
        "clusterIPs": ["10.96.0.14", "fd00::14"],
        "ipFamilies": ["IPv4", "IPv6"],
        "ipFamilyPolicy": "RequireDualStack",
        "ports": [{"name": "http", "port": 80}],
    }));
    let desired = desired_of(&remote);
    let s = spec(&desired);
    assert_eq!(s.ip_family_policy.as_deref(), Some("PreferDualStack"));
    assert!(s.ip_families.is_none());
    assert!(s.cluster_ips.is_none());

    // A live single-stack follower is upgraded in place.
    let live = as_created(&desired_of(&cluster_ip_service()));
    let mut live_value = serde_json::to_value(&live).unwrap();
    live_value["spec"]["ports"] = json!([{"name": "http", "port": 80, "protocol": "TCP",
                                              "targetPort": 80}]);
    let live: Service = serde_json::from_value(live_value).unwrap();
    match service_change(&live, &desired) {
        ServiceChange::Update(svc) => {
            assert_eq!(
                spec(&svc).ip_family_policy.as_deref(),
                Some("PreferDualStack")
            );
            assert_eq!(spec(&svc).ip_families, Some(vec!["IPv4".to_string()]));
        }
        other => panic!("expected update, got {other:?}"),
    }
}

#[test]
fn ipv6_only_leaves_policy_unset() {
    let remote = service(json!({
        "clusterIP": "fd00::15",
        "clusterIPs": ["fd00::15"],
        "ipFamilies": ["IPv6"],
        "ipFamilyPolicy": "SingleStack",
        "ports": [{"name": "http", "port": 80}],
    }));
    let desired = desired_of(&remote);
    assert!(spec(&desired).ip_family_policy.is_none());
    assert!(spec(&desired).ip_families.is_none());
    assert!(spec(&desired).cluster_ip.is_none());
}

#[test]
fn identical_is_unchanged() {
    let desired = desired_of(&cluster_ip_service());
    assert_eq!(service_change(&desired, &desired), ServiceChange::Unchanged);
}

#[test]
fn server_defaults_are_unchanged() {
    let desired = desired_of(&cluster_ip_service());
    let live = as_created(&desired);
    assert_eq!(spec(&live).cluster_ip.as_deref(), Some("10.100.0.5"));
    assert_eq!(service_change(&live, &desired), ServiceChange::Unchanged);

    // Protocol and sessionAffinity left unset in desired but defaulted on the live object.
    let mut bare = desired.clone();
    let s = bare.spec.as_mut().unwrap();
    s.session_affinity = None;
    for p in s.ports.as_mut().unwrap() {
        p.protocol = None;
    }
    assert_eq!(service_change(&live, &bare), ServiceChange::Unchanged);

    // Port order does not matter.
    let mut reordered = desired.clone();
    reordered
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .reverse();
    assert_eq!(service_change(&live, &reordered), ServiceChange::Unchanged);
}

#[test]
fn port_change_updates_and_keeps_server_fields() {
    let desired = desired_of(&cluster_ip_service());
    let live = as_created(&desired);
    let mut changed = desired.clone();
    changed.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    match service_change(&live, &changed) {
        ServiceChange::Update(svc) => {
            let s = spec(&svc);
            assert_eq!(s.ports.as_ref().unwrap()[0].port, 81);
            assert_eq!(s.cluster_ip.as_deref(), Some("10.100.0.5"));
            assert_eq!(s.cluster_ips, Some(vec!["10.100.0.5".to_string()]));
            assert_eq!(s.ip_families, Some(vec!["IPv4".to_string()]));
            assert_eq!(s.internal_traffic_policy.as_deref(), Some("Cluster"));
            assert_eq!(svc.metadata.resource_version.as_deref(), Some("1001"));
            assert_eq!(svc.metadata.uid.as_deref(), Some("local-uid-7"));
            let labels = svc.metadata.labels.as_ref().unwrap();
            assert_eq!(labels["team"], "added-by-someone-else");
            assert_eq!(labels["fair.com/cross-cluster"], "follower");
            let annotations = svc.metadata.annotations.as_ref().unwrap();
            assert_eq!(annotations["note"], "added-by-someone-else");
            // The update is stable.
            assert_eq!(service_change(&svc, &changed), ServiceChange::Unchanged);
        }
        other => panic!("expected update, got {other:?}"),
    }
}

#[test]
fn missing_or_changed_label_is_a_difference() {
    let desired = desired_of(&cluster_ip_service());
    let mut live = as_created(&desired);
    live.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("app".into(), "other".into());
    live.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("fair.com/cross-cluster-origin-uid");
    match service_change(&live, &desired) {
        ServiceChange::Update(svc) => {
            assert_eq!(svc.metadata.labels.as_ref().unwrap()["app"], "web");
            assert_eq!(
                svc.metadata.annotations.as_ref().unwrap()["fair.com/cross-cluster-origin-uid"],
                "remote-uid-1"
            );
        }
        other => panic!("expected update, got {other:?}"),
    }
}

/// The exported Service `labels`, as its follower would be desired.
fn desired_with_labels(labels: &[(&str, &str)]) -> Service {
    let mut exported = cluster_ip_service();
    let l = exported
        .metadata
        .labels
        .get_or_insert_with(Default::default);
    for (k, v) in labels {
        l.insert(k.to_string(), v.to_string());
    }
    desired_of(&exported)
}

#[test]
fn a_label_dropped_by_the_exported_service_is_dropped_and_local_labels_stay() {
    let before = desired_with_labels(&[("tier", "gold")]);
    let mut live = as_created(&before);
    // someone adds a label locally
    live.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("team".into(), "payments".into());
    assert_eq!(
        service_change(&live, &before),
        ServiceChange::Unchanged,
        "a local label is not a difference"
    );
    // the exported Service drops "tier"
    let after = desired_with_labels(&[]);
    let ServiceChange::Update(updated) = service_change(&live, &after) else {
        panic!("a dropped exported label is a difference");
    };
    let labels = updated.metadata.labels.as_ref().unwrap();
    assert!(!labels.contains_key("tier"), "{labels:?}");
    assert_eq!(labels["team"], "payments", "the local label is kept");
    assert_eq!(labels["app"], "web");
    assert_eq!(
        updated.metadata.annotations.as_ref().unwrap()["fair.com/cross-cluster-copied-labels"],
        "app"
    );
    assert_eq!(service_change(&updated, &after), ServiceChange::Unchanged);
}

#[test]
fn a_follower_without_a_record_keeps_its_labels() {
    // written before copied labels were recorded (or by the Go controller): a label the
    // exported Service no longer has cannot be told from a local one, so it stays
    let mut live = as_created(&desired_with_labels(&[("tier", "gold")]));
    live.metadata
        .annotations
        .as_mut()
        .unwrap()
        .remove("fair.com/cross-cluster-copied-labels");
    let ServiceChange::Update(updated) = service_change(&live, &desired_with_labels(&[])) else {
        panic!("the record is added");
    };
    assert_eq!(updated.metadata.labels.as_ref().unwrap()["tier"], "gold");
}

#[test]
fn selector_added_by_hand_is_removed() {
    let desired = desired_of(&cluster_ip_service());
    let mut live = as_created(&desired);
    live.spec.as_mut().unwrap().selector = Some([("app".to_string(), "web".to_string())].into());
    match service_change(&live, &desired) {
        ServiceChange::Update(svc) => {
            assert!(spec(&svc).selector.is_none());
            assert_eq!(spec(&svc).cluster_ip.as_deref(), Some("10.100.0.5"));
        }
        other => panic!("expected update, got {other:?}"),
    }
}

#[test]
fn type_change_to_cluster_ip_clears_node_port_fields() {
    let desired = desired_of(&cluster_ip_service());
    let mut live = serde_json::to_value(as_created(&desired)).unwrap();
    live["spec"]["type"] = json!("NodePort");
    live["spec"]["externalTrafficPolicy"] = json!("Cluster");
    live["spec"]["ports"][0]["nodePort"] = json!(30080);
    let live: Service = serde_json::from_value(live).unwrap();
    match service_change(&live, &desired) {
        ServiceChange::Update(svc) => {
            let s = spec(&svc);
            assert_eq!(s.type_.as_deref(), Some("ClusterIP"));
            assert!(s.external_traffic_policy.is_none());
            assert!(
                s.ports
                    .as_ref()
                    .unwrap()
                    .iter()
                    .all(|p| p.node_port.is_none())
            );
        }
        other => panic!("expected update, got {other:?}"),
    }
}

#[test]
fn headless_to_cluster_ip_is_recreated() {
    let headless = desired_of(&service(json!({
        "clusterIP": "None",
        "ports": [{"name": "http", "port": 80}],
    })));
    let live = as_created(&headless);
    let cluster = desired_of(&service(json!({
        "clusterIP": "10.96.0.16",
        "ports": [{"name": "http", "port": 80}],
    })));
    assert_eq!(service_change(&live, &cluster), ServiceChange::Recreate);
    assert_eq!(
        service_change(&as_created(&cluster), &headless),
        ServiceChange::Recreate
    );
}
