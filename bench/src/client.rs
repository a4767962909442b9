//! The load generator's HTTPS client: TLS with a client certificate (the front proxy's, as
//! kube-apiserver's aggregator presents it), HTTP/1.1 or HTTP/2 over ALPN, kept-alive connections.

use std::{net::SocketAddr, sync::Arc, time::Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, body::Incoming};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::{TlsConnector, client::TlsStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
pub enum Proto {
    #[serde(rename = "http/1.1")]
    #[value(name = "h1")]
    H1,
    #[serde(rename = "h2")]
    H2,
}

impl Proto {
    pub fn name(self) -> &'static str {
        match self {
            Proto::H1 => "http/1.1",
            Proto::H2 => "h2",
        }
    }
}

/// Where to send requests and as whom.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    h1: TlsConnector,
    h2: TlsConnector,
    /// The name the server's certificate is verified for (`localhost` unless set).
    server_name: ServerName<'static>,
    /// Headers every request carries (the front proxy's identity headers).
    pub headers: Arc<Vec<(String, String)>>,
}

fn connector(ca_pem: &str, identity: &(String, String), alpn: &[u8]) -> Result<TlsConnector> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert?)?;
    }
    let certs =
        CertificateDer::pem_slice_iter(identity.0.as_bytes()).collect::<Result<Vec<_>, _>>()?;
    let key = PrivateKeyDer::from_pem_slice(identity.1.as_bytes())?;
    let mut config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsConnector::from(Arc::new(config)))
}

impl Target {
    pub fn new(
        addr: SocketAddr,
        ca_pem: &str,
        identity: &(String, String),
        headers: Vec<(String, String)>,
    ) -> Result<Self> {
        Ok(Self {
            addr,
            h1: connector(ca_pem, identity, b"http/1.1")?,
            h2: connector(ca_pem, identity, b"h2")?,
            server_name: ServerName::try_from("localhost")?,
            headers: Arc::new(headers),
        })
    }

    /// Verifies the server's certificate for `name` (a DNS name or an IP address) instead.
    pub fn with_server_name(mut self, name: &str) -> Result<Self> {
        self.server_name = ServerName::try_from(name.to_owned())
            .with_context(|| format!("server name {name:?}"))?;
        Ok(self)
    }

    /// A TLS connection that negotiated `proto` (with the client certificate).
    pub async fn tls(&self, proto: Proto) -> Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await?;
        tcp.set_nodelay(true)?;
        let connector = match proto {
            Proto::H1 => &self.h1,
            Proto::H2 => &self.h2,
        };
        connector
            .connect(self.server_name.clone(), tcp)
            .await
            .context("TLS handshake")
    }

    pub async fn connect(&self, proto: Proto) -> Result<Conn> {
        let tls = self.tls(proto).await?;
        let io = hyper_util::rt::TokioIo::new(tls);
        let sender = match proto {
            Proto::H1 => {
                let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
                tokio::spawn(conn);
                Sender::H1(sender)
            }
            Proto::H2 => {
                let (sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await?;
                tokio::spawn(conn);
                Sender::H2(sender)
            }
        };
        Ok(Conn {
            sender,
            port: self.addr.port(),
            headers: self.headers.clone(),
        })
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

pub struct Conn {
    sender: Sender,
    port: u16,
    headers: Arc<Vec<(String, String)>>,
}

pub struct Reply {
    pub status: u16,
    pub body: Bytes,
}

impl Conn {
    fn build(
        &self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Request<Full<Bytes>>> {
        let mut builder = Request::builder().method(method);
        builder = match self.sender {
            Sender::H1(_) => builder
                .uri(path)
                .header("host", format!("localhost:{}", self.port)),
            Sender::H2(_) => builder.uri(format!("https://localhost:{}{path}", self.port)),
        };
        for (k, v) in self.headers.iter() {
            builder = builder.header(k.as_str(), v.as_str());
        }
        for (k, v) in extra {
            builder = builder.header(*k, *v);
        }
        Ok(builder.body(Full::new(body))?)
    }

    /// Sends and returns the response with its body not yet read.
    pub async fn start(
        &mut self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Bytes,
    ) -> Result<hyper::Response<Incoming>> {
        let request = self.build(method, path, extra, body)?;
        Ok(match &mut self.sender {
            Sender::H1(s) => {
                s.ready().await?;
                s.send_request(request).await?
            }
            Sender::H2(s) => {
                s.ready().await?;
                s.send_request(request).await?
            }
        })
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        extra: &[(&str, &str)],
        body: Bytes,
    ) -> Result<Reply> {
        let response = self.start(method, path, extra, body).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok(Reply { status, body })
    }

    pub async fn get(&mut self, path: &str, extra: &[(&str, &str)]) -> Result<Reply> {
        self.send("GET", path, extra, Bytes::new()).await
    }

    /// An HTTP/2 connection's sender can be cloned to run many streams at once.
    pub fn try_clone(&self) -> Option<Conn> {
        match &self.sender {
            Sender::H2(s) => Some(Conn {
                sender: Sender::H2(s.clone()),
                port: self.port,
                headers: self.headers.clone(),
            }),
            Sender::H1(_) => None,
        }
    }
}

/// What one closed-loop load run measured.
#[derive(Debug, Clone, Default)]
pub struct Load {
    pub requests: u64,
    pub errors: u64,
    pub seconds: f64,
    pub response_bytes: usize,
    /// Latencies in microseconds, sorted.
    pub latencies_us: Vec<u32>,
}

impl Load {
    pub fn rps(&self) -> f64 {
        self.requests as f64 / self.seconds
    }

    pub fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p)
    }
}

pub fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    f64::from(sorted[rank.min(sorted.len() - 1)])
}
/// `connections` kept-alive connections, each sending `path` back to back; requests sent
/// between `start` and `end` are counted.
pub async fn closed_loop(
    conns: Vec<Conn>,
    path: &str,
    extra: &[(&str, &str)],
    start: Instant,
    end: Instant,
) -> Result<Load> {
    let duration = end - start;
    let extra: Arc<Vec<(String, String)>> = Arc::new(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
    );
    let mut tasks = Vec::new();
    for mut conn in conns {
        let path = path.to_owned();
        let extra = extra.clone();
        tasks.push(tokio::spawn(async move {
            let extra: Vec<(&str, &str)> = extra
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut latencies = Vec::with_capacity(100_000);
            let (mut errors, mut bytes) = (0u64, 0usize);
            loop {
                let sent = Instant::now();
                if sent >= end {
                    break;
                }
                match conn.get(&path, &extra).await {
                    Ok(reply) if reply.status == 200 => {
                        bytes = reply.body.len();
                        if sent >= start {
                            latencies.push(
                                u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX),
                            );
                        }
                    }
                    _ => {
                        if sent >= start {
                            errors += 1;
                        }
                    }
                }
            }
            (latencies, errors, bytes)
        }));
    }
    let mut load = Load {
        seconds: duration.as_secs_f64(),
        ..Default::default()
    };
    for task in tasks {
        let (latencies, errors, bytes) = task.await?;
        load.requests += latencies.len() as u64;
        load.errors += errors;
        load.response_bytes = load.response_bytes.max(bytes);
        load.latencies_us.extend(latencies);
    }
    load.latencies_us.sort_unstable();
    Ok(load)
}
