//! Watches: fan-out, ten thousand watchers, watchers that stop reading.

use super::*;

pub(crate) async fn scenario_4(b: &mut Bench, shared: &Shared) -> Result<()> {
    let report = &mut b.report;
    let server_t = &shared.server_t;
    let server = &shared.server;
    println!("4. Watch fan-out: 1,000 watchers, 20 writes/s for 5 s");
    let p99 = fanout::run(
        server_t,
        server.pid(),
        fanout::Shape {
            h2_connections: 20,
            streams: 50,
            h1_connections: 0,
        },
        "fanout",
    )
    .await?
    .p99_ms;
    report.metric(
        "4-watch",
        "write ack → event p99",
        p99,
        "ms",
        "≤ 50",
        Some(p99 <= 50.0),
    );
    Ok(())
}

pub(crate) async fn scenario_17(b: &mut Bench, shared: &Shared) -> Result<()> {
    let report = &mut b.report;
    let server_t = &shared.server_t;
    let server = &shared.server;
    println!(
        "17. 10,000 watchers: 5,000 HTTP/2 streams (20 connections × 250) and 5,000 HTTP/1.1 connections, 20 writes/s for 5 s"
    );
    let shape = fanout::Shape {
        h2_connections: 20,
        streams: 250,
        h1_connections: 5000,
    };
    let run = fanout::run(server_t, server.pid(), shape, "fanout-10k").await?;
    println!(
        "  opened in {:.1} s; write ack → event p50 {:.1} ms, max {:.1} ms; CPU busy while writing: server {:.2}, load generator {:.2} (cores)",
        run.open_seconds, run.p50_ms, run.max_ms, run.server_busy, run.client_busy
    );
    report.metric(
        "17-watchers",
        "write ack → event p99",
        run.p99_ms,
        "ms",
        "≤ 100",
        Some(run.p99_ms <= 100.0),
    );
    for (name, kib) in [
        ("HTTP/2 stream", run.h2_kib_per_watcher),
        ("HTTP/1.1 connection", run.h1_kib_per_watcher),
    ] {
        let kib = kib.unwrap_or(f64::NAN);
        report.metric(
            "17-watchers",
            &format!("server RSS per idle watcher ({name})"),
            kib,
            "KiB",
            "≤ 8",
            Some(kib <= 8.0),
        );
    }
    Ok(())
}

pub(crate) async fn scenario_16(b: &mut Bench, shared: &Shared) -> Result<()> {
    let report = &mut b.report;
    let server_t = &shared.server_t;
    let server = &shared.server;
    println!(
        "16. Watchers that stop reading (HTTP/1.1; an HTTP/2 stream beside a reading one) while a Llama takes 3,000 merge patches of 100 KB; against 500 with none"
    );
    let run = slow_watch::run(server_t, server.pid(), 500, 3000).await?;
    let (b, w) = (&run.baseline, &run.stuck);
    println!(
        "  without / with stuck watchers, ms p50 p99: write {:.2} {:.2} / {:.2} {:.2}; GET {:.2} {:.2} / {:.2} {:.2}; write→event {:.2} {:.2} / {:.2} {:.2}",
        b.write_p50,
        b.write_p99,
        w.write_p50,
        w.write_p99,
        b.get_p50,
        b.get_p99,
        w.get_p50,
        w.get_p99,
        b.event_p50,
        b.event_p99,
        w.event_p50,
        w.event_p99
    );
    println!(
        "  the stuck watchers, reading at last, got {:?} (HTTP/1.1) and {:?} (HTTP/2) of {} events before their end (None: no end within 30 s)",
        run.stuck_events.0, run.stuck_events.1, w.writes
    );
    report.metric(
        "16-slow-watch",
        "stuck watchers ended",
        run.ended as f64,
        "",
        "2",
        Some(run.ended == 2),
    );
    let growth = run.rss_peak_mib - run.rss_start_mib;
    report.metric(
        "16-slow-watch",
        "server RSS growth over the run (peak sampled every 20 ms)",
        growth,
        "MiB",
        "≤ 128",
        Some(growth <= 128.0),
    );
    for (name, before, after) in [
        ("write p99", b.write_p99, w.write_p99),
        ("GET p99", b.get_p99, w.get_p99),
        ("write→event p99", b.event_p99, w.event_p99),
    ] {
        let ratio = after / before;
        report.metric(
            "16-slow-watch",
            &format!("{name} with stuck watchers vs without"),
            ratio,
            "×",
            "≤ 1.25",
            Some(ratio <= 1.25),
        );
    }
    report.slow_watch = Some(run);
    Ok(())
}
