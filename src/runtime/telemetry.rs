//! Logging (human-readable, or JSON when ENV=production; RUST_LOG filters) and Sentry
//! (SENTRY_DSN; environment from ENV; release from the crate version).
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Keeps Sentry flushing until dropped at exit.
pub struct Telemetry {
    _sentry: Option<sentry::ClientInitGuard>,
}

pub fn environment() -> String {
    std::env::var("ENV")
        .ok()
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| "development".into())
}

pub fn is_production() -> bool {
    environment() == "production"
}

/// Sentry client options: what is sent and what never is (no default PII, so no request
/// headers, tokens or IPs).
pub fn sentry_options() -> sentry::ClientOptions {
    let mut o = sentry::ClientOptions::default();
    o.release = Some(concat!("cross-cluster-controller@", env!("CARGO_PKG_VERSION")).into());
    o.environment = Some(environment().into());
    o.send_default_pii = false;
    o.attach_stacktrace = true;
    o
}

/// Our own error-level lines become Sentry events; info, warn and libraries' error lines ride
/// along as breadcrumbs. (The Kubernetes client logs every failed request at error level: as
/// events, a remote outage would send one per retry.)
pub fn sentry_layer<S>() -> impl Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use sentry::integrations::tracing::{BreadcrumbLayer, ErrorLayer};
    use tracing_subscriber::filter::{LevelFilter, filter_fn};
    ErrorLayer::new()
        .with_filter(filter_fn(|md| {
            *md.level() == tracing::Level::ERROR
                && md.target().starts_with(env!("CARGO_CRATE_NAME"))
        }))
        .and_then(BreadcrumbLayer::new().with_filter(LevelFilter::INFO))
}

pub fn init() -> Telemetry {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        EnvFilter::new("info,kube_runtime=warn,kube_client=warn,tokio_cron_scheduler=warn")
    });
    let sentry_guard = std::env::var("SENTRY_DSN")
        .ok()
        .filter(|d| !d.is_empty())
        .map(|dsn| sentry::init((dsn, sentry_options())));
    let sentry_layers = sentry_guard.as_ref().map(|_| sentry_layer());
    let registry = tracing_subscriber::registry()
        .with(filter)
        .with(sentry_layers);
    if is_production() {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_current_span(false),
            )
            .init();
    } else {
        // colours only on a terminal: `kubectl logs` and log files get plain text
        use std::io::IsTerminal;
        let ansi = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_target(false)
                    .with_ansi(ansi),
            )
            .init();
    }
    Telemetry {
        _sentry: sentry_guard,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_becomes_a_sentry_event_with_release_and_environment() {
        let events = sentry::test::with_captured_events_options(
            || {
                let subscriber = tracing_subscriber::registry().with(sentry_layer());
                tracing::subscriber::with_default(subscriber, || {
                    tracing::info!("context line");
                    tracing::error!(category = "forbidden", "reconcile keeps failing");
                    // a library's error line (kube-client logs each failed request) is context
                    tracing::error!(target: "kube_client::client", "failed with error client error (Connect)");
                });
            },
            sentry_options(),
        );
        assert_eq!(events.len(), 1, "one event for the one error line");
        assert!(
            format!("{:?}", events[0]).contains("reconcile keeps failing"),
            "the event is our line, not the library's"
        );
        let ev = &events[0];
        assert_eq!(
            ev.release.as_deref(),
            Some(concat!(
                "cross-cluster-controller@",
                env!("CARGO_PKG_VERSION")
            ))
        );
        assert_eq!(ev.environment.as_deref(), Some(environment().as_str()));
        let text = format!("{ev:?}");
        assert!(text.contains("reconcile keeps failing"), "{text}");
        assert!(
            text.contains("context line"),
            "info lines ride along as breadcrumbs: {text}"
        );
    }

    #[test]
    fn an_api_error_reported_to_sentry_carries_no_token() {
        let token = "test-bearer-token-0123456789abcdef0123456789";
        let events = sentry::test::with_captured_events_options(
            || {
                let subscriber = tracing_subscriber::registry().with(sentry_layer());
                tracing::subscriber::with_default(subscriber, || {
                    let rt = tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async {
                        let mut cfg = kube::Config::new("https://127.0.0.1:1".parse().unwrap());
                        cfg.auth_info.token = Some(token.to_string().into());
                        let client = kube::Client::try_from(cfg).unwrap();
                        let api: kube::Api<k8s_openapi::api::core::v1::Service> =
                            kube::Api::all(client);
                        let err = api.list(&Default::default()).await.unwrap_err();
                        tracing::error!(
                            error = %err,
                            tags.category = crate::error::kube_category(&err),
                            tags.remote = "east",
                            "remote listing failed"
                        );
                    });
                });
            },
            sentry_options(),
        );
        // kube-client may report the failure too: every event is checked
        let json = serde_json::to_string(&events).unwrap();
        assert!(
            json.contains("remote listing failed"),
            "the error is reported: {json}"
        );
        assert!(
            json.contains("\"category\":\"connection\""),
            "tagged with a bounded category: {json}"
        );
        assert!(
            !json.contains(token),
            "no token in any Sentry event: {json}"
        );
        assert!(
            !json.contains("Bearer"),
            "no Authorization header either: {json}"
        );
    }
}
