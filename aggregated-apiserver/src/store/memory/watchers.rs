//! Watchers of a [`MemoryStore`](super::MemoryStore): the event history they read from, and
//! each one's cursor into it.
//!
//! A watcher holds no events of its own: it reads the store's bounded history at its own pace,
//! so however far behind it falls, it costs the server nothing the history does not already
//! hold. Its *buffer* is how far behind the newest event its cursor is, bounded by count and
//! bytes ([`MemoryStoreConfig::watch_buffer`](super::MemoryStoreConfig)); past either bound it
//! is ended, as kube-apiserver's cacher ends a watcher it cannot hand an event to: its stream
//! ends cleanly and the client resumes from the last resourceVersion it saw, which the history
//! (larger than any watcher's buffer) still holds. Writers never wait on a watcher: a write
//! bumps one counter that wakes them, and now and then sweeps the cursors (so that a watcher
//! whose connection stopped reading is counted as ended while it is stuck).

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, Weak,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
};

use tokio::sync::watch;

use super::{Shared, seen_by};
use crate::{
    error::Error,
    resource::ServedResource,
    store::selector::Filter,
    store::{Event, WatchItem},
};

/// At most this many events are taken from the history at once by one watcher, and at most
/// [`BATCH_BYTES`] (one event at least): what a watcher whose client stopped reading keeps.
const BATCH_EVENTS: usize = 32;
const BATCH_BYTES: u64 = 256 * 1024;

/// The events watches resume from and read, numbered in the order they were pushed
/// (`seq`), with the bytes each holds (estimated) counted cumulatively so that how far behind a
/// cursor is, in events and bytes, is two subtractions.
pub(super) struct History<K> {
    events: VecDeque<Arc<Event<K>>>,
    /// Bytes pushed up to and including each event (in step with `events`).
    ends: VecDeque<u64>,
    /// The seq of `events[0]`.
    first_seq: u64,
    /// Bytes ever pushed, and ever evicted.
    pushed_bytes: u64,
    evicted_bytes: u64,
}

/// How far a cursor is behind the newest event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Lag {
    pub events: u64,
    pub bytes: u64,
}

impl<K> History<K> {
    pub fn new() -> Self {
        Self {
            events: VecDeque::new(),
            ends: VecDeque::new(),
            first_seq: 0,
            pushed_bytes: 0,
            evicted_bytes: 0,
        }
    }

    /// The seq the next pushed event gets: a cursor here has read everything.
    pub fn head(&self) -> u64 {
        self.first_seq + self.events.len() as u64
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    /// What the events held now hold, estimated.
    pub fn bytes(&self) -> usize {
        usize::try_from(self.pushed_bytes - self.evicted_bytes).unwrap_or(usize::MAX)
    }

    pub fn push(&mut self, event: Arc<Event<K>>, bytes: usize) {
        self.pushed_bytes += bytes as u64;
        self.ends.push_back(self.pushed_bytes);
        self.events.push_back(event);
    }

    /// Drops the oldest event, returning it.
    pub fn evict(&mut self) -> Option<Arc<Event<K>>> {
        let event = self.events.pop_front()?;
        self.evicted_bytes = self.ends.pop_front().unwrap_or(self.evicted_bytes);
        self.first_seq += 1;
        Some(event)
    }

    /// The event at `seq`, while the history holds it.
    fn event_at(&self, seq: u64) -> Option<&Arc<Event<K>>> {
        let index = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.events.get(index)
    }

    /// The seq of the first event after resourceVersion `rv`.
    pub fn seq_after(&self, rv: u64) -> u64 {
        self.first_seq + self.events.partition_point(|e| e.resource_version <= rv) as u64
    }

    /// Bytes pushed before the event at `seq` (which the history holds, or is its head).
    fn end_before(&self, seq: u64) -> u64 {
        match (seq - self.first_seq).checked_sub(1) {
            None => self.evicted_bytes,
            Some(i) => self
                .ends
                .get(i as usize)
                .copied()
                .unwrap_or(self.pushed_bytes),
        }
    }

    /// How far behind a cursor at `seq` is; None when the events it was to read next are gone.
    pub fn lag(&self, seq: u64) -> Option<Lag> {
        if seq < self.first_seq {
            return None;
        }
        let seq = seq.min(self.head());
        Some(Lag {
            events: self.head() - seq,
            bytes: self.pushed_bytes - self.end_before(seq),
        })
    }

    /// The events from `seq` on, at most [`BATCH_EVENTS`] and (past the first) [`BATCH_BYTES`].
    fn batch(&self, seq: u64) -> impl Iterator<Item = &Arc<Event<K>>> {
        let start = (seq.saturating_sub(self.first_seq)) as usize;
        let limit = self.end_before(seq) + BATCH_BYTES;
        self.events
            .range(start.min(self.events.len())..)
            .zip(self.ends.range(start.min(self.ends.len())..))
            .take(BATCH_EVENTS)
            .enumerate()
            .take_while(move |(i, (_, end))| *i == 0 || **end <= limit)
            .map(|(_, (event, _))| event)
    }
}

/// Where one watcher is in the history, shared between its stream and the sweeps.
struct Cursor {
    /// The history's head when the watcher started: the events before it are the watcher's
    /// initial events (a resumed watch's backlog), not counted in its buffer, as
    /// kube-apiserver's cacher sends a new watcher's backlog apart from its bounded input.
    start: u64,
    /// The seq of the next event the watcher reads.
    next: AtomicU64,
    /// Set once the watcher fell too far behind: its stream ends.
    ended: AtomicBool,
}

/// Every watcher's cursor, the counter that wakes them, and how many were ended.
pub(super) struct Watchers {
    /// The history's head: sent after each write, under the store's write lock.
    head: watch::Sender<u64>,
    cursors: Mutex<Vec<Weak<Cursor>>>,
    /// Watchers ended for falling behind, ever.
    terminated: AtomicU64,
    /// Where the history stood (seq, bytes pushed) at the last sweep.
    swept: Mutex<(u64, u64)>,
    /// The bound of each watcher's buffer.
    max_events: u64,
    max_bytes: u64,
    /// The group-qualified resource, for the log.
    resource: String,
}

impl Watchers {
    pub fn new(resource: String, max_events: usize, max_bytes: usize) -> Self {
        Self {
            resource,
            head: watch::Sender::new(0),
            cursors: Mutex::new(Vec::new()),
            terminated: AtomicU64::new(0),
            swept: Mutex::new((0, 0)),
            max_events: (max_events as u64).max(1),
            max_bytes: (max_bytes as u64).max(1),
        }
    }

