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

/// How to reach the cluster and as whom: a kubeconfig's current context.
pub struct Access {
    pub url: String,
    pub user: String,
    /// The host the server's certificate is verified for.
    pub host: String,
    pub addr: SocketAddr,
    pub ca_pem: String,
    pub identity: (String, String),
}

/// Reads the current context's server, CA and client certificate (inline `*-data` or files).
pub fn read_access(path: &Path) -> Result<Access> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let config: Value = serde_saphyr::from_str(&text)
        .with_context(|| format!("parsing kubeconfig {}", path.display()))?;
    let named = |list: &str, name: &str, field: &str| -> Result<Value> {
        config[list]
            .as_array()
            .and_then(|items| items.iter().find(|i| i["name"] == name))
            .map(|i| i[field].clone())
            .with_context(|| format!("kubeconfig: no {list} entry {name:?}"))
    };
    let current = config["current-context"]
        .as_str()
        .context("kubeconfig: no current-context")?;
    let context = named("contexts", current, "context")?;
    let cluster_name = context["cluster"].as_str().context("context: no cluster")?;
    let user = context["user"].as_str().context("context: no user")?;
    let cluster = named("clusters", cluster_name, "cluster")?;
    let auth = named("users", user, "user")?;
    let dir = path.parent().unwrap_or(Path::new("."));
    // `<key>-data` (base64) or `<key>` (a file, relative to the kubeconfig).
    let pem = |entry: &Value, key: &str| -> Result<String> {
        if let Some(data) = entry[format!("{key}-data")].as_str() {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .with_context(|| format!("kubeconfig: {key}-data"))?;
            return Ok(String::from_utf8(bytes)?);
        }
        let file = entry[key].as_str().with_context(|| {
            format!("kubeconfig: no {key}(-data) (scenario 8 needs a client certificate)")
        })?;
        std::fs::read_to_string(dir.join(file)).with_context(|| format!("reading {file}"))
    };
    let url = cluster["server"]
        .as_str()
        .context("kubeconfig: cluster without server")?
        .to_owned();
    let uri: http::Uri = url.parse().with_context(|| format!("server {url}"))?;
    ensure!(uri.scheme_str() == Some("https"), "server {url}: not https");
    let host = uri
        .host()
        .context("server without a host")?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let addr = (host.as_str(), uri.port_u16().unwrap_or(443))
        .to_socket_addrs()?
        .next()
        .with_context(|| format!("resolving {host}"))?;
    Ok(Access {
        user: user.to_owned(),
        host,
        addr,
        ca_pem: pem(&cluster, "certificate-authority")?,
        identity: (pem(&auth, "client-certificate")?, pem(&auth, "client-key")?),
        url,
    })
}

/// kubectl against the cluster, with a cache of its own.
struct Kubectl {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Kubectl {
    /// (success, stdout, stderr).
    fn try_run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let child = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .env_remove("KUBECONFIG")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(child) => child,
            Err(e) => return (false, String::new(), format!("running kubectl: {e}")),
        };
        if let Some(mut pipe) = child.stdin.take() {
            use std::io::Write;
            if let Some(input) = stdin {
                let _ = pipe.write_all(input.as_bytes());
            }
        }
        match child.wait_with_output() {
            Ok(out) => (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            ),
            Err(e) => (false, String::new(), e.to_string()),
        }
    }

    fn run(&self, args: &[&str], stdin: Option<&str>) -> Result<String> {
        let (ok, out, err) = self.try_run(args, stdin);
        ensure!(
            ok,
            "kubectl {}: {}{}",
            args.join(" "),
            err.trim(),
            out.trim()
        );
        Ok(out)
    }
}

