//! What a request body, or a patch's result, is decoded into, as kube-apiserver decodes a
//! custom resource: the object and the warnings its unknown fields give, or why it is not an
//! object of the kind (400 for what is no object of the kind's apiVersion at all; 422 with a
//! cause per field for what does not fit its schema, [`structural`]).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Deserialize;
use serde_json::Value;

use super::body;
use super::options::FieldValidation;
use super::strategy::{generate_name, new_name_causes};
use super::structural;
use crate::{
    error::{Error, FieldError, Result, Subject},
    render::negotiate::BodyFormat,
    resource::ServedResource,
    resource::validation,
};

pub(crate) fn cannot_handle<K: ServedResource>(detail: impl std::fmt::Display) -> Error {
    Error::BadRequest(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: {detail}",
        kind = K::kind_name(),
        version = K::version(&()),
    ))
}

/// Where an object being decoded came from: a request body that creates or replaces an
/// object, or a patch's result, whose decoding errors kube-apiserver words as an invalid
/// `patch`. An update's (or patch's) metadata is validated as kube-apiserver validates an
/// update's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Create,
    Update,
    Patch,
    /// A server-side apply's merged object, of an object that `exists` or not. Its nulls are
    /// no absent fields: kube-apiserver types the configuration before it prunes anything.
    Apply {
        exists: bool,
    },
}

impl Source {
    /// Whether the object replaces a stored one.
    fn is_update(self) -> bool {
        !matches!(self, Source::Create | Source::Apply { exists: false })
    }
}

/// Decodes a JSON object into `K`: apiVersion and kind must name this kind; unknown fields are
/// rejected, reported or dropped per `fieldValidation`; the object is held to
/// [`check_shallow`]; empty metadata collections are dropped (apimachinery's `omitempty`).
/// Returns the object and the warnings.
pub(crate) fn decode_object<K: ServedResource>(
    value: Value,
    validation: FieldValidation,
    source: Source,
) -> Result<(K, Vec<String>)> {
    decode_from::<K>(value, validation, source, Vec::new())
}

