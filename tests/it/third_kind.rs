//! A kind is one file plus one line: Barn (namespaced, in `barn.rs`) and Pasture
//! (cluster-scoped) are declared in the test crate alone, registered with `ApiGroup::serve`, and
//! get discovery, OpenAPI, Tables, every verb, their own strategy hooks, selectable fields and
//! metrics. Silo's schema does not convert for server-side apply: a server with it fails to
//! start.

use crate::{barn::Barn, common};

use std::sync::Arc;

use aggregated_apiserver::{
    group::ApiGroup,
    resource::ServedResource,
    resource::columns::{AGE_COLUMN, ColumnDefinition, age},
    server::{self, AppState},
    store::MemoryStore,
};
use common::oneshot::{App, Reply, call, get};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A pasture: cluster-scoped.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1alpha",
    kind = "Pasture",
    plural = "pastures"
)]
pub struct PastureSpec {
    /// Area in hectares.
    pub hectares: f64,
}

impl ServedResource for Pasture {
    type Spec = PastureSpec;
    const SINGULAR: &'static str = "pasture";
    const CATEGORIES: &'static [&'static str] = &[];
    const DESCRIPTION: &'static str = "Pasture is a field of the farm (a test kind).";

    fn columns() -> Vec<ColumnDefinition> {
        vec![ColumnDefinition::new("Hectares", "number", "Area.")]
    }

    fn cells(&self, _now: jiff::Timestamp) -> Vec<Value> {
        vec![json!(self.spec.hectares)]
    }
}

/// A silo: a kind whose schema does not convert for field management (its status is a list
/// of an unknown `x-kubernetes-list-type`, which kube-openapi refuses too).
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "farm.example.com",
    version = "v1alpha",
    kind = "Silo",
    plural = "silos"
)]
pub struct SiloSpec {
    /// Grain held.
    pub bushels: u32,
}

impl ServedResource for Silo {
    type Spec = SiloSpec;
    const SINGULAR: &'static str = "silo";
    const CATEGORIES: &'static [&'static str] = &[];
    const DESCRIPTION: &'static str = "Silo is a kind whose schema does not convert (a test kind).";

    fn status_schema(_generator: &mut schemars::SchemaGenerator) -> Option<schemars::Schema> {
        Some(schemars::json_schema!({
            "type": "array",
            "items": {"type": "string"},
            "x-kubernetes-list-type": "bogus"
        }))
    }

    fn columns() -> Vec<ColumnDefinition> {
        vec![AGE_COLUMN]
    }

    fn cells(&self, now: jiff::Timestamp) -> Vec<Value> {
        vec![age(&self.metadata, now)]
    }
}

const BASE: &str = "/apis/farm.example.com/v1alpha";
const BARNS: &str = "/apis/farm.example.com/v1alpha/namespaces/farm/barns";
const PASTURES: &str = "/apis/farm.example.com/v1alpha/pastures";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io";

/// A server of Barns and Pastures only: one line each.
fn app() -> App {
    let (options, peer) = common::oneshot_identity();
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Barn>(Arc::new(MemoryStore::<Barn>::default()))
        .serve::<Pasture>(Arc::new(MemoryStore::<Pasture>::default()));
    let (state, _shutdown) = AppState::new(group, options).unwrap();
    App {
        router: server::app(state),
        peer,
    }
}

