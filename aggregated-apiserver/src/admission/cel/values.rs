//! JSON and CEL values: objects as CEL reads them (numbers typed by the kind's schema, maps
//! converted lazily), the inputs of a scope, and results back as JSON, bounded.

use std::{collections::HashMap, sync::Arc};

use cel::common::{types::CelString, value::Val};
use serde_json::Value;

use super::OBJECT;

/// A JSON value as CEL reads Kubernetes objects: integers as `int` (JSON has no unsigned
/// numbers; the serde conversion would make positive ones `uint`, which do not mix with
/// `int` literals), other numbers as `double`. Objects are shallow (their depth is bounded
/// where they are written), so this recursion is too.
pub fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            let map: HashMap<cel::objects::Key, cel::Value> = fields
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
    }
}

/// Where a kind's schema says `type: number`: CEL reads those as `double` whatever their JSON
/// looks like (as kube-apiserver types an object by its schema), so `object.spec.height * 2.0`
/// works on a height stored as `1`.
#[derive(Debug, Default)]
pub struct Numbers {
    here: bool,
    fields: HashMap<String, Numbers>,
    /// A list's items, or a map's values (`additionalProperties`).
    items: Option<Box<Numbers>>,
}

/// How deep [`Numbers::from_openapi`] follows a schema (recursive schemas stop there).
const MAX_SCHEMA_DEPTH: usize = 24;

impl Numbers {
    /// From an OpenAPI v3 schema (`$ref`s into `components`, `allOf` wrappers followed).
    pub fn from_openapi(schema: &Value, components: &serde_json::Map<String, Value>) -> Self {
        Self::build(schema, components, 0)
    }

    fn build(schema: &Value, components: &serde_json::Map<String, Value>, depth: usize) -> Self {
        let mut numbers = Numbers::default();
        if depth > MAX_SCHEMA_DEPTH {
            return numbers;
        }
        let mut schema = schema;
        for _ in 0..MAX_SCHEMA_DEPTH {
            if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
                match target
                    .rsplit('/')
                    .next()
                    .and_then(|name| components.get(name))
                {
                    Some(found) => schema = found,
                    None => return numbers,
                }
            } else if let Some(first) = schema.pointer("/allOf/0") {
                schema = first;
            } else {
                break;
            }
        }
        numbers.here = schema.get("type").and_then(Value::as_str) == Some("number");
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                let field = Self::build(property, components, depth + 1);
                if field.matters() {
                    numbers.fields.insert(name.clone(), field);
                }
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(inner) = schema.get(key).filter(|v| v.is_object()) {
                let items = Self::build(inner, components, depth + 1);
                if items.matters() {
                    numbers.items = Some(Box::new(items));
                }
            }
        }
        numbers
    }

    /// Whether there is any number here or below.
    fn matters(&self) -> bool {
        self.here || !self.fields.is_empty() || self.items.is_some()
    }
}

/// [`to_cel`], numbers where `numbers` says so read as `double`.
pub fn to_cel_typed(value: &Value, numbers: Option<&Numbers>) -> cel::Value {
    let Some(numbers) = numbers else {
        return to_cel(value);
    };
    match value {
        Value::Number(n) if numbers.here => cel::Value::Float(n.as_f64().unwrap_or_default()),
        Value::Array(items) => cel::Value::List(Arc::new(
            items
                .iter()
                .map(|item| to_cel_typed(item, numbers.items.as_deref()))
                .collect(),
        )),
        Value::Object(fields) => {
            let map: HashMap<cel::objects::Key, cel::Value> = fields
                .iter()
                .map(|(k, v)| {
                    let inner = numbers.fields.get(k).or(numbers.items.as_deref());
                    (
                        cel::objects::Key::String(Arc::new(k.clone())),
                        to_cel_typed(v, inner),
                    )
                })
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
        other => to_cel(other),
    }
}

/// One variable of a [`super::Scope`]: a JSON value, numbers typed by `numbers` when given, or a CEL
/// value of its own (`authorizer`).
pub struct Input {
    /// Its name (`object`, `request`...).
    pub name: &'static str,
    /// Its value, shared: the object a write admits is read by every policy's scope.
    pub value: Arc<Value>,
    /// Where its schema has numbers.
    pub numbers: Option<Arc<Numbers>>,
    /// A value that is not JSON (`value` is then null).
    pub native: Option<cel::Value>,
}

impl Input {
    /// A variable whose value is not JSON.
    pub fn native(name: &'static str, value: cel::Value) -> Self {
        Self {
            name,
            value: Arc::new(Value::Null),
            numbers: None,
            native: Some(value),
        }
    }
}

/// A JSON value as CEL's own value, borrowing its strings; objects are [`LazyMap`]s.
/// Recursive: callers bound the depth (see [`super::within`]).
pub(super) fn to_val<'v>(value: &'v Value, numbers: Option<&'v Numbers>) -> Box<dyn Val + 'v> {
    use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelNull, CelUInt};
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) if numbers.is_some_and(|n| n.here) => {
            Box::new(CelDouble::from(n.as_f64().unwrap_or_default()))
        }
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or_default())),
        },
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => {
            let inner = numbers.and_then(|n| n.items.as_deref());
            let items: Vec<Box<dyn Val + 'v>> =
                items.iter().map(|item| to_val(item, inner)).collect();
            Box::new(CelList::from(items))
        }
        Value::Object(fields) => Box::new(LazyMap {
            fields,
            numbers,
            full: std::sync::OnceLock::new(),
        }),
    }
}