/// [`decode_object`] of a body or a patch's result (`source`), with `strict` errors found
/// before (a JSON patch's unknown members), as kube-apiserver decodes a custom resource: a
/// wrong `kind` or a body that does not fit the kind's schema is 422 `Invalid` with a cause
/// per field ([`structural`]); a wrong apiVersion, a missing kind or metadata that is not
/// ObjectMeta is 400.
pub(crate) fn decode_from<K: ServedResource>(
    mut value: Value,
    validation: FieldValidation,
    source: Source,
    strict: Vec<String>,
) -> Result<(K, Vec<String>)> {
    let Value::Object(map) = &mut value else {
        return Err(match source {
            Source::Patch => invalid_patch(&value, "the result is not a JSON object"),
            _ => cannot_handle::<K>("the body must be a JSON object"),
        });
    };
    if map
        .get("kind")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        return Err(match source {
            Source::Patch => invalid_patch(&Value::Object(map.clone()), "Object 'Kind' is missing"),
            _ => cannot_handle::<K>("Object 'Kind' is missing in the body"),
        });
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(version) if version == K::group_version() => {}
        other => {
            let error = cannot_handle::<K>(format!(
                "the API version in the data ({}) does not match the expected API version ({})",
                other.unwrap_or(""),
                K::group_version()
            ));
            // Another version of the group: kube-apiserver decodes it with no schema first,
            // and names every field but the object's type and metadata as unknown.
            let group = K::group_version();
            let group = group.split('/').next().unwrap_or_default();
            let same_group = other
                .and_then(|v| v.split_once('/'))
                .is_some_and(|(g, _)| g == group);
            let same_kind = map.get("kind").and_then(Value::as_str) == Some(&K::kind_name());
            if same_group && same_kind && validation == FieldValidation::Warn {
                let mut warnings: Vec<String> = map
                    .keys()
                    .filter(|k| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata"))
                    .map(|k| format!("unknown field \"{k}\""))
                    .collect();
                warnings.sort();
                if !warnings.is_empty() {
                    return Err(Error::Warned {
                        error: Box::new(error),
                        warnings,
                    });
                }
            }
            return Err(error);
        }
    }
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            return Err(cannot_handle::<K>("Object 'Kind' is missing in the body"));
        }
        Some(kind) if kind != K::kind_name() => {
            let name = map
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("");
            let mut causes = vec![FieldError::invalid(
                "kind",
                format!("{kind:?}"),
                &format!("must be {}", K::kind_name()),
            )];
            // An update's metadata is checked before the kind's rules stop at its kind
            // (kube-apiserver's `validateCommonFields`, twice over).
            if source.is_update()
                && let Some(Ok(meta)) = map
                    .get("metadata")
                    .map(|m| serde_json::from_value::<ObjectMeta>(m.clone()))
            {
                let once = validation::validate_metadata(&meta);
                causes.extend(once.clone());
                causes.extend(once);
                causes.extend(validation::validate_finalizers(&meta));
            }
            return Err(Error::Invalid {
                subject: Subject {
                    kind: kind.to_owned(),
                    ..K::invalid_subject(name)
                },
                causes,
            });
        }
        Some(_) => {}
    }
    if let Some(Value::Object(meta)) = map.get_mut("metadata") {
        go_nulls(meta);
    }
    let mut unknown = Vec::new();
    let decoded = serde_ignored::deserialize(&value, |path| {
        let path = path.to_string();
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    });
    let mut object: K = match decoded {
        Ok(object) => object,
        Err(e) => {
            // Unknown fields are found as the body is decoded, before it is validated.
            let schema = structural::schema_of::<K>();
            let unknown_fields = structural::unknown_fields(&value, &schema);
            if validation == FieldValidation::Strict
                && !(strict.is_empty() && unknown_fields.is_empty())
            {
                let mut messages = strict;
                messages.extend(
                    unknown_fields
                        .iter()
                        .map(|p| format!("unknown field \"{p}\"")),
                );
                let why = format!("strict decoding error: {}", messages.join(", "));
                return Err(match source {
                    Source::Patch => invalid_patch(&value, &why),
                    _ => cannot_handle::<K>(why),
                });
            }
            let error = not_of_kind::<K>(&value, e, source);
            // The unknown fields it has, as kube-apiserver names them beside its 422 (once its
            // metadata decoded: pruning comes after).
            let metadata_decodes = value
                .get("metadata")
                .is_none_or(|meta| ObjectMeta::deserialize(meta).is_ok());
            if validation == FieldValidation::Warn && metadata_decodes && is_invalid(&error) {
                let mut warnings = strict;
                warnings.extend(
                    unknown_fields
                        .into_iter()
                        .map(|p| format!("unknown field \"{p}\"")),
                );
                let error = match error {
                    Error::Warned {
                        error,
                        warnings: more,
                    } => {
                        warnings.extend(more);
                        *error
                    }
                    error => error,
                };
                return Err(error.warned(&warnings));
            }
            return Err(error);
        }
    };
    drop_empty(object.meta_mut());
    let deduplicated = dedup_owner_references(object.meta_mut(), source);
    check_shallow(&object)?;
    let mut messages = strict;
    messages.extend(unknown.iter().map(|p| format!("unknown field \"{p}\"")));
    let mut warnings = match validation {
        FieldValidation::Strict if !messages.is_empty() => {
            return Err(match source {
                Source::Patch => invalid_patch(
                    &value,
                    &format!("strict decoding error: {}", messages.join(", ")),
                ),
                _ => cannot_handle::<K>(format!("strict decoding error: {}", messages.join(", "))),
            });
        }
        FieldValidation::Warn => messages,
        _ => Vec::new(),
    };
    warnings.extend(deduplicated);
    Ok((object, warnings))
}

/// kube-apiserver's 422 for a patch whose result it cannot take: `patch` invalid, its value
/// the patched object, about no kind or object.
fn invalid_patch(patched: &Value, why: &str) -> Error {
    Error::Invalid {
        subject: Subject::default(),
        causes: vec![FieldError::invalid(
            "patch",
            format!("{:?}", patched.to_string()),
            why,
        )],
    }
}

