//! Kubernetes' `url` CEL library (k8s.io/apiserver `pkg/cel/library/urls.go`): `url(s)`,
//! `isURL(s)`, and on a URL `getScheme`, `getHost`, `getHostname`, `getPort`,
//! `getEscapedPath`, `getQuery`. What is a URL is what Go's `url.ParseRequestURI` takes (an
//! absolute URI or an absolute path); the parts are `url.Parse`'s, as kube-apiserver reads
//! them. Written after Go's `net/url`, which no crate reproduces (the `url` crate follows the
//! WHATWG standard: it lowercases hosts, drops default ports, resolves `..`).

use std::{collections::HashMap, sync::Arc};

use super::library::answer;
use cel::{
    Env, ExecutionError, Value,
    common::{
        types::{CelString, STRING_TYPE, Type},
        value::CowVal,
    },
    objects::{Key, Map, Opaque},
};

/// The CEL type's name, as kube-apiserver's.
const NAME: &str = "kubernetes.URL";

/// A URL's parts as Go's `url.URL` keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Url {
    scheme: String,
    host: String,
    /// The path as written (escapes kept).
    path: String,
    query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        NAME
    }
}

impl Url {
    /// `url.ParseRequestURI`, then `url.Parse` for the parts (kube-apiserver's `url()`).
    pub fn parse(raw: &str) -> Result<Self, String> {
        let wrap = |e: String| format!("parse {raw:?}: {e}");
        parse(raw, true).map_err(wrap)?;
        let (without_fragment, _) = raw.split_once('#').unwrap_or((raw, ""));
        parse(without_fragment, false).map_err(wrap)
    }

    /// `URL.Port()`.
    fn port(&self) -> &str {
        split_host_port(&self.host).1
    }

    /// `URL.Hostname()`.
    fn hostname(&self) -> &str {
        split_host_port(&self.host).0
    }

    /// `URL.EscapedPath()`: the path as written where that is a valid escaping of it, else
    /// escaped.
    fn escaped_path(&self) -> String {
        let mut out = String::with_capacity(self.path.len());
        for c in self.path.chars() {
            if c.is_ascii_alphanumeric() || "-._~!$&'()*+,;=:@/%".contains(c) {
                out.push(c);
            } else {
                let mut buffer = [0u8; 4];
                for byte in c.encode_utf8(&mut buffer).bytes() {
                    out.push_str(&format!("%{byte:02X}"));
                }
            }
        }
        out
    }

    /// `URL.Query()`: pairs whose key or value does not unescape are left out, as Go does.
    fn query(&self) -> Vec<(String, Vec<String>)> {
        let mut found: Vec<(String, Vec<String>)> = Vec::new();
        for pair in self.query.split('&') {
            if pair.is_empty() || pair.contains(';') {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let (Some(key), Some(value)) = (unescape(key, true), unescape(value, true)) else {
                continue;
            };
            match found.iter_mut().find(|(k, _)| *k == key) {
                Some((_, values)) => values.push(value),
                None => found.push((key, vec![value])),
            }
        }
        found
    }
}

/// Go's `url.parse(rawURL, viaRequest)`, the parts kube-apiserver reads.
fn parse(raw: &str, via_request: bool) -> Result<Url, String> {
    if raw.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return Err("net/url: invalid control character in URL".into());
    }
    if raw.is_empty() && via_request {
        return Err("empty url".into());
    }
    let mut url = Url {
        scheme: String::new(),
        host: String::new(),
        path: String::new(),
        query: String::new(),
    };
    if raw == "*" {
        url.path = "*".into();
        return Ok(url);
    }
    let (scheme, mut rest) = scheme(raw)?;
    url.scheme = scheme.to_ascii_lowercase();
    if rest.ends_with('?') && rest.matches('?').count() == 1 {
        rest = &rest[..rest.len() - 1];
    } else if let Some((before, query)) = rest.split_once('?') {
        rest = before;
        url.query = query.to_owned();
    }
    if !rest.starts_with('/') {
        if !url.scheme.is_empty() {
            // Rootless: opaque, no host or path.
            return Ok(url);
        }
        if via_request {
            return Err("invalid URI for request".into());
        }
        let segment_end = rest.find('/').unwrap_or(rest.len());
        if rest[..segment_end].contains(':') {
            return Err("first path segment in URL cannot contain colon".into());
        }
    }
    if (!url.scheme.is_empty() || !via_request && !rest.starts_with("///"))
        && rest.starts_with("//")
    {
        let authority = &rest[2..];
        let end = authority.find('/').unwrap_or(authority.len());
        url.host = host_of(&authority[..end])?;
        rest = &authority[end..];
    }
    if unescape(rest, false).is_none() {
        return Err(format!("invalid URL escape {:?}", bad_escape(rest)));
    }
    url.path = rest.to_owned();
    Ok(url)
}

