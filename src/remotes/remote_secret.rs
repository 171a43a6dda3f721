//! A remote Secret, read without I/O: the remote's name, its kubeconfig and its outage policy.
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::config::Kubeconfig;
use sha2::{Digest, Sha256};

/// Label or annotation naming the remote cluster.
pub const NAME_KEY: &str = "fair.com/cross-cluster-name";
/// The Secret's data key holding the kubeconfig.
pub const DATA_KEY: &str = "kubeconfig";
/// The Secret annotation that turns on the outage policy for its remote (see `crate::remotes::outage`).
pub const STALE_AFTER_KEY: &str = "fair.com/cross-cluster-stale-after";
/// The Secret annotation that allows its remote to export ExternalName Services (`"true"`).
pub const ALLOW_EXTERNAL_NAME_KEY: &str = "fair.com/cross-cluster-allow-external-name";
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
    /// its ExternalName Services are mirrored (annotation [`ALLOW_EXTERNAL_NAME_KEY`])
    pub allow_external_name: bool,
}

/// Pure: the remote a Secret describes, or why it describes none.
pub fn read_secret(s: &Secret) -> Result<Candidate, String> {
    let secret_name = s.name_any();
    let name = s
        .labels()
        .get(NAME_KEY)
        .or_else(|| s.annotations().get(NAME_KEY))
        .cloned()
        .unwrap_or(secret_name);
    // as --cluster-name: it is recorded in annotations and metric labels, never a label
    if name.is_empty() || name.len() > 253 || name.chars().any(char::is_control) {
        return Err(format!(
            "the remote name {name:?} ({NAME_KEY}, or the Secret's name) must be 1 to 253 printable characters"
        ));
    }
    let text = kubeconfig_text(s)?;
    let kubeconfig = Kubeconfig::from_yaml(&text)
        .map_err(|e| format!("{DATA_KEY:?} is not a kubeconfig: {}", one_line(e)))?;
    let stale_after = match s.annotations().get(STALE_AFTER_KEY) {
        Some(v) => crate::span::parse_optional(v)
            .map_err(|e| format!("annotation {STALE_AFTER_KEY}: {e}"))?,
        None => None,
    };
    let allow_external_name = match s
        .annotations()
        .get(ALLOW_EXTERNAL_NAME_KEY)
        .map(String::as_str)
    {
        None | Some("false") => false,
        Some("true") => true,
        Some(other) => {
            return Err(format!(
                "annotation {ALLOW_EXTERNAL_NAME_KEY}: {other:?} is neither \"true\" nor \"false\""
            ));
        }
    };
    let mut policy = stale_after.map_or(String::new(), |d| d.as_secs().to_string());
    if allow_external_name {
        // only when set, so the hash of a Secret without it is what it was (no rotation)
        policy.push_str("\nexternal-name");
    }
    Ok(Candidate {
        name,
        kubeconfig,
        hash: hex::encode(Sha256::digest(format!("{text}\n{policy}").as_bytes())),
        stale_after,
        allow_external_name,
    })
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
    fn a_changed_kubeconfig_has_another_hash() {
        let a = read_secret(&secret(json!({}), Some(KUBECONFIG))).unwrap();
        let rotated = KUBECONFIG.replace("abc", "def");
        let b = read_secret(&secret(json!({}), Some(&rotated))).unwrap();
        assert_ne!(a.hash, b.hash);
    }
}
