//! The exit statuses of dlock (README: "Exit status"), in one place.
//!
//! Every subcommand ends with an [`Outcome`]; [`Outcome::status`] alone turns it into the
//! status dlock exits with. The command's own status is passed through unchanged
//! ([`from_child`]); everything dlock causes itself has one code from [`Code`].
//! The table shown by `--help` and the man pages ([`TABLE`]) is rendered from [`Code`], and the
//! README's is checked against it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

use crate::text::{put, put_number};

/// A status that dlock itself chooses (sysexits(3) where one fits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    /// The lock was not acquired: held and `--no-wait`, or `--wait` elapsed (EX_TEMPFAIL).
    /// Overridable with `--conflict-exit-code`.
    NotAcquired,
    /// The lock was lost while the command ran and dlock stopped the command.
    Lost,
    /// Bad flag, name, duration or URL (EX_USAGE).
    Usage,
    /// Backend unreachable, DNS failure, timeout, wrong protocol (EX_UNAVAILABLE).
    Unavailable,
    /// A bug in dlock (EX_SOFTWARE). Never a panic's 101.
    Internal,
    /// Cannot create the lock file or its directory (EX_CANTCREAT).
    CantCreate,
    /// Authentication or permission refused (EX_NOPERM).
    NoPermission,
    /// Bad configuration file, TLS set-up, refusing a replica/standby/pooler (EX_CONFIG).
    Config,
    /// The command exists but cannot be executed.
    NotExecutable,
    /// The command was not found.
    NotFound,
}

impl Code {
    /// Every code, in the order the table lists them.
    pub const ALL: [Code; 10] = [
        Code::NotAcquired,
        Code::Lost,
        Code::Usage,
        Code::Unavailable,
        Code::Internal,
        Code::CantCreate,
        Code::NoPermission,
        Code::Config,
        Code::NotExecutable,
        Code::NotFound,
    ];

    /// What the status means, as the exit-status table says it.
    pub const fn meaning(self) -> &'static str {
        match self {
            Code::NotAcquired => {
                "the lock was not acquired (held and --no-wait, or --wait elapsed); see -E"
            }
            Code::Lost => "the lock was lost while the command ran; dlock stopped the command",
            Code::Usage => "usage error: bad flag, name, duration or URL",
            Code::Unavailable => {
                "backend unreachable, DNS failure, connect/response timeout, wrong protocol"
            }
            Code::Internal => "internal error in dlock",
            Code::CantCreate => "cannot create the lock file or directory",
            Code::NoPermission => "authentication or permission refused",
            Code::Config => {
                "configuration error: bad config file, TLS set-up, replica/standby/pooler refused"
            }
            Code::NotExecutable => "the command is not executable",
            Code::NotFound => "the command was not found",
        }
    }

    pub const fn value(self) -> u8 {
        match self {
            Code::NotAcquired => 75,
            Code::Lost => 124,
            Code::Usage => 64,
            Code::Unavailable => 69,
            Code::Internal => 70,
            Code::CantCreate => 73,
            Code::NoPermission => 77,
            Code::Config => 78,
            Code::NotExecutable => 126,
            Code::NotFound => 127,
        }
    }
}

/// The status for a command that ended with `status`: its exit code, or 128 + the signal
/// that killed it (as shells report it).
pub fn from_child(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        // An exit code is 0..=255 on Unix; the mask keeps the conversion total.
        return (code & 0xff) as u8;
    }
    match status.signal() {
        Some(signal) => signal_status(signal),
        None => Code::Internal.value(),
    }
}

/// 128 + signal number, saturating at 255.
pub fn signal_status(signal: i32) -> u8 {
    u8::try_from(128 + signal.clamp(0, 127)).unwrap_or(u8::MAX)
}

/// How a subcommand ended; [`Outcome::status`] is the status dlock exits with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Done: `status` found the lock held, `release --force` released it; `list`, `check`.
    Done,
    /// `status` found the lock free; `release --force` found nothing to release.
    Nothing,
    /// The command ran and ended with this status ([`from_child`]: 128+S for signal S).
    Command(u8),
    /// dlock got this signal while waiting for the lock, or while `--min-hold` kept it.
    Signalled(i32),
    /// The lock was not acquired: the status `--conflict-exit-code` chose (75 by default).
    NotAcquired(u8),
    /// The lock was lost while the command ran, and dlock stopped the command.
    Lost,
    /// An error of this class ([`crate::error::code_of`]).
    Failed(Code),
}

impl Outcome {
    pub fn status(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::Nothing => 1,
            Outcome::Command(status) | Outcome::NotAcquired(status) => status,
            Outcome::Signalled(signal) => signal_status(signal),
            Outcome::Lost => Code::Lost.value(),
            Outcome::Failed(code) => code.value(),
        }
    }
}

/// The exit-status table as shown in `--help` and the man pages, rendered from [`Code`] at
/// compile time.
pub const TABLE: &str = const_text!(render_table);

const fn render_table(out: &mut [u8]) -> usize {
    let mut at = put(
        out,
        0,
        "Exit status:\n  N        the command ran and exited with N\n  \
         128+S    the command was killed by signal S\n",
    );
    let mut i = 0;
    while i < Code::ALL.len() {
        at = put(out, at, "  ");
        at = put_number(out, at, Code::ALL[i].value(), 9);
        at = put(out, at, Code::ALL[i].meaning());
        at = put(out, at, "\n");
        i += 1;
    }
    put(
        out,
        at,
        "  128+N    dlock got signal N while waiting for the lock (the command never ran)\n\
         status: 0 when the lock is held, 1 when it is free.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_deaths_map_to_128_plus_signal() {
        assert_eq!(from_child(ExitStatus::from_raw(libc::SIGTERM)), 143);
        assert_eq!(from_child(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }

    #[test]
    fn exit_codes_pass_through() {
        assert_eq!(from_child(ExitStatus::from_raw(3 << 8)), 3);
        assert_eq!(from_child(ExitStatus::from_raw(255 << 8)), 255);
    }

    #[test]
    fn table_lists_every_code() {
        for code in Code::ALL {
            let needle = format!("  {:<9}{}\n", code.value(), code.meaning());
            assert!(TABLE.contains(&needle), "{code:?} missing from the table");
        }
    }

    /// Each code once in `ALL`, each status once: the table cannot list two meanings for one.
    #[test]
    fn every_code_is_listed_once_with_its_own_status() {
        let mut values: Vec<u8> = Code::ALL.iter().map(|c| c.value()).collect();
        values.sort_unstable();
        values.dedup();
        assert_eq!(values.len(), Code::ALL.len());
    }

    #[test]
    fn outcomes_map_to_their_statuses() {
        assert_eq!(Outcome::Done.status(), 0);
        assert_eq!(Outcome::Nothing.status(), 1);
        assert_eq!(Outcome::Command(5).status(), 5);
        assert_eq!(Outcome::Signalled(libc::SIGTERM).status(), 143);
        assert_eq!(Outcome::NotAcquired(3).status(), 3);
        assert_eq!(Outcome::Lost.status(), 124);
        assert_eq!(Outcome::Failed(Code::Usage).status(), 64);
    }
}
