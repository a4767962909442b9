//! Where the served kinds' objects live, decided once (from the flags, or by a test): every
//! writable kind in this process's memory or every one in etcd, and each view of the cluster's
//! objects in its watch cache. A kind asks for its store by type ([`StorageFactory::store`],
//! [`StorageFactory::view`]), so adding one names no storage of its own.

use std::{
    any::{Any, TypeId},
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use super::{
    EtcdStore, MemoryStore, Store,
    etcd::EtcdClient,
    view::{ClusterSource, View},
};
use crate::resource::ServedResource;

/// Makes the store of any served kind `K`: one per kind, however often it is asked for.
/// Cheap to clone; clones share the stores made.
#[derive(Clone)]
pub struct StorageFactory {
    inner: Arc<Inner>,
}

struct Inner {
    backend: Backend,
    /// The version a kind served at several is stored at (when it has it).
    storage_version: Mutex<String>,
    /// The cluster views are of (None: standalone, views answer 503), and the namespaces they
    /// watch (`[]`: all).
    cluster: Mutex<Option<(kube::Client, Vec<String>)>>,
    /// Each kind's first objects in memory (`Box<dyn Iterator<Item = K>>`), until its store is
    /// made.
    seeds: Mutex<HashMap<TypeId, Box<dyn Any + Send>>>,
    /// The stores made so far (`Arc<dyn Store<K>>`), by kind.
    made: Mutex<HashMap<TypeId, Box<dyn Any + Send + Sync>>>,
}

enum Backend {
    Memory,
    Etcd {
        client: Arc<EtcdClient>,
        /// Every key is under it (`/zoo.example.com/`), then the kind's plural.
        prefix: String,
    },
}

/// What [`StorageFactory::seed`] keeps for `K`.
type Seed<K> = Box<dyn Iterator<Item = K> + Send>;

impl StorageFactory {
    fn new(backend: Backend) -> Self {
        Self {
            inner: Arc::new(Inner {
                backend,
                storage_version: Mutex::new("v1".into()),
                cluster: Mutex::default(),
                seeds: Mutex::default(),
                made: Mutex::default(),
            }),
        }
    }

    /// Every kind in this process's memory (lost on restart): the embedded default.
    pub fn memory() -> Self {
        Self::new(Backend::Memory)
    }

    /// Every kind in the etcd `client` reaches, under `prefix` (`/zoo.example.com/`): one
    /// key per object, `<prefix><plural>/<namespace>/<name>`, shared by every replica.
    pub fn etcd(client: Arc<EtcdClient>, prefix: impl Into<String>) -> Self {
        Self::new(Backend::Etcd {
            client,
            prefix: prefix.into(),
        })
    }

    /// Views ([`Self::view`]) watch `client`'s cluster, in `namespaces` (`[]`: all). Set
    /// before any store is made; without it views answer 503.
    pub fn viewing(self, client: kube::Client, namespaces: Vec<String>) -> Self {
        *self
            .inner
            .cluster
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((client, namespaces));
        self
    }

    /// Kinds served at several versions are stored at `version` (`--storage-version`) when
    /// they have it; `v1` otherwise. Set before any store is made.
    pub fn storing_at(self, version: &str) -> Self {
        *self
            .inner
            .storage_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = version.to_owned();
        self
    }

    /// Whether a kind served at several versions is stored at `version`.
    pub fn stores_at(&self, version: &str) -> bool {
        *self
            .inner
            .storage_version
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            == version
    }

    /// The objects `K`'s store starts with in memory (samples, benchmarks' synthetic objects),
    /// inserted when the store is made; etcd storage never seeds, its objects are etcd's.
    /// Seeds given after the store is made are not used.
    pub fn seed<K: ServedResource>(
        self,
        objects: impl IntoIterator<Item = K, IntoIter: Send + 'static>,
    ) -> Self {
        if matches!(self.inner.backend, Backend::Memory) {
            let seed: Seed<K> = Box::new(objects.into_iter());
            self.inner
                .seeds
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(TypeId::of::<K>(), Box::new(seed));
        }
        self
    }

    /// Makes `store` `K`'s: a kind served at a version its store does not hold is served from
    /// a view of the stored version's store ([`super::Converted`]), which [`Self::store`] then
    /// gives for `K` too. A store already made for `K` stays.
    pub fn provide<K: ServedResource>(&self, store: Arc<dyn Store<K>>) {
        self.inner
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(TypeId::of::<K>())
            .or_insert_with(|| Box::new(store));
    }

    /// `K`'s store: made on the first call (a memory store with its seed, or an etcd store
    /// that starts reading etcd), the same one after.
    pub fn store<K: ServedResource>(&self) -> Arc<dyn Store<K>> {
        let mut made = self
            .inner
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = made
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Arc<dyn Store<K>>>())
        {
            return store.clone();
        }
        let store: Arc<dyn Store<K>> = match &self.inner.backend {
            Backend::Memory => {
                let store = MemoryStore::<K>::default();
                let seed = self
                    .inner
                    .seeds
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&TypeId::of::<K>())
                    .and_then(|s| s.downcast::<Seed<K>>().ok());
                for object in seed.into_iter().flatten() {
                    // A fresh store refuses only a name given twice: that seed is dropped.
                    if let Err(error) = store.insert(object) {
                        tracing::warn!(%error, kind = %K::kind(&()), "a seed object was not stored");
                    }
                }
                Arc::new(store)
            }
            Backend::Etcd { client, prefix } => EtcdStore::<K>::start(client.clone(), prefix),
        };
        made.insert(TypeId::of::<K>(), Box::new(store.clone()));
        store
    }

    /// The view `K`'s store, read-only: the one [`Self::provide`]d for it, else its watch
    /// cache over the cluster's objects (503 until synced, and always without a cluster),
    /// made on the first call.
    pub fn view<K: View>(&self) -> Arc<dyn Store<K>> {
        let mut made = self
            .inner
            .made
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(store) = made
            .get(&TypeId::of::<K>())
            .and_then(|s| s.downcast_ref::<Arc<dyn Store<K>>>())
        {
            return store.clone();
        }
        let cluster = self
            .inner
            .cluster
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let store: Arc<dyn Store<K>> = match cluster {
            Some((client, namespaces)) => ClusterSource::<K>::start(client, namespaces),
            None => ClusterSource::<K>::without_cluster(),
        };
        made.insert(TypeId::of::<K>(), Box::new(store.clone()));
        store
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        resource::ObjectKey,
        testing::{self, Stripe, v1::Zebra},
    };

    #[tokio::test]
    async fn one_memory_store_per_kind_seeded_once() {
        let storage = StorageFactory::memory().seed([testing::sample(), testing::synthetic(1)]);
        let zebras = storage.store::<Zebra>();
        assert!(Arc::ptr_eq(&zebras, &storage.clone().store::<Zebra>()));
        assert_eq!(zebras.stats().await.unwrap().objects, 2);
        let dolly = ObjectKey {
            namespace: "default".into(),
            name: "marty".into(),
        };
        assert!(zebras.get(&dolly).await.is_ok());
        assert!(zebras.writable().is_some());
        assert!(storage.view::<Stripe>().writable().is_none());
    }

    #[tokio::test]
    async fn without_a_seed_a_store_starts_empty() {
        let storage = StorageFactory::memory();
        assert_eq!(storage.store::<Zebra>().stats().await.unwrap().objects, 0);
    }
}
