//! `Accept` negotiation, as kube-apiserver does it: media types in the order (and q) the client
//! gave, with `as=`/`g=`/`v=` parameters selecting Table, PartialObjectMetadata or the discovery
//! documents.

use axum::http::{HeaderMap, header};

use crate::error::{Error, Result};

/// One entry of an Accept header.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaRange {
    /// The type, lower case: `application`, or `*`.
    pub type_: String,
    /// The subtype, lower case: `json`, or `*`.
    pub subtype: String,
    /// The parameters but `q`, in order: names lower case, values unquoted (`as`, `g`, `v`).
    pub params: Vec<(String, String)>,
    q: f32,
}

impl MediaRange {
    /// The value of parameter `name` (any case), if given.
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// `application/json`, `application/*` or `*/*`.
    pub fn accepts_json(&self) -> bool {
        matches!(
            (self.type_.as_str(), self.subtype.as_str()),
            ("application", "json") | ("application", "*") | ("*", "*")
        )
    }

    fn parse(entry: &str) -> Option<Self> {
        let mut parts = entry.split(';');
        let (type_, subtype) = parts.next()?.trim().split_once('/')?;
        let mut params = Vec::new();
        let mut q = 1.0;
        for param in parts {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let (k, v) = (k.trim().to_ascii_lowercase(), v.trim().trim_matches('"'));
            if k == "q" {
                q = v.parse().unwrap_or(0.0);
            } else {
                params.push((k, v.to_owned()));
            }
        }
        Some(Self {
            type_: type_.trim().to_ascii_lowercase(),
            subtype: subtype.trim().to_ascii_lowercase(),
            params,
            q,
        })
    }
}

/// The Accept header as ranges, best first. No header means `*/*`.
pub fn accept(headers: &HeaderMap) -> Vec<MediaRange> {
    let mut ranges: Vec<MediaRange> = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(MediaRange::parse)
        .filter(|r| r.q > 0.0)
        .collect();
    if ranges.is_empty() {
        ranges.push(MediaRange::parse("*/*").unwrap_or(MediaRange {
            type_: "*".into(),
            subtype: "*".into(),
            params: Vec::new(),
            q: 1.0,
        }));
    }
    // Stable: equal q keeps the client's order.
    ranges.sort_by(|a, b| b.q.total_cmp(&a.q));
    ranges
}

/// The `meta.k8s.io` version a Table or PartialObjectMetadata response is asked in (`v=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaVersion {
    /// `meta.k8s.io/v1`, what kubectl asks for first.
    V1,
    /// `meta.k8s.io/v1beta1`, for older clients.
    V1beta1,
}

impl MetaVersion {
    /// The `apiVersion` of the response: `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`.
    pub fn api_version(self) -> &'static str {
        match self {
            MetaVersion::V1 => "meta.k8s.io/v1",
            MetaVersion::V1beta1 => "meta.k8s.io/v1beta1",
        }
    }
}

/// The shape of an object or list response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// The objects themselves (no `as=`).
    Json,
    /// `as=Table`: what `kubectl get` prints.
    Table(MetaVersion),
    /// `as=PartialObjectMetadata` or `as=PartialObjectMetadataList`: metadata only.
    PartialObjectMetadata(MetaVersion),
}

fn meta_version(range: &MediaRange) -> Option<MetaVersion> {
    if range.param("g") != Some("meta.k8s.io") {
        return None;
    }
    match range.param("v") {
        Some("v1") => Some(MetaVersion::V1),
        Some("v1beta1") => Some(MetaVersion::V1beta1),
        _ => None,
    }
}

/// The message of the 406 for a get, list or watch.
pub const NOT_ACCEPTABLE: &str = "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io, application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io";

