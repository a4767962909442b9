//! Bodies of list responses, written while a store lends the objects one by one
//! ([`crate::store::Store::list_each`]): no reference to an object is taken, and each byte is
//! written once.
//!
//! A list's head (apiVersion, kind, and the metadata with its continue token and
//! remainingItemCount) comes first but is known only after the last item. So the items are
//! written after room left for the head, and the head goes into that room, ending where the
//! first item starts.
//!
//! A list without `limit` needs no walk to know its head (no continue token, no
//! remainingItemCount), so it is streamed ([`StreamedList`]): written a piece at a time from
//! one snapshot, each piece when the connection asks for more. A page (`limit`) is bounded by
//! its limit and written whole.

use std::{
    ops::ControlFlow,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::Bytes;
use futures::future::Either;
use http_body::Frame;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ListMeta;

use crate::render::list_buffer::{ListBody, METADATA_ROOM, STREAM_PIECE};
use crate::{
    error::{Error, Result},
    render::negotiate::{MetaVersion, Output},
    render::table::{IncludeObject, TableWriter},
    resource::ServedResource,
    store::{LendObjects, ListCursor, Object},
};

/// Every list body ends so.
const TAIL: &[u8] = b"]}";

/// `{"apiVersion":…,"kind":"<Kind>List","metadata":…,"items":[…]}` from the items' cached JSON.
pub struct JsonList {
    body: ListBody,
}

impl JsonList {
    /// An empty list; `expected`, the number of items when known, sizes the buffer.
    pub fn new(expected: Option<usize>) -> Self {
        Self {
            body: ListBody::new(METADATA_ROOM, expected),
        }
    }

    /// Appends `object`'s JSON.
    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        self.body.next_item().extend_from_slice(object.json());
    }

    fn head<K: ServedResource>(metadata: &ListMeta) -> Result<Vec<u8>> {
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"{\"apiVersion\":\"");
        head.extend_from_slice(K::group_version().as_bytes());
        head.extend_from_slice(b"\",\"kind\":\"");
        head.extend_from_slice(K::kind_name().as_bytes());
        head.extend_from_slice(b"List\",\"metadata\":");
        serde_json::to_writer(&mut head, metadata)
            .map_err(|e| Error::Internal(format!("encoding list metadata: {e}")))?;
        head.extend_from_slice(b",\"items\":[");
        Ok(head)
    }

    /// The whole `<Kind>List` with `metadata`.
    pub fn finish<K: ServedResource>(self, metadata: &ListMeta) -> Result<Bytes> {
        Ok(self.body.finish(&Self::head::<K>(metadata)?, TAIL))
    }
}

/// `{"kind":"PartialObjectMetadataList","apiVersion":"meta.k8s.io/…","metadata":…,"items":[…]}`:
/// what metadata informers (kube-controller-manager's garbage collector and quota) list. The
/// items are written as Table rows' objects are, from each object's JSON.
pub struct MetadataList {
    body: ListBody,
    version: MetaVersion,
    /// The first item that could not be encoded, reported by `finish`.
    error: Option<serde_json::Error>,
}

fn encoding_list(e: serde_json::Error) -> Error {
    Error::Internal(format!("encoding a list: {e}"))
}

impl MetadataList {
    /// An empty list in `meta.k8s.io/<version>`; `expected`, the number of items when known,
    /// sizes the buffer.
    pub fn new(version: MetaVersion, expected: Option<usize>) -> Self {
        Self {
            body: ListBody::new(METADATA_ROOM, expected),
            version,
            error: None,
        }
    }

