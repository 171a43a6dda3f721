//! Remotes from the cluster inventory (the ClusterProfile API of SIG Multicluster, KEP-4322):
//! each ClusterProfile of the hub's namespace (`--cluster-profiles`) that offers an access
//! provider of the provider file (`--clusterprofile-provider-file`) names one remote, called
//! after the profile. Its plugin is run (see [`exec`]) for a credential; the profile's cluster
//! and that credential make the remote's kubeconfig, which goes through the policy of a remote
//! Secret's (see [`access`]). Joined, rotated and retired as [`super::source`] says, like a
//! Secret remote: a changed access or a new credential is a rotation. The plugin is run again
//! before its credential expires (`--remote-token-renew-before`) and at the refresh interval, so
//! a credential rotated in the hub reaches the remote without any event.
//!
//! A profile whose `ControlPlaneHealthy` condition is False is shown (health Lease, `status`),
//! and is never proof of anything: only a remote's own listings prove a Service gone.
pub mod access;
pub mod exec;
pub mod report;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ObjectMeta};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::warn;

use super::Settings;
use super::credentials::{self, RenewBefore};
use super::remote_secret::{Candidate, check_name, read_policy};
use super::source::{Kind, Refused, Source};
use crate::client::Clients;
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::Metrics;
use crate::runtime::supervisor::Supervisor;
use crate::state::{Credential, Origin};
use access::Providers;

/// How often the leader looks whether a profile's condition (write-back) must change, besides
/// each change of a remote's health.
const REPORT_INTERVAL: Duration = Duration::from_secs(10);

/// The condition a cluster manager sets on a profile.
pub const CONTROL_PLANE_HEALTHY: &str = "ControlPlaneHealthy";

/// A ClusterProfile (`multicluster.x-k8s.io/v1alpha1`), as much of it as the daemon reads.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
pub struct ClusterProfile {
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
}

impl Resource for ClusterProfile {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        "ClusterProfile".into()
    }
    fn group(_: &()) -> Cow<'_, str> {
        "multicluster.x-k8s.io".into()
    }
    fn version(_: &()) -> Cow<'_, str> {
        "v1alpha1".into()
    }
    fn plural(_: &()) -> Cow<'_, str> {
        "clusterprofiles".into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Which cluster holds the profiles.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Hub {
    /// the local cluster (its client)
    Local,
    /// a kubeconfig file (its current context), the operator's
    Path(PathBuf),
    /// a kubeconfig in a Secret of the daemon's namespace (data key `kubeconfig`), checked as a
    /// remote Secret's is
    Secret(String),
}

impl std::str::FromStr for Hub {
    type Err = String;

    /// `local`, `secret:NAME`, or a kubeconfig's absolute path.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "" | "local" => Ok(Hub::Local),
            _ if s.starts_with('/') => Ok(Hub::Path(PathBuf::from(s))),
            _ => match s.strip_prefix("secret:") {
                Some(name) if !name.is_empty() => Ok(Hub::Secret(name.to_string())),
                _ => Err(format!(
                    "{s:?}: `local`, `secret:NAME` (a Secret of the daemon's namespace) or the absolute path of a kubeconfig"
                )),
            },
        }
    }
}

/// Where ClusterProfile remotes come from.
#[derive(Clone, Debug)]
pub struct ProfileSource {
    pub hub: Hub,
    /// the hub's namespace holding the profiles
    pub namespace: String,
    /// the label selector of the profiles read (empty: all)
    pub selector: String,
    pub providers: Providers,
    /// the plugin is run again at least this often
    pub refresh: Duration,
    /// and this long before its credential expires
    pub renew_before: RenewBefore,
    /// a plugin that has not answered by then is killed
    pub exec_timeout: Duration,
    /// how long a remote whose profile was deleted is kept before it leaves
    pub removal_grace: Duration,
    /// the daemon's namespace (a hub given by Secret is there)
    pub daemon_namespace: String,
    /// write back what this daemon sees of each profile's cluster, as a condition named after
    /// this name (see [`report`]); None: write nothing to the hub
    pub report_as: Option<String>,
}

/// The profiles of the hub's namespace.
pub struct Profiles {
    hub: Client,
    from: ProfileSource,
    ctl: Arc<Controller>,
    /// each profile's credential and when its plugin runs again
    credentials: Credentials,
    /// profile -> what its provider's policy ignored, as last said (said again on a change)
    ignored: BTreeMap<String, Vec<String>>,
    /// with write-back: this daemon's condition type, and its condition on each profile as seen
    report: Option<(String, report::Observed)>,
}

