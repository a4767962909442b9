//! An object's top-level fields as JSON, only those asked for: what a ValidatingAdmissionPolicy
//! reading `object.spec.weight` needs is `spec`, not `metadata.managedFields`. The other
//! fields are skipped before they are serialized.

use serde::{
    Serialize,
    ser::{self, Impossible},
};
use serde_json::{Map, Value};

/// `object` as JSON with only its top-level `fields` (all of them when None). An object that
/// does not serialize as a struct or a map is converted whole.
pub(crate) fn to_json_fields<T: Serialize>(
    object: &T,
    fields: Option<&[String]>,
) -> serde_json::Result<Value> {
    match fields {
        None => serde_json::to_value(object),
        Some(fields) => object
            .serialize(Top { fields })
            .or_else(|_| serde_json::to_value(object)),
    }
}

/// Serializes the top level only: a struct or a map, keeping `fields`.
struct Top<'f> {
    fields: &'f [String],
}

/// The kept fields, as they are serialized.
struct Kept<'f> {
    fields: &'f [String],
    map: Map<String, Value>,
    /// A map's key whose value is to be kept.
    key: Option<String>,
}

impl Kept<'_> {
    fn keeps(&self, key: &str) -> bool {
        self.fields.iter().any(|f| f == key)
    }
}

fn not_an_object() -> serde_json::Error {
    ser::Error::custom("not an object")
}

impl<'f> ser::Serializer for Top<'f> {
    type Ok = Value;
    type Error = serde_json::Error;
    type SerializeSeq = Impossible<Value, serde_json::Error>;
    type SerializeTuple = Impossible<Value, serde_json::Error>;
    type SerializeTupleStruct = Impossible<Value, serde_json::Error>;
    type SerializeTupleVariant = Impossible<Value, serde_json::Error>;
    type SerializeMap = Kept<'f>;
    type SerializeStruct = Kept<'f>;
    type SerializeStructVariant = Impossible<Value, serde_json::Error>;

    fn serialize_struct(self, _: &'static str, _: usize) -> serde_json::Result<Kept<'f>> {
        Ok(Kept {
            fields: self.fields,
            map: Map::new(),
            key: None,
        })
    }

    fn serialize_map(self, _: Option<usize>) -> serde_json::Result<Kept<'f>> {
        self.serialize_struct("", 0)
    }

