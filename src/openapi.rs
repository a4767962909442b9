//! OpenAPI v2 (`/openapi/v2`) and v3 (`/openapi/v3`, `/openapi/v3/apis/farm.example.com/v1alpha`)
//! generated from the Rust types with schemars, shaped as kube-openapi serves them: schemas named
//! `com.example.farm.v1alpha.<Kind>` with `x-kubernetes-group-version-kind`, which is what
//! `kubectl explain` and the aggregator look for.

use std::sync::Arc;

use axum::{
    Router,
    extract::{RawQuery, State},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta, ObjectMeta, Status};
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha512};

use crate::{
    conditional,
    error::{Error, Result},
    negotiate,
    resource::{GROUP, GROUP_VERSION, ResourceInfo, VERSION},
};

/// `com.example.farm.v1alpha`: kube-openapi names a group's schemas by the reversed group.
pub(crate) fn schema_prefix() -> String {
    let mut parts: Vec<&str> = GROUP.split('.').collect();
    parts.reverse();
    format!("{}.{VERSION}", parts.join("."))
}

const META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1";

fn gvk(kind: &str) -> Value {
    json!([{ "group": GROUP, "kind": kind, "version": VERSION }])
}

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

/// All schemas of the group version, v3-style refs.
pub(crate) fn schemas(resources: &[ResourceInfo]) -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let prefix = schema_prefix();
    let mut own = Map::new();
    generator.subschema_for::<ObjectMeta>();
    generator.subschema_for::<ListMeta>();
    generator.subschema_for::<Status>();
    generator.subschema_for::<DeleteOptions>();
    for info in resources {
        let (spec, status) = (info.schema)(&mut generator);
        let mut properties = Map::new();
        properties.insert("apiVersion".into(), json!({
            "description": "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources",
            "type": "string"
        }));
        properties.insert("kind".into(), json!({
            "description": "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds",
            "type": "string"
        }));
        properties.insert("metadata".into(), json!({
            "allOf": [Flavor::V3.reference(&format!("{META}.ObjectMeta"))],
            "default": {},
            "description": "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata"
        }));
        properties.insert("spec".into(), spec.to_value());
        if let Some(status) = status {
            properties.insert("status".into(), status.to_value());
        }
        own.insert(
            format!("{prefix}.{}", info.kind),
            json!({
                "description": info.description,
                "type": "object",
                "required": ["spec"],
                "properties": properties,
                "x-kubernetes-group-version-kind": gvk(&info.kind),
            }),
        );
        own.insert(
            format!("{prefix}.{}List", info.kind),
            json!({
                "description": format!("{}List is a list of {}.", info.kind, info.kind),
                "type": "object",
                "required": ["items"],
                "properties": {
                    "apiVersion": { "type": "string", "description": "APIVersion defines the versioned schema of this representation of an object." },
                    "kind": { "type": "string", "description": "Kind is a string value representing the REST resource this object represents." },
                    "items": {
                        "description": format!("List of {}.", info.plural),
                        "type": "array",
                        "items": Flavor::V3.reference(&format!("{prefix}.{}", info.kind)),
                    },
                    "metadata": {
                        "allOf": [Flavor::V3.reference(&format!("{META}.ListMeta"))],
                        "default": {},
                        "description": "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds"
                    }
                },
                "x-kubernetes-group-version-kind": gvk(&format!("{}List", info.kind)),
            }),
        );
    }
    let mut all = generator.take_definitions(true);
    // schemars names our own types by their Rust names; give them the group's prefix.
    let renames: Vec<String> = all.keys().filter(|k| !k.contains('.')).cloned().collect();
    let mut out = Map::new();
    for (name, schema) in std::mem::take(&mut all) {
        let name = if renames.contains(&name) {
            format!("{prefix}.{name}")
        } else {
            name
        };
        out.insert(name, schema);
    }
    out.extend(own);
    merge_keys(&mut out);
    out.insert(
        format!("{META}.WatchEvent"),
        json!({
            "description": "Event represents a single event to a watched resource.",
            "type": "object",
            "required": ["type", "object"],
            "properties": {
                "object": { "description": "Object is: * If Type is Added or Modified: the new state of the object. * If Type is Deleted: the state of the object immediately before deletion. * If Type is Error: *Status is recommended; other types may make sense depending on context.", "type": "object" },
                "type": { "type": "string" }
            }
        }),
    );
    out.insert(
        format!("{META}.Patch"),
        json!({
            "description": "Patch is provided to give a concrete name and type to the Kubernetes PATCH request body.",
            "type": "object"
        }),
    );
    let mut out = Value::Object(out);
    rewrite_refs(&mut out, &|target| {
        let name = target.strip_prefix(V3_REFS)?;
        renames
            .iter()
            .any(|r| r == name)
            .then(|| format!("{V3_REFS}{prefix}.{name}"))
    });
    match out {
        Value::Object(map) => map,
        _ => Map::new(),
    }
}

