//! Delete only with proof: the one rule by which the reconcile pass and the sweeper decide that
//! a follower (or one of its slices) may go. Pure.
//!
//! Each remote gives its evidence about one key: its complete listing (the watch cache in a
//! pass, a fresh listing in a sweep) has the exported Service, or lacks it; or it has no
//! complete listing and proves nothing. A remote removed on purpose (its Secret deleted)
//! proves every key gone. An object of ours answers to the remotes it records (one left by the
//! Go controller records none and answers to every remote read here); an object that records
//! no remote this daemon knows belongs to another instance and is never touched.
use std::collections::{BTreeMap, BTreeSet};

use crate::desired::Recorded;
use crate::state::cache::GroupKey;

/// What one remote proves about one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// its complete listing has the exported Service
    Exports,
    /// its complete listing lacks it, or the remote was removed on purpose
    Gone,
    /// no complete listing (not synced, failing, or the listing failed): proves nothing
    Unknown,
}

impl Evidence {
    /// The evidence of two that answer under one name: `Unknown` over `Exports` over `Gone`
    /// (a name is proven gone only when every one of them proves it).
    pub fn join(self, other: Evidence) -> Evidence {
        use Evidence::*;
        match (self, other) {
            (Unknown, _) | (_, Unknown) => Unknown,
            (Exports, _) | (_, Exports) => Exports,
            (Gone, Gone) => Gone,
        }
    }
}

/// The evidence of every remote this daemon knows, about one key.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Proof {
    evidence: BTreeMap<String, Evidence>,
}

impl Proof {
    /// From the evidence of the remotes read and the names of the remotes removed on purpose.
    /// Where several give evidence under one name (an MCS name a cluster holds and others held
    /// before), they are joined by [`Evidence::join`]: one that proves nothing makes the name
    /// prove nothing, and one that exports it keeps it; never the last one wins.
    pub fn new<'a>(
        read: impl IntoIterator<Item = (String, Evidence)>,
        retired: impl IntoIterator<Item = &'a String>,
    ) -> Self {
        let mut evidence: BTreeMap<String, Evidence> = BTreeMap::new();
        let retired = retired.into_iter().map(|n| (n.clone(), Evidence::Gone));
        for (name, e) in read.into_iter().chain(retired) {
            evidence
                .entry(name)
                .and_modify(|was| *was = was.join(e))
                .or_insert(e);
        }
        Self { evidence }
    }

    /// What `remote` proves (None: a remote this daemon does not know).
    pub fn of(&self, remote: &str) -> Option<Evidence> {
        self.evidence.get(remote).copied()
    }

    /// A remote whose exported Service cannot be mirrored now: what it gave is kept exactly as
    /// it is, as if it proved nothing.
    pub fn hold(&mut self, remote: &str) {
        if let Some(e) = self.evidence.get_mut(remote) {
            *e = Evidence::Unknown;
        }
    }

    /// Whether an object is ours to act on (it answers to a remote this daemon knows).
    pub fn owns(&self, r: &Recorded) -> bool {
        self.answers_to(r).is_some()
    }

    /// Whether a remote's complete listing has the key.
    pub fn exported(&self) -> bool {
        self.evidence.values().any(|e| *e == Evidence::Exports)
    }

    /// The remotes an object answers to; None when it is not ours, or records only remotes this
    /// daemon does not know (another instance's).
    pub fn answers_to(&self, r: &Recorded) -> Option<BTreeSet<String>> {
        match r {
            Recorded::NotOurs => None,
            Recorded::GoEra => Some(self.evidence.keys().cloned().collect()),
            Recorded::From(set) => set
                .iter()
                .any(|c| self.evidence.contains_key(c))
                .then(|| set.clone()),
        }
    }

    /// Every one of `remotes` proves the key gone (none: nothing is proven).
    pub fn all_gone(&self, remotes: &BTreeSet<String>) -> bool {
        !remotes.is_empty() && remotes.iter().all(|r| self.of(r) == Some(Evidence::Gone))
    }

    /// Every one of `remotes` is known and has a complete listing: what the object carries of
    /// them may be rewritten.
    pub fn all_listed(&self, remotes: &BTreeSet<String>) -> bool {
        !remotes.is_empty()
            && remotes
                .iter()
                .all(|r| matches!(self.of(r), Some(Evidence::Exports | Evidence::Gone)))
    }

    /// A slice of ours that may be updated or deleted: every remote it answers to has a
    /// complete listing.
    pub fn may_change_slice(&self, r: &Recorded) -> bool {
        self.answers_to(r).is_some_and(|set| self.all_listed(&set))
    }

    /// A slice of ours that may be deleted: every remote it answers to proves its key gone.
    pub fn slice_may_go(&self, r: &Recorded) -> bool {
        self.answers_to(r).is_some_and(|set| self.all_gone(&set))
    }

    /// A follower Service (or its Endpoints) that may be deleted: no remote exports the key, and
    /// every remote it answers to, and every remote its slices record, proves it gone (a slice
    /// of a remote not read here would otherwise be collected with its Service).
    pub fn service_may_go<'a>(
        &self,
        r: &Recorded,
        slices: impl IntoIterator<Item = &'a Recorded>,
    ) -> bool {
        let Some(mut remotes) = self.answers_to(r) else {
            return false;
        };
        for s in slices {
            if let Recorded::From(set) = s {
                remotes.extend(set.iter().cloned());
            }
        }
        !self.exported() && self.all_gone(&remotes)
    }
}

