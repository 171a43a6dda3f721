//! `cross-cluster-controller remote-access`: run against the cluster to be READ, it creates (or
//! reuses) a read-only ServiceAccount there, mints a token for it through TokenRequest, and prints
//! a kubeconfig (or a ready-to-apply Secret, labelled so that the daemon discovers it as a remote)
//! for the OTHER cluster's daemon. No hand-made base64.
use std::path::PathBuf;
use std::time::Duration;

use base64::Engine;
use clap::ValueEnum;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use kube::api::PostParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::client::ClusterId;
use crate::desired::mcs::{ABOUT_GROUP, MCS_GROUP};
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
    #[arg(long, default_value = "8760h", value_parser = crate::span::parse_token_lifetime)]
    pub duration: Duration,
    /// What to print: a kubeconfig, or a Secret holding it for the other cluster.
    #[arg(long, value_enum, default_value_t = Output::Kubeconfig)]
    pub output: Output,
    /// Name and namespace of the Secret (with --output secret): the reading daemon's namespace (the
    /// chart's release namespace), where it discovers remotes by the Secret's label
    /// `fair.com/cross-cluster-remote=true`. Default: `cross-cluster-remote-<cluster name>`, so
    /// each remote gets its own Secret.
    #[arg(long)]
    pub secret_name: Option<String>,
    #[arg(long, default_value = "fair-system")]
    pub secret_namespace: String,
    /// API server URL as the OTHER cluster reaches it (default: the URL in the kubeconfig).
    #[arg(long)]
    pub server: Option<String>,
    /// Cluster and context name in the printed kubeconfig, and the remote's name in the Secret
    /// (default: the context name).
    #[arg(long)]
    pub cluster_name: Option<String>,
    /// Also let the reader serve a daemon that runs with `--mcs` (Multi-Cluster Services): list
    /// and watch ServiceExports (multicluster.x-k8s.io) and ClusterProperties (about.k8s.io),
    /// cluster-wide; never their status. Services and EndpointSlices are read without it.
    #[arg(long)]
    pub mcs: bool,
    /// With --output secret: the networks (CIDRs, comma-separated) this cluster's pod addresses
    /// are in. The reading daemon then takes no address of this cluster outside them (the
    /// Secret's annotation `fair.com/cross-cluster-allowed-cidrs`). Recommended: the pod CIDRs of
    /// the cluster being read.
    #[arg(long, value_parser = allowed_cidrs)]
    pub allowed_cidrs: Option<String>,
}

/// The CIDRs of `--allowed-cidrs`, checked and written back in one canonical form.
fn allowed_cidrs(text: &str) -> std::result::Result<String, String> {
    let nets = crate::desired::addresses::parse_cidrs(text)?;
    Ok(nets
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(","))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Kubeconfig,
    Secret,
}

