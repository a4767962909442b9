//! The Kubernetes CEL libraries policies use most, as k8s.io/apiserver's `pkg/cel/library`
//! defines them: `regex` (`find`, `findAll`) and `lists` (`isSorted`, `sum`, `min`, `max`,
//! `indexOf`, `lastIndexOf`). The standard library, the strings and lists extensions and
//! optionals come with the cel crate, but for `replace`, which is bounded here ([`charge`]).

use std::{cell::Cell, cmp::Ordering};

use cel::{
    Env, ExecutionError, Value,
    common::{
        types::{CelInt, CelList, CelString, DYN_TYPE, INT_TYPE, LIST_TYPE, STRING_TYPE},
        value::{CowVal, Val},
    },
};

/// The most bytes `replace` may make in one evaluation: nested, each call could multiply
/// its input's size (`s.replace('', s)`), past any memory. kube-apiserver's cost limit
/// bounds the same; its error text.
const MAX_PRODUCED_BYTES: usize = 8 << 20;

thread_local! {
    /// What `replace` made in this thread's current evaluation.
    static PRODUCED: Cell<usize> = const { Cell::new(0) };
}

/// Starts an evaluation's count of bytes made.
pub(super) fn reset_budget() {
    PRODUCED.with(|p| p.set(0));
}

/// Counts `bytes` made by `function`; the error once the evaluation made too many.
fn charge(function: &str, bytes: usize) -> Result<(), ExecutionError> {
    PRODUCED.with(|produced| {
        let total = produced.get().saturating_add(bytes);
        if total > MAX_PRODUCED_BYTES {
            return Err(ExecutionError::function_error(
                function,
                "operation cancelled: actual cost limit exceeded",
            ));
        }
        produced.set(total);
        Ok(())
    })
}

/// Adds `replace` to `env`, before the strings extension: its last string argument is
/// declared `dyn`, so these overloads are other signatures than the extension's (which then
/// still registers) and are found first.
pub(super) fn add_bounded_replace(env: &mut Env) -> Result<(), cel::DeclarationError> {
    env.add_member_overload(
        "replace",
        "string_replace_bounded",
        STRING_TYPE,
        vec![STRING_TYPE, DYN_TYPE],
        replace,
    )?;
    env.add_member_overload(
        "replace",
        "string_replace_n_bounded",
        STRING_TYPE,
        vec![STRING_TYPE, DYN_TYPE, INT_TYPE],
        replace,
    )
}

/// `s.replace(from, to)` and `s.replace(from, to, n)` (at most `n` replacements; a negative
/// `n`: all), the result's size charged before it is made.
fn replace<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let string = |i: usize| {
        args.get(i)
            .and_then(|arg| arg.as_ref().downcast_ref::<CelString>())
            .map(|s| s.inner())
            .ok_or_else(|| ExecutionError::function_error("replace", "not a string"))
    };
    let (this, from, to) = (string(0)?, string(1)?, string(2)?);
    let limit = match args.get(3) {
        Some(n) => match n.as_ref().downcast_ref::<CelInt>() {
            Some(n) => usize::try_from(*n.inner()).unwrap_or(usize::MAX),
            None => return Err(ExecutionError::function_error("replace", "not an int")),
        },
        None => usize::MAX,
    };
    let found = if from.is_empty() {
        this.chars().count() + 1
    } else {
        this.matches(from).count()
    }
    .min(limit);
    let size = this
        .len()
        .saturating_add(found.saturating_mul(to.len()))
        .saturating_sub(found.saturating_mul(from.len()));
    charge("replace", size)?;
    let replaced = this.replacen(from, to, found);
    Ok(CowVal::Owned(Box::new(CelString::from(replaced))))
}

