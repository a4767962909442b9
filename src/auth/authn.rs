//! Authentication, in k8s.io/apiserver's order: the front proxy's client certificate (then the
//! user is in `X-Remote-*` headers), a client certificate from the client CA (CN = user,
//! O = groups), a bearer token (TokenReview, cached), else anonymous.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use arc_swap::ArcSwap;
use axum::http::{HeaderMap, HeaderName};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::{Api, api::PostParams};
use rustls::{
    RootCertStore,
    server::{WebPkiClientVerifier, danger::ClientCertVerifier},
};
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest, Sha256};

use super::authz::DecisionMemo;
pub use super::user::{Groups, UserInfo};
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

/// The users a front proxy named on one connection, by their identity headers as sent: the
/// aggregator sends the same few users' headers request after request, and building a user
/// from them (strings, groups, `system:authenticated`) is most of what authenticating costs.
/// The key holds every header whose name may carry identity (name and value, in the
/// request's order): a superset of what [`user_from_headers`] reads, so a hit is the user it
/// would build. Forgotten when the configuration changes (the generation); bounded in entries
/// and key size.
#[derive(Debug, Default)]
struct UserMemo {
    generation: u64,
    /// Least recently used first.
    users: Vec<(Box<[u8]>, Arc<UserInfo>)>,
}

/// Users one connection remembers; the aggregator multiplexes its users over few connections.
const MEMO_USERS: usize = 8;
/// Identity headers longer than this (a user with very many groups or extras) are read anew.
const MEMO_KEY_BYTES: usize = 4096;

/// Calls `part` with each part of the memo's key for `headers`, in order: each candidate
/// identity header's name, then its value; stops at the first false.
fn identity_parts(
    config: &RequestHeaderConfig,
    headers: &HeaderMap,
    mut part: impl FnMut(&[u8]) -> bool,
) -> bool {
    // A loop, not iterator adapters: this runs on every request (see PERFORMANCE.md).
    for (name, value) in headers {
        let name = name.as_str();
        if config.may_name_identity(name) && !(part(name.as_bytes()) && part(value.as_bytes())) {
            return false;
        }
    }
    true
}

/// Whether `key` is the memo key of `headers`, compared as it is read (no key is built).
fn same_identity(config: &RequestHeaderConfig, headers: &HeaderMap, mut key: &[u8]) -> bool {
    identity_parts(config, headers, |part| {
        // Each part is preceded by its length: no byte of a part can pass for a boundary.
        let end = 4 + part.len();
        let same = key.len() >= end
            && key[..4] == (part.len() as u32).to_le_bytes()
            && key[4..end] == *part;
        if same {
            key = &key[end..];
        }
        same
    }) && key.is_empty()
}

impl Peer {
    /// The user a verified front proxy names in `headers`, None when it names none.
    fn front_proxy_user(
        &self,
        config: &RequestHeaderConfig,
        headers: &HeaderMap,
        generation: u64,
    ) -> Option<Arc<UserInfo>> {
        let build = || user_from_headers(config, headers).map(|u| Arc::new(u.authenticated()));
        let Ok(mut memo) = self.users.lock() else {
            return build();
        };
        if memo.generation != generation {
            memo.generation = generation;
            memo.users.clear();
        }
        // Most often the user of the connection's previous request.
        if let Some((key, user)) = memo.users.last()
            && same_identity(config, headers, key)
        {
            return Some(user.clone());
        }
        let mut key = Vec::new();
        identity_parts(config, headers, |part| {
            key.extend_from_slice(&(part.len() as u32).to_le_bytes());
            key.extend_from_slice(part);
            true
        });
        if let Some(at) = memo.users.iter().position(|(k, _)| **k == *key) {
            let entry = memo.users.remove(at);
            let user = entry.1.clone();
            memo.users.push(entry);
            return Some(user);
        }
        let user = build()?;
        if key.len() <= MEMO_KEY_BYTES {
            if memo.users.len() >= MEMO_USERS {
                memo.users.remove(0);
            }
            memo.users.push((key.into(), user.clone()));
        }
        Some(user)
    }
}

