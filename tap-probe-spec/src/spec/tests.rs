use proptest::prelude::*;

use super::checker::parse_duration;
use super::*;
use crate::expr::tests::KNOWN;
use crate::measured::Measured;

const GOOD: &str = r#"
# Stock behaviour first.
[[scenario]]
name = "stock"
qdisc = "pfifo-fast"
packets = 50000
expect = ["consumed + dropped_full_ring == sent"]

[[scenario]]
name = "fq_codel with backpressure"
qdisc = "fq-codel"          # noqueue | pfifo-fast | pfifo | fq-codel
backpressure = true         # open the tap with IFF_BACKPRESSURE
tx_queue_len = 256
packets = 50000             # and/or duration = "10s"
duration = "1.5s"
sender_threads = 2
pps = 200000
reader = "vhost"
reader_pps = 5000
expect = ["dropped_full_ring == 0", "consumed + qdisc_drops == sent", "stuck == 0"]
"#;

fn parse(text: &str) -> Result<Spec, SpecErrors> {
    Spec::parse(text, KNOWN, None)
}

fn errors(text: &str) -> Vec<SpecError> {
    match parse(text) {
        Ok(spec) => panic!("parsed: {spec:?}"),
        Err(errors) => errors.shown,
    }
}

fn only_error(text: &str) -> SpecError {
    let mut errors = errors(text);
    assert_eq!(errors.len(), 1, "{errors:#?}");
    errors.remove(0)
}

/// One scenario with `line` added to the keys every scenario needs.
fn with(line: &str) -> String {
    format!(
        "[[scenario]]\nname = \"s\"\nqdisc = \"pfifo\"\npackets = 10\nexpect = [\"sent == 10\"]\n{line}\n"
    )
}

#[test]
fn reads_every_key_and_defaults() {
    let spec = parse(GOOD).unwrap();
    assert_eq!(spec.scenarios.len(), 2);
    let stock = &spec.scenarios[0];
    assert_eq!(stock.name, "stock");
    assert_eq!(
        stock.traffic,
        Traffic {
            qdisc: Qdisc::PfifoFast,
            backpressure: false,
            tx_queue_len: 1000,
            packets: Some(50_000),
            duration: None,
            sender_threads: 1,
            pps: None,
            reader: ReaderKind::Read,
            reader_pps: None,
        }
    );
    assert_eq!(stock.expect.len(), 1);
    let fq = &spec.scenarios[1];
    assert_eq!(
        fq.traffic,
        Traffic {
            qdisc: Qdisc::FqCodel,
            backpressure: true,
            tx_queue_len: 256,
            packets: Some(50_000),
            duration: Some(Duration::from_millis(1500)),
            sender_threads: 2,
            pps: Some(200_000),
            reader: ReaderKind::Vhost,
            reader_pps: Some(5000),
        }
    );
    let texts: Vec<&str> = fq.expect.iter().map(Expectation::text).collect();
    assert_eq!(
        texts,
        [
            "dropped_full_ring == 0",
            "consumed + qdisc_drops == sent",
            "stuck == 0"
        ]
    );
}

#[test]
fn every_qdisc_and_reader_spelling() {
    for (text, qdisc) in [
        ("noqueue", Qdisc::Noqueue),
        ("pfifo-fast", Qdisc::PfifoFast),
        ("pfifo", Qdisc::Pfifo),
        ("fq-codel", Qdisc::FqCodel),
        // tc's own names.
        ("pfifo_fast", Qdisc::PfifoFast),
        ("fq_codel", Qdisc::FqCodel),
    ] {
        let spec = parse(&with("").replace("\"pfifo\"", &format!("{text:?}"))).unwrap();
        assert_eq!(spec.scenarios[0].traffic.qdisc, qdisc);
    }
    let spec = parse(&with("reader = \"read\"")).unwrap();
    assert_eq!(spec.scenarios[0].traffic.reader, ReaderKind::Read);
}

