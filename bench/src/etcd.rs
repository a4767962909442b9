//! Scenario 11's pieces: a real etcd for farm-apiserver's `--storage etcd`, and the write load
//! (creates and updates per second at a number of clients).

use std::{
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use serde_json::json;

use crate::client::{Proto, Target};

/// An etcd on loopback ports of its own, in a temporary data directory; killed when dropped.
pub struct Etcd {
    child: Child,
    /// Its client URL.
    pub endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The etcd binary: `FARM_ETCD_BIN`, else `etcd` on PATH.
pub fn binary() -> PathBuf {
    std::env::var_os("FARM_ETCD_BIN").map_or_else(|| PathBuf::from("etcd"), PathBuf::from)
}

impl Etcd {
    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Starts etcd and waits until its client port answers.
    pub async fn start(client_port: u16, peer_port: u16) -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let endpoint = format!("http://127.0.0.1:{client_port}");
        let peer = format!("http://127.0.0.1:{peer_port}");
        let child = Command::new(binary())
            .args(["--name", "farm-bench", "--data-dir"])
            .arg(dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &endpoint,
                "--advertise-client-urls",
                &endpoint,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("farm-bench={peer}")])
            .args(["--log-level", "error"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting etcd (on PATH, or FARM_ETCD_BIN)")?;
        let etcd = Self {
            child,
            endpoint,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while tokio::net::TcpStream::connect(("127.0.0.1", client_port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("etcd did not start");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(etcd)
    }
}

/// What a write load achieved.
pub struct Writes {
    /// Successful writes per second.
    pub rate: f64,
    /// Writes refused (anything but the expected status).
    pub errors: usize,
}

/// What [`writes`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// Creates of new Llamas.
    Create,
    /// Merge patches of one Llama per client (`spec.weight`).
    MergePatch,
    /// Server-side applies of one Llama per client: the whole configuration, `spec.weight`
    /// changed, as kubectl and controllers send it.
    Apply,
}

/// `clients` connections writing for `seconds` in `namespace`, each one `write` after the other
/// (the Llamas patched or applied are made first).
pub async fn writes(
    t: &Target,
    namespace: &str,
    clients: usize,
    seconds: f64,
    write: Write,
) -> Result<Writes> {
    writes_in(t, "farm.example.com", namespace, clients, seconds, write).await
}

/// [`writes`] of the Llamas of API group `group` (farm-apiserver's, or a CRD's in another group
/// through kube-apiserver).
pub async fn writes_in(
    t: &Target,
    group: &str,
    namespace: &str,
    clients: usize,
    seconds: f64,
    write: Write,
) -> Result<Writes> {
    let done = Arc::new(AtomicUsize::new(0));
    let errors = Arc::new(AtomicUsize::new(0));
    let base = format!("/apis/{group}/v1alpha/namespaces/{namespace}/llamas");
    let api_version = format!("{group}/v1alpha");
    let config = |c: usize, weight: f64| {
        json!({"apiVersion": api_version, "kind": "Llama",
            "metadata": {"name": format!("u-{c}")}, "spec": {"weight": weight, "height": 1.0}})
        .to_string()
    };
    const APPLY: &str = "application/apply-patch+yaml";
    let mut conns = Vec::new();
    for c in 0..clients {
        let mut conn = t.connect(Proto::H2).await?;
        let (method, path, content_type, expected) = match write {
            Write::Create => ("", String::new(), "", 0),
            Write::MergePatch => ("POST", base.clone(), "application/json", 201),
            Write::Apply => (
                "PATCH",
                format!("{base}/u-{c}?fieldManager=farm-bench"),
                APPLY,
                201,
            ),
        };
        if !method.is_empty() {
            let reply = conn
                .send(
                    method,
                    &path,
                    &[("content-type", content_type)],
                    Bytes::from(config(c, 1.0)),
                )
                .await?;
            anyhow::ensure!(reply.status == expected, "creating u-{c}: {}", reply.status);
        }
        conns.push(conn);
    }
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let (done, errors, base) = (done.clone(), errors.clone(), base.clone());
        let api_version = api_version.clone();
        let configured = api_version.clone();
        let config = move |c: usize, weight: f64| {
            json!({"apiVersion": configured, "kind": "Llama",
                "metadata": {"name": format!("u-{c}")}, "spec": {"weight": weight, "height": 1.0}})
            .to_string()
        };
        tasks.push(tokio::spawn(async move {
            let mut i = 0u64;
            while Instant::now() < end {
                i += 1;
                let (method, path, content_type, body, expected) = match write {
                    Write::MergePatch => (
                        "PATCH",
                        format!("{base}/u-{c}"),
                        "application/merge-patch+json",
                        json!({"spec": {"weight": 1.0 + i as f64}}).to_string(),
                        200,
                    ),
                    Write::Apply => (
                        "PATCH",
                        format!("{base}/u-{c}?fieldManager=farm-bench"),
                        APPLY,
                        config(c, 1.0 + i as f64),
                        200,
                    ),
                    Write::Create => (
                        "POST",
                        base.clone(),
                        "application/json",
                        json!({"apiVersion": api_version, "kind": "Llama",
                            "metadata": {"name": format!("c-{c}-{i}")},
                            "spec": {"weight": 1.0, "height": 1.0}})
                        .to_string(),
                        201,
                    ),
                };
                match conn
                    .send(
                        method,
                        &path,
                        &[("content-type", content_type)],
                        Bytes::from(body),
                    )
                    .await
                {
                    Ok(reply) if reply.status == expected => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
    }
    for task in tasks {
        task.await?;
    }
    Ok(Writes {
        rate: done.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64(),
        errors: errors.load(Ordering::Relaxed),
    })
}
