//! Bodies of list responses, written while a store lends the objects one by one
//! ([`crate::store::Store::list_each`]): no reference to an object is taken, and each byte is
//! written once.
//!
//! A list's head (apiVersion, kind, and the metadata with its continue token and
//! remainingItemCount) comes first but is known only after the last item. So the items are
//! written after room left for the head, and the head goes into that room, ending where the
//! first item starts.

use bytes::{Buf, Bytes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use crate::{
    error::{Error, Result},
    negotiate::{MetaVersion, Output},
    resource::{GROUP_VERSION, ServedResource},
    store::Object,
    table::{IncludeObject, PartialObjectMetadata, TableWriter},
};

/// Room for a head beyond what the caller knows it needs up front: metadata with a continue
/// token fits in ~0.8 KB even for 253-character names. A longer head still works, at the cost
/// of copying the items once more.
pub const METADATA_ROOM: usize = 1024;

/// Items separated by commas, after room for the head.
pub struct ListBody {
    out: Vec<u8>,
    room: usize,
    /// How many items are coming, when known: the first one sizes the buffer for all.
    expected: usize,
    items: usize,
}

impl ListBody {
    pub fn new(room: usize, expected: Option<usize>) -> Self {
        let mut out = Vec::with_capacity(room + 4096);
        out.resize(room, b' ');
        Self {
            out,
            room,
            expected: expected.unwrap_or(0),
            items: 0,
        }
    }

    /// The buffer to append the next item to, its separating comma written.
    pub fn next_item(&mut self) -> &mut Vec<u8> {
        if self.items == 1 {
            // Objects of one kind are alike in size: a quarter more than the first one's
            // absorbs the spread, and a larger list grows the buffer once.
            let per_item = self.out.len() - self.room + 1;
            let rest = self.expected.saturating_sub(1);
            self.out
                .reserve(rest.saturating_mul(per_item + per_item / 4));
        }
        if self.items > 0 {
            self.out.push(b',');
        }
        self.items += 1;
        &mut self.out
    }

    /// `head`, the items, then `tail`.
    pub fn finish(self, head: &[u8], tail: &[u8]) -> Bytes {
        let mut out = self.out;
        out.extend_from_slice(tail);
        let Some(start) = self.room.checked_sub(head.len()) else {
            let mut whole = Vec::with_capacity(head.len() + out.len() - self.room);
            whole.extend_from_slice(head);
            whole.extend_from_slice(&out[self.room..]);
            return Bytes::from(whole);
        };
        out[start..self.room].copy_from_slice(head);
        let mut body = Bytes::from(out);
        body.advance(start);
        body
    }
}

/// `{"apiVersion":…,"kind":"<Kind>List","metadata":…,"items":[…]}` from the items' cached JSON.
pub struct JsonList {
    body: ListBody,
}

impl JsonList {
    pub fn new(expected: Option<usize>) -> Self {
        Self {
            body: ListBody::new(METADATA_ROOM, expected),
        }
    }

    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        self.body.next_item().extend_from_slice(object.json());
    }

    pub fn finish<K: ServedResource>(self, metadata: &ListMeta) -> Result<Bytes> {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"{\"apiVersion\":\"");
        head.extend_from_slice(GROUP_VERSION.as_bytes());
        head.extend_from_slice(b"\",\"kind\":\"");
        head.extend_from_slice(K::kind_name().as_bytes());
        head.extend_from_slice(b"List\",\"metadata\":");
        serde_json::to_writer(&mut head, metadata)
            .map_err(|e| Error::Internal(format!("encoding list metadata: {e}")))?;
        head.extend_from_slice(b",\"items\":[");
        Ok(self.body.finish(&head, b"]}"))
    }
}

/// `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/…","metadata":…,"items":[…]}`:
/// what metadata informers (kube-controller-manager's garbage collector and quota) list. The v1
/// items are the objects' cached PartialObjectMetadata, as in Table rows.
pub struct MetadataList {
    body: ListBody,
    version: MetaVersion,
    /// The first item that could not be encoded, reported by `finish`.
    error: Option<serde_json::Error>,
}

impl MetadataList {
    pub fn new(version: MetaVersion, expected: Option<usize>) -> Self {
        Self {
            body: ListBody::new(METADATA_ROOM, expected),
            version,
            error: None,
        }
    }

    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        let out = self.body.next_item();
        if self.version == MetaVersion::V1 {
            out.extend_from_slice(object.row_object_v1());
            return;
        }
        let item = PartialObjectMetadata::new(object.meta(), self.version);
        if let Err(error) = serde_json::to_writer(out, &item) {
            self.error.get_or_insert(error);
        }
    }

    pub fn finish(self, metadata: &ListMeta) -> Result<Bytes> {
        let encoding = |e: serde_json::Error| Error::Internal(format!("encoding a list: {e}"));
        if let Some(error) = self.error {
            return Err(encoding(error));
        }
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"");
        head.extend_from_slice(self.version.api_version().as_bytes());
        head.extend_from_slice(b"\",\"metadata\":");
        serde_json::to_writer(&mut head, metadata).map_err(encoding)?;
        head.extend_from_slice(b",\"items\":[");
        Ok(self.body.finish(&head, b"]}"))
    }
}

