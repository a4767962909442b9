//! The Helm chart installed by a real helm on a real node (the lab's `up.sh --node`): `helm
//! install --wait` and the APIServices Available, `helm test`, `helm upgrade` to a new image
//! keeping the self-signed CA with the APIService Available throughout, `helm rollback`,
//! `helm uninstall` leaving nothing behind; then `storage.type=etcd` with two replicas on an
//! etcd Pod: an upgrade under reads and writes with no failed request, and every acknowledged
//! Llama still there after every replica was replaced. A wrong value is refused by `helm
//! install` before anything reaches the cluster.
//!
//! Runs when `FARM_E2E_KUBECONFIG` names a cluster with a Ready node and helm is at hand
//! (PATH or `scripts/install-helm.sh`); skipped with a printed reason otherwise.

use std::{
    path::PathBuf,
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::common::install;
use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME};
use crate::e2e_node::{
    Availability, Load, NS, etcd_image, etcd_pod, image, mkimage, wait_for_earlier_runs, with_node,
};
use crate::helm::CHART;

const RELEASE: &str = "farm-apiserver";
const INSTANCE: &str = "app.kubernetes.io/instance=farm-apiserver";

/// helm against the test's cluster; the release is uninstalled (and its namespace deleted)
/// when dropped, on failure too.
struct Helm<'a> {
    helm: PathBuf,
    cluster: &'a Cluster,
}

impl Helm<'_> {
    /// helm with `args`: (success, stdout, stderr).
    fn run(&self, args: &[&str]) -> (bool, String, String) {
        let out = Command::new(&self.helm)
            .args(args)
            .args(["--namespace", NS])
            .env("KUBECONFIG", self.cluster.kubeconfig())
            .output()
            .expect("run helm");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.run(args);
        assert!(ok, "helm {}: {err}{out}", args.join(" "));
        out
    }

    /// `helm install` or `helm upgrade` of the chart with `values`, waiting for its objects.
    fn deploy(&self, verb: &str, values: &[String]) -> Duration {
        let started = Instant::now();
        let mut args = vec![verb, RELEASE, CHART, "--wait", "--timeout=180s"];
        if verb == "install" {
            args.push("--create-namespace");
        }
        args.extend(values.iter().map(String::as_str));
        self.ok(&args);
        started.elapsed()
    }
}

