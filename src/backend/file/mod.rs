//! The file backend: `flock(2)` on `<dir>/<encoded-name>.lock`. No server; the kernel frees
//! the lock the moment the holding dlock dies.
//!
//! Layout and invariants (each part in its own file):
//!
//! - A lock is one file per slot: `<stem>.lock`, and `<stem>#i.lock` for slot `i > 0` of a
//!   `--limit N` semaphore (`slot.rs`). A non-default `--prefix P` is the sub-directory
//!   `<dir>/<P>.d/`.
//! - Directories and lock files are opened as `kit/lock_dir.rs` describes: relative to the
//!   checked directory, never following a link, never blocking on a FIFO, and only if nobody
//!   else could have planted them.
//! - Lock files are never unlinked (unlink-and-recreate lets two holders lock two different
//!   inodes). After locking, the (dev, inode) of the descriptor is compared with the directory
//!   entry; if the file was replaced meanwhile, we retry.
//! - Each file starts with a fixed-width header; in slot 0 it is the fencing counter of the
//!   name (README: "Guarantees and limits"), updated under an OFD record lock on the header so that holders of
//!   different slots serialize (`slot.rs`). The holder's [`Record`] (JSON) follows the header;
//!   it is only believed while `/proc/locks` shows the same pid holding the file
//!   (`kit/proc_locks.rs`).
//! - Waiting blocks in the kernel on helper threads, one per slot, so a release hands over
//!   without polling (`kit/flock.rs`).
//! - A held lock counts as lost when its file is deleted or replaced (`lease.rs`).
//! - Shared holds (`--shared`, `--limit 1` only): `LOCK_SH` on slot 0's file, so `flock -s`
//!   shares with them. `<stem>.turnstile` keeps shared runs from starving exclusive ones: an
//!   exclusive run that has to wait holds it `LOCK_EX` from before it waits on the lock file
//!   until it holds it; a shared run holds it `LOCK_SH` from before it takes the lock file
//!   until it holds it. A shared run arriving while an exclusive run waits so blocks on the
//!   turnstile, behind it. No deadlock: whoever holds the turnstile waits only for the lock
//!   file's holders, and they hold no turnstile. Each shared hold takes the next token under
//!   the header lock as an exclusive one does, and writes its record to
//!   `<stem>.<pid>.reader` (`slot::reader_file_name`), removed on release.
//! - Exclusion rests on the lock file alone; the turnstile only orders runs, and the reader
//!   files only describe holders. So neither may stop a run: a turnstile that cannot be
//!   opened (a directory the user may not create it in, a file planted there) is passed by,
//!   and so is one whose holders have stalled over a free lock file (stopped while they wait:
//!   [`Stall`]); a shared hold whose record file cannot be created holds without one.
//! - Shared holds are taken in `shared.rs`; every hold first checks that the holders agree
//!   on `--limit` (`limits.rs`).
//! - `status`, `list`, `release --force` and `check` are in `admin.rs`.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

mod admin;
pub mod kind;
mod lease;
mod limits;
mod shared;
mod slot;
pub mod target;
mod turnstile;

use self::limits::check_limits;
use self::shared::acquire_shared;

pub use lease::FileLease;
pub use target::FileTarget;

use self::slot::{header, header_lock, slot_file_name, write_at, HEADER_LEN};
use self::turnstile::{queue_at_turnstile, Stall};
use crate::budget::Wait;
use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::flock::{flock, BlockedWait};
use crate::kit::lock_dir::LockDir;
use crate::kit::stem::stem;
use crate::lock::{
    AcquireRequest, Backend, Cancel, CheckReport, Holder, LockName, LockStatus, Record,
};

/// Replacing the file under us repeatedly is an attack, not a race; give up after this many.
const MAX_INODE_RETRIES: u32 = 64;

pub struct FileBackend {
    base: PathBuf,
    /// dlock chose the base directory itself (so it must be ours and private).
    default_dir: bool,
    /// The `--prefix` sub-directory (`<P>.d`) in `base`, unless the prefix is the default.
    sub: Option<String>,
    /// Where the lock files are, for messages.
    dir: PathBuf,
}