impl Kind for Profiles {
    type Object = ClusterProfile;
    const KIND: &'static str = "ClusterProfile";

    fn api(&self) -> Api<ClusterProfile> {
        Api::namespaced(self.hub.clone(), &self.from.namespace)
    }

    fn selector(&self) -> &str {
        &self.from.selector
    }

    fn namespace(&self) -> &str {
        &self.from.namespace
    }

    fn remote_name(&self, p: &ClusterProfile) -> String {
        p.name_any()
    }

    async fn candidate(&mut self, p: &ClusterProfile) -> Result<Candidate, Refused> {
        let name = p.name_any();
        if let Some((kind, observed)) = &self.report {
            let mut observed = observed.write();
            match report::ours(p, kind) {
                Some(c) => observed.insert(name.clone(), c),
                None => observed.remove(&name),
            };
        }
        // what the hub says of the cluster is shown whatever else happens
        self.ctl
            .remotes()
            .set_reported(&name, control_plane_unhealthy(p.status.as_ref()));
        check_name(&name, "the ClusterProfile's name").map_err(Refused::Unreadable)?;
        let policy = read_policy(p.annotations()).map_err(Refused::Unreadable)?;
        let access = access::access(&self.from.providers, p.status.as_ref())?;
        self.say_ignored(&name, &access.ignored);
        let (issued, ran) = self
            .credentials
            .get(
                &name,
                &access.invocation,
                self.from.refresh,
                self.from.exec_timeout,
            )
            .await?;
        let (kubeconfig, text) = kubeconfig(&name, &access, &issued)?;
        let credential = credential_of(&kubeconfig, &issued);
        if ran && let Some(at) = refresh_at(&credential, self.from.renew_before, self.from.refresh)
        {
            self.credentials.next.insert(name.clone(), at);
        }
        let mut c = policy.candidate(name, kubeconfig, &text);
        c.credential = Some(credential);
        Ok(c)
    }

    fn origin(&self, object: &str, hash: String) -> Origin {
        Origin::Profile {
            name: object.to_string(),
            hash,
        }
    }

    fn reference(&self, _: &ClusterProfile) -> Option<ObjectReference> {
        // the profile may be in another cluster: the Event names it in its note
        None
    }

    fn refused_gauge(metrics: &Metrics) -> &Gauge {
        &metrics.remote_profiles_refused
    }

    fn due(&mut self) -> Vec<String> {
        let now = Instant::now();
        self.credentials
            .next
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(n, _)| n.clone())
            .collect()
    }

    fn forget(&mut self, object: &str) {
        self.credentials.next.remove(object);
        self.credentials.issued.remove(object);
        self.ignored.remove(object);
        if let Some((_, observed)) = &self.report {
            observed.write().remove(object);
        }
        self.ctl.remotes().set_reported(object, None);
    }
}

impl Profiles {
    fn say_ignored(&mut self, name: &str, ignored: &[String]) {
        if self.ignored.get(name).map(Vec::as_slice) == Some(ignored) {
            return;
        }
        if !ignored.is_empty() {
            warn!(profile = %name, namespace = %self.from.namespace, ignored = ?ignored,
                "the profile's own arguments or environment for its plugin were ignored, as its provider's policy says");
        }
        self.ignored.insert(name.to_string(), ignored.to_vec());
    }
}

/// The profiles' credentials, as their plugins last gave them.
#[derive(Default)]
struct Credentials {
    /// profile -> when its plugin runs again
    next: BTreeMap<String, Instant>,
    /// profile -> the invocation its plugin last ran and the credential it gave
    issued: BTreeMap<String, (access::Invocation, exec::Issued)>,
}

impl Credentials {
    /// A profile's credential, and whether the plugin ran for it: the last one the plugin gave
    /// for this very invocation while its refresh is not due (a profile's status changes often,
    /// its conditions and properties: that runs no plugin), else what the plugin gives now.
    async fn get(
        &mut self,
        name: &str,
        invocation: &access::Invocation,
        refresh: Duration,
        limit: Duration,
    ) -> Result<(exec::Issued, bool), Refused> {
        let now = Instant::now();
        let due = self.next.get(name).is_none_or(|at| *at <= now);
        let cached = self
            .issued
            .get(name)
            .filter(|(inv, _)| !due && inv == invocation)
            .map(|(_, i)| i.clone());
        if let Some(i) = cached {
            return Ok((i, false));
        }
        // run again at the refresh interval (sooner before expiry), or at the source's retry when
        // it fails: a failed run leaves no credential to fall back on, so the failure stays shown
        self.next.insert(name.to_string(), now + refresh);
        self.issued.remove(name);
        let i = exec::run(invocation, limit).await?;
        self.issued
            .insert(name.to_string(), (invocation.clone(), i.clone()));
        Ok((i, true))
    }
}