/// The list and map types kube-apiserver publishes for ObjectMeta's lists (k8s-openapi's schemas
/// leave them out), which server-side apply merges by: finalizers as a set, ownerReferences
/// keyed by uid (each one atomic), managedFields whole.
fn merge_keys(schemas: &mut Map<String, Value>) {
    let Some(Value::Object(properties)) = schemas
        .get_mut(&format!("{META}.ObjectMeta"))
        .and_then(|meta| meta.get_mut("properties"))
    else {
        return;
    };
    let extensions = [
        (
            "finalizers",
            json!({"x-kubernetes-list-type": "set", "x-kubernetes-patch-strategy": "merge"}),
        ),
        (
            "ownerReferences",
            json!({
                "x-kubernetes-list-map-keys": ["uid"],
                "x-kubernetes-list-type": "map",
                "x-kubernetes-patch-merge-key": "uid",
                "x-kubernetes-patch-strategy": "merge",
            }),
        ),
        ("managedFields", json!({"x-kubernetes-list-type": "atomic"})),
    ];
    for (field, extension) in extensions {
        if let (Some(Value::Object(schema)), Value::Object(extension)) =
            (properties.get_mut(field), extension)
        {
            schema.extend(extension);
        }
    }
    // An owner reference is replaced whole, never merged field by field.
    if let Some(Value::Object(owner)) = schemas.get_mut(&format!("{META}.OwnerReference")) {
        owner.insert("x-kubernetes-map-type".into(), json!("atomic"));
    }
}

const V3_REFS: &str = "#/components/schemas/";

/// Rewrites every `$ref` in `value` that `rename` gives a new target.
fn rewrite_refs(value: &mut Value, rename: &dyn Fn(&str) -> Option<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map.iter_mut() {
                match child {
                    Value::String(target) if key == "$ref" => {
                        if let Some(renamed) = rename(target) {
                            *target = renamed;
                        }
                    }
                    child => rewrite_refs(child, rename),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| rewrite_refs(item, rename)),
        _ => {}
    }
}

struct Param {
    name: &'static str,
    description: &'static str,
    type_: &'static str,
}

const LIST_PARAMS: &[Param] = &[
    Param {
        name: "allowWatchBookmarks",
        description: "allowWatchBookmarks requests watch events with type \"BOOKMARK\".",
        type_: "boolean",
    },
    Param {
        name: "continue",
        description: "The continue option should be set when retrieving more results from the server.",
        type_: "string",
    },
    Param {
        name: "fieldSelector",
        description: "A selector to restrict the list of returned objects by their fields (metadata.name, metadata.namespace). Defaults to everything.",
        type_: "string",
    },
    Param {
        name: "labelSelector",
        description: "A selector to restrict the list of returned objects by their labels. Defaults to everything.",
        type_: "string",
    },
    Param {
        name: "limit",
        description: "limit is a maximum number of responses to return for a list call.",
        type_: "integer",
    },
    Param {
        name: "resourceVersion",
        description: "resourceVersion sets a constraint on what resource versions a request may be served from.",
        type_: "string",
    },
    Param {
        name: "resourceVersionMatch",
        description: "resourceVersionMatch determines how resourceVersion is applied to list calls.",
        type_: "string",
    },
    Param {
        name: "sendInitialEvents",
        description: "`sendInitialEvents=true` may be set together with `watch=true`. The stream begins with synthetic events for the current state, then a bookmark annotated \"k8s.io/initial-events-end\".",
        type_: "boolean",
    },
    Param {
        name: "timeoutSeconds",
        description: "Timeout for the list/watch call.",
        type_: "integer",
    },
    Param {
        name: "watch",
        description: "Watch for changes to the described resources and return them as a stream of add, update, and remove notifications.",
        type_: "boolean",
    },
];

const WRITE_PARAMS: &[Param] = &[
    Param {
        name: "dryRun",
        description: "When present, indicates that modifications should not be persisted. The only valid value is All.",
        type_: "string",
    },
    Param {
        name: "fieldManager",
        description: "fieldManager is a name associated with the actor or entity that is making these changes.",
        type_: "string",
    },
    Param {
        name: "fieldValidation",
        description: "How the server handles unknown fields: Ignore, Warn (default) or Strict.",
        type_: "string",
    },
];

