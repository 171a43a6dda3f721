//! Which name a cluster goes by in the ClusterSet (KEP-2149).

use super::types::ClusterProperty;
use crate::desired::meta;

/// The well-known ClusterProperty holding this cluster's id within its ClusterSet.
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";

/// Longest name a cluster may go by: it is a label value (63) and a DNS name component.
const CLUSTER_NAME_MAX: usize = 63;

/// Whether `name` can name a cluster here: it becomes the value of the
/// `multicluster.kubernetes.io/source-cluster` label, an entry of `ServiceImport.status.clusters`
/// and the `<clusterid>` part of `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local`, so it
/// must be a valid label value and a lowercase RFC 1123 name (dots allowed: KEP-1645 lets a
/// cluster id be `<name>.<registry>`).
pub fn is_cluster_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= CLUSTER_NAME_MAX
        && meta::is_label_value(name)
        && meta::is_dns1123_subdomain(name)
}

/// The name this cluster goes by: the value of the ClusterProperty `cluster.clusterset.k8s.io`
/// when one is given under that name and its value can name a cluster ([`is_cluster_name`]),
/// else `fallback` (the name the daemon was configured with), returned as it is: the caller
/// checks it with [`is_cluster_name`] where it must.
pub fn cluster_name(property: Option<&ClusterProperty>, fallback: &str) -> String {
    property
        .filter(|p| p.metadata.name.as_deref() == Some(CLUSTER_ID_PROPERTY))
        .map(|p| p.spec.value.as_str())
        .filter(|value| is_cluster_name(value))
        .unwrap_or(fallback)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::mcs::types::ClusterPropertySpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn property(name: &str, value: &str) -> ClusterProperty {
        ClusterProperty {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: ClusterPropertySpec {
                value: value.into(),
            },
        }
    }

    #[test]
    fn the_property_wins_when_valid() {
        let (longest, too_long) = ("a".repeat(63), "a".repeat(64));
        let table: &[(Option<(&str, &str)>, &str)] = &[
            (Some((CLUSTER_ID_PROPERTY, "east")), "east"),
            (
                Some((CLUSTER_ID_PROPERTY, "east.registry-1")),
                "east.registry-1",
            ),
            (Some((CLUSTER_ID_PROPERTY, &longest)), &longest),
            // the fallback: no property, another property, or a value that cannot name a cluster
            (None, "fallback"),
            (Some(("clusterset.k8s.io", "my-set")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, "")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, "East")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, "east_1")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, "-east")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, "east.")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, " east")), "fallback"),
            (Some((CLUSTER_ID_PROPERTY, &too_long)), "fallback"),
        ];
        for (given, want) in table {
            let p = given.map(|(name, value)| property(name, value));
            assert_eq!(cluster_name(p.as_ref(), "fallback"), *want, "{given:?}");
        }
    }

    #[test]
    fn the_fallback_is_returned_as_given() {
        assert_eq!(cluster_name(None, "Not_A_Label"), "Not_A_Label");
        assert!(!is_cluster_name("Not_A_Label"));
        assert!(is_cluster_name("west-2"));
        assert!(!is_cluster_name(""));
    }
}