/// `getScheme`: the scheme and the rest; none when a character that cannot be in a scheme
/// comes before the first colon.
fn scheme(raw: &str) -> Result<(&str, &str), String> {
    for (i, b) in raw.bytes().enumerate() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' => {}
            b'0'..=b'9' | b'+' | b'-' | b'.' if i > 0 => {}
            b':' if i == 0 => return Err("missing protocol scheme".into()),
            b':' => return Ok((&raw[..i], &raw[i + 1..])),
            _ => return Ok(("", raw)),
        }
    }
    Ok(("", raw))
}

/// `parseAuthority`: the host (with its port), after checking the user info.
fn host_of(authority: &str) -> Result<String, String> {
    let host = match authority.rfind('@') {
        Some(at) => {
            let user = &authority[..at];
            if !user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-._:~!$&'()*+,;=%@".contains(c))
            {
                return Err("net/url: invalid userinfo".into());
            }
            &authority[at + 1..]
        }
        None => authority,
    };
    let port = if host.starts_with('[') {
        let close = host.rfind(']').ok_or("missing ']' in host")?;
        &host[close + 1..]
    } else {
        host.rfind(':').map_or("", |colon| &host[colon..])
    };
    if !valid_optional_port(port) {
        return Err(format!("invalid port {port:?} after host"));
    }
    if unescape(host, false).is_none() {
        return Err(format!("invalid URL escape {:?}", bad_escape(host)));
    }
    Ok(host.to_owned())
}

fn valid_optional_port(port: &str) -> bool {
    port.is_empty()
        || port
            .strip_prefix(':')
            .is_some_and(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
}

/// Go's `splitHostPort`: host (brackets off) and port.
fn split_host_port(host_port: &str) -> (&str, &str) {
    let (mut host, mut port) = (host_port, "");
    if let Some(colon) = host_port.rfind(':')
        && valid_optional_port(&host_port[colon..])
    {
        (host, port) = (&host_port[..colon], &host_port[colon + 1..]);
    }
    if host.len() >= 2 && host.starts_with('[') && host.ends_with(']') {
        host = &host[1..host.len() - 1];
    }
    (host, port)
}

/// Percent-decoding (`+` as a space in queries); None on a malformed escape.
fn unescape(text: &str, query: bool) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = text.get(i + 1..i + 3)?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 3;
            }
            b'+' if query => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok()
}

/// The malformed escape in `text`, for the error.
fn bad_escape(text: &str) -> &str {
    let start = text.find('%').unwrap_or(0);
    text.get(start..(start + 3).min(text.len())).unwrap_or(text)
}

/// Adds the library to `env`.
pub(super) fn add(env: &mut Env) -> Result<(), cel::DeclarationError> {
    let url = || Type::new_opaque_type(NAME);
    env.add_overload("url", "string_to_url", vec![STRING_TYPE], to_url)?;
    env.add_overload("isURL", "is_url_string", vec![STRING_TYPE], is_url)?;
    for (name, id, function) in [
        (
            "getScheme",
            "url_get_scheme",
            get_scheme as cel::common::functions::Function,
        ),
        ("getHost", "url_get_host", get_host),
        ("getHostname", "url_get_hostname", get_hostname),
        ("getPort", "url_get_port", get_port),
        ("getEscapedPath", "url_get_escaped_path", get_escaped_path),
        ("getQuery", "url_get_query", get_query),
    ] {
        env.add_member_overload(name, id, url(), vec![], function)?;
    }
    Ok(())
}

