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

#[tokio::test]
async fn the_deployment_runs_the_server_as_the_service_and_api_service_expect() {
    let Some(rendered) = rendered() else { return };
    let objects = &rendered.objects;
    let deployment = find(objects, "Deployment", "farm-apiserver");
    let spec = &deployment["spec"];
    assert_eq!(spec["replicas"], 1, "Llamas are in memory: one replica");
    let pod = &spec["template"]["spec"];
    let c = container(deployment);
    assert_eq!(
        c["image"],
        format!("farm-apiserver:{}", env!("CARGO_PKG_VERSION")),
        "the kustomize images: entry follows the crate's version"
    );

    // The flags, as the server reads them.
    let args = server_args(c);
    let https = named_port(c, "https");
    assert_eq!(https, 8443);
    assert_eq!(
        u64::from(args.bind.port()),
        https,
        "--bind listens on the named port"
    );
    assert!(
        args.bind.ip().is_unspecified(),
        "reachable from outside the pod"
    );
    assert_eq!(args.log_format, LogFormat::Json);
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/etc/farm-apiserver/tls")
        .expect("the serving certificate at /etc/farm-apiserver/tls");
    assert_eq!(mount["readOnly"], true);
    let mount_path = Path::new(mount["mountPath"].as_str().unwrap());
    assert_eq!(
        args.tls_cert_file.as_deref(),
        Some(mount_path.join("tls.crt").as_path())
    );
    assert_eq!(
        args.tls_private_key_file.as_deref(),
        Some(mount_path.join("tls.key").as_path())
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert!(
        volume["secret"]["secretName"]
            .as_str()
            .unwrap()
            .starts_with("farm-apiserver-tls"),
        "{volume}"
    );

    // Graceful shutdown fits in the grace period kubelet gives before SIGKILL.
    assert!(
        (1..=15).contains(&args.shutdown_delay),
        "a few seconds of failing readiness before the listener closes"
    );
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(
        grace >= args.shutdown_delay + args.shutdown_grace,
        "terminationGracePeriodSeconds {grace} < --shutdown-delay {} + --shutdown-grace {}",
        args.shutdown_delay,
        args.shutdown_grace
    );

    // Probes: over HTTPS on the named port, at paths the server answers 200 without credentials.
    for (kind, expected) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let get = &c[kind]["httpGet"];
        assert_eq!(get["scheme"], "HTTPS", "{kind}");
        assert_eq!(get["port"], "https", "{kind}");
        let path = get["path"].as_str().unwrap();
        assert_eq!(path, expected, "{kind}");
        assert_eq!(probe(path).await, 200, "{kind} {path}");
    }

    // Service → the named port; APIService → the Service's port.
    let service = find(objects, "Service", "farm-apiserver");
    assert_eq!(service["metadata"]["namespace"], NAMESPACE);
    let ports = service["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1);
    let port = &ports[0];
    assert_eq!(port["name"], "https");
    assert_eq!(port["port"], 443);
    assert!(
        port["targetPort"] == "https" || port["targetPort"] == https,
        "{port}"
    );
    let template_labels = &spec["template"]["metadata"]["labels"];
    for (key, value) in service["spec"]["selector"].as_object().unwrap() {
        assert_eq!(&template_labels[key], value, "the Service selects the pods");
    }
    for (key, value) in spec["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(
            &template_labels[key], value,
            "the Deployment selects its pods"
        );
    }
    for name in farm_apiserver::certs::API_SERVICES {
        let api_service = find(objects, "APIService", name);
        assert_eq!(api_service["spec"]["service"]["port"], port["port"]);
        assert_eq!(
            api_service["spec"]["service"]["name"],
            service["metadata"]["name"]
        );
    }

    // Hardening.
    let pod_security = &pod["securityContext"];
    assert_eq!(pod_security["runAsNonRoot"], true);
    assert_eq!(
        pod_security["runAsUser"], 65532,
        "the distroless nonroot user"
    );
    assert_eq!(pod_security["runAsGroup"], 65532);
    assert_eq!(pod_security["seccompProfile"]["type"], "RuntimeDefault");
    let security = &c["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert_ne!(security["privileged"], true);
    assert!(
        pod["hostNetwork"].is_null(),
        "host network only by component"
    );

    // Resources: both bounds for both, limit above request.
    let resources = &c["resources"];
    for what in ["cpu", "memory"] {
        let request = quantity(&resources["requests"][what]);
        let limit = quantity(&resources["limits"][what]);
        assert!(request > 0.0 && limit >= request, "{what}: {resources}");
    }
    // The bench's peak with 10,000 FarmPods (53.7 MiB) plus 100,000 Llamas (~90 MiB) fits.
    assert!(quantity(&resources["limits"]["memory"]) >= (54.0 + 90.0) * 1024.0 * 1024.0);

    // Namespaced objects say their namespace (no kustomize `namespace:`, which would move the
    // RoleBinding out of kube-system).
    for object in objects {
        let kind = object["kind"].as_str().unwrap();
        if [
            "ServiceAccount",
            "Secret",
            "Service",
            "Deployment",
            "RoleBinding",
        ]
        .contains(&kind)
        {
            assert!(
                object["metadata"]["namespace"].is_string(),
                "{kind} {} has no namespace",
                object["metadata"]["name"]
            );
        }
    }
}

#[test]
fn mirrord_targets_the_deployment_and_readme_runs_it_with_the_mounted_certificate() {
    let Some(rendered) = rendered() else { return };
    let deployment = find(&rendered.objects, "Deployment", "farm-apiserver");
    let c = container(deployment);
    let https = named_port(c, "https");
    let args = server_args(c);
    let cert = args.tls_cert_file.unwrap();
    let key = args.tls_private_key_file.unwrap();

    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(".mirrord/mirrord.json")).unwrap())
            .expect(".mirrord/mirrord.json is JSON");
    assert_eq!(
        config["target"]["path"],
        format!(
            "deployment/{}",
            deployment["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(
        config["target"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let incoming = &config["feature"]["network"]["incoming"];
    assert_eq!(incoming["mode"], "steal");
    assert!(
        incoming["ports"]
            .as_array()
            .unwrap()
            .contains(&json!(https)),
        "mirrord steals the container port {https}: {incoming}"
    );
    assert_eq!(config["feature"]["env"], true, "KUBERNETES_SERVICE_HOST");
    // The files read from the pod: its certificate, and its service-account token.
    let fs = &config["feature"]["fs"];
    if fs.is_object() {
        assert_eq!(fs["mode"], "localwithoverrides");
        let remote: Vec<String> = strings(&fs["read_only"])
            .iter()
            .map(|pattern| pattern.trim_start_matches('^').replace("\\.", "."))
            .collect();
        for file in [
            cert.to_str().unwrap(),
            key.to_str().unwrap(),
            "/var/run/secrets/kubernetes.io/serviceaccount/token",
        ] {
            assert!(
                remote
                    .iter()
                    .any(|prefix| file.starts_with(prefix.as_str())),
                "{file} is not read from the pod: {fs}"
            );
        }
    } else {
        assert!(fs == "read" || fs == "write", "{fs}");
    }

    // docs/storage.md's mirrord command: the same flags as the Deployment, for the pod's files.
    let readme = std::fs::read_to_string(root.join("docs/storage.md")).unwrap();
    let command = readme
        .split("```")
        .find(|block| block.contains("mirrord exec"))
        .expect("docs/storage.md has a mirrord exec command")
        .replace("\\\n", " ");
    let command = command
        .lines()
        .find(|line| line.contains("mirrord exec"))
        .unwrap();
    let words: Vec<&str> = command.split_whitespace().collect();
    assert!(
        command.contains(".mirrord/mirrord.json"),
        "the docs' mirrord line uses the config: {command}"
    );
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1).copied())
            .unwrap_or_else(|| panic!("{flag} missing from the docs' mirrord line: {command}"))
    };
    assert_eq!(after("--tls-cert-file"), cert.to_str().unwrap());
    assert_eq!(after("--tls-private-key-file"), key.to_str().unwrap());
    assert_eq!(after("--bind"), format!("0.0.0.0:{https}"));
}

