//! Scenario 8: Llamas through a real kube-apiserver, farm-apiserver's aggregated Llama beside the
//! same Llama defined as a CustomResourceDefinition (what users would pick instead). The
//! aggregated one is registered as a user installs it (the shipped manifests rendered after
//! `farm-apiserver certs`: RBAC and the APIService with its caBundle), except that the server runs
//! here, as a separate process, reached through a Service of type ExternalName (`localhost`, the
//! server's port). Both kinds hold the same 1,000 Llamas in one namespace and are read by the
//! same load generator, on the same connections' settings, as the kubeconfig's user (a client
//! certificate). Everything created is removed at the end, the APIService first, on error too.

use std::{
    collections::BTreeMap,
    net::{SocketAddr, ToSocketAddrs},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result, anyhow, bail, ensure};
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use serde::Serialize;
use serde_json::{Value, json};

use crate::{
    Proc, Report, RunArgs, Stats, affinity,
    client::{Proto, Target},
    free_port, measure_processes, median, medians, procfs,
};

mod access;
mod install;

use access::*;
use install::*;

const GROUP: &str = "farm.example.com";
/// The CustomResourceDefinition's group: a different one, so both kinds are served at once.
const CRD_GROUP: &str = "crd.farm.example.com";
const CRD: &str = "llamas.crd.farm.example.com";
const VERSION: &str = "v1alpha";
const API_SERVICE: &str = "v1alpha.farm.example.com";
/// Where the APIService points unless the manifests say otherwise (`farm-apiserver certs`'
/// defaults, for which the serving certificate is issued).
const SERVICE: &str = "farm-apiserver";
const SERVICE_NAMESPACE: &str = "farm-system";
const LLAMAS: usize = 1000;
const CONNECTIONS: usize = 16;
/// The Llama every GET reads.
const ONE: &str = "l-00500";
/// The shortest measured window of the LIST runs, in seconds.
const LIST_SECONDS: f64 = 6.0;

/// Scenario 8's figures, with how they were taken (written to results.json).
#[derive(Debug, Serialize)]
pub struct Summary {
    pub server: String,
    pub user: String,
    pub namespace: String,
    pub llamas: usize,
    pub connections: usize,
    pub protocol: &'static str,
    /// The CPUs each process could run on (kube-apiserver and etcd are never pinned).
    pub cpus: BTreeMap<String, String>,
    pub comparisons: Vec<KubeComparison>,
}

/// One request, aggregated vs CRD, interleaved round by round.
#[derive(Debug, Serialize)]
pub struct KubeComparison {
    pub variant: String,
    pub aggregated_path: String,
    pub crd_path: String,
    /// Medians; `cpu_us_per_request` is the sum of the processes below.
    pub aggregated: Stats,
    pub crd: Stats,
    /// Median CPU µs per request of each process on this host (kube-apiserver, etcd,
    /// farm-apiserver), over the measured windows.
    pub aggregated_cpu_us_per_request: BTreeMap<String, f64>,
    pub crd_cpu_us_per_request: BTreeMap<String, f64>,
    /// Medians of the per-round ratios aggregated/CRD (each aggregated run against the CRD run
    /// right after it).
    pub rps_ratio: f64,
    pub p99_ratio: f64,
    pub cpu_ratio: f64,
    pub aggregated_rps_per_round: Vec<f64>,
    pub crd_rps_per_round: Vec<f64>,
}

/// Scenario 8; skipped, with the reason printed, when no cluster was given.
pub async fn run(args: &RunArgs, report: &mut Report) -> Result<()> {
    let Some(kubeconfig) = &args.cluster else {
        let reason = "8. Through kube-apiserver: skipped, no cluster given (--cluster <kubeconfig> or FARM_BENCH_KUBECONFIG)";
        println!("{reason}");
        report.skipped.push(reason.to_owned());
        return Ok(());
    };
    let access = read_access(kubeconfig)?;
    println!(
        "8. Through kube-apiserver ({}, user {}): GET and LIST of {LLAMAS} Llamas, farm-apiserver's aggregated {GROUP} vs a CRD in {CRD_GROUP}, {CONNECTIONS} {} connections, {} rounds interleaved",
        access.url,
        access.user,
        Proto::H2.name(),
        args.rounds
    );
    // Interrupted, the scenario's future is dropped and what it installed removed.
    tokio::select! {
        result = scenario(args, report, kubeconfig, &access) => result,
        _ = tokio::signal::ctrl_c() => bail!("interrupted (scenario 8 removed what it had created)"),
    }
}

