//! Calling one webhook: the AdmissionReview it is sent (`admission.k8s.io/v1`), where it is
//! sent (`clientConfig`: a URL, or a Service as `https://<name>.<namespace>.svc:<port><path>`,
//! trusted through `caBundle` or the system's roots), and the checks its answer must pass
//! (k8s.io/apiserver's `request/admissionreview.go`).
//!
//! A Service is resolved as kube-apiserver resolves it without `--enable-aggregator-routing`
//! (its ClusterIP service resolver): the Service is read, and the call goes to its ClusterIP,
//! or to its `externalName`, at the configured port, while TLS verifies the serving
//! certificate for `<name>.<namespace>.svc`.

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::Duration,
};

use base64::Engine;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::{
    client::legacy::{Client, connect::HttpConnector},
    rt::TokioExecutor,
};
use k8s_openapi::{
    api::{admissionregistration::v1::WebhookClientConfig, core::v1::Service},
    apimachinery::pkg::apis::meta::v1::Status,
};
use kube::runtime::reflector;
use rustls_pki_types::{CertificateDer, pem::PemObject};
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::Attributes;

/// The most a webhook's answer may be (kube-apiserver's request body bound).
const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector<Resolver>>, Full<Bytes>>;

/// The addresses services resolved to, by their `<name>.<namespace>.svc` host.
type Resolved = Arc<Mutex<HashMap<String, Vec<SocketAddr>>>>;

/// Host names to addresses: the system's resolver for URLs; for Services, what
/// [`Clients::resolve`] found just before the call.
#[derive(Clone, Default)]
struct Resolver {
    services: Option<Resolved>,
}

impl tower::Service<hyper_util::client::legacy::connect::dns::Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = std::io::Error;
    type Future = futures::future::BoxFuture<'static, std::io::Result<Self::Response>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: hyper_util::client::legacy::connect::dns::Name) -> Self::Future {
        let host = name.as_str().to_owned();
        match &self.services {
            Some(services) => {
                let found = services.lock().ok().and_then(|s| s.get(&host).cloned());
                Box::pin(async move {
                    found.map(Vec::into_iter).ok_or_else(|| {
                        std::io::Error::other(format!("service {host:?} is not resolved"))
                    })
                })
            }
            None => Box::pin(async move {
                let found = tokio::net::lookup_host((host.as_str(), 0)).await?;
                Ok(found.collect::<Vec<_>>().into_iter())
            }),
        }
    }
}

/// What a webhook answered, checked.
#[derive(Debug, Default)]
pub struct Verdict {
    /// Whether the write may go on.
    pub allowed: bool,
    /// Why not, as the webhook put it.
    pub status: Option<Status>,
    /// A JSONPatch for the object (mutating webhooks only).
    pub patch: Option<crate::json_patch::Patch>,
    /// Warnings for the client.
    pub warnings: Vec<String>,
    /// Annotations for the audit log, keyed without the webhook's name.
    pub audit_annotations: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Review {
    #[serde(rename = "apiVersion", default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    response: Option<ReviewResponse>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewResponse {
    #[serde(default)]
    uid: String,
    #[serde(default)]
    allowed: bool,
    status: Option<Status>,
    patch: Option<String>,
    patch_type: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    audit_annotations: std::collections::BTreeMap<String, String>,
}

/// HTTPS clients, one per set of trusted roots (a webhook's `caBundle`) and way of resolving
/// names (URLs, Services).
pub struct Clients {
    by_roots: Mutex<HashMap<(Vec<u8>, bool), HttpsClient>>,
    /// Where Services resolved to.
    services: Resolved,
    /// The cluster, to watch Services on.
    cluster: kube::Client,
    /// The cluster's Services, watched from the first webhook reached through one
    /// (kube-apiserver's service lister): a call reads them from memory.
    watched: std::sync::OnceLock<reflector::Store<Service>>,
}

impl Clients {
    /// Clients reading Services from `cluster`.
    pub fn new(cluster: kube::Client) -> Self {
        Self {
            by_roots: Mutex::default(),
            services: Resolved::default(),
            cluster,
            watched: std::sync::OnceLock::new(),
        }
    }

