//! Kubernetes' `quantity` CEL library (k8s.io/apiserver `pkg/cel/library/quantity.go`):
//! `quantity(s)`, `isQuantity(s)`, `sign(q)`, and on a quantity `isGreaterThan`,
//! `isLessThan`, `compareTo`, `add`, `sub` (a quantity or an int), `asInteger`, `isInteger`,
//! `asApproximateFloat`. Quantities are parsed as `resource.ParseQuantity` parses them
//! (rounded up to the nano, binary ones capped at 2^63-1) and compare by value, so
//! `quantity("200M") == quantity("0.2G")`.

use std::{cmp::Ordering, sync::Arc};

use super::library::answer;
use cel::{
    Env, ExecutionError, Value,
    common::{
        types::{CelString, INT_TYPE, STRING_TYPE, Type},
        value::CowVal,
    },
    objects::Opaque,
};
use num_bigint::{BigInt, Sign};
use num_traits::{ToPrimitive, Zero};

/// The CEL type's name, as kube-apiserver's.
const NAME: &str = "kubernetes.Quantity";

/// kube-apiserver's parse errors (`resource.ErrFormatWrong`, `ErrSuffix`).
const FORMAT_WRONG: &str =
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'";
const SUFFIX: &str = "unable to parse quantity's suffix";

/// The longest quantity text read: big-number arithmetic grows faster than the text, and no
/// real quantity comes near it.
const MAX_TEXT: usize = 1_000;

/// How many digits apart two quantities' scales may be for `add` and `sub` (kube-apiserver
/// would build the exact sum of `1e1000000000` and `1`; here that is an error).
const MAX_ALIGN: i64 = 1_000;

/// A quantity's exact value: `unscaled × 10^-scale`.
#[derive(Debug, Clone)]
pub struct Quantity {
    unscaled: BigInt,
    scale: i64,
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.compare(other) == Ordering::Equal
    }
}

impl Eq for Quantity {}

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        NAME
    }
}

impl Quantity {
    /// `resource.ParseQuantity`.
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        let bytes = text.as_bytes();
        if bytes.is_empty() || bytes.len() > MAX_TEXT {
            return Err(FORMAT_WRONG);
        }
        let mut pos = 0;
        let negative = bytes[0] == b'-';
        if matches!(bytes[0], b'-' | b'+') {
            pos = 1;
        }
        let digits = |from: usize| {
            from + bytes[from..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count()
        };
        let num_end = digits(pos);
        let num = &text[pos..num_end];
        pos = num_end;
        let mut denom = "";
        if bytes.get(pos) == Some(&b'.') {
            let end = digits(pos + 1);
            denom = &text[pos + 1..end];
            pos = end;
        }
        let suffix_start = pos;
        pos += bytes[pos..]
            .iter()
            .take_while(|b| b"eEinumkKMGTP".contains(b))
            .count();
        if matches!(bytes.get(pos), Some(b'-' | b'+')) {
            pos += 1;
        }
        if digits(pos) != bytes.len() {
            return Err(FORMAT_WRONG);
        }
        let (base, exponent) = interpret(&text[suffix_start..]).ok_or(SUFFIX)?;
        let mut unscaled: BigInt = format!("0{num}{denom}").parse().map_err(|_| FORMAT_WRONG)?;
        let mut scale = denom.len() as i64;
        let binary = base == 2;
        if binary {
            unscaled <<= exponent as usize;
        } else {
            scale -= exponent;
        }
        let mut quantity = Quantity { unscaled, scale };
        quantity.round_up_to_nano();
        if binary {
            let cap = Quantity::from(i64::MAX);
            if quantity.compare(&cap) == Ordering::Greater {
                quantity = cap;
            }
        }
        if negative {
            quantity.unscaled = -quantity.unscaled;
        }
        Ok(quantity)
    }

    /// Rounds a non-negative value away from zero to 9 decimal places, as `ParseQuantity`.
    fn round_up_to_nano(&mut self) {
        if self.scale <= 9 || self.unscaled.is_zero() {
            return;
        }
        let drop = self.scale - 9;
        if drop > digits(&self.unscaled) {
            // Smaller than a nano: one nano.
            self.unscaled = BigInt::from(1);
        } else {
            let divisor = pow10(drop);
            let (quotient, remainder) = (&self.unscaled / &divisor, &self.unscaled % &divisor);
            self.unscaled = if remainder.is_zero() {
                quotient
            } else {
                quotient + 1
            };
        }
        self.scale = 9;
    }