fn query_params(flavor: Flavor, params: &[Param]) -> Vec<Value> {
    params
        .iter()
        .map(|p| match flavor {
            Flavor::V2 => json!({ "in": "query", "name": p.name, "description": p.description, "type": p.type_, "uniqueItems": true }),
            Flavor::V3 => json!({ "in": "query", "name": p.name, "description": p.description, "schema": { "type": p.type_, "uniqueItems": true } }),
        })
        .collect()
}

fn path_param(flavor: Flavor, name: &str, description: &str) -> Value {
    match flavor {
        Flavor::V2 => {
            json!({ "in": "path", "name": name, "description": description, "required": true, "type": "string", "uniqueItems": true })
        }
        Flavor::V3 => {
            json!({ "in": "path", "name": name, "description": description, "required": true, "schema": { "type": "string", "uniqueItems": true } })
        }
    }
}

fn response(flavor: Flavor, description: &str, schema: &str) -> Value {
    let schema = flavor.reference(schema);
    match flavor {
        Flavor::V2 => json!({ "description": description, "schema": schema }),
        Flavor::V3 => {
            json!({ "description": description, "content": { "application/json": { "schema": schema } } })
        }
    }
}

struct Op<'a> {
    id: String,
    description: String,
    action: &'static str,
    kind: &'a str,
    params: Vec<Value>,
    body: Option<(&'static [&'static str], String)>,
    responses: Vec<(&'static str, Value)>,
}

fn operation(flavor: Flavor, op: Op<'_>) -> Value {
    let mut params = op.params;
    let mut out = json!({
        "operationId": op.id,
        "description": op.description,
        "tags": [format!("farmExampleCom_{VERSION}")],
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": { "group": GROUP, "version": VERSION, "kind": op.kind },
        "responses": op.responses.into_iter().map(|(c, r)| (c.to_owned(), r)).chain([("401".to_owned(), json!({ "description": "Unauthorized" }))]).collect::<Map<_, _>>(),
    });
    if let Some((content_types, schema)) = op.body {
        match flavor {
            Flavor::V2 => {
                params.insert(
                    0,
                    json!({ "in": "body", "name": "body", "required": true, "schema": flavor.reference(&schema) }),
                );
                out["consumes"] = json!(content_types);
            }
            Flavor::V3 => {
                out["requestBody"] = json!({
                    "required": true,
                    "content": content_types.iter().map(|ct| ((*ct).to_owned(), json!({ "schema": flavor.reference(&schema) }))).collect::<Map<_, _>>(),
                });
            }
        }
    }
    if flavor == Flavor::V2 {
        out["produces"] = json!(["application/json"]);
        out["schemes"] = json!(["https"]);
    }
    out["parameters"] = Value::Array(params);
    out
}

