//! The kinds' schemas: schemars' for their spec and status, wrapped as kube-openapi wraps a
//! kind (apiVersion, kind, metadata; a `<Kind>List`), with ObjectMeta's merge keys.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta, ObjectMeta, Status};
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

use super::{Flavor, META};
use crate::resource::{ResourceInfo, group_of};

/// `com.example.zoo.v1alpha`: kube-openapi names a group version's schemas by the reversed
/// group and the version.
pub(crate) fn schema_prefix(group: &str, version: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    format!("{}.{version}", parts.join("."))
}

fn gvk(group: &str, kind: &str, version: &str) -> Value {
    json!([{ "group": group, "kind": kind, "version": version }])
}

/// One kind's schema: a `$ref` to it, and the components it refers to (what field
/// management and CEL's typing read).
pub(crate) fn kind_schema(info: &ResourceInfo) -> (Value, Map<String, Value>) {
    let components = schemas(info.version, std::slice::from_ref(info));
    let root = json!({
        "$ref": format!("#/components/schemas/{}.{}", schema_prefix(info.group, info.version), info.kind)
    });
    (root, components)
}

/// All schemas of the group version `version` (`resources` are at it), v3-style refs.
pub(crate) fn schemas(version: &str, resources: &[ResourceInfo]) -> Map<String, Value> {
    let mut generator = SchemaSettings::openapi3().into_generator();
    let prefix = schema_prefix(group_of(resources), version);
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
                "x-kubernetes-group-version-kind": gvk(info.group, &info.kind, version),
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
                "x-kubernetes-group-version-kind": gvk(info.group, &format!("{}List", info.kind), version),
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

pub(super) const V3_REFS: &str = "#/components/schemas/";

/// Rewrites every `$ref` in `value` that `rename` gives a new target.
pub(super) fn rewrite_refs(value: &mut Value, rename: &dyn Fn(&str) -> Option<String>) {
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
