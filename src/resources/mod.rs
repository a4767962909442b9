//! The kinds farm.example.com serves, each declared in its own file, and [`register`], the one
//! line each that serves it.

pub mod farmpod;
pub mod llama;

pub use farmpod::{FarmPod, FarmPodSpec, FarmPodStatus};
pub use llama::{Llama, LlamaSpec};

use aggregated_apiserver::{group::ApiGroup, store::StorageFactory};

/// The API group served, as the APIServices name it.
pub const GROUP: &str = "farm.example.com";
/// The first version of [`GROUP`], served since the first release.
pub const VERSION: &str = "v1alpha";

/// The kinds farm-apiserver serves, in discovery order, one line each: a writable kind's store
/// comes from `storage` (memory or etcd, as `--storage` says), a view's from its watch cache of
/// the cluster's objects. The binary and the tests' servers serve what this lists
/// ([`aggregated_apiserver::server::Config::kinds`]); a new kind is its file here and its line
/// below.
pub fn register(storage: &StorageFactory) -> ApiGroup {
    ApiGroup::new(GROUP)
        .serve_versions::<llama::v1::Llama, llama::v1alpha::Llama>(storage)
        .serve_versions_from::<FarmPod, farmpod::v1alpha::FarmPod>(storage.view())
}

#[cfg(test)]
mod tests {
    use kube::Resource;

    use super::*;

    #[tokio::test]
    async fn verbs_follow_the_store() {
        let storage = StorageFactory::memory();
        let group = register(&storage);
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
        // The stores' readiness comes with them: the FarmPod view's two checks.
        let checks: Vec<_> = group.readiness_checks().iter().map(|c| c.name).collect();
        assert_eq!(checks, ["farmpod-cache-synced", "farmpod-watch"]);
    }

    #[tokio::test]
    async fn the_storage_version_is_the_one_the_factory_stores_at() {
        let storage = StorageFactory::memory().storing_at("v1alpha");
        let group = register(&storage);
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
