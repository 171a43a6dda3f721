//! In-memory caches fed by watch events, grouped by the key a reconcile works on
//! (namespace + exported Service/follower Service name). Pure: no I/O, tested by feeding events.
//!
//! A re-list (watch restart) is buffered and swapped in only when complete, so a cache never
//! shows a partial listing: an object is absent only after a delete event or a complete listing
//! that lacks it (the proof the deletion invariant needs).
//!
//! Objects are held as JSON compressed against the first object of their listing (see
//! [`Entry`]): the objects of one cache are near copies of each other, so what is left of each
//! is mostly its names, uids and addresses.
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use kube::Resource;
use kube::api::ObjectMeta;
use kube::runtime::watcher::Event;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::ready::Flag;
use crate::desired::SERVICE_NAME_LABEL;

/// (namespace, service name)
pub type GroupKey = (String, String);

/// A cached object read back, with what went wrong if it could not be.
#[derive(Debug, thiserror::Error)]
#[error("cached object {namespace}/{name} cannot be read back: {source}")]
pub struct CacheError {
    namespace: String,
    name: String,
    source: ReadBack,
}

/// Why a held object could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum ReadBack {
    #[error("its compressed JSON is damaged: {0}")]
    Packed(String),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
}

/// One cached object, held as its JSON (without managedFields, which nothing here reads),
/// LZ4-compressed against its store's dictionary (the first object of the listing: followers
/// differ only in names, uids, versions and addresses), and its resourceVersion, in one
/// allocation. A k8s-openapi object in memory takes five to ten times its JSON size; a reconcile
/// decodes only the few objects of its own key. The measurements behind this are in
/// docs/benchmarks.md (the memory notes).
struct Entry {
    /// the name, the resourceVersion, then the packed JSON: the JSON's length (4 bytes, little
    /// endian) and its LZ4 block
    data: Box<[u8]>,
    name_len: u32,
    /// u32::MAX: no resourceVersion
    version_len: u32,
    /// what it counts against a budget (a slice: its endpoints)
    weight: u32,
}

impl Entry {
    fn new(name: &str, version: Option<&str>, packed: &[u8], weight: usize) -> Self {
        let version_bytes = version.unwrap_or_default().as_bytes();
        let mut data = Vec::with_capacity(name.len() + version_bytes.len() + packed.len());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(version_bytes);
        data.extend_from_slice(packed);
        let len = |s: &str| u32::try_from(s.len()).unwrap_or(u32::MAX);
        Self {
            data: data.into_boxed_slice(),
            name_len: len(name),
            version_len: version.map_or(u32::MAX, len),
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
        }
    }

    /// The bytes it costs: its data, and about as much again for the entry, its group's key and
    /// the map slots that hold them.
    fn cost(&self) -> usize {
        self.data.len() + ENTRY_OVERHEAD + 2 * self.name_len as usize
    }

    fn name(&self) -> &str {
        let end = (self.name_len as usize).min(self.data.len());
        std::str::from_utf8(&self.data[..end]).unwrap_or_default()
    }

    fn version(&self) -> Option<&str> {
        if self.version_len == u32::MAX {
            return None;
        }
        let start = (self.name_len as usize).min(self.data.len());
        let end = (start + self.version_len as usize).min(self.data.len());
        std::str::from_utf8(&self.data[start..end]).ok()
    }

    fn packed(&self) -> &[u8] {
        let version = if self.version_len == u32::MAX {
            0
        } else {
            self.version_len as usize
        };
        let start = (self.name_len as usize + version).min(self.data.len());
        &self.data[start..]
    }
}

/// What one entry costs besides its data (the entry itself, a map slot, its group's key).
const ENTRY_OVERHEAD: usize = 128;

/// The largest JSON an entry may claim to unpack to: far above any object the API server
/// stores (etcd's limit is 1.5 MiB), so a damaged length is an error, not a huge allocation.
const MAX_JSON: usize = 64 << 20;

