//! farm-apiserver's benchmark: every figure next to a ceiling measured in the same run,
//! interleaved round by round, as a ratio; server CPU time per request from /proc/<pid>/stat.
//!
//! `bench/run` builds both binaries with the `dist` profile (release + fat LTO) and runs `farm-bench run`.
//! Given a cluster (`--cluster <kubeconfig>`), scenario 8 compares the aggregated Llama with the
//! same Llama as a CustomResourceDefinition, both through that cluster's kube-apiserver.

mod abuse;
mod affinity;
mod at_scale;
mod ceiling;
mod client;
mod cluster;
mod etcd;
mod fake;
mod fanout;
mod load;
mod pods;
mod procfs;
mod slow_watch;
mod soak;

// The same allocator as farm-apiserver, so the ceiling is not handicapped by glibc malloc.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aggregated_apiserver::tls::{self, DevCa};
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use client::{Conn, Proto, Target, percentile};
use serde::Serialize;
use serde_json::json;

#[derive(Parser)]
#[command(name = "farm-bench", about = "farm-apiserver's benchmark harness")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the scenarios and print (and write) the results.
    Run(Box<RunArgs>),
    /// Serve the ceiling (used by `run`).
    Ceiling {
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        /// Client CA PEM files, as farm-apiserver trusts them.
        #[arg(long)]
        client_ca: Vec<PathBuf>,
    },
    /// Serve the fake kube-apiserver `run` uses (SubjectAccessReviews always allowed) and write
    /// a kubeconfig for it, so other tools (bench/callgrind) take the same authorization path.
    FakeCluster {
        #[arg(long)]
        kubeconfig: PathBuf,
        /// A JSON array of admission configurations (ValidatingAdmissionPolicies, bindings...)
        /// to list, as scenario 14 does.
        #[arg(long)]
        admission: Option<PathBuf>,
        /// Pods to list, shaped as kubelets leave them (as scenario 18 lists them).
        #[arg(long, default_value_t = 0)]
        pods: usize,
    },
}

#[derive(Parser, Clone)]
struct RunArgs {
    /// The farm-apiserver binary.
    #[arg(
        long,
        env = "FARM_BENCH_SERVER",
        default_value = "target/dist/farm-apiserver"
    )]
    server: PathBuf,
    /// Rounds per comparison (server and ceiling alternate; medians of the figures and of the
    /// per-round ratios are reported).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// Measured seconds per run (after a warmup of a quarter of it).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
    /// Where the JSON results go.
    #[arg(long, default_value = "target/bench/results.json")]
    output: PathBuf,
    /// Only these scenarios (1-15); default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<u32>,
    /// The closed-loop load generator: `raw` (wrk-like: one single-threaded runtime per thread,
    /// precomputed HTTP/1.1 requests, HTTP/2 framed by hand; it needs less CPU per request than
    /// the servers it measures, so on its own cores they, not it, set the pace) or `hyper`
    /// (hyper's client on the multi-threaded runtime, one task per connection; about twice
    /// the CPU per request, so on one core it saturates first on HTTP/2).
    #[arg(long, value_enum, default_value_t = LoadGenerator::Raw)]
    load_generator: LoadGenerator,
    /// Threads of the `raw` load generator (like wrk's -t); default: one per CPU it may use.
    #[arg(long)]
    client_threads: Option<usize>,
    /// CPUs farm-apiserver and the ceiling run on (e.g. `0`). Default: the first half of the
    /// CPUs this process may use, the load generator the rest, so neither time-slices the other.
    #[arg(long, value_delimiter = ',')]
    server_cpus: Vec<usize>,
    /// CPUs the load generator (this process) runs on (e.g. `1`). Default: what the servers
    /// were not given.
    #[arg(long, value_delimiter = ',')]
    load_cpus: Vec<usize>,
    /// Pin nothing: servers and load generator share every CPU (and time-slice each other).
    #[arg(long, conflicts_with_all = ["server_cpus", "load_cpus"])]
    shared_cpus: bool,
    /// Llamas for the large pagination run.
    #[arg(long, default_value_t = 1_000_000)]
    pagination_large: usize,
    /// Protocols of scenarios 1 and 6 (e.g. `h2` alone while profiling it).
    #[arg(long, value_delimiter = ',', default_values = ["h1", "h2"])]
    protocols: Vec<Proto>,
    /// The kubeconfig of a cluster whose kube-apiserver can reach this host (e.g. the lab's
    /// ~/.k8s-lab/kubeconfig; its user authenticates with a client certificate and may install
    /// an APIService and a CRD). Scenario 8 runs through it; without one it is skipped. The
    /// cluster is changed while it runs: serialize with other users of farm.example.com on it.
    #[arg(
        long = "cluster",
        env = "FARM_BENCH_KUBECONFIG",
        value_name = "KUBECONFIG"
    )]
    cluster: Option<PathBuf>,
    /// Where scenario 8's farm-apiserver keeps Llamas: `memory`, or `etcd` (an etcd of its own
    /// on loopback; etcd on PATH or FARM_ETCD_BIN).
    #[arg(long, default_value = "memory", value_parser = ["memory", "etcd"])]
    cluster_storage: String,
    /// Seconds of scenario 9's soak.
    #[arg(long, default_value_t = 30.0)]
    soak_seconds: f64,
    /// Pods of scenario 18 (Kubernetes' published limit: 150,000 per cluster).
    #[arg(long, default_value_t = 150_000)]
    scale_pods: usize,
    /// Clients of the soak, each writing and reading Llamas of its own.
    #[arg(long, default_value_t = 8)]
    soak_clients: usize,
    /// Watchers of the soak's namespace.
    #[arg(long, default_value_t = 4)]
    soak_watchers: usize,
    /// The manifests scenario 8 installs (rendered with `kubectl kustomize` after
    /// `farm-apiserver certs` writes their certs/).
    #[arg(long, default_value = "manifests")]
    manifests: PathBuf,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LoadGenerator {
    Hyper,
    Raw,
}

