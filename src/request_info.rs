//! What a request is about, as k8s.io/apiserver's `RequestInfo` says it: the verb (get, list,
//! watch, create, ...), group, version, namespace, resource and name. Metrics, the request log and
//! authorization read it.

use axum::http::Method;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    pub is_resource_request: bool,
    pub verb: String,
    pub api_group: String,
    pub api_version: String,
    pub namespace: String,
    pub resource: String,
    pub subresource: String,
    pub name: String,
    pub path: String,
}

fn is_watch(query: Option<&str>) -> bool {
    query.is_some_and(|q| {
        q.split('&').any(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            k == "watch" && matches!(v, "true" | "1" | "t" | "T" | "TRUE" | "True")
        })
    })
}

impl RequestInfo {
    pub fn parse(method: &Method, path: &str, query: Option<&str>) -> Self {
        let non_resource = || RequestInfo {
            verb: method.as_str().to_ascii_lowercase(),
            path: path.to_owned(),
            ..Default::default()
        };
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["apis", group, version, rest @ ..] if !rest.is_empty() => (*group, *version, rest),
            ["api", version, rest @ ..] if !rest.is_empty() => ("", *version, rest),
            _ => return non_resource(),
        };
        let mut info = RequestInfo {
            is_resource_request: true,
            api_group: group.to_owned(),
            api_version: version.to_owned(),
            path: path.to_owned(),
            ..Default::default()
        };
        let rest = match rest {
            ["namespaces", namespace, rest @ ..] => {
                info.namespace = (*namespace).to_owned();
                if rest.is_empty() {
                    info.resource = "namespaces".into();
                    info.name = (*namespace).to_owned();
                    &[][..]
                } else {
                    rest
                }
            }
            rest => rest,
        };
        if let [resource, rest @ ..] = rest {
            info.resource = (*resource).to_owned();
            if let [name, rest @ ..] = rest {
                info.name = (*name).to_owned();
                if let [subresource, ..] = rest {
                    info.subresource = (*subresource).to_owned();
                }
            }
        }
        info.verb = match *method {
            Method::GET | Method::HEAD if is_watch(query) => "watch",
            Method::GET | Method::HEAD if info.name.is_empty() => "list",
            Method::GET | Method::HEAD => "get",
            Method::POST => "create",
            Method::PUT => "update",
            Method::PATCH => "patch",
            Method::DELETE if info.name.is_empty() => "deletecollection",
            Method::DELETE => "delete",
            _ => "",
        }
        .to_owned();
        if info.verb.is_empty() {
            info.verb = method.as_str().to_ascii_lowercase();
        }
        info
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_verbs() {
        let p = |m: Method, path: &str, q: Option<&str>| RequestInfo::parse(&m, path, q);
        let i = p(
            Method::GET,
            "/apis/farm.example.com/v1alpha/namespaces/default/llamas",
            Some("limit=500"),
        );
        assert_eq!(
            (i.verb.as_str(), i.namespace.as_str(), i.resource.as_str()),
            ("list", "default", "llamas")
        );
        let i = p(
            Method::GET,
            "/apis/farm.example.com/v1alpha/llamas",
            Some("watch=true&resourceVersion=3"),
        );
        assert_eq!((i.verb.as_str(), i.namespace.as_str()), ("watch", ""));
        let i = p(
            Method::DELETE,
            "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly",
            None,
        );
        assert_eq!((i.verb.as_str(), i.name.as_str()), ("delete", "dolly"));
        let i = p(Method::GET, "/apis/farm.example.com/v1alpha", None);
        assert!(!i.is_resource_request);
        assert_eq!(i.verb, "get");
        assert_eq!(i.path, "/apis/farm.example.com/v1alpha");
    }
}
