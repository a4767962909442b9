//! The shipped manifests as a user installs them (`farm-apiserver certs`, then the kustomize
//! built into kubectl, offline), checked against the server they deploy: the caBundle is the CA
//! the certs subcommand wrote and nothing is trusted insecurely, the Deployment's arguments parse
//! with the real flags and its probes, ports, Secret and ServiceAccount line up with the Service,
//! the APIService and the RBAC, `.mirrord/mirrord.json` and docs/storage.md's mirrord line target the
//! Deployment, and the cert-manager overlay and the components render and do what they say.

use crate::common;

use std::{path::Path, process::Command};

use aggregated_apiserver::server;
use axum::{body::Body, http::Request};
use base64::Engine;
use clap::Parser;
use common::install::{self, Rendered};
use farm_apiserver::config::{Args, LogFormat};
use serde_json::{Value, json};
use tower::ServiceExt;
use x509_parser::{extensions::GeneralName, pem::parse_x509_pem};

const NAMESPACE: &str = "farm-system";
const SERVICE_DNS: &str = "farm-apiserver.farm-system.svc";

/// The default install (`manifests/`), or None (SKIPPED) without kubectl.
fn rendered() -> Option<Rendered> {
    rendered_overlay(None)
}

fn rendered_overlay(overlay: Option<&str>) -> Option<Rendered> {
    if !install::has_kubectl() {
        eprintln!("SKIPPED: kubectl is not on PATH; it renders the kustomization");
        return None;
    }
    Some(install::render(overlay))
}

/// `kubectl kustomize dir`, as objects.
fn kustomize(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split("\n---\n")
        .map(|doc| serde_saphyr::from_str::<Value>(doc).expect("YAML document"))
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} missing"))
}

fn only<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    let found: Vec<&Value> = objects.iter().filter(|o| o["kind"] == kind).collect();
    assert_eq!(found.len(), 1, "one {kind} expected: {found:?}");
    found[0]
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not an array: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect()
}

fn b64(text: &str) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD
        .decode(text.replace(['\n', ' '], ""))
        .expect("base64")
}

/// The one container of the Deployment's pod.
fn container(deployment: &Value) -> &Value {
    let containers = deployment["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    assert_eq!(containers.len(), 1, "one container");
    &containers[0]
}

/// The container's arguments, parsed by the server's own flag parser.
pub(crate) fn server_args(container: &Value) -> Args {
    assert!(
        container["command"].is_null(),
        "the image's ENTRYPOINT is the server"
    );
    let args = strings(&container["args"]);
    Args::try_parse_from(std::iter::once("farm-apiserver").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("the Deployment's args do not parse: {e}"))
}

/// The container port named `name`.
fn named_port(container: &Value, name: &str) -> u64 {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == name)
        .unwrap_or_else(|| panic!("no container port named {name}"))["containerPort"]
        .as_u64()
        .unwrap()
}

/// The mount path of the volume that holds Secret `secret`.
fn secret_mount<'a>(deployment: &'a Value, secret: &str) -> &'a Value {
    let pod = &deployment["spec"]["template"]["spec"];
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["secret"]["secretName"] == secret)
        .unwrap_or_else(|| panic!("no volume of Secret {secret}"));
    container(deployment)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == volume["name"])
        .unwrap_or_else(|| panic!("volume {} not mounted", volume["name"]))
}

/// A Kubernetes quantity in base units (cores, bytes); the suffixes the manifests use.
fn quantity(value: &Value) -> f64 {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        other => panic!("not a quantity: {other}"),
    };
    for (suffix, factor) in [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("m", 1e-3),
        ("M", 1e6),
        ("G", 1e9),
    ] {
        if let Some(number) = text.strip_suffix(suffix) {
            return number.parse::<f64>().unwrap() * factor;
        }
    }
    text.parse().unwrap_or_else(|_| panic!("quantity {text}"))
}

/// Status of `GET path` as kubelet sends a probe: no client certificate, no credentials.
async fn probe(path: &str) -> u16 {
    let (options, _admin) = common::oneshot_identity();
    let (state, shutdown) = common::memory_state(true, options);
    let response = server::app(state)
        .oneshot(Request::get(path).body(Body::empty()).unwrap())
        .await
        .unwrap();
    drop(shutdown);
    response.status().as_u16()
}

