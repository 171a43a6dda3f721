//! The remote objects tests export: one definition of a leader and of a remote EndpointSlice.
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::obj;

/// The label key of the daemon under test (its default): leaders carry `<KEY>=true`, followers
/// `<KEY>=follower`.
pub const KEY: &str = "fair.com/cross-cluster";

/// A leader: Service `name` labelled `<KEY>=true` and `app=<name>`, with `spec` as given.
pub fn exported_with(name: &str, spec: Value) -> Service {
    obj(json!({"metadata": {"name": name, "labels": {KEY: "true", "app": name}}, "spec": spec}))
}

/// A leader with one port, `http` `port` -> 8080.
pub fn exported(name: &str, port: i32) -> Service {
    exported_with(
        name,
        json!({"ports": [{"name": "http", "port": port, "targetPort": 8080}]}),
    )
}

/// A ready endpoint with one address.
pub fn endpoint(ip: &str) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": true}})
}

/// A remote slice of `svc` named `name`, as the remote cluster's EndpointSlice controller
/// writes it (it copies the Service's labels, so the leader label too), with the given address
/// type, ports and endpoints.
pub fn remote_slice_with(
    svc: &str,
    name: &str,
    address_type: &str,
    ports: Value,
    endpoints: Vec<Value>,
) -> EndpointSlice {
    obj(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": svc, KEY: "true",
                     "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": address_type,
        "ports": ports,
        "endpoints": endpoints
    }))
}

/// A remote slice of `svc` named `name`: IPv4, port `http` 8080/TCP, one ready endpoint per
/// address.
pub fn remote_slice(svc: &str, name: &str, ips: &[impl AsRef<str>]) -> EndpointSlice {
    remote_slice_with(
        svc,
        name,
        "IPv4",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        ips.iter().map(|ip| endpoint(ip.as_ref())).collect(),
    )
}
