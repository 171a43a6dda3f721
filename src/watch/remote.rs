//! A remote's watches: its exported Services, their slices, and the slices other managers wrote.
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::{spawn, spec};
use crate::reconcile::worker::Controller;
use crate::runtime::supervisor::Supervisor;
use crate::state::Member;

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
    let m = &ctl.ctx.metrics;
    let s = || Arc::clone(state);
    let services = spec::<Service>(c, ns, timeout, exported.clone(), name, what("Services"));
    spawn(sup, m, stop, services, (s(), |s| &s.services), on_change());
    let slices = spec::<EndpointSlice>(c, ns, timeout, exported, name, what("EndpointSlices"));
    spawn(sup, m, stop, slices, (s(), |s| &s.slices), on_change());
    let other = what("EndpointSlices of other managers");
    let foreign = spec::<EndpointSlice>(c, ns, timeout, foreign, name, other);
    spawn(
        sup,
        m,
        stop,
        foreign,
        (s(), |s| &s.foreign_slices),
        on_change(),
    );
}
