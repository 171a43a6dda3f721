//! End to end, at the edges: remote objects at the limits of what the API server accepts, a
//! leader in `kube-system` and one shadowed by a local non-follower there, and the security
//! claims that need a real binary (TLS verification on by default, no credential in a `trace`
//! log). The real daemon, real API servers; every case records one row of the reliability report.
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};
use support::daemon::{Daemon, args_for, with_args, with_flag};
use support::fault::{Lost, Report, conclude, snapshot};
use support::metrics::VERBS;
use support::{
    KEY, LOCAL, REMOTE, bed, client, endpoint, eventually, exported_with, namespace, namespace_in,
    obj, present, remote_slice_with,
};

const MANAGED_BY: &str = "cross-cluster-controller.fair.com";
const WAIT: Duration = Duration::from_secs(30);
const SWEEP_DONE: [(&str, &str); 2] = [("remote", REMOTE), ("outcome", "done")];
const SWEEP_ABORTED: [(&str, &str); 2] = [("remote", REMOTE), ("outcome", "aborted")];

/// A leader with labels and annotations of its own (edge inputs), on the one leader shape.
fn edge_leader(name: &str, labels: Value, annotations: Value, spec: Value) -> Service {
    let mut s = exported_with(name, spec);
    let all = s.metadata.labels.get_or_insert_default();
    for (k, v) in labels.as_object().expect("labels: an object") {
        all.insert(k.clone(), v.as_str().expect("a label value").to_string());
    }
    s.metadata.annotations = Some(obj(annotations));
    s
}

/// A remote slice whose endpoints also name a remote node and pod (nodeName, targetRef: what
/// the follower must not copy), on the one remote slice shape.
fn edge_slice(
    svc: &str,
    name: &str,
    address_type: &str,
    ports: Value,
    addrs: &[&str],
) -> EndpointSlice {
    let eps: Vec<Value> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mut e = endpoint(a);
            e["nodeName"] = json!("remote-node");
            e["targetRef"] = json!({"kind": "Pod", "name": format!("{svc}-{i}"), "namespace": "x"});
            e
        })
        .collect();
    remote_slice_with(svc, name, address_type, ports, eps)
}

/// (name, port, protocol, targetPort, appProtocol) of a Service's ports, sorted.
fn service_ports(s: &Service) -> Vec<(String, i32, String, String, Option<String>)> {
    let mut v: Vec<_> = s
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|p| {
            let target = match p.target_port {
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                    n.to_string()
                }
                Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => s,
                None => String::new(),
            };
            (
                p.name.unwrap_or_default(),
                p.port,
                p.protocol.unwrap_or_default(),
                target,
                p.app_protocol,
            )
        })
        .collect();
    v.sort();
    v
}

/// addressType -> (ports (name, port, protocol) sorted, addresses sorted), over all given slices.
type SliceSummary = BTreeMap<(String, Vec<(String, i32, String)>), Vec<String>>;

fn slice_summary<'a>(slices: impl IntoIterator<Item = &'a EndpointSlice>) -> SliceSummary {
    let mut out = SliceSummary::new();
    for s in slices {
        let mut ports: Vec<_> = s
            .ports
            .iter()
            .flatten()
            .map(|p| {
                (
                    p.name.clone().unwrap_or_default(),
                    p.port.unwrap_or(0),
                    p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                )
            })
            .collect();
        ports.sort();
        let addrs = out.entry((s.address_type.clone(), ports)).or_default();
        addrs.extend(s.endpoints.iter().flat_map(|e| e.addresses.clone()));
        addrs.sort();
    }
    out
}

/// Our follower slices of one Service in the local cluster.
async fn local_slices(api: &Api<EndpointSlice>, svc: &str) -> Result<Vec<EndpointSlice>, String> {
    let lp = ListParams::default().labels(&format!(
        "kubernetes.io/service-name={svc},endpointslice.kubernetes.io/managed-by={MANAGED_BY}"
    ));
    Ok(api.list(&lp).await.map_err(|e| e.to_string())?.items)
}

/// Ok once the local follower of `leader` carries the leader's ports and the remote endpoints
/// (address type, ports and addresses), with our labels and ownerReferences.
async fn mirrored(
    local_svc: &Api<Service>,
    local_sl: &Api<EndpointSlice>,
    leader: &Service,
    remote: &[&EndpointSlice],
) -> Result<(), String> {
    let name = leader.name_any();
    let f = present(local_svc, &name).await?;
    if f.labels().get(KEY).map(String::as_str) != Some("follower") {
        return Err(format!("{name}: not labelled as a follower"));
    }
    if f.spec.as_ref().and_then(|s| s.selector.as_ref()).is_some() {
        return Err(format!("{name}: the follower has a selector"));
    }
    if service_ports(&f) != service_ports(leader) {
        return Err(format!(
            "{name}: ports {:?} != {:?}",
            service_ports(&f),
            service_ports(leader)
        ));
    }
    let slices = local_slices(local_sl, &name).await?;
    let (got, want) = (
        slice_summary(&slices),
        slice_summary(remote.iter().copied()),
    );
    if got != want {
        return Err(format!("{name}: slices {got:?} != {want:?}"));
    }
    for s in &slices {
        let n = s.name_any();
        if !n.starts_with(&name) || n.len() > 253 {
            return Err(format!("{name}: slice name {n}"));
        }
        if s.owner_references().first().map(|o| &o.uid) != f.uid().as_ref() {
            return Err(format!("{name}: slice {n} not owned by the follower"));
        }
    }
    Ok(())
}

