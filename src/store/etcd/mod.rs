//! A kind's objects in etcd, as kube-apiserver keeps them: one key per object
//! (`<prefix><plural>/<namespace>/<name>`), its JSON as the value, its resourceVersion the key's
//! `mod_revision`. Writes are compare-and-swap transactions on that revision. Reads are served
//! from a watch cache (a [`MemoryStore`]) fed by one etcd watch per process, as kube-apiserver's
//! cacher serves them. A read of the latest state is consistent (kube-apiserver 1.31's
//! consistent reads from cache): it learns etcd's current revision (one key, no values) and
//! waits until the cache has reached it, so a write made through any replica is seen by the
//! next read on every other one. When only keys outside the kind moved the revision, the watch
//! is asked for a progress notification (etcd's `RequestProgress`) on etcd versions that order
//! it after their events, and older ones get a write of the marker key `<prefix><plural>/`
//! instead. Concurrent reads share one check.

pub mod client;

use std::{sync::Arc, time::Duration};

use async_trait::async_trait;
use tokio::sync::watch;

use client::{Compare, KeyValue, WatchEvent, prefix_end};
pub use client::{EtcdClient, EtcdConfig, EtcdError};

use super::{
    ListCursor, ListPage, ListRequest, MemoryStore, Object, PageInfo, Preconditions, ReadAt, Store,
    StoreStats, Stored, UpdateFrom, WatchRequest, WatchStream, WritableStore,
    memory::MemoryStoreConfig,
};
use crate::{
    error::{Error, Result},
    health::Check,
    resource::{ObjectKey, ServedResource},
};

/// How long a read waits for the cache to catch up with etcd before it gives up (503).
const CATCH_UP: Duration = Duration::from_secs(5);

/// The state of the cache's feed, for readiness and for reads.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Feed {
    /// The first list has not completed.
    Syncing,
    /// Current, fed by the watch.
    Watching,
    /// The watch is broken (etcd unreachable): reads and writes answer 503 until it is back.
    Broken(String),
}

struct Shared<K> {
    client: Arc<EtcdClient>,
    /// `<prefix><plural>/`.
    prefix: Vec<u8>,
    cache: MemoryStore<K>,
    feed: watch::Sender<Feed>,
    /// Bumped whenever the feed applied something, for reads waiting for the cache.
    applied: watch::Sender<u64>,
    /// Consistent reads share etcd checks (see [`EtcdStore::latest`]).
    checks: Checks,
    /// The current watch's request stream, for progress requests.
    progress: std::sync::Mutex<Option<client::Progress>>,
}

/// The etcd checks consistent reads make, by one task ([`check`]): a read takes a ticket and
/// waits for the first check that started after it took it, so one etcd round trip serves
/// every read that arrived while the previous one was out, and no read waits in a queue of
/// locks.
struct Checks {
    /// Tickets taken so far.
    tickets: std::sync::atomic::AtomicU64,
    /// Wakes the task.
    wanted: Arc<tokio::sync::Notify>,
    /// The last check done: the tickets it covers (all taken before it started) and what it
    /// found.
    done: watch::Sender<(u64, Checked)>,
    /// Whether the etcd serving the watch orders its progress notifications after its events
    /// ([`client::orders_progress`]).
    ordered_progress: std::sync::atomic::AtomicBool,
}

/// What a check found: etcd's revision, or why not.
type Checked = std::result::Result<i64, String>;

/// A kind stored in etcd; see the module docs.
pub struct EtcdStore<K> {
    shared: Arc<Shared<K>>,
}

fn unavailable(error: EtcdError) -> Error {
    match error {
        EtcdError::Compacted(_) => Error::Expired(error.to_string()),
        other => Error::ServiceUnavailable(other.to_string()),
    }
}

