//! `meta.k8s.io/v1` Table: what `kubectl get` prints. No crate has these types, so they are here,
//! shaped as apimachinery's `metav1.Table`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ListMeta, ObjectMeta};
use serde::Serialize;
use serde_json::Value;

use bytes::Bytes;

use crate::{
    error::{Error, Result},
    render::list_buffer::{ListBody, METADATA_ROOM},
    render::negotiate::MetaVersion,
    resource::ServedResource,
    resource::columns::{ColumnDefinition, NAME_COLUMN},
    store::{Object, Stored},
};

/// Appends `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/<version>","metadata":{…}}`,
/// the metadata copied from the object's JSON when it is at hand, else encoded.
pub(crate) fn write_row_object<K: ServedResource>(
    object: &Stored<K>,
    version: MetaVersion,
    into: &mut Vec<u8>,
) -> serde_json::Result<()> {
    into.extend_from_slice(b"{\"kind\":\"PartialObjectMetadata\",\"apiVersion\":\"");
    into.extend_from_slice(version.api_version().as_bytes());
    into.extend_from_slice(b"\",\"metadata\":");
    match object.metadata_json() {
        Some(metadata) => into.extend_from_slice(metadata),
        None => serde_json::to_writer(&mut *into, object.meta())?,
    }
    into.push(b'}');
    Ok(())
}

/// `includeObject` on a Table request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// `None`: rows carry cells only.
    None,
    /// `Metadata` (the default): each row's object is the object's PartialObjectMetadata.
    #[default]
    Metadata,
    /// `Object`: each row's object is the whole object.
    Object,
}

/// A Table built as a value, for what is not written row by row ([`TableWriter`]): watch
/// bookmarks, tests.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Table<'a> {
    /// Always `Table`.
    pub kind: &'static str,
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`, as the client asked.
    pub api_version: &'static str,
    /// The list's resourceVersion and continue token.
    pub metadata: ListMeta,
    /// Left out on watch events after the first, as kube-apiserver does.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub column_definitions: Option<Vec<ColumnDefinition>>,
    /// One row per object, in list order.
    pub rows: Vec<TableRow<'a>>,
}

/// One object's row.
#[derive(Debug, Serialize)]
pub struct TableRow<'a> {
    /// One value per column definition, in order: the name first.
    pub cells: Vec<Value>,
    /// What `includeObject` asked for; None for `includeObject=None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub object: Option<RowObject<'a>>,
}

/// A row's object: metadata borrowed from the stored object (written straight to the output,
/// no intermediate `Value`), or the whole object for `includeObject=Object`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum RowObject<'a> {
    /// `includeObject=Metadata`.
    Metadata(PartialObjectMetadata<'a>),
    /// `includeObject=Object`: the object as JSON (the streamed writer writes it itself).
    #[cfg(test)]
    Full(Value),
}

/// `PartialObjectMetadata`, the row object kubectl reads NAMESPACE and labels from.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PartialObjectMetadata<'a> {
    /// Always `PartialObjectMetadata`.
    pub kind: &'static str,
    /// `meta.k8s.io/v1` or `meta.k8s.io/v1beta1`, as the client asked.
    pub api_version: &'static str,
    /// The object's metadata, borrowed.
    pub metadata: &'a ObjectMeta,
}

impl<'a> PartialObjectMetadata<'a> {
    /// `metadata` as `meta.k8s.io/<version>` PartialObjectMetadata.
    pub fn new(metadata: &'a ObjectMeta, version: MetaVersion) -> Self {
        Self {
            kind: "PartialObjectMetadata",
            api_version: version.api_version(),
            metadata,
        }
    }
}

/// `K`'s column definitions: NAME, then the kind's own.
pub fn columns<K: ServedResource>() -> Vec<ColumnDefinition> {
    let mut columns = vec![NAME_COLUMN];
    columns.extend(K::columns());
    columns
}

