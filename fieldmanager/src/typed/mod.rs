//! Typed operations on JSON values (structured-merge-diff `typed/`):
//! validation and field sets ([`validate`]), comparison ([`compare`]), merge ([`merge`]),
//! item removal and extraction ([`remove`]); here what they share: the errors, and the
//! schema's types resolved against a value.
//!
//! The walkers mirror SMD's closely, including its quirks (e.g. which
//! value wins when lhs and rhs have different shapes), because ownership
//! and conflicts must come out exactly as kube-apiserver computes them.

mod compare;
mod merge;
mod remove;
mod validate;

pub(crate) use compare::compare;
pub use merge::{atomic_paths, merge};
#[cfg(test)]
pub(crate) use remove::extract_items;
pub(crate) use remove::remove_items;
pub(crate) use validate::to_field_set;
pub use validate::validate;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde_json::{Map, Value};

use super::path::{PathElement, values_equal};
use super::schema::{
    ElementRelationship, ListType, MapType, Resolved, ScalarType, Schema, TypeRef,
};
use super::set::FieldSet;

/// One schema violation, with the SMD path string where it occurred.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ValidationError {
    /// Path string (e.g. `.spec.weight`), empty at the root.
    pub(crate) path: String,
    /// Message.
    pub(crate) message: String,
}

/// All violations found; formatted like SMD's `ValidationErrors.Error()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub(crate) Vec<ValidationError>);

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

impl std::error::Error for ValidationErrors {}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.len() == 1 {
            return write!(f, "{}", self.0[0]);
        }
        write!(f, "errors:")?;
        for e in &self.0 {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

type Errs = Vec<ValidationError>;

fn errorf(msg: String) -> Errs {
    vec![ValidationError {
        path: String::new(),
        message: msg,
    }]
}

fn with_prefix(mut errs: Errs, prefix: &str) -> Errs {
    for e in &mut errs {
        e.path = format!("{prefix}{}", e.path);
    }
    errs
}

fn into_result(errs: Errs) -> Result<(), ValidationErrors> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errs))
    }
}

/// The result of [`compare`]: no path is in more than one set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Comparison {
    /// Paths only in the new value.
    pub(crate) added: FieldSet,
    /// Paths in both with different values.
    pub(crate) modified: FieldSet,
    /// Paths only in the old value.
    pub(crate) removed: FieldSet,
}

impl Comparison {
    /// SMD `ExcludeFields`: drops `fields` and everything below them.
    pub(crate) fn exclude_fields(&mut self, fields: &FieldSet) {
        if fields.is_empty() {
            return;
        }
        self.added = self.added.recursive_difference(fields);
        self.modified = self.modified.recursive_difference(fields);
        self.removed = self.removed.recursive_difference(fields);
    }
}

/// Which branch of a type applies to a value (SMD `deduceAtom` +
/// `handleAtom`).
#[derive(Clone, Copy)]
enum Kind<'a> {
    Scalar(ScalarType),
    List(&'a ListType, ElementRelationship),
    Map(&'a MapType, ElementRelationship),
}

/// SMD `deduceAtom`: keep only the branch matching the value's shape, if
/// the type has it; otherwise keep the whole type.
fn deduce<'a>(r: Resolved<'a>, v: Option<&Value>) -> Resolved<'a> {
    let only = |s: bool, l: bool, m: bool| Resolved {
        scalar: if s { r.scalar } else { None },
        list: if l { r.list } else { None },
        map: if m { r.map } else { None },
        ..r
    };
    match v {
        Some(Value::Bool(_) | Value::Number(_) | Value::String(_)) if r.scalar.is_some() => {
            only(true, false, false)
        }
        Some(Value::Array(_)) if r.list.is_some() => only(false, true, false),
        Some(Value::Object(_)) if r.map.is_some() => only(false, false, true),
        _ => r,
    }
}

fn same_atom(a: &Resolved<'_>, b: &Resolved<'_>) -> bool {
    a.scalar == b.scalar
        && match (a.list, b.list) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            (None, None) => true,
            _ => false,
        }
        && match (a.map, b.map) {
            (Some(x), Some(y)) => std::ptr::eq(x, y),
            (None, None) => true,
            _ => false,
        }
}

/// SMD `handleAtom`: map first, then scalar, then list.
fn handle<'a>(r: Resolved<'a>, tr: &TypeRef) -> Result<Kind<'a>, Errs> {
    if let Some(m) = r.map {
        return Ok(Kind::Map(m, r.map_relationship()));
    }
    if let Some(s) = r.scalar {
        return Ok(Kind::Scalar(s));
    }
    if let Some(l) = r.list {
        return Ok(Kind::List(l, r.list_relationship()));
    }
    let name = match tr {
        TypeRef::Named { name, .. } => format!("named type: {name}"),
        TypeRef::Inlined(_) => "inlined".to_string(),
    };
    Err(errorf(format!("schema error: invalid atom: {name}")))
}

