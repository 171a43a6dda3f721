//! Token renewal trusts nothing a remote mints. A small HTTPS server stands in for a hostile
//! remote's API server (east's serving certificate, so the Secret's CA trusts it): it answers the
//! cluster id (kube-system's uid) and the daemon's TokenRequest, and refuses everything else.
//! Its token is one that injects YAML after a newline, one that is no JWT, a JWT whose payload is
//! no JSON, and a JWT of another ServiceAccount: the daemon refuses each (the renewal-failure
//! counter and a CredentialRenewalFailed Event), and each Secret stays byte for byte what it was
//! (its data and its resourceVersion). A well-formed token of the right account, from the same
//! kind of server, is written back: the refusals are the checks', not the server's.
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use cross_cluster_controller::remotes::credentials::{self, LIFETIME_KEY, RENEWAL_KEY};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, PostParams};
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use support::catcher::{Answer, Catcher};
use support::daemon::{Daemon, with_args};
use support::remotes::secrets_only_args;
use support::{LOCAL, REMOTE, bed, client, eventually, namespace_in, obj};

const WAIT: Duration = Duration::from_secs(90);
/// The account the Secrets ask a token for (annotation fair.com/cross-cluster-token-renewal).
const SA: &str = "system:serviceaccount:fair-system:reader";
const TOKEN_PATH: &str = "/api/v1/namespaces/fair-system/serviceaccounts/reader/token";

fn b64url(v: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v)
}

/// An unsigned JWT with these claims (the daemon never verifies signatures; the remote does).
fn jwt(claims: Value) -> String {
    let head = b64url(r#"{"alg":"RS256","kid":"x"}"#);
    format!("{head}.{}.c2lnbmF0dXJl", b64url(&claims.to_string()))
}

fn claims(sub: &str, iat: i64, lifetime: i64) -> Value {
    json!({"sub": sub, "iat": iat, "exp": iat + lifetime, "iss": "https://hostile.invalid"})
}

/// The hostile remote: kube-system with the uid `id`, a TokenRequest answered with `token`, and
/// 403 for everything else (its watches never list: renewal does not wait for them).
fn remote(id: String, token: String) -> Answer {
    Arc::new(move |head: &str| {
        let mut line = head.split_whitespace();
        let (method, target) = (line.next().unwrap_or(""), line.next().unwrap_or(""));
        let path = target.split('?').next().unwrap_or("");
        match (method, path) {
            ("GET", "/api/v1/namespaces/kube-system") => (
                200,
                json!({"apiVersion": "v1", "kind": "Namespace",
                       "metadata": {"name": "kube-system", "uid": id}})
                .to_string(),
            ),
            ("POST", TOKEN_PATH) => (
                201,
                json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                       "spec": {"audiences": [], "expirationSeconds": 600},
                       "status": {"token": token, "expirationTimestamp": "2030-01-01T00:00:00Z"}})
                .to_string(),
            ),
            _ => (
                403,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "reason": "Forbidden", "code": 403, "message": "hostile"})
                .to_string(),
            ),
        }
    })
}

/// A remote Secret for the server at `url`, renewable, with a due token of [`SA`].
fn secret(name: &str, url: &str, ca: &[u8], token: &str) -> Secret {
    let kubeconfig = serde_yaml::to_string(&json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": url,
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c"
    }))
    .expect("yaml");
    obj(json!({
        "metadata": {"name": name,
                     "labels": {"fair.com/cross-cluster-remote": "true",
                                "fair.com/cross-cluster-name": name},
                     "annotations": {RENEWAL_KEY: "fair-system/reader", LIFETIME_KEY: "10m"}},
        "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(kubeconfig)},
    }))
}

/// What must not change: the Secret's data and its resourceVersion.
fn fingerprint(s: &Secret) -> (Option<BTreeMap<String, Vec<u8>>>, Option<String>) {
    let data = s
        .data
        .as_ref()
        .map(|d| d.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect());
    (data, s.metadata.resource_version.clone())
}

/// The renewals of `remote` the daemon counted as (renewed, failed), once it counted one.
async fn first_outcome(d: &Daemon, remote: &str) -> (f64, f64) {
    let what = format!("a renewal of {remote} counted, renewed or failed");
    eventually(&what, WAIT, || async {
        let text = d.try_metrics()?;
        let count = |outcome| {
            support::metrics::series_value(
                &text,
                "xcc_remote_credential_renewals_total",
                &[("remote", remote), ("outcome", outcome)],
            )
        };
        let (renewed, failed) = (count("renewed")?, count("failed")?);
        if renewed + failed >= 1.0 {
            Ok((renewed, failed))
        } else {
            Err(format!("none yet; /readyz: {:?}", d.readyz()))
        }
    })
    .await
}

/// The CredentialRenewalFailed Event on Secret `name`, with its note.
async fn failure_event(events: &Api<Event>, name: &str) -> String {
    eventually(
        &format!("CredentialRenewalFailed on {name}"),
        WAIT,
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            list.items
                .iter()
                .find(|e| {
                    e.reason.as_deref() == Some("CredentialRenewalFailed")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                })
                .and_then(|e| e.note.clone())
                .ok_or_else(|| format!("{} Events", list.items.len()))
        },
    )
    .await
}

