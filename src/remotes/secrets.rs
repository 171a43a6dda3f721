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
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{info, warn};

use super::remote_secret::{Candidate, NAME_KEY, read_secret};
use super::{SecretSource, Settings};
use crate::client::Clients;
use crate::client::{self, Remote};
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::ByChange;
use crate::runtime::supervisor::Supervisor;
use crate::state::{Member, Origin};
use tokio::sync::Notify;

/// How often Secrets that could not be used (an unreachable server, say) are tried again.
const RETRY: Duration = Duration::from_secs(10);

/// Why a Secret's remote does not join: logged, shown on /readyz, recorded as an Event on the
/// Secret and counted; a remote that was running keeps running.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    /// The Secret describes no remote (see `read_secret`: its name, kubeconfig or annotations).
    #[error("{0}")]
    Unreadable(String),
    #[error("remote {name:?} is already named by Secret {secret}")]
    NamedElsewhere { name: String, secret: String },
    #[error("remote {name:?} is already the static remote (--kubeconfig/--remote-context)")]
    Static { name: String },
    /// No client could be built from its kubeconfig (or the kubeconfig policy refused it).
    #[error("{source}")]
    Client { source: crate::error::Error },
    #[error("its server {at} is the local cluster's")]
    LocalServer { at: String },
    #[error(transparent)]
    ClusterId(#[from] client::ClusterIdError),
    #[error("it reaches the local cluster (cluster id {id})")]
    LocalCluster { id: String },
    #[error("it reaches cluster {id}, already read as remote {other:?}")]
    AlreadyRead { id: String, other: String },
    #[error(
        "held: it now reaches cluster {id}, but remote {name:?} is cluster {was}; its followers are kept. To read the new cluster, give it another name ({NAME_KEY}); to drop the old one, delete this Secret"
    )]
    Held {
        name: String,
        id: String,
        was: String,
    },
}

/// The local cluster, as the Secret source needs it: a remote must be another cluster.
pub struct LocalCluster {
    pub client: Client,
    /// host:port of its API server
    pub authority: String,
    /// its cluster id, when known
    pub id: Option<String>,
}

