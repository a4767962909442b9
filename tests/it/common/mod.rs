//! A real farm-apiserver on an ephemeral loopback port, with dev certificates in a temp dir, and
//! the clients the tests talk to it with: kube::Client, kubectl, and a raw HTTPS client that sends
//! exactly the headers it is given.

pub mod etcd;
pub mod fake_kube;
pub mod fixtures;
pub mod https;
pub mod install;
pub mod oneshot;
pub mod otlp;
pub mod process;
pub mod storage;

pub use storage::{TestStorage, memory_state, seed_etcd, storage_on};

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::Command,
    sync::Arc,
    time::Duration,
};

use aggregated_apiserver::{
    auth::PeerCertificates,
    auth::source::{self, StaticSources},
    group::ApiGroup,
    net::tls::{self, DevCa, ServingFiles, ServingTls, load_certs},
    rest::RestSettings,
    server::{self, AppState, AuthOptions, Shutdown, StateOptions},
    store::{ClusterSource, StorageFactory, Store, ViewCache},
};
use bytes::Bytes;
use farm_apiserver::resources::{self, FarmPod, Llama};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

/// For `oneshot` tests: state trusting a fresh dev CA, and the admin's certificate chain from
/// it, which requests carry as if they came through the TLS listener.
pub fn oneshot_identity() -> (StateOptions, PeerCertificates) {
    aggregated_apiserver::net::tls::install_default_provider();
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::load_or_create(dir.path()).unwrap();
    let (cert, _key) = ca
        .issue_client("farm-dev-admin", &["system:masters"])
        .unwrap();
    let config = source::build(
        &StaticSources {
            dev_ca: Some(ca.cert_pem.clone()),
            ..Default::default()
        },
        None,
    );
    let options = StateOptions {
        auth: AuthOptions {
            config,
            ..Default::default()
        }
        .build(),
        identity: farm_apiserver::config::IDENTITY,
        ..StateOptions::default()
    };
    (
        options,
        PeerCertificates::new(load_certs(cert.as_bytes()).unwrap()),
    )
}

pub fn install_crypto() {
    aggregated_apiserver::net::tls::install_default_provider();
}

/// A farm-apiserver started as the binary starts one ([`server::build`]), on a loopback port,
/// its development certificates and kubeconfig in `dir`.
pub struct TestServer {
    pub addr: SocketAddr,
    pub dir: tempfile::TempDir,
    pub state: AppState,
    /// The server's Llama store (memory or etcd).
    pub llamas: Arc<dyn Store<Llama>>,
    /// Where its kinds live: `storage.store::<K>()` is the store it serves `K` from.
    pub storage: StorageFactory,
    pub serving: Arc<ServingTls>,
    pub shutdown: Shutdown,
    /// The listener until [`TestServer::stopped`] takes it.
    running: Option<server::Running>,
    /// Starts the listener's graceful stop (its grace: 1 s).
    stop: Arc<tokio::sync::Notify>,
    /// The etcd of an etcd-backed server, stopped with it.
    pub etcd: Option<etcd::Etcd>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.end_watches();
        if let Some(running) = &self.running {
            running.stop();
        }
    }
}

