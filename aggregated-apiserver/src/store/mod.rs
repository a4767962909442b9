//! Storage behind the REST handlers. Handlers talk to [`Store`] (reads) and [`WritableStore`]
//! (writes) only. Stores come in two shapes: the in-memory store, the embedded default, and the
//! [`WatchCache`] of another server's objects on the same engine, fed by a
//! [`watch_cache::Source`] (a view of the cluster's objects; the etcd store, which adds
//! compare-and-swap writes). The contract assumes nothing of memory: revisions and stats are
//! asked for asynchronously, a list cursor may wait for its next page, objects can be made from
//! JSON already encoded, and continue tokens belong to each store. What every store must do is
//! checked by one conformance suite (`tests/it/store_conformance.rs`). [`StorageFactory`] makes
//! each kind's store as the flags say (memory or etcd).

pub(crate) mod converted;
pub mod etcd;
pub(crate) mod factory;
pub(crate) mod informer;
pub mod memory;
pub(crate) mod namespaces;
pub mod selector;
pub(crate) mod view;
pub mod watch_cache;

use std::{
    ops::ControlFlow,
    sync::{Arc, OnceLock},
    task::{Context, Poll},
};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::Serialize;

use crate::{
    error::{Error, Result},
    observe::health::ReadinessCheck,
    resource::{ObjectKey, ServedResource},
    store::selector::Filter,
};

pub use converted::Converted;
pub use etcd::EtcdStore;
pub use factory::StorageFactory;
pub use memory::MemoryStore;
pub use view::{ClusterSource, View, ViewCache};
pub use watch_cache::{CacheState, WatchCache};

/// A watch event's `type`, as kube-apiserver sends it (BOOKMARK and ERROR are not store
/// events: see [`WatchItem`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created, or entered a watcher's selection.
    Added,
    /// The object changed and is still in the watcher's selection.
    Modified,
    /// The object was deleted, or left a watcher's selection; the event carries its last state.
    Deleted,
}

impl EventType {
    /// The wire form: `ADDED`, `MODIFIED` or `DELETED`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// A stored object with its JSON encoding, made once however often the object is read (get,
/// list, and every watcher of its event). The JSON is the one served form a store keeps: a
/// Table row borrows its metadata from it ([`Stored::metadata_json`]), and nothing else read
/// is kept with the object but its conversion to another version ([`Stored::at_version`]).
///
/// `repr(C)` with the JSON first: behind an `Arc`, the JSON's pointer and length are on the
/// first cache line a list touches (see PERFORMANCE.md).
#[repr(C)]
pub struct Stored<K> {
    json: OnceLock<Bytes>,
    object: K,
    /// Where `"metadata"`'s value lies in the JSON (start, length), found on first use.
    metadata_span: OnceLock<(u32, u32)>,
    /// Sorted hashes of its `key=value` labels, for [`crate::store::selector::LabelSelector::may_match`].
    pub label_hashes: Vec<u64>,
    /// The object at the other version its kind is served at, made once ([`Converted`]).
    other_version: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

/// How stores hand out objects: shared, immutable, JSON cached.
pub type Object<K> = Arc<Stored<K>>;

impl<K: kube::Resource> Stored<K> {
    /// Wraps an object as stored, its JSON encoded on first use. The object is final from
    /// here: its JSON and label hashes are made from it once.
    pub fn new(object: K) -> Object<K> {
        Arc::new(Self {
            label_hashes: crate::store::selector::label_hashes(object.meta().labels.as_ref()),
            object,
            json: OnceLock::new(),
            metadata_span: OnceLock::new(),
            other_version: OnceLock::new(),
        })
    }
}

impl<K: kube::Resource> Stored<K> {
    /// An object whose JSON is already at hand (as a durable store reads it): it is not
    /// encoded again. `json` must be `object` as JSON, apiVersion and kind included.
    pub fn from_encoded(object: K, json: Bytes) -> Object<K> {
        let stored = Self::new(object);
        let _ = stored.json.set(json);
        stored
    }
}

impl<K> Stored<K> {
    /// The object itself (also reachable through `Deref`).
    pub fn get(&self) -> &K {
        &self.object
    }
}

impl<K: Serialize> Stored<K> {
    /// The object's JSON (apiVersion and kind included), encoded on first use. Borrowed, not
    /// shared: a list copies it without touching a reference count.
    pub fn json(&self) -> &Bytes {
        self.json.get_or_init(|| {
            let mut out = Vec::with_capacity(512);
            // Serializing our own types into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, &self.object);
            Bytes::from(out)
        })
    }
}

impl<K: kube::Resource + Serialize> Stored<K> {
    /// The object's `metadata` as JSON, a slice of [`Stored::json`] (what a Table row's
    /// PartialObjectMetadata holds, so rows cost no copy kept with the object); None when the
    /// JSON was never made (an object converted for one read) or has no metadata member.
    pub fn metadata_json(&self) -> Option<&[u8]> {
        let json = self.json.get()?;
        let (start, len) = *self.metadata_span.get_or_init(|| metadata_span(json));
        let slice = json.get(start as usize..(start as usize).saturating_add(len as usize))?;
        (len > 0).then_some(slice)
    }
}

/// Where the top-level `"metadata"` member's value lies in `json` (start, length); (0, 0)
/// when it has none.
fn metadata_span(json: &[u8]) -> (u32, u32) {
    #[derive(serde::Deserialize)]
    struct Metadata<'a> {
        #[serde(borrow)]
        metadata: Option<&'a serde_json::value::RawValue>,
    }
    let Ok(Metadata {
        metadata: Some(raw),
    }) = serde_json::from_slice::<Metadata<'_>>(json)
    else {
        return (0, 0);
    };
    let start = (raw.get().as_ptr() as usize).wrapping_sub(json.as_ptr() as usize);
    match (u32::try_from(start), u32::try_from(raw.get().len())) {
        (Ok(start), Ok(len)) if start as usize + len as usize <= json.len() => (start, len),
        _ => (0, 0),
    }
}

/// The value `slot` keeps as a `T`, made by `make` the first time; a slot holding another type
/// (a kind served at a third version) gives a fresh one each time.
fn other_version<T: Send + Sync + 'static>(
    slot: &OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
    make: impl Fn() -> Arc<T>,
) -> Arc<T> {
    let kept = slot
        .get_or_init(|| make() as Arc<dyn std::any::Any + Send + Sync>)
        .clone();
    kept.downcast::<T>().unwrap_or_else(|_| make())
}