/// The JSON compressed against `dict`, its length first.
fn pack(json: &[u8], dict: &[u8]) -> Box<[u8]> {
    let Ok(len) = u32::try_from(json.len()) else {
        // not an object the API server would send; held as an entry that fails to read back
        return Box::default();
    };
    let block = lz4_flex::block::compress_with_dict(json, dict);
    let mut out = Vec::with_capacity(4 + block.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&block);
    out.into_boxed_slice()
}

fn unpack(packed: &[u8], dict: &[u8]) -> Result<Vec<u8>, ReadBack> {
    let (len, block) = packed
        .split_first_chunk::<4>()
        .ok_or_else(|| ReadBack::Packed("no length".into()))?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > MAX_JSON {
        return Err(ReadBack::Packed(format!("a length of {len} bytes")));
    }
    let json = lz4_flex::block::decompress_with_dict(block, len, dict)
        .map_err(|e| ReadBack::Packed(e.to_string()))?;
    if json.len() != len {
        return Err(ReadBack::Packed(format!(
            "{} bytes where {len} were written",
            json.len()
        )));
    }
    Ok(json)
}

/// The members of one group, in name order (a Service group has one; a slice group a few).
type Members = Vec<Entry>;

/// Objects by group, with an index from (namespace, name) to the group of every object whose
/// group is not its own name (slices), so an update or delete finds its object in constant time
/// at any cache size; an object grouped under its own name (Services) needs no index entry.
struct Store {
    groups: HashMap<GroupKey, Members>,
    located: HashMap<(String, String), String>,
    /// what every entry is compressed against: the JSON of the first object this store held
    /// (a listing's first object, usually), fixed for the store's life
    dict: Option<Box<[u8]>>,
    /// objects held, the sum of their weights and of their costs (with the dictionary's)
    len: usize,
    weight: usize,
    bytes: usize,
}

impl Store {
    fn new() -> Self {
        Self {
            groups: HashMap::new(),
            located: HashMap::new(),
            dict: None,
            len: 0,
            weight: 0,
            bytes: 0,
        }
    }

    fn count_in(&mut self, e: &Entry) {
        self.len += 1;
        self.weight += e.weight as usize;
        self.bytes += e.cost();
    }

    fn count_out(&mut self, e: &Entry) {
        self.len = self.len.saturating_sub(1);
        self.weight = self.weight.saturating_sub(e.weight as usize);
        self.bytes = self.bytes.saturating_sub(e.cost());
    }

    fn dict(&self) -> &[u8] {
        self.dict.as_deref().unwrap_or_default()
    }

    /// The group an object is held in, if it is held.
    fn locate(&self, ns: &str, name: &str) -> Option<String> {
        let id = (ns.to_string(), name.to_string());
        if let Some(g) = self.located.get(&id) {
            return Some(g.clone());
        }
        self.member(&id, name).map(|_| id.1)
    }

    /// True when `name` is held in `group` at the resourceVersion `meta` carries.
    fn holds(&self, group: &GroupKey, name: &str, meta: &ObjectMeta) -> bool {
        let version = meta.resource_version.as_deref();
        version.is_some()
            && self
                .member(group, name)
                .is_some_and(|e| e.version() == version)
    }

    /// The object `name` among the members of `group`.
    fn member(&self, group: &GroupKey, name: &str) -> Option<&Entry> {
        self.groups.get(group)?.iter().find(|e| e.name() == name)
    }

