//! Remotes from Secrets: each Secret of the daemon's namespace selected by
//! `--remote-secret-selector` names one remote cluster (data key `kubeconfig`; the name from its
//! label or annotation `fair.com/cross-cluster-name`, else the Secret's name). A Secret applied
//! joins its remote, a changed kubeconfig rotates it (new client and watches, same caches' keys:
//! nothing is rewritten), a Secret deleted makes it leave after `--remote-removal-grace-seconds`
//! (its followers are then deleted). A Secret that cannot be used is reported (log, /readyz,
//! Event on the Secret, metric) and changes nothing; a remote that was running keeps running.
//!
//! A remote's identity is its cluster id (the uid of its kube-system namespace). A Secret whose
//! kubeconfig now reaches another cluster than its remote did is held, not switched: otherwise
//! the other cluster's complete listing would prove every follower of the first "gone".
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::Api;
use kube::config::Kubeconfig;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use sha2::{Digest, Sha256};
use tracing::{info, warn};

use crate::args::Args;
use crate::clients::{self, Remote};
use crate::metrics::labels;
use crate::registry::Origin;
use crate::worker::Runtime;

/// Label or annotation naming the remote cluster.
pub const NAME_KEY: &str = "fair.com/cross-cluster-name";
/// The Secret's data key holding the kubeconfig.
pub const DATA_KEY: &str = "kubeconfig";
/// The Secret annotation that turns on the outage policy for its remote (see `crate::outage`).
pub const STALE_AFTER_KEY: &str = "fair.com/cross-cluster-stale-after";
/// How often Secrets that could not be used (an unreachable server, say) are tried again.
const RETRY: Duration = Duration::from_secs(10);

/// What a Secret says, read without I/O.
#[derive(Debug)]
pub struct Candidate {
    /// the remote's name
    pub name: String,
    pub kubeconfig: Kubeconfig,
    /// of the kubeconfig bytes and the outage policy: a different hash is a rotation
    pub hash: String,
    /// the outage policy (annotation [`STALE_AFTER_KEY`])
    pub stale_after: Option<Duration>,
}

/// Pure: the remote a Secret describes, or why it describes none.
pub fn read_secret(s: &Secret) -> Result<Candidate, String> {
    let secret_name = s.name_any();
    let name = s
        .labels()
        .get(NAME_KEY)
        .or_else(|| s.annotations().get(NAME_KEY))
        .cloned()
        .unwrap_or(secret_name);
    // as --cluster-name: it is recorded in annotations and metric labels, never a label
    if name.is_empty() || name.len() > 253 || name.chars().any(char::is_control) {
        return Err(format!(
            "the remote name {name:?} ({NAME_KEY}, or the Secret's name) must be 1 to 253 printable characters"
        ));
    }
    let text = kubeconfig_text(s)?;
    let kubeconfig = Kubeconfig::from_yaml(&text)
        .map_err(|e| format!("{DATA_KEY:?} is not a kubeconfig: {}", one_line(e)))?;
    let stale_after = match s.annotations().get(STALE_AFTER_KEY) {
        Some(v) => crate::outage::parse_stale_after(v)
            .map_err(|e| format!("annotation {STALE_AFTER_KEY}: {e}"))?,
        None => None,
    };
    let policy = stale_after.map_or(String::new(), |d| d.as_secs().to_string());
    Ok(Candidate {
        name,
        kubeconfig,
        hash: hex::encode(Sha256::digest(format!("{text}\n{policy}").as_bytes())),
        stale_after,
    })
}

/// The kubeconfig text a Secret holds under [`DATA_KEY`] (data, else stringData).
pub fn kubeconfig_text(s: &Secret) -> Result<String, String> {
    let bytes = s
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map(|ByteString(b)| b.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(DATA_KEY))
                .map(|t| t.as_bytes().to_vec())
        })
        .ok_or_else(|| format!("no data key {DATA_KEY:?}"))?;
    String::from_utf8(bytes).map_err(|_| format!("{DATA_KEY:?} is not text"))
}

fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string().replace('\n', " ")
}

/// The uid of a cluster's kube-system namespace: its id (as the MCS ClusterProperty
/// `cluster.clusterset.k8s.io` defines it).
pub async fn cluster_id(client: &Client, timeout: Duration) -> Result<String, String> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = tokio::time::timeout(timeout, api.get("kube-system"))
        .await
        .map_err(|_| format!("no answer within {timeout:?}"))?
        .map_err(|e| {
            format!(
                "reading its cluster id (namespace kube-system): {}",
                crate::error::chain(&e)
            )
        })?;
    ns.uid()
        .ok_or_else(|| "its kube-system namespace has no uid".to_string())
}

/// The Secret source: joins, rotates and retires Secret remotes.
pub struct Source {
    pub rt: Arc<Runtime>,
    pub sup: crate::supervisor::Supervisor,
    pub args: Args,
    pub local: Client,
    pub local_authority: String,
    pub local_id: Option<String>,
    pub sweep_now: Arc<tokio::sync::Notify>,
    /// Secret name -> the Secret as last seen
    secrets: BTreeMap<String, Secret>,
    /// Secret names that could not be used (tried again every RETRY)
    failing: BTreeSet<String>,
    /// remote name -> when it leaves (its Secret was deleted)
    leaving: BTreeMap<String, Instant>,
    /// remote name -> the cluster id it had (a Secret reaching another cluster is held)
    ids: BTreeMap<String, String>,
}

impl Source {
    pub fn new(
        rt: Arc<Runtime>,
        sup: crate::supervisor::Supervisor,
        args: Args,
        local: Client,
        local_authority: String,
        local_id: Option<String>,
        sweep_now: Arc<tokio::sync::Notify>,
    ) -> Self {
        let ids = rt
            .ctx
            .remotes
            .members()
            .iter()
            .filter_map(|m| Some((m.name().to_string(), m.cluster_id.clone()?)))
            .collect();
        Self {
            rt,
            sup,
            args,
            local,
            local_authority,
            local_id,
            sweep_now,
            secrets: BTreeMap::new(),
            failing: BTreeSet::new(),
            leaving: BTreeMap::new(),
            ids,
        }
    }

    /// Follows the Secrets until shutdown.
    pub async fn run(mut self) {
        // the local followers say which cluster each remote name was: listed first
        while !self.rt.ctx.local.ready() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.args.namespace);
        let cfg = watcher::Config::default()
            .labels(&self.args.remote_secret_selector)
            .timeout(self.args.api_timeout_seconds);
        let stream = watcher(api, cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // not ready until the Secrets have been listed once: remotes may still be missing
        let listing_source = format!("remote Secrets in {}", self.args.namespace);
        let registry = std::sync::Arc::clone(&self.rt.ctx.remotes);
        registry.set_problem(&listing_source, "not listed yet".into());
        let mut listed_once = false;
        let mut tick = tokio::time::interval(RETRY.min(self.grace()).max(Duration::from_secs(1)));
        let mut listing: Option<BTreeSet<String>> = None;
        loop {
            tokio::select! {
                ev = stream.next() => match ev {
                    Some(Ok(ev)) => {
                        let listed = matches!(ev, Event::InitDone);
                        self.on_event(ev, &mut listing).await;
                        if listed {
                            listed_once = true;
                            registry.clear_problem(&listing_source);
                            registry.set_complete(true);
                        }
                    }
                    Some(Err(e)) => {
                        let why = crate::error::chain(&e);
                        warn!(error = %why, "watch of remote Secrets failing; retrying");
                        // before the first listing, /readyz says why it has not come; after it,
                        // the remotes known keep running and the log says it
                        if !listed_once {
                            registry.set_problem(&listing_source, format!("not listed yet: {why}"));
                        }
                    }
                    None => return,
                },
                _ = tick.tick() => self.on_tick().await,
            }
        }
    }

    fn grace(&self) -> Duration {
        Duration::from_secs(self.args.remote_removal_grace_seconds)
    }

