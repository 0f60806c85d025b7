//! Messages on stderr, each line starting with `dlock: `. stdout belongs to the command.
//!
//! Default level: warnings. `-v` info, `-vv` debug, `-vvv` trace; `-q` errors only, `-qq`
//! nothing. `DLOCK_LOG` takes a tracing filter (e.g. `dlock=debug`) and overrides both.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::{EnvFilter, LevelFilter};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

pub fn init(verbose: u8, quiet: u8) {
    let level = match (i16::from(verbose) - i16::from(quiet)).clamp(-2, 3) {
        -2 => LevelFilter::OFF,
        -1 => LevelFilter::ERROR,
        0 => LevelFilter::WARN,
        1 => LevelFilter::INFO,
        2 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
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
        let label = match *event.metadata().level() {
            Level::ERROR => "error: ",
            Level::WARN => "warning: ",
            Level::DEBUG | Level::TRACE => "debug: ",
            Level::INFO => "",
        };
        write!(writer, "dlock: {label}")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}