#[test]
fn duration_alone_is_enough() {
    let text = "[[scenario]]\nname = \"d\"\nqdisc = \"noqueue\"\nduration = \"2m\"\nexpect = [\"sent > 0\"]\n";
    let t = &parse(text).unwrap().scenarios[0].traffic;
    assert_eq!(t.packets, None);
    assert_eq!(t.duration, Some(Duration::from_mins(2)));
}

#[test]
fn durations() {
    for (text, ms) in [
        ("10s", 10_000),
        ("500ms", 500),
        ("2m", 120_000),
        ("1h", 3_600_000),
        ("1.5s", 1500),
        ("0.001s", 1),
        (" 3s ", 3000),
        ("60m", 3_600_000),
        ("10", 10_000),
        ("2.5", 2_500),
    ] {
        assert_eq!(
            parse_duration(text),
            Ok(Duration::from_millis(ms)),
            "{text}"
        );
    }
    for (text, message) in [
        ("s", "not a duration"),
        ("10 s", "not a duration"),
        ("10sec", "not a duration"),
        ("1.s", "not a duration"),
        (".5s", "not a duration"),
        ("1.2.3s", "not a duration"),
        ("-1s", "not a duration"),
        ("", "not a duration"),
        ("99999999999999999999s", "not a duration"),
        ("0s", "above 0"),
        ("0.0001s", "whole number of milliseconds"),
        ("61m", "longer than 1h"),
        ("1.001h", "longer than 1h; split longer runs"),
    ] {
        let err = parse_duration(text).unwrap_err();
        assert!(err.contains(message), "{text}: {err}");
    }
    for (toml, ms) in [("duration = 10", 10_000), ("duration = 2.5", 2_500)] {
        let text = format!(
            "[[scenario]]\nname = \"d\"\nqdisc = \"noqueue\"\n{toml}\nexpect = [\"sent > 0\"]\n"
        );
        let t = &parse(&text).unwrap().scenarios[0].traffic;
        assert_eq!(t.duration, Some(Duration::from_millis(ms)), "{toml}");
    }
    let err = only_error(&with("duration = -1"));
    assert_eq!(err.key.as_deref(), Some("duration"));
    assert!(err.message.contains("not a duration"), "{err}");
    let err = only_error(&with("duration = true"));
    assert!(err.message.contains("a string with a unit"), "{err}");
    let err = only_error(&with("duration = \"61m\""));
    assert_eq!(err.line, Some(6));
}

#[test]
fn unknown_keys_are_named_with_the_right_ones() {
    let text = GOOD.replace("reader_pps = 5000", "reader_pps = 5000\nqueue_len = 5");
    let err = only_error(&text);
    assert_eq!(
        err.scenario,
        Some(ScenarioRef {
            index: 2,
            name: Some("fq_codel with backpressure".to_owned())
        })
    );
    assert_eq!(err.key.as_deref(), Some("queue_len"));
    assert_eq!(err.line, Some(20));
    assert!(err.message.contains("unknown field `queue_len`"), "{err}");
    assert!(err.message.contains("`tx_queue_len`"), "{err}");
    assert_eq!(
        err.to_string(),
        "scenario 2 (\"fq_codel with backpressure\"), key `queue_len`, line 20: unknown \
             field `queue_len`, expected one of `name`, `qdisc`, `backpressure`, \
             `tx_queue_len`, `packets`, `duration`, `sender_threads`, `pps`, `reader`, \
             `reader_pps`, `expect`\n    20 | queue_len = 5\n       | ^^^^^^^^^"
    );
    let err = only_error("[[scenarios]]\nname = \"x\"\n");
    assert!(err.message.contains("expected `scenario`"), "{err}");
    assert_eq!(err.scenario, None);
    let err = only_error("title = \"x\"\n[[scenario]]\nname = \"x\"\n");
    assert_eq!(err.key.as_deref(), Some("title"));
    assert_eq!(err.scenario, None);
}

