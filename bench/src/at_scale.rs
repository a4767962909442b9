//! Scenario 18, FarmPods at Kubernetes' published limit: 150,000 Pods shaped as kubelets leave
//! them ([`crate::pods`]), listed by a server from the fake kube-apiserver in pages of 500 as
//! kube-runtime's watcher lists them. Time to ready after the list arrived, RSS against the
//! Pods' JSON, full and paginated lists, selectors, a watch's initial events, and what 16
//! concurrent full lists add.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::BodyExt;

use crate::{
    Pki, Report, RunArgs,
    client::{Proto, Target, percentile},
    fake::Fake,
    procfs,
};

const FARMPODS: &str = "/apis/farm.example.com/v1/farmpods";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// One GET read to its end: (milliseconds, bytes).
async fn timed(t: &Target, path: &str, extra: &[(&str, &str)]) -> Result<(f64, usize)> {
    let mut conn = t.connect(Proto::H2).await?;
    let started = Instant::now();
    let reply = conn.get(path, extra).await?;
    anyhow::ensure!(reply.status == 200, "{path}: {}", reply.status);
    Ok((started.elapsed().as_secs_f64() * 1000.0, reply.body.len()))
}

/// The median of `n` timed GETs.
async fn median_of(
    t: &Target,
    n: usize,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<(f64, usize)> {
    let mut times = Vec::with_capacity(n);
    let mut bytes = 0;
    for _ in 0..n {
        let (ms, b) = timed(t, path, extra).await?;
        times.push(ms);
        bytes = b;
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], bytes))
}

pub async fn run(
    args: &RunArgs,
    pki: &Pki,
    fake: &Arc<Fake>,
    report: &mut Report,
    count: usize,
) -> Result<()> {
    let scenario = "18-scale";
    let made = Instant::now();
    let pods: Vec<Bytes> = (0..count).map(crate::pods::pod).collect();
    let json_bytes: usize = pods.iter().map(Bytes::len).sum();
    println!(
        "  {count} Pods made in {:.1} s: {:.0} MiB of JSON ({} B each on average)",
        made.elapsed().as_secs_f64(),
        json_bytes as f64 / 1048576.0,
        json_bytes / count.max(1)
    );
    fake.pods.set(pods);
    if let Ok(mut last) = fake.pods.last_page.lock() {
        *last = None;
    }
    let (server, startup) = crate::start_server_with(args, pki, &[], true).await?;
    let ready_at = Instant::now();
    let pid = server.pid();
    let t = crate::target(pki, server.addr)?;
    let listed_at = fake
        .pods
        .last_page
        .lock()
        .ok()
        .and_then(|l| *l)
        .context("the server never listed the last page")?;
    let after_list = ready_at.saturating_duration_since(listed_at).as_secs_f64();
    println!("  ready {:.2} s after start", startup.as_secs_f64());
    report.metric(
        scenario,
        "ready after the upstream list's last page",
        after_list,
        "s",
        "≤ 3",
        Some(after_list <= 3.0),
    );
    let rss_ready = procfs::rss_bytes(pid).unwrap_or(0) as f64;
    report.metric(
        scenario,
        "RSS at ready / the Pods' JSON",
        rss_ready / json_bytes as f64,
        "×",
        "≤ 1.5",
        Some(rss_ready <= 1.5 * json_bytes as f64),
    );
    println!("  RSS at ready: {:.0} MiB", rss_ready / 1048576.0);

    let rss = || procfs::rss_bytes(pid).unwrap_or(0) as f64 / 1048576.0;
    let (json_ms, json_len) = median_of(&t, 3, FARMPODS, &[("accept", "application/json")]).await?;
    let after_json = rss();
    let (table_ms, table_len) = median_of(&t, 3, FARMPODS, &[("accept", TABLE)]).await?;
    let after_table = rss();
    let (gzip_ms, gzip_len) = median_of(
        &t,
        3,
        FARMPODS,
        &[("accept", "application/json"), ("accept-encoding", "gzip")],
    )
    .await?;
    println!(
        "  RSS after the JSON lists {after_json:.0} MiB, the Table lists {after_table:.0} MiB, the gzipped lists {:.0} MiB",
        rss()
    );
    println!(
        "  full LIST: JSON {json_ms:.0} ms {:.1} MB; Table {table_ms:.0} ms {:.1} MB; JSON gzipped {gzip_ms:.0} ms {:.1} MB",
        json_len as f64 / 1e6,
        table_len as f64 / 1e6,
        gzip_len as f64 / 1e6
    );
    report.metric(
        scenario,
        "full JSON list, bytes plain / gzipped",
        json_len as f64 / gzip_len.max(1) as f64,
        "×",
        "≥ 8",
        Some(json_len >= 8 * gzip_len),
    );

    // Pages of 500, following continue tokens through the first 60.
    let mut conn = t.connect(Proto::H2).await?;
    let mut page_us = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..60 {
        let path = match &token {
            Some(c) => format!("{FARMPODS}?limit=500&continue={c}"),
            None => format!("{FARMPODS}?limit=500"),
        };
        let started = Instant::now();
        let reply = conn.get(&path, &[]).await?;
        page_us.push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX));
        anyhow::ensure!(reply.status == 200, "page: {}", reply.status);
        let list: serde_json::Value = serde_json::from_slice(&reply.body)?;
        token = list["metadata"]["continue"].as_str().map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    page_us.sort_unstable();
    let page_p99 = percentile(&page_us, 99.0) / 1000.0;
    println!(
        "  pages of 500: p50 {:.1} ms, p99 {page_p99:.1} ms (at the client)",
        percentile(&page_us, 50.0) / 1000.0
    );
    report.metric(
        scenario,
        "a page of 500, p99",
        page_p99,
        "ms",
        "≤ 20",
        Some(page_p99 <= 20.0),
    );
    for (name, query) in [
        (
            "label selector app=app-7 (1,500 Pods)",
            "labelSelector=app%3Dapp-7",
        ),
        ("namespace team-7 (3,000 Pods)", ""),
        (
            "field selector metadata.namespace=team-7",
            "fieldSelector=metadata.namespace%3Dteam-7",
        ),
    ] {
        let path = if query.is_empty() {
            "/apis/farm.example.com/v1/namespaces/team-7/farmpods".to_owned()
        } else {
            format!("{FARMPODS}?{query}")
        };
        let (ms, len) = median_of(&t, 5, &path, &[]).await?;
        println!("  {name}: {ms:.1} ms, {:.2} MB", len as f64 / 1e6);
    }

    // A watch's initial events, up to the bookmark that ends them.
    let mut watch = t.connect(Proto::H2).await?;
    let started = Instant::now();
    let response = watch
        .start(
            "GET",
            &format!(
                "{FARMPODS}?watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true&timeoutSeconds=60"
            ),
            &[],
            Bytes::new(),
        )
        .await?;
    let mut body = response.into_body();
    let mut seen = Vec::new();
    let mut events = 0usize;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            seen.extend_from_slice(data);
        }
        let whole = seen.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let lines: Vec<u8> = seen.drain(..whole).collect();
        events += lines.iter().filter(|b| **b == b'\n').count();
        let end = b"k8s.io/initial-events-end";
        if lines.windows(end.len()).any(|w| w == end.as_slice()) {
            break;
        }
    }
    println!(
        "  watch with sendInitialEvents: {events} events to the initial-events-end bookmark in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    drop(body);
    tokio::time::sleep(Duration::from_millis(500)).await;
    println!(
        "  RSS after the pages, selectors and watch: {:.0} MiB",
        rss()
    );

    // 16 full lists at once: what they add at peak, and what stays.
    let sampler = procfs::PeakRss::start(pid, Duration::from_millis(10));
    let before = procfs::rss_bytes(pid).unwrap_or(0) as f64;
    let lists: Vec<_> = (0..16)
        .map(|_| {
            let t = t.clone();
            tokio::spawn(
                async move { timed(&t, FARMPODS, &[("accept", "application/json")]).await },
            )
        })
        .collect();
    for list in lists {
        list.await??;
    }
    let peak = sampler.stop().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = procfs::rss_bytes(pid).unwrap_or(0) as f64;
    let added = (peak as f64 - before) / 1048576.0;
    report.metric(
        scenario,
        "16 concurrent full lists: RSS added at peak",
        added,
        "MiB",
        "≤ 100",
        Some(added <= 100.0),
    );
    report.metric(
        scenario,
        "RSS after serving full lists / at ready",
        after / rss_ready,
        "×",
        "≤ 1.2",
        Some(after <= 1.2 * rss_ready),
    );
    relist(&t, pid, fake, report).await?;
    drop(server);
    fake.pods.set(Vec::new());
    Ok(())
}

