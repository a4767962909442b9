//! The kinds' operations (`paths`), as kube-apiserver publishes a resource's: list and watch,
//! create, read, replace, patch, delete and deletecollection, and the status subresource's.

use serde_json::{Map, Value, json};

use super::{Flavor, META, schemas::schema_prefix};
use crate::resource::{GROUP, GROUP_VERSION, ResourceInfo, VERSION};

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

/// Where an operation is: the collection, one object, or its status.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Collection,
    Item,
    Status,
}

/// The query parameters an operation takes.
#[derive(Clone, Copy)]
enum Query {
    None,
    List,
    Write,
    /// A delete's: dryRun only.
    Delete,
}

/// What an operation's body is.
#[derive(Clone, Copy)]
enum Body {
    None,
    Object,
    Patch,
}

/// What an answer's body is.
#[derive(Clone, Copy)]
enum Answer {
    Object,
    List,
    Status,
}

/// One operation of a kind, in kube-apiserver's words: `{scope}` and `{kind}` in its id and
/// description are the kind's (`readNamespacedLlama`, "read the specified Llama").
struct Operation {
    place: Place,
    method: &'static str,
    id: &'static str,
    description: &'static str,
    action: &'static str,
    /// Served only for a writable kind.
    writes: bool,
    query: Query,
    body: Body,
    answers: &'static [(&'static str, &'static str, Answer)],
}

const OK_OBJECT: &[(&str, &str, Answer)] = &[("200", "OK", Answer::Object)];
const OK_LIST: &[(&str, &str, Answer)] = &[("200", "OK", Answer::List)];

/// Every operation of a kind but the list across namespaces. No strategic-merge-patch among
/// the patches: kubectl then computes JSON merge patches.
const OPERATIONS: &[Operation] = &[
    Operation {
        place: Place::Collection,
        method: "get",
        id: "list{scope}{kind}",
        description: "list or watch objects of kind {kind}",
        action: "list",
        writes: false,
        query: Query::List,
        body: Body::None,
        answers: OK_LIST,
    },
    Operation {
        place: Place::Collection,
        method: "post",
        id: "create{scope}{kind}",
        description: "create a {kind}",
        action: "post",
        writes: true,
        query: Query::Write,
        body: Body::Object,
        answers: &[
            ("200", "OK", Answer::Object),
            ("201", "Created", Answer::Object),
        ],
    },
    Operation {
        place: Place::Collection,
        method: "delete",
        id: "deleteCollection{scope}{kind}",
        description: "delete collection of {kind}",
        action: "deletecollection",
        writes: true,
        query: Query::List,
        body: Body::None,
        answers: OK_LIST,
    },
    Operation {
        place: Place::Item,
        method: "get",
        id: "read{scope}{kind}",
        description: "read the specified {kind}",
        action: "get",
        writes: false,
        query: Query::None,
        body: Body::None,
        answers: OK_OBJECT,
    },
    Operation {
        place: Place::Item,
        method: "put",
        id: "replace{scope}{kind}",
        description: "replace the specified {kind}",
        action: "put",
        writes: true,
        query: Query::Write,
        body: Body::Object,
        answers: OK_OBJECT,
    },
    Operation {
        place: Place::Item,
        method: "patch",
        id: "patch{scope}{kind}",
        description: "partially update the specified {kind}",
        action: "patch",
        writes: true,
        query: Query::Write,
        body: Body::Patch,
        answers: OK_OBJECT,
    },
    Operation {
        place: Place::Item,
        method: "delete",
        id: "delete{scope}{kind}",
        description: "delete a {kind}",
        action: "delete",
        writes: true,
        query: Query::Delete,
        body: Body::None,
        answers: &[
            ("200", "OK", Answer::Object),
            ("202", "Accepted", Answer::Status),
        ],
    },
    Operation {
        place: Place::Status,
        method: "get",
        id: "read{scope}{kind}Status",
        description: "read status of the specified {kind}",
        action: "get",
        writes: false,
        query: Query::None,
        body: Body::None,
        answers: OK_OBJECT,
    },
    Operation {
        place: Place::Status,
        method: "put",
        id: "replace{scope}{kind}Status",
        description: "replace status of the specified {kind}",
        action: "put",
        writes: true,
        query: Query::Write,
        body: Body::Object,
        answers: OK_OBJECT,
    },
    Operation {
        place: Place::Status,
        method: "patch",
        id: "patch{scope}{kind}Status",
        description: "partially update status of the specified {kind}",
        action: "patch",
        writes: true,
        query: Query::Write,
        body: Body::Patch,
        answers: OK_OBJECT,
    },
];