fn event_api(c: &Client, ns: &str) -> Api<Event> {
    Api::namespaced(c.clone(), ns)
}

/// Ok with the note of the first events.k8s.io Event with this reason about (kind, name).
async fn event_about(
    api: &Api<Event>,
    reason: &str,
    kind: &str,
    name: &str,
) -> Result<String, String> {
    let list = api
        .list(&ListParams::default())
        .await
        .map_err(|e| e.to_string())?;
    list.items
        .iter()
        .find(|ev| {
            let r = ev.regarding.as_ref();
            ev.reason.as_deref() == Some(reason)
                && r.and_then(|r| r.kind.as_deref()) == Some(kind)
                && r.and_then(|r| r.name.as_deref()) == Some(name)
        })
        .map(|ev| ev.note.clone().unwrap_or_default())
        .ok_or_else(|| {
            format!(
                "no {reason} Event on {kind} {name} among {}",
                list.items.len()
            )
        })
}

async fn decoys(c: &Client, ns: &str, service: &str, config_map: &str) {
    // selectorless: no controller of the bed writes Endpoints or slices for it
    let svc: Service = obj(
        json!({"metadata": {"name": service, "labels": {"owner": "local-team"}},
        "spec": {"ports": [{"name": "pg", "port": 5432}]}}),
    );
    Api::<Service>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create the decoy Service");
    let cm: ConfigMap = obj(json!({"metadata": {"name": config_map}, "data": {"k": "v"}}));
    Api::<ConfigMap>::namespaced(c.clone(), ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create the decoy ConfigMap");
}

/// Runs an async clean-up from Drop (which cannot await), on a thread with its own runtime.
fn block_on_thread<F>(f: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(f);
        }
    })
    .join();
}

/// A namespace made in the local cluster during a test, deleted when dropped.
struct LocalNamespace(String);

impl Drop for LocalNamespace {
    fn drop(&mut self) {
        let name = self.0.clone();
        block_on_thread(async move {
            let api: Api<Namespace> = Api::all(client(LOCAL).await);
            let _ = api.delete(&name, &DeleteParams::background()).await;
        });
    }
}

