//! Reconciling: the pass over one key, the one proof of absence, the one writer, the sweeper,
//! the workers, and full passes on a Lease gain.
pub mod ctx;
mod mcs;
mod pass;
pub mod proof;
pub mod resync;
pub mod sweep;
pub mod worker;
pub mod writer;

pub use ctx::{Cached, Ctx, EventLimiter, Key, McsSettings, Mode, Settings};
pub use pass::reconcile;
