//! The waiting line (README: "Waiting"): while `acquire` is pending, say whom dlock waits for.
//!
//! At a terminal it appears within a second of starting to wait, names the holder (pid,
//! host, user, command, for how long) and the waiters ahead, says how long this run has
//! waited and when it gives up (`--wait`), is kept up to date in place (`\r` and
//! erase-line), and is finished with how long the wait took. A line too wide for the
//! terminal loses the end of the holder's command first, the least telling part. Not at a terminal it
//! is printed as whole lines, once and at intervals, in a CI job (`CI` set, as CI services
//! set it, and not `false` or `0`: a step that waits must say what for) and with `-v`;
//! otherwise it is silent (cron mails every byte on stderr). `-q` silences it everywhere.
//!
//! It asks `Backend::status` at a modest interval, so it works the same on every backend
//! without knowing any; the backends open a connection of their own for `status`, so the
//! acquire's connection is never shared. It only reports: a failed `status` is skipped.

use std::cell::Cell;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use crate::budget::WaitBudget;
use crate::clock::{sleep_until, BootInstant};
use crate::lock::{Backend, LockName, LockStatus};
use crate::logging::{self, printable};
use crate::wording;

/// A wait shorter than this says nothing (the lock was free, or freed at once).
const FIRST_LOOK: Duration = Duration::from_millis(300);
/// How often a terminal's line is refreshed.
const TERMINAL_EVERY: Duration = Duration::from_secs(1);
/// How often `-v` repeats the line when stderr is not a terminal.
const LOG_EVERY: Duration = Duration::from_secs(60);
/// How often the line is repeated in a CI log, where a step that seems stuck is being watched.
const CI_EVERY: Duration = Duration::from_secs(30);
/// A `status` that takes longer is skipped this round.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);
/// The columns of the holder's command a line cut for the terminal keeps at least (its
/// program, as a rule), before anything else is cut.
const MIN_COMMAND: usize = 12;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Silent,
    /// Updated in place on a terminal.
    Terminal,
    /// Whole lines, at intervals (CI or `-v`, not a terminal).
    Log(Duration),
}

/// Whether the environment says this is a CI job: `CI` set and not empty, `false` or `0`.
fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|value| {
        let value = value.to_string_lossy();
        !(value.is_empty() || value == "0" || value.eq_ignore_ascii_case("false"))
    })
}

/// One wait's reporter: [`Waiting::report`] runs beside `acquire`, [`Waiting::finish`] after.
pub(super) struct Waiting {
    mode: Mode,
    started: BootInstant,
    /// When `--wait` gives up (none: it never does).
    gives_up: Option<BootInstant>,
    /// Whether a line is on the terminal now / was ever printed.
    on_screen: Cell<bool>,
    printed: Cell<bool>,
}

impl Waiting {
    pub(super) fn new(budget: &WaitBudget) -> Waiting {
        let mode = if budget.is_no_wait() || logging::quiet() {
            Mode::Silent
        } else if std::io::stderr().is_terminal() {
            Mode::Terminal
        } else if in_ci() {
            Mode::Log(CI_EVERY)
        } else if logging::verbose() {
            Mode::Log(LOG_EVERY)
        } else {
            Mode::Silent
        };
        Waiting {
            mode,
            started: BootInstant::now(),
            gives_up: budget.deadline(),
            on_screen: Cell::new(false),
            printed: Cell::new(false),
        }
    }