#[tokio::test]
async fn remote_objects_at_the_edges_of_validity_are_mirrored_or_skipped_visibly() {
    let ns = namespace("edge-objects").await;
    // a leader whose namespace exists only in the remote cluster: the one input of this test the
    // daemon cannot mirror (see the note below on LabelsInvalid and AnnotationsTooLarge)
    let elsewhere = namespace_in("edge-objects-remote-only", &[REMOTE]).await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let remote_svc: Api<Service> = Api::namespaced(r.clone(), &ns.name);
    let remote_sl: Api<EndpointSlice> = Api::namespaced(r.clone(), &ns.name);
    let local_svc: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let local_sl: Api<EndpointSlice> = Api::namespaced(l.clone(), &ns.name);

    decoys(&l, &ns.name, "decoy", "decoy").await;
    let before = snapshot(&l, &[&ns.name]).await;

    let mut args = args_for(&ns.name);
    args.extend(
        [
            "--watch-namespace",
            &elsewhere.name,
            "--sweep-schedule",
            "*/2 * * * * *",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;

    // --- the inputs -------------------------------------------------------------------------
    // 63 characters: the longest Service name; labels at their limits (253-character prefix,
    // 63-character name and value), and the label keys our slices set for themselves
    let long_name = format!("edge-{}", "x".repeat(58));
    assert_eq!(long_name.len(), 63);
    let prefix = format!(
        "{}.{}.{}.{}",
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61)
    );
    assert_eq!(prefix.len(), 253);
    let long_label = format!("{prefix}/{}", "n".repeat(63));
    let long = edge_leader(
        &long_name,
        json!({&long_label: "v".repeat(63), "kubernetes.io/service-name": "spoofed",
               "endpointslice.kubernetes.io/managed-by": "someone-else"}),
        json!({}),
        json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}),
    );
    let long_slice = edge_slice(
        &long_name,
        &format!("{long_name}-abcde"),
        "IPv4",
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
        &["10.31.0.1", "10.31.0.2"],
    );
    // 100 named ports (the most an EndpointSlice may hold), some UDP, some with appProtocol
    let svc_ports: Vec<Value> = (0..100)
        .map(|i| {
            let proto = if i % 10 == 9 { "UDP" } else { "TCP" };
            let mut p = json!({"name": format!("p{i}"), "port": 1000 + i, "targetPort": 2000 + i, "protocol": proto});
            if i % 10 == 3 {
                p["appProtocol"] = json!("kubernetes.io/h2c");
            }
            p
        })
        .collect();
    let slice_ports: Vec<Value> = (0..100)
        .map(|i| {
            let proto = if i % 10 == 9 { "UDP" } else { "TCP" };
            json!({"name": format!("p{i}"), "port": 2000 + i, "protocol": proto})
        })
        .collect();
    let many = edge_leader(
        "many-ports",
        json!({}),
        json!({}),
        json!({"ports": svc_ports}),
    );
    let many_slice = edge_slice(
        "many-ports",
        "many-ports-abcde",
        "IPv4",
        json!(slice_ports),
        &["10.32.0.1", "10.32.0.2", "10.32.0.3"],
    );
    // one unnamed port (allowed only when it is the only one)
    let unnamed = edge_leader(
        "unnamed-port",
        json!({}),
        json!({}),
        json!({"ports": [{"port": 5353, "protocol": "UDP"}]}),
    );
    let unnamed_slice = edge_slice(
        "unnamed-port",
        "unnamed-port-abcde",
        "IPv4",
        json!([{"port": 5353, "protocol": "UDP"}]),
        &["10.33.0.1"],
    );
    let http = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    let http_slice_ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    // FQDN endpoints: refused (issue 27: a remote may not make a local name resolve to a host of
    // its choice); the follower is mirrored without them
    let fqdn = edge_leader("fqdn", json!({}), json!({}), http.clone());
    let fqdn_slice = edge_slice(
        "fqdn",
        "fqdn-abcde",
        "FQDN",
        http_slice_ports.clone(),
        &["db-0.example.com", "db-1.example.com"],
    );
    // IPv6 endpoints in an IPv4 cluster: the API server accepts an IPv6 slice whatever the
    // cluster's families, and src/desired keeps the address type, so the follower gets an IPv6
    // slice (kube-proxy of an IPv4-only cluster ignores it, as it would the remote one)
    let v6 = edge_leader("ipv6", json!({}), json!({}), http.clone());
    let v6_slice = edge_slice(
        "ipv6",
        "ipv6-abcde",
        "IPv6",
        http_slice_ports.clone(),
        &["fd00:10::1", "fd00:10::2"],
    );
    // annotations of 255 KiB: within the limit on the remote; our annotations would overflow it
    // if the remote ones were copied, but src/desired does not copy remote annotations (only the
    // origin ones are set), so this leader is mirrored like any other
    let blob_key = "edge.test/blob";
    let blob = "b".repeat(255 * 1024 - blob_key.len());
    let big = edge_leader(
        "big-annotations",
        json!({}),
        json!({blob_key: blob}),
        http.clone(),
    );
    let big_slice = edge_slice(
        "big-annotations",
        "big-annotations-abcde",
        "IPv4",
        http_slice_ports.clone(),
        &["10.34.0.1"],
    );
    // the input that cannot be mirrored: its namespace is missing locally
    let missing = edge_leader("missing-namespace", json!({}), json!({}), http.clone());

    let t0 = Instant::now();
    let pp = PostParams::default();
    let mut leaders = Vec::new();
    for svc in [&long, &many, &unnamed, &fqdn, &v6, &big] {
        leaders.push(remote_svc.create(&pp, svc).await.expect("remote leader"));
    }
    let mut slices = Vec::new();
    for s in [
        &long_slice,
        &many_slice,
        &unnamed_slice,
        &fqdn_slice,
        &v6_slice,
        &big_slice,
    ] {
        slices.push(remote_sl.create(&pp, s).await.expect("remote slice"));
    }
    Api::<Service>::namespaced(r.clone(), &elsewhere.name)
        .create(&pp, &missing)
        .await
        .expect("remote leader in the remote-only namespace");

    // --- everything valid converges, ports and addresses included -------------------------
    let local_events = event_api(&l, &ns.name);
    eventually(
        "every valid input mirrored, and the skip reported",
        WAIT,
        || async {
            for (leader, slice) in leaders.iter().zip(&slices) {
                let expected: &[&EndpointSlice] = if slice.address_type == "FQDN" {
                    &[]
                } else {
                    &[slice]
                };
                mirrored(&local_svc, &local_sl, leader, expected).await?;
            }
            // the skip: a log line, a metric and an Event (on the Lease: there is no local object)
            let logs = d.logs();
            if !logs.lines().any(|line| {
                line.contains("skipped")
                    && line.contains("NamespaceMissing")
                    && line.contains("missing-namespace")
            }) {
                return Err("no skip log line yet".into());
            }
            let n = d.metric(
                "xcc_skipped_total",
                &[("remote", REMOTE), ("reason", "NamespaceMissing")],
            );
            if n < 1.0 {
                return Err(format!("xcc_skipped_total NamespaceMissing = {n}"));
            }
            event_about(
                &local_events,
                "NamespaceMissing",
                "Lease",
                "cross-cluster-controller",
            )
            .await?;
            Ok(())
        },
    )
    .await;
    let took = t0.elapsed();

    // what was mirrored, beyond ports and addresses
    let f = local_svc.get(&long_name).await.unwrap();
    assert_eq!(
        f.labels().get(&long_label),
        Some(&"v".repeat(63)),
        "a label at its limits is copied"
    );
    for s in local_slices(&local_sl, &long_name).await.unwrap() {
        let labels = s.labels();
        assert_eq!(
            labels.get("kubernetes.io/service-name"),
            Some(&long_name),
            "ours, not the copied one"
        );
        assert_eq!(
            labels
                .get("endpointslice.kubernetes.io/managed-by")
                .map(String::as_str),
            Some(MANAGED_BY)
        );
        assert_eq!(
            labels.get(&long_label),
            None,
            "the leader's labels go on the follower Service alone (issue 37)"
        );
    }
    let f = local_svc.get("big-annotations").await.unwrap();
    let keys: BTreeSet<&str> = f.annotations().keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "fair.com/cross-cluster-copied-labels",
            "fair.com/cross-cluster-origin-cluster",
            "fair.com/cross-cluster-origin-cluster-id",
            "fair.com/cross-cluster-origin-clusters",
            "fair.com/cross-cluster-origin-object",
            "fair.com/cross-cluster-origin-uid"
        ]),
        "remote annotations are not copied (ours only)"
    );
    let f = local_svc.get("unnamed-port").await.unwrap();
    let ports = f.spec.unwrap().ports.unwrap();
    assert_eq!(
        (ports.len(), ports[0].name.as_deref().unwrap_or("")),
        (1, "")
    );
    let types: Vec<String> = local_slices(&local_sl, "ipv6")
        .await
        .unwrap()
        .iter()
        .map(|s| s.address_type.clone())
        .collect();
    assert_eq!(types, vec!["IPv6".to_string()], "ipv6");
    assert!(
        local_slices(&local_sl, "fqdn").await.unwrap().is_empty(),
        "FQDN endpoints are refused"
    );
    assert!(
        d.metric(
            "xcc_addresses_refused_total",
            &[("remote", REMOTE), ("reason", "Fqdn")]
        ) >= 2.0,
        "both FQDN endpoints counted as refused"
    );
    for reason in ["LabelsInvalid", "AnnotationsInvalid", "AnnotationsTooLarge"] {
        assert_eq!(
            d.metric(
                "xcc_skipped_total",
                &[("remote", REMOTE), ("reason", reason)]
            ),
            0.0,
            "{reason}"
        );
    }
    let skipped = d.metric(
        "xcc_skipped_total",
        &[("remote", REMOTE), ("reason", "NamespaceMissing")],
    );
    let skip_note = event_about(
        &local_events,
        "NamespaceMissing",
        "Lease",
        "cross-cluster-controller",
    )
    .await
    .unwrap();
    assert!(
        skip_note.contains("missing-namespace"),
        "the Event names the leader: {skip_note}"
    );

    // --- steady state: sweeps come and go, nothing is rewritten or lost ---------------------
    let mid = snapshot(&l, &[&ns.name]).await;
    let writes = d.follower_writes(&VERBS);
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;
    assert_eq!(
        d.follower_writes(&VERBS),
        writes,
        "no write once converged (no edge input makes a follower flap)"
    );

    // --- the skipped leader is mirrored as soon as its namespace appears ---------------------
    let _made = LocalNamespace(elsewhere.name.clone());
    Api::<Namespace>::all(l.clone())
        .create(
            &pp,
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(elsewhere.name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let t1 = Instant::now();
    let elsewhere_local: Api<Service> = Api::namespaced(l.clone(), &elsewhere.name);
    eventually(
        "the skipped leader, once its namespace exists",
        WAIT,
        || present(&elsewhere_local, "missing-namespace"),
    )
    .await;
    let released = t1.elapsed();

    let after = snapshot(&l, &[&ns.name]).await;
    let alive: BTreeSet<String> = leaders.iter().map(|s| s.name_any()).collect();
    let lost = Lost::since(&mid, &after, &alive);
    let touched = before.non_followers_touched(&after);
    assert_eq!(
        after.followers(),
        alive,
        "every valid leader has its follower"
    );
    conclude(
        Report {
            id: "61-edge-objects",
            scenario: "Remote objects at the edges of validity: 63-character name with labels at their limits, 100 named ports, one unnamed UDP port, an FQDN and an IPv6 EndpointSlice, 255 KiB of annotations, and a leader whose namespace is missing locally",
            done: "7 leaders created at once in the remote cluster under a running daemon; then the missing namespace created locally",
            converge: Some(took),
            note: format!(
                "6 mirrored (IPv6 slices keep their address type, FQDN endpoints are refused; remote annotations are not copied, so 255 KiB cannot overflow ours); {skipped} skipped with reason NamespaceMissing (log line, Event on the Lease, xcc_skipped_total), mirrored {:.1} s after the namespace appeared; 0 writes over 2 further sweeps; LabelsInvalid and AnnotationsTooLarge cannot be reached from a valid remote object (labels are copied as the remote API server accepted them, plus ours)",
                released.as_secs_f64()
            ),
        },
        &lost,
        &touched,
    );
}

/// Objects this test makes in the shared `kube-system` namespaces, deleted when dropped (after
/// the daemon, which is declared later and so dropped first): remote leaders and slices, local
/// decoys, whatever follower is left, and the Events about them.
struct KubeSystemObjects {
    remote: Vec<String>,
    local: Vec<String>,
}

impl Drop for KubeSystemObjects {
    fn drop(&mut self) {
        let (remote, local) = (self.remote.clone(), self.local.clone());
        block_on_thread(async move {
            let dp = DeleteParams::default();
            let r = client(REMOTE).await;
            let l = client(LOCAL).await;
            for name in &remote {
                let _ = Api::<Service>::namespaced(r.clone(), "kube-system")
                    .delete(name, &dp)
                    .await;
                let _ = Api::<EndpointSlice>::namespaced(r.clone(), "kube-system")
                    .delete(&format!("{name}-abcde"), &dp)
                    .await;
            }
            for name in &local {
                let _ = Api::<Service>::namespaced(l.clone(), "kube-system")
                    .delete(name, &dp)
                    .await;
                let _ = Api::<ConfigMap>::namespaced(l.clone(), "kube-system")
                    .delete(name, &dp)
                    .await;
                let slices: Api<EndpointSlice> = Api::namespaced(l.clone(), "kube-system");
                let lp = ListParams::default().labels(&format!(
                    "kubernetes.io/service-name={name},endpointslice.kubernetes.io/managed-by={MANAGED_BY}"
                ));
                if let Ok(list) = slices.list(&lp).await {
                    for s in list.items {
                        let _ = slices.delete(&s.name_any(), &dp).await;
                    }
                }
            }
            let events = event_api(&l, "kube-system");
            if let Ok(list) = events.list(&ListParams::default()).await {
                for ev in list.items {
                    let about = ev
                        .regarding
                        .as_ref()
                        .and_then(|r| r.name.clone())
                        .unwrap_or_default();
                    if local.contains(&about) {
                        let _ = events.delete(&ev.name_any(), &dp).await;
                    }
                }
            }
        });
    }
}

#[tokio::test]
async fn a_leader_in_kube_system_is_mirrored_and_a_local_kube_system_service_of_its_name_is_left_alone()
 {
    // the daemon's own Lease goes into a namespace of the test (local only)
    let lease_ns = namespace_in("edge-kube-system", &[LOCAL]).await;
    let suffix = &lease_ns.name[lease_ns.name.len() - 8..];
    let mirrored_name = format!("xcc-edge-{suffix}");
    let shadowed = format!("xcc-dup-{suffix}");
    let config_map = format!("xcc-decoy-{suffix}");
    let _cleanup = KubeSystemObjects {
        remote: vec![mirrored_name.clone(), shadowed.clone()],
        local: vec![mirrored_name.clone(), shadowed.clone(), config_map.clone()],
    };
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    let remote_svc: Api<Service> = Api::namespaced(r.clone(), "kube-system");
    let remote_sl: Api<EndpointSlice> = Api::namespaced(r.clone(), "kube-system");
    let local_svc: Api<Service> = Api::namespaced(l.clone(), "kube-system");
    let local_sl: Api<EndpointSlice> = Api::namespaced(l.clone(), "kube-system");

    // a plain local Service named like a remote leader, and a ConfigMap
    decoys(&l, "kube-system", &shadowed, &config_map).await;
    let mine = local_svc.get(&shadowed).await.unwrap();
    let before = snapshot(&l, &["kube-system"]).await;

    // the Lease in a namespace of its own; the mirrored namespace is kube-system
    let args = with_args(
        with_flag(args_for(&lease_ns.name), "--watch-namespace", "kube-system"),
        &["--sweep-schedule", "*/2 * * * * *"],
    );
    let d = Daemon::start(&args).await;
    d.wait_synced(&[REMOTE]).await;

    let http = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    let ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let pp = PostParams::default();
    let t0 = Instant::now();
    let leader_a = remote_svc
        .create(
            &pp,
            &edge_leader(&mirrored_name, json!({}), json!({}), http.clone()),
        )
        .await
        .unwrap();
    let slice_a = remote_sl
        .create(
            &pp,
            &edge_slice(
                &mirrored_name,
                &format!("{mirrored_name}-abcde"),
                "IPv4",
                ports.clone(),
                &["10.41.0.1", "10.41.0.2"],
            ),
        )
        .await
        .unwrap();
    remote_svc
        .create(
            &pp,
            &edge_leader(&shadowed, json!({}), json!({}), http.clone()),
        )
        .await
        .unwrap();
    remote_sl
        .create(
            &pp,
            &edge_slice(
                &shadowed,
                &format!("{shadowed}-abcde"),
                "IPv4",
                ports,
                &["10.41.1.1"],
            ),
        )
        .await
        .unwrap();

    let events = event_api(&l, "kube-system");
    eventually(
        "the kube-system leader mirrored and the shadowed one reported",
        WAIT,
        || async {
            mirrored(&local_svc, &local_sl, &leader_a, &[&slice_a]).await?;
            let n = d.metric(
                "xcc_conflicts_total",
                &[("remote", REMOTE), ("kind", "Service")],
            );
            if n < 1.0 {
                return Err(format!("xcc_conflicts_total = {n}"));
            }
            if !d
                .logs()
                .lines()
                .any(|line| line.contains("not our follower") && line.contains(&shadowed))
            {
                return Err("no conflict log line yet".into());
            }
            event_about(&events, "NotOurFollower", "Service", &shadowed).await?;
            Ok(())
        },
    )
    .await;
    let took = t0.elapsed();

    let mid = snapshot(&l, &["kube-system"]).await;
    let done = d.metric("xcc_sweeps_total", &SWEEP_DONE);
    d.wait_metric("xcc_sweeps_total", &SWEEP_DONE, done + 2.0)
        .await;
    let after = snapshot(&l, &["kube-system"]).await;

    let now = local_svc.get(&shadowed).await.unwrap();
    assert_eq!(
        serde_json::to_value(&mine).unwrap(),
        serde_json::to_value(&now).unwrap(),
        "the local non-follower is byte-for-byte unchanged"
    );
    assert_eq!(now.resource_version(), mine.resource_version());
    assert!(
        local_slices(&local_sl, &shadowed).await.unwrap().is_empty(),
        "no slices written for the shadowed leader"
    );
    let lost = Lost::since(&mid, &after, &BTreeSet::from([mirrored_name.clone()]));
    let touched = before.non_followers_touched(&after);
    let conflicts = d.metric(
        "xcc_conflicts_total",
        &[("remote", REMOTE), ("kind", "Service")],
    );
    conclude(
        Report {
            id: "62-edge-kube-system",
            scenario: "A remote leader in kube-system, and a remote leader whose name equals a local non-follower Service in kube-system",
            done: "a daemon with --watch-namespace kube-system (Lease in its own namespace); two leaders created in the remote kube-system, a plain local Service of the second one's name made first",
            converge: Some(took),
            note: format!(
                "mirrored into the local kube-system like any other; the shadowed one: {conflicts} conflict(s) counted, NotOurFollower Event on the local Service, resourceVersion unchanged over 2 further sweeps"
            ),
        },
        &lost,
        &touched,
    );
}

/// A log line without its colour escapes.
fn plain(line: &str) -> String {
    let mut out = String::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // ESC [ ... letter
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The bed's kubeconfig as YAML.
async fn bed_kubeconfig() -> serde_yaml::Value {
    serde_yaml::from_str(
        &std::fs::read_to_string(&bed().await.kubeconfig).expect("read kubeconfig"),
    )
    .expect("kubeconfig is YAML")
}

fn cluster_entry<'a>(kc: &'a mut serde_yaml::Value, name: &str) -> &'a mut serde_yaml::Value {
    kc["clusters"]
        .as_sequence_mut()
        .and_then(|cs| cs.iter_mut().find(|c| c["name"] == name))
        .map(|c| &mut c["cluster"])
        .unwrap_or_else(|| panic!("no cluster {name} in the bed's kubeconfig"))
}

