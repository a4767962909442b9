//! The front proxy (kube-apiserver's aggregator): how it is recognised, the user it names in
//! `X-Remote-*` headers, and the users one connection remembers.

use std::{collections::BTreeMap, sync::Arc};

use axum::http::{HeaderMap, HeaderName};
use rustls::server::danger::ClientCertVerifier;

use super::{Peer, UserInfo, verifier};

/// The users a front proxy named on one connection, by their identity headers as sent: the
/// aggregator sends the same few users' headers request after request, and building a user
/// from them (strings, groups, `system:authenticated`) is most of what authenticating costs.
/// The key holds every header whose name may carry identity (name and value, in the
/// request's order): a superset of what [`user_from_headers`] reads, so a hit is the user it
/// would build. Forgotten when the configuration changes (the generation); bounded in entries
/// and key size.
#[derive(Debug, Default)]
pub(super) struct UserMemo {
    generation: u64,
    /// Least recently used first.
    pub(super) users: Vec<(Box<[u8]>, Arc<UserInfo>)>,
}

/// Users one connection remembers; the aggregator multiplexes its users over few connections.
pub(super) const MEMO_USERS: usize = 8;
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
    pub(super) fn front_proxy_user(
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
    pub(super) verifier: Arc<dyn ClientCertVerifier>,
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
