//! What `status` sees of a host-local queue: the tickets in use for a lock name, whose, since
//! when, with which command line, and whether each process still waits in this host's queue,
//! read from the files and `/proc/locks` without taking or waiting for anything.

use std::fs::File;

use super::{LocalQueue, GRANTED};
use crate::error::Error;
use crate::kit::proc_locks::ProcLocks;
use crate::kit::stem::stem;
use crate::lock::{Holder, LockName};

impl LocalQueue {
    /// The tickets in use for `name`, in ticket order (first come first): whose, since when,
    /// what it shows of its command line, and whether its process is still blocked in this queue (on a ticket ahead of its own,
    /// or on the `.queuing` file of an earlier one) or has gone on to the server.
    pub(in crate::kit::local_queue) fn in_use(&self, name: &LockName) -> Result<Vec<InUse>, Error> {
        let Some(dir) = self.open(false)? else {
            return Ok(Vec::new());
        };
        let prefix = format!("{}.", stem(name));
        let mut tickets = Vec::new();
        let mut keys = std::collections::HashSet::new();
        for entry in dir.entries()? {
            let Some(rest) = entry.strip_prefix(&prefix) else {
                continue;
            };
            let (number, is_ticket) =
                match (rest.strip_suffix(".ticket"), rest.strip_suffix(".queuing")) {
                    (Some(number), _) => (number, true),
                    (_, Some(number)) => (number, false),
                    _ => continue,
                };
            let Ok(number) = number.parse::<u64>() else {
                continue;
            };
            let Some(key) = dir.identity(&entry).ok().flatten() else {
                continue;
            };
            keys.insert(key);
            if is_ticket {
                tickets.push((number, entry, key));
            }
        }
        tickets.sort_unstable_by_key(|(number, _, _)| *number);
        let locks = ProcLocks::read_best(&keys)?;
        let blocked: std::collections::HashSet<u32> =
            locks.waiters.values().flatten().copied().collect();
        Ok(tickets
            .into_iter()
            .filter_map(|(_, entry, key)| {
                let pid = locks.holder(key, None)?;
                // Nothing writes to a ticket file after it is created and locked.
                let file = dir.read_lock_file(&entry).ok()??;
                let meta = file.metadata().ok()?;
                let since = meta.modified().ok()?;
                Some(InUse {
                    pid,
                    since,
                    command: recorded_command(file),
                    blocked: blocked.contains(&pid),
                    granted: std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & GRANTED
                        != 0,
                })
            })
            .collect())
    }
}

/// A ticket in use: see [`LocalQueue::in_use`].
pub(in crate::kit::local_queue) struct InUse {
    pub(in crate::kit::local_queue) pid: u32,
    /// When the ticket was taken.
    pub(in crate::kit::local_queue) since: std::time::SystemTime,
    /// What its run shows of its command line (masked; empty when it records none).
    pub(in crate::kit::local_queue) command: String,
    /// Its process waits in this host's queue, not at the server yet.
    pub(in crate::kit::local_queue) blocked: bool,
    /// Its run got the lock ([`Ticket::granted`]): a holder, or one stopping after a loss.
    pub(in crate::kit::local_queue) granted: bool,
}

/// The command line a ticket file records, as much of it as a record can be
/// ([`Holder::MAX_COMMAND`] bytes and the `…` that marks a cut).
fn recorded_command(file: File) -> String {
    use std::io::Read;
    let mut raw = Vec::new();
    let most = Holder::MAX_COMMAND + '…'.len_utf8();
    if file.take(most as u64).read_to_end(&mut raw).is_err() {
        return String::new();
    }
    String::from_utf8_lossy(&raw).into_owned()
}