fn paths(flavor: Flavor, resources: &[ResourceInfo]) -> Map<String, Value> {
    let prefix = schema_prefix();
    let mut paths = Map::new();
    for info in resources {
        let kind = info.kind.as_str();
        let object = format!("{prefix}.{kind}");
        let list = format!("{prefix}.{kind}List");
        let status = format!("{META}.Status");
        let base = format!("/apis/{GROUP_VERSION}");
        let plural = info.plural;
        // kube-apiserver's operation ids: `listNamespacedLlama`, `listPasture`.
        let scope = if info.namespaced { "Namespaced" } else { "" };
        let list_params = || query_params(flavor, LIST_PARAMS);
        let write_params = || query_params(flavor, WRITE_PARAMS);
        let ns_param = || {
            path_param(
                flavor,
                "namespace",
                "object name and auth scope, such as for teams and projects",
            )
        };
        let name_param = || path_param(flavor, "name", &format!("name of the {kind}"));

        // All namespaces: list and watch.
        if info.namespaced {
            paths.insert(
                format!("{base}/{plural}"),
                json!({
                    "get": operation(flavor, Op {
                        id: format!("list{kind}ForAllNamespaces"),
                        description: format!("list or watch objects of kind {kind}"),
                        action: "list",
                        kind,
                        params: list_params(),
                        body: None,
                        responses: vec![("200", response(flavor, "OK", &list))],
                    }),
                }),
            );
        }

        let mut collection = Map::new();
        collection.insert(
            "get".into(),
            operation(
                flavor,
                Op {
                    id: format!("list{scope}{kind}"),
                    description: format!("list or watch objects of kind {kind}"),
                    action: "list",
                    kind,
                    params: list_params(),
                    body: None,
                    responses: vec![("200", response(flavor, "OK", &list))],
                },
            ),
        );
        let mut item = Map::new();
        item.insert(
            "get".into(),
            operation(
                flavor,
                Op {
                    id: format!("read{scope}{kind}"),
                    description: format!("read the specified {kind}"),
                    action: "get",
                    kind,
                    params: Vec::new(),
                    body: None,
                    responses: vec![("200", response(flavor, "OK", &object))],
                },
            ),
        );
        if info.writable {
            collection.insert(
                "post".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("create{scope}{kind}"),
                        description: format!("create a {kind}"),
                        action: "post",
                        kind,
                        params: write_params(),
                        body: Some((&["application/json"], object.clone())),
                        responses: vec![
                            ("200", response(flavor, "OK", &object)),
                            ("201", response(flavor, "Created", &object)),
                        ],
                    },
                ),
            );
            collection.insert(
                "delete".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("deleteCollection{scope}{kind}"),
                        description: format!("delete collection of {kind}"),
                        action: "deletecollection",
                        kind,
                        params: list_params(),
                        body: None,
                        responses: vec![("200", response(flavor, "OK", &list))],
                    },
                ),
            );
            item.insert(
                "put".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("replace{scope}{kind}"),
                        description: format!("replace the specified {kind}"),
                        action: "put",
                        kind,
                        params: write_params(),
                        body: Some((&["application/json"], object.clone())),
                        responses: vec![("200", response(flavor, "OK", &object))],
                    },
                ),
            );
            // No strategic-merge-patch here: kubectl then computes JSON merge patches.
            item.insert(
                "patch".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("patch{scope}{kind}"),
                        description: format!("partially update the specified {kind}"),
                        action: "patch",
                        kind,
                        params: write_params(),
                        body: Some((
                            &[
                                "application/json-patch+json",
                                "application/merge-patch+json",
                            ],
                            format!("{META}.Patch"),
                        )),
                        responses: vec![("200", response(flavor, "OK", &object))],
                    },
                ),
            );
            item.insert(
                "delete".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("delete{scope}{kind}"),
                        description: format!("delete a {kind}"),
                        action: "delete",
                        kind,
                        params: query_params(flavor, &WRITE_PARAMS[..1]),
                        body: None,
                        responses: vec![
                            ("200", response(flavor, "OK", &object)),
                            ("202", response(flavor, "Accepted", &status)),
                        ],
                    },
                ),
            );
        }
        // `<object>/status`: read, and when writable replace and patch, of the status.
        let mut status = Map::new();
        if info.status {
            status.insert(
                "get".into(),
                operation(
                    flavor,
                    Op {
                        id: format!("read{scope}{kind}Status"),
                        description: format!("read status of the specified {kind}"),
                        action: "get",
                        kind,
                        params: Vec::new(),
                        body: None,
                        responses: vec![("200", response(flavor, "OK", &object))],
                    },
                ),
            );
            if info.writable {
                status.insert(
                    "put".into(),
                    operation(
                        flavor,
                        Op {
                            id: format!("replace{scope}{kind}Status"),
                            description: format!("replace status of the specified {kind}"),
                            action: "put",
                            kind,
                            params: write_params(),
                            body: Some((&["application/json"], object.clone())),
                            responses: vec![("200", response(flavor, "OK", &object))],
                        },
                    ),
                );
                status.insert(
                    "patch".into(),
                    operation(
                        flavor,
                        Op {
                            id: format!("patch{scope}{kind}Status"),
                            description: format!("partially update status of the specified {kind}"),
                            action: "patch",
                            kind,
                            params: write_params(),
                            body: Some((
                                &[
                                    "application/json-patch+json",
                                    "application/merge-patch+json",
                                ],
                                format!("{META}.Patch"),
                            )),
                            responses: vec![("200", response(flavor, "OK", &object))],
                        },
                    ),
                );
            }
        }
        let collection_path = if info.namespaced {
            collection.insert("parameters".into(), json!([ns_param()]));
            item.insert("parameters".into(), json!([name_param(), ns_param()]));
            status.insert("parameters".into(), json!([name_param(), ns_param()]));
            format!("{base}/namespaces/{{namespace}}/{plural}")
        } else {
            item.insert("parameters".into(), json!([name_param()]));
            status.insert("parameters".into(), json!([name_param()]));
            format!("{base}/{plural}")
        };
        if info.status {
            paths.insert(
                format!("{collection_path}/{{name}}/status"),
                Value::Object(status),
            );
        }
        paths.insert(format!("{collection_path}/{{name}}"), Value::Object(item));
        paths.insert(collection_path, Value::Object(collection));
    }
    paths
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
