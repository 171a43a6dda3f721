//! Opt-in policy for long remote outages (per remote, default off). An API-server outage is not
//! a data-plane outage: by default a remote that cannot be read keeps its last known endpoints
//! and nothing is deleted. With a `stale_after` set, once the remote has been unreachable that
//! long its endpoints in every follower are marked `ready: false, serving: false`, so kube-proxy
//! sends traffic to the other remotes' endpoints; the first healthy state after it returns
//! restores them. It never deletes anything.
//!
//! Flapping is damped: after a restore, the remote must stay healthy for `stale_after` before an
//! outage can mark it again (an outage that starts earlier leaves its endpoints as they are).
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kube::runtime::events::EventType;
use tracing::{info, warn};

use crate::reconcile::worker::Controller;
use crate::runtime::metrics::ByRemoteTo;
use crate::state::RemoteState;
use crate::state::cache::GroupKey;

/// What a step changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Marked,
    Restored,
}

/// One remote's state under the policy (pure: fed the remote's health and the time).
#[derive(Clone, Debug)]
pub struct Damper {
    stale_after: Duration,
    down_since: Option<Instant>,
    healthy_since: Option<Instant>,
    marked: bool,
    /// whether an outage may mark now: at first, and once healthy for `stale_after` after a
    /// restore
    armed: bool,
    /// whether the current outage started armed
    outage_armed: bool,
}

impl Damper {
    pub fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            down_since: None,
            healthy_since: None,
            marked: false,
            armed: true,
            outage_armed: false,
        }
    }

    pub fn marked(&self) -> bool {
        self.marked
    }

    pub fn step(&mut self, healthy: bool, now: Instant) -> Option<Transition> {
        if healthy {
            self.down_since = None;
            let since = *self.healthy_since.get_or_insert(now);
            if self.marked {
                self.marked = false;
                self.armed = false;
                self.healthy_since = Some(now);
                return Some(Transition::Restored);
            }
            if !self.armed && now.duration_since(since) >= self.stale_after {
                self.armed = true;
            }
            return None;
        }
        self.healthy_since = None;
        let since = match self.down_since {
            Some(s) => s,
            None => {
                self.down_since = Some(now);
                self.outage_armed = self.armed;
                now
            }
        };
        if !self.marked && self.outage_armed && now.duration_since(since) >= self.stale_after {
            self.marked = true;
            return Some(Transition::Marked);
        }
        None
    }
}

/// Follows every remote that has the policy: marks and restores, queues the keys it exports,
/// and reports each transition (log, Event, metrics).
pub async fn run(ctl: Arc<Controller>) {
    let mut dampers: HashMap<Arc<str>, Damper> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let members = ctl.remotes().states();
        dampers.retain(|name, _| members.iter().any(|m| m.name == *name));
        for s in members {
            let Some(after) = s.stale_after else {
                continue;
            };
            let d = dampers
                .entry(Arc::clone(&s.name))
                .or_insert_with(|| Damper::new(after));
            let healthy = s.ready() && s.problem().is_none();
            let Some(t) = d.step(healthy, Instant::now()) else {
                continue;
            };
            let to = match t {
                Transition::Marked => "marked",
                Transition::Restored => "restored",
            };
            ctl.metrics()
                .remote_stale_transitions
                .get_or_create(&ByRemoteTo::new(&s.name, to))
                .inc();
            transitioned(&ctl, &s, &s.marked, t, after, &STALE).await;
        }
    }
}

/// How a policy words its transitions: the Events' reasons and action, the log and Event text.
pub(super) struct Words {
    pub action: &'static str,
    pub marked: &'static str,
    pub restored: &'static str,
    /// (remote, seconds of its setting)
    pub marked_note: fn(&str, u64) -> String,
    pub restored_note: fn(&str) -> String,
}

const STALE: Words = Words {
    action: "OutagePolicy",
    marked: "RemoteStale",
    restored: "RemoteRestored",
    marked_note: |remote, secs| {
        format!(
            "remote {remote} unreachable for {secs}s: its endpoints are marked not ready in every follower (nothing deleted)"
        )
    },
    restored_note: |remote| format!("remote {remote} is back: its endpoints are restored"),
};

/// After a transition of one of the remote's marks (`mark`: the outage policy's, the probe's):
/// stored, said (log; an Event from the leader), what it changes queued, and the health Leases
/// told at once.
pub(super) async fn transitioned(
    ctl: &Controller,
    s: &RemoteState,
    mark: &AtomicBool,
    t: Transition,
    after: Duration,
    words: &Words,
) {
    mark.store(t == Transition::Marked, Ordering::SeqCst);
    let remote = &*s.name;
    let (type_, reason, note) = match t {
        Transition::Marked => {
            let note = (words.marked_note)(remote, after.as_secs());
            warn!(remote, after_s = after.as_secs(), "{note}");
            (EventType::Warning, words.marked, note)
        }
        Transition::Restored => {
            let note = (words.restored_note)(remote);
            info!(remote, "{note}");
            (EventType::Normal, words.restored, note)
        }
    };
    if ctl.is_leader() {
        ctl.event(type_, reason, note, words.action, None).await;
    }
    requeue(ctl, s);
    ctl.remotes().health_changed();
}

