//! Authentication and authorization of every request but the health probes: who is calling
//! ([`authn`]), may they ([`authz`]), and where the trusted CAs come from ([`source`]).

pub mod authn;
pub mod authz;
pub mod source;

use axum::http::HeaderMap;

pub use authn::{
    Authenticated, Authenticator, AuthnConfig, ClientCa, PeerCertificates, RequestHeaderConfig,
    UserInfo,
};
pub use authz::Authorizer;

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
pub type Checked = Result<Option<UserInfo>, (Error, Option<UserInfo>)>;

impl Auth {
    /// Authenticates and authorizes one request: Ok(None) for an anonymous call to an
    /// always-allowed path, the user otherwise; 401/403 as errors. Identity headers are
    /// stripped unless a verified front proxy sent them.
    pub async fn check(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
        info: &RequestInfo<'_>,
    ) -> Checked {
        let user = self
            .authn
            .authenticate(peer, headers)
            .await
            .map_err(|e| (e, None))?;
        let Some(user) = user else {
            return anonymous(info).map_err(|e| (e, None));
        };
        match self.authz.authorize(&user, info).await {
            Ok(()) => Ok(Some(user)),
            Err(error) => Err((error, Some(user))),
        }
    }

    /// [`Auth::check`] when it needs no waiting (certificate or front-proxy identity, a cached
    /// or unneeded authorization), as for nearly every request through the aggregator; None
    /// when a TokenReview or SubjectAccessReview has to be sent first.
    pub fn check_now(
        &self,
        peer: Option<&PeerCertificates>,
        headers: &mut HeaderMap,
        info: &RequestInfo<'_>,
    ) -> Option<Checked> {
        let Authenticated::User(user) = self.authn.authenticate_now(peer, headers) else {
            return None;
        };
        let Some(user) = user else {
            return Some(anonymous(info).map_err(|e| (e, None)));
        };
        Some(match self.authz.authorize_now(&user, info)? {
            Ok(()) => Ok(Some(user)),
            Err(error) => Err((error, Some(user))),
        })
    }
}

/// Anonymous callers reach only the always-allowed paths.
fn anonymous(info: &RequestInfo<'_>) -> Result<Option<UserInfo>, Error> {
    if authz::always_allowed(info.path) {
        Ok(None)
    } else {
        Err(Error::Unauthorized("Unauthorized".into()))
    }
}
