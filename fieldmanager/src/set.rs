//! Field sets (structured-merge-diff `fieldpath/set.go`) and their FieldsV1
//! wire encoding (`fieldpath/serialize.go`).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::Error;
use super::path::{Path, PathElement};
use super::schema::{Schema, TypeRef};

/// A set of field paths, stored as a tree: `members` are the paths that
/// end at this level, `children` the subtrees. A node being a child does
/// not make it a member (SMD semantics: `.spec.weight` does not own `.spec`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FieldSet {
    members: BTreeSet<PathElement>,
    children: BTreeMap<PathElement, FieldSet>,
}

impl FieldSet {
    /// The empty set.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Builds a set from paths.
    pub(crate) fn from_paths<I: IntoIterator<Item = Path>>(paths: I) -> Self {
        let mut s = Self::new();
        for p in paths {
            s.insert(&p);
        }
        s
    }

    /// Adds `path`; parents are not added. The empty path (the whole
    /// object) is never tracked, as in SMD.
    pub(crate) fn insert(&mut self, path: &[PathElement]) {
        let Some((last, parents)) = path.split_last() else {
            return;
        };
        let mut node = self;
        for pe in parents {
            node = node.children.entry(pe.clone()).or_default();
        }
        node.members.insert(last.clone());
    }

    /// Whether `path` is a member.
    pub(crate) fn has(&self, path: &[PathElement]) -> bool {
        let Some((last, parents)) = path.split_last() else {
            return false;
        };
        let mut node = self;
        for pe in parents {
            match node.children.get(pe) {
                Some(n) => node = n,
                None => return false,
            }
        }
        node.members.contains(last)
    }

    /// True when no path is a member (empty child nodes do not count).
    pub(crate) fn is_empty(&self) -> bool {
        self.members.is_empty() && self.children.values().all(FieldSet::is_empty)
    }

    /// Paths in either set.
    pub(crate) fn union(&self, other: &FieldSet) -> FieldSet {
        let mut out = self.clone();
        out.absorb(other.clone());
        out
    }

    /// Adds `other`'s paths, moving its subtrees (linear in the sets' size, whatever their
    /// depth; a FieldsV1 from a request may be 128 levels deep).
    pub(crate) fn absorb(&mut self, other: FieldSet) {
        self.members.extend(other.members);
        for (pe, child) in other.children {
            match self.children.get_mut(&pe) {
                Some(mine) => mine.absorb(child),
                None => {
                    self.children.insert(pe, child);
                }
            }
        }
    }

    /// Paths in both sets; empty subtrees are dropped.
    pub(crate) fn intersection(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.intersection(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, child) in &self.children {
            if let Some(o) = other.children.get(pe) {
                let i = child.intersection(o);
                if !i.is_empty() {
                    children.insert(pe.clone(), i);
                }
            }
        }
        FieldSet { members, children }
    }

    /// Paths of `self` not in `other`. As in SMD, a member of `other` does
    /// not remove `self`'s paths below it (use
    /// [`FieldSet::recursive_difference`] for that).
    pub(crate) fn difference(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.difference(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, child) in &self.children {
            match other.children.get(pe) {
                Some(o) => {
                    let d = child.difference(o);
                    if !d.is_empty() {
                        children.insert(pe.clone(), d);
                    }
                }
                None => {
                    children.insert(pe.clone(), child.clone());
                }
            }
        }
        FieldSet { members, children }
    }

    /// Like [`FieldSet::difference`] but a member of `other` also removes
    /// every path below it (SMD `RecursiveDifference`, used for ignored
    /// and reset fields).
    pub(crate) fn recursive_difference(&self, other: &FieldSet) -> FieldSet {
        let members = self.members.difference(&other.members).cloned().collect();
        let mut children = BTreeMap::new();
        for (pe, child) in &self.children {
            if other.members.contains(pe) {
                continue;
            }
            match other.children.get(pe) {
                Some(o) => {
                    let d = child.recursive_difference(o);
                    if !d.is_empty() {
                        children.insert(pe.clone(), d);
                    }
                }
                None => {
                    children.insert(pe.clone(), child.clone());
                }
            }
        }
        FieldSet { members, children }
    }

