//! The sweeper: on each tick (leader only) it takes fresh, complete, paginated listings of the
//! local followers and then of the remote leaders, and deletes followers whose leader is
//! confirmed gone. Any listing that fails or times out aborts the sweep: nothing is deleted.
//! Local is listed before remote, so a follower created for a brand-new leader during the sweep
//! is always matched by the (later) remote listing.
use std::collections::HashSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{ListParams, ObjectMeta};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tracing::{info, warn};

use crate::cache::{GroupKey, service_of};
use crate::desired::{Options, Ownership, meta_ownership, slice_meta_ownership};
use crate::error::{Error, Result};
use crate::metrics::labels;
use crate::reconcile::Ctx;

const PAGE: u32 = 500;

/// Lists the metadata of every object matching the selector, page by page; an error or a page
/// slower than `timeout` fails the whole listing. Metadata is all a sweep reads (names,
/// ownership labels and annotations, uids): a metadata-only listing leaves the endpoints of
/// thousands of slices on the server instead of in our memory.
pub async fn list_all<K>(api: &Api<K>, selector: &str, timeout: Duration) -> Result<Vec<ObjectMeta>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut lp = ListParams::default().labels(selector).limit(PAGE);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = tokio::time::timeout(timeout, api.list_metadata(&lp))
            .await
            .map_err(|_| {
                Error::Timeout(format!(
                    "listing {} took longer than {timeout:?}",
                    K::kind(&())
                ))
            })??;
        token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        // managedFields are most of an object's metadata and nothing here reads them: at 10,000
        // leaders they were the largest thing alive during a sweep (heap profile)
        out.extend(page.items.into_iter().map(|o| ObjectMeta {
            managed_fields: None,
            ..o.metadata
        }));
        if token.is_none() {
            return Ok(out);
        }
    }
}

/// One local object to delete.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Orphan {
    pub kind: &'static str,
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// The key an object belongs to: a slice's Service (its `kubernetes.io/service-name` label),
/// otherwise the object's own name.
fn group_of(m: &ObjectMeta, by_label: bool) -> Option<GroupKey> {
    let ns = m.namespace.clone()?;
    let g = if by_label {
        service_of(m)?
    } else {
        m.name.clone()?
    };
    Some((ns, g))
}

fn orphan(m: &ObjectMeta, kind: &'static str) -> Option<Orphan> {
    Some(Orphan {
        kind,
        namespace: m.namespace.clone()?,
        name: m.name.clone()?,
        uid: m.uid.clone()?,
    })
}

/// Pure: which of our local followers (their metadata) have no leader in the complete remote
/// listing. Objects that are not ours, or in a namespace this remote is not watched in, are
/// never candidates.
pub fn orphans(
    leaders: &HashSet<GroupKey>,
    services: &[ObjectMeta],
    slices: &[ObjectMeta],
    endpoints: &[ObjectMeta],
    opts: &Options,
    namespaces: &[String],
) -> Vec<Orphan> {
    let ours = |o: Ownership| matches!(o, Ownership::Ours | Ownership::Adoptable);
    plan(
        leaders,
        (services, slices, endpoints),
        opts,
        namespaces,
        ours,
    )
}

/// Pure: every local follower that carries this remote's name (a remote that left). A follower
/// without an origin (left by the Go controller) is never taken for one remote's.
pub fn retired(followers: &Followers, opts: &Options) -> Vec<Orphan> {
    let (services, slices, endpoints) = (
        &followers.services[..],
        &followers.slices[..],
        &followers.endpoints[..],
    );
    let ours = |o: Ownership| o == Ownership::Ours;
    plan(
        &HashSet::new(),
        (services, slices, endpoints),
        opts,
        &[],
        ours,
    )
}

type Metas<'a> = (&'a [ObjectMeta], &'a [ObjectMeta], &'a [ObjectMeta]);

fn plan(
    leaders: &HashSet<GroupKey>,
    (services, slices, endpoints): Metas,
    opts: &Options,
    namespaces: &[String],
    ours: impl Fn(Ownership) -> bool,
) -> Vec<Orphan> {
    let in_scope = |g: &GroupKey| namespaces.is_empty() || namespaces.contains(&g.0);
    let gone = |g: Option<GroupKey>| g.is_some_and(|g| in_scope(&g) && !leaders.contains(&g));
    let mut out: Vec<Orphan> = Vec::new();
    out.extend(
        slices
            .iter()
            .filter(|m| ours(slice_meta_ownership(m, opts)) && gone(group_of(m, true)))
            .filter_map(|m| orphan(m, "EndpointSlice")),
    );
    out.extend(
        endpoints
            .iter()
            .filter(|m| ours(meta_ownership(m, opts)) && gone(group_of(m, false)))
            .filter_map(|m| orphan(m, "Endpoints")),
    );
    out.extend(
        services
            .iter()
            .filter(|m| ours(meta_ownership(m, opts)) && gone(group_of(m, false)))
            .filter_map(|m| orphan(m, "Service")),
    );
    out
}

