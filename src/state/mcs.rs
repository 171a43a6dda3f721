//! The Multi-Cluster Services API as the watches have seen it: per cluster (the local one
//! included, which is a source too) its ServiceExports, the name it goes by, and the Services
//! and EndpointSlices of the namespaces where it exports something; and in the local cluster
//! our ServiceImports, derived Services and MCS slices.
//!
//! A cluster's Services and slices are read only in the namespaces where it exports something
//! (a watch per namespace, started by its first export there and stopped with its last), so
//! memory grows with what is exported, not with the cluster; and each of those listings is
//! complete for its namespace, so absence in it is proof, as in every other cache.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use parking_lot::RwLock;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::cache::{Cache, CacheError, GroupKey, by_name, by_service_label};
use super::ready::{Flag, Signals};
use crate::desired::mcs::{
    Claim, Grant, Holders, Identity, MCS_SERVICE_NAME_LABEL, ServiceExport, ServiceImport,
};

/// What a cluster's ClusterProperty `cluster.clusterset.k8s.io` says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Property {
    /// not read yet: the cluster's name is not known
    Unread,
    /// none (or no ClusterProperty API, or a value that is not a valid name): the fallback name
    Absent,
    Value(String),
}

/// The Services and slices of one namespace where a cluster exports something.
pub struct McsNamespace {
    pub services: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
    /// stops its two watches
    pub cancel: CancellationToken,
}

impl McsNamespace {
    pub fn new(cancel: CancellationToken) -> Self {
        Self {
            // a source's objects: their annotations are never read (an export's are in its spec)
            services: RwLock::new(Cache::new(by_name::<Service>).lean(|_| 0)),
            slices: RwLock::new(
                Cache::new(by_service_label::<EndpointSlice>).lean(|s| s.endpoints.len()),
            ),
            cancel,
        }
    }

    pub fn ready(&self) -> bool {
        self.services.read().ready() && self.slices.read().ready()
    }
}

/// One cluster's part in the MCS API, as a source.
pub struct McsCluster {
    /// [`super::LOCAL`], or the remote's name in the set of remotes: for logs and metrics
    pub label: Arc<str>,
    /// who it is (never the name it claims)
    pub identity: Identity,
    /// the name it claims without a ClusterProperty
    pub fallback: String,
    pub property: RwLock<Property>,
    /// a right its credentials lack (e.g. `list clusterproperties.about.k8s.io`): named on
    /// /readyz and in the health Lease until it is granted
    missing_right: RwLock<Option<String>>,
    /// the name it may go by (see [`McsLocal::settle`])
    grant: RwLock<Grant>,
    /// set while it is granted a name
    named: Flag,
    pub exports: RwLock<Cache<ServiceExport>>,
    pub namespaces: RwLock<BTreeMap<String, Arc<McsNamespace>>>,
    /// names it was granted earlier in this process's life: slices labelled with one are
    /// surplus of this cluster, proven by its listings (together with the proof of whoever
    /// holds that name now). Only a granted name gets here: a refused claim never does.
    former: RwLock<BTreeSet<String>>,
}

/// What one cluster's caches say about one namespace/name.
pub enum McsView {
    /// no complete listing of its exports, or of the Services and slices of that namespace
    Unknown,
    /// a complete listing of its exports lacks it
    Absent,
    Exports {
        export: Arc<ServiceExport>,
        service: Option<Arc<Service>>,
        slices: Vec<Arc<EndpointSlice>>,
    },
}

impl McsCluster {
    /// What its MCS caches hold: each export counts as an exported Service (it costs the local
    /// cluster an import and a derived Service), the Services and slices of the namespaces it
    /// exports in as their endpoints and bytes. A remote's budget counts it beside its
    /// labelled Services ([`super::RemoteState::usage`]).
    pub fn usage(&self) -> super::budget::Usage {
        let exports = self.exports.read().held();
        let mut u = super::budget::Usage {
            services: exports.objects as u64,
            endpoints: 0,
            bytes: exports.bytes as u64,
        };
        for n in self.namespaces.read().values() {
            let (svcs, slices) = (n.services.read().held(), n.slices.read().held());
            u.endpoints += slices.weight as u64;
            u.bytes += (svcs.bytes + slices.bytes) as u64;
        }
        u
    }

    /// Drops every MCS cache of it (its remote went over budget): it proves nothing until its
    /// watches list again.
    pub fn evict(&self, why: &str) {
        self.exports.write().evict(why.to_string());
        for n in self.namespaces.read().values() {
            n.services.write().evict(why.to_string());
            n.slices.write().evict(why.to_string());
        }
    }

