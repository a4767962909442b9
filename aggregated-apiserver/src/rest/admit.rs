//! A write's admission ([`crate::admission`]) from the REST verbs: the object as JSON for the
//! webhooks, their patches applied with a JSON patch's bounds, the result decoded again (the
//! caller then validates it as any write). Nothing is encoded when no webhook is configured.

use std::sync::Arc;

use axum::http::Extensions;
use serde_json::Value;

use super::{
    body::MAX_BODY_BYTES,
    decode::{Source, decode_object},
    kind_api::KindApi,
    options::FieldValidation,
    patch::json_len,
    strategy::Subresource,
};
use crate::{
    admission::{
        Attributes, ObjectJson, Operation, policy::mutating::Appliers, reinvocation::Passes,
    },
    auth::UserInfo,
    error::{Error, Result},
    resource::ServedResource,
};

/// How deep a webhook's patch may nest the object: far deeper than any Zebra needs, and shallow
/// enough that the object can be cloned, compared and dropped on an async worker's stack (a
/// client's own patches, which may nest 10,000 deep, are applied on the deep-stack pool).
const WEBHOOK_PATCH_DEPTH: usize = 100;

/// Applies a webhook's patch within [`WEBHOOK_PATCH_DEPTH`].
fn apply_webhook_patch(
    document: &mut Value,
    patch: &crate::json_patch::Patch,
) -> std::result::Result<(), crate::json_patch::ApplyError> {
    let limits = crate::json_patch::Limits {
        copy_bytes: super::patch::MAX_JSON_PATCH_COPY_BYTES,
        depth: WEBHOOK_PATCH_DEPTH,
    };
    patch.apply(document, limits)
}

/// Who sent a write: the edge leaves the authenticated user on every request other than a GET
/// that it routes to a resource endpoint.
pub(crate) fn user_of(extensions: &Extensions) -> Option<Arc<UserInfo>> {
    extensions.get::<Arc<UserInfo>>().cloned()
}

/// `object`'s top-level `fields` (all for None) as JSON; None converts to null.
fn json_fields<K: ServedResource>(
    object: Option<&K>,
    fields: Option<&[String]>,
) -> std::result::Result<Value, String> {
    object.map_or(Ok(Value::Null), |object| {
        super::partial_json::to_json_fields(object, fields).map_err(|e| e.to_string())
    })
}

fn to_json<K: ServedResource>(object: &K) -> Result<Value> {
    serde_json::to_value(object)
        .map_err(|e| Error::Internal(format!("encoding the object for admission: {e}")))
}

/// The attributes of a write of `K` by the request's `user`.
pub(crate) fn attributes<'a, K: ServedResource>(
    operation: Operation,
    part: Subresource,
    namespace: &'a str,
    name: &'a str,
    user: Option<&'a UserInfo>,
    dry_run: bool,
    options: Value,
) -> Attributes<'a> {
    let mut attributes = Attributes::of::<K>(
        operation,
        match part {
            Subresource::Object => "",
            Subresource::Status => "status",
        },
        namespace,
        name,
    );
    attributes.user = user;
    attributes.dry_run = dry_run;
    attributes.options = options;
    attributes.numbers = Some(super::field_managers::numbers_of::<K>());
    attributes
}

/// The options of a create or update as webhooks see them.
pub(crate) fn write_options(dry_run: bool, manager: &str) -> Value {
    let mut options = serde_json::json!({ "fieldManager": manager });
    if dry_run {
        options["dryRun"] = serde_json::json!(["All"]);
    }
    options
}

/// A create's admission once its managed fields are set: mutating admission (an object it
/// changed is prepared again, as the client's body was; `renamed` says whether it may take
/// another name, as a POST's may and an apply's may not), validation, then validating
/// admission, which sees the name as stored. The warnings go to `warnings`.
pub(crate) async fn admit_create<K: ServedResource>(
    api: &KindApi<K>,
    attributes: Attributes<'_>,
    object: &mut K,
    renamed: bool,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let (mutated, changed) = mutate(api, &attributes, object, None)
        .await
        .map_err(|e| e.with_warnings(warnings))?;
    warnings.extend(mutated);
    if changed {
        object.meta_mut().uid = None;
        super::strategy::prepare_create(object, attributes.namespace)?;
        if !renamed {
            super::strategy::check_name(object, attributes.name)?;
        }
    }
    warnings.extend(super::strategy::validate(object, None)?);
    let name = object.meta().name.clone().unwrap_or_default();
    let attributes = Attributes {
        name: &name,
        ..attributes
    };
    let validated = validate(api, &attributes, Some(object), None)
        .await
        .map_err(|e| e.with_warnings(warnings))?;
    warnings.extend(validated);
    Ok(())
}

