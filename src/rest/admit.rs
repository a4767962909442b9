//! A write's admission ([`crate::admission`]) from the REST verbs: the object as JSON for the
//! webhooks, their patches applied with a JSON patch's bounds, the result decoded again (the
//! caller then validates it as any write). Nothing is encoded when no webhook is configured.

use std::sync::Arc;

use axum::http::Extensions;
use serde_json::Value;

use super::{
    KindApi,
    options::FieldValidation,
    patch::apply_json_patch,
    strategy::{Part, decode_object},
};
use crate::{
    admission::{Attributes, Operation},
    auth::UserInfo,
    error::{Error, Result},
    resource::ServedResource,
};

/// Who sent the request: the edge leaves the authenticated user on every request it routes to
/// a resource endpoint.
pub(crate) fn user_of(extensions: &Extensions) -> Option<Arc<UserInfo>> {
    extensions.get::<Arc<UserInfo>>().cloned()
}

fn to_json<K: ServedResource>(object: &K) -> Result<Value> {
    serde_json::to_value(object)
        .map_err(|e| Error::Internal(format!("encoding the object for admission: {e}")))
}

/// The attributes of a write of `K` by the request's `user`.
pub(crate) fn attributes<'a, K: ServedResource>(
    operation: Operation,
    part: Part,
    namespace: &'a str,
    name: &'a str,
    user: Option<&'a UserInfo>,
    dry_run: bool,
    options: Value,
) -> Attributes<'a> {
    let mut attributes = Attributes::of::<K>(
        operation,
        match part {
            Part::Object => "",
            Part::Status => "status",
        },
        namespace,
        name,
    );
    attributes.user = user;
    attributes.dry_run = dry_run;
    attributes.options = options;
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

/// Mutating admission of `object` (`old`: the stored object of an update). Returns the
/// webhooks' warnings, and whether they changed the object (which the caller then prepares
/// and validates again).
pub(crate) async fn mutate<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: &mut K,
    old: Option<&K>,
) -> Result<(Vec<String>, bool)> {
    let Some(webhooks) = api.ctx.admission.webhooks() else {
        return Ok((Vec::new(), false));
    };
    if !webhooks.any_mutating(attributes).await? {
        return Ok((Vec::new(), false));
    }
    let mut json = to_json(object)?;
    let before = json.clone();
    let old = old.map(to_json).transpose()?;
    let warnings = webhooks
        .mutate(attributes, &mut json, old.as_ref(), &|document, patch| {
            apply_json_patch(document, patch)
        })
        .await?;
    let changed = json != before;
    if changed {
        let (mutated, _) = decode_object::<K>(json, FieldValidation::Ignore).map_err(|e| {
            Error::Internal(format!(
                "the object admission webhooks patched cannot be read: {e}"
            ))
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
    let Some(webhooks) = api.ctx.admission.webhooks() else {
        return Ok(Vec::new());
    };
    let mut warnings = Vec::new();
    if webhooks.any_mutating(attributes).await? {
        let old = to_json(old)?;
        let mut nothing = Value::Null;
        warnings.extend(
            webhooks
                .mutate(attributes, &mut nothing, Some(&old), &|document, patch| {
                    apply_json_patch(document, patch)
                })
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
    let Some(webhooks) = api.ctx.admission.webhooks() else {
        return Ok(Vec::new());
    };
    if !webhooks.any_validating(attributes).await? {
        return Ok(Vec::new());
    }
    let object = object.map(to_json).transpose()?;
    let old = old.map(to_json).transpose()?;
    webhooks
        .validate(attributes, object.as_ref(), old.as_ref())
        .await
}

/// Mutating admission of an update of `current` (to `object`, the object the request makes):
/// the name must stay the path's (kube-apiserver: metadata.name is immutable); the caller then
/// prepares the object, which puts back what the server owns (uid, creationTimestamp, ...).
pub(crate) async fn mutate_update<K: ServedResource>(
    api: &KindApi<K>,
    attributes: &Attributes<'_>,
    object: &mut K,
    current: &K,
    name: &str,
) -> Result<Vec<String>> {
    let (warnings, changed) = mutate(api, attributes, object, Some(current)).await?;
    if changed {
        super::strategy::check_name(object, name)?;
    }
    Ok(warnings)
}