impl<K: ServedResource> EtcdStore<K> {
    /// Serves `K` from the etcd `client` reaches, under `prefix` (`/farm.example.com/`), and
    /// starts feeding the cache (list, then watch; again whenever the watch breaks).
    pub fn start(client: Arc<EtcdClient>, prefix: &str) -> Arc<Self> {
        let mut key = prefix.as_bytes().to_vec();
        if !key.ends_with(b"/") {
            key.push(b'/');
        }
        key.extend_from_slice(K::plural(&()).as_bytes());
        key.push(b'/');
        let store = Arc::new(Self {
            shared: Arc::new(Shared {
                client,
                prefix: key,
                cache: MemoryStore::new(MemoryStoreConfig {
                    first_resource_version: 0,
                    // etcd is the source of truth: a watch from a revision the cache has not
                    // reached waits for it, as kube-apiserver's cacher does.
                    authoritative: false,
                    ..Default::default()
                }),
                feed: watch::Sender::new(Feed::Syncing),
                applied: watch::Sender::new(0),
                checks: Checks {
                    tickets: std::sync::atomic::AtomicU64::new(0),
                    wanted: Arc::new(tokio::sync::Notify::new()),
                    done: watch::Sender::new((0, Ok(0))),
                    ordered_progress: std::sync::atomic::AtomicBool::new(false),
                },
                progress: std::sync::Mutex::new(None),
            }),
        });
        tokio::spawn(feed(EtcdStore {
            shared: store.shared.clone(),
        }));
        tokio::spawn(check(
            Arc::downgrade(&store.shared),
            store.shared.checks.wanted.clone(),
        ));
        store
    }

    /// The revision the cache has applied, without catching up with etcd first (as
    /// [`Store::stats`] does, which on an older etcd may write the kind's prefix key to do so).
    pub fn cached_revision(&self) -> u64 {
        self.shared.cache.resource_version()
    }

    fn key(&self, key: &ObjectKey) -> Vec<u8> {
        let mut out = self.shared.prefix.clone();
        if K::namespaced() {
            out.extend_from_slice(key.namespace.as_bytes());
            out.push(b'/');
        }
        out.extend_from_slice(key.name.as_bytes());
        out
    }

    /// A revision the cache must reach to be current as of this call: from a check that
    /// started after it (see [`Checks`]).
    async fn latest(&self) -> Result<i64> {
        use std::sync::atomic::Ordering::SeqCst;
        let checks = &self.shared.checks;
        let mut done = checks.done.subscribe();
        let ticket = checks.tickets.fetch_add(1, SeqCst) + 1;
        checks.wanted.notify_one();
        let checked = done
            .wait_for(|(covers, _)| *covers >= ticket)
            .await
            .map_err(|_| Error::ServiceUnavailable("the etcd store is stopping".into()))?;
        checked.1.clone().map_err(Error::ServiceUnavailable)
    }

    /// Waits until the cache has caught up with etcd as of now (see the module docs).
    async fn catch_up(&self) -> Result<()> {
        self.check_ready()?;
        let revision = self.latest().await?.max(0) as u64;
        let caught_up = || self.shared.cache.resource_version() >= revision;
        if caught_up() {
            return Ok(()); // the common case: no timer, no subscription
        }
        let mut applied = self.shared.applied.subscribe();
        let wait = async {
            while !caught_up() {
                if applied.changed().await.is_err() {
                    break;
                }
            }
        };
        match tokio::time::timeout(CATCH_UP, wait).await {
            Ok(()) if caught_up() => Ok(()),
            _ => Err(Error::ServiceUnavailable(
                "the etcd cache did not catch up with etcd in time; retry".into(),
            )),
        }
    }

    /// Waits until the cache holds `revision` (a read `NotOlderThan` it).
    async fn reach(&self, revision: u64) -> Result<()> {
        self.check_ready()?;
        if self.shared.cache.resource_version() >= revision {
            return Ok(());
        }
        self.catch_up().await?;
        let current = self.shared.cache.resource_version();
        if current >= revision {
            Ok(())
        } else {
            Err(super::too_large(revision, current))
        }
    }

    async fn read_at(&self, read_at: ReadAt) -> Result<()> {
        match read_at {
            ReadAt::Latest => self.catch_up().await,
            ReadAt::Any => self.check_ready(),
            ReadAt::NotOlderThan(revision) | ReadAt::Exact(revision) => self.reach(revision).await,
        }
    }

