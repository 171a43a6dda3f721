//! A remote's watches: its exported Services, their slices, and the slices other managers wrote,
//! each kept to the remote's budget.
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{Guard, Target, spawn_guarded, spec};
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::{Member, RemoteState};

/// A remote's watches keep to its budget.
impl Guard for RemoteState {
    fn hold(&self) -> Result<(), String> {
        self.budget.hold(std::time::Instant::now())
    }

    fn epoch(&self) -> u64 {
        self.budget.epoch()
    }

    fn admit(&self, seen: u64) -> Result<(), String> {
        RemoteState::admit(self, seen)
    }

    fn listed(&self) {
        RemoteState::listed(self);
    }
}

/// Starts the three watches of a member, each ending when the member leaves.
pub fn start(sup: &Supervisor, ctl: &Arc<Controller>, member: &Member, timeout: u32) {
    let (state, stop) = (&member.state, &member.cancel);
    let on_change = || {
        let (ctl, name) = (Arc::clone(ctl), Arc::clone(&state.name));
        move |keys| ctl.remote_changed(&name, keys)
    };
    let (c, name, ns) = (&member.client, &*state.name, &state.namespaces[..]);
    let what = |kind: &str| format!("remote {name} {kind}");
    let exported = state.opts.export_selector();
    let foreign = state.opts.foreign_slice_selector();
    let m = ctl.metrics();
    let s = || Arc::clone(state);
    let guard = || Some(Arc::clone(state) as Arc<dyn Guard>);
    let services = spec::<Service>(c, ns, timeout, exported.clone(), name, what("Services"));
    let into: Target<RemoteState, Service> = (s(), |s| &s.services);
    spawn_guarded(sup, m, stop, services, into, on_change(), None, guard());
    let slices = spec::<EndpointSlice>(c, ns, timeout, exported, name, what("EndpointSlices"));
    let into: Target<RemoteState, EndpointSlice> = (s(), |s| &s.slices);
    spawn_guarded(sup, m, stop, slices, into, on_change(), None, guard());
    let other = what("EndpointSlices of other managers");
    let foreign = spec::<EndpointSlice>(c, ns, timeout, foreign, name, other);
    let into: Target<RemoteState, EndpointSlice> = (s(), |s| &s.foreign_slices);
    spawn_guarded(sup, m, stop, foreign, into, on_change(), None, guard());
}
