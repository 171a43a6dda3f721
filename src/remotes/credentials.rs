//! Remote credentials: when each remote's credential expires (a JWT's `exp`, read without
//! verifying it; a client certificate's notAfter), and the renewal of the tokens that
//! `remote-access` minted.
//!
//! A Secret that `remote-access` wrote carries the annotation [`RENEWAL_KEY`]
//! (`<namespace>/<service account>` in the remote cluster) and [`LIFETIME_KEY`]. When the
//! renewal window of its token is reached, the leader asks the remote's TokenRequest API for a
//! new token of that ServiceAccount (with the current token: the remote role lets the account
//! request tokens for itself only) and writes it back into the Secret, with the resourceVersion
//! it read (a Secret changed meanwhile is not overwritten). The Secret watch then sees a new
//! kubeconfig and rotates the remote's client. The state is the Secret itself: a restart at any
//! moment reads the token's `exp` again and renews what is due; a token minted but not written
//! is simply minted again (the old one stays valid until its own `exp`).
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::PostParams;
use kube::config::{AuthInfo, Kubeconfig};
use kube::runtime::events::EventType;
use kube::{Api, Resource, ResourceExt};
use secrecy::ExposeSecret;
use tracing::{info, warn};

use crate::reconcile::worker::Controller;
use crate::runtime::admin::detail;
use crate::runtime::metrics::ByRemoteOutcome;
use crate::state::{Member, Origin};

/// Secret annotation: the remote ServiceAccount (`<namespace>/<name>`) whose token the daemon
/// renews; written by `remote-access --output secret`.
pub const RENEWAL_KEY: &str = "fair.com/cross-cluster-token-renewal";
/// Secret annotation: the lifetime of each renewed token (`90m`, `24h`, `365d`; at least 10m).
pub const LIFETIME_KEY: &str = "fair.com/cross-cluster-token-lifetime";
/// A token younger than this is not renewed again, whatever the window (no renewal storm when
/// the window is wider than the lifetime).
pub const MIN_AGE: Duration = Duration::from_secs(30);
/// How often the renewer looks at the remotes' credentials.
const TICK: Duration = Duration::from_secs(5);
/// Back-off after a failed renewal: doubles from the first to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_secs(10), Duration::from_secs(300));

pub use crate::state::Credential;

/// The user of a kubeconfig's current context (else of its only context).
pub fn user_of(kc: &Kubeconfig) -> Option<&AuthInfo> {
    kc.auth_infos
        .get(current_user_index(kc)?)?
        .auth_info
        .as_ref()
}

/// The index in `users` of the user of a kubeconfig's current context (else of its only one).
fn current_user_index(kc: &Kubeconfig) -> Option<usize> {
    let ctx = match &kc.current_context {
        Some(name) => kc.contexts.iter().find(|c| &c.name == name),
        None if kc.contexts.len() == 1 => kc.contexts.first(),
        None => None,
    }?;
    let user = ctx.context.as_ref()?.user.as_deref()?;
    kc.auth_infos.iter().position(|a| a.name == user)
}

/// Pure: what a user's inline credentials say (a token that is no JWT, or a certificate that
/// does not parse, says nothing).
pub fn credential(user: &AuthInfo) -> Credential {
    let mut c = user
        .token
        .as_ref()
        .and_then(|t| jwt_claims(t.expose_secret()))
        .unwrap_or_default();
    let cert = user
        .client_certificate_data
        .as_deref()
        .and_then(certificate_not_after);
    c.expiry = match (c.expiry, cert) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    c
}

/// The claims of a JWT's payload, read without verifying its signature (the API server does).
pub fn jwt_claims(token: &str) -> Option<Credential> {
    let mut parts = token.split('.');
    let (_, payload, _) = (parts.next()?, parts.next()?, parts.next()?);
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    let at = |k: &str| {
        claims
            .get(k)
            .and_then(serde_json::Value::as_i64)
            .and_then(|s| Timestamp::from_second(s).ok())
    };
    Some(Credential {
        expiry: at("exp"),
        issued: at("iat"),
        subject: claims.get("sub").and_then(|s| s.as_str()).map(String::from),
    })
}

/// The notAfter of the first certificate in base64 PEM (as `client-certificate-data` holds it).
pub fn certificate_not_after(data_b64: &str) -> Option<Timestamp> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data_b64.trim())
        .ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    Timestamp::from_second(cert.validity().not_after.timestamp()).ok()
}

/// When to renew: a window before expiry, or a share of the token's lifetime.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RenewBefore {
    /// no renewal (`off`)
    Off,
    Window(Duration),
    /// percent of the lifetime (`iat` to `exp`) left
    Percent(u8),
}

/// `20%` (of the lifetime left), a duration (`90m`, `24h`, `7d`, seconds without a unit), or
/// `off`.
pub fn parse_renew_before(s: &str) -> Result<RenewBefore, String> {
    if s == "off" {
        return Ok(RenewBefore::Off);
    }
    if let Some(p) = s.strip_suffix('%') {
        return match p.parse::<u8>() {
            Ok(n) if (1..=99).contains(&n) => Ok(RenewBefore::Percent(n)),
            _ => Err(format!("{s:?}: a percentage from 1% to 99%")),
        };
    }
    crate::span::parse(s).map(RenewBefore::Window)
}

