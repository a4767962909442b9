//! `meta.k8s.io/v1` Table: what `kubectl get` prints. No crate has these types, so they are here,
//! shaped as apimachinery's `metav1.Table`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use serde::Serialize;
use serde_json::Value;

use crate::{negotiate::MetaVersion, resource::ServedResource};

#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ColumnDefinition {
    pub name: &'static str,
    #[serde(rename = "type")]
    pub type_: &'static str,
    pub format: &'static str,
    pub description: &'static str,
    pub priority: i32,
}

impl ColumnDefinition {
    pub const fn new(name: &'static str, type_: &'static str, description: &'static str) -> Self {
        Self {
            name,
            type_,
            format: "",
            description,
            priority: 0,
        }
    }

    pub const fn format(mut self, format: &'static str) -> Self {
        self.format = format;
        self
    }

    /// Shown only with `kubectl get -o wide`.
    pub const fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
}

pub const NAME_COLUMN: ColumnDefinition = ColumnDefinition::new(
    "Name",
    "string",
    "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
)
.format("name");

pub const AGE_COLUMN: ColumnDefinition = ColumnDefinition::new(
    "Age",
    "date",
    "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.",
);

/// `includeObject` on a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    None,
    #[default]
    Metadata,
    Object,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Table<'a> {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: ListMeta,
    /// Left out on watch events after the first, as kube-apiserver does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column_definitions: Option<Vec<ColumnDefinition>>,
    pub rows: Vec<TableRow<'a>>,
}

#[derive(Debug, Serialize)]
pub struct TableRow<'a> {
    pub cells: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<RowObject<'a>>,
}

/// A row's object: metadata borrowed from the stored object (written straight to the output,
/// no intermediate `Value`), or the whole object for `includeObject=Object`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum RowObject<'a> {
    Metadata(PartialObjectMetadata<'a>),
    Full(Value),
}

/// `PartialObjectMetadata`, the row object kubectl reads NAMESPACE and labels from.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadata<'a> {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: &'a ObjectMeta,
}

impl<'a> PartialObjectMetadata<'a> {
    pub fn new(metadata: &'a ObjectMeta, version: MetaVersion) -> Self {
        Self {
            kind: "PartialObjectMetadata",
            api_version: version.api_version(),
            metadata,
        }
    }
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadataList<'a> {
    pub kind: &'static str,
    pub api_version: &'static str,
    pub metadata: ListMeta,
    pub items: Vec<PartialObjectMetadata<'a>>,
}

pub fn columns<K: ServedResource>() -> Vec<ColumnDefinition> {
    let mut columns = vec![NAME_COLUMN];
    columns.extend(K::columns());
    columns
}

pub fn row<K: ServedResource>(
    object: &K,
    include: IncludeObject,
    version: MetaVersion,
    now: jiff::Timestamp,
) -> TableRow<'_> {
    let meta = object.meta();
    let mut cells = vec![Value::String(meta.name.clone().unwrap_or_default())];
    cells.extend(object.cells(now));
    let object = match include {
        IncludeObject::None => None,
        IncludeObject::Metadata => Some(RowObject::Metadata(PartialObjectMetadata::new(
            meta, version,
        ))),
        IncludeObject::Object => serde_json::to_value(object).ok().map(RowObject::Full),
    };
    TableRow { cells, object }
}

pub fn table<'a, K: ServedResource>(
    objects: impl IntoIterator<Item = &'a K>,
    metadata: ListMeta,
    include: IncludeObject,
    version: MetaVersion,
    with_columns: bool,
) -> Table<'a> {
    let now = jiff::Timestamp::now();
    Table {
        kind: "Table",
        api_version: version.api_version(),
        metadata,
        column_definitions: with_columns.then(columns::<K>),
        rows: objects
            .into_iter()
            .map(|o| row(o, include, version, now))
            .collect(),
    }
}

