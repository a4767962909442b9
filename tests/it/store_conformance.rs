//! The store conformance suite: what every [`Store`] must do, written once as checks generic
//! over the store and run against each one.
//!
//! - The in-memory store (`MemoryStore<Llama>`): every check, the writes included.
//! - The read side of the FarmPod watch cache (`PodCache`): every read and watch check, with its
//!   objects fed through its real Pod watch by a fake kube-apiserver (`common/fake_kube.rs`).
//!
//! A check takes a factory that makes the store under test seeded with objects (a [`Harness`]:
//! the store and the means to change what it holds: its own writes for a store that takes
//! them, its upstream for a cache). A new store (etcd) joins with a harness of its own and one
//! `#[tokio::test]` per check at the end of this file.

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
    selector::{FieldSelector, Filter, LabelSelector},
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
    aggregated_apiserver::tls::install_default_provider();
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

/// Get returns each stored object under its key; a missing key, or a name in another
/// namespace, is NotFound; the sync path agrees with the async one.
async fn get_and_missing<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let current = stats(store).await.resource_version;
    for seed in &seeds {
        let key = h.key(seed.ns, seed.name);
        let object = store
            .get(&key)
            .await
            .unwrap_or_else(|e| panic!("get {key:?}: {e}"));
        assert_eq!(key_of(object.get()), key);
        assert_eq!(labels_of(object.get()), label_map(seed.labels));
        assert!(
            rv_of(object.get()) <= current,
            "{key:?} is newer than the store"
        );
        if let Some(sync) = store.get_sync(&key.namespace, &key.name) {
            let sync = sync.unwrap_or_else(|e| panic!("get_sync {key:?}: {e}"));
            assert_eq!(rv_of(sync.get()), rv_of(object.get()));
        }
    }
    for (ns, name) in [("a", "missing"), ("zz", "o0"), ("", "o0")] {
        let key = h.key(ns, name);
        assert_err!(store.get(&key).await, Error::NotFound(_));
        if let Some(sync) = store.get_sync(&key.namespace, &key.name) {
            assert_err!(sync, Error::NotFound(_));
        }
    }
}

/// Stats count the objects and name the revision lists are at; they follow every change.
async fn stats_agree<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let before = stats(store).await;
    assert_eq!(before.objects, 12);
    assert_eq!(
        list(store, &ListRequest::default())
            .await
            .info
            .resource_version,
        before.resource_version
    );
    for (ns, count) in [(None, 12), (Some("b"), 4), (Some("zz"), 0)] {
        if let Some(n) = store.count_sync(ns) {
            assert_eq!(n, count, "count_sync({ns:?})");
        }
    }

    let added = h.put("b", "new", WEB).await;
    assert!(added > before.resource_version);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 13,
            resource_version: added,
            ..Default::default()
        }
    );
    let modified = h.put("b", "new", DB).await;
    assert!(modified > added);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 13,
            resource_version: modified,
            ..Default::default()
        }
    );
    let deleted = h.remove("a", "o1").await;
    assert!(deleted > modified);
    assert_eq!(
        stats(store).await,
        StoreStats {
            objects: 12,
            resource_version: deleted,
            ..Default::default()
        }
    );
    assert_eq!(
        list(store, &ListRequest::default())
            .await
            .info
            .resource_version,
        deleted
    );
    if let Some(n) = store.count_sync(Some("a")) {
        assert_eq!(n, 3);
    }
}

/// Paged lists go in key order, every page at the first page's version, each object exactly
/// once, with remainingItemCount counting what is still to come.
async fn pages_and_continue<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let full = list(store, &ListRequest::default()).await;
    let mut expected: Vec<ObjectKey> = seeds.iter().map(|s| h.key(s.ns, s.name)).collect();
    expected.sort();
    assert_eq!(
        keys(&full.items),
        expected,
        "an unlimited list is in key order"
    );
    assert_eq!(full.info.continue_token, None);
    assert_eq!(full.info.remaining_item_count, None);

    for limit in [1, 5, 11, 12, 13] {
        let pages = page_through(store, &limited(limit)).await;
        check_pages(&pages, limit, Some(12));
        assert_eq!(pages[0].info.resource_version, full.info.resource_version);
        assert_eq!(
            keys(&all_items(&pages)),
            expected,
            "pages of {limit}: every object once, in key order"
        );
        assert_eq!(pages.len(), 12usize.div_ceil(limit), "pages of {limit}");
    }
    // A limit of 0 is no limit.
    let zero = list(store, &limited(0)).await;
    assert_eq!(keys(&zero.items), expected);
    assert_eq!(zero.info.continue_token, None);
}

/// Paging with label and field selectors: only matching objects, in order, once each, and no
/// remainingItemCount (kube-apiserver cannot know it with a selector either).
async fn pages_with_selectors<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let expect = |wanted: &dyn Fn(&Seed) -> bool| {
        let mut keys: Vec<ObjectKey> = seeds
            .iter()
            .filter(|s| wanted(s))
            .map(|s| h.key(s.ns, s.name))
            .collect();
        keys.sort();
        keys
    };
    let cases: [(Filter, Vec<ObjectKey>); 3] = [
        (
            labelled("app=web"),
            expect(&|s| s.labels.contains(&("app", "web"))),
        ),
        (
            labelled("app!=web"),
            expect(&|s| !s.labels.contains(&("app", "web"))),
        ),
        (by_fields("metadata.namespace!=a"), expect(&|s| s.ns != "a")),
    ];
    for (filter, wanted) in cases {
        for limit in [1, 2, 5] {
            let request = ListRequest {
                filter: filter.clone(),
                limit: Some(limit),
                ..Default::default()
            };
            let pages = page_through(store, &request).await;
            check_pages(&pages, limit, None);
            assert_eq!(
                keys(&all_items(&pages)),
                wanted,
                "{filter:?} in pages of {limit}"
            );
        }
    }
}

