//! CEL for admission (webhooks' `matchConditions` and the policies): expressions compiled once
//! per text, with the standard library, the strings and lists extensions, Kubernetes' regex
//! and lists libraries ([`library`]), its quantity, url and authorizer libraries ([`quantity`], [`url`], [`authz`]), and what
//! MutatingAdmissionPolicy adds: `Object` types to build an apply configuration with (any
//! `Object.<field path>` an expression names), `JSONPatch` and `jsonpatch.escapeKey`.
//!
//! kube-apiserver bounds what an expression may cost (an estimate refused when the policy is
//! loaded, a budget while it runs). The cel crate has neither, so here: an expression is
//! refused when it nests one comprehension (`all`, `exists`, `map`, `filter`) in another or
//! nests deeper than [`MAX_NESTING`]; it is compiled and run on one of [`THREADS`] threads of
//! its own with a large stack, never on an async worker; and a caller waits at most [`BUDGET`],
//! past which the evaluation is an error that the caller's failure policy judges. What could
//! take memory without end is bounded with kube-apiserver's "actual cost limit exceeded":
//! `replace` (8 MiB made per evaluation, [`library`]) and a policy's variables (8 MiB each,
//! [`within_variable_bound`]). An evaluation that runs past its budget keeps its thread until
//! it ends (the interpreter cannot be interrupted): a cost limit inside the interpreter is what
//! is still missing.

mod authz;
pub use authz::{Answer, Asked, Checker, authorizer, request_resource};
mod library;
mod quantity;
mod url;

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use cel::common::{
    ast::{EntryExpr, Expr, IdedExpr},
    types::CelString,
    value::Val,
};
use serde_json::Value;

/// The longest expression taken.
const MAX_EXPRESSION_CHARS: usize = 5 * 1024;
/// How deep an expression may nest (brackets in its text, nodes in its syntax tree): the
/// parser and the interpreter recurse.
const MAX_NESTING: usize = 64;
/// What one evaluation may take, waiting for a thread included.
pub const BUDGET: Duration = Duration::from_millis(250);
/// The threads CEL runs on.
const THREADS: usize = 2;
/// Their stacks: the interpreter recurses once per syntax node.
const STACK_BYTES: usize = 64 * 1024 * 1024;

/// An expression ready to run.
pub struct Expression {
    program: cel::Program,
    source: String,
    /// No comprehension, only [`CONSTANT_COST`] calls: its cost is bounded by its size and
    /// its inputs', so it may run on the caller's thread (see [`within`]).
    simple: bool,
    /// The identifiers it names (its variables among them).
    names: Vec<String>,
    /// What it runs in: [`env`], or one that also declares the `Object` types it builds.
    env: Arc<cel::Env>,
}

/// The environment every expression starts from.
fn new_env() -> cel::Env {
    let mut env = cel::Env::stdlib();
    let _ = library::add_bounded_replace(&mut env);
    let _ = env.add_extension(cel::extensions::strings);
    let _ = env.add_extension(cel::extensions::lists);
    let _ = env.add_type(AnyStruct::new(
        JSON_PATCH,
        Some(&["op", "path", "from", "value"]),
    ));
    let _ = cel::add_overload!(env, fn escape_key: (CelString) -> CelString, name = "jsonpatch.escapeKey");
    let _ = library::add(&mut env);
    let _ = quantity::add(&mut env);
    let _ = url::add(&mut env);
    let _ = authz::add(&mut env);
    env
}

fn env() -> Arc<cel::Env> {
    static ENV: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENV.get_or_init(|| Arc::new(new_env())).clone()
}

/// `jsonpatch.escapeKey`: a key as a JSON pointer's segment (RFC 6901).
fn escape_key(key: &CelString<'_>) -> CelString<'static> {
    key.replace('~', "~0").replace('/', "~1").into()
}

/// The name of MutatingAdmissionPolicy's JSON patch operation type.
const JSON_PATCH: &str = "JSONPatch";
/// The root of MutatingAdmissionPolicy's apply configuration types (`Object`,
/// `Object.spec`, ...).
const OBJECT: &str = "Object";

/// A struct type that takes any field (or those listed): kube-apiserver's `Object` types are
/// as loose, and their names are checked against their place in the object when converted.
struct AnyStruct {
    r#type: cel::common::types::Type,
    fields: Option<&'static [&'static str]>,
}

impl AnyStruct {
    fn new(name: &str, fields: Option<&'static [&'static str]>) -> Self {
        Self {
            r#type: cel::common::types::Type::new_struct(name.to_owned()),
            fields,
        }
    }
}

impl cel::StructType for AnyStruct {
    fn get_type(&self) -> &cel::common::types::Type {
        &self.r#type
    }

