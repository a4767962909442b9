//! The shipped binary as a newcomer runs it: dev certificates and kubeconfig on first start,
//! reuse on the next, and a graceful SIGTERM (readiness fails first, watches end cleanly, exit 0).

use crate::common;

use std::{path::Path, process::Command, time::Duration};

use common::{Alpn, RawClient, kubectl, process::Running, run};
use serde_json::Value;

fn start(cert_dir: &Path, extra: &[&str]) -> Running {
    Running::start(
        [std::ffi::OsStr::new("--cert-dir"), cert_dir.as_os_str()]
            .into_iter()
            .chain(extra.iter().map(std::ffi::OsStr::new)),
    )
}

fn ca_pem(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("ca.crt")).expect("ca.crt")
}

/// The dev kubeconfig's identity, issued again from the server's dev CA.
fn admin(dir: &Path) -> Option<(String, String)> {
    Some(
        aggregated_apiserver::net::tls::DevCa::load_or_create(dir)
            .expect("dev ca")
            .issue_client("farm-dev-admin", &["system:masters"])
            .expect("client cert"),
    )
}

#[cfg(unix)]
fn mode(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .expect("metadata")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn first_start_makes_certs_and_a_working_kubeconfig_second_start_reuses_them() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let server = start(&certs, &[]);
    for file in ["ca.crt", "ca.key", "tls.crt", "tls.key", "kubeconfig"] {
        assert!(certs.join(file).exists(), "{file}");
    }
    #[cfg(unix)]
    for key in ["ca.key", "tls.key", "kubeconfig"] {
        assert_eq!(mode(&certs.join(key)), 0o600, "{key}");
    }
    let kubeconfig = std::fs::read_to_string(certs.join("kubeconfig")).unwrap();
    assert!(kubeconfig.contains(&format!("server: https://127.0.0.1:{}", server.addr.port())));
    assert!(!kubeconfig.contains("insecure-skip-tls-verify"));

    let cache = tempfile::tempdir().unwrap();
    if let Some(mut cmd) = kubectl(&certs.join("kubeconfig"), cache.path()) {
        cmd.args(["get", "llamas", "--no-headers"]);
        let (ok, out, err) = run(cmd, None).await;
        assert!(ok, "{err}");
        assert!(out.starts_with("dolly"), "{out}");
    }
    let first_ca = ca_pem(&certs);
    let first_cert = std::fs::read_to_string(certs.join("tls.crt")).unwrap();
    drop(server);

    let server = start(&certs, &["--no-sample-data"]);
    assert_eq!(ca_pem(&certs), first_ca, "the dev CA is reused");
    assert_eq!(
        std::fs::read_to_string(certs.join("tls.crt")).unwrap(),
        first_cert
    );
    let anonymous = RawClient::new(server.addr, &first_ca, None, Alpn::Http2);
    let denied = anonymous
        .get("/apis/farm.example.com/v1alpha/llamas", &[])
        .await;
    assert_eq!(denied.status, 401, "no certificate, no access");
    assert_eq!(denied.json()["reason"], "Unauthorized");
    let raw = RawClient::new(server.addr, &first_ca, admin(&certs), Alpn::Http2);
    let list = raw
        .get("/apis/farm.example.com/v1alpha/llamas", &[])
        .await
        .json();
    assert_eq!(
        list["items"].as_array().unwrap().len(),
        0,
        "--no-sample-data"
    );
}