/// Adds the libraries to `env`.
pub(super) fn add(env: &mut Env) -> Result<(), cel::DeclarationError> {
    cel::add_member_overload!(env, fn find: (CelString, CelString) -> Result<CelString>)?;
    cel::add_member_overload!(env, fn find_all: (CelString, CelString) -> Result<CelList>, name = "findAll")?;
    cel::add_member_overload!(env, fn find_all_n: (CelString, CelString, CelInt) -> Result<CelList>, name = "findAll")?;
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], is_sorted)?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], sum)?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], min)?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], max)?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        index_of,
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![DYN_TYPE],
        last_index_of,
    )?;
    Ok(())
}

fn regex(function: &str, pattern: &str) -> Result<regex::Regex, ExecutionError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(1 << 20)
        .build()
        .map_err(|e| ExecutionError::function_error(function, e))
}

/// `s.find(re)`: the first match, or "".
fn find(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelString<'static>, ExecutionError> {
    let re = regex("find", pattern.inner())?;
    Ok(re
        .find(this.inner())
        .map_or(String::new(), |m| m.as_str().to_owned())
        .into())
}

/// `s.findAll(re)`: every match.
fn find_all(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
) -> Result<CelList<'static>, ExecutionError> {
    find_all_n(this, pattern, &CelInt::from(-1))
}

/// `s.findAll(re, n)`: at most `n` matches (a negative `n`: all).
fn find_all_n(
    this: &CelString<'_>,
    pattern: &CelString<'_>,
    n: &CelInt,
) -> Result<CelList<'static>, ExecutionError> {
    let re = regex("findAll", pattern.inner())?;
    let limit = usize::try_from(*n.inner()).unwrap_or(usize::MAX);
    let found: Vec<Box<dyn Val>> = re
        .find_iter(this.inner())
        .take(limit)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val>)
        .collect();
    Ok(CelList::from(found))
}

/// The list a list function was called on, and its other arguments, as values.
fn arguments(
    function: &str,
    args: Vec<CowVal<'_, '_>>,
) -> Result<(Vec<Value>, Vec<Value>), ExecutionError> {
    let mut values = args
        .iter()
        .map(|arg| Value::try_from(arg.as_ref()))
        .collect::<Result<Vec<_>, _>>()?
        .into_iter();
    match values.next() {
        Some(Value::List(items)) => Ok((items.as_ref().clone(), values.collect())),
        _ => Err(ExecutionError::function_error(
            function,
            "not called on a list",
        )),
    }
}

/// A library function's result: `value` as CEL's own.
pub(super) fn answer<'b, 'v>(value: Value) -> Result<CowVal<'b, 'v>, ExecutionError> {
    Ok(CowVal::Owned(Box::<dyn Val>::try_from(value)?))
}

/// The order of two list elements (numbers of any kind with each other; strings, booleans);
/// None when they do not compare.
fn order(a: &Value, b: &Value) -> Option<Ordering> {
    match (a, b) {
        (
            Value::Int(_) | Value::UInt(_) | Value::Float(_),
            Value::Int(_) | Value::UInt(_) | Value::Float(_),
        )
        | (Value::String(_), Value::String(_))
        | (Value::Bool(_), Value::Bool(_)) => a.partial_cmp(b),
        _ => None,
    }
}

fn is_sorted<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (items, _) = arguments("isSorted", args)?;
    for pair in items.windows(2) {
        match order(&pair[0], &pair[1]) {
            Some(Ordering::Greater) => return answer(Value::Bool(false)),
            Some(_) => {}
            None => {
                return Err(ExecutionError::function_error(
                    "isSorted",
                    "elements do not compare",
                ));
            }
        }
    }
    answer(Value::Bool(true))
}

