//! What a remote Secret's kubeconfig may hold. A Secret is written by whoever may write Secrets
//! in the daemon's namespace, so its kubeconfig is untrusted input: it must never run a program
//! or read a file of the daemon (kube's `Config::from_custom_kubeconfig` reads file references,
//! and its auth layer runs `exec` and the `gcp` auth-provider's `cmd-path`). [`check`] is pure
//! and runs before anything is built from the kubeconfig.
//!
//! An allow-list, not a deny-list: every cluster, user and context entry (used by the current
//! context or not) may carry only the fields below, as inline data; anything else is refused with
//! one reason that names the entry and the field. `exec` is admitted only for a command the
//! operator named by absolute path (`--remote-secret-allow-exec`), with no `env`.
use kube::config::Kubeconfig;
use serde::Serialize;
use serde_json::{Map, Value};
use thiserror::Error;

/// Fields a cluster entry may set.
const CLUSTER_FIELDS: &[&str] = &[
    "server",
    "certificate-authority-data",
    "tls-server-name",
    "proxy-url",
    "disable-compression",
];
/// Fields a user entry may set (and `exec` with an allowed command).
const USER_FIELDS: &[&str] = &["token", "client-certificate-data", "client-key-data"];
/// Fields a context entry may set.
const CONTEXT_FIELDS: &[&str] = &["cluster", "user", "namespace"];
/// Top-level fields (`preferences` is never read by the client).
const TOP_FIELDS: &[&str] = &[
    "apiVersion",
    "kind",
    "clusters",
    "users",
    "contexts",
    "current-context",
    "preferences",
];
/// Fields of an allowed `exec` entry (`env` is refused: see [`Refusal::ExecEnv`]).
const EXEC_FIELDS: &[&str] = &[
    "apiVersion",
    "command",
    "args",
    "installHint",
    "interactiveMode",
    "provideClusterInfo",
];
/// Fields naming a file of the daemon, with the inline field to use instead.
const FILE_FIELDS: &[(&str, &str)] = &[
    ("certificate-authority", "certificate-authority-data"),
    ("tokenFile", "token"),
    ("client-certificate", "client-certificate-data"),
    ("client-key", "client-key-data"),
];

/// Why a remote Secret's kubeconfig is refused: one line naming the entry and the field.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum Refusal {
    #[error(
        "{entry}: {field} names a file ({path:?}); a remote Secret's kubeconfig may carry inline data only (use {inline})"
    )]
    FilePath {
        entry: String,
        field: &'static str,
        path: String,
        inline: &'static str,
    },
    #[error(
        "{entry}: exec would run {command:?} in the daemon; refused (only commands named by --remote-secret-allow-exec may run, none is)"
    )]
    Exec { entry: String, command: String },
    #[error(
        "{entry}: exec command {command:?} is not one --remote-secret-allow-exec allows ({allowed}); refused"
    )]
    ExecNotAllowed {
        entry: String,
        command: String,
        allowed: String,
    },
    #[error(
        "{entry}: exec env is refused (a Secret may not set the environment of a program the daemon runs)"
    )]
    ExecEnv { entry: String },
    #[error(
        "{entry}: auth-provider {name:?} is refused (it can run a program or read files); use inline credentials"
    )]
    AuthProvider { entry: String, name: String },
    #[error(
        "{entry}: insecure-skip-tls-verify: true is refused (TLS to a remote is always verified; give certificate-authority-data)"
    )]
    InsecureSkipTls { entry: String },
    #[error("{entry}: server {server:?} is refused: only https:// (TLS is always verified)")]
    NotHttps { entry: String, server: String },
    #[error("{entry}: {field} is not allowed in a remote Secret's kubeconfig (allowed: {allowed})")]
    NotAllowed {
        entry: String,
        field: String,
        allowed: String,
    },
}

