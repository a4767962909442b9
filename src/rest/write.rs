//! create, update, patch, delete and deletecollection.

use std::sync::{
    Arc,
    atomic::{AtomicBool, Ordering},
};

use axum::{body::Bytes, extract::Request, http::StatusCode, response::Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta};

use super::fields::{manager_or_user_agent, parse_apply_body};
use super::guaranteed::Deleted;
use super::options::{FieldValidation, Query, dry_run_of, parse_delete_options, parse_query};
use super::patch::{PatchType, apply_patch, json_len, patch_type};
use super::response::{json_response, object_response, with_warnings};
use super::strategy::{
    Subresource, UidSent, check_name, check_namespace, check_uid, decode_body, decode_object,
    prepare_create, prepare_update, written_part,
};
use super::{KindApi, MAX_BODY_BYTES, admit, body, guaranteed, lifecycle};
use crate::{
    admission::Operation,
    error::{Error, FieldError, Result},
    list_body::{self},
    negotiate::{self, Output},
    resource::{ObjectKey, ServedResource},
    store::{ListRequest, Object, UpdateFrom, WritableStore, check_preconditions},
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
/// workers) with the warnings that gave.
struct Sent<K> {
    author: Author,
    output: Output,
    object: K,
    warnings: Vec<String>,
}

impl<K: ServedResource> Sent<K> {
    /// `options` names the options kind in errors (`CreateOptions`, `UpdateOptions`).
    async fn read(api: &KindApi<K>, request: Request, options: &str) -> Result<Self> {
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
        let (object, warnings) = api
            .ctx
            .work
            .run(&body, move |body| {
                decode_body::<K>(&body, format, field_validation)
            })
            .await?;
        Ok(Self {
            author: Author {
                user,
                dry_run,
                manager,
            },
            output,
            object,
            warnings,
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
        mut object,
        mut warnings,
    } = Sent::read(&api, request, "CreateOptions").await?;
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
        object,
        warnings,
    } = Sent::read(&api, request, "UpdateOptions").await?;
    check_name(&object, &name)?;
    check_namespace(&object, &namespace)?;
    if no_resource_version(&object) {
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
        let (mut object, warnings) = api
            .ctx
            .work
            .run_if(heavy, move || {
                let patched = apply_patch(&patched_from, patch_type, &body)?;
                decode_object::<K>(patched, field_validation)
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
        let mut warnings = warnings;
        let sent = (object, part, manager.as_str());
        let updated = write_update(to, sent, (&current, from), &mut warnings).await?;
        let response = object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
        Ok(with_warnings(response, &warnings))
    })
    .await
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
        let field_validation = self.field_validation;
        let (mut object, mut warnings) = api
            .ctx
            .work
            .run_if(heavy, move || {
                let applied =
                    api_.fields
                        .apply(part, live.as_deref(), &config.0, &manager, force)?;
                decode_object::<K>(applied, field_validation)
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

pub(crate) async fn delete<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let user = admit::user_of(&parts.extensions);
    let query = parse_query(raw)?;
    let body = body::read(body).await?;
    let options = delete_options(&body, &query)?;
    let dry_run = dry_run_of(&options, &query)?;
    let writer = api.writer()?;
    let key = ObjectKey::new(namespace, name);
    match delete_one(&api, writer, &key, &options, dry_run, user.as_deref()).await? {
        // As for custom resources: a success Status naming what went.
        Deleted::Now(object) => Ok(json_response(
            StatusCode::OK,
            deleted_status::<K>(object.meta()),
        )),
        // Held by its finalizers: the object as it is now; 202 only for the legacy
        // `orphanDependents: false`, as kube-apiserver answers.
        Deleted::Pending(object) => {
            let code = if options.orphan_dependents == Some(false) {
                StatusCode::ACCEPTED
            } else {
                StatusCode::OK
            };
            Ok(json_response(code, object.json().clone()))
        }
    }
}

/// A DELETE's options: its body, or the query's parameters when it has none (kubectl and
/// client-go send a body; curl users the query), validated as kube-apiserver validates them.
fn delete_options(body: &[u8], query: &Query) -> Result<DeleteOptions> {
    let mut options = parse_delete_options(body)?;
    if body.iter().all(u8::is_ascii_whitespace) {
        options.propagation_policy = query.propagation_policy.clone();
        options.orphan_dependents = match query.orphan_dependents.as_deref() {
            None | Some("") => None,
            Some(value) => Some(crate::request_info::parse_bool(value).ok_or_else(|| {
                Error::BadRequest(format!(
                    "strconv.ParseBool: parsing {value:?}: invalid syntax"
                ))
            })?),
        };
    }
    lifecycle::validate_delete_options(&options)?;
    Ok(options)
}

/// Deletes one object through the write loop: marked deleting while finalizers hold it,
/// else gone.
async fn delete_one<K: ServedResource>(
    api: &KindApi<K>,
    writer: &dyn WritableStore<K>,
    key: &ObjectKey,
    options: &DeleteOptions,
    dry_run: bool,
    user: Option<&crate::auth::UserInfo>,
) -> Result<Deleted<K>> {
    let preconditions = options.preconditions.clone().unwrap_or_default();
    let mut attributes = admit::attributes::<K>(
        Operation::Delete,
        Subresource::Object,
        &key.namespace,
        &key.name,
        user,
        dry_run,
        serde_json::to_value(options).unwrap_or_default(),
    );
    attributes.equivalents = api.equivalents.clone();
    let attributes = &attributes;
    // A precondition pins the delete: failing it again and again will not help.
    let pinned =
        AtomicBool::new(preconditions.resource_version.is_some() || preconditions.uid.is_some());
    let gc = api.ctx.settings.garbage_collection;
    let preconditions = &preconditions;
    guaranteed::retry(writer, &pinned, |from| async move {
        let current = writer.get_for_update(key, from).await?;
        check_preconditions(current.get(), preconditions)?;
        // The delete's warnings are not returned (its answer is a Status or the object).
        admit::delete(api, attributes, current.as_ref()).await?;
        let finalizers = lifecycle::finalizers_on_delete(
            current.meta().finalizers.as_deref().unwrap_or_default(),
            options,
            gc,
        );
        guaranteed::delete(writer, &current, finalizers, from, dry_run).await
    })
    .await
}

/// The Status kube-apiserver answers a delete that deleted (`details.kind` is the resource).
fn deleted_status<K: ServedResource>(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Vec<u8> {
    // Written by hand (one buffer): every deletion answers with one.
    let string = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    format!(
        r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Success","details":{{"name":{},"group":{},"kind":{},"uid":{}}}}}"#,
        string(meta.name.as_deref().unwrap_or("")),
        string(crate::resource::GROUP),
        string(&K::plural(&())),
        string(meta.uid.as_deref().unwrap_or("")),
    )
    .into_bytes()
}

pub(crate) async fn delete_collection<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let user = admit::user_of(&parts.extensions);
    let query = parse_query(raw)?;
    // ListOptions are checked whole before anything is deleted.
    let filter = query.filter::<K>()?;
    query.timeout_seconds()?;
    query.limit()?;
    let body = body::read(body).await?;
    let options = delete_options(&body, &query)?;
    let dry_run = dry_run_of(&options, &query)?;
    let writer = api.writer()?;
    let page = api
        .store
        .list(&ListRequest {
            namespace: Some(namespace),
            filter,
            ..Default::default()
        })
        .await?;
    // Each as a DELETE of it would go (finalizers hold some); the answer lists them as they
    // were listed, as kube-apiserver's does.
    for item in &page.items {
        let key = ObjectKey::of(item.meta());
        match delete_one(&api, writer, &key, &options, dry_run, user.as_deref()).await {
            // Deleted meanwhile by someone else: not an error for a collection delete.
            Ok(_) | Err(Error::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    let metadata = ListMeta {
        resource_version: Some(api.store.stats().await?.resource_version.to_string()),
        ..Default::default()
    };
    Ok(json_response(
        StatusCode::OK,
        list_body::json_list::<K>(&page.items, &metadata)?,
    ))
}
