//! Caches of what the watches have seen, remote and local, and the set of remotes they belong to.
pub mod budget;
pub mod cache;
pub mod local;
pub mod mcs;
pub mod networks;
pub mod rate;
pub mod ready;
pub mod remote;
pub mod remotes;
pub mod service_ips;

/// The local cluster's name wherever a cluster is named beside the remotes (metric labels,
/// request counters, the MCS source of the local exports). No remote may take it: a Secret or a
/// static remote named so is refused at join (`remotes::remote_secret::read_secret`,
/// `client::build`), so "local" always means this cluster.
pub const LOCAL: &str = "local";

pub use cache::{Cache, CacheError, GroupKey};
pub use local::LocalState;
pub use mcs::{McsCluster, McsLocal, McsNamespace, McsView, Property};
pub use networks::Networks;
pub use ready::{Flag, Signals};
pub use remote::{Credential, RemoteState};
pub use remotes::{Member, Origin, Remotes};
