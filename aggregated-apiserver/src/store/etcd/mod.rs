//! A kind's objects in etcd, as kube-apiserver keeps them: one key per object
//! (`<prefix><plural>/<namespace>/<name>`), its JSON as the value, its resourceVersion the key's
//! `mod_revision`. Reads are served from a [`WatchCache`] whose [`Source`] is etcd (a list of
//! the kind's keys, then one watch from the next revision, resumed after a break and listed
//! again after a compaction), as kube-apiserver's cacher serves them; writes are
//! compare-and-swap transactions on the key's revision (`writes.rs`).
//!
//! A read of the latest state is consistent (kube-apiserver 1.31's consistent reads from cache):
//! it learns etcd's current revision (one key, no values) and waits until the cache has reached
//! it, so a write made through any replica is seen by the next read on every other one. When
//! only keys outside the kind moved the revision, the watch is asked for a progress
//! notification (etcd's `RequestProgress`) on etcd versions that order it after their events,
//! and older ones get a write of the marker key `<prefix><plural>/` instead. Concurrent reads
//! share one check.

pub mod client;
mod writes;

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering::SeqCst},
    },
    time::Duration,
};

use futures::{
    FutureExt, StreamExt,
    channel::oneshot,
    future::{BoxFuture, Shared},
};
use tokio::sync::{Notify, watch};

pub use client::{EtcdClient, EtcdConfig, EtcdError};
use client::{KeyValue, WatchEvent, prefix_end};

use super::{
    ListRequest, ReadAt, WritableStore,
    watch_cache::{CacheState, Sink, Source, WatchCache},
};
use crate::{
    error::{Error, Result},
    observe::health::ReadinessCheck,
    resource::{ObjectKey, ServedResource},
};

/// How long a read waits for the cache to catch up with etcd before it gives up (503).
const CATCH_UP: Duration = Duration::from_secs(5);

/// A kind stored in etcd; see the module docs.
pub type EtcdStore<K> = WatchCache<K, EtcdSource>;

/// One kind's keys in etcd, as the [`Source`] of its [`EtcdStore`]: the feed's watch and what
/// consistent reads and writes share with it.
pub struct EtcdSource {
    client: Arc<EtcdClient>,
    /// `<prefix><plural>/`.
    prefix: Vec<u8>,
    /// Bumped whenever the feed applied something, for reads waiting for the cache.
    applied: watch::Sender<u64>,
    /// Consistent reads share etcd checks (see [`EtcdSource::latest`]).
    checks: ConsistentReads,
    /// The current watch's request stream, for progress requests.
    progress: Mutex<Option<client::Progress>>,
}

/// The etcd checks consistent reads make, by one task ([`revision_checker`]): a read joins the
/// next round and waits for its check, which starts after the read joined, so one etcd round
/// trip serves every read that arrived while the previous one was out, no read waits in a queue
/// of locks, and a check wakes only the reads it answers.
struct ConsistentReads {
    /// The round reads join; the task takes it (leaving a new one) just before its check.
    next: Mutex<Round>,
    /// Wakes the task.
    wanted: Notify,
    /// Whether the etcd serving the watch orders its progress notifications after its events
    /// ([`client::orders_progress`]).
    ordered_progress: AtomicBool,
}

/// One check and the reads waiting for it: each read holds a clone of `found`; the task answers
/// through `answer`, or drops it (stopping), which the reads see as canceled.
struct Round {
    answer: oneshot::Sender<Checked>,
    found: Shared<oneshot::Receiver<Checked>>,
}

impl Default for Round {
    fn default() -> Self {
        let (answer, found) = oneshot::channel();
        Self {
            answer,
            found: found.shared(),
        }
    }
}

/// The next round (no code panics while holding it).
fn lock(next: &Mutex<Round>) -> std::sync::MutexGuard<'_, Round> {
    next.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What a check found: etcd's revision, or why not.
type Checked = std::result::Result<i64, String>;

fn unavailable(error: EtcdError) -> Error {
    match error {
        EtcdError::Compacted(_) => Error::Expired(error.to_string()),
        other => Error::ServiceUnavailable(other.to_string()),
    }
}

