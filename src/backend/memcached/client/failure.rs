//! Why an exchange with memcached failed, and what that means for the user: the message and
//! the exit status of a refused connection, a binary-only or authenticating server, another
//! kind of server, or an answer this client does not expect.

use std::time::Duration;

use super::SERVER;
use crate::error::Error;

/// Why an exchange failed.
#[derive(Debug)]
pub(in crate::backend::memcached) enum Failure {
    Io(std::io::Error),
    Timeout(Duration),
    /// The server answered something this client does not expect.
    Protocol(String),
    /// The server speaks only the binary protocol (`-B binary`).
    BinaryOnly,
    /// The server requires authentication (`-Y` or SASL).
    Unauthenticated,
    /// Another kind of server answers at the address ("a Redis server").
    NotMemcached(&'static str),
}

impl Failure {
    pub(in crate::backend::memcached) fn describe(&self) -> String {
        match self {
            Failure::Io(e) => e.to_string(),
            Failure::Timeout(d) => format!("no answer within {}", millis(*d)),
            Failure::Protocol(text) => text.clone(),
            Failure::BinaryOnly => "the server speaks only the binary protocol".into(),
            Failure::Unauthenticated => "the server requires authentication".into(),
            Failure::NotMemcached(what) => format!("it answers like {what}"),
        }
    }

    /// A failure of the link (the server may come back on a new connection), as opposed to
    /// an answer that says what the server is.
    pub(in crate::backend::memcached) fn is_link(&self) -> bool {
        matches!(self, Failure::Io(_) | Failure::Timeout(_))
    }

    pub(in crate::backend::memcached) fn into_error(self, display: &str) -> Error {
        match self {
            Failure::Io(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound
                ) =>
            {
                crate::wording::connection_refused(display, &SERVER)
            }
            Failure::Io(e) => Error::Unavailable(format!(
                "cannot reach {display}: {}",
                crate::kit::error_text::io_words(&e)
            )),
            Failure::Timeout(d) => {
                Error::Unavailable(format!("{display} did not answer within {}", millis(d)))
            }
            Failure::BinaryOnly => Error::Config(format!(
                "{display} speaks only the binary protocol (memcached -B binary); dlock needs \
                 the text/meta protocol (-B ascii or -B auto, the default)"
            )),
            Failure::NotMemcached(what) => {
                crate::wording::not_a(display, &SERVER, &format!("it answers like {what}"))
            }
            Failure::Unauthenticated => Error::Permission(format!(
                "{display} requires authentication (memcached -Y or -S), and dlock does not \
                 send memcached credentials; use a server without authentication that only \
                 trusted clients can reach (a private network or a Unix socket)"
            )),
            // "SERVER_ERROR out of memory storing object": full, and not evicting (-M).
            Failure::Protocol(text) if text.contains("SERVER_ERROR") => {
                Error::Unavailable(format!("{display} could not do what dlock asked: {text}"))
            }
            // A Redis (`-ERR unknown command`) or an HTTP server: not a memcached at all.
            Failure::Protocol(text)
                if text.trim_start_matches(['\'', '"']).starts_with("-ERR")
                    || text.contains("HTTP/") =>
            {
                crate::wording::not_a(display, &SERVER, &format!("it answered {text}"))
            }
            Failure::Protocol(text) => Error::Unavailable(format!(
                "{display} answered unexpectedly ({text}); dlock needs memcached 1.6 or later \
                 with the meta protocol"
            )),
        }
    }
}

/// `d` to the millisecond, for messages.
fn millis(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_millis(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
    ))
}

/// What a server started with `-Y` answers every command before a login.
pub(super) const UNAUTHENTICATED: &str = "CLIENT_ERROR unauthenticated";

/// An answer line this client does not expect (an authentication demand named as such).
pub(super) fn unexpected(line: &str) -> Failure {
    if line.starts_with(UNAUTHENTICATED) {
        return Failure::Unauthenticated;
    }
    Failure::Protocol(format!("'{}'", crate::logging::printable(line)))
}
