//! Through a real kube-apiserver: farm-apiserver registered by the shipped manifests (RBAC and
//! the APIService with its caBundle), reached by the aggregator, used with kubectl and kube-rs
//! as a cluster's users use it.
//!
//! Runs when `FARM_E2E_KUBECONFIG` names a cluster whose kube-apiserver runs on this host (the
//! lab in `../shared/k8s-lab`, or any other): the server runs here on 127.0.0.1, and the
//! manifests' Service is replaced by one of type ExternalName (`localhost`, the server's port),
//! so the aggregator dials this process and verifies its certificate for
//! `farm-apiserver.farm-system.svc` against the APIService's caBundle. Everything it creates is
//! removed at the end, the APIService first, on failure too.

use crate::common;

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use common::{install, process::Running};
use farm_apiserver::resources::{Llama, LlamaSpec};
use futures::{StreamExt, TryStreamExt};
use kube::{
    Api,
    api::{ListParams, PostParams, WatchEvent, WatchParams},
};
use serde_json::{Value, json};

use farm_apiserver::certs::API_SERVICES;

/// The tests through a real cluster (here and in `e2e_node`) install the same APIService and
/// namespace: one at a time.
pub(crate) static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// kubectl against the cluster under test.
pub(crate) struct Cluster {
    kubeconfig: PathBuf,
    cache: tempfile::TempDir,
}

impl Cluster {
    /// The kubeconfig of FARM_E2E_KUBECONFIG.
    pub(crate) fn kubeconfig(&self) -> &std::path::Path {
        &self.kubeconfig
    }

    pub(crate) fn from_env() -> Option<Self> {
        let Some(kubeconfig) = std::env::var_os("FARM_E2E_KUBECONFIG") else {
            eprintln!(
                "SKIPPED: FARM_E2E_KUBECONFIG is not set; it names a cluster whose kube-apiserver runs on this host (see docs/install.md: 'Against a real kube-apiserver')"
            );
            return None;
        };
        assert!(
            install::has_kubectl(),
            "FARM_E2E_KUBECONFIG is set but kubectl is not on PATH"
        );
        Some(Self {
            kubeconfig: kubeconfig.into(),
            cache: tempfile::tempdir().unwrap(),
        })
    }

    pub(crate) fn kubectl(&self) -> Command {
        let mut cmd = Command::new("kubectl");
        cmd.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(self.cache.path())
            .env_remove("KUBECONFIG");
        cmd
    }

    /// (success, stdout, stderr) of kubectl with `args` and `stdin`.
    pub(crate) fn run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut cmd = self.kubectl();
        cmd.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("run kubectl");
        {
            use std::io::Write;
            let mut pipe = child.stdin.take().unwrap();
            if let Some(input) = stdin {
                pipe.write_all(input.as_bytes()).unwrap();
            }
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// kubectl that must succeed; its stdout.
    pub(crate) fn ok(&self, args: &[&str], stdin: Option<&str>) -> String {
        let (ok, out, err) = self.run(args, stdin);
        assert!(ok, "kubectl {}: {err}{out}", args.join(" "));
        out
    }

    /// Runs kubectl until `check` accepts its (success, stdout, stderr), for up to `within`.
    pub(crate) async fn eventually(
        &self,
        args: &[&str],
        within: Duration,
        check: impl Fn(bool, &str, &str) -> bool,
    ) -> String {
        let deadline = Instant::now() + within;
        loop {
            let (ok, out, err) = self.run(args, None);
            if check(ok, &out, &err) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "kubectl {} did not get there in {within:?}: {err}{out}",
                args.join(" ")
            );
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The cluster's Ready nodes' names.
    pub(crate) fn ready_nodes(&self) -> Vec<String> {
        let (ok, out, _) = self.run(
            &[
                "get",
                "nodes",
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status}{\"\\n\"}{end}",
            ],
            None,
        );
        if !ok {
            return Vec::new();
        }
        out.lines()
            .filter_map(|l| l.strip_suffix(" True").map(str::to_owned))
            .collect()
    }

    /// Waits (up to two minutes) for every version's APIService to be Available; how long it
    /// took.
    pub(crate) async fn available(&self) -> Duration {
        let since = Instant::now();
        for api_service in API_SERVICES {
            self.eventually(
                &[
                    "get",
                    "apiservice",
                    api_service,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
                ],
                Duration::from_secs(120),
                |_, out, _| out == "True",
            )
            .await;
        }
        since.elapsed()
    }

    pub(crate) async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .unwrap();
        kube::Client::try_from(config).unwrap()
    }
}

/// What the test put into the cluster; removed when dropped, the APIService first (a stale
/// APIService breaks discovery and namespace deletion cluster-wide).
pub(crate) struct Installed<'a> {
    pub(crate) cluster: &'a Cluster,
    pub(crate) applied: Applied,
    /// The test's namespace for Llamas.
    pub(crate) namespace: String,
}

/// How the install was applied, so it can be deleted the same way.
pub(crate) enum Applied {
    /// `kubectl apply -f -` of these objects.
    Objects(Value),
    /// `kubectl apply -k` of this kustomization.
    Kustomization(PathBuf),
}

