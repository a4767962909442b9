//! create, update and patch (server-side apply included); delete and deletecollection are
//! [`super::delete`]'s.

use std::sync::Arc;

use axum::{body::Bytes, extract::Request, http::StatusCode, response::Response};

use super::decode::{DUPLICATE_OWNERS, DecodedBody, Source, decode_body, decode_object};
use super::field_managers::{manager_or_user_agent, parse_apply_body};
use super::guaranteed::{self, Failed};
use super::options::{FieldValidation, parse_query};
use super::patch::{PatchType, apply_patch, decode_patched, json_len, patch_type};
use super::pipeline::{Author, ManagedFields, Replacing, Writing};
use super::response::{object_response, with_warnings};
use super::strategy::{Subresource, UidSent, check_name, check_namespace, check_uid};
use super::{admit, body, body::MAX_BODY_BYTES, kind_api::KindApi};
use crate::{
    error::{Error, FieldError, Result, Subject},
    render::negotiate::{self, Output},
    render::table::IncludeObject,
    resource::{ObjectKey, ServedResource},
    store::{UpdateFrom, WritableStore},
};

/// What a create or an update (PUT) sent: its options, and its body decoded (off the async
/// workers) with the warnings that gave, or why it is invalid (422).
struct Sent<K> {
    author: Author,
    output: Output,
    body: DecodedBody<K>,
}

impl<K: ServedResource> Sent<K> {
    /// `options` names the options kind in errors (`CreateOptions`, `UpdateOptions`).
    async fn read(api: &KindApi<K>, request: Request, source: Source) -> Result<Self> {
        let options = match source {
            Source::Create => "CreateOptions",
            _ => "UpdateOptions",
        };
        let (parts, body) = request.into_parts();
        let (raw, headers) = (parts.uri.query(), parts.headers);
        let user = admit::user_of(&parts.extensions);
        let query = parse_query(raw)?;
        let dry_run = query.dry_run()?;
        let field_validation = query.field_validation()?;
        let (manager, _) = query.field_manager(options, None)?;
        let manager = manager_or_user_agent(manager, &headers);
        let output = negotiate::output(&headers)?;
        let format = negotiate::body_format(&headers)?;
        let body = body::read(body).await?;
        let body = api
            .ctx
            .work
            .run(&body, move |body| {
                decode_body::<K>(&body, format, field_validation, source)
            })
            .await?;
        Ok(Self {
            author: Author {
                user,
                dry_run,
                manager,
            },
            output,
            body,
        })
    }
}

pub(crate) async fn create<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let Sent {
        author,
        output,
        body,
    } = Sent::read(&api, request, Source::Create).await?;
    let (object, mut warnings) = body.object?;
    let decoded = warnings.clone();
    let writing = Writing {
        api: &api,
        writer: api.writer()?,
        author: &author,
        namespace: &namespace,
        part: Subresource::Object,
    };
    let nothing = Replacing::Nothing { renamed: true };
    let created = writing
        .commit(object, nothing, ManagedFields::Updated, &mut warnings)
        .await
        .map_err(|failed| Error::from(failed).warned(&decoded))?;
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
    part: Subresource,
    request: Request,
) -> Result<Response> {
    let Sent {
        author,
        output,
        body,
    } = Sent::read(&api, request, Source::Update).await?;
    let decoded = match &body.object {
        Ok((_, warnings)) | Err(Error::Warned { warnings, .. }) => warnings.clone(),
        Err(_) => Vec::new(),
    };
    let sent = Sent {
        author,
        output,
        body,
    };
    update_decoded(api, namespace, name, part, sent)
        .await
        .map_err(|e| match e {
            // The URL's name and namespace are checked before owner references are deduplicated.
            Error::BadRequest(_) => {
                let early: Vec<String> = decoded
                    .iter()
                    .filter(|w| !w.starts_with(DUPLICATE_OWNERS))
                    .cloned()
                    .collect();
                e.warned(&early)
            }
            e => e.warned(&decoded),
        })
}

