//! A remote Secret, read without I/O: the remote's name, its kubeconfig and its outage policy.
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::config::Kubeconfig;
use sha2::{Digest, Sha256};

use crate::client::ClusterId;
use crate::state::budget::{Limits, parse_bytes, parse_count};

/// Label or annotation naming the remote cluster.
pub const NAME_KEY: &str = "fair.com/cross-cluster-name";
/// The Secret's data key holding the kubeconfig.
pub const DATA_KEY: &str = "kubeconfig";
/// The Secret annotation that turns on the outage policy for its remote (see `crate::remotes::outage`).
pub const STALE_AFTER_KEY: &str = "fair.com/cross-cluster-stale-after";
/// The Secret annotation that turns on the data-path probe for its remote (see
/// `crate::remotes::probe`): how long every probe must fail before its endpoints are published
/// as not ready.
pub const PROBE_AFTER_KEY: &str = "fair.com/cross-cluster-probe-after";
/// The Secret annotation listing the networks (CIDRs, comma-separated) its remote's addresses
/// must be in (see `crate::desired::addresses`).
pub const ALLOWED_CIDRS_KEY: &str = "fair.com/cross-cluster-allowed-cidrs";
/// The Secret annotations overriding the daemon's budget for its remote (see
/// `crate::state::budget`): Services, endpoints (counts; 0: no limit) and cached bytes.
pub const MAX_SERVICES_KEY: &str = "fair.com/cross-cluster-max-services";
pub const MAX_ENDPOINTS_KEY: &str = "fair.com/cross-cluster-max-endpoints";
pub const MAX_CACHE_BYTES_KEY: &str = "fair.com/cross-cluster-max-cache-bytes";

/// What a Secret's budget annotations say (None: the daemon's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BudgetOverride {
    pub services: Option<u64>,
    pub endpoints: Option<u64>,
    pub bytes: Option<u64>,
}

impl BudgetOverride {
    /// The remote's limits: these over the daemon's defaults.
    pub fn over(&self, default: Limits) -> Limits {
        Limits {
            services: self.services.unwrap_or(default.services),
            endpoints: self.endpoints.unwrap_or(default.endpoints),
            bytes: self.bytes.unwrap_or(default.bytes),
        }
    }

    /// For the hash: empty when no annotation is set (a Secret hashes as before).
    fn text(&self) -> String {
        let f = |v: Option<u64>| v.map_or(String::new(), |n| n.to_string());
        if *self == Self::default() {
            return String::new();
        }
        format!(
            "\nbudget={},{},{}",
            f(self.services),
            f(self.endpoints),
            f(self.bytes)
        )
    }
}

fn budget_of(a: &std::collections::BTreeMap<String, String>) -> Result<BudgetOverride, String> {
    let read = |key: &str, parse: fn(&str) -> Result<u64, String>| {
        a.get(key)
            .map(|v| parse(v).map_err(|e| format!("annotation {key}: {e}")))
            .transpose()
    };
    Ok(BudgetOverride {
        services: read(MAX_SERVICES_KEY, parse_count)?,
        endpoints: read(MAX_ENDPOINTS_KEY, parse_count)?,
        bytes: read(MAX_CACHE_BYTES_KEY, parse_bytes)?,
    })
}
/// The Secret annotation that allows its remote to export ExternalName Services (`"true"`).
pub const ALLOW_EXTERNAL_NAME_KEY: &str = "fair.com/cross-cluster-allow-external-name";
/// The Secret (or ClusterProfile) annotation that pins its remote's identity: the uid of the
/// kube-system namespace of the cluster it was made for (`remote-access` writes it). A server
/// that answers with another uid is refused (see `crate::remotes::source`).
pub const CLUSTER_ID_KEY: &str = "fair.com/cross-cluster-cluster-id";
/// What a Secret says, read without I/O.
#[derive(Debug)]
pub struct Candidate {
    /// the remote's name
    pub name: String,
    pub kubeconfig: Kubeconfig,
    /// of the kubeconfig bytes and the outage policy: a different hash is a rotation
    pub hash: String,
    /// the outage policy (annotation [`STALE_AFTER_KEY`])
    pub stale_after: Option<Duration>,
    /// the networks its addresses must be in (annotation [`ALLOWED_CIDRS_KEY`])
    pub allowed_cidrs: Vec<ipnet::IpNet>,
    /// the data-path probe (annotation [`PROBE_AFTER_KEY`])
    pub probe_after: Option<Duration>,
    /// its budget, where the annotations set one
    pub budget: BudgetOverride,
    /// its ExternalName Services are mirrored (annotation [`ALLOW_EXTERNAL_NAME_KEY`])
    pub allow_external_name: bool,
    /// the cluster id its server must answer with (annotation [`CLUSTER_ID_KEY`]); None: any
    pub cluster_id: Option<ClusterId>,
    /// what its credential says, when known otherwise than from the kubeconfig's inline data
    /// (an exec plugin's `expirationTimestamp`)
    pub credential: Option<crate::state::Credential>,
}

