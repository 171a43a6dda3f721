use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::*;
use crate::desired::containment::{Containment, LabelRefusal};
use crate::desired::follower::{Follower, follower};
use crate::desired::options::{EndpointsMode, Options, Skip};
use crate::desired::test_support::{cluster_ip_service, endpoint, opts, slice, web_ports};
use crate::desired::{Export, ServiceChange, merge, service_change, slice_change};

const RECORD: &str = "fair.com/cross-cluster-copied-labels";

fn limited(mode: EndpointsMode, limits: WriteLimits) -> Options {
    opts(mode).with_containment(Containment {
        limits,
        ..Containment::default()
    })
}

/// The test exported Service with `n` more labels `l<i>=v<i>` (about 8 bytes each).
fn labelled(n: usize) -> Service {
    let mut svc = cluster_ip_service();
    let labels = svc.metadata.labels.get_or_insert_default();
    for i in 0..n {
        labels.insert(format!("l{i:04}"), format!("v{i:04}"));
    }
    svc
}

/// The test exported Service with `n` more labels of 80 bytes each (issue 37's: 1,500 of them
/// take 120 KB).
fn wide(n: usize) -> Service {
    let mut svc = cluster_ip_service();
    let labels = svc.metadata.labels.get_or_insert_default();
    for i in 0..n {
        labels.insert(format!("example.com/label-{i:04}"), "v".repeat(58));
    }
    svc
}

/// `n` remote slices of one endpoint each, every one with a port of its own (issue 37's input).
fn one_port_each(n: usize) -> Vec<EndpointSlice> {
    (0..n)
        .map(|i| {
            let port = json!([{"name": format!("p{i}"), "port": 10000 + i, "protocol": "TCP"}]);
            let ip = format!("10.0.{}.{}", i / 250, i % 250 + 1);
            slice(&format!("web-{i}"), "IPv4", port, vec![endpoint(&ip)])
        })
        .collect()
}

fn refs(slices: &[EndpointSlice]) -> Vec<&EndpointSlice> {
    slices.iter().collect()
}

/// What the API server would return after creating `desired` (no managedFields: the caches
/// hold none either), with a label someone added locally.
fn as_created(desired: &Service) -> Service {
    let mut live = serde_json::to_value(desired).unwrap();
    live["metadata"]["uid"] = json!("local-uid-7");
    live["metadata"]["resourceVersion"] = json!("1001");
    live["metadata"]["labels"]["team"] = json!("local");
    live["spec"]["clusterIP"] = json!("10.100.0.5");
    serde_json::from_value(live).unwrap()
}

fn labels_of(svc: &Service) -> BTreeSet<String> {
    svc.metadata
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k.clone())
        .collect()
}

#[test]
fn labels_up_to_the_limit_are_copied_and_over_it_none_and_no_record() {
    // 10 labels l0000=v0000 .. of 10 bytes each, and "app"="web" (6): 106 bytes
    let svc = labelled(10);
    let at = WriteLimits {
        label_bytes: 106,
        ..WriteLimits::default()
    };
    let f = follower(&svc, &[], &limited(EndpointsMode::Slices, at)).unwrap();
    assert_eq!(f.labels_held, None);
    assert!(labels_of(&f.service).contains("l0009"));
    let record = &f.service.metadata.annotations.as_ref().unwrap()[RECORD];
    assert!(record.starts_with("app,l0000,"), "{record}");

    let below = WriteLimits {
        label_bytes: 105,
        ..at
    };
    let f = follower(&svc, &[], &limited(EndpointsMode::Slices, below)).unwrap();
    assert_eq!(
        f.labels_held,
        Some(LabelsHeld {
            labels: 11,
            bytes: 106,
            limit: 105
        })
    );
    // ours only, and no record: the live follower's copies and record stay as they were
    assert_eq!(labels_of(&f.service), BTreeSet::from([KEY.to_string()]));
    assert!(
        !f.service
            .metadata
            .annotations
            .as_ref()
            .unwrap()
            .contains_key(RECORD)
    );
    assert_eq!(f.refused_labels[&LabelRefusal::OverLimit], 11);
    let text = f.labels_held.unwrap().to_string();
    assert!(text.contains("106 bytes, more than 105"), "{text}");

    // 0: no limit
    let none = WriteLimits {
        label_bytes: 0,
        ..at
    };
    let f = follower(&labelled(5000), &[], &limited(EndpointsMode::Slices, none)).unwrap();
    assert_eq!(f.labels_held, None);
}

const KEY: &str = "fair.com/cross-cluster";

