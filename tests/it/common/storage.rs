//! Where a test server's kinds live: in memory or in an etcd of its own, as `--storage` says for
//! the binary; and the Llama API suite run on both.

use std::{sync::Arc, time::Duration};

use aggregated_apiserver::{
    resource::VersionOf,
    server::{AppState, Shutdown, StateOptions},
    store::{ClusterSource, StorageFactory, Store, ViewCache},
};
use farm_apiserver::resources::{self, FarmPod, Llama, llama};

use super::etcd;

/// Where a test server keeps its Llamas: the Llama API tests run on both (see
/// [`on_both_storages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TestStorage {
    /// The embedded default.
    Memory,
    /// A real etcd of the server's own (`common::etcd`).
    Etcd,
}

/// Runs each listed `async fn name(storage: TestStorage)` as two tests, `on_memory::name` and
/// `on_etcd::name`: one Llama API suite for both storages, not two copies.
#[macro_export]
macro_rules! on_both_storages {
    ($($name:ident),* $(,)?) => {
        mod on_memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestStorage::Memory).await
                }
            )*
        }
        mod on_etcd {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::TestStorage::Etcd).await
                }
            )*
        }
    };
}

/// The binary's kinds on `storage`, FarmPods from `pods`; in memory they start with dolly
/// when `sample` (on etcd, [`seed_etcd`] writes it once the server is ready). The etcd is a new
/// one of the test's own, kept running while held; None (SKIPPED printed) when there is none.
pub async fn storage_on(
    storage: TestStorage,
    pods: Arc<ViewCache<FarmPod>>,
    sample: bool,
) -> Option<(StorageFactory, Option<etcd::Etcd>)> {
    Some(match storage {
        TestStorage::Memory => (memory(pods, sample), None),
        TestStorage::Etcd => {
            let etcd = etcd::Etcd::start().await?;
            let factory = StorageFactory::etcd(etcd.client(), "/farm.example.com/");
            factory.provide::<FarmPod>(pods);
            (factory, Some(etcd))
        }
    })
}

/// Waits until `ready` (the server's `/readyz/etcd`: every kind's cache has read etcd), then
/// writes dolly when `sample`, as a memory store starts with it.
pub async fn seed_etcd<F: std::future::Future<Output = bool>>(
    ready: impl Fn() -> F,
    llamas: &dyn Store<Llama>,
    sample: bool,
) {
    for _ in 0..1000 {
        if ready().await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if sample {
        llamas
            .writable()
            .expect("writable")
            .create(Llama::from_stored(&llama::sample()), false)
            .await
            .expect("seeding dolly");
    }
}

/// A standalone server's state in memory, its Llamas starting with dolly when `sample`, as
/// `oneshot` tests use it: the binary's kinds ([`resources::register`]) with `options`.
pub fn memory_state(sample: bool, options: StateOptions) -> (AppState, Shutdown) {
    let storage = memory(ClusterSource::without_cluster(), sample);
    AppState::new(resources::register(&storage), options).unwrap()
}

/// Every kind in memory, FarmPods from `pods`; Llamas start with dolly when `sample`.
pub fn memory(pods: Arc<ViewCache<FarmPod>>, sample: bool) -> StorageFactory {
    let storage = StorageFactory::memory()
        .seed(llama::seed::<llama::v1::Llama>(sample, 0))
        .seed(llama::seed::<Llama>(sample, 0));
    storage.provide::<FarmPod>(pods);
    storage
}
