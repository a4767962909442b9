//! Typed operations on JSON values (structured-merge-diff `typed/`):
//! validation, field sets, comparison, merge, item removal/extraction.
//!
//! The walkers mirror SMD's closely, including its quirks (e.g. which
//! value wins when lhs and rhs have different shapes), because ownership
//! and conflicts must come out exactly as kube-apiserver computes them.

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

// ---------------------------------------------------------------- validate

/// SMD `TypedValue.Validate`: every value must fit the schema; duplicate
/// set/list-map items are errors unless `allow_duplicates` (live objects
/// are validated with duplicates allowed, applied configs without).
pub fn validate(
    schema: &Schema,
    v: &Value,
    allow_duplicates: bool,
) -> Result<(), ValidationErrors> {
    into_result(validate_at(schema, schema.root(), v, allow_duplicates))
}

fn validate_at(schema: &Schema, tr: &TypeRef, v: &Value, dups: bool) -> Errs {
    let kind = match resolve_kind(schema, tr, Some(v)) {
        Ok(k) => k,
        Err(e) => return e,
    };
    match kind {
        Kind::Scalar(t) => validate_scalar(t, Some(v), ""),
        Kind::List(l, rel) => {
            let items = match v {
                Value::Null => return vec![],
                Value::Array(a) => a,
                other => return errorf(format!("expected list, got &{{{}}}", go_v(other))),
            };
            let mut errs = vec![];
            let mut seen = BTreeSet::new();
            for (i, child) in items.iter().enumerate() {
                let pe = if rel != ElementRelationship::Associative {
                    PathElement::Index(i as i64)
                } else {
                    match list_item_pe(schema, l, rel, child) {
                        Ok(pe) => pe,
                        Err(e) => {
                            errs.extend(errorf(format!("element {i}: {e}")));
                            return errs;
                        }
                    }
                };
                if rel == ElementRelationship::Associative {
                    if seen.contains(&pe) && !dups {
                        errs.extend(errorf(format!("duplicate entries for key {pe}")));
                    }
                    seen.insert(pe.clone());
                }
                errs.extend(with_prefix(
                    validate_at(schema, &l.element_type, child, dups),
                    &pe.to_string(),
                ));
            }
            errs
        }
        Kind::Map(m, _) => {
            let obj = match v {
                Value::Null => return vec![],
                Value::Object(o) => o,
                other => return errorf(format!("expected map, got &{{{}}}", go_v(other))),
            };
            let mut errs = vec![];
            for (k, child) in obj {
                let prefix = format!(".{k}");
                let Some(ft) = field_type(m, k) else {
                    errs.extend(with_prefix(
                        errorf("field not declared in schema".to_string()),
                        &prefix,
                    ));
                    break;
                };
                errs.extend(with_prefix(validate_at(schema, ft, child, dups), &prefix));
            }
            errs
        }
    }
}

// ------------------------------------------------------------ to_field_set

/// SMD `ToFieldSet`: every leaf, every list item and every map entry that
/// is not a declared struct field (granular map keys, null or empty
/// values). Struct fields holding non-empty maps are not members.
pub(crate) fn to_field_set(schema: &Schema, v: &Value) -> Result<FieldSet, ValidationErrors> {
    let mut set = FieldSet::new();
    let mut path = vec![];
    let errs = fs_walk(schema, schema.root(), v, &mut path, &mut set);
    into_result(errs).map(|_| set)
}

