//! The contract: the outcome record (`--report`), one JSON line per run whatever the outcome,
//! and what a wait prints in a CI log and in cron mail.

use std::io::Read;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::*;

/// An RFC 3339 UTC time, as the record's `*_at` fields are.
fn assert_time(record: &serde_json::Value, field: &str) {
    let text = record[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} missing: {record}"));
    assert!(
        text.ends_with('Z') && humantime::parse_rfc3339_weak(text).is_ok(),
        "{field} is not RFC 3339 UTC: {record}"
    );
}

/// The fields every record has, checked against the run.
fn assert_common(record: &serde_json::Value, server: &dyn LockServer, lock: &str, exit: i32) {
    assert_eq!(record["name"], lock, "{record}");
    assert_eq!(record["backend"], server.scheme(), "{record}");
    assert!(
        record["url"].as_str().is_some_and(|u| !u.is_empty()),
        "{record}"
    );
    assert!(
        record["host"].as_str().is_some_and(|h| !h.is_empty()),
        "{record}"
    );
    assert!(record["pid"].as_u64().is_some_and(|p| p > 0), "{record}");
    assert_eq!(
        record["exit_status"].as_i64(),
        Some(i64::from(exit)),
        "{record}"
    );
    assert!(record["waited_ms"].as_u64().is_some(), "{record}");
    assert_time(record, "started_at");
    assert_time(record, "ended_at");
}

pub fn report_records_a_run_that_ran(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let out = env.run([
        "run",
        "--report",
        report.to_str().expect("UTF-8 path"),
        &lock,
        "sh",
        "-c",
        "echo $DLOCK_FENCING_TOKEN; exit 3",
    ]);
    assert_eq!(out.status.code(), Some(3), "{}", describe(&out));
    let token: u64 = stdout_of(&out).trim().parse().expect("a token");
    let record = report_line(&report);
    assert_common(&record, server, &lock, 3);
    assert_eq!(record["outcome"], "ran", "{record}");
    assert_eq!(record["mode"], "exclusive", "{record}");
    assert_eq!(record["command_status"], 3, "{record}");
    assert_eq!(
        record["command"], "sh -c echo $DLOCK_FENCING_TOKEN; exit 3",
        "{record}"
    );
    assert!(record.get("lost_reason").is_none(), "{record}");
    assert_eq!(record["token"].as_u64(), Some(token), "{record}");
    assert!(record["held_ms"].as_u64().is_some(), "{record}");
    assert_time(&record, "acquired_at");
    assert!(record.get("error").is_none(), "{record}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&report)
        .expect("report")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "report created {mode:o}");

    // A password in the URL is masked in the record as everywhere.
    if let Some(url) = server.password_url() {
        let password = url
            .split_once("://")
            .and_then(|(_, rest)| rest.split('@').next())
            .and_then(|user| user.split_once(':'))
            .map(|(_, password)| password.to_owned())
            .expect("a password in the password URL");
        let out = env.run([
            "run",
            "--url",
            &url,
            "--report",
            report.to_str().expect("UTF-8 path"),
            &lock,
            "true",
        ]);
        assert_eq!(out.status.code(), Some(0), "{}", describe(&out));
        let lines = report_lines(&report);
        let recorded = lines[1]["url"].as_str().expect("url");
        assert!(
            !recorded.contains(&password) && recorded.contains("***"),
            "password not masked: {recorded}"
        );
    }
}