#[test]
fn wrong_types_name_the_key() {
    let err = only_error(&with("").replace("\"pfifo\"", "\"htb\""));
    assert_eq!(err.key.as_deref(), Some("qdisc"));
    assert!(
        err.message.contains(
            "unknown variant `htb`, expected one of `noqueue`, `pfifo-fast`, `pfifo_fast`, \
             `pfifo`, `fq-codel`, `fq_codel`"
        ),
        "{err}"
    );
    assert_eq!(err.scenario.unwrap().name.as_deref(), Some("s"));
    let err = only_error(&with("backpressure = \"yes\""));
    assert_eq!(err.key.as_deref(), Some("backpressure"));
    assert!(err.message.contains("expected a boolean"), "{err}");
    let err = only_error(&with("reader = \"qemu\""));
    assert!(err.message.contains("expected `read` or `vhost`"), "{err}");
    let err = only_error(&with("").replace("[\"sent == 10\"]", "\"sent == 10\""));
    assert_eq!(err.key.as_deref(), Some("expect"));
    assert!(err.message.contains("expected a sequence"), "{err}");
}

#[test]
fn keys_are_found_in_arrays_and_inline_tables() {
    let err = only_error(
        "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\nexpect = [\n  \"a == b\",\n  3,\n]\n",
    );
    assert_eq!(err.key.as_deref(), Some("expect"), "{err}");
    assert_eq!(err.line, Some(7));
    let err = only_error("scenario = [{name = \"a\", foo = 1}]\n");
    assert_eq!(err.key.as_deref(), Some("foo"), "{err}");
    assert_eq!(err.scenario.map(|s| s.index), Some(1));
    let err = only_error("scenario = [{name = \"a\", packets = \"x\"}]\n");
    assert_eq!(err.key.as_deref(), Some("packets"), "{err}");
    let err = only_error("[[scenario]]\nname = \"a\"\n[scenario.x]\n");
    assert_eq!(err.key, None, "{err}");
    assert!(err.message.contains("unknown field `x`"), "{err}");
}

#[test]
fn toml_syntax_errors_give_the_line() {
    let err = only_error("[[scenario]]\nname = \"a\"\n\n[[scenario]]\nname = \"b\nqdisc = 1\n");
    assert_eq!(err.line, Some(5));
    assert_eq!(err.scenario.map(|s| s.index), Some(2));
    let err = only_error("[[scenario]]\nname = \"a\"\nname = \"b\"\n");
    assert!(err.message.contains("duplicate key"), "{err}");
    assert_eq!(err.line, Some(3));
}

#[test]
fn ranges_are_checked_with_the_right_range() {
    for (line, key, message) in [
        (
            "tx_queue_len = 0",
            "tx_queue_len",
            "0 is out of range: use 1..=524288",
        ),
        ("tx_queue_len = 524289", "tx_queue_len", "use 1..=524288"),
        ("tx_queue_len = -1", "tx_queue_len", "-1 is out of range"),
        ("sender_threads = 0", "sender_threads", "use 1..=16"),
        ("sender_threads = 17", "sender_threads", "use 1..=16"),
        ("pps = -5", "pps", "use 0..=100000000"),
        ("pps = 100000001", "pps", "use 0..=100000000"),
        (
            "reader_pps = 0",
            "reader_pps",
            "omit the key for a reader as fast as it can",
        ),
    ] {
        let err = only_error(&with(line));
        assert_eq!(err.key.as_deref(), Some(key), "{line}: {err}");
        assert!(err.message.contains(message), "{line}: {err}");
        assert_eq!(err.line, Some(6), "{line}");
        assert!(err.detail.unwrap().contains(line), "{line}");
    }
    let err = only_error(&with("").replace("packets = 10", "packets = 100000001"));
    assert!(err.message.contains("use 1..=100000000"), "{err}");
    let err = only_error(&with("").replace("packets = 10", "packets = 0"));
    assert!(err.message.contains("0 is out of range"), "{err}");
    let spec = parse(&with("tx_queue_len = 524288\nsender_threads = 16\npps = 0")).unwrap();
    let t = &spec.scenarios[0].traffic;
    assert_eq!(
        (t.tx_queue_len, t.sender_threads, t.pps),
        (524_288, 16, None)
    );
}

