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
pub(crate) enum Name {
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
pub(crate) struct Expectation {
    text: String,
    left: Expr,
    comparison: Comparison,
    right: Expr,
}

/// The values both sides had and whether the comparison held.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Outcome {
    pub(crate) holds: bool,
    pub(crate) left: f64,
    pub(crate) right: f64,
}

impl Expectation {
    /// Parses one expectation.
    ///
    /// # Errors
    /// When the text is not an expectation; the error points at the column.
    pub(crate) fn parse(text: &str) -> Result<Self, ParseError> {
        if text.chars().count() > MAX_LEN {
            return Err(ParseError::new(
                text,
                Span::new(0, text.len()),
                format!(
                    "the expression is longer than {MAX_LEN} characters; split it into several expectations"
                ),
            ));
        }
        let tokens = lex(text)?;
        let mut parser = Parser {
            text,
            tokens,
            pos: 0,
            depth: 0,
        };
        parser.expectation()
    }

    /// The expectation as written.
    pub(crate) fn text(&self) -> &str {
        &self.text
    }

    /// Every name the expectation uses, each once: the measured ones, then the baseline's,
    /// each sorted.
    pub(crate) fn names(&self) -> BTreeSet<&Name> {
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
    pub(crate) fn check_names(&self, known: &[&str]) -> Result<(), UnknownNames> {
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
    pub(crate) fn evaluate(
        &self,
        lookup: &dyn Fn(&Name) -> Option<f64>,
    ) -> Result<Outcome, EvalError> {
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
    pub(crate) fn failure_message(&self, outcome: &Outcome) -> String {
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

impl Expr {
    fn collect_names<'a>(&'a self, out: &mut BTreeSet<&'a Name>) {
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

    fn eval(&self, text: &str, lookup: &dyn Fn(&Name) -> Option<f64>) -> Result<f64, EvalError> {
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
pub(crate) enum EvalError {
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

/// A name that no measurement provides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnknownName {
    pub(crate) name: Name,
    /// The known name closest in spelling, if one is close.
    pub(crate) suggestion: Option<Name>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnknownNames(pub(crate) Vec<UnknownName>);

impl fmt::Display for UnknownNames {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, unknown) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "unknown name `{}`", unknown.name)?;
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
pub(crate) struct ParseError {
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
    /// The message, then the expression and a caret line under the culprit. Control
    /// characters show as spaces so that the caret stays under its column.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown: String = self
            .text
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
        write!(
            f,
            "{} at column {}\n    {}\n    {}{}",
            self.message,
            self.column,
            shown.trim_end(),
            " ".repeat(self.column - 1),
            "^".repeat(self.width)
        )
    }
}

impl std::error::Error for ParseError {}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Number(f64),
    Name(Name),
    Op(BinOp),
    Cmp(Comparison),
    Open,
    Close,
    End,
}

impl Tok {
    fn describe(&self) -> String {
        match self {
            Tok::Number(v) => format!("the number {v}"),
            Tok::Name(name) => format!("the name `{name}`"),
            Tok::Op(op) => format!(
                "`{}`",
                match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                }
            ),
            Tok::Cmp(c) => format!("`{}`", c.symbol()),
            Tok::Open => "`(`".to_owned(),
            Tok::Close => "`)`".to_owned(),
            Tok::End => "the end".to_owned(),
        }
    }
}

fn lex(text: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let (tok, end) = match bytes[i] {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            b'+' => (Tok::Op(BinOp::Add), i + 1),
            b'-' => (Tok::Op(BinOp::Sub), i + 1),
            b'*' => (Tok::Op(BinOp::Mul), i + 1),
            b'/' => (Tok::Op(BinOp::Div), i + 1),
            b'(' => (Tok::Open, i + 1),
            b')' => (Tok::Close, i + 1),
            b'=' | b'!' | b'<' | b'>' => {
                let (cmp, end) = lex_comparison(text, i)?;
                (Tok::Cmp(cmp), end)
            }
            b'0'..=b'9' => {
                let (value, end) = lex_number(text, i)?;
                (Tok::Number(value), end)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let (name, end) = lex_name(text, i)?;
                (Tok::Name(name), end)
            }
            b'.' => {
                return Err(ParseError::new(
                    text,
                    Span::new(i, i + 1),
                    "a number starts with a digit; write `0.5`, not `.5`".to_owned(),
                ));
            }
            _ => {
                let ch = text[i..]
                    .chars()
                    .next()
                    .unwrap_or(char::REPLACEMENT_CHARACTER);
                return Err(ParseError::new(
                    text,
                    Span::new(i, i + ch.len_utf8()),
                    format!(
                        "unexpected `{}`; expected a number, a name, `+ - * /`, parentheses \
                         or a comparison (`== != < <= > >=`)",
                        ch.escape_default()
                    ),
                ));
            }
        };
        out.push((tok, Span::new(i, end)));
        i = end;
    }
    out.push((Tok::End, Span::new(text.len(), text.len())));
    Ok(out)
}

/// Scans a comparison from `start` (at `=`, `!`, `<` or `>`); returns it and the end.
fn lex_comparison(text: &str, start: usize) -> Result<(Comparison, usize), ParseError> {
    let bytes = text.as_bytes();
    let eq_follows = bytes.get(start + 1) == Some(&b'=');
    let cmp = match (bytes[start], eq_follows) {
        (b'=', true) => Comparison::Eq,
        (b'!', true) => Comparison::Ne,
        (b'<', true) => Comparison::Le,
        (b'>', true) => Comparison::Ge,
        (b'<', false) => Comparison::Lt,
        (b'>', false) => Comparison::Gt,
        (b'=', false) => {
            return Err(ParseError::new(
                text,
                Span::new(start, start + 1),
                "`=` is not a comparison; write `==`".to_owned(),
            ));
        }
        _ => {
            return Err(ParseError::new(
                text,
                Span::new(start, start + 1),
                "`!` is not an operator; write `!=` to compare".to_owned(),
            ));
        }
    };
    Ok((cmp, start + if eq_follows { 2 } else { 1 }))
}

/// Scans `digits ["." digits] [e [+-] digits]` from `start`; returns the value and the end.
fn lex_number(text: &str, start: usize) -> Result<(f64, usize), ParseError> {
    let bytes = text.as_bytes();
    let digits = |mut i: usize| -> Result<usize, ParseError> {
        // A digit run, with `_` allowed only between two digits.
        let first = i;
        while i < bytes.len() && (bytes[i].is_ascii_digit() || bytes[i] == b'_') {
            if bytes[i] == b'_' && (i == first || !bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
            {
                return Err(ParseError::new(
                    text,
                    Span::new(i, i + 1),
                    "`_` separates digits and must stand between two of them (`50_000`)".to_owned(),
                ));
            }
            i += 1;
        }
        Ok(i)
    };
    let mut i = digits(start)?;
    let mut integer = true;
    if bytes.get(i) == Some(&b'.') {
        integer = false;
        if !bytes.get(i + 1).is_some_and(u8::is_ascii_digit) {
            return Err(ParseError::new(
                text,
                Span::new(i, i + 1),
                "expected a digit after the decimal point (`1.0`, not `1.`)".to_owned(),
            ));
        }
        i = digits(i + 1)?;
    }
    if matches!(bytes.get(i), Some(b'e' | b'E')) {
        integer = false;
        let mut j = i + 1;
        if matches!(bytes.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        if !bytes.get(j).is_some_and(u8::is_ascii_digit) {
            return Err(ParseError::new(
                text,
                Span::new(i, j),
                "expected the exponent's digits after `e` (`1e6`)".to_owned(),
            ));
        }
        i = digits(j)?;
    }
    if let Some(&c) = bytes.get(i)
        && (c.is_ascii_alphabetic() || c == b'_' || c == b'.')
    {
        return Err(ParseError::new(
            text,
            Span::new(start, i + 1),
            format!(
                "a number ends before `{}`; units and suffixes are not supported, write the \
                 plain number (`1000000` or `1e6` for 1M)",
                char::from(c)
            ),
        ));
    }
    let span = Span::new(start, i);
    let literal: String = text[start..i].chars().filter(|&c| c != '_').collect();
    let value: f64 = literal
        .parse()
        .map_err(|_| ParseError::new(text, span, format!("`{literal}` is not a number")))?;
    if !value.is_finite() {
        return Err(ParseError::new(
            text,
            span,
            "the number is beyond the range of a 64-bit float".to_owned(),
        ));
    }
    // Compared as written: above 2^53 the float has already rounded the literal.
    let too_big = integer
        && (literal.trim_start_matches('0').len() > 16
            || literal.parse::<u64>().is_ok_and(|n| n > MAX_EXACT_INTEGER));
    if too_big {
        return Err(ParseError::new(
            text,
            span,
            "an integer above 2^53 has no exact 64-bit float; use a smaller one".to_owned(),
        ));
    }
    Ok((value, i))
}

/// Scans a name (`ident` or `baseline.ident`) from `start`; returns it and the end.
fn lex_name(text: &str, start: usize) -> Result<(Name, usize), ParseError> {
    let bytes = text.as_bytes();
    let ident_end = |mut i: usize| {
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
            i += 1;
        }
        i
    };
    let mut end = ident_end(start);
    // Dotted parts belong to the name, so that the error below can show it whole.
    while bytes.get(end) == Some(&b'.')
        && bytes
            .get(end + 1)
            .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
    {
        end = ident_end(end + 1);
    }
    let whole = &text[start..end];
    let span = Span::new(start, end);
    if whole.bytes().any(|c| c.is_ascii_uppercase()) {
        return Err(ParseError::new(
            text,
            span,
            format!(
                "names are lower case; write `{}`",
                whole.to_ascii_lowercase()
            ),
        ));
    }
    let parts: Vec<&str> = whole.split('.').collect();
    match parts.as_slice() {
        [name] if *name == "baseline" => Err(ParseError::new(
            text,
            span,
            "`baseline` needs the name of a value: `baseline.NAME`, e.g. \
             `baseline.delivered_pps`"
                .to_owned(),
        )),
        [name] => Ok((Name::Measured((*name).to_owned()), end)),
        ["baseline", name] if *name != "baseline" => Ok((Name::Baseline((*name).to_owned()), end)),
        _ => Err(ParseError::new(
            text,
            span,
            format!(
                "only `baseline.NAME` has a dot; counters of nested JSON objects are flat \
                 here (`{}`)",
                parts
                    .iter()
                    .skip(usize::from(parts[0] == "baseline"))
                    .copied()
                    .collect::<Vec<_>>()
                    .join("_")
            ),
        )),
    }
}

struct Parser<'a> {
    text: &'a str,
    tokens: Vec<(Tok, Span)>,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &(Tok, Span) {
        // `lex` always ends the list with `End`, which the parser never steps over.
        &self.tokens[self.pos.min(self.tokens.len() - 1)]
    }

    fn bump(&mut self) -> (Tok, Span) {
        let tok = self.peek().clone();
        if tok.0 != Tok::End {
            self.pos += 1;
        }
        tok
    }

    fn error(&self, span: Span, message: String) -> ParseError {
        ParseError::new(self.text, span, message)
    }

    fn expectation(&mut self) -> Result<Expectation, ParseError> {
        if self.peek().0 == Tok::End {
            return Err(self.error(
                self.peek().1,
                "empty expectation; write a comparison such as `dropped_full_ring == 0`".to_owned(),
            ));
        }
        let left = self.sum()?;
        let (tok, span) = self.bump();
        let comparison = match tok {
            Tok::Cmp(c) => c,
            Tok::Close => return Err(self.error(span, "unmatched `)`".to_owned())),
            Tok::End => {
                return Err(self.error(
                    span,
                    "expected a comparison (`== != < <= > >=`): an expectation compares two \
                     sides"
                        .to_owned(),
                ));
            }
            other => {
                return Err(self.error(
                    span,
                    format!(
                        "expected an operator (`+ - * /`) or a comparison (`== != < <= > >=`), \
                         found {}",
                        other.describe()
                    ),
                ));
            }
        };
        let right = self.sum()?;
        let (tok, span) = self.bump();
        match tok {
            Tok::End => Ok(Expectation {
                text: self.text.to_owned(),
                left,
                comparison,
                right,
            }),
            Tok::Cmp(_) => Err(self.error(
                span,
                "only one comparison per expectation; split it into two expectations".to_owned(),
            )),
            Tok::Close => Err(self.error(span, "unmatched `)`".to_owned())),
            other => Err(self.error(
                span,
                format!(
                    "expected an operator (`+ - * /`) or the end, found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn sum(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.product()?;
        while let Tok::Op(op @ (BinOp::Add | BinOp::Sub)) = self.peek().0 {
            self.bump();
            let right = self.product()?;
            left = binary(op, left, right);
        }
        Ok(left)
    }

    fn product(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        while let Tok::Op(op @ (BinOp::Mul | BinOp::Div)) = self.peek().0 {
            self.bump();
            let right = self.unary()?;
            left = binary(op, left, right);
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        if self.peek().0 == Tok::Op(BinOp::Sub) {
            let (_, minus) = self.bump();
            self.enter(minus)?;
            let inner = self.unary()?;
            self.depth -= 1;
            return Ok(Expr {
                span: minus.to(inner.span),
                kind: ExprKind::Neg(Box::new(inner)),
            });
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        let (tok, span) = self.bump();
        match tok {
            Tok::Number(v) => Ok(Expr {
                kind: ExprKind::Number(v),
                span,
            }),
            Tok::Name(name) => Ok(Expr {
                kind: ExprKind::Name(name),
                span,
            }),
            Tok::Open => {
                self.enter(span)?;
                let inner = self.sum()?;
                self.depth -= 1;
                let (close, close_span) = self.bump();
                if close != Tok::Close {
                    return Err(self.error(
                        close_span,
                        format!(
                            "expected `)` to close the `(` at column {}, found {}",
                            self.text[..span.start].chars().count() + 1,
                            close.describe()
                        ),
                    ));
                }
                // The parentheses belong to the side's text in failure messages.
                Ok(Expr {
                    kind: inner.kind,
                    span: span.to(close_span),
                })
            }
            other => Err(self.error(
                span,
                format!(
                    "expected a number, a name or `(`, found {}",
                    other.describe()
                ),
            )),
        }
    }

    fn enter(&mut self, span: Span) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(self.error(
                span,
                format!("nested more than {MAX_DEPTH} levels deep; simplify the expression"),
            ));
        }
        Ok(())
    }
}

fn binary(op: BinOp, left: Expr, right: Expr) -> Expr {
    Expr {
        span: left.span.to(right.span),
        kind: ExprKind::Binary(op, Box::new(left), Box::new(right)),
    }
}

#[cfg(test)]
#[expect(
    clippy::float_cmp,
    reason = "the evaluation is exact, and so are its tests"
)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    const KNOWN: &[&str] = &[
        "sent",
        "consumed",
        "dropped_full_ring",
        "qdisc_drops",
        "delivered_pps",
        "stuck",
    ];

    fn values(pairs: &[(&str, f64)]) -> BTreeMap<Name, f64> {
        pairs
            .iter()
            .map(|(k, v)| {
                let name = match k.strip_prefix(BASELINE_PREFIX) {
                    Some(base) => Name::Baseline(base.to_owned()),
                    None => Name::Measured((*k).to_owned()),
                };
                (name, *v)
            })
            .collect()
    }

    fn eval(text: &str, pairs: &[(&str, f64)]) -> Result<Outcome, EvalError> {
        let env = values(pairs);
        Expectation::parse(text)
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .evaluate(&|name| env.get(name).copied())
    }

    fn holds(text: &str) -> bool {
        eval(text, &[])
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .holds
    }

    fn parse_err(text: &str) -> ParseError {
        match Expectation::parse(text) {
            Ok(e) => panic!("{text} parsed as {e:?}"),
            Err(e) => e,
        }
    }

    #[test]
    fn precedence_and_associativity() {
        assert!(holds("1 + 2 * 3 == 7"));
        assert!(holds("(1 + 2) * 3 == 9"));
        assert!(holds("2 - 3 - 4 == -5"));
        assert!(holds("8 / 4 / 2 == 1"));
        assert!(holds("-2 * -3 == 6"));
        assert!(holds("- - 1 == 1"));
        assert!(holds("-(2 + 3) == -5"));
        assert!(holds("10 - 2 * 3 + 1 == 5"));
        assert!(holds("1 + 2 == 4 - 1"));
    }

    #[test]
    fn every_comparison() {
        for (text, expected) in [
            ("1 == 1", true),
            ("1 == 2", false),
            ("1 != 2", true),
            ("1 != 1", false),
            ("1 < 2", true),
            ("2 < 2", false),
            ("2 <= 2", true),
            ("3 <= 2", false),
            ("3 > 2", true),
            ("2 > 2", false),
            ("2 >= 2", true),
            ("1 >= 2", false),
        ] {
            assert_eq!(holds(text), expected, "{text}");
        }
    }

    #[test]
    fn numbers() {
        assert!(holds("0.95 * 100 == 95"));
        assert!(holds("1e6 == 1000000"));
        assert!(holds("1E6 == 1_000_000"));
        assert!(holds("2.5e-1 == 0.25"));
        assert!(holds("1e+2 == 100"));
        assert!(holds("007 == 7"));
        assert!(holds("9007199254740992 == 9007199254740992"));
    }

    #[test]
    fn whitespace_is_free() {
        assert!(holds("1+2==3"));
        assert!(holds("\t1 +\n 2  ==\r\n3 "));
    }

    #[test]
    fn counters_compare_exactly() {
        let one_missing = eval(
            "consumed + qdisc_drops == sent",
            &[
                ("consumed", 49_999.0),
                ("qdisc_drops", 0.0),
                ("sent", 50_000.0),
            ],
        );
        assert!(!one_missing.unwrap().holds);
        let all_there = eval(
            "consumed + qdisc_drops == sent",
            &[
                ("consumed", 1000.0),
                ("qdisc_drops", 49_000.0),
                ("sent", 50_000.0),
            ],
        );
        assert!(all_there.unwrap().holds);
        // The largest counter values still differ by one.
        let big = eval(
            "sent == consumed",
            &[
                ("sent", 9_007_199_254_740_992.0),
                ("consumed", 9_007_199_254_740_991.0),
            ],
        );
        assert!(!big.unwrap().holds);
    }

    #[test]
    fn outcome_has_both_sides_and_message() {
        let e = Expectation::parse("dropped_full_ring == 0").unwrap();
        let outcome = e
            .evaluate(&|n| (n.base() == "dropped_full_ring").then_some(49_000.0))
            .unwrap();
        assert_eq!(
            outcome,
            Outcome {
                holds: false,
                left: 49_000.0,
                right: 0.0
            }
        );
        assert_eq!(
            e.failure_message(&outcome),
            "`dropped_full_ring == 0` failed: left `dropped_full_ring` = 49000, right = 0"
        );
    }

    #[test]
    fn message_shows_expression_sides_with_parentheses() {
        let env = values(&[("delivered_pps", 90.0), ("baseline.delivered_pps", 100.0)]);
        let e = Expectation::parse("delivered_pps >= 0.95 * (baseline.delivered_pps)").unwrap();
        let outcome = e.evaluate(&|n| env.get(n).copied()).unwrap();
        assert!(!outcome.holds);
        assert_eq!(
            e.failure_message(&outcome),
            "`delivered_pps >= 0.95 * (baseline.delivered_pps)` failed: left `delivered_pps` \
             = 90, right `0.95 * (baseline.delivered_pps)` = 95"
        );
        let e = Expectation::parse("(sent) == -(1)").unwrap();
        let outcome = e.evaluate(&|_| Some(2.0)).unwrap();
        assert_eq!(
            e.failure_message(&outcome),
            "`(sent) == -(1)` failed: left `(sent)` = 2, right `-(1)` = -1"
        );
    }

    #[test]
    fn names_used() {
        let e = Expectation::parse("consumed + qdisc_drops == sent - 0 * consumed + baseline.sent")
            .unwrap();
        let names: Vec<String> = e.names().into_iter().map(ToString::to_string).collect();
        assert_eq!(names, ["consumed", "qdisc_drops", "sent", "baseline.sent"]);
        assert!(Expectation::parse("1 == 1").unwrap().names().is_empty());
    }

    #[test]
    fn known_names_come_from_the_caller() {
        let e = Expectation::parse("dropped_ful_ring + baseline.sentt + nonsense_xyz == stuck")
            .unwrap();
        let err = e.check_names(KNOWN).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown name `dropped_ful_ring` (did you mean `dropped_full_ring`?); unknown name \
             `nonsense_xyz`; unknown name `baseline.sentt` (did you mean `baseline.sent`?)"
        );
        assert!(
            e.check_names(&["dropped_ful_ring", "sentt", "nonsense_xyz", "stuck"])
                .is_ok()
        );
        assert!(
            Expectation::parse("stuck == 0")
                .unwrap()
                .check_names(&[])
                .is_err()
        );
    }

    #[test]
    fn evaluation_errors() {
        assert_eq!(
            eval(
                "consumed / sent >= 0.5",
                &[("consumed", 1.0), ("sent", 0.0)]
            ),
            Err(EvalError::DivisionByZero {
                divisor: "sent".to_owned()
            })
        );
        assert_eq!(
            eval("1 / (sent - sent) == 0", &[("sent", 5.0)]),
            Err(EvalError::DivisionByZero {
                divisor: "(sent - sent)".to_owned()
            })
        );
        assert!(matches!(
            eval("1 / -0.0 == 0", &[]),
            Err(EvalError::DivisionByZero { .. })
        ));
        assert_eq!(
            eval("stuck == 0", &[]),
            Err(EvalError::NotMeasured(Name::Measured("stuck".to_owned())))
        );
        assert_eq!(
            eval("baseline.sent == 0", &[("sent", 1.0)]),
            Err(EvalError::NotMeasured(Name::Baseline("sent".to_owned())))
        );
        assert!(matches!(
            eval("sent == 0", &[("sent", f64::NAN)]),
            Err(EvalError::NotFiniteValue(..))
        ));
        assert_eq!(
            eval("1e300 * 1e300 > 0", &[]),
            Err(EvalError::Overflow {
                part: "1e300 * 1e300".to_owned()
            })
        );
        let msg = eval(
            "consumed / sent >= 0.5",
            &[("consumed", 1.0), ("sent", 0.0)],
        )
        .unwrap_err()
        .to_string();
        assert!(msg.contains("`sent` is 0"), "{msg}");
    }

    #[test]
    fn syntax_errors_point_at_the_column() {
        let cases: &[(&str, usize, &str)] = &[
            ("", 1, "empty expectation"),
            ("   ", 4, "empty expectation"),
            ("sent", 5, "expected a comparison"),
            ("sent + 1", 9, "expected a comparison"),
            ("sent = 0", 6, "write `==`"),
            ("!sent", 1, "write `!=`"),
            (
                "consumed + == sent",
                12,
                "expected a number, a name or `(`, found `==`",
            ),
            ("a == b == c", 8, "only one comparison"),
            ("a < b > c", 7, "only one comparison"),
            (
                "(a == b",
                4,
                "expected `)` to close the `(` at column 1, found `==`",
            ),
            (
                "(a + b == c",
                8,
                "expected `)` to close the `(` at column 1",
            ),
            ("a) == b", 2, "unmatched `)`"),
            ("a == b)", 7, "unmatched `)`"),
            (
                "a == b c",
                8,
                "expected an operator (`+ - * /`) or the end, found the name `c`",
            ),
            ("a b == c", 3, "found the name `b`"),
            ("Sent == 0", 1, "names are lower case; write `sent`"),
            ("sent == 5k", 9, "units and suffixes are not supported"),
            ("sent == 1.", 10, "after the decimal point"),
            ("sent == .5", 9, "write `0.5`"),
            ("sent == 1e", 10, "exponent"),
            ("sent == 1_", 10, "`_` separates digits"),
            ("sent == 1__0", 10, "`_` separates digits"),
            ("sent == 1e999", 9, "beyond the range"),
            ("sent == 9007199254740993", 9, "above 2^53"),
            ("kernel.tx_packets == 0", 1, "(`kernel_tx_packets`)"),
            (
                "baseline.kernel.tx_packets == 0",
                1,
                "(`kernel_tx_packets`)",
            ),
            ("baseline == 0", 1, "`baseline.NAME`"),
            (
                "baseline.baseline == 0",
                1,
                "only `baseline.NAME` has a dot",
            ),
            ("sent % 2 == 0", 6, "unexpected `%`"),
            ("sent == 0 ;", 11, "unexpected `;`"),
            ("é == 0", 1, "unexpected `\\u{e9}`"),
            ("sent == é", 9, "unexpected"),
            (
                "a == -",
                7,
                "expected a number, a name or `(`, found the end",
            ),
        ];
        for (text, column, message) in cases {
            let err = parse_err(text);
            assert_eq!(err.column(), *column, "{text}: {err}");
            assert!(err.message().contains(message), "{text}: {err}");
        }
    }

    #[test]
    fn caret_line_underlines_the_culprit() {
        assert_eq!(
            parse_err("consumed + == sent").to_string(),
            "expected a number, a name or `(`, found `==` at column 12\n    consumed + == sent\n               ^^"
        );
        // Control characters show as one space, so the caret stays under its column.
        assert_eq!(
            parse_err("sent\t+ = 1").to_string(),
            "`=` is not a comparison; write `==` at column 8\n    sent + = 1\n           ^"
        );
    }

    #[test]
    fn nesting_and_length_are_bounded() {
        let deep = format!("{}1{} == 1", "(".repeat(32), ")".repeat(32));
        assert!(holds(&deep));
        let too_deep = format!("{}1{} == 1", "(".repeat(33), ")".repeat(33));
        assert!(
            parse_err(&too_deep)
                .message()
                .contains("nested more than 32")
        );
        let minus = format!("{}1 == 1", "-".repeat(33));
        assert!(parse_err(&minus).message().contains("nested more than 32"));
        let long_chain = format!("1{} == 400", "+1".repeat(399));
        assert!(holds(&long_chain));
        let too_long = format!("1{} == 1", "+1".repeat(600));
        assert!(parse_err(&too_long).message().contains("longer than 1000"));
    }

    /// Prints an expression fully parenthesised, so that re-parsing must give the same tree
    /// whatever the precedence.
    fn print(e: &Expr) -> String {
        match &e.kind {
            ExprKind::Number(v) => format!("{v:?}"),
            ExprKind::Name(n) => n.to_string(),
            ExprKind::Neg(inner) => format!("(-{})", print(inner)),
            ExprKind::Binary(op, a, b) => {
                let sym = match op {
                    BinOp::Add => "+",
                    BinOp::Sub => "-",
                    BinOp::Mul => "*",
                    BinOp::Div => "/",
                };
                format!("({} {sym} {})", print(a), print(b))
            }
        }
    }

    fn arb_expr() -> impl Strategy<Value = Expr> {
        let span = Span::new(0, 0);
        let leaf = prop_oneof![
            (0u32..1000).prop_map(move |v| Expr {
                kind: ExprKind::Number(f64::from(v) / 4.0),
                span
            }),
            prop::sample::select(vec!["sent", "consumed", "stuck"]).prop_map(move |n| Expr {
                kind: ExprKind::Name(Name::Measured(n.to_owned())),
                span
            }),
            Just(Expr {
                kind: ExprKind::Name(Name::Baseline("sent".to_owned())),
                span
            }),
        ];
        leaf.prop_recursive(4, 16, 2, move |inner| {
            prop_oneof![
                inner.clone().prop_map(move |e| Expr {
                    kind: ExprKind::Neg(Box::new(e)),
                    span
                }),
                (
                    prop::sample::select(vec![BinOp::Add, BinOp::Sub, BinOp::Mul, BinOp::Div]),
                    inner.clone(),
                    inner
                )
                    .prop_map(move |(op, a, b)| Expr {
                        kind: ExprKind::Binary(op, Box::new(a), Box::new(b)),
                        span
                    }),
            ]
        })
    }

    /// The evaluation of a reference interpreter over the generated tree.
    fn reference(expr: &Expr, env: &dyn Fn(&Name) -> f64) -> Option<f64> {
        let value = match &expr.kind {
            ExprKind::Number(v) => *v,
            ExprKind::Name(name) => env(name),
            ExprKind::Neg(inner) => -reference(inner, env)?,
            ExprKind::Binary(op, left, right) => {
                let (x, y) = (reference(left, env)?, reference(right, env)?);
                match op {
                    BinOp::Add => x + y,
                    BinOp::Sub => x - y,
                    BinOp::Mul => x * y,
                    BinOp::Div if y == 0.0 => return None,
                    BinOp::Div => x / y,
                }
            }
        };
        value.is_finite().then_some(value)
    }

    proptest! {
        #[test]
        fn printed_trees_parse_back_and_evaluate_alike(
            left in arb_expr(),
            right in arb_expr(),
            sent in 0u32..100,
            consumed in 0u32..100,
        ) {
            let env = move |n: &Name| match n.base() {
                "sent" => f64::from(sent),
                "consumed" => f64::from(consumed),
                _ => 3.0,
            };
            let text = format!("{} <= {}", print(&left), print(&right));
            let parsed = Expectation::parse(&text).unwrap();
            prop_assert_eq!(print(&parsed.left), print(&left));
            prop_assert_eq!(print(&parsed.right), print(&right));
            let got = parsed.evaluate(&|n| Some(env(n)));
            match (reference(&left, &env), reference(&right, &env)) {
                (Some(l), Some(r)) => {
                    let outcome = got.unwrap();
                    prop_assert_eq!(outcome.left.to_bits(), l.to_bits());
                    prop_assert_eq!(outcome.right.to_bits(), r.to_bits());
                    prop_assert_eq!(outcome.holds, l <= r);
                }
                _ => prop_assert!(got.is_err()),
            }
        }

        #[test]
        fn arithmetic_matches_rust(a in -1000i32..1000, b in -1000i32..1000, c in 1i32..1000) {
            let (fa, fb, fc) = (f64::from(a), f64::from(b), f64::from(c));
            let text = format!("{a} - {b} * {c} + {a} / {c} - -{b} == 0");
            let outcome = eval(&text, &[]).unwrap();
            prop_assert_eq!(outcome.left, fa - fb * fc + fa / fc - -fb);
        }

        #[test]
        fn never_panics_on_any_text(text in ".{0,200}") {
            match Expectation::parse(&text) {
                Ok(e) => {
                    let _ = e.evaluate(&|_| Some(1.0));
                    let _ = e.check_names(KNOWN);
                }
                Err(err) => {
                    prop_assert!(err.column() >= 1);
                    prop_assert!(err.column() <= text.chars().count() + 1);
                    let _ = err.to_string();
                }
            }
        }

        #[test]
        fn never_panics_on_token_soup(
            parts in prop::collection::vec(
                prop::sample::select(vec![
                    "sent", "baseline.sent", "baseline.", "baseline", "0", "1.5", "1e3", "1_0",
                    "_", ".", "(", ")", "+", "-", "*", "/", "==", "!=", "<", "<=", ">", ">=",
                    "=", "!", " ", "e", "E", "A", "\t",
                ]),
                0..40,
            )
        ) {
            let text = parts.concat();
            match Expectation::parse(&text) {
                Ok(e) => {
                    let _ = e.evaluate(&|_| Some(0.0));
                }
                Err(err) => {
                    prop_assert!(err.column() <= text.chars().count() + 1);
                    let _ = err.to_string();
                }
            }
        }
    }
}
