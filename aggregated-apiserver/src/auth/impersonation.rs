//! Impersonation, as k8s.io/apiserver's `WithImpersonation` filter: a request with
//! `Impersonate-User` (and optionally `Impersonate-Uid`, `Impersonate-Group` and
//! `Impersonate-Extra-<key>`) acts as that user once the authenticated user may `impersonate`
//! each part of it (one SubjectAccessReview per part, cached as any). The request is then
//! authorized, admitted and logged as the impersonated user; the audit log names both.
//!
//! Through kube-apiserver nothing arrives here to impersonate: its own filter has replaced the
//! user before the aggregator proxies the request. A client that calls this server directly
//! (`kubectl --as` with the development kubeconfig) is served as kube-apiserver serves it.

use std::{collections::BTreeMap, sync::Arc};

use axum::http::HeaderMap;
use k8s_openapi::api::authorization::v1::ResourceAttributes;

use super::{Authorizer, UserInfo, authz::forbidden_message};
use crate::{error::Error, request_info::RequestInfo};

/// Every impersonation header's name starts so (header names are lower-case).
const PREFIX: &str = "impersonate-";
const USER: &str = "impersonate-user";
const UID: &str = "impersonate-uid";
const GROUP: &str = "impersonate-group";
const EXTRA: &str = "impersonate-extra-";

/// The group kube-apiserver's authentication API is in (`userextras` and `uids`).
const AUTHENTICATION_GROUP: &str = "authentication.k8s.io";

/// Whether the request asks to impersonate: any `Impersonate-*` header (names only, so a
/// request without one pays a walk over its header names).
pub fn requested(headers: &HeaderMap) -> bool {
    headers.keys().any(|name| name.as_str().starts_with(PREFIX))
}

/// The user the headers name, as `buildImpersonationRequests` reads them.
#[derive(Debug, Default, PartialEq)]
struct Asked {
    name: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
}

/// None when nothing is asked (no `Impersonate-*` header kube-apiserver reads, or only empty
/// ones); 400 for what kube-apiserver refuses (it answers these 500, a client's mistake all the
/// same).
fn asked(headers: &HeaderMap) -> Result<Option<Asked>, Error> {
    let text = |value: &axum::http::HeaderValue| {
        value
            .to_str()
            .map(str::to_owned)
            .map_err(|_| Error::BadRequest("impersonation headers must be text".into()))
    };
    let mut asked = Asked::default();
    for (name, value) in headers {
        let name = name.as_str();
        if name == USER {
            asked.name = text(value)?;
        } else if name == UID {
            asked.uid = text(value)?;
        } else if name == GROUP {
            asked.groups.push(text(value)?);
        } else if let Some(key) = name.strip_prefix(EXTRA) {
            // Keys are lower-case and percent-encoded on the wire, as the front proxy's are.
            let key = percent_encoding::percent_decode_str(key)
                .decode_utf8_lossy()
                .into_owned();
            asked.extra.entry(key).or_default().push(text(value)?);
        }
    }
    if asked.name.is_empty()
        && (!asked.uid.is_empty() || !asked.groups.is_empty() || !asked.extra.is_empty())
    {
        return Err(Error::BadRequest(
            "requested impersonation of a uid, groups or extra without impersonating a user".into(),
        ));
    }
    Ok((!asked.name.is_empty()).then_some(asked))
}

/// One thing impersonated, as the SubjectAccessReview asks about it (verb `impersonate`).
struct Part<'a> {
    group: &'a str,
    resource: &'a str,
    subresource: &'a str,
    namespace: &'a str,
    name: &'a str,
}

impl Part<'_> {
    /// The attributes as the request info the Forbidden message is made from.
    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            is_resource_request: true,
            verb: "impersonate",
            api_group: self.group,
            namespace: self.namespace,
            resource: self.resource,
            subresource: self.subresource,
            name: self.name,
            ..Default::default()
        }
    }

    fn attributes(&self) -> ResourceAttributes {
        let some = |s: &str| (!s.is_empty()).then(|| s.to_owned());
        ResourceAttributes {
            verb: Some("impersonate".into()),
            group: Some(self.group.to_owned()),
            resource: Some(self.resource.to_owned()),
            subresource: some(self.subresource),
            namespace: some(self.namespace),
            name: Some(self.name.to_owned()),
            ..Default::default()
        }
    }
}