#[test]
fn over_the_label_limit_the_followers_labels_are_kept_as_they_were_and_follow_again_below_it() {
    let o = limited(EndpointsMode::Slices, WriteLimits::default());
    let live = as_created(&follower(&labelled(10), &[], &o).unwrap().service);
    // the leader grows to 3,000 labels (about 60 KB) and changes a port
    let mut big = labelled(3000);
    big.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
    let f = follower(&big, &[], &o).unwrap();
    assert!(f.labels_held.is_some());
    let ServiceChange::Update(updated) = service_change(&live, &f.service) else {
        panic!("the port change is written");
    };
    assert_eq!(
        labels_of(&updated),
        labels_of(&live),
        "labels kept as they were"
    );
    assert_eq!(
        updated.metadata.annotations.as_ref().unwrap()[RECORD],
        live.metadata.annotations.as_ref().unwrap()[RECORD],
        "and their record"
    );
    assert_eq!(
        updated.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].port,
        81
    );
    assert_eq!(
        service_change(&updated, &f.service),
        ServiceChange::Unchanged
    );

    // below the limit again with a label dropped: the labels follow the leader once more
    let mut small = labelled(3);
    small.spec = big.spec.clone();
    let f = follower(&small, &[], &o).unwrap();
    assert_eq!(f.labels_held, None);
    let ServiceChange::Update(again) = service_change(&updated, &f.service) else {
        panic!("the labels follow again");
    };
    let labels = labels_of(&again);
    assert!(
        labels.contains("l0002") && !labels.contains("l0003"),
        "{labels:?}"
    );
    assert!(labels.contains("team"), "a local label stays");
}

#[test]
fn a_new_follower_over_the_label_limit_gets_none_of_them() {
    let o = limited(EndpointsMode::Both, WriteLimits::default());
    let f = follower(&labelled(3000), &refs(&one_port_each(1)), &o).unwrap();
    assert_eq!(labels_of(&f.service), BTreeSet::from([KEY.to_string()]));
    for s in &f.slices {
        assert!(!labels_of_meta(&s.metadata).contains("l0000"));
    }
}

