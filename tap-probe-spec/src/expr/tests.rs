//! The expression language as a whole: lexing, parsing and evaluation together.

#![expect(
    clippy::float_cmp,
    reason = "the evaluation is exact, and so are its tests"
)]

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// The names the tests' measurements provide (the spec's tests check against them too).
pub(crate) const KNOWN: &[&str] = &[
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
    let e =
        Expectation::parse("dropped_ful_ring + baseline.sentt + nonsense_xyz == stuck").unwrap();
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
