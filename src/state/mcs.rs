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
use tokio_util::sync::CancellationToken;

use super::cache::{Cache, CacheError, GroupKey, by_name, by_service_label};
use crate::desired::mcs::{MCS_SERVICE_NAME_LABEL, ServiceExport, ServiceImport};

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
    /// "local", or the remote's name in the set of remotes: for logs and metrics
    pub label: Arc<str>,
    /// the name it goes by without a ClusterProperty
    pub fallback: String,
    pub property: RwLock<Property>,
    pub exports: RwLock<Cache<ServiceExport>>,
    pub namespaces: RwLock<BTreeMap<String, Arc<McsNamespace>>>,
    /// names it went by earlier in this process's life (its ClusterProperty changed): slices
    /// labelled with one are surplus of this cluster, proven by its listings
    pub former: RwLock<BTreeSet<String>>,
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
    pub fn new(label: &str, fallback: &str) -> Self {
        Self {
            label: label.into(),
            fallback: fallback.to_string(),
            property: RwLock::new(Property::Unread),
            exports: RwLock::new(Cache::new(by_name::<ServiceExport>).lean(|_| 0)),
            namespaces: RwLock::default(),
            former: RwLock::default(),
        }
    }

    /// The name it goes by; None until its ClusterProperty has been read, or when it has none
    /// and no fallback either (the local cluster without `--local-cluster-name`).
    pub fn name(&self) -> Option<String> {
        match &*self.property.read() {
            Property::Unread => None,
            Property::Absent if self.fallback.is_empty() => None,
            Property::Absent => Some(self.fallback.clone()),
            Property::Value(v) => Some(v.clone()),
        }
    }

    /// Records what its ClusterProperty says; true when the name it goes by changed (the name
    /// it went by is remembered in `former`).
    pub fn set_property(&self, p: Property) -> bool {
        let before = self.name();
        *self.property.write() = p;
        let after = self.name();
        if let (Some(b), Some(a)) = (&before, &after)
            && b != a
        {
            self.former.write().insert(b.clone());
        }
        if let Some(a) = &after {
            self.former.write().remove(a);
        }
        before != after
    }

    /// Its name is known and its exports have been listed.
    pub fn ready(&self) -> bool {
        self.exports.read().ready() && self.name().is_some()
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
        if *self.property.read() == Property::Unread {
            return Some("its ClusterProperty cluster.clusterset.k8s.io not read yet".into());
        }
        if self.name().is_none() {
            return Some(
                "no MCS name: no ClusterProperty cluster.clusterset.k8s.io and no --local-cluster-name"
                    .into(),
            );
        }
        self.exports.read().problem("ServiceExports")
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
    pub imports: RwLock<Cache<ServiceImport>>,
    pub derived: RwLock<Cache<Service>>,
    pub slices: RwLock<Cache<EndpointSlice>>,
}

impl McsLocal {
    pub fn new(source: Arc<McsCluster>) -> Self {
        Self {
            source,
            imports: RwLock::new(Cache::new(by_name::<ServiceImport>)),
            derived: RwLock::new(Cache::new(by_mcs_service_label::<Service>)),
            slices: RwLock::new(Cache::new(by_mcs_service_label::<EndpointSlice>)),
        }
    }

    /// None when healthy; otherwise why not, for /readyz.
    pub fn problem(&self) -> Option<String> {
        let imports = self.imports.read().problem("our ServiceImports");
        imports
            .or_else(|| self.derived.read().problem("our derived Services"))
            .or_else(|| self.slices.read().problem("our MCS EndpointSlices"))
            .or_else(|| self.source.problem())
    }

    /// Our imports' caches have been listed, and the local cluster as a source is ready.
    pub fn ready(&self) -> bool {
        self.imports.read().ready()
            && self.derived.read().ready()
            && self.slices.read().ready()
            && self.source.ready()
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

    #[test]
    fn a_cluster_proves_nothing_until_its_exports_and_the_namespace_are_listed() {
        let c = McsCluster::new("east", "east");
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
    fn a_name_change_remembers_the_former_name() {
        let c = McsCluster::new("east", "east");
        assert_eq!(c.name(), None);
        assert!(!c.ready());
        assert!(c.set_property(Property::Absent));
        assert_eq!(c.name().as_deref(), Some("east"));
        assert!(c.set_property(Property::Value("cluster-1".into())));
        assert_eq!(c.name().as_deref(), Some("cluster-1"));
        assert!(c.former.read().contains("east"));
        assert!(!c.set_property(Property::Value("cluster-1".into())));
        assert!(c.set_property(Property::Absent));
        assert!(!c.former.read().contains("east"), "its name again");
        assert!(c.former.read().contains("cluster-1"));
    }
}