    /// The subset below `pe`, without the prefix (empty if none).
    pub(crate) fn with_prefix(&self, pe: &PathElement) -> Option<&FieldSet> {
        self.children.get(pe)
    }

    /// All member paths, in SMD's pre-order (this level's members, then
    /// each child's paths).
    pub(crate) fn paths(&self) -> Vec<Path> {
        let mut out = Vec::new();
        let mut prefix = Vec::new();
        self.collect(&mut prefix, &mut out);
        out
    }

    fn collect(&self, prefix: &mut Path, out: &mut Vec<Path>) {
        for m in &self.members {
            let mut p = prefix.clone();
            p.push(m.clone());
            out.push(p);
        }
        for (pe, child) in &self.children {
            prefix.push(pe.clone());
            child.collect(prefix, out);
            prefix.pop();
        }
    }

    /// SMD `EnsureNamedFieldsAreMembers`: also makes members of the struct
    /// fields (not map keys) that have children in the set, so that prune
    /// removes a struct field whose sub-fields all went away.
    pub(crate) fn ensure_named_fields_are_members(
        &self,
        schema: &Schema,
        tr: Option<&TypeRef>,
    ) -> FieldSet {
        let map = tr.and_then(|t| schema.resolve(t).ok()).and_then(|r| r.map);
        let list = tr.and_then(|t| schema.resolve(t).ok()).and_then(|r| r.list);
        let mut members = self.members.clone();
        let mut children = BTreeMap::new();
        for (pe, child) in &self.children {
            let mut child_tr = None;
            match pe {
                PathElement::FieldName(name) => {
                    if let Some(m) = map {
                        if m.fields.contains_key(name) {
                            members.insert(pe.clone());
                        }
                        child_tr = m
                            .fields
                            .get(name)
                            .map(|f| &f.ty)
                            .or(m.element_type.as_ref());
                    }
                }
                PathElement::Key(_) => {
                    if let Some(l) = list {
                        child_tr = Some(&l.element_type);
                    }
                }
                _ => {}
            }
            children.insert(
                pe.clone(),
                child.ensure_named_fields_are_members(schema, child_tr),
            );
        }
        FieldSet { members, children }
    }

    /// Encodes the set as kube's FieldsV1 JSON text, byte-for-byte as
    /// `Set.ToJSON` does (elements in SMD order, `"."` for a node that is
    /// both a member and a parent, `{}` for leaves).
    pub(crate) fn to_fields_v1_string(&self) -> String {
        let mut out = String::from("{");
        self.emit(false, &mut out);
        out.push('}');
        out
    }

    fn emit(&self, include_self: bool, out: &mut String) {
        let mut first = true;
        let mut sep = |out: &mut String| {
            if !first {
                out.push(',');
            }
            first = false;
        };
        if include_self && !(self.members.is_empty() && self.children.is_empty()) {
            sep(out);
            out.push_str("\".\":{}");
        }
        // Members and children merged in element order; an element that is
        // both is written once, as a child with ".".
        let mut keys: BTreeSet<&PathElement> = self.members.iter().collect();
        keys.extend(self.children.keys());
        for pe in keys {
            sep(out);
            super::gojson::write_string(out, &pe.to_fields_v1_key(), false);
            out.push(':');
            match self.children.get(pe) {
                Some(child) => {
                    out.push('{');
                    child.emit(self.members.contains(pe), out);
                    out.push('}');
                }
                None => out.push_str("{}"),
            }
        }
    }

    /// Decodes kube's FieldsV1 encoding (`Set.FromJSON`): unknown element
    /// types are skipped, malformed keys or non-object values are errors.
    pub(crate) fn from_fields_v1(v: &Value) -> Result<FieldSet, Error> {
        let (set, _) = read_node(v).map_err(Error::Invalid)?;
        Ok(set.unwrap_or_default())
    }
}

