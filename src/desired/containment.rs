//! What a remote may never decide about local objects (issue 27, part 2): labels of reserved
//! prefixes (and the operator's deny or allow list), the namespaces the daemon never writes
//! in, and the names a follower may not take (issue 37: top-level domains, see
//! [`super::names`]). Pure: the flags build a [`Containment`], the translations ask it.
use std::collections::BTreeMap;

/// The namespaces the daemon never writes in when none are configured (its own is added).
pub const DEFAULT_PROTECTED_NAMESPACES: [&str; 3] =
    ["kube-system", "kube-public", "kube-node-lease"];

/// Why a remote label is not copied. Bounded: usable as a metric label.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum LabelRefusal {
    /// a reserved prefix (`kubernetes.io`, `k8s.io`, `x-k8s.io` and their subdomains, our own
    /// label key's domain): always refused
    Reserved,
    /// on the operator's deny list
    Denied,
    /// an allow list is set and does not name it
    NotAllowed,
    /// the leader's labels together are over `--remote-max-label-bytes`: none is copied, the
    /// follower's stay as they were
    OverLimit,
}

impl LabelRefusal {
    pub const LABELS: [&'static str; 4] = ["reserved", "denied", "not_allowed", "over_limit"];

    pub fn label(self) -> &'static str {
        match self {
            LabelRefusal::Reserved => "reserved",
            LabelRefusal::Denied => "denied",
            LabelRefusal::NotAllowed => "not_allowed",
            LabelRefusal::OverLimit => "over_limit",
        }
    }
}

/// How many labels of one exported Service were refused, by why.
pub type Refused = BTreeMap<LabelRefusal, u32>;

/// The operator's containment settings (flags), shared by every remote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Containment {
    /// label keys (`team`) or prefixes (`example.com/`, which also covers its subdomains) never
    /// copied
    pub label_deny: Vec<String>,
    /// when not empty, only these keys or prefixes are copied (reserved and denied ones never)
    pub label_allow: Vec<String>,
    /// namespaces the daemon never writes in
    pub protected_namespaces: Vec<String>,
    /// top-level domains a follower's namespace or name may be all the same
    /// (`--allow-tld-names`); every other one is refused
    pub allowed_tld_names: Vec<String>,

    /// what one remote may cost the local API server per follower
    pub limits: super::limits::WriteLimits,
}

impl Default for Containment {
    fn default() -> Self {
        Self {
            label_deny: Vec::new(),
            label_allow: Vec::new(),
            protected_namespaces: DEFAULT_PROTECTED_NAMESPACES
                .iter()
                .map(|n| n.to_string())
                .collect(),
            allowed_tld_names: Vec::new(),
            limits: Default::default(),
        }
    }
}

impl Containment {
    /// Whether the daemon never writes in `namespace`.
    pub fn protected(&self, namespace: &str) -> bool {
        self.protected_namespaces.iter().any(|n| n == namespace)
    }

    /// Why no follower may be `namespace/name`, if none may: its namespace or its name is a
    /// top-level domain the operator did not allow (see [`super::names`]).
    pub fn public_name(&self, namespace: &str, name: &str) -> Option<super::names::PublicName> {
        super::names::public_name(namespace, name, &self.allowed_tld_names)
    }

    /// Why a remote label `key` is not copied onto local objects, if it is not. `label_key` is
    /// the daemon's own label key (its domain is ours).
    pub fn refuses(&self, key: &str, label_key: &str) -> Option<LabelRefusal> {
        if reserved(key, label_key) {
            return Some(LabelRefusal::Reserved);
        }
        if self.label_deny.iter().any(|e| matches(e, key)) {
            return Some(LabelRefusal::Denied);
        }
        if !self.label_allow.is_empty() && !self.label_allow.iter().any(|e| matches(e, key)) {
            return Some(LabelRefusal::NotAllowed);
        }
        None
    }
}

/// A label key's prefix (the part before `/`), if any.
fn prefix(key: &str) -> Option<&str> {
    key.split_once('/').map(|(p, _)| p)
}