    /// Report the wait until dropped (never completes). With several `names` (`--also`), the
    /// line is about the first of them held by someone else: the one being waited for, as
    /// those taken already are held by this process.
    pub(super) async fn report<'a, B: Backend>(
        &self,
        backend: &B,
        names: impl Iterator<Item = &'a LockName> + Clone,
    ) {
        if self.mode != Mode::Silent {
            sleep_until(self.started + FIRST_LOOK).await;
            let every = match self.mode {
                Mode::Log(every) => every,
                Mode::Terminal | Mode::Silent => TERMINAL_EVERY,
            };
            // Bounded by the wait itself: this future is dropped when acquire ends.
            for _ in 0..u32::MAX {
                let asked = BootInstant::now();
                for name in names.clone() {
                    let Ok(Ok(status)) =
                        tokio::time::timeout(STATUS_TIMEOUT, backend.status(name)).await
                    else {
                        continue;
                    };
                    if let Some(line) = waiting_line(name, &status) {
                        let now = BootInstant::now();
                        let waited = now.saturating_since(self.started);
                        let left = self.gives_up.map(|at| at.saturating_since(now));
                        self.show(&line.with_time(waited, left));
                        break;
                    }
                }
                // Until a first line is out, look again soon: it must come within a second
                // or so of the wait starting, in a log as on a terminal.
                let pause = if self.printed.get() {
                    every
                } else {
                    TERMINAL_EVERY
                };
                sleep_until(asked + pause).await;
            }
        }
        std::future::pending::<()>().await;
    }

    fn show(&self, line: &Line) {
        let mut err = std::io::stderr().lock();
        match self.mode {
            Mode::Terminal => {
                let line = line.fit(terminal_width());
                let _ = write!(err, "\r\x1b[K{line}");
                let _ = err.flush();
                self.on_screen.set(true);
            }
            Mode::Log(_) => {
                let _ = writeln!(err, "{}", line.whole());
            }
            Mode::Silent => return,
        }
        self.printed.set(true);
    }

    /// The wait is over: finish the line with how long it took (`acquired`), or clear it.
    /// Returns whether the "acquired … after waiting" line was printed.
    pub(super) fn finish(&self, name: &LockName, acquired: bool) -> bool {
        if !self.printed.get() {
            return false;
        }
        let waited = wording::short_duration(BootInstant::now().saturating_since(self.started));
        let mut err = std::io::stderr().lock();
        if self.on_screen.get() {
            let _ = write!(err, "\r\x1b[K");
            self.on_screen.set(false);
        }
        if acquired {
            let _ = writeln!(
                err,
                "dlock: acquired '{}' after waiting {waited}",
                printable(name.as_str())
            );
        }
        let _ = err.flush();
        acquired
    }
}

/// The waiting line in parts, each escaped for a terminal: the first holder's command
/// apart, so that a line cut to fit loses it first.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Line {
    /// `dlock: waiting for 'NAME': held by pid N on HOST (USER: `, or all but `after` when
    /// there is no command.
    before: String,
    command: String,
    after: String,
}

impl Line {
    /// `state` ("held by …") with the byte range of the holder's command in it.
    fn new(name: &LockName, state: &str, command: Option<(usize, usize)>) -> Line {
        let (start, end) = command.unwrap_or((state.len(), state.len()));
        Line {
            before: format!(
                "dlock: {}",
                printable(&format!("waiting for '{name}': {}", &state[..start]))
            ),
            command: printable(&state[start..end]).into_owned(),
            after: printable(&state[end..]).into_owned(),
        }
    }

    /// The line with `; waited 40s, gives up in 9m20s` (`left`: what is left of `--wait`,
    /// none without one) at its end.
    fn with_time(&self, waited: Duration, left: Option<Duration>) -> Line {
        let gives_up = left
            .map(|left| format!(", gives up in {}", wording::short_duration(left)))
            .unwrap_or_default();
        Line {
            after: format!(
                "{}; waited {}{gives_up}",
                self.after,
                wording::short_duration(waited)
            ),
            before: self.before.clone(),
            command: self.command.clone(),
        }
    }

    fn whole(&self) -> String {
        self.shown(&self.command)
    }

    /// The line with `command` for the holder's.
    fn shown(&self, command: &str) -> String {
        format!("{}{command}{}", self.before, self.after)
    }

    /// The line cut to fit in `width` columns, losing the least telling parts first: the end
    /// of the holder's command (down to [`MIN_COMMAND`] columns, its program as a rule), the
    /// rest of the command, then the middle ([`fit`]). The lock, who holds it, for how long,
    /// how many wait ahead and how long this run has waited and will wait stay.
    fn fit(&self, width: usize) -> String {
        let room = width.saturating_sub(1).max(20);
        let whole = self.whole();
        if wording::display_width(&whole) <= room {
            return whole;
        }
        let keep = room.saturating_sub(wording::display_width(&self.shown("")));
        if keep >= MIN_COMMAND.min(wording::display_width(&self.command)) {
            return self.shown(&cut_to(&self.command, keep));
        }
        let without = if self.command.is_empty() { "" } else { "…" };
        fit(&self.shown(without), width)
    }
}

/// `text` as it fits in `columns` (with `…` when cut).
fn cut_to(text: &str, columns: usize) -> String {
    if wording::display_width(text) <= columns {
        return text.to_owned();
    }
    let mut cut = String::new();
    let mut used = 1;
    for c in text.chars() {
        let w = wording::display_width(c.encode_utf8(&mut [0; 4]));
        if used + w > columns {
            break;
        }
        used += w;
        cut.push(c);
    }
    cut.push('…');
    cut
}

