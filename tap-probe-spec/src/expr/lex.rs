//! Lexing: an expectation's text as tokens, each with its span.

use super::{BinOp, Comparison, MAX_EXACT_INTEGER, Name, ParseError, Span};

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    Number(f64),
    Name(Name),
    Op(BinOp),
    Cmp(Comparison),
    Open,
    Close,
    End,
}

impl Tok {
    pub(super) fn describe(&self) -> String {
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

pub(super) fn lex(text: &str) -> Result<Vec<(Tok, Span)>, ParseError> {
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
