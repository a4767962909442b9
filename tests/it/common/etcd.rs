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

use farm_apiserver::store::etcd::{EtcdClient, EtcdConfig};

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
        };
        etcd.spawn().await;
        Some(etcd)
    }

    /// The client URL.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// A client of this etcd.
    pub fn client(&self) -> Arc<EtcdClient> {
        EtcdClient::new(EtcdConfig {
            endpoints: vec![self.endpoint()],
            tls: None,
            request_timeout: Duration::from_secs(5),
        })
        .expect("etcd client")
    }

    async fn spawn(&mut self) {
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let child = Command::new(&self.binary)
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
        for _ in 0..200 {
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
    /// Starts `size` members and waits until each answers; None when there is no etcd.
    pub async fn start(size: usize) -> Option<Self> {
        let binary = binary()?;
        let mut members: Vec<Etcd> = (0..size)
            .map(|_| Etcd {
                child: None,
                binary: binary.clone(),
                dir: tempfile::tempdir().expect("tempdir"),
                client_port: free_port(),
                peer_port: free_port(),
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
            member.wait().await;
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

    async fn wait(&self) {
        let client = self.client();
        for _ in 0..300 {
            if client.revision(b"/").await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("etcd member {} did not start", self.endpoint());
    }
}