/// What `kubectl get` sends (client-go's table printer), byte for byte.
const KUBECTL_TABLE: &[u8] = b"application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// Picks the response shape for a get, list or watch: the first range, best q first, that we
/// can produce; 406 NotAcceptable when none is.
pub fn output(headers: &HeaderMap) -> Result<Output> {
    // The common cases, without parsing (see PERFORMANCE.md).
    let mut values = headers.get_all(header::ACCEPT).iter();
    match (values.next().map(|v| v.as_bytes()), values.next()) {
        (None, _) => return Ok(Output::Json),
        (Some(b"application/json" | b"*/*" | b"application/json, */*"), None) => {
            return Ok(Output::Json);
        }
        (Some(KUBECTL_TABLE), None) => return Ok(Output::Table(MetaVersion::V1)),
        _ => {}
    }
    parse_output(headers)
}

fn parse_output(headers: &HeaderMap) -> Result<Output> {
    for range in accept(headers) {
        if !range.accepts_json() {
            continue;
        }
        match range.param("as") {
            None => return Ok(Output::Json),
            Some("Table") => {
                if let Some(v) = meta_version(&range) {
                    return Ok(Output::Table(v));
                }
            }
            Some("PartialObjectMetadata" | "PartialObjectMetadataList") => {
                if let Some(v) = meta_version(&range) {
                    return Ok(Output::PartialObjectMetadata(v));
                }
            }
            Some(_) => {}
        }
    }
    Err(Error::NotAcceptable(NOT_ACCEPTABLE.into()))
}

/// Which discovery document `/apis` answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Discovery {
    /// Aggregated discovery, `apidiscovery.k8s.io/v2` APIGroupDiscoveryList.
    V2,
    /// Aggregated discovery, `apidiscovery.k8s.io/v2beta1` (all kube-apiserver 1.26 to 1.29
    /// asks for).
    V2beta1,
    /// The unaggregated documents (APIGroupList, APIGroup, APIResourceList).
    Legacy,
}

impl Discovery {
    /// The response's `Content-Type`, as kube-apiserver sends it: the aggregator checks it
    /// before it takes an answer as aggregated discovery.
    pub fn content_type(self) -> &'static str {
        match self {
            Discovery::V2 => "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            Discovery::V2beta1 => {
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            }
            Discovery::Legacy => "application/json",
        }
    }
}

/// Picks the discovery document for an `Accept` header, as [`output`] does; 406 when none of
/// the ranges is one we serve.
pub fn discovery(headers: &HeaderMap) -> Result<Discovery> {
    for range in accept(headers) {
        if !range.accepts_json() {
            continue;
        }
        match (range.param("as"), range.param("g"), range.param("v")) {
            (None, _, _) => return Ok(Discovery::Legacy),
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2")) => {
                return Ok(Discovery::V2);
            }
            (Some("APIGroupDiscoveryList"), Some("apidiscovery.k8s.io"), Some("v2beta1")) => {
                return Ok(Discovery::V2beta1);
            }
            _ => {}
        }
    }
    Err(Error::NotAcceptable(
        "only the following media types are accepted: application/json, application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList, application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList".into(),
    ))
}

/// RFC 2045 token characters, as Go's `mime` package checks them.
fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_graphic() && !b"()<>@,;:\\\"/[]?=".contains(&b))
}

/// The longest RFC 2045 token at the start of `s`, and the rest.
fn token_prefix(s: &str) -> (&str, &str) {
    let end = s
        .bytes()
        .position(|b| !b.is_ascii_graphic() || b"()<>@,;:\\\"/[]?=".contains(&b))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// A parameter value at the start of `s` (a token, or a quoted string with backslash
/// escapes), and the rest; None when there is none.
fn value_prefix(s: &str) -> Option<&str> {
    let Some(quoted) = s.strip_prefix('"') else {
        let (value, rest) = token_prefix(s);
        return (!value.is_empty()).then_some(rest);
    };
    let mut escaped = false;
    for (i, c) in quoted.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return quoted.get(i + 1..),
            _ => {}
        }
    }
    None
}