    /// Stores the object; returns the groups whose content changed: the object's group and, if
    /// it moved (a slice relabelled to another service), its old one.
    fn insert<K: Resource + Serialize>(&mut self, how: &Keeping<K>, mut obj: K) -> Vec<GroupKey> {
        let group_of = how.group_of;
        let Some((ns, name)) = ids(&obj) else {
            return Vec::new();
        };
        let new_group = group_of(&obj);
        let mut touched = Vec::new();
        if let Some(old) = self.locate(&ns, &name) {
            if Some(&old) != new_group.as_ref() {
                touched.extend(self.remove(&ns, &name));
            } else if self.holds(&(ns.clone(), old), &name, obj.meta()) {
                // the same resourceVersion is the same object: the watch event of our own
                // write, already stored when the write returned, changes nothing, wakes nobody
                return touched;
            }
        }
        let Some(group) = new_group else {
            return touched;
        };
        obj.meta_mut().managed_fields = None;
        if how.lean {
            // a remote's annotations: nothing reads them, so a flood of them costs nothing here
            obj.meta_mut().annotations = None;
        }
        let weight = (how.weigh)(&obj);
        // a k8s-openapi object always serializes; were one not to, it is held as an empty entry
        // that fails to read back: its reconcile then fails and is retried, and nothing is
        // deleted because of it (leaving it out would make its exported Service look gone)
        let json = serde_json::to_vec(&obj).unwrap_or_default();
        if self.dict.is_none() {
            self.bytes += json.len();
        }
        let dict = self.dict.get_or_insert_with(|| json.as_slice().into());
        let entry = Entry::new(
            &name,
            obj.meta().resource_version.as_deref(),
            &pack(&json, dict),
            weight,
        );
        self.count_in(&entry);
        let key = (ns.clone(), group.clone());
        // most groups have one member: a Vec would reserve four at its first push
        let members = self
            .groups
            .entry(key.clone())
            .or_insert_with(|| Vec::with_capacity(1));
        let replaced = match members.binary_search_by(|e| e.name().cmp(name.as_str())) {
            Ok(i) => Some(std::mem::replace(&mut members[i], entry)),
            Err(i) => {
                members.insert(i, entry);
                None
            }
        };
        if let Some(old) = replaced {
            self.count_out(&old);
        }
        if group != name {
            self.located.insert((ns, name), group);
        }
        touched.push(key);
        touched
    }

    /// Removes the object wherever it is; returns its group if it was held.
    fn remove(&mut self, ns: &str, name: &str) -> Vec<GroupKey> {
        let Some(group) = self.locate(ns, name) else {
            return Vec::new();
        };
        self.located.remove(&(ns.to_string(), name.to_string()));
        let key = (ns.to_string(), group);
        let mut gone = Vec::new();
        if let Some(members) = self.groups.get_mut(&key) {
            if let Some(i) = members.iter().position(|e| e.name() == name) {
                gone.push(members.remove(i));
            }
            if members.is_empty() {
                self.groups.remove(&key);
            }
        }
        for e in &gone {
            self.count_out(e);
        }
        vec![key]
    }
}

/// How a cache keeps its objects.
struct Keeping<K> {
    group_of: fn(&K) -> Option<String>,
    /// what an object counts against a budget
    weigh: fn(&K) -> usize,
    /// drop annotations before keeping (a remote's objects: nothing reads theirs)
    lean: bool,
}

/// What one cache holds, for a budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// objects (the larger of the view and a listing in progress)
    pub objects: usize,
    /// the sum of their weights (likewise)
    pub weight: usize,
    /// what the view and a listing in progress cost together
    pub bytes: usize,
}

pub struct Cache<K> {
    store: Store,
    relist: Option<Store>,
    /// set by the first complete listing, cleared when evicted: awaited through [`Cache::readiness`]
    ready: Flag,
    how: Keeping<K>,
    /// when the last complete listing was applied
    last_list: Option<Instant>,
    /// the watch's current failure, cleared by the next complete listing
    error: Option<String>,
    kind: PhantomData<fn() -> K>,
}

/// The group of a Service or Endpoints: its own name.
pub fn by_name<K: Resource>(obj: &K) -> Option<String> {
    obj.meta().name.clone()
}

/// The group of an EndpointSlice: the Service it belongs to.
pub fn by_service_label<K: Resource>(obj: &K) -> Option<String> {
    service_of(obj.meta())
}

/// The Service a slice belongs to (its `kubernetes.io/service-name` label).
pub fn service_of(meta: &ObjectMeta) -> Option<String> {
    meta.labels.as_ref()?.get(SERVICE_NAME_LABEL).cloned()
}

fn ids<K: Resource>(obj: &K) -> Option<(String, String)> {
    Some((obj.meta().namespace.clone()?, obj.meta().name.clone()?))
}

impl<K: Resource> Cache<K> {
    pub fn new(group_of: fn(&K) -> Option<String>) -> Self {
        Self {
            store: Store::new(),
            relist: None,
            ready: Flag::default(),
            how: Keeping {
                group_of,
                weigh: |_| 0,
                lean: false,
            },
            last_list: None,
            error: None,
            kind: PhantomData,
        }
    }

