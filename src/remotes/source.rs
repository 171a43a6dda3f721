//! A source of remotes, whatever its objects are: each object (a Secret of the daemon's
//! namespace, a ClusterProfile of the hub) names one remote cluster. An object applied joins its
//! remote, a changed access rotates it (new client and watches, same caches' keys: nothing is
//! rewritten), an object deleted makes it leave after the removal grace (its followers are then
//! deleted). An object that cannot be used is reported (log, /readyz, Event, metric) and changes
//! nothing; a remote that was running keeps running. What differs per kind of object (how it is
//! watched, how a candidate is read from it, how it is named in messages) is a [`Kind`].
//!
//! A remote's identity is its cluster id (the uid of its kube-system namespace). An object whose
//! access now reaches another cluster than its remote did is held, not switched: otherwise
//! the other cluster's complete listing would prove every follower of the first "gone".
use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::EventType;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::metrics::gauge::Gauge;
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use super::Settings;
use super::remote_secret::{CLUSTER_ID_KEY, Candidate, NAME_KEY};
use crate::client::{self, ClusterId, ClusterIdError, Remote};
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::{ByChange, ByKindReason, Metrics};
use crate::state::{Member, Origin};

/// How often objects that could not be used (an unreachable server, say) are tried again.
pub const RETRY: Duration = Duration::from_secs(10);

/// Why an object's remote does not join: logged, shown on /readyz, recorded as an Event and
/// counted (by the variant's name, [`Refused::reason`]); a remote that was running keeps running.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum Refused {
    /// The object describes no remote (a Secret: its name, kubeconfig or annotations).
    #[error("{0}")]
    Unreadable(String),
    /// A ClusterProfile gives no access this daemon may use (see `crate::remotes::profiles`).
    #[error(transparent)]
    Access(#[from] super::profiles::access::Refusal),
    /// The credential plugin of a ClusterProfile's provider gave no credential.
    #[error(transparent)]
    Plugin(#[from] super::profiles::exec::PluginError),
    #[error("remote {name:?} is already named by {by}")]
    NamedElsewhere { name: String, by: String },
    #[error("remote {name:?} is already the static remote (--kubeconfig/--remote-context)")]
    Static { name: String },
    /// No client could be built from its kubeconfig (or the kubeconfig policy refused it).
    #[error("{source}")]
    Client { source: crate::error::Error },
    #[error("its server {at} is the local cluster's")]
    LocalServer { at: String },
    #[error(transparent)]
    ClusterId(client::ClusterIdError),
    /// Its server answered with a kube-system uid that is no UUID: never recorded or shown whole.
    #[error(
        "its server's kube-system uid {source}: remote {name:?} refused, nothing of it is read"
    )]
    NotAUuid {
        name: String,
        source: client::NotAUuid,
    },
    /// Its server answers with another cluster id than its object pins.
    #[error(
        "its server answers as cluster {answered}, but its {kind} pins cluster {pinned}: remote {name:?} refused, nothing of it is read ({CLUSTER_ID_KEY}; if the {kind} points at the wrong server, fix its kubeconfig; if the pin is wrong, run remote-access against the cluster again)"
    )]
    PinMismatch {
        name: String,
        kind: &'static str,
        pinned: ClusterId,
        answered: ClusterId,
    },
    /// `--require-cluster-id-pin`, and its object pins no cluster id.
    #[error(
        "its {kind} pins no cluster id and --require-cluster-id-pin is on: remote {name:?} refused (run remote-access against the cluster again, or annotate the {kind} with {CLUSTER_ID_KEY}: the uid of the cluster's kube-system namespace)"
    )]
    Unpinned { name: String, kind: &'static str },
    #[error("it reaches the local cluster (cluster id {id})")]
    LocalCluster { id: String },
    #[error("it reaches cluster {id}, already read as remote {other:?}")]
    AlreadyRead { id: String, other: String },
    #[error(
        "held: it now reaches cluster {id}, but remote {name:?} is cluster {was}; its followers are kept. To read the new cluster, give it another name ({NAME_KEY} on a Secret; another profile); to drop the old one, delete this object"
    )]
    Held {
        name: String,
        id: String,
        was: String,
    },
}

impl Refused {
    /// Every reason [`Refused::reason`] returns: the variants' names.
    pub const REASONS: &'static [&'static str] = <Self as strum::VariantNames>::VARIANTS;

    /// The refusal's category, a metric label: its variant's name (`PinMismatch`, `Held`, ...).
    pub fn reason(&self) -> &'static str {
        self.into()
    }
}