impl FileBackend {
    pub fn new(base: &Path, default_dir: bool, prefix: &str) -> FileBackend {
        let sub = (prefix != crate::lock::DEFAULT_PREFIX)
            .then(|| format!("{}.d", crate::lock::encode_component(prefix)));
        let dir = match &sub {
            Some(sub) => base.join(sub),
            None => base.to_owned(),
        };
        FileBackend {
            base: base.to_owned(),
            default_dir,
            sub,
            dir,
        }
    }

    /// Where the lock files are.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the locks are, for `status` and `list`: the default directory (no `--url`, no
    /// `DLOCK_DIR`) is each user's own, so another user's locks are not in it.
    pub(super) fn location(&self) -> String {
        let own = self.default_dir
            && !std::env::var_os("DLOCK_DIR").is_some_and(|d| Path::new(&d).is_absolute());
        if own {
            format!(
                "locks of uid {} in {}",
                nix::unistd::getuid(),
                self.dir.display()
            )
        } else {
            format!("in {}", self.dir.display())
        }
    }

    /// Open the lock directory, creating it (mode 0700) if missing, after checking that
    /// nobody else controls it (see [`dir`]).
    fn prepare_dir(&self) -> Result<LockDir, Error> {
        LockDir::open(&self.base, self.default_dir, self.sub.as_deref(), true)?.ok_or_else(|| {
            Error::CantCreate(format!(
                "lock directory {} vanished as it was created",
                self.dir.display()
            ))
        })
    }

    /// Open the lock directory if it exists (checked as in [`FileBackend::prepare_dir`]).
    fn existing_dir(&self) -> Result<Option<LockDir>, Error> {
        LockDir::open(&self.base, self.default_dir, self.sub.as_deref(), false)
    }
}

impl Backend for FileBackend {
    type Lease = FileLease;

    /// Lock the first free slot file, or wait in the kernel for any of them; then check that
    /// the file locked is still the one in the directory, and make it a hold.
    async fn acquire(
        &self,
        request: &AcquireRequest,
        mut cancel: Cancel,
    ) -> Result<FileLease, Error> {
        let dir = self.prepare_dir()?;
        // One deadline for the whole call, however often a replaced file makes us retry.
        let deadline = request.budget.deadline();
        let stem = stem(&request.name);
        if request.mode.is_shared() {
            return acquire_shared(dir, request, &stem, deadline, &mut cancel).await;
        }
        for _ in 0..MAX_INODE_RETRIES {
            let (slot, file, file_name) = match try_slots(&dir, &stem, request.limit)? {
                Attempt::Taken(taken) => taken,
                Attempt::AllHeld(files) => {
                    // An exclusive run that has to wait holds the turnstile until it holds the
                    // lock: shared runs that arrive meanwhile queue behind it.
                    let turnstile = if request.limit == 1 && !request.budget.is_no_wait() {
                        queue_at_turnstile(
                            &dir,
                            request,
                            &stem,
                            libc::LOCK_EX,
                            deadline,
                            &mut cancel,
                        )
                        .await?
                    } else {
                        None
                    };
                    let won =
                        wait_for_slot(&dir, request, &stem, files, deadline, &mut cancel).await?;
                    drop(turnstile);
                    tracing::debug!(target: crate::logging::HANDOFF, "woken");
                    won
                }
            };
            match dir.is_current(&file, &file_name) {
                Ok(true) => {
                    let hold = start_hold(&dir, request, &stem, slot, file, &file_name);
                    tracing::debug!(target: crate::logging::HANDOFF, "token-written");
                    return hold;
                }
                Ok(false) => {
                    tracing::debug!(
                        "{} was replaced while we locked it; retrying",
                        dir.path_of(&file_name).display()
                    );
                    continue;
                }
                Err(e) => return Err(cannot_inspect(&dir, &file_name, &e)),
            }
        }
        Err(keeps_being_replaced(&request.name, self.dir.display()))
    }

    async fn status(&self, name: &LockName) -> Result<LockStatus, Error> {
        admin::status(self, name)
    }

    async fn list(&self) -> Result<Vec<LockStatus>, Error> {
        admin::list(self).await
    }

    async fn force_release(&self, name: &LockName) -> Result<Vec<Holder>, Error> {
        admin::force_release(self, name)
    }

    async fn check(&self) -> Result<CheckReport, Error> {
        admin::check(self)
    }
}

