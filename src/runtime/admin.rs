//! The admin server: /healthz (alive), /readyz (every cache has completed its first listing;
//! the body says which are not), /metrics (Prometheus text).
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::runtime::metrics::Metrics;
use crate::runtime::supervisor::Supervisor;
use crate::state::LocalState;
use crate::state::Remotes;

pub struct AdminState {
    pub metrics: Arc<Metrics>,
    pub remotes: Arc<Remotes>,
    pub local: Arc<LocalState>,
    /// the Multi-Cluster Services API's local caches (`--mcs`)
    pub mcs: Option<Arc<crate::state::McsLocal>>,
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let mut lines = Vec::new();
    let mut ready = true;
    for r in s.remotes.states() {
        match r.problem() {
            None => lines.push(format!("remote {}: synced", r.name)),
            Some(why) => {
                ready = false;
                lines.push(format!("remote {}: not ready: {why}", r.name));
            }
        }
    }
    for (source, why) in s.remotes.problems() {
        ready = false;
        lines.push(format!("{source}: {why}"));
    }
    match s.local.networks.problem() {
        None => {
            let (addresses, nets) = s.local.networks.current().size();
            lines.push(format!(
                "local networks: listed ({addresses} addresses, {nets} networks no remote may claim)"
            ));
        }
        Some(why) => lines.push(format!("local networks: not listed: {why}")),
    }
    let ok = s.local.ready();
    ready &= ok;
    lines.push(format!(
        "local followers: {}",
        if ok { "synced" } else { "not synced" }
    ));
    if let Some(mcs) = &s.mcs {
        match mcs.problem() {
            None => lines.push("local MCS: synced".into()),
            Some(why) => {
                ready = false;
                lines.push(format!("local MCS: not ready: {why}"));
            }
        }
    }
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, lines.join("\n") + "\n")
}

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    shutdown: CancellationToken,
) -> Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await?;
    Ok(())
}

/// Serves /healthz, /readyz and /metrics until shutdown; a server that fails ends the process.
pub fn spawn(sup: &Supervisor, listener: tokio::net::TcpListener, state: AdminState) {
    let serve = serve(listener, Arc::new(state), sup.shutdown_token());
    let admin_sup = sup.clone();
    sup.spawn("admin server", async move {
        if let Err(e) = serve.await {
            admin_sup.fail(format!("admin server: {e}"));
        }
    });
}
