//! create, update, patch, delete and deletecollection.

use std::sync::Arc;

use axum::{body::Bytes, extract::Request, http::StatusCode, response::Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use super::fields::{manager_or_user_agent, parse_apply_body};
use super::options::{FieldValidation, dry_run_of, parse_delete_options, parse_query};
use super::patch::{PatchType, apply_patch, json_len, patch_type};
use super::response::{json_response, object_response, with_warnings};
use super::strategy::{
    Part, UidSent, check_name, check_namespace, check_shallow, check_uid, decode_body,
    decode_object, prepare_create, prepare_update, validate, written_part,
};
use super::{KindApi, MAX_BODY_BYTES, body};
use crate::{
    error::{Error, FieldError, Result},
    list_body::{self},
    negotiate::{self, Output},
    resource::{ObjectKey, ServedResource},
    store::{ListRequest, Object, Preconditions, UpdateFrom, WritableStore},
    table::IncludeObject,
};

pub(crate) async fn create<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let (manager, _) = query.field_manager("CreateOptions", None)?;
    let manager = manager_or_user_agent(manager, &headers);
    let output = negotiate::output(&headers)?;
    let format = negotiate::body_format(&headers)?;
    let body = body::read(body).await?;
    let (mut object, warnings) = api
        .ctx
        .work
        .run(&body, move |body| {
            decode_body::<K>(&body, format, field_validation)
        })
        .await?;
    prepare_create(&mut object, &namespace)?;
    let mut warnings = warnings;
    warnings.extend(validate(&object, None)?);
    api.fields()?
        .update(Part::Object, None, &mut object, &manager)?;
    let created = api.writer()?.create(object, dry_run).await?;
    let response = object_response(
        &created,
        output,
        IncludeObject::Metadata,
        StatusCode::CREATED,
    )?;
    Ok(with_warnings(response, &warnings))
}

pub(crate) async fn update<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    part: Part,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let (manager, _) = query.field_manager("UpdateOptions", None)?;
    let manager = manager_or_user_agent(manager, &headers);
    let output = negotiate::output(&headers)?;
    let format = negotiate::body_format(&headers)?;
    let body = body::read(body).await?;
    let (object, warnings) = api
        .ctx
        .work
        .run(&body, move |body| {
            decode_body::<K>(&body, format, field_validation)
        })
        .await?;
    check_name(&object, &name)?;
    check_namespace(&object, &namespace)?;
    if object
        .meta()
        .resource_version
        .as_deref()
        .unwrap_or("")
        .is_empty()
    {
        return Err(Error::Invalid {
            subject: K::invalid_subject(&name),
            causes: vec![FieldError::invalid(
                "metadata.resourceVersion",
                "0x0",
                "must be specified for an update",
            )],
        });
    }
    let key = ObjectKey::new(&namespace, &name);
    let writer = api.writer()?;
    let mut from = first_read(writer);
    let (updated, warnings) = loop {
        let attempt = async {
            let current = writer.get_for_update(&key, from).await?;
            check_uid(&object, current.as_ref(), UidSent::Precondition)?;
            let mut object = written_part(object.clone(), current.as_ref(), part);
            prepare_update(&mut object, current.as_ref(), part);
            let mut warnings = warnings.clone();
            warnings.extend(validate(&object, Some(current.as_ref()))?);
            api.fields()?
                .update(part, Some(&current), &mut object, &manager)?;
            let updated = update_unless_unchanged(writer, object, &current, dry_run).await?;
            Ok::<_, Error>((updated, warnings))
        };
        match attempt.await {
            // A stale copy: once more from the source, where a failure is the client's.
            Err(_) if from == UpdateFrom::Cache => from = UpdateFrom::Source,
            result => break result?,
        }
    };
    let response = object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
    Ok(with_warnings(response, &warnings))
}