    /// The addresses a Service reference reaches at `port` (kube-apiserver's ClusterIP service
    /// resolver): its ClusterIP when it has a port `port`, or its `externalName`.
    async fn resolve(&self, namespace: &str, name: &str, port: i32) -> Result<(), String> {
        let store = self
            .watched
            .get_or_init(|| crate::store::informer::start::<Service>(self.cluster.clone()));
        // The first calls wait for the first list (bounded by the webhook's timeout).
        store
            .wait_until_ready()
            .await
            .map_err(|e| format!("failed to get service {namespace}/{name}: {e}"))?;
        let service = store
            .get(&reflector::ObjectRef::new(name).within(namespace))
            .ok_or_else(|| format!("service \"{name}\" not found"))?;
        let spec = service.spec.clone().unwrap_or_default();
        let addresses: Vec<SocketAddr> = match spec.type_.as_deref().unwrap_or("ClusterIP") {
            "ExternalName" => {
                let host = spec.external_name.unwrap_or_default();
                tokio::net::lookup_host((host.as_str(), 0))
                    .await
                    .map_err(|e| format!("resolving {host:?}: {e}"))?
                    .collect()
            }
            "ClusterIP" | "NodePort" | "LoadBalancer" => {
                let ip = spec.cluster_ip.unwrap_or_default();
                if ip.is_empty() || ip == "None" {
                    return Err(format!("cannot route to service with ClusterIP {ip:?}"));
                }
                if !spec.ports.iter().flatten().any(|p| p.port == port) {
                    return Err(format!("no service port {port} found for service {name:?}"));
                }
                let ip: std::net::IpAddr = ip
                    .parse()
                    .map_err(|_| format!("service {name:?} has an invalid ClusterIP {ip:?}"))?;
                vec![SocketAddr::new(ip, 0)]
            }
            other => return Err(format!("unsupported service type {other:?}")),
        };
        if let Ok(mut services) = self.services.lock() {
            services.insert(format!("{name}.{namespace}.svc"), addresses);
        }
        Ok(())
    }