/// A slot file: its slot number, the open file and its file name.
type SlotFile = (u32, File, String);

/// What trying every slot without blocking found.
enum Attempt {
    /// The first free slot, now locked by us.
    Taken(SlotFile),
    /// Every slot is held by others: their files, to wait for.
    AllHeld(Vec<SlotFile>),
}

/// Lock the first slot file that is free, without blocking.
fn try_slots(dir: &LockDir, stem: &str, limit: u32) -> Result<Attempt, Error> {
    let mut files = Vec::with_capacity(limit as usize);
    for slot in 0..limit {
        let file_name = slot_file_name(stem, slot);
        let file = dir.open_lock_file(&file_name)?;
        match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
            Ok(()) => return Ok(Attempt::Taken((slot, file, file_name))),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {
                files.push((slot, file, file_name))
            }
            Err(e) => {
                return Err(Error::from_lock_io_at(
                    "cannot lock",
                    &dir.path_of(&file_name),
                    &e,
                ))
            }
        }
    }
    Ok(Attempt::AllHeld(files))
}

/// Every slot is held: wait as `request.budget` says for the first of `files` to be freed.
async fn wait_for_slot(
    dir: &LockDir,
    request: &AcquireRequest,
    stem: &str,
    files: Vec<SlotFile>,
    deadline: Option<BootInstant>,
    cancel: &mut Cancel,
) -> Result<SlotFile, Error> {
    // Refuse a mismatched --limit at once rather than after the wait.
    check_limits(dir, request, stem, None)?;
    if request.budget.is_no_wait() {
        return Err(busy(
            request,
            &admin::describe_holders(dir, &request.name),
            request.budget.wait(),
        ));
    }
    let mut blocked = BlockedWait::start(files);
    crate::lock::queued(request);
    let outcome = tokio::select! {
        got = blocked.first() => got,
        _ = cancel.cancelled() => Err(Error::Cancelled),
        _ = sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {
            Err(Error::Busy(String::new()))
        }
    };
    let won = outcome.as_ref().ok().map(|(slot, _, _)| *slot);
    blocked.stop(won);
    match outcome {
        // Described once our own blocked wait is gone, so it is not counted as waiting ahead.
        Err(Error::Busy(_)) => Err(busy(
            request,
            &admin::describe_holders(dir, &request.name),
            request.budget.wait(),
        )),
        other => other,
    }
}

/// Whether a locked lock file is still the one in the directory could not be told.
fn cannot_inspect(dir: &LockDir, file_name: &str, e: &std::io::Error) -> Error {
    Error::from_lock_io_at("cannot inspect", &dir.path_of(file_name), e)
}

/// The lock file was replaced under every attempt to lock it.
fn keeps_being_replaced(name: &LockName, dir: impl std::fmt::Display) -> Error {
    Error::CantCreate(format!(
        "the lock file for '{name}' in {dir} keeps being replaced; giving up"
    ))
}

/// `flock(operation)` on the file `file_name`, waiting as `request.budget` says (cancellable,
/// bounded by `deadline`); the file, locked. `before_waiting` runs when it has to wait (the
/// `--limit` check, so that a mismatch is refused at once rather than after the wait).
async fn pass(
    dir: &LockDir,
    request: &AcquireRequest,
    file_name: &str,
    operation: libc::c_int,
    deadline: Option<BootInstant>,
    cancel: &mut Cancel,
    before_waiting: &dyn Fn() -> Result<(), Error>,
) -> Result<File, Error> {
    let file = dir.open_lock_file(file_name)?;
    let waited = wait_on(
        dir,
        request,
        (file, file_name),
        operation,
        (deadline, cancel),
        before_waiting,
        None,
    )
    .await?;
    waited.ok_or_else(|| Error::Internal(format!("the wait for {file_name} ended unlocked")))
}

