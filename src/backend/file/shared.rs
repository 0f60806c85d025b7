//! Shared holds (`--shared`, `--limit 1` only): through the turnstile, `LOCK_SH` on slot 0's
//! file (the lock `flock -s` takes), the next token as an exclusive hold takes it, and the
//! holder's record in a reader file of its own, since the other shared holders share the
//! lock file.

use std::fs::File;
use std::io;
use std::path::Path;

use super::lease::{FileLease, ReaderRecord};
use super::slot::{self, header, header_lock, reader_file_name, slot_file_name, write_at};
use super::turnstile::queue_at_turnstile;
use super::{cannot_inspect, check_limits, keeps_being_replaced, pass, MAX_INODE_RETRIES};
use crate::clock::BootInstant;
use crate::error::Error;
use crate::kit::lock_dir::LockDir;
use crate::lock::{AcquireRequest, Cancel};

/// A shared hold: through the turnstile (so that an exclusive run already waiting goes
/// first), then `LOCK_SH` on slot 0's file, the same lock `flock -s FILE` takes; then the
/// next token and a record of our own.
pub(super) async fn acquire_shared(
    dir: LockDir,
    request: &AcquireRequest,
    stem: &str,
    deadline: Option<BootInstant>,
    cancel: &mut Cancel,
) -> Result<FileLease, Error> {
    let file_name = slot_file_name(stem, 0);
    for _ in 0..MAX_INODE_RETRIES {
        // Held until the lock is ours: an exclusive run arriving meanwhile queues behind us.
        let turnstile =
            queue_at_turnstile(&dir, request, stem, libc::LOCK_SH, deadline, cancel).await?;
        crate::lock::queued(request);
        let file = pass(
            &dir,
            request,
            &file_name,
            libc::LOCK_SH,
            deadline,
            cancel,
            &|| check_limits(&dir, request, stem, None),
        )
        .await?;
        drop(turnstile);
        tracing::debug!(target: crate::logging::HANDOFF, "woken");
        match dir.is_current(&file, &file_name) {
            Ok(true) => {
                let hold = start_shared_hold(dir, request, stem, file, &file_name);
                tracing::debug!(target: crate::logging::HANDOFF, "token-written");
                return hold;
            }
            Ok(false) => continue,
            Err(e) => return Err(cannot_inspect(&dir, &file_name, &e)),
        }
    }
    Err(keeps_being_replaced(
        &request.name,
        dir.path_of("").display(),
    ))
}

/// Make a shared lock on slot 0's file a hold: under the lock on its header, check the other
/// slots' `--limit` and take the next token, as an exclusive hold does; the record goes to a
/// file of our own, since other shared holders share the lock file.
fn start_shared_hold(
    dir: LockDir,
    request: &AcquireRequest,
    stem: &str,
    file: File,
    file_name: &str,
) -> Result<FileLease, Error> {
    let path = dir.path_of(file_name);
    let io_err = |what: &str, path: &Path, e: io::Error| Error::from_lock_io_at(what, path, &e);
    header_lock(&file, true).map_err(|e| io_err("cannot lock the header of", &path, e))?;
    let held = check_limits(&dir, request, stem, Some(0))
        .and_then(|()| slot::next_token(&file, &path))
        .and_then(|token| {
            write_at(&file, 0, header(token).as_bytes())
                .map_err(|e| io_err("cannot write", &path, e))?;
            Ok(token)
        });
    let _ = header_lock(&file, false);
    let token = held?;
    let record = super::granted_record(request, token);
    let name = reader_file_name(stem, request.holder.pid);
    let record_path = dir.path_of(&name);
    let record_file = match dir.open_lock_file(&name) {
        Ok(record_file) => record_file,
        Err(e) => {
            without_record(&record_path, &e);
            return Ok(FileLease::shared(file, path, token, None));
        }
    };
    let mut body = header(0);
    body.push_str(&serde_json::to_string(&record).map_err(|e| Error::Internal(e.to_string()))?);
    body.push('\n');
    write_at(&record_file, 0, body.as_bytes())
        .and_then(|()| record_file.set_len(body.len() as u64))
        .map_err(|e| io_err("cannot write", &record_path, e))?;
    Ok(FileLease::shared(
        file,
        path,
        token,
        Some(ReaderRecord {
            dir,
            name,
            file: record_file,
        }),
    ))
}

/// Say why a shared hold keeps no record at `path`: the hold stands without one (`status`
/// then shows its pid alone, as for `flock -s`). Quietly where the directory does not let us
/// create it (the multi-user recipe of docs/backends/file.md, a directory of root's), aloud
/// where something else is in the way (a file another user planted in a shared directory).
fn without_record(path: &Path, e: &Error) {
    if matches!(e, Error::Permission(_)) {
        tracing::debug!("holding without a record at {} ({e})", path.display());
    } else {
        tracing::warn!(
            "holding without a record: {} cannot be used ({e}); status shows this holder by \
             its pid alone",
            path.display()
        );
    }
}
