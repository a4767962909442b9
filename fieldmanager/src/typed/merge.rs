//! Merging an applied configuration into the live object, and the atomic places of a value
//! (SMD's `Merge`).

use super::*;

pub(super) static NULL: Value = Value::Null;

/// SMD `Merge` with rule "keep rhs": `config` wins on every leaf it sets;
/// separable maps and associative lists are merged item by item (list
/// order follows rhs for shared items), atomic values are replaced whole.
/// Nothing is removed.
pub fn merge(schema: &Schema, live: &Value, config: &Value) -> Result<Value, ValidationErrors> {
    let (out, errs) = merge_node(schema, schema.root(), Some(live), Some(config), false);
    into_result(errs).map(|_| out.unwrap_or(Value::Null))
}

/// The places in `v` whose type is an atomic map, struct or list (SMD's paths, e.g.
/// `.spec.items`), walked without recursion: what MutatingAdmissionPolicy's apply
/// configurations may not set, as setting part of an atomic value drops the rest.
pub fn atomic_paths(schema: &Schema, v: &Value) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack: Vec<(&TypeRef, &Value, String)> = vec![(schema.root(), v, String::new())];
    while let Some((tr, v, path)) = stack.pop() {
        let Ok(r) = schema.resolve(tr) else {
            continue;
        };
        match (v, r.map, r.list) {
            (Value::Object(fields), Some(m), _) => {
                if r.map_relationship() == ElementRelationship::Atomic {
                    found.push(path.clone());
                }
                for (key, value) in fields {
                    if let Some(t) = field_type(m, key) {
                        stack.push((t, value, format!("{path}.{key}")));
                    }
                }
            }
            (Value::Array(items), _, Some(l)) => {
                if r.list_relationship() == ElementRelationship::Atomic {
                    found.push(path.clone());
                }
                for (index, item) in items.iter().enumerate() {
                    stack.push((&l.element_type, item, format!("{path}[{index}]")));
                }
            }
            _ => {}
        }
    }
    found.sort();
    found
}

pub(super) fn merge_node(
    schema: &Schema,
    tr: &TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    in_leaf: bool,
) -> (Option<Value>, Errs) {
    if lhs.is_none() && rhs.is_none() {
        return (
            None,
            errorf("at least one of lhs and rhs must be provided".to_string()),
        );
    }
    let r = match schema.resolve(tr) {
        Ok(r) => r,
        Err(e) => return (None, errorf(e)),
    };
    let (alhs, arhs) = (deduce(r, lhs), deduce(r, rhs));
    let mut errs = vec![];
    let run = |a: Resolved<'_>, errs: &mut Errs| -> Option<Value> {
        let mut leaf = in_leaf;
        match handle(a, tr) {
            Ok(k) => {
                let (o, e) = merge_kind(schema, k, lhs, rhs, &mut leaf);
                errs.extend(e);
                o
            }
            Err(e) => {
                errs.extend(e);
                None
            }
        }
    };
    let out = if rhs.is_none() {
        run(alhs, &mut errs)
    } else if lhs.is_none() || same_atom(&alhs, &arhs) {
        run(arhs, &mut errs)
    } else {
        // SMD merges lhs's shape on a walker copy whose output is dropped.
        let _ = run(alhs, &mut errs);
        run(arhs, &mut errs)
    };
    (out, errs)
}

pub(super) fn merge_leaf(
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    leaf: &mut bool,
) -> Option<Value> {
    if *leaf {
        return None;
    }
    *leaf = true;
    rhs.or(lhs).cloned()
}

pub(super) fn merge_kind(
    schema: &Schema,
    kind: Kind<'_>,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    leaf: &mut bool,
) -> (Option<Value>, Errs) {
    match kind {
        Kind::Scalar(t) => {
            let le = validate_scalar(t, lhs, "lhs: ");
            let re = validate_scalar(t, rhs, "rhs: ");
            if !le.is_empty() && !re.is_empty() {
                return (None, le.into_iter().chain(re).collect());
            }
            (merge_leaf(lhs, rhs, leaf), vec![])
        }
        Kind::List(l, rel) => {
            let la = lhs.and_then(Value::as_array);
            let ra = rhs.and_then(Value::as_array);
            let empty = la.is_none_or(|a| a.is_empty()) && ra.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                return (merge_leaf(lhs, rhs, leaf), vec![]);
            }
            merge_list_items(schema, l, rel, la, ra, *leaf)
        }
        Kind::Map(m, rel) => {
            let lm = lhs.and_then(Value::as_object);
            let rm = rhs.and_then(Value::as_object);
            let empty = lm.is_none_or(|a| a.is_empty()) && rm.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                return (merge_leaf(lhs, rhs, leaf), vec![]);
            }
            let mut out = Map::new();
            let mut errs = vec![];
            for k in union_keys(lm, rm) {
                let Some(ft) = field_type(m, k) else {
                    errs.extend(with_prefix(
                        errorf("schema error: invalid atom: inlined".to_string()),
                        &format!(".{k}"),
                    ));
                    continue;
                };
                let (o, e) = merge_node(
                    schema,
                    ft,
                    lm.and_then(|m| m.get(k)),
                    rm.and_then(|m| m.get(k)),
                    *leaf,
                );
                errs.extend(with_prefix(e, &format!(".{k}")));
                if let Some(o) = o {
                    out.insert(k.clone(), o);
                }
            }
            ((!out.is_empty()).then_some(Value::Object(out)), errs)
        }
    }
}

