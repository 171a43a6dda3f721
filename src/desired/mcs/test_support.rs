//! Builders for the tests of `desired::mcs`: the conformance suite's hello Service and its
//! ServiceExport, in namespace `shop`.
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::judge::ClusterExport;
use super::types::ServiceExport;

pub fn time(s: &str) -> Time {
    Time(s.parse().unwrap())
}

/// The ServiceExport `shop/hello` of `cluster`, created at `created`.
pub fn export(cluster: &str, created: &str) -> ServiceExport {
    serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": "shop", "uid": format!("se-{cluster}"),
                     "generation": 1, "creationTimestamp": created},
    }))
    .unwrap()
}

/// The Service `shop/hello` with this spec.
pub fn service(spec: Value) -> Service {
    serde_json::from_value(json!({
        "metadata": {"name": "hello", "namespace": "shop", "uid": "svc-uid",
                     "labels": {"dummy-svc": "dummy"}, "annotations": {"dummy-svc": "dummy"}},
        "spec": spec,
    }))
    .unwrap()
}

/// The conformance suite's hello Service as the API server returns it (single-stack IPv4).
pub fn hello_spec() -> Value {
    json!({
        "type": "ClusterIP",
        "clusterIP": "10.96.0.42",
        "clusterIPs": ["10.96.0.42"],
        "ipFamilies": ["IPv4"],
        "ipFamilyPolicy": "PreferDualStack",
        "selector": {"app": "hello"},
        "ports": [
            {"name": "tcp", "port": 42, "protocol": "TCP", "targetPort": 42},
            {"name": "udp", "port": 42, "protocol": "UDP", "targetPort": 42},
        ],
        "sessionAffinity": "ClientIP",
        "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10}},
        "internalTrafficPolicy": "Cluster",
    })
}

pub fn hello() -> Service {
    service(hello_spec())
}

/// hello with these spec fields replaced (a null removes one).
pub fn hello_with(change: Value) -> Service {
    let mut spec = hello_spec();
    for (k, v) in change.as_object().unwrap() {
        if v.is_null() {
            spec.as_object_mut().unwrap().remove(k);
        } else {
            spec[k] = v.clone();
        }
    }
    service(spec)
}

/// One cluster's export without slices.
pub fn member<'a>(
    cluster: &'a str,
    export: &'a ServiceExport,
    service: Option<&'a Service>,
) -> ClusterExport<'a> {
    ClusterExport {
        cluster,
        export,
        service,
        slices: vec![],
    }
}
