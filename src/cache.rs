//! In-memory caches fed by watch events, grouped by the key a reconcile works on
//! (namespace + leader/follower Service name). Pure: no I/O, tested by feeding events.
//!
//! A re-list (watch restart) is buffered and swapped in only when complete, so a cache never
//! shows a partial listing: an object is absent only after a delete event or a complete listing
//! that lacks it (the proof the deletion invariant needs).
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use kube::runtime::watcher::Event;

/// (namespace, service name)
pub type GroupKey = (String, String);

type Groups<K> = HashMap<GroupKey, BTreeMap<String, Arc<K>>>;

/// Objects by group, with an index from (namespace, name) to the group each object is in, so an
/// update or delete finds its object in constant time at any cache size.
struct Store<K> {
    groups: Groups<K>,
    located: HashMap<(String, String), String>,
}

impl<K: Resource> Store<K> {
    fn new() -> Self {
        Self {
            groups: HashMap::new(),
            located: HashMap::new(),
        }
    }

    /// Stores the object (without its managedFields, which nothing here reads and which are
    /// often the largest part of an object); returns the groups whose content changed: the
    /// object's group and, if it moved (a slice relabelled to another service), its old one.
    fn insert(&mut self, group_of: fn(&K) -> Option<String>, mut obj: K) -> Vec<GroupKey> {
        let Some((ns, name)) = ids(&obj) else {
            return Vec::new();
        };
        let new_group = group_of(&obj);
        let mut touched = Vec::new();
        if let Some(old) = self.located.get(&(ns.clone(), name.clone()))
            && Some(old) != new_group.as_ref()
        {
            touched.extend(self.remove(&ns, &name));
        }
        let Some(group) = new_group else {
            return touched;
        };
        obj.meta_mut().managed_fields = None;
        let key = (ns.clone(), group.clone());
        self.groups
            .entry(key.clone())
            .or_default()
            .insert(name.clone(), Arc::new(obj));
        self.located.insert((ns, name), group);
        touched.push(key);
        touched
    }

    /// Removes the object wherever it is; returns its group if it was held.
    fn remove(&mut self, ns: &str, name: &str) -> Vec<GroupKey> {
        let Some(group) = self.located.remove(&(ns.to_string(), name.to_string())) else {
            return Vec::new();
        };
        let key = (ns.to_string(), group);
        if let Some(members) = self.groups.get_mut(&key) {
            members.remove(name);
            if members.is_empty() {
                self.groups.remove(&key);
            }
        }
        vec![key]
    }
}

pub struct Cache<K> {
    store: Store<K>,
    relist: Option<Store<K>>,
    ready: bool,
    group_of: fn(&K) -> Option<String>,
    /// when the last complete listing was applied
    last_list: Option<Instant>,
    /// the watch's current failure, cleared by the next complete listing
    error: Option<String>,
}

/// The group of a Service or Endpoints: its own name.
pub fn by_name<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().name.clone()
}

/// The group of an EndpointSlice: the Service it belongs to.
pub fn by_service_label<K: Resource>(obj: &K) -> Option<String> {
    obj.meta()
        .labels
        .as_ref()?
        .get("kubernetes.io/service-name")
        .cloned()
}

fn ids<K: Resource>(obj: &K) -> Option<(String, String)> {
    Some((obj.meta().namespace.clone()?, obj.meta().name.clone()?))
}

impl<K: Resource> Cache<K> {
    pub fn new(group_of: fn(&K) -> Option<String>) -> Self {
        Self {
            store: Store::new(),
            relist: None,
            ready: false,
            group_of,
            last_list: None,
            error: None,
        }
    }

    /// True once a first complete listing has been applied.
    pub fn ready(&self) -> bool {
        self.ready
    }

