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
mod tests;
