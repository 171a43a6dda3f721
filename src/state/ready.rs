//! Readiness as a value one awaits: each cache (and the local networks, and a cluster's MCS
//! name) holds a [`Flag`] that the side that lists sets, and a task that needs it waits on
//! [`Signals`] instead of polling. The shape of kube-runtime's `Store::wait_until_ready`, except
//! that a flag may fall back to false (a remote over budget has its caches dropped), so a waiter
//! judges its own condition again at every change.
use futures::FutureExt;
use futures::future::{BoxFuture, select_all};
use tokio::sync::watch;

/// One readiness flag: false until set.
#[derive(Debug)]
pub struct Flag(watch::Sender<bool>);

impl Default for Flag {
    fn default() -> Self {
        Self(watch::Sender::new(false))
    }
}

impl Flag {
    /// Sets it; a change wakes every [`Signals`] that follows it.
    pub fn set(&self, ready: bool) {
        self.0
            .send_if_modified(|r| std::mem::replace(r, ready) != ready);
    }

    pub fn get(&self) -> bool {
        *self.0.borrow()
    }

    /// Follows its changes.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.0.subscribe()
    }
}

/// The flags one condition rests on, and whatever else may change it (a leadership change).
/// Subscribe first, then judge the condition, then wait: a change in between is not lost.
#[derive(Default)]
pub struct Signals {
    flags: Vec<watch::Receiver<bool>>,
}

impl Signals {
    pub fn new(flags: impl IntoIterator<Item = watch::Receiver<bool>>) -> Self {
        Self {
            flags: flags.into_iter().collect(),
        }
    }

    pub fn extend(&mut self, flags: impl IntoIterator<Item = watch::Receiver<bool>>) {
        self.flags.extend(flags);
    }

    /// Returns once one of the flags changed since it was subscribed or last seen here. A flag
    /// whose owner is gone never changes again; with none left, this waits for ever.
    pub async fn changed(&mut self) {
        self.flags.retain(|f| f.has_changed().is_ok());
        if self.flags.is_empty() {
            return std::future::pending().await;
        }
        let waits: Vec<BoxFuture<'_, ()>> = self
            .flags
            .iter_mut()
            .map(|f| f.changed().map(|_| ()).boxed())
            .collect();
        select_all(waits).await;
    }

    /// Waits until `ready` holds, judged now and at every change of a flag.
    pub async fn until(&mut self, ready: impl Fn() -> bool) {
        while !ready() {
            self.changed().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn a_waiter_wakes_when_its_flags_are_all_set_and_not_before() {
        let (a, b) = (Arc::new(Flag::default()), Arc::new(Flag::default()));
        let mut signals = Signals::new([a.watch(), b.watch()]);
        let (a2, b2) = (Arc::clone(&a), Arc::clone(&b));
        let waiter = tokio::spawn(async move { signals.until(|| a2.get() && b2.get()).await });
        a.set(true);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one of two flags set");
        b.set(true);
        crate::fixtures::within("the waiter to see both flags", waiter)
            .await
            .unwrap();
    }

    #[tokio::test]
    async fn a_change_between_judging_and_waiting_is_not_lost() {
        let flag = Flag::default();
        let mut signals = Signals::new([flag.watch()]);
        assert!(!flag.get());
        flag.set(true); // before the wait begins
        crate::fixtures::within("the change seen", signals.changed()).await;
    }

    #[tokio::test]
    async fn setting_the_same_value_wakes_nobody_and_a_flag_can_fall_back() {
        let flag = Flag::default();
        let mut rx = flag.watch();
        flag.set(false);
        assert!(!rx.has_changed().unwrap());
        flag.set(true);
        flag.set(false);
        assert!(rx.has_changed().unwrap());
        assert!(!*rx.borrow_and_update());
    }
}