    /// Brings the cache to where `request` reads: as of now for a first page, and the snapshot
    /// a continue token (from any replica) or an Exact list names, read from etcd at its
    /// revision when the cache does not keep it, as kube-apiserver reads such pages from etcd.
    async fn prepare_list(&self, request: &ListRequest) -> Result<()> {
        if request.continue_token.is_none() {
            self.read_at(request.read_at).await?;
        }
        let Some(revision) = self.shared.cache.missing_snapshot(request)? else {
            return Ok(());
        };
        let objects = match read_all(self, revision as i64).await {
            Ok((objects, _)) => objects,
            Err(EtcdError::Compacted(oldest)) if request.continue_token.is_some() => {
                tracing::debug!(revision, oldest, "continue token older than etcd's history");
                return Err(super::expired_continue());
            }
            Err(EtcdError::Compacted(oldest)) => {
                return Err(Error::Expired(super::too_old(revision, oldest as u64)));
            }
            Err(error) => return Err(unavailable(error)),
        };
        self.shared.cache.remember_at(objects, revision)
    }

    fn decode(&self, kv: &KeyValue, revision: i64) -> Result<K> {
        let mut object: K = serde_json::from_slice(&kv.value).map_err(|e| {
            Error::Internal(format!(
                "etcd key {} does not hold a {}: {e}",
                String::from_utf8_lossy(&kv.key),
                K::kind(&())
            ))
        })?;
        object.meta_mut().resource_version = Some(revision.to_string());
        Ok(object)
    }

    /// The object's JSON as stored: without its resourceVersion (the key's revision is).
    fn encode(object: &K) -> Result<Vec<u8>> {
        let mut object = object.clone();
        object.meta_mut().resource_version = None;
        serde_json::to_vec(&object).map_err(|e| Error::Internal(format!("encoding: {e}")))
    }

    fn conflict(name: &str) -> Error {
        Error::Conflict {
            subject: K::subject(name),
            message: "the object has been modified; please apply your changes to the latest version and try again".into(),
        }
    }
}

/// Makes the checks consistent reads wait for ([`Checks`]), one at a time, while reads want
/// them; ends with the store.
async fn check<K: ServedResource>(
    shared: std::sync::Weak<Shared<K>>,
    wanted: Arc<tokio::sync::Notify>,
) {
    use std::sync::atomic::Ordering::SeqCst;
    loop {
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let covered = shared.checks.done.borrow().0;
        let covers = shared.checks.tickets.load(SeqCst);
        if covers <= covered {
            drop(shared);
            // The timeout only notices a dropped store.
            let _ = tokio::time::timeout(Duration::from_secs(1), wanted.notified()).await;
            continue;
        }
        let found = revision_to_reach(&shared).await.map_err(|e| e.to_string());
        let _previous = shared.checks.done.send_replace((covers, found));
    }
}

/// The revision the cache must reach to hold every write etcd has acknowledged so far.
///
/// etcd's current revision comes from the header of a read of one key. A cache at it already
/// is current. Otherwise the revision moved for keys of this kind whose events are on their way,
/// or for keys outside it, which the watch never sends: an etcd that orders its progress
/// notifications after its events is asked for one (as kube-apiserver does); an older one
/// (3.5.1, the PyPI build, may send the notification ahead of events still queued) gets a write
/// of the kind's prefix key instead, whose event comes through the watch after every earlier
/// one, and the cache waits for that.
async fn revision_to_reach<K: ServedResource>(shared: &Shared<K>) -> Result<i64, EtcdError> {
    let revision = shared.client.revision(&shared.prefix).await?;
    if shared.cache.resource_version() >= revision.max(0) as u64 {
        return Ok(revision);
    }
    if shared
        .checks
        .ordered_progress
        .load(std::sync::atomic::Ordering::SeqCst)
        && let Ok(progress) = shared.progress.lock()
        && let Some(requests) = progress.as_ref()
        && requests.request()
    {
        return Ok(revision);
    }
    shared.client.put(&shared.prefix, b"").await
}