/// How the front proxy (kube-apiserver's aggregator) is recognised, and where it puts the user.
#[derive(Clone)]
pub struct RequestHeaderConfig {
    /// The front proxy's CA bundle (`requestheader-client-ca-file`), PEM.
    pub ca_pem: String,
    verifier: Arc<dyn ClientCertVerifier>,
    /// Allowed client certificate CNs; empty = any CN the CA signed.
    pub allowed_names: Vec<String>,
    // Parsed and lower-cased once, not per request (see `set_headers`).
    username_headers: Vec<HeaderName>,
    uid_headers: Vec<HeaderName>,
    group_headers: Vec<HeaderName>,
    extra_headers_prefixes: Vec<String>,
    /// Bit `b` set when some identity header name or prefix starts with byte `b`: most of a
    /// request's headers are told apart by their first byte alone.
    initials: u128,
}

impl std::fmt::Debug for RequestHeaderConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestHeaderConfig")
            .field("allowed_names", &self.allowed_names)
            .field("username_headers", &self.username_headers)
            .field("group_headers", &self.group_headers)
            .field("extra_headers_prefixes", &self.extra_headers_prefixes)
            .finish_non_exhaustive()
    }
}

fn verifier(ca_pem: &str) -> anyhow::Result<Arc<dyn ClientCertVerifier>> {
    let mut roots = RootCertStore::empty();
    for cert in crate::tls::load_certs(ca_pem.as_bytes())? {
        roots.add(cert)?;
    }
    Ok(WebPkiClientVerifier::builder(Arc::new(roots)).build()?)
}

impl RequestHeaderConfig {
    /// kube-apiserver's defaults for the header names.
    pub fn new(ca_pem: &str, allowed_names: Vec<String>) -> anyhow::Result<Self> {
        let mut config = Self {
            ca_pem: ca_pem.to_owned(),
            verifier: verifier(ca_pem)?,
            allowed_names,
            username_headers: vec![HeaderName::from_static("x-remote-user")],
            uid_headers: vec![HeaderName::from_static("x-remote-uid")],
            group_headers: vec![HeaderName::from_static("x-remote-group")],
            extra_headers_prefixes: vec![DEFAULT_EXTRA_PREFIX.into()],
            initials: 0,
        };
        config.initials = config.initials();
        Ok(config)
    }

    /// The configured identity header names (user, uid, group), lower case.
    fn identity_names(&self) -> impl Iterator<Item = &str> {
        self.username_headers
            .iter()
            .chain(&self.uid_headers)
            .chain(&self.group_headers)
            .map(HeaderName::as_str)
    }

    fn initials(&self) -> u128 {
        let names = self
            .identity_names()
            .chain(self.extra_headers_prefixes.iter().map(String::as_str));
        let mut initials = 0;
        for name in names {
            match name.as_bytes().first() {
                Some(&b) if b < 128 => initials |= 1 << b,
                // An empty prefix names every header (and a non-ASCII one: keep them all).
                _ => return u128::MAX,
            }
        }
        initials
    }

    /// False when `name` (lower case, as hyper gives them) is surely no identity header.
    fn may_name_identity(&self, name: &str) -> bool {
        name.as_bytes()
            .first()
            .is_some_and(|&b| b >= 128 || self.initials & (1 << b) != 0)
    }