pub struct Options {
    pub sample_data: bool,
    pub bookmark_interval: Duration,
    /// The FarmPod cache; default: no cluster.
    pub farmpods: Option<Arc<ViewCache<FarmPod>>>,
    /// Front-proxy CA PEM and allowed CNs (`--requestheader-*` flags).
    pub requestheader: Option<(String, Vec<String>)>,
    /// The cluster for SubjectAccessReview / TokenReview / the auth ConfigMap.
    pub cluster: Option<kube::Client>,
    /// Follow kube-system/extension-apiserver-authentication in `cluster`.
    pub follow_configmap: bool,
    /// Trust the dev CA as a client CA (as the server does when it made its own certs).
    pub trust_dev_ca: bool,
    /// The connections' bounds (timeouts).
    pub limits: aggregated_apiserver::net::connection::Limits,
    /// What a request other than a watch may take.
    pub request_timeout: Duration,
    /// Where Llamas live.
    pub storage: TestStorage,
    /// NamespaceLifecycle admission against `cluster`'s Namespaces.
    pub namespace_lifecycle: bool,
    /// Deletes add the garbage collector's finalizers (a cluster's collector removes them).
    pub garbage_collection: bool,
    /// Call the admission webhooks `cluster` configures.
    pub webhooks: bool,
    /// The audit log.
    pub audit: Option<Arc<aggregated_apiserver::audit::Auditor>>,
    /// The bounds on requests in flight.
    pub inflight: aggregated_apiserver::server::InflightLimits,
    /// The kinds served: the binary's by default.
    pub kinds: fn(&StorageFactory) -> ApiGroup,
    /// `--storage-version` (default `v1`).
    pub storage_version: &'static str,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            sample_data: true,
            bookmark_interval: Duration::from_millis(300),
            farmpods: None,
            requestheader: None,
            cluster: None,
            follow_configmap: false,
            trust_dev_ca: true,
            limits: Default::default(),
            request_timeout: Duration::from_secs(60),
            storage: TestStorage::Memory,
            namespace_lifecycle: false,
            garbage_collection: false,
            webhooks: false,
            audit: None,
            inflight: Default::default(),
            kinds: resources::register,
            storage_version: "v1",
        }
    }
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(Options::default()).await
    }

    /// A default server on `storage`; None (SKIPPED printed) for etcd when there is none.
    pub async fn start_on(storage: TestStorage) -> Option<Self> {
        if storage == TestStorage::Etcd && etcd::binary().is_none() {
            return None;
        }
        Some(
            Self::start_with(Options {
                storage,
                ..Options::default()
            })
            .await,
        )
    }

    pub async fn start_with(options: Options) -> Self {
        install_crypto();
        let dir = tempfile::tempdir().expect("tempdir");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        let ca = tls::ensure_dev_certificates(
            dir.path(),
            &tls::local_url(addr),
            &farm_apiserver::certs::DEV,
        )
        .expect("certs");
        let pods = options
            .farmpods
            .unwrap_or_else(ClusterSource::without_cluster);
        let (storage, etcd) = storage_on(options.storage, pods, options.sample_data)
            .await
            .expect("etcd (start_on checks)");
        let storage = storage.storing_at(options.storage_version);
        // Views of the cluster's objects watch the test's cluster, as the binary's do (FarmPods
        // stay the ones given above).
        let storage = match &options.cluster {
            Some(cluster) => storage.viewing(cluster.clone(), Vec::new()),
            None => storage,
        };
        let mut disabled = Vec::new();
        if !options.namespace_lifecycle {
            disabled.push("NamespaceLifecycle");
        }
        if !options.webhooks {
            disabled.extend([
                "MutatingAdmissionPolicy",
                "MutatingAdmissionWebhook",
                "ValidatingAdmissionWebhook",
                "ValidatingAdmissionPolicy",
            ]);
        }
        let (requestheader_ca, requestheader_allowed_names) = options.requestheader.unzip();
        let config = server::Config {
            auth_sources: StaticSources {
                requestheader_ca,
                requestheader_allowed_names,
                client_ca: None,
                dev_ca: options.trust_dev_ca.then(|| ca.clone()),
            },
            cluster: options.cluster,
            follow_auth_configmap: options.follow_configmap,
            kinds: options.kinds,
            rest: RestSettings {
                bookmark_interval: options.bookmark_interval,
                request_timeout: options.request_timeout,
                garbage_collection: options.garbage_collection,
                ..Default::default()
            },
            disable_admission_plugins: disabled.into_iter().map(String::from).collect(),
            audit: options.audit,
            inflight: options.inflight,
            limits: options.limits,
            identity: farm_apiserver::config::IDENTITY,
            ..server::Config::new(
                listener,
                ServingFiles::development(dir.path()),
                storage.clone(),
                options.kinds,
            )
        };
        // The binary's start-up, then spawned until the test server drops.
        let server = server::build(config).await.expect("server");
        let (state, shutdown, serving) = (
            server.state.clone(),
            server.shutdown.clone(),
            server.serving.clone(),
        );
        let stop = Arc::new(tokio::sync::Notify::new());
        let stopping = stop.clone();
        let running = server.spawn(
            async move { stopping.notified().await },
            Duration::from_secs(1),
        );
        running.listening().await;
        let llamas = storage.store::<Llama>();
        if etcd.is_some() {
            let probe = RawClient::new(addr, &ca, None, Alpn::Http1);
            let ready = || {
                let probe = probe.clone();
                async move { probe.get("/readyz/etcd", &[]).await.status == 200 }
            };
            seed_etcd(ready, llamas.as_ref(), options.sample_data).await;
        }
        Self {
            addr,
            dir,
            state,
            llamas,
            storage,
            serving,
            shutdown,
            running: Some(running),
            stop,
            etcd,
        }
    }

    /// Begins the listener's graceful stop, as a signal does in the binary (without the
    /// shutdown delay): no new connections; open ones get the grace (1 s) to finish.
    pub fn stop_gracefully(&self) {
        self.stop.notify_one();
    }

    /// Waits until the listener has stopped.
    pub async fn stopped(&mut self) -> anyhow::Result<()> {
        match self.running.take() {
            Some(running) => running.stopped().await,
            None => Ok(()),
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join(tls::KUBECONFIG)
    }

    pub fn ca_pem(&self) -> String {
        std::fs::read_to_string(self.dir.path().join(tls::CA_CERT)).expect("ca")
    }

    pub fn dev_ca(&self) -> DevCa {
        DevCa::load_or_create(self.dir.path()).expect("dev ca")
    }

    pub async fn kube_client(&self) -> kube::Client {
        let kubeconfig =
            kube::config::Kubeconfig::read_from(self.kubeconfig()).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    /// A raw client trusting the dev CA, presenting `identity` (cert PEM, key PEM) if given.
    pub fn raw(&self, identity: Option<(String, String)>, alpn: Alpn) -> RawClient {
        RawClient::new(self.addr, &self.ca_pem(), identity, alpn)
    }

    /// The dev kubeconfig's identity: farm-dev-admin, system:masters.
    pub fn admin_identity(&self) -> (String, String) {
        self.dev_ca()
            .issue_client(farm_apiserver::certs::DEV_USER, &[tls::DEV_GROUP])
            .expect("client cert")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    Http1,
    Http2,
}

#[derive(Clone)]
pub struct RawClient {
    addr: SocketAddr,
    config: Arc<ClientConfig>,
    connector: TlsConnector,
    alpn: Alpn,
}

pub struct RawResponse {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl RawResponse {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body[..self.body.len().min(400)])
            )
        })
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl RawClient {
    pub fn new(
        addr: SocketAddr,
        ca_pem: &str,
        identity: Option<(String, String)>,
        alpn: Alpn,
    ) -> Self {
        install_crypto();
        let mut roots = RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
            roots.add(cert.expect("ca pem")).expect("add root");
        }
        let builder = ClientConfig::builder().with_root_certificates(roots);
        let mut config = match identity {
            Some((cert, key)) => {
                let certs: Vec<_> = CertificateDer::pem_slice_iter(cert.as_bytes())
                    .map(|c| c.expect("cert"))
                    .collect();
                let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("key");
                builder
                    .with_client_auth_cert(certs, key)
                    .expect("client auth")
            }
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = match alpn {
            Alpn::Http1 => vec![b"http/1.1".to_vec()],
            Alpn::Http2 => vec![b"h2".to_vec()],
        };
        let config = Arc::new(config);
        Self {
            addr,
            connector: TlsConnector::from(config.clone()),
            config,
            alpn,
        }
    }

    /// The same client offering no ALPN protocol: it still speaks its protocol (HTTP/2 with
    /// prior knowledge), and the server must tell which from the first bytes.
    pub fn without_alpn(&self) -> Self {
        let mut config = (*self.config).clone();
        config.alpn_protocols.clear();
        let config = Arc::new(config);
        Self {
            connector: TlsConnector::from(config.clone()),
            config,
            ..self.clone()
        }
    }

    /// A new TLS connection to the server, ALPN as the client was made with.
    pub async fn tls_stream(
        &self,
    ) -> hyper_util::rt::TokioIo<tokio_rustls::client::TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(self.addr).await.expect("connect");
        tcp.set_nodelay(true).ok();
        let tls = self
            .connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("tls handshake");
        hyper_util::rt::TokioIo::new(tls)
    }

    /// Sends one request on a new connection; headers go out exactly as given (name, value).
    pub async fn send(
        &self,
        method: &str,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Option<Vec<u8>>,
    ) -> RawResponse {
        let io = self.tls_stream().await;
        let mut builder = Request::builder().method(method).uri(path_and_query);
        if self.alpn == Alpn::Http2 {
            builder = builder.uri(format!(
                "https://localhost:{}{path_and_query}",
                self.addr.port()
            ));
        }
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let has_host = headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("host"));
        if self.alpn == Alpn::Http1 && !has_host {
            builder = builder.header("Host", format!("localhost:{}", self.addr.port()));
        }
        let request = builder
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .expect("request");
        let response: Response<hyper::body::Incoming> = match self.alpn {
            Alpn::Http1 => {
                let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
                    .await
                    .expect("h1 handshake");
                tokio::spawn(conn);
                sender.send_request(request).await.expect("send")
            }
            Alpn::Http2 => {
                let (mut sender, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await
                        .expect("h2 handshake");
                tokio::spawn(conn);
                sender.send_request(request).await.expect("send")
            }
        };
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = tokio::time::timeout(Duration::from_secs(10), response.into_body().collect())
            .await
            .expect("body in time")
            .expect("body")
            .to_bytes();
        RawResponse {
            status,
            headers,
            body,
        }
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> RawResponse {
        self.send("GET", path, headers, None).await
    }
}

