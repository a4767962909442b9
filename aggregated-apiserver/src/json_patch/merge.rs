//! JSON merge patch (RFC 7386) as json-patch.v4's `MergePatch` applies it.

use serde_json::{Map, Value};

/// Why a merge patch did not apply: a patch that is not a JSON document (`null`, a scalar:
/// 400 `Invalid JSON Patch`).
pub const BAD_MERGE_PATCH: &str = "Invalid JSON Patch";

/// Applies a JSON merge patch to the object `document` as json-patch.v4's `MergePatch` does:
/// `null` removes a member; an object merges into an object member by member; anything else
/// replaces, with the `null` members of the objects it holds (in arrays too) left out. A patch
/// that is an array replaces the whole document (which then is no object).
pub fn merge(document: &mut Value, patch: Value) -> Result<(), &'static str> {
    match patch {
        Value::Object(patch) => {
            match document {
                Value::Object(doc) => merge_members(doc, patch),
                _ => {
                    let mut patch = Value::Object(patch);
                    prune_nulls(&mut patch);
                    *document = patch;
                }
            }
            Ok(())
        }
        Value::Array(_) => {
            let mut patch = patch;
            prune_nulls(&mut patch);
            *document = patch;
            Ok(())
        }
        _ => Err(BAD_MERGE_PATCH),
    }
}

fn merge_members(doc: &mut Map<String, Value>, patch: Map<String, Value>) {
    for (key, value) in patch {
        if value.is_null() {
            doc.remove(&key);
            continue;
        }
        match doc.get_mut(&key) {
            Some(current @ Value::Object(_)) if value.is_object() => {
                if let (Value::Object(current), Value::Object(value)) = (current, value) {
                    merge_members(current, value);
                }
            }
            Some(current) if !current.is_null() && !current.is_object() => {
                // json-patch: a member that is no object takes the patch's value, its nulls
                // pruned.
                let mut value = value;
                prune_nulls(&mut value);
                *current = value;
            }
            Some(current @ Value::Object(_)) => {
                // An object replaced by a scalar or an array: the patch's value as sent.
                *current = value;
            }
            _ => {
                let mut value = value;
                prune_nulls(&mut value);
                doc.insert(key, value);
            }
        }
    }
}

/// json-patch.v4's `pruneNulls`: null members of objects go, in objects and arrays at any
/// depth; null elements of arrays stay. Walked without recursion.
fn prune_nulls(value: &mut Value) {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                map.retain(|_, v| !v.is_null());
                stack.extend(map.values_mut());
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            _ => {}
        }
    }
}
