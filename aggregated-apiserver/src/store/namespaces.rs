//! kube-apiserver's NamespaceLifecycle admission for our kinds, which k8s.io/apiserver's
//! RecommendedOptions turn on for every aggregated server: nothing is created in a namespace
//! that does not exist (404) or is being deleted (403), so the namespace controller can empty
//! a namespace and finish deleting it. Updates and deletes are left alone: the controller
//! must be able to remove what is there.
//!
//! One watch of the cluster's Namespaces (a kube-runtime reflector, started at boot when a
//! cluster is configured) answers almost every check; a namespace it does not know (created a
//! moment ago, or not there) is looked up live, as the plugin does.

use std::{collections::BTreeMap, sync::Arc};

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, runtime::reflector};

use crate::error::{Error, Result, Subject};

/// The cluster's namespaces, as far as creating something in one is concerned.
pub struct Namespaces {
    cache: reflector::Store<Namespace>,
    api: Api<Namespace>,
}

impl Namespaces {
    /// Starts watching `client`'s Namespaces.
    pub fn start(client: kube::Client) -> Arc<Self> {
        Arc::new(Self {
            cache: crate::store::informer::start(client.clone()),
            api: Api::all(client),
        })
    }

    /// Whether an object may be created in `namespace`: 404 when it does not exist, 403 when
    /// it is being deleted. `object` names what is created (for the 403's message).
    pub async fn admit_create(&self, namespace: &str, object: Subject) -> Result<()> {
        let known = self
            .cache
            .get(&reflector::ObjectRef::new(namespace))
            .map(|ns| terminating(&ns));
        let terminating = match known {
            Some(terminating) => terminating,
            None => match self.api.get_opt(namespace).await {
                Ok(Some(ns)) => terminating(&ns),
                Ok(None) => {
                    return Err(Error::NotFound(Subject {
                        resource: "namespaces".into(),
                        group: String::new(),
                        kind: "namespaces".into(),
                        name: namespace.to_owned(),
                    }));
                }
                Err(error) => {
                    return Err(Error::Internal(format!(
                        "looking up namespace {namespace}: {error}"
                    )));
                }
            },
        };
        if terminating {
            return Err(Error::NamespaceTerminating {
                subject: object,
                namespace: namespace.to_owned(),
            });
        }
        Ok(())
    }
}

impl Namespaces {
    /// The labels of `namespace` (for webhooks' `namespaceSelector`), looked up live when the
    /// watch does not know it yet; 404 when it does not exist.
    pub async fn labels(&self, namespace: &str) -> Result<Option<BTreeMap<String, String>>> {
        if let Some(known) = self.cache.get(&reflector::ObjectRef::new(namespace)) {
            return Ok(known.metadata.labels.clone());
        }
        match self.api.get_opt(namespace).await {
            Ok(Some(found)) => Ok(found.metadata.labels),
            Ok(None) => Err(Error::NotFound(Subject {
                resource: "namespaces".into(),
                group: String::new(),
                kind: "namespaces".into(),
                name: namespace.to_owned(),
            })),
            Err(error) => Err(Error::Internal(format!(
                "looking up namespace {namespace}: {error}"
            ))),
        }
    }
}

fn terminating(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_some()
        || namespace
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Terminating")
}
