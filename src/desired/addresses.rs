//! Which remote addresses may reach a local object. A remote speaks only for its own networks:
//! an address of the local cluster (a node, the pod or Service network, the API server) is
//! never taken from it, whatever its allowlist says, and with an allowlist only addresses inside
//! it are. Pure: the local networks and each remote's policy are inputs.
//!
//! Every remote EndpointSlice passes [`admit`] before it reaches the desired state, in the label
//! mode and in the MCS mode alike; an endpoint with a refused address is left out whole.
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::IpNet;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Why an address was refused. The variants are bounded categories, usable as metric labels
/// through [`Refusal::reason`].
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::IntoStaticStr,
    strum::VariantNames,
)]
pub enum Refusal {
    /// an address of a local Node (`status.addresses`)
    LocalNode,
    /// inside a local pod network: a Node's pod CIDR (`spec.podCIDRs`), a CNI's pool (Calico
    /// IPPools, Cilium's CiliumNodes) or `--local-pod-cidrs`
    LocalPodNetwork,
    /// inside a local ServiceCIDR (`networking.k8s.io/v1`)
    LocalServiceNetwork,
    /// an endpoint of the local API server (the `default/kubernetes` Service)
    LocalApiServer,
    /// a local Service's `externalIPs` or load-balancer ingress IP
    LocalServiceAddress,
    /// inside a network the operator named local (`--local-cidrs`)
    LocalConfigured,
    /// loopback, link-local, unspecified, multicast or broadcast: never a pod's
    Reserved,
    /// a cloud platform's own endpoint (instance metadata, Azure's WireServer, ...): never a
    /// pod's, and a request to it from a node can carry the node's credentials
    Platform,
    /// outside the remote's allowed CIDRs
    NotAllowed,
    /// the remote has no allowlist and strict mode is on
    NoAllowlist,
    /// an FQDN slice: a remote may not make a local name resolve to a host of its choice
    Fqdn,
    /// not an IP address
    NotAnAddress,
}

impl Refusal {
    /// Every reason [`Refusal::reason`] returns: the variants' names.
    pub const REASONS: &'static [&'static str] = <Self as strum::VariantNames>::VARIANTS;

    /// Short CamelCase reason, usable as a metric label: the variant's name.
    pub fn reason(self) -> &'static str {
        self.into()
    }

    /// What it means, for an Event.
    fn words(self) -> &'static str {
        match self {
            Refusal::LocalNode => "a local node's address",
            Refusal::LocalPodNetwork => "in the local pod network",
            Refusal::LocalServiceNetwork => "in the local Service network",
            Refusal::LocalApiServer => "the local API server",
            Refusal::LocalServiceAddress => "a local Service's external or load-balancer IP",
            Refusal::LocalConfigured => "in --local-cidrs",
            Refusal::Reserved => "loopback, link-local, multicast or unspecified",
            Refusal::Platform => "a cloud platform's endpoint (instance metadata, WireServer)",
            Refusal::NotAllowed => "outside the remote's allowed CIDRs",
            Refusal::NoAllowlist => "the remote has no allowed CIDRs (strict mode)",
            Refusal::Fqdn => "an FQDN endpoint",
            Refusal::NotAnAddress => "not an IP address",
        }
    }
}

/// The local cluster's own networks: never a remote's to claim.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LocalNetworks {
    /// exact addresses: nodes' and the API server's
    addresses: BTreeMap<IpAddr, Refusal>,
    /// networks: pod CIDRs, ServiceCIDRs, `--local-cidrs`
    nets: Vec<(IpNet, Refusal)>,
}

impl LocalNetworks {
    /// Adds an exact local address (a node's, the API server's).
    pub fn add_address(&mut self, ip: IpAddr, why: Refusal) {
        self.addresses.entry(ip.to_canonical()).or_insert(why);
    }

