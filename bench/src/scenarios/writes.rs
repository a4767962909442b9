//! Writes: etcd beside memory, server-side apply beside a merge patch, an admission policy, a large object patched again and again.

use super::*;

pub(crate) async fn scenario_11(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!(
        "11. Llamas on etcd (--storage etcd) beside memory: reads from the watch cache, writes per second"
    );
    let etcd = etcd::Etcd::start(free_port()?, free_port()?).await?;
    let (on_etcd, _) = start_server(
        args,
        pki,
        &["--storage", "etcd", "--etcd-servers", &etcd.endpoint],
    )
    .await?;
    let on_etcd_t = target(pki, on_etcd.addr)?;
    let (in_memory, _) = start_server(args, pki, &[]).await?;
    let in_memory_t = target(pki, in_memory.addr)?;
    // The same Llamas in both: dolly (the memory store's sample), and a herd of 1,000.
    let dolly = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "dolly"}, "spec": {"weight": 31.4, "height": 0.5}});
    post_llama(&mut on_etcd_t.connect(Proto::H2).await?, "default", &dolly).await?;
    create_llamas(&on_etcd_t, "etcd-herd", 1000).await?;
    create_llamas(&in_memory_t, "etcd-herd", 1000).await?;
    let reads = [
        (
            "GET llama h2",
            64,
            "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly",
            "application/json",
        ),
        (
            "LIST 1000 llamas JSON",
            16,
            "/apis/farm.example.com/v1alpha/namespaces/etcd-herd/llamas",
            "application/json",
        ),
    ];
    for (variant, connections, path, accept) in reads {
        let (mut etcd_runs, mut memory_runs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut etcd_cpu = Vec::new();
        for _ in 0..args.rounds {
            // The server's CPU and etcd's, each per request: etcd's is the checks' cost.
            let (on_etcd, each) = measure_processes(
                args,
                &on_etcd_t,
                &[on_etcd.pid(), etcd.pid()],
                Proto::H2,
                connections,
                path,
                &[("accept", accept)],
            )
            .await?;
            etcd_cpu.push(each.get(1).copied().unwrap_or(f64::NAN));
            let in_memory = measure(
                args,
                &in_memory_t,
                in_memory.pid(),
                Proto::H2,
                connections,
                path,
                &[("accept", accept)],
            )
            .await?;
            ratios.push(on_etcd.rps / in_memory.rps);
            etcd_runs.push(on_etcd);
            memory_runs.push(in_memory);
        }
        let (e, m) = (medians(&etcd_runs), medians(&memory_runs));
        let ratio = median(&mut ratios);
        println!(
            "  {variant:<34} etcd {:>9.0} req/s p99 {:>6.0}µs cpu {:>6.1}µs/req (etcd's {:>5.1}) | memory {:>9.0} req/s p99 {:>6.0}µs cpu {:>6.1}µs/req | ratio rps {ratio:.2}{}",
            e.rps,
            e.p99_us,
            e.cpu_us_per_request,
            median(&mut etcd_cpu),
            m.rps,
            m.p99_us,
            m.cpu_us_per_request,
            if e.errors + m.errors > 0 {
                format!(" ({} errors)", e.errors + m.errors)
            } else {
                String::new()
            }
        );
        report.metric(
            "11-etcd",
            &format!("{variant} rps ratio"),
            ratio,
            "×memory",
            "≥ 0.7",
            Some(ratio >= 0.7),
        );
    }
    for (variant, write) in [
        ("creates", etcd::Write::Create),
        ("updates (merge patch)", etcd::Write::MergePatch),
    ] {
        let on_etcd = etcd::writes(&on_etcd_t, "etcd-writes", 16, args.seconds, write).await?;
        let in_memory = etcd::writes(&in_memory_t, "etcd-writes", 16, args.seconds, write).await?;
        println!(
            "  {variant:<34} etcd {:>9.0}/s ({} refused) | memory {:>9.0}/s ({} refused), 16 clients",
            on_etcd.rate, on_etcd.errors, in_memory.rate, in_memory.errors
        );
        report.metric(
            "11-etcd",
            &format!("{variant} per second on etcd"),
            on_etcd.rate,
            "/s",
            "reported",
            None,
        );
        report.metric(
            "11-etcd",
            &format!("{variant} per second in memory"),
            in_memory.rate,
            "/s",
            "reported",
            None,
        );
    }
    drop(on_etcd);
    drop(in_memory);
    drop(etcd);
    Ok(())
}

pub(crate) async fn scenario_12(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!(
        "12. Server-side apply beside a merge patch of the same Llama (memory, 16 clients): server CPU per write"
    );
    let (server, _) = start_server(args, pki, &[]).await?;
    let t = target(pki, server.addr)?;
    let mut runs = Vec::new();
    for (namespace, write) in [
        ("bench-merge", etcd::Write::MergePatch),
        ("bench-apply", etcd::Write::Apply),
    ] {
        let mut rounds = Vec::new();
        for round in 0..args.rounds {
            let before = procfs::cpu_seconds(server.pid()).unwrap_or(f64::NAN);
            let started = Instant::now();
            let done =
                etcd::writes(&t, &format!("{namespace}-{round}"), 16, args.seconds, write).await?;
            let cpu = procfs::cpu_seconds(server.pid()).unwrap_or(f64::NAN) - before;
            let writes = done.rate * started.elapsed().as_secs_f64();
            rounds.push((done.rate, cpu * 1e6 / writes.max(1.0), done.errors));
        }
        rounds.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (rate, cpu, errors) = rounds[rounds.len() / 2];
        println!(
            "  {:<34} {rate:>9.0}/s  server cpu {cpu:>6.1}µs/write ({errors} refused)",
            format!("{write:?}")
        );
        runs.push(cpu);
    }
    let ratio = runs[1] / runs[0];
    report.metric(
        "12-apply",
        "apply CPU per write ÷ merge patch's",
        ratio,
        "×",
        "≤ 3",
        Some(ratio <= 3.0),
    );
    Ok(())
}

