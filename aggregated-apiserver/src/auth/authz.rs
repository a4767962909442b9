//! Authorization by SubjectAccessReview, as k8s.io/apiserver's delegated authorizer: allow and
//! deny answers are cached (10 s each by default), `system:masters` is always allowed, health
//! paths are always allowed. Without a cluster only `system:masters` (the dev identity) is allowed.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::OnceCell;

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::{Api, api::PostParams};

use super::user::UserInfo;
use crate::{error::Error, request_info::RequestInfo};

/// Paths anyone may call (`--authorization-always-allow-paths`).
pub const ALWAYS_ALLOW_PATHS: &[&str] = &["/healthz", "/livez", "/readyz"];

/// `path` is one of [`ALWAYS_ALLOW_PATHS`] or below one (`/readyz/<check>`): no review, and
/// anonymous callers may reach it.
pub fn always_allowed(path: &str) -> bool {
    ALWAYS_ALLOW_PATHS.iter().any(|p| {
        path == *p
            || path
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

#[derive(Debug, Clone)]
struct Decision {
    allowed: bool,
    reason: String,
    at: Instant,
}

/// May this user do this: `system:masters` and the always-allowed paths without asking,
/// everything else by a SubjectAccessReview to the cluster, answers cached. One review is sent
/// for concurrent identical requests.
pub struct Authorizer {
    client: Option<kube::Client>,
    allow_ttl: Duration,
    deny_ttl: Duration,
    /// One cell per distinct review: concurrent requests wait for the same review instead of
    /// each sending one.
    cache: Mutex<DecisionCache>,
    /// SubjectAccessReviews sent (for metrics and tests).
    pub reviews: AtomicU64,
}

const CACHE_LIMIT: usize = 10_000;

/// Keyed by [`Authorizer::cache_key`], hashed on every authorized request: foldhash, randomly
/// seeded per process (see PERFORMANCE.md); the size limit bounds what crafted keys could cost.
type DecisionCache = HashMap<String, Arc<OnceCell<Decision>>, foldhash::fast::RandomState>;

/// The request's part of a cache key, in order: resource attributes or the path.
fn request_fields<'a>(info: &RequestInfo<'a>) -> impl Iterator<Item = &'a str> {
    let (fields, n) = if info.is_resource_request {
        let i = info;
        let fields = [
            "r",
            i.verb,
            i.namespace,
            i.api_group,
            i.api_version,
            i.resource,
            i.subresource,
            i.name,
        ];
        (fields, 8)
    } else {
        (["n", info.verb, info.path, "", "", "", "", ""], 3)
    };
    fields.into_iter().take(n)
}

/// The decisions one connection's requests used lately, found by comparing a request's verb
/// and path with theirs instead of building and hashing its cache key: a client repeats its
/// requests (a controller's GETs, a poll), and the aggregator keeps them on the same
/// connections. A request's attributes are a function of its verb and path (see
/// [`RequestInfo`]), so the two name its cache key's request part. Each entry is the shared
/// cache's cell, so its answer and age are the cache's; the user is the connection's one `Arc`
/// for that identity (see `authn`), compared by address.
#[derive(Debug, Default)]
pub struct DecisionMemo(Mutex<Vec<Remembered>>);

#[derive(Debug)]
struct Remembered {
    user: Arc<UserInfo>,
    verb: &'static str,
    path: Box<str>,
    cell: Arc<OnceCell<Decision>>,
}

impl Remembered {
    fn is(&self, user: &Arc<UserInfo>, info: &RequestInfo<'_>) -> bool {
        Arc::ptr_eq(&self.user, user) && self.verb == info.verb && *self.path == *info.path
    }
}

/// Decisions one connection remembers.
const MEMO_DECISIONS: usize = 8;

impl DecisionMemo {
    fn find(
        &self,
        user: &Arc<UserInfo>,
        info: &RequestInfo<'_>,
    ) -> Option<Arc<OnceCell<Decision>>> {
        let memo = self.0.lock().ok()?;
        memo.iter()
            .rev()
            .find(|r| r.is(user, info))
            .map(|r| r.cell.clone())
    }

    fn remember(
        &self,
        user: &Arc<UserInfo>,
        info: &RequestInfo<'_>,
        cell: Arc<OnceCell<Decision>>,
    ) {
        let Ok(mut memo) = self.0.lock() else {
            return;
        };
        memo.retain(|r| !r.is(user, info));
        if memo.len() >= MEMO_DECISIONS {
            memo.remove(0);
        }
        memo.push(Remembered {
            user: user.clone(),
            verb: info.verb,
            path: info.path.into(),
            cell,
        });
    }
}

/// Appends `n` in decimal, then `;` (no formatting machinery: this is on the request path).
fn push_decimal(key: &mut String, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for &d in &digits[at..] {
        key.push(char::from(d));
    }
    key.push(';');
}

fn without_cluster(user: &UserInfo, info: &RequestInfo<'_>) -> Error {
    Error::Forbidden(forbidden_message(
        user,
        info,
        "this server runs without a cluster: only the development identity is allowed",
    ))
}

fn cache_poisoned() -> Error {
    Error::Internal("authorization cache lock poisoned".into())
}

/// kube-apiserver's Forbidden message for a request.
pub fn forbidden_message(user: &UserInfo, info: &RequestInfo<'_>, reason: &str) -> String {
    let mut message = if info.is_resource_request {
        let resource = if info.api_group.is_empty() {
            info.resource.to_owned()
        } else {
            format!("{}.{}", info.resource, info.api_group)
        };
        let object = if info.name.is_empty() {
            resource
        } else {
            format!("{resource} {:?}", info.name)
        };
        let scope = if info.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace {:?}", info.namespace)
        };
        let subresource = if info.subresource.is_empty() {
            String::new()
        } else {
            format!("/{}", info.subresource)
        };
        format!(
            "{object} is forbidden: User {:?} cannot {} resource \"{}{subresource}\" in API group {:?} {scope}",
            user.name, info.verb, info.resource, info.api_group
        )
    } else {
        format!(
            "forbidden: User {:?} cannot {} path {:?}",
            user.name, info.verb, info.path
        )
    };
    if !reason.is_empty() {
        message.push_str(": ");
        message.push_str(reason);
    }
    message
}