impl Drop for Installed<'_> {
    fn drop(&mut self) {
        let c = self.cluster;
        for api_service in API_SERVICES {
            let _ = c.run(
                &["delete", "apiservice", api_service, "--ignore-not-found"],
                None,
            );
        }
        let _ = c.run(
            &[
                "delete",
                "namespace",
                &self.namespace,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        let _ = match &self.applied {
            Applied::Objects(objects) => c.run(
                &["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
                Some(&objects.to_string()),
            ),
            Applied::Kustomization(dir) => c.run(
                &[
                    "delete",
                    "-k",
                    &dir.to_string_lossy(),
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            ),
        };
    }
}

fn llama_yaml(namespace: &str, name: &str, weight: f64, height: f64) -> String {
    format!(
        "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: {name}
  namespace: {namespace}
  labels:
    herd: e2e
spec:
  weight: {weight}
  height: {height}
"
    )
}

/// A real etcd of the test's own when `FARM_E2E_STORAGE=etcd` (the lab suites with Llamas
/// on etcd), else none.
pub(crate) async fn etcd_from_env() -> Option<crate::common::etcd::Etcd> {
    match std::env::var("FARM_E2E_STORAGE").as_deref() {
        Ok("etcd") => Some(
            crate::common::etcd::Etcd::start()
                .await
                .expect("FARM_E2E_STORAGE=etcd needs etcd on PATH"),
        ),
        _ => None,
    }
}

/// farm-apiserver started here with `args` (Llamas on `etcd` when given) and registered in
/// `cluster` by the shipped manifests (RBAC, Namespace, ServiceAccount, APIServices with their
/// caBundle), its Service an ExternalName to this host; returns once every APIService is
/// Available. The installation, with a namespace for the test's objects, goes when dropped.
pub(crate) async fn register<'a>(
    cluster: &'a Cluster,
    args: Vec<std::ffi::OsString>,
    etcd: Option<&crate::common::etcd::Etcd>,
    env: &[(&str, &std::ffi::OsStr)],
    step: &dyn Fn(&str),
) -> (Running, Installed<'a>) {
    // A previous run's cleanup may still be deleting its namespace: creating objects in a
    // terminating namespace fails, so wait for it to be gone.
    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.run(&["get", "namespace", "farm-system"], None).0 {
        assert!(
            Instant::now() < deadline,
            "namespace farm-system from an earlier run is still there"
        );
        step("waiting for an earlier run's namespace farm-system to go");
        std::thread::sleep(Duration::from_secs(2));
    }
    let rendered = install::render(None);
    let certs = rendered.certs();
    let mut args = args;
    args.extend([
        "--tls-cert-file".into(),
        certs.join("tls.crt").into(),
        "--tls-private-key-file".into(),
        certs.join("tls.key").into(),
        "--kubeconfig".into(),
        cluster.kubeconfig.clone().into(),
        "--no-sample-data".into(),
    ]);
    if let Some(etcd) = etcd {
        step(&format!("Llamas on etcd at {}", etcd.endpoint()));
        args.extend([
            "--storage".into(),
            "etcd".into(),
            "--etcd-servers".into(),
            etcd.endpoint().into(),
        ]);
    }
    let server = Running::start_with_env(args, env);
    let port = server.addr.port();
    step(&format!("farm-apiserver serving on {}", server.addr));

    // The manifests' RBAC, Namespace, ServiceAccount and APIService, as shipped; the
    // Deployment, its Secret and the ClusterIP Service give way to this process.
    let mut items: Vec<Value> = rendered
        .objects
        .iter()
        .filter(|o| !["Deployment", "Service", "Secret"].contains(&o["kind"].as_str().unwrap()))
        .cloned()
        .collect();
    let mut service = Value::Null;
    for api_service in items.iter_mut().filter(|o| o["kind"] == "APIService") {
        assert!(api_service["spec"]["caBundle"].is_string());
        assert!(api_service["spec"].get("insecureSkipTLSVerify").is_none());
        service = api_service["spec"]["service"].clone();
        api_service["spec"]["service"]["port"] = json!(port);
    }
    assert!(service.is_object(), "the manifests hold the APIServices");
    items.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service["name"], "namespace": service["namespace"]},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }));
    let namespace = format!("farm-e2e-{}", std::process::id());
    items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}));
    let applied = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let installed = Installed {
        cluster,
        applied: Applied::Objects(applied.clone()),
        namespace,
    };
    cluster.ok(&["apply", "-f", "-"], Some(&applied.to_string()));

    step("waiting for the APIService to be Available");
    cluster.available().await;
    (server, installed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_kube_apiserver() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());

    step("certificates and manifests, as a user makes them");
    // FARM_E2E_STORAGE=etcd: the same suite with Llamas on a real etcd of the test's own.
    let etcd = etcd_from_env().await;
    // An audit log (its policy file beside it): FarmPods left out, creates with their objects,
    // the rest at Metadata.
    let audit_dir = tempfile::tempdir().unwrap();
    let audit_policy = audit_dir.path().join("policy.yaml");
    let audit_log = audit_dir.path().join("audit.log");
    std::fs::write(
        &audit_policy,
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n\
         - level: None\n  resources: [{group: farm.example.com, resources: [farmpods]}]\n\
         - level: RequestResponse\n  verbs: [create]\n\
         - level: Metadata\n",
    )
    .unwrap();
    // Traces, sampled only where the caller's were (a kube-apiserver with tracing on).
    let (collector, trace_port) = common::otlp::Collector::start().await;
    let tracing_config = audit_dir.path().join("tracing.yaml");
    std::fs::write(
        &tracing_config,
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: 127.0.0.1:{trace_port}\nsamplingRatePerMillion: 0\n"
        ),
    )
    .unwrap();
    let args: Vec<std::ffi::OsString> = vec![
        "--tracing-config-file".into(),
        tracing_config.into(),
        "--audit-policy-file".into(),
        audit_policy.clone().into(),
        "--audit-log-path".into(),
        audit_log.clone().into(),
    ];
    // Spans go out every 100 ms rather than every 5 s.
    let (server, installed) = register(
        &cluster,
        args,
        etcd.as_ref(),
        &[("OTEL_BSP_SCHEDULE_DELAY", std::ffi::OsStr::new("100"))],
        &step,
    )
    .await;
    let ns = installed.namespace.as_str();

    // With a node (the lab's `up.sh --node`) Pods run; without, they stay Pending.
    let nodes = if cluster.ready_nodes().is_empty() {
        Nodes::None
    } else {
        Nodes::Real
    };
    suite(&cluster, ns, &step, nodes).await;
    versions_through_the_aggregator(&cluster, ns, &step).await;
    audit_ids_join(&cluster, ns, &step, &audit_log).await;
    apiserver_audit_and_trace_join(ns, &step, &audit_log, &collector, trace_port).await;
    // The webhooks listen on this host's loopback, which this server (on this host) reaches.
    webhooks_configured_with_kubectl(&cluster, ns, &step).await;
    policies_configured_with_kubectl(&cluster, ns, &step).await;
    a_policy_asks_the_authorizer(&cluster, ns, &step).await;
    mutating_policies_configured_with_kubectl(&cluster, ns, &step).await;
    webhook_through_a_service(&cluster, ns, &step).await;

    step("cleaning up: the APIServices first");
    drop(installed);
    for api_service in API_SERVICES {
        let (_, out, _) = cluster.run(&["get", "apiservice", api_service], None);
        assert!(out.is_empty(), "APIService removed: {out}");
    }
    drop(server);
    step("done");
}

/// Both versions through kube-apiserver, each APIService Available: kubectl picks v1, names
/// v1alpha when asked; what is applied through one is read through the other; `kubectl explain`
/// per version; kube-rs typed clients of each, and a v1alpha watch during a v1 write.
async fn versions_through_the_aggregator(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    use farm_apiserver::resources::llama::{NICKNAME_ANNOTATION, v1, v1alpha};
    step("versions: v1 preferred, v1alpha beside it, one object read through both");
    let group: Value =
        serde_json::from_str(&cluster.ok(&["get", "--raw", "/apis/farm.example.com"], None))
            .unwrap();
    assert_eq!(group["preferredVersion"]["version"], "v1", "{group}");
    assert_eq!(group["versions"].as_array().unwrap().len(), 2, "{group}");

    let older = format!(
        "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: versioned
  namespace: {ns}
spec:
  weight: 44
  height: 1.3
"
    );
    cluster.ok(&["apply", "-f", "-"], Some(&older));
    let weight_kg = cluster.ok(
        &[
            "get",
            "llama",
            "versioned",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.weightKg}",
        ],
        None,
    );
    assert_eq!(weight_kg, "44");
    let weight = cluster.ok(
        &[
            "get",
            "llamas.v1alpha.farm.example.com",
            "versioned",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.weight}",
        ],
        None,
    );
    assert_eq!(weight, "44");

    let out = cluster
        .eventually(
            &["explain", "llamas.spec.weightKg"],
            Duration::from_secs(60),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("VERSION:    v1\n"), "{out}");
    let out = cluster
        .eventually(
            &[
                "explain",
                "llamas.spec.weight",
                "--api-version=farm.example.com/v1alpha",
            ],
            Duration::from_secs(60),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("VERSION:    v1alpha"), "{out}");

    step("versions: kube-rs typed clients of both, a v1alpha watch during a v1 write");
    let client = cluster.client().await;
    let newer: Api<v1::Llama> = Api::namespaced(client.clone(), ns);
    let older: Api<v1alpha::Llama> = Api::namespaced(client, ns);
    let rv = older
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = older
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut named = v1::Llama::new(
        "nicknamed",
        v1::LlamaSpec {
            weight_kg: 55.0,
            height_metres: 1.5,
            nickname: Some("Nick".into()),
        },
    );
    named.metadata.namespace = Some(ns.into());
    newer.create(&PostParams::default(), &named).await.unwrap();
    let seen = crate::versions::next(&mut events).await;
    assert_eq!(seen.spec.weight, 55.0);
    assert_eq!(
        seen.metadata.annotations.as_ref().unwrap()[NICKNAME_ANNOTATION],
        "Nick"
    );
    let read = newer.get("nicknamed").await.unwrap();
    assert_eq!(read.spec.nickname.as_deref(), Some("Nick"));
    cluster.ok(
        &["delete", "llama", "versioned", "nicknamed", "-n", ns],
        None,
    );
}

