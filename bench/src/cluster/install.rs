//! Installing both Llamas in the cluster as a user would (the shipped manifests rendered, the
//! CustomResourceDefinition beside them), filling them, and removing everything afterwards.

use super::*;

/// What the scenario put into the cluster, and the server behind it; removed when dropped (the
/// APIService first: a stale one breaks discovery and namespace deletion cluster-wide), then
/// the server stops.
pub(crate) struct Installed {
    pub(crate) kubectl: Kubectl,
    /// Everything applied besides the APIService, the CRD and the Llamas' namespace.
    pub(crate) rest: Value,
    pub(crate) namespace: String,
    /// Namespaces and the CRD to wait for, so whoever uses the cluster next finds it clean.
    pub(crate) gone: Vec<String>,
    pub(crate) server: Option<Proc>,
}

impl Drop for Installed {
    fn drop(&mut self) {
        let started = Instant::now();
        let k = &self.kubectl;
        let mut failed = Vec::new();
        for (what, args, stdin) in [
            (
                "APIService",
                vec!["delete", "apiservice", API_SERVICE, "--ignore-not-found"],
                None,
            ),
            (
                "CRD",
                vec!["delete", "crd", CRD, "--ignore-not-found", "--wait=false"],
                None,
            ),
            (
                "namespace",
                vec![
                    "delete",
                    "namespace",
                    &self.namespace,
                    "--ignore-not-found",
                    "--wait=false",
                ],
                None,
            ),
            (
                "Service, RBAC",
                vec!["delete", "-f", "-", "--ignore-not-found", "--wait=false"],
                Some(self.rest.to_string()),
            ),
        ] {
            let (ok, _, err) = k.try_run(&args, stdin.as_deref());
            if !ok {
                failed.push(format!("{what}: {}", err.trim()));
            }
        }
        let mut wait = vec!["wait", "--for=delete", "--timeout=60s"];
        wait.extend(self.gone.iter().map(String::as_str));
        let (ok, _, err) = k.try_run(&wait, None);
        if !ok {
            failed.push(format!("still there after 60 s: {}", err.trim()));
        }
        if let Some(server) = self.server.take() {
            drop(server);
        }
        if failed.is_empty() {
            println!(
                "  removed the APIService, the CRD, the namespaces, the Service and the RBAC ({:.1} s)",
                started.elapsed().as_secs_f64()
            );
        } else {
            println!("  cleanup incomplete: {}", failed.join("; "));
        }
    }
}

pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from).with_context(|| from.display().to_string())? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            if entry.file_name() != "certs" {
                copy_dir(&entry.path(), &target)?;
            }
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

/// The shipped manifests as a user installs them: copied, `farm-apiserver certs` written into
/// the copy's `certs/`, rendered by the kustomize built into kubectl. Returns the objects.
pub(crate) fn render(server: &Path, manifests: &Path, dir: &Path) -> Result<Vec<Value>> {
    let copy = dir.join("manifests");
    copy_dir(manifests, &copy)?;
    let out = Command::new(server)
        .args([
            "certs",
            "--namespace",
            SERVICE_NAMESPACE,
            "--service",
            SERVICE,
        ])
        .arg("--out")
        .arg(copy.join("certs"))
        .output()
        .with_context(|| format!("{} certs", server.display()))?;
    ensure!(
        out.status.success(),
        "farm-apiserver certs: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(&copy)
        .output()
        .context("kubectl kustomize (kubectl must be on PATH)")?;
    ensure!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        manifests.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout)?;
    let mut objects = Vec::new();
    for doc in text.split("\n---\n") {
        let object: Value = serde_saphyr::from_str(doc).context("kustomize output")?;
        if object.is_object() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// The CustomResourceDefinition: the same Llama (spec.weight and spec.height, numbers greater
/// than 0, both required), namespaced, in `crd.farm.example.com`.
pub(crate) fn crd() -> Value {
    let positive = |what: &str| {
        json!({"type": "number", "format": "double", "minimum": 0, "exclusiveMinimum": true,
               "description": what})
    };
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": CRD},
        "spec": {
            "group": CRD_GROUP,
            "scope": "Namespaced",
            "names": {"kind": "Llama", "listKind": "LlamaList", "plural": "llamas", "singular": "llama"},
            "versions": [{
                "name": VERSION,
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "required": ["spec"],
                    "properties": {"spec": {
                        "type": "object",
                        "required": ["weight", "height"],
                        "properties": {
                            "weight": positive("Weight of the llama in kilograms."),
                            "height": positive("Height of the llama at the shoulder, in metres."),
                        },
                    }},
                }},
                "additionalPrinterColumns": [
                    {"name": "Weight", "type": "number", "jsonPath": ".spec.weight"},
                    {"name": "Height", "type": "number", "jsonPath": ".spec.height"},
                    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
                ],
            }],
        },
    })
}

