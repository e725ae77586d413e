//! `JUnit` XML for `check --junit FILE`, the format CI systems show test results in: one
//! `<testsuite>` per scenario, one `<testcase>` per expectation. A failed expectation is a
//! `<failure>` whose message has the expression, both sides' values and where the packets
//! went; a problem with the spec or the kernel is an `<error>`.

use std::fmt::Write as _;

use super::report::{CheckReport, ScenarioReport, Verdict};

const HEADER: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
const SUITES_NAME: &str = "tap-probe check";

/// The `JUnit` document of a run.
#[must_use]
pub fn render(report: &CheckReport) -> String {
    let count = |verdict: Verdict| {
        report
            .scenarios
            .iter()
            .flat_map(|s| &s.expectations)
            .filter(|e| e.verdict == verdict)
            .count()
    };
    let tests: usize = report.scenarios.iter().map(|s| s.expectations.len()).sum();
    let time: f64 = report.scenarios.iter().map(|s| s.duration_secs).sum();
    let mut out = String::from(HEADER);
    let _ = writeln!(
        out,
        "<testsuites name=\"{}\" tests=\"{tests}\" failures=\"{}\" errors=\"{}\" time=\"{time:.3}\">",
        attr(SUITES_NAME),
        count(Verdict::Fail),
        count(Verdict::Error),
    );
    for scenario in &report.scenarios {
        suite(&mut out, scenario, &report.kernel_release);
    }
    out.push_str("</testsuites>\n");
    out
}

/// The `JUnit` document for a spec that could not be used at all (exit 2 before any
/// scenario ran), so that CI shows why instead of an empty result.
#[must_use]
pub fn spec_problem(spec: &str, message: &str) -> String {
    let mut out = String::from(HEADER);
    let _ = writeln!(
        out,
        "<testsuites name=\"{}\" tests=\"1\" failures=\"0\" errors=\"1\" time=\"0.000\">\n  \
         <testsuite name=\"{}\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\" time=\"0.000\">\n    \
         <testcase name=\"spec\" classname=\"{}\" time=\"0.000\">\n      \
         <error message=\"{}\" type=\"spec\">{}</error>\n    </testcase>\n  </testsuite>",
        attr(SUITES_NAME),
        attr(spec),
        attr(spec),
        attr(message.lines().next().unwrap_or_default()),
        text(message)
    );
    out.push_str("</testsuites>\n");
    out
}

fn suite(out: &mut String, scenario: &ScenarioReport, kernel_release: &str) {
    let count = |verdict: Verdict| {
        scenario
            .expectations
            .iter()
            .filter(|e| e.verdict == verdict)
            .count()
    };
    let _ = writeln!(
        out,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"0\" time=\"{:.3}\">",
        attr(&scenario.name),
        scenario.expectations.len(),
        count(Verdict::Fail),
        count(Verdict::Error),
        scenario.duration_secs
    );
    out.push_str("    <properties>\n");
    let mut property = |name: &str, value: &str| {
        let _ = writeln!(
            out,
            "      <property name=\"{}\" value=\"{}\"/>",
            attr(name),
            attr(value)
        );
    };
    property("kernel_release", kernel_release);
    // The scenario's settings, so that a failure can be read without the spec at hand.
    if let Ok(serde_json::Value::Object(traffic)) = serde_json::to_value(&scenario.traffic) {
        for (key, value) in &traffic {
            match value {
                serde_json::Value::Null => {}
                serde_json::Value::String(s) => property(key, s),
                other => property(key, &other.to_string()),
            }
        }
    }
    out.push_str("    </properties>\n");
    let measured = measured_lines(scenario);
    for e in &scenario.expectations {
        let _ = write!(
            out,
            "    <testcase name=\"{}\" classname=\"{}\" time=\"0.000\"",
            attr(&e.expect),
            attr(&scenario.name)
        );
        let (element, kind) = match e.verdict {
            Verdict::Pass => {
                out.push_str("/>\n");
                continue;
            }
            Verdict::Fail => ("failure", "expectation"),
            Verdict::Error if scenario.error.is_some() => ("error", "scenario"),
            Verdict::Error => ("error", "evaluation"),
        };
        let explanation = e.explanation();
        let _ = writeln!(
            out,
            ">\n      <{element} message=\"{}\" type=\"{kind}\">{}{}</{element}>\n    </testcase>",
            attr(&explanation),
            text(&explanation),
            text(&measured)
        );
    }
    if let Some(error) = &scenario.error {
        let _ = writeln!(out, "    <system-err>{}</system-err>", text(error));
    }
    if !measured.is_empty() {
        let _ = writeln!(
            out,
            "    <system-out>{}</system-out>",
            text(measured.trim_start())
        );
    }
    out.push_str("  </testsuite>\n");
}

