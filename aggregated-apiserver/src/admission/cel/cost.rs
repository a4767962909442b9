//! kube-apiserver's runtime cost limit, inside the interpreter. The cel crate has no cost
//! tracker, so an expression with a comprehension is run from a rewritten syntax tree that
//! charges a meter as it goes ([`instrument`]):
//! - every iteration of a comprehension costs the nodes of its body (cel-go charges about
//!   one per node evaluated);
//! - in a body, what a call reads costs its size (a string a tenth of its length, a list
//!   its length: cel-go's traversal factors), and what `map` makes costs its size;
//! - past [`PER_CALL_LIMIT`] (kube-apiserver's `PerCallLimit`) the evaluation stops with
//!   cel-go's "operation cancelled: actual cost limit exceeded": the comprehension's next
//!   iteration does not run, and whatever the expression would have made of the error, it
//!   fails;
//! - the meter also reads the clock every [`CLOCK_EVERY`] charges, so an evaluation past
//!   its deadline stops too (an interpreter that cannot be interrupted otherwise keeps its
//!   thread).
//!
//! Outside comprehensions an expression's cost is bounded by its size and its inputs'.

use std::{cell::Cell, time::Instant};

use cel::{
    Env, ExecutionError,
    common::{
        ast::{ComprehensionExpr, EntryExpr, Expr, IdedExpr, operators},
        types::{CelBool, CelBytes, CelInt, CelList, CelString, DYN_TYPE, INT_TYPE},
        value::{CowVal, Val},
    },
};

use super::syntax::nodes;

/// kube-apiserver's `celconfig.PerCallLimit`: what one evaluation may cost.
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// kube-apiserver's `celconfig.RuntimeCELCostBudget`: what all the expressions of one policy
/// may cost in one admission.
pub const RUNTIME_BUDGET: u64 = 10_000_000;
/// How many charges pass between two readings of the clock.
const CLOCK_EVERY: u32 = 1024;

/// cel-go's text for an evaluation past its limit.
pub const LIMIT_EXCEEDED: &str = "operation cancelled: actual cost limit exceeded";
/// The text for an evaluation past its deadline.
pub const DEADLINE_EXCEEDED: &str =
    "operation cancelled: the evaluation took longer than its budget";

/// The function charging each iteration: `@cost(value, nodes)` charges `nodes` and what
/// `value` holds, and is `value`.
const CHARGE: &str = "@cost";
/// The function charging each iteration through a comprehension's condition:
/// `@continue(condition, nodes)` charges `nodes` and is false once the meter is spent.
const CONTINUE: &str = "@continue";

/// Why an evaluation was stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    Limit,
    Deadline,
}

impl Stopped {
    pub fn text(self) -> &'static str {
        match self {
            Self::Limit => LIMIT_EXCEEDED,
            Self::Deadline => DEADLINE_EXCEEDED,
        }
    }
}

#[derive(Clone, Copy)]
struct Meter {
    spent: u64,
    limit: u64,
    deadline: Option<Instant>,
    until_clock: u32,
    stopped: Option<Stopped>,
}

thread_local! {
    static METER: Cell<Meter> = const { Cell::new(Meter {
        spent: 0,
        limit: PER_CALL_LIMIT,
        deadline: None,
        until_clock: CLOCK_EVERY,
        stopped: None,
    }) };
}

/// Starts this thread's meter for one evaluation that may cost `limit`, until `deadline`.
pub fn start(limit: u64, deadline: Option<Instant>) {
    METER.with(|m| {
        m.set(Meter {
            spent: 0,
            limit,
            deadline,
            until_clock: CLOCK_EVERY,
            stopped: None,
        })
    });
}

/// What the evaluation cost so far, and why it was stopped, if it was.
pub fn reading() -> (u64, Option<Stopped>) {
    METER.with(|m| {
        let meter = m.get();
        (meter.spent, meter.stopped)
    })
}

/// Charges `cost`; false once the meter is spent (and from then on).
fn charge(cost: u64) -> bool {
    METER.with(|m| {
        let mut meter = m.get();
        if meter.stopped.is_none() {
            meter.spent = meter.spent.saturating_add(cost);
            if meter.spent > meter.limit {
                meter.stopped = Some(Stopped::Limit);
            }
            meter.until_clock = meter.until_clock.saturating_sub(1);
            if meter.until_clock == 0 {
                meter.until_clock = CLOCK_EVERY;
                if meter.deadline.is_some_and(|d| Instant::now() > d) {
                    meter.stopped = Some(Stopped::Deadline);
                }
            }
            m.set(meter);
        }
        meter.stopped.is_none()
    })
}