/// Why a JSON object with this kind's apiVersion and kind is not one of its objects: metadata
/// that is not ObjectMeta is 400 (as kube-apiserver's decoder says); otherwise the metadata's
/// and the schema's causes, 422, as a CRD of the same schema answers.
fn not_of_kind<K: ServedResource>(
    value: &Value,
    error: serde_json::Error,
    source: Source,
) -> Error {
    let mut meta: ObjectMeta = match value.get("metadata") {
        None => ObjectMeta::default(),
        Some(meta) => match serde_json::from_value(meta.clone()) {
            Ok(meta) => meta,
            Err(e) if source == Source::Patch => {
                return invalid_patch(value, &format!("json: {e}"));
            }
            Err(e) => return cannot_handle::<K>(e),
        },
    };
    let deduplicated = dedup_owner_references(&mut meta, source);
    let schema = structural::validate(
        value,
        &structural::schema_of::<K>(),
        !matches!(source, Source::Apply { .. }),
    );
    if schema.is_empty() {
        return cannot_handle::<K>(error);
    }
    let mut name = meta.name.clone().unwrap_or_default();
    let mut causes = Vec::new();
    if source.is_update() {
        // An update: its name is the stored object's; its metadata is checked three times
        // ([`validate`]).
        let once = validation::validate_metadata(&meta);
        for _ in 0..3 {
            causes.extend(once.iter().cloned());
        }
        causes.extend(validation::validate_finalizers(&meta));
        causes.extend(schema);
        return Error::Invalid {
            subject: K::invalid_subject(&name),
            causes,
        }
        .warned(deduplicated.as_slice());
    }
    // As kube-apiserver validates after it generated the name.
    match meta.generate_name.as_deref() {
        Some(prefix) if name.is_empty() && !prefix.is_empty() => name = generate_name(prefix),
        _ => {}
    }
    causes.extend(new_name_causes(&name, &meta));
    causes.extend(validation::validate_metadata(&meta));
    causes.extend(validation::validate_finalizers(&meta));
    causes.extend(schema);
    Error::Invalid {
        subject: K::invalid_subject(&name),
        causes,
    }
    .warned(deduplicated.as_slice())
}

/// How kube-apiserver's warning of owner references given twice begins.
pub(crate) const DUPLICATE_OWNERS: &str = ".metadata.ownerReferences contains duplicate entries";

/// apiserver's `dedupOwnerReferences`: an owner reference given twice (the same uid, the same
/// whole reference) is kept once, with kube-apiserver's warning (a patch's worded as after
/// mutating admission, where kube-apiserver dedups a patch).
fn dedup_owner_references(meta: &mut ObjectMeta, source: Source) -> Option<String> {
    let references = meta.owner_references.as_mut()?;
    let mut kept: Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference> =
        Vec::with_capacity(references.len());
    let mut duplicates = Vec::new();
    for reference in references.drain(..) {
        if kept.contains(&reference) {
            duplicates.push(reference.uid);
        } else {
            kept.push(reference);
        }
    }
    *references = kept;
    if duplicates.is_empty() {
        return None;
    }
    let after = if source == Source::Patch {
        " after mutating admission happens"
    } else {
        ""
    };
    Some(format!(
        "{DUPLICATE_OWNERS}{after}; API server dedups owner references in 1.20+, and may reject such requests as early as 1.24; please fix your requests; duplicate UID(s) observed: {}",
        duplicates.join(", ")
    ))
}

/// Go's decoding of `null` where ObjectMeta has a string: an empty string (a label or
/// annotation value, a finalizer).
fn go_nulls(meta: &mut serde_json::Map<String, Value>) {
    for field in ["labels", "annotations"] {
        if let Some(Value::Object(map)) = meta.get_mut(field) {
            for value in map.values_mut().filter(|v| v.is_null()) {
                *value = Value::String(String::new());
            }
        }
    }
    if let Some(Value::Array(items)) = meta.get_mut("finalizers") {
        for value in items.iter_mut().filter(|v| v.is_null()) {
            *value = Value::String(String::new());
        }
    }
}

/// ObjectMeta's `omitempty` collections: an empty one is no collection, as apimachinery
/// stores and serves it.
pub(crate) fn drop_empty(meta: &mut ObjectMeta) {
    if meta.labels.as_ref().is_some_and(|m| m.is_empty()) {
        meta.labels = None;
    }
    if meta.annotations.as_ref().is_some_and(|m| m.is_empty()) {
        meta.annotations = None;
    }
    if meta.finalizers.as_ref().is_some_and(|f| f.is_empty()) {
        meta.finalizers = None;
    }
    if meta.owner_references.as_ref().is_some_and(|o| o.is_empty()) {
        meta.owner_references = None;
    }
}