    /// Applies one watch event; returns the groups whose content changed.
    pub fn apply(&mut self, event: Event<K>) -> Vec<GroupKey> {
        match event {
            Event::Init => {
                self.relist = Some(Store::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                if let Some(buf) = self.relist.as_mut() {
                    buf.insert(self.group_of, obj);
                }
                Vec::new()
            }
            Event::InitDone => {
                let Some(new) = self.relist.take() else {
                    return Vec::new();
                };
                let old = std::mem::replace(&mut self.store, new);
                self.ready = true;
                self.last_list = Some(Instant::now());
                self.error = None;
                changed_groups(&old.groups, &self.store.groups)
            }
            Event::Apply(obj) => self.store.insert(self.group_of, obj),
            Event::Delete(obj) => match ids(&obj) {
                Some((ns, name)) => self.store.remove(&ns, &name),
                None => Vec::new(),
            },
        }
    }

    /// Records that the watch is failing (the cached view stays as it was).
    pub fn failed(&mut self, error: String) {
        self.error = Some(error);
    }

    /// The watch's current failure, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// When the last complete listing was applied.
    pub fn last_list(&self) -> Option<Instant> {
        self.last_list
    }

    /// Every object of a group (the slices of one service), in name order.
    pub fn group(&self, key: &GroupKey) -> Vec<Arc<K>> {
        self.store
            .groups
            .get(key)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The object of a group named like the group (the Service or Endpoints itself).
    pub fn named(&self, key: &GroupKey) -> Option<Arc<K>> {
        self.store.groups.get(key)?.get(&key.1).cloned()
    }

    pub fn keys(&self) -> impl Iterator<Item = &GroupKey> {
        self.store.groups.keys()
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.store.located.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.located.is_empty()
    }
}

fn changed_groups<K: Resource>(old: &Groups<K>, new: &Groups<K>) -> Vec<GroupKey> {
    let versions = |m: &BTreeMap<String, Arc<K>>| -> Vec<(String, Option<String>)> {
        m.iter()
            .map(|(n, o)| (n.clone(), o.meta().resource_version.clone()))
            .collect()
    };
    let all: HashSet<&GroupKey> = old.keys().chain(new.keys()).collect();
    all.into_iter()
        .filter(|k| old.get(*k).map(versions) != new.get(*k).map(versions))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Service;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use serde_json::json;

    fn svc(ns: &str, name: &str, rv: &str) -> Service {
        serde_json::from_value(
            json!({"metadata": {"namespace": ns, "name": name, "resourceVersion": rv}}),
        )
        .unwrap()
    }

    fn slice(ns: &str, name: &str, service: &str, rv: &str) -> EndpointSlice {
        serde_json::from_value(json!({
            "metadata": {"namespace": ns, "name": name, "resourceVersion": rv,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": []
        }))
        .unwrap()
    }

    fn key(ns: &str, name: &str) -> GroupKey {
        (ns.into(), name.into())
    }

    #[test]
    fn managed_fields_are_not_kept_and_deletes_find_their_group() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        let mut s = slice("a", "x-1", "x", "1");
        s.metadata.managed_fields = Some(vec![Default::default()]);
        c.apply(Event::Apply(s));
        let held = c.group(&key("a", "x"));
        assert_eq!(held.len(), 1);
        assert!(held[0].metadata.managed_fields.is_none());
        // a delete event whose object lost its label still removes it from its group
        let mut gone = slice("a", "x-1", "x", "2");
        gone.metadata.labels = None;
        assert_eq!(c.apply(Event::Delete(gone)), vec![key("a", "x")]);
        assert!(c.is_empty());
        assert_eq!(c.len(), 0);
    }

    #[test]
    fn not_ready_until_the_first_complete_listing() {
        let mut c = Cache::new(by_name::<Service>);
        c.apply(Event::Init);
        c.apply(Event::InitApply(svc("a", "x", "1")));
        assert!(!c.ready());
        assert!(
            c.named(&key("a", "x")).is_none(),
            "a partial listing is not visible"
        );
        let touched = c.apply(Event::InitDone);
        assert!(c.ready());
        assert_eq!(touched, vec![key("a", "x")]);
        assert!(c.named(&key("a", "x")).is_some());
    }

    #[test]
    fn a_relist_keeps_the_old_view_until_complete_then_reports_only_changes() {
        let mut c = Cache::new(by_name::<Service>);
        for e in [
            Event::Init,
            Event::InitApply(svc("a", "x", "1")),
            Event::InitApply(svc("a", "y", "1")),
            Event::InitDone,
        ] {
            c.apply(e);
        }
        c.apply(Event::Init);
        c.apply(Event::InitApply(svc("a", "x", "1")));
        // the remote is cut here: the relist never completes
        assert!(
            c.named(&key("a", "y")).is_some(),
            "an incomplete relist hides nothing"
        );
        c.apply(Event::Init);
        c.apply(Event::InitApply(svc("a", "x", "2")));
        let mut touched = c.apply(Event::InitDone);
        touched.sort();
        assert_eq!(
            touched,
            vec![key("a", "x"), key("a", "y")],
            "x changed, y is gone"
        );
        assert!(c.named(&key("a", "y")).is_none());
    }

    #[test]
    fn slices_group_under_their_service() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        c.apply(Event::Init);
        c.apply(Event::InitDone);
        assert_eq!(
            c.apply(Event::Apply(slice("a", "web-1", "web", "1"))),
            vec![key("a", "web")]
        );
        c.apply(Event::Apply(slice("a", "web-2", "web", "1")));
        c.apply(Event::Apply(slice("b", "web-1", "web", "1")));
        assert_eq!(c.group(&key("a", "web")).len(), 2);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.apply(Event::Delete(slice("a", "web-1", "web", "2"))),
            vec![key("a", "web")]
        );
        assert_eq!(c.group(&key("a", "web")).len(), 1);
        c.apply(Event::Delete(slice("a", "web-2", "web", "2")));
        assert!(c.group(&key("a", "web")).is_empty());
        assert_eq!(c.keys().count(), 1, "empty groups are dropped");
    }

    #[test]
    fn a_slice_moved_to_another_service_leaves_its_old_group() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        c.apply(Event::Apply(slice("a", "s", "one", "1")));
        let mut touched = c.apply(Event::Apply(slice("a", "s", "two", "2")));
        touched.sort();
        assert_eq!(touched, vec![key("a", "one"), key("a", "two")]);
        assert!(c.group(&key("a", "one")).is_empty());
    }
}
