//! JSON merge patches and JSON patches, with kube-apiserver's bounds.

use axum::http::{HeaderMap, header};
use serde::Serialize;
use serde_json::Value;

use super::body;
use crate::{
    error::{Error, FieldError, Result},
    negotiate::{self},
    resource::ServedResource,
    store::Stored,
};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    Merge,
    Json,
    /// Server-side apply (`application/apply-patch+yaml`).
    Apply,
}

pub(crate) fn patch_type(headers: &HeaderMap) -> Result<PatchType> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = negotiate::media_type_base(content_type).unwrap_or_default();
    match base.as_str() {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Err(Error::UnsupportedMediaType(
            "strategic merge patch is not supported for farm.example.com resources (they are not built-in kinds); use a JSON merge patch (kubectl patch --type merge) or a JSON patch (--type json) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
        )),
        "application/apply-patch+yaml" => Ok(PatchType::Apply),
        "application/apply-patch+cbor" => Err(Error::UnsupportedMediaType(
            "server-side apply in CBOR is not supported by farm-apiserver; send the configuration as application/apply-patch+yaml (YAML or JSON) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
        )),
        other => Err(Error::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        ))),
    }
}

/// Applies a patch to the object as it is served (its JSON), so a JSON patch `test` compares
/// against the values a GET shows. A patch body may nest [`body::MAX_DEPTH`] deep, and a JSON
/// patch may build a result that deep: call inside [`body::Work`].
pub(crate) fn apply_patch<K: ServedResource>(
    current: &Stored<K>,
    patch_type: PatchType,
    patch: &[u8],
) -> Result<Value> {
    let mut document = body::parse_json(current.json())
        .map_err(|e| Error::Internal(format!("decoding the stored object: {e}")))?;
    let mut patch = body::parse_json(patch).map_err(|e| {
        Error::BadRequest(format!(
            "error decoding patch: {}",
            if e == body::too_deep_message() {
                format!(
                    "invalid character '{}' exceeded max depth",
                    body::too_deep_bracket(patch)
                )
            } else {
                e
            }
        ))
    })?;
    match patch_type {
        PatchType::Merge => {
            if !patch.0.is_object() {
                return Err(Error::BadRequest(
                    "error decoding patch: a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut document.0, &patch.0);
        }
        PatchType::Json => {
            // Counted before anything is applied, as kube-apiserver does.
            if let Value::Array(operations) = &patch.0
                && operations.len() > MAX_JSON_PATCH_OPERATIONS
            {
                return Err(Error::RequestEntityTooLarge(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    operations.len()
                )));
            }
            let patch: json_patch::Patch = serde_json::from_value(std::mem::take(&mut patch.0))
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            apply_json_patch(&mut document.0, &patch).map_err(|message| Error::Invalid {
                subject: K::invalid_subject(current.meta().name.as_deref().unwrap_or("")),
                causes: vec![FieldError {
                    field: "patch".into(),
                    reason: "FieldValueInvalid",
                    message,
                }],
            })?;
        }
        PatchType::Apply => {
            return Err(Error::Internal(
                "an apply is merged by the field manager, not as a patch".into(),
            ));
        }
    }
    // Bounded for one request: a merge patch grows the object by at most its own size (3 MiB),
    // a JSON patch by its values and at most 3 MiB of copies; the object that results is
    // bounded by the caller.
    Ok(std::mem::take(&mut document.0))
}

/// kube-apiserver's bounds on a JSON patch (CVE-2019-1002100: each `copy` can double the
/// document): at most 10,000 operations, and at most 3 MiB added by copies in all.
pub(crate) const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
pub(crate) const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Bytes of `value` as JSON, counted without building the text.
pub(crate) fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Applies `patch` an operation at a time, as kube-apiserver's JSON patch does, with its
/// bounds: a copy that would take the bytes copied past [`MAX_JSON_PATCH_COPY_BYTES`] is
/// refused before it is made, and so is an operation whose result would nest deeper than
/// [`body::MAX_DEPTH`] (a `move` into its own copy nests a little deeper every round), so
/// the document is never deeper than Go's decoder would read. `test` compares numbers by
/// value (RFC 6902: `120` equals `120.0`). The error is the message.
///
/// The document may reach [`body::MAX_DEPTH`]: call inside [`body::Work::run`].
pub(crate) fn apply_json_patch(
    document: &mut Value,
    patch: &json_patch::Patch,
) -> std::result::Result<(), String> {
    apply_json_patch_within(document, patch, body::MAX_DEPTH)
}

/// [`apply_json_patch`] with the result nested at most `max_depth` deep.
pub(crate) fn apply_json_patch_within(
    document: &mut Value,
    patch: &json_patch::Patch,
    max_depth: usize,
) -> std::result::Result<(), String> {
    use json_patch::PatchOperation as Op;
    let mut copied = 0;
    for (index, operation) in patch.iter().enumerate() {
        let fail = |message: &str| format!("operation {index} ({}): {message}", op_name(operation));
        // How deep the operation's value will sit, and the value (None: nothing new deeper).
        let placed: Option<(usize, &Value)> = match operation {
            Op::Add(o) => Some((tokens(o.path.as_str()), &o.value)),
            Op::Replace(o) => Some((tokens(o.path.as_str()), &o.value)),
            Op::Move(o) if tokens(o.path.as_str()) > tokens(o.from.as_str()) => document
                .pointer(o.from.as_str())
                .map(|v| (tokens(o.path.as_str()), v)),
            Op::Copy(o) => document
                .pointer(o.from.as_str())
                .map(|v| (tokens(o.path.as_str()), v)),
            Op::Move(_) | Op::Remove(_) | Op::Test(_) => None,
        };
        if let Some((above, value)) = placed
            && above + body::value_depth(value, max_depth) > max_depth
        {
            return Err(fail(&body::too_deep_message()));
        }
        match operation {
            Op::Copy(copy) => {
                if let Some(value) = document.pointer(copy.from.as_str()) {
                    copied += json_len(value);
                    if copied > MAX_JSON_PATCH_COPY_BYTES {
                        return Err(format!(
                            "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                        ));
                    }
                }
            }
            Op::Test(test) => {
                return match document.pointer(test.path.as_str()) {
                    Some(found) if json_equal(found, &test.value) => continue,
                    Some(_) => Err(fail("value did not match")),
                    None => Err(fail("invalid pointer")),
                };
            }
            _ => {}
        }
        json_patch::patch(document, std::slice::from_ref(operation))
            .map_err(|e| fail(&e.kind.to_string()))?;
    }
    Ok(())
}

/// The reference tokens in a JSON pointer: how many arrays and objects hold what it names.
fn tokens(pointer: &str) -> usize {
    pointer.bytes().filter(|&b| b == b'/').count()
}

/// JSON equality as RFC 6902's `test` defines it: numbers by value, objects whatever their
/// key order; walked without recursion.
pub(crate) fn json_equal(a: &Value, b: &Value) -> bool {
    let mut pairs = vec![(a, b)];
    while let Some(pair) = pairs.pop() {
        match pair {
            (Value::Number(x), Value::Number(y)) => {
                let same = match (x.as_i64(), y.as_i64(), x.as_u64(), y.as_u64()) {
                    (Some(x), Some(y), _, _) => x == y,
                    (_, _, Some(x), Some(y)) => x == y,
                    _ => x.as_f64() == y.as_f64(),
                };
                if !same {
                    return false;
                }
            }
            (Value::Array(x), Value::Array(y)) => {
                if x.len() != y.len() {
                    return false;
                }
                pairs.extend(x.iter().zip(y));
            }
            (Value::Object(x), Value::Object(y)) => {
                if x.len() != y.len() {
                    return false;
                }
                for (key, value) in x {
                    match y.get(key) {
                        Some(other) => pairs.push((value, other)),
                        None => return false,
                    }
                }
            }
            (x, y) => {
                if x != y {
                    return false;
                }
            }
        }
    }
    true
}

pub(crate) fn op_name(operation: &json_patch::PatchOperation) -> String {
    use json_patch::PatchOperation as Op;
    let (op, path) = match operation {
        Op::Add(o) => ("add", &o.path),
        Op::Remove(o) => ("remove", &o.path),
        Op::Replace(o) => ("replace", &o.path),
        Op::Move(o) => ("move", &o.path),
        Op::Copy(o) => ("copy", &o.path),
        Op::Test(o) => ("test", &o.path),
    };
    format!("{op} {:?}", path.as_str())
}
