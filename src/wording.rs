//! The words every backend shares, written once so that a lock reads the same on every
//! backend: who holds it ([`holder`]), why a run did not get it ([`not_acquired`],
//! [`gave_up`]), a server that did not answer within `--wait` ([`no_answer`]), and the
//! durations in them ([`short_duration`]); and (in `connection`) a connection that failed.
//!
//! A backend says *what* it saw (the holders, how many wait ahead) and calls these; it never
//! formats a holder itself. A new backend gets the same conflict line, `status` and `list`
//! for free (docs/guide.md: "Looking at locks").

use std::time::{Duration, SystemTime};

use crate::budget::{Wait, WaitBudget, MIN_ANSWER};
use crate::error::Error;
use crate::lock::{Holder, LockName, LockStatus};
use crate::logging::capped;

mod connection;

pub use self::connection::{
    connection_refused, endpoint_of, no_database, no_socket, no_tls_handshake, not_a, not_found_in,
    password_missing, password_refused, refused_in, user_in, Server,
};

/// One holder, for a message: `pid 14028 on ci-3 (deploy: ./deploy.sh) for 4m12s`. A holder
/// that is not a dlock is named for what it is: `etcdctl lock or another client (not dlock)`.
/// Each field is cut to [`crate::logging::MAX_SHOWN`] characters (the metadata may have been written
/// by anyone); the line is escaped where it is printed.
pub fn holder(h: &Holder) -> String {
    let h = &capped_holder(h);
    let held_for = held_for(&h.since)
        .map(|d| format!(" for {}", short_duration(d)))
        .unwrap_or_default();
    if h.is_foreign() {
        let what = h
            .command
            .strip_prefix("(foreign holder: ")
            .and_then(|c| c.strip_suffix(')'))
            .unwrap_or("another client");
        let host = if h.host.is_empty() {
            String::new()
        } else {
            format!(" on {}", h.host)
        };
        return format!("{what} (not dlock){host}{held_for}");
    }
    if h.version.is_empty() && h.host.is_empty() && h.command.is_empty() {
        return format!("pid {} on this host, a flock(1) holder (not dlock)", h.pid);
    }
    let gone = if is_gone(h) { ", gone" } else { "" };
    let host = if h.host.is_empty() { "?" } else { &h.host };
    let what = match (h.user.is_empty(), h.command.is_empty()) {
        (false, false) => format!(" ({}: {})", h.user, h.command),
        (true, false) => format!(" ({})", h.command),
        (false, true) => format!(" ({})", h.user),
        (true, true) => String::new(),
    };
    format!("pid {} on {host}{what}{held_for}{gone}", h.pid)
}

/// `h` with each of its texts cut to [`crate::logging::MAX_SHOWN`] characters ([`capped`]):
/// what dlock shows and records of a holder, whose metadata comes from a server or a lock
/// file that others may write.
pub fn capped_holder(h: &Holder) -> Holder {
    let cap = |text: &str| capped(text).into_owned();
    // Every field named: a new text field must be capped too.
    Holder {
        name: cap(&h.name),
        host: cap(&h.host),
        pid: h.pid,
        user: cap(&h.user),
        command: cap(&h.command),
        since: cap(&h.since),
        ttl_ms: h.ttl_ms,
        token: h.token,
        version: cap(&h.version),
        min_hold_ms: h.min_hold_ms,
        kept_until: cap(&h.kept_until),
        mode: h.mode,
        limit: h.limit,
    }
}

/// What a holder is when it is not a live dlock: not dlock at all (`etcdctl lock`, a
/// Curator client, a `flock(1)` on the lock file), or a dlock of this host whose process is
/// gone (SIGKILLed: its entry stays until its lease runs out).
pub fn holder_kind(h: &Holder) -> Option<String> {
    if h.is_foreign() {
        let what = h
            .command
            .strip_prefix("(foreign holder: ")
            .and_then(|c| c.strip_suffix(')'))
            .unwrap_or("another client");
        return Some(format!("not dlock: {what}"));
    }
    if h.version.is_empty() && h.host.is_empty() && h.command.is_empty() {
        // A kernel lock on the lock file without dlock's record in it.
        return Some("not dlock: a flock(1) holder or another program on this host".into());
    }
    if is_gone(h) {
        return Some(format!(
            "gone: no process {} on this host any more; the lock is freed when its lease runs \
             out, and dlock release --force may free it now",
            h.pid
        ));
    }
    None
}

