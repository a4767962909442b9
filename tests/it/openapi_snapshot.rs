//! The OpenAPI documents are generated from the Rust types; the committed copies under
//! api/openapi-spec/ must match, so API changes show up in review.
//! Regenerate with: FARM_UPDATE_SNAPSHOTS=1 cargo test --test it openapi_snapshot

use std::path::Path;

use aggregated_apiserver::{api::openapi::OpenApiDocuments, store::StorageFactory};
use farm_apiserver::resources;

/// The binary's kinds ([`resources::register`]): a kind added there shows in the snapshots.
fn documents() -> OpenApiDocuments {
    let storage = StorageFactory::memory();
    OpenApiDocuments::new(
        &farm_apiserver::config::IDENTITY,
        resources::register(&storage).resources(),
    )
}

fn check(path: &str, generated: &[u8]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    if std::env::var_os("FARM_UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, generated).expect("write snapshot");
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{} is out of date: run FARM_UPDATE_SNAPSHOTS=1 cargo test --test it openapi_snapshot and commit it",
        path.display()
    );
}

#[tokio::test]
async fn openapi_documents_match_the_committed_snapshots() {
    let docs = documents();
    check("api/openapi-spec/swagger.json", &docs.v2);
    let versions: Vec<_> = docs.v3.iter().map(|doc| doc.version).collect();
    assert_eq!(versions, ["v1", "v1alpha"], "the preferred version first");
    for doc in &docs.v3 {
        check(
            &format!(
                "api/openapi-spec/v3/apis__farm.example.com__{}_openapi.json",
                doc.version
            ),
            &doc.body,
        );
    }
}

/// Swagger 2.0 has no `nullable` (nor v3's composition keywords): kube-apiserver's v2 handler
/// refuses a document with one and answers 503 for the cluster's whole `/openapi/v2`, which
/// kubectl reads to validate what it applies. The v3 document keeps `nullable`.
#[tokio::test]
async fn the_v2_document_has_no_openapi_v3_keyword() {
    fn keys(value: &serde_json::Value, found: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, child) in map {
                    if key != "properties" {
                        found.push(key.clone());
                    }
                    match (key.as_str(), child) {
                        // A properties map's keys are field names, not keywords.
                        ("properties", serde_json::Value::Object(fields)) => {
                            fields.values().for_each(|f| keys(f, found))
                        }
                        _ => keys(child, found),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| keys(i, found)),
            _ => {}
        }
    }
    let docs = documents();
    let v2: serde_json::Value = serde_json::from_slice(&docs.v2).unwrap();
    let mut found = Vec::new();
    keys(&v2["definitions"], &mut found);
    for keyword in [
        "nullable",
        "anyOf",
        "oneOf",
        "not",
        "writeOnly",
        "deprecated",
    ] {
        assert!(
            !found.iter().any(|k| k == keyword),
            "{keyword} in the v2 definitions"
        );
    }
    let v3: serde_json::Value = serde_json::from_slice(&docs.v3("v1alpha").unwrap().body).unwrap();
    assert_eq!(
        v3["components"]["schemas"]["com.example.farm.v1alpha.FarmPodStatus"]["properties"]["nodeName"]
            ["nullable"],
        true
    );
}
