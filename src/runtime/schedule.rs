//! The sweep schedule: a cron expression whose every tick wakes the sweeper.
use std::sync::Arc;

use tokio::sync::Notify;
use tokio_cron_scheduler::{Job, JobScheduler};

use crate::error::{Error, Result};

/// The sweep schedule: each cron tick wakes the sweeper.
pub async fn start(cron: &str, sweep_now: &Arc<Notify>) -> Result<JobScheduler> {
    let scheduler = JobScheduler::new()
        .await
        .map_err(|source| Error::Scheduler { source })?;
    let wake = Arc::clone(sweep_now);
    let job = Job::new(cron, move |_, _| wake.notify_one())
        .map_err(|source| Error::Scheduler { source })?;
    scheduler
        .add(job)
        .await
        .map_err(|source| Error::Scheduler { source })?;
    scheduler
        .start()
        .await
        .map_err(|source| Error::Scheduler { source })?;
    Ok(scheduler)
}
