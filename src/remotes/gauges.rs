//! Per-remote gauges, read at each scrape from the set of remotes: followers, export conflicts,
//! health, over budget, time since the last complete listing, credential expiry, the outage
//! policy's mark and a refused MCS name. A remote that left is not in the set, so it has none.
use std::sync::{Arc, Weak};

use crate::desired::ConflictKind;
use crate::desired::mcs::Grant;
use crate::reconcile::worker::Controller;
use crate::runtime::metrics::RemoteReading;

/// Hands the metrics a reader of the set of remotes (it holds the controller weakly: the
/// controller owns the metrics).
pub fn publish(ctl: &Arc<Controller>) {
    let weak = Arc::downgrade(ctl);
    ctl.metrics().remote_gauges.read_with(move || read(&weak));
}

fn read(ctl: &Weak<Controller>) -> Vec<RemoteReading> {
    let Some(ctl) = ctl.upgrade() else {
        return Vec::new();
    };
    let conflicts = ctl.conflict_counts();
    let states = ctl.remotes().states();
    states
        .iter()
        .map(|s| RemoteReading {
            remote: s.name.to_string(),
            followers: s.exported_in_scope() as i64,
            export_conflicts: ConflictKind::LABELS
                .into_iter()
                .map(|kind| {
                    let n = conflicts.get(&(s.name.to_string(), kind)).copied();
                    (kind, n.unwrap_or(0))
                })
                .collect(),
            up: s.problem().is_none(),
            over_budget: s.over_budget(),
            seconds_since_list: s.seconds_since_list(),
            credential_expiry: s
                .credential
                .get()
                .and_then(|c| c.expiry)
                .map(|t| t.as_second()),
            stale: s
                .stale_after
                .map(|_| s.marked.load(std::sync::atomic::Ordering::SeqCst)),
            cut_off: s.probe_after.map(|_| s.is_cut_off()),
            mcs_name_refused: s
                .mcs
                .as_ref()
                .map(|c| matches!(c.grant(), Grant::Refused { .. })),
            write_limited: s.write_limited().0 as i64,
        })
        .collect()
}
