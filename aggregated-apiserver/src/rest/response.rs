//! Responses: JSON bodies, one object in the negotiated form, warnings.

use std::cell::Cell;

use axum::{
    body::{Body, Bytes},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::Response,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::Serialize;

use crate::{
    error::{Error, Result},
    render::negotiate::Output,
    render::table::{self, IncludeObject, PartialObjectMetadata},
    resource::ServedResource,
    store::Object,
};

/// A GET of one object answered by [`super::Target::call_sync`]: at once, or once the store has
/// read it (a consistent read from a watch cache, which first catches up with its source). The
/// future borrows nothing; the edge bounds it by the request timeout.
pub enum ItemResponse {
    /// The response.
    Ready(Response),
    /// The response once the store has read the object.
    Reading(futures::future::BoxFuture<'static, Response>),
}

/// Headers a response's map has room for (see `json_response`): twelve, the usable room of
/// sixteen slots.
const RESPONSE_HEADER_ROOM: usize = 12;

/// The largest map kept for reuse: a request with many more headers is not the common case.
const SPARE_HEADER_ROOM: usize = 4 * RESPONSE_HEADER_ROOM;

thread_local! {
    /// An answered request's emptied header map, for the next response this thread builds.
    static SPARE_HEADERS: Cell<Option<HeaderMap>> = const { Cell::new(None) };
}

/// Keeps an answered request's header map, emptied, for the next response built on this
/// thread (see `json_response`), unless one is kept already.
pub fn recycle_headers(mut headers: HeaderMap) {
    if !(RESPONSE_HEADER_ROOM..=SPARE_HEADER_ROOM).contains(&headers.capacity()) {
        return;
    }
    headers.clear();
    SPARE_HEADERS.with(|spare| spare.set(Some(spare.take().unwrap_or(headers))));
}

/// Built directly: `(code, body).into_response()` would first set an octet-stream content type
/// only to have it replaced.
pub(crate) fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = code;
    // Sized once for both of its lives (PERFORMANCE.md). Over HTTP/2 hyper adds two headers to
    // it (date, content-length). Over HTTP/1.1 hyper keeps it, emptied, as the map the
    // connection's next request is parsed into: sized for this response alone, it grew on
    // every request with more headers (a GET from the aggregator carries about ten). The map
    // is the last answered request's when there is one (`recycle_headers`): over HTTP/1.1 one
    // map then serves a connection's requests and responses in turn, never reallocated.
    let mut headers = SPARE_HEADERS
        .with(Cell::take)
        .unwrap_or_else(|| HeaderMap::with_capacity(RESPONSE_HEADER_ROOM));
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    *response.headers_mut() = headers;
    response
}

pub(crate) fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(1024);
    serde_json::to_writer(&mut out, value)
        .map_err(|e| Error::Internal(format!("encoding response: {e}")))?;
    Ok(out)
}

pub(crate) fn object_response<K: ServedResource>(
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

pub(crate) fn with_warnings(mut response: Response, warnings: &[String]) -> Response {
    for value in warnings
        .iter()
        .filter_map(|w| crate::error::warning_header(w))
    {
        response.headers_mut().append(header::WARNING, value);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_reuses_the_last_answered_requests_header_map_emptied() {
        let mut request = HeaderMap::with_capacity(24);
        request.insert("x-remote-user", HeaderValue::from_static("alice"));
        request.append("x-remote-group", HeaderValue::from_static("a"));
        request.append("x-remote-group", HeaderValue::from_static("b"));
        let room = request.capacity();
        recycle_headers(request);
        let response = json_response(StatusCode::OK, "{}");
        assert_eq!(response.headers().capacity(), room);
        assert_eq!(response.headers().len(), 1);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
        // Taken: the next response gets a map of its own, sized for a response and a request.
        let next = json_response(StatusCode::OK, "{}");
        assert_eq!(next.headers().capacity(), RESPONSE_HEADER_ROOM);
        // A map too small (or too large) to be worth keeping is not kept.
        recycle_headers(HeaderMap::new());
        recycle_headers(HeaderMap::with_capacity(4 * SPARE_HEADER_ROOM));
        let fresh = json_response(StatusCode::OK, "{}");
        assert_eq!(fresh.headers().capacity(), RESPONSE_HEADER_ROOM);
    }
}
