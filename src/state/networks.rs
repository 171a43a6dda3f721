//! The local cluster's own networks, as the local watches have seen them: its nodes' addresses
//! and pod CIDRs, its ServiceCIDRs, its API server's endpoints, its Services' external and
//! load-balancer IPs, the pod pools its CNI publishes (Calico's IPPools, Cilium's CiliumNodes),
//! and what the operator named (`--local-cidrs`, `--local-pod-cidrs`). No remote may contribute an address in them (see `desired::addresses`).
//! The nodes also give the zones the local cluster's clients are in (see
//! `desired::mcs::localize`).
//!
//! Each part is replaced whole by a complete listing and kept by watch events after it; until
//! every part has been listed once, the set is not ready and no pass admits anything.
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use parking_lot::RwLock;
use tokio::sync::watch;

use super::ready::Flag;
use crate::desired::addresses::{LocalNetworks, Refusal};

/// One source of local networks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Part {
    Nodes,
    ServiceCidrs,
    ApiServer,
    /// every local Service's `externalIPs` and load-balancer ingress IPs
    Services,
    /// Calico's IPPools (`crd.projectcalico.org/v1`), where Calico runs
    CalicoPools,
    /// Cilium's CiliumNodes (`cilium.io/v2`), where Cilium runs
    CiliumNodes,
}

impl Part {
    pub const ALL: [Part; 6] = [
        Part::Nodes,
        Part::ServiceCidrs,
        Part::ApiServer,
        Part::Services,
        Part::CalicoPools,
        Part::CiliumNodes,
    ];

    pub fn what(self) -> &'static str {
        match self {
            Part::Nodes => "Nodes",
            Part::ServiceCidrs => "ServiceCIDRs",
            Part::ApiServer => "the API server's EndpointSlices",
            Part::Services => "Services",
            Part::CalicoPools => "Calico IPPools",
            Part::CiliumNodes => "CiliumNodes",
        }
    }
}

/// What one object (a Node, a ServiceCIDR, an EndpointSlice) says of the local networks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Entry {
    pub addresses: Vec<(IpAddr, Refusal)>,
    pub nets: Vec<(IpNet, Refusal)>,
    /// a node's zone (`topology.kubernetes.io/zone`)
    pub zone: Option<String>,
}

impl Entry {
    /// Says nothing: not kept (most Services have no external IP).
    fn is_empty(&self) -> bool {
        self.addresses.is_empty() && self.nets.is_empty() && self.zone.is_none()
    }
}

#[derive(Default)]
struct Listing {
    objects: BTreeMap<String, Entry>,
    listed: bool,
    /// a relist in progress: replaces `objects` when it completes
    next: Option<BTreeMap<String, Entry>>,
    /// why it is not listed (for /readyz)
    problem: Option<String>,
}

/// The local networks and the parts they are made of.
pub struct Networks {
    /// what the operator named, with what it is (`--local-cidrs`, `--local-pod-cidrs`)
    configured: Vec<(IpNet, Refusal)>,
    parts: RwLock<BTreeMap<Part, Listing>>,
    current: RwLock<Arc<LocalNetworks>>,
    /// the zones of the nodes
    zones: RwLock<Arc<BTreeSet<String>>>,
    /// set once every part has been listed
    ready: Flag,
}

impl Networks {
    /// `configured`: the networks the operator named local, each with what it is
    /// (`--local-cidrs`: [`Refusal::LocalConfigured`], `--local-pod-cidrs`:
    /// [`Refusal::LocalPodNetwork`]).
    pub fn new(configured: Vec<(IpNet, Refusal)>) -> Self {
        let parts = Part::ALL.map(|p| (p, Listing::default())).into();
        let n = Self {
            configured,
            parts: RwLock::new(parts),
            current: RwLock::new(Arc::default()),
            zones: RwLock::new(Arc::default()),
            ready: Flag::default(),
        };
        n.rebuild();
        n
    }