/// A change between pages does not show in later pages: they keep the first page's state, and
/// that state stays readable at its version (`ReadAt::Exact`) after the change.
async fn writes_between_pages<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let before = list(store, &ListRequest::default()).await;
    let first = list(store, &limited(5)).await;
    let rv0 = first.info.resource_version;
    assert_eq!(rv0, before.info.resource_version);
    assert_eq!(
        keys(&first.items),
        [
            h.key("a", "o0"),
            h.key("a", "o1"),
            h.key("a", "o2"),
            h.key("a", "o3"),
            h.key("b", "o0")
        ]
    );
    let token = first.info.continue_token.clone().expect("a continue token");

    // Changes after the first page: in the part still to come and in the part already served.
    h.put("c", "o9", WEB).await;
    h.put("b", "o2", DB).await;
    h.remove("c", "o1").await;
    h.put("a", "o5", WEB).await;
    let last = h.remove("a", "o1").await;

    let rest = page_through(
        store,
        &ListRequest {
            limit: Some(5),
            continue_token: Some(token),
            ..Default::default()
        },
    )
    .await;
    let mut pages = vec![first];
    pages.extend(rest);
    check_pages(&pages, 5, Some(12));
    assert_eq!(
        contents(&all_items(&pages)),
        contents(&before.items),
        "the later pages show the state of the first"
    );

    // The new state, at the last change.
    let now = list(store, &ListRequest::default()).await;
    assert_eq!(now.info.resource_version, last);
    let mut expected: Vec<ObjectKey> = seeds
        .iter()
        .map(|s| h.key(s.ns, s.name))
        .filter(|k| *k != h.key("c", "o1") && *k != h.key("a", "o1"))
        .chain([h.key("c", "o9"), h.key("a", "o5")])
        .collect();
    expected.sort();
    assert_eq!(keys(&now.items), expected);
    let b2 = now
        .items
        .iter()
        .find(|o| key_of(o.get()) == h.key("b", "o2"))
        .expect("b/o2");
    assert_eq!(labels_of(b2.get()), label_map(DB));

    // The first page's state is still there at its version.
    let exact = store
        .list(&ListRequest {
            read_at: ReadAt::Exact(rv0),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("a list at {rv0}, the version a served page showed: {e}"));
    assert_eq!(exact.info.resource_version, rv0);
    assert_eq!(contents(&exact.items), contents(&before.items));
}

/// A continue token that is not one is 400 Bad Request.
async fn malformed_continue<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    // Not base64; base64 of `{}`; base64 of `not json`; an empty token.
    for token in ["!!not a token!!", "e30", "bm90IGpzb24", ""] {
        let request = ListRequest {
            limit: Some(2),
            continue_token: Some(token.into()),
            ..Default::default()
        };
        match h.store().list(&request).await {
            Err(Error::BadRequest(_)) => {}
            other => panic!(
                "continue {token:?}: expected BadRequest, got {:?}",
                other.map(|p| keys(&p.items))
            ),
        }
    }
}

/// A continue token whose snapshot the store no longer keeps is 410 Expired (never a page of
/// some other state). `kept` is how many list snapshots the store keeps.
async fn continue_after_snapshot_gone<H: Harness>(make: impl AsyncFn(&[Seed]) -> H, kept: usize) {
    let h = make(&fixture()).await;
    let store = h.store();
    let first = list(store, &limited(2)).await;
    let old = first.info.continue_token.expect("a continue token");
    let mut latest = None;
    for i in 0..kept {
        h.put("z", &format!("s{i}"), WEB).await;
        let page = list(store, &limited(2)).await;
        latest = Some(page.info.continue_token.expect("a continue token"));
    }
    let continued = store
        .list(&ListRequest {
            limit: Some(2),
            continue_token: latest,
            ..Default::default()
        })
        .await;
    assert!(
        continued.is_ok(),
        "the newest token still works: {:?}",
        continued.err()
    );
    assert_err!(
        store
            .list(&ListRequest {
                limit: Some(2),
                continue_token: Some(old),
                ..Default::default()
            })
            .await,
        Error::Expired(_),
    );
}

/// What each `ReadAt` gives: the latest state, a state not older than asked, exactly the state
/// asked (or 410 when it is gone), and "Too large resource version" for one not reached.
async fn read_at_versions<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let r1 = h.put("a", "x1", WEB).await;
    let r2 = h.put("a", "x2", WEB).await;
    assert!(r2 > r1);
    let at = |read_at| ListRequest {
        read_at,
        ..Default::default()
    };

    let latest = list(store, &at(ReadAt::Latest)).await;
    assert_eq!(latest.info.resource_version, r2);
    assert_eq!(latest.items.len(), 14);
    let any = list(store, &at(ReadAt::Any)).await;
    assert!(any.info.resource_version <= r2);
    for floor in [r1, r2] {
        let page = list(store, &at(ReadAt::NotOlderThan(floor))).await;
        assert!(page.info.resource_version >= floor);
    }
    let exact = list(store, &at(ReadAt::Exact(r2))).await;
    assert_eq!(exact.info.resource_version, r2);
    assert_eq!(contents(&exact.items), contents(&latest.items));

    // An older version: exactly that state, or 410 when the store has no longer got it.
    match store.list(&at(ReadAt::Exact(r1))).await {
        Ok(page) => {
            assert_eq!(page.info.resource_version, r1);
            let keys = keys(&page.items);
            assert!(keys.contains(&h.key("a", "x1")));
            assert!(
                !keys.contains(&h.key("a", "x2")),
                "a list at {r1} shows a later change"
            );
        }
        Err(Error::Expired(_)) => {}
        Err(e) => panic!("a list at the older version {r1}: {e}"),
    }

    for future in [r2 + 1, r2 + 1000] {
        assert_err!(
            store.list(&at(ReadAt::NotOlderThan(future))).await,
            Error::TooLargeResourceVersion(_),
        );
        assert_err!(
            store.list(&at(ReadAt::Exact(future))).await,
            Error::TooLargeResourceVersion(_),
        );
    }
}