#[tokio::test]
async fn a_hostile_token_request_answer_leaves_the_secret_byte_identical() {
    let ns = namespace_in("hostile-token", &[LOCAL]).await;
    let ca = std::fs::read(bed().await.dir.join(REMOTE).join("pki/ca.crt")).expect("east CA");
    let pki = bed().await.dir.join(REMOTE).join("pki");
    let now = Timestamp::now().as_second();
    // the current token: issued an hour ago, 5 minutes left: due
    let current = jwt(claims(SA, now - 3600, 3900));
    let good = jwt(claims(SA, now, 600));
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "inject",
            format!(
                "{good}\n    exec:\n      command: /bin/sh\n      apiVersion: client.authentication.k8s.io/v1"
            ),
            "not a JWT",
        ),
        ("not-a-jwt", "hostile-static-token".into(), "not a JWT"),
        (
            "no-json",
            format!("{}.{}.c2ln", b64url("{}"), b64url("sub: x")),
            "payload is not a JSON object",
        ),
        (
            "other-account",
            jwt(claims("system:serviceaccount:kube-system:admin", now, 600)),
            "kube-system:admin",
        ),
    ];
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    let events: Api<Event> = Api::namespaced(client(LOCAL).await, &ns.name);
    let mut servers = Vec::new();
    let mut before = BTreeMap::new();
    let all = cases
        .iter()
        .map(|(n, t, _)| (*n, t.clone()))
        .chain([("good", good.clone())]);
    for (i, (name, token)) in all.enumerate() {
        let id = format!("00000000-0000-4000-8000-{:012}", i + 1);
        let server = Catcher::answering(&pki, remote(id, token)).await;
        let made = secrets
            .create(
                &PostParams::default(),
                &secret(name, &server.url(), &ca, &current),
            )
            .await
            .unwrap();
        before.insert(name.to_string(), fingerprint(&made));
        servers.push((name, server));
    }
    let args = with_args(
        secrets_only_args(&ns.name),
        &["--remote-token-renew-before", "11m"],
    );
    let d = Daemon::start_secrets_only(&args).await;

    // the control: a well-formed token of the right account is written back
    eventually("the good token written into its Secret", WAIT, || async {
        let s = secrets.get("good").await.map_err(|e| e.to_string())?;
        let data = s.data.unwrap_or_default();
        let bytes = data.get("kubeconfig").ok_or("no kubeconfig")?;
        let text = String::from_utf8(bytes.0.clone()).map_err(|e| e.to_string())?;
        let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| e.to_string())?;
        let token = credentials::user_of(&kc)
            .and_then(|u| u.token.as_ref())
            .map(|t| t.expose_secret().to_string());
        (token.as_deref() == Some(good.as_str()))
            .then_some(())
            .ok_or_else(|| format!("token still {token:?}"))
    })
    .await;

    let mut changed = Vec::new();
    for (name, _, why) in &cases {
        let asked = |s: &Catcher| {
            s.seen()
                .requests
                .iter()
                .filter(|r| r.starts_with(&format!("POST {TOKEN_PATH}")))
                .count()
        };
        let (renewed, failed) = first_outcome(&d, name).await;
        let server = &servers.iter().find(|(n, _)| n == name).expect("server").1;
        assert!(
            asked(server) >= 1,
            "{name}: the TokenRequest was never sent"
        );
        let after = fingerprint(&secrets.get(name).await.unwrap());
        if after != before[*name] {
            changed.push(format!("Secret {name}"));
        }
        assert!(
            renewed == 0.0 && failed >= 1.0,
            "{name}: the hostile token was taken ({renewed} renewed, {failed} failed)"
        );
        let note = failure_event(&events, name).await;
        assert!(note.contains(why), "{name}: {note}");
    }
    assert!(
        changed.is_empty(),
        "changed by a hostile token: {changed:?}"
    );
    let logs = d.logs();
    assert!(
        !logs.contains("\n    exec:\n"),
        "the injected YAML reached the log as lines of its own:\n{logs}"
    );
    let note = format!(
        "{} hostile answers (YAML after a newline, no JWT, payload not JSON, another ServiceAccount) each refused with a CredentialRenewalFailed Event, the Secrets' data and resourceVersion unchanged; the well-formed token of the same kind of server was written",
        cases.len()
    );
    support::fault::conclude(
        support::fault::Report {
            id: "74-security-token-renewal",
            scenario: "A remote whose TokenRequest answers a hostile token (YAML injection, no JWT, another ServiceAccount)",
            done: "a TLS server with east's certificate answered the cluster id and the TokenRequest of renewable remote Secrets; daemon with --remote-token-renew-before 11m",
            converge: None,
            note,
        },
        &support::fault::Lost::nothing_to_lose(),
        &changed,
    );
}
