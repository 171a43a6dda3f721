//! Kubernetes clients: the only place they are built (the local cluster, and each remote), the
//! policy a remote Secret's kubeconfig must pass first, and paginated, scoped listing.
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use kube::client::ClientBuilder;
use kube::client::retry::RetryPolicy;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tower::buffer::BufferLayer;
use tower::retry::RetryLayer;

pub use cluster_id::{ClusterId, NotAUuid};
use limits::{BodyLimits, LimitLayer};

use crate::error::{Error, Result};

pub mod cluster_id;
pub mod limits;
pub mod pages;
pub mod policy;

/// How clients are built: which kubeconfig and contexts, and the limits every client gets.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// local cluster from the kubeconfig (`--devmode`) instead of in-cluster configuration
    pub devmode: bool,
    pub local_context: Option<String>,
    /// the static remote's kubeconfig (`--kubeconfig`) and context
    pub kubeconfig: Option<PathBuf>,
    pub remote_context: Option<String>,
    /// the static remote's name (else its context's)
    pub cluster_name: Option<String>,
    /// connect and read limit of every request
    pub api_timeout: Duration,
    /// exec commands a remote Secret's kubeconfig may run (absolute paths)
    pub allow_exec: Vec<String>,
    /// the largest response and watch event a remote's client reads
    pub body_limits: limits::BodyLimits,
}

/// One remote cluster: its name (recorded on followers) and a read-only client.
#[derive(Clone)]
pub struct Remote {
    pub name: String,
    pub client: Client,
}

pub struct Clients {
    pub local: Client,
    /// host:port of the local API server (a remote must be another one)
    pub local_authority: String,
    /// the static remote, when `--kubeconfig` or `--remote-context` names one
    pub remotes: Vec<Remote>,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The bounded retry policy's parameters (fixed here) were refused.
    #[error("{source}")]
    Retry {
        source: kube::client::retry::InvalidBackoff,
    },
    /// kube could not build a client from the configuration (TLS material, proxy, ...).
    #[error("{source}")]
    Client { source: kube::Error },
}

/// Why a cluster's id could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ClusterIdError {
    #[error("no answer within {timeout:?}")]
    NoAnswer { timeout: Duration },
    #[error(
        "reading its cluster id (namespace kube-system): {}",
        crate::error::chain(source)
    )]
    Read { source: kube::Error },
    #[error("its kube-system namespace has no uid")]
    NoUid,
    /// The uid answered is no UUID: never recorded, logged or shown whole.
    #[error("its kube-system namespace's uid {0}")]
    NotAUuid(#[from] NotAUuid),
}

fn config_err(what: &str, e: impl std::fmt::Display) -> Error {
    // one line: kube's errors can nest causes over several lines
    let msg = e.to_string().replace('\n', " ");
    Error::Config(format!("{what}: {msg}"))
}

async fn from_kubeconfig(kc: Kubeconfig, context: Option<&str>, what: &str) -> Result<Config> {
    if let Some(ctx) = context
        && !kc.contexts.iter().any(|c| c.name == ctx)
    {
        let known: Vec<_> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
        return Err(Error::Config(format!(
            "{what}: context {ctx:?} is not in the kubeconfig (it has: {})",
            known.join(", ")
        )));
    }
    let opts = KubeConfigOptions {
        context: context.map(str::to_string),
        ..Default::default()
    };
    Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| config_err(what, e))
}

async fn read_kubeconfig(path: Option<&Path>, what: &str) -> Result<Kubeconfig> {
    match path {
        Some(p) => Kubeconfig::read_from(p)
            .map_err(|e| config_err(&format!("{what} kubeconfig {}", p.display()), e)),
        None => Kubeconfig::read().map_err(|e| config_err(&format!("{what} kubeconfig"), e)),
    }
}

/// The configuration of `context` (else the current one) in the kubeconfig at `path` (else the
/// default loading rules), with errors that name `what`.
pub async fn kubeconfig_config(
    path: Option<&Path>,
    context: Option<&str>,
    what: &str,
) -> Result<Config> {
    let kc = read_kubeconfig(path, what).await?;
    from_kubeconfig(kc, context, what).await
}

pub async fn local_config(settings: &Settings) -> Result<Config> {
    if settings.devmode {
        let kc = read_kubeconfig(None, "local (dev mode, default)").await?;
        from_kubeconfig(kc, settings.local_context.as_deref(), "local cluster").await
    } else {
        Config::incluster().map_err(|e| {
            config_err(
                "local cluster (in-cluster service account; use --devmode outside a pod)",
                e,
            )
        })
    }
}

