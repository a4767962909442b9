//! The one error type of the server. Every variant renders as a `meta/v1 Status`, the only error
//! body kubectl and client-go decode (anything else becomes "the server could not find the
//! requested resource").

use axum::{
    http::{HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Status, StatusCause, StatusDetails};

/// Identifies the object an error is about, as `StatusDetails` does.
#[derive(Debug, Clone, Default)]
pub struct Subject {
    /// `<plural>.<group>`, e.g. `zebras.zoo.example.com`.
    pub resource: String,
    /// The API group, `details.group`.
    pub group: String,
    /// The resource (plural) for NotFound/AlreadyExists, the Kind for Invalid, as kube-apiserver does.
    pub kind: String,
    /// The object's name, `details.name`; empty when the error is about no one object.
    pub name: String,
}

/// One invalid field, reported as a `StatusCause`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The field's JSON path, e.g. `spec.weight` or `metadata.name`.
    pub field: String,
    /// `FieldValueInvalid`, `FieldValueRequired`, ...
    pub reason: &'static str,
    /// What is wrong, as kube-apiserver words it (`Invalid value: ...`, `Required value: ...`).
    pub message: String,
}

impl FieldError {
    /// `FieldValueInvalid`: `field` is `value`, which is wrong because of `detail`.
    pub fn invalid(field: &str, value: impl std::fmt::Display, detail: &str) -> Self {
        Self {
            field: field.to_owned(),
            reason: "FieldValueInvalid",
            message: format!("Invalid value: {value}: {detail}"),
        }
    }

    /// `FieldValueTooLong`: `field` is longer than `max` characters (kube-apiserver's words).
    pub fn too_long(field: &str, _value: &str, max: usize) -> Self {
        Self {
            field: field.to_owned(),
            reason: "FieldValueTooLong",
            message: format!("Too long: may not be more than {max} bytes"),
        }
    }

    /// `FieldValueForbidden`: `field` may not be set; `detail` says why.
    pub fn forbidden(field: &str, _value: &str, detail: &str) -> Self {
        Self {
            field: field.to_owned(),
            reason: "FieldValueForbidden",
            message: format!("Forbidden: {detail}"),
        }
    }

    /// `FieldValueRequired`: `field` is missing; `detail` says what it should hold.
    pub fn required(field: &str, detail: &str) -> Self {
        Self {
            field: field.to_owned(),
            reason: "FieldValueRequired",
            message: format!("Required value: {detail}"),
        }
    }
}

