//! The files a lock is made of, and what is in them.
//!
//! - Slot 0 of a lock is `<stem>.lock`, slot `i > 0` of a `--limit N` semaphore is
//!   `<stem>#i.lock`, where the stem is [`stem`] (the encoded name, shortened and made unique
//!   with a SHA-256 suffix when the file system would not take it); `#` never occurs in an
//!   encoded name.
//! - Each file starts with a fixed-width header `fence NNNNNNNNNNNNNNNNNNNN\n`, followed by
//!   the holder's [`Record`] (JSON). In slot 0 the header is the fencing counter of the name,
//!   updated under an OFD record lock on the header ([`header_lock`]) so that holders of
//!   different slots serialize; [`next_token`] says what the next token is.

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use crate::error::Error;
use crate::kit::flock::range_lock;
use crate::kit::lock_dir::LockDir;
use crate::kit::stem::stem;
use crate::lock::{LockName, Record};

/// The length of the header `fence NNNNNNNNNNNNNNNNNNNN\n`.
pub(super) const HEADER_LEN: usize = 27;

/// The file name of slot `slot` of the lock whose file-name stem is `stem`.
pub(super) fn slot_file_name(stem: &str, slot: u32) -> String {
    if slot == 0 {
        format!("{stem}.lock")
    } else {
        format!("{stem}#{slot}.lock")
    }
}

/// The turnstile of a lock that has shared holders (the module doc of `mod.rs`): an exclusive
/// run that has to wait holds it exclusively until it holds the lock, and a shared run passes
/// through it before taking the lock, so it queues behind a waiting exclusive run. Not a
/// `.lock` file: it is never a slot.
pub(super) fn turnstile_file_name(stem: &str) -> String {
    format!("{stem}.turnstile")
}

/// The file where shared holder `pid` of the lock `stem` keeps its record (a header of zero,
/// then the [`Record`]), since the lock file has room for one record only. Believed only
/// while the kernel shows `pid` holding the lock file; removed by its holder on release.
/// A pid has no `.`, so the name tells the lock and the pid apart, and it never ends in
/// `.lock`.
pub(super) fn reader_file_name(stem: &str, pid: u32) -> String {
    format!("{stem}.{pid}.reader")
}

/// The pids whose reader files (`reader_file_name`) for `name` are in `dir`: shared holders
/// by their own account, which [`crate::kit::proc_locks::ProcLocks::shared_holders`] checks.
pub(super) fn reader_pids(dir: &LockDir, name: &LockName) -> Result<Vec<u32>, Error> {
    let stem = stem(name);
    Ok(dir
        .entries()?
        .iter()
        .filter_map(|entry| {
            let (entry_stem, pid) = entry.strip_suffix(".reader")?.rsplit_once('.')?;
            (entry_stem == stem).then(|| pid.parse().ok()).flatten()
        })
        .collect())
}

/// `<stem>.lock` → (stem, 0); `<stem>#N.lock` → (stem, N).
pub(super) fn split_file_name(file_name: &str) -> Option<(&str, u32)> {
    let base = file_name.strip_suffix(".lock")?;
    match base.rsplit_once('#') {
        Some((stem, slot)) => {
            let slot: u32 = slot.parse().ok()?;
            (!stem.is_empty() && slot > 0).then_some((stem, slot))
        }
        None => (!base.is_empty()).then_some((base, 0)),
    }
}

/// Slot files of `name` that exist, with their slot numbers.
pub(super) fn existing_slots(dir: &LockDir, name: &LockName) -> Result<Vec<(u32, String)>, Error> {
    let stem = stem(name);
    let mut slots = Vec::new();
    for entry in dir.entries()? {
        if let Some((entry_stem, slot)) = split_file_name(&entry) {
            if entry_stem == stem {
                slots.push((slot, entry.clone()));
            }
        }
    }
    slots.sort();
    Ok(slots)
}

