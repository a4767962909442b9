//! CEL for admission (webhooks' `matchConditions`, and policies to come): expressions compiled
//! once per text, with the standard library and the strings and lists extensions.
//!
//! kube-apiserver bounds what an expression may cost (an estimate refused when the policy is
//! loaded, a budget while it runs). Here an expression is refused when it nests one
//! comprehension (`all`, `exists`, `map`, `filter`) in another, so its work grows at most with
//! the size of what it reads, and it runs on a blocking thread for at most [`BUDGET`]
//! (at most [`THREADS`] at once): past it the evaluation is an error, which the caller's
//! failure policy judges, and no async worker waits on it.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, OnceLock},
    time::Duration,
};

use cel::common::ast::{EntryExpr, Expr, IdedExpr};
use serde_json::Value;

/// The longest expression taken.
const MAX_EXPRESSION_CHARS: usize = 5 * 1024;
/// What one evaluation may take.
pub const BUDGET: Duration = Duration::from_millis(250);
/// Evaluations running at once; more wait.
const THREADS: usize = 2;

/// An expression ready to run.
pub struct Expression {
    program: cel::Program,
    source: String,
}

fn env() -> Arc<cel::Env> {
    static ENV: OnceLock<Arc<cel::Env>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = cel::Env::stdlib();
        let _ = env.add_extension(cel::extensions::strings);
        let _ = env.add_extension(cel::extensions::lists);
        Arc::new(env)
    })
    .clone()
}

/// The deepest nesting of comprehensions in `root`, walked without recursion.
fn comprehension_depth(root: &IdedExpr) -> usize {
    let mut deepest = 0;
    let mut stack: Vec<(&IdedExpr, usize)> = vec![(root, 0)];
    while let Some((node, depth)) = stack.pop() {
        let mut children: Vec<&IdedExpr> = Vec::new();
        match &node.expr {
            Expr::Comprehension(c) => {
                let inner = depth + 1;
                deepest = deepest.max(inner);
                stack.push((&c.iter_range, depth));
                stack.push((&c.accu_init, depth));
                for part in [&c.loop_cond, &c.loop_step, &c.result] {
                    stack.push((part, inner));
                }
            }
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
        stack.extend(children.into_iter().map(|child| (child, depth)));
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
        let program = env()
            .compile(source)
            .map_err(|e| format!("compilation failed: {e}"))?;
        if comprehension_depth(program.expression()) > 1 {
            return Err(
                "compilation failed: the expression nests one comprehension in another, whose cost this server does not take"
                    .into(),
            );
        }
        Ok(Self {
            program,
            source: source.to_owned(),
        })
    }

    /// Compiled once per text: configurations are read again on every write.
    pub fn cached(source: &str) -> Result<Arc<Self>, String> {
        type Compiled = Result<Arc<Expression>, String>;
        static CACHE: OnceLock<Mutex<HashMap<String, Compiled>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Mutex::default);
        if let Ok(cache) = cache.lock()
            && let Some(found) = cache.get(source)
        {
            return found.clone();
        }
        let compiled = Self::compile(source).map(Arc::new);
        if let Ok(mut cache) = cache.lock() {
            // Configurations change rarely; a cache that filled up starts again.
            if cache.len() > 10_000 {
                cache.clear();
            }
            cache.insert(source.to_owned(), compiled.clone());
        }
        compiled
    }

    /// The expression's text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Runs the expression here with `variables` (name, JSON value).
    fn run(&self, variables: &[(String, Value)]) -> Result<cel::Value, String> {
        let mut context = cel::Context::with_env(env());
        for (name, value) in variables {
            let value = cel::to_value(value).map_err(|e| e.to_string())?;
            context.add_variable_from_value(name.as_str(), value);
        }
        self.program.execute(&context).map_err(|e| e.to_string())
    }
}

/// Runs `expressions` in order with `variables`, off the async workers and within [`BUDGET`]
/// in all; each result is the expression's value as JSON, or why it has none.
pub async fn evaluate(
    expressions: Vec<Arc<Expression>>,
    variables: Vec<(String, Value)>,
) -> Vec<Result<Value, String>> {
    static SLOTS: OnceLock<Arc<tokio::sync::Semaphore>> = OnceLock::new();
    let slots = SLOTS
        .get_or_init(|| Arc::new(tokio::sync::Semaphore::new(THREADS)))
        .clone();
    let count = expressions.len();
    let over = || {
        vec![Err("operation cancelled: evaluation took longer than its budget".to_owned()); count]
    };
    let work = async move {
        let Ok(slot) = slots.acquire_owned().await else {
            return over();
        };
        let running = tokio::task::spawn_blocking(move || {
            let _slot = slot;
            expressions
                .iter()
                .map(|e| e.run(&variables).map(|v| to_json(&v)))
                .collect::<Vec<_>>()
        });
        running.await.unwrap_or_else(|_| over())
    };
    tokio::time::timeout(BUDGET, work)
        .await
        .unwrap_or_else(|_| over())
}

/// A CEL value as JSON (what a message expression or a bool comes back as).
fn to_json(value: &cel::Value) -> Value {
    match value {
        cel::Value::Bool(b) => Value::Bool(*b),
        cel::Value::Int(i) => Value::from(*i),
        cel::Value::UInt(u) => Value::from(*u),
        cel::Value::Float(f) => serde_json::Number::from_f64(*f).map_or(Value::Null, Value::Number),
        cel::Value::String(s) => Value::String(s.to_string()),
        cel::Value::Null => Value::Null,
        cel::Value::List(items) => Value::Array(items.iter().map(to_json).collect()),
        other => Value::String(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run(source: &str, object: &Value) -> Result<cel::Value, String> {
        Expression::compile(source)?.run(&[("object".to_owned(), object.clone())])
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
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn evaluation_is_bounded_in_time() {
        let object = json!({"items": (0..300_000).collect::<Vec<_>>()});
        let slow = Arc::new(Expression::compile("object.items.map(x, x + 1).size() > 0").unwrap());
        let started = std::time::Instant::now();
        let results = evaluate(vec![slow], vec![("object".into(), object)]).await;
        assert!(started.elapsed() < BUDGET + Duration::from_millis(200));
        assert!(results[0].is_err() || results[0] == Ok(json!(true)));
    }
}
