//! The param objects policies name (`paramKind`), watched per kind from the first write a
//! policy naming that kind judges, as kube-apiserver's dynamic informers: a write reads
//! them from memory, never lists them.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
};

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::{ParamKind, ParamRef};
use kube::{
    Api,
    api::{ApiResource, DynamicObject, GroupVersionKind},
    runtime::{WatchStreamExt, reflector, watcher},
};
use serde_json::Value;

use super::super::{
    Attributes,
    webhook::{READY_WAIT, rules},
};

/// The watched param kinds of one cluster.
pub struct Params {
    client: kube::Client,
    /// By (apiVersion, kind).
    kinds: Mutex<HashMap<(String, String), Arc<WatchedKind>>>,
}

/// One watched kind.
struct WatchedKind {
    store: reflector::Store<DynamicObject>,
    /// Whether a write has waited once for its first list: later ones do not wait (a kind
    /// the server may not list fails at once, as kube-apiserver's "not yet synced").
    waited: AtomicBool,
    /// Ends the watch with the cache.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for WatchedKind {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Params {
    /// Param kinds of `client`'s cluster, none watched yet.
    pub fn new(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            client,
            kinds: Mutex::default(),
        })
    }

    /// The client the policies watch with.
    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// The watch of `api_version`'s `kind`, started on first use.
    fn kind(&self, api_version: &str, kind: &str) -> Arc<WatchedKind> {
        let mut kinds = self
            .kinds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        kinds
            .entry((api_version.to_owned(), kind.to_owned()))
            .or_insert_with(|| {
                let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
                let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
                let api = Api::<DynamicObject>::all_with(self.client.clone(), &resource);
                let writer = reflector::store::Writer::new(resource);
                let store = writer.as_reader();
                let stream = reflector(writer, watcher(api, watcher::Config::default()))
                    .default_backoff()
                    .applied_objects();
                let kind_name = kind.to_owned();
                let task = tokio::spawn(async move {
                    futures::pin_mut!(stream);
                    while let Some(event) = stream.next().await {
                        if let Err(error) = event {
                            tracing::warn!(%error, kind = %kind_name, "watching policy params");
                        }
                    }
                });
                Arc::new(WatchedKind {
                    store,
                    waited: AtomicBool::new(false),
                    task,
                })
            })
            .clone()
    }

    /// The params a binding names (`paramRef`: by name, or by selector, in its namespace or
    /// the object's), in namespace and name order: None when the binding is skipped (none
    /// found and `Allow`), one `null` when the policy takes none. The error is the policy's
    /// failure.
    pub(crate) async fn find(
        &self,
        kind: Option<&ParamKind>,
        reference: Option<&ParamRef>,
        attributes: &Attributes<'_>,
    ) -> Result<Option<Vec<Value>>, String> {
        let (Some(kind), Some(reference)) = (kind, reference) else {
            // Evaluated with `params` null, as kube-apiserver does.
            return Ok(Some(vec![Value::Null]));
        };
        let kind_name = kind.kind.as_deref().unwrap_or_default();
        let watched = self.kind(kind.api_version.as_deref().unwrap_or("v1"), kind_name);
        if !watched.waited.swap(true, Ordering::SeqCst) {
            let _ = tokio::time::timeout(READY_WAIT, watched.store.wait_until_ready()).await;
        }
        let ready = futures::FutureExt::now_or_never(watched.store.wait_until_ready());
        if !matches!(ready, Some(Ok(()))) {
            return Err(format!(
                "paramKind kind `{kind_name}` not yet synced to use for admission"
            ));
        }
        let namespace = reference
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .unwrap_or(attributes.namespace);
        let selector = match (&reference.name, &reference.selector) {
            (None, Some(selector)) => rules::selector(Some(selector))?,
            _ => None,
        };
        let mut found: Vec<Arc<DynamicObject>> = watched
            .store
            .state()
            .into_iter()
            .filter(|item| {
                // Cluster-scoped params have no namespace to match.
                item.metadata
                    .namespace
                    .as_deref()
                    .is_none_or(|ns| namespace.is_empty() || ns == namespace)
                    && match &reference.name {
                        Some(name) => item.metadata.name.as_ref() == Some(name),
                        None => selector
                            .as_ref()
                            .is_none_or(|s| s.matches(item.metadata.labels.as_ref())),
                    }
            })
            .collect();
        if found.is_empty() {
            // Only an explicit Deny refuses (kube-apiserver's policy source).
            return match reference.parameter_not_found_action.as_deref() {
                Some("Deny") => Err(
                    "no params found for policy binding with `Deny` parameterNotFoundAction".into(),
                ),
                _ => Ok(None),
            };
        }
        found.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        Ok(Some(
            found
                .iter()
                .filter_map(|item| serde_json::to_value(item.as_ref()).ok())
                .collect(),
        ))
    }
}
