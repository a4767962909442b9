//! What an attacker or a careless client must not be able to do: panic the server, grow its
//! memory without bound, hold its connections, or lose data. Each test here failed before the
//! fix it names.

use crate::common;

use std::sync::Arc;

use aggregated_apiserver::{
    Result,
    group::ApiGroup,
    observe::recovery,
    resource::ObjectKey,
    server::{self, AppState},
    store::{
        ListRequest, MemoryStore, Object, PageInfo, Preconditions, Store, StoreStats, WatchRequest,
        WatchStream, WritableStore,
    },
};
use async_trait::async_trait;
use axum::http::StatusCode;
use common::{oneshot::*, oneshot_identity};
use farm_apiserver::resources::Llama;
use http_body_util::BodyExt;
use serde_json::{Value, json};

use common::{Alpn, Options, TestServer, fake_kube::FakeKube};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const LLAMAS: &str = "/apis/farm.example.com/v1alpha/namespaces/default/llamas";

/// `?watch=true&timeoutSeconds=18446744073709551615` overflowed the deadline and panicked. As
/// in kube-apiserver (Go's ParseInt into an int64) that is now 400, and the largest timeout an
/// int64 holds is served.
#[tokio::test]
async fn huge_watch_timeouts_are_400_or_served_never_a_panic() {
    let app = app();
    let message = get(
        &app,
        &format!("{LLAMAS}?watch=true&timeoutSeconds=18446744073709551615"),
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        message,
        "strconv.ParseInt: parsing \"18446744073709551615\": value out of range"
    );
    let events = watch_events(
        &app,
        &format!("{LLAMAS}?watch=true&timeoutSeconds={}", i64::MAX),
        "application/json",
        1,
    )
    .await;
    assert_eq!(events[0]["type"], "ADDED");
    assert_eq!(events[0]["object"]["metadata"]["name"], "dolly");
}

/// ListOptions are checked as kube-apiserver checks them: a malformed `timeoutSeconds` is 400
/// on a list and on a deletecollection (which deleted before), a parameter given twice takes
/// its first value, and a negative `limit` means no limit.
#[tokio::test]
async fn list_options_as_kube_apiserver_reads_them() {
    let app = app();
    for _ in 0..3 {
        create(
            &app,
            "default",
            &llama(&format!("l{}", rand_suffix()), 1.0, 1.0),
        )
        .await;
    }
    let message = get(&app, &format!("{LLAMAS}?timeoutSeconds=abc"))
        .await
        .status(400, "BadRequest");
    assert_eq!(message, "strconv.ParseInt: parsing \"abc\": invalid syntax");
    let before = get(&app, LLAMAS).await.json()["items"]
        .as_array()
        .unwrap()
        .len();
    call(
        &app,
        "DELETE",
        &format!("{LLAMAS}?timeoutSeconds=abc"),
        &[],
        "",
    )
    .await
    .status(400, "BadRequest");
    assert_eq!(
        get(&app, LLAMAS).await.json()["items"]
            .as_array()
            .unwrap()
            .len(),
        before,
        "nothing was deleted"
    );
    let page = get(&app, &format!("{LLAMAS}?limit=1&limit=3")).await.json();
    assert_eq!(
        page["items"].as_array().unwrap().len(),
        1,
        "the first limit counts"
    );
    let all = get(&app, &format!("{LLAMAS}?limit=-1")).await.json();
    assert_eq!(all["items"].as_array().unwrap().len(), before);
    assert!(all["metadata"].get("continue").is_none());
}

fn rand_suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..8].to_owned()
}

/// A non-ASCII `generateName` over 58 bytes was cut inside a character and panicked; it is a
/// name validation would refuse anyway, so it is refused (422), as kube-apiserver does.
#[tokio::test]
async fn a_long_non_ascii_generate_name_is_invalid_not_a_panic() {
    let app = app();
    for prefix in ["é".repeat(40), format!("a{}", "ü".repeat(29))] {
        let body = json!({
            "apiVersion": "farm.example.com/v1alpha",
            "kind": "Llama",
            "metadata": {"generateName": prefix},
            "spec": {"weight": 1, "height": 1},
        });
        let reply = create(&app, "default", &body.to_string()).await;
        let message = reply.status(422, "Invalid");
        assert!(
            message.contains("metadata.name: Invalid value"),
            "{message}"
        );
    }
    // An ASCII prefix of any length is trimmed to 58 bytes plus 5 random characters.
    let body = json!({
        "apiVersion": "farm.example.com/v1alpha",
        "kind": "Llama",
        "metadata": {"generateName": "g".repeat(80)},
        "spec": {"weight": 1, "height": 1},
    });
    let reply = create(&app, "default", &body.to_string()).await;
    assert_eq!(
        reply.status,
        201,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
    let name = reply.json()["metadata"]["name"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(name.len(), 63);
    assert!(name.starts_with(&"g".repeat(58)));
}

/// Names are DNS-1123 subdomains: up to 253 characters, no 63-character limit per part.
#[tokio::test]
async fn names_follow_is_dns1123_subdomain() {
    let app = app();
    for name in [
        "a".repeat(64),
        format!("{}.{}", "b".repeat(100), "c".repeat(152)),
    ] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        assert_eq!(
            reply.status,
            201,
            "{}: {}",
            name.len(),
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(get(&app, &format!("{LLAMAS}/{name}")).await.status, 200);
    }
    for name in ["d".repeat(254), "-a".into(), "a..b".into(), "A".into()] {
        let reply = create(&app, "default", &llama(&name, 1.0, 1.0)).await;
        reply.status(422, "Invalid");
    }
}

// ---- connections: timeouts and bodies nobody read ----

// ---- patches ----

// ---- watch events in the requested form ----

// ---- HTTP/2 frames that are not requests ----
use bodies_and_watches::watch_events;

mod bodies_and_watches;
mod connections;
mod panics;