/// Read the header token and the holder's record of an open lock file (either may be missing).
pub(super) fn read_contents(file: File) -> (Option<u64>, Option<Record>) {
    let mut text = String::new();
    if file.take(64 * 1024).read_to_string(&mut text).is_err() {
        return (None, None);
    }
    let header = parse_header(text.as_bytes());
    let record = text
        .get(HEADER_LEN..)
        .and_then(|rest| serde_json::from_str::<Record>(rest.trim()).ok());
    (header, record)
}

/// The token in a header: exactly `fence `, 20 decimal digits and a newline.
fn parse_header(bytes: &[u8]) -> Option<u64> {
    let digits = bytes
        .get(..HEADER_LEN)?
        .strip_prefix(b"fence ")?
        .strip_suffix(b"\n")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    // 20 digits can exceed u64::MAX; parse refuses that.
    std::str::from_utf8(digits).ok()?.parse().ok()
}

pub(super) fn header(token: u64) -> String {
    format!("fence {token:020}\n")
}

/// Take or drop a blocking OFD write lock on the header of `file`.
pub(super) fn header_lock(file: &File, lock: bool) -> io::Result<()> {
    range_lock(file, HEADER_LEN, lock)
}

pub(super) fn write_at(file: &File, offset: u64, bytes: &[u8]) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.write_all_at(bytes, offset)
}

/// The token after the one in the counter (slot 0's header): `max(counter + 1, µs since the
/// epoch)`, so tokens keep increasing even if a crash lost the last update of the file. An
/// empty file is a fresh counter. Tokens must strictly increase, so a counter that cannot be
/// read, or that has reached `u64::MAX`, is refused rather than guessed at.
pub(super) fn next_token(counter: &File, path: &Path) -> Result<u64, Error> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; HEADER_LEN];
    let mut read = 0;
    while read < HEADER_LEN {
        match counter.read_at(&mut buf[read..], read as u64) {
            Ok(0) => break,
            Ok(n) => read += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(Error::from_lock_io_at(
                    "cannot read the fencing counter in",
                    path,
                    &e,
                ))
            }
        }
    }
    let stored = match (read, parse_header(&buf)) {
        (0, _) => 0,
        (_, Some(stored)) => stored,
        (_, None) => {
            return Err(Error::CantCreate(format!(
                "the fencing counter in {} is unreadable (it starts {:?}, not 'fence' and 20 digits), \
                 so the next token could repeat an old one; if nothing relies on this lock's tokens, \
                 empty the file (: > FILE) to restart the counter from the clock",
                path.display(),
                String::from_utf8_lossy(&buf[..read])
            )))
        }
    };
    let Some(next) = stored.checked_add(1) else {
        return Err(Error::CantCreate(format!(
            "the fencing counter in {} is at its maximum ({stored}): no larger token can be issued \
             and tokens must never repeat; to use the name again, empty the file (: > FILE) once \
             nothing relies on its old tokens",
            path.display()
        )));
    };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
    Ok(next.max(clock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_split_into_stem_and_slot() {
        assert_eq!(split_file_name("a.lock"), Some(("a", 0)));
        assert_eq!(split_file_name("a#3.lock"), Some(("a", 3)));
        assert_eq!(split_file_name("..lock"), Some((".", 0)));
        assert_eq!(split_file_name("#check-1.lock"), None);
        assert_eq!(split_file_name("a#0.lock"), None);
        assert_eq!(split_file_name("a.txt"), None);
    }

    #[test]
    fn header_round_trips() {
        assert_eq!(header(42).len(), HEADER_LEN);
        assert_eq!(parse_header(header(42).as_bytes()), Some(42));
        assert_eq!(parse_header(header(u64::MAX).as_bytes()), Some(u64::MAX));
        assert_eq!(parse_header(b"garbage"), None);
        assert_eq!(parse_header(b"fence +0000000000000000042\n"), None);
        assert_eq!(parse_header(b"fence 99999999999999999999\n"), None);
        assert_eq!(parse_header(&[0; HEADER_LEN]), None);
    }
}
