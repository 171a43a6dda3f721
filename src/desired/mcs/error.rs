//! Why the MCS judgement of a key cannot be made: each one is a configuration or input error
//! that a later pass with the same inputs would meet again.

/// The one error type of `desired::mcs`.
#[derive(
    Clone, Debug, PartialEq, Eq, thiserror::Error, strum::IntoStaticStr, strum::VariantNames,
)]
pub enum McsError {
    /// A cluster name that cannot be a label value and a DNS name (see `is_cluster_name`).
    #[error("cluster name {0:?} is not a lowercase RFC 1123 name of at most 63 characters")]
    InvalidClusterName(String),
    /// Two exports claim the same cluster name (two clusters with one ClusterProperty value).
    #[error("two exports name the same cluster {0:?}")]
    DuplicateCluster(String),
    /// An export of another namespace/name was handed to the judgement of this one.
    #[error("cluster {cluster:?} hands in the export {found:?}, not {expected:?}")]
    OtherKey {
        cluster: String,
        expected: String,
        found: String,
    },
    /// The local cluster has no ServiceExport among the exports.
    #[error("cluster {0:?} has no ServiceExport among the exports")]
    NoLocalExport(String),
}

impl McsError {
    /// Every reason [`McsError::reason`] returns: the variants' names.
    pub const REASONS: &'static [&'static str] = <Self as strum::VariantNames>::VARIANTS;

    /// Short CamelCase reason, usable as an Event reason and a metric label: the variant's name.
    pub fn reason(&self) -> &'static str {
        self.into()
    }
}
