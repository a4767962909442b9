//! The FieldManager facade: kube's manager chain (apimachinery
//! `managedfields/internal`), outermost first:
//! versionCheck → lastAppliedUpdater → lastAppliedManager →
//! skipNonApplied → capManagers → buildManagerInfo → managedFieldsUpdater
//! → stripMeta → structuredMerge (SMD updater).

use serde_json::{Map, Value, json};

use super::Error;
use super::managed::{self, DecodeError, Managed, Operation, manager_identifier};
use super::merge::{ManagedFields, Updater, VersionedSet};
use super::path::PathElement;
use super::schema::Schema;
use super::set::FieldSet;
use super::typed;

/// kube's `LastAppliedConfigAnnotation`.
pub(crate) const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// kube's `DefaultMaxUpdateManagers`.
pub(crate) const MAX_UPDATE_MANAGERS: usize = 10;
/// The internal manager name managedFieldsUpdater uses for updates.
const CURRENT_OPERATION: &str = "current-operation";
/// Maximum total annotation size (apimachinery `TotalAnnotationSizeLimitB`).
const TOTAL_ANNOTATION_SIZE_LIMIT: usize = 256 * 1024;

/// Tracks field ownership for one resource (and subresource) of one kind.
#[derive(Debug, Clone)]
pub struct FieldManager {
    schema: Schema,
    api_version: String,
    kind: String,
    subresource: String,
    reset: FieldSet,
    strip: FieldSet,
    /// The kind's other versions, when it has any.
    versions: Option<std::sync::Arc<dyn super::Versions>>,
}

fn f(name: &str) -> PathElement {
    PathElement::field(name)
}

/// The reset fields of [`FieldManager::with_status_reset_fields`] for
/// `subresource`.
fn status_reset_fields(schema: &Schema, subresource: &str) -> FieldSet {
    if subresource != "status" {
        return FieldSet::from_paths([vec![f("status")]]);
    }
    let mut names: Vec<String> = ["apiVersion", "kind", "metadata", "spec"]
        .map(String::from)
        .to_vec();
    if let Some(m) = schema.resolve(schema.root()).ok().and_then(|r| r.map) {
        names.extend(m.fields.keys().filter(|k| *k != "status").cloned());
    }
    FieldSet::from_paths(names.iter().map(|n| vec![f(n)]))
}

impl FieldManager {
    /// A field manager for `kind` at `api_version` (e.g.
    /// "farm.example.com/v1alpha"); `subresource` is "" or e.g. "status".
    /// No fields are reset; see [`FieldManager::with_status_reset_fields`].
    pub fn new(schema: Schema, api_version: &str, kind: &str, subresource: &str) -> Self {
        let mut strip =
            FieldSet::from_paths([vec![f("apiVersion")], vec![f("kind")], vec![f("metadata")]]);
        for m in [
            "name",
            "namespace",
            "creationTimestamp",
            "selfLink",
            "uid",
            "clusterName",
            "generation",
            "managedFields",
            "resourceVersion",
        ] {
            strip.insert(&[f("metadata"), f(m)]);
        }
        FieldManager {
            schema,
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            subresource: subresource.to_string(),
            reset: FieldSet::new(),
            strip,
            versions: None,
        }
    }

    /// For a kind served in several versions: managers that wrote at
    /// another version keep their fields there, and conflicts with them
    /// are found at their version (SMD's converter).
    pub fn with_versions(mut self, versions: std::sync::Arc<dyn super::Versions>) -> Self {
        self.versions = Some(versions);
        self
    }

    /// For a kind with a status subresource: kube's reset fields (the
    /// strategy's `GetResetFields`) for a custom resource with one, whose
    /// changes are never attributed to anyone, recursively. The main
    /// resource resets `.status`; `status` resets every other top-level
    /// field of the schema (for CRDs: apiVersion, kind, metadata, spec).
    pub fn with_status_reset_fields(mut self) -> Self {
        self.reset = status_reset_fields(&self.schema, &self.subresource);
        self
    }

    /// The schema.
    pub fn schema(&self) -> &Schema {
        &self.schema
    }