    /// Whether every part has been listed once.
    pub fn ready(&self) -> bool {
        self.parts.read().values().all(|l| l.listed)
    }

    /// Follows [`Networks::ready`].
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.watch()
    }

    /// Why not ready (None when ready).
    pub fn problem(&self) -> Option<String> {
        let parts = self.parts.read();
        let waiting: Vec<String> = parts
            .iter()
            .filter(|(_, l)| !l.listed)
            .map(|(p, l)| match &l.problem {
                Some(why) => format!("{}: {why}", p.what()),
                None => format!("{}: not listed yet", p.what()),
            })
            .collect();
        (!waiting.is_empty()).then(|| waiting.join("; "))
    }

    /// The networks as they are now.
    pub fn current(&self) -> Arc<LocalNetworks> {
        Arc::clone(&self.current.read())
    }

    /// The zones of the local cluster's nodes, as they are now.
    pub fn zones(&self) -> Arc<BTreeSet<String>> {
        Arc::clone(&self.zones.read())
    }

    /// The usable addresses of the local Service range, by its ServiceCIDRs (None: they name
    /// none, or the API is not served): per family, the addresses of its CIDRs (overlaps counted
    /// once) less the network address (and an IPv4 range's broadcast address), which the API
    /// server never allocates; of a dual-stack range, the scarcer family's.
    pub fn service_range(&self) -> Option<u64> {
        let parts = self.parts.read();
        let nets: Vec<IpNet> = parts
            .get(&Part::ServiceCidrs)?
            .objects
            .values()
            .flat_map(|e| &e.nets)
            .filter(|(_, why)| *why == Refusal::LocalServiceNetwork)
            .map(|(n, _)| *n)
            .collect();
        usable_addresses(&nets)
    }

    /// A listing of `part` starts.
    pub fn relist(&self, part: Part) {
        if let Some(l) = self.parts.write().get_mut(&part) {
            l.next = Some(BTreeMap::new());
        }
    }

    /// An object of a listing in progress, or (outside one) added or changed. True when the
    /// networks changed.
    pub fn apply(&self, part: Part, name: String, entry: Entry) -> bool {
        let changed = {
            let mut parts = self.parts.write();
            let Some(l) = parts.get_mut(&part) else {
                return false;
            };
            match &mut l.next {
                Some(next) => {
                    if !entry.is_empty() {
                        next.insert(name, entry);
                    }
                    false
                }
                None if entry.is_empty() => l.objects.remove(&name).is_some(),
                None => l.objects.insert(name, entry.clone()).as_ref() != Some(&entry),
            }
        };
        changed && self.rebuild()
    }

    /// An object deleted. True when the networks changed.
    pub fn delete(&self, part: Part, name: &str) -> bool {
        let changed = self
            .parts
            .write()
            .get_mut(&part)
            .is_some_and(|l| l.objects.remove(name).is_some());
        changed && self.rebuild()
    }

    /// The listing of `part` completed. True when the networks changed.
    pub fn listed(&self, part: Part) -> bool {
        {
            let mut parts = self.parts.write();
            let Some(l) = parts.get_mut(&part) else {
                return false;
            };
            if let Some(next) = l.next.take() {
                l.objects = next;
            }
            l.listed = true;
            l.problem = None;
        }
        self.ready.set(self.ready());
        self.rebuild()
    }

    /// A part that cannot be listed (forbidden, say): shown on /readyz until it is.
    pub fn set_problem(&self, part: Part, why: String) {
        if let Some(l) = self.parts.write().get_mut(&part) {
            l.problem = (!l.listed).then_some(why);
        }
    }

    /// Rebuilds the current networks and zones from the parts; true when either changed.
    fn rebuild(&self) -> bool {
        let mut local = LocalNetworks::default();
        let mut zones = BTreeSet::new();
        for (net, why) in &self.configured {
            local.add_net(*net, *why);
        }
        for l in self.parts.read().values() {
            for entry in l.objects.values() {
                for (ip, why) in &entry.addresses {
                    local.add_address(*ip, *why);
                }
                for (net, why) in &entry.nets {
                    local.add_net(*net, *why);
                }
                zones.extend(entry.zone.clone());
            }
        }
        let zones_changed = {
            let mut current = self.zones.write();
            let changed = **current != zones;
            if changed {
                *current = Arc::new(zones);
            }
            changed
        };
        let mut current = self.current.write();
        if **current == local {
            return zones_changed;
        }
        *current = Arc::new(local);
        true
    }
}