/// An update (PUT) of what `sent` holds.
async fn update_decoded<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    part: Subresource,
    sent: Sent<K>,
) -> Result<Response> {
    let Sent {
        author,
        output,
        body,
    } = sent;
    let key = ObjectKey::new(&namespace, &name);
    let writer = api.writer()?;
    // As kube-apiserver: the name first (400), then the object must exist (404), then the
    // body must name a resourceVersion, then be valid (422).
    check_sent_name(&body.name, &name)?;
    if K::namespaced() && !body.namespace.is_empty() && body.namespace != namespace {
        return Err(Error::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    if body.object.is_err() || !body.resource_version {
        writer.get_for_update(&key, UpdateFrom::Cache).await?;
    }
    if !body.resource_version {
        return Err(Error::Invalid {
            subject: Subject {
                kind: K::plural_name(),
                ..K::invalid_subject(&name)
            },
            causes: vec![FieldError::invalid(
                "metadata.resourceVersion",
                "0",
                "must be specified for an update",
            )],
        });
    }
    let (object, warnings) = body.object?;
    let writing = Writing {
        api: &api,
        writer,
        author: &author,
        namespace: &namespace,
        part,
    };
    let (object, warnings, writing, key) = (&object, &warnings, &writing, &key);
    // The body names the resourceVersion it replaces: from the source, a conflict is final.
    let (updated, warnings) = guaranteed::retry(writer, |from| async move {
        let current = writer.get_for_update(key, from).await?;
        check_uid(object, current.as_ref(), UidSent::Precondition)?;
        let mut warnings = warnings.clone();
        let replacing = Replacing::Stored {
            current: &current,
            from,
        };
        let updated = writing
            .commit(
                object.clone(),
                replacing,
                ManagedFields::Updated,
                &mut warnings,
            )
            .await?;
        Ok((updated, warnings))
    })
    .await?;
    let response = object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
    Ok(with_warnings(response, &warnings))
}

pub(crate) async fn patch<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    part: Subresource,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let user = admit::user_of(&parts.extensions);
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
    let author = Author {
        user,
        dry_run,
        manager: manager_or_user_agent(manager, &headers),
    };
    let key = ObjectKey::new(&namespace, &name);
    if patch_type == PatchType::Apply {
        let apply = Apply {
            key,
            part,
            field_validation,
            output,
            force,
            author,
        };
        return apply.run(api, &body).await;
    }
    // A patch without a resourceVersion is tried again on a lost race, as kube-apiserver's
    // GuaranteedUpdate tries it.
    let writer = api.writer()?;
    let writing = Writing {
        api: &api,
        writer,
        author: &author,
        namespace: &namespace,
        part,
    };
    let (api, key, body, name, namespace, writing) =
        (&api, &key, &body, &name, &namespace, &writing);
    guaranteed::retry(writer, |from| async move {
        let current = writer.get_for_update(key, from).await?;
        // A JSON patch may nest its result deeper than its body: always off the workers.
        let heavy = patch_type == PatchType::Json || body::Work::is_heavy(body);
        let (patched_from, body) = (current.clone(), body.clone());
        let (url_name, url_namespace) = (name.clone(), namespace.clone());
        let (mut object, warnings) = api
            .ctx
            .work
            .run_if(heavy, move || {
                let patched = apply_patch(&patched_from, patch_type, &body, field_validation)?;
                // The name before the object's validity, as kube-apiserver checks them (once
                // the result is an object of a kind at all).
                if patched.document["kind"].is_string() {
                    check_sent::<K>(&patched.document, &url_name, &url_namespace)?;
                }
                decode_patched::<K>(patched, field_validation)
            })
            .await?;
        // Patch after patch must not grow an object past what one request may send.
        check_size(&object, "patched")?;
        check_name(&object, name)?;
        check_namespace(&object, namespace)?;
        check_uid(&object, current.as_ref(), UidSent::Field)?;
        if no_resource_version(&object) {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
        }
        let decoded = warnings.clone();
        let mut warnings = warnings;
        let replacing = Replacing::Stored {
            current: &current,
            from,
        };
        // A conflict stays one (the retry reads the object again); other errors keep the
        // body's warnings.
        let updated = writing
            .commit(object, replacing, ManagedFields::Updated, &mut warnings)
            .await
            .map_err(|failed| {
                failed.map(|e| match e {
                    e @ (Error::Conflict { .. } | Error::AlreadyExists(_)) => e,
                    e => e.warned(&decoded),
                })
            })?;
        let response = object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
        Ok(with_warnings(response, &warnings))
    })
    .await
}

/// A patched or applied object, before it is decoded, must name the object and namespace
/// its URL names (400).
fn check_sent<K: ServedResource>(
    object: &serde_json::Value,
    name: &str,
    namespace: &str,
) -> Result<()> {
    let field = |field: &str| object["metadata"][field].as_str().unwrap_or_default();
    check_sent_name(field("name"), name)?;
    let sent = field("namespace");
    if K::namespaced() && !sent.is_empty() && sent != namespace {
        return Err(Error::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        ));
    }
    Ok(())
}

