//! CEL for admission (webhooks' `matchConditions` and the policies): expressions compiled once
//! per text (their syntax judged by `syntax`), over JSON values converted by `values`, with
//! the standard library, the strings and lists extensions, Kubernetes' regex and lists
//! libraries (`library`), its quantity, url and authorizer libraries (`quantity`, `url`,
//! `authz`), and what MutatingAdmissionPolicy adds: `Object` types to build an apply configuration with (any
//! `Object.<field path>` an expression names), `JSONPatch` and `jsonpatch.escapeKey`.
//!
//! kube-apiserver bounds what an expression may cost (an estimate refused when the policy is
//! loaded, a budget while it runs). The cel crate has neither, so here: an expression with a
//! comprehension runs charging kube-apiserver's cost limits (`cost`: 1,000,000 per
//! evaluation, 10,000,000 per policy); an expression nesting deeper than `MAX_NESTING` is
//! refused; it is compiled and run on one of `THREADS` threads of its own with a large
//! stack, never on an async worker; and a caller waits at most [`BUDGET`], past which the
//! evaluation is an error that the caller's failure policy judges (and the meter stops it).
//! What could take memory without end outside a comprehension is bounded with
//! kube-apiserver's "actual cost limit exceeded": `replace` (8 MiB made per evaluation,
//! `library`) and a policy's variables (8 MiB each, [`within_variable_bound`]).

mod authz;
pub(crate) mod cost;
pub use authz::{Asked, Checker, Decision, authorizer, request_resource};
pub use cost::RUNTIME_BUDGET;
mod library;
mod quantity;
mod syntax;
mod url;
mod values;
use syntax::{bracket_depth, constant_cost, fields_of, identifiers, nesting, object_types};
pub use values::{Input, Numbers, to_cel, to_cel_typed, within_variable_bound};
use values::{shallow, to_json, to_val};

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use cel::common::types::CelString;
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
    /// No comprehension, only [`syntax::CONSTANT_COST`] calls: its cost is bounded by its size and
    /// its inputs', so it may run on the caller's thread (see [`within`]).
    simple: bool,
    /// The identifiers it names (its variables among them).
    names: Vec<String>,
    /// The policy variables it reads (`variables.<name>`); None: any of them.
    variables: Option<Vec<String>>,
    /// The top-level fields of `object` and `oldObject` it reads (`object.spec.weight` →
    /// `spec`); None: it may read them whole.
    object_fields: Option<Vec<String>>,
    /// With a comprehension: the syntax tree that charges the cost meter as it runs
    /// ([`cost::instrument`]), run instead of the program's.
    metered: Option<cel::common::ast::IdedExpr>,
    /// What it runs in: [`env()`], or one that also declares the `Object` types it builds.
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
    let _ = cost::add(&mut env);
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
        if nodes > MAX_NESTING {
            return Err(format!(
                "compilation failed: the expression nests deeper than {MAX_NESTING} levels"
            ));
        }
        // The `Object` types it builds are declared in an environment of its own (they are
        // resolved when it runs).
        let simple = comprehensions == 0 && constant_cost(program.expression());
        let names = identifiers(program.expression());
        let variables = fields_of(program.expression(), "variables");
        let object_fields = fields_of(program.expression(), "object").and_then(|mut fields| {
            for field in fields_of(program.expression(), "oldObject")? {
                if !fields.contains(&field) {
                    fields.push(field);
                }
            }
            Some(fields)
        });
        let types = object_types(program.expression());
        let (program, env) = if types.is_empty() {
            (program, env())
        } else {
            let mut own = new_env();
            for name in &types {
                own.add_type(AnyStruct::new(name, None))
                    .map_err(|e| format!("compilation failed: {e}"))?;
            }
            let program = own
                .compile(source)
                .map_err(|e| format!("compilation failed: {e}"))?;
            (program, Arc::new(own))
        };
        let metered = cost::instrument(program.expression());
        Ok(Self {
            program,
            source: source.to_owned(),
            simple,
            names,
            variables,
            object_fields,
            metered,
            env,
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

    /// The top-level fields of `object` and `oldObject` it may read; None: any.
    pub fn object_fields(&self) -> Option<&[String]> {
        self.object_fields.as_deref()
    }

    /// Whether it may read the policy variable `name`.
    pub fn reads_variable(&self, name: &str) -> bool {
        self.variables
            .as_ref()
            .is_none_or(|read| read.iter().any(|n| n == name))
    }

    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the expression here with `variables` (name, CEL value).
    #[cfg(test)]
    fn run(&self, variables: &[(String, cel::Value)]) -> Result<cel::Value, String> {
        self.run_until(variables, None)
    }

    /// Runs the expression here with `variables` (name, CEL value), until `deadline`.
    fn run_until(
        &self,
        variables: &[(String, cel::Value)],
        deadline: Option<Instant>,
    ) -> Result<cel::Value, String> {
        let mut context = cel::Context::with_env(self.env.clone());
        for (name, value) in variables {
            context.add_variable_from_value(name.as_str(), value.clone());
        }
        self.execute(&context, cost::PER_CALL_LIMIT, deadline)
            .0
            .map_err(|e| e.to_string())
    }

    /// Executes the expression in `context`, metered when it has a comprehension: its value
    /// (or why it has none: past `limit` or `deadline`, always the meter's error), and what
    /// it cost.
    fn execute(
        &self,
        context: &cel::Context<'_, '_>,
        limit: u64,
        deadline: Option<Instant>,
    ) -> (Result<cel::Value, Failure>, u64) {
        library::reset_budget();
        let Some(metered) = &self.metered else {
            return (self.program.execute(context).map_err(Failure::Cel), 0);
        };
        cost::start(limit, deadline);
        let result = cel::Value::resolve(metered, context);
        let (spent, stopped) = cost::reading();
        match stopped {
            Some(stopped) => (Err(Failure::Stopped(stopped)), spent),
            None => (result.map_err(Failure::Cel), spent),
        }
    }
}

/// Why an evaluation has no value.
#[derive(Debug)]
enum Failure {
    /// The expression's own error.
    Cel(cel::ExecutionError),
    /// The cost meter stopped it.
    Stopped(cost::Stopped),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cel(e) => e.fmt(f),
            Self::Stopped(stopped) => f.write_str(stopped.text()),
        }
    }
}