/// One `kubectl create` through kube-apiserver: the `Audit-Id` kube-apiserver answers (its own
/// audit ID, which its aggregator sends on) is the ID of this server's events for that write,
/// with the user kube-apiserver authenticated, the verb, the Llama and the 201.
async fn audit_ids_join(cluster: &Cluster, ns: &str, step: &dyn Fn(&str), log: &std::path::Path) {
    step("audit: kube-apiserver's audit ID is this server's");
    let whoami = cluster.ok(
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    );
    let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "audited", "namespace": ns}, "spec": {"weight": 2.0, "height": 1.0}});
    // -v=8: kubectl prints each response's headers.
    let (ok, _, err) = cluster.run(&["create", "-f", "-", "-v=8"], Some(&llama.to_string()));
    assert!(ok, "{err}");
    let ids: Vec<String> = err
        .lines()
        .filter_map(|line| line.split("Audit-Id: ").nth(1))
        .map(|id| id.trim().to_owned())
        .collect();
    assert!(!ids.is_empty(), "kube-apiserver answers Audit-Id: {err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["name"] == "audited"
                    && e["stage"] == "ResponseComplete"
            });
        if let Some(event) = found {
            break event;
        }
        assert!(
            Instant::now() < deadline,
            "no event for the create in {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let id = event["auditID"].as_str().unwrap().to_owned();
    assert!(
        ids.contains(&id),
        "the event's auditID {id} is one kube-apiserver answered: {ids:?}"
    );
    assert_eq!(event["user"]["username"].as_str(), Some(whoami.trim()));
    assert_eq!(event["objectRef"]["namespace"], ns);
    assert_eq!(event["objectRef"]["resource"], "llamas");
    assert_eq!(event["responseStatus"]["code"], 201);
    assert_eq!(
        event["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    // The policy's levels: a create with both objects; FarmPods not at all; a list at
    // Metadata, without its objects.
    assert_eq!(event["level"], "RequestResponse");
    assert_eq!(event["requestObject"]["metadata"]["name"], "audited");
    assert!(
        event["responseObject"]["metadata"]["uid"].is_string(),
        "{event}"
    );
    cluster.ok(&["get", "farmpods", "-n", ns], None);
    cluster.ok(&["get", "llamas", "-n", ns], None);
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let events: Vec<Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .collect();
        let lists: Vec<&Value> = events
            .iter()
            .filter(|e| e["verb"] == "list" && e["objectRef"]["namespace"] == ns)
            .collect();
        if let Some(listed) = lists
            .iter()
            .find(|e| e["objectRef"]["resource"] == "llamas")
        {
            assert!(
                !lists
                    .iter()
                    .any(|e| e["objectRef"]["resource"] == "farmpods"),
                "FarmPods are left out: {lists:?}"
            );
            break (*listed).clone();
        }
        assert!(Instant::now() < deadline, "no event for the list");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(listed["level"], "Metadata");
    assert!(listed.get("responseObject").is_none(), "{listed}");
    cluster.ok(&["delete", "llama", "audited", "-n", ns], None);
}

/// A second kube-apiserver of the lab's (`$K8S_LAB_HOME`, default `~/.k8s-lab`): its etcd, PKI
/// and flags, on a port of its own, with its own audit log and traces on (the lab's own runs
/// without either). It serves the same cluster, so its aggregator proxies to this server too.
struct AuditedApiserver {
    child: std::process::Child,
    cluster: Cluster,
    audit_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl AuditedApiserver {
    /// None (and why, printed) without the lab's binaries and PKI.
    async fn start(trace_port: u16) -> Option<Self> {
        let home = match std::env::var_os("K8S_LAB_HOME") {
            Some(home) => PathBuf::from(home),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".k8s-lab"),
        };
        let (binary, pki) = (home.join("bin/kube-apiserver"), home.join("pki"));
        if !binary.exists() || !pki.join("front-proxy-ca.crt").exists() {
            eprintln!(
                "SKIPPED (this step): no lab kube-apiserver and PKI in {}, to run a second kube-apiserver with its audit log and traces on",
                home.display()
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )
        .unwrap();
        let tracing = dir.path().join("tracing.yaml");
        std::fs::write(
            &tracing,
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: 127.0.0.1:{trace_port}\nsamplingRatePerMillion: 1000000\n"
            ),
        )
        .unwrap();
        let audit_log = dir.path().join("audit.log");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = |file: &str| pki.join(file).display().to_string();
        let log = std::fs::File::create(dir.path().join("kube-apiserver.log")).unwrap();
        // The lab's flags (up.sh, without a node), and the audit log and traces.
        let child = Command::new(&binary)
            .args([
                "--etcd-servers=http://127.0.0.1:2379".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                "--advertise-address=127.0.0.1".to_owned(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", dir.path().join("certs").display()),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
                "--authorization-mode=Node,RBAC".to_owned(),
                format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".to_owned(),
                "--requestheader-username-headers=X-Remote-User".to_owned(),
                "--requestheader-group-headers=X-Remote-Group".to_owned(),
                "--requestheader-uid-headers=X-Remote-Uid".to_owned(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
                format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                "--enable-aggregator-routing=false".to_owned(),
                "--endpoint-reconciler-type=none".to_owned(),
                "--profiling=false".to_owned(),
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit_log.display()),
                format!("--tracing-config-file={}", tracing.display()),
            ])
            // Spans go out every 100 ms rather than every 5 s.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run the lab's kube-apiserver");
        // The lab's admin kubeconfig, pointed at this one.
        let kubeconfig = dir.path().join("kubeconfig");
        let text = std::fs::read_to_string(home.join("kubeconfig")).unwrap();
        let text: String = text
            .lines()
            .map(|line| match line.split_once("server: ") {
                Some((indent, _)) => format!("{indent}server: https://127.0.0.1:{port}\n"),
                None => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&kubeconfig, text).unwrap();
        let apiserver = Self {
            child,
            cluster: Cluster {
                kubeconfig,
                cache: tempfile::tempdir().unwrap(),
            },
            audit_log,
            _dir: dir,
        };
        // Ready, and its aggregator proxying to this server.
        apiserver
            .cluster
            .eventually(
                &["get", "--raw", "/apis/farm.example.com/v1alpha"],
                Duration::from_secs(120),
                |ok, _, _| ok,
            )
            .await;
        Some(apiserver)
    }
}

impl Drop for AuditedApiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Through a kube-apiserver with its own audit log and traces on: one `kubectl create` has
/// the same auditID in kube-apiserver's log and in this server's (`log`), and kube-apiserver's
/// spans and this server's are one trace, this server's request span under kube-apiserver's
/// proxy span (all received by `collector`, this server sampling only what its caller did).
async fn apiserver_audit_and_trace_join(
    ns: &str,
    step: &dyn Fn(&str),
    log: &std::path::Path,
    collector: &common::otlp::Collector,
    trace_port: u16,
) {
    step("a second kube-apiserver with its audit log and traces on");
    let Some(apiserver) = AuditedApiserver::start(trace_port).await else {
        return;
    };
    let cluster = &apiserver.cluster;
    step("audit and traces: one create through it");
    let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "joined", "namespace": ns}, "spec": {"weight": 2.0, "height": 1.0}});
    cluster.ok(&["create", "-f", "-"], Some(&llama.to_string()));
    // kube-apiserver's objectRef of a create has no name at Metadata level (the proxy does
    // not read the body): the only create of a Llama in `ns` through it.
    let is_the_create = |e: &Value| {
        e["verb"] == "create"
            && e["objectRef"]["resource"] == "llamas"
            && e["objectRef"]["namespace"] == ns
            && e["requestURI"].as_str().is_some_and(|uri| {
                uri.starts_with(&format!(
                    "/apis/farm.example.com/v1alpha/namespaces/{ns}/llamas"
                ))
            })
            && e["stage"] == "ResponseComplete"
            && e["responseStatus"]["code"] == 201
    };
    let event_in = |path: &std::path::Path, is_the_create: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let found = text
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(is_the_create);
            if let Some(event) = found {
                return event;
            }
            assert!(
                Instant::now() < deadline,
                "no event for the create in {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Everything through the second kube-apiserver is this step's; this server's log has the
    // whole suite's creates too.
    let theirs = event_in(&apiserver.audit_log, &is_the_create);
    let ours = event_in(log, &|e: &Value| {
        is_the_create(e) && e["objectRef"]["name"] == "joined"
    });
    assert_eq!(
        theirs["auditID"], ours["auditID"],
        "one audit ID in both logs"
    );
    assert_eq!(theirs["user"]["username"], ours["user"]["username"]);
    assert_eq!(theirs["responseStatus"]["code"], 201);
    assert_eq!(ours["responseStatus"]["code"], 201);
    assert_eq!(ours["objectRef"]["namespace"], ns);

    // Our request span (the create), and kube-apiserver's span it hangs under.
    use common::otlp::{attribute, hex};
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ours, theirs) = loop {
        let spans = collector.spans();
        let ours = spans.iter().find(|(service, span)| {
            service == "farm-apiserver"
                && span.name == "KubernetesAPI"
                && attribute(span, "http.request.method").as_deref() == Some("POST")
                && attribute(span, "url.path")
                    .is_some_and(|p| p.ends_with(&format!("/namespaces/{ns}/llamas")))
        });
        if let Some((_, ours)) = ours {
            let parent = spans.iter().find(|(service, span)| {
                service != "farm-apiserver" && span.span_id == ours.parent_span_id
            });
            if let Some((service, parent)) = parent {
                break (ours.clone(), (service.clone(), parent.clone()));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no joined trace in {:?}",
            spans
                .iter()
                .map(|(service, s)| format!("{service}/{}", s.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (service, parent) = theirs;
    assert_eq!(service, "apiserver", "kube-apiserver's service name");
    assert_eq!(hex(&parent.trace_id), hex(&ours.trace_id), "one trace");
    step(&format!(
        "trace {}: this server's span under kube-apiserver's {:?}",
        hex(&ours.trace_id),
        parent.name
    ));
    cluster.ok(&["delete", "llama", "joined", "-n", ns], None);
}

/// Whether the cluster runs Pods: FarmPods then show them Running, on their node.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Nodes {
    /// The lab without `--node`: Pods stay Pending.
    None,
    /// A real node runs them.
    Real,
}

/// Everything a cluster's users do with farm-apiserver once its APIService is Available, in
/// the namespace `ns`: the server may be this host's process or a Pod on a node.
pub(crate) async fn suite(cluster: &Cluster, ns: &str, step: &dyn Fn(&str), nodes: Nodes) {
    // Through the aggregator to this process (a stale Available from an earlier registration
    // does not count).
    cluster
        .eventually(
            &["get", "--raw", "/apis/farm.example.com/v1alpha"],
            Duration::from_secs(60),
            |ok, out, _| ok && out.contains("\"groupVersion\":\"farm.example.com/v1alpha\""),
        )
        .await;

    // kubectl validates what it applies against the cluster's OpenAPI: the farm.example.com
    // part is there once kube-apiserver has downloaded ours (as system:aggregator).
    step("kubectl explain llamas.spec (kube-apiserver aggregated our OpenAPI)");
    // Its v2 too: kube-apiserver answers 503 for the whole cluster's /openapi/v2 when one
    // aggregated document is not valid Swagger 2.0 (kubectl validates Lists against it).
    cluster
        .eventually(
            &["get", "--raw", "/openapi/v2"],
            Duration::from_secs(60),
            |ok, out, _| ok && out.contains("com.example.farm.v1alpha.Llama"),
        )
        .await;
    let out = cluster
        .eventually(
            &["explain", "llamas.spec"],
            Duration::from_secs(120),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("KIND:       Llama"), "{out}");
    assert!(out.contains("weightKg\t<number> -required-"), "{out}");
    let out = cluster.ok(&["get", "--raw", "/openapi/v2"], None);
    assert!(out.contains("com.example.farm.v1alpha.Llama"));

    step("kubectl: apply, get columns, re-apply, patch, delete");
    let dolly = llama_yaml(ns, "dolly", 31.4, 0.5);
    let out = cluster.ok(&["apply", "-f", "-"], Some(&dolly));
    assert!(
        out.contains("llama.farm.example.com/dolly created"),
        "{out}"
    );
    let out = cluster.ok(&["apply", "-f", "-"], Some(&dolly));
    assert!(
        out.contains("llama.farm.example.com/dolly unchanged"),
        "{out}"
    );
    let out = cluster.ok(&["get", "llamas", "-n", ns], None);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "WEIGHT", "HEIGHT", "AGE"], "{out}");
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["dolly", "31.4", "0.5"], "{out}");
    let out = cluster.ok(
        // Through the manifest's version: kubectl's move from client-side to server-side apply
        // below takes over fields whose values match its last-applied configuration, compared
        // at that configuration's version.
        &[
            "patch",
            "llamas.v1alpha.farm.example.com",
            "dolly",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"height":0.6}}"#,
        ],
        None,
    );
    assert!(out.contains("patched"), "{out}");
    let changed = llama_yaml(ns, "dolly", 32.0, 0.6);
    let out = cluster.ok(&["apply", "-f", "-"], Some(&changed));
    assert!(out.contains("configured"), "{out}");
    let got: Value =
        serde_json::from_str(&cluster.ok(&["get", "llama", "dolly", "-n", ns, "-o", "json"], None))
            .unwrap();
    // Applied through v1alpha, read through v1 (kubectl's preferred version). (kubectl
    // re-encodes numbers as Go does: 32.0 comes back as 32.)
    assert_eq!(got["apiVersion"], "farm.example.com/v1");
    assert_eq!(got["spec"]["weightKg"].as_f64(), Some(32.0));
    assert_eq!(got["spec"]["heightMetres"].as_f64(), Some(0.6));
    let (ok, _, err) = cluster.run(
        &[
            "patch",
            "llama",
            "dolly",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"weightKg":-1}}"#,
        ],
        None,
    );
    assert!(!ok);
    assert!(
        err.contains(
            "spec.weightKg: Invalid value: -1: spec.weightKg in body should be greater than 0"
        ),
        "{err}"
    );

    step("kubectl apply --server-side: from client-side apply, conflict, force");
    // dolly was made by client-side apply and patched by kubectl-patch since.
    let out = cluster.ok(
        &["apply", "--server-side", "-f", "-"],
        Some(&llama_yaml(ns, "dolly", 32.0, 0.6)),
    );
    assert!(out.contains("serverside-applied"), "{out}");
    let (ok, _, err) = cluster.run(
        &["apply", "--server-side", "-f", "-"],
        Some(&llama_yaml(ns, "dolly", 33.0, 0.7)),
    );
    assert!(
        ok,
        "same values as last applied: the upgrade takes them over: {err}"
    );
    let out = cluster.ok(
        &[
            "patch",
            "llama",
            "dolly",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"weightKg":40}}"#,
        ],
        None,
    );
    assert!(out.contains("patched"), "{out}");
    let (ok, _, err) = cluster.run(
        &["apply", "--server-side", "-f", "-"],
        Some(&llama_yaml(ns, "dolly", 34.0, 0.7)),
    );
    assert!(!ok);
    assert!(
        // kubectl-patch wrote through v1: the conflict is named at its version.
        err.contains(r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using farm.example.com/v1: .spec.weightKg"#),
        "{err}"
    );
    cluster.ok(
        &["apply", "--server-side", "--force-conflicts", "-f", "-"],
        Some(&llama_yaml(ns, "dolly", 34.0, 0.7)),
    );
    let got: Value = serde_json::from_str(&cluster.ok(
        &[
            "get",
            "llama",
            "dolly",
            "-n",
            ns,
            "-o",
            "json",
            "--show-managed-fields",
        ],
        None,
    ))
    .unwrap();
    assert_eq!(got["spec"]["weightKg"].as_f64(), Some(34.0));
    let managers: Vec<&str> = got["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["manager"].as_str())
        .collect();
    assert!(managers.contains(&"kubectl"), "{managers:?}");
    assert!(!managers.contains(&"kubectl-patch"), "{managers:?}");

    step("kubectl get -w sees a new Llama");
    let mut watch = cluster
        .kubectl()
        .args([
            "get",
            "llamas",
            "-n",
            ns,
            "-w",
            "--output-watch-events",
            "--no-headers",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, watched) = std::sync::mpsc::channel();
    let stdout = watch.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let first = watched.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        first.starts_with("ADDED") && first.contains("dolly"),
        "{first}"
    );
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&llama_yaml(ns, "kuzco", 120.5, 1.7)),
    );
    let next = watched.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(
        next.starts_with("ADDED") && next.contains("kuzco"),
        "{next}"
    );
    let _ = watch.kill();
    let _ = watch.wait();
    let out = cluster.ok(&["delete", "llama", "kuzco", "-n", ns], None);
    assert!(out.contains("\"kuzco\" deleted"), "{out}");
    let (ok, _, err) = cluster.run(&["get", "llama", "kuzco", "-n", ns], None);
    assert!(!ok);
    assert!(
        err.contains("llamas.farm.example.com \"kuzco\" not found"),
        "{err}"
    );

    step("api-resources");
    let out = cluster.ok(&["api-resources", "--api-group", "farm.example.com"], None);
    let llamas = out.lines().find(|l| l.starts_with("llamas")).expect(&out);
    assert_eq!(
        llamas.split_whitespace().collect::<Vec<_>>(),
        ["llamas", "ll", "farm.example.com/v1", "true", "Llama"]
    );
    assert!(out.lines().any(|l| l.starts_with("farmpods")), "{out}");

    step("kube-apiserver's aggregated /apis lists farm.example.com");
    let client = cluster.client().await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let request = http::Request::get("/apis")
            .header(
                "Accept",
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
            )
            .body(Vec::new())
            .unwrap();
        let text = client.request_text(request).await.unwrap();
        let list: Value = serde_json::from_str(&text).unwrap();
        let group = list["items"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["metadata"]["name"] == "farm.example.com")
            .cloned();
        if let Some(group) = group {
            // Both versions, v1 (the higher versionPriority) first.
            let versions: Vec<&str> = group["versions"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v["version"].as_str().unwrap())
                .collect();
            assert_eq!(versions, ["v1", "v1alpha"], "{group}");
            let resources = |at: usize| -> Vec<&str> {
                group["versions"][at]["resources"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r["resource"].as_str().unwrap())
                    .collect()
            };
            assert_eq!(resources(0), ["llamas", "farmpods"]);
            assert!(resources(1).contains(&"llamas") && resources(1).contains(&"farmpods"));
            assert_eq!(group["versions"][1]["freshness"], "Current");
            break;
        }
        assert!(Instant::now() < deadline, "not in /apis: {text}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }

    farmpods_follow_pods(cluster, ns, step, nodes).await;

    step("RBAC: no binding is refused; the built-in view role reads Llamas");
    let (ok, _, err) = cluster.run(&["get", "llamas", "-n", ns, "--as=e2e-nobody"], None);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "llamas.farm.example.com is forbidden: User \"e2e-nobody\" cannot list resource \"llamas\" in API group \"farm.example.com\" in the namespace \"{ns}\""
        )),
        "{err}"
    );
    cluster.ok(
        &[
            "create",
            "rolebinding",
            "e2e-viewer",
            "-n",
            ns,
            "--clusterrole=view",
            "--user=e2e-viewer",
        ],
        None,
    );
    let out = cluster
        .eventually(
            &["get", "llamas", "-n", ns, "--as=e2e-viewer", "-o", "name"],
            Duration::from_secs(60),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("llama.farm.example.com/dolly"), "{out}");
    let (ok, _, err) = cluster.run(
        &["delete", "llama", "dolly", "-n", ns, "--as=e2e-viewer"],
        None,
    );
    assert!(
        !ok && err.contains("forbidden"),
        "view cannot delete: {err}"
    );

    step("kube-rs through kube-apiserver: create, list, watch");
    let llamas: Api<Llama> = Api::namespaced(client.clone(), ns);
    let list = llamas.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items.len(), 1);
    let version = list.metadata.resource_version.clone().unwrap();
    let mut stream = llamas
        .watch(&WatchParams::default().timeout(30), &version)
        .await
        .unwrap()
        .boxed();
    llamas
        .create(
            &PostParams::default(),
            &Llama::new(
                "cuzco",
                LlamaSpec {
                    weight: 90.0,
                    height: 1.5,
                },
            ),
        )
        .await
        .unwrap();
    let event = tokio::time::timeout(Duration::from_secs(20), stream.try_next())
        .await
        .expect("a watch event")
        .unwrap()
        .expect("the stream is open");
    match event {
        WatchEvent::Added(llama) => assert_eq!(llama.metadata.name.as_deref(), Some("cuzco")),
        other => panic!("expected ADDED, got {other:?}"),
    }
    let names: Vec<String> = llamas
        .list(&ListParams::default().labels("!herd"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|l| l.metadata.name)
        .collect();
    assert_eq!(names, ["cuzco"]);

    deletion_with_the_real_controllers(cluster, ns, step).await;
}

