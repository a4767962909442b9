//! The OpenAPI documents are generated from the Rust types; the committed copies under
//! api/openapi-spec/ must match, so API changes show up in review.
//! Regenerate with: FARM_UPDATE_SNAPSHOTS=1 cargo test --test it openapi_snapshot

use std::path::Path;

use farm_apiserver::{
    group::{self, memory_llamas},
    openapi::OpenApiDocuments,
    store::PodCache,
};

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

#[test]
fn openapi_documents_match_the_committed_snapshots() {
    let group = group::farm(memory_llamas(false, 0), PodCache::without_cluster());
    let docs = OpenApiDocuments::new(group.resources());
    check("api/openapi-spec/swagger.json", &docs.v2);
    check(
        "api/openapi-spec/v3/apis__farm.example.com__v1alpha_openapi.json",
        &docs.v3_group_version,
    );
}
