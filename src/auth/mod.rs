//! Authentication and authorization of every request but the health probes: who is calling
//! ([`authn`]), may they ([`authz`]), and where the trusted CAs come from ([`source`]).

pub mod authn;
pub mod authz;
pub mod source;

use std::sync::Arc;

use axum::{
    extract::{Request, State},
    middleware::Next,
    response::{IntoResponse, Response},
};

pub use authn::{Authenticator, AuthnConfig, ClientCa, RequestHeaderConfig, UserInfo};
pub use authz::Authorizer;

use crate::{error::Error, request_info::RequestInfo, tls::PeerCertificates};

pub struct Auth {
    pub authn: Authenticator,
    pub authz: Authorizer,
}

/// Left on responses so the request log names the user.
#[derive(Debug, Clone)]
pub struct AuthenticatedUser(pub Arc<UserInfo>);

pub async fn middleware(
    State(auth): State<Arc<Auth>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request.extensions().get::<PeerCertificates>().cloned();
    let user = match auth
        .authn
        .authenticate(peer.as_ref(), request.headers_mut())
        .await
    {
        Ok(user) => user,
        Err(error) => return error.into_response(),
    };
    let info = RequestInfo::parse(
        request.method(),
        request.uri().path(),
        request.uri().query(),
    );
    let Some(user) = user else {
        if authz::always_allowed(&info.path) {
            return next.run(request).await;
        }
        return Error::Unauthorized("Unauthorized".into()).into_response();
    };
    let user = Arc::new(user);
    let mut response = match auth.authz.authorize(&user, &info).await {
        Ok(()) => {
            request
                .extensions_mut()
                .insert(AuthenticatedUser(user.clone()));
            next.run(request).await
        }
        Err(error) => error.into_response(),
    };
    response.extensions_mut().insert(AuthenticatedUser(user));
    response
}