/// Every failure a request can meet, each rendered as kube-apiserver renders it: the HTTP code
/// ([`Error::code`]), the Status `reason` ([`Error::reason`]) and the message (`Display`).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// 404 `NotFound`: no such object.
    #[error("{}", not_found_message(.0))]
    NotFound(Subject),

    /// 404 `NotFound`: a path that names no resource of ours.
    #[error("the server could not find the requested resource")]
    NoRoute,

    /// 409 `AlreadyExists`: a create whose namespace and name are taken.
    #[error("{} \"{}\" already exists", .0.resource, .0.name)]
    AlreadyExists(Subject),

    /// 409 `Conflict`: a write against a resourceVersion or UID that is no longer current.
    #[error("Operation cannot be fulfilled on {} \"{}\": {}", .subject.resource, .subject.name, .message)]
    Conflict {
        /// The object written.
        subject: Subject,
        /// Why, e.g. "the object has been modified; please apply your changes to the latest
        /// version and try again".
        message: String,
    },

    /// 409 `Conflict` of a server-side apply: fields other managers own with other values,
    /// each a `FieldManagerConflict` cause (apimachinery's `NewApplyConflict`).
    #[error("{message}")]
    ApplyConflict {
        /// kube-apiserver's text, e.g. `Apply failed with 1 conflict: conflict with "x": .spec.weight`.
        message: String,
        /// One per conflicting field.
        causes: Vec<FieldError>,
    },

    /// 422 `Invalid`: an object (or ListOptions) that fails validation, every failing field
    /// listed as a `StatusCause`.
    #[error("{}.{} \"{}\" is invalid: {}", .subject.kind, .subject.group, .subject.name, join_causes(.causes))]
    Invalid {
        /// The object, its `kind` the Kind.
        subject: Subject,
        /// Every invalid field, in the order found.
        causes: Vec<FieldError>,
    },

    /// 422 `Invalid` with no causes: a JSON patch that does not apply to the object (as
    /// kube-apiserver's `NewGenericServerResponse(422, ...)`, whose message it keeps ahead of
    /// json-patch's own).
    #[error("the server rejected our request due to an error in our request: {0}")]
    PatchNotApplied(String),

    /// 400 `BadRequest`: a malformed request (query, body, path segment, continue token).
    #[error("{0}")]
    BadRequest(String),

    /// 405 `MethodNotAllowed`: a verb the kind does not serve (any write on a read-only kind).
    #[error("{0}")]
    MethodNotAllowed(String),

    /// 406 `NotAcceptable`: no media type in `Accept` that we can produce.
    #[error("{0}")]
    NotAcceptable(String),

    /// 415 `UnsupportedMediaType`: a body or patch type we do not read.
    #[error("{0}")]
    UnsupportedMediaType(String),

    /// 413 `RequestEntityTooLarge`: a body, JSON patch or patched object over its limit.
    #[error("Request entity too large: {0}")]
    RequestEntityTooLarge(String),

    /// 410 `Expired`: a resourceVersion or continue token older than the history kept;
    /// clients relist.
    #[error("{0}")]
    Expired(String),

    /// 504 `Timeout` with `Retry-After: 1` and cause `ResourceVersionTooLarge`: a
    /// resourceVersion the store has not reached ([`crate::store::too_large`]).
    #[error("Timeout: {0}")]
    TooLargeResourceVersion(String),

    /// 429 `TooManyRequests` with `Retry-After: 1`: the requests in flight are at their limit
    /// (`--max-requests-inflight`, `--max-mutating-requests-inflight`).
    #[error("Too many requests, please try again later.")]
    TooManyRequests,

    /// 504 `Timeout`: the request took longer than it may.
    #[error("Timeout: {0}")]
    Timeout(String),

    /// 401 `Unauthorized`: no identity on a path anonymous callers may not reach, or a bearer
    /// token that could not be reviewed.
    #[error("{0}")]
    Unauthorized(String),

    /// 403 `Forbidden`: the SubjectAccessReview (or its cached answer) denied the request, or
    /// there is no cluster to ask; the message is kube-apiserver's
    /// (`crate::auth::authz::forbidden_message`).
    #[error("{0}")]
    Forbidden(String),

    /// 403 `Forbidden` with the `NamespaceTerminating` cause: a create in a namespace being
    /// deleted (kube-apiserver's NamespaceLifecycle admission).
    #[error("{} \"{}\" is forbidden: unable to create new content in namespace {namespace} because it is being terminated", .subject.resource, .subject.name)]
    NamespaceTerminating {
        /// The object that was to be created (its name, or generateName).
        subject: Subject,
        /// The namespace being deleted.
        namespace: String,
    },

    /// 503 `ServiceUnavailable`: the kind's store cannot answer now (no cluster, cache not
    /// synced).
    #[error("{0}")]
    ServiceUnavailable(String),

    /// 500 `InternalError`: our fault, or a SubjectAccessReview that could not be sent.
    #[error("Internal error occurred: {0}")]
    Internal(String),

    /// Another error with the `Warning`s found before it (unknown fields of an invalid body:
    /// kube-apiserver sends them with its 422).
    #[error("{error}")]
    Warned {
        /// The error.
        error: Box<Error>,
        /// `Warning` headers of the response.
        warnings: Vec<String>,
    },

    /// An admission webhook's refusal: the Status it answered (its code at least 400, its
    /// message prefixed with `admission webhook "<name>" denied the request`), with the
    /// warnings the webhooks gave, which go back with it.
    #[error("{}", .status.message.as_deref().unwrap_or_default())]
    Admission {
        /// As the client gets it.
        status: Box<Status>,
        /// `Warning` headers of the response.
        warnings: Vec<String>,
    },
}

