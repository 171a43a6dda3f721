//! A fleet for the ClusterProfile tests: a hub (an API-only cluster of the bed) with the
//! ClusterProfile CRD, a namespace of profiles that is also the consumer namespace of the
//! reference `secretreader` plugin (it reads the token of cluster X from the hub's Secret
//! `<namespace>/X`), tokens minted by `remote-access` in the clusters read, and the provider file
//! the daemon is given.
use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::config::Kubeconfig;
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::{bed, client};

/// The hub cluster of the bed (API only).
pub const HUB: &str = "fleet";
/// The access provider of the reference plugin.
pub const SECRETREADER: &str = "secretreader";

/// The hub, its namespace of profiles, and the files the daemon and the plugin read.
pub struct Fleet {
    pub ns: String,
    pub hub: Client,
    dir: tempfile::TempDir,
    /// the hub's kubeconfig (admin), its current context's namespace the profiles' one (where
    /// `secretreader` reads its Secrets)
    pub hub_kubeconfig: PathBuf,
}

/// Brings the hub up (idempotent) with the ClusterProfile CRD.
pub async fn hub_up() {
    super::extra_cluster(HUB, "").await;
    super::inventory::install_crd(HUB).await;
}

/// The ClusterProfiles of `ns` in the cluster of `c`.
pub fn profiles(c: &Client, ns: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("multicluster.x-k8s.io", "v1alpha1", "ClusterProfile");
    Api::namespaced_with(c.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// A token for the cluster of `context`, minted by `remote-access` (its read-only identity in
/// `ns` there), valid for `duration` (`1h`).
pub async fn remote_access_token(context: &str, ns: &str, duration: &str) -> String {
    let kc = bed().await.kubeconfig.clone();
    let (ns, context, duration) = (ns.to_string(), context.to_string(), duration.to_string());
    let out = tokio::task::spawn_blocking(move || {
        Command::new(super::daemon::BIN)
            .args(["remote-access", "--kubeconfig"])
            .arg(&kc)
            .args([
                "--context",
                &context,
                "--namespace",
                &ns,
                "--duration",
                &duration,
            ])
            .args(["--output", "kubeconfig"])
            .output()
            .expect("run remote-access")
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "remote-access: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let kc: Value = serde_yaml::from_slice(&out.stdout).expect("a kubeconfig");
    kc["users"][0]["user"]["token"]
        .as_str()
        .expect("a token")
        .to_string()
}

/// An access provider entry: `provider` for `cluster` (a kubeconfig cluster: server and CA), its
/// `secretreader` exec extension naming the Secret `secret`, and `extensions` after it.
pub fn access_entry(provider: &str, mut cluster: Value, secret: &str, extensions: Value) -> Value {
    let mut ext = vec![json!({"name": "client.authentication.k8s.io/exec",
                              "extension": {"clusterName": secret}})];
    ext.extend(extensions.as_array().cloned().unwrap_or_default());
    cluster["extensions"] = json!(ext);
    json!({"name": provider, "cluster": cluster})
}

/// Creates profile `name` in `ns` of the cluster of `c` (as a cluster manager would) and sets
/// its status.
pub async fn create_profile_in(c: &Client, ns: &str, name: &str, status: Value) {
    let api = profiles(c, ns);
    let p: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile",
        "metadata": {"name": name, "labels": {"x-k8s.io/cluster-manager": "test"}},
        "spec": {"displayName": name, "clusterManager": {"name": "test"}}}))
    .unwrap();
    api.create(&PostParams::default(), &p)
        .await
        .unwrap_or_else(|e| panic!("create ClusterProfile {name}: {e}"));
    set_status_in(c, ns, name, status).await;
}

/// Replaces profile `name`'s status in `ns` of the cluster of `c` (merge patch of the status
/// subresource).
/// The condition `kind` of profile `name` in `ns`, if it carries one.
pub async fn condition_in(c: &Client, ns: &str, name: &str, kind: &str) -> Result<Value, String> {
    let p = profiles(c, ns).get(name).await.map_err(|e| e.to_string())?;
    let conditions = p.data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions
        .into_iter()
        .find(|c| c["type"] == kind)
        .ok_or_else(|| format!("no condition {kind} on {name}: {}", p.data["status"]))
}

/// Waits until profile `name` in `ns` carries the condition `kind` with status True; returns it.
pub async fn condition_true(c: &Client, ns: &str, name: &str, kind: &str) -> Value {
    super::eventually(
        &format!("condition {kind} True on profile {name}"),
        std::time::Duration::from_secs(60),
        || async {
            let cond = condition_in(c, ns, name, kind).await?;
            if cond["status"] == "True" {
                Ok(cond)
            } else {
                Err(cond.to_string())
            }
        },
    )
    .await
}

pub async fn set_status_in(c: &Client, ns: &str, name: &str, status: Value) {
    profiles(c, ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": status})),
        )
        .await
        .unwrap_or_else(|e| panic!("status of ClusterProfile {name}: {e}"));
}

impl Fleet {
    /// The fleet of namespace `ns` (which must exist in the hub: `namespace_in(.., &[.., HUB])`).
    pub async fn new(ns: &str) -> Fleet {
        hub_up().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let mut kc = Kubeconfig::read_from(&bed().await.kubeconfig).expect("bed kubeconfig");
        kc.current_context = Some(HUB.into());
        for c in &mut kc.contexts {
            if c.name == HUB
                && let Some(ctx) = c.context.as_mut()
            {
                ctx.namespace = Some(ns.to_string());
            }
        }
        let hub_kubeconfig = dir.path().join("hub.kubeconfig");
        std::fs::write(&hub_kubeconfig, serde_yaml::to_string(&kc).expect("yaml")).unwrap();
        Fleet {
            ns: ns.to_string(),
            hub: client(HUB).await,
            dir,
            hub_kubeconfig,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The provider file: `secretreader` (the plugin built from the snapshot, reading the hub
    /// with [`Fleet::hub_kubeconfig`]) first, then `more`; written into the fleet's folder.
    pub fn provider_file(&self, more: &[Value]) -> PathBuf {
        let mut providers = vec![self.secretreader_with(json!({}))];
        providers.extend(more.iter().cloned());
        let path = self.dir().join("providers.json");
        std::fs::write(&path, json!({"providers": providers}).to_string()).unwrap();
        path
    }

    /// The `secretreader` provider entry, with `extra` merged in (its policies, say).
    pub fn secretreader_with(&self, extra: Value) -> Value {
        let mut p = json!({"name": SECRETREADER, "execConfig": {
            "apiVersion": "client.authentication.k8s.io/v1",
            "command": super::inventory::plugin(),
            "env": [{"name": "KUBECONFIG", "value": self.hub_kubeconfig}],
            "provideClusterInfo": true}});
        if let (Some(p), Some(extra)) = (p.as_object_mut(), extra.as_object()) {
            p.extend(extra.clone());
        }
        p
    }

    /// An executable script in the fleet's folder (a provider's command in a test).
    pub fn script(&self, name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = self.dir().join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    /// A token for the cluster of `context`, minted by `remote-access` (its read-only identity
    /// in the fleet's namespace there), valid for `duration` (`1h`).
    pub async fn token_for(&self, context: &str, duration: &str) -> String {
        remote_access_token(context, &self.ns, duration).await
    }

    /// The hub's Secret `<ns>/<name>` with `token` (what `secretreader` reads).
    pub async fn put_token(&self, name: &str, token: &str) {
        let s: Secret = super::obj(json!({"metadata": {"name": name},
                                          "stringData": {"token": token}}));
        Api::<Secret>::namespaced(self.hub.clone(), &self.ns)
            .patch(
                name,
                &PatchParams::apply("test").force(),
                &Patch::Apply(serde_json::to_value(&s).unwrap()),
            )
            .await
            .unwrap_or_else(|e| panic!("hub Secret {name}: {e}"));
    }

    pub async fn delete_token(&self, name: &str) {
        Api::<Secret>::namespaced(self.hub.clone(), &self.ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete hub Secret {name}: {e}"));
    }

    /// The kubeconfig `cluster` of a bed cluster (its https server and CA), as a profile's
    /// access provider carries it.
    pub async fn cluster_of(context: &str) -> Value {
        let kc = Kubeconfig::read_from(&bed().await.kubeconfig).expect("bed kubeconfig");
        let c = kc
            .clusters
            .iter()
            .find(|c| c.name == context)
            .and_then(|c| c.cluster.as_ref())
            .unwrap_or_else(|| panic!("no cluster {context} in the bed kubeconfig"));
        json!({"server": c.server, "certificate-authority-data": c.certificate_authority_data})
    }

    /// An access provider entry for the cluster of `context`: `provider`, its `secretreader`
    /// exec extension naming the hub Secret `secret`, and `extensions` after it.
    pub async fn access(provider: &str, context: &str, secret: &str, extensions: Value) -> Value {
        access_entry(
            provider,
            Self::cluster_of(context).await,
            secret,
            extensions,
        )
    }

    /// Creates profile `name` (as a cluster manager would) and sets its status.
    pub async fn create_profile(&self, name: &str, status: Value) {
        create_profile_in(&self.hub, &self.ns, name, status).await
    }

    /// Replaces profile `name`'s status (merge patch of the status subresource).
    pub async fn set_status(&self, name: &str, status: Value) {
        set_status_in(&self.hub, &self.ns, name, status).await
    }

    /// The condition `kind` of profile `name`, if it carries one.
    pub async fn condition(&self, name: &str, kind: &str) -> Result<Value, String> {
        condition_in(&self.hub, &self.ns, name, kind).await
    }

    pub async fn delete_profile(&self, name: &str) {
        profiles(&self.hub, &self.ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap_or_else(|e| panic!("delete ClusterProfile {name}: {e}"));
    }

    /// The daemon's flags for this fleet: profiles from the hub by its kubeconfig path, the
    /// provider file `providers`, the plugin run again every 5 s.
    pub fn flags(&self, providers: &Path) -> Vec<String> {
        [
            "--cluster-profiles",
            &self.ns,
            "--cluster-profiles-hub",
            &self.hub_kubeconfig.display().to_string(),
            "--clusterprofile-provider-file",
            &providers.display().to_string(),
            "--cluster-profiles-refresh-seconds",
            "5",
        ]
        .map(String::from)
        .to_vec()
    }
}