    /// Adds a local network (a pod CIDR, a ServiceCIDR, one the operator named).
    pub fn add_net(&mut self, net: IpNet, why: Refusal) {
        let net = net.trunc();
        if !self.nets.iter().any(|(n, _)| *n == net) {
            self.nets.push((net, why));
        }
    }

    /// Whether `ip` is the local cluster's, and as what.
    pub fn classify(&self, ip: IpAddr) -> Option<Refusal> {
        self.addresses.get(&ip).copied().or_else(|| {
            self.nets
                .iter()
                .find(|(net, _)| net.contains(&ip))
                .map(|(_, why)| *why)
        })
    }

    /// How many pod networks it holds: none means the local pods are not known as local (a
    /// CNI that publishes its pools nowhere the daemon reads, and no `--local-pod-cidrs`).
    pub fn pod_ranges(&self) -> usize {
        self.nets
            .iter()
            .filter(|(_, why)| *why == Refusal::LocalPodNetwork)
            .count()
    }

    /// How many addresses and networks it holds (for logs).
    pub fn size(&self) -> (usize, usize) {
        (self.addresses.len(), self.nets.len())
    }
}

/// One remote's address policy.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// the networks this remote's addresses must be in (empty: any that is not local, unless
    /// `strict`)
    pub allowed: Vec<IpNet>,
    /// a remote without an allowlist contributes no addresses
    pub strict: bool,
}

impl AddressPolicy {
    /// Judges one address. An address of the NAT64 well-known prefix is judged as the IPv4
    /// address it embeds (a node with NAT64 sends it there).
    pub fn judge(&self, address: &str, local: &LocalNetworks) -> Result<(), Refusal> {
        let ip = address
            .parse::<IpAddr>()
            .map_err(|_| Refusal::NotAnAddress)?
            .to_canonical();
        let ip = nat64_embedded(ip).unwrap_or(ip);
        if is_reserved(ip) {
            return Err(Refusal::Reserved);
        }
        if PLATFORM.contains(&ip) {
            return Err(Refusal::Platform);
        }
        if let Some(why) = local.classify(ip) {
            return Err(why);
        }
        if self.allowed.is_empty() {
            return if self.strict {
                Err(Refusal::NoAllowlist)
            } else {
                Ok(())
            };
        }
        if self.allowed.iter().any(|net| net.contains(&ip)) {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }
}

/// Cloud platforms' own endpoints outside the link-local range (169.254.169.254 and the other
/// link-local ones are [`is_reserved`]), each from its provider's documentation (see
/// docs/security.md): Alibaba Cloud's instance metadata; Azure's WireServer (host-node virtual
/// IP); AWS's instance metadata, DNS resolver and time sync over IPv6; GCP's metadata server over
/// IPv6.
const PLATFORM: [IpAddr; 6] = [
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V4(Ipv4Addr::new(168, 63, 129, 16)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x253)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x123)),
    IpAddr::V6(Ipv6Addr::new(0xfd20, 0xce, 0, 0, 0, 0, 0, 0x254)),
];

/// The IPv4 address a NAT64 address of the well-known prefix `64:ff9b::/96` (RFC 6052) embeds.
fn nat64_embedded(ip: IpAddr) -> Option<IpAddr> {
    let IpAddr::V6(v6) = ip else { return None };
    let s = v6.segments();
    if s[..6] != [0x64, 0xff9b, 0, 0, 0, 0] {
        return None;
    }
    let o = v6.octets();
    Some(IpAddr::V4(Ipv4Addr::new(o[12], o[13], o[14], o[15])))
}

/// Never a pod's address (the API server refuses most of these in an EndpointSlice, so a remote
/// listing one would also fail our write).
fn is_reserved(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || v6.is_unicast_link_local()
        }
    }
}