    /// A cache of a remote's objects: their annotations are not kept, and each counts `weigh`
    /// of it against the remote's budget.
    pub fn lean(mut self, weigh: fn(&K) -> usize) -> Self {
        self.how.lean = true;
        self.how.weigh = weigh;
        self
    }

    /// What it holds, for a budget.
    pub fn held(&self) -> Held {
        let (len, weight, bytes) = self
            .relist
            .as_ref()
            .map_or((0, 0, 0), |r| (r.len, r.weight, r.bytes));
        Held {
            objects: self.store.len.max(len),
            weight: self.store.weight.max(weight),
            bytes: self.store.bytes + bytes,
        }
    }

    /// Drops everything it holds (its remote went over budget): it proves nothing until its
    /// next complete listing, and says why.
    pub fn evict(&mut self, why: String) {
        self.store = Store::new();
        self.relist = None;
        self.ready.set(false);
        self.error = Some(why);
    }

    /// True once a first complete listing has been applied.
    pub fn ready(&self) -> bool {
        self.ready.get()
    }

    /// Follows [`Cache::ready`]: what a task that needs this cache listed waits on.
    pub fn readiness(&self) -> watch::Receiver<bool> {
        self.ready.watch()
    }

    /// Records that the watch is failing (the cached view stays as it was).
    pub fn failed(&mut self, error: String) {
        self.error = Some(error);
    }

    /// The watch is current again without a relist (a resumed watch was accepted).
    pub fn recovered(&mut self) {
        self.error = None;
    }

    /// The watch's current failure, if any.
    pub fn error(&self) -> Option<&str> {
        self.error.as_deref()
    }

    /// None when its watch is listed and not failing; otherwise why not (for /readyz), the
    /// objects it holds called `what`.
    pub fn problem(&self, what: &str) -> Option<String> {
        match (self.ready(), self.error()) {
            (_, Some(e)) => Some(format!("watch of {what} failing: {e}")),
            (false, None) => Some(format!("first listing of {what} not complete")),
            (true, None) => None,
        }
    }

    /// When the last complete listing was applied.
    pub fn last_list(&self) -> Option<Instant> {
        self.last_list
    }

    /// Whether a group is held (nothing decoded).
    pub fn contains(&self, key: &GroupKey) -> bool {
        self.store.groups.contains_key(key)
    }

    pub fn keys(&self) -> impl Iterator<Item = &GroupKey> {
        self.store.groups.keys()
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.store.len
    }

    pub fn is_empty(&self) -> bool {
        self.store.groups.is_empty()
    }
}

/// Reading and writing objects: they are held as JSON.
impl<K: Resource + Serialize + DeserializeOwned> Cache<K> {
    /// Applies one watch event; returns the groups whose content changed.
    pub fn apply(&mut self, event: Event<K>) -> Vec<GroupKey> {
        match event {
            Event::Init => {
                self.relist = Some(Store::new());
                Vec::new()
            }
            Event::InitApply(obj) => {
                if let Some(buf) = self.relist.as_mut() {
                    buf.insert(&self.how, obj);
                }
                Vec::new()
            }
            Event::InitDone => {
                let Some(new) = self.relist.take() else {
                    return Vec::new();
                };
                let old = std::mem::replace(&mut self.store, new);
                self.ready.set(true);
                self.last_list = Some(Instant::now());
                self.error = None;
                changed_groups(&old.groups, &self.store.groups)
            }
            Event::Apply(obj) => self.store.insert(&self.how, obj),
            Event::Delete(obj) => match ids(&obj) {
                Some((ns, name)) => self.store.remove(&ns, &name),
                None => Vec::new(),
            },
        }
    }

    /// Every object of a group (the slices of one service), in name order.
    pub fn group(&self, key: &GroupKey) -> Result<Vec<Arc<K>>, CacheError> {
        let dict = self.store.dict();
        self.store
            .groups
            .get(key)
            .map(|m| m.iter().map(|e| decode(&key.0, e, dict)).collect())
            .unwrap_or_else(|| Ok(Vec::new()))
    }