/// What the scenario put into the cluster, and the server behind it; removed when dropped (the
/// APIService first: a stale one breaks discovery and namespace deletion cluster-wide), then
/// the server stops.
struct Installed {
    kubectl: Kubectl,
    /// Everything applied besides the APIService, the CRD and the Llamas' namespace.
    rest: Value,
    namespace: String,
    /// Namespaces and the CRD to wait for, so whoever uses the cluster next finds it clean.
    gone: Vec<String>,
    server: Option<Proc>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let started = Instant::now();
        let k = &self.kubectl;
        let mut failed = Vec::new();
        for (what, args, stdin) in [
            (
                "APIService",
                vec!["delete", "apiservice", API_SERVICE, "--ignore-not-found"],
                None,
            ),
            (
                "CRD",
                vec!["delete", "crd", CRD, "--ignore-not-found", "--wait=false"],
                None,
            ),
            (
                "namespace",
                vec![
                    "delete",
                    "namespace",
                    &self.namespace,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            ),
            (
                "Service, RBAC",
                vec!["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
                Some(self.rest.to_string()),
            ),
        ] {
            let (ok, _, err) = k.try_run(&args, stdin.as_deref());
            if !ok {
                failed.push(format!("{what}: {}", err.trim()));
            }
        }
        let mut wait = vec!["wait", "--for=delete", "--timeout=60s"];
        wait.extend(self.gone.iter().map(String::as_str));
        let (ok, _, err) = k.try_run(&wait, None);
        if !ok {
            failed.push(format!("still there after 60 s: {}", err.trim()));
        }
        if let Some(server) = self.server.take() {
            drop(server);
        }
        if failed.is_empty() {
            println!(
                "  removed the APIService, the CRD, the namespaces, the Service and the RBAC ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        } else {
            println!("  cleanup incomplete: {}", failed.join("; "));
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "certs" {
                copy_dir(&entry.path(), &target)?;
            }
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The shipped manifests as a user installs them: copied, `farm-apiserver certs` written into
/// the copy's `certs/`, rendered by the kustomize built into kubectl. Returns the objects.
fn render(server: &Path, manifests: &Path, dir: &Path) -> Result<Vec<Value>> {
    let copy = dir.join("manifests");
    copy_dir(manifests, &copy)?;
    let out = Command::new(server)
        .args([
            "certs",
            "--namespace",
            SERVICE_NAMESPACE,
            "--service",
            SERVICE,
        ])
        .arg("--out")
        .arg(copy.join("certs"))
        .output()
        .with_context(|| format!("{} certs", server.display()))?;
    ensure!(
        out.status.success(),
        "farm-apiserver certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&copy)
        .output()
        .context("kubectl kustomize (kubectl must be on PATH)")?;
    ensure!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        manifests.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in text.split("\n---\n") {
        let object: Value = serde_saphyr::from_str(doc).context("kustomize output")?;
        if object.is_object() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// The CustomResourceDefinition: the same Llama (spec.weight and spec.height, numbers greater
/// than 0, both required), namespaced, in `crd.farm.example.com`.
fn crd() -> Value {
    let positive = |what: &str| {
        json!({"type": "number", "format": "double", "minimum": 0, "exclusiveMinimum": true,
               "description": what})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Llama", "listKind": "LlamaList", "plural": "llamas", "singular": "llama"},
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["weight", "height"],
                        "properties": {
                            "weight": positive("Weight of the llama in kilograms."),
                            "height": positive("Height of the llama at the shoulder, in metres."),
                        },
                    }},
                }},
                "additionalPrinterColumns": [
                    {"name": "Weight", "type": "number", "jsonPath": ".spec.weight"},
                    {"name": "Height", "type": "number", "jsonPath": ".spec.height"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    })
}

/// What is applied: the rendered manifests without the Deployment, its Secret and the
/// ClusterIP Service (this process runs the server), an ExternalName Service to `localhost` on
/// `port`, the APIService pointing at it (the manifests' own, or one made from the certs'
/// CA when they hold none), the CRD and the Llamas' namespace.
fn objects(rendered: Vec<Value>, certs: &Path, port: u16, namespace: &str) -> Result<Vec<Value>> {
    let mut items: Vec<Value> = rendered
        .into_iter()
        .filter(|o| {
            !["Deployment", "Service", "Secret"].contains(&o["kind"].as_str().unwrap_or(""))
        })
        .collect();
    let ca = std::fs::read(certs.join("ca.crt")).context("certs/ca.crt")?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let api_service = match items.iter_mut().find(|o| o["kind"] == "APIService") {
        Some(api_service) => api_service,
        None => {
            println!(
                "  note: the manifests hold no APIService; registering {API_SERVICE} with the CA `farm-apiserver certs` wrote"
            );
            items.push(json!({
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": API_SERVICE},
                "spec": {
                    "group": GROUP,
                    "version": VERSION,
                    "groupPriorityMinimum": 1000,
                    "versionPriority": 15,
                    "service": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
                },
            }));
            items.last_mut().context("just pushed")?
        }
    };
    if !api_service["spec"]["caBundle"].is_string() {
        api_service["spec"]["caBundle"] = json!(ca_bundle);
    }
    let service = api_service["spec"]["service"].clone();
    ensure!(
        service["name"] == SERVICE && service["namespace"] == SERVICE_NAMESPACE,
        "the APIService points at {service}; the serving certificate is for {SERVICE}.{SERVICE_NAMESPACE}.svc"
    );
    api_service["spec"]["service"]["port"] = json!(port);
    items.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }));
    if !items
        .iter()
        .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == SERVICE_NAMESPACE)
    {
        items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVICE_NAMESPACE}}));
    }
    items.push(crd());
    items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}));
    Ok(items)
}