async fn scenario(
    args: &RunArgs,
    report: &mut Report,
    kubeconfig: &Path,
    access: &Access,
) -> Result<()> {
    let started = Instant::now();
    let dir = tempfile::tempdir()?;
    let rendered = render(&args.server, &args.manifests, dir.path())?;
    let certs = dir.path().join("manifests").join("certs");
    let namespace = format!("farm-bench-{}", std::process::id());
    let etcd = match args.cluster_storage.as_str() {
        "etcd" => Some(crate::etcd::Etcd::start(free_port()?, free_port()?).await?),
        _ => None,
    };
    let storage: Vec<String> = match &etcd {
        Some(etcd) => vec![
            "--storage".into(),
            "etcd".into(),
            "--etcd-servers".into(),
            etcd.endpoint.clone(),
        ],
        None => Vec::new(),
    };
    let server = start_server(args, kubeconfig, &certs, access, &storage).await?;
    let port = server.addr.port();
    let farm_pid = server.pid();
    let items = objects(rendered, &certs, port, &namespace)?;
    let gone: Vec<String> = items
        .iter()
        .filter(|o| o["kind"] == "Namespace")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .map(|n| format!("namespace/{n}"))
        .chain([format!("crd/{CRD}")])
        .collect();
    let rest: Vec<Value> = items
        .iter()
        .filter(|o| {
            !(o["kind"] == "APIService"
                || o["kind"] == "CustomResourceDefinition"
                || (o["kind"] == "Namespace" && o["metadata"]["name"] == namespace.as_str()))
        })
        .cloned()
        .collect();
    let installed = Installed {
        kubectl: Kubectl {
            kubeconfig: kubeconfig.to_owned(),
            cache: tempfile::tempdir()?,
        },
        rest: json!({"apiVersion": "v1", "kind": "List", "items": rest}),
        namespace: namespace.clone(),
        gone,
        server: Some(server),
    };
    let kubectl = &installed.kubectl;
    let applied = json!({"apiVersion": "v1", "kind": "List", "items": items});
    kubectl.run(&["apply", "-f", "-"], Some(&applied.to_string()))?;
    kubectl.run(
        &[
            "wait",
            "--for=condition=Established",
            &format!("crd/{CRD}"),
            "--timeout=60s",
        ],
        None,
    )?;
    kubectl.run(
        &[
            "wait",
            "--for=condition=Available",
            &format!("apiservice/{API_SERVICE}"),
            "--timeout=120s",
        ],
        None,
    )?;

    let t = Target::new(access.addr, &access.ca_pem, &access.identity, Vec::new())?
        .with_server_name(&access.host)?;
    let paths = |group: &str| {
        let base = format!("/apis/{group}/{VERSION}/namespaces/{namespace}/llamas");
        (format!("{base}/{ONE}"), base)
    };
    let (aggregated, crd) = (paths(GROUP), paths(CRD_GROUP));
    served(&t, &aggregated.1).await?;
    served(&t, &crd.1).await?;

    let client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig)?,
            &Default::default(),
        )
        .await?,
    )?;
    let created = Instant::now();
    tokio::try_join!(
        create_llamas(&client, GROUP, &namespace),
        create_llamas(&client, CRD_GROUP, &namespace),
    )?;
    for (name, list) in [("aggregated", &aggregated.1), ("CRD", &crd.1)] {
        let items = get_once(&t, list).await?["items"]
            .as_array()
            .map_or(0, Vec::len);
        ensure!(items == LLAMAS, "{name} LIST holds {items} Llamas");
    }
    println!(
        "  installed in {:.1} s; {LLAMAS} Llamas of each kind created in {:.1} s (kube-rs, 32 at a time per kind, both kinds at once)",
        created.duration_since(started).as_secs_f64(),
        created.elapsed().as_secs_f64()
    );

    let mut processes = control_plane(access);
    processes.push(("farm-apiserver", farm_pid));
    let pids: Vec<u32> = processes.iter().map(|p| p.1).collect();
    let mut cpus = BTreeMap::new();
    for (name, pid) in &processes {
        cpus.insert(
            (*name).to_owned(),
            procfs::cpus_allowed(*pid).unwrap_or_else(|| "?".to_owned()),
        );
    }
    cpus.insert(
        "load generator".to_owned(),
        procfs::cpus_allowed(std::process::id()).unwrap_or_else(|| "?".to_owned()),
    );
    println!(
        "  CPUs: {} (farm-apiserver and the load generator pinned as in the other scenarios unless --shared-cpus; kube-apiserver and etcd never)",
        processes
            .iter()
            .map(|(name, pid)| format!("{name} (pid {pid}) {}", cpus[*name]))
            .chain([format!("load generator {}", cpus["load generator"])])
            .collect::<Vec<_>>()
            .join(", ")
    );
    if !processes.iter().any(|p| p.0 == "kube-apiserver") {
        println!(
            "  note: kube-apiserver is not a process of this host (or not the only one): CPU per request counts farm-apiserver only"
        );
    }

    let mut summary = Summary {
        server: access.url.clone(),
        user: access.user.clone(),
        namespace: namespace.clone(),
        llamas: LLAMAS,
        connections: CONNECTIONS,
        protocol: Proto::H2.name(),
        cpus,
        comparisons: Vec::new(),
    };
    let accept = [("accept", "application/json")];
    // A CRD's LIST of 1,000 takes over a second under this load: its runs last long enough for
    // several requests per connection (and the warm-up for the connections to fall out of step).
    let list_args = RunArgs {
        seconds: args.seconds.max(LIST_SECONDS),
        ..args.clone()
    };
    for (variant, aggregated_path, crd_path, args) in [
        ("GET one Llama", &aggregated.0, &crd.0, args),
        ("LIST 1000 Llamas JSON", &aggregated.1, &crd.1, &list_args),
    ] {
        println!(
            "  {variant}: {} rounds × {:.1} s each (after {:.1} s of warm-up), aggregated then CRD",
            args.rounds,
            args.seconds,
            args.seconds / 4.0
        );
        let (mut agg_runs, mut crd_runs) = (Vec::new(), Vec::new());
        for _ in 0..args.rounds {
            agg_runs.push(
                measure_processes(
                    args,
                    &t,
                    &pids,
                    Proto::H2,
                    CONNECTIONS,
                    aggregated_path,
                    &accept,
                )
                .await?,
            );
            crd_runs.push(
                measure_processes(args, &t, &pids, Proto::H2, CONNECTIONS, crd_path, &accept)
                    .await?,
            );
        }
        let comparison = compare(
            variant,
            aggregated_path,
            crd_path,
            &processes,
            &agg_runs,
            &crd_runs,
        );
        print_comparison(&comparison);
        let metric = format!("{variant}: req/s aggregated/CRD");
        if variant.starts_with("GET") {
            report.metric(
                "8-kube-apiserver",
                &metric,
                comparison.rps_ratio,
                "×CRD",
                "≥ 1.5",
                Some(comparison.rps_ratio >= 1.5),
            );
        } else {
            report.metric(
                "8-kube-apiserver",
                &metric,
                comparison.rps_ratio,
                "×CRD",
                "",
                None,
            );
        }
        summary.comparisons.push(comparison);
    }
    // Writes through kube-apiserver: farm-apiserver's Llamas (in memory or on etcd) beside the
    // CRD's (kube-apiserver's etcd), 16 clients each, one after the other.
    println!(
        "  writes, 16 clients, {:.1} s each, farm-apiserver on {}:",
        args.seconds, args.cluster_storage
    );
    for (variant, write) in [
        ("creates", crate::etcd::Write::Create),
        ("updates (merge patch)", crate::etcd::Write::MergePatch),
    ] {
        let ours = crate::etcd::writes_in(&t, GROUP, &namespace, 16, args.seconds, write).await?;
        let crds =
            crate::etcd::writes_in(&t, CRD_GROUP, &namespace, 16, args.seconds, write).await?;
        let ratio = ours.rate / crds.rate;
        println!(
            "  {variant:<22} aggregated {:>7.0}/s ({} refused) | CRD {:>7.0}/s ({} refused) | ratio {ratio:.2}",
            ours.rate, ours.errors, crds.rate, crds.errors
        );
        report.metric(
            "8-kube-apiserver",
            &format!(
                "{variant} per second through kube-apiserver, {} ÷ CRD",
                args.cluster_storage
            ),
            ratio,
            "×CRD",
            "reported",
            None,
        );
    }
    report.through_kube_apiserver = Some(summary);
    drop(installed);
    drop(etcd);
    Ok(())
}