impl<K: ServedResource> EtcdStore<K> {
    /// Serves `K` from the etcd `client` reaches, under `prefix` (`/zoo.example.com/`), and
    /// starts feeding the cache (list, then watch; again whenever the watch breaks).
    pub fn start(client: Arc<EtcdClient>, prefix: &str) -> Arc<Self> {
        let mut key = prefix.as_bytes().to_vec();
        if !key.ends_with(b"/") {
            key.push(b'/');
        }
        key.extend_from_slice(K::plural(&()).as_bytes());
        key.push(b'/');
        let source = EtcdSource {
            client,
            prefix: key,
            applied: watch::Sender::new(0),
            checks: ConsistentReads {
                next: Mutex::default(),
                wanted: Notify::new(),
                ordered_progress: AtomicBool::new(false),
            },
            progress: Mutex::new(None),
        };
        WatchCache::new(source, CacheState::Syncing { pending: 1 })
    }
}

/// What a request to the store gets in `state`: 503 until the cache has read etcd, and while
/// its watch is broken.
fn ready(state: &CacheState) -> Result<()> {
    match state {
        CacheState::Synced { .. } => Ok(()),
        CacheState::NoSource | CacheState::Syncing { .. } => Err(Error::ServiceUnavailable(
            "the etcd cache has not synced yet; retry shortly".into(),
        )),
        CacheState::Broken(reason) => Err(Error::ServiceUnavailable(format!(
            "etcd is unavailable: {reason}"
        ))),
    }
}

impl<K: ServedResource> Source<K> for EtcdSource {
    const CONSISTENT_READS: bool = true;

    /// The feed (`feed`) and the checks of consistent reads (`revision_checker`).
    fn feeds(self: &Arc<Self>, sink: &Sink<K>) -> Vec<BoxFuture<'static, ()>> {
        vec![
            feed(self.clone(), sink.clone()).boxed(),
            revision_checker(self.clone(), sink.clone()).boxed(),
        ]
    }

    fn check_ready(&self, state: &CacheState) -> Result<()> {
        ready(state)
    }

    /// Readiness (`etcd`, one check however many kinds etcd keeps): not ready until the
    /// cache holds etcd's objects, nor while etcd is unreachable.
    fn readiness_checks(&self, state: watch::Receiver<CacheState>) -> Vec<ReadinessCheck> {
        vec![ReadinessCheck::new("etcd", move || {
            match &*state.borrow() {
                CacheState::Synced { .. } => Ok(()),
                CacheState::NoSource | CacheState::Syncing { .. } => {
                    Err("the cache has not read etcd yet".into())
                }
                CacheState::Broken(reason) => Err(reason.clone()),
            }
        })]
    }

    /// A read of the latest state (a get, the stats) catches up with etcd first.
    async fn catch_up(&self, sink: &Sink<K>) -> Result<()> {
        self.reach_latest(sink).await
    }

    /// A list also brings the cache to the snapshot it reads.
    async fn prepare_list(&self, sink: &Sink<K>, request: &ListRequest) -> Result<()> {
        self.reach_list(sink, request).await
    }

    /// A watch only needs the feed up.
    fn prepare_watch(&self, sink: &Sink<K>) -> Result<()> {
        ready(&sink.state())
    }

    fn writable(cache: &EtcdStore<K>) -> Option<&dyn WritableStore<K>> {
        Some(cache)
    }
}

impl EtcdSource {
    fn key<K: ServedResource>(&self, key: &ObjectKey) -> Vec<u8> {
        let mut out = self.prefix.clone();
        if K::namespaced() {
            out.extend_from_slice(key.namespace.as_bytes());
            out.push(b'/');
        }
        out.extend_from_slice(key.name.as_bytes());
        out
    }

    /// The key's value now, if it has one.
    async fn read_key(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let read = self.client.range(key, &[], 0, 1).await;
        Ok(read.map_err(unavailable)?.kvs.into_iter().next())
    }

    /// A revision the cache must reach to be current as of this call: from a check that
    /// started after it (see [`ConsistentReads`]).
    async fn latest(&self) -> Result<i64> {
        let checks = &self.checks;
        let found = lock(&checks.next).found.clone();
        checks.wanted.notify_one();
        match found.await {
            Ok(checked) => checked.map_err(Error::ServiceUnavailable),
            Err(oneshot::Canceled) => Err(Error::ServiceUnavailable(
                "the etcd store is stopping".into(),
            )),
        }
    }

