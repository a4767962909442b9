//! Discovery: `/api`, `/apis` (legacy APIGroupList or aggregated v2/v2beta1 with ETag and 304),
//! `/apis/zoo.example.com` and `/apis/zoo.example.com/<version>` for each version served, the
//! preferred (kube's version priority) first. The documents never change while the server runs,
//! so they are encoded once.

use std::sync::Arc;

use axum::{
    Router,
    extract::{Path, State},
    http::{HeaderMap, HeaderValue, header},
    response::Response,
    routing::get,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    APIGroup, APIGroupList, APIResource, APIResourceList, APIVersions, GroupVersionForDiscovery,
    ObjectMeta,
};
use kube::core::discovery::v2::{
    APIGroupDiscovery, APIGroupDiscoveryList, APIResourceDiscovery, APISubresourceDiscovery,
    APIVersionDiscovery, GroupVersionKind,
};
use serde::Serialize;
use sha2::{Digest, Sha512};

use crate::{
    error::{Error, Result},
    render::conditional,
    render::negotiate::{self, Discovery},
    resource::{ResourceInfo, at_version, served_versions},
};

/// One encoded document and its ETag.
#[derive(Debug, Clone)]
struct Document {
    body: bytes::Bytes,
    etag: HeaderValue,
}

impl Document {
    fn new<T: Serialize>(value: &T) -> Self {
        let body = serde_json::to_vec(value).unwrap_or_default();
        let etag = format!("\"{}\"", hex::encode(Sha512::digest(&body)));
        Self {
            etag: HeaderValue::from_str(&etag).unwrap_or(HeaderValue::from_static("\"\"")),
            body: body.into(),
        }
    }
}

/// Every discovery document of the served kinds, encoded once with its ETag.
#[derive(Debug)]
pub struct DiscoveryDocuments {
    /// The group's name.
    name: &'static str,
    api_versions: Document,
    group_list: Document,
    group: Document,
    /// Each version's APIResourceList, the preferred first.
    resource_lists: Vec<(&'static str, Document)>,
    aggregated_v2: Document,
    aggregated_v2beta1: Document,
    /// `/api` in aggregated form: no legacy (core) groups here.
    core_v2: Document,
    core_v2beta1: Document,
}

/// kube-rs's discovery types leave out `kind`/`apiVersion`; the server must send them.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Typed<'a, T: Serialize> {
    kind: &'static str,
    api_version: &'static str,
    #[serde(flatten)]
    inner: &'a T,
}

/// The verbs of a kind's status subresource, as kube-apiserver lists them.
fn status_verbs(info: &ResourceInfo) -> Vec<String> {
    let verbs: &[&str] = if info.writable {
        &["get", "patch", "update"]
    } else {
        &["get"]
    };
    verbs.iter().map(|v| (*v).to_owned()).collect()
}

fn api_resource(info: &ResourceInfo) -> APIResource {
    APIResource {
        name: info.plural.to_owned(),
        singular_name: info.singular.to_owned(),
        namespaced: info.namespaced,
        kind: info.kind.clone(),
        verbs: info.verbs.iter().map(|v| (*v).to_owned()).collect(),
        short_names: (!info.short_names.is_empty())
            .then(|| info.short_names.iter().map(|s| (*s).to_owned()).collect()),
        categories: (!info.categories.is_empty())
            .then(|| info.categories.iter().map(|s| (*s).to_owned()).collect()),
        group: None,
        version: None,
        storage_version_hash: Some(storage_version_hash(info)),
    }
}

