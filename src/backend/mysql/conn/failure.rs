//! What a failed statement or driver error means: a closed session (and so a lost lock), a
//! timeout, or a server error, and the message and exit status each stands for (README:
//! "Exit status").

use std::time::Duration;

use super::{tls_failure, ER_SECURE_TRANSPORT_REQUIRED, SERVER};
use crate::error::Error;

/// A statement that failed or did not answer.
#[derive(Debug)]
pub(in crate::backend::mysql) enum Failure {
    Driver(mysql_async::Error),
    Timeout(Duration),
    /// An earlier statement on the connection was abandoned before its answer was read.
    OutOfStep,
}

impl Failure {
    pub(in crate::backend::mysql) fn server_code(&self) -> Option<u16> {
        match self {
            Failure::Driver(mysql_async::Error::Server(e)) => Some(e.code),
            _ => None,
        }
    }

    /// The connection itself is gone: the server closed it (`KILL`, `release --force`, a
    /// shutdown), it broke, or the driver already knows it is closed. A `GET_LOCK` lock
    /// does not outlive its session, so on the lock's connection this means the lock is
    /// gone (or going: the server frees it when it sees the end). A timeout is not this:
    /// a silent connection may still be the server's live session.
    pub(in crate::backend::mysql) fn closed(&self) -> bool {
        match self {
            Failure::Driver(e) => connection_gone(e),
            Failure::Timeout(_) | Failure::OutOfStep => false,
        }
    }

    pub(in crate::backend::mysql) fn describe(&self) -> String {
        match self {
            Failure::Driver(e) => describe(e),
            Failure::Timeout(limit) => {
                format!("no answer within {}", humantime::format_duration(*limit))
            }
            Failure::OutOfStep => {
                "the connection is out of step: an earlier statement on it got no answer in time"
                    .into()
            }
        }
    }

    pub(in crate::backend::mysql) fn into_error(self, display: &str) -> Error {
        match self {
            Failure::Driver(e) => classify(&e, display),
            Failure::Timeout(limit) => Error::Unavailable(format!(
                "{display} did not answer within {}",
                humantime::format_duration(limit)
            )),
            Failure::OutOfStep => Error::Unavailable(format!("{display}: {}", self.describe())),
        }
    }
}

/// See [`Failure::closed`]. Server errors that end the session: 1927 (connection killed),
/// 1053 (server shutdown in progress), and the client-side 2006 / 2013 (server gone, lost
/// during a query) should a server send them.
pub(in crate::backend::mysql) fn connection_gone(e: &mysql_async::Error) -> bool {
    match e {
        mysql_async::Error::Io(mysql_async::IoError::Io(_)) => true,
        mysql_async::Error::Driver(mysql_async::DriverError::ConnectionClosed) => true,
        mysql_async::Error::Server(s) => matches!(s.code, 1927 | 1053 | 2006 | 2013),
        _ => false,
    }
}

/// A driver error in words: the server's message and error code where there is one.
pub(in crate::backend::mysql) fn describe(e: &mysql_async::Error) -> String {
    match e {
        mysql_async::Error::Server(s) => format!("{} (error {})", s.message, s.code),
        other => crate::kit::error_text::chain_text(other),
    }
}

/// MySQL error 1040: the server is at `max_connections`. A capacity refusal, waited out
/// within `--wait` by [`crate::kit::capacity`] like the other servers' (69 when final).
pub(in crate::backend::mysql) fn too_many_connections(display: &str, text: &str) -> Error {
    crate::kit::capacity::refused(display, "MySQL max_connections", text)
}

/// The exit status a driver error stands for (README: "Exit status").
pub(in crate::backend::mysql) fn classify(e: &mysql_async::Error, display: &str) -> Error {
    let text = describe(e);
    match e {
        mysql_async::Error::Server(s) => match s.code {
            1040 => too_many_connections(display, &text),
            // Access denied (password, database, host, table, privilege, thread owner).
            1044 | 1045 | 1130 | 1142 | 1143 | 1227 | 1095 | 1698 => {
                Error::Permission(format!("{display}: {text}"))
            }
            // Unknown database, no database selected.
            1049 | 1046 => Error::Config(format!(
                "{display}: {text}; name an existing database in the URL (mysql://host/DATABASE)"
            )),
            // A read-only server (--read-only, super_read_only, a replica).
            1290 | 1836 | 1792 => Error::Config(format!(
                "{display} is read-only ({text}); locks must be taken on the primary"
            )),
            ER_SECURE_TRANSPORT_REQUIRED => Error::Config(format!(
                "{display}: {text}; use ssl-mode=REQUIRED, or VERIFY_CA / VERIFY_IDENTITY with ssl-ca=FILE"
            )),
            1064 => Error::Internal(format!("{display}: {text}")),
            _ => Error::Unavailable(format!("{display}: {text}")),
        },
        mysql_async::Error::Io(mysql_async::IoError::Tls(_)) => tls_failure(e, display),
        _ if crate::error::caused_by_tls(e) => tls_failure(e, display),
        _ if crate::wording::refused_in(e) => crate::wording::connection_refused(display, &SERVER),
        _ => Error::Unavailable(format!(
            "cannot reach {display}: {}",
            crate::kit::error_text::without_os_error_numbers(&text)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn server(code: u16) -> mysql_async::Error {
        mysql_async::Error::Server(mysql_async::ServerError {
            code,
            message: "m".into(),
            state: "HY000".into(),
        })
    }

    #[test]
    fn server_errors_map_to_exit_statuses() {
        use crate::exit::Code;
        assert_eq!(classify(&server(1045), "d").code(), Code::NoPermission);
        assert_eq!(classify(&server(1142), "d").code(), Code::NoPermission);
        assert_eq!(classify(&server(1290), "d").code(), Code::Config);
        assert_eq!(classify(&server(1049), "d").code(), Code::Config);
        let full = classify(&server(1040), "d");
        assert_eq!(full.code(), Code::Unavailable);
        assert!(full.to_string().contains("max_connections"), "{full}");
        assert_eq!(classify(&server(2013), "d").code(), Code::Unavailable);
        let insecure = classify(&server(ER_SECURE_TRANSPORT_REQUIRED), "d");
        assert_eq!(insecure.code(), Code::Config);
        assert!(
            insecure.to_string().contains("ssl-mode=REQUIRED"),
            "{insecure}"
        );
    }
}