/// Pure: `Ok` when the kubeconfig holds inline data only (and `exec` only with one of the
/// `allowed_exec` commands, each an absolute path, matched exactly); else the first refusal.
pub fn check(kc: &Kubeconfig, allowed_exec: &[String]) -> Result<(), Refusal> {
    let top = fields(kc);
    only(&top, TOP_FIELDS, "the kubeconfig")?;
    for c in &kc.clusters {
        let entry = format!("cluster {:?}", c.name);
        only(&fields(&c.other), &[], &entry)?;
        if let Some(cluster) = &c.cluster {
            check_cluster(&fields(cluster), &entry)?;
        }
    }
    for u in &kc.auth_infos {
        let entry = format!("user {:?}", u.name);
        only(&fields(&u.other), &[], &entry)?;
        if let Some(user) = &u.auth_info {
            check_user(&fields(user), &entry, allowed_exec)?;
        }
    }
    for c in &kc.contexts {
        let entry = format!("context {:?}", c.name);
        only(&fields(&c.other), &[], &entry)?;
        if let Some(context) = &c.context {
            only(&fields(context), CONTEXT_FIELDS, &entry)?;
        }
    }
    Ok(())
}

/// The fields a value sets, as its YAML names (unset and null ones left out).
fn fields(v: &impl Serialize) -> Map<String, Value> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m.into_iter().filter(|(_, v)| !v.is_null()).collect(),
        _ => Map::new(),
    }
}

/// Refuses the first field not in `allowed`, naming a file field as such.
fn only(fields: &Map<String, Value>, allowed: &[&str], entry: &str) -> Result<(), Refusal> {
    for (field, value) in fields {
        if allowed.contains(&field.as_str()) {
            continue;
        }
        if let Some(&(field, inline)) = FILE_FIELDS.iter().find(|(f, _)| *f == field.as_str()) {
            return Err(Refusal::FilePath {
                entry: entry.to_string(),
                field,
                path: value
                    .as_str()
                    .map_or_else(|| value.to_string(), str::to_string),
                inline,
            });
        }
        return Err(Refusal::NotAllowed {
            entry: entry.to_string(),
            field: field.clone(),
            allowed: allowed.join(", "),
        });
    }
    Ok(())
}

fn check_cluster(f: &Map<String, Value>, entry: &str) -> Result<(), Refusal> {
    if let Some(skip) = f.get("insecure-skip-tls-verify")
        && skip.as_bool() != Some(false)
    {
        return Err(Refusal::InsecureSkipTls {
            entry: entry.to_string(),
        });
    }
    let mut rest = f.clone();
    rest.remove("insecure-skip-tls-verify");
    only(&rest, CLUSTER_FIELDS, entry)?;
    if let Some(server) = f.get("server").and_then(Value::as_str)
        && !server.starts_with("https://")
    {
        return Err(Refusal::NotHttps {
            entry: entry.to_string(),
            server: server.to_string(),
        });
    }
    Ok(())
}

fn check_user(f: &Map<String, Value>, entry: &str, allowed_exec: &[String]) -> Result<(), Refusal> {
    if let Some(p) = f.get("auth-provider") {
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default();
        return Err(Refusal::AuthProvider {
            entry: entry.to_string(),
            name: name.to_string(),
        });
    }
    let mut rest = f.clone();
    if let Some(exec) = rest.remove("exec") {
        check_exec(&exec, entry, allowed_exec)?;
    }
    only(&rest, USER_FIELDS, entry)
}

fn check_exec(exec: &Value, entry: &str, allowed_exec: &[String]) -> Result<(), Refusal> {
    let command = exec
        .get("command")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if allowed_exec.is_empty() {
        return Err(Refusal::Exec {
            entry: entry.to_string(),
            command,
        });
    }
    if !allowed_exec.contains(&command) {
        return Err(Refusal::ExecNotAllowed {
            entry: entry.to_string(),
            command,
            allowed: allowed_exec.join(", "),
        });
    }
    let mut f = fields(exec);
    if f.remove("env")
        .is_some_and(|e| e.as_array().is_none_or(|e| !e.is_empty()))
    {
        return Err(Refusal::ExecEnv {
            entry: entry.to_string(),
        });
    }
    // provideClusterInfo is always serialized (false by default)
    only(&f, EXEC_FIELDS, &format!("{entry} exec"))
}