/// Whether an object's refusal is news (logged) and its first (counted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum News {
    First,
    Changed,
    Same,
}

/// What differs between the kinds of objects that name remotes.
pub trait Kind: Send + 'static {
    type Object: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static;
    /// The kind as messages name it (`Secret`, `ClusterProfile`): that of [`Origin::object`].
    const KIND: &'static str;
    /// The objects' API (namespaced) and how they are selected.
    fn api(&self) -> Api<Self::Object>;
    fn selector(&self) -> &str;
    /// Their namespace, for messages.
    fn namespace(&self) -> &str;
    /// The name an object gives its remote, read without I/O (the one it would join as).
    fn remote_name(&self, o: &Self::Object) -> String;
    /// What its remote would be: read, and for a profile its plugin run.
    fn candidate(
        &mut self,
        o: &Self::Object,
    ) -> impl Future<Output = Result<Candidate, Refused>> + Send;
    /// The origin its members record.
    fn origin(&self, object: &str, hash: String) -> Origin;
    /// What an Event about it refers to (None: an object of another cluster).
    fn reference(&self, o: &Self::Object) -> Option<ObjectReference>;
    /// The gauge of its objects that are not a remote now.
    fn refused_gauge(metrics: &Metrics) -> &Gauge;
    /// Objects to read again now (a credential to refresh); an object is forgotten when deleted.
    fn due(&mut self) -> Vec<String> {
        Vec::new()
    }
    fn forget(&mut self, _object: &str) {}
}

/// The local cluster, as a source needs it: a remote must be another cluster.
pub struct LocalCluster {
    /// host:port of its API server
    pub authority: String,
    /// its cluster id, when known
    pub id: Option<String>,
}

/// A source: joins, rotates and retires the remotes its objects name.
pub struct Source<K: Kind> {
    kind: K,
    ctl: Arc<Controller>,
    sup: crate::runtime::supervisor::Supervisor,
    settings: Arc<Settings>,
    removal_grace: Duration,
    local: LocalCluster,
    /// object name -> the object as last seen
    objects: BTreeMap<String, K::Object>,
    /// object names that could not be used -> when they were last tried (again every RETRY),
    /// and why not (a new reason is logged again)
    failing: BTreeMap<String, (Instant, String)>,
    /// remote name -> when it leaves (its object was deleted)
    leaving: BTreeMap<String, Instant>,
    /// remote name -> the cluster id it had (an object reaching another cluster is held)
    ids: BTreeMap<String, String>,
}

impl<K: Kind> Source<K> {
    pub fn new(
        kind: K,
        ctl: Arc<Controller>,
        sup: crate::runtime::supervisor::Supervisor,
        settings: Arc<Settings>,
        removal_grace: Duration,
        local: LocalCluster,
    ) -> Self {
        let ids = ctl
            .remotes()
            .members()
            .iter()
            .filter_map(|m| Some((m.name().to_string(), m.cluster_id.clone()?)))
            .collect();
        ctl.metrics().init_refusals(K::KIND, Refused::REASONS);
        Self {
            kind,
            ctl,
            sup,
            settings,
            removal_grace,
            local,
            objects: BTreeMap::new(),
            failing: BTreeMap::new(),
            leaving: BTreeMap::new(),
            ids,
        }
    }