/// The body of a list in the output the client asked for.
pub enum ListWriter {
    Json(JsonList),
    Table(TableWriter),
    Metadata(MetadataList),
}

impl ListWriter {
    pub fn new<K: ServedResource>(
        output: Output,
        include: IncludeObject,
        expected: Option<usize>,
    ) -> Self {
        match output {
            Output::Json => Self::Json(JsonList::new(expected)),
            Output::Table(version) => {
                Self::Table(TableWriter::new::<K>(include, version, true, expected))
            }
            Output::PartialObjectMetadata(version) => {
                Self::Metadata(MetadataList::new(version, expected))
            }
        }
    }

    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        match self {
            Self::Json(list) => list.push(object),
            Self::Table(table) => table.push(object),
            Self::Metadata(list) => list.push(object),
        }
    }

    pub fn finish<K: ServedResource>(self, metadata: &ListMeta) -> Result<Bytes> {
        match self {
            Self::Json(list) => list.finish::<K>(metadata),
            Self::Table(table) => table.finish(metadata),
            Self::Metadata(list) => list.finish(metadata),
        }
    }
}

/// A JSON list of objects already in hand (a deletecollection's).
pub fn json_list<K: ServedResource>(items: &[Object<K>], metadata: &ListMeta) -> Result<Bytes> {
    let mut list = JsonList::new(Some(items.len()));
    for item in items {
        list.push(item);
    }
    list.finish::<K>(metadata)
}

#[cfg(test)]
mod tests {
    use kube::Resource;
    use serde_json::Value;

    use super::*;
    use crate::{
        resources::llama::{Llama, LlamaSpec},
        store::Stored,
    };

    fn llamas(names: &[&str]) -> Vec<Object<Llama>> {
        names
            .iter()
            .map(|name| {
                let mut llama = Llama::new(
                    name,
                    LlamaSpec {
                        weight: 1.5,
                        height: 0.5,
                    },
                );
                llama.metadata.namespace = Some("default".into());
                Stored::new(llama)
            })
            .collect()
    }

    fn parse(body: Bytes) -> Value {
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn json_lists_put_the_metadata_known_last_before_the_items() {
        let items = llamas(&["a", "b", "c"]);
        let metadata = ListMeta {
            resource_version: Some("7".into()),
            continue_: Some("token".into()),
            remaining_item_count: Some(4),
            ..Default::default()
        };
        // Fewer items than expected, more than expected, and unknown: the same document.
        for expected in [Some(100), Some(1), None] {
            let mut list = JsonList::new(expected);
            for item in &items {
                list.push(item);
            }
            let body = list.finish::<Llama>(&metadata).unwrap();
            assert!(body.starts_with(b"{\"apiVersion\":\"farm.example.com/v1alpha\""));
            let list = parse(body);
            assert_eq!(list["kind"], "LlamaList");
            assert_eq!(list["metadata"]["resourceVersion"], "7");
            assert_eq!(list["metadata"]["continue"], "token");
            assert_eq!(list["metadata"]["remainingItemCount"], 4);
            let names: Vec<_> = list["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["metadata"]["name"].as_str().unwrap())
                .collect();
            assert_eq!(names, ["a", "b", "c"]);
            assert_eq!(list["items"][1]["spec"]["weight"], 1.5);
        }
    }

    #[test]
    fn a_json_list_with_a_head_larger_than_its_room_is_still_whole() {
        let items = llamas(&["a", "b"]);
        let metadata = ListMeta {
            resource_version: Some("7".into()),
            continue_: Some("x".repeat(METADATA_ROOM * 2)),
            ..Default::default()
        };
        let list = parse(json_list::<Llama>(&items, &metadata).unwrap());
        assert_eq!(list["metadata"]["continue"].as_str().unwrap().len(), 2048);
        assert_eq!(list["items"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn metadata_lists_hold_each_objects_partial_object_metadata() {
        let items = llamas(&["a", "b"]);
        let metadata = ListMeta {
            resource_version: Some("7".into()),
            ..Default::default()
        };
        for version in [MetaVersion::V1, MetaVersion::V1beta1] {
            let mut list = MetadataList::new(version, Some(items.len()));
            for item in &items {
                list.push(item);
            }
            let list = parse(list.finish(&metadata).unwrap());
            assert_eq!(list["kind"], "PartialObjectMetadataList");
            assert_eq!(list["apiVersion"], version.api_version());
            assert_eq!(list["metadata"]["resourceVersion"], "7");
            for (item, object) in list["items"].as_array().unwrap().iter().zip(&items) {
                let expected = PartialObjectMetadata::new(object.meta(), version);
                assert_eq!(item, &serde_json::to_value(&expected).unwrap());
            }
            assert_eq!(list["items"].as_array().unwrap().len(), 2);
        }
    }

    #[test]
    fn an_empty_json_list_has_empty_items() {
        let list = parse(
            JsonList::new(Some(0))
                .finish::<Llama>(&ListMeta::default())
                .unwrap(),
        );
        assert_eq!(list["items"], serde_json::json!([]));
        assert_eq!(list["kind"], "LlamaList");
    }
}