    fn updater(&self) -> Updater<'_> {
        Updater {
            schema: &self.schema,
            ignored: &self.reset,
            versions: self.versions.as_deref(),
        }
    }

    /// The object kube's `Creater.New` returns for this kind, used as the
    /// live object of a create.
    fn empty_object(api_version: &str, kind: &str) -> Value {
        json!({"apiVersion": api_version, "kind": kind})
    }

    /// `namespace/name; group/version, Kind=kind` as kube's objectGVKNN.
    fn gvknn(obj: &Value) -> String {
        let meta = |k: &str| {
            obj.pointer(&format!("/metadata/{k}"))
                .and_then(Value::as_str)
                .unwrap_or("")
        };
        format!(
            "{}/{}; {}",
            meta("namespace"),
            meta("name"),
            gvk_string(obj)
        )
    }

    /// Create (live `None`), update and merge/JSON patch. `new` is the
    /// object after the write, with whatever managedFields the client sent;
    /// on success its `metadata.managedFields` is what kube-apiserver
    /// stores. On error `new` may have lost its managedFields; kube's
    /// handlers then store the object without them (see
    /// [`FieldManager::update_no_errors`]).
    pub(crate) fn update(
        &self,
        live: Option<&Value>,
        new: &mut Value,
        manager: &str,
        now: &str,
    ) -> Result<(), Error> {
        let now = parse_now(now)?;
        let live_obj = live
            .cloned()
            .unwrap_or_else(|| Self::empty_object(&self.api_version, &self.kind));
        let managed = self.decode_live_or_new(&live_obj, new)?;
        set_managed_fields(new, None);
        // skipNonApplied: an existing object without managedFields stays
        // untracked until it is applied to.
        if managed.fields.is_empty() && !uid(&live_obj).is_empty() {
            return Ok(());
        }
        let managed = self.tracked_update(&live_obj, new, managed, manager, now)?;
        set_managed_fields(new, managed::encode(&managed));
        Ok(())
    }

    /// kube's `UpdateNoErrors`, what create, update and non-apply patch
    /// handlers call: records `manager`'s changes from `live` (`None`: a
    /// create) to `new` as an `Update` entry in `new`'s
    /// `metadata.managedFields`, which start as the client sent them (an
    /// empty list resets them, anything it cannot use keeps `live`'s).
    /// `now` is the write's time, RFC 3339 at the second. A failure leaves
    /// the object untracked (managedFields removed) rather than failing the
    /// write.
    pub fn update_no_errors(
        &self,
        live: Option<&Value>,
        new: &mut Value,
        manager: &str,
        now: &str,
    ) {
        if self.update(live, new, manager, now).is_err() {
            set_managed_fields(new, None);
        }
    }

    /// Server-side apply: returns the object to store (live merged with
    /// `config`, pruned, managedFields set); live `None` is a create. `now`
    /// is as for [`FieldManager::update_no_errors`]. Errors:
    /// [`Error::Conflicts`] unless `force`, [`Error::BadRequest`] for a
    /// wrong apiVersion or kind or managedFields in `config`,
    /// [`Error::Invalid`] for a configuration that does not fit the
    /// schema, [`Error::Internal`] for a live object that cannot be read.
    pub fn apply(
        &self,
        live: Option<&Value>,
        config: &Value,
        manager: &str,
        force: bool,
        now: &str,
    ) -> Result<Value, Error> {
        let now = parse_now(now)?;
        let live_obj = live
            .cloned()
            .unwrap_or_else(|| Self::empty_object(&self.api_version, &self.kind));
        let managed = match managed::decode(managed_fields(&live_obj)) {
            Ok(m) => m,
            Err(DecodeError::Invalid(e) | DecodeError::Malformed(e)) => {
                return Err(Error::Internal(format!(
                    "failed to decode managed fields: {e}"
                )));
            }
        };
        // versionCheck
        let (av, kind) = (str_at(config, "/apiVersion"), str_at(config, "/kind"));
        if av != self.api_version || kind != self.kind {
            return Err(Error::BadRequest(format!(
                "invalid object type: {}",
                gvk_string(config)
            )));
        }
        let (mut obj, managed) =
            self.apply_last_applied(&live_obj, config, managed, manager, force, now)?;
        // lastAppliedUpdater
        if manager == "kubectl" && has_last_applied(&obj) {
            set_last_applied(&mut obj, build_last_applied(config));
        }
        set_managed_fields(&mut obj, managed::encode(&managed));
        Ok(obj)
    }

    fn decode_live_or_new(&self, live: &Value, new: &Value) -> Result<Managed, Error> {
        let from_live = || managed::decode(managed_fields(live)).unwrap_or_default();
        // Subresource requests may not set managedFields.
        if !self.subresource.is_empty() {
            return Ok(from_live());
        }
        let requested = managed_fields(new);
        if is_reset(requested) {
            return Ok(Managed::default());
        }
        match managed::decode(requested) {
            Ok(m) if !m.fields.is_empty() => Ok(m),
            // kube cannot even decode such an object: 400.
            Err(DecodeError::Malformed(e)) => Err(Error::Invalid(e)),
            // Empty or invalid: keep the live entries, so clients unaware
            // of managedFields cannot drop them by accident.
            _ => Ok(from_live()),
        }
    }

    /// capManagers(buildManagerInfo(managedFieldsUpdater(stripMeta(SMD)))).Update
    fn tracked_update(
        &self,
        live: &Value,
        new: &Value,
        mut managed: Managed,
        manager: &str,
        now: i64,
    ) -> Result<Managed, Error> {
        let id = manager_identifier(
            or_unknown(manager),
            Operation::Update,
            &self.api_version,
            &self.subresource,
        );
        typed::validate(&self.schema, new, true).map_err(|e| {
            Error::Internal(format!(
                "failed to update ManagedFields ({}): failed to convert new object ({}) to smd typed: {e}",
                Self::gvknn(new),
                Self::gvknn(new)
            ))
        })?;
        typed::validate(&self.schema, live, true).map_err(|e| {
            Error::Internal(format!(
                "failed to convert live object ({}) to smd typed: {e}",
                Self::gvknn(live)
            ))
        })?;
        let mut fields = self
            .updater()
            .update(
                live,
                new,
                &self.api_version,
                managed.fields,
                CURRENT_OPERATION,
            )
            .map_err(|e| {
                Error::Internal(format!(
                    "failed to update ManagedFields ({}): {e}",
                    Self::gvknn(new)
                ))
            })?;
        self.strip_fields(&mut fields, CURRENT_OPERATION);
        // managedFieldsUpdater: the operation took fields, so the object
        // changed: merge into the manager's entry and bump its time.
        if let Some(vs) = fields.remove(CURRENT_OPERATION) {
            let set = match fields.get(&id) {
                Some(prev) => vs.set.union(&prev.set),
                None => vs.set,
            };
            fields.insert(id.clone(), VersionedSet { set, ..vs });
            managed.times.insert(id, Some(now));
        }
        managed.fields = fields;
        self.cap_update_managers(&mut managed);
        Ok(managed)
    }

    /// stripMeta: the manager never owns type/object metadata fields.
    fn strip_fields(&self, fields: &mut ManagedFields, manager: &str) {
        if let Some(vs) = fields.get_mut(manager) {
            vs.set = vs.set.difference(&self.strip);
            if vs.set.is_empty() {
                fields.remove(manager);
            }
        }
    }

    /// capManagers: merges the oldest Update entries into per-version
    /// "ancient-changes" buckets until at most 10 remain.
    fn cap_update_managers(&self, managed: &mut Managed) {
        let mut updaters: Vec<String> = managed
            .fields
            .iter()
            .filter(|(_, vs)| !vs.applied)
            .map(|(k, _)| k.clone())
            .collect();
        if updaters.len() <= MAX_UPDATE_MANAGERS {
            return;
        }
        let secs = |m: &String| managed.times.get(m).copied().flatten().unwrap_or(0);
        updaters.sort_by(|a, b| secs(a).cmp(&secs(b)).then_with(|| a.cmp(b)));
        let mut first_for_version: std::collections::BTreeMap<String, String> = Default::default();
        let mut length = updaters.len();
        for m in updaters {
            if length <= MAX_UPDATE_MANAGERS {
                break;
            }
            let Some(vs) = managed.fields.get(&m).cloned() else {
                continue;
            };
            let time = managed.times.get(&m).copied().flatten();
            let bucket =
                manager_identifier("ancient-changes", Operation::Update, &vs.api_version, "");
            match first_for_version.get(&vs.api_version) {
                Some(first) => {
                    if !managed.fields.contains_key(&bucket)
                        && let Some(s) = managed.fields.remove(first)
                    {
                        managed.fields.insert(bucket.clone(), s);
                    }
                    let union = match managed.fields.get(&bucket) {
                        Some(b) => vs.set.union(&b.set),
                        None => vs.set.clone(),
                    };
                    managed
                        .fields
                        .insert(bucket.clone(), VersionedSet { set: union, ..vs });
                    managed.fields.remove(&m);
                    length -= 1;
                    managed.times.insert(bucket, time);
                }
                None => {
                    first_for_version.insert(vs.api_version.clone(), m);
                }
            }
        }
        managed.times.retain(|k, _| managed.fields.contains_key(k));
    }

    /// lastAppliedManager: for manager "kubectl", conflicts on fields that
    /// the client-side-apply annotation holds with the live values are
    /// allowed (the apply is retried with force).
    fn apply_last_applied(
        &self,
        live: &Value,
        config: &Value,
        managed: Managed,
        manager: &str,
        force: bool,
        now: i64,
    ) -> Result<(Value, Managed), Error> {
        let res = self.apply_skip_non_applied(live, config, managed.clone(), manager, force, now);
        if manager != "kubectl" {
            return res;
        }
        let Err(Error::Conflicts(conflicts)) = &res else {
            return res;
        };
        let Some(allowed) = self.allowed_conflicts_from_last_applied(live) else {
            return res;
        };
        let conflict_set = FieldSet::from_paths(conflicts.iter().map(|c| c.path.clone()));
        if !conflict_set.difference(&allowed).is_empty() {
            let rest = conflicts
                .iter()
                .filter(|c| !allowed.has(&c.path))
                .cloned()
                .collect();
            return Err(Error::Conflicts(rest));
        }
        self.apply_skip_non_applied(live, config, managed, manager, true, now)
    }

    fn allowed_conflicts_from_last_applied(&self, live: &Value) -> Option<FieldSet> {
        let raw = live
            .pointer(&annotation_pointer())
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())?;
        typed::validate(&self.schema, live, false).ok()?;
        let last: Value = serde_json::from_str(raw).ok()?;
        if !last.is_object() || str_at(&last, "/apiVersion") != self.api_version {
            return None;
        }
        typed::validate(&self.schema, &last, false).ok()?;
        let set = typed::to_field_set(&self.schema, &last).ok()?;
        let cmp = typed::compare(&self.schema, &last, live).ok()?;
        Some(
            set.difference(&cmp.modified)
                .difference(&cmp.added)
                .difference(&cmp.removed),
        )
    }

    /// skipNonApplied: applying to an object without managedFields first
    /// records a "before-first-apply" Update owning the existing fields.
    fn apply_skip_non_applied(
        &self,
        live: &Value,
        config: &Value,
        mut managed: Managed,
        manager: &str,
        force: bool,
        now: i64,
    ) -> Result<(Value, Managed), Error> {
        if managed.fields.is_empty() {
            let empty = Self::empty_object(str_at(config, "/apiVersion"), str_at(config, "/kind"));
            managed = self
                .tracked_update(&empty, live, managed, "before-first-apply", now)
                .map_err(|e| {
                    Error::Internal(format!("failed to create manager for existing fields: {e}"))
                })?;
        }
        self.apply_tracked(live, config, managed, manager, force, now)
    }

    /// buildManagerInfo(managedFieldsUpdater(stripMeta(structuredMerge))).Apply
    fn apply_tracked(
        &self,
        live: &Value,
        config: &Value,
        mut managed: Managed,
        manager: &str,
        force: bool,
        now: i64,
    ) -> Result<(Value, Managed), Error> {
        let id = manager_identifier(
            or_unknown(manager),
            Operation::Apply,
            &self.api_version,
            &self.subresource,
        );
        let patch_version = str_at(config, "/apiVersion");
        if patch_version != self.api_version {
            return Err(Error::BadRequest(format!(
                "Incorrect version specified in apply patch. Specified patch version: {patch_version}, expected: {}",
                self.api_version
            )));
        }
        if managed_fields(config).is_some_and(|v| !v.is_null()) {
            return Err(Error::BadRequest(
                "metadata.managedFields must be nil".to_string(),
            ));
        }
        typed::validate(&self.schema, config, false).map_err(|e| {
            Error::Invalid(format!(
                "failed to create typed patch object ({}): {e}",
                Self::gvknn(config)
            ))
        })?;
        typed::validate(&self.schema, live, true).map_err(|e| {
            Error::Internal(format!(
                "failed to create typed live object ({}): {e}",
                Self::gvknn(live)
            ))
        })?;
        let (new, mut fields) =
            self.updater()
                .apply(live, config, &self.api_version, managed.fields, &id, force)?;
        self.strip_fields(&mut fields, &id);
        managed.fields = fields;
        let obj = match new {
            Some(o) => {
                managed.times.insert(id, Some(now));
                o
            }
            // No change: kube keeps the live object and the old time.
            None => live.clone(),
        };
        Ok((obj, managed))
    }
}