/// What reading `value` costs: a string or bytes a tenth of their length, a list its length
/// (cel-go's traversal factors); a map is looked into, not traversed.
fn size_cost(value: &dyn Val) -> u64 {
    let len = if let Some(s) = value.downcast_ref::<CelString>() {
        s.inner().len() / 10
    } else if let Some(b) = value.downcast_ref::<CelBytes>() {
        b.inner().len() / 10
    } else if let Some(l) = value.downcast_ref::<CelList>() {
        l.inner().len()
    } else {
        0
    };
    u64::try_from(len).unwrap_or(u64::MAX)
}

fn nodes_arg(args: &[CowVal<'_, '_>]) -> u64 {
    args.get(1)
        .and_then(|n| n.as_ref().downcast_ref::<CelInt>())
        .map_or(1, |n| u64::try_from(*n.inner()).unwrap_or(1))
}

fn stopped(function: &str) -> ExecutionError {
    let text = reading().1.unwrap_or(Stopped::Limit).text();
    ExecutionError::function_error(function, text)
}

/// `@cost(value, nodes)`.
fn cost<'b, 'v>(mut args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let nodes = nodes_arg(&args);
    args.truncate(1);
    let value = args.pop().ok_or(ExecutionError::MissingArgumentOrTarget)?;
    if charge(nodes.saturating_add(size_cost(value.as_ref()))) {
        Ok(value)
    } else {
        Err(stopped(CHARGE))
    }
}

/// `@continue(condition, nodes)`.
fn keep_going<'b, 'v>(mut args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let nodes = nodes_arg(&args);
    args.truncate(1);
    let condition = args.pop().ok_or(ExecutionError::MissingArgumentOrTarget)?;
    if charge(nodes) {
        Ok(condition)
    } else {
        Ok(CowVal::owned(CelBool::from(false)))
    }
}

/// Declares the meter's functions in `env`.
pub(super) fn add(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_overload(CHARGE, "cost_charge", vec![DYN_TYPE, INT_TYPE], cost)?;
    env.add_overload(
        CONTINUE,
        "cost_continue",
        vec![DYN_TYPE, INT_TYPE],
        keep_going,
    )
}

/// Calls whose arguments are not charged: their cost does not grow with what they read.
const UNCHARGED: &[&str] = &[
    operators::LOGICAL_AND,
    operators::LOGICAL_OR,
    operators::LOGICAL_NOT,
    operators::CONDITIONAL,
    operators::NOT_STRICTLY_FALSE,
    operators::INDEX,
    operators::OPT_INDEX,
    operators::OPT_SELECT,
    "size",
    "type",
    "hasValue",
    "orValue",
    "value",
    CHARGE,
    CONTINUE,
];

/// `root` rewritten to charge the meter in every comprehension (see the module's text);
/// None when it has no comprehension (nothing to charge).
pub(super) fn instrument(root: &IdedExpr) -> Option<IdedExpr> {
    if !nodes(root)
        .iter()
        .any(|n| matches!(n.expr, Expr::Comprehension(_)))
    {
        return None;
    }
    let mut root = root.clone();
    let mut ids = nodes(&root).iter().map(|n| n.id).max().unwrap_or(0);
    let mut next_id = move || {
        ids += 1;
        ids
    };
    // Walked without recursion: (node, inside a comprehension's body).
    let mut stack: Vec<(&mut IdedExpr, bool)> = vec![(&mut root, false)];
    while let Some((node, in_body)) = stack.pop() {
        match &mut node.expr {
            Expr::Comprehension(c) => {
                let ComprehensionExpr {
                    iter_range,
                    accu_init,
                    accu_var,
                    loop_cond,
                    loop_step,
                    result,
                    ..
                } = &mut **c;
                let body = count(loop_step) + count(loop_cond);
                let result_is_accu = matches!(&result.expr, Expr::Ident(name) if name == accu_var);
                let parts = charge_iterations(
                    Loop {
                        accu: accu_var,
                        cond: loop_cond,
                        step: loop_step,
                        result_is_accu,
                    },
                    body,
                    &mut next_id,
                );
                stack.push((iter_range, in_body));
                stack.push((accu_init, in_body));
                stack.push((result, in_body));
                stack.extend(parts.into_iter().map(|part| (part, true)));
            }
            Expr::Call(call) => {
                let charged = in_body && !UNCHARGED.contains(&call.func_name.as_str());
                for arg in call.target.as_deref_mut().into_iter().chain(&mut call.args) {
                    if charged && !matches!(arg.expr, Expr::Literal(_)) {
                        wrap(arg, CHARGE, 0, &mut next_id);
                        // The wrapped argument is the call's first argument.
                        if let Expr::Call(wrapper) = &mut arg.expr
                            && let Some(inner) = wrapper.args.first_mut()
                        {
                            stack.push((inner, in_body));
                        }
                    } else {
                        stack.push((arg, in_body));
                    }
                }
            }
            Expr::List(list) => stack.extend(list.elements.iter_mut().map(|e| (e, in_body))),
            Expr::Map(map) => {
                for entry in &mut map.entries {
                    if let EntryExpr::MapEntry(e) = &mut entry.expr {
                        stack.push((&mut e.key, in_body));
                        stack.push((&mut e.value, in_body));
                    }
                }
            }
            Expr::Struct(s) => {
                for entry in &mut s.entries {
                    if let EntryExpr::StructField(f) = &mut entry.expr {
                        stack.push((&mut f.value, in_body));
                    }
                }
            }
            Expr::Select(select) => stack.push((&mut select.operand, in_body)),
            Expr::Ident(_) | Expr::Literal(_) | Expr::Unspecified => {}
        }
    }
    Some(root)
}