/// Returns (children, is_member) as Go's `readIterV1` does: a node with no
/// decodable children (e.g. `{}`) is a member; `"."` marks membership.
fn read_node(v: &Value) -> Result<(Option<FieldSet>, bool), String> {
    let Value::Object(m) = v else {
        return Err(format!("expected an object in FieldsV1, got {v}"));
    };
    let mut children: Option<FieldSet> = None;
    let mut is_member = false;
    for (key, sub) in m {
        if key == "." {
            is_member = true;
            continue;
        }
        let Some(pe) = PathElement::from_fields_v1_key(key)
            .map_err(|e| format!("parsing key as path element: {e}"))?
        else {
            continue;
        };
        let (grandchildren, child_is_member) = read_node(sub)?;
        if child_is_member {
            children
                .get_or_insert_with(FieldSet::new)
                .members
                .insert(pe.clone());
        }
        if let Some(g) = grandchildren {
            let c = children.get_or_insert_with(FieldSet::new);
            c.children.entry(pe).or_default().absorb(g);
        }
    }
    if children.is_none() {
        is_member = true;
    }
    Ok((children, is_member))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn f(n: &str) -> PathElement {
        PathElement::field(n)
    }

    fn roundtrip(s: &str) {
        let v: Value = serde_json::from_str(s).expect("json");
        let set = FieldSet::from_fields_v1(&v).expect("decode");
        assert_eq!(set.to_fields_v1_string(), s);
    }

    #[test]
    fn fields_v1_roundtrip_exact_bytes() {
        // Cases from SMD serialize_test.go / kube managedFields.
        roundtrip("{}");
        roundtrip(r#"{"f:metadata":{"f:labels":{".":{},"f:app":{}}},"f:spec":{"f:weight":{}}}"#);
        roundtrip(
            r#"{"f:a":{"k:{\"name\":\"x\",\"port\":80}":{".":{},"f:name":{}},"v:1":{},"v:\"a\"":{},"i:0":{}}}"#,
        );
        roundtrip(
            r#"{"f:metadata":{"f:finalizers":{".":{},"v:\"a\"":{},"v:\"b\"":{}},"f:ownerReferences":{".":{},"k:{\"uid\":\"u1\"}":{}}}}"#,
        );
    }

    #[test]
    fn decoding_sorts_and_skips_unknown() {
        let v = json!({"f:b": {}, "f:a": {"x:zz": {}}, "z:q": {}});
        let set = FieldSet::from_fields_v1(&v).expect("decode");
        assert_eq!(set.to_fields_v1_string(), r#"{"f:a":{},"f:b":{}}"#);
        assert!(FieldSet::from_fields_v1(&json!({"f:a": 1})).is_err());
        assert!(FieldSet::from_fields_v1(&json!({"q": {}})).is_err());
    }

    #[test]
    fn set_operations() {
        let a = FieldSet::from_paths([vec![f("a"), f("b")], vec![f("c")]]);
        let b = FieldSet::from_paths([vec![f("a"), f("b")], vec![f("d")]]);
        assert_eq!(
            a.intersection(&b),
            FieldSet::from_paths([vec![f("a"), f("b")]])
        );
        assert_eq!(a.difference(&b), FieldSet::from_paths([vec![f("c")]]));
        assert_eq!(a.union(&b).paths().len(), 3);
        // parent - child = parent; child - parent keeps the child (SMD).
        let parent = FieldSet::from_paths([vec![f("a")]]);
        assert_eq!(a.difference(&parent), a);
        assert_eq!(
            a.recursive_difference(&parent),
            FieldSet::from_paths([vec![f("c")]])
        );
        assert!(a.has(&[f("a"), f("b")]));
        assert!(!a.has(&[f("a")]));
        assert!(FieldSet::new().is_empty());
    }
}
