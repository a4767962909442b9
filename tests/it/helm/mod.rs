//! The Helm chart (`charts/farm-apiserver`) as a real helm renders it, offline: `helm lint
//! --strict` and `helm template` in every storage and certificate mode, the server's own flag
//! parser on the Deployment's arguments, the selfSigned certificate as the aggregator verifies
//! it, the schema refusing wrong values with its message, the values' table in the chart's
//! README, and no drift from the kustomize install: each mode rendered by helm is compared
//! with the same install rendered by `kubectl kustomize` (the base and its components).
//!
//! helm comes from PATH or `scripts/install-helm.sh` (target/helm/bin/helm); without it these
//! tests print SKIPPED, unless `FARM_REQUIRE_HELM` is set (CI), where they fail.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine;
use farm_apiserver::config::{Args, Storage};
use serde_json::{Value, json};
use x509_parser::{extensions::GeneralName, pem::parse_x509_pem};

use crate::common::install;

pub(crate) const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/charts/farm-apiserver");
const RELEASE: &str = "farm-apiserver";
const NAMESPACE: &str = "farm-system";
/// What components/etcd points --etcd-servers at.
const ETCD_SERVERS: &str = "https://etcd-0.etcd.etcd.svc:2379,https://etcd-1.etcd.etcd.svc:2379,https://etcd-2.etcd.etcd.svc:2379";

fn helm_or_skip() -> Option<PathBuf> {
    let helm = install::helm();
    if helm.is_none() {
        eprintln!("SKIPPED: no helm on PATH or in target/helm/bin (scripts/install-helm.sh)");
    }
    helm
}

/// A CA certificate in PEM, for tls.mode=existingSecret.
fn some_ca(dir: &Path) -> PathBuf {
    aggregated_apiserver::net::tls::DevCa::load_or_create(dir).unwrap();
    dir.join("ca.crt")
}

/// Each mode the chart has, as `helm` arguments; `dir` holds files they name.
fn modes(dir: &Path) -> Vec<(&'static str, Vec<String>)> {
    let owned = |args: &[&str]| args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>();
    let ca = some_ca(dir);
    vec![
        ("defaults", vec![]),
        ("certManager", owned(&["--set", "tls.mode=certManager"])),
        (
            "existingSecret",
            vec![
                "--set".into(),
                "tls.mode=existingSecret".into(),
                "--set".into(),
                "tls.existingSecret=my-serving-certificate".into(),
                "--set-file".into(),
                format!("tls.caBundle={}", ca.display()),
            ],
        ),
        (
            "etcd",
            owned(&[
                "--set",
                "storage.type=etcd",
                "--set",
                "replicaCount=2",
                "--set",
                &format!("storage.etcd.servers={{{ETCD_SERVERS}}}"),
                "--set",
                "storage.etcd.prefix=/farm/",
            ]),
        ),
        (
            "everything else",
            owned(&[
                "--set",
                "audit.enabled=true",
                "--set",
                "flowControl.enabled=true",
                "--set",
                "networkPolicy.enabled=true",
                "--set",
                "hostNetwork=true",
                "--set",
                "serviceMonitor.enabled=true",
                "--api-versions",
                "monitoring.coreos.com/v1/ServiceMonitor",
                "--set",
                "priorityClassName=system-cluster-critical",
                "--set",
                "extraArgs={--max-requests-inflight=800}",
                "--set",
                "logFormat=plain",
            ]),
        ),
    ]
}

/// `helm template` of the chart with `args`: the objects, or helm's error.
pub(crate) fn template(helm: &Path, args: &[String]) -> Result<Vec<Value>, String> {
    template_as(helm, RELEASE, NAMESPACE, args)
}

/// `helm template` as release `release` in `namespace`.
fn template_as(
    helm: &Path,
    release: &str,
    namespace: &str,
    args: &[String],
) -> Result<Vec<Value>, String> {
    let out = Command::new(helm)
        .args(["template", release, CHART, "--namespace", namespace])
        .args(args)
        .output()
        .expect("helm template");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    Ok(install::yaml_documents(
        &String::from_utf8(out.stdout).unwrap(),
    ))
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} missing"))
}

fn deployment_args(objects: &[Value]) -> Args {
    crate::manifests::server_args(
        &find(objects, "Deployment", RELEASE)["spec"]["template"]["spec"]["containers"][0],
    )
}

fn b64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .expect("base64")
}