/// What authorization sees of a request to a status subresource or a cluster-scoped kind is
/// what kube-apiserver's RequestInfo parsing gives (the edge builds it from the route).
#[test]
fn routed_request_info_of_status_and_cluster_scoped_kinds() {
    use aggregated_apiserver::request_info::RequestInfo;
    let (options, _) = common::oneshot_identity();
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Barn>(Arc::new(MemoryStore::<Barn>::default()))
        .serve::<Pasture>(Arc::new(MemoryStore::<Pasture>::default()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (state, _shutdown) = runtime.block_on(async { AppState::new(group, options).unwrap() });
    for (path, routed) in [
        (format!("{BARNS}/red/status"), true),
        (format!("{BARNS}/red"), true),
        (format!("{BARNS}/red/status/x"), false),
        (PASTURES.to_string(), true),
        (format!("{PASTURES}/north"), true),
        (format!("{PASTURES}/north/status"), false),
        (format!("{BASE}/namespaces/farm/pastures/north"), false),
    ] {
        let target = state.endpoints.find(&path);
        assert_eq!(target.is_some(), routed, "{path}");
        for method in [axum::http::Method::GET, axum::http::Method::PUT] {
            if let Some(target) = &target {
                let info = target.request_info(&method, &path, Some("watch=1"));
                assert_eq!(info, RequestInfo::parse(&method, &path, Some("watch=1")));
            }
        }
    }
}

/// A kind whose schema does not convert for field management is refused when the server's
/// state is built (at start-up), naming the kind, rather than served with writes that answer
/// 500.
#[test]
fn a_kind_whose_schema_does_not_convert_fails_at_start_up() {
    let (options, _) = common::oneshot_identity();
    let group = ApiGroup::new(farm_apiserver::resources::GROUP)
        .serve::<Barn>(Arc::new(MemoryStore::<Barn>::default()))
        .serve::<Silo>(Arc::new(MemoryStore::<Silo>::default()));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let Err(error) = runtime.block_on(async { AppState::new(group, options) }) else {
        panic!("a kind whose schema does not convert was served");
    };
    assert_eq!(
        error.to_string(),
        r#"kind Silo (silos.farm.example.com): its schema does not convert for field management: unknown list type "bogus""#
    );
}

fn barn(name: &str, color: &str, stalls: u32) -> String {
    json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Barn",
        "metadata": {"name": name}, "spec": {"color": color, "stalls": stalls}})
    .to_string()
}

async fn send(app: &App, method: &str, uri: &str, content_type: &str, body: &str) -> Reply {
    call(app, method, uri, &[("content-type", content_type)], body).await
}

#[tokio::test]
async fn discovery_and_openapi_describe_the_new_kinds() {
    let app = app();
    let list = get(&app, BASE).await.json();
    let resources = list["resources"].as_array().unwrap();
    let barns = resources.iter().find(|r| r["name"] == "barns").unwrap();
    assert_eq!(barns["namespaced"], true);
    assert_eq!(barns["kind"], "Barn");
    assert_eq!(barns["shortNames"], json!(["bn"]));
    assert_eq!(barns["categories"], json!(["farm"]));
    assert!(barns["verbs"].as_array().unwrap().contains(&json!("patch")));
    let pastures = resources.iter().find(|r| r["name"] == "pastures").unwrap();
    assert_eq!(pastures["namespaced"], false);

    let aggregated = call(
        &app,
        "GET",
        "/apis",
        &[(
            "accept",
            "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList",
        )],
        "",
    )
    .await
    .json();
    let served = &aggregated["items"][0]["versions"][0]["resources"];
    assert_eq!(served[0]["resource"], "barns");
    assert_eq!(served[0]["scope"], "Namespaced");
    assert_eq!(served[1]["resource"], "pastures");
    assert_eq!(served[1]["scope"], "Cluster");

    let v3 = get(&app, "/openapi/v3/apis/farm.example.com/v1alpha").await;
    assert_eq!(v3.status, 200);
    let v3 = v3.json();
    let paths = v3["paths"].as_object().unwrap();
    assert!(
        paths.contains_key("/apis/farm.example.com/v1alpha/namespaces/{namespace}/barns/{name}")
    );
    assert!(paths.contains_key("/apis/farm.example.com/v1alpha/barns"));
    assert!(paths.contains_key("/apis/farm.example.com/v1alpha/pastures/{name}"));
    assert!(!paths.contains_key("/apis/farm.example.com/v1alpha/namespaces/{namespace}/pastures"));
    let read = &paths["/apis/farm.example.com/v1alpha/pastures/{name}"]["get"];
    // kube-apiserver's operation ids: verb, group version, the rest.
    assert_eq!(read["operationId"], "readFarmExampleComV1alphaPasture");
    let schemas = v3["components"]["schemas"].as_object().unwrap();
    let barn = schemas
        .iter()
        .find(|(name, _)| name.ends_with(".Barn"))
        .map(|(_, schema)| schema)
        .expect("a Barn schema");
    assert_eq!(barn["x-kubernetes-group-version-kind"][0]["kind"], "Barn");
    let spec = schemas
        .iter()
        .find(|(name, _)| name.ends_with(".BarnSpec"))
        .map(|(_, schema)| schema)
        .expect("a BarnSpec schema");
    assert_eq!(
        spec["properties"]["color"]["description"],
        "Colour of the barn; defaults to red."
    );
}