/// A create or update body, decoded: the object (or why the body is not a valid one of the
/// kind, 422, which an update answers only once the object is known to exist, as
/// kube-apiserver validates after it reads the object), and whether it named a
/// resourceVersion.
pub(crate) struct DecodedBody<K> {
    pub(crate) object: Result<(K, Vec<String>)>,
    pub(crate) resource_version: bool,
    /// `metadata.name` and `metadata.namespace` as sent ("" when absent), for an update.
    pub(crate) name: String,
    pub(crate) namespace: String,
}

/// Decodes a create or update body into `K` (see [`decode_object`]), nested at most
/// [`body::MAX_DEPTH`] deep. May be deep: call inside [`body::Work`]. A body that is not
/// JSON (or YAML), or not of this kind's apiVersion, is refused at once (400).
pub(crate) fn decode_body<K: ServedResource>(
    bytes: &[u8],
    format: BodyFormat,
    validation: FieldValidation,
    source: Source,
) -> Result<DecodedBody<K>> {
    let parsed = match format {
        BodyFormat::Json => body::parse_json(bytes),
        BodyFormat::Yaml => body::parse_yaml(bytes),
    };
    let mut value = parsed.map_err(|message| {
        if message == body::too_deep_message() || message == body::YAML_TOO_DEEP {
            unrecognized::<K>(bytes, &message)
        } else {
            cannot_handle::<K>(message)
        }
    })?;
    let resource_version = names_resource_version(&value.0);
    // A PUT checks them before it decodes anything else.
    let meta = |field: &str| match source {
        Source::Update => value.0["metadata"][field]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
        _ => String::new(),
    };
    let (name, namespace) = (meta("name"), meta("namespace"));
    match decode_object::<K>(std::mem::take(&mut value.0), validation, source) {
        Err(e) if !is_invalid(&e) => Err(e),
        object => Ok(DecodedBody {
            object,
            resource_version,
            name,
            namespace,
        }),
    }
}

/// Whether `error` is a 422 `Invalid` (warned of or not).
fn is_invalid(error: &Error) -> bool {
    match error {
        Error::Invalid { .. } => true,
        Error::Warned { error, .. } => is_invalid(error),
        _ => false,
    }
}

/// Whether a body names a resourceVersion (an update's precondition), read as decoded.
pub(crate) fn names_resource_version(value: &Value) -> bool {
    value
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .is_some_and(|rv| !rv.is_empty())
}

/// kube-apiserver's answer to a body its decoder could not read the kind of (a body nested
/// too deep): the error and the body's first 30 bytes (in hex unless it starts as an object).
fn unrecognized<K: ServedResource>(bytes: &[u8], error: &str) -> Error {
    let head = &bytes[..bytes.len().min(30)];
    let more = if bytes.len() > 30 { " ..." } else { "" };
    let summary = match bytes.first() {
        None => "<empty>".to_owned(),
        Some(b'{') => format!("{}{more}", String::from_utf8_lossy(head)),
        Some(_) => format!("{}{more}", hex::encode(head)),
    };
    let error = match error.strip_prefix("json: ") {
        Some(_) => format!(
            "json parse error: invalid character '{}' exceeded max depth",
            body::too_deep_bracket(bytes)
        ),
        None => error.to_owned(),
    };
    Error::BadRequest(format!(
        "the object provided is unrecognized (must be of type {}): couldn't get version/kind; {error} ({summary})",
        K::kind_name()
    ))
}

/// How deep a managed fields entry's `fieldsV1` may nest: no object of ours nests its own
/// fields this deep, and the stored object stays well under [`body::SHALLOW`].
pub(crate) const MAX_FIELDS_V1_DEPTH: usize = 64;

/// Refuses an object that would carry a value deeper than [`MAX_FIELDS_V1_DEPTH`] out of the
/// body's work: its one free-form field is a managed fields entry's `fieldsV1`.
fn check_shallow<K: ServedResource>(object: &K) -> Result<()> {
    let entries = object.meta().managed_fields.as_deref().unwrap_or_default();
    for (index, entry) in entries.iter().enumerate() {
        if let Some(fields) = &entry.fields_v1
            && body::value_depth(&fields.0, MAX_FIELDS_V1_DEPTH) > MAX_FIELDS_V1_DEPTH
        {
            return Err(Error::BadRequest(format!(
                "metadata.managedFields[{index}].fieldsV1: nested deeper than {MAX_FIELDS_V1_DEPTH} levels"
            )));
        }
    }
    Ok(())
}
