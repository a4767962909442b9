//! What the server watches in its cluster besides Pods: a kube-runtime reflector per kind
//! (admission's webhook and policy configurations, the Namespaces that NamespaceLifecycle
//! checks), started once, reconnecting with backoff, its failures logged.

use futures::StreamExt;
use kube::{
    Api, Resource,
    runtime::{WatchStreamExt, reflector, watcher},
};

/// A cluster-scoped kind a reflector can keep.
pub trait Reflected:
    Resource<DynamicType = ()>
    + Clone
    + std::fmt::Debug
    + serde::de::DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Reflected for K where
    K: Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

/// Starts a reflector of every `K` in the cluster `client` reaches; its store fills once the
/// first list is done and follows the watch from then on.
pub fn start<K: Reflected>(client: kube::Client) -> reflector::Store<K> {
    let api = Api::<K>::all(client);
    let (store, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        futures::pin_mut!(stream);
        while let Some(event) = stream.next().await {
            if let Err(error) = event {
                tracing::warn!(%error, kind = %K::kind(&()), "watch failed; retrying with backoff");
            }
        }
    });
    store
}
