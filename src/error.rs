//! The crate's error type, with a bounded category for metrics and Sentry tags.
//!
//! The category is the variant's name in snake_case (strum's `IntoStaticStr`), so a new variant
//! has its category without anyone writing it down; only a Kubernetes API error is refined by
//! its status code ([`kube_category`]).
use thiserror::Error;

#[derive(Debug, Error, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
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
    /// The admin server could not serve (built only by `runtime::admin`: an I/O error elsewhere
    /// is not the admin server's).
    #[error("admin server: {source}")]
    Admin { source: std::io::Error },
    #[error("scheduler: {source}")]
    Scheduler {
        source: tokio_cron_scheduler::JobSchedulerError,
    },
    #[error(transparent)]
    Cache(#[from] crate::state::cache::CacheError),
    /// A remote Secret's kubeconfig holds more than inline data (see `client::policy`).
    #[error("{0}")]
    Refused(String),
    /// A long-lived task ended before shutdown (see the supervisor).
    #[error("{0}")]
    TaskEnded(String),
    /// A reconcile pass panicked; its key was released and is retried.
    #[error("reconcile panicked: {0}")]
    Panic(String),
}

/// How a write's namespace is gone (see [`Error::namespace_gone`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NamespaceGone {
    /// It does not exist.
    Missing,
    /// It is being deleted: it refuses every create until it is gone.
    Terminating,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A short, bounded category (never an object name) for metric labels and Sentry tags.
    pub fn category(&self) -> &'static str {
        match self {
            Error::Kube(e) => kube_category(e),
            other => other.into(),
        }
    }

    /// Whether a write was refused because its namespace is gone: it does not exist (404 on a
    /// create) or is being deleted (403 "... because it is being terminated"). The one rule of
    /// both passes (the label follower's and the MCS import's): a namespace going away is not
    /// an error to retry.
    pub fn namespace_gone(&self) -> Option<NamespaceGone> {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 404 => Some(NamespaceGone::Missing),
            Error::Kube(kube::Error::Api(s))
                if s.code == 403 && s.message.contains("being terminated") =>
            {
                Some(NamespaceGone::Terminating)
            }
            _ => None,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_are_the_variants_names_in_snake_case() {
        // the labels the metrics and Sentry tags have always carried
        let cases = [
            (Error::Config("x".into()), "config"),
            (Error::Retry("x".into()), "retry"),
            (Error::Unexpected("x".into()), "unexpected"),
            (Error::Timeout("x".into()), "timeout"),
            (Error::NotLeader, "not_leader"),
            (
                Error::Admin {
                    source: std::io::Error::other("x"),
                },
                "admin",
            ),
            (Error::Refused("x".into()), "refused"),
            (Error::TaskEnded("x".into()), "task_ended"),
            (Error::Panic("x".into()), "panic"),
        ];
        for (e, category) in cases {
            assert_eq!(e.category(), category, "{e}");
        }
        let gone = kube::Error::Api(
            kube::core::Status::failure("gone", "NotFound")
                .with_code(404)
                .boxed(),
        );
        assert_eq!(Error::Kube(gone).category(), "not_found");
    }

    #[test]
    fn an_io_error_is_not_the_admin_servers_unless_the_admin_server_says_so() {
        // no `From<io::Error>`: `?` on an I/O error elsewhere does not compile into `Admin`
        let e = Error::Admin {
            source: std::io::Error::other("address in use"),
        };
        assert_eq!(e.to_string(), "admin server: address in use");
    }
}
