//! Messages on stderr, each line starting with `dlock: `. stdout belongs to the command.
//!
//! Default level: warnings. `-v` info, `-vv` debug, `-vvv` trace (the libraries' trace-level
//! messages are left out of release builds: Cargo.toml says why); `-q` errors only, `-qq`
//! nothing. `DLOCK_LOG` takes a tracing filter (e.g. `dlock=debug`) and overrides both.
//!
//! Hand-off events (target [`HANDOFF`], debug level: `DLOCK_LOG=dlock::handoff=debug`) mark
//! the moments of a lock's hand-over from one process to the next (the command exited, the
//! release was sent, the waiter was woken, the token was written, …). Their lines carry the
//! wall clock in microseconds and the pid, `dlock: handoff 1764611101.123456 pid=1234 woken`,
//! so that the lines of several processes on one host merge into one time line
//! (`tests/handoff.rs` cuts it into hand-offs; `scripts/handoff-parts` reports the parts).

use std::borrow::Cow;
use std::fmt;
use std::io::Write;

use tracing::{span, Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Print `dlock: MESSAGE` on stderr: control characters escaped (see `printable`), and a
/// closed or broken stderr ignored, so that reporting can never panic or abort dlock.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {
        $crate::logging::say(format_args!($($arg)*))
    };
}

/// See [`say!`].
pub fn say(message: fmt::Arguments<'_>) {
    let text = message.to_string();
    let _ = writeln!(std::io::stderr().lock(), "dlock: {}", printable(&text));
}

/// `text` with every control character (C0, DEL, C1), every bidirectional-formatting
/// character, the line and paragraph separators (U+2028, U+2029), the zero-width and invisible
/// characters and the byte-order mark written as `\u{..}` (`\n`, `\t`, `\r` for those three),
/// so that text from a lock's metadata or a server (a user name, a command line, a host)
/// cannot move the cursor, retitle the terminal, break a line, hide text or reorder what is
/// shown.
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(needs_escape) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        push_escaped(&mut out, c);
    }
    Cow::Owned(out)
}

/// `c` as [`printable`] writes it.
fn push_escaped(out: &mut String, c: char) {
    match c {
        '\n' => out.push_str("\\n"),
        '\t' => out.push_str("\\t"),
        '\r' => out.push_str("\\r"),
        c if needs_escape(c) => {
            use std::fmt::Write;
            let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
        }
        c => out.push(c),
    }
}

fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            // Arabic letter mark, Mongolian vowel separator (invisible).
            '\u{61c}' | '\u{180e}'
            // Zero-width space, non-joiner, joiner; left-to-right and right-to-left marks.
            | '\u{200b}'..='\u{200f}'
            // Line and paragraph separators; bidirectional embeddings and overrides.
            | '\u{2028}'..='\u{202e}'
            // Word joiner, invisible operators; bidirectional isolates.
            | '\u{2060}'..='\u{2069}'
            // Byte-order mark (zero-width no-break space); interlinear annotation marks.
            | '\u{feff}' | '\u{fff9}'..='\u{fffb}'
        )
}

/// How many characters of one field of metadata read back from a server or a lock file (a
/// host, a user, a command line, a version) dlock shows, in text and in JSON: room for the
/// command line dlock itself records ([`crate::lock::Holder::MAX_COMMAND`] bytes) and then
/// some, so that a hand-written megabyte cannot become a megabyte line on a terminal, in a CI
/// log or in a report.
pub const MAX_SHOWN: usize = 256;

/// What marks a field cut to [`MAX_SHOWN`].
pub const CUT: char = '…';

/// `text` cut to [`MAX_SHOWN`] characters, `…` where it was cut: for JSON (which escapes
/// what it must itself) and for text that [`printable`] escapes later.
pub fn capped(text: &str) -> Cow<'_, str> {
    match text.char_indices().nth(MAX_SHOWN) {
        None => Cow::Borrowed(text),
        Some((at, _)) => Cow::Owned(format!("{}{CUT}", &text[..at])),
    }
}