#[test]
fn missing_keys_point_at_the_scenario() {
    let text = "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\nexpect = [\"sent == 1\"]\n\n[[scenario]]\nexpect = []\n";
    let errors = errors(text);
    let described: Vec<(Option<&str>, Option<usize>)> =
        errors.iter().map(|e| (e.key.as_deref(), e.line)).collect();
    assert_eq!(
        described,
        [
            (Some("name"), Some(7)),
            (Some("qdisc"), Some(7)),
            (Some("packets"), Some(7)),
            (Some("expect"), Some(8)),
        ]
    );
    assert!(errors.iter().all(|e| e.scenario
        == Some(ScenarioRef {
            index: 2,
            name: None
        })));
    assert!(errors[2].message.contains("duration"), "{}", errors[2]);
    assert!(
        errors[3].message.contains("the list is empty"),
        "{}",
        errors[3]
    );
    let err = only_error("[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\n");
    assert!(err.message.contains("missing key `expect`"), "{err}");
}

#[test]
fn no_scenarios_is_an_error() {
    for text in ["", "# nothing\n", "scenario = []\n"] {
        let err = only_error(text);
        assert!(err.message.contains("no scenarios"), "{err}");
    }
}

#[test]
fn names_are_unique_and_printable() {
    let first = GOOD.split("[[scenario]]").nth(1).unwrap();
    let err = only_error(&format!("{GOOD}[[scenario]]{first}"));
    assert!(err.message.contains("also scenario 1's"), "{err}");
    assert_eq!(err.key.as_deref(), Some("name"));
    assert_eq!(
        err.scenario,
        Some(ScenarioRef {
            index: 3,
            name: Some("stock".to_owned())
        })
    );
    for (name, message) in [
        ("", "empty"),
        ("  ", "empty"),
        ("a\\u0007b", "control characters"),
        (" a", "white space"),
    ] {
        let err = only_error(&with("").replace("name = \"s\"", &format!("name = \"{name}\"")));
        assert!(err.message.contains(message), "{name}: {err}");
    }
    let long = "x".repeat(201);
    let err = only_error(&with("").replace("name = \"s\"", &format!("name = \"{long}\"")));
    assert!(err.message.contains("longer than 200"), "{err}");
}

#[test]
fn expression_errors_show_the_column() {
    let err =
        only_error(&with("").replace("\"sent == 10\"", "\"sent == 10\", \"consumed + == sent\""));
    assert_eq!(err.key.as_deref(), Some("expect[1]"));
    assert_eq!(err.line, Some(5));
    assert_eq!(
        err.to_string(),
        "scenario 1 (\"s\"), key `expect[1]`, line 5: expected a number, a name or `(`, \
             found `==` at column 12\n    consumed + == sent\n               ^^"
    );
}

#[test]
fn unknown_names_are_found_before_traffic() {
    let err = only_error(&with("").replace("sent == 10", "droped_full_ring == 0"));
    assert_eq!(err.key.as_deref(), Some("expect[0]"));
    assert_eq!(
        err.message,
        "unknown name `droped_full_ring` (did you mean `dropped_full_ring`?)"
    );
    let err = only_error(&with("").replace("sent == 10", "bogus == 0"));
    assert!(
        err.message.ends_with(
            "the known names are sent, consumed, dropped_full_ring, \
                                   qdisc_drops, delivered_pps, stuck"
        ),
        "{err}"
    );
    // The known names are the caller's.
    let text = with("").replace("sent == 10", "bogus == 0");
    assert!(Spec::parse(&text, &["bogus"], None).is_ok());
}

