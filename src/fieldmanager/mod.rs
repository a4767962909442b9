//! Server-side apply: field ownership (`metadata.managedFields`), apply
//! merges and conflicts, with kube-apiserver's semantics.
//!
//! A port of structured-merge-diff (`fieldpath`, `schema`, `typed`,
//! `merge`) and of apimachinery's `util/managedfields/internal` manager
//! chain. Entry point for the REST layer: [`FieldManager`].
//!
//! Layout: [`path`] and [`set`] (field paths and sets, FieldsV1),
//! [`schema`] (types, OpenAPI conversion), [`typed`] (validate, field
//! sets, compare, merge, remove), [`merge`] (the SMD updater),
//! [`managed`] (managedFields entries), [`conflict`] (messages),
//! [`manager`] (the FieldManager facade).

pub mod conflict;
mod gojson;
pub mod managed;
pub mod manager;
pub mod merge;
pub mod path;
pub mod schema;
pub mod set;
pub mod typed;

#[cfg(test)]
mod tests;

pub use conflict::{Conflict, conflict_causes, conflict_message};
pub use manager::FieldManager;
pub use merge::{ManagedFields, Updater, VersionedSet};
pub use path::{Path, PathElement, path_to_string};
pub use schema::{Atom, ElementRelationship, ListType, MapType, ScalarType, Schema, TypeRef};
pub use set::FieldSet;
pub use typed::Comparison;

/// Errors of field management. Messages are kube-apiserver's where it has
/// one.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// Apply conflicts: a 409 Conflict Status with reason "Conflict",
    /// [`Error::message`] as message and [`Error::causes`] as causes.
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
    /// Anything else (kube answers 500).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The HTTP status code for the Status response.
    pub fn status_code(&self) -> u16 {
        match self {
            Error::Conflicts(_) => 409,
            Error::Invalid(_) => 422,
            Error::BadRequest(_) => 400,
            Error::Internal(_) => 500,
        }
    }

    /// The Status message (kube's exact text for conflicts).
    pub fn message(&self) -> String {
        self.to_string()
    }

    /// The Status `details.causes` (one "FieldManagerConflict" cause per
    /// conflict; empty otherwise).
    pub fn causes(&self) -> Vec<serde_json::Value> {
        match self {
            Error::Conflicts(c) => conflict_causes(c),
            _ => vec![],
        }
    }
}
