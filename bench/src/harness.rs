//! Starting farm-apiserver and the ceiling, loading them, and measuring the two side by side:
//! the server's CPU time from /proc, medians over rounds, ratios at equal bytes.

use super::*;

pub(crate) struct Proc {
    pub(crate) child: Child,
    pub(crate) addr: SocketAddr,
}

impl Proc {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Certificates and identities shared by every process of a run.
pub(crate) struct Pki {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) server_ca: String,
    pub(crate) proxy: (String, String),
    pub(crate) kubeconfig: PathBuf,
}

impl Pki {
    pub(crate) fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }
}

pub(crate) async fn setup_pki(fake_addr: SocketAddr) -> Result<Pki> {
    let dir = tempfile::tempdir()?;
    // The server's dev certs, made up front so the server reuses them and the ceiling shares them.
    let server_ca = tls::ensure_dev_certificates(
        &dir.path().join("server"),
        "https://127.0.0.1:1",
        &farm_apiserver::certs::DEV,
    )?;
    let proxy_ca = DevCa::load_or_create(&dir.path().join("proxy"))?;
    let proxy = proxy_ca.issue_client("front-proxy-client", &[])?;
    let kubeconfig = dir.path().join("fake.kubeconfig");
    std::fs::write(&kubeconfig, fake::kubeconfig(fake_addr))?;
    Ok(Pki {
        dir,
        server_ca,
        proxy,
        kubeconfig,
    })
}

/// Identity headers the front proxy sends: a user outside system:masters, so every request is
/// authorized (by SubjectAccessReview, then from the cache).
pub(crate) fn proxy_headers() -> Vec<(String, String)> {
    vec![
        ("X-Remote-User".into(), "bench-user".into()),
        ("X-Remote-Group".into(), "bench-group".into()),
        ("X-Remote-Group".into(), "system:authenticated".into()),
    ]
}

pub(crate) fn target(pki: &Pki, addr: SocketAddr) -> Result<Target> {
    Target::new(addr, &pki.server_ca, &pki.proxy, proxy_headers())
}

/// How many of symbol.order's functions `server` defines, and how many it lists.
pub(crate) fn symbol_order_coverage(server: &std::path::Path) -> Result<(usize, usize)> {
    let order = std::fs::read_to_string("symbol.order").context("reading symbol.order")?;
    let listed: Vec<&str> = order
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let nm = Command::new("nm")
        .arg("--defined-only")
        .arg(server)
        .output()
        .context("running nm (binutils)")?;
    anyhow::ensure!(nm.status.success(), "nm {} failed", server.display());
    let text = String::from_utf8_lossy(&nm.stdout);
    let defined: std::collections::HashSet<&str> =
        text.lines().filter_map(|l| l.rsplit(' ').next()).collect();
    let found = listed.iter().filter(|s| defined.contains(*s)).count();
    Ok((found, listed.len()))
}

/// Starts farm-apiserver; returns it and the time until /readyz answered 200.
pub(crate) async fn start_server(
    args: &RunArgs,
    pki: &Pki,
    extra: &[&str],
) -> Result<(Proc, Duration)> {
    start_server_with(args, pki, extra, false).await
}