pub struct SweepReport {
    pub leaders: usize,
    pub followers: usize,
    pub deleted: usize,
}

/// The namespaces to list: each watched one, or (None) the whole cluster.
fn scopes(namespaces: &[String]) -> Vec<Option<&str>> {
    if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces.iter().map(|n| Some(n.as_str())).collect()
    }
}

fn scoped<K>(client: &Client, ns: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = kube::core::NamespaceResourceScope, DynamicType = ()>,
{
    match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    }
}

/// The metadata of the local followers, from one complete listing.
#[derive(Default)]
pub struct Followers {
    pub services: Vec<ObjectMeta>,
    pub slices: Vec<ObjectMeta>,
    pub endpoints: Vec<ObjectMeta>,
}

/// Complete listings of the local followers in the watched namespaces (any failure: an error).
async fn list_followers(
    ctx: &Ctx,
    opts: &Options,
    namespaces: &[String],
    timeout: Duration,
) -> Result<Followers> {
    let local = ctx.writer.client().clone();
    let sel = opts.follower_selector();
    let mut f = Followers::default();
    for ns in scopes(namespaces) {
        f.services
            .extend(list_all(&scoped::<Service>(&local, ns), &sel, timeout).await?);
        f.slices
            .extend(list_all(&scoped::<EndpointSlice>(&local, ns), &sel, timeout).await?);
        f.endpoints
            .extend(list_all(&scoped::<Endpoints>(&local, ns), &sel, timeout).await?);
    }
    Ok(f)
}

/// Deletes what a plan names, each with its uid precondition; stops at the first failure.
async fn delete_all(ctx: &Ctx, plan: &[Orphan], remote_name: &str, why: &str) -> Result<usize> {
    let mut deleted = 0;
    for o in plan {
        let (ns, name, uid) = (&o.namespace, &o.name, &o.uid);
        match o.kind {
            "Service" => ctx.writer.delete::<Service>(ns, name, uid, why).await,
            "EndpointSlice" => ctx.writer.delete::<EndpointSlice>(ns, name, uid, why).await,
            _ => ctx.writer.delete::<Endpoints>(ns, name, uid, why).await,
        }?;
        deleted += 1;
        ctx.metrics
            .sweep_deletions
            .get_or_create(&labels([("remote", remote_name)]))
            .inc();
    }
    Ok(deleted)
}

/// A remote has left (its Secret deleted and the grace passed): deletes every follower object
/// that carries its name, after one complete local listing.
pub async fn retire(
    ctx: &Ctx,
    remote_name: &str,
    opts: &Options,
    namespaces: &[String],
    timeout: Duration,
) -> Result<usize> {
    let followers = list_followers(ctx, opts, namespaces, timeout).await?;
    let plan = retired(&followers, opts);
    delete_all(ctx, &plan, remote_name, "its remote left").await
}

pub async fn sweep(
    ctx: &Ctx,
    remote_name: &str,
    remote: &Client,
    opts: &Options,
    namespaces: &[String],
    timeout: Duration,
) -> Result<SweepReport> {
    let Followers {
        services,
        slices,
        endpoints,
    } = list_followers(ctx, opts, namespaces, timeout).await?;

    let leader_sel = opts.leader_selector();
    let mut leaders = HashSet::new();
    for ns in scopes(namespaces) {
        for m in list_all(&scoped::<Service>(remote, ns), &leader_sel, timeout).await? {
            if let Some(key) = group_of(&m, false) {
                leaders.insert(key);
            }
        }
    }

    let plan = orphans(&leaders, &services, &slices, &endpoints, opts, namespaces);
    let deleted = delete_all(ctx, &plan, remote_name, "sweeper: leader gone").await?;
    Ok(SweepReport {
        leaders: leaders.len(),
        followers: services.len(),
        deleted,
    })
}

