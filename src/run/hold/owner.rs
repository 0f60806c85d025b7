//! Whose hold it is: the process a hold belongs to (docs/guide.md: "Holding a lock across
//! commands"), found once at the start and watched through a pidfd, so that its end, however
//! it ends, is seen at once and a later process with the same pid is never taken for it.

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;

use tokio::io::unix::AsyncFd;

use crate::clock::Readable;
use crate::error::Error;
use crate::process::{parent_of, start_ticks};

/// Bound on the walk up the parent chain past the subshells that write into the pipe dlock
/// writes to (`$(…)` nests only a few deep).
const MAX_SUBSHELLS: usize = 64;

/// The process a hold belongs to.
pub(super) struct Owner {
    pub(super) pid: u32,
    /// Its start time (`/proc/PID/stat`), for the entry in `DLOCK_HELD`.
    pub(super) start: u64,
    pidfd: OwnedFd,
}

impl Owner {
    /// The process that reads this `dlock hold`'s output: the nearest ancestor whose standard
    /// output is not the pipe this process writes to. In `eval "$(dlock hold x)"` that is the
    /// shell running `eval`, also when a subshell of the command substitution started dlock;
    /// when the output is not a pipe (a terminal, a file), it is the parent.
    pub(super) fn find() -> Result<Owner, Error> {
        let ours = pipe_of("self");
        let mut pid = parent_of(std::process::id()).ok_or_else(no_parent)?;
        for _ in 0..MAX_SUBSHELLS {
            match &ours {
                Some(pipe) if pipe_of(&pid.to_string()).as_ref() == Some(pipe) => {
                    pid = parent_of(pid).ok_or_else(no_parent)?;
                }
                _ => break,
            }
        }
        Owner::open(pid)
    }

    /// `pid`, held by a pidfd; its start time read before and after opening proves the pidfd
    /// refers to the process the walk found, not one that took its pid meanwhile.
    fn open(pid: u32) -> Result<Owner, Error> {
        let gone = || {
            Error::Unavailable(format!(
                "the process this hold would belong to (pid {pid}) has ended; nothing to hold for"
            ))
        };
        let start = start_ticks(pid).ok_or_else(gone)?;
        let raw_pid = libc::pid_t::try_from(pid).map_err(|_| gone())?;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ESRCH) => gone(),
                _ => Error::Internal(format!("cannot watch pid {pid} (pidfd_open): {err}")),
            });
        }
        let fd = i32::try_from(fd).map_err(|_| Error::Internal("pidfd out of range".into()))?;
        // SAFETY: the descriptor was just returned by the kernel and is owned by nobody else.
        let pidfd = unsafe { OwnedFd::from_raw_fd(fd) };
        if start_ticks(pid) != Some(start) {
            return Err(gone());
        }
        Ok(Owner { pid, start, pidfd })
    }

    /// A watch that resolves when the owner has ended.
    pub(super) fn watch(&self) -> std::io::Result<OwnerWatch> {
        Ok(OwnerWatch(Readable::register(self.pidfd.try_clone()?)?))
    }

    /// Send `signal` to the owner, if it still runs (never to a later process with its pid).
    pub(super) fn signal(&self, signal: i32) {
        // SAFETY: pidfd_send_signal takes a pidfd, a signal, a null siginfo and flags.
        let sent = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                self.pidfd.as_fd().as_raw_fd(),
                signal,
                std::ptr::null::<libc::siginfo_t>(),
                0,
            )
        };
        if sent < 0 {
            tracing::debug!(
                "cannot signal the hold's owner, pid {}: {}",
                self.pid,
                std::io::Error::last_os_error()
            );
        }
    }
}

/// Resolves when the owner has ended (its pidfd becomes readable).
pub(super) struct OwnerWatch(AsyncFd<Readable<OwnedFd>>);

impl OwnerWatch {
    pub(super) async fn ended(&self) {
        // An error here (none is known for a pidfd) must not read as the owner's end.
        match self.0.readable().await {
            Ok(_guard) => {}
            Err(err) => {
                tracing::warn!("cannot watch the hold's owner any more: {err}");
                std::future::pending::<()>().await;
            }
        }
    }
}

/// The pipe `/proc/<who>/fd/1` is, if it is one (`pipe:[INODE]`).
fn pipe_of(who: &str) -> Option<PathBuf> {
    let target = std::fs::read_link(format!("/proc/{who}/fd/1")).ok()?;
    target
        .as_os_str()
        .as_encoded_bytes()
        .starts_with(b"pipe:")
        .then_some(target)
}

fn no_parent() -> Error {
    Error::Unavailable(
        "cannot tell which process this hold belongs to (its parent is gone); \
         use --until-released with --max-hold"
            .into(),
    )
}
