//! Server-side apply and managedFields through the real TLS listener, as users meet them:
//! kubectl (`apply --server-side`, `--force-conflicts`, `diff --server-side`, the move from
//! client-side apply and back, `--dry-run=server`), kube-rs `Patch::Apply`, and raw requests
//! for kube-apiserver's refusals. On both storages.

use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::common::{Alpn, RawResponse, TestServer, TestStorage, kubectl, run};
use farm_apiserver::resources::llama::Llama;

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

fn managers(object: &Value) -> Vec<(String, String)> {
    object["metadata"]["managedFields"]
        .as_array()
        .map(|entries| {
            entries
                .iter()
                .map(|e| {
                    (
                        e["manager"].as_str().unwrap_or("").to_owned(),
                        e["operation"].as_str().unwrap_or("").to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn body(reply: &RawResponse) -> String {
    String::from_utf8_lossy(&reply.body).into_owned()
}

async fn kubectl_apply_server_side_as_users_run_it(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig();
    let Some(_) = kubectl(&kubeconfig, cache.path()) else {
        return;
    };
    let k = |args: &[&str]| {
        let mut cmd = kubectl(&kubeconfig, cache.path()).unwrap();
        cmd.args(args);
        cmd
    };
    let get = |name: &'static str| {
        let k = &k;
        async move {
            let (ok, out, err) = run(
                k(&[
                    "get",
                    "llamas.v1alpha.farm.example.com",
                    name,
                    "-o",
                    "json",
                    "--show-managed-fields",
                ]),
                None,
            )
            .await;
            assert!(ok, "{err}");
            serde_json::from_str::<Value>(&out).unwrap()
        }
    };
    let manifest = "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: kuzco
  labels:
    herd: gold
    owner: yzma
spec:
  weight: 120
  height: 1.5
";
    // Create, then the same again.
    let (ok, out, err) = run(k(&["apply", "--server-side", "-f", "-"]), Some(manifest)).await;
    assert!(ok, "{err}");
    assert_eq!(
        out.trim(),
        "llama.farm.example.com/kuzco serverside-applied"
    );
    let created = get("kuzco").await;
    assert_eq!(managers(&created), [("kubectl".into(), "Apply".into())]);
    let entry = &created["metadata"]["managedFields"][0];
    assert_eq!(entry["fieldsType"], "FieldsV1");
    assert_eq!(entry["apiVersion"], "farm.example.com/v1alpha");
    assert_eq!(
        entry["fieldsV1"],
        json!({"f:metadata": {"f:labels": {"f:herd": {}, "f:owner": {}}},
               "f:spec": {"f:height": {}, "f:weight": {}}})
    );
    let time = entry["time"].as_str().unwrap();
    assert!(time.ends_with('Z') && !time.contains('.'), "{time}");
    let (ok, _, err) = run(k(&["apply", "--server-side", "-f", "-"]), Some(manifest)).await;
    assert!(ok, "{err}");
    assert_eq!(
        get("kuzco").await["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"],
        "an unchanged apply writes nothing new"
    );

    // A label the manager no longer applies is removed.
    let without_owner = manifest.replace("    owner: yzma\n", "");
    let (ok, _, err) = run(
        k(&["apply", "--server-side", "-f", "-"]),
        Some(&without_owner),
    )
    .await;
    assert!(ok, "{err}");
    let pruned = get("kuzco").await;
    assert_eq!(pruned["metadata"]["labels"], json!({"herd": "gold"}));

    // Another manager takes the weight through v1 (kubectl's preferred version, where it is
    // .spec.weightKg): applying a different value through v1alpha conflicts, named at the
    // version the other manager wrote.
    let (ok, _, err) = run(
        k(&[
            "patch",
            "llama",
            "kuzco",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"weightKg":130}}"#,
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    let heavier = without_owner.replace("weight: 120", "weight: 125");
    let (ok, _, err) = run(k(&["apply", "--server-side", "-f", "-"]), Some(&heavier)).await;
    assert!(!ok);
    assert!(
        err.contains(
            r#"Apply failed with 1 conflict: conflict with "kubectl-patch" using farm.example.com/v1: .spec.weightKg"#
        ),
        "{err}"
    );
    assert_eq!(get("kuzco").await["spec"]["weight"], 130.0);

    // diff --server-side shows what the apply would change, and changes nothing.
    let (_, out, err) = run(
        k(&["diff", "--server-side", "--force-conflicts", "-f", "-"]),
        Some(&heavier),
    )
    .await;
    assert!(
        out.contains("-  weight: 130") && out.contains("+  weight: 125"),
        "{out}{err}"
    );
    assert_eq!(get("kuzco").await["spec"]["weight"], 130.0);

    // --dry-run=server changes nothing either.
    let (ok, _, err) = run(
        k(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "--dry-run=server",
            "-f",
            "-",
        ]),
        Some(&heavier),
    )
    .await;
    assert!(ok, "{err}");
    assert_eq!(get("kuzco").await["spec"]["weight"], 130.0);

    // --force-conflicts takes the field: kubectl-patch owned nothing else and is gone.
    let (ok, _, err) = run(
        k(&["apply", "--server-side", "--force-conflicts", "-f", "-"]),
        Some(&heavier),
    )
    .await;
    assert!(ok, "{err}");
    let forced = get("kuzco").await;
    assert_eq!(forced["spec"]["weight"], 125.0);
    assert_eq!(managers(&forced), [("kubectl".into(), "Apply".into())]);

    // Same value as another manager: shared, no conflict.
    let (ok, _, err) = run(
        k(&[
            "apply",
            "--server-side",
            "--field-manager",
            "gitops",
            "-f",
            "-",
        ]),
        Some(&heavier),
    )
    .await;
    assert!(ok, "{err}");
    let shared = get("kuzco").await;
    let mut names: Vec<String> = managers(&shared).into_iter().map(|m| m.0).collect();
    names.sort();
    assert_eq!(names, ["gitops", "kubectl"]);
}

/// `kubectl apply` (client-side) first, then `--server-side` on the same object with other
/// values: no conflict with kubectl-client-side-apply (its last-applied annotation says the
/// fields were kubectl's), and back to client-side apply afterwards.
async fn kubectl_moves_from_client_side_apply_and_back(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig();
    let Some(_) = kubectl(&kubeconfig, cache.path()) else {
        return;
    };
    let k = |args: &[&str]| {
        let mut cmd = kubectl(&kubeconfig, cache.path()).unwrap();
        cmd.args(args);
        cmd
    };
    let manifest = |weight: u32| {
        format!(
            "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: pacha
spec:
  weight: {weight}
  height: 1.8
"
        )
    };
    let (ok, _, err) = run(k(&["apply", "-f", "-"]), Some(&manifest(90))).await;
    assert!(ok, "{err}");
    let (ok, out, err) = run(
        k(&[
            "get",
            "llamas.v1alpha.farm.example.com",
            "pacha",
            "-o",
            "json",
            "--show-managed-fields",
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    let csa: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        managers(&csa),
        [("kubectl-client-side-apply".into(), "Update".into())]
    );

    let (ok, _, err) = run(
        k(&["apply", "--server-side", "-f", "-"]),
        Some(&manifest(91)),
    )
    .await;
    assert!(ok, "{err}");
    let (_, out, _) = run(
        k(&[
            "get",
            "llamas.v1alpha.farm.example.com",
            "pacha",
            "-o",
            "json",
            "--show-managed-fields",
        ]),
        None,
    )
    .await;
    let ssa: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(ssa["spec"]["weight"], 91.0);
    assert!(
        !managers(&ssa)
            .iter()
            .any(|(m, _)| m == "kubectl-client-side-apply"),
        "kubectl moved the client-side manager's fields to its own: {:?}",
        managers(&ssa)
    );
    let annotation =
        ssa["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .as_str()
            .unwrap();
    assert!(annotation.contains(r#""weight":91"#), "{annotation}");

    let (ok, out, err) = run(k(&["apply", "-f", "-"]), Some(&manifest(92))).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "llama.farm.example.com/pacha configured");
    let (_, out, _) = run(
        k(&["get", "llama", "pacha", "-o", "jsonpath={.spec.weightKg}"]),
        None,
    )
    .await;
    assert_eq!(out, "92", "read through v1, kubectl's preferred version");
}

/// kube-rs `Patch::Apply`: create, conflict (409 with a FieldManagerConflict cause), force.
async fn kube_rs_patch_apply(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let llamas: Api<Llama> = Api::namespaced(server.kube_client().await, "default");
    let config = |weight: f64| {
        json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
               "metadata": {"name": "rs"}, "spec": {"weight": weight, "height": 1.0}})
    };
    let created = llamas
        .patch(
            "rs",
            &PatchParams::apply("rs-controller"),
            &Patch::Apply(config(10.0)),
        )
        .await
        .unwrap();
    let entries = created.metadata.managed_fields.clone().unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].manager.as_deref(), Some("rs-controller"));
    assert_eq!(entries[0].operation.as_deref(), Some("Apply"));

    let err = llamas
        .patch(
            "rs",
            &PatchParams::apply("other"),
            &Patch::Apply(config(11.0)),
        )
        .await
        .unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("{err:?}")
    };
    assert_eq!(status.code, 409);
    assert_eq!(status.reason, "Conflict");
    assert_eq!(
        status.message,
        r#"Apply failed with 1 conflict: conflict with "rs-controller": .spec.weight"#
    );
    let causes = &status.details.as_ref().expect("details").causes;
    assert_eq!(causes.len(), 1, "{causes:?}");
    assert_eq!(causes[0].reason, "FieldManagerConflict");
    assert_eq!(causes[0].field, ".spec.weight");
    assert_eq!(causes[0].message, r#"conflict with "rs-controller""#);
    let forced = llamas
        .patch(
            "rs",
            &PatchParams::apply("other").force(),
            &Patch::Apply(config(11.0)),
        )
        .await
        .unwrap();
    assert_eq!(forced.spec.weight, 11.0);

    // A create through POST records its manager as an Update.
    let mut posted: Llama = serde_json::from_value(config(3.0)).unwrap();
    posted.metadata.name = Some("posted".into());
    let pp = PostParams {
        field_manager: Some("creator".into()),
        ..Default::default()
    };
    let posted = llamas.create(&pp, &posted).await.unwrap();
    let entries = posted.metadata.managed_fields.unwrap();
    assert_eq!(entries[0].manager.as_deref(), Some("creator"));
    assert_eq!(entries[0].operation.as_deref(), Some("Update"));
}

/// kube-apiserver's refusals and rules around apply, byte for byte where it has a message.
async fn apply_requests_are_checked_as_kube_apiserver_checks_them(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let api = server.raw(Some(server.admin_identity()), Alpn::Http2);
    let apply = |path: String, body: &'static str, content_type: &'static str| {
        let api = &api;
        async move {
            api.send(
                "PATCH",
                &path,
                &[("content-type", content_type)],
                Some(body.as_bytes().to_vec()),
            )
            .await
        }
    };
    let yaml = "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: yak\nspec:\n  weight: 2\n  height: 1\n";

    let missing = apply(
        format!("{LLAMAS}/yak"),
        yaml,
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(missing.status, 422, "{}", body(&missing));
    assert_eq!(
        missing.json()["message"],
        r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#
    );
    let forced_merge = apply(
        format!("{LLAMAS}/yak?force=true"),
        r#"{"spec":{"weight":3}}"#,
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(forced_merge.status, 422, "{}", body(&forced_merge));
    assert!(
        body(&forced_merge).contains("force: Forbidden: may not be specified for non-apply patch")
    );
    let cbor = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        yaml,
        "application/apply-patch+cbor",
    )
    .await;
    assert_eq!(cbor.status, 415, "{}", body(&cbor));

    // YAML is read as kube-apiserver reads it (YAML 1.1): `y`, `yes`, `on` are true, so a
    // name `y` is not a string.
    let boolean = apply(
        format!("{LLAMAS}/y?fieldManager=t"),
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: y\nspec:\n  weight: 2\n  height: 1\n",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(boolean.status, 400, "{}", body(&boolean));
    assert!(
        body(&boolean)
            .contains(".metadata.name: expected string, got &value.valueUnstructured{Value:true}"),
        "{}",
        body(&boolean)
    );

    // YAML creates (201), dry run first: nothing stored.
    let dry = apply(
        format!("{LLAMAS}/yak?fieldManager=t&dryRun=All"),
        yaml,
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(dry.status, 201, "{}", body(&dry));
    assert_eq!(api.get(&format!("{LLAMAS}/yak"), &[]).await.status, 404);
    let created = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        yaml,
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(created.status, 201, "{}", body(&created));
    let again = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        yaml,
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(again.status, 200, "{}", body(&again));

    // Not the kind's schema, or not the URL's object: 400, nothing written.
    let undeclared = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: yak\nspec:\n  wings: 2\n",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(undeclared.status, 400, "{}", body(&undeclared));
    assert!(body(&undeclared).contains(".spec.wings: field not declared in schema"));
    let other_name = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: z\nspec:\n  weight: 2\n",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(other_name.status, 400, "{}", body(&other_name));
    let with_uid = apply(
        format!("{LLAMAS}/u?fieldManager=t"),
        "apiVersion: farm.example.com/v1alpha\nkind: Llama\nmetadata:\n  name: u\n  uid: 6b1f4f3c-0000-4000-8000-000000000000\nspec:\n  weight: 2\n  height: 1\n",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(with_uid.status, 409, "{}", body(&with_uid));
    assert!(body(&with_uid).contains("uid mismatch: the provided object specified uid 6b1f4f3c-0000-4000-8000-000000000000, and no existing object was found"));
    let not_yaml = apply(
        format!("{LLAMAS}/yak?fieldManager=t"),
        "spec: [unclosed",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(not_yaml.status, 400, "{}", body(&not_yaml));

    // A manager from the User-Agent; an update with managedFields [] resets them.
    let patched = api
        .send(
            "PATCH",
            &format!("{LLAMAS}/yak"),
            &[
                ("content-type", "application/merge-patch+json"),
                ("user-agent", "llama-herder/1.2 (linux)"),
            ],
            Some(br#"{"spec":{"weight":4}}"#.to_vec()),
        )
        .await;
    assert_eq!(patched.status, 200, "{}", body(&patched));
    assert!(
        managers(&patched.json()).contains(&("llama-herder".into(), "Update".into())),
        "{:?}",
        managers(&patched.json())
    );
    let reset = api
        .send(
            "PATCH",
            &format!("{LLAMAS}/yak"),
            &[("content-type", "application/merge-patch+json")],
            Some(br#"{"metadata":{"managedFields":[]}}"#.to_vec()),
        )
        .await;
    assert_eq!(reset.status, 200, "{}", body(&reset));
    assert!(
        reset.json()["metadata"].get("managedFields").is_none(),
        "{}",
        body(&reset)
    );
    // The next apply starts over: before-first-apply owns what was there.
    let after = apply(
        format!("{LLAMAS}/yak?fieldManager=t&force=true"),
        yaml,
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(after.status, 200, "{}", body(&after));
    assert!(managers(&after.json()).contains(&("t".into(), "Apply".into())));

    // FarmPods are read-only: apply is 405 like every other write.
    let farmpod = apply(
        "/apis/farm.example.com/v1alpha/namespaces/default/farmpods/p?fieldManager=t".into(),
        "apiVersion: farm.example.com/v1alpha\nkind: FarmPod\nmetadata:\n  name: p\n",
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(farmpod.status, 405, "{}", body(&farmpod));
}

crate::on_both_storages!(
    kubectl_apply_server_side_as_users_run_it,
    kubectl_moves_from_client_side_apply_and_back,
    kube_rs_patch_apply,
    apply_requests_are_checked_as_kube_apiserver_checks_them,
);
