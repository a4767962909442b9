//! delete and deletecollection: delete options, preconditions, the garbage collector's
//! finalizers, graceful deletion.

use axum::{extract::Request, http::StatusCode, response::Response};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{DeleteOptions, ListMeta};

use super::guaranteed::Deleted;
use super::options::{Query, dry_run_of, parse_delete_options, parse_query};
use super::response::json_response;
use super::strategy::Subresource;
use super::{admit, body, guaranteed, kind_api::KindApi, lifecycle};
use crate::{
    admission::Operation,
    error::{Error, Result},
    render::list_body::{self},
    resource::{ObjectKey, ServedResource},
    store::{ListRequest, WritableStore, check_preconditions},
};

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
        Deleted::Gone(object) => Ok(json_response(
            StatusCode::OK,
            deleted_status::<K>(object.meta()),
        )),
        // Held by its finalizers: the object as it is now; 202 only for the legacy
        // `orphanDependents: false`, as kube-apiserver answers.
        Deleted::Finalizing(object) => {
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
    let gc = api.ctx.settings.garbage_collection;
    let preconditions = &preconditions;
    // The client's preconditions are checked by each attempt: from the source, final.
    guaranteed::retry(writer, |from| async move {
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
        string(K::group_name()),
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