/// Feeds the cache: list, then watch from the list's revision; on a broken watch, watch again
/// from where the cache is (or list again when etcd has compacted that far), forever.
///
/// It ends once the store is gone: its own handle is then the last (checked between watches,
/// and each second while a watch is quiet).
async fn feed<K: ServedResource>(store: EtcdStore<K>) {
    let shared = &store.shared;
    let gone = || Arc::strong_count(&store.shared) == 1;
    let end = prefix_end(&shared.prefix);
    let mut listed = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        if gone() {
            return;
        }
        if !listed {
            match list_all(&store).await {
                Ok(()) => listed = true,
                Err(error) => {
                    broken(shared, &error);
                    shared.client.fail_over();
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                    continue;
                }
            }
        }
        let from = shared.cache.resource_version() + 1;
        let watch = match shared.client.watch(&shared.prefix, &end, from as i64).await {
            Ok(watch) => watch,
            Err(error) => {
                broken(shared, &error);
                shared.client.fail_over();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        let ordered = match shared.client.server_version().await {
            Ok(version) => client::orders_progress(&version),
            Err(error) => {
                tracing::debug!(%error, "etcd's version unknown: progress notifications unused");
                false
            }
        };
        shared
            .checks
            .ordered_progress
            .store(ordered, std::sync::atomic::Ordering::SeqCst);
        shared.feed.send_replace(Feed::Watching);
        shared.applied.send_modify(|n| *n += 1);
        if let Ok(mut progress) = shared.progress.lock() {
            *progress = Some(watch.progress.clone());
        }
        let mut events = watch.events;
        let error = loop {
            let next = futures::StreamExt::next(&mut events);
            let Ok(next) = tokio::time::timeout(Duration::from_secs(1), next).await else {
                if gone() {
                    return;
                }
                continue;
            };
            match next {
                Some(Ok(batch)) => {
                    if let Err(error) = apply(&store, batch) {
                        break EtcdError::Refused(error.to_string());
                    }
                    shared.applied.send_modify(|n| *n += 1);
                }
                Some(Err(error)) => break error,
                None => break EtcdError::Unavailable("etcd closed the watch".into()),
            }
        };
        if let Ok(mut progress) = shared.progress.lock() {
            *progress = None;
        }
        if let EtcdError::Compacted(_) = error {
            listed = false;
        }
        broken(shared, &error);
        shared.client.fail_over();
        tokio::time::sleep(backoff).await;
    }
}

fn broken<K>(shared: &Shared<K>, error: &EtcdError) {
    tracing::warn!(%error, "etcd watch broken; retrying");
    let reason = match error {
        EtcdError::Compacted(_) => "relisting etcd after a compaction".to_owned(),
        other => other.to_string(),
    };
    shared.feed.send_replace(Feed::Broken(reason));
}

/// Reads every object under the prefix into the cache, at one revision.
async fn list_all<K: ServedResource>(store: &EtcdStore<K>) -> Result<(), EtcdError> {
    let (objects, revision) = read_all(store, 0).await?;
    store
        .shared
        .cache
        .reset_at(objects, revision as u64)
        .map_err(|e| EtcdError::Refused(e.to_string()))
}

/// Every object under the prefix at `revision` (0: the latest), a page at a time, and the
/// revision read.
async fn read_all<K: ServedResource>(
    store: &EtcdStore<K>,
    mut revision: i64,
) -> Result<(Vec<K>, i64), EtcdError> {
    const PAGE: i64 = 500;
    let end = prefix_end(&store.shared.prefix);
    let mut objects = Vec::new();
    let mut from = store.shared.prefix.clone();
    loop {
        let page = store
            .shared
            .client
            .range(&from, &end, revision, PAGE)
            .await?;
        revision = page
            .header
            .revision
            .min(if revision > 0 { revision } else { i64::MAX });
        for kv in &page.kvs {
            if kv.key == store.shared.prefix {
                continue; // the marker key checks write (see `revision_to_reach`)
            }
            match store.decode(kv, kv.mod_revision) {
                Ok(object) => objects.push(object),
                Err(error) => tracing::warn!(%error, "skipping an undecodable etcd key"),
            }
        }
        match page.kvs.last() {
            Some(last) if page.more => {
                from = last.key.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok((objects, revision))
}

/// Applies one batch of watch events to the cache.
fn apply<K: ServedResource>(store: &EtcdStore<K>, batch: Vec<WatchEvent>) -> Result<()> {
    let shared = &store.shared;
    for event in batch {
        match event {
            // The marker key checks write: it only says how far the watch has come.
            WatchEvent::Put(kv) if kv.key == shared.prefix => {
                shared.cache.advance(kv.mod_revision as u64)?
            }
            WatchEvent::Put(kv) => match store.decode(&kv, kv.mod_revision) {
                Ok(object) => shared.cache.apply_external(object)?,
                Err(error) => tracing::warn!(%error, "skipping an undecodable etcd value"),
            },
            WatchEvent::Delete { revision, previous } => {
                if let Ok(object) = store.decode(&previous, revision) {
                    shared.cache.delete_external(object)?;
                }
                shared.cache.advance(revision as u64)?;
            }
            // Trusted only from an etcd that sends it after every earlier event.
            WatchEvent::Progress(revision)
                if shared
                    .checks
                    .ordered_progress
                    .load(std::sync::atomic::Ordering::SeqCst) =>
            {
                shared.cache.advance(revision as u64)?
            }
            WatchEvent::Progress(_) => {}
        }
    }
    Ok(())
}

#[async_trait]
impl<K: ServedResource> Store<K> for EtcdStore<K> {
    async fn get(&self, key: &ObjectKey) -> Result<Object<K>> {
        self.catch_up().await?;
        self.shared.cache.get(key).await
    }

    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<K>) + Send),
    ) -> Result<PageInfo> {
        self.prepare_list(request).await?;
        self.shared.cache.list_each(request, visit).await
    }

    async fn list(&self, request: &ListRequest) -> Result<ListPage<K>> {
        self.prepare_list(request).await?;
        self.shared.cache.list(request).await
    }

    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<K>>> {
        self.prepare_list(request).await?;
        self.shared.cache.list_cursor(request).await
    }

    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        self.shared.cache.count_sync(namespace)
    }

    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<K>> {
        self.check_ready()?;
        self.shared.cache.watch(request).await
    }

    /// As of now: after catching up with etcd, so a write that returned is counted.
    async fn stats(&self) -> Result<StoreStats> {
        self.catch_up().await?;
        Ok(self.shared.cache.counts())
    }

    fn check_ready(&self) -> Result<()> {
        match &*self.shared.feed.borrow() {
            Feed::Watching => Ok(()),
            Feed::Syncing => Err(Error::ServiceUnavailable(
                "the etcd cache has not synced yet; retry shortly".into(),
            )),
            Feed::Broken(reason) => Err(Error::ServiceUnavailable(format!(
                "etcd is unavailable: {reason}"
            ))),
        }
    }

    /// Readiness (`etcd`, one check however many kinds etcd keeps): not ready until the
    /// cache holds etcd's objects, nor while etcd is unreachable.
    fn readiness_checks(self: Arc<Self>) -> Vec<Check> {
        vec![Check::new("etcd", move || {
            match &*self.shared.feed.borrow() {
                Feed::Watching => Ok(()),
                Feed::Syncing => Err("the cache has not read etcd yet".into()),
                Feed::Broken(reason) => Err(reason.clone()),
            }
        })]
    }

    fn writable(&self) -> Option<&dyn WritableStore<K>> {
        Some(self)
    }
}

