//! The checks run on the etcd store, through a real etcd of the test's own.

use super::*;

/// An etcd store with the etcd it uses (killed when dropped).
pub(super) struct EtcdBacked {
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
pub(super) async fn etcd_store() -> EtcdBacked {
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
pub(super) struct EtcdHarness {
    backed: EtcdBacked,
}

pub(super) async fn etcd(seeds: &[Seed]) -> EtcdHarness {
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
pub(super) async fn with_etcd(check: impl Future<Output = ()>) {
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
pub(super) async fn etcd_watch_streams(etcd: &crate::common::etcd::Etcd) -> u64 {
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
