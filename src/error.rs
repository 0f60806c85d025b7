//! Errors a caller can branch on.
//!
//! Backends and the settings layer return [`Error`]; the layers above add context with
//! `anyhow`. `main` finds the [`Error`] in the chain to pick the exit status
//! ([`crate::exit::Code`]); anything else is an internal error (70).

use crate::exit::Code;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad flag, name, duration or URL.
    #[error("{0}")]
    Usage(String),
    /// The lock is held by someone else and the wait is over (or there was none).
    #[error("{0}")]
    Busy(String),
    /// The backend cannot be reached or did not answer in time.
    #[error("{0}")]
    Unavailable(String),
    /// The server refused the connection because it serves as many clients as it allows
    /// (`kit::capacity`): waited out within `--wait`, 69 when it is final.
    #[error("{0}")]
    Capacity(String),
    /// The lock file or its directory cannot be created.
    #[error("{0}")]
    CantCreate(String),
    /// Authentication or permission refused.
    #[error("{0}")]
    Permission(String),
    /// Bad configuration: config file, TLS set-up, an unsuitable server.
    #[error("{0}")]
    Config(String),
    /// The command cannot be found (127).
    #[error("{0}")]
    NotFound(String),
    /// The command exists but cannot be executed (126).
    #[error("{0}")]
    NotExecutable(String),
    /// The wait was cancelled by the caller (a signal); everything the waiter created is gone.
    #[error("cancelled")]
    Cancelled,
    /// A broken invariant inside dlock.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The exit status this error ends dlock with.
    pub fn code(&self) -> Code {
        match self {
            Error::Usage(_) => Code::Usage,
            Error::Busy(_) => Code::NotAcquired,
            Error::Unavailable(_) | Error::Capacity(_) => Code::Unavailable,
            Error::CantCreate(_) => Code::CantCreate,
            Error::Permission(_) => Code::NoPermission,
            Error::Config(_) => Code::Config,
            Error::NotFound(_) => Code::NotFound,
            Error::NotExecutable(_) => Code::NotExecutable,
            Error::Cancelled | Error::Internal(_) => Code::Internal,
        }
    }

    /// Classify an I/O error on the lock directory or file: permission problems are 77,
    /// everything else means the file cannot be created (73). The error in words, without
    /// its number.
    pub fn from_lock_io(what: String, err: &std::io::Error) -> Error {
        let message = format!("{what}: {}", crate::kit::error_text::io_words(err));
        match err.kind() {
            std::io::ErrorKind::PermissionDenied => Error::Permission(message),
            _ => Error::CantCreate(message),
        }
    }

    /// [`Error::from_lock_io`] for `what` done to `path` ("cannot open lock file"): a refused
    /// permission says whose the path is and what to do.
    pub fn from_lock_io_at(what: &str, path: &std::path::Path, err: &std::io::Error) -> Error {
        match err.kind() {
            std::io::ErrorKind::PermissionDenied => Error::Permission(format!(
                "{what} {}: {}",
                path.display(),
                crate::kit::error_text::permission_denied(path)
            )),
            _ => Error::from_lock_io(format!("{what} {}", path.display()), err),
        }
    }
}

/// Whether a TLS failure (a `rustls::Error`) is somewhere in `err`'s chain of causes, also
/// where a client wrapped it in an `io::Error`, or shared it behind an `Arc`, on the way up.
pub fn caused_by_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    let in_io = |io: &std::io::Error| {
        io.get_ref()
            .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
    };
    let mut cause = Some(err);
    while let Some(e) = cause {
        if e.downcast_ref::<rustls::Error>().is_some()
            || e.downcast_ref::<std::io::Error>().is_some_and(in_io)
            || e.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
                .and_then(|shared| (**shared).downcast_ref::<std::io::Error>())
                .is_some_and(in_io)
        {
            return true;
        }
        cause = e.source();
    }
    false
}

/// The exit status for an error chain: the first [`Error`] in it decides.
pub fn code_of(err: &anyhow::Error) -> Code {
    err.chain()
        .find_map(|cause| cause.downcast_ref::<Error>())
        .map_or(Code::Internal, Error::code)
}
