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
use crate::e2e_cluster::{Cluster, Nodes, suite};

const API_SERVICE: &str = "v1alpha.farm.example.com";
const NS: &str = "farm-system";
const SELECTOR: &str = "app.kubernetes.io/name=farm-apiserver";

/// `tests/node/image.py` with `args`; how long it took.
fn image(args: &[&str]) -> Duration {
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

/// What the test applied; removed when dropped, the APIService first.
struct Applied<'a> {
    cluster: &'a Cluster,
    overlay: PathBuf,
    namespace: String,
}

impl Drop for Applied<'_> {
    fn drop(&mut self) {
        let c = self.cluster;
        let _ = c.run(
            &["delete", "apiservice", API_SERVICE, "--ignore-not-found"],
            None,
        );
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
        let overlay = self.overlay.to_string_lossy().into_owned();
        let _ = c.run(
            &[
                "delete",
                "-k",
                &overlay,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// The server's Pods (JSON), oldest first.
fn server_pods(cluster: &Cluster) -> Vec<Value> {
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
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let nodes = cluster.ready_nodes();
    if nodes.is_empty() {
        eprintln!(
            "SKIPPED: the cluster of FARM_E2E_KUBECONFIG has no Ready node (the lab: up.sh --node)"
        );
        return;
    }
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let mut timings: Vec<(&str, Duration)> = Vec::new();

    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.run(&["get", "namespace", NS], None).0 {
        assert!(
            Instant::now() < deadline,
            "namespace {NS} from an earlier run is still there"
        );
        step("waiting for an earlier run's namespace farm-system to go");
        std::thread::sleep(Duration::from_secs(2));
    }

    step("the image, as the Dockerfile's final stage (tests/node/image.py)");
    let tag = format!("e2e-{}", std::process::id());
    timings.push(("image build and import", image(&["--tag", &tag])));
    let binary = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/farm-apiserver");
    let next_tag = format!("{tag}-next");
    image(&["--tag", &next_tag, "--binary", binary]);

    step("certificates, and the overlay that changes only the image");
    let rendered = install::render(None);
    let overlay = rendered.dir.path().join("tests/node/overlay");
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
    let namespace = format!("farm-node-e2e-{}", std::process::id());
    let applied = Applied {
        cluster: &cluster,
        overlay: overlay.clone(),
        namespace: namespace.clone(),
    };
    let applying = Instant::now();
    let overlay_arg = overlay.to_string_lossy().into_owned();
    cluster.ok(&["apply", "-k", &overlay_arg], None);

    step("the Pod becomes Ready through its HTTPS probes");
    cluster.ok(
        &[
            "rollout",
            "status",
            "deployment/farm-apiserver",
            "-n",
            NS,
            "--timeout=180s",
        ],
        None,
    );
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
    cluster
        .eventually(
            &[
                "get",
                "apiservice",
                API_SERVICE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
            Duration::from_secs(120),
            |_, out, _| out == "True",
        )
        .await;
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

    step("cleaning up: the APIService first");
    drop(applied);
    let (_, out, _) = cluster.run(&["get", "apiservice", API_SERVICE], None);
    assert!(out.is_empty(), "APIService removed: {out}");
    for (what, took) in &timings {
        eprintln!("  {what:<36} {:>7.1}s", took.as_secs_f64());
    }
    drop(rendered);
    step("done");
}

/// Rolls the Deployment to the image `tag` while a client reads and writes Llamas through
/// kube-apiserver: (failed requests, requests, time the APIService was not Available, rollout
/// duration).
async fn rolling_update(
    cluster: &Cluster,
    ns: &str,
    tag: &str,
) -> (usize, usize, Duration, Duration) {
    use farm_apiserver::resources::{Llama, LlamaSpec};
    use kube::{Api, api::PostParams};

    let client = cluster.client().await;
    let llamas: Api<Llama> = Api::namespaced(client, ns);
    let apiservices: Api<kube::api::DynamicObject> = Api::all_with(
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
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let (mut failed, mut total) = (0, 0);
            let report = |what: &str, error: kube::Error| {
                eprintln!("  during the rollout, {what} failed: {error}");
            };
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i += 1;
                let name = format!("roll-{i}");
                let llama = Llama::new(
                    &name,
                    LlamaSpec {
                        weight: 1.0,
                        height: 1.0,
                    },
                );
                total += 2;
                if let Err(error) = llamas.create(&PostParams::default(), &llama).await {
                    report(&format!("create {name}"), error);
                    failed += 1;
                }
                if let Err(error) = llamas.get(&name).await {
                    report(&format!("get {name}"), error);
                    failed += 1;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (failed, total)
        })
    };
    let watch_available = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut unavailable = Duration::ZERO;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let at = Instant::now();
                let available = apiservices.get(API_SERVICE).await.ok().is_some_and(|a| {
                    a.data["status"]["conditions"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|c| c["type"] == "Available" && c["status"] == "True")
                });
                tokio::time::sleep(Duration::from_millis(100)).await;
                if !available {
                    unavailable += at.elapsed();
                }
            }
            unavailable
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
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
    cluster.ok(
        &[
            "rollout",
            "status",
            "deployment/farm-apiserver",
            "-n",
            NS,
            "--timeout=180s",
        ],
        None,
    );
    let rollout = rolling.elapsed();
    // Until the old Pod has gone and the APIService has settled.
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (failed, total) = load.await.unwrap();
    let unavailable = watch_available.await.unwrap();
    let pods = server_pods(cluster);
    assert!(
        pods.iter()
            .all(|p| p["spec"]["containers"][0]["image"] == format!("farm-apiserver:{tag}")),
        "rolled to {tag}"
    );
    (failed, total, unavailable, rollout)
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
