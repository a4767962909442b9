//! The chart renders what kustomize renders of manifests/ and each component.

use super::*;

/// `kubectl kustomize` of the shipped manifests with `components` (paths under manifests/),
/// certificates written by `farm-apiserver certs`; `cert-manager` alone renders that
/// kustomization instead.
pub(super) fn kustomized(components: &[&str]) -> Vec<Value> {
    if components == ["cert-manager"] {
        return install::render(Some("cert-manager")).objects;
    }
    let rendered = install::render(None);
    if components.is_empty() {
        return rendered.objects;
    }
    let overlay = rendered.dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let list: String = components
        .iter()
        .map(|c| format!("  - ../manifests/{c}\n"))
        .collect();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../manifests\ncomponents:\n{list}"
        ),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&overlay)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    install::yaml_documents(&String::from_utf8(out.stdout).unwrap())
}

/// What may differ between the two installs, taken out: labels and annotations (checked
/// apart: the chart's hold the kustomize install's), the certificates and caBundle (each
/// install makes its own), kustomize's content hash in generated names, and the order of lists
/// whose members are keyed by name. Returns (kind/namespace/name -> object, labels and
/// annotations by the same key).
#[allow(clippy::type_complexity)]
pub(super) fn comparable(
    objects: &[Value],
) -> (BTreeMap<String, Value>, BTreeMap<String, Vec<Value>>) {
    let hashed =
        regex::Regex::new(r"^(farm-apiserver-(?:tls|audit-policy))-[a-z0-9]{10}$").unwrap();
    let unhash = |v: Option<&mut Value>| {
        if let Some(v) = v
            && let Some(name) = v.as_str()
            && let Some(c) = hashed.captures(name)
        {
            *v = json!(c[1].to_owned());
        }
    };
    let mut out = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    for object in objects {
        let mut o = object.clone();
        unhash(o.pointer_mut("/metadata/name"));
        let key = format!(
            "{}/{}/{}",
            o["kind"].as_str().unwrap(),
            o["metadata"]["namespace"].as_str().unwrap_or(""),
            o["metadata"]["name"].as_str().unwrap()
        );
        let meta = o["metadata"].as_object_mut().unwrap();
        let labels = meta.remove("labels").unwrap_or(json!({}));
        let annotations = meta.remove("annotations").unwrap_or(json!({}));
        let mut kept = vec![labels, annotations];
        match o["kind"].as_str().unwrap() {
            "Secret" => {
                o.as_object_mut().unwrap().remove("data");
            }
            "APIService" => {
                o["spec"].as_object_mut().unwrap().remove("caBundle");
            }
            "Certificate" => {
                if let Some(template) = o
                    .pointer_mut("/spec/secretTemplate")
                    .and_then(Value::as_object_mut)
                {
                    kept.push(template.remove("labels").unwrap_or(json!({})));
                }
            }
            "ConfigMap" => {
                // The audit policy: compared as YAML.
                for (_, text) in o["data"].as_object_mut().unwrap().iter_mut() {
                    *text = serde_saphyr::from_str(text.as_str().unwrap()).unwrap();
                }
            }
            "Deployment" => {
                let template = o["spec"]["template"]["metadata"].as_object_mut().unwrap();
                kept.push(template.remove("labels").unwrap_or(json!({})));
                kept.push(template.remove("annotations").unwrap_or(json!({})));
                let pod = &mut o["spec"]["template"]["spec"];
                for volume in pod["volumes"].as_array_mut().unwrap() {
                    unhash(volume.pointer_mut("/secret/secretName"));
                    unhash(volume.pointer_mut("/configMap/name"));
                }
            }
            _ => {}
        }
        sort_named_lists(&mut o);
        out.insert(key.clone(), o);
        metadata.insert(key, kept);
    }
    (out, metadata)
}

/// Lists whose members all have a `name` (volumes, mounts, ports...), sorted by it.
pub(super) fn sort_named_lists(value: &mut Value) {
    match value {
        Value::Array(items) => {
            items.iter_mut().for_each(sort_named_lists);
            if items.iter().all(|i| i["name"].is_string()) {
                items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
            }
        }
        Value::Object(map) => map.values_mut().for_each(sort_named_lists),
        _ => {}
    }
}

/// `small` is within `big`: every key of `small` has the same value in `big`.
pub(super) fn within(small: &Value, big: &Value) -> bool {
    small
        .as_object()
        .is_none_or(|s| s.iter().all(|(k, v)| &big[k.as_str()] == v))
}

#[test]
fn the_chart_renders_what_kustomize_renders() {
    let Some(helm) = helm_or_skip() else { return };
    if !install::has_kubectl() {
        eprintln!("SKIPPED: kubectl is not on PATH; it renders the kustomization");
        return;
    }
    let set = |pairs: &[&str]| -> Vec<String> {
        pairs
            .iter()
            .flat_map(|p| ["--set".to_owned(), (*p).to_owned()])
            .collect()
    };
    let servers = format!("storage.etcd.servers={{{ETCD_SERVERS}}}");
    let cases: Vec<(&str, Vec<&str>, Vec<String>)> = vec![
        ("manifests", vec![], vec![]),
        (
            "manifests/cert-manager",
            vec!["cert-manager"],
            set(&["tls.mode=certManager"]),
        ),
        (
            "components/etcd",
            vec!["components/etcd"],
            set(&["storage.type=etcd", "replicaCount=2", &servers]),
        ),
        (
            "components/audit",
            vec!["components/audit"],
            set(&["audit.enabled=true"]),
        ),
        (
            "components/flow-control",
            vec!["components/flow-control"],
            set(&["flowControl.enabled=true"]),
        ),
        (
            "components/network-policy",
            vec!["components/network-policy"],
            set(&["networkPolicy.enabled=true"]),
        ),
        (
            "components/host-network",
            vec!["components/host-network"],
            set(&["hostNetwork=true"]),
        ),
    ];
    for (what, components, args) in cases {
        let mut args = args;
        // The chart's own test objects (a ServiceAccount and bindings for `helm test`) are
        // not part of the kustomize install.
        args.extend(set(&["tests.enabled=false"]));
        let chart = template(&helm, &args).unwrap();
        let kustomize = kustomized(&components);
        let (chart, chart_meta) = comparable(&chart);
        let (kustomize, kustomize_meta) = comparable(&kustomize);
        // The Namespace is helm's --create-namespace.
        let kustomize: BTreeMap<String, Value> = kustomize
            .into_iter()
            .filter(|(k, _)| !k.starts_with("Namespace/"))
            .collect();
        assert_eq!(
            chart.keys().collect::<Vec<_>>(),
            kustomize.keys().collect::<Vec<_>>(),
            "{what}: the same objects"
        );
        for (key, object) in &kustomize {
            assert_eq!(
                &chart[key], object,
                "{what}: {key} differs between `helm template` (left) and `kubectl kustomize`"
            );
            for (small, big) in kustomize_meta[key].iter().zip(&chart_meta[key]) {
                assert!(
                    within(small, big),
                    "{what}: {key}: the chart's {big} lacks kustomize's {small}"
                );
            }
        }
    }
}
