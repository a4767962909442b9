//! The server's transport: [`tls`] serves TLS (certificates reloaded from disk, or a
//! development CA), [`connection`] bounds what one client connection may hold, and
//! [`client_tls`] is how the server trusts the servers it calls (webhooks, etcd, its cluster).

pub mod client_tls;
pub mod connection;
pub mod tls;