fn fs_walk(
    schema: &Schema,
    tr: &TypeRef,
    v: &Value,
    path: &mut Vec<PathElement>,
    set: &mut FieldSet,
) -> Errs {
    let kind = match resolve_kind(schema, tr, Some(v)) {
        Ok(k) => k,
        Err(e) => return e,
    };
    let mut errs = vec![];
    match kind {
        Kind::Scalar(_) => set.insert(path),
        Kind::List(l, rel) => {
            if rel == ElementRelationship::Atomic {
                set.insert(path);
                return errs;
            }
            let Value::Array(items) = v else { return errs };
            let pes: Vec<Option<PathElement>> = items
                .iter()
                .map(|c| list_item_pe(schema, l, rel, c).ok())
                .collect();
            let mut seen = BTreeSet::new();
            let mut dups = BTreeSet::new();
            for pe in pes.iter().flatten() {
                if !seen.insert(pe.clone()) && dups.insert(pe.clone()) {
                    path.push(pe.clone());
                    set.insert(path);
                    path.pop();
                }
            }
            for (child, pe) in items.iter().zip(pes) {
                let Some(pe) = pe else { continue };
                if dups.contains(&pe) {
                    continue;
                }
                path.push(pe);
                errs.extend(fs_walk(schema, &l.element_type, child, path, set));
                set.insert(path);
                path.pop();
            }
        }
        Kind::Map(m, rel) => {
            if rel == ElementRelationship::Atomic {
                set.insert(path);
                return errs;
            }
            let Value::Object(obj) = v else { return errs };
            for (k, child) in obj {
                let Some(ft) = field_type(m, k) else { continue };
                path.push(PathElement::FieldName(k.clone()));
                errs.extend(fs_walk(schema, ft, child, path, set));
                let empty_map = matches!(child, Value::Object(o) if o.is_empty());
                if child.is_null() || empty_map || !m.fields.contains_key(k) {
                    set.insert(path);
                }
                path.pop();
            }
        }
    }
    errs
}

// ----------------------------------------------------------------- compare

/// SMD `Compare`: which paths `new` added, modified or removed relative to
/// `old`. Atomic lists/maps are compared whole; empty and null containers
/// are leaves.
pub(crate) fn compare(
    schema: &Schema,
    old: &Value,
    new: &Value,
) -> Result<Comparison, ValidationErrors> {
    let mut c = Comparison::default();
    let mut path = vec![];
    let errs = cmp_node(
        schema,
        schema.root(),
        Some(old),
        Some(new),
        &mut path,
        false,
        &mut c,
    );
    into_result(errs).map(|_| c)
}

fn cmp_node(
    schema: &Schema,
    tr: &TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Vec<PathElement>,
    in_leaf: bool,
    c: &mut Comparison,
) -> Errs {
    if lhs.is_none() && rhs.is_none() {
        return errorf("at least one of lhs and rhs must be provided".to_string());
    }
    let r = match schema.resolve(tr) {
        Ok(r) => r,
        Err(e) => return errorf(e),
    };
    let (alhs, arhs) = (deduce(r, lhs), deduce(r, rhs));
    let mut leaf = in_leaf;
    let mut errs = vec![];
    let mut run =
        |a: Resolved<'_>, leaf: &mut bool, errs: &mut Errs, c: &mut Comparison| match handle(a, tr)
        {
            Ok(k) => errs.extend(cmp_kind(schema, k, lhs, rhs, path, leaf, c)),
            Err(e) => errs.extend(e),
        };
    if rhs.is_none() {
        run(alhs, &mut leaf, &mut errs, c);
    } else if lhs.is_none() || same_atom(&alhs, &arhs) {
        run(arhs, &mut leaf, &mut errs, c);
    } else {
        // SMD runs lhs's shape on a copy of the walker, then rhs's shape.
        let mut leaf2 = leaf;
        run(alhs, &mut leaf2, &mut errs, c);
        run(arhs, &mut leaf, &mut errs, c);
    }
    if !leaf {
        if lhs.is_none() {
            c.added.insert(path);
        } else if rhs.is_none() {
            c.removed.insert(path);
        }
    }
    errs
}

fn cmp_leaf(
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &[PathElement],
    leaf: &mut bool,
    c: &mut Comparison,
) {
    if *leaf {
        return;
    }
    *leaf = true;
    match (lhs, rhs) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        (Some(l), Some(r)) => {
            if !values_equal(r, l) {
                c.modified.insert(path);
            }
        }
    }
}