type Indexed<'v> = (Vec<PathElement>, BTreeMap<PathElement, &'v Value>, Errs);

pub(super) fn index_list<'v>(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    list: Option<&'v Vec<Value>>,
    allow_dups: bool,
) -> Indexed<'v> {
    let mut pes = vec![];
    let mut observed: BTreeMap<PathElement, &'v Value> = BTreeMap::new();
    let mut errs = vec![];
    for (i, child) in list.into_iter().flatten().enumerate() {
        let pe = match list_item_pe(schema, l, rel, child) {
            Ok(pe) => pe,
            Err(e) => {
                errs.extend(errorf(format!("element {i}: {e}")));
                continue;
            }
        };
        let found = observed.contains_key(&pe);
        if found && !allow_dups {
            errs.extend(errorf(format!("duplicate entries for key {pe}")));
            continue;
        } else if !found {
            observed.insert(pe.clone(), child);
        } else {
            // Duplicated items are not merged with the new value.
            observed.insert(pe.clone(), &NULL);
        }
        pes.push(pe);
    }
    (pes, observed, errs)
}

pub(super) fn merge_list_items(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    lhs: Option<&Vec<Value>>,
    rhs: Option<&Vec<Value>>,
    leaf: bool,
) -> (Option<Value>, Errs) {
    let (rhs_pes, obs_r, mut errs) = index_list(schema, l, rel, rhs, false);
    let (lhs_pes, obs_l, lerrs) = index_list(schema, l, rel, lhs, true);
    errs.extend(lerrs);
    if !errs.is_empty() {
        return (None, errs);
    }
    // Item errors are dropped, as SMD does (it shadows them); inputs were
    // validated before merging.
    let item = |lv: Option<&Value>, rv: Option<&Value>| {
        merge_node(schema, &l.element_type, lv, rv, leaf).0
    };
    let mut shared = rhs_pes.iter().filter(|pe| obs_l.contains_key(*pe));
    let mut next_shared = shared.next();
    let mut merged_rhs: BTreeSet<&PathElement> = BTreeSet::new();
    let mut out = vec![];
    let (llen, rlen) = (lhs_pes.len(), rhs_pes.len());
    let (mut li, mut ri) = (0, 0);
    while li < llen || ri < rlen {
        if li < llen && ri < rlen {
            let pe = &lhs_pes[li];
            if *pe == rhs_pes[ri] {
                merged_rhs.insert(pe);
                if let Some(o) = item(obs_l.get(pe).copied(), obs_r.get(pe).copied()) {
                    out.push(o);
                }
                li += 1;
                ri += 1;
                next_shared = shared.next();
                continue;
            }
            if obs_r.contains_key(pe) && next_shared.is_some_and(|n| n != pe) {
                // Shared item, but not the one wanted in this round.
                li += 1;
                continue;
            }
        }
        if li < llen {
            let pe = &lhs_pes[li];
            if !obs_r.contains_key(pe) {
                let lchild = lhs.and_then(|a| a.get(li));
                if let Some(o) = item(lchild, None) {
                    out.push(o);
                }
                li += 1;
                continue;
            } else if merged_rhs.contains(pe) {
                li += 1;
            }
        }
        if ri < rlen {
            let pe = &rhs_pes[ri];
            merged_rhs.insert(pe);
            if let Some(o) = item(obs_l.get(pe).copied(), obs_r.get(pe).copied()) {
                out.push(o);
            }
            ri += 1;
            if next_shared.is_some_and(|n| n == pe) {
                next_shared = shared.next();
            }
        }
    }
    ((!out.is_empty()).then_some(Value::Array(out)), vec![])
}
