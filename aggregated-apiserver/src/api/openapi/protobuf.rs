//! The OpenAPI v2 document as protobuf (`application/com.github.proto-openapi.spec.v2@v1.0+protobuf`),
//! as kube-apiserver serves it: client-go's `OpenAPISchema` (kubectl's validation and apply of a
//! kind without a PATCH path) asks for nothing else.
//!
//! The messages are gnostic's `openapi.v2` (google/gnostic-models, `openapiv2/OpenAPIv2.proto`):
//! the subset the documents of [`super::v2`] use, with gnostic's field numbers and types, written
//! with prost's derive (fields of a message that are not declared are never sent). Values that
//! are not a schema (vendor extensions, defaults, enums) travel as gnostic's `Any` with YAML
//! text; JSON is YAML.

use prost::Message;
use serde_json::{Map, Value};

#[derive(Clone, PartialEq, Message)]
pub struct Document {
    #[prost(string, tag = "1")]
    pub swagger: String,
    #[prost(message, optional, tag = "2")]
    pub info: Option<Info>,
    #[prost(string, repeated, tag = "6")]
    pub consumes: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub produces: Vec<String>,
    #[prost(message, optional, tag = "8")]
    pub paths: Option<Paths>,
    #[prost(message, optional, tag = "9")]
    pub definitions: Option<Definitions>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Info {
    #[prost(string, tag = "1")]
    pub title: String,
    #[prost(string, tag = "2")]
    pub version: String,
}

#[derive(Clone, PartialEq, Message)]
pub struct Paths {
    #[prost(message, repeated, tag = "2")]
    pub path: Vec<NamedPathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedPathItem {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<PathItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct PathItem {
    #[prost(message, optional, tag = "2")]
    pub get: Option<Operation>,
    #[prost(message, optional, tag = "3")]
    pub put: Option<Operation>,
    #[prost(message, optional, tag = "4")]
    pub post: Option<Operation>,
    #[prost(message, optional, tag = "5")]
    pub delete: Option<Operation>,
    #[prost(message, optional, tag = "8")]
    pub patch: Option<Operation>,
    #[prost(message, repeated, tag = "9")]
    pub parameters: Vec<ParametersItem>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Operation {
    #[prost(string, repeated, tag = "1")]
    pub tags: Vec<String>,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "5")]
    pub operation_id: String,
    #[prost(string, repeated, tag = "6")]
    pub produces: Vec<String>,
    #[prost(string, repeated, tag = "7")]
    pub consumes: Vec<String>,
    #[prost(message, repeated, tag = "8")]
    pub parameters: Vec<ParametersItem>,
    #[prost(message, optional, tag = "9")]
    pub responses: Option<Responses>,
    #[prost(string, repeated, tag = "10")]
    pub schemes: Vec<String>,
    #[prost(message, repeated, tag = "13")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `ParametersItem`'s oneof: only parameters here, no JSON references.
#[derive(Clone, PartialEq, Message)]
pub struct ParametersItem {
    #[prost(message, optional, tag = "1")]
    pub parameter: Option<Parameter>,
}

/// `Parameter`'s oneof `{ BodyParameter = 1; NonBodyParameter = 2 }`.
#[derive(Clone, PartialEq, Message)]
pub struct Parameter {
    #[prost(message, optional, tag = "1")]
    pub body_parameter: Option<BodyParameter>,
    #[prost(message, optional, tag = "2")]
    pub non_body_parameter: Option<NonBodyParameter>,
}

#[derive(Clone, PartialEq, Message)]
pub struct BodyParameter {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(string, tag = "2")]
    pub name: String,
    #[prost(string, tag = "3")]
    pub r#in: String,
    #[prost(bool, tag = "4")]
    pub required: bool,
    #[prost(message, optional, tag = "5")]
    pub schema: Option<Schema>,
}

/// `NonBodyParameter`'s oneof: query (3) and path (4) parameters, the two the documents have.
#[derive(Clone, PartialEq, Message)]
pub struct NonBodyParameter {
    #[prost(message, optional, tag = "3")]
    pub query_parameter_sub_schema: Option<SimpleParameter>,
    #[prost(message, optional, tag = "4")]
    pub path_parameter_sub_schema: Option<PathParameter>,
}

/// `QueryParameterSubSchema`, the fields the documents use.
#[derive(Clone, PartialEq, Message)]
pub struct SimpleParameter {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(bool, tag = "5")]
    pub allow_empty_value: bool,
    #[prost(string, tag = "6")]
    pub r#type: String,
    #[prost(string, tag = "7")]
    pub format: String,
    #[prost(bool, tag = "20")]
    pub unique_items: bool,
}

/// `PathParameterSubSchema`, the fields the documents use (its numbers differ from a query
/// parameter's).
#[derive(Clone, PartialEq, Message)]
pub struct PathParameter {
    #[prost(bool, tag = "1")]
    pub required: bool,
    #[prost(string, tag = "2")]
    pub r#in: String,
    #[prost(string, tag = "3")]
    pub description: String,
    #[prost(string, tag = "4")]
    pub name: String,
    #[prost(string, tag = "5")]
    pub r#type: String,
    #[prost(bool, tag = "19")]
    pub unique_items: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Responses {
    #[prost(message, repeated, tag = "1")]
    pub response_code: Vec<NamedResponseValue>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedResponseValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<ResponseValue>,
}

/// `ResponseValue`'s oneof: responses, no JSON references.
#[derive(Clone, PartialEq, Message)]
pub struct ResponseValue {
    #[prost(message, optional, tag = "1")]
    pub response: Option<Response>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Response {
    #[prost(string, tag = "1")]
    pub description: String,
    #[prost(message, optional, tag = "2")]
    pub schema: Option<SchemaItem>,
}

/// `SchemaItem`'s oneof: a schema (no file schemas).
#[derive(Clone, PartialEq, Message)]
pub struct SchemaItem {
    #[prost(message, optional, tag = "1")]
    pub schema: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Definitions {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedSchema {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Schema {
    #[prost(string, tag = "1")]
    pub r#ref: String,
    #[prost(string, tag = "2")]
    pub format: String,
    #[prost(string, tag = "3")]
    pub title: String,
    #[prost(string, tag = "4")]
    pub description: String,
    #[prost(message, optional, tag = "5")]
    pub default: Option<Any>,
    #[prost(double, tag = "7")]
    pub maximum: f64,
    #[prost(double, tag = "9")]
    pub minimum: f64,
    #[prost(int64, tag = "11")]
    pub max_length: i64,
    #[prost(int64, tag = "12")]
    pub min_length: i64,
    #[prost(string, tag = "13")]
    pub pattern: String,
    #[prost(int64, tag = "14")]
    pub max_items: i64,
    #[prost(int64, tag = "15")]
    pub min_items: i64,
    #[prost(bool, tag = "16")]
    pub unique_items: bool,
    #[prost(string, repeated, tag = "19")]
    pub required: Vec<String>,
    #[prost(message, repeated, tag = "20")]
    pub r#enum: Vec<Any>,
    #[prost(message, optional, tag = "21")]
    pub additional_properties: Option<AdditionalPropertiesItem>,
    #[prost(message, optional, tag = "22")]
    pub r#type: Option<TypeItem>,
    #[prost(message, optional, tag = "23")]
    pub items: Option<ItemsItem>,
    #[prost(message, repeated, tag = "24")]
    pub all_of: Vec<Schema>,
    #[prost(message, optional, tag = "25")]
    pub properties: Option<Properties>,
    #[prost(bool, tag = "27")]
    pub read_only: bool,
    #[prost(message, repeated, tag = "31")]
    pub vendor_extension: Vec<NamedAny>,
}

/// `AdditionalPropertiesItem`'s oneof `{ Schema schema = 1; bool boolean = 2 }`.
#[derive(Clone, PartialEq, Message)]
pub struct AdditionalPropertiesItem {
    #[prost(oneof = "AdditionalProperties", tags = "1, 2")]
    pub oneof: Option<AdditionalProperties>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub enum AdditionalProperties {
    #[prost(message, boxed, tag = "1")]
    Schema(Box<Schema>),
    #[prost(bool, tag = "2")]
    Boolean(bool),
}

#[derive(Clone, PartialEq, Message)]
pub struct TypeItem {
    #[prost(string, repeated, tag = "1")]
    pub value: Vec<String>,
}

#[derive(Clone, PartialEq, Message)]
pub struct ItemsItem {
    #[prost(message, repeated, tag = "1")]
    pub schema: Vec<Schema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Properties {
    #[prost(message, repeated, tag = "1")]
    pub additional_properties: Vec<NamedSchema>,
}

#[derive(Clone, PartialEq, Message)]
pub struct NamedAny {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, optional, tag = "2")]
    pub value: Option<Any>,
}

/// gnostic's `Any`: the value as YAML text (field 2; field 1, a `google.protobuf.Any`, unused).
#[derive(Clone, PartialEq, Message)]
pub struct Any {
    #[prost(string, tag = "2")]
    pub yaml: String,
}

fn any(value: &Value) -> Any {
    Any {
        yaml: value.to_string(),
    }
}

fn text(map: &Map<String, Value>, key: &str) -> String {
    map.get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn strings(map: &Map<String, Value>, key: &str) -> Vec<String> {
    map.get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_owned)
        .collect()
}

fn vendor_extensions(map: &Map<String, Value>) -> Vec<NamedAny> {
    map.iter()
        .filter(|(key, _)| key.starts_with("x-"))
        .map(|(name, value)| NamedAny {
            name: name.clone(),
            value: Some(any(value)),
        })
        .collect()
}

fn named_schemas(map: Option<&Value>) -> Vec<NamedSchema> {
    map.and_then(Value::as_object)
        .into_iter()
        .flatten()
        .map(|(name, value)| NamedSchema {
            name: name.clone(),
            value: Some(schema(value)),
        })
        .collect()
}

/// A JSON schema of the v2 document as gnostic's `Schema`.
fn schema(value: &Value) -> Schema {
    let empty = Map::new();
    let map = value.as_object().unwrap_or(&empty);
    let int = |key: &str| map.get(key).and_then(Value::as_i64).unwrap_or_default();
    let float = |key: &str| map.get(key).and_then(Value::as_f64).unwrap_or_default();
    Schema {
        r#ref: text(map, "$ref"),
        format: text(map, "format"),
        title: text(map, "title"),
        description: text(map, "description"),
        default: map.get("default").map(any),
        maximum: float("maximum"),
        minimum: float("minimum"),
        max_length: int("maxLength"),
        min_length: int("minLength"),
        pattern: text(map, "pattern"),
        max_items: int("maxItems"),
        min_items: int("minItems"),
        unique_items: map.get("uniqueItems").and_then(Value::as_bool) == Some(true),
        required: strings(map, "required"),
        r#enum: map
            .get("enum")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(any)
            .collect(),
        additional_properties: map
            .get("additionalProperties")
            .map(|a| AdditionalPropertiesItem {
                oneof: Some(match a {
                    Value::Bool(b) => AdditionalProperties::Boolean(*b),
                    other => AdditionalProperties::Schema(Box::new(schema(other))),
                }),
            }),
        r#type: map.get("type").map(|t| TypeItem {
            value: match t {
                Value::Array(types) => types
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_owned)
                    .collect(),
                other => other.as_str().map(str::to_owned).into_iter().collect(),
            },
        }),
        items: map.get("items").map(|items| ItemsItem {
            schema: match items {
                Value::Array(each) => each.iter().map(schema).collect(),
                one => vec![schema(one)],
            },
        }),
        all_of: map
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(schema)
            .collect(),
        properties: map.get("properties").map(|p| Properties {
            additional_properties: named_schemas(Some(p)),
        }),
        read_only: map.get("readOnly").and_then(Value::as_bool) == Some(true),
        vendor_extension: vendor_extensions(map),
    }
}

fn parameter(value: &Value) -> ParametersItem {
    let empty = Map::new();
    let map = value.as_object().unwrap_or(&empty);
    let required = map.get("required").and_then(Value::as_bool) == Some(true);
    let unique_items = map.get("uniqueItems").and_then(Value::as_bool) == Some(true);
    let parameter = match map.get("in").and_then(Value::as_str) {
        Some("body") => Parameter {
            body_parameter: Some(BodyParameter {
                description: text(map, "description"),
                name: text(map, "name"),
                r#in: "body".into(),
                required,
                schema: map.get("schema").map(schema),
            }),
            non_body_parameter: None,
        },
        Some("path") => Parameter {
            body_parameter: None,
            non_body_parameter: Some(NonBodyParameter {
                query_parameter_sub_schema: None,
                path_parameter_sub_schema: Some(PathParameter {
                    required,
                    r#in: "path".into(),
                    description: text(map, "description"),
                    name: text(map, "name"),
                    r#type: text(map, "type"),
                    unique_items,
                }),
            }),
        },
        _ => Parameter {
            body_parameter: None,
            non_body_parameter: Some(NonBodyParameter {
                query_parameter_sub_schema: Some(SimpleParameter {
                    required,
                    r#in: text(map, "in"),
                    description: text(map, "description"),
                    name: text(map, "name"),
                    allow_empty_value: false,
                    r#type: text(map, "type"),
                    format: text(map, "format"),
                    unique_items,
                }),
                path_parameter_sub_schema: None,
            }),
        },
    };
    ParametersItem {
        parameter: Some(parameter),
    }
}

fn operation(value: &Value) -> Operation {
    let empty = Map::new();
    let map = value.as_object().unwrap_or(&empty);
    Operation {
        tags: strings(map, "tags"),
        description: text(map, "description"),
        operation_id: text(map, "operationId"),
        produces: strings(map, "produces"),
        consumes: strings(map, "consumes"),
        parameters: map
            .get("parameters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(parameter)
            .collect(),
        responses: map
            .get("responses")
            .and_then(Value::as_object)
            .map(|r| Responses {
                response_code: r
                    .iter()
                    .map(|(code, response)| NamedResponseValue {
                        name: code.clone(),
                        value: Some(ResponseValue {
                            response: Some(Response {
                                description: response
                                    .get("description")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default()
                                    .to_owned(),
                                schema: response.get("schema").map(|s| SchemaItem {
                                    schema: Some(schema(s)),
                                }),
                            }),
                        }),
                    })
                    .collect(),
            }),
        schemes: strings(map, "schemes"),
        vendor_extension: vendor_extensions(map),
    }
}

/// The v2 document `document` (as [`super::v2`] makes it) as gnostic's protobuf.
pub fn encode(document: &Value) -> Vec<u8> {
    let empty = Map::new();
    let map = document.as_object().unwrap_or(&empty);
    let info = map.get("info").and_then(Value::as_object).map(|info| Info {
        title: text(info, "title"),
        version: text(info, "version"),
    });
    let paths = map
        .get("paths")
        .and_then(Value::as_object)
        .map(|paths| Paths {
            path: paths
                .iter()
                .map(|(name, item)| {
                    let op = |method: &str| item.get(method).map(operation);
                    NamedPathItem {
                        name: name.clone(),
                        value: Some(PathItem {
                            get: op("get"),
                            put: op("put"),
                            post: op("post"),
                            delete: op("delete"),
                            patch: op("patch"),
                            parameters: item
                                .get("parameters")
                                .and_then(Value::as_array)
                                .into_iter()
                                .flatten()
                                .map(parameter)
                                .collect(),
                        }),
                    }
                })
                .collect(),
        });
    Document {
        swagger: text(map, "swagger"),
        info,
        consumes: strings(map, "consumes"),
        produces: strings(map, "produces"),
        paths,
        definitions: Some(Definitions {
            additional_properties: named_schemas(map.get("definitions")),
        }),
    }
    .encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_to_what_the_json_says() {
        let document = serde_json::json!({
            "swagger": "2.0",
            "info": {"title": "sample-apiserver", "version": "0.1.0"},
            "paths": {"/apis/zoo.example.com/v1/namespaces/{namespace}/zebras/{name}": {
                "get": {"operationId": "readZooExampleComV1NamespacedZebra", "tags": ["zooExampleCom_v1"],
                    "x-kubernetes-action": "get",
                    "responses": {"200": {"description": "OK", "schema": {"$ref": "#/definitions/com.example.zoo.v1.Zebra"}}}},
                "parameters": [{"in": "path", "name": "name", "required": true, "type": "string", "uniqueItems": true}]
            }},
            "definitions": {"com.example.zoo.v1.Zebra": {
                "type": "object", "required": ["spec"],
                "properties": {"spec": {"type": "object", "properties": {"weightKg": {"type": "number", "format": "double"}}},
                               "metadata": {"allOf": [{"$ref": "#/definitions/meta.ObjectMeta"}], "default": {}}},
                "x-kubernetes-group-version-kind": [{"group": "zoo.example.com", "kind": "Zebra", "version": "v1"}]
            }}
        });
        let decoded = Document::decode(encode(&document).as_slice()).unwrap();
        assert_eq!(decoded.swagger, "2.0");
        let path = &decoded.paths.as_ref().unwrap().path[0];
        let get = path.value.as_ref().unwrap().get.as_ref().unwrap();
        assert_eq!(get.operation_id, "readZooExampleComV1NamespacedZebra");
        assert_eq!(get.vendor_extension[0].name, "x-kubernetes-action");
        assert_eq!(
            get.vendor_extension[0].value.as_ref().unwrap().yaml,
            "\"get\""
        );
        let name = path.value.as_ref().unwrap().parameters[0]
            .parameter
            .as_ref()
            .unwrap();
        let name = name.non_body_parameter.as_ref().unwrap();
        assert_eq!(
            name.path_parameter_sub_schema.as_ref().unwrap().name,
            "name"
        );
        let zebra = &decoded.definitions.as_ref().unwrap().additional_properties[0];
        assert_eq!(zebra.name, "com.example.zoo.v1.Zebra");
        let zebra = zebra.value.as_ref().unwrap();
        assert_eq!(zebra.r#type.as_ref().unwrap().value, ["object"]);
        assert_eq!(zebra.required, ["spec"]);
        let gvk = &zebra.vendor_extension[0];
        assert_eq!(gvk.name, "x-kubernetes-group-version-kind");
        let yaml: Value = serde_json::from_str(&gvk.value.as_ref().unwrap().yaml).unwrap();
        assert_eq!(yaml[0]["version"], "v1");
        let properties = &zebra.properties.as_ref().unwrap().additional_properties;
        let metadata = properties.iter().find(|p| p.name == "metadata").unwrap();
        assert_eq!(
            metadata.value.as_ref().unwrap().all_of[0].r#ref,
            "#/definitions/meta.ObjectMeta"
        );
    }
}
