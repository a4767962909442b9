//! Scenario 16, watchers that stop reading: one Llama takes large merge patches (100 KB each)
//! while a watcher reads every event, and a GET of another Llama follows each write; first with
//! no other watcher (the baseline), then with two that never read (an HTTP/1.1 connection, and
//! an HTTP/2 stream on the reading watcher's own connection). The stuck watchers must be ended
//! (`apiserver_terminated_watchers_total`), the server's RSS must stay bounded, and the write,
//! GET and write-to-event latencies must not change.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::json;

use crate::{
    client::{Proto, Target, percentile},
    procfs,
};

const NS: &str = "slow-watch";
const LLAMAS: &str = "/apis/farm.example.com/v1/namespaces/slow-watch/llamas";

/// What one phase measured (latencies in ms).
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Phase {
    pub writes: usize,
    pub write_p50: f64,
    pub write_p99: f64,
    pub get_p50: f64,
    pub get_p99: f64,
    pub event_p50: f64,
    pub event_p99: f64,
}

/// The scenario's figures.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct SlowWatch {
    pub baseline: Phase,
    pub stuck: Phase,
    /// Watchers the server ended during the stuck phase (the metric's increase).
    pub ended: u64,
    /// RSS when the scenario started, and the highest sampled during it, in MiB.
    pub rss_start_mib: f64,
    pub rss_peak_mib: f64,
    /// Events the stuck watchers got before their end, once read (HTTP/1.1, HTTP/2); None
    /// when the stream had not ended 30 s after they began to read.
    pub stuck_events: (Option<usize>, Option<usize>),
}

fn ms(sorted: &[u32], p: f64) -> f64 {
    percentile(sorted, p) / 1000.0
}

