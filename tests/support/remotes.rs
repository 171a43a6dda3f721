//! Remotes from Secrets: a daemon with no static remote, and the Secrets that name its remotes.
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams};
use kube::config::Kubeconfig;
use kube::{Api, ResourceExt};
use serde_json::json;

use super::daemon::args_for;
use super::{bed, obj};

/// The flags of a daemon writing into `ns` of west whose remotes are the Secrets of `ns`:
/// sweeps every 2 s, a remote leaves 2 s after its Secret is deleted, API timeout 5 s.
pub fn secrets_only_args(ns: &str) -> Vec<String> {
    let mut args = args_for(ns);
    let i = args
        .iter()
        .position(|a| a == "--remote-context")
        .expect("flag");
    args.drain(i..i + 2);
    args.extend(
        [
            "--sweep-schedule",
            "*/2 * * * * *",
            "--remote-removal-grace-seconds",
            "2",
            "--api-timeout-seconds",
            "5",
        ]
        .map(String::from),
    );
    args
}

/// The bed's kubeconfig with `context` as its current context, as YAML; `edit` may change it.
pub async fn kubeconfig_of(context: &str, edit: impl FnOnce(&mut Kubeconfig)) -> String {
    let mut kc = Kubeconfig::read_from(&bed().await.kubeconfig).expect("bed kubeconfig");
    kc.current_context = Some(context.to_string());
    edit(&mut kc);
    serde_yaml::to_string(&kc).expect("kubeconfig yaml")
}

/// Runs `remote-access` with `extra` (it must succeed): what it printed, and what it said on
/// standard error.
pub fn remote_access(extra: &[&str]) -> (String, String) {
    let out = std::process::Command::new(super::daemon::BIN)
        .arg("remote-access")
        .args(extra)
        .output()
        .expect("run remote-access");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "remote-access failed: {stderr}");
    (String::from_utf8_lossy(&out.stdout).to_string(), stderr)
}

/// A remote Secret named `name`, naming remote `remote` by label (else named by the Secret).
pub fn remote_secret(name: &str, remote: Option<&str>, kubeconfig: Option<&str>) -> Secret {
    let mut labels = json!({"fair.com/cross-cluster-remote": "true"});
    if let Some(r) = remote {
        labels["fair.com/cross-cluster-name"] = json!(r);
    }
    let mut s = json!({"metadata": {"name": name, "labels": labels}});
    if let Some(kc) = kubeconfig {
        s["stringData"] = json!({"kubeconfig": kc});
    }
    obj(s)
}

pub async fn apply_secret(api: &Api<Secret>, s: &Secret) {
    let name = s.name_any();
    api.patch(
        &name,
        &PatchParams::apply("test").force(),
        &Patch::Apply(serde_json::to_value(s).expect("json")),
    )
    .await
    .unwrap_or_else(|e| panic!("apply Secret {name}: {e}"));
}

/// `svc` exported by the cluster of `context` in `ns`: its leader (port http 80 -> 8080) and one
/// slice named `slice` with the endpoint `ip`.
pub async fn export(context: &str, ns: &str, svc: &str, slice: &str, ip: &str) {
    use kube::api::PostParams;
    let c = super::client(context).await;
    let pp = PostParams::default();
    let services: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.clone(), ns);
    services
        .create(&pp, &super::exported(svc, 80))
        .await
        .expect("leader");
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> = Api::namespaced(c, ns);
    slices
        .create(&pp, &super::remote_slice(svc, slice, &[ip]))
        .await
        .expect("remote slice");
}
