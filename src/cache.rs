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

pub struct Cache<K> {
    groups: Groups<K>,
    relist: Option<Groups<K>>,
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
            groups: HashMap::new(),
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

    fn insert(
        groups: &mut Groups<K>,
        group_of: fn(&K) -> Option<String>,
        obj: K,
    ) -> Option<GroupKey> {
        let (ns, name) = ids(&obj)?;
        let group = group_of(&obj)?;
        let key = (ns, group);
        groups
            .entry(key.clone())
            .or_default()
            .insert(name, Arc::new(obj));
        Some(key)
    }

    /// Removes the object wherever it is (its group may have changed since it was stored).
    fn remove(groups: &mut Groups<K>, ns: &str, name: &str) -> Vec<GroupKey> {
        let mut touched = Vec::new();
        groups.retain(|key, members| {
            if key.0 == ns && members.remove(name).is_some() {
                touched.push(key.clone());
            }
            !members.is_empty()
        });
        touched
    }

    /// Applies one watch event; returns the groups whose content changed.
    pub fn apply(&mut self, event: Event<K>) -> Vec<GroupKey> {
        match event {
            Event::Init => {
                self.relist = Some(HashMap::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                if let Some(buf) = self.relist.as_mut() {
                    Self::insert(buf, self.group_of, obj);
                }
                Vec::new()
            }
            Event::InitDone => {
                let Some(new) = self.relist.take() else {
                    return Vec::new();
                };
                let old = std::mem::replace(&mut self.groups, new);
                self.ready = true;
                self.last_list = Some(Instant::now());
                self.error = None;
                changed_groups(&old, &self.groups)
            }
            Event::Apply(obj) => {
                let Some((ns, name)) = ids(&obj) else {
                    return Vec::new();
                };
                let new_group = (self.group_of)(&obj);
                let mut touched = Vec::new();
                // the group changed (a slice relabelled to another service): drop the old entry
                let moved: Vec<GroupKey> = self
                    .groups
                    .iter()
                    .filter(|(k, m)| {
                        k.0 == ns && m.contains_key(&name) && Some(&k.1) != new_group.as_ref()
                    })
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in moved {
                    touched.extend(Self::remove_from(&mut self.groups, &key, &name));
                }
                touched.extend(Self::insert(&mut self.groups, self.group_of, obj));
                touched
            }
            Event::Delete(obj) => {
                let Some((ns, name)) = ids(&obj) else {
                    return Vec::new();
                };
                match (self.group_of)(&obj) {
                    Some(group) => Self::remove_from(&mut self.groups, &(ns, group), &name),
                    None => Self::remove(&mut self.groups, &ns, &name),
                }
            }
        }
    }

    fn remove_from(groups: &mut Groups<K>, key: &GroupKey, name: &str) -> Vec<GroupKey> {
        let Some(members) = groups.get_mut(key) else {
            return Vec::new();
        };
        if members.remove(name).is_none() {
            return Vec::new();
        }
        if members.is_empty() {
            groups.remove(key);
        }
        vec![key.clone()]
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
        self.groups
            .get(key)
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }

    /// The object of a group named like the group (the Service or Endpoints itself).
    pub fn named(&self, key: &GroupKey) -> Option<Arc<K>> {
        self.groups.get(key)?.get(&key.1).cloned()
    }

    pub fn keys(&self) -> impl Iterator<Item = &GroupKey> {
        self.groups.keys()
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.groups.values().map(BTreeMap::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
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
