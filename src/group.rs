//! The one place kinds are installed: `ApiGroup::new().serve::<Llama>(store)` gives the kind
//! its REST endpoints, its discovery entry and OpenAPI paths, its metrics label, its
//! `apiserver_storage_objects` series and its store's readiness checks. What the kind is comes
//! from its own file ([`ServedResource`]); what it may do (read-only or not) from its store.
//! [`register`] lists the kinds farm-apiserver serves, one line each.

use std::sync::Arc;

use crate::{
    health::Check,
    resource::{ResourceInfo, ServedResource, VersionOf},
    resources::{FarmPod, farmpod, llama},
    rest::{Endpoints, RestContext, fields::KindVersions},
    store::{Converted, StorageFactory, Store},
};

type Install = Box<dyn FnOnce(Endpoints, RestContext) -> anyhow::Result<Endpoints> + Send>;

/// The kinds `farm.example.com` serves, each with its store, in discovery order.
#[derive(Default)]
pub struct ApiGroup {
    resources: Vec<ResourceInfo>,
    installs: Vec<Install>,
    checks: Vec<Check>,
}

impl ApiGroup {
    /// No kinds yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `K` from `store`: every verb the store supports (get, list and watch from any
    /// store; create, update, patch, delete and deletecollection when it is writable), ready
    /// when the store's readiness checks pass.
    pub fn serve<K: ServedResource>(self, store: Arc<dyn Store<K>>) -> Self {
        self.serve_at::<K>(store, K::version_name(), None)
    }

    /// Serves a kind at two versions, `A` (the newer) and `B`, from one store at the version
    /// `storage` stores at (`--storage-version`; `A` unless it names `B`'s). The other version
    /// is converted on every read and write ([`Converted`]), and each version's field managers
    /// see the other's ([`KindVersions`]).
    pub fn serve_versions<A, B>(self, storage: &StorageFactory) -> Self
    where
        A: VersionOf<B>,
        B: VersionOf<A>,
    {
        let versions: Option<Arc<dyn crate::rest::fields::Versions>> =
            match KindVersions::<A, B>::new() {
                Ok(versions) => Some(Arc::new(versions)),
                // Reported at start-up, where each version's own schema fails the same way.
                Err(_) => None,
            };
        if storage.stores_at(B::version_name()) {
            let store = storage.store::<B>();
            let converted: Arc<dyn Store<A>> = Arc::new(Converted::<A, B>::new(store.clone()));
            storage.provide::<A>(converted.clone());
            self.serve_at::<A>(converted, B::version_name(), versions.clone())
                .serve_at::<B>(store, B::version_name(), versions)
        } else {
            let store = storage.store::<A>();
            let converted: Arc<dyn Store<B>> = Arc::new(Converted::<B, A>::new(store.clone()));
            storage.provide::<B>(converted.clone());
            self.serve_at::<A>(store, A::version_name(), versions.clone())
                .serve_at::<B>(converted, A::version_name(), versions)
        }
    }

    /// Serves a kind at two versions, `A` (the newer) and `B`, from `store`, which holds `A`
    /// (a source of its own, as the Pod cache is for FarmPods): `B` converted on every read and
    /// kept by none ([`Converted::per_read`]), so the cache holds each object once however the
    /// clients read it.
    pub fn serve_versions_from<A, B>(self, store: Arc<dyn Store<A>>) -> Self
    where
        A: VersionOf<B>,
        B: VersionOf<A>,
    {
        // Its own source writes nothing through the REST layer: no field managers to join.
        let converted: Arc<dyn Store<B>> = Arc::new(Converted::<B, A>::per_read(store.clone()));
        self.serve_at::<A>(store, A::version_name(), None)
            .serve_at::<B>(converted, A::version_name(), None)
    }

    /// Serves `K` from `store`, whose objects are stored at `storage_version`.
    fn serve_at<K: ServedResource>(
        mut self,
        store: Arc<dyn Store<K>>,
        storage_version: &'static str,
        versions: Option<Arc<dyn crate::rest::fields::Versions>>,
    ) -> Self {
        let info = ResourceInfo {
            storage_version,
            ..ResourceInfo::of::<K>(store.writable().is_some())
        };
        self.resources.push(info.clone());
        self.checks.extend(store.clone().readiness_checks());
        self.installs.push(Box::new(move |endpoints, ctx| {
            endpoints.with::<K>(store, info, versions, ctx)
        }));
        self
    }