    async fn on_event(&mut self, ev: Event<Secret>, listing: &mut Option<BTreeSet<String>>) {
        match ev {
            Event::Init => *listing = Some(BTreeSet::new()),
            Event::InitApply(s) => {
                if let Some(seen) = listing.as_mut() {
                    seen.insert(s.name_any());
                }
                self.applied(s).await;
            }
            Event::InitDone => {
                // a complete listing: Secrets we knew that it lacks were deleted meanwhile
                let seen = listing.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .secrets
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for name in gone {
                    self.deleted(&name);
                }
            }
            Event::Apply(s) => self.applied(s).await,
            Event::Delete(s) => self.deleted(&s.name_any()),
        }
    }

    fn source(&self, secret: &str) -> String {
        format!("Secret {}/{secret}", self.args.namespace)
    }

    async fn applied(&mut self, s: Secret) {
        let name = s.name_any();
        self.secrets.insert(name.clone(), s.clone());
        match self.evaluate(&s).await {
            Ok(()) => {
                self.failing.remove(&name);
                self.rt.ctx.remotes.clear_problem(&self.source(&name));
            }
            Err(why) => {
                let first = self.failing.insert(name.clone());
                self.refused(&s, why, first).await;
            }
        }
        self.count_refused();
    }

    /// Joins, rotates or leaves alone the remote a Secret names.
    async fn evaluate(&mut self, s: &Secret) -> Result<(), String> {
        let secret = s.name_any();
        let c = read_secret(s)?;
        let registry = &self.rt.ctx.remotes;
        let existing = registry.get(&c.name);
        if let Some(m) = &existing {
            match &m.origin {
                Origin::Secret { name, hash } if *name == secret => {
                    if *hash == c.hash {
                        self.leaving.remove(&c.name);
                        return Ok(());
                    }
                }
                Origin::Secret { name, .. } if self.secrets.contains_key(name) => {
                    return Err(format!(
                        "remote {:?} is already named by Secret {name}",
                        c.name
                    ));
                }
                Origin::Secret { .. } => {} // its Secret is gone: this one takes over
                Origin::Static => {
                    return Err(format!(
                        "remote {:?} is already the static remote (--kubeconfig/--remote-context)",
                        c.name
                    ));
                }
            }
        }
        let credential = crate::credentials::user_of(&c.kubeconfig)
            .map(crate::credentials::credential)
            .unwrap_or_default();
        let (client, at) = clients::secret_remote(c.kubeconfig, &self.args)
            .await
            .map_err(|e| e.to_string())?;
        if at == self.local_authority {
            return Err(format!("its server {at} is the local cluster's"));
        }
        // bounded below the API timeout: a Secret whose server hangs must not hold the others long
        let id = cluster_id(
            &client,
            self.args.api_timeout().min(Duration::from_secs(10)),
        )
        .await?;
        if self.local_id.as_deref() == Some(id.as_str()) {
            return Err(format!("it reaches the local cluster (cluster id {id})"));
        }
        if let Some(other) = registry
            .members()
            .into_iter()
            .find(|m| m.name().as_ref() != c.name && m.cluster_id.as_deref() == Some(id.as_str()))
        {
            return Err(format!(
                "it reaches cluster {id}, already read as remote {:?}",
                other.name()
            ));
        }
        if !self.ids.contains_key(&c.name) {
            // a restarted daemon: what the followers record, read once per name
            let recorded = self.recorded_ids(&c.name);
            if let Some(r) = recorded.iter().find(|r| **r != id).or(recorded.first()) {
                self.ids.insert(c.name.clone(), r.clone());
            }
        }
        if let Some(was) = self.ids.get(&c.name)
            && *was != id
        {
            return Err(format!(
                "held: it now reaches cluster {id}, but remote {:?} is cluster {was}; its followers are kept. To read the new cluster, give it another name ({NAME_KEY}); to drop the old one, delete this Secret",
                c.name
            ));
        }
        let remote = Remote {
            name: c.name.clone(),
            client,
        };
        let origin = Origin::Secret {
            name: secret.clone(),
            hash: c.hash,
        };
        let member = crate::app::join(
            &self.sup,
            &self.rt,
            &remote,
            (Some(id.clone()), c.stale_after),
            origin,
            &self.args,
        );
        let _ = member.state.credential.set(credential);
        self.ids.insert(c.name.clone(), id.clone());
        self.leaving.remove(&c.name);
        let change = if existing.is_some() {
            "rotated"
        } else {
            "joined"
        };
        self.changed(change);
        info!(remote = %c.name, secret = %self.source(&secret), cluster_id = %id, "remote {change}");
        Ok(())
    }