    fn new_value<'b, 'v>(
        &self,
        fields: std::collections::BTreeMap<String, cel::common::value::CowVal<'b, 'v>>,
    ) -> Result<Box<dyn cel::common::value::Val + 'v>, cel::ExecutionError> {
        let mut value = cel::common::types::CelStruct::new(self.r#type.name().to_owned());
        for (name, field) in fields {
            if self
                .fields
                .is_some_and(|known| !known.contains(&name.as_str()))
            {
                return Err(cel::ExecutionError::NoSuchKey(Arc::new(format!(
                    "field `{name}` on struct `{}`",
                    self.r#type.name()
                ))));
            }
            value.add_field_value(name, field);
        }
        Ok(Box::new(value))
    }
}

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
fn children(node: &IdedExpr) -> Vec<&IdedExpr> {
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
fn nodes(root: &IdedExpr) -> Vec<&IdedExpr> {
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
fn constant_cost(root: &IdedExpr) -> bool {
    nodes(root).into_iter().all(|node| match &node.expr {
        Expr::Call(call) => CONSTANT_COST.contains(&call.func_name.as_str()),
        Expr::Comprehension(_) => false,
        _ => true,
    })
}

/// The identifiers an expression names.
fn identifiers(root: &IdedExpr) -> Vec<String> {
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
fn object_types(root: &IdedExpr) -> Vec<String> {
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
fn nesting(root: &IdedExpr) -> (usize, usize) {
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
fn bracket_depth(source: &str) -> usize {
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

impl Expression {
    /// Compiles `source`; the error says why it cannot run.
    pub fn compile(source: &str) -> Result<Self, String> {
        if source.chars().count() > MAX_EXPRESSION_CHARS {
            return Err(format!(
                "compilation failed: the expression is longer than {MAX_EXPRESSION_CHARS} characters"
            ));
        }
        if bracket_depth(source) > MAX_NESTING {
            return Err(format!(
                "compilation failed: the expression nests deeper than {MAX_NESTING} levels"
            ));
        }
        let program = env()
            .compile(source)
            .map_err(|e| format!("compilation failed: {e}"))?;
        let (comprehensions, nodes) = nesting(program.expression());
        if comprehensions > 1 {
            return Err(
                "compilation failed: the expression nests one comprehension in another, whose cost this server does not take"
                    .into(),
            );
        }
        if nodes > MAX_NESTING {
            return Err(format!(
                "compilation failed: the expression nests deeper than {MAX_NESTING} levels"
            ));
        }
        // The `Object` types it builds are declared in an environment of its own (they are
        // resolved when it runs).
        let simple = comprehensions == 0 && constant_cost(program.expression());
        let names = identifiers(program.expression());
        let types = object_types(program.expression());
        if types.is_empty() {
            return Ok(Self {
                program,
                source: source.to_owned(),
                simple,
                names,
                env: env(),
            });
        }
        let mut own = new_env();
        for name in &types {
            own.add_type(AnyStruct::new(name, None))
                .map_err(|e| format!("compilation failed: {e}"))?;
        }
        let program = own
            .compile(source)
            .map_err(|e| format!("compilation failed: {e}"))?;
        Ok(Self {
            program,
            source: source.to_owned(),
            simple,
            names,
            env: Arc::new(own),
        })
    }

    /// Compiled once per text (configurations are read again on every write), on the CEL
    /// threads.
    pub async fn cached(source: &str) -> Result<Arc<Self>, String> {
        type Compiled = Result<Arc<Expression>, String>;
        static CACHE: OnceLock<Mutex<HashMap<String, Compiled>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        if let Ok(cache) = cache.lock()
            && let Some(found) = cache.get(source)
        {
            return found.clone();
        }
        let text = source.to_owned();
        let compiled = on_cel_thread(move || Self::compile(&text).map(Arc::new))
            .await
            .unwrap_or_else(Err);
        if let Ok(mut cache) = cache.lock() {
            // Configurations change rarely; a cache that filled up starts again.
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(source.to_owned(), compiled.clone());
        }
        compiled
    }

    /// Whether it names the identifier `name` (a variable it reads).
    pub fn names(&self, name: &str) -> bool {
        self.names.iter().any(|n| n == name)
    }

    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the expression here with `variables` (name, CEL value).
    fn run(&self, variables: &[(String, cel::Value)]) -> Result<cel::Value, String> {
        let mut context = cel::Context::with_env(self.env.clone());
        for (name, value) in variables {
            context.add_variable_from_value(name.as_str(), value.clone());
        }
        library::reset_budget();
        self.program.execute(&context).map_err(|e| e.to_string())
    }
}

/// A JSON value as CEL reads Kubernetes objects: integers as `int` (JSON has no unsigned
/// numbers; the serde conversion would make positive ones `uint`, which do not mix with
/// `int` literals), other numbers as `double`. Objects are shallow (their depth is bounded
/// where they are written), so this recursion is too.
pub fn to_cel(value: &Value) -> cel::Value {
    match value {
        Value::Null => cel::Value::Null,
        Value::Bool(b) => cel::Value::Bool(*b),
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => cel::Value::Int(i),
            (None, Some(u)) => cel::Value::UInt(u),
            _ => cel::Value::Float(n.as_f64().unwrap_or_default()),
        },
        Value::String(s) => cel::Value::String(Arc::new(s.clone())),
        Value::Array(items) => cel::Value::List(Arc::new(items.iter().map(to_cel).collect())),
        Value::Object(fields) => {
            let map: HashMap<cel::objects::Key, cel::Value> = fields
                .iter()
                .map(|(k, v)| (cel::objects::Key::String(Arc::new(k.clone())), to_cel(v)))
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
    }
}

/// Where a kind's schema says `type: number`: CEL reads those as `double` whatever their JSON
/// looks like (as kube-apiserver types an object by its schema), so `object.spec.height * 2.0`
/// works on a height stored as `1`.
#[derive(Debug, Default)]
pub struct Numbers {
    here: bool,
    fields: HashMap<String, Numbers>,
    /// A list's items, or a map's values (`additionalProperties`).
    items: Option<Box<Numbers>>,
}

/// How deep [`Numbers::from_openapi`] follows a schema (recursive schemas stop there).
const MAX_SCHEMA_DEPTH: usize = 24;

impl Numbers {
    /// From an OpenAPI v3 schema (`$ref`s into `components`, `allOf` wrappers followed).
    pub fn from_openapi(schema: &Value, components: &serde_json::Map<String, Value>) -> Self {
        Self::build(schema, components, 0)
    }

    fn build(schema: &Value, components: &serde_json::Map<String, Value>, depth: usize) -> Self {
        let mut numbers = Numbers::default();
        if depth > MAX_SCHEMA_DEPTH {
            return numbers;
        }
        let mut schema = schema;
        for _ in 0..MAX_SCHEMA_DEPTH {
            if let Some(target) = schema.get("$ref").and_then(Value::as_str) {
                match target
                    .rsplit('/')
                    .next()
                    .and_then(|name| components.get(name))
                {
                    Some(found) => schema = found,
                    None => return numbers,
                }
            } else if let Some(first) = schema.pointer("/allOf/0") {
                schema = first;
            } else {
                break;
            }
        }
        numbers.here = schema.get("type").and_then(Value::as_str) == Some("number");
        if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
            for (name, property) in properties {
                let field = Self::build(property, components, depth + 1);
                if field.matters() {
                    numbers.fields.insert(name.clone(), field);
                }
            }
        }
        for key in ["items", "additionalProperties"] {
            if let Some(inner) = schema.get(key).filter(|v| v.is_object()) {
                let items = Self::build(inner, components, depth + 1);
                if items.matters() {
                    numbers.items = Some(Box::new(items));
                }
            }
        }
        numbers
    }

    /// Whether there is any number here or below.
    fn matters(&self) -> bool {
        self.here || !self.fields.is_empty() || self.items.is_some()
    }
}

/// [`to_cel`], numbers where `numbers` says so read as `double`.
pub fn to_cel_typed(value: &Value, numbers: Option<&Numbers>) -> cel::Value {
    let Some(numbers) = numbers else {
        return to_cel(value);
    };
    match value {
        Value::Number(n) if numbers.here => cel::Value::Float(n.as_f64().unwrap_or_default()),
        Value::Array(items) => cel::Value::List(Arc::new(
            items
                .iter()
                .map(|item| to_cel_typed(item, numbers.items.as_deref()))
                .collect(),
        )),
        Value::Object(fields) => {
            let map: HashMap<cel::objects::Key, cel::Value> = fields
                .iter()
                .map(|(k, v)| {
                    let inner = numbers.fields.get(k).or(numbers.items.as_deref());
                    (
                        cel::objects::Key::String(Arc::new(k.clone())),
                        to_cel_typed(v, inner),
                    )
                })
                .collect();
            cel::Value::Map(cel::objects::Map { map: Arc::new(map) })
        }
        other => to_cel(other),
    }
}

/// How deep the inputs of expressions run on the caller's thread may nest (the interpreter and
/// the conversion recurse once per level).
const INLINE_DEPTH: usize = 32;

/// One variable of a [`Scope`]: a JSON value, numbers typed by `numbers` when given, or a CEL
/// value of its own (`authorizer`).
pub struct Input {
    /// Its name (`object`, `request`...).
    pub name: &'static str,
    /// Its value.
    pub value: Value,
    /// Where its schema has numbers.
    pub numbers: Option<Arc<Numbers>>,
    /// A value that is not JSON (`value` is then null).
    pub native: Option<cel::Value>,
}

impl Input {
    /// A variable whose value is not JSON.
    pub fn native(name: &'static str, value: cel::Value) -> Self {
        Self {
            name,
            value: Value::Null,
            numbers: None,
            native: Some(value),
        }
    }
}

/// A JSON value as CEL's own value, borrowing its strings; objects are [`LazyMap`]s.
/// Recursive: callers bound the depth (see [`within`]).
fn to_val<'v>(value: &'v Value, numbers: Option<&'v Numbers>) -> Box<dyn Val + 'v> {
    use cel::common::types::{CelBool, CelDouble, CelInt, CelList, CelNull, CelUInt};
    match value {
        Value::Null => Box::new(CelNull),
        Value::Bool(b) => Box::new(CelBool::from(*b)),
        Value::Number(n) if numbers.is_some_and(|n| n.here) => {
            Box::new(CelDouble::from(n.as_f64().unwrap_or_default()))
        }
        Value::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Box::new(CelInt::from(i)),
            (None, Some(u)) => Box::new(CelUInt::from(u)),
            _ => Box::new(CelDouble::from(n.as_f64().unwrap_or_default())),
        },
        Value::String(s) => Box::new(CelString::from(s.as_str())),
        Value::Array(items) => {
            let inner = numbers.and_then(|n| n.items.as_deref());
            let items: Vec<Box<dyn Val + 'v>> =
                items.iter().map(|item| to_val(item, inner)).collect();
            Box::new(CelList::from(items))
        }
        Value::Object(fields) => Box::new(LazyMap {
            fields,
            numbers,
            full: std::sync::OnceLock::new(),
        }),
    }
}

/// A JSON object as a CEL map converted as it is read, one level at a time (as kube-apiserver
/// wraps unstructured objects): the first use of the map converts its own entries, its nested
/// objects staying lazy, so a policy reading `object.spec.weight` converts `object` and
/// `spec` and not `metadata.managedFields`. Every use goes through that map, a built-in one,
/// so lazy maps behave as maps everywhere (equality, iteration, `in`, results).
#[derive(Debug)]
struct LazyMap<'v> {
    fields: &'v serde_json::Map<String, Value>,
    numbers: Option<&'v Numbers>,
    full: std::sync::OnceLock<cel::common::types::CelMap<'v>>,
}

impl<'v> LazyMap<'v> {
    fn full(&self) -> &cel::common::types::CelMap<'v> {
        self.full.get_or_init(|| self.convert())
    }

    fn convert(&self) -> cel::common::types::CelMap<'v> {
        use cel::common::types::{CelMap, CelMapKey};
        let mut map: HashMap<CelMapKey<'v>, Box<dyn Val + 'v>> =
            HashMap::with_capacity(self.fields.len());
        for (key, value) in self.fields {
            let inner = self
                .numbers
                .and_then(|n| n.fields.get(key).or(n.items.as_deref()));
            map.insert(CelMapKey::from(key.as_str()), to_val(value, inner));
        }
        CelMap::from(map)
    }
}

impl<'v> Val for LazyMap<'v> {
    fn get_type(&self) -> &cel::common::types::Type {
        Self::cel_type()
    }

    fn cel_type() -> &'static cel::common::types::Type {
        &cel::common::types::MAP_TYPE
    }

    fn as_container(&self) -> Option<&dyn cel::common::traits::Container> {
        self.full().as_container()
    }

    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn cel::common::traits::Indexer + 'w)>
    where
        Self: 'w,
    {
        self.full().as_indexer()
    }

    fn into_indexer<'w>(self: Box<Self>) -> Option<Box<dyn cel::common::traits::Indexer + 'w>>
    where
        Self: 'w,
    {
        let mut lazy = *self;
        let full = lazy.full.take().unwrap_or_else(|| lazy.convert());
        Box::new(full).into_indexer()
    }

    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn cel::common::traits::Iterable + 'w)>
    where
        Self: 'w,
    {
        self.full().as_iterable()
    }

    fn as_sizer(&self) -> Option<&dyn cel::common::traits::Sizer> {
        self.full().as_sizer()
    }

    fn as_zeroer(&self) -> Option<&dyn cel::common::traits::Zeroer> {
        self.full().as_zeroer()
    }

    fn equals(&self, other: &dyn Val) -> bool {
        self.full().equals(other)
    }

    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(LazyMap {
            fields: self.fields,
            numbers: self.numbers,
            full: std::sync::OnceLock::new(),
        })
    }

    fn as_builtin<'b, 'w>(&'b self) -> cel::common::value::BuiltinRef<'b, 'w>
    where
        Self: 'w,
    {
        cel::common::value::BuiltinRef::Map(self.full())
    }

    fn into_builtin<'w>(self: Box<Self>) -> Option<cel::common::value::Builtin<'w>>
    where
        Self: 'w,
    {
        let mut lazy = *self;
        let full = lazy.full.take().unwrap_or_else(|| lazy.convert());
        Some(cel::common::value::Builtin::Map(full))
    }
}