// ---- processes ----

struct Proc {
    child: Child,
    addr: SocketAddr,
}

impl Proc {
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Certificates and identities shared by every process of a run.
struct Pki {
    dir: tempfile::TempDir,
    server_ca: String,
    proxy: (String, String),
    kubeconfig: PathBuf,
}

impl Pki {
    fn cert_dir(&self) -> PathBuf {
        self.dir.path().join("server")
    }
}

async fn setup_pki(fake_addr: SocketAddr) -> Result<Pki> {
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
fn proxy_headers() -> Vec<(String, String)> {
    vec![
        ("X-Remote-User".into(), "bench-user".into()),
        ("X-Remote-Group".into(), "bench-group".into()),
        ("X-Remote-Group".into(), "system:authenticated".into()),
    ]
}

fn target(pki: &Pki, addr: SocketAddr) -> Result<Target> {
    Target::new(addr, &pki.server_ca, &pki.proxy, proxy_headers())
}

/// How many of symbol.order's functions `server` defines, and how many it lists.
fn symbol_order_coverage(server: &std::path::Path) -> Result<(usize, usize)> {
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
async fn start_server(args: &RunArgs, pki: &Pki, extra: &[&str]) -> Result<(Proc, Duration)> {
    start_server_with(args, pki, extra, false).await
}

/// [`start_server`]; with `cluster_pods`, FarmPods are the fake cluster's Pods (else synthetic,
/// none unless `extra` asks for some).
async fn start_server_with(
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

fn start_ceiling(args: &RunArgs, pki: &Pki) -> Result<Proc> {
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
struct Stats {
    rps: f64,
    p50_us: f64,
    p99_us: f64,
    cpu_us_per_request: f64,
    /// The load generator's own CPU per request (this process), for context.
    client_cpu_us_per_request: f64,
    /// How busy the load generator's CPUs were (1.0 = all of them, all the time). Near 1 the
    /// generator, not the server, set the pace.
    load_generator_busy: f64,
    /// The share of the machine's CPU time stolen by the hypervisor during the run: the
    /// machine was that much smaller than it looked.
    steal: f64,
    /// The share of the machine's CPU time used by other processes than the measured ones and
    /// the load generator during the run (e.g. a build): they competed with the server.
    others: f64,
    bytes: usize,
    errors: u64,
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
}

fn medians(runs: &[Stats]) -> Stats {
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
struct CpuUse {
    /// Each measured process's, in the order given.
    server_seconds: Vec<Option<f64>>,
    load_generator_seconds: Option<f64>,
    /// The share of the machine's CPU time the hypervisor gave to other guests.
    steal: Option<f64>,
    /// The share of the machine's CPU time other processes used.
    others: Option<f64>,
}

/// Samples the processes' (`pids`), this process's and the machine's CPU time at `start` and
/// `end`.
fn cpu_sampler(pids: Vec<u32>, start: Instant, end: Instant) -> std::thread::JoinHandle<CpuUse> {
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
async fn measure(
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
async fn measure_processes(
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

#[derive(Debug, Clone, Serialize)]
struct Comparison {
    scenario: String,
    variant: String,
    server: Stats,
    ceiling: Stats,
    rps_ratio: f64,
    cpu_ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
struct Metric {
    scenario: String,
    name: String,
    value: f64,
    unit: String,
    target: String,
    met: Option<bool>,
}

/// How the figures were taken.
#[derive(Default, Serialize)]
struct Setup {
    cpus: usize,
    /// Empty: not pinned (shared with the load generator).
    server_cpus: Vec<usize>,
    load_cpus: Vec<usize>,
    load_generator: String,
    rounds: usize,
    seconds: f64,
}

#[derive(Default, Serialize)]
struct Report {
    setup: Setup,
    comparisons: Vec<Comparison>,
    metrics: Vec<Metric>,
    /// Scenario 8: the aggregated Llama vs a CRD's, through kube-apiserver.
    #[serde(skip_serializing_if = "Option::is_none")]
    through_kube_apiserver: Option<cluster::Summary>,
    /// Scenario 9: the soak.
    #[serde(skip_serializing_if = "Option::is_none")]
    soak: Option<soak::Soak>,
    /// Scenario 10: the abusive connections, and how they fared.
    #[serde(skip_serializing_if = "Option::is_none")]
    abuse: Option<abuse::Abusers>,
    /// Scenario 16: watchers that stop reading.
    #[serde(skip_serializing_if = "Option::is_none")]
    slow_watch: Option<slow_watch::SlowWatch>,
    /// Scenarios not run, and why.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    skipped: Vec<String>,
}

impl Report {
    fn metric(
        &mut self,
        scenario: &str,
        name: &str,
        value: f64,
        unit: &str,
        target: &str,
        met: Option<bool>,
    ) {
        let verdict = match met {
            Some(true) => ", met",
            Some(false) => ", MISSED",
            None => "",
        };
        if target.is_empty() {
            println!("  {name}: {value:.3} {unit}");
        } else {
            println!("  {name}: {value:.3} {unit}  (target {target}{verdict})");
        }
        self.metrics.push(Metric {
            scenario: scenario.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            target: target.into(),
            met,
        });
    }
}

/// The request the ceiling gets: the server's own (same path, query and headers, so both parse
/// and decrypt the same bytes) with the reply size it should answer with added to the query.
fn ceiling_path(path: &str, bytes: usize) -> String {
    let separator = if path.contains('?') { '&' } else { '?' };
    format!("{path}{separator}size={bytes}")
}

/// Alternates server and ceiling `rounds` times; the ceiling gets the same request and answers
/// with as many bytes as the server did.
#[allow(clippy::too_many_arguments)]
async fn compare(
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

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

fn wants(args: &RunArgs, n: u32) -> bool {
    args.only.is_empty() || args.only.contains(&n)
}

/// Creates a Llama as a client would; anything but 201 Created is an error.
async fn post_llama(conn: &mut Conn, namespace: &str, llama: &serde_json::Value) -> Result<()> {
    let reply = conn
        .send(
            "POST",
            &format!("/apis/farm.example.com/v1alpha/namespaces/{namespace}/llamas"),
            &[("content-type", "application/json")],
            Bytes::from(llama.to_string()),
        )
        .await?;
    anyhow::ensure!(
        reply.status == 201,
        "creating a Llama returned {}",
        reply.status
    );
    Ok(())
}

async fn create_llamas(t: &Target, namespace: &str, count: usize) -> Result<()> {
    let mut conns = Vec::new();
    for _ in 0..8 {
        conns.push(t.connect(Proto::H2).await?);
    }
    let mut tasks = Vec::new();
    for (c, mut conn) in conns.into_iter().enumerate() {
        let namespace = namespace.to_owned();
        tasks.push(tokio::spawn(async move {
            for i in (c..count).step_by(8) {
                let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
                    "metadata": {"name": format!("l-{i:05}"), "labels": {"herd": format!("h{}", i % 10)}},
                    "spec": {"weight": 10.0 + i as f64, "height": 1.5}});
                post_llama(&mut conn, &namespace, &llama).await?;
            }
            Ok::<_, anyhow::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn run(args: RunArgs) -> Result<()> {
    anyhow::ensure!(
        args.server.exists(),
        "{} not found: build it with `cargo build --profile dist` (bench/run does)",
        args.server.display()
    );
    let (fake_addr, fake) = fake::start().await?;
    let pki = setup_pki(fake_addr).await?;
    let mut report = Report {
        setup: Setup {
            cpus: online_cpus(),
            server_cpus: args.server_cpus.clone(),
            load_cpus: args.load_cpus.clone(),
            load_generator: match args.load_generator {
                LoadGenerator::Hyper => "hyper".to_owned(),
                LoadGenerator::Raw => format!("raw ({} threads)", client_threads(&args)),
            },
            rounds: args.rounds,
            seconds: args.seconds,
        },
        ..Default::default()
    };
    let setup = &report.setup;
    let cpu_list = |cpus: &[usize]| {
        if cpus.is_empty() {
            "all (shared)".to_owned()
        } else {
            cpus.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    println!(
        "farm-bench: {} CPUs (farm-apiserver and ceiling on {}, load generator on {}), {} rounds × {:.1}s, medians; load generator {}",
        setup.cpus,
        cpu_list(&setup.server_cpus),
        cpu_list(&setup.load_cpus),
        setup.rounds,
        setup.seconds,
        setup.load_generator,
    );

    let ceiling = start_ceiling(&args, &pki)?;
    let ceiling_t = target(&pki, ceiling.addr)?;
    let (server, startup) = start_server(&args, &pki, &["--synthetic-pods", "10000"]).await?;
    let server_t = target(&pki, server.addr)?;
    let s = (&server_t, server.pid());
    let c = (&ceiling_t, ceiling.pid());

    if wants(&args, 1) {
        println!(
            "1. GET one Llama, 64 keep-alive connections (front-proxy identity, SubjectAccessReview cached)"
        );
        for &proto in &args.protocols {
            let cmp = compare(
                &args,
                &mut report,
                "1-get",
                &format!("GET llama {}", proto.name()),
                s,
                c,
                proto,
                64,
                "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly",
                &[("accept", "application/json")],
            )
            .await?;
            report.metric(
                "1-get",
                &format!("{} rps ratio", proto.name()),
                cmp.rps_ratio,
                "×ceiling",
                "≥ 0.8",
                Some(cmp.rps_ratio >= 0.8),
            );
            report.metric(
                "1-get",
                &format!("{} cpu ratio", proto.name()),
                cmp.cpu_ratio,
                "×ceiling",
                "≤ 1.4",
                Some(cmp.cpu_ratio <= 1.4),
            );
            report.metric(
                "1-get",
                &format!("{} p99", proto.name()),
                cmp.server.p99_us / 1000.0,
                "ms",
                "≤ 2",
                Some(cmp.server.p99_us <= 2000.0),
            );
        }
        println!(
            "  SubjectAccessReviews sent by the server so far: {}",
            fake.reviews.load(std::sync::atomic::Ordering::Relaxed)
        );
    }

    if wants(&args, 2) {
        println!("2. LIST 1,000 Llamas (16 connections, h2)");
        create_llamas(&server_t, "herd", 1000).await?;
        let path = "/apis/farm.example.com/v1alpha/namespaces/herd/llamas";
        let json = compare(
            &args,
            &mut report,
            "2-list",
            "LIST 1000 llamas JSON",
            s,
            c,
            Proto::H2,
            16,
            path,
            &[("accept", "application/json")],
        )
        .await?;
        let table = compare(
            &args,
            &mut report,
            "2-list",
            "LIST 1000 llamas Table",
            s,
            c,
            Proto::H2,
            16,
            path,
            &[("accept", TABLE)],
        )
        .await?;
        // The same list at v1, the version Llamas are stored at (the path above reads v1alpha,
        // converted from it): each against the ceiling at its own size, so the two ratios
        // compare under the machine's conditions of their rounds (#30: at least 0.7x).
        let stored = compare(
            &args,
            &mut report,
            "2-list",
            "LIST 1000 llamas JSON at the storage version (v1)",
            s,
            c,
            Proto::H2,
            16,
            "/apis/farm.example.com/v1/namespaces/herd/llamas",
            &[("accept", "application/json")],
        )
        .await?;
        let converted = json.rps_ratio / stored.rps_ratio;
        report.metric(
            "2-list",
            "v1alpha (converted) vs v1 (stored) rps, each at equal bytes to the ceiling",
            converted,
            "×",
            "≥ 0.7",
            Some(converted >= 0.7),
        );
        for (name, cmp) in [("JSON", json), ("Table", table)] {
            report.metric(
                "2-list",
                &format!("{name} rps ratio at equal bytes"),
                cmp.rps_ratio,
                "×ceiling",
                "≥ 0.5",
                Some(cmp.rps_ratio >= 0.5),
            );
        }
    }

    if wants(&args, 3) {
        println!("3. LIST 10,000 FarmPods from the cache (synthetic Pods; no cluster calls)");
        let reviews_before = fake.reviews.load(std::sync::atomic::Ordering::Relaxed);
        let requests_before = fake.requests.load(std::sync::atomic::Ordering::Relaxed);
        let rss_before = procfs::rss_bytes(s.1).unwrap_or(0) as f64;
        let all = compare(
            &args,
            &mut report,
            "3-farmpods",
            "LIST 10000 farmpods JSON",
            s,
            c,
            Proto::H2,
            16,
            "/apis/farm.example.com/v1/farmpods",
            &[("accept", "application/json")],
        )
        .await?;
        let selected = compare(
            &args,
            &mut report,
            "3-farmpods",
            "-A -l app=app-7 Table",
            s,
            c,
            Proto::H2,
            16,
            "/apis/farm.example.com/v1/farmpods?labelSelector=app%3Dapp-7&limit=500",
            &[("accept", TABLE)],
        )
        .await?;
        // The same list as client-go asks for it: gzip (level 1, as kube-apiserver's).
        let gzipped = compare(
            &args,
            &mut report,
            "3-farmpods",
            "LIST 10000 farmpods JSON, gzip",
            s,
            c,
            Proto::H2,
            16,
            "/apis/farm.example.com/v1/farmpods",
            &[("accept", "application/json"), ("accept-encoding", "gzip")],
        )
        .await?;
        report.metric(
            "3-farmpods",
            "gzip: bytes on the wire, plain / gzipped (synthetic Pods)",
            all.server.bytes as f64 / gzipped.server.bytes.max(1) as f64,
            "×",
            "",
            None,
        );
        report.metric(
            "3-farmpods",
            "gzip: server CPU per list, gzipped / plain",
            gzipped.server.cpu_us_per_request / all.server.cpu_us_per_request,
            "×",
            "",
            None,
        );
        for (name, cmp) in [("all", all), ("label selector", selected)] {
            report.metric(
                "3-farmpods",
                &format!("{name} rps ratio at equal bytes"),
                cmp.rps_ratio,
                "×ceiling",
                "≥ 0.5",
                Some(cmp.rps_ratio >= 0.5),
            );
        }
        let reviews = fake.reviews.load(std::sync::atomic::Ordering::Relaxed) - reviews_before;
        let others =
            fake.requests.load(std::sync::atomic::Ordering::Relaxed) - requests_before - reviews;
        report.metric(
            "3-farmpods",
            "requests to kube-apiserver other than SubjectAccessReview",
            others as f64,
            "",
            "0",
            Some(others == 0),
        );
        println!("  SubjectAccessReviews during the FarmPod runs (cache refreshes): {reviews}");
        // 16 clients each reading a 4.3 MB list at once: what the lists' bodies hold.
        let peak = procfs::peak_rss_bytes(s.1).unwrap_or(0) as f64;
        report.metric(
            "3-farmpods",
            "server RSS before the FarmPod runs",
            rss_before / 1048576.0,
            "MiB",
            "",
            None,
        );
        report.metric(
            "3-farmpods",
            "server peak RSS (VmHWM) after them",
            peak / 1048576.0,
            "MiB",
            "",
            None,
        );
    }

    if wants(&args, 4) {
        println!("4. Watch fan-out: 1,000 watchers, 20 writes/s for 5 s");
        let p99 = fanout::run(
            &server_t,
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
    }

    if wants(&args, 18) {
        println!(
            "18. FarmPods over {} Pods shaped as kubelets leave them, listed from the fake kube-apiserver in pages of 500",
            args.scale_pods
        );
        at_scale::run(&args, &pki, &fake, &mut report, args.scale_pods).await?;
    }

    if wants(&args, 17) {
        println!(
            "17. 10,000 watchers: 5,000 HTTP/2 streams (20 connections × 250) and 5,000 HTTP/1.1 connections, 20 writes/s for 5 s"
        );
        let shape = fanout::Shape {
            h2_connections: 20,
            streams: 250,
            h1_connections: 5000,
        };
        let run = fanout::run(&server_t, server.pid(), shape, "fanout-10k").await?;
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
    }

    if wants(&args, 16) {
        println!(
            "16. Watchers that stop reading (HTTP/1.1; an HTTP/2 stream beside a reading one) while a Llama takes 3,000 merge patches of 100 KB; against 500 with none"
        );
        let run = slow_watch::run(&server_t, server.pid(), 500, 3000).await?;
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
    }

    if wants(&args, 6) {
        println!(
            "6. First response on 100 fresh TLS connections ({} rounds, server and ceiling alternating; medians of the per-round p50 and p99)",
            args.rounds.max(3)
        );
        for &proto in &args.protocols {
            let path = "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly";
            let ceiling_path = ceiling_path(path, 400);
            let (mut server_rounds, mut ceiling_rounds) = (Vec::new(), Vec::new());
            for _ in 0..args.rounds.max(3) {
                server_rounds.push(fresh_connections(&server_t, proto, path).await?);
                ceiling_rounds.push(fresh_connections(&ceiling_t, proto, &ceiling_path).await?);
            }
            let pick = |rounds: &[(f64, f64)], f: fn(&(f64, f64)) -> f64| {
                median(&mut rounds.iter().map(f).collect::<Vec<_>>())
            };
            let server_p99 = pick(&server_rounds, |r| r.1);
            println!(
                "  {} server p50 {:.3} ms p99 {:.3} ms | ceiling p50 {:.3} ms p99 {:.3} ms",
                proto.name(),
                pick(&server_rounds, |r| r.0),
                server_p99,
                pick(&ceiling_rounds, |r| r.0),
                pick(&ceiling_rounds, |r| r.1),
            );
            let list = |rounds: &[(f64, f64)]| {
                rounds
                    .iter()
                    .map(|r| format!("{:.2}", r.1))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            println!(
                "    p99 per round (ms): server {} | ceiling {}",
                list(&server_rounds),
                list(&ceiling_rounds)
            );
            report.metric(
                "6-fresh",
                &format!("{} first byte p99", proto.name()),
                server_p99,
                "ms",
                "≤ 2",
                Some(server_p99 <= 2.0),
            );
        }
    }
    if wants(&args, 15) {
        println!(
            "15. GET one Llama with an audit log at Metadata level (one event a request to a file), 64 keep-alive connections"
        );
        let dir = tempfile::tempdir()?;
        let policy = dir.path().join("policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )?;
        let log = dir.path().join("audit.log");
        let (audited, _) = start_server(
            &args,
            &pki,
            &[
                "--audit-policy-file",
                &policy.display().to_string(),
                "--audit-log-path",
                &log.display().to_string(),
            ],
        )
        .await?;
        let audited_t = target(&pki, audited.addr)?;
        for &proto in &args.protocols {
            let cmp = compare(
                &args,
                &mut report,
                "15-audited-get",
                &format!("audited GET llama {}", proto.name()),
                (&audited_t, audited.pid()),
                c,
                proto,
                64,
                "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly",
                &[("accept", "application/json")],
            )
            .await?;
            report.metric(
                "15-audited-get",
                &format!("{} rps ratio", proto.name()),
                cmp.rps_ratio,
                "×ceiling",
                "≥ 0.85",
                Some(cmp.rps_ratio >= 0.85),
            );
        }
        // The log rotates at 100 MiB: its backups (`audit-<time>.log`) count too.
        let written: usize = std::fs::read_dir(dir.path())?
            .filter_map(|entry| entry.ok())
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("audit"))
            .filter_map(|entry| std::fs::read(entry.path()).ok())
            .map(|text| text.iter().filter(|&&b| b == b'\n').count())
            .sum();
        println!("  audit events written (the last few may still be queued): {written}");
    }

    drop(server);
    drop(ceiling);

    if wants(&args, 5) {
        println!(
            "5. Pagination: a limit=500 page at 10k vs {} Llamas",
            args.pagination_large
        );
        let rounds = page_costs(&args, &pki).await?;
        let pick = |f: &dyn Fn(&(PageRound, PageRound)) -> f64| {
            median(&mut rounds.iter().map(f).collect::<Vec<_>>())
        };
        println!(
            "  median of {} interleaved rounds: first page 10k {:.0} µs, large {:.0} µs; middle page 10k {:.0} µs, large {:.0} µs; server CPU per page 10k {:.0} µs, large {:.0} µs",
            rounds.len(),
            pick(&|r| r.0.first_us),
            pick(&|r| r.1.first_us),
            pick(&|r| r.0.middle_us),
            pick(&|r| r.1.middle_us),
            pick(&|r| r.0.cpu_us),
            pick(&|r| r.1.cpu_us),
        );
        for (name, ratio) in [
            (
                "first page time large/10k",
                pick(&|r| r.1.first_us / r.0.first_us),
            ),
            (
                "middle page time large/10k",
                pick(&|r| r.1.middle_us / r.0.middle_us),
            ),
            (
                "server CPU per page large/10k",
                pick(&|r| r.1.cpu_us / r.0.cpu_us),
            ),
        ] {
            report.metric(
                "5-pagination",
                name,
                ratio,
                "×",
                "0.8–1.2",
                Some((0.8..=1.2).contains(&ratio)),
            );
        }
    }

    if wants(&args, 7) {
        println!("7. Memory and start-up");
        report.metric(
            "7-memory",
            "startup to ready (first start of this run, 10k synthetic pods)",
            startup.as_secs_f64() * 1000.0,
            "ms",
            "(see below)",
            None,
        );
        let (idle, ready) = start_server(&args, &pki, &["--no-sample-data"]).await?;
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
            &args,
            &pki,
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
            &args,
            &pki,
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
    }

    if wants(&args, 8) {
        cluster::run(&args, &mut report).await?;
    }

    if wants(&args, 9) {
        println!(
            "9. Soak: {} clients create/update/patch/get/list/delete their own Llamas for {} s, {} watchers",
            args.soak_clients, args.soak_seconds, args.soak_watchers
        );
        let (server, _) = start_server(&args, &pki, &["--no-sample-data"]).await?;
        let t = target(&pki, server.addr)?;
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
    }

    if wants(&args, 10) {
        println!(
            "10. Connection abuse: idle, slow-header, non-reading, PING-only and header-dribbling connections during normal load"
        );
        let (server, _) = start_server(
            &args,
            &pki,
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
        let t = target(&pki, server.addr)?;
        let list = "/apis/farm.example.com/v1/farmpods".to_owned();
        let list_bytes = t
            .connect(Proto::H2)
            .await?
            .get(&list, &[])
            .await?
            .body
            .len();
        let path = "/apis/farm.example.com/v1alpha/namespaces/default/llamas/dolly";
        let fds =
            || std::fs::read_dir(format!("/proc/{}/fd", server.pid())).map_or(0, |d| d.count());
        let fds_before = fds();
        let quiet = measure(&args, &t, server.pid(), Proto::H2, 16, path, &[]).await?;
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
        let abused = measure(&args, &t, server.pid(), Proto::H2, 16, path, &[]).await?;
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
    }

    if wants(&args, 11) {
        println!(
            "11. Llamas on etcd (--storage etcd) beside memory: reads from the watch cache, writes per second"
        );
        let etcd = etcd::Etcd::start(free_port()?, free_port()?).await?;
        let (on_etcd, _) = start_server(
            &args,
            &pki,
            &["--storage", "etcd", "--etcd-servers", &etcd.endpoint],
        )
        .await?;
        let on_etcd_t = target(&pki, on_etcd.addr)?;
        let (in_memory, _) = start_server(&args, &pki, &[]).await?;
        let in_memory_t = target(&pki, in_memory.addr)?;
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
                    &args,
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
                    &args,
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
            let in_memory =
                etcd::writes(&in_memory_t, "etcd-writes", 16, args.seconds, write).await?;
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
    }

    if wants(&args, 12) {
        println!(
            "12. Server-side apply beside a merge patch of the same Llama (memory, 16 clients): server CPU per write"
        );
        let (server, _) = start_server(&args, &pki, &[]).await?;
        let t = target(&pki, server.addr)?;
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
                    etcd::writes(&t, &format!("{namespace}-{round}"), 16, args.seconds, write)
                        .await?;
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
    }

    if wants(&args, 14) {
        println!(
            "14. One ValidatingAdmissionPolicy on every Llama create, beside a server with none (memory, 16 clients): server CPU per create"
        );
        let (without, _) = start_server(&args, &pki, &[]).await?;
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
        let (with, _) = start_server(&args, &pki, &[]).await?;
        fake.set_admission(Vec::new());
        let targets = [target(&pki, without.addr)?, target(&pki, with.addr)?];
        let pids = [without.pid(), with.pid()];
        let mut cpu: [Vec<f64>; 2] = Default::default();
        let mut errors = 0;
        for round in 0..args.rounds {
            for (index, t) in targets.iter().enumerate() {
                let before = procfs::cpu_seconds(pids[index]).unwrap_or(f64::NAN);
                let started = Instant::now();
                let namespace = format!("bench-vap-{index}-{round}");
                let done =
                    etcd::writes(t, &namespace, 16, args.seconds, etcd::Write::Create).await?;
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
    }

    if wants(&args, 13) {
        println!(
            "13. Large-object soak: one 1 MB Llama (12,500 finalizers, listed again in its managedFields) patched with one label {LARGE_PATCHES} times; RSS"
        );
        let (server, _) = start_server(&args, &pki, &[]).await?;
        let t = target(&pki, server.addr)?;
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
    }

    if let Some(dir) = args.output.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&args.output, serde_json::to_vec_pretty(&report)?)?;
    println!("results: {}", args.output.display());
    let missed: Vec<&Metric> = report
        .metrics
        .iter()
        .filter(|m| m.met == Some(false))
        .collect();
    println!(
        "targets: {} met, {} missed",
        report
            .metrics
            .iter()
            .filter(|m| m.met == Some(true))
            .count(),
        missed.len()
    );
    for m in missed {
        println!(
            "  missed: {} {} = {:.3} {} (target {})",
            m.scenario, m.name, m.value, m.unit, m.target
        );
    }
    Ok(())
}

/// Time to the first response byte (request written → headers), on `count` new connections;
/// returns (p50, p99) in ms.
async fn fresh_connections(t: &Target, proto: Proto, path: &str) -> Result<(f64, f64)> {
    let mut samples = Vec::new();
    for _ in 0..100 {
        let mut conn = t.connect(proto).await?;
        let sent = Instant::now();
        let response = conn.start("GET", path, &[], Bytes::new()).await?;
        samples.push(u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX));
        drop(response);
    }
    samples.sort_unstable();
    Ok((
        percentile(&samples, 50.0) / 1000.0,
        percentile(&samples, 99.0) / 1000.0,
    ))
}

/// One store's paging figures for a round.
struct PageRound {
    first_us: f64,
    middle_us: f64,
    cpu_us: f64,
}

/// A server holding `llamas` synthetic Llamas, with the paths of its first `limit=500` page and
/// of the page halfway through the list (reached by following continue tokens, as a client does).
struct PagedStore {
    server: Proc,
    conn: client::Conn,
    first: String,
    middle: String,
}

impl PagedStore {
    async fn start(args: &RunArgs, pki: &Pki, llamas: usize) -> Result<Self> {
        let count = llamas.to_string();
        let (server, _) = start_server(
            args,
            pki,
            &["--no-sample-data", "--synthetic-llamas", &count],
        )
        .await?;
        let mut conn = target(pki, server.addr)?.connect(Proto::H2).await?;
        let first = "/apis/farm.example.com/v1alpha/llamas?limit=500".to_owned();
        let mut middle = first.clone();
        for _ in 0..llamas / 2 / 500 {
            let page = conn.get(&middle, &[]).await?;
            anyhow::ensure!(page.status == 200, "page: {}", page.status);
            let page: serde_json::Value = serde_json::from_slice(&page.body)?;
            let token = page["metadata"]["continue"]
                .as_str()
                .context("continue token")?;
            middle = format!("{first}&continue={token}");
        }
        Ok(Self {
            server,
            conn,
            first,
            middle,
        })
    }

    /// `requests` of each page: median latencies and the server's CPU per page.
    async fn round(&mut self, requests: usize) -> Result<PageRound> {
        let cpu_before = procfs::thread_cpu_ns(self.server.pid());
        let mut firsts = Vec::with_capacity(requests);
        let mut middles = Vec::with_capacity(requests);
        for _ in 0..requests {
            let t0 = Instant::now();
            anyhow::ensure!(self.conn.get(&self.first, &[]).await?.status == 200);
            firsts.push(t0.elapsed().as_secs_f64() * 1e6);
            let t0 = Instant::now();
            anyhow::ensure!(self.conn.get(&self.middle, &[]).await?.status == 200);
            middles.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        let cpu_after = procfs::thread_cpu_ns(self.server.pid());
        let cpu_us = match (cpu_before, cpu_after) {
            (Some(b), Some(a)) => a.saturating_sub(b) as f64 / 1e3 / (2 * requests) as f64,
            _ => f64::NAN,
        };
        Ok(PageRound {
            first_us: median(&mut firsts),
            middle_us: median(&mut middles),
            cpu_us,
        })
    }
}

/// Page cost at 10k and at `args.pagination_large` Llamas: both servers run at once and take
/// turns, round by round, so a noisy moment hits both. Returns per-round figures (small, large).
async fn page_costs(args: &RunArgs, pki: &Pki) -> Result<Vec<(PageRound, PageRound)>> {
    let mut small = PagedStore::start(args, pki, 10_000).await?;
    let mut large = PagedStore::start(args, pki, args.pagination_large).await?;
    // Warm both (first touches of the large store's pages and allocator).
    small.round(20).await?;
    large.round(20).await?;
    let mut rounds = Vec::new();
    for _ in 0..args.rounds.max(3) {
        let s = small.round(100).await?;
        let l = large.round(100).await?;
        rounds.push((s, l));
    }
    Ok(rounds)
}

fn online_cpus() -> usize {
    // SAFETY: sysconf only reads a system value.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// The raw generator's threads: as asked, else one per CPU this process may run on.
fn client_threads(args: &RunArgs) -> usize {
    args.client_threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()))
}

fn main() -> Result<()> {
    tls::install_default_provider();
    let mut cli = Cli::parse();
    if let Cmd::Run(args) = &mut cli.command
        && !args.shared_cpus
    {
        let allowed = affinity::allowed().context("reading this process's CPUs")?;
        (args.server_cpus, args.load_cpus) =
            affinity::split(&allowed, &args.server_cpus, &args.load_cpus);
        // Before the runtime starts, so its threads inherit the mask.
        if !args.load_cpus.is_empty() {
            affinity::pin_current(&args.load_cpus).context("pinning the load generator")?;
        }
    }
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command {
        Cmd::Run(args) => runtime.block_on(run(*args)),
        Cmd::Ceiling {
            cert,
            key,
            client_ca,
        } => {
            let cas = client_ca
                .iter()
                .map(|p| std::fs::read_to_string(p).with_context(|| p.display().to_string()))
                .collect::<Result<Vec<_>>>()?;
            runtime.block_on(ceiling::serve(
                &std::fs::read(&cert)?,
                &std::fs::read(&key)?,
                &cas,
            ))
        }
        Cmd::FakeCluster {
            kubeconfig,
            admission,
            pods,
        } => runtime.block_on(async {
            let (addr, fake) = fake::start().await?;
            if let Some(path) = admission {
                fake.set_admission(serde_json::from_slice(&std::fs::read(path)?)?);
            }
            fake.pods.set((0..pods).map(pods::pod).collect());
            std::fs::write(&kubeconfig, fake::kubeconfig(addr))?;
            println!("listening {addr}");
            std::future::pending::<Result<()>>().await
        }),
    }
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

#[cfg(test)]
mod tests {
    use super::ceiling_path;

    #[test]
    fn the_ceiling_gets_the_servers_request_with_the_size_added() {
        assert_eq!(ceiling_path("/apis/x/y", 267), "/apis/x/y?size=267");
        assert_eq!(
            ceiling_path("/apis/x/y?labelSelector=app%3Dapp-7", 38940),
            "/apis/x/y?labelSelector=app%3Dapp-7&size=38940"
        );
    }
}
