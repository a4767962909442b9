//! Serving TLS: certificates from files (reloaded when they change on disk) or a development CA
//! made with rcgen; optional client certificates verified against the trusted client CAs; ALPN
//! h2 + http/1.1; `TCP_NODELAY` on every socket; the verified client chain handed to handlers.

use std::{
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context, Result};
use axum_server::{
    accept::{Accept, NoDelayAcceptor},
    tls_rustls::{RustlsAcceptor, RustlsConfig},
};
use futures::future::BoxFuture;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::{RootCertStore, ServerConfig, server::WebPkiClientVerifier};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use sha2::{Digest, Sha256};
use tokio::net::TcpStream;

use crate::net::connection;

/// File of a CA directory holding the CA certificate (PEM).
pub const CA_CERT: &str = "ca.crt";
/// File of a CA directory holding the CA's private key (PEM, mode 0600).
pub const CA_KEY: &str = "ca.key";
/// File holding the serving certificate (PEM), as a `kubernetes.io/tls` Secret names it.
pub const TLS_CERT: &str = "tls.crt";
/// File holding the serving certificate's private key (PEM, mode 0600).
pub const TLS_KEY: &str = "tls.key";
/// File of `--cert-dir` holding the development kubeconfig.
pub const KUBECONFIG: &str = "kubeconfig";

/// The group the development kubeconfig's user is in: always authorized, so the kubeconfig
/// works without a cluster.
pub const DEV_GROUP: &str = "system:masters";

/// What the development certificates name: the serving certificate's names (local use and the
/// in-cluster Service) and the kubeconfig's user and context.
#[derive(Debug, Clone, Copy)]
pub struct DevNames {
    /// The names the serving certificate is valid for.
    pub sans: &'static [&'static str],
    /// The user the kubeconfig authenticates as (in [`DEV_GROUP`]).
    pub user: &'static str,
    /// The kubeconfig's cluster and context.
    pub context: &'static str,
}

/// Where the serving certificate and key are.
#[derive(Debug, Clone)]
pub struct ServingFiles {
    /// The certificate chain, PEM, leaf first.
    pub cert: PathBuf,
    /// Its private key, PEM.
    pub key: PathBuf,
}

impl ServingFiles {
    /// The development serving certificate and key in `dir`, as [`ensure_dev_certificates`]
    /// writes them.
    pub fn development(dir: &Path) -> Self {
        Self {
            cert: dir.join(TLS_CERT),
            key: dir.join(TLS_KEY),
        }
    }
}

/// Installs ring as the process's rustls provider; a second call is harmless.
pub fn install_default_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Writes `contents` (a private key, or a file holding one) readable by its owner only.
#[cfg(unix)]
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    use std::{fs::OpenOptions, io::Write, os::unix::fs::OpenOptionsExt};
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(contents.as_bytes())?;
    Ok(())
}

/// Writes `contents` (a private key, or a file holding one).
#[cfg(not(unix))]
pub fn write_private(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn ca_params(common_name: &str) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name = DistinguishedName::new();
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = time_now();
    params.not_before = now - rcgen_days(1);
    params.not_after = now + rcgen_days(3650);
    Ok(params)
}

fn time_now() -> time::OffsetDateTime {
    time::OffsetDateTime::now_utc()
}

fn rcgen_days(days: i64) -> time::Duration {
    time::Duration::days(days)
}