    /// Watchers ended for falling behind, ever.
    pub fn terminated(&self) -> u64 {
        self.terminated.load(Ordering::Relaxed)
    }

    /// Whether the watcher at `cursor` is further behind than its buffer allows (or the events
    /// it was to read next are gone).
    fn over<K>(&self, history: &History<K>, cursor: &Cursor) -> bool {
        let next = cursor.next.load(Ordering::Acquire);
        history.lag(next).is_none()
            || history
                .lag(next.max(cursor.start))
                .is_some_and(|l| l.events > self.max_events || l.bytes > self.max_bytes)
    }

    /// Ends the watcher at `cursor` for falling behind, counted once: how far behind it was
    /// when this call ended it, for the log (None when it had already been ended).
    fn end<K>(&self, history: &History<K>, cursor: &Cursor) -> Option<Option<Lag>> {
        if cursor.ended.swap(true, Ordering::AcqRel) {
            return None;
        }
        self.terminated.fetch_add(1, Ordering::Relaxed);
        let next = cursor.next.load(Ordering::Acquire);
        Some(history.lag(next.max(cursor.start)))
    }

    /// Logs `count` watchers ended (once per read or sweep, outside the store's locks where the
    /// caller can: a sweep may end thousands at once), with how far behind one of them was.
    fn log_ended(&self, count: usize, lag: Option<Lag>) {
        tracing::info!(
            resource = %self.resource,
            watchers = count,
            behind_events = lag.map(|l| l.events),
            behind_bytes = lag.map(|l| l.bytes),
            buffer_events = self.max_events,
            buffer_bytes = self.max_bytes,
            "ended a watcher that fell further behind than its buffer (it resumes from its last resourceVersion)"
        );
    }

    /// Tells the watchers the history has grown (called under the store's write lock, after
    /// the push); once the history has moved an eighth of a buffer since the last sweep, ends
    /// every watcher whose buffer is over its bound.
    pub fn pushed<K>(&self, history: &History<K>) {
        self.head.send_replace(history.head());
        let Ok(mut swept) = self.swept.lock() else {
            return;
        };
        let (seq, bytes) = *swept;
        if history.head() - seq < self.max_events.div_ceil(8)
            && history.pushed_bytes - bytes < self.max_bytes.div_ceil(8)
        {
            return;
        }
        *swept = (history.head(), history.pushed_bytes);
        drop(swept);
        let (mut ended, mut lag) = (0, None);
        if let Ok(mut cursors) = self.cursors.lock() {
            cursors.retain(|weak| match weak.upgrade() {
                Some(cursor) if self.over(history, &cursor) => {
                    if let Some(behind) = self.end(history, &cursor) {
                        ended += 1;
                        lag = lag.or(behind);
                    }
                    false
                }
                Some(cursor) => !cursor.ended.load(Ordering::Acquire),
                None => false,
            });
        }
        if ended > 0 {
            self.log_ended(ended, lag);
        }
    }