/// A JSON object as a CEL map converted as it is read, one level at a time (as kube-apiserver
/// wraps unstructured objects): the first use of the map converts its own entries, its nested
/// objects staying lazy, so a policy reading `object.spec.weight` converts `object` and
/// `spec` and not `metadata.managedFields`. Every use goes through that map, a built-in one,
/// so lazy maps behave as maps everywhere (equality, iteration, `in`, results).
#[derive(Debug)]
struct LazyMap<'v> {
    fields: &'v serde_json::Map<String, Value>,
    numbers: Option<&'v Numbers>,
    full: std::sync::OnceLock<cel::common::types::CelMap<'v>>,
}

impl<'v> LazyMap<'v> {
    fn full(&self) -> &cel::common::types::CelMap<'v> {
        self.full.get_or_init(|| self.convert())
    }

    fn convert(&self) -> cel::common::types::CelMap<'v> {
        use cel::common::types::{CelMap, CelMapKey};
        let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> =
            HashMap::with_capacity(self.fields.len());
        for (key, value) in self.fields {
            let inner = self
                .numbers
                .and_then(|n| n.fields.get(key).or(n.items.as_deref()));
            map.insert(CelMapKey::from(key.as_str()), to_val(value, inner));
        }
        CelMap::from(map)
    }
}

impl<'v> Val for LazyMap<'v> {
    fn get_type(&self) -> &cel::common::types::Type {
        Self::cel_type()
    }

