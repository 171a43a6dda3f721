//! Process plumbing, free of the domain: supervised tasks, the work queue, the Lease, metrics,
//! the admin server and telemetry.
pub mod admin;
pub mod lease;
pub mod metrics;
pub mod queue;
pub mod schedule;
pub mod series;
pub mod signals;
pub mod supervisor;
pub mod telemetry;