/// The resources the server serves, from its discovery document.
async fn served_resources() -> Vec<String> {
    let app = common::oneshot::app();
    let reply = common::oneshot::get(&app, common::oneshot::BASE).await;
    let mut names: Vec<String> = reply.json()["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .filter(|name| !name.contains('/'))
        .collect();
    names.sort();
    names
}

#[test]
fn rbac_for_an_aggregated_api_server() {
    let Some(rendered) = rendered() else { return };
    let objects = &rendered.objects;
    let sa = find(objects, "ServiceAccount", "farm-apiserver");
    assert_eq!(sa["metadata"]["namespace"], NAMESPACE);

    let delegator = find(
        objects,
        "ClusterRoleBinding",
        "farm-apiserver:system:auth-delegator",
    );
    assert_eq!(delegator["roleRef"]["name"], "system:auth-delegator");
    assert_eq!(delegator["subjects"][0]["name"], "farm-apiserver");
    assert_eq!(delegator["subjects"][0]["namespace"], NAMESPACE);

    let reader = find(objects, "RoleBinding", "farm-apiserver-auth-reader");
    assert_eq!(
        reader["metadata"]["namespace"], "kube-system",
        "the ConfigMap lives in kube-system"
    );
    assert_eq!(reader["roleRef"]["kind"], "Role");
    assert_eq!(
        reader["roleRef"]["name"],
        "extension-apiserver-authentication-reader"
    );

    let pods = find(objects, "ClusterRole", "farm-apiserver");
    assert_eq!(pods["rules"][0]["resources"], json!(["pods"]));
    assert_eq!(pods["rules"][0]["verbs"], json!(["get", "list", "watch"]));
    // NamespaceLifecycle admission watches Namespaces.
    assert_eq!(pods["rules"][1]["resources"], json!(["namespaces"]));
    assert_eq!(pods["rules"][1]["verbs"], json!(["get", "list", "watch"]));
    // Admission webhooks: their configurations are watched.
    assert_eq!(
        pods["rules"][2]["apiGroups"],
        json!(["admissionregistration.k8s.io"])
    );
    assert_eq!(
        pods["rules"][2]["resources"],
        json!([
            "mutatingwebhookconfigurations",
            "validatingwebhookconfigurations"
        ])
    );
    assert_eq!(pods["rules"][2]["verbs"], json!(["list", "watch"]));
    assert_eq!(
        pods["rules"][3]["resources"],
        json!([
            "validatingadmissionpolicies",
            "validatingadmissionpolicybindings",
            "mutatingadmissionpolicies",
            "mutatingadmissionpolicybindings"
        ])
    );
    // Webhooks' Services.
    assert_eq!(pods["rules"][4]["resources"], json!(["services"]));
    assert_eq!(pods["rules"][4]["verbs"], json!(["list", "watch"]));
    // Policies. params, watched.
    assert_eq!(pods["rules"][5]["resources"], json!(["configmaps"]));
    assert_eq!(pods["rules"][5]["verbs"], json!(["list", "watch"]));

    let view = find(objects, "ClusterRole", "farm:view");
    assert_eq!(
        view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"],
        "true"
    );
    assert_eq!(view["rules"][0]["resources"], json!(["llamas", "farmpods"]));
    let edit = find(objects, "ClusterRole", "farm:edit");
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

    // Every binding to the server's own needs names the ServiceAccount its pod runs as.
    let deployment = find(objects, "Deployment", "farm-apiserver");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], sa["metadata"]["name"]);
    assert_ne!(
        pod["automountServiceAccountToken"], false,
        "the server uses the in-cluster service account"
    );
    for binding in [
        delegator,
        reader,
        find(objects, "ClusterRoleBinding", "farm-apiserver"),
    ] {
        let subjects = binding["subjects"].as_array().unwrap();
        assert!(
            subjects.iter().any(|s| s["kind"] == "ServiceAccount"
                && s["name"] == sa["metadata"]["name"]
                && s["namespace"] == deployment["metadata"]["namespace"]),
            "{} does not bind the Deployment's ServiceAccount",
            binding["metadata"]["name"]
        );
    }

    let text = serde_json::to_string(objects).unwrap();
    assert!(!text.contains("insecureSkipTLSVerify"));
}