#[tokio::test]
async fn every_verb_with_the_kinds_strategy() {
    let app = app();
    // create: the kind's default and warning.
    let created = send(
        &app,
        "POST",
        BARNS,
        "application/json",
        &barn("big", "", 120),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert_eq!(created.json()["spec"]["color"], "red");
    assert!(
        created.headers["warning"]
            .to_str()
            .unwrap()
            .contains("more than 100 stalls")
    );
    assert_eq!(
        send(
            &app,
            "POST",
            BARNS,
            "application/json",
            &barn("small", "blue", 4)
        )
        .await
        .status,
        201
    );

    // get as a Table.
    let table = call(
        &app,
        "GET",
        &format!("{BARNS}/big"),
        &[("accept", TABLE)],
        "",
    )
    .await
    .json();
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["columnDefinitions"][1]["name"], "Color");
    assert_eq!(table["rows"][0]["cells"][1], "red");

    // list with the kind's selectable field.
    let blue = get(&app, &format!("{BARNS}?fieldSelector=spec.color%3Dblue"))
        .await
        .json();
    let names: Vec<&str> = blue["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["small"]);
    let unknown = get(&app, &format!("{BARNS}?fieldSelector=spec.stalls%3D4")).await;
    assert_eq!(
        unknown.status(400, "BadRequest"),
        "field label not supported: spec.stalls"
    );

    // update: stalls are immutable (validate_update).
    let mut current = get(&app, &format!("{BARNS}/small")).await.json();
    current["spec"]["stalls"] = json!(5);
    let refused = send(
        &app,
        "PUT",
        &format!("{BARNS}/small"),
        "application/json",
        &current.to_string(),
    )
    .await;
    assert!(refused.status(422, "Invalid").contains("spec.stalls"));
    current["spec"]["color"] = json!("green");
    current["spec"]["stalls"] = json!(4);
    let updated = send(
        &app,
        "PUT",
        &format!("{BARNS}/small"),
        "application/json",
        &current.to_string(),
    )
    .await;
    assert_eq!(updated.status, 200);
    assert_eq!(updated.json()["spec"]["color"], "green");

    // patch.
    let patched = send(
        &app,
        "PATCH",
        &format!("{BARNS}/small"),
        "application/merge-patch+json",
        r#"{"spec":{"color":"white"}}"#,
    )
    .await;
    assert_eq!(patched.status, 200);
    assert_eq!(patched.json()["spec"]["color"], "white");

    // watch from the start: the two barns.
    let watch = get(&app, &format!("{BARNS}?watch=true&timeoutSeconds=1")).await;
    let events: Vec<Value> = String::from_utf8_lossy(&watch.body)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(events.iter().all(|e| e["type"] == "ADDED"));

    // delete, then deletecollection.
    assert_eq!(
        send(
            &app,
            "DELETE",
            &format!("{BARNS}/big"),
            "application/json",
            ""
        )
        .await
        .status,
        200
    );
    let gone = send(&app, "DELETE", BARNS, "application/json", "")
        .await
        .json();
    assert_eq!(gone["items"][0]["metadata"]["name"], "small");
    assert_eq!(get(&app, &format!("{BARNS}/small")).await.status, 404);

    // metrics: the kind's own label and stored-objects series.
    let metrics = String::from_utf8(get(&app, "/metrics").await.body).unwrap();
    assert!(
        metrics.contains(r#"apiserver_request_total{verb="POST",resource="barns",code="201"} 2"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"apiserver_storage_objects{resource="barns.farm.example.com"} 0"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_cluster_scoped_kind_lives_outside_namespaces() {
    let app = app();
    let body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Pasture",
        "metadata": {"name": "north", "namespace": "ignored"}, "spec": {"hectares": 12.5}});
    let created = send(
        &app,
        "POST",
        PASTURES,
        "application/json",
        &body.to_string(),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert!(created.json()["metadata"].get("namespace").is_none());
    let got = get(&app, &format!("{PASTURES}/north")).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["spec"]["hectares"], 12.5);
    let list = get(&app, PASTURES).await.json();
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    // Not under a namespace.
    let namespaced = get(&app, &format!("{BASE}/namespaces/default/pastures")).await;
    assert_eq!(namespaced.status, 404);
    let deleted = send(
        &app,
        "DELETE",
        &format!("{PASTURES}/north"),
        "application/json",
        "",
    )
    .await;
    assert_eq!(deleted.status, 200);
    assert_eq!(get(&app, &format!("{PASTURES}/north")).await.status, 404);
}

#[tokio::test]
async fn a_status_subresource_writes_the_status_alone() {
    let app = app();
    let mut body: Value = serde_json::from_str(&barn("red", "red", 4)).unwrap();
    body["status"] = json!({"ready": true});
    let created = send(&app, "POST", BARNS, "application/json", &body.to_string()).await;
    assert_eq!(created.status, 201);
    assert!(
        created.json().get("status").is_none(),
        "a create sets no status"
    );

    // PUT /status: the status changes, anything else sent is ignored.
    let mut sent = created.json();
    sent["status"] = json!({"ready": true});
    sent["spec"]["color"] = json!("black");
    let status = format!("{BARNS}/red/status");
    let written = send(&app, "PUT", &status, "application/json", &sent.to_string()).await;
    assert_eq!(
        written.status,
        200,
        "{}",
        String::from_utf8_lossy(&written.body)
    );
    let written = written.json();
    assert_eq!(written["status"]["ready"], true);
    assert_eq!(written["spec"]["color"], "red");
    assert_eq!(
        written["metadata"]["generation"], 1,
        "a status write is no spec change"
    );

    // PUT of the object: the spec changes, the status sent is ignored.
    let mut sent = written.clone();
    sent["spec"]["color"] = json!("green");
    sent["status"] = json!({"ready": false});
    let updated = send(
        &app,
        "PUT",
        &format!("{BARNS}/red"),
        "application/json",
        &sent.to_string(),
    )
    .await;
    assert_eq!(updated.status, 200);
    let updated = updated.json();
    assert_eq!(updated["spec"]["color"], "green");
    assert_eq!(updated["status"]["ready"], true);

    // PATCH /status, and GET /status (the whole object, as kube-apiserver answers).
    let patched = send(
        &app,
        "PATCH",
        &status,
        "application/merge-patch+json",
        r#"{"status":{"ready":false},"spec":{"color":"pink"}}"#,
    )
    .await;
    assert_eq!(patched.status, 200);
    let got = get(&app, &status).await.json();
    assert_eq!(got["status"]["ready"], false);
    assert_eq!(got["spec"]["color"], "green");
    assert_eq!(
        send(&app, "DELETE", &status, "application/json", "")
            .await
            .status,
        405
    );

    // Discovery and OpenAPI know it; a kind without one has none.
    let list = get(&app, BASE).await.json();
    let sub = list["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "barns/status")
        .expect("barns/status in discovery");
    assert_eq!(sub["verbs"], json!(["get", "patch", "update"]));
    let v3 = get(&app, "/openapi/v3/apis/farm.example.com/v1alpha")
        .await
        .json();
    let path =
        &v3["paths"]["/apis/farm.example.com/v1alpha/namespaces/{namespace}/barns/{name}/status"];
    assert_eq!(
        path["put"]["operationId"],
        "replaceFarmExampleComV1alphaNamespacedBarnStatus"
    );
    assert_eq!(
        get(&app, &format!("{PASTURES}/north/status")).await.status,
        404
    );
}

/// Server-side apply on a kind with a status subresource: the object's appliers own the spec,
/// `/status` appliers own the status (entries with `subresource: status`), each conflicts only
/// with its own kind of writer, and a status field the status applier drops is removed.
#[tokio::test]
async fn apply_on_the_object_and_on_its_status_owns_separate_fields() {
    let app = app();
    let apply = |uri: String, body: Value| {
        let app = &app;
        async move {
            send(
                app,
                "PATCH",
                &uri,
                "application/apply-patch+yaml",
                &body.to_string(),
            )
            .await
        }
    };
    let barn = |stalls: u32, status: Option<Value>| {
        let mut body = json!({"apiVersion": "farm.example.com/v1alpha", "kind": "Barn",
            "metadata": {"name": "tall"}, "spec": {"color": "red", "stalls": stalls}});
        if let Some(status) = status {
            body["status"] = status;
        }
        body
    };
    // Applying to /status of a Barn that is not there: 404, nothing created.
    let absent = apply(
        format!("{BARNS}/tall/status?fieldManager=barn-controller"),
        barn(4, Some(json!({"ready": true}))),
    )
    .await;
    assert_eq!(
        absent.status,
        404,
        "{}",
        String::from_utf8_lossy(&absent.body)
    );

    // The object's apply ignores the status it sends.
    let created = apply(
        format!("{BARNS}/tall?fieldManager=builder"),
        barn(4, Some(json!({"ready": true}))),
    )
    .await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    assert!(created.json().get("status").is_none());

    let status = format!("{BARNS}/tall/status?fieldManager=barn-controller");
    let ready = apply(
        status.clone(),
        barn(4, Some(json!({"ready": true, "note": "swept"}))),
    )
    .await;
    assert_eq!(
        ready.status,
        200,
        "{}",
        String::from_utf8_lossy(&ready.body)
    );
    let ready = ready.json();
    assert_eq!(ready["status"]["ready"], true);
    let entries = ready["metadata"]["managedFields"].as_array().unwrap();
    let controller = entries
        .iter()
        .find(|e| e["manager"] == "barn-controller")
        .expect("the status applier's entry");
    assert_eq!(controller["operation"], "Apply");
    assert_eq!(controller["subresource"], "status");
    assert_eq!(
        controller["fieldsV1"],
        json!({"f:status": {"f:note": {}, "f:ready": {}}})
    );
    let builder = entries.iter().find(|e| e["manager"] == "builder").unwrap();
    assert!(builder.get("subresource").is_none());

    // Another status applier with another value conflicts with the controller, naming it
    // with its subresource as kube-apiserver does.
    let other = apply(
        format!("{BARNS}/tall/status?fieldManager=other"),
        barn(4, Some(json!({"ready": false}))),
    )
    .await;
    assert_eq!(
        other.status,
        409,
        "{}",
        String::from_utf8_lossy(&other.body)
    );
    assert_eq!(
        other.json()["message"],
        r#"Apply failed with 1 conflict: conflict with "barn-controller" with subresource "status": .status.ready"#
    );
    // The builder changing the spec does not touch the status's owner.
    let mut blue = barn(4, None);
    blue["spec"]["color"] = json!("blue");
    let bigger = apply(format!("{BARNS}/tall?fieldManager=builder"), blue).await;
    assert_eq!(
        bigger.status,
        200,
        "{}",
        String::from_utf8_lossy(&bigger.body)
    );
    assert_eq!(bigger.json()["status"]["ready"], true);
    // The controller no longer applies .status.note: it is removed.
    let dropped = apply(status, barn(4, Some(json!({"ready": true})))).await;
    assert_eq!(
        dropped.status,
        200,
        "{}",
        String::from_utf8_lossy(&dropped.body)
    );
    assert!(
        dropped.json()["status"].get("note").is_none(),
        "{}",
        dropped.json()
    );
    assert_eq!(dropped.json()["status"]["ready"], true);
    assert_eq!(dropped.json()["spec"]["color"], "blue");
}
