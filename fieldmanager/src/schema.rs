//! An SMD-like schema (structured-merge-diff `schema/elements.go`) and its
//! construction from OpenAPI v3 (kube-openapi `pkg/schemaconv`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::Error;

/// Name of SMD's atomic untyped type (`__untyped_atomic_`): scalars, lists
/// and maps, all atomic.
pub(crate) const UNTYPED_ATOMIC: &str = "__untyped_atomic_";
/// Name of SMD's deduced type (`__untyped_deduced_`): scalars, atomic
/// lists, granular maps of deduced values.
pub(crate) const UNTYPED_DEDUCED: &str = "__untyped_deduced_";

const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";
const RAW_EXTENSION: &str = "io.k8s.apimachinery.pkg.runtime.RawExtension";

/// Scalar kinds, as SMD distinguishes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScalarType {
    /// integer or number.
    Numeric,
    /// string (no or byte format).
    String,
    /// boolean.
    Boolean,
    /// any scalar (int-or-string, date-time, unknown formats, untyped).
    Untyped,
}

/// How the items of a map or list relate for merging and ownership.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ElementRelationship {
    /// Items are owned and merged individually (maps; SMD's default "").
    Separable,
    /// The whole value is one leaf: replaced whole, owned whole.
    Atomic,
    /// List items are identified by keys (list-type map) or value (set).
    Associative,
}

/// A struct field: its type and default (used for missing list-map keys).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct StructField {
    /// The field's type.
    pub(crate) ty: TypeRef,
    /// The OpenAPI `default`, if any.
    pub(crate) default: Option<Value>,
}

/// A map: named fields (a struct) and/or an element type (a granular map).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MapType {
    /// Declared fields.
    pub(crate) fields: BTreeMap<String, StructField>,
    /// Type of undeclared keys; `None` makes undeclared keys an error.
    pub(crate) element_type: Option<TypeRef>,
    /// Separable (default) or atomic (`x-kubernetes-map-type: atomic`).
    pub(crate) element_relationship: ElementRelationship,
}

/// A list.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ListType {
    /// Item type.
    pub(crate) element_type: TypeRef,
    /// Atomic (default) or associative (set / map).
    pub(crate) element_relationship: ElementRelationship,
    /// `x-kubernetes-list-map-keys`; empty for sets.
    pub(crate) keys: Vec<String>,
}

/// A type: any combination of scalar, list and map (several only for
/// untyped values, the value's shape picks one).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Atom {
    /// Scalar branch.
    pub(crate) scalar: Option<ScalarType>,
    /// List branch.
    pub(crate) list: Option<ListType>,
    /// Map branch.
    pub(crate) map: Option<MapType>,
}

/// A reference to a type: a named type (optionally overriding its map or
/// list relationship) or an inlined one.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum TypeRef {
    /// A type registered in the [`Schema`] by name.
    Named {
        /// Type name.
        name: String,
        /// Relationship override (`x-kubernetes-map-type` next to `$ref`).
        relationship: Option<ElementRelationship>,
    },
    /// An anonymous type.
    Inlined(Box<Atom>),
}

/// A resolved type: borrowed branches plus the effective relationships.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Resolved<'a> {
    /// Scalar branch.
    pub(crate) scalar: Option<ScalarType>,
    /// List branch.
    pub(crate) list: Option<&'a ListType>,
    /// Map branch.
    pub(crate) map: Option<&'a MapType>,
    pub(crate) list_rel: Option<ElementRelationship>,
    pub(crate) map_rel: Option<ElementRelationship>,
}

impl Resolved<'_> {
    /// The map's effective relationship (override or declared).
    pub(crate) fn map_relationship(&self) -> ElementRelationship {
        self.map_rel
            .or(self.map.map(|m| m.element_relationship))
            .unwrap_or(ElementRelationship::Separable)
    }

    /// The list's effective relationship (override or declared).
    pub(crate) fn list_relationship(&self) -> ElementRelationship {
        self.list_rel
            .or(self.list.map(|l| l.element_relationship))
            .unwrap_or(ElementRelationship::Atomic)
    }
}

impl Atom {
    /// A scalar type.
    pub(crate) fn scalar(t: ScalarType) -> Self {
        Atom {
            scalar: Some(t),
            ..Atom::default()
        }
    }

    /// A map type.
    pub(crate) fn map(m: MapType) -> Self {
        Atom {
            map: Some(m),
            ..Atom::default()
        }
    }

    /// A list type.
    pub(crate) fn list(l: ListType) -> Self {
        Atom {
            list: Some(l),
            ..Atom::default()
        }
    }
}

