//! The sweep schedule: a cron expression whose every tick wakes the sweeper. tokio-cron-scheduler
//! is the one cron API here: it checks the expression at start-up ([`check`]) and keeps the
//! time; the schedule runs as a supervised task like every other.
use std::sync::Arc;

use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_cron_scheduler::{Job, JobScheduler};
use tracing::warn;

use super::supervisor::Supervisor;
use crate::error::{Error, Result};

/// Whether the scheduler reads `cron` (six fields with seconds, or seven with a year) as a
/// schedule: the check the flags make before anything starts.
pub fn check(cron: &str) -> bool {
    Job::new(cron, |_, _| {}).is_ok()
}

/// Starts the schedule (an error here stops the start-up) and supervises it: the task "sweep
/// schedule" passes each tick on to the sweeper, and shuts the scheduler down at shutdown. A
/// scheduler that stops ticking on its own (its job gone) ends the task, which the supervisor
/// reports.
pub async fn spawn(
    sup: &Supervisor,
    cron: &str,
    sweep_now: &Arc<Notify>,
) -> Result<JoinHandle<()>> {
    let scheduler = JobScheduler::new().await.map_err(failed)?;
    // one tick waiting is enough: ticks while the sweeper is busy collapse, as on a Notify
    let (tick, mut ticks) = mpsc::channel::<()>(1);
    let job = Job::new(cron, move |_, _| {
        let _ = tick.try_send(());
    })
    .map_err(failed)?;
    scheduler.add(job).await.map_err(failed)?;
    scheduler.start().await.map_err(failed)?;
    let (stop, wake) = (sup.shutdown_token(), Arc::clone(sweep_now));
    Ok(sup.spawn("sweep schedule", async move {
        let mut scheduler = scheduler;
        loop {
            tokio::select! {
                _ = stop.cancelled() => {
                    if let Err(e) = scheduler.shutdown().await {
                        warn!(error = %e, "sweep schedule did not shut down cleanly");
                    }
                    return;
                }
                tick = ticks.recv() => match tick {
                    Some(()) => wake.notify_one(),
                    None => return,
                },
            }
        }
    }))
}

fn failed(source: tokio_cron_scheduler::JobSchedulerError) -> Error {
    Error::Scheduler { source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheduler_checks_six_and_seven_fields_and_refuses_the_rest() {
        for good in [
            "0 */5 * * * *",
            "*/2 * * * * *",
            "0 0 3 * * Mon",
            "0 0 0 1 1 * 2030",
        ] {
            assert!(check(good), "{good}");
        }
        for bad in ["99 * * * * *", "every minute", "*/5 * * * *", ""] {
            assert!(!check(bad), "{bad}");
        }
    }

    #[tokio::test]
    async fn each_tick_wakes_the_sweeper_and_shutdown_ends_the_task_cleanly() {
        let sup = Supervisor::new(tokio_util::sync::CancellationToken::new());
        let sweep_now = Arc::new(Notify::new());
        let task = spawn(&sup, "* * * * * *", &sweep_now)
            .await
            .expect("started");
        crate::fixtures::within("a tick to wake the sweeper", sweep_now.notified()).await;
        sup.shutdown_token().cancel();
        crate::fixtures::within("the schedule to stop", task)
            .await
            .expect("joined");
        assert_eq!(sup.failure(), None);
    }
}