impl<K> Stored<K> {
    /// This object at another version, converted by `convert` once however often it is read.
    pub fn at_version<V: kube::Resource + Send + Sync + 'static>(
        &self,
        convert: impl Fn(&K) -> V,
    ) -> Object<V> {
        other_version(&self.other_version, || Stored::new(convert(&self.object)))
    }
}

impl<K> std::ops::Deref for Stored<K> {
    type Target = K;
    fn deref(&self) -> &K {
        &self.object
    }
}

impl<K: Serialize> Serialize for Stored<K> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        self.object.serialize(s)
    }
}

impl<K: std::fmt::Debug> std::fmt::Debug for Stored<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.object.fmt(f)
    }
}

/// One change, at the resourceVersion it produced.
#[derive(Debug)]
pub struct Event<K> {
    /// The resourceVersion the change produced; the object carries the same one.
    pub resource_version: u64,
    /// What happened to the object.
    pub type_: EventType,
    /// The object after the change; for DELETED, its last state.
    pub object: Object<K>,
    /// What a MODIFIED event's object was before: a watcher with a selector sees the change as
    /// ADDED or DELETED when the object enters or leaves its selection.
    pub previous: Option<Object<K>>,
    /// The plain JSON watch line, encoded once however many watchers send it.
    json_line: OnceLock<Bytes>,
    /// The event at the other version its kind is served at, made once for every watcher.
    other_version: OnceLock<Arc<dyn std::any::Any + Send + Sync>>,
}

impl<K: ServedResource> Event<K> {
    /// An event without a previous object (see [`Event::with_previous`]).
    pub fn new(resource_version: u64, type_: EventType, object: Object<K>) -> Self {
        Self {
            resource_version,
            type_,
            object,
            previous: None,
            json_line: OnceLock::new(),
            other_version: OnceLock::new(),
        }
    }

    /// This event with its objects at another version (`convert` converts one), made once
    /// however many watchers of that version send it.
    pub fn at_version<V: ServedResource>(
        &self,
        convert: impl Fn(&Object<K>) -> Object<V>,
    ) -> Arc<Event<V>> {
        other_version(&self.other_version, || {
            Arc::new(
                Event::new(self.resource_version, self.type_, convert(&self.object))
                    .with_previous(self.previous.as_ref().map(&convert)),
            )
        })
    }

    /// A MODIFIED event that replaced `previous`.
    pub fn with_previous(mut self, previous: Option<Object<K>>) -> Self {
        self.previous = previous;
        self
    }

