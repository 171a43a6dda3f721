//! A work queue of keys: a key waits at most once (bursts collapse into one pass), is never
//! handed to two workers at once, and a key that changes while being processed runs again after.
use std::collections::{HashSet, VecDeque};
use std::hash::Hash;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use tokio::sync::Notify;

struct State<K> {
    queue: VecDeque<K>,
    queued: HashSet<K>,
    processing: HashSet<K>,
    /// changed while processing: re-queued when done
    dirty: HashSet<K>,
    closed: bool,
}

pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashSet::new(),
                dirty: HashSet::new(),
                closed: false,
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State<K>> {
        // a worker that panicked mid-update leaves only sets of keys behind: still usable
        self.state.lock()
    }

    pub fn add(&self, key: K) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.processing.contains(&key) {
            s.dirty.insert(key);
            return;
        }
        if s.queued.insert(key.clone()) {
            s.queue.push_back(key);
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Adds the key after a delay (back-off on error).
    pub fn add_after(self: &Arc<Self>, key: K, delay: Duration) {
        let q = Arc::clone(self);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            q.add(key);
        });
    }

    /// The next key to process, or None once the queue is closed and drained.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.queued.remove(&key);
                    s.processing.insert(key.clone());
                    if !s.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
                if s.closed {
                    return None;
                }
            }
            notified.await;
        }
    }

    /// Marks the key processed; if it changed meanwhile it is queued again.
    pub fn done(&self, key: &K) {
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.remove(key) && s.queued.insert(key.clone()) {
            s.queue.push_back(key.clone());
            drop(s);
            self.notify.notify_one();
        }
    }

    pub fn len(&self) -> usize {
        self.lock().queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stops accepting keys; workers finish what is queued.
    pub fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bursts_collapse_into_one_pass() {
        let q = WorkQueue::new();
        for _ in 0..100 {
            q.add("a");
        }
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.next().await, Some("a"));
        assert_eq!(q.next().await, Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_in_process_is_not_handed_out_again_until_done() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.next().await.unwrap();
        q.add("a"); // changed while processing
        q.add("a");
        assert!(q.is_empty(), "not queued while a worker holds it");
        q.done(&k);
        assert_eq!(q.len(), 1, "queued once more after done");
        assert_eq!(q.next().await, Some("a"));
        q.done(&"a");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn close_drains_then_ends() {
        let q = WorkQueue::new();
        q.add(1);
        q.close();
        q.add(2);
        assert_eq!(q.next().await, Some(1));
        assert_eq!(q.next().await, None);
    }

    #[tokio::test]
    async fn a_waiting_worker_wakes_on_add() {
        let q = WorkQueue::new();
        let q2 = Arc::clone(&q);
        let h = tokio::spawn(async move { q2.next().await });
        tokio::task::yield_now().await;
        q.add(7);
        assert_eq!(h.await.unwrap(), Some(7));
    }
}
