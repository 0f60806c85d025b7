//! What `status`, `list` and `check` print, for humans and as JSON, and how clap's usage
//! errors are reported (one `dlock:` line, exit 64).
//!
//! What a server or a lock file says of a lock (a holder's host, user, command line, …) may
//! have been written by anyone: each text is cut to [`crate::logging::MAX_SHOWN`] characters,
//! in JSON as in text, and escaped in text ([`shown`]).

use std::io::Write;
use std::time::{Duration, SystemTime};

use crate::exit::Code;
use crate::lock::{CheckReport, HolderStatus, LockStatus, Waiter};
use crate::logging::{capped, shown};
use crate::settings::Common;

/// Report a command-line error as one `dlock:` line (help and version go to stdout, exit 0).
pub fn clap_error(err: clap::Error) -> u8 {
    use clap::error::ErrorKind;
    match err.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => {
            let _ = err.print();
            0
        }
        ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            let _ = err.print();
            Code::Usage.value()
        }
        _ => {
            let text = err.to_string();
            let first = text.lines().next().unwrap_or("bad usage");
            let message = first.strip_prefix("error: ").unwrap_or(first);
            // "the following required arguments were not provided:" lists them on the
            // indented lines below: name them on the one line (`<NAME>`).
            let listed: Vec<&str> = text
                .lines()
                .skip(1)
                .take_while(|l| l.starts_with("  "))
                .map(str::trim)
                .collect();
            let message = if message.ends_with(':') && !listed.is_empty() {
                format!("{message} {}", listed.join(", "))
            } else {
                message.to_owned()
            };
            let tip = text
                .lines()
                .map(str::trim)
                .find_map(|l| l.strip_prefix("tip: "))
                .map(|t| format!("; {t}"))
                .unwrap_or_default();
            if message.ends_with("--help") {
                say!("{message}");
            } else {
                say!("{message}{tip} (see 'dlock --help')");
            }
            Code::Usage.value()
        }
    }
}

/// What to make of a failed write of a report: a reader that went away (`dlock status x |
/// head -1`) is not an error, and dlock ends with the status it would have had.
pub fn unless_closed(result: std::io::Result<()>) -> anyhow::Result<()> {
    match result {
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(anyhow::Context::context(
            other,
            "cannot write to standard output",
        )?),
    }
}

fn out() -> std::io::StdoutLock<'static> {
    std::io::stdout().lock()
}

pub fn print_status(status: &LockStatus, json: bool) -> std::io::Result<()> {
    let mut out = out();
    if json {
        serde_json::to_writer_pretty(&mut out, &capped_status(status))?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "lock:       {}", shown(&status.name))?;
    writeln!(
        out,
        "state:      {}",
        if status.held { "held" } else { "free" }
    )?;
    for holder in &status.holders {
        write_holder(&mut out, holder)?;
    }
    if let Some(waiters) = status.waiters {
        writeln!(out, "waiters:    {waiters}")?;
    }
    for (position, waiter) in status.queue.iter().enumerate() {
        let h = &waiter.holder;
        writeln!(
            out,
            "  {}. pid {} on {} since {}: {}",
            position + 1,
            h.pid,
            if h.host.is_empty() {
                "?".into()
            } else {
                shown(&h.host)
            },
            shown(&h.since),
            shown(&h.command)
        )?;
    }
    if !status.waiting_here.is_empty() {
        writeln!(out, "on this host, longest-waiting first:")?;
    }
    for waiter in &status.waiting_here {
        let user = if waiter.user.is_empty() {
            String::new()
        } else {
            format!(", user {}", shown(&waiter.user))
        };
        writeln!(
            out,
            "  pid {}{user}, waiting since {} ({}) {}: {}",
            waiter.pid,
            shown(&waiter.since),
            humantime::format_duration(Duration::from_secs(waiter.waited_ms / 1000)),
            match waiter.stage {
                "host queue" => "in this host's queue",
                "server" => "at the server",
                _ => "for the lock file",
            },
            shown(&waiter.command)
        )?;
    }
    if !status.held {
        if let Some(token) = status.last_token {
            writeln!(out, "last token: {token}")?;
        }
    }
    Ok(())
}

fn write_holder(out: &mut impl Write, status: &HolderStatus) -> std::io::Result<()> {
    let h = &status.holder;
    let host = if h.host.is_empty() && h.pid > 0 {
        // Only the file backend finds a holder with no record: through this host's kernel.
        "this host".into()
    } else if h.host.is_empty() {
        "?".into()
    } else {
        shown(&h.host)
    };
    let user = if h.user.is_empty() {
        String::new()
    } else {
        format!(", user {}", shown(&h.user))
    };
    match crate::wording::holder_kind(h) {
        Some(kind) if h.is_foreign() => writeln!(out, "holder:     {}", shown(&kind))?,
        Some(kind) => {
            writeln!(out, "holder:     pid {} on {host}{user}", h.pid)?;
            writeln!(out, "            {}", shown(&kind))?;
        }
        None => writeln!(out, "holder:     pid {} on {host}{user}", h.pid)?,
    }
    writeln!(out, "mode:       {}", h.mode.as_str())?;
    if !h.command.is_empty() {
        writeln!(out, "command:    {}", shown(&h.command))?;
    }
    if !h.since.is_empty() {
        writeln!(out, "since:      {}{}", shown(&h.since), ago(&h.since))?;
    }
    if !h.kept_until.is_empty() {
        writeln!(
            out,
            "finished:   the command has ended; the lock is kept until {} (--min-hold)",
            shown(&h.kept_until)
        )?;
    } else if h.min_hold_ms > 0 {
        writeln!(
            out,
            "min hold:   {} (the lock is kept at least that long, even when the command ends sooner)",
            humantime::format_duration(Duration::from_millis(h.min_hold_ms))
        )?;
    }
    if h.token > 0 {
        writeln!(out, "token:      {}", h.token)?;
    }
    match status.ttl_left_ms {
        Some(ms) => writeln!(
            out,
            "ttl left:   {}",
            humantime::format_duration(Duration::from_millis(ms))
        )?,
        None if h.ttl_ms == 0 => writeln!(
            out,
            "ttl:        no lease (freed when the holder exits or its connection ends)"
        )?,
        None => {}
    }
    if !h.version.is_empty() {
        writeln!(out, "dlock:      {}", shown(&h.version))?;
    }
    if let Some(session) = &status.session {
        writeln!(out, "session:    {}", shown(session))?;
    }
    Ok(())
}