/// FarmPods follow the cluster's Pods: Pending without a node; with one, Running with its
/// node, IP, ready count and restarts.
async fn farmpods_follow_pods(cluster: &Cluster, ns: &str, step: &dyn Fn(&str), nodes: Nodes) {
    if nodes == Nodes::Real {
        return crate::e2e_node::farmpods_of_running_pods(cluster, ns, step).await;
    }
    step("FarmPods follow real Pods (no node: Pending)");
    cluster.ok(
        &[
            "run",
            "shepherd",
            "-n",
            ns,
            "--image=registry.invalid/pause:3.10",
            "--labels=app=shepherd",
            "--restart=Never",
        ],
        None,
    );
    let out = cluster
        .eventually(
            &[
                "get",
                "farmpods",
                "-n",
                ns,
                "-l",
                "app=shepherd",
                "-o",
                "wide",
            ],
            Duration::from_secs(30),
            |ok, out, _| ok && out.contains("farm-shepherd"),
        )
        .await;
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "CONTAINERS",
            "READY",
            "STATUS",
            "RESTARTS",
            "AGE",
            "NODE",
            "IP"
        ],
        "{out}"
    );
    assert!(out.contains("Pending"), "{out}");
    cluster.ok(
        &[
            "delete",
            "pod",
            "shepherd",
            "-n",
            ns,
            "--grace-period=0",
            "--force",
        ],
        None,
    );
    cluster
        .eventually(
            &["get", "farmpods", "-n", ns, "-o", "name"],
            Duration::from_secs(30),
            |ok, out, _| ok && !out.contains("farm-shepherd"),
        )
        .await;
}

