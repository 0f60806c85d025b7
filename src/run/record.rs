//! The outcome record (`--report PATH`, README: "Outcome records"): one JSON object on one
//! line per run, whatever the outcome, for machines and for "did last night's job run?".
//!
//! - The line is appended with one `write` on an `O_APPEND` descriptor, so the runs sharing a
//!   file never interleave or overwrite each other's lines, and a line that does not fit whole
//!   is cut back off (`opening`).
//! - The file is opened before the lock is asked for, so a wrong path is reported at once
//!   (78) and nothing runs. It is opened with the care of a lock file in a shared directory,
//!   and only through directories and links of the user's or root's (`opening`).
//! - Writing the line after the run can only warn: the record never changes the exit status.

mod opening;

use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

use serde::Serialize;

use super::events::{Event, Observer};
use crate::cli;
use crate::clock::BootInstant;
use crate::config::FileConfig;
use crate::error::Error;
use crate::lock::Holder;
use crate::settings::{self, ReportTo, RunSettings};

/// Where the record goes, opened.
pub(super) enum Sink {
    Stderr,
    File {
        report: opening::Report,
        path: PathBuf,
    },
}

impl Sink {
    /// Open `to` for appending, or say why it cannot be (a configuration error, 78).
    pub(super) fn open(to: &ReportTo) -> Result<Sink, Error> {
        match to {
            ReportTo::Stderr => Ok(Sink::Stderr),
            ReportTo::File { path, given_as } => Ok(Sink::File {
                report: opening::open(path)
                    .map_err(|why| Error::Config(format!("{given_as}: {why}")))?,
                path: path.clone(),
            }),
        }
    }

    /// Append the record of the run `track` followed, which ended with `result`.
    pub(super) fn write_outcome(
        &self,
        track: &Track,
        settings: &RunSettings,
        result: &anyhow::Result<crate::exit::Outcome>,
    ) {
        let (exit_status, error) = match result {
            Ok(outcome) => (outcome.status(), None),
            Err(err) => (
                crate::exit::Outcome::Failed(crate::error::code_of(err)).status(),
                Some(crate::logging::printable(&format!("{err:#}")).into_owned()),
            ),
        };
        self.write(&track.record(settings, exit_status, error));
    }

    /// Append `record` as one line; a failure is a warning.
    pub(super) fn write(&self, record: &Record) {
        let mut line = match serde_json::to_vec(record) {
            Ok(line) => line,
            Err(err) => {
                tracing::warn!("cannot write the report: {err}");
                return;
            }
        };
        line.push(b'\n');
        match self {
            Sink::Stderr => {
                // One write(2) of the whole line, as to a file.
                let problem = match std::io::stderr().lock().write(&line) {
                    Ok(n) if n == line.len() => return,
                    Ok(n) => format!("only {n} of {} bytes were written", line.len()),
                    Err(err) => err.to_string(),
                };
                tracing::warn!("cannot write the report to stderr: {problem}");
            }
            Sink::File { report, path } => {
                if let Err(problem) = report.append(&line) {
                    tracing::warn!("cannot write the report to {}: {problem}", path.display());
                }
            }
        }
    }
}

/// What a run's steps told of it ([`Event`]s), turned into a [`Record`] at the end.
pub(super) struct Track {
    started: BootInstant,
    started_at: SystemTime,
    acquired: Option<(BootInstant, SystemTime, u64)>,
    gave_up: Option<BootInstant>,
    command_status: Option<u8>,
    /// Why the lock was lost while the command ran.
    lost: Option<String>,
    signalled: Option<String>,
    busy: bool,
    holder: Option<Holder>,
    /// How a hold ended ([`Event::HoldEnded`]).
    hold_ended: Option<&'static str>,
}

impl Track {
    pub(super) fn new() -> Track {
        Track {
            started: BootInstant::now(),
            started_at: SystemTime::now(),
            acquired: None,
            gave_up: None,
            command_status: None,
            lost: None,
            signalled: None,
            busy: false,
            holder: None,
            hold_ended: None,
        }
    }