#[cfg(unix)]
#[tokio::test]
async fn sigterm_fails_readiness_first_then_ends_watches_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), &["--shutdown-delay", "2"]);
    let raw = RawClient::new(
        server.addr,
        &ca_pem(dir.path()),
        admin(dir.path()),
        Alpn::Http1,
    );
    assert_eq!(raw.get("/readyz", &[]).await.status, 200);

    // An open watch, collected until the server ends it.
    let watcher = raw.clone();
    let watch = tokio::spawn(async move {
        watcher
            .get("/apis/farm.example.com/v1alpha/llamas?watch=true", &[])
            .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;

    let pid = server.child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let draining = raw.get("/readyz", &[]).await;
    assert_eq!(
        draining.status, 500,
        "readiness fails during the shutdown delay"
    );
    assert!(String::from_utf8_lossy(&draining.body).contains("[-]shutdown failed"));
    assert_eq!(raw.get("/livez", &[]).await.status, 200);

    let reply = tokio::time::timeout(Duration::from_secs(10), watch)
        .await
        .expect("watch ended")
        .unwrap();
    assert_eq!(reply.status, 200);
    let first: Value =
        serde_json::from_slice(reply.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(first["type"], "ADDED");

    let status = tokio::task::spawn_blocking(move || {
        let status = server.child.wait().unwrap();
        let logs: Vec<String> = server.lines.try_iter().collect();
        (status, logs)
    })
    .await
    .unwrap();
    assert!(status.0.success(), "exit status {:?}", status.0);
    assert!(
        status.1.iter().any(|l| l.contains("stopped")),
        "{:?}",
        status.1
    );
}

/// A client that resumes a watch from a version the previous process handed out (client-go
/// does after every disconnect) is told 410 Expired and relists, rather than getting 200 and
/// never hearing of the Llamas that went with the old process.
#[tokio::test]
async fn after_a_restart_old_resource_versions_are_expired_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let llamas = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";
    let first = start(dir.path(), &[]);
    let raw = RawClient::new(
        first.addr,
        &ca_pem(dir.path()),
        admin(dir.path()),
        Alpn::Http1,
    );
    let body = r#"{"apiVersion":"farm.example.com/v1alpha","kind":"Llama","metadata":{"name":"ghost"},"spec":{"weight":1,"height":1}}"#;
    let created = raw
        .send(
            "POST",
            llamas,
            &[("content-type", "application/json")],
            Some(body.into()),
        )
        .await;
    assert_eq!(created.status, 201);
    let list = raw.get(llamas, &[]).await.json();
    let old_rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    drop(first);

    let second = start(dir.path(), &[]);
    let raw = RawClient::new(
        second.addr,
        &ca_pem(dir.path()),
        admin(dir.path()),
        Alpn::Http1,
    );
    let list = raw.get(llamas, &[]).await.json();
    let new_rv: u64 = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        new_rv > old_rv,
        "versions go on rising: {old_rv} then {new_rv}"
    );
    let watch = raw
        .get(
            &format!("{llamas}?watch=true&resourceVersion={old_rv}&timeoutSeconds=5"),
            &[],
        )
        .await;
    assert_eq!(watch.status, 200);
    let event: Value =
        serde_json::from_slice(watch.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(event["type"], "ERROR", "{event}");
    assert_eq!(event["object"]["code"], 410);
    assert_eq!(event["object"]["reason"], "Expired");
    // A version from the future (a process whose clock ran ahead) is refused too.
    let ahead = raw
        .get(
            &format!(
                "{llamas}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
                new_rv + 1_000_000
            ),
            &[],
        )
        .await;
    assert_eq!(ahead.status, 504);
    assert_eq!(
        ahead.json()["details"]["causes"][0]["reason"],
        "ResourceVersionTooLarge"
    );
}

/// README has kubectl users `export KUBECONFIG=$PWD/certs/kubeconfig`; a server started in that
/// terminal must not take its own development kubeconfig for a cluster (it would wait for its
/// own Pods, never ready): it runs standalone and says so once.
#[tokio::test]
async fn a_kubeconfig_naming_the_server_itself_means_standalone() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    let kubeconfig = certs.join("kubeconfig");
    let server = Running::start_with_env(
        [std::ffi::OsStr::new("--cert-dir"), certs.as_os_str()],
        &[("KUBECONFIG", kubeconfig.as_os_str())],
    );
    let said: Vec<String> = server
        .start_up
        .iter()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter_map(|log| log["message"].as_str().map(str::to_owned))
        .filter(|m| m.contains("kubeconfig") || m.contains("cluster"))
        .collect();
    assert_eq!(
        said,
        [
            "the kubeconfig names this server itself, not a cluster: running standalone",
            "no cluster configured: FarmPods answer 503, Llamas are served, only the dev identity is authorized"
        ],
        "{:#?}",
        server.start_up
    );
    let raw = RawClient::new(server.addr, &ca_pem(&certs), admin(&certs), Alpn::Http1);
    assert_eq!(raw.get("/readyz", &[]).await.status, 200);
    assert_eq!(
        raw.get(
            "/apis/farm.example.com/v1alpha/namespaces/default/llamas",
            &[]
        )
        .await
        .status,
        200
    );
}
