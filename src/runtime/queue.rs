//! A work queue of keys: a key waits at most once (bursts collapse into one pass), is never
//! handed to two workers at once, and a key that changes while being processed runs again after.
//!
//! Fair between sources: each key is added in a *lane* (a remote's name: the cluster whose
//! change queued it; [`OWN`] for the daemon's own work: full passes, local changes, retries),
//! and the workers take the lanes' keys in turn, one from each lane with work. A remote that
//! changes thousands of keys a second fills its own lane; another remote's change waits for
//! at most one key of each busy lane, not for the whole backlog (issue 37, item 7). A key
//! queued in two lanes (a merged follower that two remotes changed) waits in both and runs once,
//! at the first of its turns.
//!
//! Taking turns is not enough on its own: a pass's writes wait at the local API server behind
//! every write in flight there, and a busy lane would keep every worker writing. So a lane other
//! than [`OWN`] has at most `lane_cap` keys in process at once ([`WorkQueue::with_lane_cap`]);
//! past it the lane waits for one of its keys to be done, and the other workers stay free for
//! the other lanes. The daemon's own lane is not capped: its full passes are everyone's.
//!
//! A key added after a delay (a retry's back-off) waits in the queue's own `DelayQueue`, not in
//! a task of its own: one task ([`WorkQueue::delays`], supervised) moves each key into the queue
//! when its delay has passed. A key waits there at most once, by the earliest of its delays.
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::poll_fn;
use std::hash::Hash;
use std::sync::Arc;
use std::task::Poll;

use parking_lot::Mutex;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tokio_util::time::{DelayQueue, delay_queue};

/// The lane of the daemon's own work (full passes, local changes, retries).
pub const OWN: &str = "";

/// One source's keys, in the order they were added. An entry whose key was taken through
/// another lane stays here until its turn comes, and is passed over then.
struct Lane<K> {
    keys: VecDeque<K>,
    members: HashSet<K>,
}

struct State<K> {
    /// each lane with keys in it
    lanes: HashMap<Arc<str>, Lane<K>>,
    /// the lanes with keys, in turn
    turns: VecDeque<Arc<str>>,
    /// the keys waiting (each in one lane at least)
    queued: HashSet<K>,
    /// each key in process, and the lane it was taken through
    processing: HashMap<K, Arc<str>>,
    /// the keys in process of each lane that has some
    running: HashMap<Arc<str>, usize>,
    /// the most keys of one lane (not [`OWN`]) in process at once; 0: no cap
    lane_cap: usize,
    /// changed while processing: re-queued when done, in the lane of the first change
    dirty: HashMap<K, Arc<str>>,
    /// keys added after a delay, until it passes
    delayed: DelayQueue<K>,
    /// each delayed key's entry in `delayed`
    waiting: HashMap<K, delay_queue::Key>,
    closed: bool,
}

impl<K: Clone + Eq + Hash> State<K> {
    /// Queues `key` in `lane` (not in process); true when it was not waiting before.
    fn enter(&mut self, lane: &str, key: K) -> bool {
        let fresh = self.queued.insert(key.clone());
        let lane_keys = match self.lanes.get_mut(lane) {
            Some(l) => l,
            None => {
                let name: Arc<str> = lane.into();
                self.turns.push_back(name.clone());
                self.lanes.entry(name).or_insert_with(|| Lane {
                    keys: VecDeque::new(),
                    members: HashSet::new(),
                })
            }
        };
        if lane_keys.members.insert(key.clone()) {
            lane_keys.keys.push_back(key);
        }
        fresh
    }

    /// Whether `lane` has as many keys in process as it may have.
    fn full(&self, lane: &str) -> bool {
        self.lane_cap > 0
            && lane != OWN
            && self.running.get(lane).is_some_and(|n| *n >= self.lane_cap)
    }

