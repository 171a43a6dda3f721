//! The workers: take a key from the queue, reconcile it (leader only), retry failures with
//! back-off, and record the propagation lag of what was written. A pass that panics releases its
//! key (it would otherwise stay "in progress" and never run again) and is retried like an error.
use std::collections::HashMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tracing::{error, warn};

use crate::cache::GroupKey;
use crate::error::Error;
use crate::lease::Leadership;
use crate::metrics::labels;
use crate::queue::WorkQueue;
use crate::reconcile::{self, Ctx, Key, Outcome, RemoteState};
use crate::supervisor::panic_message;

pub struct Runtime {
    /// when a remote change for a key was first seen and not yet written
    pending_since: Mutex<HashMap<Key, Instant>>,
    pub ctx: Arc<Ctx>,
    pub queue: Arc<WorkQueue<Key>>,
    pub leader: Leadership,
    pub remotes: Vec<Arc<RemoteState>>,
    retries: Mutex<HashMap<Key, u32>>,
}

impl Runtime {
    pub fn new(ctx: Arc<Ctx>, queue: Arc<WorkQueue<Key>>, leader: Leadership) -> Self {
        let remotes = ctx.remotes.values().cloned().collect();
        Self {
            pending_since: Mutex::default(),
            ctx,
            queue,
            leader,
            remotes,
            retries: Mutex::default(),
        }
    }

    pub fn enqueue_remote(&self, remote: &Arc<str>, keys: Vec<GroupKey>) {
        let Some(state) = self.ctx.remotes.get(remote) else {
            return;
        };
        for (namespace, name) in keys.into_iter().filter(|k| state.in_scope(&k.0)) {
            self.queue.add(Key {
                remote: Arc::clone(remote),
                namespace,
                name,
            });
        }
    }

    /// A local change (drift, manual deletion): the key again for every remote.
    pub fn enqueue_local(&self, keys: Vec<GroupKey>) {
        for s in &self.remotes {
            self.enqueue_remote(&s.name, keys.clone());
        }
    }

    /// A remote change: remembered for the propagation-lag histogram, then queued.
    pub fn remote_changed(&self, remote: &Arc<str>, keys: Vec<GroupKey>) {
        {
            let now = Instant::now();
            let mut pending = self.pending_since.lock().unwrap_or_else(|p| p.into_inner());
            for (namespace, name) in &keys {
                let key = Key {
                    remote: Arc::clone(remote),
                    namespace: namespace.clone(),
                    name: name.clone(),
                };
                pending.entry(key).or_insert(now);
            }
        }
        self.enqueue_remote(remote, keys);
    }

    fn settled(&self, key: &Key, wrote: bool) {
        let since = self
            .pending_since
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if let (true, Some(at)) = (wrote, since) {
            self.ctx
                .metrics
                .lag
                .get_or_create(&labels([("remote", &key.remote)]))
                .observe(at.elapsed().as_secs_f64());
        }
    }

    fn retry(&self, key: Key, e: &Error) {
        let n = {
            let mut retries = self.retries.lock().unwrap_or_else(|p| p.into_inner());
            let n = retries.entry(key.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let delay = Duration::from_millis(200u64.saturating_mul(1 << n.min(9)))
            .min(Duration::from_secs(60));
        self.ctx
            .metrics
            .reconciles
            .get_or_create(&labels([("remote", &key.remote), ("outcome", "error")]))
            .inc();
        if n >= 5 || matches!(e, Error::Panic(_)) {
            error!(
                key = %key, error = %e, attempt = n,
                tags.remote = %key.remote, tags.namespace = %key.namespace, tags.kind = "Service",
                tags.category = e.category(),
                "reconcile keeps failing; retrying"
            );
        } else {
            warn!(key = %key, error = %e, category = e.category(), attempt = n, retry_in_ms = delay.as_millis() as u64, "reconcile failed; retrying");
        }
        self.queue.add_after(key, delay);
    }

    fn forget(&self, key: &Key) {
        self.retries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
    }
}

/// Runs one pass for a key and releases the key whatever happens: a panic inside the pass is
/// caught and returned as its message.
pub async fn process<K, T>(
    queue: &WorkQueue<K>,
    key: &K,
    pass: impl Future<Output = T>,
) -> Result<T, String>
where
    K: Clone + Eq + std::hash::Hash + Send + 'static,
{
    let outcome = AssertUnwindSafe(pass).catch_unwind().await;
    queue.done(key);
    outcome.map_err(|p| panic_message(p.as_ref()))
}

/// One worker: runs until the queue is closed and drained.
pub async fn run(rt: Arc<Runtime>) {
    while let Some(key) = rt.queue.next().await {
        if !rt.leader.is_leader() {
            rt.queue.done(&key);
            continue;
        }
        let result = process(&rt.queue, &key, reconcile::reconcile(&rt.ctx, &key))
            .await
            .unwrap_or_else(|panic| {
                rt.ctx
                    .metrics
                    .panics
                    .get_or_create(&labels([("remote", &key.remote)]))
                    .inc();
                Err(Error::Panic(panic))
            });
        match result {
            Ok(Outcome::NotReady) | Err(Error::NotLeader) => rt.forget(&key),
            Ok(outcome) => {
                rt.forget(&key);
                rt.settled(&key, matches!(outcome, Outcome::Applied | Outcome::Deleted));
            }
            Err(e) => rt.retry(key, &e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_pass_that_panics_releases_its_key() {
        let q = WorkQueue::new();
        q.add("a");
        let key = q.next().await.expect("queued");
        let got = process(&q, &key, async { panic!("bad object") }).await;
        assert_eq!(got, Err::<(), _>("bad object".to_string()));
        // a key still marked in progress would only be marked dirty here, never handed out
        q.add("a");
        let again = tokio::time::timeout(Duration::from_secs(1), q.next()).await;
        assert_eq!(again.ok().flatten(), Some("a"));
    }

    #[tokio::test]
    async fn a_pass_that_succeeds_releases_its_key_and_returns_its_value() {
        let q = WorkQueue::new();
        q.add(1);
        let key = q.next().await.expect("queued");
        assert_eq!(process(&q, &key, async { 7 }).await, Ok(7));
        q.add(1);
        assert_eq!(q.len(), 1);
    }
}
