//! OpenAPI v2 (`/openapi/v2`, every version) and v3 (`/openapi/v3`, and one document per
//! version: `/openapi/v3/apis/zoo.example.com/<version>`) generated from the Rust types with
//! schemars, shaped as kube-openapi serves them: schemas named
//! `com.example.zoo.<version>.<Kind>` with `x-kubernetes-group-version-kind`, which is what
//! `kubectl explain` and the aggregator look for. The kinds' schemas are made in `schemas`,
//! their operations in `paths`; here the documents and their handlers.

mod paths;
mod protobuf;
mod schemas;

use std::sync::Arc;

use axum::{
    Router,
    extract::{Path, RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

pub(crate) use self::schemas::{kind_schema, schemas};
use self::{
    paths::paths,
    schemas::{V3_REFS, rewrite_refs},
};
use crate::{
    api::identity::Identity,
    error::{Error, Result},
    render::conditional,
    render::negotiate,
    resource::{ResourceInfo, at_version, group_of, served_versions},
};

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

/// Where `$ref`s point: `#/components/schemas/` (v3) or `#/definitions/` (v2).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    V2,
    V3,
}

impl Flavor {
    fn reference(self, name: &str) -> Value {
        match self {
            Flavor::V2 => json!({ "$ref": format!("#/definitions/{name}") }),
            Flavor::V3 => json!({ "$ref": format!("#/components/schemas/{name}") }),
        }
    }
}

fn info(identity: &Identity) -> Value {
    json!({ "title": identity.name, "version": identity.version })
}

/// Drops what OpenAPI v3 schemas say and Swagger 2.0 has no word for (`nullable`), as
/// kube-apiserver does when it publishes a v3 schema in v2: its v2 handler refuses a document
/// with one (`has invalid property: nullable`), and then answers 503 for the whole cluster's
/// `/openapi/v2`.
fn drop_v3_keywords(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            map.values_mut().for_each(drop_v3_keywords);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_v3_keywords),
        _ => {}
    }
}

/// The OpenAPI v2 (swagger) document: every version's paths and definitions.
pub fn v2(identity: &Identity, resources: &[ResourceInfo]) -> Value {
    let mut definitions = Map::new();
    let mut all_paths = Map::new();
    for version in served_versions(resources) {
        let at = at_version(resources, version);
        definitions.extend(schemas(version, &at));
        all_paths.extend(paths(Flavor::V2, version, &at));
    }
    let mut definitions = Value::Object(definitions);
    drop_v3_keywords(&mut definitions);
    rewrite_refs(&mut definitions, &|target| {
        target
            .strip_prefix(V3_REFS)
            .map(|name| format!("#/definitions/{name}"))
    });
    json!({
        "swagger": "2.0",
        "info": info(identity),
        "paths": all_paths,
        "definitions": definitions,
    })
}

/// The OpenAPI v3 document of the group version `version` (`resources` are at it).
pub fn v3_group_version(identity: &Identity, version: &str, resources: &[ResourceInfo]) -> Value {
    json!({
        "openapi": "3.0.0",
        "info": info(identity),
        "paths": paths(Flavor::V3, version, resources),
        "components": { "schemas": schemas(version, resources) },
    })
}

/// The key under `/openapi/v3` of a group version: `apis/<group>/<version>`.
pub fn v3_key(group: &str, version: &str) -> String {
    format!("apis/{group}/{version}")
}

fn pretty(value: &Value) -> bytes::Bytes {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_default();
    out.push(b'\n');
    out.into()
}

/// One group version's OpenAPI v3 document, as served.
#[derive(Debug)]
pub struct V3Document {
    /// `v1alpha`, say.
    pub version: &'static str,
    /// [`v3_group_version`] as indented JSON.
    pub body: bytes::Bytes,
    hash: String,
}

/// The OpenAPI documents of the served kinds, encoded once with their ETags.
#[derive(Debug)]
pub struct OpenApiDocuments {
    /// What `/openapi/v2` serves: [`v2`] as indented JSON.
    pub v2: bytes::Bytes,
    v2_etag: HeaderValue,
    /// [`v2`] as gnostic's protobuf, for clients that ask for it (client-go's
    /// `OpenAPISchema`).
    pub v2_protobuf: bytes::Bytes,
    v2_protobuf_etag: HeaderValue,
    /// What `/openapi/v3/apis/<group>/<version>` serves, per version (the preferred first).
    pub v3: Vec<V3Document>,
    v3_root: bytes::Bytes,
    /// The API group the documents describe.
    group: &'static str,
}

