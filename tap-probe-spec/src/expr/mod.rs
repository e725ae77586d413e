//! The expression language of a scenario's `expect` list.
//!
//! ```text
//! expectation = sum comparison sum          exactly one comparison
//! comparison  = "==" | "!=" | "<" | "<=" | ">" | ">="
//! sum         = product *( ("+" | "-") product )
//! product     = unary *( ("*" | "/") unary )
//! unary       = "-" unary | primary
//! primary     = number | name | "(" sum ")"
//! number      = digits [ "." digits ] [ ("e" | "E") [ "+" | "-" ] digits ]
//! digits      = digit *( digit | "_" digit )      e.g. 50000, 50_000, 0.95, 1e6
//! name        = ident | "baseline." ident
//! ident       = [a-z_][a-z0-9_]*
//! ```
//!
//! An expectation is parsed once, when the spec is read. Its names are checked against the
//! names the measurement provides before any traffic runs, so a typo costs nothing; the
//! evaluation then only meets values.
//!
//! Values are `f64`. The counters are integers far below 2^53, where `f64` represents every
//! integer exactly, so `==` and `!=` compare counters exactly (`consumed + qdisc_drops ==
//! sent` holds only when not one packet is missing). A literal integer above 2^53 is refused
//! for the same reason. Rates and ratios are fractions: compare those with `<=`/`>=` and a
//! margin (`delivered_pps >= 0.95 * baseline.delivered_pps`), not with `==`.
//!
//! Division by zero and results beyond `f64`'s range are evaluation errors, never NaN or
//! infinity, so a comparison can only hold or fail for a reason the report shows.

use std::collections::BTreeSet;
use std::fmt;

use tap_probe_common::echo::{MAX_CHARS, clipped};

mod eval;
mod lex;
mod parse;

pub use eval::EvalError;

/// The prefix that makes a name refer to the baseline's value of the same scenario.
pub(crate) const BASELINE_PREFIX: &str = "baseline.";

/// Longer expressions are refused: they are unreadable, and the bound keeps the recursive
/// parser and evaluator far from the stack's limit.
const MAX_LEN: usize = 1000;

/// Parentheses and unary minus nest at most this deep.
const MAX_DEPTH: usize = 32;

/// Every integer up to this one is exactly an `f64` (53 bits of mantissa).
pub(crate) const MAX_EXACT_INTEGER: u64 = 1 << 53;

/// A value an expression refers to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Name {
    /// A value measured in this run of the scenario.
    Measured(String),
    /// The value the baseline holds for the same scenario (`baseline.NAME`).
    Baseline(String),
}

impl Name {
    /// The counter or report value the name refers to, without `baseline.`.
    pub(crate) fn base(&self) -> &str {
        match self {
            Self::Measured(name) | Self::Baseline(name) => name,
        }
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Measured(name) => f.write_str(name),
            Self::Baseline(name) => write!(f, "{BASELINE_PREFIX}{name}"),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Comparison {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Comparison {
    fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "==",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }

    #[expect(
        clippy::float_cmp,
        reason = "exact by design: counters are integers, exact in f64 below 2^53"
    )]
    fn holds(self, left: f64, right: f64) -> bool {
        match self {
            Self::Eq => left == right,
            Self::Ne => left != right,
            Self::Lt => left < right,
            Self::Le => left <= right,
            Self::Gt => left > right,
            Self::Ge => left >= right,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
}

/// A byte range of the expression's text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
}

impl Span {
    fn new(start: usize, end: usize) -> Self {
        Self { start, end }
    }

    fn to(self, other: Span) -> Span {
        Span::new(self.start, other.end)
    }
}

#[derive(Clone, Debug, PartialEq)]
struct Expr {
    kind: ExprKind,
    span: Span,
}

#[derive(Clone, Debug, PartialEq)]
enum ExprKind {
    Number(f64),
    Name(Name),
    Neg(Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
}

/// One parsed `expect` entry: two sides and the comparison between them.
#[derive(Clone, Debug, PartialEq)]
pub struct Expectation {
    text: String,
    left: Expr,
    comparison: Comparison,
    right: Expr,
}

/// The values both sides had and whether the comparison held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub holds: bool,
    pub left: f64,
    pub right: f64,
}

impl Expectation {
    /// Parses one expectation.
    ///
    /// # Errors
    /// When the text is not an expectation; the error points at the column.
    pub fn parse(text: &str) -> Result<Self, ParseError> {
        if text.chars().count() > MAX_LEN {
            return Err(ParseError::new(
                text,
                Span::new(0, text.len()),
                format!(
                    "the expression is longer than {MAX_LEN} characters; split it into several expectations"
                ),
            ));
        }
        parse::expectation(text)
    }