/// Pure: when a token should be renewed (None: never, it has no `exp`). Never earlier than
/// [`MIN_AGE`] after it was issued.
pub fn due_at(c: &Credential, before: RenewBefore) -> Option<Timestamp> {
    let exp = c.expiry?;
    let window = match (before, c.issued) {
        (RenewBefore::Off, _) => return None,
        (RenewBefore::Window(w), _) => SignedDuration::try_from(w).ok()?,
        (RenewBefore::Percent(p), Some(iat)) => {
            exp.duration_since(iat).checked_mul(i32::from(p))? / 100
        }
        // no iat: a fifth of a day, the least surprising fallback
        (RenewBefore::Percent(_), None) => SignedDuration::from_hours(24),
    };
    let at = exp.checked_sub(window).ok()?;
    let earliest = c.issued.and_then(|iat| {
        iat.checked_add(SignedDuration::try_from(MIN_AGE).ok()?)
            .ok()
    });
    Some(earliest.map_or(at, |e| at.max(e)))
}

/// What a Secret's renewal annotations ask for.
#[derive(Clone, Debug, PartialEq)]
pub struct Renewal {
    pub namespace: String,
    pub service_account: String,
    pub lifetime: Duration,
}

/// Pure: the renewal a Secret asks for (None: not renewable), or why its annotations are bad.
pub fn renewal_of(annotations: &BTreeMap<String, String>) -> Result<Option<Renewal>, String> {
    let Some(sa) = annotations.get(RENEWAL_KEY) else {
        return Ok(None);
    };
    let (namespace, service_account) = sa
        .split_once('/')
        .filter(|(ns, n)| is_dns_subdomain(ns) && is_dns_subdomain(n) && ns.len() <= 63)
        .ok_or_else(|| {
            format!("annotation {RENEWAL_KEY} {sa:?} is not <namespace>/<serviceaccount>")
        })?;
    let lifetime = match annotations.get(LIFETIME_KEY) {
        Some(l) => crate::span::parse_token_lifetime(l)
            .map_err(|e| format!("annotation {LIFETIME_KEY}: {e}"))?,
        None => Duration::from_secs(8760 * 3600),
    };
    Ok(Some(Renewal {
        namespace: namespace.to_string(),
        service_account: service_account.to_string(),
        lifetime,
    }))
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && s.starts_with(|c: char| c.is_ascii_alphanumeric())
        && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// The longest token accepted from a remote's TokenRequest (a ServiceAccount token is about
/// 1 KiB; anything near this bound is no token the API server minted for us).
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;

/// Why a token a remote minted, or the kubeconfig it would make, is refused. The remote's
/// answer is untrusted: what of it shows here is quoted and bounded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unfit {
    #[error("the minted token is refused: not a JWT ({0})")]
    NotJwt(&'static str),
    #[error("the minted token is refused: its subject is {found}, not {want:?}")]
    WrongSubject { found: String, want: String },
    #[error("the kubeconfig cannot be rewritten: {0}")]
    Rewrite(String),
    #[error("the rewritten kubeconfig is refused: {0}")]
    Policy(#[from] crate::client::policy::Refusal),
}

fn is_base64url(segment: &str) -> bool {
    !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn json_object(segment: &str) -> Option<serde_json::Value> {
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(segment)
        .ok()?;
    serde_json::from_slice::<serde_json::Value>(&bytes)
        .ok()
        .filter(serde_json::Value::is_object)
}

/// A remote's text, quoted (control characters escaped) and cut to 80 characters.
fn quoted(s: &str) -> String {
    let cut: String = s.chars().take(80).collect();
    let more = if cut.len() < s.len() { "..." } else { "" };
    format!("{cut:?}{more}")
}

/// Pure: what a minted token says, when it is a well-formed JWT (three base64url segments; the
/// header and the payload JSON objects; at most [`MAX_TOKEN_BYTES`]) whose `sub` is `want`
/// (`system:serviceaccount:<namespace>:<name>`). The signature is not verified: the remote's
/// API server does that on every request.
pub fn check_minted(token: &str, want: &str) -> Result<Credential, Unfit> {
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Unfit::NotJwt("longer than 16 KiB"));
    }
    let parts: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = parts[..] else {
        return Err(Unfit::NotJwt("not three segments separated by dots"));
    };
    if !parts.iter().all(|p| is_base64url(p)) {
        return Err(Unfit::NotJwt("a segment is not base64url"));
    }
    json_object(header).ok_or(Unfit::NotJwt("its header is not a JSON object"))?;
    let claims = json_object(payload).ok_or(Unfit::NotJwt("its payload is not a JSON object"))?;
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| Unfit::NotJwt("its signature is not base64url"))?;
    let sub = claims.get("sub").and_then(serde_json::Value::as_str);
    if sub != Some(want) {
        return Err(Unfit::WrongSubject {
            found: sub.map_or_else(|| "missing".into(), quoted),
            want: want.to_string(),
        });
    }
    jwt_claims(token).ok_or(Unfit::NotJwt("its claims do not parse"))
}