fn cmp_kind(
    schema: &Schema,
    kind: Kind<'_>,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Vec<PathElement>,
    leaf: &mut bool,
    c: &mut Comparison,
) -> Errs {
    match kind {
        Kind::Scalar(t) => {
            let le = validate_scalar(t, lhs, "lhs: ");
            let re = validate_scalar(t, rhs, "rhs: ");
            if !le.is_empty() && !re.is_empty() {
                return le.into_iter().chain(re).collect();
            }
            cmp_leaf(lhs, rhs, path, leaf, c);
            vec![]
        }
        Kind::List(l, rel) => {
            let la = lhs.and_then(Value::as_array);
            let ra = rhs.and_then(Value::as_array);
            let empty = la.is_none_or(|a| a.is_empty()) && ra.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                cmp_leaf(lhs, rhs, path, leaf, c);
                return vec![];
            }
            cmp_list_items(schema, l, rel, la, ra, path, *leaf, c)
        }
        Kind::Map(m, rel) => {
            let lm = lhs.and_then(Value::as_object);
            let rm = rhs.and_then(Value::as_object);
            let empty = lm.is_none_or(|a| a.is_empty()) && rm.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                cmp_leaf(lhs, rhs, path, leaf, c);
                return vec![];
            }
            let mut errs = vec![];
            for k in union_keys(lm, rm) {
                let Some(ft) = field_type(m, k) else {
                    // SMD fails to resolve an empty TypeRef here.
                    errs.extend(with_prefix(
                        errorf("schema error: invalid atom: inlined".to_string()),
                        &format!(".{k}"),
                    ));
                    continue;
                };
                path.push(PathElement::FieldName(k.clone()));
                let e = cmp_node(
                    schema,
                    ft,
                    lm.and_then(|m| m.get(k)),
                    rm.and_then(|m| m.get(k)),
                    path,
                    *leaf,
                    c,
                );
                path.pop();
                errs.extend(with_prefix(e, &format!(".{k}")));
            }
            errs
        }
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

#[allow(clippy::too_many_arguments)]
fn cmp_list_items(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    lhs: Option<&Vec<Value>>,
    rhs: Option<&Vec<Value>>,
    path: &mut Vec<PathElement>,
    leaf: bool,
    c: &mut Comparison,
) -> Errs {
    let mut errs = vec![];
    let mut all: Vec<PathElement> = vec![];
    let mut lvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    let mut rvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    for (i, child) in lhs.into_iter().flatten().enumerate() {
        match list_item_pe(schema, l, rel, child) {
            Ok(pe) => {
                let e = lvals.entry(pe.clone()).or_default();
                if e.is_empty() {
                    all.push(pe);
                }
                e.push(child);
            }
            Err(e) => errs.extend(errorf(format!("element {i}: {e}"))),
        }
    }
    for (i, child) in rhs.into_iter().flatten().enumerate() {
        match list_item_pe(schema, l, rel, child) {
            Ok(pe) => {
                let e = rvals.entry(pe.clone()).or_default();
                if e.is_empty() && !lvals.contains_key(&pe) {
                    all.push(pe.clone());
                }
                e.push(child);
            }
            Err(e) => errs.extend(errorf(format!("element {i}: {e}"))),
        }
    }
    let none = Vec::new();
    for pe in all {
        let ll = lvals.get(&pe).unwrap_or(&none);
        let rl = rvals.get(&pe).unwrap_or(&none);
        let item = |lv: Option<&Value>,
                    rv: Option<&Value>,
                    path: &mut Vec<PathElement>,
                    c: &mut Comparison| {
            path.push(pe.clone());
            let e = cmp_node(schema, &l.element_type, lv, rv, path, leaf, c);
            path.pop();
            with_prefix(e, &pe.to_string())
        };
        if ll.len() <= 1 && rl.len() <= 1 {
            errs.extend(item(ll.first().copied(), rl.first().copied(), path, c));
        } else if ll.len() >= 2 && rl.len() >= 2 {
            let same =
                ll.len() == rl.len() && ll.iter().zip(rl.iter()).all(|(a, b)| values_equal(a, b));
            if !same {
                path.push(pe.clone());
                c.modified.insert(path);
                path.pop();
            }
        } else if ll.len() >= 2 {
            if let Some(r) = rl.first() {
                errs.extend(item(None, Some(r), path, c));
            }
            path.push(pe.clone());
            c.removed.insert(path);
            path.pop();
        } else {
            if let Some(lv) = ll.first() {
                errs.extend(item(Some(lv), None, path, c));
            }
            path.push(pe.clone());
            c.added.insert(path);
            path.pop();
        }
    }
    errs
}

// ------------------------------------------------------------------- merge

static NULL: Value = Value::Null;