/// A PUT's body must name the object its URL names.
fn check_sent_name(sent: &str, name: &str) -> Result<()> {
    if sent == name {
        return Ok(());
    }
    Err(Error::BadRequest(format!(
        "the name of the object ({sent}) does not match the name on the URL ({name})"
    )))
}

/// Whether `object` names no resourceVersion.
fn no_resource_version<K: ServedResource>(object: &K) -> bool {
    object
        .meta()
        .resource_version
        .as_deref()
        .is_none_or(str::is_empty)
}

/// A patched or applied object (`what`) may not grow past what one request may send.
fn check_size<K: ServedResource>(object: &K, what: &str) -> Result<()> {
    let size = json_len(object);
    if size > MAX_BODY_BYTES {
        return Err(Error::RequestEntityTooLarge(format!(
            "the {what} object would be {size} bytes, limit is {MAX_BODY_BYTES}"
        )));
    }
    Ok(())
}

/// A server-side apply of one object (or of its status).
struct Apply {
    key: ObjectKey,
    part: Subresource,
    field_validation: FieldValidation,
    output: Output,
    force: bool,
    author: Author,
}

impl Apply {
    /// Merges the applied configuration into the stored object (or creates it: 201) and
    /// writes the result through the same pipeline as any update; tried again on a lost race,
    /// where a resourceVersion the configuration names is then final, as for patches.
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
        // A resourceVersion in the configuration is a precondition, checked by the write.
        let pinned = config
            .0
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|v| !v.is_empty());
        let (this, api, config) = (&self, &api, &config);
        guaranteed::retry(writer, |from| async move {
            this.attempt(api, writer, config, heavy, from, pinned).await
        })
        .await
    }

    async fn attempt<K: ServedResource>(
        &self,
        api: &KindApi<K>,
        writer: &dyn WritableStore<K>,
        config: &Arc<body::Deep>,
        heavy: bool,
        from: UpdateFrom,
        pinned: bool,
    ) -> std::result::Result<Response, Failed> {
        let current = match writer.get_for_update(&self.key, from).await {
            Ok(current) => Some(current),
            Err(Error::NotFound(_)) if self.part == Subresource::Object => None,
            Err(e) => return Err(e.into()),
        };
        let (api_, config, live) = (api.clone(), config.clone(), current.clone());
        let (part, manager, force) = (self.part, self.author.manager.clone(), self.force);
        let key = self.key.clone();
        let field_validation = self.field_validation;
        let (mut object, mut warnings) = api
            .ctx
            .work
            .run_if(heavy, move || {
                let applied =
                    api_.fields
                        .apply(part, live.as_deref(), &config.0, &manager, force)?;
                let source = Source::Apply {
                    exists: live.is_some(),
                };
                check_sent::<K>(&applied, &key.name, &key.namespace)?;
                decode_object::<K>(applied, field_validation, source)
            })
            .await?;
        check_size(&object, "applied")?;
        check_name(&object, &self.key.name)?;
        check_namespace(&object, &self.key.namespace)?;
        let (replacing, status) = match &current {
            None => {
                if let Some(uid) = object.meta().uid.as_deref().filter(|u| !u.is_empty()) {
                    return Err(Error::Conflict {
                        subject: K::subject(&self.key.name),
                        message: format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    }
                    .into());
                }
                object.meta_mut().resource_version = None;
                (Replacing::Nothing { renamed: false }, StatusCode::CREATED)
            }
            Some(current) => {
                check_uid(&object, current.as_ref(), UidSent::Field)?;
                if !pinned {
                    object.meta_mut().resource_version = current.meta().resource_version.clone();
                }
                (Replacing::Stored { current, from }, StatusCode::OK)
            }
        };
        let writing = Writing {
            api,
            writer,
            author: &self.author,
            namespace: &self.key.namespace,
            part: self.part,
        };
        let object = writing
            .commit(object, replacing, ManagedFields::Applied, &mut warnings)
            .await?;
        let response = object_response(&object, self.output, IncludeObject::Metadata, status)?;
        Ok(with_warnings(response, &warnings))
    }
}
