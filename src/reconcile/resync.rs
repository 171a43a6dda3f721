//! Full passes: when this replica gains the Lease (sweep, then every exported Service of each
//! remote once its caches are complete), and when a remote joins a running leader.
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tracing::info;

use super::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::{GroupKey, RemoteState};

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
                while ctl.leader.is_leader() && !mcs.ready() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
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
                let mut pending = ctl.ctx.remotes.states();
                while !pending.is_empty() && ctl.leader.is_leader() {
                    // keys dropped meanwhile (by a remote that stays unready, say) are not held
                    // back: every remote already passed is passed again
                    if ctl.take_dropped() {
                        pending = ctl.ctx.remotes.states();
                    }
                    pending.retain(|s| !when_ready(&ctl, s));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
            if leader.changed().await.is_err() {
                // the election ended: the supervisor reports it; nothing to resync meanwhile
                std::future::pending::<()>().await;
            }
        }
    });
}
