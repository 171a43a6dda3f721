//! cross-cluster-controller: mirrors labelled Services of a remote cluster into the local one.
//!
//! Data flows one way: remote watches -> [`cache`] -> pure [`desired`] state -> the local writer.
pub mod admin;
pub mod app;
pub mod args;
pub mod cache;
pub mod clients;
pub mod credentials;
pub mod desired;
pub mod error;
#[cfg(test)]
mod fixtures;
pub mod health;
pub mod lease;
pub mod metrics;
pub mod outage;
pub mod queue;
pub mod reconcile;
pub mod registry;
pub mod remote_access;
pub mod remote_secrets;
pub mod secret_kubeconfig;
pub mod status;
pub mod supervisor;
pub mod sweeper;
pub mod telemetry;
pub mod watch;
pub mod worker;
pub mod writer;

pub use error::{Error, Result};
