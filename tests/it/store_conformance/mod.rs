//! The store conformance suite: what every [`Store`] must do, written once as checks generic
//! over the store and run against each one.
//!
//! - The in-memory store (`MemoryStore<Llama>`): every check, the writes included.
//! - The read side of the FarmPod view's watch cache (`ViewCache<FarmPod>`): every read and
//!   watch check, with its objects fed through its real Pod watch by a fake kube-apiserver
//!   (`common/fake_kube.rs`).
//!
//! A check takes a factory that makes the store under test seeded with objects (a [`Harness`]:
//! the store and the means to change what it holds: its own writes for a store that takes
//! them, its upstream for a cache). A new store (etcd) joins with a harness of its own and a
//! `conformance!` line of its checks (`on_etcd.rs`).

use crate::common::fake_kube;

use std::{
    collections::BTreeMap,
    future::Future,
    ops::ControlFlow,
    sync::Arc,
    time::{Duration, Instant},
};

use aggregated_apiserver::{
    error::Error,
    resource::{ObjectKey, ServedResource},
    store::selector::{FieldSelector, Filter, LabelSelector},
    store::{
        ClusterSource, EtcdStore, EventType, ListCursor, ListPage, ListRequest, MemoryStore,
        Object, PageInfo, Preconditions, ReadAt, Store, StoreStats, ViewCache, WatchItem,
        WatchRequest, WatchStart, WatchStream, WritableStore, memory::MemoryStoreConfig,
    },
};
use fake_kube::FakeKube;
use farm_apiserver::resources::{FarmPod, Llama};
use futures::StreamExt;

/// How long a store may take to answer (a watch item, a cache to show a change) before the
/// check fails instead of hanging.
const WAIT: Duration = Duration::from_secs(10);
/// How long a watch must stay silent for "nothing more came" to hold.
const QUIET: Duration = Duration::from_millis(300);
/// The most a whole check may take.
const CHECK: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

type Labels = &'static [(&'static str, &'static str)];

const WEB: Labels = &[("app", "web")];
const WEB_FRONT: Labels = &[("app", "web"), ("tier", "front")];
const DB: Labels = &[("app", "db")];

/// One object a store starts with: `ns/name` carrying `labels` (the harness decides its kind).
#[derive(Debug, Clone, Copy)]
struct Seed {
    ns: &'static str,
    name: &'static str,
    labels: Labels,
}

/// The standard fixture: `o0`..`o3` in each of the namespaces a, b and c (12 objects);
/// `app=web` on o0 and o2, `app=db` on o1 and o3, `tier=front` on o0 only.
fn fixture() -> Vec<Seed> {
    let mut seeds = Vec::new();
    for ns in ["a", "b", "c"] {
        for (name, labels) in [("o0", WEB_FRONT), ("o1", DB), ("o2", WEB), ("o3", DB)] {
            seeds.push(Seed { ns, name, labels });
        }
    }
    seeds
}

/// A Llama with a fixed uid per key.
fn llama(ns: &str, name: &str, weight: f64) -> Llama {
    crate::common::fixtures::llama(name)
        .namespace(ns)
        .uid(&format!("uid-{ns}-{name}"))
        .weight(weight)
        .height(1.5)
        .build()
}

fn with_labels(mut llama: Llama, labels: &[(&str, &str)]) -> Llama {
    llama.metadata.labels = Some(label_map(labels));
    llama
}

fn label_map(labels: &[(&str, &str)]) -> BTreeMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn labels_of<K: ServedResource>(object: &K) -> BTreeMap<String, String> {
    object.meta().labels.clone().unwrap_or_default()
}

fn key_of<K: ServedResource>(object: &K) -> ObjectKey {
    ObjectKey::of(object.meta())
}

/// The object's `metadata.resourceVersion`, which every stored object must carry as a number.
fn rv_of<K: ServedResource>(object: &K) -> u64 {
    object
        .meta()
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "{:?} has no numeric resourceVersion: {:?}",
                key_of(object),
                object.meta().resource_version
            )
        })
}

fn keys<K: ServedResource>(items: &[Object<K>]) -> Vec<ObjectKey> {
    items.iter().map(|o| key_of(o.get())).collect()
}

