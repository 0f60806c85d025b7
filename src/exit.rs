//! The exit statuses of dlock (README: "Exit status"), in one place.
//!
//! The command's own status is passed through unchanged ([`from_child`]); everything dlock
//! causes itself has one code from [`Code`].
//! The same table is rendered into `--help`, the man page and the README ([`TABLE`]).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

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
    pub fn value(self) -> u8 {
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

/// The exit-status table as shown in `--help`, the man page and the README.
pub const TABLE: &str = "\
Exit status:
  N        the command ran and exited with N
  128+S    the command was killed by signal S
  75       the lock was not acquired (held and --no-wait, or --wait elapsed); see -E
  124      the lock was lost while the command ran; dlock stopped the command
  64       usage error: bad flag, name, duration or URL
  69       backend unreachable, DNS failure, connect/response timeout, wrong protocol
  70       internal error in dlock
  73       cannot create the lock file or directory
  77       authentication or permission refused
  78       configuration error: bad config file, TLS set-up, replica/standby/pooler refused
  126      the command is not executable
  127      the command was not found
  128+N    dlock got signal N while waiting for the lock (the command never ran)
status: 0 when the lock is held, 1 when it is free.";

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
        for code in [
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
        ] {
            let needle = format!("  {:<9}", code.value());
            assert!(TABLE.contains(&needle), "{code:?} missing from TABLE");
        }
    }
}