/// kube-apiserver's `StorageVersionHash`: the first 8 bytes of the SHA-256 of the group,
/// version and kind objects are stored as, in base64. The storage version migrator rewrites a
/// resource's objects when it changes.
fn storage_version_hash(info: &ResourceInfo) -> String {
    use base64::Engine;
    let gvk = format!("{}/{}/{}", info.group, info.storage_version, info.kind);
    let digest = sha2::Sha256::digest(gvk.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(&digest[..8])
}

fn group(name: &str, versions: &[&'static str]) -> APIGroup {
    let versions: Vec<GroupVersionForDiscovery> = versions
        .iter()
        .map(|version| GroupVersionForDiscovery {
            group_version: format!("{name}/{version}"),
            version: (*version).into(),
        })
        .collect();
    APIGroup {
        name: name.into(),
        preferred_version: versions.first().cloned(),
        versions,
        server_address_by_client_cidrs: None,
    }
}

fn aggregated(name: &str, resources: &[ResourceInfo]) -> APIGroupDiscoveryList {
    APIGroupDiscoveryList {
        metadata: Some(Default::default()),
        items: vec![APIGroupDiscovery {
            metadata: Some(ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            }),
            versions: served_versions(resources)
                .into_iter()
                .map(|version| aggregated_version(version, &at_version(resources, version)))
                .collect(),
        }],
    }
}

fn aggregated_version(version: &'static str, resources: &[ResourceInfo]) -> APIVersionDiscovery {
    APIVersionDiscovery {
        version: Some(version.into()),
        freshness: Some("Current".into()),
        resources: resources
            .iter()
            .map(|info| APIResourceDiscovery {
                resource: Some(info.plural.to_owned()),
                response_kind: Some(GroupVersionKind {
                    group: Some(info.group.into()),
                    version: Some(version.into()),
                    kind: Some(info.kind.clone()),
                }),
                scope: Some(
                    if info.namespaced {
                        "Namespaced"
                    } else {
                        "Cluster"
                    }
                    .into(),
                ),
                singular_resource: Some(info.singular.into()),
                verbs: info.verbs.iter().map(|v| (*v).to_owned()).collect(),
                short_names: info.short_names.iter().map(|s| (*s).to_owned()).collect(),
                categories: info.categories.iter().map(|s| (*s).to_owned()).collect(),
                subresources: info
                    .status
                    .then(|| APISubresourceDiscovery {
                        subresource: Some("status".into()),
                        response_kind: Some(GroupVersionKind {
                            group: Some(info.group.into()),
                            version: Some(version.into()),
                            kind: Some(info.kind.clone()),
                        }),
                        accepted_types: Vec::new(),
                        verbs: status_verbs(info),
                    })
                    .into_iter()
                    .collect(),
            })
            .collect(),
    }
}

/// The APIResourceList of `version` (`resources` are at it).
fn resource_list(name: &str, version: &str, resources: &[ResourceInfo]) -> APIResourceList {
    APIResourceList {
        group_version: format!("{name}/{version}"),
        resources: resources
            .iter()
            .flat_map(|info| {
                let status = info.status.then(|| APIResource {
                    name: format!("{}/status", info.plural),
                    singular_name: String::new(),
                    verbs: status_verbs(info),
                    short_names: None,
                    categories: None,
                    storage_version_hash: None,
                    ..api_resource(info)
                });
                std::iter::once(api_resource(info)).chain(status)
            })
            .collect(),
    }
}

impl DiscoveryDocuments {
    /// The documents for `resources` of the API group `name`, in that order.
    pub fn new(name: &'static str, resources: &[ResourceInfo]) -> Self {
        let aggregated = aggregated(name, resources);
        let versions = served_versions(resources);
        Self {
            api_versions: Document::new(&APIVersions {
                versions: Vec::new(),
                server_address_by_client_cidrs: Vec::new(),
            }),
            group_list: Document::new(&APIGroupList {
                groups: vec![group(name, &versions)],
            }),
            group: Document::new(&group(name, &versions)),
            name,
            resource_lists: versions
                .iter()
                .map(|version| {
                    let list = resource_list(name, version, &at_version(resources, version));
                    (*version, Document::new(&list))
                })
                .collect(),
            aggregated_v2: Document::new(&Typed {
                kind: "APIGroupDiscoveryList",
                api_version: "apidiscovery.k8s.io/v2",
                inner: &aggregated,
            }),
            aggregated_v2beta1: Document::new(&Typed {
                kind: "APIGroupDiscoveryList",
                api_version: "apidiscovery.k8s.io/v2beta1",
                inner: &aggregated,
            }),
            core_v2: Document::new(&Typed {
                kind: "APIGroupDiscoveryList",
                api_version: "apidiscovery.k8s.io/v2",
                inner: &APIGroupDiscoveryList::default(),
            }),
            core_v2beta1: Document::new(&Typed {
                kind: "APIGroupDiscoveryList",
                api_version: "apidiscovery.k8s.io/v2beta1",
                inner: &APIGroupDiscoveryList::default(),
            }),
        }
    }
}

fn respond(
    doc: &Document,
    content_type: &'static str,
    headers: &HeaderMap,
    etag: bool,
) -> Response {
    let mut response =
        conditional::respond(&doc.body, content_type, etag.then_some(&doc.etag), headers);
    if etag {
        response
            .headers_mut()
            .insert(header::CACHE_CONTROL, HeaderValue::from_static("public"));
    }
    response
}

async fn apis(State(docs): State<Arc<DiscoveryDocuments>>, headers: HeaderMap) -> Result<Response> {
    let kind = negotiate::discovery(&headers)?;
    Ok(match kind {
        Discovery::V2 => respond(&docs.aggregated_v2, kind.content_type(), &headers, true),
        Discovery::V2beta1 => respond(
            &docs.aggregated_v2beta1,
            kind.content_type(),
            &headers,
            true,
        ),
        Discovery::Legacy => respond(&docs.group_list, kind.content_type(), &headers, false),
    })
}

fn json_only(headers: &HeaderMap) -> Result<()> {
    // These documents exist in plain JSON only; an Accept that excludes it gets 406.
    negotiate::output(headers).map(|_| ())
}

async fn api(State(docs): State<Arc<DiscoveryDocuments>>, headers: HeaderMap) -> Result<Response> {
    let kind = negotiate::discovery(&headers)?;
    Ok(match kind {
        Discovery::V2 => respond(&docs.core_v2, kind.content_type(), &headers, true),
        Discovery::V2beta1 => respond(&docs.core_v2beta1, kind.content_type(), &headers, true),
        Discovery::Legacy => respond(&docs.api_versions, kind.content_type(), &headers, false),
    })
}

async fn api_group(
    State(docs): State<Arc<DiscoveryDocuments>>,
    headers: HeaderMap,
) -> Result<Response> {
    json_only(&headers)?;
    Ok(respond(&docs.group, "application/json", &headers, false))
}

async fn get_resource_list(
    State(docs): State<Arc<DiscoveryDocuments>>,
    Path(version): Path<String>,
    headers: HeaderMap,
) -> Result<Response> {
    let Some((_, list)) = docs.resource_lists.iter().find(|(v, _)| *v == version) else {
        return Err(Error::NoRoute);
    };
    json_only(&headers)?;
    Ok(respond(list, "application/json", &headers, false))
}

/// `/api`, `/apis`, `/apis/<group>` and `/apis/<group>/<version>`, answered from `docs`.
pub fn router(docs: Arc<DiscoveryDocuments>) -> Router {
    let name = docs.name;
    Router::new()
        .route("/api", get(api))
        .route("/apis", get(apis))
        .route(&format!("/apis/{name}"), get(api_group))
        .route(&format!("/apis/{name}/{{version}}"), get(get_resource_list))
        .with_state(docs)
}