/// Runs one sweep and logs its one-line summary; never propagates an error.
pub async fn sweep_logged(
    ctx: &Ctx,
    remote_name: &str,
    remote: &Client,
    opts: &Options,
    namespaces: &[String],
    timeout: Duration,
) {
    let started = Instant::now();
    match sweep(ctx, remote_name, remote, opts, namespaces, timeout).await {
        Ok(r) => {
            ctx.metrics
                .sweeps
                .get_or_create(&labels([("remote", remote_name), ("outcome", "done")]))
                .inc();
            info!(
                remote = remote_name,
                leaders = r.leaders,
                followers = r.followers,
                deleted = r.deleted,
                took_ms = started.elapsed().as_millis() as u64,
                "sweep done"
            );
        }
        Err(e) => {
            ctx.metrics
                .sweeps
                .get_or_create(&labels([("remote", remote_name), ("outcome", "aborted")]))
                .inc();
            warn!(remote = remote_name, error = %e, category = e.category(), "sweep aborted: nothing deleted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::desired::EndpointsMode;
    use serde_json::json;

    fn opts() -> Options {
        Options {
            label_key: "fair.com/cross-cluster".into(),
            cluster_name: "east".into(),
            endpoints_mode: EndpointsMode::Slices,
            cluster_id: None,
        }
    }

    fn svc(
        ns: &str,
        name: &str,
        labels: serde_json::Value,
        annotations: serde_json::Value,
    ) -> Service {
        serde_json::from_value(
            json!({"metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
            "labels": labels, "annotations": annotations}}),
        )
        .unwrap()
    }

    fn follower(ns: &str, name: &str) -> Service {
        svc(
            ns,
            name,
            json!({"fair.com/cross-cluster": "follower"}),
            json!({"fair.com/cross-cluster-origin-cluster": "east"}),
        )
    }

    fn slice(ns: &str, name: &str, service: &str, managed_by: &str) -> EndpointSlice {
        serde_json::from_value(
            json!({"metadata": {"namespace": ns, "name": name, "uid": format!("uid-{name}"),
            "labels": {"fair.com/cross-cluster": "follower", "kubernetes.io/service-name": service,
                       "endpointslice.kubernetes.io/managed-by": managed_by},
            "annotations": {"fair.com/cross-cluster-origin-cluster": "east"}},
            "addressType": "IPv4", "endpoints": []}),
        )
        .unwrap()
    }

    fn metas<K: Resource>(objs: Vec<K>) -> Vec<ObjectMeta> {
        objs.iter().map(|o| o.meta().clone()).collect()
    }

    fn leaders(keys: &[(&str, &str)]) -> HashSet<GroupKey> {
        keys.iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    }

    #[test]
    fn a_remote_that_left_takes_only_its_own_followers_with_it() {
        let go_era = svc(
            "a",
            "go-era",
            json!({"fair.com/cross-cluster": "follower"}),
            json!({}),
        );
        let north = svc(
            "a",
            "north",
            json!({"fair.com/cross-cluster": "follower"}),
            json!({"fair.com/cross-cluster-origin-cluster": "north"}),
        );
        let plain = svc("a", "plain", json!({}), json!({}));
        let followers = Followers {
            services: metas(vec![
                follower("a", "web"),
                follower("b", "api"),
                go_era,
                north,
                plain,
            ]),
            slices: metas(vec![
                slice("a", "web-1", "web", crate::desired::MANAGED_BY),
                slice("a", "web-kcm", "web", "endpointslice-controller.k8s.io"),
            ]),
            endpoints: vec![],
        };
        let mut got: Vec<String> = retired(&followers, &opts())
            .into_iter()
            .map(|o| format!("{} {}/{}", o.kind, o.namespace, o.name))
            .collect();
        got.sort();
        assert_eq!(
            got,
            ["EndpointSlice a/web-1", "Service a/web", "Service b/api"],
            "east's own, in every namespace; not the Go-era one, not north's, not a plain Service"
        );
    }

    #[test]
    fn only_our_followers_without_a_leader_are_orphans() {
        let services = vec![
            follower("a", "kept"),
            follower("a", "gone"),
            svc("a", "plain", json!({}), json!({})),
            svc(
                "a",
                "other-remote",
                json!({"fair.com/cross-cluster": "follower"}),
                json!({"fair.com/cross-cluster-origin-cluster": "north"}),
            ),
            svc(
                "a",
                "go-era",
                json!({"fair.com/cross-cluster": "follower"}),
                json!({}),
            ),
        ];
        let slices = vec![
            slice("a", "gone-1", "gone", crate::desired::MANAGED_BY),
            slice(
                "a",
                "gone-mirrored",
                "gone",
                "endpointslicemirroring-controller.k8s.io",
            ),
            slice("a", "kept-1", "kept", crate::desired::MANAGED_BY),
        ];
        let mut got = orphans(
            &leaders(&[("a", "kept")]),
            &metas(services),
            &metas(slices),
            &[],
            &opts(),
            &[],
        );
        got.sort();
        let names: Vec<_> = got.iter().map(|o| (o.kind, o.name.as_str())).collect();
        assert_eq!(
            names,
            vec![
                ("EndpointSlice", "gone-1"),
                ("Service", "go-era"),
                ("Service", "gone")
            ]
        );
        assert!(
            got.iter().all(|o| o.uid.starts_with("uid-")),
            "deletes carry the uid precondition"
        );
    }

    #[test]
    fn every_leader_present_means_nothing_to_delete() {
        let services = vec![follower("a", "x"), follower("b", "y")];
        assert!(
            orphans(
                &leaders(&[("a", "x"), ("b", "y")]),
                &metas(services),
                &[],
                &[],
                &opts(),
                &[]
            )
            .is_empty()
        );
    }

    #[test]
    fn followers_outside_the_watched_namespaces_are_left_alone() {
        let services = vec![follower("watched", "x"), follower("elsewhere", "y")];
        let got = orphans(
            &leaders(&[]),
            &metas(services),
            &[],
            &[],
            &opts(),
            &["watched".to_string()],
        );
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].namespace, "watched");
    }
}

