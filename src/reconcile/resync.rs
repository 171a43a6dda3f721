//! Full passes: when this replica gains the Lease (sweep, then every exported Service of each
//! remote once its caches are complete), and when a remote joins a running leader.
//!
//! Nothing here polls: each wait is on the readiness of the caches it needs ([`Signals`]) and on
//! the Lease's publications, and judges its condition again at each change.
use std::sync::Arc;

use tokio::sync::Notify;
use tracing::info;

use super::worker::Controller;
use crate::runtime::lease::Leadership;
use crate::runtime::supervisor::Supervisor;
use crate::state::{GroupKey, RemoteState, Signals};

/// Queues every exported Service of a remote, and every local follower (one this remote's listing may
/// now prove gone), if it and the local caches have completed a listing (and this replica
/// leads); false while they have not.
pub fn when_ready(ctl: &Controller, s: &RemoteState) -> bool {
    if !(ctl.leader.is_leader() && ctl.ctx.local.ready() && s.ready()) {
        return false;
    }
    let keys: Vec<GroupKey> = s.services.read().keys().cloned().collect();
    let followers: Vec<GroupKey> = ctl.ctx.local.services.read().keys().cloned().collect();
    info!(remote = %s.name, exported = keys.len(), followers = followers.len(), "caches synced; reconciling every exported Service and follower");
    ctl.enqueue(keys);
    ctl.enqueue(followers);
    true
}

/// Waits for a change that may let a condition pass: one of `signals`, or a publication of the
/// Lease (a gain, a renewal, a loss; an election that ended returns at once, and is no longer
/// the leader).
async fn next_change(signals: &mut Signals, leader: &mut Leadership) {
    tokio::select! {
        _ = signals.changed() => {}
        _ = leader.changed() => {}
    }
}

/// What [`when_ready`] for these remotes rests on: the local caches and theirs.
fn readiness(ctl: &Controller, remotes: &[Arc<RemoteState>]) -> Signals {
    let mut signals = ctl.ctx.local.readiness();
    for s in remotes {
        signals.extend(s.readiness());
    }
    signals
}

/// A remote that joined: [`when_ready`] once its caches and the local ones are complete, while
/// this replica leads (a standby has nothing to do: its next leadership gain reconciles every
/// remote).
pub async fn when_joined(ctl: &Controller, s: &Arc<RemoteState>) {
    let mut leader = ctl.leader.clone();
    let mut signals = readiness(ctl, std::slice::from_ref(s));
    while ctl.leader.is_leader() && !when_ready(ctl, s) {
        next_change(&mut signals, &mut leader).await;
    }
}

/// With `--mcs`, on every leadership gain: every MCS key once the local MCS caches are complete
/// (an MCS pass before that returns NotReady; those caches never become incomplete again, and
/// each remote's exports are queued by its own listings as they complete). Apart from the label
/// mode's resync, so that neither waits for the other.
pub fn mcs_on_gain(sup: &Supervisor, ctl: &Arc<Controller>) {
    let Some(mcs) = ctl.ctx.mcs.clone() else {
        return;
    };
    let ctl = Arc::clone(ctl);
    let mut leader = ctl.leader.clone();
    sup.spawn_until_shutdown("MCS resync on leadership gain", async move {
        let mut was_leader = false;
        loop {
            let leading = leader.is_leader();
            if leading && !was_leader {
                // its own view of the Lease: `leader` still sees every publication after this
                let mut watching = ctl.leader.clone();
                let mut signals = mcs.readiness();
                while ctl.leader.is_leader() && !mcs.ready() {
                    next_change(&mut signals, &mut watching).await;
                }
                if ctl.leader.is_leader() {
                    info!("MCS caches synced; reconciling every export and import");
                    ctl.enqueue_all_mcs();
                }
            }
            was_leader = leading;
            if leader.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    });
}

/// On every leadership gain: sweep (fresh listings, no cache needed), and reconcile every leader
/// of each remote as soon as that remote's caches are complete; a broken remote does not hold
/// the others back.
pub fn on_gain(sup: &Supervisor, ctl: &Arc<Controller>, sweep_now: &Arc<Notify>) {
    let ctl = Arc::clone(ctl);
    let sweep_now = Arc::clone(sweep_now);
    let mut leader = ctl.leader.clone();
    sup.spawn_until_shutdown("resync on leadership gain", async move {
        let mut was_leader = false;
        loop {
            // every renewal is published: a gain, or a renewal after keys were dropped (a Lease
            // that lapsed unseen between two renewals), starts a full pass
            let leading = leader.is_leader();
            let gained = leading && !was_leader;
            let redo = leading && ctl.take_dropped();
            was_leader = leading;
            if gained {
                sweep_now.notify_one();
            }
            if gained || redo {
                pass_every_remote(&ctl).await;
            }
            if leader.changed().await.is_err() {
                // the election ended: the supervisor reports it; nothing to resync meanwhile
                std::future::pending::<()>().await;
            }
        }
    });
}

/// Passes every remote once its caches (and the local ones) are complete, while this replica
/// leads; a broken remote does not hold the others back.
async fn pass_every_remote(ctl: &Controller) {
    let mut pending = ctl.ctx.remotes.states();
    let mut signals = readiness(ctl, &pending);
    // its own view of the Lease: the caller's still sees every publication after this
    let mut leader = ctl.leader.clone();
    while !pending.is_empty() && ctl.leader.is_leader() {
        // keys dropped meanwhile (by a remote that stays unready, say) are not held back:
        // every remote already passed is passed again
        if ctl.take_dropped() {
            pending = ctl.ctx.remotes.states();
            signals = readiness(ctl, &pending);
        }
        pending.retain(|s| !when_ready(ctl, s));
        if !pending.is_empty() {
            next_change(&mut signals, &mut leader).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, loaded};
    use crate::runtime::queue::WorkQueue;
    use k8s_openapi::api::core::v1::Service;

    fn exported(name: &str) -> Service {
        fixtures::obj(serde_json::json!({"metadata": {
            "namespace": "shop", "name": name, "resourceVersion": "1",
            "labels": {crate::desired::DEFAULT_LABEL_KEY: "true"},
        }}))
    }

    #[tokio::test]
    async fn a_joined_remote_is_passed_once_its_caches_complete_and_not_before() {
        let (client, _api) = fixtures::client("local");
        let (_tx, leadership) = fixtures::leadership(true);
        let remote = Arc::new(RemoteState::new(fixtures::REMOTE, fixtures::opts(), vec![]));
        let local = Arc::new(crate::state::LocalState::default().networks_listed());
        let ctx = fixtures::ctx(client, leadership.clone(), vec![Arc::clone(&remote)], local);
        let ctl = Arc::new(Controller::new(Arc::new(ctx), WorkQueue::new(), leadership));
        let (c, r) = (Arc::clone(&ctl), Arc::clone(&remote));
        let waiting = tokio::spawn(async move { when_joined(&c, &r).await });
        tokio::task::yield_now().await;
        loaded(&ctl.ctx.local.services, []);
        loaded(&ctl.ctx.local.slices, []);
        loaded(&ctl.ctx.local.endpoints, []);
        loaded(&remote.services, [exported("web")]);
        loaded(&remote.slices, []);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "one remote cache still unlisted");
        assert!(ctl.queue.is_empty());
        loaded(&remote.foreign_slices, []);
        fixtures::within("the first pass once every cache is listed", waiting)
            .await
            .unwrap();
        assert_eq!(ctl.queue.len(), 1, "its one exported Service");
    }
}