/// Queues every key the remote exports, in both modes (its Services with the label, its
/// ServiceExports): what publishing its endpoints as not ready, or restoring them, changes.
pub(super) fn requeue(ctl: &Controller, s: &RemoteState) {
    let keys: Vec<GroupKey> = s.services.read().keys().cloned().collect();
    ctl.enqueue(keys);
    if let Some(mcs) = &s.mcs {
        ctl.enqueue_mcs(mcs.exported());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn a_marking_queues_what_the_remote_exports_in_both_modes() {
        use crate::fixtures::{self, loaded, obj};
        use crate::reconcile::{Key, Mode};
        use serde_json::json;
        let remote = RemoteState::new("east", fixtures::opts(), vec![]).with_mcs(true, Some("id"));
        let labelled = json!({"metadata": {"namespace": "shop", "name": "web"}});
        loaded(&remote.services, [obj(labelled)]);
        let mcs = remote.mcs.clone().unwrap();
        let exported = json!({"metadata": {"namespace": "shop", "name": "db"}});
        loaded(&mcs.exports, [obj(exported)]);
        let remote = Arc::new(remote);
        let (client, _api) = fixtures::client("local");
        let (_tx, leadership) = fixtures::leadership(true);
        let local = Arc::new(crate::state::LocalState::default());
        let ctx = fixtures::ctx(client, leadership.clone(), vec![Arc::clone(&remote)], local);
        let queue = crate::runtime::queue::WorkQueue::new();
        let ctl = Controller::new(Arc::new(ctx), Arc::clone(&queue), leadership);
        requeue(&ctl, &remote);
        queue.close();
        let mut keys = Vec::new();
        while let Some(k) = queue.next().await {
            keys.push(k);
        }
        let key = |mode, name: &str| Key {
            mode,
            namespace: "shop".into(),
            name: name.into(),
        };
        // its Service with the label (the label mode), its ServiceExport (the MCS API)
        assert_eq!(keys, [key(Mode::Follower, "web"), key(Mode::Mcs, "db")]);
    }

    fn at(t0: Instant, secs: u64) -> Instant {
        t0 + Duration::from_secs(secs)
    }

    #[test]
    fn a_long_outage_marks_and_the_return_restores() {
        let t0 = Instant::now();
        let mut d = Damper::new(AFTER);
        assert_eq!(d.step(true, t0), None);
        assert_eq!(d.step(false, at(t0, 10)), None);
        assert_eq!(d.step(false, at(t0, 69)), None, "not yet stale_after");
        assert_eq!(d.step(false, at(t0, 70)), Some(Transition::Marked));
        assert_eq!(d.step(false, at(t0, 200)), None, "once");
        assert_eq!(d.step(true, at(t0, 201)), Some(Transition::Restored));
        assert!(!d.marked());
    }

    #[test]
    fn short_outages_never_mark() {
        let t0 = Instant::now();
        let mut d = Damper::new(AFTER);
        for i in 0..10 {
            assert_eq!(d.step(false, at(t0, i * 40)), None);
            assert_eq!(d.step(true, at(t0, i * 40 + 30)), None);
        }
    }

    #[test]
    fn after_a_restore_the_remote_must_stay_healthy_before_marking_again() {
        let t0 = Instant::now();
        let mut d = Damper::new(AFTER);
        d.step(false, t0);
        assert_eq!(d.step(false, at(t0, 60)), Some(Transition::Marked));
        assert_eq!(d.step(true, at(t0, 61)), Some(Transition::Restored));
        // down again 10 s later: this outage does not mark, however long
        assert_eq!(d.step(false, at(t0, 71)), None);
        assert_eq!(d.step(false, at(t0, 500)), None, "flapping is damped");
        // healthy for stale_after: armed again
        assert_eq!(d.step(true, at(t0, 501)), None);
        assert_eq!(d.step(true, at(t0, 561)), None);
        assert_eq!(d.step(false, at(t0, 562)), None);
        assert_eq!(d.step(false, at(t0, 622)), Some(Transition::Marked));
    }

    #[test]
    fn marking_sets_ready_and_serving_false_and_keeps_terminating() {
        use crate::desired::not_ready;
        use k8s_openapi::api::discovery::v1::EndpointSlice;
        let s: EndpointSlice = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "terminating": true}},
                          {"addresses": ["10.0.0.2"]}]}))
        .unwrap();
        let m = not_ready(&s);
        for e in &m.endpoints {
            let c = e.conditions.as_ref().unwrap();
            assert_eq!((c.ready, c.serving), (Some(false), Some(false)));
        }
        assert_eq!(
            m.endpoints[0].conditions.as_ref().unwrap().terminating,
            Some(true)
        );
    }
}