pub async fn remote_config(settings: &Settings) -> Result<(Config, String)> {
    let kc = read_kubeconfig(settings.kubeconfig.as_deref(), "remote").await?;
    let context_name = settings
        .remote_context
        .clone()
        .or_else(|| kc.current_context.clone())
        .unwrap_or_else(|| "remote".to_string());
    let cfg = from_kubeconfig(kc, settings.remote_context.as_deref(), "remote cluster").await?;
    Ok((cfg, context_name))
}

/// host:port of an API server URL, for the "same cluster" check.
pub fn authority(cfg: &Config) -> String {
    let uri = &cfg.cluster_url;
    let host = uri
        .host()
        .unwrap_or_default()
        .trim_matches(['[', ']'])
        .to_ascii_lowercase();
    let host = if host == "localhost" {
        "127.0.0.1".to_string()
    } else {
        host
    };
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("http") {
            80
        } else {
            443
        });
    format!("{host}:{port}")
}

/// A connection attempt, and every response, must make progress within `--api-timeout-seconds`
/// (the read limit adds a margin over the server-side watch timeout, so a quiet watch that the
/// server ends on time never trips it). Without this a hanging (not refusing) API server would
/// stall a list or a watch start forever, unseen.
fn with_timeouts(mut cfg: Config, settings: &Settings) -> Config {
    cfg.connect_timeout = Some(settings.api_timeout);
    cfg.read_timeout = Some(settings.api_timeout + READ_MARGIN);
    cfg.reset_reader_on_write = true;
    cfg
}

const READ_MARGIN: std::time::Duration = std::time::Duration::from_secs(10);

/// A client whose retries of 429/503/504 are few and short: at most 6 (20 ms doubling to 2 s, or
/// the server's Retry-After), then the error goes to the reconcile, whose back-off is per key,
/// logged and counted. kube's default (15 attempts, up to 1000 s apart) holds a worker on one
/// throttled write for minutes, unlogged.
fn client_of(
    mut cfg: Config,
    limits: Option<BodyLimits>,
) -> std::result::Result<Client, BuildError> {
    cfg.default_retry = false;
    let policy = RetryPolicy::new(
        std::time::Duration::from_millis(20),
        std::time::Duration::from_secs(2),
        6,
        true,
    )
    .map_err(|source| BuildError::Retry { source })?;
    let builder = ClientBuilder::try_from(cfg).map_err(|source| BuildError::Client { source })?;
    // the retry layer clones the service it retries: a buffer makes kube's boxed stack cloneable
    // (a remote's client counts its response bodies first; `None`: the local cluster's)
    let builder = builder.with_layer(&LimitLayer(limits.unwrap_or(BodyLimits::NONE)));
    Ok(builder
        .with_layer(&BufferLayer::new(1024))
        .with_layer(&RetryLayer::new(policy))
        .build())
}

/// A client for a one-shot command (`status`): the bounded retries, a 30 s connect and read limit.
pub fn plain_client(mut cfg: Config) -> std::result::Result<Client, BuildError> {
    cfg.connect_timeout = Some(std::time::Duration::from_secs(30));
    cfg.read_timeout = Some(std::time::Duration::from_secs(30));
    client_of(cfg, None)
}

/// A remote's client from a kubeconfig held in a Secret (its current context), with the
/// daemon's timeouts, and its API server's host:port. The kubeconfig is checked first, before
/// kube reads any file it names or runs any program (see `secret_kubeconfig`); the static
/// remote's kubeconfig, chosen by the operator, is not.
pub async fn secret_remote(kc: Kubeconfig, settings: &Settings) -> Result<(Client, String)> {
    policy::check(&kc, &settings.allow_exec).map_err(|r| Error::Refused(r.to_string()))?;
    let cfg = from_kubeconfig(kc, None, "kubeconfig").await?;
    let at = authority(&cfg);
    let client = client_of(with_timeouts(cfg, settings), Some(settings.body_limits))
        .map_err(|e| config_err("client", e))?;
    Ok((client, at))
}

/// A client of a cluster the operator names by a kubeconfig file (its current context), with the
/// daemon's timeouts: the ClusterProfile hub. Trusted as the static remote's kubeconfig is.
pub async fn operator_client(path: &Path, settings: &Settings) -> Result<Client> {
    let cfg = kubeconfig_config(Some(path), None, "hub").await?;
    client_of(with_timeouts(cfg, settings), Some(settings.body_limits))
        .map_err(|e| config_err("hub client", e))
}