/// How many nodes `expr` has.
fn count(expr: &IdedExpr) -> u64 {
    u64::try_from(nodes(expr).len()).unwrap_or(u64::MAX)
}

/// Replaces `expr` with `function(expr, nodes)`.
fn wrap(expr: &mut IdedExpr, function: &str, nodes: u64, next_id: &mut impl FnMut() -> u64) {
    let inner = std::mem::take(expr);
    let nodes = IdedExpr {
        id: next_id(),
        expr: Expr::Literal(cel::common::ast::LiteralValue::Int(CelInt::from(
            i64::try_from(nodes).unwrap_or(i64::MAX),
        ))),
    };
    *expr = IdedExpr {
        id: next_id(),
        expr: Expr::Call(cel::common::ast::CallExpr {
            func_name: function.to_owned(),
            target: None,
            args: vec![inner, nodes],
        }),
    };
}

/// Charges `body` on every iteration of `c`, keeping the shapes the interpreter runs fast
/// (`map` and `filter` append in place; `all` and `exists` defer errors as cel-go does).
/// Returns the parts written by the user, to walk further: the loop's condition and step,
/// or, in those shapes, the predicate and the element made.
fn charge_iterations<'c>(
    c: Loop<'c>,
    body: u64,
    next_id: &mut impl FnMut() -> u64,
) -> Vec<&'c mut IdedExpr> {
    let accu: &str = c.accu;
    let is_accu = |e: &IdedExpr| matches!(&e.expr, Expr::Ident(name) if name == accu);
    let appends = c.result_is_accu
        && matches!(c.cond.expr, Expr::Literal(_))
        && match &c.step.expr {
            Expr::Call(call) if call.func_name == operators::CONDITIONAL => {
                matches!(call.args.as_slice(), [_, step, otherwise]
                    if is_accu(otherwise) && appended(step, &is_accu).is_some())
            }
            _ => appended(c.step, &is_accu).is_some(),
        };
    if appends {
        // `@result + [e]`, or `g ? @result + [e] : @result`: the guard charges the
        // iteration (an error ends the loop), the element charges what it holds.
        let step = c.step;
        let guarded =
            matches!(&step.expr, Expr::Call(call) if call.func_name == operators::CONDITIONAL);
        if guarded {
            let Expr::Call(call) = &mut step.expr else {
                return vec![];
            };
            let [guard, append, _] = call.args.as_mut_slice() else {
                return vec![];
            };
            wrap(guard, CHARGE, body, next_id);
            let element = element_of(append);
            let mut parts = vec![];
            if let Some(element) = element {
                wrap(element, CHARGE, 0, next_id);
                parts.extend(first_arg(element));
            }
            parts.extend(first_arg(guard));
            return parts;
        }
        let Some(element) = element_of(step) else {
            return vec![];
        };
        wrap(element, CHARGE, body, next_id);
        return first_arg(element).into_iter().collect();
    }
    // Any other shape: the condition charges the iteration and ends the loop once the meter
    // is spent; the step is left as the macro made it.
    wrap(c.cond, CONTINUE, body, next_id);
    let mut parts: Vec<&mut IdedExpr> = first_arg(c.cond).into_iter().collect();
    parts.push(c.step);
    parts
}

/// The parts of a comprehension that run on every iteration.
struct Loop<'c> {
    accu: &'c str,
    cond: &'c mut IdedExpr,
    step: &'c mut IdedExpr,
    /// Whether the comprehension's result is its accumulator.
    result_is_accu: bool,
}

/// The `[e]` of `@result + [e]` (with one element), if `step` is that.
fn appended<'s>(step: &'s IdedExpr, is_accu: &impl Fn(&IdedExpr) -> bool) -> Option<&'s IdedExpr> {
    let Expr::Call(call) = &step.expr else {
        return None;
    };
    match call.args.as_slice() {
        [lhs, rhs] if call.func_name == operators::ADD && is_accu(lhs) => match &rhs.expr {
            Expr::List(list) if list.elements.len() == 1 => list.elements.first(),
            _ => None,
        },
        _ => None,
    }
}