#[tokio::test]
async fn tls_is_verified_a_remote_presenting_a_certificate_of_another_ca_is_refused() {
    let ns = namespace("security-tls").await;
    let l = client(LOCAL).await;
    decoys(&l, &ns.name, "decoy", "decoy").await;
    Api::<Service>::namespaced(client(REMOTE).await, &ns.name)
        .create(
            &PostParams::default(),
            &edge_leader(
                "web",
                json!({}),
                json!({}),
                json!({"ports": [{"port": 80}]}),
            ),
        )
        .await
        .unwrap();
    let before = snapshot(&l, &[&ns.name]).await;

    // the remote kubeconfig names east's server but trusts west's CA
    let mut kc = bed_kubeconfig().await;
    let west_ca = cluster_entry(&mut kc, LOCAL)["certificate-authority-data"].clone();
    cluster_entry(&mut kc, REMOTE)["certificate-authority-data"] = west_ca;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wrong-ca.kubeconfig");
    std::fs::write(&path, serde_yaml::to_string(&kc).unwrap()).unwrap();

    let mut args = args_for(&ns.name);
    args.extend(
        [
            "--kubeconfig",
            &path.to_string_lossy(),
            "--sweep-schedule",
            "*/2 * * * * *",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    let t0 = Instant::now();
    let d = Daemon::start(&args).await;
    let why = eventually(
        "/readyz to refuse with a certificate error",
        WAIT,
        || async {
            if let Some(status) = d.exited() {
                return Err(format!("daemon exited ({status}):\n{}", d.logs()));
            }
            let (code, body) = d.readyz()?;
            if code == 503
                && body.contains("remote east")
                && body.to_lowercase().contains("certificate")
            {
                Ok(body)
            } else {
                Err(format!("{code} {body}"))
            }
        },
    )
    .await;
    let detected = t0.elapsed();
    // it leads (it could write) and has tried and aborted sweeps: still nothing written
    eventually("the daemon to lead", WAIT, || async {
        match d.gauge("xcc_leader", &[]) {
            Some(1.0) => Ok(()),
            other => Err(format!("xcc_leader {other:?}")),
        }
    })
    .await;
    let aborted = d.metric("xcc_sweeps_total", &SWEEP_ABORTED);
    d.wait_metric("xcc_sweeps_total", &SWEEP_ABORTED, aborted + 2.0)
        .await;

    let logs = d.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("watch failed") && l.to_lowercase().contains("certificate"))
        .map(plain)
        .unwrap_or_else(|| panic!("no certificate error in the log:\n{logs}"));
    let line = line
        .find("watch failed")
        .map_or(line.as_str(), |at| &line[at..])
        .to_string();
    assert!(
        d.exited().is_none(),
        "the daemon keeps running (and retrying)"
    );
    assert!(
        !logs.contains("caches synced"),
        "nothing was ever listed from the remote"
    );
    assert_eq!(d.follower_writes(&VERBS), 0.0, "nothing was written");
    assert_eq!(d.gauge("xcc_remote_up", &[("remote", REMOTE)]), Some(0.0));
    let local: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    assert!(local.get_opt("web").await.unwrap().is_none(), "no follower");
    let after = snapshot(&l, &[&ns.name]).await;
    assert!(after.followers().is_empty());
    let touched = before.non_followers_touched(&after);
    let reason = why.lines().next().unwrap_or_default().to_string();
    conclude(
        Report {
            id: "70-security-tls",
            scenario: "Remote kubeconfig whose CA is another cluster's (west's CA for east's server): TLS verification on by default",
            done: "daemon started with that kubeconfig as its remote; a leader waiting in the remote namespace",
            converge: None,
            note: format!(
                "refused in {:.1} s: /readyz 503 \"{}\"; log: {}; 0 writes, no follower, 2+ sweeps aborted",
                detected.as_secs_f64(),
                reason.chars().take(200).collect::<String>(),
                line.chars().take(300).collect::<String>()
            ),
        },
        &Lost::nothing_to_lose(),
        &touched,
    );
}

/// The base64 body of a PEM block and its DER bytes in hex.
fn pem_forms(pem: &str) -> (String, String) {
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = B64.decode(&body).expect("PEM body");
    (body, hex::encode(der))
}

/// Pieces of a credential that must never be logged, each with what it is: 40-character windows
/// (every 20 characters) of its base64 form, of its PEM body lines, and of its DER bytes in hex
/// (how a `{:?}` of the raw bytes prints them).
fn secret_pieces(what: &str, b64: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut windows = |form: &str, s: &str| {
        let mut at = 0;
        while at + 40 <= s.len() {
            out.push((
                format!("{what} ({form} at {at})"),
                s[at..at + 40].to_string(),
            ));
            at += 20;
        }
    };
    windows("base64", b64);
    let pem = String::from_utf8(B64.decode(b64).expect("base64 credential")).expect("PEM text");
    assert!(pem.contains("BEGIN"), "a PEM credential");
    for (i, line) in pem.lines().filter(|l| !l.starts_with("-----")).enumerate() {
        windows(&format!("PEM line {i}"), line);
    }
    windows("DER hex", &pem_forms(&pem).1);
    out
}

#[tokio::test]
async fn at_trace_level_the_log_holds_no_part_of_the_client_certificate_or_key() {
    let ns = namespace("security-logs").await;
    let (r, l) = (client(REMOTE).await, client(LOCAL).await);
    decoys(&l, &ns.name, "decoy", "decoy").await;
    let before = snapshot(&l, &[&ns.name]).await;
    let remote_svc: Api<Service> = Api::namespaced(r.clone(), &ns.name);
    let remote_sl: Api<EndpointSlice> = Api::namespaced(r.clone(), &ns.name);
    let local_svc: Api<Service> = Api::namespaced(l.clone(), &ns.name);
    let local_sl: Api<EndpointSlice> = Api::namespaced(l.clone(), &ns.name);

    // the bed's admin kubeconfig: client certificate and key for both clusters
    let d = Daemon::start_with_env(&args_for(&ns.name), &[("RUST_LOG", "trace")]).await;
    d.wait_synced(&[REMOTE]).await;
    let http = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    let ports = json!([{"name": "http", "port": 8080, "protocol": "TCP"}]);
    let pp = PostParams::default();
    let t0 = Instant::now();
    let web = remote_svc
        .create(&pp, &edge_leader("web", json!({}), json!({}), http))
        .await
        .unwrap();
    let slice = remote_sl
        .create(
            &pp,
            &edge_slice("web", "web-abcde", "IPv4", ports.clone(), &["10.51.0.1"]),
        )
        .await
        .unwrap();
    eventually("the follower", WAIT, || async {
        mirrored(&local_svc, &local_sl, &web, &[&slice]).await
    })
    .await;
    let mid = snapshot(&l, &[&ns.name]).await;
    // a change, mirrored
    let mut changed = remote_sl.get("web-abcde").await.unwrap();
    changed.endpoints = edge_slice(
        "web",
        "web-abcde",
        "IPv4",
        ports,
        &["10.51.0.2", "10.51.0.3"],
    )
    .endpoints;
    let changed = remote_sl.replace("web-abcde", &pp, &changed).await.unwrap();
    eventually("the change mirrored", WAIT, || async {
        mirrored(&local_svc, &local_sl, &web, &[&changed]).await
    })
    .await;
    let took = t0.elapsed();

    let kc = bed_kubeconfig().await;
    let mut pieces = Vec::new();
    for user in kc["users"].as_sequence().expect("users") {
        let name = user["name"].as_str().unwrap_or_default();
        if name != format!("{REMOTE}-admin") && name != format!("{LOCAL}-admin") {
            continue;
        }
        for field in ["client-certificate-data", "client-key-data"] {
            let b64 = user["user"][field]
                .as_str()
                .expect("the bed's admin user has a client certificate and key");
            pieces.extend(secret_pieces(&format!("{name} {field}"), b64));
        }
    }
    // what the client certificate shares with public certificates the TLS library may print at
    // trace level (the server's certificate chain: same issuer, same authority key id) is not
    // a secret: such pieces are left out, and counted
    let mut public = Vec::new();
    for cluster in [REMOTE, LOCAL] {
        for file in ["serving.crt", "ca.crt"] {
            let path = bed().await.dir.join(cluster).join("pki").join(file);
            let pem = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let (body, hex) = pem_forms(&pem);
            public.extend([body, hex]);
        }
    }
    let all = pieces.len();
    pieces.retain(|(_, p)| !public.iter().any(|pub_| pub_.contains(p.as_str())));
    let shared = all - pieces.len();
    assert!(pieces.len() >= 100, "{} pieces", pieces.len());
    let logs = d.logs();
    let lines = logs.lines().count();
    assert!(lines > 200, "trace logging is on ({lines} lines)");
    assert!(logs.contains("TRACE"), "trace lines are there");
    // each hit with the log line around it, so that a failure says who printed what
    let found: Vec<String> = pieces
        .iter()
        .filter_map(|(what, piece)| {
            let at = logs.find(piece.as_str())?;
            let start = logs[..at].rfind('\n').map_or(0, |i| i + 1);
            let context: String = logs[start..].chars().take(300).collect();
            Some(format!("{what}: {context}"))
        })
        .collect();
    assert!(
        found.is_empty(),
        "parts of a client credential in the log:\n{}",
        found.join("\n")
    );
    assert!(!logs.contains("BEGIN"), "a PEM block in the log");
    assert!(
        !logs.to_lowercase().contains("private key"),
        "a private key mentioned in the log"
    );

    let after = snapshot(&l, &[&ns.name]).await;
    let lost = Lost::since(&mid, &after, &BTreeSet::from(["web".to_string()]));
    let touched = before.non_followers_touched(&after);
    conclude(
        Report {
            id: "71-security-logs",
            scenario: "RUST_LOG=trace with client-certificate credentials (the bed's admin kubeconfig): no part of the certificate or key in the log",
            done: "full sync, one leader mirrored, then an endpoint change mirrored; the whole log searched",
            converge: Some(took),
            note: format!(
                "{lines} log lines, {} pieces searched (40-character windows of the base64 data, of the PEM body lines and of the DER in hex, for both clusters' client certificate and key; and \"BEGIN\"): 0 found ({shared} windows shared with the servers' public certificates left out)",
                pieces.len()
            ),
        },
        &lost,
        &touched,
    );
}