/// Whether `value` nests at most `limit` levels: recursive, but never deeper than `limit`.
fn shallow(value: &Value, limit: usize) -> bool {
    match value {
        Value::Array(items) => limit > 0 && items.iter().all(|v| shallow(v, limit - 1)),
        Value::Object(fields) => limit > 0 && fields.values().all(|v| shallow(v, limit - 1)),
        _ => true,
    }
}

/// Expressions run against one set of variables, converted once (kube-apiserver's activation).
pub struct Scope<'v> {
    inputs: &'v [Input],
    /// Variables set later (a policy's `variables`), owned.
    later: Vec<(String, cel::Value)>,
    /// The base environment's context.
    context: cel::Context<'v, 'v>,
}

impl<'v> Scope<'v> {
    fn new(inputs: &'v [Input]) -> Self {
        Self {
            inputs,
            later: Vec::new(),
            context: Self::context(env(), inputs, &[]),
        }
    }

    fn context(
        env: Arc<cel::Env>,
        inputs: &'v [Input],
        later: &[(String, cel::Value)],
    ) -> cel::Context<'v, 'v> {
        let mut context = cel::Context::with_env(env);
        for input in inputs {
            match &input.native {
                Some(native) => context.add_variable_from_value(input.name, native.clone()),
                None => context.add_variable_as_val(
                    input.name,
                    to_val(&input.value, input.numbers.as_deref()),
                ),
            }
        }
        for (name, value) in later {
            context.add_variable_from_value(name.as_str(), value.clone());
        }
        context
    }

