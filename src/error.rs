//! The crate's error type, with a bounded category for metrics and Sentry tags.
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// Bad flags, kubeconfig or contexts: the daemon stops at start with this one line.
    #[error("configuration: {0}")]
    Config(String),
    /// A state of the cluster that a later pass resolves (an object that kept changing under
    /// us, a namespace just created): retried with back-off; not the user's to fix.
    #[error("retrying: {0}")]
    Retry(String),
    /// What the API server returned lacks what every object has (a uid, a resourceVersion):
    /// the write is refused before it is sent.
    #[error("unexpected object: {0}")]
    Unexpected(String),
    #[error("kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("timed out: {0}")]
    Timeout(String),
    #[error("not the leader: write refused")]
    NotLeader,
    #[error("admin server: {0}")]
    Admin(#[from] std::io::Error),
    #[error("scheduler: {0}")]
    Scheduler(String),
    #[error(transparent)]
    Cache(#[from] crate::state::cache::CacheError),
    /// A remote Secret's kubeconfig holds more than inline data (see `secret_kubeconfig`).
    #[error("{0}")]
    Refused(String),
    /// A long-lived task ended before shutdown (see the supervisor).
    #[error("{0}")]
    TaskEnded(String),
    /// A reconcile pass panicked; its key was released and is retried.
    #[error("reconcile panicked: {0}")]
    Panic(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short, bounded category (never an object name) for metric labels and Sentry tags.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Config(_) => "config",
            Error::Retry(_) => "retry",
            Error::Unexpected(_) => "unexpected",
            Error::Kube(e) => kube_category(e),
            Error::Timeout(_) => "timeout",
            Error::NotLeader => "not_leader",
            Error::Admin(_) => "admin",
            Error::Scheduler(_) => "scheduler",
            Error::Cache(_) => "cache",
            Error::Panic(_) => "panic",
            Error::Refused(_) => "refused",
            Error::TaskEnded(_) => "task_ended",
        }
    }

    /// The HTTP status of an API error, if this is one.
    pub fn api_code(&self) -> Option<u16> {
        match self {
            Error::Kube(kube::Error::Api(s)) => Some(s.code),
            _ => None,
        }
    }
}

/// An error with its causes, on one line: `a: b: c`. Connection errors name their cause only in
/// the chain (a TLS failure displays as just `client error (Connect)`); a cause whose text the
/// line already holds is not repeated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut line = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !line.contains(&text) {
            line.push_str(": ");
            line.push_str(&text);
        }
        cause = c.source();
    }
    line.replace('\n', " ")
}

pub fn kube_category(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            401 => "unauthorized",
            403 => "forbidden",
            404 => "not_found",
            409 => "conflict",
            410 => "gone",
            422 => "invalid",
            429 => "throttled",
            500..=599 => "server_error",
            _ => "api_error",
        },
        kube::Error::HyperError(_) | kube::Error::Service(_) => "connection",
        _ => "client",
    }
}