    /// The order by value. Scales far apart are told apart by magnitude before any is
    /// rescaled, so comparing `1e1000000000` costs no more than comparing `1`.
    fn compare(&self, other: &Self) -> Ordering {
        let (a, b) = (self.unscaled.sign(), other.unscaled.sign());
        let rank = |s: Sign| match s {
            Sign::Minus => 0,
            Sign::NoSign => 1,
            Sign::Plus => 2,
        };
        if a != b || a == Sign::NoSign {
            return rank(a).cmp(&rank(b));
        }
        let magnitude = |q: &Self| digits(&q.unscaled).saturating_sub(q.scale);
        let by_magnitude = magnitude(self).cmp(&magnitude(other));
        let ordering = if by_magnitude != Ordering::Equal {
            by_magnitude
        } else {
            // Equal magnitudes: the scales differ by at most the digits' lengths.
            let scale = self.scale.max(other.scale);
            self.rescaled(scale)
                .magnitude()
                .cmp(other.rescaled(scale).magnitude())
        };
        if a == Sign::Minus {
            ordering.reverse()
        } else {
            ordering
        }
    }

    /// The unscaled value at `scale` (at least the current one).
    fn rescaled(&self, scale: i64) -> BigInt {
        &self.unscaled * pow10(scale - self.scale)
    }

    fn combine(&self, other: &Self, subtract: bool) -> Result<Self, ExecutionError> {
        if (self.scale - other.scale).abs() > MAX_ALIGN {
            return Err(ExecutionError::function_error(
                if subtract { "sub" } else { "add" },
                "quantities too far apart in magnitude",
            ));
        }
        let scale = self.scale.max(other.scale);
        let (a, b) = (self.rescaled(scale), other.rescaled(scale));
        Ok(Quantity {
            unscaled: if subtract { a - b } else { a + b },
            scale,
        })
    }

    /// `Quantity.AsInt64`: the value when it is an integer that fits in an int64.
    fn as_int64(&self) -> Option<i64> {
        if self.unscaled.is_zero() {
            return Some(0);
        }
        if self.scale <= 0 {
            if digits(&self.unscaled) - self.scale > 19 {
                return None;
            }
            return (&self.unscaled * pow10(-self.scale)).to_i64();
        }
        let divisor = pow10(self.scale);
        if !(&self.unscaled % &divisor).is_zero() {
            return None;
        }
        (&self.unscaled / divisor).to_i64()
    }

    /// `Quantity.AsApproximateFloat64`.
    fn as_f64(&self) -> f64 {
        let base = self.unscaled.to_f64().unwrap_or(f64::NAN);
        let exponent = (-self.scale).clamp(-400, 400) as i32;
        if exponent == 0 {
            base
        } else {
            base * 10f64.powi(exponent)
        }
    }

    fn sign(&self) -> i64 {
        match self.unscaled.sign() {
            Sign::Minus => -1,
            Sign::NoSign => 0,
            Sign::Plus => 1,
        }
    }
}

impl From<i64> for Quantity {
    fn from(value: i64) -> Self {
        Quantity {
            unscaled: BigInt::from(value),
            scale: 0,
        }
    }
}

/// A suffix's base and exponent (`resource`'s suffixer): `Ki`..`Ei` are powers of two,
/// `n`..`E` and `e<int>`/`E<int>` powers of ten.
fn interpret(suffix: &str) -> Option<(u8, i64)> {
    const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    const DECIMAL: [(&str, i64); 10] = [
        ("n", -9),
        ("u", -6),
        ("m", -3),
        ("", 0),
        ("k", 3),
        ("M", 6),
        ("G", 9),
        ("T", 12),
        ("P", 15),
        ("E", 18),
    ];
    if let Some(i) = BINARY.iter().position(|s| *s == suffix) {
        return Some((2, 10 * (i as i64 + 1)));
    }
    if let Some((_, exponent)) = DECIMAL.iter().find(|(s, _)| *s == suffix) {
        return Some((10, *exponent));
    }
    let rest = suffix
        .strip_prefix('e')
        .or_else(|| suffix.strip_prefix('E'))?;
    rest.parse::<i32>().ok().map(|e| (10, i64::from(e)))
}

/// The number of decimal digits of `n`'s magnitude (0 for zero).
fn digits(n: &BigInt) -> i64 {
    if n.is_zero() {
        0
    } else {
        n.magnitude().to_str_radix(10).len() as i64
    }
}

fn pow10(exponent: i64) -> BigInt {
    BigInt::from(10).pow(u32::try_from(exponent).unwrap_or(0))
}