#[test]
fn lint_and_template_in_every_mode() {
    let Some(helm) = helm_or_skip() else { return };
    let dir = tempfile::tempdir().unwrap();
    for (mode, args) in modes(dir.path()) {
        // lint has no --api-versions: it renders without the ServiceMonitor.
        let lint_args: Vec<&String> = args
            .iter()
            .enumerate()
            .filter(|(i, a)| *a != "--api-versions" && (*i == 0 || args[i - 1] != "--api-versions"))
            .map(|(_, a)| a)
            .collect();
        let lint = Command::new(&helm)
            .args(["lint", "--strict", CHART, "--namespace", NAMESPACE])
            .args(lint_args)
            .output()
            .unwrap();
        assert!(
            lint.status.success(),
            "helm lint --strict ({mode}): {}{}",
            String::from_utf8_lossy(&lint.stdout),
            String::from_utf8_lossy(&lint.stderr)
        );
        let objects = template(&helm, &args).unwrap_or_else(|e| panic!("{mode}: {e}"));
        let parsed = deployment_args(&objects);
        let deployment = find(&objects, "Deployment", RELEASE);
        let pod = &deployment["spec"]["template"]["spec"];
        // Every mounted volume exists, and the serving certificate's Secret is the mode's.
        let volumes = pod["volumes"].as_array().unwrap();
        for mount in pod["containers"][0]["volumeMounts"].as_array().unwrap() {
            assert!(
                volumes.iter().any(|v| v["name"] == mount["name"]),
                "{mode}: {mount} has no volume"
            );
        }
        let tls_secret =
            volumes.iter().find(|v| v["name"] == "tls").unwrap()["secret"]["secretName"].clone();
        match mode {
            "existingSecret" => {
                assert_eq!(tls_secret, "my-serving-certificate");
                assert!(!objects.iter().any(|o| o["kind"] == "Secret"), "{mode}");
                let ca = std::fs::read(dir.path().join("ca.crt")).unwrap();
                for name in farm_apiserver::certs::API_SERVICES {
                    assert_eq!(
                        b64(find(&objects, "APIService", name)["spec"]["caBundle"]
                            .as_str()
                            .unwrap()),
                        ca,
                        "{mode}: the caBundle is the CA given"
                    );
                }
            }
            "certManager" => {
                assert_eq!(tls_secret, "farm-apiserver-tls");
                let certificate = find(&objects, "Certificate", "farm-apiserver-tls");
                assert_eq!(certificate["spec"]["secretName"], tls_secret);
                for name in farm_apiserver::certs::API_SERVICES {
                    let api = find(&objects, "APIService", name);
                    assert!(api["spec"]["caBundle"].is_null(), "cainjector writes it");
                    assert_eq!(
                        api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                        "farm-system/farm-apiserver-tls"
                    );
                }
            }
            _ => {
                assert_eq!(tls_secret, "farm-apiserver-tls");
                find(&objects, "Secret", "farm-apiserver-tls");
            }
        }
        match mode {
            "etcd" => {
                assert_eq!(parsed.storage, Storage::Etcd);
                assert_eq!(find(&objects, "Deployment", RELEASE)["spec"]["replicas"], 2);
                find(&objects, "PodDisruptionBudget", RELEASE);
            }
            _ => {
                assert_eq!(parsed.storage, Storage::Memory, "{mode}");
                assert!(
                    !objects.iter().any(|o| o["kind"] == "PodDisruptionBudget"),
                    "{mode}: no PodDisruptionBudget for one replica"
                );
            }
        }
        if mode == "everything else" {
            assert!(parsed.audit_policy_file.is_some());
            assert_eq!(pod["hostNetwork"], true);
            assert_eq!(pod["priorityClassName"], "system-cluster-critical");
            for kind in [
                "FlowSchema",
                "PriorityLevelConfiguration",
                "NetworkPolicy",
                "ServiceMonitor",
                "ConfigMap",
            ] {
                assert!(objects.iter().any(|o| o["kind"] == kind), "{mode}: {kind}");
            }
        }
    }
    // Without the CRD in the cluster (helm's --api-versions), no ServiceMonitor.
    let objects = template(
        &helm,
        &["--set".into(), "serviceMonitor.enabled=true".into()],
    )
    .unwrap();
    assert!(!objects.iter().any(|o| o["kind"] == "ServiceMonitor"));
}