/// The upstream watch expires (410) and the server relists every Pod while clients read
/// FarmPods (a GET and a page of 500, in turn, as fast as they are answered): every read must
/// be answered, and memory must stay within twice the steady state.
async fn relist(t: &Target, pid: u32, fake: &Arc<Fake>, report: &mut Report) -> Result<()> {
    let scenario = "18-scale";
    let one = "/apis/farm.example.com/v1/namespaces/team-0/farmpods/farm-app-0-0000000000-00000";
    let steady = procfs::rss_bytes(pid).unwrap_or(0);
    let running = Arc::new(AtomicBool::new(true));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let sampler = procfs::PeakRss::start(pid, Duration::from_millis(10));
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (t, running, ok, failed) = (t.clone(), running.clone(), ok.clone(), failed.clone());
            tokio::spawn(async move {
                let mut conn = t.connect(Proto::H2).await?;
                let mut n = 0u64;
                while running.load(Ordering::Relaxed) {
                    n += 1;
                    let path = if n.is_multiple_of(2) {
                        format!("{FARMPODS}?limit=500")
                    } else {
                        one.to_owned()
                    };
                    match conn.get(&path, &[]).await {
                        Ok(reply) if reply.status == 200 => ok.fetch_add(1, Ordering::Relaxed),
                        _ => failed.fetch_add(1, Ordering::Relaxed),
                    };
                }
                anyhow::Ok(())
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    fake.pods.compact_with(0, crate::pods::relabelled(0));
    let mut conn = t.connect(Proto::H2).await?;
    loop {
        let reply = conn.get(one, &[]).await?;
        if reply.status == 200
            && String::from_utf8_lossy(&reply.body).contains("\"relisted\":\"yes\"")
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the relist never completed"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = started.elapsed().as_secs_f64();
    running.store(false, Ordering::Relaxed);
    for reader in readers {
        reader.await??;
    }
    let peak = sampler.stop().await;
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!(
        "  relist of every Pod: the change showed {took:.1} s after the watch expired; {ok} reads answered meanwhile"
    );
    report.metric(
        scenario,
        "FarmPod reads failed during the relist",
        failed as f64,
        "",
        "0",
        Some(failed == 0),
    );
    let ratio = peak as f64 / steady.max(1) as f64;
    report.metric(
        scenario,
        "RSS peak during the relist / steady",
        ratio,
        "×",
        "≤ 2",
        Some(ratio <= 2.0),
    );
    Ok(())
}
