//! The server over time and under abuse: memory and start-up, through kube-apiserver, the soak, abusive connections.

use super::*;

pub(crate) async fn scenario_7(b: &mut Bench, startup: Duration) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!("7. Memory and start-up");
    report.metric(
        "7-memory",
        "startup to ready (first start of this run, 10k synthetic pods)",
        startup.as_secs_f64() * 1000.0,
        "ms",
        "(see below)",
        None,
    );
    let (idle, ready) = start_server(args, pki, &["--no-sample-data"]).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle_rss = procfs::rss_bytes(idle.pid()).unwrap_or(0) as f64;
    drop(idle);
    report.metric(
        "7-memory",
        "startup to ready, no cluster data",
        ready.as_secs_f64() * 1000.0,
        "ms",
        "≤ 100",
        Some(ready.as_millis() <= 100),
    );
    report.metric(
        "7-memory",
        "RSS idle",
        idle_rss / 1048576.0,
        "MiB",
        "≤ 12",
        Some(idle_rss <= 12.0 * 1048576.0),
    );
    // Most of the idle RSS is code: how much of symbol.order (start-up's and
    // requests' functions, laid out together) the binary still has by name.
    match symbol_order_coverage(&args.server) {
        Ok((found, listed)) => report.metric(
            "7-memory",
            "functions of symbol.order the binary has (bench/symbol-order renews it)",
            100.0 * found as f64 / listed.max(1) as f64,
            "%",
            "≥ 90",
            Some(found * 10 >= listed * 9),
        ),
        Err(e) => println!("  symbol.order's coverage not measured: {e:#}"),
    }
    let (full, _) = start_server(
        args,
        pki,
        &["--no-sample-data", "--synthetic-llamas", "100000"],
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let full_rss = procfs::rss_bytes(full.pid()).unwrap_or(0) as f64;
    drop(full);
    let per_llama = (full_rss - idle_rss) / 100_000.0;
    report.metric(
        "7-memory",
        "RSS after 100k Llamas",
        full_rss / 1048576.0,
        "MiB",
        "",
        None,
    );
    report.metric(
        "7-memory",
        "bytes per stored Llama",
        per_llama,
        "B",
        "≤ 1024",
        Some(per_llama <= 1024.0),
    );
    let (pods, _) = start_server(
        args,
        pki,
        &["--no-sample-data", "--synthetic-pods", "10000"],
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pods_rss = procfs::rss_bytes(pods.pid()).unwrap_or(0) as f64;
    drop(pods);
    report.metric(
        "7-memory",
        "RSS with 10,000 FarmPods",
        pods_rss / 1048576.0,
        "MiB",
        "",
        None,
    );
    report.metric(
        "7-memory",
        "bytes per FarmPod",
        (pods_rss - idle_rss) / 10_000.0,
        "B",
        "",
        None,
    );
    Ok(())
}

pub(crate) async fn scenario_8(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    cluster::run(args, report).await?;
    Ok(())
}

pub(crate) async fn scenario_9(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!(
        "9. Soak: {} clients create/update/patch/get/list/delete their own Llamas for {} s, {} watchers",
        args.soak_clients, args.soak_seconds, args.soak_watchers
    );
    let (server, _) = start_server(args, pki, &["--no-sample-data"]).await?;
    let t = target(pki, server.addr)?;
    let soak = soak::run(
        &t,
        server.pid(),
        args.soak_seconds,
        args.soak_clients,
        args.soak_watchers,
    )
    .await?;
    println!(
        "  {} requests ({:.0}/s); RSS start {:.1} MiB, after warm-up {:.1}, peak {:.1}, end {:.1}",
        soak.requests,
        soak.requests as f64 / args.soak_seconds,
        soak.rss_start_mib,
        soak.rss_warm_mib,
        soak.rss_peak_mib,
        soak.rss_end_mib
    );
    let s = "9-soak";
    report.metric(
        s,
        "errors",
        soak.errors as f64,
        "",
        "0",
        Some(soak.errors == 0),
    );
    report.metric(
        s,
        "acknowledged writes not read back",
        soak.lost_writes as f64,
        "",
        "0",
        Some(soak.lost_writes == 0),
    );
    report.metric(
        s,
        "objects a watcher ended on a different state",
        soak.watcher_mismatches as f64,
        "",
        "0",
        Some(soak.watcher_mismatches == 0),
    );
    let growth = soak.rss_end_mib / soak.rss_warm_mib - 1.0;
    report.metric(
        s,
        "RSS growth after warm-up",
        growth * 100.0,
        "%",
        "≤ 20",
        Some(growth <= 0.2),
    );
    report.soak = Some(soak);
    Ok(())
}

pub(crate) async fn scenario_10(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!(
        "10. Connection abuse: idle, slow-header, non-reading, PING-only and header-dribbling connections during normal load"
    );
    let (server, _) = start_server(
        args,
        pki,
        &[
            "--synthetic-pods",
            "20000",
            "--header-read-timeout",
            &abuse::HEADER_READ.to_string(),
            "--idle-timeout",
            &abuse::IDLE.to_string(),
            "--write-timeout",
            &abuse::WRITE.to_string(),
        ],
    )
    .await?;
    let t = target(pki, server.addr)?;
    let list = "/apis/farm.example.com/v1/farmpods".to_owned();
    let list_bytes = t
        .connect(Proto::H2)
        .await?
        .get(&list, &[])
        .await?
        .body
        .len();
    let path = "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly";
    let fds = || std::fs::read_dir(format!("/proc/{}/fd", server.pid())).map_or(0, |d| d.count());
    let fds_before = fds();
    let quiet = measure(args, &t, server.pid(), Proto::H2, 16, path, &[]).await?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let abusers = tokio::spawn(abuse::run(
        t.clone(),
        abuse::Counts {
            idle: 200,
            slow_headers: 50,
            not_reading: 20,
            ping_keepalive: 50,
            header_dribble: 50,
        },
        list,
        list_bytes,
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let abused = measure(args, &t, server.pid(), Proto::H2, 16, path, &[]).await?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let fared = abusers.await?;
    tokio::time::sleep(Duration::from_secs(abuse::HEADER_READ + 1)).await;
    let fds_after = fds();
    println!(
        "  GET, 16 h2 connections: quiet {:.0} req/s p99 {:.0}µs; under abuse {:.0} req/s p99 {:.0}µs",
        quiet.rps, quiet.p99_us, abused.rps, abused.p99_us
    );
    println!(
        "  abusive connections: {} idle, {} slow headers, {} not reading ({} B list), {} PING-only, {} dribbling a header block; server fds {} before, {} after",
        fared.idle,
        fared.slow_headers,
        fared.not_reading,
        list_bytes,
        fared.ping_keepalive,
        fared.header_dribble,
        fds_before,
        fds_after
    );
    let s = "10-abuse";
    let total = fared.idle
        + fared.slow_headers
        + fared.not_reading
        + fared.ping_keepalive
        + fared.header_dribble;
    report.metric(
        s,
        "abusive connections closed by their timeout",
        fared.closed_in_time as f64 / total.max(1) as f64 * 100.0,
        "%",
        "100",
        Some(fared.closed_in_time == total && total > 0),
    );
    report.metric(
        s,
        "GET req/s under abuse / quiet",
        abused.rps / quiet.rps,
        "×",
        "≥ 0.8",
        Some(abused.rps >= 0.8 * quiet.rps),
    );
    report.metric(
        s,
        "GET p99 under abuse",
        abused.p99_us / 1000.0,
        "ms",
        "≤ 2",
        Some(abused.p99_us <= 2000.0),
    );
    report.metric(
        s,
        "server file descriptors left after the abuse",
        fds_after.saturating_sub(fds_before) as f64,
        "",
        "≤ 4",
        Some(fds_after <= fds_before + 4),
    );
    report.abuse = Some(fared);
    Ok(())
}
