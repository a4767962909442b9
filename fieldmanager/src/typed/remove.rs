//! Removing (or extracting) the items of a field set from a value (SMD's `RemoveItems`,
//! `ExtractItems`).

use super::*;

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

pub(super) fn remove_walk(
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
pub(super) fn container_kind(v: &Value) -> Option<Value> {
    match v {
        Value::Object(_) => Some(Value::Object(Map::new())),
        Value::Array(_) => Some(Value::Array(vec![])),
        _ => None,
    }
}
