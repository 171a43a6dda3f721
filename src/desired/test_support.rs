//! Builders of remote objects for the tests of `desired` and of the reconcile pass.
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::options::*;
use serde_json::{Value, json};

pub fn opts(mode: EndpointsMode) -> Options {
    Options {
        label_key: DEFAULT_LABEL_KEY.to_string(),
        cluster_name: "remote-a".to_string(),
        endpoints_mode: mode,
        cluster_id: None,
        containment: Default::default(),
        allow_external_name: false,
    }
}

pub fn service(spec: Value) -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "web",
            "namespace": "shop",
            "uid": "remote-uid-1",
            "resourceVersion": "42",
            "labels": {"app": "web", "fair.com/cross-cluster": "true"},
            "annotations": {
                "kubectl.kubernetes.io/last-applied-configuration": "{\"remote\":true}"
            },
        },
        "spec": spec,
    }))
    .unwrap()
}

pub fn cluster_ip_service() -> Service {
    service(json!({
        "type": "ClusterIP",
        "clusterIP": "10.96.0.10",
        "clusterIPs": ["10.96.0.10"],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "SingleStack",
        "selector": {"app": "web"},
        "sessionAffinity": "None",
        "internalTrafficPolicy": "Cluster",
        "ports": [
            {"name": "http", "port": 80, "protocol": "TCP", "targetPort": 8080},
            {"name": "grpc", "port": 9090, "protocol": "TCP", "targetPort": "grpc",
             "appProtocol": "kubernetes.io/h2c"},
        ],
    }))
}

pub fn endpoint(ip: &str) -> Value {
    json!({
        "addresses": [ip],
        "conditions": {"ready": true, "serving": true, "terminating": false},
        "nodeName": "node-1",
        "zone": "zone-a",
        "targetRef": {"kind": "Pod", "name": format!("pod-{ip}"), "namespace": "shop"},
    })
}

pub fn slice(name: &str, address_type: &str, ports: Value, endpoints: Vec<Value>) -> EndpointSlice {
    serde_json::from_value(json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": "shop",
            "labels": {
                "kubernetes.io/service-name": "web",
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": address_type,
        "ports": ports,
        "endpoints": endpoints,
    }))
    .unwrap()
}

pub fn web_ports() -> Value {
    json!([
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "grpc", "port": 9090, "protocol": "TCP", "appProtocol": "kubernetes.io/h2c"},
    ])
}
