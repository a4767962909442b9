//! Watch fan-out (scenarios 4 and 17): many watchers of one namespace's Llamas, on HTTP/2 streams
//! and HTTP/1.1 connections; a writer creates Llamas at 20/s and each event's delay is measured
//! from the write's acknowledgement. Also what an idle watcher costs the server (RSS).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::json;

use crate::{
    client::{Proto, Target, percentile},
    procfs,
};

/// How the watchers connect.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// HTTP/2 connections, each carrying `streams` watches.
    pub h2_connections: usize,
    pub streams: usize,
    /// HTTP/1.1 connections, one watch each.
    pub h1_connections: usize,
}

impl Shape {
    pub fn watchers(&self) -> usize {
        self.h2_connections * self.streams + self.h1_connections
    }
}

/// What a fan-out run measured.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Fanout {
    pub watchers: usize,
    pub writes: usize,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
    /// Server RSS growth per idle watcher, once all were open (KiB), by protocol.
    pub h2_kib_per_watcher: Option<f64>,
    pub h1_kib_per_watcher: Option<f64>,
    /// Seconds to open every watch.
    pub open_seconds: f64,
    /// CPU seconds per wall second while the writes and their events ran: the server's and the
    /// load generator's (1.0 = one core all the time).
    pub server_busy: f64,
    pub client_busy: f64,
}

/// Opens one watch on `conn` and returns a task that reads `writes` events from it.
async fn watch(
    mut conn: crate::client::Conn,
    path: &str,
    writes: usize,
    started: &Arc<AtomicUsize>,
) -> Result<tokio::task::JoinHandle<Result<Vec<(usize, Instant)>>>> {
    let response = conn.start("GET", path, &[], Bytes::new()).await?;
    anyhow::ensure!(response.status() == 200, "watch: {}", response.status());
    started.fetch_add(1, Ordering::Relaxed);
    Ok(tokio::spawn(async move {
        let _conn = conn;
        let mut body = response.into_body().into_data_stream();
        let mut seen = Vec::with_capacity(writes);
        let mut buffer = Vec::new();
        while seen.len() < writes {
            let Some(chunk) = body.next().await else {
                break;
            };
            let now = Instant::now();
            buffer.extend_from_slice(&chunk?);
            while let Some(pos) = buffer.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buffer.drain(..=pos).collect();
                let text = String::from_utf8_lossy(&line);
                if let Some(i) = text.find("\"name\":\"w-").and_then(|p| text.get(p + 10..))
                    && let Some(n) = i.split('"').next().and_then(|n| n.parse::<usize>().ok())
                {
                    seen.push((n, now));
                }
            }
        }
        Ok(seen)
    }))
}

fn kib_per(before: u64, after: u64, count: usize) -> Option<f64> {
    (count > 0).then(|| after.saturating_sub(before) as f64 / 1024.0 / count as f64)
}

/// Runs the fan-out against the server at `t` (process `pid`) in namespace `ns`.
pub async fn run(t: &Target, pid: u32, shape: Shape, ns: &str) -> Result<Fanout> {
    let mut writer = t.connect(Proto::H2).await?;
    let list = writer
        .get(
            &format!("/apis/farm.example.com/v1alpha/namespaces/{ns}/llamas"),
            &[],
        )
        .await?;
    let rv =
        serde_json::from_slice::<serde_json::Value>(&list.body)?["metadata"]["resourceVersion"]
            .as_str()
            .unwrap_or("0")
            .to_owned();
    let path = format!(
        "/apis/farm.example.com/v1alpha/namespaces/{ns}/llamas?watch=true&resourceVersion={rv}&timeoutSeconds=600"
    );
    let writes = 100usize;
    let started = Arc::new(AtomicUsize::new(0));
    let mut readers = Vec::with_capacity(shape.watchers());
    let opening = Instant::now();

    let rss_before = procfs::rss_bytes(pid).unwrap_or(0);
    for _ in 0..shape.h2_connections {
        let base = t.connect(Proto::H2).await?;
        for _ in 0..shape.streams {
            let conn = base.try_clone().context("h2 clone")?;
            readers.push(watch(conn, &path, writes, &started).await?);
        }
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_h2 = procfs::rss_bytes(pid).unwrap_or(0);

    // HTTP/1.1 connections, 64 handshakes at a time.
    let mut pending = futures::stream::iter(0..shape.h1_connections)
        .map(|_| {
            let (t, path, started) = (t.clone(), path.clone(), started.clone());
            async move {
                let conn = t.connect(Proto::H1).await?;
                watch(conn, &path, writes, &started).await
            }
        })
        .buffer_unordered(64);
    while let Some(reader) = pending.next().await {
        readers.push(reader?);
    }
    drop(pending);
    let open_seconds = opening.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_all = procfs::rss_bytes(pid).unwrap_or(0);
    anyhow::ensure!(
        started.load(Ordering::Relaxed) == shape.watchers(),
        "not every watch started"
    );

    let (server_cpu, client_cpu) = (
        procfs::cpu_seconds(pid).unwrap_or(0.0),
        procfs::cpu_seconds(std::process::id()).unwrap_or(0.0),
    );
    let writing = Instant::now();
    let mut acked = vec![None; writes];
    let mut ticker = tokio::time::interval(Duration::from_millis(50));
    for (i, slot) in acked.iter_mut().enumerate() {
        ticker.tick().await;
        let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
            "metadata": {"name": format!("w-{i}")}, "spec": {"weight": 1.0, "height": 1.0}});
        crate::post_llama(&mut writer, ns, &llama).await?;
        *slot = Some(Instant::now());
    }
    let mut delays: Vec<u32> = Vec::with_capacity(writes * shape.watchers());
    for reader in readers {
        let seen = tokio::time::timeout(Duration::from_secs(60), reader).await???;
        delays.extend(seen.iter().filter_map(|(n, at)| {
            let ack = acked.get(*n).copied().flatten()?;
            Some(u32::try_from(at.saturating_duration_since(ack).as_micros()).unwrap_or(u32::MAX))
        }));
    }
    let wall = writing.elapsed().as_secs_f64();
    let server_busy = (procfs::cpu_seconds(pid).unwrap_or(0.0) - server_cpu) / wall;
    let client_busy = (procfs::cpu_seconds(std::process::id()).unwrap_or(0.0) - client_cpu) / wall;
    delays.sort_unstable();
    println!(
        "  events received: {} of {}",
        delays.len(),
        writes * shape.watchers()
    );
    anyhow::ensure!(
        delays.len() == writes * shape.watchers(),
        "missing watch events"
    );
    Ok(Fanout {
        watchers: shape.watchers(),
        writes,
        p50_ms: percentile(&delays, 50.0) / 1000.0,
        p99_ms: percentile(&delays, 99.0) / 1000.0,
        max_ms: delays.last().copied().unwrap_or_default() as f64 / 1000.0,
        h2_kib_per_watcher: kib_per(rss_before, rss_h2, shape.h2_connections * shape.streams),
        h1_kib_per_watcher: kib_per(rss_h2, rss_all, shape.h1_connections),
        open_seconds,
        server_busy,
        client_busy,
    })
}
