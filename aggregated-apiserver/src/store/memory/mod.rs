//! The in-memory store: a persistent ordered map (so a list snapshot costs O(1) and pages stay
//! consistent), one monotonic resourceVersion counter, and a bounded event log that watches
//! resume from. A view of the cluster's objects uses the same engine, with the objects' resourceVersions.
//! Snapshots and pages are in `snapshot`, the feed of a watch cache in `feed`.

mod feed;
mod snapshot;
mod watchers;

pub use feed::Listed;
pub use snapshot::ContinueToken;
use snapshot::*;
use watchers::{Follower, History, Watchers};

use std::{
    collections::BTreeMap,
    ops::{Bound, ControlFlow},
    sync::{Arc, RwLock},
    task::{Context, Poll},
    time::{Duration, Instant},
};

use async_trait::async_trait;
use futures::StreamExt;
use imbl::{HashMap as PHashMap, OrdMap};
use serde::{Deserialize, Serialize};

use super::{
    Event, EventType, LendObjects, ListCursor, ListRequest, Object, PageInfo, Preconditions,
    ReadAt, Store, StoreStats, Stored, WatchItem, WatchRequest, WatchStart, WatchStream,
    WritableStore, expired_continue, outdated, too_old,
};
use crate::{
    error::{Error, Result},
    resource::{KeyParts, ObjectKey, ServedResource},
    store::selector::Filter,
};

/// How much history a [`MemoryStore`] keeps, and where its resourceVersions start.
#[derive(Debug, Clone)]
pub struct MemoryStoreConfig {
    /// Events kept for watches to resume from; older resourceVersions get 410 Expired.
    pub event_window: usize,
    /// What those events may hold, estimated in bytes (see [`StoreStats::history_bytes`]):
    /// large objects written often keep fewer events, not more memory. The latest event is
    /// kept whatever its size.
    pub event_bytes: usize,
    /// How long a list snapshot stays available to `continue` tokens (etcd compacts at 5 min).
    pub snapshot_ttl: Duration,
    /// List snapshots kept for `continue` tokens at most; past it the oldest goes (410 Expired).
    pub max_snapshots: usize,
    /// How far behind the newest event a watcher may fall, in events, before it is ended (its
    /// stream ends; the client resumes from its last resourceVersion, still in the history):
    /// kube-apiserver's cacher ends a watcher whose buffer is full the same way.
    pub watch_buffer: usize,
    /// The same bound in bytes (estimated as the history's): a watcher of large objects that
    /// stops reading is ended after this much.
    pub watch_buffer_bytes: usize,
    /// The store's resourceVersion before its first write; watches from below it are 410.
    pub first_resource_version: u64,
    /// The store is the objects' source of truth (not a cache of another server's): a version
    /// above its own can only come from an earlier process (whose clock ran ahead), so a watch
    /// from one is 410 Expired and the client relists, rather than waiting for events that
    /// would never tell it what that process held.
    pub authoritative: bool,
}

/// Microseconds since the Unix epoch: where a store's resourceVersions start, so every process
/// starts above any version an earlier one handed out (unless it wrote faster than a million
/// times a second). A client resuming a watch from a version of a process that is gone then
/// gets 410 Expired and relists, instead of never hearing of the Zebras that went with it.
/// Such numbers stay below 2^53, exact in JavaScript clients too.
pub fn clock_resource_version() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

impl Default for MemoryStoreConfig {
    fn default() -> Self {
        Self {
            event_window: 10_000,
            event_bytes: 64 * 1024 * 1024,
            snapshot_ttl: Duration::from_secs(300),
            max_snapshots: 64,
            watch_buffer: 1000,
            watch_buffer_bytes: 16 * 1024 * 1024,
            first_resource_version: clock_resource_version(),
            authoritative: true,
        }
    }
}

struct State<K> {
    current: Snapshot<K>,
    /// The events watches resume from and read.
    history: History<K>,
    /// Watches may start at any resourceVersion from this one on.
    oldest_watchable: u64,
    snapshots: BTreeMap<u64, (Instant, Snapshot<K>)>,
}

struct Shared<K> {
    state: RwLock<State<K>>,
    watchers: Watchers,
    config: MemoryStoreConfig,
}

/// The in-memory store: a [`WritableStore`] holding every object of a kind. Clones share the
/// same objects. Lists are read from one snapshot, pages included; watches resume from any
/// version still in the event log.
pub struct MemoryStore<K> {
    shared: Arc<Shared<K>>,
}