/// `object`'s row as a value, its cells as of `now`: the typed oracle the streamed writer is
/// tested against.
#[cfg(test)]
pub(crate) fn row<K: ServedResource>(
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

/// A Table of `objects` as a value, with column definitions when `with_columns`.
#[cfg(test)]
pub(crate) fn table<'a, K: ServedResource>(
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

/// A Table of stored objects written straight to JSON as the rows come ([`ListBody`]): a row
/// costs its cells and a copy of the object's metadata from its JSON; nothing is kept.
pub struct TableWriter {
    body: ListBody,
    now: jiff::Timestamp,
    include: IncludeObject,
    version: MetaVersion,
    /// The first row that could not be encoded, reported by `finish`.
    error: Option<serde_json::Error>,
    /// Room for the column definitions in the head, besides the metadata.
    columns: Vec<u8>,
}

impl TableWriter {
    /// An empty Table of `K`s, with column definitions when `with_columns`; `expected`, the
    /// number of rows when known, sizes the buffer.
    pub fn new<K: ServedResource>(
        include: IncludeObject,
        version: MetaVersion,
        with_columns: bool,
        expected: Option<usize>,
    ) -> Self {
        let mut columns = Vec::new();
        if with_columns {
            columns.extend_from_slice(b",\"columnDefinitions\":");
            // Static column definitions always encode.
            let _ = serde_json::to_writer(&mut columns, &self::columns::<K>());
        }
        Self {
            body: ListBody::new(METADATA_ROOM + columns.len(), expected),
            now: jiff::Timestamp::now(),
            include,
            version,
            error: None,
            columns,
        }
    }

    /// Appends `object`'s row. A row that cannot be encoded fails [`TableWriter::finish`].
    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        let out = self.body.next_item();
        if let Err(error) = write_row(object, self.include, self.version, self.now, out) {
            self.error.get_or_insert(error);
        }
    }

    /// The first row that could not be encoded, once.
    fn take_error(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), |e| Err(encoding_table(e)))
    }

    pub(crate) fn body(&self) -> &ListBody {
        &self.body
    }

    /// The rows' buffer, after any row that could not be encoded was reported.
    pub(crate) fn checked_body(&mut self) -> Result<&mut ListBody> {
        self.take_error()?;
        Ok(&mut self.body)
    }

    /// Kind, apiVersion, metadata and the column definitions, up to the first row.
    pub(crate) fn head(&mut self, metadata: &ListMeta) -> Result<Vec<u8>> {
        self.take_error()?;
        let mut head = Vec::with_capacity(256 + self.columns.len());
        head.extend_from_slice(b"{\"kind\":\"Table\",\"apiVersion\":\"");
        head.extend_from_slice(self.version.api_version().as_bytes());
        head.extend_from_slice(b"\",\"metadata\":");
        serde_json::to_writer(&mut head, metadata).map_err(encoding_table)?;
        head.extend_from_slice(&self.columns);
        head.extend_from_slice(b",\"rows\":[");
        Ok(head)
    }

    /// The whole Table with `metadata`; 500 when a row could not be encoded.
    pub fn finish(mut self, metadata: &ListMeta) -> Result<Bytes> {
        let head = self.head(metadata)?;
        Ok(self.body.finish(&head, b"]}"))
    }
}

fn encoding_table(e: serde_json::Error) -> Error {
    Error::Internal(format!("encoding a table: {e}"))
}

fn write_row<K: ServedResource>(
    object: &Object<K>,
    include: IncludeObject,
    version: MetaVersion,
    now: jiff::Timestamp,
    out: &mut Vec<u8>,
) -> serde_json::Result<()> {
    out.extend_from_slice(b"{\"cells\":[");
    serde_json::to_writer(&mut *out, object.meta().name.as_deref().unwrap_or(""))?;
    object.write_cells(now, out)?;
    out.push(b']');
    match include {
        IncludeObject::None => {}
        IncludeObject::Metadata => {
            out.extend_from_slice(b",\"object\":");
            write_row_object(object, version, out)?;
        }
        IncludeObject::Object => {
            out.extend_from_slice(b",\"object\":");
            out.extend_from_slice(object.json());
        }
    }
    out.push(b'}');
    Ok(())
}