/// Label and field selectors select what they say, with and without a namespace.
async fn selectors<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let o2 = h.key("a", "o2").name;
    fn has(s: &Seed, pair: (&str, &str)) -> bool {
        s.labels.contains(&pair)
    }
    fn has_key(s: &Seed, key: &str) -> bool {
        s.labels.iter().any(|(k, _)| *k == key)
    }
    type Wanted = fn(&Seed) -> bool;
    let cases: Vec<(Option<&str>, Filter, Wanted)> = vec![
        (None, labelled("app=web"), |s| has(s, ("app", "web"))),
        (None, labelled("app==db"), |s| has(s, ("app", "db"))),
        (None, labelled("app!=web"), |s| !has(s, ("app", "web"))),
        (None, labelled("app in (web,db)"), |_| true),
        (None, labelled("app notin (web)"), |s| {
            !has(s, ("app", "web"))
        }),
        (None, labelled("tier"), |s| has_key(s, "tier")),
        (None, labelled("!tier"), |s| !has_key(s, "tier")),
        (None, labelled("app=web,tier=front"), |s| {
            has(s, ("app", "web")) && has(s, ("tier", "front"))
        }),
        (None, labelled("app=nope"), |_| false),
        (Some("b"), labelled("app=db"), |s| {
            s.ns == "b" && has(s, ("app", "db"))
        }),
        (None, by_fields(&format!("metadata.name={o2}")), |s| {
            s.name == "o2"
        }),
        (Some("b"), by_fields(&format!("metadata.name={o2}")), |s| {
            s.ns == "b" && s.name == "o2"
        }),
        (Some("b"), by_fields("metadata.name=nope"), |_| false),
        (None, by_fields("metadata.namespace!=a"), |s| s.ns != "a"),
        (
            None,
            Filter {
                labels: LabelSelector::parse("app=web").expect("selector"),
                fields: FieldSelector::parse("metadata.namespace=c").expect("selector"),
            },
            |s| s.ns == "c" && has(s, ("app", "web")),
        ),
    ];
    for (namespace, filter, wanted) in cases {
        let mut expected: Vec<ObjectKey> = seeds
            .iter()
            .filter(|s| wanted(s))
            .map(|s| h.key(s.ns, s.name))
            .collect();
        expected.sort();
        let request = ListRequest {
            namespace: namespace.map(str::to_owned),
            filter: filter.clone(),
            ..Default::default()
        };
        let page = list(store, &request).await;
        assert_eq!(keys(&page.items), expected, "{namespace:?} {filter:?}");
        assert_eq!(page.info.continue_token, None);
    }
}

/// A namespace's list shows that namespace only (not one its name is a prefix of), pages
/// within it, and counts what remains of it.
async fn namespace_scoping<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    h.put("ab", "o0", WEB).await;
    h.put("aa", "o9", WEB).await;
    let in_ns = |ns: &str| ListRequest {
        namespace: Some(ns.into()),
        ..Default::default()
    };
    let a = list(store, &in_ns("a")).await;
    assert_eq!(
        keys(&a.items),
        ["o0", "o1", "o2", "o3"].map(|n| h.key("a", n))
    );
    assert_eq!(
        keys(&list(store, &in_ns("ab")).await.items),
        [h.key("ab", "o0")]
    );
    let none = list(store, &in_ns("zz")).await;
    assert!(none.items.is_empty());
    assert_eq!(
        none.info.resource_version,
        stats(store).await.resource_version
    );

    let pages = page_through(
        store,
        &ListRequest {
            limit: Some(3),
            ..in_ns("a")
        },
    )
    .await;
    check_pages(&pages, 3, Some(4));
    assert_eq!(keys(&all_items(&pages)), keys(&a.items));
    assert_err!(store.get(&h.key("ab", "o1")).await, Error::NotFound(_));
}

/// An unlimited list read as a cursor lends what `list` returns, in order, from the snapshot it
/// started on (a change after it opened does not show). `streams`: the store offers cursors.
async fn cursor_agrees_with_list<H: Harness>(make: impl AsyncFn(&[Seed]) -> H, streams: bool) {
    let h = make(&fixture()).await;
    let store = h.store();
    let requests = [
        ListRequest::default(),
        ListRequest {
            namespace: Some("b".into()),
            filter: labelled("app=web"),
            ..Default::default()
        },
    ];
    for request in requests {
        let expected = list(store, &request).await;
        let cursor = store
            .list_cursor(&request)
            .await
            .unwrap_or_else(|e| panic!("list_cursor {request:?}: {e}"));
        let Some(cursor) = cursor else {
            assert!(!streams, "the store offers no cursor for {request:?}");
            continue;
        };
        h.put("b", &format!("late{}", expected.items.len()), WEB)
            .await;
        let (info, objects) = drain(cursor, 2).await;
        assert_eq!(info.resource_version, expected.info.resource_version);
        assert_eq!(info.continue_token, None);
        assert_eq!(contents(&objects), contents(&expected.items), "{request:?}");
    }
    // A page is never a cursor: the REST layer streams whatever cursor it gets, whole.
    assert!(
        store
            .list_cursor(&limited(2))
            .await
            .expect("list_cursor")
            .is_none()
    );
}

// ---------------------------------------------------------------------------------------------
// Watches (every store)
// ---------------------------------------------------------------------------------------------

/// A watch from a version gets exactly the changes after it, in order, each with its version.
async fn watch_after_resumes<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let x = h.key("a", "x");
    let r1 = h.put("a", "x", WEB).await;
    let r2 = h.put("a", "x", DB).await;
    let r3 = h.remove("a", "x").await;
    let r4 = h.put("b", "o1", WEB).await;
    assert!(rv0 < r1 && r1 < r2 && r2 < r3 && r3 < r4);
    let b1 = h.key("b", "o1");

    let mut all = watch(store, watch_request(WatchStart::After(rv0))).await;
    assert_eq!(
        next_events(&mut all, 4).await,
        [
            (EventType::Added, x.clone(), r1),
            (EventType::Modified, x.clone(), r2),
            (EventType::Deleted, x.clone(), r3),
            (EventType::Modified, b1.clone(), r4),
        ]
    );
    assert_quiet(&mut all).await;

    let mut later = watch(store, watch_request(WatchStart::After(r2))).await;
    assert_eq!(
        next_events(&mut later, 2).await,
        [
            (EventType::Deleted, x.clone(), r3),
            (EventType::Modified, b1, r4)
        ]
    );
    assert_quiet(&mut later).await;

    // From the newest version: nothing until the next change, which comes live.
    let mut live = watch(store, watch_request(WatchStart::After(r4))).await;
    assert_quiet(&mut live).await;
    let r5 = h.put("a", "x", WEB).await;
    assert_eq!(
        next_events(&mut live, 1).await,
        [(EventType::Added, x.clone(), r5)]
    );
    // The watches opened earlier get it too.
    assert_eq!(next_events(&mut all, 1).await, [(EventType::Added, x, r5)]);
}

