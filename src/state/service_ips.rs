//! The local Service range's addresses our Services hold, by whom they are charged to: kept by
//! the watch of every local Service (`watch::networks`), one entry per Service that holds a
//! ClusterIP, so a pass reads a remote's count in constant time (no scan of the followers).
//!
//! A follower is charged to the remote it records as its origin (`origin-cluster`; a merged
//! follower's origin is the remote whose export won it); an MCS derived Service is charged to
//! no remote but counts in the total of all remotes. A local user's Service is not counted.
//! The decision ([`admit`]) is pure: a new follower that would take a ClusterIP waits while its
//! remote holds its share of the range, or all remotes together hold theirs.
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Service;
use parking_lot::Mutex;

use super::cache::GroupKey;

/// Whom one local Service's ClusterIP is charged to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Holder {
    /// a follower, charged to the remote it records as its origin
    Remote(String),
    /// an MCS derived Service: every remote's together
    Derived,
}

/// The shares of the local Service range remotes may hold (`--remote-max-service-ip-share`,
/// `--remotes-max-service-ip-share`, `--local-service-ips`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shares {
    /// percent of the range one remote may hold (None: no limit)
    pub remote: Option<u8>,
    /// percent of the range all remotes together may hold (None: no limit)
    pub all: Option<u8>,
    /// the range's usable addresses where the local cluster's ServiceCIDRs name none
    pub range: Option<u64>,
}

impl Default for Shares {
    fn default() -> Self {
        Self {
            remote: Some(25),
            all: Some(50),
            range: None,
        }
    }
}

/// A share given on the command line: a percentage, or None (`off`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Share(pub Option<u8>);

/// A share given on the command line: `N%` (1 to 100) or `off`.
pub fn parse_share(text: &str) -> Result<Share, String> {
    if text == "off" {
        return Ok(Share(None));
    }
    match text.strip_suffix('%').map(str::parse::<u8>) {
        Some(Ok(n)) if (1..=100).contains(&n) => Ok(Share(Some(n))),
        _ => Err(format!("{text:?}: a percentage from 1% to 100%, or off")),
    }
}

/// Why a new follower waits.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Limited {
    #[error(
        "its remote holds {held} ClusterIPs of the local Service range, the most it may ({share}% of {range} addresses); the follower is created when one is freed"
    )]
    Remote { held: u64, share: u8, range: u64 },
    #[error(
        "all remotes together hold {held} ClusterIPs of the local Service range (followers and MCS derived Services), the most they may ({share}% of {range} addresses); the follower is created when one is freed"
    )]
    All { held: u64, share: u8, range: u64 },
}

/// The most of `range` a share allows.
pub fn allowance(range: u64, share: u8) -> u64 {
    u64::try_from(u128::from(range) * u128::from(share) / 100).unwrap_or(u64::MAX)
}

/// Pure: whether one more ClusterIP may be taken for a remote that holds `remote` of them while
/// all remotes hold `all`, in a range of `range` usable addresses (None: unknown, no limit).
pub fn admit(range: Option<u64>, shares: Shares, remote: u64, all: u64) -> Result<(), Limited> {
    let Some(range) = range else {
        return Ok(());
    };
    if let Some(share) = shares.remote
        && remote >= allowance(range, share)
    {
        return Err(Limited::Remote {
            held: remote,
            share,
            range,
        });
    }
    if let Some(share) = shares.all
        && all >= allowance(range, share)
    {
        return Err(Limited::All {
            held: all,
            share,
            range,
        });
    }
    Ok(())
}

/// Whether a Service takes a ClusterIP: not headless, not ExternalName.
pub fn takes_cluster_ip(svc: &Service) -> bool {
    let Some(spec) = svc.spec.as_ref() else {
        return true;
    };
    spec.type_.as_deref() != Some("ExternalName") && spec.cluster_ip.as_deref() != Some("None")
}

/// Pure: whom a local Service's ClusterIP is charged to (None: no ClusterIP, or not ours).
pub fn charged_to(svc: &Service, opts: &crate::desired::Options) -> Option<Holder> {
    if !takes_cluster_ip(svc) {
        return None;
    }
    if crate::desired::mcs::derived_is_ours(svc) {
        return Some(Holder::Derived);
    }
    let crate::desired::Recorded::From(set) = crate::desired::recorded(&svc.metadata, opts) else {
        return None;
    };
    let origin = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(&opts.origin_cluster_annotation()))
        .filter(|o| set.contains(*o))
        .or_else(|| set.iter().next())?;
    Some(Holder::Remote(origin.clone()))
}