/// How deep the inputs of expressions run on the caller's thread may nest (the interpreter and
/// the conversion recurse once per level).
const INLINE_DEPTH: usize = 32;

/// Expressions run against one set of variables, converted once (kube-apiserver's activation).
pub struct Scope<'v> {
    inputs: &'v [Input],
    /// Variables set later (a policy's `variables`), owned.
    later: Vec<(String, cel::Value)>,
    /// The base environment's context.
    context: cel::Context<'v, 'v>,
    /// What the expressions run in this scope may still cost (kube-apiserver's runtime
    /// budget of one policy).
    remaining: u64,
    /// When evaluations stop (on the CEL threads).
    deadline: Option<Instant>,
}

impl<'v> Scope<'v> {
    fn new(inputs: &'v [Input], deadline: Option<Instant>) -> Self {
        Self {
            inputs,
            later: Vec::new(),
            context: Self::context(env(), inputs, &[]),
            remaining: RUNTIME_BUDGET,
            deadline,
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
    pub fn run(&mut self, expression: &Expression) -> Result<Value, String> {
        self.evaluate(expression).and_then(|v| {
            to_json(&v)
                .map_err(|e| format!("expression '{}' resulted in error: {e}", expression.source))
        })
    }

    /// Runs `expression`; its result as a CEL value. Its cost is charged to the scope's
    /// budget: once spent, kube-apiserver's error.
    pub fn evaluate(&mut self, expression: &Expression) -> Result<cel::Value, String> {
        let limit = cost::PER_CALL_LIMIT.min(self.remaining);
        let (result, spent) = if Arc::ptr_eq(&expression.env, &env()) {
            expression.execute(&self.context, limit, self.deadline)
        } else {
            // An expression that builds Object types has an environment of its own.
            let context = Self::context(expression.env.clone(), self.inputs, &self.later);
            expression.execute(&context, limit, self.deadline)
        };
        self.remaining = self.remaining.saturating_sub(spent);
        result.map_err(|e| match e {
            Failure::Stopped(cost::Stopped::Limit) if limit < cost::PER_CALL_LIMIT => {
                "validation failed due to running out of cost budget, no further validation rules will be run".to_owned()
            }
            e => format!("expression '{}' resulted in error: {e}", expression.source),
        })
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
        let mut scope = Scope::new(&inputs, None);
        return Ok(work(&mut scope));
    }
    let deadline = Instant::now() + BUDGET;
    let job = on_cel_thread(move || {
        let mut scope = Scope::new(&inputs, Some(deadline));
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
    let deadline = Instant::now() + BUDGET;
    let work = on_cel_thread(move || {
        expressions
            .iter()
            .map(|e| {
                e.run_until(&variables, Some(deadline))
                    .and_then(|v| to_json(&v))
            })
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

#[cfg(test)]
mod tests;
