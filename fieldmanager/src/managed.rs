//! `metadata.managedFields` encoding (apimachinery
//! `managedfields/internal/managedfields.go`): manager identifiers,
//! decoding, encoding and kube's entry order, plus RFC 3339 times.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::gojson::{self, format_time, parse_time};
use super::merge::{ManagedFields, VersionedSet};
use super::set::FieldSet;

/// Operation of an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Operation {
    /// Server-side apply.
    Apply,
    /// Create, update, patch.
    Update,
}

impl Operation {
    fn as_str(self) -> &'static str {
        match self {
            Operation::Apply => "Apply",
            Operation::Update => "Update",
        }
    }
}

/// Ownership plus the time of each manager's last change (kube's
/// `Managed`); times are Unix seconds, `None` when the entry had none.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Managed {
    /// Identifier → owned fields.
    pub(crate) fields: ManagedFields,
    /// Identifier → time.
    pub(crate) times: BTreeMap<String, Option<i64>>,
}

/// Why managedFields could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DecodeError {
    /// Not the ManagedFieldsEntry JSON shape (kube fails decoding the
    /// whole object: a 400).
    Malformed(String),
    /// Well-formed but semantically invalid (kube's DecodeManagedFields
    /// error; callers fall back to the live object's entries).
    Invalid(String),
}

/// kube's `BuildManagerIdentifier`: the entry's JSON without time, fields
/// and (for appliers) apiVersion, in ManagedFieldsEntry field order.
pub(crate) fn manager_identifier(
    manager: &str,
    op: Operation,
    api_version: &str,
    subresource: &str,
) -> String {
    let mut out = String::from("{");
    let mut first = true;
    let mut field = |out: &mut String, k: &str, v: &str| {
        if v.is_empty() {
            return;
        }
        if !first {
            out.push(',');
        }
        first = false;
        gojson::write_string(out, k, true);
        out.push(':');
        gojson::write_string(out, v, true);
    };
    field(&mut out, "manager", manager);
    field(&mut out, "operation", op.as_str());
    if op == Operation::Update {
        field(&mut out, "apiVersion", api_version);
    }
    field(&mut out, "subresource", subresource);
    out.push('}');
    out
}

fn str_field<'v>(e: &'v Map<String, Value>, k: &str, i: usize) -> Result<&'v str, DecodeError> {
    match e.get(k) {
        None | Some(Value::Null) => Ok(""),
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(DecodeError::Malformed(format!(
            "metadata.managedFields[{i}].{k}: expected string, got {other}"
        ))),
    }
}

/// kube's `DecodeManagedFields` over the JSON list (`None` = absent).
pub(crate) fn decode(list: Option<&Value>) -> Result<Managed, DecodeError> {
    let mut m = Managed::default();
    let items = match list {
        None | Some(Value::Null) => return Ok(m),
        Some(Value::Array(a)) => a,
        Some(other) => {
            return Err(DecodeError::Malformed(format!(
                "metadata.managedFields: expected array, got {other}"
            )));
        }
    };
    for (i, item) in items.iter().enumerate() {
        let Value::Object(e) = item else {
            return Err(DecodeError::Malformed(format!(
                "metadata.managedFields[{i}]: expected object"
            )));
        };
        let manager = str_field(e, "manager", i)?;
        let op = match str_field(e, "operation", i)? {
            "Apply" => Operation::Apply,
            "Update" => Operation::Update,
            _ => {
                return Err(DecodeError::Invalid(
                    "operation must be `Apply` or `Update`".to_string(),
                ));
            }
        };
        let api_version = str_field(e, "apiVersion", i)?;
        if api_version.is_empty() {
            return Err(DecodeError::Invalid(
                "apiVersion must not be empty".to_string(),
            ));
        }
        match str_field(e, "fieldsType", i)? {
            "FieldsV1" => {}
            "" => {
                return Err(DecodeError::Invalid(format!(
                    "missing fieldsType in managed fields entry {i}"
                )));
            }
            other => {
                return Err(DecodeError::Invalid(format!(
                    "invalid fieldsType {} in managed fields entry {i}",
                    gojson::quote(other)
                )));
            }
        }
        let time = match str_field(e, "time", i)? {
            "" => None,
            t => Some(parse_time(t).ok_or_else(|| {
                DecodeError::Malformed(format!(
                    "metadata.managedFields[{i}].time: invalid RFC 3339 time {t:?}"
                ))
            })?),
        };
        let subresource = str_field(e, "subresource", i)?;
        let set = match e.get("fieldsV1") {
            None | Some(Value::Null) => FieldSet::new(),
            Some(v) => FieldSet::from_fields_v1(v).map_err(|err| {
                DecodeError::Invalid(format!(
                    "error decoding versioned set: error decoding set: {err}"
                ))
            })?,
        };
        let id = manager_identifier(manager, op, api_version, subresource);
        m.fields.insert(
            id.clone(),
            VersionedSet {
                set,
                api_version: api_version.to_string(),
                applied: op == Operation::Apply,
            },
        );
        m.times.insert(id, time);
    }
    Ok(m)
}

struct Entry {
    manager: String,
    operation: String,
    api_version: String,
    time: Option<i64>,
    fields: String,
    subresource: String,
}