    /// Appends `object`'s PartialObjectMetadata. An item that cannot be encoded fails
    /// [`MetadataList::finish`].
    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        let out = self.body.next_item();
        if let Err(error) = crate::render::table::write_row_object(object, self.version, out) {
            self.error.get_or_insert(error);
        }
    }

    /// The first item that could not be encoded, once.
    fn take_error(&mut self) -> Result<()> {
        self.error.take().map_or(Ok(()), |e| Err(encoding_list(e)))
    }

    fn head(&mut self, metadata: &ListMeta) -> Result<Vec<u8>> {
        self.take_error()?;
        let mut head = Vec::with_capacity(256);
        head.extend_from_slice(b"{\"kind\":\"PartialObjectMetadataList\",\"apiVersion\":\"");
        head.extend_from_slice(self.version.api_version().as_bytes());
        head.extend_from_slice(b"\",\"metadata\":");
        serde_json::to_writer(&mut head, metadata).map_err(encoding_list)?;
        head.extend_from_slice(b",\"items\":[");
        Ok(head)
    }

    /// The whole list with `metadata`; 500 when an item could not be encoded.
    pub fn finish(mut self, metadata: &ListMeta) -> Result<Bytes> {
        let head = self.head(metadata)?;
        Ok(self.body.finish(&head, TAIL))
    }
}

/// The body of a list in the output the client asked for.
pub enum ListWriter {
    /// The objects themselves, a `<Kind>List`.
    Json(JsonList),
    /// A Table, with column definitions.
    Table(TableWriter),
    /// A PartialObjectMetadataList.
    Metadata(MetadataList),
}

impl ListWriter {
    /// An empty list of `K`s shaped as `output`; `include` is the Table rows' `includeObject`,
    /// `expected` the number of items when known.
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

    /// Appends `object`.
    pub fn push<K: ServedResource>(&mut self, object: &Object<K>) {
        match self {
            Self::Json(list) => list.push(object),
            Self::Table(table) => table.push(object),
            Self::Metadata(list) => list.push(object),
        }
    }

    /// The whole body with `metadata` (a list written at once, not streamed).
    pub fn finish<K: ServedResource>(self, metadata: &ListMeta) -> Result<Bytes> {
        match self {
            Self::Json(list) => list.finish::<K>(metadata),
            Self::Table(table) => table.finish(metadata),
            Self::Metadata(list) => list.finish(metadata),
        }
    }

    /// The list's buffer, after any item that could not be encoded was reported.
    fn checked_body(&mut self) -> Result<&mut ListBody> {
        match self {
            Self::Json(list) => Ok(&mut list.body),
            Self::Table(table) => table.checked_body(),
            Self::Metadata(list) => {
                list.take_error()?;
                Ok(&mut list.body)
            }
        }
    }

    /// Whether the items written make a piece to send.
    pub fn piece_ready(&self) -> bool {
        let body = match self {
            Self::Json(list) => &list.body,
            Self::Table(table) => table.body(),
            Self::Metadata(list) => &list.body,
        };
        body.pending() >= STREAM_PIECE
    }

    /// The head and the items so far: the first piece of a streamed list.
    pub fn take_first<K: ServedResource>(&mut self, metadata: &ListMeta) -> Result<Bytes> {
        let head = match self {
            Self::Json(_) => JsonList::head::<K>(metadata)?,
            Self::Table(table) => table.head(metadata)?,
            Self::Metadata(list) => list.head(metadata)?,
        };
        Ok(self.checked_body()?.take_first(&head))
    }

    /// The items written since the last piece.
    pub fn take(&mut self) -> Result<Bytes> {
        Ok(self.checked_body()?.take())
    }

    /// The last piece of a streamed list: the last items and the list's end.
    pub fn take_last(&mut self) -> Result<Bytes> {
        Ok(self.checked_body()?.take_last(TAIL))
    }

