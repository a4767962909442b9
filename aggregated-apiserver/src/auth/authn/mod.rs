//! Authentication, in k8s.io/apiserver's order: the front proxy's client certificate (then the
//! user is in `X-Remote-*` headers), a client certificate from the client CA (CN = user,
//! O = groups), a bearer token (TokenReview, cached), else anonymous. The front proxy's
//! headers are read in `front_proxy`, tokens reviewed in `token`.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use arc_swap::ArcSwap;
use axum::http::HeaderMap;
use rustls::{
    RootCertStore,
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};

mod front_proxy;
mod token;

use front_proxy::UserMemo;
pub use front_proxy::{RequestHeaderConfig, strip_identity_headers};
pub use token::TokenReviewer;

use super::authz::DecisionMemo;
pub use super::user::UserInfo;
use crate::error::Error;

/// Verified client certificate chain of a connection (leaf first, empty when none was sent),
/// with what authentication decided about it, so that is worked out once per connection (and
/// once per distinct chain across connections: see [`Authenticator`]).
///
/// One `Arc`: the connection's service is cloned for every request (hyper-util's tower glue).
#[derive(Debug, Clone, Default)]
pub struct PeerCertificates(Arc<Peer>);

/// What [`PeerCertificates`] shares.
#[derive(Debug, Default)]
pub struct Peer {
    /// The chain as the TLS handshake verified it, leaf first; empty when none was sent.
    pub chain: Vec<CertificateDer<'static>>,
    verdict: Mutex<Option<(u64, CertIdentity)>>,
    /// The front proxy's users this connection named lately (see [`UserMemo`]).
    users: Mutex<UserMemo>,
    /// The authorization decisions this connection's requests used lately.
    pub decisions: DecisionMemo,
}

impl PeerCertificates {
    /// A connection's chain, not classified yet.
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        Self(Arc::new(Peer {
            chain,
            verdict: Mutex::default(),
            users: Mutex::default(),
            decisions: DecisionMemo::default(),
        }))
    }
}

impl std::ops::Deref for PeerCertificates {
    type Target = Peer;

    fn deref(&self) -> &Peer {
        &self.0
    }
}

/// A verifier of client certificates signed by the CAs of `ca_pem`.
fn verifier(ca_pem: &str) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for cert in crate::net::tls::load_certs(ca_pem.as_bytes())? {
        roots.add(cert)?;
    }
    Ok(WebPkiClientVerifier::builder(Arc::new(roots)).build()?)
}

/// A client CA: certificates it signed authenticate as CN / O.
#[derive(Clone)]
pub struct ClientCa {
    /// The CA bundle, PEM.
    pub ca_pem: String,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientCa {
    /// Trusts the CAs of the PEM bundle `ca_pem`; an error when it holds no usable
    /// certificate.
    pub fn new(ca_pem: &str) -> anyhow::Result<Self> {
        Ok(Self {
            ca_pem: ca_pem.to_owned(),
            verifier: verifier(ca_pem)?,
        })
    }
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa").finish_non_exhaustive()
    }
}

/// Everything authentication trusts; replaced whole when its sources change.
#[derive(Debug, Clone, Default)]
pub struct AuthnConfig {
    /// The front proxy, when one is trusted; None = `X-Remote-*` headers are always stripped.
    pub request_header: Option<RequestHeaderConfig>,
    /// The client CAs (flag, ConfigMap, development CA); empty = no client certificate
    /// authenticates.
    pub client_cas: Vec<ClientCa>,
}

impl AuthnConfig {
    /// PEM of every CA whose client certificates the TLS handshake accepts.
    pub fn handshake_cas(&self) -> Vec<String> {
        self.request_header
            .iter()
            .map(|r| r.ca_pem.clone())
            .chain(self.client_cas.iter().map(|c| c.ca_pem.clone()))
            .collect()
    }
}

