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
use admission::{
    a_policy_asks_the_authorizer, mutating_policies_configured_with_kubectl,
    policies_configured_with_kubectl, webhook_through_a_service, webhooks_configured_with_kubectl,
};
use deletion::deletion_with_the_real_controllers;
pub(crate) use suite::{Nodes, suite};
use versions_and_audit::{
    apiserver_audit_and_trace_join, audit_ids_join, versions_through_the_aggregator,
};

mod admission;
mod deletion;
mod suite;
mod versions_and_audit;