    /// Waits until the cache has caught up with etcd as of now (see the module docs).
    async fn reach_latest<K: ServedResource>(&self, sink: &Sink<K>) -> Result<()> {
        ready(&sink.state())?;
        let revision = self.latest().await?.max(0) as u64;
        let caught_up = || sink.cache.resource_version() >= revision;
        if caught_up() {
            return Ok(()); // the common case: no timer, no subscription
        }
        let mut applied = self.applied.subscribe();
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
    async fn reach<K: ServedResource>(&self, sink: &Sink<K>, revision: u64) -> Result<()> {
        ready(&sink.state())?;
        if sink.cache.resource_version() >= revision {
            return Ok(());
        }
        self.reach_latest(sink).await?;
        let current = sink.cache.resource_version();
        if current >= revision {
            Ok(())
        } else {
            Err(super::too_large(revision, current))
        }
    }

    /// Brings the cache to where `request` reads: as of now for a first page, and the snapshot
    /// a continue token (from any replica) or an Exact list names, read from etcd at its
    /// revision when the cache does not keep it, as kube-apiserver reads such pages from etcd.
    async fn reach_list<K: ServedResource>(
        &self,
        sink: &Sink<K>,
        request: &ListRequest,
    ) -> Result<()> {
        if request.continue_token.is_none() {
            match request.read_at {
                ReadAt::Latest => self.reach_latest(sink).await?,
                ReadAt::Any => ready(&sink.state())?,
                ReadAt::NotOlderThan(revision) | ReadAt::Exact(revision) => {
                    self.reach(sink, revision).await?
                }
            }
        }
        let Some(revision) = sink.cache.missing_snapshot(request)? else {
            return Ok(());
        };
        let objects = match self.read_all(revision as i64).await {
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
        sink.cache.remember_at(objects, revision)
    }

    fn decode<K: ServedResource>(&self, kv: &KeyValue, revision: i64) -> Result<K> {
        let mut object = K::decode_stored(&kv.value).map_err(|e| {
            Error::Internal(format!(
                "etcd key {} does not hold a {}: {e}",
                String::from_utf8_lossy(&kv.key),
                K::kind(&())
            ))
        })?;
        object.meta_mut().resource_version = Some(revision.to_string());
        Ok(object)
    }

    /// The revision the cache must reach to hold every write etcd has acknowledged so far.
    ///
    /// etcd's current revision comes from the header of a read of one key. A cache at it
    /// already is current. Otherwise the revision moved for keys of this kind whose events are
    /// on their way, or for keys outside it, which the watch never sends: an etcd that orders
    /// its progress notifications after its events is asked for one (as kube-apiserver does);
    /// an older one (3.5.1, the PyPI build, may send the notification ahead of events still
    /// queued) gets a write of the kind's prefix key instead, whose event comes through the
    /// watch after every earlier one, and the cache waits for that.
    async fn revision_to_reach<K: ServedResource>(&self, sink: &Sink<K>) -> Result<i64, EtcdError> {
        let revision = self.client.revision(&self.prefix).await?;
        if sink.cache.resource_version() >= revision.max(0) as u64 {
            return Ok(revision);
        }
        if self.checks.ordered_progress.load(SeqCst)
            && let Ok(progress) = self.progress.lock()
            && let Some(requests) = progress.as_ref()
            && requests.request()
        {
            return Ok(revision);
        }
        self.client.put(&self.prefix, b"").await
    }

    /// Every object under the prefix at `revision` (0: the latest), a page at a time, and the
    /// revision read.
    async fn read_all<K: ServedResource>(
        &self,
        mut revision: i64,
    ) -> Result<(Vec<K>, i64), EtcdError> {
        const PAGE: i64 = 500;
        let end = prefix_end(&self.prefix);
        let mut objects = Vec::new();
        let mut from = self.prefix.clone();
        loop {
            let page = self.client.range(&from, &end, revision, PAGE).await?;
            revision = page
                .header
                .revision
                .min(if revision > 0 { revision } else { i64::MAX });
            for kv in &page.kvs {
                if kv.key == self.prefix {
                    continue; // the marker key checks write (see `revision_to_reach`)
                }
                match self.decode(kv, kv.mod_revision) {
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
    fn apply<K: ServedResource>(&self, sink: &Sink<K>, batch: Vec<WatchEvent>) -> Result<()> {
        for event in batch {
            match event {
                // The marker key checks write: it only says how far the watch has come.
                WatchEvent::Put(kv) if kv.key == self.prefix => {
                    sink.cache.advance(kv.mod_revision as u64)?
                }
                WatchEvent::Put(kv) => match self.decode(&kv, kv.mod_revision) {
                    Ok(object) => sink.cache.apply_external(object)?,
                    Err(error) => tracing::warn!(%error, "skipping an undecodable etcd value"),
                },
                WatchEvent::Delete { revision, previous } => {
                    if let Ok(object) = self.decode::<K>(&previous, revision) {
                        sink.cache.delete_external(object)?;
                    }
                    sink.cache.advance(revision as u64)?;
                }
                // Trusted only from an etcd that sends it after every earlier event.
                WatchEvent::Progress(revision) if self.checks.ordered_progress.load(SeqCst) => {
                    sink.cache.advance(revision as u64)?
                }
                WatchEvent::Progress(_) => {}
            }
        }
        Ok(())
    }

    /// After the feed broke: says why (503 until it is back), moves on to the next endpoint and
    /// waits `backoff`.
    async fn broken<K>(&self, sink: &Sink<K>, error: &EtcdError, backoff: Duration) {
        tracing::warn!(%error, "etcd watch broken; retrying");
        let reason = match error {
            EtcdError::Compacted(_) => "relisting etcd after a compaction".to_owned(),
            // `ready` says "etcd is unavailable" itself.
            EtcdError::Unavailable(reason) => reason.clone(),
            other => other.to_string(),
        };
        sink.broken(reason);
        self.client.fail_over();
        tokio::time::sleep(backoff).await;
    }
}

/// Makes the checks consistent reads wait for ([`ConsistentReads`]), one at a time, while reads want
/// them.
async fn revision_checker<K: ServedResource>(source: Arc<EtcdSource>, sink: Sink<K>) {
    let checks = &source.checks;
    loop {
        // The round reads joined, when any did (a read that gave up drops its share).
        let taken = {
            let mut next = lock(&checks.next);
            let joined = next.found.strong_count().is_some_and(|holders| holders > 1);
            joined.then(|| std::mem::take(&mut *next))
        };
        let Some(taken) = taken else {
            checks.wanted.notified().await;
            continue;
        };
        let found = source.revision_to_reach(&sink).await;
        let _unheard = taken.answer.send(found.map_err(|e| e.to_string()));
    }
}

/// Feeds the cache: list, then watch from the list's revision; on a broken watch, watch again
/// from where the cache is (or list again when etcd has compacted that far), forever.
async fn feed<K: ServedResource>(source: Arc<EtcdSource>, sink: Sink<K>) {
    let end = prefix_end(&source.prefix);
    let mut listed = false;
    let mut backoff = Duration::from_millis(100);
    let failed = |backoff: &mut Duration| {
        let wait = *backoff;
        *backoff = (wait * 2).min(Duration::from_secs(2));
        wait
    };
    loop {
        if !listed {
            let listing = source
                .read_all::<K>(0)
                .await
                .and_then(|(objects, revision)| {
                    sink.cache
                        .reset_at(objects, revision as u64)
                        .map_err(|e| EtcdError::Refused(e.to_string()))
                });
            match listing {
                Ok(()) => listed = true,
                Err(error) => {
                    source.broken(&sink, &error, failed(&mut backoff)).await;
                    continue;
                }
            }
        }
        let from = sink.cache.resource_version() + 1;
        let watch = match source.client.watch(&source.prefix, &end, from as i64).await {
            Ok(watch) => watch,
            Err(error) => {
                source.broken(&sink, &error, failed(&mut backoff)).await;
                continue;
            }
        };
        backoff = Duration::from_millis(100);
        let ordered = match source.client.server_version().await {
            Ok(version) => client::orders_progress(&version),
            Err(error) => {
                tracing::debug!(%error, "etcd's version unknown: progress notifications unused");
                false
            }
        };
        source.checks.ordered_progress.store(ordered, SeqCst);
        sink.synced();
        source.applied.send_modify(|n| *n += 1);
        if let Ok(mut progress) = source.progress.lock() {
            *progress = Some(watch.progress.clone());
        }
        let mut events = watch.events;
        let error = loop {
            match events.next().await {
                Some(Ok(batch)) => {
                    if let Err(error) = source.apply(&sink, batch) {
                        break EtcdError::Refused(error.to_string());
                    }
                    source.applied.send_modify(|n| *n += 1);
                }
                Some(Err(error)) => break error,
                None => break EtcdError::Unavailable("etcd closed the watch".into()),
            }
        };
        if let Ok(mut progress) = source.progress.lock() {
            *progress = None;
        }
        if let EtcdError::Compacted(_) = error {
            listed = false;
        }
        source.broken(&sink, &error, backoff).await;
    }
}