#[test]
fn the_etcd_component_runs_replicas_on_etcd_and_keeps_one_through_disruptions() {
    let Some(rendered) = rendered() else { return };
    // A user's overlay of the default install with the etcd component.
    let overlay = rendered.dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../manifests
components:
  - ../manifests/components/etcd
",
    )
    .unwrap();
    let objects = &kustomize(&overlay);
    let deployment = find(objects, "Deployment", "farm-apiserver");
    let replicas = deployment["spec"]["replicas"].as_u64().unwrap();
    assert!(replicas >= 2, "{replicas} replicas");
    let args = server_args(container(deployment));
    assert_eq!(args.storage, farm_apiserver::config::Storage::Etcd);
    assert!(!args.etcd_servers.is_empty());
    assert!(args.etcd_servers.iter().all(|s| s.starts_with("https://")));
    // The client certificate's files are where the Secret is mounted.
    let mount = secret_mount(deployment, "farm-apiserver-etcd");
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    for file in [&args.etcd_cafile, &args.etcd_certfile, &args.etcd_keyfile] {
        let file = file.as_deref().expect("etcd TLS files are set");
        assert!(
            file.starts_with(dir),
            "{} outside {}",
            file.display(),
            dir.display()
        );
    }
    // Spread over nodes, and one always up.
    let pod = &deployment["spec"]["template"]["spec"];
    let spread = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
        [0]["podAffinityTerm"];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(
        spread["labelSelector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    let budget = find(objects, "PodDisruptionBudget", "farm-apiserver");
    assert_eq!(budget["spec"]["minAvailable"], 1);
    assert_eq!(
        budget["spec"]["selector"]["matchLabels"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert!(
        (budget["spec"]["minAvailable"].as_u64().unwrap()) < replicas,
        "a drain can still evict one"
    );
}

#[test]
fn the_cert_manager_overlay_issues_the_mounted_secret_and_injects_its_ca() {
    let Some(rendered) = rendered_overlay(Some("cert-manager")) else {
        return;
    };
    let objects = &rendered.objects;
    assert!(
        !objects.iter().any(|o| o["kind"] == "Secret"),
        "cert-manager writes the Secret"
    );
    let text = serde_json::to_string(objects).unwrap();
    assert!(!text.contains("insecureSkipTLSVerify"));
    assert!(!text.contains("caBundle"), "cainjector writes it");

    let deployment = find(objects, "Deployment", "farm-apiserver");
    let mount = secret_mount(deployment, "farm-apiserver-tls");
    assert_eq!(mount["mountPath"], "/etc/farm-apiserver/tls");

    let certificate = |secret: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == "Certificate" && o["spec"]["secretName"] == secret)
            .unwrap_or_else(|| panic!("no Certificate writes Secret {secret}"))
    };
    let issuer = |reference: &Value| {
        assert_eq!(reference["kind"], "Issuer");
        find(objects, "Issuer", reference["name"].as_str().unwrap())
    };
    let serving = certificate("farm-apiserver-tls");
    assert_eq!(serving["metadata"]["namespace"], NAMESPACE);
    let dns_names = strings(&serving["spec"]["dnsNames"]);
    for name in [
        "farm-apiserver",
        "farm-apiserver.farm-system",
        SERVICE_DNS,
        "farm-apiserver.farm-system.svc.cluster.local",
    ] {
        assert!(dns_names.contains(&name), "{name} not in {dns_names:?}");
    }
    assert_ne!(serving["spec"]["isCA"], true);
    // serving ← CA Issuer ← CA Certificate ← self-signed Issuer.
    let ca_issuer = issuer(&serving["spec"]["issuerRef"]);
    let ca_secret = ca_issuer["spec"]["ca"]["secretName"].as_str().unwrap();
    let ca = certificate(ca_secret);
    assert_eq!(ca["spec"]["isCA"], true);
    let root = issuer(&ca["spec"]["issuerRef"]);
    assert!(root["spec"]["selfSigned"].is_object(), "{root}");
    for object in [serving, ca, ca_issuer, root] {
        assert_eq!(object["metadata"]["namespace"], NAMESPACE);
    }

    let api_services: Vec<_> = objects
        .iter()
        .filter(|o| o["kind"] == "APIService")
        .collect();
    assert_eq!(api_services.len(), 2, "one per version");
    for api_service in api_services {
        assert_eq!(
            api_service["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            format!(
                "{NAMESPACE}/{}",
                serving["metadata"]["name"].as_str().unwrap()
            )
        );
    }
}

#[tokio::test]
async fn the_components_do_what_they_say() {
    let Some(rendered) = rendered() else { return };
    // A user's overlay of the default install with every component.
    let overlay = rendered.dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../manifests
components:
  - ../manifests/components/host-network
  - ../manifests/components/network-policy
  - ../manifests/components/flow-control
",
    )
    .unwrap();
    let objects = kustomize(&overlay);
    assert_eq!(
        objects.len(),
        rendered.objects.len() + 3,
        "the components add a NetworkPolicy, a FlowSchema and a PriorityLevelConfiguration"
    );

    // host-network
    let deployment = find(&objects, "Deployment", "farm-apiserver");
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(
        deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"], 0,
        "two pods cannot both hold the host's port"
    );
    assert_eq!(
        container(deployment)["image"],
        find(&rendered.objects, "Deployment", "farm-apiserver")["spec"]["template"]["spec"]["containers"]
            [0]["image"],
        "the rest of the Deployment is the default install's"
    );

    // network-policy: the server's pods, ingress on its port only, egress open.
    let https = named_port(container(deployment), "https");
    let policy = only(&objects, "NetworkPolicy");
    assert_eq!(
        policy["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    let selector = policy["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .unwrap();
    assert!(!selector.is_empty());
    for (key, value) in selector {
        assert_eq!(&labels[key], value, "the policy selects the server's pods");
    }
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));
    let ingress = policy["spec"]["ingress"].as_array().unwrap();
    assert_eq!(ingress.len(), 1);
    assert_eq!(
        ingress[0]["ports"],
        json!([{"protocol": "TCP", "port": https}])
    );

    // flow-control: every request for the served resources, from anyone, in a limited level.
    let schema = only(&objects, "FlowSchema");
    let level = only(&objects, "PriorityLevelConfiguration");
    for object in [schema, level] {
        assert_eq!(object["apiVersion"], "flowcontrol.apiserver.k8s.io/v1");
        assert!(object["metadata"]["namespace"].is_null(), "cluster-scoped");
    }
    assert_eq!(
        schema["spec"]["priorityLevelConfiguration"]["name"],
        level["metadata"]["name"]
    );
    assert_eq!(level["spec"]["type"], "Limited");
    let shares = level["spec"]["limited"]["nominalConcurrencyShares"]
        .as_u64()
        .unwrap();
    assert!((1..=20).contains(&shares), "a small share: {shares}");
    assert_eq!(level["spec"]["limited"]["limitResponse"]["type"], "Queue");
    let precedence = schema["spec"]["matchingPrecedence"].as_u64().unwrap();
    assert!(
        (1000..9000).contains(&precedence),
        "after the control plane's schemas, before service-accounts and global-default: {precedence}"
    );
    let rules = schema["spec"]["rules"].as_array().unwrap();
    assert_eq!(rules.len(), 1);
    let mut groups = rules[0]["subjects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["kind"], "Group");
            s["group"]["name"].as_str().unwrap()
        })
        .collect::<Vec<_>>();
    groups.sort();
    assert_eq!(groups, ["system:authenticated", "system:unauthenticated"]);
    let resource_rule = &rules[0]["resourceRules"][0];
    assert_eq!(resource_rule["apiGroups"], json!(["farm.example.com"]));
    let mut resources = strings(&resource_rule["resources"]);
    resources.sort();
    assert_eq!(resources, served_resources().await, "every served resource");
    assert_eq!(resource_rule["verbs"], json!(["*"]));
    assert_eq!(resource_rule["clusterScope"], true);
    assert_eq!(resource_rule["namespaces"], json!(["*"]));
}