fn parse_now(now: &str) -> Result<i64, Error> {
    super::gojson::parse_time(now)
        .ok_or_else(|| Error::Internal(format!("invalid RFC 3339 time {now:?}")))
}

fn or_unknown(manager: &str) -> &str {
    if manager.is_empty() {
        "unknown"
    } else {
        manager
    }
}

fn str_at<'v>(v: &'v Value, pointer: &str) -> &'v str {
    v.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

/// Go's `GroupVersionKind.String()`: "group/version, Kind=kind".
fn gvk_string(obj: &Value) -> String {
    let av = str_at(obj, "/apiVersion");
    let (group, version) = match av.split_once('/') {
        Some((g, v)) => (g, v),
        None => ("", av),
    };
    format!("{group}/{version}, Kind={}", str_at(obj, "/kind"))
}

fn uid(obj: &Value) -> &str {
    str_at(obj, "/metadata/uid")
}

fn managed_fields(obj: &Value) -> Option<&Value> {
    obj.get("metadata").and_then(|m| m.get("managedFields"))
}

/// Sets (or, for `None`, removes) `metadata.managedFields`.
fn set_managed_fields(obj: &mut Value, list: Option<Value>) {
    let Value::Object(o) = obj else { return };
    match list {
        Some(l) => {
            let meta = o
                .entry("metadata")
                .or_insert_with(|| Value::Object(Map::new()));
            if let Value::Object(m) = meta {
                m.insert("managedFields".into(), l);
            }
        }
        None => {
            if let Some(Value::Object(m)) = o.get_mut("metadata") {
                m.remove("managedFields");
            }
        }
    }
}