fn sum<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (items, _) = arguments("sum", args)?;
    let overflow = || ExecutionError::function_error("sum", "integer overflow");
    let mut total = match items.first() {
        Some(Value::Float(_)) => Value::Float(0.0),
        Some(Value::UInt(_)) => Value::UInt(0),
        _ => Value::Int(0),
    };
    for item in items {
        total = match (total, item) {
            (Value::Int(a), Value::Int(b)) => Value::Int(a.checked_add(b).ok_or_else(overflow)?),
            (Value::UInt(a), Value::UInt(b)) => Value::UInt(a.checked_add(b).ok_or_else(overflow)?),
            (Value::Float(a), Value::Float(b)) => Value::Float(a + b),
            _ => {
                return Err(ExecutionError::function_error(
                    "sum",
                    "elements of different types",
                ));
            }
        };
    }
    answer(total)
}

fn extreme<'b, 'v>(
    function: &str,
    args: Vec<CowVal<'b, 'v>>,
    wanted: Ordering,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (items, _) = arguments(function, args)?;
    let mut items = items.into_iter();
    let Some(mut best) = items.next() else {
        return Err(ExecutionError::function_error(
            function,
            format!("{function} called on empty list"),
        ));
    };
    for item in items {
        match order(&item, &best) {
            Some(ordering) if ordering == wanted => best = item,
            Some(_) => {}
            None => {
                return Err(ExecutionError::function_error(
                    function,
                    "elements do not compare",
                ));
            }
        }
    }
    answer(best)
}

fn min<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("min", args, Ordering::Less)
}

fn max<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    extreme("max", args, Ordering::Greater)
}

fn index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (items, rest) = arguments("indexOf", args)?;
    let found = rest
        .first()
        .and_then(|x| items.iter().position(|item| item == x));
    answer(Value::Int(found.map_or(-1, |i| i as i64)))
}

fn last_index_of<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (items, rest) = arguments("lastIndexOf", args)?;
    let found = rest
        .first()
        .and_then(|x| items.iter().rposition(|item| item == x));
    answer(Value::Int(found.map_or(-1, |i| i as i64)))
}

#[cfg(test)]
pub(super) mod tests {
    use super::super::Expression;

    /// Runs `source` with no variables.
    pub(in crate::admission::cel) fn run(source: &str) -> Result<cel::Value, String> {
        Expression::compile(source)?.run(&[])
    }

    #[test]
    fn kubernetes_libraries() {
        for source in [
            "'abc 123 def 456'.find('[0-9]+') == '123'",
            "'abc'.find('[0-9]+') == ''",
            "'abc 123 def 456'.findAll('[0-9]+') == ['123', '456']",
            "'a1 b2 c3'.findAll('[0-9]', 2) == ['1', '2']",
            "[1, 2, 3].isSorted() && !['b', 'a'].isSorted() && [].isSorted()",
            "[1, 2, 3].sum() == 6 && [1.5, 2.0].sum() == 3.5 && [].sum() == 0",
            "[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3 && ['b', 'a'].min() == 'a'",
            "[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1",
        ] {
            assert_eq!(run(source), Ok(cel::Value::Bool(true)), "{source}");
        }
        assert!(run("[].min()").is_err());
        assert!(run("'a'.find('(')").is_err());
        assert!(run("[9223372036854775807, 1].sum()").is_err());
    }

    #[test]
    fn replace_is_bounded() {
        for source in [
            "'abc'.replace('b', 'xx') == 'axxc'",
            "'aaa'.replace('a', 'b', 2) == 'bba'",
            "'aaa'.replace('a', 'b', -1) == 'bbb'",
            "'ab'.replace('', '-') == '-a-b-'",
        ] {
            assert_eq!(run(source), Ok(cel::Value::Bool(true)), "{source}");
        }
        // Each call multiplies the size by eleven: the seventh passes the budget (a few more
        // would pass any memory).
        let bomb = "'0123456789'.replace('', '0123456789').replace('', '0123456789')\
                    .replace('', '0123456789').replace('', '0123456789').replace('', '0123456789')\
                    .replace('', '0123456789').replace('', '0123456789').size() > 0";
        super::reset_budget();
        assert!(
            run(bomb).is_err_and(|e| e.contains("actual cost limit exceeded")),
            "{bomb}"
        );
    }
}