fn resolve_kind<'a>(
    schema: &'a Schema,
    tr: &'a TypeRef,
    v: Option<&Value>,
) -> Result<Kind<'a>, Errs> {
    let r = schema.resolve(tr).map_err(errorf)?;
    handle(deduce(r, v), tr)
}

fn field_type<'a>(m: &'a MapType, key: &str) -> Option<&'a TypeRef> {
    m.fields.get(key).map(|f| &f.ty).or(m.element_type.as_ref())
}

/// Go's `%v` of a value, used in SMD error messages.
fn go_v(v: &Value) -> String {
    match v {
        Value::Null => "<nil>".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => format!("[{}]", a.iter().map(go_v).collect::<Vec<_>>().join(" ")),
        Value::Object(m) => format!(
            "map[{}]",
            m.iter()
                .map(|(k, v)| format!("{k}:{}", go_v(v)))
                .collect::<Vec<_>>()
                .join(" ")
        ),
        other => super::path::value_to_string(other),
    }
}

fn go_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "<nil>",
        Value::Bool(_) => "bool",
        Value::Number(n) if n.is_f64() => "float64",
        Value::Number(_) => "int64",
        Value::String(_) => "string",
        Value::Array(_) => "[]interface {}",
        Value::Object(_) => "map[string]interface {}",
    }
}

fn validate_scalar(t: ScalarType, v: Option<&Value>, prefix: &str) -> Errs {
    let Some(v) = v else { return vec![] };
    let ok = matches!(
        (t, v),
        (_, Value::Null)
            | (ScalarType::Numeric, Value::Number(_))
            | (ScalarType::String, Value::String(_))
            | (ScalarType::Boolean, Value::Bool(_))
            | (
                ScalarType::Untyped,
                Value::Number(_) | Value::String(_) | Value::Bool(_)
            )
    );
    if ok {
        return vec![];
    }
    let msg = match t {
        ScalarType::Numeric => format!(
            "{prefix}expected numeric (int or float), got {}",
            go_type(v)
        ),
        ScalarType::String => format!(
            "{prefix}expected string, got &value.valueUnstructured{{Value:{}}}",
            go_v(v)
        ),
        ScalarType::Boolean => format!("{prefix}expected boolean, got &{{{}}}", go_v(v)),
        ScalarType::Untyped => format!("{prefix}expected any scalar, got &{{{}}}", go_v(v)),
    };
    errorf(msg)
}

/// SMD `listItemToPathElement`: the key (list-map), value (set) of an item.
pub(crate) fn list_item_pe(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    child: &Value,
) -> Result<PathElement, String> {
    if rel != ElementRelationship::Associative {
        return Err("invalid indexing of non-associative list".to_string());
    }
    if !l.keys.is_empty() {
        let m = match child {
            Value::Null => {
                return Err("associative list with keys may not have a null element".to_string());
            }
            Value::Object(m) => m,
            _ => return Err("associative list with keys may not have non-map elements".to_string()),
        };
        let mut fields = Vec::new();
        for k in &l.keys {
            if let Some(v) = m.get(k) {
                fields.push((k.clone(), v.clone()));
                continue;
            }
            let elem = schema.resolve(&l.element_type).map_err(|_| {
                format!("couldn't find default value for {k}: invalid elementType for list")
            })?;
            let Some(em) = elem.map else {
                return Err(format!(
                    "couldn't find default value for {k}: associative list may not have non-map types"
                ));
            };
            if let Some(d) = em.fields.get(k).and_then(|f| f.default.clone()) {
                fields.push((k.clone(), d));
            }
        }
        if fields.is_empty() {
            let keys: Vec<String> = l.keys.iter().map(|k| super::gojson::quote(k)).collect();
            return Err(format!(
                "associative list with keys has an element that omits all key fields [{}] (and doesn't have default values for any key fields)",
                keys.join(" ")
            ));
        }
        return Ok(PathElement::key(fields));
    }
    match child {
        Value::Object(_) => {
            Err("associative list without keys has an element that's a map type".to_string())
        }
        Value::Array(_) => {
            Err("not supported: associative list with lists as elements".to_string())
        }
        Value::Null => {
            Err("associative list without keys has an element that's an explicit null".to_string())
        }
        v => Ok(PathElement::Value(v.clone())),
    }
}

fn union_keys<'a>(
    a: Option<&'a Map<String, Value>>,
    b: Option<&'a Map<String, Value>>,
) -> Vec<&'a String> {
    let mut keys: BTreeSet<&String> = BTreeSet::new();
    keys.extend(a.into_iter().flat_map(|m| m.keys()));
    keys.extend(b.into_iter().flat_map(|m| m.keys()));
    keys.into_iter().collect()
}
