//! Authentication and authorization of every request but the health probes: who is calling
//! ([`authn`]), may they ([`authz`]), and where the trusted CAs come from ([`source`]).

pub mod authn;
pub mod authz;
pub mod source;

use axum::extract::Request;

pub use authn::{Authenticator, AuthnConfig, ClientCa, RequestHeaderConfig, UserInfo};
pub use authz::Authorizer;

use crate::{error::Error, request_info::RequestInfo, tls::PeerCertificates};

pub struct Auth {
    pub authn: Authenticator,
    pub authz: Authorizer,
}

impl Auth {
    /// Authenticates and authorizes one request: Ok(None) for an anonymous call to an
    /// always-allowed path, the user otherwise; 401/403 as errors. Identity headers are
    /// stripped unless a verified front proxy sent them.
    pub async fn check(
        &self,
        request: &mut Request,
        info: &RequestInfo<'_>,
    ) -> Result<Option<UserInfo>, (Error, Option<UserInfo>)> {
        let peer = request.extensions().get::<PeerCertificates>().cloned();
        let user = self
            .authn
            .authenticate(peer.as_ref(), request.headers_mut())
            .await
            .map_err(|e| (e, None))?;
        let Some(user) = user else {
            if authz::always_allowed(info.path) {
                return Ok(None);
            }
            return Err((Error::Unauthorized("Unauthorized".into()), None));
        };
        match self.authz.authorize(&user, info).await {
            Ok(()) => Ok(Some(user)),
            Err(error) => Err((error, Some(user))),
        }
    }
}