    pub fn new(identity: Identity, label: &str, fallback: &str) -> Self {
        Self {
            label: label.into(),
            identity,
            fallback: fallback.to_string(),
            property: RwLock::new(Property::Unread),
            missing_right: RwLock::default(),
            grant: RwLock::new(Grant::Pending),
            named: Flag::default(),
            exports: RwLock::new(Cache::new(by_name::<ServiceExport>).lean(|_| 0)),
            namespaces: RwLock::default(),
            former: RwLock::default(),
        }
    }

    /// The name it claims; None until its ClusterProperty has been read, or when it has none
    /// and no fallback either (the local cluster without `--local-cluster-name`).
    pub fn claimed(&self) -> Option<String> {
        match &*self.property.read() {
            Property::Unread => None,
            Property::Absent if self.fallback.is_empty() => None,
            Property::Absent => Some(self.fallback.clone()),
            Property::Value(v) => Some(v.clone()),
        }
    }

    /// The name it goes by: the name it claims once granted (see [`McsLocal::settle`]).
    pub fn name(&self) -> Option<String> {
        self.grant.read().name().map(str::to_string)
    }

    pub fn grant(&self) -> Grant {
        self.grant.read().clone()
    }

    /// The names it was granted earlier (see the field): written by [`McsLocal::settle`] alone.
    pub fn former(&self) -> BTreeSet<String> {
        self.former.read().clone()
    }

    /// Records what its ClusterProperty says; true when the name it claims changed.
    pub fn set_property(&self, p: Property) -> bool {
        let before = self.claimed();
        *self.property.write() = p;
        before != self.claimed()
    }

    /// Records a right its credentials lack (None: nothing known to be missing); true when
    /// that changed.
    pub fn set_missing_right(&self, right: Option<String>) -> bool {
        let mut missing = self.missing_right.write();
        let changed = *missing != right;
        *missing = right;
        changed
    }

    /// Records what it may go by; true when that changed. A name it no longer goes by is
    /// remembered in `former`.
    fn set_grant(&self, g: Grant) -> bool {
        let named = g.name().is_some();
        let before = std::mem::replace(&mut *self.grant.write(), g.clone());
        self.named.set(named);
        if let Some(b) = before.name()
            && g.name() != Some(b)
        {
            self.former.write().insert(b.to_string());
        }
        if let Some(a) = g.name() {
            self.former.write().remove(a);
        }
        before != g
    }

    /// Its name is known and its exports have been listed.
    pub fn ready(&self) -> bool {
        self.exports.read().ready() && self.name().is_some()
    }

    /// What [`McsCluster::ready`] rests on: its exports' listing and its name's grant.
    pub fn readiness(&self) -> Vec<watch::Receiver<bool>> {
        vec![self.exports.read().readiness(), self.named.watch()]
    }

    /// What it says about one namespace/name.
    pub fn view(&self, g: &GroupKey) -> Result<McsView, CacheError> {
        let export = {
            let exports = self.exports.read();
            if !exports.ready() {
                return Ok(McsView::Unknown);
            }
            match exports.named(g)? {
                Some(e) => e,
                None => return Ok(McsView::Absent),
            }
        };
        let Some(ns) = self.namespace(&g.0) else {
            return Ok(McsView::Unknown);
        };
        if !ns.ready() {
            return Ok(McsView::Unknown);
        }
        let service = ns.services.read().named(g)?;
        let slices = ns.slices.read().group(g)?;
        Ok(McsView::Exports {
            export,
            service,
            slices,
        })
    }

    pub fn namespace(&self, ns: &str) -> Option<Arc<McsNamespace>> {
        self.namespaces.read().get(ns).cloned()
    }

    /// Whether it exports this namespace/name (its export cache has it).
    pub fn exports_key(&self, g: &GroupKey) -> bool {
        self.exports.read().contains(g)
    }

    /// The keys it exports in one namespace.
    pub fn exported_in(&self, ns: &str) -> Vec<GroupKey> {
        self.exports
            .read()
            .keys()
            .filter(|k| k.0 == ns)
            .cloned()
            .collect()
    }

    /// Every key it exports.
    pub fn exported(&self) -> Vec<GroupKey> {
        self.exports.read().keys().cloned().collect()
    }

