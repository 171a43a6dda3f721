//! The admin server: /healthz (alive), /readyz (every cache has completed its first listing;
//! the body says which are not), /metrics (Prometheus text).
//!
//! What /readyz repeats of the outside (remote names, error messages that remote API servers
//! and Secrets write) is shown through [`detail`]: one line, cut to [`DETAIL_MAX`] characters,
//! so that no remote can forge a line or flood the body.
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::error::{Error, Result};
use crate::runtime::metrics::Metrics;
use crate::runtime::supervisor::Supervisor;
use crate::state::LocalState;
use crate::state::Remotes;

pub struct AdminState {
    pub metrics: Arc<Metrics>,
    pub remotes: Arc<Remotes>,
    pub local: Arc<LocalState>,
    /// the Multi-Cluster Services API's local caches (`--mcs`)
    pub mcs: Option<Arc<crate::state::McsLocal>>,
}

/// The longest detail (a name, a reason) /readyz repeats, in characters.
pub const DETAIL_MAX: usize = 200;

/// Pure: text from outside as /readyz shows it: control characters, line and paragraph
/// separators and invisible format characters escaped (`\n`, `\u{202e}`), cut to
/// [`DETAIL_MAX`] characters with `...` when longer.
pub fn detail(text: &str) -> String {
    let mut out = String::new();
    for (i, c) in text.chars().enumerate() {
        if i == DETAIL_MAX {
            out.push_str("...");
            break;
        }
        if c.is_control() || is_invisible(c) {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// Format characters (Unicode category Cf) and the line and paragraph separators: invisible,
/// or able to reorder or break what a terminal shows.
fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{ad}' | '\u{61c}' | '\u{180e}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}' | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
        | '\u{e0000}'..='\u{e007f}')
}

/// The election Lease's annotation (after the label key's prefix) in which the leader says how
/// many local pod networks it knows, for `status` to say [`NO_POD_RANGE`] too.
pub const POD_NETWORKS_NOTE: &str = "local-pod-networks";
/// The /readyz (and `status`) line of a daemon that knows no local pod network.
pub const NO_POD_RANGE: &str = "local pod networks: none known (no node has spec.podCIDRs, no Calico IPPool or CiliumNode names one): a remote may name a local pod's address; name them with --local-pod-cidrs";

/// The /readyz line of a remote whose followers are held at a write limit (issue 37): how many,
/// and the first with why. It does not make the daemon unready: the rest of that remote, and
/// every other, goes on (an unready pod would let one remote block the local cluster's node
/// drains through the PodDisruptionBudget).
fn write_limited_line(r: &crate::state::RemoteState) -> Option<String> {
    let (n, first) = r.write_limited();
    let (key, why) = first?;
    Some(format!(
        "remote {}: {n} follower(s) held at a write limit; {}: {}",
        detail(&r.name),
        detail(&key),
        detail(&why)
    ))
}

/// The local Service range and the remotes whose new followers wait for one of its addresses
/// (none of them a reason to stop: existing followers are served).
fn service_ip_lines(local: &LocalState) -> Vec<String> {
    let ips = &local.service_ips;
    let range = local.networks.service_range().or(ips.shares.range);
    let share = |s: Option<u8>| s.map_or("no limit".to_string(), |p| format!("{p}%"));
    let mut lines = vec![match range {
        Some(n) => format!(
            "local Service range: {n} addresses; remotes hold {} (each may hold {}, all together {})",
            ips.held_by_all(),
            share(ips.shares.remote),
            share(ips.shares.all)
        ),
        None => "local Service range: unknown (no ServiceCIDR names it): no share of it is enforced; name its size with --local-service-ips".into(),
    }];
    for (remote, waiting, held) in ips.limited() {
        lines.push(format!(
            "remote {}: Service IPs limited: {waiting} new followers wait for a ClusterIP (it holds {held})",
            detail(&remote)
        ));
    }
    lines
}

async fn healthz() -> &'static str {
    "ok\n"
}

/// What `/readyz` says: a line per part, and whether every part that decides readiness is
/// ready.
#[derive(Default)]
struct Readiness {
    lines: Vec<String>,
    ready: bool,
}

