//! gzip over the real TLS listener, as k8s.io/apiserver compresses: responses over 128 KiB when
//! the client accepts gzip (lists, JSON and Table, on HTTP/1.1 and HTTP/2), never a small one
//! (a Llama's GET) and never a watch; kubectl (which asks for gzip) reads them.

use std::io::Read as _;

use serde_json::Value;

use crate::common::{self, Alpn, Options, RawResponse, TestServer};

const FARMPODS: &str = "/apis/farm.example.com/v1/farmpods";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("a gzip body");
    out
}

async fn server() -> TestServer {
    TestServer::start_with(Options {
        farmpods: Some(farm_apiserver::resources::farmpod::synthetic_view(3000)),
        ..Default::default()
    })
    .await
}

fn plain(response: &RawResponse) {
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-encoding"), None, "not compressed");
}

#[tokio::test]
async fn large_responses_are_gzipped_when_the_client_accepts_it() {
    let server = server().await;
    for alpn in [Alpn::Http1, Alpn::Http2] {
        let raw = server.raw(Some(server.admin_identity()), alpn);
        for accept in ["application/json", TABLE] {
            let whole = raw.get(FARMPODS, &[("accept", accept)]).await;
            plain(&whole);
            assert!(whole.body.len() > 128 * 1024, "a list over the threshold");
            let gzipped = raw
                .get(FARMPODS, &[("accept", accept), ("accept-encoding", "gzip")])
                .await;
            assert_eq!(gzipped.status, 200);
            assert_eq!(
                gzipped.header("content-encoding"),
                Some("gzip"),
                "{alpn:?} {accept}"
            );
            assert_eq!(gzipped.header("vary"), Some("Accept-Encoding"));
            assert_eq!(gzipped.header("content-type"), whole.header("content-type"));
            let body = gunzip(&gzipped.body);
            let (mut a, mut b): (Value, Value) = (
                serde_json::from_slice(&body).expect("JSON"),
                serde_json::from_slice(&whole.body).expect("JSON"),
            );
            // A Table's Age cells move with the clock between the two requests.
            for table in [&mut a, &mut b] {
                for row in table["rows"].as_array_mut().into_iter().flatten() {
                    row["cells"] = Value::Null;
                }
            }
            assert_eq!(a, b, "the same list, compressed");
            let ratio = whole.body.len() as f64 / gzipped.body.len() as f64;
            eprintln!(
                "{alpn:?} {accept}: {} bytes, {} gzipped ({ratio:.1}×)",
                whole.body.len(),
                gzipped.body.len()
            );
            // Synthetic Pods (random uids, few repeated fields) compress less than a kubelet's;
            // the bench measures those.
            assert!(ratio >= 5.0, "only {ratio:.1}× smaller");
        }

        // A list's pages of 500 are still over the threshold; a Llama's GET never is.
        let page = raw
            .get(
                &format!("{FARMPODS}?limit=500"),
                &[("accept-encoding", "gzip")],
            )
            .await;
        assert_eq!(page.header("content-encoding"), Some("gzip"));
        let llama = "/apis/farm.example.com/v1/namespaces/default/llamas/dolly";
        let gzip_asked = raw.get(llama, &[("accept-encoding", "gzip")]).await;
        plain(&gzip_asked);
        assert_eq!(gzip_asked.body, raw.get(llama, &[]).await.body);
        // Other encodings, or gzip with parameters, are not gzip to kube-apiserver.
        for other in ["br", "gzip;q=1.0"] {
            plain(&raw.get(FARMPODS, &[("accept-encoding", other)]).await);
        }
    }
}

#[tokio::test]
async fn watches_are_never_compressed() {
    let server = server().await;
    let raw = server.raw(Some(server.admin_identity()), Alpn::Http2);
    // 3,000 initial events (well over the threshold), then the watch lasts a second.
    let watch = raw
        .get(
            &format!("{FARMPODS}?watch=1&resourceVersion=0&timeoutSeconds=1"),
            &[("accept-encoding", "gzip")],
        )
        .await;
    plain(&watch);
    let events = watch.body.split(|b| *b == b'\n').filter(|l| !l.is_empty());
    assert_eq!(events.count(), 3000, "each Pod's ADDED event, as sent");
}