    /// The expectation as written.
    #[must_use]
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Every name the expectation uses, each once: the measured ones, then the baseline's,
    /// each sorted.
    #[must_use]
    pub fn names(&self) -> BTreeSet<&Name> {
        let mut out = BTreeSet::new();
        self.left.collect_names(&mut out);
        self.right.collect_names(&mut out);
        out
    }

    /// Checks every name against the names a measurement provides (`known`, without the
    /// `baseline.` prefix, which may stand before any of them).
    ///
    /// # Errors
    /// Names every unknown name, with the closest known one when there is one.
    pub fn check_names(&self, known: &[&str]) -> Result<(), UnknownNames> {
        let unknown: Vec<UnknownName> = self
            .names()
            .into_iter()
            .filter(|name| !known.contains(&name.base()))
            .map(|name| UnknownName {
                name: name.clone(),
                suggestion: closest(name.base(), known).map(|s| match name {
                    Name::Measured(_) => Name::Measured(s.to_owned()),
                    Name::Baseline(_) => Name::Baseline(s.to_owned()),
                }),
            })
            .collect();
        if unknown.is_empty() {
            Ok(())
        } else {
            Err(UnknownNames(unknown))
        }
    }

    /// Evaluates both sides with `lookup` giving each name's value (`None`: not measured).
    ///
    /// # Errors
    /// A name without a value or with a value that is not finite, a division by zero, or a
    /// result beyond `f64`'s range.
    pub fn evaluate(&self, lookup: &dyn Fn(&Name) -> Option<f64>) -> Result<Outcome, EvalError> {
        let left = self.left.eval(&self.text, lookup)?;
        let right = self.right.eval(&self.text, lookup)?;
        Ok(Outcome {
            holds: self.comparison.holds(left, right),
            left,
            right,
        })
    }

    /// One line that shows why the expectation failed: both sides and their values, e.g.
    /// ``` `dropped_full_ring == 0` failed: left `dropped_full_ring` = 49000, right = 0 ```.
    #[must_use]
    pub fn failure_message(&self, outcome: &Outcome) -> String {
        format!(
            "`{}` failed: left {}, right {}",
            self.text,
            self.side(&self.left, outcome.left),
            self.side(&self.right, outcome.right)
        )
    }

    /// A side as `` `text` = value ``, or only the value for a literal number.
    fn side(&self, expr: &Expr, value: f64) -> String {
        match expr.kind {
            ExprKind::Number(_) => format!("= {}", format_value(value)),
            _ => format!(
                "`{}` = {}",
                &self.text[expr.span.start..expr.span.end],
                format_value(value)
            ),
        }
    }
}

/// A value as the messages show it: integers without a fraction, other values in the
/// shortest form that reads back as the same `f64`, so nothing is rounded away.
pub(crate) fn format_value(value: f64) -> String {
    format!("{value}")
}

/// A name that no measurement provides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnknownName {
    pub(crate) name: Name,
    /// The known name closest in spelling, if one is close.
    pub(crate) suggestion: Option<Name>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownNames(pub(crate) Vec<UnknownName>);

impl fmt::Display for UnknownNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, unknown) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(
                f,
                "unknown name `{}`",
                clipped(&unknown.name.to_string(), MAX_CHARS)
            )?;
            if let Some(suggestion) = &unknown.suggestion {
                write!(f, " (did you mean `{suggestion}`?)")?;
            }
        }
        Ok(())
    }
}

impl std::error::Error for UnknownNames {}

/// The known name within two edits of `name`, the closest first; `None` when none is.
fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (edit_distance(name, k), *k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance over chars.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// A syntax error, with the column it is at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseError {
    text: String,
    /// 1-based, in characters.
    column: usize,
    /// Characters the caret line underlines (at least one).
    width: usize,
    message: String,
}

impl ParseError {
    fn new(text: &str, span: Span, message: String) -> Self {
        let start = span.start.min(text.len());
        let end = span.end.clamp(start, text.len());
        Self {
            text: text.to_owned(),
            column: text[..start].chars().count() + 1,
            width: text[start..end].chars().count().max(1),
            message,
        }
    }

    /// 1-based column of the error, in characters.
    #[cfg(test)]
    pub(crate) fn column(&self) -> usize {
        self.column
    }

    /// What is wrong and what was expected, without the position.
    #[cfg(test)]
    pub(crate) fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ParseError {
    /// The message, then the expression and a caret line under the culprit
    /// ([`crate::caret`]: cut around it when the expression is long).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at column {}\n{}",
            self.message,
            self.column,
            crate::caret::under(&self.text, self.column - 1, self.width, "    ")
        )
    }
}

impl std::error::Error for ParseError {}

#[cfg(test)]
pub(crate) mod tests;