    fn for_roots(&self, ca_bundle: &[u8], service: bool) -> Result<HttpsClient, String> {
        let key = (ca_bundle.to_vec(), service);
        if let Ok(clients) = self.by_roots.lock()
            && let Some(client) = clients.get(&key)
        {
            return Ok(client.clone());
        }
        let roots: Vec<CertificateDer<'static>> = if ca_bundle.is_empty() {
            rustls_native_certs::load_native_certs().certs
        } else {
            CertificateDer::pem_slice_iter(ca_bundle)
                .collect::<Result<_, _>>()
                .map_err(|e| format!("could not read caBundle: {e}"))?
        };
        // Trusted as kube-apiserver trusts it (Go's crypto/x509): a caBundle that is the
        // webhook's own self-signed certificate included.
        let tls = crate::net::client_tls::client_config(roots)
            .map_err(|e| format!("could not use caBundle: {e}"))?
            .with_no_client_auth();
        let resolver = Resolver {
            services: service.then(|| self.services.clone()),
        };
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(Duration::from_secs(10)));
        // HTTP/1.1, as kube-apiserver calls webhooks.
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_only()
            .enable_http1()
            .wrap_connector(http);
        let client: HttpsClient = Client::builder(TokioExecutor::new()).build(connector);
        if let Ok(mut clients) = self.by_roots.lock() {
            clients.insert(key, client.clone());
        }
        Ok(client)
    }

    /// Sends `review` to the webhook `config` names and checks its answer; the error is the
    /// reason kube-apiserver gives after `failed calling webhook "<name>": `.
    pub async fn call(
        &self,
        config: &WebhookClientConfig,
        timeout: Duration,
        review: &Value,
        uid: &str,
        mutating: bool,
    ) -> Result<Verdict, String> {
        let url = url_of(config, timeout)?;
        let service = config
            .url
            .is_none()
            .then_some(config.service.as_ref())
            .flatten();
        if let Some(service) = service {
            // Within the webhook's timeout, as the call itself.
            let port = service.port.unwrap_or(443);
            let resolved = self.resolve(&service.namespace, &service.name, port);
            tokio::time::timeout(timeout, resolved)
                .await
                .map_err(|_| {
                    format!("failed to call webhook: Post {url:?}: context deadline exceeded")
                })?
                .map_err(|e| format!("failed to call webhook: {e}"))?;
        }
        let ca_bundle = config.ca_bundle.as_ref().map_or(&[][..], |b| &b.0);
        let client = self.for_roots(ca_bundle, service.is_some())?;
        let body =
            serde_json::to_vec(review).map_err(|e| format!("could not encode the review: {e}"))?;
        let request = hyper::Request::post(&url)
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .header(hyper::header::ACCEPT, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("failed to call webhook: {e}"))?;
        let exchange = async {
            let response = client.request(request).await.map_err(|e| {
                format!(
                    "failed to call webhook: Post {url:?}: {}",
                    crate::error::chain(&e)
                )
            })?;
            let code = response.status();
            let body = Limited::new(response.into_body(), MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map_err(|e| format!("failed to call webhook: reading the response: {e}"))?
                .to_bytes();
            Ok::<_, String>((code, body))
        };
        let (code, body) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| {
                format!("failed to call webhook: Post {url:?}: context deadline exceeded")
            })??;
        if !code.is_success() {
            let text = String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned();
            return Err(format!(
                "failed to call webhook: the server responded with the status code {} ({text})",
                code.as_u16()
            ));
        }
        // serde_json's own recursion bound (128) refuses anything deeper than an answer needs.
        let review: Review = serde_json::from_slice(&body)
            .map_err(|e| format!("failed to call webhook: decoding the response: {e}"))?;
        verify(review, uid, mutating).map_err(|e| format!("received invalid webhook response: {e}"))
    }
}

/// Where the review goes, with the deadline as `?timeout=` (whole seconds, as client-go).
fn url_of(config: &WebhookClientConfig, timeout: Duration) -> Result<String, String> {
    let base = match (&config.url, &config.service) {
        (Some(url), _) => {
            if !url.starts_with("https://") {
                return Err(format!(
                    "failed to call webhook: {url:?}: the URL scheme must be https"
                ));
            }
            url.clone()
        }
        (None, Some(service)) => format!(
            "https://{}.{}.svc:{}{}",
            service.name,
            service.namespace,
            service.port.unwrap_or(443),
            service.path.as_deref().unwrap_or("")
        ),
        (None, None) => {
            return Err("webhook configuration must have either service or URL".into());
        }
    };
    let separator = if base.contains('?') { '&' } else { '?' };
    Ok(format!(
        "{base}{separator}timeout={}s",
        timeout.as_secs().max(1)
    ))
}