/// `domain` itself or a subdomain of it.
fn within(prefix: &str, domain: &str) -> bool {
    prefix == domain
        || prefix
            .strip_suffix(domain)
            .is_some_and(|rest| rest.ends_with('.'))
}

/// Whether a label key is reserved whatever the lists say: `kubernetes.io`, `k8s.io`,
/// `x-k8s.io` and their subdomains (`app.kubernetes.io/managed-by` among them), and the domain
/// of our own label key and its subdomains (the bare label key itself when it has no prefix).
pub fn reserved(key: &str, label_key: &str) -> bool {
    if key == label_key {
        return true;
    }
    let Some(p) = prefix(key) else {
        return false;
    };
    let own = prefix(label_key);
    ["kubernetes.io", "k8s.io", "x-k8s.io"]
        .into_iter()
        .chain(own)
        .any(|domain| within(p, domain))
}

/// One deny or allow list entry against a key: `domain/` matches every key of that prefix or a
/// subdomain of it; anything else matches the one key.
fn matches(entry: &str, key: &str) -> bool {
    match entry.strip_suffix('/') {
        Some(domain) => prefix(key).is_some_and(|p| within(p, domain)),
        None => entry == key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "fair.com/cross-cluster";

    #[test]
    fn reserved_prefixes_are_refused_whatever_the_lists_say() {
        for key in [
            "kubernetes.io/service-name",
            "service.kubernetes.io/service-proxy-name",
            "endpointslice.kubernetes.io/managed-by",
            "app.kubernetes.io/managed-by",
            "app.kubernetes.io/name",
            "k8s.io/x",
            "multicluster.k8s.io/x",
            "x-k8s.io/x",
            "multicluster.x-k8s.io/service-name",
            "fair.com/cross-cluster",
            "fair.com/anything",
            "cross-cluster-controller.fair.com/x",
        ] {
            let everything = Containment {
                label_allow: vec![key.to_string(), "kubernetes.io/".into()],
                ..Containment::default()
            };
            assert_eq!(
                everything.refuses(key, KEY),
                Some(LabelRefusal::Reserved),
                "{key}"
            );
        }
        // multicluster.kubernetes.io, the MCS API's labels, is a subdomain of kubernetes.io
        assert!(reserved("multicluster.kubernetes.io/service-name", KEY));
        // look-alikes are not reserved
        for key in [
            "app",
            "notkubernetes.io/x",
            "kubernetes.io.evil.com/x",
            "unfair.com/x",
            "myk8s.io/x",
        ] {
            assert_eq!(Containment::default().refuses(key, KEY), None, "{key}");
        }
        // a bare label key: the key itself is ours
        assert!(reserved("mirror", "mirror"));
        assert!(!reserved("mirror2", "mirror"));
    }

    #[test]
    fn deny_and_allow_lists() {
        let c = Containment {
            label_deny: vec!["team".into(), "example.com/".into()],
            label_allow: vec![],
            ..Containment::default()
        };
        assert_eq!(c.refuses("team", KEY), Some(LabelRefusal::Denied));
        assert_eq!(c.refuses("example.com/a", KEY), Some(LabelRefusal::Denied));
        assert_eq!(
            c.refuses("x.example.com/a", KEY),
            Some(LabelRefusal::Denied)
        );
        assert_eq!(c.refuses("app", KEY), None);
        let c = Containment {
            label_allow: vec!["app".into(), "shop.io/".into()],
            label_deny: vec!["shop.io/secret".into()],
            ..Containment::default()
        };
        assert_eq!(c.refuses("app", KEY), None);
        assert_eq!(c.refuses("shop.io/tier", KEY), None);
        assert_eq!(c.refuses("shop.io/secret", KEY), Some(LabelRefusal::Denied));
        assert_eq!(c.refuses("team", KEY), Some(LabelRefusal::NotAllowed));
    }

    #[test]
    fn protected_namespaces() {
        let c = Containment::default();
        assert!(c.protected("kube-system"));
        assert!(c.protected("kube-node-lease"));
        assert!(!c.protected("default"));
    }
}