    fn cel_type() -> &'static cel::common::types::Type {
        &cel::common::types::MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn cel::common::traits::Container> {
        self.full().as_container()
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn cel::common::traits::Indexer + 'w)>
    where
        Self: 'w,
    {
        self.full().as_indexer()
    }

    fn into_indexer<'w>(self: Box<Self>) -> Option<Box<dyn cel::common::traits::Indexer + 'w>>
    where
        Self: 'w,
    {
        let mut lazy = *self;
        let full = lazy.full.take().unwrap_or_else(|| lazy.convert());
        Box::new(full).into_indexer()
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn cel::common::traits::Iterable + 'w)>
    where
        Self: 'w,
    {
        self.full().as_iterable()
    }

    fn as_sizer(&self) -> Option<&dyn cel::common::traits::Sizer> {
        self.full().as_sizer()
    }

    fn as_zeroer(&self) -> Option<&dyn cel::common::traits::Zeroer> {
        self.full().as_zeroer()
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.full().equals(other)
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(LazyMap {
            fields: self.fields,
            numbers: self.numbers,
            full: std::sync::OnceLock::new(),
        })
    }

    fn as_builtin<'b, 'w>(&'b self) -> cel::common::value::BuiltinRef<'b, 'w>
    where
        Self: 'w,
    {
        cel::common::value::BuiltinRef::Map(self.full())
    }

    fn into_builtin<'w>(self: Box<Self>) -> Option<cel::common::value::Builtin<'w>>
    where
        Self: 'w,
    {
        let mut lazy = *self;
        let full = lazy.full.take().unwrap_or_else(|| lazy.convert());
        Some(cel::common::value::Builtin::Map(full))
    }
}

/// Whether `value` nests at most `limit` levels: recursive, but never deeper than `limit`.
pub(super) fn shallow(value: &Value, limit: usize) -> bool {
    match value {
        Value::Array(items) => limit > 0 && items.iter().all(|v| shallow(v, limit - 1)),
        Value::Object(fields) => limit > 0 && fields.values().all(|v| shallow(v, limit - 1)),
        _ => true,
    }
}

/// A CEL value as JSON (what a message expression or a bool comes back as; an apply
/// configuration or JSON patch a mutation builds). The `Object` types must be named for
/// their place (`Object.spec` under `spec`), as kube-apiserver checks them. Values are as
/// deep as their expression nests, which is bounded: this recursion is too.
pub(super) fn to_json(value: &cel::Value) -> Result<Value, String> {
    let mut budget = MAX_RESULT_NODES;
    to_json_at(value, None, &mut budget, 0)
}

/// The most a policy's variable may hold, about (8 bytes a value, and its strings' bytes):
/// variables built from variables could otherwise double at each step.
const MAX_VARIABLE_BYTES: usize = 8 << 20;

/// Whether `value` holds at most `MAX_VARIABLE_BYTES`; the walk stops at the bound.
pub fn within_variable_bound(value: &cel::Value) -> bool {
    fn walk(value: &cel::Value, left: &mut usize, depth: usize) -> bool {
        let own = match value {
            cel::Value::String(s) => 8 + s.len(),
            cel::Value::Bytes(b) => 8 + b.len(),
            _ => 8,
        };
        if own > *left || depth > MAX_RESULT_DEPTH {
            return false;
        }
        *left -= own;
        match value {
            cel::Value::List(items) => items.iter().all(|item| walk(item, left, depth + 1)),
            cel::Value::Map(map) => map.map.values().all(|item| walk(item, left, depth + 1)),
            _ => true,
        }
    }
    let mut left = MAX_VARIABLE_BYTES;
    walk(value, &mut left, 0)
}

/// The most values a result may hold, and how deep it may nest (CEL values share their
/// parts, so a small expression can describe a result too large to write out).
const MAX_RESULT_NODES: usize = 100_000;
const MAX_RESULT_DEPTH: usize = 64;

/// `path`: the type name an `Object` struct here must have (None: outside any).
fn to_json_at(
    value: &cel::Value,
    path: Option<&str>,
    budget: &mut usize,
    depth: usize,
) -> Result<Value, String> {
    if *budget == 0 || depth > MAX_RESULT_DEPTH {
        return Err(format!(
            "the result holds more than {MAX_RESULT_NODES} values or nests deeper than {MAX_RESULT_DEPTH} levels"
        ));
    }
    *budget -= 1;
    Ok(match value {
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::Null => Value::Null,
        cel::Value::List(items) => Value::Array(
            items
                .iter()
                .map(|item| to_json_at(item, path, budget, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        cel::Value::Map(map) => Value::Object(
            map.map
                .iter()
                .map(|(key, value)| {
                    let key = match key {
                        cel::objects::Key::String(s) => s.to_string(),
                        cel::objects::Key::Int(i) => i.to_string(),
                        cel::objects::Key::Uint(u) => u.to_string(),
                        cel::objects::Key::Bool(b) => b.to_string(),
                    };
                    Ok((key, to_json_at(value, path, budget, depth + 1)?))
                })
                .collect::<Result<_, String>>()?,
        ),
        cel::Value::Struct(s) => {
            let name = s.name();
            let own = if name == OBJECT || name.starts_with("Object.") {
                let expected = path.unwrap_or(name);
                if name != expected {
                    return Err(format!(
                        "type mismatch: unexpected type name {name:?}, expected {expected:?}, which matches field name path from root Object type"
                    ));
                }
                Some(name)
            } else {
                None
            };
            let mut fields = serde_json::Map::new();
            for (field, value) in s.field_values() {
                let value = cel::Value::try_from(value.as_ref()).map_err(|e| e.to_string())?;
                let path = own.map(|own| format!("{own}.{field}"));
                fields.insert(
                    field,
                    to_json_at(&value, path.as_deref(), budget, depth + 1)?,
                );
            }
            Value::Object(fields)
        }
        other => Value::String(format!("{other:?}")),
    })
}