/// What is applied: the rendered manifests without the Deployment, its Secret and the
/// ClusterIP Service (this process runs the server), an ExternalName Service to `localhost` on
/// `port`, the APIService pointing at it (the manifests' own, or one made from the certs'
/// CA when they hold none), the CRD and the Llamas' namespace.
pub(crate) fn objects(
    rendered: Vec<Value>,
    certs: &Path,
    port: u16,
    namespace: &str,
) -> Result<Vec<Value>> {
    let mut items: Vec<Value> = rendered
        .into_iter()
        .filter(|o| {
            !["Deployment", "Service", "Secret"].contains(&o["kind"].as_str().unwrap_or(""))
        })
        .collect();
    let ca = std::fs::read(certs.join("ca.crt")).context("certs/ca.crt")?;
    let ca_bundle = base64::engine::general_purpose::STANDARD.encode(ca);
    let api_service = match items.iter_mut().find(|o| o["kind"] == "APIService") {
        Some(api_service) => api_service,
        None => {
            println!(
                "  note: the manifests hold no APIService; registering {API_SERVICE} with the CA `farm-apiserver certs` wrote"
            );
            items.push(json!({
                "apiVersion": "apiregistration.k8s.io/v1",
                "kind": "APIService",
                "metadata": {"name": API_SERVICE},
                "spec": {
                    "group": GROUP,
                    "version": VERSION,
                    "groupPriorityMinimum": 1000,
                    "versionPriority": 15,
                    "service": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
                },
            }));
            items.last_mut().context("just pushed")?
        }
    };
    if !api_service["spec"]["caBundle"].is_string() {
        api_service["spec"]["caBundle"] = json!(ca_bundle);
    }
    let service = api_service["spec"]["service"].clone();
    ensure!(
        service["name"] == SERVICE && service["namespace"] == SERVICE_NAMESPACE,
        "the APIService points at {service}; the serving certificate is for {SERVICE}.{SERVICE_NAMESPACE}.svc"
    );
    api_service["spec"]["service"]["port"] = json!(port);
    items.push(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": SERVICE_NAMESPACE},
        "spec": {
            "type": "ExternalName",
            "externalName": "localhost",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
    }));
    if !items
        .iter()
        .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == SERVICE_NAMESPACE)
    {
        items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SERVICE_NAMESPACE}}));
    }
    items.push(crd());
    items.push(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}));
    Ok(items)
}

/// Llama `i`, the same for both kinds but for its apiVersion.
pub(crate) fn llama(api_version: &str, i: usize) -> Value {
    json!({"apiVersion": api_version, "kind": "Llama",
        "metadata": {"name": format!("l-{i:05}"), "labels": {"herd": format!("h{}", i % 10)}},
        "spec": {"weight": 10.0 + i as f64, "height": 1.5}})
}

/// Creates the 1,000 Llamas of `group` with kube-rs, 32 at a time.
pub(crate) async fn create_llamas(
    client: &kube::Client,
    group: &str,
    namespace: &str,
) -> Result<()> {
    use kube::{
        Api,
        api::{ApiResource, DynamicObject},
    };
    let resource = ApiResource {
        group: group.to_owned(),
        version: VERSION.to_owned(),
        api_version: format!("{group}/{VERSION}"),
        kind: "Llama".to_owned(),
        plural: "llamas".to_owned(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &resource);
    futures::stream::iter(0..LLAMAS)
        .map(|i| create_llama(&api, &resource.api_version, i))
        .buffer_unordered(32)
        .try_collect::<()>()
        .await
}

/// Creates Llama `i`; one already there is kept, a transient error (the group not served yet)
/// retried for up to 30 s.
pub(crate) async fn create_llama(
    api: &kube::Api<kube::api::DynamicObject>,
    api_version: &str,
    i: usize,
) -> Result<()> {
    let object: kube::api::DynamicObject = serde_json::from_value(llama(api_version, i))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match api.create(&Default::default(), &object).await {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.code == 409 => return Ok(()),
            Err(kube::Error::Api(status)) if ![404, 429, 500, 503, 504].contains(&status.code) => {
                bail!("creating {api_version} Llama {i}: {}", status.message)
            }
            Err(e) if Instant::now() > deadline => {
                return Err(anyhow!(e).context(format!("creating {api_version} Llama {i}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// Starts farm-apiserver as the install does (the serving certificate from `certs`, the cluster
/// from the kubeconfig), pinned like the other scenarios' servers; returns once /readyz is 200.
pub(crate) async fn start_server(
    args: &RunArgs,
    kubeconfig: &Path,
    certs: &Path,
    access: &Access,
    storage: &[String],
) -> Result<Proc> {
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
    let mut command = Command::new(&args.server);
    if !args.server_cpus.is_empty() {
        affinity::pin_command(&mut command, &args.server_cpus)?;
    }
    let child = command
        .arg("--bind")
        .arg(addr.to_string())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--tls-cert-file")
        .arg(certs.join("tls.crt"))
        .arg("--tls-private-key-file")
        .arg(certs.join("tls.key"))
        .args(["--no-sample-data", "--log-level", "warn"])
        .args(storage)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", args.server.display()))?;
    let mut proc = Proc { child, addr };
    let ca = std::fs::read_to_string(certs.join("ca.crt"))?;
    let t = Target::new(addr, &ca, &access.identity, Vec::new())?
        .with_server_name(&format!("{SERVICE}.{SERVICE_NAMESPACE}.svc"))?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut conn) = t.connect(Proto::H1).await
            && let Ok(reply) = conn.get("/readyz", &[]).await
            && reply.status == 200
        {
            return Ok(proc);
        }
        if let Some(status) = proc.child.try_wait()? {
            bail!("farm-apiserver exited: {status}");
        }
        ensure!(
            Instant::now() < deadline,
            "farm-apiserver did not become ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// GET `path` through kube-apiserver once: 200 and the body, or an error.
pub(crate) async fn get_once(t: &Target, path: &str) -> Result<Value> {
    let mut conn = t.connect(Proto::H2).await?;
    let reply = conn.get(path, &[("accept", "application/json")]).await?;
    ensure!(
        reply.status == 200,
        "GET {path}: {} {}",
        reply.status,
        String::from_utf8_lossy(&reply.body)
    );
    Ok(serde_json::from_slice(&reply.body)?)
}

/// Waits until `path` answers 200 through kube-apiserver (the aggregator's and the CRD
/// handler's view of a new group can lag their conditions by a moment).
pub(crate) async fn served(t: &Target, path: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match get_once(t, path).await {
            Ok(body) => return Ok(body),
            Err(e) if Instant::now() > deadline => return Err(e),
            Err(_) => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}