/// Pure: "ControlPlaneHealthy False (Reason): message" when the profile says so; None otherwise
/// (True, Unknown or no condition).
pub fn control_plane_unhealthy(status: Option<&Value>) -> Option<String> {
    let c = status?
        .get("conditions")?
        .as_array()?
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some(CONTROL_PLANE_HEALTHY))?;
    let field = |k: &str| c.get(k).and_then(Value::as_str).unwrap_or_default();
    (field("status") == "False").then(|| {
        let line = format!(
            "{CONTROL_PLANE_HEALTHY} False ({}): {}",
            field("reason"),
            field("message")
        );
        line.replace('\n', " ").chars().take(300).collect()
    })
}

/// Pure: the remote's kubeconfig (the profile's cluster and the plugin's credential as inline
/// data), and the text its hash is of (the access and the credential).
fn kubeconfig(
    name: &str,
    access: &access::Access,
    issued: &exec::Issued,
) -> Result<(kube::config::Kubeconfig, String), Refused> {
    use base64::Engine;
    let b64 = |pem: &str| base64::engine::general_purpose::STANDARD.encode(pem);
    let mut user = serde_json::Map::new();
    if let Some(t) = &issued.token {
        user.insert("token".into(), json!(t));
    }
    if let Some((cert, key)) = &issued.certificate {
        user.insert("client-certificate-data".into(), json!(b64(cert)));
        user.insert("client-key-data".into(), json!(b64(key)));
    }
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": access.cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    });
    let kc: kube::config::Kubeconfig = serde_json::from_value(doc.clone()).map_err(|e| {
        Refused::Unreadable(format!("its cluster is not a kubeconfig cluster: {e}"))
    })?;
    let inv = &access.invocation;
    let text = json!({"kubeconfig": doc, "provider": inv.provider, "command": inv.command,
                      "args": inv.args, "env": inv.env, "info": inv.exec_info});
    Ok((kc, hex::encode(Sha256::digest(text.to_string()))))
}

/// What the credential says: the plugin's expiry when it gives one, else the token's or the
/// certificate's own.
fn credential_of(kc: &kube::config::Kubeconfig, issued: &exec::Issued) -> Credential {
    let mut c = credentials::user_of(kc)
        .map(credentials::credential)
        .unwrap_or_default();
    if issued.expiry.is_some() {
        c.expiry = issued.expiry;
    }
    c
}

/// Pure: when the plugin must run again for its credential, if sooner than the refresh.
fn refresh_at(c: &Credential, before: RenewBefore, refresh: Duration) -> Option<Instant> {
    let due = credentials::due_at(c, before)?;
    let wait = due.duration_since(Timestamp::now());
    let wait = Duration::try_from(wait).unwrap_or(Duration::ZERO);
    (wait < refresh).then(|| Instant::now() + wait)
}

/// The hub's client.
async fn hub_client(
    from: &ProfileSource,
    clients: &Clients,
    settings: &Settings,
) -> Result<Client, String> {
    match &from.hub {
        Hub::Local => Ok(clients.local.clone()),
        Hub::Path(p) => crate::client::operator_client(p, &settings.client)
            .await
            .map_err(|e| format!("--cluster-profiles-hub {}: {e}", p.display())),
        Hub::Secret(name) => {
            let at = format!("--cluster-profiles-hub secret:{name}");
            let api: Api<Secret> = Api::namespaced(clients.local.clone(), &from.daemon_namespace);
            let s = api
                .get(name)
                .await
                .map_err(|e| format!("{at}: Secret {}/{name}: {e}", from.daemon_namespace))?;
            let text =
                super::remote_secret::kubeconfig_text(&s).map_err(|e| format!("{at}: {e}"))?;
            let kc = kube::config::Kubeconfig::from_yaml(&text)
                .map_err(|e| format!("{at}: not a kubeconfig: {e}"))?;
            crate::client::secret_remote(kc, &settings.client)
                .await
                .map(|(c, _)| c)
                .map_err(|e| format!("{at}: {e}"))
        }
    }
}