    /// The cluster ids the local followers of remote `name` record (a restarted daemon's memory
    /// of which cluster a remote is): on a Service whose fields come from it, and on its slices.
    fn recorded_ids(&self, name: &str) -> BTreeSet<String> {
        let opts = crate::desired::Options {
            label_key: self.args.label_key.clone(),
            cluster_name: name.to_string(),
            endpoints_mode: self.args.endpoints_mode.into(),
            cluster_id: None,
        };
        let (origin, id_key) = (
            opts.origin_cluster_annotation(),
            opts.origin_cluster_id_annotation(),
        );
        let of = |a: &BTreeMap<String, String>| {
            (a.get(&origin).map(String::as_str) == Some(name))
                .then(|| a.get(&id_key).cloned())
                .flatten()
        };
        let mut ids: BTreeSet<String> = {
            let services = crate::reconcile::read(&self.rt.ctx.local.services);
            services
                .keys()
                .filter_map(|k| services.named(k).ok().flatten())
                .filter_map(|s| of(s.annotations()))
                .collect()
        };
        let slices = crate::reconcile::read(&self.rt.ctx.local.slices);
        for k in slices.keys() {
            for s in slices.group(k).unwrap_or_default() {
                ids.extend(of(s.annotations()));
            }
        }
        ids
    }

    /// A Secret that cannot be used: reported; a remote it named keeps running as it was.
    async fn refused(&self, s: &Secret, why: String, first: bool) {
        let source = self.source(&s.name_any());
        if first {
            warn!(secret = %source, "not a usable remote: {why}");
            self.changed("refused");
        }
        self.rt
            .ctx
            .remotes
            .set_problem(&source, format!("not a remote: {why}"));
        let reference = s.object_ref(&());
        self.rt
            .ctx
            .event(
                EventType::Warning,
                "RemoteRefused",
                why,
                "Join",
                Some(reference),
            )
            .await;
    }

    /// A Secret deleted: its remote leaves after the grace (unless a Secret names it again).
    fn deleted(&mut self, secret: &str) {
        self.secrets.remove(secret);
        self.failing.remove(secret);
        self.rt.ctx.remotes.clear_problem(&self.source(secret));
        self.count_refused();
        for m in self.rt.ctx.remotes.members() {
            if matches!(&m.origin, Origin::Secret { name, .. } if name == secret) {
                let at = Instant::now() + self.grace();
                info!(
                    remote = %m.name(), secret = %self.source(secret), grace_s = self.grace().as_secs(),
                    "remote Secret deleted: once the grace has passed the remote leaves, what only it exported is deleted, and merged followers lose its slices"
                );
                self.leaving.insert(m.name().to_string(), at);
            }
        }
    }

    async fn on_tick(&mut self) {
        let retry: Vec<Secret> = self
            .failing
            .iter()
            .filter_map(|n| self.secrets.get(n).cloned())
            .collect();
        for s in retry {
            self.applied(s).await;
        }
        let due: Vec<String> = self
            .leaving
            .iter()
            .filter(|(_, at)| **at <= Instant::now())
            .map(|(n, _)| n.clone())
            .collect();
        for name in due {
            self.leave(&name);
        }
    }

