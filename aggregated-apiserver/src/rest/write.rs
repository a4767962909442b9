//! create, update and patch (server-side apply included); delete and deletecollection are
//! [`super::delete`]'s.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{body::Bytes, extract::Request, http::StatusCode, response::Response};

use super::decode::{DUPLICATE_OWNERS, DecodedBody, Source, decode_body, decode_object};
use super::field_managers::{manager_or_user_agent, parse_apply_body};
use super::options::{FieldValidation, parse_query};
use super::patch::{PatchType, apply_patch, decode_patched, json_len, patch_type};
use super::response::{object_response, with_warnings};
use super::strategy::{
    Subresource, UidSent, check_name, check_namespace, check_uid, prepare_create, prepare_update,
    written_part,
};
use super::{KindApi, MAX_BODY_BYTES, admit, body, guaranteed};
use crate::{
    admission::Operation,
    error::{Error, FieldError, Result, Subject},
    negotiate::{self, Output},
    resource::{ObjectKey, ServedResource},
    store::{Object, UpdateFrom, WritableStore},
    table::IncludeObject,
};

/// Who writes, and how: what a write's admission attributes are made of.
struct Author {
    user: Option<Arc<crate::auth::UserInfo>>,
    dry_run: bool,
    manager: String,
}

impl Author {
    /// The attributes of a write of `K` through `api` by this author.
    fn attributes<'a, K: ServedResource>(
        &'a self,
        api: &KindApi<K>,
        operation: Operation,
        part: Subresource,
        namespace: &'a str,
        name: &'a str,
    ) -> crate::admission::Attributes<'a> {
        let mut attributes = admit::attributes::<K>(
            operation,
            part,
            namespace,
            name,
            self.user.as_deref(),
            self.dry_run,
            admit::write_options(self.dry_run, &self.manager),
        );
        attributes.equivalents = api.equivalents.clone();
        attributes
    }
}

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
    let (object, warnings) = body.object?;
    let decoded = warnings.clone();
    create_decoded(api, namespace, author, output, object, warnings)
        .await
        .map_err(|e| e.warned(&decoded))
}

/// A create of `object`, decoded with `warnings`.
async fn create_decoded<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    author: Author,
    output: Output,
    mut object: K,
    mut warnings: Vec<String>,
) -> Result<Response> {
    prepare_create(&mut object, &namespace)?;
    namespace_lifecycle(&api, &object).await?;
    let name = object.meta().name.clone().unwrap_or_default();
    let attributes = author.attributes::<K>(
        &api,
        Operation::Create,
        Subresource::Object,
        &namespace,
        &name,
    );
    // Managed fields first, as kube-apiserver: what webhooks add is nobody's.
    api.fields
        .update(Subresource::Object, None, &mut object, &author.manager)?;
    admit::admit_create(&api, attributes, &mut object, true, &mut warnings).await?;
    let created = api.writer()?.create(object, author.dry_run).await?;
    let response = object_response(
        &created,
        output,
        IncludeObject::Metadata,
        StatusCode::CREATED,
    )?;
    Ok(with_warnings(response, &warnings))
}