impl Authorizer {
    /// Reviews with `client`'s cluster (None: only `system:masters` is allowed), caching
    /// allowing answers for `allow_ttl` and denying ones for `deny_ttl`.
    pub fn new(client: Option<kube::Client>, allow_ttl: Duration, deny_ttl: Duration) -> Self {
        Self {
            client,
            allow_ttl,
            deny_ttl,
            cache: Mutex::default(),
            reviews: AtomicU64::new(0),
        }
    }

    /// A review's user part.
    fn user_spec(user: &UserInfo) -> SubjectAccessReviewSpec {
        SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone().into_iter().collect()),
            ..Default::default()
        }
    }

    fn spec(user: &UserInfo, info: &RequestInfo<'_>) -> SubjectAccessReviewSpec {
        SubjectAccessReviewSpec {
            resource_attributes: info.is_resource_request.then(|| ResourceAttributes {
                namespace: Some(info.namespace.to_owned()),
                verb: Some(info.verb.to_owned()),
                group: Some(info.api_group.to_owned()),
                version: Some(info.api_version.to_owned()),
                resource: Some(info.resource.to_owned()),
                subresource: Some(info.subresource.to_owned()),
                name: Some(info.name.to_owned()),
                ..Default::default()
            }),
            non_resource_attributes: (!info.is_resource_request).then(|| NonResourceAttributes {
                path: Some(info.path.to_owned()),
                verb: Some(info.verb.to_owned()),
            }),
            ..Self::user_spec(user)
        }
    }

    /// Everything a review depends on. The user's part is length-prefixed (extra keys are
    /// percent-decoded, so any byte may be in them); the request's fields come from the path
    /// and the method, where no NUL can be, and are separated by one. Built by appending (not
    /// `write!`): it is computed on every authorized request a connection's [`DecisionMemo`]
    /// does not know.
    fn cache_key(user: &UserInfo, info: &RequestInfo<'_>) -> String {
        let mut key = String::with_capacity(160);
        let field = |key: &mut String, value: &str| {
            push_decimal(key, value.len());
            key.push(':');
            key.push_str(value);
        };
        field(&mut key, &user.name);
        field(&mut key, &user.uid);
        push_decimal(&mut key, user.groups.len());
        for group in &user.groups {
            field(&mut key, group);
        }
        push_decimal(&mut key, user.extra.len());
        for (k, values) in &user.extra {
            field(&mut key, k);
            push_decimal(&mut key, values.len());
            for v in values {
                field(&mut key, v);
            }
        }
        key.push('\0');
        for value in request_fields(info) {
            key.push_str(value);
            key.push('\0');
        }
        key
    }

    fn ttl(&self, decision: &Decision) -> Duration {
        if decision.allowed {
            self.allow_ttl
        } else {
            self.deny_ttl
        }
    }

    /// [`Authorizer::authorize`] without waiting: None when a SubjectAccessReview has to be
    /// sent (or awaited) first.
    /// `now` is the request's start (one clock read per request, the edge's). `memo` is the
    /// connection's, when there is one.
    pub fn authorize_sync(
        &self,
        user: &Arc<UserInfo>,
        info: &RequestInfo<'_>,
        now: Instant,
        memo: Option<&DecisionMemo>,
    ) -> Option<Result<(), Error>> {
        if always_allowed(info.path) || user.is_system_masters() {
            return Some(Ok(()));
        }
        if self.client.is_none() {
            return Some(Err(without_cluster(user, info)));
        }
        let fresh =
            |decision: &Decision| now.saturating_duration_since(decision.at) < self.ttl(decision);
        if let Some(memo) = memo
            && let Some(cell) = memo.find(user, info)
            && let Some(decision) = cell.get()
            && fresh(decision)
        {
            return Some(self.verdict(decision, user, info));
        }
        let key = Self::cache_key(user, info);
        let cell = match self.cache.lock() {
            Ok(cache) => cache.get(&key)?.clone(),
            Err(_) => return Some(Err(cache_poisoned())),
        };
        let decision = cell.get().filter(|d| fresh(d))?;
        if let Some(memo) = memo {
            memo.remember(user, info, cell.clone());
        }
        Some(self.verdict(decision, user, info))
    }

    /// Why the request was decided as it was, for the audit log (kube-apiserver's
    /// `authorization.k8s.io/reason`): the review's reason, "" when none was asked.
    /// `memo` is the connection's, where the decision usually is.
    pub fn reason(
        &self,
        user: &Arc<UserInfo>,
        info: &RequestInfo<'_>,
        memo: Option<&DecisionMemo>,
    ) -> String {
        if always_allowed(info.path) || user.is_system_masters() {
            return String::new();
        }
        let cell = memo.and_then(|memo| memo.find(user, info)).or_else(|| {
            let key = Self::cache_key(user, info);
            self.cache.lock().ok()?.get(&key).cloned()
        });
        cell.and_then(|cell| cell.get().map(|d| d.reason.clone()))
            .unwrap_or_default()
    }

    /// Ok when `user` may make the request `info` describes; 403 Forbidden with
    /// kube-apiserver's message otherwise, 500 when the review could not be sent (not cached:
    /// the next request tries again).
    pub async fn authorize(
        &self,
        user: &Arc<UserInfo>,
        info: &RequestInfo<'_>,
    ) -> Result<(), Error> {
        if let Some(decided) = self.authorize_sync(user, info, Instant::now(), None) {
            return decided;
        }
        let Some(client) = &self.client else {
            return Err(without_cluster(user, info));
        };
        let key = Self::cache_key(user, info);
        let cell = self.cell(key)?;
        // The cached decision without an await; the review itself is boxed because its future
        // (a kube client request) is kilobytes, and every request's future would otherwise be
        // that large and be copied on the way.
        let decision = match cell.get() {
            Some(decision) => decision,
            None => {
                Box::pin(cell.get_or_try_init(|| self.send(client, Self::spec(user, info)))).await?
            }
        };
        self.verdict(decision, user, info)
    }

    /// A SubjectAccessReview of other attributes than a request's, for `user` (the CEL
    /// `authorizer` of admission policies): allowed or not, and the reason. Cached as requests'
    /// decisions are; `system:masters` is allowed without asking; the error when the review
    /// could not be sent.
    pub async fn review(
        &self,
        user: &UserInfo,
        resource: Option<ResourceAttributes>,
        non_resource: Option<NonResourceAttributes>,
    ) -> Result<(bool, String), Error> {
        if user.is_system_masters() {
            return Ok((true, String::new()));
        }
        let Some(client) = &self.client else {
            return Err(Error::Internal("no cluster to authorize with".into()));
        };
        let spec = SubjectAccessReviewSpec {
            resource_attributes: resource,
            non_resource_attributes: non_resource,
            ..Self::user_spec(user)
        };
        // Apart from requests' keys: a request's key never starts with a NUL.
        let key = format!(
            "\0{}",
            serde_json::to_string(&spec).map_err(|e| Error::Internal(e.to_string()))?
        );
        let cell = self.cell(key)?;
        let decision = cell.get_or_try_init(|| self.send(client, spec)).await?;
        Ok((decision.allowed, decision.reason.clone()))
    }

    /// The cache's cell for `key`: the fresh one, or a new one in its place (the cache is
    /// cleared when full).
    fn cell(&self, key: String) -> Result<Arc<OnceCell<Decision>>, Error> {
        let mut cache = self.cache.lock().map_err(|_| cache_poisoned())?;
        let fresh = cache
            .get(&key)
            .filter(|cell| cell.get().is_none_or(|d| d.at.elapsed() < self.ttl(d)))
            .cloned();
        Ok(match fresh {
            Some(cell) => cell,
            None => {
                if cache.len() >= CACHE_LIMIT {
                    cache.clear();
                }
                let cell = Arc::new(OnceCell::new());
                cache.insert(key, cell.clone());
                cell
            }
        })
    }

    /// Sends one SubjectAccessReview; the error when it could not be sent.
    async fn send(
        &self,
        client: &kube::Client,
        spec: SubjectAccessReviewSpec,
    ) -> Result<Decision, Error> {
        self.reviews.fetch_add(1, Ordering::Relaxed);
        let review = SubjectAccessReview {
            spec,
            ..Default::default()
        };
        let reviewed = Api::<SubjectAccessReview>::all(client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                Error::Internal(format!("authorization could not be checked: {e}"))
            })?;
        let status = reviewed.status.unwrap_or_default();
        Ok(Decision {
            allowed: status.allowed && status.denied != Some(true),
            reason: status.reason.unwrap_or_default(),
            at: Instant::now(),
        })
    }

    fn verdict(
        &self,
        decision: &Decision,
        user: &UserInfo,
        info: &RequestInfo<'_>,
    ) -> Result<(), Error> {
        if decision.allowed {
            Ok(())
        } else {
            Err(Error::Forbidden(forbidden_message(
                user,
                info,
                &decision.reason,
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use axum::http::Method;

    use super::*;

    /// An authorizer with a cluster that is never reached: decisions come from its cache.
    fn cached_only() -> Authorizer {
        let unreachable = tower::service_fn(|_: axum::http::Request<kube::client::Body>| async {
            Err::<axum::http::Response<kube::client::Body>, _>(std::io::Error::other(
                "no cluster in this test",
            ))
        });
        let client = kube::Client::new(unreachable, "default");
        Authorizer::new(
            Some(client),
            Duration::from_secs(10),
            Duration::from_secs(5),
        )
    }

    fn decide(
        authz: &Authorizer,
        user: &UserInfo,
        info: &RequestInfo<'_>,
        allowed: bool,
        at: Instant,
    ) {
        let decision = Decision {
            allowed,
            reason: "a reason".into(),
            at,
        };
        let key = Authorizer::cache_key(user, info);
        let cell = Arc::new(OnceCell::new_with(Some(decision)));
        authz.cache.lock().unwrap().insert(key, cell);
    }

    #[tokio::test]
    async fn a_connection_remembers_decisions_for_its_user_and_request_within_their_ttl() {
        let authz = cached_only();
        let memo = DecisionMemo::default();
        let alice = Arc::new(UserInfo {
            name: "alice".into(),
            ..Default::default()
        });
        let path = "/apis/zoo.example.com/v1alpha/namespaces/default/zebras/dolly";
        let get = RequestInfo::parse(&Method::GET, path, None);
        let now = Instant::now();
        decide(&authz, &alice, &get, true, now);
        let check = |user: &Arc<UserInfo>, info: &RequestInfo<'_>, at: Instant| {
            authz
                .authorize_sync(user, info, at, Some(&memo))
                .map(|r| r.is_ok())
        };
        assert_eq!(check(&alice, &get, now), Some(true));
        // The shared cache forgets: the connection still knows (the same cell, the same age).
        authz.cache.lock().unwrap().clear();
        assert_eq!(check(&alice, &get, now), Some(true));
        // Only for that user (by identity) and that request, and only within the TTL.
        let same_name = Arc::new((*alice).clone());
        assert_eq!(check(&same_name, &get, now), None);
        let delete = RequestInfo::parse(&Method::DELETE, path, None);
        assert_eq!(check(&alice, &delete, now), None);
        let other_path = path.replace("dolly", "dollx");
        let other = RequestInfo::parse(&Method::GET, &other_path, None);
        assert_eq!(check(&alice, &other, now), None);
        assert_eq!(check(&alice, &get, now + Duration::from_secs(11)), None);
        // Denials are remembered too, with their message.
        decide(&authz, &alice, &delete, false, now);
        for _ in 0..2 {
            let denied = authz.authorize_sync(&alice, &delete, now, Some(&memo));
            let Some(Err(Error::Forbidden(message))) = denied else {
                panic!("{denied:?}");
            };
            assert!(message.ends_with(": a reason"), "{message}");
        }
        authz.cache.lock().unwrap().clear();
        assert!(matches!(
            authz.authorize_sync(&alice, &delete, now, Some(&memo)),
            Some(Err(Error::Forbidden(_)))
        ));
        // A denial ages by the deny TTL (5 s here), not the allow TTL (10 s).
        let later = now + Duration::from_secs(6);
        assert!(
            authz
                .authorize_sync(&alice, &delete, later, Some(&memo))
                .is_none()
        );
        assert_eq!(check(&alice, &get, later), Some(true));
        // Bounded.
        for i in 0..2 * MEMO_DECISIONS {
            let path = format!("{path}{i}");
            let info = RequestInfo::parse(&Method::GET, &path, None);
            decide(&authz, &alice, &info, true, now);
            assert_eq!(check(&alice, &info, now), Some(true));
        }
        assert_eq!(memo.0.lock().unwrap().len(), MEMO_DECISIONS);
    }

    #[test]
    fn users_whose_extras_differ_never_share_a_cache_key() {
        let get = RequestInfo::parse(&Method::GET, "/apis/zoo.example.com/v1alpha", None);
        let user = |extra: &[(&str, &[&str])], groups: &[&str]| UserInfo {
            name: "alice".into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            extra: extra
                .iter()
                .map(|(k, vs)| {
                    (
                        (*k).to_owned(),
                        vs.iter().map(|v| (*v).to_owned()).collect(),
                    )
                })
                .collect(),
            ..Default::default()
        };
        let users = [
            user(&[("a=b", &["c"])], &[]),
            user(&[("a", &["b=c"])], &[]),
            user(&[("a\u{0}", &["c"])], &[]),
            user(&[("a", &["c", ""])], &[]),
            user(&[("a", &["c"])], &[""]),
            user(&[("a", &["c"]), ("", &[])], &[]),
            user(&[], &["a;1:c"]),
            user(&[], &["a", "c"]),
        ];
        let keys: std::collections::HashSet<String> = users
            .iter()
            .map(|u| Authorizer::cache_key(u, &get))
            .collect();
        assert_eq!(keys.len(), users.len(), "{keys:#?}");
    }

    #[test]
    fn messages_read_like_kube_apiserver() {
        let alice = UserInfo {
            name: "alice".into(),
            ..Default::default()
        };
        let list = RequestInfo::parse(
            &Method::GET,
            "/apis/zoo.example.com/v1alpha/namespaces/default/zebras",
            None,
        );
        assert_eq!(
            forbidden_message(&alice, &list, ""),
            "zebras.zoo.example.com is forbidden: User \"alice\" cannot list resource \"zebras\" in API group \"zoo.example.com\" in the namespace \"default\""
        );
        let get = RequestInfo::parse(
            &Method::GET,
            "/apis/zoo.example.com/v1alpha/namespaces/default/zebras/dolly",
            None,
        );
        assert_eq!(
            forbidden_message(&alice, &get, ""),
            "zebras.zoo.example.com \"dolly\" is forbidden: User \"alice\" cannot get resource \"zebras\" in API group \"zoo.example.com\" in the namespace \"default\""
        );
        let all = RequestInfo::parse(
            &Method::GET,
            "/apis/zoo.example.com/v1alpha/zebras",
            Some("watch=true"),
        );
        assert!(forbidden_message(&alice, &all, "").ends_with(
            "cannot watch resource \"zebras\" in API group \"zoo.example.com\" at the cluster scope"
        ));
        let path = RequestInfo::parse(&Method::GET, "/metrics", None);
        assert_eq!(
            forbidden_message(&alice, &path, ""),
            "forbidden: User \"alice\" cannot get path \"/metrics\""
        );
        assert!(always_allowed("/readyz") && always_allowed("/readyz/ping"));
        assert!(!always_allowed("/readyzz") && !always_allowed("/metrics"));
    }
}
