//! docs/reference.md is generated from the code: the flags (clap's definitions, with their
//! environment variables and defaults), the metrics (the registry as the daemon publishes it),
//! and the labels and annotations a follower (or, with `--mcs`, a ServiceImport) carries. This test fails when the page drifts from
//! the code; `XCC_WRITE_REFERENCE=1 cargo test --test reference` writes it anew.
use std::collections::BTreeMap;
use std::fmt::Write as _;

use clap::CommandFactory;
use cross_cluster_controller::cli::Cli;
use cross_cluster_controller::desired::mcs::{
    COPIED_ANNOTATIONS_ANNOTATION, COPIED_LABELS_ANNOTATION, DERIVED_SERVICE_ANNOTATION,
    ENDPOINTS_ANNOTATION, HOLDER_ANNOTATION, OWNER_LABEL,
};
use cross_cluster_controller::desired::{
    self, MANAGED_BY, MANAGED_BY_LABEL, MCS_SOURCE_CLUSTER_LABEL, Options, SERVICE_NAME_LABEL,
    SKIP_MIRROR_LABEL,
};
use cross_cluster_controller::remotes::credentials::{LIFETIME_KEY, RENEWAL_KEY};
use cross_cluster_controller::remotes::remote_secret::{
    ALLOW_EXTERNAL_NAME_KEY, ALLOWED_CIDRS_KEY, CLUSTER_ID_KEY, MAX_CACHE_BYTES_KEY,
    MAX_ENDPOINTS_KEY, MAX_SERVICES_KEY, NAME_KEY, PROBE_AFTER_KEY, STALE_AFTER_KEY,
};
use cross_cluster_controller::remotes::source::Refused;
use cross_cluster_controller::runtime::metrics::{
    ByKindVerbCode, ByRemote, ByRemoteOutcome, ByRemoteTo, ByWatch, Metrics, RemoteReading,
};
use cross_cluster_controller::runtime::series::REMOTE_GAUGES;

const PAGE: &str = "docs/reference.md";

fn one_line(s: &str) -> String {
    s.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// One table row per flag of `cmd` (help and version aside).
fn flags(cmd: &clap::Command) -> String {
    let mut out = String::from("| flag | environment | default | what |\n|---|---|---|---|\n");
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if matches!(long, "help" | "version") {
            continue;
        }
        let env = arg
            .get_env()
            .map(|e| format!("`{}`", e.to_string_lossy()))
            .unwrap_or_default();
        let default: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|v| v.to_string_lossy().into_owned())
            .collect();
        let default = if default.is_empty() {
            String::new()
        } else {
            format!("`{}`", default.join(","))
        };
        let help = arg
            .get_long_help()
            .or_else(|| arg.get_help())
            .map(|h| one_line(&h.to_string()))
            .unwrap_or_default();
        let _ = writeln!(out, "| `--{long}` | {env} | {default} | {help} |");
    }
    out
}

/// A registry with one series in every family: the exposition leaves out a family without any,
/// and some get theirs only at run time (the gauges read from the set of remotes, the lag
/// histogram, watch requests, the outage policy, the MCS passes). The labels are the ones the
/// daemon sets.
fn every_family() -> Metrics {
    let m = Metrics::new();
    m.init_remote("REMOTE");
    m.init_mcs();
    m.remote_gauges.read_with(|| {
        vec![RemoteReading {
            remote: "REMOTE".into(),
            export_conflicts: vec![("port", 0)],
            seconds_since_list: Some(0.0),
            credential_expiry: Some(0),
            stale: Some(false),
            mcs_name_refused: Some(false),
            cut_off: Some(false),
            ..RemoteReading::default()
        }]
    });
    let remote = ByRemote::new("REMOTE");
    m.lag.get_or_create(&remote).observe(0.0);
    let to = ByRemoteTo::new("REMOTE", "marked");
    m.remote_stale_transitions.get_or_create(&to).inc();
    let request = ByWatch::new("REMOTE", "Service", "list");
    m.watch_requests.get_or_create(&request).inc();
    let probe = ByRemoteOutcome::new("REMOTE", "reachable");
    m.probes.get_or_create(&probe).inc();
    let refused = ByKindVerbCode::new("Service", "create", "403");
    m.write_errors.get_or_create(&refused).inc();
    m.init_refusals("Secret", Refused::REASONS);
    m
}