fn entries(managed: &Managed) -> Vec<Entry> {
    let mut out: Vec<Entry> = managed
        .fields
        .iter()
        .map(|(id, vs)| {
            let parsed: Map<String, Value> = serde_json::from_str(id).unwrap_or_default();
            let s = |k: &str| {
                parsed
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string()
            };
            let operation = if vs.applied {
                "Apply".to_string()
            } else {
                s("operation")
            };
            Entry {
                manager: s("manager"),
                operation,
                api_version: vs.api_version.clone(),
                time: managed.times.get(id).copied().flatten(),
                fields: vs.set.to_fields_v1_string(),
                subresource: s("subresource"),
            }
        })
        .collect();
    // sortEncodedManagedFields: operation, time (missing = 0), manager,
    // apiVersion, subresource.
    out.sort_by(|p, q| {
        p.operation
            .cmp(&q.operation)
            .then(p.time.unwrap_or(0).cmp(&q.time.unwrap_or(0)))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    out
}

/// kube's `encodeManagedFields`: the managedFields list in kube's order,
/// or `None` when there are no managers (kube then omits the field).
pub(crate) fn encode(managed: &Managed) -> Option<Value> {
    if managed.fields.is_empty() {
        return None;
    }
    let list = entries(managed)
        .into_iter()
        .map(|e| {
            let mut o = Map::new();
            if !e.manager.is_empty() {
                o.insert("manager".into(), Value::String(e.manager));
            }
            if !e.operation.is_empty() {
                o.insert("operation".into(), Value::String(e.operation));
            }
            o.insert("apiVersion".into(), Value::String(e.api_version));
            if let Some(t) = e.time {
                o.insert("time".into(), Value::String(format_time(t)));
            }
            o.insert("fieldsType".into(), Value::String("FieldsV1".into()));
            o.insert(
                "fieldsV1".into(),
                serde_json::from_str(&e.fields).unwrap_or(Value::Null),
            );
            if !e.subresource.is_empty() {
                o.insert("subresource".into(), Value::String(e.subresource));
            }
            Value::Object(o)
        })
        .collect();
    Some(Value::Array(list))
}

/// Serializes a managedFields list byte-for-byte as kube-apiserver does
/// (ManagedFieldsEntry field order, FieldsV1 in SMD order). serde_json
/// cannot, since its maps sort keys. The tests hold [`encode`]'s entries
/// to kube-apiserver's bytes with it.
#[cfg(test)]
pub(crate) fn encode_json_string(list: &Value) -> Option<String> {
    let Value::Array(items) = list else {
        return None;
    };
    let mut out = String::from("[");
    for (i, item) in items.iter().enumerate() {
        let Value::Object(e) = item else { return None };
        if i > 0 {
            out.push(',');
        }
        out.push('{');
        let mut first = true;
        for k in [
            "manager",
            "operation",
            "apiVersion",
            "time",
            "fieldsType",
            "fieldsV1",
            "subresource",
        ] {
            let Some(v) = e.get(k) else { continue };
            if !first {
                out.push(',');
            }
            first = false;
            gojson::write_string(&mut out, k, true);
            out.push(':');
            if k == "fieldsV1" {
                out.push_str(&FieldSet::from_fields_v1(v).ok()?.to_fields_v1_string());
            } else {
                gojson::write_value(&mut out, v, gojson::Flavor::EncodingJson);
            }
        }
        out.push('}');
    }
    out.push(']');
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn times() {
        let t = parse_time("2026-11-23T15:42:24Z").expect("time");
        assert_eq!(format_time(t), "2026-11-23T15:42:24Z");
        assert_eq!(parse_time("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_time("2026-11-23T17:42:24.5+02:00"), Some(t));
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn identifiers() {
        assert_eq!(
            manager_identifier("kubectl", Operation::Update, "v1", ""),
            r#"{"manager":"kubectl","operation":"Update","apiVersion":"v1"}"#
        );
        assert_eq!(
            manager_identifier("m", Operation::Apply, "v1", "status"),
            r#"{"manager":"m","operation":"Apply","subresource":"status"}"#
        );
    }

    #[test]
    fn decode_errors() {
        let bad_op = json!([{"manager": "a", "operation": "Foo", "apiVersion": "v1", "fieldsType": "FieldsV1"}]);
        assert!(matches!(
            decode(Some(&bad_op)),
            Err(DecodeError::Invalid(_))
        ));
        let no_type = json!([{"manager": "a", "operation": "Update", "apiVersion": "v1"}]);
        assert_eq!(
            decode(Some(&no_type)),
            Err(DecodeError::Invalid(
                "missing fieldsType in managed fields entry 0".into()
            ))
        );
        assert!(matches!(
            decode(Some(&json!(3))),
            Err(DecodeError::Malformed(_))
        ));
    }

    #[test]
    fn exact_json_string() {
        let list = json!([{"apiVersion": "v1", "fieldsType": "FieldsV1", "manager": "m", "operation": "Update",
            "time": "2026-11-23T15:42:24Z", "fieldsV1": {"f:spec": {"f:b": {}, "f:a": {}}}}]);
        assert_eq!(
            encode_json_string(&list).expect("enc"),
            r#"[{"manager":"m","operation":"Update","apiVersion":"v1","time":"2026-11-23T15:42:24Z","fieldsType":"FieldsV1","fieldsV1":{"f:spec":{"f:a":{},"f:b":{}}}}]"#
        );
    }
}
