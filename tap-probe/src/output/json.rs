//! JSON for programs: one object per refresh.

use serde::Serialize;
use tap_probe_common::METRICS;

use crate::host::report::{Report, Row, Value};

/// One report as a JSON line; `final` marks the summary written after detaching, and
/// `counts_may_be_short` says whether the kernel skipped runs of a program (see `missed`).
///
/// # Errors
/// Never in practice (serialising plain data).
pub(crate) fn json_line(report: &Report, last: bool) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(report)?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("final".to_owned(), serde_json::Value::Bool(last));
        obj.insert(
            "counts_may_be_short".to_owned(),
            serde_json::Value::Bool(report.may_be_short()),
        );
    }
    Ok(format!("{value}\n"))
}

/// As [`json_line`], with one more top-level field: `key` holding `value`.
///
/// # Errors
/// Never in practice (serialising plain data).
pub(crate) fn json_line_with(
    report: &Report,
    last: bool,
    key: &str,
    value: serde_json::Value,
) -> anyhow::Result<String> {
    let mut json: serde_json::Value = serde_json::from_str(&json_line(report, last)?)?;
    if let Some(obj) = json.as_object_mut() {
        obj.insert(key.to_owned(), value);
    }
    Ok(format!("{json}\n"))
}

impl Serialize for Row {
    /// The labels, then every metric under its name (a dotted name nests), the drop reasons
    /// and whether the device is gone.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde_json::{Map, Value as Json};
        let mut row = Map::new();
        let mut put = |name: &str, value: Json| match name.split_once('.') {
            Some((outer, inner)) => {
                if let Json::Object(nested) = row
                    .entry(outer.to_owned())
                    .or_insert_with(|| Json::Object(Map::new()))
                {
                    nested.insert(inner.to_owned(), value);
                }
            }
            None => {
                row.insert(name.to_owned(), value);
            }
        };
        put("ifname", Json::from(self.ifname.clone()));
        put("ifindex", Json::from(self.ifindex));
        put("netns", Json::from(self.netns.clone()));
        put(
            "kind",
            serde_json::to_value(self.kind).map_err(serde::ser::Error::custom)?,
        );
        put("queue", Json::from(self.queue));
        put(
            "owner",
            serde_json::to_value(&self.owner).map_err(serde::ser::Error::custom)?,
        );
        for metric in METRICS {
            let value = match self.value(metric) {
                Value::Count(n) => Json::from(n),
                Value::Flag(flag) => Json::from(flag),
                Value::Ratio(ratio) => ratio.map_or(Json::Null, Json::from),
                Value::Distribution(d) => serde_json::json!({
                    "current": d.current,
                    "max": (d.samples > 0 || d.max > 0).then_some(d.max),
                    "samples": d.samples,
                    "histogram": d.histogram,
                }),
                Value::Missing => Json::Null,
            };
            put(metric.name, value);
        }
        put(
            "drop_reasons",
            serde_json::to_value(&self.drop_reasons).map_err(serde::ser::Error::custom)?,
        );
        put("retired", Json::from(self.retired));
        row.serialize(serializer)
    }
}
