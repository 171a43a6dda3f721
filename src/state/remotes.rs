//! The remotes the daemon reads, joined and left while it runs. A member owns everything of one
//! remote: its caches ([`RemoteState`]), its client, where it came from, and the cancellation of
//! its watches; it is created and torn down as one, so a remote that leaves leaves nothing
//! behind. Sources that could not become a member (a bad Secret) are kept as problems, shown on
//! /readyz until fixed or deleted.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use parking_lot::RwLock;

use kube::Client;
use tokio_util::sync::CancellationToken;

use super::remote::RemoteState;

/// Where a remote's configuration came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// `--kubeconfig` / `--remote-context`, fixed for the process's life
    Static,
    /// a Secret of the daemon's namespace; `hash` is of its kubeconfig, to tell a rotation
    Secret { name: String, hash: String },
    /// a ClusterProfile of the hub; `hash` is of its access and the credential its plugin gave
    Profile { name: String, hash: String },
}

impl Origin {
    /// The kind of object a remote came from (`Secret`, `ClusterProfile`), its name and the hash
    /// of what it said; None for the static remote.
    pub fn object(&self) -> Option<(&'static str, &str, &str)> {
        match self {
            Origin::Static => None,
            Origin::Secret { name, hash } => Some(("Secret", name, hash)),
            Origin::Profile { name, hash } => Some(("ClusterProfile", name, hash)),
        }
    }
}

/// One remote as the daemon reads it.
pub struct Member {
    pub state: Arc<RemoteState>,
    pub client: Client,
    /// the uid of the remote's kube-system namespace (None for a remote that did not tell it)
    pub cluster_id: Option<String>,
    pub origin: Origin,
    /// cancels this member's watches; a child of the process's shutdown
    pub cancel: CancellationToken,
}

impl Member {
    pub fn name(&self) -> &Arc<str> {
        &self.state.name
    }
}

#[derive(Default)]
pub struct Remotes {
    members: RwLock<BTreeMap<Arc<str>, Arc<Member>>>,
    /// source (e.g. `Secret fair-system/east`) -> why it is not a member
    problems: RwLock<BTreeMap<String, String>>,
    /// remotes removed on purpose (their Secret deleted) since the process started: what a
    /// follower records of them goes, as if each had proven its exported Services absent. A name that
    /// joins again leaves this set.
    retired: RwLock<BTreeSet<String>>,
    /// the MCS names the retired remotes went by (see [`Remotes::retire`])
    retired_mcs: RwLock<BTreeSet<String>>,
    /// per source of remotes (`remote Secrets in fair-system`, say): the names its objects give
    /// their remotes, members or not (one whose server does not answer names a remote all the
    /// same): an MCS name one of them gives is kept for it
    named: RwLock<BTreeMap<String, BTreeSet<String>>>,
    /// the sources of remotes not listed once yet: until each has been, a remote missing from the
    /// registry may only not have joined yet
    unlisted: RwLock<BTreeSet<String>>,
    /// remote -> what the cluster inventory says of it when it is not healthy
    /// (`ControlPlaneHealthy False (Reason): message`): shown, never proof of anything
    reported: RwLock<BTreeMap<String, String>>,
    /// a remote's health changed between renewals (the outage policy or the probe marked or
    /// restored it): the health Leases are written again at once, so `status` shows it now
    health_changed: tokio::sync::Notify,
}

impl Remotes {
    /// Tells the keeper of the health Leases that a remote's health changed.
    pub fn health_changed(&self) {
        self.health_changed.notify_one();
    }

    /// Resolves once a remote's health changed since the last call (or now, if it did).
    pub async fn health_change(&self) {
        self.health_changed.notified().await;
    }

    pub fn get(&self, name: &str) -> Option<Arc<Member>> {
        self.members.read().get(name).cloned()
    }

    /// A member's caches.
    pub fn state(&self, name: &str) -> Option<Arc<RemoteState>> {
        self.get(name).map(|m| Arc::clone(&m.state))
    }

    pub fn members(&self) -> Vec<Arc<Member>> {
        self.members.read().values().cloned().collect()
    }

    pub fn states(&self) -> Vec<Arc<RemoteState>> {
        self.members
            .read()
            .values()
            .map(|m| Arc::clone(&m.state))
            .collect()
    }

    /// Adds a member, or replaces the one of that name (whose watches are cancelled).
    pub fn insert(&self, member: Member) -> Arc<Member> {
        let member = Arc::new(member);
        self.retired.write().remove(member.name().as_ref());
        let old = self
            .members
            .write()
            .insert(Arc::clone(member.name()), Arc::clone(&member));
        if let Some(old) = old {
            old.cancel.cancel();
        }
        member
    }

    /// Removes a member and cancels its watches.
    pub fn remove(&self, name: &str) -> Option<Arc<Member>> {
        let old = self.members.write().remove(name);
        if let Some(m) = &old {
            m.cancel.cancel();
        }
        old
    }

    /// Removes a member that left on purpose: its contributions go.
    pub fn retire(&self, name: &str) -> Option<Arc<Member>> {
        self.retired.write().insert(name.to_string());
        let gone = self.remove(name);
        if let Some(mcs) = gone.as_ref().and_then(|m| m.state.mcs.as_ref()) {
            // its MCS names prove every key gone too
            let mut names: Vec<String> = mcs.former().into_iter().collect();
            names.extend(mcs.name());
            self.retired_mcs.write().extend(names);
        }
        gone
    }