/// NamespaceLifecycle admission of a create, when the server has a cluster's namespaces.
async fn namespace_lifecycle<K: ServedResource>(api: &KindApi<K>, object: &K) -> Result<()> {
    let (Some(namespaces), true) = (&api.ctx.namespaces, K::namespaced()) else {
        return Ok(());
    };
    let meta = object.meta();
    let name = meta
        .name
        .as_deref()
        .filter(|n| !n.is_empty())
        .or(meta.generate_name.as_deref())
        .unwrap_or("Unknown");
    namespaces
        .admit_create(meta.namespace.as_deref().unwrap_or(""), K::subject(name))
        .await
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
    // A PUT names the resourceVersion it replaces: a conflict is the client's to resolve.
    let pinned = AtomicBool::new(true);
    let attributes = author.attributes::<K>(&api, Operation::Update, part, &namespace, &name);
    let (object, warnings, manager, api, key) = (&object, &warnings, &author.manager, &api, &key);
    let to = (api, writer, &attributes, author.dry_run);
    let (updated, warnings) = guaranteed::retry(writer, &pinned, |from| async move {
        let current = writer.get_for_update(key, from).await?;
        check_uid(object, current.as_ref(), UidSent::Precondition)?;
        let mut warnings = warnings.clone();
        let sent = (object.clone(), part, manager.as_str());
        let updated = write_update(to, sent, (&current, from), &mut warnings).await?;
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
    // Patches without a resourceVersion retry on conflict, as kube-apiserver's GuaranteedUpdate.
    let writer = api.writer()?;
    let pinned = AtomicBool::new(false);
    let attributes = author.attributes::<K>(&api, Operation::Update, part, &namespace, &name);
    let manager = &author.manager;
    let (api, key, body, name, namespace, pinned_ref) =
        (&api, &key, &body, &name, &namespace, &pinned);
    let to = (api, writer, &attributes, dry_run);
    guaranteed::retry(writer, &pinned, |from| async move {
        let pinned = pinned_ref;
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
        pinned.store(
            object.meta().resource_version != current.meta().resource_version,
            Ordering::Relaxed,
        );
        if no_resource_version(&object) {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
        }
        let decoded = warnings.clone();
        let mut warnings = warnings;
        let sent = (object, part, manager.as_str());
        // A conflict stays one (the retry reads the object again); other errors keep the
        // body's warnings.
        let updated = write_update(to, sent, (&current, from), &mut warnings)
            .await
            .map_err(|e| match e {
                e @ (Error::Conflict { .. } | Error::AlreadyExists(_)) => e,
                e => e.warned(&decoded),
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

/// The last steps of an update (PUT or patch) of `current` (read `from` the cache or the
/// source) by `manager`: the part it writes kept, the object prepared, its managed fields
/// updated, admitted (warnings added to `warnings`), and written.
async fn write_update<K: ServedResource>(
    (api, writer, attributes, dry_run): (
        &KindApi<K>,
        &dyn WritableStore<K>,
        &crate::admission::Attributes<'_>,
        bool,
    ),
    (object, part, manager): (K, Subresource, &str),
    (current, from): (&Object<K>, UpdateFrom),
    warnings: &mut Vec<String>,
) -> Result<Object<K>> {
    let mut object = written_part(object, current.as_ref(), part);
    prepare_update(&mut object, current.as_ref(), part)?;
    api.fields
        .update(part, Some(current), &mut object, manager)?;
    admit::admit_update(
        api,
        attributes,
        &mut object,
        current.as_ref(),
        part,
        warnings,
    )
    .await?;
    guaranteed::write(writer, object, current, from, dry_run).await
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
        // A resourceVersion or uid in the configuration is a precondition: no retry past it.
        let names = |field: &str| {
            config
                .0
                .pointer(field)
                .and_then(serde_json::Value::as_str)
                .is_some_and(|v| !v.is_empty())
        };
        let pinned = names("/metadata/resourceVersion") || names("/metadata/uid");
        let pinned_flag = AtomicBool::new(pinned);
        let (this, api, config) = (&self, &api, &config);
        guaranteed::retry(writer, &pinned_flag, |from| async move {
            this.attempt(api, writer, config, heavy, from, pinned).await
        })
        .await
    }

    /// The attributes of this apply as a create or an update.
    fn attributes<K: ServedResource>(
        &self,
        api: &KindApi<K>,
        operation: Operation,
    ) -> crate::admission::Attributes<'_> {
        self.author.attributes::<K>(
            api,
            operation,
            self.part,
            &self.key.namespace,
            &self.key.name,
        )
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
            Err(Error::NotFound(_)) if self.part == Subresource::Object => None,
            Err(e) => return Err(e),
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
                namespace_lifecycle(api, &object).await?;
                let attributes = self.attributes::<K>(api, Operation::Create);
                admit::admit_create(api, attributes, &mut object, false, &mut warnings).await?;
                (
                    writer.create(object, self.author.dry_run).await?,
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
                let attributes = self.attributes::<K>(api, Operation::Update);
                prepare_update(&mut object, current.as_ref(), self.part)?;
                admit::admit_update(
                    api,
                    &attributes,
                    &mut object,
                    current.as_ref(),
                    self.part,
                    &mut warnings,
                )
                .await?;
                (
                    guaranteed::write(writer, object, &current, from, self.author.dry_run).await?,
                    StatusCode::OK,
                )
            }
        };
        let response = object_response(&object, self.output, IncludeObject::Metadata, status)?;
        Ok(with_warnings(response, &warnings))
    }
}