#[test]
fn all_problems_are_reported_at_once() {
    let text = "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 0\nsender_threads = 99\nexpect = [\"sent ==\", \"nope == 1\", \"sent == 1\"]\n\n[[scenario]]\nname = \"b\"\nqdisc = \"noqueue\"\nduration = -5\nexpect = [\"sent > 0\"]\n";
    let keys: Vec<String> = errors(text)
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e.scenario.as_ref().unwrap().index,
                e.key.clone().unwrap()
            )
        })
        .collect();
    assert_eq!(
        keys,
        [
            "1:packets",
            "1:sender_threads",
            "1:expect[0]",
            "1:expect[1]",
            "2:duration"
        ]
    );
}

/// A spec of `n` scenarios, each with one problem (a packet count of 0).
fn with_a_problem_each(n: usize) -> String {
    use std::fmt::Write as _;
    let mut text = String::new();
    for i in 0..n {
        let _ = write!(
            text,
            "[[scenario]]\nname = \"s{i}\"\nqdisc = \"pfifo\"\npackets = 0\n\
             expect = [\"sent >= 0\"]\n\n"
        );
    }
    text
}

/// Beyond the first problems, the others are counted, as compilers do: the message and the
/// memory stay the same size however large the spec.
#[test]
fn problems_beyond_the_first_are_counted() {
    let errors = parse(&with_a_problem_each(MAX_SCENARIOS)).unwrap_err();
    assert_eq!(errors.total(), MAX_SCENARIOS);
    assert_eq!(errors.shown.len(), MAX_SHOWN);
    let text = errors.to_string();
    assert!(
        text.ends_with("\n... and 9980 more problems (10000 in all); fix these and check again"),
        "{}",
        &text[text.len() - 200..]
    );
    assert!(text.contains("scenario 20 (\"s19\")") && !text.contains("\"s20\""));
    // Lines are found by their offsets, wherever they are.
    let last = &errors.shown[MAX_SHOWN - 1];
    assert_eq!(last.line, Some(19 * 6 + 4));
    assert!(
        last.detail
            .as_deref()
            .unwrap()
            .starts_with("    118 | packets = 0")
    );
    let errors = parse(&with_a_problem_each(21)).unwrap_err();
    assert!(
        errors
            .to_string()
            .ends_with("... and 1 more problem (21 in all); fix these and check again")
    );
}

#[test]
fn a_spec_of_too_many_scenarios_is_refused_at_once() {
    let err = only_error(&with_a_problem_each(MAX_SCENARIOS + 1));
    assert_eq!(
        err.message,
        "the spec has 10001 scenarios; one check runs at most 10000 (each builds a namespace and \
         a tap of its own and runs its traffic, one after another): split it into several specs"
    );
    assert_eq!(errors(&with_a_problem_each(MAX_SCENARIOS)).len(), MAX_SHOWN);
}

/// What a message quotes of the spec is cut, and says how long the whole is: a name, a key,
/// a value, an expression or a line of a megabyte makes a message of a few lines.
#[test]
fn long_names_and_values_are_cut_in_messages() {
    let long = "x".repeat(1_000_000);
    let cases = [
        // The name: its own problem, and the scenario it names in every other one.
        (
            with("").replace("name = \"s\"", &format!("name = \"{long}\"")),
            "the name is longer than 200 characters",
        ),
        (
            with("").replace("packets = 10", &format!("packets = 0\nname2 = \"{long}\"")),
            "unknown field `name2`",
        ),
        (with(&format!("{long} = 1")), "unknown field `xxxx"),
        (
            with("").replace("\"pfifo\"", &format!("\"{long}\"")),
            "unknown variant `xxxx",
        ),
        (
            with("").replace("sent == 10", &format!("sent == {long}")),
            "the expression is longer than 1000 characters",
        ),
        (with(&format!("duration = \"{long}\"")), "is not a duration"),
        (
            with("").replace("sent == 10", &format!("sent == 10 + {}", "x".repeat(900))),
            "unknown name `xxxx",
        ),
    ];
    for (text, what) in cases {
        let shown = parse(&text).unwrap_err().to_string();
        assert!(
            shown.contains(what),
            "{what}: {}",
            &shown[..shown.len().min(2000)]
        );
        assert!(
            shown.len() < 2000,
            "{what}: {} bytes: {}",
            shown.len(),
            &shown[..2000]
        );
    }
    let err = only_error(&with("").replace("name = \"s\"", &format!("name = \"{long}\"")));
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!(
            "scenario 1 (\"{}\"… (1000000 characters)), key `name`, line 2: the name is longer",
            "x".repeat(80)
        )),
        "{shown}"
    );
    assert!(
        shown.ends_with("^ (column 8 of a line of 1000009 characters)"),
        "{shown}"
    );
}