    /// The object of a group named like the group (the Service or Endpoints itself).
    pub fn named(&self, key: &GroupKey) -> Result<Option<Arc<K>>, CacheError> {
        let Some(members) = self.store.groups.get(key) else {
            return Ok(None);
        };
        members
            .iter()
            .find(|e| e.name() == key.1)
            .map(|e| decode(&key.0, e, self.store.dict()))
            .transpose()
    }
}

fn decode<K: DeserializeOwned>(
    namespace: &str,
    e: &Entry,
    dict: &[u8],
) -> Result<Arc<K>, CacheError> {
    unpack(e.packed(), dict)
        .and_then(|json| Ok(serde_json::from_slice(&json)?))
        .map(Arc::new)
        .map_err(|source| CacheError {
            namespace: namespace.to_string(),
            name: e.name().to_string(),
            source,
        })
}

fn changed_groups(
    old: &HashMap<GroupKey, Members>,
    new: &HashMap<GroupKey, Members>,
) -> Vec<GroupKey> {
    let versions = |m: &Members| -> Vec<(String, Option<String>)> {
        m.iter()
            .map(|e| (e.name().to_string(), e.version().map(str::to_string)))
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
        let held = c.group(&key("a", "x")).unwrap();
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
            c.named(&key("a", "x")).unwrap().is_none(),
            "a partial listing is not visible"
        );
        let touched = c.apply(Event::InitDone);
        assert!(c.ready());
        assert_eq!(touched, vec![key("a", "x")]);
        assert!(c.named(&key("a", "x")).unwrap().is_some());
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
            c.named(&key("a", "y")).unwrap().is_some(),
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
        assert!(c.named(&key("a", "y")).unwrap().is_none());
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
        assert_eq!(c.group(&key("a", "web")).unwrap().len(), 2);
        assert_eq!(c.len(), 3);
        assert_eq!(
            c.apply(Event::Delete(slice("a", "web-1", "web", "2"))),
            vec![key("a", "web")]
        );
        assert_eq!(c.group(&key("a", "web")).unwrap().len(), 1);
        c.apply(Event::Delete(slice("a", "web-2", "web", "2")));
        assert!(c.group(&key("a", "web")).unwrap().is_empty());
        assert_eq!(c.keys().count(), 1, "empty groups are dropped");
    }

    #[test]
    fn a_slice_moved_to_another_service_leaves_its_old_group() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        c.apply(Event::Apply(slice("a", "s", "one", "1")));
        let mut touched = c.apply(Event::Apply(slice("a", "s", "two", "2")));
        touched.sort();
        assert_eq!(touched, vec![key("a", "one"), key("a", "two")]);
        assert!(c.group(&key("a", "one")).unwrap().is_empty());
    }

    #[test]
    fn objects_read_back_as_stored_and_services_need_no_index() {
        let mut c = Cache::new(by_name::<Service>);
        let s: Service = serde_json::from_value(json!({
            "metadata": {"namespace": "a", "name": "web", "resourceVersion": "7",
                         "labels": {"app": "web"}, "annotations": {"note": "x"}},
            "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
                     "sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 30}}}
        }))
        .unwrap();
        c.apply(Event::Apply(s.clone()));
        assert_eq!(*c.named(&key("a", "web")).unwrap().unwrap(), s);
        assert!(
            c.store.located.is_empty(),
            "a Service is found by its own name"
        );
        assert_eq!(c.apply(Event::Delete(s)), vec![key("a", "web")]);
        assert!(c.named(&key("a", "web")).unwrap().is_none());
        assert!(c.is_empty());
    }

    #[test]
    fn a_group_lists_its_members_in_name_order_and_counts_each_once() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        for n in ["web-c", "web-a", "web-b", "web-a"] {
            c.apply(Event::Apply(slice("a", n, "web", "1")));
        }
        let names: Vec<String> = c
            .group(&key("a", "web"))
            .unwrap()
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names, ["web-a", "web-b", "web-c"]);
        assert_eq!(c.len(), 3);
        // a slice named like its service is still found once it moves away
        c.apply(Event::Apply(slice("a", "web", "web", "1")));
        c.apply(Event::Apply(slice("a", "web", "other", "2")));
        assert_eq!(c.group(&key("a", "web")).unwrap().len(), 3);
        assert_eq!(c.group(&key("a", "other")).unwrap().len(), 1);
        assert_eq!(c.len(), 4);
    }

    #[test]
    fn the_same_version_again_changes_nothing() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        assert_eq!(
            c.apply(Event::Apply(slice("a", "web-1", "web", "5"))),
            vec![key("a", "web")]
        );
        // the watch event of a write already stored from the write's response
        assert!(
            c.apply(Event::Apply(slice("a", "web-1", "web", "5")))
                .is_empty()
        );
        assert_eq!(
            c.apply(Event::Apply(slice("a", "web-1", "web", "6"))),
            vec![key("a", "web")]
        );
        // the same version under another service is a move, not a repeat
        let moved = c.apply(Event::Apply(slice("a", "web-1", "api", "6")));
        assert_eq!(moved.len(), 2);
    }

    #[test]
    fn similar_objects_are_held_in_a_fraction_of_their_json_and_read_back_whole() {
        let follower = |i: usize, rv: &str| -> EndpointSlice {
            serde_json::from_value(json!({
                "metadata": {"namespace": "shop", "name": format!("web-{i}-east-abcde"), "resourceVersion": rv,
                             "uid": format!("1d5c4f0e-8f3a-4c1b-9d7e-{i:012}"),
                             "creationTimestamp": "2026-01-01T00:00:00Z",
                             "labels": {"kubernetes.io/service-name": format!("web-{i}"),
                                        "fair.com/cross-cluster": "follower",
                                        "endpointslice.kubernetes.io/managed-by": "cross-cluster-controller.fair.com"},
                             "annotations": {"fair.com/cross-cluster-origin-cluster": "east",
                                             "fair.com/cross-cluster-origin-object": format!("shop/web-{i}")}},
                "addressType": "IPv4",
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
                "endpoints": [{"addresses": [format!("10.1.{}.{}", i / 250, i % 250)], "conditions": {"ready": true}}]
            }))
            .unwrap()
        };
        let mut c = Cache::new(by_service_label::<EndpointSlice>);
        c.apply(Event::Init);
        for i in 0..100 {
            c.apply(Event::InitApply(follower(i, "1")));
        }
        c.apply(Event::InitDone);
        let json: usize = (0..100)
            .map(|i| serde_json::to_vec(&follower(i, "1")).unwrap().len())
            .sum();
        let held: usize = c
            .store
            .groups
            .values()
            .flatten()
            .map(|e| e.packed().len())
            .sum();
        assert!(
            held * 3 < json,
            "{held} bytes held for {json} bytes of JSON"
        );
        // the object the dictionary came from goes; the others still read back whole
        c.apply(Event::Delete(follower(0, "2")));
        for i in 1..100 {
            let g = key("shop", &format!("web-{i}"));
            assert_eq!(*c.group(&g).unwrap()[0], follower(i, "1"));
        }
        // a relist builds a store (and dictionary) of its own
        c.apply(Event::Init);
        c.apply(Event::InitApply(follower(7, "3")));
        c.apply(Event::InitDone);
        assert_eq!(c.len(), 1);
        assert_eq!(
            *c.group(&key("shop", "web-7")).unwrap()[0],
            follower(7, "3")
        );
    }

    #[test]
    fn an_entry_holds_name_version_and_data_apart() {
        let e = Entry::new("web-1", Some("42"), b"packed", 0);
        assert_eq!(
            (e.name(), e.version(), e.packed()),
            ("web-1", Some("42"), &b"packed"[..])
        );
        let e = Entry::new("web-1", None, b"", 0);
        assert_eq!(
            (e.name(), e.version(), e.packed()),
            ("web-1", None, &b""[..])
        );
        let e = Entry::new("web-1", Some(""), b"p", 0);
        assert_eq!(
            (e.name(), e.version(), e.packed()),
            ("web-1", Some(""), &b"p"[..])
        );
    }

    #[test]
    fn an_unreadable_entry_is_an_error_not_an_absence() {
        let mut c = Cache::new(by_name::<Service>);
        c.apply(Event::Apply(svc("a", "x", "1")));
        let dict = c.store.dict().to_vec();
        if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
            m[0] = Entry::new("x", Some("1"), &pack(b"{not json", &dict), 0);
        }
        assert!(c.named(&key("a", "x")).is_err());
        // damaged compressed data, and a length far beyond any object
        for damaged in [&b"\x09\0\0\0\xff\xff"[..], b"\xff\xff\xff\xff{not", b"{n"] {
            if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
                m[0] = Entry::new("x", Some("1"), damaged, 0);
            }
            assert!(c.named(&key("a", "x")).is_err());
        }
        // what an object that failed to serialize is held as
        if let Some(m) = c.store.groups.get_mut(&key("a", "x")) {
            m[0] = Entry::new("x", Some("1"), &[], 0);
        }
        assert!(c.named(&key("a", "x")).is_err());
    }

    fn endpoints(s: &EndpointSlice) -> usize {
        s.endpoints.len()
    }

    fn slice_with(name: &str, rv: &str, ips: usize) -> EndpointSlice {
        let mut s = slice("a", name, "x", rv);
        s.endpoints = (0..ips)
            .map(|i| serde_json::from_value(json!({"addresses": [format!("10.0.0.{i}")]})).unwrap())
            .collect();
        s
    }

    #[test]
    fn a_lean_cache_keeps_no_annotations_and_counts_what_it_holds() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>).lean(endpoints);
        let mut big = slice_with("x-1", "1", 3);
        big.metadata.annotations = Some([("flood".to_string(), "x".repeat(100_000))].into());
        c.apply(Event::Apply(big));
        let held = c.group(&key("a", "x")).unwrap();
        assert!(held[0].metadata.annotations.is_none());
        let h = c.held();
        assert_eq!((h.objects, h.weight), (1, 3));
        assert!(
            h.bytes < 2_000,
            "{h:?}: the annotation is not counted, it is not held"
        );
        // replaced, then a second object, then a delete: the figures follow
        c.apply(Event::Apply(slice_with("x-1", "2", 5)));
        c.apply(Event::Apply(slice_with("x-2", "1", 2)));
        assert_eq!((c.held().objects, c.held().weight), (2, 7));
        c.apply(Event::Delete(slice_with("x-1", "3", 0)));
        assert_eq!((c.held().objects, c.held().weight), (1, 2));
        // a listing in progress counts as much as the view, or more, and costs besides it
        let before = c.held().bytes;
        c.apply(Event::Init);
        for (i, n) in [4, 4, 4].iter().enumerate() {
            c.apply(Event::InitApply(slice_with(&format!("y-{i}"), "1", *n)));
        }
        let h = c.held();
        assert_eq!((h.objects, h.weight), (3, 12));
        assert!(h.bytes > before, "{h:?}");
        c.apply(Event::InitDone);
        assert_eq!((c.held().objects, c.held().weight), (3, 12));
        // a local cache keeps annotations (its followers' origin annotations are read)
        let mut local = Cache::new(by_name::<Service>);
        let mut s = svc("a", "x", "1");
        s.metadata.annotations = Some([("note".to_string(), "kept".to_string())].into());
        local.apply(Event::Apply(s));
        let kept = local.named(&key("a", "x")).unwrap().unwrap();
        assert!(kept.metadata.annotations.is_some());
    }

    #[test]
    fn an_evicted_cache_holds_nothing_and_proves_nothing() {
        let mut c = Cache::new(by_service_label::<EndpointSlice>).lean(endpoints);
        c.apply(Event::Init);
        c.apply(Event::InitApply(slice_with("x-1", "1", 3)));
        c.apply(Event::InitDone);
        assert!(c.ready());
        c.evict("over budget".into());
        assert!(!c.ready());
        assert_eq!(c.held(), Held::default());
        assert_eq!(
            c.problem("slices").as_deref(),
            Some("watch of slices failing: over budget")
        );
    }
}
