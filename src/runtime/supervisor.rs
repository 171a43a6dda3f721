//! Every long-lived task (watches, workers, sweeper, lease, admin server) runs under the
//! supervisor. A task is meant to run until shutdown; if one ends before that, whether it
//! returned or panicked, the supervisor logs which one and why, records it, and starts the
//! shutdown, so the process exits non-zero and its orchestrator restarts it, instead of running on
//! with a part missing (a dead watch would freeze a remote; a dead lease task would leave the
//! others writing without a Lease).
use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use parking_lot::Mutex;

use futures::FutureExt;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::error;

#[derive(Clone)]
pub struct Supervisor {
    shutdown: CancellationToken,
    failure: Arc<Mutex<Option<String>>>,
}

impl Supervisor {
    pub fn new(shutdown: CancellationToken) -> Self {
        Self {
            shutdown,
            failure: Arc::default(),
        }
    }

    /// Spawns a task that must run until shutdown.
    pub fn spawn<F>(&self, name: impl Into<String>, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_expecting(name, self.shutdown.clone(), task)
    }

    /// Spawns a task of one part that can stop on its own (a remote that leaves): it runs until
    /// `stop` (a child of the shutdown token) is cancelled, when it is dropped where it stands.
    /// Ending before that is a failure, as for every task.
    pub fn spawn_until<F>(
        &self,
        name: impl Into<String>,
        stop: CancellationToken,
        task: F,
    ) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let until = stop.clone();
        self.spawn_expecting(name, stop, async move {
            tokio::select! {
                _ = until.cancelled() => {}
                _ = task => {}
            }
        })
    }

    /// Spawns a task that may end only once `stop` is cancelled.
    fn spawn_expecting<F>(
        &self,
        name: impl Into<String>,
        stop: CancellationToken,
        task: F,
    ) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let name = name.into();
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = AssertUnwindSafe(task).catch_unwind().await;
            if stop.is_cancelled() || this.shutdown.is_cancelled() {
                return;
            }
            let why = match outcome {
                Ok(()) => "returned".to_string(),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            this.fail(format!("task {name:?} ended unexpectedly ({why})"));
        })
    }

    /// Spawns a task that runs until shutdown, when it is dropped where it stands (watches,
    /// the sweeper, gauges: nothing of theirs needs draining).
    pub fn spawn_until_shutdown<F>(&self, name: impl Into<String>, task: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.spawn_until(name, self.shutdown.clone(), task)
    }

    /// A token cancelled by shutdown or on its own (one remote's tasks).
    pub fn child_token(&self) -> CancellationToken {
        self.shutdown.child_token()
    }

    /// The process's shutdown.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Records the first failure and starts the shutdown.
    pub fn fail(&self, why: String) {
        error!("{why}; shutting down");
        self.failure.lock().get_or_insert(why);
        self.shutdown.cancel();
    }

    /// The first task that ended unexpectedly, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().clone()
    }
}

/// The text of a panic payload (`panic!("...")` gives a &str or a String).
pub fn panic_message(panic: &(dyn Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn cancelled(s: &CancellationToken) -> bool {
        tokio::time::timeout(Duration::from_secs(5), s.cancelled())
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn a_task_that_returns_early_shuts_everything_down() {
        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(shutdown.clone());
        sup.spawn("watch", async {});
        assert!(cancelled(&shutdown).await);
        let why = sup.failure().expect("recorded");
        assert!(
            why.contains("\"watch\"") && why.contains("returned"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_task_that_panics_shuts_everything_down_with_the_message() {
        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(shutdown.clone());
        sup.spawn("lease", async { panic!("boom") });
        assert!(cancelled(&shutdown).await);
        let why = sup.failure().expect("recorded");
        assert!(why.contains("\"lease\"") && why.contains("boom"), "{why}");
    }

    #[tokio::test]
    async fn a_task_until_shutdown_that_ends_early_is_a_failure_and_one_cut_by_shutdown_is_not() {
        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(shutdown.clone());
        let forever = sup.spawn_until_shutdown("gauges", std::future::pending());
        shutdown.cancel();
        forever.await.expect("joined");
        assert_eq!(sup.failure(), None);

        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(shutdown.clone());
        sup.spawn_until_shutdown("sweeper", async {});
        assert!(cancelled(&shutdown).await);
        assert!(sup.failure().is_some_and(|w| w.contains("\"sweeper\"")));
    }

    #[tokio::test]
    async fn tasks_ending_after_shutdown_are_not_failures() {
        let shutdown = CancellationToken::new();
        let sup = Supervisor::new(shutdown.clone());
        let s = shutdown.clone();
        let h = sup.spawn("worker", async move { s.cancelled().await });
        shutdown.cancel();
        h.await.expect("joined");
        assert_eq!(sup.failure(), None);
    }
}
