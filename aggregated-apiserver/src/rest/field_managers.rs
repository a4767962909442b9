//! Field ownership on every write (`metadata.managedFields`) and server-side apply, through
//! [`fieldmanager`], called where k8s.io/apiserver's handlers call its FieldManager:
//! create, update and non-apply patches record an `Update` entry for their manager; apply
//! merges the applied configuration and records an `Apply` entry.

use std::{collections::HashMap, sync::Arc};

use axum::http::{HeaderMap, header};
use fieldmanager::{self, FieldManager, Schema};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use serde_json::Value;

use super::body;
use super::options::{FIELD_MANAGER_MAX_LENGTH, is_print};
use super::strategy::Subresource;
use crate::{
    admission::cel::Numbers,
    api::openapi,
    error::{Error, FieldError, Result},
    resource::{ResourceInfo, ServedResource, VersionOf},
    store::Stored,
};

/// A kind's field managers: its object's, and its status subresource's when it has one (which
/// owns `.status` alone, as kube-apiserver's reset fields for a custom resource say).
#[derive(Debug)]
pub(crate) struct FieldManagers {
    object: FieldManager,
    status: FieldManager,
    /// The kind's versions, when it has several (a policy's merge is at the object's).
    versions: Option<Arc<dyn fieldmanager::Versions>>,
}

impl FieldManagers {
    /// The field managers of the kind `info` describes, from the schema its OpenAPI publishes
    /// (list and map types included), so apply merges by what clients read there.
    /// `versions`: the kind's other versions, when it is served at several.
    pub(crate) fn of(
        info: &ResourceInfo,
        versions: Option<Arc<dyn fieldmanager::Versions>>,
    ) -> std::result::Result<Self, fieldmanager::Error> {
        let schema = schema_of(info)?;
        let api_version = format!("{}/{}", info.group, info.version);
        let manager = |subresource: &str| {
            let manager = FieldManager::new(schema.clone(), &api_version, &info.kind, subresource);
            let manager = match &versions {
                Some(versions) => manager.with_versions(versions.clone()),
                None => manager,
            };
            if info.status {
                manager.with_status_reset_fields()
            } else {
                manager
            }
        };
        Ok(Self {
            object: manager(""),
            status: manager("status"),
            versions,
        })
    }

    fn of_part(&self, part: Subresource) -> &FieldManager {
        match part {
            Subresource::Object => &self.object,
            Subresource::Status => &self.status,
        }
    }

    /// Records `manager`'s changes from `live` (None: a create) to `next` in `next`'s
    /// managedFields, which start as the client sent them (an empty list resets them). As
    /// kube-apiserver's `UpdateNoErrors`, a failure leaves the object untracked rather than
    /// failing the write.
    pub(crate) fn update<K: ServedResource>(
        &self,
        part: Subresource,
        live: Option<&Stored<K>>,
        next: &mut K,
        manager: &str,
    ) -> Result<()> {
        let live = live.map(|live| live_value(live)).transpose()?;
        let mut value = serde_json::to_value(&*next)
            .map_err(|e| Error::Internal(format!("encoding the object: {e}")))?;
        self.of_part(part)
            .update_no_errors(live.as_ref(), &mut value, manager, &now());
        next.meta_mut().managed_fields = managed_fields(&value);
        Ok(())
    }

    /// The object that applying `config` as `manager` to `live` (None: nothing there yet)
    /// makes, managedFields included; 409 with kube-apiserver's message and causes on
    /// conflicts unless `force`.
    pub(crate) fn apply<K: ServedResource>(
        &self,
        part: Subresource,
        live: Option<&Stored<K>>,
        config: &Value,
        manager: &str,
        force: bool,
    ) -> Result<Value> {
        let live = live.map(|live| live_value(live)).transpose()?;
        self.of_part(part)
            .apply(live.as_ref(), config, manager, force, &now())
            .map_err(|error| match error {
                fieldmanager::Error::Conflicts(ref conflicts) => Error::ApplyConflict {
                    message: error.to_string(),
                    causes: conflicts
                        .iter()
                        .map(|c| FieldError {
                            field: c.path_display(),
                            reason: "FieldManagerConflict",
                            message: format!("conflict with {}", c.manager_display()),
                        })
                        .collect(),
                },
                fieldmanager::Error::Invalid(message)
                | fieldmanager::Error::BadRequest(message) => Error::BadRequest(message),
                fieldmanager::Error::Internal(message) => Error::Internal(message),
            })
    }
}