    fn serialize_bool(self, _: bool) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_i8(self, _: i8) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_i16(self, _: i16) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_i32(self, _: i32) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_i64(self, _: i64) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_u8(self, _: u8) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_u16(self, _: u16) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_u32(self, _: u32) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_u64(self, _: u64) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_f32(self, _: f32) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_f64(self, _: f64) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_char(self, _: char) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_str(self, _: &str) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_bytes(self, _: &[u8]) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_none(self) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_some<V: ?Sized + Serialize>(self, _: &V) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_unit(self) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_unit_struct(self, _: &'static str) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_unit_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
    ) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_newtype_struct<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: &V,
    ) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_newtype_variant<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> serde_json::Result<Value> {
        Err(not_an_object())
    }
    fn serialize_seq(self, _: Option<usize>) -> serde_json::Result<Self::SerializeSeq> {
        Err(not_an_object())
    }
    fn serialize_tuple(self, _: usize) -> serde_json::Result<Self::SerializeTuple> {
        Err(not_an_object())
    }
    fn serialize_tuple_struct(
        self,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeTupleStruct> {
        Err(not_an_object())
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeTupleVariant> {
        Err(not_an_object())
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> serde_json::Result<Self::SerializeStructVariant> {
        Err(not_an_object())
    }
}

impl ser::SerializeStruct for Kept<'_> {
    type Ok = Value;
    type Error = serde_json::Error;

    fn serialize_field<V: ?Sized + Serialize>(
        &mut self,
        key: &'static str,
        value: &V,
    ) -> serde_json::Result<()> {
        if self.keeps(key) {
            self.map
                .insert(key.to_owned(), serde_json::to_value(value)?);
        }
        Ok(())
    }

    fn end(self) -> serde_json::Result<Value> {
        Ok(Value::Object(self.map))
    }
}

impl ser::SerializeMap for Kept<'_> {
    type Ok = Value;
    type Error = serde_json::Error;

    fn serialize_key<V: ?Sized + Serialize>(&mut self, key: &V) -> serde_json::Result<()> {
        // JSON keys are strings; anything else makes the caller convert the object whole.
        let Value::String(key) = serde_json::to_value(key)? else {
            return Err(not_an_object());
        };
        self.key = self.keeps(&key).then_some(key);
        Ok(())
    }

    fn serialize_value<V: ?Sized + Serialize>(&mut self, value: &V) -> serde_json::Result<()> {
        if let Some(key) = self.key.take() {
            self.map.insert(key, serde_json::to_value(value)?);
        }
        Ok(())
    }

    fn end(self) -> serde_json::Result<Value> {
        Ok(Value::Object(self.map))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;
    use crate::testing::{Zebra, ZebraSpec};

    fn zebra() -> Zebra {
        let mut zebra = Zebra::new(
            "dolly",
            ZebraSpec {
                weight: 90.0,
                height: 1.2,
            },
        );
        zebra.metadata.namespace = Some("farm".into());
        zebra.metadata.labels = Some(BTreeMap::from([("a".into(), "b".into())]));
        zebra
    }

    #[test]
    fn only_the_fields_asked_for_are_kept() {
        let whole = serde_json::to_value(zebra()).unwrap();
        let fields = ["spec".to_owned(), "metadata".to_owned()];
        assert_eq!(
            to_json_fields(&zebra(), Some(&fields[..1])).unwrap(),
            json!({"spec": whole["spec"]})
        );
        assert_eq!(
            to_json_fields(&zebra(), Some(&fields)).unwrap(),
            json!({"spec": whole["spec"], "metadata": whole["metadata"]})
        );
        assert_eq!(to_json_fields(&zebra(), Some(&[])).unwrap(), json!({}));
        assert_eq!(to_json_fields(&zebra(), None).unwrap(), whole);
    }

    #[test]
    fn maps_are_filtered_and_other_shapes_converted_whole() {
        let map = BTreeMap::from([("spec", 1), ("status", 2)]);
        let spec = ["spec".to_owned()];
        assert_eq!(
            to_json_fields(&map, Some(&spec)).unwrap(),
            json!({"spec": 1})
        );
        // A flattened struct serializes as a map.
        #[derive(Serialize)]
        struct Flat {
            kind: &'static str,
            #[serde(flatten)]
            rest: BTreeMap<&'static str, i32>,
        }
        let flat = Flat {
            kind: "Zebra",
            rest: BTreeMap::from([("spec", 3), ("status", 4)]),
        };
        assert_eq!(
            to_json_fields(&flat, Some(&spec)).unwrap(),
            json!({"spec": 3})
        );
        assert_eq!(to_json_fields(&[1, 2], Some(&spec)).unwrap(), json!([1, 2]));
        assert_eq!(to_json_fields(&"text", Some(&spec)).unwrap(), json!("text"));
    }

    proptest! {
        /// Whatever is asked for, each kept field is the whole conversion's, and nothing else.
        #[test]
        fn kept_fields_are_the_whole_conversions(
            asked in proptest::collection::vec(
                prop_oneof![
                    Just("spec".to_owned()),
                    Just("metadata".to_owned()),
                    Just("kind".to_owned()),
                    Just("apiVersion".to_owned()),
                    Just("status".to_owned()),
                    "[a-z]{1,6}",
                ],
                0..5,
            ),
            weight in -1e6f64..1e6,
        ) {
            let mut object = zebra();
            object.spec.weight = weight;
            let whole = serde_json::to_value(&object).unwrap();
            let kept = to_json_fields(&object, Some(&asked)).unwrap();
            let kept = kept.as_object().unwrap();
            for (key, value) in whole.as_object().unwrap() {
                if asked.contains(key) {
                    prop_assert_eq!(kept.get(key), Some(value));
                } else {
                    prop_assert!(!kept.contains_key(key));
                }
            }
            prop_assert!(kept.keys().all(|k| whole.get(k).is_some()));
        }
    }
}
