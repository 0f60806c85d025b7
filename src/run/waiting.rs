//! The waiting line (README: "Waiting"): while `acquire` is pending, say whom dlock waits for.
//!
//! At a terminal it appears within a second of starting to wait, names the holder (pid,
//! host, user, command, for how long) and the waiters ahead, is kept up to date in place
//! (`\r` and erase-line), and is finished with how long the wait took. Not at a terminal it
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
    /// Whether a line is on the terminal now / was ever printed.
    on_screen: Cell<bool>,
    printed: Cell<bool>,
}

impl Waiting {
    pub(super) fn new(no_wait: bool) -> Waiting {
        let mode = if no_wait || logging::quiet() {
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
            on_screen: Cell::new(false),
            printed: Cell::new(false),
        }
    }

    /// Report the wait until dropped (never completes).
    pub(super) async fn report<B: Backend>(&self, backend: &B, name: &LockName) {
        if self.mode != Mode::Silent {
            sleep_until(self.started + FIRST_LOOK).await;
            let every = match self.mode {
                Mode::Log(every) => every,
                Mode::Terminal | Mode::Silent => TERMINAL_EVERY,
            };
            // Bounded by the wait itself: this future is dropped when acquire ends.
            for _ in 0..u32::MAX {
                let asked = BootInstant::now();
                if let Ok(Ok(status)) =
                    tokio::time::timeout(STATUS_TIMEOUT, backend.status(name)).await
                {
                    if let Some(line) = waiting_line(name, &status) {
                        self.show(&line);
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

    fn show(&self, line: &str) {
        let line = format!("dlock: {}", printable(line));
        let mut err = std::io::stderr().lock();
        match self.mode {
            Mode::Terminal => {
                let line = fit(&line, terminal_width());
                let _ = write!(err, "\r\x1b[K{line}");
                let _ = err.flush();
                self.on_screen.set(true);
            }
            Mode::Log(_) => {
                let _ = writeln!(err, "{line}");
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

/// "waiting for 'NAME': held by pid … (…) for 4m12s, 2 waiting ahead" (`None` when the status
/// shows nobody in the way: the lock is being handed to us).
pub(super) fn waiting_line(name: &LockName, status: &LockStatus) -> Option<String> {
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
    let state = state.strip_prefix("is ").unwrap_or(&state);
    Some(format!("waiting for '{name}': {state}"))
}

/// `line` cut to fit in `width` columns (one left free so the cursor does not wrap). The
/// middle goes (the holder's command), not the end: how long the lock has been held and how
/// many wait ahead (` for 4m12s, 2 waiting ahead`) stay on screen.
fn fit(line: &str, width: usize) -> String {
    let room = width.saturating_sub(1).max(20);
    if wording::display_width(line) <= room {
        return line.to_owned();
    }
    let tail = line
        .rfind(" for ")
        .map(|at| &line[at..])
        .filter(|t| wording::display_width(t) < room / 2)
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
        }
    }

    #[test]
    fn the_line_names_the_holder_and_the_waiters_ahead() {
        let name = LockName::new("deploy-prod").unwrap();
        let me = std::process::id();
        let line = waiting_line(&name, &status_held_by(14028, &[1, 2, me, 3])).unwrap();
        assert_eq!(
            line,
            "waiting for 'deploy-prod': held by pid 14028 on ci-3 (deploy: ./deploy.sh), \
             2 waiting ahead"
        );
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