/// Checks the flag's commands: each an absolute, plain path (no `.` or `..`), so that exactly
/// that file is what runs.
pub fn check_allowed_commands(commands: &[String]) -> Result<(), String> {
    for c in commands {
        let plain = c.strip_prefix('/').is_some_and(|rest| {
            rest.split('/')
                .all(|seg| !seg.is_empty() && seg != "." && seg != "..")
        });
        if !plain {
            return Err(format!(
                "--remote-secret-allow-exec {c:?}: each command must be an absolute path without . or .. (it is matched exactly)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const AWS: &str = "/usr/local/bin/aws";

    /// A kubeconfig with one cluster, user and context; `cluster` and `user` are YAML flow maps.
    fn kc(cluster: &str, user: &str) -> Kubeconfig {
        let text = format!(
            "apiVersion: v1\nkind: Config\npreferences: {{}}\nclusters:\n- name: east\n  cluster: {cluster}\n\
             users:\n- name: r\n  user: {user}\ncontexts:\n- name: east\n  context: {{cluster: east, user: r, namespace: x}}\ncurrent-context: east\n"
        );
        Kubeconfig::from_yaml(&text).expect("kubeconfig")
    }

    const SERVER: &str = "{server: 'https://127.0.0.1:6443', certificate-authority-data: Q0E=}";

    #[test]
    fn inline_data_passes() {
        for (cluster, user) in [
            (SERVER, "{token: abc}"),
            (
                "{server: 'https://e:6443', certificate-authority-data: Q0E=, tls-server-name: e, proxy-url: 'http://p:3128', insecure-skip-tls-verify: false, disable-compression: true}",
                "{client-certificate-data: Q0U=, client-key-data: S0U=}",
            ),
            (SERVER, "{}"),
        ] {
            assert_eq!(check(&kc(cluster, user), &[]), Ok(()), "{cluster} {user}");
        }
    }

    /// (cluster, user, allowed exec commands, what the one-line reason must say)
    const REFUSED: &[(&str, &str, &[&str], &str)] = &[
        (
            SERVER,
            "{tokenFile: /var/run/secrets/t}",
            &[],
            "user \"r\": tokenFile names a file (\"/var/run/secrets/t\")",
        ),
        (
            SERVER,
            "{client-certificate: /c.crt, client-key-data: S0U=}",
            &[],
            "user \"r\": client-certificate names a file",
        ),
        (
            SERVER,
            "{client-certificate-data: Q0U=, client-key: /c.key}",
            &[],
            "user \"r\": client-key names a file",
        ),
        (
            "{server: 'https://e', certificate-authority: /ca.crt}",
            "{token: a}",
            &[],
            "cluster \"east\": certificate-authority names a file",
        ),
        (
            "{server: 'https://e', insecure-skip-tls-verify: true}",
            "{token: a}",
            &[],
            "cluster \"east\": insecure-skip-tls-verify: true is refused",
        ),
        (
            "{server: 'http://e'}",
            "{token: a}",
            &[],
            "cluster \"east\": server \"http://e\" is refused",
        ),
        (
            SERVER,
            "{exec: {command: /bin/sh, args: [-c, id]}}",
            &[],
            "user \"r\": exec would run \"/bin/sh\"",
        ),
        (
            SERVER,
            "{exec: {command: /bin/sh}}",
            &[AWS],
            "exec command \"/bin/sh\" is not one --remote-secret-allow-exec allows (/usr/local/bin/aws)",
        ),
        (
            SERVER,
            "{exec: {command: aws}}",
            &[AWS],
            "exec command \"aws\" is not one",
        ),
        (
            SERVER,
            "{exec: {command: /usr/local/bin/../bin/aws}}",
            &[AWS],
            "is not one",
        ),
        (
            SERVER,
            "{exec: {command: /usr/local/bin/aws, env: [{name: LD_PRELOAD, value: /x.so}]}}",
            &[AWS],
            "user \"r\": exec env is refused",
        ),
        (
            SERVER,
            "{exec: {command: /usr/local/bin/aws, shell: yes}}",
            &[AWS],
            "user \"r\" exec: shell is not allowed",
        ),
        (
            SERVER,
            "{auth-provider: {name: gcp, config: {cmd-path: /bin/sh}}}",
            &[],
            "user \"r\": auth-provider \"gcp\" is refused",
        ),
        (
            SERVER,
            "{auth-provider: {name: oidc, config: {id-token: x}}}",
            &[AWS],
            "auth-provider \"oidc\" is refused",
        ),
        (
            SERVER,
            "{username: u, password: p}",
            &[],
            "user \"r\": password is not allowed",
        ),
        (
            SERVER,
            "{token: a, as: admin}",
            &[],
            "user \"r\": as is not allowed",
        ),
        (
            SERVER,
            "{token: a, as-groups: [system:masters]}",
            &[],
            "user \"r\": as-groups is not allowed",
        ),
        (
            SERVER,
            "{token: a, extensions: [{name: x, extension: {}}]}",
            &[],
            "user \"r\": extensions is not allowed",
        ),
        (
            SERVER,
            "{token: a, future-field: x}",
            &[],
            "user \"r\": future-field is not allowed",
        ),
        (
            "{server: 'https://e', extensions: [{name: x, extension: {}}]}",
            "{token: a}",
            &[],
            "cluster \"east\": extensions is not allowed",
        ),
    ];

    #[test]
    fn each_refusal_names_its_entry_and_field_in_one_line() {
        for (cluster, user, allowed, why) in REFUSED {
            let allowed: Vec<String> = allowed.iter().map(|s| s.to_string()).collect();
            let err = check(&kc(cluster, user), &allowed)
                .expect_err(&format!("{cluster} {user} refused"))
                .to_string();
            assert!(err.contains(why), "{cluster} {user}: {err}");
            assert!(!err.contains('\n'), "{err}");
        }
    }

    #[test]
    fn an_allowed_command_runs_with_its_args_and_nothing_else_changes() {
        let aws = [AWS.to_string()];
        let user = "{exec: {apiVersion: client.authentication.k8s.io/v1, command: /usr/local/bin/aws, args: [eks, get-token], interactiveMode: Never, provideClusterInfo: true, env: []}}";
        assert_eq!(check(&kc(SERVER, user), &aws), Ok(()));
        // allowed or not, a file beside it is still refused
        let user = "{exec: {command: /usr/local/bin/aws}, tokenFile: /t}";
        assert!(matches!(
            check(&kc(SERVER, user), &aws),
            Err(Refusal::FilePath { .. })
        ));
    }

    #[test]
    fn entries_the_current_context_does_not_use_are_checked_too() {
        let mut k = kc(SERVER, "{token: a}");
        let mut other = k.auth_infos[0].clone();
        other.name = "unused".into();
        other.auth_info.as_mut().expect("user").token_file = Some("/t".into());
        k.auth_infos.push(other);
        let err = check(&k, &[]).unwrap_err().to_string();
        assert!(err.starts_with("user \"unused\": tokenFile"), "{err}");
        let mut k = kc(SERVER, "{token: a}");
        k.extensions = Some(vec![]);
        assert!(
            check(&k, &[])
                .unwrap_err()
                .to_string()
                .contains("extensions")
        );
    }

    #[test]
    fn allowed_commands_are_plain_absolute_paths() {
        assert!(check_allowed_commands(&[AWS.into(), "/bin/x".into()]).is_ok());
        for bad in [
            "aws",
            "./aws",
            "/usr/../bin/aws",
            "/usr/./aws",
            "/usr/bin/",
            "//x",
            "/",
            "",
        ] {
            let err = check_allowed_commands(&[bad.into()]).unwrap_err();
            assert!(err.contains("--remote-secret-allow-exec"), "{err}");
        }
    }
}