    /// The wait ended without the lock (busy, a signal, an error): the first end counts.
    fn gave_up(&mut self) {
        self.gave_up.get_or_insert_with(BootInstant::now);
    }

    /// The record of the run that ends now with `exit_status` (and `error`, the message dlock
    /// printed for it).
    pub(super) fn record(
        &self,
        settings: &RunSettings,
        exit_status: u8,
        error: Option<String>,
    ) -> Record {
        let now = BootInstant::now();
        let outcome = if error.is_some() {
            "error"
        } else if self.signalled.is_some() {
            "signalled"
        } else if self.lost.is_some() {
            "lost"
        } else if self.busy {
            "busy"
        } else if settings.command.is_hold() {
            "held"
        } else {
            "ran"
        };
        let waited_until = self
            .acquired
            .map(|(at, _, _)| at)
            .or(self.gave_up)
            .unwrap_or(now);
        let token = self
            .acquired
            .map(|(_, _, token)| token)
            .filter(|&token| token > 0);
        Record {
            name: settings.name.as_str().to_owned(),
            backend: settings.common.scheme(),
            url: settings.common.display_url.clone(),
            mode: settings.mode.as_str(),
            command: settings
                .record_command
                .then(|| recorded_command(&settings.command.display)),
            host: host_name(),
            pid: std::process::id(),
            outcome,
            exit_status,
            command_status: self.command_status,
            token,
            token_str: token.map(crate::lock::token_str),
            signal: self.signalled.clone().filter(|s| !s.is_empty()),
            lost_reason: self
                .lost
                .as_deref()
                .map(|why| crate::logging::printable(why).into_owned()),
            waited_ms: millis(waited_until.saturating_since(self.started)),
            held_ms: self
                .acquired
                .map(|(at, _, _)| millis(now.saturating_since(at))),
            started_at: rfc3339(self.started_at),
            acquired_at: self.acquired.map(|(_, at, _)| rfc3339(at)),
            ended_at: rfc3339(SystemTime::now()),
            // Anyone may have written the holder's metadata: each field is cut to the cap.
            ended_by: self.hold_ended,
            holder: self.holder.as_ref().map(|h| {
                let h = crate::wording::capped_holder(h);
                RecordHolder {
                    pid: h.pid,
                    host: h.host,
                    user: h.user,
                    since: h.since,
                    command: h.command,
                }
            }),
            error,
        }
    }
}

impl Observer for Track {
    fn saw(&mut self, event: Event) {
        match event {
            Event::Acquired(token) => {
                self.acquired = Some((BootInstant::now(), SystemTime::now(), token.unwrap_or(0)));
            }
            Event::GaveUp => self.gave_up(),
            Event::Busy => {
                self.gave_up();
                self.busy = true;
            }
            Event::HeldBy(holder) => self.holder = Some(holder),
            Event::SignalledWhileWaiting(signal) => {
                self.gave_up();
                self.signalled = Some(crate::signals::name(signal));
            }
            Event::Lost(why) => self.lost = Some(why),
            // A signal already told stays the one the record names.
            Event::StoppedBy(signal) => {
                self.signalled
                    .get_or_insert_with(|| crate::signals::name(signal));
            }
            Event::CommandEnded(status) => self.command_status = Some(status),
            Event::SignalledWhileKept(signal) => {
                self.signalled = Some(crate::signals::name(signal));
            }
            Event::HoldEnded(how) => self.hold_ended = Some(how),
        }
    }
}

