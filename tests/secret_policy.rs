//! A remote Secret is untrusted input: a kubeconfig in it that would run a program (`exec`, the
//! `gcp` auth-provider's `cmd-path`) or read a file of the daemon (`tokenFile`,
//! `client-certificate`, `client-key`, `certificate-authority`), or turn TLS verification off,
//! is refused before anything is built from it, on the real daemon against the bed: no marker
//! file appears, and a TLS listener named as its server (trusted through the Secret's CA, so a
//! client built from the Secret would complete the handshake and send its request) receives
//! nothing. A good remote beside them converges. An exec plugin the operator allowed by absolute
//! path runs; the same Secret with another command does not.
mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::{Value, json};
use support::catcher::Catcher;
use support::daemon::Daemon;
use support::remotes::{apply_secret, kubeconfig_of, remote_secret, secrets_only_args};
use support::{LOCAL, REMOTE, bed, client, eventually, exported, namespace_in, obj, present};

const WAIT: Duration = Duration::from_secs(60);

/// A kubeconfig of one cluster entry `c`, one user `u` and one context `c` (the current one).
fn kubeconfig(cluster: Value, user: Value) -> String {
    serde_yaml::to_string(&json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c"
    }))
    .expect("yaml")
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// east's certificates (its CA, serving and admin certificates and keys), from the bed.
async fn east_pki() -> PathBuf {
    bed().await.dir.join(REMOTE).join("pki")
}

fn read(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The /readyz line of Secret `name`, if there is one.
fn line_of<'a>(body: &'a str, ns: &str, name: &str) -> Option<&'a str> {
    body.lines()
        .find(|l| l.contains(&format!("Secret {ns}/{name}:")))
}

/// Waits until every Secret of `names` has been judged: a line on /readyz, whatever it says
/// (refused, or unusable for another reason), or its remote joined (a `remote <name>:` line).
async fn every_one_judged(d: &Daemon, ns: &str, names: &[&str]) -> String {
    eventually("a /readyz line for every bad Secret", WAIT, || async {
        let (_, body) = d.readyz()?;
        let missing: Vec<&&str> = names
            .iter()
            .filter(|n| line_of(&body, ns, n).is_none() && !body.contains(&format!("remote {n}:")))
            .collect();
        missing
            .is_empty()
            .then(|| body.clone())
            .ok_or(format!("missing {missing:?}:\n{body}"))
    })
    .await
}

/// Waits for a `RemoteRefused` Event on each of the Secrets `names`.
async fn refused_events(ns: &str, names: &[&str]) {
    let events: Api<Event> = Api::namespaced(client(LOCAL).await, ns);
    eventually(
        "a RemoteRefused Event on every bad Secret",
        WAIT,
        || async {
            let list = events
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let missing: Vec<&&str> = names
                .iter()
                .filter(|name| {
                    !list.items.iter().any(|e| {
                        e.reason.as_deref() == Some("RemoteRefused")
                            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(**name)
                    })
                })
                .collect();
            missing
                .is_empty()
                .then_some(())
                .ok_or(format!("{missing:?}"))
        },
    )
    .await;
}