#[tokio::test]
async fn kubectl_reads_gzipped_lists() {
    let server = server().await;
    let cache = tempfile::tempdir().unwrap();
    let Some(mut kubectl) = common::kubectl(&server.kubeconfig(), cache.path()) else {
        return;
    };
    // Go's transport asks for gzip on kubectl's behalf and takes the header away once it has
    // decompressed the body, so what shows is that kubectl reads the list whole.
    kubectl.args(["get", "farmpods", "-A", "-o", "json"]);
    let (ok, out, err) = common::run(kubectl, None).await;
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).expect("kubectl's JSON");
    assert_eq!(list["items"].as_array().map(Vec::len), Some(3000));
}

/// Through a real kube-apiserver (FARM_E2E_KUBECONFIG), beside kube-apiserver's own answer for
/// ConfigMaps of the same size: a list over 128 KiB comes gzipped through the aggregator when
/// the client accepts gzip, with the same headers as kube-apiserver's own; one object does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_kube_apiserver_as_kube_apiserver_compresses() {
    use crate::e2e_cluster::{Cluster, ONE_AT_A_TIME, etcd_from_env, register};
    let Some(cluster) = Cluster::from_env() else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().await;
    let started = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:>5.1}s] {what}", started.elapsed().as_secs_f64());
    let etcd = etcd_from_env().await;
    let (server, installed) = register(&cluster, Vec::new(), etcd.as_ref(), &[], &step).await;
    let ns = installed.namespace.clone();

    step("40 Llamas and 40 ConfigMaps of 4 KB each, through kube-apiserver");
    let note = "x".repeat(4000);
    let items: Vec<Value> = (0..40)
        .flat_map(|i| {
            [
                serde_json::json!({"apiVersion": "farm.example.com/v1", "kind": "Llama",
                    "metadata": {"name": format!("l{i}"), "namespace": ns,
                        "annotations": {"note": note}},
                    "spec": {"weightKg": 1.0, "heightMetres": 1.0}}),
                serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": format!("c{i}"), "namespace": ns,
                        "annotations": {"note": note}}}),
            ]
        })
        .collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    cluster.ok(&["apply", "-f", "-"], Some(&list.to_string()));

    let client = cluster.client().await;
    let get = async |path: String, gzip: bool| {
        let mut request = http::Request::get(&path);
        if gzip {
            request = request.header("accept-encoding", "gzip");
        }
        let response = client
            .send(request.body(kube::client::Body::empty()).expect("request"))
            .await
            .expect("through kube-apiserver");
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        let body = http_body_util::BodyExt::collect(response.into_body())
            .await
            .expect("body")
            .to_bytes();
        let header = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (header("content-encoding"), header("vary"), body)
    };
    let llamas = format!("/apis/farm.example.com/v1/namespaces/{ns}/llamas");
    let configmaps = format!("/api/v1/namespaces/{ns}/configmaps");
    for (what, path) in [("Llamas", &llamas), ("ConfigMaps", &configmaps)] {
        let (encoding, vary, body) = get(path.clone(), true).await;
        let (_, _, whole) = get(path.clone(), false).await;
        step(&format!(
            "{what}: {} bytes, {} gzipped: {encoding:?}, Vary {vary:?}",
            whole.len(),
            body.len()
        ));
        assert!(whole.len() > 128 * 1024);
        assert_eq!(encoding.as_deref(), Some("gzip"), "{what}");
        assert!(
            vary.as_deref()
                .is_some_and(|v| v.contains("Accept-Encoding")),
            "{what}: {vary:?}"
        );
        let list: Value = serde_json::from_slice(&gunzip(&body)).expect("JSON");
        assert!(list["items"].as_array().is_some_and(|i| i.len() >= 40));
        // One object is never compressed, by either.
        let one = if what == "Llamas" {
            format!("{llamas}/l0")
        } else {
            format!("{configmaps}/c0")
        };
        let (encoding, _, _) = get(one, true).await;
        assert_eq!(encoding, None, "{what}: one object");
    }
    drop(installed);
    drop(server);
}