/// The rules of the read-only identity: read Services and their endpoints, and get the namespace
/// `kube-system` (its uid is the cluster's id, how the other daemon tells clusters apart), nothing
/// else. With `mcs` (a reading daemon with `--mcs`) also list and watch ServiceExports and
/// ClusterProperties: the Services and EndpointSlices of exporting namespaces, which carry no
/// label of ours, are read with the first two rules (RBAC cannot narrow them to a label anyway).
/// The same rules as the chart's remote reader (`remote-reader.yaml`, with `mcs.enabled`).
pub fn reader_rules(mcs: bool) -> serde_json::Value {
    let mut rules = vec![
        json!({"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}),
        json!({"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]}),
    ];
    if mcs {
        rules.extend([
            json!({"apiGroups": [MCS_GROUP], "resources": ["serviceexports"], "verbs": ["list", "watch"]}),
            json!({"apiGroups": [ABOUT_GROUP], "resources": ["clusterproperties"], "verbs": ["list", "watch"]}),
        ]);
    }
    serde_json::Value::Array(rules)
}

/// The label selecting the Secrets the daemon reads remotes from (its `--remote-secret-selector`
/// default is `<this>=true`).
pub const REMOTE_SECRET_LABEL: &str = "fair.com/cross-cluster-remote";
/// The label (or annotation) naming the remote a Secret is for.
pub const REMOTE_NAME_KEY: &str = "fair.com/cross-cluster-name";

/// The label `remote-access` puts on every object it makes: how it recognises its own reader
/// ClusterRole later, the only one it changes (never one the chart or anyone else made).
pub const MADE_BY_KEY: &str = "app.kubernetes.io/managed-by";
pub const MADE_BY: &str = "cross-cluster-controller-remote-access";

/// Whether `remote-access` made this object (it carries [`MADE_BY`]).
pub fn made_by_us(meta: &kube::api::ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(MADE_BY_KEY))
        .is_some_and(|v| v == MADE_BY)
}

/// The metadata of an object `remote-access` makes.
fn ours(name: &str, namespace: Option<&str>) -> serde_json::Value {
    let mut meta = json!({"name": name, "labels": {MADE_BY_KEY: MADE_BY}});
    if let Some(ns) = namespace {
        meta["namespace"] = json!(ns);
    }
    meta
}

/// `existing` brought up to `reader_rules(mcs)`: its rules as they are, plus each wanted rule
/// of which it lacks some right. Nothing is taken away (a daemon may use what is there).
pub fn brought_up(existing: &[PolicyRule], mcs: bool) -> Vec<PolicyRule> {
    let wanted: Vec<PolicyRule> =
        serde_json::from_value(reader_rules(mcs)).expect("reader_rules are PolicyRules");
    let mut rules = existing.to_vec();
    for w in wanted {
        if !missing_rights_of(existing, std::slice::from_ref(&w)).is_empty() {
            rules.push(w);
        }
    }
    rules
}

/// Each `reader_rules(mcs)` permission that `existing` does not grant, as `verb resource[/name]`
/// (RBAC semantics: a rule grants when its groups, resources and verbs include the asked one or
/// `*`, and its resourceNames are empty or include the name).
pub fn missing_rights(existing: &[PolicyRule], mcs: bool) -> Vec<String> {
    let wanted: Vec<PolicyRule> =
        serde_json::from_value(reader_rules(mcs)).expect("reader_rules are PolicyRules");
    missing_rights_of(existing, &wanted)
}

/// Each permission of `wanted` that `existing` does not grant (see [`missing_rights`]).
fn missing_rights_of(existing: &[PolicyRule], wanted: &[PolicyRule]) -> Vec<String> {
    let has = |list: &Option<Vec<String>>, item: &str| {
        list.iter().flatten().any(|x| x == item || x == "*")
    };
    let mut missing = Vec::new();
    for w in wanted {
        let names: Vec<Option<&String>> = match &w.resource_names {
            Some(n) if !n.is_empty() => n.iter().map(Some).collect(),
            _ => vec![None],
        };
        for group in w.api_groups.iter().flatten() {
            for resource in w.resources.iter().flatten() {
                for verb in &w.verbs {
                    for name in &names {
                        let granted = existing.iter().any(|r| {
                            has(&r.api_groups, group)
                                && has(&r.resources, resource)
                                && (r.verbs.iter().any(|v| v == verb || v == "*"))
                                && match (name, &r.resource_names) {
                                    (_, None) => true,
                                    (_, Some(n)) if n.is_empty() => true,
                                    (Some(name), Some(n)) => n.contains(name),
                                    (None, Some(_)) => false,
                                }
                        });
                        if !granted {
                            let group = if group.is_empty() {
                                String::new()
                            } else {
                                format!(".{group}")
                            };
                            let name = name.map(|n| format!("/{n}")).unwrap_or_default();
                            missing.push(format!("{verb} {resource}{group}{name}"));
                        }
                    }
                }
            }
        }
    }
    missing
}

/// A label value as Kubernetes accepts it: at most 63 characters, alphanumerics, `-`, `_` and
/// `.`, starting and ending with an alphanumeric (or empty).
pub fn is_label_value(s: &str) -> bool {
    let alnum = |c: Option<char>| c.is_none_or(|c| c.is_ascii_alphanumeric());
    s.len() <= 63
        && alnum(s.chars().next())
        && alnum(s.chars().last())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `s` as a YAML double-quoted scalar (a JSON string is one).
fn q(s: &str) -> String {
    serde_json::to_string(s).expect("a string serializes")
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

/// `cross-cluster-remote-<name>`, made a valid object name (lower case, other characters '-').
pub fn default_secret_name(name: &str) -> String {
    let mut s: String = format!("cross-cluster-remote-{name}")
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    s.truncate(253);
    s.trim_end_matches('-').to_string()
}

/// The printed text (kubeconfig or Secret), from the parts gathered. The Secret is what the daemon
/// discovers remotes from: in its namespace, labelled `fair.com/cross-cluster-remote=true`, the
/// kubeconfig under the key `kubeconfig`, the remote's name in the label
/// `fair.com/cross-cluster-name` (in the annotation of that name when it is no valid label value),
/// the cluster's id (its kube-system uid) pinned in the annotation `fair.com/cross-cluster-cluster-id`.
pub fn render(
    args: &RemoteAccessArgs,
    name: &str,
    server: &str,
    ca_b64: Option<&str>,
    token: &str,
    cluster_id: &ClusterId,
) -> String {
    let ca = match ca_b64 {
        Some(ca) => format!("    certificate-authority-data: {}\n", q(ca)),
        None => String::new(),
    };
    let (n, user, server, token) = (q(name), q(&format!("{name}-reader")), q(server), q(token));
    let kubeconfig = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {n}\n  cluster:\n    server: {server}\n{ca}\
         users:\n- name: {user}\n  user:\n    token: {token}\n\
         contexts:\n- name: {n}\n  context:\n    cluster: {n}\n    user: {user}\n\
         current-context: {n}\n"
    );
    match args.output {
        Output::Kubeconfig => kubeconfig,
        Output::Secret => {
            let indented: String = kubeconfig.lines().map(|l| format!("    {l}\n")).collect();
            let (labels, name_annotation) = if is_label_value(name) {
                (format!("    {REMOTE_NAME_KEY}: {n}\n"), String::new())
            } else {
                (String::new(), format!("    {REMOTE_NAME_KEY}: {n}\n"))
            };
            // the daemon renews this token before it expires (see crate::remotes::credentials)
            let allowed = match args.allowed_cidrs.as_deref().filter(|c| !c.is_empty()) {
                Some(cidrs) => format!(
                    "    {}: {}\n",
                    crate::remotes::remote_secret::ALLOWED_CIDRS_KEY,
                    q(cidrs)
                ),
                None => String::new(),
            };
            // the daemon refuses a server that answers with another cluster id
            let annotations = format!(
                "  annotations:\n{name_annotation}    {}: {}\n    {}: {}\n    {}: {}\n{allowed}",
                crate::remotes::credentials::RENEWAL_KEY,
                q(&format!("{}/{}", args.namespace, args.service_account)),
                crate::remotes::credentials::LIFETIME_KEY,
                q(&format!("{}s", args.duration.as_secs())),
                crate::remotes::remote_secret::CLUSTER_ID_KEY,
                q(cluster_id.as_str()),
            );
            format!(
                "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {}\n  namespace: {}\n  labels:\n    \
                 app.kubernetes.io/name: cross-cluster-controller\n    {REMOTE_SECRET_LABEL}: \"true\"\n{labels}\
                 {annotations}type: Opaque\nstringData:\n  kubeconfig: |\n{indented}",
                q(&args
                    .secret_name
                    .clone()
                    .unwrap_or_else(|| default_secret_name(name))),
                q(&args.secret_namespace)
            )
        }
    }
}

/// The one right that renews the token: TokenRequest for this ServiceAccount itself, in its
/// own namespace (a Role, so no account of the same name elsewhere is covered).
pub fn renewal_rules(service_account: &str) -> serde_json::Value {
    json!([
        {"apiGroups": [""], "resources": ["serviceaccounts/token"],
         "resourceNames": [service_account], "verbs": ["create"]}
    ])
}

/// The Role and RoleBinding that let the ServiceAccount request tokens for itself only.
async fn renewal_role(client: &Client, namespace: &str, sa_name: &str) -> Result<()> {
    let name = format!("{sa_name}-token-renewal");
    create_if_missing(
        &Api::<Role>::namespaced(client.clone(), namespace),
        json!({"metadata": ours(&name, Some(namespace)), "rules": renewal_rules(sa_name)}),
    )
    .await?;
    create_if_missing(
        &Api::<RoleBinding>::namespaced(client.clone(), namespace),
        json!({"metadata": ours(&name, Some(namespace)),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
               "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": namespace}]}),
    )
    .await?;
    Ok(())
}

/// What `remote-access` is run against: its kubeconfig, the context, the server URL the other
/// cluster's daemon will use, and the CA it will trust (base64).
struct Target {
    kc: Kubeconfig,
    context: String,
    server: String,
    ca_b64: Option<String>,
}

fn target(args: &RemoteAccessArgs) -> Result<Target> {
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

    Ok(Target {
        kc,
        context,
        server,
        ca_b64,
    })
}

async fn client_of(kc: Kubeconfig, context: &str) -> Result<Client> {
    let opts = KubeConfigOptions {
        context: Some(context.to_string()),
        ..Default::default()
    };
    let cfg = Config::from_custom_kubeconfig(kc, &opts)
        .await
        .map_err(|e| config_err("kubeconfig", e))?;
    Client::try_from(cfg).map_err(|e| config_err("client", e))
}

/// The read-only ServiceAccount, its ClusterRole and binding, and the Role that lets it renew its
/// own token; each made only if missing.
async fn ensure_identity(client: &Client, args: &RemoteAccessArgs) -> Result<()> {
    let sa_name = &args.service_account;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &args.namespace);
    let created = create_if_missing(
        &sas,
        json!({"metadata": ours(sa_name, Some(&args.namespace))}),
    )
    .await?;
    let role_name = format!("{sa_name}-{}", args.namespace);
    let roles = Api::<ClusterRole>::all(client.clone());
    let role_created = create_if_missing(
        &roles,
        json!({"metadata": ours(&role_name, None), "rules": reader_rules(args.mcs)}),
    )
    .await?;
    if !role_created {
        bring_up(&roles, &role_name, args.mcs).await?;
    }
    create_if_missing(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        json!({"metadata": ours(&role_name, None),
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_name},
               "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": args.namespace}]}),
    )
    .await?;
    renewal_role(client, &args.namespace, sa_name).await?;
    eprintln!(
        "{} ServiceAccount {}/{sa_name} (read-only: services, endpoints, endpointslices{}; \
         get namespace kube-system; a token for itself only, to renew it)",
        if created { "created" } else { "reusing" },
        args.namespace,
        if args.mcs {
            ", serviceexports, clusterproperties"
        } else {
            ""
        }
    );
    Ok(())
}

