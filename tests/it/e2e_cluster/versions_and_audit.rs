//! Both versions through the aggregator, and the audit IDs and traces that join this server's
//! records to kube-apiserver's.

use super::*;

/// Both versions through kube-apiserver, each APIService Available: kubectl picks v1, names
/// v1alpha when asked; what is applied through one is read through the other; `kubectl explain`
/// per version; kube-rs typed clients of each, and a v1alpha watch during a v1 write.
pub(super) async fn versions_through_the_aggregator(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
) {
    use farm_apiserver::resources::llama::{NICKNAME_ANNOTATION, v1, v1alpha};
    step("versions: v1 preferred, v1alpha beside it, one object read through both");
    let group: Value =
        serde_json::from_str(&cluster.ok(&["get", "--raw", "/apis/farm.example.com"], None))
            .unwrap();
    assert_eq!(group["preferredVersion"]["version"], "v1", "{group}");
    assert_eq!(group["versions"].as_array().unwrap().len(), 2, "{group}");

    let older = format!(
        "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: versioned
  namespace: {ns}
spec:
  weight: 44
  height: 1.3
"
    );
    cluster.ok(&["apply", "-f", "-"], Some(&older));
    let weight_kg = cluster.ok(
        &[
            "get",
            "llama",
            "versioned",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.weightKg}",
        ],
        None,
    );
    assert_eq!(weight_kg, "44");
    let weight = cluster.ok(
        &[
            "get",
            "llamas.v1alpha.farm.example.com",
            "versioned",
            "-n",
            ns,
            "-o",
            "jsonpath={.spec.weight}",
        ],
        None,
    );
    assert_eq!(weight, "44");

    let out = cluster
        .eventually(
            &["explain", "llamas.spec.weightKg"],
            Duration::from_secs(60),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("VERSION:    v1\n"), "{out}");
    let out = cluster
        .eventually(
            &[
                "explain",
                "llamas.spec.weight",
                "--api-version=farm.example.com/v1alpha",
            ],
            Duration::from_secs(60),
            |ok, _, _| ok,
        )
        .await;
    assert!(out.contains("VERSION:    v1alpha"), "{out}");

    step("versions: kube-rs typed clients of both, a v1alpha watch during a v1 write");
    let client = cluster.client().await;
    let newer: Api<v1::Llama> = Api::namespaced(client.clone(), ns);
    let older: Api<v1alpha::Llama> = Api::namespaced(client, ns);
    let rv = older
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = older
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let mut named = v1::Llama::new(
        "nicknamed",
        v1::LlamaSpec {
            weight_kg: 55.0,
            height_metres: 1.5,
            nickname: Some("Nick".into()),
        },
    );
    named.metadata.namespace = Some(ns.into());
    newer.create(&PostParams::default(), &named).await.unwrap();
    let seen = crate::versions::next(&mut events).await;
    assert_eq!(seen.spec.weight, 55.0);
    assert_eq!(
        seen.metadata.annotations.as_ref().unwrap()[NICKNAME_ANNOTATION],
        "Nick"
    );
    let read = newer.get("nicknamed").await.unwrap();
    assert_eq!(read.spec.nickname.as_deref(), Some("Nick"));
    cluster.ok(
        &["delete", "llama", "versioned", "nicknamed", "-n", ns],
        None,
    );
}