fn text<'a>(function: &str, args: &'a [CowVal<'_, '_>]) -> Result<&'a str, ExecutionError> {
    args.first()
        .and_then(|arg| arg.as_ref().downcast_ref::<CelString>())
        .map(|s| s.inner())
        .ok_or_else(|| ExecutionError::function_error(function, "not a string"))
}

fn this(function: &str, args: &[CowVal<'_, '_>]) -> Result<Url, ExecutionError> {
    match args.first().map(|arg| Value::try_from(arg.as_ref())) {
        Some(Ok(Value::Opaque(o))) => o.downcast_ref::<Url>().cloned(),
        _ => None,
    }
    .ok_or_else(|| ExecutionError::function_error(function, "not a URL"))
}

fn to_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let url = Url::parse(text("url", &args)?).map_err(|e| {
        ExecutionError::function_error(
            "url",
            format!("URL parse error during conversion from string: {e}"),
        )
    })?;
    answer(Value::Opaque(Arc::new(url)))
}

fn is_url<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Bool(parse(text("isURL", &args)?, true).is_ok()))
}

fn string<'b, 'v>(s: &str) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::String(Arc::new(s.to_owned())))
}

fn get_scheme<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    string(&this("getScheme", &args)?.scheme)
}

fn get_host<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    string(&this("getHost", &args)?.host)
}

fn get_hostname<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    string(this("getHostname", &args)?.hostname())
}

fn get_port<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    string(this("getPort", &args)?.port())
}

fn get_escaped_path<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    string(&this("getEscapedPath", &args)?.escaped_path())
}

fn get_query<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let map: HashMap<Key, Value> = this("getQuery", &args)?
        .query()
        .into_iter()
        .map(|(key, values)| {
            let values = values
                .into_iter()
                .map(|v| Value::String(Arc::new(v)))
                .collect();
            (Key::String(Arc::new(key)), Value::List(Arc::new(values)))
        })
        .collect();
    answer(Value::Map(Map { map: Arc::new(map) }))
}

#[cfg(test)]
mod tests {
    use super::super::library::tests::run;

    /// kube-apiserver's own cases (`library/urls_test.go`, `cel/library/library_test`).
    #[test]
    fn kubernetes_cases() {
        for source in [
            "url('https://user:pass@example.com:80/path?query=val#fragment').getScheme() == 'https'",
            "url('https://example.com:80/path').getHost() == 'example.com:80'",
            "url('https://[::1]:80/path').getHost() == '[::1]:80'",
            "url('https://[::1]:80/path').getHostname() == '::1'",
            "url('https://[::1]/path').getPort() == ''",
            "url('https://example.com:8443/').getPort() == '8443'",
            "url('https://example.com/').getHostname() == 'example.com'",
            "url('https://example.com/with space/').getEscapedPath() == '/with%20space/'",
            "url('https://example.com/path%2Fencoded').getEscapedPath() == '/path%2Fencoded'",
            "url('/absolute-path').getEscapedPath() == '/absolute-path'",
            "url('/absolute-path').getScheme() == '' && url('/absolute-path').getHost() == ''",
            "url('https://example.com/?k=a&k=b&x=1+2&bad=%zz').getQuery() == {'k': ['a', 'b'], 'x': ['1 2']}",
            "url('https://example.com/').getQuery() == {}",
            "url('https://example.com/path#frag?notquery').getEscapedPath() == '/path'",
            "isURL('https://example.com/') && isURL('/path') && isURL('mailto:someone')",
            "!isURL('example.com') && !isURL('') && !isURL(':no-scheme') && !isURL('https://a:b/')",
            "!isURL('https://[::1/') && !isURL('https://e.com/%zz')",
            "type(url('/a')) == type(url('https://b/'))",
            "url('https://b/') == url('https://b/') && url('https://b/') != url('https://c/')",
        ] {
            assert_eq!(run(source), Ok(cel::Value::Bool(true)), "{source}");
        }
        assert!(
            run("url('example.com')")
                .is_err_and(|e| e.contains("URL parse error during conversion from string"))
        );
    }
}