    /// The event's watch line in the kind's own form, made by `render` once however many
    /// watchers send it (`crate::render::watch` writes it).
    pub fn json_line(&self, render: impl FnOnce(&Self) -> Bytes) -> Bytes {
        self.json_line.get_or_init(|| render(self)).clone()
    }
}

/// What a list wants to see, from `resourceVersion` and `resourceVersionMatch`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadAt {
    /// No resourceVersion: the latest state.
    #[default]
    Latest,
    /// `resourceVersion=0`: any state is fine.
    Any,
    /// `resourceVersion=N` (with `resourceVersionMatch=NotOlderThan` or none): a state at N or
    /// later; 504 Too large resource version when the store has not reached N.
    NotOlderThan(u64),
    /// `resourceVersionMatch=Exact`: the state at exactly N; 410 Expired when it is no longer
    /// kept, 504 when the store has not reached it.
    Exact(u64),
}

/// A list as the handlers ask for it, from the path and the ListOptions.
#[derive(Debug, Clone, Default)]
pub struct ListRequest {
    /// Objects in this namespace; None = all namespaces. A cluster-scoped kind's objects are
    /// in the namespace "".
    pub namespace: Option<String>,
    /// The label and field selectors.
    pub filter: Filter,
    /// `limit`: at most this many objects on the page; None or 0 = all of them.
    pub limit: Option<usize>,
    /// `continue`: a token from an earlier page of this store, which fixes the snapshot read
    /// (the handlers refuse a resourceVersion with it); 410 Expired when the snapshot is gone.
    pub continue_token: Option<String>,
    /// Which state to list, from `resourceVersion` and `resourceVersionMatch`.
    pub read_at: ReadAt,
}

/// A list's page: its items and what the list's `metadata` says about them.
#[derive(Debug)]
pub struct ListPage<K> {
    /// The page's objects, in key order (namespace, then name).
    pub items: Vec<Object<K>>,
    /// Its resourceVersion and where the next page starts.
    pub info: PageInfo,
}

/// The `metadata` of a list's page: the snapshot it shows and where the next page starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PageInfo {
    /// The resourceVersion of the snapshot the page was read from.
    pub resource_version: u64,
    /// `continue`: set when more objects may follow; None on the last page.
    pub continue_token: Option<String>,
    /// `remainingItemCount`: objects after this page, when known (never with a selector, as
    /// kube-apiserver).
    pub remaining_item_count: Option<i64>,
}

/// A list read a piece at a time: its `metadata` up front, then its objects, in key order, all
/// from the snapshot the list started on.
pub struct ListCursor<K> {
    /// The list's `metadata`, known before any object is read (no continue token: the list is
    /// whole).
    pub info: PageInfo,
    /// The objects, lent in order.
    pub objects: Box<dyn LendObjects<K>>,
}

/// The objects behind a [`ListCursor`].
pub trait LendObjects<K>: Send {
    /// Lends the next objects to `visit` until it breaks or the list ends: `Ready(Ok(true))`
    /// when the list may go on (a later call lends the objects after the last one lent),
    /// `Ready(Ok(false))` at its end. `Pending` when the next objects are not at hand yet (a
    /// durable store fetching its next page), after arranging for `cx` to be woken; the objects
    /// lent before that stay lent.
    fn poll_lend(
        &mut self,
        cx: &mut Context<'_>,
        visit: &mut dyn FnMut(&Object<K>) -> ControlFlow<()>,
    ) -> Poll<Result<bool>>;
}

impl PageInfo {
    /// The list's `metadata` as sent.
    pub fn list_meta(self) -> ListMeta {
        ListMeta {
            resource_version: Some(self.resource_version.to_string()),
            continue_: self.continue_token,
            remaining_item_count: self.remaining_item_count,
            ..Default::default()
        }
    }
}

/// Where a watch starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatchStart {
    /// Synthetic ADDED events for the current state, then changes (resourceVersion unset or 0,
    /// or `sendInitialEvents=true`).
    InitialState,
    /// Every change after this resourceVersion.
    After(u64),
}

/// A watch as the handlers ask for it.
#[derive(Debug, Clone)]
pub struct WatchRequest {
    /// Changes in this namespace; None = all namespaces.
    pub namespace: Option<String>,
    /// The label and field selectors: an object entering or leaving the selection is seen as
    /// ADDED or DELETED.
    pub filter: Filter,
    /// Initial state first, or changes after a resourceVersion.
    pub start: WatchStart,
}