/// SMD `Merge` with rule "keep rhs": `config` wins on every leaf it sets;
/// separable maps and associative lists are merged item by item (list
/// order follows rhs for shared items), atomic values are replaced whole.
/// Nothing is removed.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, ValidationErrors> {
    let (out, errs) = merge_node(schema, schema.root(), Some(live), Some(config), false);
    into_result(errs).map(|_| out.unwrap_or(Value::Null))
}

/// The places in `v` whose type is an atomic map, struct or list (SMD's paths, e.g.
/// `.spec.items`), walked without recursion: what MutatingAdmissionPolicy's apply
/// configurations may not set, as setting part of an atomic value drops the rest.
pub fn atomic_paths(schema: &Schema, v: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<(&TypeRef, &Value, String)> = vec![(schema.root(), v, String::new())];
    while let Some((tr, v, path)) = stack.pop() {
        let Ok(r) = schema.resolve(tr) else {
            continue;
        };
        match (v, r.map, r.list) {
            (Value::Object(fields), Some(m), _) => {
                if r.map_relationship() == ElementRelationship::Atomic {
                    found.push(path.clone());
                }
                for (key, value) in fields {
                    if let Some(t) = field_type(m, key) {
                        stack.push((t, value, format!("{path}.{key}")));
                    }
                }
            }
            (Value::Array(items), _, Some(l)) => {
                if r.list_relationship() == ElementRelationship::Atomic {
                    found.push(path.clone());
                }
                for (index, item) in items.iter().enumerate() {
                    stack.push((&l.element_type, item, format!("{path}[{index}]")));
                }
            }
            _ => {}
        }
    }
    found.sort();
    found
}

fn merge_node(
    schema: &Schema,
    tr: &TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    in_leaf: bool,
) -> (Option<Value>, Errs) {
    if lhs.is_none() && rhs.is_none() {
        return (
            None,
            errorf("at least one of lhs and rhs must be provided".to_string()),
        );
    }
    let r = match schema.resolve(tr) {
        Ok(r) => r,
        Err(e) => return (None, errorf(e)),
    };
    let (alhs, arhs) = (deduce(r, lhs), deduce(r, rhs));
    let mut errs = vec![];
    let run = |a: Resolved<'_>, errs: &mut Errs| -> Option<Value> {
        let mut leaf = in_leaf;
        match handle(a, tr) {
            Ok(k) => {
                let (o, e) = merge_kind(schema, k, lhs, rhs, &mut leaf);
                errs.extend(e);
                o
            }
            Err(e) => {
                errs.extend(e);
                None
            }
        }
    };
    let out = if rhs.is_none() {
        run(alhs, &mut errs)
    } else if lhs.is_none() || same_atom(&alhs, &arhs) {
        run(arhs, &mut errs)
    } else {
        // SMD merges lhs's shape on a walker copy whose output is dropped.
        let _ = run(alhs, &mut errs);
        run(arhs, &mut errs)
    };
    (out, errs)
}

fn merge_leaf(lhs: Option<&Value>, rhs: Option<&Value>, leaf: &mut bool) -> Option<Value> {
    if *leaf {
        return None;
    }
    *leaf = true;
    rhs.or(lhs).cloned()
}

fn merge_kind(
    schema: &Schema,
    kind: Kind<'_>,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    leaf: &mut bool,
) -> (Option<Value>, Errs) {
    match kind {
        Kind::Scalar(t) => {
            let le = validate_scalar(t, lhs, "lhs: ");
            let re = validate_scalar(t, rhs, "rhs: ");
            if !le.is_empty() && !re.is_empty() {
                return (None, le.into_iter().chain(re).collect());
            }
            (merge_leaf(lhs, rhs, leaf), vec![])
        }
        Kind::List(l, rel) => {
            let la = lhs.and_then(Value::as_array);
            let ra = rhs.and_then(Value::as_array);
            let empty = la.is_none_or(|a| a.is_empty()) && ra.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                return (merge_leaf(lhs, rhs, leaf), vec![]);
            }
            merge_list_items(schema, l, rel, la, ra, *leaf)
        }
        Kind::Map(m, rel) => {
            let lm = lhs.and_then(Value::as_object);
            let rm = rhs.and_then(Value::as_object);
            let empty = lm.is_none_or(|a| a.is_empty()) && rm.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                return (merge_leaf(lhs, rhs, leaf), vec![]);
            }
            let mut out = Map::new();
            let mut errs = vec![];
            for k in union_keys(lm, rm) {
                let Some(ft) = field_type(m, k) else {
                    errs.extend(with_prefix(
                        errorf("schema error: invalid atom: inlined".to_string()),
                        &format!(".{k}"),
                    ));
                    continue;
                };
                let (o, e) = merge_node(
                    schema,
                    ft,
                    lm.and_then(|m| m.get(k)),
                    rm.and_then(|m| m.get(k)),
                    *leaf,
                );
                errs.extend(with_prefix(e, &format!(".{k}")));
                if let Some(o) = o {
                    out.insert(k.clone(), o);
                }
            }
            ((!out.is_empty()).then_some(Value::Object(out)), errs)
        }
    }
}