    /// The first waiting key of the lane whose turn it is; that lane goes to the back of the
    /// turns while it has keys. Entries of keys taken through another lane are passed over; a
    /// lane that is [`Self::full`] keeps its keys and its place, and waits for its next turn.
    /// Returns the key and the lane it was taken through.
    fn take(&mut self) -> Option<(K, Arc<str>)> {
        for _ in 0..self.turns.len() {
            let Some(name) = self.turns.pop_front() else {
                break;
            };
            if self.full(&name) {
                self.turns.push_back(name);
                continue;
            }
            let Some(lane) = self.lanes.get_mut(&name) else {
                continue;
            };
            let mut found = None;
            while let Some(key) = lane.keys.pop_front() {
                lane.members.remove(&key);
                if self.queued.remove(&key) {
                    found = Some(key);
                    break;
                }
            }
            if lane.keys.is_empty() {
                self.lanes.remove(&name);
            } else {
                self.turns.push_back(name.clone());
            }
            if let Some(key) = found {
                return Some((key, name));
            }
        }
        None
    }

    /// The key is in process, taken through `lane`.
    fn start(&mut self, key: K, lane: Arc<str>) {
        *self.running.entry(lane.clone()).or_default() += 1;
        self.processing.insert(key, lane);
    }

    /// The key is processed; true when its lane was full and has keys waiting, which a worker
    /// can take now.
    fn finish(&mut self, key: &K) -> bool {
        let Some(lane) = self.processing.remove(key) else {
            return false;
        };
        let was_full = self.full(&lane);
        if let Some(n) = self.running.get_mut(&lane) {
            *n -= 1;
            if *n == 0 {
                self.running.remove(&lane);
            }
        }
        was_full && self.lanes.contains_key(&lane)
    }
}

pub struct WorkQueue<K> {
    state: Mutex<State<K>>,
    notify: Notify,
}

