//! What a reconcile pass did, for metrics and logs.

#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Applied,
    Deleted,
    Unchanged,
    Skipped(&'static str),
    Conflict,
    NotReady,
    /// the follower Service was left as it is: the remote its fields come from has no Service
    /// update left for now (`--remote-max-service-updates-per-second`); the key comes back
    /// after this long (what changed meanwhile is written once then)
    Deferred(std::time::Duration),
}

/// The skip reason of an exported Service whose local namespace does not exist (yet).
/// The skip reason of an exported Service whose namespace does not exist locally.
pub const NAMESPACE_MISSING: &str = "NamespaceMissing";
/// The skip reason of an exported Service in a namespace the daemon never writes in
/// (`--protected-namespaces`).
pub const NAMESPACE_PROTECTED: &str = "NamespaceProtected";
/// The skip reason of an exported Service whose namespace or name is a top-level domain
/// (`desired::names`): its follower would make local look-ups of public names answer.
pub const PUBLIC_NAME_REFUSED: &str = "PublicNameRefused";

/// The skip reason of a new follower that waits for a ClusterIP: its remote (or all remotes
/// together) holds its share of the local Service range.
pub const SERVICE_IPS_LIMITED: &str = "ServiceIpsLimited";

impl Outcome {
    /// Every label [`Outcome::label`] returns, `error` (a pass that failed) and `not_leader`
    /// (a key set aside because this replica no longer leads).
    pub const LABELS: [&'static str; 9] = [
        "applied",
        "deleted",
        "unchanged",
        "skipped",
        "conflict",
        "not_ready",
        "deferred",
        "error",
        "not_leader",
    ];

    pub fn label(&self) -> &'static str {
        match self {
            Outcome::Applied => "applied",
            Outcome::Deleted => "deleted",
            Outcome::Unchanged => "unchanged",
            Outcome::Skipped(_) => "skipped",
            Outcome::Conflict => "conflict",
            Outcome::NotReady => "not_ready",
            Outcome::Deferred(_) => "deferred",
        }
    }
}