pub fn report_records_a_busy_run_with_its_holder(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let holder = env.hold(&lock, &[]);
    let out = env.run([
        "run",
        "--no-wait",
        "--report",
        report.to_str().expect("UTF-8 path"),
        &lock,
        "touch",
        "ran",
    ]);
    assert_fails(&out, 75, "is held");
    let record = report_line(&report);
    assert_common(&record, server, &lock, 75);
    assert_eq!(record["outcome"], "busy", "{record}");
    assert_eq!(
        record["holder"]["pid"].as_i64(),
        Some(i64::from(holder.pid())),
        "{record}"
    );
    assert!(
        record["holder"]["host"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{record}"
    );
    assert!(record["holder"]["since"].is_string(), "{record}");
    assert!(record["holder"]["user"].is_string(), "{record}");
    for absent in ["token", "command_status", "acquired_at", "held_ms"] {
        assert!(record.get(absent).is_none(), "{absent} in {record}");
    }
}

pub fn report_records_an_error(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let url = unreachable_url(&env, &server.url());
    let out = env.run([
        "run",
        "--url",
        &url,
        "--wait",
        "2s",
        "--report",
        report.to_str().expect("UTF-8 path"),
        &lock,
        "touch",
        "ran",
    ]);
    let code = out.status.code().expect("an exit status");
    assert!(
        ![0, 75].contains(&code),
        "reached a server: {}",
        describe(&out)
    );
    assert!(!env.path("ran").exists());
    let record = report_line(&report);
    assert_common(&record, server, &lock, code);
    assert_eq!(record["outcome"], "error", "{record}");
    let error = record["error"].as_str().expect("error");
    assert!(
        !error.is_empty() && stderr_of(&out).contains(error),
        "the error is not the line dlock printed: {record}\n{}",
        describe(&out)
    );
    assert!(record.get("token").is_none(), "{record}");
}

pub fn report_records_a_signalled_run(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let _holder = env.hold(&lock, &[]);
    let mut waiter = env
        .dlock([
            "run",
            "--report",
            report.to_str().expect("UTF-8 path"),
            &lock,
            "touch",
            "ran",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    wait_until("waiter queued", PATIENCE, || env.waiters(&lock) >= 1);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiter.id() as i32),
        Signal::SIGTERM,
    )
    .expect("kill");
    let status = wait_within(&mut waiter, PATIENCE);
    assert_eq!(status.code(), Some(128 + 15));
    let record = report_line(&report);
    assert_common(&record, server, &lock, 128 + 15);
    assert_eq!(record["outcome"], "signalled", "{record}");
    assert_eq!(record["signal"], "SIGTERM", "{record}");
    assert!(record.get("command_status").is_none(), "{record}");
}

pub fn report_records_a_lost_lock(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let mut holding = env.hold(
        &lock,
        &[
            "--kill-after",
            "2s",
            "--report",
            report.to_str().expect("UTF-8 path"),
        ],
    );
    server.break_hold(&env, &lock);
    assert_eq!(holding.wait().code(), Some(124));
    let record = report_line(&report);
    assert_common(&record, server, &lock, 124);
    assert_eq!(record["outcome"], "lost", "{record}");
    // Why, in the words of the line dlock printed for it.
    let reason = record["lost_reason"].as_str().unwrap_or_default();
    assert!(!reason.is_empty(), "no lost_reason: {record}");
    assert!(
        holding.stderr().contains(reason),
        "lost_reason is not what dlock said: {record}"
    );
    assert!(record["command_status"].as_u64().is_some(), "{record}");
    assert!(record["token"].as_u64().is_some(), "{record}");
}

pub fn report_lines_of_concurrent_runs_never_mix(server: &dyn LockServer) {
    const RUNS: usize = 16;
    let env = TestEnv::new(server);
    let report = env.path("runs.jsonl");
    let names: Vec<String> = (0..RUNS).map(|i| lock_name(&format!("c{i}"))).collect();
    let mut runs: Vec<Child> = names
        .iter()
        .map(|name| {
            env.dlock([
                "run",
                "--report",
                report.to_str().expect("UTF-8 path"),
                name,
                "true",
            ])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
        })
        .collect();
    for run in &mut runs {
        let status = wait_within(run, PATIENCE);
        assert_eq!(status.code(), Some(0), "{}", stderr_left(run));
    }
    let lines = report_lines(&report);
    assert_eq!(lines.len(), RUNS, "{lines:?}");
    let mut seen: Vec<&str> = lines
        .iter()
        .map(|l| l["name"].as_str().expect("name"))
        .collect();
    seen.sort_unstable();
    let mut wanted: Vec<&str> = names.iter().map(String::as_str).collect();
    wanted.sort_unstable();
    assert_eq!(seen, wanted);
}

/// Everything a child writes on stderr, collected by a thread as it comes.
fn collect_stderr(child: &mut Child) -> Arc<Mutex<String>> {
    let text = Arc::new(Mutex::new(String::new()));
    let mut stderr = child.stderr.take().expect("piped stderr");
    let sink = text.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok(n) = stderr.read(&mut buf) {
            if n == 0 {
                break;
            }
            let chunk = String::from_utf8_lossy(&buf[..n]).into_owned();
            sink.lock().expect("stderr text").push_str(&chunk);
        }
    });
    text
}

fn text_of(text: &Arc<Mutex<String>>) -> String {
    text.lock().expect("stderr text").clone()
}

