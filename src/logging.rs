//! Messages on stderr, each line starting with `dlock: `. stdout belongs to the command.
//!
//! Default level: warnings. `-v` info, `-vv` debug, `-vvv` trace; `-q` errors only, `-qq`
//! nothing. `DLOCK_LOG` takes a tracing filter (e.g. `dlock=debug`) and overrides both.

use std::fmt;

use tracing::{span, Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

static QUIET: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether `-q` was given: routine outcomes (such as "the lock is held") are not reported.
pub fn quiet() -> bool {
    QUIET.load(std::sync::atomic::Ordering::Relaxed)
}

pub fn init(verbose: u8, quiet: u8) {
    QUIET.store(quiet > verbose, std::sync::atomic::Ordering::Relaxed);
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
        *metadata.level() <= self.max
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
        let mut line = Line(String::new());
        event.record(&mut line);
        eprintln!("dlock: {}{}", label(*event.metadata().level()), line.0);
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

/// `dlock: warning: message` / `dlock: message`.
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
        write!(writer, "dlock: {}", label(*event.metadata().level()))?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