/// Mutating admission of `object` (`old`: the stored object of an update): the
/// MutatingAdmissionPolicies, then the mutating webhooks, then the policies with
/// `reinvocationPolicy: IfNeeded` again if the webhooks changed the object. Returns the
/// webhooks' warnings, and whether the object changed (which the caller then prepares and
/// validates again).
pub(crate) async fn mutate<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: &mut K,
    old: Option<&K>,
) -> Result<(Vec<String>, bool)> {
    crate::observe::telemetry::in_span_async(
        "admission",
        Some(("admission.phase", "mutating")),
        mutate_untraced(api, attributes, object, old),
    )
    .await
}

async fn mutate_untraced<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: &mut K,
    old: Option<&K>,
) -> Result<(Vec<String>, bool)> {
    let admission = &api.ctx.admission;
    let policies = match admission.mutating_policies() {
        Some(policies) if policies.any(attributes).await? => Some(policies),
        _ => None,
    };
    let webhooks = match admission.webhooks() {
        Some(webhooks) if webhooks.any_mutating(attributes).await? => Some(webhooks),
        _ => None,
    };
    if policies.is_none() && webhooks.is_none() {
        return Ok((Vec::new(), false));
    }
    let mut json = to_json(object)?;
    let before = json.clone();
    let old = old.map(to_json).transpose()?;
    let fields = &api.fields;
    let merge = |live: &Value, config: &Value| fields.merge_configuration(live, config);
    let appliers = Appliers {
        json_patch: &apply_webhook_patch,
        apply_configuration: &merge,
    };
    // The mutating plugins run once, and once more if one changed the object (see
    // `admission::reinvocation`).
    let mut passes = Passes::default();
    let mut warnings = Vec::new();
    loop {
        if let Some(policies) = policies {
            policies
                .mutate(attributes, &mut json, old.as_ref(), &appliers, &mut passes)
                .await
                .map_err(|e| e.with_warnings(&warnings))?;
        }
        if let Some(webhooks) = webhooks {
            let said = webhooks
                .mutate(
                    attributes,
                    &mut json,
                    old.as_ref(),
                    &apply_webhook_patch,
                    &mut passes,
                )
                .await
                .map_err(|e| e.with_warnings(&warnings))?;
            warnings.extend(said);
        }
        if passes.again || !passes.changed {
            break;
        }
        passes.again = true;
    }
    let changed = json != before;
    if changed {
        let size = json_len(&json);
        if size > MAX_BODY_BYTES {
            return Err(Error::RequestEntityTooLarge(format!(
                "the object admission mutated would be {size} bytes, limit is {MAX_BODY_BYTES}"
            )));
        }
        let (mutated, _) = decode_object::<K>(json, FieldValidation::Ignore, Source::Update)
            .map_err(|e| {
                Error::Internal(format!("the object admission mutated cannot be read: {e}"))
            })?;
        *object = mutated;
    }
    Ok((warnings, changed))
}

/// Admission of a delete of `old`: mutating webhooks (which may refuse, not patch), then
/// validating ones. Returns their warnings.
pub(crate) async fn delete<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    old: &K,
) -> Result<Vec<String>> {
    crate::observe::telemetry::in_span_async(
        "admission",
        Some(("admission.phase", "delete")),
        delete_untraced(api, attributes, old),
    )
    .await
}