impl Readiness {
    /// A line that says how a part is, not whether the daemon is ready.
    fn say(&mut self, line: String) {
        self.lines.push(line);
    }

    /// A line of a part that is not ready: neither is the daemon.
    fn not_ready(&mut self, line: String) {
        self.ready = false;
        self.lines.push(line);
    }
}

async fn readyz(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    let mut r = Readiness {
        ready: true,
        ..Default::default()
    };
    remote_lines(&s, &mut r);
    local_network_lines(&s.local, &mut r);
    r.lines.extend(service_ip_lines(&s.local));
    // the networks have their own line above: this one says only what it names
    r.ready &= s.local.ready();
    let ok = s.local.followers_ready();
    r.say(format!(
        "local followers: {}",
        if ok { "synced" } else { "not synced" }
    ));
    if let Some(mcs) = &s.mcs {
        match mcs.problem() {
            None => r.say("local MCS: synced".into()),
            Some(why) => r.not_ready(format!("local MCS: not ready: {}", detail(&why))),
        }
    }
    let code = if r.ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, r.lines.join("\n") + "\n")
}

/// Each remote's line (synced, or why not), its followers held at a write limit, the names it
/// exports that no follower may take, and the remote sources' problems.
fn remote_lines(s: &AdminState, r: &mut Readiness) {
    for remote in s.remotes.states() {
        let name = detail(&remote.name);
        match remote.problem() {
            None => r.say(format!("remote {name}: synced")),
            Some(why) => r.not_ready(format!("remote {name}: not ready: {}", detail(&why))),
        }
        if let Some(line) = write_limited_line(&remote) {
            r.say(line);
        }
    }
    for remote in s.remotes.states() {
        if let Some(line) = refused_names_line(&remote.name, &remote.refused_names()) {
            r.say(line);
        }
    }
    for (source, why) in s.remotes.problems() {
        r.not_ready(format!("{}: {}", detail(&source), detail(&why)));
    }
}

/// The local networks no remote may claim: listed (and whether a pod network is among them),
/// or why not. Not a reason to stop either way: readiness rests on the local caches.
fn local_network_lines(local: &LocalState, r: &mut Readiness) {
    match local.networks.problem() {
        None => {
            let current = local.networks.current();
            let (addresses, nets) = current.size();
            r.say(format!(
                "local networks: listed ({addresses} addresses, {nets} networks no remote may claim)"
            ));
            // a cluster may run pods on its nodes' network only, but a remote may then name a
            // local pod's address: say how to close it
            if current.pod_ranges() == 0 {
                r.say(NO_POD_RANGE.into());
            }
        }
        Some(why) => r.say(format!("local networks: not listed: {}", detail(&why))),
    }
}

/// The names a remote exports that no follower may take (a refusal, not a failure: readiness
/// is unchanged), at most [`NAMES_SHOWN`] of them.
fn refused_names_line(remote: &str, keys: &[crate::state::GroupKey]) -> Option<String> {
    if keys.is_empty() {
        return None;
    }
    let mut shown: Vec<String> = keys
        .iter()
        .take(NAMES_SHOWN)
        .map(|(ns, name)| detail(&format!("{ns}/{name}")))
        .collect();
    if keys.len() > NAMES_SHOWN {
        shown.push(format!("and {} more", keys.len() - NAMES_SHOWN));
    }
    Some(format!(
        "remote {}: {} exported Service(s) refused, the namespace or name being a top-level domain \
         (allow one with --allow-tld-names): {}",
        detail(remote),
        keys.len(),
        shown.join(", ")
    ))
}

/// How many refused names one /readyz line shows.
const NAMES_SHOWN: usize = 5;

async fn metrics(State(s): State<Arc<AdminState>>) -> impl IntoResponse {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}

pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AdminState>,
    shutdown: CancellationToken,
) -> Result<()> {
    let app = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
        .map_err(|source| Error::Admin { source })?;
    Ok(())
}