    /// None when healthy; otherwise why not, for /readyz.
    pub fn problem(&self) -> Option<String> {
        let missing = self.missing_right.read().clone();
        if let Some(right) = missing {
            let exports = self.exports.read().problem("ServiceExports");
            return Some(format!(
                "missing right: {right} (the credentials lack what --mcs needs: run \
                 `cross-cluster-controller remote-access --mcs` against that cluster again){}",
                exports.map(|e| format!("; {e}")).unwrap_or_default()
            ));
        }
        if *self.property.read() == Property::Unread {
            return Some("its ClusterProperty cluster.clusterset.k8s.io not read yet".into());
        }
        let Some(claimed) = self.claimed() else {
            return Some(
                "no MCS name: no ClusterProperty cluster.clusterset.k8s.io and no --local-cluster-name"
                    .into(),
            );
        };
        match self.grant() {
            Grant::Named(_) => self.exports.read().problem("ServiceExports"),
            Grant::Pending => Some(format!(
                "MCS name {claimed:?} not granted yet (the remotes not all listed, or the remote of that name not read yet)"
            )),
            Grant::Refused { wanted, holder } => Some(format!(
                "MCS name {wanted:?} refused: {holder} holds it; its exports wait"
            )),
        }
    }
}

/// The group of a derived Service or an MCS slice: the Service it imports
/// (`multicluster.kubernetes.io/service-name`).
pub fn by_mcs_service_label<K: kube::Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .labels
        .as_ref()?
        .get(MCS_SERVICE_NAME_LABEL)
        .cloned()
}

/// The MCS API in the local cluster: the local cluster as a source, and our imports.
pub struct McsLocal {
    pub source: Arc<McsCluster>,
    /// who holds which name
    holders: parking_lot::Mutex<Holders>,
    pub imports: RwLock<Cache<ServiceImport>>,
    pub derived: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
    /// the API server dropped the node hints of a slice we wrote (its
    /// PreferSameTrafficDistribution gate is off): none are sent again
    node_hints_dropped: std::sync::atomic::AtomicBool,
}