/// What a watch stream yields, in resourceVersion order.
#[derive(Debug)]
pub enum WatchItem<K> {
    /// A change the watcher selected (shared: many watchers send the same one).
    Event(Arc<Event<K>>),
    /// All initial events were sent; the state they showed is at this resourceVersion.
    InitialEventsEnd(u64),
    /// Nothing the watcher cares about happened up to this resourceVersion.
    Progress(u64),
    /// The watch cannot go on (it fell too far behind: 410 Expired; a version not reached:
    /// Too large resource version): sent as an ERROR event, then the stream ends.
    Error(Error),
}

/// A watch's items. It ends after a [`WatchItem::Error`], or when the store goes away.
pub type WatchStream<K> = BoxStream<'static, WatchItem<K>>;

/// Checks a delete's `preconditions` against the object it would delete: 409 Conflict with
/// kube-apiserver's words when the uid or resourceVersion differs.
pub fn check_preconditions<K: ServedResource>(
    current: &K,
    preconditions: &Preconditions,
) -> Result<()> {
    let meta = current.meta();
    let name = meta.name.as_deref().unwrap_or("");
    if let Some(uid) = &preconditions.uid
        && meta.uid.as_ref() != Some(uid)
    {
        return Err(Error::Conflict {
            subject: K::subject(name),
            message: format!(
                "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                meta.uid.as_deref().unwrap_or("")
            ),
        });
    }
    if let Some(rv) = &preconditions.resource_version
        && meta.resource_version.as_ref() != Some(rv)
    {
        return Err(Error::Conflict {
            subject: K::subject(name),
            message: format!(
                "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                meta.resource_version.as_deref().unwrap_or("")
            ),
        });
    }
    Ok(())
}

/// What a delete requires of the object it deletes (uid, resourceVersion).
pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::Preconditions;

pub use crate::observe::metrics::StoreStats;

/// The reads every store serves: get, list, watch, and where it stands.
#[async_trait]
pub trait Store<K: ServedResource>: Send + Sync + 'static {
    /// The object at `key` in the latest state; 404 NotFound when there is none.
    async fn get(&self, key: &ObjectKey) -> Result<Object<K>>;
    /// The object without waiting, from a store that holds its objects in memory; None when
    /// only [`Store::get`] can answer. A GET is then served without a future (see the
    /// `_sync` convention in the crate docs).
    /// The key is given as its parts: a GET's path has them, and builds no key.
    fn get_sync(&self, _namespace: &str, _name: &str) -> Option<Result<Object<K>>> {
        None
    }
    /// Lends the page's objects to `visit`, in order, instead of handing out references: a
    /// list that only copies each object's JSON touches no reference count. (The closure's
    /// lifetime is spelled out: left elided, `async_trait` would tie it to the call's.)
    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<K>) + Send),
    ) -> Result<PageInfo>;
    /// [`Store::list_each`] with the objects collected; a store need not implement it.
    async fn list(&self, request: &ListRequest) -> Result<ListPage<K>> {
        let mut items = Vec::new();
        let info = self
            .list_each(request, &mut |object| items.push(object.clone()))
            .await?;
        Ok(ListPage { items, info })
    }
    /// An unlimited list (no `limit`) as a cursor over one revision, for a body written a
    /// piece at a time as the client reads it: a large list is then never whole in memory
    /// (kube-apiserver streams its JSON lists for the same reason). None when the store cannot,
    /// or the list is better read at once (a page, a lookup by name): [`Store::list_each`] then.
    async fn list_cursor(&self, _request: &ListRequest) -> Result<Option<ListCursor<K>>> {
        Ok(None)
    }
    /// How many objects `namespace` (or the whole store) holds, when the store knows without
    /// waiting or walking: an unfiltered list sizes its response with it.
    fn count_sync(&self, _namespace: Option<&str>) -> Option<usize> {
        None
    }
    /// The changes `request` selects, from where it starts. A start the store cannot serve
    /// (too old, or not from its history) is a [`WatchItem::Error`] on the stream, as
    /// kube-apiserver sends it on a 200, not an `Err`.
    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<K>>;
    /// The store's current revision (the resourceVersion of its last write) and object count.
    async fn stats(&self) -> Result<StoreStats>;
    /// [`Store::stats`] as the store holds them now, without catching up with a source: what
    /// `/metrics` reports, which must not wait on etcd (kube-apiserver's object counts are
    /// kept apart from requests too). None when the store cannot tell without waiting.
    fn stats_sync(&self) -> Option<StoreStats> {
        None
    }
    /// Not ready (a cache still syncing, a backend unreachable) answers 503.
    fn check_ready(&self) -> Result<()> {
        Ok(())
    }
    /// What the store adds to `/readyz` (a cache's sync, its backend's reach); none by default.
    /// [`crate::group::ApiGroup::serve`] registers them with the kind.
    fn readiness_checks(self: Arc<Self>) -> Vec<ReadinessCheck> {
        Vec::new()
    }
    /// The store's writes, when it takes any: a kind whose store has none is read-only (get,
    /// list and watch in discovery; 405 for the other verbs).
    fn writable(&self) -> Option<&dyn WritableStore<K>> {
        None
    }
}