/// Every value the scenario measured, one `name = value` a line.
fn measured_lines(scenario: &ScenarioReport) -> String {
    let mut out = String::new();
    if let Some(measured) = &scenario.measured {
        out.push_str("\n\nmeasured:");
        for (name, value) in measured.iter() {
            let _ = write!(out, "\n  {name} = {value}");
        }
        out.push('\n');
    }
    out
}

/// Characters XML 1.0 cannot hold at all, not even escaped, become U+FFFD.
fn xml_char(c: char) -> char {
    match c {
        '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}' => c,
        c if c >= '\u{10000}' => c,
        _ => char::REPLACEMENT_CHARACTER,
    }
}

/// Escapes element text.
fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().map(xml_char) {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            // A parser turns a literal CR into LF; the reference keeps it.
            '\r' => out.push_str("&#13;"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes an attribute value (double-quoted). Whitespace other than spaces is written as
/// references: a parser normalises literal tabs and newlines in attributes to spaces.
fn attr(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars().map(xml_char) {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::check::report::tests::{report, spec, tail_drop};

    /// A small XML reader, strict where `JUnit` consumers are: it checks well-formedness
    /// (nesting, quoting, entities, allowed characters) and returns the tree, with
    /// attribute values normalised as a conforming parser does.
    mod xml {
        #[derive(Debug, Clone, PartialEq)]
        pub(super) struct Element {
            pub(super) name: String,
            pub(super) attrs: Vec<(String, String)>,
            pub(super) children: Vec<Element>,
            pub(super) text: String,
        }

        impl Element {
            pub(super) fn attr(&self, name: &str) -> &str {
                self.attrs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map_or_else(|| panic!("<{}> has no {name}", self.name), |(_, v)| v)
            }

            pub(super) fn all(&self, name: &str) -> Vec<&Element> {
                self.children.iter().filter(|c| c.name == name).collect()
            }

            pub(super) fn one(&self, name: &str) -> &Element {
                let all = self.all(name);
                assert_eq!(all.len(), 1, "<{}> has {} <{name}>", self.name, all.len());
                all[0]
            }
        }

        struct XmlReader<'a> {
            s: &'a str,
            pos: usize,
        }

        pub(super) fn parse(s: &str) -> Result<Element, String> {
            for c in s.chars() {
                let ok = matches!(c, '\t' | '\n' | '\r' | '\u{20}'..='\u{D7FF}' | '\u{E000}'..='\u{FFFD}')
                    || c >= '\u{10000}';
                if !ok {
                    return Err(format!("character {c:?} is not allowed in XML"));
                }
            }
            let mut r = XmlReader { s, pos: 0 };
            if r.rest().starts_with("<?xml") {
                let end = r.rest().find("?>").ok_or("unterminated declaration")?;
                r.pos += end + 2;
            }
            r.skip_ws();
            let root = r.element()?;
            r.skip_ws();
            if r.pos != s.len() {
                return Err(format!("content after the root at byte {}", r.pos));
            }
            Ok(root)
        }

        impl XmlReader<'_> {
            fn rest(&self) -> &str {
                &self.s[self.pos..]
            }

            fn skip_ws(&mut self) {
                let trimmed = self.rest().trim_start_matches([' ', '\t', '\n', '\r']);
                self.pos = self.s.len() - trimmed.len();
            }

            fn name(&mut self) -> Result<String, String> {
                let rest = self.rest();
                let len = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || "_:.-".contains(c)))
                    .unwrap_or(rest.len());
                let name = rest[..len].to_owned();
                if name.is_empty()
                    || name.starts_with(|c: char| c.is_ascii_digit() || c == '-' || c == '.')
                {
                    return Err(format!("bad name at byte {}", self.pos));
                }
                self.pos += len;
                Ok(name)
            }

            fn expect(&mut self, what: &str) -> Result<(), String> {
                if self.rest().starts_with(what) {
                    self.pos += what.len();
                    Ok(())
                } else {
                    Err(format!("expected {what:?} at byte {}", self.pos))
                }
            }

            fn element(&mut self) -> Result<Element, String> {
                self.expect("<")?;
                let name = self.name()?;
                let mut attrs: Vec<(String, String)> = Vec::new();
                loop {
                    let before = self.pos;
                    self.skip_ws();
                    if self.rest().starts_with("/>") {
                        self.pos += 2;
                        return Ok(Element {
                            name,
                            attrs,
                            children: vec![],
                            text: String::new(),
                        });
                    }
                    if self.rest().starts_with('>') {
                        self.pos += 1;
                        break;
                    }
                    if self.pos == before {
                        return Err(format!(
                            "expected space before an attribute at byte {}",
                            self.pos
                        ));
                    }
                    let key = self.name()?;
                    self.expect("=")?;
                    let quote = self.rest().chars().next().ok_or("unterminated tag")?;
                    if quote != '"' && quote != '\'' {
                        return Err(format!("unquoted attribute {key}"));
                    }
                    self.pos += 1;
                    let end = self.rest().find(quote).ok_or("unterminated attribute")?;
                    let raw = &self.rest()[..end];
                    if raw.contains('<') {
                        return Err(format!("`<` in attribute {key}"));
                    }
                    // Attribute-value normalisation (XML 1.0, 3.3.3).
                    let raw = raw.replace(['\t', '\n', '\r'], " ");
                    let value = unescape(&raw)?;
                    self.pos += end + 1;
                    if attrs.iter().any(|(k, _)| *k == key) {
                        return Err(format!("duplicate attribute {key}"));
                    }
                    attrs.push((key, value));
                }
                let mut children = Vec::new();
                let mut text = String::new();
                loop {
                    let rest = self.rest();
                    let lt = rest
                        .find('<')
                        .ok_or_else(|| format!("<{name}> is not closed"))?;
                    let raw = &rest[..lt];
                    if raw.contains("]]>") {
                        return Err("`]]>` in text".to_owned());
                    }
                    text.push_str(&unescape(&raw.replace("\r\n", "\n").replace('\r', "\n"))?);
                    self.pos += lt;
                    if self.rest().starts_with("</") {
                        self.pos += 2;
                        let close = self.name()?;
                        if close != name {
                            return Err(format!("</{close}> closes <{name}>"));
                        }
                        self.skip_ws();
                        self.expect(">")?;
                        return Ok(Element {
                            name,
                            attrs,
                            children,
                            text,
                        });
                    }
                    children.push(self.element()?);
                }
            }
        }

        fn unescape(s: &str) -> Result<String, String> {
            let mut out = String::new();
            let mut rest = s;
            while let Some(amp) = rest.find('&') {
                out.push_str(&rest[..amp]);
                let semi = rest[amp..].find(';').ok_or("`&` without `;`")?;
                let entity = &rest[amp + 1..amp + semi];
                let c = match entity {
                    "amp" => '&',
                    "lt" => '<',
                    "gt" => '>',
                    "quot" => '"',
                    "apos" => '\'',
                    _ => {
                        let code = if let Some(hex) = entity.strip_prefix("#x") {
                            u32::from_str_radix(hex, 16)
                        } else if let Some(dec) = entity.strip_prefix('#') {
                            dec.parse()
                        } else {
                            return Err(format!("unknown entity &{entity};"));
                        }
                        .map_err(|_| format!("bad reference &{entity};"))?;
                        char::from_u32(code).ok_or(format!("bad reference &{entity};"))?
                    }
                };
                out.push(c);
                rest = &rest[amp + semi + 1..];
            }
            out.push_str(rest);
            Ok(out)
        }

        #[test]
        fn the_reader_rejects_what_is_not_xml() {
            for bad in [
                "<a>",
                "<a></b>",
                "<a b=c/>",
                "<a b=\"<\"/>",
                "<a>&</a>",
                "<a>&nbsp;</a>",
                "<a>]]></a>",
                "<a/><b/>",
                "<a b=\"1\" b=\"2\"/>",
                "<a b=\"1\"c=\"2\"/>",
                "<a>\u{1}</a>",
                "<1a/>",
            ] {
                assert!(parse(bad).is_err(), "{bad}");
            }
            let ok =
                parse("<?xml version=\"1.0\"?>\n<a x='&lt;&#10;&#x41;'>t&amp;<b/>u</a>\n").unwrap();
            assert_eq!(ok.attr("x"), "<\nA");
            assert_eq!(ok.text, "t&u");
        }
    }

    #[test]
    fn one_suite_per_scenario_one_case_per_expectation() {
        let doc = xml::parse(&render(&report())).unwrap();
        assert_eq!(doc.name, "testsuites");
        assert_eq!(doc.attr("tests"), "5");
        assert_eq!(doc.attr("failures"), "1");
        assert_eq!(doc.attr("errors"), "0");
        assert_eq!(doc.attr("time"), "3.750");
        let suites = doc.all("testsuite");
        assert_eq!(suites.len(), 2);
        let stock = suites[0];
        assert_eq!(stock.attr("name"), "stock");
        assert_eq!(stock.attr("tests"), "2");
        assert_eq!(stock.attr("failures"), "1");
        assert_eq!(stock.attr("time"), "1.250");
        let properties: Vec<(&str, &str)> = stock
            .one("properties")
            .all("property")
            .iter()
            .map(|p| (p.attr("name"), p.attr("value")))
            .collect();
        assert!(properties.contains(&("kernel_release", "7.3.0-1-cloud-amd64")));
        assert!(properties.contains(&("qdisc", "pfifo-fast")));
        assert!(properties.contains(&("backpressure", "false")));
        assert!(
            !properties.iter().any(|(k, _)| *k == "duration_secs"),
            "null settings are left out"
        );
        let cases = stock.all("testcase");
        assert_eq!(cases.len(), 2);
        assert_eq!(
            cases[0].attr("name"),
            "consumed + dropped_full_ring == sent"
        );
        assert_eq!(cases[0].attr("classname"), "stock");
        assert!(cases[0].children.is_empty());
        let failure = cases[1].one("failure");
        assert_eq!(failure.attr("type"), "expectation");
        let message = failure.attr("message");
        assert!(
            message.starts_with(
                "`dropped_full_ring == 0` failed: left `dropped_full_ring` = 49000, right = 0; \
                 where the packets went: attempted = 50000, sent = 50000"
            ),
            "{message}"
        );
        assert!(failure.text.starts_with(message), "{}", failure.text);
        assert!(
            failure.text.contains("\nmeasured:\n  attempted = 50000\n"),
            "{}",
            failure.text
        );
        assert!(
            failure.text.contains("\n  delivered_pps = 4000\n"),
            "{}",
            failure.text
        );
        assert!(
            stock
                .one("system-out")
                .text
                .starts_with("measured:\n  attempted = 50000")
        );
        let fq = suites[1];
        assert_eq!(fq.attr("failures"), "0");
        assert!(fq.all("testcase").iter().all(|c| c.children.is_empty()));
    }

    #[test]
    fn scenario_problems_are_errors() {
        let spec = spec();
        let mut report = report();
        report.scenarios[1] = ScenarioReport::errored(
            &spec.scenarios[1],
            "/dev/vhost-net is missing: load the vhost_net module (modprobe vhost_net)".to_owned(),
            None,
            0.5,
        );
        let doc = xml::parse(&render(&report)).unwrap();
        assert_eq!(doc.attr("errors"), "3");
        assert_eq!(doc.attr("failures"), "1");
        let suite = doc.all("testsuite")[1];
        assert_eq!(suite.attr("errors"), "3");
        for case in suite.all("testcase") {
            let error = case.one("error");
            assert_eq!(error.attr("type"), "scenario");
            assert!(error.attr("message").contains("modprobe vhost_net"));
        }
        assert!(
            suite
                .one("system-err")
                .text
                .contains("/dev/vhost-net is missing")
        );
        assert!(suite.all("system-out").is_empty(), "nothing was measured");
        // An expectation that could not be evaluated is an error of its own kind.
        let mut m = tail_drop();
        m.insert_real("elapsed_secs", 0.0).unwrap();
        report.scenarios[1] = ScenarioReport::judged(&spec.scenarios[1], m, None, 0.5);
        let doc = xml::parse(&render(&report)).unwrap();
        let case = &doc.all("testsuite")[1].all("testcase")[2];
        let error = case.one("error");
        assert_eq!(error.attr("type"), "evaluation");
        assert!(
            error.attr("message").contains("division by zero"),
            "{}",
            error.attr("message")
        );
    }

    #[test]
    fn a_spec_that_cannot_be_used_is_one_error() {
        let message = "scenario 1 (\"a\"), key `expect[0]`, line 5: expected a number at column 12\n    consumed + == sent\n               ^^";
        let doc = xml::parse(&spec_problem("lab & co.toml", message)).unwrap();
        assert_eq!(doc.attr("errors"), "1");
        let suite = doc.one("testsuite");
        assert_eq!(suite.attr("name"), "lab & co.toml");
        let error = suite.one("testcase").one("error");
        assert_eq!(error.attr("type"), "spec");
        assert_eq!(
            error.attr("message"),
            "scenario 1 (\"a\"), key `expect[0]`, line 5: expected a number at column 12"
        );
        assert_eq!(error.text, message);
    }

    #[test]
    fn hostile_names_survive_escaping() {
        let nasty = "a<b>&\"c\" 'd'\n\te\r]]>\u{1}\u{FFFE}é😀";
        let text = "[[scenario]]\nname = \"x\"\nqdisc = \"pfifo\"\npackets = 1\nexpect = [\"sent == 1\"]\n";
        let spec = tap_probe_spec::spec::Spec::parse(text, &["sent"], None).unwrap();
        let mut scenario = ScenarioReport::errored(&spec.scenarios[0], nasty.to_owned(), None, 0.0);
        scenario.name = nasty.to_owned();
        scenario.expectations[0].expect = nasty.to_owned();
        let report = CheckReport::new(nasty.to_owned(), vec![scenario]);
        let doc = xml::parse(&render(&report)).unwrap();
        let expected = "a<b>&\"c\" 'd'\n\te\r]]>\u{FFFD}\u{FFFD}é😀";
        let suite = doc.one("testsuite");
        assert_eq!(suite.attr("name"), expected);
        assert_eq!(suite.one("testcase").attr("name"), expected);
        assert_eq!(suite.one("system-err").text, expected);
    }

    proptest! {
        #[test]
        fn any_text_round_trips(s in "\\PC{0,40}|[\\x00-\\x7f]{0,40}") {
            let doc = xml::parse(&spec_problem(&s, &s)).unwrap();
            let clean: String = s.chars().map(xml_char).collect();
            let suite = doc.one("testsuite");
            prop_assert_eq!(suite.attr("name"), clean.as_str());
            prop_assert_eq!(suite.one("testcase").one("error").text.as_str(), clean.as_str());
        }
    }
}
