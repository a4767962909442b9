//! Where authentication's CAs come from: flags, the dev CA, and kube-apiserver's ConfigMap
//! `kube-system/extension-apiserver-authentication`, followed live. Flags override the ConfigMap.

use std::{collections::BTreeMap, sync::Arc};

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{
    Api,
    runtime::{WatchStreamExt, watcher},
};

use super::{AuthnConfig, ClientCa, RequestHeaderConfig};
use crate::net::tls::ServingTls;

/// Where kube-apiserver publishes the ConfigMap.
pub const CONFIGMAP_NAMESPACE: &str = "kube-system";
/// The ConfigMap kube-apiserver publishes its client and front-proxy CAs in.
pub const CONFIGMAP_NAME: &str = "extension-apiserver-authentication";

/// What flags and the server itself contribute, whatever the ConfigMap says.
#[derive(Debug, Clone, Default)]
pub struct StaticSources {
    /// `--requestheader-client-ca-file`.
    pub requestheader_ca: Option<String>,
    /// `--requestheader-allowed-names`.
    pub requestheader_allowed_names: Option<Vec<String>>,
    /// `--client-ca-file`.
    pub client_ca: Option<String>,
    /// The server's own dev CA (only when it made one: no --tls-cert-file).
    pub dev_ca: Option<String>,
}

/// The ConfigMap's list values are JSON arrays inside strings: `'["X-Remote-User"]'`.
fn string_list(data: &BTreeMap<String, String>, key: &str) -> Option<Vec<String>> {
    data.get(key)
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
}

/// The authentication config from the flags and the ConfigMap (None: not read, or gone).
/// The flags' request-header CA and allowed names win over the ConfigMap's; client CAs from
/// both are trusted, with the dev CA. A CA that cannot be used is logged and left out.
pub fn build(sources: &StaticSources, configmap: Option<&ConfigMap>) -> AuthnConfig {
    let empty = BTreeMap::new();
    let data = configmap.and_then(|c| c.data.as_ref()).unwrap_or(&empty);
    let requestheader_ca = sources
        .requestheader_ca
        .clone()
        .or_else(|| data.get("requestheader-client-ca-file").cloned());
    let request_header = requestheader_ca.and_then(|pem| {
        let allowed = sources
            .requestheader_allowed_names
            .clone()
            .or_else(|| string_list(data, "requestheader-allowed-names"))
            .unwrap_or_default();
        match RequestHeaderConfig::new(&pem, allowed) {
            Ok(mut config) => {
                config.set_headers(
                    string_list(data, "requestheader-username-headers"),
                    string_list(data, "requestheader-uid-headers"),
                    string_list(data, "requestheader-group-headers"),
                    string_list(data, "requestheader-extra-headers-prefix"),
                );
                Some(config)
            }
            Err(error) => {
                tracing::error!(%error, "ignoring an unusable request-header CA");
                None
            }
        }
    });
    let client_cas = [
        sources.client_ca.clone(),
        data.get("client-ca-file").cloned(),
        sources.dev_ca.clone(),
    ]
    .into_iter()
    .flatten()
    .filter_map(|pem| match ClientCa::new(&pem) {
        Ok(ca) => Some(ca),
        Err(error) => {
            tracing::error!(%error, "ignoring an unusable client CA");
            None
        }
    })
    .collect();
    AuthnConfig {
        request_header,
        client_cas,
    }
}

/// Watches the ConfigMap and applies every change to authentication and to the TLS handshake's
/// accepted client CAs, without a restart.
pub async fn follow_configmap(
    client: kube::Client,
    sources: StaticSources,
    auth: Arc<super::Auth>,
    tls: Arc<ServingTls>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, CONFIGMAP_NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIGMAP_NAME}"));
    let stream = watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    let mut initial: Option<ConfigMap> = None;
    while let Some(event) = stream.next().await {
        let configmap = match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                initial = Some(cm.clone());
                Some(cm)
            }
            Ok(watcher::Event::Delete(_)) => {
                initial = None;
                None
            }
            Ok(watcher::Event::InitDone) => initial.clone(),
            Ok(watcher::Event::Init) => continue,
            Err(error) => {
                tracing::warn!(%error, "cannot read {CONFIGMAP_NAMESPACE}/{CONFIGMAP_NAME}; keeping the current authentication config (is the extension-apiserver-authentication-reader RoleBinding there?)");
                continue;
            }
        };
        let config = build(&sources, configmap.as_ref());
        tracing::info!(
            front_proxy = config.request_header.is_some(),
            client_cas = config.client_cas.len(),
            "authentication config updated"
        );
        tls.set_client_cas(config.handshake_cas());
        auth.authn.set_config(config);
    }
}
