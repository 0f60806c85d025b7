//! Whether this run's `--limit` agrees with the other holders' (all holders of a lock must
//! use the same), read from their records where the kernel shows them holding.

use super::slot::{read_contents, slot_file_name};
use crate::error::Error;
use crate::kit::limit;
use crate::kit::lock_dir::LockDir;
use crate::kit::proc_locks::ProcLocks;
use crate::lock::{limit_mismatch, AcquireRequest};

/// Refuse to hold a lock beside holders that use another `--limit` (all holders must agree
/// on N), as the other backends do. Each holder records its limit in its record, believed
/// while the kernel shows its pid holding the file (`proc_locks.rs`). Slot files are created in order and
/// never removed, so the probe stops at the first missing one: for a plain lock it costs one
/// `stat`. `own`: the slot we hold, if any.
pub(super) fn check_limits(
    dir: &LockDir,
    request: &AcquireRequest,
    stem: &str,
    own: Option<u32>,
) -> Result<(), Error> {
    let mut others = Vec::new();
    for slot in (0..crate::lock::MAX_LIMIT).filter(|s| Some(*s) != own) {
        let file_name = slot_file_name(stem, slot);
        match dir.identity(&file_name) {
            Ok(Some(key)) => others.push((file_name, key)),
            _ => break,
        }
    }
    if others.is_empty() {
        return Ok(());
    }
    let keys = others.iter().map(|(_, key)| *key).collect();
    // Without /proc the limits cannot be compared. A table that keeps changing (a busy
    // queue) is read as well as it can be: a holder it misses is one mismatch not reported
    // this time, while an error here would fail a run the lock itself lets through.
    let locks = match ProcLocks::read_best(&keys) {
        Ok(locks) => locks,
        Err(e) => {
            tracing::debug!("cannot compare --limit with the other holders: {e}");
            return Ok(());
        }
    };
    for (file_name, key) in others {
        // Shared holders (of slot 0) hold with --limit 1, whatever the file's last record says.
        if locks.shared.contains_key(&key) {
            if request.limit != 1 {
                return Err(limit_mismatch(&request.name, 1));
            }
            continue;
        }
        // A file that cannot be read or trusted says nothing about a limit.
        let record = dir
            .read_lock_file(&file_name)
            .ok()
            .flatten()
            .and_then(|file| read_contents(file).1);
        let Some(pid) = locks.holder(key, record.as_ref().map(|r| r.holder.pid)) else {
            continue;
        };
        if let Some(record) = record.filter(|r| r.holder.pid == pid) {
            limit::agrees(&request.name, request.limit, record.limit)?;
        }
    }
    Ok(())
}
