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
mod harness;
mod load;
mod pods;
mod procfs;
mod report;
mod scenarios;
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

use aggregated_apiserver::net::tls::{self, DevCa};
use anyhow::{Context, Result, bail};
use bytes::Bytes;
use clap::{Parser, Subcommand};
use client::{Conn, Proto, Target, percentile};
use serde::Serialize;
use serde_json::json;

use harness::*;
use report::*;

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
    let report = Report {
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

    let mut bench = scenarios::Bench {
        args,
        report,
        fake,
        pki,
    };
    scenarios::run(&mut bench).await?;
    let scenarios::Bench { args, report, .. } = bench;

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
