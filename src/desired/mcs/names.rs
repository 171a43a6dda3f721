//! Which cluster may go by which name in the ClusterSet (issue 27): a name is bound to the
//! cluster that holds it, and a cluster is its identity (the local cluster, or a remote by its
//! name in the set of remotes and its cluster id), never the name it claims. Pure.
//!
//! The rule, applied by [`Holders::settle`] to every cluster's claim (its ClusterProperty
//! `cluster.clusterset.k8s.io`, else its configured name):
//!
//! 1. The local cluster always holds its own name; a remote that held it loses it.
//! 2. A holder keeps its name for as long as it is read here and claims it (a claim not read
//!    yet, as after a Secret rotation or while it is unreachable, is a claim kept): a newcomer
//!    claiming it is refused, and only the newcomer's exports wait.
//! 3. A free name is granted only once every source of remotes has been listed (before that,
//!    its rightful holder may not have joined yet). A free name that is a remote's name in the
//!    set of remotes (the operator's word: a Secret's cluster name or `--cluster-name`, whether
//!    that remote could be reached or not) waits for that remote's own claim, and goes to it
//!    when it claims it too; among other claims of one free name, the remote whose name sorts
//!    first wins. So a restarted daemon grants the name the operator gave a remote to that
//!    remote, whatever order the claims arrive in, even while that remote is down.
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Who a cluster is.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Identity {
    /// the cluster the daemon writes
    Local,
    /// a remote: its name in the set of remotes (which the operator chose, unique there) and the
    /// uid of its kube-system namespace (a remote's name is bound to one cluster id when it
    /// joins)
    Remote { name: String, id: Option<String> },
}

impl Identity {
    pub fn remote(name: &str, id: Option<&str>) -> Self {
        Identity::Remote {
            name: name.to_string(),
            id: id.map(str::to_string),
        }
    }

    /// The name the operator gave it in the set of remotes (None for the local cluster).
    fn registry_name(&self) -> Option<&str> {
        match self {
            Identity::Local => None,
            Identity::Remote { name, .. } => Some(name),
        }
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Local => f.write_str("the local cluster"),
            Identity::Remote { name, id: Some(id) } => write!(f, "remote {name} (cluster id {id})"),
            Identity::Remote { name, id: None } => write!(f, "remote {name}"),
        }
    }
}

/// The name one cluster asks to go by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub who: Identity,
    /// None: not known yet (its ClusterProperty not read)
    pub wants: Option<String>,
}

/// What a cluster may go by now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// not decided yet: its claim is not known, or waits (see the module's rule 3)
    Pending,
    Named(String),
    /// it claims a name another cluster holds: it goes by none, and its exports wait
    Refused {
        wanted: String,
        holder: Identity,
    },
}

impl Grant {
    pub fn name(&self) -> Option<&str> {
        match self {
            Grant::Named(n) => Some(n),
            _ => None,
        }
    }
}

/// Who holds which name, as this daemon has granted them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holders {
    held: BTreeMap<String, Identity>,
}

impl Holders {
    /// The holder of a name.
    pub fn holder(&self, name: &str) -> Option<&Identity> {
        self.held.get(name)
    }

    /// Applies the rule (module comment) to every cluster's claim: the local cluster's and each
    /// remote's read here. `named`: once every source of remotes has been listed (None before),
    /// the names those sources give remotes, read here or not yet (a remote Secret whose server
    /// does not answer names a remote all the same). Returns every claimant's grant.
    pub fn settle(
        &mut self,
        claims: &[Claim],
        named: Option<&BTreeSet<String>>,
    ) -> BTreeMap<Identity, Grant> {
        self.release(claims);
        let local = claims.iter().find(|c| c.who == Identity::Local);
        if let Some(name) = local.and_then(|c| c.wants.clone()) {
            self.held.insert(name, Identity::Local);
        }
        if let Some(named) = named {
            self.grant_free(claims, named);
        }
        claims
            .iter()
            .map(|c| (c.who.clone(), self.grant_of(c)))
            .collect()
    }

    /// Holdings end when the holder is not read here any more, or claims another name.
    fn release(&mut self, claims: &[Claim]) {
        self.held.retain(|name, holder| {
            claims
                .iter()
                .find(|c| c.who == *holder)
                .is_some_and(|c| c.wants.as_ref().is_none_or(|w| w == name))
        });
    }

    /// Each free name claimed goes to one claimant (rule 3).
    fn grant_free(&mut self, claims: &[Claim], named: &BTreeSet<String>) {
        let mut free: BTreeMap<&str, Vec<&Identity>> = BTreeMap::new();
        for c in claims {
            if let Some(w) = c.wants.as_deref()
                && !self.held.contains_key(w)
            {
                free.entry(w).or_default().push(&c.who);
            }
        }
        for (name, mut who) in free {
            // the remote the operator gave this name has not spoken yet (or is not read yet)
            let owner = claims.iter().find(|c| c.who.registry_name() == Some(name));
            let silent = owner.map_or(named.contains(name), |o| o.wants.is_none());
            if silent {
                continue;
            }
            who.sort_by_key(|w| (w.registry_name() != Some(name), *w));
            if let Some(winner) = who.first() {
                self.held.insert(name.to_string(), (*winner).clone());
            }
        }
    }

    fn grant_of(&self, c: &Claim) -> Grant {
        let Some(wants) = &c.wants else {
            // not read yet: what it holds, it keeps
            return match self.held.iter().find(|(_, h)| **h == c.who) {
                Some((name, _)) => Grant::Named(name.clone()),
                None => Grant::Pending,
            };
        };
        match self.held.get(wants) {
            Some(h) if *h == c.who => Grant::Named(wants.clone()),
            Some(h) => Grant::Refused {
                wanted: wants.clone(),
                holder: h.clone(),
            },
            None => Grant::Pending,
        }
    }
}

#[cfg(test)]
mod tests;