/// A CA kept in a directory (`ca.crt`, `ca.key`): the development CA of `--cert-dir`, or an
/// install CA. Loaded when present, created otherwise.
pub struct DevCa {
    /// The CA certificate, PEM: what clients and the APIService's caBundle trust.
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl DevCa {
    /// The development CA of `dir` (see [`DevCa::load_or_create_named`]).
    pub fn load_or_create(dir: &Path) -> Result<Self> {
        Self::load_or_create_named(dir, "development CA")
    }

    /// The CA in `dir`, or a new one named `common_name` written there. An error when only one
    /// of its two files is there: a CA is never replaced silently.
    pub fn load_or_create_named(dir: &Path, common_name: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (cert_path, key_path) = (dir.join(CA_CERT), dir.join(CA_KEY));
        // Half a CA is never replaced silently: a new one would change every trust in it.
        anyhow::ensure!(
            cert_path.exists() == key_path.exists(),
            "{} holds one of {CA_CERT} and {CA_KEY} but not the other: restore it, or remove both to make a new CA",
            dir.display()
        );
        if cert_path.exists() && key_path.exists() {
            let cert_pem = std::fs::read_to_string(&cert_path)?;
            let key = KeyPair::from_pem(&std::fs::read_to_string(&key_path)?)
                .context("parsing the dev CA key")?;
            let issuer =
                Issuer::from_ca_cert_pem(&cert_pem, key).context("parsing the dev CA cert")?;
            return Ok(Self { cert_pem, issuer });
        }
        let key = KeyPair::generate()?;
        let params = ca_params(common_name)?;
        let cert = params.self_signed(&key)?;
        write_private(&key_path, &key.serialize_pem())?;
        std::fs::write(&cert_path, cert.pem())?;
        Ok(Self {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A serving certificate for `sans` (its common name the first), signed by this CA.
    /// Returns (cert PEM, key PEM).
    pub fn issue_serving(&self, sans: &[&str]) -> Result<(String, String)> {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(
            DnType::CommonName,
            sans.first().copied().unwrap_or("server"),
        );
        self.sign(params, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// Signs `params` for `usage`, valid from a day ago for a year, with a new key. Returns
    /// (cert PEM, key PEM).
    fn sign(
        &self,
        mut params: CertificateParams,
        usage: ExtendedKeyUsagePurpose,
    ) -> Result<(String, String)> {
        let key = KeyPair::generate()?;
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let now = time_now();
        params.not_before = now - rcgen_days(1);
        params.not_after = now + rcgen_days(365);
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem()))
    }

    /// A client certificate: user = CN, groups = O. Returns (cert PEM, key PEM).
    pub fn issue_client(&self, user: &str, groups: &[&str]) -> Result<(String, String)> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, user);
        for group in groups {
            params
                .distinguished_name
                .push(DnType::OrganizationName, *group);
        }
        self.sign(params, ExtendedKeyUsagePurpose::ClientAuth)
    }
}

/// Makes sure `dir` holds a dev CA, a serving cert for `names.sans` and a kubeconfig for
/// `server_url`. The CA and serving cert are reused across restarts; the kubeconfig is rewritten
/// (the port may have changed). Returns the CA PEM.
pub fn ensure_dev_certificates(dir: &Path, server_url: &str, names: &DevNames) -> Result<String> {
    let ca = DevCa::load_or_create(dir)?;
    let (cert_path, key_path) = (dir.join(TLS_CERT), dir.join(TLS_KEY));
    if !(cert_path.exists() && key_path.exists()) {
        let (cert, key) = ca.issue_serving(names.sans)?;
        write_private(&key_path, &key)?;
        std::fs::write(&cert_path, cert)?;
    }
    let (client_cert, client_key) = ca.issue_client(names.user, &[DEV_GROUP])?;
    write_private(
        &dir.join(KUBECONFIG),
        &kubeconfig(server_url, &ca.cert_pem, (&client_cert, &client_key), names),
    )?;
    Ok(ca.cert_pem)
}

/// A kubeconfig (context `names.context`, namespace `default`) for `server_url`, trusting
/// `ca_pem` and authenticating as `names.user` with the given client certificate and key (PEM).
pub fn kubeconfig(
    server_url: &str,
    ca_pem: &str,
    (cert_pem, key_pem): (&str, &str),
    names: &DevNames,
) -> String {
    use base64::Engine;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (user, context) = (names.user, names.context);
    format!(
        "apiVersion: v1
kind: Config
clusters:
- name: {context}
  cluster:
    server: {server_url}
    certificate-authority-data: {ca}
users:
- name: {user}
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {context}
  context:
    cluster: {context}
    user: {user}
    namespace: default
current-context: {context}
",
        ca = b64(ca_pem),
        cert = b64(cert_pem),
        key = b64(key_pem),
    )
}

/// The URL a local client reaches a bind address at (wildcards become loopback).
pub fn local_url(addr: SocketAddr) -> String {
    let host = match addr.ip() {
        ip if ip.is_unspecified() && ip.is_ipv4() => "127.0.0.1".to_owned(),
        ip if ip.is_unspecified() => "[::1]".to_owned(),
        std::net::IpAddr::V6(ip) => format!("[{ip}]"),
        ip => ip.to_string(),
    };
    format!("https://{host}:{}", addr.port())
}

/// Every certificate of a PEM bundle, in order; an error when there is none or one does not
/// parse.
pub fn load_certs(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .context("parsing PEM certificates")?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in PEM data");
    Ok(certs)
}

fn root_store(client_cas: &[String]) -> Result<Option<Arc<RootCertStore>>> {
    let mut roots = RootCertStore::empty();
    for pem in client_cas {
        for cert in load_certs(pem.as_bytes())? {
            roots.add(cert).context("adding a client CA")?;
        }
    }
    Ok((!roots.is_empty()).then(|| Arc::new(roots)))
}

/// A rustls server config for the serving cert and key PEM and the client CAs.
pub fn server_config(
    cert_pem: &[u8],
    key_pem: &[u8],
    client_cas: &[String],
) -> Result<ServerConfig> {
    let certs = load_certs(cert_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).context("parsing the private key")?;
    let builder = ServerConfig::builder();
    let builder = match root_store(client_cas)? {
        // Optional: health probes and token clients have no certificate.
        Some(roots) => builder.with_client_cert_verifier(
            WebPkiClientVerifier::builder(roots)
                .allow_unauthenticated()
                .build()
                .context("building the client certificate verifier")?,
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .context("the serving certificate does not match its key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

fn read_files(files: &ServingFiles) -> Result<(Vec<u8>, Vec<u8>)> {
    let cert =
        std::fs::read(&files.cert).with_context(|| format!("reading {}", files.cert.display()))?;
    let key =
        std::fs::read(&files.key).with_context(|| format!("reading {}", files.key.display()))?;
    Ok((cert, key))
}

fn fingerprint(cert: &[u8], key: &[u8]) -> [u8; 32] {
    let mut hasher = Sha256::new();
    hasher.update(cert);
    hasher.update(key);
    hasher.finalize().into()
}

/// The serving TLS config: the certificate files and the client CAs the handshake accepts.
/// Either can change while the server runs; new handshakes get the new config, open connections
/// keep theirs.
pub struct ServingTls {
    /// What the listener serves with; swapped in place on reload.
    pub config: RustlsConfig,
    files: ServingFiles,
    state: std::sync::Mutex<(Vec<String>, [u8; 32])>,
}

impl ServingTls {
    /// Reads `files` and builds the config; an error when they cannot be read or do not match.
    /// Nothing is reloaded until [`ServingTls::reload_loop`] runs.
    pub fn load(files: ServingFiles, client_cas: Vec<String>) -> Result<Arc<Self>> {
        let (cert, key) = read_files(&files)?;
        let config = server_config(&cert, &key, &client_cas)?;
        Ok(Arc::new(Self {
            config: RustlsConfig::from_config(Arc::new(config)),
            files,
            state: std::sync::Mutex::new((client_cas, fingerprint(&cert, &key))),
        }))
    }

    fn rebuild(&self, client_cas: Option<Vec<String>>) -> Result<bool> {
        let (cert, key) = read_files(&self.files)?;
        let current = fingerprint(&cert, &key);
        let mut state = self
            .state
            .lock()
            .map_err(|_| anyhow::anyhow!("TLS state lock poisoned"))?;
        let cas_changed = client_cas.as_ref().is_some_and(|c| *c != state.0);
        if current == state.1 && !cas_changed {
            return Ok(false);
        }
        let cas = client_cas.unwrap_or_else(|| state.0.clone());
        let config = server_config(&cert, &key, &cas)?;
        self.config.reload_from_config(Arc::new(config));
        *state = (cas, current);
        Ok(true)
    }

    /// Accept client certificates from these CAs from the next handshake on.
    pub fn set_client_cas(&self, client_cas: Vec<String>) {
        if let Err(error) = self.rebuild(Some(client_cas)) {
            tracing::error!(%error, "could not apply the new client CAs");
        }
    }

    /// Re-reads the serving files every `interval` and swaps the config when their content
    /// changed. Reading content (not mtimes) follows a Secret volume's `..data` symlink swap.
    pub async fn reload_loop(self: Arc<Self>, interval: Duration) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticker.tick().await;
            match self.rebuild(None) {
                Ok(true) => {
                    tracing::info!(cert = %self.files.cert.display(), "reloaded the serving certificate");
                }
                Ok(false) => {}
                // A half-written pair (cert updated, key not yet) is retried on the next tick.
                Err(error) => tracing::warn!(%error, "not reloading the serving certificate yet"),
            }
        }
    }
}

/// TLS with `TCP_NODELAY` (no 40 ms delayed-ACK stall on the first response of a connection),
/// passing the client's verified certificate chain to the connection's service; the connection
/// bounded by [`connection::Limits`].
#[derive(Clone)]
pub struct Acceptor {
    inner: RustlsAcceptor<NoDelayAcceptor>,
    limits: connection::Limits,
}

impl Acceptor {
    /// Serves TLS with `config` (which reloads apply to), each connection bounded by `limits`.
    pub fn new(config: RustlsConfig, limits: connection::Limits) -> Self {
        Self {
            inner: RustlsAcceptor::new(config)
                .handshake_timeout(Duration::from_secs(10))
                .acceptor(NoDelayAcceptor::new()),
            limits,
        }
    }
}

/// A connection's service, told the client certificate chain the handshake verified (leaf
/// first; empty when none was sent) and what its requests tell the connection's bounds. (Not an
/// `Extension` layer: that inserts into every request's extension map, three allocations a
/// request.)
pub trait ConnectionService {
    /// The service for one connection: `chain` is what the handshake verified, `activity`
    /// what the connection's idle and write bounds watch, `remote` the peer's address.
    fn for_connection(
        self,
        chain: Vec<CertificateDer<'static>>,
        activity: Arc<connection::Activity>,
        remote: Option<std::net::IpAddr>,
    ) -> Self;
}

impl<S: ConnectionService + Send + 'static> Accept<TcpStream, S> for Acceptor {
    type Stream = connection::Guarded<tokio_rustls::server::TlsStream<TcpStream>>;
    type Service = S;
    type Future = BoxFuture<'static, io::Result<(Self::Stream, Self::Service)>>;

    fn accept(&self, stream: TcpStream, service: S) -> Self::Future {
        let inner = self.inner.clone();
        let limits = self.limits;
        let remote = stream.peer_addr().ok().map(|a| a.ip().to_canonical());
        Box::pin(async move {
            let (stream, service) = inner.accept(stream, service).await?;
            let chain = stream
                .get_ref()
                .1
                .peer_certificates()
                .map(|certs| certs.iter().map(|c| c.clone().into_owned()).collect())
                .unwrap_or_default();
            let activity = Arc::new(connection::Activity::default());
            let service = service.for_connection(chain, activity.clone(), remote);
            Ok((connection::Guarded::new(stream, limits, activity), service))
        })
    }
}