fn baseline_with(scenario: &str, pairs: &[(&str, u64)]) -> SavedBaseline {
    let mut measured = Measured::default();
    for (k, v) in pairs {
        measured.insert_count(k, *v);
    }
    let saved = SavedBaseline::new(
        "7.3.0".to_owned(),
        BTreeMap::from([(scenario.to_owned(), measured)]),
    );
    SavedBaseline::parse(&saved.to_json(), "base.json").unwrap()
}

#[test]
fn baseline_names_need_a_baseline_that_has_them() {
    let text = with("").replace(
        "sent == 10",
        "delivered_pps >= 0.95 * baseline.delivered_pps",
    );
    let err = only_error(&text);
    assert!(
        err.message
            .contains("`baseline.delivered_pps` needs a baseline: pass --baseline FILE"),
        "{err}"
    );
    let good = baseline_with("s", &[("delivered_pps", 1000)]);
    assert!(Spec::parse(&text, KNOWN, Some(&good)).is_ok());
    let other_scenario = baseline_with("t", &[("delivered_pps", 1000)]);
    let err = Spec::parse(&text, KNOWN, Some(&other_scenario))
        .unwrap_err()
        .shown
        .remove(0);
    assert!(err.message.contains("base.json"), "{err}");
    assert!(err.message.contains("\"s\""), "{err}");
    let other_name = baseline_with("s", &[("sent", 1)]);
    let err = Spec::parse(&text, KNOWN, Some(&other_name))
        .unwrap_err()
        .shown
        .remove(0);
    assert!(err.message.contains("delivered_pps"), "{err}");
    assert!(err.message.contains("\"s\""), "{err}");
    // An unknown name after `baseline.` is reported as unknown, baseline or not.
    let text = with("").replace("sent == 10", "sent >= baseline.sentt");
    let err = Spec::parse(&text, KNOWN, Some(&good))
        .unwrap_err()
        .shown
        .remove(0);
    assert!(
        err.message.contains("did you mean `baseline.sent`?"),
        "{err}"
    );
}

#[test]
fn traffic_serializes_for_the_report() {
    let spec = parse(GOOD).unwrap();
    let json = serde_json::to_value(&spec.scenarios[1].traffic).unwrap();
    assert_eq!(
        json,
        serde_json::json!({
            "qdisc": "fq-codel", "backpressure": true, "tx_queue_len": 256,
            "packets": 50000, "duration_secs": 1.5, "sender_threads": 2, "pps": 200_000,
            "reader": "vhost", "reader_pps": 5000
        })
    );
}

proptest! {
    #[test]
    fn never_panics_on_any_text(text in ".{0,300}") {
        let _ = parse(&text).map_err(|e| e.to_string());
    }

    #[test]
    fn never_panics_on_mutated_specs(
        cut in 0usize..600,
        insert in prop::sample::select(vec![
            "", "\n", "[[scenario]]\n", "=", "\"", "[", "]", "#", "name = \"x\"\n",
            "packets = -1\n", "expect = [\"a ==\"]\n", "\u{7}", "é", "\r\n",
        ]),
    ) {
        let mut text = GOOD.to_owned();
        let mut at = cut.min(text.len());
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.insert_str(at, insert);
        if let Err(errors) = parse(&text) {
            prop_assert!(!errors.shown.is_empty());
            let _ = errors.to_string();
        }
    }
}