impl ListType {
    /// An atomic list (the default list type).
    pub(crate) fn atomic(elem: TypeRef) -> Self {
        ListType {
            element_type: elem,
            element_relationship: ElementRelationship::Atomic,
            keys: vec![],
        }
    }
}

impl TypeRef {
    /// Reference to a named type.
    pub(crate) fn named(name: &str) -> Self {
        TypeRef::Named {
            name: name.to_string(),
            relationship: None,
        }
    }

    /// An inlined type.
    pub(crate) fn inline(atom: Atom) -> Self {
        TypeRef::Inlined(Box::new(atom))
    }

    /// The deduced untyped type (preserve-unknown-fields).
    pub(crate) fn deduced() -> Self {
        TypeRef::named(UNTYPED_DEDUCED)
    }

    /// The atomic untyped type.
    pub(crate) fn untyped_atomic() -> Self {
        TypeRef::named(UNTYPED_ATOMIC)
    }
}

/// A set of named types plus the root type of the objects it describes.
#[derive(Debug, Clone, PartialEq)]
pub struct Schema {
    types: BTreeMap<String, Atom>,
    root: TypeRef,
}

fn untyped_atom(map_rel: ElementRelationship, map_elem: &str) -> Atom {
    Atom {
        scalar: Some(ScalarType::Untyped),
        list: Some(ListType::atomic(TypeRef::untyped_atomic())),
        map: Some(MapType {
            fields: BTreeMap::new(),
            element_type: Some(TypeRef::named(map_elem)),
            element_relationship: map_rel,
        }),
    }
}

impl Schema {
    /// A schema whose objects have type `root`; the two untyped built-ins
    /// are always registered.
    pub(crate) fn new(root: TypeRef) -> Self {
        let mut types = BTreeMap::new();
        types.insert(
            UNTYPED_ATOMIC.to_string(),
            untyped_atom(ElementRelationship::Atomic, UNTYPED_ATOMIC),
        );
        types.insert(
            UNTYPED_DEDUCED.to_string(),
            untyped_atom(ElementRelationship::Separable, UNTYPED_DEDUCED),
        );
        Schema { types, root }
    }

    /// The root type.
    pub(crate) fn root(&self) -> &TypeRef {
        &self.root
    }

    /// SMD `Schema.Resolve`: looks up named types and applies a
    /// relationship override (to the map branch, else the list branch;
    /// overriding a scalar is an error).
    pub(crate) fn resolve<'a>(&'a self, tr: &'a TypeRef) -> Result<Resolved<'a>, String> {
        let (atom, rel) = match tr {
            TypeRef::Inlined(a) => (a.as_ref(), None),
            TypeRef::Named { name, relationship } => match self.types.get(name) {
                Some(a) => (a, *relationship),
                None => return Err(format!("schema error: no type found matching: {name}")),
            },
        };
        let mut r = Resolved {
            scalar: atom.scalar,
            list: atom.list.as_ref(),
            map: atom.map.as_ref(),
            list_rel: None,
            map_rel: None,
        };
        if let Some(rel) = rel {
            if r.map.is_some() {
                r.map_rel = Some(rel);
            } else if r.list.is_some() {
                r.list_rel = Some(rel);
            } else if let TypeRef::Named { name, .. } = tr {
                return Err(format!("schema error: no type found matching: {name}"));
            }
        }
        Ok(r)
    }

    /// Converts an OpenAPI v3 schema as kube-openapi's schemaconv does.
    /// `root` is the object's schema (may be a `$ref`); `components` is
    /// `#/components/schemas`. `$ref`s (also `allOf: [{$ref}]`) become
    /// named types, converted once each, so recursive types terminate.
    /// A schema kube-openapi would refuse (an unknown list or map type,
    /// list-map keys missing, an unresolved `$ref`, ...) is an
    /// [`Error::Internal`] listing what does not convert.
    pub fn from_openapi_v3(root: &Value, components: &Map<String, Value>) -> Result<Schema, Error> {
        let mut c = Converter {
            components,
            types: BTreeMap::new(),
            seen: BTreeSet::new(),
            errors: vec![],
        };
        let root_ref = c.make_ref(root, false);
        if !c.errors.is_empty() {
            return Err(Error::Internal(c.errors.join("\n")));
        }
        let mut s = Schema::new(root_ref);
        for (name, atom) in c.types {
            s.types.insert(name, atom);
        }
        Ok(s)
    }
}

struct Converter<'c> {
    components: &'c Map<String, Value>,
    types: BTreeMap<String, Atom>,
    seen: BTreeSet<String>,
    errors: Vec<String>,
}

