//! The ceiling: a minimal hyper + rustls HTTPS server that answers every GET with precomputed
//! bytes of the size asked for (`?size=N`), with farm-apiserver's own TLS settings (the same
//! `server_config`: client-certificate verification, ALPN h2 + http/1.1) and `TCP_NODELAY`. What
//! it reaches is what TLS + HTTP cost on this machine, the bound farm-apiserver is measured against.

use std::{
    collections::HashMap,
    convert::Infallible,
    sync::{Arc, Mutex},
};

use anyhow::Result;
use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response, body::Incoming, service::service_fn};
use hyper_util::{rt::TokioExecutor, server::conn::auto};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

fn body_of(size: usize) -> Bytes {
    // JSON-looking filler, so compression-free transports see the same bytes.
    let mut body = Vec::with_capacity(size);
    body.extend_from_slice(b"{\"filler\":\"");
    while body.len() + 2 < size {
        body.push(b'x');
    }
    body.extend_from_slice(b"\"}");
    body.truncate(size);
    Bytes::from(body)
}

fn size_of(request: &Request<Incoming>) -> usize {
    request
        .uri()
        .query()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("size=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

pub async fn serve(cert_pem: &[u8], key_pem: &[u8], client_cas: &[String]) -> Result<()> {
    let config = aggregated_apiserver::net::tls::server_config(cert_pem, key_pem, client_cas)?;
    let acceptor = TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    println!("listening {}", listener.local_addr()?.port());
    let bodies: Arc<Mutex<HashMap<usize, Bytes>>> = Arc::default();
    loop {
        let (tcp, _) = listener.accept().await?;
        tcp.set_nodelay(true)?;
        let acceptor = acceptor.clone();
        let bodies = bodies.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(tcp).await else {
                return;
            };
            let service = service_fn(move |request: Request<Incoming>| {
                let size = size_of(&request);
                let body = bodies
                    .lock()
                    .map(|mut b| b.entry(size).or_insert_with(|| body_of(size)).clone())
                    .unwrap_or_else(|_| body_of(size));
                async move {
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(body))
                            .unwrap_or_default(),
                    )
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .await;
        });
    }
}
