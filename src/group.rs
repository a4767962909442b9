//! The one place kinds are installed: `ApiGroup::new().serve::<Llama>(store)` gives the kind
//! its REST endpoints, its discovery entry and OpenAPI paths, its metrics label and its
//! `apiserver_storage_objects` series. What the kind is comes from its own file
//! ([`ServedResource`]); what it may do (read-only or not) from its store.

use std::sync::Arc;

use crate::{
    resource::{ResourceInfo, ServedResource},
    resources::{FarmPod, Llama},
    rest::{Endpoints, RestContext},
    store::{MemoryStore, PodCache, Store},
};

type Install = Box<dyn FnOnce(Endpoints, RestContext) -> anyhow::Result<Endpoints> + Send>;

/// The kinds `farm.example.com/v1alpha` serves, each with its store, in discovery order.
#[derive(Default)]
pub struct ApiGroup {
    resources: Vec<ResourceInfo>,
    installs: Vec<Install>,
}

impl ApiGroup {
    /// No kinds yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Serves `K` from `store`: every verb the store supports (get, list and watch from any
    /// store; create, update, patch, delete and deletecollection when it is writable).
    pub fn serve<K: ServedResource>(mut self, store: Arc<dyn Store<K>>) -> Self {
        self.resources
            .push(ResourceInfo::of::<K>(store.writable().is_some()));
        self.installs.push(Box::new(move |endpoints, ctx| {
            endpoints.with::<K>(store, ctx)
        }));
        self
    }

    /// The served kinds' facts, in discovery order.
    pub fn resources(&self) -> &[ResourceInfo] {
        &self.resources
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

/// farm-apiserver's kinds: Llamas from `llamas` (memory by default), FarmPods from the Pod
/// watch cache.
pub fn farm(llamas: Arc<dyn Store<Llama>>, farmpods: Arc<PodCache>) -> ApiGroup {
    ApiGroup::new()
        .serve::<Llama>(llamas)
        .serve::<FarmPod>(farmpods)
}

/// The Llama store of the embedded default: in memory, with the sample `default/dolly` when
/// `sample` and `synthetic` generated Llamas (benchmarks).
pub fn memory_llamas(sample: bool, synthetic: usize) -> Arc<MemoryStore<Llama>> {
    let llamas = MemoryStore::<Llama>::default();
    // A fresh store cannot refuse these: the names are distinct.
    if sample {
        let _ = llamas.insert(crate::resources::llama::sample());
    }
    for i in 0..synthetic {
        let _ = llamas.insert(crate::resources::llama::synthetic(i));
    }
    Arc::new(llamas)
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;
    use crate::resource::{GROUP, VERSION};

    #[test]
    fn verbs_follow_the_store() {
        let group = farm(memory_llamas(false, 0), PodCache::without_cluster());
        let [llamas, farmpods] = group.resources() else {
            panic!("two kinds")
        };
        assert!(llamas.writable && llamas.verbs.contains(&"create"));
        assert!(!farmpods.writable);
        assert_eq!(farmpods.verbs, ["get", "list", "watch"]);
    }

    #[test]
    fn every_kind_is_in_the_served_group_version() {
        assert_eq!(Llama::group(&()), GROUP);
        assert_eq!(Llama::version(&()), VERSION);
        assert_eq!(FarmPod::group(&()), GROUP);
        assert_eq!(FarmPod::version(&()), VERSION);
    }
}
