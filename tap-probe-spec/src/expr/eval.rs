//! Evaluation: an expression's value from the values of its names.

use std::collections::BTreeSet;
use std::fmt;

use super::{BinOp, Expr, ExprKind, Name};

impl Expr {
    pub(super) fn collect_names<'a>(&'a self, out: &mut BTreeSet<&'a Name>) {
        match &self.kind {
            ExprKind::Number(_) => {}
            ExprKind::Name(name) => {
                out.insert(name);
            }
            ExprKind::Neg(inner) => inner.collect_names(out),
            ExprKind::Binary(_, a, b) => {
                a.collect_names(out);
                b.collect_names(out);
            }
        }
    }

    pub(super) fn eval(
        &self,
        text: &str,
        lookup: &dyn Fn(&Name) -> Option<f64>,
    ) -> Result<f64, EvalError> {
        let value = match &self.kind {
            ExprKind::Number(v) => *v,
            ExprKind::Name(name) => {
                let v = lookup(name).ok_or_else(|| EvalError::NotMeasured(name.clone()))?;
                if !v.is_finite() {
                    return Err(EvalError::NotFiniteValue(name.clone(), v));
                }
                v
            }
            ExprKind::Neg(inner) => -inner.eval(text, lookup)?,
            ExprKind::Binary(op, a, b) => {
                let x = a.eval(text, lookup)?;
                let y = b.eval(text, lookup)?;
                match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div => {
                        if y == 0.0 {
                            return Err(EvalError::DivisionByZero {
                                divisor: text[b.span.start..b.span.end].to_owned(),
                            });
                        }
                        x / y
                    }
                }
            }
        };
        if value.is_finite() {
            Ok(value)
        } else {
            Err(EvalError::Overflow {
                part: text[self.span.start..self.span.end].to_owned(),
            })
        }
    }
}

/// Why an expectation could not be evaluated.
#[derive(Clone, Debug, PartialEq)]
pub enum EvalError {
    /// The name is known but this run has no value for it (e.g. `qdisc_drops` without a
    /// qdisc, a counter this kernel's probes cannot see, a baseline without the scenario).
    NotMeasured(Name),
    NotFiniteValue(Name, f64),
    DivisionByZero {
        divisor: String,
    },
    Overflow {
        part: String,
    },
}

impl fmt::Display for EvalError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotMeasured(name) => write!(
                f,
                "`{name}` has no value in this run; remove it from this scenario's expectations \
                 or give the scenario what measures it"
            ),
            Self::NotFiniteValue(name, v) => {
                write!(
                    f,
                    "`{name}` has no finite value ({v}); the measurement is broken"
                )
            }
            Self::DivisionByZero { divisor } => write!(
                f,
                "division by zero: `{divisor}` is 0; compare with a product instead \
                 (`a >= 0.5 * b` rather than `a / b >= 0.5`)"
            ),
            Self::Overflow { part } => {
                write!(f, "`{part}` is beyond the range of a 64-bit float")
            }
        }
    }
}

impl std::error::Error for EvalError {}