impl<K> Clone for MemoryStore<K> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<K: ServedResource> Default for MemoryStore<K> {
    fn default() -> Self {
        Self::new(MemoryStoreConfig::default())
    }
}

/// What an event in the history holds, estimated from its object: the object, its JSON and
/// the watch line its watchers are sent, each about the JSON's size (the previous state of a
/// MODIFIED event is the event before's). The JSON is encoded here if no one has yet: the
/// write's response and its watchers need it anyway.
fn event_bytes<K: ServedResource>(object: &Object<K>) -> usize {
    3 * object.json().len()
}

fn lock_poisoned() -> Error {
    Error::Internal("store lock poisoned".into())
}

fn set_resource_version<K: ServedResource>(object: &mut K, rv: u64) {
    object.meta_mut().resource_version = Some(rv.to_string());
}

fn parse_resource_version(value: &str) -> Option<u64> {
    value.parse().ok()
}

impl<K: ServedResource> MemoryStore<K> {
    /// An empty store at `config.first_resource_version`.
    pub fn new(config: MemoryStoreConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                state: RwLock::new(State {
                    current: Snapshot::empty(config.first_resource_version),
                    history: History::new(),
                    oldest_watchable: config.first_resource_version,
                    snapshots: BTreeMap::new(),
                }),
                watchers: Watchers::new(
                    K::qualified_resource(),
                    config.watch_buffer,
                    config.watch_buffer_bytes,
                ),
                config,
            }),
        }
    }

    /// Applies one change at `rv` (which must exceed the current one) and tells the watchers.
    fn commit(
        state: &mut State<K>,
        shared: &Shared<K>,
        rv: u64,
        type_: EventType,
        object: Object<K>,
    ) {
        let key = ObjectKey::of(object.meta());
        let previous = match type_ {
            EventType::Deleted => state.current.remove(&key),
            EventType::Added | EventType::Modified => state.current.put(key, object.clone()),
        };
        state.current.resource_version = rv;
        // A DELETED event's object is the last state with a new version: its size is the
        // removed object's, whose JSON is usually encoded already.
        let size = match (type_, &previous) {
            (EventType::Deleted, Some(removed)) => event_bytes(removed),
            _ => event_bytes(&object),
        };
        let previous = previous.filter(|_| type_ == EventType::Modified);
        let event = Arc::new(Event::new(rv, type_, object).with_previous(previous));
        state.history.push(event, size);
        while state.history.len() > shared.config.event_window
            || (state.history.bytes() > shared.config.event_bytes && state.history.len() > 1)
        {
            if let Some(old) = state.history.evict() {
                state.oldest_watchable = old.resource_version;
            }
        }
        let ttl = shared.config.snapshot_ttl;
        state
            .snapshots
            .retain(|_, (taken, _)| taken.elapsed() < ttl);
        shared.watchers.pushed(&state.history);
    }

    /// Stores `object` as the next revision (`type_` says how) and returns it as stored.
    fn commit_next(
        state: &mut State<K>,
        shared: &Shared<K>,
        type_: EventType,
        mut object: K,
    ) -> Object<K> {
        let rv = state.current.resource_version + 1;
        set_resource_version(&mut object, rv);
        let object = Stored::new(object);
        Self::commit(state, shared, rv, type_, object.clone());
        object
    }

    fn write(&self) -> Result<std::sync::RwLockWriteGuard<'_, State<K>>> {
        self.shared.state.write().map_err(|_| lock_poisoned())
    }
}

fn wanted<K: ServedResource>(namespace: Option<&str>, filter: &Filter, object: &K) -> bool {
    let key = ObjectKey::of(object.meta());
    scope_matches(namespace, &key) && filter.matches(&key, object)
}

/// `event` as a watcher of `namespace` and `filter` sees it, as kube-apiserver's watch cache
/// sends it: a change that brings an object into the selection is ADDED, one that takes it out
/// is DELETED (the object as it was, at the change's version); None when it never matched.
fn seen_by<K: ServedResource>(
    namespace: Option<&str>,
    filter: &Filter,
    event: &Arc<Event<K>>,
) -> Option<Arc<Event<K>>> {
    let now = wanted(namespace, filter, event.object.get());
    let previous = match (&event.previous, filter.is_empty()) {
        (Some(previous), false) => previous,
        // Without a selector, matching cannot change with the object.
        _ => return now.then(|| event.clone()),
    };
    let rv = event.resource_version;
    match (wanted(namespace, filter, previous.get()), now) {
        (true, true) => Some(event.clone()),
        (false, true) => Some(Arc::new(Event::new(
            rv,
            EventType::Added,
            event.object.clone(),
        ))),
        (true, false) => {
            let mut gone = previous.get().clone();
            set_resource_version(&mut gone, rv);
            Some(Arc::new(Event::new(
                rv,
                EventType::Deleted,
                Stored::new(gone),
            )))
        }
        (false, false) => None,
    }
}

