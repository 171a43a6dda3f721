//! Running a provider's exec credential plugin for one profile, as client-go's exec
//! authenticator does (the daemon's environment, the provider's on top, `KUBERNETES_EXEC_INFO`),
//! but bounded: no standard input, a time limit after which the plugin is killed, and at most
//! [`MAX_OUTPUT`] bytes of its output read. A plugin that fails, hangs or answers nonsense is one
//! line naming the plugin and the reason; nothing else changes.
//!
//! The daemon runs the plugin itself rather than giving kube-rs an `exec` entry: kube's
//! authenticator runs it blocking a runtime thread with no time limit, and re-runs it only after
//! expiry. Here the credential it gives becomes inline data of the remote's kubeconfig, so it
//! goes through the same policy, expiry metrics and rotation as a Secret's.
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use serde::Deserialize;
use thiserror::Error;
use tokio::io::AsyncReadExt;

use super::access::Invocation;

/// The most of a plugin's standard output (and, apart, its standard error) that is read.
pub const MAX_OUTPUT: u64 = 1 << 20;

/// Why a plugin gave no credential.
#[derive(Debug, Error)]
pub enum PluginError {
    #[error("plugin {command} (provider {provider:?}) could not be started: {why}")]
    Start {
        provider: String,
        command: String,
        why: String,
    },
    #[error(
        "plugin {command} (provider {provider:?}) did not answer within {}s; it was killed",
        after.as_secs()
    )]
    Hung {
        provider: String,
        command: String,
        after: Duration,
    },
    #[error("plugin {command} (provider {provider:?}) failed ({status}): {stderr}")]
    Failed {
        provider: String,
        command: String,
        status: String,
        stderr: String,
    },
    #[error("plugin {command} (provider {provider:?}) answered no ExecCredential: {why}")]
    Answer {
        provider: String,
        command: String,
        why: String,
    },
}

/// What a plugin gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issued {
    pub token: Option<String>,
    /// a client certificate and its key, PEM
    pub certificate: Option<(String, String)>,
    /// when the plugin says the credential expires
    pub expiry: Option<Timestamp>,
}

/// Runs the plugin; kills it after `limit`.
pub async fn run(inv: &Invocation, limit: Duration) -> Result<Issued, PluginError> {
    let start = |why: String| PluginError::Start {
        provider: inv.provider.clone(),
        command: inv.command.clone(),
        why,
    };
    let mut child = tokio::process::Command::new(&inv.command)
        .args(&inv.args)
        .envs(inv.env.iter().map(|(k, v)| (k, v)))
        .env("KUBERNETES_EXEC_INFO", &inv.exec_info)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| start(e.to_string()))?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(start("no pipes".into()));
    };
    let read = async {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (mut stdout, mut stderr) = (stdout.take(MAX_OUTPUT), stderr.take(MAX_OUTPUT));
        let (o, e) = tokio::join!(stdout.read_to_end(&mut out), stderr.read_to_end(&mut err));
        let status = child.wait().await;
        (o.and(e).and(status), out, err)
    };
    let (status, out, err) = match tokio::time::timeout(limit, read).await {
        Ok(done) => done,
        // dropping the future drops the child: kill_on_drop kills it
        Err(_) => {
            return Err(PluginError::Hung {
                provider: inv.provider.clone(),
                command: inv.command.clone(),
                after: limit,
            });
        }
    };
    let status = status.map_err(|e| start(e.to_string()))?;
    if !status.success() {
        return Err(PluginError::Failed {
            provider: inv.provider.clone(),
            command: inv.command.clone(),
            status: status.to_string(),
            stderr: last_line(&err),
        });
    }
    parse_credential(&out, &inv.api_version).map_err(|why| PluginError::Answer {
        provider: inv.provider.clone(),
        command: inv.command.clone(),
        why,
    })
}

