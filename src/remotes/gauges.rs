//! Per-remote gauges, refreshed every second: followers, export conflicts, health, time since
//! the last complete listing, credential expiry, over budget.
use std::sync::Arc;
use std::time::Duration;

use crate::desired::ConflictKind;
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::{ByRemote, ByRemoteKind};
use crate::runtime::supervisor::Supervisor;

/// Gauges: followers, remote health.
pub fn spawn(sup: &Supervisor, ctl: &Arc<Controller>) {
    let ctl = Arc::clone(ctl);
    sup.spawn_until_shutdown("gauges", async move {
        loop {
            let m = &ctl.ctx.metrics;
            let conflicts = ctl.ctx.conflict_counts();
            for s in ctl.ctx.remotes.states() {
                let remote = ByRemote::new(&s.name);
                let n = s.exported_in_scope();
                m.followers.get_or_create(&remote).set(n as i64);
                for kind in ConflictKind::LABELS {
                    let n = conflicts
                        .get(&(s.name.to_string(), kind))
                        .copied()
                        .unwrap_or(0);
                    m.export_conflicts
                        .get_or_create(&ByRemoteKind::new(&s.name, kind))
                        .set(n);
                }
                m.remote_up
                    .get_or_create(&remote)
                    .set(i64::from(s.problem().is_none()));
                m.over_budget
                    .get_or_create(&remote)
                    .set(i64::from(s.over_budget()));
                if let Some(secs) = s.seconds_since_list() {
                    m.since_list.get_or_create(&remote).set(secs);
                }
                if let Some(exp) = s.credential.get().and_then(|c| c.expiry) {
                    m.credential_expiry
                        .get_or_create(&remote)
                        .set(exp.as_second());
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
}