pub(crate) async fn scenario_14(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    let fake = &b.fake;
    println!(
        "14. One ValidatingAdmissionPolicy on every Llama create, beside a server with none (memory, 16 clients): server CPU per create"
    );
    let (without, _) = start_server(args, pki, &[]).await?;
    fake.set_admission(vec![
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": "max-weight", "resourceVersion": "1"},
            "spec": {"failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                    "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
                "validations": [{"expression": "object.spec.weight <= 1000.0",
                    "message": "a llama weighs at most 1000 kg"}]}}),
        json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": "max-weight", "resourceVersion": "1"},
            "spec": {"policyName": "max-weight", "validationActions": ["Deny"]}}),
    ]);
    let (with, _) = start_server(args, pki, &[]).await?;
    fake.set_admission(Vec::new());
    let targets = [target(pki, without.addr)?, target(pki, with.addr)?];
    let pids = [without.pid(), with.pid()];
    let mut cpu: [Vec<f64>; 2] = Default::default();
    let mut errors = 0;
    for round in 0..args.rounds {
        for (index, t) in targets.iter().enumerate() {
            let before = procfs::cpu_seconds(pids[index]).unwrap_or(f64::NAN);
            let started = Instant::now();
            let namespace = format!("bench-vap-{index}-{round}");
            let done = etcd::writes(t, &namespace, 16, args.seconds, etcd::Write::Create).await?;
            let used = procfs::cpu_seconds(pids[index]).unwrap_or(f64::NAN) - before;
            let writes = done.rate * started.elapsed().as_secs_f64();
            cpu[index].push(used * 1e6 / writes.max(1.0));
            errors += done.errors;
        }
    }
    let (none, one) = (median(&mut cpu[0]), median(&mut cpu[1]));
    let ratio = one / none;
    println!(
        "  no policy {none:>6.1}µs/create | one policy {one:>6.1}µs/create | ratio {ratio:.2} ({errors} refused)"
    );
    report.metric(
        "14-policy",
        "create CPU with one ValidatingAdmissionPolicy ÷ with none",
        ratio,
        "×",
        "≤ 1.3",
        Some(ratio <= 1.3 && errors == 0),
    );
    Ok(())
}

pub(crate) async fn scenario_13(b: &mut Bench) -> Result<()> {
    let args = &b.args;
    let report = &mut b.report;
    let pki = &b.pki;
    println!(
        "13. Large-object soak: one 1 MB Llama (12,500 finalizers, listed again in its managedFields) patched with one label {LARGE_PATCHES} times; RSS"
    );
    let (server, _) = start_server(args, pki, &[]).await?;
    let t = target(pki, server.addr)?;
    let rss = || procfs::rss_bytes(server.pid()).unwrap_or(0) as f64 / 1048576.0;
    let (start, warm, peak, end) = large_object_soak(&t, rss).await?;
    println!(
        "  RSS {start:.0} MiB at start, {warm:.0} MiB after {LARGE_WARMUP} patches, peak {peak:.0} MiB, {end:.0} MiB at the end"
    );
    report.metric(
        "13-large-object",
        "RSS at the end ÷ after warm-up",
        end / warm,
        "×",
        "≤ 1.2",
        Some(end <= warm * 1.2),
    );
    report.metric(
        "13-large-object",
        "peak RSS",
        peak,
        "MiB",
        "≤ 400",
        Some(peak <= 400.0),
    );
    Ok(())
}

/// Scenario 13's patches, and how many of them warm the server up.
const LARGE_PATCHES: usize = 600;
const LARGE_WARMUP: usize = 100;

/// Creates a Llama of about 1 MB and patches one label of it [`LARGE_PATCHES`] times; RSS
/// (MiB) at the start, after [`LARGE_WARMUP`] patches, at its peak and at the end.
async fn large_object_soak(t: &Target, rss: impl Fn() -> f64) -> Result<(f64, f64, f64, f64)> {
    let llamas = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";
    let finalizers: Vec<String> = (0..12_500)
        .map(|i| format!("farm.example.com/hold-{i:0>57}"))
        .collect();
    let body = serde_json::json!({
        "apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "large", "finalizers": finalizers},
        "spec": {"weight": 1, "height": 1},
    });
    let mut conn = t.connect(Proto::H2).await?;
    let json = [("content-type", "application/json")];
    let created = conn
        .send("POST", llamas, &json, Bytes::from(body.to_string()))
        .await?;
    anyhow::ensure!(created.status == 201, "create: {}", created.status);
    let start = rss();
    let (mut warm, mut peak) = (start, start);
    let merge = [("content-type", "application/merge-patch+json")];
    for i in 0..LARGE_PATCHES {
        let patch = serde_json::json!({"metadata": {"labels": {"n": i.to_string()}}});
        let reply = conn
            .send(
                "PATCH",
                &format!("{llamas}/large"),
                &merge,
                Bytes::from(patch.to_string()),
            )
            .await?;
        anyhow::ensure!(reply.status == 200, "patch {i}: {}", reply.status);
        if i % 50 == 0 {
            peak = peak.max(rss());
        }
        if i == LARGE_WARMUP {
            warm = rss();
        }
    }
    let end = rss();
    Ok((start, warm, peak.max(end), end))
}
