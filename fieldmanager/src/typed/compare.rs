//! Comparison of two values: which fields were added, removed or modified (SMD's `Compare`).

use super::*;

/// SMD `Compare`: which paths `new` added, modified or removed relative to
/// `old`. Atomic lists/maps are compared whole; empty and null containers
/// are leaves.
pub(crate) fn compare(
    schema: &Schema,
    old: &Value,
    new: &Value,
) -> Result<Comparison, ValidationErrors> {
    let mut c = Comparison::default();
    let mut path = vec![];
    let errs = cmp_node(
        schema,
        schema.root(),
        Some(old),
        Some(new),
        &mut path,
        false,
        &mut c,
    );
    into_result(errs).map(|_| c)
}

pub(super) fn cmp_node(
    schema: &Schema,
    tr: &TypeRef,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Vec<PathElement>,
    in_leaf: bool,
    c: &mut Comparison,
) -> Errs {
    if lhs.is_none() && rhs.is_none() {
        return errorf("at least one of lhs and rhs must be provided".to_string());
    }
    let r = match schema.resolve(tr) {
        Ok(r) => r,
        Err(e) => return errorf(e),
    };
    let (alhs, arhs) = (deduce(r, lhs), deduce(r, rhs));
    let mut leaf = in_leaf;
    let mut errs = vec![];
    let mut run =
        |a: Resolved<'_>, leaf: &mut bool, errs: &mut Errs, c: &mut Comparison| match handle(a, tr)
        {
            Ok(k) => errs.extend(cmp_kind(schema, k, lhs, rhs, path, leaf, c)),
            Err(e) => errs.extend(e),
        };
    if rhs.is_none() {
        run(alhs, &mut leaf, &mut errs, c);
    } else if lhs.is_none() || same_atom(&alhs, &arhs) {
        run(arhs, &mut leaf, &mut errs, c);
    } else {
        // SMD runs lhs's shape on a copy of the walker, then rhs's shape.
        let mut leaf2 = leaf;
        run(alhs, &mut leaf2, &mut errs, c);
        run(arhs, &mut leaf, &mut errs, c);
    }
    if !leaf {
        if lhs.is_none() {
            c.added.insert(path);
        } else if rhs.is_none() {
            c.removed.insert(path);
        }
    }
    errs
}

pub(super) fn cmp_leaf(
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &[PathElement],
    leaf: &mut bool,
    c: &mut Comparison,
) {
    if *leaf {
        return;
    }
    *leaf = true;
    match (lhs, rhs) {
        (None, _) => c.added.insert(path),
        (_, None) => c.removed.insert(path),
        (Some(l), Some(r)) => {
            if !values_equal(r, l) {
                c.modified.insert(path);
            }
        }
    }
}

pub(super) fn cmp_kind(
    schema: &Schema,
    kind: Kind<'_>,
    lhs: Option<&Value>,
    rhs: Option<&Value>,
    path: &mut Vec<PathElement>,
    leaf: &mut bool,
    c: &mut Comparison,
) -> Errs {
    match kind {
        Kind::Scalar(t) => {
            let le = validate_scalar(t, lhs, "lhs: ");
            let re = validate_scalar(t, rhs, "rhs: ");
            if !le.is_empty() && !re.is_empty() {
                return le.into_iter().chain(re).collect();
            }
            cmp_leaf(lhs, rhs, path, leaf, c);
            vec![]
        }
        Kind::List(l, rel) => {
            let la = lhs.and_then(Value::as_array);
            let ra = rhs.and_then(Value::as_array);
            let empty = la.is_none_or(|a| a.is_empty()) && ra.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                cmp_leaf(lhs, rhs, path, leaf, c);
                return vec![];
            }
            cmp_list_items(schema, l, rel, la, ra, path, *leaf, c)
        }
        Kind::Map(m, rel) => {
            let lm = lhs.and_then(Value::as_object);
            let rm = rhs.and_then(Value::as_object);
            let empty = lm.is_none_or(|a| a.is_empty()) && rm.is_none_or(|a| a.is_empty());
            if rel == ElementRelationship::Atomic || empty {
                cmp_leaf(lhs, rhs, path, leaf, c);
                return vec![];
            }
            let mut errs = vec![];
            for k in union_keys(lm, rm) {
                let Some(ft) = field_type(m, k) else {
                    // SMD fails to resolve an empty TypeRef here.
                    errs.extend(with_prefix(
                        errorf("schema error: invalid atom: inlined".to_string()),
                        &format!(".{k}"),
                    ));
                    continue;
                };
                path.push(PathElement::FieldName(k.clone()));
                let e = cmp_node(
                    schema,
                    ft,
                    lm.and_then(|m| m.get(k)),
                    rm.and_then(|m| m.get(k)),
                    path,
                    *leaf,
                    c,
                );
                path.pop();
                errs.extend(with_prefix(e, &format!(".{k}")));
            }
            errs
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn cmp_list_items(
    schema: &Schema,
    l: &ListType,
    rel: ElementRelationship,
    lhs: Option<&Vec<Value>>,
    rhs: Option<&Vec<Value>>,
    path: &mut Vec<PathElement>,
    leaf: bool,
    c: &mut Comparison,
) -> Errs {
    let mut errs = vec![];
    let mut all: Vec<PathElement> = vec![];
    let mut lvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    let mut rvals: BTreeMap<PathElement, Vec<&Value>> = BTreeMap::new();
    for (i, child) in lhs.into_iter().flatten().enumerate() {
        match list_item_pe(schema, l, rel, child) {
            Ok(pe) => {
                let e = lvals.entry(pe.clone()).or_default();
                if e.is_empty() {
                    all.push(pe);
                }
                e.push(child);
            }
            Err(e) => errs.extend(errorf(format!("element {i}: {e}"))),
        }
    }
    for (i, child) in rhs.into_iter().flatten().enumerate() {
        match list_item_pe(schema, l, rel, child) {
            Ok(pe) => {
                let e = rvals.entry(pe.clone()).or_default();
                if e.is_empty() && !lvals.contains_key(&pe) {
                    all.push(pe.clone());
                }
                e.push(child);
            }
            Err(e) => errs.extend(errorf(format!("element {i}: {e}"))),
        }
    }
    let none = Vec::new();
    for pe in all {
        let ll = lvals.get(&pe).unwrap_or(&none);
        let rl = rvals.get(&pe).unwrap_or(&none);
        let item = |lv: Option<&Value>,
                    rv: Option<&Value>,
                    path: &mut Vec<PathElement>,
                    c: &mut Comparison| {
            path.push(pe.clone());
            let e = cmp_node(schema, &l.element_type, lv, rv, path, leaf, c);
            path.pop();
            with_prefix(e, &pe.to_string())
        };
        if ll.len() <= 1 && rl.len() <= 1 {
            errs.extend(item(ll.first().copied(), rl.first().copied(), path, c));
        } else if ll.len() >= 2 && rl.len() >= 2 {
            let same =
                ll.len() == rl.len() && ll.iter().zip(rl.iter()).all(|(a, b)| values_equal(a, b));
            if !same {
                path.push(pe.clone());
                c.modified.insert(path);
                path.pop();
            }
        } else if ll.len() >= 2 {
            if let Some(r) = rl.first() {
                errs.extend(item(None, Some(r), path, c));
            }
            path.push(pe.clone());
            c.removed.insert(path);
            path.pop();
        } else {
            if let Some(lv) = ll.first() {
                errs.extend(item(Some(lv), None, path, c));
            }
            path.push(pe.clone());
            c.added.insert(path);
            path.pop();
        }
    }
    errs
}