/// Every metric family the daemon publishes (with one remote joined), its type, its label names
/// and its help text, from the registry's own exposition.
fn metrics() -> String {
    let page = every_family().render();
    let mut families: BTreeMap<String, (String, String, Vec<String>)> = BTreeMap::new();
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().0 = help.trim_end_matches('.').into();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            families.entry(name.to_string()).or_default().1 = kind.into();
        } else if !line.starts_with('#') && !line.is_empty() {
            let series = line.split(' ').next().unwrap_or_default();
            let (name, labels) = series.split_once('{').unwrap_or((series, ""));
            let family = families
                .keys()
                .filter(|f| name.starts_with(f.as_str()))
                .max_by_key(|f| f.len())
                .cloned()
                .unwrap_or_else(|| name.to_string());
            let entry = families.entry(family).or_default();
            for pair in labels.trim_end_matches('}').split(',') {
                if let Some((k, _)) = pair.split_once('=')
                    && k != "le"
                    && !entry.2.iter().any(|l| l == k)
                {
                    entry.2.push(k.to_string());
                }
            }
        }
    }
    let mut out = String::from("| metric | type | labels | what |\n|---|---|---|---|\n");
    for (name, (help, kind, labels)) in families {
        let labels = labels
            .iter()
            .map(|l| format!("`{l}`"))
            .collect::<Vec<_>>()
            .join(", ");
        // what a query names: a counter's samples end in _total
        let name = if kind == "counter" {
            format!("{name}_total")
        } else {
            name
        };
        let _ = writeln!(
            out,
            "| `{name}` | {kind} | {labels} | {} |",
            one_line(&help)
        );
    }
    out
}

/// The labels and annotations on local objects, with the default label key.
fn names() -> String {
    let o = Options {
        label_key: desired::DEFAULT_LABEL_KEY.into(),
        cluster_name: String::new(),
        endpoints_mode: desired::EndpointsMode::Slices,
        cluster_id: None,
        containment: Default::default(),
        allow_external_name: false,
    };
    let rows = [
        (
            format!("{}=true", o.label_key),
            "label",
            "on a remote Service: export it (a leader)",
        ),
        (
            o.follower_selector(),
            "label",
            "on every local object the daemon owns (follower Services, EndpointSlices, Endpoints)",
        ),
        (
            o.origin_cluster_annotation(),
            "annotation; label on slices",
            "the remote a follower (or slice) comes from",
        ),
        (
            o.origin_cluster_id_annotation(),
            "annotation",
            "that remote's cluster id (its kube-system uid)",
        ),
        (
            o.origin_clusters_annotation(),
            "annotation",
            "every remote a merged follower carries (its deletion needs each one's proof)",
        ),
        (
            o.origin_object_annotation(),
            "annotation",
            "namespace/name of the remote leader",
        ),
        (
            o.origin_uid_annotation(),
            "annotation",
            "uid of the remote leader",
        ),
        (
            o.copied_labels_annotation(),
            "annotation",
            "the label keys copied from the leader",
        ),
        (
            format!("{MANAGED_BY_LABEL}={MANAGED_BY}"),
            "label",
            "on follower EndpointSlices",
        ),
        (
            MCS_SOURCE_CLUSTER_LABEL.to_string(),
            "label",
            "on follower EndpointSlices: the source cluster (KEP-1645)",
        ),
        (
            format!("{SERVICE_NAME_LABEL}=<follower>"),
            "label",
            "on follower EndpointSlices",
        ),
        (
            format!("{SKIP_MIRROR_LABEL}=true"),
            "label",
            "on legacy Endpoints when slices are written too (`--endpoints-mode both`)",
        ),
        (
            format!("{OWNER_LABEL}={MANAGED_BY}"),
            "label",
            "`--mcs`: on our ServiceImports and derived Services",
        ),
        (
            DERIVED_SERVICE_ANNOTATION.to_string(),
            "annotation",
            "`--mcs`: on a ServiceImport, its derived Service",
        ),
        (
            HOLDER_ANNOTATION.to_string(),
            "annotation",
            "`--mcs`: on a ServiceImport, the cluster whose export's properties it took; that export keeps them while it exports (docs/mcs.md, Conflicts)",
        ),
        (
            ENDPOINTS_ANNOTATION.to_string(),
            "annotation",
            "`--mcs`: on a ServiceImport, each exporting cluster's endpoints as published and ready",
        ),
        (
            COPIED_LABELS_ANNOTATION.to_string(),
            "annotation",
            "`--mcs`: on a ServiceImport, the `exportedLabels` keys it copied",
        ),
        (
            COPIED_ANNOTATIONS_ANNOTATION.to_string(),
            "annotation",
            "`--mcs`: on a ServiceImport, the `exportedAnnotations` keys it copied",
        ),
    ];
    let mut out = String::from("| key | kind | what |\n|---|---|---|\n");
    for (key, kind, what) in rows {
        let _ = writeln!(out, "| `{key}` | {kind} | {what} |");
    }
    out
}