/// Where [`WritableStore::get_for_update`] reads: the first attempt of a write from a cache
/// (no round trip; may be stale), a retry after a conflict from the source of truth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateFrom {
    /// Whatever the store has at hand.
    Cache,
    /// The store's source of truth (etcd), after a write from the cache's copy conflicted.
    Source,
}

/// The writes of a store that takes them. The store sets `metadata.resourceVersion`; update
/// and delete are compare-and-swap on it.
#[async_trait]
pub trait WritableStore<K: ServedResource>: Store<K> {
    /// The object an update or patch starts from, read without the wait of a consistent read:
    /// [`UpdateFrom::Cache`] may be stale (the compare-and-swap of the update catches that, and
    /// the caller tries again from [`UpdateFrom::Source`]), as kube-apiserver's
    /// GuaranteedUpdate starts from its watch cache's copy.
    async fn get_for_update(&self, key: &ObjectKey, _from: UpdateFrom) -> Result<Object<K>> {
        self.get(key).await
    }

    /// Whether [`UpdateFrom::Cache`] may give a stale copy (a watch cache's): then a write that
    /// fails from it, for any reason, is tried once more from [`UpdateFrom::Source`].
    fn updates_from_a_cache(&self) -> bool {
        false
    }

    // A write that finds the object changed, taken or gone since the caller read it answers
    // 409 Conflict, 409 AlreadyExists or 404 NotFound, and nothing else: the REST layer's one
    // retry loop (`rest::guaranteed`) takes those as a lost race and reads the object again.

    /// Stores a new object (409 AlreadyExists when its key is taken).
    async fn create(&self, object: K, dry_run: bool) -> Result<Object<K>>;
    /// Replaces an object whose `metadata.resourceVersion` must still be current (409 Conflict).
    async fn update(&self, object: K, dry_run: bool) -> Result<Object<K>>;
    /// Removes the object at `key` if it meets `preconditions` (409 Conflict otherwise, 404
    /// when absent) and returns its last state, at the resourceVersion of the deletion.
    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<K>>;
}

/// The 409 for a write from a resourceVersion that is no longer the object's (kube-apiserver's
/// words): the client reads again and retries.
pub fn outdated<K: ServedResource>(name: &str) -> Error {
    Error::Conflict {
        subject: K::subject(name),
        message: "the object has been modified; please apply your changes to the latest version and try again".into(),
    }
}

/// The 410 for a continue token whose snapshot is gone (kube-apiserver's wording).
pub fn expired_continue() -> Error {
    Error::Expired("The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.".into())
}

/// kube-apiserver's refusal of a version the store has not reached (504, Retry-After 1, cause
/// `ResourceVersionTooLarge`): clients relist.
pub fn too_large(requested: u64, current: u64) -> Error {
    Error::TooLargeResourceVersion(format!(
        "Too large resource version: {requested}, current: {current}"
    ))
}

/// The message of kube-apiserver's 410 Expired for a resourceVersion older than the oldest
/// one still kept; clients relist.
pub fn too_old(requested: u64, oldest: u64) -> String {
    format!("too old resource version: {requested} ({oldest})")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn metadata_is_the_slice_of_the_json_a_table_row_borrows() {
        let object = Stored::new(testing::synthetic(3));
        assert_eq!(object.metadata_json(), None, "no JSON made yet");
        object.json();
        let expected = serde_json::to_vec(&object.metadata).unwrap();
        assert_eq!(object.metadata_json(), Some(&expected[..]));

        // JSON read back from storage in another member order, with a "metadata" key nested
        // in the spec: the top-level member is the one found.
        let mut json: serde_json::Value = serde_json::from_slice(object.json()).unwrap();
        json["spec"]["metadata"] = serde_json::json!({"name": "not-this"});
        let reordered = format!(
            r#"{{"spec":{},"kind":"Zebra","metadata":{},"apiVersion":"zoo.example.com/v1"}}"#,
            json["spec"], json["metadata"]
        );
        let from_storage = Stored::from_encoded(object.get().clone(), Bytes::from(reordered));
        let metadata: serde_json::Value =
            serde_json::from_slice(from_storage.metadata_json().unwrap()).unwrap();
        assert_eq!(metadata, json["metadata"]);
    }
}
