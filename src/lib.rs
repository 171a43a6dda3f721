//! cross-cluster-controller: mirrors labelled Services of remote clusters into the local one.
//!
//! Data flows one way: watches ([`watch`]) -> caches ([`state`]) -> the work queue -> pure
//! desired state ([`desired`]) -> the one writer ([`reconcile`]). The rooms, from the bottom up
//! (a room imports only from rooms below it; see docs/architecture.md):
//! - [`desired`]: pure functions from what the remotes export to what the local cluster holds;
//! - [`error`]: the crate's error type;
//! - [`client`]: Kubernetes clients, the remote-Secret kubeconfig policy, paginated listing;
//! - [`state`]: the caches, remote and local, and the set of remotes;
//! - [`runtime`]: process plumbing: supervisor, queue, Lease, metrics, admin server, telemetry;
//! - [`reconcile`]: the pass, the one writer, the sweeper, the workers;
//! - [`watch`]: watches that fill the caches and queue what changed;
//! - [`remotes`]: joining and leaving remotes (flags, Secrets), their health, credentials, outages;
//! - [`daemon`]: wiring only;
//! - [`cli`]: flags and the `status` and `remote-access` subcommands.
pub mod cli;
pub mod client;
pub mod daemon;
pub mod desired;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod reconcile;
pub mod remotes;
pub mod runtime;
pub mod span;
pub mod state;
pub mod watch;

pub use error::{Error, Result};