/// Sweep decisions against mock local and remote API servers (see `fixtures`).
#[cfg(test)]
mod decision_tests {
    use super::*;
    use crate::desired::MANAGED_BY;
    use crate::fixtures::{
        self, ApiServer, Expect, Reply, delete, follower_meta, get, metadata_page, ok, opts, run,
        status,
    };
    use crate::reconcile::LocalState;
    use serde_json::{Value, json};
    use std::sync::Arc;
    use tokio::sync::watch;

    const FOLLOWERS: &str = "fair.com/cross-cluster=follower";
    const LEADERS: &str = "fair.com/cross-cluster=true";
    const PAGE_TIMEOUT: Duration = Duration::from_secs(1);

    struct Setup {
        ctx: Ctx,
        local: ApiServer,
        remote_client: Client,
        remote: ApiServer,
        _lease: watch::Sender<Option<Instant>>,
    }

    fn setup(leader: bool) -> Setup {
        let (local_client, local) = fixtures::client("local");
        let (remote_client, remote) = fixtures::client("remote");
        let (tx, leadership) = fixtures::leadership(leader);
        let ctx = fixtures::ctx(
            local_client,
            leadership,
            vec![],
            Arc::new(LocalState::default()),
        );
        Setup {
            ctx,
            local,
            remote_client,
            remote,
            _lease: tx,
        }
    }

    impl Setup {
        async fn sweep(&self) -> Result<SweepReport> {
            sweep(
                &self.ctx,
                fixtures::REMOTE,
                &self.remote_client,
                &opts(),
                &[],
                PAGE_TIMEOUT,
            )
            .await
        }
    }

    fn list(path: &str, selector: &str) -> Expect {
        get(path)
            .query("labelSelector", selector)
            .query("limit", "500")
            .no_query("continue")
    }