/// The selfSigned mode: a serving certificate for the name the aggregator verifies, signed by
/// the CA both APIServices trust, with a key the server loads.
#[test]
fn self_signed_certificate_is_what_the_aggregator_verifies() {
    let Some(helm) = helm_or_skip() else { return };
    let objects = template(&helm, &[]).unwrap();
    let secret = find(&objects, "Secret", "farm-apiserver-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    let data = |key: &str| b64(secret["data"][key].as_str().unwrap());
    let ca_pem = data("ca.crt");
    for name in farm_apiserver::certs::API_SERVICES {
        let api = find(&objects, "APIService", name);
        assert_eq!(b64(api["spec"]["caBundle"].as_str().unwrap()), ca_pem);
        assert!(api["spec"]["insecureSkipTLSVerify"].is_null());
    }
    let (_, cert) = parse_x509_pem(&data("tls.crt")).unwrap();
    let cert = cert.parse_x509().unwrap();
    let (_, ca) = parse_x509_pem(&ca_pem).unwrap();
    let ca = ca.parse_x509().unwrap();
    cert.verify_signature(Some(ca.public_key()))
        .expect("signed by the caBundle's CA");
    let names: Vec<String> = cert
        .subject_alternative_name()
        .unwrap()
        .unwrap()
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(d) => Some((*d).to_owned()),
            _ => None,
        })
        .collect();
    assert!(
        names.contains(&"farm-apiserver.farm-system.svc".to_owned()),
        "{names:?}"
    );
    crate::common::install_crypto();
    aggregated_apiserver::net::tls::server_config(&data("tls.crt"), &data("tls.key"), &[])
        .expect("the server loads the certificate and its key");
    // helm template cannot look the Secret up: each render makes a new CA (upgrades keep the
    // one in the cluster; the lab test shows it).
    let again = template(&helm, &[]).unwrap();
    assert_ne!(
        find(&again, "Secret", "farm-apiserver-tls")["data"]["ca.crt"],
        secret["data"]["ca.crt"]
    );
}

/// Another release in another namespace: every name and reference follows them, nothing says
/// farm-system, and the test objects are outside every selector of the server's.
#[test]
fn names_follow_the_release_and_namespace() {
    let Some(helm) = helm_or_skip() else { return };
    let objects = template_as(&helm, "farm", "pasture", &[]).unwrap();
    let text = serde_json::to_string(&objects).unwrap();
    assert!(!text.contains("farm-system"), "{text}");
    let name = "farm-farm-apiserver";
    let service = find(&objects, "Service", name);
    assert_eq!(service["metadata"]["namespace"], "pasture");
    for api in farm_apiserver::certs::API_SERVICES {
        let spec = &find(&objects, "APIService", api)["spec"];
        assert_eq!(spec["service"]["name"], name);
        assert_eq!(spec["service"]["namespace"], "pasture");
    }
    let deployment = find(&objects, "Deployment", name);
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], name);
    find(&objects, "ServiceAccount", name);
    let secret = find(&objects, "Secret", &format!("{name}-tls"));
    assert_eq!(
        pod["volumes"][0]["secret"]["secretName"],
        secret["metadata"]["name"]
    );
    let (_, cert) = parse_x509_pem(&b64(secret["data"]["tls.crt"].as_str().unwrap())).unwrap();
    let cert = cert.parse_x509().unwrap();
    let san = format!(
        "{:?}",
        cert.subject_alternative_name().unwrap().unwrap().value
    );
    assert!(san.contains("farm-farm-apiserver.pasture.svc"), "{san}");
    for (kind, binding) in [
        (
            "ClusterRoleBinding",
            format!("{name}:system:auth-delegator"),
        ),
        ("ClusterRoleBinding", name.to_owned()),
        ("RoleBinding", format!("{name}-auth-reader")),
    ] {
        let subject = &find(&objects, kind, &binding)["subjects"][0];
        assert_eq!(subject["name"], name, "{kind} {binding}");
        assert_eq!(subject["namespace"], "pasture", "{kind} {binding}");
    }
    assert_eq!(
        find(&objects, "RoleBinding", &format!("{name}-auth-reader"))["metadata"]["namespace"],
        "kube-system"
    );
    // What the defaults add to the kustomize install: the `helm test` objects, which no
    // selector of the server's matches.
    let selector = &service["spec"]["selector"];
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], *selector);
    let tests: Vec<&Value> = objects
        .iter()
        .filter(|o| o["metadata"]["labels"]["app.kubernetes.io/component"] == "test")
        .collect();
    let kinds: Vec<&str> = tests.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "RoleBinding",
            "Pod"
        ]
        .iter()
        .filter(|k| kinds.contains(k))
        .copied()
        .collect::<Vec<_>>()
    );
    assert_eq!(tests.len(), 5, "{kinds:?}");
    for object in tests {
        assert!(
            !within(selector, &object["metadata"]["labels"]),
            "{object}: the server's selector matches it"
        );
    }
}