/// Serves /healthz, /readyz and /metrics until shutdown; a server that fails ends the process.
pub fn spawn(sup: &Supervisor, listener: tokio::net::TcpListener, state: AdminState) {
    let serve = serve(listener, Arc::new(state), sup.shutdown_token());
    let admin_sup = sup.clone();
    sup.spawn("admin server", async move {
        if let Err(e) = serve.await {
            admin_sup.fail(format!("admin server: {e}"));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detail_is_one_line_of_at_most_its_bound() {
        assert_eq!(
            detail("east: connection refused"),
            "east: connection refused"
        );
        let forged = "x\nremote west: synced\r\n\u{1b}[2J\u{202e}evil\u{2028}\u{0}";
        let shown = detail(forged);
        assert_eq!(
            shown,
            "x\\nremote west: synced\\r\\n\\u{1b}[2J\\u{202e}evil\\u{2028}\\u{0}"
        );
        assert!(!shown.contains(['\n', '\r', '\u{1b}', '\u{202e}', '\u{2028}']));
        let long = "é".repeat(10_000);
        let shown = detail(&long);
        assert_eq!(shown.chars().count(), DETAIL_MAX + 3);
        assert!(shown.ends_with("..."));
        assert_eq!(detail(&"a".repeat(DETAIL_MAX)), "a".repeat(DETAIL_MAX));
    }

    #[test]
    fn refused_names_are_one_line_naming_the_remote_and_at_most_five_keys() {
        assert_eq!(refused_names_line("east", &[]), None);
        let keys: Vec<(String, String)> = (0..7)
            .map(|i| (format!("ns{i}"), "com".to_string()))
            .collect();
        let line = refused_names_line("east\nremote west: synced", &keys).unwrap();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.starts_with("remote east\\nremote west"), "{line}");
        assert!(line.contains("7 exported Service(s) refused"), "{line}");
        assert!(line.contains("ns0/com, ns1/com, ns2/com, ns3/com, ns4/com, and 2 more"));
        assert!(line.contains("--allow-tld-names"), "{line}");
    }

    /// The body of /readyz for a daemon whose local state is `local`.
    async fn readyz_body(local: LocalState) -> String {
        let state = AdminState {
            metrics: Arc::new(Metrics::new()),
            remotes: Arc::new(Remotes::default()),
            local: Arc::new(local),
            mcs: None,
        };
        let resp = readyz(State(Arc::new(state))).await.into_response();
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(body.to_vec()).unwrap()
    }

    #[tokio::test]
    async fn readyz_says_when_no_local_pod_network_is_known() {
        let none = readyz_body(LocalState::default().networks_listed()).await;
        assert!(none.lines().any(|l| l == NO_POD_RANGE), "{none}");
        let named = crate::state::Networks::new(vec![(
            "10.210.0.0/16".parse().unwrap(),
            crate::desired::addresses::Refusal::LocalPodNetwork,
        )]);
        let some = readyz_body(LocalState::new(named).networks_listed()).await;
        assert!(some.contains("local networks: listed"), "{some}");
        assert!(!some.contains(NO_POD_RANGE), "{some}");
    }

    #[tokio::test]
    async fn readyz_repeats_remote_text_bounded_and_escaped() {
        let remotes = Arc::new(Remotes::default());
        let why = format!("refused\nremote west: synced\n{}", "x".repeat(1_000_000));
        remotes.set_problem("Secret fair-system/east\r\nlocal followers: synced", why);
        let state = AdminState {
            metrics: Arc::new(Metrics::new()),
            remotes,
            local: Arc::new(LocalState::default()),
            mcs: None,
        };
        let resp = readyz(State(Arc::new(state))).await.into_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
            .await
            .unwrap();
        let body = String::from_utf8(body.to_vec()).unwrap();
        let lines: Vec<&str> = body.lines().collect();
        // no line forged: the remote's text is inside its own one line
        assert!(
            !lines.iter().any(|l| l.starts_with("remote west")),
            "{body}"
        );
        assert!(!lines.contains(&"local followers: synced"), "{body}");
        assert!(
            lines[0].starts_with("Secret fair-system/east\\r\\nlocal followers"),
            "{body}"
        );
        assert!(
            lines[0].contains(": refused\\nremote west: synced\\nxxx"),
            "{body}"
        );
        assert!(
            lines[0].len() < 2 * (DETAIL_MAX + 3) + 2,
            "{}",
            lines[0].len()
        );
        assert!(lines.contains(&"local followers: not synced"), "{body}");
    }
}