/// No image can be built here, so CI builds what the Dockerfile builds, with the very same
/// cargo command.
#[test]
fn ci_runs_the_dockerfiles_build_command() {
    const BUILD: &str = "cargo build --profile dist --locked -p farm-apiserver";
    let dockerfile = include_str!("../../Dockerfile");
    let ci = include_str!("../../.ci/run");
    assert!(
        dockerfile.contains(BUILD),
        "the Dockerfile builds with {BUILD:?}"
    );
    assert!(
        ci.lines().any(|l| l.trim() == BUILD),
        ".ci/run runs {BUILD:?} on a line of its own"
    );
}

/// The image's build sees the whole workspace: the Dockerfile copies every member's folder (cargo
/// refuses a workspace with a member missing), which CI's build from the clone cannot show.
#[test]
fn the_dockerfile_copies_every_workspace_member() {
    let manifest = include_str!("../../Cargo.toml");
    let dockerfile = include_str!("../../Dockerfile");
    let members = manifest
        .lines()
        .find_map(|l| l.strip_prefix("members = "))
        .expect("[workspace] members on one line");
    let members: Vec<String> = serde_json::from_str(members).unwrap();
    assert!(members.iter().any(|m| m == "fieldmanager"), "{members:?}");
    for member in members.iter().filter(|m| *m != ".") {
        let copy = format!("COPY {member} ./{member}");
        assert!(
            dockerfile.lines().any(|l| l.trim() == copy),
            "the Dockerfile has no {copy:?}"
        );
    }
}

