//! How the server's clients trust the servers they call (admission and audit webhooks, etcd,
//! the cluster's kube-apiserver): as Go's crypto/x509 does, which kube-apiserver and every Go
//! client use. One difference from rustls' WebPKI verifier matters in practice: Go trusts a
//! certificate that is itself in the trusted bundle as it is, with no chain to build. A
//! webhook whose `caBundle` is its own self-signed serving certificate, made as most guides
//! make it (`openssl req -x509`, which marks it `CA:TRUE`), is trusted by kube-apiserver and
//! refused by WebPKI (`CaUsedAsEndEntity`). Everything else is WebPKI's verification: chains,
//! expiry, names, signatures; such a certificate is still checked for its validity period,
//! the name it is called by, and its extended key usage, as Go checks them.

use std::{
    path::PathBuf,
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use rustls::{
    DigitallySignedStruct, Error, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};

/// Where the trusted certificates come from.
#[derive(Debug)]
enum Roots {
    /// A bundle given once (a `caBundle`, a kubeconfig's or a flag's CA file).
    Fixed,
    /// A file read again every minute (the in-cluster CA, which rotates), as kube-rs does.
    File(PathBuf),
}

/// A verifier of server certificates with Go's trust in the bundle's own certificates.
#[derive(Debug)]
pub struct GoVerifier {
    roots: Roots,
    current: RwLock<Trusted>,
}

#[derive(Debug, Clone)]
struct Trusted {
    webpki: Arc<WebPkiServerVerifier>,
    certificates: Arc<Vec<CertificateDer<'static>>>,
    read: Instant,
}

/// How often a CA file is read again.
const RELOAD: Duration = Duration::from_secs(60);

fn trusted(certificates: Vec<CertificateDer<'static>>) -> Result<Trusted, Error> {
    let mut store = RootCertStore::empty();
    for certificate in &certificates {
        store.add(certificate.clone())?;
    }
    let webpki = WebPkiServerVerifier::builder(Arc::new(store))
        .build()
        .map_err(|e| Error::General(e.to_string()))?;
    Ok(Trusted {
        webpki,
        certificates: Arc::new(certificates),
        read: Instant::now(),
    })
}

fn read_pem(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, Error> {
    CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::General(format!("reading certificates: {e}")))
}

impl GoVerifier {
    /// Trusts `certificates` (DER).
    pub fn new(certificates: Vec<CertificateDer<'static>>) -> Result<Self, Error> {
        Ok(Self {
            roots: Roots::Fixed,
            current: RwLock::new(trusted(certificates)?),
        })
    }

    /// Trusts the certificates of the PEM file at `path`, read again every minute.
    pub fn from_file(path: PathBuf) -> Result<Self, Error> {
        let pem = std::fs::read(&path)
            .map_err(|e| Error::General(format!("reading {}: {e}", path.display())))?;
        Ok(Self {
            current: RwLock::new(trusted(read_pem(&pem)?)?),
            roots: Roots::File(path),
        })
    }

    fn current(&self) -> Trusted {
        let current = match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let Roots::File(path) = &self.roots else {
            return current;
        };
        if current.read.elapsed() < RELOAD {
            return current;
        }
        // A file that cannot be read now keeps the certificates read before.
        let fresh = std::fs::read(path)
            .map_err(|e| Error::General(e.to_string()))
            .and_then(|pem| read_pem(&pem))
            .and_then(trusted)
            .unwrap_or(Trusted {
                read: Instant::now(),
                ..current
            });
        if let Ok(mut slot) = self.current.write() {
            *slot = fresh.clone();
        }
        fresh
    }
}

/// Go's check of a certificate found in the root pool itself: valid now, for `server_name`,
/// and for server authentication when it limits its extended key usage.
fn verify_as_root(
    end_entity: &CertificateDer<'_>,
    server_name: &ServerName<'_>,
    now: UnixTime,
) -> Result<(), Error> {
    let (_, certificate) = x509_parser::parse_x509_certificate(end_entity)
        .map_err(|_| Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    let now = x509_parser::time::ASN1Time::from_timestamp(now.as_secs() as i64)
        .map_err(|_| Error::General("the time is out of range".into()))?;
    let validity = certificate.validity();
    if now < validity.not_before {
        return Err(Error::InvalidCertificate(
            rustls::CertificateError::NotValidYet,
        ));
    }
    if now > validity.not_after {
        return Err(Error::InvalidCertificate(rustls::CertificateError::Expired));
    }
    if let Ok(Some(usage)) = certificate.extended_key_usage()
        && !usage.value.any
        && !usage.value.server_auth
    {
        return Err(Error::InvalidCertificate(
            rustls::CertificateError::InvalidPurpose,
        ));
    }
    let parsed = webpki::EndEntityCert::try_from(end_entity)
        .map_err(|_| Error::InvalidCertificate(rustls::CertificateError::BadEncoding))?;
    parsed
        .verify_is_valid_for_subject_name(server_name)
        .map_err(|_| Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
}

impl ServerCertVerifier for GoVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let trusted = self.current();
        match trusted.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        ) {
            Ok(verified) => Ok(verified),
            Err(error)
                if trusted
                    .certificates
                    .iter()
                    .any(|root| root.as_ref() == end_entity.as_ref()) =>
            {
                // The bundle holds this very certificate: Go trusts it as it is. Why it is not
                // trusted otherwise (an expired one, another name) is the answer's.
                verify_as_root(end_entity, server_name, now).map_err(|_| error)?;
                Ok(ServerCertVerified::assertion())
            }
            Err(error) => Err(error),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.current()
            .webpki
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.current()
            .webpki
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current().webpki.supported_verify_schemes()
    }
}

/// A client configuration that trusts `certificates` as Go does, and presents no certificate
/// of its own.
pub fn client_config(
    certificates: Vec<CertificateDer<'static>>,
) -> Result<rustls::ConfigBuilder<rustls::ClientConfig, rustls::client::WantsClientCert>, Error> {
    Ok(rustls::ClientConfig::builder()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(GoVerifier::new(certificates)?)))
}