    /// Follows the objects until shutdown.
    pub async fn run(mut self) {
        // the local followers say which cluster each remote name was: listed first
        let local = std::sync::Arc::clone(self.ctl.local());
        local.readiness().until(|| local.ready()).await;
        let cfg = watcher::Config::default()
            .labels(self.kind.selector())
            .timeout(self.settings.watch_timeout());
        let stream = watcher(self.kind.api(), cfg).default_backoff();
        let mut stream = std::pin::pin!(stream);
        // not ready until the objects have been listed once: remotes may still be missing
        let listing_source = listing_source::<K>(self.kind.namespace());
        let registry = std::sync::Arc::clone(self.ctl.remotes());
        registry.set_problem(&listing_source, "not listed yet".into());
        let mut listed_once = false;
        let mut tick =
            tokio::time::interval(RETRY.min(self.removal_grace).max(Duration::from_secs(1)));
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
                            registry.listed(&listing_source);
                        }
                    }
                    Some(Err(e)) => {
                        let why = crate::error::chain(&e);
                        warn!(error = %why, "watch of {listing_source} failing; retrying");
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
            // a remote joined or left, or the objects were listed: who goes by which MCS name
            let named = self.objects.values().map(|o| self.kind.remote_name(o));
            registry.set_named(&listing_source, named.collect());
            self.ctl.settle_mcs_names().await;
        }
    }

    async fn on_event(&mut self, ev: Event<K::Object>, listing: &mut Option<BTreeSet<String>>) {
        match ev {
            Event::Init => *listing = Some(BTreeSet::new()),
            Event::InitApply(o) => {
                if let Some(seen) = listing.as_mut() {
                    seen.insert(o.name_any());
                }
                self.applied(o).await;
            }
            Event::InitDone => {
                // a complete listing: objects we knew that it lacks were deleted meanwhile
                let seen = listing.take().unwrap_or_default();
                let gone: Vec<String> = self
                    .objects
                    .keys()
                    .filter(|k| !seen.contains(*k))
                    .cloned()
                    .collect();
                for name in gone {
                    self.deleted(&name);
                }
            }
            Event::Apply(o) => self.applied(o).await,
            Event::Delete(o) => self.deleted(&o.name_any()),
        }
    }

    fn source(&self, object: &str) -> String {
        format!("{} {}/{object}", K::KIND, self.kind.namespace())
    }

    async fn applied(&mut self, o: K::Object) {
        let name = o.name_any();
        self.objects.insert(name.clone(), o.clone());
        match self.evaluate(&o).await {
            Ok(()) => {
                self.failing.remove(&name);
                self.count_refused();
                self.ctl.remotes().clear_problem(&self.source(&name));
            }
            Err(why) => {
                let said = why.to_string();
                let was = self
                    .failing
                    .insert(name.clone(), (Instant::now(), said.clone()));
                let news = match &was {
                    None => News::First,
                    Some((_, before)) if *before != said => News::Changed,
                    Some(_) => News::Same,
                };
                // the gauge first: whoever sees the problem on /readyz sees it counted
                self.count_refused();
                self.refused(&o, why, news).await;
            }
        }
    }

    /// Joins, rotates or leaves alone the remote an object names.
    async fn evaluate(&mut self, o: &K::Object) -> Result<(), Refused> {
        let object = o.name_any();
        let c = self.kind.candidate(o).await?;
        if self.settings.require_cluster_id_pin && c.cluster_id.is_none() {
            return Err(Refused::Unpinned {
                name: c.name.clone(),
                kind: K::KIND,
            });
        }
        let existing = self.ctl.remotes().get(&c.name);
        if self.unchanged(&object, &c, existing.as_deref())? {
            return Ok(());
        }
        let credential = c.credential.clone().unwrap_or_else(|| {
            crate::remotes::credentials::user_of(&c.kubeconfig)
                .map(crate::remotes::credentials::credential)
                .unwrap_or_default()
        });
        let (client, id) = self.reach(&c).await?;
        let id = id.into_string();
        self.same_cluster(&c.name, &id)?;
        let remote = Remote {
            name: c.name.clone(),
            client,
        };
        let origin = self.kind.origin(&object, c.hash.clone());
        let known = super::join::Known {
            cluster_id: Some(id.clone()),
            stale_after: c.stale_after,
            allowed_cidrs: c.allowed_cidrs.clone(),
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
        info!(remote = %c.name, from = %self.source(&object), cluster_id = %id, "remote {change}");
        Ok(())
    }

    /// Whether the remote an object names already runs from this very access (true: nothing
    /// to do); an error when the name belongs to another object or to the static remote.
    fn unchanged(
        &mut self,
        object: &str,
        c: &Candidate,
        existing: Option<&Member>,
    ) -> Result<bool, Refused> {
        let Some(m) = existing else {
            return Ok(false);
        };
        let Some((kind, name, hash)) = m.origin.object() else {
            return Err(Refused::Static {
                name: c.name.clone(),
            });
        };
        if kind != K::KIND {
            // another source's remote: it keeps its name until it leaves
            return Err(Refused::NamedElsewhere {
                name: c.name.clone(),
                by: format!("{kind} {name}"),
            });
        }
        if name == object {
            let same = hash == c.hash;
            if same {
                self.leaving.remove(&c.name);
            }
            return Ok(same);
        }
        if self.objects.contains_key(name) {
            return Err(Refused::NamedElsewhere {
                name: c.name.clone(),
                by: self.source(name),
            });
        }
        Ok(false) // its object is gone: this one takes over
    }

    /// A client of the candidate's cluster and that cluster's id, once it is proven to be a
    /// UUID, the one its object pins (if it pins one), and neither the local cluster nor one
    /// already read under another name.
    async fn reach(&self, c: &Candidate) -> Result<(Client, ClusterId), Refused> {
        let (client, at) = client::secret_remote(c.kubeconfig.clone(), &self.settings.client)
            .await
            .map_err(|source| Refused::Client { source })?;
        if at == self.local.authority {
            return Err(Refused::LocalServer { at });
        }
        // bounded below the API timeout: an object whose server hangs must not hold the others long
        let wait = self.settings.api_timeout.min(Duration::from_secs(10));
        let id = client::cluster_id(&client, wait)
            .await
            .map_err(|e| match e {
                ClusterIdError::NotAUuid(source) => Refused::NotAUuid {
                    name: c.name.clone(),
                    source,
                },
                other => Refused::ClusterId(other),
            })?;
        pinned(c, K::KIND, &id)?;
        if self.local.id.as_deref() == Some(id.as_str()) {
            return Err(Refused::LocalCluster {
                id: id.into_string(),
            });
        }
        let members = self.ctl.remotes().members();
        let other = members
            .iter()
            .find(|m| m.name().as_ref() != c.name && m.cluster_id.as_deref() == Some(id.as_str()));
        if let Some(other) = other {
            return Err(Refused::AlreadyRead {
                id: id.into_string(),
                other: other.name().to_string(),
            });
        }
        Ok((client, id))
    }
    /// A remote stays the cluster it was (by its id, remembered or recorded on its followers):
    /// an object that now reaches another cluster is held.
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
        // only a UUID: what an earlier version recorded of a hostile remote is no identity
        let of = |a: &BTreeMap<String, String>| {
            (a.get(&origin).map(String::as_str) == Some(name))
                .then(|| a.get(&id_key))
                .flatten()
                .filter(|id| ClusterId::parse(id).is_ok())
                .cloned()
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

    /// An object that cannot be used: reported; a remote it named keeps running as it was.
    async fn refused(&self, o: &K::Object, why: Refused, news: News) {
        let source = self.source(&o.name_any());
        if news != News::Same {
            warn!(from = %source, "not a usable remote: {why}");
        }
        if news == News::First {
            self.changed("refused");
        }
        if news != News::Same {
            self.ctl
                .metrics()
                .remote_refusals
                .get_or_create(&ByKindReason::new(K::KIND, why.reason()))
                .inc();
        }
        self.ctl
            .remotes()
            .set_problem(&source, format!("not a remote: {why}"));
        let (note, reference) = match self.kind.reference(o) {
            Some(r) => (why.to_string(), Some(r)),
            // an object of another cluster: the Event names it
            None => (format!("{source}: {why}"), None),
        };
        self.ctl
            .event(EventType::Warning, "RemoteRefused", note, "Join", reference)
            .await;
    }

    /// An object deleted: its remote leaves after the grace (unless an object names it again).
    fn deleted(&mut self, object: &str) {
        self.objects.remove(object);
        self.failing.remove(object);
        self.kind.forget(object);
        self.ctl.remotes().clear_problem(&self.source(object));
        self.count_refused();
        for m in self.ctl.remotes().members() {
            let ours = matches!(m.origin.object(), Some((kind, name, _)) if kind == K::KIND && name == object);
            if ours {
                let at = Instant::now() + self.removal_grace;
                info!(
                    remote = %m.name(), from = %self.source(object), grace_s = self.removal_grace.as_secs(),
                    "remote {} deleted: once the grace has passed the remote leaves, what only it exported is deleted, and merged followers lose its slices", K::KIND
                );
                self.leaving.insert(m.name().to_string(), at);
            }
        }
    }

    async fn on_tick(&mut self) {
        // what failed, once RETRY has passed since it was tried (a plugin that hangs holds the
        // source for its time limit: not at every tick), and what is due for a refresh
        let now = Instant::now();
        let mut again: BTreeSet<String> = self
            .failing
            .iter()
            .filter(|(_, (tried, _))| now.duration_since(*tried) >= RETRY)
            .map(|(n, _)| n.clone())
            .collect();
        again.extend(self.kind.due());
        let retry: Vec<K::Object> = again
            .iter()
            .filter_map(|n| self.objects.get(n).cloned())
            .collect();
        for o in retry {
            self.applied(o).await;
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
            "remote {name} left (its {} was deleted): {followers} followers record it; what only it exported is deleted, merged followers lose its slices",
            K::KIND
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
        K::refused_gauge(self.ctl.metrics()).set(self.failing.len() as i64);
    }
}

/// Pure: whether the cluster `answered` is the one the candidate's object pins (`kind`: the
/// object's, for the message); an object without a pin takes any cluster.
pub fn pinned(c: &Candidate, kind: &'static str, answered: &ClusterId) -> Result<(), Refused> {
    match &c.cluster_id {
        Some(pin) if pin != answered => Err(Refused::PinMismatch {
            name: c.name.clone(),
            kind,
            pinned: pin.clone(),
            answered: answered.clone(),
        }),
        _ => Ok(()),
    }
}

/// A source as /readyz and the registry name it (`remote Secrets in fair-system`).
pub fn listing_source<K: Kind>(namespace: &str) -> String {
    format!("remote {}s in {namespace}", K::KIND)
}

/// The local cluster's id, so an object reaching the local cluster under another address is
/// refused too (without it, only the same address is).
pub async fn local_cluster(clients: &crate::client::Clients, settings: &Settings) -> LocalCluster {
    let id = client::cluster_id(&clients.local, settings.api_timeout)
        .await
        .inspect_err(|why| warn!("local cluster id unknown: {why}"))
        .ok()
        .map(ClusterId::into_string);
    LocalCluster {
        authority: clients.local_authority.clone(),
        id,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remotes::remote_secret::Policy;

    const EAST: &str = "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7c";
    const SOUTH: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d";

    fn candidate(pin: Option<&str>) -> Candidate {
        let policy = Policy {
            cluster_id: pin.map(|p| ClusterId::parse(p).unwrap()),
            ..Policy::default()
        };
        policy.candidate("east".into(), kube::config::Kubeconfig::default(), "kc")
    }

    fn id(s: &str) -> ClusterId {
        ClusterId::parse(s).unwrap()
    }

    #[test]
    fn a_pinned_object_takes_only_its_cluster_and_the_refusal_names_both() {
        assert!(pinned(&candidate(Some(EAST)), "Secret", &id(EAST)).is_ok());
        let why = pinned(&candidate(Some(EAST)), "Secret", &id(SOUTH)).unwrap_err();
        assert_eq!(why.reason(), "PinMismatch");
        let said = why.to_string();
        for part in [
            "remote \"east\"",
            EAST,
            SOUTH,
            "Secret pins",
            CLUSTER_ID_KEY,
        ] {
            assert!(said.contains(part), "{part:?} in {said}");
        }
        // the pin in upper case is the same pin
        let upper = EAST.to_ascii_uppercase();
        assert!(pinned(&candidate(Some(&upper)), "Secret", &id(EAST)).is_ok());
    }

    #[test]
    fn an_object_without_a_pin_takes_any_cluster_as_before() {
        assert!(pinned(&candidate(None), "ClusterProfile", &id(SOUTH)).is_ok());
    }

    #[test]
    fn every_refusal_has_a_reason_among_the_published_ones() {
        let refusals = [
            Refused::PinMismatch {
                name: "e".into(),
                kind: "Secret",
                pinned: id(EAST),
                answered: id(SOUTH),
            },
            Refused::Unpinned {
                name: "e".into(),
                kind: "ClusterProfile",
            },
            Refused::NotAUuid {
                name: "e".into(),
                source: ClusterId::parse("east").unwrap_err(),
            },
            Refused::Held {
                name: "e".into(),
                id: EAST.into(),
                was: SOUTH.into(),
            },
        ];
        for r in &refusals {
            assert!(Refused::REASONS.contains(&r.reason()), "{}", r.reason());
        }
        assert!(Refused::REASONS.contains(&"AlreadyRead"));
        let unpinned = refusals[1].to_string();
        assert!(unpinned.contains("--require-cluster-id-pin"), "{unpinned}");
        let not_uuid = refusals[2].to_string();
        assert!(
            not_uuid.contains("\"east\" (4 bytes) is not a UUID"),
            "{not_uuid}"
        );
    }
}
