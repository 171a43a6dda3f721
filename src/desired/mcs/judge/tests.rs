use super::*;
use crate::desired::mcs::test_support::*;
use serde_json::json;

fn reasons(j: &Judgement<'_, '_>) -> Vec<(&'static str, Vec<String>)> {
    j.conflicts
        .iter()
        .map(|c| (c.reason.reason(), c.clusters.clone()))
        .collect()
}

#[test]
fn validity_of_an_export() {
    let ex = export("east", "2024-01-01T00:00:00Z");
    let svc = hello();
    let external = service(json!({"type": "ExternalName", "externalName": "example.com"}));
    let table = [
        (Some(&svc), Validity::Valid, "Valid"),
        (None, Validity::NoService, "NoService"),
        (
            Some(&external),
            Validity::InvalidServiceType,
            "InvalidServiceType",
        ),
    ];
    for (service, want, reason) in table {
        let e = ClusterExport {
            cluster: "east",
            export: &ex,
            service,
            slices: vec![],
        };
        assert_eq!(validity(&e), want);
        assert_eq!(want.reason(), reason);
    }
}

#[test]
fn the_oldest_valid_export_wins_and_ties_go_by_cluster_name() {
    let (a, b, c, d) = (
        export("west", "2024-03-01T00:00:00Z"),
        export("east", "2024-01-01T00:00:00Z"),
        export("north", "2024-01-01T00:00:00Z"),
        export("south", "2023-01-01T00:00:00Z"),
    );
    let mut undated = export("alpha", "2024-01-01T00:00:00Z");
    undated.metadata.creation_timestamp = None;
    let svc = hello();
    let exports = [
        member("west", &a, Some(&svc)),
        member("east", &b, Some(&svc)),
        member("north", &c, Some(&svc)),
        // the oldest, but without a Service: not a member
        member("south", &d, None),
        member("alpha", &undated, Some(&svc)),
    ];
    let j = judge("shop", "hello", &exports, None).unwrap();
    let order: Vec<&str> = j.members.iter().map(|e| e.cluster).collect();
    assert_eq!(order, ["east", "north", "west", "alpha"]);
    assert!(j.conflicts.is_empty(), "{:?}", j.conflicts);
}

#[test]
fn an_export_being_deleted_takes_no_part() {
    let a = export("east", "2024-01-01T00:00:00Z");
    let mut b = export("west", "2023-01-01T00:00:00Z");
    b.metadata.deletion_timestamp = Some(time("2024-06-01T00:00:00Z"));
    let svc = hello();
    let exports = [
        member("east", &a, Some(&svc)),
        member("west", &b, Some(&svc)),
    ];
    let j = judge("shop", "hello", &exports, None).unwrap();
    assert_eq!(j.winner().unwrap().cluster, "east");
    assert_eq!(j.members.len(), 1);
}

#[test]
fn inputs_are_checked() {
    let a = export("east", "2024-01-01T00:00:00Z");
    let svc = hello();
    let bad = [member("East_1", &a, Some(&svc))];
    assert_eq!(
        judge("shop", "hello", &bad, None).unwrap_err(),
        McsError::InvalidClusterName("East_1".into())
    );
    let twice = [member("east", &a, Some(&svc)), member("east", &a, None)];
    assert_eq!(
        judge("shop", "hello", &twice, None).unwrap_err(),
        McsError::DuplicateCluster("east".into())
    );
    let one = [member("east", &a, Some(&svc))];
    let err = judge("shop", "web", &one, None).unwrap_err();
    assert_eq!(err.reason(), "OtherKey");
    assert!(err.to_string().contains("shop/hello"), "{err}");
    assert!(
        judge("shop", "hello", &[], None)
            .unwrap()
            .winner()
            .is_none()
    );
}