/// Llama `i`, the same for both kinds but for its apiVersion.
fn llama(api_version: &str, i: usize) -> Value {
    json!({"apiVersion": api_version, "kind": "Llama",
        "metadata": {"name": format!("l-{i:05}"), "labels": {"herd": format!("h{}", i % 10)}},
        "spec": {"weight": 10.0 + i as f64, "height": 1.5}})
}

/// Creates the 1,000 Llamas of `group` with kube-rs, 32 at a time.
async fn create_llamas(client: &kube::Client, group: &str, namespace: &str) -> Result<()> {
    use kube::{
        Api,
        api::{ApiResource, DynamicObject},
    };
    let resource = ApiResource {
        group: group.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{group}/{VERSION}"),
        kind: "Llama".to_owned(),
        plural: "llamas".to_owned(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    futures::stream::iter(0..LLAMAS)
        .map(|i| create_llama(&api, &resource.api_version, i))
        .buffer_unordered(32)
        .try_collect::<()>()
        .await
}

/// Creates Llama `i`; one already there is kept, a transient error (the group not served yet)
/// retried for up to 30 s.
async fn create_llama(
    api: &kube::Api<kube::api::DynamicObject>,
    api_version: &str,
    i: usize,
) -> Result<()> {
    let object: kube::api::DynamicObject = serde_json::from_value(llama(api_version, i))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&Default::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            Err(kube::Error::Api(status)) if ![404, 429, 500, 503, 504].contains(&status.code) => {
                bail!("creating {api_version} Llama {i}: {}", status.message)
            }
            Err(e) if Instant::now() > deadline => {
                return Err(anyhow!(e).context(format!("creating {api_version} Llama {i}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Starts farm-apiserver as the install does (the serving certificate from `certs`, the cluster
/// from the kubeconfig), pinned like the other scenarios' servers; returns once /readyz is 200.
async fn start_server(
    args: &RunArgs,
    kubeconfig: &Path,
    certs: &Path,
    access: &Access,
    storage: &[String],
) -> Result<Proc> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut command = Command::new(&args.server);
    if !args.server_cpus.is_empty() {
        affinity::pin_command(&mut command, &args.server_cpus)?;
    }
    let child = command
        .arg("--bind")
        .arg(addr.to_string())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--tls-cert-file")
        .arg(certs.join("tls.crt"))
        .arg("--tls-private-key-file")
        .arg(certs.join("tls.key"))
        .args(["--no-sample-data", "--log-level", "warn"])
        .args(storage)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", args.server.display()))?;
    let mut proc = Proc { child, addr };
    let ca = std::fs::read_to_string(certs.join("ca.crt"))?;
    let t = Target::new(addr, &ca, &access.identity, Vec::new())?
        .with_server_name(&format!("{SERVICE}.{SERVICE_NAMESPACE}.svc"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut conn) = t.connect(Proto::H1).await
            && let Ok(reply) = conn.get("/readyz", &[]).await
            && reply.status == 200
        {
            return Ok(proc);
        }
        if let Some(status) = proc.child.try_wait()? {
            bail!("farm-apiserver exited: {status}");
        }
        ensure!(
            Instant::now() < deadline,
            "farm-apiserver did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// kube-apiserver's and etcd's processes, when the cluster runs on this host (for their CPU
/// time; they are never pinned).
fn control_plane(access: &Access) -> Vec<(&'static str, u32)> {
    if !access.addr.ip().is_loopback() {
        return Vec::new();
    }
    let port = access.addr.port();
    let apiservers: Vec<u32> = procfs::pids_named("kube-apiserver")
        .into_iter()
        .filter(|&pid| {
            let args = procfs::cmdline(pid);
            let flag = args.iter().position(|a| a.starts_with("--secure-port"));
            let value = flag.and_then(|i| {
                args[i]
                    .strip_prefix("--secure-port=")
                    .map(str::to_owned)
                    .or_else(|| args.get(i + 1).cloned())
            });
            value.map_or(port == 6443, |v| v == port.to_string())
        })
        .collect();
    let etcds = procfs::pids_named("etcd");
    let mut found = Vec::new();
    if let [pid] = apiservers[..] {
        found.push(("kube-apiserver", pid));
    }
    if let [pid] = etcds[..] {
        found.push(("etcd", pid));
    }
    found
}

/// GET `path` through kube-apiserver once: 200 and the body, or an error.
async fn get_once(t: &Target, path: &str) -> Result<Value> {
    let mut conn = t.connect(Proto::H2).await?;
    let reply = conn.get(path, &[("accept", "application/json")]).await?;
    ensure!(
        reply.status == 200,
        "GET {path}: {} {}",
        reply.status,
        String::from_utf8_lossy(&reply.body)
    );
    Ok(serde_json::from_slice(&reply.body)?)
}

/// Waits until `path` answers 200 through kube-apiserver (the aggregator's and the CRD
/// handler's view of a new group can lag their conditions by a moment).
async fn served(t: &Target, path: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match get_once(t, path).await {
            Ok(body) => return Ok(body),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kubeconfigs_current_context_gives_the_server_ca_and_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(dir.path().join("other.key"), "OTHER KEY").unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
current-context: lab
clusters:
- name: elsewhere
  cluster: {{server: 'https://10.0.0.1'}}
- name: lab
  cluster:
    server: https://127.0.0.1:6443
    certificate-authority-data: {}
contexts:
- name: other
  context: {{cluster: elsewhere, user: other}}
- name: lab
  context: {{cluster: lab, user: lab-admin}}
users:
- name: other
  user: {{client-certificate-data: eA==, client-key: other.key}}
- name: lab-admin
  user:
    client-certificate-data: {}
    client-key: other.key
",
                b64("CA PEM"),
                b64("CERT PEM")
            ),
        )
        .unwrap();
        let access = read_access(&kubeconfig).unwrap();
        assert_eq!(access.url, "https://127.0.0.1:6443");
        assert_eq!(access.user, "lab-admin");
        assert_eq!(access.host, "127.0.0.1");
        assert_eq!(access.addr, "127.0.0.1:6443".parse().unwrap());
        assert_eq!(access.ca_pem, "CA PEM");
        // Inline data, or a file relative to the kubeconfig.
        assert_eq!(access.identity, ("CERT PEM".into(), "OTHER KEY".into()));
    }

    #[test]
    fn the_install_runs_the_server_here_behind_an_external_name_service() {
        let certs = tempfile::tempdir().unwrap();
        std::fs::write(certs.path().join("ca.crt"), "CA").unwrap();
        let rendered = vec![
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "farm-system"}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "farm-apiserver"}}),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "farm-apiserver-tls-x"}}),
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "farm-apiserver"},
                   "spec": {"type": "ClusterIP"}}),
            json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                   "metadata": {"name": "farm:view"}}),
            json!({"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
                   "metadata": {"name": API_SERVICE},
                   "spec": {"group": GROUP, "version": VERSION, "caBundle": "QUJD",
                            "service": {"name": SERVICE, "namespace": SERVICE_NAMESPACE, "port": 443}}}),
        ];
        let items = objects(rendered, certs.path(), 41234, "farm-bench-1").unwrap();
        let kinds: Vec<&str> = items.iter().map(|o| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "Namespace",
                "ClusterRole",
                "APIService",
                "Service",
                "CustomResourceDefinition",
                "Namespace"
            ]
        );
        let api_service = &items[2];
        assert_eq!(api_service["spec"]["service"]["port"], 41234);
        assert_eq!(
            api_service["spec"]["caBundle"], "QUJD",
            "the manifests' own"
        );
        assert_eq!(items[3]["spec"]["type"], "ExternalName");
        assert_eq!(items[3]["spec"]["externalName"], "localhost");
        assert_eq!(items[3]["spec"]["ports"][0]["port"], 41234);
        assert_eq!(items[4]["spec"]["group"], CRD_GROUP);
        assert_eq!(items[4]["spec"]["names"]["plural"], "llamas");
        assert_eq!(items[5]["metadata"]["name"], "farm-bench-1");

        // Manifests without an APIService: one is made, trusting the certs' CA.
        let items = objects(Vec::new(), certs.path(), 41234, "farm-bench-1").unwrap();
        let api_service = items.iter().find(|o| o["kind"] == "APIService").unwrap();
        assert_eq!(api_service["spec"]["caBundle"], "Q0E=");
        assert_eq!(api_service["spec"]["service"]["port"], 41234);
        assert!(
            items
                .iter()
                .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == SERVICE_NAMESPACE)
        );
    }

    #[test]
    fn both_kinds_get_the_same_llamas() {
        let (a, c) = (
            llama("farm.example.com/v1alpha", 7),
            llama("crd.farm.example.com/v1alpha", 7),
        );
        assert_eq!(a["metadata"], c["metadata"]);
        assert_eq!(a["spec"], c["spec"]);
        assert_eq!(a["metadata"]["name"], "l-00007");
    }
}