/// `VerifyAdmissionResponse`: an `admission.k8s.io/v1` AdmissionReview answering this request
/// (`uid`), a patch only from a mutating webhook and only as a JSONPatch.
fn verify(review: Review, uid: &str, mutating: bool) -> Result<Verdict, String> {
    if review.api_version != "admission.k8s.io/v1" || review.kind != "AdmissionReview" {
        return Err(format!(
            "expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview, got {}, Kind={}",
            review.api_version, review.kind
        ));
    }
    let Some(response) = review.response else {
        return Err("webhook response was absent".into());
    };
    if response.uid != uid {
        return Err(format!(
            "expected response.uid={uid:?}, got {:?}",
            response.uid
        ));
    }
    let patch = match (mutating, response.patch, response.patch_type) {
        (false, Some(_), _) => {
            return Err("validating webhook may not return response.patch".into());
        }
        (false, None, Some(_)) => {
            return Err("validating webhook may not return response.patchType".into());
        }
        (true, Some(_), None) => {
            return Err("webhook returned response.patch but not response.patchType".into());
        }
        (true, None, Some(_)) => {
            return Err("webhook returned response.patchType but not response.patch".into());
        }
        (true, Some(patch), Some(patch_type)) => {
            if patch_type != "JSONPatch" {
                return Err(format!("unsupported patch type {patch_type:?}"));
            }
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(patch.as_bytes())
                .map_err(|e| format!("received undecodable patch in webhook response: {e}"))?;
            // Decoded on an async worker: no deeper than serde's recursion fits any stack.
            if crate::json_patch::depth::text_depth(&bytes, crate::json_patch::depth::SHALLOW)
                > crate::json_patch::depth::SHALLOW
            {
                return Err(format!(
                    "received undecodable patch in webhook response: {}",
                    crate::json_patch::depth::too_deep_message()
                ));
            }
            let patch = crate::json_patch::Patch::decode(&bytes)
                .map_err(|e| format!("received undecodable patch in webhook response: {e}"))?;
            Some(patch)
        }
        (_, None, None) => None,
    };
    Ok(Verdict {
        allowed: response.allowed,
        status: response.status,
        patch,
        warnings: response.warnings,
        audit_annotations: response.audit_annotations,
    })
}

/// The requester as an AdmissionRequest's `userInfo`.
fn user_info(attributes: &Attributes<'_>) -> Value {
    match attributes.user {
        Some(user) => {
            let mut info =
                json!({"username": user.name, "groups": user.groups, "extra": user.extra});
            if !user.uid.is_empty() {
                info["uid"] = json!(user.uid);
            }
            info
        }
        None => json!({"username": "", "extra": {}}),
    }
}

