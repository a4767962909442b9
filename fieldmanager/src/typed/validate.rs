//! Validation against the schema, and the field set a value sets (SMD's `ToFieldSet`).

use super::*;

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

pub(super) fn validate_at(schema: &Schema, tr: &TypeRef, v: &Value, dups: bool) -> Errs {
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

pub(super) fn fs_walk(
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
