//! Deletion with the real garbage collector and namespace controller.

use super::*;

/// A Llama manifest with finalizers and owners (`ownerReferences` as JSON).
pub(super) fn owned_llama(
    namespace: &str,
    name: &str,
    finalizers: &[&str],
    owners: Value,
) -> String {
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
pub(super) async fn deletion_with_the_real_controllers(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
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