fn compare(
    variant: &str,
    aggregated_path: &str,
    crd_path: &str,
    processes: &[(&'static str, u32)],
    agg_runs: &[(Stats, Vec<f64>)],
    crd_runs: &[(Stats, Vec<f64>)],
) -> KubeComparison {
    let stats = |runs: &[(Stats, Vec<f64>)]| medians(&runs.iter().map(|r| r.0).collect::<Vec<_>>());
    let per_process = |runs: &[(Stats, Vec<f64>)]| {
        processes
            .iter()
            .enumerate()
            .map(|(i, (name, _))| {
                let mut values: Vec<f64> = runs.iter().map(|r| r.1[i]).collect();
                ((*name).to_owned(), median(&mut values))
            })
            .collect::<BTreeMap<_, _>>()
    };
    let ratio = |f: fn(&Stats) -> f64| {
        let mut ratios: Vec<f64> = agg_runs
            .iter()
            .zip(crd_runs)
            .map(|(a, c)| f(&a.0) / f(&c.0))
            .collect();
        median(&mut ratios)
    };
    KubeComparison {
        variant: variant.to_owned(),
        aggregated_path: aggregated_path.to_owned(),
        crd_path: crd_path.to_owned(),
        aggregated: stats(agg_runs),
        crd: stats(crd_runs),
        aggregated_cpu_us_per_request: per_process(agg_runs),
        crd_cpu_us_per_request: per_process(crd_runs),
        rps_ratio: ratio(|s| s.rps),
        p99_ratio: ratio(|s| s.p99_us),
        cpu_ratio: ratio(|s| s.cpu_us_per_request),
        aggregated_rps_per_round: agg_runs.iter().map(|r| r.0.rps).collect(),
        crd_rps_per_round: crd_runs.iter().map(|r| r.0.rps).collect(),
    }
}

fn print_comparison(c: &KubeComparison) {
    for (name, s, cpu) in [
        (
            "aggregated",
            &c.aggregated,
            &c.aggregated_cpu_us_per_request,
        ),
        ("CRD", &c.crd, &c.crd_cpu_us_per_request),
    ] {
        let breakdown = ["kube-apiserver", "etcd", "farm-apiserver"]
            .iter()
            .filter_map(|process| Some(format!("{process} {:.0}", cpu.get(*process)?)))
            .collect::<Vec<_>>()
            .join(" + ");
        println!(
            "    {name:<10} {:>7.0} req/s  p50 {:>7.0} µs  p99 {:>7.0} µs  {:>7} B  CPU {:.0} µs/req ({breakdown})  load generator {:.1} µs/req{}",
            s.rps,
            s.p50_us,
            s.p99_us,
            s.bytes,
            s.cpu_us_per_request,
            s.client_cpu_us_per_request,
            if s.errors > 0 {
                format!(" ({} errors)", s.errors)
            } else {
                String::new()
            }
        );
        if s.steal > 0.05 {
            println!(
                "      note: the hypervisor stole {:.0}% of the CPU time during the {name} runs",
                s.steal * 100.0
            );
        }
        if s.load_generator_busy > 0.9 {
            println!(
                "      note: the load generator was {:.0}% busy during the {name} runs: it may have set the pace",
                s.load_generator_busy * 100.0
            );
        }
        if s.others > 0.1 {
            println!(
                "      note: other processes used {:.0}% of the machine's CPU time during the {name} runs (kube-apiserver and etcd are not pinned: they compete with them)",
                s.others * 100.0
            );
        }
    }
    let rounds = c
        .aggregated_rps_per_round
        .iter()
        .zip(&c.crd_rps_per_round)
        .map(|(a, b)| format!("{:.2}", a / b))
        .collect::<Vec<_>>()
        .join(" ");
    println!(
        "    aggregated/CRD (median of per-round ratios): req/s {:.2}, p99 {:.2}, CPU per request {:.2}; req/s per round: {rounds}",
        c.rps_ratio, c.p99_ratio, c.cpu_ratio
    );
}