type Indexed<'v> = (Vec<PathElement>, BTreeMap<PathElement, &'v Value>, Errs);

fn index_list<'v>(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    list: Option<&'v Vec<Value>>,
    allow_dups: bool,
) -> Indexed<'v> {
    let mut pes = vec![];
    let mut observed: BTreeMap<PathElement, &'v Value> = BTreeMap::new();
    let mut errs = vec![];
    for (i, child) in list.into_iter().flatten().enumerate() {
        let pe = match list_item_pe(schema, l, rel, child) {
            Ok(pe) => pe,
            Err(e) => {
                errs.extend(errorf(format!("element {i}: {e}")));
                continue;
            }
        };
        let found = observed.contains_key(&pe);
        if found && !allow_dups {
            errs.extend(errorf(format!("duplicate entries for key {pe}")));
            continue;
        } else if !found {
            observed.insert(pe.clone(), child);
        } else {
            // Duplicated items are not merged with the new value.
            observed.insert(pe.clone(), &NULL);
        }
        pes.push(pe);
    }
    (pes, observed, errs)
}

fn merge_list_items(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    lhs: Option<&Vec<Value>>,
    rhs: Option<&Vec<Value>>,
    leaf: bool,
) -> (Option<Value>, Errs) {
    let (rhs_pes, obs_r, mut errs) = index_list(schema, l, rel, rhs, false);
    let (lhs_pes, obs_l, lerrs) = index_list(schema, l, rel, lhs, true);
    errs.extend(lerrs);
    if !errs.is_empty() {
        return (None, errs);
    }
    // Item errors are dropped, as SMD does (it shadows them); inputs were
    // validated before merging.
    let item = |lv: Option<&Value>, rv: Option<&Value>| {
        merge_node(schema, &l.element_type, lv, rv, leaf).0
    };
    let mut shared = rhs_pes.iter().filter(|pe| obs_l.contains_key(*pe));
    let mut next_shared = shared.next();
    let mut merged_rhs: BTreeSet<&PathElement> = BTreeSet::new();
    let mut out = vec![];
    let (llen, rlen) = (lhs_pes.len(), rhs_pes.len());
    let (mut li, mut ri) = (0, 0);
    while li < llen || ri < rlen {
        if li < llen && ri < rlen {
            let pe = &lhs_pes[li];
            if *pe == rhs_pes[ri] {
                merged_rhs.insert(pe);
                if let Some(o) = item(obs_l.get(pe).copied(), obs_r.get(pe).copied()) {
                    out.push(o);
                }
                li += 1;
                ri += 1;
                next_shared = shared.next();
                continue;
            }
            if obs_r.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                // Shared item, but not the one wanted in this round.
                li += 1;
                continue;
            }
        }
        if li < llen {
            let pe = &lhs_pes[li];
            if !obs_r.contains_key(pe) {
                let lchild = lhs.and_then(|a| a.get(li));
                if let Some(o) = item(lchild, None) {
                    out.push(o);
                }
                li += 1;
                continue;
            } else if merged_rhs.contains(pe) {
                li += 1;
            }
        }
        if ri < rlen {
            let pe = &rhs_pes[ri];
            merged_rhs.insert(pe);
            if let Some(o) = item(obs_l.get(pe).copied(), obs_r.get(pe).copied()) {
                out.push(o);
            }
            ri += 1;
            if next_shared.is_some_and(|n| n == pe) {
                next_shared = shared.next();
            }
        }
    }
    ((!out.is_empty()).then_some(Value::Array(out)), vec![])
}