/// "waiting for 'NAME': held by pid … (…) for 4m12s, 2 waiting ahead" (`None` when the status
/// shows nobody in the way: the lock is being handed to us).
pub(super) fn waiting_line(name: &LockName, status: &LockStatus) -> Option<Line> {
    let me = std::process::id();
    let ahead = if status.queue.is_empty() {
        // A count that includes us (we are blocked on it too).
        status.waiters.map_or(0, |n| n.saturating_sub(1)) as usize
    } else {
        status
            .queue
            .iter()
            .take_while(|w| w.holder.pid != me)
            .count()
    };
    let holders: Vec<_> = status
        .holders
        .iter()
        .map(|h| h.holder.clone())
        .filter(|h| h.pid != me || h.is_foreign())
        .collect();
    if holders.is_empty() && ahead == 0 {
        return None;
    }
    let state = wording::busy_state(&holders, ahead);
    let line = state.strip_prefix("is ").unwrap_or(&state);
    // Where the first holder's command is in the line: after its "pid N on HOST (USER: ".
    let command = holders.first().and_then(|h| {
        let h = wording::capped_holder(h);
        if h.command.is_empty() || h.is_foreign() {
            return None;
        }
        let host = if h.host.is_empty() { "?" } else { &h.host };
        let who = format!("pid {} on {host} (", h.pid);
        let from = line.find(&who)? + who.len();
        let user = if h.user.is_empty() {
            String::new()
        } else {
            format!("{}: ", h.user)
        };
        let start = from + line[from..].strip_prefix(&user).map(|_| user.len())?;
        line[start..]
            .starts_with(&h.command)
            .then_some((start, start + h.command.len()))
    });
    Some(Line::new(name, line, command))
}

/// The columns [`fit`] leaves at least before the end it keeps.
const TAIL_ROOM: usize = 16;

/// `line` cut to fit in `width` columns (one left free so the cursor does not wrap). The
/// middle goes (the holder's command), not the end: how long the lock has been held, how
/// many wait ahead and how long this run waits (` for 4m12s, 2 waiting ahead; waited 40s`)
/// stay on screen.
fn fit(line: &str, width: usize) -> String {
    let room = width.saturating_sub(1).max(20);
    if wording::display_width(line) <= room {
        return line.to_owned();
    }
    let tail = line
        .rfind(" for ")
        .map(|at| &line[at..])
        .filter(|t| wording::display_width(t) + TAIL_ROOM < room)
        .unwrap_or("");
    let mut cut = String::new();
    let mut used = wording::display_width(tail) + 1;
    for c in line.chars() {
        let w = wording::display_width(c.encode_utf8(&mut [0; 4]));
        if used + w > room {
            break;
        }
        used += w;
        cut.push(c);
    }
    cut.push('…');
    cut.push_str(tail);
    cut
}

