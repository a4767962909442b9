//! What kubectl and kube-rs do through kube-apiserver, and FarmPods following the cluster's Pods.

use super::*;

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
pub(super) async fn farmpods_follow_pods(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
    nodes: Nodes,
) {
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
