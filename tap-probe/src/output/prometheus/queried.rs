//! The alert rules and the dashboard ask only for families and labels the exporter serves:
//! a family renamed in the counter table, or a label dropped, fails here instead of leaving
//! an alert that can never fire or a panel that stays empty.

use std::collections::BTreeSet;

use super::{About, exposition_with};
use tap_probe_observer::host::discovery::Owner;
use tap_probe_observer::host::report::Row;

const RULES: &str = include_str!("../../../../deploy/prometheus/tap-probe-rules.yml");
const RULE_TESTS: &str = include_str!("../../../../deploy/prometheus/tap-probe-rules.test.yml");
const DASHBOARD: &str = include_str!("../../../../deploy/grafana/tap-probe.json");

/// Labels Prometheus adds to every series it scrapes, and the histogram's bucket bound.
const ADDED_BY_PROMETHEUS: &[&str] = &["instance", "job", "le"];

/// Every series name and label an exposition can hold: every value known, a tap held by a
/// named VM, a program that missed runs and kprobe hits, the facts.
fn served() -> (BTreeSet<String>, BTreeSet<String>) {
    let mut row: Row = crate::output::lines::tests::full_row();
    row.owner = Some(Owner {
        pid: 4242,
        comm: "qemu-system-x86".to_owned(),
        vm: Some("web-01".to_owned()),
    });
    let mut report = crate::output::lines::tests::report(1.0, vec![row]);
    report.missed = vec![tap_probe_observer::bpf::missed::ProgramMissed {
        program: "consume_skb".to_owned(),
        runs: Some(1),
        kprobe: Some(1),
    }];
    let about = About {
        version: "1",
        commit: "c",
        release: "r".to_owned(),
        tun_backpressure: None,
    };
    let text = exposition_with(&report, &[], Some(&about), super::Series::ALL);
    let mut names = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).expect("a sample line");
        names.insert(line[..name_end].to_owned());
        if let Some(inside) = line[name_end..]
            .strip_prefix('{')
            .and_then(|rest| rest.split_once("} "))
        {
            for pair in inside.0.split("\",") {
                labels.insert(pair.split('=').next().expect("a label").to_owned());
            }
        }
    }
    labels.extend(ADDED_BY_PROMETHEUS.iter().map(|&l| l.to_owned()));
    (names, labels)
}

/// The `tap_probe_*` names in `text`.
fn names_in(text: &str) -> BTreeSet<String> {
    text.match_indices("tap_probe_")
        .map(|(at, _)| {
            text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        })
        .collect()
}

/// The labels an expression groups, matches or selects by: `by (..)`, `on (..)`,
/// `without (..)`, `label_values(.., label)`, and the keys of `{..}` selectors.
fn labels_in(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut add = |list: &str| {
        for label in list.split(',').map(str::trim).filter(|l| !l.is_empty()) {
            out.insert(label.to_owned());
        }
    };
    for keyword in ["by (", "on (", "without ("] {
        for (at, _) in expr.match_indices(keyword) {
            let rest = &expr[at + keyword.len()..];
            add(&rest[..rest.find(')').expect("a closed list")]);
        }
    }
    for (at, _) in expr.match_indices("label_values(") {
        let rest = &expr[at..];
        let args = &rest[..rest.find(')').expect("a closed call")];
        add(args.rsplit(',').next().expect("a label"));
    }
    for (at, _) in expr.match_indices('{') {
        let rest = &expr[at + 1..];
        let Some(end) = rest.find('}') else { continue };
        for matcher in rest[..end].split(',') {
            let key: String = matcher
                .trim()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !key.is_empty() {
                out.insert(key);
            }
        }
    }
    out
}

/// The dashboard's queries: each panel target's `expr` and each variable's query.
fn dashboard_queries() -> Vec<String> {
    let dashboard: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.push(target["expr"].as_str().expect("a target's expr").to_owned());
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(query) = variable["query"]["query"].as_str() {
            out.push(query.to_owned());
        }
    }
    out
}

/// The rules' expressions: the indented block after each `expr: |`.
fn rule_expressions() -> Vec<String> {
    let mut out = Vec::new();
    let mut lines = RULES.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "expr: |" {
            let indent = line.len() - line.trim_start().len();
            let mut expr = String::new();
            while let Some(next) = lines.next_if(|l| l.len() - l.trim_start().len() > indent) {
                expr.push_str(next.trim());
                expr.push(' ');
            }
            out.push(expr);
        }
    }
    out
}

#[test]
fn the_rules_and_the_dashboard_query_what_is_served() {
    let (names, labels) = served();
    let rules = rule_expressions();
    assert_eq!(rules.len(), 4, "one expression per alert: {rules:?}");
    let dashboard = dashboard_queries();
    assert!(dashboard.len() >= 12, "{dashboard:?}");
    for expr in rules.iter().chain(&dashboard) {
        for name in names_in(expr) {
            assert!(names.contains(&name), "{name} is not served; in {expr}");
        }
        for label in labels_in(expr) {
            assert!(
                labels.contains(&label),
                "label {label} is not served; in {expr}"
            );
        }
    }
    // The unit tests' series are labelled as served, too.
    for name in names_in(RULE_TESTS) {
        assert!(
            names.contains(&name),
            "{name} in the rules' tests is not served"
        );
    }
}

#[test]
fn the_readers_of_expressions_find_what_they_look_for() {
    let expr = r#"sum without (queue) (rate(tap_probe_busy_total{kind=~"tap|tun",vm="x"}[5m])) and on (job, instance) tap_probe_kernel_info"#;
    assert_eq!(
        names_in(expr),
        BTreeSet::from([
            "tap_probe_busy_total".into(),
            "tap_probe_kernel_info".into()
        ])
    );
    assert_eq!(
        labels_in(expr),
        BTreeSet::from([
            "queue".into(),
            "kind".into(),
            "vm".into(),
            "job".into(),
            "instance".into()
        ])
    );
    assert_eq!(
        labels_in("label_values(tap_probe_build_info, instance)"),
        BTreeSet::from(["instance".into()])
    );
}
