//! The host-local queue itself: numbered tickets in files, first come first served, each
//! waiter blocked in the kernel on exactly one file, so a hand-over wakes one process and no
//! herd.
//!
//! - `<stem>.tickets` holds the next ticket number; taking a ticket is read, increment and
//!   create-and-lock the ticket file `<stem>.<n>.ticket`, all under an OFD lock on the counter,
//!   so a ticket file is locked before anyone can look for it.
//! - A process holds its ticket file locked (`flock`) from the moment it takes the ticket until
//!   it has released the remote lock (or given up); then it removes the file. The kernel drops
//!   the lock when the process dies, however it dies. The file holds what `status` shows of
//!   the waiter's command line (masked, or nothing when the run records none), written once
//!   as the ticket is taken.
//! - Ticket `n` may go to the server once ticket `n - admitted` is done: its file is gone, or
//!   it can be locked. With `admitted` = `--limit` + [`super::DEPTH`], a host never has more
//!   than that many processes at the server.
//! - And once every earlier ticket still in use has its place in the server's queue, so that
//!   the host's runs reach it in ticket order however slowly each gets there (a process of a
//!   busy machine may not run for a while). Each ticket has a second file,
//!   `<stem>.<n>.queuing`, created and locked with the ticket file and unlocked when its
//!   process has queued at the server ([`crate::lock::queued`]), has got the lock without
//!   queueing, or has left; the kernel unlocks it too when the process dies. Ticket `n` waits
//!   for those of the tickets before it (normally only `n - 1`'s is still locked; all of them,
//!   because `n - 1` may have given up while one before it is still on its way) as for
//!   admission: blocked in the kernel on one file at a time, within `--wait`, cancellable.
//!   The first to find one unlocked removes it.
//!
//! The directory is opened as the file backend opens its own (`kit::lock_dir`): private to the
//! user, never following a link, refusing files someone else planted.
//!
//! Nothing is left behind: the last ticket of a lock name to leave removes its counter, and
//! the queue's directory once it is empty, so a directory per server ever tried (a typo in a
//! URL included) does not stay. Race-free against a newcomer: the counter is removed only
//! under its lock and only when no ticket file is left, and a newcomer that locked a counter
//! that is no longer in the directory, or finds the directory removed, starts again (a new
//! counter from 0: no ticket of the old numbering is left). `rmdir` itself fails on a
//! directory that is not empty.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::clock::{sleep_until, BootInstant};
use crate::error::Error;
use crate::kit::flock::{flock, range_lock, BlockedWait};
use crate::kit::lock_dir::LockDir;
use crate::kit::stem::stem;
use crate::lock::{Cancel, LockName};

mod in_use;

/// The width of the counter: 20 digits and a newline.
const COUNTER_LEN: usize = 21;

/// Take or drop the lock on a counter (an OFD record lock on its number).
fn counter_lock(counter: &File, lock: bool) -> io::Result<()> {
    range_lock(counter, COUNTER_LEN, lock)
}

/// How often taking a ticket starts again because a leaver removed the counter or the
/// directory meanwhile (each time needs another process to empty the queue in between).
const MAX_FRESH_STARTS: usize = 100;

/// One user's queue for one remote namespace: a directory of counters and ticket files.
pub(super) struct LocalQueue {
    base: PathBuf,
    sub: String,
}

/// A place in the queue; removed (and unlocked) when dropped.
pub(super) struct Ticket {
    dir: LockDir,
    name: String,
    stem: String,
    /// The queue's parent directory and the queue's name in it, to remove it when empty.
    base: PathBuf,
    sub: String,
    /// Locked while the ticket is in use; closed (unlocked) first when it is dropped.
    file: Option<File>,
    /// The `.queuing` file's name and the file, locked until this ticket's process has its
    /// place in the server's queue (see the module doc); shared with the hook that unlocks it.
    queuing_name: String,
    queuing: Arc<Mutex<Option<File>>>,
    /// The ticket just before this one was still in use when this one was admitted.
    pub(super) peer_ahead: bool,
    /// This ticket had to wait for one ahead of it (time behind other runs, which counts
    /// against `--wait`), rather than being admitted at once.
    pub(super) waited: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Removed before it is unlocked: a successor that opened it already is woken by the
        // unlock, one that looks later finds it gone; both go on. Unlocked before the tidying,
        // which the successor need not wait for.
        let _ = self.dir.remove(&self.queuing_name);
        self.queued();
        let _ = self.dir.remove(&self.name);
        drop(self.file.take());
        if let Err(e) = self.tidy() {
            tracing::debug!(
                "cannot tidy {}: {e}",
                self.dir.path_of(&self.stem).display()
            );
        }
    }
}