fn rewrite(why: impl Into<String>) -> Unfit {
    Unfit::Rewrite(why.into())
}

fn name_of(v: &serde_yaml::Value) -> Option<&str> {
    v.get("name").and_then(serde_yaml::Value::as_str)
}

/// The name of the user of a kubeconfig document's current context (else of its only one).
fn current_user(doc: &serde_yaml::Value) -> Result<String, Unfit> {
    let contexts = doc
        .get("contexts")
        .and_then(serde_yaml::Value::as_sequence)
        .ok_or_else(|| rewrite("it has no contexts"))?;
    let context = match doc
        .get("current-context")
        .and_then(serde_yaml::Value::as_str)
    {
        Some(cur) => contexts.iter().find(|c| name_of(c) == Some(cur)),
        None if contexts.len() == 1 => contexts.first(),
        None => None,
    }
    .ok_or_else(|| rewrite("it has no current context"))?;
    context
        .get("context")
        .and_then(|c| c.get("user"))
        .and_then(serde_yaml::Value::as_str)
        .map(String::from)
        .ok_or_else(|| rewrite("its current context names no user"))
}

/// Pure: the kubeconfig text with the token of its current context's user set to `token`. The
/// YAML is parsed, that one field set, and the document serialized again (never spliced as
/// text, so no token can add YAML of its own); comments and layout are not kept.
pub fn with_token(text: &str, token: &str) -> Result<String, Unfit> {
    let mut doc: serde_yaml::Value = serde_yaml::from_str(text)
        .map_err(|e| rewrite(format!("not one YAML document: {}", one_line(e))))?;
    let user = current_user(&doc)?;
    let users = doc
        .get_mut("users")
        .and_then(serde_yaml::Value::as_sequence_mut)
        .ok_or_else(|| rewrite("it has no users"))?;
    let mut named = users
        .iter_mut()
        .filter(|u| name_of(u) == Some(user.as_str()));
    let (Some(entry), None) = (named.next(), named.next()) else {
        return Err(rewrite(format!("user {user:?} is not in it exactly once")));
    };
    let fields = entry
        .get_mut("user")
        .and_then(serde_yaml::Value::as_mapping_mut)
        .filter(|f| f.contains_key("token"))
        .ok_or_else(|| rewrite(format!("user {user:?} has no token")))?;
    fields.insert("token".into(), token.into());
    serde_yaml::to_string(&doc).map_err(|e| rewrite(one_line(e)))
}

fn one_line(e: impl std::fmt::Display) -> String {
    e.to_string().replace('\n', " ")
}

/// Pure: the Secret as a renewal writes it: its kubeconfig rewritten by [`with_token`], then
/// checked as a Secret's kubeconfig is before any client is built (`client::policy`), and
/// proven to differ from the one read in nothing but its current user's token.
pub fn renewed_secret(s: &Secret, token: &str, allowed_exec: &[String]) -> Result<Secret, Unfit> {
    let text = crate::remotes::remote_secret::kubeconfig_text(s).map_err(rewrite)?;
    let old = Kubeconfig::from_yaml(&text).map_err(|e| rewrite(one_line(e)))?;
    let new_text = with_token(&text, token)?;
    let new = Kubeconfig::from_yaml(&new_text)
        .map_err(|e| rewrite(format!("the result does not parse: {}", one_line(e))))?;
    crate::client::policy::check(&new, allowed_exec)?;
    let mut want = old;
    let user = current_user_index(&want)
        .and_then(|i| want.auth_infos.get_mut(i)?.auth_info.as_mut())
        .ok_or_else(|| rewrite("its current context names no user"))?;
    user.token = Some(token.to_string().into());
    let (want, new) = (serde_json::to_value(&want), serde_json::to_value(&new));
    if !matches!((&want, &new), (Ok(a), Ok(b)) if a == b) {
        return Err(rewrite("the result differs in more than the token"));
    }
    let mut s = s.clone();
    s.data.get_or_insert_with(BTreeMap::new).insert(
        crate::remotes::remote_secret::DATA_KEY.into(),
        ByteString(new_text.into_bytes()),
    );
    s.string_data = None;
    s.metadata.managed_fields = None;
    crate::remotes::remote_secret::read_secret(&s).map_err(rewrite)?;
    Ok(s)
}

/// What a renewal did.
#[derive(Debug, PartialEq)]
enum Renewed {
    /// nothing to do: the Secret changed meanwhile, is gone, or asks for no renewal
    Nothing,
    /// a new token, valid until then, was written into the Secret
    Until(Option<Timestamp>),
}