/// One `kubectl create` through kube-apiserver: the `Audit-Id` kube-apiserver answers (its own
/// audit ID, which its aggregator sends on) is the ID of this server's events for that write,
/// with the user kube-apiserver authenticated, the verb, the Llama and the 201.
pub(super) async fn audit_ids_join(
    cluster: &Cluster,
    ns: &str,
    step: &dyn Fn(&str),
    log: &std::path::Path,
) {
    step("audit: kube-apiserver's audit ID is this server's");
    let whoami = cluster.ok(
        &[
            "auth",
            "whoami",
            "-o",
            "jsonpath={.status.userInfo.username}",
        ],
        None,
    );
    let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "audited", "namespace": ns}, "spec": {"weight": 2.0, "height": 1.0}});
    // -v=8: kubectl prints each response's headers.
    let (ok, _, err) = cluster.run(&["create", "-f", "-", "-v=8"], Some(&llama.to_string()));
    assert!(ok, "{err}");
    let ids: Vec<String> = err
        .lines()
        .filter_map(|line| line.split("Audit-Id: ").nth(1))
        .map(|id| id.trim().to_owned())
        .collect();
    assert!(!ids.is_empty(), "kube-apiserver answers Audit-Id: {err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let event = loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|e| {
                e["verb"] == "create"
                    && e["objectRef"]["name"] == "audited"
                    && e["stage"] == "ResponseComplete"
            });
        if let Some(event) = found {
            break event;
        }
        assert!(
            Instant::now() < deadline,
            "no event for the create in {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let id = event["auditID"].as_str().unwrap().to_owned();
    assert!(
        ids.contains(&id),
        "the event's auditID {id} is one kube-apiserver answered: {ids:?}"
    );
    assert_eq!(event["user"]["username"].as_str(), Some(whoami.trim()));
    assert_eq!(event["objectRef"]["namespace"], ns);
    assert_eq!(event["objectRef"]["resource"], "llamas");
    assert_eq!(event["responseStatus"]["code"], 201);
    assert_eq!(
        event["annotations"]["authorization.k8s.io/decision"],
        "allow"
    );
    // The policy's levels: a create with both objects; FarmPods not at all; a list at
    // Metadata, without its objects.
    assert_eq!(event["level"], "RequestResponse");
    assert_eq!(event["requestObject"]["metadata"]["name"], "audited");
    assert!(
        event["responseObject"]["metadata"]["uid"].is_string(),
        "{event}"
    );
    cluster.ok(&["get", "farmpods", "-n", ns], None);
    cluster.ok(&["get", "llamas", "-n", ns], None);
    let deadline = Instant::now() + Duration::from_secs(10);
    let listed = loop {
        let events: Vec<Value> = std::fs::read_to_string(log)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .collect();
        let lists: Vec<&Value> = events
            .iter()
            .filter(|e| e["verb"] == "list" && e["objectRef"]["namespace"] == ns)
            .collect();
        if let Some(listed) = lists
            .iter()
            .find(|e| e["objectRef"]["resource"] == "llamas")
        {
            assert!(
                !lists
                    .iter()
                    .any(|e| e["objectRef"]["resource"] == "farmpods"),
                "FarmPods are left out: {lists:?}"
            );
            break (*listed).clone();
        }
        assert!(Instant::now() < deadline, "no event for the list");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(listed["level"], "Metadata");
    assert!(listed.get("responseObject").is_none(), "{listed}");
    cluster.ok(&["delete", "llama", "audited", "-n", ns], None);
}

/// A second kube-apiserver of the lab's (`$K8S_LAB_HOME`, default `~/.k8s-lab`): its etcd, PKI
/// and flags, on a port of its own, with its own audit log and traces on (the lab's own runs
/// without either). It serves the same cluster, so its aggregator proxies to this server too.
pub(super) struct AuditedApiserver {
    child: std::process::Child,
    cluster: Cluster,
    audit_log: PathBuf,
    _dir: tempfile::TempDir,
}

impl AuditedApiserver {
    /// None (and why, printed) without the lab's binaries and PKI.
    async fn start(trace_port: u16) -> Option<Self> {
        let home = match std::env::var_os("K8S_LAB_HOME") {
            Some(home) => PathBuf::from(home),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".k8s-lab"),
        };
        let (binary, pki) = (home.join("bin/kube-apiserver"), home.join("pki"));
        if !binary.exists() || !pki.join("front-proxy-ca.crt").exists() {
            eprintln!(
                "SKIPPED (this step): no lab kube-apiserver and PKI in {}, to run a second kube-apiserver with its audit log and traces on",
                home.display()
            );
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let policy = dir.path().join("audit-policy.yaml");
        std::fs::write(
            &policy,
            "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules:\n- level: Metadata\n",
        )
        .unwrap();
        let tracing = dir.path().join("tracing.yaml");
        std::fs::write(
            &tracing,
            format!(
                "apiVersion: apiserver.config.k8s.io/v1\nkind: TracingConfiguration\nendpoint: 127.0.0.1:{trace_port}\nsamplingRatePerMillion: 1000000\n"
            ),
        )
        .unwrap();
        let audit_log = dir.path().join("audit.log");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let p = |file: &str| pki.join(file).display().to_string();
        let log = std::fs::File::create(dir.path().join("kube-apiserver.log")).unwrap();
        // The lab's flags (up.sh, without a node), and the audit log and traces.
        let child = Command::new(&binary)
            .args([
                "--etcd-servers=http://127.0.0.1:2379".to_owned(),
                "--bind-address=127.0.0.1".to_owned(),
                "--advertise-address=127.0.0.1".to_owned(),
                format!("--secure-port={port}"),
                format!("--cert-dir={}", dir.path().join("certs").display()),
                format!("--tls-cert-file={}", p("apiserver.crt")),
                format!("--tls-private-key-file={}", p("apiserver.key")),
                format!("--client-ca-file={}", p("ca.crt")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".to_owned(),
                format!("--service-account-key-file={}", p("sa.pub")),
                format!("--service-account-signing-key-file={}", p("sa.key")),
                "--service-cluster-ip-range=10.0.0.0/24".to_owned(),
                "--authorization-mode=Node,RBAC".to_owned(),
                format!("--requestheader-client-ca-file={}", p("front-proxy-ca.crt")),
                "--requestheader-allowed-names=front-proxy-client".to_owned(),
                "--requestheader-username-headers=X-Remote-User".to_owned(),
                "--requestheader-group-headers=X-Remote-Group".to_owned(),
                "--requestheader-uid-headers=X-Remote-Uid".to_owned(),
                "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
                format!("--proxy-client-cert-file={}", p("front-proxy-client.crt")),
                format!("--proxy-client-key-file={}", p("front-proxy-client.key")),
                "--enable-aggregator-routing=false".to_owned(),
                "--endpoint-reconciler-type=none".to_owned(),
                "--profiling=false".to_owned(),
                format!("--audit-policy-file={}", policy.display()),
                format!("--audit-log-path={}", audit_log.display()),
                format!("--tracing-config-file={}", tracing.display()),
            ])
            // Spans go out every 100 ms rather than every 5 s.
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("run the lab's kube-apiserver");
        // The lab's admin kubeconfig, pointed at this one.
        let kubeconfig = dir.path().join("kubeconfig");
        let text = std::fs::read_to_string(home.join("kubeconfig")).unwrap();
        let text: String = text
            .lines()
            .map(|line| match line.split_once("server: ") {
                Some((indent, _)) => format!("{indent}server: https://127.0.0.1:{port}\n"),
                None => format!("{line}\n"),
            })
            .collect();
        std::fs::write(&kubeconfig, text).unwrap();
        let apiserver = Self {
            child,
            cluster: Cluster {
                kubeconfig,
                cache: tempfile::tempdir().unwrap(),
            },
            audit_log,
            _dir: dir,
        };
        // Ready, and its aggregator proxying to this server.
        apiserver
            .cluster
            .eventually(
                &["get", "--raw", "/apis/farm.example.com/v1alpha"],
                Duration::from_secs(120),
                |ok, _, _| ok,
            )
            .await;
        Some(apiserver)
    }
}

impl Drop for AuditedApiserver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Through a kube-apiserver with its own audit log and traces on: one `kubectl create` has
/// the same auditID in kube-apiserver's log and in this server's (`log`), and kube-apiserver's
/// spans and this server's are one trace, this server's request span under kube-apiserver's
/// proxy span (all received by `collector`, this server sampling only what its caller did).
pub(super) async fn apiserver_audit_and_trace_join(
    ns: &str,
    step: &dyn Fn(&str),
    log: &std::path::Path,
    collector: &common::otlp::Collector,
    trace_port: u16,
) {
    step("a second kube-apiserver with its audit log and traces on");
    let Some(apiserver) = AuditedApiserver::start(trace_port).await else {
        return;
    };
    let cluster = &apiserver.cluster;
    step("audit and traces: one create through it");
    let llama = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Llama",
        "metadata": {"name": "joined", "namespace": ns}, "spec": {"weight": 2.0, "height": 1.0}});
    cluster.ok(&["create", "-f", "-"], Some(&llama.to_string()));
    // kube-apiserver's objectRef of a create has no name at Metadata level (the proxy does
    // not read the body): the only create of a Llama in `ns` through it.
    let is_the_create = |e: &Value| {
        e["verb"] == "create"
            && e["objectRef"]["resource"] == "llamas"
            && e["objectRef"]["namespace"] == ns
            && e["requestURI"].as_str().is_some_and(|uri| {
                uri.starts_with(&format!(
                    "/apis/farm.example.com/v1alpha/namespaces/{ns}/llamas"
                ))
            })
            && e["stage"] == "ResponseComplete"
            && e["responseStatus"]["code"] == 201
    };
    let event_in = |path: &std::path::Path, is_the_create: &dyn Fn(&Value) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let found = text
                .lines()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(is_the_create);
            if let Some(event) = found {
                return event;
            }
            assert!(
                Instant::now() < deadline,
                "no event for the create in {}",
                path.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // Everything through the second kube-apiserver is this step's; this server's log has the
    // whole suite's creates too.
    let theirs = event_in(&apiserver.audit_log, &is_the_create);
    let ours = event_in(log, &|e: &Value| {
        is_the_create(e) && e["objectRef"]["name"] == "joined"
    });
    assert_eq!(
        theirs["auditID"], ours["auditID"],
        "one audit ID in both logs"
    );
    assert_eq!(theirs["user"]["username"], ours["user"]["username"]);
    assert_eq!(theirs["responseStatus"]["code"], 201);
    assert_eq!(ours["responseStatus"]["code"], 201);
    assert_eq!(ours["objectRef"]["namespace"], ns);

    // Our request span (the create), and kube-apiserver's span it hangs under.
    use common::otlp::{attribute, hex};
    let deadline = Instant::now() + Duration::from_secs(30);
    let (ours, theirs) = loop {
        let spans = collector.spans();
        let ours = spans.iter().find(|(service, span)| {
            service == "farm-apiserver"
                && span.name == "KubernetesAPI"
                && attribute(span, "http.request.method").as_deref() == Some("POST")
                && attribute(span, "url.path")
                    .is_some_and(|p| p.ends_with(&format!("/namespaces/{ns}/llamas")))
        });
        if let Some((_, ours)) = ours {
            let parent = spans.iter().find(|(service, span)| {
                service != "farm-apiserver" && span.span_id == ours.parent_span_id
            });
            if let Some((service, parent)) = parent {
                break (ours.clone(), (service.clone(), parent.clone()));
            }
        }
        assert!(
            Instant::now() < deadline,
            "no joined trace in {:?}",
            spans
                .iter()
                .map(|(service, s)| format!("{service}/{}", s.name))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (service, parent) = theirs;
    assert_eq!(service, "apiserver", "kube-apiserver's service name");
    assert_eq!(hex(&parent.trace_id), hex(&ours.trace_id), "one trace");
    step(&format!(
        "trace {}: this server's span under kube-apiserver's {:?}",
        hex(&ours.trace_id),
        parent.name
    ));
    cluster.ok(&["delete", "llama", "joined", "-n", ns], None);
}