impl<K: ServedResource> MemoryStore<K> {
    /// Stores a new object without waiting (seeding a store).
    pub fn insert(&self, object: K) -> Result<Object<K>> {
        self.create_sync(object, false)
    }

    fn create_sync(&self, object: K, dry_run: bool) -> Result<Object<K>> {
        let key = ObjectKey::of(object.meta());
        let mut state = self.write()?;
        if state.current.objects.contains_key(&key) {
            return Err(Error::AlreadyExists(K::subject(&key.name)));
        }
        if dry_run {
            return Ok(Stored::new(object));
        }
        Ok(Self::commit_next(
            &mut state,
            &self.shared,
            EventType::Added,
            object,
        ))
    }

    /// The store's resourceVersion (what a watch cache has reached), without taking a snapshot.
    pub fn resource_version(&self) -> u64 {
        self.shared
            .state
            .read()
            .map(|state| state.current.resource_version)
            .unwrap_or_default()
    }

    /// The current revision and object count, without waiting.
    pub fn counts(&self) -> StoreStats {
        self.shared
            .state
            .read()
            .map(|state| StoreStats {
                objects: state.current.objects.len(),
                resource_version: state.current.resource_version,
                history_events: state.history.len(),
                history_bytes: state.history.bytes(),
                terminated_watchers: self.shared.watchers.terminated(),
            })
            .unwrap_or_default()
    }

    fn lookup(&self, key: &dyn KeyParts) -> Result<Object<K>> {
        let state = self.shared.state.read().map_err(|_| lock_poisoned())?;
        state
            .current
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound(K::subject(key.key_parts().1)))
    }

    /// A list's page: its objects go to `visit` in key order, from one snapshot.
    fn walk(&self, request: &ListRequest, visit: &mut dyn FnMut(&Object<K>)) -> Result<PageInfo> {
        let (snapshot, token) = self.snapshot_for_list(request)?;
        let namespace = request.namespace.as_deref();
        let filter = &request.filter;
        let limit = request.limit.filter(|l| *l > 0);
        let offset = token.as_ref().map_or(0, |t| t.offset);

        if let Some(key) = pinned_key(request) {
            if let Some(object) = snapshot.objects.get(&key)
                && wanted(namespace, filter, object.get())
            {
                visit(object);
            }
            return Ok(PageInfo {
                resource_version: snapshot.resource_version,
                continue_token: None,
                remaining_item_count: None,
            });
        }

        let lower = lower_bound(token.as_ref(), namespace);
        let mut range = candidates(&snapshot, filter, lower)
            .take_while(|(k, _)| scope_matches(namespace, k))
            .peekable();
        let mut last_key = None;
        let mut visited = 0;
        // An unfiltered list reads nothing of an object but its JSON (each read is a cache miss).
        let selects_all = filter.is_empty();
        for (key, object) in range.by_ref() {
            if selects_all || selected(filter, key, object) {
                visit(object);
                visited += 1;
                if limit.is_some_and(|l| visited >= l) {
                    last_key = Some(key.clone());
                    break;
                }
            }
        }
        let more = last_key.is_some() && range.peek().is_some();
        let continue_token = match (more, last_key) {
            (true, Some(key)) => Some(ContinueToken {
                v: "meta.k8s.io/v1".into(),
                rv: snapshot.resource_version,
                start: (key.namespace, key.name),
                offset: offset + visited,
            }),
            _ => None,
        };
        let remaining_item_count = match &continue_token {
            Some(t) if filter.is_empty() => {
                Some(snapshot.count_in(namespace).saturating_sub(t.offset) as i64)
            }
            _ => None,
        };
        if continue_token.is_some() {
            self.remember_snapshot(&snapshot)?;
        }
        Ok(PageInfo {
            resource_version: snapshot.resource_version,
            continue_token: continue_token.map(|t| t.encode()),
            remaining_item_count,
        })
    }
}

#[async_trait]
impl<K: ServedResource> Store<K> for MemoryStore<K> {
    async fn get(&self, key: &ObjectKey) -> Result<Object<K>> {
        self.lookup(key)
    }

