//! Apply conflicts and kube's messages for them (SMD `merge/conflict.go`,
//! apimachinery `managedfields/internal/conflict.go`).

use std::collections::BTreeMap;

use serde_json::Value;

use super::gojson;
use super::path::{Path, path_to_string};

/// A field another manager owns with a different value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// The owning manager's identifier (kube's JSON manager identifier,
    /// e.g. `{"manager":"kubectl","operation":"Update","apiVersion":"v1"}`).
    pub(crate) manager: String,
    /// The conflicting field.
    pub(crate) path: Path,
}

impl Conflict {
    /// The manager as kube prints it (`printManager`), e.g.
    /// `"kubectl-client-side-apply" using farm.example.com/v1alpha`.
    pub fn manager_display(&self) -> String {
        print_manager(&self.manager)
    }

    /// The path as SMD prints it, e.g. `.spec.weight`.
    pub fn path_display(&self) -> String {
        path_to_string(&self.path)
    }
}

/// kube's `printManager`: decodes the identifier; non-JSON identifiers are
/// quoted as-is.
pub(crate) fn print_manager(manager: &str) -> String {
    let Ok(Value::Object(e)) = serde_json::from_str::<Value>(manager) else {
        return gojson::quote(manager);
    };
    let s = |k: &str| e.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let mut out = gojson::quote(&s("manager"));
    let sub = s("subresource");
    if !sub.is_empty() {
        out = format!("{out} with subresource {}", gojson::quote(&sub));
    }
    if s("operation") == "Update" {
        let time = s("time");
        if time.is_empty() {
            return format!("{out} using {}", s("apiVersion"));
        }
        let t = gojson::parse_time(&time)
            .map(gojson::format_time)
            .unwrap_or(time);
        return format!("{out} using {} at {t}", s("apiVersion"));
    }
    out
}

/// kube's `getConflictMessage`: the 409 Status message.
pub(crate) fn conflict_message(conflicts: &[Conflict]) -> String {
    if let [c] = conflicts {
        return format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            c.manager_display(),
            c.path_display()
        );
    }
    let mut by_manager: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for c in conflicts {
        by_manager
            .entry(&c.manager)
            .or_default()
            .push(c.path_display());
    }
    let mut lines = vec![];
    for (m, paths) in by_manager {
        lines.push(format!("conflicts with {}:", print_manager(m)));
        for p in paths {
            lines.push(format!("- {p}"));
        }
    }
    format!(
        "Apply failed with {} conflicts: {}",
        conflicts.len(),
        lines.join("\n")
    )
}