/// kube's `isResetManagedFields`: `[]`, or one entry equal to the zero
/// ManagedFieldsEntry (`[{}]`).
fn is_reset(list: Option<&Value>) -> bool {
    match list {
        Some(Value::Array(a)) if a.is_empty() => true,
        Some(Value::Array(a)) if a.len() == 1 => match &a[0] {
            Value::Object(e) => e.values().all(|v| match v {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                _ => false,
            }),
            _ => false,
        },
        _ => false,
    }
}

fn annotation_pointer() -> String {
    format!(
        "/metadata/annotations/{}",
        LAST_APPLIED_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1")
    )
}

fn has_last_applied(obj: &Value) -> bool {
    obj.pointer(&annotation_pointer())
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
}

/// kube's `buildLastApplied`: the applied config without the annotation,
/// as `encoding/json` writes it (sorted keys, trailing newline).
fn build_last_applied(config: &Value) -> String {
    let mut c = config.clone();
    if let Some(Value::Object(a)) = c.pointer_mut("/metadata/annotations") {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
    let mut s = super::gojson::encode(&c);
    s.push('\n');
    s
}

/// kube's `SetLastApplied`: dropped again if annotations would exceed the
/// 256 KiB total limit.
fn set_last_applied(obj: &mut Value, value: String) {
    let Value::Object(o) = obj else { return };
    let meta = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(m) = meta else { return };
    let ann = m
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if !ann.is_object() {
        *ann = Value::Object(Map::new());
    }
    let Value::Object(a) = ann else { return };
    a.insert(LAST_APPLIED_ANNOTATION.to_string(), Value::String(value));
    let total: usize = a
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    if total > TOTAL_ANNOTATION_SIZE_LIMIT {
        a.remove(LAST_APPLIED_ANNOTATION);
    }
}
