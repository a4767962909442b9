//! An HTTPS server on loopback for the tests' webhooks and receivers: a certificate of its own
//! CA, serving an axum router.

use std::net::SocketAddr;

/// A served router: its address, its CA (PEM) and the directory holding the CA.
pub struct Served {
    pub addr: SocketAddr,
    pub ca_pem: String,
    /// Holds the CA's files for as long as the server is used.
    pub dir: tempfile::TempDir,
}

/// Serves `app` on 127.0.0.1 with a certificate for `127.0.0.1`, `localhost` and `names`,
/// issued by a CA called `ca_name`.
pub async fn serve(app: axum::Router, ca_name: &str, names: &[&str]) -> Served {
    super::install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let ca =
        aggregated_apiserver::net::tls::DevCa::load_or_create_named(dir.path(), ca_name).unwrap();
    let mut sans = vec!["127.0.0.1", "localhost"];
    sans.extend_from_slice(names);
    let (cert, key) = ca.issue_serving(&sans).unwrap();
    let addr = listen(app, cert.into_bytes(), key.into_bytes()).await;
    Served {
        addr,
        ca_pem: ca.cert_pem.clone(),
        dir,
    }
}

/// Serves `app` on 127.0.0.1 with a self-signed certificate made as most guides make a
/// webhook's (`openssl req -x509`, which marks it `CA:TRUE`), for `127.0.0.1`, `localhost`
/// and `names`; `ca_pem` is that certificate itself, the webhook's `caBundle`.
pub async fn serve_self_signed(app: axum::Router, names: &[&str]) -> Served {
    super::install_crypto();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let mut san = String::from("subjectAltName=IP:127.0.0.1,DNS:localhost");
    for name in names {
        san.push_str(&format!(",DNS:{name}"));
    }
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=self-signed-webhook", "-addext", &san])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl (Debian's openssl package) makes the self-signed certificate");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let (cert_pem, key_pem) = (std::fs::read(&cert).unwrap(), std::fs::read(&key).unwrap());
    let addr = listen(app, cert_pem.clone(), key_pem).await;
    Served {
        addr,
        ca_pem: String::from_utf8(cert_pem).unwrap(),
        dir,
    }
}

/// Serves `app` over TLS with `cert` and `key` (PEM) on a free loopback port; its address.
async fn listen(app: axum::Router, cert: Vec<u8>, key: Vec<u8>) -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let addr = listener.local_addr().unwrap();
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(cert, key)
        .await
        .unwrap();
    let server = axum_server::from_tcp_rustls(listener, tls).unwrap();
    tokio::spawn(async move {
        let _ = server.serve(app.into_make_service()).await;
    });
    addr
}