pub(crate) async fn patch<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    part: Part,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    api.writer()?;
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let output = negotiate::output(&headers)?;
    let patch_type = patch_type(&headers)?;
    // The body first, as kube-apiserver reads it before it validates PatchOptions (413 first).
    let body = body::read(body).await?;
    let (manager, force) =
        query.field_manager("PatchOptions", Some(patch_type == PatchType::Apply))?;
    let manager = manager_or_user_agent(manager, &headers);
    let key = ObjectKey::new(&namespace, &name);
    if patch_type == PatchType::Apply {
        let apply = Apply {
            key,
            part,
            dry_run,
            field_validation,
            output,
            manager,
            force,
        };
        return apply.run(api, &body).await;
    }
    // Patches without a resourceVersion retry on conflict, as kube-apiserver's GuaranteedUpdate.
    let writer = api.writer()?;
    let mut attempts = 0;
    loop {
        attempts += 1;
        let from = if attempts == 1 {
            first_read(writer)
        } else {
            UpdateFrom::Source
        };
        let pinned = std::sync::atomic::AtomicBool::new(false);
        let attempt = async {
            let current = writer.get_for_update(&key, from).await?;
            // A JSON patch may nest its result deeper than its body: always off the workers.
            let heavy = patch_type == PatchType::Json || body::Work::is_heavy(&body);
            let (patched_from, body) = (current.clone(), body.clone());
            let (mut object, warnings) = api
                .ctx
                .work
                .run_if(heavy, move || {
                    let patched = apply_patch(&patched_from, patch_type, &body)?;
                    let decoded = decode_object::<K>(patched, field_validation)?;
                    check_shallow(&decoded.0)?;
                    Ok(decoded)
                })
                .await?;
            // Patch after patch must not grow an object past what one request may send.
            let size = json_len(&object);
            if size > MAX_BODY_BYTES {
                return Err(Error::RequestEntityTooLarge(format!(
                    "the patched object would be {size} bytes, limit is {MAX_BODY_BYTES}"
                )));
            }
            check_name(&object, &name)?;
            check_namespace(&object, &namespace)?;
            check_uid(&object, current.as_ref(), UidSent::Field)?;
            pinned.store(
                object.meta().resource_version != current.meta().resource_version,
                std::sync::atomic::Ordering::Relaxed,
            );
            if object
                .meta()
                .resource_version
                .as_deref()
                .unwrap_or("")
                .is_empty()
            {
                object.meta_mut().resource_version = current.meta().resource_version.clone();
            }
            let mut object = written_part(object, current.as_ref(), part);
            prepare_update(&mut object, current.as_ref(), part);
            let mut warnings = warnings;
            warnings.extend(validate(&object, Some(current.as_ref()))?);
            api.fields()?
                .update(part, Some(&current), &mut object, &manager)?;
            let updated = update_unless_unchanged(writer, object, &current, dry_run).await?;
            let response =
                object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
            Ok(with_warnings(response, &warnings))
        };
        match attempt.await {
            Ok(response) => return Ok(response),
            // Whatever failed from a cached copy (a conflict, a JSON patch `test`, validation)
            // may be its staleness: tried once from the source, as kube-apiserver's
            // GuaranteedUpdate does with its cached object; then conflicts while no
            // resourceVersion pins the patch.
            Err(_) if from == UpdateFrom::Cache => {}
            Err(Error::Conflict { .. })
                if !pinned.load(std::sync::atomic::Ordering::Relaxed) && attempts < 5 => {}
            Err(e) => return Err(e),
        }
    }
}

/// Where a write's first attempt reads the object it starts from.
fn first_read<K: ServedResource>(writer: &dyn WritableStore<K>) -> UpdateFrom {
    if writer.updates_from_a_cache() {
        UpdateFrom::Cache
    } else {
        UpdateFrom::Source
    }
}

/// An update, unless it changes nothing: then, as kube-apiserver's storage does, nothing is
/// written, the object keeps its resourceVersion and watchers hear nothing (an apply of an
/// unchanged configuration, a PUT of what was read).
async fn update_unless_unchanged<K: ServedResource>(
    writer: &dyn WritableStore<K>,
    object: K,
    current: &Object<K>,
    dry_run: bool,
) -> Result<Object<K>> {
    if object.meta().resource_version == current.meta().resource_version
        && serde_json::to_vec(&object).is_ok_and(|json| json[..] == current.json()[..])
    {
        return Ok(current.clone());
    }
    writer.update(object, dry_run).await
}

/// A server-side apply of one object (or of its status).
struct Apply {
    key: ObjectKey,
    part: Part,
    dry_run: bool,
    field_validation: FieldValidation,
    output: Output,
    manager: String,
    force: bool,
}