impl Ticket {
    /// This ticket's process has its place in the server's queue (or is past it, or leaves):
    /// the next ticket may go to the server. Repeats are harmless.
    pub(super) fn queued(&self) {
        unlock_queuing(&self.queuing);
    }

    /// This ticket's run holds the lock: `status` no longer counts it among this host's
    /// waiters, nor once the hold is lost or broken (`release --force`) and its process is
    /// stopping its command. The mark is the ticket file's owner-execute bit, which nothing
    /// else sets: one `fchmod`, no write, on the way to the command.
    pub(super) fn granted(&self) {
        use std::os::unix::fs::PermissionsExt;
        if let Some(file) = &self.file {
            let marked = file.metadata().and_then(|meta| {
                let mode = meta.permissions().mode() | GRANTED;
                file.set_permissions(std::fs::Permissions::from_mode(mode))
            });
            if let Err(e) = marked {
                tracing::debug!("cannot mark this host's ticket as holding: {e}");
            }
        }
    }

    /// A hook that does what [`Ticket::queued`] does, for the remote backend to call.
    pub(super) fn on_queued(&self) -> impl Fn() + Send + Sync + 'static {
        let queuing = self.queuing.clone();
        move || unlock_queuing(&queuing)
    }

    /// The last ticket of its name to leave removes the counter, and the queue's directory
    /// if nothing else is in it (see the module doc).
    fn tidy(&self) -> Result<(), Error> {
        let counter_name = format!("{}.tickets", self.stem);
        let Some(counter) = self.dir.open_existing_lock_file(&counter_name)? else {
            return Ok(());
        };
        let lock_err =
            |e| Error::from_lock_io_at("cannot lock", &self.dir.path_of(&counter_name), &e);
        counter_lock(&counter, true).map_err(lock_err)?;
        let prefix = format!("{}.", self.stem);
        let removed = (|| {
            if !self
                .dir
                .is_current(&counter, &counter_name)
                .unwrap_or(false)
            {
                return Ok(false);
            }
            let entries = self.dir.entries()?;
            let mine = || entries.iter().filter(|e| e.starts_with(&prefix));
            if mine().any(|e| e.ends_with(".ticket")) {
                return Ok(false);
            }
            // Without a ticket a `.queuing` file has no process: one left by a run that died.
            for stale in mine().filter(|e| e.ends_with(".queuing")) {
                let _ = self.dir.remove(stale);
            }
            self.dir.remove(&counter_name).map_err(|e| {
                Error::from_lock_io_at("cannot remove", &self.dir.path_of(&counter_name), &e)
            })?;
            Ok(true)
        })();
        let _ = counter_lock(&counter, false);
        if removed? {
            if let Some(base) = LockDir::open(&self.base, true, None, false)? {
                base.remove_empty_dir(&self.sub).map_err(|e| {
                    Error::from_lock_io_at("cannot remove", &self.dir.path_of(""), &e)
                })?;
            }
        }
        Ok(())
    }
}

impl LocalQueue {
    /// The queue in `base/sub` (`base`: the user's private runtime directory).
    pub(super) fn new(base: &Path, sub: String) -> LocalQueue {
        LocalQueue {
            base: base.to_owned(),
            sub,
        }
    }

    pub(super) fn path(&self) -> PathBuf {
        self.base.join(&self.sub)
    }

    fn open(&self, create: bool) -> Result<Option<LockDir>, Error> {
        LockDir::open(&self.base, true, Some(&self.sub), create)
    }