    fn slice_meta(name: &str, service: &str, managed_by: &str) -> Value {
        json!({"metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
            "labels": {"fair.com/cross-cluster": "follower",
                       "kubernetes.io/service-name": service,
                       "endpointslice.kubernetes.io/managed-by": managed_by},
            "annotations": {"fair.com/cross-cluster-origin-cluster": fixtures::REMOTE}}})
    }

    fn leader(name: &str) -> Value {
        json!({"metadata": {"namespace": "shop", "name": name, "uid": format!("remote-{name}"),
                            "labels": {"fair.com/cross-cluster": "true"}}})
    }

    /// The local followers: `kept` (its leader exists), `gone` (its leader does not) with one
    /// slice of ours and one mirrored by kube-controller-manager, and a follower of another
    /// remote.
    async fn local_listings(local: &ApiServer) {
        let mut north = follower_meta("shop", "north", "uid-north");
        north["metadata"]["annotations"]["fair.com/cross-cluster-origin-cluster"] =
            json!("remote-b");
        let services = [
            follower_meta("shop", "kept", "uid-kept"),
            follower_meta("shop", "gone", "uid-gone"),
            north,
        ];
        let sent = local
            .expect(
                list("/api/v1/services", FOLLOWERS),
                metadata_page(&services, None),
            )
            .await;
        assert!(
            sent.accept
                .is_some_and(|a| a.contains("PartialObjectMetadataList")),
            "a sweep lists metadata only"
        );
        let slices = [
            slice_meta("gone-abc", "gone", MANAGED_BY),
            slice_meta(
                "gone-mirrored",
                "gone",
                "endpointslicemirroring-controller.k8s.io",
            ),
        ];
        local
            .expect(
                list("/apis/discovery.k8s.io/v1/endpointslices", FOLLOWERS),
                metadata_page(&slices, None),
            )
            .await;
        local
            .expect(
                list("/api/v1/endpoints", FOLLOWERS),
                metadata_page(&[], None),
            )
            .await;
    }

    /// The first page of leaders (with `kept`), promising a second.
    async fn first_remote_page(remote: &ApiServer) {
        remote
            .expect(
                list("/api/v1/services", LEADERS),
                metadata_page(&[leader("kept")], Some("tok-1")),
            )
            .await;
    }

    fn second_page() -> Expect {
        get("/api/v1/services")
            .query("labelSelector", LEADERS)
            .query("continue", "tok-1")
    }

    #[tokio::test]
    async fn a_complete_listing_deletes_exactly_the_confirmed_orphans_with_uid_preconditions() {
        let s = setup(true);
        let deleted = json!({"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "code": 200, "metadata": {}});
        let report = run(&[&s.local, &s.remote], s.sweep(), async {
            local_listings(&s.local).await;
            first_remote_page(&s.remote).await;
            s.remote
                .expect(second_page(), metadata_page(&[leader("other")], None))
                .await;
            let sent = s
                .local
                .expect(
                    delete("/apis/discovery.k8s.io/v1/namespaces/shop/endpointslices/gone-abc"),
                    ok(deleted.clone()),
                )
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-gone-abc");
            let sent = s
                .local
                .expect(
                    delete("/api/v1/namespaces/shop/services/gone"),
                    ok(deleted.clone()),
                )
                .await;
            assert_eq!(sent.body["preconditions"]["uid"], "uid-gone");
        })
        .await
        .unwrap();
        assert_eq!(
            (report.leaders, report.followers, report.deleted),
            (2, 3, 2)
        );
    }

    #[tokio::test]
    async fn a_failed_remote_page_sends_no_delete() {
        for what in ["500", "410 expired continue token", "connection error"] {
            let failure = || match what {
                "500" => status(500, "InternalError"),
                "410 expired continue token" => status(410, "Expired"),
                _ => Reply::ConnectionError,
            };
            let s = setup(true);
            let swept = run(&[&s.local, &s.remote], s.sweep(), async {
                local_listings(&s.local).await;
                first_remote_page(&s.remote).await;
                s.remote.expect(second_page(), failure()).await;
            })
            .await;
            assert!(swept.is_err(), "{what}: the sweep is aborted");
        }
    }

    #[tokio::test]
    async fn a_remote_page_that_hangs_sends_no_delete() {
        let s = setup(true);
        let swept = run(&[&s.local, &s.remote], s.sweep(), async {
            local_listings(&s.local).await;
            first_remote_page(&s.remote).await;
            s.remote.expect_hang(second_page()).await;
        })
        .await;
        assert!(matches!(swept, Err(Error::Timeout(_))));
    }

    #[tokio::test]
    async fn a_failed_local_listing_lists_no_remote_and_deletes_nothing() {
        let s = setup(true);
        let swept = run(&[&s.local, &s.remote], s.sweep(), async {
            s.local
                .expect(
                    list("/api/v1/services", FOLLOWERS),
                    metadata_page(&[follower_meta("shop", "gone", "uid-gone")], None),
                )
                .await;
            s.local
                .expect(
                    list("/apis/discovery.k8s.io/v1/endpointslices", FOLLOWERS),
                    status(500, "InternalError"),
                )
                .await;
        })
        .await;
        assert_eq!(swept.err().and_then(|e| e.api_code()), Some(500));
    }

    #[tokio::test]
    async fn a_replica_that_is_not_the_leader_deletes_nothing() {
        let s = setup(false);
        let swept = run(&[&s.local, &s.remote], s.sweep(), async {
            local_listings(&s.local).await;
            first_remote_page(&s.remote).await;
            s.remote
                .expect(second_page(), metadata_page(&[], None))
                .await;
        })
        .await;
        assert!(matches!(swept, Err(Error::NotLeader)));
    }
}
