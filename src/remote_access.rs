//! `cross-cluster-controller remote-access`: run against the cluster to be READ, it creates (or
//! reuses) a read-only ServiceAccount there, mints a token for it through TokenRequest, and prints
//! a kubeconfig (or a ready-to-apply Secret) for the OTHER cluster's daemon. No hand-made base64.
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use clap::ValueEnum;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::{Error, Result};

#[derive(clap::Args, Debug, Clone)]
pub struct RemoteAccessArgs {
    /// Kubeconfig of the cluster that will be READ (default loading rules when absent).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Context of that cluster (default: the current context).
    #[arg(long)]
    pub context: Option<String>,
    /// Namespace of the read-only ServiceAccount (the chart's release namespace).
    #[arg(long, default_value = "fair-system")]
    pub namespace: String,
    /// Name of the read-only ServiceAccount (the chart creates `cross-cluster-remote-reader`).
    #[arg(long, default_value = "cross-cluster-remote-reader")]
    pub service_account: String,
    /// Token lifetime, e.g. 3600s, 90m, 24h, 365d. The API server may shorten it.
    #[arg(long, default_value = "8760h", value_parser = parse_duration)]
    pub duration: Duration,
    /// What to print: a kubeconfig, or a Secret holding it for the other cluster.
    #[arg(long, value_enum, default_value_t = Output::Kubeconfig)]
    pub output: Output,
    /// Name and namespace of the Secret (with --output secret); the chart reads
    /// `remoteKubeconfig.existingSecret`.
    #[arg(long, default_value = "cross-cluster-remote-kubeconfig")]
    pub secret_name: String,
    #[arg(long, default_value = "fair-system")]
    pub secret_namespace: String,
    /// API server URL as the OTHER cluster reaches it (default: the URL in the kubeconfig).
    #[arg(long)]
    pub server: Option<String>,
    /// Cluster and context name in the printed kubeconfig (default: the context name).
    #[arg(long)]
    pub cluster_name: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Kubeconfig,
    Secret,
}

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 3600s, 90m, 24h or 365d"))?;
    let secs = match unit {
        "" | "s" => n,
        "m" => n * 60,
        "h" => n * 3600,
        "d" => n * 86400,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (s, m, h or d)")),
    };
    if secs < 600 {
        return Err(format!("{s:?}: TokenRequest needs at least 10 minutes"));
    }
    Ok(Duration::from_secs(secs))
}

/// The rules of the read-only identity: read Services and their endpoints, nothing else.
pub fn reader_rules() -> serde_json::Value {
    json!([
        {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
    ])
}

fn config_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Config(format!("{what}: {}", e.to_string().replace('\n', " ")))
}

async fn create_if_missing<K>(api: &Api<K>, obj: serde_json::Value) -> Result<bool>
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(obj).map_err(|e| config_err("building an object", e))?;
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The printed text (kubeconfig or Secret), from the parts gathered.
pub fn render(
    args: &RemoteAccessArgs,
    name: &str,
    server: &str,
    ca_b64: Option<&str>,
    token: &str,
) -> String {
    let ca = match ca_b64 {
        Some(ca) => format!("    certificate-authority-data: {ca}\n"),
        None => String::new(),
    };
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n{ca}\
         users:\n- name: {name}-reader\n  user:\n    token: {token}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-reader\n\
         current-context: {name}\n"
    );
    match args.output {
        Output::Kubeconfig => kubeconfig,
        Output::Secret => {
            let indented: String = kubeconfig.lines().map(|l| format!("    {l}\n")).collect();
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {}\n  namespace: {}\n  labels:\n    app.kubernetes.io/name: cross-cluster-controller\ntype: Opaque\nstringData:\n  kubeconfig: |\n{indented}",
                args.secret_name, args.secret_namespace
            )
        }
    }
}