/// The name a Secret gives its remote: its label (or annotation) [`NAME_KEY`], else its own.
pub fn remote_name(s: &Secret) -> String {
    s.labels()
        .get(NAME_KEY)
        .or_else(|| s.annotations().get(NAME_KEY))
        .cloned()
        .unwrap_or_else(|| s.name_any())
}

/// Pure: the remote a Secret describes, or why it describes none.
pub fn read_secret(s: &Secret) -> Result<Candidate, String> {
    let name = remote_name(s);
    check_name(&name, &format!("{NAME_KEY}, or the Secret's name"))?;
    let text = kubeconfig_text(s)?;
    let kubeconfig = Kubeconfig::from_yaml(&text)
        .map_err(|e| format!("{DATA_KEY:?} is not a kubeconfig: {}", one_line(e)))?;
    let policy = read_policy(s.annotations())?;
    Ok(policy.candidate(name, kubeconfig, &text))
}

/// A remote's name, wherever it comes from (`from` says where, for the message): recorded in
/// annotations and metric labels, never a label, so any printable name but the local cluster's.
pub fn check_name(name: &str, from: &str) -> Result<(), String> {
    // as --cluster-name: it is recorded in annotations and metric labels, never a label
    if name.is_empty() || name.len() > 253 || name.chars().any(char::is_control) {
        return Err(format!(
            "the remote name {name:?} ({from}) must be 1 to 253 printable characters"
        ));
    }
    if name == crate::state::LOCAL {
        return Err(format!(
            "the remote name {name:?} ({from}) is the local cluster's: give the remote another name"
        ));
    }
    Ok(())
}

/// What an object's annotations say of its remote: the outage policy, the probe, the allowed
/// networks, the budget, ExternalNames and the pinned cluster id (the same keys on a Secret and
/// on a ClusterProfile).
#[derive(Debug, Default)]
pub struct Policy {
    pub stale_after: Option<Duration>,
    pub allowed_cidrs: Vec<ipnet::IpNet>,
    pub probe_after: Option<Duration>,
    pub budget: BudgetOverride,
    pub allow_external_name: bool,
    pub cluster_id: Option<ClusterId>,
}

/// Pure: the policy an object's annotations set, or the first annotation that is wrong.
pub fn read_policy(a: &std::collections::BTreeMap<String, String>) -> Result<Policy, String> {
    let span = |key: &str| match a.get(key) {
        Some(v) => crate::span::parse_optional(v).map_err(|e| format!("annotation {key}: {e}")),
        None => Ok(None),
    };
    let allow_external_name = match a.get(ALLOW_EXTERNAL_NAME_KEY).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "annotation {ALLOW_EXTERNAL_NAME_KEY}: {other:?} is neither \"true\" nor \"false\""
            ));
        }
    };
    let allowed_cidrs = match a.get(ALLOWED_CIDRS_KEY) {
        Some(v) => crate::desired::addresses::parse_cidrs(v)
            .map_err(|e| format!("annotation {ALLOWED_CIDRS_KEY}: {e}"))?,
        None => Vec::new(),
    };
    let cluster_id = a
        .get(CLUSTER_ID_KEY)
        .map(|v| ClusterId::parse(v).map_err(|e| format!("annotation {CLUSTER_ID_KEY}: {e}")))
        .transpose()?;
    Ok(Policy {
        stale_after: span(STALE_AFTER_KEY)?,
        allowed_cidrs,
        probe_after: span(PROBE_AFTER_KEY)?,
        budget: budget_of(a)?,
        allow_external_name,
        cluster_id,
    })
}

impl Policy {
    /// What the policy adds to an access's hash: a change is a rotation; what is not set adds
    /// nothing (a Secret without these annotations hashes as it always did).
    fn text(&self) -> String {
        let mut policy = self
            .stale_after
            .map_or(String::new(), |d| d.as_secs().to_string());
        if self.allow_external_name {
            policy.push_str("\nexternal-name");
        }
        if !self.allowed_cidrs.is_empty() {
            let nets: Vec<String> = self.allowed_cidrs.iter().map(ToString::to_string).collect();
            policy = format!("{policy}\nallowed={}", nets.join(","));
        }
        policy.push_str(&self.budget.text());
        if let Some(d) = self.probe_after {
            policy.push_str(&format!("\nprobe={}", d.as_millis()));
        }
        // a pin added or changed is a rotation: the server is asked again who it is
        if let Some(id) = &self.cluster_id {
            policy.push_str(&format!("\ncluster-id={id}"));
        }
        policy
    }

