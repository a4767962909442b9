//! The library's example server (`aggregated-apiserver/examples/kites.rs`, one kind of its own,
//! Kite at `toys.example.com/v1`) registered through a real kube-apiserver: an APIService with
//! its caBundle, a Service of type ExternalName to this host, and nothing else of farm's. kubectl
//! then uses it as any kind: get, apply (client-side and server-side), a watch, explain.
//!
//! Runs when `FARM_E2E_KUBECONFIG` names a cluster whose kube-apiserver runs on this host (see
//! `e2e_cluster`); builds the example with cargo first.

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use aggregated_apiserver::net::tls::DevCa;
use serde_json::{Value, json};

use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME};

const API_SERVICE: &str = "v1.toys.example.com";
const NAMESPACE: &str = "toys-system";

/// Builds the example with the cargo running the tests; its executable.
fn build_example() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "build",
            "-p",
            "aggregated-apiserver",
            "--example",
            "kites",
            "--message-format=json",
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(Stdio::inherit())
        .output()
        .expect("run cargo");
    assert!(out.status.success(), "cargo build --example kites failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["target"]["name"] == "kites")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("the example's executable")
}

/// The example server and what registers it; removed when dropped, the APIService first.
struct Kites<'a> {
    cluster: &'a Cluster,
    server: Child,
}

impl Drop for Kites<'_> {
    fn drop(&mut self) {
        let c = self.cluster;
        let _ = c.run(
            &["delete", "apiservice", API_SERVICE, "--ignore-not-found"],
            None,
        );
        let _ = c.run(
            &[
                "delete",
                "namespace",
                NAMESPACE,
                "--ignore-not-found",
                "--wait=false",
            ],
            None,
        );
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn kite(name: &str, colour: &str, line: f64) -> String {
    format!(
        "apiVersion: toys.example.com/v1\nkind: Kite\nmetadata:\n  name: {name}\n  namespace: default\nspec:\n  colour: {colour}\n  lineMetres: {line}\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_server_through_kube_apiserver() {
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    step("building the example");
    let example = build_example();

    // A serving certificate for the Service the APIService names, and its CA as the caBundle.
    let dir = tempfile::tempdir().unwrap();
    let ca = DevCa::load_or_create(dir.path()).unwrap();
    let (cert, key) = ca
        .issue_serving(&[&format!("kites.{NAMESPACE}.svc"), "localhost"])
        .unwrap();
    std::fs::write(dir.path().join("kites.crt"), cert).unwrap();
    std::fs::write(dir.path().join("kites.key"), key).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let mut server = Command::new(example)
        .arg(format!("127.0.0.1:{port}"))
        .env("KITES_CERT", dir.path().join("kites.crt"))
        .env("KITES_KEY", dir.path().join("kites.key"))
        .env("KUBECONFIG", cluster.kubeconfig())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the example");
    let stdout = server.stdout.take().unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            eprintln!("kites: {line}");
            let _ = tx.send(line);
        }
    });
    let serving = loop {
        let line = lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the example logs that it serves");
        if line.contains("serving") {
            break line;
        }
    };
    step(&format!("example: {serving}"));
    let kites = Kites {
        cluster: &cluster,
        server,
    };

    use base64::Engine;
    let bundle = base64::engine::general_purpose::STANDARD.encode(&ca.cert_pem);
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "kites", "namespace": NAMESPACE},
         "spec": {"type": "ExternalName", "externalName": "localhost",
                  "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}},
        {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
         "metadata": {"name": API_SERVICE},
         "spec": {"group": "toys.example.com", "version": "v1", "caBundle": bundle,
                  "groupPriorityMinimum": 1000, "versionPriority": 15,
                  "service": {"name": "kites", "namespace": NAMESPACE, "port": port}}},
    ]});
    cluster.ok(&["apply", "-f", "-"], Some(&objects.to_string()));
    cluster
        .eventually(
            &[
                "get",
                "apiservice",
                API_SERVICE,
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Available\")].status}",
            ],
            Duration::from_secs(120),
            |_, out, _| out == "True",
        )
        .await;
    step("APIService Available");

    // get, before anything exists; then apply, client-side and server-side.
    let (ok, out, err) = cluster.run(&["get", "kites", "-n", "default"], None);
    assert!(
        ok && out.is_empty() && err.contains("No resources found"),
        "{out}{err}"
    );
    let out = cluster.ok(&["apply", "-f", "-"], Some(&kite("red", "red", 30.0)));
    assert_eq!(out.trim(), "kite.toys.example.com/red created");
    let out = cluster.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "e2e",
            "-f",
            "-",
        ],
        Some(&kite("blue", "blue", 45.5)),
    );
    assert_eq!(out.trim(), "kite.toys.example.com/blue serverside-applied");
    let out = cluster.ok(
        &[
            "apply",
            "--server-side",
            "--field-manager",
            "e2e",
            "-f",
            "-",
        ],
        Some(&kite("blue", "navy", 45.5)),
    );
    assert_eq!(out.trim(), "kite.toys.example.com/blue serverside-applied");
    let out = cluster.ok(&["get", "kites", "-n", "default", "--no-headers"], None);
    let rows: Vec<Vec<&str>> = out
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert_eq!(rows[0][..3], ["blue", "navy", "45.5"], "{out}");
    assert_eq!(rows[1][..3], ["red", "red", "30"], "{out}");
    let managed = cluster.ok(
        &[
            "get",
            "kite",
            "blue",
            "-n",
            "default",
            "--show-managed-fields",
            "-o",
            "json",
        ],
        None,
    );
    let managed: Value = serde_json::from_str(&managed).unwrap();
    assert_eq!(managed["metadata"]["managedFields"][0]["manager"], "e2e");

    // Validation: the kind's own rule, as kube-apiserver words a 422.
    let (ok, _, err) = cluster.run(&["apply", "-f", "-"], Some(&kite("bad", "grey", -1.0)));
    assert!(!ok && err.contains("spec.lineMetres"), "{err}");

    // A watch through the aggregator sees a kite made meanwhile.
    let mut watch = cluster
        .kubectl()
        .args([
            "get",
            "kites",
            "-n",
            "default",
            "--watch-only",
            "-o",
            "name",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let watched = BufReader::new(watch.stdout.take().unwrap());
    let (tx, seen) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in watched.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    cluster.ok(&["apply", "-f", "-"], Some(&kite("green", "green", 12.0)));
    let line = seen
        .recv_timeout(Duration::from_secs(30))
        .expect("the watch shows the new kite");
    assert_eq!(line, "kite.toys.example.com/green");
    let _ = watch.kill();
    let _ = watch.wait();

    // explain reads the OpenAPI the example publishes.
    let out = cluster.ok(&["explain", "kites.spec"], None);
    assert!(out.contains("GROUP:      toys.example.com"), "{out}");
    assert!(out.contains("KiteSpec describes one kite."), "{out}");
    assert!(out.contains("lineMetres\t<number> -required-"), "{out}");

    step("cleaning up: the APIService first");
    drop(kites);
    let (_, out, _) = cluster.run(&["get", "apiservice", API_SERVICE], None);
    assert!(out.is_empty(), "APIService removed: {out}");
    step("done");
}