/// The list across namespaces of a namespaced kind (`/apis/<group>/<version>/<plural>`).
const LIST_ALL: Operation = Operation {
    place: Place::Collection,
    method: "get",
    id: "list{kind}ForAllNamespaces",
    description: "list or watch objects of kind {kind}",
    action: "list",
    writes: false,
    query: Query::List,
    body: Body::None,
    answers: OK_LIST,
};

/// The operations of `resources`, by path.
pub(super) fn paths(flavor: Flavor, resources: &[ResourceInfo]) -> Map<String, Value> {
    let prefix = schema_prefix();
    let base = format!("/apis/{GROUP_VERSION}");
    let mut paths = Map::new();
    for info in resources {
        let kind = info.kind.as_str();
        let plural = info.plural;
        // kube-apiserver's operation ids: `listNamespacedLlama`, `listPasture`.
        let scope = if info.namespaced { "Namespaced" } else { "" };
        let object = format!("{prefix}.{kind}");
        let list = format!("{prefix}.{kind}List");
        let status = format!("{META}.Status");
        let words = |text: &str| text.replace("{scope}", scope).replace("{kind}", kind);
        let make = |op: &Operation| {
            let params = match op.query {
                Query::None => Vec::new(),
                Query::List => query_params(flavor, LIST_PARAMS),
                Query::Write => query_params(flavor, WRITE_PARAMS),
                Query::Delete => query_params(flavor, &WRITE_PARAMS[..1]),
            };
            let body: Option<(&'static [&'static str], String)> = match op.body {
                Body::None => None,
                Body::Object => Some((&["application/json"], object.clone())),
                Body::Patch => Some((
                    &[
                        "application/json-patch+json",
                        "application/merge-patch+json",
                    ],
                    format!("{META}.Patch"),
                )),
            };
            let answers = op
                .answers
                .iter()
                .map(|&(code, description, answer)| {
                    let schema = match answer {
                        Answer::Object => &object,
                        Answer::List => &list,
                        Answer::Status => &status,
                    };
                    (code, response(flavor, description, schema))
                })
                .collect();
            operation(
                flavor,
                Op {
                    id: words(op.id),
                    description: words(op.description),
                    action: op.action,
                    kind,
                    params,
                    body,
                    responses: answers,
                },
            )
        };
        if info.namespaced {
            paths.insert(
                format!("{base}/{plural}"),
                json!({ LIST_ALL.method: make(&LIST_ALL) }),
            );
        }
        let (mut collection, mut item, mut status_ops) = (Map::new(), Map::new(), Map::new());
        for op in OPERATIONS {
            if (op.writes && !info.writable) || (op.place == Place::Status && !info.status) {
                continue;
            }
            let place = match op.place {
                Place::Collection => &mut collection,
                Place::Item => &mut item,
                Place::Status => &mut status_ops,
            };
            place.insert(op.method.into(), make(op));
        }
        let name_param = path_param(flavor, "name", &format!("name of the {kind}"));
        let (collection_path, object_params) = if info.namespaced {
            let namespace = path_param(
                flavor,
                "namespace",
                "object name and auth scope, such as for teams and projects",
            );
            collection.insert("parameters".into(), json!([namespace]));
            (
                format!("{base}/namespaces/{{namespace}}/{plural}"),
                json!([name_param, namespace]),
            )
        } else {
            (format!("{base}/{plural}"), json!([name_param]))
        };
        item.insert("parameters".into(), object_params.clone());
        if info.status {
            status_ops.insert("parameters".into(), object_params);
            paths.insert(
                format!("{collection_path}/{{name}}/status"),
                Value::Object(status_ops),
            );
        }
        paths.insert(format!("{collection_path}/{{name}}"), Value::Object(item));
        paths.insert(collection_path, Value::Object(collection));
    }
    paths
}
