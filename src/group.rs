//! The one place kinds are installed: `ApiGroup::new().serve::<Llama>(store)` gives the kind
//! its REST endpoints, its discovery entry and OpenAPI paths, its metrics label, its
//! `apiserver_storage_objects` series and its store's readiness checks. What the kind is comes
//! from its own file ([`ServedResource`]); what it may do (read-only or not) from its store.
//! [`register`] lists the kinds farm-apiserver serves, one line each.

use std::sync::Arc;

use crate::{
    health::Check,
    resource::{ResourceInfo, ServedResource},
    resources::{FarmPod, Llama},
    rest::{Endpoints, RestContext},
    store::{StorageFactory, Store},
};

type Install = Box<dyn FnOnce(Endpoints, RestContext) -> anyhow::Result<Endpoints> + Send>;

/// The kinds `farm.example.com/v1alpha` serves, each with its store, in discovery order.
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
    pub fn serve<K: ServedResource>(mut self, store: Arc<dyn Store<K>>) -> Self {
        self.resources
            .push(ResourceInfo::of::<K>(store.writable().is_some()));
        self.checks.extend(store.clone().readiness_checks());
        self.installs.push(Box::new(move |endpoints, ctx| {
            endpoints.with::<K>(store, ctx)
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
        .serve::<Llama>(storage.store())
        .serve::<FarmPod>(storage.pods())
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
        let [llamas, farmpods] = group.resources() else {
            panic!("two kinds")
        };
        assert!(llamas.writable && llamas.verbs.contains(&"create"));
        assert!(!farmpods.writable);
        assert_eq!(farmpods.verbs, ["get", "list", "watch"]);
        // The stores' readiness comes with them: the Pod cache's two checks.
        let checks: Vec<_> = group.readiness_checks().iter().map(|c| c.name).collect();
        assert_eq!(checks, ["farmpod-cache-synced", "farmpod-watch"]);
    }

    #[test]
    fn every_kind_is_in_the_served_group_version() {
        assert_eq!(Llama::group(&()), GROUP);
        assert_eq!(Llama::version(&()), VERSION);
        assert_eq!(FarmPod::group(&()), GROUP);
        assert_eq!(FarmPod::version(&()), VERSION);
    }
}