    /// Take a ticket for `name`, recording `command` (what `status` shows of this waiter's
    /// command line) in it, and wait until fewer than `admitted` tickets ahead of it are
    /// still at work. [`Error::Busy`] when `deadline` passes first, [`Error::Cancelled`] when
    /// `cancel` fires; either way the ticket is gone.
    pub(super) async fn enter(
        &self,
        name: &LockName,
        command: &str,
        admitted: u64,
        deadline: Option<BootInstant>,
        cancel: &mut Cancel,
    ) -> Result<Ticket, Error> {
        let stem = stem(name);
        let mut taken = None;
        for _ in 0..MAX_FRESH_STARTS {
            let dir = self.open(true)?.ok_or_else(|| {
                Error::CantCreate(format!(
                    "{} vanished as it was created",
                    self.path().display()
                ))
            })?;
            taken = take_ticket(dir, &stem, command, self)?;
            if taken.is_some() {
                break;
            }
        }
        let Some((number, mut ticket)) = taken else {
            return Err(Error::CantCreate(format!(
                "{} kept being removed while a ticket was taken",
                self.path().display()
            )));
        };
        ticket.peer_ahead = number
            .checked_sub(1)
            .is_some_and(|previous| in_use(&ticket.dir, &ticket_name(&stem, previous)));
        // Admitted, then in ticket order: after every earlier ticket has queued or is gone.
        if let Some(ahead) = number.checked_sub(admitted) {
            ticket.waited |=
                wait_for(&ticket.dir, &ticket_name(&stem, ahead), deadline, cancel).await?;
        }
        for earlier in queuing_before(&ticket.dir, &stem, number)? {
            ticket.waited |=
                wait_for(&ticket.dir, &queuing_name(&stem, earlier), deadline, cancel).await?;
        }
        Ok(ticket)
    }
}

/// The mode bit of a ticket file whose run got the lock ([`Ticket::granted`]).
const GRANTED: u32 = 0o100;

/// Whether ticket file `name` exists and its process still holds it (to the best of a quick
/// look: any failure says no).
fn in_use(dir: &LockDir, name: &str) -> bool {
    match dir.read_lock_file(name) {
        Ok(Some(file)) => matches!(
            flock(&file, libc::LOCK_SH | libc::LOCK_NB),
            Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK)
        ),
        _ => false,
    }
}

fn ticket_name(stem: &str, number: u64) -> String {
    format!("{stem}.{number}.ticket")
}

fn queuing_name(stem: &str, number: u64) -> String {
    format!("{stem}.{number}.queuing")
}

/// The numbers of the `.queuing` files of tickets before `number`, nearest first (the one most
/// likely still locked; the others are then mostly unlocked already).
fn queuing_before(dir: &LockDir, stem: &str, number: u64) -> Result<Vec<u64>, Error> {
    let prefix = format!("{stem}.");
    let mut earlier: Vec<u64> = dir
        .entries()?
        .iter()
        .filter_map(|entry| {
            entry
                .strip_prefix(&prefix)?
                .strip_suffix(".queuing")?
                .parse::<u64>()
                .ok()
        })
        .filter(|&k| k < number)
        .collect();
    earlier.sort_unstable_by(|a, b| b.cmp(a));
    Ok(earlier)
}

/// Close a ticket's `.queuing` file, which unlocks it.
fn unlock_queuing(queuing: &Mutex<Option<File>>) {
    let file = match queuing.lock() {
        Ok(mut guard) => guard.take(),
        Err(poisoned) => poisoned.into_inner().take(),
    };
    drop(file);
}