/// A Llama manifest with finalizers and owners (`ownerReferences` as JSON).
fn owned_llama(namespace: &str, name: &str, finalizers: &[&str], owners: Value) -> String {
    json!({
        "apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": name, "namespace": namespace, "finalizers": finalizers, "ownerReferences": owners},
        "spec": {"weight": 1, "height": 1},
    })
    .to_string()
}

/// Deleting as Kubernetes deletes, with kube-controller-manager's garbage collector and
/// namespace controller doing their part: finalizers hold `kubectl delete --wait`, owners take
/// their dependents (background and foreground) or leave them (orphan), and namespaces refuse
/// new content while they are deleted and finish once a Llama's finalizer goes.
async fn deletion_with_the_real_controllers(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    let gone = |ok: bool, _: &str, err: &str| !ok && err.contains("NotFound");
    let uid = |kind: &str, name: &str| {
        cluster.ok(
            &[
                "get",
                kind,
                name,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.uid}",
            ],
            None,
        )
    };

    step("a finalizer holds kubectl delete --wait until it is removed");
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(
            ns,
            "held",
            &["farm.example.com/hold"],
            json!([]),
        )),
    );
    let mut waiting = cluster.kubectl();
    waiting
        .args(["delete", "llama", "held", "-n", ns, "--timeout=90s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let waiting = waiting.spawn().expect("kubectl delete --wait");
    cluster
        .eventually(
            &[
                "get",
                "llama",
                "held",
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
            Duration::from_secs(30),
            |ok, out, _| ok && !out.is_empty(),
        )
        .await;
    std::thread::sleep(Duration::from_secs(1));
    cluster.ok(&["get", "llama", "held", "-n", ns], None);
    cluster.ok(
        &[
            "patch",
            "llama",
            "held",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    );
    let out = waiting.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "kubectl delete --wait: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (ok, _, err) = cluster.run(&["get", "llama", "held", "-n", ns], None);
    assert!(!ok && err.contains("NotFound"), "{err}");

    step("a Llama owned by a ConfigMap goes with it (background)");
    cluster.ok(&["create", "configmap", "owner", "-n", ns], None);
    let owner = json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid("configmap", "owner")}]);
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(ns, "owned", &[], owner)),
    );
    cluster.ok(&["delete", "configmap", "owner", "-n", ns], None);
    cluster
        .eventually(
            &["get", "llama", "owned", "-n", ns],
            Duration::from_secs(60),
            gone,
        )
        .await;

    step("foreground: the owner Llama waits for its child Llama");
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(ns, "parent", &[], json!([]))),
    );
    let parent = json!([{"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "name": "parent",
        "uid": uid("llama", "parent"), "blockOwnerDeletion": true}]);
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(ns, "kid", &["farm.example.com/hold"], parent)),
    );
    cluster.ok(
        &[
            "delete",
            "llama",
            "parent",
            "-n",
            ns,
            "--cascade=foreground",
            "--wait=false",
        ],
        None,
    );
    let out = cluster.ok(
        &[
            "get",
            "llama",
            "parent",
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.finalizers}",
        ],
        None,
    );
    assert!(out.contains("foregroundDeletion"), "{out}");
    // The collector deletes the child, which its own finalizer holds; the parent waits.
    cluster
        .eventually(
            &[
                "get",
                "llama",
                "kid",
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
            Duration::from_secs(60),
            |ok, out, _| ok && !out.is_empty(),
        )
        .await;
    std::thread::sleep(Duration::from_secs(2));
    cluster.ok(&["get", "llama", "parent", "-n", ns], None);
    cluster.ok(
        &[
            "patch",
            "llama",
            "kid",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    );
    cluster
        .eventually(
            &["get", "llama", "parent", "-n", ns],
            Duration::from_secs(60),
            gone,
        )
        .await;

    step("orphan: the child stays, without its ownerReference");
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(ns, "mother", &[], json!([]))),
    );
    let mother = json!([{"apiVersion": "farm.example.com/v1alpha", "kind": "Llama", "name": "mother", "uid": uid("llama", "mother")}]);
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(ns, "orphan", &[], mother)),
    );
    cluster.ok(
        &[
            "delete",
            "llama",
            "mother",
            "-n",
            ns,
            "--cascade=orphan",
            "--timeout=60s",
        ],
        None,
    );
    cluster
        .eventually(
            &[
                "get",
                "llama",
                "orphan",
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.ownerReferences}",
            ],
            Duration::from_secs(60),
            |ok, out, _| ok && out.is_empty(),
        )
        .await;
    std::thread::sleep(Duration::from_secs(3));
    cluster.ok(&["get", "llama", "orphan", "-n", ns], None);

    step("namespaces: none missing, none terminating; one held by a Llama finishes");
    let (ok, _, err) = cluster.run(
        &["apply", "-f", "-"],
        Some(&owned_llama("farm-e2e-ghost", "boo", &[], json!([]))),
    );
    assert!(
        !ok && err.contains("namespaces \"farm-e2e-ghost\" not found"),
        "{err}"
    );
    let ending = format!("{ns}-ending");
    cluster.ok(&["create", "namespace", &ending], None);
    cluster.ok(
        &["apply", "-f", "-"],
        Some(&owned_llama(
            &ending,
            "anchor",
            &["farm.example.com/hold"],
            json!([]),
        )),
    );
    cluster.ok(&["delete", "namespace", &ending, "--wait=false"], None);
    // The namespace controller deletes the Llama, which its finalizer holds.
    cluster
        .eventually(
            &[
                "get",
                "llama",
                "anchor",
                "-n",
                &ending,
                "-o",
                "jsonpath={.metadata.deletionTimestamp}",
            ],
            Duration::from_secs(60),
            |ok, out, _| ok && !out.is_empty(),
        )
        .await;
    let (ok, _, err) = cluster.run(
        &["apply", "-f", "-"],
        Some(&owned_llama(&ending, "late", &[], json!([]))),
    );
    assert!(
        !ok && err.contains(&format!(
            "unable to create new content in namespace {ending} because it is being terminated"
        )),
        "{err}"
    );
    cluster.ok(
        &[
            "patch",
            "llama",
            "anchor",
            "-n",
            &ending,
            "--type",
            "merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
        None,
    );
    cluster
        .eventually(
            &["get", "namespace", &ending],
            Duration::from_secs(90),
            |ok, _, err| !ok && err.contains("NotFound"),
        )
        .await;
}