/// Append the record of a run refused before it started, because its command line, its
/// environment or the config file is wrong (`file`: the config file's values, or none when
/// the file itself is the problem), to where the run's `--report` would have gone, as far as
/// that can be told.
pub(crate) fn refused(args: &cli::RunArgs, file: &FileConfig, err: &anyhow::Error) {
    let Some(to) = settings::report_to(args.report.clone(), &args.backend.from_env, file) else {
        return;
    };
    let sink = match Sink::open(&to) {
        Ok(sink) => sink,
        Err(why) => {
            tracing::warn!("cannot write the report: {why}");
            return;
        }
    };
    // The backend and its URL (passwords masked), where they are not the problem.
    let common = settings::common(&args.backend, args.ttl.clone(), file).ok();
    let now = rfc3339(SystemTime::now());
    sink.write(&Record {
        name: args.name.to_string_lossy().into_owned(),
        backend: common.as_ref().map_or("", |c| c.scheme()),
        url: common.map(|c| c.display_url).unwrap_or_default(),
        // As asked for (flag, DLOCK_SHARED, config file), whether or not it was the problem.
        mode: if args.shared
            || (!args.backend.from_env.iter().any(|id| id == "shared")
                && file.values.shared == Some(true))
        {
            "shared"
        } else {
            "exclusive"
        },
        command: args
            .record_command
            .or(file.values.record_command)
            .unwrap_or(true)
            .then(|| recorded_command(&refused_command(args))),
        host: host_name(),
        pid: std::process::id(),
        outcome: "error",
        exit_status: crate::error::code_of(err).value(),
        command_status: None,
        token: None,
        token_str: None,
        signal: None,
        lost_reason: None,
        waited_ms: 0,
        held_ms: None,
        started_at: now.clone(),
        acquired_at: None,
        ended_at: now,
        ended_by: None,
        holder: None,
        error: Some(crate::logging::printable(&format!("{err:#}")).into_owned()),
    });
}

/// The command line as the lock's metadata records it (`settings/command.rs`): secrets
/// masked, cut to [`Holder::MAX_COMMAND`] bytes.
fn recorded_command(words: &[String]) -> String {
    let mut line = crate::secrets::redact_command(words).join(" ");
    crate::process::cut_to(&mut line, Holder::MAX_COMMAND);
    crate::logging::printable(&line).into_owned()
}

/// The words of a refused run's command, as `settings/command.rs` would have made them.
fn refused_command(args: &cli::RunArgs) -> Vec<String> {
    let lossy = |word: &std::ffi::OsStr| word.to_string_lossy().into_owned();
    match &args.shell_command {
        Some(script) => {
            let shell = std::env::var_os("SHELL")
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "/bin/sh".into());
            vec![lossy(&shell), "-c".to_owned(), lossy(script)]
        }
        None => args.command.iter().map(|w| lossy(w)).collect(),
    }
}

fn host_name() -> String {
    nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default()
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// One line of the report (README: "Outcome records" lists the fields).
#[derive(Debug, Serialize)]
pub(super) struct Record {
    name: String,
    backend: &'static str,
    url: String,
    /// `shared` or `exclusive` (`--shared`).
    mode: &'static str,
    /// The command line, secrets masked; none with `--record-command off`.
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<String>,
    host: String,
    pid: u32,
    outcome: &'static str,
    exit_status: u8,
    #[serde(skip_serializing_if = "Option::is_none")]
    command_status: Option<u8>,
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<u64>,
    /// `token` in decimal digits, exact for every JSON tool (`lock::token_str`).
    #[serde(skip_serializing_if = "Option::is_none")]
    token_str: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    signal: Option<String>,
    /// Why the lock was lost while the command ran (outcome `lost`).
    #[serde(skip_serializing_if = "Option::is_none")]
    lost_reason: Option<String>,
    waited_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    held_ms: Option<u64>,
    started_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    acquired_at: Option<String>,
    ended_at: String,
    /// How a hold (`dlock hold`, outcome `held`) ended: `release`, `owner`, `max-hold`,
    /// `signal`.
    #[serde(skip_serializing_if = "Option::is_none")]
    ended_by: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    holder: Option<RecordHolder>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct RecordHolder {
    pid: u32,
    host: String,
    user: String,
    since: String,
    command: String,
}