/// [`start_server`]; with `cluster_pods`, FarmPods are the fake cluster's Pods (else synthetic,
/// none unless `extra` asks for some).
pub(crate) async fn start_server_with(
    args: &RunArgs,
    pki: &Pki,
    extra: &[&str],
    cluster_pods: bool,
) -> Result<(Proc, Duration)> {
    let port = free_port()?;
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse()?;
    let mut command = Command::new(&args.server);
    if !args.server_cpus.is_empty() {
        affinity::pin_command(&mut command, &args.server_cpus)?;
    }
    let started = Instant::now();
    let child = command
        .arg("--bind")
        .arg(addr.to_string())
        .arg("--cert-dir")
        .arg(pki.cert_dir())
        .arg("--requestheader-client-ca-file")
        .arg(pki.dir.path().join("proxy").join("ca.crt"))
        .args(["--requestheader-allowed-names", "front-proxy-client"])
        .arg("--kubeconfig")
        .arg(&pki.kubeconfig)
        .args(["--log-level", "warn"])
        .args(extra)
        .args(if cluster_pods || extra.contains(&"--synthetic-pods") {
            &[][..]
        } else {
            &["--synthetic-pods", "0"][..]
        })
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", args.server.display()))?;
    let proc = Proc { child, addr };
    let t = target(pki, addr)?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(mut conn) = t.connect(Proto::H1).await
            && let Ok(reply) = conn.get("/readyz", &[]).await
            && reply.status == 200
        {
            return Ok((proc, started.elapsed()));
        }
        if Instant::now() > deadline {
            bail!("farm-apiserver did not become ready");
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

pub(crate) fn start_ceiling(args: &RunArgs, pki: &Pki) -> Result<Proc> {
    use std::io::BufRead;
    let mut command = Command::new(std::env::current_exe()?);
    if !args.server_cpus.is_empty() {
        affinity::pin_command(&mut command, &args.server_cpus)?;
    }
    let mut child = command
        .arg("ceiling")
        .arg("--cert")
        .arg(pki.cert_dir().join(tls::TLS_CERT))
        .arg("--key")
        .arg(pki.cert_dir().join(tls::TLS_KEY))
        .arg("--client-ca")
        .arg(pki.dir.path().join("proxy").join("ca.crt"))
        .arg("--client-ca")
        .arg(pki.cert_dir().join(tls::CA_CERT))
        .stdout(Stdio::piped())
        .spawn()?;
    let stdout = child.stdout.take().context("ceiling stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    let port: u16 = line
        .trim()
        .strip_prefix("listening ")
        .context("ceiling did not start")?
        .parse()?;
    Ok(Proc {
        child,
        addr: format!("127.0.0.1:{port}").parse()?,
    })
}

// ---- measurement ----

#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct Stats {
    pub(crate) rps: f64,
    pub(crate) p50_us: f64,
    pub(crate) p99_us: f64,
    pub(crate) cpu_us_per_request: f64,
    /// The load generator's own CPU per request (this process), for context.
    pub(crate) client_cpu_us_per_request: f64,
    /// How busy the load generator's CPUs were (1.0 = all of them, all the time). Near 1 the
    /// generator, not the server, set the pace.
    pub(crate) load_generator_busy: f64,
    /// The share of the machine's CPU time stolen by the hypervisor during the run: the
    /// machine was that much smaller than it looked.
    pub(crate) steal: f64,
    /// The share of the machine's CPU time used by other processes than the measured ones and
    /// the load generator during the run (e.g. a build): they competed with the server.
    pub(crate) others: f64,
    pub(crate) bytes: usize,
    pub(crate) errors: u64,
}

pub(crate) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(crate) fn medians(runs: &[Stats]) -> Stats {
    let pick = |f: fn(&Stats) -> f64| median(&mut runs.iter().map(f).collect::<Vec<_>>());
    Stats {
        rps: pick(|s| s.rps),
        p50_us: pick(|s| s.p50_us),
        p99_us: pick(|s| s.p99_us),
        cpu_us_per_request: pick(|s| s.cpu_us_per_request),
        client_cpu_us_per_request: pick(|s| s.client_cpu_us_per_request),
        load_generator_busy: pick(|s| s.load_generator_busy),
        steal: pick(|s| s.steal),
        others: pick(|s| s.others),
        bytes: runs.iter().map(|s| s.bytes).max().unwrap_or(0),
        errors: runs.iter().map(|s| s.errors).sum(),
    }
}

/// CPU time over a measured window.
#[derive(Default)]
pub(crate) struct CpuUse {
    /// Each measured process's, in the order given.
    pub(crate) server_seconds: Vec<Option<f64>>,
    pub(crate) load_generator_seconds: Option<f64>,
    /// The share of the machine's CPU time the hypervisor gave to other guests.
    pub(crate) steal: Option<f64>,
    /// The share of the machine's CPU time other processes used.
    pub(crate) others: Option<f64>,
}

/// Samples the processes' (`pids`), this process's and the machine's CPU time at `start` and
/// `end`.
pub(crate) fn cpu_sampler(
    pids: Vec<u32>,
    start: Instant,
    end: Instant,
) -> std::thread::JoinHandle<CpuUse> {
    std::thread::spawn(move || {
        let me = std::process::id();
        let sample = || {
            (
                pids.iter()
                    .map(|&pid| procfs::cpu_seconds(pid))
                    .collect::<Vec<_>>(),
                procfs::cpu_seconds(me),
                procfs::machine_ticks(),
            )
        };
        std::thread::sleep(start.saturating_duration_since(Instant::now()));
        let before = sample();
        std::thread::sleep(end.saturating_duration_since(Instant::now()));
        let after = sample();
        let delta = |a: Option<f64>, b: Option<f64>| a.zip(b).map(|(a, b)| a - b);
        let server_seconds: Vec<Option<f64>> = after
            .0
            .iter()
            .zip(&before.0)
            .map(|(a, b)| delta(*a, *b))
            .collect();
        let load_generator_seconds = delta(after.1, before.1);
        let machine = after
            .2
            .zip(before.2)
            .filter(|(a, b)| a.total > b.total)
            .map(|(a, b)| {
                (
                    (a.busy - b.busy) as f64 * procfs::SECONDS_PER_TICK,
                    (a.steal - b.steal) as f64,
                    (a.total - b.total) as f64,
                )
            });
        let measured: f64 =
            server_seconds.iter().flatten().sum::<f64>() + load_generator_seconds.unwrap_or(0.0);
        CpuUse {
            steal: machine.map(|(_, steal, total)| steal / total),
            others: machine.map(|(busy, _, total)| {
                ((busy - measured) / (total * procfs::SECONDS_PER_TICK)).max(0.0)
            }),
            server_seconds,
            load_generator_seconds,
        }
    })
}

/// One closed-loop run against `proc`, with its CPU time over exactly the measured window.
pub(crate) async fn measure(
    args: &RunArgs,
    t: &Target,
    pid: u32,
    proto: Proto,
    connections: usize,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<Stats> {
    Ok(
        measure_processes(args, t, &[pid], proto, connections, path, extra)
            .await?
            .0,
    )
}

/// One closed-loop run against `t`, with the CPU time of the processes `pids` serving it over
/// exactly the measured window: `cpu_us_per_request` is their sum, and each one's comes next
/// (µs per request, NaN when a process could not be read).
pub(crate) async fn measure_processes(
    args: &RunArgs,
    t: &Target,
    pids: &[u32],
    proto: Proto,
    connections: usize,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<(Stats, Vec<f64>)> {
    let measured = Duration::from_secs_f64(args.seconds);
    let window = move || {
        let start = Instant::now() + measured / 4;
        (start, start + measured)
    };
    let (load, sampler) = match args.load_generator {
        LoadGenerator::Hyper => {
            let mut conns = Vec::with_capacity(connections);
            for _ in 0..connections {
                conns.push(t.connect(proto).await?);
            }
            let (start, end) = window();
            let sampler = cpu_sampler(pids.to_vec(), start, end);
            (
                client::closed_loop(conns, path, extra, start, end).await?,
                Some(sampler),
            )
        }
        LoadGenerator::Raw => {
            let request = load::Request {
                path: path.to_owned(),
                headers: extra
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            };
            let (t, threads, pids) = (t.clone(), client_threads(args), pids.to_vec());
            tokio::task::spawn_blocking(move || {
                let mut sampler = None;
                let load = load::closed_loop(&t, proto, connections, threads, &request, || {
                    let (start, end) = window();
                    sampler = Some(cpu_sampler(pids, start, end));
                    (start, end)
                })?;
                Ok::<_, anyhow::Error>((load, sampler))
            })
            .await??
        }
    };
    let CpuUse {
        server_seconds: cpu,
        load_generator_seconds: client_cpu,
        steal,
        others,
    } = sampler.and_then(|s| s.join().ok()).unwrap_or_default();
    let load_cpus = if args.load_cpus.is_empty() {
        online_cpus()
    } else {
        args.load_cpus.len()
    };
    let per_request =
        |seconds: Option<f64>| seconds.unwrap_or(f64::NAN) * 1e6 / load.requests.max(1) as f64;
    let each: Vec<f64> = (0..pids.len())
        .map(|i| per_request(cpu.get(i).copied().flatten()))
        .collect();
    let stats = Stats {
        steal: steal.unwrap_or(f64::NAN),
        others: others.unwrap_or(f64::NAN),
        load_generator_busy: client_cpu.unwrap_or(f64::NAN) / load.seconds / load_cpus as f64,
        rps: load.rps(),
        p50_us: load.percentile_us(50.0),
        p99_us: load.percentile_us(99.0),
        cpu_us_per_request: each.iter().sum(),
        client_cpu_us_per_request: per_request(client_cpu),
        bytes: load.response_bytes,
        errors: load.errors,
    };
    Ok((stats, each))
}

/// The request the ceiling gets: the server's own (same path, query and headers, so both parse
/// and decrypt the same bytes) with the reply size it should answer with added to the query.
pub(crate) fn ceiling_path(path: &str, bytes: usize) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}size={bytes}")
}

/// Alternates server and ceiling `rounds` times; the ceiling gets the same request and answers
/// with as many bytes as the server did.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn compare(
    args: &RunArgs,
    report: &mut Report,
    scenario: &str,
    variant: &str,
    server: (&Target, u32),
    ceiling: (&Target, u32),
    proto: Proto,
    connections: usize,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<Comparison> {
    let mut server_runs = Vec::new();
    let mut ceiling_runs = Vec::new();
    for _ in 0..args.rounds {
        let s = measure(args, server.0, server.1, proto, connections, path, extra).await?;
        let c = measure(
            args,
            ceiling.0,
            ceiling.1,
            proto,
            connections,
            &ceiling_path(path, s.bytes),
            extra,
        )
        .await?;
        server_runs.push(s);
        ceiling_runs.push(c);
    }
    let (s, c) = (medians(&server_runs), medians(&ceiling_runs));
    // Each round's server run is compared with the ceiling run right after it, so the ratio is
    // taken under the same machine conditions; the median of those ratios is reported.
    let round_ratio = |f: fn(&Stats) -> f64| {
        let mut ratios: Vec<f64> = server_runs
            .iter()
            .zip(&ceiling_runs)
            .map(|(s, c)| f(s) / f(c))
            .collect();
        median(&mut ratios)
    };
    let comparison = Comparison {
        scenario: scenario.into(),
        variant: variant.into(),
        server: s,
        ceiling: c,
        rps_ratio: round_ratio(|s| s.rps),
        cpu_ratio: round_ratio(|s| s.cpu_us_per_request),
    };
    println!(
        "  {variant:<34} server {:>9.0} req/s p50 {:>6.0}µs p99 {:>6.0}µs cpu {:>6.1}µs/req {:>7}B | ceiling {:>9.0} req/s p99 {:>6.0}µs cpu {:>6.1}µs/req | ratio rps {:.2} cpu {:.2} | load generator {:.1}µs/req{}",
        s.rps,
        s.p50_us,
        s.p99_us,
        s.cpu_us_per_request,
        s.bytes,
        c.rps,
        c.p99_us,
        c.cpu_us_per_request,
        comparison.rps_ratio,
        comparison.cpu_ratio,
        s.client_cpu_us_per_request,
        if s.errors > 0 {
            format!(" ({} errors)", s.errors)
        } else {
            String::new()
        }
    );
    for (name, stats) in [("server", &s), ("ceiling", &c)] {
        if stats.steal > 0.05 {
            println!(
                "    note: the hypervisor stole {:.0}% of the CPU time during the {name} runs: absolute figures are low, ratios less affected",
                stats.steal * 100.0
            );
        }
        if stats.load_generator_busy > 0.9 {
            println!(
                "    note: the load generator was {:.0}% busy during the {name} runs: it may have set the pace",
                stats.load_generator_busy * 100.0
            );
        }
        if stats.others > 0.1 {
            println!(
                "    note: other processes used {:.0}% of the machine's CPU time during the {name} runs",
                stats.others * 100.0
            );
        }
    }
    report.comparisons.push(comparison.clone());
    Ok(comparison)
}
