//! The REST verbs of one kind, written once for every [`ServedResource`]: get, list, watch,
//! create, update, patch, delete and deletecollection, with kube-apiserver's query parameters,
//! content negotiation, status codes and messages.

use std::{sync::Arc, time::Duration};

use axum::{
    body::{Body, Bytes},
    extract::Request,
    http::{HeaderMap, HeaderValue, Method, StatusCode, header},
    response::{IntoResponse, Response},
};
use futures::future::Either;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, Time};
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch as signal;

use crate::{
    error::{Error, FieldError, Result, Subject},
    list_body::{self, ListWriter, StreamedList},
    metrics::Metrics,
    negotiate::{self, Output},
    resource::{GROUP_VERSION, ObjectKey, ServedResource},
    selector::{FieldSelector, Filter, LabelSelector},
    store::{
        self, ListRequest, Object, Preconditions, ReadAt, Store, Stored, WatchRequest, WatchStart,
    },
    table::{self, IncludeObject, PartialObjectMetadata},
    validation,
    watch::{self, WatchOptions},
};

/// kube-apiserver's `--max-request-body-bytes` default for JSON bodies (3 MiB).
pub const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// Knobs of the REST layer shared by every kind.
#[derive(Debug, Clone)]
pub struct RestSettings {
    /// Watches without `timeoutSeconds` end after a random time in [min, 2*min), as kube-apiserver's
    /// `--min-request-timeout` does, so clients spread their reconnects.
    pub min_request_timeout: Duration,
    pub bookmark_interval: Duration,
    /// How long a request that is not a watch may take, response included (kube-apiserver's
    /// `--request-timeout`): past it, 504.
    pub request_timeout: Duration,
}

