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
use rollouts::rolling_update;
pub(crate) use rollouts::{Availability, Load, farmpods_of_running_pods, roll_to};

pub(crate) use etcd_pods::{etcd_image, etcd_pod, mkimage};
mod etcd_pods;
mod rollouts;
