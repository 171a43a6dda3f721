use super::*;
use crate::desired::options::{EndpointsMode, MCS_SOURCE_CLUSTER_LABEL};
use crate::desired::test_support::{endpoint, opts, service, slice, web_ports};
use serde_json::{Value, json};

fn remote(name: &str, id: Option<&str>) -> Options {
    let mut o = opts(EndpointsMode::Slices);
    o.cluster_name = name.to_string();
    o.cluster_id = id.map(str::to_string);
    o
}

fn export<'a>(
    opts: &'a Options,
    exported: &'a Service,
    slices: Vec<&'a EndpointSlice>,
) -> Export<'a> {
    Export {
        opts,
        exported,
        slices,
        stale: false,
    }
}

/// The merge of these exports for a key with no live follower and no held remote.
fn merged(exports: &[Export<'_>]) -> Merged {
    merge(
        exports,
        &BTreeSet::new(),
        None,
        &opts(EndpointsMode::Slices),
    )
}

fn exported(created: &str, spec: Value) -> Service {
    let mut s = service(spec);
    s.metadata.creation_timestamp = Some(Time(created.parse().unwrap()));
    s
}

fn web(created: &str) -> Service {
    exported(
        created,
        json!({"type": "ClusterIP", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
    )
}

fn ports_of(m: &Merged) -> Vec<(String, i32)> {
    let f = m.follower.as_ref().unwrap();
    let mut out: Vec<(String, i32)> = f
        .service
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| (p.name.clone().unwrap_or_default(), p.port))
        .collect();
    out.sort();
    out
}

fn annotation(m: &Merged, suffix: &str) -> String {
    let f = m.follower.as_ref().unwrap();
    f.service.metadata.annotations.as_ref().unwrap()[&format!("fair.com/cross-cluster-{suffix}")]
        .clone()
}

#[test]
fn two_remotes_give_one_service_with_both_their_slices() {
    let (east, north) = (remote("east", Some("id-east")), remote("north", None));
    let (a, b) = (web("2024-01-01T00:00:00Z"), web("2023-01-01T00:00:00Z"));
    let sa = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let sb = slice("web-b", "IPv4", web_ports(), vec![endpoint("10.1.0.1")]);
    let exports = [export(&east, &a, vec![&sa]), export(&north, &b, vec![&sb])];
    let m = merged(&exports);
    assert!(m.conflicts.is_empty() && m.skipped.is_empty());
    assert_eq!(annotation(&m, "origin-clusters"), "east,north");
    assert_eq!(
        annotation(&m, "origin-cluster"),
        "north",
        "the oldest exported Service's"
    );
    let f = m.follower.unwrap();
    assert_eq!(f.slices.len(), 2);
    let names: BTreeSet<_> = f
        .slices
        .iter()
        .map(|s| s.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "per-remote slice names never collide");
    let sources: BTreeSet<String> = f
        .slices
        .iter()
        .map(|s| s.metadata.labels.as_ref().unwrap()[MCS_SOURCE_CLUSTER_LABEL].clone())
        .collect();
    assert_eq!(sources, ["id-east".to_string(), "north".to_string()].into());
}

#[test]
fn ports_are_the_union_by_name_and_the_oldest_exported_service_wins_a_conflict() {
    let (east, north, south) = (
        remote("east", None),
        remote("north", None),
        remote("south", None),
    );
    let a = web("2024-01-01T00:00:00Z");
    let b = exported(
        "2025-01-01T00:00:00Z",
        json!({"ports": [
            {"name": "http", "port": 81}, {"name": "metrics", "port": 9100}]}),
    );
    let c = exported(
        "2025-01-01T00:00:00Z",
        json!({"ports": [{"name": "http", "port": 80, "protocol": "UDP"}]}),
    );
    let exports = [
        export(&south, &c, vec![]),
        export(&north, &b, vec![]),
        export(&east, &a, vec![]),
    ];
    let m = merged(&exports);
    assert_eq!(
        ports_of(&m),
        [("http".to_string(), 80), ("metrics".to_string(), 9100)]
    );
    let lost: Vec<(&str, ConflictKind)> = m
        .conflicts
        .iter()
        .map(|c| (c.cluster.as_str(), c.kind))
        .collect();
    assert_eq!(
        lost,
        [("north", ConflictKind::Port), ("south", ConflictKind::Port)],
        "same age: cluster name decides, north before south"
    );
    assert!(m.conflicts.iter().all(|c| c.winner == "east"));
}

#[test]
fn type_and_affinity_conflicts_are_reported_and_endpoints_stay_where_they_fit() {
    let (east, north) = (remote("east", None), remote("north", None));
    let a = web("2024-01-01T00:00:00Z");
    let b = exported(
        "2025-01-01T00:00:00Z",
        json!({"clusterIP": "None", "sessionAffinity": "ClientIP",
            "ports": [{"name": "http", "port": 80}]}),
    );
    let sb = slice("web-b", "IPv4", web_ports(), vec![endpoint("10.1.0.1")]);
    let exports = [export(&east, &a, vec![]), export(&north, &b, vec![&sb])];
    let m = merged(&exports);
    assert_eq!(m.conflicts.len(), 1);
    assert_eq!(m.conflicts[0].kind, ConflictKind::Type);
    let f = m.follower.as_ref().unwrap();
    assert_eq!(
        f.service.spec.as_ref().unwrap().cluster_ip,
        None,
        "east's ClusterIP wins"
    );
    assert_eq!(
        f.slices.len(),
        1,
        "north's endpoints still serve the ClusterIP follower"
    );

    let c = exported(
        "2025-01-01T00:00:00Z",
        json!({"sessionAffinity": "ClientIP",
            "ports": [{"name": "http", "port": 80}]}),
    );
    let exports = [export(&east, &a, vec![]), export(&north, &c, vec![])];
    let m = merged(&exports);
    let kinds: Vec<_> = m.conflicts.iter().map(|c| c.kind).collect();
    assert_eq!(kinds, [ConflictKind::SessionAffinity]);
}

#[test]
fn a_backdated_export_cannot_take_over_the_recorded_origin() {
    let (mut east, mut north) = (remote("east", None), remote("north", None));
    east.allow_external_name = true;
    north.allow_external_name = true;
    let honest = web("2025-01-01T00:00:00Z");
    // north backdates its ExternalName export to before east's
    let hostile = exported(
        "2000-01-01T00:00:00Z",
        json!({"type": "ExternalName", "externalName": "evil.example.com"}),
    );
    let exports = [
        export(&east, &honest, vec![]),
        export(&north, &hostile, vec![]),
    ];
    assert_eq!(
        annotation(&merged(&exports), "origin-cluster"),
        "north",
        "no follower yet: the oldest wins"
    );
    // the live follower records east, which this daemon saw first
    let mut live = web("2025-01-01T00:00:00Z");
    live.metadata.annotations = Some(
        [(
            "fair.com/cross-cluster-origin-cluster".to_string(),
            "east".to_string(),
        )]
        .into(),
    );
    let o = opts(EndpointsMode::Slices);
    let m = merge(&exports, &BTreeSet::new(), Some(&live), &o);
    assert_eq!(annotation(&m, "origin-cluster"), "east");
    let spec = m.follower.as_ref().unwrap().service.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert_eq!(spec.external_name, None);
    assert_eq!(m.conflicts[0].cluster, "north");
    assert_eq!(m.conflicts[0].winner, "east");
    // once east stops exporting, the rule falls back to the oldest
    let m = merge(&exports[1..], &BTreeSet::new(), Some(&live), &o);
    assert_eq!(annotation(&m, "origin-cluster"), "north");
}

#[test]
fn reserved_labels_are_refused_and_counted_per_remote() {
    let east = remote("east", None);
    let mut a = web("2024-01-01T00:00:00Z");
    let labels = a.metadata.labels.as_mut().unwrap();
    for key in [
        "multicluster.kubernetes.io/service-name",
        "service.kubernetes.io/service-proxy-name",
        "app.kubernetes.io/managed-by",
        "fair.com/other",
    ] {
        labels.insert(key.to_string(), "x".to_string());
    }
    labels.insert("team".to_string(), "shop".to_string());
    let s = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let exports = [export(&east, &a, vec![&s])];
    let m = merged(&exports);
    let f = m.follower.as_ref().unwrap();
    let metas = [&f.service.metadata, &f.slices[0].metadata];
    for (i, meta) in metas.into_iter().enumerate() {
        let labels = meta.labels.as_ref().unwrap();
        // the leader's labels go on the follower Service alone
        let team = (i == 0).then_some("shop");
        assert_eq!(labels.get("team").map(String::as_str), team);
        assert_eq!(labels["fair.com/cross-cluster"], "follower");
        for key in labels.keys() {
            let ours = [
                "fair.com/cross-cluster",
                "fair.com/cross-cluster-origin-cluster",
                "kubernetes.io/service-name",
                "endpointslice.kubernetes.io/managed-by",
                MCS_SOURCE_CLUSTER_LABEL,
            ];
            assert!(
                !key.contains("kubernetes.io") && !key.starts_with("fair.com")
                    || ours.contains(&key.as_str()),
                "{key} reached a local object"
            );
        }
    }
    let count = m.refused_labels[0].1[&crate::desired::containment::LabelRefusal::Reserved];
    assert_eq!((m.refused_labels[0].0.as_str(), count), ("east", 4));
}

#[test]
fn external_name_is_refused_unless_the_remote_is_allowed_it() {
    let mut east = remote("east", None);
    let a = exported(
        "2024-01-01T00:00:00Z",
        json!({"type": "ExternalName", "externalName": "db.example.com"}),
    );
    let m = merged(&[export(&east, &a, vec![])]);
    assert!(m.follower.is_none());
    assert_eq!(m.skipped, [("east".to_string(), Skip::ExternalNameRefused)]);
    east.allow_external_name = true;
    let m = merged(&[export(&east, &a, vec![])]);
    assert!(m.skipped.is_empty());
    assert!(m.follower.is_some());
}

#[test]
fn an_external_name_winner_takes_no_endpoints() {
    let (mut east, north) = (remote("east", None), remote("north", None));
    east.allow_external_name = true;
    let a = exported(
        "2024-01-01T00:00:00Z",
        json!({"type": "ExternalName", "externalName": "db.example.com"}),
    );
    let b = web("2025-01-01T00:00:00Z");
    let sb = slice("web-b", "IPv4", web_ports(), vec![endpoint("10.1.0.1")]);
    let exports = [export(&east, &a, vec![]), export(&north, &b, vec![&sb])];
    let m = merged(&exports);
    assert_eq!(m.conflicts[0].kind, ConflictKind::Type);
    assert!(m.follower.unwrap().slices.is_empty());
}

#[test]
fn held_remotes_stay_recorded_and_keep_their_ports() {
    let east = remote("east", None);
    let a = web("2024-01-01T00:00:00Z");
    let exports = [export(&east, &a, vec![])];
    let live = exported(
        "2024-01-01T00:00:00Z",
        json!({"ports": [
            {"name": "http", "port": 80}, {"name": "admin", "port": 9000, "nodePort": 30000}]}),
    );
    let held: BTreeSet<String> = ["north".to_string()].into();
    let m = merge(&exports, &held, Some(&live), &opts(EndpointsMode::Slices));
    assert_eq!(annotation(&m, "origin-clusters"), "east,north");
    assert_eq!(
        ports_of(&m),
        [("admin".to_string(), 9000), ("http".to_string(), 80)]
    );
    let m = merge(
        &exports,
        &BTreeSet::new(),
        Some(&live),
        &opts(EndpointsMode::Slices),
    );
    assert_eq!(
        ports_of(&m),
        [("http".to_string(), 80)],
        "nobody held: only what exports ask"
    );
}

#[test]
fn a_skipped_export_is_reported_and_the_others_mirror() {
    let (east, north) = (remote("east", None), remote("north", None));
    let a = web("2024-01-01T00:00:00Z");
    let mut b = web("2023-01-01T00:00:00Z");
    b.metadata
        .labels
        .as_mut()
        .unwrap()
        .remove("fair.com/cross-cluster");
    let exports = [export(&east, &a, vec![]), export(&north, &b, vec![])];
    let m = merged(&exports);
    assert_eq!(m.skipped.len(), 1);
    assert_eq!(m.skipped[0].0, "north");
    assert_eq!(annotation(&m, "origin-clusters"), "east");
}

#[test]
fn legacy_endpoints_carry_every_export() {
    let (mut east, mut north) = (remote("east", None), remote("north", None));
    east.endpoints_mode = EndpointsMode::Endpoints;
    north.endpoints_mode = EndpointsMode::Endpoints;
    let (a, b) = (web("2024-01-01T00:00:00Z"), web("2025-01-01T00:00:00Z"));
    let sa = slice("web-a", "IPv4", web_ports(), vec![endpoint("10.0.0.1")]);
    let sb = slice("web-b", "IPv4", web_ports(), vec![endpoint("10.1.0.1")]);
    let exports = [export(&east, &a, vec![&sa]), export(&north, &b, vec![&sb])];
    let m = merge(
        &exports,
        &BTreeSet::new(),
        None,
        &opts(EndpointsMode::Endpoints),
    );
    let ep = m.follower.unwrap().endpoints.unwrap();
    let ips: Vec<String> = ep
        .subsets
        .unwrap()
        .iter()
        .flat_map(|s| s.addresses.iter().flatten().map(|a| a.ip.clone()))
        .collect();
    assert_eq!(ips, ["10.0.0.1", "10.1.0.1"]);
}
