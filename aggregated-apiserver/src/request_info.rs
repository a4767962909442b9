//! What a request is about, as k8s.io/apiserver's `RequestInfo` says it: the verb (get, list,
//! watch, create, ...), group, version, namespace, resource and name. Metrics, the request log and
//! authorization read it.

use axum::http::Method;

/// One request as authorization, metrics and the log see it. Path parts are borrowed as sent
/// (not percent-decoded); a part the path does not have is "". A function of the verb and the
/// path: authorization's per-connection memo relies on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo<'a> {
    /// Under `/apis/<group>/<version>/` (or `/api/<version>/`) and naming a resource: the
    /// SubjectAccessReview then has resource attributes, else non-resource ones (`path`).
    pub is_resource_request: bool,
    /// For a resource request the API verb (`get`, `list`, `watch`, `create`, `update`,
    /// `patch`, `delete`, `deletecollection`); otherwise the lower-cased method.
    pub verb: &'static str,
    /// The API group; "" for the core group.
    pub api_group: &'a str,
    /// The API version.
    pub api_version: &'a str,
    /// The namespace the path names; "" for all namespaces or a cluster-scoped kind.
    pub namespace: &'a str,
    /// The resource's plural, e.g. `zebras`.
    pub resource: &'a str,
    /// The segment after the name (e.g. `status`).
    pub subresource: &'a str,
    /// The object's name; "" for a collection.
    pub name: &'a str,
    /// The whole request path, without the query.
    pub path: &'a str,
}

/// Whether the query asks for a watch, read exactly as the handler reads it (the first
/// `watch` parameter, percent-decoded; Go's ParseBool true values): authorization must judge
/// the verb that is served.
fn is_watch(query: Option<&str>) -> bool {
    let Some(query) = query else {
        return false;
    };
    // Most queries name no watch (a name spelled with escapes has a '%').
    if !query.contains("watch") && !query.contains('%') {
        return false;
    }
    form_urlencoded::parse(query.as_bytes())
        .find(|(key, _)| key == "watch")
        .is_some_and(|(_, value)| parse_bool(&value) == Some(true))
}

/// Go's `strconv.ParseBool`, which kube-apiserver applies to boolean query parameters; None
/// for a value it refuses.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// Non-resource verbs: the lower-cased method, as k8s.io/apiserver names them.
fn method_verb(method: &Method) -> &'static str {
    match *method {
        Method::GET => "get",
        Method::HEAD => "head",
        Method::POST => "post",
        Method::PUT => "put",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        Method::OPTIONS => "options",
        _ => "other",
    }
}

/// The `/`-separated segments of a path, exactly as `str::split('/')` gives them. Splits on the
/// byte (see PERFORMANCE.md).
pub fn segments(path: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(path);
    std::iter::from_fn(move || {
        let current = rest?;
        match current.bytes().position(|b| b == b'/') {
            Some(slash) => {
                rest = Some(&current[slash + 1..]);
                Some(&current[..slash])
            }
            None => {
                rest = None;
                Some(current)
            }
        }
    })
}

impl<'a> RequestInfo<'a> {
    /// Borrows from `path`: parsing a request costs no allocation.
    pub fn parse(method: &Method, path: &'a str, query: Option<&str>) -> Self {
        let non_resource = RequestInfo {
            verb: method_verb(method),
            path,
            ..Default::default()
        };
        let mut segments = segments(path.trim_matches('/'));
        let (group, version) = match (segments.next(), segments.next(), segments.next()) {
            (Some("apis"), Some(group), Some(version)) => (group, version),
            (Some("api"), Some(version), Some(first)) => {
                // Core group: the version is the second segment; put `first` back.
                return Self::resource(
                    method,
                    path,
                    query,
                    "",
                    version,
                    std::iter::once(first).chain(segments),
                );
            }
            _ => return non_resource,
        };
        let mut rest = segments.peekable();
        if rest.peek().is_none() {
            return non_resource;
        }
        Self::resource(method, path, query, group, version, rest)
    }

    fn resource(
        method: &Method,
        path: &'a str,
        query: Option<&str>,
        group: &'a str,
        version: &'a str,
        mut rest: impl Iterator<Item = &'a str>,
    ) -> Self {
        let mut info = RequestInfo {
            is_resource_request: true,
            api_group: group,
            api_version: version,
            path,
            ..Default::default()
        };
        let mut next = rest.next();
        if next == Some("namespaces") {
            if let Some(namespace) = rest.next() {
                info.namespace = namespace;
                next = rest.next();
                if next.is_none() {
                    info.resource = "namespaces";
                    info.name = namespace;
                }
            } else {
                info.resource = "namespaces";
                next = None;
            }
        }
        if let Some(resource) = next {
            info.resource = resource;
            if let Some(name) = rest.next() {
                info.name = name;
                if let Some(subresource) = rest.next() {
                    info.subresource = subresource;
                }
            }
        }
        info.verb = resource_verb(method, query, info.name.is_empty());
        info
    }

    /// A resource request whose parts routing has already found in `path` (the group, version,
    /// namespace, plural, name and subresource segments as sent): what [`RequestInfo::parse`]
    /// gives for that path, without splitting it again.
    #[allow(clippy::too_many_arguments)]
    pub fn of_resource(
        method: &Method,
        path: &'a str,
        query: Option<&str>,
        api_group: &'a str,
        api_version: &'a str,
        namespace: &'a str,
        resource: &'a str,
        name: &'a str,
        subresource: &'a str,
    ) -> Self {
        RequestInfo {
            is_resource_request: true,
            verb: resource_verb(method, query, name.is_empty()),
            api_group,
            api_version,
            namespace,
            resource,
            subresource,
            name,
            path,
        }
    }
}

/// The API verb of a resource request.
fn resource_verb(method: &Method, query: Option<&str>, collection: bool) -> &'static str {
    match *method {
        Method::GET | Method::HEAD if is_watch(query) => "watch",
        Method::GET | Method::HEAD if collection => "list",
        Method::GET | Method::HEAD => "get",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if collection => "deletecollection",
        Method::DELETE => "delete",
        _ => method_verb(method),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_are_what_split_gives() {
        for path in [
            "",
            "/",
            "a",
            "a/b",
            "/a//b/",
            "apis/zoo.example.com/v1alpha",
            "é/ü/",
        ] {
            assert_eq!(
                segments(path).collect::<Vec<_>>(),
                path.split('/').collect::<Vec<_>>(),
                "{path:?}"
            );
        }
    }

    #[test]
    fn resource_verbs() {
        fn p<'a>(m: Method, path: &'a str, q: Option<&str>) -> RequestInfo<'a> {
            RequestInfo::parse(&m, path, q)
        }
        let i = p(
            Method::GET,
            "/apis/zoo.example.com/v1alpha/namespaces/default/zebras",
            Some("limit=500"),
        );
        assert_eq!(
            (i.verb, i.namespace, i.resource),
            ("list", "default", "zebras")
        );
        let i = p(
            Method::GET,
            "/apis/zoo.example.com/v1alpha/zebras",
            Some("watch=true&resourceVersion=3"),
        );
        assert_eq!((i.verb, i.namespace), ("watch", ""));
        let i = p(
            Method::DELETE,
            "/apis/zoo.example.com/v1alpha/namespaces/default/zebras/dolly",
            None,
        );
        assert_eq!((i.verb, i.name), ("delete", "dolly"));
        let i = p(Method::GET, "/apis/zoo.example.com/v1alpha", None);
        assert!(!i.is_resource_request);
        assert_eq!(i.verb, "get");
        assert_eq!(i.path, "/apis/zoo.example.com/v1alpha");
    }
}