/// The crate's result, [`Error`] by default.
pub type Result<T, E = Error> = std::result::Result<T, E>;

fn not_found_message(subject: &Subject) -> String {
    if subject.name.is_empty() {
        format!("{} not found", subject.resource)
    } else {
        format!("{} \"{}\" not found", subject.resource, subject.name)
    }
}

fn status_causes(causes: &[FieldError]) -> Vec<StatusCause> {
    causes
        .iter()
        .map(|c| StatusCause {
            field: Some(c.field.clone()),
            message: Some(c.message.clone()),
            reason: Some(c.reason.to_owned()),
        })
        .collect()
}

fn join_causes(causes: &[FieldError]) -> String {
    let parts: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    if parts.len() == 1 {
        parts[0].clone()
    } else {
        format!("[{}]", parts.join(", "))
    }
}

impl Error {
    /// The HTTP status code, also the Status `code`.
    pub fn code(&self) -> StatusCode {
        match self {
            Error::NotFound(_) | Error::NoRoute => StatusCode::NOT_FOUND,
            Error::AlreadyExists(_) | Error::Conflict { .. } | Error::ApplyConflict { .. } => {
                StatusCode::CONFLICT
            }
            Error::Invalid { .. } | Error::PatchNotApplied(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Error::BadRequest(_) => StatusCode::BAD_REQUEST,
            Error::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            Error::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Error::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Error::RequestEntityTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Error::Expired(_) => StatusCode::GONE,
            Error::TooLargeResourceVersion(_) | Error::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            Error::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
            Error::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Error::Forbidden(_) | Error::NamespaceTerminating { .. } => StatusCode::FORBIDDEN,
            Error::ServiceUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Error::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Error::Warned { error, .. } => error.code(),
            Error::Admission { status, .. } => status
                .code
                .and_then(|code| u16::try_from(code).ok())
                .and_then(|code| StatusCode::from_u16(code).ok())
                .filter(|code| code.as_u16() >= 400)
                .unwrap_or(StatusCode::BAD_REQUEST),
        }
    }

    /// The `reason` field, spelled as apimachinery's `StatusReason` constants.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NotFound(_) | Error::NoRoute => "NotFound",
            Error::AlreadyExists(_) => "AlreadyExists",
            Error::Conflict { .. } | Error::ApplyConflict { .. } => "Conflict",
            Error::Invalid { .. } | Error::PatchNotApplied(_) => "Invalid",
            Error::BadRequest(_) => "BadRequest",
            Error::MethodNotAllowed(_) => "MethodNotAllowed",
            Error::NotAcceptable(_) => "NotAcceptable",
            Error::UnsupportedMediaType(_) => "UnsupportedMediaType",
            Error::RequestEntityTooLarge(_) => "RequestEntityTooLarge",
            Error::Expired(_) => "Expired",
            Error::TooLargeResourceVersion(_) | Error::Timeout(_) => "Timeout",
            Error::TooManyRequests => "TooManyRequests",
            Error::Unauthorized(_) => "Unauthorized",
            Error::Forbidden(_) | Error::NamespaceTerminating { .. } => "Forbidden",
            Error::ServiceUnavailable(_) => "ServiceUnavailable",
            Error::Internal(_) => "InternalError",
            Error::Warned { error, .. } => error.reason(),
            // The webhook's own reason is in the Status; this one names it for logs.
            Error::Admission { .. } => "AdmissionDenied",
        }
    }

    fn details(&self) -> Option<StatusDetails> {
        let subject = match self {
            Error::NotFound(s) | Error::AlreadyExists(s) | Error::Conflict { subject: s, .. } => s,
            Error::Invalid { subject, causes } => {
                return Some(StatusDetails {
                    name: Some(subject.name.clone()),
                    group: Some(subject.group.clone()),
                    kind: Some(subject.kind.clone()),
                    causes: Some(status_causes(causes)),
                    ..Default::default()
                });
            }
            Error::ApplyConflict { causes, .. } => {
                return Some(StatusDetails {
                    causes: Some(status_causes(causes)),
                    ..Default::default()
                });
            }
            Error::NamespaceTerminating { subject, namespace } => {
                return Some(StatusDetails {
                    name: (!subject.name.is_empty()).then(|| subject.name.clone()),
                    group: Some(subject.group.clone()),
                    kind: Some(subject.kind.clone()),
                    causes: Some(vec![StatusCause {
                        reason: Some("NamespaceTerminating".into()),
                        message: Some(format!("namespace {namespace} is being terminated")),
                        field: Some("metadata.namespace".into()),
                    }]),
                    ..Default::default()
                });
            }
            Error::TooLargeResourceVersion(_) => {
                return Some(StatusDetails {
                    causes: Some(vec![StatusCause {
                        reason: Some("ResourceVersionTooLarge".into()),
                        message: Some("Too large resource version".into()),
                        field: None,
                    }]),
                    retry_after_seconds: Some(1),
                    ..Default::default()
                });
            }
            Error::PatchNotApplied(_) => return Some(StatusDetails::default()),
            Error::Warned { error, .. } => return error.details(),
            Error::TooManyRequests => {
                return Some(StatusDetails {
                    retry_after_seconds: Some(1),
                    ..Default::default()
                });
            }
            _ => return None,
        };
        Some(StatusDetails {
            name: (!subject.name.is_empty()).then(|| subject.name.clone()),
            group: Some(subject.group.clone()),
            kind: Some(subject.kind.clone()),
            ..Default::default()
        })
    }

    /// An admission refusal with `earlier` warnings (of the body, of earlier webhooks) ahead
    /// of its own; other errors as they are.
    pub fn with_warnings(self, earlier: &[String]) -> Self {
        match self {
            Error::Admission { status, warnings } if !earlier.is_empty() => Error::Admission {
                status,
                warnings: earlier.iter().cloned().chain(warnings).collect(),
            },
            other => other,
        }
    }

    /// This error with the warnings a request's body gave (its unknown fields), as
    /// kube-apiserver sends them whatever the answer; an admission refusal carries them
    /// already.
    pub fn warned(self, warnings: &[String]) -> Self {
        match self {
            error @ (Error::Admission { .. } | Error::Warned { .. }) => error,
            error if warnings.is_empty() => error,
            error => Error::Warned {
                error: Box::new(error),
                warnings: warnings.to_vec(),
            },
        }
    }

    /// The `meta/v1 Status` this error is on the wire, also used as a watch `ERROR` event object.
    pub fn to_status(&self) -> Status {
        if let Error::Warned { error, .. } = self {
            return error.to_status();
        }
        if let Error::Admission { status, .. } = self {
            let mut status = (**status).clone();
            status.code = Some(i32::from(self.code().as_u16()));
            return status;
        }
        Status {
            code: Some(i32::from(self.code().as_u16())),
            details: self.details(),
            message: Some(self.to_string()),
            metadata: Default::default(),
            reason: Some(self.reason().to_owned()),
            status: Some("Failure".to_owned()),
        }
    }
}

