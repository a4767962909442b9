//! OpenAPI v2 (`/openapi/v2`) and v3 (`/openapi/v3`, `/openapi/v3/apis/farm.example.com/v1alpha`)
//! generated from the Rust types with schemars, shaped as kube-openapi serves them: schemas named
//! `com.example.farm.v1alpha.<Kind>` with `x-kubernetes-group-version-kind`, which is what
//! `kubectl explain` and the aggregator look for. The kinds' schemas are made in [`schemas`],
//! their operations in [`paths`]; here the documents and their handlers.

mod paths;
mod schemas;

use std::sync::Arc;

use axum::{
    Router,
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use serde_json::{Value, json};
use sha2::{Digest, Sha512};

pub(crate) use self::schemas::{schema_prefix, schemas};
use self::{
    paths::paths,
    schemas::{V3_REFS, rewrite_refs},
};
use crate::{
    conditional,
    error::{Error, Result},
    negotiate,
    resource::ResourceInfo,
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

fn info() -> Value {
    json!({ "title": "farm-apiserver", "version": env!("CARGO_PKG_VERSION") })
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

/// The OpenAPI v2 (swagger) document.
pub fn v2(resources: &[ResourceInfo]) -> Value {
    let mut definitions = Value::Object(schemas(resources));
    drop_v3_keywords(&mut definitions);
    rewrite_refs(&mut definitions, &|target| {
        target
            .strip_prefix(V3_REFS)
            .map(|name| format!("#/definitions/{name}"))
    });
    json!({
        "swagger": "2.0",
        "info": info(),
        "paths": paths(Flavor::V2, resources),
        "definitions": definitions,
    })
}

/// The OpenAPI v3 document of farm.example.com/v1alpha.
pub fn v3_group_version(resources: &[ResourceInfo]) -> Value {
    json!({
        "openapi": "3.0.0",
        "info": info(),
        "paths": paths(Flavor::V3, resources),
        "components": { "schemas": schemas(resources) },
    })
}

/// The key under `/openapi/v3`.
pub const V3_GROUP_VERSION_KEY: &str = "apis/farm.example.com/v1alpha";

fn pretty(value: &Value) -> bytes::Bytes {
    let mut out = serde_json::to_vec_pretty(value).unwrap_or_default();
    out.push(b'\n');
    out.into()
}

/// The OpenAPI documents of the served kinds, encoded once with their ETags.
#[derive(Debug)]
pub struct OpenApiDocuments {
    /// What `/openapi/v2` serves: [`v2`] as indented JSON.
    pub v2: bytes::Bytes,
    v2_etag: HeaderValue,
    /// What `/openapi/v3/apis/<group>/<version>` serves: [`v3_group_version`] as indented
    /// JSON.
    pub v3_group_version: bytes::Bytes,
    v3_hash: String,
    v3_root: bytes::Bytes,
}

impl OpenApiDocuments {
    /// The documents for `resources`.
    pub fn new(resources: &[ResourceInfo]) -> Self {
        let v2 = pretty(&v2(resources));
        let v3_group_version = pretty(&v3_group_version(resources));
        let v2_hash = hex::encode_upper(Sha512::digest(&v2));
        let v3_hash = hex::encode_upper(Sha512::digest(&v3_group_version));
        let v3_root = serde_json::to_vec(&json!({
            "paths": {
                V3_GROUP_VERSION_KEY: {
                    "serverRelativeURL": format!("/openapi/v3/{V3_GROUP_VERSION_KEY}?hash={v3_hash}")
                }
            }
        }))
        .unwrap_or_default()
        .into();
        Self {
            v2,
            v2_etag: HeaderValue::from_str(&format!("\"{v2_hash}\""))
                .unwrap_or(HeaderValue::from_static("\"\"")),
            v3_group_version,
            v3_hash,
            v3_root,
        }
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

async fn get_v2(State(docs): State<Arc<OpenApiDocuments>>, headers: HeaderMap) -> Result<Response> {
    json_acceptable(&headers)?;
    Ok(cached(docs.v2.clone(), &docs.v2_etag, &headers))
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
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response> {
    json_acceptable(&headers)?;
    let hash = query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("hash="))
            .map(str::to_owned)
    });
    if let Some(hash) = &hash
        && hash != &docs.v3_hash
    {
        let location = format!("/openapi/v3/{V3_GROUP_VERSION_KEY}?hash={}", docs.v3_hash);
        let mut response = StatusCode::MOVED_PERMANENTLY.into_response();
        if let Ok(v) = HeaderValue::from_str(&location) {
            response.headers_mut().insert(header::LOCATION, v);
        }
        return Ok(response);
    }
    let etag = HeaderValue::from_str(&format!("\"{}\"", docs.v3_hash))
        .unwrap_or(HeaderValue::from_static("\"\""));
    let mut response = cached(docs.v3_group_version.clone(), &etag, &headers);
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
            &format!("/openapi/v3/{V3_GROUP_VERSION_KEY}"),
            get(get_v3_group_version),
        )
        .with_state(docs)
}
