//! Authentication and authorization of every request but the health probes: who is calling
//! (`authn`), may they (`authz`), and where the trusted CAs come from ([`source`]).

pub(crate) mod authn;
pub(crate) mod authz;
pub(crate) mod impersonation;
pub mod source;
pub(crate) mod user;

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
    /// The request asks to impersonate: the authenticated user (None: a bearer token to review
    /// first) must be allowed to, and the request is then authorized as the user it becomes.
    Impersonate(Option<Arc<UserInfo>>),
}

/// A finished check: its outcome (as the impersonated user, when the request impersonates),
/// and the user who authenticated when that is another (the impersonator, whom the audit log
/// names as `user`).
pub type Finished = (Checked, Option<Arc<UserInfo>>);

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
        crate::observe::telemetry::in_span("authentication", || {
            self.authn.authenticate_sync(peer, headers)
        })
    }

    /// Authorizes an [`Auth::authenticate_sync`]ed request as far as it can without waiting
    /// (a cached or unneeded decision). `now` is when the request started (cached decisions'
    /// age is counted from it). A request that `impersonating` (see
    /// `impersonation::requested`) is left to [`Auth::finish`].
    pub fn authorize_sync(
        &self,
        authenticated: Authenticated,
        peer: Option<&PeerCertificates>,
        info: &RequestInfo<'_>,
        (now, impersonating): (std::time::Instant, bool),
    ) -> AuthStep {
        let Authenticated::User(user) = authenticated else {
            return if impersonating {
                AuthStep::Impersonate(None)
            } else {
                AuthStep::ReviewToken
            };
        };
        let Some(user) = user else {
            return AuthStep::Checked(anonymous(info).map_err(|e| (e, None)));
        };
        if impersonating {
            return AuthStep::Impersonate(Some(user));
        }
        let memo = peer.map(|p| &p.decisions);
        let decided = crate::observe::telemetry::in_span("authorization", || {
            self.authz.authorize_sync(&user, info, now, memo)
        });
        match decided {
            Some(Ok(())) => AuthStep::Checked(Ok(Some(user))),
            Some(Err(error)) => AuthStep::Checked(Err((error, Some(user)))),
            None => AuthStep::Authorize(user),
        }
    }

    /// Finishes a check [`Auth::authorize_sync`] left: sends the review it needs, and
    /// impersonates first when the request asks to. Ok(None) for an anonymous call to an
    /// always-allowed path, the user otherwise; 401/403 as errors.
    pub async fn finish(
        &self,
        step: AuthStep,
        headers: &HeaderMap,
        info: &RequestInfo<'_>,
    ) -> Finished {
        let impersonating = matches!(step, AuthStep::Impersonate(_));
        let user = match step {
            AuthStep::Checked(checked) => return (checked, None),
            AuthStep::Authorize(user) | AuthStep::Impersonate(Some(user)) => user,
            AuthStep::ReviewToken | AuthStep::Impersonate(None) => {
                let reviewed = crate::observe::telemetry::in_span_async(
                    "authentication",
                    None,
                    self.authn.review_token(headers),
                )
                .await;
                match reviewed {
                    Ok(Some(user)) => user,
                    Ok(None) => return (anonymous(info).map_err(|e| (e, None)), None),
                    Err(error) => return (Err((error, None)), None),
                }
            }
        };
        let (user, impersonator) = if impersonating {
            let impersonated = crate::observe::telemetry::in_span_async(
                "impersonation",
                None,
                impersonation::impersonate(&self.authz, &user, headers),
            )
            .await;
            match impersonated {
                Ok(Some(impersonated)) => (impersonated, Some(user)),
                Ok(None) => (user, None),
                Err(error) => return (Err((error, Some(user))), None),
            }
        } else {
            (user, None)
        };
        let decided = crate::observe::telemetry::in_span_async(
            "authorization",
            None,
            self.authz.authorize(&user, info),
        )
        .await;
        let checked = match decided {
            Ok(()) => Ok(Some(user)),
            Err(error) => Err((error, Some(user))),
        };
        (checked, impersonator)
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