/// kubectl from PATH, with a private discovery cache; None (and a printed reason) when absent.
pub fn kubectl(kubeconfig: &Path, cache: &Path) -> Option<Command> {
    if !install::has_kubectl() {
        eprintln!("SKIPPED: kubectl is not on PATH; the kubectl tests need it");
        return None;
    }
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .env("KUBECACHEDIR", cache)
        .env_remove("KUBECONFIG");
    Some(cmd)
}

/// Runs kubectl (blocking, on a helper thread) and returns (success, stdout, stderr).
pub async fn run(mut cmd: Command, stdin: Option<&str>) -> (bool, String, String) {
    let stdin = stdin.map(str::to_owned);
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        use std::process::Stdio;
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("spawn kubectl");
        if let Some(input) = stdin
            && let Some(mut pipe) = child.stdin.take()
        {
            pipe.write_all(input.as_bytes()).expect("stdin");
        }
        let out = child.wait_with_output().expect("kubectl output");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .expect("join")
}

/// One kept-alive HTTP/1.1 connection, for tests that care which connection a request uses.
pub struct RawConnection {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    /// The serving certificate this connection's handshake got (DER).
    pub server_cert: Vec<u8>,
    port: u16,
}

impl RawClient {
    /// A TLS connection and nothing else: the test writes and reads the bytes itself.
    pub async fn tls(&self) -> tokio_rustls::client::TlsStream<TcpStream> {
        let tcp = TcpStream::connect(self.addr).await.expect("connect");
        self.connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await
            .expect("tls handshake")
    }