/// Keys and labels: what the checks compare states by.
fn contents<K: ServedResource>(items: &[Object<K>]) -> Vec<(ObjectKey, BTreeMap<String, String>)> {
    items
        .iter()
        .map(|o| (key_of(o.get()), labels_of(o.get())))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Harnesses: a store under test and the means to change what it holds
// ---------------------------------------------------------------------------------------------

trait Harness {
    type K: ServedResource;
    type S: Store<Self::K>;

    fn store(&self) -> &Self::S;
    /// The key the object the checks call `ns/name` is stored under.
    fn key(&self, ns: &str, name: &str) -> ObjectKey;
    /// Creates or replaces `ns/name` with `labels`: the resourceVersion of the change, once the
    /// store shows it.
    async fn put(&self, ns: &str, name: &str, labels: &[(&str, &str)]) -> u64;
    /// Deletes `ns/name`: the resourceVersion of the deletion, once the store shows it.
    async fn remove(&self, ns: &str, name: &str) -> u64;
}

/// The in-memory store of Llamas, changed through its own writes.
struct MemoryHarness {
    store: MemoryStore<Llama>,
}

async fn memory(seeds: &[Seed]) -> MemoryHarness {
    memory_with(MemoryStoreConfig::default(), seeds).await
}

async fn memory_with(config: MemoryStoreConfig, seeds: &[Seed]) -> MemoryHarness {
    let harness = MemoryHarness {
        store: MemoryStore::new(config),
    };
    let writes = harness
        .store
        .writable()
        .expect("the memory store takes writes");
    for seed in seeds {
        writes
            .create(
                with_labels(llama(seed.ns, seed.name, 40.0), seed.labels),
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("seeding {seed:?}: {e}"));
    }
    harness
}

impl Harness for MemoryHarness {
    type K = Llama;
    type S = MemoryStore<Llama>;

    fn store(&self) -> &MemoryStore<Llama> {
        &self.store
    }

    fn key(&self, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    async fn put(&self, ns: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
        let writes = self.store.writable().expect("writable");
        let written = match self.store.get(&self.key(ns, name)).await {
            Ok(current) => {
                writes
                    .update(with_labels(current.get().clone(), labels), false)
                    .await
            }
            Err(Error::NotFound(_)) => {
                writes
                    .create(with_labels(llama(ns, name, 40.0), labels), false)
                    .await
            }
            Err(e) => panic!("get {ns}/{name}: {e}"),
        }
        .unwrap_or_else(|e| panic!("put {ns}/{name}: {e}"));
        rv_of(written.get())
    }

    async fn remove(&self, ns: &str, name: &str) -> u64 {
        let writes = self.store.writable().expect("writable");
        let deleted = writes
            .delete(&self.key(ns, name), &Preconditions::default(), false)
            .await
            .unwrap_or_else(|e| panic!("delete {ns}/{name}: {e}"));
        rv_of(deleted.get())
    }
}

/// The FarmPod watch cache, fed by its Pod watch on a fake kube-apiserver.
struct CacheHarness {
    fake: Arc<FakeKube>,
    cache: Arc<ViewCache<FarmPod>>,
}

/// A synced cache over the Pods `seeds` names (a FarmPod `ns/farm-<name>` each).
async fn pod_cache(seeds: &[Seed]) -> CacheHarness {
    aggregated_apiserver::net::tls::install_default_provider();
    let fake = FakeKube::start().await;
    for seed in seeds {
        fake.add(fake_kube::pod(seed.ns, seed.name, seed.labels, 1));
    }
    let cache = ClusterSource::<FarmPod>::start(fake.client().await, Vec::new());
    let harness = CacheHarness { fake, cache };
    let deadline = Instant::now() + WAIT;
    loop {
        let stats = harness.cache.stats().await.expect("stats");
        if harness.cache.check_ready().is_ok() && stats.objects == seeds.len() {
            return harness;
        }
        assert!(
            Instant::now() < deadline,
            "the Pod cache did not sync {} Pods: ready {:?}, {stats:?}",
            seeds.len(),
            harness.cache.check_ready().err()
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

impl CacheHarness {
    /// The cache's revision once it has moved past `before` (one fed change applied).
    async fn settled(&self, before: u64, what: &str) -> u64 {
        let deadline = Instant::now() + WAIT;
        loop {
            let now = self.cache.stats().await.expect("stats").resource_version;
            if now > before {
                return now;
            }
            assert!(
                Instant::now() < deadline,
                "the Pod cache did not show {what} (still at {now})"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

impl Harness for CacheHarness {
    type K = FarmPod;
    type S = ViewCache<FarmPod>;

    fn store(&self) -> &ViewCache<FarmPod> {
        &self.cache
    }

    fn key(&self, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(
            ns,
            format!("{}{name}", farm_apiserver::resources::farmpod::PREFIX),
        )
    }

    async fn put(&self, ns: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
        let before = self.cache.stats().await.expect("stats").resource_version;
        self.fake.add(fake_kube::pod(ns, name, labels, 1));
        let rv = self.settled(before, &format!("Pod {ns}/{name}")).await;
        let shown = self
            .cache
            .get(&self.key(ns, name))
            .await
            .unwrap_or_else(|e| panic!("the cache applied Pod {ns}/{name} but get says {e}"));
        assert_eq!(labels_of(shown.get()), label_map(labels));
        assert_eq!(
            rv_of(shown.get()),
            rv,
            "the FarmPod's version is its change's"
        );
        rv
    }

    async fn remove(&self, ns: &str, name: &str) -> u64 {
        let before = self.cache.stats().await.expect("stats").resource_version;
        self.fake.delete(ns, name);
        self.settled(before, &format!("the deletion of Pod {ns}/{name}"))
            .await
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// Runs one check, failing it when it hangs.
async fn run(check: impl Future<Output = ()>) {
    tokio::time::timeout(CHECK, check)
        .await
        .unwrap_or_else(|_| panic!("the check did not finish within {CHECK:?}"));
}

macro_rules! assert_err {
    ($result:expr, $pattern:pat $(,)?) => {
        match $result {
            Err($pattern) => {}
            other => panic!(
                "expected Err({}), got {:?}",
                stringify!($pattern),
                other.map(|_| "Ok(..)")
            ),
        }
    };
}

fn limited(limit: usize) -> ListRequest {
    ListRequest {
        limit: Some(limit),
        ..Default::default()
    }
}

fn labelled(selector: &str) -> Filter {
    Filter {
        labels: LabelSelector::parse(selector).expect("label selector"),
        ..Default::default()
    }
}

fn by_fields(selector: &str) -> Filter {
    Filter {
        fields: FieldSelector::parse(selector).expect("field selector"),
        ..Default::default()
    }
}

async fn list<K: ServedResource>(store: &impl Store<K>, request: &ListRequest) -> ListPage<K> {
    store
        .list(request)
        .await
        .unwrap_or_else(|e| panic!("list {request:?}: {e}"))
}

/// The store's object count and resourceVersion (its history's size is another test's).
async fn stats<K: ServedResource>(store: &impl Store<K>) -> StoreStats {
    let stats = store.stats().await.expect("stats");
    StoreStats {
        objects: stats.objects,
        resource_version: stats.resource_version,
        ..Default::default()
    }
}

/// Every page of `request`, following the continue tokens.
async fn page_through<K: ServedResource>(
    store: &impl Store<K>,
    request: &ListRequest,
) -> Vec<ListPage<K>> {
    let mut pages: Vec<ListPage<K>> = Vec::new();
    let mut request = request.clone();
    loop {
        let page = store
            .list(&request)
            .await
            .unwrap_or_else(|e| panic!("page {} of {request:?}: {e}", pages.len() + 1));
        let next = page.info.continue_token.clone();
        pages.push(page);
        match next {
            Some(token) => request.continue_token = Some(token),
            None => return pages,
        }
        assert!(pages.len() <= 100, "the continue tokens never end");
    }
}

/// The metadata every page of a paged list must agree on: one resourceVersion, full pages
/// until the last, and (for an unfiltered list of `total` objects) the items still to come.
fn check_pages<K: ServedResource>(pages: &[ListPage<K>], limit: usize, total: Option<usize>) {
    let rv = pages[0].info.resource_version;
    let mut seen = 0;
    for (i, page) in pages.iter().enumerate() {
        let n = i + 1;
        assert_eq!(
            page.info.resource_version, rv,
            "page {n} is at another resourceVersion than the first"
        );
        assert!(page.items.len() <= limit, "page {n} is over the limit");
        seen += page.items.len();
        let last = n == pages.len();
        match (last, total) {
            (false, Some(total)) => {
                assert_eq!(
                    page.items.len(),
                    limit,
                    "page {n} of an unfiltered list is short"
                );
                assert_eq!(
                    page.info.remaining_item_count,
                    Some((total - seen) as i64),
                    "remainingItemCount of page {n}"
                );
            }
            (false, None) => assert_eq!(
                page.info.remaining_item_count, None,
                "remainingItemCount is unknown with a selector (page {n})"
            ),
            (true, _) => {
                assert_eq!(page.info.continue_token, None);
                assert_eq!(
                    page.info.remaining_item_count, None,
                    "the last page has no remainingItemCount"
                );
            }
        }
    }
}

fn all_items<K: ServedResource>(pages: &[ListPage<K>]) -> Vec<Object<K>> {
    pages.iter().flat_map(|p| p.items.iter().cloned()).collect()
}

fn watch_request(start: WatchStart) -> WatchRequest {
    WatchRequest {
        namespace: None,
        filter: Filter::default(),
        start,
    }
}

async fn watch<K: ServedResource>(store: &impl Store<K>, request: WatchRequest) -> WatchStream<K> {
    store
        .watch(request.clone())
        .await
        .unwrap_or_else(|e| panic!("watch {request:?}: {e}"))
}

/// An event as the checks compare them: type, key, resourceVersion.
type Seen = (EventType, ObjectKey, u64);

/// The next item that is not a progress report; None when the stream ended.
async fn next_item<K: ServedResource>(watch: &mut WatchStream<K>) -> Option<WatchItem<K>> {
    loop {
        match tokio::time::timeout(WAIT, watch.next()).await {
            Err(_) => panic!("the watch sent nothing within {WAIT:?}"),
            Ok(Some(WatchItem::Progress(_))) => continue,
            Ok(item) => return item,
        }
    }
}

fn seen<K: ServedResource>(item: Option<WatchItem<K>>, what: &str) -> Seen {
    match item {
        Some(WatchItem::Event(event)) => {
            assert_eq!(
                rv_of(event.object.get()),
                event.resource_version,
                "the object of {} {:?} carries its event's version",
                event.type_.as_str(),
                key_of(event.object.get())
            );
            (
                event.type_,
                key_of(event.object.get()),
                event.resource_version,
            )
        }
        other => panic!("expected {what}, got {other:?}"),
    }
}

/// The next `n` events (progress reports skipped; anything else fails the check).
async fn next_events<K: ServedResource>(watch: &mut WatchStream<K>, n: usize) -> Vec<Seen> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(seen(
            next_item(watch).await,
            &format!("event {} of {n}", i + 1),
        ));
    }
    out
}

/// Asserts nothing but progress comes within [`QUIET`], and the stream stays open.
async fn assert_quiet<K: ServedResource>(watch: &mut WatchStream<K>) {
    let next = tokio::time::timeout(QUIET, async {
        loop {
            match watch.next().await {
                Some(WatchItem::Progress(_)) => continue,
                other => return other,
            }
        }
    })
    .await;
    if let Ok(item) = next {
        panic!("expected nothing more on the watch, got {item:?}");
    }
}

/// Every event until the watch is quiet for [`QUIET`].
async fn events_until_quiet<K: ServedResource>(watch: &mut WatchStream<K>) -> Vec<Seen> {
    let mut out = Vec::new();
    loop {
        let next = tokio::time::timeout(QUIET, async {
            loop {
                match watch.next().await {
                    Some(WatchItem::Progress(_)) => continue,
                    other => return other,
                }
            }
        })
        .await;
        match next {
            Err(_) => return out,
            Ok(item) => out.push(seen(item, "an event or silence")),
        }
    }
}

/// Drains a cursor `piece` objects at a time.
async fn drain<K: ServedResource>(
    mut cursor: ListCursor<K>,
    piece: usize,
) -> (PageInfo, Vec<Object<K>>) {
    let mut out: Vec<Object<K>> = Vec::new();
    for _ in 0..10_000 {
        let mut lent = 0;
        let mut visit = |object: &Object<K>| {
            out.push(object.clone());
            lent += 1;
            if lent >= piece {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        let more = std::future::poll_fn(|cx| cursor.objects.poll_lend(cx, &mut visit))
            .await
            .expect("a cursor lends its objects");
        if !more {
            return (cursor.info, out);
        }
    }
    panic!("the cursor never ends");
}

// ---------------------------------------------------------------------------------------------
// Reads (every store)
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Watches (every store)
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Watch limits (stores whose window and buffer the harness sets)
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// Writes (writable stores)
// ---------------------------------------------------------------------------------------------

// ---------------------------------------------------------------------------------------------
// The stores
// ---------------------------------------------------------------------------------------------

/// The shared checks as tests of one store, in a module named for it: each is
/// `$run($check($make))` (`store_conformance::memory::get_and_missing`). Checks that take more
/// than the store are written out beside them.
macro_rules! conformance {
    ($store:ident: $run:ident, $make:ident, [$($check:ident),* $(,)?]) => {
        mod $store {
            use super::*;
            $(
                #[tokio::test]
                async fn $check() {
                    $run(super::$check($make)).await;
                }
            )*
        }
    };
}

// The memory store (Llamas).

// The FarmPod watch cache, fed by a fake kube-apiserver's Pod watch.

// ---------------------------------------------------------------------------------------------
// The etcd store (Llamas), against a real etcd of its own per check.
// ---------------------------------------------------------------------------------------------
use reads::{
    continue_after_snapshot_gone, cursor_agrees_with_list, get_and_missing, malformed_continue,
    namespace_scoping, pages_and_continue, pages_with_selectors, read_at_versions, selectors,
    stats_agree, writes_between_pages,
};
use watches::{
    lagging_watcher_ended, watch_after_resumes, watch_before_window_expired, watch_initial_state,
    watch_scoped, watch_selection_transitions,
};
use writes::{
    create_assigns_versions, delete_preconditions, dry_runs_change_nothing, memory_store,
    small_window, stats_follow_writes, update_compare_and_swap,
};

mod memory_and_view;
mod on_etcd;
mod reads;
mod watches;
mod writes;