#[async_trait]
impl<K: ServedResource> WritableStore<K> for EtcdStore<K> {
    /// From the cache first, without waiting for it to catch up (that would serialize writes
    /// behind reads): a copy older than etcd's fails the update's compare-and-swap, and the
    /// retry reads etcd ([`UpdateFrom::Source`]), as does an object the cache does not hold
    /// yet (just created through another replica).
    async fn get_for_update(&self, key: &ObjectKey, from: UpdateFrom) -> Result<Object<K>> {
        self.check_ready()?;
        if from == UpdateFrom::Cache
            && let Ok(cached) = self.shared.cache.get(key).await
        {
            return Ok(cached);
        }
        let read = self
            .shared
            .client
            .range(&self.key(key), &[], 0, 1)
            .await
            .map_err(unavailable)?;
        let kv = read
            .kvs
            .into_iter()
            .next()
            .ok_or_else(|| Error::NotFound(K::subject(&key.name)))?;
        // The cached object when it is that version: its JSON is encoded already.
        if let Ok(cached) = self.shared.cache.get(key).await
            && cached.meta().resource_version.as_deref() == Some(&kv.mod_revision.to_string())
        {
            return Ok(cached);
        }
        Ok(Stored::new(self.decode(&kv, kv.mod_revision)?))
    }