async fn terminated(t: &Target) -> Result<u64> {
    let mut conn = t.connect(Proto::H1).await?;
    let reply = conn.get("/metrics", &[]).await?;
    let text = String::from_utf8_lossy(&reply.body);
    Ok(text
        .lines()
        .find(|l| {
            l.starts_with("apiserver_terminated_watchers_total{")
                && l.contains("resource=\"llamas\"")
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0))
}

fn watch_path(rv: &str) -> String {
    format!("{LLAMAS}?watch=1&resourceVersion={rv}&fieldSelector=metadata.name%3Dbig")
}

/// The resourceVersion of each whole event line in `buffer` (which keeps any partial line).
fn take_rvs(buffer: &mut Vec<u8>) -> Vec<u64> {
    let whole = buffer
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    buffer
        .drain(..whole)
        .collect::<Vec<u8>>()
        .split(|b| *b == b'\n')
        .filter_map(|line| serde_json::from_slice::<serde_json::Value>(line).ok())
        .filter_map(|e| {
            e["object"]["metadata"]["resourceVersion"]
                .as_str()?
                .parse()
                .ok()
        })
        .collect()
}

/// `writes` patches of ~100 KB, each followed by a GET; the reading watcher's arrival times
/// (by resourceVersion) give each write's event latency.
async fn phase(
    t: &Target,
    writes: usize,
    first: usize,
    arrivals: &Arc<Mutex<Vec<(u64, Instant)>>>,
) -> Result<Phase> {
    let mut writer = t.connect(Proto::H2).await?;
    let mut reader = t.connect(Proto::H2).await?;
    let mut acks = Vec::with_capacity(writes);
    let mut write_us = Vec::with_capacity(writes);
    let mut get_us = Vec::with_capacity(writes);
    for i in first..first + writes {
        let blob = format!("{i:06}").repeat(100 * 1024 / 6);
        let patch = json!({"metadata": {"annotations": {"farm.example.com/blob": blob}}});
        let started = Instant::now();
        let reply = writer
            .send(
                "PATCH",
                &format!("{LLAMAS}/big"),
                &[("content-type", "application/merge-patch+json")],
                Bytes::from(patch.to_string()),
            )
            .await?;
        let acked = Instant::now();
        anyhow::ensure!(reply.status == 200, "patch: {}", reply.status);
        write_us.push(u32::try_from((acked - started).as_micros()).unwrap_or(u32::MAX));
        let rv: u64 = serde_json::from_slice::<serde_json::Value>(&reply.body)?["metadata"]
            ["resourceVersion"]
            .as_str()
            .and_then(|rv| rv.parse().ok())
            .context("patch reply without resourceVersion")?;
        acks.push((rv, acked));
        let started = Instant::now();
        let reply = reader.get(&format!("{LLAMAS}/small"), &[]).await?;
        anyhow::ensure!(reply.status == 200, "get: {}", reply.status);
        get_us.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
    }
    // Every event arrives (the reading watcher is never ended).
    let last = acks.last().map(|(rv, _)| *rv).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(30);
    while arrivals
        .lock()
        .map_err(|_| anyhow::anyhow!("lock"))?
        .last()
        .is_none_or(|(rv, _)| *rv < last)
    {
        anyhow::ensure!(Instant::now() < deadline, "the reading watcher fell behind");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let arrived = arrivals.lock().map_err(|_| anyhow::anyhow!("lock"))?;
    let mut event_us: Vec<u32> = acks
        .iter()
        .map(|(rv, acked)| {
            arrived
                .iter()
                .find(|(r, _)| r == rv)
                .map(|(_, at)| u32::try_from(at.saturating_duration_since(*acked).as_micros()))
                .and_then(Result::ok)
                .unwrap_or(u32::MAX)
        })
        .collect();
    drop(arrived);
    write_us.sort_unstable();
    get_us.sort_unstable();
    event_us.sort_unstable();
    Ok(Phase {
        writes,
        write_p50: ms(&write_us, 50.0),
        write_p99: ms(&write_us, 99.0),
        get_p50: ms(&get_us, 50.0),
        get_p99: ms(&get_us, 99.0),
        event_p50: ms(&event_us, 50.0),
        event_p99: ms(&event_us, 99.0),
    })
}

/// Runs the scenario against the server at `t` (process `pid`): `baseline` writes with no stuck
/// watcher, then `stuck_writes` with two.
pub async fn run(t: &Target, pid: u32, baseline: usize, stuck_writes: usize) -> Result<SlowWatch> {
    let rss_start = procfs::rss_bytes(pid).unwrap_or(0);
    let sampler = procfs::PeakRss::start(pid, Duration::from_millis(20));

    let mut writer = t.connect(Proto::H2).await?;
    for name in ["big", "small"] {
        let llama = json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
            "metadata": {"name": name}, "spec": {"weightKg": 1.0, "heightMetres": 1.0}});
        let reply = writer
            .send(
                "POST",
                LLAMAS,
                &[("content-type", "application/json")],
                Bytes::from(llama.to_string()),
            )
            .await?;
        anyhow::ensure!(
            reply.status == 201 || reply.status == 409,
            "create {name} in {NS}: {}",
            reply.status
        );
    }
    let reply = writer.get(&format!("{LLAMAS}/big"), &[]).await?;
    let rv0 =
        serde_json::from_slice::<serde_json::Value>(&reply.body)?["metadata"]["resourceVersion"]
            .as_str()
            .context("resourceVersion")?
            .to_owned();

    // The reading watcher, on the connection the stuck HTTP/2 stream will share.
    let watch_conn = t.connect(Proto::H2).await?;
    let arrivals: Arc<Mutex<Vec<(u64, Instant)>>> = Arc::default();
    let reading = {
        let mut conn = watch_conn.try_clone().context("h2 clone")?;
        let response = conn
            .start("GET", &watch_path(&rv0), &[], Bytes::new())
            .await?;
        let arrivals = arrivals.clone();
        tokio::spawn(async move {
            let mut body = response.into_body();
            let mut buffer = Vec::new();
            while let Some(Ok(frame)) = body.frame().await {
                let now = Instant::now();
                if let Some(data) = frame.data_ref() {
                    buffer.extend_from_slice(data);
                }
                let rvs = take_rvs(&mut buffer);
                if let Ok(mut arrivals) = arrivals.lock() {
                    arrivals.extend(rvs.into_iter().map(|rv| (rv, now)));
                }
            }
        })
    };

    let baseline = phase(t, baseline, 0, &arrivals).await?;
    let ended_before = terminated(t).await?;

    // Two watchers that never read: their responses are held, their bodies never polled.
    let current = {
        let reply = writer.get(&format!("{LLAMAS}/big"), &[]).await?;
        serde_json::from_slice::<serde_json::Value>(&reply.body)?["metadata"]["resourceVersion"]
            .as_str()
            .context("resourceVersion")?
            .to_owned()
    };
    let mut h1 = t.connect(Proto::H1).await?;
    let stuck_h1 = h1
        .start("GET", &watch_path(&current), &[], Bytes::new())
        .await?;
    let mut shared = watch_conn.try_clone().context("h2 clone")?;
    let stuck_h2 = shared
        .start("GET", &watch_path(&current), &[], Bytes::new())
        .await?;

    let stuck = phase(t, stuck_writes, baseline.writes, &arrivals).await?;
    let ended = terminated(t).await? - ended_before;
    let peak = sampler.stop().await;
    reading.abort();

    let mut stuck_events = (None, None);
    for (slot, response) in [
        (&mut stuck_events.0, stuck_h1),
        (&mut stuck_events.1, stuck_h2),
    ] {
        let mut body = response.into_body();
        let mut buffer = Vec::new();
        let mut count = 0;
        let drained = tokio::time::timeout(Duration::from_secs(30), async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Some(data) = frame.data_ref() {
                    buffer.extend_from_slice(data);
                }
                count += take_rvs(&mut buffer).len();
            }
        })
        .await;
        *slot = drained.is_ok().then_some(count);
    }
    Ok(SlowWatch {
        baseline,
        stuck,
        ended,
        rss_start_mib: rss_start as f64 / 1048576.0,
        rss_peak_mib: peak as f64 / 1048576.0,
        stuck_events,
    })
}
