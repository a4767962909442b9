//! Responses: JSON bodies, one object in the negotiated form, warnings.

use axum::{
    body::{Body, Bytes},
    http::{HeaderValue, StatusCode, header},
    response::Response,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;
use serde::Serialize;

use crate::{
    error::{Error, Result},
    negotiate::Output,
    resource::ServedResource,
    store::Object,
    table::{self, IncludeObject, PartialObjectMetadata},
};

/// Headers a response's map has room for (see `json_response`): twelve, the usable room of
/// sixteen slots.
const RESPONSE_HEADER_ROOM: usize = 12;

/// Built directly: `(code, body).into_response()` would first set an octet-stream content type
/// only to have it replaced.
pub(crate) fn json_response(code: StatusCode, body: impl Into<Body>) -> Response {
    let mut response = Response::new(body.into());
    *response.status_mut() = code;
    // Sized once for both of its lives (PERFORMANCE.md). Over HTTP/2 hyper adds two headers to
    // it (date, content-length). Over HTTP/1.1 hyper keeps it, emptied, as the map the
    // connection's next request is parsed into: sized for this response alone, it grew on
    // every request with more headers (a GET from the aggregator carries about ten).
    // Reserved in place: replacing the empty map would drop it.
    let headers = response.headers_mut();
    headers.reserve(RESPONSE_HEADER_ROOM);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
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