#[derive(Default)]
struct Tally {
    held: HashMap<String, Holder>,
    /// a listing in progress: replaces `held` when complete
    next: Option<HashMap<String, Holder>>,
    by_remote: HashMap<String, u64>,
    derived: u64,
    /// keys waiting for an address, by remote
    waiting: BTreeMap<String, BTreeSet<GroupKey>>,
}

impl Tally {
    fn count(&mut self, h: &Holder, up: bool) {
        let n = match h {
            Holder::Remote(r) => self.by_remote.entry(r.clone()).or_default(),
            Holder::Derived => &mut self.derived,
        };
        *n = if up { *n + 1 } else { n.saturating_sub(1) };
        if let Holder::Remote(r) = h
            && self.by_remote.get(r) == Some(&0)
        {
            self.by_remote.remove(r);
        }
    }

    /// Sets (or with None removes) the holder of `name`; true when an address was freed.
    fn set(&mut self, name: String, holder: Option<Holder>) -> bool {
        let old = match holder {
            Some(h) => {
                if self.held.get(&name) == Some(&h) {
                    return false;
                }
                self.count(&h, true);
                self.held.insert(name, h)
            }
            None => self.held.remove(&name),
        };
        match old {
            Some(o) => {
                self.count(&o, false);
                true
            }
            None => false,
        }
    }

    fn all(&self) -> u64 {
        self.by_remote.values().sum::<u64>() + self.derived
    }
}

/// The ClusterIPs our Services hold, by holder, and the shares they may hold.
#[derive(Default)]
pub struct ServiceIps {
    pub shares: Shares,
    tally: Mutex<Tally>,
}

impl ServiceIps {
    pub fn new(shares: Shares) -> Self {
        Self {
            shares,
            tally: Mutex::default(),
        }
    }

    /// A listing of every local Service starts.
    pub fn relist(&self) {
        self.tally.lock().next = Some(HashMap::new());
    }

    /// A Service of a listing or a watch event (`namespace/name`), with whom its ClusterIP is
    /// charged to (None: none of ours, or no ClusterIP). True when an address was freed.
    pub fn apply(&self, name: String, holder: Option<Holder>) -> bool {
        let mut t = self.tally.lock();
        if let Some(next) = &mut t.next {
            if let Some(h) = holder {
                next.insert(name, h);
            }
            return false;
        }
        t.set(name, holder)
    }

    /// The listing completed: it replaces what was held (counted again once a listing).
    pub fn listed(&self) -> bool {
        let mut t = self.tally.lock();
        let Some(next) = t.next.take() else {
            return false;
        };
        let before = t.all();
        t.by_remote.clear();
        t.derived = 0;
        for h in next.values() {
            t.count(h, true);
        }
        t.held = next;
        t.all() < before
    }

    /// Pure decision over the tally: takes an address for `name` (charged to `remote`) when
    /// the shares allow, so that passes running side by side cannot all take the last one.
    /// `range`: the usable addresses of the local Service range (None: unknown).
    pub fn reserve(&self, key: &GroupKey, remote: &str, range: Option<u64>) -> Result<(), Limited> {
        let mut t = self.tally.lock();
        let held = t.by_remote.get(remote).copied().unwrap_or(0);
        let name = format!("{}/{}", key.0, key.1);
        if t.held.contains_key(&name) {
            return Ok(());
        }
        if let Err(e) = admit(range.or(self.shares.range), self.shares, held, t.all()) {
            t.waiting
                .entry(remote.to_string())
                .or_default()
                .insert(key.clone());
            return Err(e);
        }
        if let Some(w) = t.waiting.get_mut(remote) {
            w.remove(key);
            if w.is_empty() {
                t.waiting.remove(remote);
            }
        }
        t.set(name, Some(Holder::Remote(remote.to_string())));
        Ok(())
    }

    /// A reservation whose follower was not created after all.
    pub fn release(&self, key: &GroupKey) {
        self.tally.lock().set(format!("{}/{}", key.0, key.1), None);
    }

    /// The keys waiting for an address (to pass again once one is freed).
    pub fn waiting(&self) -> Vec<GroupKey> {
        let t = self.tally.lock();
        t.waiting.values().flatten().cloned().collect()
    }

    /// A pass for `key` begins: it waits no longer, unless this pass finds it must.
    pub fn settled(&self, key: &GroupKey) {
        let mut t = self.tally.lock();
        t.waiting.retain(|_, keys| {
            keys.remove(key);
            !keys.is_empty()
        });
    }

    /// The ClusterIPs a remote's followers hold.
    pub fn held_by(&self, remote: &str) -> u64 {
        self.tally
            .lock()
            .by_remote
            .get(remote)
            .copied()
            .unwrap_or(0)
    }

