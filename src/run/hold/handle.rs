//! How `dlock release` reaches the keeper of a hold: the handle (`KEEPER-PID.START`, in
//! `DLOCK_HOLD` and in the hold's `DLOCK_HELD` entry) names a Unix socket in the user's own
//! dlock directory (`holds/`, mode 0700), where the keeper answers one request per
//! connection, only from its own user (or root): `release LOCK` → `released`,
//! `kept UNTIL` (`--min-hold` keeps it), `lost WHY`, or `other` (the handle is another lock's).

use std::path::PathBuf;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::error::Error;
use crate::kit::lock_dir::{self, LockDir};

/// The sub-directory of the user's dlock directory where the keepers' sockets are.
const HOLDS: &str = "holds";
/// A request is one short line; anything longer is not dlock's.
const MAX_REQUEST: u64 = 4096;

/// Which keeper: its pid and start time (unique together, see `process::start_ticks`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) pid: u32,
    pub(crate) start: u64,
}

impl Handle {
    pub(crate) fn parse(text: &str) -> Option<Handle> {
        let (pid, start) = text.split_once('.')?;
        Some(Handle {
            pid: pid.parse().ok()?,
            start: start.parse().ok()?,
        })
    }

    fn socket_name(self) -> String {
        format!("{}.{}", self.pid, self.start)
    }
}

impl std::fmt::Display for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.pid, self.start)
    }
}

/// What a keeper answers to `release`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Answer {
    Released,
    /// `--min-hold` keeps the lock until then (RFC 3339), then it is released.
    Kept(String),
    /// The hold had been lost before (why).
    Lost(String),
    /// The handle is another lock's keeper.
    Other,
}

impl Answer {
    fn line(&self) -> String {
        match self {
            Answer::Released => "released\n".into(),
            Answer::Kept(until) => format!("kept {until}\n"),
            Answer::Lost(why) => format!("lost {}\n", crate::logging::printable(why)),
            Answer::Other => "other\n".into(),
        }
    }

    fn parse(line: &str) -> Option<Answer> {
        let line = line.trim_end_matches('\n');
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "released" => Some(Answer::Released),
            "kept" => Some(Answer::Kept(rest.to_owned())),
            "lost" => Some(Answer::Lost(rest.to_owned())),
            "other" => Some(Answer::Other),
            _ => None,
        }
    }
}

fn holds_dir(create: bool) -> Result<Option<LockDir>, Error> {
    LockDir::open(&lock_dir::default_dir(), true, Some(HOLDS), create)
}

/// The keeper's end: its socket, removed when dropped.
pub(super) struct Listener {
    listener: UnixListener,
    path: PathBuf,
}

impl Listener {
    /// Listen at `handle`'s socket.
    pub(super) fn bind(handle: Handle) -> Result<Listener, Error> {
        let dir = holds_dir(true)?.ok_or_else(|| Error::Internal("no holds directory".into()))?;
        let path = dir.path_of(&handle.socket_name());
        // What is there is a dead keeper's (a pid and start time are never reused together).
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).map_err(|err| {
            Error::from_lock_io_at("cannot listen for dlock release", &path, &err)
        })?;
        Ok(Listener { listener, path })
    }

    /// The next request from this user (or root): the lock it names, and where to answer.
    pub(super) async fn next(&self) -> (String, Reply) {
        loop {
            let stream = match self.listener.accept().await {
                Ok((stream, _)) => stream,
                Err(err) => {
                    // Out of descriptors, say: try again in a while rather than at once.
                    tracing::debug!("cannot accept a release request: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let mine = nix::unistd::getuid().as_raw();
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == mine || cred.uid() == 0 => {}
                _ => continue,
            }
            let mut reader = BufReader::new(stream).take(MAX_REQUEST);
            let mut line = String::new();
            let read = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                reader.read_line(&mut line),
            )
            .await;
            if let Ok(Ok(_)) = read {
                if let Some(lock) = line.trim_end_matches('\n').strip_prefix("release ") {
                    let stream = reader.into_inner().into_inner();
                    return (lock.to_owned(), Reply(stream));
                }
            }
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Where a keeper answers one request.
pub(super) struct Reply(UnixStream);

impl Reply {
    pub(super) async fn send(mut self, answer: &Answer) {
        let sent = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            self.0.write_all(answer.line().as_bytes()),
        )
        .await;
        if !matches!(sent, Ok(Ok(()))) {
            tracing::debug!("the release request went away before its answer");
        }
    }
}

/// Ask the keeper `handle` to release `lock`: its answer, or `None` when no keeper answers
/// there any more (it has ended; a socket a killed keeper left is removed).
pub(crate) async fn ask_release(handle: Handle, lock: &str) -> Result<Option<Answer>, Error> {
    let Some(dir) = holds_dir(false)? else {
        return Ok(None);
    };
    let path = dir.path_of(&handle.socket_name());
    let mut stream = match UnixStream::connect(&path).await {
        Ok(stream) => stream,
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused => {
            let _ = std::fs::remove_file(&path);
            return Ok(None);
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => {
            return Err(Error::from_lock_io_at(
                "cannot reach the hold's keeper",
                &path,
                &err,
            ))
        }
    };
    match stream
        .write_all(format!("release {lock}\n").as_bytes())
        .await
    {
        Ok(()) => {}
        Err(err) if went_away(&err) => return Ok(None),
        Err(err) => {
            return Err(Error::from_lock_io_at(
                "cannot reach the hold's keeper",
                &path,
                &err,
            ))
        }
    }
    let mut line = String::new();
    // The keeper answers after the release: bounded by the release's own bound (at most 10 s)
    // and then some.
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        BufReader::new(stream)
            .take(MAX_REQUEST)
            .read_line(&mut line),
    )
    .await;
    match read {
        // The keeper ended meanwhile (its hold ended by itself as the request came).
        Ok(Ok(0)) => Ok(None),
        Ok(Err(err)) if went_away(&err) => Ok(None),
        Ok(Ok(_)) => Answer::parse(&line).map(Some).ok_or_else(|| {
            Error::Internal(format!(
                "the hold's keeper answered something else: {}",
                crate::logging::printable(line.trim_end())
            ))
        }),
        Ok(Err(err)) => Err(Error::from_lock_io_at(
            "no answer from the hold's keeper",
            &path,
            &err,
        )),
        Err(_) => Err(Error::Unavailable(format!(
            "the hold's keeper (pid {}) did not answer within 30s",
            handle.pid
        ))),
    }
}

/// The keeper closed the connection without an answer: it was ending.
fn went_away(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::BrokenPipe
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_and_answers_round_trip() {
        let handle = Handle { pid: 42, start: 7 };
        assert_eq!(Handle::parse(&handle.to_string()), Some(handle));
        assert_eq!(Handle::parse("42"), None);
        assert_eq!(Handle::parse("x.7"), None);
        for answer in [
            Answer::Released,
            Answer::Kept("2026-12-07T21:00:00Z".into()),
            Answer::Lost("the lease expired".into()),
            Answer::Other,
        ] {
            assert_eq!(Answer::parse(&answer.line()), Some(answer));
        }
        assert_eq!(Answer::parse("yes\n"), None);
    }
}