    /// A new watcher's cursor at `seq` (called under the store's lock, so that no event is
    /// pushed between reading `seq` and subscribing).
    fn register(&self, seq: u64, head: u64) -> (Arc<Cursor>, watch::Receiver<u64>) {
        let cursor = Arc::new(Cursor {
            start: head,
            next: AtomicU64::new(seq),
            ended: AtomicBool::new(false),
        });
        if let Ok(mut cursors) = self.cursors.lock() {
            // Watchers that went away are forgotten here too, not only in sweeps (which need
            // writes), so the list stays within twice the watchers alive.
            if cursors.len() >= 64 && cursors.len().is_power_of_two() {
                cursors.retain(|weak| weak.strong_count() > 0);
            }
            cursors.push(Arc::downgrade(&cursor));
        }
        (cursor, self.head.subscribe())
    }
}

/// A watcher's live part: the history's events after its cursor, as it selects them.
pub(super) struct Follower<K> {
    shared: Arc<Shared<K>>,
    cursor: Arc<Cursor>,
    head: watch::Receiver<u64>,
    namespace: Option<String>,
    filter: Filter,
    /// Events at or below this resourceVersion were already sent (or are not wanted).
    after: u64,
    /// What the watcher sends before reading the history: its initial events (for
    /// `sendInitialEvents` and watches without a resourceVersion), then each batch read.
    pending: VecDeque<WatchItem<K>>,
    /// The resourceVersion of the last event sent (0: none yet).
    sent_rv: u64,
    /// Its end was told (an ERROR, or nothing).
    finished: bool,
}

/// What one read of the history gave.
enum Read {
    Some,
    Nothing,
    Ended,
}

impl<K: ServedResource> Follower<K> {
    /// A watcher reading from `seq` on, the history's head being `head` (under the store's
    /// lock: see [`Watchers::register`]).
    pub fn new(
        shared: Arc<Shared<K>>,
        (seq, head): (u64, u64),
        (namespace, filter): (Option<String>, Filter),
        after: u64,
        initial: Vec<WatchItem<K>>,
    ) -> Self {
        let (cursor, head) = shared.watchers.register(seq, head);
        Self {
            shared,
            cursor,
            head,
            namespace,
            filter,
            after,
            pending: initial.into(),
            sent_rv: 0,
            finished: false,
        }
    }

    /// The next item; None once the watcher fell too far behind (what it had not sent yet is
    /// dropped, as kube-apiserver's cacher stops sending a terminated watcher's initial
    /// events; see [`Follower::ending`]), or once the store is gone.
    pub async fn next(&mut self) -> Option<WatchItem<K>> {
        loop {
            if self.cursor.ended.load(Ordering::Acquire) {
                return self.ending();
            }
            if let Some(item) = self.pending.pop_front() {
                if let WatchItem::Event(event) = &item {
                    self.sent_rv = event.resource_version;
                }
                return Some(item);
            }
            // Marked before reading: a push after this read wakes `changed` below.
            self.head.borrow_and_update();
            match self.read() {
                Read::Some => {}
                Read::Ended => return self.ending(),
                Read::Nothing => {
                    if self.head.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }
    }

    /// The end of a watcher that fell too far behind: nothing more, so that it resumes from the
    /// last resourceVersion it saw, unless it was ended between two events of one version (a
    /// relist's changes share one): resuming from it would skip the rest, so it is told 410
    /// Expired and relists instead.
    fn ending(&mut self) -> Option<WatchItem<K>> {
        if std::mem::replace(&mut self.finished, true) {
            return None;
        }
        let next_rv = self
            .pending
            .iter()
            .find_map(|item| match item {
                WatchItem::Event(event) => Some(event.resource_version),
                _ => None,
            })
            .or_else(|| {
                let state = self.shared.state.read().ok()?;
                let seq = self.cursor.next.load(Ordering::Acquire);
                state.history.event_at(seq).map(|e| e.resource_version)
            });
        self.pending = VecDeque::new();
        (self.sent_rv > 0 && next_rv == Some(self.sent_rv)).then(|| {
            WatchItem::Error(Error::Expired(format!(
                "the watcher fell behind between changes at resourceVersion {}; relist",
                self.sent_rv
            )))
        })
    }

    fn read(&mut self) -> Read {
        let watchers = &self.shared.watchers;
        let Ok(state) = self.shared.state.read() else {
            return Read::Ended;
        };
        let history = &state.history;
        let seq = self.cursor.next.load(Ordering::Acquire);
        if watchers.over(history, &self.cursor) {
            let ended = watchers.end(history, &self.cursor);
            drop(state);
            if let Some(lag) = ended {
                watchers.log_ended(1, lag);
            }
            return Read::Ended;
        }
        if seq >= history.head() {
            return Read::Nothing;
        }
        let batch: Vec<Arc<Event<K>>> = history.batch(seq).cloned().collect();
        let next = seq + batch.len() as u64;
        let caught_up = next >= history.head();
        // Moved before the lock goes: a sweep never sees a cursor behind what was taken.
        self.cursor.next.store(next, Ordering::Release);
        drop(state);

        let mut last_rv = None;
        for event in batch {
            if event.resource_version <= self.after {
                continue;
            }
            last_rv = Some(event.resource_version);
            if let Some(seen) = seen_by(self.namespace.as_deref(), &self.filter, &event) {
                self.pending.push_back(WatchItem::Event(seen));
            }
        }
        // Nothing selected: progress is still progress (for bookmarks).
        if self.pending.is_empty()
            && caught_up
            && let Some(rv) = last_rv
        {
            self.pending.push_back(WatchItem::Progress(rv));
        }
        Read::Some
    }
}
