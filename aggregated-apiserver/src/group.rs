//! The one place kinds are installed: `ApiGroup::new(group).serve::<Zebra>(store)` gives the
//! kind its REST endpoints, its discovery entry and OpenAPI paths, its metrics label, its
//! `apiserver_storage_objects` series and its store's readiness checks. What the kind is comes
//! from its own file ([`ServedResource`]); what it may do (read-only or not) from its store.
//! The server's own list of kinds, one line each, is its user's (`server::Config::kinds`).

use std::sync::Arc;

use crate::{
    observe::health::ReadinessCheck,
    resource::{ResourceInfo, ServedResource, VersionOf},
    rest::{Endpoints, RestContext, field_managers::KindVersions},
    store::{Converted, StorageFactory, Store},
};

type Install = Box<dyn FnOnce(Endpoints, RestContext) -> anyhow::Result<Endpoints> + Send>;

/// The kinds one API group serves, each with its store, in discovery order.
pub struct ApiGroup {
    name: &'static str,
    /// Kinds of another group, refused by [`Self::endpoints`].
    strangers: Vec<String>,
    resources: Vec<ResourceInfo>,
    installs: Vec<Install>,
    checks: Vec<ReadinessCheck>,
}

impl ApiGroup {
    /// The group `name` (`zoo.example.com`), with no kinds yet.
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            strangers: Vec::new(),
            resources: Vec::new(),
            installs: Vec::new(),
            checks: Vec::new(),
        }
    }

    /// The group's name.
    pub fn name(&self) -> &'static str {
        self.name
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
    /// see the other's (`KindVersions`).
    pub fn serve_versions<A, B>(self, storage: &StorageFactory) -> Self
    where
        A: VersionOf<B>,
        B: VersionOf<A>,
    {
        let versions: Option<Arc<dyn crate::rest::field_managers::Versions>> =
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
    /// (a source of its own, as a view's cache of the cluster's objects is): `B` converted on every read and
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
        versions: Option<Arc<dyn crate::rest::field_managers::Versions>>,
    ) -> Self {
        let info = ResourceInfo {
            storage_version,
            ..ResourceInfo::of::<K>(store.writable().is_some())
        };
        if info.group != self.name {
            self.strangers
                .push(format!("{} ({}.{})", info.kind, info.plural, info.group));
        }
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
    pub fn readiness_checks(&self) -> &[ReadinessCheck] {
        &self.checks
    }

    /// The kinds' REST endpoints, sharing `ctx`; fails on a kind of another group, and on the
    /// first kind whose schema does not convert for field management (see [`Endpoints::with`]).
    pub fn endpoints(self, ctx: &RestContext) -> anyhow::Result<(Vec<ResourceInfo>, Endpoints)> {
        if !self.strangers.is_empty() {
            anyhow::bail!(
                "the API group {} cannot serve kinds of another group: {}",
                self.name,
                self.strangers.join(", ")
            );
        }
        let endpoints = self
            .installs
            .into_iter()
            .try_fold(Endpoints::new(self.name), |endpoints, install| {
                install(endpoints, ctx.clone())
            })?;
        Ok((self.resources, endpoints))
    }
}