/// A holder recorded by this host whose process no longer exists.
fn is_gone(h: &Holder) -> bool {
    let Ok(pid) = i32::try_from(h.pid) else {
        return false;
    };
    if pid <= 0 || h.version.is_empty() {
        return false;
    }
    let here = nix::unistd::gethostname()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    here == h.host
        && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            == Err(nix::errno::Errno::ESRCH)
}

/// ` by <holder>, <holder>` for a held lock, `""` when `holders` is empty.
pub fn held_by<'a>(holders: impl IntoIterator<Item = &'a Holder>) -> String {
    let who: Vec<String> = holders.into_iter().map(holder).collect();
    if who.is_empty() {
        String::new()
    } else {
        format!(" by {}", who.join(", "))
    }
}

impl LockStatus {
    /// " by pid N on host (user: command) for 4m12s, …" for messages about a held lock
    /// ("" when free): [`held_by`] of its holders.
    pub fn held_by(&self) -> String {
        held_by(self.holders.iter().map(|h| &h.holder))
    }
}

/// The state of a lock a run cannot have, from the queue ahead of it: "is held by …[, N
/// waiting ahead]", "is free, N waiting ahead" (the first waiter is taking it, or was killed
/// and its entry is about to go), or "was held a moment ago".
pub fn busy_state(holders: &[Holder], waiting_ahead: usize) -> String {
    let ahead = waiting_ahead_text(waiting_ahead);
    if holders.is_empty() {
        return if waiting_ahead > 0 {
            format!("is free{ahead}")
        } else {
            "was held a moment ago".into()
        };
    }
    format!("is held{}{ahead}", held_by(holders))
}

/// `, N waiting ahead` (or nothing for none).
pub fn waiting_ahead_text(n: usize) -> String {
    if n > 0 {
        format!(", {n} waiting ahead")
    } else {
        String::new()
    }
}

/// Why a run gave up, after the lock's state: `not waiting (--no-wait)` or `gave up after
/// waiting 5s (--wait)`.
pub fn gave_up(wait: Wait) -> String {
    match wait {
        Wait::No => "not waiting (--no-wait)".into(),
        Wait::For(_) => format!("gave up after waiting {} (--wait)", wait.describe()),
        Wait::Forever => "gave up".into(),
    }
}

/// The conflict line every backend reports when a run did not get the lock:
/// `lock 'NAME' <state>; <why it gave up>`, where `state` is [`busy_state`]'s (or a
/// backend's own, starting with a verb: `is held by 2 of --limit 2 …`).
pub fn not_acquired(name: &LockName, state: &str, wait: Wait) -> Error {
    Error::Busy(format!("lock '{name}' {state}; {}", gave_up(wait)))
}

/// `no answer from SERVER[ (WHAT)] within --wait 5s`: a server that did not answer (`what`:
/// to which request) in the time a run gave it, `given`. That time is named beside the wait
/// when it was longer (a short `--wait` still gives a server [`MIN_ANSWER`]: `within 2s
/// (--wait 1ms)`), with `--no-wait` (`within 5s (--no-wait)`), and alone without a wait.
pub fn no_answer_within(server: &str, what: Option<&str>, wait: Wait, given: Duration) -> String {
    let length = |d: Duration| humantime::format_duration(d).to_string();
    let within = match wait {
        Wait::For(asked) if given > asked => {
            format!("{} (--wait {})", length(given), length(asked))
        }
        Wait::For(asked) => format!("--wait {}", length(asked)),
        Wait::No => format!("{} (--no-wait)", length(given)),
        Wait::Forever => length(given),
    };
    let what = what.map_or_else(String::new, |what| format!(" ({what})"));
    format!("no answer from {server}{what} within {within}")
}

