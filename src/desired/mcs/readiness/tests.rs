use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::*;
use crate::desired::addresses::{AddressPolicy, LocalNetworks, admit};
use crate::desired::mcs::change::{Change, import_change};
use crate::desired::mcs::import::{Import, import};
use crate::desired::mcs::judge::ClusterExport;
use crate::desired::mcs::test_support::*;
use crate::desired::mcs::types::ServiceExport;
use crate::desired::not_ready;

/// A slice of `shop/hello` as kube-controller-manager writes it: the Service's two ports, and
/// one endpoint per (address, ready).
fn kcm(name: &str, address_type: &str, endpoints: &[(&str, bool)]) -> EndpointSlice {
    let endpoints: Vec<Value> = endpoints
        .iter()
        .map(|(ip, ready)| {
            json!({"addresses": [ip],
                   "conditions": {"ready": ready, "serving": ready, "terminating": false}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "shop",
                     "labels": {"kubernetes.io/service-name": "hello",
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"}},
        "addressType": address_type,
        "ports": [{"name": "tcp", "port": 42, "protocol": "TCP"},
                  {"name": "udp", "port": 42, "protocol": "UDP"}],
        "endpoints": endpoints,
    }))
    .unwrap()
}

/// One export per (cluster, its slices), each created a second after the one before.
struct Clusters {
    exports: Vec<(String, ServiceExport, Vec<EndpointSlice>)>,
    service: k8s_openapi::api::core::v1::Service,
}

impl Clusters {
    fn new(of: Vec<(&str, Vec<EndpointSlice>)>) -> Self {
        let exports = of
            .into_iter()
            .enumerate()
            .map(|(i, (c, slices))| {
                let at = format!("2024-01-01T00:00:0{i}Z");
                (c.to_string(), export(c, &at), slices)
            })
            .collect();
        Clusters {
            exports,
            service: hello(),
        }
    }

    fn members(&self) -> Vec<ClusterExport<'_>> {
        self.exports
            .iter()
            .map(|(c, e, s)| ClusterExport {
                cluster: c,
                export: e,
                service: Some(&self.service),
                slices: s.iter().collect(),
            })
            .collect()
    }

    /// The desired import (no live ServiceImport yet: its slices are not derived, its counts
    /// are) with these marks.
    fn import(&self, marks: &[(&str, Marks)]) -> Import {
        let mut imp = import("shop", "hello", &self.members(), None, None)
            .unwrap()
            .unwrap();
        let marks: BTreeMap<String, Marks> =
            marks.iter().map(|(c, m)| (c.to_string(), *m)).collect();
        imp.mark_endpoints(&marks);
        imp
    }
}

fn annotation(imp: &Import) -> &str {
    &imp.service_import.metadata.annotations.as_ref().unwrap()[ENDPOINTS_ANNOTATION]
}

const CUT_OFF: Marks = Marks {
    cut_off: true,
    stale: false,
};
const STALE: Marks = Marks {
    cut_off: false,
    stale: true,
};

#[test]
fn each_exporting_cluster_with_its_ready_and_published_endpoints_sorted_by_name() {
    let c = Clusters::new(vec![
        (
            "west",
            vec![kcm(
                "w1",
                "IPv4",
                &[("10.1.0.1", true), ("10.1.0.2", false)],
            )],
        ),
        (
            "east",
            vec![
                kcm("e1", "IPv4", &[("10.2.0.1", true), ("10.2.0.2", true)]),
                kcm("e2", "IPv4", &[("10.2.0.3", true)]),
            ],
        ),
    ]);
    let imp = c.import(&[]);
    assert_eq!(
        annotation(&imp),
        r#"{"east":{"ready":3,"total":3},"west":{"ready":1,"total":2}}"#
    );
    assert!(
        imp.slices.is_empty(),
        "not derived yet, counted all the same"
    );
    let back = read_endpoints(annotation(&imp)).unwrap();
    assert_eq!(back, imp.endpoints);
    assert_eq!(back["west"].ready, 1);
}

#[test]
fn a_cut_off_or_stale_remote_counts_not_ready_and_says_why() {
    // as the pass publishes a marked remote's endpoints: not ready
    let north = kcm("n1", "IPv4", &[("10.3.0.1", true), ("10.3.0.2", true)]);
    let c = Clusters::new(vec![
        ("east", vec![kcm("e1", "IPv4", &[("10.2.0.1", true)])]),
        ("north", vec![not_ready(&north)]),
        ("south", vec![not_ready(&north)]),
    ]);
    let both = Marks {
        cut_off: true,
        stale: true,
    };
    let imp = c.import(&[("north", CUT_OFF), ("south", STALE)]);
    assert_eq!(
        annotation(&imp),
        r#"{"east":{"ready":1,"total":1},"north":{"ready":0,"total":2,"cutOff":true},"south":{"ready":0,"total":2,"stale":true}}"#
    );
    let imp = c.import(&[("north", both)]);
    assert!(
        annotation(&imp).contains(r#""north":{"ready":0,"total":2,"cutOff":true,"stale":true}"#),
        "{}",
        annotation(&imp)
    );
    // a marked cluster that does not export the key gets no entry
    let imp = c.import(&[("gone", CUT_OFF)]);
    assert!(!annotation(&imp).contains("gone"), "{}", annotation(&imp));
    assert!(!annotation(&imp).contains("cutOff"));
}

#[test]
fn the_local_cluster_counts_like_any_exporter() {
    // the wiring passes the local cluster's export as one more member, never marked
    let c = Clusters::new(vec![
        ("west", vec![kcm("w1", "IPv4", &[("10.1.0.1", true)])]),
        ("east", vec![kcm("e1", "IPv4", &[("10.2.0.1", false)])]),
    ]);
    let imp = c.import(&[("east", CUT_OFF)]);
    assert_eq!(
        annotation(&imp),
        r#"{"east":{"ready":0,"total":1,"cutOff":true},"west":{"ready":1,"total":1}}"#
    );
}

#[test]
fn endpoints_the_import_does_not_publish_are_not_counted() {
    // the address policy (as the pass applies it before the import): 192.168.0.9 refused
    let policy = AddressPolicy {
        allowed: vec!["10.2.0.0/16".parse().unwrap()],
        strict: false,
    };
    let listed = kcm(
        "e1",
        "IPv4",
        &[
            ("10.2.0.1", true),
            ("192.168.0.9", true),
            ("10.2.0.2", false),
        ],
    );
    let (admitted, refused) = admit(&listed, &policy, &LocalNetworks::default());
    assert_eq!(refused.total(), 1);
    // FQDN slices: refused whole
    let fqdn = kcm("e2", "FQDN", &[("db.example.com", true)]);
    let (fqdn, _) = admit(&fqdn, &policy, &LocalNetworks::default());
    // a slice whose ports the import does not share: a ClusterSetIP import drops its endpoints
    let mut portless = kcm("e3", "IPv4", &[("10.2.0.7", true)]);
    portless.ports = Some(vec![
        serde_json::from_value(json!({"name": "other", "port": 9, "protocol": "TCP"})).unwrap(),
    ]);
    let c = Clusters::new(vec![(
        "east",
        vec![admitted.into_owned(), fqdn.into_owned(), portless],
    )]);
    let imp = c.import(&[]);
    assert_eq!(annotation(&imp), r#"{"east":{"ready":1,"total":2}}"#);
}

#[test]
fn a_dual_stack_cluster_counts_its_pods_once() {
    let c = Clusters::new(vec![(
        "east",
        vec![
            kcm("e4", "IPv4", &[("10.2.0.1", true), ("10.2.0.2", false)]),
            kcm("e6", "IPv6", &[("fd00::1", true), ("fd00::2", false)]),
        ],
    )]);
    assert_eq!(
        annotation(&c.import(&[])),
        r#"{"east":{"ready":1,"total":2}}"#
    );
}

#[test]
fn a_cluster_without_endpoints_is_zero_and_no_export_is_no_import() {
    let c = Clusters::new(vec![
        ("east", vec![]),
        ("west", vec![kcm("w", "IPv4", &[])]),
    ]);
    assert_eq!(
        annotation(&c.import(&[])),
        r#"{"east":{"ready":0,"total":0},"west":{"ready":0,"total":0}}"#
    );
    assert_eq!(import("shop", "hello", &[], None, None).unwrap(), None);
    assert_eq!(endpoints_value(&EndpointCounts::new()), "{}");
}

#[test]
fn only_a_change_of_what_it_counts_is_a_write() {
    let ready = Clusters::new(vec![(
        "east",
        vec![kcm("e1", "IPv4", &[("10.2.0.1", true), ("10.2.0.2", true)])],
    )]);
    let first = ready.import(&[]);
    let mut live = first.service_import.clone();
    live.metadata.uid = Some("si-uid".into());
    live.metadata.resource_version = Some("7".into());
    // steady: the same counts, however often asked
    assert_eq!(
        import_change(Some(&live), &ready.import(&[]).service_import),
        Change::Unchanged
    );
    // a readiness transition
    let one_down = Clusters::new(vec![(
        "east",
        vec![kcm(
            "e1",
            "IPv4",
            &[("10.2.0.1", true), ("10.2.0.2", false)],
        )],
    )]);
    let Change::Update(updated) = import_change(Some(&live), &one_down.import(&[]).service_import)
    else {
        panic!("a readiness transition is a write");
    };
    let a = updated.metadata.annotations.as_ref().unwrap();
    assert_eq!(a[ENDPOINTS_ANNOTATION], r#"{"east":{"ready":1,"total":2}}"#);
    assert_eq!(updated.metadata.resource_version.as_deref(), Some("7"));
    // a cut-off
    let cut = ready.import(&[("east", CUT_OFF)]);
    assert!(matches!(
        import_change(Some(&live), &cut.service_import),
        Change::Update(_)
    ));
}

#[test]
fn an_export_cannot_set_the_annotation() {
    let mut c = Clusters::new(vec![(
        "east",
        vec![kcm("e1", "IPv4", &[("10.2.0.1", true)])],
    )]);
    c.exports[0].1.spec.exported_annotations.insert(
        ENDPOINTS_ANNOTATION.into(),
        r#"{"east":{"ready":9,"total":9}}"#.into(),
    );
    let imp = c.import(&[]);
    assert_eq!(annotation(&imp), r#"{"east":{"ready":1,"total":1}}"#);
    assert_eq!(imp.dropped, [format!("annotation {ENDPOINTS_ANNOTATION}")]);
}

#[test]
fn an_edited_annotation_is_an_error_not_a_panic() {
    for bad in [
        "",
        "nope",
        r#"{"east":{"ready":"2","total":2}}"#,
        r#"{"east":{"ready":2}}"#,
        "[1]",
    ] {
        assert!(read_endpoints(bad).is_err(), "{bad}");
    }
    // a field a later version adds is read past
    let later = read_endpoints(r#"{"east":{"ready":1,"total":2,"draining":true}}"#).unwrap();
    assert_eq!((later["east"].ready, later["east"].total), (1, 2));
}