#[tokio::test]
async fn secrets_that_would_run_a_program_or_read_a_file_are_refused_and_nothing_runs_or_is_read() {
    let ns = namespace_in("secret-policy", &[REMOTE, LOCAL]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&PostParams::default(), &exported("web", 80))
        .await
        .unwrap();
    let d = Daemon::start_secrets_only(&secrets_only_args(&ns.name)).await;
    d.wait_leading().await;

    // the daemon's files a Secret might name: each with contents found nowhere else
    let pki = east_pki().await;
    let (ca, cert, key) = (
        read(&pki.join("ca.crt")),
        read(&pki.join("admin.crt")),
        read(&pki.join("admin.key")),
    );
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, contents: &[u8]| {
        let p = dir.path().join(name);
        std::fs::write(&p, contents).unwrap();
        p.display().to_string()
    };
    let token_secret = format!("xcc-file-token-{}", ns.name);
    let token_file = file("token", token_secret.as_bytes());
    let (ca_file, cert_file, key_file) = (
        file("ca.crt", &ca),
        file("c.crt", &cert),
        file("c.key", &key),
    );
    let exec_marker = dir.path().join("exec-ran");
    let provider_marker = dir.path().join("auth-provider-ran");
    let inline_token = format!("xcc-inline-token-{}", ns.name);

    // (Secret, its kubeconfig, the reason /readyz must give); each server is a listener of its own
    let mut catchers = Vec::new();
    for _ in 0..7 {
        catchers.push(Catcher::start(&pki).await);
    }
    let mut urls = catchers.iter().map(Catcher::url);
    let mut server = || urls.next().expect("a listener per case");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "token-file",
            kubeconfig(
                json!({"server": server(), "certificate-authority-data": b64(&ca)}),
                json!({"tokenFile": token_file}),
            ),
            "user \"u\": tokenFile names a file",
        ),
        (
            "ca-file",
            kubeconfig(
                json!({"server": server(), "certificate-authority": ca_file}),
                json!({"token": inline_token}),
            ),
            "cluster \"c\": certificate-authority names a file",
        ),
        (
            "cert-file",
            kubeconfig(
                json!({"server": server(), "certificate-authority-data": b64(&ca)}),
                json!({"client-certificate": cert_file, "client-key-data": b64(&key)}),
            ),
            "user \"u\": client-certificate names a file",
        ),
        (
            "key-file",
            kubeconfig(
                json!({"server": server(), "certificate-authority-data": b64(&ca)}),
                json!({"client-certificate-data": b64(&cert), "client-key": key_file}),
            ),
            "user \"u\": client-key names a file",
        ),
        (
            "exec",
            kubeconfig(
                json!({"server": server(), "certificate-authority-data": b64(&ca)}),
                json!({"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": "/bin/sh",
                              "args": ["-c", format!("touch {}", exec_marker.display())], "interactiveMode": "Never"}}),
            ),
            "user \"u\": exec would run \"/bin/sh\"",
        ),
        (
            "auth-provider",
            kubeconfig(
                json!({"server": server(), "certificate-authority-data": b64(&ca)}),
                json!({"auth-provider": {"name": "gcp", "config": {
                              "cmd-path": "/usr/bin/touch", "cmd-args": provider_marker.display().to_string()}}}),
            ),
            "user \"u\": auth-provider \"gcp\" is refused",
        ),
        (
            "insecure",
            kubeconfig(
                json!({"server": server(), "insecure-skip-tls-verify": true}),
                json!({"token": inline_token}),
            ),
            "cluster \"c\": insecure-skip-tls-verify: true is refused",
        ),
    ];
    for (name, kc, _) in &cases {
        apply_secret(&secrets, &remote_secret(name, None, Some(kc))).await;
    }
    // a good remote beside them, applied after them
    let good = kubeconfig_of(REMOTE, |_| {}).await;
    apply_secret(&secrets, &remote_secret("east", None, Some(&good))).await;
    eventually("the good remote's follower", WAIT, || present(&west, "web")).await;

    // every bad Secret was judged (a line on /readyz, whatever it says) ...
    let names: Vec<&str> = cases.iter().map(|(n, _, _)| *n).collect();
    let body = every_one_judged(&d, &ns.name, &names).await;
    // ... and nothing ran, nothing was read, nothing was sent (every breach listed)
    let mut breaches = Vec::new();
    if exec_marker.exists() {
        breaches.push("exec: the command ran".to_string());
    }
    if provider_marker.exists() {
        breaches.push("auth-provider: the command ran".to_string());
    }
    for ((name, _, _), c) in cases.iter().zip(&catchers) {
        let seen = c.seen();
        if seen.requests.iter().any(|r| r.contains(&token_secret)) {
            breaches.push(format!(
                "{name}: the token file's contents reached the listener"
            ));
        }
        if seen.client_certs.iter().any(|c| pem_holds(&cert, c)) {
            breaches.push(format!(
                "{name}: the certificate read from a file reached the listener"
            ));
        }
        if seen.connections > 0 {
            breaches.push(format!(
                "{name}: the listener was connected to {} times, {} requests",
                seen.connections,
                seen.requests.len()
            ));
        }
    }
    assert!(breaches.is_empty(), "{breaches:#?}\n{body}");
    // each with its one-line reason, on /readyz, in an Event and in the metric
    for (name, _, why) in &cases {
        let line = line_of(&body, &ns.name, name).expect("a line");
        assert!(line.contains(why), "{name}: {line}");
    }
    refused_events(&ns.name, &names).await;
    assert_eq!(
        d.gauge("xcc_remote_secrets_refused", &[]),
        Some(cases.len() as f64)
    );
    assert!(body.contains("remote east: synced"), "{body}");
    // still nothing, after the retries (every 10 s) that came meanwhile
    assert!(!exec_marker.exists() && !provider_marker.exists());
    assert!(catchers.iter().all(|c| c.seen().connections == 0));
}

/// Whether the PEM certificate `pem` is the DER certificate `der`.
fn pem_holds(pem: &[u8], der: &[u8]) -> bool {
    let text = String::from_utf8_lossy(pem);
    let body: String = text.lines().filter(|l| !l.starts_with("-----")).collect();
    base64::engine::general_purpose::STANDARD
        .decode(body)
        .is_ok_and(|d| d == der)
}

/// A ServiceAccount `reader` of `ns` in east that may read what a remote reader reads, and a
/// token for it; the cluster-wide role and binding are deleted at the end of the test.
struct Reader {
    token: String,
    role: String,
}