/// A watch of the initial state sends ADDED for each current object, then the end of the
/// initial events at the store's version, then live changes.
async fn watch_initial_state<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let seeds = fixture();
    let h = make(&seeds).await;
    let store = h.store();
    let current = stats(store).await.resource_version;
    let listed = list(store, &ListRequest::default()).await;

    let mut watch_all = watch(store, watch_request(WatchStart::InitialState)).await;
    let mut initial = next_events(&mut watch_all, seeds.len()).await;
    initial.sort_by(|a, b| a.1.cmp(&b.1));
    let expected: Vec<Seen> = listed
        .items
        .iter()
        .map(|o| (EventType::Added, key_of(o.get()), rv_of(o.get())))
        .collect();
    assert_eq!(initial, expected);
    match next_item(&mut watch_all).await {
        Some(WatchItem::InitialEventsEnd(rv)) => assert_eq!(rv, current),
        other => panic!("expected the end of the initial events, got {other:?}"),
    }
    assert_quiet(&mut watch_all).await;

    let mut scoped = watch(
        store,
        WatchRequest {
            namespace: Some("b".into()),
            filter: labelled("app=web"),
            start: WatchStart::InitialState,
        },
    )
    .await;
    let mut initial = next_events(&mut scoped, 2).await;
    initial.sort_by(|a, b| a.1.cmp(&b.1));
    assert_eq!(
        initial.iter().map(|s| s.1.clone()).collect::<Vec<_>>(),
        [h.key("b", "o0"), h.key("b", "o2")]
    );
    match next_item(&mut scoped).await {
        Some(WatchItem::InitialEventsEnd(rv)) => assert_eq!(rv, current),
        other => panic!("expected the end of the initial events, got {other:?}"),
    }

    let r = h.put("b", "new", WEB).await;
    let new = h.key("b", "new");
    assert_eq!(
        next_events(&mut watch_all, 1).await,
        [(EventType::Added, new.clone(), r)]
    );
    assert_eq!(
        next_events(&mut scoped, 1).await,
        [(EventType::Added, new, r)]
    );
}