    /// Handshakes; the error is what a rejected client certificate looks like to a client.
    pub async fn connect(&self) -> std::io::Result<RawConnection> {
        let tcp = TcpStream::connect(self.addr).await?;
        let tls = self
            .connector
            .connect(ServerName::try_from("localhost").expect("name"), tcp)
            .await?;
        let server_cert = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .unwrap_or_default();
        let io = hyper_util::rt::TokioIo::new(tls);
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(conn);
        Ok(RawConnection {
            sender,
            server_cert,
            port: self.addr.port(),
        })
    }
}

impl RawConnection {
    /// A GET on this connection; Err when the server closed it (e.g. a rejected certificate).
    pub async fn get(
        &mut self,
        path: &str,
        headers: &[(&str, &str)],
    ) -> Result<RawResponse, String> {
        let mut builder = Request::builder()
            .method("GET")
            .uri(path)
            .header("Host", format!("localhost:{}", self.port));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        let request = builder.body(Full::new(Bytes::new())).expect("request");
        let response = self
            .sender
            .send_request(request)
            .await
            .map_err(|e| e.to_string())?;
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok(RawResponse {
            status,
            headers,
            body,
        })
    }
}

impl RawConnection {
    /// A GET whose body is not read: the caller holds it (a client that stopped reading).
    pub async fn get_and_hold(mut self, path: &str) -> (u16, hyper::body::Incoming) {
        let request = Request::builder()
            .method("GET")
            .uri(path)
            .header("Host", format!("localhost:{}", self.port))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = self.sender.send_request(request).await.expect("response");
        (response.status().as_u16(), response.into_body())
    }

    /// A GET whose body is read only up to `bytes` and then dropped, with the connection: a
    /// client that goes away in the middle of a response.
    pub async fn get_and_hang_up(mut self, path: &str, bytes: usize) -> (u16, usize) {
        let request = Request::builder()
            .method("GET")
            .uri(path)
            .header("Host", format!("localhost:{}", self.port))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let response = self.sender.send_request(request).await.expect("response");
        let status = response.status().as_u16();
        let mut body = response.into_body();
        let mut read = 0;
        while read < bytes {
            match body.frame().await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, |d| d.len()),
                _ => break,
            }
        }
        (status, read)
    }
}

/// The lines a child process (e.g. `kubectl get -w`) prints, as they come.
pub fn lines(
    output: impl std::io::Read + Send + 'static,
) -> tokio::sync::mpsc::UnboundedReceiver<String> {
    use std::io::BufRead;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(output)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}
