//! The components of manifests/ (etcd, cert-manager, audit and the rest) do what they say.

use super::*;

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