/// Why a renewal did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RenewError {
    #[error("{0}")]
    Refused(String),
    #[error("remote TokenRequest: {0}")]
    Remote(String),
    #[error(transparent)]
    Unfit(#[from] Unfit),
    #[error("writing the Secret back: {0}")]
    Local(#[from] crate::error::Error),
}

/// Renews the tokens of Secret remotes that ask for it, on the leader (not in a dry run).
pub struct Renewer {
    ctl: Arc<Controller>,
    namespace: String,
    before: RenewBefore,
    timeout: Duration,
    /// a dry run renews nothing (it would write the Secret)
    dry_run: bool,
    /// exec commands a remote Secret's kubeconfig may run (the policy a renewed one passes)
    allowed_exec: Vec<String>,
    /// remote -> (earliest next attempt, current back-off)
    backoff: BTreeMap<String, (Timestamp, Duration)>,
    /// remote -> the Secret hash a renewal was written from (not renewed again until rotated)
    written: BTreeMap<String, String>,
}

impl Renewer {
    /// Renews the tokens of Secret remotes (in `namespace`, the daemon's) `before` they expire;
    /// a dry run renews nothing. A renewed kubeconfig passes the Secret policy with
    /// `allowed_exec`, as the Secret's did.
    pub fn new(
        ctl: Arc<Controller>,
        namespace: &str,
        (before, timeout): (RenewBefore, Duration),
        dry_run: bool,
        allowed_exec: Vec<String>,
    ) -> Self {
        Self {
            ctl,
            namespace: namespace.to_string(),
            before,
            timeout,
            dry_run,
            allowed_exec,
            backoff: BTreeMap::new(),
            written: BTreeMap::new(),
        }
    }

    pub async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if self.ctl.is_leader() && !self.dry_run {
                self.pass().await;
            }
        }
    }

    /// Each Secret remote whose token is due, renewed (one at a time).
    async fn pass(&mut self) {
        let now = Timestamp::now();
        for m in self.ctl.remotes().members() {
            let Origin::Secret { name, hash } = &m.origin else {
                continue;
            };
            let remote = m.name().to_string();
            let Some(c) = m.state.credential.get() else {
                continue;
            };
            let due = due_at(c, self.before).is_some_and(|at| at <= now);
            let waiting = self.backoff.get(&remote).is_some_and(|(at, _)| *at > now);
            if !due || waiting || self.written.get(&remote) == Some(hash) {
                continue;
            }
            match self.renew(&m, name, hash).await {
                Ok(Renewed::Nothing) => {}
                Ok(Renewed::Until(exp)) => self.renewed(&m, name, hash, exp).await,
                Err(e) => self.failed(&m, name, e).await,
            }
        }
        let live: Vec<String> = self
            .ctl
            .remotes()
            .members()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        self.backoff.retain(|r, _| live.contains(r));
        self.written.retain(|r, _| live.contains(r));
    }

    /// Reads the Secret, mints a token on the remote, writes it back.
    async fn renew(&self, m: &Member, secret: &str, hash: &str) -> Result<Renewed, RenewError> {
        let w = self.ctl.writer();
        let Some(s) = w.get::<Secret>(&self.namespace, secret).await? else {
            return Ok(Renewed::Nothing);
        };
        let c = crate::remotes::remote_secret::read_secret(&s).map_err(RenewError::Refused)?;
        if c.hash != hash {
            return Ok(Renewed::Nothing); // rotated meanwhile: the next pass sees the new one
        }
        let Some(r) = renewal_of(s.annotations()).map_err(RenewError::Refused)? else {
            return Ok(Renewed::Nothing);
        };
        let old = user_of(&c.kubeconfig)
            .and_then(|u| u.token.as_ref())
            .map(|t| t.expose_secret().to_string())
            .ok_or_else(|| RenewError::Refused("its kubeconfig's user has no token".into()))?;
        let want = format!(
            "system:serviceaccount:{}:{}",
            r.namespace, r.service_account
        );
        let sub = jwt_claims(&old).and_then(|c| c.subject);
        if sub.as_deref() != Some(want.as_str()) {
            return Err(RenewError::Refused(format!(
                "its token is for {sub:?}, not {want} ({RENEWAL_KEY})"
            )));
        }
        let token = self.mint(m, &r).await?;
        let minted = check_minted(&token, &want)?;
        let renewed = renewed_secret(&s, &token, &self.allowed_exec)?;
        w.replace(&renewed).await?;
        Ok(Renewed::Until(minted.expiry))
    }

    /// A new token of the Secret's ServiceAccount, asked for with the remote's current client.
    async fn mint(&self, m: &Member, r: &Renewal) -> Result<String, RenewError> {
        let api: Api<ServiceAccount> = Api::namespaced(m.client.clone(), &r.namespace);
        let req = TokenRequest {
            spec: TokenRequestSpec {
                expiration_seconds: Some(i64::try_from(r.lifetime.as_secs()).unwrap_or(i64::MAX)),
                ..Default::default()
            },
            ..Default::default()
        };
        let pp = PostParams::default();
        let sent = api.create_subresource("token", &r.service_account, &pp, &req);
        let minted: TokenRequest = tokio::time::timeout(self.timeout, sent)
            .await
            .map_err(|_| RenewError::Remote(format!("no answer within {:?}", self.timeout)))?
            .map_err(|e| RenewError::Remote(detail(&crate::error::chain(&e))))?;
        minted
            .status
            .map(|s| s.token)
            .ok_or_else(|| RenewError::Remote("no token in the answer".into()))
    }

    async fn renewed(&mut self, m: &Member, secret: &str, hash: &str, exp: Option<Timestamp>) {
        let remote = m.name().to_string();
        self.backoff.remove(&remote);
        self.written.insert(remote.clone(), hash.to_string());
        self.count(&remote, "renewed");
        let until = exp.map_or("-".into(), |e| e.to_string());
        info!(remote = %remote, secret = %secret, valid_until = %until, "remote token renewed");
        let note = format!("token of remote {remote} renewed, valid until {until}");
        self.event(secret, EventType::Normal, "CredentialRenewed", note)
            .await;
    }

    async fn failed(&mut self, m: &Member, secret: &str, e: RenewError) {
        let remote = m.name().to_string();
        let now = Timestamp::now();
        let delay = self
            .backoff
            .get(&remote)
            .map_or(BACKOFF.0, |(_, d)| (*d * 2).min(BACKOFF.1));
        let next = now
            .checked_add(SignedDuration::try_from(delay).unwrap_or_default())
            .unwrap_or(now);
        self.backoff.insert(remote.clone(), (next, delay));
        if matches!(&e, RenewError::Local(crate::error::Error::NotLeader)) {
            return;
        }
        self.count(&remote, "failed");
        let expiry = m.state.credential.get().and_then(|c| c.expiry);
        let left = expiry.map_or("-".into(), |x| {
            format!("{}s", x.duration_since(now).as_secs())
        });
        warn!(remote = %remote, secret = %secret, retry_in_s = delay.as_secs(), token_left = %left,
              "remote token not renewed (the current one is used while valid): {e}");
        let note = format!("token of remote {remote} not renewed: {e}");
        self.event(secret, EventType::Warning, "CredentialRenewalFailed", note)
            .await;
    }

    fn count(&self, remote: &str, outcome: &str) {
        self.ctl
            .metrics()
            .credential_renewals
            .get_or_create(&ByRemoteOutcome::new(remote, outcome))
            .inc();
    }

    async fn event(&self, secret: &str, kind: EventType, reason: &str, note: String) {
        let mut s = Secret::default();
        s.metadata.name = Some(secret.to_string());
        s.metadata.namespace = Some(self.namespace.clone());
        let reference = s.object_ref(&());
        self.ctl
            .event(kind, reason, note, "RenewCredential", Some(reference))
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    /// An unsigned JWT with these claims (the daemon never verifies the signature).
    fn jwt(claims: serde_json::Value) -> String {
        let b = |v: &serde_json::Value| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string())
        };
        format!("{}.{}.c2ln", b(&json!({"alg": "RS256"})), b(&claims))
    }

    /// notAfter 2026-12-25T02:49:24Z (openssl req -x509 ... -days 30)
    const CERT: &str = include_str!("credentials_testdata/client.pem");

    fn user(token: Option<&str>, cert: Option<&str>) -> AuthInfo {
        AuthInfo {
            token: token.map(|t| t.to_string().into()),
            client_certificate_data: cert
                .map(|c| base64::engine::general_purpose::STANDARD.encode(c)),
            ..Default::default()
        }
    }

    #[test]
    fn a_tokens_expiry_is_its_exp_and_a_certificates_its_not_after() {
        let t = jwt(json!({"exp": 1_800_000_000, "iat": 1_799_996_400,
                           "sub": "system:serviceaccount:fair-system:reader"}));
        let c = credential(&user(Some(&t), None));
        assert_eq!(
            c.expiry,
            Some(Timestamp::from_second(1_800_000_000).unwrap())
        );
        assert_eq!(
            c.issued,
            Some(Timestamp::from_second(1_799_996_400).unwrap())
        );
        assert_eq!(
            c.subject.as_deref(),
            Some("system:serviceaccount:fair-system:reader")
        );
        let c = credential(&user(None, Some(CERT)));
        assert_eq!(c.expiry, Some(at("2026-12-25T02:49:24Z")));
        // both: the earlier one ends the access
        let later = jwt(json!({"exp": at("2030-01-01T00:00:00Z").as_second()}));
        let c = credential(&user(Some(&later), Some(CERT)));
        assert_eq!(c.expiry, Some(at("2026-12-25T02:49:24Z")));
    }

    #[test]
    fn a_credential_that_tells_nothing_has_no_expiry() {
        for bad in [
            "static-token",
            "a.b.c",
            "x.!!!.y",
            &jwt(json!({"sub": "x"})),
        ] {
            assert_eq!(credential(&user(Some(bad), None)).expiry, None, "{bad}");
        }
        assert_eq!(credential(&user(None, Some("not pem"))).expiry, None);
        assert_eq!(credential(&AuthInfo::default()), Credential::default());
    }

    #[test]
    fn the_user_is_the_current_contexts() {
        let kc = Kubeconfig::from_yaml(
            "apiVersion: v1\nkind: Config\nclusters: []\nusers:\n- name: a\n  user: {token: aaa}\n- name: b\n  user: {token: bbb}\n\
             contexts:\n- name: x\n  context: {cluster: c, user: a}\n- name: y\n  context: {cluster: c, user: b}\ncurrent-context: y\n",
        )
        .unwrap();
        let token = user_of(&kc).and_then(|u| u.token.as_ref()).unwrap();
        assert_eq!(token.expose_secret(), "bbb");
    }

    #[test]
    fn renew_before_is_a_share_or_a_window() {
        assert_eq!(parse_renew_before("20%"), Ok(RenewBefore::Percent(20)));
        assert_eq!(parse_renew_before("off"), Ok(RenewBefore::Off));
        assert_eq!(
            parse_renew_before("24h"),
            Ok(RenewBefore::Window(Duration::from_secs(86400)))
        );
        assert_eq!(
            parse_renew_before("90"),
            Ok(RenewBefore::Window(Duration::from_secs(90)))
        );
        for bad in ["0%", "100%", "x%", "0", "1y", "", "h"] {
            assert!(parse_renew_before(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn renewal_is_due_a_window_or_share_before_expiry_and_never_within_min_age_of_issue() {
        let c = Credential {
            expiry: Some(at("2026-01-11T00:00:00Z")),
            issued: Some(at("2026-01-01T00:00:00Z")),
            subject: None,
        };
        let window = |s| RenewBefore::Window(Duration::from_secs(s));
        assert_eq!(
            due_at(&c, RenewBefore::Percent(20)),
            Some(at("2026-01-09T00:00:00Z"))
        );
        assert_eq!(due_at(&c, window(86400)), Some(at("2026-01-10T00:00:00Z")));
        // a window wider than the lifetime: at once, but not within MIN_AGE of issue
        assert_eq!(
            due_at(&c, window(30 * 86400)),
            Some(at("2026-01-01T00:00:30Z"))
        );
        let no_exp = Credential {
            expiry: None,
            ..c.clone()
        };
        assert_eq!(
            due_at(&no_exp, window(60)),
            None,
            "no exp: nothing to renew"
        );
        assert_eq!(due_at(&c, RenewBefore::Off), None);
    }

    #[test]
    fn renewal_annotations_name_a_service_account_and_a_lifetime() {
        let ann = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        assert_eq!(renewal_of(&ann(&[])), Ok(None));
        let r = renewal_of(&ann(&[
            (RENEWAL_KEY, "fair-system/reader"),
            (LIFETIME_KEY, "24h"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(
            (r.namespace.as_str(), r.service_account.as_str(), r.lifetime),
            ("fair-system", "reader", Duration::from_secs(86400))
        );
        for bad in ["reader", "a/b/c", "../x", "Fair/reader", "/reader", "ns/"] {
            let e = renewal_of(&ann(&[(RENEWAL_KEY, bad)])).unwrap_err();
            assert!(e.contains(RENEWAL_KEY) && !e.contains('\n'), "{bad}: {e}");
        }
        let e = renewal_of(&ann(&[(RENEWAL_KEY, "a/b"), (LIFETIME_KEY, "5m")])).unwrap_err();
        assert!(e.contains("10 minutes"), "{e}");
    }

    const SA: &str = "system:serviceaccount:fair-system:reader";

    #[test]
    fn a_minted_token_is_a_jwt_of_the_expected_account() {
        let good = jwt(json!({"sub": SA, "exp": 1_800_000_600, "iat": 1_800_000_000}));
        let c = check_minted(&good, SA).unwrap();
        assert_eq!(
            c.expiry,
            Some(Timestamp::from_second(1_800_000_600).unwrap())
        );
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let (head, body) = (
            b(r#"{"alg":"RS256"}"#),
            b(&json!({ "sub": SA }).to_string()),
        );
        let not_jwt = [
            format!("{good}\n    exec: {{command: /bin/sh}}"),
            format!("{good}\"\n  exec: x"),
            "static-token".into(),
            format!("{head}.{body}"),
            format!("{head}.{body}.c2ln.c2ln"),
            format!("{head}.{body}."),
            format!("{head}.{body}.c2l=n"),
            format!("{head}.{body}.c2ln "),
            format!("{}.{body}.c2ln", b("[1]")),
            format!("{head}.{}.c2ln", b("not json")),
            format!("{head}.{}.c2ln", b("\"a string\"")),
            format!("{head}.{body}.{}", "A".repeat(MAX_TOKEN_BYTES)),
        ];
        for bad in not_jwt {
            let e = check_minted(&bad, SA).unwrap_err();
            assert!(matches!(e, Unfit::NotJwt(_)), "{bad:?}: {e}");
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        let other = jwt(json!({"sub": "system:serviceaccount:kube-system:admin"}));
        let e = check_minted(&other, SA).unwrap_err();
        assert!(e.to_string().contains("kube-system:admin"), "{e}");
        let none = check_minted(&jwt(json!({"exp": 1})), SA).unwrap_err();
        assert!(none.to_string().contains("missing"), "{none}");
        // what the remote wrote is quoted and cut short in the message
        let long = format!("x\ny{}", "z".repeat(500));
        let e = check_minted(&jwt(json!({ "sub": long })), SA).unwrap_err();
        let msg = e.to_string();
        assert!(!msg.contains('\n') && msg.len() < 300, "{msg}");
    }

    const KC: &str = "apiVersion: v1\nkind: Config\n# a comment\nclusters:\n- name: east\n  cluster: {server: 'https://127.0.0.1:1'}\n\
        users:\n- name: other\n  user: {token: keep.this.one}\n- name: r\n  user: {token: old.tok.en}\n\
        contexts:\n- name: x\n  context: {cluster: east, user: other}\n- name: east\n  context: {cluster: east, user: r}\ncurrent-context: east\n";

    fn token_of(text: &str, user: &str) -> String {
        let kc = Kubeconfig::from_yaml(text).unwrap();
        let u = kc.auth_infos.iter().find(|a| a.name == user).unwrap();
        let t = u.auth_info.as_ref().and_then(|a| a.token.as_ref()).unwrap();
        t.expose_secret().to_string()
    }

    #[test]
    fn the_new_token_is_set_as_yaml_on_the_current_user_only() {
        let text = with_token(KC, "new.tok.en").unwrap();
        assert_eq!(token_of(&text, "r"), "new.tok.en");
        assert_eq!(token_of(&text, "other"), "keep.this.one");
        // a token with YAML in it stays one string: it adds no field
        let hostile = "a.b.c\n    exec: {command: /bin/sh}\nusers: []";
        let text = with_token(KC, hostile).unwrap();
        assert_eq!(token_of(&text, "r"), hostile);
        let kc = Kubeconfig::from_yaml(&text).unwrap();
        assert!(crate::client::policy::check(&kc, &[]).is_ok(), "{text}");
        assert_eq!(kc.auth_infos.len(), 2);
    }

    #[test]
    fn a_kubeconfig_without_one_current_user_with_a_token_is_not_rewritten() {
        let cases = [
            ("not: [yaml", "not one YAML document"),
            ("a: 1\n---\nb: 2\n", "not one YAML document"),
            ("users: []\n", "no contexts"),
            (
                &KC.replace("current-context: east", "current-context: gone"),
                "no current context",
            ),
            (&KC.replace("user: r}", "namespace: x}"), "names no user"),
            (
                &KC.replace("- name: other", "- name: r"),
                "not in it exactly once",
            ),
            (
                &KC.replace("{token: old.tok.en}", "{client-key-data: eA==}"),
                "has no token",
            ),
        ];
        for (text, why) in cases {
            let e = with_token(text, "new.tok.en").unwrap_err().to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    fn secret_of(text: &str) -> Secret {
        let data = base64::engine::general_purpose::STANDARD.encode(text);
        serde_json::from_value(
            json!({"metadata": {"name": "east-secret", "resourceVersion": "7"},
                                      "data": {"kubeconfig": data}}),
        )
        .unwrap()
    }

    #[test]
    fn a_renewed_secret_differs_only_in_the_token_and_passes_the_policy() {
        let token = jwt(json!({ "sub": SA }));
        let s = renewed_secret(&secret_of(KC), &token, &[]).unwrap();
        let text = crate::remotes::remote_secret::kubeconfig_text(&s).unwrap();
        assert_eq!(token_of(&text, "r"), token);
        assert_eq!(s.metadata.resource_version.as_deref(), Some("7"));
        // a kubeconfig the policy refuses is not written back, whatever the token
        let exec = KC.replace(
            "{token: old.tok.en}",
            "{token: old.tok.en, exec: {command: /bin/sh}}",
        );
        let e = renewed_secret(&secret_of(&exec), &token, &[]).unwrap_err();
        assert!(matches!(e, Unfit::Policy(_)), "{e}");
        let ok = renewed_secret(&secret_of(&exec), &token, &["/bin/sh".into()]);
        assert!(ok.is_ok(), "{ok:?}");
    }

    mod renewal {
        use super::*;
        use crate::fixtures::{self, ApiServer, created, ok, run, status};
        use crate::state::Member;
        use crate::state::{LocalState, RemoteState};

        const SECRET: &str = "/api/v1/namespaces/fair-system/secrets/east-secret";
        const TOKEN: &str = "/api/v1/namespaces/fair-system/serviceaccounts/reader/token";

        fn token(sub: &str, iat: i64) -> String {
            jwt(json!({"sub": sub, "iat": iat, "exp": iat + 600}))
        }

        fn secret(token: &str) -> Secret {
            let kc = format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: east\n  cluster: {{server: 'https://127.0.0.1:1'}}\n\
                 users:\n- name: r\n  user: {{token: \"{token}\"}}\ncontexts:\n- name: east\n  context: {{cluster: east, user: r}}\ncurrent-context: east\n"
            );
            fixtures::obj(json!({
                "metadata": {"name": "east-secret", "namespace": "fair-system", "resourceVersion": "7",
                             "labels": {"fair.com/cross-cluster-remote": "true"},
                             "annotations": {RENEWAL_KEY: "fair-system/reader", LIFETIME_KEY: "600s"}},
                "data": {"kubeconfig": base64::engine::general_purpose::STANDARD.encode(kc)},
            }))
        }

        /// A renewer and the member it renews, both talking to one mock API server (the
        /// member's client is the remote, the writer the local cluster).
        fn setup(
            s: &Secret,
        ) -> (
            Renewer,
            Member,
            ApiServer,
            tokio::sync::watch::Sender<Option<std::time::Instant>>,
        ) {
            let (client, api) = fixtures::client("local and remote");
            let (tx, leader) = fixtures::leadership(true);
            let ctx = fixtures::ctx(
                client.clone(),
                leader.clone(),
                vec![],
                Arc::new(LocalState::default()),
            );
            let queue = crate::runtime::queue::WorkQueue::new();
            let ctl = Arc::new(Controller::new(Arc::new(ctx), queue, leader));
            let hash = crate::remotes::remote_secret::read_secret(s).unwrap().hash;
            let member = Member {
                state: Arc::new(RemoteState::new("east", fixtures::opts(), vec![])),
                client,
                cluster_id: None,
                origin: Origin::Secret {
                    name: "east-secret".into(),
                    hash,
                },
                cancel: tokio_util::sync::CancellationToken::new(),
            };
            let before = RenewBefore::Percent(20);
            let timing = (before, Duration::from_secs(5));
            let r = Renewer::new(ctl, "fair-system", timing, false, vec![]);
            (r, member, api, tx)
        }

        fn hash(m: &Member) -> String {
            match &m.origin {
                Origin::Secret { hash, .. } => hash.clone(),
                Origin::Static | Origin::Profile { .. } => unreachable!(),
            }
        }

        #[tokio::test]
        async fn a_due_token_is_minted_on_the_remote_and_written_back_with_its_resource_version() {
            let old = token("system:serviceaccount:fair-system:reader", 1_800_000_000);
            let new = token("system:serviceaccount:fair-system:reader", 1_800_000_500);
            let s = secret(&old);
            let (r, m, api, _lease) = setup(&s);
            let done = run(&[&api], r.renew(&m, "east-secret", &hash(&m)), async {
                api.expect(fixtures::get(SECRET), ok(serde_json::to_value(&s).unwrap()))
                    .await;
                let asked = api
                    .expect(
                        fixtures::post(TOKEN),
                        created(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                       "spec": {"audiences": []},
                                       "status": {"token": new, "expirationTimestamp": "2027-01-15T08:08:20Z"}})),
                    )
                    .await;
                assert_eq!(asked.body["spec"]["expirationSeconds"], 600, "the annotated lifetime");
                let put = api
                    .expect(
                        fixtures::put(SECRET).query("fieldManager", crate::reconcile::writer::FIELD_MANAGER),
                        ok(serde_json::to_value(&s).unwrap()),
                    )
                    .await;
                assert_eq!(put.body["metadata"]["resourceVersion"], "7", "compare-and-swap");
                let kc = base64::engine::general_purpose::STANDARD
                    .decode(put.body["data"]["kubeconfig"].as_str().unwrap())
                    .unwrap();
                let kc = String::from_utf8(kc).unwrap();
                assert!(kc.contains(&new) && !kc.contains(&old), "{kc}");
            })
            .await;
            assert_eq!(
                done.unwrap(),
                Renewed::Until(Some(Timestamp::from_second(1_800_001_100).unwrap()))
            );
        }

        #[tokio::test]
        async fn a_token_of_another_account_is_not_renewed_and_nothing_is_sent() {
            let s = secret(&token(
                "system:serviceaccount:kube-system:admin",
                1_800_000_000,
            ));
            let (r, m, api, _lease) = setup(&s);
            let done = run(&[&api], r.renew(&m, "east-secret", &hash(&m)), async {
                api.expect(fixtures::get(SECRET), ok(serde_json::to_value(&s).unwrap()))
                    .await;
            })
            .await;
            assert!(
                matches!(&done, Err(RenewError::Refused(why)) if why.contains("kube-system:admin")),
                "{done:?}"
            );
        }

        #[tokio::test]
        async fn a_secret_changed_meanwhile_is_not_overwritten() {
            let old = token("system:serviceaccount:fair-system:reader", 1_800_000_000);
            let s = secret(&old);
            let (r, m, api, _lease) = setup(&s);
            // the Secret was edited since the remote joined: another hash, nothing sent
            let mut edited = s.clone();
            edited.annotations_mut().insert(
                crate::remotes::remote_secret::STALE_AFTER_KEY.into(),
                "60".into(),
            );
            let done = run(&[&api], r.renew(&m, "east-secret", &hash(&m)), async {
                api.expect(
                    fixtures::get(SECRET),
                    ok(serde_json::to_value(&edited).unwrap()),
                )
                .await;
            })
            .await;
            assert!(matches!(done, Ok(Renewed::Nothing)), "{done:?}");
            // changed between the read and the write: the PUT's resourceVersion loses, a 409
            let new = token("system:serviceaccount:fair-system:reader", 1_800_000_500);
            let done = run(&[&api], r.renew(&m, "east-secret", &hash(&m)), async {
                api.expect(fixtures::get(SECRET), ok(serde_json::to_value(&s).unwrap()))
                    .await;
                api.expect(
                    fixtures::post(TOKEN),
                    created(json!({"status": {"token": new, "expirationTimestamp": "2027-01-15T08:08:20Z"}})),
                )
                .await;
                api.expect(fixtures::put(SECRET), status(409, "Conflict")).await;
            })
            .await;
            assert!(
                matches!(&done, Err(RenewError::Local(e)) if e.api_code() == Some(409)),
                "{done:?}"
            );
        }
    }
}