/// What a connection's certificate is, decided once per connection and config generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertIdentity {
    /// No certificate, or one that identifies no one: no trusted CA signed it, its front-proxy
    /// CN is not allowed, or it has no CN.
    None,
    /// Signed by the request-header CA with an allowed CN: trust `X-Remote-*`.
    FrontProxy,
    /// Signed by a client CA: the user is the CN, the groups are the O values.
    User(Arc<UserInfo>),
}

fn subject_names(cert: &CertificateDer<'_>) -> Option<(String, Vec<String>)> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let cn = subject
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .unwrap_or("")
        .to_owned();
    let orgs = subject
        .iter_organization()
        .filter_map(|a| a.as_str().ok().map(str::to_owned))
        .collect();
    Some((cn, orgs))
}

fn verifies(verifier: &dyn ClientCertVerifier, chain: &[CertificateDer<'static>]) -> bool {
    match chain.split_first() {
        Some((leaf, intermediates)) => verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
            .is_ok(),
        None => false,
    }
}

/// What `chain` (leaf first) proves under `config`: the front proxy is tried first, as in
/// k8s.io/apiserver. Verifies signatures; [`Authenticator`] caches the verdicts.
pub fn classify(config: &AuthnConfig, chain: &[CertificateDer<'static>]) -> CertIdentity {
    let Some(leaf) = chain.first() else {
        return CertIdentity::None;
    };
    let Some((cn, orgs)) = subject_names(leaf) else {
        return CertIdentity::None;
    };
    if let Some(rh) = &config.request_header
        && verifies(rh.verifier.as_ref(), chain)
        && (rh.allowed_names.is_empty() || rh.allowed_names.contains(&cn))
    {
        return CertIdentity::FrontProxy;
    }
    if !cn.is_empty()
        && config
            .client_cas
            .iter()
            .any(|ca| verifies(ca.verifier.as_ref(), chain))
    {
        // In system:authenticated once, here, rather than on every request's copy.
        return CertIdentity::User(Arc::new(
            UserInfo {
                name: cn,
                groups: orgs,
                ..Default::default()
            }
            .authenticated(),
        ));
    }
    CertIdentity::None
}

/// Who is calling, in k8s.io/apiserver's order (see the module docs). Its configuration can
/// be replaced while it serves ([`Authenticator::set_config`]).
pub struct Authenticator {
    /// What is trusted now, with its generation (one snapshot: what was remembered under a
    /// generation was made by that very config); replace it with
    /// [`Authenticator::set_config`], which also forgets the cached verdicts and users.
    config: ArcSwap<(u64, AuthnConfig)>,
    /// The last generation handed out; each config gets its own.
    generations: std::sync::atomic::AtomicU64,
    /// Verdicts by certificate chain (SHA-256) for this generation: the front proxy opens many
    /// connections with one certificate, and classifying it again is a signature check each
    /// (see PERFORMANCE.md). Safe to reuse because the TLS
    /// handshake has just verified the chain, validity period included, against the same CAs.
    verdicts: Mutex<(u64, HashMap<[u8; 32], CertIdentity>)>,
    /// Bearer tokens are reviewed only with one (a cluster); without, a token is ignored and
    /// the caller is anonymous.
    pub tokens: Option<TokenReviewer>,
}

/// Distinct client certificate chains remembered before the verdicts are forgotten.
const VERDICT_LIMIT: usize = 1024;

impl Authenticator {
    /// Trusts `config`; reviews bearer tokens with `tokens`, when given.
    pub fn new(config: AuthnConfig, tokens: Option<TokenReviewer>) -> Self {
        Self {
            config: ArcSwap::from_pointee((1, config)),
            generations: std::sync::atomic::AtomicU64::new(1),
            verdicts: Mutex::default(),
            tokens,
        }
    }

    /// Trusts `config` from the next request on (the ConfigMap changed); verdicts about
    /// certificates made under the old one are not reused.
    pub fn set_config(&self, config: AuthnConfig) {
        let generation = self
            .generations
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst)
            + 1;
        self.config.store(Arc::new((generation, config)));
    }

    /// `generation` is the one `config` was stored with: a verdict is filed under the
    /// generation of the config that produced it.
    fn cert_identity(
        &self,
        peer: &PeerCertificates,
        generation: u64,
        config: &AuthnConfig,
    ) -> CertIdentity {
        if let Ok(cached) = peer.verdict.lock()
            && let Some((g, identity)) = cached.as_ref()
            && *g == generation
        {
            return identity.clone();
        }
        let identity = self.classify_cached(generation, config, &peer.chain);
        if let Ok(mut cached) = peer.verdict.lock() {
            *cached = Some((generation, identity.clone()));
        }
        identity
    }

    fn classify_cached(
        &self,
        generation: u64,
        config: &AuthnConfig,
        chain: &[CertificateDer<'static>],
    ) -> CertIdentity {
        if chain.is_empty() {
            return CertIdentity::None;
        }
        let mut digest = Sha256::new();
        for cert in chain {
            digest.update((cert.len() as u64).to_be_bytes());
            digest.update(cert);
        }
        let key: [u8; 32] = digest.finalize().into();
        if let Ok(verdicts) = self.verdicts.lock()
            && verdicts.0 == generation
            && let Some(identity) = verdicts.1.get(&key)
        {
            return identity.clone();
        }
        let identity = classify(config, chain);
        if let Ok(mut verdicts) = self.verdicts.lock() {
            if verdicts.0 != generation || verdicts.1.len() >= VERDICT_LIMIT {
                *verdicts = (generation, HashMap::new());
            }
            verdicts.1.insert(key, identity.clone());
        }
        identity
    }

    /// The user, or None for anonymous. Identity headers are stripped unless a verified front
    /// proxy sent them. Every authenticated user is in `system:authenticated`
    /// ([`UserInfo::authenticated`]), however they authenticated.
    pub async fn authenticate(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
    ) -> Result<Option<Arc<UserInfo>>, Error> {
        match self.authenticate_sync(peer, headers) {
            Authenticated::User(user) => Ok(user),
            Authenticated::NeedsTokenReview => self.review_token(headers).await,
        }
    }

    /// The user a TokenReview names for the request's bearer token, or None (anonymous) when
    /// there is no token or nobody to review it: the part of [`Authenticator::authenticate`]
    /// that waits.
    pub async fn review_token(&self, headers: &HeaderMap) -> Result<Option<Arc<UserInfo>>, Error> {
        match (bearer_token(headers), &self.tokens) {
            // Boxed: the TokenReview's future is large and would size every request's future.
            (Some(token), Some(reviewer)) => Ok(Box::pin(reviewer.review(token))
                .await?
                .map(|user| Arc::new(user.authenticated()))),
            _ => Ok(None),
        }
    }

    /// [`Authenticator::authenticate`] up to the point where a bearer token would have to be
    /// reviewed (certificates and front-proxy headers need no waiting).
    pub fn authenticate_sync(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
    ) -> Authenticated {
        let trusted = self.config.load();
        let (generation, config) = (trusted.0, &trusted.1);
        let identity = peer.map_or(CertIdentity::None, |p| {
            self.cert_identity(p, generation, config)
        });
        if identity == CertIdentity::FrontProxy
            && let Some(rh) = &config.request_header
            && let Some(peer) = peer
        {
            if let Some(user) = peer.front_proxy_user(rh, headers, generation) {
                return Authenticated::User(Some(user));
            }
            strip_identity_headers(Some(rh), headers);
        } else {
            strip_identity_headers(config.request_header.as_ref(), headers);
        }
        if let CertIdentity::User(user) = identity {
            return Authenticated::User(Some(user));
        }
        if self.tokens.is_some() && bearer_token(headers).is_some() {
            return Authenticated::NeedsTokenReview;
        }
        Authenticated::User(None)
    }
}

/// What [`Authenticator::authenticate_sync`] could tell without waiting.
pub enum Authenticated {
    /// The user, or None for anonymous.
    User(Option<Arc<UserInfo>>),
    /// A bearer token that only a TokenReview can tell about.
    NeedsTokenReview,
}

fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::{
        front_proxy::{MEMO_USERS, user_from_headers},
        *,
    };
    use crate::auth::user::Groups;

    #[test]
    fn certificate_verdicts_are_shared_by_connections_and_follow_config_changes() {
        crate::net::tls::install_default_provider();
        let ca =
            crate::net::tls::DevCa::load_or_create(&tempfile::tempdir().unwrap().keep()).unwrap();
        let (cert_pem, _) = ca.issue_client("alice", &["farmers"]).unwrap();
        let chain = crate::net::tls::load_certs(cert_pem.as_bytes()).unwrap();
        let as_client_ca = || AuthnConfig {
            request_header: None,
            client_cas: vec![ClientCa::new(&ca.cert_pem).unwrap()],
        };
        let authn = Authenticator::new(as_client_ca(), None);
        let user = |authn: &Authenticator| match authn.authenticate_sync(
            Some(&PeerCertificates::new(chain.clone())),
            &mut HeaderMap::new(),
        ) {
            Authenticated::User(user) => user.map(|u| u.name.clone()),
            Authenticated::NeedsTokenReview => panic!("no token was sent"),
        };
        // Two connections with one certificate: classified once, the same answer.
        assert_eq!(user(&authn).as_deref(), Some("alice"));
        assert_eq!(user(&authn).as_deref(), Some("alice"));
        assert_eq!(authn.verdicts.lock().unwrap().1.len(), 1);
        // The CA becomes the front proxy's only: the next connection is no longer a user.
        authn.set_config(AuthnConfig {
            request_header: Some(RequestHeaderConfig::new(&ca.cert_pem, vec![]).unwrap()),
            client_cas: vec![],
        });
        assert_eq!(user(&authn), None);
        // And back: trusted as a client CA again.
        authn.set_config(as_client_ca());
        assert_eq!(user(&authn).as_deref(), Some("alice"));
    }

    #[test]
    fn the_authenticated_group_is_added_once_and_never_to_anonymous() {
        let user = |name: &str, groups: &[&str]| UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| (*g).to_owned()).collect(),
            ..Default::default()
        };
        assert_eq!(
            user("system:aggregator", &[]).authenticated().groups,
            ["system:authenticated"]
        );
        assert_eq!(
            user("alice", &["dev"]).authenticated().groups,
            ["dev", "system:authenticated"]
        );
        for unchanged in [
            user("bob", &["system:authenticated", "dev"]),
            user("carol", &["system:unauthenticated"]),
            user("system:anonymous", &[]),
        ] {
            assert_eq!(unchanged.clone().authenticated(), unchanged);
        }
        assert_eq!(Groups(&user("d", &["a", "b"]).groups).to_string(), "a,b");
    }

    /// kube-apiserver's default header names, trusting a fresh dev CA as the front proxy's.
    fn default_request_header_config() -> RequestHeaderConfig {
        crate::net::tls::install_default_provider();
        let ca =
            crate::net::tls::DevCa::load_or_create(&tempfile::tempdir().unwrap().keep()).unwrap();
        RequestHeaderConfig::new(&ca.cert_pem, vec![]).unwrap()
    }

    #[test]
    fn a_connection_remembers_its_users_by_every_identity_header() {
        let config = default_request_header_config();
        let peer = PeerCertificates::new(vec![]);
        let headers = |user: &str, groups: &[&str]| {
            let mut headers = HeaderMap::new();
            headers.append("accept", HeaderValue::from_static("application/json"));
            headers.append("x-remote-user", HeaderValue::from_str(user).unwrap());
            for group in groups {
                headers.append("x-remote-group", HeaderValue::from_str(group).unwrap());
            }
            headers
        };
        let user = |h: &HeaderMap, generation| peer.front_proxy_user(&config, h, generation);
        let alice = user(&headers("alice", &["dev"]), 1).unwrap();
        assert!(Arc::ptr_eq(
            &alice,
            &user(&headers("alice", &["dev"]), 1).unwrap()
        ));
        assert_eq!(alice.groups, ["dev", "system:authenticated"]);
        // Any difference in what identifies is another user, boundaries included.
        for (name, groups, want) in [
            (
                "alice",
                &["dev", "ops"][..],
                &["dev", "ops", "system:authenticated"][..],
            ),
            ("alic", &["edev"][..], &["edev", "system:authenticated"][..]),
            ("alice", &[][..], &["system:authenticated"][..]),
        ] {
            let other = user(&headers(name, groups), 1).unwrap();
            assert!(!Arc::ptr_eq(&alice, &other));
            assert_eq!(other.name, name);
            assert_eq!(other.groups, want);
        }
        // The uid and extras identify too.
        let mut with = headers("alice", &["dev"]);
        with.append("x-remote-uid", HeaderValue::from_static("u-1"));
        let with_uid = user(&with, 1).unwrap();
        assert_eq!(with_uid.uid, "u-1");
        with.append("x-remote-extra-scopes", HeaderValue::from_static("s"));
        let with_extra = user(&with, 1).unwrap();
        assert_eq!(with_extra.extra["scopes"], ["s"]);
        assert!(!Arc::ptr_eq(&with_uid, &with_extra));
        // More users than are remembered: each still gets its own.
        for i in 0..2 * MEMO_USERS {
            let name = format!("u{i}");
            assert_eq!(user(&headers(&name, &[]), 1).unwrap().name, name);
        }
        assert_eq!(
            user(&headers("alice", &["dev"]), 1).unwrap().groups,
            alice.groups
        );
        assert!(peer.users.lock().unwrap().users.len() <= MEMO_USERS);
        // Another configuration: nothing remembered is reused.
        let again = user(&headers("alice", &["dev"]), 2).unwrap();
        assert!(!Arc::ptr_eq(&alice, &again));
        assert_eq!(peer.users.lock().unwrap().users.len(), 1);
        // No user named: no user, whatever else was sent.
        assert!(user(&headers("", &["dev"]), 2).is_none());
    }

    #[test]
    fn headers_become_a_user() {
        let config = default_request_header_config();
        let mut headers = HeaderMap::new();
        headers.append("x-remote-user", HeaderValue::from_static("alice"));
        headers.append("x-remote-group", HeaderValue::from_static("dev"));
        headers.append(
            "x-remote-group",
            HeaderValue::from_static("system:authenticated"),
        );
        headers.append(
            "X-Remote-Extra-Authentication.kubernetes.io%2fcredential-Id",
            HeaderValue::from_static("X509SHA256=abc"),
        );
        headers.append("x-remote-uid", HeaderValue::from_static("u-1"));
        let user = user_from_headers(&config, &headers).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "u-1");
        assert_eq!(user.groups, ["dev", "system:authenticated"]);
        assert_eq!(
            user.extra["authentication.kubernetes.io/credential-id"],
            ["X509SHA256=abc"]
        );
        strip_identity_headers(Some(&config), &mut headers);
        assert!(headers.is_empty(), "{headers:?}");
    }

    #[test]
    fn several_configured_names_are_read_in_configured_order_not_sent_order() {
        let mut config = default_request_header_config();
        config.set_headers(
            Some(vec!["X-User-A".into(), "X-User-B".into()]),
            Some(vec!["X-Uid-A".into(), "X-Uid-B".into()]),
            Some(vec!["X-Group-A".into(), "X-Group-B".into()]),
            None,
        );
        let mut headers = HeaderMap::new();
        // Sent in the opposite order; X-User-A's first value is empty, so its second counts.
        headers.append("x-user-b", HeaderValue::from_static("bob"));
        headers.append("x-user-a", HeaderValue::from_static(""));
        headers.append("x-user-a", HeaderValue::from_static("alice"));
        headers.append("x-uid-b", HeaderValue::from_static("uid-b"));
        headers.append("x-group-b", HeaderValue::from_static("b1"));
        headers.append("x-group-a", HeaderValue::from_static("a1"));
        headers.append("x-group-b", HeaderValue::from_static("b2"));
        headers.append("x-group-a", HeaderValue::from_static("a2"));
        let user = user_from_headers(&config, &headers).unwrap();
        assert_eq!(user.name, "alice");
        assert_eq!(user.uid, "uid-b");
        assert_eq!(user.groups, ["a1", "a2", "b1", "b2"]);

        // No non-empty user header: no user, whatever else was sent.
        let mut headers = HeaderMap::new();
        headers.append("x-user-a", HeaderValue::from_static(""));
        headers.append("x-group-a", HeaderValue::from_static("a1"));
        assert!(user_from_headers(&config, &headers).is_none());
    }

    #[test]
    fn renamed_headers_with_other_initials_are_still_read() {
        let mut config = default_request_header_config();
        config.set_headers(
            Some(vec!["Remote-User".into()]),
            Some(vec!["Uid".into()]),
            Some(vec!["Groups".into()]),
            Some(vec!["Extra-".into()]),
        );
        let mut headers = HeaderMap::new();
        headers.append("accept", HeaderValue::from_static("application/json"));
        headers.append("remote-user", HeaderValue::from_static("carol"));
        headers.append("uid", HeaderValue::from_static("u-9"));
        headers.append("groups", HeaderValue::from_static("ops"));
        headers.append("extra-scopes", HeaderValue::from_static("s"));
        // The defaults no longer name anyone.
        headers.append("x-remote-user", HeaderValue::from_static("mallory"));
        let user = user_from_headers(&config, &headers).unwrap();
        assert_eq!((user.name.as_str(), user.uid.as_str()), ("carol", "u-9"));
        assert_eq!(user.groups, ["ops"]);
        assert_eq!(user.extra["scopes"], ["s"]);

        // An empty extra prefix makes every other header an extra.
        config.set_headers(None, None, None, Some(vec![String::new()]));
        let user = user_from_headers(&config, &headers).unwrap();
        assert_eq!(user.extra["accept"], ["application/json"]);
    }

    #[test]
    fn header_names_from_the_configmap_are_read_in_any_case_and_stripped() {
        let mut config = default_request_header_config();
        config.set_headers(
            Some(vec!["X-Custom-User".into()]),
            None,
            Some(vec!["X-Custom-Group".into()]),
            Some(vec!["X-Custom-Extra-".into()]),
        );
        let mut headers = HeaderMap::new();
        headers.append("x-custom-user", HeaderValue::from_static("bob"));
        headers.append("x-custom-group", HeaderValue::from_static("ops"));
        headers.append("x-custom-extra-scopes", HeaderValue::from_static("a"));
        headers.append("x-custom-extra-scopes", HeaderValue::from_static("b"));
        headers.append("accept", HeaderValue::from_static("application/json"));
        let user = user_from_headers(&config, &headers).unwrap();
        assert_eq!(
            (user.name.as_str(), user.groups.as_slice()),
            ("bob", &["ops".to_owned()][..])
        );
        assert_eq!(user.extra["scopes"], ["a", "b"]);

        // From anyone but the front proxy, the renamed headers are removed, defaults too.
        let mut headers = HeaderMap::new();
        headers.append("X-Custom-User", HeaderValue::from_static("mallory"));
        headers.append("x-remote-group", HeaderValue::from_static("system:masters"));
        headers.append("x-custom-extra-x", HeaderValue::from_static("y"));
        headers.append("accept", HeaderValue::from_static("application/json"));
        strip_identity_headers(Some(&config), &mut headers);
        assert_eq!(
            headers.keys().map(|k| k.as_str()).collect::<Vec<_>>(),
            ["accept"]
        );
    }
}