/// The final stage of the Dockerfile, read as docker reads it: (USER, ENTRYPOINT, CMD, EXPOSE).
fn dockerfile_final_stage() -> (String, Value, Value, Vec<String>) {
    let dockerfile = include_str!("../../Dockerfile");
    let last = dockerfile.rsplit("\nFROM ").next().unwrap();
    let instruction = |word: &str| {
        last.lines()
            .find_map(|l| l.strip_prefix(word).map(str::trim))
            .unwrap_or_else(|| panic!("{word} in the final stage"))
            .to_owned()
    };
    (
        instruction("USER "),
        serde_json::from_str(&instruction("ENTRYPOINT ")).unwrap(),
        serde_json::from_str(&instruction("CMD ")).unwrap(),
        instruction("EXPOSE ")
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
    )
}

/// No docker here: tests/node/image.py assembles the image the lab node runs. It must be the
/// Dockerfile's final stage: the same build, user, entrypoint, arguments and port, and only the
/// binary, the libraries it links and the nonroot user in it.
#[test]
fn the_node_image_is_the_dockerfiles_final_stage() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/node/image.py");
    let python = |args: &[&str]| Command::new("python3").arg(script).args(args).output();
    let Ok(printed) = python(&["--print-config"]) else {
        eprintln!("SKIPPED: python3 is not on PATH");
        return;
    };
    assert!(printed.status.success(), "{printed:?}");
    let printed: Value = serde_json::from_slice(&printed.stdout).unwrap();
    let (user, entrypoint, cmd, expose) = dockerfile_final_stage();
    assert_eq!(
        printed["build"],
        "cargo build --profile dist --locked -p farm-apiserver"
    );
    assert!(include_str!("../../Dockerfile").contains(printed["build"].as_str().unwrap()));
    assert_eq!(printed["user"], user);
    assert_eq!(printed["entrypoint"], entrypoint);
    assert_eq!(printed["cmd"], cmd);
    assert_eq!(printed["expose"], json!(expose));

    // Assembled from this build's binary: what is in it.
    let out = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_farm-apiserver");
    let made = python(&[
        "--binary",
        binary,
        "--out",
        out.path().to_str().unwrap(),
        "--tag",
        "test",
        "--no-import",
    ])
    .unwrap();
    assert!(made.status.success(), "{made:?}");
    let archive = out.path().join("farm-apiserver_test.tar");
    let unpacked = out.path().join("unpacked");
    std::fs::create_dir(&unpacked).unwrap();
    let tar = |args: &[&str]| {
        let out = Command::new("tar").args(args).output().expect("tar");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    tar(&[
        "-xf",
        archive.to_str().unwrap(),
        "-C",
        unpacked.to_str().unwrap(),
    ]);
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(unpacked.join("manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        manifest[0]["RepoTags"],
        json!(["docker.io/library/farm-apiserver:test"])
    );
    let config: Value = serde_json::from_str(
        &std::fs::read_to_string(unpacked.join(manifest[0]["Config"].as_str().unwrap())).unwrap(),
    )
    .unwrap();
    assert_eq!(config["config"]["User"], user);
    assert_eq!(config["config"]["Entrypoint"], entrypoint);
    assert_eq!(config["config"]["Cmd"], cmd);
    let layer = unpacked.join(manifest[0]["Layers"][0].as_str().unwrap());
    let listing = tar(&["--numeric-owner", "-tvf", layer.to_str().unwrap()]);
    let ldd = Command::new("ldd").arg(binary).output().unwrap();
    let libraries: Vec<String> = String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|w| w.starts_with('/'))
        .map(|w| w.trim_start_matches('/').to_owned())
        .collect();
    assert!(!libraries.is_empty());
    let mut files = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (mode, owner, name) = (fields[0], fields[1], *fields.last().unwrap());
        if mode.starts_with('d') {
            if name.trim_end_matches('/') == "home/nonroot" {
                assert_eq!(owner, "65532/65532", "{line}");
            }
            continue;
        }
        files.push(name.to_owned());
    }
    for file in &files {
        assert!(
            ["farm-apiserver", "etc/passwd", "etc/group"].contains(&file.as_str())
                || libraries.contains(file),
            "{file} is in the image but not in the Dockerfile's"
        );
    }
    for lib in &libraries {
        assert!(files.contains(lib), "{lib} is linked but not in the image");
    }
    let passwd = tar(&["-xOf", layer.to_str().unwrap(), "etc/passwd"]);
    assert!(passwd.contains("nonroot:x:65532:65532:"), "{passwd}");
}