/// The uid of a cluster's kube-system namespace: its id (as the MCS ClusterProperty
/// `cluster.clusterset.k8s.io` defines it), when it is a UUID (see [`cluster_id::ClusterId`]).
pub async fn cluster_id(
    client: &Client,
    timeout: Duration,
) -> std::result::Result<ClusterId, ClusterIdError> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns = tokio::time::timeout(timeout, api.get("kube-system"))
        .await
        .map_err(|_| ClusterIdError::NoAnswer { timeout })?
        .map_err(|source| ClusterIdError::Read { source })?;
    let uid = ns.metadata.uid.as_deref().ok_or(ClusterIdError::NoUid)?;
    Ok(ClusterId::parse(uid)?)
}

/// The local client, and the static remote when the flags name one (`--kubeconfig` /
/// `KUBECONFIG_PATH` or `--remote-context`); other remotes come from Secrets.
pub async fn build(settings: &Settings) -> Result<Clients> {
    let local_cfg = local_config(settings).await?;
    let local_authority = authority(&local_cfg);
    let local = client_of(with_timeouts(local_cfg, settings), None)
        .map_err(|e| config_err("local client", e))?;
    let mut remotes = Vec::new();
    if settings.kubeconfig.is_some() || settings.remote_context.is_some() {
        let (remote_cfg, context_name) = remote_config(settings).await?;
        if local_authority == authority(&remote_cfg) {
            return Err(Error::Config(format!(
                "local and remote resolve to the same API server ({local_authority}); refusing to mirror a cluster into itself"
            )));
        }
        let remote = client_of(
            with_timeouts(remote_cfg, settings),
            Some(settings.body_limits),
        )
        .map_err(|e| config_err("remote client", e))?;
        let name = settings.cluster_name.clone().unwrap_or(context_name);
        if name == crate::state::LOCAL {
            return Err(Error::Config(format!(
                "the remote name {name:?} (--cluster-name, or the remote context's name) is the local cluster's: give the remote another name with --cluster-name"
            )));
        }
        remotes.push(Remote {
            name,
            client: remote,
        });
    }
    Ok(Clients {
        local,
        local_authority,
        remotes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{self, get, ok, status};
    use serde_json::{Value, json};

    const KUBE_SYSTEM: &str = "/api/v1/namespaces/kube-system";

    /// What `cluster_id` makes of a server whose kube-system namespace has `uid` (Null: none):
    /// one GET of the namespace, nothing else.
    async fn answered(uid: Value) -> std::result::Result<ClusterId, ClusterIdError> {
        let (client, api) = fixtures::client("remote");
        let ns = json!({"apiVersion": "v1", "kind": "Namespace",
                        "metadata": {"name": "kube-system", "uid": uid}});
        fixtures::run(
            &[&api],
            cluster_id(&client, Duration::from_secs(5)),
            async {
                api.expect(get(KUBE_SYSTEM), ok(ns)).await;
            },
        )
        .await
    }

    #[tokio::test]
    async fn a_uuid_answered_is_the_cluster_id() {
        let id = answered(json!("0F6B3C1E-54D2-4A8E-9C7B-2D1E0A9F8B7C"))
            .await
            .unwrap();
        assert_eq!(id.as_str(), "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7c");
    }

    #[tokio::test]
    async fn a_huge_uid_answered_is_refused_and_shown_by_its_length_only() {
        let huge = "e".repeat(200 * 1024);
        let why = answered(json!(huge)).await.unwrap_err();
        let ClusterIdError::NotAUuid(n) = &why else {
            panic!("{why}");
        };
        assert_eq!(n.len, 200 * 1024);
        let said = why.to_string();
        assert!(said.len() < 200, "{} bytes: {said}", said.len());
        assert!(
            said.contains("204800 bytes") && said.contains("not a UUID"),
            "{said}"
        );
    }

    #[tokio::test]
    async fn a_name_or_no_uid_is_no_cluster_id() {
        let why = answered(json!("east")).await.unwrap_err();
        assert!(matches!(why, ClusterIdError::NotAUuid(_)), "{why}");
        let why = answered(Value::Null).await.unwrap_err();
        assert!(matches!(why, ClusterIdError::NoUid), "{why}");
    }

    #[tokio::test]
    async fn a_refused_read_says_so() {
        let (client, api) = fixtures::client("remote");
        let why = fixtures::run(
            &[&api],
            cluster_id(&client, Duration::from_secs(5)),
            async {
                api.expect(get(KUBE_SYSTEM), status(403, "Forbidden")).await;
            },
        )
        .await
        .unwrap_err();
        assert!(matches!(why, ClusterIdError::Read { .. }), "{why}");
    }
}