impl OpenApiDocuments {
    /// The documents for `resources`, titled by `identity`.
    pub fn new(identity: &Identity, resources: &[ResourceInfo]) -> Self {
        let v2_document = v2(identity, resources);
        let v2_protobuf = bytes::Bytes::from(protobuf::encode(&v2_document));
        let v2 = pretty(&v2_document);
        let v2_hash = hex::encode_upper(Sha512::digest(&v2));
        let etag = |hash: String| {
            HeaderValue::from_str(&format!("\"{hash}\""))
                .unwrap_or(HeaderValue::from_static("\"\""))
        };
        let v2_protobuf_etag = etag(hex::encode_upper(Sha512::digest(&v2_protobuf)));
        let v3: Vec<V3Document> = served_versions(resources)
            .into_iter()
            .map(|version| {
                let body = pretty(&v3_group_version(
                    identity,
                    version,
                    &at_version(resources, version),
                ));
                let hash = hex::encode_upper(Sha512::digest(&body));
                V3Document {
                    version,
                    body,
                    hash,
                }
            })
            .collect();
        let root: Map<String, Value> = v3
            .iter()
            .map(|doc| {
                let key = v3_key(group_of(resources), doc.version);
                let url = format!("/openapi/v3/{key}?hash={}", doc.hash);
                (key, json!({ "serverRelativeURL": url }))
            })
            .collect();
        let v3_root = serde_json::to_vec(&json!({ "paths": root }))
            .unwrap_or_default()
            .into();
        Self {
            group: group_of(resources),
            v2,
            v2_etag: etag(v2_hash),
            v2_protobuf,
            v2_protobuf_etag,
            v3,
            v3_root,
        }
    }

    /// The v3 document of `version`.
    pub fn v3(&self, version: &str) -> Option<&V3Document> {
        self.v3.iter().find(|doc| doc.version == version)
    }
}

fn json_acceptable(headers: &HeaderMap) -> Result<()> {
    if negotiate::accept(headers).iter().any(|r| r.accepts_json()) {
        Ok(())
    } else {
        Err(Error::NotAcceptable(
            "only application/json is served for OpenAPI documents".into(),
        ))
    }
}

fn cached(body: bytes::Bytes, etag: &HeaderValue, headers: &HeaderMap) -> Response {
    conditional::respond(&body, "application/json", Some(etag), headers)
}

/// The protobuf forms of the v2 document kube-openapi serves (the first is the deprecated
/// name client-go still sends), and the content type it answers them with.
const V2_PROTOBUF: [&str; 2] = [
    "com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "com.github.proto-openapi.spec.v2.v1.0+protobuf",
];
const V2_PROTOBUF_CONTENT_TYPE: &str = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf";

/// `/openapi/v2`: JSON, or protobuf when the client prefers it (kube-openapi's handler).
async fn get_v2(State(docs): State<Arc<OpenApiDocuments>>, headers: HeaderMap) -> Result<Response> {
    for range in negotiate::accept(&headers) {
        if range.type_ == "application" && V2_PROTOBUF.contains(&range.subtype.as_str()) {
            return Ok(conditional::respond(
                &docs.v2_protobuf,
                V2_PROTOBUF_CONTENT_TYPE,
                Some(&docs.v2_protobuf_etag),
                &headers,
            ));
        }
        if range.accepts_json() {
            return Ok(cached(docs.v2.clone(), &docs.v2_etag, &headers));
        }
    }
    Err(Error::NotAcceptable(
        "only application/json and application/com.github.proto-openapi.spec.v2@v1.0+protobuf are served for OpenAPI v2".into(),
    ))
}

async fn get_v3_root(
    State(docs): State<Arc<OpenApiDocuments>>,
    headers: HeaderMap,
) -> Result<Response> {
    json_acceptable(&headers)?;
    let mut response = (StatusCode::OK, docs.v3_root.clone()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(response)
}

/// kube-openapi's handler3: ETag is the hash; `?hash=` of the current document makes the answer
/// immutable; a stale hash redirects to the current one.
async fn get_v3_group_version(
    State(docs): State<Arc<OpenApiDocuments>>,
    Path(version): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    json_acceptable(&headers)?;
    let Some(doc) = docs.v3(&version) else {
        return Err(Error::NoRoute);
    };
    let hash = query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("hash="))
            .map(str::to_owned)
    });
    if let Some(hash) = &hash
        && hash != &doc.hash
    {
        let location = format!(
            "/openapi/v3/{}?hash={}",
            v3_key(docs.group, doc.version),
            doc.hash
        );
        let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
        if let Ok(v) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, v);
        }
        return Ok(response);
    }
    let etag = HeaderValue::from_str(&format!("\"{}\"", doc.hash))
        .unwrap_or(HeaderValue::from_static("\"\""));
    let mut response = cached(doc.body.clone(), &etag, &headers);
    if hash.is_some() {
        let h = response.headers_mut();
        h.insert(
            header::CACHE_CONTROL,
            HeaderValue::from_static("public, immutable"),
        );
        let expires = jiff::Timestamp::now() + jiff::SignedDuration::from_hours(24 * 365);
        let expires = expires.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string();
        if let Ok(v) = HeaderValue::from_str(&expires) {
            h.insert(header::EXPIRES, v);
        }
    }
    Ok(response)
}

/// `/openapi/v2`, `/openapi/v3` and `/openapi/v3/apis/<group>/<version>`, answered from
/// `docs`; 406 unless JSON is acceptable.
pub fn router(docs: Arc<OpenApiDocuments>) -> Router {
    Router::new()
        .route("/openapi/v2", get(get_v2))
        .route("/openapi/v3", get(get_v3_root))
        .route(
            &format!("/openapi/v3/apis/{}/{{version}}", docs.group),
            get(get_v3_group_version),
        )
        .with_state(docs)
}
