//! A real etcd for the tests: the `etcd` on PATH (or `FARM_ETCD_BIN`), started on loopback
//! ports of its own in a temporary data directory, killed when dropped. Without one the tests
//! that need it print SKIPPED, unless `FARM_REQUIRE_ETCD` is set (CI), where they fail.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::Arc,
    time::Duration,
};

use aggregated_apiserver::store::etcd::{EtcdClient, EtcdConfig};

/// The etcd binary, or None (and a printed reason) when there is none.
pub fn binary() -> Option<PathBuf> {
    let candidate = std::env::var_os("FARM_ETCD_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("etcd"));
    let found = Command::new(&candidate)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found || std::env::var_os("FARM_REQUIRE_ETCD").is_none(),
        "etcd is not on PATH (nor FARM_ETCD_BIN) and FARM_REQUIRE_ETCD is set"
    );
    if !found {
        eprintln!("SKIPPED: etcd is not on PATH (nor FARM_ETCD_BIN); the etcd tests need it");
    }
    found.then_some(candidate)
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One etcd member on loopback.
pub struct Etcd {
    child: Option<Child>,
    binary: PathBuf,
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    /// Serving TLS and requiring client certificates (see [`Etcd::start_tls`]).
    tls: bool,
}

/// The files of a TLS etcd: its CA, and a client certificate it accepts.
pub struct EtcdTls {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Etcd {
    /// Starts etcd and waits until it answers; None when there is no etcd (SKIPPED).
    pub async fn start() -> Option<Self> {
        let binary = binary()?;
        let mut etcd = Self {
            child: None,
            binary,
            dir: tempfile::tempdir().expect("tempdir"),
            client_port: free_port(),
            peer_port: free_port(),
            tls: false,
        };
        etcd.spawn().await;
        Some(etcd)
    }

    /// Starts etcd serving TLS with a certificate from a CA of its own and requiring client
    /// certificates from that CA; None when there is no etcd.
    pub async fn start_tls() -> Option<Self> {
        let binary = binary()?;
        let mut etcd = Self {
            child: None,
            binary,
            dir: tempfile::tempdir().expect("tempdir"),
            client_port: free_port(),
            peer_port: free_port(),
            tls: true,
        };
        let (ca_pem, cert, key, client_cert, client_key) = etcd_pki();
        let ca = Ca { cert_pem: ca_pem };
        let pki = etcd.dir.path().join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        for (name, pem) in [
            ("ca.crt", ca.cert_pem.as_str()),
            ("server.crt", &cert),
            ("server.key", &key),
            ("client.crt", &client_cert),
            ("client.key", &client_key),
        ] {
            std::fs::write(pki.join(name), pem).expect("writing etcd pki");
        }
        etcd.spawn().await;
        Some(etcd)
    }

    /// The CA and client certificate files of a TLS etcd.
    pub fn tls_files(&self) -> EtcdTls {
        let pki = self.dir.path().join("pki");
        EtcdTls {
            ca: pki.join("ca.crt"),
            cert: pki.join("client.crt"),
            key: pki.join("client.key"),
        }
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// A client of this etcd (with the client certificate, for a TLS etcd).
    pub fn client(&self) -> Arc<EtcdClient> {
        let tls = self.tls.then(|| {
            let files = self.tls_files();
            let read = |p: &PathBuf| std::fs::read(p).expect("etcd pki");
            let mut roots = rustls::RootCertStore::empty();
            for cert in aggregated_apiserver::net::tls::load_certs(&read(&files.ca)).expect("ca") {
                roots.add(cert).expect("ca");
            }
            let chain = aggregated_apiserver::net::tls::load_certs(&read(&files.cert)).expect("cert");
            let key = <rustls_pki_types::PrivateKeyDer as rustls_pki_types::pem::PemObject>::from_pem_slice(
                &read(&files.key),
            )
            .expect("key");
            rustls::ClientConfig::builder()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .expect("client config")
        });
        EtcdClient::new(EtcdConfig {
            endpoints: vec![self.endpoint()],
            tls,
            request_timeout: Duration::from_secs(5),
        })
        .expect("etcd client")
    }

    async fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut command = Command::new(&self.binary);
        if self.tls {
            let pki = self.dir.path().join("pki");
            command
                .arg("--cert-file")
                .arg(pki.join("server.crt"))
                .arg("--key-file")
                .arg(pki.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(pki.join("ca.crt"))
                .arg("--client-cert-auth");
        }
        let child = command
            .args(["--name", "farm-test", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("farm-test={peer}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
        let client = self.client();
        // Up to 30 s: a loaded machine starting many etcds at once may take a while.
        for _ in 0..600 {
            if client.revision(b"/").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd did not start on {}", self.endpoint());
    }

    /// Kills etcd (as a crash would), keeping its data.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops etcd where it is (SIGSTOP): it keeps its connections and answers nothing until
    /// [`Etcd::resume`].
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Lets a paused etcd run again (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("etcd is running");
        let sent = std::process::Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "kill {signal} etcd");
    }

    /// Starts it again on the same ports and data.
    pub async fn restart(&mut self) {
        self.kill();
        self.spawn().await;
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Several etcd members on loopback forming one cluster.
pub struct EtcdCluster {
    /// The members, in the order of [`EtcdCluster::endpoints`].
    pub members: Vec<Etcd>,
}

impl EtcdCluster {
    /// Starts `size` members and waits until each answers; None when there is no etcd. A
    /// cluster whose member does not come up is started again on other ports, up to three
    /// times: a port found free may be taken by another test before etcd binds it.
    pub async fn start(size: usize) -> Option<Self> {
        let binary = binary()?;
        for _ in 0..2 {
            if let Some(cluster) = Self::try_start(&binary, size).await {
                return Some(cluster);
            }
            eprintln!("an etcd member did not start: starting the cluster on other ports");
        }
        let cluster = Self::try_start(&binary, size).await;
        assert!(
            cluster.is_some(),
            "the etcd cluster did not start, three times"
        );
        cluster
    }

    async fn try_start(binary: &std::path::Path, size: usize) -> Option<Self> {
        let mut members: Vec<Etcd> = (0..size)
            .map(|_| Etcd {
                child: None,
                binary: binary.to_owned(),
                dir: tempfile::tempdir().expect("tempdir"),
                client_port: free_port(),
                peer_port: free_port(),
                tls: false,
            })
            .collect();
        let initial = members
            .iter()
            .enumerate()
            .map(|(i, m)| format!("farm-{i}=http://127.0.0.1:{}", m.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        for (i, member) in members.iter_mut().enumerate() {
            member.spawn_member(&format!("farm-{i}"), &initial);
        }
        for member in &members {
            if !member.answers().await {
                return None;
            }
        }
        Some(Self { members })
    }

    /// Every member's client URL.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(Etcd::endpoint).collect()
    }
}

impl Etcd {
    fn spawn_member(&mut self, name: &str, initial_cluster: &str) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
            .args(["--name", name, "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", initial_cluster])
            .args(["--initial-cluster-state", "new", "--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting etcd");
        self.child = Some(child);
    }

    /// Whether it answers within 15 s.
    async fn answers(&self) -> bool {
        let client = self.client();
        for _ in 0..300 {
            if client.revision(b"/").await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

struct Ca {
    cert_pem: String,
}

/// A CA of etcd's own, a serving certificate for 127.0.0.1 (for serving only: the server
/// speaks gRPC to etcd itself, through no gateway that would dial with it) and a client
/// certificate.
fn etcd_pki() -> (String, String, String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    };
    let ca_key = KeyPair::generate().expect("key");
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "etcd-ca");
    let ca_cert = ca_params.self_signed(&ca_key).expect("ca");
    let issuer = Issuer::new(ca_params, ca_key);
    let issue = |sans: Vec<String>, cn: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(sans).expect("params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = usages;
        let cert = params.signed_by(&key, &issuer).expect("cert");
        (cert.pem(), key.serialize_pem())
    };
    let (server_cert, server_key) = issue(
        vec!["127.0.0.1".into(), "localhost".into()],
        "etcd",
        vec![ExtendedKeyUsagePurpose::ServerAuth],
    );
    let (client_cert, client_key) = issue(
        Vec::new(),
        "farm-apiserver",
        vec![ExtendedKeyUsagePurpose::ClientAuth],
    );
    (
        ca_cert.pem(),
        server_cert,
        server_key,
        client_cert,
        client_key,
    )
}