/// The schema `info`'s OpenAPI publishes, for field management.
fn schema_of(info: &ResourceInfo) -> std::result::Result<Schema, fieldmanager::Error> {
    let (root, components) = openapi::kind_schema(info);
    Schema::from_openapi_v3(&root, &components)
}

/// A kind's two versions `A` and `B` for field management: their schemas, and conversion by
/// the kind's own [`VersionOf`] (the JSON decoded at one version, converted, encoded at the
/// other; an object that does not decode, as a write may leave one midway, does not convert).
pub(crate) struct KindVersions<A, B> {
    schemas: [(&'static str, Schema); 2],
    /// The versions' names (`v1`), `A`'s first.
    names: [&'static str; 2],
    kinds: std::marker::PhantomData<fn() -> (A, B)>,
}

impl<A: VersionOf<B>, B: VersionOf<A>> KindVersions<A, B> {
    pub(crate) fn new() -> std::result::Result<Self, fieldmanager::Error> {
        Ok(Self {
            schemas: [
                (A::group_version(), schema_of(&ResourceInfo::of::<A>(true))?),
                (B::group_version(), schema_of(&ResourceInfo::of::<B>(true))?),
            ],
            names: [A::version_name(), B::version_name()],
            kinds: std::marker::PhantomData,
        })
    }
}

impl<A, B> std::fmt::Debug for KindVersions<A, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.schemas.iter().map(|(version, _)| version))
            .finish()
    }
}

/// `object` (at `F`) converted to `T`, as the store converts a write: `current`, the object
/// as stored at `T` (when there is one), keeps what `F` cannot say.
fn converted<F: VersionOf<T>, T: ServedResource>(
    object: &Value,
    current: Option<&Value>,
) -> Option<Value> {
    let from = F::deserialize(object).ok()?;
    let current = current.and_then(|current| T::deserialize(current).ok());
    serde_json::to_value(from.to_stored(current.as_ref())).ok()
}

impl<A: VersionOf<B>, B: VersionOf<A>> KindVersions<A, B> {
    /// `object` converted to the apiVersion `version`, `current` at that version.
    fn convert_at(&self, object: &Value, version: &str, current: Option<&Value>) -> Option<Value> {
        let from = object.get("apiVersion")?.as_str()?;
        if from == version {
            Some(object.clone())
        } else if from == A::group_version() && version == B::group_version() {
            converted::<A, B>(object, current)
        } else if from == B::group_version() && version == A::group_version() {
            converted::<B, A>(object, current)
        } else {
            None
        }
    }
}

impl<A: VersionOf<B>, B: VersionOf<A>> fieldmanager::Versions for KindVersions<A, B> {
    fn schema(&self, version: &str) -> Option<&Schema> {
        self.schemas
            .iter()
            .find(|(v, _)| *v == version)
            .map(|(_, schema)| schema)
    }

    fn convert(&self, object: &Value, version: &str) -> Option<Value> {
        self.convert_at(object, version, None)
    }
}

/// For admission, the same conversion by version name (`matchPolicy: Equivalent`).
impl<A: VersionOf<B>, B: VersionOf<A>> crate::admission::Equivalents for KindVersions<A, B> {
    fn versions(&self) -> &[&'static str] {
        &self.names
    }