/// `status` with each text of what the backend read back cut to
/// [`crate::logging::MAX_SHOWN`] characters, for JSON.
fn capped_status(status: &LockStatus) -> LockStatus {
    let holder = |h: &HolderStatus| HolderStatus {
        holder: crate::wording::capped_holder(&h.holder),
        ttl_left_ms: h.ttl_left_ms,
        session: h.session.as_deref().map(|s| capped(s).into_owned()),
    };
    LockStatus {
        name: capped(&status.name).into_owned(),
        held: status.held,
        holders: status.holders.iter().map(holder).collect(),
        waiters: status.waiters,
        queue: status.queue.iter().map(holder).collect(),
        last_token: status.last_token,
        waiting_here: status
            .waiting_here
            .iter()
            .map(|w| Waiter {
                user: capped(&w.user).into_owned(),
                command: capped(&w.command).into_owned(),
                since: capped(&w.since).into_owned(),
                ..w.clone()
            })
            .collect(),
    }
}

/// ` (3m 12s ago)` for an RFC 3339 time in the past.
fn ago(since: &str) -> String {
    let Ok(then) = humantime::parse_rfc3339(since) else {
        return String::new();
    };
    match SystemTime::now().duration_since(then) {
        Ok(d) => format!(
            " ({} ago)",
            humantime::format_duration(Duration::from_secs(d.as_secs()))
        ),
        Err(_) => String::new(),
    }
}

pub fn print_list(locks: &[LockStatus], json: bool) -> std::io::Result<()> {
    let mut out = out();
    if json {
        let locks: Vec<LockStatus> = locks.iter().map(capped_status).collect();
        serde_json::to_writer_pretty(&mut out, &locks)?;
        writeln!(out)?;
        return Ok(());
    }
    if locks.is_empty() {
        tracing::info!("no locks are held");
        return Ok(());
    }
    // Columns as wide as their widest entry on a terminal (a long or non-ASCII name).
    use crate::wording::pad;
    let widest = |min: usize, each: &dyn Fn(&LockStatus) -> Vec<String>| {
        locks
            .iter()
            .flat_map(each)
            .map(|s| crate::wording::display_width(&s))
            .fold(min, usize::max)
    };
    let name_width = widest(24, &|l| vec![shown(&l.name).into_owned()]);
    let host_width = widest(16, &|l| {
        l.holders
            .iter()
            .map(|h| shown(&h.holder.host).into_owned())
            .collect()
    });
    writeln!(
        out,
        "{} {:>8} {} {:<21} {:>7} {:<9} COMMAND",
        pad("NAME", name_width),
        "PID",
        pad("HOST", host_width),
        "SINCE",
        "WAITING",
        "MODE"
    )?;
    for lock in locks {
        for holder in &lock.holders {
            let h = &holder.holder;
            let waiting = lock.waiters.map_or("-".to_owned(), |w| w.to_string());
            let pid = if h.is_foreign() {
                "-".to_owned()
            } else {
                h.pid.to_string()
            };
            let command = match crate::wording::holder_kind(h) {
                Some(_) if h.is_foreign() => shown(&h.command).into_owned(),
                Some(kind) if kind.starts_with("gone") => {
                    format!("(gone) {}", shown(&h.command))
                }
                Some(_) => "(not dlock: flock(1) or another program)".to_owned(),
                None => shown(&h.command).into_owned(),
            };
            writeln!(
                out,
                "{} {:>8} {} {:<21} {:>7} {:<9} {}",
                pad(&shown(&lock.name), name_width),
                pid,
                pad(&shown(&h.host), host_width),
                shown(&h.since),
                waiting,
                h.mode.as_str(),
                command
            )?;
        }
    }
    Ok(())
}

pub fn print_check(check: &CheckReport, common: &Common, json: bool) -> std::io::Result<()> {
    let mut out = out();
    if json {
        serde_json::to_writer_pretty(&mut out, check)?;
        writeln!(out)?;
        return Ok(());
    }
    writeln!(out, "backend:    {} ({})", check.backend, check.location)?;
    writeln!(out, "version:    {}", shown(&check.version))?;
    writeln!(
        out,
        "round trip: {}",
        humantime::format_duration(Duration::from_micros(check.round_trip_us))
    )?;
    for (key, value) in &check.details {
        writeln!(out, "{:<11} {}", format!("{key}:"), shown(value))?;
    }
    writeln!(
        out,
        "settings:   url {}, prefix {}, ttl {}",
        common.display_url,
        common.prefix,
        humantime::format_duration(common.ttl)
    )?;
    for warning in &check.warnings {
        writeln!(out, "warning:    {}", shown(warning))?;
    }
    writeln!(out, "ok")?;
    Ok(())
}