    /// Header names as kube-apiserver publishes them (`requestheader-*-headers` in the
    /// `extension-apiserver-authentication` ConfigMap), in any case. `None` keeps a default.
    pub fn set_headers(
        &mut self,
        username: Option<Vec<String>>,
        uid: Option<Vec<String>>,
        group: Option<Vec<String>>,
        extra_prefixes: Option<Vec<String>>,
    ) {
        fn names(list: Vec<String>) -> Vec<HeaderName> {
            list.iter()
                .filter_map(|n| match HeaderName::from_bytes(n.as_bytes()) {
                    Ok(name) => Some(name),
                    Err(_) => {
                        tracing::warn!(header = %n, "ignoring an invalid request-header name");
                        None
                    }
                })
                .collect()
        }
        if let Some(list) = username {
            self.username_headers = names(list);
        }
        if let Some(list) = uid {
            self.uid_headers = names(list);
        }
        if let Some(list) = group {
            self.group_headers = names(list);
        }
        if let Some(list) = extra_prefixes {
            self.extra_headers_prefixes = list.iter().map(|p| p.to_ascii_lowercase()).collect();
        }
        self.initials = self.initials();
    }

    /// Whether a (lower-case) header name carries identity under this configuration.
    fn names_identity(&self, name: &str) -> bool {
        self.identity_names().any(|h| h == name)
            || self
                .extra_headers_prefixes
                .iter()
                .any(|p| name.len() > p.len() && name.starts_with(p.as_str()))
    }
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

/// `X-Remote-Extra-` keys: lower-cased, then percent-decoded (as the aggregator escapes them).
fn extra_key(raw: &str) -> String {
    percent_encoding::percent_decode_str(&raw.to_ascii_lowercase())
        .decode_utf8_lossy()
        .into_owned()
}

/// Where `header` stands among the configured `names` (earlier names win).
fn rank(names: &[HeaderName], header: &HeaderName) -> Option<usize> {
    names.iter().position(|name| name == header)
}

/// Keeps `value` if it is non-empty and from an earlier-configured header than `best`'s.
fn keep_first<'a>(best: &mut Option<(usize, &'a str)>, rank: usize, value: &'a str) {
    if !value.is_empty() && best.is_none_or(|(r, _)| rank < r) {
        *best = Some((rank, value));
    }
}

/// The user a trusted front proxy names in the request headers. They are read, not removed:
/// nothing after authentication reads headers by these names. One walk over the request's few
/// headers (see PERFORMANCE.md). As in kube-apiserver,
/// the user and uid are the first non-empty value of the first configured header that has one;
/// groups are every value, in the configured headers' order.
pub fn user_from_headers(config: &RequestHeaderConfig, headers: &HeaderMap) -> Option<UserInfo> {
    let mut name = None;
    let mut uid = None;
    let mut groups: Vec<String> = Vec::new();
    // Only needed to order groups when more than one group header is configured.
    let mut group_ranks: Vec<usize> = Vec::new();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (header, value) in headers {
        if !config.may_name_identity(header.as_str()) {
            continue;
        }
        // Not `else if`: one header may be configured in more than one role. Values are checked
        // for being text only once a name matched (most headers are not identity headers).
        if let Some(r) = rank(&config.username_headers, header)
            && let Ok(value) = value.to_str()
        {
            keep_first(&mut name, r, value);
        }
        if let Some(r) = rank(&config.uid_headers, header)
            && let Ok(value) = value.to_str()
        {
            keep_first(&mut uid, r, value);
        }
        if let Some(r) = rank(&config.group_headers, header)
            && let Ok(value) = value.to_str()
        {
            groups.push(value.to_owned());
            if config.group_headers.len() > 1 {
                group_ranks.push(r);
            }
        }
        if let Some(prefix_len) = config
            .extra_headers_prefixes
            .iter()
            // Header names are stored lower-case, as the prefixes are; the longest prefix wins.
            .filter(|p| header.as_str().len() > p.len() && header.as_str().starts_with(p.as_str()))
            .map(|p| p.len())
            .max()
            && let Ok(value) = value.to_str()
        {
            extra
                .entry(extra_key(&header.as_str()[prefix_len..]))
                .or_default()
                .push(value.to_owned());
        }
    }
    let (_, name) = name?;
    if !group_ranks.is_empty() {
        // Stable: values of one header keep the order they were sent in.
        let mut ranked: Vec<(usize, String)> = group_ranks.into_iter().zip(groups).collect();
        ranked.sort_by_key(|(r, _)| *r);
        groups = ranked.into_iter().map(|(_, g)| g).collect();
    }
    Some(UserInfo {
        name: name.to_owned(),
        uid: uid.map_or_else(String::new, |(_, u)| u.to_owned()),
        groups,
        extra,
    })
}