    fn convert_to(&self, object: &Value, version: &str, current: Option<&Value>) -> Option<Value> {
        let to = if version == A::version_name() {
            A::group_version()
        } else if version == B::version_name() {
            B::group_version()
        } else {
            return None;
        };
        self.convert_at(object, to, current)
    }

    fn numbers(&self, version: &str) -> Option<Arc<Numbers>> {
        if version == A::version_name() {
            Some(numbers_of::<A>())
        } else if version == B::version_name() {
            Some(numbers_of::<B>())
        } else {
            None
        }
    }
}

/// A kind's versions as its field managers and admission see them.
pub trait Versions: fieldmanager::Versions + crate::admission::Equivalents {}

impl<T: fieldmanager::Versions + crate::admission::Equivalents> Versions for T {}

impl FieldManagers {
    /// `live` with the apply configuration `config` merged in, as a MutatingAdmissionPolicy's
    /// is (SMD's merge, no ownership recorded): a configuration that sets part of an atomic
    /// list, map or struct is refused, as the rest of it would be dropped. The schema is that
    /// of `live`'s version (a policy of another version sees the object converted to its own).
    pub(crate) fn merge_configuration(
        &self,
        live: &Value,
        config: &Value,
    ) -> std::result::Result<Value, String> {
        let version = live.get("apiVersion").and_then(Value::as_str);
        let schema = match (&self.versions, version) {
            (Some(versions), Some(version)) => versions
                .schema(version)
                .unwrap_or_else(|| self.object.schema()),
            _ => self.object.schema(),
        };
        let atomics = fieldmanager::typed::atomic_paths(schema, config);
        if !atomics.is_empty() {
            return Err(format!(
                "invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: {}",
                atomics.join(", ")
            ));
        }
        fieldmanager::typed::validate(schema, config, false)
            .map_err(|e| format!("failed to convert patch object to typed object: {e}"))?;
        fieldmanager::typed::merge(schema, live, config)
            .map_err(|e| format!("failed to merge patch: {e}"))
    }
}

fn live_value<K: ServedResource>(live: &Stored<K>) -> Result<Value> {
    serde_json::from_slice(live.json())
        .map_err(|e| Error::Internal(format!("decoding the stored object: {e}")))
}

fn managed_fields(value: &Value) -> Option<Vec<ManagedFieldsEntry>> {
    let entries = value.pointer("/metadata/managedFields")?;
    serde_json::from_value(entries.clone()).ok()
}