/// The `e` of `@result + [e]`.
fn element_of(step: &mut IdedExpr) -> Option<&mut IdedExpr> {
    let Expr::Call(call) = &mut step.expr else {
        return None;
    };
    let Expr::List(list) = &mut call.args.get_mut(1)?.expr else {
        return None;
    };
    list.elements.first_mut()
}

/// The first argument of a call (what [`wrap`] wrapped).
fn first_arg(expr: &mut IdedExpr) -> Option<&mut IdedExpr> {
    match &mut expr.expr {
        Expr::Call(call) => call.args.first_mut(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Expression, Input, Scope, to_cel};
    use super::*;
    use serde_json::{Value, json};
    use std::sync::Arc;

    fn object(items: usize) -> Value {
        json!({"items": (0..items).collect::<Vec<_>>(), "name": "x".repeat(1000)})
    }

    fn run(source: &str, items: usize) -> Result<cel::Value, String> {
        Expression::compile(source)?.run(&[("object".to_owned(), to_cel(&object(items)))])
    }

    #[test]
    fn comprehensions_within_the_limit_run_as_before() {
        for source in [
            "object.items.all(x, x >= 0)",
            "object.items.exists(x, x == 9999)",
            "object.items.exists_one(x, x == 7)",
            "object.items.map(x, x * 2).size() == 10000",
            "object.items.filter(x, x % 2 == 0).size() == 5000",
            "object.items.map(x, x % 2 == 0, x).size() == 5000",
            "!object.items.all(x, x < 9999)",
        ] {
            assert_eq!(run(source, 10_000), Ok(cel::Value::Bool(true)), "{source}");
        }
        // Nested comprehensions are taken, and charged as they run.
        assert_eq!(
            run("object.items.all(x, object.items.exists(y, y == x))", 100),
            Ok(cel::Value::Bool(true))
        );
        assert_eq!(
            run(
                "object.items.map(x, object.items.filter(y, y < x).size()).size() == 100",
                100
            ),
            Ok(cel::Value::Bool(true))
        );
    }

    #[test]
    fn what_grows_past_the_limit_is_stopped() {
        for (source, items) in [
            // Quadratic in time.
            ("object.items.all(x, object.items.exists(y, y == x))", 3000),
            (
                "object.items.exists(x, object.items.exists_one(y, y == -x - 1))",
                3000,
            ),
            // Quadratic in memory: each iteration makes (shares) the whole list.
            ("object.items.map(x, object.items).size() > 0", 20_000),
            // Linear, but each iteration reads a long string.
            (
                "object.items.all(x, object.name.contains('y') == false)",
                100_000,
            ),
            // Long enough at about seven per iteration.
            ("object.items.all(x, x >= 0)", 200_000),
            // An error `||` would absorb is still the meter's.
            (
                "object.items.map(x, object.items).size() > 0 || true",
                20_000,
            ),
        ] {
            let started = Instant::now();
            let result = run(source, items);
            assert!(
                result.as_ref().is_err_and(|e| e.contains(LIMIT_EXCEEDED)),
                "{source}: {result:?}"
            );
            assert!(started.elapsed().as_secs() < 5, "{source}");
        }
    }

    #[test]
    fn a_scope_spends_one_budget_and_stops_at_its_deadline() {
        let inputs = vec![Input {
            name: "object",
            value: Arc::new(object(100_000)),
            numbers: None,
            native: None,
        }];
        let expression = Expression::compile("object.items.all(x, x >= 0)").unwrap();
        let mut scope = Scope::new(&inputs, None);
        let mut passed = 0;
        let error = loop {
            match scope.evaluate(&expression) {
                Ok(_) => passed += 1,
                Err(error) => break error,
            }
            assert!(passed < 100, "the budget is never spent");
        };
        assert!(
            (10..20).contains(&passed),
            "{passed} evaluations within {RUNTIME_BUDGET}"
        );
        assert_eq!(
            error,
            "validation failed due to running out of cost budget, no further validation rules will be run"
        );

        let mut late = Scope::new(&inputs, Some(Instant::now()));
        let error = late.evaluate(&expression).unwrap_err();
        assert!(error.ends_with(DEADLINE_EXCEEDED), "{error}");
    }

    #[test]
    fn only_comprehensions_are_rewritten() {
        let plain = Expression::compile("object.name + 'x' == 'y'").unwrap();
        assert!(plain.metered.is_none());
        let looped = Expression::compile("object.items.map(x, x + 1)").unwrap();
        assert!(looped.metered.is_some());
    }
}