/// The terminal's width in columns (80 when it cannot tell).
fn terminal_width() -> usize {
    // SAFETY: TIOCGWINSZ writes one `winsize` into the struct passed; stderr is fd 2.
    let mut size: libc::winsize = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::ioctl(2, libc::TIOCGWINSZ, &mut size) } == 0;
    if ok && size.ws_col > 0 {
        usize::from(size.ws_col)
    } else {
        80
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::{Holder, HolderStatus};

    fn status_held_by(pid: u32, queue: &[u32]) -> LockStatus {
        let entry = |pid: u32| HolderStatus {
            holder: Holder {
                pid,
                host: "ci-3".into(),
                user: "deploy".into(),
                command: "./deploy.sh".into(),
                version: "1".into(),
                ..Holder::default()
            },
            ttl_left_ms: None,
            session: None,
        };
        LockStatus {
            name: "deploy-prod".into(),
            held: true,
            holders: vec![entry(pid)],
            waiters: Some(queue.len() as u64),
            queue: queue.iter().map(|&p| entry(p)).collect(),
            last_token: None,
            waiting_here: Vec::new(),
            location: None,
        }
    }

    #[test]
    fn the_line_names_the_holder_and_the_waiters_ahead() {
        let name = LockName::new("deploy-prod").unwrap();
        let me = std::process::id();
        let line = waiting_line(&name, &status_held_by(14028, &[1, 2, me, 3])).unwrap();
        assert_eq!(
            line.whole(),
            "dlock: waiting for 'deploy-prod': held by pid 14028 on ci-3 (deploy: ./deploy.sh), \
             2 waiting ahead"
        );
    }

    /// A line as a terminal would get it: held 4m12s, behind 2, waited 40s of `--wait 10m`.
    fn long_line(command: &str) -> Line {
        let name = LockName::new("deploy-prod").unwrap();
        let me = std::process::id();
        let mut status = status_held_by(14028, &[1, 2, me]);
        status.holders[0].holder.command = command.into();
        status.holders[0].holder.since = humantime::format_rfc3339_seconds(
            std::time::SystemTime::now() - Duration::from_secs(252),
        )
        .to_string();
        waiting_line(&name, &status)
            .unwrap()
            .with_time(Duration::from_secs(40), Some(Duration::from_secs(560)))
    }

    #[test]
    fn the_line_says_how_long_it_waited_and_when_it_gives_up() {
        let line = long_line("./deploy.sh");
        assert_eq!(
            line.whole(),
            "dlock: waiting for 'deploy-prod': held by pid 14028 on ci-3 (deploy: ./deploy.sh) \
             for 4m12s, 2 waiting ahead; waited 40s, gives up in 9m20s"
        );
        let name = LockName::new("deploy-prod").unwrap();
        let forever = waiting_line(&name, &status_held_by(14028, &[]))
            .unwrap()
            .with_time(Duration::from_secs(40), None);
        assert!(forever
            .whole()
            .ends_with("(deploy: ./deploy.sh); waited 40s"));
    }

    #[test]
    fn a_line_too_wide_loses_the_end_of_the_holders_command_first() {
        let line = long_line("./deploy.sh --all --verbose --environment production --retries 3");
        let tail = ") for 4m12s, 2 waiting ahead; waited 40s, gives up in 9m20s";
        let cut = line.fit(170);
        assert_eq!(wording::display_width(&cut), 169, "{cut}");
        assert!(
            cut.starts_with(
                "dlock: waiting for 'deploy-prod': held by pid 14028 on ci-3 \
                 (deploy: ./deploy.sh --all"
            ),
            "{cut}"
        );
        assert!(cut.ends_with(&format!("…{tail}")), "{cut}");
        // Narrower: the holder's program stays as long as it can.
        let cut = line.fit(146);
        assert!(
            cut.starts_with(
                "dlock: waiting for 'deploy-prod': held by pid 14028 on ci-3 (deploy: ./deploy.sh"
            ),
            "{cut}"
        );
        assert!(cut.ends_with(&format!("…{tail}")), "{cut}");
        assert_eq!(wording::display_width(&cut), 145, "{cut}");
        // Narrower still: the command, then the middle; the times stay.
        for width in [80, 100, 120] {
            let cut = line.fit(width);
            assert!(cut.ends_with("waited 40s, gives up in 9m20s"), "{cut}");
            assert!(wording::display_width(&cut) < width, "{cut}");
        }
        // A control character in the command is escaped and counted as shown.
        let line = long_line("./deploy.sh\x1b[2J --all --verbose --environment production");
        assert!(!line.fit(90).contains('\x1b'), "{:?}", line.fit(90));
    }

    #[test]
    fn long_lines_fit_the_terminal() {
        assert_eq!(fit("abcdef", 80), "abcdef");
        let cut = fit(&"x".repeat(100), 40);
        assert_eq!(cut.chars().count(), 39);
        assert!(cut.ends_with('…'));
    }

    #[test]
    fn a_shortened_line_keeps_how_long_and_how_many_ahead() {
        let line = "dlock: waiting for 'deploy-prod': held by pid 14028 on ci-3 (deploy: \
                    ./deploy.sh --all --verbose --environment production) for 4m12s, 2 waiting ahead";
        let cut = fit(line, 80);
        assert_eq!(cut.chars().count(), 79, "{cut}");
        assert!(cut.ends_with("… for 4m12s, 2 waiting ahead"), "{cut}");
        assert!(
            cut.starts_with("dlock: waiting for 'deploy-prod': held by"),
            "{cut}"
        );
        // Wide characters count twice.
        let wide = fit(
            &format!("dlock: waiting for '{}' for 3s", "発".repeat(40)),
            40,
        );
        let columns = wording::display_width(&wide);
        assert!((38..=39).contains(&columns), "{columns}: {wide}");
        assert!(wide.ends_with("… for 3s"), "{wide}");
    }
}