    fn updates_from_a_cache(&self) -> bool {
        true
    }

    async fn create(&self, mut object: K, dry_run: bool) -> Result<Object<K>> {
        let key = ObjectKey::of(object.meta());
        let etcd_key = self.key(&key);
        if dry_run {
            let existing = self.shared.client.range(&etcd_key, &[], 0, 1).await;
            if !existing.map_err(unavailable)?.kvs.is_empty() {
                return Err(Error::AlreadyExists(K::subject(&key.name)));
            }
            return Ok(Stored::new(object));
        }
        let value = Self::encode(&object)?;
        let done = self
            .shared
            .client
            .txn(&etcd_key, Compare::Absent, Some(&value))
            .await
            .map_err(unavailable)?;
        if !done.succeeded {
            return Err(Error::AlreadyExists(K::subject(&key.name)));
        }
        object.meta_mut().resource_version = Some(done.revision.to_string());
        Ok(Stored::new(object))
    }

    async fn update(&self, mut object: K, dry_run: bool) -> Result<Object<K>> {
        let key = ObjectKey::of(object.meta());
        let etcd_key = self.key(&key);
        let expected: i64 = object
            .meta()
            .resource_version
            .as_deref()
            .and_then(|rv| rv.parse().ok())
            .ok_or_else(|| Self::conflict(&key.name))?;
        if dry_run {
            let current = self.shared.client.range(&etcd_key, &[], 0, 1).await;
            return match current.map_err(unavailable)?.kvs.first() {
                None => Err(Error::NotFound(K::subject(&key.name))),
                Some(kv) if kv.mod_revision != expected => Err(Self::conflict(&key.name)),
                Some(_) => Ok(Stored::new(object)),
            };
        }
        let value = Self::encode(&object)?;
        let done = self
            .shared
            .client
            .txn(&etcd_key, Compare::ModRevision(expected), Some(&value))
            .await
            .map_err(unavailable)?;
        if !done.succeeded {
            return Err(match done.current {
                None => Error::NotFound(K::subject(&key.name)),
                Some(_) => Self::conflict(&key.name),
            });
        }
        object.meta_mut().resource_version = Some(done.revision.to_string());
        Ok(Stored::new(object))
    }

    async fn delete(
        &self,
        key: &ObjectKey,
        preconditions: &Preconditions,
        dry_run: bool,
    ) -> Result<Object<K>> {
        let etcd_key = self.key(key);
        // As kube-apiserver's GuaranteedUpdate: read, check, delete if unchanged, else again.
        for _ in 0..5 {
            let read = self
                .shared
                .client
                .range(&etcd_key, &[], 0, 1)
                .await
                .map_err(unavailable)?;
            let Some(kv) = read.kvs.into_iter().next() else {
                return Err(Error::NotFound(K::subject(&key.name)));
            };
            let current = self.decode(&kv, kv.mod_revision)?;
            super::check_preconditions(&current, preconditions)?;
            if dry_run {
                return Ok(Stored::new(current));
            }
            let done = self
                .shared
                .client
                .txn(&etcd_key, Compare::ModRevision(kv.mod_revision), None)
                .await
                .map_err(unavailable)?;
            if done.succeeded {
                let mut deleted = current;
                deleted.meta_mut().resource_version = Some(done.revision.to_string());
                return Ok(Stored::new(deleted));
            }
        }
        Err(Self::conflict(&key.name))
    }
}