pub async fn run(args: RemoteAccessArgs) -> Result<String> {
    let kc = match &args.kubeconfig {
        Some(p) => Kubeconfig::read_from(p)
            .map_err(|e| config_err(&format!("kubeconfig {}", p.display()), e))?,
        None => Kubeconfig::read().map_err(|e| config_err("kubeconfig", e))?,
    };
    let context = args
        .context
        .clone()
        .or_else(|| kc.current_context.clone())
        .ok_or_else(|| {
            Error::Config("no --context and no current context in the kubeconfig".into())
        })?;
    let ctx = kc
        .contexts
        .iter()
        .find(|c| c.name == context)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| Error::Config(format!("context {context:?} is not in the kubeconfig")))?;
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == ctx.cluster)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| {
            Error::Config(format!(
                "cluster {:?} of context {context:?} is not in the kubeconfig",
                ctx.cluster
            ))
        })?;
    let ca_b64 = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(data), _) => Some(data.clone()),
        (None, Some(path)) => {
            let pem = std::fs::read(path)
                .map_err(|e| config_err(&format!("certificate authority {path}"), e))?;
            Some(base64::engine::general_purpose::STANDARD.encode(pem))
        }
        (None, None) => None,
    };
    let server = args
        .server
        .clone()
        .or(cluster.server.clone())
        .ok_or_else(|| Error::Config("no server URL".into()))?;

    let opts = KubeConfigOptions {
        context: Some(context.clone()),
        ..Default::default()
    };
    let cfg = Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| config_err("kubeconfig", e))?;
    let client = Client::try_from(cfg).map_err(|e| config_err("client", e))?;

    let sa_name = &args.service_account;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &args.namespace);
    let created = create_if_missing(
        &sas,
        json!({"metadata": {"name": sa_name, "namespace": args.namespace}}),
    )
    .await?;
    let role_name = format!("{sa_name}-{}", args.namespace);
    create_if_missing(
        &Api::<ClusterRole>::all(client.clone()),
        json!({"metadata": {"name": role_name}, "rules": reader_rules()}),
    )
    .await?;
    create_if_missing(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        json!({"metadata": {"name": role_name},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
               "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": args.namespace}]}),
    )
    .await?;
    eprintln!(
        "{} ServiceAccount {}/{sa_name} (read-only: services, endpoints, endpointslices)",
        if created { "created" } else { "reusing" },
        args.namespace
    );

    let req = TokenRequest {
        spec: TokenRequestSpec {
            expiration_seconds: Some(i64::try_from(args.duration.as_secs()).unwrap_or(i64::MAX)),
            ..Default::default()
        },
        ..Default::default()
    };
    let minted: TokenRequest = sas
        .create_subresource("token", sa_name, &PostParams::default(), &req)
        .await?;
    let status = minted
        .status
        .ok_or_else(|| Error::Config("TokenRequest returned no token".into()))?;
    eprintln!(
        "token valid until {} (mint a new one before then)",
        status.expiration_timestamp.0
    );
    let name = args.cluster_name.clone().unwrap_or(context);
    Ok(render(
        &args,
        &name,
        &server,
        ca_b64.as_deref(),
        &status.token,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        a: RemoteAccessArgs,
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90m").unwrap(), Duration::from_secs(5400));
        assert_eq!(
            parse_duration("365d").unwrap(),
            Duration::from_secs(365 * 86400)
        );
        assert_eq!(parse_duration("3600").unwrap(), Duration::from_secs(3600));
        assert!(parse_duration("5m").unwrap_err().contains("10 minutes"));
        assert!(parse_duration("1y").is_err());
        assert!(parse_duration("h").is_err());
    }

    #[test]
    fn the_secret_holds_a_parseable_kubeconfig() {
        let a = T::try_parse_from(["x", "--output", "secret"]).unwrap().a;
        let text = render(
            &a,
            "east",
            "https://10.0.0.1:6443",
            Some("Q0E="),
            "tok.en-123",
        );
        let secret: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
        assert_eq!(
            secret["metadata"]["name"],
            "cross-cluster-remote-kubeconfig"
        );
        let inner = secret["stringData"]["kubeconfig"].as_str().unwrap();
        let kc: Kubeconfig = serde_yaml::from_str(inner).unwrap();
        assert_eq!(kc.current_context.as_deref(), Some("east"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://10.0.0.1:6443")
        );
        assert_eq!(
            kc.auth_infos[0]
                .auth_info
                .as_ref()
                .unwrap()
                .token
                .as_ref()
                .map(|_| ()),
            Some(())
        );
    }
}