/// Wait until the lock file `name` of another ticket is unlocked or gone; then remove it (it
/// is normally gone already, and left behind if its process died). Returns whether it had to
/// wait. [`Error::Busy`] when `deadline` passes first, [`Error::Cancelled`] when `cancel` fires.
async fn wait_for(
    dir: &LockDir,
    name: &str,
    deadline: Option<BootInstant>,
    cancel: &mut Cancel,
) -> Result<bool, Error> {
    let Some(file) = dir.read_lock_file(name)? else {
        return Ok(false);
    };
    match flock(&file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => {
            let _ = dir.remove(name);
            return Ok(false);
        }
        Err(e) if e.raw_os_error() == Some(libc::EWOULDBLOCK) => {}
        Err(e) => {
            return Err(Error::from_lock_io_at(
                "cannot lock",
                &dir.path_of(name),
                &e,
            ))
        }
    }
    let mut blocked = BlockedWait::start(vec![(0, file, name.to_owned())]);
    let outcome = tokio::select! {
        got = blocked.first() => got.map(|(_, _file, name)| {
            let _ = dir.remove(&name);
        }),
        _ = cancel.cancelled() => Err(Error::Cancelled),
        _ = sleep_until(deadline.unwrap_or(BootInstant::now())), if deadline.is_some() => {
            Err(Error::Busy("the wait ran out in this host's queue".into()))
        }
    };
    blocked.stop(outcome.as_ref().ok().map(|()| 0));
    outcome.map(|()| true)
}

/// Under the lock on the counter: the next number, counted on, and its ticket file, locked.
/// `None`: a leaver removed the counter or the directory meanwhile; start again.
fn take_ticket(
    dir: LockDir,
    stem: &str,
    command: &str,
    queue: &LocalQueue,
) -> Result<Option<(u64, Ticket)>, Error> {
    let counter_name = format!("{stem}.tickets");
    let counter = match dir.open_lock_file(&counter_name) {
        Ok(counter) => counter,
        Err(_) if dir.is_removed() => return Ok(None),
        Err(e) => return Err(e),
    };
    let path = dir.path_of(&counter_name);
    let io_err = |what: &str, e: io::Error| Error::from_lock_io_at(what, &path, &e);
    counter_lock(&counter, true).map_err(|e| io_err("cannot lock", e))?;
    if !dir
        .is_current(&counter, &counter_name)
        .map_err(|e| io_err("cannot inspect", e))?
    {
        let _ = counter_lock(&counter, false);
        return Ok(None);
    }
    let taken = (|| {
        let mut buf = [0u8; COUNTER_LEN];
        let read = counter
            .read_at(&mut buf, 0)
            .map_err(|e| io_err("cannot read", e))?;
        // An empty (new) or unreadable counter starts again at 0: tickets only order the
        // queue, and a stale ticket file of the same number is reused or refused below.
        let number: u64 = std::str::from_utf8(&buf[..read])
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(0);
        let next = format!("{:020}\n", number.wrapping_add(1));
        counter
            .write_all_at(next.as_bytes(), 0)
            .map_err(|e| io_err("cannot write", e))?;
        let lock = |name: &str| {
            let file = dir.open_lock_file(name)?;
            flock(&file, libc::LOCK_EX | libc::LOCK_NB)
                .map_err(|e| Error::from_lock_io_at("cannot lock", &dir.path_of(name), &e))?;
            Ok::<File, Error>(file)
        };
        let name = ticket_name(stem, number);
        let file = lock(&name)?;
        // For `status` only: a ticket whose record could not be written still queues, and a
        // reused stale file loses the mark of a run that got the lock.
        let _ = file.write_all_at(command.as_bytes(), 0);
        if let Ok(meta) = file.metadata() {
            use std::os::unix::fs::PermissionsExt;
            let mode = meta.permissions().mode();
            if mode & GRANTED != 0 {
                let _ = file.set_permissions(std::fs::Permissions::from_mode(mode & !GRANTED));
            }
        }
        let queuing_name = queuing_name(stem, number);
        let queuing = match lock(&queuing_name) {
            Ok(queuing) => queuing,
            Err(e) => {
                let _ = dir.remove(&name);
                return Err(e);
            }
        };
        Ok((number, name, file, queuing_name, queuing))
    })();
    let _ = counter_lock(&counter, false);
    let (number, name, file, queuing_name, queuing) = taken?;
    Ok(Some((
        number,
        Ticket {
            dir,
            name,
            stem: stem.to_owned(),
            base: queue.base.clone(),
            sub: queue.sub.clone(),
            file: Some(file),
            queuing_name,
            queuing: Arc::new(Mutex::new(Some(queuing))),
            peer_ahead: false,
            waited: false,
        },
    )))
}