/// The Secret source: joins, rotates and retires Secret remotes.
pub struct Source {
    pub ctl: Arc<Controller>,
    pub sup: crate::runtime::supervisor::Supervisor,
    pub settings: Arc<Settings>,
    pub from: SecretSource,
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
        ctl: Arc<Controller>,
        sup: crate::runtime::supervisor::Supervisor,
        settings: Arc<Settings>,
        from: SecretSource,
        local: LocalCluster,
        sweep_now: Arc<tokio::sync::Notify>,
    ) -> Self {
        let LocalCluster {
            client: local,
            authority: local_authority,
            id: local_id,
        } = local;
        let ids = ctl
            .remotes()
            .members()
            .iter()
            .filter_map(|m| Some((m.name().to_string(), m.cluster_id.clone()?)))
            .collect();
        Self {
            ctl,
            sup,
            settings,
            from,
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
        let local = std::sync::Arc::clone(self.ctl.local());
        local.readiness().until(|| local.ready()).await;
        let api: Api<Secret> = Api::namespaced(self.local.clone(), &self.from.namespace);
        let cfg = watcher::Config::default()
            .labels(&self.from.selector)
            .timeout(self.settings.watch_timeout());
        let stream = watcher(api, cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // not ready until the Secrets have been listed once: remotes may still be missing
        let listing_source = format!("remote Secrets in {}", self.from.namespace);
        let registry = std::sync::Arc::clone(self.ctl.remotes());
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
            // a remote joined or left, or the Secrets were listed: who goes by which MCS name
            let named = self.secrets.values().map(super::remote_secret::remote_name);
            registry.set_named(named.collect());
            self.ctl.settle_mcs_names().await;
        }
    }

    fn grace(&self) -> Duration {
        self.from.removal_grace
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
        format!("Secret {}/{secret}", self.from.namespace)
    }

    async fn applied(&mut self, s: Secret) {
        let name = s.name_any();
        self.secrets.insert(name.clone(), s.clone());
        match self.evaluate(&s).await {
            Ok(()) => {
                self.failing.remove(&name);
                self.count_refused();
                self.ctl.remotes().clear_problem(&self.source(&name));
            }
            Err(why) => {
                let first = self.failing.insert(name.clone());
                // the gauge first: whoever sees the problem on /readyz sees it counted
                self.count_refused();
                self.refused(&s, why, first).await;
            }
        }
    }

    /// Joins, rotates or leaves alone the remote a Secret names.
    async fn evaluate(&mut self, s: &Secret) -> Result<(), Refused> {
        let secret = s.name_any();
        let c = read_secret(s).map_err(Refused::Unreadable)?;
        let existing = self.ctl.remotes().get(&c.name);
        if self.unchanged(&secret, &c, existing.as_deref())? {
            return Ok(());
        }
        let credential = crate::remotes::credentials::user_of(&c.kubeconfig)
            .map(crate::remotes::credentials::credential)
            .unwrap_or_default();
        let (client, id) = self.reach(&c).await?;
        self.same_cluster(&c.name, &id)?;
        let remote = Remote {
            name: c.name.clone(),
            client,
        };
        let origin = Origin::Secret {
            name: secret.clone(),
            hash: c.hash,
        };
        let known = super::join::Known {
            cluster_id: Some(id.clone()),
            stale_after: c.stale_after,
            allowed_cidrs: c.allowed_cidrs,
            probe_after: c.probe_after,
            budget: c.budget.over(self.settings.budget),
            allow_external_name: c.allow_external_name,
        };
        let member =
            super::join::join(&self.sup, &self.ctl, &remote, known, origin, &self.settings);
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

    /// Whether the remote a Secret names already runs from this very kubeconfig (true: nothing
    /// to do); an error when the name belongs to another Secret or to the static remote.
    fn unchanged(
        &mut self,
        secret: &str,
        c: &Candidate,
        existing: Option<&Member>,
    ) -> Result<bool, Refused> {
        let Some(m) = existing else {
            return Ok(false);
        };
        match &m.origin {
            Origin::Secret { name, hash } if name == secret => {
                let same = *hash == c.hash;
                if same {
                    self.leaving.remove(&c.name);
                }
                Ok(same)
            }
            Origin::Secret { name, .. } if self.secrets.contains_key(name) => {
                Err(Refused::NamedElsewhere {
                    name: c.name.clone(),
                    secret: name.clone(),
                })
            }
            Origin::Secret { .. } => Ok(false), // its Secret is gone: this one takes over
            Origin::Static => Err(Refused::Static {
                name: c.name.clone(),
            }),
        }
    }

    /// A client of the Secret's cluster and that cluster's id, once it is proven to be neither
    /// the local cluster nor one already read under another name.
    async fn reach(&self, c: &Candidate) -> Result<(Client, String), Refused> {
        let (client, at) = client::secret_remote(c.kubeconfig.clone(), &self.settings.client)
            .await
            .map_err(|source| Refused::Client { source })?;
        if at == self.local_authority {
            return Err(Refused::LocalServer { at });
        }
        // bounded below the API timeout: a Secret whose server hangs must not hold the others long
        let wait = self.settings.api_timeout.min(Duration::from_secs(10));
        let id = client::cluster_id(&client, wait).await?;
        if self.local_id.as_deref() == Some(id.as_str()) {
            return Err(Refused::LocalCluster { id });
        }
        let members = self.ctl.remotes().members();
        let other = members
            .iter()
            .find(|m| m.name().as_ref() != c.name && m.cluster_id.as_deref() == Some(id.as_str()));
        if let Some(other) = other {
            return Err(Refused::AlreadyRead {
                id,
                other: other.name().to_string(),
            });
        }
        Ok((client, id))
    }

    /// A remote stays the cluster it was (by its id, remembered or recorded on its followers):
    /// a Secret that now reaches another cluster is held.
    fn same_cluster(&mut self, name: &str, id: &str) -> Result<(), Refused> {
        if !self.ids.contains_key(name) {
            // a restarted daemon: what the followers record, read once per name
            let recorded = self.recorded_ids(name);
            if let Some(r) = recorded.iter().find(|r| *r != id).or(recorded.first()) {
                self.ids.insert(name.to_string(), r.clone());
            }
        }
        match self.ids.get(name) {
            Some(was) if was != id => Err(Refused::Held {
                name: name.to_string(),
                id: id.to_string(),
                was: was.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The cluster ids the local followers of remote `name` record (a restarted daemon's memory
    /// of which cluster a remote is): on a Service whose fields come from it, and on its slices.
    fn recorded_ids(&self, name: &str) -> BTreeSet<String> {
        let opts = self.settings.opts.for_remote(name, None);
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
            let services = self.ctl.local().services.read();
            services
                .keys()
                .filter_map(|k| services.named(k).ok().flatten())
                .filter_map(|s| of(s.annotations()))
                .collect()
        };
        let slices = self.ctl.local().slices.read();
        for k in slices.keys() {
            for s in slices.group(k).unwrap_or_default() {
                ids.extend(of(s.annotations()));
            }
        }
        ids
    }

    /// A Secret that cannot be used: reported; a remote it named keeps running as it was.
    async fn refused(&self, s: &Secret, why: Refused, first: bool) {
        let source = self.source(&s.name_any());
        if first {
            warn!(secret = %source, "not a usable remote: {why}");
            self.changed("refused");
        }
        self.ctl
            .remotes()
            .set_problem(&source, format!("not a remote: {why}"));
        let reference = s.object_ref(&());
        self.ctl
            .event(
                EventType::Warning,
                "RemoteRefused",
                why.to_string(),
                "Join",
                Some(reference),
            )
            .await;
    }

    /// A Secret deleted: its remote leaves after the grace (unless a Secret names it again).
    fn deleted(&mut self, secret: &str) {
        self.secrets.remove(secret);
        self.failing.remove(secret);
        self.ctl.remotes().clear_problem(&self.source(secret));
        self.count_refused();
        for m in self.ctl.remotes().members() {
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
        if self.ctl.remotes().retire(name).is_none() {
            return;
        }
        self.ids.remove(name);
        self.ctl.metrics().forget_remote(name);
        self.changed("left");
        let followers = self.ctl.remote_left(name);
        info!(remote = %name, followers, "remote left: its watches stopped; what only it exported is deleted, and merged followers lose its slices");
        let note = format!(
            "remote {name} left (its Secret was deleted): {followers} followers record it; what only it exported is deleted, merged followers lose its slices"
        );
        if self.ctl.is_leader() {
            let ctl = Arc::clone(&self.ctl);
            tokio::spawn(async move {
                ctl.event(EventType::Normal, "RemoteLeft", note, "Leave", None)
                    .await;
            });
        }
    }

    fn changed(&self, change: &str) {
        self.ctl
            .metrics()
            .remote_changes
            .get_or_create(&ByChange::new(change))
            .inc();
    }

    fn count_refused(&self) {
        self.ctl
            .metrics()
            .remote_secrets_refused
            .set(self.failing.len() as i64);
    }
}

/// Remotes from the Secrets of the daemon's namespace: joined, rotated and retired at run time.
pub async fn spawn(
    sup: &Supervisor,
    ctl: &Arc<Controller>,
    clients: &Clients,
    sweep_now: &Arc<Notify>,
    settings: (&Settings, &SecretSource),
) {
    let (settings, from) = settings;
    ctl.remotes().set_complete(false);
    // the local cluster's id, so a Secret reaching the local cluster under another address is
    // refused too (without it, only the same address is)
    let local_id = client::cluster_id(&clients.local, settings.api_timeout)
        .await
        .inspect_err(|why| warn!("local cluster id unknown: {why}"))
        .ok();
    let source = Source::new(
        Arc::clone(ctl),
        sup.clone(),
        Arc::new(settings.clone()),
        from.clone(),
        LocalCluster {
            client: clients.local.clone(),
            authority: clients.local_authority.clone(),
            id: local_id,
        },
        Arc::clone(sweep_now),
    );
    sup.spawn_until_shutdown("remote Secrets", source.run());
}