/// A watch sees the changes in its namespace that its selectors select, and no others.
async fn watch_scoped<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut in_b = watch(
        store,
        WatchRequest {
            namespace: Some("b".into()),
            filter: Filter::default(),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let mut web = watch(
        store,
        WatchRequest {
            namespace: None,
            filter: labelled("app=web"),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let r1 = h.put("a", "x", WEB).await;
    let r2 = h.put("b", "y", DB).await;
    h.remove("a", "o1").await;
    let r4 = h.remove("b", "o3").await;
    let r5 = h.put("b", "z", WEB).await;

    assert_eq!(
        events_until_quiet(&mut in_b).await,
        [
            (EventType::Added, h.key("b", "y"), r2),
            (EventType::Deleted, h.key("b", "o3"), r4),
            (EventType::Added, h.key("b", "z"), r5),
        ]
    );
    assert_eq!(
        events_until_quiet(&mut web).await,
        [
            (EventType::Added, h.key("a", "x"), r1),
            (EventType::Added, h.key("b", "z"), r5),
        ]
    );
}

/// As kube-apiserver does for a watch with a selector: an object that comes to match it is
/// ADDED, one that stays matched is MODIFIED, one that stops matching is DELETED (the watcher
/// would otherwise keep it forever), and changes of objects it never matched are not sent.
async fn watch_selection_transitions<H: Harness>(make: impl AsyncFn(&[Seed]) -> H) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut web = watch(
        store,
        WatchRequest {
            namespace: None,
            filter: labelled("app=web"),
            start: WatchStart::After(rv0),
        },
    )
    .await;
    let x = h.key("a", "x");
    h.put("a", "x", DB).await;
    let enters = h.put("a", "x", WEB).await;
    let stays = h.put("a", "x", WEB_FRONT).await;
    let leaves = h.put("a", "x", DB).await;
    h.remove("a", "x").await;
    assert_eq!(
        events_until_quiet(&mut web).await,
        [
            (EventType::Added, x.clone(), enters),
            (EventType::Modified, x.clone(), stays),
            (EventType::Deleted, x, leaves),
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// Watch limits (stores whose window and buffer the harness sets)
// ---------------------------------------------------------------------------------------------

/// With `window` events kept, a watch from before them is 410 Expired (and ends); one from
/// the version just before the oldest kept event resumes with exactly the kept events.
async fn watch_before_window_expired<H: Harness>(make: impl AsyncFn(&[Seed]) -> H, window: usize) {
    let h = make(&[]).await;
    let store = h.store();
    let start = stats(store).await.resource_version;
    let mut rvs = Vec::new();
    for i in 0..window + 4 {
        rvs.push(h.put("a", &format!("w{i}"), WEB).await);
    }
    for old in [start, rvs[0], rvs[rvs.len() - window - 2]] {
        let mut expired = watch(store, watch_request(WatchStart::After(old))).await;
        match next_item(&mut expired).await {
            Some(WatchItem::Error(Error::Expired(_))) => {}
            other => {
                panic!("a watch from {old} (before the window): expected Expired, got {other:?}")
            }
        }
        assert!(
            next_item(&mut expired).await.is_none(),
            "the watch ends after its error"
        );
    }
    let from = rvs[rvs.len() - window - 1];
    let mut resumed = watch(store, watch_request(WatchStart::After(from))).await;
    let got: Vec<u64> = next_events(&mut resumed, window)
        .await
        .into_iter()
        .map(|s| s.2)
        .collect();
    assert_eq!(got, rvs[rvs.len() - window..]);
    assert_quiet(&mut resumed).await;
}

/// A watcher that falls more than `buffer` events behind is ended, as kube-apiserver's cacher
/// ends it: its stream ends (no error), what it got before is in order and without a gap, it is
/// counted, a watcher keeping up meanwhile is not disturbed, and resuming from the last version
/// it saw gets the rest.
async fn lagging_watcher_ended<H: Harness>(make: impl AsyncFn(&[Seed]) -> H, buffer: usize) {
    let h = make(&fixture()).await;
    let store = h.store();
    let rv0 = stats(store).await.resource_version;
    let mut slow = watch(store, watch_request(WatchStart::After(rv0))).await;
    let mut keeping_up = watch(store, watch_request(WatchStart::After(rv0))).await;
    let mut rvs = Vec::new();
    let mut kept_up = Vec::new();
    // The slow watcher reads nothing while the events are written; the other reads each.
    for i in 0..buffer * 4 {
        rvs.push(h.put("a", &format!("lag{}", i % 8), WEB).await);
        match next_item(&mut keeping_up).await {
            Some(WatchItem::Event(event)) => kept_up.push(event.resource_version),
            other => panic!("a watcher keeping up got {other:?}"),
        }
    }
    assert_eq!(kept_up, rvs, "a watcher keeping up sees every event");
    let mut got = Vec::new();
    while let Some(item) = next_item(&mut slow).await {
        match item {
            WatchItem::Event(event) => got.push(event.resource_version),
            other => panic!(
                "after {} of {} events: expected more or the end, got {other:?}",
                got.len(),
                rvs.len()
            ),
        }
    }
    assert!(
        got.len() < rvs.len(),
        "a watcher {} events behind was not ended (buffer {buffer})",
        rvs.len()
    );
    assert_eq!(
        got,
        rvs[..got.len()],
        "the events before the end are in order, no gap"
    );
    assert_eq!(
        store.stats().await.expect("stats").terminated_watchers,
        1,
        "the ended watcher is counted, the one keeping up is not"
    );
    // As client-go does: resume from the last version seen; the history still holds the rest.
    let last = got.last().copied().unwrap_or(rv0);
    let mut resumed = watch(store, watch_request(WatchStart::After(last))).await;
    let mut rest = Vec::new();
    while rest.len() < rvs.len() - got.len() {
        match next_item(&mut resumed).await {
            Some(WatchItem::Event(event)) => rest.push(event.resource_version),
            other => panic!("a resumed watch got {other:?}"),
        }
    }
    assert_eq!(rest, rvs[got.len()..], "resumed where it was ended, no gap");
}

// ---------------------------------------------------------------------------------------------
// Writes (writable stores)
// ---------------------------------------------------------------------------------------------

/// Create stores the object at a version above every earlier one; a taken key is 409
/// AlreadyExists and changes nothing.
async fn create_assigns_versions<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let before = stats(&store).await;
    let x = writes
        .create(with_labels(llama("a", "x", 10.0), WEB), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    assert!(rx > before.resource_version);
    assert_eq!(x.spec.weight, 10.0);
    assert_eq!(labels_of(x.get()), label_map(WEB));
    assert_eq!(x.metadata.uid.as_deref(), Some("uid-a-x"));
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!(rv_of(got.get()), rx);
    assert_eq!(got.spec.weight, 10.0);
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects + 1,
            resource_version: rx,
            ..Default::default()
        }
    );

    let y = writes
        .create(llama("a", "y", 11.0), false)
        .await
        .expect("create");
    let ry = rv_of(y.get());
    assert!(ry > rx);

    assert_err!(
        writes.create(llama("a", "x", 99.0), false).await,
        Error::AlreadyExists(_)
    );
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (rx, 10.0));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects + 2,
            resource_version: ry,
            ..Default::default()
        }
    );
    // The same name in another namespace is another object.
    writes
        .create(llama("b", "x", 12.0), false)
        .await
        .expect("create b/x");
}

/// Update is compare-and-swap on resourceVersion: the current version succeeds and raises it,
/// a stale one is 409 Conflict and changes nothing; a missing object is NotFound.
async fn update_compare_and_swap<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());

    let mut next = x.get().clone();
    next.spec.weight = 20.0;
    let updated = writes
        .update(next, false)
        .await
        .expect("update at the current version");
    let ru = rv_of(updated.get());
    assert!(ru > rx);
    assert_eq!(updated.spec.weight, 20.0);
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (ru, 20.0));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: 1,
            resource_version: ru,
            ..Default::default()
        }
    );

    let mut stale = x.get().clone();
    stale.spec.weight = 30.0;
    assert_err!(writes.update(stale, false).await, Error::Conflict { .. });
    let got = store.get(&ObjectKey::new("a", "x")).await.expect("get");
    assert_eq!((rv_of(got.get()), got.spec.weight), (ru, 20.0));
    assert_eq!(stats(&store).await.resource_version, ru);

    let mut missing = llama("a", "missing", 1.0);
    missing.metadata.resource_version = Some(ru.to_string());
    assert_err!(writes.update(missing, false).await, Error::NotFound(_));

    // The updated object is the base of the next update.
    let mut again = updated.get().clone();
    again.spec.weight = 21.0;
    let r2 = rv_of(
        writes
            .update(again, false)
            .await
            .expect("second update")
            .get(),
    );
    assert!(r2 > ru);
}

