//! What `status`, `list` and `check` (`check`) print, for humans and as JSON, and how
//! clap's usage errors are reported (`usage`: one `dlock:` line, exit 64).
//!
//! What a server or a lock file says of a lock (a holder's host, user, command line, …) may
//! have been written by anyone: each text is cut to [`crate::logging::MAX_SHOWN`] characters,
//! in JSON as in text, and escaped in text ([`shown`]).

use std::io::Write;
use std::time::{Duration, SystemTime};

use crate::lock::{HolderStatus, LockStatus, Waiter};
use crate::logging::{capped, shown};

mod check;
mod usage;

pub use self::check::print_check;
pub use self::usage::clap_error;

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
    // Where the lock lives where that depends on who asks (a user's own lock directory).
    let whose = status
        .location
        .as_deref()
        .map(|l| format!(" ({})", shown(l)))
        .unwrap_or_default();
    // A semaphore (`--limit N`) says how many of its slots are taken.
    let limit = status
        .holders
        .iter()
        .map(|h| h.holder.limit)
        .max()
        .unwrap_or(0);
    let slots = if limit > 1 {
        format!(
            " ({} of {limit} slots, --limit {limit})",
            status.holders.len()
        )
    } else {
        String::new()
    };
    if status.holders.len() > 1 {
        write_holders(&mut out, &status.holders, &format!("{slots}{whose}"))?;
    } else {
        writeln!(
            out,
            "state:      {}{slots}{whose}",
            if status.held { "held" } else { "free" }
        )?;
        for holder in &status.holders {
            write_holder(&mut out, holder)?;
        }
    }
    if let Some(waiters) = status.waiters {
        writeln!(out, "waiters:    {waiters}")?;
    }
    // A waiter of this host that the server lists in its queue is shown there alone, as
    // this host sees it (user, how long, its command line).
    let here = nix::unistd::gethostname()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let of_this_host = |h: &crate::lock::Holder| {
        (h.host == here)
            .then(|| status.waiting_here.iter().find(|w| w.pid == h.pid))
            .flatten()
    };
    for (position, waiter) in status.queue.iter().enumerate() {
        let h = &waiter.holder;
        if let Some(local) = of_this_host(h) {
            writeln!(out, "  {}. {}", position + 1, waiter_line(local))?;
            continue;
        }
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
    let waiting_here: Vec<&Waiter> = status
        .waiting_here
        .iter()
        .filter(|w| {
            !status
                .queue
                .iter()
                .any(|q| of_this_host(&q.holder) == Some(*w))
        })
        .collect();
    if !waiting_here.is_empty() {
        writeln!(out, "on this host, longest-waiting first:")?;
    }
    for waiter in waiting_here {
        writeln!(out, "  {}", waiter_line(waiter))?;
    }
    if !status.held {
        if let Some(token) = status.last_token {
            writeln!(out, "last token: {token}")?;
        }
    }
    Ok(())
}

/// A waiter of this host: `pid N, user U, waiting since T (3s) at the server: COMMAND`.
fn waiter_line(waiter: &Waiter) -> String {
    let user = if waiter.user.is_empty() {
        String::new()
    } else {
        format!(", user {}", shown(&waiter.user))
    };
    format!(
        "pid {}{user}, waiting since {} ({}) {}: {}",
        waiter.pid,
        shown(&waiter.since),
        humantime::format_duration(Duration::from_secs(waiter.waited_ms / 1000)),
        match waiter.stage {
            "host queue" => "in this host's queue",
            "server" => "at the server",
            _ => "for the lock file",
        },
        shown(&waiter.command)
    )
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
    writeln!(out, "ttl:        {}", lease_text(status, true))?;
    if !h.version.is_empty() {
        writeln!(out, "dlock:      {}", shown(&h.version))?;
    }
    if let Some(session) = &status.session {
        writeln!(out, "session:    {}", shown(session))?;
    }
    Ok(())
}