/// The keys of local followers that record `remote` (one that left: each is passed again,
/// and what only it exported goes).
pub fn recording(
    services: &[(GroupKey, Recorded)],
    slices: &[(GroupKey, Recorded)],
    remote: &str,
) -> Vec<GroupKey> {
    let mut keys: BTreeSet<GroupKey> = BTreeSet::new();
    for (g, r) in services.iter().chain(slices) {
        if r.names(remote) {
            keys.insert(g.clone());
        }
    }
    keys.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(names: &[&str]) -> Recorded {
        Recorded::From(names.iter().map(|n| n.to_string()).collect())
    }

    fn proof(read: &[(&str, Evidence)], retired: &[&str]) -> Proof {
        let retired: Vec<String> = retired.iter().map(|n| n.to_string()).collect();
        Proof::new(read.iter().map(|(n, e)| (n.to_string(), *e)), &retired)
    }

    #[test]
    fn evidence_under_one_name_is_joined_never_overwritten() {
        use Evidence::*;
        for order in [[Unknown, Gone], [Gone, Unknown]] {
            let p = proof(&[("east", order[0]), ("east", order[1])], &[]);
            assert_eq!(p.of("east"), Some(Unknown), "{order:?}");
            assert!(!p.slice_may_go(&from(&["east"])));
            assert!(!p.may_change_slice(&from(&["east"])));
        }
        let p = proof(&[("east", Gone), ("east", Exports)], &[]);
        assert_eq!(p.of("east"), Some(Exports));
        let p = proof(&[("east", Unknown)], &["east"]);
        assert_eq!(
            p.of("east"),
            Some(Unknown),
            "retired, but read now and unknown"
        );
        let p = proof(&[("east", Gone), ("east", Gone)], &[]);
        assert!(p.slice_may_go(&from(&["east"])));
    }

    #[test]
    fn an_object_that_is_not_ours_or_of_another_instance_answers_to_no_one() {
        let p = proof(&[("east", Evidence::Gone)], &[]);
        assert_eq!(p.answers_to(&Recorded::NotOurs), None);
        assert_eq!(
            p.answers_to(&from(&["north"])),
            None,
            "north is not read here"
        );
        assert!(!p.slice_may_go(&from(&["north"])));
        assert!(!p.service_may_go(&from(&["north"]), []));
    }

    #[test]
    fn a_service_goes_only_when_every_remote_it_or_its_slices_record_proves_it_gone() {
        use Evidence::*;
        let gone = proof(&[("east", Gone), ("north", Gone)], &[]);
        assert!(gone.service_may_go(&from(&["east", "north"]), []));
        let unknown = proof(&[("east", Gone), ("north", Unknown)], &[]);
        assert!(!unknown.service_may_go(&from(&["east", "north"]), []));
        assert!(
            !gone.service_may_go(&from(&["east"]), [&from(&["west"])]),
            "a slice of a remote not read here keeps its Service"
        );
        let exported = proof(&[("east", Gone), ("north", Exports)], &[]);
        assert!(!exported.service_may_go(&from(&["east"]), []));
        let retired = proof(&[("north", Gone)], &["east"]);
        assert!(retired.service_may_go(&from(&["east", "north"]), []));
    }

    #[test]
    fn a_go_era_object_answers_to_every_remote_read() {
        use Evidence::*;
        let p = proof(&[("east", Gone), ("north", Unknown)], &[]);
        assert!(!p.service_may_go(&Recorded::GoEra, []));
        assert!(!p.slice_may_go(&Recorded::GoEra));
        let p = proof(&[("east", Gone), ("north", Gone)], &[]);
        assert!(p.service_may_go(&Recorded::GoEra, []));
        assert!(
            !proof(&[], &[]).service_may_go(&Recorded::GoEra, []),
            "no remote proves nothing"
        );
    }

    #[test]
    fn a_slice_changes_while_its_remote_is_listed_and_goes_on_its_own_proof() {
        use Evidence::*;
        let p = proof(
            &[("east", Exports), ("north", Gone), ("west", Unknown)],
            &[],
        );
        assert!(p.may_change_slice(&from(&["east"])));
        assert!(!p.slice_may_go(&from(&["east"])));
        assert!(p.slice_may_go(&from(&["north"])));
        assert!(
            !p.may_change_slice(&from(&["west"])),
            "unknown: kept as it is"
        );
    }
}