/// Pure: the usable addresses of a Service range made of `nets` (see
/// [`Networks::service_range`]); None when it has none.
pub fn usable_addresses(nets: &[IpNet]) -> Option<u64> {
    let family = |v4: bool| -> Option<u128> {
        let of: Vec<IpNet> = nets
            .iter()
            .filter(|n| n.addr().is_ipv4() == v4)
            .copied()
            .collect();
        (!of.is_empty()).then(|| {
            IpNet::aggregate(&of)
                .iter()
                .map(|n| {
                    let bits = u32::from(n.max_prefix_len() - n.prefix_len());
                    let size = 1u128.checked_shl(bits).unwrap_or(u128::MAX);
                    size.saturating_sub(if v4 { 2 } else { 1 })
                })
                .fold(0u128, u128::saturating_add)
        })
    };
    let least = match (family(true), family(false)) {
        (Some(a), Some(b)) => a.min(b),
        (a, b) => a.or(b)?,
    };
    Some(u64::try_from(least).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_service_range_is_its_usable_addresses_and_the_scarcer_family_decides() {
        let nets = |v: &[&str]| v.iter().map(|n| n.parse().unwrap()).collect::<Vec<IpNet>>();
        assert_eq!(usable_addresses(&nets(&[])), None);
        assert_eq!(usable_addresses(&nets(&["10.96.0.0/24"])), Some(254));
        assert_eq!(usable_addresses(&nets(&["10.96.0.0/20"])), Some(4094));
        // overlapping ServiceCIDRs counted once; a second one adds its addresses
        assert_eq!(
            usable_addresses(&nets(&["10.96.0.0/24", "10.96.0.0/25", "10.97.0.0/24"])),
            Some(508)
        );
        assert_eq!(
            usable_addresses(&nets(&["10.96.0.0/24", "fd00:10:96::/112"])),
            Some(254)
        );
        assert_eq!(usable_addresses(&nets(&["fd00::/64"])), Some(u64::MAX));
        let n = Networks::new(vec![]);
        assert_eq!(n.service_range(), None);
        let cidr = Entry {
            nets: vec![(
                "10.96.0.0/24".parse().unwrap(),
                Refusal::LocalServiceNetwork,
            )],
            ..Entry::default()
        };
        n.apply(Part::ServiceCidrs, "/kubernetes".into(), cidr);
        assert_eq!(n.service_range(), Some(254));
    }

    fn node(ip: &str, cidr: &str) -> Entry {
        Entry {
            addresses: vec![(ip.parse().unwrap(), Refusal::LocalNode)],
            nets: vec![(cidr.parse().unwrap(), Refusal::LocalPodNetwork)],
            zone: None,
        }
    }

    #[test]
    fn the_zones_are_those_of_the_nodes_and_a_new_zone_is_a_change() {
        let n = Networks::new(vec![]);
        let zoned = |ip: &str, zone: &str| Entry {
            zone: Some(zone.to_string()),
            ..node(ip, "10.201.0.0/24")
        };
        for p in Part::ALL {
            n.listed(p);
        }
        assert!(n.apply(Part::Nodes, "a".into(), zoned("10.250.0.1", "west-a")));
        assert!(n.apply(Part::Nodes, "b".into(), zoned("10.250.0.2", "west-b")));
        assert_eq!(
            n.zones().iter().map(String::as_str).collect::<Vec<_>>(),
            ["west-a", "west-b"]
        );
        // only the zone changes: still a change (every key passes again)
        assert!(n.apply(Part::Nodes, "b".into(), zoned("10.250.0.2", "west-c")));
        assert!(!n.apply(Part::Nodes, "b".into(), zoned("10.250.0.2", "west-c")));
        assert!(n.delete(Part::Nodes, "b"));
        assert_eq!(n.zones().len(), 1);
    }

    #[test]
    fn a_service_without_external_addresses_is_not_kept_and_pod_ranges_count_every_source() {
        let n = Networks::new(vec![(
            "10.210.0.0/16".parse().unwrap(),
            Refusal::LocalPodNetwork,
        )]);
        for p in Part::ALL {
            n.listed(p);
        }
        assert_eq!(n.current().pod_ranges(), 1, "--local-pod-cidrs");
        let lb = Entry {
            addresses: vec![("203.0.113.7".parse().unwrap(), Refusal::LocalServiceAddress)],
            ..Entry::default()
        };
        assert!(n.apply(Part::Services, "shop/web".into(), lb));
        assert_eq!(
            n.current().classify("203.0.113.7".parse().unwrap()),
            Some(Refusal::LocalServiceAddress)
        );
        // the Service loses its load balancer: its entry goes, and an empty one is not kept
        assert!(n.apply(Part::Services, "shop/web".into(), Entry::default()));
        assert!(!n.apply(Part::Services, "shop/db".into(), Entry::default()));
        assert_eq!(n.current().classify("203.0.113.7".parse().unwrap()), None);
        let pool = Entry {
            nets: vec![("10.244.0.0/16".parse().unwrap(), Refusal::LocalPodNetwork)],
            ..Entry::default()
        };
        assert!(n.apply(Part::CalicoPools, "default-ipv4-ippool".into(), pool));
        assert_eq!(n.current().pod_ranges(), 2);
    }

    #[test]
    fn ready_only_once_every_part_is_listed_and_a_relist_replaces_its_part() {
        let n = Networks::new(vec![(
            "10.99.0.0/16".parse().unwrap(),
            Refusal::LocalConfigured,
        )]);
        assert!(!n.ready());
        assert!(n.problem().unwrap().contains("Nodes: not listed yet"));
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            n.current().classify(ip("10.99.1.1")),
            Some(Refusal::LocalConfigured)
        );
        n.relist(Part::Nodes);
        n.apply(
            Part::Nodes,
            "a".into(),
            node("192.168.0.1", "10.201.1.0/24"),
        );
        assert_eq!(n.current().classify(ip("192.168.0.1")), None, "not yet");
        assert!(n.listed(Part::Nodes));
        n.set_problem(Part::ServiceCidrs, "forbidden".into());
        assert!(n.problem().unwrap().contains("ServiceCIDRs: forbidden"));
        n.listed(Part::ServiceCidrs);
        n.listed(Part::ApiServer);
        n.listed(Part::Services);
        n.listed(Part::CalicoPools);
        assert!(!n.ready(), "CiliumNodes not listed yet");
        n.listed(Part::CiliumNodes);
        assert!(n.ready());
        assert_eq!(
            n.current().classify(ip("10.201.1.7")),
            Some(Refusal::LocalPodNetwork)
        );
        // an unchanged object changes nothing; a new node does
        assert!(!n.apply(
            Part::Nodes,
            "a".into(),
            node("192.168.0.1", "10.201.1.0/24")
        ));
        assert!(n.apply(
            Part::Nodes,
            "b".into(),
            node("192.168.0.2", "10.201.2.0/24")
        ));
        // a relist without node a drops it
        n.relist(Part::Nodes);
        n.apply(
            Part::Nodes,
            "b".into(),
            node("192.168.0.2", "10.201.2.0/24"),
        );
        assert!(n.listed(Part::Nodes));
        assert_eq!(n.current().classify(ip("192.168.0.1")), None);
        assert!(n.delete(Part::Nodes, "b"));
        assert_eq!(n.current().classify(ip("10.201.2.9")), None);
        assert!(n.ready(), "a part once listed stays ready");
    }
}
