//! Parsing: tokens into an [`Expectation`], by recursive descent on the grammar in the
//! module's documentation.

use super::lex::{Tok, lex};
use super::{BinOp, Expectation, Expr, ExprKind, MAX_DEPTH, ParseError, Span};

/// Lexes and parses one expectation (its length already checked).
pub(super) fn expectation(text: &str) -> Result<Expectation, ParseError> {
    let tokens = lex(text)?;
    let mut parser = Parser {
        text,
        tokens,
        pos: 0,
        depth: 0,
    };
    parser.expectation()
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