/// Webhook configurations the test applied; deleted when dropped (they are cluster-wide).
struct Configured<'a> {
    cluster: &'a Cluster,
    names: Vec<(&'static str, String)>,
}

impl Drop for Configured<'_> {
    fn drop(&mut self) {
        for (kind, name) in &self.names {
            let _ = self
                .cluster
                .run(&["delete", kind, name, "--ignore-not-found"], None);
        }
    }
}

/// The cluster's admission webhooks, configured with kubectl as for any kind, reach Llama
/// writes through the aggregator (#28): a validating webhook (namespaceSelector on the real
/// namespace's labels) refuses with its message and sees the kubectl user and dry runs; a
/// mutating webhook's patch is stored; failurePolicy Fail refuses while a webhook is down;
/// deleting the configurations stops the calls within seconds.
async fn webhooks_configured_with_kubectl(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    use crate::admission::{Webhook, allow, deny, mutating, patch, validating};
    step("admission webhooks on loopback, configured with kubectl");
    let validator = Webhook::start().await;
    validator.answer(|request| {
        if request["object"]["spec"]["weight"].as_f64() > Some(100.0) {
            deny(403, "too heavy")
        } else {
            allow()
        }
    });
    let mutator = Webhook::start().await;
    mutator.answer(|_| {
        patch(json!([{"op": "add", "path": "/metadata/labels/mutated", "value": "yes"}]))
    });
    let suffix = std::process::id();
    let in_namespace = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
    // It names v1alpha only: v1 writes reach it converted (matchPolicy Equivalent).
    let mut weight = validating(
        &format!("farm-e2e-weight-{suffix}"),
        json!({"name": "weight.farm.example.com", "clientConfig": validator.client_config("/validate"),
               "rules": [{"apiGroups": ["farm.example.com"], "apiVersions": ["v1alpha"],
                          "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}],
               "matchConditions": [{"name": "heavy", "expression": "object.spec.weight > 100"}],
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchExpressions": [{"key": "hook", "operator": "DoesNotExist"}]}}),
    );
    let mut label = mutating(
        &format!("farm-e2e-label-{suffix}"),
        json!({"name": "label.farm.example.com", "clientConfig": mutator.client_config("/mutate"),
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchLabels": {"hook": "mutate"}}}),
    );
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let down_port = closed.local_addr().unwrap().port();
    drop(closed);
    let mut down = validating(
        &format!("farm-e2e-down-{suffix}"),
        json!({"name": "down.farm.example.com",
               "clientConfig": {"url": format!("https://127.0.0.1:{down_port}/down")},
               "namespaceSelector": in_namespace,
               "objectSelector": {"matchLabels": {"hook": "down"}}}),
    );
    for configuration in [&mut weight, &mut label, &mut down] {
        configuration["metadata"]["labels"] = json!({"farm-e2e": "true"});
    }
    let configured = Configured {
        cluster,
        names: vec![
            (
                "validatingwebhookconfiguration",
                weight["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
            (
                "mutatingwebhookconfiguration",
                label["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
            (
                "validatingwebhookconfiguration",
                down["metadata"]["name"].as_str().unwrap().to_owned(),
            ),
        ],
    };
    let list = json!({"apiVersion": "v1", "kind": "List", "items": [weight, label, down]});
    // kubectl validates this List against the cluster's OpenAPI v2, which kube-apiserver
    // serves only while ours is valid Swagger 2.0.
    cluster.ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let llama = |name: &str, weight: f64, labels: Value| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns, "labels": labels},
               "spec": {"weight": weight, "height": 1.0}})
        .to_string()
    };
    step("a validating webhook refuses a heavy Llama (once the server has the configuration)");
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, out, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("heavy", 500.0, json!({}))),
        );
        if !ok {
            break err;
        }
        assert!(
            Instant::now() < deadline,
            "the webhook was never called: {out}"
        );
        cluster.ok(&["delete", "llama", "heavy", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(
            "admission webhook \"weight.farm.example.com\" denied the request: too heavy"
        ),
        "{refused}"
    );
    let review = validator.seen().pop().unwrap();
    assert_eq!(
        review["request"]["userInfo"]["username"], "lab-admin",
        "the kubectl user, from the front proxy"
    );
    assert_eq!(review["request"]["namespace"], ns);

    step("its matchCondition leaves light Llamas alone; a server-side dry run is sent as one");
    let calls = validator.seen().len();
    cluster.ok(
        &["create", "-f", "-"],
        Some(&llama("light", 5.0, json!({}))),
    );
    assert_eq!(
        validator.seen().len(),
        calls,
        "a false matchCondition skips the webhook"
    );
    let (ok, _, err) = cluster.run(
        &["create", "--dry-run=server", "-f", "-"],
        Some(&llama("dry", 500.0, json!({}))),
    );
    assert!(!ok && err.contains("too heavy"), "{err}");
    assert_eq!(validator.seen().pop().unwrap()["request"]["dryRun"], true);

    step(
        "the webhook names v1alpha only: a v1 write reaches it at v1alpha (matchPolicy Equivalent)",
    );
    let v1 = json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
                    "metadata": {"name": "heavy-v1", "namespace": ns},
                    "spec": {"weightKg": 500.0, "heightMetres": 1.0}});
    let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&v1.to_string()));
    assert!(!ok && err.contains("too heavy"), "{err}");
    let request = validator.seen().pop().unwrap()["request"].clone();
    assert_eq!(request["kind"]["version"], "v1alpha", "{request}");
    assert_eq!(request["requestKind"]["version"], "v1", "{request}");
    assert_eq!(request["object"]["spec"]["weight"].as_f64(), Some(500.0));

    step("a mutating webhook's patch is stored");
    cluster.ok(
        &["create", "-f", "-"],
        Some(&llama("marked", 5.0, json!({"hook": "mutate"}))),
    );
    let labels = cluster.ok(
        &[
            "get",
            "llama",
            "marked",
            "-n",
            ns,
            "-o",
            "jsonpath={.metadata.labels.mutated}",
        ],
        None,
    );
    assert_eq!(labels, "yes");

    step("failurePolicy Fail: refused while the webhook is down");
    let (ok, _, err) = cluster.run(
        &["create", "-f", "-"],
        Some(&llama("unchecked", 5.0, json!({"hook": "down"}))),
    );
    assert!(!ok);
    assert!(
        err.contains("failed calling webhook \"down.farm.example.com\""),
        "{err}"
    );

    step("failurePolicy Ignore: the same write goes through while the webhook is down");
    cluster.ok(
        &[
            "patch",
            "validatingwebhookconfiguration",
            &format!("farm-e2e-down-{suffix}"),
            "--type",
            "json",
            "-p",
            r#"[{"op":"replace","path":"/webhooks/0/failurePolicy","value":"Ignore"}]"#,
        ],
        None,
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("unchecked", 5.0, json!({"hook": "down"}))),
        );
        if ok {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still refused under Ignore: {err}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    step("configurations deleted: no more calls");
    drop(configured);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let calls = validator.seen().len();
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-"],
            Some(&llama("late", 500.0, json!({}))),
        );
        if ok && validator.seen().len() == calls {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still called after its configuration went: {err}"
        );
        let _ = cluster.run(
            &["delete", "llama", "late", "-n", ns, "--ignore-not-found"],
            None,
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ValidatingAdmissionPolicy with a ConfigMap param, applied with kubectl as for any kind,
/// reaches Llama writes through the aggregator (#28): it denies with its message, allows
/// otherwise, follows its param, and stops when its binding goes.
async fn policies_configured_with_kubectl(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    step("a ValidatingAdmissionPolicy with a ConfigMap param, applied with kubectl");
    let suffix = std::process::id();
    let policy_name = format!("farm-e2e-max-weight-{suffix}");
    let binding_name = format!("farm-e2e-max-weight-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "limits", "namespace": ns},
         "data": {"maxWeight": "100"}},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": policy_name},
         "spec": {
             "failurePolicy": "Fail",
             "paramKind": {"apiVersion": "v1", "kind": "ConfigMap"},
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
             "validations": [{
                 "expression": "object.spec.weight <= double(params.data.maxWeight)",
                 "messageExpression": "'weight ' + string(object.spec.weight) + ' is over ' + params.data.maxWeight",
             }],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": binding_name},
         "spec": {
             "policyName": policy_name,
             "paramRef": {"name": "limits", "namespace": ns, "parameterNotFoundAction": "Deny"},
             "validationActions": ["Deny"],
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let configured = Configured {
        cluster,
        names: vec![
            ("validatingadmissionpolicybinding", binding_name.clone()),
            ("validatingadmissionpolicy", policy_name.clone()),
        ],
    };
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str, weight: f64| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": weight, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("over", 500.0)));
        if !ok {
            break err;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        cluster.ok(&["delete", "llama", "over", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(&format!(
            "ValidatingAdmissionPolicy '{policy_name}' with binding '{binding_name}' denied request: weight 500 is over 100"
        )),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("under", 50.0)));

    step("the param raised: the same Llama is allowed");
    cluster.ok(
        &[
            "patch",
            "configmap",
            "limits",
            "-n",
            ns,
            "--type",
            "merge",
            "-p",
            r#"{"data":{"maxWeight":"1000"}}"#,
        ],
        None,
    );
    // Params are watched: the change applies once the watch brings it.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("over", 500.0)));
        if ok {
            break;
        }
        assert!(Instant::now() < deadline, "{err}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    step("the policy's binding deleted: nothing is refused");
    drop(configured);
    cluster
        .eventually(
            &["get", "validatingadmissionpolicybinding", &binding_name],
            Duration::from_secs(10),
            |ok, _, _| !ok,
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cluster
        .run(&["create", "-f", "-"], Some(&llama("huge", 5000.0)))
        .0
    {
        assert!(
            Instant::now() < deadline,
            "still refused after the binding went"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A ValidatingAdmissionPolicy whose `authorizer` asks kube-apiserver's RBAC (through the
/// server's SubjectAccessReviews) whether the writing user may `approve` Llamas: a user the
/// built-in `edit` role lets create Llamas (kube-apiserver impersonating it, `--as`) is
/// refused for want of `approve`; `system:masters` may.
async fn a_policy_asks_the_authorizer(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    step("a ValidatingAdmissionPolicy asks the authorizer (RBAC through SubjectAccessReviews)");
    let suffix = std::process::id();
    let name = format!("farm-e2e-approvers-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {
             "failurePolicy": "Fail",
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE"], "resources": ["llamas"]}]},
             "validations": [{
                 "expression": "authorizer.requestResource.check('approve').allowed()",
                 "messageExpression": "request.userInfo.username + ' may not approve llamas'",
             }],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {
             "policyName": name,
             "validationActions": ["Deny"],
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let _configured = Configured {
        cluster,
        names: vec![
            ("validatingadmissionpolicybinding", name.clone()),
            ("validatingadmissionpolicy", name.clone()),
        ],
    };
    cluster.ok(
        &[
            "create",
            "rolebinding",
            "e2e-editor",
            "-n",
            ns,
            "--clusterrole=edit",
            "--user=e2e-editor",
        ],
        None,
    );
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": 10.0, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let refused = loop {
        let (ok, _, err) = cluster.run(
            &["create", "-f", "-", "--as=e2e-editor"],
            Some(&llama("unapproved")),
        );
        if !ok && err.contains("may not approve") {
            break err;
        }
        assert!(Instant::now() < deadline, "never refused: {err}");
        if ok {
            cluster.ok(&["delete", "llama", "unapproved", "-n", ns], None);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(&format!(
            "ValidatingAdmissionPolicy '{name}' with binding '{name}' denied request: e2e-editor may not approve llamas"
        )),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("approved")));
}

/// A MutatingAdmissionPolicy applied with kubectl, exactly as for a built-in kind: its apply
/// configuration adds a label to every Llama created in the namespace, until its binding goes.
async fn mutating_policies_configured_with_kubectl(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
    step("a MutatingAdmissionPolicy applied with kubectl adds a label");
    let suffix = std::process::id();
    let name = format!("farm-e2e-stamp-{suffix}");
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
         "metadata": {"name": name},
         "spec": {
             "failurePolicy": "Fail",
             "reinvocationPolicy": "IfNeeded",
             "matchConstraints": {"resourceRules": [{"apiGroups": ["farm.example.com"],
                 "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"], "resources": ["llamas"]}]},
             "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {"expression":
                 "Object{metadata: Object.metadata{labels: {'farm.example.com/stamped': string(int(object.spec.height * 100.0))}}}"}}],
         }},
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
         "metadata": {"name": name},
         "spec": {
             "policyName": name,
             "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}},
         }},
    ]});
    let configured = Configured {
        cluster,
        names: vec![
            ("mutatingadmissionpolicybinding", name.clone()),
            ("mutatingadmissionpolicy", name.clone()),
        ],
    };
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    let llama = |name: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns},
               "spec": {"weight": 5.0, "height": 1.0}})
        .to_string()
    };
    let label = |name: &str| {
        let (_, out, _) = cluster.run(
            &[
                "get",
                "llama",
                name,
                "-n",
                ns,
                "-o",
                "jsonpath={.metadata.labels.farm\\.example\\.com/stamped}",
            ],
            None,
        );
        out.trim().to_owned()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    loop {
        let created = format!("stamped-{attempt}");
        cluster.ok(&["create", "-f", "-"], Some(&llama(&created)));
        if label(&created) == "100" {
            break;
        }
        assert!(Instant::now() < deadline, "the policy never applied");
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    step("the MutatingAdmissionPolicy's binding deleted: Llamas are stored as sent");
    drop(configured);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut attempt = 0;
    loop {
        let created = format!("plain-{attempt}");
        cluster.ok(&["create", "-f", "-"], Some(&llama(&created)));
        if label(&created).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still mutated after the binding went"
        );
        attempt += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A validating webhook reached through a Service, as on the lab: an ExternalName Service
/// (`localhost`) at the webhook's port, its certificate for `<service>.<namespace>.svc`.
async fn webhook_through_a_service(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    use crate::admission::{Webhook, allow, deny, validating};
    step("a validating webhook reached through an ExternalName Service");
    let service = "farm-e2e-hook";
    let hook = Webhook::start_for(&[&format!("{service}.{ns}.svc")]).await;
    hook.answer(|request| {
        if request["object"]["metadata"]["labels"]["service-hook"] == "deny" {
            deny(403, "refused through the service")
        } else {
            allow()
        }
    });
    let name = format!("farm-e2e-service-{}", std::process::id());
    let configuration = validating(
        &name,
        json!({"name": "service.farm.example.com",
               "clientConfig": hook.service_config(ns, service, "/validate"),
               "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
               "objectSelector": {"matchExpressions": [{"key": "service-hook", "operator": "Exists"}]}}),
    );
    let service_object = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": service, "namespace": ns},
        "spec": {"type": "ExternalName", "externalName": "localhost",
                 "ports": [{"port": hook.port()}]}});
    let _configured = Configured {
        cluster,
        names: vec![("validatingwebhookconfiguration", name.clone())],
    };
    let list =
        json!({"apiVersion": "v1", "kind": "List", "items": [service_object, configuration]});
    cluster.ok(&["apply", "-f", "-"], Some(&list.to_string()));
    let llama = |name: &str, verdict: &str| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": name, "namespace": ns, "labels": {"service-hook": verdict}},
               "spec": {"weight": 5.0, "height": 1.0}})
        .to_string()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let refused = loop {
        let (ok, _, err) = cluster.run(&["create", "-f", "-"], Some(&llama("svc-deny", "deny")));
        if !ok {
            break err;
        }
        assert!(Instant::now() < deadline, "the webhook was never called");
        cluster.ok(&["delete", "llama", "svc-deny", "-n", ns], None);
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(
        refused.contains(
            "admission webhook \"service.farm.example.com\" denied the request: refused through the service"
        ),
        "{refused}"
    );
    cluster.ok(&["create", "-f", "-"], Some(&llama("svc-allow", "allow")));
    assert!(hook.seen().len() >= 2);
}