impl McsLocal {
    pub fn new(source: Arc<McsCluster>) -> Self {
        Self {
            source,
            holders: parking_lot::Mutex::default(),
            imports: RwLock::new(Cache::new(by_name::<ServiceImport>)),
            derived: RwLock::new(Cache::new(by_mcs_service_label::<Service>)),
            slices: RwLock::new(Cache::new(by_mcs_service_label::<EndpointSlice>)),
            node_hints_dropped: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether node hints may be sent (the API server kept those of every slice written so far).
    pub fn node_hints_kept(&self) -> bool {
        !self
            .node_hints_dropped
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A slice was sent with node hints and came back without any. True the first time.
    pub fn node_hints_dropped(&self) -> bool {
        !self
            .node_hints_dropped
            .swap(true, std::sync::atomic::Ordering::Relaxed)
    }

    /// None when healthy; otherwise why not, for /readyz.
    pub fn problem(&self) -> Option<String> {
        let imports = self.imports.read().problem("our ServiceImports");
        imports
            .or_else(|| self.derived.read().problem("our derived Services"))
            .or_else(|| self.slices.read().problem("our MCS EndpointSlices"))
            .or_else(|| self.source.problem())
    }

    /// Decides which cluster goes by which name ([`Holders::settle`]) from every cluster's
    /// claim, the local one and each remote read (`named`: the names the sources of remotes
    /// give, once every source has been listed; see [`Holders::settle`]), and records each
    /// one's grant. Returns the clusters whose grant changed.
    pub fn settle(
        &self,
        remotes: &[Arc<McsCluster>],
        named: Option<&BTreeSet<String>>,
    ) -> Vec<Arc<McsCluster>> {
        let mut all = vec![Arc::clone(&self.source)];
        all.extend(remotes.iter().cloned());
        let claims: Vec<Claim> = all
            .iter()
            .map(|c| Claim {
                who: c.identity.clone(),
                wants: c.claimed(),
            })
            .collect();
        // one settlement at a time, its grants recorded before the next
        let mut holders = self.holders.lock();
        let grants = holders.settle(&claims, named);
        all.into_iter()
            .filter(|c| {
                let g = grants.get(&c.identity).cloned().unwrap_or(Grant::Pending);
                c.set_grant(g)
            })
            .collect()
    }

    /// Our imports' caches have been listed, and the local cluster as a source is ready.
    pub fn ready(&self) -> bool {
        self.imports.read().ready()
            && self.derived.read().ready()
            && self.slices.read().ready()
            && self.source.ready()
    }

    /// What [`McsLocal::ready`] rests on.
    pub fn readiness(&self) -> Signals {
        let mut signals = Signals::new([
            self.imports.read().readiness(),
            self.derived.read().readiness(),
            self.slices.read().readiness(),
        ]);
        signals.extend(self.source.readiness());
        signals
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::watcher::Event;
    use serde_json::json;

    fn export(ns: &str, name: &str) -> ServiceExport {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"}
        }))
        .expect("an export")
    }

    fn list<K>(cache: &RwLock<Cache<K>>, objs: Vec<K>)
    where
        K: kube::Resource + serde::Serialize + serde::de::DeserializeOwned,
    {
        let mut c = cache.write();
        c.apply(Event::Init);
        for o in objs {
            c.apply(Event::InitApply(o));
        }
        c.apply(Event::InitDone);
    }

    fn remote(name: &str) -> Arc<McsCluster> {
        let who = Identity::remote(name, Some(&format!("id-{name}")));
        Arc::new(McsCluster::new(who, name, name))
    }

    #[test]
    fn a_cluster_proves_nothing_until_its_exports_and_the_namespace_are_listed() {
        let c = remote("east");
        let g = ("shop".to_string(), "web".to_string());
        assert!(matches!(c.view(&g), Ok(McsView::Unknown)));
        list(&c.exports, vec![export("shop", "web")]);
        assert!(
            matches!(c.view(&g), Ok(McsView::Unknown)),
            "no namespace watch yet"
        );
        let ns = Arc::new(McsNamespace::new(CancellationToken::new()));
        c.namespaces.write().insert("shop".into(), Arc::clone(&ns));
        assert!(matches!(c.view(&g), Ok(McsView::Unknown)), "not listed");
        list(&ns.services, vec![]);
        list(&ns.slices, vec![]);
        assert!(matches!(
            c.view(&g),
            Ok(McsView::Exports { service: None, .. })
        ));
        let other = ("shop".to_string(), "db".to_string());
        assert!(matches!(c.view(&other), Ok(McsView::Absent)));
    }

    #[test]
    fn a_granted_name_change_remembers_the_former_name() {
        let local = Arc::new(McsCluster::new(Identity::Local, "local", "west"));
        let mcs = McsLocal::new(local);
        let c = remote("east");
        let all = [Arc::clone(&c)];
        assert_eq!(c.name(), None);
        assert!(!c.ready());
        assert!(c.set_property(Property::Absent));
        assert!(
            mcs.settle(&all, Some(&BTreeSet::new()))
                .iter()
                .any(|x| Arc::ptr_eq(x, &c))
        );
        assert_eq!(c.name().as_deref(), Some("east"));
        assert!(c.set_property(Property::Value("cluster-1".into())));
        mcs.settle(&all, Some(&BTreeSet::new()));
        assert_eq!(c.name().as_deref(), Some("cluster-1"));
        assert!(c.former.read().contains("east"));
        assert!(!c.set_property(Property::Value("cluster-1".into())));
        assert!(
            mcs.settle(&all, Some(&BTreeSet::new())).is_empty(),
            "nothing changed"
        );
        assert!(c.set_property(Property::Absent));
        mcs.settle(&all, Some(&BTreeSet::new()));
        assert!(!c.former.read().contains("east"), "its name again");
        assert!(c.former.read().contains("cluster-1"));
    }

    #[test]
    fn a_refused_claim_never_becomes_a_former_name() {
        let local = Arc::new(McsCluster::new(Identity::Local, "local", "west"));
        local.set_property(Property::Absent);
        let mcs = McsLocal::new(Arc::clone(&local));
        let (east, north) = (remote("east"), remote("north"));
        let all = [Arc::clone(&east), Arc::clone(&north)];
        east.set_property(Property::Absent);
        north.set_property(Property::Absent);
        mcs.settle(&all, Some(&BTreeSet::new()));
        // north claims east's name, then the local cluster's: refused both times
        for taken in ["east", "west"] {
            north.set_property(Property::Value(taken.into()));
            mcs.settle(&all, Some(&BTreeSet::new()));
            assert_eq!(north.name(), None);
            let why = north.problem().unwrap_or_default();
            assert!(why.contains("refused"), "{why}");
            assert!(!north.former.read().contains(taken), "never granted");
        }
        assert_eq!(east.name().as_deref(), Some("east"));
        assert_eq!(local.name().as_deref(), Some("west"));
        north.set_property(Property::Absent);
        mcs.settle(&all, Some(&BTreeSet::new()));
        assert_eq!(north.name().as_deref(), Some("north"));
        assert!(north.former.read().is_empty());
        assert!(east.former.read().is_empty());
    }
}