    /// Sets (or replaces) the variable `name` to a CEL value (a policy's `variables` keep
    /// their CEL types: quantities, typed numbers).
    pub fn set(&mut self, name: &str, value: cel::Value) {
        self.context.add_variable_from_value(name, value.clone());
        self.later.retain(|(n, _)| n != name);
        self.later.push((name.to_owned(), value));
    }

    /// Runs `expression`; its result as JSON. The error names it, as kube-apiserver's do.
    pub fn run(&self, expression: &Expression) -> Result<Value, String> {
        self.evaluate(expression).and_then(|v| {
            to_json(&v)
                .map_err(|e| format!("expression '{}' resulted in error: {e}", expression.source))
        })
    }

    /// Runs `expression`; its result as a CEL value.
    pub fn evaluate(&self, expression: &Expression) -> Result<cel::Value, String> {
        library::reset_budget();
        let result = if Arc::ptr_eq(&expression.env, &env()) {
            expression.program.execute(&self.context)
        } else {
            // An expression that builds Object types has an environment of its own.
            let context = Self::context(expression.env.clone(), self.inputs, &self.later);
            expression.program.execute(&context)
        };
        result.map_err(|e| format!("expression '{}' resulted in error: {e}", expression.source))
    }
}

/// Runs `work` with a [`Scope`] of `inputs`: on the caller's thread when every one of
/// `expressions` is free of comprehensions and the inputs are shallow (their cost is then
/// bounded by their size, as a thread hop would cost more than they do), else on the CEL
/// threads, waiting at most [`BUDGET`].
pub async fn within<T: Send + 'static>(
    expressions: &[Arc<Expression>],
    inputs: Vec<Input>,
    work: impl FnOnce(&mut Scope<'_>) -> T + Send + 'static,
) -> Result<T, String> {
    let inline = expressions.iter().all(|e| e.simple)
        && inputs.iter().all(|i| shallow(&i.value, INLINE_DEPTH));
    if inline {
        let mut scope = Scope::new(&inputs);
        return Ok(work(&mut scope));
    }
    let job = on_cel_thread(move || {
        let mut scope = Scope::new(&inputs);
        work(&mut scope)
    });
    match tokio::time::timeout(BUDGET, job).await {
        Ok(done) => done,
        Err(_) => Err("operation cancelled: the evaluation took longer than its budget".into()),
    }
}

