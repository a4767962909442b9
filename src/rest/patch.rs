//! JSON merge patches and JSON patches, with kube-apiserver's bounds.

use axum::http::{HeaderMap, header};
use serde::Serialize;
use serde_json::Value;

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
/// against the values a GET shows.
pub(crate) fn apply_patch<K: ServedResource>(
    current: &Stored<K>,
    patch_type: PatchType,
    patch: &[u8],
) -> Result<Value> {
    let mut document: Value = serde_json::from_slice(current.json())
        .map_err(|e| Error::Internal(format!("decoding the stored object: {e}")))?;
    match patch_type {
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(patch)
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(Error::BadRequest(
                    "error decoding patch: a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut document, &patch);
        }
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            apply_json_patch(&mut document, &patch).map_err(|message| Error::Invalid {
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
    Ok(document)
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

/// Applies `patch` an operation at a time, refusing a copy that would take the bytes copied
/// past [`MAX_JSON_PATCH_COPY_BYTES`] before it is made. The error is the message.
pub(crate) fn apply_json_patch(
    document: &mut Value,
    patch: &json_patch::Patch,
) -> std::result::Result<(), String> {
    let mut copied = 0;
    for (index, operation) in patch.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(copy) = operation
            && let Some(value) = document.pointer(copy.from.as_str())
        {
            copied += json_len(value);
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(format!(
                    "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                ));
            }
        }
        json_patch::patch(document, std::slice::from_ref(operation))
            .map_err(|e| format!("operation {index} ({}): {}", op_name(operation), e.kind))?;
    }
    Ok(())
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
