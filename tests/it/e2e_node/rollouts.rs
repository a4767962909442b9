//! Load and availability while the Deployment rolls, and FarmPods of the node's running Pods.

use super::*;

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
pub(super) async fn rolling_update(
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
