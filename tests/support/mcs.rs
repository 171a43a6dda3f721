//! The Multi-Cluster Services API in tests: its CRDs on the bed's two clusters, exported
//! Services, and waiting for an import.
use std::time::Duration;

use cross_cluster_controller::desired::mcs::{ServiceExport, ServiceImport};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::OnceCell;

use super::{LOCAL, REMOTE, client, eventually};

const WAIT: Duration = Duration::from_secs(60);

static CRDS: OnceCell<()> = OnceCell::const_new();

/// The MCS CRDs (testbed/mcs-crds.sh's folder) on both clusters, established.
pub async fn crds() {
    CRDS.get_or_init(|| async {
        let docs = crd_docs().await;
        for ctx in [LOCAL, REMOTE] {
            apply_crds(ctx, &docs).await;
        }
    })
    .await;
}

/// The MCS CRDs on one more cluster of the bed, established.
pub async fn crds_in(ctx: &str) {
    apply_crds(ctx, &crd_docs().await).await;
}

async fn crd_docs() -> Vec<CustomResourceDefinition> {
    let dir = tokio::task::spawn_blocking(|| {
        let out = std::process::Command::new("bash")
            .arg(super::repo_root().join("testbed/mcs-crds.sh"))
            .output()
            .expect("run testbed/mcs-crds.sh");
        assert!(
            out.status.success(),
            "testbed/mcs-crds.sh: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().last().unwrap_or_default().trim().to_string()
    })
    .await
    .expect("crds task");
    let mut docs = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("the CRD folder") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("read a CRD");
            let crd: CustomResourceDefinition = serde_yaml::from_str(&text).expect("a CRD");
            docs.push(crd);
        }
    }
    assert_eq!(docs.len(), 3, "three CRDs in {dir}");
    docs
}

async fn apply_crds(ctx: &str, docs: &[CustomResourceDefinition]) {
    let api: Api<CustomResourceDefinition> = Api::all(client(ctx).await);
    let pp = PatchParams::apply("xcc-test").force();
    for crd in docs {
        api.patch(&crd.name_any(), &pp, &Patch::Apply(crd))
            .await
            .expect("apply a CRD");
    }
    for crd in docs {
        let name = crd.name_any();
        eventually(&format!("{ctx}: CRD {name} established"), WAIT, || async {
            let c = api.get(&name).await.map_err(|e| e.to_string())?;
            let ok = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
                cs.iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
            });
            if ok { Ok(()) } else { Err("not yet".into()) }
        })
        .await;
    }
}

/// A plain Service (no label of ours) with one port, and a slice of `ips` for it.
pub async fn service(c: &Client, ns: &str, name: &str, port: i32, ips: &[&str]) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": port, "protocol": "TCP"}]},
    }))
    .expect("a Service");
    Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create a Service");
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}}))
        .collect();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{name}-src"), "namespace": ns,
                     "labels": {"kubernetes.io/service-name": name,
                                "endpointslice.kubernetes.io/managed-by": "someone-else"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": endpoints,
    }))
    .expect("a slice");
    Api::<EndpointSlice>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &slice)
        .await
        .expect("create a slice");
}

pub async fn export(c: &Client, ns: &str, name: &str) {
    let se: ServiceExport =
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": ns}}))
            .expect("an export");
    Api::<ServiceExport>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &se)
        .await
        .expect("create a ServiceExport");
}

pub async fn unexport(c: &Client, ns: &str, name: &str) {
    Api::<ServiceExport>::namespaced(c.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
        .expect("delete a ServiceExport");
}

/// The clusters an import lists in its status, once it has `ips` when ClusterSetIP.
pub async fn import_listing(c: &Client, ns: &str, name: &str, clusters: &[&str]) -> ServiceImport {
    let api: Api<ServiceImport> = Api::namespaced(c.clone(), ns);
    let want: Vec<String> = clusters.iter().map(|s| s.to_string()).collect();
    eventually(
        &format!("ServiceImport {name} listing {want:?}"),
        WAIT,
        || async {
            let si = api
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())?
                .ok_or("no ServiceImport")?;
            let listed: Vec<String> = si
                .status
                .as_ref()
                .map(|s| s.clusters.iter().map(|c| c.cluster.clone()).collect())
                .unwrap_or_default();
            if listed == want && !si.spec.ips.is_empty() {
                Ok(si)
            } else {
                Err(format!("clusters {listed:?}, ips {:?}", si.spec.ips))
            }
        },
    )
    .await
}

/// Waits until the import `name`'s `cross-cluster-controller.fair.com/endpoints` (ready and
/// total endpoints per cluster) reads `want`.
pub async fn import_endpoints(c: &Client, ns: &str, name: &str, want: Value) {
    let imports: Api<ServiceImport> = Api::namespaced(c.clone(), ns);
    eventually(
        &format!("the import {name}'s endpoints {want}"),
        Duration::from_secs(120),
        || async {
            let i = imports.get(name).await.map_err(|e| e.to_string())?;
            let value = i
                .annotations()
                .get("cross-cluster-controller.fair.com/endpoints")
                .cloned()
                .unwrap_or_default();
            let got: Value = serde_json::from_str(&value).map_err(|e| format!("{value}: {e}"))?;
            (got == want).then_some(()).ok_or(value)
        },
    )
    .await
}