/// The audit component: the server is told a policy file that a ConfigMap of the policy
/// mounts, the policy is one the server loads, and events go to standard output.
#[tokio::test]
async fn the_audit_component_mounts_a_policy_the_server_loads() {
    let Some(rendered) = rendered() else { return };
    let overlay = rendered.dir.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ../manifests
components:
  - ../manifests/components/audit
",
    )
    .unwrap();
    let objects = kustomize(&overlay);
    assert_eq!(
        objects.len(),
        rendered.objects.len() + 1,
        "one ConfigMap more"
    );
    let config_map = only(&objects, "ConfigMap");
    let deployment = find(&objects, "Deployment", "farm-apiserver");
    assert_eq!(
        config_map["metadata"]["namespace"],
        deployment["metadata"]["namespace"]
    );
    let args = server_args(container(deployment));
    let policy_file = args.audit_policy_file.expect("--audit-policy-file");
    assert_eq!(
        args.audit_log_path.as_deref(),
        Some(Path::new("-")),
        "events to standard output"
    );
    // The file the flag names is the ConfigMap's key, mounted where the flag says.
    let mount = container(deployment)["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| policy_file.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("a volume mounted where the policy is");
    let volume = deployment["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(
        volume["configMap"]["name"], config_map["metadata"]["name"],
        "the generated ConfigMap (its hashed name)"
    );
    let key = policy_file.file_name().unwrap().to_str().unwrap();
    let text = config_map["data"][key].as_str().expect("the policy's key");
    let policy =
        aggregated_apiserver::audit::Policy::parse(text).expect("a policy the server loads");
    // Discovery is not written; a Llama write is, with its objects.
    let info =
        |method, path| aggregated_apiserver::request_info::RequestInfo::parse(&method, path, None);
    let user = aggregated_apiserver::auth::UserInfo::default();
    use aggregated_apiserver::audit::Level;
    use hyper::Method;
    assert_eq!(
        policy
            .evaluate(Some(&user), &info(Method::GET, "/apis"))
            .level,
        Level::None
    );
    assert_eq!(
        policy
            .evaluate(
                Some(&user),
                &info(
                    Method::POST,
                    "/apis/farm.example.com/v1alpha/namespaces/default/llamas"
                )
            )
            .level,
        Level::RequestResponse
    );
    assert_eq!(
        policy
            .evaluate(
                Some(&user),
                &info(
                    Method::GET,
                    "/apis/farm.example.com/v1alpha/namespaces/default/llamas"
                )
            )
            .level,
        Level::Metadata
    );
}