/// A service account's user name split into its namespace and name.
fn service_account(name: &str) -> Option<(&str, &str)> {
    let (namespace, name) = name
        .strip_prefix("system:serviceaccount:")?
        .split_once(':')?;
    (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then_some((namespace, name))
}

/// The user `headers` ask `user` to act as, once `authz` allows `user` to impersonate each part
/// of it (the user or service account, each group, each extra value, the uid); None when they
/// ask for nobody; 403 with kube-apiserver's message naming the first part refused, 400 for
/// headers it refuses.
pub async fn impersonate(
    authz: &Authorizer,
    user: &UserInfo,
    headers: &HeaderMap,
) -> Result<Option<Arc<UserInfo>>, Error> {
    let Some(asked) = asked(headers)? else {
        return Ok(None);
    };
    let mut parts = Vec::new();
    let account = service_account(&asked.name);
    parts.push(match account {
        Some((namespace, name)) => Part {
            group: "",
            resource: "serviceaccounts",
            subresource: "",
            namespace,
            name,
        },
        None => Part {
            group: "",
            resource: "users",
            subresource: "",
            namespace: "",
            name: &asked.name,
        },
    });
    for group in &asked.groups {
        parts.push(Part {
            group: "",
            resource: "groups",
            subresource: "",
            namespace: "",
            name: group,
        });
    }
    for (key, values) in &asked.extra {
        for value in values {
            parts.push(Part {
                group: AUTHENTICATION_GROUP,
                resource: "userextras",
                subresource: key,
                namespace: "",
                name: value,
            });
        }
    }
    if !asked.uid.is_empty() {
        parts.push(Part {
            group: AUTHENTICATION_GROUP,
            resource: "uids",
            subresource: "",
            namespace: "",
            name: &asked.uid,
        });
    }
    for part in &parts {
        let (allowed, reason) = match authz.review(user, Some(part.attributes()), None).await {
            Ok(decided) => decided,
            // kube-apiserver refuses as well when the authorizer fails.
            Err(error) => (false, error.to_string()),
        };
        if !allowed {
            return Err(Error::Forbidden(forbidden_message(
                user,
                &part.info(),
                &reason,
            )));
        }
    }
    // A service account's groups are known when none are asked for.
    let groups = match account {
        Some((namespace, _)) if asked.groups.is_empty() => vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{namespace}"),
        ],
        _ => asked.groups,
    };
    let impersonated = UserInfo {
        name: asked.name,
        uid: asked.uid,
        groups,
        extra: asked.extra,
    };
    Ok(Some(Arc::new(impersonated.authenticated())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for (name, value) in pairs {
            headers.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        headers
    }

    #[test]
    fn the_headers_as_kube_apiserver_reads_them() {
        assert!(!requested(&headers(&[("accept", "*/*")])));
        assert!(requested(&headers(&[("Impersonate-Group", "g")])));
        let read = asked(&headers(&[
            ("Impersonate-User", "bob"),
            ("Impersonate-Group", "a"),
            ("Impersonate-Group", "b"),
            ("Impersonate-Extra-Scopes", "view"),
            ("Impersonate-Extra-example.com%2fteam", "farm"),
            ("Impersonate-Uid", "1234"),
        ]))
        .unwrap();
        assert_eq!(
            read,
            Some(Asked {
                name: "bob".into(),
                uid: "1234".into(),
                groups: vec!["a".into(), "b".into()],
                extra: [
                    ("example.com/team".to_owned(), vec!["farm".to_owned()]),
                    ("scopes".to_owned(), vec!["view".to_owned()]),
                ]
                .into(),
            })
        );
        // Other or empty headers ask for nobody.
        assert_eq!(asked(&headers(&[("Impersonate-Foo", "x")])).unwrap(), None);
        assert_eq!(asked(&headers(&[("Impersonate-User", "")])).unwrap(), None);
        // Groups without a user, as kube-apiserver refuses them (400 here).
        let refused = asked(&headers(&[("Impersonate-Group", "a")])).unwrap_err();
        assert!(matches!(refused, Error::BadRequest(_)), "{refused:?}");
    }

    #[test]
    fn service_accounts() {
        assert_eq!(
            service_account("system:serviceaccount:farm:robot"),
            Some(("farm", "robot"))
        );
        assert_eq!(service_account("system:serviceaccount:farm"), None);
        assert_eq!(service_account("robot"), None);
    }

    #[tokio::test]
    async fn masters_impersonate_and_the_impersonated_user_is_authenticated() {
        // Standalone: only system:masters may impersonate (it is always allowed).
        let authz = Authorizer::new(None, std::time::Duration::ZERO, std::time::Duration::ZERO);
        let admin = UserInfo {
            name: "admin".into(),
            groups: vec!["system:masters".into()],
            ..Default::default()
        };
        let user = impersonate(
            &authz,
            &admin,
            &headers(&[("Impersonate-User", "system:serviceaccount:farm:robot")]),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(user.name, "system:serviceaccount:farm:robot");
        assert_eq!(
            user.groups,
            [
                "system:serviceaccounts",
                "system:serviceaccounts:farm",
                "system:authenticated"
            ]
        );
        let alice = UserInfo {
            name: "alice".into(),
            ..Default::default()
        };
        let refused = impersonate(&authz, &alice, &headers(&[("Impersonate-User", "bob")]))
            .await
            .unwrap_err();
        let Error::Forbidden(message) = refused else {
            panic!("{refused:?}");
        };
        assert!(
            message.starts_with(
                "users \"bob\" is forbidden: User \"alice\" cannot impersonate resource \"users\" in API group \"\" at the cluster scope"
            ),
            "{message}"
        );
    }
}