/// Delete honours its preconditions (uid, resourceVersion: 409 Conflict when they do not
/// hold), removes the object at a new version, and a missing object is NotFound.
async fn delete_preconditions<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    let key = ObjectKey::new("a", "x");
    let before = stats(&store).await;

    let wrong_uid = Preconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    assert_err!(
        writes.delete(&key, &wrong_uid, false).await,
        Error::Conflict { .. }
    );
    let wrong_rv = Preconditions {
        uid: None,
        resource_version: Some((rx - 1).to_string()),
    };
    assert_err!(
        writes.delete(&key, &wrong_rv, false).await,
        Error::Conflict { .. }
    );
    let right_uid_wrong_rv = Preconditions {
        uid: Some("uid-a-x".into()),
        resource_version: Some("1".into()),
    };
    assert_err!(
        writes.delete(&key, &right_uid_wrong_rv, false).await,
        Error::Conflict { .. }
    );
    assert_eq!(rv_of(store.get(&key).await.expect("still there").get()), rx);
    assert_eq!(stats(&store).await, before);

    let matching = Preconditions {
        uid: Some("uid-a-x".into()),
        resource_version: Some(rx.to_string()),
    };
    let deleted = writes.delete(&key, &matching, false).await.expect("delete");
    let rd = rv_of(deleted.get());
    assert!(rd > rx);
    assert_eq!(key_of(deleted.get()), key);
    assert_err!(store.get(&key).await, Error::NotFound(_));
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects: before.objects - 1,
            resource_version: rd,
            ..Default::default()
        }
    );

    assert_err!(
        writes.delete(&key, &Preconditions::default(), false).await,
        Error::NotFound(_)
    );
    assert_err!(
        writes
            .delete(
                &ObjectKey::new("a", "never"),
                &Preconditions::default(),
                false
            )
            .await,
        Error::NotFound(_)
    );
    assert_eq!(stats(&store).await.resource_version, rd);
}

/// Dry runs check what the real write would (AlreadyExists, Conflict, NotFound) and change
/// nothing: no object, no version, no watch event.
async fn dry_runs_change_nothing<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let x = writes
        .create(llama("a", "x", 10.0), false)
        .await
        .expect("create");
    let rx = rv_of(x.get());
    let key = ObjectKey::new("a", "x");
    let before = stats(&store).await;
    let mut events = watch(
        &store,
        watch_request(WatchStart::After(before.resource_version)),
    )
    .await;

    let dry = writes
        .create(llama("a", "y", 1.0), true)
        .await
        .expect("dry create");
    assert_eq!(key_of(dry.get()), ObjectKey::new("a", "y"));
    assert_err!(
        store.get(&ObjectKey::new("a", "y")).await,
        Error::NotFound(_)
    );
    assert_err!(
        writes.create(llama("a", "x", 1.0), true).await,
        Error::AlreadyExists(_)
    );

    let mut next = x.get().clone();
    next.spec.weight = 99.0;
    writes.update(next, true).await.expect("dry update");
    let mut stale = x.get().clone();
    stale.metadata.resource_version = Some((rx - 1).to_string());
    assert_err!(writes.update(stale, true).await, Error::Conflict { .. });

    let wrong_uid = Preconditions {
        uid: Some("someone-else".into()),
        resource_version: None,
    };
    assert_err!(
        writes.delete(&key, &wrong_uid, true).await,
        Error::Conflict { .. }
    );
    writes
        .delete(&key, &Preconditions::default(), true)
        .await
        .expect("dry delete");
    assert_err!(
        writes
            .delete(&ObjectKey::new("a", "y"), &Preconditions::default(), true)
            .await,
        Error::NotFound(_)
    );

    let got = store.get(&key).await.expect("x survives a dry delete");
    assert_eq!((rv_of(got.get()), got.spec.weight), (rx, 10.0));
    assert_eq!(stats(&store).await, before);
    assert_eq!(list(&store, &ListRequest::default()).await.items.len(), 1);

    // The first event the watch gets is the next real write's.
    let z = writes
        .create(llama("a", "z", 1.0), false)
        .await
        .expect("create");
    assert_eq!(
        next_events(&mut events, 1).await,
        [(EventType::Added, ObjectKey::new("a", "z"), rv_of(z.get()))]
    );
}

/// The store's revision is its last write's version and its count follows creates and deletes.
async fn stats_follow_writes<S: Store<Llama>>(make: impl AsyncFn() -> S) {
    let store = make().await;
    let writes = store.writable().expect("a writable store");
    let start = stats(&store).await;
    let mut last = start.resource_version;
    let mut objects = start.objects;
    for name in ["a", "b", "c"] {
        let created = writes
            .create(llama("n", name, 5.0), false)
            .await
            .expect("create");
        objects += 1;
        assert!(rv_of(created.get()) > last);
        last = rv_of(created.get());
        assert_eq!(
            stats(&store).await,
            StoreStats {
                objects,
                resource_version: last,
                ..Default::default()
            }
        );
    }
    let current = store.get(&ObjectKey::new("n", "b")).await.expect("get");
    let mut next = current.get().clone();
    next.spec.weight = 6.0;
    last = rv_of(writes.update(next, false).await.expect("update").get());
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects,
            resource_version: last,
            ..Default::default()
        }
    );
    let deleted = writes
        .delete(&ObjectKey::new("n", "a"), &Preconditions::default(), false)
        .await
        .expect("delete");
    objects -= 1;
    last = rv_of(deleted.get());
    assert_eq!(
        stats(&store).await,
        StoreStats {
            objects,
            resource_version: last,
            ..Default::default()
        }
    );
    let page = list(&store, &ListRequest::default()).await;
    assert_eq!(
        (page.items.len(), page.info.resource_version),
        (objects, last)
    );
}

// ---------------------------------------------------------------------------------------------
// The stores
// ---------------------------------------------------------------------------------------------

async fn memory_store() -> MemoryStore<Llama> {
    MemoryStore::new(MemoryStoreConfig::default())
}

/// A memory store keeping only `window` events.
fn small_window(window: usize) -> MemoryStoreConfig {
    MemoryStoreConfig {
        event_window: window,
        ..Default::default()
    }
}

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

conformance!(memory: run, memory, [
    get_and_missing,
    stats_agree,
    pages_and_continue,
    pages_with_selectors,
    writes_between_pages,
    malformed_continue,
    read_at_versions,
    selectors,
    namespace_scoping,
    watch_after_resumes,
    watch_initial_state,
    watch_scoped,
    watch_selection_transitions,
]);