/// Now, at the second (truncated, as metav1.Time and `creationTimestamp` keep it).
fn now() -> String {
    crate::resource::now()
        .0
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// The manager of a write: `fieldManager`, else the User-Agent up to its first `/`, printable
/// characters only and at most 128 bytes (k8s.io/apiserver's `managerOrUserAgent`).
pub(crate) fn manager_or_user_agent(manager: String, headers: &HeaderMap) -> String {
    if !manager.is_empty() {
        return manager;
    }
    let agent = headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let mut out = String::new();
    for c in agent.split('/').next().unwrap_or("").chars() {
        if !is_print(c) {
            continue;
        }
        if out.len() + c.len_utf8() > FIELD_MANAGER_MAX_LENGTH {
            break;
        }
        out.push(c);
    }
    out
}

/// An apply body: YAML, of which JSON is a part (kubectl and client-go send JSON, tried
/// first), nested at most [`body::MAX_DEPTH`] deep (go-yaml's bound, with its message). May
/// be deep: call inside [`body::Work`].
pub(crate) fn parse_apply_body(bytes: &[u8]) -> Result<body::Deep> {
    if body::text_depth(bytes, body::MAX_DEPTH) > body::MAX_DEPTH {
        return Err(Error::BadRequest(format!(
            "error decoding YAML: error converting YAML to JSON: {}",
            body::YAML_TOO_DEEP
        )));
    }
    let value = match body::parse_json(bytes) {
        Ok(value) => value,
        Err(_) => body::parse_yaml(bytes)
            .map_err(|e| Error::BadRequest(format!("error decoding YAML: {e}")))?,
    };
    if !value.0.is_object() {
        return Err(Error::BadRequest(
            "error decoding YAML: the applied configuration must be an object".into(),
        ));
    }
    Ok(value)
}

/// Where `K`'s schema has numbers, read from its OpenAPI once per kind.
pub(crate) fn numbers_of<K: ServedResource>() -> Arc<Numbers> {
    type Cache = std::sync::Mutex<HashMap<std::any::TypeId, Arc<Numbers>>>;
    static CACHE: std::sync::OnceLock<Cache> = std::sync::OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let id = std::any::TypeId::of::<K>();
    if let Ok(cache) = cache.lock()
        && let Some(found) = cache.get(&id)
    {
        return found.clone();
    }
    let info = ResourceInfo::of::<K>(false);
    let (root, components) = crate::api::openapi::kind_schema(&info);
    let numbers = Arc::new(Numbers::from_openapi(&root, &components));
    if let Ok(mut cache) = cache.lock() {
        cache.insert(id, numbers.clone());
    }
    numbers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manager_falls_back_to_the_user_agent_before_its_first_slash() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::USER_AGENT,
            "kubectl/v1.36.0 (linux/amd64) kubernetes/abc"
                .parse()
                .unwrap(),
        );
        assert_eq!(manager_or_user_agent(String::new(), &headers), "kubectl");
        assert_eq!(manager_or_user_agent("mine".into(), &headers), "mine");
        headers.insert(header::USER_AGENT, "x".repeat(300).parse().unwrap());
        assert_eq!(manager_or_user_agent(String::new(), &headers).len(), 128);
        assert_eq!(manager_or_user_agent(String::new(), &HeaderMap::new()), "");
    }

    #[test]
    fn apply_bodies_are_yaml_or_json() {
        let yaml = b"apiVersion: zoo.example.com/v1alpha\nkind: Zebra\nmetadata:\n  name: a\nspec:\n  weight: 2\n";
        assert_eq!(parse_apply_body(yaml).unwrap().0["spec"]["weight"], 2);
        let json = br#" {"kind":"Zebra","spec":{"weight":2.5}}"#;
        assert_eq!(parse_apply_body(json).unwrap().0["spec"]["weight"], 2.5);
        assert!(matches!(
            parse_apply_body(b"- a\n- b\n"),
            Err(Error::BadRequest(_))
        ));
        assert!(matches!(
            parse_apply_body(b"{nope"),
            Err(Error::BadRequest(_))
        ));
        // A YAML flow mapping is YAML, not JSON.
        let flow = b"{apiVersion: zoo.example.com/v1alpha, kind: Zebra, spec: {weight: 3}}";
        assert_eq!(parse_apply_body(flow).unwrap().0["spec"]["weight"], 3);
    }

    #[test]
    fn aliases_that_expand_past_the_budget_are_refused() {
        // 2,000 anchored values referred to 2,000 times: 4 million values from 18 KB.
        let mut yaml = String::from("kind: Zebra\na: &a [");
        yaml.push_str(&vec!["1"; 2000].join(","));
        yaml.push_str("]\nb: [");
        yaml.push_str(&vec!["*a"; 2000].join(","));
        yaml.push_str("]\n");
        let started = std::time::Instant::now();
        let Err(Error::BadRequest(message)) = parse_apply_body(yaml.as_bytes()) else {
            panic!("accepted");
        };
        assert!(message.contains("excessive aliasing"), "{message}");
        assert!(started.elapsed() < std::time::Duration::from_secs(2));
        // A few aliases are fine.
        let ok = b"kind: Zebra\nmetadata:\n  labels: &l {a: b}\n  annotations: *l\n";
        assert_eq!(
            parse_apply_body(ok).unwrap().0["metadata"]["annotations"]["a"],
            "b"
        );
    }
}
