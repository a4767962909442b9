//! get, list and watch.

use std::time::Duration;

use axum::{
    body::Body,
    extract::Request,
    http::{HeaderMap, StatusCode},
    response::{IntoResponse, Response},
};
use futures::future::Either;
use rand::Rng;

use super::kind_api::KindApi;
use super::options::{Query, WatchFrom, parse_bool, parse_query};
use super::response::ItemResponse;
use super::response::{json_response, object_response};
use crate::{
    error::Result,
    render::list_body::{ListWriter, StreamedList},
    render::negotiate::{self, Output},
    render::table::IncludeObject,
    render::watch::{self, WatchOptions},
    resource::{ObjectKey, ServedResource},
    store::selector::{FieldSelector, Filter},
    store::{self, ListRequest, Object, WatchRequest, WatchStart},
};

// Reads take the whole request (not a `HeaderMap`, which axum would clone) and borrow headers.

pub(crate) async fn list_all<K: ServedResource>(
    api: KindApi<K>,
    request: Request,
) -> Result<Response> {
    list_or_watch(api, None, request.uri().query(), request.headers()).await
}

pub(crate) async fn list_namespaced<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    list_or_watch(
        api,
        Some(namespace),
        request.uri().query(),
        request.headers(),
    )
    .await
}

pub(crate) async fn list_or_watch<K: ServedResource>(
    api: KindApi<K>,
    namespace: Option<String>,
    raw: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response> {
    let query = parse_query(raw)?;
    let output = negotiate::output(headers)?;
    let include = query.include_object()?;
    api.store.check_ready()?;
    let filter = query.filter::<K>()?;
    if parse_bool("watch", query.watch.as_deref())? {
        return Box::pin(start_watch(api, namespace, filter, &query, output, include)).await;
    }
    let params = query.list_params()?;
    let request = ListRequest {
        namespace,
        filter,
        limit: params.limit,
        continue_token: params.continue_token,
        read_at: params.read_at,
    };
    let limit = params.limit;
    // A large unlimited list is sent as it is written, a piece at a time.
    if let Some(cursor) = api.store.list_cursor(&request).await? {
        let writer = ListWriter::new::<K>(output, include, None);
        return Ok(match StreamedList::start(writer, cursor).await? {
            Either::Left(whole) => json_response(StatusCode::OK, whole),
            Either::Right(streamed) => json_response(StatusCode::OK, Body::new(streamed)),
        });
    }
    // The body is written as the store lends the objects.
    let expected = match request.filter.is_empty() {
        true => api.store.count_sync(request.namespace.as_deref()),
        false => None,
    }
    .map(|count| count.min(limit.unwrap_or(usize::MAX)));
    let mut list = ListWriter::new::<K>(output, include, expected);
    let info = api
        .store
        .list_each(&request, &mut |object| list.push(object))
        .await?;
    let body = list.finish::<K>(&info.list_meta())?;
    Ok(json_response(StatusCode::OK, body))
}

pub(crate) async fn start_watch<K: ServedResource>(
    api: KindApi<K>,
    namespace: Option<String>,
    filter: Filter,
    query: &Query,
    output: Output,
    include: IncludeObject,
) -> Result<Response> {
    let params = query.watch_params()?;
    // kube-apiserver's watch cache lets a plain watch wait for a version it has not reached,
    // but refuses a watch-list from one (it would hand out a state older than asked for).
    // (As kube-apiserver, an ERROR event on a 200 stream.)
    let current = api.store.stats().await?.resource_version;
    if params.send_initial_events
        && let Some(rv) = params.resource_version
        && rv > current
    {
        let refused = store::too_large(rv, current);
        let stream =
            futures::StreamExt::boxed(futures::stream::iter([store::WatchItem::<K>::Error(
                refused,
            )]));
        return Ok(watch::response(
            stream,
            WatchOptions {
                output,
                include,
                allow_bookmarks: false,
                send_initial_events_end: false,
                timeout: Duration::from_secs(60),
                bookmark_interval: api.ctx.settings.bookmark_interval,
            },
            rv,
            api.ctx.shutdown.clone(),
            api.ctx.metrics.clone(),
        ));
    }
    let start = match params.from {
        WatchFrom::InitialState => WatchStart::InitialState,
        WatchFrom::Latest => WatchStart::After(current),
        WatchFrom::After(rv) => WatchStart::After(rv),
    };
    let timeout = params.timeout.unwrap_or_else(|| {
        let min = api.ctx.settings.min_request_timeout;
        let extra = rand::rng().random_range(0.0..1.0);
        min.mul_f64(1.0 + extra)
    });
    let start_rv = match start {
        WatchStart::After(rv) => rv,
        WatchStart::InitialState => 0,
    };
    let stream = api
        .store
        .watch(WatchRequest {
            namespace,
            filter,
            start,
        })
        .await?;
    let options = WatchOptions {
        output,
        include,
        allow_bookmarks: params.allow_bookmarks,
        send_initial_events_end: params.send_initial_events,
        timeout,
        bookmark_interval: api.ctx.settings.bookmark_interval,
    };
    Ok(watch::response(
        stream,
        options,
        start_rv,
        api.ctx.shutdown.clone(),
        api.ctx.metrics.clone(),
    ))
}

/// What a GET of one object asks for, checked before anything is read.
pub(crate) struct GetItem {
    query: Query,
    output: Output,
    include: IncludeObject,
    /// The old single-object watch.
    watch: bool,
}

pub(crate) fn get_item_options<K: ServedResource>(
    api: &KindApi<K>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<GetItem> {
    let query = parse_query(query)?;
    let output = negotiate::output(headers)?;
    let include = query.include_object()?;
    api.store.check_ready()?;
    let watch = parse_bool("watch", query.watch.as_deref())?;
    // Read as kube-apiserver's storage reads it, though any version serves the latest state.
    query.resource_version()?;
    Ok(GetItem {
        query,
        output,
        include,
        watch,
    })
}

pub(crate) async fn get_item<K: ServedResource>(
    api: KindApi<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let GetItem {
        query,
        output,
        include,
        watch,
    } = get_item_options(&api, request.uri().query(), request.headers())?;
    if watch {
        // A watch with a name field selector.
        let mut filter = query.filter::<K>()?;
        filter.fields = FieldSelector::name(&name);
        return Box::pin(start_watch(
            api,
            Some(namespace),
            filter,
            &query,
            output,
            include,
        ))
        .await;
    }
    let object = api.store.get(&ObjectKey::new(namespace, name)).await?;
    object_response(&object, output, include, StatusCode::OK)
}

/// [`get_item`] without the general path: at once from a store in memory, else a future of
/// the store's own read with the options already parsed; None for a watch.
pub(crate) fn get_item_sync<K: ServedResource>(
    api: &KindApi<K>,
    namespace: &str,
    name: &str,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<ItemResponse> {
    let (output, include) = if query.is_none_or(str::is_empty) {
        // Most GETs carry no query: nothing to parse (get_item_options' checks otherwise).
        let checked = negotiate::output(headers).and_then(|output| {
            api.store.check_ready()?;
            Ok(output)
        });
        match checked {
            Ok(output) => (output, IncludeObject::Metadata),
            Err(error) => return Some(ItemResponse::Ready(error.into_response())),
        }
    } else {
        match get_item_options(api, query, headers) {
            Ok(options) if options.watch => return None,
            Ok(options) => (options.output, options.include),
            Err(error) => return Some(ItemResponse::Ready(error.into_response())),
        }
    };
    let respond = move |object: Result<Object<K>>| {
        object
            .and_then(|object| object_response(&object, output, include, StatusCode::OK))
            .into_response()
    };
    match api.store.get_sync(namespace, name) {
        Some(object) => Some(ItemResponse::Ready(respond(object))),
        None => {
            let store = api.store.clone();
            let key = ObjectKey::new(namespace.to_owned(), name.to_owned());
            Some(ItemResponse::Reading(Box::pin(async move {
                respond(store.get(&key).await)
            })))
        }
    }
}