/// An existing reader ClusterRole that lacks a right the flags ask for: ours (an earlier
/// `remote-access` made it) is brought up to them, with the resourceVersion it was read at (a
/// change meanwhile fails the update); one made by the chart or anyone else is left as it is,
/// and what it lacks is named here rather than found later in the daemon's logs.
async fn bring_up(roles: &Api<ClusterRole>, name: &str, mcs: bool) -> Result<()> {
    let mut existing = roles.get(name).await?;
    let rules = existing.rules.clone().unwrap_or_default();
    let missing = missing_rights(&rules, mcs);
    if missing.is_empty() {
        return Ok(());
    }
    if !made_by_us(&existing.metadata) {
        eprintln!("warning: {}", missing_warning(name, &missing, mcs));
        return Ok(());
    }
    existing.rules = Some(brought_up(&rules, mcs));
    roles
        .replace(name, &PostParams::default(), &existing)
        .await?;
    eprintln!(
        "updated ClusterRole {name} (made by an earlier remote-access): it now grants {}",
        missing.join(", ")
    );
    Ok(())
}

/// What an existing reader ClusterRole lacks, and what to do about it: it is left as it is.
pub fn missing_warning(role_name: &str, missing: &[String], mcs: bool) -> String {
    let why = if mcs {
        "the other cluster's daemon needs it (kube-system's uid is this cluster's id; with --mcs \
         it lists ServiceExports and ClusterProperties). Upgrade the chart that made it (with \
         mcs.enabled=true)"
    } else {
        "the other cluster's daemon needs it (kube-system's uid is this cluster's id). Upgrade \
         the chart that made it"
    };
    format!(
        "the existing ClusterRole {role_name} does not grant {}: {why}, or delete the ClusterRole \
         and run remote-access again.",
        missing.join(", ")
    )
}