/// The CEL type of quantities.
fn quantity_type() -> Type {
    Type::new_opaque_type(NAME)
}

/// Adds the library to `env`.
pub(super) fn add(env: &mut Env) -> Result<(), cel::DeclarationError> {
    let q = quantity_type;
    env.add_overload("quantity", "string_to_quantity", vec![STRING_TYPE], parse)?;
    env.add_overload(
        "isQuantity",
        "is_quantity_string",
        vec![STRING_TYPE],
        is_quantity,
    )?;
    env.add_overload("sign", "quantity_sign", vec![q()], sign)?;
    for (name, id, args, function) in [
        (
            "sign",
            "quantity_sign_member",
            vec![],
            sign as cel::common::functions::Function,
        ),
        (
            "isGreaterThan",
            "quantity_is_greater_than",
            vec![q()],
            is_greater_than,
        ),
        (
            "isLessThan",
            "quantity_is_less_than",
            vec![q()],
            is_less_than,
        ),
        ("compareTo", "quantity_compare_to", vec![q()], compare_to),
        (
            "asApproximateFloat",
            "quantity_get_float",
            vec![],
            as_approximate_float,
        ),
        ("asInteger", "quantity_get_int", vec![], as_integer),
        ("isInteger", "quantity_is_integer", vec![], is_integer),
        ("add", "quantity_add", vec![q()], add_quantity),
        ("add", "quantity_add_int", vec![INT_TYPE], add_quantity),
        ("sub", "quantity_sub", vec![q()], sub_quantity),
        ("sub", "quantity_sub_int", vec![INT_TYPE], sub_quantity),
    ] {
        env.add_member_overload(name, id, q(), args, function)?;
    }
    Ok(())
}

fn quantity_value<'b, 'v>(q: Quantity) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Opaque(Arc::new(q)))
}

/// The quantities (or ints, as quantities) a function was called with.
fn quantities(function: &str, args: &[CowVal<'_, '_>]) -> Result<Vec<Quantity>, ExecutionError> {
    args.iter()
        .map(|arg| match Value::try_from(arg.as_ref())? {
            Value::Opaque(o) => o
                .downcast_ref::<Quantity>()
                .cloned()
                .ok_or_else(|| ExecutionError::function_error(function, "not a quantity")),
            Value::Int(i) => Ok(Quantity::from(i)),
            _ => Err(ExecutionError::function_error(function, "not a quantity")),
        })
        .collect()
}

fn one(function: &str, args: &[CowVal<'_, '_>]) -> Result<Quantity, ExecutionError> {
    quantities(function, args)?
        .into_iter()
        .next()
        .ok_or_else(|| ExecutionError::function_error(function, "no quantity"))
}

fn two(function: &str, args: &[CowVal<'_, '_>]) -> Result<(Quantity, Quantity), ExecutionError> {
    let mut all = quantities(function, args)?.into_iter();
    match (all.next(), all.next()) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(ExecutionError::function_error(
            function,
            "two quantities expected",
        )),
    }
}

fn text<'a>(args: &'a [CowVal<'_, '_>]) -> Option<&'a str> {
    args.first()
        .and_then(|arg| arg.as_ref().downcast_ref::<CelString>())
        .map(|s| s.inner())
}

fn parse<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let source =
        text(&args).ok_or_else(|| ExecutionError::function_error("quantity", "not a string"))?;
    let q = Quantity::parse(source).map_err(|e| ExecutionError::function_error("quantity", e))?;
    quantity_value(q)
}

fn is_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let source =
        text(&args).ok_or_else(|| ExecutionError::function_error("isQuantity", "not a string"))?;
    answer(Value::Bool(Quantity::parse(source).is_ok()))
}

fn sign<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Int(one("sign", &args)?.sign()))
}

fn is_greater_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = two("isGreaterThan", &args)?;
    answer(Value::Bool(a.compare(&b) == Ordering::Greater))
}

fn is_less_than<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = two("isLessThan", &args)?;
    answer(Value::Bool(a.compare(&b) == Ordering::Less))
}

fn compare_to<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = two("compareTo", &args)?;
    answer(Value::Int(a.compare(&b) as i64))
}

fn as_approximate_float<'b, 'v>(
    args: Vec<CowVal<'b, 'v>>,
) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Float(one("asApproximateFloat", &args)?.as_f64()))
}

fn as_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    match one("asInteger", &args)?.as_int64() {
        Some(i) => answer(Value::Int(i)),
        None => Err(ExecutionError::function_error(
            "asInteger",
            "cannot convert value to integer",
        )),
    }
}

