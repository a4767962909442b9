//! Authentication and authorization of every request but the health probes: who is calling
//! ([`authn`]), may they ([`authz`]), and where the trusted CAs come from ([`source`]).

pub mod authn;
pub mod authz;
pub mod source;
pub mod user;

use std::sync::Arc;

use axum::http::HeaderMap;

pub use authn::{
    Authenticated, Authenticator, AuthnConfig, ClientCa, PeerCertificates, RequestHeaderConfig,
};
pub use authz::Authorizer;
pub use user::UserInfo;

use crate::{error::Error, request_info::RequestInfo};

/// Both halves of the check every request but the probes goes through.
pub struct Auth {
    /// Who is calling: client certificate, front-proxy headers, or bearer token.
    pub authn: Authenticator,
    /// May they: SubjectAccessReview, cached.
    pub authz: Authorizer,
}

/// The outcome of a check: the user (None: anonymous on an always-allowed path), or the error
/// to answer with and whoever was identified.
pub type Checked = Result<Option<Arc<UserInfo>>, (Error, Option<Arc<UserInfo>>)>;

/// How far a check got without waiting: done, or the review still to send. The edge hands it
/// from the path that answers at once to the one that waits, so nothing is checked twice.
pub enum AuthStep {
    /// Authenticated and authorized, or refused.
    Checked(Checked),
    /// Authenticated; a SubjectAccessReview has to be sent (no cached decision).
    Authorize(Arc<UserInfo>),
    /// A bearer token has to be reviewed (TokenReview) first.
    ReviewToken,
}

impl Auth {
    /// Authenticates one request as far as it can without waiting (certificate or front-proxy
    /// identity: nearly every request through the aggregator). Identity headers are stripped
    /// unless a verified front proxy sent them. [`Auth::authorize_sync`] takes it from there;
    /// the two are apart so the request's headers are borrowed mutably only here.
    pub fn authenticate_sync(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
    ) -> Authenticated {
        crate::telemetry::in_span("authentication", || {
            self.authn.authenticate_sync(peer, headers)
        })
    }

    /// Authorizes an [`Auth::authenticate_sync`]ed request as far as it can without waiting
    /// (a cached or unneeded decision). `now` is when the request started (cached decisions'
    /// age is counted from it).
    pub fn authorize_sync(
        &self,
        authenticated: Authenticated,
        peer: Option<&PeerCertificates>,
        info: &RequestInfo<'_>,
        now: std::time::Instant,
    ) -> AuthStep {
        let Authenticated::User(user) = authenticated else {
            return AuthStep::ReviewToken;
        };
        let Some(user) = user else {
            return AuthStep::Checked(anonymous(info).map_err(|e| (e, None)));
        };
        let memo = peer.map(|p| &p.decisions);
        let decided = crate::telemetry::in_span("authorization", || {
            self.authz.authorize_sync(&user, info, now, memo)
        });
        match decided {
            Some(Ok(())) => AuthStep::Checked(Ok(Some(user))),
            Some(Err(error)) => AuthStep::Checked(Err((error, Some(user)))),
            None => AuthStep::Authorize(user),
        }
    }

    /// Finishes a check [`Auth::authorize_sync`] left: sends the review it needs. Ok(None) for an
    /// anonymous call to an always-allowed path, the user otherwise; 401/403 as errors.
    pub async fn finish(
        &self,
        step: AuthStep,
        headers: &HeaderMap,
        info: &RequestInfo<'_>,
    ) -> Checked {
        let user = match step {
            AuthStep::Checked(checked) => return checked,
            AuthStep::Authorize(user) => user,
            AuthStep::ReviewToken => {
                let reviewed = crate::telemetry::in_span_async(
                    "authentication",
                    None,
                    self.authn.review_token(headers),
                )
                .await;
                match reviewed.map_err(|e| (e, None))? {
                    Some(user) => user,
                    None => return anonymous(info).map_err(|e| (e, None)),
                }
            }
        };
        let decided = crate::telemetry::in_span_async(
            "authorization",
            None,
            self.authz.authorize(&user, info),
        )
        .await;
        match decided {
            Ok(()) => Ok(Some(user)),
            Err(error) => Err((error, Some(user))),
        }
    }
}

/// Anonymous callers reach only the always-allowed paths.
fn anonymous(info: &RequestInfo<'_>) -> Result<Option<Arc<UserInfo>>, Error> {
    if authz::always_allowed(info.path) {
        Ok(None)
    } else {
        Err(Error::Unauthorized("Unauthorized".into()))
    }
}