/// A token for the ServiceAccount, valid for `--duration`.
async fn mint(client: &Client, args: &RemoteAccessArgs) -> Result<String> {
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), &args.namespace);
    let sa_name = &args.service_account;
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
    match args.output {
        Output::Secret => eprintln!(
            "token valid until {}; the daemon reading this Secret renews it before then \
             (annotation {})",
            status.expiration_timestamp.0,
            crate::remotes::credentials::RENEWAL_KEY
        ),
        Output::Kubeconfig => eprintln!(
            "token valid until {} (mint a new one before then, or use --output secret: \
             the daemon renews the token of a Secret remote itself)",
            status.expiration_timestamp.0
        ),
    }
    Ok(status.token)
}

pub async fn run(args: RemoteAccessArgs) -> Result<String> {
    let Target {
        kc,
        context,
        server,
        ca_b64,
    } = target(&args)?;
    let client = client_of(kc, &context).await?;
    let id = identity(&client, &args).await?;
    ensure_identity(&client, &args).await?;
    let token = mint(&client, &args).await?;
    let name = args.cluster_name.clone().unwrap_or(context);
    Ok(render(
        &args,
        &name,
        &server,
        ca_b64.as_deref(),
        &token,
        &id,
    ))
}

/// The cluster's id (its kube-system uid), read before anything is made: the Secret pins it.
async fn identity(client: &Client, args: &RemoteAccessArgs) -> Result<ClusterId> {
    let id = crate::client::cluster_id(client, Duration::from_secs(30))
        .await
        .map_err(|e| config_err("the cluster's id (namespace kube-system)", e))?;
    match args.output {
        Output::Secret => eprintln!(
            "cluster id {id} (the uid of namespace kube-system), pinned in the Secret \
             (annotation {}): the daemon refuses a server that answers with another",
            crate::remotes::remote_secret::CLUSTER_ID_KEY
        ),
        Output::Kubeconfig => eprintln!(
            "cluster id {id} (the uid of namespace kube-system): annotate the remote Secret you \
             make with {}: {id} and the daemon refuses a server that answers with another",
            crate::remotes::remote_secret::CLUSTER_ID_KEY
        ),
    }
    Ok(id)
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
        assert_eq!(
            crate::span::parse_token_lifetime("90m").unwrap(),
            Duration::from_secs(5400)
        );
        assert_eq!(
            crate::span::parse_token_lifetime("365d").unwrap(),
            Duration::from_secs(365 * 86400)
        );
        assert_eq!(
            crate::span::parse_token_lifetime("3600").unwrap(),
            Duration::from_secs(3600)
        );
        assert!(
            crate::span::parse_token_lifetime("5m")
                .unwrap_err()
                .contains("10 minutes")
        );
        assert!(crate::span::parse_token_lifetime("1y").is_err());
        assert!(crate::span::parse_token_lifetime("h").is_err());
        // beyond u64 seconds: an error, not an overflow
        let long = crate::span::parse_token_lifetime("213503982334602d").unwrap_err();
        assert!(long.contains("too long"), "{long}");
    }

    fn secret(extra: &[&str], name: &str) -> serde_yaml::Value {
        let a = T::try_parse_from([&["x", "--output", "secret"], extra].concat())
            .unwrap()
            .a;
        let text = render(
            &a,
            name,
            "https://10.0.0.1:6443",
            Some("Q0E="),
            "tok.en-123",
            &ClusterId::parse(ID).unwrap(),
        );
        serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{e}:\n{text}"))
    }

    const ID: &str = "0f6b3c1e-54d2-4a8e-9c7b-2d1e0a9f8b7c";

    #[test]
    fn the_secret_pins_the_cluster_id_and_the_daemon_reads_the_pin() {
        let secret = secret(&[], "east");
        assert_eq!(
            secret["metadata"]["annotations"]["fair.com/cross-cluster-cluster-id"],
            ID
        );
        // read back as the daemon reads a remote Secret
        let s: k8s_openapi::api::core::v1::Secret =
            serde_json::from_value(serde_json::to_value(&secret).unwrap()).unwrap();
        let c = crate::remotes::remote_secret::read_secret(&s).unwrap();
        assert_eq!(c.cluster_id.as_ref().map(ClusterId::as_str), Some(ID));
    }

    fn inner_kubeconfig(secret: &serde_yaml::Value) -> Kubeconfig {
        let inner = secret["stringData"]["kubeconfig"].as_str().unwrap();
        serde_yaml::from_str(inner).unwrap()
    }

    #[test]
    fn the_secret_holds_a_parseable_kubeconfig() {
        let secret = secret(&[], "east");
        assert_eq!(
            secret["metadata"]["name"], "cross-cluster-remote-east",
            "one Secret per remote by default"
        );
        assert_eq!(
            default_secret_name("arn:aws:eks:eu-west-1:1:cluster/East"),
            "cross-cluster-remote-arn-aws-eks-eu-west-1-1-cluster-east"
        );
        assert_eq!(secret["metadata"]["namespace"], "fair-system");
        let kc = inner_kubeconfig(&secret);
        assert_eq!(kc.current_context.as_deref(), Some("east"));
        assert_eq!(
            kc.clusters[0].cluster.as_ref().unwrap().server.as_deref(),
            Some("https://10.0.0.1:6443")
        );
        assert_eq!(
            kc.clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .certificate_authority_data
                .as_deref(),
            Some("Q0E=")
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

    #[test]
    fn the_secret_is_what_the_daemon_discovers_remotes_from() {
        let secret = secret(
            &["--secret-name", "east-remote", "--secret-namespace", "ops"],
            "east",
        );
        let meta = &secret["metadata"];
        assert_eq!(meta["name"], "east-remote");
        assert_eq!(meta["namespace"], "ops");
        // the daemon's default selector is fair.com/cross-cluster-remote=true: a string "true"
        assert_eq!(
            meta["labels"]["fair.com/cross-cluster-remote"],
            serde_yaml::Value::String("true".into())
        );
        assert_eq!(meta["labels"]["fair.com/cross-cluster-name"], "east");
        assert_eq!(
            meta["labels"]["app.kubernetes.io/name"],
            "cross-cluster-controller"
        );
        // the daemon renews the token of the ServiceAccount named here, for as long again
        assert_eq!(
            meta["annotations"]["fair.com/cross-cluster-token-renewal"],
            "fair-system/cross-cluster-remote-reader"
        );
        assert_eq!(
            meta["annotations"]["fair.com/cross-cluster-token-lifetime"],
            "31536000s"
        );
        let ann: std::collections::BTreeMap<String, String> =
            serde_yaml::from_value(meta["annotations"].clone()).unwrap();
        let r = crate::remotes::credentials::renewal_of(&ann)
            .unwrap()
            .unwrap();
        assert_eq!(r.lifetime, Duration::from_secs(365 * 86400));
        assert_eq!(secret["type"], "Opaque");
        let data: Vec<&serde_yaml::Value> =
            secret["stringData"].as_mapping().unwrap().keys().collect();
        assert_eq!(data, ["kubeconfig"], "one key, kubeconfig");
        // every value of a Secret is a string, labels too
        let secret: k8s_openapi::api::core::v1::Secret =
            serde_yaml::from_value(secret.clone()).unwrap();
        assert_eq!(secret.string_data.unwrap().len(), 1);
    }

    #[test]
    fn a_name_that_is_no_label_value_goes_in_the_annotation() {
        for name in [
            "arn:aws:eks:us-east-1:123456789012:cluster/east",
            "gke_project_us-central1_a-very-long-cluster-name-that-does-not-fit-in-a-label",
            "east #1: prod",
        ] {
            let secret = secret(&[], name);
            let meta = &secret["metadata"];
            assert_eq!(meta["annotations"]["fair.com/cross-cluster-name"], name);
            assert!(meta["labels"].get("fair.com/cross-cluster-name").is_none());
            assert_eq!(meta["labels"]["fair.com/cross-cluster-remote"], "true");
            let kc = inner_kubeconfig(&secret);
            assert_eq!(kc.current_context.as_deref(), Some(name));
            assert_eq!(kc.contexts[0].name, name);
        }
    }

    #[test]
    fn label_values() {
        for ok in ["", "east", "a", "east-1.prod_x", &"a".repeat(63)] {
            assert!(is_label_value(ok), "{ok:?}");
        }
        for bad in ["-east", "east-", "a:b", "a/b", "a b", &"a".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    fn policy(rules: serde_json::Value) -> Vec<PolicyRule> {
        serde_json::from_value(rules).unwrap()
    }

    #[test]
    fn the_reader_may_get_kube_system_and_no_other_namespace() {
        let rules = policy(reader_rules(false));
        let ns: Vec<&PolicyRule> = rules
            .iter()
            .filter(|r| r.resources.iter().flatten().any(|x| x == "namespaces"))
            .collect();
        assert_eq!(ns.len(), 1);
        assert_eq!(ns[0].verbs, ["get"]);
        assert_eq!(
            ns[0].resource_names.as_deref(),
            Some(&["kube-system".to_string()][..])
        );
        assert_eq!(ns[0].api_groups.as_deref(), Some(&[String::new()][..]));
        assert!(
            rules.iter().all(|r| r
                .verbs
                .iter()
                .all(|v| ["get", "list", "watch"].contains(&v.as_str()))),
            "read-only"
        );
        assert!(missing_rights(&rules, false).is_empty());
    }

    #[test]
    fn an_existing_role_without_the_namespace_right_is_named() {
        // what remote-access and the chart created before the cluster id was read
        let old = policy(json!([
            {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}
        ]));
        assert_eq!(missing_rights(&old, false), ["get namespaces/kube-system"]);
        let other_ns = policy(json!([
            {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["*"]},
            {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["default"], "verbs": ["get"]}
        ]));
        assert_eq!(
            missing_rights(&other_ns, false),
            ["get namespaces/kube-system"]
        );
        assert_eq!(
            missing_rights(&[], false),
            [
                "get services",
                "list services",
                "watch services",
                "get endpoints",
                "list endpoints",
                "watch endpoints",
                "get endpointslices.discovery.k8s.io",
                "list endpointslices.discovery.k8s.io",
                "watch endpointslices.discovery.k8s.io",
                "get namespaces/kube-system",
            ]
        );
        let wide = policy(
            json!([{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}]),
        );
        assert!(missing_rights(&wide, false).is_empty());
        let mut split = policy(reader_rules(false));
        split.push(
            policy(json!([{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get"]}]))
                .remove(0),
        );
        split.retain(|r| r.resource_names.is_none());
        assert!(
            missing_rights(&split, false).is_empty(),
            "get on every namespace covers kube-system"
        );
    }

    #[test]
    fn mcs_adds_to_the_reader_only_list_and_watch_of_exports_and_properties() {
        let plain = policy(reader_rules(false));
        let mcs = policy(reader_rules(true));
        assert_eq!(mcs[..plain.len()], plain[..], "the plain rules, unchanged");
        assert_eq!(
            mcs[plain.len()..],
            policy(json!([
                {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports"], "verbs": ["list", "watch"]},
                {"apiGroups": ["about.k8s.io"], "resources": ["clusterproperties"], "verbs": ["list", "watch"]}
            ]))[..],
            "list and watch of exports and properties, of every namespace, nothing else"
        );
        // Services and EndpointSlices of every namespace, with no label or name restriction:
        // what the daemon reads of an exporting namespace
        for (group, resource) in [("", "services"), ("discovery.k8s.io", "endpointslices")] {
            assert!(
                mcs.iter().any(
                    |r| r.api_groups.as_deref() == Some(&[group.to_string()][..])
                        && r.resources.iter().flatten().any(|x| x == resource)
                        && r.resource_names.is_none()
                        && ["list", "watch"]
                            .iter()
                            .all(|v| r.verbs.iter().any(|x| x == v))
                ),
                "{resource}"
            );
        }
        // no write, no status, no ServiceImport: the reading daemon writes only in its own cluster
        assert!(mcs.iter().all(|r| {
            r.verbs
                .iter()
                .all(|v| ["get", "list", "watch"].contains(&v.as_str()))
                && r.resources
                    .iter()
                    .flatten()
                    .all(|x| !x.contains('/') && x != "serviceimports")
        }));
        assert!(missing_rights(&mcs, true).is_empty());
        assert!(missing_rights(&mcs, false).is_empty());
    }

    #[test]
    fn a_role_is_brought_up_by_adding_what_it_lacks_and_taking_nothing_away() {
        let plain = policy(reader_rules(false));
        let up = brought_up(&plain, true);
        assert!(missing_rights(&up, true).is_empty());
        assert_eq!(
            up[..plain.len()],
            plain[..],
            "what was there stays, in order"
        );
        assert_eq!(up[plain.len()..], policy(reader_rules(true))[plain.len()..]);
        // already enough: unchanged; an extra rule of someone's is kept
        assert_eq!(brought_up(&up, true), up);
        assert_eq!(brought_up(&up, false), up);
        let extra = policy(json!([
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"]}
        ]));
        let up = brought_up(&extra, false);
        assert_eq!(up[0], extra[0]);
        assert!(missing_rights(&up, false).is_empty());
    }

    #[test]
    fn only_what_remote_access_labelled_is_its_own() {
        let meta = |labels: serde_json::Value| -> kube::api::ObjectMeta {
            serde_json::from_value(json!({"name": "r", "labels": labels})).unwrap()
        };
        assert!(made_by_us(&meta(json!({MADE_BY_KEY: MADE_BY}))));
        assert!(!made_by_us(&meta(json!({MADE_BY_KEY: "Helm"}))));
        assert!(!made_by_us(&meta(json!({}))));
        assert!(!made_by_us(&kube::api::ObjectMeta::default()));
        let made: kube::api::ObjectMeta = serde_json::from_value(ours("r", Some("ns"))).unwrap();
        assert!(made_by_us(&made));
        assert_eq!(made.namespace.as_deref(), Some("ns"));
    }

    #[test]
    fn an_existing_role_without_the_mcs_rights_is_named_only_with_mcs() {
        let plain = policy(reader_rules(false));
        assert!(missing_rights(&plain, false).is_empty());
        let missing = missing_rights(&plain, true);
        assert_eq!(
            missing,
            [
                "list serviceexports.multicluster.x-k8s.io",
                "watch serviceexports.multicluster.x-k8s.io",
                "list clusterproperties.about.k8s.io",
                "watch clusterproperties.about.k8s.io",
            ]
        );
        let warning = missing_warning("r-ns", &missing, true);
        assert!(
            warning.starts_with(
                "the existing ClusterRole r-ns does not grant list serviceexports.multicluster.x-k8s.io, "
            ),
            "{warning}"
        );
        assert!(warning.contains("mcs.enabled=true"), "{warning}");
        assert!(!missing_warning("r-ns", &missing, false).contains("mcs"));
        // the status subresource alone, or the right resource in another group, is not enough
        let mut near = plain.clone();
        near.extend(policy(json!([
            {"apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceexports/status"], "verbs": ["*"]},
            {"apiGroups": ["multicluster.k8s.io"], "resources": ["clusterproperties"], "verbs": ["list", "watch"]},
            {"apiGroups": ["about.k8s.io"], "resources": ["clusterproperties"], "verbs": ["get"]}
        ])));
        assert_eq!(missing_rights(&near, true), missing);
        // a wildcard group grants it, as RBAC reads it
        let mut wide = plain.clone();
        wide.extend(policy(json!([
            {"apiGroups": ["*"], "resources": ["serviceexports", "clusterproperties"], "verbs": ["list", "watch"]}
        ])));
        assert!(missing_rights(&wide, true).is_empty());
    }

    #[test]
    fn mcs_is_off_unless_asked() {
        let off = T::try_parse_from(["x"]).unwrap().a;
        assert!(!off.mcs);
        let on = T::try_parse_from(["x", "--mcs"]).unwrap().a;
        assert!(on.mcs);
    }
}