    /// The candidate of a remote with this policy; `access` is what its hash is of besides the
    /// policy (a Secret's kubeconfig text).
    pub fn candidate(self, name: String, kubeconfig: Kubeconfig, access: &str) -> Candidate {
        let hash = hex::encode(Sha256::digest(
            format!("{access}\n{}", self.text()).as_bytes(),
        ));
        Candidate {
            name,
            kubeconfig,
            hash,
            stale_after: self.stale_after,
            allowed_cidrs: self.allowed_cidrs,
            probe_after: self.probe_after,
            budget: self.budget,
            allow_external_name: self.allow_external_name,
            cluster_id: self.cluster_id,
            credential: None,
        }
    }
}

/// The kubeconfig text a Secret holds under [`DATA_KEY`] (data, else stringData).
pub fn kubeconfig_text(s: &Secret) -> Result<String, String> {
    let bytes = s
        .data
        .as_ref()
        .and_then(|d| d.get(DATA_KEY))
        .map(|ByteString(b)| b.clone())
        .or_else(|| {
            s.string_data
                .as_ref()
                .and_then(|d| d.get(DATA_KEY))
                .map(|t| t.as_bytes().to_vec())
        })
        .ok_or_else(|| format!("no data key {DATA_KEY:?}"))?;
    String::from_utf8(bytes).map_err(|_| format!("{DATA_KEY:?} is not text"))
}

fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string().replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn secret(labels: serde_json::Value, data: Option<&str>) -> Secret {
        let mut s = json!({"metadata": {"name": "east-secret", "namespace": "fair-system",
                                        "labels": labels}});
        if let Some(d) = data {
            use base64::Engine;
            s["data"] = json!({DATA_KEY: base64::engine::general_purpose::STANDARD.encode(d)});
        }
        serde_json::from_value(s).expect("a Secret")
    }

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster: {server: 'https://127.0.0.1:6443'}\nusers:\n- name: r\n  user: {token: abc}\ncontexts:\n- name: east\n  context: {cluster: east, user: r}\ncurrent-context: east\n";

    #[test]
    fn a_secret_names_its_remote_by_label_else_by_its_own_name() {
        let c = read_secret(&secret(json!({NAME_KEY: "east"}), Some(KUBECONFIG))).unwrap();
        assert_eq!(c.name, "east");
        assert_eq!(c.hash.len(), 64);
        let c = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert_eq!(c.name, "east-secret");
    }

    #[test]
    fn no_remote_takes_the_local_clusters_name() {
        // by label, annotation or the Secret's own name: "local" is the local cluster's
        let by_label = read_secret(&secret(json!({NAME_KEY: "local"}), Some(KUBECONFIG)));
        let why = by_label.expect_err("a remote named local is refused");
        assert!(why.contains("is the local cluster's"), "{why}");
        let mut named = secret(json!({}), Some(KUBECONFIG));
        named.metadata.name = Some(crate::state::LOCAL.to_string());
        assert!(read_secret(&named).is_err(), "by the Secret's name too");
        // a name that only contains it is any other name
        let c = read_secret(&secret(json!({NAME_KEY: "local-east"}), Some(KUBECONFIG)));
        assert_eq!(c.expect("another name").name, "local-east");
    }

    #[test]
    fn the_probe_annotation_turns_the_probe_on_and_changes_the_hash() {
        let plain = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert_eq!(plain.probe_after, None);
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations = Some([(PROBE_AFTER_KEY.to_string(), "5s".to_string())].into());
        let probed = read_secret(&s).unwrap();
        assert_eq!(probed.probe_after, Some(Duration::from_secs(5)));
        assert_ne!(probed.hash, plain.hash, "a rotation");
        s.metadata.annotations = Some([(PROBE_AFTER_KEY.to_string(), "soon".to_string())].into());
        let why = read_secret(&s).unwrap_err();
        assert!(why.contains(PROBE_AFTER_KEY), "{why}");
    }

    #[test]
    fn a_bad_secret_says_what_is_wrong_in_one_line() {
        let no_key = read_secret(&secret(json!({}), None)).unwrap_err();
        assert!(no_key.contains("no data key \"kubeconfig\""), "{no_key}");
        let bad = read_secret(&secret(json!({}), Some("clusters: [unclosed"))).unwrap_err();
        assert!(bad.contains("is not a kubeconfig"), "{bad}");
        assert!(!bad.contains('\n'));
        let mut long = secret(json!({}), Some(KUBECONFIG));
        long.metadata.annotations = Some([(NAME_KEY.to_string(), "x".repeat(254))].into());
        let name = read_secret(&long).unwrap_err();
        assert!(name.contains("remote name"), "{name}");
        // a name that is no label value (an EKS ARN, say) comes in the annotation
        let arn = "arn:aws:eks:eu-west-1:123456789012:cluster/east";
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations = Some([(NAME_KEY.to_string(), arn.to_string())].into());
        assert_eq!(read_secret(&s).unwrap().name, arn);
    }

    #[test]
    fn the_external_name_annotation_is_read_and_part_of_the_hash() {
        let plain = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert!(!plain.allow_external_name);
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations =
            Some([(ALLOW_EXTERNAL_NAME_KEY.to_string(), "true".to_string())].into());
        let allowed = read_secret(&s).unwrap();
        assert!(allowed.allow_external_name);
        assert_ne!(
            plain.hash, allowed.hash,
            "a changed annotation is a rotation"
        );
        s.metadata.annotations =
            Some([(ALLOW_EXTERNAL_NAME_KEY.to_string(), "false".to_string())].into());
        assert_eq!(read_secret(&s).unwrap().hash, plain.hash);
        s.metadata.annotations =
            Some([(ALLOW_EXTERNAL_NAME_KEY.to_string(), "yes".to_string())].into());
        assert!(
            read_secret(&s)
                .unwrap_err()
                .contains(ALLOW_EXTERNAL_NAME_KEY)
        );
    }

    #[test]
    fn the_cluster_id_pin_is_a_uuid_read_in_lower_case_and_part_of_the_hash() {
        let plain = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert_eq!(plain.cluster_id, None, "no pin: any cluster, as before");
        let uid = "0F6B3C1E-54D2-4A8E-9C7B-2D1E0A9F8B7C";
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations = Some([(CLUSTER_ID_KEY.to_string(), uid.to_string())].into());
        let pinned = read_secret(&s).unwrap();
        assert_eq!(
            pinned.cluster_id.as_ref().map(ClusterId::as_str),
            Some(uid.to_ascii_lowercase().as_str())
        );
        assert_ne!(pinned.hash, plain.hash, "a pin added is a rotation");
        // the same id in either case is the same pin
        s.metadata.annotations =
            Some([(CLUSTER_ID_KEY.to_string(), uid.to_ascii_lowercase())].into());
        assert_eq!(read_secret(&s).unwrap().hash, pinned.hash);
        // a pin that is no UUID: the Secret is refused, the annotation named, the value cut
        let long = "x".repeat(300 * 1024);
        s.metadata.annotations = Some([(CLUSTER_ID_KEY.to_string(), long)].into());
        let why = read_secret(&s).unwrap_err();
        assert!(
            why.contains(CLUSTER_ID_KEY) && why.contains("not a UUID"),
            "{why}"
        );
        assert!(why.len() < 300, "{} bytes", why.len());
    }

    #[test]
    fn a_changed_kubeconfig_has_another_hash() {
        let a = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        let rotated = KUBECONFIG.replace("abc", "def");
        let b = read_secret(&secret(json!({}), Some(&rotated))).unwrap();
        assert_ne!(a.hash, b.hash);
    }

    #[test]
    fn budget_annotations_override_the_defaults_and_a_change_is_a_rotation() {
        let plain = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        assert_eq!(plain.budget, BudgetOverride::default());
        let mut s = secret(json!({}), Some(KUBECONFIG));
        s.metadata.annotations = Some(
            [
                (MAX_SERVICES_KEY.to_string(), "5".to_string()),
                (MAX_CACHE_BYTES_KEY.to_string(), "1Mi".to_string()),
            ]
            .into(),
        );
        let c = read_secret(&s).unwrap();
        let defaults = Limits {
            services: 100,
            endpoints: 200,
            bytes: 300,
        };
        assert_eq!(
            c.budget.over(defaults),
            Limits {
                services: 5,
                endpoints: 200,
                bytes: 1 << 20
            }
        );
        assert_ne!(c.hash, plain.hash, "a new budget is a rotation");
        if let Some(a) = s.metadata.annotations.as_mut() {
            a.insert(MAX_ENDPOINTS_KEY.to_string(), "many".to_string());
        }
        let bad = read_secret(&s).unwrap_err();
        assert!(bad.contains(MAX_ENDPOINTS_KEY), "{bad}");
    }
}
