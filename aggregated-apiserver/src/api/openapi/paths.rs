//! The kinds' operations (`paths`), as kube-apiserver publishes a resource's: list and watch,
//! create, read, replace, patch, delete and deletecollection, and the status subresource's.

use serde_json::{Map, Value, json};

use super::{Flavor, META, schemas::schema_prefix};
use crate::resource::{ResourceInfo, group_of};

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
    version: &'a str,
    id: String,
    description: String,
    action: &'static str,
    group: &'a str,
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
        "tags": [format!("{}_{}", operation_id_part(op.group, false), op.version)],
        "x-kubernetes-action": op.action,
        "x-kubernetes-group-version-kind": { "group": op.group, "version": op.version, "kind": op.kind },
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
enum ResponseBody {
    Object,
    List,
    Status,
}

/// One operation of a kind, in kube-apiserver's words: `{scope}` and `{kind}` in its id and
/// description are the kind's (`readNamespacedZebra`, "read the specified Zebra").
struct Operation {
    place: Place,
    method: &'static str,
    id: &'static str,
    description: &'static str,
    action: &'static str,
    query: Query,
    body: Body,
    answers: &'static [(&'static str, &'static str, ResponseBody)],
}

impl Operation {
    /// Served only for a writable kind.
    fn writes(&self) -> bool {
        self.method != "get"
    }
}

/// An [`Operation`], one line of the table.
#[allow(clippy::too_many_arguments)]
const fn op(
    place: Place,
    method: &'static str,
    id: &'static str,
    description: &'static str,
    action: &'static str,
    query: Query,
    body: Body,
    answers: &'static [(&'static str, &'static str, ResponseBody)],
) -> Operation {
    Operation {
        place,
        method,
        id,
        description,
        action,
        query,
        body,
        answers,
    }
}

const OK_OBJECT: &[(&str, &str, ResponseBody)] = &[("200", "OK", ResponseBody::Object)];
const OK_LIST: &[(&str, &str, ResponseBody)] = &[("200", "OK", ResponseBody::List)];
const CREATED: &[(&str, &str, ResponseBody)] = &[
    ("200", "OK", ResponseBody::Object),
    ("201", "Created", ResponseBody::Object),
];
const DELETED: &[(&str, &str, ResponseBody)] = &[
    ("200", "OK", ResponseBody::Object),
    ("202", "Accepted", ResponseBody::Status),
];

/// Every operation of a kind but the list across namespaces. No strategic-merge-patch among
/// the patches: kubectl then computes JSON merge patches.
#[rustfmt::skip]
const OPERATIONS: &[Operation] = &[
    op(Place::Collection, "get", "list{gv}{scope}{kind}", "list or watch objects of kind {kind}", "list", Query::List, Body::None, OK_LIST),
    op(Place::Collection, "post", "create{gv}{scope}{kind}", "create a {kind}", "post", Query::Write, Body::Object, CREATED),
    op(Place::Collection, "delete", "delete{gv}Collection{scope}{kind}", "delete collection of {kind}", "deletecollection", Query::List, Body::None, OK_LIST),
    op(Place::Item, "get", "read{gv}{scope}{kind}", "read the specified {kind}", "get", Query::None, Body::None, OK_OBJECT),
    op(Place::Item, "put", "replace{gv}{scope}{kind}", "replace the specified {kind}", "put", Query::Write, Body::Object, OK_OBJECT),
    op(Place::Item, "patch", "patch{gv}{scope}{kind}", "partially update the specified {kind}", "patch", Query::Write, Body::Patch, OK_OBJECT),
    op(Place::Item, "delete", "delete{gv}{scope}{kind}", "delete a {kind}", "delete", Query::Delete, Body::None, DELETED),
    op(Place::Status, "get", "read{gv}{scope}{kind}Status", "read status of the specified {kind}", "get", Query::None, Body::None, OK_OBJECT),
    op(Place::Status, "put", "replace{gv}{scope}{kind}Status", "replace status of the specified {kind}", "put", Query::Write, Body::Object, OK_OBJECT),
    op(Place::Status, "patch", "patch{gv}{scope}{kind}Status", "partially update status of the specified {kind}", "patch", Query::Write, Body::Patch, OK_OBJECT),
];

/// The list across namespaces of a namespaced kind (`/apis/<group>/<version>/<plural>`).
const LIST_ALL: Operation = op(
    Place::Collection,
    "get",
    "list{gv}{kind}ForAllNamespaces",
    "list or watch objects of kind {kind}",
    "list",
    Query::List,
    Body::None,
    OK_LIST,
);

/// k8s.io/apiserver's `ToValidOperationID`: letters and digits, each part after another
/// character capitalized (and the first one when `capitalize`).
fn operation_id_part(text: &str, capitalize: bool) -> String {
    let mut out = String::with_capacity(text.len());
    let mut upper = capitalize;
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(if upper { c.to_ascii_uppercase() } else { c });
            upper = false;
        } else {
            upper = true;
        }
    }
    out
}

/// The operations of `resources` (all at `version`), by path. Operation ids are
/// kube-apiserver's (`GetOperationIDAndTags`): the verb, the group version, then the rest
/// (`listZooExampleComV1alphaNamespacedZebra`), so that every version's are distinct.
pub(super) fn paths(
    flavor: Flavor,
    version: &str,
    resources: &[ResourceInfo],
) -> Map<String, Value> {
    let group = group_of(resources);
    let prefix = schema_prefix(group, version);
    let base = format!("/apis/{group}/{version}");
    let gv = format!(
        "{}{}",
        operation_id_part(group, true),
        operation_id_part(version, true)
    );
    let mut paths = Map::new();
    for info in resources {
        let kind = info.kind.as_str();
        let plural = info.plural;
        // kube-apiserver's operation ids: `listNamespacedZebra`, `listPasture`.
        let scope = if info.namespaced { "Namespaced" } else { "" };
        let object = format!("{prefix}.{kind}");
        let list = format!("{prefix}.{kind}List");
        let status = format!("{META}.Status");
        let words = |text: &str| {
            text.replace("{gv}", &gv)
                .replace("{scope}", scope)
                .replace("{kind}", kind)
        };
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
                        ResponseBody::Object => &object,
                        ResponseBody::List => &list,
                        ResponseBody::Status => &status,
                    };
                    (code, response(flavor, description, schema))
                })
                .collect();
            operation(
                flavor,
                Op {
                    group,
                    version,
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
            if (op.writes() && !info.writable) || (op.place == Place::Status && !info.status) {
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