/// kube-apiserver's default identity header names.
const DEFAULT_NAMES: [&str; 3] = ["x-remote-user", "x-remote-uid", "x-remote-group"];
const DEFAULT_EXTRA_PREFIX: &str = "x-remote-extra-";

/// Headers only a verified front proxy may set; removed from every other request.
pub fn strip_identity_headers(config: Option<&RequestHeaderConfig>, headers: &mut HeaderMap) {
    let is_identity = |name: &HeaderName| {
        let name = name.as_str();
        (name.starts_with("x-remote-")
            && (DEFAULT_NAMES.contains(&name) || name.starts_with(DEFAULT_EXTRA_PREFIX)))
            || config.is_some_and(|c| c.names_identity(name))
    };
    // Most requests carry none of these.
    if !headers.keys().any(is_identity) {
        return;
    }
    let names: Vec<HeaderName> = headers.keys().filter(|k| is_identity(k)).cloned().collect();
    for name in names {
        headers.remove(name);
    }
}

/// SHA-256 of a bearer token: the cache never holds tokens themselves.
type TokenHash = [u8; 32];

/// TokenReview with a small cache, as `--authentication-token-webhook-cache-ttl` (10 s).
pub struct TokenReviewer {
    client: kube::Client,
    ttl: Duration,
    cache: Mutex<HashMap<TokenHash, (Option<UserInfo>, Instant)>>,
}

const CACHE_LIMIT: usize = 10_000;

impl TokenReviewer {
    /// Reviews tokens with `client`'s cluster, answers (both ways) cached for `ttl`.
    pub fn new(client: kube::Client, ttl: Duration) -> Self {
        Self {
            client,
            ttl,
            cache: Mutex::default(),
        }
    }

    /// The user `token` belongs to, None when the cluster does not accept it; 401 when the
    /// TokenReview cannot be sent.
    pub async fn review(&self, token: &str) -> Result<Option<UserInfo>, Error> {
        let key: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if let Ok(cache) = self.cache.lock()
            && let Some((user, at)) = cache.get(&key)
            && at.elapsed() < self.ttl
        {
            return Ok(user.clone());
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..Default::default()
        };
        let reviewed = Api::<TokenReview>::all(self.client.clone())
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| {
                tracing::warn!(error = %e, "TokenReview failed");
                Error::Unauthorized("Unauthorized".into())
            })?;
        let status = reviewed.status.unwrap_or_default();
        let user = if status.authenticated == Some(true) {
            status.user.map(|u| UserInfo {
                name: u.username.unwrap_or_default(),
                uid: u.uid.unwrap_or_default(),
                groups: u.groups.unwrap_or_default(),
                extra: u.extra.unwrap_or_default().into_iter().collect(),
            })
        } else {
            None
        };
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.insert(key, (user.clone(), Instant::now()));
        }
        Ok(user)
    }
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

    use super::*;

    #[test]
    fn certificate_verdicts_are_shared_by_connections_and_follow_config_changes() {
        crate::tls::install_default_provider();
        let ca = crate::tls::DevCa::load_or_create(&tempfile::tempdir().unwrap().keep()).unwrap();
        let (cert_pem, _) = ca.issue_client("alice", &["farmers"]).unwrap();
        let chain = crate::tls::load_certs(cert_pem.as_bytes()).unwrap();
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
        crate::tls::install_default_provider();
        let ca = crate::tls::DevCa::load_or_create(&tempfile::tempdir().unwrap().keep()).unwrap();
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
