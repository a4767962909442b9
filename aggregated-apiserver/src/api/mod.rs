//! What the server says of its API and of itself: `discovery` (the groups, versions and
//! resources it serves), [`openapi`] (their schemas, v2 and v3) and its [`identity`] (the name
//! in OpenAPI's title, `/version`, traces and metrics).

pub(crate) mod discovery;
pub mod identity;
pub mod openapi;