async fn delete_untraced<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    old: &K,
) -> Result<Vec<String>> {
    let mut warnings = Vec::new();
    if let Some(webhooks) = api.ctx.admission.webhooks()
        && webhooks.any_mutating(attributes).await?
    {
        let old = to_json(old)?;
        let mut nothing = Value::Null;
        warnings.extend(
            webhooks
                .mutate(
                    attributes,
                    &mut nothing,
                    Some(&old),
                    &apply_webhook_patch,
                    &mut Passes::default(),
                )
                .await?,
        );
    }
    warnings.extend(validate(api, attributes, None, Some(old)).await?);
    Ok(warnings)
}

/// Validating admission: `object` is None on a delete (`old` is the object deleted). Returns
/// the webhooks' warnings.
pub(crate) async fn validate<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: Option<&K>,
    old: Option<&K>,
) -> Result<Vec<String>> {
    crate::observe::telemetry::in_span_async(
        "admission",
        Some(("admission.phase", "validating")),
        validate_untraced(api, attributes, object, old),
    )
    .await
}

async fn validate_untraced<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: Option<&K>,
    old: Option<&K>,
) -> Result<Vec<String>> {
    let admission = &api.ctx.admission;
    let policies = match admission.policies() {
        Some(policies) if policies.any(attributes).await? => Some(policies),
        _ => None,
    };
    let webhooks = match admission.webhooks() {
        Some(webhooks) if webhooks.any_validating(attributes).await? => Some(webhooks),
        _ => None,
    };
    if policies.is_none() && webhooks.is_none() {
        return Ok(Vec::new());
    }
    let (has_object, has_old) = (object.is_some(), old.is_some());
    // Converted as far as the policies read them, shared by every policy's scope.
    let make_object = |fields: Option<&[String]>| json_fields(object, fields);
    let make_old = |fields: Option<&[String]>| json_fields(old, fields);
    let (object, old) = (ObjectJson::new(&make_object), ObjectJson::new(&make_old));
    let (object, old) = (has_object.then_some(&object), has_old.then_some(&old));
    // ValidatingAdmissionPolicy, then the validating webhooks (kube-apiserver's plugin order).
    let mut warnings = Vec::new();
    if let Some(policies) = policies {
        warnings.extend(policies.validate(attributes, object, old).await?);
    }
    if let Some(webhooks) = webhooks {
        let whole = |json: Option<&ObjectJson<'_>>| {
            json.map(|j| j.get(None))
                .transpose()
                .map_err(|e| Error::Internal(format!("encoding the object for admission: {e}")))
        };
        let (object, old) = (whole(object)?, whole(old)?);
        let validated = webhooks
            .validate(attributes, object.as_deref(), old.as_deref())
            .await
            .map_err(|e| e.with_warnings(&warnings))?;
        warnings.extend(validated);
    }
    Ok(warnings)
}

/// Admission of an update of `current` to `object` (prepared, its managed fields updated):
/// the mutating webhooks (the name must stay the path's, as metadata.name is immutable; a
/// status write keeps only the status; what the server owns is put back), the kind's own
/// validation, then the validating webhooks. Warnings are added to `warnings`, and carried by
/// an admission refusal.
pub(crate) async fn admit_update<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: &mut K,
    current: &K,
    part: Subresource,
    warnings: &mut Vec<String>,
) -> Result<()> {
    let resource_version = object.meta().resource_version.clone();
    let (mutated, changed) = mutate(api, attributes, object, Some(current))
        .await
        .map_err(|e| e.with_warnings(warnings))?;
    warnings.extend(mutated);
    if changed {
        super::strategy::check_name(object, attributes.name)?;
        // The resourceVersion the write compares with is the one the request read, not one a
        // webhook made up (which would fail the write again and again).
        object.meta_mut().resource_version = resource_version;
        if part == Subresource::Status {
            let sent = std::mem::replace(object, current.clone());
            // The write's managed fields, as the status strategy keeps the new object's.
            let managed = sent.meta().managed_fields.clone();
            *object = super::strategy::written_part(sent, current, part);
            object.meta_mut().managed_fields = managed;
        }
        super::strategy::prepare_update(object, current, part)?;
    }
    warnings.extend(super::strategy::validate(object, Some(current))?);
    let validated = validate(api, attributes, Some(object), Some(current))
        .await
        .map_err(|e| e.with_warnings(warnings))?;
    warnings.extend(validated);
    Ok(())
}