impl<K: Clone + Eq + Hash + Send + 'static> WorkQueue<K> {
    /// A queue whose lanes are not capped.
    pub fn new() -> Arc<Self> {
        Self::with_lane_cap(0)
    }

    /// A queue in which a lane other than [`OWN`] has at most `cap` keys in process at once
    /// (0: no cap).
    pub fn with_lane_cap(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                lanes: HashMap::new(),
                turns: VecDeque::new(),
                queued: HashSet::new(),
                processing: HashMap::new(),
                running: HashMap::new(),
                lane_cap: cap,
                dirty: HashMap::new(),
                delayed: DelayQueue::new(),
                waiting: HashMap::new(),
                closed: false,
            }),
            notify: Notify::new(),
        })
    }

    fn lock(&self) -> parking_lot::MutexGuard<'_, State<K>> {
        // a worker that panicked mid-update leaves only sets of keys behind: still usable
        self.state.lock()
    }

    /// Adds the key in the daemon's own lane ([`OWN`]).
    pub fn add(&self, key: K) {
        self.add_in(OWN, key);
    }

    /// Adds the key in `lane`, the source whose change queued it (a remote's name).
    pub fn add_in(&self, lane: &str, key: K) {
        let mut s = self.lock();
        if s.closed {
            return;
        }
        if s.processing.contains_key(&key) {
            s.dirty.entry(key).or_insert_with(|| lane.into());
            return;
        }
        if s.enter(lane, key) {
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Adds the key after a delay (back-off on error). A key already waiting keeps the earlier
    /// of its two delays; [`WorkQueue::delays`] moves it into the queue when it has passed.
    pub fn add_after(&self, key: K, delay: Duration) {
        let when = Instant::now() + delay;
        let mut s = self.lock();
        if s.closed {
            return;
        }
        match s.waiting.get(&key).copied() {
            Some(entry) if s.delayed.deadline(&entry) <= when => {}
            Some(entry) => s.delayed.reset_at(&entry, when),
            None => {
                let entry = s.delayed.insert_at(key.clone(), when);
                s.waiting.insert(key, entry);
            }
        }
    }

    /// Moves each delayed key into the queue once its delay has passed; runs until dropped
    /// (under the supervisor, beside the workers). The only task that polls the delays: a key
    /// added with an earlier deadline wakes it.
    pub async fn delays(self: Arc<Self>) {
        loop {
            let key = poll_fn(|cx| {
                let mut s = self.lock();
                match s.delayed.poll_expired(cx) {
                    Poll::Ready(Some(expired)) => {
                        let key = expired.into_inner();
                        s.waiting.remove(&key);
                        Poll::Ready(key)
                    }
                    // none waiting: the waker is kept, and the next insert wakes it
                    Poll::Ready(None) | Poll::Pending => Poll::Pending,
                }
            })
            .await;
            self.add(key);
        }
    }

    /// Keys waiting for their delay to pass.
    pub fn delayed(&self) -> usize {
        self.lock().waiting.len()
    }

    /// The next key to process (the next lane's turn), or None once the queue is closed and
    /// drained.
    pub async fn next(&self) -> Option<K> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.lock();
                if let Some((key, lane)) = s.take() {
                    s.start(key.clone(), lane);
                    if !s.queued.is_empty() {
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
        let freed = s.finish(key);
        let again = match s.dirty.remove(key) {
            Some(lane) => s.enter(&lane, key.clone()),
            None => false,
        };
        drop(s);
        if freed || again {
            self.notify.notify_one();
        }
    }

    /// Keys waiting for a worker.
    pub fn len(&self) -> usize {
        self.lock().queued.len()
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

    #[tokio::test(start_paused = true)]
    async fn a_delayed_key_comes_back_once_after_its_earliest_delay() {
        let q = WorkQueue::new();
        tokio::spawn(Arc::clone(&q).delays());
        q.add_after("a", Duration::from_secs(10));
        q.add_after("a", Duration::from_secs(2)); // earlier: it wins
        q.add_after("a", Duration::from_secs(30)); // later: ignored
        assert_eq!(q.delayed(), 1, "waits once");
        assert!(q.is_empty(), "not before its delay");
        let start = Instant::now();
        assert_eq!(q.next().await, Some("a"));
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_secs(2) && waited < Duration::from_secs(3),
            "{waited:?}"
        );
        q.done(&"a");
        assert_eq!(
            q.delayed(),
            0,
            "the later delays were folded into the first"
        );
        tokio::time::advance(Duration::from_secs(60)).await; // past every deadline given
        tokio::task::yield_now().await;
        assert!(q.is_empty(), "it came back once");
    }

    #[tokio::test(start_paused = true)]
    async fn delayed_keys_come_back_in_deadline_order_and_collapse_with_queued_ones() {
        let q = WorkQueue::new();
        tokio::spawn(Arc::clone(&q).delays());
        q.add_after("late", Duration::from_secs(5));
        q.add_after("soon", Duration::from_secs(1));
        q.add("soon");
        assert_eq!(q.next().await, Some("soon"));
        q.done(&"soon");
        assert_eq!(q.next().await, Some("soon"), "its retry still comes");
        q.done(&"soon");
        assert_eq!(q.next().await, Some("late"));
        q.close();
        q.add_after("after close", Duration::from_secs(1));
        assert_eq!(q.delayed(), 0, "a closed queue takes nothing");
    }

    #[tokio::test]
    async fn lanes_take_turns_so_a_busy_one_delays_another_by_one_key() {
        let q = WorkQueue::new();
        for i in 0..1000 {
            q.add_in("churner", i);
        }
        q.add_in("honest", 5000);
        q.add(6000);
        assert_eq!(q.len(), 1002);
        let first: Vec<_> = [q.next().await, q.next().await, q.next().await].into();
        assert_eq!(
            first,
            [Some(0), Some(5000), Some(6000)],
            "one key of each lane in turn"
        );
        assert_eq!(q.next().await, Some(1), "then the churner's backlog");
        q.add_in("honest", 5001);
        assert_eq!(q.next().await, Some(2), "the lane whose turn it was");
        assert_eq!(
            q.next().await,
            Some(5001),
            "then the new lane's, before the backlog"
        );
        assert_eq!(q.next().await, Some(3));
    }

    #[tokio::test]
    async fn a_key_in_two_lanes_runs_once_at_its_first_turn() {
        let q = WorkQueue::new();
        q.add_in("a", "x");
        q.add_in("a", "merged");
        q.add_in("b", "merged");
        assert_eq!(q.len(), 2, "waits once");
        assert_eq!(q.next().await, Some("x"));
        assert_eq!(q.next().await, Some("merged"), "b's turn");
        assert_eq!(q.len(), 0);
        q.done(&"merged");
        q.add_in("a", "y");
        assert_eq!(
            q.next().await,
            Some("y"),
            "a's old entry of merged is passed over"
        );
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_changed_while_in_process_comes_back_in_its_lane() {
        let q = WorkQueue::new();
        q.add_in("a", 1);
        assert_eq!(q.next().await, Some(1));
        q.add_in("b", 1);
        for i in 10..13 {
            q.add_in("a", i);
        }
        q.done(&1);
        assert_eq!(q.next().await, Some(10));
        assert_eq!(q.next().await, Some(1), "b's turn, not after a's backlog");
    }

    #[tokio::test]
    async fn a_lane_has_at_most_its_cap_in_process_and_leaves_the_other_workers_free() {
        let q = WorkQueue::with_lane_cap(2);
        for i in 0..100 {
            q.add_in("churner", i);
        }
        let (a, b) = (q.next().await, q.next().await);
        assert_eq!((a, b), (Some(0), Some(1)));
        let third = tokio::time::timeout(Duration::from_millis(50), q.next()).await;
        assert!(
            third.is_err(),
            "a full lane hands out nothing more: {third:?}"
        );
        q.add_in("honest", 5000);
        q.add(6000);
        assert_eq!(q.next().await, Some(5000), "another lane's key is taken");
        assert_eq!(q.next().await, Some(6000), "and the daemon's own");
        for i in 7000..7003 {
            q.add(i);
        }
        for i in 7000..7003 {
            assert_eq!(
                q.next().await,
                Some(i),
                "the daemon's own lane is not capped"
            );
        }
        q.done(&0);
        assert_eq!(q.next().await, Some(2), "one done, one more of the lane");
        assert_eq!(q.len(), 97);
    }

    #[tokio::test]
    async fn a_worker_waiting_on_a_full_lane_wakes_when_one_of_its_keys_is_done() {
        let q = WorkQueue::with_lane_cap(1);
        q.add_in("a", 1);
        q.add_in("a", 2);
        assert_eq!(q.next().await, Some(1));
        let q2 = Arc::clone(&q);
        let waiting = tokio::spawn(async move { q2.next().await });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the lane is full");
        q.done(&1);
        let took = tokio::time::timeout(Duration::from_secs(5), waiting).await;
        assert_eq!(took.ok().and_then(Result::ok), Some(Some(2)));
    }

    #[tokio::test]
    async fn a_key_changed_in_process_comes_back_in_a_full_lane_and_waits_its_turn() {
        let q = WorkQueue::with_lane_cap(1);
        q.add_in("a", 1);
        assert_eq!(q.next().await, Some(1));
        q.add_in("a", 1); // changed while processing: dirty
        q.add_in("a", 2);
        q.done(&1);
        assert_eq!(q.next().await, Some(2), "the lane's first waiting key");
        let next = tokio::time::timeout(Duration::from_millis(50), q.next()).await;
        assert!(next.is_err(), "1 waits for 2 to be done: {next:?}");
        q.done(&2);
        assert_eq!(q.next().await, Some(1));
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
