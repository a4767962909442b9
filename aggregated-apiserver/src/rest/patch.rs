//! JSON merge patches and JSON patches, with kube-apiserver's bounds.

use axum::http::{HeaderMap, header};
use serde_json::Value;

use super::body;
use super::decode;
use super::options::FieldValidation;
use crate::{
    error::{Error, Result},
    json_patch,
    render::negotiate::{self},
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
            "strategic merge patch is not supported for this server's resources (they are not built-in kinds); use a JSON merge patch (kubectl patch --type merge) or a JSON patch (--type json) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
        )),
        "application/apply-patch+yaml" => Ok(PatchType::Apply),
        "application/apply-patch+cbor" => Err(Error::UnsupportedMediaType(
            "server-side apply in CBOR is not supported by this server; send the configuration as application/apply-patch+yaml (YAML or JSON) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml".into(),
        )),
        other => Err(Error::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
        ))),
    }
}

/// What a patch made of the object, before it is decoded as the kind: the document, and the
/// strict-decoding errors of the patch itself (a JSON patch operation's unknown members).
pub(crate) struct Patched {
    pub(crate) document: Value,
    pub(crate) strict: Vec<String>,
}

/// Applies a patch to the object as it is served (its JSON), so a JSON patch `test` compares
/// against the values a GET shows, with [`crate::json_patch`]'s semantics and kube-apiserver's
/// errors: a patch that does not decode is 400, one that does not apply 422. A patch body may
/// nest [`body::MAX_DEPTH`] deep, and a JSON patch may build a result that deep: call inside
/// [`body::Work`].
pub(crate) fn apply_patch<K: ServedResource>(
    current: &Stored<K>,
    patch_type: PatchType,
    patch: &[u8],
    validation: FieldValidation,
) -> Result<Patched> {
    let mut document = body::parse_json(current.json())
        .map_err(|e| Error::Internal(format!("decoding the stored object: {e}")))?;
    let too_deep = |e: String| {
        if e == body::too_deep_message() {
            format!(
                "invalid character '{}' exceeded max depth",
                body::too_deep_bracket(patch)
            )
        } else {
            e
        }
    };
    let strict = validation != FieldValidation::Ignore;
    let mut unknown = Vec::new();
    match patch_type {
        PatchType::Merge => {
            let mut patch = body::parse_json(patch)
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {}", too_deep(e))))?;
            // kube-apiserver's strict decoding reads the patch as an object first.
            if strict && !patch.0.is_object() && !patch.0.is_null() {
                return Err(Error::BadRequest(format!(
                    "error decoding patch: json: cannot unmarshal {} into Go value of type map[string]interface {{}}",
                    go_type(&patch.0)
                )));
            }
            json_patch::merge(&mut document.0, std::mem::take(&mut patch.0))
                .map_err(|e| Error::BadRequest(e.into()))?;
        }
        PatchType::Json => {
            if body::text_depth(patch, body::MAX_DEPTH) > body::MAX_DEPTH {
                return Err(Error::BadRequest(format!(
                    "error decoding patch: {}",
                    too_deep(body::too_deep_message())
                )));
            }
            let operations = json_patch::Patch::decode(patch).map_err(|e| {
                if strict {
                    Error::BadRequest(format!(
                        "error decoding patch: {}",
                        e.replace("jsonpatch.Patch", "[]handlers.jsonPatchOp")
                            .replace("jsonpatch.Operation", "handlers.jsonPatchOp")
                    ))
                } else {
                    Error::BadRequest(e)
                }
            })?;
            if strict {
                unknown = operations
                    .strict_check()
                    .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            }
            // Counted before anything is applied, as kube-apiserver does.
            if operations.len() > MAX_JSON_PATCH_OPERATIONS {
                return Err(Error::RequestEntityTooLarge(format!(
                    "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {}",
                    operations.len()
                )));
            }
            let limits = json_patch::Limits {
                copy_bytes: MAX_JSON_PATCH_COPY_BYTES,
                depth: body::MAX_DEPTH,
            };
            operations
                .apply(&mut document.0, limits)
                .map_err(|e| Error::PatchNotApplied(e.to_string()))?;
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
    Ok(Patched {
        document: std::mem::take(&mut document.0),
        strict: unknown,
    })
}

/// Decodes a patch's result as the kind ([`decode::decode_from`]).
pub(crate) fn decode_patched<K: ServedResource>(
    patched: Patched,
    validation: FieldValidation,
) -> Result<(K, Vec<String>)> {
    decode::decode_from::<K>(
        patched.document,
        validation,
        decode::Source::Patch,
        patched.strict,
    )
}

/// Go's name for a JSON value's type in `json.Unmarshal` errors.
fn go_type(value: &Value) -> &'static str {
    match value {
        Value::Array(_) => "array",
        Value::String(_) => "string",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::Object(_) => "object",
        Value::Null => "null",
    }
}

/// kube-apiserver's bounds on a JSON patch (CVE-2019-1002100: each `copy` can double the
/// document): at most 10,000 operations, and at most 3 MiB added by copies in all.
pub(crate) const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
pub(crate) const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

pub(crate) use crate::json_patch::json_len;
