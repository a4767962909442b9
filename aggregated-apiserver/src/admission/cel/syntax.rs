//! What an expression's syntax tree says before it runs: whether every call in it is of
//! constant cost, the identifiers and `Object` types it names, how deep it nests.

use cel::common::ast::{EntryExpr, Expr, IdedExpr};

use super::OBJECT;

/// The operators and functions whose cost does not grow with what they make (no `replace`,
/// `join`, `+` on strings or lists...): an expression calling only these, and no
/// comprehension, costs about what its inputs and its own size allow.
const CONSTANT_COST: &[&str] = &[
    "_==_",
    "_!=_",
    "_<_",
    "_<=_",
    "_>_",
    "_>=_",
    "_&&_",
    "_||_",
    "!_",
    "_?_:_",
    "-_",
    "@in",
    "_[_]",
    "_[?_]",
    "_-_",
    "_*_",
    "_/_",
    "_%_",
    "has",
    "size",
    "int",
    "uint",
    "double",
    "string",
    "bool",
    "type",
    "startsWith",
    "endsWith",
    "contains",
    "matches",
    "orValue",
    "hasValue",
    "value",
    "optional.of",
    "optional.none",
    "optional.ofNonZeroValue",
    "_?._",
    "@not_strictly_false",
    // Quantities and URLs: linear in their text; `add` and `sub` bounded in digits.
    "quantity",
    "isQuantity",
    "sign",
    "isGreaterThan",
    "isLessThan",
    "compareTo",
    "asApproximateFloat",
    "asInteger",
    "isInteger",
    "add",
    "sub",
    "url",
    "isURL",
    "getScheme",
    "getHost",
    "getHostname",
    "getPort",
    "getEscapedPath",
    "getQuery",
];

/// The expressions directly under `node` (a comprehension's five parts included).
pub(super) fn children(node: &IdedExpr) -> Vec<&IdedExpr> {
    let mut children = Vec::new();
    match &node.expr {
        Expr::Comprehension(c) => children.extend([
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ]),
        Expr::Call(call) => {
            children.extend(call.target.as_deref());
            children.extend(call.args.iter());
        }
        Expr::List(list) => children.extend(list.elements.iter()),
        Expr::Map(map) => {
            for entry in &map.entries {
                if let EntryExpr::MapEntry(e) = &entry.expr {
                    children.push(&e.key);
                    children.push(&e.value);
                }
            }
        }
        Expr::Struct(s) => {
            for entry in &s.entries {
                if let EntryExpr::StructField(f) = &entry.expr {
                    children.push(&f.value);
                }
            }
        }
        Expr::Select(select) => children.push(&select.operand),
        Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
    }
    children
}

/// Every node of the expression, walked without recursion.
pub(super) fn nodes(root: &IdedExpr) -> Vec<&IdedExpr> {
    let mut all = Vec::new();
    let mut stack = vec![root];
    while let Some(node) = stack.pop() {
        stack.extend(children(node));
        all.push(node);
    }
    all
}

/// Whether every call in the expression is one of [`CONSTANT_COST`] (and it has no
/// comprehension).
pub(super) fn constant_cost(root: &IdedExpr) -> bool {
    nodes(root).into_iter().all(|node| match &node.expr {
        Expr::Call(call) => CONSTANT_COST.contains(&call.func_name.as_str()),
        Expr::Comprehension(_) => false,
        _ => true,
    })
}

/// The identifiers an expression names.
pub(super) fn identifiers(root: &IdedExpr) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for node in nodes(root) {
        if let Expr::Ident(name) = &node.expr
            && !names.contains(name)
        {
            names.push(name.clone());
        }
    }
    names
}

/// The `Object` types an expression builds (struct literals named `Object` or
/// `Object.<path>`).
pub(super) fn object_types(root: &IdedExpr) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for node in nodes(root) {
        if let Expr::Struct(s) = &node.expr {
            let name = s.type_name.trim_start_matches('.');
            if (name == OBJECT || name.starts_with("Object.")) && !names.iter().any(|n| n == name) {
                names.push(name.to_owned());
            }
        }
    }
    names
}

/// The deepest nesting of comprehensions in `root`, and of its nodes, walked without recursion.
pub(super) fn nesting(root: &IdedExpr) -> (usize, usize) {
    let (mut comprehensions, mut nodes) = (0, 0);
    let mut stack: Vec<(&IdedExpr, usize, usize)> = vec![(root, 0, 1)];
    while let Some((node, depth, level)) = stack.pop() {
        nodes = nodes.max(level);
        if let Expr::Comprehension(c) = &node.expr {
            let inner = depth + 1;
            comprehensions = comprehensions.max(inner);
            stack.push((&c.iter_range, depth, level + 1));
            stack.push((&c.accu_init, depth, level + 1));
            for part in [&c.loop_cond, &c.loop_step, &c.result] {
                stack.push((part, inner, level + 1));
            }
        } else {
            stack.extend(
                children(node)
                    .into_iter()
                    .map(|child| (child, depth, level + 1)),
            );
        }
    }
    (comprehensions, nodes)
}

/// How deep brackets nest in `source` (outside string literals, roughly: quotes toggle).
pub(super) fn bracket_depth(source: &str) -> usize {
    let (mut depth, mut deepest, mut quote) = (0usize, 0usize, None::<char>);
    for c in source.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '(' | '[' | '{') => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            (None, ')' | ']' | '}') => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    deepest
}

/// The fields selected on the identifier `name` (`variables.a` → `a`); None when `name` is
/// also used otherwise (indexed, passed whole), so any of its fields may be read.
pub(super) fn fields_of(root: &IdedExpr, name: &str) -> Option<Vec<String>> {
    let is_name = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(n) if n == name);
    let all = nodes(root);
    let mut fields: Vec<String> = Vec::new();
    let mut selected = 0;
    for node in &all {
        if let Expr::Select(select) = &node.expr
            && is_name(&select.operand)
        {
            selected += 1;
            if !fields.contains(&select.field) {
                fields.push(select.field.clone());
            }
        }
    }
    let used = all.iter().filter(|n| is_name(n)).count();
    (used == selected).then_some(fields)
}