impl Default for RestSettings {
    fn default() -> Self {
        Self {
            min_request_timeout: Duration::from_secs(1800),
            bookmark_interval: Duration::from_secs(60),
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// What every handler can reach besides its store.
#[derive(Clone)]
pub struct RestContext {
    pub metrics: Arc<Metrics>,
    pub shutdown: signal::Receiver<bool>,
    pub settings: Arc<RestSettings>,
}

struct ApiInner<K> {
    store: Arc<dyn Store<K>>,
    ctx: RestContext,
}

/// A kind's handler state: one `Arc`, so the per-request clone is one atomic increment.
struct Api<K>(Arc<ApiInner<K>>);

impl<K> Clone for Api<K> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<K> std::ops::Deref for Api<K> {
    type Target = ApiInner<K>;
    fn deref(&self) -> &ApiInner<K> {
        &self.0
    }
}

/// The resource endpoints of every served kind, found from the request path the way
/// kube-apiserver's installer lays them out under `/apis/<group>/<version>/`:
/// `<plural>` (all namespaces), `namespaces/<namespace>/<plural>` and
/// `namespaces/<namespace>/<plural>/<name>`. Anything else (discovery, subresources, unknown
/// kinds) is not a resource endpoint and goes to the router.
///
/// These are the hot paths, so they are matched here rather than as axum routes with path
/// parameters: those cost a percent-decoded copy of every parameter and an extension map per
/// request, a tenth of a GET's CPU in callgrind.
#[derive(Default)]
pub struct Endpoints {
    kinds: Vec<(String, Arc<dyn Endpoint>)>,
}

/// A request's place among the resource endpoints (segments as sent, not yet decoded).
pub struct Target<'a> {
    endpoint: &'a Arc<dyn Endpoint>,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

/// One kind's REST verbs behind a path.
trait Endpoint: Send + Sync {
    fn call(
        &self,
        namespace: Option<String>,
        name: Option<String>,
        request: Request,
    ) -> futures::future::BoxFuture<'static, Response>;

    /// A GET of one object answered without waiting, when the store holds it in memory; None
    /// when only [`Endpoint::call`] can answer.
    fn get_now(
        &self,
        namespace: String,
        name: String,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<Response>;
}

impl Endpoints {
    pub fn with<K: ServedResource>(mut self, store: Arc<dyn Store<K>>, ctx: RestContext) -> Self {
        let api: Arc<dyn Endpoint> = Arc::new(Api::<K>(Arc::new(ApiInner { store, ctx })));
        self.kinds.push((K::plural_name(), api));
        self
    }

    pub fn find<'a>(&'a self, path: &'a str) -> Option<Target<'a>> {
        let rest = path
            .strip_prefix("/apis/")?
            .strip_prefix(GROUP_VERSION)?
            .strip_prefix('/')?;
        let mut segments = crate::request_info::segments(rest);
        let first = segments.next()?;
        let (namespace, plural) = if first == "namespaces" {
            (Some(segments.next()?), segments.next()?)
        } else {
            (None, first)
        };
        let name = segments.next();
        // No subresources are served; namespaced kinds have no cluster-wide items.
        if segments.next().is_some()
            || namespace == Some("")
            || name == Some("")
            || (namespace.is_none() && name.is_some())
        {
            return None;
        }
        let (_, endpoint) = self.kinds.iter().find(|(p, _)| p == plural)?;
        Some(Target {
            endpoint,
            namespace,
            name,
        })
    }
}

impl Target<'_> {
    pub async fn call(self, request: Request) -> Response {
        let (namespace, name) = match (
            self.namespace.map(path_segment).transpose(),
            self.name.map(path_segment).transpose(),
        ) {
            (Ok(namespace), Ok(name)) => (namespace, name),
            (Err(error), _) | (_, Err(error)) => return error.into_response(),
        };
        self.endpoint.call(namespace, name, request).await
    }

    /// The response without waiting, when the request is a GET of one object the store holds
    /// in memory; None when it has to go through [`Target::call`].
    pub fn call_now(
        &self,
        method: &Method,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<Response> {
        let (Some(namespace), Some(name)) = (self.namespace, self.name) else {
            return None;
        };
        if method != Method::GET && method != Method::HEAD {
            return None;
        }
        match (path_segment(namespace), path_segment(name)) {
            (Ok(namespace), Ok(name)) => self.endpoint.get_now(namespace, name, query, headers),
            (Err(error), _) | (_, Err(error)) => Some(error.into_response()),
        }
    }
}

/// A path segment as the client meant it (percent-decoded, as Go's net/url gives
/// kube-apiserver its paths).
fn path_segment(raw: &str) -> Result<String> {
    if !raw.contains('%') {
        return Ok(raw.to_owned());
    }
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::BadRequest(format!("invalid path segment {raw:?}: not UTF-8")))
}

impl<K: ServedResource> Endpoint for Api<K> {
    fn call(
        &self,
        namespace: Option<String>,
        name: Option<String>,
        request: Request,
    ) -> futures::future::BoxFuture<'static, Response> {
        Box::pin(self.clone().serve(namespace, name, request))
    }

    fn get_now(
        &self,
        namespace: String,
        name: String,
        query: Option<&str>,
        headers: &HeaderMap,
    ) -> Option<Response> {
        get_item_now(self, namespace, name, query, headers).map(IntoResponse::into_response)
    }
}

impl<K: ServedResource> Api<K> {
    async fn serve(
        self,
        namespace: Option<String>,
        name: Option<String>,
        request: Request,
    ) -> Response {
        let method = request.method().clone();
        let read = method == Method::GET || method == Method::HEAD;
        let writable = !K::READ_ONLY;
        let result = match (namespace, name) {
            (None, _) if read => list_all(self, request).await,
            (Some(namespace), None) if read => list_namespaced(self, namespace, request).await,
            (Some(namespace), Some(name)) if read => get_item(self, namespace, name, request).await,
            // Writes are boxed: their futures (body reads, patches) are the largest, and would
            // otherwise size (and be copied with) every read's future too.
            (Some(namespace), None) if writable && method == Method::POST => {
                Box::pin(create(self, namespace, request)).await
            }
            (Some(namespace), None) if writable && method == Method::DELETE => {
                Box::pin(delete_collection(self, namespace, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::PUT => {
                Box::pin(update(self, namespace, name, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::PATCH => {
                Box::pin(patch(self, namespace, name, request)).await
            }
            (Some(namespace), Some(name)) if writable && method == Method::DELETE => {
                Box::pin(delete(self, namespace, name, request)).await
            }
            _ => Err(method_not_allowed::<K>(&method, request.uri().query())),
        };
        result.into_response()
    }
}

fn method_not_allowed<K: ServedResource>(method: &Method, query: Option<&str>) -> Error {
    let verb = match *method {
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::GET if query.is_some_and(|q| q.contains("watch=")) => "watch",
        _ => method.as_str(),
    };
    Error::MethodNotAllowed(format!(
        "{} is not supported on resources of kind {:?}",
        verb.to_ascii_lowercase(),
        K::qualified_resource()
    ))
}

// ---- query parameters ----

/// The query parameters kube-apiserver reads on resource requests, as sent. Others are
/// ignored, as kube-apiserver ignores them.
#[derive(Debug, Default)]
struct Query {
    label_selector: Option<String>,
    field_selector: Option<String>,
    limit: Option<String>,
    continue_: Option<String>,
    resource_version: Option<String>,
    resource_version_match: Option<String>,
    watch: Option<String>,
    allow_watch_bookmarks: Option<String>,
    timeout_seconds: Option<String>,
    send_initial_events: Option<String>,
    include_object: Option<String>,
    dry_run: Option<String>,
    field_validation: Option<String>,
}

/// Parses a query string; a parameter given twice takes its first value, as kube-apiserver's
/// parameter conversion does.
fn parse_query(raw: Option<&str>) -> Result<Query> {
    let mut query = Query::default();
    let raw = match raw {
        // Most GETs carry no query: no parsing.
        None | Some("") => return Ok(query),
        Some(raw) => raw,
    };
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw)
        .map_err(|e| Error::BadRequest(format!("invalid query parameters: {e}")))?;
    for (name, value) in pairs {
        let slot = match name.as_str() {
            "labelSelector" => &mut query.label_selector,
            "fieldSelector" => &mut query.field_selector,
            "limit" => &mut query.limit,
            "continue" => &mut query.continue_,
            "resourceVersion" => &mut query.resource_version,
            "resourceVersionMatch" => &mut query.resource_version_match,
            "watch" => &mut query.watch,
            "allowWatchBookmarks" => &mut query.allow_watch_bookmarks,
            "timeoutSeconds" => &mut query.timeout_seconds,
            "sendInitialEvents" => &mut query.send_initial_events,
            "includeObject" => &mut query.include_object,
            "dryRun" => &mut query.dry_run,
            "fieldValidation" => &mut query.field_validation,
            _ => continue,
        };
        if slot.is_none() {
            *slot = Some(value);
        }
    }
    Ok(query)
}

/// An integer parameter as Go's `strconv.ParseInt` reads it, with its error text.
fn parse_i64(value: &str) -> Result<i64> {
    value.parse().map_err(|e: std::num::ParseIntError| {
        let why = match e.kind() {
            std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow => {
                "value out of range"
            }
            _ => "invalid syntax",
        };
        Error::BadRequest(format!("strconv.ParseInt: parsing {value:?}: {why}"))
    })
}

/// Go's `strconv.ParseBool`, which is what kube-apiserver applies to boolean parameters.
fn parse_bool(name: &str, value: Option<&str>) -> Result<bool> {
    match value {
        None | Some("") => Ok(false),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True") => Ok(true),
        Some("0" | "f" | "F" | "false" | "FALSE" | "False") => Ok(false),
        Some(other) => Err(Error::BadRequest(format!(
            "invalid value for {name}: {other:?}: must be true or false"
        ))),
    }
}

fn parse_u64(name: &str, value: &str) -> Result<u64> {
    value.parse().map_err(|_| {
        Error::BadRequest(format!(
            "invalid value for {name}: {value:?}: must be a non-negative integer"
        ))
    })
}

fn list_options_invalid(causes: Vec<FieldError>) -> Error {
    Error::Invalid {
        subject: Subject {
            resource: String::new(),
            group: "meta.k8s.io".into(),
            kind: "ListOptions".into(),
            name: String::new(),
        },
        causes,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FieldValidation {
    Strict,
    Warn,
    Ignore,
}

impl Query {
    /// `limit`: at most this many; 0 or less (or none) means all, as in kube-apiserver.
    fn limit(&self) -> Result<Option<usize>> {
        match self.limit.as_deref() {
            None | Some("") => Ok(None),
            Some(l) => Ok(usize::try_from(parse_i64(l)?).ok().filter(|l| *l > 0)),
        }
    }

    /// `timeoutSeconds`, parsed wherever ListOptions are (lists, watches, deletecollection):
    /// a malformed value is 400 even where it would not be used.
    fn timeout_seconds(&self) -> Result<Option<Duration>> {
        match self.timeout_seconds.as_deref() {
            None | Some("") => Ok(None),
            Some(s) => Ok(Some(Duration::from_secs(
                u64::try_from(parse_i64(s)?).unwrap_or(0),
            ))),
        }
    }

    fn filter(&self) -> Result<Filter> {
        Ok(Filter {
            labels: LabelSelector::parse(self.label_selector.as_deref().unwrap_or(""))?,
            fields: FieldSelector::parse(self.field_selector.as_deref().unwrap_or(""))?,
        })
    }

    fn resource_version(&self) -> Result<Option<u64>> {
        match self.resource_version.as_deref() {
            None | Some("") => Ok(None),
            Some(rv) => parse_u64("resourceVersion", rv).map(Some),
        }
    }

    fn include_object(&self) -> Result<IncludeObject> {
        match self.include_object.as_deref() {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("None") => Ok(IncludeObject::None),
            Some("Object") => Ok(IncludeObject::Object),
            Some(other) => Err(Error::BadRequest(format!(
                "unrecognized includeObject value: {other:?}"
            ))),
        }
    }

    fn dry_run(&self) -> Result<bool> {
        match self.dry_run.as_deref() {
            None | Some("") => Ok(false),
            Some("All") => Ok(true),
            Some(other) => Err(Error::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            ))),
        }
    }

    fn field_validation(&self) -> Result<FieldValidation> {
        match self.field_validation.as_deref() {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some(other) => Err(Error::BadRequest(format!(
                "fieldValidation: Unsupported value: {other:?}: supported values: \"Ignore\", \"Strict\", \"Warn\""
            ))),
        }
    }

    /// `resourceVersion` + `resourceVersionMatch` for a list, validated as ListOptions are.
    fn read_at(&self) -> Result<ReadAt> {
        let rv = self.resource_version()?;
        match (self.resource_version_match.as_deref(), rv) {
            (None | Some(""), None) => Ok(ReadAt::Latest),
            (None | Some(""), Some(0)) => Ok(ReadAt::Any),
            (None | Some(""), Some(rv)) | (Some("NotOlderThan"), Some(rv)) => {
                Ok(ReadAt::NotOlderThan(rv))
            }
            (Some("Exact"), Some(0)) => Err(list_options_invalid(vec![FieldError::invalid(
                "resourceVersionMatch",
                "\"Exact\"",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            )])),
            (Some("Exact"), Some(rv)) => Ok(ReadAt::Exact(rv)),
            (Some("NotOlderThan" | "Exact"), None) => {
                Err(list_options_invalid(vec![FieldError {
                    field: "resourceVersionMatch".into(),
                    reason: "FieldValueForbidden",
                    message: "Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided".into(),
                }]))
            }
            (Some(other), _) => Err(list_options_invalid(vec![FieldError {
                field: "resourceVersionMatch".into(),
                reason: "FieldValueNotSupported",
                message: format!(
                    "Unsupported value: {other:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            }])),
        }
    }
}

// ---- responses ----

/// Built directly: `(code, body).into_response()` would first set an octet-stream content type
/// only to have it replaced.
fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = code;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(1024);
    serde_json::to_writer(&mut out, value)
        .map_err(|e| Error::Internal(format!("encoding response: {e}")))?;
    Ok(out)
}

fn object_response<K: ServedResource>(
    object: &Object<K>,
    output: Output,
    include: IncludeObject,
    code: StatusCode,
) -> Result<Response> {
    let body: Bytes = match output {
        Output::Json => return Ok(json_response(code, object.json().clone())),
        Output::PartialObjectMetadata(v) => {
            to_json(&PartialObjectMetadata::new(object.meta(), v))?.into()
        }
        Output::Table(v) => table::write(
            std::slice::from_ref(object),
            &ListMeta {
                resource_version: object.meta().resource_version.clone(),
                ..Default::default()
            },
            include,
            v,
            true,
        )?,
    };
    Ok(json_response(code, body))
}

// ---- get, list, watch ----

// Reads take the whole request (not a `HeaderMap`, which axum would clone) and borrow headers.

async fn list_all<K: ServedResource>(api: Api<K>, request: Request) -> Result<Response> {
    list_or_watch(api, None, request.uri().query(), request.headers()).await
}

async fn list_namespaced<K: ServedResource>(
    api: Api<K>,
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

async fn list_or_watch<K: ServedResource>(
    api: Api<K>,
    namespace: Option<String>,
    raw: Option<&str>,
    headers: &HeaderMap,
) -> Result<Response> {
    let query = parse_query(raw)?;
    let output = negotiate::output(headers)?;
    let include = query.include_object()?;
    api.store.check_ready()?;
    let filter = query.filter()?;
    if parse_bool("watch", query.watch.as_deref())? {
        return Box::pin(start_watch(api, namespace, filter, &query, output, include)).await;
    }
    if query.send_initial_events.is_some() {
        return Err(list_options_invalid(vec![FieldError {
            field: "sendInitialEvents".into(),
            reason: "FieldValueForbidden",
            message: "Forbidden: sendInitialEvents is forbidden for list".into(),
        }]));
    }
    let continue_token = query.continue_.clone().filter(|c| !c.is_empty());
    if continue_token.is_some()
        && query
            .resource_version()
            .ok()
            .flatten()
            .is_some_and(|rv| rv != 0)
    {
        return Err(Error::BadRequest(
            "specifying resource version is not allowed when using continue".into(),
        ));
    }
    let limit = query.limit()?;
    query.timeout_seconds()?;
    let request = ListRequest {
        namespace,
        filter,
        limit,
        continue_token,
        read_at: query.read_at()?,
    };
    // A large unlimited list is sent as it is written, a piece at a time.
    if let Some(cursor) = api.store.list_cursor(&request).await? {
        let writer = ListWriter::new::<K>(output, include, None);
        return Ok(match StreamedList::start(writer, cursor)? {
            Either::Left(whole) => json_response(StatusCode::OK, whole),
            Either::Right(streamed) => json_response(StatusCode::OK, Body::new(streamed)),
        });
    }
    // The body is written as the store lends the objects.
    let expected = match request.filter.is_empty() {
        true => api.store.count_now(request.namespace.as_deref()),
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

async fn start_watch<K: ServedResource>(
    api: Api<K>,
    namespace: Option<String>,
    filter: Filter,
    query: &Query,
    output: Output,
    include: IncludeObject,
) -> Result<Response> {
    let send_initial_events =
        parse_bool("sendInitialEvents", query.send_initial_events.as_deref())?;
    let allow_bookmarks = parse_bool(
        "allowWatchBookmarks",
        query.allow_watch_bookmarks.as_deref(),
    )?;
    let rv = query.resource_version()?;
    let rv_match = query.resource_version_match.as_deref().unwrap_or("");
    if query.send_initial_events.is_some() {
        let mut causes = Vec::new();
        if rv_match != "NotOlderThan" {
            causes.push(FieldError {
                field: "resourceVersionMatch".into(),
                reason: "FieldValueForbidden",
                message: "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan".into(),
            });
        }
        if send_initial_events && !allow_bookmarks {
            causes.push(FieldError {
                field: "allowWatchBookmarks".into(),
                reason: "FieldValueForbidden",
                message: "Forbidden: allowWatchBookmarks must be set to true when sendInitialEvents is true".into(),
            });
        }
        if !causes.is_empty() {
            return Err(list_options_invalid(causes));
        }
    } else if !rv_match.is_empty() {
        return Err(list_options_invalid(vec![FieldError {
            field: "resourceVersionMatch".into(),
            reason: "FieldValueForbidden",
            message: "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided".into(),
        }]));
    }
    // kube-apiserver's watch cache lets a plain watch wait for a version it has not reached,
    // but refuses a watch-list from one (it would hand out a state older than asked for).
    // (As kube-apiserver, an ERROR event on a 200 stream.)
    if send_initial_events
        && let Some(rv) = rv
        && rv > api.store.stats().resource_version
    {
        let refused = store::too_large(rv, api.store.stats().resource_version);
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
    let start = match (query.send_initial_events.is_some(), send_initial_events, rv) {
        (true, true, _) => WatchStart::InitialState,
        (true, false, rv) => WatchStart::After(
            rv.filter(|r| *r != 0)
                .unwrap_or_else(|| api.store.stats().resource_version),
        ),
        (false, _, None | Some(0)) => WatchStart::InitialState,
        (false, _, Some(rv)) => WatchStart::After(rv),
    };
    // 0, as none, is the server's choice (kube-apiserver's ListResource).
    let timeout = match query.timeout_seconds()?.filter(|t| !t.is_zero()) {
        Some(timeout) => timeout,
        None => {
            let min = api.ctx.settings.min_request_timeout;
            let extra = rand::rng().random_range(0.0..1.0);
            min.mul_f64(1.0 + extra)
        }
    };
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
        allow_bookmarks,
        send_initial_events_end: send_initial_events,
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
struct GetItem {
    query: Query,
    output: Output,
    include: IncludeObject,
    /// The old single-object watch.
    watch: bool,
}

fn get_item_options<K: ServedResource>(
    api: &Api<K>,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<GetItem> {
    let query = parse_query(query)?;
    let output = negotiate::output(headers)?;
    let include = query.include_object()?;
    api.store.check_ready()?;
    let watch = parse_bool("watch", query.watch.as_deref())?;
    Ok(GetItem {
        query,
        output,
        include,
        watch,
    })
}

async fn get_item<K: ServedResource>(
    api: Api<K>,
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
        let mut filter = query.filter()?;
        filter.fields = FieldSelector::parse(&format!("metadata.name={name}"))?;
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

/// [`get_item`] without waiting; None for a watch or a store that is not in memory.
fn get_item_now<K: ServedResource>(
    api: &Api<K>,
    namespace: String,
    name: String,
    query: Option<&str>,
    headers: &HeaderMap,
) -> Option<Result<Response>> {
    let options = match get_item_options(api, query, headers) {
        Ok(options) if options.watch => return None,
        Ok(options) => options,
        Err(error) => return Some(Err(error)),
    };
    let object = match api.store.get_now(&ObjectKey::new(namespace, name))? {
        Ok(object) => object,
        Err(error) => return Some(Err(error)),
    };
    Some(object_response(
        &object,
        options.output,
        options.include,
        StatusCode::OK,
    ))
}

// ---- writes ----

/// The whole body, up to [`MAX_BODY_BYTES`] (413 past it, as kube-apiserver).
async fn read_body(body: Body) -> Result<Bytes> {
    use http_body_util::BodyExt;
    match http_body_util::Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
    {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(Error::RequestEntityTooLarge(
            format!("limit is {MAX_BODY_BYTES}"),
        )),
        Err(e) => Err(Error::BadRequest(format!(
            "failed to read the request body: {e}"
        ))),
    }
}

fn cannot_handle<K: ServedResource>(detail: impl std::fmt::Display) -> Error {
    Error::BadRequest(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: {detail}",
        kind = K::kind_name(),
        version = K::version(&()),
    ))
}

/// Decodes a JSON object into `K`: apiVersion and kind must name this kind; unknown fields are
/// rejected, reported or dropped per `fieldValidation`. Returns the object and the warnings.
fn decode_object<K: ServedResource>(
    value: Value,
    validation: FieldValidation,
) -> Result<(K, Vec<String>)> {
    let Value::Object(map) = &value else {
        return Err(cannot_handle::<K>("the body must be a JSON object"));
    };
    match map.get("kind").and_then(Value::as_str) {
        None | Some("") => {
            return Err(cannot_handle::<K>("Object 'Kind' is missing in the body"));
        }
        Some(kind) if kind != K::kind_name() => {
            return Err(cannot_handle::<K>(format!(
                "the kind in the body ({kind}) does not match the expected kind ({})",
                K::kind_name()
            )));
        }
        Some(_) => {}
    }
    match map.get("apiVersion").and_then(Value::as_str) {
        Some(GROUP_VERSION) => {}
        other => {
            return Err(cannot_handle::<K>(format!(
                "the API version in the data ({}) does not match the expected API version ({GROUP_VERSION})",
                other.unwrap_or("")
            )));
        }
    }
    let mut unknown = Vec::new();
    let object: K = serde_ignored::deserialize(value, |path| {
        let path = path.to_string();
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    })
    .map_err(|e| cannot_handle::<K>(e))?;
    let messages: Vec<String> = unknown
        .iter()
        .map(|p| format!("unknown field \"{p}\""))
        .collect();
    match validation {
        FieldValidation::Strict if !messages.is_empty() => Err(cannot_handle::<K>(format!(
            "strict decoding error: {}",
            messages.join(", ")
        ))),
        FieldValidation::Warn => Ok((object, messages)),
        _ => Ok((object, Vec::new())),
    }
}

fn parse_json<K: ServedResource>(body: &[u8]) -> Result<Value> {
    serde_json::from_slice(body).map_err(|e| cannot_handle::<K>(e))
}

fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for warning in warnings {
        let escaped = warning.replace('\\', "\\\\").replace('"', "\\\"");
        if let Ok(value) = HeaderValue::from_str(&format!("299 - \"{escaped}\"")) {
            response.headers_mut().append(header::WARNING, value);
        }
    }
    response
}

fn validate<K: ServedResource>(object: &K) -> Result<()> {
    let meta = object.meta();
    let name = meta.name.clone().unwrap_or_default();
    let mut causes: Vec<FieldError> = Vec::new();
    causes.extend(validation::validate_name(&name));
    causes.extend(validation::validate_namespace(
        meta.namespace.as_deref().unwrap_or(""),
    ));
    causes.extend(validation::validate_metadata(meta));
    causes.extend(object.validate());
    if causes.is_empty() {
        Ok(())
    } else {
        Err(Error::Invalid {
            subject: K::invalid_subject(&name),
            causes,
        })
    }
}

const GENERATE_NAME_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

fn generate_name(prefix: &str) -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| GENERATE_NAME_ALPHABET[rng.random_range(0..GENERATE_NAME_ALPHABET.len())] as char)
        .collect();
    // kube-apiserver trims the prefix to 58 bytes so the result stays a valid name; here at a
    // character boundary (a prefix that is not ASCII is refused by validation anyway).
    let mut end = prefix.len().min(63 - 5);
    while !prefix.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}{suffix}", prefix.get(..end).unwrap_or_default())
}

fn now() -> Time {
    // kube-apiserver stores timestamps at second precision.
    let now = jiff::Timestamp::now();
    Time(jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// Server-owned metadata of a new object; clears what clients may not set.
fn prepare_create<K: ServedResource>(object: &mut K, namespace: &str) -> Result<()> {
    let meta = object.meta_mut();
    match meta.namespace.as_deref() {
        None | Some("") => meta.namespace = Some(namespace.to_owned()),
        Some(ns) if ns == namespace => {}
        Some(_) => {
            return Err(Error::BadRequest(
                "the namespace of the provided object does not match the namespace sent on the request".into(),
            ));
        }
    }
    if meta
        .resource_version
        .as_deref()
        .is_some_and(|rv| !rv.is_empty())
    {
        return Err(Error::BadRequest(
            "resourceVersion should not be set on objects to be created".into(),
        ));
    }
    if meta.name.as_deref().unwrap_or("").is_empty() {
        match meta.generate_name.as_deref() {
            Some(prefix) if !prefix.is_empty() => meta.name = Some(generate_name(prefix)),
            _ => {
                return Err(Error::Invalid {
                    subject: K::invalid_subject(""),
                    causes: vec![FieldError::required(
                        "metadata.name",
                        "name or generateName is required",
                    )],
                });
            }
        }
    }
    meta.uid = Some(uuid::Uuid::new_v4().to_string());
    meta.creation_timestamp = Some(now());
    meta.generation = Some(1);
    meta.deletion_timestamp = None;
    meta.deletion_grace_period_seconds = None;
    meta.managed_fields = None;
    meta.self_link = None;
    Ok(())
}

/// Carries the server-owned metadata of `current` into the replacement `next`.
fn prepare_update<K: ServedResource>(next: &mut K, current: &K) {
    let spec_changed = next.spec_changed(current);
    let old = current.meta();
    let generation = old.generation.unwrap_or(1) + i64::from(spec_changed);
    let meta = next.meta_mut();
    meta.uid = old.uid.clone();
    meta.creation_timestamp = old.creation_timestamp.clone();
    meta.generation = Some(generation);
    meta.namespace = old.namespace.clone();
    meta.deletion_timestamp = old.deletion_timestamp.clone();
    meta.managed_fields = None;
    meta.self_link = None;
}

async fn create<K: ServedResource>(
    api: Api<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let output = negotiate::output(&headers)?;
    negotiate::require_json_body(&headers)?;
    let body = read_body(body).await?;
    let (mut object, warnings) = decode_object::<K>(parse_json::<K>(&body)?, field_validation)?;
    prepare_create(&mut object, &namespace)?;
    validate(&object)?;
    let created = api.store.create(object, dry_run).await?;
    let response = object_response(
        &created,
        output,
        IncludeObject::Metadata,
        StatusCode::CREATED,
    )?;
    Ok(with_warnings(response, &warnings))
}

fn check_name<K: ServedResource>(object: &K, name: &str) -> Result<()> {
    match object.meta().name.as_deref() {
        Some(n) if n == name => Ok(()),
        other => Err(Error::BadRequest(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            other.unwrap_or("")
        ))),
    }
}

fn check_namespace<K: ServedResource>(object: &K, namespace: &str) -> Result<()> {
    match object.meta().namespace.as_deref() {
        None | Some("") => Ok(()),
        Some(ns) if ns == namespace => Ok(()),
        Some(_) => Err(Error::BadRequest(
            "the namespace of the provided object does not match the namespace sent on the request"
                .into(),
        )),
    }
}

async fn update<K: ServedResource>(
    api: Api<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let output = negotiate::output(&headers)?;
    negotiate::require_json_body(&headers)?;
    let body = read_body(body).await?;
    let (mut object, warnings) = decode_object::<K>(parse_json::<K>(&body)?, field_validation)?;
    check_name(&object, &name)?;
    check_namespace(&object, &namespace)?;
    let current = api.store.get(&ObjectKey::new(&namespace, &name)).await?;
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
    prepare_update(&mut object, current.as_ref());
    validate(&object)?;
    let updated = api.store.update(object, dry_run).await?;
    let response = object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
    Ok(with_warnings(response, &warnings))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchType {
    Merge,
    Json,
}

fn patch_type(headers: &HeaderMap) -> Result<PatchType> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let base = negotiate::media_type_base(content_type).unwrap_or_default();
    match base.as_str() {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/strategic-merge-patch+json" => Err(Error::UnsupportedMediaType(
            "strategic merge patch is not supported for farm.example.com resources (they are not built-in kinds); use a JSON merge patch (kubectl patch --type merge) or a JSON patch (--type json) - accepted media types include: application/json-patch+json, application/merge-patch+json".into(),
        )),
        "application/apply-patch+yaml" | "application/apply-patch+cbor" => Err(Error::UnsupportedMediaType(
            "server-side apply is not supported by farm-apiserver; use client-side kubectl apply - accepted media types include: application/json-patch+json, application/merge-patch+json".into(),
        )),
        other => Err(Error::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json"
        ))),
    }
}

/// Applies a patch to the object as it is served (its JSON), so a JSON patch `test` compares
/// against the values a GET shows.
fn apply_patch<K: ServedResource>(
    current: &Stored<K>,
    patch_type: PatchType,
    patch: &[u8],
) -> Result<Value> {
    let mut document: Value = serde_json::from_slice(current.json())
        .map_err(|e| Error::Internal(format!("decoding the stored object: {e}")))?;
    match patch_type {
        PatchType::Merge => {
            let patch: Value = serde_json::from_slice(patch)
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            if !patch.is_object() {
                return Err(Error::BadRequest(
                    "error decoding patch: a merge patch must be a JSON object".into(),
                ));
            }
            json_patch::merge(&mut document, &patch);
        }
        PatchType::Json => {
            let patch: json_patch::Patch = serde_json::from_slice(patch)
                .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?;
            apply_json_patch(&mut document, &patch).map_err(|message| Error::Invalid {
                subject: K::invalid_subject(current.meta().name.as_deref().unwrap_or("")),
                causes: vec![FieldError {
                    field: "patch".into(),
                    reason: "FieldValueInvalid",
                    message,
                }],
            })?;
        }
    }
    // Bounded for one request: a merge patch grows the object by at most its own size (3 MiB),
    // a JSON patch by its values and at most 3 MiB of copies; the object that results is
    // bounded by the caller.
    Ok(document)
}

/// kube-apiserver's bounds on a JSON patch (CVE-2019-1002100: each `copy` can double the
/// document): at most 10,000 operations, and at most 3 MiB added by copies in all.
const MAX_JSON_PATCH_OPERATIONS: usize = 10_000;
const MAX_JSON_PATCH_COPY_BYTES: usize = 3 * 1024 * 1024;

/// Bytes of `value` as JSON, counted without building the text.
fn json_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// Applies `patch` an operation at a time, refusing a copy that would take the bytes copied
/// past [`MAX_JSON_PATCH_COPY_BYTES`] before it is made. The error is the message.
fn apply_json_patch(
    document: &mut Value,
    patch: &json_patch::Patch,
) -> std::result::Result<(), String> {
    let mut copied = 0;
    for (index, operation) in patch.iter().enumerate() {
        if let json_patch::PatchOperation::Copy(copy) = operation
            && let Some(value) = document.pointer(copy.from.as_str())
        {
            copied += json_len(value);
            if copied > MAX_JSON_PATCH_COPY_BYTES {
                return Err(format!(
                    "Unable to complete the copy, the accumulated size increase of copy is {copied}, exceeding the limit {MAX_JSON_PATCH_COPY_BYTES}"
                ));
            }
        }
        json_patch::patch(document, std::slice::from_ref(operation))
            .map_err(|e| format!("operation {index} ({}): {}", op_name(operation), e.kind))?;
    }
    Ok(())
}

fn op_name(operation: &json_patch::PatchOperation) -> String {
    use json_patch::PatchOperation as Op;
    let (op, path) = match operation {
        Op::Add(o) => ("add", &o.path),
        Op::Remove(o) => ("remove", &o.path),
        Op::Replace(o) => ("replace", &o.path),
        Op::Move(o) => ("move", &o.path),
        Op::Copy(o) => ("copy", &o.path),
        Op::Test(o) => ("test", &o.path),
    };
    format!("{op} {:?}", path.as_str())
}

async fn patch<K: ServedResource>(
    api: Api<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let (raw, headers) = (parts.uri.query(), parts.headers);
    let query = parse_query(raw)?;
    let dry_run = query.dry_run()?;
    let field_validation = query.field_validation()?;
    let output = negotiate::output(&headers)?;
    let patch_type = patch_type(&headers)?;
    let body = read_body(body).await?;
    if patch_type == PatchType::Json {
        // Counted before anything is applied, as kube-apiserver does.
        let operations = serde_json::from_slice::<Vec<serde::de::IgnoredAny>>(&body)
            .map_err(|e| Error::BadRequest(format!("error decoding patch: {e}")))?
            .len();
        if operations > MAX_JSON_PATCH_OPERATIONS {
            return Err(Error::RequestEntityTooLarge(format!(
                "The allowed maximum operations in a JSON patch is {MAX_JSON_PATCH_OPERATIONS}, got {operations}"
            )));
        }
    }
    let key = ObjectKey::new(&namespace, &name);
    // Patches without a resourceVersion retry on conflict, as kube-apiserver's GuaranteedUpdate.
    let mut attempts = 0;
    loop {
        attempts += 1;
        let current = api.store.get(&key).await?;
        let patched = apply_patch(&current, patch_type, &body)?;
        let (mut object, warnings) = decode_object::<K>(patched, field_validation)?;
        // Patch after patch must not grow an object past what one request may send.
        let size = json_len(&object);
        if size > MAX_BODY_BYTES {
            return Err(Error::RequestEntityTooLarge(format!(
                "the patched object would be {size} bytes, limit is {MAX_BODY_BYTES}"
            )));
        }
        check_name(&object, &name)?;
        check_namespace(&object, &namespace)?;
        let pinned = object.meta().resource_version != current.meta().resource_version;
        if object
            .meta()
            .resource_version
            .as_deref()
            .unwrap_or("")
            .is_empty()
        {
            object.meta_mut().resource_version = current.meta().resource_version.clone();
        }
        prepare_update(&mut object, current.as_ref());
        validate(&object)?;
        match api.store.update(object, dry_run).await {
            Ok(updated) => {
                let response =
                    object_response(&updated, output, IncludeObject::Metadata, StatusCode::OK)?;
                return Ok(with_warnings(response, &warnings));
            }
            Err(Error::Conflict { .. }) if !pinned && attempts < 5 => continue,
            Err(e) => return Err(e),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeleteOptions {
    #[serde(default)]
    preconditions: Option<Preconditions>,
    #[serde(default)]
    dry_run: Option<Vec<String>>,
}

fn parse_delete_options(body: &[u8]) -> Result<DeleteOptions> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(DeleteOptions::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| Error::BadRequest(format!("invalid DeleteOptions: {e}")))
}

fn dry_run_of(options: &DeleteOptions, query: &Query) -> Result<bool> {
    let from_body = match options.dry_run.as_deref() {
        None | Some([]) => false,
        Some([all]) if all == "All" => true,
        Some(other) => {
            return Err(Error::BadRequest(format!(
                "dryRun: Unsupported value: {other:?}: supported values: \"All\""
            )));
        }
    };
    Ok(from_body || query.dry_run()?)
}

async fn delete<K: ServedResource>(
    api: Api<K>,
    namespace: String,
    name: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let query = parse_query(raw)?;
    let body = read_body(body).await?;
    let options = parse_delete_options(&body)?;
    let dry_run = dry_run_of(&options, &query)?;
    let deleted = api
        .store
        .delete(
            &ObjectKey::new(namespace, name),
            &options.preconditions.unwrap_or_default(),
            dry_run,
        )
        .await?;
    Ok(json_response(StatusCode::OK, to_json(deleted.as_ref())?))
}

async fn delete_collection<K: ServedResource>(
    api: Api<K>,
    namespace: String,
    request: Request,
) -> Result<Response> {
    let (parts, body) = request.into_parts();
    let raw = parts.uri.query();
    let query = parse_query(raw)?;
    // ListOptions are checked whole before anything is deleted.
    let filter = query.filter()?;
    query.timeout_seconds()?;
    query.limit()?;
    let body = read_body(body).await?;
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
            .store
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
        resource_version: Some(api.store.stats().resource_version.to_string()),
        ..Default::default()
    };
    Ok(json_response(
        StatusCode::OK,
        list_body::json_list::<K>(&deleted, &metadata)?,
    ))
}
