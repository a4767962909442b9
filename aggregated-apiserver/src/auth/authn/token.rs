//! Bearer tokens, reviewed by the cluster (TokenReview) and cached.

use std::{
    collections::HashMap,
    sync::Mutex,
    time::{Duration, Instant},
};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::{Api, api::PostParams};
use sha2::{Digest, Sha256};

use super::UserInfo;
use crate::error::Error;

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