conformance!(memory_writes: run, memory_store, [
    create_assigns_versions,
    update_compare_and_swap,
    delete_preconditions,
    dry_runs_change_nothing,
    stats_follow_writes,
]);

#[tokio::test]
async fn memory_continue_after_snapshot_gone() {
    let kept = 2;
    let make = async |seeds: &[Seed]| {
        memory_with(
            MemoryStoreConfig {
                max_snapshots: kept,
                ..Default::default()
            },
            seeds,
        )
        .await
    };
    run(continue_after_snapshot_gone(make, kept)).await;
}

#[tokio::test]
async fn memory_cursor_agrees_with_list() {
    run(cursor_agrees_with_list(memory, true)).await;
}

#[tokio::test]
async fn memory_watch_before_window_expired() {
    let window = 3;
    let make = async |seeds: &[Seed]| memory_with(small_window(window), seeds).await;
    run(watch_before_window_expired(make, window)).await;
}

#[tokio::test]
async fn memory_lagging_watcher_ended() {
    let buffer = 16;
    let make = async |seeds: &[Seed]| {
        memory_with(
            MemoryStoreConfig {
                watch_buffer: buffer,
                ..Default::default()
            },
            seeds,
        )
        .await
    };
    run(lagging_watcher_ended(make, buffer)).await;
}

/// A relist's changes share one resourceVersion. A watcher ended between two of them would miss
/// the rest if it resumed from that version, so it is told 410 Expired (and relists) instead of
/// a clean end.
#[tokio::test]
async fn memory_watcher_ended_inside_a_relist_is_told_to_relist() {
    let store = MemoryStore::<Llama>::new(MemoryStoreConfig {
        watch_buffer: 16,
        first_resource_version: 0,
        authoritative: false,
        ..Default::default()
    });
    let at = |mut llama: Llama, rv: u64| {
        llama.metadata.resource_version = Some(rv.to_string());
        llama
    };
    let seed = at(llama("a", "seed", 1.0), 5);
    store.apply_external(seed.clone()).unwrap();
    let mut slow = watch(&store, watch_request(WatchStart::After(5))).await;
    // A relist at revision 10 finds 12 new objects (within the buffer): 12 ADDED events at 10.
    let mut listed: Vec<Llama> = (0..12)
        .map(|i| at(llama("a", &format!("r{i}"), 1.0), 6 + i))
        .collect();
    listed.push(seed);
    store.reset_at(listed, 10).unwrap();
    let first = match next_item(&mut slow).await {
        Some(WatchItem::Event(event)) => event.resource_version,
        other => panic!("expected the relist's first event, got {other:?}"),
    };
    // Later changes push it past its buffer while it is inside the relist's group.
    for i in 0..40 {
        store
            .apply_external(at(llama("b", &format!("later{i}"), 1.0), 100 + i))
            .unwrap();
    }
    let mut rest = 0;
    loop {
        match next_item(&mut slow).await {
            Some(WatchItem::Event(event)) if event.resource_version == first => rest += 1,
            Some(WatchItem::Error(Error::Expired(_))) => break,
            other => panic!("after {rest} more of the relist: expected 410 Expired, got {other:?}"),
        }
    }
    assert!(rest < 11, "the watcher was ended inside the group");
    assert!(
        next_item(&mut slow).await.is_none(),
        "the watch ends after its error"
    );
}

#[tokio::test]
async fn memory_is_writable() {
    assert!(memory_store().await.writable().is_some());
}

// The FarmPod watch cache, fed by a fake kube-apiserver's Pod watch.

conformance!(pod_cache: run, pod_cache, [
    get_and_missing,
    stats_agree,
    pages_and_continue,
    pages_with_selectors,
    writes_between_pages,
    malformed_continue,
    read_at_versions,
    selectors,
    namespace_scoping,
    watch_after_resumes,
    watch_initial_state,
    watch_scoped,
    watch_selection_transitions,
]);

#[tokio::test]
async fn pod_cache_continue_after_snapshot_gone() {
    // The cache keeps as many list snapshots as a default memory store.
    let kept = MemoryStoreConfig::default().max_snapshots;
    run(continue_after_snapshot_gone(pod_cache, kept)).await;
}

#[tokio::test]
async fn pod_cache_cursor_agrees_with_list() {
    run(cursor_agrees_with_list(pod_cache, true)).await;
}

#[tokio::test]
async fn pod_cache_is_read_only() {
    let h = pod_cache(&fixture()).await;
    assert!(h.store().writable().is_none());
    assert!(
        farm_apiserver::resources::farmpod::synthetic_view(3)
            .writable()
            .is_none()
    );
}

// ---------------------------------------------------------------------------------------------
// The etcd store (Llamas), against a real etcd of its own per check.
// ---------------------------------------------------------------------------------------------

/// An etcd store with the etcd it uses (killed when dropped).
struct EtcdBacked {
    etcd: crate::common::etcd::Etcd,
    store: Arc<EtcdStore<Llama>>,
}

impl EtcdBacked {
    /// Waits until the cache has applied etcd's current revision by itself: a read's own
    /// catch-up may otherwise write the kind's prefix key (an etcd without ordered progress
    /// notifications), and the revision the checks compare would move past their last write.
    async fn settle(&self) -> Result<(), Error> {
        let prefix = b"/farm.example.com/llamas/";
        let revision = self.etcd.client().revision(prefix).await;
        let revision = revision.map_err(|e| Error::ServiceUnavailable(e.to_string()))?;
        let deadline = Instant::now() + WAIT;
        let cached = || self.store.stats_sync().map_or(0, |s| s.resource_version);
        while cached() < revision.max(0) as u64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        Ok(())
    }
}

