//! A body checked against its kind's structural schema, as kube-apiserver validates a custom
//! resource (kube-openapi's validator behind apiextensions-apiserver): wrong types, missing
//! required fields, bounds. Used to word why a body that is JSON is not an object of the kind,
//! one cause per field, as a CRD of the same schema answers (422 `Invalid`).
//!
//! Covers what the kinds' schemas use: `type`, `required`, `properties`, `items`, `nullable`,
//! `minimum`/`maximum` (and their `exclusive` flags), `minLength`/`maxLength`, `enum`.

use serde_json::Value;

use crate::{error::FieldError, json_patch::go_text};

/// The kind's structural schema (its CRD's `openAPIV3Schema` at `K`'s version).
pub(crate) fn schema_of<K: kube::CustomResourceExt>() -> Value {
    let crd = serde_json::to_value(K::crd()).unwrap_or_default();
    crd.pointer("/spec/versions/0/schema/openAPIV3Schema")
        .cloned()
        .unwrap_or_default()
}

/// Every way `value` departs from `schema`, as kube-apiserver's causes (field paths without the
/// object's root; a `null` where the schema does not allow one counts as absent, as
/// kube-apiserver prunes it). `metadata`, `apiVersion` and `kind` are left to the caller.
pub(crate) fn validate(value: &Value, schema: &Value, prune_nulls: bool) -> Vec<FieldError> {
    let mut errors = Vec::new();
    check(value, schema, "", prune_nulls, &mut errors);
    errors
        .into_iter()
        .filter(|e| {
            !(e.field == "metadata"
                || e.field.starts_with("metadata.")
                || e.field == "apiVersion"
                || e.field == "kind")
        })
        .collect()
}

/// The fields of `value` its schema does not have (kube-apiserver prunes them and, unless
/// `fieldValidation=Ignore`, names them), as paths; `metadata` is left to the caller.
pub(crate) fn unknown_fields(value: &Value, schema: &Value) -> Vec<String> {
    let mut unknown = Vec::new();
    let mut stack = vec![(value, schema, String::new())];
    let none = serde_json::Map::new();
    while let Some((value, schema, path)) = stack.pop() {
        let Value::Object(map) = value else { continue };
        let open = schema.get("additionalProperties").is_some()
            || schema.get("x-kubernetes-preserve-unknown-fields") == Some(&Value::Bool(true));
        if open {
            continue;
        }
        // An object where the schema has none (a number sent as an object): all of it is
        // unknown, as kube-apiserver prunes it.
        let properties = schema
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(&none);
        for (name, member) in map {
            let here = child(&path, name);
            match properties.get(name) {
                Some(_) if path.is_empty() && name == "metadata" => {}
                Some(property) => stack.push((member, property, here)),
                None if path.is_empty()
                    && matches!(name.as_str(), "apiVersion" | "kind" | "metadata") => {}
                None => unknown.push(here),
            }
        }
    }
    unknown.sort();
    unknown
}

/// kube-openapi's name for a JSON value's type.
fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        // As Kubernetes decodes JSON: a number with a fraction or exponent is a float64.
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn child(path: &str, name: &str) -> String {
    if path.is_empty() {
        name.to_owned()
    } else {
        format!("{path}.{name}")
    }
}

/// Whether a member that is `null` stays (its schema is nullable) or is pruned.
fn nullable(schema: &Value) -> bool {
    schema.get("nullable").and_then(Value::as_bool) == Some(true)
}

