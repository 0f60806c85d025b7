//! The turnstile of a lock (`<stem>.turnstile`, the backend's module doc): where an exclusive
//! run that has to wait queues so that shared runs arriving after it wait behind it, and how a
//! run passes it by when it cannot be used or its holders have stalled. Exclusion never
//! depends on it: only the lock file excludes.

use std::collections::BTreeSet;
use std::fs::File;
use std::time::Duration;

use super::slot::{slot_file_name, turnstile_file_name};
use super::{check_limits, wait_on};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::lock_dir::LockDir;
use crate::kit::proc_locks::ProcLocks;
use crate::lock::{AcquireRequest, Cancel};

/// Queue at the lock's turnstile (the module doc): `flock(operation)` on `<stem>.turnstile`,
/// waiting as [`pass`](super::pass) does; the turnstile, held. `None`: no turnstile, go straight to the
/// lock file. That is safe, since the lock file alone excludes: the turnstile only orders
/// shared runs behind a waiting exclusive one. So it is passed by when it cannot be used
/// (a directory we may not create it in, or a file in its place that is not ours), and when
/// the runs holding it have stopped moving ([`Stall`]): a waiter stopped with SIGSTOP or in
/// a frozen cgroup must not keep everyone from a free lock.
pub(super) async fn queue_at_turnstile(
    dir: &LockDir,
    request: &AcquireRequest,
    stem: &str,
    operation: libc::c_int,
    deadline: Option<BootInstant>,
    cancel: &mut Cancel,
) -> Result<Option<File>, Error> {
    let name = turnstile_file_name(stem);
    let file = match dir.open_lock_file(&name) {
        Ok(file) => file,
        Err(e) => {
            without_turnstile(dir, &name, &e);
            return Ok(None);
        }
    };
    let stall = Stall::new(name.clone(), slot_file_name(stem, 0));
    wait_on(
        dir,
        request,
        (file, &name),
        operation,
        (deadline, cancel),
        &|| check_limits(dir, request, stem, None),
        Some(stall),
    )
    .await
}

/// Say why a run goes on without the turnstile `name` it could not open: quietly where the
/// directory does not let us create it (the multi-user recipe of docs/backends/file.md, a
/// directory of root's), aloud where something else is in the way (a file another user
/// planted in a shared directory).
fn without_turnstile(dir: &LockDir, name: &str, e: &Error) {
    let path = dir.path_of(name);
    if matches!(e, Error::Permission(_)) {
        tracing::debug!(
            "not queueing at {} ({e}): shared runs may overtake a waiting exclusive run",
            path.display()
        );
    } else {
        tracing::warn!(
            "not queueing at {}, which cannot be used ({e}); exclusion is unaffected, but \
             shared runs may overtake waiting exclusive ones",
            path.display()
        );
    }
}

/// Whether the runs that hold a lock's turnstile have stalled: stopped (SIGSTOP, Ctrl-Z, a
/// debugger) or frozen, they hold it while the lock they wait for is free. A run that holds
/// the turnstile takes the lock file within moments of its being free (it is blocked in the
/// kernel, and woken by the release); the same runs holding the turnstile while the lock file
/// stays free over [`Stall::AFTER`] are not running.
pub(super) struct Stall {
    turnstile: String,
    lock_file: String,
    /// The runs ahead at the turnstile with the lock file free, and since when.
    seen: Option<(BTreeSet<u32>, BootInstant)>,
}

impl Stall {
    /// How often a run queued at the turnstile looks whether the runs ahead still move.
    pub(super) const LOOK_EVERY: Duration = Duration::from_millis(500);
    /// How long the same runs may hold the turnstile over a free lock file.
    const AFTER: Duration = Duration::from_secs(1);

    fn new(turnstile: String, lock_file: String) -> Stall {
        Stall {
            turnstile,
            lock_file,
            seen: None,
        }
    }

    /// Look again: whether the runs ahead have held the turnstile over a free lock file for
    /// [`Stall::AFTER`]. `false` whenever it cannot be told.
    pub(super) fn stalled(&mut self, dir: &LockDir) -> bool {
        let now = BootInstant::now();
        let ahead = self.ahead_over_a_free_lock(dir).unwrap_or_default();
        if ahead.is_empty() {
            self.seen = None;
            return false;
        }
        match &self.seen {
            Some((seen, since)) if *seen == ahead => now.saturating_since(*since) >= Self::AFTER,
            _ => {
                self.seen = Some((ahead, now));
                false
            }
        }
    }

    /// The pids holding the turnstile (ours aside) while nobody holds the lock file; none
    /// while the lock file is held.
    fn ahead_over_a_free_lock(&self, dir: &LockDir) -> Option<BTreeSet<u32>> {
        let turnstile = dir.identity(&self.turnstile).ok()??;
        let lock_file = dir.identity(&self.lock_file).ok()?;
        let keys = [Some(turnstile), lock_file].into_iter().flatten().collect();
        let locks = ProcLocks::read_best(&keys).ok()?;
        if lock_file.is_some_and(|key| locks.holders.contains_key(&key)) {
            return Some(BTreeSet::new());
        }
        let own = std::process::id();
        let holders = match locks.shared.get(&turnstile) {
            Some(readers) => readers.clone(),
            None => locks.holders.get(&turnstile).copied().into_iter().collect(),
        };
        Some(holders.into_iter().filter(|&pid| pid != own).collect())
    }
}