/// A wait in a CI log (CI set, stderr a pipe) is announced within a second, naming the holder,
/// and ends with one "acquired" line; in cron (no CI, no terminal) the same wait prints
/// nothing; `-q` silences CI too; `-v` prints one "acquired" line.
pub fn waiting_shows_in_ci_logs_but_not_in_cron_mail(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let holder = env.hold(&lock, &[]);
    let waiter = |extra: &[&str], ci: Option<&str>| {
        let mut args = vec!["run"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[&lock, "true"]);
        let mut command = env.dlock(args);
        command.env_remove("CI").stderr(Stdio::piped());
        if let Some(ci) = ci {
            command.env("CI", ci);
        }
        let mut child = command.spawn().expect("spawn waiter");
        let text = collect_stderr(&mut child);
        (child, text)
    };
    let started = Instant::now();
    let (mut ci, ci_text) = waiter(&[], Some("true"));
    let (mut ci_quiet, ci_quiet_text) = waiter(&["-q"], Some("true"));
    let (mut cron, cron_text) = waiter(&[], None);
    let (mut ci_off, ci_off_text) = waiter(&[], Some("false"));
    let (mut verbose, verbose_text) = waiter(&["-v"], None);
    let wanted = format!(
        "dlock: waiting for '{lock}': held by pid {} on ",
        holder.pid()
    );
    wait_until("the CI waiting line", PATIENCE, || {
        text_of(&ci_text).contains(&wanted)
    });
    let shown_after = started.elapsed();
    // Within a second of starting to wait on an idle machine; generous for a loaded one.
    assert!(
        shown_after < Duration::from_secs(5),
        "shown after {shown_after:?}"
    );
    // Every waiter has now waited past the moment a waiting line would have appeared.
    std::thread::sleep(Duration::from_millis(1500).saturating_sub(started.elapsed()));
    drop(holder);
    for child in [&mut ci, &mut ci_quiet, &mut cron, &mut ci_off, &mut verbose] {
        assert_eq!(wait_within(child, PATIENCE).code(), Some(0));
    }
    // The collecting threads see the end of stderr a moment after the exit.
    let acquired = format!("dlock: acquired '{lock}' after waiting ");
    wait_until("the acquired lines", PATIENCE, || {
        text_of(&ci_text).contains(&acquired) && text_of(&verbose_text).contains(&acquired)
    });
    let ci_text = text_of(&ci_text);
    assert_eq!(ci_text.matches("acquired").count(), 1, "{ci_text}");
    assert!(
        !ci_text.contains('\r'),
        "a CI log gets whole lines: {ci_text:?}"
    );
    let verbose_text = text_of(&verbose_text);
    assert_eq!(
        verbose_text.matches("acquired").count(),
        1,
        "-v: {verbose_text}"
    );
    for (what, text) in [
        ("-q in CI", ci_quiet_text),
        ("cron", cron_text),
        ("CI=false", ci_off_text),
    ] {
        assert_eq!(text_of(&text), "", "{what} printed on stderr");
    }
}

/// The record names the signal that ended a run after it acquired: one that stopped the
/// command (forwarded to it), and one that cut `--min-hold`'s keeping short after the command
/// had finished well.
pub fn report_records_the_signal_that_stopped_a_holding_run(server: &dyn LockServer) {
    let env = TestEnv::new(server);
    let lock = lock_name("lock");
    let report = env.path("runs.jsonl");
    let to = report.to_str().expect("UTF-8 path");
    // While the command runs.
    let mut holding = env.hold(&lock, &["--report", to]);
    holding.signal(Signal::SIGTERM);
    assert_eq!(holding.wait().code(), Some(128 + 15));
    let record = report_line(&report);
    assert_common(&record, server, &lock, 128 + 15);
    assert_eq!(record["outcome"], "signalled", "{record}");
    assert_eq!(record["signal"], "SIGTERM", "{record}");
    assert!(record["command_status"].as_u64().is_some(), "{record}");
    assert!(record["token"].as_u64().is_some(), "{record}");
    std::fs::remove_file(&report).expect("remove the report");
    // While --min-hold keeps the lock after the command finished with 0.
    let log_path = env.path("kept.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut kept = env
        .dlock([
            "run",
            "-v",
            "--report",
            to,
            "--min-hold",
            "60s",
            &lock,
            "true",
        ])
        .stderr(log)
        .spawn()
        .expect("spawn");
    wait_until("the run in its --min-hold", PATIENCE, || {
        std::fs::read_to_string(&log_path)
            .unwrap_or_default()
            .contains("the command has finished (status 0)")
    });
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(kept.id() as i32), Signal::SIGINT)
        .expect("kill");
    assert_eq!(wait_within(&mut kept, PATIENCE).code(), Some(128 + 2));
    let record = report_line(&report);
    assert_common(&record, server, &lock, 128 + 2);
    assert_eq!(record["outcome"], "signalled", "{record}");
    assert_eq!(record["signal"], "SIGINT", "{record}");
    assert_eq!(record["command_status"], 0, "{record}");
}