impl IntoResponse for Error {
    fn into_response(self) -> Response {
        let code = self.code();
        if code.is_server_error() {
            tracing::warn!(error = %self, "request failed");
        }
        let body = serde_json::to_vec(&self.to_status()).unwrap_or_default();
        let mut response = (code, body).into_response();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if matches!(
            self,
            Error::TooLargeResourceVersion(_) | Error::TooManyRequests
        ) {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if let Error::Admission { warnings, .. } | Error::Warned { warnings, .. } = &self {
            for value in warning_headers(warnings) {
                response.headers_mut().append(header::WARNING, value);
            }
        }
        response.extensions_mut().insert(ErrorReason(self.reason()));
        response
    }
}

/// `error` and its causes on one line, as Go prints wrapped errors ("client error (Connect): tcp
/// connect error: Connection refused"): many errors name only their kind, their cause says what
/// happened. A cause whose text is already in the line is not repeated.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(error) = cause {
        let said = error.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = error.source();
    }
    text
}

/// A `Warning` header as kube-apiserver writes one: `299 - "<text>"`, quotes and backslashes
/// escaped; None for a text a header cannot carry (control characters, as kube-apiserver
/// drops them).
pub fn warning_header(text: &str) -> Option<HeaderValue> {
    let escaped = text.replace('\\', "\\\\").replace('"', "\\\"");
    HeaderValue::from_str(&format!("299 - \"{escaped}\"")).ok()
}