/// The conflict cases of the conformance suite and KEP-1645, each against the winner's
/// hello Service (tcp/42 and udp/42, ClientIP affinity with a 10 s timeout).
#[test]
fn conflicts_table() {
    let cases: Vec<(&str, serde_json::Value, Vec<&str>)> = vec![
        ("identical", json!({}), vec![]),
        (
            "headless",
            json!({"clusterIP": "None"}),
            vec!["TypeConflict"],
        ),
        (
            "a port added (conformance: the union, with a conflict)",
            json!({"ports": [{"name": "tcp", "port": 42, "protocol": "TCP"},
                                 {"name": "stcp", "port": 142, "protocol": "SCTP"}]}),
            vec!["PortConflict"],
        ),
        (
            "another number under one name",
            json!({"ports": [{"name": "tcp", "port": 43, "protocol": "TCP"}]}),
            vec!["PortConflict"],
        ),
        (
            "another appProtocol",
            json!({"ports": [{"name": "tcp", "port": 42, "protocol": "TCP", "appProtocol": "http"},
                                 {"name": "udp", "port": 42, "protocol": "UDP"}]}),
            vec!["PortConflict"],
        ),
        (
            "no affinity",
            json!({"sessionAffinity": "None", "sessionAffinityConfig": null}),
            vec!["SessionAffinityConflict"],
        ),
        (
            "another timeout",
            json!({"sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 20}}}),
            vec!["SessionAffinityConfigConflict"],
        ),
        (
            "internal traffic policy",
            json!({"internalTrafficPolicy": "Local"}),
            vec!["InternalTrafficPolicyConflict"],
        ),
        (
            "traffic distribution",
            json!({"trafficDistribution": "PreferClose"}),
            vec!["TrafficDistributionConflict"],
        ),
        (
            "dual stack beside single stack",
            json!({"ipFamilies": ["IPv4", "IPv6"]}),
            vec!["IPFamilyConflict"],
        ),
        (
            "several at once, in the fixed order",
            json!({"clusterIP": "None", "internalTrafficPolicy": "Local",
                       "ports": [{"name": "x", "port": 1}]}),
            vec![
                "TypeConflict",
                "PortConflict",
                "InternalTrafficPolicyConflict",
            ],
        ),
    ];
    let older = export("east", "2024-01-01T00:00:00Z");
    let newer = export("west", "2024-01-01T00:00:02Z");
    let winner = hello();
    for (what, change, want) in cases {
        let theirs = hello_with(change);
        let exports = [
            member("west", &newer, Some(&theirs)),
            member("east", &older, Some(&winner)),
        ];
        let j = judge("shop", "hello", &exports, None).unwrap();
        let got: Vec<&str> = j.conflicts.iter().map(|c| c.reason.reason()).collect();
        assert_eq!(got, want, "{what}");
        assert!(j.conflicts.iter().all(|c| c.winner == "east"), "{what}");
        assert!(j.conflicts.iter().all(|c| c.clusters == ["west"]), "{what}");
    }
}

#[test]
fn defaults_are_no_conflict() {
    // unset affinity, timeout, policy and protocol equal the API server's defaults
    let older = export("east", "2024-01-01T00:00:00Z");
    let newer = export("west", "2024-01-01T00:00:02Z");
    let a = service(json!({"sessionAffinity": "ClientIP",
            "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 10800}},
            "internalTrafficPolicy": "Cluster",
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]}));
    let b = service(json!({"sessionAffinity": "ClientIP",
            "ports": [{"name": "http", "port": 80}]}));
    let exports = [
        member("east", &older, Some(&a)),
        member("west", &newer, Some(&b)),
    ];
    assert!(
        judge("shop", "hello", &exports, None)
            .unwrap()
            .conflicts
            .is_empty()
    );
}

#[test]
fn exported_labels_and_annotations_conflict() {
    let mut older = export("east", "2024-01-01T00:00:00Z");
    older
        .spec
        .exported_labels
        .insert("dummy-label".into(), "true".into());
    older
        .spec
        .exported_annotations
        .insert("dummy-annotation".into(), "true".into());
    let mut newer = export("west", "2024-01-01T00:00:02Z");
    newer
        .spec
        .exported_labels
        .insert("dummy-label2".into(), "true".into());
    newer
        .spec
        .exported_annotations
        .insert("dummy-annotation2".into(), "true".into());
    let svc = hello();
    let exports = [
        member("east", &older, Some(&svc)),
        member("west", &newer, Some(&svc)),
    ];
    let j = judge("shop", "hello", &exports, None).unwrap();
    assert_eq!(
        reasons(&j),
        [
            ("LabelsConflict", vec!["west".to_string()]),
            ("AnnotationsConflict", vec!["west".to_string()])
        ]
    );
}

#[test]
fn three_clusters_the_oldest_wins_and_each_differing_one_is_named() {
    let (a, b, c) = (
        export("c1", "2024-01-01T00:00:03Z"),
        export("c2", "2024-01-01T00:00:01Z"),
        export("c3", "2024-01-01T00:00:02Z"),
    );
    let (s1, s2, s3) = (
        hello_with(json!({"ports": [{"name": "tcp", "port": 44, "protocol": "TCP"}]})),
        hello(),
        hello_with(json!({"clusterIP": "None"})),
    );
    let exports = [
        member("c1", &a, Some(&s1)),
        member("c2", &b, Some(&s2)),
        member("c3", &c, Some(&s3)),
    ];
    let j = judge("shop", "hello", &exports, None).unwrap();
    assert_eq!(j.winner().unwrap().cluster, "c2");
    assert_eq!(
        reasons(&j),
        [
            ("TypeConflict", vec!["c3".to_string()]),
            ("PortConflict", vec!["c1".to_string()])
        ]
    );
    let message = j.conflicts[1].message();
    assert!(
        message.contains("\"c2\"") && message.contains("\"c1\""),
        "{message}"
    );
    assert!(
        message.starts_with("ports: the import has their union"),
        "{message}"
    );
    assert!(message.ends_with("cluster \"c1\" differs."), "{message}");
}

#[test]
fn ports_are_the_union_with_the_oldest_winning() {
    /// (name, protocol, port)
    type Port<'a> = (&'a str, &'a str, i32);
    let cases: Vec<(serde_json::Value, Vec<Port>)> = vec![
        // conformance: a port added by the newer export joins the union
        (
            json!([{"name": "tcp", "port": 42, "protocol": "TCP"},
                       {"name": "stcp", "port": 142, "protocol": "SCTP"}]),
            vec![
                ("stcp", "SCTP", 142),
                ("tcp", "TCP", 42),
                ("udp", "UDP", 42),
            ],
        ),
        // conformance: the same name with another number: the oldest's stays
        (
            json!([{"name": "tcp", "port": 43, "protocol": "TCP"}]),
            vec![("tcp", "TCP", 42), ("udp", "UDP", 42)],
        ),
        // another name for a taken protocol and number: left out
        (
            json!([{"name": "other", "port": 42, "protocol": "TCP"}]),
            vec![("tcp", "TCP", 42), ("udp", "UDP", 42)],
        ),
        // an unnamed port cannot join named ones
        (
            json!([{"port": 8080}]),
            vec![("tcp", "TCP", 42), ("udp", "UDP", 42)],
        ),
    ];
    let older = export("east", "2024-01-01T00:00:00Z");
    let newer = export("west", "2024-01-01T00:00:02Z");
    let winner = hello();
    for (ports, want) in cases {
        let theirs = hello_with(json!({ "ports": ports }));
        let exports = [
            member("west", &newer, Some(&theirs)),
            member("east", &older, Some(&winner)),
        ];
        let j = judge("shop", "hello", &exports, None).unwrap();
        let got: Vec<(String, String, i32)> = j
            .ports()
            .into_iter()
            .map(|p| (p.name, p.protocol, p.port))
            .collect();
        let want: Vec<(String, String, i32)> = want
            .into_iter()
            .map(|(n, p, x)| (n.to_string(), p.to_string(), x))
            .collect();
        assert_eq!(got, want, "{ports}");
    }
}

#[test]
fn families_lead_with_the_winners_primary() {
    let older = export("east", "2024-01-01T00:00:00Z");
    let newer = export("west", "2024-01-01T00:00:02Z");
    let v6 = hello_with(json!({"ipFamilies": ["IPv6"]}));
    let dual = hello_with(json!({"ipFamilies": ["IPv4", "IPv6"]}));
    let exports = [
        member("east", &older, Some(&v6)),
        member("west", &newer, Some(&dual)),
    ];
    let j = judge("shop", "hello", &exports, None).unwrap();
    assert_eq!(j.families(), ["IPv6", "IPv4"]);
}

#[test]
fn long_cluster_lists_are_counted() {
    let names: Vec<String> = (0..13).map(|i| format!("c{i:02}")).collect();
    let c = Conflict {
        reason: ConflictReason::Type,
        winner: "w".into(),
        won: Won::Oldest,
        clusters: names,
    };
    let m = c.message();
    assert!(m.ends_with("\"c09\" and 3 more differ."), "{m}");
    assert!(
        m.starts_with("type (ClusterSetIP or Headless): the import takes the oldest"),
        "{m}"
    );
}

/// east holds the import with `Cluster`; south comes later claiming an older export, with
/// `internalTrafficPolicy: Local` and its own `tcp` port.
fn backdated_south() -> (ServiceExport, ServiceExport, Service, Service) {
    let east = export("east", "2024-01-01T00:00:00Z");
    let south = export("south", "2020-01-01T00:00:00Z");
    let hostile = hello_with(json!({"internalTrafficPolicy": "Local",
        "ports": [{"name": "tcp", "port": 4242, "protocol": "TCP"}]}));
    (east, south, hello(), hostile)
}

#[test]
fn a_backdated_newcomer_does_not_take_the_properties_from_the_holder() {
    let (east, south, svc, hostile) = backdated_south();
    let exports = [
        member("south", &south, Some(&hostile)),
        member("east", &east, Some(&svc)),
    ];
    let j = judge("shop", "hello", &exports, Some("east")).unwrap();
    let order: Vec<&str> = j.members.iter().map(|e| e.cluster).collect();
    assert_eq!(order, ["east", "south"], "south stays a member, behind");
    assert_eq!(
        j.winner_spec().unwrap().internal_traffic_policy.as_deref(),
        Some("Cluster")
    );
    // east's tcp/42 keeps the name; south's tcp/4242 loses it
    let ports: Vec<(String, i32)> = j.ports().into_iter().map(|p| (p.name, p.port)).collect();
    assert_eq!(ports, [("tcp".to_string(), 42), ("udp".to_string(), 42)]);
    assert_eq!(
        reasons(&j),
        [
            ("PortConflict", vec!["south".to_string()]),
            ("InternalTrafficPolicyConflict", vec!["south".to_string()])
        ]
    );
    assert!(j.conflicts.iter().all(|c| c.winner == "east"));
    assert!(j.conflicts.iter().all(|c| c.won == Won::Held));
    let m = j.conflicts[1].message();
    assert!(
        m.contains("cluster \"east\"'s, which the import holds"),
        "{m}"
    );
}

#[test]
fn without_a_holder_the_oldest_wins() {
    let (east, south, svc, hostile) = backdated_south();
    let exports = [
        member("east", &east, Some(&svc)),
        member("south", &south, Some(&hostile)),
    ];
    // no holder, or a holder that exports nothing here
    for holder in [None, Some("north")] {
        let j = judge("shop", "hello", &exports, holder).unwrap();
        assert_eq!(j.winner().unwrap().cluster, "south", "{holder:?}");
        assert!(j.conflicts.iter().all(|c| c.won == Won::Oldest));
        let m = j.conflicts[0].message();
        assert!(m.contains("the oldest export's (cluster \"south\")"), "{m}");
    }
    // a holder that is also the oldest wins by age: the message is the KEP's
    let j = judge("shop", "hello", &exports, Some("south")).unwrap();
    assert_eq!(j.winner().unwrap().cluster, "south");
    assert!(j.conflicts.iter().all(|c| c.won == Won::Oldest));
}

#[test]
fn a_holder_that_stops_being_a_member_leaves_it_to_the_oldest_remaining() {
    let (east, south, svc, hostile) = backdated_south();
    let north = export("north", "2022-01-01T00:00:00Z");
    let mut gone = east.clone();
    gone.metadata.deletion_timestamp = Some(time("2024-06-01T00:00:00Z"));
    let cases = [
        ("being deleted", member("east", &gone, Some(&svc))),
        ("its Service gone", member("east", &east, None)),
    ];
    for (what, holder) in cases {
        let exports = [
            holder,
            member("south", &south, Some(&hostile)),
            member("north", &north, Some(&svc)),
        ];
        let j = judge("shop", "hello", &exports, Some("east")).unwrap();
        let order: Vec<&str> = j.members.iter().map(|e| e.cluster).collect();
        assert_eq!(order, ["south", "north"], "{what}");
    }
    // its export gone from the inputs altogether
    let exports = [
        member("north", &north, Some(&svc)),
        member("south", &south, Some(&hostile)),
    ];
    let j = judge("shop", "hello", &exports, Some("east")).unwrap();
    assert_eq!(j.winner().unwrap().cluster, "south");
}

#[test]
fn the_holder_goes_first_and_the_rest_keep_their_age_order() {
    let (a, b, c) = (
        export("c1", "2024-01-01T00:00:01Z"),
        export("c2", "2024-01-01T00:00:02Z"),
        export("c3", "2024-01-01T00:00:03Z"),
    );
    let svc = hello();
    let exports = [
        member("c3", &c, Some(&svc)),
        member("c1", &a, Some(&svc)),
        member("c2", &b, Some(&svc)),
    ];
    let j = judge("shop", "hello", &exports, Some("c3")).unwrap();
    let order: Vec<&str> = j.members.iter().map(|e| e.cluster).collect();
    assert_eq!(order, ["c3", "c1", "c2"]);
}

#[test]
fn the_conflicts_note_names_the_winner_why_and_who_differs_within_the_event_limit() {
    let (east, south, svc, hostile) = backdated_south();
    let exports = [
        member("east", &east, Some(&svc)),
        member("south", &south, Some(&hostile)),
    ];
    let j = judge("shop", "hello", &exports, Some("east")).unwrap();
    assert_eq!(
        conflicts_note(&j.conflicts).unwrap(),
        "the import takes cluster \"east\"'s properties (it holds the import; a later export \
         takes nothing); differing: ports by \"south\"; internalTrafficPolicy by \"south\""
    );
    assert!(conflicts_note(&[]).is_none());
    let many = Conflict {
        reason: ConflictReason::Port,
        winner: "w".into(),
        won: Won::Oldest,
        clusters: (0..10).map(|i| format!("{i}{}", "é".repeat(30))).collect(),
    };
    let note = conflicts_note(&vec![many; 9]).unwrap();
    assert!(
        note.len() <= 1024
            && note.starts_with("the import takes cluster \"w\"'s properties (the oldest export)")
    );
}
