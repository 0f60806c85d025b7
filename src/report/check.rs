//! What `check` prints: the backend's report (server, version, round trip, facts, warnings)
//! and the effective settings, as aligned `key: value` lines or as JSON.

use std::io::Write;
use std::time::Duration;

use super::out;
use crate::lock::CheckReport;
use crate::logging::shown;
use crate::settings::Common;

pub fn print_check(check: &CheckReport, common: &Common, json: bool) -> std::io::Result<()> {
    let mut out = out();
    if json {
        serde_json::to_writer_pretty(&mut out, &check_json(check, common))?;
        writeln!(out)?;
        return Ok(());
    }
    let mut lines: Vec<(String, String)> = vec![
        (
            "backend".into(),
            format!("{} ({})", check.backend, check.location),
        ),
        ("version".into(), shown(&check.version).into_owned()),
        (
            "round trip".into(),
            crate::wording::measured_duration(Duration::from_micros(check.round_trip_us)),
        ),
    ];
    lines.extend(
        check
            .details
            .iter()
            .map(|(key, value)| (shown(key).into_owned(), shown(value).into_owned())),
    );
    lines.push((
        "settings".into(),
        format!(
            "url {}, prefix {}, ttl {}",
            common.display_url,
            common.prefix,
            humantime::format_duration(common.ttl)
        ),
    ));
    lines.extend(
        check
            .warnings
            .iter()
            .map(|w| ("warning".to_owned(), shown(w).into_owned())),
    );
    // One column for every value, however long the longest key.
    let width = lines
        .iter()
        .map(|(key, _)| crate::wording::display_width(key) + 1)
        .max()
        .unwrap_or(0);
    for (key, value) in &lines {
        writeln!(
            out,
            "{} {value}",
            crate::wording::pad(&format!("{key}:"), width)
        )?;
    }
    writeln!(out, "ok")?;
    Ok(())
}

/// `check --json`: the report's fields as they always were (`details` as `[key, value]`
/// pairs), and typed beside them: `round_trip_ms` (a number), `facts` (the details as an
/// object) and the effective `settings`.
fn check_json(check: &CheckReport, common: &Common) -> serde_json::Value {
    let mut json = serde_json::to_value(check).unwrap_or_default();
    if let Some(object) = json.as_object_mut() {
        object.insert(
            "round_trip_ms".into(),
            serde_json::json!(check.round_trip_us as f64 / 1000.0),
        );
        let facts: serde_json::Map<String, serde_json::Value> = check
            .details
            .iter()
            .map(|(key, value)| (key.clone(), serde_json::Value::String(value.clone())))
            .collect();
        object.insert("facts".into(), serde_json::Value::Object(facts));
        object.insert(
            "settings".into(),
            serde_json::json!({
                "url": common.display_url,
                "prefix": common.prefix,
                "ttl_ms": u64::try_from(common.ttl.as_millis()).unwrap_or(u64::MAX),
            }),
        );
        object.insert("ok".into(), serde_json::Value::Bool(true));
    }
    json
}