/// The threads CEL runs on: compiling and evaluating recurse, so they get large stacks.
fn on_cel_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> impl std::future::Future<Output = Result<T, String>> {
    type Job = Box<dyn FnOnce() + Send>;
    static QUEUE: OnceLock<std::sync::mpsc::SyncSender<Job>> = OnceLock::new();
    let queue = QUEUE.get_or_init(|| {
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Job>(256);
        let receiver = Arc::new(Mutex::new(receiver));
        for index in 0..THREADS {
            let receiver = receiver.clone();
            let _ = std::thread::Builder::new()
                .name(format!("cel-{index}"))
                .stack_size(STACK_BYTES)
                .spawn(move || {
                    loop {
                        let job = match receiver.lock() {
                            Ok(queue) => queue.recv(),
                            Err(_) => return,
                        };
                        match job {
                            Ok(job) => job(),
                            Err(_) => return,
                        }
                    }
                });
        }
        sender
    });
    let (reply, answer) = tokio::sync::oneshot::channel();
    let sent = queue.try_send(Box::new(move || {
        let _ = reply.send(work());
    }));
    async move {
        if sent.is_err() {
            return Err("too many CEL evaluations waiting".to_owned());
        }
        answer
            .await
            .map_err(|_| "the CEL evaluation failed".to_owned())
    }
}