/// A Content-Type's base type, lower case, when it parses as Go's `mime.ParseMediaType`
/// parses one (`type/subtype`, then `; name=value` parameters with optional spaces around the
/// `=`, a value a token or a quoted string; trailing semicolons let go); None when it is
/// malformed.
pub fn media_type_base(content_type: &str) -> Option<String> {
    let (base, mut rest) = match content_type.find(';') {
        Some(i) => content_type.split_at(i),
        None => (content_type, ""),
    };
    let base = base.trim();
    let (kind, subtype) = base.split_once('/')?;
    if !is_token(kind) || !is_token(subtype) {
        return None;
    }
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        rest = rest.strip_prefix(';')?.trim_start();
        if rest.is_empty() || rest.trim_start_matches([';', ' ', '\t']).is_empty() {
            break;
        }
        let (name, after) = token_prefix(rest);
        if name.is_empty() {
            return None;
        }
        let after = after.trim_start().strip_prefix('=')?.trim_start();
        rest = value_prefix(after)?;
    }
    Some(base.to_ascii_lowercase())
}

/// The encoding of a create or update body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFormat {
    /// `application/json`, or no Content-Type (kube-apiserver's default, for backwards
    /// compatibility).
    Json,
    /// `application/yaml`, which kube-apiserver also decodes.
    Yaml,
}

/// The encoding of a create or update body from its Content-Type; 415 for any other.
pub fn body_format(headers: &HeaderMap) -> Result<BodyFormat> {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    match media_type_base(content_type).as_deref() {
        Some("application/json") => Ok(BodyFormat::Json),
        Some("application/yaml") => Ok(BodyFormat::Yaml),
        _ => Err(Error::UnsupportedMediaType(format!(
            "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml (got {content_type:?})"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(accept: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ACCEPT, HeaderValue::from_str(accept).unwrap());
        h
    }

    #[test]
    fn media_types_parse_as_go_parses_them() {
        for ok in [
            "application/json",
            "application/json; charset=utf-8",
            "application/json;charset=utf-8;",
            "application/json; charset= \"utf-8\"",
            "application/json; charset=\"a;b\"",
            "application/json; x=\"q\\\"uote\"",
            "Application/JSON ;;",
        ] {
            assert_eq!(
                media_type_base(ok).as_deref(),
                Some(
                    ok.split(';')
                        .next()
                        .unwrap()
                        .trim()
                        .to_ascii_lowercase()
                        .as_str()
                ),
                "{ok}"
            );
        }
        for bad in [
            "application",
            "application/json; charset",
            "application/json; =utf-8",
            "application/json; charset=\"open",
            "application/json; a=b c",
            "not a/type",
        ] {
            assert_eq!(media_type_base(bad), None, "{bad}");
        }
    }

    #[test]
    fn kubectl_get_asks_for_a_table() {
        let h = headers(
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
        );
        assert_eq!(output(&h).unwrap(), Output::Table(MetaVersion::V1));
        // The shortcuts answer what parsing would.
        for accept in [
            std::str::from_utf8(KUBECTL_TABLE).unwrap(),
            "application/json",
            "*/*",
            "application/json, */*",
        ] {
            assert_eq!(
                output(&headers(accept)).unwrap(),
                parse_output(&headers(accept)).unwrap(),
                "{accept}"
            );
        }
        assert_eq!(output(&HeaderMap::new()).unwrap(), Output::Json);
        assert_eq!(
            output(&headers("application/json, */*")).unwrap(),
            Output::Json
        );
    }

    #[test]
    fn unsupported_types_are_406() {
        for accept in [
            "application/vnd.kubernetes.protobuf",
            "application/json;as=Table;v=v2;g=meta.k8s.io",
            "text/html",
        ] {
            assert_eq!(
                output(&headers(accept)).unwrap_err().code(),
                406,
                "{accept}"
            );
        }
    }

    #[test]
    fn aggregator_accept_picks_v2() {
        let h = headers(
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
        );
        assert_eq!(discovery(&h).unwrap(), Discovery::V2);
        let h =
            headers("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList");
        assert_eq!(discovery(&h).unwrap(), Discovery::V2beta1);
        assert_eq!(discovery(&HeaderMap::new()).unwrap(), Discovery::Legacy);
        let h = headers("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList");
        assert_eq!(discovery(&h).unwrap_err().code(), 406);
    }
}
