//! The Deployment runs the server as the Service, the APIService and mirrord expect.

use super::*;

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
