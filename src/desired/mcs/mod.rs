//! The Multi-Cluster Services API (KEP-1645, mcs-api v0.5.0), pure: its objects and the name a
//! cluster goes by ([`cluster_name`]). Nothing here performs I/O; it imports only from
//! `desired` and external crates.

mod cluster;
mod error;
mod types;

pub use cluster::{CLUSTER_ID_PROPERTY, cluster_name, is_cluster_name};
pub use error::McsError;
pub use types::*;