/// Several holders (shared, or `--limit N`): one line each, the lock's mode and lease once.
fn write_holders(
    out: &mut impl Write,
    holders: &[HolderStatus],
    whose: &str,
) -> std::io::Result<()> {
    writeln!(out, "state:      held by {} holders{whose}", holders.len())?;
    let mut modes: Vec<&str> = holders.iter().map(|h| h.holder.mode.as_str()).collect();
    modes.dedup();
    writeln!(out, "mode:       {}", modes.join(", "))?;
    for (i, status) in holders.iter().enumerate() {
        let h = &status.holder;
        let label = if i == 0 { "holders:   " } else { "           " };
        let who = if h.is_foreign() {
            crate::wording::holder_kind(h).unwrap_or_default()
        } else {
            let host = if h.host.is_empty() { "?" } else { &h.host };
            let user = if h.user.is_empty() {
                String::new()
            } else {
                format!(", user {}", h.user)
            };
            format!("pid {} on {host}{user}", h.pid)
        };
        let mut line = who;
        if !h.since.is_empty() {
            line.push_str(&format!(", since {}{}", h.since, ago(&h.since)));
        }
        if h.token > 0 {
            line.push_str(&format!(", token {}", h.token));
        }
        if let Some(ms) = status.ttl_left_ms {
            let left = crate::wording::measured_duration(Duration::from_millis(ms));
            line.push_str(&format!(", {left} left"));
        }
        if !h.kept_until.is_empty() {
            line.push_str(&format!(", kept until {} (--min-hold)", h.kept_until));
        }
        if !h.command.is_empty() && !h.is_foreign() {
            line.push_str(&format!(": {}", h.command));
        }
        writeln!(out, "{label} {}", shown(&line))?;
        match crate::wording::holder_kind(h) {
            Some(kind) if !h.is_foreign() => writeln!(out, "              {}", shown(&kind))?,
            _ => {}
        }
        if let Some(session) = &status.session {
            writeln!(out, "              session {}", shown(session))?;
        }
    }
    if let Some(first) = holders.first() {
        writeln!(out, "ttl:        {}", lease_text(first, false))?;
    }
    Ok(())
}

/// What `status` says of a holder's lease, the same on every backend: its length and what is
/// left of it (`left`: where the server tells), or why there is none.
fn lease_text(status: &HolderStatus, left: bool) -> String {
    let length = (status.holder.ttl_ms > 0).then(|| {
        humantime::format_duration(Duration::from_millis(status.holder.ttl_ms)).to_string()
    });
    match (length, status.ttl_left_ms.filter(|_| left)) {
        (Some(length), Some(ms)) => format!(
            "{length} lease, {} left",
            crate::wording::measured_duration(Duration::from_millis(ms))
        ),
        (None, Some(ms)) => format!(
            "{} left",
            crate::wording::measured_duration(Duration::from_millis(ms))
        ),
        (Some(length), None) if status.ttl_left_ms.is_some() => format!("{length} lease"),
        (Some(length), None) => format!(
            "{length} lease, kept by the holder's session (the server does not say how much \
             is left)"
        ),
        (None, None) => "none: freed when the holder exits or its connection ends".into(),
    }
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
        location: status.location.as_deref().map(|l| capped(l).into_owned()),
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
        writeln!(out, "no locks are held")?;
        return Ok(());
    }
    // Columns as wide as their widest entry on a terminal (a long or non-ASCII name).
    use crate::wording::pad;
    let rows: Vec<[String; 9]> = locks
        .iter()
        .flat_map(|lock| lock.holders.iter().map(move |h| list_row(lock, h)))
        .collect();
    let header = [
        "NAME", "PID", "HOST", "USER", "HELD", "WAITING", "MODE", "TOKEN", "COMMAND",
    ]
    .map(str::to_owned);
    // Numbers to the right, texts to the left; the last column as it is.
    let right = [false, true, false, false, true, true, false, true, false];
    let widths: Vec<usize> = (0..header.len())
        .map(|c| {
            std::iter::once(&header)
                .chain(&rows)
                .map(|r| crate::wording::display_width(&r[c]))
                .max()
                .unwrap_or(0)
        })
        .collect();
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else if right[c] {
                let fill = widths[c].saturating_sub(crate::wording::display_width(cell));
                line.push_str(&format!("{}{cell} ", " ".repeat(fill)));
            } else {
                line.push_str(&format!("{} ", pad(cell, widths[c])));
            }
        }
        writeln!(out, "{}", line.trim_end())?;
    }
    Ok(())
}

/// One holder of `lock` as `list` shows it, each text escaped.
fn list_row(lock: &LockStatus, holder: &HolderStatus) -> [String; 9] {
    let h = &holder.holder;
    let or_dash = |text: &str| {
        if text.is_empty() {
            "-".to_owned()
        } else {
            shown(text).into_owned()
        }
    };
    let pid = if h.is_foreign() {
        "-".to_owned()
    } else {
        h.pid.to_string()
    };
    let held = humantime::parse_rfc3339(&h.since)
        .ok()
        .and_then(|then| SystemTime::now().duration_since(then).ok())
        .map_or("-".to_owned(), crate::wording::short_duration);
    let command = match crate::wording::holder_kind(h) {
        Some(_) if h.is_foreign() => shown(&h.command).into_owned(),
        Some(kind) if kind.starts_with("gone") => format!("(gone) {}", shown(&h.command)),
        Some(_) => "(not dlock: flock(1) or another program)".to_owned(),
        None => shown(&h.command).into_owned(),
    };
    [
        shown(&lock.name).into_owned(),
        pid,
        or_dash(&h.host),
        or_dash(&h.user),
        held,
        lock.waiters.map_or("-".to_owned(), |w| w.to_string()),
        h.mode.as_str().to_owned(),
        if h.token > 0 {
            h.token.to_string()
        } else {
            "-".to_owned()
        },
        command,
    ]
}