impl Apply {
    /// Merges the applied configuration into the stored object (or creates it: 201) and
    /// writes the result through the same strategy and validation as any update; retried on
    /// a conflicting write unless the configuration names a resourceVersion, as patches are.
    async fn run<K: ServedResource>(self, api: KindApi<K>, body: &Bytes) -> Result<Response> {
        let heavy = body::Work::is_heavy(body);
        let config = api
            .ctx
            .work
            .run_if(heavy, {
                let body = body.clone();
                move || parse_apply_body(&body).map(Arc::new)
            })
            .await?;
        let writer = api.writer()?;
        // A resourceVersion in the configuration is a precondition: no retry past it.
        let pinned = config
            .0
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|rv| !rv.is_empty());
        let mut attempts = 0;
        loop {
            attempts += 1;
            let from = if attempts == 1 {
                first_read(writer)
            } else {
                UpdateFrom::Source
            };
            match self
                .attempt(&api, writer, &config, heavy, from, pinned)
                .await
            {
                Ok(response) => return Ok(response),
                // As for patches: anything that failed from a cached copy is tried once from
                // the source (a conflict with managers, too, may come from a stale copy).
                Err(_) if from == UpdateFrom::Cache => {}
                Err(Error::Conflict { .. } | Error::AlreadyExists(_))
                    if !pinned && attempts < 5 => {}
                Err(e) => return Err(e),
            }
        }
    }

    async fn attempt<K: ServedResource>(
        &self,
        api: &KindApi<K>,
        writer: &dyn WritableStore<K>,
        config: &Arc<body::Deep>,
        heavy: bool,
        from: UpdateFrom,
        pinned: bool,
    ) -> Result<Response> {
        let current = match writer.get_for_update(&self.key, from).await {
            Ok(current) => Some(current),
            Err(Error::NotFound(_)) if self.part == Part::Object => None,
            Err(e) => return Err(e),
        };
        let (api_, config, live) = (api.clone(), config.clone(), current.clone());
        let (part, manager, force) = (self.part, self.manager.clone(), self.force);
        let field_validation = self.field_validation;
        let (mut object, mut warnings) = api
            .ctx
            .work
            .run_if(heavy, move || {
                let applied =
                    api_.fields()?
                        .apply(part, live.as_deref(), &config.0, &manager, force)?;
                let decoded = decode_object::<K>(applied, field_validation)?;
                check_shallow(&decoded.0)?;
                Ok(decoded)
            })
            .await?;
        let size = json_len(&object);
        if size > MAX_BODY_BYTES {
            return Err(Error::RequestEntityTooLarge(format!(
                "the applied object would be {size} bytes, limit is {MAX_BODY_BYTES}"
            )));
        }
        check_name(&object, &self.key.name)?;
        check_namespace(&object, &self.key.namespace)?;
        let (object, status) = match current {
            None => {
                if let Some(uid) = object.meta().uid.as_deref().filter(|u| !u.is_empty()) {
                    return Err(Error::Conflict {
                        subject: K::subject(&self.key.name),
                        message: format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    });
                }
                object.meta_mut().resource_version = None;
                prepare_create(&mut object, &self.key.namespace)?;
                warnings.extend(validate(&object, None)?);
                (
                    writer.create(object, self.dry_run).await?,
                    StatusCode::CREATED,
                )
            }
            Some(current) => {
                check_uid(&object, current.as_ref(), UidSent::Field)?;
                if !pinned {
                    object.meta_mut().resource_version = current.meta().resource_version.clone();
                }
                // The field manager's entries, /status's own included.
                let managed = object.meta().managed_fields.clone();
                let mut object = written_part(object, current.as_ref(), self.part);
                object.meta_mut().managed_fields = managed;
                prepare_update(&mut object, current.as_ref(), self.part);
                warnings.extend(validate(&object, Some(current.as_ref()))?);
                (
                    update_unless_unchanged(writer, object, &current, self.dry_run).await?,
                    StatusCode::OK,
                )
            }
        };
        let response = object_response(&object, self.output, IncludeObject::Metadata, status)?;
        Ok(with_warnings(response, &warnings))
    }
}

pub(crate) async fn delete<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let query = parse_query(raw)?;
    let body = body::read(body).await?;
    let options = parse_delete_options(&body)?;
    let dry_run = dry_run_of(&options, &query)?;
    let deleted = api
        .writer()?
        .delete(
            &ObjectKey::new(namespace, name),
            &options.preconditions.unwrap_or_default(),
            dry_run,
        )
        .await?;
    Ok(json_response(StatusCode::OK, deleted.json().clone()))
}

pub(crate) async fn delete_collection<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let query = parse_query(raw)?;
    // ListOptions are checked whole before anything is deleted.
    let filter = query.filter::<K>()?;
    query.timeout_seconds()?;
    query.limit()?;
    let body = body::read(body).await?;
    let options = parse_delete_options(&body)?;
    let dry_run = dry_run_of(&options, &query)?;
    let page = api
        .store
        .list(&ListRequest {
            namespace: Some(namespace),
            filter,
            ..Default::default()
        })
        .await?;
    let mut deleted = Vec::with_capacity(page.items.len());
    for item in page.items {
        match api
            .writer()?
            .delete(
                &ObjectKey::of(item.meta()),
                &Preconditions::default(),
                dry_run,
            )
            .await
        {
            Ok(object) => deleted.push(object),
            // Deleted meanwhile by someone else: not an error for a collection delete.
            Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let metadata = ListMeta {
        resource_version: Some(api.store.stats().await?.resource_version.to_string()),
        ..Default::default()
    };
    Ok(json_response(
        StatusCode::OK,
        list_body::json_list::<K>(&deleted, &metadata)?,
    ))
}