/// The annotations of a remote Secret (and of a ClusterProfile, which takes the same policy),
/// and the reasons a Secret or a profile is refused as a remote.
fn remote_objects() -> String {
    let rows = [
        (
            NAME_KEY,
            "Secret (label or annotation)",
            "the remote's name (else the Secret's name)",
        ),
        (
            CLUSTER_ID_KEY,
            "Secret, ClusterProfile",
            "the pin: the uid of the remote's kube-system namespace (a UUID; `remote-access --output secret` writes it). A server answering with another id is refused (`PinMismatch`); without it any cluster joins, unless `--require-cluster-id-pin` (`Unpinned`)",
        ),
        (
            STALE_AFTER_KEY,
            "Secret, ClusterProfile",
            "the outage policy",
        ),
        (
            PROBE_AFTER_KEY,
            "Secret, ClusterProfile",
            "the data-path probe",
        ),
        (
            ALLOWED_CIDRS_KEY,
            "Secret, ClusterProfile",
            "the networks its addresses must be in",
        ),
        (
            MAX_SERVICES_KEY,
            "Secret, ClusterProfile",
            "its budget of Services",
        ),
        (
            MAX_ENDPOINTS_KEY,
            "Secret, ClusterProfile",
            "its budget of endpoints",
        ),
        (
            MAX_CACHE_BYTES_KEY,
            "Secret, ClusterProfile",
            "its budget of cached bytes",
        ),
        (
            ALLOW_EXTERNAL_NAME_KEY,
            "Secret, ClusterProfile",
            "`\"true\"`: its ExternalName Services are mirrored",
        ),
        (
            RENEWAL_KEY,
            "Secret",
            "the remote ServiceAccount whose token the leader renews",
        ),
        (
            LIFETIME_KEY,
            "Secret",
            "the lifetime a renewed token asks for",
        ),
    ];
    let mut out = String::from("| key | on | what |\n|---|---|---|\n");
    for (key, on, what) in rows {
        let _ = writeln!(out, "| `{key}` | {on} | {what} |");
    }
    let reasons: Vec<String> = Refused::REASONS.iter().map(|r| format!("`{r}`")).collect();
    let _ = write!(
        out,
        "\nThe `reason` of `xcc_remote_refusals_total` (kind `Secret`, `ClusterProfile`, or `static` for the static remote): {}.\n",
        reasons.join(", ")
    );
    out
}

fn page() -> String {
    let cli = Cli::command();
    let mut out = String::from(
        "# Reference\n\nGenerated from the code by `cargo test --test reference`, which fails when \
         this page drifts from it (`XCC_WRITE_REFERENCE=1 cargo test --test reference` writes it \
         anew). Every flag also reads its environment variable.\n\n## Daemon flags\n\n",
    );
    out.push_str(&flags(&cli));
    for sub in cli.get_subcommands() {
        let _ = write!(out, "\n## `{}` flags\n\n", sub.get_name());
        if let Some(about) = sub.get_about() {
            let _ = write!(out, "{}\n\n", one_line(&about.to_string()));
        }
        out.push_str(&flags(sub));
    }
    out.push_str(
        "\n## Metrics\n\nOn `--admin-bind`, `/metrics` (one remote shown as `REMOTE`).\n\n",
    );
    out.push_str(&metrics());
    out.push_str("\n## Labels and annotations\n\nWith the default `--label-key`; another key keeps the same shape under its own prefix.\n\n");
    out.push_str(&names());
    out.push_str("\n## Remote Secrets and ClusterProfiles\n\nWhat a remote Secret's (or a ClusterProfile's) labels and annotations say of its remote; these keys do not follow `--label-key`.\n\n");
    out.push_str(&remote_objects());
    out
}

#[test]
fn reference_page_matches_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PAGE);
    let want = page();
    // every family registered in src/runtime/metrics.rs is on the page (one left empty above would not be),
    let source = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/runtime/metrics.rs"),
    )
    .expect("read src/runtime/metrics.rs");
    // and the gauges read from the set of remotes when scraped (src/runtime/series.rs)
    let registered = source.matches("registry.register(").count() + REMOTE_GAUGES.len();
    let listed = want
        .split("\n## Metrics")
        .nth(1)
        .and_then(|m| m.split("\n## ").next())
        .map_or(0, |m| {
            m.lines().filter(|l| l.starts_with("| `xcc_")).count()
        });
    assert_eq!(
        listed, registered,
        "src/runtime/metrics.rs and REMOTE_GAUGES name {registered} families, the reference lists \
         {listed}: give every family a series in every_family()"
    );
    if std::env::var_os("XCC_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, &want).expect("write docs/reference.md");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{PAGE} drifted from the code: run `XCC_WRITE_REFERENCE=1 cargo test --test reference` \
         and commit it"
    );
}