// ----------------------------------------------------- remove / extract

/// SMD `RemoveItems`: removes the listed fields and list/map items.
/// Containers emptied by the removal are kept as `{}`/`[]`.
pub(crate) fn remove_items(schema: &Schema, v: &Value, items: &FieldSet) -> Value {
    remove_walk(schema, schema.root(), v, items, false).unwrap_or(Value::Null)
}

/// SMD `ExtractItems`: keeps only the listed fields and items (the
/// server has no use for it; the tests check [`remove_items`] against it).
#[cfg(test)]
pub(crate) fn extract_items(schema: &Schema, v: &Value, items: &FieldSet) -> Value {
    remove_walk(schema, schema.root(), v, items, true).unwrap_or(Value::Null)
}

fn remove_walk(
    schema: &Schema,
    tr: &TypeRef,
    v: &Value,
    set: &FieldSet,
    extract: bool,
) -> Option<Value> {
    let kind = resolve_kind(schema, tr, Some(v)).ok()?;
    let empty = FieldSet::new();
    match kind {
        Kind::Scalar(_) => Some(v.clone()),
        Kind::List(l, rel) => {
            let Value::Array(items) = v else { return None };
            if items.is_empty() || rel == ElementRelationship::Atomic {
                return extract.then(|| v.clone());
            }
            let mut new_items = vec![];
            let mut had_matches = false;
            for item in items {
                let Ok(pe) = list_item_pe(schema, l, rel, item) else {
                    if !extract {
                        new_items.push(item.clone());
                    }
                    continue;
                };
                let exact = set.has(std::slice::from_ref(&pe));
                let sub = set.with_prefix(&pe).unwrap_or(&empty);
                let prefix = !sub.is_empty();
                if extract {
                    let mut item = item.clone();
                    if prefix {
                        item = remove_walk(schema, &l.element_type, &item, sub, true)
                            .unwrap_or(Value::Null);
                    }
                    if exact || prefix {
                        new_items.push(item);
                    }
                } else {
                    if exact {
                        continue;
                    }
                    let mut item = item.clone();
                    if prefix {
                        had_matches = true;
                        let was = container_kind(&item);
                        item = remove_walk(schema, &l.element_type, &item, sub, false)
                            .unwrap_or(Value::Null);
                        if item.is_null() {
                            item = was.unwrap_or(Value::Null);
                        }
                    }
                    new_items.push(item);
                }
            }
            (!new_items.is_empty() || (had_matches && !extract)).then_some(Value::Array(new_items))
        }
        Kind::Map(m, rel) => {
            let Value::Object(obj) = v else { return None };
            if obj.is_empty() || rel == ElementRelationship::Atomic {
                return extract.then(|| v.clone());
            }
            let mut out = Map::new();
            let mut had_matches = false;
            for (k, val) in obj {
                let pe = PathElement::FieldName(k.clone());
                let Some(ft) = field_type(m, k) else {
                    if !extract {
                        out.insert(k.clone(), val.clone());
                    }
                    continue;
                };
                if set.has(std::slice::from_ref(&pe)) {
                    if extract {
                        // SMD passes the whole set down here, not the subset.
                        let e = remove_walk(schema, ft, val, set, true).unwrap_or(Value::Null);
                        out.insert(k.clone(), e);
                    }
                    continue;
                }
                let sub = set.with_prefix(&pe).unwrap_or(&empty);
                let mut val = val.clone();
                if !sub.is_empty() {
                    had_matches = true;
                    let was = container_kind(&val);
                    val = remove_walk(schema, ft, &val, sub, extract).unwrap_or(Value::Null);
                    if val.is_null() && !extract {
                        val = was.unwrap_or(Value::Null);
                    }
                } else if extract {
                    continue;
                }
                out.insert(k.clone(), val);
            }
            (!out.is_empty() || (had_matches && !extract)).then_some(Value::Object(out))
        }
    }
}

/// An empty container of the same kind, kept when removal empties it.
fn container_kind(v: &Value) -> Option<Value> {
    match v {
        Value::Object(_) => Some(Value::Object(Map::new())),
        Value::Array(_) => Some(Value::Array(vec![])),
        _ => None,
    }
}