    /// The grace has passed: the remote stops being read (every replica), and what the local
    /// followers record of it goes: each follower that records it is passed again, with the
    /// remote retired (a standby drops them; its next leadership gain passes every follower).
    fn leave(&mut self, name: &str) {
        self.leaving.remove(name);
        if self.rt.ctx.remotes.retire(name).is_none() {
            return;
        }
        self.ids.remove(name);
        self.forget_series(name);
        self.changed("left");
        let keys = crate::sweeper::retire_keys(&self.rt.ctx, name);
        info!(remote = %name, followers = keys.len(), "remote left: its watches stopped; what only it exported is deleted, and merged followers lose its slices");
        let note = format!(
            "remote {name} left (its Secret was deleted): {} followers record it; what only it exported is deleted, merged followers lose its slices",
            keys.len()
        );
        self.rt.enqueue(keys);
        if self.rt.leader.is_leader() {
            let ctx = Arc::clone(&self.rt.ctx);
            tokio::spawn(async move {
                ctx.event(EventType::Normal, "RemoteLeft", note, "Leave", None)
                    .await;
            });
        }
    }

    fn changed(&self, change: &str) {
        self.rt
            .ctx
            .metrics
            .remote_changes
            .get_or_create(&labels([("change", change)]))
            .inc();
    }

    fn count_refused(&self) {
        self.rt
            .ctx
            .metrics
            .remote_secrets_refused
            .set(self.failing.len() as i64);
    }

    /// The gauges of a remote that left (counters stay: they only ever grow).
    fn forget_series(&self, name: &str) {
        let m = &self.rt.ctx.metrics;
        let l = labels([("remote", name)]);
        m.followers.remove(&l);
        m.remote_up.remove(&l);
        m.since_list.remove(&l);
        m.credential_expiry.remove(&l);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(labels: serde_json::Value, data: Option<&str>) -> Secret {
        let mut s = json!({"metadata": {"name": "east-secret", "namespace": "fair-system",
                                        "labels": labels}});
        if let Some(d) = data {
            use base64::Engine;
            s["data"] = json!({DATA_KEY: base64::engine::general_purpose::STANDARD.encode(d)});
        }
        serde_json::from_value(s).expect("a Secret")
    }

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: r\n  user: {token: abc}\ncontexts:\n- name: east\n  context: {cluster: east, user: r}\ncurrent-context: east\n";

    #[test]
    fn a_secret_names_its_remote_by_label_else_by_its_own_name() {
        let c = read_secret(&secret(json!({NAME_KEY: "east"}), Some(KUBECONFIG))).unwrap();
        assert_eq!(c.name, "east");
        assert_eq!(c.hash.len(), 64);
        let c = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert_eq!(c.name, "east-secret");
    }

    #[test]
    fn a_bad_secret_says_what_is_wrong_in_one_line() {
        let no_key = read_secret(&secret(json!({}), None)).unwrap_err();
        assert!(no_key.contains("no data key \"kubeconfig\""), "{no_key}");
        let bad = read_secret(&secret(json!({}), Some("clusters: [unclosed"))).unwrap_err();
        assert!(bad.contains("is not a kubeconfig"), "{bad}");
        assert!(!bad.contains('\n'));
        let mut long = secret(json!({}), Some(KUBECONFIG));
        long.metadata.annotations = Some([(NAME_KEY.to_string(), "x".repeat(254))].into());
        let name = read_secret(&long).unwrap_err();
        assert!(name.contains("remote name"), "{name}");
        // a name that is no label value (an EKS ARN, say) comes in the annotation
        let arn = "arn:aws:eks:eu-west-1:123456789012:cluster/east";
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations = Some([(NAME_KEY.to_string(), arn.to_string())].into());
        assert_eq!(read_secret(&s).unwrap().name, arn);
    }

    #[test]
    fn a_changed_kubeconfig_has_another_hash() {
        let a = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        let rotated = KUBECONFIG.replace("abc", "def");
        let b = read_secret(&secret(json!({}), Some(&rotated))).unwrap();
        assert_ne!(a.hash, b.hash);
    }
}