/// Remotes from the ClusterProfiles of the hub's namespace: joined, rotated and retired at run
/// time. A hub that cannot be reached at start is an error of the process (the flags name it).
pub async fn spawn(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    clients: &Clients,
    settings: (&Settings, &ProfileSource),
) -> Result<(), String> {
    let (settings, from) = settings;
    // not complete until listed: set before anything else can read the registry
    ctl.remotes()
        .unlisted(&super::source::listing_source::<Profiles>(&from.namespace));
    let hub = hub_client(from, clients, settings).await?;
    let report = from.report_as.as_ref().map(|name| {
        let kind = format!("{}{name}", report::CONDITION_PREFIX);
        let observed = report::Observed::default();
        let reporter = report::Reporter {
            ctl: Arc::clone(ctl),
            hub: hub.clone(),
            namespace: from.namespace.clone(),
            kind: kind.clone(),
            interval: REPORT_INTERVAL,
            observed: Arc::clone(&observed),
        };
        sup.spawn_until_shutdown("ClusterProfile conditions", reporter.run());
        (kind, observed)
    });
    let kind = Profiles {
        hub,
        from: from.clone(),
        ctl: Arc::clone(ctl),
        credentials: Credentials::default(),
        ignored: BTreeMap::new(),
        report,
    };
    let local = super::source::local_cluster(clients, settings).await;
    let source = Source::new(
        kind,
        Arc::clone(ctl),
        sup.clone(),
        Arc::new(settings.clone()),
        from.removal_grace,
        local,
    );
    sup.spawn_until_shutdown("remote ClusterProfiles", source.run());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_false_control_plane_condition_is_reported() {
        let s = |status: &str| {
            json!({"conditions": [{"type": "Other", "status": "False"},
                {"type": CONTROL_PLANE_HEALTHY, "status": status, "reason": "Unreachable",
                 "message": "the agent stopped\nreporting"}]})
        };
        assert_eq!(
            control_plane_unhealthy(Some(&s("False"))).as_deref(),
            Some("ControlPlaneHealthy False (Unreachable): the agent stopped reporting")
        );
        assert_eq!(control_plane_unhealthy(Some(&s("True"))), None);
        assert_eq!(control_plane_unhealthy(Some(&s("Unknown"))), None);
        assert_eq!(control_plane_unhealthy(None), None);
    }

    #[test]
    fn the_hub_is_local_a_path_or_a_secret() {
        assert_eq!("local".parse::<Hub>(), Ok(Hub::Local));
        assert_eq!(
            "/etc/hub/kubeconfig".parse::<Hub>(),
            Ok(Hub::Path("/etc/hub/kubeconfig".into()))
        );
        assert_eq!("secret:hub".parse::<Hub>(), Ok(Hub::Secret("hub".into())));
        assert!(
            "hub.yaml".parse::<Hub>().is_err(),
            "a relative path is ambiguous"
        );
        assert!("secret:".parse::<Hub>().is_err());
    }

    #[test]
    fn the_kubeconfig_carries_the_profiles_cluster_and_the_plugins_credential() {
        let providers = access::parse_provider_file(
            r#"{"providers": [{"name": "p", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/p"}}]}"#,
        )
        .unwrap();
        let status = json!({"accessProviders": [{"name": "p", "cluster": {
            "server": "https://10.0.0.1:6443", "certificate-authority-data": "Q0E="}}]});
        let a = access::access(&providers, Some(&status)).unwrap();
        let issued = exec::Issued {
            token: Some("t1".into()),
            certificate: None,
            expiry: None,
        };
        let (kc, first) = kubeconfig("east", &a, &issued).unwrap();
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://10.0.0.1:6443")
        );
        crate::client::policy::check(&kc, &[]).expect("inline data only");
        let rotated = exec::Issued {
            token: Some("t2".into()),
            ..issued
        };
        let (_, second) = kubeconfig("east", &a, &rotated).unwrap();
        assert_ne!(first, second, "a new token is a rotation");
        // the profile's cluster goes through the Secret kubeconfig policy
        let insecure = json!({"accessProviders": [{"name": "p", "cluster": {
            "server": "http://10.0.0.1:8080", "insecure-skip-tls-verify": true}}]});
        let a = access::access(&providers, Some(&insecure)).unwrap();
        let (kc, _) = kubeconfig("east", &a, &rotated).unwrap();
        assert!(crate::client::policy::check(&kc, &[]).is_err());
    }

    #[test]
    fn the_plugins_expiration_timestamp_is_the_credentials_expiry() {
        let providers = access::parse_provider_file(
            r#"{"providers": [{"name": "p", "execConfig": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/p"}}]}"#,
        )
        .unwrap();
        let status = json!({"accessProviders": [{"name": "p", "cluster": {"server": "https://10.0.0.1:6443"}}]});
        let a = access::access(&providers, Some(&status)).unwrap();
        let at: Timestamp = "2030-01-02T03:04:05Z".parse().unwrap();
        let opaque = exec::Issued {
            token: Some("not-a-jwt".into()),
            certificate: None,
            expiry: Some(at),
        };
        let (kc, _) = kubeconfig("east", &a, &opaque).unwrap();
        assert_eq!(credential_of(&kc, &opaque).expiry, Some(at));
        let unknown = exec::Issued {
            expiry: None,
            ..opaque
        };
        let (kc, _) = kubeconfig("east", &a, &unknown).unwrap();
        assert_eq!(
            credential_of(&kc, &unknown).expiry,
            None,
            "an opaque token says nothing"
        );
    }

    #[tokio::test]
    async fn the_plugin_runs_for_a_new_access_or_a_due_refresh_not_for_a_status_update() {
        // a plugin that counts its runs in a file and answers with the count as its token
        let dir = tempfile::tempdir().unwrap();
        let count = dir.path().join("runs");
        let script = format!(
            r#"echo x >> {0}; n=$(wc -l < {0}); [ -f {0}.fail ] && exit 1; printf '{{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{{"token":"t%s"}}}}' $n"#,
            count.display()
        );
        let inv = access::Invocation {
            provider: "p".into(),
            command: "/bin/sh".into(),
            args: vec!["-c".into(), script],
            env: vec![],
            api_version: "client.authentication.k8s.io/v1".into(),
            exec_info: "{}".into(),
        };
        let limit = Duration::from_secs(10);
        let hour = Duration::from_secs(3600);
        let mut c = Credentials::default();
        let token = |r: &(exec::Issued, bool)| (r.0.token.clone().unwrap(), r.1);
        let first = c.get("east", &inv, hour, limit).await.unwrap();
        assert_eq!(token(&first), ("t1".into(), true));
        // the profile applied again (its conditions changed): the last credential
        let again = c.get("east", &inv, hour, limit).await.unwrap();
        assert_eq!(token(&again), ("t1".into(), false));
        // another access (its cluster or its provider's command line): the plugin runs
        let mut other = inv.clone();
        other.exec_info = r#"{"other":1}"#.into();
        let changed = c.get("east", &other, hour, limit).await.unwrap();
        assert_eq!(token(&changed), ("t2".into(), true));
        // its refresh due: the plugin runs
        c.next.insert("east".into(), Instant::now());
        let due = c.get("east", &other, hour, limit).await.unwrap();
        assert_eq!(token(&due), ("t3".into(), true));
        // a failed run leaves nothing to fall back on: the next read runs it again, and fails
        std::fs::write(format!("{}.fail", count.display()), "").unwrap();
        c.next.insert("east".into(), Instant::now());
        assert!(c.get("east", &other, hour, limit).await.is_err());
        assert!(
            c.get("east", &other, hour, limit).await.is_err(),
            "not the old credential"
        );
        let runs = std::fs::read_to_string(&count).unwrap().lines().count();
        assert_eq!(
            runs, 5,
            "one run each: the first, the new access, the refresh, two failures"
        );
    }

    #[test]
    fn the_plugin_runs_again_before_expiry_when_that_is_sooner_than_the_refresh() {
        let soon = Credential {
            expiry: Some(Timestamp::now() + std::time::Duration::from_secs(600)),
            issued: None,
            subject: None,
        };
        let before = RenewBefore::Window(Duration::from_secs(300));
        let at = refresh_at(&soon, before, Duration::from_secs(3600)).expect("sooner");
        let wait = at.duration_since(Instant::now());
        assert!(
            wait > Duration::from_secs(250) && wait <= Duration::from_secs(300),
            "{wait:?}"
        );
        assert!(
            refresh_at(&soon, before, Duration::from_secs(60)).is_none(),
            "the refresh is sooner"
        );
        assert!(refresh_at(&Credential::default(), before, Duration::from_secs(60)).is_none());
    }
}
