//! The remote objects tests export: one definition of a leader and of a remote EndpointSlice;
//! and CRDs applied to a cluster of the bed.
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
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

/// Applies a CRD to `context`, a cluster of the bed (server-side apply: running it again changes
/// nothing), and waits until the API server calls it Established.
pub async fn apply_crd(context: &str, crd: &CustomResourceDefinition) {
    let name = crd.name_any();
    let api: Api<CustomResourceDefinition> = Api::all(super::client(context).await);
    api.patch(
        &name,
        &PatchParams::apply("xcc-test").force(),
        &Patch::Apply(crd),
    )
    .await
    .unwrap_or_else(|e| panic!("{context}: apply the CRD {name}: {e}"));
    super::eventually(
        &format!("{context}: CRD {name} established"),
        std::time::Duration::from_secs(60),
        || async {
            let c = api.get(&name).await.map_err(|e| e.to_string())?;
            let conditions = c.status.and_then(|s| s.conditions).unwrap_or_default();
            if conditions
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
            {
                Ok(())
            } else {
                Err(format!("conditions {conditions:?}"))
            }
        },
    )
    .await;
}

/// A cluster-scoped CRD `<plural>.<group>` of kind `kind`, version `version`, whose objects keep
/// any field (a stand-in for a CNI's own CRD, of which the daemon reads a few fields).
pub fn open_crd(group: &str, version: &str, kind: &str, plural: &str) -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": format!("{plural}.{group}")},
        "spec": {
            "group": group,
            "scope": "Cluster",
            "names": {"kind": kind, "plural": plural, "singular": kind.to_lowercase(), "listKind": format!("{kind}List")},
            "versions": [{
                "name": version, "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}},
            }],
        },
    }))
    .expect("a CRD")
}