#[test]
fn wrong_values_are_refused_with_the_schemas_message() {
    let Some(helm) = helm_or_skip() else { return };
    for (set, message) in [
        (
            "replicaCount=-1",
            "at '/replicaCount': minimum: got -1, want 1",
        ),
        (
            "storage.type=disk",
            "at '/storage/type': value must be one of 'memory', 'etcd'",
        ),
        // Two replicas keeping Llamas in memory would be two farms behind one Service.
        (
            "replicaCount=2",
            "at '/replicaCount': maximum: got 2, want 1",
        ),
        ("storage.type=etcd", "at '/storage/etcd/servers'"),
        ("tls.mode=existingSecret", "at '/tls/existingSecret'"),
        ("tls.mode=insecure", "at '/tls/mode'"),
        ("logFormat=xml", "at '/logFormat'"),
        ("extraArgs={verbose}", "at '/extraArgs/0'"),
        ("replicas=2", "additional properties 'replicas' not allowed"),
        ("fullnameOverride=Bad_Name", "at '/fullnameOverride'"),
        ("audit.policy.kind=Nonsense", "at '/audit/policy/kind'"),
        (
            "podLabels.app\\.kubernetes\\.io/name=x",
            "invalid propertyName",
        ),
    ] {
        let error = template(&helm, &["--set".into(), set.into()])
            .err()
            .unwrap_or_else(|| panic!("--set {set} was accepted"));
        assert!(
            error.contains("values don't meet the specifications of the schema")
                && error.contains(message),
            "--set {set}: {error}"
        );
    }
    // What one value cannot say alone, the templates refuse.
    for (sets, message) in [
        (
            vec!["terminationGracePeriodSeconds=5"],
            "terminationGracePeriodSeconds must exceed shutdownDelaySeconds",
        ),
        (
            vec![
                "storage.type=etcd",
                "replicaCount=2",
                "storage.etcd.servers={https://etcd:2379}",
                "podDisruptionBudget.minAvailable=2",
            ],
            "podDisruptionBudget.minAvailable must be below replicaCount",
        ),
    ] {
        let args: Vec<String> = sets
            .iter()
            .flat_map(|s| ["--set".to_owned(), (*s).to_owned()])
            .collect();
        let error = template(&helm, &args)
            .err()
            .unwrap_or_else(|| panic!("{sets:?} was accepted"));
        assert!(error.contains(message), "{sets:?}: {error}");
    }
}

#[test]
fn chart_version_follows_the_crate() {
    let chart: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(Path::new(CHART).join("Chart.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(chart["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(chart["appVersion"], env!("CARGO_PKG_VERSION"));
}

/// A values table row for each leaf of the schema: key, default (from values.yaml), and the
/// schema's description.
fn values_table() -> String {
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(Path::new(CHART).join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let defaults: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(Path::new(CHART).join("values.yaml")).unwrap(),
    )
    .unwrap();
    let mut rows = Vec::new();
    fn walk(schema: &Value, defaults: &Value, path: &str, rows: &mut Vec<String>) {
        let leaf = schema["properties"].as_object().filter(|_| {
            // Objects whose members users name freely are leaves.
            schema["additionalProperties"] == false
        });
        match leaf {
            Some(properties) => {
                for (name, member) in properties {
                    let path = if path.is_empty() {
                        name.clone()
                    } else {
                        format!("{path}.{name}")
                    };
                    walk(member, &defaults[name.as_str()], &path, rows);
                }
            }
            // Helm's own, for subcharts.
            None if path == "global" => {}
            None => {
                let default = match defaults {
                    Value::Null => "".to_owned(),
                    long if long.to_string().len() > 60 => "see values.yaml".to_owned(),
                    other => format!("`{other}`"),
                };
                let mut description = schema["description"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{path} has no description in the schema"))
                    .to_owned();
                if let Some(values) = schema["enum"].as_array() {
                    let values: Vec<String> = values.iter().map(|v| format!("`{v}`")).collect();
                    description = format!("{description} (one of {})", values.join(", "));
                }
                rows.push(format!("| `{path}` | {default} | {description} |"));
            }
        }
    }
    walk(&schema, &defaults, "", &mut rows);
    format!(
        "| Value | Default | What it sets |\n|---|---|---|\n{}\n",
        rows.join("\n")
    )
}

const TABLE_START: &str = "<!-- values: generated from values.schema.json and values.yaml; \
                           FARM_UPDATE_SNAPSHOTS=1 cargo test --test it helm:: rewrites it -->\n";
const TABLE_END: &str = "<!-- end of values -->";

#[test]
fn chart_readme_lists_every_value() {
    let path = Path::new(CHART).join("README.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let (before, rest) = readme
        .split_once(TABLE_START)
        .expect("the table's start marker");
    let (_, after) = rest.split_once(TABLE_END).expect("the table's end marker");
    let table = values_table();
    if std::env::var_os("FARM_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(
            &path,
            format!("{before}{TABLE_START}{table}{TABLE_END}{after}"),
        )
        .unwrap();
        return;
    }
    assert_eq!(
        rest.split_once(TABLE_END).unwrap().0,
        table,
        "charts/farm-apiserver/README.md's values table is stale: \
         FARM_UPDATE_SNAPSHOTS=1 cargo test --test it helm::chart_readme_lists_every_value"
    );
}

// ---- No drift: the chart against the kustomize install, mode by mode.
use against_kustomize::within;

mod against_kustomize;