/// A kube client of the cluster `config` names, which trusts its CA as Go does (see the
/// module's doc); everything else (credentials, timeouts, the server name, headers) is as
/// `kube::Client::try_from` makes it. A config with no CA of its own (the system's roots) or
/// that skips verification is left to kube-rs.
pub fn kube_client(config: kube::Config) -> anyhow::Result<kube::Client> {
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let verifier = match (&config.root_cert_file, &config.root_cert) {
        _ if config.accept_invalid_certs => None,
        (Some(file), _) => Some(GoVerifier::from_file(file.clone())?),
        (None, Some(roots)) => Some(GoVerifier::new(
            roots
                .iter()
                .map(|der| CertificateDer::from(der.clone()))
                .collect(),
        )?),
        (None, None) => None,
    };
    let Some(verifier) = verifier else {
        return Ok(kube::Client::try_from(config)?);
    };
    let mut tls = config.rustls_client_config()?;
    tls.dangerous().set_certificate_verifier(Arc::new(verifier));
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let mut https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http();
    if let Some(name) = &config.tls_server_name {
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(
            ServerName::try_from(name.clone())?,
        ));
    }
    let https = https.enable_http1().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(client);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate marked `CA:TRUE`, as `openssl req -x509` makes one.
    fn self_signed_ca(names: &[&str]) -> CertificateDer<'static> {
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    fn verify(
        trusted: Vec<CertificateDer<'static>>,
        presented: &CertificateDer<'_>,
        name: &str,
    ) -> Result<(), Error> {
        crate::net::tls::install_default_provider();
        let verifier = GoVerifier::new(trusted).unwrap();
        let name = ServerName::try_from(name.to_owned()).unwrap();
        verifier
            .verify_server_cert(presented, &[], &name, &[], UnixTime::now())
            .map(drop)
    }

    #[test]
    fn a_certificate_in_the_bundle_is_trusted_as_it_is_for_its_names_only() {
        let webhook = self_signed_ca(&["localhost", "127.0.0.1"]);
        // WebPKI alone refuses it.
        let webpki = {
            crate::net::tls::install_default_provider();
            let mut store = RootCertStore::empty();
            store.add(webhook.clone()).unwrap();
            WebPkiServerVerifier::builder(Arc::new(store))
                .build()
                .unwrap()
        };
        let refused = webpki.verify_server_cert(
            &webhook,
            &[],
            &ServerName::try_from("localhost").unwrap(),
            &[],
            UnixTime::now(),
        );
        assert!(
            format!("{refused:?}").contains("CaUsedAsEndEntity"),
            "{refused:?}"
        );
        // Go's trust: as it is, for the names it has.
        assert_eq!(verify(vec![webhook.clone()], &webhook, "localhost"), Ok(()));
        assert_eq!(verify(vec![webhook.clone()], &webhook, "127.0.0.1"), Ok(()));
        assert!(verify(vec![webhook.clone()], &webhook, "other.example").is_err());
        // Not in the bundle: not trusted.
        let other = self_signed_ca(&["localhost"]);
        assert!(verify(vec![other], &webhook, "localhost").is_err());
    }
}
