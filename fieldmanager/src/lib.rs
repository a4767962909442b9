#![forbid(unsafe_code)]
#![warn(missing_docs)]
//! fieldmanager: server-side apply as kube-apiserver does it.
//! Kubernetes structured-merge-diff's field management: field ownership
//! (`metadata.managedFields`), apply merges and apply conflicts, with
//! kube-apiserver's semantics and messages.
//!
//! A port of structured-merge-diff (`fieldpath`, `schema`, `typed`,
//! `merge`) and of apimachinery's `util/managedfields/internal` manager
//! chain. It knows JSON values and OpenAPI v3 schemas, nothing of the
//! server: farm-apiserver's REST layer builds a [`FieldManager`] per kind
//! (and per status subresource) from the [`Schema`] its OpenAPI publishes,
//! and calls it on every write.
//!
//! Public: [`Schema`] (from OpenAPI v3), [`FieldManager`] (update and
//! apply), [`Versions`] (a kind's other versions, SMD's converter),
//! [`Error`] and [`Conflict`], [`typed`]'s merge of an apply
//! configuration without ownership (MutatingAdmissionPolicy's), and Go's
//! JSON texts ([`go_json`], [`go_float`]).
//!
//! Layout: `path` and `set` (field paths and sets, FieldsV1), `schema`
//! (types, OpenAPI conversion), [`typed`] (validate, field sets, compare,
//! merge, remove), `merge` (the SMD updater), `managed` (managedFields
//! entries), `conflict` (messages), `manager` (the FieldManager facade).

mod conflict;
mod gojson;
mod managed;
mod manager;
mod merge;
mod path;
mod schema;
mod set;
pub mod typed;

#[cfg(test)]
mod tests;

pub use conflict::Conflict;

/// A value's JSON text as Go's `encoding/json` writes it (HTML escaping, Go's floats): what
/// kube-apiserver writes, for comparisons of texts (a JSON patch `test`).
pub fn go_json(value: &serde_json::Value) -> String {
    gojson::encode(value)
}

/// A float64 as Go's `encoding/json` writes it (`1e+21`, `1e-7`, `1.5`).
pub fn go_float(f: f64) -> String {
    gojson::format_float(f, gojson::Flavor::EncodingJson)
}
pub use manager::FieldManager;
pub use schema::Schema;

use conflict::conflict_message;

/// The versions of a kind served in several (SMD's `Converter`): a manager's
/// fields are recorded at the version it wrote, and a write at another
/// version is compared with them, and prunes them, at theirs.
pub trait Versions: Send + Sync + std::fmt::Debug {
    /// The schema of `version` (an apiVersion, e.g.
    /// `farm.example.com/v1alpha`); None when the kind has no such version
    /// (sets recorded at it are dropped, as SMD's missing versions are).
    fn schema(&self, version: &str) -> Option<&Schema>;
    /// `object` (its `apiVersion` says at which version it is) converted to
    /// `version`; None when it cannot be.
    fn convert(&self, object: &serde_json::Value, version: &str) -> Option<serde_json::Value>;
}

/// Errors of field management. Messages (the `Display` text) are
/// kube-apiserver's where it has one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Apply conflicts: kube-apiserver answers 409 Conflict with the
    /// `Display` text as message and one "FieldManagerConflict" cause per
    /// conflict.
    #[error("{}", conflict_message(.0))]
    Conflicts(Vec<Conflict>),
    /// The applied configuration (or the request's managedFields) does not
    /// fit the schema, e.g. a wrong type or duplicate list-map keys.
    #[error("{0}")]
    Invalid(String),
    /// kube's `NewBadRequest` cases: wrong apiVersion/kind in an apply
    /// patch, managedFields set in an apply patch (400).
    #[error("{0}")]
    BadRequest(String),
    /// Anything else (kube answers 500), and a schema that does not convert.
    #[error("{0}")]
    Internal(String),
}