/// Wait for `flock(operation)` on `file` (named `file_name`), as [`pass`] says; with `stall`,
/// give up the wait (`Ok(None)`) once the runs that hold the file have stalled.
async fn wait_on(
    dir: &LockDir,
    request: &AcquireRequest,
    (file, file_name): (File, &str),
    operation: libc::c_int,
    (deadline, cancel): (Option<BootInstant>, &mut Cancel),
    before_waiting: &dyn Fn() -> Result<(), Error>,
    mut stall: Option<Stall>,
) -> Result<Option<File>, Error> {
    match flock(&file, operation | libc::LOCK_NB) {
        Ok(()) => return Ok(Some(file)),
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
        Err(e) => {
            return Err(Error::from_lock_io_at(
                "cannot lock",
                &dir.path_of(file_name),
                &e,
            ))
        }
    }
    before_waiting()?;
    if request.budget.is_no_wait() {
        return Err(busy(
            request,
            &admin::describe_holders(dir, &request.name),
            request.budget.wait(),
        ));
    }
    let mut blocked = BlockedWait::start_with(vec![(0, file, file_name.to_owned())], operation);
    // Bounded by the deadline, the cancel, or the stall (each look either ends the wait or
    // starts the next interval).
    let outcome = loop {
        let next_look = BootInstant::now() + Stall::LOOK_EVERY;
        tokio::select! {
            got = blocked.first() => break got.map(Some),
            _ = cancel.cancelled() => break Err(Error::Cancelled),
            _ = sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {
                break Err(Error::Busy(String::new()))
            }
            _ = sleep_until(next_look), if stall.is_some() => {
                if stall.as_mut().is_some_and(|stall| stall.stalled(dir)) {
                    break Ok(None);
                }
            }
        }
    };
    let won = match &outcome {
        Ok(Some((slot, _, _))) => Some(*slot),
        _ => None,
    };
    blocked.stop(won);
    match outcome {
        Ok(won) => Ok(won.map(|(_, file, _)| file)),
        Err(Error::Busy(_)) => Err(busy(
            request,
            &admin::describe_holders(dir, &request.name),
            request.budget.wait(),
        )),
        Err(other) => Err(other),
    }
}

fn busy(request: &AcquireRequest, state: &str, wait: Wait) -> Error {
    crate::wording::not_acquired(&request.name, state, wait)
}

/// Make the slot just locked a hold: under the lock on the counter's header, check the
/// other holders' `--limit`, take the next token and write our record. Doing all three
/// under that one lock means that of two holders that start together, the second sees the
/// first's record.
fn start_hold(
    dir: &LockDir,
    request: &AcquireRequest,
    stem: &str,
    slot: u32,
    file: File,
    file_name: &str,
) -> Result<FileLease, Error> {
    let path = dir.path_of(file_name);
    let io_err = |what: &str, e: io::Error| Error::from_lock_io_at(what, &path, &e);
    // The fencing counter lives in slot 0's header, guarded by an OFD lock on it.
    let counter_name = slot_file_name(stem, 0);
    let counter_file = if slot == 0 {
        None
    } else {
        Some(dir.open_lock_file(&counter_name)?)
    };
    let counter = counter_file.as_ref().unwrap_or(&file);
    header_lock(counter, true).map_err(|e| io_err("cannot lock the header of", e))?;
    let held = check_limits(dir, request, stem, Some(slot))
        .and_then(|()| slot::next_token(counter, &dir.path_of(&counter_name)))
        .and_then(|token| {
            write_at(counter, 0, header(token).as_bytes())
                .map_err(|e| io_err("cannot write", e))?;
            let record = granted_record(request, token);
            let mut body = if slot == 0 { String::new() } else { header(0) };
            let body_offset = if slot == 0 { HEADER_LEN as u64 } else { 0 };
            body.push_str(
                &serde_json::to_string(&record).map_err(|e| Error::Internal(e.to_string()))?,
            );
            body.push('\n');
            write_at(&file, body_offset, body.as_bytes()).map_err(|e| io_err("cannot write", e))?;
            file.set_len(body_offset + body.len() as u64)
                .map_err(|e| io_err("cannot truncate", e))?;
            Ok(token)
        });
    let _ = header_lock(counter, false);
    let token = held?;
    Ok(FileLease::new(file, path, token, request.limit))
}

/// The record of a hold granted now with `token`, exclusive or shared: a kernel lock has no
/// lease.
pub(super) fn granted_record(request: &AcquireRequest, token: u64) -> Record {
    let mut holder = request.holder.clone();
    holder.token = token;
    holder.granted_now();
    holder.ttl_ms = 0;
    Record {
        holder,
        limit: request.limit,
    }
}