/// `text` for a terminal: escaped as [`printable`] escapes it and cut to [`MAX_SHOWN`]
/// characters of what is shown (escapes included; never inside one), `…` where it was cut.
pub fn shown(text: &str) -> Cow<'_, str> {
    let plain = text.len() <= MAX_SHOWN && !text.chars().any(needs_escape);
    if plain {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(MAX_SHOWN * 4));
    let mut count = 0;
    let mut one = String::new();
    for c in text.chars() {
        one.clear();
        push_escaped(&mut one, c);
        let width = one.chars().count();
        if count + width > MAX_SHOWN {
            out.push(CUT);
            return Cow::Owned(out);
        }
        count += width;
        out.push_str(&one);
    }
    Cow::Owned(out)
}

/// The target of the hand-off events: `tracing::debug!(target: "dlock::handoff", "woken")`.
pub const HANDOFF: &str = "dlock::handoff";

/// The start of a hand-off event's line after `dlock: `: `handoff <unix seconds>.<µs> pid=<pid> `.
/// The clock is read here, as the event is written, which is when the macro at the event's
/// place in the code runs (both subscribers write synchronously).
fn handoff_stamp() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "handoff {}.{:06} pid={} ",
        now.as_secs(),
        now.subsec_micros(),
        std::process::id()
    )
}

/// What follows `dlock: ` before the message: the level's label, or for a hand-off event
/// its time stamp and pid.
fn prefix(metadata: &tracing::Metadata<'_>) -> Cow<'static, str> {
    if metadata.target() == HANDOFF {
        Cow::Owned(handoff_stamp())
    } else {
        Cow::Borrowed(label(*metadata.level()))
    }
}

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-q` was given: routine outcomes (such as "the lock is held") are not reported.
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

static VERBOSE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-v` was given (more than `-q`): routine progress, such as waiting, is reported
/// even when stderr is not a terminal.
pub fn verbose() -> bool {
    VERBOSE.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn init(verbose: u8, quiet: u8) {
    QUIET.store(quiet > verbose, std::sync::atomic::Ordering::Relaxed);
    VERBOSE.store(verbose > quiet, std::sync::atomic::Ordering::Relaxed);
    // A filter from DLOCK_LOG needs tracing-subscriber's machinery; the plain levels do not,
    // and skipping it keeps start-up lean.
    if std::env::var_os("DLOCK_LOG").is_none_or(|f| f.is_empty()) {
        let max = level_for(verbose, quiet);
        // Only fails when a subscriber is already set (tests calling twice); the first stays.
        drop(tracing::subscriber::set_global_default(Stderr { max }));
        return;
    }
    init_filtered(verbose, quiet);
}

fn level_for(verbose: u8, quiet: u8) -> LevelFilter {
    match (i16::from(verbose) - i16::from(quiet)).clamp(-2, 3) {
        -2 => LevelFilter::OFF,
        -1 => LevelFilter::ERROR,
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// The `dlock: ` label for a level.
fn label(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error: ",
        Level::WARN => "warning: ",
        Level::DEBUG | Level::TRACE => "debug: ",
        Level::INFO => "",
    }
}

/// A minimal subscriber: events at or above `max`, one line each on stderr; spans ignored.
struct Stderr {
    max: LevelFilter,
}

impl Subscriber for Stderr {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        // A client library's warning is its view of a failure dlock reports in its own words
        // (ZooKeeper's "fails to establish session"): shown from -v on, as information.
        let level = match *metadata.level() {
            Level::WARN if !metadata.target().starts_with("dlock") => Level::INFO,
            level => level,
        };
        level <= self.max
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(self.max)
    }

    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }

    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}

    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}

    fn event(&self, event: &Event<'_>) {
        let prefix = prefix(event.metadata());
        let mut line = Line(String::new());
        event.record(&mut line);
        say(format_args!("{prefix}{}", line.0));
    }

    fn enter(&self, _: &span::Id) {}

    fn exit(&self, _: &span::Id) {}
}

/// Collects an event's message, then any other fields as ` key=value`.
struct Line(String);