fn is_integer<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    answer(Value::Bool(one("isInteger", &args)?.as_int64().is_some()))
}

fn add_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = two("add", &args)?;
    quantity_value(a.combine(&b, false)?)
}

fn sub_quantity<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let (a, b) = two("sub", &args)?;
    quantity_value(a.combine(&b, true)?)
}

#[cfg(test)]
mod tests {
    use super::{super::library::tests::run, Quantity};

    /// kube-apiserver's own cases (`library/quantity_test.go`).
    #[test]
    fn kubernetes_cases() {
        for source in [
            r#"isQuantity("20") && isQuantity("20M") && isQuantity("20Mi")"#,
            r#"!isQuantity("20Mo") && !isQuantity("10Mm")"#,
            r#"quantity("200M") == quantity("200M")"#,
            r#"quantity("200M") == quantity("0.2G") && quantity("0.2G") == quantity("200M")"#,
            r#"quantity("2M") == quantity("0.002G") && quantity("2000k") == quantity("2M")"#,
            r#"quantity("200M") != quantity("0.3G")"#,
            r#"quantity("50M").isLessThan(quantity("50Mi"))"#,
            r#"!quantity("100M").isLessThan(quantity("50M"))"#,
            r#"quantity("150Mi").isGreaterThan(quantity("100Mi"))"#,
            r#"quantity("200M").compareTo(quantity("0.2G")) == 0"#,
            r#"quantity("50M").compareTo(quantity("50Mi")) == -1"#,
            r#"quantity("50Mi").compareTo(quantity("50M")) == 1"#,
            r#"quantity("50k").add(quantity("20")) == quantity("50.02k")"#,
            r#"quantity("50k").add(20).isLessThan(quantity("50021"))"#,
            r#"quantity("50k").sub(quantity("20")) == quantity("49.98k")"#,
            r#"quantity("50k").sub(20) == quantity("49980")"#,
            r#"quantity("50k").add(20).sub(quantity("100k")).asInteger() == -49980"#,
            r#"quantity("50k").asInteger() == 50000"#,
            r#"!quantity("9999999999999999999999999999999999999G").isInteger()"#,
            r#"quantity("50").isInteger() && !quantity("50m").isInteger()"#,
            r#"quantity("50.703k").asApproximateFloat() == 50703.0"#,
            r#"sign(quantity("-5")) == -1 && quantity("0").sign() == 0 && sign(quantity("1n")) == 1"#,
            r#"quantity("1e1000000000").isGreaterThan(quantity("999E"))"#,
            r#"quantity("-1e1000000000").isLessThan(quantity("1n"))"#,
            r#"type(quantity("1")) == type(quantity("2Ki"))"#,
        ] {
            assert_eq!(run(source), Ok(cel::Value::Bool(true)), "{source}");
        }
        assert!(run(r#"quantity("10Mo")"#).is_err());
        assert!(
            run(r#"quantity("9999999999999999999999999999999999999G").asInteger()"#)
                .is_err_and(|e| e.contains("cannot convert value to integer"))
        );
        assert!(run(r#"quantity("1e1000000000").add(1)"#).is_err());
        assert!(run(r#"quantity("1") < quantity("2")"#).is_err());
    }

    #[test]
    fn parsing_as_resource_parse_quantity() {
        let q = |s: &str| Quantity::parse(s).map(|q| (q.unscaled.to_string(), q.scale));
        assert_eq!(q("1Ki"), Ok(("1024".into(), 0)));
        assert_eq!(q("1.5Gi"), Ok(("16106127360".into(), 1)));
        assert_eq!(q("100m"), Ok(("100".into(), 3)));
        assert_eq!(
            q("-0.1n"),
            Ok(("-1".into(), 9)),
            "rounded away from zero to a nano"
        );
        assert_eq!(q("1e-20"), Ok(("1".into(), 9)));
        assert_eq!(q("1e3"), Ok(("1".into(), -3)));
        assert_eq!(q("+.5"), Ok(("5".into(), 1)));
        assert_eq!(q("16Ei"), Ok((i64::MAX.to_string(), 0)), "binary capped");
        assert_eq!(q("0"), Ok(("0".into(), 0)));
        for bad in [
            "",
            "1.2.3",
            "1k5",
            "1e",
            "1 k",
            "1Kib",
            "--1",
            "1e99999999999",
            &"1".repeat(1_001),
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?}");
        }
    }
}