/// Writes a Table of stored objects straight to JSON bytes: row objects come from each object's
/// cached PartialObjectMetadata, so a row costs its cells (Age changes by the second).
pub fn write<K: ServedResource>(
    objects: &[crate::store::Object<K>],
    metadata: &ListMeta,
    include: IncludeObject,
    version: MetaVersion,
    with_columns: bool,
) -> serde_json::Result<Vec<u8>> {
    let now = jiff::Timestamp::now();
    let mut out = Vec::with_capacity(256 + objects.len() * 320);
    out.extend_from_slice(b"{\"kind\":\"Table\",\"apiVersion\":\"");
    out.extend_from_slice(version.api_version().as_bytes());
    out.extend_from_slice(b"\",\"metadata\":");
    serde_json::to_writer(&mut out, metadata)?;
    if with_columns {
        out.extend_from_slice(b",\"columnDefinitions\":");
        serde_json::to_writer(&mut out, &columns::<K>())?;
    }
    out.extend_from_slice(b",\"rows\":[");
    for (i, object) in objects.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        if (include, version) == (IncludeObject::Metadata, MetaVersion::V1) {
            // What kubectl asks for: the cached row.
            object.write_table_row_v1(now, &mut out);
            continue;
        }
        out.extend_from_slice(b"{\"cells\":[");
        serde_json::to_writer(&mut out, object.meta().name.as_deref().unwrap_or(""))?;
        for cell in object.cells(now) {
            out.push(b',');
            serde_json::to_writer(&mut out, &cell)?;
        }
        out.push(b']');
        match (include, version) {
            (IncludeObject::None, _) => {}
            (IncludeObject::Metadata, MetaVersion::V1) => {
                out.extend_from_slice(b",\"object\":");
                out.extend_from_slice(object.row_object_v1());
            }
            (IncludeObject::Metadata, _) => {
                out.extend_from_slice(b",\"object\":");
                serde_json::to_writer(
                    &mut out,
                    &PartialObjectMetadata::new(object.meta(), version),
                )?;
            }
            (IncludeObject::Object, _) => {
                out.extend_from_slice(b",\"object\":");
                out.extend_from_slice(object.json());
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    Ok(out)
}

/// The Age cell: apimachinery's `duration.HumanDuration` of the time since creation.
pub fn age(meta: &ObjectMeta, now: jiff::Timestamp) -> Value {
    match &meta.creation_timestamp {
        Some(created) => {
            let seconds = now.as_second() - created.0.as_second();
            Value::String(human_duration(seconds))
        }
        None => Value::String("<unknown>".into()),
    }
}

/// apimachinery `util/duration.HumanDuration`, to the letter.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 {
            format!("{minutes}m")
        } else {
            format!("{minutes}m{s}s")
        };
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 {
            format!("{hours}h")
        } else {
            format!("{hours}h{m}m")
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 {
            format!("{}d", hours / 24)
        } else {
            format!("{}d{h}h", hours / 24)
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{dy}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{resources::llama, store::Stored};

    #[test]
    fn written_tables_equal_the_typed_ones() {
        let objects: Vec<_> = (0..3).map(|i| Stored::new(llama::synthetic(i))).collect();
        let metadata = ListMeta {
            resource_version: Some("7".into()),
            ..Default::default()
        };
        for include in [
            IncludeObject::Metadata,
            IncludeObject::None,
            IncludeObject::Object,
        ] {
            for version in [MetaVersion::V1, MetaVersion::V1beta1] {
                let typed = table(
                    objects.iter().map(|o| o.get()),
                    metadata.clone(),
                    include,
                    version,
                    true,
                );
                let written = write(&objects, &metadata, include, version, true).unwrap();
                let written: Value = serde_json::from_slice(&written).unwrap();
                assert_eq!(
                    written,
                    serde_json::to_value(&typed).unwrap(),
                    "{include:?} {version:?}"
                );
                // Twice: the second time rows come from the cache.
                let again: Value = serde_json::from_slice(
                    &write(&objects, &metadata, include, version, true).unwrap(),
                )
                .unwrap();
                assert_eq!(again, written);
            }
        }
    }

    #[test]
    fn ages_read_like_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (185, "3m5s"),
            (600, "10m"),
            (3 * 3600 + 5 * 60, "3h5m"),
            (8 * 3600, "8h"),
            (50 * 3600, "2d2h"),
            (10 * 86400, "10d"),
            (3 * 365 * 86400, "3y"),
            (3 * 365 * 86400 + 86400 * 4, "3y4d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (seconds, want) in cases {
            assert_eq!(human_duration(seconds), want, "{seconds}s");
        }
    }
}
