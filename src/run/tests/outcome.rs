//! What the steps of a run tell an observer, and the outcome record built from it.

use super::*;

/// What an observer of a run heard, in order.
#[derive(Default)]
struct Heard(Vec<Event>);

impl Observer for Heard {
    fn saw(&mut self, event: Event) {
        self.0.push(event);
    }
}

/// The steps of a run tell what happened to whoever observes it, in the order it happened,
/// and know nothing of the outcome record that is built from what they tell.
#[test]
fn the_steps_tell_an_observer_what_happened_in_order() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let (backend, _) = fake(Acquire::Grant(7));
    let mut heard = Heard::default();
    let ran = settings(dir.path(), "exit 5", Wait::Forever);
    let status = block_on(acquire_and_run(&backend, &ran, "", &mut heard));
    assert_eq!(status.ok().map(Outcome::status), Some(5));
    assert_eq!(heard.0, [Event::Acquired(Some(7)), Event::CommandEnded(5)]);

    let (backend, _) = fake(Acquire::Busy);
    let mut heard = Heard::default();
    let busy = settings(dir.path(), "true", Wait::No);
    let status = block_on(acquire_and_run(&backend, &busy, "", &mut heard));
    assert_eq!(status.ok().map(Outcome::status), Some(3));
    assert_eq!(heard.0, [Event::Busy]);
}

/// The outcome record is built from what the steps told, and from nothing else.
#[test]
fn the_record_is_built_from_what_the_steps_told() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut track = record::Track::new();
    for event in [
        Event::Acquired(Some(9)),
        Event::Lost("the key was deleted".into()),
        Event::StoppedBy(libc::SIGTERM),
        Event::CommandEnded(143),
    ] {
        track.saw(event);
    }
    let settings = settings(dir.path(), "true", Wait::No);
    let record = serde_json::to_value(track.record(&settings, 143, None)).expect("JSON");
    assert_eq!(record["outcome"], "signalled", "{record}");
    assert_eq!(record["signal"], "SIGTERM", "{record}");
    assert_eq!(record["lost_reason"], "the key was deleted", "{record}");
    assert_eq!(record["command_status"], 143, "{record}");
    assert_eq!(record["token_str"], "9", "{record}");
    assert!(record.get("acquired_at").is_some(), "{record}");
}

/// A run that did not get the lock records who holds it (`holder`), looked up once the
/// steps have ended, and only when a record is kept.
#[test]
fn a_busy_run_records_who_holds_the_lock() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report.jsonl");
    let (backend, record) = fake(Acquire::Busy);
    record.borrow_mut().holders = vec![holder_status(4242, 9)];
    let (line, json) = busy_record(backend, &report, settings(dir.path(), "true", Wait::No));
    assert_eq!(json["outcome"], "busy", "{line}");
    assert_eq!(json["exit_status"], 3, "{line}");
    assert_eq!(json["holder"]["pid"], 4242, "{line}");
    assert!(json.get("acquired_at").is_none(), "{line}");
}

/// With `--also`, the record of a busy run names the holder of the name it could not have,
/// whichever of its names that is.
#[test]
fn a_busy_run_of_several_names_records_who_holds_the_one_it_could_not_have() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("temp dir");
    let report = dir.path().join("report.jsonl");
    let (backend, record) = fake(Acquire::Busy);
    let mut holder = holder_status(4243, 9);
    holder.holder.name = "other".into();
    record.borrow_mut().holders = vec![holder];
    let settings = RunSettings {
        also: vec![LockName::new("other").expect("a valid name")],
        ..settings(dir.path(), "true", Wait::No)
    };
    let (line, json) = busy_record(backend, &report, settings);
    assert_eq!(json["holder"]["pid"], 4243, "{line}");
}

/// Run `settings` against a busy `backend` with `--report REPORT`: the record's line, parsed.
fn busy_record(
    backend: Fake,
    report: &std::path::Path,
    settings: RunSettings,
) -> (String, serde_json::Value) {
    let settings = RunSettings {
        report: Some(crate::settings::ReportTo::File {
            path: report.to_owned(),
            given_as: format!("--report {}", report.display()),
        }),
        ..settings
    };
    let status = block_on(run(backend, settings, ""));
    assert_eq!(status.ok().map(Outcome::status), Some(3));
    let line = std::fs::read_to_string(report).expect("the report was written");
    let json: serde_json::Value = serde_json::from_str(line.trim()).expect("one JSON line");
    (line, json)
}