fn ext<'v>(m: &'v Value, key: &str) -> Option<&'v Value> {
    m.get(key)
}

impl Converter<'_> {
    fn convert_named(&mut self, name: &str) {
        if !self.seen.insert(name.to_string()) {
            return;
        }
        let atom = if name == QUANTITY {
            Atom::scalar(ScalarType::Untyped)
        } else if name == RAW_EXTENSION {
            untyped_atom(ElementRelationship::Atomic, UNTYPED_ATOMIC)
        } else if let Some(spec) = self.components.get(name) {
            self.visit_spec(spec, false)
        } else {
            self.errors.push(format!("unresolved $ref: {name}"));
            return;
        };
        self.types.insert(name.to_string(), atom);
    }

    fn visit_spec(&mut self, m: &Value, preserve: bool) -> Atom {
        let preserve =
            preserve || ext(m, "x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        let typ = match m.get("type") {
            Some(Value::String(s)) => s.as_str(),
            Some(Value::Array(a)) => a.first().and_then(Value::as_str).unwrap_or(""),
            _ => "",
        };
        match typ {
            "" => Atom {
                scalar: Some(ScalarType::Untyped),
                list: Some(self.parse_list(m, preserve, typ)),
                map: Some(self.parse_object(m, preserve)),
            },
            "object" => Atom::map(self.parse_object(m, preserve)),
            "array" => Atom::list(self.parse_list(m, preserve, typ)),
            "integer" | "number" => Atom::scalar(ScalarType::Numeric),
            "boolean" => Atom::scalar(ScalarType::Boolean),
            "string" => match m.get("format").and_then(Value::as_str).unwrap_or("") {
                "" | "byte" => Atom::scalar(ScalarType::String),
                _ => Atom::scalar(ScalarType::Untyped),
            },
            other => {
                self.errors.push(format!("unrecognized type: '{other}'"));
                Atom::scalar(ScalarType::Untyped)
            }
        }
    }

    fn make_ref(&mut self, spec: &Value, preserve: bool) -> TypeRef {
        let mut refstr = spec.get("$ref").and_then(Value::as_str).unwrap_or("");
        if refstr.is_empty()
            && let Some(Value::Array(all)) = spec.get("allOf")
            && all.len() == 1
        {
            refstr = all[0].get("$ref").and_then(Value::as_str).unwrap_or("");
        }
        let name = refstr.rsplit('/').next().unwrap_or("");
        if !name.is_empty() {
            let name = name.to_string();
            self.convert_named(&name);
            let relationship = self.map_relationship(spec);
            return TypeRef::Named { name, relationship };
        }
        TypeRef::inline(self.visit_spec(spec, preserve))
    }

    fn map_relationship(&mut self, m: &Value) -> Option<ElementRelationship> {
        match ext(m, "x-kubernetes-map-type")? {
            Value::String(s) if s == "atomic" => Some(ElementRelationship::Atomic),
            Value::String(s) if s == "granular" => Some(ElementRelationship::Separable),
            other => {
                self.errors.push(format!(
                    "unknown map type {}",
                    super::path::value_to_string(other)
                ));
                None
            }
        }
    }

    fn parse_object(&mut self, m: &Value, preserve: bool) -> MapType {
        let mut fields = BTreeMap::new();
        let props = m.get("properties").and_then(Value::as_object);
        if let Some(props) = props {
            for (name, member) in props {
                let ty = self.make_ref(member, preserve);
                fields.insert(
                    name.clone(),
                    StructField {
                        ty,
                        default: member.get("default").cloned(),
                    },
                );
            }
        }
        let element_type = match m.get("additionalProperties") {
            None => {
                if preserve || props.is_none_or(|p| p.is_empty()) {
                    Some(TypeRef::deduced())
                } else {
                    None
                }
            }
            Some(Value::Bool(true)) => Some(TypeRef::deduced()),
            Some(Value::Bool(false)) => None,
            Some(s) => Some(self.make_ref(s, preserve)),
        };
        MapType {
            fields,
            element_type,
            element_relationship: self
                .map_relationship(m)
                .unwrap_or(ElementRelationship::Separable),
        }
    }

    fn parse_list(&mut self, m: &Value, preserve: bool, typ: &str) -> ListType {
        let (rel, keys) = self.list_relationship(m);
        let element_type = match m.get("items") {
            Some(Value::Array(_)) => {
                self.errors.push(
                    "structural schema arrays must have exactly one member subtype".to_string(),
                );
                TypeRef::deduced()
            }
            Some(items) => self.make_ref(items, preserve),
            None => {
                if !typ.is_empty() {
                    self.errors
                        .push("`items` must be specified on arrays".to_string());
                }
                TypeRef::untyped_atomic()
            }
        };
        ListType {
            element_type,
            element_relationship: rel,
            keys,
        }
    }

    fn list_relationship(&mut self, m: &Value) -> (ElementRelationship, Vec<String>) {
        use ElementRelationship::{Associative, Atomic};
        let strs = |v: &Value| -> Option<Vec<String>> {
            match v {
                Value::Array(a) => Some(
                    a.iter()
                        .filter_map(|x| x.as_str().map(str::to_string))
                        .collect(),
                ),
                _ => None,
            }
        };
        if let Some(t) = ext(m, "x-kubernetes-list-type") {
            return match t.as_str() {
                Some("atomic") => (Atomic, vec![]),
                Some("set") => (Associative, vec![]),
                Some("map") => match ext(m, "x-kubernetes-list-map-keys") {
                    None => {
                        self.errors.push("missing map keys".to_string());
                        (Associative, vec![])
                    }
                    Some(k) => match strs(k) {
                        Some(keys) => (Associative, keys),
                        None => {
                            self.errors.push(format!("uninterpreted map keys: {k}"));
                            (Associative, vec![])
                        }
                    },
                },
                _ => {
                    self.errors.push(format!(
                        "unknown list type {}",
                        super::path::value_to_string(t)
                    ));
                    (Atomic, vec![])
                }
            };
        }
        if let Some(ps) = ext(m, "x-kubernetes-patch-strategy") {
            return match ps.as_str() {
                Some("merge") | Some("merge,retainKeys") => {
                    match ext(m, "x-kubernetes-patch-merge-key") {
                        Some(Value::String(k)) => (Associative, vec![k.clone()]),
                        Some(other) => {
                            self.errors
                                .push(format!("uninterpreted merge key: {other}"));
                            (Associative, vec![])
                        }
                        None => (Associative, vec![]),
                    }
                }
                Some("retainKeys") => (Atomic, vec![]),
                _ => {
                    self.errors.push(format!(
                        "unknown patch strategy {}",
                        super::path::value_to_string(ps)
                    ));
                    (Atomic, vec![])
                }
            };
        }
        (Atomic, vec![])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openapi_conversion() {
        let components = json!({
            "Meta": {"type": "object", "properties": {
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "finalizers": {"type": "array", "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                "owners": {"type": "array", "items": {"$ref": "#/components/schemas/Owner"},
                           "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["uid"]}
            }},
            "Owner": {"type": "object", "properties": {"uid": {"type": "string"}, "next": {"$ref": "#/components/schemas/Owner"}}},
        });
        let root = json!({"type": "object", "properties": {
            "metadata": {"allOf": [{"$ref": "#/components/schemas/Meta"}], "default": {}},
            "spec": {"type": "object", "x-kubernetes-map-type": "atomic", "properties": {"w": {"type": "number"}}},
            "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
            "io": {"x-kubernetes-int-or-string": true},
        }});
        let s =
            Schema::from_openapi_v3(&root, components.as_object().expect("obj")).expect("schema");
        let r = s.resolve(s.root()).expect("root");
        let m = r.map.expect("map");
        assert!(m.element_type.is_none());
        assert_eq!(m.fields["metadata"].ty, TypeRef::named("Meta"));
        let spec = s.resolve(&m.fields["spec"].ty).expect("spec");
        assert_eq!(spec.map_relationship(), ElementRelationship::Atomic);
        let extra = s.resolve(&m.fields["extra"].ty).expect("extra");
        assert_eq!(
            extra.map.and_then(|m| m.element_type.clone()),
            Some(TypeRef::deduced())
        );
        let io = s.resolve(&m.fields["io"].ty).expect("io");
        assert_eq!(io.scalar, Some(ScalarType::Untyped));
        let meta = s
            .resolve(&m.fields["metadata"].ty)
            .expect("meta")
            .map
            .expect("map");
        let owners = s
            .resolve(&meta.fields["owners"].ty)
            .expect("owners")
            .list
            .expect("list");
        assert_eq!(owners.keys, vec!["uid".to_string()]);
        assert!(s.resolve(&TypeRef::named("Owner")).is_ok());
        let bad = json!({"type": "array", "x-kubernetes-list-type": "bogus", "items": {"type": "string"}});
        assert_eq!(
            Schema::from_openapi_v3(&bad, &Map::new()),
            Err(Error::Internal(r#"unknown list type "bogus""#.into()))
        );
    }
}