/// Runs `expressions` in order with `variables`, on the CEL threads, waiting at most
/// [`BUDGET`] in all; each result is the expression's value as JSON, or why it has none.
pub async fn evaluate(
    expressions: Vec<Arc<Expression>>,
    variables: Vec<(String, cel::Value)>,
) -> Vec<Result<Value, String>> {
    let count = expressions.len();
    let work = on_cel_thread(move || {
        expressions
            .iter()
            .map(|e| e.run(&variables).and_then(|v| to_json(&v)))
            .collect::<Vec<_>>()
    });
    match tokio::time::timeout(BUDGET, work).await {
        Ok(Ok(results)) => results,
        Ok(Err(error)) => vec![Err(error); count],
        Err(_) => {
            vec![
                Err("operation cancelled: the evaluation took longer than its budget".to_owned());
                count
            ]
        }
    }
}

/// A CEL value as JSON (what a message expression or a bool comes back as; an apply
/// configuration or JSON patch a mutation builds). The `Object` types must be named for
/// their place (`Object.spec` under `spec`), as kube-apiserver checks them. Values are as
/// deep as their expression nests, which is bounded: this recursion is too.
fn to_json(value: &cel::Value) -> Result<Value, String> {
    let mut budget = MAX_RESULT_NODES;
    to_json_at(value, None, &mut budget, 0)
}

/// The most a policy's variable may hold, about (8 bytes a value, and its strings' bytes):
/// variables built from variables could otherwise double at each step.
const MAX_VARIABLE_BYTES: usize = 8 << 20;

/// Whether `value` holds at most [`MAX_VARIABLE_BYTES`]; the walk stops at the bound.
pub fn within_variable_bound(value: &cel::Value) -> bool {
    fn walk(value: &cel::Value, left: &mut usize, depth: usize) -> bool {
        let own = match value {
            cel::Value::String(s) => 8 + s.len(),
            cel::Value::Bytes(b) => 8 + b.len(),
            _ => 8,
        };
        if own > *left || depth > MAX_RESULT_DEPTH {
            return false;
        }
        *left -= own;
        match value {
            cel::Value::List(items) => items.iter().all(|item| walk(item, left, depth + 1)),
            cel::Value::Map(map) => map.map.values().all(|item| walk(item, left, depth + 1)),
            _ => true,
        }
    }
    let mut left = MAX_VARIABLE_BYTES;
    walk(value, &mut left, 0)
}

/// The most values a result may hold, and how deep it may nest (CEL values share their
/// parts, so a small expression can describe a result too large to write out).
const MAX_RESULT_NODES: usize = 100_000;
const MAX_RESULT_DEPTH: usize = 64;