/// `no answer from SERVER within D`: a bound of dlock's own (connecting, one call), not
/// `--wait`, ran out before the server answered (69).
pub fn no_answer_in(server: &str, given: Duration) -> Error {
    Error::Unavailable(no_answer_within(server, None, Wait::Forever, given))
}

/// [`no_answer_within`] the server's time to answer of `budget` ([`WaitBudget::answer_by`]):
/// the server is unavailable (69).
pub fn no_answer(server: &str, what: Option<&str>, budget: &WaitBudget) -> Error {
    Error::Unavailable(no_answer_within(server, what, budget.wait(), MIN_ANSWER))
}

/// How long ago an RFC 3339 time was (`None` when it is not one, or in the future).
pub fn held_for(since: &str) -> Option<Duration> {
    let then = humantime::parse_rfc3339(since).ok()?;
    SystemTime::now().duration_since(then).ok()
}

/// A duration to the second in at most two units: `12s`, `4m12s`, `2h3m`, `3d4h`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, minutes, seconds) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    if days > 0 {
        format!("{days}d{hours}h")
    } else if hours > 0 {
        format!("{hours}h{minutes}m")
    } else if minutes > 0 {
        format!("{minutes}m{seconds}s")
    } else {
        format!("{seconds}s")
    }
}

/// A duration measured, for `status` and `check`: `0.3 ms`, `5.7 ms`, `290 ms`, `2.9 s`,
/// then as [`short_duration`] (`4m12s`) from a minute on. One form wherever dlock reports a
/// measured time, with the precision that matters at its size.
pub fn measured_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.1} ms")
    } else if ms < 1000.0 {
        format!("{ms:.0} ms")
    } else if d < Duration::from_secs(60) {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        short_duration(d)
    }
}

/// How many columns `text` takes on a terminal: 2 for the wide characters of East Asian
/// scripts and emoji, 0 for combining marks and zero-width characters, 1 for the rest (the
/// common cases; a terminal may differ on rare ones).
pub fn display_width(text: &str) -> usize {
    text.chars()
        .map(|c| match u32::from(c) {
            0x0300..=0x036F | 0x200B..=0x200F | 0x20D0..=0x20FF | 0xFE00..=0xFE0F => 0,
            0x1100..=0x115F
            | 0x2E80..=0x303E
            | 0x3041..=0x33FF
            | 0x3400..=0x4DBF
            | 0x4E00..=0x9FFF
            | 0xA000..=0xA4CF
            | 0xAC00..=0xD7A3
            | 0xF900..=0xFAFF
            | 0xFE30..=0xFE4F
            | 0xFF00..=0xFF60
            | 0xFFE0..=0xFFE6
            | 0x1F300..=0x1F64F
            | 0x1F900..=0x1F9FF
            | 0x20000..=0x3FFFD => 2,
            _ => 1,
        })
        .sum()
}