    /// The ClusterIPs all remotes' Services hold (followers and MCS derived Services).
    pub fn held_by_all(&self) -> u64 {
        self.tally.lock().all()
    }

    /// For /readyz: each remote with followers waiting, with its count, what it holds and what
    /// all remotes hold.
    pub fn limited(&self) -> Vec<(String, usize, u64)> {
        let t = self.tally.lock();
        t.waiting
            .iter()
            .map(|(r, keys)| {
                let held = t.by_remote.get(r).copied().unwrap_or(0);
                (r.clone(), keys.len(), held)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: &str) -> GroupKey {
        ("ns".into(), n.into())
    }

    #[test]
    fn shares_parse_as_a_percentage_or_off() {
        assert_eq!(parse_share("25%"), Ok(Share(Some(25))));
        assert_eq!(parse_share("100%"), Ok(Share(Some(100))));
        assert_eq!(parse_share("off"), Ok(Share(None)));
        for bad in ["0%", "101%", "25", "x%", ""] {
            assert!(parse_share(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_remote_waits_at_its_share_and_all_remotes_at_theirs() {
        let s = Shares::default();
        assert_eq!(allowance(254, 25), 63);
        assert_eq!(admit(Some(254), s, 62, 62), Ok(()));
        assert_eq!(
            admit(Some(254), s, 63, 63),
            Err(Limited::Remote {
                held: 63,
                share: 25,
                range: 254
            })
        );
        // 127 of 254: all remotes at their half, this one below its quarter
        assert!(matches!(
            admit(Some(254), s, 10, 127),
            Err(Limited::All { held: 127, .. })
        ));
        assert_eq!(
            admit(None, s, 1_000_000, 1_000_000),
            Ok(()),
            "range unknown"
        );
        let off = Shares {
            remote: None,
            all: None,
            range: None,
        };
        assert_eq!(admit(Some(254), off, 254, 254), Ok(()));
    }

    #[test]
    fn the_tally_counts_by_holder_reserves_and_frees() {
        let ips = ServiceIps::new(Shares {
            range: Some(8),
            ..Shares::default()
        });
        ips.relist();
        ips.apply("ns/a".into(), Some(Holder::Remote("east".into())));
        ips.apply("ns/mine".into(), None);
        ips.apply("ns/derived-x".into(), Some(Holder::Derived));
        assert_eq!(ips.held_by("east"), 0, "not before the listing completes");
        ips.listed();
        assert_eq!((ips.held_by("east"), ips.held_by_all()), (1, 2));
        // the flag's range (8): east may hold 2, all remotes 4
        assert_eq!(ips.reserve(&key("b"), "east", None), Ok(()));
        assert!(ips.reserve(&key("c"), "east", None).is_err());
        assert_eq!(ips.waiting(), vec![key("c")]);
        assert_eq!(ips.limited(), vec![("east".to_string(), 1, 2)]);
        // the watch event of the created follower changes nothing
        assert!(!ips.apply("ns/b".into(), Some(Holder::Remote("east".into()))));
        // an address freed
        assert!(ips.apply("ns/a".into(), None));
        assert_eq!(ips.reserve(&key("c"), "east", None), Ok(()));
        assert!(ips.waiting().is_empty());
        // a key whose pass finds no new follower to make waits no longer
        assert!(ips.reserve(&key("d"), "east", None).is_err());
        ips.settled(&key("d"));
        assert!(ips.limited().is_empty());
        // the all-remotes share: 4 of 8
        assert_eq!(ips.reserve(&key("w1"), "west", None), Ok(()));
        assert!(matches!(
            ips.reserve(&key("w2"), "west", None),
            Err(Limited::All { held: 4, .. })
        ));
        ips.release(&key("w1"));
        assert_eq!(ips.held_by("west"), 0);
        // a ServiceCIDR's range wins over the flag's
        assert_eq!(ips.reserve(&key("w2"), "west", Some(254)), Ok(()));
    }

    #[test]
    fn headless_and_external_name_take_no_address() {
        let svc = |v: serde_json::Value| -> Service { serde_json::from_value(v).unwrap() };
        assert!(takes_cluster_ip(&svc(
            serde_json::json!({"spec": {"ports": []}})
        )));
        assert!(!takes_cluster_ip(&svc(
            serde_json::json!({"spec": {"clusterIP": "None"}})
        )));
        assert!(!takes_cluster_ip(&svc(
            serde_json::json!({"spec": {"type": "ExternalName", "externalName": "x.example"}})
        )));
    }
}