    /// Writes the objects `objects` lends until they make a piece; true when the list goes on.
    fn poll_piece<K: ServedResource>(
        &mut self,
        cx: &mut Context<'_>,
        objects: &mut dyn LendObjects<K>,
    ) -> Poll<Result<bool>> {
        objects.poll_lend(cx, &mut |object| {
            self.push(object);
            if self.piece_ready() {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
    }
}

/// A list sent as it is written, a piece of about [`STREAM_PIECE`] bytes each time the
/// connection asks for more, from the objects of one snapshot: the response to a large
/// unlimited list is never whole in memory. (An error past the first piece can only end the
/// response early, which clients see as a truncated body, as with kube-apiserver's streamed lists.)
pub struct StreamedList<K> {
    first: Option<Bytes>,
    writer: Option<ListWriter>,
    objects: Box<dyn LendObjects<K>>,
}

impl<K: ServedResource> StreamedList<K> {
    /// Writes the list from `cursor`: the whole body when it fits in one piece, else the
    /// first piece (its head included) and a body that writes the rest as it is read.
    pub async fn start(
        mut writer: ListWriter,
        cursor: ListCursor<K>,
    ) -> Result<Either<Bytes, Self>> {
        let ListCursor { info, mut objects } = cursor;
        let more = std::future::poll_fn(|cx| writer.poll_piece(cx, objects.as_mut())).await?;
        let metadata = info.list_meta();
        if !more {
            return writer.finish::<K>(&metadata).map(Either::Left);
        }
        let first = writer.take_first::<K>(&metadata)?;
        Ok(Either::Right(Self {
            first: Some(first),
            writer: Some(writer),
            objects,
        }))
    }
}

impl<K: ServedResource> http_body::Body for StreamedList<K> {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>>>> {
        let this = &mut *self;
        if let Some(first) = this.first.take() {
            return Poll::Ready(Some(Ok(Frame::data(first))));
        }
        let Some(writer) = this.writer.as_mut() else {
            return Poll::Ready(None);
        };
        let more = match writer.poll_piece(cx, this.objects.as_mut()) {
            Poll::Pending => return Poll::Pending,
            Poll::Ready(Err(error)) => {
                this.writer = None;
                return Poll::Ready(Some(Err(error)));
            }
            Poll::Ready(Ok(more)) => more,
        };
        let piece = if more {
            writer.take()
        } else {
            let last = writer.take_last();
            this.writer = None;
            last
        };
        Poll::Ready(Some(piece.map(Frame::data)))
    }

    fn is_end_stream(&self) -> bool {
        self.first.is_none() && self.writer.is_none()
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
        render::table::PartialObjectMetadata,
        store::Stored,
        testing::{Zebra, ZebraSpec},
    };

    fn zebras(names: &[&str]) -> Vec<Object<Zebra>> {
        names
            .iter()
            .map(|name| {
                let mut zebra = Zebra::new(
                    name,
                    ZebraSpec {
                        weight: 1.5,
                        height: 0.5,
                    },
                );
                zebra.metadata.namespace = Some("default".into());
                Stored::new(zebra)
            })
            .collect()
    }

    fn parse(body: Bytes) -> Value {
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn json_lists_put_the_metadata_known_last_before_the_items() {
        let items = zebras(&["a", "b", "c"]);
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
            let body = list.finish::<Zebra>(&metadata).unwrap();
            assert!(body.starts_with(b"{\"apiVersion\":\"zoo.example.com/v1alpha\""));
            let list = parse(body);
            assert_eq!(list["kind"], "ZebraList");
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
        let items = zebras(&["a", "b"]);
        let metadata = ListMeta {
            resource_version: Some("7".into()),
            continue_: Some("x".repeat(METADATA_ROOM * 2)),
            ..Default::default()
        };
        let list = parse(json_list::<Zebra>(&items, &metadata).unwrap());
        assert_eq!(list["metadata"]["continue"].as_str().unwrap().len(), 2048);
        assert_eq!(list["items"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn metadata_lists_hold_each_objects_partial_object_metadata() {
        let items = zebras(&["a", "b"]);
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
                .finish::<Zebra>(&ListMeta::default())
                .unwrap(),
        );
        assert_eq!(list["items"], serde_json::json!([]));
        assert_eq!(list["kind"], "ZebraList");
    }

    /// Every output of an unlimited list over `store`: the body as sent (its frames) and the
    /// same list written whole.
    async fn streamed_and_whole(
        store: &crate::store::MemoryStore<Zebra>,
        request: &crate::store::ListRequest,
    ) -> Vec<(usize, Value, Value)> {
        use http_body_util::BodyExt;

        use crate::store::Store;
        let outputs = [
            Output::Json,
            Output::Table(MetaVersion::V1),
            Output::PartialObjectMetadata(MetaVersion::V1),
            Output::PartialObjectMetadata(MetaVersion::V1beta1),
        ];
        let mut results = Vec::new();
        for output in outputs {
            let writer = ListWriter::new::<Zebra>(output, IncludeObject::Metadata, None);
            let cursor = store.list_cursor(request).await.unwrap().unwrap();
            let (frames, streamed) =
                match StreamedList::start(writer, cursor).await.unwrap() {
                    Either::Left(whole) => (1, whole.to_vec()),
                    Either::Right(mut body) => {
                        let (mut sizes, mut bytes) = (Vec::new(), Vec::new());
                        while let Some(frame) = body.frame().await {
                            let data = frame.unwrap().into_data().unwrap();
                            sizes.push(data.len());
                            bytes.extend_from_slice(&data);
                        }
                        assert!(http_body::Body::is_end_stream(&body));
                        // Every piece but the last is whole HTTP/2 frames.
                        let (_, pieces) = sizes.split_last().unwrap();
                        assert!(pieces.iter().all(|n| *n >= STREAM_PIECE
                            && n % crate::render::list_buffer::FRAME_BYTES == 0));
                        (sizes.len(), bytes)
                    }
                };
            let mut whole = ListWriter::new::<Zebra>(output, IncludeObject::Metadata, None);
            let info = store
                .list_each(request, &mut |object| whole.push(object))
                .await
                .unwrap();
            let whole = whole.finish::<Zebra>(&info.list_meta()).unwrap();
            let mut streamed: Value = serde_json::from_slice(&streamed).unwrap();
            let mut whole = parse(whole);
            // A Table's Age cells may be a second apart; the rows' objects say which row it is.
            for table in [&mut streamed, &mut whole] {
                for row in table["rows"].as_array_mut().into_iter().flatten() {
                    row["cells"][3] = Value::Null;
                }
            }
            results.push((frames, streamed, whole));
        }
        results
    }

    #[tokio::test]
    async fn large_unlimited_lists_are_sent_in_pieces_that_make_the_whole_list() {
        use crate::store::{ListRequest, Store};
        let store = crate::store::MemoryStore::<Zebra>::default();
        for i in 0..2_000 {
            let zebra = crate::testing::synthetic(i);
            store
                .insert(crate::resource::VersionOf::from_stored(&zebra))
                .unwrap();
        }
        let all = ListRequest::default();
        for (frames, streamed, whole) in streamed_and_whole(&store, &all).await {
            let items = streamed.get("items").or(streamed.get("rows")).unwrap();
            assert_eq!(
                items.as_array().unwrap().len(),
                2_000,
                "{}",
                streamed["kind"]
            );
            assert!(
                frames > 2,
                "{} was sent in {frames} piece(s)",
                streamed["kind"]
            );
            assert_eq!(streamed, whole);
        }
        // One namespace (200 Zebras, about a piece), and a selector that matches nothing.
        let one_namespace = ListRequest {
            namespace: Some("bench-3".into()),
            ..Default::default()
        };
        for (_, streamed, whole) in streamed_and_whole(&store, &one_namespace).await {
            let items = streamed.get("items").or(streamed.get("rows")).unwrap();
            assert_eq!(items.as_array().unwrap().len(), 200);
            assert_eq!(streamed, whole);
        }
        let none = ListRequest {
            filter: crate::store::selector::Filter {
                labels: crate::store::selector::LabelSelector::parse("app=none").unwrap(),
                ..Default::default()
            },
            ..Default::default()
        };
        for (frames, streamed, whole) in streamed_and_whole(&store, &none).await {
            assert_eq!(frames, 1);
            assert_eq!(streamed, whole);
        }
        // A page is bounded by its limit and written whole.
        let page = ListRequest {
            limit: Some(500),
            ..Default::default()
        };
        assert!(store.list_cursor(&page).await.unwrap().is_none());
    }
}