#[test]
fn the_default_install_trusts_the_server_through_its_ca_bundle() {
    let Some(rendered) = rendered() else { return };
    let objects = &rendered.objects;
    let certs = rendered.certs();
    let read = |name: &str| std::fs::read(certs.join(name)).unwrap();

    assert!(
        !serde_json::to_string(objects)
            .unwrap()
            .contains("insecureSkipTLSVerify"),
        "trust is through caBundle, never insecureSkipTLSVerify"
    );
    // One APIService per version served, v1 preferred (the higher versionPriority).
    let served: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == "APIService")
        .map(|o| o["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(served, farm_apiserver::certs::API_SERVICES);
    for (name, version, priority) in [
        (farm_apiserver::certs::API_SERVICES[0], "v1", 200),
        (farm_apiserver::certs::API_SERVICES[1], "v1alpha", 100),
    ] {
        let spec = &find(objects, "APIService", name)["spec"];
        assert_eq!(spec["group"], "farm.example.com");
        assert_eq!(spec["version"], version);
        assert_eq!(spec["groupPriorityMinimum"], 100, "as metrics-server");
        assert_eq!(spec["versionPriority"], priority);
        assert_eq!(
            b64(spec["caBundle"].as_str().expect("caBundle set")),
            read("ca.crt"),
            "caBundle is the CA `farm-apiserver certs` wrote"
        );
    }

    // The Secret kustomize generates from the serving certificate, mounted by the Deployment
    // under its generated (hashed) name.
    let secret = only(objects, "Secret");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(secret["metadata"]["namespace"], NAMESPACE);
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    assert!(
        secret_name.starts_with("farm-apiserver-tls-"),
        "the name carries a content hash, so a new certificate rolls the Deployment: {secret_name}"
    );
    assert_eq!(
        b64(secret["data"]["tls.crt"].as_str().unwrap()),
        read("tls.crt")
    );
    assert_eq!(
        b64(secret["data"]["tls.key"].as_str().unwrap()),
        read("tls.key")
    );
    let deployment = find(objects, "Deployment", "farm-apiserver");
    assert_eq!(deployment["metadata"]["namespace"], NAMESPACE);
    let mount = secret_mount(deployment, secret_name);
    assert_eq!(mount["readOnly"], true);

    // The serving certificate: for the name the aggregator verifies, signed by the caBundle's CA.
    let crt = read("tls.crt");
    let (_, pem) = parse_x509_pem(&crt).unwrap();
    let cert = pem.parse_x509().unwrap();
    let ca_pem = read("ca.crt");
    let (_, ca_pem) = parse_x509_pem(&ca_pem).unwrap();
    let ca = ca_pem.parse_x509().unwrap();
    assert_eq!(cert.issuer().as_raw(), ca.subject().as_raw());
    assert!(cert.validity().is_valid());
    let sans: Vec<&str> = cert
        .subject_alternative_name()
        .unwrap()
        .expect("subjectAltName")
        .value
        .general_names
        .iter()
        .filter_map(|n| match n {
            GeneralName::DNSName(name) => Some(*name),
            _ => None,
        })
        .collect();
    let service = find(objects, "Service", "farm-apiserver");
    let service_name = service["metadata"]["name"].as_str().unwrap();
    let spec = &find(
        objects,
        "APIService",
        farm_apiserver::certs::API_SERVICES[0],
    )["spec"];
    assert_eq!(spec["service"]["name"], service_name);
    assert_eq!(
        spec["service"]["namespace"],
        service["metadata"]["namespace"]
    );
    assert_eq!(
        format!(
            "{service_name}.{}.svc",
            spec["service"]["namespace"].as_str().unwrap()
        ),
        SERVICE_DNS
    );
    for name in [
        "farm-apiserver",
        "farm-apiserver.farm-system",
        SERVICE_DNS,
        "farm-apiserver.farm-system.svc.cluster.local",
    ] {
        assert!(sans.contains(&name), "{name} not in {sans:?}");
    }
    assert!(
        cert.extended_key_usage()
            .unwrap()
            .is_none_or(|eku| eku.value.server_auth),
        "a serving certificate"
    );
}

mod components;
mod deployment;
mod image;