    /// The MCS names of the remotes removed on purpose.
    pub fn retired_mcs(&self) -> BTreeSet<String> {
        self.retired_mcs.read().clone()
    }

    /// The remotes removed on purpose (and not joined again).
    pub fn retired(&self) -> BTreeSet<String> {
        self.retired.read().clone()
    }

    /// Every name the sources of remotes give (the members' and those their objects name), once
    /// every source has been listed; None before.
    pub fn named(&self) -> Option<BTreeSet<String>> {
        if !self.complete() {
            return None;
        }
        let mut all: BTreeSet<String> = self.named.read().values().flatten().cloned().collect();
        all.extend(self.members.read().keys().map(|k| k.to_string()));
        Some(all)
    }

    /// Records the names the objects of one source give their remotes.
    pub fn set_named(&self, source: &str, names: BTreeSet<String>) {
        self.named.write().insert(source.to_string(), names);
    }

    /// Whether every source of remotes has been listed once (see `unlisted`).
    pub fn complete(&self) -> bool {
        self.unlisted.read().is_empty()
    }

    /// A source of remotes that has not been listed yet: until it is, the set is not complete.
    pub fn unlisted(&self, source: &str) {
        self.unlisted.write().insert(source.to_string());
    }

    /// A source of remotes has been listed once.
    pub fn listed(&self, source: &str) {
        self.unlisted.write().remove(source);
    }

    /// Records what the cluster inventory says of a remote (None: nothing wrong).
    pub fn set_reported(&self, remote: &str, what: Option<String>) {
        let mut all = self.reported.write();
        let before = match what {
            Some(w) => all.insert(remote.to_string(), w.clone()) != Some(w),
            None => all.remove(remote).is_some(),
        };
        drop(all);
        if before {
            self.health_changed();
        }
    }

    /// What the cluster inventory says of a remote that is not healthy.
    pub fn reported(&self, remote: &str) -> Option<String> {
        self.reported.read().get(remote).cloned()
    }

    /// Records why a source is not (or no longer) a member.
    pub fn set_problem(&self, source: &str, why: String) {
        self.problems.write().insert(source.to_string(), why);
    }

    pub fn clear_problem(&self, source: &str) {
        self.problems.write().remove(source);
    }

    pub fn problems(&self) -> Vec<(String, String)> {
        self.problems
            .read()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;

    fn member(name: &str, cancel: &CancellationToken) -> Member {
        let (client, _api) = fixtures::client("remote");
        let mut opts = fixtures::opts();
        opts.cluster_name = name.to_string();
        Member {
            state: Arc::new(RemoteState::new(name, opts, vec![])),
            client,
            cluster_id: None,
            origin: Origin::Static,
            cancel: cancel.child_token(),
        }
    }

    #[tokio::test]
    async fn a_replaced_or_removed_member_has_its_watches_cancelled() {
        let root = CancellationToken::new();
        let r = Remotes::default();
        let first = r.insert(member("east", &root));
        let second = r.insert(member("east", &root));
        assert!(first.cancel.is_cancelled(), "replaced");
        assert!(!second.cancel.is_cancelled());
        assert_eq!(r.members().len(), 1);
        let north = r.insert(member("north", &root));
        let gone = r.remove("east").expect("a member");
        assert!(gone.cancel.is_cancelled());
        assert!(r.get("east").is_none());
        assert!(!north.cancel.is_cancelled(), "the others keep running");
        assert_eq!(r.states().len(), 1);
        r.retire("north");
        assert_eq!(r.retired(), BTreeSet::from(["north".to_string()]));
        r.insert(member("north", &root));
        assert!(
            r.retired().is_empty(),
            "a remote that joins again is not retired"
        );
    }

    #[test]
    fn names_are_known_only_once_every_source_has_been_listed() {
        // a remote missing from the registry proves nothing until every source was listed: with
        // Secrets listed and ClusterProfiles not yet, a profile's remote may only not have joined
        let r = Remotes::default();
        r.unlisted("remote Secrets in ns");
        r.unlisted("remote ClusterProfiles in fleet");
        r.set_named("remote Secrets in ns", BTreeSet::from(["east".to_string()]));
        r.listed("remote Secrets in ns");
        assert!(!r.complete());
        assert_eq!(r.named(), None, "not before the profiles are listed");
        r.set_named(
            "remote ClusterProfiles in fleet",
            BTreeSet::from(["north".to_string()]),
        );
        r.listed("remote ClusterProfiles in fleet");
        assert_eq!(
            r.named(),
            Some(BTreeSet::from(["east".to_string(), "north".to_string()])),
            "each source's names, none replacing the other's"
        );
    }

    #[test]
    fn what_the_inventory_says_is_kept_per_remote_and_wakes_the_health_leases_on_a_change() {
        let r = Remotes::default();
        r.set_reported("east", Some("ControlPlaneHealthy False (X): y".into()));
        assert_eq!(
            r.reported("east").as_deref(),
            Some("ControlPlaneHealthy False (X): y")
        );
        r.set_reported("east", None);
        assert_eq!(r.reported("east"), None);
    }

    #[tokio::test]
    async fn problems_are_kept_per_source_until_cleared() {
        let r = Remotes::default();
        r.set_problem("Secret ns/a", "no key kubeconfig".into());
        r.set_problem("Secret ns/b", "malformed".into());
        r.clear_problem("Secret ns/a");
        assert_eq!(
            r.problems(),
            vec![("Secret ns/b".to_string(), "malformed".to_string())]
        );
    }
}