impl tracing::field::Visit for Line {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        use std::fmt::Write;
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

fn init_filtered(verbose: u8, quiet: u8) {
    let level = level_for(verbose, quiet);
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .event_format(DlockFormat);
    // Parsing a filter costs start-up time; only do it when asked to.
    let result = match std::env::var("DLOCK_LOG") {
        Ok(filter) if !filter.is_empty() => {
            builder.with_env_filter(EnvFilter::new(filter)).try_init()
        }
        _ => builder.with_max_level(level).try_init(),
    };
    // Only fails when a subscriber is already set (tests calling twice); the first one stays.
    drop(result);
}

/// `dlock: warning: message` / `dlock: message` / `dlock: handoff <time> pid=<pid> message`.
struct DlockFormat;

impl<S, N> FormatEvent<S, N> for DlockFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let prefix = prefix(event.metadata());
        let mut fields = String::new();
        ctx.field_format()
            .format_fields(Writer::new(&mut fields), event)?;
        writeln!(writer, "dlock: {prefix}{}", printable(&fields))
    }
}

/// How long something took, as `-v` says it: milliseconds to the microsecond below a
/// second (`0.154ms`, `1.075ms`), seconds to the millisecond from one (`2.301s`), so that
/// every such line reads one way.
pub fn elapsed(took: std::time::Duration) -> String {
    if took < std::time::Duration::from_secs(1) {
        format!(
            "{}.{:03}ms",
            took.as_micros() / 1000,
            took.as_micros() % 1000
        )
    } else {
        format!("{}.{:03}s", took.as_secs(), took.subsec_millis())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_times_read_one_way() {
        use std::time::Duration;
        assert_eq!(elapsed(Duration::from_nanos(154_469)), "0.154ms");
        assert_eq!(elapsed(Duration::from_nanos(1_075_247)), "1.075ms");
        assert_eq!(elapsed(Duration::from_micros(999_999)), "999.999ms");
        assert_eq!(elapsed(Duration::from_millis(2_301)), "2.301s");
        assert_eq!(elapsed(Duration::ZERO), "0.000ms");
    }

    #[test]
    fn invisible_and_line_breaking_characters_are_escaped() {
        for c in [
            '\u{2028}', '\u{2029}', '\u{200b}', '\u{200d}', '\u{feff}', '\u{202e}',
        ] {
            let text = format!("a{c}b");
            assert_eq!(printable(&text), format!("a\\u{{{:x}}}b", u32::from(c)));
        }
        assert_eq!(printable("plain é 漢"), "plain é 漢");
    }

    #[test]
    fn shown_fields_are_cut_to_the_cap_and_marked() {
        let long = "x".repeat(2 * 1024 * 1024);
        let cut = capped(&long);
        assert_eq!(cut.chars().count(), MAX_SHOWN + 1);
        assert!(cut.ends_with(CUT));
        assert_eq!(capped("short"), "short");
        let exact = "é".repeat(MAX_SHOWN);
        assert_eq!(capped(&exact), exact);
        // Escapes count as what is shown, and none is cut in half.
        let spoofing = "\u{202e}".repeat(MAX_SHOWN);
        let shown_text = shown(&spoofing);
        assert!(shown_text.chars().count() <= MAX_SHOWN + 1, "{shown_text}");
        assert!(shown_text.ends_with("\\u{202e}…"), "{shown_text}");
        assert!(!shown_text.contains('\u{202e}'));
        assert_eq!(shown(&exact), exact);
        assert_eq!(shown("a\u{2028}b"), "a\\u{2028}b");
    }

    #[test]
    fn a_handoff_stamp_is_wall_clock_microseconds_and_the_pid() {
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs_f64();
        let stamp = handoff_stamp();
        let words: Vec<&str> = stamp.split(' ').collect();
        assert_eq!(words.len(), 4, "{stamp:?}");
        assert_eq!(words[0], "handoff");
        let (secs, micros) = words[1].split_once('.').expect("seconds.micros");
        assert_eq!(micros.len(), 6, "{stamp:?}");
        assert!(secs
            .chars()
            .chain(micros.chars())
            .all(|c| c.is_ascii_digit()));
        let at: f64 = words[1].parse().expect("a number");
        assert!((at - before).abs() < 60.0, "{at} vs {before}");
        assert_eq!(words[2], format!("pid={}", std::process::id()));
        assert_eq!(words[3], "", "the message follows after one space");
    }
}