/// The `Warning` headers of a response, as kube-apiserver's recorder writes them: each text
/// once; past 4,096 characters in all, each cut to 256, and what still does not fit dropped
/// (a webhook cannot make the headers unbounded).
pub fn warning_headers(texts: &[String]) -> Vec<HeaderValue> {
    const TOTAL: usize = 4 * 1024;
    const ITEM: usize = 256;
    let mut unique: Vec<&str> = Vec::new();
    for text in texts {
        if !unique.contains(&text.as_str()) {
            unique.push(text);
        }
    }
    let total: usize = unique.iter().map(|t| t.chars().count()).sum();
    let mut written = 0;
    let mut headers = Vec::new();
    for text in unique {
        let text: String = if total > TOTAL {
            text.chars().take(ITEM).collect()
        } else {
            text.to_owned()
        };
        written += text.chars().count();
        if total > TOTAL && written > TOTAL {
            break;
        }
        headers.extend(warning_header(&text));
    }
    headers
}

/// Left on error responses so the request log can say why a request failed.
#[derive(Debug, Clone, Copy)]
pub struct ErrorReason(pub &'static str);

#[cfg(test)]
mod tests {
    use super::*;

    fn zebra(name: &str) -> Subject {
        Subject {
            resource: "zebras.zoo.example.com".into(),
            group: "zoo.example.com".into(),
            kind: "zebras".into(),
            name: name.into(),
        }
    }

    #[test]
    fn warnings_once_each_and_bounded() {
        let texts: Vec<String> = vec!["a \"quoted\" one".into(), "b".into(), "b".into()];
        let headers = warning_headers(&texts);
        assert_eq!(headers.len(), 2);
        assert_eq!(headers[0], "299 - \"a \\\"quoted\\\" one\"");
        // 100 texts of 1,000 characters: cut to 256 each, at most 4,096 in all.
        let long: Vec<String> = (0..100)
            .map(|i| format!("{i:03}{}", "x".repeat(997)))
            .collect();
        let headers = warning_headers(&long);
        assert_eq!(headers.len(), 16);
        assert!(headers.iter().all(|h| h.len() == 256 + "299 - \"\"".len()));
        assert!(warning_headers(&["bell\u{7}".into()]).is_empty());
    }

    #[test]
    fn not_found_reads_like_kube_apiserver() {
        let status = Error::NotFound(zebra("dolly")).to_status();
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(json["kind"], "Status");
        assert_eq!(json["apiVersion"], "v1");
        assert_eq!(json["code"], 404);
        assert_eq!(json["reason"], "NotFound");
        assert_eq!(
            json["message"],
            "zebras.zoo.example.com \"dolly\" not found"
        );
        assert_eq!(json["details"]["name"], "dolly");
        assert_eq!(json["details"]["kind"], "zebras");
    }

    #[test]
    fn invalid_lists_every_cause() {
        let mut subject = zebra("x");
        subject.kind = "Zebra".into();
        let err = Error::Invalid {
            subject,
            causes: vec![
                FieldError::invalid("spec.weight", -1.0, "must be greater than 0"),
                FieldError::invalid("spec.height", 0.0, "must be greater than 0"),
            ],
        };
        assert_eq!(err.code(), StatusCode::UNPROCESSABLE_ENTITY);
        assert_eq!(
            err.to_string(),
            "Zebra.zoo.example.com \"x\" is invalid: [spec.weight: Invalid value: -1: must be greater than 0, spec.height: Invalid value: 0: must be greater than 0]"
        );
        let causes = err.to_status().details.unwrap().causes.unwrap();
        assert_eq!(causes.len(), 2);
        assert_eq!(causes[0].field.as_deref(), Some("spec.weight"));
    }
}