/// Reads once the cache has settled (see [`EtcdBacked::settle`]).
#[async_trait::async_trait]
impl Store<Llama> for EtcdBacked {
    async fn get(&self, key: &ObjectKey) -> Result<Object<Llama>, Error> {
        self.settle().await?;
        self.store.get(key).await
    }
    async fn list_each(
        &self,
        request: &ListRequest,
        visit: &mut (dyn for<'o> FnMut(&'o Object<Llama>) + Send),
    ) -> Result<PageInfo, Error> {
        self.settle().await?;
        self.store.list_each(request, visit).await
    }
    async fn list_cursor(&self, request: &ListRequest) -> Result<Option<ListCursor<Llama>>, Error> {
        self.settle().await?;
        self.store.list_cursor(request).await
    }
    fn count_sync(&self, namespace: Option<&str>) -> Option<usize> {
        self.store.count_sync(namespace)
    }
    async fn watch(&self, request: WatchRequest) -> Result<WatchStream<Llama>, Error> {
        self.store.watch(request).await
    }
    async fn stats(&self) -> Result<StoreStats, Error> {
        self.settle().await?;
        self.store.stats().await
    }
    fn check_ready(&self) -> Result<(), Error> {
        self.store.check_ready()
    }
    fn writable(&self) -> Option<&dyn WritableStore<Llama>> {
        self.store.writable()
    }
}

/// A fresh etcd and an etcd store of Llamas on it, once its cache has synced.
async fn etcd_store() -> EtcdBacked {
    let etcd = crate::common::etcd::Etcd::start()
        .await
        .expect("etcd (the test checks for it first)");
    let store = EtcdStore::<Llama>::start(etcd.client(), "/farm.example.com/");
    let deadline = Instant::now() + WAIT;
    while store.check_ready().is_err() {
        assert!(Instant::now() < deadline, "the etcd store did not sync");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    EtcdBacked { etcd, store }
}

/// Writes through the store, then waits until its cache shows them (as the memory harness's
/// writes show at once).
struct EtcdHarness {
    backed: EtcdBacked,
}

async fn etcd(seeds: &[Seed]) -> EtcdHarness {
    let harness = EtcdHarness {
        backed: etcd_store().await,
    };
    for seed in seeds {
        harness.put(seed.ns, seed.name, seed.labels).await;
    }
    harness
}

impl EtcdHarness {
    async fn shown(&self, rv: u64) {
        let deadline = Instant::now() + WAIT;
        while stats(&self.backed).await.resource_version < rv {
            assert!(
                Instant::now() < deadline,
                "the etcd cache did not reach {rv}"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Harness for EtcdHarness {
    type K = Llama;
    type S = EtcdBacked;

    fn store(&self) -> &EtcdBacked {
        &self.backed
    }

    fn key(&self, ns: &str, name: &str) -> ObjectKey {
        ObjectKey::new(ns, name)
    }

    async fn put(&self, ns: &str, name: &str, labels: &[(&str, &str)]) -> u64 {
        let writes = self.backed.writable().expect("writable");
        let written = match self.backed.get(&self.key(ns, name)).await {
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
        let rv = rv_of(written.get());
        self.shown(rv).await;
        rv
    }

    async fn remove(&self, ns: &str, name: &str) -> u64 {
        let writes = self.backed.writable().expect("writable");
        let deleted = writes
            .delete(&self.key(ns, name), &Preconditions::default(), false)
            .await
            .unwrap_or_else(|e| panic!("delete {ns}/{name}: {e}"));
        let rv = rv_of(deleted.get());
        self.shown(rv).await;
        rv
    }
}

/// Runs `check` when there is an etcd (else the test prints SKIPPED).
async fn with_etcd(check: impl Future<Output = ()>) {
    if crate::common::etcd::binary().is_some() {
        run(check).await;
    }
}

conformance!(etcd: with_etcd, etcd, [
    get_and_missing,
    stats_agree,
    pages_and_continue,
    pages_with_selectors,
    writes_between_pages,
    malformed_continue,
    read_at_versions,
    selectors,
    namespace_scoping,
    watch_after_resumes,
    watch_initial_state,
    watch_scoped,
    watch_selection_transitions,
]);

conformance!(etcd_writes: with_etcd, etcd_store, [
    create_assigns_versions,
    update_compare_and_swap,
    delete_preconditions,
    dry_runs_change_nothing,
    stats_follow_writes,
]);

#[tokio::test]
async fn etcd_cursor_agrees_with_list() {
    with_etcd(cursor_agrees_with_list(etcd, true)).await;
}

#[tokio::test]
async fn etcd_is_writable() {
    if crate::common::etcd::binary().is_some() {
        assert!(etcd_store().await.writable().is_some());
    }
}

/// etcd's count of open watch streams (`etcd_debugging_mvcc_watch_stream_total`).
async fn etcd_watch_streams(etcd: &crate::common::etcd::Etcd) -> u64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let endpoint = etcd.endpoint();
    let address = endpoint.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("etcd's client port");
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut body = String::new();
    stream.read_to_string(&mut body).await.expect("read");
    body.lines()
        .find_map(|l| l.strip_prefix("etcd_debugging_mvcc_watch_stream_total "))
        .and_then(|n| n.trim().parse().ok())
        .expect("etcd_debugging_mvcc_watch_stream_total")
}

/// An etcd store's feed ends with the store: once the store is dropped, its watch on etcd
/// closes within seconds (it used to outlive the store for good).
#[tokio::test]
async fn a_dropped_etcd_store_stops_watching() {
    if crate::common::etcd::binary().is_none() {
        eprintln!("SKIPPED: no etcd binary");
        return;
    }
    let etcd = crate::common::etcd::Etcd::start()
        .await
        .expect("etcd (the test checks for it first)");
    let idle = etcd_watch_streams(&etcd).await;
    let store = EtcdStore::<Llama>::start(etcd.client(), "/farm.example.com/");
    let deadline = Instant::now() + WAIT;
    while store.check_ready().is_err() || etcd_watch_streams(&etcd).await <= idle {
        assert!(Instant::now() < deadline, "the etcd store never watched");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(10);
    while etcd_watch_streams(&etcd).await > idle {
        assert!(
            Instant::now() < deadline,
            "the dropped store still watches etcd"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