/// The AdmissionReview of `attributes` with a fresh `uid` (`CreateV1AdmissionReview`).
pub fn review(
    attributes: &Attributes<'_>,
    uid: &str,
    object: Option<&Value>,
    old: Option<&Value>,
) -> Value {
    let [(kind, resource), (request_kind, request_resource)] = kinds_and_resources(attributes);
    let user = user_info(attributes);
    let mut request = json!({
        "uid": uid,
        "kind": kind,
        "resource": resource,
        "requestKind": request_kind,
        "requestResource": request_resource,
        "operation": attributes.operation.as_str(),
        "userInfo": user,
        "object": object,
        "oldObject": old,
        "dryRun": attributes.dry_run,
        "options": attributes.options_object(),
    });
    for (field, value) in names(attributes) {
        request[field] = json!(value);
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// The AdmissionRequest's `kind` and `resource` (the version the hook judges the write at),
/// then its `requestKind` and `requestResource` (the version requested).
fn kinds_and_resources(attributes: &Attributes<'_>) -> [(Value, Value); 2] {
    let (group, kind, resource) = (attributes.group, &attributes.kind, &attributes.resource);
    [attributes.version, attributes.request_version()].map(|version| {
        (
            json!({"group": group, "version": version, "kind": kind}),
            json!({"group": group, "version": version, "resource": resource}),
        )
    })
}

/// The AdmissionRequest's subresource, name and namespace fields that are not empty.
fn names<'a>(attributes: &Attributes<'a>) -> impl Iterator<Item = (&'static str, &'a str)> {
    [
        ("subResource", attributes.subresource),
        ("requestSubResource", attributes.subresource),
        ("name", attributes.name),
        ("namespace", attributes.namespace),
    ]
    .into_iter()
    .filter(|(_, value)| !value.is_empty())
}

/// CEL's `request` variable: the AdmissionRequest of `attributes` without its objects (they
/// are variables of their own) and without a uid.
pub fn request_variable(attributes: &Attributes<'_>) -> Value {
    let mut request = serde_json::Map::with_capacity(14);
    let [(kind, resource), (request_kind, request_resource)] = kinds_and_resources(attributes);
    request.insert("uid".into(), Value::String(String::new()));
    request.insert("requestKind".into(), request_kind);
    request.insert("kind".into(), kind);
    request.insert("requestResource".into(), request_resource);
    request.insert("resource".into(), resource);
    request.insert(
        "operation".into(),
        Value::String(attributes.operation.as_str().into()),
    );
    request.insert("userInfo".into(), user_info(attributes));
    request.insert("dryRun".into(), Value::Bool(attributes.dry_run));
    request.insert("options".into(), attributes.options_object());
    for (field, value) in names(attributes) {
        request.insert(field.into(), Value::String(value.into()));
    }
    Value::Object(request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: Value, uid: &str, mutating: bool) -> Result<Verdict, String> {
        verify(serde_json::from_value(body).unwrap(), uid, mutating)
    }

    #[test]
    fn answers_are_checked_as_kube_apiserver_checks_them() {
        let ok = json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": {"uid": "u", "allowed": true}});
        assert!(answer(ok.clone(), "u", false).unwrap().allowed);
        assert_eq!(
            answer(ok.clone(), "v", false).unwrap_err(),
            "expected response.uid=\"v\", got \"u\""
        );
        let mut v1beta1 = ok.clone();
        v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
        assert!(answer(v1beta1, "u", false).is_err());
        let patch = base64::engine::general_purpose::STANDARD
            .encode(br#"[{"op":"add","path":"/metadata/labels","value":{"a":"b"}}]"#);
        let mut patched = ok.clone();
        patched["response"]["patch"] = json!(patch);
        patched["response"]["patchType"] = json!("JSONPatch");
        assert_eq!(
            answer(patched.clone(), "u", true)
                .unwrap()
                .patch
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            answer(patched.clone(), "u", false).unwrap_err(),
            "validating webhook may not return response.patch"
        );
        patched["response"]["patchType"] = json!("MergePatch");
        assert_eq!(
            answer(patched, "u", true).unwrap_err(),
            "unsupported patch type \"MergePatch\""
        );
    }

    #[test]
    fn service_urls_carry_the_timeout() {
        let config: WebhookClientConfig = serde_json::from_value(json!({
            "service": {"namespace": "ns", "name": "hook", "path": "/check"}}))
        .unwrap();
        assert_eq!(
            url_of(&config, Duration::from_secs(10)).unwrap(),
            "https://hook.ns.svc:443/check?timeout=10s"
        );
        let config: WebhookClientConfig =
            serde_json::from_value(json!({"url": "http://127.0.0.1:1/x"})).unwrap();
        assert!(url_of(&config, Duration::from_secs(1)).is_err());
    }

    #[test]
    fn the_request_variable_is_the_review_without_objects() {
        let user = crate::auth::UserInfo {
            name: "alice".into(),
            uid: "u-1".into(),
            groups: vec!["team".into()],
            ..Default::default()
        };
        for (operation, subresource, namespace) in [
            (crate::admission::Operation::Create, "", "default"),
            (crate::admission::Operation::Update, "status", "default"),
            (crate::admission::Operation::Delete, "", ""),
        ] {
            let mut attributes = crate::admission::Attributes::of::<crate::testing::Zebra>(
                operation,
                subresource,
                namespace,
                "dolly",
            );
            attributes.user = Some(&user);
            attributes.dry_run = true;
            attributes.options = json!({"fieldManager": "kubectl"});
            let mut expected = review(&attributes, "", None, None)["request"].take();
            let fields = expected.as_object_mut().unwrap();
            fields.remove("object");
            fields.remove("oldObject");
            assert_eq!(request_variable(&attributes), expected);
        }
    }
}