/// `path`: the type name an `Object` struct here must have (None: outside any).
fn to_json_at(
    value: &cel::Value,
    path: Option<&str>,
    budget: &mut usize,
    depth: usize,
) -> Result<Value, String> {
    if *budget == 0 || depth > MAX_RESULT_DEPTH {
        return Err(format!(
            "the result holds more than {MAX_RESULT_NODES} values or nests deeper than {MAX_RESULT_DEPTH} levels"
        ));
    }
    *budget -= 1;
    Ok(match value {
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::Null => Value::Null,
        cel::Value::List(items) => Value::Array(
            items
                .iter()
                .map(|item| to_json_at(item, path, budget, depth + 1))
                .collect::<Result<_, _>>()?,
        ),
        cel::Value::Map(map) => Value::Object(
            map.map
                .iter()
                .map(|(key, value)| {
                    let key = match key {
                        cel::objects::Key::String(s) => s.to_string(),
                        cel::objects::Key::Int(i) => i.to_string(),
                        cel::objects::Key::Uint(u) => u.to_string(),
                        cel::objects::Key::Bool(b) => b.to_string(),
                    };
                    Ok((key, to_json_at(value, path, budget, depth + 1)?))
                })
                .collect::<Result<_, String>>()?,
        ),
        cel::Value::Struct(s) => {
            let name = s.name();
            let own = if name == OBJECT || name.starts_with("Object.") {
                let expected = path.unwrap_or(name);
                if name != expected {
                    return Err(format!(
                        "type mismatch: unexpected type name {name:?}, expected {expected:?}, which matches field name path from root Object type"
                    ));
                }
                Some(name)
            } else {
                None
            };
            let mut fields = serde_json::Map::new();
            for (field, value) in s.field_values() {
                let value = cel::Value::try_from(value.as_ref()).map_err(|e| e.to_string())?;
                let path = own.map(|own| format!("{own}.{field}"));
                fields.insert(
                    field,
                    to_json_at(&value, path.as_deref(), budget, depth + 1)?,
                );
            }
            Value::Object(fields)
        }
        other => Value::String(format!("{other:?}")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(source: &str, object: &Value) -> Result<cel::Value, String> {
        Expression::compile(source)?.run(&[("object".to_owned(), to_cel(object))])
    }

    #[test]
    fn expressions_over_objects() {
        let object = json!({"metadata": {"name": "dolly", "labels": {"team": "a"}}, "spec": {"weight": 500.0, "height": 1}});
        for source in [
            "object.spec.weight > 100",
            "object.spec.height == 1",
            "object.metadata.name.startsWith('dol')",
            "has(object.metadata.labels) && object.metadata.labels.team == 'a'",
            "'team' in object.metadata.labels",
            "object.metadata.labels.all(k, k.size() < 10)",
            "object.metadata.name.matches('^d.*y$')",
            "object.metadata.name.lowerAscii() == 'dolly'",
            // JSON integers are ints: they mix with int literals.
            "object.spec.height + 1 == 2",
            "size(object.metadata.labels) * 2 == object.spec.height * 2",
        ] {
            assert_eq!(run(source, &object), Ok(cel::Value::Bool(true)), "{source}");
        }
        assert!(run("object.spec.nothing > 1", &object).is_err());
        assert!(Expression::compile("object.spec.weight >").is_err());
    }

    #[test]
    fn nested_comprehensions_and_long_texts_are_refused() {
        assert!(Expression::compile("[1, 2].all(x, [3].exists(y, x < y))").is_err());
        assert!(Expression::compile("[1, 2].all(x, x > 0) && [3].exists(y, y > 2)").is_ok());
        assert!(Expression::compile(&"1 + ".repeat(2000).to_string()).is_err());
        assert!(Expression::compile(&format!("{}1{}", "(".repeat(100), ")".repeat(100))).is_err());
        assert!(Expression::compile(&format!("{}1{}", "(".repeat(10), ")".repeat(10))).is_ok());
        // A long chain of operators nests its syntax tree.
        assert!(Expression::compile(&format!("1{}", " + 1".repeat(200))).is_err());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evaluation_is_bounded_in_time() {
        let object = json!({"items": (0..300_000).collect::<Vec<_>>()});
        let slow = Arc::new(Expression::compile("object.items.map(x, x + 1).size() > 0").unwrap());
        let started = std::time::Instant::now();
        let results = evaluate(vec![slow], vec![("object".into(), to_cel(&object))]).await;
        assert!(started.elapsed() < BUDGET + Duration::from_millis(200));
        assert!(results[0].is_err() || results[0] == Ok(json!(true)));
    }

    #[test]
    fn mutations_build_objects_and_json_patches() {
        let object = json!({"spec": {"height": 1}});
        let built = |source: &str| {
            let expression = Expression::compile(source)?;
            to_json(&expression.run(&[("object".to_owned(), to_cel(&object))])?)
        };
        assert_eq!(
            built(
                "Object{metadata: Object.metadata{labels: {'a': 'b'}}, spec: Object.spec{height: 2}}"
            ),
            Ok(json!({"metadata": {"labels": {"a": "b"}}, "spec": {"height": 2}}))
        );
        // Types must be named for their place.
        let mismatch = built("Object{spec: Object.metadata{}}").unwrap_err();
        assert!(mismatch.contains("expected \"Object.spec\""), "{mismatch}");
        assert_eq!(
            built(
                "[JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('a/b~c'), value: 'x'}]"
            ),
            Ok(json!([{"op": "add", "path": "/metadata/labels/a~1b~0c", "value": "x"}]))
        );
        assert!(built("JSONPatch{op: 'add', nothing: 1}").is_err());
    }

    #[test]
    fn numbers_follow_the_schema() {
        let components = serde_json::Map::from_iter([(
            "Spec".to_owned(),
            json!({"properties": {"height": {"type": "number"}, "count": {"type": "integer"},
                   "sizes": {"items": {"type": "number"}}}}),
        )]);
        let schema =
            json!({"properties": {"spec": {"allOf": [{"$ref": "#/components/schemas/Spec"}]}}});
        let numbers = Numbers::from_openapi(&schema, &components);
        let object = json!({"spec": {"height": 1, "count": 2, "sizes": [3, 4.5]}});
        let typed = to_cel_typed(&object, Some(&numbers));
        let run = |source: &str| {
            Expression::compile(source)
                .unwrap()
                .run(&[("object".to_owned(), typed.clone())])
        };
        assert_eq!(
            run("object.spec.height * 2.0 == 2.0"),
            Ok(cel::Value::Bool(true))
        );
        assert_eq!(
            run("object.spec.count + 1 == 3"),
            Ok(cel::Value::Bool(true))
        );
        assert_eq!(
            run("object.spec.sizes[0] + 0.5 == 3.5"),
            Ok(cel::Value::Bool(true))
        );
    }

    #[test]
    fn lazily_converted_objects_behave_as_maps() {
        let object = json!({"metadata": {"name": "dolly", "labels": {"a": "b"}, "managedFields": [{"manager": "m"}]},
                            "spec": {"weight": 5, "tags": ["x", "y"]}});
        let inputs = vec![
            Input {
                name: "object",
                value: object.clone(),
                numbers: None,
                native: None,
            },
            Input {
                name: "oldObject",
                value: object.clone(),
                numbers: None,
                native: None,
            },
        ];
        let scope = Scope::new(&inputs);
        let run = |source: &str| scope.run(&Expression::compile(source).unwrap());
        for source in [
            "object.metadata.name == 'dolly'",
            "has(object.metadata.labels) && !has(object.metadata.annotations)",
            "'a' in object.metadata.labels && !('z' in object.metadata.labels)",
            "size(object.metadata.labels) == 1 && size(object) == 2",
            "object.metadata.labels.all(k, object.metadata.labels[k] == 'b')",
            "object.spec.tags.exists(t, t == 'y')",
            "object == oldObject && object.metadata == oldObject.metadata",
            "object.metadata.labels == {'a': 'b'}",
            "{'a': 'b'} == object.metadata.labels",
            "object.metadata.managedFields[0].manager == 'm'",
            "object.spec.weight + 1 == 6",
            "[object.metadata.labels].size() == 1",
        ] {
            assert_eq!(run(source), Ok(json!(true)), "{source}");
        }
        assert_eq!(run("object.metadata.labels"), Ok(json!({"a": "b"})));
        assert_eq!(run("object.spec"), Ok(object["spec"].clone()));
        assert!(run("object.metadata.nothing == 1").is_err());
        assert_eq!(
            run("object.metadata.?nothing.orValue('none')"),
            Ok(json!("none"))
        );
    }

    #[test]
    fn only_constant_cost_expressions_may_run_inline() {
        for (source, simple) in [
            (
                "object.spec.weight <= 1000.0 && has(object.metadata.labels)",
                true,
            ),
            (
                "'a' in object.metadata.labels && object.metadata.name.startsWith('d')",
                true,
            ),
            ("'ab'.replace('', 'ab')", false),
            ("object.metadata.name + 'x' == 'y'", false),
            ("[1, 2].all(x, x > 0)", false),
        ] {
            assert_eq!(
                Expression::compile(source).unwrap().simple,
                simple,
                "{source}"
            );
        }
        // A result too large to write out is an error, not a memory bomb.
        let doubled = format!("{}1{}", "[".repeat(70), "]".repeat(70));
        assert!(
            Expression::compile(&doubled).is_err()
                || to_json(&Expression::compile(&doubled).unwrap().run(&[]).unwrap()).is_err()
        );
    }

    #[test]
    fn values_come_back_as_json() {
        let labels = json!({"a": "b", "n": 3});
        let value = Expression::compile("object")
            .unwrap()
            .run(&[("object".to_owned(), to_cel(&labels))])
            .unwrap();
        assert_eq!(to_json(&value), Ok(labels));
    }
}
