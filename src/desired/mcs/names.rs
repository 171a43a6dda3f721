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
mod tests {
    use super::*;

    fn remote(name: &str) -> Identity {
        Identity::remote(name, Some(&format!("id-{name}")))
    }

    fn claim(who: &Identity, wants: Option<&str>) -> Claim {
        Claim {
            who: who.clone(),
            wants: wants.map(str::to_string),
        }
    }

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn named(n: &str) -> Grant {
        Grant::Named(n.into())
    }

    fn refused(n: &str, holder: &Identity) -> Grant {
        Grant::Refused {
            wanted: n.into(),
            holder: holder.clone(),
        }
    }

    #[test]
    fn a_newcomer_claiming_a_held_name_is_refused_and_the_holder_keeps_it() {
        let (east, north) = (remote("east"), remote("north"));
        let mut h = Holders::default();
        let g = h.settle(
            &[claim(&east, Some("east")), claim(&north, Some("north"))],
            Some(&none()),
        );
        assert_eq!(g[&east], named("east"));
        assert_eq!(g[&north], named("north"));
        // north now claims east's name
        let claims = [claim(&east, Some("east")), claim(&north, Some("east"))];
        let g = h.settle(&claims, Some(&none()));
        assert_eq!(g[&east], named("east"), "the holder keeps it");
        assert_eq!(g[&north], refused("east", &east));
        // east unreachable: its claim is not read again, and it keeps its name
        let g = h.settle(
            &[claim(&east, None), claim(&north, Some("east"))],
            Some(&none()),
        );
        assert_eq!(g[&east], named("east"));
        assert_eq!(g[&north], refused("east", &east));
        // north withdraws: its own name again
        let g = h.settle(
            &[claim(&east, None), claim(&north, Some("north"))],
            Some(&none()),
        );
        assert_eq!(g[&north], named("north"));
        assert_eq!(h.holder("east"), Some(&east));
    }

    #[test]
    fn the_local_cluster_always_holds_its_own_name() {
        let east = remote("east");
        let mut h = Holders::default();
        let g = h.settle(
            &[
                claim(&Identity::Local, Some("west")),
                claim(&east, Some("west")),
            ],
            Some(&none()),
        );
        assert_eq!(g[&Identity::Local], named("west"));
        assert_eq!(g[&east], refused("west", &Identity::Local));
        // the local cluster renames itself to a name a remote holds: the remote loses it
        let mut h = Holders::default();
        h.settle(
            &[
                claim(&Identity::Local, Some("west")),
                claim(&east, Some("east")),
            ],
            Some(&none()),
        );
        let g = h.settle(
            &[
                claim(&Identity::Local, Some("east")),
                claim(&east, Some("east")),
            ],
            Some(&none()),
        );
        assert_eq!(g[&Identity::Local], named("east"));
        assert_eq!(g[&east], refused("east", &Identity::Local));
    }

    #[test]
    fn a_name_given_by_the_operator_waits_for_its_remote_and_goes_to_it() {
        let (east, north) = (remote("east"), remote("north"));
        let mut h = Holders::default();
        // a restart: north's claim of east's name is read before east's own
        let g = h.settle(
            &[claim(&east, None), claim(&north, Some("east"))],
            Some(&none()),
        );
        assert_eq!(g[&north], Grant::Pending, "waits for east's word");
        assert_eq!(g[&east], Grant::Pending);
        let g = h.settle(
            &[claim(&east, Some("east")), claim(&north, Some("east"))],
            Some(&none()),
        );
        assert_eq!(g[&east], named("east"));
        assert_eq!(g[&north], refused("east", &east));
    }

    #[test]
    fn nothing_is_granted_before_every_source_of_remotes_is_listed() {
        let north = remote("north");
        let mut h = Holders::default();
        let claims = [
            claim(&Identity::Local, Some("west")),
            claim(&north, Some("east")),
        ];
        let g = h.settle(&claims, None);
        assert_eq!(
            g[&Identity::Local],
            named("west"),
            "the local name needs no one"
        );
        assert_eq!(g[&north], Grant::Pending);
        // the Secrets listed: east is not among them, so its name is free
        let g = h.settle(&claims, Some(&none()));
        assert_eq!(g[&north], named("east"));
    }

    #[test]
    fn a_name_a_remote_secret_gives_waits_while_that_remote_cannot_be_read() {
        let north = remote("north");
        let mut h = Holders::default();
        // east's Secret is listed, but its server does not answer: east is not read here
        let named = BTreeSet::from(["east".to_string(), "north".to_string()]);
        let g = h.settle(&[claim(&north, Some("east"))], Some(&named));
        assert_eq!(g[&north], Grant::Pending);
        let g = h.settle(&[claim(&north, Some("north"))], Some(&named));
        assert_eq!(g[&north], Grant::Named("north".into()));
    }

    #[test]
    fn among_newcomers_the_operators_name_then_the_first_remote_name_wins() {
        let (a, b, c) = (remote("a"), remote("b"), remote("c"));
        let mut h = Holders::default();
        let g = h.settle(
            &[claim(&c, Some("shared")), claim(&b, Some("shared"))],
            Some(&none()),
        );
        assert_eq!(g[&b], named("shared"));
        assert_eq!(g[&c], refused("shared", &b));
        let mut h = Holders::default();
        let g = h.settle(&[claim(&a, Some("c")), claim(&c, Some("c"))], Some(&none()));
        assert_eq!(g[&c], named("c"), "c's own name, though a sorts first");
        assert_eq!(g[&a], refused("c", &c));
    }

    #[test]
    fn a_holder_that_leaves_or_renames_frees_its_name() {
        let (east, north) = (remote("east"), remote("north"));
        let mut h = Holders::default();
        h.settle(
            &[claim(&east, Some("east")), claim(&north, Some("east"))],
            Some(&none()),
        );
        // east goes by another name: the name is free, and north's claim gets it
        let g = h.settle(
            &[claim(&east, Some("cluster-e")), claim(&north, Some("east"))],
            Some(&none()),
        );
        assert_eq!(g[&east], named("cluster-e"));
        assert_eq!(g[&north], named("east"));
        // north leaves: its name is free
        h.settle(&[claim(&east, Some("cluster-e"))], Some(&none()));
        assert_eq!(h.holder("east"), None);
    }

    #[test]
    fn another_cluster_behind_the_same_remote_name_is_another_identity() {
        let (was, now) = (
            Identity::remote("east", Some("uid-1")),
            Identity::remote("east", Some("uid-2")),
        );
        assert_ne!(was, now);
        let mut h = Holders::default();
        h.settle(&[claim(&was, Some("east"))], Some(&none()));
        let g = h.settle(&[claim(&now, Some("east"))], Some(&none()));
        assert_eq!(g[&now], named("east"), "the first one is not read any more");
        assert_eq!(
            now.to_string(),
            "remote east (cluster id uid-2)",
            "how a refusal names it"
        );
    }
}
