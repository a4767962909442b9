//! Documents computed once and served many times (discovery, OpenAPI): the body with its ETag,
//! or 304 Not Modified for a client whose `If-None-Match` names it.

use axum::{
    body::Bytes,
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};

/// `body` as `content_type`, varying on Accept; with `etag`, answered 304 when the client has
/// it already.
pub fn respond(
    body: &Bytes,
    content_type: &'static str,
    etag: Option<&HeaderValue>,
    headers: &HeaderMap,
) -> Response {
    let not_modified = etag.is_some_and(|etag| {
        headers
            .get(header::IF_NONE_MATCH)
            .is_some_and(|v| v.as_bytes() == etag.as_bytes())
    });
    let mut response = if not_modified {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (StatusCode::OK, body.clone()).into_response()
    };
    let h = response.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if let Some(etag) = etag {
        h.insert(header::ETAG, etag.clone());
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_with_the_document_gets_304() {
        let body = Bytes::from_static(b"{}");
        let etag = HeaderValue::from_static("\"abc\"");
        let mut headers = HeaderMap::new();
        let fresh = respond(&body, "application/json", Some(&etag), &headers);
        assert_eq!(fresh.status(), StatusCode::OK);
        assert_eq!(fresh.headers()[header::ETAG], "\"abc\"");
        headers.insert(header::IF_NONE_MATCH, etag.clone());
        let cached = respond(&body, "application/json", Some(&etag), &headers);
        assert_eq!(cached.status(), StatusCode::NOT_MODIFIED);
        let untagged = respond(&body, "application/json", None, &headers);
        assert_eq!(untagged.status(), StatusCode::OK);
        assert!(untagged.headers().get(header::ETAG).is_none());
    }
}