fn labels_of_meta(
    m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> BTreeSet<String> {
    m.labels.iter().flatten().map(|(k, _)| k.clone()).collect()
}

#[test]
fn slices_and_endpoints_carry_none_of_the_leaders_labels_with_an_empty_record() {
    let o = limited(EndpointsMode::Both, WriteLimits::default());
    let f = follower(&labelled(50), &refs(&one_port_each(3)), &o).unwrap();
    assert!(labels_of(&f.service).contains("l0049"));
    assert_eq!(f.slices.len(), 3);
    let ep = f.endpoints.as_ref().unwrap();
    let metas = f.slices.iter().map(|s| &s.metadata).chain([&ep.metadata]);
    for m in metas {
        let labels = labels_of_meta(m);
        assert!(
            !labels.contains("app") && !labels.iter().any(|k| k.starts_with('l')),
            "{labels:?}"
        );
        assert_eq!(m.annotations.as_ref().unwrap()[RECORD], "");
    }
    // and a slice written that way needs no write the second time
    let s = &f.slices[0];
    assert_eq!(slice_change(s, s), None);
}

#[test]
fn slices_over_the_limit_skip_the_remote_and_zero_is_no_limit() {
    let remote = one_port_each(20);
    let ten = WriteLimits {
        slices: 10,
        ..WriteLimits::default()
    };
    let skip = follower(
        &labelled(0),
        &refs(&remote),
        &limited(EndpointsMode::Slices, ten),
    );
    assert_eq!(
        skip,
        Err(Skip::TooManySlices {
            slices: 20,
            limit: 10
        })
    );
    assert_eq!(skip.unwrap_err().reason(), "TooManySlices");
    // endpoints mode writes no slice, but kube-controller-manager mirrors one per port set
    let o = limited(EndpointsMode::Endpoints, ten);
    assert!(follower(&labelled(0), &refs(&remote), &o).is_err());
    let twenty = WriteLimits { slices: 20, ..ten };
    let o = limited(EndpointsMode::Slices, twenty);
    assert_eq!(
        follower(&labelled(0), &refs(&remote), &o)
            .unwrap()
            .slices
            .len(),
        20
    );
    let none = WriteLimits { slices: 0, ..ten };
    assert!(
        follower(
            &labelled(0),
            &refs(&remote),
            &limited(EndpointsMode::Slices, none)
        )
        .is_ok()
    );
}

#[test]
fn the_slice_count_is_one_per_started_thousand_endpoints_of_each_port_set() {
    let many: Vec<Value> = (0..2001)
        .map(|i| endpoint(&format!("10.1.{}.{}", i / 250, i % 250)))
        .collect();
    let big = slice("web-a", "IPv4", web_ports(), many);
    let other = one_port_each(1);
    let all = [&big, &other[0]];
    let groups = crate::desired::slices::group_endpoints(&all);
    assert_eq!(crate::desired::slices::slice_count(&groups), 3 + 1);
}

#[test]
fn ports_over_the_limit_skip_the_remote_whether_on_the_service_or_in_its_slices() {
    let mut svc = labelled(0);
    let ports: Vec<Value> = (0..101)
        .map(|i| json!({"name": format!("p{i}"), "port": 1000 + i}))
        .collect();
    svc.spec.as_mut().unwrap().ports = Some(serde_json::from_value(json!(ports)).unwrap());
    let o = limited(EndpointsMode::Slices, WriteLimits::default());
    let err = follower(&svc, &[], &o).unwrap_err();
    assert_eq!(
        err,
        Skip::TooManyPorts {
            ports: 101,
            limit: 100,
            what: "its Service"
        }
    );
    assert!(
        err.to_string()
            .contains("101 ports in its Service, more than 100"),
        "{err}"
    );

    // 101 slices of one endpoint and one port each: the slices name 101 distinct ports
    let remote = one_port_each(101);
    let no_slice_limit = WriteLimits {
        slices: 0,
        ..WriteLimits::default()
    };
    let o = limited(EndpointsMode::Slices, no_slice_limit);
    let err = follower(&labelled(0), &refs(&remote), &o).unwrap_err();
    assert!(
        matches!(
            err,
            Skip::TooManyPorts {
                ports: 101,
                what: "its EndpointSlices",
                ..
            }
        ),
        "{err:?}"
    );
    let none = WriteLimits {
        ports: 0,
        ..no_slice_limit
    };
    assert!(follower(&svc, &refs(&remote), &limited(EndpointsMode::Slices, none)).is_ok());
}

/// Bytes of an object as JSON (the API server adds metadata of its own to both sides).
fn size<T: serde::Serialize>(o: &T) -> usize {
    serde_json::to_vec(o).unwrap().len()
}

fn follower_size(f: &Follower) -> usize {
    size(&f.service)
        + f.slices.iter().map(size).sum::<usize>()
        + f.endpoints.as_ref().map_or(0, size)
}

#[test]
fn issue_37s_input_costs_the_local_cluster_less_than_the_remote_and_below_the_limit_at_most_twice()
{
    let remote = one_port_each(20);
    let o = limited(EndpointsMode::Both, WriteLimits::default());
    // 1,500 labels (120 KB) over the limit: the follower carries none of them
    let big = wide(1500);
    assert_eq!(
        label_bytes(big.metadata.labels.as_ref().unwrap()),
        120_006 + 26
    );
    let f = follower(&big, &refs(&remote), &o).unwrap();
    let theirs = size(&big) + remote.iter().map(size).sum::<usize>();
    let ours = follower_size(&f);
    assert_eq!(f.slices.len(), 20);
    assert!(ours < theirs, "ours {ours} theirs {theirs}");
    // just below the limit (16 KiB: 1,600 labels of 10 bytes), every label is copied, once
    let near = labelled(1600);
    let f = follower(&near, &refs(&remote), &o).unwrap();
    assert_eq!(f.labels_held, None);
    let theirs = size(&near) + remote.iter().map(size).sum::<usize>();
    let ours = follower_size(&f);
    assert!(ours <= 2 * theirs, "ours {ours} theirs {theirs}");
}

#[test]
fn the_merge_reports_the_winners_labels_held_only() {
    let a = limited(EndpointsMode::Slices, WriteLimits::default());
    let mut b = a.clone();
    b.cluster_name = "remote-b".into();
    let mut older = labelled(3000);
    older.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2024-01-01T00:00:00Z".parse().unwrap(),
    ));
    let mut newer = labelled(3000);
    newer.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2025-01-01T00:00:00Z".parse().unwrap(),
    ));
    let exports = [
        Export {
            opts: &b,
            exported: &newer,
            slices: vec![],
            stale: false,
        },
        Export {
            opts: &a,
            exported: &older,
            slices: vec![],
            stale: false,
        },
    ];
    let m = merge(&exports, &BTreeSet::new(), None, &a);
    let (winner, held) = m.labels_held.expect("the winner's labels are over");
    assert_eq!(winner, "remote-a");
    assert_eq!(held.labels, 3001);
    assert!(m.follower.unwrap().labels_held.is_some());
}