impl Drop for Helm<'_> {
    fn drop(&mut self) {
        let _ = self.run(&["uninstall", RELEASE, "--wait", "--timeout=120s"]);
        for api_service in farm_apiserver::certs::API_SERVICES {
            let _ = self.cluster.run(
                &["delete", "apiservice", api_service, "--ignore-not-found"],
                None,
            );
        }
        let _ = self.cluster.run(
            &[
                "delete",
                "namespace",
                NS,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}

/// The kubectl of PATH as the image `registry.k8s.io/kubectl:<its version>` (what the chart's
/// test Pod runs), imported into the node; its tag.
fn kubectl_image() -> String {
    let version: Value = serde_json::from_slice(
        &Command::new("kubectl")
            .args(["version", "--client", "-o", "json"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let tag = version["clientVersion"]["gitVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    let found = Command::new("sh")
        .args(["-c", "command -v kubectl"])
        .output()
        .unwrap();
    let kubectl = String::from_utf8_lossy(&found.stdout).trim().to_owned();
    let root = tempfile::tempdir().unwrap();
    for dir in ["bin", "tmp", "etc"] {
        std::fs::create_dir_all(root.path().join(dir)).unwrap();
    }
    std::fs::copy(&kubectl, root.path().join("bin/kubectl")).unwrap();
    std::fs::write(
        root.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
    )
    .unwrap();
    let made = Command::new("python3")
        .arg(mkimage())
        .arg("--rootfs")
        .arg(root.path())
        .args(["--entrypoint", "/bin/kubectl", "--user", "65532:65532"])
        .arg(format!("registry.k8s.io/kubectl:{tag}"))
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    tag
}

/// The caBundle of the preferred version's APIService.
fn ca_bundle(cluster: &Cluster) -> String {
    cluster.ok(
        &[
            "get",
            "apiservice",
            farm_apiserver::certs::API_SERVICES[0],
            "-o",
            "jsonpath={.spec.caBundle}",
        ],
        None,
    )
}

/// What a release leaves in the cluster: its objects anywhere, by its instance label and the
/// APIServices by name.
fn left_behind(cluster: &Cluster) -> Vec<String> {
    let mut left = Vec::new();
    for (kinds, namespace) in [
        (
            "apiservices,clusterroles,clusterrolebindings,flowschemas,prioritylevelconfigurations",
            None,
        ),
        ("rolebindings", Some("kube-system")),
        (
            "deployments,replicasets,services,serviceaccounts,secrets,configmaps,rolebindings,\
             poddisruptionbudgets,networkpolicies",
            Some(NS),
        ),
    ] {
        let mut args = vec!["get", kinds, "-l", INSTANCE, "-o", "name"];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        let (_, out, _) = cluster.run(&args, None);
        left.extend(out.lines().map(str::to_owned));
    }
    for api_service in farm_apiserver::certs::API_SERVICES {
        let (found, _, _) = cluster.run(&["get", "apiservice", api_service], None);
        if found {
            left.push(format!("apiservice/{api_service}"));
        }
    }
    left
}

#[tokio::test]
async fn helm_install_upgrade_rollback_uninstall_on_a_real_node() {
    let Some(cluster) = with_node() else {
        return;
    };
    let Some(helm) = install::helm() else {
        eprintln!("SKIPPED: no helm on PATH or in target/helm/bin (scripts/install-helm.sh)");
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    wait_for_earlier_runs(&cluster, &step).await;

    let id = std::process::id();
    let tag = format!("helm-{id}");
    let next_tag = format!("{tag}-next");
    step("images: farm-apiserver twice (tests/node/image.py), kubectl for helm test, etcd");
    image(&["--tag", &tag]);
    let binary = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/farm-apiserver");
    image(&["--tag", &next_tag, "--binary", binary]);
    let kubectl_tag = kubectl_image();
    let etcd_image = etcd_image(id);

    let release = Helm {
        helm,
        cluster: &cluster,
    };
    let values = |image_tag: &str, more: &[String]| -> Vec<String> {
        [
            format!("image.tag={image_tag}"),
            "image.pullPolicy=Never".into(),
            format!("tests.image.tag={kubectl_tag}"),
            "tests.image.pullPolicy=Never".into(),
        ]
        .into_iter()
        .chain(more.iter().cloned())
        .flat_map(|s| ["--set".to_owned(), s])
        .collect()
    };

    step("a wrong value is refused by helm install, before anything reaches the cluster");
    for (set, message) in [
        (
            "replicaCount=-1",
            "at '/replicaCount': minimum: got -1, want 1",
        ),
        (
            "storage.type=disk",
            "at '/storage/type': value must be one of 'memory', 'etcd'",
        ),
    ] {
        let (ok, out, err) = release.run(&[
            "install",
            RELEASE,
            CHART,
            "--create-namespace",
            "--set",
            set,
        ]);
        assert!(!ok, "--set {set} installed: {out}");
        assert!(err.contains(message), "--set {set}: {err}");
    }
    assert!(
        left_behind(&cluster).is_empty(),
        "{:?}",
        left_behind(&cluster)
    );

    step("helm install --wait with the defaults (memory, selfSigned)");
    timings.push((
        "helm install --wait",
        release.deploy("install", &values(&tag, &[])),
    ));
    timings.push(("  then APIServices Available", cluster.available().await));
    let ca = ca_bundle(&cluster);
    assert!(!ca.is_empty(), "the chart's CA is the caBundle");

    step("helm test: the test Pod waits for the APIServices and reads as `view`");
    let tested = Instant::now();
    let out = release.ok(&["test", RELEASE, "--logs", "--timeout=180s"]);
    timings.push(("helm test", tested.elapsed()));
    assert!(out.contains("Phase:          Succeeded"), "{out}");
    assert!(out.contains("condition met"), "{out}");
    let llama = serde_json::json!({
        "apiVersion": "farm.example.com/v1", "kind": "Llama",
        "metadata": {"name": "helm", "namespace": "default"},
        "spec": {"weightKg": 80.0, "heightMetres": 1.7},
    });
    cluster.ok(&["apply", "-f", "-"], Some(&llama.to_string()));

    step("helm upgrade to a new image: the same CA, the APIService Available throughout");
    let availability = Availability::watch(&cluster).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    timings.push((
        "helm upgrade (image)",
        release.deploy("upgrade", &values(&next_tag, &[])),
    ));
    // Until the old Pod has gone (its shutdown delay).
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (unavailable, seen_false) = availability.stop().await;
    assert_eq!(ca_bundle(&cluster), ca, "helm upgrade keeps the CA");
    assert_eq!(
        seen_false,
        0,
        "the APIService stays Available through helm upgrade ({:.1}s not)",
        unavailable.as_secs_f64()
    );
    let images = cluster.ok(
        &[
            "get",
            "deployment",
            RELEASE,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.template.spec.containers[0].image}",
        ],
        None,
    );
    assert_eq!(images, format!("farm-apiserver:{next_tag}"));

    step("helm rollback to the first revision");
    let rolling = Instant::now();
    release.ok(&["rollback", RELEASE, "1", "--wait", "--timeout=180s"]);
    timings.push(("helm rollback --wait", rolling.elapsed()));
    cluster.available().await;
    assert_eq!(ca_bundle(&cluster), ca, "helm rollback keeps the CA");
    let history = release.ok(&["history", RELEASE, "-o", "json"]);
    let history: Value = serde_json::from_str(&history).unwrap();
    assert_eq!(history.as_array().unwrap().len(), 3, "{history}");

    step("helm uninstall leaves nothing behind");
    let removing = Instant::now();
    release.ok(&["uninstall", RELEASE, "--wait", "--timeout=120s"]);
    timings.push(("helm uninstall --wait", removing.elapsed()));
    assert!(
        left_behind(&cluster).is_empty(),
        "{:?}",
        left_behind(&cluster)
    );
    // The Pods go after their shutdown delay and grace (the garbage collector deletes them
    // once their ReplicaSet is gone).
    let pods = ["get", "pods", "-n", NS, "-l", INSTANCE, "-o", "name"];
    cluster
        .eventually(&pods, Duration::from_secs(90), |ok, out, _| {
            ok && out.trim().is_empty()
        })
        .await;
    // Discovery still works for every client: no APIService points nowhere.
    cluster.ok(&["api-resources", "-o", "name"], None);

    step("storage.type=etcd: two replicas on an etcd Pod");
    let certs = tempfile::tempdir().unwrap();
    let etcd = etcd_pod(
        &cluster,
        &format!("farm-helm-etcd-{id}"),
        &etcd_image,
        certs.path(),
    );
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "farm-apiserver-etcd", "namespace": NS},
        "stringData": {
            "ca.crt": std::fs::read_to_string(certs.path().join("ca.crt")).unwrap(),
            "tls.crt": std::fs::read_to_string(certs.path().join("client.crt")).unwrap(),
            "tls.key": std::fs::read_to_string(certs.path().join("client.key")).unwrap(),
        },
    });
    cluster.ok(&["apply", "-f", "-"], Some(&secret.to_string()));
    let etcd_values = [
        "storage.type=etcd".to_owned(),
        "replicaCount=2".to_owned(),
        format!("storage.etcd.servers={{https://{}:2379}}", etcd.ip),
    ];
    timings.push((
        "helm install --wait (etcd)",
        release.deploy("install", &values(&tag, &etcd_values)),
    ));
    cluster.available().await;
    let llamas_ns = format!("farm-helm-e2e-{id}");
    cluster.ok(&["create", "namespace", &llamas_ns], None);
    // Known to both replicas' namespace caches before writes go in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before: Vec<String> = crate::e2e_node::server_pods(&cluster)
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(before.len(), 2, "{before:?}");

    step("helm upgrade of both replicas to a new image under reads and writes");
    let load = Load::start(&cluster, &llamas_ns, "helm").await;
    let availability = Availability::watch(&cluster).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    timings.push((
        "helm upgrade (etcd, 2 replicas)",
        release.deploy("upgrade", &values(&next_tag, &etcd_values)),
    ));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let loaded = load.stop().await;
    let (unavailable, seen_false) = availability.stop().await;
    let after: Vec<String> = crate::e2e_node::server_pods(&cluster)
        .iter()
        .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "every replica was replaced: {before:?} -> {after:?}"
    );
    let listed = cluster.ok(
        &[
            "get",
            "llamas",
            "-n",
            &llamas_ns,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    let names: std::collections::HashSet<&str> = listed.split_whitespace().collect();
    let lost: Vec<&String> = loaded
        .acknowledged
        .iter()
        .filter(|n| !names.contains(n.as_str()))
        .collect();
    eprintln!(
        "helm upgrade, 2 replicas on etcd: {} of {} requests failed, {} Llamas written, {} lost, \
         APIService not Available in {seen_false} polls ({:.1}s)",
        loaded.failed,
        loaded.total,
        loaded.acknowledged.len(),
        lost.len(),
        unavailable.as_secs_f64()
    );
    release.ok(&["test", RELEASE, "--timeout=180s"]);

    step("helm uninstall (etcd) leaves nothing behind");
    release.ok(&["uninstall", RELEASE, "--wait", "--timeout=120s"]);
    let left = left_behind(&cluster);
    let _ = cluster.run(&["delete", "namespace", &llamas_ns, "--wait=false"], None);
    for (what, took) in &timings {
        eprintln!("  {what:<36} {:>7.1}s", took.as_secs_f64());
    }
    assert!(!loaded.acknowledged.is_empty(), "the load wrote Llamas");
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    assert_eq!(loaded.failed, 0, "no request fails through helm upgrade");
    assert_eq!(seen_false, 0, "the APIService stays Available");
    assert!(left.is_empty(), "{left:?}");
    drop(etcd);
    drop(release);
    step("done");
}