    /// The served kinds' facts, in discovery order.
    pub fn resources(&self) -> &[ResourceInfo] {
        &self.resources
    }

    /// What the kinds' stores add to `/readyz`.
    pub fn readiness_checks(&self) -> &[Check] {
        &self.checks
    }

    /// The kinds' REST endpoints, sharing `ctx`; fails on the first kind whose schema does not
    /// convert for field management (see [`Endpoints::with`]).
    pub fn endpoints(self, ctx: &RestContext) -> anyhow::Result<(Vec<ResourceInfo>, Endpoints)> {
        let endpoints = self
            .installs
            .into_iter()
            .try_fold(Endpoints::default(), |endpoints, install| {
                install(endpoints, ctx.clone())
            })?;
        Ok((self.resources, endpoints))
    }
}

/// The kinds farm-apiserver serves, added to `group` in discovery order, one line each: a
/// writable kind's store comes from `storage` (memory or etcd, as `--storage` says), FarmPods
/// from the Pod watch cache. The binary and the tests' servers serve what this lists
/// ([`crate::server::Config::kinds`]); a new kind is its file in `src/resources/` and its line
/// here.
pub fn register(group: ApiGroup, storage: &StorageFactory) -> ApiGroup {
    group
        .serve_versions::<llama::v1::Llama, llama::v1alpha::Llama>(storage)
        .serve_versions_from::<FarmPod, farmpod::v1alpha::FarmPod>(storage.pods())
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;
    use crate::{
        resource::{GROUP, VERSION},
        store::PodCache,
    };

    #[tokio::test]
    async fn verbs_follow_the_store() {
        let storage = StorageFactory::memory(PodCache::without_cluster());
        let group = register(ApiGroup::new(), &storage);
        let [llamas_v1, llamas_v1alpha, farmpods_v1, farmpods] = group.resources() else {
            panic!("Llamas and FarmPods at two versions each")
        };
        for llamas in [llamas_v1, llamas_v1alpha] {
            assert!(llamas.writable && llamas.verbs.contains(&"create"));
            assert_eq!(llamas.storage_version, "v1");
        }
        assert_eq!(
            (llamas_v1.version, llamas_v1alpha.version),
            ("v1", "v1alpha")
        );
        for farmpods in [farmpods_v1, farmpods] {
            assert!(!farmpods.writable);
            assert_eq!(farmpods.verbs, ["get", "list", "watch"]);
            assert_eq!(farmpods.storage_version, "v1", "the Pod cache's");
        }
        // The stores' readiness comes with them: the Pod cache's two checks.
        let checks: Vec<_> = group.readiness_checks().iter().map(|c| c.name).collect();
        assert_eq!(checks, ["farmpod-cache-synced", "farmpod-watch"]);
    }

    #[tokio::test]
    async fn the_storage_version_is_the_one_the_factory_stores_at() {
        let storage = StorageFactory::memory(PodCache::without_cluster()).storing_at("v1alpha");
        let group = register(ApiGroup::new(), &storage);
        let versions: Vec<_> = group
            .resources()
            .iter()
            .map(|info| (info.version, info.storage_version))
            .collect();
        assert_eq!(
            versions,
            [
                ("v1", "v1alpha"),
                ("v1alpha", "v1alpha"),
                ("v1", "v1"),
                ("v1alpha", "v1")
            ]
        );
    }

    #[test]
    fn every_kind_is_in_the_served_group() {
        assert_eq!(llama::v1::Llama::group(&()), GROUP);
        assert_eq!(llama::v1::Llama::version(&()), "v1");
        assert_eq!(llama::v1alpha::Llama::version(&()), VERSION);
        assert_eq!(FarmPod::group(&()), GROUP);
        assert_eq!(FarmPod::version(&()), "v1");
        assert_eq!(farmpod::v1alpha::FarmPod::version(&()), VERSION);
    }
}
