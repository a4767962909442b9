//! kubectl against the real listener, and large lists read whole by every client.

use super::*;

pub(super) async fn kubectl_works_as_a_user_would_use_it(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let kubeconfig = server.kubeconfig();
    let Some(_) = kubectl(&kubeconfig, cache.path()) else {
        return;
    };
    let k = |args: &[&str]| {
        let mut cmd = kubectl(&kubeconfig, cache.path()).unwrap();
        cmd.args(args);
        cmd
    };

    let (ok, out, err) = run(k(&["get", "llamas"]), None).await;
    assert!(ok, "{err}");
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "WEIGHT", "HEIGHT", "AGE"]);
    let row: Vec<&str> = lines.next().unwrap().split_whitespace().collect();
    assert_eq!(&row[..3], ["dolly", "31.4", "0.5"]);

    let (ok, out, err) = run(k(&["get", "ll", "-A"]), None).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("NAMESPACE"), "{out}");
    assert!(out.contains("default"), "{out}");

    let manifest = "apiVersion: farm.example.com/v1alpha
kind: Llama
metadata:
  name: kuzco
  labels:
    herd: gold
spec:
  weight: 120.5
  height: 1.7
";
    let (ok, out, err) = run(k(&["apply", "-f", "-"]), Some(manifest)).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "llama.farm.example.com/kuzco created");
    let (ok, out, _) = run(
        k(&["apply", "-f", "-"]),
        Some(&manifest.replace("120.5", "130")),
    )
    .await;
    assert!(ok);
    assert_eq!(out.trim(), "llama.farm.example.com/kuzco configured");

    // Applied through v1alpha, read through v1 (kubectl's preferred version) and back.
    let (ok, out, err) = run(k(&["get", "llama", "kuzco", "-o", "yaml"]), None).await;
    assert!(ok, "{err}");
    assert!(out.contains("apiVersion: farm.example.com/v1\n"), "{out}");
    assert!(out.contains("weightKg: 130"), "{out}");
    assert!(out.contains("kind: Llama"));
    let (ok, out, err) = run(
        k(&[
            "get",
            "llamas.v1alpha.farm.example.com",
            "kuzco",
            "-o",
            "yaml",
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("weight: 130"), "{out}");

    let (ok, out, err) = run(
        k(&[
            "patch",
            "llama",
            "kuzco",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"heightMetres":1.8}}"#,
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("patched"), "{out}");
    let (_, out, _) = run(
        k(&[
            "get",
            "ll",
            "-l",
            "herd=gold",
            "-o",
            "jsonpath={.items[*].spec.heightMetres}",
        ]),
        None,
    )
    .await;
    assert_eq!(out.trim(), "1.8");

    let (ok, _, err) = run(k(&["get", "llama", "nope"]), None).await;
    assert!(!ok);
    assert!(
        err.contains(r#"Error from server (NotFound): llamas.farm.example.com "nope" not found"#),
        "{err}"
    );

    // kubectl explain per version: v1 by default, v1alpha when asked for.
    let (ok, out, err) = run(k(&["explain", "llamas.spec.weightKg"]), None).await;
    assert!(ok, "{err}");
    assert!(out.contains("Weight of the llama in kilograms"), "{out}");
    assert!(out.contains("VERSION:    v1\n"), "{out}");
    let (ok, out, err) = run(
        k(&[
            "explain",
            "llamas.spec.weight",
            "--api-version=farm.example.com/v1alpha",
        ]),
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("Weight of the llama in kilograms"), "{out}");
    assert!(out.contains("VERSION:    v1alpha"), "{out}");

    let (ok, out, err) = run(k(&["api-resources"]), None).await;
    assert!(ok, "{err}");
    let line = out
        .lines()
        .find(|l| l.starts_with("llamas"))
        .expect("llamas listed");
    assert!(
        line.contains("ll") && line.contains("farm.example.com/v1 ") && line.contains("Llama"),
        "{line}"
    );

    let (ok, out, err) = run(k(&["delete", "llama", "kuzco"]), None).await;
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "llama.farm.example.com \"kuzco\" deleted");
}

pub(super) async fn kubectl_get_watch_prints_the_first_event(storage: TestStorage) {
    let Some(server) = TestServer::start_on(storage).await else {
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let Some(mut cmd) = kubectl(&server.kubeconfig(), cache.path()) else {
        return;
    };
    let mut child = cmd
        .args(["get", "llamas", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut rx = common::lines(stdout);
    // The initial list first, then the new llama as an ADDED event with its columns.
    let header = tokio::time::timeout(Duration::from_secs(20), rx.recv())
        .await
        .unwrap()
        .unwrap();
    assert!(
        header.contains("NAME") && header.contains("WEIGHT"),
        "{header}"
    );
    let api: Api<Llama> = Api::namespaced(server.kube_client().await, "default");
    let mut added = None;
    for _ in 0..20 {
        if api.get_opt("watched").await.unwrap().is_none() {
            api.create(
                &PostParams::default(),
                &Llama::new(
                    "watched",
                    LlamaSpec {
                        weight: 7.0,
                        height: 0.7,
                    },
                ),
            )
            .await
            .unwrap();
        }
        match tokio::time::timeout(Duration::from_millis(500), rx.recv()).await {
            Ok(Some(line)) if line.contains("watched") => {
                added = Some(line);
                break;
            }
            _ => {}
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let line = added.expect("kubectl printed the watch event");
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(&cells[..4], ["ADDED", "watched", "7", "0.7"], "{line}");
}

/// A list without `limit` is sent as it is written (chunked over HTTP/1.1, DATA frames over
/// HTTP/2), not built whole first; every client still reads the whole list, in every output.
#[tokio::test]
async fn large_unlimited_lists_are_streamed_and_read_whole_by_every_client() {
    let server = TestServer::start().await;
    let writes = server.llamas.writable().unwrap();
    for i in 0..3_000 {
        writes
            .create(
                Llama::from_stored(&farm_apiserver::resources::llama::synthetic(i)),
                false,
            )
            .await
            .expect("create");
    }
    let all = 3_001; // and dolly
    let path = "/apis/farm.example.com/v1alpha/llamas";
    let table = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
    let metadata =
        "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io,application/json";
    for alpn in [Alpn::Http1, Alpn::Http2] {
        let raw = server.raw(Some(server.admin_identity()), alpn);
        for (accept, items) in [
            ("application/json", "items"),
            (table, "rows"),
            (metadata, "items"),
        ] {
            let response = raw.get(path, &[("accept", accept)]).await;
            assert_eq!(response.status, 200, "{alpn:?} {accept}");
            assert_eq!(response.header("content-length"), None, "{alpn:?} {accept}");
            if alpn == Alpn::Http1 {
                assert_eq!(response.header("transfer-encoding"), Some("chunked"));
            }
            let list = response.json();
            assert_eq!(list[items].as_array().map(Vec::len), Some(all), "{accept}");
            assert!(
                list["metadata"]["resourceVersion"].is_string(),
                "{list:.200}"
            );
        }
        // A small list is still sent whole, with its length.
        let one = raw
            .get(
                "/apis/farm.example.com/v1alpha/namespaces/default/llamas",
                &[],
            )
            .await;
        assert_eq!(one.json()["items"].as_array().map(Vec::len), Some(1));
        assert!(one.header("content-length").is_some(), "{alpn:?}");
    }

    // Clients that hang up in the middle of a streamed list cost the server nothing lasting.
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http1);
    for _ in 0..20 {
        let connection = raw.connect().await.expect("connect");
        let (status, read) = connection.get_and_hang_up(path, 100_000).await;
        assert_eq!(status, 200);
        assert!((100_000..900_000).contains(&read), "read {read} bytes");
    }

    let api: Api<Llama> = Api::all(server.kube_client().await);
    let list = api.list(&ListParams::default()).await.expect("kube list");
    assert_eq!(list.items.len(), all);
    assert_eq!(
        list.items.iter().filter(|l| l.spec.weight == 20.0).count(),
        30
    );

    let cache = tempfile::tempdir().unwrap();
    let Some(mut cmd) = kubectl(&server.kubeconfig(), cache.path()) else {
        return;
    };
    cmd.args(["get", "llamas", "-A", "--chunk-size=0", "--no-headers"]);
    let (ok, out, err) = run(cmd, None).await;
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), all, "{err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("bench-7") && l.contains("llama-2997 "))
    );
}

// The Llama API on both storages: in memory and on a real etcd.
crate::on_both_storages!(
    kube_client_crud_and_watch_from_list_resource_version,
    watch_list_sends_initial_events_end_bookmark,
    kubectl_works_as_a_user_would_use_it,
    kubectl_get_watch_prints_the_first_event,
);