/// A Table of objects already in hand.
pub fn write<K: ServedResource>(
    objects: &[Object<K>],
    metadata: &ListMeta,
    include: IncludeObject,
    version: MetaVersion,
    with_columns: bool,
) -> Result<Bytes> {
    let mut table = TableWriter::new::<K>(include, version, with_columns, Some(objects.len()));
    for object in objects {
        table.push(object);
    }
    table.finish(metadata)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing;

    #[test]
    fn rows_show_the_age_of_the_moment() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
        let now = jiff::Timestamp::now();
        let mut zebra = testing::synthetic(0);
        zebra.metadata.creation_timestamp = Some(Time(now - jiff::SignedDuration::from_secs(30)));
        let object = Stored::new(zebra);
        let row = |at: jiff::Timestamp| {
            let mut out = Vec::new();
            write_row(
                &object,
                IncludeObject::Metadata,
                MetaVersion::V1,
                at,
                &mut out,
            )
            .unwrap();
            serde_json::from_slice::<Value>(&out).unwrap()
        };
        let (first, later) = (row(now), row(now + jiff::SignedDuration::from_hours(3)));
        assert_eq!(first["cells"][3], "30s");
        assert_eq!(later["cells"][3], "3h");
        // Every other cell, and the object, as the typed row has them.
        let typed = serde_json::to_value(
            table(
                [object.get()],
                ListMeta::default(),
                IncludeObject::Metadata,
                MetaVersion::V1,
                true,
            )
            .rows,
        )
        .unwrap();
        for row in [&first, &later] {
            assert_eq!(row["object"], typed[0]["object"]);
            for cell in [0, 1, 2] {
                assert_eq!(row["cells"][cell], typed[0]["cells"][cell]);
            }
        }
        // No creation time: kubectl's "<unknown>".
        let mut unborn = testing::synthetic(1);
        unborn.metadata.creation_timestamp = None;
        let unborn = Stored::new(unborn);
        let mut out = Vec::new();
        write_row(
            &unborn,
            IncludeObject::Metadata,
            MetaVersion::V1,
            now,
            &mut out,
        )
        .unwrap();
        let unborn: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(unborn["cells"][3], "<unknown>");
    }

    #[test]
    fn written_tables_equal_the_typed_ones() {
        let objects: Vec<_> = (0..3).map(|i| Stored::new(testing::synthetic(i))).collect();
        let short = ListMeta {
            resource_version: Some("7".into()),
            ..Default::default()
        };
        // A head longer than the room left for it is written apart: the same document.
        let long = ListMeta {
            continue_: Some("x".repeat(METADATA_ROOM * 2)),
            ..short.clone()
        };
        for include in [
            IncludeObject::Metadata,
            IncludeObject::None,
            IncludeObject::Object,
        ] {
            for version in [MetaVersion::V1, MetaVersion::V1beta1] {
                for (metadata, with_columns) in [(&short, true), (&short, false), (&long, true)] {
                    let typed = table(
                        objects.iter().map(|o| o.get()),
                        metadata.clone(),
                        include,
                        version,
                        with_columns,
                    );
                    let written =
                        write(&objects, metadata, include, version, with_columns).unwrap();
                    let written: Value = serde_json::from_slice(&written).unwrap();
                    assert_eq!(
                        written,
                        serde_json::to_value(&typed).unwrap(),
                        "{include:?} {version:?} columns {with_columns}"
                    );
                    // Twice: the second time rows come from the cache.
                    let again: Value = serde_json::from_slice(
                        &write(&objects, metadata, include, version, with_columns).unwrap(),
                    )
                    .unwrap();
                    assert_eq!(again, written);
                }
            }
        }
    }
}