    fn get_sync(&self, namespace: &str, name: &str) -> Option<Result<Object<K>>> {
        Some(self.lookup(&(namespace, name)))
    }

    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<K>) + Send),
    ) -> Result<PageInfo> {
        self.walk(request, visit)
    }

    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<K>>> {
        if request.limit.is_some_and(|l| l > 0) || pinned_key(request).is_some() {
            return Ok(None);
        }
        let (snapshot, token) = self.snapshot_for_list(request)?;
        let info = PageInfo {
            resource_version: snapshot.resource_version,
            continue_token: None,
            remaining_item_count: None,
        };
        let lower = lower_bound(token.as_ref(), request.namespace.as_deref());
        Ok(Some(ListCursor {
            info,
            objects: Box::new(SnapshotObjects {
                snapshot,
                namespace: request.namespace.clone(),
                filter: request.filter.clone(),
                lower,
                done: false,
            }),
        }))
    }

    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        let state = self.shared.state.read().ok()?;
        Some(state.current.count_in(namespace))
    }

    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<K>> {
        let WatchRequest {
            namespace,
            filter,
            start,
        } = request;
        let state = self.shared.state.read().map_err(|_| lock_poisoned())?;
        let current_rv = state.current.resource_version;
        let mut first: Vec<WatchItem<K>> = Vec::new();
        // Where the watcher starts reading the history, and the version it has seen.
        let (seq, after) = match start {
            WatchStart::InitialState => {
                for object in state.current.objects.values() {
                    if wanted(namespace.as_deref(), &filter, object.get()) {
                        let rv = object
                            .meta()
                            .resource_version
                            .as_deref()
                            .and_then(parse_resource_version)
                            .unwrap_or(current_rv);
                        first.push(WatchItem::Event(Arc::new(Event::new(
                            rv,
                            EventType::Added,
                            object.clone(),
                        ))));
                    }
                }
                first.push(WatchItem::InitialEventsEnd(current_rv));
                (state.history.head(), current_rv)
            }
            WatchStart::After(rv) if self.shared.config.authoritative && rv > current_rv => {
                let item = WatchItem::Error(Error::Expired(format!(
                    "too new resource version: {rv} (current: {current_rv}): it is not from this server's history; relist"
                )));
                return Ok(futures::stream::iter([item]).boxed());
            }
            WatchStart::After(rv) if rv < state.oldest_watchable => {
                let item = WatchItem::Error(Error::Expired(too_old(rv, state.oldest_watchable)));
                return Ok(futures::stream::iter([item]).boxed());
            }
            // A watch from a version the store has not reached yet (a cache) waits for the
            // events after it, as kube-apiserver's watch cache lets it.
            WatchStart::After(rv) => (state.history.seq_after(rv), rv),
        };
        // Registered under the lock that writers push under: no gap, no duplicate.
        let follower = Follower::new(
            self.shared.clone(),
            (seq, state.history.head()),
            (namespace, filter),
            after,
            first,
        );
        drop(state);
        Ok(
            futures::stream::unfold(follower, |mut follower| async move {
                follower.next().await.map(|item| (item, follower))
            })
            .boxed(),
        )
    }

    async fn stats(&self) -> Result<StoreStats> {
        Ok(self.counts())
    }

    fn stats_sync(&self) -> Option<StoreStats> {
        Some(self.counts())
    }

    fn writable(&self) -> Option<&dyn WritableStore<K>> {
        Some(self)
    }
}

#[async_trait]
impl<K: ServedResource> WritableStore<K> for MemoryStore<K> {
    async fn create(&self, object: K, dry_run: bool) -> Result<Object<K>> {
        self.create_sync(object, dry_run)
    }

    async fn update(&self, object: K, dry_run: bool) -> Result<Object<K>> {
        let key = ObjectKey::of(object.meta());
        let mut state = self.write()?;
        let current = state
            .current
            .objects
            .get(&key)
            .ok_or_else(|| Error::NotFound(K::subject(&key.name)))?;
        if current.meta().resource_version != object.meta().resource_version {
            return Err(outdated::<K>(&key.name));
        }
        if dry_run {
            return Ok(Stored::new(object));
        }
        Ok(Self::commit_next(
            &mut state,
            &self.shared,
            EventType::Modified,
            object,
        ))
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<K>> {
        let mut state = self.write()?;
        let current = state
            .current
            .objects
            .get(key)
            .cloned()
            .ok_or_else(|| Error::NotFound(K::subject(&key.name)))?;
        super::check_preconditions(current.get(), preconditions)?;
        if dry_run {
            return Ok(current);
        }
        let deleted = (*current).clone();
        Ok(Self::commit_next(
            &mut state,
            &self.shared,
            EventType::Deleted,
            deleted,
        ))
    }
}