fn check(
    value: &Value,
    schema: &Value,
    path: &str,
    prune_nulls: bool,
    errors: &mut Vec<FieldError>,
) {
    if value.is_null() && (prune_nulls || nullable(schema)) {
        return;
    }
    let actual = type_of(value);
    if let Some(expected) = schema.get("type").and_then(Value::as_str) {
        let fits = expected == actual || (expected == "number" && actual == "integer");
        if !fits {
            errors.push(FieldError {
                field: path.to_owned(),
                reason: "FieldValueTypeInvalid",
                message: format!(
                    "Invalid value: \"{actual}\": {path} in body must be of type {expected}: \"{actual}\""
                ),
            });
            return;
        }
    }
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (name, property) in properties {
                    if let Some(member) = map.get(name) {
                        check(member, property, &child(path, name), prune_nulls, errors);
                    }
                }
            }
            for name in schema
                .get("required")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                let property = schema.pointer(&format!("/properties/{name}"));
                let present = match map.get(name) {
                    None => false,
                    Some(Value::Null) => !prune_nulls || property.is_some_and(nullable),
                    Some(_) => true,
                };
                if !present {
                    errors.push(FieldError {
                        field: child(path, name),
                        reason: "FieldValueRequired",
                        message: "Required value".into(),
                    });
                }
            }
        }
        Value::Array(items) => {
            if let Some(item) = schema.get("items") {
                for (index, element) in items.iter().enumerate() {
                    check(
                        element,
                        item,
                        &format!("{path}[{index}]"),
                        prune_nulls,
                        errors,
                    );
                }
            }
        }
        Value::String(s) => {
            let length = s.chars().count() as u64;
            if let Some(max) = schema.get("maxLength").and_then(Value::as_u64)
                && length > max
            {
                errors.push(FieldError {
                    field: path.to_owned(),
                    reason: "FieldValueTooLong",
                    message: format!("Too long: may not be more than {max} bytes"),
                });
            }
            if let Some(min) = schema.get("minLength").and_then(Value::as_u64)
                && length < min
            {
                errors.push(FieldError::invalid(
                    path,
                    go_text(value),
                    &format!("{path} in body should be at least {min} chars long"),
                ));
            }
        }
        Value::Number(n) => {
            let x = n.as_f64().unwrap_or_default();
            let bound = |name: &str| schema.get(name).and_then(Value::as_f64);
            let exclusive = |name: &str| schema.get(name).and_then(Value::as_bool) == Some(true);
            if let Some(min) = bound("minimum") {
                let (fails, words) = if exclusive("exclusiveMinimum") {
                    (x <= min, "greater than")
                } else {
                    (x < min, "greater than or equal to")
                };
                if fails {
                    errors.push(FieldError::invalid(
                        path,
                        go_text(value),
                        &format!("{path} in body should be {words} {}", number_text(min)),
                    ));
                }
            }
            if let Some(max) = bound("maximum") {
                let (fails, words) = if exclusive("exclusiveMaximum") {
                    (x >= max, "less than")
                } else {
                    (x > max, "less than or equal to")
                };
                if fails {
                    errors.push(FieldError::invalid(
                        path,
                        go_text(value),
                        &format!("{path} in body should be {words} {}", number_text(max)),
                    ));
                }
            }
        }
        Value::Bool(_) | Value::Null => {}
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        let list: Vec<String> = allowed.iter().map(go_text).collect();
        errors.push(FieldError {
            field: path.to_owned(),
            reason: "FieldValueNotSupported",
            message: format!(
                "Unsupported value: {}: supported values: {}",
                go_text(value),
                list.join(", ")
            ),
        });
    }
}

/// A bound as Go's `%v` prints a float64 (`0`, `1.5`).
fn number_text(x: f64) -> String {
    crate::json_patch::go_float(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "required": ["spec"],
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["weightKg", "heightMetres"],
                    "properties": {
                        "weightKg": {"type": "number", "minimum": 0, "exclusiveMinimum": true},
                        "heightMetres": {"type": "number"},
                        "nickname": {"type": "string", "maxLength": 3, "nullable": false}
                    }
                }
            }
        })
    }

    fn fields(value: Value) -> Vec<(String, &'static str, String)> {
        validate(&value, &schema(), true)
            .into_iter()
            .map(|e| (e.field, e.reason, e.message))
            .collect()
    }

    #[test]
    fn types_requirements_and_bounds_are_worded_as_kube_apiserver_words_them() {
        assert_eq!(
            fields(json!({"spec": {"weightKg": "x", "nickname": "long"}})),
            vec![
                (
                    "spec.nickname".into(),
                    "FieldValueTooLong",
                    "Too long: may not be more than 3 bytes".into()
                ),
                (
                    "spec.weightKg".into(),
                    "FieldValueTypeInvalid",
                    "Invalid value: \"string\": spec.weightKg in body must be of type number: \"string\"".into()
                ),
                (
                    "spec.heightMetres".into(),
                    "FieldValueRequired",
                    "Required value".into()
                ),
            ]
        );
        assert_eq!(
            fields(json!({"spec": {"weightKg": -1, "heightMetres": null}}))[0].2,
            "Invalid value: -1: spec.weightKg in body should be greater than 0"
        );
        assert_eq!(
            fields(json!({"spec": null}))[0],
            ("spec".into(), "FieldValueRequired", "Required value".into())
        );
        assert_eq!(
            fields(json!({"spec": 5}))[0].2,
            "Invalid value: \"integer\": spec in body must be of type object: \"integer\""
        );
        assert!(fields(json!({"spec": {"weightKg": 1, "heightMetres": 2.5}})).is_empty());
    }
}