impl Reader {
    async fn new(ns: &str) -> Reader {
        let east = client(REMOTE).await;
        let pp = PostParams::default();
        let role = format!("{ns}-reader");
        Api::<ClusterRole>::all(east.clone())
            .create(&pp, &obj(json!({"metadata": {"name": role}, "rules": [
                {"apiGroups": [""], "resources": ["services", "endpoints"], "verbs": ["get", "list", "watch"]},
                {"apiGroups": [""], "resources": ["namespaces"], "resourceNames": ["kube-system"], "verbs": ["get"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]}]})))
            .await
            .unwrap();
        Api::<ServiceAccount>::namespaced(east.clone(), ns)
            .create(&pp, &obj(json!({"metadata": {"name": "reader"}})))
            .await
            .unwrap();
        Api::<ClusterRoleBinding>::all(east)
            .create(&pp, &obj(json!({"metadata": {"name": role},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": ns}]})))
            .await
            .unwrap();
        let token = support::mint_token(REMOTE, ns, "reader").await;
        Reader { token, role }
    }

    async fn delete(self) {
        let east = client(REMOTE).await;
        let dp = DeleteParams::default();
        let _ = Api::<ClusterRoleBinding>::all(east.clone())
            .delete(&self.role, &dp)
            .await;
        let _ = Api::<ClusterRole>::all(east).delete(&self.role, &dp).await;
    }
}

/// An exec plugin at `path` that prints an ExecCredential holding `token` and leaves a marker
/// (`<path>.ran`) each time it runs.
fn plugin(path: &Path, token: &str) {
    use std::os::unix::fs::PermissionsExt;
    let script = format!(
        "#!/bin/sh\ntouch \"$0.ran\"\nprintf '%s\\n' '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\"}}}}'\n"
    );
    std::fs::write(path, script).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700)).unwrap();
}

fn ran(path: &Path) -> bool {
    PathBuf::from(format!("{}.ran", path.display())).exists()
}

#[tokio::test]
async fn an_exec_plugin_the_operator_allowed_runs_and_no_other_command_does() {
    let ns = namespace_in("secret-exec", &[REMOTE, LOCAL]).await;
    let east: Api<Service> = Api::namespaced(client(REMOTE).await, &ns.name);
    let west: Api<Service> = Api::namespaced(client(LOCAL).await, &ns.name);
    let secrets: Api<Secret> = Api::namespaced(client(LOCAL).await, &ns.name);
    east.create(&PostParams::default(), &exported("web", 80))
        .await
        .unwrap();
    let reader = Reader::new(&ns.name).await;
    let dir = tempfile::tempdir().unwrap();
    let (allowed, other) = (
        dir.path().join("allowed-plugin"),
        dir.path().join("other-plugin"),
    );
    plugin(&allowed, &reader.token);
    plugin(&other, &reader.token);
    let mut args = secrets_only_args(&ns.name);
    args.extend([
        "--remote-secret-allow-exec".to_string(),
        format!("/usr/local/bin/aws,{}", allowed.display()),
    ]);
    let d = Daemon::start_secrets_only(&args).await;
    d.wait_leading().await;

    let ca = b64(&read(&east_pki().await.join("ca.crt")));
    let server = support::config(REMOTE).await.cluster_url.to_string();
    let exec_kc = |exec: Value| {
        kubeconfig(
            json!({"server": server.trim_end_matches('/'), "certificate-authority-data": ca}),
            json!({"exec": exec}),
        )
    };
    let exec = |command: &str| json!({"apiVersion": "client.authentication.k8s.io/v1", "command": command, "interactiveMode": "Never"});
    let mut with_env = exec(&allowed.display().to_string());
    with_env["env"] = json!([{"name": "LD_PRELOAD", "value": "/nonexistent.so"}]);
    let bad: Vec<(&str, String, String)> = vec![
        (
            "other-command",
            exec_kc(exec(&other.display().to_string())),
            format!(
                "exec command \"{}\" is not one --remote-secret-allow-exec allows",
                other.display()
            ),
        ),
        (
            "relative-command",
            exec_kc(exec("allowed-plugin")),
            "exec command \"allowed-plugin\" is not one --remote-secret-allow-exec allows"
                .to_string(),
        ),
        (
            "with-env",
            exec_kc(with_env),
            "user \"u\": exec env is refused".to_string(),
        ),
    ];
    for (name, kc, _) in &bad {
        apply_secret(&secrets, &remote_secret(name, None, Some(kc))).await;
    }
    // the allowed command: the remote joins with the token it prints, and converges
    let good = exec_kc(exec(&allowed.display().to_string()));
    apply_secret(&secrets, &remote_secret("east", None, Some(&good))).await;
    eventually(
        "the follower of the remote whose plugin is allowed",
        WAIT,
        || present(&west, "web"),
    )
    .await;
    assert!(ran(&allowed), "the allowed plugin gave the credential");

    let names: Vec<&str> = bad.iter().map(|(n, _, _)| *n).collect();
    let body = every_one_judged(&d, &ns.name, &names).await;
    assert!(!ran(&other), "another command ran:\n{body}");
    for (name, _, why) in &bad {
        let line = line_of(&body, &ns.name, name).expect("a line");
        assert!(line.contains(why.as_str()), "{name}: {line}");
    }
    refused_events(&ns.name, &names).await;
    assert!(body.contains("remote east: synced"), "{body}");
    assert!(!ran(&other));
    reader.delete().await;
    drop(d);
}