/// The last non-empty line of a plugin's standard error, at most 300 characters.
fn last_line(err: &[u8]) -> String {
    let text = String::from_utf8_lossy(err);
    let line = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no message on standard error)")
        .trim();
    line.chars().take(300).collect()
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Credential {
    api_version: String,
    kind: String,
    status: Option<CredentialStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CredentialStatus {
    #[serde(default)]
    token: Option<String>,
    #[serde(default)]
    client_certificate_data: Option<String>,
    #[serde(default)]
    client_key_data: Option<String>,
    #[serde(default)]
    expiration_timestamp: Option<String>,
}

/// Pure: the credential in a plugin's answer (an ExecCredential of the version asked for, with a
/// token or a client certificate and key), or why there is none.
pub fn parse_credential(out: &[u8], api_version: &str) -> Result<Issued, String> {
    let c: Credential =
        serde_json::from_slice(out).map_err(|e| format!("not an ExecCredential: {e}"))?;
    if c.kind != "ExecCredential" || c.api_version != api_version {
        return Err(format!(
            "it is a {} {}, not the ExecCredential {api_version} asked for",
            c.kind, c.api_version
        ));
    }
    let s = c.status.ok_or("it has no status")?;
    let expiry = s
        .expiration_timestamp
        .map(|t| {
            t.parse::<Timestamp>()
                .map_err(|e| format!("status.expirationTimestamp {t:?}: {e}"))
        })
        .transpose()?;
    let token = s.token.filter(|t| !t.is_empty());
    let certificate = match (s.client_certificate_data, s.client_key_data) {
        (Some(c), Some(k)) if !c.is_empty() && !k.is_empty() => Some((c, k)),
        (None, None) => None,
        _ => return Err("it has a client certificate without its key, or a key without it".into()),
    };
    if token.is_none() && certificate.is_none() {
        return Err("it has neither a token nor a client certificate".into());
    }
    Ok(Issued {
        token,
        certificate,
        expiry,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const V1: &str = "client.authentication.k8s.io/v1";

    fn invocation(command: &str, args: &[&str]) -> Invocation {
        Invocation {
            provider: "test".into(),
            command: command.into(),
            args: args.iter().map(ToString::to_string).collect(),
            env: vec![("GREETING".into(), "hello".into())],
            api_version: V1.into(),
            exec_info: r#"{"kind":"ExecCredential"}"#.into(),
        }
    }

    #[test]
    fn a_token_or_a_certificate_is_a_credential() {
        let t = parse_credential(
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"abc","expirationTimestamp":"2030-01-02T03:04:05Z"}}"#,
            V1,
        )
        .unwrap();
        assert_eq!(t.token.as_deref(), Some("abc"));
        assert_eq!(t.expiry, Some("2030-01-02T03:04:05Z".parse().unwrap()));
        let c = parse_credential(
            br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"C","clientKeyData":"K"}}"#,
            V1,
        )
        .unwrap();
        assert_eq!(c.certificate, Some(("C".into(), "K".into())));
    }

    #[test]
    fn a_bad_answer_says_what_is_wrong() {
        for (out, want) in [
            (&b"not json"[..], "not an ExecCredential"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1beta1","kind":"ExecCredential","status":{"token":"a"}}"#, "asked for"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential"}"#, "no status"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{}}"#, "neither a token"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"clientCertificateData":"C"}}"#, "without its key"),
            (br#"{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"a","expirationTimestamp":"soon"}}"#, "expirationTimestamp"),
        ] {
            let why = parse_credential(out, V1).unwrap_err();
            assert!(why.contains(want), "{why}");
        }
    }

    #[tokio::test]
    async fn a_plugin_gets_the_exec_info_and_its_environment_and_answers() {
        // a shell as the plugin: it echoes back what it was given, as a token
        let script = r#"printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s-%s-%s"}}' "$GREETING" "$1" "$(printf %s "$KUBERNETES_EXEC_INFO" | wc -c)""#;
        let inv = invocation("/bin/sh", &["-c", script, "sh", "arg"]);
        let issued = run(&inv, Duration::from_secs(10)).await.unwrap();
        let want = format!("hello-arg-{}", inv.exec_info.len());
        assert_eq!(issued.token.as_deref(), Some(want.as_str()));
    }

    #[tokio::test]
    async fn a_failing_plugin_is_one_line_with_its_last_words() {
        let inv = invocation(
            "/bin/sh",
            &[
                "-c",
                "echo starting >&2; echo 'secret x not found' >&2; exit 3",
            ],
        );
        let why = run(&inv, Duration::from_secs(10))
            .await
            .unwrap_err()
            .to_string();
        assert!(
            why.contains("secret x not found") && why.contains("exit status: 3"),
            "{why}"
        );
        assert!(!why.contains('\n'));
        let missing = invocation("/nonexistent/plugin", &[]);
        let why = run(&missing, Duration::from_secs(10)).await.unwrap_err();
        assert!(matches!(why, PluginError::Start { .. }), "{why}");
    }

    #[tokio::test]
    async fn a_hanging_plugin_is_killed_at_the_limit() {
        let inv = invocation("/bin/sh", &["-c", "echo $$ >&2; exec sleep 600"]);
        let started = std::time::Instant::now();
        let why = run(&inv, Duration::from_millis(500)).await.unwrap_err();
        assert!(matches!(why, PluginError::Hung { .. }), "{why}");
        assert!(started.elapsed() < Duration::from_secs(30));
    }
}
