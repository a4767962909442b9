//! The shipped manifests, rendered by the kustomize built into kubectl (offline), hold what an
//! aggregated API server needs, in the right namespaces, and trust nothing insecurely.

use std::process::Command;

use serde_json::Value;

fn rendered() -> Option<Vec<Value>> {
    let Ok(out) = Command::new("kubectl")
        .args([
            "kustomize",
            concat!(env!("CARGO_MANIFEST_DIR"), "/manifests"),
        ])
        .output()
    else {
        eprintln!("SKIPPED: kubectl is not on PATH; it renders the kustomization");
        return None;
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        text.split("\n---\n")
            .map(|doc| serde_saphyr::from_str::<Value>(doc).expect("YAML document"))
            .collect(),
    )
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} missing"))
}

#[test]
fn rbac_for_an_aggregated_api_server() {
    let Some(objects) = rendered() else { return };
    let sa = find(&objects, "ServiceAccount", "farm-apiserver");
    assert_eq!(sa["metadata"]["namespace"], "farm-system");

    let delegator = find(
        &objects,
        "ClusterRoleBinding",
        "farm-apiserver:system:auth-delegator",
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(delegator["subjects"][0]["name"], "farm-apiserver");
    assert_eq!(delegator["subjects"][0]["namespace"], "farm-system");

    let reader = find(&objects, "RoleBinding", "farm-apiserver-auth-reader");
    assert_eq!(
        reader["metadata"]["namespace"], "kube-system",
        "the ConfigMap lives in kube-system"
    );
    assert_eq!(reader["roleRef"]["kind"], "Role");
    assert_eq!(
        reader["roleRef"]["name"],
        "extension-apiserver-authentication-reader"
    );

    let pods = find(&objects, "ClusterRole", "farm-apiserver");
    assert_eq!(pods["rules"][0]["resources"], serde_json::json!(["pods"]));
    assert_eq!(
        pods["rules"][0]["verbs"],
        serde_json::json!(["get", "list", "watch"])
    );

    let view = find(&objects, "ClusterRole", "farm:view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(
        view["rules"][0]["resources"],
        serde_json::json!(["llamas", "farmpods"])
    );
    let edit = find(&objects, "ClusterRole", "farm:edit");
    assert_eq!(
        edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"],
        "true"
    );
    assert!(
        !edit["rules"][0]["resources"]
            .as_array()
            .unwrap()
            .contains(&"farmpods".into()),
        "FarmPods are read-only"
    );

    let text = serde_json::to_string(&objects).unwrap();
    assert!(!text.contains("insecureSkipTLSVerify"));
}