/// `text` followed by spaces up to `width` terminal columns (see [`display_width`]).
pub fn pad(text: &str, width: usize) -> String {
    let fill = width.saturating_sub(display_width(text));
    format!("{text}{}", " ".repeat(fill))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder_since(secs_ago: u64) -> Holder {
        let since = SystemTime::now() - Duration::from_secs(secs_ago);
        Holder {
            host: "ci-3".into(),
            pid: 14028,
            user: "deploy".into(),
            command: "./deploy.sh".into(),
            since: humantime::format_rfc3339_seconds(since).to_string(),
            version: "1.0.0".into(),
            ..Holder::default()
        }
    }

    #[test]
    fn a_holder_reads_as_in_the_readme() {
        assert_eq!(
            holder(&holder_since(252)),
            "pid 14028 on ci-3 (deploy: ./deploy.sh) for 4m12s"
        );
    }

    #[test]
    fn a_foreign_holder_is_named_as_such() {
        let foreign = Holder {
            command: "(foreign holder: etcdctl lock or another client)".into(),
            ..Holder::default()
        };
        let text = holder(&foreign);
        assert_eq!(text, "etcdctl lock or another client (not dlock)");
        assert!(!text.contains("pid 0"), "{text}");
    }

    #[test]
    fn the_conflict_line_has_one_shape() {
        let name = LockName::new("job").unwrap();
        let undated = Holder {
            since: String::new(),
            ..holder_since(0)
        };
        let state = busy_state(&[undated], 2);
        let Error::Busy(line) = not_acquired(&name, &state, Wait::No) else {
            panic!("not Busy");
        };
        assert_eq!(
            line,
            "lock 'job' is held by pid 14028 on ci-3 (deploy: ./deploy.sh), 2 waiting ahead; \
             not waiting (--no-wait)"
        );
    }

    #[test]
    fn a_server_that_did_not_answer_within_the_wait() {
        let ms = Duration::from_millis;
        let server = "etcd://127.0.0.1:2379";
        let no_answer_text = |what, wait| match no_answer(server, what, &WaitBudget::start(wait)) {
            Error::Unavailable(text) => text,
            other => panic!("not Unavailable: {other:?}"),
        };
        assert_eq!(
            no_answer_text(None, Wait::For(ms(2500))),
            "no answer from etcd://127.0.0.1:2379 within --wait 2s 500ms"
        );
        assert_eq!(
            no_answer_text(None, Wait::For(MIN_ANSWER)),
            "no answer from etcd://127.0.0.1:2379 within --wait 2s"
        );
        assert_eq!(
            no_answer_text(Some("LISTEN"), Wait::For(ms(1))),
            "no answer from etcd://127.0.0.1:2379 (LISTEN) within 2s (--wait 1ms)"
        );
        assert_eq!(
            no_answer_within("redis://h:1", None, Wait::For(ms(1)), ms(1)),
            "no answer from redis://h:1 within --wait 1ms"
        );
        assert_eq!(
            no_answer_within("redis://h:1", None, Wait::No, Duration::from_secs(5)),
            "no answer from redis://h:1 within 5s (--no-wait)"
        );
        assert_eq!(
            no_answer_within("zk://h:1", None, Wait::Forever, Duration::from_secs(5)),
            "no answer from zk://h:1 within 5s"
        );
    }

    #[test]
    fn why_a_run_gave_up() {
        assert_eq!(gave_up(Wait::No), "not waiting (--no-wait)");
        assert_eq!(
            gave_up(Wait::For(Duration::from_millis(300))),
            "gave up after waiting 300ms (--wait)"
        );
    }

    #[test]
    fn widths_on_a_terminal() {
        assert_eq!(display_width("deploy"), 6);
        assert_eq!(display_width("déploiement"), 11);
        assert_eq!(display_width("e\u{301}"), 1);
        assert_eq!(display_width("発行"), 4);
        assert_eq!(pad("発行", 6), "発行  ");
    }

    #[test]
    fn measured_durations_read_alike_at_every_size() {
        let us = Duration::from_micros;
        assert_eq!(measured_duration(us(290)), "0.3 ms");
        assert_eq!(measured_duration(us(5_676)), "5.7 ms");
        assert_eq!(measured_duration(us(290_400)), "290 ms");
        assert_eq!(measured_duration(us(2_940_000)), "2.9 s");
        assert_eq!(measured_duration(Duration::from_secs(252)), "4m12s");
    }

    #[test]
    fn short_durations() {
        assert_eq!(short_duration(Duration::from_secs(0)), "0s");
        assert_eq!(short_duration(Duration::from_secs(59)), "59s");
        assert_eq!(short_duration(Duration::from_secs(3 * 3600 + 125)), "3h2m");
        assert_eq!(short_duration(Duration::from_secs(86_400 + 7200)), "1d2h");
    }
}