/// Comma-separated CIDRs (`10.20.0.0/16, fd00:20::/64`); an empty text is an empty list. A bare
/// address is refused: say `/32` or `/128` when one address is meant.
pub fn parse_cidrs(text: &str) -> Result<Vec<IpNet>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(|c| {
            c.parse::<IpNet>().map(|n| n.trunc()).map_err(|_| {
                let shown: String = c.chars().take(64).flat_map(char::escape_debug).collect();
                format!("{shown:?} is not a CIDR (like 10.20.0.0/16 or fd00:20::/64)")
            })
        })
        .collect()
}

/// Most refused addresses an [`Admission`] names (the rest are counted).
const EXAMPLES: usize = 4;

/// What [`admit`] refused of one remote's slices: counts by reason, and a few examples.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refused {
    pub counts: BTreeMap<Refusal, usize>,
    /// a few refused addresses with why (IP addresses only: other text is never repeated)
    pub examples: Vec<(String, Refusal)>,
}

impl Refused {
    fn add(&mut self, address: &str, why: Refusal) {
        *self.counts.entry(why).or_default() += 1;
        if self.examples.len() < EXAMPLES {
            let shown = match address.parse::<IpAddr>() {
                Ok(ip) => ip.to_string(),
                Err(_) => "(not an address)".to_string(),
            };
            self.examples.push((shown, why));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    pub fn total(&self) -> usize {
        self.counts.values().sum()
    }

    /// Adds what another admission refused.
    pub fn extend(&mut self, other: Refused) {
        for (why, n) in other.counts {
            *self.counts.entry(why).or_default() += n;
        }
        let room = EXAMPLES.saturating_sub(self.examples.len());
        self.examples.extend(other.examples.into_iter().take(room));
    }

    /// One line for an Event: `3 addresses refused: 10.0.0.1 (in the local pod network), ...`.
    pub fn describe(&self) -> String {
        let named: Vec<String> = self
            .examples
            .iter()
            .map(|(a, why)| format!("{a} ({})", why.words()))
            .collect();
        let more = self.total().saturating_sub(self.examples.len());
        let tail = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "{} address(es) refused: {}{tail}",
            self.total(),
            named.join(", ")
        )
    }
}

/// A remote's slices with only the addresses its policy admits (the same `Arc` when nothing was
/// refused), and what was refused.
pub fn admitted(
    slices: Vec<Arc<EndpointSlice>>,
    policy: &AddressPolicy,
    local: &LocalNetworks,
) -> (Vec<Arc<EndpointSlice>>, Refused) {
    let mut refused = Refused::default();
    let slices = slices
        .into_iter()
        .map(|s| {
            let (kept, r) = admit(&s, policy, local);
            if r.is_empty() {
                return s;
            }
            refused.extend(r);
            Arc::new(kept.into_owned())
        })
        .collect();
    (slices, refused)
}

/// The slice with only the endpoints whose every address `policy` admits (borrowed when nothing
/// was refused), and what was refused. An FQDN slice is refused whole.
pub fn admit<'a>(
    slice: &'a EndpointSlice,
    policy: &AddressPolicy,
    local: &LocalNetworks,
) -> (Cow<'a, EndpointSlice>, Refused) {
    let mut refused = Refused::default();
    if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
        for e in &slice.endpoints {
            for a in &e.addresses {
                refused.add(a, Refusal::Fqdn);
            }
        }
        let mut empty = slice.clone();
        empty.endpoints.clear();
        return (Cow::Owned(empty), refused);
    }
    let verdicts: Vec<bool> = slice
        .endpoints
        .iter()
        .map(|e| {
            let mut ok = true;
            for a in &e.addresses {
                if let Err(why) = policy.judge(a, local) {
                    refused.add(a, why);
                    ok = false;
                }
            }
            ok
        })
        .collect();
    if refused.is_empty() {
        return (Cow::Borrowed(slice), refused);
    }
    let mut kept = slice.clone();
    let mut verdict = verdicts.into_iter();
    kept.endpoints.retain(|_| verdict.next().unwrap_or(false));
    (Cow::Owned(kept), refused)
}

#[cfg(test)]
mod tests;
